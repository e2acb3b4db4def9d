//! The audit trail.

use async_trait::async_trait;
use rusqlite::{Connection, params};
use serde_json::Value;

use super::{SqliteStore, json_col};
use crate::model::AuditEvent;
use crate::{AuditLog, Claim, Result};

pub(super) fn insert(
    tx: &Connection,
    (actor, action, target): (&str, &str, &str),
    detail: &Value,
    now: i64,
) -> Result<()> {
    tx.execute(
        "INSERT INTO audit (at, actor, action, target, detail) VALUES (?1, ?2, ?3, ?4, ?5)",
        params![now, actor, action, target, detail.to_string()],
    )?;
    Ok(())
}

#[async_trait]
impl AuditLog for SqliteStore {
    async fn audit(
        &self,
        actor: &str,
        action: &str,
        target: &str,
        detail: &Value,
        now: i64,
    ) -> Result<()> {
        self.transact(None, |tx| insert(tx, (actor, action, target), detail, now))
            .await
    }

    async fn audit_work(
        &self,
        claim: &Claim,
        actor: &str,
        action: &str,
        target: &str,
        detail: &Value,
        now: i64,
    ) -> Result<()> {
        self.transact(Some(claim), |tx| {
            insert(tx, (actor, action, target), detail, now)
        })
        .await
    }

    async fn audit_events_of(&self, limit: u32, action: Option<&str>) -> Result<Vec<AuditEvent>> {
        self.read(|c| {
            let mut st = c.prepare(
                "SELECT id, at, actor, action, target, detail FROM audit WHERE ?2 IS NULL OR action = ?2 ORDER BY id DESC LIMIT ?1",
            )?;
            let rows = st
                .query_map(params![limit, action], |r| {
                    Ok((
                        r.get(0)?,
                        r.get(1)?,
                        r.get(2)?,
                        r.get(3)?,
                        r.get(4)?,
                        r.get::<_, String>(5)?,
                    ))
                })?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            rows.into_iter()
                .map(|(id, at, actor, action, target, detail)| {
                    Ok(AuditEvent {
                        id,
                        at,
                        actor,
                        action,
                        target,
                        detail: json_col(detail)?,
                    })
                })
                .collect()
        })
        .await
    }
}
