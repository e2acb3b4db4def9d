//! `k8scp`: the control-plane harness by hand.
//!
//! - `k8scp up`: start a control plane, print its kubeconfig path and timings, run until Ctrl-C.
//!   `k8scp up --node` also starts a real node (kubelet, containerd, runc, CNI) and prints its
//!   record's path; Ctrl-C stops the control plane, and the node is reclaimed by the next
//!   `k8scp clean` or `Node::start` (its lock is free once this process is gone).
//! - `k8scp list`: every run on the machine (live or stale) with its recorded pids.
//! - `k8scp clean`: tear down every run whose test process is dead.

use std::process::ExitCode;

use clawfleet_k8s_tests::{
    ControlPlane, HarnessConfig, Node, list_runs, reclaim_stale, reclaim_stale_nodes,
};

fn main() -> ExitCode {
    let cmd = std::env::args().nth(1).unwrap_or_default();
    let config = match HarnessConfig::from_env() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("k8scp: {e}");
            return ExitCode::FAILURE;
        }
    };
    match cmd.as_str() {
        "up" => up(
            &config,
            std::env::args().nth(2).as_deref() == Some("--node"),
        ),
        "list" => match list_runs(&config) {
            Ok(runs) => {
                for (rec, live) in runs {
                    let state = if live { "in use" } else { "stale" };
                    println!("{} {state} owner pid {}", rec.id, rec.owner_pid);
                    for p in &rec.processes {
                        println!("  {} pid {}", p.component, p.pid);
                    }
                    for l in rec.leftovers() {
                        println!("  still there: {l}");
                    }
                }
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("k8scp: {e}");
                ExitCode::FAILURE
            }
        },
        "clean" => match reclaim_stale(&config) {
            Ok(r) => {
                for line in reclaim_stale_nodes(&config) {
                    println!("{line}");
                }
                println!("reclaimed {} stale control plane(s)", r.len());
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("k8scp: {e}");
                ExitCode::FAILURE
            }
        },
        _ => {
            eprintln!("usage: k8scp up [--node] | list | clean");
            ExitCode::from(2)
        }
    }
}

fn up(config: &HarnessConfig, with_node: bool) -> ExitCode {
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("k8scp: no tokio runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    rt.block_on(async {
        match ControlPlane::start_with(config).await {
            Ok(cp) => {
                println!("control plane {} up: {}", cp.id(), cp.api_url());
                println!("start: {}", cp.timings());
                println!("export KUBECONFIG={}", cp.kubeconfig_path().display());
                println!("logs: {}", cp.logs_dir().display());
                println!(
                    "pod logs (CRI lines, every Pod and container): {} (previous: {})",
                    cp.pod_logs_file().display(),
                    cp.pod_previous_logs_file().display()
                );
                let _node = if with_node {
                    match Node::start(&cp).await {
                        Ok(n) => {
                            println!(
                                "node {} up: {} in {:.1} s; record {}",
                                n.record().id,
                                n.ip(),
                                n.started_in().as_secs_f64(),
                                n.record_path().display()
                            );
                            Some(n)
                        }
                        Err(e) => {
                            eprintln!("k8scp: {e}");
                            return ExitCode::FAILURE;
                        }
                    }
                } else {
                    None
                };
                println!("Ctrl-C stops it");
                // The signal handler tears it down and exits.
                loop {
                    tokio::time::sleep(std::time::Duration::from_secs(3600)).await;
                }
            }
            Err(e) => {
                eprintln!("k8scp: {e}");
                ExitCode::FAILURE
            }
        }
    })
}
