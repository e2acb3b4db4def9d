//! Issue 29: the worker delivers an Agent's bound secrets to its host. A deploy of a revision
//! that binds secrets sends one fenced `put-secrets` after the prepare and before the
//! activation, each value sealed to the host's pinned ssh-ed25519 key for this Agent; the
//! host (here a backend that holds the host's private key) opens exactly the stored value.
//! A rotation delivers the new version; a host that cannot open a value fails the work
//! permanently with its code; a version the store no longer holds fails it with
//! `SECRET_VERSION_GONE`. A cluster gets the values through the cluster backend instead.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::hostd_engine;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use clawfleet_protocol::Operation;
use clawfleet_protocol::failure::{Failure, FailureCode};
use clawfleet_protocol::result::OperationResult;
use clawfleet_protocol::sealed::{HostSecretKey, PutSecretsResult, SecretFingerprint};
use clawfleet_protocol::ssh_key::PrivateKey;
use clawfleet_protocol::ssh_key::private::{Ed25519Keypair, KeypairData};
use coordinator::backend::{Backend, CallError, CallOptions, ClusterTarget, Target};
use coordinator::config::WorkerSettings;
use coordinator::model::{RolloutAgentState, RolloutSecret, RolloutState};
use coordinator::service::{NewSecretRollout, Service};
use coordinator::store::SharedStore;
use coordinator::store::sqlite::SqliteStore;
use coordinator::worker::Worker;
use hostd_engine::EngineBackend;
use serde_json::json;
use zeroize::Zeroizing;

const SEED: [u8; 32] = [7; 32];

/// The test host's public key line, from [`SEED`].
fn host_key_line() -> String {
    let pair = Ed25519Keypair::from_seed(&SEED);
    let key = PrivateKey::new(KeypairData::Ed25519(pair), "").unwrap();
    key.public_key().to_openssh().unwrap()
}

/// What the host opened from one `put-secrets`: (name, version, value).
type Opened = Vec<(String, u64, String)>;

/// hostd's engine for everything but `put-secrets`, which this backend answers as a host
/// holding [`SEED`] would: it opens every value (or fails as told).
struct SecretsHost {
    inner: EngineBackend,
    key: HostSecretKey,
    opened: Mutex<Vec<Opened>>,
    refuse: Mutex<Option<FailureCode>>,
    /// A value the gateway refuses to resolve: activating a revision whose delivered value
    /// is this one fails with SECRET_RELOAD_FAILED.
    reject: Mutex<Option<String>>,
    /// The last value delivered per Agent.
    last_value: Mutex<HashMap<String, String>>,
}

impl Backend for SecretsHost {
    async fn call(
        &self,
        target: impl Into<Target> + Send,
        operation: Operation,
        options: CallOptions,
    ) -> Result<OperationResult, CallError> {
        let target = target.into();
        if let Operation::ActivateRevision(a) = &operation {
            // As the gateway refuses a value it cannot resolve on the secrets reload: hostd
            // answers SECRET_RELOAD_FAILED and the gateway keeps its last good value.
            let reject = self.reject.lock().unwrap().clone();
            let last = self
                .last_value
                .lock()
                .unwrap()
                .get(a.agent.id.as_str())
                .cloned();
            if reject.is_some() && reject == last {
                self.inner
                    .log_call(target.name(), operation.kind().as_str());
                return Err(CallError::Failed(Failure::new(
                    FailureCode::SecretReloadFailed,
                    "the gateway refused the new value (test)",
                )));
            }
        }
        let Operation::PutSecrets(args) = &operation else {
            return self.inner.call(target, operation, options).await;
        };
        // The log keeps the order of the calls.
        self.inner
            .log_call(target.name(), operation.kind().as_str());
        assert!(options.fence.is_some(), "put-secrets travels fenced");
        if let Some(code) = *self.refuse.lock().unwrap() {
            return Err(CallError::Failed(Failure::new(code, "refused by the test")));
        }
        let mut set = Vec::new();
        for s in &args.secrets {
            let value = self
                .key
                .open(&args.namespace.id, &args.agent.id, s)
                .map_err(|e| {
                    CallError::Failed(Failure::new(
                        FailureCode::SecretUndecryptable,
                        e.to_string(),
                    ))
                })?;
            set.push((
                s.name.to_string(),
                s.version,
                String::from_utf8(value.to_vec()).unwrap(),
            ));
        }
        if let Some((_, _, v)) = set.last() {
            self.last_value
                .lock()
                .unwrap()
                .insert(args.agent.id.to_string(), v.clone());
        }
        self.opened.lock().unwrap().push(set);
        Ok(OperationResult::PutSecrets(PutSecretsResult {
            secrets: args.versions(),
            changed: true,
            delivered_to_running_gateway: false,
        }))
    }

