//! `agent-runtime` and `agent-logs` on a cluster, with the same shapes and limits as on a host:
//! the Agent's newest Pod (phase, the gateway container's state, restarts, last termination),
//! its newest events, and pages of the gateway container's log through the Pod log API,
//! redacted here with the Agent's gateway password among the literal secrets.
//!
//! A log cursor is `k8s1:<pod uid>:<timestamp>:<n>`: the timestamp of the last entry returned
//! and how many entries with that exact timestamp were returned. The log API takes `sinceTime`
//! in whole seconds only, so the next page asks from that second and skips what it already
//! gave.

use clawfleet_protocol::Ident;
use clawfleet_protocol::failure::{Failure, FailureCode};
use clawfleet_protocol::redact::Redactor;
use clawfleet_protocol::runtime::{
    ExitKind, LastExit, LogCursor, LogEntry, LogPage, LogSource, LogStart, LogsArgs,
    MAX_PAGE_BYTES, PageBuilder, PageLines, RuntimeArgs, RuntimeEvent, RuntimeReport, Workload,
    WorkloadKind,
};
use futures::AsyncReadExt;
use k8s_openapi::api::core::v1::{ContainerStatus, Event, Pod, Secret};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ListParams, LogParams};

use super::namespace::require_namespace;
use crate::client::Requests;
use crate::names::{self, Tenant};
use crate::observe;
use crate::settings::ClusterSettings;

/// Newest events reported.
const EVENTS_MAX: usize = 10;

/// `agent-runtime`.
pub(crate) async fn runtime(
    r: &Requests,
    settings: &ClusterSettings,
    args: &RuntimeArgs,
) -> Result<RuntimeReport, Failure> {
    let t = settings.tenant(&args.namespace.id);
    require_namespace(r, &t).await?;
    let observed = Box::pin(observe::observe(r, &t, &args.agent.id)).await?;
    let pod = newest_pod(r, &t, &args.agent.id).await?;
    let workload = pod.as_ref().map(workload);
    let events = match &pod {
        Some(p) => events(r, &t, p).await.unwrap_or_default(),
        None => Vec::new(),
    };
    let recent_lines = match (PageLines::new(args.evidence_lines), &pod) {
        (Ok(lines), Some(p)) => {
            let start = LogStart::Tail {
                lines,
                since_unix: None,
            };
            // Evidence is best effort: a Pod that never started has no log to read.
            read_page(r, &t, &args.agent.id, p, &start, false, lines)
                .await
                .map(|page| page.entries)
                .unwrap_or_default()
        }
        _ => Vec::new(),
    };
    Ok(RuntimeReport {
        observation: observed.observation(settings),
        workload,
        account_uid: None,
        events,
        recent_lines,
    })
}

/// `agent-logs`.
pub(crate) async fn logs(
    r: &Requests,
    settings: &ClusterSettings,
    args: &LogsArgs,
) -> Result<LogPage, Failure> {
    let t = settings.tenant(&args.namespace.id);
    require_namespace(r, &t).await?;
    let pod = newest_pod(r, &t, &args.agent.id).await?.ok_or_else(|| {
        Failure::new(
            FailureCode::AgentMissing,
            format!("Agent {} has no Pod on the cluster", args.agent.id),
        )
    })?;
    read_page(
        r,
        &t,
        &args.agent.id,
        &pod,
        &args.start,
        args.previous,
        args.limit,
    )
    .await
}

async fn newest_pod(r: &Requests, t: &Tenant, agent: &Ident) -> Result<Option<Pod>, Failure> {
    let mut pods = observe::agent_pods(r, t, agent, None).await?;
    pods.sort_by(|a, b| {
        a.metadata
            .creation_timestamp
            .as_ref()
            .map(|t| t.0)
            .cmp(&b.metadata.creation_timestamp.as_ref().map(|t| t.0))
    });
    Ok(pods.pop())
}

fn gateway_status(pod: &Pod) -> Option<&ContainerStatus> {
    pod.status
        .as_ref()?
        .container_statuses
        .as_ref()?
        .iter()
        .find(|c| c.name == names::CONTAINER)
}

