//! Request-shape tests over tower-test's mock service: field manager, force=false, the apply
//! content type, delete preconditions, label selectors, pagination, no write after a refused
//! ownership check, no in-place retry of a mutating request.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::pin::pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clawfleet_protocol::egress::Egress;
use clawfleet_protocol::failure::FailureCode;
use clawfleet_protocol::operation::{AgentRef, NamespaceArgs, NamespaceRef, PrepareArgs};
use clawfleet_protocol::operation::{Harness, HarnessId, HarnessMode, HarnessVersion};
use clawfleet_protocol::operation::{RevisionNumber, RevisionSpec};
use clawfleet_protocol::{Configuration, Ident, Operation};
use http::{Request, Response};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::client::Body;
use serde_json::{Value, json};

use crate::client::{ClusterClient, Requests};
use crate::names;
use crate::objects::Obj;
use crate::render;
use crate::settings::ClusterSettings;

#[derive(Debug, Clone)]
struct Seen {
    method: String,
    uri: String,
    content_type: Option<String>,
    body: Value,
}

type Handler = Box<dyn Fn(&Seen) -> (u16, Value) + Send + Sync>;

/// A client whose every request is recorded and answered by `handler`.
fn mock(handler: Handler) -> (Requests, Arc<Mutex<Vec<Seen>>>) {
    let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    tokio::spawn(async move {
        let mut handle = pin!(handle);
        while let Some((req, send)) = handle.next_request().await {
            let (parts, body) = req.into_parts();
            let bytes = body.collect_bytes().await.unwrap();
            let s = Seen {
                method: parts.method.to_string(),
                uri: parts.uri.to_string(),
                content_type: parts
                    .headers
                    .get(http::header::CONTENT_TYPE)
                    .map(|v| v.to_str().unwrap().to_owned()),
                body: serde_json::from_slice(&bytes).unwrap_or(Value::Null),
            };
            let (status, answer) = handler(&s);
            log.lock().unwrap().push(s);
            send.send_response(
                Response::builder()
                    .status(status)
                    .header("content-type", "application/json")
                    .body(Body::from(serde_json::to_vec(&answer).unwrap()))
                    .unwrap(),
            );
        }
    });
    let client = kube::Client::new(service, "default");
    (
        Requests {
            cc: ClusterClient::from_client(client),
            deadline: Instant::now() + Duration::from_secs(20),
        },
        seen,
    )
}

fn status(code: u16, reason: &str) -> (u16, Value) {
    (
        code,
        json!({ "kind": "Status", "apiVersion": "v1", "status": "Failure",
                "code": code, "reason": reason, "message": reason }),
    )
}

/// Echoes a written object back with server-set metadata.
fn echo(s: &Seen) -> (u16, Value) {
    let mut o = s.body.clone();
    o["metadata"]["uid"] = json!("uid-1");
    o["metadata"]["resourceVersion"] = json!("1");
    (200, o)
}

fn empty_list() -> Value {
    json!({ "kind": "List", "apiVersion": "v1", "metadata": {}, "items": [] })
}

fn id(s: &str) -> Ident {
    Ident::new(s).unwrap()
}

fn cm() -> ConfigMap {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": { "name": "x", "namespace": "oce-1" }, "data": { "k": "v" },
    }))
    .unwrap()
}

#[tokio::test]
async fn apply_uses_the_field_manager_without_force_and_the_apply_content_type() {
    let (r, seen) = mock(Box::new(echo));
    let api: Obj<ConfigMap> = Obj::namespaced(&r, "oce-1", "ConfigMap");
    api.apply(&r, "x", &cm()).await.unwrap();
    let s = seen.lock().unwrap()[0].clone();
    assert_eq!(s.method, "PATCH");
    assert!(
        s.uri.starts_with("/api/v1/namespaces/oce-1/configmaps/x?"),
        "{}",
        s.uri
    );
    assert!(s.uri.contains("fieldManager=clawfleet"), "{}", s.uri);
    assert!(!s.uri.contains("force=true"), "{}", s.uri);
    assert_eq!(
        s.content_type.as_deref(),
        Some("application/apply-patch+yaml")
    );
    assert_eq!(s.body["metadata"]["name"], "x");
}

