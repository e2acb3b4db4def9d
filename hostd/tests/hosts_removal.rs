//! Issue 11 on a real host, the attack itself: an Agent plants a 5,000-level directory chain
//! in its `state/` and links to `/etc` (and to a canary directory) in its `home/` and `state/`,
//! then retire-revision, delete-agent and delete-namespace must each finish, remove everything
//! of the Agent, leave no trash or pending leftover, and touch nothing outside its tree.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod hosts_support;

use clawfleet_protocol::operation::*;
use clawfleet_protocol::result::OperationResult;
use clawfleet_vm_tests::{TestHost, skip_unless_hosts};
use hosts_support::*;
use serde_json::json;

fn layout() -> hostd::layout::Layout {
    hostd::layout::Layout::new("/var/lib/clawfleet", "/etc/systemd/system")
}

/// As the Agent's account (its uid, its group, no others): the chain, built with relative
/// `mkdir`/`chdir` so no path is ever longer than one level, and the links.
fn plant(host: &TestHost, paths: &hostd::layout::AgentPaths, depth: usize) {
    // perl-base is essential on Debian; python3 is not installed on the test hosts.
    let chain = format!(
        "chdir $ARGV[0] or die $!; for (1..{depth}) {{ mkdir 'd' or die $!; chdir 'd' or die $! }} \
         open(my $f, '>', 'bottom') or die $!; symlink('/etc', 'etc') or die $!"
    );
    host.write_file("/tmp/plant.pl", chain.as_bytes(), 0o644)
        .unwrap();
    let t0 = std::time::Instant::now();
    host.run_ok(&format!(
        "setpriv --reuid={0} --regid={0} --clear-groups sh -c 'perl /tmp/plant.pl {2} && \
         ln -s /etc {1}/etc && ln -s /srv/canary {1}/canary && ln -s /srv/canary/file {2}/canary-file && \
         ln -s /etc/passwd {1}/passwd'",
        paths.account,
        paths.home.display(),
        paths.state.display()
    ))
    .unwrap();
    let levels = host
        .run_ok(&format!(
            "perl -e 'chdir $ARGV[0] or die; my $n = 0; while (chdir \"d\") {{ $n++ }} print $n' {}",
            paths.state.display()
        ))
        .unwrap();
    assert_eq!(levels.trim(), depth.to_string(), "the chain is planted");
    println!(
        "planted a {depth}-level chain and links to /etc in {} in {:.1}s",
        paths.dir.display(),
        t0.elapsed().as_secs_f64()
    );
}

/// Everything under /etc (type, mode, owner, size, content hash) except the account
/// databases, which removing an account legitimately rewrites, and our own unit files and
/// their enablement links; plus the canary directory in full.
const OUTSIDE: &str = "find /etc /srv/canary -xdev \\( -path /etc/passwd -o -path /etc/passwd- \
     -o -path /etc/group -o -path /etc/group- -o -path /etc/shadow -o -path /etc/shadow- \
     -o -path /etc/gshadow -o -path /etc/gshadow- -o -name 'clawfleet-agent-*' -o -path /etc/.pwd.lock \\) -prune \
     -o -printf '%p %y %m %U %G %s %l\\n' | sort; \
     find /etc /srv/canary -xdev -type f ! -name 'passwd*' ! -name 'group*' ! -name 'shadow*' ! -name 'gshadow*' \
     ! -name 'clawfleet-agent-*' -print0 | sort -z | xargs -0 sha256sum";

fn outside(host: &TestHost) -> String {
    host.run_ok(OUTSIDE).unwrap()
}

/// Nothing of the Agent left: directory, account, marker, lock; and no trash or pending name.
fn assert_gone(host: &TestHost, paths: &hostd::layout::AgentPaths) {
    let left = host
        .run_ok(&format!(
            "test -e {dir} && echo dir; getent passwd {acct} >/dev/null && echo user; \
             getent group {acct} >/dev/null && echo group; \
             test -e /var/lib/clawfleet/accounts/{acct}.json && echo marker; \
             test -e {unit} && echo unit; test -e {lock} && echo lock; \
             ls -A /var/lib/clawfleet/trash 2>/dev/null | sed 's/^/trash /'; \
             find /var/lib/clawfleet -name '*.pending-*' | sed 's/^/pending /'; true",
            dir = paths.dir.display(),
            acct = paths.account,
            unit = paths.unit_file.display(),
            lock = paths.lock.display(),
        ))
        .unwrap();
    assert_eq!(left.trim(), "", "left of {}: {left}", paths.account);
}

