//! The one place that decides what a failure means for the work item that met it, as
//! kube-runtime's `error_policy` does for a controller: retry now, retry later (spending an
//! attempt of the budget or not, after which delay), fail, or end as overtaken. It reads the
//! failure's typed code ([`AnyCode`] and its class) and where in its work the failure came
//! ([`Stage`]); the worker and `deploy.rs` ask it and build no retry of their own.

use std::time::Duration;

use clawfleet_protocol::FailureCode;

use super::Step;
use crate::backend::CallError;
use crate::codes::{AnyCode, Code};
use crate::config::WorkerSettings;
use crate::store::{StoreError, Work};
use crate::worker::now_ms;

/// Where in its work a target's call failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// Before a deploy's commit point, or a stop or delete: a retryable failure spends an
    /// attempt and backs off with the attempts.
    BeforeCommit,
    /// After a deploy's commit point: the worker keeps finalizing until the convergence
    /// deadline without spending attempts, and shows `REVISION_FINALIZATION_INCOMPLETE`
    /// unless the code says what an operator must look at ([`Policy::is_progress`]).
    AfterCommit,
    /// The activation of a committed candidate. As [`Stage::AfterCommit`], except that a
    /// candidate that did not become ready (a runtime failure) spends an attempt, and the
    /// last attempt fails with the runtime failure's own code.
    Activation,
    /// A Namespace's ensure on one pool host, on the way to placing an Agent: a retryable
    /// failure spends an attempt and waits the initial backoff.
    HostNamespace,
    /// A Namespace on a cluster: retried while retryable, with a delay doubling with the
    /// item's age, for as long as it takes (no attempt budget, no convergence deadline).
    ClusterNamespace,
}

impl Stage {
    /// A deploy's call before or after its commit point.
    pub fn deploy(committed: bool) -> Self {
        if committed {
            Stage::AfterCommit
        } else {
            Stage::BeforeCommit
        }
    }
}

/// What a failure means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Try again at once: the state moved under the pass.
    RetryNow,
    /// Try again after `delay`; `counts`: it spends an attempt of the budget.
    RetryLater { counts: bool, delay: Duration },
    /// Finished without success.
    Fail,
    /// Something newer took the work's place: finished, not a failure of its own.
    Overtaken,
}

/// The worker's failure policy over its settings.
#[derive(Debug, Clone, Copy)]
pub struct Policy<'a> {
    pub settings: &'a WorkerSettings,
}

