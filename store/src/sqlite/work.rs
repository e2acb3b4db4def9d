//! The work queue: enqueue, claim (a fresh token, the Agent's fence bumped), renew, end; and
//! what deployment status and /metrics read of it. Times are milliseconds of this process's
//! clock (one coordinator per SQLite database).

use std::time::Duration;

use async_trait::async_trait;
use rusqlite::{Connection, OptionalExtension, Row, params};

use super::{SqliteStore, check_claim, corrupt};
use crate::clock::now_ms;
use crate::model::RevisionStatus;
use crate::{
    Claim, Enqueue, LastAttempt, Result, StoreError, Work, WorkEnd, WorkKind, WorkQueue,
    WorkRecord, WorkState,
};
use clawfleet_api::codes::Code;

/// Queues one item inside `tx`; its id.
pub(super) fn enqueue(tx: &Connection, w: &Enqueue) -> Result<i64> {
    let now = now_ms();
    tx.execute(
        "INSERT INTO work (kind, namespace_id, agent_id, revision_id, state, not_before, created_at, updated_at)
         VALUES (?1, ?2, ?3, ?4, 'queued', ?5, ?5, ?5)",
        params![w.kind.as_str(), w.namespace_id, w.agent_id, w.revision_id, now],
    )?;
    Ok(tx.last_insert_rowid())
}

/// At the commit of `candidate`: queued deploy work of the Agent's older revisions (a retry
/// waiting out its delay, or a deploy never claimed) ends as `REVISION_SUPERSEDED` at once,
/// as the worker would end them when it claimed them (the revision's newest attempt, and
/// `superseded` for one not yet committed); deployment status converges without waiting for
/// their retry time. Settling is no attempt: neither the item's count nor its revision's moves.
pub(super) fn settle_superseded(
    tx: &Connection,
    ns: &str,
    agent: &str,
    candidate: &str,
) -> Result<()> {
    let older = "SELECT id FROM revisions WHERE namespace_id = ?1 AND agent_id = ?2
         AND number < (SELECT number FROM revisions WHERE namespace_id = ?1 AND agent_id = ?2 AND id = ?3)";
    let queued = format!(
        "SELECT revision_id FROM work WHERE namespace_id = ?1 AND agent_id = ?2 AND kind = '{}' AND state = 'queued'",
        WorkKind::Deploy.as_str()
    );
    let now = now_ms();
    let message = format!("a newer revision, {candidate}, was committed");
    tx.execute(
        &format!(
            "UPDATE revisions SET status = CASE WHEN status IN (?5, ?6) THEN ?4 ELSE status END,
                 last_code = ?7, last_message = ?8, last_at = ?9
             WHERE namespace_id = ?1 AND agent_id = ?2 AND id IN ({older}) AND id IN ({queued})"
        ),
        params![
            ns,
            agent,
            candidate,
            RevisionStatus::Superseded.as_str(),
            RevisionStatus::Pending.as_str(),
            RevisionStatus::Prepared.as_str(),
            Code::RevisionSuperseded.as_str(),
            message,
            now / 1000
        ],
    )?;
    tx.execute(
        &format!(
            "UPDATE work SET state = ?4, last_code = ?5, last_message = ?6, updated_at = ?7
             WHERE namespace_id = ?1 AND agent_id = ?2 AND kind = '{}' AND state = 'queued' AND revision_id IN ({older})",
            WorkKind::Deploy.as_str()
        ),
        params![
            ns,
            agent,
            candidate,
            WorkState::Done.as_str(),
            Code::RevisionSuperseded.as_str(),
            message,
            now
        ],
    )?;
    Ok(())
}

const CLAIM_COLS: &str = "w.id, w.kind, w.namespace_id, w.agent_id, w.revision_id, w.attempts, w.created_at, w.claim_token";

