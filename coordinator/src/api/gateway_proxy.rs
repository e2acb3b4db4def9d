//! The gateway route (issue 30): `.../namespaces/{ns}/agents/{agent}/gateway/{path}`, every
//! method, passed to the Agent's gateway over the same [`crate::backend::GatewayDialer`] as
//! `occ agent connect` (hosts: hostd's relay channel; clusters: the API server's
//! port-forward), one gateway connection per request or WebSocket.
//!
//! - Who: the route table's access (`deploy` in the Namespace, as for the tunnel: the gateway
//!   is the Agent's admin surface). API clients send their bearer token; a browser signed in
//!   to the console sends its session cookie, which [`session_for_gateway`] turns into the
//!   bearer token for this route only (the rest of the API never takes cookies).
//! - What reaches the gateway: the request as sent (method, the path after `/gateway`, the
//!   query, headers, body), but without the caller's `Cookie` and `Authorization` (the
//!   console's session and the API token stay here) and without hop-by-hop headers
//!   (RFC 9110 7.6.1; a WebSocket upgrade keeps `Connection`/`Upgrade`); with
//!   `Authorization: Bearer <the Agent's managed gateway password>` added at this last hop
//!   when the Agent has one. The password comes from the target (hostd's own state in the
//!   relay's `Opened` answer; the Agent's Secret on a cluster), lives in memory for this one
//!   request, and is never answered, logged or audited.
//! - What the caller gets: the gateway's answer, status, headers and body unchanged (but
//!   hop-by-hop headers), or the gateway's `101` and then the WebSocket.
//! - `Origin`: a WebSocket upgrade and every request but GET, HEAD and OPTIONS with an
//!   `Origin` must come from the coordinator itself (`http(s)://` and the request's `Host`)
//!   or an origin of `api.gateway_allowed_origins`; others are refused with
//!   `ORIGIN_REFUSED` naming the Origin.
//! - A WebSocket is a gateway stream like the tunnel's: per-token cap, re-checked every
//!   `api.gateway_recheck`, audited when it opens (`agent.gateway-connect`) and when it ends
//!   (`agent.gateway-stream`). When the gateway goes away without closing the WebSocket
//!   (a restart, a new revision's cutover) or the Agent moves to another active revision,
//!   the browser's WebSocket is closed with 1012 (service restart) so the Control UI
//!   reconnects; a stop or delete closes it with 1001, a revoked or expired token with 1008.
//!   A close is only ever written between two of the gateway's frames.
//! - `.../agents/{agent}/ui/{path}` is the Control UI's own route ([`Mount::ControlUi`]):
//!   GET only, the same rules, but the gateway sees the whole path. Each revision tells its
//!   gateway that path as `gateway.controlUi.basePath` (`crate::render::serve_control_ui_at`),
//!   and the gateway writes it into the page's absolute links (`<basePath>/assets/...`), which
//!   a stripped prefix would send to the coordinator's root. The gateway's API stays at its
//!   root, on the gateway route. A revision built without that path is refused
//!   (`CONTROL_UI_NOT_DEPLOYED`) rather than answered with a page whose links all miss.
//! - `.../gateway` and `.../ui` without their trailing slash are roots too: the Control UI
//!   opens its WebSocket at the page's path without its last slash. A plain GET or HEAD
//!   of one is answered 308 to the root with the slash instead, so the page's relative links
//!   resolve under it.
//! - Plain requests other than GET, HEAD and OPTIONS are audited (`agent.gateway-request`:
//!   method, path, status); reads are logged only.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use axum::Extension;
use axum::extract::{Path, Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use super::access::Caller;
use super::gateway::GatewayStreams;
use super::{ApiError, ApiResult, S};
use crate::backend::Backend;
use crate::codes::Code;
use crate::service::GatewayPlace;

/// The gateway's own answer, passed on unchanged: the router's success status and the
/// API's JSON error shape leave it alone ([`PassThrough`]).
#[derive(Debug)]
pub(crate) struct Proxied(Response);

/// Marks a response that is the gateway's, not the API's.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PassThrough;

impl IntoResponse for Proxied {
    fn into_response(self) -> Response {
        let mut r = self.0;
        r.extensions_mut().insert(PassThrough);
        r
    }
}

/// Whether `response` is the gateway's own ([`Proxied`]).
pub(crate) fn is_pass_through(response: &Response) -> bool {
    response.extensions().get::<PassThrough>().is_some()
}

/// Hop-by-hop headers (RFC 9110 7.6.1): they describe one connection, never passed on.
const HOP_BY_HOP: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

/// The caller's credentials, never passed to the gateway.
const CREDENTIALS: &[header::HeaderName] = &[header::COOKIE, header::AUTHORIZATION];

/// Whether `path` is one of the table's gateway routes (`Answer::Proxy` rows): the row's
/// segments up to `{path}`, each `{param}` one non-empty segment, then nothing (the root
/// without its slash) or `/` and anything.
pub(crate) fn is_gateway_route(path: &str) -> bool {
    clawfleet_api::ROUTES
        .iter()
        .filter(|r| matches!(r.answer, clawfleet_api::Answer::Proxy))
        .any(|r| {
            let Some(prefix) = r.path.strip_suffix(clawfleet_api::routes::PROXY_PATH_PARAM) else {
                return false;
            };
            let mut rest = path;
            for seg in prefix.trim_end_matches('/').split('/').skip(1) {
                let Some(after) = rest.strip_prefix('/') else {
                    return false;
                };
                let (got, tail) = after.split_at(after.find('/').unwrap_or(after.len()));
                let fits = if seg.starts_with('{') {
                    !got.is_empty()
                } else {
                    got == seg
                };
                if !fits {
                    return false;
                }
                rest = tail;
            }
            rest.is_empty() || rest.starts_with('/')
        })
}

/// Which of the two proxy routes a request came in on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mount {
    /// `.../gateway/{path}`: the gateway sees `/{path}` (its API, its own root).
    Gateway,
    /// `.../ui/{path}`: the gateway sees the whole path, which is its Control UI's
    /// `basePath` (`clawfleet_api::routes::control_ui_path`).
    ControlUi,
}

