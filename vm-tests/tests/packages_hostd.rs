//! The clawfleet-hostd .deb on real test hosts, the way an operator uses it: `dpkg -i`,
//! `hostd enrol`, an Agent deployed with signed operations over the forced command, an
//! upgrade to a rebuilt package and a downgrade back while the Agent serves, then remove and
//! purge under the documented rule (docs/operator-guide.md, "Uninstall"): the package's own
//! files go, Agent state, accounts, units and enrolled keys stay, and the Agent keeps serving.
//!
//! Needs root (test hosts) and `packaging/build.sh` output; otherwise prints `SKIP: ...`
//! (fails under `CI=true`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod packages_support;

use std::time::Instant;

use clawfleet_vm_tests::{TestHost, skip_unless_hosts};
use packages_support::*;
use serde_json::json;

const NS: &str = "pkg-ns";
const AGENT: &str = "pkg-agent";
const REV: &str = "r1";

fn installed_version(host: &TestHost) -> String {
    host.run_ok("dpkg-query -W -f='${Version}' clawfleet-hostd")
        .unwrap()
        .trim()
        .to_owned()
}

/// `ii`, `rc`, ... or `absent` (unknown to dpkg, or known as not installed).
fn package_status(host: &TestHost) -> String {
    let s = host
        .run_ok("dpkg-query -W -f='${db:Status-Abbrev}' clawfleet-hostd 2>/dev/null || echo absent")
        .unwrap()
        .trim()
        .to_owned();
    if s == "un" { "absent".to_owned() } else { s }
}

fn exists(host: &TestHost, path: &str) -> bool {
    host.run(&format!("test -e {path}"))
        .unwrap()
        .status
        .success()
}

fn sums(host: &TestHost, paths: &str) -> String {
    host.run_ok(&format!("sha256sum {paths}")).unwrap()
}

/// The Agent is served: `current` = `served` = r1, unit active, `/readyz` 200. Returns the
/// gateway's pid (from the test gateway's `/info`) and its port.
fn assert_serving(host: &TestHost) -> (u64, u16) {
    let o = observation(host, NS, AGENT);
    assert_eq!(o["current"], json!(REV), "{o:#}");
    assert_eq!(o["served"], json!(REV), "{o:#}");
    assert_eq!(o["unit"]["activeState"], "active", "{o:#}");
    let port = o["port"].as_u64().unwrap() as u16;
    let (code, _) = curl(host, &format!("http://127.0.0.1:{port}/readyz"));
    assert_eq!(code, 200);
    let (code, info) = curl(host, &format!("http://127.0.0.1:{port}/info"));
    assert_eq!(code, 200, "{info}");
    let info: serde_json::Value = serde_json::from_str(&info).unwrap();
    assert_eq!(info["label"], json!(REV), "{info:#}");
    (info["pid"].as_u64().unwrap(), port)
}

