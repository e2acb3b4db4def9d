//! The work queue on a shared database. A claim walks due work in queue order a page at a
//! time, serialises each candidate's lane (its Namespace) with a transaction-scoped advisory
//! lock, and checks and takes the candidate's row with `FOR UPDATE SKIP LOCKED`
//! (coordinators never wait on each other's rows): two coordinators claiming at once can
//! never both start an item of one Agent, or anything beside a Namespace-level item. The lane
//! checks run for one row at a time, along indexes, so a claim's cost does not grow with the
//! queue (one query over the whole queue was planned as a nested loop of queue × barriers:
//! 14 ms per claim with 3,000 items queued). Times are the database's milliseconds.

use std::collections::HashSet;
use std::sync::LazyLock;
use std::time::Duration;

use async_trait::async_trait;
use tokio_postgres::Row;

use super::{Cached, NOW_MS, PostgresStore, Tx, narrow, notify};
use crate::model::RevisionStatus;
use crate::{
    Claim, Enqueue, LastAttempt, Result, StoreError, Work, WorkEnd, WorkKind, WorkQueue,
    WorkRecord, WorkState,
};

/// Candidates read per page while looking for a claimable item. Pages follow the queue's
/// order along the `work_open` index, so a claim costs the same with 10 or 100,000 items
/// queued, and a busy lane at the head of the queue never hides runnable work behind it.
const PAGE: i64 = 32;

/// Lanes found busy during one claim: whole Namespaces (another claimer holds them) and
/// (Namespace, Agent) lanes (`None`: the Namespace's own lane).
#[derive(Default)]
struct Busy {
    namespaces: HashSet<String>,
    lanes: HashSet<(String, Option<String>)>,
}

impl Busy {
    fn holds(&self, namespace: &str, agent: &Option<String>) -> bool {
        self.namespaces.contains(namespace)
            || self.lanes.contains(&(namespace.to_owned(), agent.clone()))
    }
}

/// One claim of several items: who claims, for how long, what it took so far and how many
/// it may take, and the lanes it found busy.
struct Batch<'a> {
    owner: &'a str,
    lease: Duration,
    busy: Busy,
    claimed: Vec<Work>,
    max: usize,
}

/// Queues one item inside `tx` and announces it; its id.
pub(super) async fn enqueue(tx: &Tx<'_>, w: &Enqueue) -> Result<i64> {
    let (id, ()) = futures::try_join!(insert(tx, w), notify(tx))?;
    Ok(id)
}

/// The expression that allocates a work item's id, for [`NEXT_ID`] and statements that ask
/// for one among other answers.
macro_rules! next_id {
    () => {
        "nextval(pg_get_serial_sequence('work', 'id'))"
    };
}
pub(super) use next_id;

/// The id the next inserted item can take ([`insert_as_sql`]), asked for ahead so the insert
/// can go out together with statements that name it.
pub(super) const NEXT_ID: &str = concat!("SELECT ", next_id!());

/// A statement that inserts one item under an id from [`NEXT_ID`], without announcing it; its
/// parameters (id, kind, Namespace, Agent, revision) numbered `p`, for a larger statement to
/// carry as a clause.
pub(super) fn insert_as_sql(p: [usize; 5]) -> String {
    let [id, kind, ns, agent, revision] = p;
    format!(
        "INSERT INTO work (id, kind, namespace_id, agent_id, revision_id, state, not_before, created_at, updated_at)
         VALUES (${id}, ${kind}, ${ns}, ${agent}, ${revision}, 'queued', {NOW_MS}, {NOW_MS}, {NOW_MS})"
    )
}

/// Inserts one item inside `tx` without announcing it (the caller notifies); its id.
pub(super) async fn insert(tx: &Tx<'_>, w: &Enqueue) -> Result<i64> {
    Ok(tx
        .one(
            &format!(
                "INSERT INTO work (kind, namespace_id, agent_id, revision_id, state, not_before, created_at, updated_at)
                 VALUES ($1, $2, $3, $4, 'queued', {NOW_MS}, {NOW_MS}, {NOW_MS}) RETURNING id"
            ),
            &[&w.kind.as_str(), &w.namespace_id, &w.agent_id, &w.revision_id],
        )
        .await?
        .try_get(0)?)
}