fn workload(pod: &Pod) -> Workload {
    let status = gateway_status(pod);
    let state = status.and_then(|c| c.state.as_ref());
    let sub_state = state
        .and_then(|s| {
            s.waiting
                .as_ref()
                .and_then(|w| w.reason.clone())
                .or_else(|| s.running.as_ref().map(|_| "running".to_owned()))
                .or_else(|| s.terminated.as_ref().and_then(|t| t.reason.clone()))
        })
        .unwrap_or_default();
    let last = status
        .and_then(|c| c.last_state.as_ref())
        .and_then(|s| s.terminated.as_ref())
        .or_else(|| state.and_then(|s| s.terminated.as_ref()));
    Workload {
        kind: WorkloadKind::Pod,
        name: pod.metadata.name.clone().unwrap_or_default(),
        active_state: pod
            .status
            .as_ref()
            .and_then(|s| s.phase.clone())
            .unwrap_or_default(),
        sub_state,
        restarts: status
            .map(|c| u32::try_from(c.restart_count).unwrap_or(0))
            .unwrap_or(0),
        main_pid: None,
        main_uid: None,
        started_at: state
            .and_then(|s| s.running.as_ref())
            .and_then(|r| r.started_at.as_ref())
            .map(|t| t.0.to_string()),
        last_exit: last.map(|t| LastExit {
            kind: match t.signal {
                Some(s) if s != 0 => ExitKind::Killed,
                _ => ExitKind::Exited,
            },
            status: t.signal.filter(|s| *s != 0).unwrap_or(t.exit_code),
            at: t.finished_at.as_ref().map(|f| f.0.to_string()),
            reason: t.reason.clone(),
        }),
        memory_current_bytes: None,
        memory_peak_bytes: None,
        cpu_usage_nanos: None,
        tasks_current: None,
        invocation_id: status.and_then(|c| c.container_id.clone()),
    }
}

async fn events(r: &Requests, t: &Tenant, pod: &Pod) -> Result<Vec<RuntimeEvent>, Failure> {
    let name = pod.metadata.name.clone().unwrap_or_default();
    let api: Api<Event> = Api::namespaced(r.client(), &t.name);
    let lp = ListParams::default().fields(&format!(
        "involvedObject.kind=Pod,involvedObject.name={name}"
    ));
    let list = r.read("list the Pod's events", || api.list(&lp)).await?;
    let mut redactor = Redactor::new([]);
    let mut out: Vec<(String, RuntimeEvent)> = list
        .items
        .into_iter()
        .map(|e| {
            let at = e
                .last_timestamp
                .as_ref()
                .map(|t| t.0.to_string())
                .or_else(|| e.event_time.as_ref().map(|t| t.0.to_string()))
                .or_else(|| {
                    e.metadata
                        .creation_timestamp
                        .as_ref()
                        .map(|t| t.0.to_string())
                })
                .unwrap_or_default();
            let message = clawfleet_protocol::text::clean(
                &redactor.line(e.message.as_deref().unwrap_or_default()).text,
                512,
            );
            (
                at.clone(),
                RuntimeEvent {
                    at,
                    kind: e.type_.unwrap_or_default(),
                    reason: e.reason.unwrap_or_default(),
                    message,
                    count: e.count.and_then(|c| u32::try_from(c).ok()).unwrap_or(1),
                },
            )
        })
        .collect();
    out.sort_by(|a, b| b.0.cmp(&a.0));
    Ok(out.into_iter().take(EVENTS_MAX).map(|(_, e)| e).collect())
}

/// The parts of a cursor.
struct Position {
    pod_uid: String,
    at: String,
    seen: usize,
}

fn parse_cursor(cursor: &LogCursor) -> Result<Position, Failure> {
    let bad = || {
        Failure::new(
            FailureCode::LogCursorInvalid,
            "the log cursor is not one this cluster backend issued",
        )
    };
    let mut parts = cursor.as_str().splitn(4, ':');
    if parts.next() != Some("k8s1") {
        return Err(bad());
    }
    let pod_uid = parts.next().ok_or_else(bad)?.to_owned();
    let at = parts.next().ok_or_else(bad)?.replace('_', ":");
    let seen = parts.next().and_then(|n| n.parse().ok()).ok_or_else(bad)?;
    Ok(Position { pod_uid, at, seen })
}

