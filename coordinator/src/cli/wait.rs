//! `--wait`: following the work item a request queued until it converges, fails, is
//! overtaken or times out, and the exit codes that say which.

use std::time::{Duration, Instant};

use anyhow::Result;
use clap::Args;
use clawfleet_api::types::{DeploymentStatus, DesiredState, WorkRecord, WorkState};
use coordinator::client::{Api, Client, ClientError};
use coordinator::codes::Code;
use serde_json::Value;

#[derive(Args, Debug)]
pub(crate) struct WaitArgs {
    /// Wait until the deployment converges, printing progress.
    #[arg(long)]
    pub(crate) wait: bool,
    /// Give up waiting after this many seconds.
    #[arg(long, default_value_t = 900)]
    pub(crate) timeout: u64,
}

/// Exit codes of `occ` (documented in docs/operator-guide.md, "Exit codes").
pub(crate) mod exit {
    /// The command did what was asked. With `--wait`: the requested work converged and still
    /// holds when the wait ends (a deploy's revision is the active and served one, a stopped
    /// Agent is still meant to be stopped).
    pub const OK: u8 = 0;
    /// The command failed: bad configuration, the API refused the request, or it was
    /// unreachable.
    pub const ERROR: u8 = 1;
    /// With `--wait`: the requested work failed (its code and message are printed).
    pub const WORK_FAILED: u8 = 3;
    /// With `--wait`: the request was overtaken (a newer deploy, a stop, or the Agent meant to
    /// run again), before it took effect or after, before the wait looked.
    pub const SUPERSEDED: u8 = 4;
    /// With `--wait`: the timeout passed before the work finished.
    pub const TIMED_OUT: u8 = 5;
}

/// How a `--wait` ended when it did not converge; `main` turns it into the exit code.
#[derive(Debug)]
pub(crate) struct WaitFailure {
    pub(crate) exit: u8,
    message: String,
}

impl std::fmt::Display for WaitFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for WaitFailure {}

pub(crate) fn wait_failure(exit: u8, message: String) -> anyhow::Error {
    anyhow::Error::new(WaitFailure { exit, message })
}

/// What a `--wait` follows: the work item the request queued.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Waited {
    /// A deploy; converged when its work finished with `REVISION_ACTIVATED`.
    Deploy,
    /// A stop; converged when its work finished with the Agent stopped.
    Stop,
    /// A delete; converged when its work finished with the Agent gone.
    Delete,
}

/// Codes a finished work item may end with that mean "done as asked".
fn converged_code(what: Waited, code: &str) -> bool {
    let code = Code::parse(code);
    match what {
        Waited::Deploy => code == Some(Code::RevisionActivated),
        Waited::Stop => matches!(code, Some(Code::RevisionStopped | Code::AgentGone)),
        Waited::Delete => code == Some(Code::AgentDeleted),
    }
}

/// How a `--wait` ended: the work item and the deployment status it last read (`status` is
/// `None` once a deleted Agent is gone), and, unless it converged, why not (with its exit
/// code).
pub(crate) struct WaitEnd {
    pub(crate) work: WorkRecord,
    pub(crate) status: Option<DeploymentStatus>,
    pub(crate) failure: Option<anyhow::Error>,
}

impl WaitEnd {
    /// The one document `--output json` prints when a wait ends, whatever the outcome.
    pub(crate) fn document(&self) -> Value {
        serde_json::json!({"work": self.work, "status": self.status})
    }

