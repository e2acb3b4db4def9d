//! The state store: one trait per aggregate (hosts, clusters, Namespaces, Configurations,
//! Agents, revisions, the work queue, tokens, audit, drift, rollouts, workspace files, secrets,
//! the leader lease), and [`Store`], all of them at once. Two implementations fill it:
//! [`sqlite`] (the embedded default, one coordinator) and [`postgres`] (several coordinators
//! on one database). Both run the same versioned migrations and pass one test suite
//! (`store/src/suite.rs`, built with the `suite` feature, run by
//! `coordinator/tests/in_process/store_suite.rs`).
//!
//! Every method is one atomic change or one consistent read. Writes that the worker makes on
//! behalf of a claimed work item name the [`Claim`], and the store refuses them with
//! [`StoreError::ClaimLost`] once another claim replaced it, so a paused or partitioned
//! coordinator can never publish over a newer one.
//!
//! Callers bring the traits into scope with `use clawfleet_store::prelude::*`.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use clawfleet_protocol::egress::Egress;
use clawfleet_protocol::workspace::WorkspaceFile;
use clawfleet_protocol::{Ident, SecretName};
use serde_json::Value;
use thiserror::Error;

use crate::model::{
    Agent, AuditEvent, Cluster, ClusterRecord, Configuration, DesiredState, DriftRow, Host,
    Namespace, RestorePolicy, Revision, RevisionStatus, Rollout, RolloutAgentState, RolloutState,
    SecretValue, SecretVersion, WorkspaceSetupInfo, WorkspaceState,
};

pub mod clock;
pub mod copy;
pub mod database;
pub mod model;
pub mod postgres;
pub mod rekey;
pub(crate) mod rows;
pub mod seal;
pub mod sqlite;
#[cfg(feature = "suite")]
pub mod suite;

pub use crate::model::{DriftReason, DriftState};
pub use database::Database;
pub use rows::{
    Claim, Enqueue, LastAttempt, LeaseHeld, NamespaceInsert, NewTokenRow, Pruned, RevisionInsert,
    RolloutInsert, RolloutRow, TokenRow, Work, WorkEnd, WorkKind, WorkRecord, WorkState,
};

/// A store failure.
#[derive(Debug, Error)]
pub enum StoreError {
    /// The database cannot be reached right now (connection refused or lost, a restart, a
    /// busy timeout): retry later; nothing was written.
    #[error("the database is unavailable: {0}")]
    Unavailable(String),
    #[error("database error: {0}")]
    Database(String),
    #[error("stored data is not valid: {0}")]
    Corrupt(String),
    #[error("the database schema is version {found}, newer than this coordinator ({known})")]
    TooNew { found: i64, known: i64 },
    /// Another claim replaced this one (its lease lapsed and someone else took the item):
    /// nothing was written.
    #[error("work item {work} is no longer claimed by this coordinator (claim token {token})")]
    ClaimLost { work: i64, token: i64 },
    #[error("{0}")]
    Config(String),
    /// A sealed value does not open with this coordinator's key (`store/src/seal.rs`).
    #[error("{0}")]
    Key(String),
}

impl StoreError {
    /// True for failures that a retry may get past without anyone changing anything.
    pub fn is_transient(&self) -> bool {
        matches!(self, StoreError::Unavailable(_))
    }
}

pub type Result<T> = std::result::Result<T, StoreError>;

/// The store as the rest of the coordinator holds it.
pub type SharedStore = Arc<dyn Store>;

/// The id of revision `number` (see [`Revision::id_for`]), as both stores allocate it.
pub fn revision_id(number: u64, configuration_hash: &str) -> Result<Ident> {
    Revision::id_for(number, configuration_hash).map_err(|e| {
        StoreError::Corrupt(format!(
            "configuration hash {configuration_hash:?} makes no revision id: {e}"
        ))
    })
}

/// A deploy request's audit record (action, target, detail), written by both stores in the
/// request's transaction.
pub(crate) fn deploy_audit(r: &Revision, work: i64) -> (&'static str, String, Value) {
    (
        "agent.deploy",
        format!("{}/{}", r.namespace_id, r.agent_id),
        serde_json::json!({"revisionId": r.id, "number": r.number, "workId": work}),
    )
}