fn make_cursor(pod_uid: &str, at: &str, seen: usize) -> Option<LogCursor> {
    // `:` separates the parts, so the timestamp's colons travel as `_`.
    LogCursor::new(format!("k8s1:{pod_uid}:{}:{seen}", at.replace(':', "_"))).ok()
}

/// The Agent's gateway password (every value of its Secret), for redaction. A Secret that
/// cannot be read fails the log read: a page is never sent without its redaction.
async fn password(r: &Requests, t: &Tenant, agent: &Ident) -> Result<Vec<String>, Failure> {
    let n = names::agent(agent);
    let api: Api<Secret> = Api::namespaced(r.client(), &t.name);
    let secret = r
        .read("read the Agent's password Secret", || {
            api.get_opt(&n.password)
        })
        .await
        .map_err(|f| {
            // The cluster's own code (KUBERNETES_API_UNAVAILABLE, …), never a host's word.
            Failure::with_class(
                f.class,
                f.code,
                format!("the log is not read without its redaction: {}", f.message),
            )
        })?;
    Ok(secret
        .and_then(|s| s.data)
        .map(|d| {
            d.into_values()
                .filter_map(|v| String::from_utf8(v.0).ok())
                .collect()
        })
        .unwrap_or_default())
}

async fn read_page(
    r: &Requests,
    t: &Tenant,
    agent: &Ident,
    pod: &Pod,
    start: &LogStart,
    previous: bool,
    limit: PageLines,
) -> Result<LogPage, Failure> {
    let name = pod.metadata.name.clone().unwrap_or_default();
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    let mut params = LogParams {
        container: Some(names::CONTAINER.to_owned()),
        previous,
        timestamps: true,
        limit_bytes: Some(i64::try_from(MAX_PAGE_BYTES * 4).unwrap_or(i64::MAX)),
        ..LogParams::default()
    };
    // sinceTime (whole seconds, on the node's own terms) rather than sinceSeconds, which the
    // kubelet would count back from its clock and so miss what came just after the cursor.
    let second = |s: u64| {
        i64::try_from(s)
            .ok()
            .and_then(|s| Timestamp::from_second(s).ok())
    };
    let (tail, limit, position) = match start {
        LogStart::Tail { lines, since_unix } => {
            params.tail_lines = Some(i64::from(lines.get().min(limit.get())));
            params.since_time = since_unix.and_then(second);
            (
                true,
                PageLines::new(lines.get().min(limit.get())).unwrap_or(limit),
                None,
            )
        }
        LogStart::Since { since_unix } => {
            params.since_time = second(*since_unix);
            (false, limit, None)
        }
        LogStart::After { cursor } => {
            let p = parse_cursor(cursor)?;
            if p.pod_uid != uid {
                return Err(Failure::new(
                    FailureCode::LogCursorInvalid,
                    "the log cursor is of an earlier Pod of this Agent; start again with a tail",
                ));
            }
            let since = chrono_seconds(&p.at).ok_or_else(|| {
                Failure::new(
                    FailureCode::LogCursorInvalid,
                    "the log cursor's time does not parse",
                )
            })?;
            params.since_time = second(since);
            (false, limit, Some(p))
        }
    };
    let api: Api<Pod> = Api::namespaced(r.client(), &t.name);
    // Bytes, not text: a log is whatever the gateway wrote, valid UTF-8 or not.
    let max = u64::try_from(MAX_PAGE_BYTES * 4).unwrap_or(u64::MAX);
    let bytes = r
        .read("read the Pod's log", || async {
            let stream = api.log_stream(&name, &params).await?;
            let mut buf = Vec::new();
            stream
                .take(max)
                .read_to_end(&mut buf)
                .await
                .map_err(kube::Error::ReadEvents)?;
            Ok(buf)
        })
        .await?;
    let mut text = String::from_utf8_lossy(&bytes).into_owned();
    if bytes.len() as u64 >= max
        && let Some(cut) = text.rfind('\n')
    {
        // The read stopped inside a line: leave it for the next page.
        text.truncate(cut);
    }
    let secrets = password(r, t, agent).await?;
    let page = page_from_log(&text, secrets, &uid, start, limit, tail, position.as_ref());
    Ok(page.finish(if previous { Some(uid) } else { None }))
}

