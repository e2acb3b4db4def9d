//! The Kubernetes backend against a real control plane (etcd, kube-apiserver, controller
//! manager, scheduler, kwok): lifecycle, ownership refusals, failure codes, API faults.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::{Duration, Instant};

use clawfleet_k8s_tests::{
    BACKEND_USER, FAIL_PULL_MARKER, Fault, FaultProxy, NEVER_READY_MARKER,
    skip_unless_control_plane,
};
use clawfleet_kube::{KubeBackend, names};
use clawfleet_protocol::result::OperationResult;
use clawfleet_protocol::{FailureClass, FailureCode, Ident, Operation};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{
    ConfigMap, LimitRange, Namespace, PersistentVolumeClaim, Pod, ResourceQuota, Secret, Service,
    ServiceAccount,
};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::Api;
use kube::api::{ListParams, PostParams};
use support::*;

fn served(r: &OperationResult) -> Option<String> {
    match r {
        OperationResult::ActivateRevision(a) => {
            a.observation.served.as_ref().map(|s| s.to_string())
        }
        OperationResult::PrepareRevision(p) => p.observation.served.as_ref().map(|s| s.to_string()),
        OperationResult::StopRevision(s) => s.observation.served.as_ref().map(|s| s.to_string()),
        _ => None,
    }
}

async fn selector_value(svc: &Api<Service>, agent: &str) -> String {
    let s = svc.get(&names::agent(&id(agent)).gateway).await.unwrap();
    s.spec.unwrap().selector.unwrap()[names::SERVING_REVISION].clone()
}

async fn deployment_revision(deps: &Api<Deployment>, agent: &str) -> Option<String> {
    deps.get_opt(&names::agent(&id(agent)).gateway)
        .await
        .unwrap()
        .map(|d| d.metadata.annotations.unwrap()[names::REVISION_ID].clone())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lifecycle_on_a_real_control_plane() {
    lifecycle(Tier::Kwok).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lifecycle_on_the_real_node() {
    lifecycle(Tier::RealNode).await;
}

/// Probe, Namespace, two Agents to Ready, a new revision prepared beside the serving one and
/// activated, retire, stop twice, redeploy, status, delete an Agent, delete the Namespace. On
/// the real node the gateways really run and become Ready by their readiness probe.
/// Issue 28 on the real server: prepares of agent-1's served revision carrying its own egress.
/// No port leaves its policy without an egress rule (the server drops the rule the apply no
/// longer names); none puts TCP 443 back; a port beyond the cluster's is EGRESS_NOT_ALLOWED
/// (permanent) and changes nothing.
async fn egress_narrowed_and_refused(
    backend: &KubeBackend,
    cluster: &clawfleet_kube::Cluster,
    policies: &Api<NetworkPolicy>,
    ns: &str,
) {
    use clawfleet_protocol::egress::Egress;
    let name = names::agent(&id("agent-1")).egress;
    let rules = |p: NetworkPolicy| p.spec.unwrap().egress.unwrap_or_default();
    let ports = |p: NetworkPolicy| -> Vec<String> {
        rules(p)
            .iter()
            .flat_map(|r| r.ports.clone().unwrap_or_default())
            .map(|p| format!("{:?}/{:?}", p.protocol, p.port))
            .collect()
    };
    let https = vec![format!(
        "{:?}/{:?}",
        Some("TCP"),
        Some(k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(443))
    )];
    assert_eq!(ports(policies.get(&name).await.unwrap()), https);
    let none = Egress {
        ports: Some(vec![]),
        allow: Some(vec![]),
    };
    call(
        backend,
        cluster,
        prepare_with_egress(ns, "agent-1", "rev-1a", 1, Some(none)),
    )
    .await
    .unwrap();
    let p = policies.get(&name).await.unwrap();
    assert_eq!(
        p.spec.as_ref().unwrap().policy_types.as_deref(),
        Some(&["Egress".to_owned()][..])
    );
    assert!(rules(p).is_empty(), "no egress rule");
    let wider = Egress {
        ports: Some(vec![443, 8443]),
        allow: None,
    };
    let f = call(
        backend,
        cluster,
        prepare_with_egress(ns, "agent-1", "rev-1a", 1, Some(wider)),
    )
    .await
    .unwrap_err();
    assert_eq!(f.code, FailureCode::EgressNotAllowed, "{f}");
    assert_eq!(f.class, FailureClass::Permanent, "{f}");
    assert!(f.message.contains("egress.ports[1] is 8443"), "{f}");
    assert!(rules(policies.get(&name).await.unwrap()).is_empty());
    call(backend, cluster, prepare_op(ns, "agent-1", "rev-1a", 1))
        .await
        .unwrap();
    assert_eq!(ports(policies.get(&name).await.unwrap()), https);
}

async fn lifecycle(tier: Tier) {
    let Some(cp) = start_tier(tier).await else {
        return;
    };
    let client = cp.client().await.unwrap();
    tier_volumes(&cp, &client, 4).await;
    let cluster = cluster(&cp, tier_settings(&cp));
    let backend = KubeBackend::new();

    // Probe.
    match call(&backend, &cluster, Operation::Probe(Default::default()))
        .await
        .unwrap()
    {
        OperationResult::Probe(p) => {
            assert_eq!(p.system_host_name, "test");
            assert!(
                p.systemd_version
                    .as_deref()
                    .unwrap()
                    .starts_with("kubernetes v1.37")
            );
            assert!(p.missing_tools.is_empty());
            assert_eq!(p.port_range.start, 18789);
            // What the coordinator shows: the cluster's words, the server's own version.
            let report = clawfleet_kube::ClusterProbeReport::from_probe_result(&p);
            assert!(report.server_version.starts_with("v1.37"), "{report:?}");
            assert!(report.warnings.is_empty(), "{report:?}");
            assert_eq!(report.gateway_port, 18789);
            assert_eq!(report.ca_fingerprint, cluster.credentials.ca_fingerprint());
        }
        other => panic!("{other:?}"),
    }
    let probe = backend.probe_cluster(&cluster).await.unwrap();
    assert_eq!((probe.major, probe.minor), (1, 37));
    assert!(probe.warnings.is_empty());

    // Ensure the Namespace twice.
    let ns = "team-a";
    let tenant = names::tenant_namespace(&id(ns));
    assert_eq!(tenant.len(), 19);
    match call(&backend, &cluster, ensure_op(ns)).await.unwrap() {
        OperationResult::EnsureNamespace(e) => assert!(e.created),
        other => panic!("{other:?}"),
    }
    match call(&backend, &cluster, ensure_op(ns)).await.unwrap() {
        OperationResult::EnsureNamespace(e) => assert!(!e.created),
        other => panic!("{other:?}"),
    }
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let n = namespaces.get(&tenant).await.unwrap();
    let labels = n.metadata.labels.unwrap();
    assert_eq!(labels["pod-security.kubernetes.io/enforce"], "restricted");
    assert_eq!(labels[names::MANAGED_BY], "clawfleet");
    assert_eq!(labels[names::NAMESPACE_ID], ns);
    let quotas: Api<ResourceQuota> = Api::namespaced(client.clone(), &tenant);
    assert!(quotas.get_opt(names::QUOTA).await.unwrap().is_some());
    let limits: Api<LimitRange> = Api::namespaced(client.clone(), &tenant);
    assert!(limits.get_opt(names::LIMITS).await.unwrap().is_some());
    let policies: Api<NetworkPolicy> = Api::namespaced(client.clone(), &tenant);
    for p in [
        names::DEFAULT_DENY,
        names::ALLOW_DNS,
        names::ALLOW_GATEWAY_INGRESS,
    ] {
        assert!(policies.get_opt(p).await.unwrap().is_some(), "{p}");
    }

    // Two Agents to Ready.
    let t1 = deploy(&backend, &cluster, ns, "agent-1", "rev-1a", 1).await;
    let t2 = deploy(&backend, &cluster, ns, "agent-2", "rev-2a", 1).await;
    eprintln!(
        "MEASURED prepare+activate to Ready: agent-1 {:.2}s, agent-2 {:.2}s",
        t1.as_secs_f64(),
        t2.as_secs_f64()
    );
    egress_narrowed_and_refused(&backend, &cluster, &policies, ns).await;
    let deps: Api<Deployment> = Api::namespaced(client.clone(), &tenant);
    let svcs: Api<Service> = Api::namespaced(client.clone(), &tenant);
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &tenant);
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &tenant);
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), &tenant);
    let sas: Api<ServiceAccount> = Api::namespaced(client.clone(), &tenant);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &tenant);
    let a1 = names::agent(&id("agent-1"));
    let d = deps.get(&a1.gateway).await.unwrap();
    assert_eq!(d.spec.replicas, Some(1));
    assert_eq!(
        d.spec.strategy.as_ref().unwrap().type_.as_deref(),
        Some("Recreate")
    );
    assert_eq!(
        d.metadata
            .managed_fields
            .unwrap()
            .iter()
            .filter(|f| f.manager.as_deref() == Some("clawfleet"))
            .count(),
        1
    );
    assert_eq!(
        sas.get(&a1.gateway)
            .await
            .unwrap()
            .automount_service_account_token,
        Some(false)
    );
    let secret = secrets.get(&a1.password).await.unwrap();
    let password_v1 = secret.data.unwrap()[names::PASSWORD_KEY].0.clone();
    assert_eq!(password_v1.len(), 64);
    assert_eq!(
        selector_value(&svcs, "agent-1").await,
        names::serving_value(&id("rev-1a"))
    );

    // Revision 2 of agent-1: prepared, the Service keeps pointing at the serving Pod.
    let prepared = call(&backend, &cluster, prepare_op(ns, "agent-1", "rev-1b", 2))
        .await
        .unwrap();
    assert_eq!(served(&prepared).as_deref(), Some("rev-1a"));
    assert_eq!(
        selector_value(&svcs, "agent-1").await,
        names::serving_value(&id("rev-1a"))
    );
    assert_eq!(
        deployment_revision(&deps, "agent-1").await.as_deref(),
        Some("rev-1a")
    );
    let cm2 = names::revision_config_map(&id("agent-1"), &id("rev-1b"));
    let cm2_obj = cms.get(&cm2).await.unwrap();
    assert_eq!(cm2_obj.immutable, Some(true));
    let rendered: serde_json::Value =
        serde_json::from_str(&cm2_obj.data.unwrap()[names::CONFIG_KEY]).unwrap();
    assert_eq!(rendered["gateway"]["bind"], "lan");
    assert_eq!(rendered["gateway"]["auth"]["mode"], "password");
    let ready_pods = pods
        .list(&ListParams::default().labels(&format!("{}=agent-1", names::AGENT_ID)))
        .await
        .unwrap();
    assert_eq!(ready_pods.items.len(), 1, "prepare started no Pod");

    match call(
        &backend,
        &cluster,
        Operation::VerifyRevision(rev_args(ns, "agent-1", "rev-1b", 2)),
    )
    .await
    .unwrap()
    {
        OperationResult::VerifyRevision(v) => {
            assert_eq!(
                v.observation.current.as_ref().map(Ident::as_str),
                Some("rev-1a")
            );
            assert_eq!(
                v.observation.served.as_ref().map(Ident::as_str),
                Some("rev-1a")
            );
        }
        other => panic!("{other:?}"),
    }
    let f = call(
        &backend,
        &cluster,
        Operation::VerifyRevision(rev_args(ns, "agent-1", "rev-never", 9)),
    )
    .await
    .unwrap_err();
    assert_eq!(f.code, FailureCode::RevisionNotPrepared, "{f}");

    // Activate it; retire the old one: its ConfigMap goes, the Deployment stays.
    let t = Instant::now();
    let activated = call(&backend, &cluster, activate_op(ns, "agent-1", "rev-1b", 2))
        .await
        .unwrap();
    eprintln!(
        "MEASURED replace (activate revision 2 to Ready): {:.2}s",
        t.elapsed().as_secs_f64()
    );
    assert_eq!(served(&activated).as_deref(), Some("rev-1b"));
    assert_eq!(
        selector_value(&svcs, "agent-1").await,
        names::serving_value(&id("rev-1b"))
    );
    let cm1 = names::revision_config_map(&id("agent-1"), &id("rev-1a"));
    assert!(cms.get_opt(&cm1).await.unwrap().is_some());
    match call(
        &backend,
        &cluster,
        Operation::RetireRevision(rev_args(ns, "agent-1", "rev-1a", 1)),
    )
    .await
    .unwrap()
    {
        OperationResult::RetireRevision(r) => {
            assert!(!r.stopped);
            assert!(r.removed);
            assert_eq!(
                r.observation.served.as_ref().map(Ident::as_str),
                Some("rev-1b")
            );
        }
        other => panic!("{other:?}"),
    }
    assert!(cms.get_opt(&cm1).await.unwrap().is_none());
    assert_eq!(
        deployment_revision(&deps, "agent-1").await.as_deref(),
        Some("rev-1b")
    );
    // An activation retried on a serving revision changes nothing.
    match call(&backend, &cluster, activate_op(ns, "agent-1", "rev-1b", 2))
        .await
        .unwrap()
    {
        OperationResult::ActivateRevision(a) => {
            assert!(!a.restarted);
            assert!(!a.unit_changed);
        }
        other => panic!("{other:?}"),
    }

    // Stop twice: the Deployment and its Pods go, the PVC and Secret stay.
    let stop = || Operation::StopRevision(rev_args(ns, "agent-1", "rev-1b", 2));
    match call(&backend, &cluster, stop()).await.unwrap() {
        OperationResult::StopRevision(s) => {
            assert!(s.stopped);
            assert_eq!(s.observation.served, None);
            assert_eq!(s.observation.unit, None);
        }
        other => panic!("{other:?}"),
    }
    match call(&backend, &cluster, stop()).await.unwrap() {
        OperationResult::StopRevision(s) => assert!(!s.stopped),
        other => panic!("{other:?}"),
    }
    assert!(deps.get_opt(&a1.gateway).await.unwrap().is_none());
    let left = pods
        .list(&ListParams::default().labels(&format!("{}=agent-1", names::AGENT_ID)))
        .await
        .unwrap();
    assert!(left.items.is_empty(), "no Pod of agent-1 remains");
    assert!(pvcs.get_opt(&a1.state).await.unwrap().is_some());
    assert!(secrets.get_opt(&a1.password).await.unwrap().is_some());
    assert_eq!(selector_value(&svcs, "agent-1").await, names::INACTIVE);

    // Deploy again: same revision, same password.
    let t3 = deploy(&backend, &cluster, ns, "agent-1", "rev-1b", 2).await;
    eprintln!("MEASURED redeploy after stop: {:.2}s", t3.as_secs_f64());
    let again = secrets.get(&a1.password).await.unwrap();
    assert_eq!(again.data.unwrap()[names::PASSWORD_KEY].0, password_v1);

    // Status: both Agents, served revisions, the Deployment as the unit.
    match call(&backend, &cluster, Operation::Status(Default::default()))
        .await
        .unwrap()
    {
        OperationResult::Status(inv) => {
            assert!(inv.problems.is_empty(), "{:?}", inv.problems);
            assert_eq!(inv.namespaces.len(), 1);
            let nsi = &inv.namespaces[0];
            assert_eq!(nsi.id.as_str(), ns);
            assert_eq!(nsi.name.as_str(), "team-a-name");
            assert_eq!(nsi.agents.len(), 2);
            let a = nsi
                .agents
                .iter()
                .find(|a| a.id.as_str() == "agent-1")
                .unwrap();
            assert_eq!(a.revisions.len(), 1);
            assert_eq!(
                a.observation.served.as_ref().map(Ident::as_str),
                Some("rev-1b")
            );
            let unit = a.observation.unit.as_ref().unwrap();
            assert_eq!(unit.active_state, "active");
            assert_eq!(unit.name, a1.gateway);
        }
        other => panic!("{other:?}"),
    }

    // Delete agent-2: all of its objects go.
    let a2 = names::agent(&id("agent-2"));
    match call(&backend, &cluster, delete_agent_op(ns, "agent-2"))
        .await
        .unwrap()
    {
        OperationResult::DeleteAgent(d) => assert!(d.removed),
        other => panic!("{other:?}"),
    }
    assert!(deps.get_opt(&a2.gateway).await.unwrap().is_none());
    assert!(svcs.get_opt(&a2.gateway).await.unwrap().is_none());
    assert!(sas.get_opt(&a2.gateway).await.unwrap().is_none());
    assert!(secrets.get_opt(&a2.password).await.unwrap().is_none());
    // The PVC may still be finishing (kubernetes.io/pvc-protection) but is being deleted.
    assert!(
        pvcs.get_opt(&a2.state)
            .await
            .unwrap()
            .is_none_or(|p| p.metadata.deletion_timestamp.is_some())
    );
    assert!(policies.get_opt(&a2.egress).await.unwrap().is_none());
    let cm_left = cms
        .list(&ListParams::default().labels(&format!("{}=agent-2", names::AGENT_ID)))
        .await
        .unwrap();
    assert!(cm_left.items.is_empty());
    match call(&backend, &cluster, delete_agent_op(ns, "agent-2"))
        .await
        .unwrap()
    {
        OperationResult::DeleteAgent(d) => assert!(!d.removed),
        other => panic!("{other:?}"),
    }

    // Delete the Namespace: waits until it is gone.
    let t = Instant::now();
    match call_within(
        &backend,
        &cluster,
        delete_ns_op(ns),
        Duration::from_secs(90),
    )
    .await
    .unwrap()
    {
        OperationResult::DeleteNamespace(d) => {
            assert!(d.removed);
            assert_eq!(d.agents_removed, 1);
        }
        other => panic!("{other:?}"),
    }
    eprintln!(
        "MEASURED delete-namespace until gone: {:.2}s",
        t.elapsed().as_secs_f64()
    );
    assert!(namespaces.get_opt(&tenant).await.unwrap().is_none());
    match call(&backend, &cluster, delete_ns_op(ns)).await.unwrap() {
        OperationResult::DeleteNamespace(d) => assert!(!d.removed),
        other => panic!("{other:?}"),
    }
    cp.finish("lifecycle").await.unwrap();
}

