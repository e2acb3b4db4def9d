//! Process-wide counters for `/metrics`: operation durations by operation kind and outcome (a
//! histogram with fixed buckets) and log reads by outcome. Label sets are fixed lists (kinds,
//! outcomes), never hosts or Agents, so the series do not grow with the fleet. Gauges that the
//! store knows (work, drift) are read at scrape time instead (`api/system.rs`).

use std::collections::BTreeMap;
use std::sync::{LazyLock, Mutex};
use std::time::Duration;

use clawfleet_protocol::operation::OperationKind;

/// Upper bounds of the duration buckets, in seconds.
pub const BUCKETS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
];

/// How a call ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Outcome {
    /// A result.
    Ok,
    /// The target answered with a failure.
    Failed,
    /// No answer (transport, key mismatch, refused login, unsupported).
    NoAnswer,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::Failed => "failed",
            Outcome::NoAnswer => "no-answer",
        }
    }
}

#[derive(Debug, Clone, Default)]
struct Histogram {
    /// Count per bucket (not cumulative), plus one for +Inf.
    buckets: Vec<u64>,
    sum: f64,
    count: u64,
}

#[derive(Debug, Default)]
struct Registry {
    operations: BTreeMap<(&'static str, Outcome), Histogram>,
    log_reads: BTreeMap<Outcome, u64>,
}

static REGISTRY: LazyLock<Mutex<Registry>> = LazyLock::new(Mutex::default);

fn with<T>(f: impl FnOnce(&mut Registry) -> T) -> T {
    let mut guard = REGISTRY.lock().unwrap_or_else(|p| p.into_inner());
    f(&mut guard)
}

/// Records one operation call.
pub fn operation(kind: OperationKind, outcome: Outcome, took: Duration) {
    let secs = took.as_secs_f64();
    with(|r| {
        let h = r.operations.entry((kind.as_str(), outcome)).or_default();
        if h.buckets.is_empty() {
            h.buckets = vec![0; BUCKETS.len() + 1];
        }
        let i = BUCKETS
            .iter()
            .position(|b| secs <= *b)
            .unwrap_or(BUCKETS.len());
        h.buckets[i] += 1;
        h.sum += secs;
        h.count += 1;
    });
}

/// Records one log read through the API.
pub fn log_read(outcome: Outcome) {
    with(|r| *r.log_reads.entry(outcome).or_default() += 1);
}

/// The counters in the Prometheus text format.
pub fn render() -> String {
    use std::fmt::Write;
    let mut out = String::new();
    with(|r| {
        let _ = writeln!(
            out,
            "# HELP clawfleet_operation_duration_seconds Host and cluster operations by kind and outcome."
        );
        let _ = writeln!(out, "# TYPE clawfleet_operation_duration_seconds histogram");
        for ((kind, outcome), h) in &r.operations {
            let labels = format!("kind=\"{kind}\",outcome=\"{}\"", outcome.as_str());
            let mut cumulative = 0;
            for (i, le) in BUCKETS.iter().enumerate() {
                cumulative += h.buckets[i];
                let _ = writeln!(
                    out,
                    "clawfleet_operation_duration_seconds_bucket{{{labels},le=\"{le}\"}} {cumulative}"
                );
            }
            let _ = writeln!(
                out,
                "clawfleet_operation_duration_seconds_bucket{{{labels},le=\"+Inf\"}} {}",
                h.count
            );
            let _ = writeln!(
                out,
                "clawfleet_operation_duration_seconds_sum{{{labels}}} {}",
                h.sum
            );
            let _ = writeln!(
                out,
                "clawfleet_operation_duration_seconds_count{{{labels}}} {}",
                h.count
            );
        }
        let _ = writeln!(
            out,
            "# HELP clawfleet_log_reads_total Agent log pages read through the API."
        );
        let _ = writeln!(out, "# TYPE clawfleet_log_reads_total counter");
        for (outcome, n) in &r.log_reads {
            let _ = writeln!(
                out,
                "clawfleet_log_reads_total{{outcome=\"{}\"}} {n}",
                outcome.as_str()
            );
        }
    });
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histograms_are_cumulative_and_labelled_by_kind_and_outcome_only() {
        operation(OperationKind::Probe, Outcome::Ok, Duration::from_millis(3));
        operation(
            OperationKind::Probe,
            Outcome::Ok,
            Duration::from_millis(300),
        );
        let text = render();
        assert!(text.contains(
            "clawfleet_operation_duration_seconds_bucket{kind=\"probe\",outcome=\"ok\",le=\"0.005\"} "
        ));
        let inf = text
            .lines()
            .find(|l| l.starts_with("clawfleet_operation_duration_seconds_bucket{kind=\"probe\",outcome=\"ok\",le=\"+Inf\"}"))
            .unwrap();
        let n: u64 = inf.rsplit(' ').next().unwrap().parse().unwrap();
        assert!(n >= 2);
    }
}
