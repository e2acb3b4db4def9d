//! Runtime inspection through the Agent's backend: `agent-runtime` and `agent-logs` (the
//! failure evidence the worker keeps with a revision is `crate::evidence`). Log reads are
//! audited (who read which range of whose log).

use clawfleet_api::responses::AgentRuntime;
use clawfleet_protocol::Operation;
use clawfleet_protocol::operation::{AgentRef, NamespaceRef};
use clawfleet_protocol::redact::Redactor;
use clawfleet_protocol::result::OperationResult;
use clawfleet_protocol::runtime::{
    LogCursor, LogPage, LogStart, LogsArgs, MAX_PAGE_LINES, PageLines, RuntimeArgs,
};
use serde_json::json;

use super::{Service, ServiceError, now};
use crate::backend::{Backend, CallError, CallOptions, Target};
use crate::codes::Code;
use crate::model::{Agent, Namespace};

/// Lines a log request returns when it names no start.
pub const DEFAULT_TAIL_LINES: u32 = 100;

/// How long a runtime or log read may take on the target.
const READ_DEADLINE: std::time::Duration = std::time::Duration::from_secs(30);

pub use clawfleet_api::requests::LogsQuery;

/// A follow without a poll for this long has ended; the next poll starts (and audits) a new one.
const FOLLOW_IDLE_SECONDS: i64 = 60;

/// A log query checked and turned into the protocol's request.
pub trait LogsQueryExt {
    /// The protocol's start and limit, or the refusal naming the parameter.
    fn start(&self, now_unix: u64) -> Result<(LogStart, PageLines), ServiceError>;
}

impl LogsQueryExt for LogsQuery {
    fn start(&self, now_unix: u64) -> Result<(LogStart, PageLines), ServiceError> {
        let bad = |m: String| ServiceError::invalid(Code::InvalidLogQuery, m);
        let lines =
            |field: &str, n: u32| PageLines::new(n).map_err(|e| bad(format!("{field}: {e}")));
        let limit = match self.limit {
            Some(n) => lines("limit", n)?,
            None => PageLines::max(),
        };
        let since = match self.since_seconds {
            Some(0) => return Err(bad("sinceSeconds: must be at least 1".to_owned())),
            Some(s) => Some(now_unix.saturating_sub(s)),
            None => None,
        };
        let start = match (&self.cursor, self.tail_lines, since) {
            (Some(_), Some(_), _) | (Some(_), _, Some(_)) => {
                return Err(bad(
                    "cursor: continues a page and cannot be combined with tailLines or sinceSeconds"
                        .to_owned(),
                ));
            }
            (Some(c), None, None) => LogStart::After {
                cursor: LogCursor::new(c.clone()).map_err(|e| bad(format!("cursor: {e}")))?,
            },
            (None, Some(n), since_unix) => LogStart::Tail {
                lines: lines("tailLines", n)?,
                since_unix,
            },
            (None, None, Some(since_unix)) => LogStart::Since { since_unix },
            (None, None, None) => LogStart::Tail {
                lines: lines("tailLines", DEFAULT_TAIL_LINES.min(MAX_PAGE_LINES))?,
                since_unix: None,
            },
        };
        Ok((start, limit))
    }
}