/// Opens a sealed value and checks it against its recorded fingerprint (both stores).
pub(crate) fn open_secret(
    sealer: &seal::Sealer,
    ns: &str,
    name: &str,
    version: u32,
    fingerprint: clawfleet_protocol::SecretFingerprint,
    sealed: &[u8],
) -> Result<SecretValue> {
    let value =
        zeroize::Zeroizing::new(sealer.open(&seal::secret_context(ns, name, version), sealed)?);
    if clawfleet_protocol::SecretFingerprint::of(&value) != fingerprint {
        return Err(StoreError::Corrupt(format!(
            "secret {ns}/{name} version {version}: the value does not match its fingerprint {fingerprint}"
        )));
    }
    Ok(SecretValue { value, fingerprint })
}

/// A revision's secret versions as both stores keep them: JSON text.
pub(crate) fn secrets_text(secrets: &[model::SecretBinding]) -> Result<String> {
    serde_json::to_string(secrets).map_err(|e| StoreError::Corrupt(e.to_string()))
}

/// The secret versions read back from [`secrets_text`]'s column.
pub(crate) fn secrets_of(text: &str) -> Result<Vec<model::SecretBinding>> {
    serde_json::from_str(text).map_err(|e| StoreError::Corrupt(format!("revisions.secrets: {e}")))
}

/// Why a typed column cannot be read back, in both stores' words: the column, what it holds
/// and what is wrong with that.
pub(crate) fn bad_column(column: &str, text: &str, why: &dyn std::fmt::Display) -> String {
    format!("column {column} holds {text:?}, which {why}")
}

/// `('a', 'b')`: stored texts (states, kinds) as an SQL list, from their one enum.
/// A host's jump host as both stores keep it: its typed record as JSON text.
pub(crate) fn jump_text(h: &Host) -> Result<Option<String>> {
    h.jump
        .as_ref()
        .map(|j| serde_json::to_string(j).map_err(|e| StoreError::Corrupt(e.to_string())))
        .transpose()
}

/// The jump host read back from [`jump_text`]'s column.
pub(crate) fn jump_of(text: Option<String>) -> Result<Option<model::Jump>> {
    text.map(|t| {
        serde_json::from_str(&t).map_err(|e| StoreError::Corrupt(format!("hosts.jump: {e}")))
    })
    .transpose()
}

/// An Agent's egress settings as both stores keep them: JSON text, NULL for none.
pub(crate) fn egress_text(egress: Option<&Egress>) -> Result<Option<String>> {
    egress
        .map(|e| serde_json::to_string(e).map_err(|e| StoreError::Corrupt(e.to_string())))
        .transpose()
}

/// The egress settings read back from [`egress_text`]'s column (decoding checks them again).
pub(crate) fn egress_of(text: Option<String>) -> Result<Option<Egress>> {
    text.map(|t| {
        serde_json::from_str(&t).map_err(|e| StoreError::Corrupt(format!("agents.egress: {e}")))
    })
    .transpose()
}

pub(crate) fn sql_list<'a>(items: impl IntoIterator<Item = &'a str>) -> String {
    let quoted: Vec<String> = items.into_iter().map(|s| format!("'{s}'")).collect();
    format!("({})", quoted.join(", "))
}

/// `('ensure-namespace', …)`: the barrier kinds as an SQL list (both stores' claims).
pub(crate) fn barrier_list() -> String {
    sql_list(WorkKind::BARRIERS.iter().map(|k| k.as_str()))
}

/// Opens (creating and migrating as needed) the database the configuration names, sealing
/// secrets with the key in `key_file` (`store/src/seal.rs`).
pub async fn open(database: &Database, key_file: &std::path::Path) -> Result<SharedStore> {
    let sealer = Arc::new(seal::Sealer::load(key_file)?);
    match database {
        Database::Sqlite(path) => Ok(Arc::new(sqlite::SqliteStore::open_sealed(path, sealer)?)),
        Database::Postgres(settings) => Ok(Arc::new(
            postgres::PostgresStore::connect_sealed(settings.clone(), sealer).await?,
        )),
    }
}

