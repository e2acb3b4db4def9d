//! The real node (kubelet + containerd + runc + bridge CNI) against the real control plane: a Pod
//! from an image built here really runs, its log comes back through the apiserver from the
//! kubelet, and the teardown leaves nothing behind (asserted) and restores the sysctls.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use clawfleet_k8s_tests::{
    ControlPlane, Node, REAL_NODE_LABEL, build_archive, leftovers, minimal_rootfs, node_skip_reason,
};
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{LogParams, PostParams};
use serde_json::json;

async fn wait_for_pod(
    pods: &Api<Pod>,
    name: &str,
    limit: Duration,
    what: &str,
    done: impl Fn(&Pod) -> bool,
) -> Pod {
    let deadline = Instant::now() + limit;
    loop {
        let p = pods.get(name).await.unwrap();
        if done(&p) {
            return p;
        }
        assert!(
            Instant::now() < deadline,
            "pod {name} never became {what}: {:?}",
            p.status
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn ready(p: &Pod) -> bool {
    p.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_really_runs_and_the_node_leaves_nothing_behind() {
    if let Some(reason) = node_skip_reason() {
        eprintln!("SKIP: {reason}");
        return;
    }
    let cp = ControlPlane::start().await.expect("control plane");
    // Another node of the tier may run meanwhile (two at a time): its kubelet has changed the
    // sysctls, and the teardown restores them only after the last node. The test's own reading
    // is compared below only when this was the only node at both ends; the harness's check
    // against the ledger of the first node (`report.sysctls`) runs always.
    let harness = clawfleet_k8s_tests::HarnessConfig::from_env().unwrap();
    let alone_at_start = clawfleet_k8s_tests::live_node_count(&harness) == 0;
    let before: Vec<(String, String)> = clawfleet_k8s_tests::SYSCTLS
        .iter()
        .map(|s| {
            let v = std::fs::read_to_string(format!("/proc/sys/{s}")).unwrap();
            ((*s).to_owned(), v.trim().to_owned())
        })
        .collect();
    let t0 = Instant::now();
    let node = Node::start(&cp).await.expect("real node");
    eprintln!(
        "real node Ready in {:.1} s (kubelet + containerd start)",
        t0.elapsed().as_secs_f64()
    );
    let record = node.record().clone();

    // An image built here: busybox (static) in a minimal layout, imported by digest.
    let work = node.work_dir("busybox").unwrap();
    let root = work.join("rootfs");
    minimal_rootfs(&root, Some(std::path::Path::new("/bin/busybox")), &[]).unwrap();
    let image = build_archive(
        &root,
        json!({ "Entrypoint": ["/bin/sh"] }),
        "clawfleet.test/busybox",
        None,
        &work.join("out"),
    )
    .unwrap();
    node.import_image(&image).unwrap();
    assert!(image.reference.contains("@sha256:"), "{}", image.reference);

    let client = cp.client().await.unwrap();
    clawfleet_k8s_tests::wait_for_default_service_account(
        &client,
        "default",
        Duration::from_secs(30),
    )
    .await
    .unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": { "name": "hello" },
        "spec": {
            "nodeSelector": { REAL_NODE_LABEL.0: REAL_NODE_LABEL.1 },
            "automountServiceAccountToken": false,
            "securityContext": { "runAsNonRoot": true, "runAsUser": 1000, "runAsGroup": 1000 },
            "containers": [{
                "name": "c",
                "image": image.reference,
                "imagePullPolicy": "IfNotPresent",
                "command": ["/bin/sh", "-c", "echo uid=$(id -u) hello from a real container; touch /tmp/ready; exec sleep 3600"],
                "securityContext": { "readOnlyRootFilesystem": false, "allowPrivilegeEscalation": false },
                "readinessProbe": { "exec": { "command": ["/bin/test", "-e", "/tmp/ready"] }, "periodSeconds": 1 },
            }],
        },
    }))
    .unwrap();
    let t1 = Instant::now();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    let p = wait_for_pod(&pods, "hello", Duration::from_secs(60), "Ready", ready).await;
    eprintln!("Pod Ready in {:.1} s", t1.elapsed().as_secs_f64());
    let pod_ip = p.status.as_ref().and_then(|s| s.pod_ip.clone()).unwrap();
    assert!(
        pod_ip.starts_with(&format!("10.213.{}.", record.subnet)),
        "{pod_ip}"
    );
    let log = pods.logs("hello", &LogParams::default()).await.unwrap();
    assert_eq!(log.trim(), "uid=1000 hello from a real container", "{log}");
    // While it runs, the leftover check sees the node's parts (so its empty answer after the
    // teardown means something).
    let live = leftovers(&record);
    for part in [
        "kubelet pid",
        "containerd pid",
        "in cgroup clawfleet-node-",
        "bridge cfk",
        "veth ",
        "mount ",
        "directory ",
    ] {
        assert!(
            live.iter().any(|l| l.contains(part)),
            "{part} not seen in {live:?}"
        );
    }
    let report = node.shutdown().await;
    eprintln!("teardown report: {report:?}");
    assert!(report.problems.is_empty(), "{:?}", report.problems);
    assert!(report.leftovers.is_empty(), "{:?}", report.leftovers);
    assert!(leftovers(&record).is_empty());
    assert!(report.sysctls.is_empty(), "{:?}", report.sysctls);
    if alone_at_start && clawfleet_k8s_tests::live_node_count(&harness) == 0 {
        for (name, value) in &before {
            let now = std::fs::read_to_string(format!("/proc/sys/{name}")).unwrap();
            assert_eq!(now.trim(), value, "sysctl {name} was not restored");
        }
    } else {
        eprintln!(
            "another node was live at this test's start or end: its sysctls are checked against \
             the harness's ledger only"
        );
    }
    cp.shutdown().unwrap();
}

/// `Node::prepare` needs no control plane (it runs beside one's start): containerd runs and
/// the bridge exists; a prepared node that never joins one is torn down with nothing left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prepared_node_that_never_joins_leaves_nothing_behind() {
    if let Some(reason) = node_skip_reason() {
        eprintln!("SKIP: {reason}");
        return;
    }
    let config = clawfleet_k8s_tests::HarnessConfig::from_env().unwrap();
    let node = Node::prepare(&config).await.expect("a prepared node");
    eprintln!("prepared: {}", node.timings());
    assert!(node.timings().prepare > Duration::ZERO);
    let record = node.record().clone();
    let live = leftovers(&record);
    for part in ["containerd pid", "bridge cfk", "directory "] {
        assert!(
            live.iter().any(|l| l.contains(part)),
            "{part} not seen in {live:?}"
        );
    }
    assert!(
        !live.iter().any(|l| l.contains("kubelet pid")),
        "a kubelet before the join: {live:?}"
    );
    let report = node.shutdown().await;
    assert!(report.problems.is_empty(), "{:?}", report.problems);
    assert!(report.leftovers.is_empty(), "{:?}", report.leftovers);
    assert!(report.sysctls.is_empty(), "{:?}", report.sysctls);
    assert!(leftovers(&record).is_empty());
}

