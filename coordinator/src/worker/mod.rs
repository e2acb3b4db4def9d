//! The deployment worker: claims work under a lease, re-checks the desired state, and drives
//! targets through a deploy's phases (`deploy.rs`: place → prepare → commit, the
//! compare-and-set of `activeRevisionId` → activate → retire), a stop or a delete. Every call
//! is idempotent on the target, so a crash at any point resumes by running the item again
//! once its lease expires.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use clawfleet_protocol::operation::{
    AgentArgs, AgentRef, NamespaceArgs, NamespaceRef, RevisionArgs, RevisionRef,
};
use clawfleet_protocol::result::{AgentObservation, OperationResult};
use clawfleet_protocol::{FailureCode, Operation};
use tokio::sync::{Semaphore, watch};

use crate::backend::{Backend, CallError, CallOptions, Target};
use crate::codes::{AnyCode, Code};
use crate::config::WorkerSettings;
use crate::foreground::Foreground;
use crate::model::{Agent, DesiredState, Host, Namespace, Revision, RevisionStatus};
use crate::store::{SharedStore, Work, WorkEnd, WorkKind, WorkState};
use policy::{Policy, Stage};

mod deploy;
mod lease;
pub mod policy;

pub use lease::{Lease, LeaseLost};

pub use crate::render::{HARNESS_VERSION, revision_ref, revision_spec};

/// How one pass over a work item ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Finished; the code says how (e.g. `REVISION_ACTIVATED`).
    Done { code: AnyCode, message: String },
    /// Finished without success; retrying cannot help.
    Failed { code: AnyCode, message: String },
    /// Try again later. `attempt` counts against the attempt budget.
    Retry {
        code: AnyCode,
        message: String,
        attempt: bool,
        delay: Duration,
    },
}

fn done(code: Code, message: impl Into<String>) -> Step {
    Step::Done {
        code: code.into(),
        message: message.into(),
    }
}

fn failed(code: Code, message: impl Into<String>) -> Step {
    Step::Failed {
        code: code.into(),
        message: message.into(),
    }
}

pub use crate::clock::now_ms;

fn target_err(e: crate::targets::TargetError) -> Step {
    match e {
        crate::targets::TargetError::Store(e) => Policy::store_failed(e),
        crate::targets::TargetError::Inconsistent { code, message } => failed(code, message),
    }
}

/// Most items one claim takes: the free slots are filled by one transaction, which holds the
/// claimed Namespaces' claim locks until it commits, so it is kept short.
const CLAIM_BATCH: usize = 8;

/// Aborts a background task when dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The worker.
pub struct Worker<B: Backend> {
    pub store: SharedStore,
    pub backend: Arc<B>,
    pub settings: WorkerSettings,
    pub owner: String,
    /// The lease of every item in progress here, by work id.
    leases: std::sync::Mutex<HashMap<i64, Lease>>,
    /// The API requests this worker yields to ([`Worker::yielding_to`]).
    foreground: Option<Foreground>,
}

impl<B: Backend> std::fmt::Debug for Worker<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Worker")
            .field("owner", &self.owner)
            .finish()
    }
}

/// Why a pass ended without a step to record.
fn lost(e: &LeaseLost) -> Step {
    failed(
        Code::ClaimLost,
        match e {
            LeaseLost::Replaced => "another claim replaced this one".to_owned(),
            LeaseLost::Lapsed { error } => format!("the lease lapsed: {error}"),
        },
    )
}

impl<B: Backend> Worker<B> {
    /// A worker with a unique lease owner name.
    pub fn new(store: SharedStore, backend: Arc<B>, settings: WorkerSettings) -> Self {
        Self {
            owner: format!("{}@{}:{}", std::process::id(), hostname(), now_ms()),
            store,
            backend,
            settings,
            leases: std::sync::Mutex::new(HashMap::new()),
            foreground: None,
        }
    }

    /// This worker, running at most `settings.yield_parallelism` items while `foreground`
    /// is busy (`occ serve` gives it its API's gauge). Without it, it never yields.
    #[must_use]
    pub fn yielding_to(mut self, foreground: Foreground) -> Self {
        self.foreground = Some(foreground);
        self
    }

    /// How many more items may start now, `running` being in progress: the free share, in
    /// batches of at most [`CLAIM_BATCH`].
    fn may_start(&self, parallel: usize, running: usize) -> usize {
        let share = match &self.foreground {
            Some(f) if f.busy() => self.settings.yield_parallelism.clamp(1, parallel),
            _ => parallel,
        };
        share.saturating_sub(running).min(CLAIM_BATCH)
    }

