//! The HTTP API over real HTTP on loopback, with hostd's engine in process behind it
//! (tests/hostd_engine/mod.rs): every route, authentication and authorisation failures,
//! invalid bodies and unknown fields (each a 4xx with a code, with nothing stored), and the
//! happy path through the worker.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::api_support;
use crate::hostd_engine;

use std::sync::Arc;
use std::time::Duration;

use clawfleet_protocol::failure::FailureCode;
use coordinator::api::{Access, AppState, ROUTES, router};
use coordinator::client::{Api as _, Client, ClientError, all_pages};
use coordinator::config::WorkerSettings;
use coordinator::model::{Grant, Role};
use coordinator::service::Service;
use coordinator::store::SharedStore;
use coordinator::worker::Worker;
use hostd_engine::{EngineBackend, Inject};
use serde_json::{Value, json};

/// The number of a revision id (`rev-N-…`): ids also name their content, tests name numbers.
fn rev_num(id: Option<&str>) -> Option<u64> {
    id.and_then(coordinator::model::Revision::number_of)
}

use crate::fixtures::HOST_KEY;

struct Api {
    server: String,
    store: SharedStore,
    admin: String,
    worker: Arc<Worker<EngineBackend>>,
    backend: Arc<EngineBackend>,
    foreground: coordinator::foreground::Foreground,
}

impl Api {
    async fn start() -> Self {
        let (store, admin) = api_support::store_with_admin().await;
        let backend = Arc::new(EngineBackend::new());
        let settings = WorkerSettings {
            backoff_initial: Duration::from_millis(1),
            backoff_max: Duration::from_millis(5),
            ..WorkerSettings::default()
        };
        let worker = Arc::new(Worker::new(store.clone(), backend.clone(), settings));
        let state_backend = backend.clone();
        let foreground = coordinator::foreground::Foreground::default();
        let state = Arc::new(AppState {
            foreground: foreground.clone(),
            service: Service::new(store.clone()),
            backend,
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, router(state)).await });
        Self {
            server: format!("http://{addr}"),
            store,
            admin,
            worker,
            backend: state_backend,
            foreground,
        }
    }

    fn client(&self, token: Option<&str>) -> Client {
        Client::new(&self.server, token.map(str::to_owned)).unwrap()
    }

    async fn call(
        &self,
        token: Option<&str>,
        method: &str,
        path: &str,
        body: Option<Value>,
    ) -> Result<Value, (u16, String)> {
        let c = self.client(token);
        let method = method.to_owned();
        let path = path.to_owned();
        tokio::task::spawn_blocking(move || c.request(&method, &path, body.as_ref()))
            .await
            .unwrap()
            .map_err(|e| match e {
                ClientError::Api { status, code, .. } => (status, code),
                other => panic!("{other}"),
            })
    }

    async fn admin(
        &self,
        method: &str,
        path: &str,
        body: Option<Value>,
    ) -> Result<Value, (u16, String)> {
        let admin = self.admin.clone();
        self.call(Some(&admin), method, path, body).await
    }

    async fn settle(&self) {
        for _ in 0..200 {
            if self.worker.run_once().await.is_none()
                && self.store.pending_work().await.unwrap() == 0
            {
                return;
            }
        }
    }

    /// A fingerprint of everything stored, to prove a refused request stored nothing.
    async fn snapshot(&self) -> String {
        let mut out = format!(
            "{:?}{:?}",
            self.store.hosts().await.unwrap(),
            self.store.namespaces().await.unwrap()
        );
        for ns in self.store.namespaces().await.unwrap() {
            out.push_str(&format!("{:?}", self.store.agents(&ns.id).await.unwrap()));
            for a in self.store.agents(&ns.id).await.unwrap() {
                out.push_str(&format!(
                    "{:?}",
                    self.store.revisions(&ns.id, &a.id).await.unwrap()
                ));
            }
            out.push_str(&format!(
                "{:?}",
                self.store
                    .configuration(&ns.id, &clawfleet_protocol::Ident::new("cfg").unwrap())
                    .await
                    .unwrap()
            ));
        }
        out.push_str(&self.store.pending_work().await.unwrap().to_string());
        out
    }
}