/// The path and query the gateway sees, from the request's own (still percent-encoded) path
/// and its query, as sent: on the gateway route what follows `/gateway`, on the Control UI
/// route all of it.
fn upstream_target(uri: &axum::http::Uri, mount: Mount) -> String {
    let path = uri.path();
    let path = match mount {
        // `/namespaces/{ns}/agents/{agent}/gateway` is five segments.
        Mount::Gateway => format!("/{}", path.splitn(7, '/').nth(6).unwrap_or("")),
        Mount::ControlUi => path.to_owned(),
    };
    match uri.query() {
        Some(q) => format!("{path}?{q}"),
        None => path,
    }
}

/// `308` from the gateway's root without its slash to the root, the query kept: the
/// gateway's own answer would resolve the page's relative links against the Agent's path.
fn to_root(uri: &axum::http::Uri) -> Proxied {
    let location = match uri.query() {
        Some(q) => format!("{}/?{q}", uri.path()),
        None => format!("{}/", uri.path()),
    };
    // The path and query came in as a valid URI; with a slash added they still are.
    Proxied(match HeaderValue::from_str(&location) {
        Ok(v) => (StatusCode::PERMANENT_REDIRECT, [(header::LOCATION, v)]).into_response(),
        Err(_) => StatusCode::BAD_REQUEST.into_response(),
    })
}

/// Refuses an `Origin` that is neither the coordinator's own (`http(s)://` and this
/// request's `Host`) nor one of `allowed`.
pub(crate) fn check_origin(headers: &HeaderMap, allowed: &[String]) -> Result<(), ApiError> {
    let Some(origin) = headers.get(header::ORIGIN) else {
        return Ok(());
    };
    let origin = origin.to_str().unwrap_or("");
    let host = headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or("");
    let own = !host.is_empty()
        && (origin == format!("http://{host}") || origin == format!("https://{host}"));
    if own || allowed.iter().any(|a| a.eq_ignore_ascii_case(origin)) {
        return Ok(());
    }
    Err(ApiError::new(
        Code::OriginRefused,
        format!(
            "Origin {:?} is neither this coordinator ({host}) nor in api.gateway_allowed_origins; \
             the Agent's gateway is not opened for pages of other sites",
            origin.chars().take(100).collect::<String>()
        ),
    ))
}

