//! The clawfleet-coordinator .deb on a real test host: the package creates the `clawfleet`
//! system user, installs and enables the hardened unit, and the unit starts under systemd,
//! runs `occ init` (keys in the state directory, no admin token: it is shown once to the operator
//! who asks for it) and answers `/healthz`.
//! Then an upgrade keeps the keys, and remove/purge follow the documented rule.
//!
//! Needs root (test hosts) and `packaging/build.sh` output; otherwise prints `SKIP: ...`
//! (fails under `CI=true`). While the packaged `occ` has no `serve` command, the service part
//! prints a SKIP naming it (also under CI): it runs as soon as `occ serve` exists.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod packages_support;

use std::time::{Duration, Instant};

use clawfleet_vm_tests::{TestHost, skip_unless_hosts};
use packages_support::*;

const UNIT: &str = "clawfleet-coordinator.service";
const STATE: &str = "/var/lib/clawfleet-coordinator";
const HEALTHZ: &str = "http://127.0.0.1:7300/healthz";

fn exists(host: &TestHost, path: &str) -> bool {
    host.run(&format!("test -e {path}"))
        .unwrap()
        .status
        .success()
}

fn unit_state(host: &TestHost) -> String {
    host.run_ok(&format!("systemctl is-active {UNIT} || true"))
        .unwrap()
        .trim()
        .to_owned()
}

