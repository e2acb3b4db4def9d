//! Issue 29 end to end on a real test host, through `occ` only: a secret written with
//! `occ secret set` and bound in a configuration reaches the running gateway as a file (the
//! gateway reports the fingerprint it holds); `occ secret rotate` rolls the next version out
//! through the rollout engine: a value the gateway cannot resolve fails the canary and halts
//! the rollout naming it while every gateway keeps serving the old value in the same
//! process; a good value reaches every gateway without a restart (same MainPID, the new
//! fingerprint, a successful reload). Neither value is ever printed by `occ`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::fleet_support as fleet;

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
    let agents = ["s1", "s2"];
    let mut revs = Vec::new();
    for a in agents {
        fleet.occ_ok(&["agent", "create", NS, a, "--configuration", "s1"]);
        revs.push(fleet.deploy(a));
    }
    fleet.wait_converged(
        &[
            (
                "s1",
                Want::Running {
                    rev: revs[0].clone(),
                    label: "s1".into(),
                },
            ),
            (
                "s2",
                Want::Running {
                    rev: revs[1].clone(),
                    label: "s1".into(),
                },
            ),
        ],
        Instant::now(),
        Duration::from_secs(90),
    );
    let pids: Vec<u32> = agents.iter().map(|a| main_pid(&fleet, a)).collect();
    for a in agents {
        let before = held(&fleet, a);
        assert_eq!(
            before["providers"]["clawfleet-slack-bot"]["fingerprint"],
            fingerprint(V1),
            "{a} does not hold version 1: {before}"
        );
    }
    assert!(pids.iter().all(|p| *p > 0), "{pids:?}");
    let served = |a: &str| fleet.api_agents()[a]["servedRevisionId"].clone();

    // A value the gateway cannot resolve (only a byte order mark, which it strips): the
    // rotation's rollout fails its canary (s1, first by id), halts naming it, and s2 is never
    // sent the value. Both gateways keep their process and serve version 1.
    let refused = fleet.occ(&[
        "secret",
        "rotate",
        NS,
        "slack-bot",
        "--from-file",
        &value_file("\u{feff}"),
        "--canary",
        "1",
        "--max-parallel",
        "2",
        "--wait",
        "--timeout",
        "120",
        "--output",
        "json",
    ]);
    let out = String::from_utf8_lossy(&refused.stdout).to_string();
    let err = String::from_utf8_lossy(&refused.stderr).to_string();
    assert_ne!(refused.status.code(), Some(0), "{out}\n{err}");
    let doc: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}\n{err}"));
    let rollout = &doc["rollout"];
    assert_eq!(doc["secret"]["version"], 2, "{doc}");
    assert_eq!(rollout["state"], "halted", "{doc}");
    assert!(
        rollout["message"].as_str().unwrap_or("").contains("s1"),
        "the halt does not name the canary: {doc}"
    );
    assert_eq!(rollout["agents"][0]["agentId"], "s1", "{doc}");
    assert_eq!(
        rollout["agents"][0]["code"], "SECRET_RELOAD_FAILED",
        "{doc}"
    );
    assert_eq!(rollout["agents"][1]["state"], "skipped", "{doc}");
    assert!(err.contains("s1"), "{err}");
    for (i, a) in agents.iter().enumerate() {
        assert_eq!(
            main_pid(&fleet, a),
            pids[i],
            "the refused value restarted {a}"
        );
        assert_eq!(
            served(a),
            revs[i].as_str(),
            "{a} stopped serving its revision"
        );
        let held_now = held(&fleet, a);
        assert_eq!(
            held_now["providers"]["clawfleet-slack-bot"]["fingerprint"],
            fingerprint(V1),
            "{a} does not serve version 1 any more: {held_now}"
        );
    }

    // A good value: canary, then the rest; each gateway reloads in place.
    let rotated = fleet.occ_json(&[
        "secret",
        "rotate",
        NS,
        "slack-bot",
        "--from-file",
        &value_file(V2),
        "--canary",
        "1",
        "--max-parallel",
        "2",
        "--wait",
        "--timeout",
        "180",
    ]);
    assert!(!rotated.to_string().contains(V2), "{rotated}");
    assert_eq!(rotated["secret"]["version"], 3, "{rotated}");
    assert_eq!(rotated["rollout"]["state"], "done", "{rotated}");
    assert_eq!(
        rotated["rollout"]["secret"]["name"], "slack-bot",
        "{rotated}"
    );
    for (i, a) in agents.iter().enumerate() {
        let row = rotated["rollout"]["agents"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["agentId"] == *a)
            .unwrap_or_else(|| panic!("{a} not in {rotated}"));
        assert_eq!(row["state"], "succeeded", "{rotated}");
        assert!(
            row["message"].as_str().unwrap_or("").contains(
                "secrets reloaded without a restart; the gateway holds their fingerprints"
            ),
            "the coordinator does not say how the change was taken: {rotated}"
        );
        let rev = row["revisionId"].as_str().unwrap().to_owned();
        assert_ne!(rev, revs[i]);
        fleet.wait_converged(
            &[(
                a,
                Want::Running {
                    rev: rev.clone(),
                    label: "s1".into(),
                },
            )],
            Instant::now(),
            Duration::from_secs(90),
        );
        let after = held(&fleet, a);
        assert_eq!(
            after["providers"]["clawfleet-slack-bot"]["fingerprint"],
            fingerprint(V2),
            "{a} does not hold the new version: {after}"
        );
        assert_eq!(after["lastReload"]["ok"], true, "{after}");
        assert_eq!(main_pid(&fleet, a), pids[i], "the rotation restarted {a}");
    }
    let info = fleet.occ_json(&["secret", "get", NS, "slack-bot"]);
    assert!(!info.to_string().contains(V2), "{info}");
    let used: Vec<&Value> = info["usedBy"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|u| u["active"] == true)
        .collect();
    assert_eq!(used.len(), 2, "{info}");
    assert!(used.iter().all(|u| u["version"] == 3), "{info}");
}
