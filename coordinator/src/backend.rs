//! The seam between the deployment worker and where Agents run: one call sends one operation
//! to one target, a host (SSH + hostd, [`crate::ssh`]) or a Kubernetes cluster
//! (`clawfleet-kube`), and returns its typed result with the same failure model. The worker
//! does not know which kind it talks to; the state-machine tests put hostd's own engine
//! behind the same trait.

use crate::model::Jump;
use std::future::Future;
use std::time::Duration;

use crate::codes::{AnyCode, Code};
use clawfleet_protocol::result::{OperationResult, Progress};
use clawfleet_protocol::{Failure, HostName, Operation};
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
    pub fn of(host: &crate::model::Host) -> Self {
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

/// Where and how to reach one cluster: its record from the database (credentials included).
#[derive(Debug, Clone, PartialEq)]
pub struct ClusterTarget {
    pub name: String,
    pub record: crate::model::ClusterRecord,
}

/// The target of one call: a host or a cluster.
#[derive(Debug, Clone, PartialEq)]
pub enum Target {
    Host(HostTarget),
    Cluster(ClusterTarget),
}

impl Target {
    /// The host or cluster name, for logs and messages.
    pub fn name(&self) -> &str {
        match self {
            Target::Host(h) => h.name.as_str(),
            Target::Cluster(c) => &c.name,
        }
    }
}

impl From<&HostTarget> for Target {
    fn from(h: &HostTarget) -> Self {
        Target::Host(h.clone())
    }
}

impl From<HostTarget> for Target {
    fn from(h: HostTarget) -> Self {
        Target::Host(h)
    }
}

impl From<ClusterTarget> for Target {
    fn from(c: ClusterTarget) -> Self {
        Target::Cluster(c)
    }
}

impl From<&Target> for Target {
    fn from(t: &Target) -> Self {
        t.clone()
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

/// One open byte stream to an Agent's gateway: what [`GatewayDialer::open`] answers.
pub trait GatewayIo: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin {}

impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin> GatewayIo for T {}

/// Opens byte streams to Agents' gateways (issue 30): on hosts through hostd's relay channel
/// (`crate::ssh`), on clusters through the API server's port-forward to the Agent's Pod.
/// Object safe, so the API holds it as `&dyn GatewayDialer` whatever the backend.
pub trait GatewayDialer: Send + Sync {
    /// A stream to the gateway of `namespace/agent` on `target`, opened for `caller` (the API
    /// principal, logged where the stream ends). The gateway's address is the target's to
    /// know, never the caller's to say.
    fn open<'a>(
        &'a self,
        target: &'a Target,
        namespace: &'a clawfleet_protocol::Ident,
        agent: &'a clawfleet_protocol::Ident,
        caller: &'a str,
    ) -> GatewayOpen<'a>;

    /// [`GatewayDialer::open`], with the gateway's own credential read by the target from
    /// its own state (hosts: hostd's password file, answered in the relay's `Opened` frame;
    /// clusters: the Agent's Secret), for the gateway route to add at the last hop so the
    /// caller never learns it. Dialers that cannot tell the credential refuse.
    fn open_with_auth<'a>(
        &'a self,
        target: &'a Target,
        _namespace: &'a clawfleet_protocol::Ident,
        _agent: &'a clawfleet_protocol::Ident,
        _caller: &'a str,
    ) -> GatewayOpenWithAuth<'a> {
        Box::pin(async move {
            Err(CallError::Unsupported {
                target: target.name().to_owned(),
                message: "this backend cannot tell an Agent's gateway password".to_owned(),
            })
        })
    }
}

/// What [`GatewayDialer::open`] answers: the open stream, later.
pub type GatewayOpen<'a> =
    std::pin::Pin<Box<dyn Future<Output = Result<Box<dyn GatewayIo>, CallError>> + Send + 'a>>;

/// What [`GatewayDialer::open_with_auth`] answers.
pub type GatewayOpenWithAuth<'a> =
    std::pin::Pin<Box<dyn Future<Output = Result<GatewayStream, CallError>> + Send + 'a>>;

/// A stream to an Agent's gateway and the gateway's password (kept in memory for this
/// stream only, never logged).
pub struct GatewayStream {
    pub io: Box<dyn GatewayIo>,
    /// `None` when the Agent's gateway takes no password.
    pub password: Option<GatewayPassword>,
}

impl std::fmt::Debug for GatewayStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GatewayStream")
            .field("password", &self.password)
            .finish_non_exhaustive()
    }
}

/// An Agent's gateway password: zeroed when dropped, redacted in `Debug`.
#[derive(Clone)]
pub struct GatewayPassword(zeroize::Zeroizing<String>);

impl GatewayPassword {
    pub fn new(password: String) -> Self {
        Self(zeroize::Zeroizing::new(password))
    }

    /// The password itself, for the last hop's header.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for GatewayPassword {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("GatewayPassword([REDACTED])")
    }
}

/// Sends operations to hosts and clusters.
pub trait Backend: Send + Sync + 'static {
    /// The backend's gateway dialer, `None` when it opens no gateway streams.
    fn gateway(&self) -> Option<&dyn GatewayDialer> {
        None
    }

    /// Sends one operation and waits for its result. Host implementations sign the envelope,
    /// mint its operation id, and, if the session drops after sending, learn the outcome with
    /// `operation-status` rather than guessing.
    fn call(
        &self,
        target: impl Into<Target> + Send,
        operation: Operation,
        options: CallOptions,
    ) -> impl Future<Output = Result<OperationResult, CallError>> + Send;

    /// The permissions a cluster's identity lacks of those clawfleet needs (each as
    /// `verb resource[.group] (where)`), checked when a cluster is registered or its
    /// credentials replaced. Backends without clusters have nothing to check.
    fn missing_cluster_access(
        &self,
        _target: &ClusterTarget,
    ) -> impl Future<Output = Result<Vec<String>, CallError>> + Send {
        async { Ok(Vec::new()) }
    }

    /// Puts an Agent's whole set of secrets into its Secret on a cluster (an empty set
    /// removes it), fenced by `options.fence`. The values travel in clear only over the
    /// cluster API's TLS connection, from this process: a cluster has no host key to seal
    /// them to. Backends without clusters refuse.
    fn put_cluster_secrets(
        &self,
        target: &ClusterTarget,
        _secrets: &clawfleet_kube::AgentSecrets,
        _options: CallOptions,
    ) -> impl Future<Output = Result<clawfleet_protocol::sealed::PutSecretsResult, CallError>> + Send
    {
        let target = target.name.clone();
        async move {
            Err(CallError::Unsupported {
                target,
                message: "this coordinator runs no Kubernetes backend".to_owned(),
            })
        }
    }
}
