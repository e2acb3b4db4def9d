//! One API client per cluster, and every request's time limit, retry rule and error mapping.
//!
//! - The client trusts exactly the stored CA (never the system store, never the ambient
//!   kubeconfig) and has kube's own retry switched off: kube 5 would otherwise retry 429/503/504
//!   for every verb, mutating ones included.
//! - Every request gets at most 10 s (less when the operation's deadline is nearer).
//! - Reads (GET, LIST) are retried in place on 429, 5xx and transport errors, at most three
//!   attempts within the deadline. Mutating requests are never retried in place: the
//!   coordinator retries the whole idempotent operation.
//! - A 429 or 503 with `Retry-After` closes a per-cluster gate until then: the retried read,
//!   and every later request of any operation to that cluster, waits for it (or fails at once
//!   with `KUBERNETES_API_UNAVAILABLE` when the deadline comes first).
//! - Every response body is capped at [`MAX_RESPONSE_BYTES`] as it streams in: a larger one
//!   (a hostile or broken API server) fails that request with `KUBERNETES_API_REJECTED`
//!   ("exceeds the response limit"), not retried, and never holds more than the cap in memory.
//! - Building a client never panics into its caller: a panic inside kube's builder becomes
//!   `KUBERNETES_CONFIGURATION_INVALID` for that cluster only.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use base64::Engine as _;
use clawfleet_protocol::failure::{Failure, FailureClass, FailureCode};
use http::{Request, Response, StatusCode};
use kube::client::ClientBuilder;
use kube::config::{AuthInfo, Config};

use crate::auth_window::{AuthRecord, Refusal};
use crate::kubeconfig::{ClusterAuth, ClusterCredentials};

/// The limit of one request.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// The largest response body accepted from an API server (32 MiB): far above a list of every
/// object clawfleet keeps in a namespace, small enough that a hostile server cannot exhaust
/// the coordinator's memory.
pub const MAX_RESPONSE_BYTES: u64 = 32 * 1024 * 1024;
/// Attempts of one read.
const READ_ATTEMPTS: u32 = 3;
/// The longest Retry-After honoured (a larger one is capped).
const RETRY_AFTER_MAX: Duration = Duration::from_secs(60);

/// When the cluster next accepts requests, learned from Retry-After.
#[derive(Debug, Default)]
pub(crate) struct RetryGate {
    not_before: Mutex<Option<Instant>>,
}

impl RetryGate {
    fn close_for(&self, wait: Duration) {
        if let Ok(mut g) = self.not_before.lock() {
            let until = Instant::now() + wait.min(RETRY_AFTER_MAX);
            if g.is_none_or(|t| t < until) {
                *g = Some(until);
            }
        }
    }

    /// How long to wait before the next request, if at all.
    pub(crate) fn wait(&self) -> Option<Duration> {
        let g = self.not_before.lock().ok()?;
        g.and_then(|t| t.checked_duration_since(Instant::now()))
    }
}

/// A tower layer that reads Retry-After off 429 and 503 answers into the cluster's gate.
#[derive(Debug, Clone)]
pub(crate) struct RetryAfterLayer {
    gate: Arc<RetryGate>,
}

impl<S> tower_layer::Layer<S> for RetryAfterLayer {
    type Service = RetryAfterService<S>;
    fn layer(&self, inner: S) -> Self::Service {
        RetryAfterService {
            inner,
            gate: self.gate.clone(),
        }
    }
}

/// The service of [`RetryAfterLayer`].
#[derive(Debug, Clone)]
pub(crate) struct RetryAfterService<S> {
    inner: S,
    gate: Arc<RetryGate>,
}

type BoxFut<T, E> = Pin<Box<dyn Future<Output = Result<T, E>> + Send>>;

impl<S, B, RB> tower_service::Service<Request<B>> for RetryAfterService<S>
where
    S: tower_service::Service<Request<B>, Response = Response<RB>>,
    S::Future: Send + 'static,
    RB: Send + 'static,
    S::Error: Send + 'static,
{
    type Response = Response<RB>;
    type Error = S::Error;
    type Future = BoxFut<Response<RB>, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let fut = self.inner.call(req);
        let gate = self.gate.clone();
        Box::pin(async move {
            let res = fut.await?;
            if matches!(
                res.status(),
                StatusCode::TOO_MANY_REQUESTS | StatusCode::SERVICE_UNAVAILABLE
            ) && let Some(wait) = retry_after(res.headers())
            {
                tracing::info!(
                    status = res.status().as_u16(),
                    retry_after_ms = wait.as_millis() as u64,
                    "the Kubernetes API asked to retry later"
                );
                gate.close_for(wait);
            }
            Ok(res)
        })
    }
}

