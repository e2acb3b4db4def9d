//! Issue 10: the API's refusals that no other test produced, each produced over real HTTP on
//! loopback (hostd's engine in process behind it, tests/hostd_engine/mod.rs) and asserted with
//! its status, code and the key part of its message, with nothing stored where the refusal
//! promises that. Store failures are produced in the real SQLite store: a trigger that refuses
//! one table's writes, or a second connection that holds the database's write lock.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::hostd_engine;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use clawfleet_protocol::envelope::{self, Envelope, Limits, PROTOCOL_VERSION};
use clawfleet_protocol::result::OperationResult;
use clawfleet_protocol::{Failure, Fingerprint, HostName, Operation, OperationId, Principal};
use coordinator::api::{AppState, router_with};
use coordinator::backend::{Backend, CallError, CallOptions, Target};
use coordinator::client::{Client, ClientError};
use coordinator::config::{ApiSettings, WorkerSettings};
use coordinator::model::{Grant, Role};
use coordinator::service::Service;
use coordinator::store::SharedStore;
use coordinator::store::sqlite::SqliteStore;
use coordinator::worker::Worker;
use hostd_engine::EngineBackend;
use serde_json::{Value, json};

use crate::fixtures::HOST_KEY;

/// hostd's engine; once `predates_runtime` is set, a hostd older than the runtime reads: it
/// refuses `agent-runtime` and `agent-logs` as an envelope whose operation it cannot decode.
#[derive(Default)]
struct Targets {
    engine: EngineBackend,
    predates_runtime: AtomicBool,
}

/// The failure a hostd answers for an envelope naming an operation it does not know: the
/// envelope is encoded as the coordinator sends it, its operation renamed to one this
/// protocol's decoder does not know either, and decoded as hostd decodes what it receives.
fn unknown_operation_failure(op: &Operation, host: &str) -> Failure {
    let now = coordinator::clock::now_seconds() as u64;
    let sent = Envelope {
        version: PROTOCOL_VERSION,
        operation_id: OperationId::new("occ-test-op").unwrap(),
        target: envelope::Target {
            host: HostName::new(host).unwrap(),
            host_key: Fingerprint::new(format!("SHA256:{}", "A".repeat(43))).unwrap(),
        },
        issuer: Principal::new("occ").unwrap(),
        issued_at: now,
        expires_at: now + 60,
        deadline_seconds: 30,
        fence: None,
        operation: op.clone(),
    };
    let mut wire: Value = serde_json::from_slice(&sent.to_bytes().unwrap()).unwrap();
    wire["operation"]["op"] = json!(format!("{}-next", op.kind()));
    Envelope::decode(&serde_json::to_vec(&wire).unwrap(), &Limits::default())
        .expect_err("an unknown operation decoded")
        .to_failure()
}

impl Backend for Targets {
    async fn call(
        &self,
        target: impl Into<Target> + Send,
        operation: Operation,
        options: CallOptions,
    ) -> Result<OperationResult, CallError> {
        let target = target.into();
        if self.predates_runtime.load(Ordering::SeqCst)
            && matches!(
                operation,
                Operation::AgentRuntime(_) | Operation::AgentLogs(_)
            )
        {
            return Err(CallError::Failed(unknown_operation_failure(
                &operation,
                target.name(),
            )));
        }
        self.engine.call(target, operation, options).await
    }
}

/// A refusal as the client reports it: status, code, message.
type Refusal = (u16, String, String);

struct Api {
    server: String,
    store: SharedStore,
    sqlite: Arc<SqliteStore>,
    admin: String,
    worker: Worker<Targets>,
    targets: Arc<Targets>,
}

impl Api {
    /// An API on an in-memory store with default limits.
    async fn start() -> Self {
        Self::on(
            Arc::new(SqliteStore::in_memory().unwrap()),
            ApiSettings::default(),
        )
        .await
    }

