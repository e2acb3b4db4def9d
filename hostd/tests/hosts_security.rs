//! Security issue 26 on a real host, each attack run as it was found: from inside an Agent's
//! unit (the test gateway's `probe` switch runs commands at start as the Agent's account and
//! reports them at /info), or as another tenant's operation while one Agent is deleted.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod hosts_support;

use clawfleet_protocol::Message;
use clawfleet_protocol::operation::*;
use clawfleet_protocol::result::{OperationResult, Step};
use clawfleet_vm_tests::{TestHost, skip_unless_hosts};
use hosts_support::*;
use serde_json::{Value, json};

fn layout() -> hostd::layout::Layout {
    hostd::layout::Layout::new("/var/lib/clawfleet", "/etc/systemd/system")
}

fn port(r: &OperationResult) -> u16 {
    match r {
        OperationResult::PrepareRevision(p) => p.observation.port.unwrap(),
        other => panic!("{other:?}"),
    }
}

/// A probe command's result, with its output shown in the test log.
fn command(host: &TestHost, port: u16, name: &str) -> Value {
    let (code, body) = curl(host, port, "/info");
    assert_eq!(code, 200, "{body}");
    let info: Value = serde_json::from_str(&body).unwrap();
    let r = info["probe"]["commands"][name].clone();
    println!(
        "probe {name}: status {} stdout {:?} stderr {:?}",
        r["status"], r["stdout"], r["stderr"]
    );
    r
}

fn stdout(r: &Value) -> String {
    format!(
        "{}{}",
        r["stdout"].as_str().unwrap_or(""),
        r["stderr"].as_str().unwrap_or("")
    )
}