#[tokio::test]
async fn an_apply_conflict_is_an_ownership_conflict() {
    let (r, _) = mock(Box::new(|_| status(409, "Conflict")));
    let api: Obj<ConfigMap> = Obj::namespaced(&r, "oce-1", "ConfigMap");
    let f = api.apply(&r, "x", &cm()).await.unwrap_err();
    assert_eq!(f.code, FailureCode::KubernetesOwnershipConflict);
}

#[tokio::test]
async fn deletes_carry_uid_and_resource_version_preconditions() {
    let (r, seen) = mock(Box::new(|_| {
        (
            200,
            json!({ "kind": "Status", "apiVersion": "v1", "status": "Success" }),
        )
    }));
    let api: Obj<ConfigMap> = Obj::namespaced(&r, "oce-1", "ConfigMap");
    let mut meta = cm().metadata;
    meta.uid = Some("uid-9".into());
    meta.resource_version = Some("42".into());
    assert!(api.delete(&r, "x", &meta, true).await.unwrap());
    assert!(api.delete(&r, "x", &meta, false).await.unwrap());
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen[0].method, "DELETE");
    assert_eq!(
        seen[0].body["preconditions"],
        json!({ "uid": "uid-9", "resourceVersion": "42" })
    );
    assert_eq!(seen[0].body["propagationPolicy"], "Background");
    assert_eq!(seen[1].body["preconditions"], json!({ "uid": "uid-9" }));
    // A precondition failure (the object changed) is retryable, not a success.
    let (r, _) = mock(Box::new(|_| status(409, "Conflict")));
    let api: Obj<ConfigMap> = Obj::namespaced(&r, "oce-1", "ConfigMap");
    let f = api.delete(&r, "x", &meta, true).await.unwrap_err();
    assert!(f.is_retryable(), "{f}");
    // Without a uid nothing is sent.
    let (r, seen) = mock(Box::new(echo));
    let api: Obj<ConfigMap> = Obj::namespaced(&r, "oce-1", "ConfigMap");
    assert!(api.delete(&r, "x", &cm().metadata, false).await.is_err());
    assert!(seen.lock().unwrap().is_empty());
}

#[tokio::test]
async fn pod_lists_select_the_agent_and_refuse_pagination() {
    let (r, seen) = mock(Box::new(|_| {
        (
            200,
            json!({ "kind": "PodList", "apiVersion": "v1", "metadata": { "continue": "more" }, "items": [] }),
        )
    }));
    let f = crate::observe::agent_pods(
        &r,
        &names::Tenant::managed(&id("ns-1")),
        &id("agent-1"),
        Some(("k", "v")),
    )
    .await
    .unwrap_err();
    assert!(f.message.contains("paginated"), "{f}");
    let s = seen.lock().unwrap()[0].clone();
    assert_eq!(s.method, "GET");
    let uri = s
        .uri
        .replace("%2F", "/")
        .replace("%3D", "=")
        .replace("%2C", ",");
    assert!(
        uri.contains("labelSelector=app.kubernetes.io/managed-by=clawfleet,clawfleet.dev/agent-id=agent-1,k=v"),
        "{uri}"
    );
}

fn settings() -> ClusterSettings {
    ClusterSettings::new(format!("r.example/gw@sha256:{}", "c".repeat(64)))
}

fn ns_ref() -> NamespaceRef {
    NamespaceRef {
        id: id("ns-1"),
        name: id("team"),
    }
}

