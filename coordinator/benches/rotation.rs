//! Benchmark (not a timed test): rotating one secret bound to 6 Agents on 3 real test hosts
//! with `occ secret rotate` (issue 29's target). Each round writes a new version and rolls it
//! out: a canary, then the other five in one wave (`--max-parallel 5`). The rollout is read
//! every 20 ms over the API; an Agent counts as applied when the rollout marks it succeeded
//! (the worker saw hostd activate the revision, and hostd saw the gateway reload its secrets
//! and hold the new fingerprints). After each round every gateway's own report is checked to
//! hold the new fingerprint. Throughout, 20 authenticated WebSocket clients per Agent are
//! connected to its gateway (`clawfleet-test-gateway hold` on the Agent's host, as a transient
//! unit). It prints, per wave, the time from the rotate request to the wave's last Agent
//! applied (p50, p95, max over the rounds), how many gateways restarted over all rounds (by
//! MainPID), and how many of the WebSocket clients were disconnected.
//!
//! `cargo bench -p clawfleet-coordinator --bench rotation` (root and the test-host
//! prerequisites; otherwise it prints `SKIP: ...` and exits 0). `CLAWFLEET_BENCH_ROTATIONS`
//! sets the rounds (default 10).
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../tests/fleet_support/mod.rs"]
mod fleet;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use clawfleet_protocol::sealed::SecretFingerprint;
use fleet::{Fleet, NS, Want, document};
use serde_json::{Value, json};

const SECRET: &str = "bench-key";
const AGENTS: [&str; 6] = ["r1", "r2", "r3", "r4", "r5", "r6"];

fn quantile(sorted: &[u64], q: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let i = ((sorted.len() - 1) as f64 * q).round() as usize;
    sorted[i]
}

/// Authenticated WebSocket clients held on each gateway through the rounds.
const WS_CLIENTS: u32 = 20;
/// Its existence ends the WebSocket clients on a host.
const STOP_FILE: &str = "/run/cf-bench-ws-stop";

fn id(s: &str) -> clawfleet_protocol::Ident {
    clawfleet_protocol::Ident::new(s).unwrap()
}

fn layout() -> hostd::layout::Layout {
    hostd::layout::Layout::new("/var/lib/clawfleet", "/etc/systemd/system")
}

fn unit_name(agent: &str) -> String {
    layout().agent(&id(NS), &id(agent)).unit_name
}

/// Each Agent's host name and port, from the API.
fn placement(fleet: &Fleet) -> BTreeMap<String, (String, u64)> {
    fleet
        .api_agents()
        .into_iter()
        .map(|(a, v)| {
            let host = v["host"].as_str().unwrap().to_owned();
            let port = v["port"].as_u64().unwrap();
            (a, (host, port))
        })
        .collect()
}

