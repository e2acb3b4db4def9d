//! The seam between the deployment worker and the hosts: one call sends one operation to one
//! host and returns its typed result. The SSH backend ([`crate::ssh`]) implements it for real;
//! the worker's state-machine tests use a fake behind the same trait.

use std::future::Future;
use std::time::Duration;

use clawfleet_protocol::result::{OperationResult, Progress};
use clawfleet_protocol::{Failure, HostName, Operation};
use thiserror::Error;

/// Where and how to reach one host. Everything here comes from the coordinator's database.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostTarget {
    /// The name envelopes address (hostd's `host_name`).
    pub name: HostName,
    /// Address to connect to (IP or DNS name).
    pub address: String,
    pub port: u16,
    /// The pinned host key, one OpenSSH public key line (`ssh-ed25519 AAAA…`). A host that
    /// presents any other key is refused.
    pub host_key: String,
}

impl HostTarget {
    /// The target for a host record from the database.
    pub fn of(host: &crate::model::Host) -> Result<Self, clawfleet_protocol::ident::IdentError> {
        Ok(Self {
            name: HostName::new(host.name.as_str())?,
            address: host.address.clone(),
            port: host.port,
            host_key: host.host_key.clone(),
        })
    }
}

/// Per-call options.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CallOptions {
    /// How long hostd may work on the operation (the envelope's deadline).
    pub deadline: Duration,
}

impl Default for CallOptions {
    fn default() -> Self {
        Self {
            deadline: Duration::from_secs(u64::from(
                clawfleet_protocol::envelope::DEFAULT_DEADLINE_SECONDS,
            )),
        }
    }
}

/// Why a call did not produce a result from the host.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum CallError {
    /// hostd answered with a failure (class, stable code, message).
    #[error("host refused or failed the operation: {0}")]
    Failed(Failure),
    /// The host could not be reached, the session dropped and the outcome could not be
    /// learned, or a timeout passed. Retry later.
    #[error("transport to {host}: {message}")]
    Transport { host: String, message: String },
    /// The host presented a key other than the pinned one (or none is pinned). Permanent
    /// until an operator re-enrols the host.
    #[error(
        "host {host} presented key {presented}, but {expected} is pinned; refusing to talk to it"
    )]
    HostKeyMismatch {
        host: String,
        presented: String,
        expected: String,
    },
    /// The host does not accept the coordinator's login key.
    #[error("host {host} refused the coordinator's SSH key; enrol the host first")]
    AuthenticationRefused { host: String },
}

impl CallError {
    /// Whether a later attempt may succeed.
    pub fn is_retryable(&self) -> bool {
        match self {
            CallError::Failed(f) => f.is_retryable(),
            CallError::Transport { .. } => true,
            CallError::HostKeyMismatch { .. } | CallError::AuthenticationRefused { .. } => false,
        }
    }

    /// A stable code for `lastAttempt.code`.
    pub fn code(&self) -> &'static str {
        match self {
            CallError::Failed(f) => f.code.as_str(),
            CallError::Transport { .. } => "HOST_UNREACHABLE",
            CallError::HostKeyMismatch { .. } => "HOST_KEY_MISMATCH",
            CallError::AuthenticationRefused { .. } => "HOST_AUTH_REFUSED",
        }
    }
}

/// A progress callback (for `occ ... --wait`).
pub type ProgressSink = std::sync::Arc<dyn Fn(&HostName, &Progress) + Send + Sync>;

/// Sends operations to hosts.
pub trait Backend: Send + Sync + 'static {
    /// Sends one operation and waits for its result. Implementations sign the envelope, mint
    /// its operation id, and, if the session drops after sending, learn the outcome with
    /// `operation-status` rather than guessing.
    fn call(
        &self,
        host: &HostTarget,
        operation: Operation,
        options: CallOptions,
    ) -> impl Future<Output = Result<OperationResult, CallError>> + Send;
}
