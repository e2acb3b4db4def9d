//! A byte stream to an Agent's gateway in its current Pod, through the API server's
//! port-forward (issue 30's cluster path): nothing is exposed by an Ingress or a Service, and
//! the stored cluster credentials are the only key.
//!
//! - **Which Pod.** The Agent's Deployment (ownership markers checked) names the revision its
//!   Pods run ([`crate::names::POD_REVISION_ID`], else the revision it carries); the Pod is a
//!   live Pod of the Agent with that revision's serving label and `Ready=True` (the newest
//!   when two are). No Deployment, no such Pod, or a Pod not Ready are typed errors, so a
//!   caller never reaches a Pod of a revision that is going away.
//! - **The request.** A WebSocket upgrade of
//!   `/api/v1/namespaces/<tenant>/pods/<pod>/portforward?ports=<gatewayPort>` (kube's
//!   `v4.channel.k8s.io` framing). The API server authorizes the upgrade (a GET) as
//!   `get pods/portforward`, and also as `create pods/portforward` where its
//!   `AuthorizePodWebsocketUpgradeCreatePermission` gate is on; the shipped roles grant both
//!   ([`crate::rbac`]), and a 403 is [`GatewayStreamError::Forbidden`] naming them.
//! - **The connection.** The cluster's second client, with the same trust and credentials as
//!   the operations' client but no read or write timeout (an upgraded connection keeps the
//!   connector's timeouts, and an idle gateway session must outlive them); opening is bounded
//!   by the caller's `timeout`.
//! - **The stream.** [`GatewayStream`] reads and writes the gateway's port. When the forward
//!   ends, a read returns end-of-file only when the forward ended cleanly; a cut connection,
//!   or the kubelet's error for the port (e.g. nothing listens), is an `io::Error` naming the
//!   Pod. Dropping the stream closes the forward (kube sends the WebSocket close).
//!   Half-closing the write side ends the whole forward (the channel protocol has no
//!   half-close), so a caller shuts down only when it wants nothing more from the gateway.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use clawfleet_protocol::Ident;
use clawfleet_protocol::failure::Failure;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use tokio::io::{AsyncRead, AsyncWrite, DuplexStream, ReadBuf};

use crate::client::{ClusterClient, Requests};
use crate::names::{self, Markers};
use crate::objects::Obj;
use crate::observe;
use crate::settings::ClusterSettings;

/// Why no stream to the gateway was opened.
#[derive(Debug, thiserror::Error)]
pub enum GatewayStreamError {
    /// The cluster's settings or credentials cannot be used, or finding the Pod failed
    /// (API unavailable, refused, a foreign object at the Agent's names): the protocol's
    /// failure, with its code.
    #[error("{0}")]
    Cluster(Failure),
    /// The Agent has no Deployment: never activated, or stopped.
    #[error(
        "Agent {agent} has no Deployment {deployment} in namespace {namespace}: it is not \
         deployed or was stopped"
    )]
    NotDeployed {
        agent: Ident,
        namespace: String,
        deployment: String,
    },
    /// No live Pod of the revision the Deployment runs.
    #[error("Agent {agent} has no Pod of its current revision {revision} in namespace {namespace}")]
    NoPod {
        agent: Ident,
        namespace: String,
        revision: Ident,
    },
    /// The current revision's Pod exists but is not Ready.
    #[error(
        "Pod {pod} of Agent {agent} (revision {revision}) in namespace {namespace} is not Ready"
    )]
    NotReady {
        agent: Ident,
        namespace: String,
        pod: String,
        revision: Ident,
    },
    /// The credentials lack the right to forward ports (403).
    #[error(
        "the cluster's credentials may not forward ports to Pod {pod} in namespace \
         {namespace}: the role lacks `get pods/portforward` or `create pods/portforward` \
         (kube-backend/rbac): {message}"
    )]
    Forbidden {
        namespace: String,
        pod: String,
        message: String,
    },
    /// The API server answered the port-forward with another refusal (401, 404, a failed
    /// upgrade).
    #[error(
        "the Kubernetes API refused the port-forward to Pod {pod} in namespace {namespace} ({status}): {message}"
    )]
    Refused {
        namespace: String,
        pod: String,
        status: u16,
        message: String,
    },
    /// No answer: connection refused or cut, a timeout, 429 or 5xx.
    #[error("the port-forward to Pod {pod} in namespace {namespace} failed: {detail}")]
    Unavailable {
        namespace: String,
        pod: String,
        detail: String,
    },
}

/// An open stream to the gateway, and where it goes (for the audit record).
#[derive(Debug)]
pub struct GatewayConnection {
    pub stream: GatewayStream,
    /// The Kubernetes namespace and Pod the stream reaches.
    pub namespace: String,
    pub pod: String,
    /// The revision the Agent's Deployment carries (the active one).
    pub revision_id: Ident,
    /// The revision the Pod runs: the same, or an earlier one with the same rendered
    /// configuration (a secrets rotation keeps the Pod).
    pub pod_revision_id: Ident,
}

