//! Immutable revisions and their progress.

use async_trait::async_trait;
use rusqlite::{Connection, OptionalExtension, Row, params};
use serde_json::Value;

use super::{SqliteStore, id_col, json_col, parse_col, rollouts, work};
use crate::model::{LastAttempt, Revision, RevisionStatus};
use crate::{Claim, Enqueue, Result, RevisionInsert, RevisionStore};

const REV_COLS: &str = "namespace_id, agent_id, id, number, configuration_id, configuration_generation, configuration_hash, rendered, status, last_code, last_message, last_at, attempts, created_at, runtime_failure, secrets, staged";

/// A revision row with its raw status, rendered text, last-attempt columns and evidence.
type RevisionRow = (
    Revision,
    String,
    String,
    Option<String>,
    Option<String>,
    Option<i64>,
    u32,
    Option<String>,
    String,
);

fn revision_row(r: &Row<'_>) -> rusqlite::Result<RevisionRow> {
    Ok((
        Revision {
            namespace_id: id_col(r, 0)?,
            agent_id: id_col(r, 1)?,
            id: id_col(r, 2)?,
            number: r.get::<_, i64>(3)? as u64,
            configuration_id: id_col(r, 4)?,
            configuration_generation: r.get(5)?,
            configuration_hash: id_col(r, 6)?,
            status: RevisionStatus::Pending,
            last_attempt: None,
            created_at: r.get(13)?,
            runtime_failure: None,
            rendered: Value::Null,
            secrets: Vec::new(),
            staged: r.get(16)?,
        },
        r.get(8)?,
        r.get(7)?,
        r.get(9)?,
        r.get(10)?,
        r.get(11)?,
        r.get(12)?,
        r.get(14)?,
        r.get(15)?,
    ))
}

fn finish_revision(
    (mut rev, status, rendered, code, message, at, attempts, evidence, secrets): RevisionRow,
) -> Result<Revision> {
    rev.secrets = crate::secrets_of(&secrets)?;
    rev.status = parse_col(&status, "revision status", RevisionStatus::parse)?;
    rev.rendered = json_col(rendered)?;
    rev.runtime_failure = evidence.map(json_col).transpose()?;
    if let (Some(code), Some(at)) = (code, at) {
        rev.last_attempt = Some(LastAttempt {
            code,
            message: message.unwrap_or_default(),
            at,
            attempts,
        });
    }
    Ok(rev)
}

/// Inserts the next revision (numbered inside `tx`) and its deploy work; desired becomes
/// running. Returns the work's id.
/// The number the Agent's next revision gets: after every number this database issued and
/// after its revision floor.
fn next_number(c: &Connection, ns: &str, agent: &str) -> Result<i64> {
    let last: i64 = c.query_row(
        "SELECT MAX(COALESCE((SELECT MAX(number) FROM revisions WHERE namespace_id = ?1 AND agent_id = ?2), 0),
                    COALESCE((SELECT revision_floor FROM agents WHERE namespace_id = ?1 AND id = ?2), 0))",
        params![ns, agent],
        |row| row.get(0),
    )?;
    Ok(last + 1)
}

pub(super) fn insert_revision(tx: &Connection, r: &mut Revision) -> Result<i64> {
    let last = next_number(tx, &r.namespace_id, &r.agent_id)? - 1;
    r.number = last as u64 + 1;
    r.id = crate::revision_id(r.number, &r.configuration_hash)?;
    r.status = RevisionStatus::Pending;
    r.staged = false;
    tx.execute(
        "INSERT INTO revisions (namespace_id, agent_id, id, number, configuration_id, configuration_generation, configuration_hash, rendered, status, created_at, secrets, staged)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, 0)",
        params![r.namespace_id.as_str(), r.agent_id.as_str(), r.id.as_str(), r.number as i64, r.configuration_id.as_str(), r.configuration_generation, r.configuration_hash.as_str(), r.rendered.to_string(), r.status.as_str(), r.created_at, crate::secrets_text(&r.secrets)?],
    )?;
    tx.execute(
        "UPDATE agents SET desired_state = 'running' WHERE namespace_id = ?1 AND id = ?2",
        params![r.namespace_id.as_str(), r.agent_id.as_str()],
    )?;
    work::enqueue(tx, &Enqueue::deploy(&r.namespace_id, &r.agent_id, &r.id))
}

/// A revision's status (parameters: Namespace, Agent, revision, status).
const SET_STATUS: &str =
    "UPDATE revisions SET status = ?4 WHERE namespace_id = ?1 AND agent_id = ?2 AND id = ?3";

#[async_trait]
impl RevisionStore for SqliteStore {
    async fn create_revision(&self, r: &mut Revision) -> Result<RevisionInsert> {
        let out = self
            .transact(None, |tx| {
                if let Some(rollout) = rollouts::open_rollout_of(tx, &r.namespace_id, &r.agent_id)?
                {
                    return Ok(RevisionInsert::InRollout(rollout));
                }
                Ok(RevisionInsert::Queued(insert_revision(tx, r)?))
            })
            .await?;
        if matches!(out, RevisionInsert::Queued(_)) {
            self.wake.notify_one();
        }
        Ok(out)
    }

    async fn create_revision_audited(
        &self,
        r: &mut Revision,
        actor: &str,
        now: i64,
    ) -> Result<RevisionInsert> {
        let out = self
            .transact(None, |tx| {
                if let Some(rollout) = rollouts::open_rollout_of(tx, &r.namespace_id, &r.agent_id)?
                {
                    return Ok(RevisionInsert::InRollout(rollout));
                }
                let work = insert_revision(tx, r)?;
                let (action, target, detail) = crate::deploy_audit(r, work);
                super::audit::insert(tx, (actor, action, &target), &detail, now)?;
                Ok(RevisionInsert::Queued(work))
            })
            .await?;
        if matches!(out, RevisionInsert::Queued(_)) {
            self.wake.notify_one();
        }
        Ok(out)
    }