    /// An API on this store, with these limits and a `*:admin` token.
    async fn on(sqlite: Arc<SqliteStore>, settings: ApiSettings) -> Self {
        let store: SharedStore = sqlite.clone();
        let (_, admin) = coordinator::tokens::create(
            &*store,
            "admin",
            &[Grant {
                namespace: "*".into(),
                role: Role::Admin,
            }],
        )
        .await
        .unwrap();
        let targets = Arc::new(Targets::default());
        let worker = Worker::new(
            store.clone(),
            targets.clone(),
            WorkerSettings {
                backoff_initial: Duration::from_millis(1),
                backoff_max: Duration::from_millis(5),
                ..WorkerSettings::default()
            },
        );
        let state = Arc::new(AppState {
            foreground: Default::default(),
            service: Service::new(store.clone()),
            backend: targets.clone(),
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let router = router_with(state, &settings);
        tokio::spawn(async move { axum::serve(listener, router).await });
        Self {
            server: format!("http://{addr}"),
            store,
            sqlite,
            admin,
            worker,
            targets,
        }
    }

    async fn call(
        &self,
        token: &str,
        method: &str,
        path: &str,
        body: Option<Value>,
    ) -> Result<Value, Refusal> {
        let c = Client::new(&self.server, Some(token.to_owned())).unwrap();
        let (method, path) = (method.to_owned(), path.to_owned());
        tokio::task::spawn_blocking(move || {
            c.request(&method, &path, body.as_ref())
                .map_err(|e| match e {
                    ClientError::Api {
                        status,
                        code,
                        message,
                    } => (status, code, message),
                    other => panic!("{method} {path}: {other}"),
                })
        })
        .await
        .unwrap()
    }

    async fn admin(&self, method: &str, path: &str, body: Option<Value>) -> Result<Value, Refusal> {
        self.call(&self.admin.clone(), method, path, body).await
    }

    /// The refusal of a request that must be refused.
    async fn refused(&self, method: &str, path: &str, body: Option<Value>) -> Refusal {
        match self.admin(method, path, body).await {
            Ok(v) => panic!("{method} {path} was accepted: {v}"),
            Err(r) => r,
        }
    }

    /// The raw answer: status, the head in lower case, the JSON body.
    async fn raw(&self, method: &str, path: &str, token: Option<&str>) -> (u16, String, Value) {
        let addr = self.server.trim_start_matches("http://").to_owned();
        let auth = token
            .map(|t| format!("Authorization: Bearer {t}\r\n"))
            .unwrap_or_default();
        let head = format!(
            "{method} {path} HTTP/1.1\r\nHost: x\r\n{auth}Connection: close\r\nContent-Length: 0\r\n\r\n"
        );
        tokio::task::spawn_blocking(move || raw_exchange(&addr, &head))
            .await
            .unwrap()
    }

    async fn settle(&self) {
        for _ in 0..200 {
            if self.worker.run_once().await.is_none()
                && self.store.pending_work().await.unwrap() == 0
            {
                return;
            }
        }
        panic!("the worker did not settle");
    }

    async fn counts(&self) -> Vec<(String, i64)> {
        self.store.row_counts().await.unwrap()
    }

    /// Host h1, Namespace ns1 on it (ready), configuration cfg.
    async fn pool(&self) {
        self.admin(
            "POST",
            "/hosts",
            Some(json!({"name": "h1", "address": "127.0.0.1", "hostKey": HOST_KEY})),
        )
        .await
        .unwrap();
        self.admin(
            "POST",
            "/namespaces",
            Some(json!({"id": "ns1", "hosts": ["h1"]})),
        )
        .await
        .unwrap();
        self.admin(
            "POST",
            "/namespaces/ns1/configurations",
            Some(json!({"id": "cfg", "document": {}})),
        )
        .await
        .unwrap();
        self.settle().await;
    }

    async fn agent(&self, id: &str) -> Result<Value, Refusal> {
        self.admin(
            "POST",
            "/namespaces/ns1/agents",
            Some(json!({"id": id, "configurationId": "cfg"})),
        )
        .await
    }

    /// Runs SQL on the store's writer connection (triggers that refuse writes).
    async fn sql(&self, sql: &str) {
        self.sqlite
            .with_connection(|c| c.execute_batch(sql))
            .await
            .unwrap();
    }
}

/// Sends one request on a fresh connection and reads the whole answer.
fn raw_exchange(addr: &str, head: &str) -> (u16, String, Value) {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    stream.write_all(head.as_bytes()).unwrap();
    let mut raw = Vec::new();
    let _ = stream.read_to_end(&mut raw);
    let text = String::from_utf8_lossy(&raw).to_string();
    let (head, rest) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let start = rest.find('{').unwrap_or(0);
    let end = rest.rfind('}').map(|i| i + 1).unwrap_or(rest.len());
    (
        status,
        head.to_ascii_lowercase(),
        serde_json::from_str(&rest[start..end]).unwrap_or(Value::Null),
    )
}

/// A header's value in a lower-cased head.
fn header(head: &str, name: &str) -> String {
    head.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
        .unwrap_or_else(|| panic!("no {name} header in {head}"))
        .trim()
        .to_owned()
}

/// A path parameter that is not UTF-8 once percent-decoded is refused by the framework before
/// any handler runs; the refusal still has the API's JSON shape, as `INVALID_REQUEST`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_path_the_framework_cannot_decode_is_400_invalid_request() {
    let api = Api::start().await;
    api.pool().await;
    let before = api.counts().await;
    let admin = api.admin.clone();
    for path in ["/namespaces/%FF", "/namespaces/ns1/agents/%C3%28"] {
        for method in ["GET", "DELETE"] {
            let (status, head, v) = api.raw(method, path, Some(&admin)).await;
            assert_eq!(status, 400, "{method} {path}: {v}");
            assert!(head.contains("content-type: application/json"), "{head}");
            assert_eq!(
                v["error"]["code"], "INVALID_REQUEST",
                "{method} {path}: {v}"
            );
            let message = v["error"]["message"].as_str().unwrap();
            assert!(message.starts_with("the request was refused"), "{message}");
        }
    }
    assert_eq!(api.counts().await, before);
}

/// An HTTP error without the API's error body (a proxy in front of the coordinator, or
/// something else on the port) reaches the client's caller as `HTTP_ERROR` with the status
/// and the start of the body.
#[test]
fn an_error_without_the_api_body_is_http_error_in_the_client() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let proxy = std::thread::spawn(move || {
        use std::io::{Read, Write};
        let (mut s, _) = listener.accept().unwrap();
        let mut buf = [0u8; 4096];
        let _ = s.read(&mut buf);
        let body = "<html><body>502 upstream unavailable</body></html>";
        let answer = format!(
            "HTTP/1.1 502 Bad Gateway\r\nContent-Type: text/html\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
        s.write_all(answer.as_bytes()).unwrap();
    });
    let client = Client::new(&format!("http://{addr}"), Some("cf_x_y".into())).unwrap();
    match client.request("GET", "/namespaces", None) {
        Err(ClientError::Api {
            status,
            code,
            message,
        }) => {
            assert_eq!((status, code.as_str()), (502, "HTTP_ERROR"));
            assert!(message.contains("upstream unavailable"), "{message}");
        }
        other => panic!("{other:?}"),
    }
    proxy.join().unwrap();
}

/// Namespace refusals: `singleTenant` on a cluster, a cluster registered twice, and new
/// Agents or rollouts in a Namespace being deleted; none stores anything or reaches a target.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn namespace_and_cluster_refusals() {
    let api = Api::start().await;
    api.store
        .insert_cluster(&coordinator::model::ClusterRecord {
            cluster: coordinator::model::Cluster {
                name: "c1".into(),
                server: "https://127.0.0.1:6443".into(),
                settings: json!({}),
                created_at: 0,
                last_probe: None,
            },
            credentials: json!({"auth": {"kind": "token", "token": "not-a-real-token"}}),
        })
        .await
        .unwrap();
    api.pool().await;
    let calls = api.targets.engine.calls();
    let before = api.counts().await;