    /// A cluster takes the values in clear (over its API's TLS connection in production):
    /// recorded as received.
    async fn put_cluster_secrets(
        &self,
        target: &ClusterTarget,
        secrets: &clawfleet_kube::AgentSecrets,
        options: CallOptions,
    ) -> Result<PutSecretsResult, CallError> {
        self.inner.log_call(&target.name, "put-cluster-secrets");
        assert!(options.fence.is_some(), "a cluster's secrets travel fenced");
        if let Some(code) = *self.refuse.lock().unwrap() {
            return Err(CallError::Failed(Failure::new(code, "refused by the test")));
        }
        let set = secrets
            .secrets
            .iter()
            .map(|s| {
                (
                    s.name.to_string(),
                    s.version,
                    String::from_utf8(s.value.to_vec()).unwrap(),
                )
            })
            .collect();
        self.opened.lock().unwrap().push(set);
        Ok(PutSecretsResult {
            secrets: secrets.versions(),
            changed: true,
            delivered_to_running_gateway: false,
        })
    }
}

struct World {
    svc: Service,
    store: SharedStore,
    host: Arc<SecretsHost>,
}

fn settings() -> WorkerSettings {
    WorkerSettings {
        lease: Duration::from_millis(200),
        backoff_initial: Duration::from_millis(1),
        backoff_max: Duration::from_millis(5),
        readiness_recheck: Duration::from_millis(1),
        readiness_recheck_max: Duration::from_millis(5),
        max_attempts: 2,
        ..WorkerSettings::default()
    }
}

/// A host key sshd may well hold, but that secrets cannot be sealed to (not ssh-ed25519).
const ECDSA_HOST_KEY: &str = "ecdsa-sha2-nistp256 AAAAE2VjZHNhLXNoYTItbmlzdHAyNTYAAAAIbmlzdHAyNTYAAABBBAJOF/VenQUtiatqsFWPfMkJeQhEiY5y2WdGYXcgAKjhP/nO3Q1AeJHjqoyj/adxhM55wIf/sTC/BBqwt8hNse0=";

impl World {
    async fn new() -> Self {
        Self::with_host_key(host_key_line()).await
    }

    async fn with_host_key(host_key: String) -> Self {
        let store: SharedStore = Arc::new(SqliteStore::in_memory().unwrap());
        let svc = Service::new(store.clone());
        svc.enrol_host("test", crate::fixtures::host("h1", &host_key, 4))
            .await
            .unwrap();
        Self::with_namespace(store, svc, vec!["h1".into()], None).await
    }

    /// ns1 on a (fake) cluster named c1 instead of a host pool.
    async fn on_cluster() -> Self {
        let store: SharedStore = Arc::new(SqliteStore::in_memory().unwrap());
        crate::fixtures::fake_cluster(&store).await;
        let svc = Service::new(store.clone());
        Self::with_namespace(store, svc, vec![], Some("c1".into())).await
    }

    /// Namespace ns1 on `hosts` or `cluster`, secret slack-bot, a configuration binding it,
    /// and Agent a1 using that configuration.
    async fn with_namespace(
        store: SharedStore,
        svc: Service,
        hosts: Vec<String>,
        cluster: Option<String>,
    ) -> Self {
        let w = Self {
            svc,
            store,
            host: Arc::new(SecretsHost {
                inner: EngineBackend::new(),
                key: HostSecretKey::from_seed(&SEED),
                opened: Mutex::new(Vec::new()),
                refuse: Mutex::new(None),
                reject: Mutex::new(None),
                last_value: Mutex::new(HashMap::new()),
            }),
        };
        crate::fixtures::namespace(&w.svc, "ns1", hosts, cluster).await;
        w.set("slack-bot", "xoxb-first-value").await;
        crate::fixtures::configuration(
            &w.svc,
            "ns1",
            json!({"channels": {"slack": {"botToken": {"source": "file", "provider": "clawfleet", "id": "slack-bot"}}}}),
        )
        .await;
        crate::fixtures::agent(&w.svc, "ns1", "a1").await;
        w
    }

