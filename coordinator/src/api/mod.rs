//! The HTTP API (axum 0.8): bearer tokens with per-Namespace roles, strict JSON bodies, stable
//! error codes, an audit event for every change, `/openapi.json`, `/healthz` and `/metrics`.
//!
//! A request meets, in order: the connection's header-read timeout ([`serve`]), the
//! declared body-size limit, the request timeout, admission ([`admit`]: the bearer token is
//! looked up, then the request is charged to the token's concurrency and rate, a global admin
//! may use the reserved share, requests without a valid token have their own; see
//! `ratelimit.rs`), the route's access check (`access.rs`, from the route table in
//! `routes.rs`), the body extractor (`extract.rs`, with the body-read timeout) and the handler
//! (one module per resource), which calls the service layer.
//!
//! The routes, their access rules, requests, success statuses and response types are the
//! API contract's route table (`clawfleet_api::route_table!`); `routes.rs` binds each row to
//! its handler, and a handler that does not decode its row's request type or does not answer
//! its row's response type does not compile.

pub(crate) mod access;
mod agents;
mod clusters;
mod extract;
mod gateway;
mod gateway_connect;
mod gateway_proxy;
mod hosts;
mod namespaces;
mod plans;
pub(crate) mod ratelimit;
mod rollouts;
pub mod routes;
pub(crate) mod runtime;
mod secrets;
mod system;
mod tokens;
mod ws_frame;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

pub use access::{Access, Caller};
use axum::Router;
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
pub use clawfleet_api::{Answer, Body, Method, ROUTES, Route};
use serde_json::json;
pub use system::openapi;
pub use tokens::NewToken;

use crate::backend::Backend;
use crate::codes::Code;
use crate::config::ApiSettings;
use crate::service::{Service, ServiceError};

/// Shared state of the API.
pub struct AppState<B: Backend> {
    pub service: Service,
    pub backend: Arc<B>,
    /// Admitted requests of valid tokens in progress, for the worker to yield to.
    pub foreground: crate::foreground::Foreground,
}

impl<B: Backend> std::fmt::Debug for AppState<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppState").finish_non_exhaustive()
    }
}

/// An API error: status, stable code, message.
#[derive(Debug, Clone)]
pub struct ApiError {
    status: StatusCode,
    code: &'static str,
    message: String,
    /// Seconds for a `Retry-After` header (429).
    retry_after: Option<u64>,
}

impl ApiError {
    /// A refusal with one of the coordinator's codes, answered with the code's HTTP status
    /// (`clawfleet_api::codes`).
    pub(crate) fn new(code: Code, message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::from_u16(code.http_status())
                .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
            code: code.as_str(),
            message: message.into(),
            retry_after: None,
        }
    }

    /// The HTTP status answered.
    pub fn status(&self) -> StatusCode {
        self.status
    }

    /// The stable code answered.
    pub fn code(&self) -> &'static str {
        self.code
    }

    /// The sentence answered.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// The same error with a `Retry-After` of `seconds`.
    pub(crate) fn retry_after(mut self, seconds: u64) -> Self {
        self.retry_after = Some(seconds);
        self
    }

    /// A call that gave no result: 502 when a retry may succeed, 409 when it cannot, with the
    /// call's own code.
    pub(crate) fn from_call(e: &crate::backend::CallError) -> Self {
        Self::from_target(
            if e.is_retryable() {
                StatusCode::BAD_GATEWAY
            } else {
                StatusCode::CONFLICT
            },
            e.code().as_str(),
            e.to_string(),
        )
    }

    /// A failure of hostd or the Kubernetes backend, with its protocol code unchanged.
    pub(crate) fn from_target(status: StatusCode, code: &'static str, message: String) -> Self {
        Self {
            status,
            code,
            message,
            retry_after: None,
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut r = (
            self.status,
            axum::Json(json!({"error": {"code": self.code, "message": self.message}})),
        )
            .into_response();
        if let Some(seconds) = self.retry_after
            && let Ok(v) = axum::http::HeaderValue::from_str(&seconds.to_string())
        {
            r.headers_mut().insert("retry-after", v);
        }
        r
    }
}

