//! The work queue on a shared database. A claim takes candidates with `FOR UPDATE SKIP
//! LOCKED` (coordinators never wait on each other's rows), then serialises the candidate's
//! lane (its Namespace) with a transaction-scoped advisory lock and checks the lane again
//! before taking it: two coordinators claiming at once can never both start an item of one
//! Agent, or anything beside a Namespace-level item. Times are the database's milliseconds.

use std::time::Duration;

use async_trait::async_trait;
use tokio_postgres::Row;

use super::{NOW_MS, PostgresStore, Tx, check_claim, narrow, notify};
use crate::store::sqlite::barrier_list;
use crate::store::{
    Claim, Enqueue, Result, StoreError, Work, WorkAttempt, WorkEnd, WorkKind, WorkQueue,
    WorkRecord, WorkState,
};

/// Candidates looked at per claim; more than one, so a busy lane at the head of the queue
/// does not hide runnable work behind it.
const CANDIDATES: i64 = 16;

/// Queues one item inside `tx` and announces it; its id.
pub(super) async fn enqueue(tx: &Tx<'_>, w: &Enqueue) -> Result<i64> {
    let id: i64 = tx
        .query_one(
            &format!(
                "INSERT INTO work (kind, namespace_id, agent_id, revision_id, state, not_before, created_at, updated_at)
                 VALUES ($1, $2, $3, $4, 'queued', {NOW_MS}, {NOW_MS}, {NOW_MS}) RETURNING id"
            ),
            &[&w.kind.as_str(), &w.namespace_id, &w.agent_id, &w.revision_id],
        )
        .await?
        .try_get(0)?;
    notify(tx).await?;
    Ok(id)
}

const WORK_RECORD_COLS: &str =
    "id, kind, revision_id, state, attempts, last_code, last_message, updated_at, created_at";

fn work_record(r: &Row) -> Result<WorkRecord> {
    let kind: String = r.try_get(1)?;
    let state: String = r.try_get(3)?;
    let code: Option<String> = r.try_get(5)?;
    let updated_ms: i64 = r.try_get(7)?;
    Ok(WorkRecord {
        id: r.try_get(0)?,
        kind: WorkKind::parse(&kind)
            .ok_or_else(|| StoreError::Corrupt(format!("work kind {kind:?}")))?,
        revision_id: r.try_get(2)?,
        state: WorkState::parse(&state)
            .ok_or_else(|| StoreError::Corrupt(format!("work state {state:?}")))?,
        attempts: narrow(r.try_get(4)?, "attempts")?,
        last_attempt: match code {
            Some(code) => Some(WorkAttempt {
                code,
                message: r.try_get::<_, Option<String>>(6)?.unwrap_or_default(),
                at: updated_ms / 1000,
            }),
            None => None,
        },
        created_at: r.try_get::<_, i64>(8)? / 1000,
    })
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// The lane conditions of a candidate `w` at time `$1`: no other item of its lane runs under
/// a live lease, and no earlier barrier of its lane is still open.
fn lane_free() -> String {
    format!(
        "NOT EXISTS (
           SELECT 1 FROM work o WHERE o.id != w.id AND o.state = 'running' AND o.lease_until >= $1
             AND o.namespace_id = w.namespace_id
             AND (o.agent_id IS NOT DISTINCT FROM w.agent_id OR o.agent_id IS NULL OR w.agent_id IS NULL))
         AND NOT EXISTS (
           SELECT 1 FROM work e WHERE e.id < w.id AND e.state IN ('queued', 'running')
             AND e.namespace_id = w.namespace_id
             AND (e.agent_id IS NOT DISTINCT FROM w.agent_id OR e.agent_id IS NULL OR w.agent_id IS NULL)
             AND e.kind IN {})",
        barrier_list()
    )
}

#[async_trait]
impl WorkQueue for PostgresStore {
    async fn enqueue(&self, work: &Enqueue) -> Result<i64> {
        let mut c = self.client().await?;
        let tx = c.transaction().await?;
        let id = enqueue(&tx, work).await?;
        tx.commit().await?;
        self.wake_local();
        Ok(id)
    }

    async fn claim_work(&self, owner: &str, lease: Duration) -> Result<Option<Work>> {
        let mut c = self.client().await?;
        let tx = c.transaction().await?;
        let now: i64 = tx
            .query_one(&format!("SELECT {NOW_MS}"), &[])
            .await?
            .try_get(0)?;
        let candidates = tx
            .query(
                &format!(
                    "SELECT w.id, w.kind, w.namespace_id, w.agent_id, w.revision_id, w.attempts, w.created_at, w.claim_token
                     FROM work w
                     WHERE ((w.state = 'queued' AND w.not_before <= $1) OR (w.state = 'running' AND w.lease_until < $1))
                       AND {}
                     ORDER BY w.not_before, w.id LIMIT $2
                     FOR UPDATE OF w SKIP LOCKED",
                    lane_free()
                ),
                &[&now, &CANDIDATES],
            )
            .await?;
        for r in &candidates {
            let id: i64 = r.try_get(0)?;
            let namespace_id: String = r.try_get(2)?;
            // One claimer per Namespace at a time: it sees every claim committed before it.
            let locked: bool = tx
                .query_one(
                    "SELECT pg_try_advisory_xact_lock(hashtextextended($1, 0))",
                    &[&namespace_id],
                )
                .await?
                .try_get(0)?;
            if !locked {
                continue;
            }
            let still_free = tx
                .query_opt(
                    &format!("SELECT 1 FROM work w WHERE w.id = $2 AND {}", lane_free()),
                    &[&now, &id],
                )
                .await?
                .is_some();
            if !still_free {
                continue;
            }
            let kind: String = r.try_get(1)?;
            let kind = WorkKind::parse(&kind)
                .ok_or_else(|| StoreError::Corrupt(format!("work kind {kind:?}")))?;
            let agent_id: Option<String> = r.try_get(3)?;
            let token: i64 = r.try_get::<_, i64>(7)? + 1;
            tx.execute(
                "UPDATE work SET state = 'running', lease_owner = $2, lease_until = $3, claim_token = $4, updated_at = $5 WHERE id = $1",
                &[&id, &owner, &now.saturating_add(millis(lease)), &token, &now],
            )
            .await?;
            let fence = match &agent_id {
                Some(agent) => tx
                    .query_opt(
                        "UPDATE agents SET fence = nextval('agent_fence') WHERE namespace_id = $1 AND id = $2 RETURNING fence",
                        &[&namespace_id, agent],
                    )
                    .await?
                    .map(|f| f.try_get::<_, i64>(0))
                    .transpose()?
                    .map(|f| f.max(0) as u64),
                None => None,
            };
            let work = Work {
                id,
                kind,
                namespace_id,
                agent_id,
                revision_id: r.try_get(4)?,
                attempts: narrow(r.try_get(5)?, "attempts")?,
                created_at: r.try_get(6)?,
                claim: Claim { work: id, token },
                fence,
            };
            tx.commit().await?;
            return Ok(Some(work));
        }
        Ok(None)
    }