#[tokio::test]
async fn happy_path_through_every_resource() {
    let api = Api::start().await;
    assert_eq!(
        api.call(None, "GET", "/healthz", None).await.unwrap()["status"],
        "ok"
    );
    let openapi = api.call(None, "GET", "/openapi.json", None).await.unwrap();
    assert_eq!(
        openapi["paths"].as_object().unwrap().len(),
        ROUTES
            .iter()
            .map(|r| r.path)
            .collect::<std::collections::BTreeSet<_>>()
            .len()
    );
    assert!(openapi["paths"]["/hosts/{host}"]["put"].is_object());
    let host = api
        .admin(
            "POST",
            "/hosts",
            Some(json!({"name": "h1", "address": "127.0.0.1", "hostKey": HOST_KEY})),
        )
        .await
        .unwrap();
    assert!(host["fingerprint"].as_str().unwrap().starts_with("SHA256:"));
    api.admin("GET", "/hosts", None).await.unwrap();
    // A host behind a jump host, logged into as a user other than root: kept and shown.
    let behind = api
        .admin(
            "POST",
            "/hosts",
            Some(json!({"name": "hb", "address": "10.0.0.7", "hostKey": HOST_KEY,
                        "loginUser": "occlogin",
                        "jump": {"address": "bastion.example", "port": 2200, "hostKey": HOST_KEY, "loginUser": "occjump"}})),
        )
        .await
        .unwrap();
    assert_eq!(behind["loginUser"], "occlogin", "{behind}");
    assert_eq!(behind["jump"]["port"], 2200, "{behind}");
    let got = api.admin("GET", "/hosts/hb", None).await.unwrap();
    assert_eq!(got["jump"], behind["jump"], "{got}");
    // Enrolment probes the host (here hostd's engine answers) and keeps the answer.
    assert_eq!(got["fencing"], "fenced", "{got}");
    api.admin("DELETE", "/hosts/hb", None).await.unwrap();
    api.admin("GET", "/hosts/h1", None).await.unwrap();
    // Re-pinning after a legitimate re-key.
    const NEW_KEY: &str =
        "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIMnG0PIjuNWnr7IJFWyMNGnJdSnF0PoCieZ3+AuhqjOM";
    let repinned = api
        .admin(
            "PUT",
            "/hosts/h1",
            Some(json!({"address": "127.0.0.1", "hostKey": NEW_KEY})),
        )
        .await;
    assert_ne!(repinned.unwrap()["fingerprint"], host["fingerprint"]);
    api.admin(
        "PUT",
        "/hosts/h1",
        Some(json!({"address": "127.0.0.1", "hostKey": HOST_KEY})),
    )
    .await
    .unwrap();
    assert_eq!(
        api.admin(
            "PUT",
            "/hosts/nope",
            Some(json!({"address": "127.0.0.1", "hostKey": HOST_KEY}))
        )
        .await
        .unwrap_err(),
        (404, "NOT_FOUND".into())
    );
    // An unused host can be forgotten; a host in a pool cannot.
    api.admin(
        "POST",
        "/hosts",
        Some(json!({"name": "spare", "address": "127.0.0.2", "hostKey": HOST_KEY})),
    )
    .await
    .unwrap();
    assert_eq!(
        api.admin("DELETE", "/hosts/spare", None).await.unwrap(),
        Value::Null
    );
    assert_eq!(
        api.admin("DELETE", "/hosts/spare", None).await.unwrap_err(),
        (404, "NOT_FOUND".into())
    );
    api.admin(
        "POST",
        "/namespaces",
        Some(json!({"id": "ns1", "hosts": ["h1"]})),
    )
    .await
    .unwrap();
    assert_eq!(
        api.admin("DELETE", "/hosts/h1", None).await.unwrap_err(),
        (409, "HOST_IN_USE".into())
    );
    api.admin(
        "POST",
        "/namespaces/ns1/configurations",
        Some(json!({"id": "cfg", "document": {"logging": {"level": "info"}}})),
    )
    .await
    .unwrap();
    let g2 = api
        .admin(
            "PUT",
            "/namespaces/ns1/configurations/cfg",
            Some(json!({"document": {}})),
        )
        .await
        .unwrap();
    assert_eq!(g2["generation"], 2);
    assert_eq!(
        api.admin("GET", "/namespaces/ns1/configurations/cfg", None)
            .await
            .unwrap()["generation"],
        2
    );
    api.admin(
        "POST",
        "/namespaces/ns1/agents",
        Some(json!({"id": "a1", "configurationId": "cfg"})),
    )
    .await
    .unwrap();
    api.admin(
        "PATCH",
        "/namespaces/ns1/agents/a1",
        Some(json!({"configurationId": "cfg"})),
    )
    .await
    .unwrap();
    let rev = api
        .admin("POST", "/namespaces/ns1/agents/a1/deploy", None)
        .await
        .unwrap();
    assert_eq!(rev_num(rev["id"].as_str()), Some(1));
    api.settle().await;
    let status = api
        .admin("GET", "/namespaces/ns1/agents/a1/deployment-status", None)
        .await
        .unwrap();
    assert_eq!(rev_num(status["servedRevisionId"].as_str()), Some(1));
    assert_eq!(status["converged"], true);
    assert_eq!(
        api.admin("GET", "/namespaces/ns1/agents", None)
            .await
            .unwrap()
            .as_array()
            .unwrap()
            .len(),
        1
    );
    api.admin("GET", "/namespaces/ns1/agents/a1", None)
        .await
        .unwrap();
    api.admin("GET", "/namespaces/ns1/agents/a1/revisions", None)
        .await
        .unwrap();
    let first = rev["id"].as_str().unwrap();
    let got = api
        .admin(
            "GET",
            &format!("/namespaces/ns1/agents/a1/revisions/{first}"),
            None,
        )
        .await
        .unwrap();
    assert_eq!(got["id"], rev["id"]);
    api.admin("POST", "/namespaces/ns1/agents/a1/stop", None)
        .await
        .unwrap();
    api.settle().await;
    assert_eq!(
        api.admin("GET", "/namespaces/ns1", None).await.unwrap()["ready"],
        true
    );
    assert_eq!(
        api.admin("DELETE", "/namespaces/ns1", None)
            .await
            .unwrap_err(),
        (409, "NAMESPACE_NOT_EMPTY".into())
    );
    api.admin("DELETE", "/namespaces/ns1/agents/a1", None)
        .await
        .unwrap();
    api.settle().await;
    api.admin("DELETE", "/namespaces/ns1", None).await.unwrap();
    api.settle().await;
    assert_eq!(
        api.admin("GET", "/namespaces", None).await.unwrap(),
        json!([])
    );
    assert_eq!(
        api.call(None, "GET", "/metrics", None).await.unwrap_err(),
        (401, "UNAUTHENTICATED".into())
    );
    let metrics = api.admin("GET", "/metrics", None).await.unwrap();
    assert!(metrics.as_str().unwrap().contains("clawfleet_hosts 1"));
    assert!(
        metrics
            .as_str()
            .unwrap()
            .contains("clawfleet_rollouts{state=\"halted\"} 0"),
        "{metrics}"
    );
    // Every change left an audit event.
    let actions: Vec<String> = api
        .store
        .audit_events(100)
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.action)
        .collect();
    for a in [
        "host.enrol",
        "namespace.create",
        "configuration.create",
        "configuration.update",
        "agent.create",
        "agent.update",
        "agent.deploy",
        "agent.stop",
        "agent.delete",
        "namespace.delete",
        "host.update",
        "host.delete",
    ] {
        assert!(actions.contains(&a.to_owned()), "missing audit {a}");
    }
}

/// The worker yields to requests of valid tokens only: a request without a token, or with one
/// the store does not know, never counts as the API being busy.
#[tokio::test]
async fn only_requests_of_valid_tokens_count_for_the_worker_to_yield_to() {
    let api = Api::start().await;
    assert_eq!(api.foreground.entered(), 0);
    assert_eq!(
        api.call(None, "GET", "/hosts", None).await.unwrap_err().0,
        401
    );
    let bogus = Some("ocf_not-a-token");
    assert_eq!(
        api.call(bogus, "GET", "/hosts", None).await.unwrap_err().0,
        401
    );
    assert_eq!(
        api.foreground.entered(),
        0,
        "unauthenticated requests counted"
    );
    api.admin("GET", "/hosts", None).await.unwrap();
    assert_eq!(api.foreground.entered(), 1);
    // Answered: nothing is in progress once the grace has passed.
    tokio::time::sleep(coordinator::foreground::GRACE * 2).await;
    assert!(!api.foreground.busy());
}

