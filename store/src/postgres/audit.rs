//! The audit trail.

use async_trait::async_trait;
use serde_json::Value;

use super::{Cached, PostgresStore, Tx, check_claim};
use crate::model::AuditEvent;
use crate::{AuditLog, Claim, Result, StoreError};

pub(super) async fn insert(
    tx: &Tx<'_>,
    (actor, action, target): (&str, &str, &str),
    detail: &Value,
    now: i64,
) -> Result<()> {
    static SQL: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| insert_sql(1));
    tx.exec(&SQL, &[&now, &actor, &action, &target, &detail.to_string()])
        .await?;
    Ok(())
}

/// The statement of [`insert`], its five parameters numbered from `first`, so a larger
/// statement can carry it as a clause.
pub(super) fn insert_sql(first: usize) -> String {
    let p = |i: usize| first + i;
    format!(
        "INSERT INTO audit (at, actor, action, target, detail) VALUES (${}, ${}, ${}, ${}, ${})",
        p(0),
        p(1),
        p(2),
        p(3),
        p(4)
    )
}

#[async_trait]
impl AuditLog for PostgresStore {
    async fn audit(
        &self,
        actor: &str,
        action: &str,
        target: &str,
        detail: &Value,
        now: i64,
    ) -> Result<()> {
        let mut c = self.client().await?;
        let tx = c.transaction().await?;
        insert(&tx, (actor, action, target), detail, now).await?;
        tx.commit().await?;
        Ok(())
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
        let mut c = self.client().await?;
        let tx = c.transaction().await?;
        check_claim(&tx, claim).await?;
        insert(&tx, (actor, action, target), detail, now).await?;
        tx.commit().await?;
        Ok(())
    }

    async fn audit_events_of(&self, limit: u32, action: Option<&str>) -> Result<Vec<AuditEvent>> {
        let c = self.client().await?;
        c.rows(
            "SELECT id, at, actor, action, target, detail FROM audit
             WHERE $2::text IS NULL OR action = $2 ORDER BY id DESC LIMIT $1",
            &[&i64::from(limit), &action],
        )
        .await?
        .iter()
        .map(|r| {
            let detail: String = r.try_get(5)?;
            Ok(AuditEvent {
                id: r.try_get(0)?,
                at: r.try_get(1)?,
                actor: r.try_get(2)?,
                action: r.try_get(3)?,
                target: r.try_get(4)?,
                detail: serde_json::from_str(&detail)
                    .map_err(|e| StoreError::Corrupt(e.to_string()))?,
            })
        })
        .collect()
    }
}
