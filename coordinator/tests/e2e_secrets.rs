//! Issue 29 end to end on a real test host, through `occ` only: a secret written with
//! `occ secret set` and bound in a configuration reaches the running gateway as a file (the
//! gateway reports the fingerprint it holds); `occ secret rotate` delivers the next version to
//! the same gateway process without a restart (its MainPID and listener stay, it reports the
//! new fingerprint and a successful reload), and the Agent converges on the rotation's
//! revision. Neither value is ever printed by `occ`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "fleet_support/mod.rs"]
pub mod fleet;

use std::time::{Duration, Instant};

use clawfleet_protocol::sealed::SecretFingerprint;
use fleet::{Fleet, NS, Want, document};
use serde_json::{Value, json};

const V1: &str = "xoxb-e2e-first-4b1d";
const V2: &str = "xoxb-e2e-second-9c2e";

fn unit_name(agent: &str) -> String {
    let id = |s: &str| clawfleet_protocol::Ident::new(s).unwrap();
    hostd::layout::Layout::new("/var/lib/clawfleet", "/etc/systemd/system")
        .agent(&id(NS), &id(agent))
        .unit_name
}

/// What the gateway holds: its `/secrets` report.
fn held(fleet: &Fleet, agent: &str) -> Value {
    let host = fleet.hosts.iter().next().unwrap();
    let port = fleet.api_agents()[agent]["port"].as_u64().unwrap();
    let out = host
        .run_ok(&format!("curl -sf http://127.0.0.1:{port}/secrets"))
        .unwrap();
    serde_json::from_str(&out).unwrap()
}

fn main_pid(fleet: &Fleet, agent: &str) -> u32 {
    let host = fleet.hosts.iter().next().unwrap();
    host.run_ok(&format!(
        "systemctl show -p MainPID --value {}",
        unit_name(agent)
    ))
    .unwrap()
    .trim()
    .parse()
    .unwrap()
}

fn fingerprint(v: &str) -> String {
    SecretFingerprint::of(v.as_bytes()).as_str().to_owned()
}

#[test]
fn a_secret_reaches_the_gateway_and_rotates_without_a_restart_through_occ() {
    clawfleet_vm_tests::skip_unless_hosts!();
    let fleet = Fleet::start(1);
    let local = tempfile::tempdir().unwrap();
    let value_file = |v: &str| {
        let p = local.path().join("value");
        // One trailing newline, as an editor leaves it: occ drops it.
        std::fs::write(&p, format!("{v}\n")).unwrap();
        p.display().to_string()
    };

    let set = fleet.occ_ok(&[
        "secret",
        "set",
        NS,
        "slack-bot",
        "--from-file",
        &value_file(V1),
    ]);
    assert!(!set.contains(V1), "{set}");
    let mut doc = document("s1", json!({}));
    doc["channels"] = json!({"slack": {"botToken":
        {"source": "file", "provider": "clawfleet", "id": "slack-bot"}}});
    let cfg = local.path().join("cfg.json");
    std::fs::write(&cfg, doc.to_string()).unwrap();
    fleet.occ_ok(&[
        "configuration",
        "create",
        NS,
        "s1",
        "--file",
        &cfg.display().to_string(),
    ]);
    fleet.occ_ok(&["agent", "create", NS, "s1", "--configuration", "s1"]);
    let rev1 = fleet.deploy("s1");
    fleet.wait_converged(
        &[(
            "s1",
            Want::Running {
                rev: rev1.clone(),
                label: "s1".into(),
            },
        )],
        Instant::now(),
        Duration::from_secs(90),
    );
    let before = held(&fleet, "s1");
    assert_eq!(
        before["providers"]["clawfleet-slack-bot"]["fingerprint"],
        fingerprint(V1),
        "the gateway does not hold version 1: {before}"
    );
    let pid = main_pid(&fleet, "s1");
    assert!(pid > 0);

    // The rotation: a new version and a revision per Agent using it, delivered by the
    // ordinary deploy path; the gateway reloads in place.
    let rotated = fleet.occ_json(&[
        "secret",
        "rotate",
        NS,
        "slack-bot",
        "--from-file",
        &value_file(V2),
    ]);
    assert!(!rotated.to_string().contains(V2), "{rotated}");
    assert_eq!(rotated["secret"]["version"], 2, "{rotated}");
    let started = rotated["deploys"]
        .as_array()
        .unwrap_or_else(|| panic!("{rotated}"));
    assert_eq!(started.len(), 1, "{rotated}");
    assert_eq!(started[0]["agentId"], "s1", "{rotated}");
    let rev2 = started[0]["revisionId"].as_str().unwrap().to_owned();
    assert_ne!(rev2, rev1);
    fleet.wait_converged(
        &[(
            "s1",
            Want::Running {
                rev: rev2.clone(),
                label: "s1".into(),
            },
        )],
        Instant::now(),
        Duration::from_secs(90),
    );
    let after = held(&fleet, "s1");
    assert_eq!(
        after["providers"]["clawfleet-slack-bot"]["fingerprint"],
        fingerprint(V2),
        "the gateway does not hold version 2: {after}"
    );
    assert_eq!(after["lastReload"]["ok"], true, "{after}");
    assert_eq!(
        main_pid(&fleet, "s1"),
        pid,
        "the rotation restarted the gateway"
    );
    let info = fleet.occ_json(&["secret", "get", NS, "slack-bot"]);
    assert!(!info.to_string().contains(V2), "{info}");
    let used: Vec<&Value> = info["usedBy"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|u| u["active"] == true)
        .collect();
    assert_eq!(used.len(), 1, "{info}");
    assert_eq!(used[0]["version"], 2, "{info}");
    assert_eq!(used[0]["revisionId"], rev2.as_str(), "{info}");
}