#[tokio::test]
async fn authentication_and_authorisation_are_enforced_on_every_route() {
    let api = Api::start().await;
    api.admin(
        "POST",
        "/hosts",
        Some(json!({"name": "h1", "address": "127.0.0.1", "hostKey": HOST_KEY})),
    )
    .await
    .unwrap();
    // Two Namespaces share h1: it stands for a host with per-Agent quotas.
    hostd_engine::with_enforced_quotas(&api.store, "h1").await;
    api.admin(
        "POST",
        "/namespaces",
        Some(json!({"id": "ns1", "hosts": ["h1"]})),
    )
    .await
    .unwrap();
    api.admin(
        "POST",
        "/namespaces",
        Some(json!({"id": "ns2", "hosts": ["h1"]})),
    )
    .await
    .unwrap();
    let token = |grant: Value| {
        let api = &api;
        async move {
            let t = api
                .admin(
                    "POST",
                    "/tokens",
                    Some(json!({"name": "t", "grants": [grant]})),
                )
                .await
                .unwrap();
            t["token"].as_str().unwrap().to_owned()
        }
    };
    let roles = [Role::Read, Role::Operate, Role::Deploy, Role::Admin];
    let mut in_ns1 = Vec::new();
    for r in roles {
        in_ns1.push((
            r,
            token(json!({"namespace": "ns1", "role": r.as_str()})).await,
        ));
    }
    let reader = in_ns1[0].1.clone();
    let ns2_admin = token(json!({"namespace": "ns2", "role": "admin"})).await;
    let revoked = api
        .admin(
            "POST",
            "/tokens",
            Some(json!({"name": "x", "grants": [{"namespace": "*", "role": "admin"}]})),
        )
        .await
        .unwrap();
    api.admin(
        "DELETE",
        &format!("/tokens/{}", revoked["id"].as_str().unwrap()),
        None,
    )
    .await
    .unwrap();
    let revoked = revoked["token"].as_str().unwrap().to_owned();
    let (_, expired) = coordinator::tokens::create_expiring(
        &*api.store,
        "old",
        &[Grant {
            namespace: "*".into(),
            role: Role::Admin,
        }],
        Some(1),
    )
    .await
    .unwrap();
    // Every route in the table is served and documented.
    let doc = api.call(None, "GET", "/openapi.json", None).await.unwrap();
    let mut checked = 0;
    for route in ROUTES {
        let method = route.method.as_str().to_uppercase();
        assert!(
            doc["paths"][route.path][route.method.as_str()].is_object(),
            "{method} {} is not in /openapi.json",
            route.path
        );
        let path = route
            .path
            .replace("{ns}", "ns1")
            .replace("{cfg}", "cfg")
            .replace("{agent}", "a1")
            .replace("{rev}", "rev-1")
            .replace("{host}", "h1")
            .replace("{cluster}", "c1")
            .replace("{work}", "1")
            .replace("{name}", "s1")
            .replace("{id}", "abc")
            .replace("{path}", "index.html");
        if route.access == Access::Public {
            let got = api.call(None, &method, &path, None).await;
            assert!(got.is_ok(), "{method} {path} without a token: {got:?}");
            continue;
        }
        let before = api.snapshot().await;
        for t in [
            None,
            Some("cf_nope_nope"),
            Some(revoked.as_str()),
            Some(expired.as_str()),
        ] {
            let got = api.call(t, &method, &path, Some(json!({}))).await;
            assert_eq!(
                got.unwrap_err(),
                (401, "UNAUTHENTICATED".into()),
                "{method} {path} with {t:?}"
            );
        }
        // Tokens that must get 403: every role below the route's, in the route's Namespace;
        // for Namespace routes also an admin of another Namespace; for global routes also an
        // admin of one Namespace.
        let mut forbidden: Vec<(String, &str)> = Vec::new();
        if let Some(need) = route.access.role() {
            for (r, t) in &in_ns1 {
                if *r < need {
                    forbidden.push((format!("{} of ns1", r.as_str()), t));
                }
            }
            match route.access {
                Access::Namespace(_) => forbidden.push(("admin of ns2".into(), &ns2_admin)),
                Access::Global(_) => {
                    let (_, t) = in_ns1.last().unwrap();
                    forbidden.push(("admin of ns1".into(), t));
                }
                _ => {}
            }
        }
        for (who, t) in forbidden {
            let got = api.call(Some(t), &method, &path, Some(json!({}))).await;
            assert_eq!(
                got.unwrap_err(),
                (403, "FORBIDDEN".into()),
                "{method} {path} as {who}"
            );
            checked += 1;
        }
        assert_eq!(
            api.snapshot().await,
            before,
            "{method} {path} changed state"
        );
    }
    assert!(checked > 60, "only {checked} refusals checked");
    // A reader of ns1 sees ns1 only and cannot read ns2.
    let visible = api
        .call(Some(&reader), "GET", "/namespaces", None)
        .await
        .unwrap();
    assert_eq!(visible.as_array().unwrap().len(), 1);
    assert_eq!(
        api.call(Some(&reader), "GET", "/namespaces/ns2", None)
            .await
            .unwrap_err()
            .0,
        403
    );
}

