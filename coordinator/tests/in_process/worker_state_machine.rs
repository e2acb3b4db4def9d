//! The deployment worker over hostd's real engine in process (tests/hostd_engine/mod.rs):
//! convergence, supersession, permanence, stop/delete ordering, and a crash at every call,
//! with and without the host having applied it, followed by resumption.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::hostd_engine;

use std::sync::Arc;
use std::time::Duration;

use clawfleet_protocol::Ident;
use clawfleet_protocol::failure::FailureCode;
use coordinator::config::WorkerSettings;
use coordinator::model::{DesiredState, RevisionStatus};
use coordinator::service::Service;
use coordinator::store::SharedStore;
use coordinator::store::sqlite::SqliteStore;
use coordinator::worker::{Step, Worker};
use hostd_engine::{EngineBackend, Inject};
use serde_json::json;

/// The number of a revision id (`rev-N-…`): ids also name their content, tests name numbers.
fn rev_num(id: Option<&str>) -> Option<u64> {
    id.and_then(coordinator::model::Revision::number_of)
}

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

struct World {
    svc: Service,
    store: SharedStore,
    backend: Arc<EngineBackend>,
}

impl World {
    async fn new(hosts: usize) -> Self {
        Self::on(Arc::new(SqliteStore::in_memory().unwrap()), hosts).await
    }

    /// `hosts` pool hosts and Namespace ns1 with Configuration cfg, on `store`.
    async fn on(store: SharedStore, hosts: usize) -> Self {
        let svc = Service::new(store.clone());
        let names = crate::fixtures::enrol_hosts(&svc, hosts).await;
        crate::fixtures::namespace(&svc, "ns1", names, None).await;
        crate::fixtures::configuration(&svc, "ns1", json!({"logging": {"level": "info"}})).await;
        Self {
            svc,
            store,
            backend: Arc::new(EngineBackend::new()),
        }
    }

    /// A Namespace placed on a (fake) cluster named c1 instead of a host pool.
    async fn on_cluster() -> Self {
        let store = {
            let s: SharedStore = Arc::new(SqliteStore::in_memory().unwrap());
            s
        };
        crate::fixtures::fake_cluster(&store).await;
        let svc = Service::new(store.clone());
        crate::fixtures::namespace(&svc, "ns1", vec![], Some("c1".into())).await;
        crate::fixtures::configuration(&svc, "ns1", json!({})).await;
        Self {
            svc,
            store,
            backend: Arc::new(EngineBackend::new()),
        }
    }

    fn worker(&self) -> Worker<EngineBackend> {
        Worker::new(self.store.clone(), self.backend.clone(), settings())
    }

    async fn agent(&self, id: &str) {
        crate::fixtures::agent(&self.svc, "ns1", id).await;
    }

