//! Smoke test of the control-plane tier: the real apiserver, controllers, scheduler and kwok do
//! what the Kubernetes backend's tests will rely on, through kube 5 + k8s-openapi 0.29.

use std::future::Future;
use std::io::Write;
use std::time::{Duration, Instant, SystemTime};

use clawfleet_k8s_tests::{
    ADMIN_USER, ControlPlane, FAIL_PULL_MARKER, Fault, FaultProxy, KUBERNETES_VERSION,
    KWOK_NODE_LABEL, LogStream, NODE_IP, NODE_LEASE_SECONDS, NODE_NAME, STORAGE_CLASS,
    cri_log_line, log_timestamp, skip_unless_control_plane, wait_for_default_service_account,
};
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{
    ConfigMap, Namespace, PersistentVolumeClaim, Pod, ResourceQuota, Service,
};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::{
    DeleteParams, ListParams, LogParams, Patch, PatchParams, PostParams, Preconditions,
};
use serde::de::DeserializeOwned;

const WAIT: Duration = Duration::from_secs(90);

/// Polls `probe` until it gives `Some`, or panics after `limit` naming `what` and the last state.
async fn wait_for<T, F, Fut>(what: &str, limit: Duration, mut probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Option<T>, String>>,
{
    let t0 = Instant::now();
    let mut last = String::from("(never probed)");
    while t0.elapsed() < limit {
        match probe().await {
            Ok(Some(v)) => {
                eprintln!("  {what}: {:.1}s", t0.elapsed().as_secs_f64());
                return v;
            }
            Ok(None) => last = "not yet".into(),
            Err(e) => last = e,
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    panic!("{what} did not happen within {limit:?}; last: {last}");
}

fn manifest<T: DeserializeOwned>(v: serde_json::Value) -> T {
    match serde_json::from_value(v) {
        Ok(m) => m,
        Err(e) => panic!("a test manifest does not parse: {e}"),
    }
}

fn namespace(name: &str, labels: serde_json::Value) -> Namespace {
    manifest(serde_json::json!({
        "apiVersion": "v1", "kind": "Namespace",
        "metadata": { "name": name, "labels": labels },
    }))
}

fn deployment(name: &str, image: &str) -> Deployment {
    manifest(serde_json::json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": { "name": name },
        "spec": {
            "replicas": 1,
            "strategy": { "type": "Recreate" },
            "selector": { "matchLabels": { "app": name } },
            "template": {
                "metadata": { "labels": { "app": name } },
                "spec": {
                    "containers": [{
                        "name": "gateway", "image": image,
                        "ports": [{ "containerPort": 8080, "name": "http" }],
                        "volumeMounts": [{ "name": "state", "mountPath": "/state" }],
                    }],
                    "volumes": [{ "name": "state", "persistentVolumeClaim": { "claimName": "state" } }],
                },
            },
        },
    }))
}

fn claim() -> PersistentVolumeClaim {
    manifest(serde_json::json!({
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": { "name": "state" },
        "spec": { "accessModes": ["ReadWriteOnce"], "resources": { "requests": { "storage": "1Gi" } } },
    }))
}

fn pod(name: &str, image: &str, node_selector: Option<serde_json::Value>) -> Pod {
    let mut spec = serde_json::json!({ "containers": [{ "name": "c", "image": image }] });
    if let Some(sel) = node_selector {
        spec["nodeSelector"] = sel;
    }
    manifest(serde_json::json!({
        "apiVersion": "v1", "kind": "Pod", "metadata": { "name": name }, "spec": spec,
    }))
}

fn has_condition(
    conds: Option<&Vec<k8s_openapi::api::core::v1::PodCondition>>,
    type_: &str,
    status: &str,
) -> bool {
    conds.is_some_and(|c| c.iter().any(|c| c.type_ == type_ && c.status == status))
}

async fn start() -> ControlPlane {
    let t0 = Instant::now();
    let cp = match ControlPlane::start().await {
        Ok(cp) => cp,
        Err(e) => panic!("the control plane did not start: {e}"),
    };
    eprintln!(
        "control plane {} started in {:.1}s ({}); {}",
        cp.id(),
        t0.elapsed().as_secs_f64(),
        cp.timings(),
        cp.api_url()
    );
    let mem = cp.memory_kib();
    let total: u64 = mem.iter().map(|m| m.1).sum();
    eprintln!(
        "resident memory: {} MiB total ({})",
        total / 1024,
        mem.iter()
            .map(|(c, k)| format!("{c} {} MiB", k / 1024))
            .collect::<Vec<_>>()
            .join(", ")
    );
    cp
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn control_plane_smoke() {
    skip_unless_control_plane!();
    let cp = start().await;
    let client = cp.client().await.unwrap();

    // /version is the real server's, stamped with the release.
    let version = client.apiserver_version().await.unwrap();
    assert_eq!(version.git_version, KUBERNETES_VERSION);
    assert_eq!(version.major, "1");

    // Namespace + Deployment + Service: the Pod becomes Ready through the scheduler and kwok,
    // and the EndpointSlice controller publishes a ready endpoint owned by the Service.
    let t_deploy = Instant::now();
    let namespaces: Api<Namespace> = Api::all(client.clone());
    namespaces
        .create(
            &PostParams::default(),
            &namespace("smoke", serde_json::json!({})),
        )
        .await
        .unwrap();
    wait_for_default_service_account(&client, "smoke", WAIT)
        .await
        .unwrap();
    // A PVC of the default (kwok) StorageClass: kwok provisions and binds it.
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), "smoke");
    claims
        .create(&PostParams::default(), &claim())
        .await
        .unwrap();
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), "smoke");
    deployments
        .create(
            &PostParams::default(),
            &deployment("web", "registry.invalid/clawfleet/gateway:1"),
        )
        .await
        .unwrap();
    let services: Api<Service> = Api::namespaced(client.clone(), "smoke");
    let svc = services
        .create(
            &PostParams::default(),
            &manifest(serde_json::json!({
                "apiVersion": "v1", "kind": "Service",
                "metadata": { "name": "web" },
                "spec": { "selector": { "app": "web" },
                          "ports": [{ "port": 80, "targetPort": "http" }] },
            })),
        )
        .await
        .unwrap();
    let svc_uid = svc.metadata.uid.clone().unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), "smoke");
    let ready_pod = wait_for("the Deployment's Pod Ready via kwok", WAIT, || async {
        let list = pods
            .list(&ListParams::default().labels("app=web"))
            .await
            .map_err(|e| e.to_string())?;
        Ok(list.items.into_iter().find(|p| {
            let st = p.status.as_ref();
            st.and_then(|s| s.phase.as_deref()) == Some("Running")
                && has_condition(st.and_then(|s| s.conditions.as_ref()), "Ready", "True")
        }))
    })
    .await;
    let pod_ip = ready_pod
        .status
        .as_ref()
        .and_then(|s| s.pod_ip.clone())
        .unwrap_or_default();
    assert!(!pod_ip.is_empty(), "kwok gave the Pod an IP");
    assert!(ready_pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(cp.node_name()));
    wait_for("the PVC Bound", WAIT, || async {
        let c = claims.get("state").await.map_err(|e| e.to_string())?;
        let class = c.spec.as_ref().and_then(|s| s.storage_class_name.clone());
        if class.as_deref() != Some(STORAGE_CLASS) {
            return Err(format!("storageClassName {class:?}"));
        }
        Ok((c.status.and_then(|s| s.phase).as_deref() == Some("Bound")).then_some(()))
    })
    .await;
    wait_for("the Deployment's readyReplicas=1", WAIT, || async {
        let d = deployments.get("web").await.map_err(|e| e.to_string())?;
        let s = d.status.unwrap_or_default();
        Ok(
            (s.ready_replicas == Some(1) && s.observed_generation == d.metadata.generation)
                .then_some(()),
        )
    })
    .await;
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), "smoke");
    wait_for(
        "an EndpointSlice owned by the Service with a ready endpoint",
        WAIT,
        || async {
            let list = slices
                .list(&ListParams::default().labels("kubernetes.io/service-name=web"))
                .await
                .map_err(|e| e.to_string())?;
            Ok(list
                .items
                .into_iter()
                .find(|s| {
                    let owned = s
                        .metadata
                        .owner_references
                        .as_ref()
                        .is_some_and(|o| o.iter().any(|o| o.uid == svc_uid));
                    let ready = s.endpoints.iter().flatten().any(|e| {
                        e.conditions.as_ref().and_then(|c| c.ready) == Some(true)
                            && e.addresses.contains(&pod_ip)
                    });
                    owned && ready
                })
                .map(|_| ()))
        },
    )
    .await;
    eprintln!(
        "deploy to ready endpoint: {:.1}s",
        t_deploy.elapsed().as_secs_f64()
    );

    // Server-side apply: a second field manager changing an owned field without force is a
    // 409 conflict; a delete with a stale uid precondition is a 409 too.
    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), "smoke");
    let cm = |v: &str| -> ConfigMap {
        manifest(serde_json::json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": { "name": "settings" }, "data": { "k": v },
        }))
    };
    let applied = maps
        .patch(
            "settings",
            &PatchParams::apply("clawfleet"),
            &Patch::Apply(cm("1")),
        )
        .await
        .unwrap();
    assert!(
        applied
            .metadata
            .managed_fields
            .unwrap_or_default()
            .iter()
            .any(|m| m.manager.as_deref() == Some("clawfleet"))
    );
    match maps
        .patch(
            "settings",
            &PatchParams::apply("intruder"),
            &Patch::Apply(cm("2")),
        )
        .await
    {
        Err(kube::Error::Api(s)) => assert_eq!(s.code, 409, "{s:?}"),
        other => panic!("a conflicting apply was accepted: {other:?}"),
    }
    let stale = DeleteParams {
        preconditions: Some(Preconditions {
            uid: Some("00000000-0000-0000-0000-000000000000".into()),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    match maps.delete("settings", &stale).await {
        Err(kube::Error::Api(s)) => assert_eq!(s.code, 409, "{s:?}"),
        other => panic!("a delete with a wrong uid precondition went through: {other:?}"),
    }
    let exact = DeleteParams {
        preconditions: Some(Preconditions {
            uid: applied.metadata.uid.clone(),
            resource_version: applied.metadata.resource_version.clone(),
        }),
        ..DeleteParams::default()
    };
    maps.delete("settings", &exact).await.unwrap();

    // A ResourceQuota of 0 Pods: the ReplicaSet reports ReplicaFailure/FailedCreate.
    namespaces
        .create(
            &PostParams::default(),
            &namespace("quota", serde_json::json!({})),
        )
        .await
        .unwrap();
    wait_for_default_service_account(&client, "quota", WAIT)
        .await
        .unwrap();
    let quotas: Api<ResourceQuota> = Api::namespaced(client.clone(), "quota");
    quotas
        .create(
            &PostParams::default(),
            &manifest(serde_json::json!({
                "apiVersion": "v1", "kind": "ResourceQuota",
                "metadata": { "name": "no-pods" },
                "spec": { "hard": { "pods": "0" } },
            })),
        )
        .await
        .unwrap();
    wait_for("the quota's status.hard", WAIT, || async {
        let q = quotas.get("no-pods").await.map_err(|e| e.to_string())?;
        Ok(q.status.and_then(|s| s.hard).map(|_| ()))
    })
    .await;
    Api::<Deployment>::namespaced(client.clone(), "quota")
        .create(
            &PostParams::default(),
            &deployment("web", "registry.invalid/clawfleet/gateway:1"),
        )
        .await
        .unwrap();
    let replica_sets: Api<ReplicaSet> = Api::namespaced(client.clone(), "quota");
    let message = wait_for(
        "ReplicaFailure/FailedCreate on the ReplicaSet",
        WAIT,
        || async {
            let list = replica_sets
                .list(&ListParams::default())
                .await
                .map_err(|e| e.to_string())?;
            Ok(list.items.into_iter().find_map(|rs| {
                rs.status?.conditions?.into_iter().find_map(|c| {
                    (c.type_.as_deref() == Some("ReplicaFailure")
                        && c.status.as_deref() == Some("True")
                        && c.reason.as_deref() == Some("FailedCreate"))
                    .then(|| c.message.unwrap_or_default())
                })
            }))
        },
    )
    .await;
    assert!(message.contains("exceeded quota"), "{message}");

    // A nodeSelector no node matches: PodScheduled=False/Unschedulable from the scheduler.
    let pending = pods
        .create(
            &PostParams::default(),
            &pod(
                "nowhere",
                "registry.invalid/clawfleet/gateway:1",
                Some(serde_json::json!({ "clawfleet.dev/no-such-label": "x" })),
            ),
        )
        .await
        .unwrap();
    assert!(pending.spec.and_then(|s| s.node_name).is_none());
    wait_for("PodScheduled=False/Unschedulable", WAIT, || async {
        let p = pods.get("nowhere").await.map_err(|e| e.to_string())?;
        let unschedulable = p
            .status
            .and_then(|s| s.conditions)
            .unwrap_or_default()
            .iter()
            .any(|c| {
                c.type_ == "PodScheduled"
                    && c.status == "False"
                    && c.reason.as_deref() == Some("Unschedulable")
            });
        Ok(unschedulable.then_some(()))
    })
    .await;

    // An image marked to fail pulling: kwok's pod-fail-pull stage reports ErrImagePull.
    let image = format!("registry.invalid/clawfleet/{FAIL_PULL_MARKER}:1");
    pods.create(&PostParams::default(), &pod("bad-image", &image, None))
        .await
        .unwrap();
    wait_for("waiting.reason=ErrImagePull", WAIT, || async {
        let p = pods.get("bad-image").await.map_err(|e| e.to_string())?;
        let st = p.status.unwrap_or_default();
        let reason = st
            .container_statuses
            .unwrap_or_default()
            .into_iter()
            .find_map(|c| c.state?.waiting?.reason);
        if st.phase.as_deref() == Some("Running") {
            return Err("the fail-pull Pod was made Running".into());
        }
        Ok((reason.as_deref() == Some("ErrImagePull")).then_some(()))
    })
    .await;

    // PodSecurity admission is on: a restricted namespace refuses a Pod without a securityContext.
    namespaces
        .create(
            &PostParams::default(),
            &namespace(
                "restricted",
                serde_json::json!({ "pod-security.kubernetes.io/enforce": "restricted" }),
            ),
        )
        .await
        .unwrap();
    wait_for_default_service_account(&client, "restricted", WAIT)
        .await
        .unwrap();
    let refused = Api::<Pod>::namespaced(client.clone(), "restricted")
        .create(
            &PostParams::default(),
            &pod("loose", "registry.invalid/clawfleet/gateway:1", None),
        )
        .await;
    match refused {
        Err(kube::Error::Api(s)) => {
            assert_eq!(s.code, 403, "{s:?}");
            assert!(s.message.contains("PodSecurity"), "{}", s.message);
        }
        other => panic!("a restricted namespace admitted a loose Pod: {other:?}"),
    }

    // The limited identity is authenticated but RBAC gives it nothing.
    let limited = cp.limited_client().await.unwrap();
    match Api::<Namespace>::all(limited)
        .list(&ListParams::default())
        .await
    {
        Err(kube::Error::Api(s)) => assert_eq!(s.code, 403, "{s:?}"),
        other => panic!("the limited identity could list namespaces: {other:?}"),
    }

    // Deleting a namespace finishes: its Pods are removed by kwok, then the Namespace goes.
    let t_delete = Instant::now();
    for ns in ["smoke", "quota", "restricted"] {
        namespaces
            .delete(ns, &DeleteParams::default())
            .await
            .unwrap();
    }
    for ns in ["smoke", "quota", "restricted"] {
        wait_for(&format!("namespace {ns} gone"), WAIT, || async {
            let n = namespaces.get_opt(ns).await.map_err(|e| e.to_string())?;
            Ok(n.is_none().then_some(()))
        })
        .await;
    }
    eprintln!(
        "namespaces deleted in {:.1}s",
        t_delete.elapsed().as_secs_f64()
    );
    let t_stop = Instant::now();
    cp.shutdown().unwrap();
    eprintln!("teardown: {:.1}s", t_stop.elapsed().as_secs_f64());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apiserver_kill_and_restart_keeps_the_data() {
    skip_unless_control_plane!();
    let cp = start().await;
    let client = cp.client().await.unwrap();
    let namespaces: Api<Namespace> = Api::all(client.clone());
    namespaces
        .create(
            &PostParams::default(),
            &namespace("survivor", serde_json::json!({})),
        )
        .await
        .unwrap();
    let old_pid = cp.apiserver_pid().unwrap();
    cp.kill_apiserver().unwrap();
    assert!(cp.apiserver_pid().is_none());
    match namespaces.get("survivor").await {
        // Connection refused: a transport error, not an API status.
        Err(kube::Error::Api(s)) => panic!("a killed apiserver answered: {s:?}"),
        Err(_) => {}
        Ok(_) => panic!("a killed apiserver answered"),
    }
    let t0 = Instant::now();
    cp.start_apiserver().await.unwrap();
    eprintln!(
        "apiserver restart to /readyz: {:.1}s",
        t0.elapsed().as_secs_f64()
    );
    assert_ne!(cp.apiserver_pid(), Some(old_pid));
    // The same client (same URL, CA, token) works again and etcd kept the data.
    let ns = namespaces.get("survivor").await.unwrap();
    assert_eq!(ns.metadata.name.as_deref(), Some("survivor"));
    // kwok keeps renewing the Node's Lease after the restart; without renewals the
    // controller-manager would mark the Node's Pods NotReady after its 50 s grace period.
    let leases: Api<Lease> = Api::namespaced(client.clone(), "kube-node-lease");
    let renewed = |l: &Lease| l.spec.as_ref().and_then(|s| s.renew_time.clone());
    let first = renewed(&leases.get(NODE_NAME).await.unwrap());
    wait_for(
        "the Node's Lease renewed after the restart",
        Duration::from_secs(NODE_LEASE_SECONDS.into()),
        || {
            let leases = leases.clone();
            let first = first.clone();
            async move {
                let now = leases.get(NODE_NAME).await.map_err(|e| e.to_string())?;
                Ok(renewed(&now)
                    .filter(|t| Some(t) != first.as_ref())
                    .map(|_| ()))
            }
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fault_proxy_injects_429_503_drops_and_delays_then_forwards() {
    skip_unless_control_plane!();
    let cp = start().await;
    let proxy = FaultProxy::start(&cp).await.unwrap();
    // kube 5 retries 429/503/504 by itself unless told not to (Config::default_retry): a
    // default client absorbs one injected 429, which the proxy sees as two requests.
    let retrying = proxy.client(ADMIN_USER, cp.admin_token()).await.unwrap();
    proxy.inject(Fault::too_many_requests(1), 1);
    Api::<Namespace>::all(retrying)
        .get("default")
        .await
        .unwrap();
    assert_eq!(proxy.request_count(), 2);
    assert_eq!(proxy.seen().iter().filter(|r| r.injected).count(), 1);

    let mut config = proxy.config(ADMIN_USER, cp.admin_token()).await.unwrap();
    config.default_retry = false;
    let client = kube::Client::try_from(config).unwrap();
    let namespaces: Api<Namespace> = Api::all(client.clone());

    // Forwarded: the real server answers through the proxy (TLS with the run's CA both ways).
    namespaces.get("default").await.unwrap();
    assert_eq!(proxy.request_count(), 3);

    // 429 with Retry-After, seen raw (kube's Error::Api keeps the code but not the header).
    proxy.inject(Fault::too_many_requests(7), 1);
    let req = http::Request::get("/api/v1/namespaces/default")
        .body(kube::client::Body::empty())
        .unwrap();
    let raw = client.send(req).await.unwrap();
    assert_eq!(raw.status(), 429);
    assert_eq!(
        raw.headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok()),
        Some("7")
    );
    proxy.inject(Fault::too_many_requests(1), 1);
    match namespaces.get("default").await {
        Err(kube::Error::Api(s)) => assert_eq!(s.code, 429),
        other => panic!("expected the injected 429, got {other:?}"),
    }
    proxy.inject(Fault::service_unavailable(), 1);
    match namespaces.get("default").await {
        Err(kube::Error::Api(s)) => assert_eq!(s.code, 503),
        other => panic!("expected the injected 503, got {other:?}"),
    }
    proxy.inject(Fault::Drop, 1);
    match namespaces.get("default").await {
        Err(kube::Error::Api(s)) => panic!("a dropped connection gave a status: {s:?}"),
        Err(_) => {}
        Ok(_) => panic!("a dropped connection answered"),
    }
    proxy.inject(Fault::Delay(Duration::from_millis(1500)), 1);
    let t0 = Instant::now();
    namespaces.get("default").await.unwrap();
    assert!(t0.elapsed() >= Duration::from_millis(1500));
    assert_eq!(proxy.pending_faults(), 0);

    // The apiserver killed behind the proxy: a transport error, not a made-up status.
    cp.kill_apiserver().unwrap();
    match namespaces.get("default").await {
        Err(kube::Error::Api(s)) => panic!("the proxy invented a status: {s:?}"),
        Err(_) => {}
        Ok(_) => panic!("a killed apiserver answered through the proxy"),
    }
    cp.start_apiserver().await.unwrap();
    namespaces.get("default").await.unwrap();
    let seen = proxy.seen();
    assert_eq!(seen.iter().filter(|r| r.injected).count(), 5, "{seen:?}");
    assert!(
        seen.iter()
            .all(|r| r.uri.starts_with("/api/v1/namespaces/default"))
    );
    eprintln!("requests through the proxy: {}", proxy.request_count());
}

#[test]
fn a_sigkilled_runs_processes_are_reclaimed_from_its_record() {
    skip_unless_control_plane!();
    use std::io::BufRead;
    let config = clawfleet_k8s_tests::HarnessConfig::from_env().unwrap();
    let mut owner = std::process::Command::new(env!("CARGO_BIN_EXE_k8scp"))
        .arg("up")
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let Some(stdout) = owner.stdout.take() else {
        panic!("no stdout from k8scp");
    };
    let mut id = None;
    for line in std::io::BufReader::new(stdout).lines() {
        let line = line.unwrap();
        if let Some(rest) = line.strip_prefix("control plane ") {
            id = rest.split_whitespace().next().map(str::to_string);
        }
        if line.starts_with("Ctrl-C") {
            break;
        }
    }
    let Some(id) = id else {
        let _ = owner.kill();
        panic!("k8scp up did not report a control plane");
    };
    // SIGKILL: nothing in the owner runs, its five components are orphaned.
    owner.kill().unwrap();
    owner.wait().unwrap();
    let runs = clawfleet_k8s_tests::list_runs(&config).unwrap();
    let Some((rec, live)) = runs.into_iter().find(|(r, _)| r.id == id) else {
        panic!("no record of run {id}");
    };
    assert!(!live, "the dead owner's lock is free");
    assert_eq!(rec.processes.len(), 5, "{rec:?}");
    assert!(!rec.leftovers().is_empty());
    // (A control plane starting in another test process may reclaim it first: also fine.)
    clawfleet_k8s_tests::reclaim_stale(&config).unwrap();
    let runs = clawfleet_k8s_tests::list_runs(&config).unwrap();
    assert!(runs.iter().all(|(r, _)| r.id != id), "the record is gone");
    assert!(rec.leftovers().is_empty(), "{:?}", rec.leftovers());
}

/// The body of `GET .../pods/{pod}/log?{query}`, or the apiserver's error.
async fn raw_log(
    client: &kube::Client,
    ns: &str,
    pod: &str,
    query: &str,
) -> Result<String, String> {
    let url = format!("/api/v1/namespaces/{ns}/pods/{pod}/log?{query}");
    let req = http::Request::get(url)
        .body(Vec::new())
        .map_err(|e| e.to_string())?;
    client.request_text(req).await.map_err(|e| e.to_string())
}

/// Pod logs come back through the apiserver from kwok's kubelet-like server on 127.0.0.1 (the
/// Node's InternalIP and kubelet port): the control plane's log files, with `tailLines`,
/// `timestamps`, `sinceSeconds` and `previous` applied as a kubelet applies them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pod_logs_are_served_through_the_apiserver() {
    skip_unless_control_plane!();
    let cp = start().await;
    let client = cp.client().await.unwrap();
    let ns = "pod-logs";
    Api::<Namespace>::all(client.clone())
        .create(
            &PostParams::default(),
            &namespace(ns, serde_json::json!({})),
        )
        .await
        .unwrap();
    wait_for_default_service_account(&client, ns, WAIT)
        .await
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let gateway: Pod = manifest(serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": { "name": "gateway-0" },
        "spec": {
            "nodeSelector": { KWOK_NODE_LABEL.0: KWOK_NODE_LABEL.1 },
            "containers": [{ "name": "gateway", "image": "registry.invalid/clawfleet/gateway:test" }],
        },
    }));
    pods.create(&PostParams::default(), &gateway).await.unwrap();
    let running = wait_for("gateway-0 Ready on the kwok Node", WAIT, || {
        let pods = pods.clone();
        async move {
            let p = pods.get("gateway-0").await.map_err(|e| e.to_string())?;
            let ready = has_condition(
                p.status.as_ref().and_then(|s| s.conditions.as_ref()),
                "Ready",
                "True",
            );
            Ok(ready.then_some(p))
        }
    })
    .await;
    assert_eq!(
        running.spec.as_ref().and_then(|s| s.node_name.as_deref()),
        Some(NODE_NAME)
    );
    assert_eq!(
        running.status.as_ref().and_then(|s| s.host_ip.as_deref()),
        Some(NODE_IP)
    );

    let gw = |tail: Option<i64>| LogParams {
        container: Some("gateway".into()),
        tail_lines: tail,
        ..LogParams::default()
    };
    // Nothing written yet: an empty log, not an error.
    let t0 = Instant::now();
    assert_eq!(pods.logs("gateway-0", &gw(None)).await.unwrap(), "");
    eprintln!(
        "  first (empty) log request: {:.3}s",
        t0.elapsed().as_secs_f64()
    );

    let old = SystemTime::now() - Duration::from_secs(3600);
    let at = SystemTime::now();
    let mut text = String::new();
    text.push_str(&cri_log_line(old, LogStream::Stdout, "boot 1"));
    text.push_str(&cri_log_line(old, LogStream::Stdout, "boot 2"));
    text.push_str(&cri_log_line(at, LogStream::Stdout, "ready 3\nready 4"));
    text.push_str(&cri_log_line(at, LogStream::Stderr, "warn 5"));
    let mut file = std::fs::OpenOptions::new()
        .append(true)
        .open(cp.pod_logs_file())
        .unwrap();
    file.write_all(text.as_bytes()).unwrap();
    drop(file);
    cp.append_pod_log(&["serving 6", "serving 7"]).unwrap();
    let after = SystemTime::now();

    // The brief's exact request: timestamps and tailLines.
    let t0 = Instant::now();
    let body = raw_log(
        &client,
        ns,
        "gateway-0",
        "container=gateway&timestamps=true&tailLines=4",
    )
    .await
    .unwrap();
    eprintln!(
        "  log request with timestamps and tailLines: {:.3}s",
        t0.elapsed().as_secs_f64()
    );
    let lines: Vec<&str> = body.lines().collect();
    let stamp = log_timestamp(at);
    assert_eq!(
        lines[..2],
        [format!("{stamp} ready 4"), format!("{stamp} warn 5")],
        "body: {body:?}"
    );
    assert_eq!(lines.len(), 4, "body: {body:?}");
    for (line, want) in lines[2..].iter().zip(["serving 6", "serving 7"]) {
        let (ts, rest) = line.split_once(' ').unwrap();
        assert_eq!(rest, want, "body: {body:?}");
        assert_eq!(ts.len(), "2026-12-01T10:00:00.123456789Z".len(), "{ts}");
        let ts: Timestamp = ts.parse().unwrap();
        let (lo, hi) = (
            Timestamp::try_from(at).unwrap(),
            Timestamp::try_from(after).unwrap(),
        );
        assert!(lo <= ts && ts <= hi, "{ts} not within [{lo}, {hi}]");
    }

    // Without timestamps: the bare lines, stdout and stderr interleaved in file order.
    assert_eq!(
        pods.logs("gateway-0", &gw(Some(2))).await.unwrap(),
        "serving 6\nserving 7\n"
    );
    assert_eq!(
        pods.logs("gateway-0", &gw(None)).await.unwrap(),
        "boot 1\nboot 2\nready 3\nready 4\nwarn 5\nserving 6\nserving 7\n"
    );
    assert_eq!(
        raw_log(
            &client,
            ns,
            "gateway-0",
            "container=gateway&sinceSeconds=600"
        )
        .await
        .unwrap(),
        "ready 3\nready 4\nwarn 5\nserving 6\nserving 7\n"
    );

    // previous=true reads the previous-logs file.
    let previous = LogParams {
        previous: true,
        ..gw(None)
    };
    assert_eq!(pods.logs("gateway-0", &previous).await.unwrap(), "");
    cp.append_previous_pod_log(&["last run: started", "last run: crashed"])
        .unwrap();
    assert_eq!(
        pods.logs("gateway-0", &previous).await.unwrap(),
        "last run: started\nlast run: crashed\n"
    );
    assert_eq!(
        raw_log(
            &client,
            ns,
            "gateway-0",
            "container=gateway&previous=true&tailLines=1"
        )
        .await
        .unwrap(),
        "last run: crashed\n"
    );

    // A container the Pod does not have is the apiserver's 400, before kwok is asked.
    match pods
        .logs(
            "gateway-0",
            &LogParams {
                container: Some("nope".into()),
                ..LogParams::default()
            },
        )
        .await
    {
        Err(kube::Error::Api(s)) => assert_eq!(s.code, 400, "{s:?}"),
        other => panic!("logs of a container the Pod does not have: {other:?}"),
    }

    // Every namespace and every container name share the same file.
    let default_pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    default_pods
        .create(
            &PostParams::default(),
            &pod("other", "registry.invalid/x/other:1", None),
        )
        .await
        .unwrap();
    wait_for("pod default/other Ready", WAIT, || {
        let pods = default_pods.clone();
        async move {
            let p = pods.get("other").await.map_err(|e| e.to_string())?;
            Ok(has_condition(
                p.status.as_ref().and_then(|s| s.conditions.as_ref()),
                "Ready",
                "True",
            )
            .then_some(()))
        }
    })
    .await;
    let other = LogParams {
        container: Some("c".into()),
        tail_lines: Some(1),
        ..LogParams::default()
    };
    assert_eq!(
        default_pods.logs("other", &other).await.unwrap(),
        "serving 7\n"
    );
}