#[tokio::test]
async fn invalid_bodies_are_4xx_with_a_code_and_store_nothing() {
    let api = Api::start().await;
    api.admin(
        "POST",
        "/hosts",
        Some(json!({"name": "h1", "address": "127.0.0.1", "hostKey": HOST_KEY})),
    )
    .await
    .unwrap();
    api.admin(
        "POST",
        "/namespaces",
        Some(json!({"id": "ns1", "hosts": ["h1"]})),
    )
    .await
    .unwrap();
    api.admin(
        "POST",
        "/namespaces/ns1/configurations",
        Some(json!({"id": "cfg", "document": {}})),
    )
    .await
    .unwrap();
    let cases: Vec<(&str, &str, Value, u16, &str)> = vec![
        (
            "POST",
            "/hosts",
            json!({"name": "h2", "address": "127.0.0.1", "hostKey": HOST_KEY, "extra": 1}),
            400,
            "INVALID_BODY",
        ),
        (
            "POST",
            "/hosts",
            json!({"name": "h2", "address": "-oProxyCommand=x", "hostKey": HOST_KEY}),
            400,
            "INVALID_ADDRESS",
        ),
        (
            "POST",
            "/hosts",
            json!({"name": "h2", "address": "127.0.0.1", "hostKey": "not a key"}),
            400,
            "INVALID_HOST_KEY",
        ),
        (
            "POST",
            "/hosts",
            json!({"name": "h 2", "address": "127.0.0.1", "hostKey": HOST_KEY}),
            400,
            "INVALID_IDENTIFIER",
        ),
        (
            "POST",
            "/hosts",
            json!({"name": "h1", "address": "127.0.0.1", "hostKey": HOST_KEY}),
            409,
            "HOST_EXISTS",
        ),
        (
            "POST",
            "/hosts",
            json!({"name": "h2", "address": "127.0.0.1", "port": 0, "hostKey": HOST_KEY}),
            400,
            "INVALID_PORT",
        ),
        (
            "POST",
            "/hosts",
            json!({"name": "h2", "address": "127.0.0.1", "maxAgents": 0, "hostKey": HOST_KEY}),
            400,
            "INVALID_CAPACITY",
        ),
        (
            "POST",
            "/hosts",
            json!({"name": "h2", "address": "127.0.0.1", "hostKey": HOST_KEY, "loginUser": "-oProxyCommand"}),
            400,
            "INVALID_HOST_ACCESS",
        ),
        (
            "POST",
            "/hosts",
            json!({"name": "h2", "address": "127.0.0.1", "hostKey": HOST_KEY,
                   "jump": {"address": "bastion", "hostKey": HOST_KEY, "loginUser": "a b"}}),
            400,
            "INVALID_HOST_ACCESS",
        ),
        (
            "POST",
            "/hosts",
            json!({"name": "h2", "address": "127.0.0.1", "hostKey": HOST_KEY,
                   "jump": {"address": "bastion", "hostKey": "not a key"}}),
            400,
            "INVALID_HOST_KEY",
        ),
        (
            "POST",
            "/hosts",
            json!({"name": "h2", "address": "127.0.0.1", "hostKey": HOST_KEY,
                   "jump": {"address": "bastion", "port": 0, "hostKey": HOST_KEY}}),
            400,
            "INVALID_HOST_ACCESS",
        ),
        (
            "POST",
            "/namespaces",
            json!({"id": "ns2", "hosts": ["nope"]}),
            400,
            "UNKNOWN_HOST",
        ),
        (
            "POST",
            "/namespaces",
            json!({"id": "ns2", "hosts": []}),
            400,
            "EMPTY_POOL",
        ),
        (
            "POST",
            "/namespaces",
            json!({"id": "../x", "hosts": ["h1"]}),
            400,
            "INVALID_IDENTIFIER",
        ),
        (
            "POST",
            "/namespaces",
            json!({"id": "ns2", "hosts": "h1"}),
            400,
            "INVALID_BODY",
        ),
        (
            "POST",
            "/namespaces",
            json!({"id": "ns1", "hosts": ["h1"]}),
            409,
            "NAMESPACE_EXISTS",
        ),
        (
            "POST",
            "/namespaces/ns1/configurations",
            json!({"id": "c2", "document": {"gateway": {"bind": "lan"}}}),
            400,
            "CONFIGURATION_REFUSED",
        ),
        (
            "POST",
            "/namespaces/ns1/configurations",
            json!({"id": "c2", "document": {"gateway": {"auth": {"password": "secret"}}}}),
            400,
            "CONFIGURATION_REFUSED",
        ),
        (
            "POST",
            "/namespaces/ns1/configurations",
            json!({"id": "c2", "document": [], "x": 1}),
            400,
            "INVALID_BODY",
        ),
        (
            "POST",
            "/namespaces/ns1/configurations",
            json!({"id": "cfg", "document": {}}),
            409,
            "CONFIGURATION_EXISTS",
        ),
        (
            "PUT",
            "/namespaces/ns1/configurations/none",
            json!({"document": {}}),
            404,
            "NOT_FOUND",
        ),
        (
            "POST",
            "/namespaces/ns1/agents",
            json!({"id": "a1", "configurationId": "none"}),
            400,
            "UNKNOWN_CONFIGURATION",
        ),
        (
            "POST",
            "/namespaces/ns1/agents",
            json!({"id": "a1", "configurationId": "cfg", "harnessAuth": {"method": "managed"}}),
            400,
            "HARNESS_AUTH_UNSUPPORTED",
        ),
        (
            "POST",
            "/namespaces/ns1/agents",
            json!({"id": "a1", "configurationId": "cfg", "secretBindings": []}),
            400,
            "INVALID_BODY",
        ),
        (
            "POST",
            "/namespaces/ns1/agents",
            json!({"id": "a1", "configurationId": "cfg", "sandbox": {}}),
            400,
            "INVALID_BODY",
        ),
        (
            "POST",
            "/namespaces/nope/agents",
            json!({"id": "a1", "configurationId": "cfg"}),
            404,
            "NOT_FOUND",
        ),
        (
            "POST",
            "/namespaces/ns1/agents/none/deploy",
            json!(null),
            404,
            "NOT_FOUND",
        ),
        (
            "POST",
            "/tokens",
            json!({"name": "t", "grants": []}),
            400,
            "INVALID_BODY",
        ),
        (
            "POST",
            "/tokens",
            json!({"name": "t", "grants": [{"namespace": "ns1", "role": "root"}]}),
            400,
            "INVALID_BODY",
        ),
        ("DELETE", "/tokens/nope", json!(null), 404, "NOT_FOUND"),
        ("GET", "/nowhere", json!(null), 404, "NO_SUCH_ROUTE"),
    ];
    for (method, path, body, status, code) in cases {
        let before = api.snapshot().await;
        let body = if body.is_null() { None } else { Some(body) };
        let got = api.admin(method, path, body.clone()).await;
        assert_eq!(
            got.unwrap_err(),
            (status, code.to_owned()),
            "{method} {path} {body:?}"
        );
        assert_eq!(
            api.snapshot().await,
            before,
            "{method} {path} stored something"
        );
    }
    // A body on a bodyless route.
    api.admin(
        "POST",
        "/namespaces/ns1/agents",
        Some(json!({"id": "a1", "configurationId": "cfg"})),
    )
    .await
    .unwrap();
    assert_eq!(
        api.admin(
            "POST",
            "/namespaces/ns1/agents/a1/deploy",
            Some(json!({"force": true}))
        )
        .await
        .unwrap_err(),
        (400, "UNEXPECTED_BODY".into())
    );
}

impl Api {
    /// Host h1, Namespace ns1 on it (ready), configuration cfg, Agent a1.
    async fn pool_and_agent(&self) {
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
        self.admin(
            "POST",
            "/namespaces/ns1/agents",
            Some(json!({"id": "a1", "configurationId": "cfg"})),
        )
        .await
        .unwrap();
        self.settle().await;
    }

    /// Runs the worker in the background until the returned sender is dropped or set.
    fn run_worker(&self) -> tokio::sync::watch::Sender<bool> {
        let (tx, rx) = tokio::sync::watch::channel(false);
        tokio::spawn(self.worker.clone().run(1, rx));
        tx
    }

    /// Runs `occ` against this API; returns (exit code, stderr + stdout).
    async fn occ(&self, args: &[&str]) -> (i32, String) {
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_occ"));
        cmd.args(["--server", &self.server, "--token", &self.admin])
            .args(args)
            .env("OCC_LOG", "error");
        let out = tokio::task::spawn_blocking(move || cmd.output())
            .await
            .unwrap()
            .unwrap();
        (
            out.status.code().unwrap_or(-1),
            format!(
                "{}{}",
                String::from_utf8_lossy(&out.stderr),
                String::from_utf8_lossy(&out.stdout)
            ),
        )
    }
}

impl Api {
    /// A request the API must refuse: its status, code and message.
    async fn refusal(&self, method: &str, path: &str, body: Value) -> (u16, String, String) {
        let c = self.client(Some(&self.admin));
        let (method, path) = (method.to_owned(), path.to_owned());
        match tokio::task::spawn_blocking(move || c.request(&method, &path, Some(&body)))
            .await
            .unwrap()
        {
            Err(ClientError::Api {
                status,
                code,
                message,
            }) => (status, code, message),
            other => panic!("not refused: {other:?}"),
        }
    }

    async fn egress_of(&self, agent: &str) -> Value {
        let a = self
            .admin("GET", &format!("/namespaces/ns1/agents/{agent}"), None)
            .await
            .unwrap();
        a.get("egress").cloned().unwrap_or(Value::Null)
    }
}