#[tokio::test]
async fn ensure_namespace_checks_then_applies_everything() {
    let (r, seen) = mock(Box::new(|s| match s.method.as_str() {
        "GET" if s.uri.contains("labelSelector") => (200, empty_list()),
        "GET" => status(404, "NotFound"),
        _ => echo(s),
    }));
    let op = Operation::EnsureNamespace(NamespaceArgs {
        namespace: ns_ref(),
    });
    let creds = test_credentials();
    crate::backend::run(&r, "c", &creds, &settings(), op)
        .await
        .unwrap();
    let seen = seen.lock().unwrap().clone();
    let uri = seen[0].uri.replace("%2F", "/").replace("%3D", "=");
    assert!(
        uri.contains("labelSelector=clawfleet.dev/namespace-id=ns-1"),
        "{uri}"
    );
    let writes: Vec<&Seen> = seen.iter().filter(|s| s.method != "GET").collect();
    assert_eq!(writes.len(), 6, "namespace, quota, limits, three policies");
    for w in &writes {
        assert_eq!(w.method, "PATCH");
        assert!(w.uri.contains("fieldManager=clawfleet"), "{}", w.uri);
        assert!(!w.uri.contains("force=true"));
        assert_eq!(
            w.content_type.as_deref(),
            Some("application/apply-patch+yaml")
        );
    }
    assert!(writes[0].uri.starts_with(&format!(
        "/api/v1/namespaces/{}?",
        names::tenant_namespace(&id("ns-1"))
    )));
    assert!(
        writes[3].uri.contains(names::DEFAULT_DENY),
        "default deny before what allows"
    );
}

fn test_credentials() -> crate::ClusterCredentials {
    use base64::Engine as _;
    let ca = "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n";
    let doc = json!({
        "clusters": [{ "name": "c", "cluster": { "server": "https://127.0.0.1:1",
            "certificate-authority-data": base64::engine::general_purpose::STANDARD.encode(ca) } }],
        "users": [{ "name": "u", "user": { "token": "t" } }],
        "contexts": [{ "name": "x", "context": { "cluster": "c", "user": "u" } }],
        "current-context": "x",
    });
    crate::parse_kubeconfig(&doc.to_string(), None).unwrap()
}

fn prepare_op() -> Operation {
    prepare_with(None)
}

fn prepare_with(egress: Option<Egress>) -> Operation {
    let configuration =
        Configuration::new(json!({ "gateway": { "auth": { "mode": "password" } } })).unwrap();
    Operation::PrepareRevision(PrepareArgs {
        workspace: None,
        namespace: ns_ref(),
        agent: AgentRef {
            id: id("agent-1"),
            service_principal_id: id("sp"),
        },
        revision: RevisionSpec {
            id: id("rev-1"),
            number: RevisionNumber::new(1).unwrap(),
            harness: Harness {
                id: HarnessId::Openclaw,
                version: HarnessVersion::new("1").unwrap(),
                mode: HarnessMode::Embedded,
            },
            configuration_hash: configuration.hash(),
            configuration,
        },
        egress,
    })
}

/// A prepare (or plan) whose egress asks for a port or range beyond the cluster's (TCP 443 to
/// public addresses) is EGRESS_NOT_ALLOWED, naming the entry, before any request.
#[tokio::test]
async fn egress_beyond_the_clusters_is_refused_before_any_request() {
    for (egress, says) in [
        (
            Egress {
                ports: Some(vec![443, 22]),
                allow: None,
            },
            "egress.ports[1] is 22",
        ),
        (
            Egress {
                ports: None,
                allow: Some(vec!["10.0.0.0/8".into()]),
            },
            "egress.allow[0] is 10.0.0.0/8",
        ),
    ] {
        let (r, seen) = mock(Box::new(echo));
        let f = crate::backend::run(
            &r,
            "c",
            &test_credentials(),
            &settings(),
            prepare_with(Some(egress.clone())),
        )
        .await
        .unwrap_err();
        assert_eq!(f.code, FailureCode::EgressNotAllowed, "{f}");
        assert!(!f.is_retryable(), "{f}");
        assert!(f.message.contains(says), "{f}");
        assert!(seen.lock().unwrap().is_empty(), "a request was made");
        let Operation::PrepareRevision(args) = prepare_with(Some(egress)) else {
            unreachable!("a prepare")
        };
        let plan = Operation::PlanRevision(clawfleet_protocol::plan::PlanArgs {
            namespace: args.namespace,
            agent: args.agent,
            revision: args.revision,
            restore: None,
            egress: args.egress,
        });
        let f = crate::backend::run(&r, "c", &test_credentials(), &settings(), plan)
            .await
            .unwrap_err();
        assert_eq!(f.code, FailureCode::EgressNotAllowed, "{f}");
        assert!(seen.lock().unwrap().is_empty(), "a request was made");
    }
}

