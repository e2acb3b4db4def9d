//! Benchmark (not a timed test): revision-only cutovers on one real test host, on a fresh
//! host and then on the same host aged as by long use. One Agent is deployed, then
//! `CLAWFLEET_BENCH_CUTOVERS` (default 20) more revisions of it, each through the API and the
//! worker, the deployment status polled every 2 ms until it is served. Then the host is aged:
//! `CLAWFLEET_BENCH_AGED_AGENTS` (default 99, so the host runs 100, its enrolled limit) more
//! Agents deployed beside it and its journal
//! filled to its limit (10,000) with long-expired entries, its prune index removed as after
//! an upgrade; and the same number of cutovers again. For each case it prints the deploy
//! request -> served time a client sees (target ≤ 150 ms on both), hostd's own `elapsed_ms`
//! for every `activate-revision` (pointer flip, restart, readiness wait, served record) and
//! `prepare-revision`, and each activation cut into its parts from the host's journal: a
//! relaunch of the gateway inside its running unit (hostd/src/supervise.rs) or, where the
//! unit must start anew, a restart (the rows say which, and how many of each).
//!
//! The Agent has `CLAWFLEET_BENCH_SECRETS` (default 4, at most 4) secrets bound in its
//! configuration, as an Agent with model and channel credentials has: each start of its unit
//! writes them into its runtime directory (hostd/src/secrets.rs).
//!
//! `cargo bench -p clawfleet-coordinator --bench cutover` (root and the test-host
//! prerequisites; otherwise it prints `SKIP: ...` and exits 0).
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../../hostd/benches/aged_journal/mod.rs"]
mod aged_journal;
#[path = "../tests/fleet_support/mod.rs"]
mod fleet;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use fleet::{Fleet, NS, Want, document, journal_field, step_durations};
use serde_json::{Value, json};

/// The journal's limit (`[journal] max_entries`' default).
const AGED_JOURNAL: usize = 10_000;

fn quantile(sorted: &[u64], q: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let i = ((sorted.len() - 1) as f64 * q).round() as usize;
    sorted[i]
}

fn knob(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|n| *n > 0)
        .unwrap_or(default)
}

fn now_unix() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

fn main() {
    if let Some(reason) = clawfleet_vm_tests::skip_reason() {
        println!("SKIP: {reason}");
        return;
    }
    let n = knob("CLAWFLEET_BENCH_CUTOVERS", 20);
    let aged_agents = knob("CLAWFLEET_BENCH_AGED_AGENTS", 99);
    let secrets = knob("CLAWFLEET_BENCH_SECRETS", 4).min(SECRET_PATHS.len());
    let fleet = Fleet::start(1);
    let values = tempfile::tempdir().unwrap();
    for (i, _) in SECRET_PATHS.iter().enumerate().take(secrets) {
        let file = values.path().join(format!("s{i}"));
        std::fs::write(&file, format!("sk-bench-{i}-0123456789abcdef")).unwrap();
        fleet.occ_ok(&[
            "secret",
            "set",
            NS,
            &format!("cred-{i}"),
            "--from-file",
            &file.display().to_string(),
        ]);
    }
    println!("the Agent has {secrets} secrets bound in its configuration");
    fleet.create_agent("c1", &c1_document("c-v0", secrets));
    fleet.occ_ok(&["agent", "deploy", NS, "c1", "--wait", "--timeout", "120"]);
    cutovers(&fleet, 1..=n, secrets, "a fresh host");

    // The host aged: more Agents beside c1, then its journal at its limit.
    let t = Instant::now();
    let names: Vec<String> = (0..aged_agents).map(|i| format!("aged{i}")).collect();
    let mut wants = Vec::new();
    for name in &names {
        fleet.create_agent(name, &document(&format!("{name}-v0"), json!({})));
    }
    for name in &names {
        let rev = fleet.deploy_api(name);
        wants.push((
            name.as_str(),
            Want::Running {
                rev,
                label: format!("{name}-v0"),
            },
        ));
    }
    fleet.wait_converged(&wants, t, Duration::from_secs(900));
    let host = fleet.hosts.iter().next().unwrap();
    let filled = aged_journal::fill_journal(host, AGED_JOURNAL);
    println!(
        "\naged the host in {:.0} s (untimed): {aged_agents} more Agents served, {filled} expired \
         journal entries written (journal at {AGED_JOURNAL}), the prune index removed",
        t.elapsed().as_secs_f64()
    );
    cutovers(
        &fleet,
        n + 1..=2 * n,
        secrets,
        "the same host aged (long-lived)",
    );
}