/// Issue 28: an Agent's own egress settings through the API. Created and returned by GET;
/// a bad entry is a 400 INVALID_BODY naming it, with nothing stored; PATCH replaces them,
/// keeps them when it names no `egress`, drops them with `{}`; each change is audited. `occ
/// agent create`/`set` set them and `occ agent get` shows them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_egress_is_stored_returned_replaced_and_refused_naming_the_entry() {
    let api = Api::start().await;
    api.pool_and_agent().await;
    assert_eq!(api.egress_of("a1").await, Value::Null, "none unless set");

    let narrow = json!({"ports": [443], "allow": ["10.1.2.0/24"]});
    let created = api
        .admin(
            "POST",
            "/namespaces/ns1/agents",
            Some(json!({"id": "e1", "configurationId": "cfg", "egress": narrow})),
        )
        .await
        .unwrap();
    assert_eq!(created["egress"], narrow);
    assert_eq!(api.egress_of("e1").await, narrow);
    let audit = api.store.audit_events(1).await.unwrap();
    assert_eq!(
        (audit[0].action.as_str(), &audit[0].detail["egress"]),
        ("agent.create", &narrow)
    );
    // `{}` sets no list of its own: the same as none.
    api.admin(
        "POST",
        "/namespaces/ns1/agents",
        Some(json!({"id": "e2", "configurationId": "cfg", "egress": {}})),
    )
    .await
    .unwrap();
    assert_eq!(api.egress_of("e2").await, Value::Null);

    for (method, path, body, says) in [
        (
            "POST",
            "/namespaces/ns1/agents",
            json!({"id": "e3", "configurationId": "cfg", "egress": {"ports": [443, 443]}}),
            "egress.ports[1] repeats 443",
        ),
        (
            "POST",
            "/namespaces/ns1/agents",
            json!({"id": "e3", "configurationId": "cfg", "egress": {"ports": [0]}}),
            "egress.ports[0] is 0",
        ),
        (
            "POST",
            "/namespaces/ns1/agents",
            json!({"id": "e3", "configurationId": "cfg", "egress": {"allow": ["10.1.2.3/24"]}}),
            "egress.allow[0] is \"10.1.2.3/24\", not an IPv4 CIDR",
        ),
        (
            "POST",
            "/namespaces/ns1/agents",
            json!({"id": "e3", "configurationId": "cfg", "egress": {"hosts": ["x"]}}),
            "unknown field `hosts`",
        ),
        (
            "PATCH",
            "/namespaces/ns1/agents/e1",
            json!({"restore": "last-served", "egress": {"allow": ["10.0.0.0/8", "10.0.0.0/8"]}}),
            "egress.allow[1] repeats 10.0.0.0/8",
        ),
        (
            "PATCH",
            "/namespaces/ns1/agents/e1",
            json!({"egress": {"ports": [65536]}}),
            "65536",
        ),
    ] {
        let before = api.snapshot().await;
        let (status, code, message) = api.refusal(method, path, body.clone()).await;
        assert_eq!((status, code.as_str()), (400, "INVALID_BODY"), "{body}");
        assert!(message.contains(says), "{body}: {message}");
        assert!(
            message.starts_with("invalid request body at `egress"),
            "names the field: {message}"
        );
        assert_eq!(
            api.snapshot().await,
            before,
            "{method} {path} {body} stored something"
        );
    }
    assert_eq!(
        api.egress_of("e1").await,
        narrow,
        "unchanged by the refusals"
    );

    // Replaced, kept by a patch that does not name it, dropped by `{}`.
    let patched = api
        .admin(
            "PATCH",
            "/namespaces/ns1/agents/e1",
            Some(json!({"egress": {"ports": []}})),
        )
        .await
        .unwrap();
    assert_eq!(patched["egress"], json!({"ports": []}));
    api.admin(
        "PATCH",
        "/namespaces/ns1/agents/e1",
        Some(json!({"restore": "last-served"})),
    )
    .await
    .unwrap();
    assert_eq!(api.egress_of("e1").await, json!({"ports": []}));
    let reset = api
        .admin(
            "PATCH",
            "/namespaces/ns1/agents/e1",
            Some(json!({"egress": {}})),
        )
        .await
        .unwrap();
    assert!(reset.get("egress").is_none_or(Value::is_null), "{reset}");
    assert_eq!(reset["restore"], "last-served");
    let audit = api.store.audit_events(1).await.unwrap();
    assert_eq!(
        (audit[0].action.as_str(), &audit[0].detail["egress"]),
        ("agent.update", &json!({}))
    );

    // occ: create with flags, show, replace, refuse, reset.
    let (code, out) = api
        .occ(&[
            "agent",
            "create",
            "ns1",
            "c1",
            "--configuration",
            "cfg",
            "--egress-port",
            "443",
            "--no-egress-allow",
        ])
        .await;
    assert_eq!(code, 0, "{out}");
    assert_eq!(
        api.egress_of("c1").await,
        json!({"ports": [443], "allow": []})
    );
    let (code, out) = api.occ(&["agent", "get", "ns1", "c1"]).await;
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("ports 443; allow none"), "{out}");
    let (code, out) = api
        .occ(&["agent", "set", "ns1", "c1", "--egress-allow", "10.0.0.0/8"])
        .await;
    assert_eq!(code, 0, "{out}");
    assert_eq!(api.egress_of("c1").await, json!({"allow": ["10.0.0.0/8"]}));
    let (code, out) = api
        .occ(&["agent", "set", "ns1", "c1", "--egress-port", "0"])
        .await;
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("egress.ports[0] is 0"), "{out}");
    let (code, out) = api
        .occ(&[
            "agent",
            "set",
            "ns1",
            "c1",
            "--target-egress",
            "--egress-port",
            "443",
        ])
        .await;
    assert_eq!(code, 2, "flags that contradict each other: {out}");
    let (code, out) = api
        .occ(&["agent", "set", "ns1", "c1", "--target-egress"])
        .await;
    assert_eq!(code, 0, "{out}");
    assert_eq!(api.egress_of("c1").await, Value::Null);
}

/// Concurrent deploys of one Agent: every request gets its own revision number, and none
/// ends in a 5xx (the number used to be read outside the insert's transaction).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_deploys_of_one_agent_get_distinct_numbers_and_no_5xx() {
    let api = Api::start().await;
    api.pool_and_agent().await;
    let mut clients = Vec::new();
    for _ in 0..8 {
        let c = api.client(Some(&api.admin));
        clients.push(tokio::task::spawn_blocking(move || {
            (0..150)
                .map(|_| c.request("POST", "/namespaces/ns1/agents/a1/deploy", None))
                .collect::<Vec<_>>()
        }));
    }
    let mut numbers = std::collections::BTreeSet::new();
    let mut errors = Vec::new();
    for c in clients {
        for r in c.await.unwrap() {
            match r {
                Ok(rev) => {
                    assert!(rev["workId"].as_i64().is_some(), "{rev}");
                    assert!(numbers.insert(rev["number"].as_u64().unwrap()), "{rev}");
                }
                Err(e) => errors.push(e.to_string()),
            }
        }
    }
    assert!(
        errors.is_empty(),
        "{} errors, e.g. {:?}",
        errors.len(),
        errors.first()
    );
    assert_eq!(numbers.len(), 1200);
    assert_eq!(numbers.last(), Some(&1200));
}

