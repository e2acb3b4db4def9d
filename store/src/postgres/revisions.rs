//! Immutable revisions and their progress.

use async_trait::async_trait;
use tokio_postgres::Row;
use tokio_postgres::types::ToSql;

use super::{
    Cached, NOW_MS, PostgresStore, Tx, claim_cte, claimed_execute, id_col, narrow, rollouts, work,
};
use crate::model::{LastAttempt, Revision, RevisionStatus};
use crate::{Claim, Result, RevisionInsert, RevisionStore, StoreError, WorkKind, WorkState};
use clawfleet_api::codes::Code;

const REV_COLS: &str = "namespace_id, agent_id, id, number, configuration_id, configuration_generation, configuration_hash, rendered, status, last_code, last_message, last_at, attempts, created_at, runtime_failure, secrets, staged";

fn json<T: serde::de::DeserializeOwned>(t: String) -> Result<T> {
    serde_json::from_str(&t).map_err(|e| StoreError::Corrupt(e.to_string()))
}

fn revision(r: &Row) -> Result<Revision> {
    let status: String = r.try_get(8)?;
    let code: Option<String> = r.try_get(9)?;
    let at: Option<i64> = r.try_get(11)?;
    Ok(Revision {
        namespace_id: id_col(r, 0)?,
        agent_id: id_col(r, 1)?,
        id: id_col(r, 2)?,
        number: narrow(r.try_get(3)?, "revision number")?,
        configuration_id: id_col(r, 4)?,
        configuration_generation: narrow(r.try_get(5)?, "configuration generation")?,
        configuration_hash: id_col(r, 6)?,
        rendered: json(r.try_get(7)?)?,
        status: RevisionStatus::parse(&status)
            .ok_or_else(|| StoreError::Corrupt(format!("revision status {status:?}")))?,
        last_attempt: match (code, at) {
            (Some(code), Some(at)) => Some(LastAttempt {
                code,
                message: r.try_get::<_, Option<String>>(10)?.unwrap_or_default(),
                at,
                attempts: narrow(r.try_get(12)?, "attempts")?,
            }),
            _ => None,
        },
        created_at: r.try_get(13)?,
        runtime_failure: r.try_get::<_, Option<String>>(14)?.map(json).transpose()?,
        secrets: crate::secrets_of(&r.try_get::<_, String>(15)?)?,
        staged: r.try_get(16)?,
    })
}

/// Inserts the next revision (numbered inside `tx`, with the Agent's row locked so concurrent
/// deploys of one Agent get distinct numbers) and its deploy work; desired becomes running.
/// Returns the work's id, or the open rollout that owns the Agent (then the caller must not
/// commit).
///
/// Three statements in two round trips (a deploy request's cost on the database is mostly
/// per statement):
/// - [`LOCK_AGENT`], the row lock answering the revision floor, the work item's id asked for
///   ahead and the rollout check, with the highest number pipelined after it (tokio-postgres
///   pipelines the requests of futures polled at once, and the server runs them in order).
///   The number is a statement of its own so it sees a deploy of the Agent that committed
///   while this one waited for the lock: a statement's subqueries keep the snapshot it
///   started with.
/// - [`INSERT_DEPLOY`]: the revision, its work, the audit record and the announcement.
///
/// `owner` is the rollout deploying this revision, which the check must not refuse.
pub(super) async fn insert_revision(
    tx: &Tx<'_>,
    r: &mut Revision,
    owner: Option<i64>,
    audit: Option<(&str, i64)>,
) -> Result<RevisionInsert> {
    let agent_key: [&(dyn ToSql + Sync); 2] = [&r.namespace_id.as_str(), &r.agent_id.as_str()];
    let (locked, last) = futures::try_join!(
        tx.opt(&LOCK_AGENT[usize::from(owner.is_none())], &agent_key),
        tx.one(
            "SELECT COALESCE(MAX(number), 0) FROM revisions WHERE namespace_id = $1 AND agent_id = $2",
            &agent_key,
        ),
    )?;
    let (floor, work_id, rollout): (i64, i64, Option<i64>) = match locked {
        Some(row) => (row.try_get(0)?, row.try_get(1)?, row.try_get(2)?),
        // No such Agent: asked one by one as before, and the insert below names what is
        // missing.
        None => {
            let rollout = match owner {
                Some(_) => None,
                None => rollouts::open_rollout_of(tx, &r.namespace_id, &r.agent_id).await?,
            };
            (0, tx.one(work::NEXT_ID, &[]).await?.try_get(0)?, rollout)
        }
    };
    if let Some(rollout) = rollout {
        // The caller does not commit: the row lock and the desired state are rolled back.
        return Ok(RevisionInsert::InRollout(rollout));
    }
    let last: i64 = last.try_get::<_, i64>(0)?.max(floor);
    r.number = narrow(last + 1, "revision number")?;
    r.id = crate::revision_id(r.number, &r.configuration_hash)?;
    r.status = RevisionStatus::Pending;
    r.staged = false;
    let number = last + 1;
    let generation = i64::from(r.configuration_generation);
    let rendered = r.rendered.to_string();
    let status = r.status.as_str();
    let secrets = crate::secrets_text(&r.secrets)?;
    let kind = WorkKind::Deploy.as_str();
    let channel = super::CHANNEL;
    let (ns, agent, id) = (r.namespace_id.as_str(), r.agent_id.as_str(), r.id.as_str());
    let (configuration, hash) = (r.configuration_id.as_str(), r.configuration_hash.as_str());
    let mut params: Vec<&(dyn ToSql + Sync)> = vec![
        &ns,
        &agent,
        &id,
        &number,
        &configuration,
        &generation,
        &hash,
        &rendered,
        &status,
        &r.created_at,
        &secrets,
        &work_id,
        &kind,
        &channel,
    ];
    let audited = audit.map(|(actor, now)| {
        let (action, target, detail) = crate::deploy_audit(r, work_id);
        (actor, now, action, target, detail.to_string())
    });
    if let Some((actor, now, action, target, detail)) = &audited {
        params.extend_from_slice(&[now, actor, action, target, detail]);
    }
    tx.one(&INSERT_DEPLOY[usize::from(audited.is_some())], &params)
        .await?;
    Ok(RevisionInsert::Queued(work_id))
}