    let (status, code, message) = api
        .refused(
            "POST",
            "/namespaces",
            Some(json!({"id": "k1", "cluster": "c1", "singleTenant": true})),
        )
        .await;
    assert_eq!((status, code.as_str()), (400, "SINGLE_TENANT_INVALID"));
    assert!(
        message.contains("singleTenant applies to host pools"),
        "{message}"
    );

    let kubeconfig = "apiVersion: v1\nkind: Config\ncurrent-context: c\nclusters:\n- name: k\n  cluster:\n    server: https://127.0.0.1:6443\ncontexts:\n- name: c\n  context:\n    cluster: k\n    user: u\nusers:\n- name: u\n  user:\n    token: sekret\n";
    let (status, code, message) = api
        .refused(
            "POST",
            "/clusters",
            Some(json!({"name": "c1", "kubeconfig": kubeconfig, "settings": {}})),
        )
        .await;
    assert_eq!((status, code.as_str()), (409, "CLUSTER_EXISTS"));
    assert!(
        message.contains("cluster c1 is already registered"),
        "{message}"
    );
    assert_eq!(api.counts().await, before);
    assert_eq!(api.targets.engine.calls(), calls, "nothing was probed");

    // An empty Namespace being deleted takes no new Agent and no rollout.
    api.admin("DELETE", "/namespaces/ns1", None).await.unwrap();
    let before = api.counts().await;
    let (status, code, message) = api
        .refused(
            "POST",
            "/namespaces/ns1/agents",
            Some(json!({"id": "a1", "configurationId": "cfg"})),
        )
        .await;
    assert_eq!((status, code.as_str()), (409, "NAMESPACE_DELETING"));
    assert!(
        message.contains("Namespace ns1 is being deleted"),
        "{message}"
    );
    let (status, code, _) = api
        .refused(
            "POST",
            "/namespaces/ns1/rollouts",
            Some(json!({"configurationId": "cfg"})),
        )
        .await;
    assert_eq!((status, code.as_str()), (409, "NAMESPACE_DELETING"));
    assert_eq!(api.counts().await, before);
    api.settle().await;
    assert_eq!(
        api.refused("GET", "/namespaces/ns1", None).await.0,
        404,
        "the deletion went on"
    );
}