/// For the gateway routes only: a request without `Authorization` that carries the
/// console's session cookie is authenticated with the session's token (the browser's way in;
/// `SameSite=Strict` keeps other sites' requests from carrying it). Every other route takes
/// bearer tokens only.
pub(crate) async fn session_for_gateway(mut request: Request, next: Next) -> Response {
    if !request.headers().contains_key(header::AUTHORIZATION)
        && is_gateway_route(request.uri().path())
        && let Some(token) = super::access::session_cookie_token(request.headers())
        && let Ok(mut value) = HeaderValue::from_str(&format!("Bearer {token}"))
    {
        value.set_sensitive(true);
        request.headers_mut().insert(header::AUTHORIZATION, value);
    }
    next.run(request).await
}

fn is_websocket_upgrade(headers: &HeaderMap) -> bool {
    super::gateway::header_has(headers, header::CONNECTION, "upgrade")
        && super::gateway::header_has(headers, header::UPGRADE, "websocket")
}

fn bad_gateway(place: &GatewayPlace, what: &str, e: impl std::fmt::Display) -> ApiError {
    ApiError::new(
        Code::GatewayRouteFailed,
        format!(
            "the gateway of Agent {}/{} {what}: {e}",
            place.namespace, place.agent
        ),
    )
}

macro_rules! method_handlers {
    ($($mount:ident: $name:ident),*) => {$(
        /// One method of the gateway route or the Control UI route (the module's
        /// documentation).
        pub(super) async fn $name<B: Backend>(
            st: S<B>,
            caller: Caller,
            streams: Extension<Arc<GatewayStreams>>,
            params: Path<HashMap<String, String>>,
            request: Request,
        ) -> ApiResult<Proxied> {
            proxy(st, caller, streams, params, request, Mount::$mount).await
        }
    )*};
}

method_handlers!(
    Gateway: gateway_get,
    Gateway: gateway_post,
    Gateway: gateway_put,
    Gateway: gateway_patch,
    Gateway: gateway_delete,
    ControlUi: control_ui_get
);

