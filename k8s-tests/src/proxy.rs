//! A fault-injection proxy in front of the apiserver, on 127.0.0.1: it terminates TLS with its
//! own certificate from the run's CA (so a client trusts it with the same kubeconfig CA), reads
//! each HTTP/1.1 request, and either forwards it to the apiserver over a TLS connection of its
//! own or answers it itself with the next queued fault (429 with Retry-After, 503, a delay, a
//! dropped connection). It counts every request it sees, which the benchmark uses.
//!
//! When the apiserver cannot be reached, the proxy drops the client's connection rather than
//! answering, so a client sees the same transport error as without the proxy.

use std::collections::VecDeque;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Mutex as AsyncMutex;
use tokio_rustls::{TlsAcceptor, TlsConnector};

use crate::control_plane::{ControlPlane, kubeconfig_for};
use crate::error::{Error, Result};

/// What the proxy does with one request instead of forwarding it untouched.
#[derive(Debug, Clone)]
pub enum Fault {
    /// Answer with this status, headers and body; the apiserver never sees the request.
    Respond {
        status: u16,
        headers: Vec<(String, String)>,
        body: String,
    },
    /// Wait this long, then forward (for client timeouts: make it longer than theirs).
    Delay(Duration),
    /// Close the connection without any answer.
    Drop,
}

impl Fault {
    /// 429 with `Retry-After: <secs>` and a Kubernetes `Status` body, as API priority and
    /// fairness answers.
    pub fn too_many_requests(retry_after_secs: u32) -> Fault {
        Fault::Respond {
            status: 429,
            headers: vec![("Retry-After".into(), retry_after_secs.to_string())],
            body: status_body(429, "TooManyRequests", "too many requests (injected)"),
        }
    }

    /// 503 with a Kubernetes `Status` body.
    pub fn service_unavailable() -> Fault {
        Fault::Respond {
            status: 503,
            headers: Vec::new(),
            body: status_body(503, "ServiceUnavailable", "service unavailable (injected)"),
        }
    }
}

fn status_body(code: u16, reason: &str, message: &str) -> String {
    serde_json::json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {},
        "status": "Failure", "message": message, "reason": reason, "code": code,
    })
    .to_string()
}

/// One request the proxy saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeenRequest {
    pub method: String,
    /// Path and query.
    pub uri: String,
    /// Whether a fault answered (or dropped) it instead of the apiserver.
    pub injected: bool,
}

#[derive(Debug, Default)]
struct State {
    faults: Mutex<VecDeque<Fault>>,
    seen: Mutex<Vec<SeenRequest>>,
    requests: AtomicU64,
}

fn guard<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A running proxy; dropping it stops accepting (open connections end with their tasks).
#[derive(Debug)]
pub struct FaultProxy {
    addr: SocketAddr,
    ca_pem: String,
    state: Arc<State>,
    accept_task: tokio::task::JoinHandle<()>,
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.accept_task.abort();
    }
}

type ProxyBody = BoxBody<Bytes, hyper::Error>;

fn full(status: u16, headers: &[(String, String)], body: String) -> Response<ProxyBody> {
    let mut b = Response::builder()
        .status(status)
        .header("Content-Type", "application/json");
    for (k, v) in headers {
        b = b.header(k.as_str(), v.as_str());
    }
    let body = Full::new(Bytes::from(body))
        .map_err(|never| match never {})
        .boxed();
    match b.body(body) {
        Ok(r) => r,
        Err(_) => {
            let mut r = Response::new(
                Full::new(Bytes::new())
                    .map_err(|never| match never {})
                    .boxed(),
            );
            *r.status_mut() = hyper::StatusCode::INTERNAL_SERVER_ERROR;
            r
        }
    }
}

/// Why a request was not answered: the connection is closed without a response.
#[derive(Debug, thiserror::Error)]
enum Dropped {
    #[error("fault injection dropped the connection")]
    Injected,
    #[error("the apiserver could not be reached: {0}")]
    Upstream(String),
}

struct Upstream {
    port: u16,
    connector: TlsConnector,
    sender: AsyncMutex<Option<SendRequest<Incoming>>>,
}

impl Upstream {
    async fn connect(&self) -> std::result::Result<SendRequest<Incoming>, String> {
        let tcp = TcpStream::connect((Ipv4Addr::LOCALHOST, self.port))
            .await
            .map_err(|e| e.to_string())?;
        let name = ServerName::IpAddress(Ipv4Addr::LOCALHOST.into());
        let tls = self
            .connector
            .connect(name, tcp)
            .await
            .map_err(|e| e.to_string())?;
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
            .await
            .map_err(|e| e.to_string())?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        Ok(sender)
    }

    async fn forward(
        &self,
        req: Request<Incoming>,
    ) -> std::result::Result<Response<ProxyBody>, Dropped> {
        // One upstream connection per client connection, requests in order (HTTP/1.1).
        let mut slot = self.sender.lock().await;
        let usable = match slot.as_mut() {
            Some(s) => s.ready().await.is_ok(),
            None => false,
        };
        if !usable {
            *slot = Some(self.connect().await.map_err(Dropped::Upstream)?);
        }
        let Some(sender) = slot.as_mut() else {
            return Err(Dropped::Upstream("no connection".into()));
        };
        let resp = sender
            .send_request(req)
            .await
            .map_err(|e| Dropped::Upstream(e.to_string()))?;
        Ok(resp.map(|b| b.boxed()))
    }
}

