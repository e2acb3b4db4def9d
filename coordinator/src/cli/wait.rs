//! `--wait`: following the work item a request queued until it converges, fails, is
//! overtaken or times out, and the exit codes that say which.

use std::time::{Duration, Instant};

use anyhow::Result;
use clap::Args;
use coordinator::client::{Client, ClientError};
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
/// null once a deleted Agent is gone), and, unless it converged, why not (with its exit code).
pub(crate) struct WaitEnd {
    pub(crate) work: Value,
    pub(crate) status: Value,
    pub(crate) failure: Option<anyhow::Error>,
}

impl WaitEnd {
    /// The one document `--output json` prints when a wait ends, whatever the outcome.
    pub(crate) fn document(&self) -> Value {
        serde_json::json!({"work": self.work, "status": self.status})
    }

    /// Prints the end of the wait (JSON: [`Self::document`]; table: `table`, only when it
    /// converged) and returns the failure, if any, for `main`'s exit code.
    pub(crate) fn finish(self, cli: &super::Cli, table: impl FnOnce(&Value)) -> Result<()> {
        if cli.output == super::Output::Json {
            super::out::json(&self.document());
        } else if self.failure.is_none() {
            table(&self.status);
        }
        match self.failure {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

/// What one look at a work item and the Agent's status says: still open, done as asked, or
/// ended otherwise (exit code and message).
fn judge(
    what: Waited,
    agent: &str,
    work: &Value,
    status: &Value,
) -> Option<Result<(), (u8, String)>> {
    let state = work["state"].as_str().unwrap_or("-");
    let code = work["lastAttempt"]["code"].as_str().unwrap_or("");
    let message = work["lastAttempt"]["message"].as_str().unwrap_or("");
    let revision = work["revisionId"].as_str().unwrap_or("-");
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
    let active = status["activeRevisionId"].as_str();
    let served = status["servedRevisionId"].as_str().unwrap_or("nothing");
    match state {
        "done" if converged_code(what, code) => match what {
            // Activated, but a newer deploy (or a stop) may have taken over since: exit 0 only
            // while the requested revision is still the active and served one.
            Waited::Deploy if active != Some(revision) || served != revision => Some(Err((
                exit::SUPERSEDED,
                format!(
                    "{subject} was activated, then overtaken: {} is active, {served} serves",
                    active.unwrap_or("nothing")
                ),
            ))),
            Waited::Stop if status["desiredState"] != "stopped" => Some(Err((
                exit::SUPERSEDED,
                format!(
                    "{subject} finished, then was overtaken: the Agent is {} again ({served} serves)",
                    status["desiredState"].as_str().unwrap_or("-")
                ),
            ))),
            _ => Some(Ok(())),
        },
        "done" => Some(Err((
            exit::SUPERSEDED,
            format!("{subject} was overtaken: {code} {message} ({served} serves)"),
        ))),
        "failed" => Some(Err((
            exit::WORK_FAILED,
            format!("{subject} failed: {code} {message} ({served} serves)"),
        ))),
        _ => None,
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
        let work = client.request(
            "GET",
            &format!("/namespaces/{ns}/agents/{agent}/work/{work_id}"),
            None,
        )?;
        let status = match client.request(
            "GET",
            &format!("/namespaces/{ns}/agents/{agent}/deployment-status"),
            None,
        ) {
            Ok(s) => s,
            Err(ClientError::Api { status: 404, .. }) if what == Waited::Delete => Value::Null,
            Err(e) => return Err(e.into()),
        };
        let state = work["state"].as_str().unwrap_or("-");
        let code = work["lastAttempt"]["code"].as_str().unwrap_or("");
        let message = work["lastAttempt"]["message"].as_str().unwrap_or("");
        let revision = work["revisionId"].as_str().unwrap_or("-");
        let line = if status.is_null() {
            format!("{label} {state} {code}")
        } else {
            let rev_status = status["revisions"]
                .as_array()
                .and_then(|revs| revs.iter().find(|r| r["id"] == work["revisionId"]))
                .and_then(|r| r["status"].as_str())
                .unwrap_or("-");
            format!(
                "{label}{} {state} {code} · desired {} · active {} · served {}{}",
                if what == Waited::Deploy {
                    format!(" {revision} ({rev_status})")
                } else {
                    String::new()
                },
                status["desiredState"].as_str().unwrap_or("-"),
                status["activeRevisionId"].as_str().unwrap_or("-"),
                status["servedRevisionId"].as_str().unwrap_or("-"),
                match work["attempts"].as_u64() {
                    Some(n) if n > 0 => format!(" · attempts {n}"),
                    _ => String::new(),
                },
            )
        };
        if line != last {
            super::out::note(&format!(
                "[{:>5.1}s] {agent}: {line}",
                start.elapsed().as_secs_f64()
            ));
            last = line;
        }
        let failure = match judge(what, agent, &work, &status) {
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
    use serde_json::json;

    use super::*;

    fn work(state: &str, code: &str, revision: &str) -> Value {
        json!({"state": state, "revisionId": revision, "lastAttempt": {"code": code, "message": "m"}})
    }

    fn status(desired: &str, active: Option<&str>, served: Option<&str>) -> Value {
        json!({"desiredState": desired, "activeRevisionId": active, "servedRevisionId": served})
    }

    /// A deploy whose revision was activated and then overtaken by a newer one before the
    /// wait looked is not "active and served": it exits 4 (it used to exit 0).
    #[test]
    fn an_activated_revision_overtaken_before_the_wait_looked_is_superseded() {
        let done = work("done", Code::RevisionActivated.as_str(), "rev-2-aaaaaaaa");
        let now = status("running", Some("rev-3-bbbbbbbb"), Some("rev-3-bbbbbbbb"));
        match judge(Waited::Deploy, "a1", &done, &now) {
            Some(Err((code, message))) => {
                assert_eq!(code, exit::SUPERSEDED);
                assert!(message.contains("rev-3-bbbbbbbb is active"), "{message}");
            }
            other => panic!("{other:?}"),
        }
        let served = status("running", Some("rev-2-aaaaaaaa"), Some("rev-2-aaaaaaaa"));
        assert_eq!(judge(Waited::Deploy, "a1", &done, &served), Some(Ok(())));
        // Active, but the host serves another revision: not "served" either.
        let other = status("running", Some("rev-2-aaaaaaaa"), Some("rev-1-cccccccc"));
        assert!(matches!(
            judge(Waited::Deploy, "a1", &done, &other),
            Some(Err((exit::SUPERSEDED, _)))
        ));
    }

    #[test]
    fn a_stop_overtaken_by_a_deploy_is_superseded_and_open_work_is_pending() {
        let stopped = work("done", Code::RevisionStopped.as_str(), "rev-2-aaaaaaaa");
        assert_eq!(
            judge(Waited::Stop, "a1", &stopped, &status("stopped", None, None)),
            Some(Ok(()))
        );
        assert!(matches!(
            judge(
                Waited::Stop,
                "a1",
                &stopped,
                &status("running", Some("rev-3-bbbbbbbb"), None)
            ),
            Some(Err((exit::SUPERSEDED, _)))
        ));
        let open = work("running", "", "rev-2-aaaaaaaa");
        assert_eq!(judge(Waited::Deploy, "a1", &open, &Value::Null), None);
        let failed = work(
            "failed",
            clawfleet_protocol::FailureCode::OwnershipMismatch.as_str(),
            "rev-2-aaaaaaaa",
        );
        assert!(matches!(
            judge(Waited::Deploy, "a1", &failed, &Value::Null),
            Some(Err((exit::WORK_FAILED, _)))
        ));
    }
}