/// Agent refusals: an id taken, a reconcile with nothing to re-apply, runtime reads of an
/// Agent never placed, and any change of an Agent being deleted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_refusals() {
    let api = Api::start().await;
    api.pool().await;
    api.agent("a1").await.unwrap();
    let before = api.counts().await;
    let calls = api.targets.engine.calls();

    let (status, code, message) = api.agent("a1").await.unwrap_err();
    assert_eq!((status, code.as_str()), (409, "AGENT_EXISTS"));
    assert!(message.contains("Agent a1 exists"), "{message}");

    let reconcile = "/namespaces/ns1/agents/a1/reconcile";
    let (status, code, message) = api.refused("POST", reconcile, None).await;
    assert_eq!((status, code.as_str()), (409, "NOTHING_TO_RECONCILE"));
    assert!(message.contains("has no active revision"), "{message}");

    for path in [
        "/namespaces/ns1/agents/a1/runtime",
        "/namespaces/ns1/agents/a1/runtime/logs?tailLines=10",
    ] {
        let (status, code, message) = api.refused("GET", path, None).await;
        assert_eq!((status, code.as_str()), (409, "AGENT_NOT_PLACED"), "{path}");
        assert!(message.contains("never placed on a host"), "{message}");
    }
    assert_eq!(api.counts().await, before);
    assert_eq!(
        api.targets.engine.calls(),
        calls,
        "a refusal reached the host"
    );

    // Deployed, a reconcile is accepted; stopped, there is nothing to re-apply again.
    api.admin("POST", "/namespaces/ns1/agents/a1/deploy", None)
        .await
        .unwrap();
    api.settle().await;
    api.admin("POST", reconcile, None).await.unwrap();
    api.admin("POST", "/namespaces/ns1/agents/a1/stop", None)
        .await
        .unwrap();
    api.settle().await;
    let (status, code, _) = api.refused("POST", reconcile, None).await;
    assert_eq!((status, code.as_str()), (409, "NOTHING_TO_RECONCILE"));

    // Being deleted: deploy, stop and reconcile are refused, nothing is queued.
    api.admin("DELETE", "/namespaces/ns1/agents/a1", None)
        .await
        .unwrap();
    let before = api.counts().await;
    for action in ["deploy", "stop", "reconcile"] {
        let path = format!("/namespaces/ns1/agents/a1/{action}");
        let (status, code, message) = api.refused("POST", &path, None).await;
        assert_eq!((status, code.as_str()), (409, "AGENT_DELETING"), "{action}");
        assert!(message.contains("Agent a1 is being deleted"), "{message}");
    }
    assert_eq!(api.counts().await, before);
    api.settle().await;
    assert_eq!(
        api.refused("GET", "/namespaces/ns1/agents/a1", None)
            .await
            .0,
        404
    );
}

