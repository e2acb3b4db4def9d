//! API tokens: `cf_<id>_<secret>`. Only the SHA-256 of the whole token is stored.

use clawfleet_protocol::ident::{hex, sha256};

use crate::model::Grant;
use crate::store::prelude::*;
use crate::store::{NewTokenRow, StoreError};

/// The stored form of a token.
pub fn hash(token: &str) -> String {
    hex(&sha256(token.as_bytes()))
}

/// Why a token could not be made.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    #[error(transparent)]
    Random(#[from] clawfleet_protocol::random::RandomError),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Creates a token that never expires; returns its id and the secret token text (shown once).
pub async fn create(
    store: &dyn Store,
    name: &str,
    grants: &[Grant],
) -> Result<(String, String), TokenError> {
    create_expiring(store, name, grants, None).await
}

/// Creates a token refused from `expires_at` (seconds since the epoch) on.
pub async fn create_expiring(
    store: &dyn Store,
    name: &str,
    grants: &[Grant],
    expires_at: Option<i64>,
) -> Result<(String, String), TokenError> {
    let id = clawfleet_protocol::random::hex(6)?;
    let token = format!("cf_{id}_{}", clawfleet_protocol::random::hex(24)?);
    store
        .create_token(&NewTokenRow {
            id: &id,
            name,
            secret_hash: &hash(&token),
            grants,
            created_at: crate::clock::now_seconds(),
            expires_at,
        })
        .await?;
    Ok((id, token))
}