/// The first statement of a deploy (Namespace `$1`, Agent `$2`): desired becomes running under
/// the Agent's row lock, answering the revision floor, the deploy work's id, and the open
/// rollout that owns the Agent (index 1; index 0, for a rollout's own deploy, asks none).
static LOCK_AGENT: std::sync::LazyLock<[String; 2]> = std::sync::LazyLock::new(|| {
    let lock = format!(
        "UPDATE agents SET desired_state = 'running' WHERE namespace_id = $1 AND id = $2
         RETURNING revision_floor, {}",
        work::next_id!()
    );
    [
        format!("{lock}, NULL::bigint"),
        format!("{lock}, ({})", rollouts::open_rollout_sql()),
    ]
});

/// The rest of a deploy as one statement: the revision (`$1`–`$11`), its deploy work (id
/// `$12`, kind `$13`), the announcement (channel `$14`) and, at index 1, the audit record
/// (`$15`–`$19`). Data-modifying WITH clauses all run, whether or not the query reads them;
/// the work's reference to its revision is checked at the end of the statement.
static INSERT_DEPLOY: std::sync::LazyLock<[String; 2]> = std::sync::LazyLock::new(|| {
    let revision = "INSERT INTO revisions (namespace_id, agent_id, id, number, configuration_id, configuration_generation, configuration_hash, rendered, status, created_at, secrets, staged)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, FALSE)";
    let work = work::insert_as_sql([12, 13, 1, 2, 3]);
    let notify = super::notify_sql(14);
    let plain = format!("WITH revision AS ({revision}), work AS ({work}) {notify}");
    let audited = format!(
        "WITH revision AS ({revision}), work AS ({work}), audit AS ({}) {notify}",
        super::audit::insert_sql(15)
    );
    [plain, audited]
});

