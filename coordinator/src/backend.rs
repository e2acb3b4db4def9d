//! The seam between the deployment worker and where Agents run: one call sends one operation
//! to one target, a host (SSH + hostd, [`crate::ssh`]) or a Kubernetes cluster
//! (`clawfleet-kube`), and returns its typed result with the same failure model. The worker
//! does not know which kind it talks to; the state-machine tests put hostd's own engine
//! behind the same trait.

use std::future::Future;

use clawfleet_protocol::Operation;
use clawfleet_protocol::result::OperationResult;

// What a call is (how to reach a host, the options, the failure model) is shared with the SSH
// backend, which answers with it.
pub use clawfleet_ssh_backend::backend::{
    CallError, CallOptions, GatewayIo, HostTarget, ProgressSink, TargetError, check_login_user,
};

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
