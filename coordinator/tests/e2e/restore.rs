//! Issue 16's restore on a real test host, through `occ`: with `--restore last-served`, a
//! candidate that never becomes ready, and one that crash-loops, are given up by the host within
//! the same operation and the last served revision serves again (a new gateway process,
//! `/readyz` 200, `served.json` naming it); the coordinator sets `activeRevisionId` back,
//! shows REVISION_RESTORED with the candidate's failure and evidence, audits it, and
//! `occ agent deploy --wait` exits non-zero saying "restored rev-1". With the SSH session cut
//! during the readiness wait, the host still restores and the coordinator learns the outcome.
//! An Agent without restore keeps the seed's behaviour (the candidate stays selected).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::fleet_support as fleet;

use std::time::{Duration, Instant};

use fleet::{Fleet, NS, Want, document};
use serde_json::{Value, json};

/// The number of a revision id (`rev-N-…`): ids also name their content, tests name numbers.
fn rev_num(id: Option<&str>) -> Option<u64> {
    id.and_then(coordinator::model::Revision::number_of)
}

fn pid(fleet: &Fleet, agent: &str) -> u64 {
    let rt = fleet.occ_json(&["agent", "runtime", NS, agent]);
    rt["workload"]["mainPid"]
        .as_u64()
        .unwrap_or_else(|| panic!("no main pid: {rt}"))
}

fn served_marker(fleet: &Fleet, agent: &str) -> Value {
    let layout = hostd::layout::Layout::new("/var/lib/clawfleet", "/etc/systemd/system");
    let paths = layout.agent(
        &clawfleet_protocol::Ident::new(NS).unwrap(),
        &clawfleet_protocol::Ident::new(agent).unwrap(),
    );
    let host = fleet.hosts.iter().next().unwrap();
    let text = host
        .run_ok(&format!("cat {}", paths.served.display()))
        .unwrap();
    serde_json::from_str(&text).unwrap()
}

/// `occ agent deploy --wait` of a bad candidate: non-zero, saying what was restored.
fn deploy_bad(fleet: &Fleet, agent: &str, switches: Value) -> String {
    fleet.update_configuration(agent, &document("bad", switches));
    let out = fleet.occ(&["agent", "deploy", NS, agent, "--wait", "--timeout", "150"]);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.status.code(), Some(3), "{text}");
    text
}

fn check_restored(fleet: &Fleet, agent: &str, candidate: u64, code: &str, before: u64) {
    let s = fleet.status(agent).unwrap();
    assert_eq!(rev_num(s["activeRevisionId"].as_str()), Some(1), "{s}");
    assert_eq!(rev_num(s["servedRevisionId"].as_str()), Some(1), "{s}");
    assert_eq!(s["lastCode"], "REVISION_RESTORED", "{s}");
    let revs = s["revisions"].as_array().unwrap();
    let cand = revs
        .iter()
        .find(|r| rev_num(r["id"].as_str()) == Some(candidate))
        .unwrap();
    assert_eq!(cand["status"], "failed", "{s}");
    assert!(
        cand["lastAttempt"]["message"]
            .as_str()
            .unwrap()
            .contains(code),
        "{s}"
    );
    assert_eq!(cand["runtimeFailure"]["code"], code, "{s}");
    let first = revs
        .iter()
        .find(|r| rev_num(r["id"].as_str()) == Some(1))
        .unwrap();
    assert_eq!(first["status"], "active", "{s}");
    // A new gateway process of rev-1 answers, and the host records rev-1 as served.
    let now = pid(fleet, agent);
    assert_ne!(now, before, "rev-1 was started again");
    assert_eq!(
        served_marker(fleet, agent)["revisionId"],
        first["id"],
        "{s}"
    );
    let port = s["port"].as_u64().unwrap();
    let host = fleet.hosts.iter().next().unwrap();
    let info = host
        .run_ok(&format!("curl -sf http://127.0.0.1:{port}/info"))
        .unwrap();
    assert!(info.contains(&format!("{agent}-good")), "{info}");
    let ready = host
        .run_ok(&format!(
            "curl -s -o /dev/null -w '%{{http_code}}' http://127.0.0.1:{port}/readyz"
        ))
        .unwrap();
    assert_eq!(ready.trim(), "200");
}