const WORK_RECORD_COLS: &str =
    "id, kind, revision_id, state, attempts, last_code, last_message, updated_at, created_at";

fn work_record(r: &Row) -> Result<WorkRecord> {
    let kind: String = r.try_get(1)?;
    let state: String = r.try_get(3)?;
    let code: Option<String> = r.try_get(5)?;
    let updated_ms: i64 = r.try_get(7)?;
    let attempts = narrow(r.try_get(4)?, "attempts")?;
    Ok(WorkRecord {
        id: r.try_get(0)?,
        kind: WorkKind::parse(&kind)
            .ok_or_else(|| StoreError::Corrupt(format!("work kind {kind:?}")))?,
        revision_id: r.try_get(2)?,
        state: WorkState::parse(&state)
            .ok_or_else(|| StoreError::Corrupt(format!("work state {state:?}")))?,
        attempts,
        last_attempt: match code {
            Some(code) => Some(LastAttempt {
                code,
                message: r.try_get::<_, Option<String>>(6)?.unwrap_or_default(),
                at: updated_ms / 1000,
                attempts,
            }),
            None => None,
        },
        created_at: r.try_get::<_, i64>(8)? / 1000,
    })
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// The lane conditions of a candidate `w` at time `now`: no other item of its lane runs
/// under a live lease, and no earlier barrier of its lane is still open.
fn lane_free(now: &str) -> String {
    format!(
        "NOT EXISTS (
           SELECT 1 FROM work o WHERE o.id != w.id AND o.state = 'running' AND o.lease_until >= {now}
             AND o.namespace_id = w.namespace_id
             AND (o.agent_id IS NOT DISTINCT FROM w.agent_id OR o.agent_id IS NULL OR w.agent_id IS NULL))
         AND NOT EXISTS (
           SELECT 1 FROM work e WHERE e.id < w.id AND e.state IN ('queued', 'running')
             AND e.namespace_id = w.namespace_id
             AND (e.agent_id IS NOT DISTINCT FROM w.agent_id OR e.agent_id IS NULL OR w.agent_id IS NULL)
             AND e.kind IN {})",
        crate::barrier_list()
    )
}

/// The check and the take of one candidate (`$1`) as one statement: its row is checked
/// (still due, lane free) and locked with `SKIP LOCKED`, then runs under owner `$2`, a lease
/// of `$3` ms and the next token, and for Agent-scoped work the Agent's fence is bumped. Run
/// after the Namespace's advisory lock was taken, so its snapshot sees every claim committed
/// before that. The clock is read once; every row is found by its key (no joins for the
/// planner to get wrong). Data-modifying WITH clauses run once each, to completion.
static TAKE: LazyLock<String> = LazyLock::new(|| {
    let now = "(SELECT now FROM t)";
    format!(
        "WITH t AS MATERIALIZED (SELECT {NOW_MS} AS now),
         candidate AS MATERIALIZED (
           SELECT w.id, w.namespace_id, w.agent_id FROM work w
           WHERE w.id = $1
             AND ((w.state = 'queued' AND w.not_before <= {now}) OR (w.state = 'running' AND w.lease_until < {now}))
             AND {}
           FOR UPDATE SKIP LOCKED),
         taken AS (
           UPDATE work SET state = 'running', lease_owner = $2, lease_until = {now} + $3,
               claim_token = claim_token + 1, updated_at = {now}
           WHERE id = $1 AND EXISTS (SELECT 1 FROM candidate)
           RETURNING id, kind, namespace_id, agent_id, revision_id, attempts, created_at, claim_token),
         fenced AS (
           UPDATE agents SET fence = nextval('agent_fence')
           WHERE namespace_id = (SELECT namespace_id FROM candidate) AND id = (SELECT agent_id FROM candidate)
           RETURNING fence)
         SELECT taken.*, (SELECT fence FROM fenced) FROM taken",
        lane_free(now)
    )
});

