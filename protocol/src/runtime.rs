//! Read-only runtime inspection, the same for hosts and clusters: `agent-runtime` (what the
//! Agent's unit or Pod is doing now) and `agent-logs` (one bounded, redacted page of its log).
//! Neither takes a host lock or changes anything; hostd does not journal them.

use serde::{Deserialize, Deserializer, Serialize};

use crate::operation::{AgentRef, NamespaceRef};
use crate::result::AgentObservation;

/// Most log entries in one page.
pub const MAX_PAGE_LINES: u32 = 1000;
/// Most bytes of one page: the JSON encoding of its entries, summed.
pub const MAX_PAGE_BYTES: usize = 512 * 1024;
/// Longest message of one entry, in characters; a longer one is cut and marked with `…`.
pub const MAX_ENTRY_CHARS: usize = 16 * 1024;
/// Most recent lines `agent-runtime` may include as evidence.
pub const MAX_EVIDENCE_LINES: u32 = 50;
/// Longest log cursor.
pub const MAX_CURSOR_LEN: usize = 512;

/// A count of log lines: 1 to [`MAX_PAGE_LINES`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct PageLines(u32);

impl PageLines {
    /// Checks and wraps a line count.
    pub fn new(value: u32) -> Result<Self, String> {
        if value == 0 || value > MAX_PAGE_LINES {
            return Err(format!(
                "must be between 1 and {MAX_PAGE_LINES} lines, got {value}"
            ));
        }
        Ok(Self(value))
    }

    /// The most a page may hold.
    pub fn max() -> Self {
        Self(MAX_PAGE_LINES)
    }

    /// The count.
    pub fn get(self) -> u32 {
        self.0
    }
}

impl<'de> Deserialize<'de> for PageLines {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        PageLines::new(u32::deserialize(deserializer)?).map_err(serde::de::Error::custom)
    }
}

/// Where a log page continues from: a journald cursor on hosts, the backend's own position on
/// clusters. Opaque to the coordinator; 1 to 512 printable ASCII characters without spaces.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LogCursor(String);

impl LogCursor {
    /// Checks and wraps a cursor.
    pub fn new(value: impl Into<String>) -> Result<Self, String> {
        let value = value.into();
        if value.is_empty() || value.len() > MAX_CURSOR_LEN {
            return Err(format!(
                "a log cursor must be 1 to {MAX_CURSOR_LEN} characters, got {}",
                value.len()
            ));
        }
        if !value.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(
                "a log cursor may hold only printable ASCII characters without spaces".to_owned(),
            );
        }
        Ok(Self(value))
    }

    /// The cursor text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl<'de> Deserialize<'de> for LogCursor {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        LogCursor::new(String::deserialize(deserializer)?).map_err(serde::de::Error::custom)
    }
}

/// Arguments of `agent-runtime`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RuntimeArgs {
    pub namespace: NamespaceRef,
    pub agent: AgentRef,
    /// How many of the newest log lines to include (0 to [`MAX_EVIDENCE_LINES`]), for failure
    /// evidence.
    #[serde(default, deserialize_with = "evidence_lines")]
    pub evidence_lines: u32,
}

fn evidence_lines<'de, D: Deserializer<'de>>(deserializer: D) -> Result<u32, D::Error> {
    let n = u32::deserialize(deserializer)?;
    if n > MAX_EVIDENCE_LINES {
        return Err(serde::de::Error::custom(format!(
            "must be at most {MAX_EVIDENCE_LINES}, got {n}"
        )));
    }
    Ok(n)
}

/// Where a log page starts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "from", rename_all = "kebab-case", deny_unknown_fields)]
pub enum LogStart {
    /// The newest `lines` entries (optionally not older than `sinceUnix`).
    #[serde(rename_all = "camelCase")]
    Tail {
        lines: PageLines,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        since_unix: Option<u64>,
    },
    /// The oldest entries from `sinceUnix` (Unix seconds) on.
    #[serde(rename_all = "camelCase")]
    Since { since_unix: u64 },
    /// The entries after the one a previous page ended with.
    #[serde(rename_all = "camelCase")]
    After { cursor: LogCursor },
}