    async fn set(&self, name: &str, value: &str) {
        self.svc
            .put_secret(
                "test",
                "ns1",
                name,
                Zeroizing::new(value.as_bytes().to_vec()),
            )
            .await
            .unwrap();
    }

    fn worker(&self) -> Worker<SecretsHost> {
        Worker::new(self.store.clone(), self.host.clone(), settings())
    }

    async fn settle(&self) {
        let w = self.worker();
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

    /// The operations sent for a1's deploys, in order (the Namespace's ensure excluded).
    fn agent_calls(&self) -> Vec<String> {
        self.host
            .inner
            .log()
            .into_iter()
            .filter(|l| !l.ends_with("ensure-namespace"))
            .collect()
    }

    async fn last_attempt(&self) -> Option<(String, String)> {
        let revisions = self.store.revisions("ns1", "a1").await.unwrap();
        let newest = revisions.iter().max_by_key(|r| r.number)?;
        newest
            .last_attempt
            .as_ref()
            .map(|a| (a.code.clone(), a.message.clone()))
    }
}

#[tokio::test]
async fn a_deploy_delivers_sealed_secrets_between_prepare_and_activation() {
    let w = World::new().await;
    w.svc.deploy("test", "ns1", "a1").await.unwrap();
    w.settle().await;
    assert_eq!(
        w.agent_calls(),
        [
            "h1 prepare-revision",
            "h1 put-secrets",
            "h1 activate-revision"
        ],
        "put-secrets comes after the prepare and before the activation"
    );
    assert_eq!(
        *w.host.opened.lock().unwrap(),
        vec![vec![(
            "slack-bot".to_owned(),
            1,
            "xoxb-first-value".to_owned()
        )]],
        "the host opens exactly the stored value with its own key"
    );
    let agent = w.svc.agent("ns1", "a1").await.unwrap();
    assert!(agent.active_revision_id.is_some(), "{agent:?}");

    // A rotation: a new version, a new revision binding it, delivered the same way.
    w.set("slack-bot", "xoxb-second-value").await;
    w.svc
        .deploy_secret("test", "ns1", "slack-bot")
        .await
        .unwrap();
    w.settle().await;
    let opened = w.host.opened.lock().unwrap().clone();
    assert_eq!(
        opened.last().unwrap(),
        &vec![("slack-bot".to_owned(), 2, "xoxb-second-value".to_owned())]
    );
    let revisions = w.store.revisions("ns1", "a1").await.unwrap();
    let newest = revisions.iter().max_by_key(|r| r.number).unwrap();
    assert_eq!(
        newest.secrets[0].fingerprint,
        SecretFingerprint::of(b"xoxb-second-value")
    );
}

#[tokio::test]
async fn a_value_the_host_cannot_open_fails_the_deploy_before_activation() {
    let w = World::new().await;
    *w.host.refuse.lock().unwrap() = Some(FailureCode::SecretUndecryptable);
    w.svc.deploy("test", "ns1", "a1").await.unwrap();
    w.settle().await;
    assert_eq!(
        w.agent_calls(),
        ["h1 prepare-revision", "h1 put-secrets"],
        "a permanent refusal is not retried and nothing is activated"
    );
    let (code, message) = w.last_attempt().await.unwrap();
    assert_eq!(code, "SECRET_UNDECRYPTABLE", "{message}");
}

#[tokio::test]
async fn a_version_the_store_no_longer_holds_fails_with_its_code() {
    let w = World::new().await;
    w.svc.deploy("test", "ns1", "a1").await.unwrap();
    // The secret is deleted behind the service's back (as a damaged or edited database
    // would have it): the revision binds a version the store cannot give.
    assert!(
        w.store
            .delete_secret("ns1", "slack-bot", "test", 0)
            .await
            .unwrap()
    );
    w.settle().await;
    assert_eq!(w.agent_calls(), ["h1 prepare-revision"]);
    let (code, message) = w.last_attempt().await.unwrap();
    assert_eq!(code, "SECRET_VERSION_GONE", "{message}");
    assert!(message.contains("slack-bot version 1"), "{message}");
}

#[tokio::test]
async fn a_host_pinned_by_a_key_secrets_cannot_be_sealed_to_fails_before_sending() {
    let w = World::with_host_key(ECDSA_HOST_KEY.to_owned()).await;
    w.svc.deploy("test", "ns1", "a1").await.unwrap();
    w.settle().await;
    assert_eq!(
        w.agent_calls(),
        ["h1 prepare-revision"],
        "nothing is sent and nothing activated when the value cannot be sealed"
    );
    let (code, message) = w.last_attempt().await.unwrap();
    assert_eq!(code, "SECRET_SEAL_FAILED", "{message}");
    assert!(
        message.contains("slack-bot") && message.contains("h1"),
        "{message}"
    );
    assert!(!message.contains("xoxb"), "{message}");
    let agent = w.svc.agent("ns1", "a1").await.unwrap();
    assert!(agent.active_revision_id.is_none(), "{agent:?}");
}

/// Issue 29 (clusters): a cluster gets the Agent's values in clear through the cluster
/// backend (the Agent's Secret), fenced, after the prepare and before the activation; nothing
/// sealed to a host key is sent to it. (On main this was refused with SECRETS_UNSUPPORTED.)
#[tokio::test]
async fn a_cluster_gets_the_values_between_prepare_and_activation() {
    let w = World::on_cluster().await;
    w.svc.deploy("test", "ns1", "a1").await.unwrap();
    w.settle().await;
    let calls = w.agent_calls();
    assert_eq!(
        calls.get(..3),
        Some(
            &[
                "c1 prepare-revision".to_owned(),
                "c1 put-cluster-secrets".to_owned(),
                "c1 activate-revision".to_owned(),
            ][..]
        ),
        "{calls:?}"
    );
    assert!(
        !calls.iter().any(|c| c.ends_with(" put-secrets")),
        "no sealed put-secrets goes to a cluster: {calls:?}"
    );
    assert_eq!(
        *w.host.opened.lock().unwrap(),
        vec![vec![(
            "slack-bot".to_owned(),
            1,
            "xoxb-first-value".to_owned()
        )]],
        "the cluster receives exactly the stored value"
    );
}

/// A cluster that refuses the secrets (here: a foreign Secret at the Agent's name) fails the
/// deploy with its code before anything is activated, and the message names no value.
#[tokio::test]
async fn a_cluster_refusing_the_secrets_fails_the_deploy_before_activation() {
    let w = World::on_cluster().await;
    *w.host.refuse.lock().unwrap() = Some(FailureCode::KubernetesOwnershipConflict);
    w.svc.deploy("test", "ns1", "a1").await.unwrap();
    w.settle().await;
    let calls = w.agent_calls();
    assert!(
        !calls.iter().any(|c| c.ends_with("activate-revision")),
        "nothing is activated: {calls:?}"
    );
    let (code, message) = w.last_attempt().await.unwrap();
    assert_eq!(code, "KUBERNETES_OWNERSHIP_CONFLICT", "{message}");
    assert!(!message.contains("xoxb"), "{message}");
}

impl World {
    async fn add_agent(&self, id: &str) {
        crate::fixtures::agent(&self.svc, "ns1", id).await;
    }

