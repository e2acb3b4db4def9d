//! The backend `occ serve` runs: host targets go to the SSH backend ([`crate::ssh`]), cluster
//! targets to the Kubernetes backend (`clawfleet-kube`), so one coordinator drives both kinds at
//! once and the worker never knows which it talks to.

use std::sync::Arc;

use clawfleet_kube::{Cluster, ClusterCredentials, ClusterSettings, KubeBackend};
use clawfleet_protocol::result::OperationResult;
use clawfleet_protocol::{Failure, FailureCode, Operation};

use crate::backend::{Backend, CallError, CallOptions, ClusterTarget, Target};
use crate::ssh::SshBackend;

/// Host and cluster backends behind one [`Backend`].
#[derive(Debug)]
pub struct Backends {
    pub ssh: Arc<SshBackend>,
    pub kube: Arc<KubeBackend>,
}

/// The Kubernetes backend's view of a stored cluster. The stored credentials and settings were
/// validated at registration; they are validated again here, so a damaged row fails only the
/// operations of its own cluster, with a clear code.
pub fn kube_cluster(target: &ClusterTarget) -> Result<Cluster, Failure> {
    let invalid = |what: &str, e: String| {
        Failure::new(
            FailureCode::KubernetesConfigurationInvalid,
            format!(
                "cluster {}: the stored {what} are not valid: {e}",
                target.name
            ),
        )
    };
    let credentials: ClusterCredentials = serde_json::from_value(target.record.credentials.clone())
        .map_err(|e| invalid("credentials", e.to_string()))?;
    let settings = ClusterSettings::from_json(target.record.cluster.settings.clone())
        .map_err(|e| invalid("settings", format!("{}: {}", e.field, e.reason)))?;
    Ok(Cluster {
        name: target.name.clone(),
        credentials,
        settings,
    })
}

/// How long finding the Agent's Pod and the port-forward's upgrade may take.
const GATEWAY_OPEN_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(15);

/// A port-forward that did not open, as the call's failure: the Agent not deployed is
/// `AGENT_MISSING`; no Ready Pod or no answer `GATEWAY_UNREACHABLE` (retryable); a refusal by
/// the API server `KUBERNETES_API_REJECTED`, naming the permission when that is what it lacks.
fn gateway_stream_error(e: clawfleet_kube::GatewayStreamError) -> CallError {
    use clawfleet_kube::GatewayStreamError as E;
    let code = match &e {
        E::Cluster(f) => return CallError::Failed(f.clone()),
        E::NotDeployed { .. } => FailureCode::AgentMissing,
        E::NoPod { .. } | E::NotReady { .. } | E::Unavailable { .. } => {
            FailureCode::GatewayUnreachable
        }
        E::Forbidden { .. } | E::Refused { .. } => FailureCode::KubernetesApiRejected,
    };
    CallError::Failed(Failure::new(code, e.to_string()))
}

impl crate::backend::GatewayDialer for Backends {
    fn open<'a>(
        &'a self,
        target: &'a Target,
        namespace: &'a clawfleet_protocol::Ident,
        agent: &'a clawfleet_protocol::Ident,
        caller: &'a str,
    ) -> crate::backend::GatewayOpen<'a> {
        Box::pin(async move {
            match target {
                Target::Host(_) => {
                    crate::backend::GatewayDialer::open(
                        &*self.ssh, target, namespace, agent, caller,
                    )
                    .await
                }
                // The cluster path: the API server's port-forward to the Agent's current,
                // Ready Pod, with the stored credentials (kube-backend/src/gateway_stream.rs).
                Target::Cluster(c) => {
                    let cluster = kube_cluster(c).map_err(CallError::Failed)?;
                    let connection = self
                        .kube
                        .open_gateway_stream(&cluster, namespace, agent, GATEWAY_OPEN_TIMEOUT)
                        .await
                        .map_err(gateway_stream_error)?;
                    tracing::info!(cluster = %c.name, %namespace, %agent, pod = %connection.pod, revision = %connection.pod_revision_id, %caller, "gateway stream opened through the port-forward");
                    Ok(Box::new(connection.stream) as Box<dyn crate::backend::GatewayIo>)
                }
            }
        })
    }

    fn open_with_auth<'a>(
        &'a self,
        target: &'a Target,
        namespace: &'a clawfleet_protocol::Ident,
        agent: &'a clawfleet_protocol::Ident,
        caller: &'a str,
    ) -> crate::backend::GatewayOpenWithAuth<'a> {
        Box::pin(async move {
            match target {
                Target::Host(_) => {
                    crate::backend::GatewayDialer::open_with_auth(
                        &*self.ssh, target, namespace, agent, caller,
                    )
                    .await
                }
                // The password from the Agent's Secret with the stored credentials, then the
                // port-forward as for `open`.
                Target::Cluster(c) => {
                    let cluster = kube_cluster(c).map_err(CallError::Failed)?;
                    let password = self
                        .kube
                        .gateway_password(&cluster, namespace, agent, GATEWAY_OPEN_TIMEOUT)
                        .await
                        .map_err(CallError::Failed)?;
                    let io =
                        crate::backend::GatewayDialer::open(self, target, namespace, agent, caller)
                            .await?;
                    Ok(crate::backend::GatewayStream {
                        io,
                        password: password
                            .map(|p| crate::backend::GatewayPassword::new(p.as_str().to_owned())),
                    })
                }
            }
        })
    }
}