fn resource_version<K: kube::Resource>(o: &K) -> String {
    o.meta().resource_version.clone().unwrap()
}

fn assert_conflict(out: Result<OperationResult, clawfleet_protocol::Failure>, key_or_kind: &str) {
    match out {
        Err(f) => {
            assert_eq!(f.code, FailureCode::KubernetesOwnershipConflict, "{f}");
            assert_eq!(f.class, FailureClass::Permanent);
            assert!(f.message.contains(key_or_kind), "{f}");
            assert!(!f.message.contains("intruder"), "no foreign values in {f}");
        }
        Ok(r) => panic!("expected an ownership conflict, got {r:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreign_and_tampered_objects_are_refused_with_nothing_written() {
    skip_unless_control_plane!();
    let cp = start().await;
    let client = cp.client().await.unwrap();
    volumes(&client, 4).await;
    let cluster = cluster(&cp, settings());
    let backend = KubeBackend::new();
    let ns = "team-o";
    let tenant = names::tenant_namespace(&id(ns));
    call(&backend, &cluster, ensure_op(ns)).await.unwrap();
    let foreign_meta = |name: &str| serde_json::json!({ "name": name, "labels": { "app": "intruder", names::AGENT_ID: "intruder" } });

    // A foreign Deployment at agent-d's name: activation refuses before writing.
    let d = names::agent(&id("agent-d"));
    let deps: Api<Deployment> = Api::namespaced(client.clone(), &tenant);
    let foreign: Deployment = serde_json::from_value(serde_json::json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": foreign_meta(&d.gateway),
        "spec": { "replicas": 0, "selector": { "matchLabels": { "app": "intruder" } },
                  "template": { "metadata": { "labels": { "app": "intruder" } },
                                "spec": { "containers": [{ "name": "c", "image": "intruder:1" }] } } },
    }))
    .unwrap();
    deps.create(&PostParams::default(), &foreign).await.unwrap();
    // The deployment controller writes its status once; record the object after that.
    let created = loop {
        let d = deps.get(&d.gateway).await.unwrap();
        if d.status.as_ref().and_then(|s| s.observed_generation) == d.metadata.generation {
            break d;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_conflict(
        call(&backend, &cluster, prepare_op(ns, "agent-d", "rev-d", 1)).await,
        &format!("Deployment {tenant}/{}", d.gateway),
    );
    let after = deps.get(&d.gateway).await.unwrap();
    assert_eq!(resource_version(&after), resource_version(&created));
    assert!(
        after
            .metadata
            .managed_fields
            .unwrap()
            .iter()
            .all(|f| f.manager.as_deref() != Some("clawfleet"))
    );
    let sas: Api<ServiceAccount> = Api::namespaced(client.clone(), &tenant);
    assert!(
        sas.get_opt(&d.gateway).await.unwrap().is_none(),
        "nothing written"
    );

    // A foreign Service.
    let s = names::agent(&id("agent-s"));
    let svcs: Api<Service> = Api::namespaced(client.clone(), &tenant);
    let foreign: Service = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Service", "metadata": foreign_meta(&s.gateway),
        "spec": { "selector": { "app": "intruder" }, "ports": [{ "port": 80 }] },
    }))
    .unwrap();
    let created = svcs.create(&PostParams::default(), &foreign).await.unwrap();
    assert_conflict(
        call(&backend, &cluster, prepare_op(ns, "agent-s", "rev-s", 1)).await,
        &format!("Service {tenant}/{}", s.gateway),
    );
    assert_eq!(
        resource_version(&svcs.get(&s.gateway).await.unwrap()),
        resource_version(&created)
    );
    assert!(
        sas.get_opt(&s.gateway).await.unwrap().is_none(),
        "nothing written"
    );

    // A foreign Secret at the password's name.
    let p = names::agent(&id("agent-p"));
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &tenant);
    let foreign: Secret = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Secret", "metadata": foreign_meta(&p.password),
        "stringData": { "OPENCLAW_GATEWAY_PASSWORD": "intruder" },
    }))
    .unwrap();
    let created = secrets
        .create(&PostParams::default(), &foreign)
        .await
        .unwrap();
    assert_conflict(
        call(&backend, &cluster, prepare_op(ns, "agent-p", "rev-p", 1)).await,
        &format!("Secret {tenant}/{}", p.password),
    );
    assert_eq!(
        resource_version(&secrets.get(&p.password).await.unwrap()),
        resource_version(&created)
    );
    assert!(
        sas.get_opt(&p.gateway).await.unwrap().is_none(),
        "nothing written"
    );

    // A foreign NetworkPolicy at the egress policy's name.
    let e = names::agent(&id("agent-e"));
    let policies: Api<NetworkPolicy> = Api::namespaced(client.clone(), &tenant);
    let foreign: NetworkPolicy = serde_json::from_value(serde_json::json!({
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": foreign_meta(&e.egress),
        "spec": { "podSelector": {}, "policyTypes": ["Egress"], "egress": [{}] },
    }))
    .unwrap();
    let created = policies
        .create(&PostParams::default(), &foreign)
        .await
        .unwrap();
    assert_conflict(
        call(&backend, &cluster, prepare_op(ns, "agent-e", "rev-e", 1)).await,
        &format!("NetworkPolicy {tenant}/{}", e.egress),
    );
    assert_eq!(
        resource_version(&policies.get(&e.egress).await.unwrap()),
        resource_version(&created)
    );
    assert!(
        sas.get_opt(&e.gateway).await.unwrap().is_none(),
        "nothing written"
    );

    // A tampered label on an owned object: deploy agent-t, then change its Deployment's
    // agent label; stop, activate and delete-agent refuse and write nothing.
    deploy(&backend, &cluster, ns, "agent-t", "rev-t", 1).await;
    let t = names::agent(&id("agent-t"));
    let mut dep = deps.get(&t.gateway).await.unwrap();
    dep.metadata
        .labels
        .as_mut()
        .unwrap()
        .insert(names::NAMESPACE_ID.to_owned(), "intruder".to_owned());
    dep.metadata.managed_fields = None;
    let tampered = deps
        .replace(&t.gateway, &PostParams::default(), &dep)
        .await
        .unwrap();
    for op in [
        Operation::StopRevision(rev_args(ns, "agent-t", "rev-t", 1)),
        activate_op(ns, "agent-t", "rev-t", 1),
        delete_agent_op(ns, "agent-t"),
    ] {
        assert_conflict(call(&backend, &cluster, op).await, names::NAMESPACE_ID);
    }
    let after = deps.get(&t.gateway).await.unwrap();
    assert_eq!(resource_version(&after), resource_version(&tampered));
    assert!(
        sas.get_opt(&t.gateway).await.unwrap().is_some(),
        "delete-agent deleted nothing"
    );

    // An owned password Secret that lost its key is replaced, fenced by uid+resourceVersion.
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &tenant);
    call(&backend, &cluster, prepare_op(ns, "agent-u", "rev-u", 1))
        .await
        .unwrap();
    let u = names::agent(&id("agent-u"));
    let mut sec = secrets.get(&u.password).await.unwrap();
    sec.data = None;
    sec.metadata.managed_fields = None;
    let emptied = secrets
        .replace(&u.password, &PostParams::default(), &sec)
        .await
        .unwrap();
    call(&backend, &cluster, prepare_op(ns, "agent-u", "rev-u", 1))
        .await
        .unwrap();
    let replaced = secrets.get(&u.password).await.unwrap();
    assert_eq!(
        replaced.metadata.uid, emptied.metadata.uid,
        "replaced in place, not recreated"
    );
    assert_ne!(resource_version(&replaced), resource_version(&emptied));
    assert_eq!(replaced.data.unwrap()[names::PASSWORD_KEY].0.len(), 64);

    // A revision ConfigMap recreated with copied markers but other content is refused.
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &tenant);
    let cm_name = names::revision_config_map(&id("agent-u"), &id("rev-u"));
    let mut cm = cms.get(&cm_name).await.unwrap();
    cms.delete(&cm_name, &Default::default()).await.unwrap();
    cm.metadata.resource_version = None;
    cm.metadata.uid = None;
    cm.metadata.managed_fields = None;
    cm.metadata.creation_timestamp = None;
    cm.data
        .as_mut()
        .unwrap()
        .insert(names::CONFIG_KEY.to_owned(), "{\"gateway\":{}}".to_owned());
    cms.create(&PostParams::default(), &cm).await.unwrap();
    for op in [
        Operation::VerifyRevision(rev_args(ns, "agent-u", "rev-u", 1)),
        prepare_op(ns, "agent-u", "rev-u", 1),
        activate_op(ns, "agent-u", "rev-u", 1),
    ] {
        let f = call(&backend, &cluster, op).await.unwrap_err();
        assert_eq!(f.code, FailureCode::SnapshotMismatch, "{f}");
    }

    // A tampered Pod Security label on the tenant namespace: ensure-namespace refuses.
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let mut n = namespaces.get(&tenant).await.unwrap();
    n.metadata.labels.as_mut().unwrap().insert(
        "pod-security.kubernetes.io/enforce".to_owned(),
        "privileged".to_owned(),
    );
    n.metadata.managed_fields = None;
    let tampered = namespaces
        .replace(&tenant, &PostParams::default(), &n)
        .await
        .unwrap();
    assert_conflict(
        call(&backend, &cluster, ensure_op(ns)).await,
        "pod-security.kubernetes.io/enforce",
    );
    assert_eq!(
        resource_version(&namespaces.get(&tenant).await.unwrap()),
        resource_version(&tampered)
    );

    // A foreign namespace at a tenant name, and another namespace claiming a Namespace id.
    let foreign_ns: Namespace = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Namespace",
        "metadata": { "name": names::tenant_namespace(&id("ns-squatted")), "labels": { "app": "intruder" } },
    }))
    .unwrap();
    let created = namespaces
        .create(&PostParams::default(), &foreign_ns)
        .await
        .unwrap();
    assert_conflict(
        call(&backend, &cluster, ensure_op("ns-squatted")).await,
        names::MANAGED_BY,
    );
    let after = namespaces
        .get(&names::tenant_namespace(&id("ns-squatted")))
        .await
        .unwrap();
    assert_eq!(resource_version(&after), resource_version(&created));
    let claim: Namespace = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Namespace",
        "metadata": { "name": "someone-else", "labels": { names::NAMESPACE_ID: "ns-claimed" } },
    }))
    .unwrap();
    namespaces
        .create(&PostParams::default(), &claim)
        .await
        .unwrap();
    assert_conflict(
        call(&backend, &cluster, ensure_op("ns-claimed")).await,
        names::NAMESPACE_ID,
    );
    assert!(
        namespaces
            .get_opt(&names::tenant_namespace(&id("ns-claimed")))
            .await
            .unwrap()
            .is_none()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blockers_have_their_codes() {
    skip_unless_control_plane!();
    let cp = start().await;
    let client = cp.client().await.unwrap();
    volumes(&client, 4).await;
    let backend = KubeBackend::new();
    let deadline = Duration::from_secs(40);
    let expect =
        |out: Result<OperationResult, clawfleet_protocol::Failure>, code: FailureCode| match out {
            Err(f) => {
                assert_eq!(f.code, code, "{f}");
                assert!(f.is_retryable());
            }
            Ok(r) => panic!("expected {code}, got {r:?}"),
        };

    // Not ready at the deadline: REVISION_INCOMPLETE (retryable); the retry converges.
    let ok = cluster(&cp, settings());
    call(&backend, &ok, ensure_op("ns-slow")).await.unwrap();
    call(&backend, &ok, prepare_op("ns-slow", "a", "r1", 1))
        .await
        .unwrap();
    expect(
        call_within(
            &backend,
            &ok,
            activate_op("ns-slow", "a", "r1", 1),
            Duration::from_millis(800),
        )
        .await,
        FailureCode::RevisionIncomplete,
    );
    let out = call(&backend, &ok, activate_op("ns-slow", "a", "r1", 1))
        .await
        .unwrap();
    match out {
        OperationResult::ActivateRevision(a) => {
            assert!(!a.restarted, "the retry found the template applied");
            assert_eq!(a.observation.served.as_ref().map(Ident::as_str), Some("r1"));
        }
        other => panic!("{other:?}"),
    }

    // Quota of 0 Pods.
    let mut s = settings();
    s.quota.pods = 0;
    let quota0 = cluster(&cp, s);
    call(&backend, &quota0, ensure_op("ns-quota"))
        .await
        .unwrap();
    call(&backend, &quota0, prepare_op("ns-quota", "a", "r1", 1))
        .await
        .unwrap();
    let t = Instant::now();
    expect(
        call_within(
            &backend,
            &quota0,
            activate_op("ns-quota", "a", "r1", 1),
            deadline,
        )
        .await,
        FailureCode::NamespacePodQuotaExceeded,
    );
    eprintln!(
        "MEASURED NAMESPACE_POD_QUOTA_EXCEEDED after {:.2}s",
        t.elapsed().as_secs_f64()
    );

    // A node selector no node has.
    let mut s = settings();
    s.node_selector
        .insert("clawfleet.dev/pool".to_owned(), "nowhere".to_owned());
    let nowhere = cluster(&cp, s);
    call(&backend, &nowhere, ensure_op("ns-sched"))
        .await
        .unwrap();
    call(&backend, &nowhere, prepare_op("ns-sched", "a", "r1", 1))
        .await
        .unwrap();
    let t = Instant::now();
    expect(
        call_within(
            &backend,
            &nowhere,
            activate_op("ns-sched", "a", "r1", 1),
            deadline,
        )
        .await,
        FailureCode::RevisionUnschedulable,
    );
    eprintln!(
        "MEASURED REVISION_UNSCHEDULABLE after {:.2}s",
        t.elapsed().as_secs_f64()
    );

    // An image that fails to pull.
    let mut s = settings();
    s.gateway_image = format!(
        "registry.invalid/clawfleet/{FAIL_PULL_MARKER}@sha256:{}",
        "2".repeat(64)
    );
    let bad_image = cluster(&cp, s);
    call(&backend, &bad_image, ensure_op("ns-pull"))
        .await
        .unwrap();
    call(&backend, &bad_image, prepare_op("ns-pull", "a", "r1", 1))
        .await
        .unwrap();
    let t = Instant::now();
    expect(
        call_within(
            &backend,
            &bad_image,
            activate_op("ns-pull", "a", "r1", 1),
            deadline,
        )
        .await,
        FailureCode::RevisionImagePullFailed,
    );
    eprintln!(
        "MEASURED REVISION_IMAGE_PULL_FAILED after {:.2}s",
        t.elapsed().as_secs_f64()
    );

    // Status shows the blocked Agent as failed, nothing served.
    match call(&backend, &bad_image, Operation::Status(Default::default()))
        .await
        .unwrap()
    {
        OperationResult::Status(inv) => {
            let nsi = inv
                .namespaces
                .iter()
                .find(|n| n.id.as_str() == "ns-pull")
                .unwrap();
            let unit = nsi.agents[0].observation.unit.clone().unwrap();
            assert_eq!(unit.active_state, "failed");
            assert_eq!(unit.sub_state, "ErrImagePull");
            assert_eq!(nsi.agents[0].observation.served, None);
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_faults_are_unavailable_and_retryable() {
    skip_unless_control_plane!();
    let cp = start().await;
    let client = cp.client().await.unwrap();
    volumes(&client, 2).await;
    let backend = std::sync::Arc::new(KubeBackend::new());
    let proxy = FaultProxy::start(&cp).await.unwrap();
    let via = cluster_via(
        &proxy.kubeconfig(BACKEND_USER, cp.backend_token()),
        settings(),
    );

    // 429 with Retry-After on a read: honoured (the read waits, then succeeds).
    proxy.inject(Fault::too_many_requests(2), 1);
    let t = Instant::now();
    call(&backend, &via, Operation::Status(Default::default()))
        .await
        .unwrap();
    assert!(
        t.elapsed() >= Duration::from_secs(2),
        "Retry-After honoured: {:?}",
        t.elapsed()
    );

    // 503 on every attempt of a read: KUBERNETES_API_UNAVAILABLE, retryable.
    proxy.inject(Fault::service_unavailable(), 10);
    let out = call(&backend, &via, ensure_op("ns-faults")).await;
    proxy.clear_faults();
    let f = out.unwrap_err();
    assert_eq!(f.code, FailureCode::KubernetesApiUnavailable, "{f}");
    assert!(f.is_retryable());

    // 429 on a mutating request: not retried in place; the next call waits for Retry-After.
    call(&backend, &via, ensure_op("ns-faults")).await.unwrap();
    call(&backend, &via, prepare_op("ns-faults", "a", "r1", 1))
        .await
        .unwrap();
    // Activation reads the ServiceAccount's fence, the namespace, five prepared objects, the
    // workspace Secret and the Deployment, then applies the Deployment: the 10th request gets
    // the 429.
    let seen_before = proxy.seen().len();
    proxy.inject(Fault::Delay(Duration::ZERO), 9);
    proxy.inject(Fault::too_many_requests(2), 1);
    let f = call(&backend, &via, activate_op("ns-faults", "a", "r1", 1))
        .await
        .unwrap_err();
    assert_eq!(f.code, FailureCode::KubernetesApiUnavailable, "{f}");
    assert!(f.is_retryable());
    let seen: Vec<_> = proxy.seen().into_iter().skip(seen_before).collect();
    let patches: Vec<_> = seen.iter().filter(|r| r.method == "PATCH").collect();
    assert_eq!(patches.len(), 1, "the apply was sent once: {seen:?}");
    assert!(patches[0].injected, "{seen:?}");
    assert!(
        patches[0].uri.contains("fieldManager=clawfleet"),
        "{}",
        patches[0].uri
    );
    let t = Instant::now();
    let out = call(&backend, &via, activate_op("ns-faults", "a", "r1", 1))
        .await
        .unwrap();
    assert_eq!(served(&out).as_deref(), Some("r1"));
    assert!(
        t.elapsed() >= Duration::from_millis(1500),
        "waited for Retry-After: {:?}",
        t.elapsed()
    );

    // The apiserver killed mid-activation, after the Deployment and Service were applied and
    // while readiness is observed: KUBERNETES_API_UNAVAILABLE (retryable). After the restart
    // the cluster converges by itself (status sees it served, no new write), and the retried
    // activation answers served.
    call(&backend, &via, prepare_op("ns-faults", "b", "r1", 1))
        .await
        .unwrap();
    let seen_before = proxy.seen().len();
    // The fence, namespace, five prepared objects, workspace Secret, Deployment, apply
    // Deployment, apply Service: then the first readiness read is held for 2 s while the
    // apiserver dies.
    proxy.inject(Fault::Delay(Duration::ZERO), 11);
    proxy.inject(Fault::Delay(Duration::from_secs(2)), 1);
    let b2 = std::sync::Arc::clone(&backend);
    let via2 = via.clone();
    let activation = tokio::spawn(async move {
        b2.call(
            &via2,
            activate_op("ns-faults", "b", "r1", 1),
            Duration::from_secs(20),
        )
        .await
    });
    tokio::time::sleep(Duration::from_millis(1000)).await;
    cp.kill_apiserver().unwrap();
    let f = activation.await.unwrap().unwrap_err();
    assert_eq!(f.code, FailureCode::KubernetesApiUnavailable, "{f}");
    assert!(f.is_retryable());
    let seen: Vec<_> = proxy.seen().into_iter().skip(seen_before).collect();
    assert_eq!(
        seen.iter().filter(|r| r.method == "PATCH").count(),
        2,
        "{seen:?}"
    );
    cp.start_apiserver().await.unwrap();
    let direct = cluster(&cp, settings());
    let t = Instant::now();
    loop {
        let inv = match call(&backend, &direct, Operation::Status(Default::default())).await {
            Ok(OperationResult::Status(inv)) => inv,
            other => panic!("{other:?}"),
        };
        let b = inv
            .namespaces
            .iter()
            .flat_map(|n| n.agents.iter())
            .find(|a| a.id.as_str() == "b")
            .unwrap()
            .observation
            .clone();
        if b.served.as_ref().map(Ident::as_str) == Some("r1") {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "converged after the restart: {b:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    eprintln!(
        "MEASURED served again after the apiserver restart (no new write): {:.2}s",
        t.elapsed().as_secs_f64()
    );
    let out = call(&backend, &direct, activate_op("ns-faults", "b", "r1", 1))
        .await
        .unwrap();
    assert_eq!(served(&out).as_deref(), Some("r1"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_racing_the_successors_activation_leaves_the_successor_intact() {
    skip_unless_control_plane!();
    let cp = start().await;
    let client = cp.client().await.unwrap();
    volumes(&client, 2).await;
    let backend = std::sync::Arc::new(KubeBackend::new());
    let proxy = FaultProxy::start(&cp).await.unwrap();
    let via = cluster_via(
        &proxy.kubeconfig(BACKEND_USER, cp.backend_token()),
        settings(),
    );
    let direct = cluster(&cp, settings());
    let ns = "ns-race";
    call(&backend, &direct, ensure_op(ns)).await.unwrap();
    deploy(&backend, &direct, ns, "a", "r1", 1).await;
    call(&backend, &direct, prepare_op(ns, "a", "r2", 2))
        .await
        .unwrap();

    // The predecessor's stop reads the fence, the namespace, the Deployment (still r1) and the
    // Service; its DELETE is held 3 s, while the successor is activated directly.
    proxy.inject(Fault::Delay(Duration::ZERO), 4);
    proxy.inject(Fault::Delay(Duration::from_secs(3)), 1);
    let b2 = std::sync::Arc::clone(&backend);
    let via2 = via.clone();
    let stop = tokio::spawn(async move {
        b2.call(
            &via2,
            Operation::StopRevision(rev_args("ns-race", "a", "r1", 1)),
            DEADLINE,
        )
        .await
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    let out = call(&backend, &direct, activate_op(ns, "a", "r2", 2))
        .await
        .unwrap();
    assert_eq!(served(&out).as_deref(), Some("r2"));
    let f = stop.await.unwrap().unwrap_err();
    assert!(f.is_retryable(), "the precondition's 409 is retryable: {f}");
    assert_eq!(f.code, FailureCode::KubernetesApiRejected, "{f}");
    let deps: Api<Deployment> = Api::namespaced(client.clone(), &names::tenant_namespace(&id(ns)));
    assert_eq!(deployment_revision(&deps, "a").await.as_deref(), Some("r2"));
    // The retried stop sees the successor and deletes nothing.
    match call(
        &backend,
        &direct,
        Operation::StopRevision(rev_args(ns, "a", "r1", 1)),
    )
    .await
    .unwrap()
    {
        OperationResult::StopRevision(s) => {
            assert!(!s.stopped);
            assert_eq!(s.observation.served.as_ref().map(Ident::as_str), Some("r2"));
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(deployment_revision(&deps, "a").await.as_deref(), Some("r2"));
}

/// Restore on a cluster: a candidate whose Pods never become ready (kwok leaves the Pods of a
/// revision named `…never-ready…` Pending) gets half the deadline, then the predecessor's
/// template goes back and serves again, and the answer says so. Without restore the seed's
/// behaviour holds: the candidate stays, not ready, and nothing is claimed served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_candidate_that_never_becomes_ready_is_restored_to_the_predecessors_template() {
    skip_unless_control_plane!();
    let cp = start().await;
    let client = cp.client().await.unwrap();
    volumes(&client, 2).await;
    let backend = KubeBackend::new();
    let c = cluster(&cp, settings());
    let ns = "ns-restore";
    call(&backend, &c, ensure_op(ns)).await.unwrap();
    deploy(&backend, &c, ns, "a", "r1", 1).await;
    let bad = format!("r2-{NEVER_READY_MARKER}");
    call(&backend, &c, prepare_op(ns, "a", &bad, 2))
        .await
        .unwrap();
    let mut args = clawfleet_protocol::operation::ActivateArgs::from(rev_args(ns, "a", &bad, 2));
    args.restore = Some(rev_ref("r1", 1));
    let t = Instant::now();
    let out = call_within(
        &backend,
        &c,
        Operation::ActivateRevision(args),
        Duration::from_secs(40),
    )
    .await
    .unwrap();
    eprintln!(
        "MEASURED restore after a never-ready candidate: {:.2}s",
        t.elapsed().as_secs_f64()
    );
    let OperationResult::ActivateRevision(a) = &out else {
        panic!("{out:?}")
    };
    let restored = a
        .restored
        .as_ref()
        .expect("the answer says what was restored");
    assert_eq!(restored.revision.as_str(), "r1");
    assert_eq!(
        restored.candidate_failure.code,
        FailureCode::RevisionIncomplete,
        "{restored:?}"
    );
    assert_eq!(served(&out).as_deref(), Some("r1"));
    let tenant = names::tenant_namespace(&id(ns));
    let deps: Api<Deployment> = Api::namespaced(client.clone(), &tenant);
    assert_eq!(deployment_revision(&deps, "a").await.as_deref(), Some("r1"));
    let svc: Api<Service> = Api::namespaced(client.clone(), &tenant);
    assert_eq!(
        selector_value(&svc, "a").await,
        names::serving_value(&id("r1"))
    );
    // The candidate's ConfigMap is kept (a later retry or restore may need it).
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &tenant);
    let cm = names::revision_config_map(&id("a"), &id(&bad));
    assert!(cms.get_opt(&cm).await.unwrap().is_some());

    // Without restore: the candidate stays selected, not ready, nothing served.
    let bad3 = format!("r3-{NEVER_READY_MARKER}");
    call(&backend, &c, prepare_op(ns, "a", &bad3, 3))
        .await
        .unwrap();
    match call_within(
        &backend,
        &c,
        activate_op(ns, "a", &bad3, 3),
        Duration::from_secs(15),
    )
    .await
    {
        Err(f) => assert_eq!(f.code, FailureCode::RevisionIncomplete, "{f}"),
        Ok(r) => panic!("a never-ready candidate was activated: {r:?}"),
    }
    assert_eq!(
        deployment_revision(&deps, "a").await.as_deref(),
        Some(bad3.as_str())
    );
}

/// A benchmark, not a timed test (`cargo test -p clawfleet-kube --test control_plane -- --ignored
/// --nocapture bench`): 30 Agents deployed at once through the loopback proxy; prints the time
/// until all are ready and the API requests per Agent deploy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark"]
async fn bench_thirty_agents() {
    skip_unless_control_plane!();
    const AGENTS: usize = 30;
    let cp = start().await;
    let client = cp.client().await.unwrap();
    volumes(&client, AGENTS + 1).await;
    let backend = std::sync::Arc::new(KubeBackend::new());
    let proxy = FaultProxy::start(&cp).await.unwrap();
    let mut s = settings();
    s.quota.pods = 40;
    let via = cluster_via(&proxy.kubeconfig(BACKEND_USER, cp.backend_token()), s);
    call(&backend, &via, ensure_op("ns-bench")).await.unwrap();
    // One Agent alone first: requests of one prepare and one activate.
    let before = proxy.request_count();
    let t = Instant::now();
    b_deploy(&backend, &via, "agent-solo").await;
    eprintln!(
        "BENCH one Agent alone: prepare+activate {:.2}s, {} API requests",
        t.elapsed().as_secs_f64(),
        proxy.request_count() - before
    );
    let before = proxy.request_count();
    let t0 = Instant::now();
    let mut tasks = Vec::new();
    for i in 0..AGENTS {
        let b = std::sync::Arc::clone(&backend);
        let c = via.clone();
        tasks.push(tokio::spawn(async move {
            let agent = format!("agent-{i}");
            let t = Instant::now();
            b.call(&c, prepare_op("ns-bench", &agent, "r1", 1), DEADLINE)
                .await
                .unwrap();
            match b
                .call(
                    &c,
                    activate_op("ns-bench", &agent, "r1", 1),
                    Duration::from_secs(120),
                )
                .await
                .unwrap()
            {
                OperationResult::ActivateRevision(a) => assert!(a.observation.served.is_some()),
                other => panic!("{other:?}"),
            }
            t.elapsed()
        }));
    }
    let mut each = Vec::new();
    for t in tasks {
        each.push(t.await.unwrap());
    }
    let all = t0.elapsed();
    let requests = proxy.request_count() - before;
    each.sort();
    eprintln!(
        "BENCH {AGENTS} Agents deployed at once: all ready after {:.2}s; per Agent prepare+activate median {:.2}s, max {:.2}s; {} API requests, {:.1} per Agent deploy",
        all.as_secs_f64(),
        each[AGENTS / 2].as_secs_f64(),
        each[AGENTS - 1].as_secs_f64(),
        requests,
        requests as f64 / AGENTS as f64
    );
}

/// A client certificate signed by the run's CA, in group system:masters.
fn client_certificate(cp: &clawfleet_k8s_tests::ControlPlane) -> (String, String) {
    use rcgen::{
        BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer,
        KeyPair, KeyUsagePurpose,
    };
    let ca_key = KeyPair::from_pem(&cp.pki().ca.key_pem).unwrap();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "clawfleet-k8s-tests CA");
    let issuer = Issuer::new(ca_params, ca_key);
    let key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params
        .distinguished_name
        .push(DnType::CommonName, "clawfleet-cert-user");
    params
        .distinguished_name
        .push(DnType::OrganizationName, "system:masters");
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    let cert = params.signed_by(&key, &issuer).unwrap();
    (cert.pem(), key.serialize_pem())
}

fn kubeconfig_with(server: &str, ca_pem: &str, user: serde_json::Value) -> String {
    use base64::Engine as _;
    serde_json::json!({
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{ "name": "c", "cluster": {
            "server": server,
            "certificate-authority-data": base64::engine::general_purpose::STANDARD.encode(ca_pem),
        } }],
        "users": [{ "name": "u", "user": user }],
        "contexts": [{ "name": "x", "context": { "cluster": "c", "user": "u" } }],
        "current-context": "x",
    })
    .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credentials_are_checked_end_to_end() {
    use base64::Engine as _;
    skip_unless_control_plane!();
    let cp = start().await;
    let backend = KubeBackend::new();
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);

    // A client certificate works like a token.
    let (cert, key) = client_certificate(&cp);
    let kc = kubeconfig_with(
        &cp.api_url(),
        cp.ca_pem(),
        serde_json::json!({ "client-certificate-data": b64(&cert), "client-key-data": b64(&key) }),
    );
    let by_cert = cluster_via(&kc, settings());
    backend.probe_cluster(&by_cert).await.unwrap();
    call(&backend, &by_cert, ensure_op("ns-cert"))
        .await
        .unwrap();

    // Another CA: the server's certificate does not verify; permanent, not an outage.
    let other_ca = rcgen::generate_simple_self_signed(vec!["other".to_owned()]).unwrap();
    let kc = kubeconfig_with(
        &cp.api_url(),
        &other_ca.cert.pem(),
        serde_json::json!({ "token": cp.backend_token() }),
    );
    let mut wrong_ca = cluster_via(&kc, settings());
    wrong_ca.name = "wrong-ca".to_owned();
    let f = call(&backend, &wrong_ca, Operation::Probe(Default::default()))
        .await
        .unwrap_err();
    assert_eq!(f.code, FailureCode::KubernetesConfigurationInvalid, "{f}");
    assert!(!f.is_retryable());

    // A token the server does not know: 401, permanent; for ensure-namespace retryable (the
    // coordinator keeps retrying it, so fixing the credentials recovers the Namespace).
    let kc = kubeconfig_with(
        &cp.api_url(),
        cp.ca_pem(),
        serde_json::json!({ "token": "not-a-token" }),
    );
    let mut bad_token = cluster_via(&kc, settings());
    bad_token.name = "bad-token".to_owned();
    let f = call(&backend, &bad_token, Operation::Status(Default::default()))
        .await
        .unwrap_err();
    assert_eq!(f.code, FailureCode::KubernetesApiRejected, "{f}");
    assert!(!f.is_retryable());
    assert!(!f.message.contains("not-a-token"), "{f}");
    let f = call(&backend, &bad_token, ensure_op("ns-x"))
        .await
        .unwrap_err();
    assert_eq!(f.code, FailureCode::KubernetesApiRejected, "{f}");
    assert!(f.is_retryable(), "{f}");
    assert!(!f.message.contains("not-a-token"), "{f}");

    // A user without RBAC: 403, nothing created; retryable for ensure-namespace (granting
    // the rights later recovers the Namespace).
    let limited =
        clawfleet_kube::parse_kubeconfig_file(cp.limited_kubeconfig_path(), None).unwrap();
    let limited = clawfleet_kube::Cluster {
        name: "limited".to_owned(),
        credentials: limited,
        settings: settings(),
    };
    let f = call(&backend, &limited, ensure_op("ns-limited"))
        .await
        .unwrap_err();
    assert_eq!(f.code, FailureCode::KubernetesApiRejected, "{f}");
    assert!(f.message.contains("403"), "{f}");
    assert!(f.is_retryable(), "{f}");
    let namespaces: Api<Namespace> = Api::all(cp.client().await.unwrap());
    assert!(
        namespaces
            .get_opt(&names::tenant_namespace(&id("ns-limited")))
            .await
            .unwrap()
            .is_none()
    );
}

async fn b_deploy(backend: &KubeBackend, c: &clawfleet_kube::Cluster, agent: &str) {
    backend
        .call(c, prepare_op("ns-bench", agent, "r1", 1), DEADLINE)
        .await
        .unwrap();
    backend
        .call(c, activate_op("ns-bench", agent, "r1", 1), DEADLINE)
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_adopted_namespace_is_claimed_checked_and_released() {
    skip_unless_control_plane!();
    let cp = start().await;
    let client = cp.client().await.unwrap();
    volumes(&client, 2).await;
    let backend = KubeBackend::new();
    let mut s = settings();
    s.adopted_namespaces
        .insert("ns-adopt".to_owned(), "team-adopted".to_owned());
    let cluster = cluster(&cp, s);
    let ns = "ns-adopt";
    let name = "team-adopted";
    let namespaces: Api<Namespace> = Api::all(client.clone());

    // Absent: never created by clawfleet.
    let f = call(&backend, &cluster, ensure_op(ns)).await.unwrap_err();
    assert_eq!(f.code, FailureCode::NamespaceMissing, "{f}");
    assert!(namespaces.get_opt(name).await.unwrap().is_none());

    // Not restricted under Pod Security: refused, nothing written.
    let created = namespaces
        .create(
            &PostParams::default(),
            &serde_json::from_value(serde_json::json!({
                "apiVersion": "v1", "kind": "Namespace",
                "metadata": { "name": name, "labels": { "team": "a" } },
            }))
            .unwrap(),
        )
        .await
        .unwrap();
    assert_conflict(
        call(&backend, &cluster, ensure_op(ns)).await,
        "pod-security.kubernetes.io/enforce",
    );
    assert_eq!(
        resource_version(&namespaces.get(name).await.unwrap()),
        resource_version(&created)
    );

    // Restricted, but holding a NetworkPolicy that is not ours: refused.
    let mut n = namespaces.get(name).await.unwrap();
    n.metadata.labels.as_mut().unwrap().insert(
        "pod-security.kubernetes.io/enforce".to_owned(),
        "restricted".to_owned(),
    );
    n.metadata.managed_fields = None;
    let restricted = namespaces
        .replace(name, &PostParams::default(), &n)
        .await
        .unwrap();
    let policies: Api<NetworkPolicy> = Api::namespaced(client.clone(), name);
    let open: NetworkPolicy = serde_json::from_value(serde_json::json!({
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
        "metadata": { "name": "operator-allow-all" },
        "spec": { "podSelector": {}, "policyTypes": ["Ingress"], "ingress": [{}] },
    }))
    .unwrap();
    policies
        .create(&PostParams::default(), &open)
        .await
        .unwrap();
    assert_conflict(
        call(&backend, &cluster, ensure_op(ns)).await,
        "NetworkPolicy team-adopted/operator-allow-all",
    );
    assert_eq!(
        resource_version(&namespaces.get(name).await.unwrap()),
        resource_version(&restricted)
    );
    policies
        .delete("operator-allow-all", &Default::default())
        .await
        .unwrap();

    // Adopted: claimed with clawfleet's markers only; the operator's objects stay.
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), name);
    let mine: ConfigMap = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": { "name": "operator-data" }, "data": { "k": "v" },
    }))
    .unwrap();
    cms.create(&PostParams::default(), &mine).await.unwrap();
    match call(&backend, &cluster, ensure_op(ns)).await.unwrap() {
        OperationResult::EnsureNamespace(e) => assert!(e.created),
        other => panic!("{other:?}"),
    }
    match call(&backend, &cluster, ensure_op(ns)).await.unwrap() {
        OperationResult::EnsureNamespace(e) => assert!(!e.created),
        other => panic!("{other:?}"),
    }
    let labels = namespaces.get(name).await.unwrap().metadata.labels.unwrap();
    assert_eq!(labels[names::NAMESPACE_ID], ns);
    assert_eq!(labels[names::ADOPTED], "true");
    assert!(
        !labels.contains_key(names::MANAGED_BY),
        "the namespace stays the operator's"
    );
    assert_eq!(labels["team"], "a");
    assert!(
        namespaces
            .get_opt(&names::tenant_namespace(&id(ns)))
            .await
            .unwrap()
            .is_none(),
        "no managed namespace"
    );
    deploy(&backend, &cluster, ns, "agent-1", "r1", 1).await;
    match call(&backend, &cluster, Operation::Status(Default::default()))
        .await
        .unwrap()
    {
        OperationResult::Status(inv) => {
            assert!(inv.problems.is_empty(), "{:?}", inv.problems);
            let nsi = inv.namespaces.iter().find(|n| n.id.as_str() == ns).unwrap();
            assert_eq!(
                nsi.agents[0].observation.served.as_ref().map(Ident::as_str),
                Some("r1")
            );
        }
        other => panic!("{other:?}"),
    }

    // Deleting the Namespace removes only what clawfleet owns, then the claim.
    match call(&backend, &cluster, delete_ns_op(ns)).await.unwrap() {
        OperationResult::DeleteNamespace(d) => {
            assert!(d.removed);
            assert_eq!(d.agents_removed, 1);
        }
        other => panic!("{other:?}"),
    }
    let n = namespaces.get(name).await.unwrap();
    assert!(
        n.metadata.deletion_timestamp.is_none(),
        "the namespace stays"
    );
    let labels = n.metadata.labels.unwrap();
    assert!(!labels.contains_key(names::NAMESPACE_ID), "claim released");
    assert!(!labels.contains_key(names::ADOPTED));
    assert_eq!(labels["pod-security.kubernetes.io/enforce"], "restricted");
    assert!(cms.get_opt("operator-data").await.unwrap().is_some());
    let ours = ListParams::default().labels(&format!("{}=clawfleet", names::MANAGED_BY));
    let deps: Api<Deployment> = Api::namespaced(client.clone(), name);
    assert!(deps.list(&ours).await.unwrap().items.is_empty());
    assert!(cms.list(&ours).await.unwrap().items.is_empty());
    assert!(policies.list(&ours).await.unwrap().items.is_empty());
    let sas: Api<ServiceAccount> = Api::namespaced(client.clone(), name);
    assert!(sas.list(&ours).await.unwrap().items.is_empty());
    let quotas: Api<ResourceQuota> = Api::namespaced(client.clone(), name);
    assert!(quotas.list(&ours).await.unwrap().items.is_empty());
    match call(&backend, &cluster, delete_ns_op(ns)).await.unwrap() {
        OperationResult::DeleteNamespace(d) => assert!(!d.removed),
        other => panic!("{other:?}"),
    }
}

/// The files called `name` under `dir`, at any depth.
fn files_named(dir: &std::path::Path, name: &str) -> Vec<std::path::PathBuf> {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let p = e.path();
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                stack.push(p);
            } else if e.file_name() == name {
                found.push(p);
            }
        }
    }
    found
}

/// A prepare of `rev` carrying two workspace files (with their contents, or the manifest only).
fn prepare_with_workspace(ns: &str, agent: &str, rev: &str, number: u64, held: bool) -> Operation {
    use clawfleet_protocol::workspace::{WorkspaceFile, WorkspaceName, WorkspaceSetup};
    let files = vec![
        WorkspaceFile {
            name: WorkspaceName::new("AGENTS.md").unwrap(),
            content: b"# agents ws-content-marker\n".to_vec(),
        },
        WorkspaceFile {
            name: WorkspaceName::new("memory/notes.md").unwrap(),
            content: b"note\n".to_vec(),
        },
    ];
    let Operation::PrepareRevision(mut args) = prepare_op(ns, agent, rev, number) else {
        unreachable!()
    };
    args.workspace = Some(WorkspaceSetup {
        manifest: files.iter().map(WorkspaceFile::meta).collect(),
        files: held.then_some(files),
    });
    Operation::PrepareRevision(args)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workspace_files_go_through_a_secret_and_an_init_container_and_leave_the_cluster() {
    workspace_files(Tier::Kwok).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workspace_files_go_through_an_init_container_on_the_real_node() {
    workspace_files(Tier::RealNode).await;
}

/// Workspace files staged in a Secret, written by the init container, dropped from the
/// cluster once the Pod is Ready. On the real node the init container really runs (the
/// gateway's readiness waits for it), and the files it wrote are read back from the volume.
async fn workspace_files(tier: Tier) {
    let Some(cp) = start_tier(tier).await else {
        return;
    };
    let client = cp.client().await.unwrap();
    tier_volumes(&cp, &client, 1).await;
    let backend = KubeBackend::new();
    let c = cluster(&cp, tier_settings(&cp));
    let ns = "ns-workspace";
    call(&backend, &c, ensure_op(ns)).await.unwrap();
    let tenant = names::tenant_namespace(&id(ns));
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &tenant);
    let deps: Api<Deployment> = Api::namespaced(client.clone(), &tenant);
    let name = names::agent(&id("a")).workspace;

    // Prepare stages the files in the Agent's workspace Secret and says so.
    let out = call(&backend, &c, prepare_with_workspace(ns, "a", "r1", 1, true))
        .await
        .unwrap();
    let OperationResult::PrepareRevision(p) = &out else {
        panic!("{out:?}")
    };
    assert_eq!(
        p.workspace,
        Some(clawfleet_protocol::result::WorkspaceOutcome::Staged)
    );
    let s = secrets.get(&name).await.unwrap();
    let keys: Vec<&String> = s.data.as_ref().unwrap().keys().collect();
    assert_eq!(keys, ["f00", "f01", "manifest.json"]);
    assert_eq!(
        s.metadata.annotations.as_ref().unwrap()["clawfleet.dev/workspace-contents"],
        "held"
    );
    // Activation: the Pod first runs the init container with the files at their names.
    match call(&backend, &c, activate_op(ns, "a", "r1", 1)).await {
        Ok(OperationResult::ActivateRevision(a)) => {
            assert_eq!(a.observation.served.as_ref().map(Ident::as_str), Some("r1"));
        }
        other => panic!("activate: {other:?}"),
    }
    let d = serde_json::to_value(deps.get(&names::agent(&id("a")).gateway).await.unwrap()).unwrap();
    let pod = &d["spec"]["template"]["spec"];
    assert_eq!(
        pod["initContainers"][0]["name"], "initialize-workspace",
        "{pod:#}"
    );
    let script = pod["initContainers"][0]["command"][2].as_str().unwrap();
    assert!(
        script.contains("memory/notes.md") && script.contains("set -C"),
        "{script}"
    );
    assert!(
        !script.contains("ws-content-marker"),
        "the script holds content"
    );
    let vol = pod["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "workspace-setup")
        .unwrap();
    assert_eq!(vol["secret"]["items"][1]["path"], "memory/notes.md");
    assert_eq!(vol["secret"]["optional"], true);
    // On the real node the init container really ran: the files are on the state volume.
    if let Some(node) = cp.node() {
        let volumes = node.record().run_dir.join("volumes");
        let found = files_named(&volumes, "AGENTS.md");
        assert_eq!(found.len(), 1, "AGENTS.md on the node's volumes: {found:?}");
        assert_eq!(
            std::fs::read(&found[0]).unwrap(),
            b"# agents ws-content-marker\n"
        );
        let notes = found[0].parent().unwrap().join("memory/notes.md");
        assert_eq!(
            std::fs::read(&notes).unwrap(),
            b"note\n",
            "{}",
            notes.display()
        );
    }
    // Ready: the contents leave the cluster, the manifest stays.
    let s = secrets.get(&name).await.unwrap();
    let keys: Vec<&String> = s.data.as_ref().unwrap().keys().collect();
    assert_eq!(keys, ["manifest.json"]);
    assert_eq!(
        s.metadata.annotations.as_ref().unwrap()["clawfleet.dev/workspace-contents"],
        "dropped"
    );
    // A later revision carries the manifest only: the Secret stays as it is, the Pod still
    // runs the init container (which finds its marker on the volume and writes nothing).
    let rv = s.metadata.resource_version.clone();
    call(
        &backend,
        &c,
        prepare_with_workspace(ns, "a", "r2", 2, false),
    )
    .await
    .unwrap();
    call(&backend, &c, activate_op(ns, "a", "r2", 2))
        .await
        .unwrap();
    assert_eq!(
        secrets.get(&name).await.unwrap().metadata.resource_version,
        rv
    );
    let d = serde_json::to_value(deps.get(&names::agent(&id("a")).gateway).await.unwrap()).unwrap();
    assert_eq!(
        d["spec"]["template"]["spec"]["initContainers"][0]["name"],
        "initialize-workspace"
    );
    // Deleting the Agent deletes its workspace Secret.
    call(&backend, &c, delete_agent_op(ns, "a")).await.unwrap();
    assert!(secrets.get_opt(&name).await.unwrap().is_none());
    cp.finish("workspace files").await.unwrap();
}

/// Fencing as on hosts: the Agent's ServiceAccount keeps the highest fence; a lower one and
/// an unfenced operation are refused with FENCE_STALE before anything is written; the
/// Agent's own re-apply of its ServiceAccount keeps the record; a malformed record is named.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_fence_is_refused_before_any_write() {
    skip_unless_control_plane!();
    let cp = start().await;
    let client = cp.client().await.unwrap();
    volumes(&client, 2).await;
    let c = cluster(&cp, settings());
    let backend = KubeBackend::new();
    let ns = "ns-fence";
    let tenant = names::tenant_namespace(&id(ns));
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), &tenant);
    let deps: Api<Deployment> = Api::namespaced(client.clone(), &tenant);
    let sa_name = names::agent(&id("a")).gateway;
    let fenced = |op: Operation, fence: Option<u64>| {
        let backend = &backend;
        let c = &c;
        async move { backend.call_fenced(c, op, DEADLINE, fence).await }
    };
    let recorded = || async {
        accounts
            .get(&sa_name)
            .await
            .unwrap()
            .metadata
            .annotations
            .unwrap_or_default()
            .get(names::FENCE)
            .cloned()
    };
    call(&backend, &c, ensure_op(ns)).await.unwrap();
    // An Agent never fenced: unfenced operations work (a coordinator from before fencing).
    deploy(&backend, &c, ns, "a", "r1", 1).await;
    assert_eq!(recorded().await, None);
    fenced(prepare_op(ns, "a", "r2", 2), Some(5)).await.unwrap();
    assert_eq!(recorded().await.as_deref(), Some("5"));
    // A lower fence, then no fence: refused, and the Deployment still runs r1.
    let before = resource_version(&deps.get(&sa_name).await.unwrap());
    for fence in [Some(4), None] {
        let f = fenced(activate_op(ns, "a", "r2", 2), fence)
            .await
            .unwrap_err();
        assert_eq!(f.code, FailureCode::FenceStale, "{f}");
        assert!(f.message.contains("fenced at 5"), "{f}");
    }
    assert_eq!(resource_version(&deps.get(&sa_name).await.unwrap()), before);
    assert_eq!(deployment_revision(&deps, "a").await.as_deref(), Some("r1"));
    // The same fence again, then a higher one: accepted; the prepare's own apply of the
    // ServiceAccount leaves the record alone.
    fenced(prepare_op(ns, "a", "r2", 2), Some(5)).await.unwrap();
    let out = fenced(activate_op(ns, "a", "r2", 2), Some(6))
        .await
        .unwrap();
    assert_eq!(served(&out).as_deref(), Some("r2"));
    fenced(prepare_op(ns, "a", "r3", 3), Some(6)).await.unwrap();
    assert_eq!(recorded().await.as_deref(), Some("6"));
    // A malformed record is named, and nothing is written.
    let mut sa = accounts.get(&sa_name).await.unwrap();
    sa.metadata
        .annotations
        .get_or_insert_default()
        .insert(names::FENCE.to_owned(), "six".to_owned());
    accounts
        .replace(&sa_name, &PostParams::default(), &sa)
        .await
        .unwrap();
    let f = fenced(activate_op(ns, "a", "r3", 3), Some(7))
        .await
        .unwrap_err();
    assert!(
        f.message.contains(names::FENCE) && f.message.contains("six"),
        "{f}"
    );
    assert_eq!(deployment_revision(&deps, "a").await.as_deref(), Some("r2"));
}

