//! The configuration refusals the design promises, over real HTTP on loopback with the fake
//! backend: a native configuration that selects another harness, a sandbox, plugins, secret
//! providers, another refused section or an unknown one is answered 400 CONFIGURATION_REFUSED
//! naming the field's path, at create, at update and at deploy time, and nothing is stored (no
//! configuration generation, no revision, no work, nothing on the host). Unsupported harness
//! authentication methods get HARNESS_AUTH_UNSUPPORTED whatever their other fields.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::api_support::{self, Served};
use crate::hostd_engine;

use std::sync::Arc;

use coordinator::client::{Client, ClientError};
use coordinator::config::ApiSettings;
use hostd_engine::EngineBackend;
use serde_json::{Value, json};

use crate::fixtures::HOST_KEY;

/// An API error as the client sees it.
#[derive(Debug)]
struct Refused {
    status: u16,
    code: String,
    message: String,
}

/// The API and a worker on in-process hosts ([`Served`]).
struct Api(Served<EngineBackend>);

impl std::ops::Deref for Api {
    type Target = Served<EngineBackend>;
    fn deref(&self) -> &Served<EngineBackend> {
        &self.0
    }
}

impl Api {
    /// The API server on loopback, with a host `h1`, a Namespace `ns1` on it (ensured on the
    /// fake host), an accepted configuration `base` and an Agent `a1` using it.
    async fn start() -> Self {
        let (store, admin) = api_support::store_with_admin().await;
        let backend = Arc::new(EngineBackend::new());
        let api = Self(Served::start(store, admin, backend, ApiSettings::default()).await);
        api.ok(
            "POST",
            "/hosts",
            json!({"name": "h1", "address": "127.0.0.1", "hostKey": HOST_KEY}),
        )
        .await;
        api.ok("POST", "/namespaces", json!({"id": "ns1", "hosts": ["h1"]}))
            .await;
        api.ok(
            "POST",
            "/namespaces/ns1/configurations",
            json!({"id": "base", "document": {"logging": {"level": "info"}}}),
        )
        .await;
        api.ok(
            "POST",
            "/namespaces/ns1/agents",
            json!({"id": "a1", "configurationId": "base"}),
        )
        .await;
        api.settle().await;
        api
    }

    async fn call(&self, method: &str, path: &str, body: Option<Value>) -> Result<Value, Refused> {
        let c = Client::new(&self.server, Some(self.admin.clone())).unwrap();
        let method = method.to_owned();
        let path = path.to_owned();
        tokio::task::spawn_blocking(move || c.request(&method, &path, body.as_ref()))
            .await
            .unwrap()
            .map_err(|e| match e {
                ClientError::Api {
                    status,
                    code,
                    message,
                } => Refused {
                    status,
                    code,
                    message,
                },
                other => panic!("{other}"),
            })
    }

    async fn ok(&self, method: &str, path: &str, body: Value) -> Value {
        let body = if body.is_null() { None } else { Some(body) };
        match self.call(method, path, body).await {
            Ok(v) => v,
            Err(e) => panic!("{method} {path}: {e:?}"),
        }
    }

    async fn get(&self, path: &str) -> Result<Value, Refused> {
        self.call("GET", path, None).await
    }

    /// What a client can see of `base`, of `a1` and of the host, to prove a refused request
    /// changed nothing.
    async fn observe(&self) -> Value {
        self.settle().await;
        json!({
            "base": self.get("/namespaces/ns1/configurations/base").await.unwrap(),
            "agents": self.get("/namespaces/ns1/agents").await.unwrap(),
            "revisions": self.get("/namespaces/ns1/agents/a1/revisions").await.unwrap(),
            "status": self.get("/namespaces/ns1/agents/a1/deployment-status").await.unwrap(),
            "hostCalls": self.backend.calls(),
            "hostAgents": format!("{:?}", self.backend.all_agents()),
        })
    }
}

/// A 400 CONFIGURATION_REFUSED whose message names `path`.
fn assert_refused(e: &Refused, path: &str, document: &Value) {
    assert_eq!(
        (e.status, e.code.as_str()),
        (400, "CONFIGURATION_REFUSED"),
        "{document}: {}",
        e.message
    );
    assert!(
        e.message.contains(path),
        "{document}: {:?} does not name {path}",
        e.message
    );
}

/// Each refused document and the path its refusal names.
fn refused_documents() -> Vec<(Value, &'static str)> {
    vec![
        (
            json!({"agents": {"defaults": {"agentRuntime": {"id": "codex"}}}}),
            "agents.defaults.agentRuntime.id",
        ),
        (
            json!({"agents": {"defaults": {"models": {"openai/gpt-5.5": {"agentRuntime": {"id": "codex"}}}}}}),
            "agents.defaults.models[\"openai/gpt-5.5\"].agentRuntime.id",
        ),
        (
            json!({"models": {"providers": {"openai": {"agentRuntime": {"id": "claude-cli"}}}}}),
            "models.providers.openai.agentRuntime.id",
        ),
        (
            json!({"agents": {"defaults": {"sandbox": {"mode": "all"}}}}),
            "agents.defaults.sandbox",
        ),
        (
            json!({"plugins": {"entries": {"codex": {"enabled": true}}}}),
            "plugins.entries",
        ),
        (
            json!({"plugins": {"load": {"paths": ["/opt/plugins"]}}}),
            "plugins.load",
        ),
        (
            json!({"secrets": {"providers": {"vault": {"source": "exec", "command": "/usr/bin/vault-read"}}}}),
            "secrets.providers.vault",
        ),
        (
            json!({"secrets": {"providers": {"keys": {"source": "file", "path": "/etc/keys.json"}}}}),
            "secrets.providers.keys",
        ),
        (json!({"acp": {"enabled": true}}), "acp.enabled"),
        (json!({"surprise": {}}), "surprise"),
    ]
}

