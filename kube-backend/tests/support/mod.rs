//! Helpers for the control-plane tests: a cluster from the harness's kubeconfig, operation
//! builders, PersistentVolumes for the state claims (no provisioner runs in this tier).
#![allow(clippy::unwrap_used, clippy::expect_used, dead_code)]

use std::time::{Duration, Instant};

use clawfleet_k8s_tests::ControlPlane;
use clawfleet_kube::{
    Cluster, ClusterSettings, KubeBackend, parse_kubeconfig, parse_kubeconfig_file,
};
use clawfleet_protocol::egress::Egress;
use clawfleet_protocol::failure::FailureClass;
use clawfleet_protocol::operation::{
    AgentArgs, AgentRef, Harness, HarnessId, HarnessMode, HarnessVersion, NamespaceArgs,
    NamespaceRef, PrepareArgs, RevisionArgs, RevisionNumber, RevisionRef, RevisionSpec,
};
use clawfleet_protocol::result::OperationResult;
use clawfleet_protocol::{Configuration, Failure, Ident, Operation};
use kube::Api;
use kube::api::PostParams;

pub const STORAGE_CLASS: &str = "clawfleet-test";
pub const IMAGE: &str = "registry.invalid/clawfleet/openclaw-gateway@sha256:1111111111111111111111111111111111111111111111111111111111111111";
pub const DEADLINE: Duration = Duration::from_secs(60);

pub fn id(s: &str) -> Ident {
    Ident::new(s).unwrap()
}

pub fn settings() -> ClusterSettings {
    let mut s = ClusterSettings::new(IMAGE);
    s.storage_class = Some(STORAGE_CLASS.to_owned());
    s
}

pub async fn start() -> ControlPlane {
    let t0 = Instant::now();
    let cp = ControlPlane::start().await.expect("control plane starts");
    eprintln!(
        "control plane started in {:.1}s",
        t0.elapsed().as_secs_f64()
    );
    cp
}

/// The cluster as the coordinator would register it: from the kubeconfig file of the
/// harness's backend identity, which holds the shipped least-privilege ClusterRole only
/// (not `system:masters`; the harness's own setup uses the admin client).
pub fn cluster(cp: &ControlPlane, settings: ClusterSettings) -> Cluster {
    let credentials =
        parse_kubeconfig_file(cp.backend_kubeconfig_path(), None).expect("kubeconfig");
    Cluster {
        name: "test".to_owned(),
        credentials,
        settings,
    }
}

/// A cluster reached through a URL other than the apiserver's (the fault proxy).
pub fn cluster_via(kubeconfig: &str, settings: ClusterSettings) -> Cluster {
    Cluster {
        name: "via-proxy".to_owned(),
        credentials: parse_kubeconfig(kubeconfig, None).expect("kubeconfig"),
        settings,
    }
}

/// The StorageClass and `n` PersistentVolumes the state claims bind to.
pub async fn volumes(client: &kube::Client, n: usize) {
    let classes: Api<k8s_openapi::api::storage::v1::StorageClass> = Api::all(client.clone());
    let class = serde_json::from_value(serde_json::json!({
        "apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
        "metadata": { "name": STORAGE_CLASS },
        "provisioner": "kubernetes.io/no-provisioner",
        "volumeBindingMode": "Immediate",
        "reclaimPolicy": "Retain",
    }))
    .unwrap();
    classes
        .create(&PostParams::default(), &class)
        .await
        .unwrap();
    let pvs: Api<k8s_openapi::api::core::v1::PersistentVolume> = Api::all(client.clone());
    for i in 0..n {
        let pv = serde_json::from_value(serde_json::json!({
            "apiVersion": "v1", "kind": "PersistentVolume",
            "metadata": { "name": format!("pv-{i}") },
            "spec": {
                "storageClassName": STORAGE_CLASS,
                "capacity": { "storage": "1Gi" },
                "accessModes": ["ReadWriteOnce"],
                "persistentVolumeReclaimPolicy": "Retain",
                "hostPath": { "path": format!("/tmp/clawfleet-pv-{i}") },
            },
        }))
        .unwrap();
        pvs.create(&PostParams::default(), &pv).await.unwrap();
    }
}

pub fn ns_ref(ns: &str) -> NamespaceRef {
    NamespaceRef {
        id: id(ns),
        name: id(&format!("{ns}-name")),
    }
}

pub fn agent_ref(agent: &str) -> AgentRef {
    AgentRef {
        id: id(agent),
        service_principal_id: id(&format!("sp-{agent}")),
    }
}

/// What the coordinator renders for a host (loopback, password auth from the env).
pub fn configuration(marker: &str) -> Configuration {
    Configuration::new(serde_json::json!({
        "gateway": {
            "mode": "local", "bind": "loopback",
            "auth": { "mode": "password",
                      "password": { "source": "env", "provider": "default", "id": "OPENCLAW_GATEWAY_PASSWORD" } },
        },
        "update": { "checkOnStart": false },
        "agents": { "defaults": { "description": marker } },
    }))
    .unwrap()
}

pub fn spec(rev: &str, number: u64) -> RevisionSpec {
    let configuration = configuration(rev);
    RevisionSpec {
        id: id(rev),
        number: RevisionNumber::new(number).unwrap(),
        harness: Harness {
            id: HarnessId::Openclaw,
            version: HarnessVersion::new("2026.9.6").unwrap(),
            mode: HarnessMode::Embedded,
        },
        configuration_hash: configuration.hash(),
        configuration,
    }
}

