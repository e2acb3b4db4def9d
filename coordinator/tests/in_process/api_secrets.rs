//! Secrets over the HTTP API on loopback, with hostd's engine in process behind it: values are
//! write-only and versioned, checked per the contract with nothing stored on error, bound into
//! revisions by name (a missing secret refused naming the field), refused for deletion while
//! bound, invisible to other Namespaces' tokens, rotated by new revisions, redacted by value,
//! and, the leak test, found nowhere: not in the SQLite database's files, the coordinator's log
//! output, the audit table, nor any API answer.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::api_support::{self, Served};
use crate::hostd_engine;

use std::io::Write;
use std::sync::{Arc, Mutex};

use clawfleet_protocol::SecretFingerprint;
use coordinator::client::{Client, ClientError};
use coordinator::config::ApiSettings;
use coordinator::store::SharedStore;
use coordinator::store::seal::Sealer;
use coordinator::store::sqlite::SqliteStore;
use hostd_engine::EngineBackend;
use serde_json::{Value, json};

use crate::fixtures::HOST_KEY;

/// Everything the coordinator logs, at every level.
#[derive(Clone, Default)]
struct Logs(Arc<Mutex<Vec<u8>>>);

impl Write for Logs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The API and a worker on in-process hosts ([`Served`]), and every answer it gave.
struct Api {
    served: Served<EngineBackend>,
    /// Every answer body the API gave, for the leak check.
    answers: Mutex<String>,
}

impl std::ops::Deref for Api {
    type Target = Served<EngineBackend>;
    fn deref(&self) -> &Served<EngineBackend> {
        &self.served
    }
}

impl Api {
    async fn start(store: SharedStore) -> Self {
        let admin = api_support::admin_token(&store).await;
        let backend = Arc::new(EngineBackend::new());
        Self {
            served: Served::start(store, admin, backend, ApiSettings::default()).await,
            answers: Mutex::new(String::new()),
        }
    }

    /// `Err((status, code, message))` for an API refusal.
    async fn call(
        &self,
        token: &str,
        method: &str,
        path: &str,
        body: Option<Value>,
    ) -> Result<Value, (u16, String, String)> {
        let c = Client::new(&self.server, Some(token.to_owned())).unwrap();
        let (method, path) = (method.to_owned(), path.to_owned());
        let got = tokio::task::spawn_blocking(move || c.request(&method, &path, body.as_ref()))
            .await
            .unwrap();
        let mut answers = self.answers.lock().unwrap();
        match got {
            Ok(v) => {
                answers.push_str(&v.to_string());
                Ok(v)
            }
            Err(ClientError::Api {
                status,
                code,
                message,
            }) => {
                answers.push_str(&message);
                Err((status, code, message))
            }
            Err(other) => panic!("{other}"),
        }
    }

    async fn admin(
        &self,
        method: &str,
        path: &str,
        body: Option<Value>,
    ) -> Result<Value, (u16, String, String)> {
        let admin = self.admin.clone();
        self.call(&admin, method, path, body).await
    }

    async fn token(&self, ns: &str, role: &str) -> String {
        let t = self
            .admin(
                "POST",
                "/tokens",
                Some(json!({"name": "t", "grants": [{"namespace": ns, "role": role}]})),
            )
            .await
            .unwrap();
        t["token"].as_str().unwrap().to_owned()
    }
}

fn code(e: (u16, String, String)) -> (u16, String) {
    (e.0, e.1)
}

/// Every file under `dir` holding `needle`.
fn files_holding(dir: &std::path::Path, needle: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_owned()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if let Ok(bytes) = std::fs::read(&p)
                && bytes.windows(needle.len()).any(|w| w == needle.as_bytes())
            {
                found.push(p.display().to_string());
            }
        }
    }
    found
}

