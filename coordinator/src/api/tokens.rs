//! API tokens: created with grants and an optional expiry, revoked by id.

use std::collections::HashSet;

use axum::extract::{Path, State};
use clawfleet_api::responses::CreatedToken;

use super::access::Caller;
use super::extract::StrictJson;
use super::{ApiError, ApiResult, NoContent, Reply, S, ok};
use crate::backend::Backend;
use crate::codes::Code;
use crate::service::TokenChangeError;

pub use clawfleet_api::requests::NewToken;

fn invalid(code: Code, message: String) -> ApiError {
    ApiError::new(code, message)
}

/// Checks grants and expiry before anything is stored.
fn check(req: &NewToken, now: i64) -> Result<(), ApiError> {
    if req.name.is_empty()
        || req.name.chars().count() > 128
        || req.name.chars().any(char::is_control)
    {
        return Err(invalid(
            Code::InvalidBody,
            "name must be 1 to 128 characters without control characters".into(),
        ));
    }
    if req.grants.is_empty() {
        return Err(invalid(
            Code::InvalidBody,
            "grants must not be empty".into(),
        ));
    }
    let mut seen = HashSet::new();
    for (i, g) in req.grants.iter().enumerate() {
        if g.namespace != "*" {
            clawfleet_protocol::Ident::new(g.namespace.as_str()).map_err(|e| {
                invalid(
                    Code::InvalidIdentifier,
                    format!("grants[{i}].namespace {e}"),
                )
            })?;
        }
        if !seen.insert(g.namespace.as_str()) {
            return Err(invalid(
                Code::DuplicateGrant,
                format!(
                    "grants[{i}].namespace {:?} is granted twice; give each Namespace one role (roles include the ones below them)",
                    g.namespace
                ),
            ));
        }
    }
    if let Some(at) = req.expires_at
        && at <= now
    {
        return Err(invalid(
            Code::InvalidExpiry,
            format!("expiresAt {at} is not in the future (now is {now}, seconds since the epoch)"),
        ));
    }
    Ok(())
}

pub(super) async fn create_token<B: Backend>(
    State(st): S<B>,
    caller: Caller,
    StrictJson(req): StrictJson<NewToken>,
) -> ApiResult<Reply<CreatedToken>> {
    let now = crate::clock::now_seconds();
    check(&req, now)?;
    let (id, secret) = st
        .service
        .create_token(&caller.token_id, &req.name, &req.grants, req.expires_at)
        .await
        .map_err(|e| match e {
            TokenChangeError::Service(e) => ApiError::from(e),
            TokenChangeError::Token(e) => {
                tracing::error!("token creation failed: {e}");
                ApiError::new(
                    Code::TokenFailure,
                    "the token could not be created; see the coordinator log",
                )
            }
        })?;
    ok(CreatedToken {
        id,
        token: secret,
        grants: req.grants,
        expires_at: req.expires_at,
    })
}

pub(super) async fn revoke_token<B: Backend>(
    State(st): S<B>,
    caller: Caller,
    Path(id): Path<String>,
) -> ApiResult<NoContent> {
    st.service.revoke_token(&caller.token_id, &id).await?;
    Ok(NoContent)
}