/// kube does not export the forward's error type: its text is what is kept.
type Ended = Pin<Box<dyn Future<Output = Result<(), String>> + Send>>;
type PortError = Pin<Box<dyn Future<Output = Option<String>> + Send>>;

/// The gateway's port in the Pod: `AsyncRead + AsyncWrite + Unpin + Send + 'static`.
pub struct GatewayStream {
    io: DuplexStream,
    /// Resolves when the forward's task ends (with its error, if any).
    ended: Option<Ended>,
    /// The kubelet's error message for the port, if it sends one.
    port_error: Option<PortError>,
    /// How long an end-of-file waits for the forward's task to say how it ended.
    grace: Option<Pin<Box<tokio::time::Sleep>>>,
    pod: String,
}

/// See [`GatewayStream::poll_end`].
const END_GRACE: Duration = Duration::from_millis(200);

impl std::fmt::Debug for GatewayStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GatewayStream")
            .field("pod", &self.pod)
            .finish_non_exhaustive()
    }
}

impl GatewayStream {
    fn port_failed(&self, message: &str) -> std::io::Error {
        let m: String = message.trim().chars().take(400).collect();
        std::io::Error::new(
            std::io::ErrorKind::ConnectionAborted,
            format!("the port-forward to Pod {}: {m}", self.pod),
        )
    }

    /// What ended the forward, once the data side reached end-of-file: the kubelet's error
    /// for the port, a broken connection (the forward's task failed), or `Ok` for a clean
    /// end. A peer's clean close leaves kube's task waiting for this side, so its end is
    /// awaited for [`END_GRACE`] only: a failed task ends at once.
    fn poll_end(&mut self, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        if let Some(Poll::Ready(m)) = self.port_error.as_mut().map(|e| e.as_mut().poll(cx)) {
            self.port_error = None;
            if let Some(m) = m {
                return Poll::Ready(Err(self.port_failed(&m)));
            }
        }
        if let Some(ended) = self.ended.as_mut() {
            match ended.as_mut().poll(cx) {
                Poll::Ready(result) => {
                    self.ended = None;
                    self.grace = None;
                    if let Err(e) = result {
                        return Poll::Ready(Err(std::io::Error::new(
                            std::io::ErrorKind::ConnectionReset,
                            format!("the port-forward to Pod {} broke: {e}", self.pod),
                        )));
                    }
                }
                Poll::Pending => {
                    let grace = self
                        .grace
                        .get_or_insert_with(|| Box::pin(tokio::time::sleep(END_GRACE)));
                    if grace.as_mut().poll(cx).is_pending() {
                        return Poll::Pending;
                    }
                }
            }
        }
        Poll::Ready(Ok(()))
    }
}

impl AsyncRead for GatewayStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        match Pin::new(&mut self.io).poll_read(cx, buf) {
            Poll::Ready(Ok(())) if buf.filled().len() == before && buf.remaining() > 0 => {
                self.poll_end(cx)
            }
            // The kubelet reports a port it cannot reach (nothing listens, the Pod went away)
            // on the error channel and keeps the connection open: that is the end.
            Poll::Pending => match self.port_error.as_mut().map(|e| e.as_mut().poll(cx)) {
                Some(Poll::Ready(Some(m))) => {
                    self.port_error = None;
                    Poll::Ready(Err(self.port_failed(&m)))
                }
                Some(Poll::Ready(None)) => {
                    self.port_error = None;
                    Poll::Pending
                }
                _ => Poll::Pending,
            },
            other => other,
        }
    }
}

impl AsyncWrite for GatewayStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, data)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// The Agent's current, Ready Pod: (pod name, active revision, the Pod's revision).
async fn current_pod(
    r: &Requests,
    settings: &ClusterSettings,
    namespace_id: &Ident,
    agent: &Ident,
) -> Result<(String, String, Ident, Ident), GatewayStreamError> {
    let t = settings.tenant(namespace_id);
    let n = names::agent(agent);
    let markers = Markers::agent(&t.id, agent);
    let deployments: Obj<Deployment> = Obj::namespaced(r, &t.name, "Deployment");
    let dep = deployments
        .get_owned(r, &n.gateway, &markers)
        .await
        .map_err(GatewayStreamError::Cluster)?;
    let not_deployed = || GatewayStreamError::NotDeployed {
        agent: agent.clone(),
        namespace: t.name.clone(),
        deployment: n.gateway.clone(),
    };
    let Some(dep) = dep else {
        return Err(not_deployed());
    };
    let active = observe::deployment_revision(&dep)
        .map_err(GatewayStreamError::Cluster)?
        .map(|(id, _)| id)
        .ok_or_else(not_deployed)?;
    let running = observe::pod_revision(&dep)
        .map_err(GatewayStreamError::Cluster)?
        .unwrap_or_else(|| active.clone());
    let serving = names::serving_value(&running);
    let mut pods: Vec<Pod> = observe::agent_pods(
        r,
        &t,
        agent,
        Some((names::SERVING_REVISION, serving.as_str())),
    )
    .await
    .map_err(GatewayStreamError::Cluster)?
    .into_iter()
    .filter(|p| p.metadata.deletion_timestamp.is_none())
    .collect();
    // Newest first.
    pods.sort_by(|a, b| {
        b.metadata
            .creation_timestamp
            .cmp(&a.metadata.creation_timestamp)
    });
    let ready = |p: &Pod| {
        p.status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
    };
    match pods.iter().find(|p| ready(p)).or(pods.first()) {
        None => Err(GatewayStreamError::NoPod {
            agent: agent.clone(),
            namespace: t.name.clone(),
            revision: running,
        }),
        Some(p) if !ready(p) => Err(GatewayStreamError::NotReady {
            agent: agent.clone(),
            namespace: t.name.clone(),
            pod: p.metadata.name.clone().unwrap_or_default(),
            revision: running,
        }),
        Some(p) => Ok((
            t.name.clone(),
            p.metadata.name.clone().unwrap_or_default(),
            active,
            running,
        )),
    }
}