/// The commit point as one statement (parameters: Namespace, Agent, expected, candidate,
/// the claim's work id and token, then the settled work's state, code and message):
/// - the claim check, its row share-locked until the statement commits;
/// - the compare-and-set of the Agent's active revision from `expected` to `candidate`;
/// - once swapped, queued deploy work of the Agent's older revisions (a retry waiting out
///   its delay, or a deploy never claimed) ends as `REVISION_SUPERSEDED` at once, as the
///   worker would end it on claiming it, so deployment status converges without waiting
///   for its retry time;
/// - and the revisions in one update (a statement may change a row once): the candidate
///   `activating`, the one it replaced `superseded` (if active, activating or stopped), and
///   each settled item's revision its newest attempt (code and message; settling counts no
///   attempt, as the item's count stays) and, if not yet committed, `superseded`.
///
/// Data-modifying WITH clauses run once each, to completion, on one snapshot.
static COMMIT: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    use RevisionStatus::*;
    let deploy = WorkKind::Deploy.as_str();
    let (activating, superseded) = (Activating.as_str(), Superseded.as_str());
    let replaced = format!(
        "'{}', '{}', '{}'",
        Active.as_str(),
        Activating.as_str(),
        Stopped.as_str()
    );
    let uncommitted = format!("'{}', '{}'", Pending.as_str(), Prepared.as_str());
    let settled = "r.id IN (SELECT revision_id FROM settled)";
    let claim = claim_cte(5, 6);
    format!(
        "WITH {claim},
         swap AS MATERIALIZED (
           UPDATE agents SET active_revision_id = $4
           WHERE namespace_id = $1 AND id = $2 AND active_revision_id IS NOT DISTINCT FROM $3
             AND EXISTS (SELECT 1 FROM claim)
           RETURNING 1),
         settled AS MATERIALIZED (
           UPDATE work SET state = $7, last_code = $8, last_message = $9, updated_at = {NOW_MS}
           WHERE namespace_id = $1 AND agent_id = $2 AND kind = '{deploy}' AND state = 'queued'
             AND EXISTS (SELECT 1 FROM swap)
             AND revision_id IN (
               SELECT id FROM revisions WHERE namespace_id = $1 AND agent_id = $2
                 AND number < (SELECT number FROM revisions WHERE namespace_id = $1 AND agent_id = $2 AND id = $4))
           RETURNING revision_id),
         statuses AS (
           UPDATE revisions r SET
               status = CASE
                 WHEN r.id = $4 THEN '{activating}'
                 WHEN r.id = $3 AND r.status IN ({replaced}) THEN '{superseded}'
                 WHEN {settled} AND r.status IN ({uncommitted}) THEN '{superseded}'
                 ELSE r.status END,
               last_code = CASE WHEN {settled} THEN $8 ELSE r.last_code END,
               last_message = CASE WHEN {settled} THEN $9 ELSE r.last_message END,
               last_at = CASE WHEN {settled} THEN {NOW_MS} / 1000 ELSE r.last_at END
           WHERE r.namespace_id = $1 AND r.agent_id = $2 AND EXISTS (SELECT 1 FROM swap)
             AND (r.id = $4 OR r.id = $3 OR {settled})
           RETURNING 1)
         SELECT EXISTS (SELECT 1 FROM claim), EXISTS (SELECT 1 FROM swap)"
    )
});

#[async_trait]
impl RevisionStore for PostgresStore {
    async fn create_revision(&self, r: &mut Revision) -> Result<RevisionInsert> {
        let mut c = self.client().await?;
        let tx = c.transaction().await?;
        let out = insert_revision(&tx, r, None, None).await?;
        if matches!(out, RevisionInsert::Queued(_)) {
            tx.commit().await?;
            self.wake_local();
        }
        Ok(out)
    }

    async fn create_revision_audited(
        &self,
        r: &mut Revision,
        actor: &str,
        now: i64,
    ) -> Result<RevisionInsert> {
        let mut c = self.client().await?;
        let tx = c.transaction().await?;
        let work = match insert_revision(&tx, r, None, Some((actor, now))).await? {
            RevisionInsert::Queued(work) => work,
            other => return Ok(other),
        };
        tx.commit().await?;
        self.wake_local();
        Ok(RevisionInsert::Queued(work))
    }

    async fn revision(&self, ns: &str, agent: &str, id: &str) -> Result<Option<Revision>> {
        let c = self.client().await?;
        c.opt(
            &format!(
                "SELECT {REV_COLS} FROM revisions WHERE namespace_id = $1 AND agent_id = $2 AND id = $3"
            ),
            &[&ns, &agent, &id],
        )
        .await?
        .as_ref()
        .map(revision)
        .transpose()
    }

    async fn revisions(&self, ns: &str, agent: &str) -> Result<Vec<Revision>> {
        let c = self.client().await?;
        c.rows(
            &format!(
                "SELECT {REV_COLS} FROM revisions WHERE namespace_id = $1 AND agent_id = $2 ORDER BY number"
            ),
            &[&ns, &agent],
        )
        .await?
        .iter()
        .map(revision)
        .collect()
    }

    async fn set_runtime_failure(
        &self,
        claim: &Claim,
        ns: &str,
        agent: &str,
        id: &str,
        evidence: Option<&crate::model::RuntimeFailure>,
    ) -> Result<()> {
        let text = evidence
            .map(serde_json::to_string)
            .transpose()
            .map_err(|e| StoreError::Corrupt(format!("runtime_failure: {e}")))?;
        claimed_execute(
            self,
            claim,
            "UPDATE revisions SET runtime_failure = $4 WHERE namespace_id = $1 AND agent_id = $2 AND id = $3",
            &[&ns, &agent, &id, &text],
        )
        .await?;
        Ok(())
    }