impl From<ServiceError> for ApiError {
    fn from(e: ServiceError) -> Self {
        match &e {
            ServiceError::Invalid { code, .. } => ApiError::new(*code, e.to_string()),
            ServiceError::NotFound { .. } => ApiError::new(Code::NotFound, e.to_string()),
            ServiceError::Conflict { code, .. } => ApiError::new(*code, e.to_string()),
            ServiceError::Store(inner) if inner.is_transient() => {
                tracing::warn!("database unavailable: {inner}");
                ApiError::new(
                    Code::DatabaseUnavailable,
                    "the database cannot be reached right now; nothing was stored; retry",
                )
                .retry_after(1)
            }
            ServiceError::Store(inner) => {
                tracing::error!("store failure: {inner}");
                ApiError::new(
                    Code::StoreFailure,
                    "the state store failed; see the coordinator log",
                )
            }
        }
    }
}

/// A handler's outcome: its route's answer (see [`Reply`]) or an error.
type ApiResult<T> = Result<T, ApiError>;

type S<B> = State<Arc<AppState<B>>>;

/// A JSON answer of the route's response type (`Json<T>` or `List<T>` in the route table),
/// with the route's success status (set by the router from the table).
#[derive(Debug)]
pub(crate) struct Reply<T> {
    body: T,
    /// Answers that must not be cached (a log page).
    no_store: bool,
}

impl<T> Reply<T> {
    pub(crate) fn new(body: T) -> Self {
        Reply {
            body,
            no_store: false,
        }
    }

    /// The same answer with `Cache-Control: no-store`.
    pub(crate) fn no_store(mut self) -> Self {
        self.no_store = true;
        self
    }
}

impl<T: serde::Serialize> IntoResponse for Reply<T> {
    fn into_response(self) -> Response {
        let mut r = axum::Json(self.body).into_response();
        if self.no_store {
            r.headers_mut().insert(
                axum::http::header::CACHE_CONTROL,
                axum::http::HeaderValue::from_static("no-store"),
            );
        }
        r
    }
}

/// The route's JSON answer.
fn ok<T>(body: T) -> ApiResult<Reply<T>> {
    Ok(Reply::new(body))
}

/// One page of a list (`Page<T>` in the route table): its items as a JSON array, and the
/// next page's cursor in the `X-Next-Cursor` header when more follow.
#[derive(Debug)]
pub(crate) struct Paged<T>(crate::service::page::Page<T>);

impl<T: serde::Serialize> IntoResponse for Paged<T> {
    fn into_response(self) -> Response {
        let Paged(page) = self;
        let next = match page.next.map(|n| axum::http::HeaderValue::from_str(&n)) {
            None => None,
            Some(Ok(v)) => Some(v),
            Some(Err(e)) => {
                return ApiError::new(
                    Code::InternalError,
                    format!("the next cursor is not a header value: {e}"),
                )
                .into_response();
            }
        };
        let mut response = axum::Json(page.items).into_response();
        if let Some(v) = next {
            response
                .headers_mut()
                .insert(crate::service::page::NEXT_CURSOR_HEADER, v);
        }
        response
    }
}

fn paged<T>(page: crate::service::page::Page<T>) -> ApiResult<Paged<T>> {
    Ok(Paged(page))
}

/// A text answer (`Text` in the route table) of the table's text content type.
#[derive(Debug)]
pub(crate) struct Text(String);

impl IntoResponse for Text {
    fn into_response(self) -> Response {
        (
            [(
                axum::http::header::CONTENT_TYPE,
                clawfleet_api::routes::TEXT_CONTENT_TYPE,
            )],
            self.0,
        )
            .into_response()
    }
}

/// No body (`NoContent` in the route table: 204).
#[derive(Debug)]
pub(crate) struct NoContent;

impl IntoResponse for NoContent {
    fn into_response(self) -> Response {
        StatusCode::NO_CONTENT.into_response()
    }
}

/// Builds the router with the default limits (tests, embedded use).
pub fn router<B: Backend>(state: Arc<AppState<B>>) -> Router {
    router_with(state, &ApiSettings::default())
}