/// Issue 27 item 1: a stop named after a revision that never reached the Deployment (its
/// activation was refused before the apply: an admission policy, an ownership conflict) stops
/// what runs, the predecessor, instead of answering "nothing to stop" while it keeps serving.
/// A Deployment carrying a newer revision still stays (the successor race above).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_of_a_candidate_that_never_ran_stops_the_revision_that_runs() {
    skip_unless_control_plane!();
    let cp = start().await;
    let client = cp.client().await.unwrap();
    volumes(&client, 1).await;
    let backend = KubeBackend::new();
    let c = cluster(&cp, settings());
    let ns = "ns-stop-candidate";
    call(&backend, &c, ensure_op(ns)).await.unwrap();
    deploy(&backend, &c, ns, "a", "r1", 1).await;
    // r2 is prepared; its activation never happened.
    call(&backend, &c, prepare_op(ns, "a", "r2", 2))
        .await
        .unwrap();
    let out = call(
        &backend,
        &c,
        Operation::StopRevision(rev_args(ns, "a", "r2", 2)),
    )
    .await
    .unwrap();
    let OperationResult::StopRevision(s) = &out else {
        panic!("{out:?}")
    };
    assert!(s.stopped, "the running predecessor was stopped: {s:?}");
    assert_eq!(s.observation.served, None, "{s:?}");
    assert_eq!(s.observation.unit, None, "{s:?}");
    let tenant = names::tenant_namespace(&id(ns));
    let deps: Api<Deployment> = Api::namespaced(client.clone(), &tenant);
    assert_eq!(deployment_revision(&deps, "a").await, None);
    let svc: Api<Service> = Api::namespaced(client.clone(), &tenant);
    assert_eq!(selector_value(&svc, "a").await, names::INACTIVE);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &tenant);
    assert!(
        pods.list(&ListParams::default())
            .await
            .unwrap()
            .items
            .is_empty(),
        "no Pod of the Agent is left"
    );
    // Repeatable: nothing left to stop.
    match call(
        &backend,
        &c,
        Operation::StopRevision(rev_args(ns, "a", "r2", 2)),
    )
    .await
    .unwrap()
    {
        OperationResult::StopRevision(s) => assert!(!s.stopped, "{s:?}"),
        other => panic!("{other:?}"),
    }
}