    async fn revision(&self, ns: &str, agent: &str, id: &str) -> Result<Option<Revision>> {
        self.read(|c| {
            c.query_row(
                &format!(
                    "SELECT {REV_COLS} FROM revisions WHERE namespace_id = ?1 AND agent_id = ?2 AND id = ?3"
                ),
                params![ns, agent, id],
                revision_row,
            )
            .optional()?
            .map(finish_revision)
            .transpose()
        })
        .await
    }

    async fn revisions(&self, ns: &str, agent: &str) -> Result<Vec<Revision>> {
        self.read(|c| {
            let mut st = c.prepare(&format!(
                "SELECT {REV_COLS} FROM revisions WHERE namespace_id = ?1 AND agent_id = ?2 ORDER BY number"
            ))?;
            let rows = st.query_map(params![ns, agent], revision_row)?;
            rows.map(|r| finish_revision(r?)).collect()
        })
        .await
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
            .map_err(|e| crate::StoreError::Corrupt(format!("runtime_failure: {e}")))?;
        self.transact(Some(claim), |tx| {
            tx.execute(
                "UPDATE revisions SET runtime_failure = ?4 WHERE namespace_id = ?1 AND agent_id = ?2 AND id = ?3",
                params![ns, agent, id, text],
            )?;
            Ok(())
        })
        .await
    }

    async fn next_revision_number(&self, ns: &str, agent: &str) -> Result<u64> {
        self.read(|c| Ok(next_number(c, ns, agent)? as u64)).await
    }

    async fn raise_revision_floor(
        &self,
        claim: &Claim,
        ns: &str,
        agent: &str,
        number: u64,
    ) -> Result<()> {
        let number = i64::try_from(number).map_err(|_| {
            crate::StoreError::Corrupt(format!("revision number {number} is out of range"))
        })?;
        self.transact(Some(claim), |tx| {
            tx.execute(
                "UPDATE agents SET revision_floor = ?3 WHERE namespace_id = ?1 AND id = ?2 AND revision_floor < ?3",
                params![ns, agent, number],
            )?;
            Ok(())
        })
        .await
    }

    async fn set_revision_status(
        &self,
        claim: &Claim,
        ns: &str,
        agent: &str,
        id: &str,
        status: RevisionStatus,
    ) -> Result<()> {
        self.transact(Some(claim), |tx| {
            tx.execute(SET_STATUS, params![ns, agent, id, status.as_str()])?;
            Ok(())
        })
        .await
    }

    async fn mark_revision_staged(
        &self,
        claim: &Claim,
        ns: &str,
        agent: &str,
        id: &str,
    ) -> Result<()> {
        self.transact(Some(claim), |tx| {
            tx.execute(
                "UPDATE revisions SET staged = 1 WHERE namespace_id = ?1 AND agent_id = ?2 AND id = ?3",
                params![ns, agent, id],
            )?;
            Ok(())
        })
        .await
    }

    async fn retire_unstaged(
        &self,
        claim: &Claim,
        ns: &str,
        agent: &str,
        below: u64,
    ) -> Result<u64> {
        let below = i64::try_from(below).map_err(|_| {
            crate::StoreError::Corrupt(format!("revision number {below} is out of range"))
        })?;
        self.transact(Some(claim), |tx| {
            let n = tx.execute(
                "UPDATE revisions SET status = ?4 WHERE namespace_id = ?1 AND agent_id = ?2 AND number < ?3 AND staged = 0 AND status <> ?4",
                params![ns, agent, below, RevisionStatus::Retired.as_str()],
            )?;
            Ok(n as u64)
        })
        .await
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
        self.transact(Some(claim), |tx| {
            tx.execute(
                SET_STATUS,
                params![ns, agent, id, RevisionStatus::Active.as_str()],
            )?;
            tx.execute(
                super::agents::SET_OBSERVED,
                params![ns, agent, port, served],
            )?;
            Ok(())
        })
        .await
    }

    async fn commit_revision(
        &self,
        claim: &Claim,
        ns: &str,
        agent: &str,
        expected: Option<&str>,
        candidate: &str,
    ) -> Result<bool> {
        self.transact(Some(claim), |tx| {
            let n = tx.execute(
                "UPDATE agents SET active_revision_id = ?4 WHERE namespace_id = ?1 AND id = ?2 AND active_revision_id IS ?3",
                params![ns, agent, expected, candidate],
            )?;
            if n == 0 {
                return Ok(false);
            }
            tx.execute(
                "UPDATE revisions SET status = ?4 WHERE namespace_id = ?1 AND agent_id = ?2 AND id = ?3",
                params![ns, agent, candidate, RevisionStatus::Activating.as_str()],
            )?;
            if let Some(old) = expected {
                tx.execute(
                    "UPDATE revisions SET status = ?4 WHERE namespace_id = ?1 AND agent_id = ?2 AND id = ?3 AND status IN (?5, ?6, ?7)",
                    params![
                        ns,
                        agent,
                        old,
                        RevisionStatus::Superseded.as_str(),
                        RevisionStatus::Active.as_str(),
                        RevisionStatus::Activating.as_str(),
                        RevisionStatus::Stopped.as_str()
                    ],
                )?;
            }
            work::settle_superseded(tx, ns, agent, candidate)?;
            Ok(true)
        })
        .await
    }
}
