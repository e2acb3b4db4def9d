//! Creating and revoking API tokens, each with its audit event.

use serde_json::json;

use super::{Result, Service, ServiceError};
use crate::model::Grant;
use crate::tokens::{self, TokenError};

/// Why a token could not be created or revoked.
#[derive(Debug, thiserror::Error)]
pub enum TokenChangeError {
    #[error(transparent)]
    Token(#[from] TokenError),
    #[error(transparent)]
    Service(#[from] ServiceError),
}

impl Service {
    /// Creates a token; returns its id and its secret text (shown once).
    pub async fn create_token(
        &self,
        actor: &str,
        name: &str,
        grants: &[Grant],
        expires_at: Option<i64>,
    ) -> std::result::Result<(String, String), TokenChangeError> {
        let (id, secret) = tokens::create_expiring(&*self.store, name, grants, expires_at).await?;
        self.audit(
            actor,
            "token.create",
            &id,
            json!({"grants": grants, "expiresAt": expires_at}),
        )
        .await?;
        Ok((id, secret))
    }

    /// Revokes a token by id.
    pub async fn revoke_token(&self, actor: &str, id: &str) -> Result<()> {
        if !self.store.revoke_token(id).await? {
            return Err(ServiceError::not_found("token", id));
        }
        self.audit(actor, "token.revoke", id, json!({})).await
    }
}