impl Policy<'_> {
    /// Retryable codes that say what an operator must look at (a cluster that cannot
    /// schedule, pull or admit the gateway, or whose API is down): deployment status shows
    /// them as they are rather than folding them into `REVISION_FINALIZATION_INCOMPLETE`.
    pub fn is_progress(code: AnyCode) -> bool {
        [
            FailureCode::RevisionUnschedulable,
            FailureCode::RevisionImagePullFailed,
            FailureCode::NamespacePodQuotaExceeded,
            FailureCode::RevisionIncomplete,
            FailureCode::KubernetesApiUnavailable,
        ]
        .iter()
        .any(|f| code == *f)
    }

    /// Backoff for failures: initial × 2^attempts, capped (`crate::backoff`).
    pub fn backoff(&self, attempts: u32) -> Duration {
        crate::backoff::exponential(
            self.settings.backoff_initial,
            self.settings.backoff_max,
            attempts,
        )
    }

    /// Readiness recheck interval, growing with the item's age.
    pub fn recheck(&self, work: &Work) -> Duration {
        let grown = self.settings.readiness_recheck + age(work) / 10;
        grown.min(self.settings.readiness_recheck_max)
    }

    /// A backoff doubling with the item's age (from `backoff_initial` to `backoff_max`).
    fn by_age(&self, work: &Work) -> Duration {
        let periods =
            (age(work).as_nanos() / self.settings.backoff_initial.as_nanos().max(1)).max(1);
        let doublings = 127 - periods.leading_zeros();
        crate::backoff::exponential(
            self.settings.backoff_initial,
            self.settings.backoff_max,
            doublings,
        )
    }

    /// What a failed call means in `phase`, with the step it ends the pass with.
    pub fn call_failed(&self, work: &Work, e: CallError, phase: Stage) -> Step {
        let code = e.code();
        let deploy = matches!(
            phase,
            Stage::BeforeCommit | Stage::AfterCommit | Stage::Activation
        );
        if let CallError::AuthenticationRefused { host } = &e
            && deploy
        {
            // With several coordinators on one database, this one may not be enrolled on the
            // host while the others are: the item goes back to the queue for them, spending
            // an attempt, so a fleet where none is enrolled still ends with this code.
            let message = format!(
                "{e}: this coordinator is not enrolled on {host} (run its `occ \
                 enrol-command` line there); the item is left for another coordinator"
            );
            let delay = self.backoff(work.attempts);
            return step(
                Verdict::RetryLater {
                    counts: true,
                    delay,
                },
                code,
                message,
            );
        }
        // The failure's own class decides (a target may say otherwise than its code's
        // default class). The overtaken codes (`SUPERSEDED`, `FENCE_STALE`) are answered
        // where they arise (`Worker::call_with`, the activation), each with its own step.
        if !e.is_retryable() {
            return step(Verdict::Fail, code, e.to_string());
        }
        match phase {
            Stage::HostNamespace => step(
                Verdict::RetryLater {
                    counts: true,
                    delay: self.settings.backoff_initial,
                },
                code,
                e.to_string(),
            ),
            Stage::ClusterNamespace => step(
                Verdict::RetryLater {
                    counts: false,
                    delay: self.by_age(work),
                },
                code,
                e.to_string(),
            ),
            Stage::BeforeCommit | Stage::AfterCommit | Stage::Activation => {
                let committed = phase != Stage::BeforeCommit;
                let shown = if committed && !Self::is_progress(code) {
                    Code::RevisionFinalizationIncomplete.into()
                } else {
                    code
                };
                let runtime =
                    phase == Stage::Activation && crate::evidence::is_runtime_failure(code);
                let message = format!("{e} ({code})");
                let tried = work.attempts + 1;
                if runtime && tried >= self.settings.max_attempts {
                    // The candidate did not become ready and nothing was restored: the last
                    // attempt fails with the runtime failure's code.
                    return step(
                        Verdict::Fail,
                        code,
                        format!("{message} (gave up after {tried} attempts)"),
                    );
                }
                // Before the commit, host failures use the attempt budget; after it, the
                // worker keeps finalizing until the convergence deadline, except for a
                // candidate that did not become ready. An unavailable Kubernetes API never
                // spends attempts.
                let counts =
                    (!committed || runtime) && code != FailureCode::KubernetesApiUnavailable;
                step(
                    Verdict::RetryLater {
                        counts,
                        delay: self.backoff(work.attempts),
                    },
                    shown,
                    message,
                )
            }
        }
    }

    /// What a failed store read or write means: a lost claim is overtaken (nothing more is
    /// ours to do or record), a row the store cannot decode fails the work (it does not mend
    /// itself), anything else is retried soon without spending an attempt.
    pub fn store_failed(e: StoreError) -> Step {
        match e {
            StoreError::ClaimLost { .. } => {
                step(Verdict::Overtaken, Code::ClaimLost.into(), e.to_string())
            }
            StoreError::Corrupt(_) => {
                step(Verdict::Fail, Code::InvalidStoredId.into(), e.to_string())
            }
            _ => step(
                Verdict::RetryLater {
                    counts: false,
                    delay: Duration::from_secs(1),
                },
                Code::StoreUnavailable.into(),
                e.to_string(),
            ),
        }
    }

    /// The work waits for something outside it (its Namespace to become ready, a host with
    /// room): rechecked with the item's age, spending no attempt.
    pub fn waiting(&self, work: &Work, code: Code, message: impl Into<String>) -> Step {
        step(
            Verdict::RetryLater {
                counts: false,
                delay: self.recheck(work),
            },
            code.into(),
            message.into(),
        )
    }

    /// The state moved under the pass (a compare-and-set lost): run it again at once.
    pub fn moved(code: AnyCode, message: impl Into<String>) -> Step {
        step(Verdict::RetryNow, code, message.into())
    }

    /// The work did not get where it goes yet (a stop still reports the gateway running, a
    /// pool host is not ready): retried with backoff, spending an attempt.
    pub fn not_yet(
        &self,
        work: &Work,
        code: impl Into<AnyCode>,
        message: impl Into<String>,
    ) -> Step {
        step(
            Verdict::RetryLater {
                counts: true,
                delay: self.backoff(work.attempts),
            },
            code.into(),
            message.into(),
        )
    }

    /// The attempt budget: an attempt-counting retry beyond it becomes a failure.
    pub fn budget(&self, work: &Work, step: Step) -> Step {
        match step {
            Step::Retry {
                code,
                message,
                attempt: true,
                ..
            } if work.attempts + 1 >= self.settings.max_attempts => Step::Failed {
                code,
                message: format!("{message} (gave up after {} attempts)", work.attempts + 1),
            },
            other => other,
        }
    }
}