    /// Runs until `shutdown` turns true, with up to `parallel` items in flight.
    /// While the API is busy ([`Worker::yielding_to`]) only the yield share of them starts;
    /// items already running go on.
    pub async fn run(self: Arc<Self>, parallel: usize, mut shutdown: watch::Receiver<bool>) {
        let parallel = parallel.max(1);
        let slots = Arc::new(Semaphore::new(parallel));
        loop {
            if *shutdown.borrow() {
                return;
            }
            let Ok(permit) = slots.clone().acquire_owned().await else {
                return;
            };
            let running = parallel.saturating_sub(slots.available_permits() + 1);
            let wanted = self.may_start(parallel, running);
            if wanted == 0 {
                // The API is busy and the yield share is in use: look again when an item
                // ends, or when the API may have gone idle.
                drop(permit);
                tokio::select! {
                    _ = tokio::time::sleep(crate::foreground::GRACE) => {}
                    _ = self.store.work_changed() => {}
                    _ = shutdown.changed() => {}
                }
                continue;
            }
            // The free share is filled by one claim (one transaction for the batch).
            let mut permits = vec![permit];
            while permits.len() < wanted {
                match slots.clone().try_acquire_owned() {
                    Ok(p) => permits.push(p),
                    Err(_) => break,
                }
            }
            let asked = tokio::time::Instant::now();
            let wanted = permits.len();
            match self
                .store
                .claim_batch(&self.owner, self.settings.lease, wanted)
                .await
            {
                Ok(batch) => {
                    let full = batch.len() == wanted;
                    for (work, permit) in batch.into_iter().zip(permits) {
                        let me = self.clone();
                        tokio::spawn(async move {
                            me.process(work, asked).await;
                            drop(permit);
                            // A finished item may free its lane for queued work.
                            me.store.wake_worker();
                        });
                    }
                    // Slots left unfilled mean nothing more is runnable now: wait.
                    if full {
                        continue;
                    }
                }
                Err(e) => {
                    drop(permits);
                    tracing::error!("cannot claim work: {e}");
                }
            }
            tokio::select! {
                _ = tokio::time::sleep(self.settings.poll) => {}
                _ = self.store.work_changed() => {}
                _ = shutdown.changed() => {}
            }
        }
    }

    /// Claims and processes one item if one is due (for tests and single-step use).
    pub async fn run_once(&self) -> Option<(Work, Step)> {
        let asked = tokio::time::Instant::now();
        let work = self
            .store
            .claim_work(&self.owner, self.settings.lease)
            .await
            .ok()??;
        let step = self.process(work.clone(), asked).await;
        Some((work, step))
    }

    fn lease_of(&self, work: &Work) -> Option<Lease> {
        match self.leases.lock() {
            Ok(m) => m.get(&work.id).cloned(),
            Err(p) => p.into_inner().get(&work.id).cloned(),
        }
    }

    fn set_lease(&self, work: &Work, lease: Option<Lease>) {
        let mut m = match self.leases.lock() {
            Ok(m) => m,
            Err(p) => p.into_inner(),
        };
        match lease {
            Some(l) => {
                m.insert(work.id, l);
            }
            None => {
                m.remove(&work.id);
            }
        }
    }

    /// One host or cluster call on behalf of a claimed item: the lease is made sure of first
    /// ([`Lease::before_call`]), and no call is issued once it is lost. The Agent's fence from
    /// the claim travels with the operation, so a target refuses it once a later claim moved
    /// the Agent on; that refusal ends the pass as a lost claim.
    async fn call_with(
        &self,
        work: &Work,
        target: &Target,
        op: Operation,
        options: CallOptions,
    ) -> Result<Result<OperationResult, CallError>, Step> {
        if let Some(lease) = self.lease_of(work) {
            lease.before_call().await.map_err(|e| lost(&e))?;
        }
        let options = CallOptions {
            fence: work.fence,
            ..options
        };
        let kind = op.kind();
        crate::fault::before_call(kind.as_str());
        let call = self.backend.call(target, op, options);
        tokio::pin!(call);
        let result = tokio::select! {
            result = &mut call => result,
            () = tokio::time::sleep(self.settings.slow_call) => {
                self.note_slow(work, target, kind.as_str()).await;
                call.await
            }
        };
        if let Err(CallError::Failed(f)) = &result
            && f.code == FailureCode::FenceStale
        {
            return Err(failed(Code::ClaimLost, f.to_string()));
        }
        Ok(result)
    }