    async fn renew_lease(&self, claim: &Claim, lease: Duration) -> Result<bool> {
        let c = self.client().await?;
        Ok(c.execute(
            &format!(
                "UPDATE work SET lease_until = {NOW_MS} + $3 WHERE id = $1 AND claim_token = $2 AND state = 'running'"
            ),
            &[&claim.work, &claim.token, &millis(lease)],
        )
        .await?
            > 0)
    }

    async fn end_work(&self, claim: &Claim, end: WorkEnd<'_>) -> Result<bool> {
        let mut c = self.client().await?;
        let tx = c.transaction().await?;
        match check_claim(&tx, claim).await {
            Ok(()) => {}
            Err(StoreError::ClaimLost { .. }) => return Ok(false),
            Err(e) => return Err(e),
        }
        match end {
            WorkEnd::Finished {
                state,
                code,
                message,
            } => {
                tx.execute(
                    &format!(
                        "UPDATE work SET state = $2, last_code = $3, last_message = $4, lease_owner = NULL, lease_until = NULL,
                             updated_at = {NOW_MS}, attempts = attempts + $5
                         WHERE id = $1"
                    ),
                    &[
                        &claim.work,
                        &state.as_str(),
                        &code,
                        &message,
                        &i64::from(state == WorkState::Failed),
                    ],
                )
                .await?
            }
            WorkEnd::Requeued {
                delay,
                count_attempt,
                code,
                message,
            } => {
                tx.execute(
                    &format!(
                        "UPDATE work SET state = 'queued', not_before = {NOW_MS} + $2, attempts = attempts + $3, last_code = $4,
                             last_message = $5, lease_owner = NULL, lease_until = NULL, updated_at = {NOW_MS}
                         WHERE id = $1"
                    ),
                    &[
                        &claim.work,
                        &millis(delay),
                        &i64::from(count_attempt),
                        &code,
                        &message,
                    ],
                )
                .await?
            }
        };
        // A finished item may free its lane for queued work, here or elsewhere.
        notify(&tx).await?;
        tx.commit().await?;
        self.wake_local();
        Ok(true)
    }

    async fn open_work(&self, ns: &str, agent: &str) -> Result<Vec<WorkRecord>> {
        let c = self.client().await?;
        c.query(
            &format!(
                "SELECT {WORK_RECORD_COLS} FROM work
                 WHERE namespace_id = $1 AND agent_id = $2 AND state IN ('queued', 'running') ORDER BY id"
            ),
            &[&ns, &agent],
        )
        .await?
        .iter()
        .map(work_record)
        .collect()
    }

    async fn recent_work(&self, ns: &str, agent: &str, limit: u32) -> Result<Vec<WorkRecord>> {
        let c = self.client().await?;
        c.query(
            &format!(
                "SELECT {WORK_RECORD_COLS} FROM work
                 WHERE namespace_id = $1 AND agent_id = $2 ORDER BY id DESC LIMIT $3"
            ),
            &[&ns, &agent, &i64::from(limit)],
        )
        .await?
        .iter()
        .map(work_record)
        .collect()
    }

    async fn work_item(&self, ns: &str, agent: &str, id: i64) -> Result<Option<WorkRecord>> {
        let c = self.client().await?;
        c.query_opt(
            &format!(
                "SELECT {WORK_RECORD_COLS} FROM work WHERE namespace_id = $1 AND agent_id = $2 AND id = $3"
            ),
            &[&ns, &agent, &id],
        )
        .await?
        .as_ref()
        .map(work_record)
        .transpose()
    }

    async fn pending_work_age(&self) -> Result<(i64, Option<i64>)> {
        let c = self.client().await?;
        let r = c
            .query_one(
                "SELECT COUNT(*), MIN(created_at) FROM work WHERE state IN ('queued', 'running')",
                &[],
            )
            .await?;
        Ok((r.try_get(0)?, r.try_get(1)?))
    }

    async fn work_counts(&self) -> Result<Vec<(String, String, i64)>> {
        let c = self.client().await?;
        c.query(
            "SELECT kind, state, COUNT(*) FROM work GROUP BY kind, state",
            &[],
        )
        .await?
        .iter()
        .map(|r| Ok((r.try_get(0)?, r.try_get(1)?, r.try_get(2)?)))
        .collect()
    }

    async fn work_changed(&self) {
        self.wake.notified().await;
    }

    fn wake_worker(&self) {
        self.wake_local();
    }
}