#[test]
fn hostd_deb_install_enrol_deploy_upgrade_downgrade_remove_purge() {
    skip_unless_hosts!();
    let Some(pkgs) = packages_or_skip() else {
        return;
    };
    let Some(next_deb) = pkgs.hostd_deb_next.clone() else {
        missing("no rebuilt hostd .deb in target/packages/test (packaging/build.sh makes it)");
        return;
    };
    let version = deb_field(&pkgs.hostd_deb, "Version");
    let next_version = deb_field(&next_deb, "Version");
    let (ok, _, _) = run_local(
        "dpkg",
        &["--compare-versions", &next_version, "gt", &version],
    );
    assert!(ok, "{next_version} must be higher than {version}");
    let t0 = Instant::now();
    let host = TestHost::start().unwrap();

    // --- install, as on a fresh host (dependencies come from the base system) ---
    let t = Instant::now();
    install_hostd_deb(&host, &pkgs.hostd_deb).unwrap();
    eprintln!("dpkg -i {version}: {:?}", t.elapsed());
    assert_eq!(installed_version(&host), version);
    assert_eq!(package_status(&host), "ii");
    assert_eq!(
        host.run_ok("stat -c '%a %U %G' /usr/sbin/hostd /var/lib/clawfleet /etc/clawfleet")
            .unwrap(),
        "755 root root\n755 root root\n755 root root\n"
    );
    // The shipped configuration is comments only (all defaults), and hostd accepts it.
    let meaningful = host
        .run_ok("grep -v -E '^[[:space:]]*(#|$)' /etc/clawfleet/hostd.toml || true")
        .unwrap();
    assert_eq!(meaningful, "", "hostd.toml must be comments only");
    let conffiles = host
        .run_ok("dpkg-query -W -f='${Conffiles}' clawfleet-hostd")
        .unwrap();
    assert!(
        conffiles.contains("/etc/clawfleet/hostd.toml"),
        "{conffiles}"
    );
    assert!(!conffiles.contains("allowed_signers"), "{conffiles}");
    let files = host.run_ok("dpkg -L clawfleet-hostd").unwrap();
    assert!(!files.contains("allowed_signers"), "{files}");
    assert_eq!(status(&host)["namespaces"], json!([]));
    // Reinstalling the same version is harmless (idempotent maintainer scripts).
    host.install_deb(&pkgs.hostd_deb).unwrap();
    assert_eq!(package_status(&host), "ii");

    // --- configure (edit the conffile as an operator does) and enrol ---
    let gateway = host.install_test_gateway().unwrap();
    let config = format!(
        "# edited by the operator\nhost_name = \"{}\"\ngateway_command = [\"{gateway}\"]\n\
         [limits]\nlock_timeout_ms = 3000\nreadiness_timeout_ms = 20000\nunit_stop_timeout_ms = 10000\n",
        host.name()
    );
    host.write_file("/etc/clawfleet/hostd.toml", config.as_bytes(), 0o644)
        .unwrap();
    let occ = StockCoordinator::new();
    let enrolled = occ.enrol(&host);
    assert!(
        enrolled.contains(host.host_key_fingerprint()),
        "enrol prints the fingerprint to pin: {enrolled}"
    );
    let trust = sums(
        &host,
        "/etc/clawfleet/allowed_signers /root/.ssh/authorized_keys",
    );
    occ.enrol(&host);
    assert_eq!(
        sums(
            &host,
            "/etc/clawfleet/allowed_signers /root/.ssh/authorized_keys"
        ),
        trust,
        "a second enrol changes nothing"
    );
    let authorized = host.run_ok("cat /root/.ssh/authorized_keys").unwrap();
    assert!(
        authorized.contains("command=\"/usr/sbin/hostd serve --key="),
        "{authorized}"
    );

    // --- deploy an Agent: signed operations through the forced command ---
    let t = Instant::now();
    let ops = [
        occ.envelope(&host, ensure_namespace(NS)),
        occ.envelope(&host, prepare_revision(NS, AGENT, REV, 1)),
        occ.envelope(&host, revision_op("activate-revision", NS, AGENT, REV, 1)),
    ];
    let results = occ.session_ok(&host, &ops);
    assert_eq!(results[2]["op"], "activate-revision", "{:#}", results[2]);
    assert_eq!(results[2]["observation"]["served"], json!(REV));
    eprintln!("ensure + prepare + activate over ssh: {:?}", t.elapsed());
    // The audit path: a logged envelope checks out with ssh-keygen -Y verify on the host,
    // and `hostd apply` runs one from a file.
    let probed = occ.apply_ok(&host, &occ.envelope(&host, probe()));
    assert_eq!(probed["op"], "probe", "{probed:#}");
    // The host's records of the activation: hostd's journald events carry the operation id,
    // and its operation journal holds the SHA-256 of the exact envelope body it ran.
    let activation = &ops[2];
    let logged = host
        .run_ok(&format!(
            "journalctl -t hostd -o verbose --no-pager | grep -c -- '{}' || true",
            activation.id
        ))
        .unwrap();
    assert!(
        logged.trim().parse::<u32>().unwrap() > 0,
        "journalctl -t hostd"
    );
    let entry: serde_json::Value = serde_json::from_str(
        &host
            .run_ok(&format!(
                "cat /var/lib/clawfleet/journal/{}.json",
                activation.id
            ))
            .unwrap(),
    )
    .unwrap();
    assert_eq!(
        entry["bodySha256"],
        json!(sha256_hex(&activation.body)),
        "{entry:#}"
    );

    let (pid, port) = assert_serving(&host);
    let (unit, account) = agent_names(NS, AGENT);
    let markers = |host: &TestHost| {
        host.run_ok(
            "cd /var/lib/clawfleet && find namespaces accounts ports -name '*.json' | sort | xargs sha256sum",
        )
        .unwrap()
    };
    let markers_before = markers(&host);
    let config_sum = sums(&host, "/etc/clawfleet/hostd.toml");
    let watcher = Watcher::start(&host, "readyz", &format!("http://127.0.0.1:{port}/readyz"));

    // --- upgrade to the rebuilt package while the Agent serves, then downgrade back ---
    for (deb, v) in [(&next_deb, &next_version), (&pkgs.hostd_deb, &version)] {
        let t = Instant::now();
        host.install_deb(deb).unwrap();
        eprintln!("dpkg -i {v} over the installed package: {:?}", t.elapsed());
        assert_eq!(&installed_version(&host), v);
        assert_eq!(sums(&host, "/etc/clawfleet/hostd.toml"), config_sum);
        assert_eq!(
            sums(
                &host,
                "/etc/clawfleet/allowed_signers /root/.ssh/authorized_keys"
            ),
            trust
        );
        assert_eq!(markers(&host), markers_before, "markers unchanged");
        // Markers stay readable by the new binary, through `hostd status` and the protocol.
        assert_eq!(
            assert_serving(&host),
            (pid, port),
            "the gateway never restarted"
        );
        let verified = occ.session_ok(
            &host,
            &[
                occ.envelope(&host, probe()),
                occ.envelope(&host, revision_op("verify-revision", NS, AGENT, REV, 1)),
            ],
        );
        assert_eq!(verified[1]["observation"]["served"], json!(REV));
    }
    let codes = watcher.stop(&host);
    assert!(codes.len() >= 10, "{codes:?}");
    assert!(
        codes.iter().all(|c| c == "ok"),
        "/readyz failed during upgrade/downgrade: {codes:?}"
    );
    eprintln!(
        "/readyz answered 200 {} times in a row during upgrade and downgrade",
        codes.len()
    );
    let restarts = host
        .run_ok(&format!("systemctl show -p NRestarts --value {unit}"))
        .unwrap();
    assert_eq!(restarts.trim(), "0");

    // --- remove: the binary goes, the conffile stays, the Agent keeps serving ---
    host.run_ok("DEBIAN_FRONTEND=noninteractive dpkg -r clawfleet-hostd")
        .unwrap();
    assert_eq!(package_status(&host), "rc");
    assert!(!exists(&host, "/usr/sbin/hostd"));
    assert_eq!(sums(&host, "/etc/clawfleet/hostd.toml"), config_sum);
    let (code, _) = curl(&host, &format!("http://127.0.0.1:{port}/readyz"));
    assert_eq!(code, 200, "the Agent serves with hostd removed");

    // --- purge: the package's config goes; Agent state, account, unit and trust stay ---
    host.run_ok("DEBIAN_FRONTEND=noninteractive dpkg -P clawfleet-hostd")
        .unwrap();
    assert_eq!(package_status(&host), "absent");
    assert!(!exists(&host, "/etc/clawfleet/hostd.toml"));
    assert_eq!(
        sums(
            &host,
            "/etc/clawfleet/allowed_signers /root/.ssh/authorized_keys"
        ),
        trust,
        "purge keeps the enrolled keys"
    );
    assert_eq!(markers(&host), markers_before, "purge keeps Agent state");
    host.run_ok(&format!(
        "getent passwd {account} && getent group {account}"
    ))
    .unwrap();
    assert!(exists(&host, &format!("/etc/systemd/system/{unit}")));
    assert_eq!(
        host.run_ok(&format!(
            "systemctl is-active {unit}; systemctl is-enabled {unit}"
        ))
        .unwrap(),
        "active\nenabled\n"
    );
    let (code, _) = curl(&host, &format!("http://127.0.0.1:{port}/readyz"));
    assert_eq!(code, 200, "the Agent serves after purge");
    let info = curl(&host, &format!("http://127.0.0.1:{port}/info")).1;
    assert!(info.contains(&format!("\"pid\":{pid}")), "{info}");

    // --- install again: hostd finds its Agent where it left it ---
    host.write_file("/var/tmp/hostd.toml", config.as_bytes(), 0o644)
        .unwrap();
    install_hostd_deb(&host, &pkgs.hostd_deb).unwrap();
    host.run_ok("cp /var/tmp/hostd.toml /etc/clawfleet/hostd.toml")
        .unwrap();
    assert_eq!(assert_serving(&host), (pid, port));
    occ.session_ok(
        &host,
        &[occ.envelope(&host, revision_op("verify-revision", NS, AGENT, REV, 1))],
    );
    eprintln!("whole package lifecycle: {:?}", t0.elapsed());
}

