//! Versions and harness settings. The versions must equal the wrapper modules in go/ (a unit test
//! checks), because they name the cache directory build-control-plane.sh writes.

use std::path::PathBuf;
use std::time::Duration;

use crate::error::{Error, Result};

/// Kubernetes release of kube-apiserver, kube-controller-manager and kube-scheduler.
pub const KUBERNETES_VERSION: &str = "v1.37.2";
/// etcd server release.
pub const ETCD_VERSION: &str = "v3.6.16";
/// kwok release.
pub const KWOK_VERSION: &str = "v0.8.0";

/// Default parent of the keyed binary directories (`CLAWFLEET_K8S_CACHE_ROOT` in the script).
pub const DEFAULT_CACHE_ROOT: &str = "/var/cache/clawfleet-k8s";

/// `k8s1.37.2-etcd3.6.16-kwok0.8.0`: the directory name build-control-plane.sh uses.
pub fn cache_key() -> String {
    let bare = |v: &str| v.trim_start_matches('v').to_string();
    format!(
        "k8s{}-etcd{}-kwok{}",
        bare(KUBERNETES_VERSION),
        bare(ETCD_VERSION),
        bare(KWOK_VERSION)
    )
}

/// The real node's pause program source (its hash keys the node directory).
const PAUSE_SOURCES: [&[u8]; 2] = [
    include_bytes!("../go/pause/go.mod"),
    include_bytes!("../go/pause/main.go"),
];

/// `node-k8s1.37.2-pause<12 hex>`: the directory name build-node.sh uses for the kubelet and
/// the pause program (the hash is of go/pause/go.mod followed by go/pause/main.go).
pub fn node_cache_key() -> String {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    for part in PAUSE_SOURCES {
        h.update(part);
    }
    let hex: String = h.finalize().iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "node-k8s{}-pause{}",
        KUBERNETES_VERSION.trim_start_matches('v'),
        &hex[..12]
    )
}

/// Where the harness finds binaries, keeps its state, and how long it waits.
#[derive(Debug, Clone)]
pub struct HarnessConfig {
    /// Directory with etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kwok and
    /// stages/ (`CLAWFLEET_K8S_BIN_DIR`; default `<CLAWFLEET_K8S_CACHE_ROOT>/<cache_key>`).
    pub bin_dir: PathBuf,
    /// The real node's kubelet and pause program (`CLAWFLEET_K8S_NODE_DIR`; default
    /// `<CLAWFLEET_K8S_CACHE_ROOT>/<node_cache_key>`).
    pub node_dir: PathBuf,
    /// Run locks, records and directories of every control plane on the machine
    /// (`CLAWFLEET_K8S_STATE_DIR`, default `/var/lib/clawfleet-k8s-tests`).
    pub state_dir: PathBuf,
    /// From the first spawn to a Ready node and the `default` ServiceAccount
    /// (`CLAWFLEET_K8S_START_TIMEOUT_SECS`, 180).
    pub start_timeout: Duration,
    /// SIGTERM before SIGKILL at teardown, per group (`CLAWFLEET_K8S_STOP_TIMEOUT_SECS`, 5).
    pub stop_timeout: Duration,
    /// Keep the component logs after a clean teardown too (`CLAWFLEET_K8S_KEEP_LOGS=1`); they are
    /// always kept when a test panics or the start fails.
    pub keep_logs: bool,
    /// Put etcd's data on tmpfs (/dev/shm) when it is there (`CLAWFLEET_K8S_ETCD_TMPFS`, 1).
    pub etcd_on_tmpfs: bool,
}

impl Default for HarnessConfig {
    fn default() -> Self {
        HarnessConfig {
            bin_dir: PathBuf::from(DEFAULT_CACHE_ROOT).join(cache_key()),
            node_dir: PathBuf::from(DEFAULT_CACHE_ROOT).join(node_cache_key()),
            state_dir: PathBuf::from("/var/lib/clawfleet-k8s-tests"),
            start_timeout: Duration::from_secs(180),
            stop_timeout: Duration::from_secs(5),
            keep_logs: false,
            etcd_on_tmpfs: true,
        }
    }
}

fn secs(name: &'static str, value: String) -> Result<Duration> {
    value
        .trim()
        .parse::<f64>()
        .ok()
        .filter(|v| v.is_finite() && *v > 0.0)
        .map(Duration::from_secs_f64)
        .ok_or(Error::InvalidSetting {
            name,
            value,
            reason: "expected a positive number of seconds",
        })
}

fn flag(name: &'static str, value: String) -> Result<bool> {
    match value.trim() {
        "1" | "true" | "yes" => Ok(true),
        "0" | "false" | "no" => Ok(false),
        _ => Err(Error::InvalidSetting {
            name,
            value,
            reason: "expected 1 or 0",
        }),
    }
}

fn absolute(name: &'static str, value: String) -> Result<PathBuf> {
    let p = PathBuf::from(&value);
    if p.is_absolute() {
        Ok(p)
    } else {
        Err(Error::InvalidSetting {
            name,
            value,
            reason: "expected an absolute path",
        })
    }
}

