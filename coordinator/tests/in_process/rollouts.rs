//! Rollouts over hostd's real engine in process (tests/hostd_engine/mod.rs), with the worker
//! running concurrently: a canary whose gateway never becomes ready halts the rollout and
//! leaves every other Agent on its old revision; a good generation goes out in waves with
//! never more than maxParallel activations at once; pause, resume, manual promotion and
//! abort; a restarted coordinator resumes without deploying an Agent twice; ordinary deploys
//! of an Agent in an open rollout are refused; and every bad request is refused naming what
//! is wrong, storing nothing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::hostd_engine;

use std::sync::Arc;
use std::time::{Duration, Instant};

use clawfleet_protocol::failure::FailureCode;
use coordinator::config::WorkerSettings;
use coordinator::model::{Rollout, RolloutAgentState, RolloutState};
use coordinator::service::{NewRollout, RolloutAction, Service, ServiceError};
use coordinator::store::SharedStore;
use coordinator::store::sqlite::SqliteStore;
use coordinator::worker::Worker;
use hostd_engine::EngineBackend;
use serde_json::json;

/// The number of a revision id (`rev-N-…`): ids also name their content, tests name numbers.
fn rev_num(id: Option<&str>) -> Option<u64> {
    id.and_then(coordinator::model::Revision::number_of)
}

const NS: &str = "ns1";

fn settings() -> WorkerSettings {
    WorkerSettings {
        lease: Duration::from_millis(500),
        backoff_initial: Duration::from_millis(5),
        backoff_max: Duration::from_millis(50),
        readiness_recheck: Duration::from_millis(5),
        readiness_recheck_max: Duration::from_millis(50),
        poll: Duration::from_millis(10),
        ..WorkerSettings::default()
    }
}

struct World {
    svc: Service,
    store: SharedStore,
    backend: Arc<EngineBackend>,
    stop: tokio::sync::watch::Sender<bool>,
    worker: Option<tokio::task::JoinHandle<()>>,
}

fn agents(n: usize) -> Vec<String> {
    (1..=n).map(|i| format!("a{i:02}")).collect()
}

impl World {
    /// 3 hosts, `n` Agents on Configuration `cfg`, each deployed once (rev-1 serves).
    async fn new(n: usize) -> Self {
        let store = {
            let s: SharedStore = Arc::new(SqliteStore::in_memory().unwrap());
            s
        };
        let svc = Service::new(store.clone());
        let names = crate::fixtures::enrol_hosts(&svc, 3).await;
        crate::fixtures::namespace(&svc, NS, names, None).await;
        crate::fixtures::configuration(&svc, NS, json!({"logging": {"level": "info"}})).await;
        let (stop, _) = tokio::sync::watch::channel(false);
        let mut w = Self {
            svc,
            store,
            backend: Arc::new(EngineBackend::new()),
            stop,
            worker: None,
        };
        w.start_worker();
        for a in agents(n) {
            crate::fixtures::agent(&w.svc, NS, &a).await;
            w.svc.deploy("test", NS, &a).await.unwrap();
        }
        w.until("every Agent serves rev-1", async || {
            for a in agents(n) {
                if rev_num(w.served(&a).await.as_deref()) != Some(1) {
                    return false;
                }
            }
            true
        })
        .await;
        w
    }

    fn start_worker(&mut self) {
        let worker = Arc::new(Worker::new(
            self.store.clone(),
            self.backend.clone(),
            settings(),
        ));
        let (tx, rx) = tokio::sync::watch::channel(false);
        self.stop = tx;
        self.worker = Some(tokio::spawn(worker.run(8, rx)));
    }

    async fn stop_worker(&mut self) {
        let _ = self.stop.send(true);
        if let Some(h) = self.worker.take() {
            h.abort();
            let _ = h.await;
        }
    }

    /// What the Agent's host serves (hostd's own `status`), `None` if nothing.
    async fn served(&self, agent: &str) -> Option<String> {
        let a = self.store.agent(NS, agent).await.unwrap()?;
        self.backend.agent(a.host.as_deref()?, NS, agent)?.served
    }