impl PostgresStore {
    /// Claims from `candidates` (rows of id, namespace_id, agent_id, found in `state`)
    /// those whose lane is free, in order, into `claimed` until it holds `max`. Each is
    /// checked again under its Namespace's transaction-scoped advisory lock, which serialises
    /// claimers of one Namespace: the check sees every claim committed before it, and the row
    /// is taken with `SKIP LOCKED` so claimers never wait on rows.
    ///
    /// A group at a time: as many candidates of distinct lanes as slots are left get their
    /// locks in one statement, then their takes go out together (the server runs them in
    /// order, each seeing the ones before). A lane picked for a group is busy for the rest
    /// of the claim, whether its take succeeded (its item runs) or not (an item of that lane
    /// runs or an earlier barrier is open). One lock statement per group, not per candidate:
    /// claimers reading one queue head pass over each other's items without a round trip each.
    async fn take_from(
        tx: &Tx<'_>,
        candidates: &[Row],
        state: WorkState,
        batch: &mut Batch<'_>,
    ) -> Result<()> {
        let Batch {
            owner,
            lease,
            busy,
            claimed,
            max,
        } = batch;
        let (owner, max) = (*owner, *max);
        let mut rest = candidates.iter();
        loop {
            let want = max.saturating_sub(claimed.len());
            let mut group: Vec<(i64, String, Option<String>)> = Vec::new();
            for r in rest.by_ref() {
                let id: i64 = r.try_get(0)?;
                let namespace_id: String = r.try_get(1)?;
                let agent_id: Option<String> = r.try_get(2)?;
                if busy.holds(&namespace_id, &agent_id) {
                    continue;
                }
                match &agent_id {
                    Some(_) => {
                        busy.lanes.insert((namespace_id.clone(), None));
                        busy.lanes.insert((namespace_id.clone(), agent_id.clone()));
                    }
                    None => {
                        busy.namespaces.insert(namespace_id.clone());
                    }
                }
                group.push((id, namespace_id, agent_id));
                if group.len() >= want {
                    break;
                }
            }
            if group.is_empty() {
                return Ok(());
            }
            let ids: Vec<i64> = group.iter().map(|g| g.0).collect();
            let namespaces: Vec<&str> = group.iter().map(|g| g.1.as_str()).collect();
            // The lock only while the item is still as the page found it: one that another
            // claimer took meanwhile (the usual miss, many claimers reading one queue head)
            // is passed over without the take's lane checks. A Namespace locked elsewhere
            // is busy as a whole. A scalar subquery per candidate, along the primary key (an
            // EXISTS was planned as a hashed subplan over every queued row: 1.6 ms a group).
            let locks = tx
                .rows(
                    "SELECT c.id, CASE WHEN (SELECT state FROM work WHERE id = c.id) = $3
                       THEN pg_try_advisory_xact_lock(hashtextextended(c.ns, 0)) END
                     FROM unnest($1::bigint[], $2::text[]) WITH ORDINALITY AS c(id, ns, n)
                     ORDER BY c.n",
                    &[&ids, &namespaces, &state.as_str()],
                )
                .await?;
            let mut takes = Vec::new();
            for ((id, namespace_id, _), lock) in group.into_iter().zip(&locks) {
                match lock.try_get::<_, Option<bool>>(1)? {
                    Some(true) => takes.push(id),
                    Some(false) => {
                        busy.namespaces.insert(namespace_id);
                    }
                    None => {}
                }
            }
            let lease = millis(*lease);
            let params: Vec<[&(dyn tokio_postgres::types::ToSql + Sync); 3]> = takes
                .iter()
                .map(|id| {
                    [
                        id as &(dyn tokio_postgres::types::ToSql + Sync),
                        &owner,
                        &lease,
                    ]
                })
                .collect();
            let taken_rows =
                futures::future::try_join_all(params.iter().map(|p| tx.opt(&TAKE, p))).await?;
            for row in taken_rows.into_iter().flatten() {
                claimed.push(taken(&row)?);
            }
            if claimed.len() >= max {
                return Ok(());
            }
        }
    }
}