async fn proxy<B: Backend>(
    State(st): S<B>,
    caller: Caller,
    Extension(streams): Extension<Arc<GatewayStreams>>,
    Path(params): Path<HashMap<String, String>>,
    mut request: Request,
    mount: Mount,
) -> ApiResult<Proxied> {
    let ns = params.get("ns").map(String::as_str).unwrap_or("");
    let agent = params.get("agent").map(String::as_str).unwrap_or("");
    let place = match mount {
        Mount::Gateway => st.service.gateway_place(ns, agent).await?,
        Mount::ControlUi => st.service.control_ui_place(ns, agent).await?,
    };
    let websocket = is_websocket_upgrade(request.headers());
    let method = request.method().clone();
    if !websocket
        && matches!(method, Method::GET | Method::HEAD)
        && !params.contains_key("path")
        && !request.uri().path().ends_with('/')
    {
        return Ok(to_root(request.uri()));
    }
    let reads = matches!(method, Method::GET | Method::HEAD | Method::OPTIONS);
    if websocket || !reads {
        check_origin(request.headers(), streams.allowed_origins())?;
    }
    let slot = if websocket {
        Some(streams.take(&caller.token_id).ok_or_else(|| {
            ApiError::new(
                Code::GatewayStreamLimit,
                format!(
                    "this token has {} gateway streams open (api.gateway_streams_per_token)",
                    streams.per_token()
                ),
            )
        })?)
    } else {
        None
    };
    let dialer = st.backend.gateway().ok_or_else(|| {
        ApiError::new(
            Code::BackendUnsupported,
            "this coordinator's backend opens no gateway streams",
        )
    })?;
    let actor = format!("token:{}", caller.token_id);
    let target = upstream_target(request.uri(), mount);
    let started = Instant::now();
    let stream = dialer
        .open_with_auth(&place.target, &place.namespace, &place.agent, &actor)
        .await
        .map_err(|e| super::runtime::call_error(crate::service::RuntimeError::Call(e)))?;
    let token_hash = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(|t| crate::tokens::hash(t.trim()))
        .ok_or_else(|| ApiError::new(Code::Unauthenticated, "a bearer token is required"))?;
    let client_upgrade = websocket.then(|| hyper::upgrade::on(&mut request));
    let (parts, body) = request.into_parts();
    let mut headers = parts.headers;
    for name in CREDENTIALS {
        headers.remove(name);
    }
    if !websocket {
        for name in HOP_BY_HOP {
            headers.remove(*name);
        }
    }
    // A WebSocket's first message carries the gateway's password too (`gateway_connect`):
    // kept for that, and the frames left uncompressed so it can be read.
    let connect_password = if websocket {
        stream.password.clone()
    } else {
        None
    };
    if connect_password.is_some() {
        headers.remove(header::SEC_WEBSOCKET_EXTENSIONS);
    }
    if let Some(password) = &stream.password {
        let mut v = HeaderValue::from_str(&format!("Bearer {}", password.expose()))
            .map_err(|_| bad_gateway(&place, "has a password that is no header value", ""))?;
        v.set_sensitive(true);
        headers.insert(header::AUTHORIZATION, v);
    }
    let mut upstream = axum::http::Request::builder()
        .method(method.clone())
        .uri(target.as_str())
        .version(axum::http::Version::HTTP_11)
        .body(body)
        .map_err(|e| bad_gateway(&place, "cannot be asked this request", e))?;
    *upstream.headers_mut() = headers;
    drop(stream.password);
    let io = hyper_util::rt::TokioIo::new(stream.io);
    let (mut sender, conn) = hyper::client::conn::http1::handshake(io)
        .await
        .map_err(|e| bad_gateway(&place, "did not speak HTTP", e))?;
    tokio::spawn(async move {
        if let Err(e) = conn.with_upgrades().await {
            tracing::debug!("a gateway route connection ended: {e}");
        }
    });
    let mut response = sender
        .send_request(upstream)
        .await
        .map_err(|e| bad_gateway(&place, "did not answer", e))?;
    let status = response.status();
    tracing::info!(
        namespace = %place.namespace, agent = %place.agent, actor = %actor, %method,
        path = %target.split('?').next().unwrap_or(""), status = status.as_u16(),
        open_ms = started.elapsed().as_millis() as u64, "gateway route request"
    );
    if !reads && !websocket {
        let path = target.split('?').next().unwrap_or("");
        if let Err(e) = st
            .service
            .audit_gateway_request(&actor, &place, method.as_str(), path, status.as_u16())
            .await
        {
            tracing::error!("the audit record of a gateway request could not be written: {e}");
        }
    }
    match (client_upgrade, status) {
        (Some(client), StatusCode::SWITCHING_PROTOCOLS) => {
            let gateway = hyper::upgrade::on(&mut response);
            if let Err(e) = st
                .service
                .audit_gateway_connect(&actor, &place, "websocket")
                .await
            {
                tracing::error!("the audit record of a gateway stream could not be written: {e}");
            }
            let (parts, _) = response.into_parts();
            let recheck = streams.recheck();
            tokio::spawn(async move {
                let _slot = slot;
                let (reason, up, down) = match (client.await, gateway.await) {
                    (Ok(c), Ok(g)) => {
                        run_websocket(
                            &st,
                            hyper_util::rt::TokioIo::new(c),
                            hyper_util::rt::TokioIo::new(g),
                            connect_password,
                            &token_hash,
                            &place,
                            recheck,
                        )
                        .await
                    }
                    _ => ("upgrade failed", 0, 0),
                };
                let ms = started.elapsed().as_millis() as u64;
                tracing::info!(
                    namespace = %place.namespace, agent = %place.agent, actor = %actor,
                    bytes_to_gateway = up, bytes_from_gateway = down, duration_ms = ms, reason,
                    "gateway route WebSocket closed"
                );
                if let Err(e) = st
                    .service
                    .audit_gateway_stream(&actor, &place, "websocket", up, down, ms, reason)
                    .await
                {
                    tracing::error!(
                        "the audit record of a gateway stream could not be written: {e}"
                    );
                }
            });
            let mut answer = Response::from_parts(parts, axum::body::Body::empty());
            *answer.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
            Ok(Proxied(answer))
        }
        _ => {
            let (mut parts, body) = response.into_parts();
            for name in HOP_BY_HOP {
                parts.headers.remove(*name);
            }
            Ok(Proxied(Response::from_parts(
                parts,
                axum::body::Body::new(body),
            )))
        }
    }
}