/// How long the item has existed.
fn age(work: &Work) -> Duration {
    Duration::from_millis((now_ms() - work.created_at).max(0) as u64)
}

/// The step a verdict ends the pass with.
pub fn step(verdict: Verdict, code: AnyCode, message: String) -> Step {
    match verdict {
        Verdict::RetryNow => Step::Retry {
            code,
            message,
            attempt: false,
            delay: Duration::from_millis(10),
        },
        Verdict::RetryLater { counts, delay } => Step::Retry {
            code,
            message,
            attempt: counts,
            delay,
        },
        // An overtaken item ends failed when it is a lost claim (nothing of it is recorded,
        // see `Worker::record`), done otherwise.
        Verdict::Fail => Step::Failed { code, message },
        Verdict::Overtaken if code == Code::ClaimLost => Step::Failed { code, message },
        Verdict::Overtaken => Step::Done { code, message },
    }
}

#[cfg(test)]
mod tests {
    use clawfleet_protocol::Failure;

    use super::*;
    use crate::store::{Claim, WorkKind};

    fn work(attempts: u32) -> Work {
        Work {
            id: 1,
            kind: WorkKind::Deploy,
            namespace_id: "ns1".to_owned(),
            agent_id: Some("a1".to_owned()),
            revision_id: Some("rev-1-aaaaaaaa".to_owned()),
            attempts,
            created_at: now_ms(),
            claim: Claim { work: 1, token: 1 },
            fence: None,
        }
    }

    fn target(code: FailureCode) -> CallError {
        CallError::Failed(Failure::new(code, "m"))
    }

    /// (code, counts an attempt) of a retry, or the failure's code.
    fn outcome(s: &Step) -> Result<(&str, bool), &str> {
        match s {
            Step::Retry { code, attempt, .. } => Ok((code.as_str(), *attempt)),
            Step::Failed { code, .. } | Step::Done { code, .. } => Err(code.as_str()),
        }
    }