/// Every trait of the store, for `use crate::prelude::*`.
pub mod prelude {
    pub use super::{
        AgentStore, AuditLog, ClusterStore, ConfigurationStore, DriftStore, HostStore, LeaderLease,
        NamespaceStore, RevisionStore, RolloutStore, SecretStore, Store, StoreMeta, TokenStore,
        WorkQueue, WorkspaceStore,
    };
}

/// Enrolled hosts and their pinned keys.
#[async_trait]
pub trait HostStore: Send + Sync {
    /// False if the name exists.
    async fn insert_host(&self, h: &Host) -> Result<bool>;
    /// Re-pins a host (clears its last probe); false if it does not exist.
    async fn update_host(&self, h: &Host) -> Result<bool>;
    /// Removes a host that no Namespace pool and no Agent uses; `None` if it does not exist,
    /// `Some(false)` if it is still in use.
    async fn delete_host(&self, name: &str) -> Result<Option<bool>>;
    async fn host(&self, name: &str) -> Result<Option<Host>>;
    async fn hosts(&self) -> Result<Vec<Host>>;
    async fn set_host_probe(&self, name: &str, probe: &Value) -> Result<()>;
    /// Agents placed on a host (not deleted).
    async fn agents_on_host(&self, name: &str) -> Result<u32>;
    /// Those of `names` that are enrolled, each with its Agent count, in `names`' order:
    /// placement's one read of a pool instead of two per host.
    async fn host_loads(&self, names: &[String]) -> Result<Vec<(Host, u32)>>;
}

/// Registered Kubernetes clusters.
#[async_trait]
pub trait ClusterStore: Send + Sync {
    /// False if the name exists.
    async fn insert_cluster(&self, c: &ClusterRecord) -> Result<bool>;
    /// A cluster with its credentials (for the backend only; never for the API).
    async fn cluster(&self, name: &str) -> Result<Option<ClusterRecord>>;
    /// Replaces a cluster's server, credentials, settings and last probe (its name and
    /// creation time stay); false if it does not exist.
    async fn update_cluster(&self, c: &ClusterRecord) -> Result<bool>;
    /// Every cluster, without credentials.
    async fn clusters(&self) -> Result<Vec<Cluster>>;
    /// Removes a cluster no Namespace uses; `None` if it does not exist, `Some(false)` if it
    /// is in use.
    async fn delete_cluster(&self, name: &str) -> Result<Option<bool>>;
}

/// Namespaces and their pools.
#[async_trait]
pub trait NamespaceStore: Send + Sync {
    /// Inserts a Namespace on a host pool (`hosts`) or on one cluster, with the work that
    /// makes it ready on its targets. Refused, with nothing written, when the id exists or the
    /// pool would share a host with a single-tenant Namespace (or, for a single-tenant one,
    /// with any other Namespace). `created_at` in seconds.
    #[allow(clippy::too_many_arguments)]
    async fn insert_namespace(
        &self,
        id: &str,
        name: &str,
        hosts: &[String],
        cluster: Option<&str>,
        single_tenant: bool,
        created_at: i64,
        then: &Enqueue,
    ) -> Result<NamespaceInsert>;
    async fn namespace(&self, id: &str) -> Result<Option<Namespace>>;
    async fn namespaces(&self) -> Result<Vec<Namespace>>;
    /// Marks a Namespace for deletion and queues `then`, if it has no Agents; false (nothing
    /// written) if it has some.
    async fn mark_namespace_deleting(&self, id: &str, then: &Enqueue) -> Result<bool>;
    async fn set_namespace_cluster_ready(&self, claim: &Claim, ns: &str, ready: bool)
    -> Result<()>;
    async fn set_namespace_host_ready(
        &self,
        claim: &Claim,
        ns: &str,
        host: &str,
        ready: bool,
    ) -> Result<()>;
    async fn delete_namespace_row(&self, claim: &Claim, id: &str) -> Result<()>;
}