impl FaultProxy {
    /// Starts a proxy on a free 127.0.0.1 port in front of `cp`'s apiserver (the apiserver may
    /// be killed and restarted underneath; the proxy reconnects per request as needed).
    pub async fn start(cp: &ControlPlane) -> Result<FaultProxy> {
        let bad = |reason: String| Error::Proxy { reason };
        let own = cp
            .pki()
            .serving_cert("clawfleet-k8s-fault-proxy", &["localhost"])?;
        let certs = vec![
            CertificateDer::from_pem_slice(own.cert_pem.as_bytes())
                .map_err(|e| bad(format!("own certificate: {e}")))?,
        ];
        let key = PrivateKeyDer::from_pem_slice(own.key_pem.as_bytes())
            .map_err(|e| bad(format!("own key: {e}")))?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut server = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| bad(e.to_string()))?
            .with_no_client_auth()
            .with_single_cert(certs, key)
            .map_err(|e| bad(e.to_string()))?;
        server.alpn_protocols = vec![b"http/1.1".to_vec()];
        let mut roots = rustls::RootCertStore::empty();
        let ca = CertificateDer::from_pem_slice(cp.ca_pem().as_bytes())
            .map_err(|e| bad(format!("CA: {e}")))?;
        roots.add(ca).map_err(|e| bad(e.to_string()))?;
        let mut client = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| bad(e.to_string()))?
            .with_root_certificates(roots)
            .with_no_client_auth();
        client.alpn_protocols = vec![b"http/1.1".to_vec()];
        let acceptor = TlsAcceptor::from(Arc::new(server));
        let connector = TlsConnector::from(Arc::new(client));

        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .await
            .map_err(|e| bad(format!("bind 127.0.0.1: {e}")))?;
        let addr = listener
            .local_addr()
            .map_err(|e| bad(format!("local address: {e}")))?;
        let state = Arc::new(State::default());
        let port = cp.api_port();
        let st = state.clone();
        let accept_task = tokio::spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    continue;
                };
                let acceptor = acceptor.clone();
                let connector = connector.clone();
                let st = st.clone();
                tokio::spawn(async move {
                    let Ok(tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let upstream = Arc::new(Upstream {
                        port,
                        connector,
                        sender: AsyncMutex::new(None),
                    });
                    let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                        let st = st.clone();
                        let upstream = upstream.clone();
                        async move { handle(&st, &upstream, req).await }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(tls), service)
                        .await;
                });
            }
        });
        Ok(FaultProxy {
            addr,
            ca_pem: cp.ca_pem().to_string(),
            state,
            accept_task,
        })
    }

    /// `https://127.0.0.1:<port>` of the proxy.
    pub fn url(&self) -> String {
        format!("https://127.0.0.1:{}", self.addr.port())
    }

    /// A kubeconfig pointing at the proxy (same CA, the given user and token).
    pub fn kubeconfig(&self, user: &str, token: &str) -> String {
        kubeconfig_for(&self.url(), &self.ca_pem, user, token)
    }

    /// The kube client configuration for the proxy (same CA, the given user and token). Note
    /// kube 5's `default_retry` (on by default) retries 429/503/504 up to 15 times, mutating
    /// requests included, honouring Retry-After; set it to `false` to see the faults.
    pub async fn config(&self, user: &str, token: &str) -> Result<kube::Config> {
        let bad = |reason: String| Error::Kubeconfig {
            path: "(fault proxy kubeconfig)".into(),
            reason,
        };
        let kc = kube::config::Kubeconfig::from_yaml(&self.kubeconfig(user, token))
            .map_err(|e| bad(e.to_string()))?;
        kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
            .await
            .map_err(|e| bad(e.to_string()))
    }

    /// A kube client through the proxy with kube's default configuration (see [`config`](Self::config)).
    pub async fn client(&self, user: &str, token: &str) -> Result<kube::Client> {
        let cfg = self.config(user, token).await?;
        kube::Client::try_from(cfg).map_err(|e| Error::Kubeconfig {
            path: "(fault proxy kubeconfig)".into(),
            reason: e.to_string(),
        })
    }

    /// Queues `fault` for each of the next `times` requests (after any already queued).
    pub fn inject(&self, fault: Fault, times: usize) {
        let mut q = guard(&self.state.faults);
        for _ in 0..times {
            q.push_back(fault.clone());
        }
    }

    /// Drops every queued fault.
    pub fn clear_faults(&self) {
        guard(&self.state.faults).clear();
    }

    /// Faults still queued.
    pub fn pending_faults(&self) -> usize {
        guard(&self.state.faults).len()
    }

    /// Requests seen so far (forwarded or injected).
    pub fn request_count(&self) -> u64 {
        self.state.requests.load(Ordering::SeqCst)
    }

    /// Every request seen so far, in order.
    pub fn seen(&self) -> Vec<SeenRequest> {
        guard(&self.state.seen).clone()
    }
}

async fn handle(
    st: &State,
    upstream: &Upstream,
    req: Request<Incoming>,
) -> std::result::Result<Response<ProxyBody>, Dropped> {
    st.requests.fetch_add(1, Ordering::SeqCst);
    let fault = guard(&st.faults).pop_front();
    let uri = req
        .uri()
        .path_and_query()
        .map(|p| p.to_string())
        .unwrap_or_default();
    let injected = matches!(fault, Some(Fault::Respond { .. } | Fault::Drop));
    guard(&st.seen).push(SeenRequest {
        method: req.method().to_string(),
        uri,
        injected,
    });
    match fault {
        Some(Fault::Respond {
            status,
            headers,
            body,
        }) => Ok(full(status, &headers, body)),
        Some(Fault::Drop) => Err(Dropped::Injected),
        Some(Fault::Delay(d)) => {
            tokio::time::sleep(d).await;
            upstream.forward(req).await
        }
        None => upstream.forward(req).await,
    }
}