/// The lane conditions of a candidate `w` at time `?1`: no other item of its lane runs under a
/// live lease, and no earlier barrier of its lane is still open.
fn lane_free(barriers: &str) -> String {
    format!(
        "NOT EXISTS (
           SELECT 1 FROM work o WHERE o.id != w.id AND o.state = 'running' AND o.lease_until >= ?1
             AND o.namespace_id = w.namespace_id
             AND (o.agent_id IS w.agent_id OR o.agent_id IS NULL OR w.agent_id IS NULL))
         AND NOT EXISTS (
           SELECT 1 FROM work e WHERE e.id < w.id AND e.state IN ('queued', 'running')
             AND e.namespace_id = w.namespace_id
             AND (e.agent_id IS w.agent_id OR e.agent_id IS NULL OR w.agent_id IS NULL)
             AND e.kind IN {barriers})"
    )
}

const WORK_RECORD_COLS: &str =
    "id, kind, revision_id, state, attempts, last_code, last_message, updated_at, created_at";

fn work_record(r: &Row<'_>) -> rusqlite::Result<WorkRecord> {
    let kind: String = r.get(1)?;
    let state: String = r.get(3)?;
    let code: Option<String> = r.get(5)?;
    let updated_ms: i64 = r.get(7)?;
    let attempts = r.get(4)?;
    Ok(WorkRecord {
        id: r.get(0)?,
        kind: WorkKind::parse(&kind).ok_or_else(|| corrupt(1, format!("work kind {kind:?}")))?,
        revision_id: r.get(2)?,
        state: WorkState::parse(&state)
            .ok_or_else(|| corrupt(3, format!("work state {state:?}")))?,
        attempts,
        last_attempt: match code {
            Some(code) => Some(LastAttempt {
                code,
                message: r.get::<_, Option<String>>(6)?.unwrap_or_default(),
                at: updated_ms / 1000,
                attempts,
            }),
            None => None,
        },
        created_at: r.get::<_, i64>(8)? / 1000,
    })
}

/// A claimable row: id, kind, namespace, agent, revision, attempts, created, token.
type WorkRow = (
    i64,
    String,
    String,
    Option<String>,
    Option<String>,
    u32,
    i64,
    i64,
);

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

// Lapsed claims first (their work was started), then due queued work in queue order. Each
// walks its own index in order and stops at the first free lane, so a claim does not sort or
// scan the whole queue (one query with both conditions OR-ed did both: 14 ms of CPU per claim
// with 6,000 items queued). Built once: a batch claim asks them for every item it takes.
static LAPSED: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    format!(
        "SELECT {CLAIM_COLS} FROM work w INDEXED BY work_lapsed
         WHERE w.state = 'running' AND w.lease_until < ?1 AND {}
         ORDER BY w.lease_until, w.id LIMIT 1",
        lane_free(&crate::barrier_list())
    )
});
static QUEUED: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    format!(
        "SELECT {CLAIM_COLS} FROM work w INDEXED BY work_open
         WHERE w.state = 'queued' AND w.not_before <= ?1 AND {}
         ORDER BY w.not_before, w.id LIMIT 1",
        lane_free(&crate::barrier_list())
    )
});