/// Configuration generations.
#[async_trait]
pub trait ConfigurationStore: Send + Sync {
    /// Adds a generation; returns its number. `expect_new` refuses an existing id (and
    /// otherwise a missing one): `None`, nothing written.
    async fn put_configuration(
        &self,
        ns: &str,
        id: &str,
        document: &Value,
        expect_new: bool,
        now: i64,
    ) -> Result<Option<u32>>;
    /// One generation of a Configuration (`None`: the latest).
    async fn configuration_at(
        &self,
        ns: &Ident,
        id: &Ident,
        generation: Option<u32>,
    ) -> Result<Option<Configuration>>;
    async fn configuration(&self, ns: &Ident, id: &Ident) -> Result<Option<Configuration>> {
        self.configuration_at(ns, id, None).await
    }
}

/// Agents: desired state, placement, the active revision and what the target reports.
#[async_trait]
pub trait AgentStore: Send + Sync {
    /// Inserts an Agent with its initial workspace files (possibly none) in one transaction;
    /// false (and nothing written) when the Agent exists.
    async fn insert_agent(&self, a: &Agent, files: &[WorkspaceFile], now: i64) -> Result<bool>;
    async fn agent(&self, ns: &str, id: &str) -> Result<Option<Agent>>;
    async fn agents(&self, ns: &str) -> Result<Vec<Agent>>;
    /// At most `limit` of a Namespace's Agents whose id sorts after `after` (bytewise), in
    /// that order: one page of the list, read by key.
    async fn agents_after(&self, ns: &str, after: Option<&str>, limit: u32) -> Result<Vec<Agent>>;
    async fn set_agent_restore(&self, ns: &str, id: &str, restore: RestorePolicy) -> Result<()>;
    /// Sets the Agent's own egress settings (`None`: its target's).
    async fn set_agent_egress(&self, ns: &str, id: &str, egress: Option<&Egress>) -> Result<()>;
    async fn set_agent_configuration(
        &self,
        ns: &str,
        id: &str,
        configuration_id: &str,
    ) -> Result<()>;
    /// Sets the desired state and, in the same transaction, queues `then` (the work that
    /// realises it); returns the queued work's id.
    async fn set_desired(
        &self,
        ns: &str,
        id: &str,
        desired: DesiredState,
        then: Option<&Enqueue>,
    ) -> Result<Option<i64>>;
    /// Places an Agent that has no host yet on the least loaded of `candidates` with room
    /// (the rule of [`least_loaded_of`]: fewest Agents, then the order
    /// given), choosing and placing in one write. Returns the host the Agent is placed on
    /// afterwards; `None` while it has none (no candidate has room).
    async fn place_agent(
        &self,
        claim: &Claim,
        ns: &str,
        id: &str,
        candidates: &[String],
    ) -> Result<Option<Host>>;
    async fn set_agent_observed(
        &self,
        claim: &Claim,
        ns: &str,
        id: &str,
        port: Option<u16>,
        served: Option<&str>,
    ) -> Result<()>;
    /// Compare-and-set of the active revision; true if it was `expected` and is now `new`.
    async fn cas_active_revision(
        &self,
        claim: &Claim,
        ns: &str,
        id: &str,
        expected: Option<&str>,
        new: Option<&str>,
    ) -> Result<bool>;
    async fn delete_agent_row(&self, claim: &Claim, ns: &str, id: &str) -> Result<()>;
}