    /// The rollout of slack-bot's newest version: a canary, then waves of 2.
    async fn rotate_rollout(&self) -> coordinator::model::Rollout {
        self.svc
            .create_secret_rollout(
                "test",
                "ns1",
                "slack-bot",
                NewSecretRollout {
                    canary: Some(1),
                    max_parallel: Some(2),
                    ..NewSecretRollout::default()
                },
            )
            .await
            .unwrap()
    }

    /// Runs the worker and the rollout scheduler until the rollout is no longer open.
    async fn drive(&self, id: i64) -> coordinator::model::Rollout {
        for _ in 0..200 {
            self.settle().await;
            self.svc.advance_rollouts().await.unwrap();
            let r = self.svc.rollout("ns1", id).await.unwrap();
            if !r.state.is_open() {
                return r;
            }
        }
        panic!("rollout {id} did not finish");
    }

    /// Per Agent: the served revision, its configuration generation and bound slack-bot
    /// version.
    async fn served(&self, agent: &str) -> (String, u32, u32) {
        let a = self.svc.agent("ns1", agent).await.unwrap();
        let active = a.served_revision_id.unwrap();
        let rev = self
            .store
            .revisions("ns1", agent)
            .await
            .unwrap()
            .into_iter()
            .find(|r| r.id == active)
            .unwrap();
        (
            active.to_string(),
            rev.configuration_generation,
            rev.secrets[0].version,
        )
    }
}

/// `occ secret rotate` goes through the rollout engine: a value the gateway refuses fails the
/// canary, the rollout halts naming it and no other Agent gets the value; every Agent keeps
/// its revision (on a host the gateway keeps serving its last good value). A good value then
/// goes out canary first and in waves, each Agent keeping its Configuration generation.
#[tokio::test]
async fn a_rotation_is_a_rollout_and_a_refused_value_halts_it_at_the_canary() {
    let w = World::new().await;
    // A newer Configuration generation nobody deployed yet: a rotation must not bring it.
    w.add_agent("a2").await;
    w.add_agent("a3").await;
    for a in ["a1", "a2", "a3"] {
        w.svc.deploy("test", "ns1", a).await.unwrap();
    }
    w.settle().await;
    let before: Vec<_> = served_all(&w).await;
    w.svc
        .put_configuration(
            "test",
            "ns1",
            "cfg",
            json!({"channels": {"slack": {"botToken": {"source": "file", "provider": "clawfleet", "id": "slack-bot"}}}, "ui": {"assistant": {"name": "gen2"}}}),
            false,
        )
        .await
        .unwrap();

    *w.host.reject.lock().unwrap() = Some("xoxb-refused".into());
    w.set("slack-bot", "xoxb-refused").await;
    let r = w.rotate_rollout().await;
    assert_eq!(
        r.secret,
        Some(RolloutSecret {
            name: "slack-bot".parse().unwrap(),
            version: 2
        })
    );
    assert_eq!((r.configuration_id.clone(), r.waves), (None, 2));
    let r = w.drive(r.id).await;
    assert_eq!(r.state, RolloutState::Halted, "{r:#?}");
    assert!(r.message.as_deref().unwrap_or("").contains("a1"), "{r:#?}");
    let states: Vec<_> = r
        .agents
        .iter()
        .map(|a| (a.agent_id.to_string(), a.state, a.code.clone()))
        .collect();
    assert_eq!(
        states,
        [
            (
                "a1".to_owned(),
                RolloutAgentState::Failed,
                Some("SECRET_RELOAD_FAILED".to_owned())
            ),
            (
                "a2".to_owned(),
                RolloutAgentState::Skipped,
                Some("ROLLOUT_HALTED".to_owned())
            ),
            (
                "a3".to_owned(),
                RolloutAgentState::Skipped,
                Some("ROLLOUT_HALTED".to_owned())
            ),
        ]
    );
    // The canary's failed revision stays its committed one (as after any permanent activation
    // failure, and drift says so); what serves is every Agent's old revision.
    assert_eq!(
        served_all(&w).await,
        before,
        "an Agent stopped serving its revision"
    );
    let refused_to: Vec<_> = w
        .host
        .last_value
        .lock()
        .unwrap()
        .iter()
        .filter(|(_, v)| v.as_str() == "xoxb-refused")
        .map(|(a, _)| a.clone())
        .collect();
    assert_eq!(refused_to, ["a1"], "only the canary was sent the value");

    // A good value: canary, then a2 and a3 together; generation 1 kept, version 3 bound.
    w.set("slack-bot", "xoxb-good").await;
    let r = w.rotate_rollout().await;
    let r = w.drive(r.id).await;
    assert_eq!(r.state, RolloutState::Done, "{r:#?}");
    assert!(
        r.agents
            .iter()
            .all(|a| a.state == RolloutAgentState::Succeeded),
        "{r:#?}"
    );
    for a in ["a1", "a2", "a3"] {
        let (served, generation, version) = w.served(a).await;
        let agent = w.svc.agent("ns1", a).await.unwrap();
        assert_eq!(agent.active_revision_id.as_deref(), Some(served.as_str()));
        assert_eq!((generation, version), (1, 3), "{a}");
    }
    // Nothing is behind any more: a third rotation without a new version selects no Agent.
    let e = w
        .svc
        .create_secret_rollout("test", "ns1", "slack-bot", NewSecretRollout::default())
        .await
        .unwrap_err();
    assert!(e.to_string().contains("no running Agent"), "{e}");
}

async fn served_all(w: &World) -> Vec<(String, u32, u32)> {
    let mut out = Vec::new();
    for a in ["a1", "a2", "a3"] {
        out.push(w.served(a).await);
    }
    out
}