/// Sends a raw request and returns the status and the parsed JSON body.
fn raw_request(server: &str, head: &str, body: &[u8]) -> (u16, Value) {
    use std::io::{Read, Write};
    let addr = server.trim_start_matches("http://");
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    // The server may answer before it read the whole body; a failed write is fine then.
    let _ = stream.write_all(head.as_bytes());
    let _ = stream.write_all(body);
    let mut raw = Vec::new();
    let _ = stream.read_to_end(&mut raw);
    let text = String::from_utf8_lossy(&raw).to_string();
    let (head, rest) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    assert!(
        head.to_ascii_lowercase()
            .contains("content-type: application/json"),
        "not JSON: {head}"
    );
    // Bodies here are small and not chunked, or chunked in one piece.
    let json_start = rest.find('{').unwrap_or(0);
    let json_end = rest.rfind('}').map(|i| i + 1).unwrap_or(rest.len());
    (
        status,
        serde_json::from_str(&rest[json_start..json_end]).unwrap_or(Value::Null),
    )
}

/// Every error has the API's JSON shape, the framework's own rejections included: a body
/// over the limit is a JSON 413 (before any token lookup), a wrong method a JSON 405.
#[tokio::test]
async fn framework_rejections_have_the_json_error_shape() {
    let api = Api::start().await;
    for size in [1024 * 1024 + 10, 3 * 1024 * 1024] {
        let body = vec![b' '; size];
        let head = format!(
            "POST /namespaces HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {size}\r\n\r\n"
        );
        let server = api.server.clone();
        let (status, v) = tokio::task::spawn_blocking(move || raw_request(&server, &head, &body))
            .await
            .unwrap();
        assert_eq!(status, 413, "{size} bytes: {v}");
        assert_eq!(v["error"]["code"], "BODY_TOO_LARGE", "{v}");
        assert!(v["error"]["message"].as_str().unwrap().contains("1024 KiB"));
    }
    let head =
        "PATCH /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: 0\r\n\r\n";
    let server = api.server.clone();
    let (status, v) = tokio::task::spawn_blocking(move || raw_request(&server, head, b""))
        .await
        .unwrap();
    assert_eq!(status, 405);
    assert_eq!(v["error"]["code"], "METHOD_NOT_ALLOWED", "{v}");
    assert_eq!(api.store.namespaces().await.unwrap().len(), 0);
}

/// `occ agent deploy --wait` reports the requested revision's outcome: when it failed
/// permanently while an older revision still serves, it exits 3 and says so (it used to
/// print "converged" and exit 0).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deploy_wait_exits_non_zero_when_the_requested_revision_failed() {
    let api = Api::start().await;
    api.pool_and_agent().await;
    let _worker = api.run_worker();
    let (code, out) = api.occ(&["agent", "deploy", "ns1", "a1", "--wait"]).await;
    assert_eq!(code, 0, "{out}");
    let cases = [
        (
            Inject::Fail(FailureCode::OwnershipMismatch),
            "OWNERSHIP_MISMATCH",
        ),
        (
            Inject::Fail(FailureCode::SnapshotMismatch),
            "SNAPSHOT_MISMATCH",
        ),
        (Inject::HostKeyMismatch, "HOST_KEY_MISMATCH"),
    ];
    for (i, (inject, name)) in cases.into_iter().enumerate() {
        // The next call is the new revision's prepare.
        api.backend.inject(api.backend.calls(), inject);
        let (code, out) = api
            .occ(&["agent", "deploy", "ns1", "a1", "--wait", "--timeout", "30"])
            .await;
        let rev = format!("rev-{}-", i + 2);
        assert_eq!(code, 3, "{name}: {out}");
        assert!(
            out.contains(&format!("a1 {rev}")) && out.contains(&format!(" failed: {name}")),
            "{out}"
        );
        assert!(out.contains("(rev-1-") && out.contains(" serves)"), "{out}");
        let status = api
            .admin("GET", "/namespaces/ns1/agents/a1/deployment-status", None)
            .await
            .unwrap();
        assert_eq!(status["converged"], false, "{status}");
        assert_eq!(rev_num(status["servedRevisionId"].as_str()), Some(1));
    }
}

/// Failed stop work is visible: deployment status carries its last attempt, `occ agent stop
/// --wait` exits 3 with its code at once, and an exhausted stop says it gave up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_stop_work_is_visible_in_status_and_wait() {
    let api = Api::start().await;
    api.pool_and_agent().await;
    let _worker = api.run_worker();
    let (code, out) = api.occ(&["agent", "deploy", "ns1", "a1", "--wait"]).await;
    assert_eq!(code, 0, "{out}");

    api.backend.inject(
        api.backend.calls(),
        Inject::Fail(FailureCode::OwnershipMismatch),
    );
    let started = std::time::Instant::now();
    let (code, out) = api
        .occ(&["agent", "stop", "ns1", "a1", "--wait", "--timeout", "60"])
        .await;
    assert_eq!(code, 3, "{out}");
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "waited out the timeout"
    );
    assert!(
        out.contains("stop of a1 failed: OWNERSHIP_MISMATCH"),
        "{out}"
    );
    let status = api
        .admin("GET", "/namespaces/ns1/agents/a1/deployment-status", None)
        .await
        .unwrap();
    assert_eq!(status["converged"], false);
    let stop = &status["recentWork"][0];
    assert_eq!(stop["kind"], "stop", "{status}");
    assert_eq!(stop["state"], "failed");
    assert_eq!(stop["lastAttempt"]["code"], "OWNERSHIP_MISMATCH");
    assert!(stop["lastAttempt"]["at"].as_i64().unwrap() > 1_700_000_000);

    // Retryable failures until the budget (5 attempts) is spent.
    let n = api.backend.calls();
    for i in 0..5 {
        api.backend.inject(n + i, Inject::Transport);
    }
    let (code, out) = api
        .occ(&["agent", "stop", "ns1", "a1", "--wait", "--timeout", "60"])
        .await;
    assert_eq!(code, 3, "{out}");
    assert!(out.contains("HOST_UNREACHABLE"), "{out}");
    assert!(out.contains("gave up after 5 attempts"), "{out}");
    let status = api
        .admin("GET", "/namespaces/ns1/agents/a1/deployment-status", None)
        .await
        .unwrap();
    assert_eq!(status["recentWork"][0]["attempts"], 5, "{status}");

    // Then a stop that works converges and exits 0.
    let (code, out) = api.occ(&["agent", "stop", "ns1", "a1", "--wait"]).await;
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("a1: stopped"), "{out}");
}

/// base64 of a PEM CERTIFICATE block (the parser checks the PEM shape, not the key).
const CA_DATA: &str =
    "LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCkFBQUEKLS0tLS1FTkQgQ0VSVElGSUNBVEUtLS0tLQo=";

fn kubeconfig(server: &str, cluster_extra: &str, user: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\nclusters:\n- name: k\n  cluster:\n    server: {server}\n    certificate-authority-data: {CA_DATA}\n{cluster_extra}contexts:\n- name: c\n  context:\n    cluster: k\n    user: u\nusers:\n- name: u\n  user:\n{user}"
    )
}