    async fn next_revision_number(&self, ns: &str, agent: &str) -> Result<u64> {
        let c = self.client().await?;
        let last: i64 = c
            .one(
                "SELECT GREATEST(
                   COALESCE((SELECT MAX(number) FROM revisions WHERE namespace_id = $1 AND agent_id = $2), 0),
                   COALESCE((SELECT revision_floor FROM agents WHERE namespace_id = $1 AND id = $2), 0))",
                &[&ns, &agent],
            )
            .await?
            .try_get(0)?;
        narrow(last.saturating_add(1), "revision number")
    }

    async fn raise_revision_floor(
        &self,
        claim: &Claim,
        ns: &str,
        agent: &str,
        number: u64,
    ) -> Result<()> {
        let number = i64::try_from(number).map_err(|_| {
            StoreError::Corrupt(format!("revision number {number} is out of range"))
        })?;
        claimed_execute(
            self,
            claim,
            "UPDATE agents SET revision_floor = $3 WHERE namespace_id = $1 AND id = $2 AND revision_floor < $3",
            &[&ns, &agent, &number],
        )
        .await?;
        Ok(())
    }

    async fn set_revision_status(
        &self,
        claim: &Claim,
        ns: &str,
        agent: &str,
        id: &str,
        status: RevisionStatus,
    ) -> Result<()> {
        claimed_execute(
            self,
            claim,
            "UPDATE revisions SET status = $4 WHERE namespace_id = $1 AND agent_id = $2 AND id = $3",
            &[&ns, &agent, &id, &status.as_str()],
        )
        .await?;
        Ok(())
    }

    async fn mark_revision_staged(
        &self,
        claim: &Claim,
        ns: &str,
        agent: &str,
        id: &str,
    ) -> Result<()> {
        claimed_execute(
            self,
            claim,
            "UPDATE revisions SET staged = TRUE WHERE namespace_id = $1 AND agent_id = $2 AND id = $3",
            &[&ns, &agent, &id],
        )
        .await?;
        Ok(())
    }

    async fn retire_unstaged(
        &self,
        claim: &Claim,
        ns: &str,
        agent: &str,
        below: u64,
    ) -> Result<u64> {
        let below = i64::try_from(below)
            .map_err(|_| StoreError::Corrupt(format!("revision number {below} is out of range")))?;
        let n = claimed_execute(
            self,
            claim,
            "UPDATE revisions SET status = $4 WHERE namespace_id = $1 AND agent_id = $2 AND number < $3 AND NOT staged AND status <> $4",
            &[&ns, &agent, &below, &RevisionStatus::Retired.as_str()],
        )
        .await?;
        Ok(n)
    }

    async fn set_activated(
        &self,
        claim: &Claim,
        ns: &str,
        agent: &str,
        id: &str,
        port: Option<u16>,
        served: Option<&str>,
    ) -> Result<()> {
        // One statement: the claim check (the item's row share-locked until it commits) and
        // both writes.
        static SET_ACTIVATED: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
            format!(
                "WITH {},
                 revision AS (
                   UPDATE revisions SET status = $4
                   WHERE namespace_id = $1 AND agent_id = $2 AND id = $3 AND EXISTS (SELECT 1 FROM claim)
                   RETURNING 1),
                 observed AS (
                   UPDATE agents SET port = COALESCE($5, port), served_revision_id = $6
                   WHERE namespace_id = $1 AND id = $2 AND EXISTS (SELECT 1 FROM claim)
                   RETURNING 1)
                 SELECT count(*) FROM claim",
                claim_cte(7, 8)
            )
        });
        let c = self.client().await?;
        let row = c
            .one(
                &SET_ACTIVATED,
                &[
                    &ns,
                    &agent,
                    &id,
                    &RevisionStatus::Active.as_str(),
                    &port.map(i64::from),
                    &served,
                    &claim.work,
                    &claim.token,
                ],
            )
            .await?;
        if row.try_get::<_, i64>(0)? == 0 {
            return Err(claim.lost());
        }
        Ok(())
    }

    async fn commit_revision(
        &self,
        claim: &Claim,
        ns: &str,
        agent: &str,
        expected: Option<&str>,
        candidate: &str,
    ) -> Result<bool> {
        let c = self.client().await?;
        let message = format!("a newer revision, {candidate}, was committed");
        let row = c
            .one(
                &COMMIT,
                &[
                    &ns,
                    &agent,
                    &expected,
                    &candidate,
                    &claim.work,
                    &claim.token,
                    &WorkState::Done.as_str(),
                    &Code::RevisionSuperseded.as_str(),
                    &message,
                ],
            )
            .await?;
        if !row.try_get::<_, bool>(0)? {
            return Err(claim.lost());
        }
        Ok(row.try_get(1)?)
    }
}