/// Arguments of `agent-logs`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LogsArgs {
    pub namespace: NamespaceRef,
    pub agent: AgentRef,
    pub start: LogStart,
    /// The run before the current one (the unit's previous invocation, the Pod's previous
    /// container), instead of all runs.
    #[serde(default)]
    pub previous: bool,
    /// Most entries in the page.
    pub limit: PageLines,
}

/// What kind of workload runs the Agent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum WorkloadKind {
    SystemdUnit,
    Pod,
}

/// How the last run ended: systemd's `ExecMainCode` (exited, killed, dumped), a container's
/// termination.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ExitKind {
    Exited,
    Killed,
    Dumped,
}

/// The last exit of the Agent's main process.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LastExit {
    pub kind: ExitKind,
    /// The exit status (`exited`) or the signal number (`killed`, `dumped`).
    pub status: i32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at: Option<String>,
    /// systemd's `Result` (`exit-code`, `signal`, `timeout`, …) or the container's reason.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// The Agent's unit or Pod as it runs now.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Workload {
    pub kind: WorkloadKind,
    pub name: String,
    /// `ActiveState` of the unit; the Pod's phase.
    pub active_state: String,
    /// `SubState` of the unit; the container's state or waiting reason.
    pub sub_state: String,
    pub restarts: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub main_pid: Option<u32>,
    /// The uid the main process runs as (from /proc), to compare with the Agent's account.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub main_uid: Option<u32>,
    /// When the current run started, RFC 3339 UTC.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_exit: Option<LastExit>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_current_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_peak_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_usage_nanos: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tasks_current: Option<u64>,
    /// systemd's `InvocationID` of the current run; the container id on a cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub invocation_id: Option<String>,
}

/// An event about the workload (Kubernetes events; hosts have none).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RuntimeEvent {
    pub at: String,
    /// `Normal` or `Warning`.
    pub kind: String,
    pub reason: String,
    pub message: String,
    pub count: u32,
}

/// Which part wrote a log entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LogSource {
    /// The gateway process itself.
    Gateway,
    /// The supervisor about the gateway: systemd (exit status, restarts) or the kubelet.
    Supervisor,
}

/// One log entry, redacted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LogEntry {
    /// RFC 3339 UTC with the source's precision (microseconds from journald).
    pub at: String,
    pub source: LogSource,
    pub message: String,
}

impl LogEntry {
    /// The bytes this entry adds to a page (its JSON encoding).
    pub fn page_bytes(&self) -> usize {
        serde_json::to_vec(self)
            .map(|v| v.len())
            .unwrap_or(usize::MAX)
            + 1
    }
}

/// What `agent-runtime` reports.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RuntimeReport {
    pub observation: AgentObservation,
    /// `None` when no unit is loaded (or no Deployment exists).
    pub workload: Option<Workload>,
    /// The uid of the Agent's account (hosts).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub account_uid: Option<u32>,
    #[serde(default)]
    pub events: Vec<RuntimeEvent>,
    /// The newest log lines, when asked for (`evidenceLines`).
    #[serde(default)]
    pub recent_lines: Vec<LogEntry>,
}

/// One page of an Agent's log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LogPage {
    pub entries: Vec<LogEntry>,
    /// Where the next page starts (after the last entry here); the same cursor as given when
    /// nothing new was found, `None` when the log is empty.
    pub cursor: Option<LogCursor>,
    /// True when the page stopped at a limit (lines or bytes) with entries left.
    pub more: bool,
    /// How many values were redacted in this page.
    pub redactions: u32,
    /// The run the page is of, when `previous` was asked for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub invocation_id: Option<String>,
}

/// Collects entries into a page within [`MAX_PAGE_LINES`], [`MAX_PAGE_BYTES`] and the
/// request's limit. In tail mode it keeps the newest entries that fit, otherwise the oldest.
#[derive(Debug)]
pub struct PageBuilder {
    entries: std::collections::VecDeque<(LogEntry, Option<LogCursor>)>,
    bytes: usize,
    limit: usize,
    tail: bool,
    more: bool,
    redactions: u32,
    last_cursor: Option<LogCursor>,
}