/// Bad kubeconfigs are refused before anything is stored or any request leaves, each with a
/// message naming the field; credentials are never echoed back.
#[tokio::test]
async fn bad_kubeconfigs_are_refused_naming_the_field_with_nothing_stored() {
    let api = Api::start().await;
    let token = "    token: sekret-token-value\n";
    let cases: Vec<(&str, String, &str)> = vec![
        (
            "insecure",
            kubeconfig(
                "https://127.0.0.1:6443",
                "    insecure-skip-tls-verify: true\n",
                token,
            ),
            "insecure-skip-tls-verify",
        ),
        (
            "plain http",
            kubeconfig("http://127.0.0.1:6443", "", token),
            "server",
        ),
        (
            "credentials in the URL",
            kubeconfig("https://admin:pw@127.0.0.1:6443", "", token),
            "server",
        ),
        (
            "exec plugin",
            kubeconfig(
                "https://127.0.0.1:6443",
                "",
                "    exec:\n      apiVersion: client.authentication.k8s.io/v1\n      command: /bin/true\n",
            ),
            "exec",
        ),
        (
            "no credentials",
            kubeconfig("https://127.0.0.1:6443", "", "    {}\n"),
            "user",
        ),
        (
            "missing context",
            kubeconfig("https://127.0.0.1:6443", "", token)
                .replace("current-context: c", "current-context: nope"),
            "nope",
        ),
    ];
    for (what, text, field) in cases {
        let got = api
            .admin(
                "POST",
                "/clusters",
                Some(json!({"name": "c1", "kubeconfig": text, "settings": {"gatewayImage": "r/x@sha256:1111111111111111111111111111111111111111111111111111111111111111"}})),
            )
            .await;
        assert_eq!(got, Err((400, "KUBECONFIG_INVALID".into())), "{what}");
        // The message names the field (read it through a raw client call).
        let c = api.client(Some(&api.admin));
        let body = json!({"name": "c1", "kubeconfig": text, "settings": {}});
        let err = tokio::task::spawn_blocking(move || c.request("POST", "/clusters", Some(&body)))
            .await
            .unwrap()
            .unwrap_err();
        let message = err.to_string();
        assert!(message.contains(field), "{what}: {message}");
        assert!(!message.contains("sekret-token-value"), "{what}: {message}");
    }
    // Settings are checked too: an image not pinned by digest.
    let got = api
        .admin(
            "POST",
            "/clusters",
            Some(json!({"name": "c1", "kubeconfig": kubeconfig("https://127.0.0.1:6443", "", token), "settings": {"gatewayImage": "repo/openclaw:latest"}})),
        )
        .await;
    assert_eq!(got, Err((400, "CLUSTER_SETTINGS_INVALID".into())));
    assert!(api.store.clusters().await.unwrap().is_empty());
    assert_eq!(api.backend.calls(), 0, "nothing was sent to any cluster");
}

/// Issue 27: a cluster's probe is stored and shown in a cluster's words (`serverVersion`,
/// `caFingerprint`, `warnings`, `gatewayPort`), never hostd's (`systemdVersion`, `hostKey`,
/// `hostdVersion`), on registration and on an update; a cluster stored with hostd's shape
/// before is shown in cluster words too.
#[tokio::test]
async fn a_clusters_probe_is_shown_in_cluster_words() {
    const HOST_WORDS: [&str; 6] = [
        "systemdVersion",
        "hostKey",
        "hostdVersion",
        "systemHostName",
        "missingTools",
        "portRange",
    ];
    let api = Api::start().await;
    let added = api
        .admin(
            "POST",
            "/clusters",
            Some(json!({"name": "c1", "kubeconfig": kubeconfig("https://127.0.0.1:6443", "", "    token: t0k3n\n"),
                        "settings": {"gatewayImage": "r/x@sha256:1111111111111111111111111111111111111111111111111111111111111111"}})),
        )
        .await
        .unwrap();
    // An update (PUT) probes again and stores that probe in a cluster's words too.
    let updated = api
        .admin(
            "PUT",
            "/clusters/c1",
            Some(json!({"settings": {"gatewayImage": "r/x@sha256:2222222222222222222222222222222222222222222222222222222222222222"}})),
        )
        .await
        .unwrap();
    let stored = api.store.cluster("c1").await.unwrap().unwrap();
    // As stored, not only as shown: the row itself holds a cluster's words.
    let stored = json!({"lastProbe": stored.cluster.last_probe});
    let shown = api.admin("GET", "/clusters/c1", None).await.unwrap();
    let listed = api.admin("GET", "/clusters", None).await.unwrap();
    for v in [&added, &updated, &stored, &shown, &listed[0]] {
        let probe = &v["lastProbe"];
        assert!(probe.is_object(), "{v}");
        for word in HOST_WORDS {
            assert!(probe.get(word).is_none(), "{word} in {v}");
        }
        for word in ["serverVersion", "caFingerprint", "warnings", "gatewayPort"] {
            assert!(probe.get(word).is_some(), "no {word} in {v}");
        }
    }
    // A row stored before, in hostd's shape: shown in a cluster's words.
    api.store
        .insert_cluster(&coordinator::model::ClusterRecord {
            cluster: coordinator::model::Cluster {
                name: "old".into(),
                server: "https://127.0.0.1:6443".into(),
                settings: json!({"gatewayImage": "r/x@sha256:1111111111111111111111111111111111111111111111111111111111111111"}),
                created_at: 0,
                last_probe: Some(json!({"op": "probe", "hostdVersion": "clawfleet-kube 0.1.0",
                    "protocolVersions": [1, 2], "systemHostName": "old",
                    "hostKey": "SHA256:AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA",
                    "systemdVersion": "kubernetes v1.34.3 (warning KUBERNETES_VERSION_BELOW_MINIMUM: the API server runs v1.34.3 (1.34); clawfleet is tested on 1.35 and later)",
                    "missingTools": [], "portRange": {"start": 18789, "end": 18789},
                    "maxAgents": 20, "agents": 3})),
            },
            credentials: json!({"auth": {"kind": "token", "token": "sekret-token-value"}}),
        })
        .await
        .unwrap();
    let old = api.admin("GET", "/clusters/old", None).await.unwrap();
    let probe = &old["lastProbe"];
    for word in HOST_WORDS {
        assert!(probe.get(word).is_none(), "{word} in {old}");
    }
    assert_eq!(probe["serverVersion"], "v1.34.3", "{old}");
    assert_eq!(
        probe["caFingerprint"],
        "SHA256:AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"
    );
    assert_eq!(
        probe["warnings"][0]["code"],
        "KUBERNETES_VERSION_BELOW_MINIMUM"
    );
    assert_eq!(
        (probe["gatewayPort"].as_u64(), probe["agents"].as_u64()),
        (Some(18789), Some(3))
    );
}