fn main_pid(fleet: &Fleet, host: &str, agent: &str) -> u32 {
    fleet
        .host(host)
        .run_ok(&format!(
            "systemctl show -p MainPID --value {}",
            unit_name(agent)
        ))
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

/// The fingerprint the Agent's gateway reports holding for the secret.
fn held(fleet: &Fleet, host: &str, port: u64) -> String {
    let out = fleet
        .host(host)
        .run_ok(&format!("curl -sf http://127.0.0.1:{port}/secrets"))
        .unwrap();
    let doc: Value = serde_json::from_str(&out).unwrap();
    doc["providers"][format!("clawfleet-{SECRET}")]["fingerprint"]
        .as_str()
        .unwrap_or("")
        .to_owned()
}

fn main() {
    if let Some(reason) = clawfleet_vm_tests::skip_reason() {
        println!("SKIP: {reason}");
        return;
    }
    let rounds: usize = std::env::var("CLAWFLEET_BENCH_ROTATIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|n| *n > 0)
        .unwrap_or(10);
    let fleet = Fleet::start(3);
    let local = tempfile::tempdir().unwrap();
    let value_file = |v: &str| {
        let p = local.path().join("value");
        std::fs::write(&p, v).unwrap();
        p.display().to_string()
    };
    fleet.occ_ok(&[
        "secret",
        "set",
        NS,
        SECRET,
        "--from-file",
        &value_file("bench-rotation-0"),
    ]);
    let mut doc = document("rot", json!({}));
    doc["channels"] = json!({"slack": {"botToken":
        {"source": "file", "provider": "clawfleet", "id": SECRET}}});
    let mut want = Vec::new();
    for a in AGENTS {
        fleet.create_agent(a, &doc);
        let rev = fleet.deploy(a);
        want.push((
            a,
            Want::Running {
                rev,
                label: "rot".into(),
            },
        ));
    }
    fleet.wait_converged(&want, Instant::now(), Duration::from_secs(180));
    let placed = placement(&fleet);
    let hosts: std::collections::BTreeSet<&str> =
        placed.values().map(|(h, _)| h.as_str()).collect();
    let pids: BTreeMap<&str, u32> = AGENTS
        .iter()
        .map(|a| (*a, main_pid(&fleet, &placed[*a].0, a)))
        .collect();
    // The WebSocket clients, one transient unit per Agent on its host, held until the stop
    // file appears (at most an hour).
    for a in AGENTS {
        let (host, port) = &placed[a];
        let password_file = layout().agent(&id(NS), &id(a)).password_file;
        fleet
            .host(host)
            .run_ok(&format!(
                "rm -f {STOP_FILE} && systemd-run --quiet --collect --unit={unit} \
                 --property=StandardOutput=file:/run/{unit}.json \
                 {gateway} hold {port} {pw} {WS_CLIENTS} {STOP_FILE} 3600",
                unit = ws_unit(a),
                gateway = clawfleet_vm_tests::TEST_GATEWAY_REMOTE_PATH,
                pw = password_file.display(),
            ))
            .unwrap();
    }
    // Connected before the first rotation: each unit prints nothing until it stops, so wait
    // for the gateway to count the connections instead.
    std::thread::sleep(Duration::from_secs(3));
    for a in AGENTS {
        let host = &placed[a].0;
        let state = fleet
            .host(host)
            .run_ok(&format!("systemctl is-active {} || true", ws_unit(a)))
            .unwrap();
        assert_eq!(
            state.trim(),
            "active",
            "the WebSocket clients of {a} are not running"
        );
    }
    println!(
        "rotation: 1 secret bound to {} Agents on {} hosts, {rounds} rounds, canary 1 then a wave of 5",
        AGENTS.len(),
        hosts.len()
    );

    let mut canary_ms = Vec::new();
    let mut wave_ms = Vec::new();
    let mut agent_ms = Vec::new();
    for round in 1..=rounds {
        let value = format!("bench-rotation-{round}-{}", std::process::id());
        let file = value_file(&value);
        let t0 = Instant::now();
        let started = fleet.occ_json(&[
            "secret",
            "rotate",
            NS,
            SECRET,
            "--from-file",
            &file,
            "--canary",
            "1",
            "--max-parallel",
            "5",
        ]);
        let id = started["rollout"]["id"]
            .as_i64()
            .unwrap_or_else(|| panic!("no rollout: {started}"));
        let mut applied: BTreeMap<String, (u64, u64)> = BTreeMap::new();
        loop {
            let r = fleet
                .api
                .request("GET", &format!("/namespaces/{NS}/rollouts/{id}"), None)
                .unwrap();
            for a in r["agents"].as_array().unwrap() {
                let agent = a["agentId"].as_str().unwrap().to_owned();
                if a["state"] == "succeeded" && !applied.contains_key(&agent) {
                    let wave = a["wave"].as_u64().unwrap();
                    applied.insert(agent, (wave, t0.elapsed().as_millis() as u64));
                }
            }
            match r["state"].as_str() {
                Some("done") => break,
                Some("running") => {}
                other => panic!("round {round}: rollout {id} is {other:?}: {r}"),
            }
            assert!(
                t0.elapsed() < Duration::from_secs(300),
                "round {round}: rollout {id} not done: {r}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        assert_eq!(applied.len(), AGENTS.len(), "round {round}: {applied:?}");
        let fp = SecretFingerprint::of(value.as_bytes()).as_str().to_owned();
        for (a, (host, port)) in &placed {
            assert_eq!(held(&fleet, host, *port), fp, "round {round}: {a}");
        }
        let canary = applied
            .values()
            .filter(|(w, _)| *w == 0)
            .map(|(_, t)| *t)
            .max()
            .unwrap();
        let last = applied.values().map(|(_, t)| *t).max().unwrap();
        canary_ms.push(canary);
        wave_ms.push(last - canary);
        agent_ms.extend(applied.values().map(|(_, t)| *t));
        println!(
            "round {round:>2}: canary applied at {canary} ms, the wave of 5 {} ms after it",
            last - canary
        );
    }
    let restarted = AGENTS
        .iter()
        .filter(|a| main_pid(&fleet, &placed[**a].0, a) != pids[**a])
        .count();
    // Stop the clients and read what each unit saw.
    let mut connected = 0;
    let mut disconnected = 0;
    for host in &hosts {
        fleet
            .host(host)
            .run_ok(&format!("touch {STOP_FILE}"))
            .unwrap();
    }
    for a in AGENTS {
        let host = fleet.host(&placed[a].0);
        let unit = ws_unit(a);
        let mut report = String::new();
        for _ in 0..100 {
            report = host
                .run_ok(&format!("cat /run/{unit}.json 2>/dev/null || true"))
                .unwrap();
            if !report.trim().is_empty() {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let r: Value = serde_json::from_str(report.trim())
            .unwrap_or_else(|e| panic!("the WebSocket clients of {a} reported {report:?}: {e}"));
        connected += r["connected"].as_u64().unwrap();
        disconnected += r["disconnected"].as_u64().unwrap();
        host.run_ok(&format!("rm -f /run/{unit}.json")).unwrap();
    }
    for v in [&mut canary_ms, &mut wave_ms, &mut agent_ms] {
        v.sort_unstable();
    }
    println!();
    println!("{:<44} {:>8} {:>8} {:>8}", "", "p50 ms", "p95 ms", "max ms");
    for (name, v) in [
        ("canary wave: rotate -> applied and verified", &canary_ms),
        ("second wave (5 Agents): canary -> last", &wave_ms),
        ("any Agent: rotate -> applied", &agent_ms),
    ] {
        println!(
            "{name:<44} {:>8} {:>8} {:>8}",
            quantile(v, 0.5),
            quantile(v, 0.95),
            v.last().copied().unwrap_or(0)
        );
    }
    println!(
        "gateway restarts over {rounds} rounds: {restarted} of {} (MainPID changed)",
        AGENTS.len()
    );
    println!(
        "WebSocket clients: {connected} connected ({WS_CLIENTS} per Agent), {disconnected} disconnected"
    );
}

/// The transient unit holding an Agent's WebSocket clients.
fn ws_unit(agent: &str) -> String {
    format!("cf-bench-ws-{agent}")
}
