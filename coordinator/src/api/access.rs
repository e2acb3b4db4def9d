//! Who may call a route: the route table gives each route an [`Access`] (defined by the API
//! contract), [`authorize`] checks it before the handler runs, and handlers that need the
//! caller take [`Caller`] as an extractor.

use std::sync::Arc;

use axum::extract::{FromRequestParts, RawPathParams, Request, State};
use axum::http::HeaderMap;
use axum::http::request::Parts;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::{ApiError, AppState};
use crate::backend::Backend;
use crate::codes::Code;
use crate::model::{Grant, Role};
use crate::tokens;

pub use clawfleet_api::Access;

/// The console's session cookie (`crate::console::auth`): it holds the API token, and besides
/// the console it authenticates the gateway route (`gateway_proxy.rs`).
pub const SESSION_COOKIE: &str = "occ_console";

/// The session cookie's value in the request, if any.
pub(crate) fn session_cookie_token(headers: &HeaderMap) -> Option<String> {
    headers
        .get_all(axum::http::header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(k, _)| *k == SESSION_COOKIE)
        .map(|(_, v)| v.trim().to_owned())
        .filter(|v| !v.is_empty())
}

/// Whether the caller meets the route's rule (`namespace`: the path's `{ns}`).
pub(crate) fn check(
    access: Access,
    caller: &Caller,
    namespace: Option<&str>,
) -> Result<(), ApiError> {
    match access {
        Access::Public | Access::Token => Ok(()),
        Access::Global(role) => caller.require("*", role),
        Access::Namespace(role) => caller.require(namespace.unwrap_or("*"), role),
        Access::Scoped(role) => {
            if caller.grants.iter().any(|g| g.role >= role) {
                Ok(())
            } else {
                caller.require("*", role)
            }
        }
    }
}

/// The authenticated caller of a route.
#[derive(Debug, Clone)]
pub struct Caller {
    pub token_id: String,
    pub grants: Vec<Grant>,
}

impl Caller {
    /// Whether a grant covers the role in the Namespace (`"*"`: in all Namespaces).
    pub fn may(&self, namespace: &str, role: Role) -> bool {
        self.grants
            .iter()
            .any(|g| (g.namespace == "*" || g.namespace == namespace) && g.role >= role)
    }

    /// Whether the token holds the role in every Namespace.
    pub fn is_global(&self, role: Role) -> bool {
        self.may("*", role)
    }

    /// 403 unless [`Caller::may`].
    pub fn require(&self, namespace: &str, role: Role) -> Result<(), ApiError> {
        if self.may(namespace, role) {
            return Ok(());
        }
        let scope = if namespace == "*" {
            "all Namespaces".to_owned()
        } else {
            format!("Namespace {namespace}")
        };
        Err(ApiError::new(
            Code::Forbidden,
            format!("this token lacks the {} role for {scope}", role.as_str()),
        ))
    }
}

impl<S: Send + Sync> FromRequestParts<S> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, ApiError> {
        parts.extensions.get::<Caller>().cloned().ok_or_else(|| {
            // A handler asked for the caller on a route the table marks Public.
            ApiError::new(
                Code::InternalError,
                "this route has no caller; see the coordinator log",
            )
        })
    }
}

/// The outcome of the bearer token's lookup by admission (`admit` in `mod.rs`), for the
/// access check.
#[derive(Debug, Clone)]
pub(super) struct Authentication(pub Result<Caller, ApiError>);

/// Looks the bearer token up: unknown, revoked and expired tokens are 401.
pub(super) async fn authenticate<B: Backend>(
    state: &AppState<B>,
    headers: &HeaderMap,
    now: i64,
) -> Result<Caller, ApiError> {
    let unauthorized = |m: String| ApiError::new(Code::Unauthenticated, m);
    let value = headers
        .get("authorization")
        .ok_or_else(|| unauthorized("an Authorization: Bearer <token> header is required".into()))?
        .to_str()
        .map_err(|_| unauthorized("the Authorization header is not text".into()))?;
    let token = value
        .strip_prefix("Bearer ")
        .ok_or_else(|| unauthorized("the Authorization header must be Bearer <token>".into()))?;
    caller_of_secret(state, token, now).await
}

/// The caller a token's secret names: unknown, revoked and expired tokens are 401 (the
/// API's bearer header and the console's session cookie both carry the secret).
pub(crate) async fn caller_of_secret<B: Backend>(
    state: &AppState<B>,
    token: &str,
    now: i64,
) -> Result<Caller, ApiError> {
    let unauthorized = |m: String| ApiError::new(Code::Unauthenticated, m);
    let row = state
        .service
        .token(&tokens::hash(token.trim()))
        .await?
        .ok_or_else(|| unauthorized("the token is unknown or revoked".into()))?;
    if let Some(at) = row.expires_at
        && now >= at
    {
        return Err(unauthorized(format!(
            "the token expired at {at} (seconds since the epoch)"
        )));
    }
    Ok(Caller {
        token_id: row.id,
        grants: row.grants,
    })
}

/// The route layer in front of every handler: checks the route's [`Access`] and hands the
/// [`Caller`] to the handler.
pub(super) async fn authorize<B: Backend>(
    State((state, access)): State<(Arc<AppState<B>>, Access)>,
    params: RawPathParams,
    mut request: Request,
    next: Next,
) -> Response {
    if access == Access::Public {
        return next.run(request).await;
    }
    // Admission looked the token up already; without a header there is nothing to look up.
    let found = match request.extensions_mut().remove::<Authentication>() {
        Some(Authentication(found)) => found,
        None => authenticate(&state, request.headers(), crate::clock::now_seconds()).await,
    };
    let caller = match found {
        Ok(c) => c,
        Err(e) => return e.into_response(),
    };
    let namespace = params.iter().find(|(k, _)| *k == "ns").map(|(_, v)| v);
    if let Err(e) = check(access, &caller, namespace) {
        return e.into_response();
    }
    request.extensions_mut().insert(caller);
    next.run(request).await
}