/// A registered cluster is shown without its credentials, holds Namespaces, and cannot be
/// forgotten while one uses it (409 CLUSTER_IN_USE); once free it can.
#[tokio::test]
async fn clusters_hide_credentials_and_refuse_removal_while_used() {
    let api = Api::start().await;
    api.store
        .insert_cluster(&coordinator::model::ClusterRecord {
            cluster: coordinator::model::Cluster {
                name: "c1".into(),
                server: "https://127.0.0.1:6443".into(),
                settings: json!({"gatewayImage": "r/x@sha256:1111111111111111111111111111111111111111111111111111111111111111"}),
                created_at: 0,
                last_probe: None,
            },
            credentials: json!({"auth": {"kind": "token", "token": "sekret-token-value"}}),
        }).await
        .unwrap();
    for path in ["/clusters", "/clusters/c1"] {
        let v = api.admin("GET", path, None).await.unwrap();
        assert!(!v.to_string().contains("sekret"), "{path}: {v}");
        assert!(v.to_string().contains("127.0.0.1:6443"), "{path}: {v}");
    }
    let ns = api
        .admin(
            "POST",
            "/namespaces",
            Some(json!({"id": "k1", "cluster": "c1"})),
        )
        .await
        .unwrap();
    assert_eq!(ns["cluster"], "c1");
    assert_eq!(ns["hosts"], json!([]));
    // Both kinds at once is refused; an unknown cluster too.
    assert_eq!(
        api.admin(
            "POST",
            "/namespaces",
            Some(json!({"id": "k2", "cluster": "c1", "hosts": ["h1"]})),
        )
        .await,
        Err((400, "BACKEND_AMBIGUOUS".into()))
    );
    assert_eq!(
        api.admin(
            "POST",
            "/namespaces",
            Some(json!({"id": "k3", "cluster": "nope"})),
        )
        .await,
        Err((400, "UNKNOWN_CLUSTER".into()))
    );
    assert_eq!(
        api.admin("DELETE", "/clusters/c1", None).await,
        Err((409, "CLUSTER_IN_USE".into()))
    );
    api.settle().await;
    api.admin("DELETE", "/namespaces/k1", None).await.unwrap();
    api.settle().await;
    assert_eq!(
        api.admin("DELETE", "/clusters/c1", None).await.unwrap(),
        Value::Null
    );
    assert_eq!(
        api.admin("GET", "/clusters/c1", None).await,
        Err((404, "NOT_FOUND".into()))
    );
}

/// Every list route answers bounded pages: a list longer than the largest page comes in
/// pages that together hold each item once, in order; a cursor or limit the API did not
/// issue is refused naming the parameter; `occ` fetches every page.
#[tokio::test]
async fn lists_come_in_bounded_pages_continued_by_a_cursor() {
    use coordinator::service::page::{DEFAULT_PAGE, MAX_PAGE};
    use coordinator::service::{NewAgent, NewHost, NewNamespace};
    let api = Api::start().await;
    let svc = Service::new(api.store.clone());
    svc.enrol_host(
        "test",
        NewHost {
            name: "h1".into(),
            address: "127.0.0.1".into(),
            port: 22,
            host_key: HOST_KEY.into(),
            max_agents: 100,
            login_user: None,
            jump: None,
        },
    )
    .await
    .unwrap();
    svc.create_namespace(
        "test",
        NewNamespace {
            id: "ns1".into(),
            name: None,
            hosts: vec!["h1".into()],
            cluster: None,
            single_tenant: false,
        },
        true,
    )
    .await
    .unwrap();
    svc.put_configuration("test", "ns1", "cfg", json!({}), true)
        .await
        .unwrap();
    let total = MAX_PAGE as usize + 5;
    for i in 0..total {
        svc.create_agent(
            "test",
            "ns1",
            NewAgent {
                id: format!("a{i:05}"),
                service_principal_id: None,
                configuration_id: "cfg".into(),
                harness_auth: None,
                restore: None,
                workspace_files: Vec::new(),
                egress: None,
            },
        )
        .await
        .unwrap();
    }
    let c = api.client(Some(&api.admin));
    let get = move |path: String| {
        let c = c.clone();
        async move {
            tokio::task::spawn_blocking(move || c.get_page(&path))
                .await
                .unwrap()
        }
    };
    // Without a limit: the default page, and a cursor.
    let (page, next) = get("/namespaces/ns1/agents".into()).await.unwrap();
    assert_eq!(page.as_array().unwrap().len(), DEFAULT_PAGE as usize);
    assert!(next.is_some());
    // The largest page, then the rest.
    let (first, next) = get(format!("/namespaces/ns1/agents?limit={MAX_PAGE}"))
        .await
        .unwrap();
    let first = first.as_array().unwrap().clone();
    assert_eq!(first.len(), MAX_PAGE as usize);
    let next = next.expect("more Agents follow");
    let (rest, after) = get(format!(
        "/namespaces/ns1/agents?limit={MAX_PAGE}&cursor={next}"
    ))
    .await
    .unwrap();
    assert_eq!(after, None, "the last page has no cursor");
    let ids: Vec<String> = first
        .iter()
        .chain(rest.as_array().unwrap())
        .map(|a| a["id"].as_str().unwrap().to_owned())
        .collect();
    let expected: Vec<String> = (0..total).map(|i| format!("a{i:05}")).collect();
    assert_eq!(ids, expected);
    // A limit beyond the largest page, and cursors the API did not issue, or issued for
    // another list, are refused naming the parameter.
    let refused = |r: Result<(Value, Option<String>), ClientError>| match r {
        Err(ClientError::Api {
            status,
            code,
            message,
        }) => (status, code, message),
        other => panic!("expected a refusal, got {other:?}"),
    };
    let (status, code, message) =
        refused(get(format!("/namespaces/ns1/agents?limit={}", MAX_PAGE + 1)).await);
    assert_eq!((status, code.as_str()), (400, "INVALID_QUERY"));
    assert!(message.starts_with("limit: "), "{message}");
    let (_, hosts_next) = get("/hosts?limit=1".into()).await.unwrap();
    assert_eq!(hosts_next, None, "one host fits a page of one");
    for bad in ["zz", "not-a-cursor", "6167656e7473"] {
        let (status, code, message) =
            refused(get(format!("/namespaces/ns1/agents?cursor={bad}")).await);
        assert_eq!((status, code.as_str()), (400, "INVALID_QUERY"), "{bad}");
        assert!(message.starts_with("cursor: "), "{message}");
    }
    let (status, _, message) = refused(get(format!("/hosts?cursor={next}")).await);
    assert_eq!(status, 400);
    assert!(
        message.starts_with("cursor: "),
        "an Agents cursor for hosts: {message}"
    );
    // occ's client reads every page.
    let c = api.client(Some(&api.admin));
    let all =
        tokio::task::spawn_blocking(move || all_pages(Some(300), |q| c.list_agents(["ns1"], q)))
            .await
            .unwrap()
            .unwrap();
    let ids: Vec<String> = all.iter().map(|a| a.id.to_string()).collect();
    assert_eq!(ids, expected);
    // Revisions page by number, namespaces by id.
    for _ in 0..3 {
        svc.deploy("test", "ns1", "a00000").await.unwrap();
    }
    let c = api.client(Some(&api.admin));
    let revs = tokio::task::spawn_blocking(move || {
        all_pages(Some(2), |q| c.list_revisions(["ns1", "a00000"], q))
    })
    .await
    .unwrap()
    .unwrap();
    let numbers: Vec<u64> = revs.iter().map(|r| r.number).collect();
    assert_eq!(numbers, vec![1, 2, 3]);
}