/// Why a runtime read gave no answer.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error(transparent)]
    Service(#[from] ServiceError),
    #[error(transparent)]
    Call(#[from] CallError),
}

/// The refs and target of an Agent.
struct Inspected {
    target: Target,
    namespace: NamespaceRef,
    agent: AgentRef,
}

/// The protocol refs of an Agent (shared with the worker's evidence).
pub(crate) fn refs(ns: &Namespace, agent: &Agent) -> (NamespaceRef, AgentRef) {
    (
        NamespaceRef {
            id: ns.id.clone(),
            name: ns.name.clone(),
        },
        AgentRef {
            id: agent.id.clone(),
            service_principal_id: agent.service_principal_id.clone(),
        },
    )
}

impl Service {
    async fn inspected(&self, ns: &str, id: &str) -> Result<Inspected, ServiceError> {
        let namespace = self.namespace(ns).await?;
        let agent = self.agent(ns, id).await?;
        let target = crate::targets::agent(&*self.store, &namespace, &agent)
            .await?
            .ok_or_else(|| {
                ServiceError::conflict(
                    Code::AgentNotPlaced,
                    format!("Agent {ns}/{id} was never placed on a host; deploy it first"),
                )
            })?;
        let (namespace, agent) = refs(&namespace, &agent);
        Ok(Inspected {
            target,
            namespace,
            agent,
        })
    }

    /// What the Agent's unit or Pod is doing now.
    pub async fn agent_runtime<B: Backend>(
        &self,
        backend: &B,
        ns: &str,
        id: &str,
    ) -> Result<AgentRuntime, RuntimeError> {
        let i = self.inspected(ns, id).await?;
        let target_name = i.target.name().to_owned();
        let op = Operation::AgentRuntime(RuntimeArgs {
            namespace: i.namespace,
            agent: i.agent,
            evidence_lines: 0,
        });
        let report = match backend.call(i.target, op, read_options()).await? {
            OperationResult::AgentRuntime(r) => r,
            other => return Err(wrong_answer(&other).into()),
        };
        Ok(AgentRuntime::new(ns, id, &target_name, *report))
    }

    /// Whether this poll starts a follow of the Agent's log by `actor` (otherwise it continues
    /// one that was audited when it started).
    fn follow_starts(&self, actor: &str, target: &str, now: i64) -> bool {
        let mut follows = self.follows.lock().unwrap_or_else(|p| p.into_inner());
        if follows.len() > 10_000 {
            follows.retain(|_, last| now - *last < FOLLOW_IDLE_SECONDS);
        }
        let key = (actor.to_owned(), target.to_owned());
        let starts = follows
            .get(&key)
            .is_none_or(|last| now - *last >= FOLLOW_IDLE_SECONDS);
        follows.insert(key, now);
        starts
    }

    /// One page of the Agent's log; the read is audited under `actor` (a follow once, when
    /// it starts).
    pub async fn agent_logs<B: Backend>(
        &self,
        backend: &B,
        actor: &str,
        ns: &str,
        id: &str,
        query: &LogsQuery,
    ) -> Result<LogPage, RuntimeError> {
        let (start, limit) = query.start(u64::try_from(now()).unwrap_or(0))?;
        let i = self.inspected(ns, id).await?;
        let previous = query.previous.unwrap_or(false);
        let range = match &start {
            LogStart::Tail { lines, since_unix } => {
                json!({"tailLines": lines.get(), "sinceUnix": since_unix})
            }
            LogStart::Since { since_unix } => json!({"sinceUnix": since_unix}),
            LogStart::After { .. } => json!({"afterCursor": true}),
        };
        let op = Operation::AgentLogs(LogsArgs {
            namespace: i.namespace,
            agent: i.agent,
            start,
            previous,
            limit,
        });
        let outcome = backend.call(i.target, op, read_options()).await;
        crate::metrics::log_read(match &outcome {
            Ok(_) => crate::metrics::Outcome::Ok,
            Err(CallError::Failed(_)) => crate::metrics::Outcome::Failed,
            Err(_) => crate::metrics::Outcome::NoAnswer,
        });
        let (entries, code) = match &outcome {
            Ok(OperationResult::AgentLogs(p)) => (p.entries.len(), None),
            Ok(_) => (0, Some(Code::InvalidHostResult.as_str())),
            Err(e) => (0, Some(e.code().as_str())),
        };
        let target = format!("{ns}/{id}");
        if !query.follow.unwrap_or(false) {
            self.audit(
                actor,
                "agent.logs.read",
                &target,
                json!({"range": range, "previous": previous, "limit": limit.get(), "entries": entries, "failed": code}),
            ).await?;
        } else if self.follow_starts(actor, &target, now()) {
            self.audit(
                actor,
                "agent.logs.follow",
                &target,
                json!({"range": range, "previous": previous, "limit": limit.get(), "entries": entries, "failed": code}),
            ).await?;
        }
        match outcome? {
            OperationResult::AgentLogs(mut page) => {
                // Once more here: whatever the target missed does not reach the caller, and
                // the values of the Agent's bound secrets are replaced by construction.
                let secrets = crate::evidence::secret_redaction_terms(&*self.store, ns, id)
                    .await
                    .map_err(ServiceError::from)?;
                let mut redactor = Redactor::new(secrets);
                for e in &mut page.entries {
                    let r = redactor.line(&e.message);
                    page.redactions = page.redactions.saturating_add(r.count);
                    e.message = r.text;
                }
                Ok(page)
            }
            other => Err(wrong_answer(&other).into()),
        }
    }
}

impl Service {
    /// Runs one drift sweep now and answers every finding (audited: it reaches every target).
    pub async fn sweep_drift<B: Backend>(
        &self,
        backend: &B,
        actor: &str,
    ) -> Result<Vec<crate::model::DriftRow>, ServiceError> {
        let summary = crate::drift::sweep(&*self.store, backend).await?;
        self.audit(
            actor,
            "drift.sweep",
            "*",
            json!({"targets": summary.targets, "unreachable": summary.unreachable_targets}),
        )
        .await?;
        Ok(self.store.drift().await?)
    }
}

pub(super) fn read_options() -> CallOptions {
    CallOptions {
        deadline: READ_DEADLINE,
        fence: None,
    }
}

pub(super) fn wrong_answer(other: &OperationResult) -> ServiceError {
    ServiceError::conflict(
        Code::InvalidHostResult,
        format!("the target answered {}", other.kind()),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(tail: Option<u32>, since: Option<u64>, cursor: Option<&str>) -> LogsQuery {
        LogsQuery {
            tail_lines: tail,
            since_seconds: since,
            cursor: cursor.map(str::to_owned),
            ..LogsQuery::default()
        }
    }

    #[test]
    fn log_queries_map_to_one_start_and_refuse_bad_combinations() {
        let now = 1_000_000;
        assert!(matches!(
            q(None, None, None).start(now).unwrap().0,
            LogStart::Tail { lines, since_unix: None } if lines.get() == DEFAULT_TAIL_LINES
        ));
        assert!(matches!(
            q(None, Some(60), None).start(now).unwrap().0,
            LogStart::Since { since_unix } if since_unix == now - 60
        ));
        assert!(matches!(
            q(Some(5), Some(60), None).start(now).unwrap().0,
            LogStart::Tail {
                since_unix: Some(_),
                ..
            }
        ));
        for bad in [
            q(Some(0), None, None),
            q(Some(1001), None, None),
            q(None, Some(0), None),
            q(Some(5), None, Some("c")),
            q(None, Some(5), Some("c")),
            q(None, None, Some("has space")),
        ] {
            let err = bad.start(now).unwrap_err();
            assert!(
                matches!(
                    &err,
                    ServiceError::Invalid {
                        code: Code::InvalidLogQuery,
                        ..
                    }
                ),
                "{err}"
            );
        }
    }
}
