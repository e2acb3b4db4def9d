//! Benchmark (not a timed test): wall time to deploy 30 Agents across three real test hosts,
//! from the first deploy request until all 30 are converged as the coordinator's API reports
//! them, and the per-Agent median time from its deploy request to convergence. Everything
//! really goes HTTP API → worker → SSH (one persistent russh connection per host) → hostd →
//! systemd, with the test gateway as the workload.
//!
//! `cargo bench -p clawfleet-coordinator --bench fleet` (root and the test-host prerequisites;
//! otherwise it prints `SKIP: ...` and exits 0). `CLAWFLEET_BENCH_AGENTS` changes the count.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../tests/fleet_support/mod.rs"]
mod fleet;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use fleet::{Fleet, Model, Want, document, median};
use serde_json::json;

fn secs(d: Duration) -> String {
    format!("{:.2} s", d.as_secs_f64())
}

fn main() {
    if let Some(reason) = clawfleet_vm_tests::skip_reason() {
        println!("SKIP: {reason}");
        return;
    }
    let count: usize = std::env::var("CLAWFLEET_BENCH_AGENTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|n| *n > 0)
        .unwrap_or(30);
    let setup = Instant::now();
    let fleet = Fleet::start(3);
    let agents: Vec<String> = (0..count).map(|i| format!("b{i:03}")).collect();
    for a in &agents {
        fleet.create_agent(a, &document(&format!("{a}-v1"), json!({})));
    }
    let setup = setup.elapsed();

    // Timed: the deploy requests, then polling deployment-status until all converged.
    let t0 = Instant::now();
    let mut sent: BTreeMap<String, Duration> = BTreeMap::new();
    let mut wants: Vec<(&str, Want)> = Vec::new();
    let mut model = Model::new();
    for a in &agents {
        let at = t0.elapsed();
        let rev = fleet.deploy_api(a);
        sent.insert(a.clone(), at);
        let want = Want::Running {
            rev,
            label: format!("{a}-v1"),
        };
        model.insert(a.clone(), want.clone());
        wants.push((a.as_str(), want));
    }
    let requests = t0.elapsed();
    let converged = fleet.wait_converged(&wants, t0, Duration::from_secs(900));
    let wall = converged.values().max().copied().unwrap_or_default();
    let per_agent: Vec<Duration> = converged
        .iter()
        .map(|(a, at)| at.saturating_sub(sent[a]))
        .collect();
    let mut sorted = per_agent.clone();
    sorted.sort();
    let p90 = sorted[(sorted.len() * 9 / 10).min(sorted.len() - 1)];

    // Not timed: the hosts really run what the coordinator says.
    let per_host = fleet.check_hosts(&model, true);
    let placement = per_host
        .iter()
        .map(|(h, n)| format!("{h} {n}"))
        .collect::<Vec<_>>()
        .join(", ");

    let rows = [
        ("Agents / hosts", format!("{count} / {}", per_host.len())),
        ("placement (Agents per host)", placement),
        (
            "setup, untimed (cargo build if stale, hosts, hostd, enrol, Agents)",
            secs(setup),
        ),
        ("deploy requests sent (POST .../deploy x N)", secs(requests)),
        (
            "WALL TIME: first deploy request -> all converged",
            secs(wall),
        ),
        (
            "per-Agent time to converge (own request -> converged), MEDIAN",
            secs(median(&per_agent)),
        ),
        ("per-Agent time to converge, p90", secs(p90)),
        (
            "per-Agent time to converge, min / max",
            format!("{} / {}", secs(sorted[0]), secs(sorted[sorted.len() - 1])),
        ),
        (
            "throughput",
            format!(
                "{:.2} Agents/s",
                count as f64 / wall.as_secs_f64().max(1e-9)
            ),
        ),
    ];
    let width = rows.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
    println!();
    println!(
        "fleet bench: deploy {count} Agents across 3 test hosts (HTTP API -> worker -> SSH -> hostd -> systemd, test gateway)"
    );
    println!("{:-<w$}-+-{:-<24}", "", "", w = width);
    println!("{:<w$} | value", "metric", w = width);
    println!("{:-<w$}-+-{:-<24}", "", "", w = width);
    for (k, v) in rows {
        println!("{k:<width$} | {v}");
    }
    println!("{:-<w$}-+-{:-<24}", "", "", w = width);
    println!(
        "converged = deployment-status says converged with active = served = the new revision; \
         polled every ~100 ms (plus one pass over the open Agents), so times are upper bounds \
         within about 0.2 s."
    );
}
