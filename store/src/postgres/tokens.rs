//! API tokens (only their secrets' hashes) and their grants.

use async_trait::async_trait;

use super::{Cached, PostgresStore};
use crate::model::{Grant, Role};
use crate::{NewTokenRow, Result, StoreError, TokenRow, TokenStore};

#[async_trait]
impl TokenStore for PostgresStore {
    async fn consume_plan_token(&self, token: &str, now: i64) -> Result<bool> {
        let c = self.client().await?;
        Ok(c.exec(
            "INSERT INTO plan_tokens_used (token, used_at) VALUES ($1, $2) ON CONFLICT (token) DO NOTHING",
            &[&token, &now],
        )
        .await?
            > 0)
    }

    async fn create_token(&self, t: &NewTokenRow<'_>) -> Result<()> {
        let mut c = self.client().await?;
        let tx = c.transaction().await?;
        tx.exec(
            "INSERT INTO tokens (id, name, secret_hash, created_at, expires_at) VALUES ($1, $2, $3, $4, $5)",
            &[&t.id, &t.name, &t.secret_hash, &t.created_at, &t.expires_at],
        )
        .await?;
        for g in t.grants {
            tx.exec(
                "INSERT INTO token_grants (token_id, namespace, role) VALUES ($1, $2, $3)",
                &[&t.id, &g.namespace, &g.role.as_str()],
            )
            .await?;
        }
        tx.commit().await?;
        Ok(())
    }

    async fn token_by_hash(&self, secret_hash: &str) -> Result<Option<TokenRow>> {
        let c = self.client().await?;
        let Some(row) = c
            .opt(
                "SELECT id, expires_at FROM tokens WHERE secret_hash = $1 AND NOT revoked",
                &[&secret_hash],
            )
            .await?
        else {
            return Ok(None);
        };
        let id: String = row.try_get(0)?;
        let grants = c
            .rows(
                "SELECT namespace, role FROM token_grants WHERE token_id = $1",
                &[&id],
            )
            .await?
            .iter()
            .map(|r| {
                let role: String = r.try_get(1)?;
                Ok(Grant {
                    namespace: r.try_get(0)?,
                    role: Role::parse(&role)
                        .ok_or_else(|| StoreError::Corrupt(format!("token role {role:?}")))?,
                })
            })
            .collect::<Result<_>>()?;
        Ok(Some(TokenRow {
            id,
            grants,
            expires_at: row.try_get(1)?,
        }))
    }

    async fn revoke_token(&self, id: &str) -> Result<bool> {
        let c = self.client().await?;
        Ok(c.exec(
            "UPDATE tokens SET revoked = TRUE WHERE id = $1 AND NOT revoked",
            &[&id],
        )
        .await?
            > 0)
    }

    async fn token_count(&self) -> Result<i64> {
        let c = self.client().await?;
        Ok(c.one("SELECT COUNT(*) FROM tokens", &[])
            .await?
            .try_get(0)?)
    }
}