/// Issue 27 item 2: a 403 right after the connection to the API server broke (as a restarted
/// apiserver answers before its RBAC caches are filled) is retried, not a permanent refusal
/// of the deploy; the same 403 from a client with no such history stays permanent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_right_after_a_connection_error_is_retried() {
    skip_unless_control_plane!();
    let cp = start().await;
    let proxy = FaultProxy::start(&cp).await.unwrap();
    let via = cluster_via(
        &proxy.kubeconfig(BACKEND_USER, cp.backend_token()),
        settings(),
    );
    let forbidden = Fault::Respond {
        status: 403,
        headers: Vec::new(),
        body: serde_json::json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": "namespaces is forbidden: User \"admin\" cannot list resource (injected)",
            "reason": "Forbidden", "code": 403,
        })
        .to_string(),
    };

    // A fresh client whose first answer is a 403: permanent.
    let backend = KubeBackend::new();
    proxy.inject(forbidden.clone(), 1);
    let f = call(&backend, &via, Operation::Status(Default::default()))
        .await
        .unwrap_err();
    proxy.clear_faults();
    assert_eq!(f.code, FailureCode::KubernetesApiRejected, "{f}");
    assert!(!f.is_retryable(), "{f}");
    let status = call(&backend, &via, Operation::Status(Default::default())).await;
    assert!(status.is_ok(), "{status:?}");

    // The connection drops, then the restarted server refuses once: the read is retried and
    // the operation succeeds.
    let backend = KubeBackend::new();
    call(&backend, &via, ensure_op("ns-auth")).await.unwrap();
    proxy.inject(Fault::Drop, 1);
    proxy.inject(forbidden.clone(), 1);
    let out = call(&backend, &via, ensure_op("ns-auth")).await;
    proxy.clear_faults();
    assert!(
        out.is_ok(),
        "a 403 after a dropped connection is retried: {out:?}"
    );

    // Refused on every attempt within the window: retryable, not a permanent refusal.
    proxy.inject(Fault::Drop, 1);
    proxy.inject(forbidden, 5);
    let f = call(&backend, &via, Operation::Status(Default::default()))
        .await
        .unwrap_err();
    proxy.clear_faults();
    assert!(f.is_retryable(), "{f}");
    assert_eq!(f.code, FailureCode::KubernetesApiUnavailable, "{f}");
    assert!(f.message.contains("403"), "{f}");
}