/// A test process killed with SIGKILL leaves its node running; the next start (here
/// `reclaim_stale_nodes` directly) tears it down from its record, by ids, and nothing is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_whose_owner_was_killed_is_reclaimed_by_its_record() {
    use std::io::BufRead;
    if let Some(reason) = node_skip_reason() {
        eprintln!("SKIP: {reason}");
        return;
    }
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_k8scp"))
        .args(["up", "--node"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let record_path = tokio::task::spawn_blocking(move || {
        for line in std::io::BufReader::new(stdout).lines() {
            let line = line.unwrap();
            if let Some((_, path)) = line.split_once("; record ") {
                return Some(std::path::PathBuf::from(path));
            }
        }
        None
    })
    .await
    .unwrap()
    .expect("k8scp up --node printed no node record");
    let record: clawfleet_k8s_tests::NodeRecord =
        serde_json::from_slice(&std::fs::read(&record_path).unwrap()).unwrap();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(child.id()).unwrap()),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    child.wait().unwrap();
    let left = leftovers(&record);
    assert!(
        left.iter().any(|l| l.contains("kubelet pid")),
        "the killed owner's node should still run: {left:?}"
    );
    let config = clawfleet_k8s_tests::HarnessConfig::from_env().unwrap();
    let report = clawfleet_k8s_tests::reclaim_stale_nodes(&config);
    eprintln!("reclaimed: {report:?}");
    assert!(report.iter().any(|r| r.contains(&record.id)), "{report:?}");
    let left = leftovers(&record);
    assert!(left.is_empty(), "{left:?}");
    assert!(!record_path.exists());
    // Its control plane goes the same way (k8scp's own reclaim).
    clawfleet_k8s_tests::reclaim_stale(&config).unwrap();
}
