//! Issue 10: the work outcomes no other test produced, each produced by the worker over hostd's
//! real engine in process (tests/hostd_engine/mod.rs) and asserted as the step the pass ended
//! with and as what the store recorded (the work item's and the revision's last attempt).
//!
//! Most conditions come from the API's own order of events (a stop queued behind a deploy, a
//! deletion while a retry waits, a full pool). Codes that exist for a damaged database
//! (`INVALID_STORED_ID`, `INVALID_STATE`, `INVALID_WORK`, `NAMESPACE_GONE`) are produced by
//! editing the store as an operator's tooling could, since the service never writes such rows;
//! a store failure by a trigger that refuses one write.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::hostd_engine;

use std::sync::Arc;
use std::time::Duration;

use clawfleet_protocol::egress::Egress;
use clawfleet_protocol::envelope::{self, Envelope, Limits, PROTOCOL_VERSION};
use clawfleet_protocol::failure::{Failure, FailureCode};
use clawfleet_protocol::operation::StatusArgs;
use clawfleet_protocol::result::OperationResult;
use clawfleet_protocol::{Fingerprint, HostName, Operation, OperationId, Principal};
use coordinator::backend::{Backend, CallError, CallOptions, Target};
use coordinator::config::WorkerSettings;
use coordinator::model::{RestorePolicy, RevisionStatus};
use coordinator::service::{AgentPatch, NewAgent, NewHost, Service};
use coordinator::store::sqlite::SqliteStore;
use coordinator::store::{Enqueue, SharedStore, Work, WorkKind, WorkRecord, WorkState};
use coordinator::worker::{Step, Worker};
use hostd_engine::{EngineBackend, Inject};
use serde_json::json;

use crate::fixtures::HOST_KEY;

fn settings() -> WorkerSettings {
    WorkerSettings {
        lease: Duration::from_millis(200),
        backoff_initial: Duration::from_millis(1),
        backoff_max: Duration::from_millis(5),
        readiness_recheck: Duration::from_millis(1),
        readiness_recheck_max: Duration::from_millis(5),
        ..WorkerSettings::default()
    }
}

fn host(name: &str, max_agents: u32) -> NewHost {
    crate::fixtures::host(name, HOST_KEY, max_agents)
}

struct World {
    svc: Service,
    store: SharedStore,
    sqlite: Arc<SqliteStore>,
    backend: Arc<EngineBackend>,
}

impl World {
    fn empty() -> Self {
        let sqlite = Arc::new(SqliteStore::in_memory().unwrap());
        let store: SharedStore = sqlite.clone();
        Self {
            svc: Service::new(store.clone()),
            store,
            sqlite,
            backend: Arc::new(EngineBackend::new()),
        }
    }

    /// Namespace ns1 on one host h1 that takes `max_agents`, configuration cfg; the
    /// Namespace's ensure work is queued, not run.
    async fn pool(max_agents: u32) -> Self {
        let w = Self::empty();
        w.svc
            .enrol_host("test", host("h1", max_agents))
            .await
            .unwrap();
        w.namespace(vec!["h1".into()], None).await;
        w
    }

    /// Namespace ns1 on a (fake) cluster c1, configuration cfg; ensure work queued.
    async fn on_cluster() -> Self {
        let w = Self::empty();
        crate::fixtures::fake_cluster(&w.store).await;
        w.namespace(vec![], Some("c1".into())).await;
        w
    }

    async fn namespace(&self, hosts: Vec<String>, cluster: Option<String>) {
        crate::fixtures::namespace(&self.svc, "ns1", hosts, cluster).await;
        crate::fixtures::configuration(&self.svc, "ns1", json!({})).await;
    }

    fn worker(&self) -> Worker<EngineBackend> {
        self.worker_with(settings())
    }

    fn worker_with(&self, settings: WorkerSettings) -> Worker<EngineBackend> {
        Worker::new(self.store.clone(), self.backend.clone(), settings)
    }

    async fn agent(&self, id: &str) {
        crate::fixtures::agent(&self.svc, "ns1", id).await;
    }

    /// An Agent on `cfg` with its own restore policy and egress settings.
    async fn agent_with(&self, id: &str, restore: Option<RestorePolicy>, egress: Option<Egress>) {
        self.svc
            .create_agent(
                "test",
                "ns1",
                NewAgent {
                    id: id.into(),
                    service_principal_id: None,
                    configuration_id: "cfg".into(),
                    harness_auth: None,
                    restore,
                    workspace_files: Vec::new(),
                    egress,
                },
            )
            .await
            .unwrap();
    }

    /// Deploys the Agent; the new revision's id.
    async fn deploy(&self, agent: &str) -> String {
        self.svc
            .deploy("test", "ns1", agent)
            .await
            .unwrap()
            .0
            .id
            .to_string()
    }