impl Backend for Backends {
    fn gateway(&self) -> Option<&dyn crate::backend::GatewayDialer> {
        Some(self)
    }

    async fn call(
        &self,
        target: impl Into<Target> + Send,
        operation: Operation,
        options: CallOptions,
    ) -> Result<OperationResult, CallError> {
        let kind = operation.kind();
        let started = std::time::Instant::now();
        let out = self.dispatch(target.into(), operation, options).await;
        let outcome = match &out {
            Ok(_) => crate::metrics::Outcome::Ok,
            Err(CallError::Failed(_)) => crate::metrics::Outcome::Failed,
            Err(_) => crate::metrics::Outcome::NoAnswer,
        };
        crate::metrics::operation(kind, outcome, started.elapsed());
        out
    }

    async fn put_cluster_secrets(
        &self,
        target: &ClusterTarget,
        secrets: &clawfleet_kube::AgentSecrets,
        options: CallOptions,
    ) -> Result<clawfleet_protocol::sealed::PutSecretsResult, CallError> {
        let started = std::time::Instant::now();
        let out = self.put_secrets_on(target, secrets, options).await;
        let outcome = match &out {
            Ok(_) => crate::metrics::Outcome::Ok,
            Err(CallError::Failed(_)) => crate::metrics::Outcome::Failed,
            Err(_) => crate::metrics::Outcome::NoAnswer,
        };
        crate::metrics::operation(
            clawfleet_protocol::operation::OperationKind::PutSecrets,
            outcome,
            started.elapsed(),
        );
        out
    }

    async fn missing_cluster_access(
        &self,
        target: &ClusterTarget,
    ) -> Result<Vec<String>, CallError> {
        let cluster = kube_cluster(target).map_err(CallError::Failed)?;
        self.kube
            .missing_access(&cluster)
            .await
            .map_err(CallError::Failed)
    }
}

impl Backends {
    /// [`Backend::put_cluster_secrets`] on the Kubernetes backend, timed like a call.
    async fn put_secrets_on(
        &self,
        target: &ClusterTarget,
        secrets: &clawfleet_kube::AgentSecrets,
        options: CallOptions,
    ) -> Result<clawfleet_protocol::sealed::PutSecretsResult, CallError> {
        let cluster = kube_cluster(target).map_err(CallError::Failed)?;
        self.kube
            .put_secrets(&cluster, secrets, options.deadline, options.fence)
            .await
            .map_err(CallError::Failed)
    }

    async fn dispatch(
        &self,
        target: Target,
        operation: Operation,
        options: CallOptions,
    ) -> Result<OperationResult, CallError> {
        match target {
            Target::Host(host) => {
                self.ssh
                    .call_with_progress(&host, operation, options, None)
                    .await
            }
            Target::Cluster(c) => {
                let cluster = kube_cluster(&c).map_err(CallError::Failed)?;
                self.kube
                    .call_fenced(&cluster, operation, options.deadline, options.fence)
                    .await
                    .map_err(CallError::Failed)
            }
        }
    }
}

/// The SSH backend alone (a coordinator without clusters, the SSH tests): hosts only.
impl crate::backend::GatewayDialer for SshBackend {
    fn open<'a>(
        &'a self,
        target: &'a Target,
        namespace: &'a clawfleet_protocol::Ident,
        agent: &'a clawfleet_protocol::Ident,
        caller: &'a str,
    ) -> crate::backend::GatewayOpen<'a> {
        Box::pin(async move {
            match target {
                Target::Host(host) => {
                    let s = self
                        .open_gateway_stream(host, namespace, agent, caller)
                        .await?;
                    Ok(Box::new(s) as Box<dyn crate::backend::GatewayIo>)
                }
                Target::Cluster(c) => Err(CallError::Unsupported {
                    target: c.name.to_string(),
                    message: "this coordinator runs no Kubernetes backend".to_owned(),
                }),
            }
        })
    }

    fn open_with_auth<'a>(
        &'a self,
        target: &'a Target,
        namespace: &'a clawfleet_protocol::Ident,
        agent: &'a clawfleet_protocol::Ident,
        caller: &'a str,
    ) -> crate::backend::GatewayOpenWithAuth<'a> {
        Box::pin(async move {
            match target {
                Target::Host(host) => {
                    let (s, password) = self
                        .open_gateway_stream_with_auth(host, namespace, agent, caller)
                        .await?;
                    Ok(crate::backend::GatewayStream {
                        io: Box::new(s),
                        password: password.map(crate::backend::GatewayPassword::new),
                    })
                }
                Target::Cluster(c) => Err(CallError::Unsupported {
                    target: c.name.to_string(),
                    message: "this coordinator runs no Kubernetes backend".to_owned(),
                }),
            }
        })
    }
}

impl Backend for SshBackend {
    fn gateway(&self) -> Option<&dyn crate::backend::GatewayDialer> {
        Some(self)
    }

    fn call(
        &self,
        target: impl Into<Target> + Send,
        operation: Operation,
        options: CallOptions,
    ) -> impl Future<Output = Result<OperationResult, CallError>> + Send {
        let target = target.into();
        async move {
            match target {
                Target::Host(host) => {
                    self.call_with_progress(&host, operation, options, None)
                        .await
                }
                Target::Cluster(c) => Err(CallError::Unsupported {
                    target: c.name,
                    message: "the SSH backend reaches hosts only".into(),
                }),
            }
        }
    }
}
