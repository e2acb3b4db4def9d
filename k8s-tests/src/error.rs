//! The harness's error type: one sentence per variant, so a failed test says what broke.

use std::path::PathBuf;
use std::time::Duration;

/// Everything that can go wrong while preparing, starting, driving or tearing down the
/// control plane.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A binary of the control plane is not in the binary directory.
    #[error(
        "{} is missing; build the control plane with k8s-tests/build-control-plane.sh \
         (or point CLAWFLEET_K8S_BIN_DIR at its output)",
        path.display()
    )]
    MissingBinary { path: PathBuf },

    /// A component could not be started at all.
    #[error("could not start {component} ({}): {source}", path.display())]
    Spawn {
        component: String,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// A file-system operation failed.
    #[error("could not {action} {}: {source}", path.display())]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// An environment setting of the harness has a value it cannot use.
    #[error("setting {name}={value:?} is invalid: {reason}")]
    InvalidSetting {
        name: &'static str,
        value: String,
        reason: &'static str,
    },

    /// No free loopback port could be reserved.
    #[error("could not reserve a free port on 127.0.0.1: {source}")]
    NoPort {
        #[source]
        source: std::io::Error,
    },

    /// Making a certificate or key failed.
    #[error("could not make the {what}: {source}")]
    Pki {
        what: &'static str,
        #[source]
        source: rcgen::Error,
    },

    /// A component exited while the harness waited for it or relied on it.
    #[error("{component} (pid {pid}) exited ({status}); last lines of {}:\n{tail}", log.display())]
    Exited {
        component: String,
        pid: u32,
        status: String,
        log: PathBuf,
        tail: String,
    },

    /// A readiness condition did not become true in time.
    #[error(
        "the control plane was not ready within {timeout:?}: {waiting_for} (last: {last}); \
         component logs in {}:\n{tails}",
        logs.display()
    )]
    NotReady {
        waiting_for: String,
        timeout: Duration,
        last: String,
        logs: PathBuf,
        tails: String,
    },

    /// The Kubernetes client could not be configured from the written kubeconfig.
    #[error("the kubeconfig {} does not give a usable client: {reason}", path.display())]
    Kubeconfig { path: PathBuf, reason: String },

    /// A run record on disk could not be parsed, so its processes cannot be found.
    #[error("run record {} is unreadable: {reason}", path.display())]
    BadRecord { path: PathBuf, reason: String },

    /// Some processes or files of a run could not be removed.
    #[error("teardown of control plane {id} left things behind: {detail}")]
    Teardown { id: String, detail: String },

    /// The operation needs a component that is not running (e.g. the apiserver was killed).
    #[error("{component} is not running")]
    NotRunning { component: &'static str },

    /// A built-in manifest does not parse as its Kubernetes type (a harness bug).
    #[error("{what} manifest is invalid: {reason}")]
    Manifest { what: &'static str, reason: String },

    /// The fault-injection proxy could not be set up.
    #[error("the real node: {reason}")]
    Node { reason: String },

    #[error("building an OCI image: {reason}")]
    Image { reason: String },

    #[error("the fault-injection proxy could not start: {reason}")]
    Proxy { reason: String },
}

/// Result alias of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub(crate) fn io(
        action: &'static str,
        path: impl Into<PathBuf>,
        source: std::io::Error,
    ) -> Self {
        Error::Io {
            action,
            path: path.into(),
            source,
        }
    }
}
