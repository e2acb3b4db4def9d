//! Benchmark (not a timed test): 30 Agents deployed to the project's real Kubernetes control
//! plane (etcd, kube-apiserver, controller manager, scheduler, kwok) through `occ serve`:
//! wall time from the first deploy request until every Agent is converged as the API reports
//! it, the per-Agent median, and the Kubernetes API requests per Agent deploy, counted at a
//! loopback proxy between the coordinator and the apiserver. Run it beside the SSH fleet
//! benchmark (`benches/fleet.rs`) to compare the two backends on one machine:
//!
//! ```sh
//! cargo bench -p clawfleet-coordinator --bench fleet
//! cargo bench -p clawfleet-coordinator --bench cluster_fleet
//! ```
//!
//! Needs root and the control-plane binaries (k8s-tests/build-control-plane.sh); otherwise it
//! prints `SKIP: ...` and exits 0. `CLAWFLEET_BENCH_AGENTS` changes the count. No container
//! runs (kwok marks Pods Ready), so this measures the backend's API work, not a gateway's
//! start.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../tests/fleet_support/mod.rs"]
mod fleet;

use std::time::{Duration, Instant};

use clawfleet_k8s_tests::{ADMIN_USER, ControlPlane, FaultProxy};
use fleet::{Fleet, median};
use serde_json::json;

const IMAGE: &str = "registry.invalid/openclaw/gateway@sha256:1111111111111111111111111111111111111111111111111111111111111111";

fn secs(d: Duration) -> String {
    format!("{:.2} s", d.as_secs_f64())
}

fn main() {
    if let Some(reason) = clawfleet_k8s_tests::skip_reason() {
        println!("SKIP: {reason}");
        return;
    }
    let count: usize = std::env::var("CLAWFLEET_BENCH_AGENTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|n| *n > 0)
        .unwrap_or(30);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let setup = Instant::now();
    let cp = rt.block_on(ControlPlane::start()).expect("control plane");
    let proxy = rt.block_on(FaultProxy::start(&cp)).expect("proxy");
    let fleet = Fleet::start(0);
    let kubeconfig = fleet.dir.path().join("proxy.kubeconfig");
    std::fs::write(&kubeconfig, proxy.kubeconfig(ADMIN_USER, cp.admin_token())).unwrap();
    let settings = fleet.dir.path().join("settings.json");
    std::fs::write(
        &settings,
        json!({"gatewayImage": IMAGE, "quota": {"pods": count as u32 * 2 + 4}}).to_string(),
    )
    .unwrap();
    fleet.occ_ok(&[
        "cluster",
        "add",
        "bench",
        "--kubeconfig",
        &kubeconfig.display().to_string(),
        "--settings",
        &settings.display().to_string(),
    ]);
    fleet.occ_ok(&["namespace", "create", "bench", "--cluster", "bench"]);
    let deadline = Instant::now() + Duration::from_secs(60);
    while fleet
        .api
        .request("GET", "/namespaces/bench", None)
        .map(|n| n["ready"] != json!(true))
        .unwrap_or(true)
    {
        assert!(
            Instant::now() < deadline,
            "the bench Namespace never became ready"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let doc = fleet.dir.path().join("cfg.json");
    std::fs::write(&doc, json!({}).to_string()).unwrap();
    fleet.occ_ok(&[
        "configuration",
        "create",
        "bench",
        "cfg",
        "--file",
        &doc.display().to_string(),
    ]);
    let agents: Vec<String> = (0..count).map(|i| format!("k{i:03}")).collect();
    for a in &agents {
        fleet.occ_ok(&["agent", "create", "bench", a, "--configuration", "cfg"]);
    }
    let setup = setup.elapsed();

    // Timed: the deploy requests, then polling deployment-status until all converged.
    let requests_before = proxy.request_count();
    let t0 = Instant::now();
    let mut sent = Vec::new();
    for a in &agents {
        let at = t0.elapsed();
        fleet
            .api
            .request(
                "POST",
                &format!("/namespaces/bench/agents/{a}/deploy"),
                None,
            )
            .unwrap();
        sent.push((a.clone(), at));
    }
    let mut done: Vec<Option<Duration>> = vec![None; agents.len()];
    let deadline = Instant::now() + Duration::from_secs(900);
    while done.iter().any(Option::is_none) {
        for (i, (a, _)) in sent.iter().enumerate() {
            if done[i].is_some() {
                continue;
            }
            let s = fleet
                .api
                .request(
                    "GET",
                    &format!("/namespaces/bench/agents/{a}/deployment-status"),
                    None,
                )
                .unwrap();
            if s["converged"] == json!(true) {
                done[i] = Some(t0.elapsed());
            }
        }
        assert!(
            Instant::now() < deadline,
            "not all Agents converged within 900 s"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let wall = done.iter().flatten().max().copied().unwrap_or_default();
    let per_agent: Vec<Duration> = done
        .iter()
        .zip(&sent)
        .map(|(d, (_, at))| d.unwrap_or_default().saturating_sub(*at))
        .collect();
    let requests = proxy.request_count() - requests_before;
    println!("cluster fleet benchmark ({count} Agents, one cluster: the project's control plane)");
    println!(
        "  untimed setup (control plane, occ, cluster, Namespace, Agents): {}",
        secs(setup)
    );
    println!("  all {count} converged:          {}", secs(wall));
    println!(
        "  per-Agent deploy → converged: median {}",
        secs(median(&per_agent))
    );
    println!(
        "  Kubernetes API requests:      {requests} in all, {:.1} per Agent deploy",
        requests as f64 / count as f64
    );
    println!(
        "  Agents per second:            {:.1}",
        count as f64 / wall.as_secs_f64().max(1e-9)
    );
    drop(fleet);
    drop(proxy);
    drop(cp);
}