fn uid_of(host: &TestHost, account: &str) -> u32 {
    host.run_ok(&format!("id -u {account}"))
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

fn delete(n: &str, a: &str) -> Operation {
    Operation::DeleteAgent(AgentArgs {
        namespace: ns(n),
        agent: agent(a),
    })
}

/// What each Agent tries: read every tenant's unit file (N14), reach the uid-keyed kernel
/// keyring (N5), forge journal lines tagged `hostd` (N7).
fn attacks() -> Value {
    json!({
        "units": "ls /etc/systemd/system | grep -c '^clawfleet-agent-'; cat /etc/systemd/system/clawfleet-agent-*.service 2>&1 | grep -c 'Managed by clawfleet'",
        // add_key(2) ("user", "cf-secret", "s3cret", 6, KEY_SPEC_USER_KEYRING) and
        // keyctl(2) (KEYCTL_GET_PERSISTENT, -1, KEY_SPEC_USER_KEYRING) on x86_64.
        "keyring": "perl -e 'my ($t, $d, $v) = (\"user\", \"cf-secret\", \"s3cret\"); $a = syscall(248, $t, $d, $v, 6, -4); print \"add_key=$a $!\\n\"; $!=0; $p = syscall(250, 22, -1, -4); print \"persistent=$p $!\\n\"'",
        "forge": "logger -t hostd cf-forged-by-an-agent 2>&1; echo logger=$?",
    })
}

#[test]
fn an_agent_cannot_read_other_units_reuse_a_uid_reach_the_keyring_or_forge_hostd_lines_on_a_real_host()
 {
    skip_unless_hosts!();
    let occ = Coordinator::new();
    let host = host_with_hostd(&occ, "[unit]\nlog_rate_limit_burst = 20\n");
    occ.ok(&host, ensure("ns1"));
    occ.ok(&host, ensure("ns2"));

    // Agent a1 runs, then is deleted.
    let a1 = layout().agent(&id("ns1"), &id("a1"));
    let r1 = spec(
        "rev-1",
        1,
        json!({"label": "a1", "probe": {"commands": attacks()}}),
    );
    let pa = port(&occ.ok(&host, prepare("ns1", "a1", &r1)));
    occ.ok(
        &host,
        Operation::ActivateRevision(ActivateArgs::from(rargs("ns1", "a1", &r1))),
    );
    let uid_a1 = uid_of(&host, &a1.account);
    // On these nspawn test hosts nspawn's own seccomp filter refuses keyring calls too, so
    // this passes there whatever the unit says (unit::tests checks the unit's filter); what
    // the hosts do show is the root cause, the uid handed out again (below).
    let keyring = stdout(&command(&host, pa, "keyring"));
    assert!(
        keyring.contains("add_key=-1 Operation not permitted")
            && keyring.contains("persistent=-1 Operation not permitted"),
        "the keyring calls must be refused: {keyring}"
    );
    occ.ok(&host, delete("ns1", "a1"));

    // The next Agent, another tenant's, never gets a1's uid.
    let b1 = layout().agent(&id("ns2"), &id("b1"));
    // A forged line on its own stderr, then a flood of 2,000 lines at once.
    let mut lines = vec!["hostd: operation succeeded (forged on stderr)".to_owned()];
    lines.extend((0..2000).map(|i| format!("cf-flood-{i}")));
    let floods = json!({"label": "b1", "probe": {"commands": attacks()}, "logLines": lines});
    let rb = spec("rev-1", 1, floods);
    let pb = port(&occ.ok(&host, prepare("ns2", "b1", &rb)));
    occ.ok(
        &host,
        Operation::ActivateRevision(ActivateArgs::from(rargs("ns2", "b1", &rb))),
    );
    let uid_b1 = uid_of(&host, &b1.account);
    println!("a1 had uid {uid_a1}, b1 got uid {uid_b1}");
    assert_ne!(uid_a1, uid_b1, "a deleted Agent's uid was handed out again");
    assert!((400_000..=499_999).contains(&uid_b1), "{uid_b1}");
    assert_eq!(
        host.run_ok(&format!("id -g {}", b1.account))
            .unwrap()
            .trim(),
        uid_b1.to_string(),
        "gid = uid"
    );

    // N14: the unit files are there, but not readable by the Agent.
    let units = stdout(&command(&host, pb, "units"));
    let mut counts = units.lines();
    assert_eq!(
        counts.next(),
        Some("1"),
        "the unit's name is listed: {units}"
    );
    assert_eq!(counts.next(), Some("0"), "B read a unit file: {units}");
    let mode = host
        .run_ok(&format!("stat -c '%a %U %G' {}", b1.unit_file.display()))
        .unwrap();
    assert_eq!(mode.trim(), "640 root root");

    // N7: no line tagged hostd from the Agent; its own output is tagged with its unit's name.
    let forge = stdout(&command(&host, pb, "forge"));
    assert!(
        !forge.contains("logger=0"),
        "logger reached the journal: {forge}"
    );
    std::thread::sleep(std::time::Duration::from_secs(2));
    let forged = host
        .run_ok("journalctl --no-pager -o cat -t hostd | grep -c -e cf-forged -e 'forged on stderr' || true")
        .unwrap();
    assert_eq!(forged.trim(), "0", "lines forged as hostd: {forged}");
    let tag = b1.unit_name.trim_end_matches(".service");
    let tagged = host
        .run_ok(&format!(
            "journalctl --no-pager -o cat -t {tag} | grep -c 'forged on stderr' || true"
        ))
        .unwrap();
    assert_eq!(tagged.trim(), "1", "the Agent's own line under its own tag");
    // The flood is cut at the configured burst of 20 per 30 s, which journald multiplies by
    // up to 5 when the disk has much free space; its own default (10,000) let it all through.
    std::thread::sleep(std::time::Duration::from_secs(3));
    let kept: u64 = host
        .run_ok(&format!(
            "journalctl --no-pager -o cat -u {} | grep -c cf-flood- || true",
            b1.unit_name
        ))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    println!("journald kept {kept} of the flooding Agent's 2,000 lines");
    assert!(
        kept < 1000,
        "{kept} of 2,000 lines kept: the rate limit is not in force"
    );

    // Acceptance: the unit's exposure stays at or below 1.5.
    let out = host
        .run(&format!(
            "systemd-analyze security --no-pager {}",
            b1.unit_name
        ))
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let score: f64 = text
        .lines()
        .find(|l| l.contains("Overall exposure level"))
        .and_then(|l| l.split(':').nth(1))
        .and_then(|r| r.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no exposure in {text}"));
    println!("systemd-analyze security: exposure {score}");
    assert!(score <= 1.5, "exposure {score} above 1.5\n{text}");
}

/// N8: deleting an Agent with a large tree does not hold the host lock while the tree is
/// deleted; another tenant's prepare, with a lock limit shorter than the deletion, succeeds.
#[test]
fn deleting_a_large_agent_tree_does_not_block_another_tenant_on_a_real_host() {
    skip_unless_hosts!();
    let occ = Coordinator::new();
    let host = host_with_hostd(
        &occ,
        "[limits]\nlock_timeout_ms = 1000\nreadiness_timeout_ms = 20000\nunit_stop_timeout_ms = 10000\n",
    );
    occ.ok(&host, ensure("ns1"));
    occ.ok(&host, ensure("ns2"));
    let r1 = spec("rev-1", 1, json!({"label": "a1"}));
    occ.ok(&host, prepare("ns1", "a1", &r1));
    let a1 = layout().agent(&id("ns1"), &id("a1"));
    // 300,000 empty files in 300 directories, as the Agent's account.
    host.run_ok(&format!(
        "setpriv --reuid={0} --regid={0} --clear-groups perl -e 'for my $d (1..300) {{ mkdir \"$ARGV[0]/d$d\" or die; \
         for my $f (1..1000) {{ open(my $h, \">\", \"$ARGV[0]/d$d/$f\") or die }} }}' {1}",
        a1.account,
        a1.state.display()
    ))
    .unwrap();
    // The delete starts; once it reports its removal step, another tenant prepares.
    let t0 = std::time::Instant::now();
    let mut deleting = Session::open(&occ, &host);
    let id = occ.next_id();
    deleting.send(&occ.sign(&occ.envelope(&host, &id, delete("ns1", "a1"))));
    let removing = deleting.wait_for(
        std::time::Duration::from_secs(60),
        |m| matches!(m, Message::Progress(p) if p.step == Step::Remove),
    );
    assert!(
        removing.is_some(),
        "no removal step: {:?}",
        deleting.received
    );
    std::thread::sleep(std::time::Duration::from_millis(300));
    let other = occ.call(&host, prepare("ns2", "b1", &r1));
    let other_at = t0.elapsed();
    let messages = deleting.finish();
    let deleted = results(&messages).into_iter().next().unwrap();
    println!(
        "delete-agent of a 300,000-file tree: {:.1}s; the other tenant's prepare finished after {:.1}s",
        t0.elapsed().as_secs_f64(),
        other_at.as_secs_f64()
    );
    assert!(deleted.outcome.failure().is_none(), "{:?}", deleted.outcome);
    assert!(
        other.outcome.failure().is_none(),
        "the other tenant's prepare failed while the tree was deleted: {:?}",
        other.outcome
    );
    assert!(
        !host
            .run(&format!("test -e {}", a1.dir.display()))
            .unwrap()
            .status
            .success()
    );
    assert_eq!(
        host.run_ok("ls -A /var/lib/clawfleet/trash 2>/dev/null | wc -l")
            .unwrap()
            .trim(),
        "0"
    );
}
