//! A scripted HTTPS server on 127.0.0.1 standing in for a hostile or broken API server, for the
//! tests that need no real control plane: it has its own throwaway CA (so a kubeconfig for it
//! passes clawfleet's checks), records every request it reads (method, path, Authorization
//! header), and answers each with the same [`FakeAnswer`].

use std::net::{Ipv4Addr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::Bytes;
use hyper::body::{Frame, Incoming};
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

use crate::control_plane::kubeconfig_for;
use crate::error::{Error, Result};
use crate::pki::Pki;

/// How the fake server answers every request.
#[derive(Debug, Clone)]
pub enum FakeAnswer {
    /// This status with this JSON body.
    Json { status: u16, body: String },
    /// 200 with a JSON body that never ends (no Content-Length), until the client hangs up.
    Endless,
    /// 200 declaring `Content-Length: n`, then sending bytes until the client hangs up.
    DeclaredLength(u64),
    /// A minimal well-behaved API server: `/version` answers v1.37.0, a
    /// SelfSubjectAccessReview is allowed unless its `verb resource` (e.g. `delete
    /// deployments`) is in `deny`, anything else is an empty list.
    Apiserver { deny: Vec<String> },
}

/// The `/version` answer of [`FakeAnswer::Apiserver`].
pub const FAKE_VERSION: &str = r#"{"major":"1","minor":"37","gitVersion":"v1.37.0","gitCommit":"","gitTreeState":"","buildDate":"","goVersion":"","compiler":"","platform":"linux/amd64"}"#;

/// The answer of [`FakeAnswer::Apiserver`] to one request.
fn apiserver(path: &str, body: &[u8], deny: &[String]) -> (u16, String) {
    if path.starts_with("/version") {
        return (200, FAKE_VERSION.to_owned());
    }
    if path.contains("selfsubjectaccessreviews") {
        let review: serde_json::Value = serde_json::from_slice(body).unwrap_or_default();
        let attrs = &review["spec"]["resourceAttributes"];
        let key = format!(
            "{} {}",
            attrs["verb"].as_str().unwrap_or_default(),
            attrs["resource"].as_str().unwrap_or_default()
        );
        let allowed = !deny.contains(&key);
        let mut answer = review.clone();
        answer["status"] = serde_json::json!({ "allowed": allowed });
        return (201, answer.to_string());
    }
    (
        200,
        r#"{"apiVersion":"meta.k8s.io/v1","kind":"PartialObjectMetadataList","metadata":{},"items":[]}"#
            .to_owned(),
    )
}

/// One request the server read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FakeRequest {
    pub method: String,
    pub path: String,
    /// The Authorization header as sent (a bearer token in clear, once TLS is terminated).
    pub authorization: Option<String>,
}

#[derive(Debug, Default)]
struct State {
    connections: AtomicU64,
    bytes_sent: AtomicU64,
    requests: Mutex<Vec<FakeRequest>>,
}

/// The running server; dropping it stops accepting.
#[derive(Debug)]
pub struct FakeApiserver {
    addr: SocketAddr,
    ca_pem: String,
    state: Arc<State>,
    accept_task: tokio::task::JoinHandle<()>,
}

impl Drop for FakeApiserver {
    fn drop(&mut self) {
        self.accept_task.abort();
    }
}

/// A body of `{"items":[` followed by spaces, 64 KiB a frame, forever.
struct Flood {
    state: Arc<State>,
    started: bool,
}

const FLOOD_FRAME: usize = 64 * 1024;

impl hyper::body::Body for Flood {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<std::result::Result<Frame<Bytes>, Self::Error>>> {
        let chunk = if self.started {
            Bytes::from(vec![b' '; FLOOD_FRAME])
        } else {
            self.started = true;
            let mut v = b"{\"items\":[".to_vec();
            v.resize(FLOOD_FRAME, b' ');
            Bytes::from(v)
        };
        self.state
            .bytes_sent
            .fetch_add(chunk.len() as u64, Ordering::Relaxed);
        Poll::Ready(Some(Ok(Frame::data(chunk))))
    }
}

type AnyBody = http_body_util::Either<http_body_util::Full<Bytes>, Flood>;