/// The item a take statement ([`TAKE`]) returned.
fn taken(r: &Row) -> Result<Work> {
    let id: i64 = r.try_get(0)?;
    let kind: String = r.try_get(1)?;
    let kind =
        WorkKind::parse(&kind).ok_or_else(|| StoreError::Corrupt(format!("work kind {kind:?}")))?;
    let fence: Option<i64> = r.try_get(8)?;
    Ok(Work {
        id,
        kind,
        namespace_id: r.try_get(2)?,
        agent_id: r.try_get(3)?,
        revision_id: r.try_get(4)?,
        attempts: narrow(r.try_get(5)?, "attempts")?,
        created_at: r.try_get(6)?,
        claim: Claim {
            work: id,
            token: r.try_get(7)?,
        },
        fence: fence.map(|f| f.max(0) as u64),
    })
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

    async fn claim_batch(&self, owner: &str, lease: Duration, max: usize) -> Result<Vec<Work>> {
        if max == 0 {
            return Ok(Vec::new());
        }
        let mut c = self.client().await?;
        let tx = c.transaction().await?;
        // Lanes seen busy in this claim: later items of a busy lane are busy too (the same
        // running item or earlier barrier holds them), so each lane is asked about once.
        let mut batch = Batch {
            owner,
            lease,
            busy: Busy::default(),
            claimed: Vec::new(),
            max,
        };
        // Lapsed claims first (their work was started and should finish before newer work),
        // then due queued work in queue order, a page at a time along `work_open`. The lapsed
        // page and the first queued page are asked for in one round trip; each statement
        // reads the database's clock once.
        let lapsed = format!(
            "SELECT id, namespace_id, agent_id FROM work
             WHERE state = 'running' AND lease_until < (SELECT {NOW_MS}) ORDER BY lease_until, id LIMIT $1"
        );
        let queued = format!(
            "SELECT id, namespace_id, agent_id, not_before FROM work
             WHERE state = 'queued' AND not_before <= (SELECT {NOW_MS}) AND (not_before, id) > ($1, $2)
             ORDER BY not_before, id LIMIT $3"
        );
        let mut after: (i64, i64) = (i64::MIN, i64::MIN);
        let first: [&(dyn tokio_postgres::types::ToSql + Sync); 3] = [&after.0, &after.1, &PAGE];
        let (lapsed, mut page) =
            futures::try_join!(tx.rows(&lapsed, &[&PAGE]), tx.rows(&queued, &first))?;
        Self::take_from(&tx, &lapsed, WorkState::Running, &mut batch).await?;
        loop {
            Self::take_from(&tx, &page, WorkState::Queued, &mut batch).await?;
            if batch.claimed.len() >= max {
                break;
            }
            match page.last() {
                Some(last) if page.len() as i64 == PAGE => {
                    after = (last.try_get(3)?, last.try_get(0)?);
                }
                _ => break,
            }
            page = tx.rows(&queued, &[&after.0, &after.1, &PAGE]).await?;
        }
        if !batch.claimed.is_empty() {
            tx.commit().await?;
        }
        Ok(batch.claimed)
    }

    async fn renew_lease(&self, claim: &Claim, lease: Duration) -> Result<bool> {
        let c = self.client().await?;
        Ok(c.exec(
            &format!(
                "UPDATE work SET lease_until = {NOW_MS} + $3 WHERE id = $1 AND claim_token = $2 AND state = 'running'"
            ),
            &[&claim.work, &claim.token, &millis(lease)],
        )
        .await?
            > 0)
    }

    async fn end_work(&self, claim: &Claim, end: WorkEnd<'_>) -> Result<bool> {
        let end = end.row();
        // One statement: the claim check (the item's row locked), the revision's attempt
        // (counted as the item counts it, so the two counts never differ), the item's end,
        // and the notification when queued work of the item's lane waited on it (here or in
        // another coordinator; nothing else waits on an end, and every listening coordinator
        // would wake for each). Data-modifying WITH clauses run once each, to completion.
        let c = self.client().await?;
        let row = c
            .one(
                &format!(
                    "WITH claim AS MATERIALIZED (
                       SELECT id, namespace_id, revision_id, agent_id FROM work
                       WHERE id = $1 AND claim_token = $7 AND state = 'running' FOR UPDATE),
                     attempt AS (
                       UPDATE revisions r SET last_code = $3, last_message = $4, last_at = {NOW_MS} / 1000,
                           attempts = r.attempts + $6, status = CASE WHEN $8 THEN $9 ELSE r.status END
                       FROM claim c
                       WHERE r.namespace_id = c.namespace_id AND r.agent_id = c.agent_id AND r.id = c.revision_id
                       RETURNING 1),
                     ended AS (
                       UPDATE work w SET state = $2, last_code = $3, last_message = $4, lease_owner = NULL,
                           lease_until = NULL,
                           not_before = CASE WHEN $2 = 'queued' THEN {NOW_MS} + $5 ELSE w.not_before END,
                           attempts = w.attempts + $6, updated_at = {NOW_MS}
                       FROM claim c WHERE w.id = c.id
                       RETURNING 1)
                     SELECT (SELECT count(*) FROM ended),
                       CASE WHEN EXISTS (
                         SELECT 1 FROM work q, claim c
                         WHERE q.namespace_id = c.namespace_id AND q.state = 'queued' AND q.id != c.id
                           AND (q.agent_id IS NOT DISTINCT FROM c.agent_id OR q.agent_id IS NULL OR c.agent_id IS NULL))
                       THEN pg_notify($10, '')::text END"
                ),
                &[
                    &claim.work,
                    &end.state.as_str(),
                    &end.code,
                    &end.message,
                    &millis(end.delay),
                    &i64::from(end.counts_attempt),
                    &claim.token,
                    &(end.state == WorkState::Failed),
                    &RevisionStatus::Failed.as_str(),
                    &super::CHANNEL,
                ],
            )
            .await?;
        if row.try_get::<_, i64>(0)? == 0 {
            // Another claim replaced this one: nothing was written.
            return Ok(false);
        }
        self.wake_local();
        Ok(true)
    }

    async fn note_work(&self, claim: &Claim, code: &str, message: &str) -> Result<bool> {
        let c = self.client().await?;
        let row = c
            .one(
                &format!(
                    "WITH claim AS MATERIALIZED (
                       SELECT id, namespace_id, revision_id, agent_id FROM work
                       WHERE id = $1 AND claim_token = $2 AND state = 'running' FOR UPDATE),
                     attempt AS (
                       UPDATE revisions r SET last_code = $3, last_message = $4, last_at = {NOW_MS} / 1000
                       FROM claim c
                       WHERE r.namespace_id = c.namespace_id AND r.agent_id = c.agent_id AND r.id = c.revision_id
                       RETURNING 1),
                     noted AS (
                       UPDATE work w SET last_code = $3, last_message = $4, updated_at = {NOW_MS}
                       FROM claim c WHERE w.id = c.id
                       RETURNING 1)
                     SELECT (SELECT count(*) FROM noted)"
                ),
                &[&claim.work, &claim.token, &code, &message],
            )
            .await?;
        Ok(row.try_get::<_, i64>(0)? > 0)
    }

    async fn open_work(&self, ns: &str, agent: &str) -> Result<Vec<WorkRecord>> {
        let c = self.client().await?;
        c.rows(
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
        c.rows(
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

    async fn namespace_work(&self, ns: &str, limit: u32) -> Result<Vec<WorkRecord>> {
        let c = self.client().await?;
        c.rows(
            &format!(
                "SELECT {WORK_RECORD_COLS} FROM work
                 WHERE namespace_id = $1 AND agent_id IS NULL ORDER BY id DESC LIMIT $2"
            ),
            &[&ns, &i64::from(limit)],
        )
        .await?
        .iter()
        .map(work_record)
        .collect()
    }

    async fn work_item(&self, ns: &str, agent: &str, id: i64) -> Result<Option<WorkRecord>> {
        let c = self.client().await?;
        c.opt(
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
            .one(
                "SELECT COUNT(*), MIN(created_at) FROM work WHERE state IN ('queued', 'running')",
                &[],
            )
            .await?;
        Ok((r.try_get(0)?, r.try_get(1)?))
    }

    async fn work_counts(&self) -> Result<Vec<(String, String, i64)>> {
        let c = self.client().await?;
        c.rows(
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