#[test]
fn a_deep_chain_and_links_to_etc_do_not_stop_retire_delete_agent_or_delete_namespace_on_a_real_host()
 {
    skip_unless_hosts!();
    let occ = Coordinator::new();
    let host = host_with_hostd(&occ, "");
    host.run_ok(
        "mkdir -p /srv/canary/sub && echo keep > /srv/canary/file && echo keep > /srv/canary/sub/f",
    )
    .unwrap();
    // What a forced-command session of hostd may keep open (std's recursive removal needs one
    // descriptor per level and stopped at about this many).
    println!(
        "descriptor limit of an ssh session: {}",
        host.run_ok("ulimit -Sn; ulimit -Hn")
            .unwrap()
            .replace('\n', " ")
    );
    let before = outside(&host);

    // Agent a1: two revisions, so that one can be retired with the chain in place.
    occ.ok(&host, ensure("ns1"));
    let r1 = spec("rev-1", 1, json!({"label": "r1"}));
    let r2 = spec("rev-2", 2, json!({"label": "r2"}));
    occ.ok(&host, prepare("ns1", "a1", &r1));
    occ.ok(
        &host,
        Operation::ActivateRevision(ActivateArgs::from(rargs("ns1", "a1", &r1))),
    );
    let a1 = layout().agent(&id("ns1"), &id("a1"));
    plant(&host, &a1, 5000);
    occ.ok(&host, prepare("ns1", "a1", &r2));
    occ.ok(
        &host,
        Operation::ActivateRevision(ActivateArgs::from(rargs("ns1", "a1", &r2))),
    );
    let t0 = std::time::Instant::now();
    match occ.ok(&host, Operation::RetireRevision(rargs("ns1", "a1", &r1))) {
        OperationResult::RetireRevision(r) => assert!(r.removed),
        other => panic!("{other:?}"),
    }
    println!("retire-revision: {:.1}s", t0.elapsed().as_secs_f64());
    let t0 = std::time::Instant::now();
    match occ.ok(
        &host,
        Operation::DeleteAgent(AgentArgs {
            namespace: ns("ns1"),
            agent: agent("a1"),
        }),
    ) {
        OperationResult::DeleteAgent(r) => assert!(r.removed),
        other => panic!("{other:?}"),
    }
    println!(
        "delete-agent with a 5,000-level chain: {:.1}s",
        t0.elapsed().as_secs_f64()
    );
    assert_gone(&host, &a1);
    assert_eq!(outside(&host), before, "/etc or the canary changed");

    // Agent b1 in ns2, removed with its Namespace.
    occ.ok(&host, ensure("ns2"));
    occ.ok(&host, prepare("ns2", "b1", &r1));
    occ.ok(
        &host,
        Operation::ActivateRevision(ActivateArgs::from(rargs("ns2", "b1", &r1))),
    );
    let b1 = layout().agent(&id("ns2"), &id("b1"));
    plant(&host, &b1, 5000);
    let t0 = std::time::Instant::now();
    match occ.ok(
        &host,
        Operation::DeleteNamespace(NamespaceArgs {
            namespace: ns("ns2"),
        }),
    ) {
        OperationResult::DeleteNamespace(r) => assert!(r.removed && r.agents_removed == 1),
        other => panic!("{other:?}"),
    }
    println!(
        "delete-namespace with a 5,000-level chain: {:.1}s",
        t0.elapsed().as_secs_f64()
    );
    assert_gone(&host, &b1);
    assert!(
        !host
            .run(&format!(
                "test -e {}",
                layout().namespace_dir(&id("ns2")).display()
            ))
            .unwrap()
            .status
            .success()
    );
    assert_eq!(outside(&host), before, "/etc or the canary changed");
    assert_eq!(
        host.run_ok("cat /srv/canary/file /srv/canary/sub/f")
            .unwrap(),
        "keep\nkeep\n"
    );
}