/// Retry-After in seconds (the HTTP-date form is not used by the API server).
fn retry_after(headers: &http::HeaderMap) -> Option<Duration> {
    let v = headers.get(http::header::RETRY_AFTER)?.to_str().ok()?;
    v.trim().parse::<u64>().ok().map(Duration::from_secs)
}

/// A response body over the cap: the request fails with this as its source.
#[derive(Debug, thiserror::Error)]
#[error("the response body exceeds the limit of {limit} bytes")]
pub(crate) struct ResponseTooLarge {
    limit: u64,
}

/// A tower layer capping every response body at `limit` bytes.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ResponseLimitLayer {
    pub(crate) limit: u64,
}

impl<S> tower_layer::Layer<S> for ResponseLimitLayer {
    type Service = ResponseLimitService<S>;
    fn layer(&self, inner: S) -> Self::Service {
        ResponseLimitService {
            inner,
            limit: self.limit,
        }
    }
}

/// The service of [`ResponseLimitLayer`].
#[derive(Debug, Clone)]
pub(crate) struct ResponseLimitService<S> {
    inner: S,
    limit: u64,
}

impl<S, B, RB> tower_service::Service<Request<B>> for ResponseLimitService<S>
where
    S: tower_service::Service<Request<B>, Response = Response<RB>>,
    S::Future: Send + 'static,
    RB: Send + 'static,
    S::Error: Send + 'static,
{
    type Response = Response<LimitedBody<RB>>;
    type Error = S::Error;
    type Future = BoxFut<Response<LimitedBody<RB>>, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let fut = self.inner.call(req);
        let limit = self.limit;
        Box::pin(async move {
            let res = fut.await?;
            Ok(res.map(|inner| LimitedBody {
                inner,
                left: limit,
                limit,
            }))
        })
    }
}

/// A body that fails once more than `limit` bytes came (or a declared length says so).
#[derive(Debug)]
pub(crate) struct LimitedBody<B> {
    inner: B,
    left: u64,
    limit: u64,
}

impl<B> http_body::Body for LimitedBody<B>
where
    B: http_body::Body<Data = bytes::Bytes> + Unpin,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    type Data = bytes::Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        fn too_large<D>(
            limit: u64,
        ) -> Poll<Option<Result<D, Box<dyn std::error::Error + Send + Sync>>>> {
            Poll::Ready(Some(Err(Box::new(ResponseTooLarge { limit }))))
        }
        if self.inner.size_hint().lower() > self.left {
            return too_large(self.limit);
        }
        match Pin::new(&mut self.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                let n = frame.data_ref().map_or(0, |d| d.len() as u64);
                if n > self.left {
                    self.left = 0;
                    return too_large(self.limit);
                }
                self.left -= n;
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(e.into()))),
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// The limit a response exceeded, if that is what the error is.
fn too_large(e: &kube::Error) -> Option<u64> {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cur {
        if let Some(t) = err.downcast_ref::<ResponseTooLarge>() {
            return Some(t.limit);
        }
        cur = err.source();
    }
    None
}

/// A cluster's client and its gate.
#[derive(Clone)]
pub(crate) struct ClusterClient {
    pub(crate) client: kube::Client,
    /// The same identity without read or write timeouts, for port-forwards.
    pub(crate) stream: kube::Client,
    pub(crate) gate: Arc<RetryGate>,
    /// Last success and connection error, to judge a 401/403 ([`crate::auth_window`]).
    pub(crate) auth: Arc<AuthRecord>,
}

impl std::fmt::Debug for ClusterClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ClusterClient")
    }
}