/// Runtime and log reads share a per-token budget; the read over it is 429 `RATE_LIMITED`
/// with the seconds to wait in Retry-After, and another token is not affected.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_over_the_token_budget_are_429_rate_limited() {
    let api = Api::on(
        Arc::new(SqliteStore::in_memory().unwrap()),
        ApiSettings {
            runtime_reads_per_minute: 2,
            ..ApiSettings::default()
        },
    )
    .await;
    api.pool().await;
    api.agent("a1").await.unwrap();
    api.admin("POST", "/namespaces/ns1/agents/a1/deploy", None)
        .await
        .unwrap();
    api.settle().await;
    let runtime = "/namespaces/ns1/agents/a1/runtime";
    for _ in 0..2 {
        let rt = api.admin("GET", runtime, None).await.unwrap();
        assert_eq!(rt["target"], "h1", "{rt}");
    }
    let calls = api.targets.engine.calls();
    let admin = api.admin.clone();
    for path in [runtime, "/namespaces/ns1/agents/a1/runtime/logs"] {
        let (status, head, v) = api.raw("GET", path, Some(&admin)).await;
        assert_eq!(status, 429, "{path}: {v}");
        assert_eq!(v["error"]["code"], "RATE_LIMITED", "{v}");
        assert!(
            v["error"]["message"]
                .as_str()
                .unwrap()
                .contains("too many reads of hosts and clusters"),
            "{v}"
        );
        // Two reads a minute: the next one in about 30 s.
        let retry_after: u64 = header(&head, "retry-after").parse().unwrap();
        assert!((1..=30).contains(&retry_after), "{retry_after}");
    }
    assert_eq!(
        api.targets.engine.calls(),
        calls,
        "a refused read reached the host"
    );
    let reader = api
        .admin(
            "POST",
            "/tokens",
            Some(json!({"name": "r", "grants": [{"namespace": "ns1", "role": "read"}]})),
        )
        .await
        .unwrap()["token"]
        .as_str()
        .unwrap()
        .to_owned();
    api.call(&reader, "GET", runtime, None).await.unwrap();
}

/// Plans ask their targets, so a deploy-role token's burst of plans is held to the token's
/// budget of reads of hosts and clusters: the plans over it are 429 `RATE_LIMITED` and never
/// reach the host (before, all of them did: 300 in a second).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plans_over_the_token_budget_are_429_and_do_not_reach_the_host() {
    let api = Api::on(
        Arc::new(SqliteStore::in_memory().unwrap()),
        ApiSettings {
            runtime_reads_per_minute: 3,
            ..ApiSettings::default()
        },
    )
    .await;
    api.pool().await;
    api.agent("a1").await.unwrap();
    let deployer = api
        .admin(
            "POST",
            "/tokens",
            Some(json!({"name": "d", "grants": [{"namespace": "ns1", "role": "deploy"}]})),
        )
        .await
        .unwrap()["token"]
        .as_str()
        .unwrap()
        .to_owned();
    let calls = api.targets.engine.calls();
    let (mut planned, mut limited) = (0, 0);
    for _ in 0..20 {
        let (status, _, v) = api
            .raw("POST", "/namespaces/ns1/agents/a1/plan", Some(&deployer))
            .await;
        match status {
            200 => planned += 1,
            429 => {
                assert_eq!(v["error"]["code"], "RATE_LIMITED", "{v}");
                assert!(
                    v["error"]["message"].as_str().unwrap().contains("plans"),
                    "{v}"
                );
                limited += 1;
            }
            other => panic!("{other}: {v}"),
        }
    }
    assert_eq!((planned, limited), (3, 17));
    assert_eq!(
        api.targets.engine.calls() - calls,
        3,
        "a refused plan reached the host"
    );
}