/// One page of a Pod log as the log API gives it with timestamps (`<RFC 3339> <message>`
/// lines): every message redacted, the Agent's `secrets` among the literal ones; after a
/// cursor (`position`), what it already gave is skipped.
fn page_from_log(
    text: &str,
    secrets: Vec<String>,
    uid: &str,
    start: &LogStart,
    limit: PageLines,
    tail: bool,
    position: Option<&Position>,
) -> PageBuilder {
    let mut redactor = Redactor::new(secrets);
    let mut page = PageBuilder::new(limit, tail);
    if let LogStart::After { cursor } = start {
        page.keep_cursor(Some(cursor.clone()));
    }
    let mut last_at = String::new();
    let mut same = 0usize;
    let mut skip_same = position.map(|p| (p.at.clone(), p.seen));
    for line in text.lines() {
        let (at, message) = line.split_once(' ').unwrap_or((line, ""));
        if let Some((cursor_at, seen)) = &mut skip_same {
            if at < cursor_at.as_str() {
                continue;
            }
            if at == cursor_at.as_str() && *seen > 0 {
                *seen -= 1;
                continue;
            }
        }
        if at == last_at {
            same += 1;
        } else {
            same = 1;
            last_at = at.to_owned();
        }
        let seen = match position {
            Some(p) if p.at == at => p.seen + same,
            _ => same,
        };
        let redacted = redactor.line(message);
        let entry = LogEntry {
            at: at.to_owned(),
            source: LogSource::Gateway,
            message: clawfleet_protocol::text::clean(
                &redacted.text,
                clawfleet_protocol::runtime::MAX_ENTRY_CHARS,
            ),
        };
        if !page.push(entry, make_cursor(uid, at, seen), redacted.count) {
            break;
        }
    }
    page
}

/// Unix seconds of an RFC 3339 timestamp as the log API writes it (`…Z`, fraction optional).
fn chrono_seconds(at: &str) -> Option<u64> {
    let ts: Timestamp = at.parse().ok()?;
    u64::try_from(ts.as_second()).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use clawfleet_protocol::redact::corpus;

    /// The redaction corpus through the Pod log path: each case as one log text with
    /// timestamps, the corpus's literal secrets as the Agent's Secret values. Cases with
    /// entries journald cut are a journal's matter, not a Pod log's.
    #[test]
    fn pod_logs_pass_the_redaction_corpus() {
        let corpus = corpus::load().unwrap();
        let mut bad = Vec::new();
        let mut checked = 0;
        for case in corpus.cases.iter().filter(|c| c.iter().all(|e| !e.cut)) {
            let text: String = case
                .iter()
                .enumerate()
                .map(|(n, e)| format!("2026-12-04T06:43:39.{n:09}Z {}\n", e.input))
                .collect();
            let page = page_from_log(
                &text,
                corpus.secrets.clone(),
                "uid-1",
                &LogStart::Since { since_unix: 0 },
                PageLines::max(),
                false,
                None,
            )
            .finish(None);
            assert_eq!(page.entries.len(), case.len(), "{text}");
            for (e, got) in case.iter().zip(&page.entries) {
                checked += 1;
                if got.message != e.expected {
                    bad.push(format!(
                        "line {}: {:?}\n  expected {:?}\n  got      {:?}",
                        e.line, e.input, e.expected, got.message
                    ));
                }
                if let Some(s) = corpus.secrets.iter().find(|s| got.message.contains(*s)) {
                    bad.push(format!("line {}: {s:?} shows", e.line));
                }
            }
        }
        assert!(checked >= 250, "{checked}");
        assert!(bad.is_empty(), "{}", bad.join("\n"));
    }
}
