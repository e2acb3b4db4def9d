//! The drift sweep's findings: one row per Agent (or stray thing) per host or cluster.

use async_trait::async_trait;

use super::{Cached, PostgresStore};
use crate::model::{DriftReason, DriftRow, DriftState};
use crate::{DriftStore, Result, StoreError};

#[async_trait]
impl DriftStore for PostgresStore {
    async fn replace_drift(&self, target: &str, rows: &[DriftRow]) -> Result<()> {
        let mut c = self.client().await?;
        let tx = c.transaction().await?;
        tx.exec("DELETE FROM drift WHERE target = $1", &[&target])
            .await?;
        for r in rows {
            tx.exec(
                "INSERT INTO drift (target, namespace_id, agent_id, state, reason, message, checked_at) VALUES ($1, $2, $3, $4, $5, $6, $7)
                 ON CONFLICT (target, namespace_id, agent_id) DO UPDATE SET state = EXCLUDED.state, reason = EXCLUDED.reason,
                   message = EXCLUDED.message, checked_at = EXCLUDED.checked_at",
                &[
                    &target,
                    &r.namespace_id,
                    &r.agent_id,
                    &r.state.as_str(),
                    &r.reason.map(DriftReason::as_str),
                    &r.message,
                    &r.checked_at,
                ],
            )
            .await?;
        }
        tx.commit().await?;
        Ok(())
    }

    async fn retain_drift_targets(&self, targets: &[String]) -> Result<()> {
        let c = self.client().await?;
        c.exec(
            "DELETE FROM drift WHERE NOT (target = ANY($1))",
            &[&targets],
        )
        .await?;
        Ok(())
    }

    async fn drift(&self) -> Result<Vec<DriftRow>> {
        let c = self.client().await?;
        c.rows(
            "SELECT target, namespace_id, agent_id, state, reason, message, checked_at FROM drift ORDER BY target, namespace_id, agent_id",
            &[],
        )
        .await?
        .iter()
        .map(|r| {
            let state: String = r.try_get(3)?;
            let reason: Option<String> = r.try_get(4)?;
            Ok(DriftRow {
                target: r.try_get(0)?,
                namespace_id: r.try_get(1)?,
                agent_id: r.try_get(2)?,
                state: DriftState::parse(&state)
                    .ok_or_else(|| StoreError::Corrupt(format!("drift state {state:?}")))?,
                reason: reason
                    .map(|r| {
                        DriftReason::parse(&r)
                            .ok_or_else(|| StoreError::Corrupt(format!("drift reason {r:?}")))
                    })
                    .transpose()?,
                message: r.try_get(5)?,
                checked_at: r.try_get(6)?,
            })
        })
        .collect()
    }
}