    /// Notes a call still unanswered after `slow_call` on the item (and its revision), so
    /// status shows the step in flight during a hung hostd or Kubernetes API instead of
    /// nothing (or an older outcome); the call's own outcome replaces it.
    async fn note_slow(&self, work: &Work, target: &Target, operation: &str) {
        let what = match target {
            Target::Host(_) => "host",
            Target::Cluster(_) => "cluster",
        };
        let message = format!(
            "{operation} on {what} {} has not answered for {} s; waiting for it",
            target.name(),
            self.settings.slow_call.as_secs_f32()
        );
        tracing::warn!(
            work = work.id,
            operation,
            target = target.name(),
            "{message}"
        );
        match self
            .store
            .note_work(&work.claim, Code::CallInProgress.as_str(), &message)
            .await
        {
            Ok(_) => {}
            Err(e) => tracing::error!(work = work.id, "cannot note the call in flight: {e}"),
        }
    }

    /// [`Worker::call_with`] with the configured deadline.
    async fn call(
        &self,
        work: &Work,
        target: &Target,
        op: Operation,
    ) -> Result<Result<OperationResult, CallError>, Step> {
        self.call_with(work, target, op, self.options()).await
    }

    /// Processes one item, claimed by a statement sent at `asked`, and records the result.
    pub async fn process(&self, work: Work, asked: tokio::time::Instant) -> Step {
        let lease = Lease::new(self.store.clone(), work.claim, self.settings.lease, asked);
        // Aborted when this future ends or is dropped, so a cancelled pass stops renewing.
        let _renew = AbortOnDrop(lease.heartbeat());
        self.set_lease(&work, Some(lease));
        let age = Duration::from_millis((now_ms() - work.created_at).max(0) as u64);
        // A Namespace's ensure is not an Agent's convergence: it retries until it succeeds.
        let step =
            if age > self.settings.convergence_deadline && work.kind != WorkKind::EnsureNamespace {
                failed(
                    Code::ConvergenceDeadlineExceeded,
                    format!(
                        "not converged within {} s",
                        self.settings.convergence_deadline.as_secs()
                    ),
                )
            } else {
                let result = match work.kind {
                    WorkKind::EnsureNamespace => self.ensure_namespace(&work).await,
                    WorkKind::DeleteNamespace => self.delete_namespace(&work).await,
                    WorkKind::Deploy => self.deploy(&work).await,
                    WorkKind::Stop => self.stop(&work).await,
                    WorkKind::DeleteAgent => self.delete_agent(&work).await,
                };
                result.unwrap_or_else(|s| s)
            };
        self.set_lease(&work, None);
        let step = self.policy().budget(&work, step);
        self.record(&work, &step).await;
        step
    }

    async fn record(&self, work: &Work, step: &Step) {
        let (typed, message) = match step {
            Step::Done { code, message }
            | Step::Failed { code, message }
            | Step::Retry { code, message, .. } => (*code, message.as_str()),
        };
        // The store keeps the code as its text.
        let code = typed.as_str();
        tracing::info!(
            work = work.id,
            kind = work.kind.as_str(),
            agent = work.agent_id.as_deref().unwrap_or("-"),
            code,
            "{message}"
        );
        if typed == Code::ClaimLost {
            // Another claim owns the item: it records what happens; nothing is ours to write.
            return;
        }
        let end = match step {
            Step::Done { .. } => WorkEnd::Finished {
                state: WorkState::Done,
                code,
                message,
            },
            Step::Failed { .. } => WorkEnd::Finished {
                state: WorkState::Failed,
                code,
                message,
            },
            Step::Retry { attempt, delay, .. } => WorkEnd::Requeued {
                delay: *delay,
                count_attempt: *attempt,
                code,
                message,
            },
        };
        // The end is also the revision's newest attempt (and a failure its status).
        match self.store.end_work(&work.claim, end).await {
            Ok(true) => {}
            Ok(false) => tracing::warn!(
                work = work.id,
                "the outcome was not recorded: another claim replaced this one"
            ),
            Err(e) => tracing::error!(work = work.id, "cannot record the outcome: {e}"),
        }
    }