/// Whether the installed `occ` has the commands the unit runs; the reason when not.
fn occ_commands_missing(host: &TestHost) -> Option<String> {
    for cmd in ["init", "serve"] {
        let out = host.run(&format!("/usr/bin/occ {cmd} --help")).unwrap();
        if !out.status.success() {
            return Some(format!(
                "`occ {cmd}` is not in this build of occ yet (`occ {cmd} --help` said: {}); \
                 the unit runs `occ init --config /etc/clawfleet/occ.toml` and \
                 `occ serve --config /etc/clawfleet/occ.toml`",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
    }
    None
}

fn wait_healthy(host: &TestHost) {
    let ok = wait_until(Duration::from_secs(30), || {
        unit_state(host) == "active" && curl(host, HEALTHZ).0 == 200
    });
    if !ok {
        let journal = host
            .run_ok(&format!(
                "systemctl status --no-pager {UNIT} || true; journalctl -u {UNIT} --no-pager | tail -n 40"
            ))
            .unwrap();
        panic!("the coordinator did not become healthy:\n{journal}");
    }
}

#[test]
fn coordinator_deb_service_starts_runs_init_and_answers_healthz() {
    skip_unless_hosts!();
    let Some(pkgs) = packages_or_skip() else {
        return;
    };
    let host = TestHost::start().unwrap();
    let t = Instant::now();
    host.install_deb(&pkgs.coordinator_deb).unwrap();
    eprintln!("dpkg -i clawfleet-coordinator: {:?}", t.elapsed());

    // What the package itself sets up, whatever occ can do yet.
    let user = host.run_ok("getent passwd clawfleet").unwrap();
    let fields: Vec<&str> = user.trim().split(':').collect();
    assert_eq!(fields[5], STATE, "{user}");
    assert_eq!(fields[6], "/usr/sbin/nologin", "{user}");
    let uid: u32 = fields[2].parse().unwrap();
    assert!(uid < 1000, "a system user: {user}");
    assert!(exists(
        &host,
        "/usr/lib/sysusers.d/clawfleet-coordinator.conf"
    ));
    assert_eq!(
        host.run_ok(&format!("systemctl is-enabled {UNIT}"))
            .unwrap()
            .trim(),
        "enabled"
    );
    let meaningful = host
        .run_ok("grep -v -E '^[[:space:]]*(#|$)' /etc/clawfleet/occ.toml || true")
        .unwrap();
    assert_eq!(meaningful, "", "occ.toml must be comments only");
    let props = host
        .run_ok(&format!(
            "systemctl show -p User -p Group -p ProtectSystem -p NoNewPrivileges -p StateDirectory -p CapabilityBoundingSet {UNIT}"
        ))
        .unwrap();
    for want in [
        "User=clawfleet",
        "Group=clawfleet",
        "ProtectSystem=strict",
        "NoNewPrivileges=yes",
        "StateDirectory=clawfleet-coordinator",
        "CapabilityBoundingSet=\n",
    ] {
        assert!(props.contains(want), "{want} in {props}");
    }

    if let Some(reason) = occ_commands_missing(&host) {
        eprintln!("SKIP (service part): {reason}");
        return;
    }

    // The service: started by the package, `occ init` ran as the clawfleet user.
    wait_healthy(&host);
    eprintln!("install to /healthz 200: {:?}", t.elapsed());
    let main_pid = host
        .run_ok(&format!("systemctl show -p MainPID --value {UNIT}"))
        .unwrap();
    assert_eq!(
        host.run_ok(&format!("ps -o user= -p {}", main_pid.trim()))
            .unwrap()
            .trim(),
        "clawfleet"
    );
    assert_eq!(
        host.run_ok(&format!("stat -c '%a %U %G' {STATE}")).unwrap(),
        "700 clawfleet clawfleet\n"
    );
    let keys = format!(
        "{STATE}/keys/login_ed25519 {STATE}/keys/signing_ed25519 {STATE}/keys/encryption.key"
    );
    let perms = host
        .run_ok(&format!("stat -c '%a %U' {keys} {STATE}/occ.db"))
        .unwrap();
    assert_eq!(perms, "600 clawfleet\n".repeat(4), "occ init's files");
    // The unit's `occ init` (no terminal, no --admin-token-file) keeps no token anywhere.
    assert!(!exists(&host, &format!("{STATE}/admin.token")));
    let journal = host
        .run_ok(&format!("journalctl -u {UNIT} --no-pager -o cat | wc -l"))
        .unwrap();
    assert!(
        journal.trim().parse::<u32>().unwrap() > 0,
        "logs in journald"
    );
    let exposure = host
        .run_ok(&format!(
            "systemd-analyze security --no-pager {UNIT} | tail -n 1"
        ))
        .unwrap();
    eprintln!("systemd-analyze security: {}", exposure.trim());

    // Upgrade: restarted on the new binary, `occ init` keeps the keys.
    let before = host.run_ok(&format!("sha256sum {keys}")).unwrap();
    if let Some(next) = &pkgs.coordinator_deb_next {
        host.install_deb(next).unwrap();
        wait_healthy(&host);
        assert_eq!(host.run_ok(&format!("sha256sum {keys}")).unwrap(), before);
        host.install_deb(&pkgs.coordinator_deb).unwrap();
        wait_healthy(&host);
        assert_eq!(host.run_ok(&format!("sha256sum {keys}")).unwrap(), before);
    } else {
        missing(
            "no rebuilt coordinator .deb in target/packages/test (packaging/build.sh makes it)",
        );
    }

    // Remove stops the service; purge removes the conffile but keeps state and account.
    host.run_ok("dpkg -r clawfleet-coordinator").unwrap();
    assert_ne!(unit_state(&host), "active");
    assert!(exists(&host, "/etc/clawfleet/occ.toml"));
    host.run_ok("dpkg -P clawfleet-coordinator").unwrap();
    assert!(!exists(&host, "/etc/clawfleet/occ.toml"));
    assert!(!exists(&host, "/usr/bin/occ"));
    assert_eq!(host.run_ok(&format!("sha256sum {keys}")).unwrap(), before);
    host.run_ok("getent passwd clawfleet").unwrap();
}

/// Both packages on one host, the coordinator enrolling its own host over 127.0.0.1: an Agent
/// deployed by `occ serve` running inside its hardened unit (sandbox, no capabilities, the
/// `clawfleet` user) through sshd's forced command to the packaged hostd.
#[test]
fn both_packages_on_one_host_deploy_an_agent_from_the_hardened_service() {
    skip_unless_hosts!();
    let Some(pkgs) = packages_or_skip() else {
        return;
    };
    let host = TestHost::start().unwrap();
    install_hostd_deb(&host, &pkgs.hostd_deb).unwrap();
    host.install_deb(&pkgs.coordinator_deb).unwrap();
    if let Some(reason) = occ_commands_missing(&host) {
        eprintln!("SKIP: {reason}");
        return;
    }
    let gateway = host.install_test_gateway().unwrap();
    host.write_file(
        "/etc/clawfleet/hostd.toml",
        format!(
            "host_name = \"{}\"\ngateway_command = [\"{gateway}\"]\n\
             [limits]\nreadiness_timeout_ms = 30000\nlock_timeout_ms = 5000\n",
            host.name()
        )
        .as_bytes(),
        0o644,
    )
    .unwrap();
    wait_healthy(&host);

    // The guide's enrolment, all on this host: the operator asks for the first admin token
    // (printed once) and keeps it where only root reads it; client commands read it from there.
    let t = Instant::now();
    host.run_ok(
        "umask 077 && runuser -u clawfleet -- occ init --config /etc/clawfleet/occ.toml \
         --admin-token-file - > /root/occ-admin.token",
    )
    .unwrap();
    let occ = "OCC_TOKEN_FILE=/root/occ-admin.token occ";
    let enrol = host.run_ok("occ enrol-command").unwrap();
    let enrolled = host.run_ok(enrol.trim()).unwrap();
    assert!(enrolled.contains(host.host_key_fingerprint()), "{enrolled}");
    host.run_ok(&format!(
        "{occ} host enrol {} --address 127.0.0.1 --host-key /etc/ssh/ssh_host_ed25519_key.pub",
        host.name()
    ))
    .unwrap();
    host.run_ok(&format!(
        "{occ} namespace create solo --hosts {}",
        host.name()
    ))
    .unwrap();
    let json = |cmd: &str| -> serde_json::Value {
        serde_json::from_str(&host.run_ok(&format!("{occ} --output json {cmd}")).unwrap()).unwrap()
    };
    let mut last = serde_json::Value::Null;
    assert!(
        wait_until(Duration::from_secs(60), || {
            last = json("namespace get solo");
            last["ready"] == serde_json::json!(true)
        }),
        "{last:#}"
    );
    host.write_file(
        "/var/tmp/cfg.json",
        br#"{"logging": {"level": "info"}, "x-clawfleet-test": {"label": "solo-1"}}"#,
        0o644,
    )
    .unwrap();
    host.run_ok(&format!("{occ} configuration create solo a1 --file /var/tmp/cfg.json && {occ} agent create solo a1 --configuration a1"))
        .unwrap();
    let rev = json("agent deploy solo a1")["id"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        wait_until(Duration::from_secs(90), || {
            last = json("agent status solo a1");
            last["converged"] == serde_json::json!(true)
                && last["servedRevisionId"] == serde_json::json!(rev)
        }),
        "{last:#}\n{}",
        host.run_ok(&format!("journalctl -u {UNIT} --no-pager | tail -n 40"))
            .unwrap()
    );
    eprintln!(
        "enrol + Namespace + deploy through the packaged service: {:?}",
        t.elapsed()
    );
    let o = observation(&host, "solo", "a1");
    assert_eq!(o["served"], serde_json::json!(rev), "{o:#}");
    let port = o["port"].as_u64().unwrap();
    let (code, info) = curl(&host, &format!("http://127.0.0.1:{port}/info"));
    assert_eq!(code, 200);
    assert!(info.contains("\"label\":\"solo-1\""), "{info}");
}
