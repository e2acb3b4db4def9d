//! What a call to one target is, as every backend sees it: how to reach a host
//! ([`HostTarget`]), the per-call options, and the failure model ([`CallError`]). The
//! coordinator's backend seam (`coordinator/src/backend.rs`) re-exports these next to the
//! `Backend` trait; the SSH backend of this crate answers with them.

use std::time::Duration;

use clawfleet_api::codes::{AnyCode, Code};
use clawfleet_api::model::Jump;
use clawfleet_protocol::result::Progress;
use clawfleet_protocol::{Failure, HostName};
use thiserror::Error;

/// Where and how to reach one host. Everything here comes from the coordinator's database.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct HostTarget {
    /// The name envelopes address (hostd's `host_name`).
    pub name: HostName,
    /// Address to connect to (IP or DNS name); behind a jump host, as the jump host resolves
    /// and reaches it.
    pub address: String,
    pub port: u16,
    /// The pinned host key, one OpenSSH public key line (`ssh-ed25519 AAAA…`). A host that
    /// presents any other key is refused.
    pub host_key: String,
    /// The account to log in as, for hosts that forbid root login (its authorized_keys runs
    /// `sudo -n /usr/sbin/hostd serve` as the forced command; `hostd enrol --login-user`).
    /// `None`: the backend's login user (root).
    pub login_user: Option<String>,
    /// The jump host (bastion) the host is reached through: the coordinator opens a
    /// direct-tcpip channel on its SSH connection to it, one connection shared by every host
    /// behind it (its `login_user` `None`: the backend's login user). `None`: connect directly.
    pub jump: Option<Jump>,
}

/// Why a host target cannot be used as given.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("host {host}: `{field}` {message}")]
pub struct TargetError {
    pub host: String,
    pub field: &'static str,
    pub message: String,
}

/// A login name OpenSSH and useradd both take: letters, digits, `.`, `_`, `-` (not first),
/// at most 32 bytes.
pub fn check_login_user(user: &str) -> Result<(), String> {
    if user.is_empty() || user.len() > 32 {
        return Err("must be 1 to 32 characters long".to_owned());
    }
    if user.starts_with('-') {
        return Err("must not start with '-'".to_owned());
    }
    match user
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
    {
        Some(c) => Err(format!(
            "may hold only letters, digits, '.', '_' and '-', not {c:?}"
        )),
        None => Ok(()),
    }
}

impl HostTarget {
    /// The target for a host record from the database, with its login user and jump host.
    pub fn of(host: &clawfleet_api::model::Host) -> Self {
        Self {
            name: host.name.clone(),
            address: host.address.clone(),
            port: host.port,
            host_key: host.host_key.clone(),
            login_user: host.login_user.clone(),
            jump: host.jump.clone(),
        }
    }

    /// Checks what the SSH backend cannot check by connecting: the login users' names and
    /// the jump host's address and port. Host keys are checked at connection time (a bad
    /// one is a host key mismatch naming it).
    pub fn check(&self) -> Result<(), TargetError> {
        let err = |field: &'static str, message: String| TargetError {
            host: self.name.to_string(),
            field,
            message,
        };
        if let Some(user) = &self.login_user {
            check_login_user(user).map_err(|m| err("login_user", m))?;
        }
        if let Some(jump) = &self.jump {
            if let Some(user) = &jump.login_user {
                check_login_user(user).map_err(|m| err("jump.login_user", m))?;
            }
            if jump.address.trim().is_empty() || jump.address.chars().any(char::is_whitespace) {
                return Err(err(
                    "jump.address",
                    "must be a host name or IP address".to_owned(),
                ));
            }
            if jump.port == 0 {
                return Err(err("jump.port", "must be between 1 and 65535".to_owned()));
            }
        }
        Ok(())
    }
}

/// Per-call options.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CallOptions {
    /// How long hostd may work on the operation (the envelope's deadline).
    pub deadline: Duration,
    /// The Agent's fence from the work item's claim (Agent-scoped work only): a target that
    /// saw a higher one for the Agent refuses the operation with `FENCE_STALE`.
    pub fence: Option<u64>,
}

impl Default for CallOptions {
    fn default() -> Self {
        Self {
            deadline: Duration::from_secs(u64::from(
                clawfleet_protocol::envelope::DEFAULT_DEADLINE_SECONDS,
            )),
            fence: None,
        }
    }
}

/// Why a call did not produce a result from the host.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum CallError {
    /// hostd (or the cluster backend) answered with a failure (class, stable code, message).
    #[error("{0}")]
    Failed(Failure),
    /// No backend for this kind of target runs in this coordinator.
    #[error("no backend for {target}: {message}")]
    Unsupported { target: String, message: String },
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
            CallError::HostKeyMismatch { .. }
            | CallError::AuthenticationRefused { .. }
            | CallError::Unsupported { .. } => false,
        }
    }

    /// The call's stable code (for `lastAttempt.code` and the API's answers).
    pub fn code(&self) -> AnyCode {
        match self {
            CallError::Failed(f) => AnyCode::Target(f.code),
            CallError::Transport { .. } => Code::HostUnreachable.into(),
            CallError::HostKeyMismatch { .. } => Code::HostKeyMismatch.into(),
            CallError::AuthenticationRefused { .. } => Code::HostAuthRefused.into(),
            CallError::Unsupported { .. } => Code::BackendUnsupported.into(),
        }
    }
}

/// A progress callback (for `occ ... --wait`).
pub type ProgressSink = std::sync::Arc<dyn Fn(&HostName, &Progress) + Send + Sync>;

/// One open byte stream to an Agent's gateway: what the coordinator's `GatewayDialer::open`
/// answers.
pub trait GatewayIo: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin {}

impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin> GatewayIo for T {}