/// Maps the port-forward's refusal onto the typed errors.
fn forward_error(namespace: &str, pod: &str, e: &kube::Error) -> GatewayStreamError {
    let namespace = namespace.to_owned();
    let pod = pod.to_owned();
    match e {
        kube::Error::Api(s) if s.code == 403 => GatewayStreamError::Forbidden {
            namespace,
            pod,
            message: crate::client::short(&s.message),
        },
        kube::Error::Api(s) if s.code == 429 || s.code >= 500 => GatewayStreamError::Unavailable {
            namespace,
            pod,
            detail: format!(
                "the Kubernetes API answered {}: {}",
                s.code,
                crate::client::short(&s.message)
            ),
        },
        kube::Error::Api(s) => GatewayStreamError::Refused {
            namespace,
            pod,
            status: s.code,
            message: crate::client::short(&s.message),
        },
        kube::Error::UpgradeConnection(kube::client::UpgradeConnectionError::ProtocolSwitch(
            status,
        )) => GatewayStreamError::Refused {
            namespace,
            pod,
            status: status.as_u16(),
            message: "the WebSocket upgrade was not accepted".to_owned(),
        },
        kube::Error::UpgradeConnection(u) => GatewayStreamError::Refused {
            namespace,
            pod,
            status: 101,
            message: crate::client::short(&format!("the WebSocket upgrade is malformed: {u}")),
        },
        other => GatewayStreamError::Unavailable {
            namespace,
            pod,
            detail: crate::client::short(&other.to_string()),
        },
    }
}

/// Opens the stream: finds the Pod with the operations' client (with its retries), then
/// forwards with the cluster's stream client (no idle timeout), both within `timeout`.
pub(crate) async fn open(
    cc: &ClusterClient,
    settings: &ClusterSettings,
    namespace_id: &Ident,
    agent: &Ident,
    timeout: Duration,
) -> Result<GatewayConnection, GatewayStreamError> {
    let deadline = Instant::now() + timeout;
    let r = Requests {
        cc: cc.clone(),
        deadline,
    };
    let (namespace, pod, revision_id, pod_revision_id) =
        current_pod(&r, settings, namespace_id, agent).await?;
    let port = settings.gateway_port;
    let api: Api<Pod> = Api::namespaced(cc.stream.clone(), &namespace);
    let left = deadline.saturating_duration_since(Instant::now());
    let mut forwarder = match tokio::time::timeout(left, api.portforward(&pod, &[port])).await {
        Ok(Ok(f)) => f,
        Ok(Err(e)) => {
            let err = forward_error(&namespace, &pod, &e);
            tracing::warn!(namespace = %namespace, pod = %pod, error = %err, "port-forward refused");
            return Err(err);
        }
        Err(_) => {
            return Err(GatewayStreamError::Unavailable {
                namespace,
                pod,
                detail: format!(
                    "no answer from the Kubernetes API within {} ms",
                    timeout.as_millis()
                ),
            });
        }
    };
    let (Some(io), Some(port_error)) = (forwarder.take_stream(port), forwarder.take_error(port))
    else {
        forwarder.abort();
        return Err(GatewayStreamError::Unavailable {
            namespace,
            pod,
            detail: format!("the forward has no stream for port {port}"),
        });
    };
    tracing::info!(namespace = %namespace, pod = %pod, port, revision = %revision_id, "gateway stream opened");
    Ok(GatewayConnection {
        stream: GatewayStream {
            io,
            ended: Some(Box::pin(async move {
                forwarder.join().await.map_err(|e| e.to_string())
            })),
            port_error: Some(Box::pin(port_error)),
            grace: None,
            pod: pod.clone(),
        },
        namespace,
        pod,
        revision_id,
        pod_revision_id,
    })
}
