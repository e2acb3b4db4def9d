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
        // The token and its grants in one statement: every API request asks this first, so a
        // second round trip would be a second statement per request (a read route's half).
        // A row per grant; one row without a grant for a token that has none.
        let c = self.client().await?;
        let rows = c
            .rows(
                "SELECT t.id, t.expires_at, g.namespace, g.role FROM tokens t
                 LEFT JOIN token_grants g ON g.token_id = t.id
                 WHERE t.secret_hash = $1 AND NOT t.revoked",
                &[&secret_hash],
            )
            .await?;
        let Some(first) = rows.first() else {
            return Ok(None);
        };
        let mut grants = Vec::with_capacity(rows.len());
        for r in &rows {
            let (Some(namespace), Some(role)) = (
                r.try_get::<_, Option<String>>(2)?,
                r.try_get::<_, Option<String>>(3)?,
            ) else {
                continue;
            };
            grants.push(Grant {
                namespace,
                role: Role::parse(&role)
                    .ok_or_else(|| StoreError::Corrupt(format!("token role {role:?}")))?,
            });
        }
        Ok(Some(TokenRow {
            id: first.try_get(0)?,
            grants,
            expires_at: first.try_get(1)?,
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