/// The token of a fresh plan of the Agent's next deploy.
async fn plan_token(api: &Api, agent: &str) -> String {
    let plan = api
        .admin(
            "POST",
            &format!("/namespaces/ns1/agents/{agent}/plan"),
            None,
        )
        .await
        .unwrap();
    plan["token"].as_str().unwrap().to_owned()
}

/// A plan token applies once: a second deploy with it, before the first one's work moved any
/// fact the token digests, was accepted too (two deploys from one reviewed plan). Now the
/// store consumes the token atomically and the second apply is 409 `PLAN_STALE`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plan_token_applies_once() {
    let api = Api::start().await;
    api.pool().await;
    api.agent("a1").await.unwrap();
    let token = plan_token(&api, "a1").await;
    let apply = format!("/namespaces/ns1/agents/a1/deploy?planToken={token}");
    api.admin("POST", &apply, None).await.unwrap();
    let revisions = api.store.revisions("ns1", "a1").await.unwrap().len();
    let (status, code, message) = api.refused("POST", &apply, None).await;
    assert_eq!((status, code.as_str()), (409, "PLAN_STALE"), "{message}");
    assert!(message.contains("applied already"), "{message}");
    assert_eq!(
        api.store.revisions("ns1", "a1").await.unwrap().len(),
        revisions,
        "the second apply stored a revision"
    );
}

/// The Agent's egress settings go into the plan's prepare (a changed net unit, a restart),
/// so a plan computed before they changed is stale: 409 `PLAN_STALE`, nothing stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plan_is_stale_once_the_agents_egress_changed() {
    let api = Api::start().await;
    api.pool().await;
    api.agent("a1").await.unwrap();
    let token = plan_token(&api, "a1").await;
    api.admin(
        "PATCH",
        "/namespaces/ns1/agents/a1",
        Some(serde_json::json!({"egress": {"ports": []}})),
    )
    .await
    .unwrap();
    let apply = format!("/namespaces/ns1/agents/a1/deploy?planToken={token}");
    let (status, code, message) = api.refused("POST", &apply, None).await;
    assert_eq!((status, code.as_str()), (409, "PLAN_STALE"), "{message}");
    assert!(message.contains("egress"), "{message}");
    assert!(api.store.revisions("ns1", "a1").await.unwrap().is_empty());
    let token = plan_token(&api, "a1").await;
    api.admin(
        "POST",
        &format!("/namespaces/ns1/agents/a1/deploy?planToken={token}"),
        None,
    )
    .await
    .unwrap();
}

/// `occ agent logs --follow` polls once a second, and each poll was an audit event. Now polls
/// that say `follow=true` are one `agent.logs.follow` event when the follow starts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_log_follow_is_audited_once() {
    let api = Api::start().await;
    api.pool().await;
    api.agent("a1").await.unwrap();
    api.admin("POST", "/namespaces/ns1/agents/a1/deploy", None)
        .await
        .unwrap();
    api.settle().await;
    let logs = "/namespaces/ns1/agents/a1/runtime/logs";
    api.admin("GET", &format!("{logs}?tailLines=5"), None)
        .await
        .unwrap();
    for _ in 0..5 {
        api.admin("GET", &format!("{logs}?sinceSeconds=10&follow=true"), None)
            .await
            .unwrap();
    }
    let count = |action: &'static str| {
        let api = &api;
        async move {
            api.admin("GET", &format!("/audit?action={action}"), None)
                .await
                .unwrap()
                .as_array()
                .unwrap()
                .len()
        }
    };
    assert_eq!(count("agent.logs.read").await, 1);
    assert_eq!(count("agent.logs.follow").await, 1);
}

/// A target that does not know a runtime operation (a hostd older than it) is 501
/// `BACKEND_UNSUPPORTED`, naming the upgrade, rather than a generic 409 `INVALID_INPUT`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operation_the_target_does_not_know_is_501_backend_unsupported() {
    let api = Api::start().await;
    api.pool().await;
    api.agent("a1").await.unwrap();
    api.admin("POST", "/namespaces/ns1/agents/a1/deploy", None)
        .await
        .unwrap();
    api.settle().await;
    api.admin("GET", "/namespaces/ns1/agents/a1/runtime", None)
        .await
        .unwrap();
    api.targets.predates_runtime.store(true, Ordering::SeqCst);
    for path in [
        "/namespaces/ns1/agents/a1/runtime",
        "/namespaces/ns1/agents/a1/runtime/logs?tailLines=5",
    ] {
        let (status, code, message) = api.refused("GET", path, None).await;
        assert_eq!(
            (status, code.as_str()),
            (501, "BACKEND_UNSUPPORTED"),
            "{path}"
        );
        assert!(
            message.contains("does not support this operation")
                && message.contains("upgrade hostd")
                && message.contains("unknown operation"),
            "{message}"
        );
    }
}