impl HarnessConfig {
    /// Defaults overridden by the `CLAWFLEET_K8S_*` environment variables.
    pub fn from_env() -> Result<Self> {
        let mut c = HarnessConfig::default();
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
        if let Some(v) = var("CLAWFLEET_K8S_CACHE_ROOT") {
            let root = absolute("CLAWFLEET_K8S_CACHE_ROOT", v)?;
            c.bin_dir = root.join(cache_key());
            c.node_dir = root.join(node_cache_key());
        }
        if let Some(v) = var("CLAWFLEET_K8S_BIN_DIR") {
            c.bin_dir = absolute("CLAWFLEET_K8S_BIN_DIR", v)?;
        }
        if let Some(v) = var("CLAWFLEET_K8S_NODE_DIR") {
            c.node_dir = absolute("CLAWFLEET_K8S_NODE_DIR", v)?;
        }
        if let Some(v) = var("CLAWFLEET_K8S_STATE_DIR") {
            c.state_dir = absolute("CLAWFLEET_K8S_STATE_DIR", v)?;
        }
        if let Some(v) = var("CLAWFLEET_K8S_START_TIMEOUT_SECS") {
            c.start_timeout = secs("CLAWFLEET_K8S_START_TIMEOUT_SECS", v)?;
        }
        if let Some(v) = var("CLAWFLEET_K8S_STOP_TIMEOUT_SECS") {
            c.stop_timeout = secs("CLAWFLEET_K8S_STOP_TIMEOUT_SECS", v)?;
        }
        if let Some(v) = var("CLAWFLEET_K8S_KEEP_LOGS") {
            c.keep_logs = flag("CLAWFLEET_K8S_KEEP_LOGS", v)?;
        }
        if let Some(v) = var("CLAWFLEET_K8S_ETCD_TMPFS") {
            c.etcd_on_tmpfs = flag("CLAWFLEET_K8S_ETCD_TMPFS", v)?;
        }
        Ok(c)
    }

    /// Locks and records of runs (`<state>/runs`).
    pub fn runs_dir(&self) -> PathBuf {
        self.state_dir.join("runs")
    }

    /// Component logs of runs, kept after failures (`<state>/logs`).
    pub fn logs_dir(&self) -> PathBuf {
        self.state_dir.join("logs")
    }

    /// Path of one binary of the control plane.
    pub fn binary(&self, name: &str) -> PathBuf {
        self.bin_dir.join(name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn go_mod_requires(module_dir: &str, module: &str) -> Option<String> {
        let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("go")
            .join(module_dir)
            .join("go.mod");
        let text = std::fs::read_to_string(path).ok()?;
        text.lines().find_map(|l| {
            let mut words = l.split_whitespace();
            let first = words.next()?;
            let (name, version) = if first == "require" {
                (words.next()?, words.next()?)
            } else {
                (first, words.next()?)
            };
            (name == module && version.starts_with('v')).then(|| version.to_string())
        })
    }

    #[test]
    fn versions_equal_the_wrapper_modules() {
        assert_eq!(
            go_mod_requires("kubernetes", "k8s.io/kubernetes").as_deref(),
            Some(KUBERNETES_VERSION)
        );
        assert_eq!(
            go_mod_requires("etcd", "go.etcd.io/etcd/server/v3").as_deref(),
            Some(ETCD_VERSION)
        );
        assert_eq!(
            go_mod_requires("kwok", "sigs.k8s.io/kwok").as_deref(),
            Some(KWOK_VERSION)
        );
    }

    #[test]
    fn cache_key_matches_the_build_script() {
        assert_eq!(cache_key(), "k8s1.37.2-etcd3.6.16-kwok0.8.0");
    }

    /// The directory a build script says it writes (`--print-dir`) under a given cache root.
    fn printed_dir(script: &str) -> PathBuf {
        let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(script);
        let out = std::process::Command::new("bash")
            .arg(&script)
            .arg("--print-dir")
            .env("CLAWFLEET_K8S_CACHE_ROOT", "/nonexistent-root")
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        PathBuf::from(String::from_utf8(out.stdout).unwrap().trim())
    }

    #[test]
    fn the_build_script_writes_where_the_harness_looks() {
        assert_eq!(
            printed_dir("build-control-plane.sh"),
            PathBuf::from("/nonexistent-root").join(cache_key())
        );
    }

    #[test]
    fn the_node_build_script_writes_where_the_harness_looks() {
        assert_eq!(
            printed_dir("build-node.sh"),
            PathBuf::from("/nonexistent-root").join(node_cache_key())
        );
    }

    #[test]
    fn bad_settings_are_refused() {
        assert!(secs("X", "0".into()).is_err());
        assert!(secs("X", "abc".into()).is_err());
        assert_eq!(
            secs("X", "2.5".into()).ok(),
            Some(Duration::from_millis(2500))
        );
        assert!(flag("X", "maybe".into()).is_err());
        assert!(absolute("X", "relative/dir".into()).is_err());
    }
}