/// Issue 27 item 4: a Pod template edited behind clawfleet's back (a sidecar injected, the
/// gateway's command replaced) is reported by status as the Agent's workload drift, and a
/// reconcile (the active revision activated again) restores the template exactly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_edited_pod_template_is_reported_and_restored_by_a_reconcile() {
    edited_pod_template(Tier::Kwok).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_edited_pod_template_is_restored_on_the_real_node() {
    edited_pod_template(Tier::RealNode).await;
}

/// The drift body: on the real node the edited template really rolls out (a Pod whose gateway
/// sleeps, never Ready) and the reconcile brings a Ready gateway back.
async fn edited_pod_template(tier: Tier) {
    let Some(cp) = start_tier(tier).await else {
        return;
    };
    let client = cp.client().await.unwrap();
    tier_volumes(&cp, &client, 1).await;
    let backend = KubeBackend::new();
    let c = cluster(&cp, tier_settings(&cp));
    let ns = "ns-edited";
    call(&backend, &c, ensure_op(ns)).await.unwrap();
    deploy(&backend, &c, ns, "a", "r1", 1).await;
    let tenant = names::tenant_namespace(&id(ns));
    let deps: Api<Deployment> = Api::namespaced(client.clone(), &tenant);
    let gw = names::agent(&id("a")).gateway;
    let workload_problems = |out: OperationResult| match out {
        OperationResult::Status(inv) => inv
            .problems
            .into_iter()
            .filter(|p| p.path == format!("namespaces/{ns}/agents/a/workload"))
            .map(|p| p.message)
            .collect::<Vec<_>>(),
        other => panic!("{other:?}"),
    };
    let status = call(&backend, &c, Operation::Status(Default::default()))
        .await
        .unwrap();
    assert_eq!(workload_problems(status), Vec::<String>::new());

    // A foreign edit through the API (as `kubectl edit` does): a sidecar, another command.
    let mut d = deps.get(&gw).await.unwrap();
    let spec = d.spec.template.spec.as_mut().unwrap();
    spec.containers[0].command = Some(vec!["sh".into(), "-c".into(), "sleep 1d".into()]);
    let mut sidecar = spec.containers[0].clone();
    sidecar.name = "sidecar".into();
    sidecar.ports = None;
    sidecar.readiness_probe = None;
    spec.containers.push(sidecar);
    deps.replace(&gw, &PostParams::default(), &d).await.unwrap();

    let status = call(&backend, &c, Operation::Status(Default::default()))
        .await
        .unwrap();
    let problems = workload_problems(status);
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(
        problems[0].contains("container sidecar was added"),
        "{problems:?}"
    );
    assert!(
        problems[0].contains("container gateway: command changed"),
        "{problems:?}"
    );

    // The reconcile: the active revision again (retried as the worker would: the deployment
    // controller may update the edited object between the backend's read and its replace).
    let out = call_retrying(&backend, &c, activate_op(ns, "a", "r1", 1))
        .await
        .unwrap();
    assert_eq!(served(&out).as_deref(), Some("r1"));
    let d = deps.get(&gw).await.unwrap();
    let spec = d.spec.template.spec.unwrap();
    let containers: Vec<_> = spec.containers.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(containers, vec![names::CONTAINER], "the sidecar is gone");
    assert_eq!(
        spec.containers[0].command.as_ref(),
        Some(&c.settings.gateway_command),
        "the command is clawfleet's again"
    );
    let status = call(&backend, &c, Operation::Status(Default::default()))
        .await
        .unwrap();
    assert_eq!(workload_problems(status), Vec::<String>::new());
    cp.finish("edited Pod template").await.unwrap();
}