    /// Prints the end of the wait (JSON: [`Self::document`]; table: `table`, only when it
    /// converged) and returns the failure, if any, for `main`'s exit code.
    pub(crate) fn finish(
        self,
        cli: &super::Cli,
        table: impl FnOnce(Option<&DeploymentStatus>),
    ) -> Result<()> {
        if cli.output == super::Output::Json {
            super::out::json(&self.document());
        } else if self.failure.is_none() {
            table(self.status.as_ref());
        }
        match self.failure {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

/// The last attempt's code and message of a work item (empty before its first attempt).
fn last_attempt(work: &WorkRecord) -> (&str, &str) {
    work.last_attempt
        .as_ref()
        .map_or(("", ""), |a| (a.code.as_str(), a.message.as_str()))
}

/// What one look at a work item and the Agent's status says: still open, done as asked, or
/// ended otherwise (exit code and message).
fn judge(
    what: Waited,
    agent: &str,
    work: &WorkRecord,
    status: Option<&DeploymentStatus>,
) -> Option<Result<(), (u8, String)>> {
    let (code, message) = last_attempt(work);
    let revision = work.revision_id.as_deref().unwrap_or("-");
    let label = match what {
        Waited::Deploy => "deploy",
        Waited::Stop => "stop",
        Waited::Delete => "delete",
    };
    let subject = if what == Waited::Deploy {
        format!("{agent} {revision}")
    } else {
        format!("{label} of {agent}")
    };
    let active = status.and_then(|s| s.active_revision_id.as_deref());
    let served = status
        .and_then(|s| s.served_revision_id.as_deref())
        .unwrap_or("nothing");
    let desired = status.map(|s| s.desired_state);
    match work.state {
        WorkState::Done if converged_code(what, code) => match what {
            // Activated, but a newer deploy (or a stop) may have taken over since: exit 0 only
            // while the requested revision is still the active and served one.
            Waited::Deploy if active != Some(revision) || served != revision => Some(Err((
                exit::SUPERSEDED,
                format!(
                    "{subject} was activated, then overtaken: {} is active, {served} serves",
                    active.unwrap_or("nothing")
                ),
            ))),
            Waited::Stop if desired != Some(DesiredState::Stopped) => Some(Err((
                exit::SUPERSEDED,
                format!(
                    "{subject} finished, then was overtaken: the Agent is {} again ({served} serves)",
                    desired.map_or("-", DesiredState::as_str)
                ),
            ))),
            _ => Some(Ok(())),
        },
        WorkState::Done => Some(Err((
            exit::SUPERSEDED,
            format!("{subject} was overtaken: {code} {message} ({served} serves)"),
        ))),
        WorkState::Failed => Some(Err((
            exit::WORK_FAILED,
            format!("{subject} failed: {code} {message} ({served} serves)"),
        ))),
        WorkState::Queued | WorkState::Running => None,
    }
}

/// Follows one work item until it finishes, printing each change of its progress to stderr.
/// A failed, overtaken or timed-out item ends with its failure set; only an unreachable or
/// refusing API is an error here.
pub(crate) fn wait(
    client: &Client,
    ns: &str,
    agent: &str,
    work_id: i64,
    what: Waited,
    args: &WaitArgs,
) -> Result<WaitEnd> {
    let start = Instant::now();
    let mut last = String::new();
    let label = match what {
        Waited::Deploy => "deploy",
        Waited::Stop => "stop",
        Waited::Delete => "delete",
    };
    loop {
        let work = client.get_work([ns, agent, &work_id.to_string()])?;
        let status = match client.deployment_status([ns, agent]) {
            Ok(s) => Some(s),
            Err(ClientError::Api { status: 404, .. }) if what == Waited::Delete => None,
            Err(e) => return Err(e.into()),
        };
        let state = work.state.as_str();
        let (code, message) = last_attempt(&work);
        let revision = work.revision_id.as_deref().unwrap_or("-");
        let line = match &status {
            None => format!("{label} {state} {code}"),
            Some(status) => {
                let rev_status = status
                    .revisions
                    .iter()
                    .find(|r| work.revision_id.as_deref() == Some(r.id.as_str()))
                    .map_or("-", |r| r.status.as_str());
                format!(
                    "{label}{} {state} {code} · desired {} · active {} · served {}{}",
                    if what == Waited::Deploy {
                        format!(" {revision} ({rev_status})")
                    } else {
                        String::new()
                    },
                    status.desired_state.as_str(),
                    status.active_revision_id.as_deref().unwrap_or("-"),
                    status.served_revision_id.as_deref().unwrap_or("-"),
                    match work.attempts {
                        n if n > 0 => format!(" · attempts {n}"),
                        _ => String::new(),
                    },
                )
            }
        };
        if line != last {
            super::out::note(&format!(
                "[{:>5.1}s] {agent}: {line}",
                start.elapsed().as_secs_f64()
            ));
            last = line;
        }
        let failure = match judge(what, agent, &work, status.as_ref()) {
            Some(Ok(())) => None,
            Some(Err((exit, message))) => Some(wait_failure(exit, message)),
            None if start.elapsed() > Duration::from_secs(args.timeout) => {
                let subject = if what == Waited::Deploy {
                    format!("{agent} {revision}")
                } else {
                    format!("{label} of {agent}")
                };
                Some(wait_failure(
                    exit::TIMED_OUT,
                    format!(
                        "{subject} not finished after {} s (last: {code} {message})",
                        args.timeout
                    ),
                ))
            }
            None => {
                std::thread::sleep(Duration::from_millis(250));
                continue;
            }
        };
        return Ok(WaitEnd {
            work,
            status,
            failure,
        });
    }
}

#[cfg(test)]
mod tests {
    use clawfleet_api::types::{LastAttempt, WorkKind};

    use super::*;

    fn work(state: WorkState, code: &str, revision: &str) -> WorkRecord {
        WorkRecord {
            id: 1,
            kind: WorkKind::Deploy,
            revision_id: Some(revision.to_owned()),
            state,
            attempts: 1,
            last_attempt: (!code.is_empty()).then(|| LastAttempt {
                code: code.to_owned(),
                message: "m".to_owned(),
                at: 0,
                attempts: 1,
            }),
            created_at: 0,
        }
    }

    fn status(
        desired: DesiredState,
        active: Option<&str>,
        served: Option<&str>,
    ) -> DeploymentStatus {
        DeploymentStatus {
            namespace_id: "ns1".to_owned(),
            agent_id: "a1".to_owned(),
            desired_state: desired,
            host: None,
            port: None,
            active_revision_id: active.map(str::to_owned),
            served_revision_id: served.map(str::to_owned),
            converged: false,
            revisions: Vec::new(),
            open_work: Vec::new(),
            recent_work: Vec::new(),
            last_code: None,
        }
    }

    /// A deploy whose revision was activated and then overtaken by a newer one before the
    /// wait looked is not "active and served": it exits 4 (it used to exit 0).
    #[test]
    fn an_activated_revision_overtaken_before_the_wait_looked_is_superseded() {
        let done = work(
            WorkState::Done,
            Code::RevisionActivated.as_str(),
            "rev-2-aaaaaaaa",
        );
        let now = status(
            DesiredState::Running,
            Some("rev-3-bbbbbbbb"),
            Some("rev-3-bbbbbbbb"),
        );
        match judge(Waited::Deploy, "a1", &done, Some(&now)) {
            Some(Err((code, message))) => {
                assert_eq!(code, exit::SUPERSEDED);
                assert!(message.contains("rev-3-bbbbbbbb is active"), "{message}");
            }
            other => panic!("{other:?}"),
        }
        let served = status(
            DesiredState::Running,
            Some("rev-2-aaaaaaaa"),
            Some("rev-2-aaaaaaaa"),
        );
        assert_eq!(
            judge(Waited::Deploy, "a1", &done, Some(&served)),
            Some(Ok(()))
        );
        // Active, but the host serves another revision: not "served" either.
        let other = status(
            DesiredState::Running,
            Some("rev-2-aaaaaaaa"),
            Some("rev-1-cccccccc"),
        );
        assert!(matches!(
            judge(Waited::Deploy, "a1", &done, Some(&other)),
            Some(Err((exit::SUPERSEDED, _)))
        ));
    }

    #[test]
    fn a_stop_overtaken_by_a_deploy_is_superseded_and_open_work_is_pending() {
        let stopped = work(
            WorkState::Done,
            Code::RevisionStopped.as_str(),
            "rev-2-aaaaaaaa",
        );
        assert_eq!(
            judge(
                Waited::Stop,
                "a1",
                &stopped,
                Some(&status(DesiredState::Stopped, None, None))
            ),
            Some(Ok(()))
        );
        assert!(matches!(
            judge(
                Waited::Stop,
                "a1",
                &stopped,
                Some(&status(DesiredState::Running, Some("rev-3-bbbbbbbb"), None))
            ),
            Some(Err((exit::SUPERSEDED, _)))
        ));
        let open = work(WorkState::Running, "", "rev-2-aaaaaaaa");
        assert_eq!(judge(Waited::Deploy, "a1", &open, None), None);
        let failed = work(
            WorkState::Failed,
            clawfleet_protocol::FailureCode::OwnershipMismatch.as_str(),
            "rev-2-aaaaaaaa",
        );
        assert!(matches!(
            judge(Waited::Deploy, "a1", &failed, None),
            Some(Err((exit::WORK_FAILED, _)))
        ));
    }
}
