//! API tokens (only their secrets' hashes) and their grants.

use async_trait::async_trait;
use rusqlite::{OptionalExtension, params};

use super::{SqliteStore, parse_col};
use crate::model::{Grant, Role};
use crate::{NewTokenRow, Result, TokenRow, TokenStore};

#[async_trait]
impl TokenStore for SqliteStore {
    async fn consume_plan_token(&self, token: &str, now: i64) -> Result<bool> {
        self.transact(None, |tx| {
            Ok(tx.execute(
                "INSERT OR IGNORE INTO plan_tokens_used (token, used_at) VALUES (?1, ?2)",
                params![token, now],
            )? > 0)
        })
        .await
    }

    async fn create_token(&self, t: &NewTokenRow<'_>) -> Result<()> {
        self.transact(None, |tx| {
            tx.execute(
                "INSERT INTO tokens (id, name, secret_hash, created_at, expires_at) VALUES (?1, ?2, ?3, ?4, ?5)",
                params![t.id, t.name, t.secret_hash, t.created_at, t.expires_at],
            )?;
            for g in t.grants {
                tx.execute(
                    "INSERT INTO token_grants (token_id, namespace, role) VALUES (?1, ?2, ?3)",
                    params![t.id, g.namespace, g.role.as_str()],
                )?;
            }
            Ok(())
        })
        .await
    }

    async fn token_by_hash(&self, secret_hash: &str) -> Result<Option<TokenRow>> {
        self.read(|c| {
            let row: Option<(String, Option<i64>)> = c
                .query_row(
                    "SELECT id, expires_at FROM tokens WHERE secret_hash = ?1 AND revoked = 0",
                    [secret_hash],
                    |r| Ok((r.get(0)?, r.get(1)?)),
                )
                .optional()?;
            let Some((id, expires_at)) = row else {
                return Ok(None);
            };
            let mut st =
                c.prepare("SELECT namespace, role FROM token_grants WHERE token_id = ?1")?;
            let rows = st
                .query_map([&id], |r| {
                    Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?))
                })?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            let grants = rows
                .into_iter()
                .map(|(namespace, role)| {
                    Ok(Grant {
                        namespace,
                        role: parse_col(&role, "token role", Role::parse)?,
                    })
                })
                .collect::<Result<_>>()?;
            Ok(Some(TokenRow {
                id,
                grants,
                expires_at,
            }))
        })
        .await
    }

    async fn revoke_token(&self, id: &str) -> Result<bool> {
        self.transact(None, |tx| {
            Ok(tx.execute(
                "UPDATE tokens SET revoked = 1 WHERE id = ?1 AND revoked = 0",
                [id],
            )? > 0)
        })
        .await
    }

    async fn token_count(&self) -> Result<i64> {
        self.read(|c| Ok(c.query_row("SELECT COUNT(*) FROM tokens", [], |r| r.get(0))?))
            .await
    }
}
