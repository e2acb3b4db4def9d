//! Issue 16's rollouts on real test hosts, through `occ`: 12 Agents over 3 hosts on one
//! Configuration. A generation whose gateway never becomes ready, rolled out with a canary of
//! 2 and a budget of 1 failure, halts after the canary: the two canaries (restore on) are
//! restored, the other ten keep their revision and their gateway process untouched, and
//! `occ rollout create --wait` exits non-zero naming them. A good generation then goes out in
//! waves (paused and resumed on the way) with never more than maxParallel activations at
//! once, measured from the hosts' own journals; `occ serve` is SIGKILLed mid-rollout and the
//! restarted one finishes it without deploying any Agent twice.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::fleet_support as fleet;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use fleet::{Fleet, NS, Want, document, journal_field};
use serde_json::{Value, json};

/// The number of a revision id (`rev-N-…`): ids also name their content, tests name numbers.
fn rev_num(id: Option<&str>) -> Option<u64> {
    id.and_then(coordinator::model::Revision::number_of)
}

fn agents() -> Vec<String> {
    (1..=12).map(|i| format!("a{i:02}")).collect()
}

fn pid(fleet: &Fleet, agent: &str) -> u64 {
    let rt = fleet.occ_json(&["agent", "runtime", NS, agent]);
    rt["workload"]["mainPid"]
        .as_u64()
        .unwrap_or_else(|| panic!("no main pid for {agent}: {rt}"))
}

fn write_doc(dir: &std::path::Path, name: &str, doc: &Value) -> String {
    let path = dir.join(format!("{name}.json"));
    std::fs::write(&path, doc.to_string()).unwrap();
    path.display().to_string()
}

fn rollout(fleet: &Fleet, id: i64) -> Value {
    fleet.occ_json(&["rollout", "status", NS, &id.to_string()])
}

fn wait_rollout(fleet: &Fleet, id: i64, done: impl Fn(&Value) -> bool, timeout: Duration) -> Value {
    let start = Instant::now();
    loop {
        let r = rollout(fleet, id);
        if done(&r) {
            return r;
        }
        assert!(
            start.elapsed() < timeout,
            "rollout {id} not as expected after {timeout:?}: {r}"
        );
        std::thread::sleep(Duration::from_millis(250));
    }
}

fn agent_states(r: &Value) -> BTreeMap<String, (String, String)> {
    r["agents"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| {
            (
                a["agentId"].as_str().unwrap().to_owned(),
                (
                    a["state"].as_str().unwrap().to_owned(),
                    a["code"].as_str().unwrap_or("-").to_owned(),
                ),
            )
        })
        .collect()
}

/// The most `activate-revision` operations any moment saw running at once across the hosts,
/// from each host's hostd journal entries since `since` (Unix seconds); and how many ran.
fn most_concurrent_activations(fleet: &Fleet, since: u64) -> (usize, usize) {
    let mut spans: BTreeMap<String, (u64, Option<u64>)> = BTreeMap::new();
    for host in fleet.hosts.iter() {
        let text = host
            .run_ok(&format!(
                "journalctl -t hostd -o json --no-pager --since @{since}"
            ))
            .unwrap();
        for line in text.lines() {
            let Ok(e) = serde_json::from_str::<Value>(line) else {
                continue;
            };
            if journal_field(&e, "OP") != Some("activate-revision") {
                continue;
            }
            let (Some(id), Some(msg), Some(at)) = (
                journal_field(&e, "OPERATION_ID"),
                journal_field(&e, "MESSAGE"),
                journal_field(&e, "__REALTIME_TIMESTAMP").and_then(|t| t.parse::<u64>().ok()),
            ) else {
                continue;
            };
            let key = format!("{}/{id}", host.name());
            if msg.contains("operation received") {
                spans.entry(key).or_insert((at, None));
            } else if msg.contains("operation succeeded") || msg.contains("operation failed") {
                spans.entry(key).or_insert((at, None)).1 = Some(at);
            }
        }
    }
    let mut edges: Vec<(u64, i32)> = Vec::new();
    for (start, end) in spans.values() {
        edges.push((*start, 1));
        edges.push((end.unwrap_or(u64::MAX), -1));
    }
    // Ends before starts at the same microsecond.
    edges.sort_by_key(|&(t, d)| (t, d));
    let (mut now, mut most) = (0i32, 0i32);
    for (_, d) in edges {
        now += d;
        most = most.max(now);
    }
    (most as usize, spans.len())
}