/// A write the database refuses is 500 `STORE_FAILURE` (a token's: `TOKEN_FAILURE`), saying to
/// look at the log and leaking nothing of the database's error; reads go on, and once the
/// database takes writes again the same requests succeed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_write_is_500_store_failure_or_token_failure() {
    let api = Api::start().await;
    api.sql(
        "CREATE TRIGGER refuse_hosts BEFORE INSERT ON hosts
           BEGIN SELECT RAISE(ABORT, 'injected: the disk refused the write'); END;
         CREATE TRIGGER refuse_tokens BEFORE INSERT ON tokens
           BEGIN SELECT RAISE(ABORT, 'injected: the disk refused the write'); END;",
    )
    .await;
    let before = api.counts().await;
    let host = json!({"name": "h1", "address": "127.0.0.1", "hostKey": HOST_KEY});
    let (status, code, message) = api.refused("POST", "/hosts", Some(host.clone())).await;
    assert_eq!((status, code.as_str()), (500, "STORE_FAILURE"));
    assert!(message.contains("see the coordinator log"), "{message}");
    assert!(!message.contains("injected"), "{message}");

    let token = json!({"name": "t", "grants": [{"namespace": "*", "role": "read"}]});
    let (status, code, message) = api.refused("POST", "/tokens", Some(token.clone())).await;
    assert_eq!((status, code.as_str()), (500, "TOKEN_FAILURE"));
    assert!(
        message.contains("the token could not be created"),
        "{message}"
    );
    assert!(!message.contains("injected"), "{message}");

    assert_eq!(api.admin("GET", "/hosts", None).await.unwrap(), json!([]));
    assert_eq!(api.counts().await, before);
    api.sql("DROP TRIGGER refuse_hosts; DROP TRIGGER refuse_tokens;")
        .await;
    api.admin("POST", "/hosts", Some(host)).await.unwrap();
    api.admin("POST", "/tokens", Some(token)).await.unwrap();
}

/// While another connection holds the database's write lock, a write is 503
/// `DATABASE_UNAVAILABLE` with Retry-After: 1 and nothing stored; once the lock is gone the
/// same request succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_locked_database_is_503_database_unavailable_with_retry_after() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let api = Api::on(
        Arc::new(SqliteStore::open(&path).unwrap()),
        ApiSettings::default(),
    )
    .await;
    // Wait briefly for the lock instead of the store's 5 s.
    api.sqlite
        .with_connection(|c| c.busy_timeout(Duration::from_millis(100)))
        .await
        .unwrap();
    let other = rusqlite::Connection::open(&path).unwrap();
    other.execute_batch("BEGIN IMMEDIATE").unwrap();
    let before = api.counts().await;
    let host = json!({"name": "h1", "address": "127.0.0.1", "hostKey": HOST_KEY});
    let (addr, admin) = (
        api.server.trim_start_matches("http://").to_owned(),
        api.admin.clone(),
    );
    let body = host.to_string();
    let head = format!(
        "POST /hosts HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {admin}\r\nContent-Type: application/json\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let (status, head, v) = tokio::task::spawn_blocking(move || raw_exchange(&addr, &head))
        .await
        .unwrap();
    assert_eq!(status, 503, "{v}");
    assert_eq!(v["error"]["code"], "DATABASE_UNAVAILABLE", "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("nothing was stored; retry"),
        "{v}"
    );
    assert_eq!(header(&head, "retry-after"), "1", "{head}");
    assert_eq!(api.counts().await, before);
    other.execute_batch("ROLLBACK").unwrap();
    api.admin("POST", "/hosts", Some(host)).await.unwrap();
}
