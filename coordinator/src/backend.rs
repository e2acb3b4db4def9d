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
}

/// What [`GatewayDialer::open`] answers: the open stream, later.
pub type GatewayOpen<'a> =
    std::pin::Pin<Box<dyn Future<Output = Result<Box<dyn GatewayIo>, CallError>> + Send + 'a>>;

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