/// Claims the next runnable item inside `tx` (lapsed claims first, then due queued work in
/// queue order); later claims in the same transaction see this one's lane as busy.
fn claim_one(tx: &Connection, owner: &str, lease: Duration, now: i64) -> Result<Option<Work>> {
    let lapsed: Option<WorkRow> = tx.query_row(&LAPSED, [now], |r| r.try_into()).optional()?;
    let row = match lapsed {
        Some(row) => Some(row),
        None => tx.query_row(&QUEUED, [now], |r| r.try_into()).optional()?,
    };
    let Some((id, kind, namespace_id, agent_id, revision_id, attempts, created_at, token)) = row
    else {
        return Ok(None);
    };
    let kind =
        WorkKind::parse(&kind).ok_or_else(|| StoreError::Corrupt(format!("work kind {kind:?}")))?;
    let token = token + 1;
    tx.execute(
        "UPDATE work SET state = 'running', lease_owner = ?2, lease_until = ?3, claim_token = ?4, updated_at = ?5 WHERE id = ?1",
        params![id, owner, now.saturating_add(millis(lease)), token, now],
    )?;
    let fence = match &agent_id {
        Some(agent) => {
            let next: i64 = tx.query_row(
                "UPDATE fence_counter SET value = value + 1 WHERE id = 1 RETURNING value",
                [],
                |r| r.get(0),
            )?;
            tx.query_row(
                "UPDATE agents SET fence = ?3 WHERE namespace_id = ?1 AND id = ?2 RETURNING fence",
                params![namespace_id, agent, next],
                |r| r.get::<_, i64>(0),
            )
            .optional()?
            .map(|f| f.max(0) as u64)
        }
        None => None,
    };
    Ok(Some(Work {
        id,
        kind,
        namespace_id,
        agent_id,
        revision_id,
        attempts,
        created_at,
        claim: Claim { work: id, token },
        fence,
    }))
}

#[async_trait]
impl WorkQueue for SqliteStore {
    async fn enqueue(&self, work: &Enqueue) -> Result<i64> {
        let id = self.transact(None, |tx| enqueue(tx, work)).await?;
        self.wake.notify_one();
        Ok(id)
    }

    async fn claim_batch(&self, owner: &str, lease: Duration, max: usize) -> Result<Vec<Work>> {
        let now = now_ms();
        self.transact(None, |tx| {
            let mut claimed = Vec::new();
            while claimed.len() < max {
                match claim_one(tx, owner, lease, now)? {
                    Some(work) => claimed.push(work),
                    None => break,
                }
            }
            Ok(claimed)
        })
        .await
    }

    async fn renew_lease(&self, claim: &Claim, lease: Duration) -> Result<bool> {
        let until = now_ms().saturating_add(millis(lease));
        self.transact(None, |tx| {
            Ok(tx.execute(
                "UPDATE work SET lease_until = ?3 WHERE id = ?1 AND claim_token = ?2 AND state = 'running'",
                params![claim.work, claim.token, until],
            )? > 0)
        })
        .await
    }

    async fn end_work(&self, claim: &Claim, end: WorkEnd<'_>) -> Result<bool> {
        let now = now_ms();
        let end = end.row();
        let ended = self
            .transact(None, |tx| {
                match check_claim(tx, claim) {
                    Ok(()) => {}
                    Err(StoreError::ClaimLost { .. }) => return Ok(false),
                    Err(e) => return Err(e),
                }
                // The revision's newest attempt (a failure also its status), then the item. The
                // revision counts what its item counts, so the two attempt counts never differ.
                tx.execute(
                    "UPDATE revisions SET last_code = ?2, last_message = ?3, last_at = ?4, attempts = attempts + ?7,
                         status = CASE WHEN ?5 THEN ?6 ELSE status END
                     WHERE (namespace_id, agent_id, id) IN
                           (SELECT namespace_id, agent_id, revision_id FROM work WHERE id = ?1 AND revision_id IS NOT NULL)",
                    params![claim.work, end.code, end.message, now / 1000, end.state == WorkState::Failed, RevisionStatus::Failed.as_str(), i64::from(end.counts_attempt)],
                )?;
                tx.execute(
                    "UPDATE work SET state = ?2, last_code = ?3, last_message = ?4, lease_owner = NULL, lease_until = NULL,
                         not_before = CASE WHEN ?2 = 'queued' THEN ?5 ELSE not_before END,
                         attempts = attempts + ?6, updated_at = ?7
                     WHERE id = ?1",
                    params![claim.work, end.state.as_str(), end.code, end.message, now.saturating_add(millis(end.delay)), i64::from(end.counts_attempt), now],
                )?;
                Ok(true)
            })
            .await?;
        // A finished item may free its lane for queued work.
        self.wake.notify_one();
        Ok(ended)
    }