/// Builds the router from [`ROUTES`] with the configured limits.
pub fn router_with<B: Backend>(state: Arc<AppState<B>>, settings: &ApiSettings) -> Router {
    router_parts(state, settings).0
}

/// [`router_with`], and the admission its requests go through, for the console to put its
/// own requests through too (`crate::console::with_api`): one token's limits count both.
pub(crate) fn router_parts<B: Backend>(
    state: Arc<AppState<B>>,
    settings: &ApiSettings,
) -> (Router, Arc<ratelimit::Admission>) {
    let admission = Arc::new(ratelimit::Admission::new(settings));
    (routes_with(state, settings, admission.clone()), admission)
}

/// Puts `router`'s requests through `admission` ([`admit`]): the bearer token's own
/// concurrency and rate, and its class's share.
pub(crate) fn admitted<B: Backend>(
    router: Router,
    state: Arc<AppState<B>>,
    admission: Arc<ratelimit::Admission>,
) -> Router {
    router.layer(axum::middleware::from_fn_with_state(
        (state, admission),
        admit::<B>,
    ))
}

fn routes_with<B: Backend>(
    state: Arc<AppState<B>>,
    settings: &ApiSettings,
    admission: Arc<ratelimit::Admission>,
) -> Router {
    let limiter = Arc::new(ratelimit::ReadLimiter::new(
        settings.runtime_reads_per_minute,
    ));
    let routes = routes::add_routes(Router::new(), &state)
        .fallback(|| async { ApiError::new(Code::NoSuchRoute, "no such route; see /openapi.json") })
        .with_state(state.clone())
        .layer(axum::Extension(limiter))
        .layer(axum::Extension(Arc::new(gateway::GatewayStreams::new(
            settings.gateway_streams_per_token,
            settings.gateway_recheck,
            settings.gateway_allowed_origins.clone(),
        ))));
    // Layers wrap from the inside out: the last one added runs first.
    let routes = routes
        .layer(axum::middleware::from_fn(catch_panics))
        .layer(axum::extract::DefaultBodyLimit::max(MAX_BODY));
    admitted(routes, state, admission)
        // Before admission: a browser's console session authenticates the gateway route.
        .layer(axum::middleware::from_fn(
            gateway_proxy::session_for_gateway,
        ))
        .layer(tower_http::timeout::TimeoutLayer::with_status_code(
            StatusCode::REQUEST_TIMEOUT,
            settings.request_timeout,
        ))
        // A declared Content-Length over the limit is refused here, before any token lookup.
        .layer(tower_http::limit::RequestBodyLimitLayer::new(MAX_BODY))
        .layer(axum::middleware::map_response(json_errors))
}

/// A panic while handling one request answers that request 500 `INTERNAL_ERROR` (and is
/// logged) instead of dropping its connection; shared state recovers from it (the Kubernetes
/// backend's client cache, for one, never stays poisoned), so other requests go on.
async fn catch_panics(request: Request, next: Next) -> Response {
    use futures::FutureExt as _;
    match std::panic::AssertUnwindSafe(next.run(request))
        .catch_unwind()
        .await
    {
        Ok(response) => response,
        Err(_) => {
            tracing::error!("a request handler panicked; answered 500 INTERNAL_ERROR");
            ApiError::new(
                Code::InternalError,
                "the coordinator failed while handling this request; its log says why",
            )
            .into_response()
        }
    }
}

/// The moment a request's body must have arrived by (`api.body_timeout_seconds`), for the
/// body extractors.
#[derive(Debug, Clone, Copy)]
pub(crate) struct BodyDeadline {
    pub at: tokio::time::Instant,
    pub seconds: u64,
}