#[tokio::test]
async fn refused_configurations_are_answered_with_the_code_and_path_and_nothing_is_stored() {
    let api = Api::start().await;
    let before = api.observe().await;
    for (document, path) in refused_documents() {
        // At create time.
        let e = api
            .call(
                "POST",
                "/namespaces/ns1/configurations",
                Some(json!({"id": "refused", "document": document})),
            )
            .await
            .expect_err(&format!("created {document}"));
        assert_refused(&e, path, &document);
        let absent = api
            .get("/namespaces/ns1/configurations/refused")
            .await
            .expect_err("a refused configuration was stored");
        assert_eq!((absent.status, absent.code.as_str()), (404, "NOT_FOUND"));

        // At update time: no new generation of `base`.
        let e = api
            .call(
                "PUT",
                "/namespaces/ns1/configurations/base",
                Some(json!({"document": document})),
            )
            .await
            .expect_err(&format!("updated to {document}"));
        assert_refused(&e, path, &document);
        assert_eq!(api.observe().await, before, "{document} changed something");
    }
    let base = api
        .get("/namespaces/ns1/configurations/base")
        .await
        .unwrap();
    assert_eq!(base["generation"], 1);
}

#[tokio::test]
async fn a_stored_configuration_that_is_now_refused_is_refused_at_deploy_with_no_revision_or_work()
{
    let api = Api::start().await;
    for (i, (document, path)) in refused_documents().into_iter().enumerate() {
        // As a coordinator from before these refusals would have stored it.
        let cfg = format!("legacy-{i}");
        api.store
            .put_configuration("ns1", &cfg, &document, true, 0)
            .await
            .unwrap()
            .unwrap();
        let agent = format!("old-{i}");
        api.ok(
            "POST",
            "/namespaces/ns1/agents",
            json!({"id": agent, "configurationId": cfg}),
        )
        .await;
        api.settle().await;
        let calls = api.backend.calls();
        let e = api
            .call(
                "POST",
                &format!("/namespaces/ns1/agents/{agent}/deploy"),
                None,
            )
            .await
            .expect_err(&format!("deployed {document}"));
        assert_refused(&e, path, &document);
        api.settle().await;
        let revisions = api
            .get(&format!("/namespaces/ns1/agents/{agent}/revisions"))
            .await
            .unwrap();
        assert_eq!(revisions, json!([]), "{document}");
        let status = api
            .get(&format!("/namespaces/ns1/agents/{agent}/deployment-status"))
            .await
            .unwrap();
        assert_eq!(status["openWork"], json!([]), "{document}");
        assert_eq!(status["activeRevisionId"], Value::Null, "{document}");
        assert_eq!(api.backend.calls(), calls, "{document} reached the host");
        assert!(api.backend.agent("h1", "ns1", &agent).is_none());
    }
}

#[tokio::test]
async fn unsupported_harness_auth_methods_are_refused_whatever_their_other_fields() {
    let api = Api::start().await;
    let before = api.observe().await;
    let cases = [
        json!({"method": "codex_pat", "source": {"kind": "service_account", "namespaceId": "ns1", "id": "sa-1"}}),
        json!({"method": "codex_pat"}),
        json!({"method": "managed", "secretRef": "x", "extra": 1}),
    ];
    for auth in cases {
        let e = api
            .call(
                "POST",
                "/namespaces/ns1/agents",
                Some(json!({"id": "a2", "configurationId": "base", "harnessAuth": auth})),
            )
            .await
            .expect_err(&format!("accepted {auth}"));
        assert_eq!(
            (e.status, e.code.as_str()),
            (400, "HARNESS_AUTH_UNSUPPORTED"),
            "{auth}"
        );
        assert!(e.message.contains("harnessAuth.method"), "{:?}", e.message);
        let absent = api
            .get("/namespaces/ns1/agents/a2")
            .await
            .expect_err("a refused Agent was stored");
        assert_eq!((absent.status, absent.code.as_str()), (404, "NOT_FOUND"));
        assert_eq!(api.observe().await, before, "{auth} changed something");
    }
    // The supported method still refuses unknown fields, as the body's other fields do.
    let e = api
        .call(
            "POST",
            "/namespaces/ns1/agents",
            Some(json!({"id": "a2", "configurationId": "base",
                        "harnessAuth": {"method": "runtime", "source": {}}})),
        )
        .await
        .expect_err("runtime with an unknown field");
    assert_eq!((e.status, e.code.as_str()), (400, "INVALID_BODY"));
    assert!(e.message.contains("source"), "{:?}", e.message);
    assert_eq!(api.observe().await, before);
    let a2 = api
        .ok(
            "POST",
            "/namespaces/ns1/agents",
            json!({"id": "a2", "configurationId": "base", "harnessAuth": {"method": "runtime"}}),
        )
        .await;
    assert_eq!(a2["id"], "a2");
}
