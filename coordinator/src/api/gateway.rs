//! Gateway streams through the coordinator (issue 30): `GET .../agents/{agent}/gateway-tunnel`
//! upgrades the connection to `clawfleet-gateway` and joins it to a stream the backend's
//! [`crate::backend::GatewayDialer`] opens to the Agent's gateway (hosts: hostd's relay).
//!
//! - Role: `deploy` in the Namespace. The gateway behind the stream is the Agent's admin
//!   surface (its Control UI and RPC change its configuration live, run its tools, pair
//!   devices), which is what a deploy-role token can already decide through configurations;
//!   `operate` (stop, reconcile) and `read` are not enough.
//! - A request with an `Origin` other than the coordinator's own (or one of
//!   `api.gateway_allowed_origins`) is refused with `ORIGIN_REFUSED` naming it.
//! - Nothing of the caller's request reaches the gateway: the tunnel carries the bytes the
//!   caller sends after the upgrade, so its token and cookies stay at the coordinator.
//! - Each stream: at most `api.gateway_streams_per_token` per token; re-checked every
//!   `api.gateway_recheck` (≤ 30 s) and closed when its token is revoked or expires, the Agent
//!   is stopped or deleted, or its active revision changes; one audit event
//!   `agent.gateway-connect` when it opens and one `agent.gateway-stream` when it ends
//!   (principal, Agent, revision, target, bytes each way, duration, close reason).
//!
//! The HTTP and WebSocket route for browsers (`.../gateway/{path}`) is `gateway_proxy.rs`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Extension;
use axum::extract::{Path, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use clawfleet_api::routes::UPGRADE_PROTOCOL;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use super::access::Caller;
pub(super) use super::gateway_proxy::{
    control_ui_get, gateway_delete, gateway_get, gateway_patch, gateway_post, gateway_put,
};
use super::{ApiError, ApiResult, S};
use crate::backend::Backend;
use crate::codes::Code;
use crate::service::GatewayPlace;

/// The switch to the stream (`Upgrade` in the route table: 101).
#[derive(Debug)]
pub(crate) struct Switching;

impl IntoResponse for Switching {
    fn into_response(self) -> Response {
        (
            StatusCode::SWITCHING_PROTOCOLS,
            [
                (header::CONNECTION, HeaderValue::from_static("upgrade")),
                (header::UPGRADE, HeaderValue::from_static(UPGRADE_PROTOCOL)),
            ],
        )
            .into_response()
    }
}

/// Open gateway streams per token, and the limits.
#[derive(Debug)]
pub(crate) struct GatewayStreams {
    open: Mutex<HashMap<String, usize>>,
    per_token: usize,
    recheck: Duration,
    /// `api.gateway_allowed_origins`.
    allowed_origins: Vec<String>,
}

impl GatewayStreams {
    pub(crate) fn new(per_token: usize, recheck: Duration, allowed_origins: Vec<String>) -> Self {
        Self {
            open: Mutex::new(HashMap::new()),
            per_token,
            recheck,
            allowed_origins,
        }
    }

    pub(super) fn per_token(&self) -> usize {
        self.per_token
    }

    pub(super) fn recheck(&self) -> Duration {
        self.recheck
    }

    pub(super) fn allowed_origins(&self) -> &[String] {
        &self.allowed_origins
    }

    pub(super) fn take(self: &Arc<Self>, token: &str) -> Option<StreamSlot> {
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        let n = open.entry(token.to_owned()).or_insert(0);
        if *n >= self.per_token {
            return None;
        }
        *n += 1;
        Some(StreamSlot {
            streams: self.clone(),
            token: token.to_owned(),
        })
    }
}

/// One of a token's stream slots, given back when dropped.
pub(super) struct StreamSlot {
    streams: Arc<GatewayStreams>,
    token: String,
}

impl Drop for StreamSlot {
    fn drop(&mut self) {
        let mut open = self.streams.open.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = open.get_mut(&self.token) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                open.remove(&self.token);
            }
        }
    }
}

pub(super) fn header_has(headers: &HeaderMap, name: header::HeaderName, token: &str) -> bool {
    headers
        .get_all(name)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| t.trim().eq_ignore_ascii_case(token))
}

