//! Issue 15's host hooks on a real test host, through `occ`: a start hook's two launch values
//! reach the gateway (the test gateway's /info); a failing start hook keeps the previous
//! revision serving with HOOK_FAILED; a start hook that succeeded followed by a gateway that
//! fails makes the stop hook run once as compensation; a group-writable hook is refused with
//! HOOK_REFUSED; stop hooks run in reverse order on `occ agent stop`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::fleet_support as fleet;

use std::time::{Duration, Instant};

use fleet::{Fleet, NS, Want, document};
use serde_json::{Value, json};

const LOG: &str = "/var/tmp/hooks.log";

fn install_hook(fleet: &Fleet, event: &str, name: &str, body: &str, mode: u32) {
    let host = fleet.hosts.iter().next().unwrap();
    host.write_file(
        &format!("/etc/clawfleet/hooks.d/{event}/{name}"),
        format!("#!/bin/sh\n{body}\n").as_bytes(),
        mode,
    )
    .unwrap();
    host.run_ok(&format!(
        "chmod 755 /etc/clawfleet/hooks.d /etc/clawfleet/hooks.d/{event}"
    ))
    .unwrap();
}

fn log_lines(fleet: &Fleet) -> Vec<String> {
    let host = fleet.hosts.iter().next().unwrap();
    host.run_ok(&format!("cat {LOG} 2>/dev/null || true"))
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect()
}

fn info(fleet: &Fleet, agent: &str) -> Value {
    let host = fleet.hosts.iter().next().unwrap();
    let port = fleet.api_agents()[agent]["port"].as_u64().unwrap();
    let out = host
        .run_ok(&format!("curl -sf http://127.0.0.1:{port}/info"))
        .unwrap();
    serde_json::from_str(&out).unwrap()
}

/// Waits until the Agent's deployment status names `code`.
fn wait_code(fleet: &Fleet, agent: &str, code: &str) -> Value {
    let t = Instant::now();
    loop {
        let s = fleet.status(agent).unwrap();
        if s.to_string().contains(code) {
            return s;
        }
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "{code} never showed: {s}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn converge(fleet: &Fleet, agent: &str, rev: String, label: &str) {
    fleet.wait_converged(
        &[(
            agent,
            Want::Running {
                rev,
                label: label.into(),
            },
        )],
        Instant::now(),
        Duration::from_secs(90),
    );
}

#[test]
fn host_hooks_hand_over_launch_values_guard_the_start_and_compensate() {
    clawfleet_vm_tests::skip_unless_hosts!();
    let fleet = Fleet::start(1);
    install_hook(
        &fleet,
        "before-workload-start",
        "10-region",
        &format!(
            "echo start-10:$CLAWFLEET_AGENT_ID:$CLAWFLEET_REVISION_NUMBER >> {LOG}; echo HOOK_REGION=eu-west"
        ),
        0o700,
    );
    install_hook(
        &fleet,
        "before-workload-start",
        "20-cred",
        &format!("echo start-20 >> {LOG}; echo 'HOOK_CRED_REF=vault:kv/agents/h1'"),
        0o700,
    );
    install_hook(
        &fleet,
        "before-workload-stop",
        "10-a",
        &format!("echo stop-10 >> {LOG}"),
        0o700,
    );
    install_hook(
        &fleet,
        "before-workload-stop",
        "20-b",
        &format!("echo stop-20 >> {LOG}"),
        0o700,
    );

    // Two launch values reach the gateway, from hooks run in order.
    fleet.create_agent("h1", &document("h1-v1", json!({})));
    let rev1 = fleet.deploy("h1");
    converge(&fleet, "h1", rev1.clone(), "h1-v1");
    let gw = info(&fleet, "h1");
    assert_eq!(
        gw["hookEnv"],
        json!({"HOOK_REGION": "eu-west", "HOOK_CRED_REF": "vault:kv/agents/h1"}),
        "{gw}"
    );
    assert_eq!(log_lines(&fleet), ["start-10:h1:1", "start-20"]);

    // A failing start hook: no launch, revision 1 keeps serving.
    install_hook(&fleet, "before-workload-start", "30-fail", "exit 7", 0o700);
    fleet.update_configuration("h1", &document("h1-v2", json!({})));
    fleet.deploy("h1");
    wait_code(&fleet, "h1", "HOOK_FAILED");
    let gw = info(&fleet, "h1");
    assert_eq!(gw["label"], "h1-v1", "revision 1 must keep serving: {gw}");
    let pid = gw["pid"].clone();

    // A group-writable hook is refused, naming it; nothing changes either.
    let host = fleet.hosts.iter().next().unwrap();
    host.run_ok(
        "rm /etc/clawfleet/hooks.d/before-workload-start/30-fail && \
                 chmod 0770 /etc/clawfleet/hooks.d/before-workload-start/20-cred",
    )
    .unwrap();
    let s = wait_code(&fleet, "h1", "HOOK_REFUSED");
    assert!(
        s.to_string().contains("before-workload-start/20-cred"),
        "{s}"
    );
    assert_eq!(info(&fleet, "h1")["pid"], pid);

    // Start hooks succeed, then the gateway fails: the stop hooks run once, in reverse.
    host.run_ok(
        "chmod 0700 /etc/clawfleet/hooks.d/before-workload-start/20-cred && : > /var/tmp/hooks.log",
    )
    .unwrap();
    fleet.update_configuration("h1", &document("h1-v3", json!({"crashAtStart": true})));
    fleet.deploy("h1");
    let t = Instant::now();
    loop {
        let lines = log_lines(&fleet);
        if lines.iter().any(|l| l.starts_with("stop-")) {
            // One activation attempt: both start hooks, then both stop hooks in reverse.
            assert_eq!(
                &lines[..4],
                ["start-10:h1:3", "start-20", "stop-20", "stop-10"],
                "{lines:?}"
            );
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(90),
            "no compensation: {lines:?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }

    // A good revision again, then a stop: stop hooks in reverse order before the unit stops.
    fleet.update_configuration("h1", &document("h1-v4", json!({})));
    let rev4 = fleet.deploy("h1");
    converge(&fleet, "h1", rev4, "h1-v4");
    host.run_ok(": > /var/tmp/hooks.log").unwrap();
    fleet.occ_ok(&["agent", "stop", NS, "h1", "--wait", "--timeout", "60"]);
    assert_eq!(log_lines(&fleet), ["stop-20", "stop-10"]);
}