impl ClusterClient {
    /// Builds the client from stored credentials, each response capped at `max_response`
    /// bytes. Must run inside a tokio runtime. A panic inside the builder (kube and tower-http
    /// panic on some inputs, e.g. a token no header can carry) is caught and becomes this
    /// cluster's failure.
    pub(crate) fn new(creds: &ClusterCredentials, max_response: u64) -> Result<Self, Failure> {
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            Self::build(creds, max_response)
        }))
        .unwrap_or_else(|_| {
            tracing::error!(
                server = creds.server(),
                "building the cluster's client panicked"
            );
            Err(Failure::new(
                FailureCode::KubernetesConfigurationInvalid,
                "the stored credentials cannot build a client (the builder failed); \
                 replace them with `occ cluster update`",
            ))
        })
    }

    fn build(creds: &ClusterCredentials, max_response: u64) -> Result<Self, Failure> {
        let gate = Arc::new(RetryGate::default());
        let built = |config| {
            ClientBuilder::try_from(config).map_err(|e: kube::Error| {
                Failure::new(
                    FailureCode::KubernetesConfigurationInvalid,
                    format!(
                        "the stored credentials cannot build a client: {}",
                        short(&e.to_string())
                    ),
                )
            })
        };
        let client = built(Self::config(creds, Some(REQUEST_TIMEOUT))?)?
            .with_layer(&RetryAfterLayer { gate: gate.clone() })
            .with_layer(&ResponseLimitLayer {
                limit: max_response,
            })
            .build();
        // Long-lived streams (port-forwards) keep their connection's timeouts after the
        // upgrade: an idle gateway session must not end after REQUEST_TIMEOUT.
        let stream = built(Self::config(creds, None)?)?.build();
        Ok(Self {
            client,
            stream,
            gate,
            auth: Arc::new(AuthRecord::default()),
        })
    }

    /// The client configuration: exactly the stored CA and credentials, kube's retry off.
    fn config(creds: &ClusterCredentials, io_timeout: Option<Duration>) -> Result<Config, Failure> {
        let invalid = |what: &str| {
            Failure::new(
                FailureCode::KubernetesConfigurationInvalid,
                format!("the stored credentials cannot build a client: {what}"),
            )
        };
        let uri: http::Uri = creds
            .server()
            .parse()
            .map_err(|_| invalid("the server URL does not parse"))?;
        let mut config = Config::new(uri);
        config.root_cert = Some(creds.ca_der());
        config.accept_invalid_certs = false;
        config.default_retry = false;
        config.connect_timeout = Some(REQUEST_TIMEOUT);
        config.read_timeout = io_timeout;
        config.write_timeout = io_timeout;
        config.reset_reader_on_write = true;
        config.tls_server_name = creds.tls_server_name().map(str::to_owned);
        config.proxy_url = None;
        let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s.as_bytes());
        config.auth_info = match creds.auth() {
            ClusterAuth::Token { token } => AuthInfo {
                token: Some(token.clone().into()),
                ..AuthInfo::default()
            },
            ClusterAuth::ClientCertificate {
                certificate_pem,
                key_pem,
            } => AuthInfo {
                client_certificate_data: Some(b64(certificate_pem)),
                client_key_data: Some(b64(key_pem).into()),
                ..AuthInfo::default()
            },
        };
        Ok(config)
    }

    /// A client over any service (the request-shape tests use tower-test's mock).
    #[cfg(test)]
    pub(crate) fn from_client(client: kube::Client) -> Self {
        Self {
            stream: client.clone(),
            client,
            gate: Arc::new(RetryGate::default()),
            auth: Arc::new(AuthRecord::default()),
        }
    }
}

/// One operation's view of its cluster: the client and the operation's deadline.
#[derive(Debug, Clone)]
pub(crate) struct Requests {
    pub(crate) cc: ClusterClient,
    pub(crate) deadline: Instant,
}

/// Whether an error may pass by itself: throttling, server errors, transport, timeouts.
fn transient(e: &kube::Error) -> bool {
    if too_large(e).is_some() {
        return false;
    }
    match e {
        kube::Error::Api(s) => s.code == 429 || s.code >= 500,
        kube::Error::HyperError(_) | kube::Error::Service(_) => !untrusted_certificate(e),
        _ => false,
    }
}

pub(crate) fn short(text: &str) -> String {
    let t: String = text.chars().take(240).collect();
    t
}

/// The words of a 401 in a failure's message.
const CREDENTIALS_REFUSED: &str = "the cluster refused clawfleet's credentials (401)";
/// The words of a 403 in a failure's message.
const FORBIDDEN: &str = "forbidden (403)";

/// Whether a failure is the cluster refusing the credentials (401) or their rights (403):
/// permanent for the request, but fixed by `occ cluster update`.
pub(crate) fn auth_refused(f: &Failure) -> bool {
    f.code == FailureCode::KubernetesApiRejected
        && (f.message.contains(CREDENTIALS_REFUSED) || f.message.contains(FORBIDDEN))
}