    /// The failure policy over this worker's settings: what every failure means.
    fn policy(&self) -> Policy<'_> {
        Policy {
            settings: &self.settings,
        }
    }

    fn target(&self, host: &Host) -> Result<Target, Step> {
        Ok(crate::targets::host(host))
    }

    /// The cluster of a cluster Namespace, with its credentials; `None` for a host pool.
    async fn cluster_target(&self, ns: &Namespace) -> Result<Option<Target>, Step> {
        crate::targets::cluster(&*self.store, ns)
            .await
            .map_err(target_err)
    }

    /// Where an Agent's operations go: its Namespace's cluster, or the host it is placed on
    /// (`None` while it was never placed).
    async fn agent_target(&self, ns: &Namespace, agent: &Agent) -> Result<Option<Target>, Step> {
        crate::targets::agent(&*self.store, ns, agent)
            .await
            .map_err(target_err)
    }

    fn options(&self) -> CallOptions {
        CallOptions {
            deadline: Duration::from_secs(u64::from(self.settings.operation_deadline_seconds)),
            fence: None,
        }
    }

    fn namespace_ref(ns: &Namespace) -> Result<NamespaceRef, Step> {
        Ok(NamespaceRef {
            id: ns.id.clone(),
            name: ns.name.clone(),
        })
    }

    async fn ensure_on(&self, work: &Work, ns: &Namespace, host: &Host) -> Result<(), Step> {
        let op = Operation::EnsureNamespace(NamespaceArgs {
            namespace: Self::namespace_ref(ns)?,
        });
        self.call(work, &self.target(host)?, op)
            .await?
            .map_err(|e| self.policy().call_failed(work, e, Stage::HostNamespace))?;
        self.store
            .set_namespace_host_ready(&work.claim, &ns.id, &host.name, true)
            .await
            .map_err(Policy::store_failed)?;
        Ok(())
    }

    async fn ensure_namespace(&self, work: &Work) -> Result<Step, Step> {
        let Some(ns) = self
            .store
            .namespace(&work.namespace_id)
            .await
            .map_err(Policy::store_failed)?
        else {
            return Ok(done(Code::NamespaceGone, "the Namespace was deleted"));
        };
        if let Some(cluster) = self.cluster_target(&ns).await? {
            if ns.deleting {
                // The deletion queued behind this item runs next.
                return Ok(done(Code::NamespaceGone, "the Namespace is being deleted"));
            }
            let op = Operation::EnsureNamespace(NamespaceArgs {
                namespace: Self::namespace_ref(&ns)?,
            });
            if let Err(e) = self.call(work, &cluster, op).await? {
                return Ok(self.policy().call_failed(work, e, Stage::ClusterNamespace));
            }
            self.store
                .set_namespace_cluster_ready(&work.claim, &ns.id, true)
                .await
                .map_err(Policy::store_failed)?;
            return Ok(done(
                Code::NamespaceReady,
                format!("ready on {}", cluster.name()),
            ));
        }
        let mut pending = Vec::new();
        for name in ns.hosts.iter().filter(|h| !ns.ready_hosts.contains(h)) {
            let Some(host) = self.store.host(name).await.map_err(Policy::store_failed)? else {
                continue;
            };
            if let Err(step) = self.ensure_on(work, &ns, &host).await {
                pending.push((name.clone(), step));
            }
        }
        match pending.into_iter().next() {
            None => Ok(done(Code::NamespaceReady, "ready on every pool host")),
            Some((host, Step::Retry { code, message, .. })) => {
                Ok(self
                    .policy()
                    .not_yet(work, code, format!("{host}: {message}")))
            }
            Some((host, Step::Failed { code, message } | Step::Done { code, message })) => {
                Ok(Step::Failed {
                    code,
                    message: format!("{host}: {message}"),
                })
            }
        }
    }

    async fn delete_namespace(&self, work: &Work) -> Result<Step, Step> {
        let Some(ns) = self
            .store
            .namespace(&work.namespace_id)
            .await
            .map_err(Policy::store_failed)?
        else {
            return Ok(done(Code::NamespaceDeleted, "already gone"));
        };
        if !self
            .store
            .agents(&ns.id)
            .await
            .map_err(Policy::store_failed)?
            .is_empty()
        {
            return Ok(failed(
                Code::NamespaceNotEmpty,
                "the Namespace still has Agents",
            ));
        }
        let mut targets = Vec::new();
        if let Some(cluster) = self.cluster_target(&ns).await? {
            targets.push(cluster);
        }
        for name in &ns.hosts {
            if let Some(host) = self.store.host(name).await.map_err(Policy::store_failed)? {
                targets.push(self.target(&host)?);
            }
        }
        for target in &targets {
            let op = Operation::DeleteNamespace(NamespaceArgs {
                namespace: Self::namespace_ref(&ns)?,
            });
            if let Err(e) = self.call(work, target, op).await? {
                return Ok(self.policy().call_failed(work, e, Stage::BeforeCommit));
            }
        }
        self.store
            .delete_namespace_row(&work.claim, &ns.id)
            .await
            .map_err(Policy::store_failed)?;
        Ok(done(Code::NamespaceDeleted, "removed from every pool host"))
    }

    /// Picks a ready pool host with room, least loaded first.
    async fn place(
        &self,
        work: &Work,
        ns: &Namespace,
        agent: &Agent,
    ) -> Result<Option<Host>, Step> {
        if let Some(name) = &agent.host {
            return self.store.host(name).await.map_err(Policy::store_failed);
        }
        self.store
            .place_agent(&work.claim, &ns.id, &agent.id, &ns.ready_hosts)
            .await
            .map_err(Policy::store_failed)
    }

    fn agent_ref(agent: &Agent) -> Result<AgentRef, Step> {
        Ok(AgentRef {
            id: agent.id.clone(),
            service_principal_id: agent.service_principal_id.clone(),
        })
    }

    fn revision_ref(rev: &Revision) -> Result<RevisionRef, Step> {
        revision_ref(rev).map_err(|message| failed(Code::InvalidStoredId, message))
    }

    /// Records what the host reports. A revision counts as served only while `current` still
    /// names it: once activation has switched `current` to a candidate that is not ready yet,
    /// the previous revision no longer runs, whatever an older `served.json` says.
    /// A failed write is the store's failure like any other: the item retries
    /// (`STORE_UNAVAILABLE`) rather than carrying on with an observation it did not keep.
    async fn observe(&self, work: &Work, agent: &Agent, o: &AgentObservation) -> Result<(), Step> {
        let served = served(o);
        self.store
            .set_agent_observed(
                &work.claim,
                &agent.namespace_id,
                &agent.id,
                o.port,
                served.as_deref(),
            )
            .await
            .map_err(Policy::store_failed)
    }

    async fn stop(&self, work: &Work) -> Result<Step, Step> {
        let Some(agent_id) = &work.agent_id else {
            return Ok(failed(Code::InvalidWork, "stop work without an Agent"));
        };
        let ns_id = &work.namespace_id;
        let Some(agent) = self
            .store
            .agent(ns_id, agent_id)
            .await
            .map_err(Policy::store_failed)?
        else {
            return Ok(done(Code::AgentGone, "the Agent was deleted"));
        };
        if agent.desired_state != DesiredState::Stopped {
            return Ok(done(
                Code::StopSuperseded,
                "the Agent is meant to run again",
            ));
        }
        let Some(active) = &agent.active_revision_id else {
            return Ok(done(Code::RevisionStopped, "nothing was running"));
        };
        let (Some(ns), Some(rev)) = (
            self.store
                .namespace(ns_id)
                .await
                .map_err(Policy::store_failed)?,
            self.store
                .revision(ns_id, agent_id, active)
                .await
                .map_err(Policy::store_failed)?,
        ) else {
            return Ok(failed(
                Code::InvalidState,
                "the Agent's Namespace or revision is missing",
            ));
        };
        let Some(target) = self.agent_target(&ns, &agent).await? else {
            return Ok(done(Code::RevisionStopped, "nothing was running"));
        };
        let mut observed = match self.stop_one(work, &target, &ns, &agent, &rev).await? {
            Ok(o) => o,
            Err(step) => return Ok(step),
        };
        // The active revision may never have reached the target (an activation refused
        // before its cutover): what runs is then an older revision, stopped by name too.
        if still_running(&observed)
            && let Some(other) = observed.current.clone().filter(|c| c != active)
            && let Some(older) = self
                .store
                .revision(ns_id, agent_id, other.as_str())
                .await
                .map_err(Policy::store_failed)?
                .filter(|o| o.number < rev.number)
        {
            observed = match self.stop_one(work, &target, &ns, &agent, &older).await? {
                Ok(o) => o,
                Err(step) => return Ok(step),
            };
        }
        // Stopped is what is observed, never what was asked for.
        if still_running(&observed) {
            let what = observed
                .current
                .as_ref()
                .map_or_else(|| "a gateway".to_owned(), |c| format!("revision {c}"));
            return Ok(self.policy().not_yet(
                work,
                Code::StopIncomplete,
                format!("{} still reports {what} running", target.name()),
            ));
        }
        // Only now that the host stopped is the active revision cleared.
        self.store
            .cas_active_revision(&work.claim, ns_id, agent_id, Some(active), None)
            .await
            .map_err(Policy::store_failed)?;
        self.store
            .set_revision_status(
                &work.claim,
                ns_id,
                agent_id,
                active,
                RevisionStatus::Stopped,
            )
            .await
            .map_err(Policy::store_failed)?;
        Ok(done(
            Code::RevisionStopped,
            format!("stopped on {}", target.name()),
        ))
    }

    /// One `stop-revision`; the observation it answered with, or the step a failure ends on.
    async fn stop_one(
        &self,
        work: &Work,
        target: &Target,
        ns: &Namespace,
        agent: &Agent,
        rev: &Revision,
    ) -> Result<Result<AgentObservation, Step>, Step> {
        let op = Operation::StopRevision(RevisionArgs {
            namespace: Self::namespace_ref(ns)?,
            agent: Self::agent_ref(agent)?,
            revision: Self::revision_ref(rev)?,
        });
        match self.call(work, target, op).await? {
            Ok(OperationResult::StopRevision(s)) => {
                self.observe(work, agent, &s.observation).await?;
                Ok(Ok(s.observation))
            }
            Ok(_) => Ok(Err(failed(
                Code::InvalidHostResult,
                "stop-revision was answered with another operation's result",
            ))),
            Err(e) => Ok(Err(self.policy().call_failed(work, e, Stage::BeforeCommit))),
        }
    }

    async fn delete_agent(&self, work: &Work) -> Result<Step, Step> {
        let Some(agent_id) = &work.agent_id else {
            return Ok(failed(Code::InvalidWork, "delete work without an Agent"));
        };
        let ns_id = &work.namespace_id;
        let Some(agent) = self
            .store
            .agent(ns_id, agent_id)
            .await
            .map_err(Policy::store_failed)?
        else {
            return Ok(done(Code::AgentDeleted, "already gone"));
        };
        let Some(ns) = self
            .store
            .namespace(ns_id)
            .await
            .map_err(Policy::store_failed)?
        else {
            return Ok(failed(
                Code::InvalidState,
                "the Agent's Namespace is missing",
            ));
        };
        if let Some(target) = self.agent_target(&ns, &agent).await? {
            let op = Operation::DeleteAgent(AgentArgs {
                namespace: Self::namespace_ref(&ns)?,
                agent: Self::agent_ref(&agent)?,
            });
            if let Err(e) = self.call(work, &target, op).await? {
                return Ok(self.policy().call_failed(work, e, Stage::BeforeCommit));
            }
        }
        self.store
            .delete_agent_row(&work.claim, ns_id, agent_id)
            .await
            .map_err(Policy::store_failed)?;
        Ok(done(Code::AgentDeleted, "removed from its host"))
    }
}