    /// Runs scheduler passes until `done` holds (at most 120 s: a bound for a loaded machine,
    /// not a timing claim).
    async fn until(&self, what: &str, done: impl AsyncFn() -> bool) {
        let start = Instant::now();
        while !done().await {
            self.svc.advance_rollouts().await.unwrap();
            assert!(
                start.elapsed() < Duration::from_secs(120),
                "not within 120 s: {what}"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    async fn rollout(&self, id: i64) -> Rollout {
        self.svc.rollout(NS, id).await.unwrap()
    }

    async fn until_state(&self, id: i64, state: RolloutState) -> Rollout {
        self.until(&format!("rollout {id} {}", state.as_str()), async || {
            self.rollout(id).await.state == state
        })
        .await;
        self.rollout(id).await
    }

    async fn new_generation(&self, label: &str) {
        self.svc
            .put_configuration(
                "test",
                NS,
                "cfg",
                json!({"logging": {"level": "info"}, "ui": {"assistant": {"name": label}}}),
                false,
            )
            .await
            .unwrap();
    }
}

fn rollout(canary: u32, max_parallel: u32, max_failures: u32) -> NewRollout {
    NewRollout {
        configuration_id: "cfg".into(),
        canary: Some(canary),
        max_parallel: Some(max_parallel),
        max_failures: Some(max_failures),
        ..NewRollout::default()
    }
}

fn code_of(e: ServiceError) -> String {
    match e {
        ServiceError::Invalid { code, .. } | ServiceError::Conflict { code, .. } => {
            code.as_str().to_owned()
        }
        other => format!("{other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_canary_that_never_becomes_ready_halts_the_rollout_and_nothing_else_moves() {
    let mut w = World::new(12).await;
    let mut before = Vec::new();
    for a in agents(12) {
        before.push(w.store.revisions(NS, &a).await.unwrap().len());
    }
    assert!(before.iter().all(|n| *n == 1));
    w.new_generation("bad").await;
    w.backend
        .fail_activations_of("a01", FailureCode::ReadinessTimeout);
    w.backend
        .fail_activations_of("a02", FailureCode::ReadinessTimeout);
    let r = w
        .svc
        .create_rollout("op", NS, rollout(2, 3, 1))
        .await
        .unwrap();
    assert_eq!(r.agents.len(), 12);
    assert_eq!(r.waves, 1 + 4, "{r:?}");
    assert_eq!(
        r.agents.iter().filter(|a| a.wave == 0).count(),
        2,
        "two canaries"
    );
    // An Agent of an open rollout is not deployed, reconfigured or reconciled by hand.
    for refused in [
        w.svc.deploy("op", NS, "a07").await.map(|_| ()),
        w.svc.reconcile("op", NS, "a07").await.map(|_| ()),
        w.svc
            .patch_agent(
                "op",
                NS,
                "a07",
                coordinator::service::AgentPatch {
                    configuration_id: Some("cfg".into()),
                    restore: None,
                    egress: None,
                },
            )
            .await
            .map(|_| ()),
    ] {
        assert_eq!(code_of(refused.unwrap_err()), "ROLLOUT_IN_PROGRESS");
    }
    // Nor taken into a second rollout.
    assert_eq!(
        code_of(
            w.svc
                .create_rollout("op", NS, rollout(1, 1, 0))
                .await
                .unwrap_err()
        ),
        "ROLLOUT_IN_PROGRESS"
    );
    let r = w.until_state(r.id, RolloutState::Halted).await;
    let failed: Vec<_> = r
        .agents
        .iter()
        .filter(|a| a.state == RolloutAgentState::Failed)
        .map(|a| (a.agent_id.as_str(), a.code.as_deref()))
        .collect();
    assert_eq!(
        failed,
        [
            ("a01", Some("READINESS_TIMEOUT")),
            ("a02", Some("READINESS_TIMEOUT"))
        ],
        "{r:?}"
    );
    assert!(r.message.as_deref().unwrap().contains("a01, a02"), "{r:?}");
    for a in &r.agents[2..] {
        assert_eq!(a.state, RolloutAgentState::Skipped, "{a:?}");
        assert_eq!(a.code.as_deref(), Some("ROLLOUT_HALTED"));
        assert!(a.revision_id.is_none());
    }
    // The other ten were never touched: one revision each, rev-1 active and served.
    for a in &agents(12)[2..] {
        assert_eq!(w.store.revisions(NS, a).await.unwrap().len(), 1, "{a}");
        let agent = w.store.agent(NS, a).await.unwrap().unwrap();
        assert_eq!(rev_num(agent.active_revision_id.as_deref()), Some(1));
        assert_eq!(rev_num(w.served(a).await.as_deref()), Some(1), "{a}");
    }
    // Halted: a deploy by hand is allowed again, and the rollout takes no more actions.
    assert_eq!(
        code_of(
            w.svc
                .rollout_action("op", NS, r.id, RolloutAction::Resume)
                .await
                .unwrap_err()
        ),
        "ROLLOUT_STATE_CONFLICT"
    );
    w.svc.deploy("op", NS, "a07").await.unwrap();
    let audit = w
        .store
        .audit_events_of(100, Some("rollout.halted"))
        .await
        .unwrap();
    assert_eq!(audit.len(), 1);
    w.stop_worker().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_good_generation_goes_out_in_waves_never_more_than_max_parallel_at_once() {
    let mut w = World::new(12).await;
    w.new_generation("good").await;
    // The first deploys ran 8 at once; the rollout's are counted from here.
    w.backend.reset_concurrency();
    let r = w
        .svc
        .create_rollout("op", NS, rollout(1, 3, 0))
        .await
        .unwrap();
    let r = w.until_state(r.id, RolloutState::Done).await;
    assert_eq!(r.failures(), 0, "{r:?}");
    for a in &r.agents {
        assert_eq!(a.state, RolloutAgentState::Succeeded, "{a:?}");
        assert_eq!(a.code.as_deref(), Some("REVISION_ACTIVATED"));
        assert_eq!(rev_num(w.served(&a.agent_id).await.as_deref()), Some(2));
        let served = w.served(&a.agent_id).await.unwrap();
        let rev = w
            .store
            .revision(NS, &a.agent_id, &served)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(rev.configuration_generation, 2);
    }
    let most = w.backend.most_concurrent_activations();
    assert!(most <= 3, "{most} activations at once, maxParallel 3");
    assert!(most >= 2, "the waves ran one at a time ({most})");
    let deploys = w
        .store
        .audit_events_of(100, Some("agent.deploy"))
        .await
        .unwrap();
    assert_eq!(
        deploys
            .iter()
            .filter(|e| e.actor == format!("rollout:{}", r.id))
            .count(),
        12
    );
    w.stop_worker().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pause_resume_promote_and_abort() {
    let mut w = World::new(5).await;
    w.new_generation("two").await;
    let mut req = rollout(1, 1, 0);
    req.manual_promote = true;
    let r = w.svc.create_rollout("op", NS, req).await.unwrap();
    let r = w.until_state(r.id, RolloutState::Waiting).await;
    assert_eq!(r.agents[0].state, RolloutAgentState::Succeeded);
    assert!(
        r.agents[1..]
            .iter()
            .all(|a| a.state == RolloutAgentState::Pending)
    );
    // Waiting stays waiting.
    tokio::time::sleep(Duration::from_millis(200)).await;
    w.svc.advance_rollouts().await.unwrap();
    assert_eq!(w.rollout(r.id).await.state, RolloutState::Waiting);
    for (action, from) in [
        (RolloutAction::Pause, "waiting"),
        (RolloutAction::Resume, "waiting"),
    ] {
        let e = w
            .svc
            .rollout_action("op", NS, r.id, action)
            .await
            .unwrap_err();
        assert!(e.to_string().contains(from), "{e}");
    }
    let r = w
        .svc
        .rollout_action("op", NS, r.id, RolloutAction::Promote)
        .await
        .unwrap();
    assert_eq!((r.state, r.wave), (RolloutState::Running, 1));
    let r = w.until_state(r.id, RolloutState::Waiting).await;
    assert_eq!(r.agents[1].state, RolloutAgentState::Succeeded);
    w.svc
        .rollout_action("op", NS, r.id, RolloutAction::Promote)
        .await
        .unwrap();
    // Paused at once: whatever was started finishes, nothing new starts.
    let r = w
        .svc
        .rollout_action("op", NS, r.id, RolloutAction::Pause)
        .await
        .unwrap();
    assert_eq!(r.state, RolloutState::Paused);
    w.until("the started deploy finishes", async || {
        w.rollout(r.id)
            .await
            .agents
            .iter()
            .all(|a| a.state != RolloutAgentState::Deploying)
    })
    .await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    w.svc.advance_rollouts().await.unwrap();
    let paused = w.rollout(r.id).await;
    assert_eq!(paused.state, RolloutState::Paused);
    let started = paused
        .agents
        .iter()
        .filter(|a| a.state != RolloutAgentState::Pending)
        .count();
    assert_eq!(started, 3, "{paused:?}");
    w.svc
        .rollout_action("op", NS, r.id, RolloutAction::Resume)
        .await
        .unwrap();
    let r = w.until_state(r.id, RolloutState::Waiting).await;
    // Abort: the Agents done stay as they are, the rest are skipped.
    let r = w
        .svc
        .rollout_action("op", NS, r.id, RolloutAction::Abort)
        .await
        .unwrap();
    assert_eq!(r.state, RolloutState::Aborted);
    let states: Vec<_> = r.agents.iter().map(|a| a.state).collect();
    assert_eq!(
        states,
        [
            RolloutAgentState::Succeeded,
            RolloutAgentState::Succeeded,
            RolloutAgentState::Succeeded,
            RolloutAgentState::Skipped,
            RolloutAgentState::Skipped
        ]
    );
    assert_eq!(rev_num(w.served("a05").await.as_deref()), Some(1));
    assert_eq!(rev_num(w.served("a01").await.as_deref()), Some(2));
    assert_eq!(
        code_of(
            w.svc
                .rollout_action("op", NS, r.id, RolloutAction::Abort)
                .await
                .unwrap_err()
        ),
        "ROLLOUT_STATE_CONFLICT"
    );
    let actions: Vec<String> = w
        .store
        .audit_events(100)
        .await
        .unwrap()
        .into_iter()
        .filter(|e| e.action.starts_with("rollout."))
        .map(|e| e.action)
        .collect();
    for a in [
        "rollout.create",
        "rollout.promote",
        "rollout.pause",
        "rollout.resume",
        "rollout.abort",
    ] {
        assert!(
            actions.iter().any(|x| x == a),
            "{a} not audited: {actions:?}"
        );
    }
    w.stop_worker().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_restarted_coordinator_resumes_without_deploying_an_agent_twice() {
    let mut w = World::new(6).await;
    w.new_generation("resume").await;
    let mut req = rollout(1, 2, 0);
    req.pause_between_seconds = Some(1);
    let r = w.svc.create_rollout("op", NS, req).await.unwrap();
    w.until("the canary is done and the pause runs", async || {
        w.rollout(r.id).await.next_wave_at.is_some()
    })
    .await;
    // The coordinator dies: its worker and scheduler are gone; a new one opens the store.
    w.stop_worker().await;
    w.svc = Service::new(w.store.clone());
    w.start_worker();
    let r = w.until_state(r.id, RolloutState::Done).await;
    for a in &r.agents {
        assert_eq!(a.state, RolloutAgentState::Succeeded, "{a:?}");
        assert_eq!(
            w.store.revisions(NS, &a.agent_id).await.unwrap().len(),
            2,
            "{} deployed twice",
            a.agent_id
        );
    }
    // The pause between waves was kept: wave 1 started at least a second after wave 0 ended.
    let canary_done = r.agents[0].finished_at.unwrap();
    let wave1_started = r.agents[1].started_at.unwrap();
    assert!(wave1_started > canary_done, "{r:?}");
    w.stop_worker().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bad_rollouts_are_refused_naming_what_is_wrong_and_store_nothing() {
    let mut w = World::new(2).await;
    let rows = w.store.row_counts().await.unwrap();
    let cases: Vec<(NewRollout, &str, &str)> = vec![
        (
            NewRollout {
                configuration_id: "nope".into(),
                ..NewRollout::default()
            },
            "UNKNOWN_CONFIGURATION",
            "nope",
        ),
        (rollout(3, 1, 0), "INVALID_ROLLOUT", "canary 3"),
        (rollout(1, 0, 0), "INVALID_ROLLOUT", "maxParallel 0"),
        (
            NewRollout {
                pause_between_seconds: Some(5),
                manual_promote: true,
                ..rollout(1, 1, 0)
            },
            "INVALID_ROLLOUT",
            "exclude",
        ),
        (
            NewRollout {
                pause_between_seconds: Some(100_000),
                ..rollout(1, 1, 0)
            },
            "INVALID_ROLLOUT",
            "pauseBetweenSeconds",
        ),
        (
            NewRollout {
                agents: Some(vec!["a01".into(), "a01".into()]),
                ..rollout(1, 1, 0)
            },
            "INVALID_ROLLOUT",
            "a01 twice",
        ),
        (
            NewRollout {
                agents: Some(vec!["../x".into()]),
                ..rollout(0, 1, 0)
            },
            "INVALID_IDENTIFIER",
            "agents[]",
        ),
        (
            NewRollout {
                agents: Some(vec![]),
                ..rollout(0, 1, 0)
            },
            "ROLLOUT_EMPTY",
            "no Agent",
        ),
    ];
    for (req, code, names) in cases {
        let e = w
            .svc
            .create_rollout("op", NS, req.clone())
            .await
            .unwrap_err();
        let text = e.to_string();
        assert_eq!(code_of(e), code, "{req:?}: {text}");
        assert!(text.contains(names), "{req:?}: {text}");
    }
    let missing = w
        .svc
        .create_rollout(
            "op",
            NS,
            NewRollout {
                agents: Some(vec!["ghost".into()]),
                ..rollout(0, 1, 0)
            },
        )
        .await
        .unwrap_err();
    assert!(
        matches!(missing, ServiceError::NotFound { .. }),
        "{missing}"
    );
    assert_eq!(
        w.store.row_counts().await.unwrap(),
        rows,
        "a refusal stored something"
    );
    assert!(matches!(
        w.svc.rollout(NS, 99).await.unwrap_err(),
        ServiceError::NotFound { .. }
    ));
    w.stop_worker().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn plan_tokens_guard_deploys_and_rollouts_and_a_stale_one_stores_nothing() {
    let mut w = World::new(3).await;
    // A deploy plan asks the Agent's host, and its token applies while nothing moved.
    let plan = w.svc.plan_deploy(&*w.backend, NS, "a01").await.unwrap();
    let a = &plan["agents"][0];
    assert_eq!(rev_num(a["revision"]["id"].as_str()), Some(2), "{plan}");
    assert_eq!(a["placed"], true);
    assert_eq!(a["changes"]["snapshot"], "create", "{plan}");
    assert_eq!(a["changes"]["daemonReload"], false, "{plan}");
    assert_eq!(a["changes"]["restart"], true, "{plan}");
    let token = plan["token"].as_str().unwrap().to_owned();
    // Planning twice gives the same token; a new generation makes it stale.
    let again = w.svc.plan_deploy(&*w.backend, NS, "a01").await.unwrap();
    assert_eq!(again["token"], plan["token"]);
    w.new_generation("moved").await;
    let rows = w.store.row_counts().await.unwrap();
    let e = w
        .svc
        .deploy_planned("op", NS, "a01", &token)
        .await
        .unwrap_err();
    assert_eq!(code_of(e), "PLAN_STALE");
    assert_eq!(
        w.store.row_counts().await.unwrap(),
        rows,
        "a stale plan stored something"
    );
    let e = w
        .svc
        .deploy_planned("op", NS, "a01", "plan1-zz")
        .await
        .unwrap_err();
    assert_eq!(code_of(e), "INVALID_PLAN_TOKEN");
    let fresh = w.svc.plan_deploy(&*w.backend, NS, "a01").await.unwrap();
    let (rev, _) = w
        .svc
        .deploy_planned("op", NS, "a01", fresh["token"].as_str().unwrap())
        .await
        .unwrap();
    assert_eq!(
        Some(rev.id.as_str()),
        fresh["agents"][0]["revision"]["id"].as_str(),
        "the plan named the revision the deploy made: {fresh}"
    );
    assert_eq!(rev_num(Some(&rev.id)), Some(2));
    w.until("a01 serves rev-2", async || {
        rev_num(w.served("a01").await.as_deref()) == Some(2)
    })
    .await;

    // A rollout plan covers every selected Agent; it goes stale when an active revision moves.
    let req = rollout(1, 2, 0);
    let plan = w.svc.plan_rollout(&*w.backend, NS, &req).await.unwrap();
    assert_eq!(plan["agents"].as_array().unwrap().len(), 3, "{plan}");
    assert_eq!(plan["waves"], 2, "{plan}");
    let token = plan["token"].as_str().unwrap().to_owned();
    w.svc.deploy("op", NS, "a03").await.unwrap();
    w.until("a03 serves rev-2", async || {
        rev_num(w.served("a03").await.as_deref()) == Some(2)
    })
    .await;
    let rows = w.store.row_counts().await.unwrap();
    let stale = NewRollout {
        plan_token: Some(token),
        ..req.clone()
    };
    assert_eq!(
        code_of(w.svc.create_rollout("op", NS, stale).await.unwrap_err()),
        "PLAN_STALE"
    );
    assert_eq!(w.store.row_counts().await.unwrap(), rows);
    let plan = w.svc.plan_rollout(&*w.backend, NS, &req).await.unwrap();
    let r = w
        .svc
        .create_rollout(
            "op",
            NS,
            NewRollout {
                plan_token: plan["token"].as_str().map(str::to_owned),
                ..req
            },
        )
        .await
        .unwrap();
    w.until_state(r.id, RolloutState::Done).await;
    w.stop_worker().await;
}