/// The egress policy a prepare applies: the Agent's ports (443 or none), or the cluster's.
#[tokio::test]
async fn prepare_applies_the_agents_egress_policy() {
    let ns_obj = serde_json::to_value(render::namespace(&ns_ref()).unwrap()).unwrap();
    let deny =
        serde_json::to_value(render::default_deny(&names::Tenant::managed(&id("ns-1"))).unwrap())
            .unwrap();
    let tenant = names::tenant_namespace(&id("ns-1"));
    let policy = names::agent(&id("agent-1")).egress;
    for (egress, rule) in [
        (None, Some(json!([{ "protocol": "TCP", "port": 443 }]))),
        (
            Some(Egress {
                ports: Some(vec![443]),
                allow: Some(vec![]),
            }),
            Some(json!([{ "protocol": "TCP", "port": 443 }])),
        ),
        (
            Some(Egress {
                ports: Some(vec![]),
                allow: None,
            }),
            None,
        ),
    ] {
        let (ns_obj, deny, tenant) = (ns_obj.clone(), deny.clone(), tenant.clone());
        let (r, seen) = mock(Box::new(move |s| {
            if s.method != "GET" {
                return echo(s);
            }
            if s.uri.starts_with(&format!("/api/v1/namespaces/{tenant}?"))
                || s.uri == format!("/api/v1/namespaces/{tenant}")
            {
                (200, ns_obj.clone())
            } else if s.uri.contains(names::DEFAULT_DENY) {
                (200, deny.clone())
            } else {
                status(404, "NotFound")
            }
        }));
        // What follows the writes (reading the Pods back) is not this test's concern.
        let _ = crate::backend::run(
            &r,
            "c",
            &test_credentials(),
            &settings(),
            prepare_with(egress.clone()),
        )
        .await;
        let seen = seen.lock().unwrap().clone();
        let applied = seen
            .iter()
            .find(|s| s.method == "PATCH" && s.uri.contains(&format!("networkpolicies/{policy}")))
            .unwrap_or_else(|| panic!("{egress:?}: no egress policy applied: {seen:?}"));
        assert_eq!(applied.body["spec"]["policyTypes"], json!(["Egress"]));
        match &rule {
            Some(ports) => assert_eq!(
                &applied.body["spec"]["egress"][0]["ports"], ports,
                "{egress:?}"
            ),
            None => assert!(
                applied.body["spec"].get("egress").is_none(),
                "{egress:?}: {}",
                applied.body
            ),
        }
    }
}

#[tokio::test]
async fn a_foreign_object_stops_prepare_before_any_write() {
    let ns_obj = serde_json::to_value(render::namespace(&ns_ref()).unwrap()).unwrap();
    let deny =
        serde_json::to_value(render::default_deny(&names::Tenant::managed(&id("ns-1"))).unwrap())
            .unwrap();
    let gw = names::agent(&id("agent-1")).gateway;
    let tenant = names::tenant_namespace(&id("ns-1"));
    let (r, seen) = mock(Box::new(move |s| {
        if s.method != "GET" {
            return echo(s);
        }
        if s.uri.starts_with(&format!("/api/v1/namespaces/{tenant}?"))
            || s.uri == format!("/api/v1/namespaces/{tenant}")
        {
            (200, ns_obj.clone())
        } else if s.uri.contains(names::DEFAULT_DENY) {
            (200, deny.clone())
        } else if s.uri.contains(&format!("deployments/{gw}")) {
            (
                200,
                json!({ "apiVersion": "apps/v1", "kind": "Deployment",
                "metadata": { "name": gw, "namespace": tenant, "labels": { "app": "other" } },
                "spec": { "selector": {}, "template": {} } }),
            )
        } else {
            status(404, "NotFound")
        }
    }));
    let f = crate::backend::run(&r, "c", &test_credentials(), &settings(), prepare_op())
        .await
        .unwrap_err();
    assert_eq!(f.code, FailureCode::KubernetesOwnershipConflict, "{f}");
    assert!(f.message.contains(names::MANAGED_BY), "{f}");
    assert!(!f.message.contains("other"), "no foreign values: {f}");
    let seen = seen.lock().unwrap().clone();
    assert!(
        seen.iter().all(|s| s.method == "GET"),
        "nothing written: {seen:?}"
    );
}

