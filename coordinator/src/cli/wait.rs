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
    /// The command did what was asked (with `--wait`: the requested work converged).
    pub const OK: u8 = 0;
    /// The command failed: bad configuration, the API refused the request, or it was
    /// unreachable.
    pub const ERROR: u8 = 1;
    /// With `--wait`: the requested work failed (its code and message are printed).
    pub const WORK_FAILED: u8 = 3;
    /// With `--wait`: the request was overtaken before it took effect (a newer deploy, a
    /// stop, or the Agent meant to run again).
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

/// Follows one work item until it finishes, printing each change of its progress, and
/// returns the final deployment status (null once a deleted Agent is gone). A failed,
/// overtaken or timed-out item is an error carrying its exit code.
pub(crate) fn wait(
    client: &Client,
    ns: &str,
    agent: &str,
    work_id: i64,
    what: Waited,
    args: &WaitArgs,
) -> Result<Value> {
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
            eprintln!("[{:>5.1}s] {agent}: {line}", start.elapsed().as_secs_f64());
            last = line;
        }
        let subject = if what == Waited::Deploy {
            format!("{agent} {revision}")
        } else {
            format!("{label} of {agent}")
        };
        match state {
            "done" if converged_code(what, code) => return Ok(status),
            "done" => {
                let served = status["servedRevisionId"].as_str().unwrap_or("nothing");
                return Err(wait_failure(
                    exit::SUPERSEDED,
                    format!("{subject} was overtaken: {code} {message} ({served} serves)"),
                ));
            }
            "failed" => {
                let served = status["servedRevisionId"].as_str().unwrap_or("nothing");
                return Err(wait_failure(
                    exit::WORK_FAILED,
                    format!("{subject} failed: {code} {message} ({served} serves)"),
                ));
            }
            _ => {}
        }
        if start.elapsed() > Duration::from_secs(args.timeout) {
            return Err(wait_failure(
                exit::TIMED_OUT,
                format!(
                    "{subject} not finished after {} s (last: {code} {message})",
                    args.timeout
                ),
            ));
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}