    /// Runs the worker until no work is left.
    async fn settle<B: Backend>(&self, w: &Worker<B>) {
        for _ in 0..500 {
            if w.run_once().await.is_none() {
                if self.store.pending_work().await.unwrap() == 0 {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        }
        panic!("the worker did not settle");
    }

    /// Runs the one item that must be due now.
    async fn once<B: Backend>(&self, w: &Worker<B>) -> (Work, Step) {
        w.run_once().await.expect("no work was due")
    }

    /// The Agent's newest work item as the store keeps it.
    async fn last_work(&self, agent: &str) -> WorkRecord {
        self.store
            .recent_work("ns1", agent, 1)
            .await
            .unwrap()
            .pop()
            .expect("the Agent has no work")
    }

    async fn revision(&self, agent: &str, id: &str) -> coordinator::model::Revision {
        self.store
            .revision("ns1", agent, id)
            .await
            .unwrap()
            .expect("no such revision")
    }

    /// Runs SQL on the store's writer connection.
    async fn sql(&self, sql: &str) {
        self.sqlite
            .with_connection(|c| c.execute_batch(sql))
            .await
            .unwrap();
    }

    fn prepares(&self) -> usize {
        self.backend
            .log()
            .iter()
            .filter(|l| l.ends_with("prepare-revision"))
            .count()
    }
}

/// Asserts how a pass ended: `done`, `failed` or `retry`, its code, and a part of its message.
#[track_caller]
fn assert_step(step: &Step, how: &str, code: &str, message_part: &str) {
    let (got_how, got_code, message) = match step {
        Step::Done { code, message } => ("done", code, message),
        Step::Failed { code, message } => ("failed", code, message),
        Step::Retry { code, message, .. } => ("retry", code, message),
    };
    assert_eq!((got_how, got_code.as_str()), (how, code), "{step:?}");
    assert!(message.contains(message_part), "{step:?}");
}

#[track_caller]
fn assert_recorded(record: &WorkRecord, state: WorkState, code: &str) {
    assert_eq!(record.state, state, "{record:?}");
    assert_eq!(
        record.last_attempt.as_ref().map(|a| a.code.as_str()),
        Some(code),
        "{record:?}"
    );
}

/// Namespace work: ready on its pool, removed from it, found already removed by a second
/// deletion, and (an edited queue) ensure work for a Namespace that no longer exists.
#[tokio::test]
async fn namespace_work_ends_ready_deleted_or_gone() {
    let w = World::pool(100).await;
    let worker = w.worker();
    let (work, step) = w.once(&worker).await;
    assert_eq!(work.kind, WorkKind::EnsureNamespace);
    assert_step(&step, "done", "NAMESPACE_READY", "ready on every pool host");
    assert!(w.backend.has_namespace("h1", "ns1"));
    assert!(w.svc.namespace("ns1").await.unwrap().ready);

    // Deleted twice before the worker runs: the first pass removes it, the second finds it gone.
    w.svc.delete_namespace("test", "ns1").await.unwrap();
    w.svc.delete_namespace("test", "ns1").await.unwrap();
    let (work, step) = w.once(&worker).await;
    assert_eq!(work.kind, WorkKind::DeleteNamespace);
    assert_step(
        &step,
        "done",
        "NAMESPACE_DELETED",
        "removed from every pool host",
    );
    assert!(!w.backend.has_namespace("h1", "ns1"));
    let (_, step) = w.once(&worker).await;
    assert_step(&step, "done", "NAMESPACE_DELETED", "already gone");

    let calls = w.backend.calls();
    w.store
        .enqueue(&Enqueue::namespace(WorkKind::EnsureNamespace, "ns1"))
        .await
        .unwrap();
    let (_, step) = w.once(&worker).await;
    assert_step(&step, "done", "NAMESPACE_GONE", "the Namespace was deleted");
    assert_eq!(w.backend.calls(), calls, "no host was asked");
    assert!(!w.backend.has_namespace("h1", "ns1"));
}

/// On a cluster the Namespace is ready once its cluster says so; until then a deploy waits
/// with `NAMESPACE_NOT_READY` (not counted as an attempt) and nothing is prepared.
#[tokio::test]
async fn a_deploy_waits_while_its_namespace_is_not_ready_on_the_cluster() {
    let w = World::on_cluster().await;
    let worker = w.worker();
    let (_, step) = w.once(&worker).await;
    assert_step(&step, "done", "NAMESPACE_READY", "ready on c1");

    let w = World::on_cluster().await;
    let worker = w.worker();
    w.backend
        .inject(0, Inject::Fail(FailureCode::OwnershipMismatch));
    let (_, step) = w.once(&worker).await;
    assert_step(&step, "failed", "OWNERSHIP_MISMATCH", "injected");
    assert!(!w.svc.namespace("ns1").await.unwrap().ready);

    w.agent("a1").await;
    let rev = w.deploy("a1").await;
    for _ in 0..2 {
        let (work, step) = w.once(&worker).await;
        assert_eq!(work.kind, WorkKind::Deploy);
        assert_step(
            &step,
            "retry",
            "NAMESPACE_NOT_READY",
            "not ready on its cluster yet",
        );
        assert!(matches!(step, Step::Retry { attempt: false, .. }));
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let record = w.last_work("a1").await;
    assert_recorded(&record, WorkState::Queued, "NAMESPACE_NOT_READY");
    assert_eq!(record.attempts, 0);
    let r = w.revision("a1", &rev).await;
    let attempt = r.last_attempt.unwrap();
    assert_eq!(attempt.code, "NAMESPACE_NOT_READY");
    // Waiting passes spend no attempt, of the item or of its revision (they used to count
    // every pass: 2 here, 30-41 on a cluster whose Namespace stayed unready).
    assert_eq!(attempt.attempts, record.attempts);
    assert_eq!(r.status, RevisionStatus::Pending);
    assert_eq!(w.prepares(), 0);
}

/// Issue 27: while a cluster call hangs (an apiserver that accepted the connection and never
/// answers), status names the step in flight as `CALL_IN_PROGRESS` once the call is slower
/// than `slow_call`, on the work item and as the revision's newest attempt (no attempt
/// counted); before, both showed no code until the call's deadline.
#[tokio::test]
async fn a_hanging_cluster_call_shows_the_step_in_flight() {
    let w = World::on_cluster().await;
    let worker = w.worker();
    let (_, step) = w.once(&worker).await;
    assert_step(&step, "done", "NAMESPACE_READY", "ready on c1");
    w.agent("a1").await;
    let rev = w.deploy("a1").await;
    w.backend
        .inject(w.backend.calls(), Inject::Hang { applied: false });
    let worker = Arc::new(w.worker_with(WorkerSettings {
        lease: Duration::from_secs(30),
        slow_call: Duration::from_millis(50),
        ..settings()
    }));
    let pass = tokio::spawn({
        let worker = worker.clone();
        async move { worker.run_once().await }
    });
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let attempt = loop {
        if let Some(a) = w.revision("a1", &rev).await.last_attempt {
            break a;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no code while the call hangs: {:?}",
            w.last_work("a1").await
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(!pass.is_finished(), "the call was meant to hang");
    assert_eq!(attempt.code, "CALL_IN_PROGRESS");
    assert!(
        attempt.message.contains("on cluster c1 has not answered"),
        "{attempt:?}"
    );
    assert_eq!(attempt.attempts, 0);
    let record = w.last_work("a1").await;
    assert_recorded(&record, WorkState::Running, "CALL_IN_PROGRESS");
    assert_eq!(record.attempts, 0);
    pass.abort();
}

/// A pool whose hosts are full leaves the deploy waiting with `NO_HOST_AVAILABLE` (not an
/// attempt); once the host takes one more Agent the deploy is placed and serves.
#[tokio::test]
async fn a_full_pool_leaves_the_deploy_waiting_for_room() {
    let w = World::pool(1).await;
    let worker = w.worker();
    w.settle(&worker).await;
    w.agent("a1").await;
    w.agent("a2").await;
    w.deploy("a1").await;
    w.settle(&worker).await;
    let rev = w.deploy("a2").await;
    let (work, step) = w.once(&worker).await;
    assert_eq!(work.agent_id.as_deref(), Some("a2"));
    assert_step(
        &step,
        "retry",
        "NO_HOST_AVAILABLE",
        "no ready pool host has room",
    );
    assert!(matches!(step, Step::Retry { attempt: false, .. }));
    assert_recorded(
        &w.last_work("a2").await,
        WorkState::Queued,
        "NO_HOST_AVAILABLE",
    );
    assert_eq!(w.svc.agent("ns1", "a2").await.unwrap().host, None);

    w.svc.update_host("test", host("h1", 2)).await.unwrap();
    w.settle(&worker).await;
    let a2 = w.svc.agent("ns1", "a2").await.unwrap();
    assert_eq!(a2.host.as_deref(), Some("h1"));
    assert_eq!(a2.served_revision_id.as_deref(), Some(rev.as_str()));
}

/// Stop outcomes: a stop of a running Agent, a deploy and a stop that both find the Agent
/// not meant to run, and a stop dropped because the Agent is meant to run again.
#[tokio::test]
async fn stops_end_stopped_or_superseded() {
    let w = World::pool(100).await;
    let worker = w.worker();
    w.settle(&worker).await;
    w.agent("a1").await;
    let first = w.deploy("a1").await;
    w.settle(&worker).await;

    w.svc.stop("test", "ns1", "a1").await.unwrap();
    let (_, step) = w.once(&worker).await;
    assert_step(&step, "done", "REVISION_STOPPED", "stopped on h1");
    assert_eq!(
        w.revision("a1", &first).await.status,
        RevisionStatus::Stopped
    );
    assert_eq!(
        w.svc.agent("ns1", "a1").await.unwrap().active_revision_id,
        None
    );
    assert_eq!(w.backend.agent("h1", "ns1", "a1").unwrap().served, None);
    assert_recorded(
        &w.last_work("a1").await,
        WorkState::Done,
        "REVISION_STOPPED",
    );

    // A deploy and then a stop, queued before the worker runs.
    let calls = w.backend.calls();
    let second = w.deploy("a1").await;
    w.svc.stop("test", "ns1", "a1").await.unwrap();
    let (work, step) = w.once(&worker).await;
    assert_eq!(work.revision_id.as_deref(), Some(second.as_str()));
    assert_step(&step, "done", "REVISION_STOPPED", "no longer meant to run");
    assert_eq!(
        w.revision("a1", &second).await.last_attempt.unwrap().code,
        "REVISION_STOPPED"
    );
    let (work, step) = w.once(&worker).await;
    assert_eq!(work.kind, WorkKind::Stop);
    assert_step(&step, "done", "REVISION_STOPPED", "nothing was running");
    assert_eq!(w.backend.calls(), calls, "nothing reached the host");

    // A stop and then a deploy: the stop is dropped, the deploy serves.
    w.svc.stop("test", "ns1", "a1").await.unwrap();
    let third = w.deploy("a1").await;
    let (work, step) = w.once(&worker).await;
    assert_eq!(work.kind, WorkKind::Stop);
    assert_step(&step, "done", "STOP_SUPERSEDED", "meant to run again");
    let stop = w
        .store
        .work_item("ns1", "a1", work.id)
        .await
        .unwrap()
        .unwrap();
    assert_recorded(&stop, WorkState::Done, "STOP_SUPERSEDED");
    w.settle(&worker).await;
    assert_eq!(
        w.svc
            .agent("ns1", "a1")
            .await
            .unwrap()
            .served_revision_id
            .as_deref(),
        Some(third.as_str())
    );
}

/// An Agent deleted twice before the worker runs: removed from its host, then found gone.
#[tokio::test]
async fn deletes_end_deleted_even_when_already_gone() {
    let w = World::pool(100).await;
    let worker = w.worker();
    w.settle(&worker).await;
    w.agent("a1").await;
    w.deploy("a1").await;
    w.settle(&worker).await;
    assert!(w.backend.agent("h1", "ns1", "a1").is_some());
    let first = w.svc.delete_agent("test", "ns1", "a1").await.unwrap();
    let second = w.svc.delete_agent("test", "ns1", "a1").await.unwrap();
    let (work, step) = w.once(&worker).await;
    assert_eq!(work.id, first);
    assert_step(&step, "done", "AGENT_DELETED", "removed from its host");
    assert!(w.backend.agent("h1", "ns1", "a1").is_none());
    let (work, step) = w.once(&worker).await;
    assert_eq!(work.id, second);
    assert_step(&step, "done", "AGENT_DELETED", "already gone");
    let record = w
        .store
        .work_item("ns1", "a1", second)
        .await
        .unwrap()
        .unwrap();
    assert_recorded(&record, WorkState::Done, "AGENT_DELETED");
}

/// A deploy waiting for its retry while its Agent is deleted ends `AGENT_GONE`; while its
/// Agent is deleted and created again under the same id, `REVISION_GONE`. Neither reaches
/// the host again.
#[tokio::test]
async fn a_deploy_whose_agent_or_revision_went_away_ends_gone() {
    let w = World::pool(100).await;
    let worker = w.worker_with(WorkerSettings {
        // Long enough that the deletion queued after the failed attempt always runs first.
        backoff_initial: Duration::from_secs(1),
        backoff_max: Duration::from_secs(1),
        ..settings()
    });
    w.settle(&worker).await;
    for (agent, recreate, code, message) in [
        ("a1", false, "AGENT_GONE", "the Agent was deleted"),
        ("a2", true, "REVISION_GONE", "the revision was deleted"),
    ] {
        w.agent(agent).await;
        w.deploy(agent).await;
        w.settle(&worker).await;
        let rev = w.deploy(agent).await;
        w.backend.inject(w.backend.calls(), Inject::Transport);
        let (deploy, step) = w.once(&worker).await;
        assert_eq!(deploy.revision_id.as_deref(), Some(rev.as_str()));
        assert_step(&step, "retry", "HOST_UNREACHABLE", "injected");
        // The deletion runs while the deploy waits for its retry.
        w.svc.delete_agent("test", "ns1", agent).await.unwrap();
        let (work, step) = w.once(&worker).await;
        assert_eq!(work.kind, WorkKind::DeleteAgent, "{agent}");
        assert_step(&step, "done", "AGENT_DELETED", "removed from its host");
        if recreate {
            w.agent(agent).await;
        }
        let calls = w.backend.calls();
        assert!(worker.run_once().await.is_none(), "the retry ran early");
        tokio::time::sleep(Duration::from_millis(1050)).await;
        let (work, step) = w.once(&worker).await;
        assert_eq!(work.id, deploy.id, "{agent}");
        assert_step(&step, "done", code, message);
        assert_eq!(w.backend.calls(), calls, "{agent}: the host was asked");
        let record = w
            .store
            .work_item("ns1", agent, deploy.id)
            .await
            .unwrap()
            .unwrap();
        assert_recorded(&record, WorkState::Done, code);
    }
    assert_eq!(
        w.svc.agent("ns1", "a2").await.unwrap().active_revision_id,
        None
    );
}

/// Work older than the convergence deadline fails at once, without reaching the host.
#[tokio::test]
async fn work_past_the_convergence_deadline_fails() {
    let w = World::pool(100).await;
    w.settle(&w.worker()).await;
    w.agent("a1").await;
    let rev = w.deploy("a1").await;
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let late = w.worker_with(WorkerSettings {
        convergence_deadline: Duration::from_secs(1),
        ..settings()
    });
    let calls = w.backend.calls();
    let (_, step) = w.once(&late).await;
    assert_step(
        &step,
        "failed",
        "CONVERGENCE_DEADLINE_EXCEEDED",
        "not converged within 1 s",
    );
    assert_eq!(w.backend.calls(), calls);
    let r = w.revision("a1", &rev).await;
    assert_eq!(r.status, RevisionStatus::Failed);
    assert_eq!(
        r.last_attempt.unwrap().code,
        "CONVERGENCE_DEADLINE_EXCEEDED"
    );
    assert_recorded(
        &w.last_work("a1").await,
        WorkState::Failed,
        "CONVERGENCE_DEADLINE_EXCEEDED",
    );
}

/// A damaged database fails the work it concerns, with nothing sent: a stored id no operation
/// can carry, an active revision that does not exist, and work items without what their kind
/// needs.
#[tokio::test]
async fn damaged_stored_state_fails_the_work_with_its_code() {
    let w = World::pool(100).await;
    let worker = w.worker();
    w.settle(&worker).await;
    for a in ["a1", "a2", "a3"] {
        w.agent(a).await;
    }
    w.deploy("a2").await;
    w.settle(&worker).await;
    let calls = w.backend.calls();

    // Damaged after the deploy was queued: the store refuses the row, naming the column.
    w.deploy("a1").await;
    w.sql("UPDATE agents SET service_principal_id = 'not an id!' WHERE id = 'a1'")
        .await;
    let (_, step) = w.once(&worker).await;
    assert_step(
        &step,
        "failed",
        "INVALID_STORED_ID",
        "column service_principal_id holds \"not an id!\"",
    );
    assert_recorded(
        &w.last_work("a1").await,
        WorkState::Failed,
        "INVALID_STORED_ID",
    );

    w.sql("UPDATE agents SET active_revision_id = 'no-such-revision' WHERE id = 'a2'")
        .await;
    w.svc.stop("test", "ns1", "a2").await.unwrap();
    let (_, step) = w.once(&worker).await;
    assert_step(
        &step,
        "failed",
        "INVALID_STATE",
        "the Agent's Namespace or revision is missing",
    );
    assert_recorded(&w.last_work("a2").await, WorkState::Failed, "INVALID_STATE");

    for (item, message) in [
        (
            Enqueue::namespace(WorkKind::Stop, "ns1"),
            "stop work without an Agent",
        ),
        (
            Enqueue::namespace(WorkKind::DeleteAgent, "ns1"),
            "delete work without an Agent",
        ),
        (
            Enqueue::agent(WorkKind::Deploy, "ns1", "a3"),
            "deploy work without an Agent or revision",
        ),
    ] {
        w.store.enqueue(&item).await.unwrap();
        let (_, step) = w.once(&worker).await;
        assert_step(&step, "failed", "INVALID_WORK", message);
    }
    assert_recorded(&w.last_work("a3").await, WorkState::Failed, "INVALID_WORK");
    assert_eq!(w.backend.calls(), calls, "a damaged item reached the host");
}

/// hostd's engine, except that it answers `prepare-revision` with the result of another
/// operation (a `status` of the same host).
struct Misanswering(Arc<EngineBackend>);

impl Backend for Misanswering {
    async fn call(
        &self,
        target: impl Into<Target> + Send,
        operation: Operation,
        options: CallOptions,
    ) -> Result<OperationResult, CallError> {
        let operation = match operation {
            Operation::PrepareRevision(_) => Operation::Status(StatusArgs { namespace_id: None }),
            other => other,
        };
        self.0.call(target, operation, options).await
    }
}

/// A host that answers with the result of another operation fails the deploy with
/// `INVALID_HOST_RESULT`; nothing is committed.
#[tokio::test]
async fn a_result_of_another_operation_is_invalid_host_result() {
    let w = World::pool(100).await;
    let worker = Worker::new(
        w.store.clone(),
        Arc::new(Misanswering(w.backend.clone())),
        settings(),
    );
    w.settle(&worker).await;
    w.agent("a1").await;
    let rev = w.deploy("a1").await;
    let (_, step) = w.once(&worker).await;
    assert_step(&step, "failed", "INVALID_HOST_RESULT", "prepare answered");
    let r = w.revision("a1", &rev).await;
    assert_eq!(r.status, RevisionStatus::Failed);
    assert_eq!(r.last_attempt.unwrap().code, "INVALID_HOST_RESULT");
    assert_eq!(
        w.svc.agent("ns1", "a1").await.unwrap().active_revision_id,
        None
    );
}

/// A write the store refuses during work is `STORE_UNAVAILABLE`: retried without spending an
/// attempt, and the deploy converges once the store takes the write.
#[tokio::test]
async fn a_store_failure_during_work_is_retried_as_store_unavailable() {
    let w = World::pool(100).await;
    let worker = w.worker();
    w.settle(&worker).await;
    w.agent("a1").await;
    let rev = w.deploy("a1").await;
    // Placement writes the Agent's host; the claim's fence update is another column.
    w.sql(
        "CREATE TRIGGER refuse_placement BEFORE UPDATE OF host_name ON agents
           BEGIN SELECT RAISE(ABORT, 'injected: the disk refused the write'); END;",
    )
    .await;
    let (_, step) = w.once(&worker).await;
    assert_step(&step, "retry", "STORE_UNAVAILABLE", "injected");
    assert!(matches!(step, Step::Retry { attempt: false, .. }));
    let record = w.last_work("a1").await;
    assert_recorded(&record, WorkState::Queued, "STORE_UNAVAILABLE");
    assert_eq!(record.attempts, 0);
    assert_eq!(
        w.revision("a1", &rev).await.last_attempt.unwrap().code,
        "STORE_UNAVAILABLE"
    );
    assert_eq!(w.prepares(), 0);

    w.sql("DROP TRIGGER refuse_placement").await;
    // The retry waits a second.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    w.settle(&worker).await;
    assert_eq!(
        w.svc
            .agent("ns1", "a1")
            .await
            .unwrap()
            .served_revision_id
            .as_deref(),
        Some(rev.as_str())
    );
}

/// Item 7 (issue 27): with restore off, an activation whose candidate never became ready was
/// retried without spending attempts until the convergence deadline (57 passes in 900 s, as
/// long as `--wait`'s default, so `--wait` ended with its timeout rather than the failure).
/// Now each such pass spends an attempt and the item fails after `worker.max_attempts`.
#[tokio::test]
async fn readiness_failures_without_restore_spend_the_attempt_budget() {
    let w = World::pool(100).await;
    let worker = w.worker_with(WorkerSettings {
        max_attempts: 3,
        ..settings()
    });
    w.settle(&worker).await;
    w.agent("a1").await;
    w.backend
        .fail_activations_of("a1", FailureCode::ReadinessTimeout);
    w.deploy("a1").await;
    let mut last = None;
    for _ in 0..2000 {
        match worker.run_once().await {
            Some((_, step @ Step::Failed { .. })) => {
                last = Some(step);
                break;
            }
            Some((_, step)) => last = Some(step),
            None => tokio::time::sleep(Duration::from_millis(2)).await,
        }
    }
    let activations = w
        .backend
        .log()
        .iter()
        .filter(|l| l.ends_with("activate-revision"))
        .count();
    let step = last.expect("no pass ran");
    assert_step(
        &step,
        "failed",
        "READINESS_TIMEOUT",
        "gave up after 3 attempts",
    );
    assert_eq!(activations, 3, "one activation per attempt");
    assert_recorded(
        &w.last_work("a1").await,
        WorkState::Failed,
        "READINESS_TIMEOUT",
    );
}

/// Item 7 (issue 27): a coordinator that joined a shared database before it was enrolled on
/// every host took work there and failed it for good with HOST_AUTH_REFUSED, though an
/// enrolled coordinator could have done it. Now the item goes back to the queue (an attempt
/// spent) and the next claim, here one the host accepts, finishes it.
#[tokio::test]
async fn a_host_refusing_this_coordinator_leaves_the_work_for_another() {
    let w = World::pool(100).await;
    let worker = w.worker();
    w.settle(&worker).await;
    w.agent("a1").await;
    let rev = w.deploy("a1").await;
    w.backend.inject(w.backend.calls(), Inject::AuthRefused);
    let (_, step) = w.once(&worker).await;
    assert_step(
        &step,
        "retry",
        "HOST_AUTH_REFUSED",
        "left for another coordinator",
    );
    let record = w.last_work("a1").await;
    assert_eq!(record.state, WorkState::Queued, "{record:?}");
    w.settle(&worker).await;
    assert_recorded(
        &w.last_work("a1").await,
        WorkState::Done,
        "REVISION_ACTIVATED",
    );
    assert_eq!(w.revision("a1", &rev).await.status, RevisionStatus::Active);
}

/// Issue 27 item 1: a stop after an activation refused before its cutover (the target still
/// runs the previous revision while `activeRevisionId` names the candidate) stops what runs,
/// and says stopped only once the target reports nothing running.
#[tokio::test]
async fn a_stop_after_a_refused_activation_stops_the_revision_that_still_runs() {
    let w = World::pool(100).await;
    let worker = w.worker();
    w.settle(&worker).await;
    w.agent("a1").await;
    let first = w.deploy("a1").await;
    w.settle(&worker).await;
    w.backend
        .fail_activations_of("a1", FailureCode::KubernetesOwnershipConflict);
    let second = w.deploy("a1").await;
    w.settle(&worker).await;
    let agent = w.svc.agent("ns1", "a1").await.unwrap();
    assert_eq!(agent.active_revision_id.as_deref(), Some(second.as_str()));
    let on_host = w.backend.agent("h1", "ns1", "a1").unwrap();
    assert_eq!(on_host.served.as_deref(), Some(first.as_str()));

    w.svc.stop("test", "ns1", "a1").await.unwrap();
    let (work, step) = w.once(&worker).await;
    assert_eq!(work.kind, WorkKind::Stop);
    assert_step(&step, "done", "REVISION_STOPPED", "stopped on h1");
    let on_host = w.backend.agent("h1", "ns1", "a1").unwrap();
    assert_eq!(on_host.served, None, "the old revision still serves");
    assert_eq!(on_host.current, None, "{on_host:?}");
    assert_eq!(
        w.svc
            .agent("ns1", "a1")
            .await
            .unwrap()
            .served_revision_id
            .as_deref(),
        None
    );
}

/// Issue 27 item 3: a retryable failure of a cluster Namespace's ensure is retried past the
/// attempt budget (granting rights later recovers it), and Namespace status shows its code
/// and message meanwhile.
#[tokio::test]
async fn a_cluster_namespace_retries_its_ensure_and_shows_why_it_is_not_ready() {
    let w = World::on_cluster().await;
    let worker = w.worker();
    let budget = settings().max_attempts as usize;
    for n in 0..budget + 2 {
        w.backend
            .inject(n, Inject::Fail(FailureCode::NamespaceMissing));
    }
    for _ in 0..budget + 2 {
        let (work, step) = w.once(&worker).await;
        assert_eq!(work.kind, WorkKind::EnsureNamespace);
        assert_step(&step, "retry", "NAMESPACE_MISSING", "injected");
        assert!(
            matches!(step, Step::Retry { attempt: false, .. }),
            "{step:?}"
        );
        let status = w.svc.namespace_status("ns1").await.unwrap();
        assert_eq!(status["ready"], json!(false), "{status}");
        assert_eq!(
            status["work"]["kind"],
            json!("ensure-namespace"),
            "{status}"
        );
        assert_eq!(status["work"]["state"], json!("queued"), "{status}");
        assert_eq!(
            status["work"]["lastAttempt"]["code"],
            json!("NAMESPACE_MISSING"),
            "{status}"
        );
        assert!(
            status["work"]["lastAttempt"]["message"]
                .as_str()
                .unwrap()
                .contains("injected"),
            "{status}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (_, step) = w.once(&worker).await;
    assert_step(&step, "done", "NAMESPACE_READY", "ready on c1");
    let status = w.svc.namespace_status("ns1").await.unwrap();
    assert_eq!(status["ready"], json!(true), "{status}");
    assert_eq!(status["work"]["state"], json!("done"), "{status}");
}

/// A target whose stop answers as if the gateway still ran (a stop that did not take).
struct StopDoesNotTake(Arc<EngineBackend>);

impl Backend for StopDoesNotTake {
    async fn call(
        &self,
        target: impl Into<Target> + Send,
        operation: Operation,
        options: CallOptions,
    ) -> Result<OperationResult, CallError> {
        if let Operation::StopRevision(args) = &operation {
            let observation = clawfleet_protocol::result::AgentObservation {
                current: Some(args.revision.id.clone()),
                served: None,
                port: Some(18789),
                unit: Some(clawfleet_protocol::result::UnitObservation {
                    name: "gw".into(),
                    active_state: "activating".into(),
                    sub_state: "start".into(),
                    n_restarts: 0,
                    enabled: true,
                }),
            };
            return Ok(OperationResult::StopRevision(
                clawfleet_protocol::result::StopResult {
                    stopped: true,
                    observation,
                },
            ));
        }
        self.0.call(target, operation, options).await
    }
}

/// Issue 27 item 1: a stop is `REVISION_STOPPED` only when the target reports nothing
/// running; while it still reports the gateway up, the stop is retried as `STOP_INCOMPLETE`
/// and the active revision stays recorded.
#[tokio::test]
async fn a_stop_the_target_still_reports_running_is_not_stopped() {
    let w = World::pool(100).await;
    let worker = w.worker();
    w.settle(&worker).await;
    w.agent("a1").await;
    let first = w.deploy("a1").await;
    w.settle(&worker).await;
    w.svc.stop("test", "ns1", "a1").await.unwrap();
    let stubborn = Worker::new(
        w.store.clone(),
        Arc::new(StopDoesNotTake(w.backend.clone())),
        settings(),
    );
    let (work, step) = w.once(&stubborn).await;
    assert_eq!(work.kind, WorkKind::Stop);
    assert_step(&step, "retry", "STOP_INCOMPLETE", "still reports revision");
    assert_recorded(
        &w.last_work("a1").await,
        WorkState::Queued,
        "STOP_INCOMPLETE",
    );
    assert_eq!(
        w.svc
            .agent("ns1", "a1")
            .await
            .unwrap()
            .active_revision_id
            .as_deref(),
        Some(first.as_str()),
        "not recorded as stopped"
    );
    // The real target stops it on the retry.
    tokio::time::sleep(Duration::from_millis(20)).await;
    let (_, step) = w.once(&worker).await;
    assert_step(&step, "done", "REVISION_STOPPED", "stopped on h1");
}

/// hostd's engine behind a hostd that predates restore: an `activate-revision` that names a
/// revision to restore is refused as such a hostd's decoder refuses it (the envelope as the
/// coordinator sends it, its `restore` field renamed to one this protocol does not know
/// either, decoded as hostd decodes what it receives); one without restore runs.
struct PredatesRestore {
    engine: Arc<EngineBackend>,
    refused: std::sync::Mutex<Vec<FailureCode>>,
}

impl Backend for PredatesRestore {
    async fn call(
        &self,
        target: impl Into<Target> + Send,
        operation: Operation,
        options: CallOptions,
    ) -> Result<OperationResult, CallError> {
        let target = target.into();
        if let Operation::ActivateRevision(args) = &operation
            && args.restore.is_some()
        {
            let now = coordinator::clock::now_seconds() as u64;
            let sent = Envelope {
                version: PROTOCOL_VERSION,
                operation_id: OperationId::new("occ-test-op").unwrap(),
                target: envelope::Target {
                    host: HostName::new(target.name()).unwrap(),
                    host_key: Fingerprint::new(format!("SHA256:{}", "A".repeat(43))).unwrap(),
                },
                issuer: Principal::new("occ").unwrap(),
                issued_at: now,
                expires_at: now + 60,
                deadline_seconds: 30,
                fence: None,
                operation: operation.clone(),
            };
            let mut wire: serde_json::Value =
                serde_json::from_slice(&sent.to_bytes().unwrap()).unwrap();
            let args = wire["operation"].as_object_mut().unwrap();
            let restore = args
                .remove("restore")
                .expect("the envelope names no restore");
            args.insert("restoreNext".to_owned(), restore);
            let failure = Envelope::decode(&serde_json::to_vec(&wire).unwrap(), &Limits::default())
                .expect_err("an unknown field decoded")
                .to_failure();
            self.refused.lock().unwrap().push(failure.code);
            return Err(CallError::Failed(failure));
        }
        self.engine.call(target, operation, options).await
    }
}

/// A hostd that predates restore refuses an activation naming one with the typed
/// `OPERATION_UNSUPPORTED` (not a message the coordinator would have to read): the worker
/// activates again without restore, and the deploy converges.
#[tokio::test]
async fn a_hostd_that_predates_restore_is_activated_without_it() {
    let w = World::pool(100).await;
    let backend = Arc::new(PredatesRestore {
        engine: w.backend.clone(),
        refused: std::sync::Mutex::new(Vec::new()),
    });
    let worker = Worker::new(w.store.clone(), backend.clone(), settings());
    w.settle(&worker).await;
    w.agent_with("a1", Some(RestorePolicy::LastServed), None)
        .await;
    let first = w.deploy("a1").await;
    w.settle(&worker).await;
    let agent = w.svc.agent("ns1", "a1").await.unwrap();
    assert_eq!(agent.served_revision_id.as_deref(), Some(first.as_str()));
    assert!(
        backend.refused.lock().unwrap().is_empty(),
        "nothing to restore yet"
    );

    let second = w.deploy("a1").await;
    assert_ne!(first, second);
    w.settle(&worker).await;
    assert_eq!(
        *backend.refused.lock().unwrap(),
        vec![FailureCode::OperationUnsupported],
        "one activation naming restore, refused"
    );
    assert_recorded(
        &w.last_work("a1").await,
        WorkState::Done,
        "REVISION_ACTIVATED",
    );
    let agent = w.svc.agent("ns1", "a1").await.unwrap();
    assert_eq!(agent.active_revision_id.as_deref(), Some(second.as_str()));
    assert_eq!(agent.served_revision_id.as_deref(), Some(second.as_str()));
}

/// A target whose policy is TCP 443 to public addresses and no other range (a cluster's, or a
/// pool's default hostd.toml): it records the egress of every prepare and refuses one that
/// asks for more with EGRESS_NOT_ALLOWED, as hostd and the Kubernetes backend do; anything
/// else is hostd's engine.
struct EgressCeiling {
    engine: Arc<EngineBackend>,
    prepared: std::sync::Mutex<Vec<Option<Egress>>>,
}

impl Backend for EgressCeiling {
    async fn call(
        &self,
        target: impl Into<Target> + Send,
        operation: Operation,
        options: CallOptions,
    ) -> Result<OperationResult, CallError> {
        if let Operation::PrepareRevision(args) = &operation {
            self.prepared.lock().unwrap().push(args.egress.clone());
            if let Some(Err(e)) = args.egress.as_ref().map(|e| e.within(&[443], &[])) {
                return Err(CallError::Failed(Failure::new(
                    FailureCode::EgressNotAllowed,
                    e.to_string(),
                )));
            }
        }
        self.engine.call(target, operation, options).await
    }
}

/// Issue 28: a deploy's prepare carries the Agent's egress settings as they are when it runs
/// (set at creation, replaced, dropped); a target's EGRESS_NOT_ALLOWED (permanent) fails the
/// deploy at once with that code and the target's sentence in the work item, the revision
/// and the deployment status, without a second prepare, and the active revision stays.
#[tokio::test]
async fn a_deploy_carries_the_agents_egress_and_a_refusal_fails_it_once() {
    let w = World::pool(100).await;
    let backend = Arc::new(EgressCeiling {
        engine: w.backend.clone(),
        prepared: std::sync::Mutex::new(Vec::new()),
    });
    let worker = Worker::new(w.store.clone(), backend.clone(), settings());
    w.settle(&worker).await;
    let narrow = Egress {
        ports: Some(vec![443]),
        allow: Some(vec![]),
    };
    w.agent_with("a1", None, Some(narrow.clone())).await;
    let first = w.deploy("a1").await;
    w.settle(&worker).await;
    assert_eq!(
        *backend.prepared.lock().unwrap(),
        vec![Some(narrow.clone())]
    );
    assert_recorded(
        &w.last_work("a1").await,
        WorkState::Done,
        "REVISION_ACTIVATED",
    );

    // Wider than the target allows: refused once, permanent.
    let patch = |egress: Egress| AgentPatch {
        configuration_id: None,
        restore: None,
        egress: Some(egress),
    };
    let wider = Egress {
        ports: Some(vec![22]),
        allow: None,
    };
    w.svc
        .patch_agent("test", "ns1", "a1", patch(wider.clone()))
        .await
        .unwrap();
    let refused = w.deploy("a1").await;
    let (_, step) = w.once(&worker).await;
    assert_step(
        &step,
        "failed",
        "EGRESS_NOT_ALLOWED",
        "egress.ports[0] is 22",
    );
    w.settle(&worker).await;
    assert_eq!(
        backend.prepared.lock().unwrap()[1..],
        [Some(wider)],
        "one prepare, not retried"
    );
    let work = w.last_work("a1").await;
    assert_recorded(&work, WorkState::Failed, "EGRESS_NOT_ALLOWED");
    let attempt = work.last_attempt.as_ref().unwrap();
    assert!(
        attempt.message.contains("egress.ports[0] is 22"),
        "{attempt:?}"
    );
    let rev = w.revision("a1", &refused).await;
    assert_eq!(rev.status, RevisionStatus::Failed, "{rev:?}");
    assert_eq!(
        rev.last_attempt.as_ref().map(|a| a.code.as_str()),
        Some("EGRESS_NOT_ALLOWED")
    );
    let status = w.svc.deployment_status("ns1", "a1").await.unwrap();
    assert_eq!(status.last_code.as_deref(), Some("EGRESS_NOT_ALLOWED"));
    assert_eq!(status.active_revision_id.as_deref(), Some(first.as_str()));

    // Dropped (`{}`): the next prepare carries none, and the deploy converges.
    w.svc
        .patch_agent("test", "ns1", "a1", patch(Egress::default()))
        .await
        .unwrap();
    let third = w.deploy("a1").await;
    w.settle(&worker).await;
    assert_eq!(backend.prepared.lock().unwrap().last(), Some(&None));
    assert_recorded(
        &w.last_work("a1").await,
        WorkState::Done,
        "REVISION_ACTIVATED",
    );
    let agent = w.svc.agent("ns1", "a1").await.unwrap();
    assert_eq!(agent.active_revision_id.as_deref(), Some(third.as_str()));
    assert_eq!(agent.egress, None);
}

/// The same refusal from hostd's own engine (the pool's default `[network] egress_ports`,
/// 443, and no range): the deploy fails after one prepare with hostd's sentence, which names
/// the entry and where the pool's policy is set.
#[tokio::test]
async fn hostd_refusing_an_agents_egress_fails_the_deploy_without_a_retry() {
    let w = World::pool(100).await;
    let worker = w.worker();
    w.settle(&worker).await;
    w.agent_with(
        "a1",
        None,
        Some(Egress {
            ports: None,
            allow: Some(vec!["10.1.0.0/16".into()]),
        }),
    )
    .await;
    let refused = w.deploy("a1").await;
    w.settle(&worker).await;
    assert_eq!(w.prepares(), 1, "not retried: {:?}", w.backend.log());
    let work = w.last_work("a1").await;
    assert_recorded(&work, WorkState::Failed, "EGRESS_NOT_ALLOWED");
    let message = &work.last_attempt.as_ref().unwrap().message;
    assert!(
        message.contains("egress.allow[0] is 10.1.0.0/16") && message.contains("hostd.toml"),
        "{message}"
    );
    let rev = w.revision("a1", &refused).await;
    assert_eq!(rev.status, RevisionStatus::Failed, "{rev:?}");
    let status = w.svc.deployment_status("ns1", "a1").await.unwrap();
    assert_eq!(status.last_code.as_deref(), Some("EGRESS_NOT_ALLOWED"));
    assert_eq!(status.active_revision_id, None);
}