/// Looks the bearer token up (before any share is charged, so the charge goes to the right
/// token), then admits the request to its share or refuses it at once: 429 when the token is
/// over its own concurrency or rate, 503 when its class's share is in use. The lookup's
/// outcome goes to the route's access check in the request's extensions.
async fn admit<B: Backend>(
    State((state, admission)): State<(Arc<AppState<B>>, Arc<ratelimit::Admission>)>,
    mut request: Request,
    next: Next,
) -> Response {
    use ratelimit::{Class, Refusal};
    let busy = || {
        ApiError::new(
            Code::ServerBusy,
            "too many requests in progress; retry shortly",
        )
        .retry_after(1)
        .into_response()
    };
    let authenticated = if request.headers().contains_key("authorization") {
        let Ok(_lookup) = admission.lookups.clone().try_acquire_owned() else {
            return busy();
        };
        let found =
            access::authenticate(&state, request.headers(), crate::clock::now_seconds()).await;
        Some(found)
    } else {
        None
    };
    let class = match &authenticated {
        Some(Ok(caller)) if caller.is_global(crate::model::Role::Admin) => {
            Class::Admin(&caller.token_id)
        }
        Some(Ok(caller)) => Class::Token(&caller.token_id),
        _ => Class::Unauthenticated,
    };
    let counted = !matches!(class, Class::Unauthenticated);
    let admitted = match admission.admit(class) {
        Ok(a) => a,
        Err(Refusal::ServerBusy) => return busy(),
        Err(Refusal::TokenBusy) => {
            return ApiError::new(
                Code::RateLimited,
                "this token has too many requests in progress (api.token_concurrent_requests); \
                 retry when one has been answered",
            )
            .retry_after(1)
            .into_response();
        }
        Err(Refusal::TokenRate(wait)) => {
            let seconds = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
            return ApiError::new(
                Code::RateLimited,
                format!(
                    "this token made too many requests (api.token_requests_per_minute); retry in \
                     {seconds} s"
                ),
            )
            .retry_after(seconds.max(1))
            .into_response();
        }
    };
    if let Some(found) = authenticated {
        request
            .extensions_mut()
            .insert(access::Authentication(found));
    }
    request.extensions_mut().insert(BodyDeadline {
        at: tokio::time::Instant::now() + admission.body_timeout,
        seconds: admission.body_timeout.as_secs(),
    });
    // Background work yields to requests of valid tokens only: nobody unauthenticated can
    // slow convergence down.
    let in_progress = counted.then(|| state.foreground.enter());
    let response = next.run(request).await;
    drop(in_progress);
    drop(admitted);
    response
}