/// Issue 27 item 5: objects clawfleet never made, at names clawfleet computes, neither wedge
/// a delete nor are touched by it; a pre-made namespace carrying clawfleet's labels gets the
/// adoption's NetworkPolicy check.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreign_objects_at_computed_names_are_left_alone_and_deletes_complete() {
    skip_unless_control_plane!();
    let cp = start().await;
    let client = cp.client().await.unwrap();
    let backend = KubeBackend::new();
    let c = cluster(&cp, settings());

    // An Agent that never ran, whose ServiceAccount name a foreign ServiceAccount holds.
    let ns = "ns-foreign";
    call(&backend, &c, ensure_op(ns)).await.unwrap();
    let tenant = names::tenant_namespace(&id(ns));
    let sas: Api<ServiceAccount> = Api::namespaced(client.clone(), &tenant);
    let gw = names::agent(&id("a")).gateway;
    let foreign: ServiceAccount = serde_json::from_value(serde_json::json!({
        "metadata": { "name": gw, "labels": { "team": "someone-else" } },
    }))
    .unwrap();
    let made = sas.create(&PostParams::default(), &foreign).await.unwrap();
    match call(&backend, &c, delete_agent_op(ns, "a")).await {
        Ok(OperationResult::DeleteAgent(d)) => assert!(!d.removed, "{d:?}"),
        other => panic!("the delete completes: {other:?}"),
    }
    let after = sas.get(&gw).await.unwrap();
    assert_eq!(after.metadata.uid, made.metadata.uid, "left untouched");
    assert_eq!(resource_version(&after), resource_version(&made));

    // A namespace at another Namespace's computed name, made by someone else: the deletion
    // completes without touching it.
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let taken = names::tenant_namespace(&id("ns-taken"));
    let ns_obj: Namespace = serde_json::from_value(serde_json::json!({
        "metadata": { "name": taken, "labels": { "team": "someone-else" } },
    }))
    .unwrap();
    namespaces
        .create(&PostParams::default(), &ns_obj)
        .await
        .unwrap();
    match call(&backend, &c, delete_ns_op("ns-taken")).await {
        Ok(OperationResult::DeleteNamespace(d)) => assert!(!d.removed, "{d:?}"),
        other => panic!("the delete completes: {other:?}"),
    }
    let still = namespaces.get(&taken).await.unwrap();
    assert!(still.metadata.deletion_timestamp.is_none());

    // A pre-made namespace with clawfleet's labels and annotations and a foreign policy
    // that opens it: refused as an adoption would be.
    let premade = "ns-premade";
    let pre = names::tenant_namespace(&id(premade));
    let mut ns_obj = Namespace::default();
    ns_obj.metadata.name = Some(pre.clone());
    ns_obj.metadata.labels = Some(
        [
            (names::MANAGED_BY, names::MANAGER),
            (names::NAMESPACE_ID, premade),
            ("pod-security.kubernetes.io/enforce", "restricted"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect(),
    );
    ns_obj.metadata.annotations = Some(
        [
            (names::NAMESPACE_ID, premade),
            (names::NAMESPACE_NAME, premade),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect(),
    );
    namespaces
        .create(&PostParams::default(), &ns_obj)
        .await
        .unwrap();
    let policies: Api<NetworkPolicy> = Api::namespaced(client.clone(), &pre);
    let open: NetworkPolicy = serde_json::from_value(serde_json::json!({
        "metadata": { "name": "allow-everything" },
        "spec": { "podSelector": {}, "ingress": [{}], "policyTypes": ["Ingress"] },
    }))
    .unwrap();
    policies
        .create(&PostParams::default(), &open)
        .await
        .unwrap();
    assert_conflict(
        call(&backend, &c, ensure_op(premade)).await,
        &format!("NetworkPolicy {pre}/allow-everything"),
    );
    assert!(
        policies
            .get_opt(names::DEFAULT_DENY)
            .await
            .unwrap()
            .is_none(),
        "nothing written"
    );
}

/// The host-rendered configuration of a revision binding secret `slack-bot` (what the
/// coordinator's `bind_secrets` produces), identical for every revision carrying `marker`.
fn secret_spec(
    rev: &str,
    number: u64,
    marker: &str,
) -> clawfleet_protocol::operation::RevisionSpec {
    let configuration = clawfleet_protocol::Configuration::new(serde_json::json!({
        "gateway": {
            "mode": "local", "bind": "loopback",
            "auth": { "mode": "password",
                      "password": { "source": "env", "provider": "default", "id": "OPENCLAW_GATEWAY_PASSWORD" } },
        },
        "agents": { "defaults": { "description": marker } },
        "channels": { "slack": { "botToken":
            { "source": "file", "provider": "clawfleet-slack-bot", "id": "value" } } },
        "secrets": { "providers": { "clawfleet-slack-bot":
            { "source": "file", "path": "/run/clawfleet/secrets/slack-bot", "mode": "singleValue" } } },
    }))
    .unwrap();
    let mut s = spec(rev, number);
    s.configuration_hash = configuration.hash();
    s.configuration = configuration;
    s
}

fn secret_prepare(
    ns: &str,
    agent: &str,
    spec: clawfleet_protocol::operation::RevisionSpec,
) -> Operation {
    Operation::PrepareRevision(clawfleet_protocol::operation::PrepareArgs {
        workspace: None,
        namespace: ns_ref(ns),
        agent: agent_ref(agent),
        revision: spec,
        egress: None,
    })
}

fn secret_activate(
    ns: &str,
    agent: &str,
    spec: &clawfleet_protocol::operation::RevisionSpec,
) -> Operation {
    Operation::ActivateRevision(
        clawfleet_protocol::operation::RevisionArgs {
            namespace: ns_ref(ns),
            agent: agent_ref(agent),
            revision: spec.reference(),
        }
        .into(),
    )
}

fn secret_set(ns: &str, agent: &str, values: &[(&str, u64, &str)]) -> clawfleet_kube::AgentSecrets {
    clawfleet_kube::AgentSecrets {
        namespace: ns_ref(ns),
        agent: agent_ref(agent),
        secrets: values
            .iter()
            .map(|(name, version, value)| clawfleet_kube::SecretValue {
                name: clawfleet_protocol::SecretName::new(*name).unwrap(),
                version: *version,
                fingerprint: clawfleet_protocol::SecretFingerprint::of(value.as_bytes()),
                value: zeroize::Zeroizing::new(value.as_bytes().to_vec()),
            })
            .collect(),
    }
}

/// Issue 29 on a cluster: the Agent's Secret holds exactly the bound values (owned, markers,
/// fingerprints only in its annotations); the Deployment mounts it as a volume (no env var
/// carries a value) and the gateway resolves through the managed exec provider; a rotation
/// updates the Secret in place and its activation keeps the Pod and asks the gateway to
/// reload, through the port-forward (refused here: kwok runs no gateway), leaving the
/// Deployment on the served revision; deleting the Agent deletes the Secret; a foreign Secret
/// at the computed name is refused, untouched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secrets_are_a_mounted_secret_rotated_in_place_without_a_new_pod() {
    skip_unless_control_plane!();
    let cp = start().await;
    let client = cp.client().await.unwrap();
    volumes(&client, 2).await;
    let backend = KubeBackend::new();
    let c = cluster(&cp, settings());
    let ns = "ns-secrets";
    call(&backend, &c, ensure_op(ns)).await.unwrap();
    let tenant = names::tenant_namespace(&id(ns));
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &tenant);
    let deps: Api<Deployment> = Api::namespaced(client.clone(), &tenant);
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &tenant);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &tenant);
    let n = names::agent(&id("a"));
    let first = "xoxb-cluster-first-7f3a9c";
    let second = "xoxb-cluster-second-2b8d1e";

    // Deploy revision 1 with version 1.
    let s1 = secret_spec("rs1", 1, "same");
    call(&backend, &c, secret_prepare(ns, "a", s1.clone()))
        .await
        .unwrap();
    let put = backend
        .put_secrets(
            &c,
            &secret_set(ns, "a", &[("slack-bot", 1, first)]),
            DEADLINE,
            None,
        )
        .await
        .unwrap();
    assert!(put.changed && !put.delivered_to_running_gateway, "{put:?}");
    match call(&backend, &c, secret_activate(ns, "a", &s1)).await {
        Ok(OperationResult::ActivateRevision(a)) => {
            assert_eq!(
                a.observation.served.as_ref().map(Ident::as_str),
                Some("rs1")
            );
        }
        other => panic!("activate: {other:?}"),
    }
    // The Secret: Opaque, exactly the bound key and value, owned, fingerprints only.
    let s = secrets.get(&n.secrets).await.unwrap();
    assert_eq!(s.type_.as_deref(), Some("Opaque"));
    let data = s.data.clone().unwrap();
    assert_eq!(data.keys().collect::<Vec<_>>(), ["slack-bot"]);
    assert_eq!(data["slack-bot"].0, first.as_bytes());
    let labels = s.metadata.labels.clone().unwrap();
    assert_eq!(labels[names::MANAGED_BY], "clawfleet");
    assert_eq!(labels[names::NAMESPACE_ID], ns);
    assert_eq!(labels[names::AGENT_ID], "a");
    let annotations = s.metadata.annotations.clone().unwrap();
    let versions = &annotations[clawfleet_kube::secrets::VERSIONS];
    assert!(
        versions.contains(clawfleet_protocol::SecretFingerprint::of(first.as_bytes()).as_str()),
        "{versions}"
    );
    let metadata_text = serde_json::to_string(&s.metadata).unwrap();
    assert!(
        !metadata_text.contains(first),
        "a value in the metadata: {metadata_text}"
    );
    // The Deployment mounts it as a volume; no env var carries a value; the resolver is
    // installed by an init container; the configuration resolves through the exec provider.
    let d = deps.get(&n.gateway).await.unwrap();
    let dv = serde_json::to_value(&d).unwrap();
    let dep_text = dv.to_string();
    assert!(!dep_text.contains(first), "a value in the Deployment");
    let pod = &dv["spec"]["template"]["spec"];
    let vol = pod["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["secret"]["secretName"] == n.secrets.as_str())
        .unwrap_or_else(|| panic!("no volume of the secrets Secret: {pod:#}"));
    assert_eq!(vol["secret"]["defaultMode"], 0o440);
    let gw = &pod["containers"][0];
    let mount = gw["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == vol["name"])
        .unwrap();
    assert_eq!(mount["mountPath"], "/run/clawfleet/secrets");
    assert_eq!(mount["readOnly"], true);
    assert!(gw.get("envFrom").is_none(), "{gw:#}");
    for e in gw["env"].as_array().unwrap() {
        let refers = e["valueFrom"]["secretKeyRef"]["name"] == n.secrets.as_str();
        assert!(!refers, "an env var from the secrets Secret: {e}");
    }
    assert_eq!(pod["initContainers"][0]["name"], "install-secret-resolver");
    let cm = cms
        .get(&names::revision_config_map(&id("a"), &id("rs1")))
        .await
        .unwrap();
    let rendered: serde_json::Value =
        serde_json::from_str(&cm.data.unwrap()[names::CONFIG_KEY]).unwrap();
    assert_eq!(
        rendered["secrets"]["providers"]["clawfleet"]["source"],
        "exec"
    );
    assert_eq!(
        rendered["channels"]["slack"]["botToken"],
        serde_json::json!({"source": "exec", "provider": "clawfleet", "id": "slack-bot"})
    );
    let template = d.spec.template.clone();
    let pod_uids = |list: Vec<Pod>| -> Vec<String> {
        list.into_iter().filter_map(|p| p.metadata.uid).collect()
    };
    let before = pod_uids(pods.list(&ListParams::default()).await.unwrap().items);
    assert_eq!(before.len(), 1, "{before:?}");

    // Rotation: revision 2, same configuration, version 2. The Secret changes in place; the
    // activation keeps the template and the Pod.
    let s2 = secret_spec("rs2", 2, "same");
    call(&backend, &c, secret_prepare(ns, "a", s2.clone()))
        .await
        .unwrap();
    let rv = s.metadata.resource_version.clone();
    let uid = s.metadata.uid.clone();
    let put = backend
        .put_secrets(
            &c,
            &secret_set(ns, "a", &[("slack-bot", 2, second)]),
            DEADLINE,
            None,
        )
        .await
        .unwrap();
    assert!(put.changed && put.delivered_to_running_gateway, "{put:?}");
    let s = secrets.get(&n.secrets).await.unwrap();
    assert_ne!(s.metadata.resource_version, rv);
    assert_eq!(
        s.metadata.uid, uid,
        "the Secret was replaced, not updated in place"
    );
    assert_eq!(s.data.unwrap()["slack-bot"].0, second.as_bytes());
    assert!(
        s.metadata.annotations.unwrap()[clawfleet_kube::secrets::VERSIONS]
            .contains(clawfleet_protocol::SecretFingerprint::of(second.as_bytes()).as_str())
    );
    // The activation keeps the template and the Pod, and first asks the running gateway,
    // through the API server's port-forward, to reload its secrets. kwok's Pods run nothing
    // and kwok forwards no port: the reload fails, permanently, before the Deployment names
    // rs2 (the real-node tier, `coordinator/tests/e2e_pods.rs`, shows the reload holding).
    let refused = match call(&backend, &c, secret_activate(ns, "a", &s2)).await {
        Err(f) => f,
        other => panic!("activate: {other:?}"),
    };
    assert_eq!(refused.code, FailureCode::SecretReloadFailed, "{refused}");
    assert!(
        refused.message.contains("port-forward") && refused.message.contains("no forward found"),
        "{refused}"
    );
    assert!(!refused.message.contains(second), "{refused}");
    let d = deps.get(&n.gateway).await.unwrap();
    assert_eq!(d.spec.template, template, "the Pod template changed");
    let replica_sets: Api<k8s_openapi::api::apps::v1::ReplicaSet> =
        Api::namespaced(client.clone(), &tenant);
    let sets = replica_sets
        .list(&ListParams::default())
        .await
        .unwrap()
        .items;
    assert_eq!(sets.len(), 1, "a new ReplicaSet (pod-template-hash)");
    let a = d.metadata.annotations.clone().unwrap();
    assert_eq!(
        a[names::REVISION_ID],
        "rs1",
        "the Deployment names the candidate although its gateway refused the secrets"
    );
    let after = pod_uids(pods.list(&ListParams::default()).await.unwrap().items);
    assert_eq!(after, before, "a new Pod");
    // A put of the same set writes nothing.
    let put = backend
        .put_secrets(
            &c,
            &secret_set(ns, "a", &[("slack-bot", 2, second)]),
            DEADLINE,
            None,
        )
        .await
        .unwrap();
    assert!(!put.changed, "{put:?}");

    // A configuration change moves the Pods to its template (no reload: a new Pod reads the
    // Secret as it starts).
    let s3 = secret_spec("rs3", 3, "changed");
    call(&backend, &c, secret_prepare(ns, "a", s3.clone()))
        .await
        .unwrap();
    match call(&backend, &c, secret_activate(ns, "a", &s3)).await {
        Ok(OperationResult::ActivateRevision(a)) => {
            assert_eq!(
                a.observation.served.as_ref().map(Ident::as_str),
                Some("rs3")
            );
            assert!(a.restarted, "{a:?}");
            assert_eq!(a.secrets_reload, None, "{a:?}");
        }
        other => panic!("activate: {other:?}"),
    }
    assert_eq!(
        deps.get(&n.gateway)
            .await
            .unwrap()
            .metadata
            .annotations
            .unwrap()[names::POD_REVISION_ID],
        "rs3"
    );

    // A foreign Secret at another Agent's computed name is refused, and stays as it was.
    let other = names::agent(&id("b")).secrets;
    let foreign: Secret = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": { "name": other, "namespace": tenant },
        "stringData": { "slack-bot": "not-clawfleets" },
    }))
    .unwrap();
    secrets
        .create(&PostParams::default(), &foreign)
        .await
        .unwrap();
    let refused = backend
        .put_secrets(
            &c,
            &secret_set(ns, "b", &[("slack-bot", 1, first)]),
            DEADLINE,
            None,
        )
        .await
        .unwrap_err();
    assert_eq!(
        refused.code,
        FailureCode::KubernetesOwnershipConflict,
        "{refused}"
    );
    assert!(!refused.message.contains(first), "{refused}");
    let f = secrets.get(&other).await.unwrap();
    assert_eq!(f.data.unwrap()["slack-bot"].0, b"not-clawfleets");

    // Deleting the Agent deletes its Secret.
    call(&backend, &c, delete_agent_op(ns, "a")).await.unwrap();
    assert!(secrets.get_opt(&n.secrets).await.unwrap().is_none());
}