/// Where the Agent's configuration refers to its secrets (channel credentials).
const SECRET_PATHS: [(&str, &str); 4] = [
    ("slack", "botToken"),
    ("slack", "appToken"),
    ("discord", "token"),
    ("telegram", "botToken"),
];

/// c1's document: `label`, and the first `secrets` of [`SECRET_PATHS`] bound to
/// `cred-<i>`.
fn c1_document(label: &str, secrets: usize) -> Value {
    let mut doc = document(label, json!({}));
    for (i, (channel, field)) in SECRET_PATHS.iter().enumerate().take(secrets) {
        doc["channels"][channel][field] =
            json!({"source": "file", "provider": "clawfleet", "id": format!("cred-{i}")});
    }
    doc
}

/// Deploys the revisions `range` of c1 one after another through the API, each until served,
/// and prints the case's figures.
fn cutovers(fleet: &Fleet, range: std::ops::RangeInclusive<usize>, secrets: usize, case: &str) {
    let since = now_unix();
    // Each deploy through the API, then deployment-status polled every 2 ms until the new
    // revision is active and served: deploy request -> served as a client sees it.
    let mut served_ms = Vec::new();
    for i in range {
        fleet.update_configuration("c1", &c1_document(&format!("c-v{i}"), secrets));
        let t = Instant::now();
        let rev = fleet.deploy_api("c1");
        loop {
            let s = fleet.status("c1").unwrap();
            if s["servedRevisionId"] == rev.as_str() && s["activeRevisionId"] == rev.as_str() {
                break;
            }
            assert!(t.elapsed().as_secs() < 120, "{rev} was never served: {s}");
            std::thread::sleep(Duration::from_millis(2));
        }
        served_ms.push(t.elapsed().as_millis() as u64);
    }
    served_ms.sort_unstable();
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
    println!(
        "\nrevision-only cutovers on {case}: {} deploys, hostd's elapsed_ms",
        served_ms.len()
    );
    for (op, mut ms) in by_op {
        ms.sort_unstable();
        println!(
            "  {op:<18} n={:<3} median {:>4} ms  p90 {:>4} ms",
            ms.len(),
            quantile(&ms, 0.5),
            quantile(&ms, 0.9)
        );
    }
    println!(
        "  deploy request -> served (API, status polled every 2 ms) n={:<3} median {:>4} ms  p90 {:>4} ms  (target <= 150 ms)",
        served_ms.len(),
        quantile(&served_ms, 0.5),
        quantile(&served_ms, 0.9)
    );
    let all = host
        .run_ok(&format!("journalctl -o json --no-pager --since @{since}"))
        .unwrap();
    breakdown(&all);
    launcher_memory(host);
}

/// What the launchers that stay beside each gateway (hostd/src/supervise.rs) cost: the
/// median of their RSS and of their private memory (what one more Agent adds; the binary's
/// text is shared), from `/proc/<pid>/smaps_rollup`.
fn launcher_memory(host: &clawfleet_vm_tests::TestHost) {
    let out = host
        .run_ok(
            "for p in $(pgrep -x hostd); do \
               if tr '\\0' ' ' < /proc/$p/cmdline | grep -q '^/usr/sbin/hostd exec-gateway --supervise '; then \
                 awk '/^Rss:/{r=$2} /^Private_Clean:/{c=$2} /^Private_Dirty:/{d=$2} END{print r, c+d}' /proc/$p/smaps_rollup; \
               fi; done",
        )
        .unwrap();
    let rows: Vec<(u64, u64)> = out
        .lines()
        .filter_map(|l| {
            let mut w = l.split_whitespace().map(|v| v.parse::<u64>().ok());
            Some((w.next()??, w.next()??))
        })
        .collect();
    if rows.is_empty() {
        println!("  launchers: none found");
        return;
    }
    let mut rss: Vec<u64> = rows.iter().map(|r| r.0).collect();
    let mut private: Vec<u64> = rows.iter().map(|r| r.1).collect();
    rss.sort_unstable();
    private.sort_unstable();
    println!(
        "  launchers that stay (one per running Agent): n={} median RSS {} kB, median private {} kB",
        rows.len(),
        quantile(&rss, 0.5),
        quantile(&private, 0.5)
    );
}