/// Where the gateway's side of a WebSocket is: between frames, or inside one (its header
/// or its payload). Only between frames may the coordinator write a close frame of its own.
#[derive(Debug, Default)]
struct FrameTracker {
    /// The bytes of a frame header read so far (at most 14).
    header: Vec<u8>,
    /// Payload bytes of the current frame still to come.
    remaining: u64,
    /// The gateway sent a close frame (the WebSocket is closing already).
    saw_close: bool,
}

impl FrameTracker {
    /// Follows `bytes` from the gateway.
    fn feed(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            if self.remaining > 0 {
                let n = (self.remaining.min(bytes.len() as u64)) as usize;
                self.remaining -= n as u64;
                bytes = &bytes[n..];
                continue;
            }
            self.header.push(bytes[0]);
            bytes = &bytes[1..];
            if let Some((len, opcode)) = self.complete_header() {
                if opcode == 0x8 {
                    self.saw_close = true;
                }
                self.remaining = len;
                self.header.clear();
            }
        }
    }

    /// The payload length and opcode once the header is complete.
    fn complete_header(&self) -> Option<(u64, u8)> {
        super::ws_frame::header(&self.header).map(|h| (h.payload_len, h.opcode))
    }

    fn between_frames(&self) -> bool {
        self.remaining == 0 && self.header.is_empty()
    }
}

/// A server's close frame (unmasked) with `code` and a short reason.
fn close_frame(code: u16, reason: &str) -> Vec<u8> {
    let reason = &reason.as_bytes()[..reason.len().min(123)];
    let mut f = vec![0x88, (2 + reason.len()) as u8];
    f.extend_from_slice(&code.to_be_bytes());
    f.extend_from_slice(reason);
    f
}

/// The WebSocket close code for why the coordinator ends a stream, `None` when the caller
/// ended it.
fn close_code(reason: &str) -> Option<u16> {
    match reason {
        "gateway closed" | "gateway error" | "active revision changed" => Some(1012),
        "agent stopped" | "agent deleted" => Some(1001),
        "token revoked" | "token expired" => Some(1008),
        _ => None,
    }
}