/// The failure for an API error on `what` (e.g. "get Deployment oce-…/gw-…").
pub(crate) fn api_failure(what: &str, e: &kube::Error) -> Failure {
    if let Some(limit) = too_large(e) {
        return Failure::new(
            FailureCode::KubernetesApiRejected,
            format!(
                "{what}: the API server's answer exceeds the response limit of {limit} bytes; \
                 refused"
            ),
        );
    }
    match e {
        kube::Error::Api(s) if s.code == 429 => Failure::new(
            FailureCode::KubernetesApiUnavailable,
            format!("{what}: the Kubernetes API is throttling requests (429)"),
        ),
        kube::Error::Api(s) if s.code >= 500 => Failure::new(
            FailureCode::KubernetesApiUnavailable,
            format!("{what}: the Kubernetes API failed ({})", s.code),
        ),
        kube::Error::Api(s) if s.code == 401 => Failure::new(
            FailureCode::KubernetesApiRejected,
            format!("{what}: {CREDENTIALS_REFUSED}"),
        ),
        kube::Error::Api(s) if s.code == 403 => Failure::new(
            FailureCode::KubernetesApiRejected,
            format!("{what}: {FORBIDDEN}: {}", short(&s.message)),
        ),
        kube::Error::Api(s) if s.code == 409 => Failure::with_class(
            FailureClass::Retryable,
            FailureCode::KubernetesApiRejected,
            format!("{what}: conflict (409), the object changed meanwhile; retry"),
        ),
        kube::Error::Api(s) => Failure::new(
            FailureCode::KubernetesApiRejected,
            format!(
                "{what}: the Kubernetes API refused it ({} {}): {}",
                s.code,
                s.reason,
                short(&s.message)
            ),
        ),
        kube::Error::Service(b) if b.downcast_ref::<AuthSettling>().is_some() => Failure::new(
            FailureCode::KubernetesApiUnavailable,
            format!("{what}: {}", short(&b.to_string())),
        ),
        kube::Error::HyperError(_) | kube::Error::Service(_) if untrusted_certificate(e) => {
            Failure::new(
                FailureCode::KubernetesConfigurationInvalid,
                format!(
                    "{what}: the API server's certificate does not verify against the cluster's stored CA"
                ),
            )
        }
        kube::Error::HyperError(_) | kube::Error::Service(_) => Failure::new(
            FailureCode::KubernetesApiUnavailable,
            format!(
                "{what}: the Kubernetes API cannot be reached: {}",
                short(&e.to_string())
            ),
        ),
        other => Failure::with_class(
            FailureClass::Retryable,
            FailureCode::KubernetesApiRejected,
            format!(
                "{what}: the API server's answer is not usable: {}",
                short(&other.to_string())
            ),
        ),
    }
}

/// Whether a transport error is rustls refusing the server's certificate: permanent until the
/// operator fixes the stored CA, not an outage.
fn untrusted_certificate(e: &kube::Error) -> bool {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cur {
        if err.to_string().contains("invalid peer certificate") {
            return true;
        }
        cur = err.source();
    }
    false
}

/// The HTTP status of an API error, if it has one.
pub(crate) fn status_of(e: &kube::Error) -> Option<u16> {
    match e {
        kube::Error::Api(s) => Some(s.code),
        _ => None,
    }
}

fn timed_out(what: &str, limit: Duration) -> Failure {
    Failure::new(
        FailureCode::KubernetesApiUnavailable,
        format!(
            "{what}: no answer from the Kubernetes API within {} ms",
            limit.as_millis()
        ),
    )
}

impl Requests {
    pub(crate) fn client(&self) -> kube::Client {
        self.cc.client.clone()
    }

    /// Time left before the operation's deadline.
    pub(crate) fn remaining(&self) -> Duration {
        self.deadline.saturating_duration_since(Instant::now())
    }

    /// Waits for the cluster's Retry-After gate, or fails when it outlasts the deadline.
    async fn pass_gate(&self, what: &str) -> Result<(), Failure> {
        if let Some(wait) = self.cc.gate.wait() {
            if wait >= self.remaining() {
                return Err(Failure::new(
                    FailureCode::KubernetesApiUnavailable,
                    format!(
                        "{what}: the Kubernetes API asked to wait {} ms (Retry-After), past this operation's deadline",
                        wait.as_millis()
                    ),
                ));
            }
            tokio::time::sleep(wait).await;
        }
        Ok(())
    }