    #[test]
    fn a_retryable_call_counts_before_the_commit_and_finalizes_after_it() {
        let settings = WorkerSettings::default();
        let p = Policy {
            settings: &settings,
        };
        let w = work(0);
        let unreachable = || CallError::Transport {
            host: "h1".to_owned(),
            message: "refused".to_owned(),
        };
        let before = p.call_failed(&w, unreachable(), Stage::BeforeCommit);
        assert_eq!(outcome(&before), Ok((Code::HostUnreachable.as_str(), true)));
        let after = p.call_failed(&w, unreachable(), Stage::AfterCommit);
        assert_eq!(
            outcome(&after),
            Ok((Code::RevisionFinalizationIncomplete.as_str(), false))
        );
        // What an operator must look at is shown as it is; an unavailable Kubernetes API
        // never spends attempts.
        let pull = p.call_failed(
            &w,
            target(FailureCode::RevisionImagePullFailed),
            Stage::AfterCommit,
        );
        assert_eq!(
            outcome(&pull),
            Ok((FailureCode::RevisionImagePullFailed.as_str(), false))
        );
        let api = p.call_failed(
            &w,
            target(FailureCode::KubernetesApiUnavailable),
            Stage::BeforeCommit,
        );
        assert_eq!(
            outcome(&api),
            Ok((FailureCode::KubernetesApiUnavailable.as_str(), false))
        );
        // A permanent failure fails, with its own code.
        let mismatch = p.call_failed(
            &w,
            target(FailureCode::OwnershipMismatch),
            Stage::AfterCommit,
        );
        assert_eq!(
            outcome(&mismatch),
            Err(FailureCode::OwnershipMismatch.as_str())
        );
    }

    #[test]
    fn a_candidate_that_never_became_ready_spends_attempts_and_fails_with_its_code() {
        let settings = WorkerSettings::default();
        let p = Policy {
            settings: &settings,
        };
        let first = p.call_failed(
            &work(0),
            target(FailureCode::ReadinessTimeout),
            Stage::Activation,
        );
        assert_eq!(
            outcome(&first),
            Ok((Code::RevisionFinalizationIncomplete.as_str(), true))
        );
        let last = p.call_failed(
            &work(settings.max_attempts - 1),
            target(FailureCode::ReadinessTimeout),
            Stage::Activation,
        );
        assert_eq!(outcome(&last), Err(FailureCode::ReadinessTimeout.as_str()));
    }

    #[test]
    fn a_refused_login_is_left_to_another_coordinator_only_for_agent_work() {
        let settings = WorkerSettings::default();
        let p = Policy {
            settings: &settings,
        };
        let refused = || CallError::AuthenticationRefused {
            host: "h1".to_owned(),
        };
        let deploy = p.call_failed(&work(0), refused(), Stage::BeforeCommit);
        assert_eq!(outcome(&deploy), Ok((Code::HostAuthRefused.as_str(), true)));
        let ensure = p.call_failed(&work(0), refused(), Stage::HostNamespace);
        assert_eq!(outcome(&ensure), Err(Code::HostAuthRefused.as_str()));
        // A cluster Namespace is retried for as long as it takes.
        let cluster = p.call_failed(
            &work(50),
            target(FailureCode::KubernetesApiUnavailable),
            Stage::ClusterNamespace,
        );
        assert_eq!(
            outcome(&cluster),
            Ok((FailureCode::KubernetesApiUnavailable.as_str(), false))
        );
    }

    #[test]
    fn store_failures_are_overtaken_failed_or_retried_by_kind() {
        let lost = Policy::store_failed(StoreError::ClaimLost { work: 1, token: 2 });
        assert_eq!(outcome(&lost), Err(Code::ClaimLost.as_str()));
        let corrupt = Policy::store_failed(StoreError::Corrupt("agents.id".to_owned()));
        assert_eq!(outcome(&corrupt), Err(Code::InvalidStoredId.as_str()));
        let down = Policy::store_failed(StoreError::Unavailable("restart".to_owned()));
        assert_eq!(outcome(&down), Ok((Code::StoreUnavailable.as_str(), false)));
    }

    #[test]
    fn the_budget_turns_the_last_counted_retry_into_a_failure() {
        let settings = WorkerSettings::default();
        let p = Policy {
            settings: &settings,
        };
        let retry = || p.not_yet(&work(0), Code::StopIncomplete, "still running");
        assert_eq!(
            outcome(&p.budget(&work(0), retry())),
            Ok((Code::StopIncomplete.as_str(), true))
        );
        assert_eq!(
            outcome(&p.budget(&work(settings.max_attempts - 1), retry())),
            Err(Code::StopIncomplete.as_str())
        );
    }
}
