//! Pod logs through the API server. kwok runs its kubelet-like server on 127.0.0.1 (TLS, with a
//! certificate from the run's CA), the kwok Node advertises 127.0.0.1 and that port, and a
//! static `ClusterLogs` (kwok.x-k8s.io/v1alpha1, given to kwok with `--config`) points every
//! container of every Pod in every namespace at one current and one previous log file per
//! control plane. kwok reads those files with the kubelet's own CRI log reader
//! (`k8s.io/cri-client/pkg/logs`), so they hold CRI log lines:
//!
//! ```text
//! 2026-12-01T10:00:00.123456789Z stdout F the line's text
//! ```
//!
//! and `tailLines`, `timestamps`, `sinceSeconds`, `sinceTime` and `limitBytes` behave as with a
//! kubelet (the timestamps are the ones written in the file).

use std::io::Write;
use std::path::Path;
use std::time::SystemTime;

use k8s_openapi::jiff::Timestamp;

use crate::error::{Error, Result};

/// Which stream a container's log line came from. Both are served (a Pod log request without
/// `stream` returns both, interleaved in file order).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogStream {
    Stdout,
    Stderr,
}

impl LogStream {
    fn as_str(self) -> &'static str {
        match self {
            LogStream::Stdout => "stdout",
            LogStream::Stderr => "stderr",
        }
    }
}

/// The timestamp the way the kubelet writes it in front of a line for `timestamps=true`
/// (RFC 3339, UTC, always 9 fractional digits: `2026-12-01T10:00:00.123456789Z`). kwok answers
/// with exactly this prefix for a line written with [`cri_log_line`] at `at`.
pub fn log_timestamp(at: SystemTime) -> String {
    let ts = Timestamp::try_from(at).unwrap_or(Timestamp::UNIX_EPOCH);
    format!("{ts:.9}")
}

/// `text` as CRI log lines at `at` on `stream`: one full (`F`) record per line of `text`, each
/// ending in `\n`. An empty `text` gives one empty line.
pub fn cri_log_line(at: SystemTime, stream: LogStream, text: &str) -> String {
    let ts = log_timestamp(at);
    let mut out = String::new();
    let text = text.strip_suffix('\n').unwrap_or(text);
    for line in text.split('\n') {
        out.push_str(&format!("{ts} {} F {line}\n", stream.as_str()));
    }
    out
}

/// Appends `lines` (each on stdout, stamped `at`) to a CRI log file in one write.
pub(crate) fn append(path: &Path, at: SystemTime, stream: LogStream, lines: &[&str]) -> Result<()> {
    let text: String = lines.iter().map(|l| cri_log_line(at, stream, l)).collect();
    append_raw(path, &text)
}

/// Appends text that is already CRI log lines.
pub(crate) fn append_raw(path: &Path, text: &str) -> Result<()> {
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(path)
        .map_err(|e| Error::io("open the pod log file", path, e))?;
    f.write_all(text.as_bytes())
        .map_err(|e| Error::io("append to the pod log file", path, e))
}

/// kwok's configuration document: a `ClusterLogs` with no selector (every Pod in every
/// namespace) and one log entry with no container names (the default for every container).
pub(crate) fn cluster_logs_config(current: &Path, previous: &Path) -> String {
    let doc = serde_json::json!({
        "apiVersion": "kwok.x-k8s.io/v1alpha1",
        "kind": "ClusterLogs",
        "metadata": { "name": "clawfleet-pod-logs" },
        "spec": {
            "logs": [{
                "logsFile": current,
                "previousLogsFile": previous,
                "follow": false,
            }],
        },
    });
    // JSON is YAML, and kwok's --config reader takes YAML documents.
    format!("{doc:#}\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn lines_are_cri_format_with_fixed_nanoseconds() {
        let at = SystemTime::UNIX_EPOCH + Duration::new(1_800_000_000, 5_000);
        assert_eq!(log_timestamp(at), "2027-01-15T08:00:00.000005000Z");
        assert_eq!(
            cri_log_line(at, LogStream::Stdout, "hello world"),
            "2027-01-15T08:00:00.000005000Z stdout F hello world\n"
        );
        assert_eq!(
            cri_log_line(at, LogStream::Stderr, "a\nb\n"),
            "2027-01-15T08:00:00.000005000Z stderr F a\n2027-01-15T08:00:00.000005000Z stderr F b\n"
        );
        let whole = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        assert_eq!(log_timestamp(whole), "2027-01-15T08:00:00.000000000Z");
    }

    #[test]
    fn the_cluster_logs_config_names_both_files() {
        let c = cluster_logs_config(Path::new("/r/current.log"), Path::new("/r/previous.log"));
        let v: serde_json::Value = serde_json::from_str(&c).unwrap();
        assert_eq!(v["kind"], "ClusterLogs");
        assert_eq!(v["spec"]["logs"][0]["logsFile"], "/r/current.log");
        assert_eq!(v["spec"]["logs"][0]["previousLogsFile"], "/r/previous.log");
        assert!(v["spec"].get("selector").is_none());
        assert!(v["spec"]["logs"][0].get("containers").is_none());
    }
}
