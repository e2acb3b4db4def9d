//! The drift sweep's findings: one row per Agent (or stray thing) per host or cluster.

use async_trait::async_trait;
use rusqlite::params;

use super::{SqliteStore, parse_col};
use crate::model::{DriftReason, DriftRow, DriftState};
use crate::{DriftStore, Result};

#[async_trait]
impl DriftStore for SqliteStore {
    async fn replace_drift(&self, target: &str, rows: &[DriftRow]) -> Result<()> {
        self.transact(None, |tx| {
            tx.execute("DELETE FROM drift WHERE target = ?1", params![target])?;
            for r in rows {
                tx.execute(
                    "INSERT OR REPLACE INTO drift (target, namespace_id, agent_id, state, reason, message, checked_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
                    params![target, r.namespace_id, r.agent_id, r.state.as_str(), r.reason.map(DriftReason::as_str), r.message, r.checked_at],
                )?;
            }
            Ok(())
        })
        .await
    }

    async fn retain_drift_targets(&self, targets: &[String]) -> Result<()> {
        self.transact(None, |tx| {
            let known: std::collections::BTreeSet<&str> =
                targets.iter().map(String::as_str).collect();
            let stale: Vec<String> = {
                let mut st = tx.prepare("SELECT DISTINCT target FROM drift")?;
                st.query_map([], |r| r.get::<_, String>(0))?
                    .collect::<rusqlite::Result<Vec<_>>>()?
                    .into_iter()
                    .filter(|t| !known.contains(t.as_str()))
                    .collect()
            };
            for t in stale {
                tx.execute("DELETE FROM drift WHERE target = ?1", params![t])?;
            }
            Ok(())
        })
        .await
    }

    async fn drift(&self) -> Result<Vec<DriftRow>> {
        self.read(|c| {
            let mut st = c.prepare(
                "SELECT target, namespace_id, agent_id, state, reason, message, checked_at FROM drift ORDER BY target, namespace_id, agent_id",
            )?;
            let rows = st
                .query_map([], |r| {
                    Ok((
                        r.get::<_, String>(0)?,
                        r.get::<_, String>(1)?,
                        r.get::<_, String>(2)?,
                        r.get::<_, String>(3)?,
                        r.get::<_, Option<String>>(4)?,
                        r.get::<_, String>(5)?,
                        r.get::<_, i64>(6)?,
                    ))
                })?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            rows.into_iter()
                .map(
                    |(target, namespace_id, agent_id, state, reason, message, checked_at)| {
                        Ok(DriftRow {
                            target,
                            namespace_id,
                            agent_id,
                            state: parse_col(&state, "drift state", DriftState::parse)?,
                            reason: reason
                                .map(|r| parse_col(&r, "drift reason", DriftReason::parse))
                                .transpose()?,
                            message,
                            checked_at,
                        })
                    },
                )
                .collect()
        })
        .await
    }
}