/// Serves the router on the listener until `shutdown` resolves, cutting off a client that
/// has not sent its request headers within `api.header_timeout`; in-flight requests get up to
/// 10 s to finish after shutdown.
pub async fn serve(
    listener: tokio::net::TcpListener,
    router: Router,
    settings: &ApiSettings,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    use hyper_util::rt::{TokioIo, TokioTimer};
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let live = Arc::new(());
    let mut shutdown = std::pin::pin!(shutdown);
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(settings.header_timeout);
    loop {
        let (stream, peer): (tokio::net::TcpStream, SocketAddr) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    // Out of file descriptors and the like: wait instead of spinning.
                    tracing::warn!("accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let service = hyper_util::service::TowerToHyperService::new(router.clone());
        // With upgrades: the gateway route hands its connection over to a gateway stream.
        let conn = http
            .serve_connection(TokioIo::new(stream), service)
            .with_upgrades();
        let mut stop = stop_rx.clone();
        let live = live.clone();
        tokio::spawn(async move {
            let _live = live;
            let mut conn = std::pin::pin!(conn);
            let ended = tokio::select! {
                r = conn.as_mut() => r,
                _ = async { stop.wait_for(|s| *s).await.map(|_| ()) } => {
                    conn.as_mut().graceful_shutdown();
                    conn.await
                }
            };
            if let Err(e) = ended {
                tracing::debug!(%peer, "connection ended: {e}");
            }
        });
    }
    drop(listener);
    let _ = stop_tx.send(true);
    // Each connection task holds a clone of `live`; wait for them to finish their requests.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while Arc::strong_count(&live) > 1 {
        if tokio::time::Instant::now() >= deadline {
            tracing::warn!("requests still in progress 10 s after shutdown; closing them");
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

/// The largest request body accepted.
pub const MAX_BODY: usize = 1024 * 1024;

/// Gives the framework's own rejections (body too large, method not allowed, unsupported
/// media type, ...) the API's JSON error shape, so every error a client sees is
/// `{"error": {"code", "message"}}`.
async fn json_errors(response: Response) -> Response {
    let status = response.status();
    if !(status.is_client_error() || status.is_server_error())
        || gateway_proxy::is_pass_through(&response)
    {
        return response;
    }
    let is_json = response
        .headers()
        .get(axum::http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    if is_json {
        return response;
    }
    let (code, message) = match status {
        StatusCode::PAYLOAD_TOO_LARGE => (
            Code::BodyTooLarge,
            format!("request bodies are limited to {} KiB", MAX_BODY / 1024),
        ),
        StatusCode::REQUEST_TIMEOUT => (
            Code::RequestTimeout,
            "the request was not completed within the API's request timeout".to_owned(),
        ),
        StatusCode::METHOD_NOT_ALLOWED => (
            Code::MethodNotAllowed,
            "this route does not take that method; see /openapi.json".to_owned(),
        ),
        StatusCode::UNSUPPORTED_MEDIA_TYPE => (
            Code::UnsupportedMediaType,
            "request bodies must be JSON".to_owned(),
        ),
        s if s.is_server_error() => (
            Code::InternalError,
            "the coordinator failed; see its log".to_owned(),
        ),
        _ => (
            Code::InvalidRequest,
            format!(
                "the request was refused: {}",
                status.canonical_reason().unwrap_or("bad request")
            ),
        ),
    };
    // The framework chose the status already; the body names the nearest code.
    ApiError::from_target(status, code.as_str(), message).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn shaped(status: StatusCode, content_type: &str, body: String) -> Response {
        let plain = Response::builder()
            .status(status)
            .header(axum::http::header::CONTENT_TYPE, content_type)
            .body(axum::body::Body::from(body))
            .unwrap_or_default();
        json_errors(plain).await
    }

    async fn error_of(r: Response) -> (StatusCode, serde_json::Value) {
        let status = r.status();
        let bytes = axum::body::to_bytes(r.into_body(), MAX_BODY)
            .await
            .unwrap_or_default();
        (
            status,
            serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null),
        )
    }

    /// The framework's plain-text rejections get the API's JSON shape and a code from their
    /// status: 415 (an extractor that checks the media type; none of the routes' extractors
    /// does today) and any 5xx (a layer's own failure) included.
    #[tokio::test]
    async fn plain_rejections_get_a_code_from_their_status() {
        let cases = [
            (
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                Code::UnsupportedMediaType,
                "request bodies must be JSON",
            ),
            (
                StatusCode::INTERNAL_SERVER_ERROR,
                Code::InternalError,
                "the coordinator failed; see its log",
            ),
            (
                StatusCode::BAD_GATEWAY,
                Code::InternalError,
                "the coordinator failed; see its log",
            ),
            (
                StatusCode::BAD_REQUEST,
                Code::InvalidRequest,
                "the request was refused: Bad Request",
            ),
            (
                StatusCode::PAYLOAD_TOO_LARGE,
                Code::BodyTooLarge,
                "request bodies are limited to 1024 KiB",
            ),
        ];
        for (status, code, message) in cases {
            let (got, v) = error_of(shaped(status, "text/plain", "nope".into()).await).await;
            assert_eq!(got, status);
            assert_eq!(v["error"]["code"], code.as_str(), "{status}: {v}");
            assert_eq!(v["error"]["message"], message, "{status}: {v}");
        }
        // An answer that is JSON already, or not an error, passes unchanged.
        let (_, v) = error_of(
            shaped(
                StatusCode::CONFLICT,
                "application/json",
                json!({"error": {"code": Code::NotFound.as_str(), "message": "x"}}).to_string(),
            )
            .await,
        )
        .await;
        assert_eq!(v["error"]["code"], Code::NotFound.as_str());
        let ok = shaped(StatusCode::OK, "text/plain", "fine".into()).await;
        assert_eq!(ok.status(), StatusCode::OK);
    }
}