#[test]
fn rollouts_halt_on_a_bad_canary_and_go_out_in_waves_through_a_coordinator_crash() {
    clawfleet_vm_tests::skip_unless_hosts!();
    let mut fleet = Fleet::start(3);
    let docs = tempfile::tempdir().unwrap();
    let v1 = write_doc(docs.path(), "v1", &document("v1", json!({})));
    fleet.occ_ok(&["configuration", "create", NS, "shared", "--file", &v1]);
    for a in agents() {
        let mut args = vec!["agent", "create", NS, &a, "--configuration", "shared"];
        if a == "a01" || a == "a02" {
            args.extend(["--restore", "last-served"]);
        }
        fleet.occ_ok(&args);
    }
    let wants: Vec<(String, Want)> = agents()
        .into_iter()
        .map(|a| {
            let rev = fleet.deploy(&a);
            (
                a,
                Want::Running {
                    rev,
                    label: "v1".into(),
                },
            )
        })
        .collect();
    let refs: Vec<(&str, Want)> = wants.iter().map(|(a, w)| (a.as_str(), w.clone())).collect();
    fleet.wait_converged(&refs, Instant::now(), Duration::from_secs(180));
    let hosts: std::collections::BTreeSet<String> = agents()
        .iter()
        .map(|a| {
            fleet.status(a).unwrap()["host"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect();
    assert_eq!(hosts.len(), 3, "the 12 Agents are spread over the 3 hosts");
    let pids: BTreeMap<String, u64> = agents()
        .iter()
        .map(|a| (a.clone(), pid(&fleet, a)))
        .collect();

    // A generation that never becomes ready: canary 2, at most 1 failure.
    let bad = write_doc(
        docs.path(),
        "bad",
        &document("bad", json!({"neverReady": true})),
    );
    fleet.occ_ok(&["configuration", "update", NS, "shared", "--file", &bad]);
    let t = Instant::now();
    let out = fleet.occ(&[
        "rollout",
        "create",
        NS,
        "--configuration",
        "shared",
        "--canary",
        "2",
        "--max-parallel",
        "2",
        "--max-failures",
        "1",
        "--wait",
        "--timeout",
        "300",
    ]);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("bad rollout halted in {:.1} s", t.elapsed().as_secs_f64());
    assert_eq!(out.status.code(), Some(3), "{text}");
    assert!(
        text.contains("a01 restored (REVISION_RESTORED)")
            && text.contains("a02 restored (REVISION_RESTORED)"),
        "{text}"
    );
    let list = fleet.occ_json(&["rollout", "list", NS]);
    let halted_id = list[0]["id"].as_i64().unwrap();
    let halted = rollout(&fleet, halted_id);
    assert_eq!(halted["state"], "halted", "{halted}");
    let states = agent_states(&halted);
    for a in agents() {
        let (state, code) = &states[&a];
        if a == "a01" || a == "a02" {
            assert_eq!(
                (state.as_str(), code.as_str()),
                ("restored", "REVISION_RESTORED")
            );
            let s = fleet.status(&a).unwrap();
            assert_eq!(rev_num(s["activeRevisionId"].as_str()), Some(1), "{s}");
            assert_eq!(rev_num(s["servedRevisionId"].as_str()), Some(1), "{s}");
        } else {
            assert_eq!(
                (state.as_str(), code.as_str()),
                ("skipped", "ROLLOUT_HALTED")
            );
            let s = fleet.status(&a).unwrap();
            assert_eq!(s["revisions"].as_array().unwrap().len(), 1, "{a}: {s}");
            assert_eq!(rev_num(s["servedRevisionId"].as_str()), Some(1), "{s}");
            assert_eq!(pid(&fleet, &a), pids[&a], "{a}'s gateway was restarted");
        }
    }

    // A good generation, in waves of 3 after a canary of 1, 2 s apart.
    let v2 = write_doc(docs.path(), "v2", &document("v2", json!({})));
    fleet.occ_ok(&["configuration", "update", NS, "shared", "--file", &v2]);
    let since = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let good = fleet.occ_json(&[
        "rollout",
        "create",
        NS,
        "--configuration",
        "shared",
        "--canary",
        "1",
        "--max-parallel",
        "3",
        "--max-failures",
        "0",
        "--pause-between",
        "2",
    ]);
    let id = good["id"].as_i64().unwrap();
    assert_eq!(good["waves"], 5, "{good}");
    // An Agent of the open rollout refuses an ordinary deploy.
    let refused = fleet.occ(&["agent", "deploy", NS, "a12"]);
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("ROLLOUT_IN_PROGRESS"),
        "{refused:?}"
    );
    // Paused right away: the canary finishes, nothing else starts.
    fleet.occ_ok(&["rollout", "pause", NS, &id.to_string()]);
    std::thread::sleep(Duration::from_secs(4));
    let paused = rollout(&fleet, id);
    assert_eq!(paused["state"], "paused", "{paused}");
    let started = agent_states(&paused)
        .values()
        .filter(|(s, _)| s != "pending")
        .count();
    assert_eq!(started, 1, "{paused}");
    fleet.occ_ok(&["rollout", "resume", NS, &id.to_string()]);
    // Mid-rollout (wave 2 of 5 under way or pausing), the coordinator is SIGKILLed.
    wait_rollout(
        &fleet,
        id,
        |r| r["wave"].as_u64().unwrap_or(0) >= 2,
        Duration::from_secs(120),
    );
    fleet.kill_serve();
    fleet.start_serve();
    let done = wait_rollout(
        &fleet,
        id,
        |r| r["state"] != "running",
        Duration::from_secs(240),
    );
    assert_eq!(done["state"], "done", "{done}");
    for a in agents() {
        assert_eq!(agent_states(&done)[&a].0, "succeeded", "{done}");
        let s = fleet.status(&a).unwrap();
        // a01 and a02 had a failed candidate before; nobody got a revision twice.
        let expected = if a == "a01" || a == "a02" { 3 } else { 2 };
        let revs = s["revisions"].as_array().unwrap();
        assert_eq!(revs.len(), expected, "{a} deployed twice: {s}");
        let newest = revs.last().unwrap();
        assert_eq!(newest["configurationGeneration"], 3, "{s}");
        assert_eq!(s["servedRevisionId"], newest["id"], "{s}");
    }
    let (most, activations) = most_concurrent_activations(&fleet, since);
    eprintln!(
        "good rollout: {activations} activations on the hosts, at most {most} at once (maxParallel 3)"
    );
    assert!(
        activations >= 12,
        "the hosts' journals show {activations} activations"
    );
    assert!(
        most <= 3,
        "{most} activations ran at once; maxParallel is 3"
    );
    let audit = fleet.occ_json(&["audit", "--action", "rollout.done"]);
    assert_eq!(audit.as_array().unwrap().len(), 1, "{audit}");
}