pub(super) async fn gateway_tunnel<B: Backend>(
    State(st): S<B>,
    caller: Caller,
    Extension(streams): Extension<Arc<GatewayStreams>>,
    Path((ns, agent)): Path<(String, String)>,
    mut request: Request,
) -> ApiResult<Switching> {
    // The Agent first: a malformed or unknown one is 400/404 whatever the headers.
    let place = st.service.gateway_place(&ns, &agent).await?;
    let headers = request.headers();
    if !header_has(headers, header::CONNECTION, "upgrade")
        || !header_has(headers, header::UPGRADE, UPGRADE_PROTOCOL)
    {
        return Err(ApiError::new(
            Code::UpgradeRequired,
            format!(
                "send Connection: Upgrade and Upgrade: {UPGRADE_PROTOCOL} to open a gateway stream"
            ),
        ));
    }
    super::gateway_proxy::check_origin(headers, &streams.allowed_origins)?;
    let token_hash = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(|t| crate::tokens::hash(t.trim()))
        .ok_or_else(|| ApiError::new(Code::Unauthenticated, "a bearer token is required"))?;
    let slot = streams.take(&caller.token_id).ok_or_else(|| {
        ApiError::new(
            Code::GatewayStreamLimit,
            format!(
                "this token has {} gateway streams open (api.gateway_streams_per_token)",
                streams.per_token
            ),
        )
    })?;
    let dialer = st.backend.gateway().ok_or_else(|| {
        ApiError::new(
            Code::BackendUnsupported,
            "this coordinator's backend opens no gateway streams",
        )
    })?;
    let actor = format!("token:{}", caller.token_id);
    let started = Instant::now();
    let gateway = dialer
        .open(&place.target, &place.namespace, &place.agent, &actor)
        .await
        .map_err(|e| super::runtime::call_error(crate::service::RuntimeError::Call(e)))?;
    tracing::info!(
        namespace = %place.namespace, agent = %place.agent, revision = %place.revision,
        target = place.target.name(), actor = %actor,
        open_ms = started.elapsed().as_millis() as u64, "gateway stream opened"
    );
    if let Err(e) = st
        .service
        .audit_gateway_connect(&actor, &place, "tunnel")
        .await
    {
        tracing::error!("the audit record of a gateway stream could not be written: {e}");
    }
    let upgrade = hyper::upgrade::on(&mut request);
    tokio::spawn(async move {
        let _slot = slot;
        let (reason, up, down) = match upgrade.await {
            Ok(client) => {
                let client = hyper_util::rt::TokioIo::new(client);
                run_stream(&st, client, gateway, &token_hash, &place, streams.recheck).await
            }
            Err(e) => {
                tracing::info!("the gateway stream's upgrade failed: {e}");
                ("upgrade failed", 0, 0)
            }
        };
        let ms = started.elapsed().as_millis() as u64;
        tracing::info!(
            namespace = %place.namespace, agent = %place.agent, actor = %actor,
            bytes_to_gateway = up, bytes_from_gateway = down, duration_ms = ms, reason,
            "gateway stream closed"
        );
        if let Err(e) = st
            .service
            .audit_gateway_stream(&actor, &place, "tunnel", up, down, ms, reason)
            .await
        {
            tracing::error!("the audit record of a gateway stream could not be written: {e}");
        }
    });
    Ok(Switching)
}

/// Copies both ways until either side ends or a re-check says the stream must close;
/// answers the close reason and the bytes to and from the gateway.
async fn run_stream<B: Backend>(
    st: &super::AppState<B>,
    client: impl AsyncRead + AsyncWrite + Unpin,
    gateway: Box<dyn crate::backend::GatewayIo>,
    token_hash: &str,
    place: &GatewayPlace,
    recheck: Duration,
) -> (&'static str, u64, u64) {
    let up = AtomicU64::new(0);
    let down = AtomicU64::new(0);
    let (mut cr, mut cw) = tokio::io::split(client);
    let (mut gr, mut gw) = tokio::io::split(gateway);
    let to_gateway = pump(&mut cr, &mut gw, &up);
    let from_gateway = pump(&mut gr, &mut cw, &down);
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
    let reason = tokio::select! {
        r = async { tokio::join!(to_gateway, from_gateway) } => match r {
            (Ok(()), Ok(())) => "closed",
            (Err(_), _) => "client error",
            (_, Err(_)) => "gateway closed",
        },
        why = checks => why,
    };
    (
        reason,
        up.load(Ordering::Relaxed),
        down.load(Ordering::Relaxed),
    )
}

/// Copies until end of input, then half-closes the output.
async fn pump<R: AsyncRead + Unpin, W: AsyncWrite + Unpin>(
    r: &mut R,
    w: &mut W,
    count: &AtomicU64,
) -> std::io::Result<()> {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = r.read(&mut buf).await?;
        if n == 0 {
            w.shutdown().await?;
            return Ok(());
        }
        w.write_all(&buf[..n]).await?;
        count.fetch_add(n as u64, Ordering::Relaxed);
    }
}