    async fn note_work(&self, claim: &Claim, code: &str, message: &str) -> Result<bool> {
        let now = now_ms();
        self.transact(None, |tx| {
            match check_claim(tx, claim) {
                Ok(()) => {}
                Err(StoreError::ClaimLost { .. }) => return Ok(false),
                Err(e) => return Err(e),
            }
            tx.execute(
                "UPDATE revisions SET last_code = ?2, last_message = ?3, last_at = ?4
                 WHERE (namespace_id, agent_id, id) IN
                       (SELECT namespace_id, agent_id, revision_id FROM work WHERE id = ?1 AND revision_id IS NOT NULL)",
                params![claim.work, code, message, now / 1000],
            )?;
            tx.execute(
                "UPDATE work SET last_code = ?2, last_message = ?3, updated_at = ?4 WHERE id = ?1",
                params![claim.work, code, message, now],
            )?;
            Ok(true)
        })
        .await
    }

    async fn open_work(&self, ns: &str, agent: &str) -> Result<Vec<WorkRecord>> {
        self.read(|c| {
            let mut st = c.prepare(&format!(
                "SELECT {WORK_RECORD_COLS} FROM work
                 WHERE namespace_id = ?1 AND agent_id = ?2 AND state IN ('queued', 'running') ORDER BY id"
            ))?;
            let rows = st.query_map(params![ns, agent], work_record)?;
            Ok(rows.collect::<rusqlite::Result<_>>()?)
        })
        .await
    }

    async fn recent_work(&self, ns: &str, agent: &str, limit: u32) -> Result<Vec<WorkRecord>> {
        self.read(|c| {
            let mut st = c.prepare(&format!(
                "SELECT {WORK_RECORD_COLS} FROM work
                 WHERE namespace_id = ?1 AND agent_id = ?2 ORDER BY id DESC LIMIT ?3"
            ))?;
            let rows = st.query_map(params![ns, agent, limit], work_record)?;
            Ok(rows.collect::<rusqlite::Result<_>>()?)
        })
        .await
    }

    async fn namespace_work(&self, ns: &str, limit: u32) -> Result<Vec<WorkRecord>> {
        self.read(|c| {
            let mut st = c.prepare(&format!(
                "SELECT {WORK_RECORD_COLS} FROM work
                 WHERE namespace_id = ?1 AND agent_id IS NULL ORDER BY id DESC LIMIT ?2"
            ))?;
            let rows = st.query_map(params![ns, limit], work_record)?;
            Ok(rows.collect::<rusqlite::Result<_>>()?)
        })
        .await
    }

    async fn work_item(&self, ns: &str, agent: &str, id: i64) -> Result<Option<WorkRecord>> {
        self.read(|c| {
            Ok(c.query_row(
                &format!(
                    "SELECT {WORK_RECORD_COLS} FROM work WHERE namespace_id = ?1 AND agent_id = ?2 AND id = ?3"
                ),
                params![ns, agent, id],
                work_record,
            )
            .optional()?)
        })
        .await
    }

    async fn pending_work_age(&self) -> Result<(i64, Option<i64>)> {
        self.read(|c| {
            Ok(c.query_row(
                "SELECT COUNT(*), MIN(created_at) FROM work WHERE state IN ('queued', 'running')",
                [],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )?)
        })
        .await
    }

    async fn work_counts(&self) -> Result<Vec<(String, String, i64)>> {
        self.read(|c| {
            let mut st =
                c.prepare("SELECT kind, state, COUNT(*) FROM work GROUP BY kind, state")?;
            let rows = st.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?;
            Ok(rows.collect::<rusqlite::Result<_>>()?)
        })
        .await
    }

    async fn work_changed(&self) {
        self.wake.notified().await;
    }

    fn wake_worker(&self) {
        self.wake.notify_one();
    }
}