/// The revision an observation says is served: only while `current` still names it (see
/// [`Worker::observe`]).
fn served(o: &AgentObservation) -> Option<String> {
    o.served
        .as_ref()
        .filter(|s| o.current.as_ref() == Some(*s))
        .map(|s| s.as_str().to_owned())
}

/// Whether an observation says a gateway still runs: its unit (a systemd unit, or a
/// cluster's Deployment) is up or on its way up, or failed while still enabled (a cluster's
/// Deployment whose Pod is blocked; a stopped host unit is disabled).
fn still_running(o: &AgentObservation) -> bool {
    o.served.is_some()
        || o.unit
            .as_ref()
            .is_some_and(|u| match u.active_state.as_str() {
                "active" | "activating" | "reloading" => true,
                "failed" => u.enabled,
                _ => false,
            })
}

/// Whether an observation says nothing new against the Agent as it was loaded: the port
/// (when reported) and the served revision are what is stored.
fn observation_unchanged(agent: &Agent, o: &AgentObservation) -> bool {
    (o.port.is_none() || o.port == agent.port)
        && served(o).as_deref() == agent.served_revision_id.as_deref()
}

/// This machine's name, for lease owners in logs and the database.
fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_owned())
        .unwrap_or_else(|_| "unknown".to_owned())
}
