//! The registration's access check against a real kube-apiserver (issue 27): the shipped
//! roles are what it asks for, an identity without them is refused naming what it lacks, and
//! the adopted-namespace roles (`rbac/adopted.yaml`) are enough for an adopting cluster.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use clawfleet_k8s_tests::{LIMITED_USER, skip_unless_control_plane};
use clawfleet_kube::{Cluster, KubeBackend, parse_kubeconfig_file};
use k8s_openapi::api::core::v1::Namespace;
use kube::Api;
use kube::api::{DynamicObject, Patch, PatchParams};
use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_access_check_knows_the_shipped_roles() {
    skip_unless_control_plane!();
    let cp = start().await;
    let backend = KubeBackend::new();

    // The harness's backend identity holds the managed ClusterRole only: nothing missing.
    let missing = backend
        .missing_access(&cluster(&cp, settings()))
        .await
        .unwrap();
    assert!(missing.is_empty(), "{missing:?}");

    // An authenticated identity with no bindings lacks everything, each named.
    let limited = Cluster {
        name: "limited".to_owned(),
        credentials: parse_kubeconfig_file(cp.limited_kubeconfig_path(), None).unwrap(),
        settings: settings(),
    };
    let missing = backend.missing_access(&limited).await.unwrap();
    for want in [
        "create namespaces (cluster-wide)",
        "delete deployments.apps (cluster-wide)",
        "get pods/log (cluster-wide)",
        "patch networkpolicies.networking.k8s.io (cluster-wide)",
    ] {
        assert!(missing.iter().any(|m| m == want), "{want}: {missing:?}");
    }

    // Adopting: bind rbac/adopted.yaml (for namespace team-a) to the limited user; the
    // check of a cluster adopting team-a then passes, and it still fails for another
    // namespace.
    let admin = cp.client().await.unwrap();
    let namespaces: Api<Namespace> = Api::all(admin.clone());
    namespaces
        .create(
            &Default::default(),
            &serde_json::from_value(serde_json::json!({"metadata": {"name": "team-a"}})).unwrap(),
        )
        .await
        .unwrap();
    let yaml = std::fs::read_to_string(format!("{}/rbac/adopted.yaml", env!("CARGO_MANIFEST_DIR")))
        .unwrap()
        .replace("name: clawfleet\n", &format!("name: {LIMITED_USER}\n"));
    let docs: Vec<serde_json::Value> = serde_saphyr::from_str_multiple(&yaml).unwrap();
    for doc in docs {
        let obj: DynamicObject = serde_json::from_value(doc.clone()).unwrap();
        let kind = doc["kind"].as_str().unwrap();
        let plural = format!("{}s", kind.to_lowercase());
        let ar = kube::api::ApiResource {
            group: "rbac.authorization.k8s.io".into(),
            version: "v1".into(),
            api_version: "rbac.authorization.k8s.io/v1".into(),
            kind: kind.into(),
            plural,
        };
        let api: Api<DynamicObject> = match doc["metadata"]["namespace"].as_str() {
            Some(ns) => Api::namespaced_with(admin.clone(), ns, &ar),
            None => Api::all_with(admin.clone(), &ar),
        };
        let name = obj.metadata.name.clone().unwrap();
        api.patch(
            &name,
            &PatchParams::apply("test").force(),
            &Patch::Apply(&obj),
        )
        .await
        .unwrap();
    }
    let mut adopting = settings();
    adopting
        .adopted_namespaces
        .insert("ns-a".to_owned(), "team-a".to_owned());
    let limited_adopting = Cluster {
        settings: adopting.clone(),
        ..limited.clone()
    };
    // RBAC bindings take effect at once in the authorizer's cache, but give it a moment.
    let mut missing = Vec::new();
    for _ in 0..50 {
        missing = backend.missing_access(&limited_adopting).await.unwrap();
        if missing.is_empty() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(missing.is_empty(), "{missing:?}");
    adopting
        .adopted_namespaces
        .insert("ns-b".to_owned(), "team-b".to_owned());
    let missing = backend
        .missing_access(&Cluster {
            settings: adopting,
            ..limited
        })
        .await
        .unwrap();
    assert!(
        missing
            .iter()
            .any(|m| m == "create deployments.apps (in namespace team-b)"),
        "{missing:?}"
    );
    assert!(
        missing
            .iter()
            .any(|m| m == "patch namespaces team-b (cluster-wide)"),
        "{missing:?}"
    );
}