/// One journal entry: its time (µs since the epoch) and the fields the breakdown reads.
struct Entry {
    at: u64,
    message: String,
    /// `_SYSTEMD_UNIT` (the unit's own output) or `UNIT` (systemd's messages about it).
    unit: String,
    op: Option<String>,
    operation: Option<String>,
    /// hostd's step timeline on its success line (`verify@0.2 pointer-flip@1.0 …`, ms).
    steps: Option<String>,
    elapsed_us: Option<u64>,
    /// Readiness looks on hostd's "ready" line, and their costs (µs): systemd's state, the
    /// port's sockets, `/readyz`.
    polls: Option<u64>,
    look_costs: [Option<u64>; 3],
}

fn entries(text: &str) -> Vec<Entry> {
    text.lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .filter_map(|e| {
            Some(Entry {
                at: journal_field(&e, "__REALTIME_TIMESTAMP")?.parse().ok()?,
                message: journal_field(&e, "MESSAGE")?.to_owned(),
                unit: journal_field(&e, "UNIT")
                    .or_else(|| journal_field(&e, "_SYSTEMD_UNIT"))
                    .unwrap_or_default()
                    .to_owned(),
                op: journal_field(&e, "OP").map(str::to_owned),
                operation: journal_field(&e, "OPERATION_ID").map(str::to_owned),
                steps: journal_field(&e, "STEPS").map(str::to_owned),
                elapsed_us: journal_field(&e, "ELAPSED_US").and_then(|v| v.parse().ok()),
                polls: journal_field(&e, "POLLS").and_then(|v| v.parse().ok()),
                look_costs: ["STATE_US", "SOCKETS_US", "PROBE_US"]
                    .map(|f| journal_field(&e, f).and_then(|v| v.parse().ok())),
            })
        })
        .collect()
}