fn answer(state: &Arc<State>, answer: &FakeAnswer, path: &str, body: &[u8]) -> Response<AnyBody> {
    let flood = || {
        http_body_util::Either::Right(Flood {
            state: state.clone(),
            started: false,
        })
    };
    let mut builder = Response::builder().header("content-type", "application/json");
    let body = match answer {
        FakeAnswer::Json { status, body } => {
            builder = builder.status(*status);
            http_body_util::Either::Left(http_body_util::Full::new(Bytes::from(body.clone())))
        }
        FakeAnswer::Apiserver { deny } => {
            let (status, text) = apiserver(path, body, deny);
            builder = builder.status(status);
            http_body_util::Either::Left(http_body_util::Full::new(Bytes::from(text)))
        }
        FakeAnswer::Endless => flood(),
        FakeAnswer::DeclaredLength(n) => {
            builder = builder.header("content-length", n.to_string());
            flood()
        }
    };
    builder.body(body).unwrap_or_else(|_| {
        Response::new(http_body_util::Either::Left(http_body_util::Full::new(
            Bytes::new(),
        )))
    })
}

impl FakeApiserver {
    /// Starts the server on 127.0.0.1 (a free port), with a fresh CA.
    pub async fn start(reply: FakeAnswer) -> Result<FakeApiserver> {
        let bad = |reason: String| Error::Proxy { reason };
        let pki = Pki::generate()?;
        let certs = vec![
            CertificateDer::from_pem_slice(pki.apiserver.cert_pem.as_bytes())
                .map_err(|e| bad(format!("certificate: {e}")))?,
        ];
        let key = PrivateKeyDer::from_pem_slice(pki.apiserver.key_pem.as_bytes())
            .map_err(|e| bad(format!("key: {e}")))?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut server = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| bad(e.to_string()))?
            .with_no_client_auth()
            .with_single_cert(certs, key)
            .map_err(|e| bad(e.to_string()))?;
        server.alpn_protocols = vec![b"http/1.1".to_vec()];
        let acceptor = TlsAcceptor::from(Arc::new(server));
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .await
            .map_err(|e| bad(format!("bind 127.0.0.1: {e}")))?;
        let addr = listener
            .local_addr()
            .map_err(|e| bad(format!("local address: {e}")))?;
        let state = Arc::new(State::default());
        let st = state.clone();
        let accept_task = tokio::spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    continue;
                };
                st.connections.fetch_add(1, Ordering::Relaxed);
                let acceptor = acceptor.clone();
                let st = st.clone();
                let reply = reply.clone();
                tokio::spawn(async move {
                    let Ok(tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                        let st = st.clone();
                        let reply = reply.clone();
                        async move {
                            let seen = FakeRequest {
                                method: req.method().to_string(),
                                path: req
                                    .uri()
                                    .path_and_query()
                                    .map(|p| p.to_string())
                                    .unwrap_or_default(),
                                authorization: req
                                    .headers()
                                    .get("authorization")
                                    .and_then(|v| v.to_str().ok())
                                    .map(str::to_owned),
                            };
                            if let Ok(mut all) = st.requests.lock() {
                                all.push(seen.clone());
                            }
                            let body = http_body_util::BodyExt::collect(req.into_body())
                                .await
                                .map(|b| b.to_bytes())
                                .unwrap_or_default();
                            Ok::<_, std::convert::Infallible>(answer(
                                &st, &reply, &seen.path, &body,
                            ))
                        }
                    });
                    // The client hanging up mid-body ends the connection; nothing to report.
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(tls), service)
                        .await;
                });
            }
        });
        Ok(FakeApiserver {
            addr,
            ca_pem: pki.ca.cert_pem.clone(),
            state,
            accept_task,
        })
    }

    /// `https://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("https://127.0.0.1:{}", self.addr.port())
    }

    /// The CA (PEM) that verifies the server.
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// A kubeconfig for the server (its CA, the given user and token).
    pub fn kubeconfig(&self, user: &str, token: &str) -> String {
        kubeconfig_for(&self.url(), &self.ca_pem, user, token)
    }

    /// TCP connections accepted so far (a TLS handshake included or not).
    pub fn connections(&self) -> u64 {
        self.state.connections.load(Ordering::Relaxed)
    }

    /// Body bytes sent so far by [`FakeAnswer::Endless`] and [`FakeAnswer::DeclaredLength`].
    pub fn bytes_sent(&self) -> u64 {
        self.state.bytes_sent.load(Ordering::Relaxed)
    }

    /// Every request read so far.
    pub fn requests(&self) -> Vec<FakeRequest> {
        self.state
            .requests
            .lock()
            .map(|r| r.clone())
            .unwrap_or_default()
    }
}
