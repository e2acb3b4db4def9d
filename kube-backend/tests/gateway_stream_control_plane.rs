//! The gateway stream's request path on the kwok tier (issue 30, cluster path): no container
//! runs here, so what is checked is which Pod and port the port-forward asks for, that the
//! API server authorizes it as `create pods/portforward` (an identity without it gets the
//! typed refusal naming that verb, and the access check names it), and that a connection the
//! fault proxy cuts or stalls ends in a typed error within the caller's time limit. The full
//! path (bytes through a real Pod) is in `coordinator/tests/e2e_pods.rs`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::{Duration, Instant};

use clawfleet_k8s_tests::{
    BACKEND_USER, Fault, FaultProxy, LIMITED_USER, skip_unless_control_plane,
};
use clawfleet_kube::{Cluster, GatewayStreamError, KubeBackend, parse_kubeconfig_file};
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{DynamicObject, ListParams, Patch, PatchParams};
use support::*;

const OPEN: Duration = Duration::from_secs(5);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_port_forward_request_names_the_current_pod_and_fails_typed() {
    skip_unless_control_plane!();
    let cp = start().await;
    let admin = cp.client().await.unwrap();
    volumes(&admin, 2).await;
    let cluster = cluster(&cp, settings());
    let backend = KubeBackend::new();
    let (ns, agent) = ("pf", "gw-1");
    call(&backend, &cluster, ensure_op(ns)).await.unwrap();

    // Nothing deployed yet.
    let err = backend
        .open_gateway_stream(&cluster, &id(ns), &id(agent), OPEN)
        .await
        .unwrap_err();
    assert!(
        matches!(err, GatewayStreamError::NotDeployed { .. }),
        "{err}"
    );

    deploy(&backend, &cluster, ns, agent, "r-1", 1).await;
    let tenant = clawfleet_kube::names::tenant_namespace(&id(ns));
    let pods: Api<Pod> = Api::namespaced(admin.clone(), &tenant);
    let pod = pods
        .list(&ListParams::default().labels(&format!("clawfleet.dev/agent-id={agent}")))
        .await
        .unwrap()
        .items
        .into_iter()
        .find(|p| p.metadata.deletion_timestamp.is_none())
        .and_then(|p| p.metadata.name)
        .expect("the Agent's Pod");
    let want = format!("/api/v1/namespaces/{tenant}/pods/{pod}/portforward?&ports=18789");

    // Straight to the API server: it authorizes the backend identity (the shipped role) and
    // hands the upgrade to the node, which on this tier is kwok's server. It accepts the
    // upgrade but forwards to nothing, so the stream's first read ends with kwok's error for
    // the port, as an io::Error naming the Pod: never a hang, never a silent end.
    let t = Instant::now();
    let mut conn = backend
        .open_gateway_stream(&cluster, &id(ns), &id(agent), OPEN)
        .await
        .unwrap();
    eprintln!(
        "EVIDENCE port-forward to a kwok Pod opened in {:.3} s: Pod {} revision {} (Pod's {})",
        t.elapsed().as_secs_f64(),
        conn.pod,
        conn.revision_id,
        conn.pod_revision_id
    );
    assert_eq!(conn.pod, pod);
    assert_eq!(conn.namespace, tenant);
    assert_eq!(conn.revision_id.as_str(), "r-1");
    assert_eq!(conn.pod_revision_id.as_str(), "r-1");
    {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let _ = conn
            .stream
            .write_all(b"GET /healthz HTTP/1.0\r\n\r\n")
            .await;
        let mut buf = Vec::new();
        let read = tokio::time::timeout(OPEN, conn.stream.read_to_end(&mut buf))
            .await
            .expect("the stream's end is reported, not a hang");
        eprintln!(
            "EVIDENCE reading from kwok's forward: {read:?}, {} bytes",
            buf.len()
        );
        let err = read.expect_err("kwok forwards to nothing: an error, not a clean end");
        assert!(err.to_string().contains(&pod), "{err}");
    }

    // Through the fault proxy: the lookups pass, the port-forward's upgrade is dropped.
    let proxy = FaultProxy::start(&cp).await.unwrap();
    let via = cluster_via(
        &proxy.kubeconfig(BACKEND_USER, cp.backend_token()),
        settings(),
    );
    proxy.inject(Fault::Delay(Duration::ZERO), 2);
    proxy.inject(Fault::Drop, 1);
    let t = Instant::now();
    let err = backend
        .open_gateway_stream(&via, &id(ns), &id(agent), OPEN)
        .await
        .map(|c| c.pod)
        .unwrap_err();
    eprintln!("EVIDENCE the proxy drops the upgrade: {err}");
    assert!(
        matches!(&err, GatewayStreamError::Unavailable { pod: p, .. } if *p == pod),
        "{err}"
    );
    assert!(t.elapsed() < OPEN, "{:?}", t.elapsed());
    let seen = proxy.seen();
    eprintln!("EVIDENCE requests the proxy saw: {seen:?}");
    let last = seen.last().unwrap();
    assert_eq!(last.method, "GET");
    assert_eq!(last.uri, want);
    assert!(last.injected);
    assert!(
        seen[..seen.len() - 1].iter().any(|s| s
            .uri
            .starts_with(&format!("/apis/apps/v1/namespaces/{tenant}/deployments/"))),
        "{seen:?}"
    );

    // A stalled upgrade ends at the caller's limit.
    proxy.inject(Fault::Delay(Duration::ZERO), 2);
    proxy.inject(Fault::Delay(Duration::from_secs(60)), 1);
    let t = Instant::now();
    let err = backend
        .open_gateway_stream(&via, &id(ns), &id(agent), Duration::from_secs(3))
        .await
        .map(|c| c.pod)
        .unwrap_err();
    eprintln!(
        "EVIDENCE a stalled upgrade: {err} after {:.2} s",
        t.elapsed().as_secs_f64()
    );
    assert!(
        matches!(err, GatewayStreamError::Unavailable { .. }),
        "{err}"
    );
    assert!(t.elapsed() < Duration::from_secs(4), "{:?}", t.elapsed());
    proxy.clear_faults();

    // An identity that may read the Agent's objects but not forward ports: the typed 403,
    // naming the verb; the access check names the missing permission too.
    let role = serde_json::json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": "clawfleet-no-portforward"},
        "rules": [
            {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]},
            {"apiGroups": ["apps"], "resources": ["deployments"], "verbs": ["get"]},
        ],
    });
    let binding = serde_json::json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": "clawfleet-no-portforward"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                    "name": "clawfleet-no-portforward"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User",
                      "name": LIMITED_USER}],
    });
    for (doc, plural) in [(role, "clusterroles"), (binding, "clusterrolebindings")] {
        let ar = kube::api::ApiResource {
            group: "rbac.authorization.k8s.io".into(),
            version: "v1".into(),
            api_version: "rbac.authorization.k8s.io/v1".into(),
            kind: doc["kind"].as_str().unwrap().into(),
            plural: plural.into(),
        };
        let api: Api<DynamicObject> = Api::all_with(admin.clone(), &ar);
        let obj: DynamicObject = serde_json::from_value(doc).unwrap();
        api.patch(
            "clawfleet-no-portforward",
            &PatchParams::apply("test"),
            &Patch::Apply(&obj),
        )
        .await
        .unwrap();
    }
    let limited = Cluster {
        name: "limited".to_owned(),
        credentials: parse_kubeconfig_file(cp.limited_kubeconfig_path(), None).unwrap(),
        settings: settings(),
    };
    // RBAC takes effect within moments; the Deployment read passing is the sign.
    let deadline = Instant::now() + Duration::from_secs(20);
    let err = loop {
        let err = backend
            .open_gateway_stream(&limited, &id(ns), &id(agent), OPEN)
            .await
            .map(|c| c.pod)
            .unwrap_err();
        if !matches!(err, GatewayStreamError::Cluster(_)) || Instant::now() > deadline {
            break err;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    eprintln!("EVIDENCE without the verb: {err}");
    assert!(
        matches!(&err, GatewayStreamError::Forbidden { pod: p, .. } if *p == pod),
        "{err}"
    );
    assert!(err.to_string().contains("create pods/portforward"), "{err}");
    let missing = backend.missing_access(&limited).await.unwrap();
    for want in [
        "get pods/portforward (cluster-wide)",
        "create pods/portforward (cluster-wide)",
    ] {
        assert!(missing.iter().any(|m| m == want), "{want}: {missing:?}");
    }
    // The shipped role holds it.
    assert!(backend.missing_access(&cluster).await.unwrap().is_empty());
    cp.shutdown().unwrap();
}
