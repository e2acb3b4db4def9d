//! The opt-in real-cluster suite (issue 12): on a machine with a real Kubernetes cluster
//! (kubelet, CNI, the gateway image pullable), one Agent is deployed through `occ` and must
//! converge with a gateway that really runs and answers `/readyz` in its Pod, then be replaced,
//! stopped and deleted. The control-plane tier cannot prove this: no container ever runs there.
//!
//! ```sh
//! CLAWFLEET_REAL_CLUSTER_KUBECONFIG=~/.kube/config \
//! CLAWFLEET_REAL_CLUSTER_CONTEXT=my-context \
//! CLAWFLEET_REAL_CLUSTER_IMAGE=registry.example/openclaw@sha256:<64 hex> \
//!   cargo test -p clawfleet-coordinator --test real_cluster -- --ignored --nocapture
//! ```
//!
//! It is `#[ignore]`d, so `.ci/run` lists it as ignored rather than pretending it ran.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "fleet_support/mod.rs"]
pub mod fleet;

use std::time::{Duration, Instant};

use fleet::Fleet;
use serde_json::json;

fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("set {name} to run the real-cluster suite"))
}

#[test]
#[ignore = "needs a real cluster: set CLAWFLEET_REAL_CLUSTER_KUBECONFIG, _CONTEXT and _IMAGE"]
fn one_agent_on_a_real_cluster() {
    let kubeconfig = env("CLAWFLEET_REAL_CLUSTER_KUBECONFIG");
    let context = env("CLAWFLEET_REAL_CLUSTER_CONTEXT");
    let image = env("CLAWFLEET_REAL_CLUSTER_IMAGE");
    let mut fleet = Fleet::start(0);
    fleet.occ_ok(&[
        "cluster",
        "add",
        "real",
        "--kubeconfig",
        &kubeconfig,
        "--context",
        &context,
        "--gateway-image",
        &image,
    ]);
    fleet.occ_ok(&["namespace", "create", "real-e2e", "--cluster", "real"]);
    let deadline = Instant::now() + Duration::from_secs(120);
    while fleet
        .api
        .request("GET", "/namespaces/real-e2e", None)
        .map(|n| n["ready"] != json!(true))
        .unwrap_or(true)
    {
        assert!(
            Instant::now() < deadline,
            "the Namespace never became ready"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    let doc = fleet.dir.path().join("cfg.json");
    std::fs::write(&doc, json!({}).to_string()).unwrap();
    let file = doc.display().to_string();
    fleet.occ_ok(&[
        "configuration",
        "create",
        "real-e2e",
        "cfg",
        "--file",
        &file,
    ]);
    fleet.occ_ok(&["agent", "create", "real-e2e", "a", "--configuration", "cfg"]);
    for round in 0..2 {
        if round == 1 {
            std::fs::write(&doc, json!({"logging": {"level": "debug"}}).to_string()).unwrap();
            fleet.occ_ok(&[
                "configuration",
                "update",
                "real-e2e",
                "cfg",
                "--file",
                &file,
            ]);
        }
        fleet.occ_ok(&[
            "agent",
            "deploy",
            "real-e2e",
            "a",
            "--wait",
            "--timeout",
            "600",
        ]);
    }
    fleet.occ_ok(&[
        "agent",
        "stop",
        "real-e2e",
        "a",
        "--wait",
        "--timeout",
        "600",
    ]);
    fleet.occ_ok(&[
        "agent",
        "delete",
        "real-e2e",
        "a",
        "--wait",
        "--timeout",
        "600",
    ]);
    fleet.occ_ok(&["namespace", "delete", "real-e2e"]);
    fleet.kill_serve();
}