/// Immutable revisions and their progress.
#[async_trait]
pub trait RevisionStore: Send + Sync {
    /// Creates the next revision of an Agent and queues its deployment; desired becomes
    /// running. The number (and the id derived from it) is allocated inside the same
    /// transaction, so concurrent deploys of one Agent get distinct numbers. Refused (nothing
    /// written) while the Agent belongs to an open rollout.
    async fn create_revision(&self, r: &mut Revision) -> Result<RevisionInsert>;
    /// [`RevisionStore::create_revision`] and its audit event (`agent.deploy` by `actor`,
    /// naming the revision, its number and the work) in one transaction: one commit per
    /// deploy request.
    async fn create_revision_audited(
        &self,
        r: &mut Revision,
        actor: &str,
        now: i64,
    ) -> Result<RevisionInsert>;
    async fn revision(&self, ns: &str, agent: &str, id: &str) -> Result<Option<Revision>>;
    /// Every revision of an Agent, oldest first.
    async fn revisions(&self, ns: &str, agent: &str) -> Result<Vec<Revision>>;
    /// The number the Agent's next revision would get (for plans): after every number issued
    /// and after the Agent's revision floor.
    async fn next_revision_number(&self, ns: &str, agent: &str) -> Result<u64>;
    /// Raises the Agent's revision floor to `number` (never lowers it): a target serves or
    /// holds revision `number` that this database did not issue, as after a restore from an
    /// older backup, so the next revision is numbered above it.
    async fn raise_revision_floor(
        &self,
        claim: &Claim,
        ns: &str,
        agent: &str,
        number: u64,
    ) -> Result<()>;
    /// Records (or with `None` clears) the evidence of a revision's failed activation.
    async fn set_runtime_failure(
        &self,
        claim: &Claim,
        ns: &str,
        agent: &str,
        id: &str,
        evidence: Option<&model::RuntimeFailure>,
    ) -> Result<()>;
    async fn set_revision_status(
        &self,
        claim: &Claim,
        ns: &str,
        agent: &str,
        id: &str,
        status: RevisionStatus,
    ) -> Result<()>;
    /// Records that a prepare of the revision is about to be sent to a target (before it is
    /// sent, so a crash in between errs towards a host call at retirement).
    async fn mark_revision_staged(
        &self,
        claim: &Claim,
        ns: &str,
        agent: &str,
        id: &str,
    ) -> Result<()>;
    /// Retires, in the store alone and in one write, every revision of the Agent numbered
    /// below `below` that was never staged on a target (nothing of it is there to remove);
    /// how many.
    async fn retire_unstaged(
        &self,
        claim: &Claim,
        ns: &str,
        agent: &str,
        below: u64,
    ) -> Result<u64>;
    /// A successful activation's record in one write: the revision is `active`, and the
    /// Agent's observed port (kept when `None`) and served revision are what the target
    /// answered.
    async fn set_activated(
        &self,
        claim: &Claim,
        ns: &str,
        agent: &str,
        id: &str,
        port: Option<u16>,
        served: Option<&str>,
    ) -> Result<()>;
    /// The commit point: compare-and-set of `activeRevisionId` from `expected` to `candidate`,
    /// and in the same transaction the candidate becomes `activating` and the revision it
    /// replaces (if it was active) `superseded`. False if the active revision was not
    /// `expected`.
    async fn commit_revision(
        &self,
        claim: &Claim,
        ns: &str,
        agent: &str,
        expected: Option<&str>,
        candidate: &str,
    ) -> Result<bool>;
}