#[test]
fn a_failed_candidate_is_replaced_by_the_last_served_revision_with_restore_on() {
    clawfleet_vm_tests::skip_unless_hosts!();
    let mut fleet = Fleet::start(1);
    for agent in ["r1", "plain"] {
        fleet.create_agent(agent, &document(&format!("{agent}-good"), json!({})));
    }
    fleet.occ_ok(&["agent", "set", NS, "r1", "--restore", "last-served"]);
    let get = fleet.occ_json(&["agent", "get", NS, "r1"]);
    assert_eq!(get["restore"], "last-served", "{get}");
    let wants: Vec<(&str, Want)> = ["r1", "plain"]
        .iter()
        .map(|a| {
            (
                *a,
                Want::Running {
                    rev: fleet.deploy(a),
                    label: format!("{a}-good"),
                },
            )
        })
        .collect();
    fleet.wait_converged(&wants, Instant::now(), Duration::from_secs(90));

    // A candidate that never becomes ready.
    let before = pid(&fleet, "r1");
    let out = deploy_bad(&fleet, "r1", json!({"neverReady": true}));
    assert!(out.contains("restored rev-1"), "{out}");
    check_restored(&fleet, "r1", 2, "READINESS_TIMEOUT", before);
    let audit = fleet.occ_json(&["audit", "--action", "agent.restore"]);
    assert_eq!(audit.as_array().unwrap().len(), 1, "{audit}");
    assert_eq!(
        rev_num(audit[0]["detail"]["candidate"].as_str()),
        Some(2),
        "{audit}"
    );
    assert_eq!(
        rev_num(audit[0]["detail"]["restored"].as_str()),
        Some(1),
        "{audit}"
    );

    // A crash-looping one.
    let before = pid(&fleet, "r1");
    let out = deploy_bad(&fleet, "r1", json!({"crashAtStart": true}));
    assert!(out.contains("restored rev-1"), "{out}");
    check_restored(&fleet, "r1", 3, "UNIT_FAILED", before);

    // The session cut while the host waits for the candidate: the host restores by itself,
    // and the coordinator learns it.
    fleet.update_configuration("r1", &document("bad", json!({"neverReady": true})));
    let before = pid(&fleet, "r1");
    let rev = fleet.deploy("r1");
    let host = fleet.hosts.iter().next().unwrap();
    let layout = hostd::layout::Layout::new("/var/lib/clawfleet", "/etc/systemd/system");
    let paths = layout.agent(
        &clawfleet_protocol::Ident::new(NS).unwrap(),
        &clawfleet_protocol::Ident::new("r1").unwrap(),
    );
    let candidate_dir = hostd::layout::dir_name(&clawfleet_protocol::Ident::new(&rev).unwrap());
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let link = host
            .run(&format!("readlink {}", paths.current.display()))
            .unwrap();
        if String::from_utf8_lossy(&link.stdout).contains(&candidate_dir) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the cutover to {rev} never began"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // Cut every coordinator session: the sshd processes whose child is `hostd serve` (found
    // by their relation to it, on this test host only).
    let cut = host
        .run_ok(
            "for d in /proc/[0-9]*; do \
               if [ \"$(cat $d/comm 2>/dev/null)\" = hostd ] && tr '\\0' ' ' < $d/cmdline 2>/dev/null | grep -q ' serve'; then \
                 pp=$(awk '/^PPid/{print $2}' $d/status); \
                 if [ \"$(cat /proc/$pp/comm 2>/dev/null)\" = sshd ]; then kill -9 $pp && echo $pp; fi; \
               fi; \
             done",
        )
        .unwrap();
    assert!(!cut.trim().is_empty(), "no coordinator session to cut");
    let deadline = Instant::now() + Duration::from_secs(150);
    loop {
        let s = fleet.status("r1").unwrap();
        if s["lastCode"] == "REVISION_RESTORED"
            && s["revisions"]
                .as_array()
                .unwrap()
                .iter()
                .any(|r| r["id"] == json!(rev) && r["status"] == "failed")
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the restore was never learnt: {s}"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    check_restored(
        &fleet,
        "r1",
        rev_num(Some(&rev)).unwrap(),
        "READINESS_TIMEOUT",
        before,
    );

    // Restore off: the seed's behaviour, the candidate stays selected and nothing serves.
    fleet.update_configuration("plain", &document("bad", json!({"crashAtStart": true})));
    let bad = fleet.deploy("plain");
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let s = fleet.status("plain").unwrap();
        if s["activeRevisionId"] == json!(bad) && s["servedRevisionId"].is_null() {
            break;
        }
        assert!(Instant::now() < deadline, "{s}");
        std::thread::sleep(Duration::from_millis(500));
    }
    let audit = fleet.occ_json(&["audit", "--action", "agent.restore"]);
    assert_eq!(audit.as_array().unwrap().len(), 3, "{audit}");
    fleet.occ_ok(&["agent", "stop", NS, "plain", "--wait", "--timeout", "90"]);
    let _ = fleet.stop_serve();
}
