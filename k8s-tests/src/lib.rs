//! A real Kubernetes control plane for the tests: etcd, kube-apiserver, kube-controller-manager,
//! kube-scheduler and kwok (fake nodes that make bound Pods Running/Ready and finish deletions),
//! built from the Go module proxy by `k8s-tests/build-control-plane.sh` and started here on
//! 127.0.0.1 with ports picked per run, so several test processes can each have their own.
//!
//! ```no_run
//! use clawfleet_k8s_tests::{ControlPlane, skip_unless_control_plane};
//!
//! # async fn t() {
//! skip_unless_control_plane!(); // "SKIP: ..." and return when not root / no binaries (fails under CI=true)
//! let cp = ControlPlane::start().await.unwrap();
//! let client = cp.client().await.unwrap(); // or cp.kubeconfig_path() for code that reads a file
//! # let _ = client;
//! // dropped: every process stopped by pid, files removed
//! # }
//! ```
//!
//! See k8s-tests/README.md for the recorded ids, teardown and the measured costs.

mod config;
mod control_plane;
mod error;
mod fake_apiserver;
mod gateway_image;
mod image;
mod node;
mod pki;
mod pod_logs;
mod proxy;
mod run;
mod signals;
mod sys;
mod tier;

pub use config::{
    DEFAULT_CACHE_ROOT, ETCD_VERSION, HarnessConfig, KUBERNETES_VERSION, KWOK_VERSION, cache_key,
    node_cache_key,
};
pub use control_plane::{
    ADMIN_USER, BACKEND_USER, BINARIES, ControlPlane, FAIL_PULL_MARKER, KWOK_NODE_LABEL,
    LIMITED_USER, NEVER_READY_MARKER, NODE_IP, NODE_LEASE_SECONDS, NODE_NAME, POD_CIDR,
    SERVICE_CIDR, STORAGE_CLASS, StartTimings, client_from_kubeconfig, kubeconfig_for,
    wait_for_default_service_account,
};
pub use error::{Error, Result};
pub use fake_apiserver::{FAKE_VERSION, FakeAnswer, FakeApiserver, FakeRequest};
pub use gateway_image::{
    BUSYBOX, TEST_GATEWAY_PATH, TEST_GATEWAY_REPO, build_static_test_gateway, openclaw_image,
    test_gateway_image,
};
pub use image::{BuiltImage, build_archive, minimal_rootfs};
pub use node::{
    NODE_STORAGE_CLASS, Node, NodeRecord, NodeTimings, PAUSE_IMAGE, REAL_NODE_LABEL,
    REAL_NODE_NAME, SYSCTLS, TeardownReport, leftovers, live_node_count, node_missing_prerequisite,
    reclaim_stale_nodes,
};
pub use pki::{APISERVER_DNS_NAMES, CertAndKey, Pki};
pub use pod_logs::{LogStream, cri_log_line, log_timestamp};
pub use proxy::{Fault, FaultProxy, SeenRequest};
pub use run::{ProcessRecord, RunRecord, list_runs, reclaim_stale};
pub use tier::{Tier, TierCluster, TierTimings};

/// Why the control plane cannot run here, or `None` when it can. Under `CI=true` a missing
/// prerequisite is a failure, not a skip: this panics with the reason, so CI can never pass by
/// silently skipping the control-plane tests.
pub fn skip_reason() -> Option<String> {
    let reason = missing_prerequisite();
    if let Some(r) = &reason {
        let ci = std::env::var("CI").is_ok_and(|v| v == "true" || v == "1");
        if ci {
            panic!("CI is set but the Kubernetes control plane cannot run: {r}");
        }
    }
    reason
}

fn missing_prerequisite() -> Option<String> {
    if !sys::is_root() {
        return Some(
            "the Kubernetes control plane tier runs as root (state in /var/lib, binaries in \
             /var/cache); run the tests as root"
                .into(),
        );
    }
    let config = match HarnessConfig::from_env() {
        Ok(c) => c,
        Err(e) => return Some(e.to_string()),
    };
    for b in BINARIES {
        let p = config.binary(b);
        if !p.is_file() {
            return Some(format!(
                "{} is missing; build it with k8s-tests/build-control-plane.sh (a cold build \
                 takes 15-40 min) or set CLAWFLEET_K8S_BIN_DIR",
                p.display()
            ));
        }
    }
    for s in control_plane::SHIPPED_STAGES {
        let p = config.bin_dir.join("stages").join(s);
        if !p.is_file() {
            return Some(format!(
                "{} is missing; run k8s-tests/build-control-plane.sh again (it copies kwok's \
                 stage files) or set CLAWFLEET_K8S_BIN_DIR",
                p.display()
            ));
        }
    }
    None
}

/// Why the real node (kubelet, containerd, runc, CNI) cannot run here, or `None` when it can;
/// like [`skip_reason`], a missing prerequisite panics under `CI=true`.
pub fn node_skip_reason() -> Option<String> {
    if let Some(r) = skip_reason() {
        return Some(r);
    }
    let reason = match HarnessConfig::from_env() {
        Ok(c) => node_missing_prerequisite(&c),
        Err(e) => Some(e.to_string()),
    };
    if let Some(r) = &reason {
        let ci = std::env::var("CI").is_ok_and(|v| v == "true" || v == "1");
        if ci {
            panic!("CI is set but the real Kubernetes node cannot run: {r}");
        }
    }
    reason
}

/// Returns from the calling test with a "SKIP: ..." line when the control plane cannot run
/// (see [`skip_reason`]; under `CI=true` it fails instead).
#[macro_export]
macro_rules! skip_unless_control_plane {
    () => {
        if let Some(reason) = $crate::skip_reason() {
            eprintln!("SKIP: {reason}");
            return;
        }
    };
}