#[tokio::test]
async fn reads_are_retried_in_place_but_writes_never() {
    let count = Arc::new(Mutex::new(0u32));
    let c = count.clone();
    let (r, seen) = mock(Box::new(move |s| {
        if s.method == "GET" {
            let mut n = c.lock().unwrap();
            *n += 1;
            if *n < 3 {
                return status(503, "ServiceUnavailable");
            }
            return status(404, "NotFound");
        }
        status(503, "ServiceUnavailable")
    }));
    let api: Obj<ConfigMap> = Obj::namespaced(&r, "oce-1", "ConfigMap");
    assert!(
        api.get(&r, "x").await.unwrap().is_none(),
        "the third read answers"
    );
    let f = api.apply(&r, "x", &cm()).await.unwrap_err();
    assert_eq!(f.code, FailureCode::KubernetesApiUnavailable);
    assert!(f.is_retryable());
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.iter().filter(|s| s.method == "GET").count(), 3);
    assert_eq!(
        seen.iter().filter(|s| s.method == "PATCH").count(),
        1,
        "sent once"
    );
}

#[tokio::test]
async fn probe_reads_version_and_warns_below_the_minimum() {
    let (r, seen) = mock(Box::new(|s| {
        if s.uri.starts_with("/version") {
            (
                200,
                json!({ "major": "1", "minor": "34+", "gitVersion": "v1.34.3", "gitCommit": "",
                          "gitTreeState": "", "buildDate": "", "goVersion": "", "compiler": "", "platform": "" }),
            )
        } else {
            (
                200,
                json!({ "kind": "PartialObjectMetadataList", "apiVersion": "meta.k8s.io/v1",
                          "metadata": {}, "items": [{ "metadata": { "name": "gw-1" } }] }),
            )
        }
    }));
    let creds = test_credentials();
    let out = crate::backend::run(
        &r,
        "prod",
        &creds,
        &settings(),
        Operation::Probe(Default::default()),
    )
    .await
    .unwrap();
    let clawfleet_protocol::OperationResult::Probe(p) = out else {
        panic!("{out:?}")
    };
    assert_eq!(p.system_host_name, "prod");
    assert_eq!(p.agents, 1);
    assert_eq!(p.max_agents, 20);
    assert_eq!(p.host_key.as_str(), creds.ca_fingerprint());
    let v = p.systemd_version.clone().unwrap();
    assert!(v.starts_with("kubernetes v1.34.3"), "{v}");
    assert!(v.contains("KUBERNETES_VERSION_BELOW_MINIMUM"), "{v}");
    assert!(p.missing_tools.is_empty(), "a warning, not a refusal");
    // In a cluster's words: the version, the warning by its code, the CA, the gateway port.
    let report = crate::ClusterProbeReport::from_probe_result(&p);
    assert_eq!(report.server_version, "v1.34.3");
    assert_eq!(report.ca_fingerprint, creds.ca_fingerprint());
    assert_eq!(report.gateway_port, settings().gateway_port);
    assert_eq!((report.max_agents, report.agents), (20, 1));
    assert_eq!(report.warnings.len(), 1, "{report:?}");
    assert_eq!(report.warnings[0].code, "KUBERNETES_VERSION_BELOW_MINIMUM");
    assert!(report.warnings[0].message.contains("(1.34)"), "{report:?}");
    let shown = serde_json::to_string(&report).unwrap();
    for host_word in ["systemd", "hostKey", "hostd", "missingTools", "portRange"] {
        assert!(!shown.contains(host_word), "{host_word} in {shown}");
    }
    let seen = seen.lock().unwrap().clone();
    let uri = seen[1].uri.replace("%2F", "/").replace("%3D", "=");
    assert!(uri.starts_with("/apis/apps/v1/deployments?"), "{uri}");
    assert!(
        uri.contains("labelSelector=app.kubernetes.io/managed-by=clawfleet"),
        "{uri}"
    );
}