/// The work queue. Lanes: at most one item of an Agent runs at once, and a Namespace-level
/// item runs alone in its Namespace; a barrier kind (`WorkKind::BARRIERS`) holds its lane
/// until it finishes.
#[async_trait]
pub trait WorkQueue: Send + Sync {
    /// Queues work on its own (a reconcile of an existing revision); its id.
    async fn enqueue(&self, work: &Enqueue) -> Result<i64>;
    /// Claims up to `max` runnable items under a lease, in queue order, in one transaction:
    /// queued and due, or running with a lapsed lease (its worker died or lost the
    /// database). Each gets a fresh claim token, and for Agent-scoped work the Agent's fence
    /// is bumped, in the same transaction; no two claimed items share a lane. Fewer than
    /// `max` (or none) when no more are runnable now.
    async fn claim_batch(&self, owner: &str, lease: Duration, max: usize) -> Result<Vec<Work>>;
    /// Claims the next runnable item, as [`WorkQueue::claim_batch`] claims one.
    async fn claim_work(&self, owner: &str, lease: Duration) -> Result<Option<Work>> {
        Ok(self.claim_batch(owner, lease, 1).await?.pop())
    }
    /// Extends the claim's lease; false if another claim replaced it.
    async fn renew_lease(&self, claim: &Claim, lease: Duration) -> Result<bool>;
    /// Finishes the item or puts it back; false (nothing written) if the claim was replaced.
    /// For revision work the end is also the revision's newest attempt (code, message, time,
    /// one more attempt), and a failure its status: one commit per item's end.
    async fn end_work(&self, claim: &Claim, end: WorkEnd<'_>) -> Result<bool>;
    /// Notes what a claimed item is doing while a call of it has not answered yet (code and
    /// message on the item and, for revision work, as the revision's newest attempt, its
    /// count and status unchanged), so status shows the step in flight; false (nothing
    /// written) if the claim was replaced. The item's end overwrites the note.
    async fn note_work(&self, claim: &Claim, code: &str, message: &str) -> Result<bool>;
    /// Open work for an Agent (for deployment status), oldest first.
    async fn open_work(&self, ns: &str, agent: &str) -> Result<Vec<WorkRecord>>;
    /// The newest work items of an Agent, finished or not, newest first.
    async fn recent_work(&self, ns: &str, agent: &str, limit: u32) -> Result<Vec<WorkRecord>>;
    async fn work_item(&self, ns: &str, agent: &str, id: i64) -> Result<Option<WorkRecord>>;
    /// The newest Namespace-level work items (ensure, delete), newest first: Namespace status
    /// shows why its pool or cluster is not ready.
    async fn namespace_work(&self, ns: &str, limit: u32) -> Result<Vec<WorkRecord>>;
    /// Work queued or running, and when the oldest of it was created (milliseconds).
    async fn pending_work_age(&self) -> Result<(i64, Option<i64>)>;
    async fn pending_work(&self) -> Result<i64> {
        Ok(self.pending_work_age().await?.0)
    }
    /// Work counts by kind and state (for /metrics).
    async fn work_counts(&self) -> Result<Vec<(String, String, i64)>>;
    /// Resolves when work was queued or finished, here or (on a shared database) by another
    /// coordinator, since the last wait.
    async fn work_changed(&self);
    /// Tells a waiting worker in this process that the queue changed.
    fn wake_worker(&self);
}

/// API tokens and their grants.
#[async_trait]
pub trait TokenStore: Send + Sync {
    async fn create_token(&self, t: &NewTokenRow<'_>) -> Result<()>;
    /// The token for a secret's hash, if it exists and is not revoked.
    async fn token_by_hash(&self, secret_hash: &str) -> Result<Option<TokenRow>>;
    /// Revokes a token; false if there was none.
    async fn revoke_token(&self, id: &str) -> Result<bool>;
    async fn token_count(&self) -> Result<i64>;
    /// Records a plan token as applied; false (nothing written) if it was already: one
    /// statement, so two applies racing cannot both get true.
    async fn consume_plan_token(&self, token: &str, now: i64) -> Result<bool>;
}

/// The audit trail.
#[async_trait]
pub trait AuditLog: Send + Sync {
    /// One event (time in seconds).
    async fn audit(
        &self,
        actor: &str,
        action: &str,
        target: &str,
        detail: &Value,
        now: i64,
    ) -> Result<()>;
    /// One event written for a claimed work item: refused once the claim was replaced.
    #[allow(clippy::too_many_arguments)]
    async fn audit_work(
        &self,
        claim: &Claim,
        actor: &str,
        action: &str,
        target: &str,
        detail: &Value,
        now: i64,
    ) -> Result<()>;
    /// The newest audit events, optionally of one action only.
    async fn audit_events_of(&self, limit: u32, action: Option<&str>) -> Result<Vec<AuditEvent>>;
    async fn audit_events(&self, limit: u32) -> Result<Vec<AuditEvent>> {
        self.audit_events_of(limit, None).await
    }
}

/// The drift sweep's findings.
#[async_trait]
pub trait DriftStore: Send + Sync {
    /// Replaces every drift row of one target with a sweep's findings, in one transaction.
    async fn replace_drift(&self, target: &str, rows: &[DriftRow]) -> Result<()>;
    /// Drops the rows of targets no sweep covers any more (a forgotten host or cluster).
    async fn retain_drift_targets(&self, targets: &[String]) -> Result<()>;
    /// Every drift row, by target, Namespace and Agent.
    async fn drift(&self) -> Result<Vec<DriftRow>>;
}

/// Rollouts and their Agents. A rollout's open state (`running`, `paused`, `waiting`) owns
/// its Agents that are not done yet: [`RevisionStore::create_revision`] refuses an ordinary
/// deploy of them inside the transaction that would write it.
#[async_trait]
pub trait RolloutStore: Send + Sync {
    /// Inserts a rollout in state `running`, refused (nothing written) if an Agent is missing,
    /// being deleted, or in another open rollout.
    async fn insert_rollout(&self, r: &RolloutRow) -> Result<RolloutInsert>;
    async fn rollout(&self, ns: &str, id: i64) -> Result<Option<Rollout>>;
    /// A Namespace's newest rollouts, newest first.
    async fn rollouts(&self, ns: &str, limit: u32) -> Result<Vec<Rollout>>;
    /// Open rollouts, and finished ones whose last deploys are still in flight.
    async fn rollouts_to_advance(&self) -> Result<Vec<Rollout>>;
    /// Rollouts per state (for /metrics).
    async fn rollout_counts(&self) -> Result<Vec<(String, i64)>>;
    /// The open rollout the Agent belongs to, if any.
    async fn open_rollout_of(&self, ns: &str, agent: &str) -> Result<Option<i64>>;
    /// Compare-and-set of a rollout's state, wave and next-wave time: true if it was in
    /// `expected` (state and wave) and now holds the new values.
    #[allow(clippy::too_many_arguments)]
    async fn set_rollout(
        &self,
        id: i64,
        expected: (RolloutState, u32),
        state: RolloutState,
        wave: u32,
        next_wave_at_ms: Option<i64>,
        message: Option<&str>,
        now: i64,
    ) -> Result<bool>;
    /// The raw next-wave time in milliseconds (the API shows seconds).
    async fn rollout_next_wave_ms(&self, id: i64) -> Result<Option<i64>>;
    /// Starts one pending Agent of a running rollout: the Agent moves to the rollout's
    /// Configuration, its next revision is inserted with its deploy work, and the rollout
    /// records both, in one transaction. `None` (nothing written) if the rollout is no longer
    /// running or the Agent no longer pending.
    async fn start_rollout_deploy(&self, rollout: i64, rev: &mut Revision) -> Result<Option<i64>>;
    /// Moves one Agent of a rollout from `from` to a final state with its code; false if it
    /// was not in `from`.
    async fn finish_rollout_agent(
        &self,
        rollout: i64,
        agent: &str,
        from: RolloutAgentState,
        state: RolloutAgentState,
        outcome: (&str, &str),
        now: i64,
    ) -> Result<bool>;
    /// Marks every pending Agent of a rollout skipped (it halted or was aborted).
    async fn skip_pending_rollout_agents(
        &self,
        rollout: i64,
        outcome: (&str, &str),
        now: i64,
    ) -> Result<usize>;
}

/// Initial workspace files: their setup state and, until dropped, their contents.
#[async_trait]
pub trait WorkspaceStore: Send + Sync {
    /// The Agent's workspace setup, or `None` when it was created without files.
    async fn workspace_setup(&self, ns: &str, agent: &str) -> Result<Option<WorkspaceSetupInfo>>;
    /// The contents still held, in name order (empty once dropped).
    async fn workspace_contents(&self, ns: &str, agent: &str) -> Result<Vec<WorkspaceFile>>;
    /// Records the target's answer: applied (at `now`, unless already recorded) or failed.
    async fn set_workspace_state(
        &self,
        claim: &Claim,
        ns: &str,
        agent: &str,
        state: WorkspaceState,
        failure: Option<(&str, &str)>,
        now: i64,
    ) -> Result<()>;
    /// Forgets the contents (names, sizes and digests stay) so the bytes are gone from the
    /// database's files too; the number of files dropped.
    async fn drop_workspace_contents(&self, claim: &Claim, ns: &str, agent: &str) -> Result<usize>;
}

/// Secrets of a Namespace: every write a new version, each value sealed with the
/// key-encryption key (`store/src/seal.rs`, associated data [`seal::secret_context`]), so the
/// database holds ciphertext, the fingerprint and who wrote it when; never a value in clear.
/// Only [`SecretStore::secret_value`] opens a value, for the worker that delivers it.
#[async_trait]
pub trait SecretStore: Send + Sync {
    /// Writes the next version of a secret (1 for a name never written in the Namespace,
    /// else one more than the last version ever issued, deleted ones included), and its audit
    /// event (`secret.set` by `actor`, naming the version and fingerprint, never the value),
    /// in one transaction. The caller checked the value (`clawfleet_protocol::secret`).
    /// `None` (nothing written) when the Namespace does not exist or is being deleted.
    async fn put_secret(
        &self,
        ns: &str,
        name: &SecretName,
        value: &[u8],
        actor: &str,
        now: i64,
    ) -> Result<Option<SecretVersion>>;
    /// Every version of every secret of a Namespace, by name then version.
    async fn secrets(&self, ns: &str) -> Result<Vec<SecretVersion>>;
    /// Every version of one secret, oldest first (empty: no such secret).
    async fn secret_versions(&self, ns: &str, name: &str) -> Result<Vec<SecretVersion>>;
    /// The newest version of one secret.
    async fn latest_secret(&self, ns: &str, name: &str) -> Result<Option<SecretVersion>> {
        Ok(self.secret_versions(ns, name).await?.pop())
    }
    /// The decrypted value of one version and its fingerprint, for the worker only (never for
    /// the API). The fingerprint is checked against the opened value.
    async fn secret_value(&self, ns: &str, name: &str, version: u32)
    -> Result<Option<SecretValue>>;
    /// Deletes every version of a secret (the values are gone from the database's files too)
    /// and audits it (`secret.delete` by `actor`); false (nothing written) if it has none.
    /// The caller refused the delete of a secret still bound.
    async fn delete_secret(&self, ns: &str, name: &str, actor: &str, now: i64) -> Result<bool>;
}

/// The leader lease for the singleton loops, and retention.
#[async_trait]
pub trait LeaderLease: Send + Sync {
    /// Takes or renews the lease for `holder`; the lease in force afterwards. A holder that
    /// stops renewing loses it after `lease`, and the next holder's term is higher.
    async fn lead(&self, holder: &str, lease: Duration) -> Result<LeaseHeld>;
    /// Gives the lease up at once (a clean shutdown), so a follower takes over without
    /// waiting for it to lapse.
    async fn resign(&self, holder: &str) -> Result<()>;
    /// Removes finished work and audit events older than their retention (seconds).
    async fn prune(&self, work_older_than: i64, audit_older_than: i64) -> Result<Pruned>;
}

/// Facts about the store itself.
#[async_trait]
pub trait StoreMeta: Send + Sync {
    /// `sqlite` or `postgres`.
    fn kind(&self) -> &'static str;
    async fn schema_version(&self) -> Result<i64>;
    /// Rows per table, for tests that prove a refused request stored nothing, and for
    /// `occ db migrate`'s check.
    async fn row_counts(&self) -> Result<Vec<(String, i64)>>;
}

/// The whole store.
pub trait Store:
    HostStore
    + ClusterStore
    + NamespaceStore
    + ConfigurationStore
    + AgentStore
    + RevisionStore
    + WorkQueue
    + TokenStore
    + AuditLog
    + DriftStore
    + RolloutStore
    + WorkspaceStore
    + SecretStore
    + LeaderLease
    + StoreMeta
    + std::fmt::Debug
{
}

impl<T> Store for T where
    T: HostStore
        + ClusterStore
        + NamespaceStore
        + ConfigurationStore
        + AgentStore
        + RevisionStore
        + WorkQueue
        + TokenStore
        + AuditLog
        + DriftStore
        + RolloutStore
        + WorkspaceStore
        + SecretStore
        + LeaderLease
        + StoreMeta
        + std::fmt::Debug
{
}
/// The placement rule over (host, Agents on it) in the Namespace's order: the first with the
/// fewest Agents among those with room.
pub fn least_loaded_of(loads: impl IntoIterator<Item = (Host, u32)>) -> Option<Host> {
    let mut best: Option<(u32, Host)> = None;
    for (host, load) in loads {
        if load < host.max_agents && best.as_ref().is_none_or(|(l, _)| load < *l) {
            best = Some((load, host));
        }
    }
    best.map(|(_, host)| host)
}