impl PageBuilder {
    /// A page of at most `limit` entries; `tail` keeps the newest.
    pub fn new(limit: PageLines, tail: bool) -> Self {
        Self {
            entries: std::collections::VecDeque::new(),
            bytes: 0,
            limit: limit.get().min(MAX_PAGE_LINES) as usize,
            tail,
            more: false,
            redactions: 0,
            last_cursor: None,
        }
    }

    /// Adds one redacted entry with the cursor that continues after it. Returns false when
    /// the page is full (only outside tail mode: a tail drops its oldest entries instead).
    pub fn push(&mut self, entry: LogEntry, cursor: Option<LogCursor>, redactions: u32) -> bool {
        let size = entry.page_bytes();
        if !self.tail && (self.entries.len() >= self.limit || self.bytes + size > MAX_PAGE_BYTES) {
            self.more = true;
            return false;
        }
        self.redactions = self.redactions.saturating_add(redactions);
        self.bytes += size;
        self.entries.push_back((entry, cursor));
        while self.tail
            && (self.entries.len() > self.limit || self.bytes > MAX_PAGE_BYTES)
            && let Some((dropped, _)) = self.entries.pop_front()
        {
            self.bytes -= dropped.page_bytes();
        }
        true
    }

    /// Whether the page can take no more entries (outside tail mode).
    pub fn is_full(&self) -> bool {
        !self.tail && self.more
    }

    /// The cursor to use when nothing was added (the one the request continued from).
    pub fn keep_cursor(&mut self, cursor: Option<LogCursor>) {
        self.last_cursor = cursor;
    }

    /// The page.
    pub fn finish(self, invocation_id: Option<String>) -> LogPage {
        let cursor = self
            .entries
            .back()
            .and_then(|(_, c)| c.clone())
            .or(self.last_cursor);
        LogPage {
            entries: self.entries.into_iter().map(|(e, _)| e).collect(),
            cursor,
            more: self.more,
            redactions: self.redactions,
            invocation_id,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(n: usize, len: usize) -> LogEntry {
        LogEntry {
            at: format!("t{n}"),
            source: LogSource::Gateway,
            message: "x".repeat(len),
        }
    }

    fn cursor(n: usize) -> Option<LogCursor> {
        LogCursor::new(format!("c{n}")).ok()
    }

    #[test]
    fn a_forward_page_stops_at_its_line_and_byte_limits() {
        let mut page = PageBuilder::new(PageLines::new(3).unwrap(), false);
        for n in 0..5 {
            if !page.push(entry(n, 10), cursor(n), 0) {
                break;
            }
        }
        let p = page.finish(None);
        assert_eq!(p.entries.len(), 3);
        assert!(p.more);
        assert_eq!(p.cursor, cursor(2));

        let mut page = PageBuilder::new(PageLines::max(), false);
        let mut n = 0;
        while page.push(entry(n, 10_000), cursor(n), 0) {
            n += 1;
        }
        let p = page.finish(None);
        let bytes: usize = p.entries.iter().map(LogEntry::page_bytes).sum();
        assert!(
            bytes <= MAX_PAGE_BYTES && p.more && p.entries.len() == 52,
            "{bytes}"
        );
    }

    #[test]
    fn a_tail_keeps_the_newest_that_fit() {
        let mut page = PageBuilder::new(PageLines::new(2).unwrap(), true);
        for n in 0..5 {
            assert!(page.push(entry(n, 1), cursor(n), 1));
        }
        let p = page.finish(None);
        assert_eq!(
            p.entries.iter().map(|e| e.at.as_str()).collect::<Vec<_>>(),
            ["t3", "t4"]
        );
        assert_eq!(p.cursor, cursor(4));
        assert!(!p.more);
    }

    #[test]
    fn arguments_are_checked_on_decode() {
        assert!(PageLines::new(0).is_err() && PageLines::new(1001).is_err());
        assert!(LogCursor::new("s=1;i=2").is_ok());
        assert!(LogCursor::new("has space").is_err() && LogCursor::new("").is_err());
        let bad: Result<LogStart, _> =
            serde_json::from_value(serde_json::json!({"from": "tail", "lines": 5000}));
        assert!(bad.is_err());
        let ok: LogStart =
            serde_json::from_value(serde_json::json!({"from": "after", "cursor": "abc"})).unwrap();
        assert!(matches!(ok, LogStart::After { .. }));
    }
}