    fn limit(&self) -> Duration {
        REQUEST_TIMEOUT
            .min(self.remaining())
            .max(Duration::from_millis(1))
    }

    /// A read: retried in place on transient errors (see the module comment).
    pub(crate) async fn read<T, F, Fut>(&self, what: &str, mut f: F) -> Result<T, Failure>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, kube::Error>>,
    {
        let mut attempt = 0;
        let mut pause = Duration::from_millis(100);
        loop {
            attempt += 1;
            self.pass_gate(what).await?;
            let limit = self.limit();
            let out = tokio::time::timeout(limit, f()).await;
            let out = match out {
                Ok(r) => r.map_err(|e| self.note(e)),
                Err(_) => {
                    self.cc.auth.connection_error(Instant::now());
                    Err(kube::Error::Service(Box::new(TimedOut(limit))))
                }
            };
            let failure = match out {
                Ok(v) => {
                    self.cc.auth.success(Instant::now());
                    return Ok(v);
                }
                Err(kube::Error::Service(b)) if b.downcast_ref::<TimedOut>().is_some() => {
                    timed_out(what, limit)
                }
                Err(e) if is_settling(&e) || transient(&e) => api_failure(what, &e),
                Err(e) => return Err(api_failure(what, &e)),
            };
            let gate_wait = self.cc.gate.wait().unwrap_or(pause);
            if attempt >= READ_ATTEMPTS || gate_wait + limit.min(pause) >= self.remaining() {
                tracing::warn!(what, attempt, code = %failure.code, "read failed");
                return Err(failure);
            }
            tracing::debug!(what, attempt, "transient read failure; retrying");
            if self.cc.gate.wait().is_none() {
                tokio::time::sleep(pause).await;
            }
            pause = (pause * 3).min(Duration::from_secs(1));
        }
    }

    /// A mutating request: sent once.
    pub(crate) async fn write<T, Fut>(&self, what: &str, fut: Fut) -> Result<T, kube::Error>
    where
        Fut: Future<Output = Result<T, kube::Error>>,
    {
        if let Err(f) = self.pass_gate(what).await {
            return Err(kube::Error::Service(Box::new(GateClosed(f.message))));
        }
        let limit = self.limit();
        match tokio::time::timeout(limit, fut).await {
            Ok(Ok(v)) => {
                self.cc.auth.success(Instant::now());
                Ok(v)
            }
            Ok(Err(e)) => Err(self.note(e)),
            Err(_) => {
                self.cc.auth.connection_error(Instant::now());
                Err(kube::Error::Service(Box::new(TimedOut(limit))))
            }
        }
    }

    /// Records what an error says about the cluster ([`crate::auth_window`]) and turns a
    /// 401/403 inside the settle window into [`AuthSettling`] (retryable).
    fn note(&self, e: kube::Error) -> kube::Error {
        let now = Instant::now();
        match status_of(&e) {
            Some(status @ (401 | 403)) => {
                let why = match self.cc.auth.refusal(now) {
                    Refusal::Permanent => return e,
                    Refusal::AfterConnectionError => "a connection error",
                    Refusal::AfterRecentSuccess => "this identity's last accepted request",
                };
                tracing::info!(
                    status,
                    "a refusal soon after {why}: taken for an API server still starting"
                );
                kube::Error::Service(Box::new(AuthSettling { status, why }))
            }
            // Any other answer was decided past authentication and authorization.
            Some(status) if status != 429 && status < 500 => {
                self.cc.auth.success(now);
                e
            }
            Some(_) => e,
            None if transient(&e) => {
                self.cc.auth.connection_error(now);
                e
            }
            None => e,
        }
    }
}

#[derive(Debug, thiserror::Error)]
#[error("no answer within {} ms", .0.as_millis())]
struct TimedOut(Duration);

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct GateClosed(String);

/// A 401/403 within [`crate::auth_window::SETTLE_WINDOW`] of a connection error or of the
/// identity's last success: retryable.
#[derive(Debug, thiserror::Error)]
#[error(
    "refused ({status}) soon after {why}: taken for an API server still filling its \
     authorization caches; retry (permanent once this lasts {} s)",
    crate::auth_window::SETTLE_WINDOW.as_secs()
)]
struct AuthSettling {
    status: u16,
    why: &'static str,
}

fn is_settling(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Service(b) if b.downcast_ref::<AuthSettling>().is_some())
}