/// Each `activate-revision` cut into its parts from the host's journal: hostd's entries, the
/// Agent unit's systemd messages and the test gateway's "listening" line (which carries the
/// gateway's own time from `main` to listening, `start_us`). The overhead is everything but
/// that own start: what clawfleet, systemd and the sandbox add to a cutover.
fn breakdown(text: &str) {
    fn add(parts: &mut BTreeMap<&'static str, Vec<u64>>, part: &'static str, ms: u64) {
        parts.entry(part).or_default().push(ms);
    }
    let entries = entries(text);
    let first_after = |from: u64, to: u64, f: &dyn Fn(&Entry) -> bool| {
        entries
            .iter()
            .find(|e| e.at >= from && e.at <= to && f(e))
            .map(|e| e.at)
    };
    let agent_unit = |e: &Entry| e.unit.starts_with("clawfleet-agent-");
    let mut parts: BTreeMap<&str, Vec<u64>> = BTreeMap::new();
    let mut hostd_steps: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for received in entries.iter().filter(|e| {
        e.message == "operation received" && e.op.as_deref() == Some("activate-revision")
    }) {
        let Some(id) = &received.operation else {
            continue;
        };
        let Some(done) = entries
            .iter()
            .find(|e| e.operation.as_ref() == Some(id) && e.message == "operation succeeded")
        else {
            continue;
        };
        let (t0, t9) = (received.at, done.at);
        // hostd's own account: each step from its start to the next one's (µs → ms).
        if let (Some(steps), Some(total_us)) = (&done.steps, done.elapsed_us) {
            for (i, (name, us)) in step_durations(steps, total_us).into_iter().enumerate() {
                hostd_steps
                    .entry(format!("hostd step {i} {name}"))
                    .or_default()
                    .push(us);
            }
        }
        if let Some(ready) = entries
            .iter()
            .find(|e| e.operation.as_ref() == Some(id) && e.message == "ready")
        {
            if let Some(polls) = ready.polls {
                hostd_steps
                    .entry("readiness looks (count, not ms)".to_owned())
                    .or_default()
                    .push(polls * 1000);
            }
            for (name, us) in [
                "asking systemd",
                "reading the port's sockets",
                "asking /readyz",
            ]
            .iter()
            .zip(ready.look_costs)
            {
                if let Some(us) = us {
                    hostd_steps
                        .entry(format!("readiness, in all: {name}"))
                        .or_default()
                        .push(us);
                }
            }
        }
        let listening = entries.iter().find(|e| {
            e.at >= t0 && e.at <= t9 && agent_unit(e) && e.message.contains("listening on")
        });
        let Some(listening) = listening else {
            continue;
        };
        let own_us: u64 = listening
            .message
            .split("start_us=")
            .nth(1)
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0);
        let ms = |a: u64, b: u64| b.saturating_sub(a) / 1000;
        // In place (hostd/src/supervise.rs): hostd asks, the launcher stops the old gateway,
        // hostd writes the new configuration and asks for the start, the launcher writes its
        // relaunch line and starts the new one, within the running unit.
        let asked = entries
            .iter()
            .find(|e| {
                e.operation.as_ref() == Some(id) && e.message == "relaunching the gateway in place"
            })
            .map(|e| e.at);
        let relaunched = first_after(t0, t9, &|e| {
            agent_unit(e)
                && e.message
                    .contains("exec-gateway: relaunching the gateway in place")
        });
        // A restart: systemd's stop and start jobs around a new unit run.
        let stopping = first_after(t0, t9, &|e| {
            agent_unit(e) && e.message.starts_with("Stopping")
        });
        let stopped = first_after(t0, t9, &|e| {
            agent_unit(e) && e.message.starts_with("Stopped")
        });
        let started = first_after(t0, t9, &|e| {
            agent_unit(e) && e.message.starts_with("Started")
        });
        let issued = if let (Some(asked), Some(relaunched)) = (asked, relaunched) {
            add(
                &mut parts,
                "2r old gateway stopped, configuration written, start asked (in place)",
                ms(asked, relaunched),
            );
            add(
                &mut parts,
                "4r the new gateway spawned, started, listening (in place)",
                ms(relaunched, listening.at),
            );
            asked
        } else if let (Some(stopping), Some(stopped), Some(started)) = (stopping, stopped, started)
        {
            add(
                &mut parts,
                "2 systemd: old gateway stopped (restart)",
                ms(stopping, stopped),
            );
            add(
                &mut parts,
                "3 systemd: new process started (fork) (restart)",
                ms(stopped, started),
            );
            add(
                &mut parts,
                "4 exec, sandbox set-up and gateway start, to listening (restart)",
                ms(started, listening.at),
            );
            stopping
        } else {
            continue;
        };
        add(
            &mut parts,
            "1 hostd: received -> relaunch or restart asked (verify, hooks, pointer flip)",
            ms(t0, issued),
        );
        add(
            &mut parts,
            "5 hostd: listening -> answered (readiness seen, served record)",
            ms(listening.at, t9),
        );
        add(
            &mut parts,
            "6 the gateway's own start (main -> listening)",
            own_us / 1000,
        );
        add(&mut parts, "7 total (received -> answered)", ms(t0, t9));
        add(
            &mut parts,
            "8 overhead: total minus the gateway's own start",
            ms(t0, t9).saturating_sub(own_us / 1000),
        );
    }
    if parts.is_empty() {
        println!("cutover breakdown: no activation with all its journal entries found");
        return;
    }
    println!(
        "cutover breakdown from the host's journal (medians / p90, ms; target: overhead <= 50 ms)"
    );
    for (part, mut ms) in parts {
        ms.sort_unstable();
        println!(
            "  {part:<64} n={:<3} median {:>4}  p90 {:>4}",
            ms.len(),
            quantile(&ms, 0.5),
            quantile(&ms, 0.9)
        );
    }
    println!("hostd's own timeline of each activation (its success line; medians / p90, ms)");
    for (step, mut us) in hostd_steps {
        us.sort_unstable();
        let ms = |v: u64| v as f64 / 1000.0;
        println!(
            "  {step:<64} n={:<3} median {:>6.1}  p90 {:>6.1}",
            us.len(),
            ms(quantile(&us, 0.5)),
            ms(quantile(&us, 0.9))
        );
    }
}