pub fn rev_ref(rev: &str, number: u64) -> RevisionRef {
    spec(rev, number).reference()
}

pub fn ensure_op(ns: &str) -> Operation {
    Operation::EnsureNamespace(NamespaceArgs {
        namespace: ns_ref(ns),
    })
}

pub fn delete_ns_op(ns: &str) -> Operation {
    Operation::DeleteNamespace(NamespaceArgs {
        namespace: ns_ref(ns),
    })
}

pub fn prepare_op(ns: &str, agent: &str, rev: &str, number: u64) -> Operation {
    prepare_with_egress(ns, agent, rev, number, None)
}

/// `prepare-revision` carrying the Agent's own egress settings.
pub fn prepare_with_egress(
    ns: &str,
    agent: &str,
    rev: &str,
    number: u64,
    egress: Option<Egress>,
) -> Operation {
    Operation::PrepareRevision(PrepareArgs {
        workspace: None,
        namespace: ns_ref(ns),
        agent: agent_ref(agent),
        revision: spec(rev, number),
        egress,
    })
}

pub fn rev_args(ns: &str, agent: &str, rev: &str, number: u64) -> RevisionArgs {
    RevisionArgs {
        namespace: ns_ref(ns),
        agent: agent_ref(agent),
        revision: rev_ref(rev, number),
    }
}

/// `activate-revision` without restore.
pub fn activate_op(ns: &str, agent: &str, rev: &str, number: u64) -> Operation {
    Operation::ActivateRevision(rev_args(ns, agent, rev, number).into())
}

pub fn delete_agent_op(ns: &str, agent: &str) -> Operation {
    Operation::DeleteAgent(AgentArgs {
        namespace: ns_ref(ns),
        agent: agent_ref(agent),
    })
}

/// Calls and logs the time taken.
pub async fn call(
    backend: &KubeBackend,
    cluster: &Cluster,
    op: Operation,
) -> Result<OperationResult, Failure> {
    call_within(backend, cluster, op, DEADLINE).await
}

pub async fn call_within(
    backend: &KubeBackend,
    cluster: &Cluster,
    op: Operation,
    deadline: Duration,
) -> Result<OperationResult, Failure> {
    let kind = op.kind();
    let t0 = Instant::now();
    let out = backend.call(cluster, op, deadline).await;
    eprintln!(
        "  {kind}: {:.2}s -> {}",
        t0.elapsed().as_secs_f64(),
        match &out {
            Ok(_) => "ok".to_owned(),
            Err(f) => f.to_string(),
        }
    );
    out
}

/// [`call`], retried as the coordinator's worker retries: a retryable failure (such as a 409
/// conflict when a controller updated the object between the backend's read and its
/// replace) is tried again, up to three times.
pub async fn call_retrying(
    backend: &KubeBackend,
    cluster: &Cluster,
    op: Operation,
) -> Result<OperationResult, Failure> {
    let mut left = 3;
    loop {
        match call(backend, cluster, op.clone()).await {
            Err(f) if f.class == FailureClass::Retryable && left > 0 => {
                left -= 1;
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            out => return out,
        }
    }
}

/// Prepare then activate; the time from the first request to observed readiness.
pub async fn deploy(
    backend: &KubeBackend,
    cluster: &Cluster,
    ns: &str,
    agent: &str,
    rev: &str,
    number: u64,
) -> Duration {
    let t0 = Instant::now();
    match call(backend, cluster, prepare_op(ns, agent, rev, number)).await {
        Ok(OperationResult::PrepareRevision(p)) => assert!(p.ready, "prepare ready"),
        other => panic!("prepare: {other:?}"),
    }
    match call(backend, cluster, activate_op(ns, agent, rev, number)).await {
        Ok(OperationResult::ActivateRevision(a)) => {
            assert_eq!(a.observation.served.as_ref().map(Ident::as_str), Some(rev));
        }
        other => panic!("activate: {other:?}"),
    }
    t0.elapsed()
}

pub use clawfleet_k8s_tests::{Tier, TierCluster};

/// The tier's cluster (the control plane, and on the real node the node with the test
/// gateway's image), or `None` after a "SKIP: ..." line when it cannot run here (under
/// `CI=true` that panics instead).
pub async fn start_tier(tier: Tier) -> Option<TierCluster> {
    if let Some(reason) = tier.skip_reason() {
        eprintln!("SKIP: {reason}");
        return None;
    }
    Some(
        TierCluster::start(tier)
            .await
            .expect("the tier's cluster starts"),
    )
}

/// [`settings`] on the kwok tier; the test gateway's image, command, StorageClass and node
/// selector on the real node.
pub fn tier_settings(tc: &TierCluster) -> ClusterSettings {
    ClusterSettings::from_json(tc.settings_json(IMAGE, Some(STORAGE_CLASS)))
        .expect("the tier's settings")
}

/// [`volumes`] on the kwok tier (no provisioner runs there); nothing on the real node, whose
/// StorageClass the harness provisions.
pub async fn tier_volumes(tc: &TierCluster, client: &kube::Client, n: usize) {
    if tc.tier() == Tier::Kwok {
        volumes(client, n).await;
    }
}