/// Copies both ways until either side ends or a re-check says the WebSocket must close;
/// closes the caller's WebSocket with [`close_code`] when the coordinator ends it. With the
/// gateway's `password`, the caller's first frame goes through `gateway_connect` first.
/// Answers the close reason and the bytes to and from the gateway.
async fn run_websocket<B: Backend>(
    st: &super::AppState<B>,
    client: impl AsyncRead + AsyncWrite + Unpin,
    gateway: impl AsyncRead + AsyncWrite + Unpin,
    password: Option<crate::backend::GatewayPassword>,
    token_hash: &str,
    place: &GatewayPlace,
    recheck: std::time::Duration,
) -> (&'static str, u64, u64) {
    let up = AtomicU64::new(0);
    let down = AtomicU64::new(0);
    let (mut cr, mut cw) = tokio::io::split(client);
    let (mut gr, mut gw) = tokio::io::split(gateway);
    let mut tracker = FrameTracker::default();
    let reason = {
        let to_gateway = async {
            if let Some(password) = password {
                let first = super::gateway_connect::first_frame(&mut cr, &password).await?;
                drop(password);
                if first.is_empty() {
                    gw.shutdown().await?;
                    return Ok::<(), std::io::Error>(());
                }
                gw.write_all(&first).await?;
                up.fetch_add(first.len() as u64, Ordering::Relaxed);
            }
            let mut buf = vec![0u8; 64 * 1024];
            loop {
                let n = cr.read(&mut buf).await?;
                if n == 0 {
                    gw.shutdown().await?;
                    return Ok::<(), std::io::Error>(());
                }
                gw.write_all(&buf[..n]).await?;
                up.fetch_add(n as u64, Ordering::Relaxed);
            }
        };
        let from_gateway = async {
            let mut buf = vec![0u8; 64 * 1024];
            loop {
                let n = gr.read(&mut buf).await?;
                if n == 0 {
                    return Ok::<(), std::io::Error>(());
                }
                cw.write_all(&buf[..n]).await?;
                tracker.feed(&buf[..n]);
                down.fetch_add(n as u64, Ordering::Relaxed);
            }
        };
        let checks = async {
            let mut tick = tokio::time::interval(recheck);
            tick.tick().await;
            loop {
                tick.tick().await;
                if let Some(why) = st
                    .service
                    .gateway_stream_ends(token_hash, place, crate::clock::now_seconds())
                    .await
                {
                    return why;
                }
            }
        };
        tokio::pin!(to_gateway, from_gateway, checks);
        let mut caller_done = false;
        loop {
            tokio::select! {
                r = &mut to_gateway, if !caller_done => match r {
                    Ok(()) => caller_done = true,
                    Err(_) => break "client error",
                },
                r = &mut from_gateway => break match (r, caller_done) {
                    (_, true) => "closed",
                    (Ok(()), false) => "gateway closed",
                    (Err(_), false) => "gateway error",
                },
                why = &mut checks => break why,
            }
        }
    };
    if let Some(code) = close_code(reason)
        && tracker.between_frames()
        && !tracker.saw_close
    {
        let text = match code {
            1012 => "the Agent's gateway restarts or moved to a new revision; reconnect",
            1001 => "the Agent was stopped or deleted",
            _ => "the caller's token was revoked or expired",
        };
        if let Err(e) = cw.write_all(&close_frame(code, text)).await {
            tracing::debug!("the close frame could not be written: {e}");
        }
    }
    if let Err(e) = cw.shutdown().await {
        tracing::debug!("the caller's WebSocket did not shut down cleanly: {e}");
    }
    (
        reason,
        up.load(Ordering::Relaxed),
        down.load(Ordering::Relaxed),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_names_the_gateway_routes() {
        assert!(is_gateway_route("/namespaces/a/agents/b/gateway/"));
        assert!(is_gateway_route("/namespaces/a/agents/b/gateway/x/y.js"));
        assert!(is_gateway_route("/namespaces/a/agents/b/gateway"));
        assert!(is_gateway_route("/namespaces/a/agents/b/ui/assets/x.js"));
        assert!(is_gateway_route("/namespaces/a/agents/b/ui"));
        assert!(!is_gateway_route("/namespaces/a/agents/b/gateway-tunnel"));
        assert!(!is_gateway_route("/namespaces/a/agents/b/runtime"));
        assert!(!is_gateway_route("/namespaces//agents/b/gateway/"));
        assert!(!is_gateway_route("/console/namespaces/a/agents/b/gateway/"));
    }

    #[test]
    fn the_gateway_sees_the_rest_of_the_path_and_the_query_as_sent() {
        let uri: axum::http::Uri = "/namespaces/a/agents/b/gateway/x%2Fy/z?q=1&r=%20"
            .parse()
            .unwrap_or_default();
        assert_eq!(upstream_target(&uri, Mount::Gateway), "/x%2Fy/z?q=1&r=%20");
        let root: axum::http::Uri = "/namespaces/a/agents/b/gateway/"
            .parse()
            .unwrap_or_default();
        assert_eq!(upstream_target(&root, Mount::Gateway), "/");
        // The Control UI's own path is its basePath: passed on whole.
        let ui: axum::http::Uri = "/namespaces/a/agents/b/ui/assets/x.js?v=1"
            .parse()
            .unwrap_or_default();
        assert_eq!(
            upstream_target(&ui, Mount::ControlUi),
            "/namespaces/a/agents/b/ui/assets/x.js?v=1"
        );
        let bare: axum::http::Uri = "/namespaces/a/agents/b/ui".parse().unwrap_or_default();
        assert_eq!(
            upstream_target(&bare, Mount::ControlUi),
            "/namespaces/a/agents/b/ui"
        );
    }

    #[test]
    fn frames_are_followed_across_reads() {
        let mut t = FrameTracker::default();
        // A 300-byte binary frame (16-bit length), then a masked 5-byte text frame.
        let mut bytes = vec![0x82, 126, 0x01, 0x2c];
        bytes.extend(std::iter::repeat_n(7u8, 300));
        bytes.extend([0x81, 0x85, 1, 2, 3, 4, b'h', b'e', b'l', b'l', b'o']);
        for chunk in bytes.chunks(7) {
            t.feed(chunk);
        }
        assert!(t.between_frames() && !t.saw_close);
        t.feed(&[0x82, 10, 1, 2]);
        assert!(!t.between_frames());
        t.feed(&[0; 8]);
        assert!(t.between_frames());
        t.feed(&close_frame(1000, "bye"));
        assert!(t.saw_close && t.between_frames());
        assert_eq!(close_frame(1012, "r"), vec![0x88, 3, 0x03, 0xf4, b'r']);
    }
}
