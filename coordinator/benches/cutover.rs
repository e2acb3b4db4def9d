//! Benchmark (not a timed test): revision-only cutovers on one real test host. One Agent is
//! deployed, then `CLAWFLEET_BENCH_CUTOVERS` (default 20) more revisions of it, each through
//! the API and the worker with `occ agent deploy --wait`; the figures are hostd's own: the
//! `elapsed_ms` it logs to the host's journal for every `activate-revision` (pointer flip,
//! restart, readiness wait, served record) and `prepare-revision`, printed as median and p90.
//!
//! `cargo bench -p clawfleet-coordinator --bench cutover` (root and the test-host
//! prerequisites; otherwise it prints `SKIP: ...` and exits 0).
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../tests/fleet_support/mod.rs"]
mod fleet;

use std::collections::BTreeMap;

use fleet::{Fleet, NS, document, journal_field};
use serde_json::{Value, json};

fn quantile(sorted: &[u64], q: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let i = ((sorted.len() - 1) as f64 * q).round() as usize;
    sorted[i]
}

fn main() {
    if let Some(reason) = clawfleet_vm_tests::skip_reason() {
        println!("SKIP: {reason}");
        return;
    }
    let n: usize = std::env::var("CLAWFLEET_BENCH_CUTOVERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|n| *n > 0)
        .unwrap_or(20);
    let fleet = Fleet::start(1);
    fleet.create_agent("c1", &document("c-v0", json!({})));
    fleet.occ_ok(&["agent", "deploy", NS, "c1", "--wait", "--timeout", "120"]);
    let since = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    for i in 1..=n {
        fleet.update_configuration("c1", &document(&format!("c-v{i}"), json!({})));
        fleet.occ_ok(&["agent", "deploy", NS, "c1", "--wait", "--timeout", "120"]);
    }
    let host = fleet.hosts.iter().next().unwrap();
    let text = host
        .run_ok(&format!(
            "journalctl -t hostd -o json --no-pager --since @{since}"
        ))
        .unwrap();
    let mut by_op: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for line in text.lines() {
        let Ok(e) = serde_json::from_str::<Value>(line) else {
            continue;
        };
        if journal_field(&e, "MESSAGE") != Some("operation succeeded") {
            continue;
        }
        let (Some(op), Some(ms)) = (
            journal_field(&e, "OP"),
            journal_field(&e, "ELAPSED_MS").and_then(|v| v.parse::<u64>().ok()),
        ) else {
            continue;
        };
        by_op.entry(op.to_owned()).or_default().push(ms);
    }
    println!("revision-only cutovers on one test host: {n} deploys, hostd's elapsed_ms");
    for (op, mut ms) in by_op {
        ms.sort_unstable();
        println!(
            "  {op:<18} n={:<3} median {:>4} ms  p90 {:>4} ms",
            ms.len(),
            quantile(&ms, 0.5),
            quantile(&ms, 0.9)
        );
    }
}