    /// Runs the worker until no work is left (or a bound is hit); returns every step.
    async fn settle(&self, w: &Worker<EngineBackend>) -> Vec<Step> {
        let mut steps = Vec::new();
        for _ in 0..500 {
            match w.run_once().await {
                Some((_, s)) => steps.push(s),
                None => {
                    if self.store.pending_work().await.unwrap() == 0 {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
            }
        }
        steps
    }
}

#[tokio::test]
async fn deploy_replace_stop_delete_converge() {
    let w = World::new(2).await;
    let worker = w.worker();
    w.agent("a1").await;
    w.svc.deploy("test", "ns1", "a1").await.unwrap();
    w.settle(&worker).await;
    let a = w.svc.agent("ns1", "a1").await.unwrap();
    let host = a.host.clone().unwrap();
    assert_eq!(rev_num(a.active_revision_id.as_deref()), Some(1));
    assert_eq!(rev_num(a.served_revision_id.as_deref()), Some(1));
    assert!(w.backend.has_namespace("h1", "ns1") && w.backend.has_namespace("h2", "ns1"));

    // Replace: rev-2 active, rev-1 retired on the host, placement sticky.
    w.svc
        .put_configuration(
            "test",
            "ns1",
            "cfg",
            json!({"logging": {"level": "debug"}}),
            false,
        )
        .await
        .unwrap();
    w.svc.deploy("test", "ns1", "a1").await.unwrap();
    w.settle(&worker).await;
    let a = w.svc.agent("ns1", "a1").await.unwrap();
    assert_eq!(a.host.as_deref(), Some(host.as_str()));
    assert_eq!(rev_num(a.active_revision_id.as_deref()), Some(2));
    let on_host = w.backend.agent(&host, "ns1", "a1").unwrap();
    assert_eq!(rev_num(on_host.served.as_deref()), Some(2));
    assert_eq!(
        on_host
            .snapshots
            .keys()
            .map(|k| rev_num(Some(k)))
            .collect::<Vec<_>>(),
        vec![Some(2)]
    );
    let revs = w.store.revisions("ns1", "a1").await.unwrap();
    assert_eq!(revs[0].status, RevisionStatus::Retired);
    assert_eq!(revs[1].status, RevisionStatus::Active);
    assert_eq!(
        revs[1].last_attempt.as_ref().unwrap().code,
        "REVISION_ACTIVATED"
    );

    // Stop: the host stops first, then activeRevisionId is cleared.
    w.svc.stop("test", "ns1", "a1").await.unwrap();
    w.settle(&worker).await;
    let a = w.svc.agent("ns1", "a1").await.unwrap();
    assert_eq!(a.active_revision_id, None);
    assert_eq!(a.desired_state, DesiredState::Stopped);
    assert_eq!(w.backend.agent(&host, "ns1", "a1").unwrap().served, None);

    // Namespace deletion is refused while it has Agents.
    assert!(w.svc.delete_namespace("test", "ns1").await.is_err());
    w.svc.delete_agent("test", "ns1", "a1").await.unwrap();
    w.settle(&worker).await;
    assert!(w.store.agent("ns1", "a1").await.unwrap().is_none());
    assert!(w.backend.agent(&host, "ns1", "a1").is_none());
    w.svc.delete_namespace("test", "ns1").await.unwrap();
    w.settle(&worker).await;
    assert!(w.store.namespace("ns1").await.unwrap().is_none());
    assert!(!w.backend.has_namespace("h1", "ns1"));
}

#[tokio::test]
async fn a_newer_revision_supersedes_older_work() {
    let w = World::new(1).await;
    let worker = w.worker();
    w.agent("a1").await;
    w.svc.deploy("test", "ns1", "a1").await.unwrap();
    w.svc.deploy("test", "ns1", "a1").await.unwrap();
    w.svc.deploy("test", "ns1", "a1").await.unwrap();
    w.settle(&worker).await;
    let revs = w.store.revisions("ns1", "a1").await.unwrap();
    assert_eq!(
        revs[0].last_attempt.as_ref().unwrap().code,
        "REVISION_SUPERSEDED"
    );
    assert_eq!(
        revs[1].last_attempt.as_ref().unwrap().code,
        "REVISION_SUPERSEDED"
    );
    assert_eq!(
        rev_num(
            w.svc
                .agent("ns1", "a1")
                .await
                .unwrap()
                .active_revision_id
                .as_deref()
        ),
        Some(3)
    );
    // rev-1 and rev-2 were never prepared on the host.
    assert_eq!(
        w.backend
            .log()
            .iter()
            .filter(|l| l.contains("prepare"))
            .count(),
        1
    );
}

/// Revisions superseded in the queue never reached the host: retiring them costs no host
/// call (they are retired in the store); only the revision the host held is retired there.
#[tokio::test]
async fn a_revision_that_never_reached_the_host_is_retired_without_a_host_call() {
    let w = World::new(1).await;
    let worker = w.worker();
    w.agent("a1").await;
    w.svc.deploy("test", "ns1", "a1").await.unwrap();
    w.settle(&worker).await;
    // Three more deploys before the worker runs again: 2 and 3 are superseded in the queue.
    for _ in 0..3 {
        w.svc.deploy("test", "ns1", "a1").await.unwrap();
    }
    let before = w.backend.log().len();
    w.settle(&worker).await;
    let calls: Vec<String> = w.backend.log()[before..].to_vec();
    let of = |kind: &str| calls.iter().filter(|l| l.ends_with(kind)).count();
    assert_eq!(of(" prepare-revision"), 1, "{calls:?}");
    assert_eq!(
        of(" retire-revision"),
        1,
        "only revision 1 was ever on the host: {calls:?}"
    );
    let a = w.svc.agent("ns1", "a1").await.unwrap();
    assert_eq!(rev_num(a.active_revision_id.as_deref()), Some(4));
    let revs = w.store.revisions("ns1", "a1").await.unwrap();
    let statuses: Vec<_> = revs.iter().map(|r| r.status).collect();
    assert_eq!(
        statuses,
        vec![
            RevisionStatus::Retired,
            RevisionStatus::Retired,
            RevisionStatus::Retired,
            RevisionStatus::Active
        ]
    );
    let host = a.host.unwrap();
    let on_host = w.backend.agent(&host, "ns1", "a1").unwrap();
    assert_eq!(
        on_host
            .snapshots
            .keys()
            .map(|k| rev_num(Some(k)))
            .collect::<Vec<_>>(),
        vec![Some(4)]
    );
    // Another deploy retires revision 4 on the host, and nothing already retired again.
    w.svc.deploy("test", "ns1", "a1").await.unwrap();
    let before = w.backend.log().len();
    w.settle(&worker).await;
    let calls: Vec<String> = w.backend.log()[before..].to_vec();
    assert_eq!(
        calls
            .iter()
            .filter(|l| l.ends_with(" retire-revision"))
            .count(),
        1,
        "{calls:?}"
    );
}

#[tokio::test]
async fn permanent_failures_stay_permanent_and_retryable_ones_use_the_budget() {
    let w = World::new(1).await;
    let worker = w.worker();
    w.agent("a1").await;
    w.svc.deploy("test", "ns1", "a1").await.unwrap();
    // Call 0 is ensure-namespace for the pool; call 1 is the first prepare.
    w.backend
        .inject(1, Inject::Fail(FailureCode::SnapshotMismatch));
    w.settle(&worker).await;
    let rev = &w.store.revisions("ns1", "a1").await.unwrap()[0];
    assert_eq!(rev.status, RevisionStatus::Failed);
    assert_eq!(rev.last_attempt.as_ref().unwrap().code, "SNAPSHOT_MISMATCH");
    assert_eq!(
        w.svc.agent("ns1", "a1").await.unwrap().active_revision_id,
        None,
        "nothing was committed"
    );

    // Transport errors before the commit: retried, then given up after max_attempts.
    let n = w.backend.calls();
    for i in 0..5 {
        w.backend.inject(n + i, Inject::Transport);
    }
    w.svc.deploy("test", "ns1", "a1").await.unwrap();
    w.settle(&worker).await;
    let rev = &w.store.revisions("ns1", "a1").await.unwrap()[1];
    assert_eq!(rev.status, RevisionStatus::Failed);
    let attempt = rev.last_attempt.as_ref().unwrap();
    assert_eq!(attempt.code, "HOST_UNREACHABLE");
    assert_eq!(attempt.attempts, 5);

    // A retryable failure after the commit is REVISION_FINALIZATION_INCOMPLETE, then converges.
    w.svc.deploy("test", "ns1", "a1").await.unwrap();
    let n = w.backend.calls();
    w.backend
        .inject(n + 1, Inject::Fail(FailureCode::ReadinessTimeout));
    let steps = w.settle(&worker).await;
    assert!(
        steps.iter().any(
            |s| matches!(s, Step::Retry { code, .. } if code == "REVISION_FINALIZATION_INCOMPLETE")
        ),
        "{steps:?}"
    );
    assert_eq!(
        rev_num(
            w.svc
                .agent("ns1", "a1")
                .await
                .unwrap()
                .served_revision_id
                .as_deref()
        ),
        Some(3)
    );
}

#[tokio::test]
async fn a_crash_at_every_call_resumes_and_converges() {
    // Count the calls of an uninterrupted deploy + replace + stop + delete.
    let script = async |w: &World| {
        w.agent("a1").await;
    };
    let baseline = World::new(1).await;
    script(&baseline).await;
    let worker = baseline.worker();
    baseline.svc.deploy("test", "ns1", "a1").await.unwrap();
    baseline.settle(&worker).await;
    let total = baseline.backend.calls();
    assert!(total >= 3);

    for crash_at in 0..total {
        for applied in [false, true] {
            let w = World::new(1).await;
            script(&w).await;
            w.svc.deploy("test", "ns1", "a1").await.unwrap();
            w.backend.inject(crash_at, Inject::Hang { applied });
            // The first worker "crashes": its future is dropped mid-call, once the call with the
            // hang has been made (however long a loaded machine takes to get there) and the host
            // had time to apply it; a fixed deadline instead let a slow first worker stop short
            // and the second one hang for ever.
            let first = w.worker();
            let hang_reached = async {
                while w.backend.calls() <= crash_at {
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
                tokio::time::sleep(Duration::from_millis(300)).await;
            };
            tokio::select! {
                _ = w.settle(&first) => {}
                () = hang_reached => {}
            }
            drop(first);
            // A restarted coordinator (new lease owner) resumes after the lease expires.
            tokio::time::sleep(Duration::from_millis(250)).await;
            let second = w.worker();
            w.settle(&second).await;
            let a = w.svc.agent("ns1", "a1").await.unwrap();
            assert_eq!(
                rev_num(a.active_revision_id.as_deref()),
                Some(1),
                "crash at call {crash_at} (applied {applied})"
            );
            let on_host = w
                .backend
                .agent(a.host.as_deref().unwrap(), "ns1", "a1")
                .unwrap();
            assert_eq!(
                rev_num(on_host.served.as_deref()),
                Some(1),
                "crash at call {crash_at}"
            );
            assert_eq!(w.store.pending_work().await.unwrap(), 0);
        }
    }
}

#[tokio::test]
async fn placement_spreads_agents_and_respects_capacity() {
    let w = World::new(3).await;
    let worker = w.worker();
    for i in 0..9 {
        w.agent(&format!("a{i}")).await;
        w.svc.deploy("test", "ns1", &format!("a{i}")).await.unwrap();
    }
    w.settle(&worker).await;
    let mut per_host = std::collections::BTreeMap::new();
    for a in w.store.agents("ns1").await.unwrap() {
        assert_eq!(rev_num(a.served_revision_id.as_deref()), Some(1));
        *per_host.entry(a.host.unwrap()).or_insert(0) += 1;
    }
    assert_eq!(
        per_host.values().copied().collect::<Vec<_>>(),
        vec![3, 3, 3]
    );
}

/// A Namespace on a cluster goes through the same worker phases: every call is addressed to
/// the cluster, the Agent has no host, and deploy, replace, stop, delete and Namespace deletion
/// converge as on a host pool.
#[tokio::test]
async fn a_cluster_namespace_converges_through_the_same_phases() {
    let w = World::on_cluster().await;
    let worker = w.worker();
    w.settle(&worker).await;
    assert!(w.svc.namespace("ns1").await.unwrap().ready);
    w.agent("a1").await;
    w.svc.deploy("test", "ns1", "a1").await.unwrap();
    w.settle(&worker).await;
    let a = w.svc.agent("ns1", "a1").await.unwrap();
    assert_eq!(a.host, None);
    assert_eq!(rev_num(a.served_revision_id.as_deref()), Some(1));
    w.svc
        .put_configuration(
            "test",
            "ns1",
            "cfg",
            json!({"logging": {"level": "debug"}}),
            false,
        )
        .await
        .unwrap();
    w.svc.deploy("test", "ns1", "a1").await.unwrap();
    w.settle(&worker).await;
    let on_cluster = w.backend.agent("c1", "ns1", "a1").unwrap();
    assert_eq!(rev_num(on_cluster.served.as_deref()), Some(2));
    assert_eq!(
        on_cluster
            .snapshots
            .keys()
            .map(|k| rev_num(Some(k)))
            .collect::<Vec<_>>(),
        vec![Some(2)]
    );
    w.svc.stop("test", "ns1", "a1").await.unwrap();
    w.settle(&worker).await;
    assert_eq!(
        w.svc.agent("ns1", "a1").await.unwrap().active_revision_id,
        None
    );
    w.svc.delete_agent("test", "ns1", "a1").await.unwrap();
    w.settle(&worker).await;
    assert!(w.backend.agent("c1", "ns1", "a1").is_none());
    w.svc.delete_namespace("test", "ns1").await.unwrap();
    w.settle(&worker).await;
    assert!(w.store.namespace("ns1").await.unwrap().is_none());
    assert!(!w.backend.has_namespace("c1", "ns1"));
    assert!(
        w.backend.log().iter().all(|l| l.starts_with("c1 ")),
        "{:?}",
        w.backend.log()
    );
}

/// The backend is hostd's own engine: a re-prepare of a revision under another number, which
/// the old in-memory model accepted, is refused as hostd refuses it, and the first snapshot
/// stays.
#[tokio::test]
async fn a_re_prepare_with_another_number_is_refused_as_hostd_refuses_it() {
    use clawfleet_protocol::operation::{
        AgentRef, Harness, HarnessId, HarnessMode, HarnessVersion, NamespaceArgs, NamespaceRef,
        PrepareArgs, RevisionNumber, RevisionSpec,
    };
    use clawfleet_protocol::{Configuration, Operation};
    use coordinator::backend::{Backend, CallError, CallOptions, HostTarget};

    let backend = EngineBackend::new();
    let target = HostTarget {
        name: clawfleet_protocol::HostName::new("h1").unwrap(),
        address: "127.0.0.1".into(),
        port: 22,
        host_key: HOST_KEY.into(),
        login_user: None,
        jump: None,
    };
    let namespace = NamespaceRef {
        id: id("ns1"),
        name: id("ns1"),
    };
    let configuration = Configuration::new(json!({"gateway": {"mode": "local"}})).unwrap();
    let prepare = |number: u64| {
        Operation::PrepareRevision(PrepareArgs {
            workspace: None,
            namespace: namespace.clone(),
            agent: AgentRef {
                id: id("a1"),
                service_principal_id: id("a1"),
            },
            revision: RevisionSpec {
                id: id("rev-1"),
                number: RevisionNumber::new(number).unwrap(),
                harness: Harness {
                    id: HarnessId::Openclaw,
                    version: HarnessVersion::new("2026.9.6").unwrap(),
                    mode: HarnessMode::Embedded,
                },
                configuration_hash: configuration.hash(),
                configuration: configuration.clone(),
            },
            egress: None,
        })
    };
    let opts = CallOptions::default();
    backend
        .call(
            &target,
            Operation::EnsureNamespace(NamespaceArgs {
                namespace: namespace.clone(),
            }),
            opts,
        )
        .await
        .unwrap();
    backend.call(&target, prepare(1), opts).await.unwrap();
    match backend.call(&target, prepare(2), opts).await {
        Err(CallError::Failed(f)) => assert!(!f.is_retryable(), "{f}"),
        other => panic!("a re-prepare under another number was accepted: {other:?}"),
    }
    let on_host = backend.agent("h1", "ns1", "a1").unwrap();
    assert_eq!(on_host.snapshots.get("rev-1"), Some(&1));
}

fn id(s: &str) -> Ident {
    Ident::new(s).unwrap()
}

/// Puts Configuration `cfg` with one log level (a new content, so a new revision hash).
async fn level(w: &World, level: &str) {
    let create = w
        .store
        .configuration(&id("ns1"), &id("cfg"))
        .await
        .unwrap()
        .is_none();
    w.svc
        .put_configuration(
            "test",
            "ns1",
            "cfg",
            json!({"logging": {"level": level}}),
            create,
        )
        .await
        .unwrap();
}

/// A database restored from a backup while the host went on to newer revisions: the restored
/// database numbers again from the backup, but never reissues an id for other content; the
/// host refuses the reused number (a1: the host holds that number, SNAPSHOT_MISMATCH; a2: the
/// host serves a higher one, superseded), the coordinator records the host's number, and the
/// next deploy is numbered above it and converges.
#[tokio::test]
async fn a_restored_database_never_reissues_an_id_and_numbers_above_the_host() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("occ.db");
    let backup = dir.path().join("backup.db");
    let w = World::on(Arc::new(SqliteStore::open(&db).unwrap()), 1).await;
    level(&w, "info").await;
    let worker = w.worker();
    for a in ["a1", "a2"] {
        w.agent(a).await;
        w.svc.deploy("test", "ns1", a).await.unwrap();
    }
    w.settle(&worker).await;
    // The backup: both Agents at revision 1.
    rusqlite::Connection::open(&db)
        .unwrap()
        .execute("VACUUM INTO ?1", [backup.to_str().unwrap()])
        .unwrap();
    // After it: a1 goes to revision 2, a2 to revision 3.
    level(&w, "debug").await;
    w.svc.deploy("test", "ns1", "a1").await.unwrap();
    w.svc.deploy("test", "ns1", "a2").await.unwrap();
    w.settle(&worker).await;
    level(&w, "warn").await;
    w.svc.deploy("test", "ns1", "a2").await.unwrap();
    w.settle(&worker).await;
    let host_a1 = w.backend.agent("h1", "ns1", "a1").unwrap().served.unwrap();
    let host_a2 = w.backend.agent("h1", "ns1", "a2").unwrap().served.unwrap();
    assert_eq!(
        (rev_num(Some(&host_a1)), rev_num(Some(&host_a2))),
        (Some(2), Some(3))
    );

    // The restore: the coordinator runs on the backup; the host keeps what it serves.
    drop(worker);
    let restored: SharedStore = Arc::new(SqliteStore::open(&backup).unwrap());
    let r = World {
        svc: Service::new(restored.clone()),
        store: restored,
        backend: w.backend.clone(),
    };
    level(&r, "error").await;
    let worker = r.worker();
    let (a1_again, _) = r.svc.deploy("test", "ns1", "a1").await.unwrap();
    let (a2_again, _) = r.svc.deploy("test", "ns1", "a2").await.unwrap();
    assert_eq!(
        rev_num(Some(&a1_again.id)),
        Some(2),
        "numbering goes on from the backup"
    );
    assert_ne!(
        a1_again.id, host_a1,
        "number 2 again, but never the id of other content"
    );
    r.settle(&worker).await;
    for (a, rev, host_rev, code) in [
        ("a1", &a1_again, &host_a1, "SNAPSHOT_MISMATCH"),
        ("a2", &a2_again, &host_a2, "REVISION_SUPERSEDED"),
    ] {
        let stored = r.store.revision("ns1", a, &rev.id).await.unwrap().unwrap();
        let attempt = stored.last_attempt.as_ref().unwrap();
        assert_eq!(attempt.code, code, "{a}: {attempt:?}");
        let on_host = w.backend.agent("h1", "ns1", a).unwrap();
        assert_eq!(
            on_host.served.as_ref(),
            Some(host_rev),
            "{a}: the host kept its revision"
        );
        if code == "REVISION_SUPERSEDED" {
            assert!(attempt.message.contains(host_rev.as_str()), "{attempt:?}");
        }
    }
    // The next deploy is numbered above what the host holds, and converges.
    for (a, want) in [("a1", 3), ("a2", 4)] {
        let (rev, _) = r.svc.deploy("test", "ns1", a).await.unwrap();
        assert_eq!(rev_num(Some(&rev.id)), Some(want), "{a}");
        r.settle(&worker).await;
        let on_host = w.backend.agent("h1", "ns1", a).unwrap();
        assert_eq!(on_host.served.as_deref(), Some(rev.id.as_str()), "{a}");
        let agent = r.svc.agent("ns1", a).await.unwrap();
        assert_eq!(
            agent.served_revision_id.as_deref(),
            Some(rev.id.as_str()),
            "{a}"
        );
    }
}

/// Runs `worker` (8 items at once, 2 while `foreground` is busy) until every deploy queued
/// now has ended (at most 120 s: a bound for a loaded machine, not a timing claim); the most
/// activations that ran at once meanwhile.
async fn drain_yielding(w: &World, foreground: &coordinator::foreground::Foreground) -> usize {
    let worker = Arc::new(
        Worker::new(
            w.store.clone(),
            w.backend.clone(),
            WorkerSettings {
                parallelism: 8,
                yield_parallelism: 2,
                ..settings()
            },
        )
        .yielding_to(foreground.clone()),
    );
    w.backend.reset_concurrency();
    let (stop, rx) = tokio::sync::watch::channel(false);
    let task = tokio::spawn(worker.run(8, rx));
    let start = std::time::Instant::now();
    while w.store.pending_work().await.unwrap() > 0 {
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "the deploys did not drain"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    stop.send(true).unwrap();
    task.abort();
    let _ = task.await;
    w.backend.most_concurrent_activations()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn while_api_requests_are_in_progress_the_worker_runs_only_its_yield_share() {
    let w = World::new(12).await;
    let agents: Vec<String> = (0..12).map(|i| format!("a{i}")).collect();
    for a in &agents {
        w.agent(a).await;
        w.svc.deploy("test", "ns1", a).await.unwrap();
    }
    let foreground = coordinator::foreground::Foreground::default();
    // An API request in progress all along: 12 Agents' deploys, 2 at a time.
    let request = foreground.enter();
    let most = drain_yielding(&w, &foreground).await;
    assert!(
        most <= 2,
        "{most} activations at once while the API was busy"
    );
    for a in &agents {
        let agent = w.store.agent("ns1", a).await.unwrap().unwrap();
        assert_eq!(rev_num(agent.served_revision_id.as_deref()), Some(1), "{a}");
    }
    // The API idle: the worker takes its whole parallelism back.
    drop(request);
    for a in &agents {
        w.svc.deploy("test", "ns1", a).await.unwrap();
    }
    let most = drain_yielding(&w, &foreground).await;
    assert!(
        most > 2,
        "only {most} activations at once with the API idle"
    );
    for a in &agents {
        let agent = w.store.agent("ns1", a).await.unwrap().unwrap();
        assert_eq!(rev_num(agent.served_revision_id.as_deref()), Some(2), "{a}");
    }
}
