//! The typed rows the store reads and writes that are not part of the API's model
//! (`crate::model`): work items and their claims, tokens, and what an insert did.

use std::time::Duration;

use crate::model::Grant;

/// What inserting a Namespace did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NamespaceInsert {
    Inserted,
    /// A Namespace of that id exists.
    Exists,
    /// The pool would share `host` with `namespace`, and one of the two is single-tenant.
    HostShared {
        host: String,
        namespace: String,
    },
}

/// What creating a revision did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RevisionInsert {
    /// Created and queued: the deploy work's id.
    Queued(i64),
    /// Refused: the Agent belongs to this open rollout.
    InRollout(i64),
}

/// What inserting a rollout did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RolloutInsert {
    Created(i64),
    /// The Agent belongs to another open rollout.
    Busy {
        agent: String,
        rollout: i64,
    },
    /// The Agent does not exist or is being deleted.
    AgentUnavailable(String),
}

/// A rollout to insert: its settings and, per Agent in deploy order, its wave.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RolloutRow {
    pub namespace_id: String,
    pub subject: crate::model::RolloutSubject,
    pub canary: u32,
    pub max_parallel: u32,
    pub max_failures: u32,
    pub pause_between_seconds: u32,
    pub manual_promote: bool,
    pub created_by: String,
    pub agents: Vec<(String, u32)>,
    /// Seconds since the epoch.
    pub now: i64,
}

/// A live (not revoked) token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenRow {
    pub id: String,
    pub grants: Vec<Grant>,
    /// Seconds since the epoch after which the token is refused; `None`: never.
    pub expires_at: Option<i64>,
}

/// A token to store: its id, name, the hash of its secret, its grants and optional expiry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewTokenRow<'a> {
    pub id: &'a str,
    pub name: &'a str,
    pub secret_hash: &'a str,
    pub grants: &'a [Grant],
    /// Seconds since the epoch.
    pub created_at: i64,
    pub expires_at: Option<i64>,
}

/// One claim on a work item. Only the holder of the current token may publish the item's
/// result, move its revision, or write audit for it: every such write names the claim and is
/// refused with [`super::StoreError::ClaimLost`] once another claim replaced it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Claim {
    pub work: i64,
    /// Bumped by every claim of the item.
    pub token: i64,
}

impl Claim {
    /// The refusal of a write on behalf of this claim once another replaced it.
    pub fn lost(&self) -> super::StoreError {
        super::StoreError::ClaimLost {
            work: self.work,
            token: self.token,
        }
    }
}

/// A unit of deployment work, as claimed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Work {
    pub id: i64,
    pub kind: WorkKind,
    pub namespace_id: String,
    pub agent_id: Option<String>,
    pub revision_id: Option<String>,
    pub attempts: u32,
    /// Milliseconds since the epoch.
    pub created_at: i64,
    pub claim: Claim,
    /// The Agent's fence after this claim bumped it (Agent-scoped work whose Agent exists):
    /// operations carry it so a target refuses anything older once a later claim moved on.
    pub fence: Option<u64>,
}

/// Work to put in the queue. Every change of desired state names the work it queues, and the
/// store writes both in one transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Enqueue {
    pub kind: WorkKind,
    pub namespace_id: String,
    pub agent_id: Option<String>,
    pub revision_id: Option<String>,
}

impl Enqueue {
    pub fn namespace(kind: WorkKind, ns: &str) -> Self {
        Self {
            kind,
            namespace_id: ns.to_owned(),
            agent_id: None,
            revision_id: None,
        }
    }

    pub fn agent(kind: WorkKind, ns: &str, agent: &str) -> Self {
        Self {
            kind,
            namespace_id: ns.to_owned(),
            agent_id: Some(agent.to_owned()),
            revision_id: None,
        }
    }

    pub fn deploy(ns: &str, agent: &str, revision: &str) -> Self {
        Self {
            kind: WorkKind::Deploy,
            namespace_id: ns.to_owned(),
            agent_id: Some(agent.to_owned()),
            revision_id: Some(revision.to_owned()),
        }
    }
}

/// How a claimed item ends one pass: finished (done or failed), or back in the queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WorkEnd<'a> {
    Finished {
        state: WorkState,
        code: &'a str,
        message: &'a str,
    },
    Requeued {
        delay: Duration,
        count_attempt: bool,
        code: &'a str,
        message: &'a str,
    },
}

/// What an end writes, derived once for both stores: the item's new state, its code and
/// message (also the revision's newest attempt), the delay before a requeued item is due, and
/// whether the pass counts as one of the item's attempts (and so of its revision's: a
/// revision's count is the sum of what the items that served it counted).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EndRow<'a> {
    pub state: WorkState,
    pub code: &'a str,
    pub message: &'a str,
    /// Zero for a finished item (its `not_before` stays).
    pub delay: Duration,
    /// A failure always counts; a requeue when it says so.
    pub counts_attempt: bool,
}

impl<'a> WorkEnd<'a> {
    pub fn row(&self) -> EndRow<'a> {
        match *self {
            WorkEnd::Finished {
                state,
                code,
                message,
            } => EndRow {
                state,
                code,
                message,
                delay: Duration::ZERO,
                counts_attempt: state == WorkState::Failed,
            },
            WorkEnd::Requeued {
                delay,
                count_attempt,
                code,
                message,
            } => EndRow {
                state: WorkState::Queued,
                code,
                message,
                delay,
                counts_attempt: count_attempt,
            },
        }
    }
}

// The work queue's kinds and states and the work item as the API shows it are part of the API
// contract.
pub use clawfleet_api::model::{LastAttempt, WorkKind, WorkRecord, WorkState};

/// The leader lease as one coordinator sees it after `lead` (`leader::Leadership` is the
/// running flag derived from it): the singleton loops (drift sweeps, rollout
/// scheduling, retention) run only while `is_leader`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseHeld {
    pub holder: String,
    /// Bumped whenever the lease changes hands.
    pub term: i64,
    pub is_leader: bool,
}

/// What a retention pass removed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Pruned {
    pub work: u64,
    pub audit: u64,
}

/// A rollout's subject as its columns: configuration id and generation (`''` and 0 for a
/// secret's rollout, migration 16), secret name and version (`NULL` for a Configuration's).
pub(crate) fn subject_columns(
    s: &crate::model::RolloutSubject,
) -> (&str, u32, Option<&str>, Option<u32>) {
    match s {
        crate::model::RolloutSubject::Configuration { id, generation } => {
            (id.as_str(), *generation, None, None)
        }
        crate::model::RolloutSubject::Secret { name, version } => {
            ("", 0, Some(name.as_str()), Some(*version))
        }
    }
}