#[tokio::test]
async fn secrets_are_write_only_bound_by_name_and_leak_nowhere() {
    let logs = Logs::default();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_writer({
            let logs = logs.clone();
            move || logs.clone()
        })
        .with_ansi(false)
        .finish();
    // A current-thread runtime: the server, the worker and the test share this thread.
    let _logging = tracing::subscriber::set_default(subscriber);
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("occ.db");
    let store: SharedStore =
        Arc::new(SqliteStore::open_sealed(&db, Arc::new(Sealer::ephemeral())).unwrap());
    let api = Api::start(store.clone()).await;
    let unique = format!("{:x}", std::process::id() as u64 * 7919 + 0x5ec2e7);
    let v1 = format!("xoxb-LEAKCHECK-one-{unique}");
    let v2 = format!("xoxb-LEAKCHECK-two-{unique}");

    api.admin(
        "POST",
        "/hosts",
        Some(json!({"name": "h1", "address": "127.0.0.1", "hostKey": HOST_KEY})),
    )
    .await
    .unwrap();
    // Two Namespaces share h1: it stands for a host with per-Agent quotas.
    hostd_engine::with_enforced_quotas(&api.store, "h1").await;
    for ns in ["ns1", "ns2"] {
        api.admin(
            "POST",
            "/namespaces",
            Some(json!({"id": ns, "hosts": ["h1"]})),
        )
        .await
        .unwrap();
    }
    api.settle().await;
    let reader = api.token("ns1", "read").await;
    let deployer = api.token("ns1", "deploy").await;
    let other = api.token("ns2", "admin").await;

    // Values and names are checked per the contract, naming the field; nothing is stored.
    for (body, want) in [
        (
            json!({"name": "slack-bot", "value": ""}),
            "INVALID_SECRET_VALUE",
        ),
        (
            json!({"name": "slack-bot", "value": "abc\n"}),
            "INVALID_SECRET_VALUE",
        ),
        (
            json!({"name": "slack-bot", "value": "a\u{0}b"}),
            "INVALID_SECRET_VALUE",
        ),
        (
            json!({"name": "slack-bot", "value": "a".repeat(64 * 1024 + 1)}),
            "INVALID_SECRET_VALUE",
        ),
        (
            json!({"name": "Slack_Bot", "value": v1}),
            "INVALID_SECRET_NAME",
        ),
        (
            json!({"name": "x".repeat(49), "value": v1}),
            "INVALID_SECRET_NAME",
        ),
        (json!({"name": "slack-bot"}), "INVALID_BODY"),
        (
            json!({"name": "slack-bot", "value": v1, "extra": 1}),
            "INVALID_BODY",
        ),
    ] {
        let e = api
            .call(
                &deployer,
                "POST",
                "/namespaces/ns1/secrets",
                Some(body.clone()),
            )
            .await
            .unwrap_err();
        assert_eq!((e.0, e.1.as_str()), (400, want), "{body}: {}", e.2);
        if want == "INVALID_SECRET_VALUE" {
            assert!(
                e.2.starts_with("value "),
                "the message names the field: {}",
                e.2
            );
        }
    }
    assert_eq!(api.store.secrets("ns1").await.unwrap(), vec![]);
    // A read-role token cannot write; another Namespace's token cannot read or write.
    assert_eq!(
        code(
            api.call(
                &reader,
                "POST",
                "/namespaces/ns1/secrets",
                Some(json!({"name": "slack-bot", "value": v1}))
            )
            .await
            .unwrap_err()
        ),
        (403, "FORBIDDEN".into())
    );

    // Version 1: the answer is its metadata only.
    let set = api
        .call(
            &deployer,
            "POST",
            "/namespaces/ns1/secrets",
            Some(json!({"name": "slack-bot", "value": v1})),
        )
        .await
        .unwrap();
    assert_eq!(set["version"], 1);
    assert_eq!(
        set["fingerprint"],
        SecretFingerprint::of(v1.as_bytes()).as_str()
    );
    assert!(
        set["writtenBy"].as_str().is_some_and(|w| !w.is_empty()),
        "{set}"
    );
    assert!(set.get("value").is_none(), "{set}");
    for (token, path) in [
        (&other, "/namespaces/ns1/secrets"),
        (&other, "/namespaces/ns1/secrets/slack-bot"),
    ] {
        assert_eq!(
            code(api.call(token, "GET", path, None).await.unwrap_err()),
            (403, "FORBIDDEN".into()),
            "{path}"
        );
    }

    // Binding: an unknown secret is refused naming the JSON path; a known one binds.
    let missing = api
        .admin(
            "POST",
            "/namespaces/ns1/configurations",
            Some(json!({"id": "cfg", "document": {"channels": {"slack": {"botToken": {"source": "file", "provider": "clawfleet", "id": "nope"}}}}})),
        )
        .await
        .unwrap_err();
    assert_eq!((missing.0, missing.1.as_str()), (400, "UNKNOWN_SECRET"));
    assert!(
        missing.2.contains("channels.slack.botToken") && missing.2.contains("nope"),
        "{}",
        missing.2
    );
    // Another Namespace cannot bind ns1's secret: it binds its own Namespace's only.
    let foreign = api
        .call(
            &other,
            "POST",
            "/namespaces/ns2/configurations",
            Some(json!({"id": "cfg", "document": {"channels": {"slack": {"botToken": {"source": "file", "provider": "clawfleet", "id": "slack-bot"}}}}})),
        )
        .await
        .unwrap_err();
    assert_eq!(
        (foreign.0, foreign.1.as_str()),
        (400, "UNKNOWN_SECRET"),
        "{}",
        foreign.2
    );
    // Literal credentials and other providers stay refused.
    for doc in [
        json!({"channels": {"slack": {"botToken": v1}}}),
        json!({"secrets": {"providers": {"clawfleet-slack-bot": {"source": "file", "path": "/tmp/x", "mode": "singleValue"}}}}),
    ] {
        let e = api
            .admin(
                "POST",
                "/namespaces/ns1/configurations",
                Some(json!({"id": "bad", "document": doc})),
            )
            .await
            .unwrap_err();
        assert_eq!(e.1, "CONFIGURATION_REFUSED", "{}", e.2);
    }
    api.admin(
        "POST",
        "/namespaces/ns1/configurations",
        Some(json!({"id": "cfg", "document": {"channels": {"slack": {"botToken": {"source": "file", "provider": "clawfleet", "id": "slack-bot"}}}}})),
    )
    .await
    .unwrap();
    for a in ["a1", "a2"] {
        api.admin(
            "POST",
            "/namespaces/ns1/agents",
            Some(json!({"id": a, "configurationId": "cfg"})),
        )
        .await
        .unwrap();
        api.admin("POST", &format!("/namespaces/ns1/agents/{a}/deploy"), None)
            .await
            .unwrap();
    }
    api.settle().await;
    let revs = api
        .admin("GET", "/namespaces/ns1/agents/a1/revisions", None)
        .await
        .unwrap();
    let first = &revs.as_array().unwrap()[0];
    assert_eq!(
        first["secrets"],
        json!([{"name": "slack-bot", "version": 1, "fingerprint": set["fingerprint"]}]),
        "{first}"
    );
    let stored = api
        .store
        .revision("ns1", "a1", first["id"].as_str().unwrap())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        stored.rendered["channels"]["slack"]["botToken"],
        json!({"source": "file", "provider": "clawfleet-slack-bot", "id": "value"})
    );
    assert_eq!(
        stored.rendered["secrets"]["providers"],
        json!({"clawfleet-slack-bot": {"source": "file", "path": "/run/clawfleet/secrets/slack-bot", "mode": "singleValue"}})
    );
    // A read-role token sees which Agents use which version: metadata only.
    let listed = api
        .call(&reader, "GET", "/namespaces/ns1/secrets", None)
        .await
        .unwrap();
    let users: Vec<(String, u64)> = listed[0]["usedBy"]
        .as_array()
        .unwrap()
        .iter()
        .map(|u| {
            (
                u["agentId"].as_str().unwrap().to_owned(),
                u["version"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(users, vec![("a1".into(), 1), ("a2".into(), 1)], "{listed}");
    // Deleting a bound secret is refused, naming the Agents.
    let refused = api
        .call(
            &deployer,
            "DELETE",
            "/namespaces/ns1/secrets/slack-bot",
            None,
        )
        .await
        .unwrap_err();
    assert_eq!((refused.0, refused.1.as_str()), (409, "SECRET_IN_USE"));
    assert!(
        refused.2.contains("a1") && refused.2.contains("a2"),
        "{}",
        refused.2
    );

    // Rotation: version 2, then new revisions of both Agents that differ in their versions.
    let set2 = api
        .call(
            &deployer,
            "POST",
            "/namespaces/ns1/secrets",
            Some(json!({"name": "slack-bot", "value": v2})),
        )
        .await
        .unwrap();
    assert_eq!(set2["version"], 2);
    let started = api
        .call(
            &deployer,
            "POST",
            "/namespaces/ns1/secrets/slack-bot/deploy",
            None,
        )
        .await
        .unwrap();
    let agents: Vec<&str> = started
        .as_array()
        .unwrap()
        .iter()
        .map(|d| {
            assert!(d["revisionId"].is_string(), "{d}");
            d["agentId"].as_str().unwrap()
        })
        .collect();
    assert_eq!(agents, vec!["a1", "a2"]);
    api.settle().await;
    let got = api
        .call(&reader, "GET", "/namespaces/ns1/secrets/slack-bot", None)
        .await
        .unwrap();
    assert_eq!(got["version"], 2);
    assert_eq!(got["versions"].as_array().unwrap().len(), 2);
    assert!(
        got["usedBy"]
            .as_array()
            .unwrap()
            .iter()
            .all(|u| u["version"] == 2),
        "{got}"
    );
    let again = api
        .call(
            &deployer,
            "POST",
            "/namespaces/ns1/secrets/slack-bot/deploy",
            None,
        )
        .await
        .unwrap();
    assert_eq!(again, json!([]), "nothing left to roll out");

    // Redaction by construction: the Agent's bound values, every version, are the literal
    // terms its log and failure evidence are redacted with.
    let terms = coordinator::service::secret_redaction_terms(&*api.store, "ns1", "a1")
        .await
        .unwrap();
    assert_eq!(terms, vec![v1.clone(), v2.clone()]);
    let evidence = coordinator::service::runtime_failure(
        clawfleet_protocol::FailureCode::ReadinessTimeout.into(),
        &format!("gateway said: token {v2} rejected (old {v1})"),
        None,
        terms,
    );
    let text = serde_json::to_string(&evidence).unwrap();
    assert!(!text.contains(&v1) && !text.contains(&v2), "{text}");

    // The leak check, before and after a delete.
    let audit = api.admin("GET", "/audit?limit=1000", None).await.unwrap();
    let actions: Vec<&str> = audit
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["action"].as_str())
        .filter(|a| a.starts_with("secret."))
        .collect();
    assert_eq!(actions.len(), 2, "{actions:?}");
    // Unbind, then delete.
    api.admin(
        "PUT",
        "/namespaces/ns1/configurations/cfg",
        Some(json!({"document": {}})),
    )
    .await
    .unwrap();
    for a in ["a1", "a2"] {
        api.admin("POST", &format!("/namespaces/ns1/agents/{a}/deploy"), None)
            .await
            .unwrap();
    }
    api.settle().await;
    api.call(
        &deployer,
        "DELETE",
        "/namespaces/ns1/secrets/slack-bot",
        None,
    )
    .await
    .unwrap();
    assert_eq!(
        code(
            api.call(&reader, "GET", "/namespaces/ns1/secrets/slack-bot", None)
                .await
                .unwrap_err()
        ),
        (404, "NOT_FOUND".into())
    );
    let audit_rows = api
        .store
        .audit_events(10_000)
        .await
        .unwrap()
        .iter()
        .map(|e| format!("{} {} {} {}", e.actor, e.action, e.target, e.detail))
        .collect::<Vec<_>>()
        .join("\n");
    assert!(audit_rows.contains("secret.delete"), "{audit_rows}");
    let answers = api.answers.lock().unwrap().clone();
    let logged = String::from_utf8_lossy(&logs.0.lock().unwrap()).into_owned();
    assert!(!logged.is_empty(), "the capture sees the coordinator's log");
    for value in [&v1, &v2] {
        assert!(
            !answers.contains(value.as_str()),
            "an API answer holds {value}"
        );
        assert!(!logged.contains(value.as_str()), "the log holds {value}");
        assert!(
            !audit_rows.contains(value.as_str()),
            "the audit table holds {value}"
        );
        assert_eq!(files_holding(dir.path(), value), Vec::<String>::new());
    }
    drop(api);
    for value in [&v1, &v2] {
        assert_eq!(files_holding(dir.path(), value), Vec::<String>::new());
    }
}