#[tokio::test]
async fn operation_status_is_unknown_without_a_request() {
    let (r, seen) = mock(Box::new(echo));
    let op = Operation::OperationStatus(clawfleet_protocol::operation::OperationStatusArgs {
        operation_id: clawfleet_protocol::OperationId::new("op-1").unwrap(),
    });
    let out = crate::backend::run(&r, "c", &test_credentials(), &settings(), op)
        .await
        .unwrap();
    let clawfleet_protocol::OperationResult::OperationStatus(s) = out else {
        panic!("{out:?}")
    };
    assert_eq!(s.state, clawfleet_protocol::result::OperationState::Unknown);
    assert!(seen.lock().unwrap().is_empty());
}

#[tokio::test]
async fn malformed_pod_lists_are_errors() {
    let tenant = names::tenant_namespace(&id("ns-1"));
    let pod = |labels: Value, conditions: Value| {
        json!({ "metadata": { "name": "p", "namespace": tenant, "labels": labels },
                "status": { "conditions": conditions } })
    };
    let ours = json!({ names::MANAGED_BY: "clawfleet", names::NAMESPACE_ID: "ns-1", names::AGENT_ID: "agent-1" });
    let cases = [
        // The same condition type twice.
        pod(
            ours.clone(),
            json!([{ "type": "Ready", "status": "True" }, { "type": "Ready", "status": "False" }]),
        ),
        // Our selector's labels but another tenant's namespace id.
        pod(
            json!({ names::MANAGED_BY: "clawfleet", names::NAMESPACE_ID: "ns-2", names::AGENT_ID: "agent-1" }),
            json!([]),
        ),
    ];
    for item in cases {
        let list =
            json!({ "kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": [item] });
        let (r, _) = mock(Box::new(move |_| (200, list.clone())));
        let f = crate::observe::agent_pods(
            &r,
            &names::Tenant::managed(&id("ns-1")),
            &id("agent-1"),
            None,
        )
        .await
        .unwrap_err();
        assert!(
            f.message.contains("repeats condition") || f.message.contains(names::NAMESPACE_ID),
            "{f}"
        );
        assert!(!f.message.contains("ns-2"), "no foreign values: {f}");
    }
}

/// Issue 27: a cluster's failures carry cluster codes; hostd's words (a journal, systemd,
/// units, accounts, host hooks) never reach an operator for a cluster. Every source file of
/// the backend is read for a host-only code.
#[test]
fn no_host_only_code_is_emitted_for_a_cluster() {
    const HOST_ONLY: [&str; 14] = [
        "JournalUnavailable",
        "PreviousRunMissing",
        "SystemdUnavailable",
        "UnitFailed",
        "ReadinessTimeout",
        "ListenerNotOwned",
        "AccountToolFailed",
        "PortRangeExhausted",
        "HostFull",
        "HostConfigInvalid",
        "MissingTool",
        "GatewayCommandMissing",
        "HookFailed",
        "SessionLimit",
    ];
    let mut dirs = vec![std::path::PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/src"
    ))];
    let mut files = 0;
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") || path.ends_with("shape_tests.rs") {
                continue;
            }
            files += 1;
            let text = std::fs::read_to_string(&path).unwrap();
            for code in HOST_ONLY {
                assert!(
                    !text.contains(&format!("FailureCode::{code}")),
                    "{} emits the host-only code {code}",
                    path.display()
                );
            }
        }
    }
    assert!(files > 10, "read {files} files");
}