/// The inodes of the TCP sockets sshd's main process listens on (they change when sshd
/// re-executes itself on a reload).
fn sshd_listeners(host: &TestHost) -> Vec<String> {
    let out = host
        .run_ok(concat!(
            "pid=$(systemctl show -p MainPID --value ssh.service); ",
            r"own=$(for fd in /proc/$pid/fd/*; do readlink $fd; done | sed -n 's/^socket:\[\([0-9]*\)\]$/\1/p'); ",
            r#"awk -v own=" $(echo $own) " '$4 == "0A" && index(own, " " $10 " ") { print $10 }' /proc/net/tcp /proc/net/tcp6"#,
        ))
        .unwrap();
    let mut inodes: Vec<String> = out.lines().map(str::to_owned).collect();
    inodes.sort();
    inodes
}

/// On a host that never ran an Agent, purge leaves nothing of the package behind; every
/// maintainer script path is idempotent (reinstall, remove + reinstall, remove + purge twice).
/// Every install reloads sshd for the drop-in and returns only once sshd listens again, so
/// the next ssh connection (each `run_ok` here is one) is never refused.
#[test]
fn hostd_deb_purge_on_an_unused_host_leaves_nothing() {
    skip_unless_hosts!();
    let Some(deb) = hostd_deb_or_skip() else {
        return;
    };
    let host = TestHost::start().unwrap();
    // An sshd slow to re-execute (a loaded host): its reload returns at once and sshd
    // re-listens 1.5 s later. dpkg -i must still return only once it listens again.
    host.write_file(
        "/etc/systemd/system/ssh.service.d/slow-reload.conf",
        b"[Service]\nExecReload=\nExecReload=/bin/sh -c '(sleep 1.5; kill -HUP $MAINPID) &'\n",
        0o644,
    )
    .unwrap();
    host.run_ok("systemctl daemon-reload").unwrap();
    let before = sshd_listeners(&host);
    assert!(!before.is_empty(), "sshd listens before the install");
    host.install_deb(&deb).unwrap();
    let after = sshd_listeners(&host);
    assert!(
        !after.is_empty() && after.iter().all(|inode| !before.contains(inode)),
        "dpkg -i returned before sshd listened again on new sockets: before {before:?}, after {after:?}"
    );
    host.run_ok("rm /etc/systemd/system/ssh.service.d/slow-reload.conf && systemctl daemon-reload")
        .unwrap();
    host.run_ok("/usr/sbin/hostd --version").unwrap();
    host.install_deb(&deb).unwrap();
    host.run_ok("dpkg -r clawfleet-hostd").unwrap();
    // Remove keeps the conffile and the (empty) state root.
    assert!(exists(&host, "/etc/clawfleet/hostd.toml"));
    install_hostd_deb(&host, &deb).unwrap();
    host.run_ok("dpkg -r clawfleet-hostd && dpkg -P clawfleet-hostd && dpkg -P clawfleet-hostd")
        .unwrap();
    assert!(!exists(&host, "/usr/sbin/hostd"));
    assert!(
        !exists(&host, "/etc/clawfleet"),
        "empty /etc/clawfleet goes"
    );
    assert!(
        !exists(&host, "/var/lib/clawfleet"),
        "empty state root goes"
    );
    // Anything else in the state root keeps it (and its contents) in place.
    install_hostd_deb(&host, &deb).unwrap();
    host.run_ok("mkdir -p /var/lib/clawfleet/namespaces/x && echo keep > /var/lib/clawfleet/namespaces/x/agent.json")
        .unwrap();
    host.write_file("/etc/clawfleet/allowed_signers", b"# operator's\n", 0o644)
        .unwrap();
    host.run_ok("dpkg -P clawfleet-hostd").unwrap();
    assert_eq!(
        host.run_ok(
            "cat /var/lib/clawfleet/namespaces/x/agent.json /etc/clawfleet/allowed_signers"
        )
        .unwrap(),
        "keep\n# operator's\n"
    );
}
