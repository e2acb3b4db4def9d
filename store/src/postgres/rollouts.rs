//! Rollouts and their Agents.

use async_trait::async_trait;
use tokio_postgres::Row;

use super::{Cached, NOW_MS, PostgresStore, Tx, id_col, narrow, revisions};
use crate::model::{
    Revision, Rollout, RolloutAgent, RolloutAgentState, RolloutSecret, RolloutState,
};
use crate::rows::subject_columns;
use crate::{
    Result, RevisionInsert, RolloutInsert, RolloutRow, RolloutStore, StoreError, sql_list,
};

/// The open states as an SQL list.
pub(super) fn open_list() -> String {
    sql_list(RolloutState::OPEN.iter().map(|s| s.as_str()))
}

/// The open rollout the Agent belongs to (and is not done in), if any.
pub(super) async fn open_rollout_of(
    c: &impl deadpool_postgres::GenericClient,
    ns: &str,
    agent: &str,
) -> Result<Option<i64>> {
    Ok(c.opt(&open_rollout_sql(), &[&ns, &agent])
        .await?
        .map(|r| r.try_get(0))
        .transpose()?)
}

/// The query of [`open_rollout_of`] (Namespace `$1`, Agent `$2`), also asked as a scalar
/// subquery by a deploy's first statement.
pub(super) fn open_rollout_sql() -> String {
    format!(
        "SELECT r.id FROM rollout_agents a JOIN rollouts r ON r.id = a.rollout_id
         WHERE a.namespace_id = $1 AND a.agent_id = $2 AND r.state IN {}
           AND a.state IN ('pending', 'deploying') LIMIT 1",
        open_list()
    )
}

const ROLLOUT_COLS: &str = "id, namespace_id, configuration_id, configuration_generation, canary, max_parallel, max_failures, pause_between_seconds, manual_promote, state, wave, waves, next_wave_at_ms, message, created_by, created_at, updated_at, secret_name, secret_version";

fn rollout(r: &Row) -> Result<Rollout> {
    let state: String = r.try_get(9)?;
    // A secret's rollout names no Configuration (migration 16).
    let secret = match r.try_get::<_, Option<String>>(17)? {
        Some(_) => Some(RolloutSecret {
            name: id_col(r, 17)?,
            version: match r.try_get::<_, Option<i64>>(18)? {
                Some(v) => narrow(v, "secret version")?,
                None => {
                    return Err(StoreError::Corrupt(
                        "a rollout names a secret but no secret_version".to_owned(),
                    ));
                }
            },
        }),
        None => None,
    };
    let (configuration_id, configuration_generation) = match secret {
        Some(_) => (None, None),
        None => (
            Some(id_col(r, 2)?),
            Some(narrow(r.try_get(3)?, "configuration generation")?),
        ),
    };
    Ok(Rollout {
        id: r.try_get(0)?,
        namespace_id: id_col(r, 1)?,
        configuration_id,
        configuration_generation,
        secret,
        canary: narrow(r.try_get(4)?, "canary")?,
        max_parallel: narrow(r.try_get(5)?, "maxParallel")?,
        max_failures: narrow(r.try_get(6)?, "maxFailures")?,
        pause_between_seconds: narrow(r.try_get(7)?, "pauseBetweenSeconds")?,
        manual_promote: r.try_get(8)?,
        state: RolloutState::parse(&state)
            .ok_or_else(|| StoreError::Corrupt(format!("rollout state {state:?}")))?,
        wave: narrow(r.try_get(10)?, "wave")?,
        waves: narrow(r.try_get(11)?, "waves")?,
        next_wave_at: r
            .try_get::<_, Option<i64>>(12)?
            .map(|ms| ms.div_euclid(1000)),
        message: r.try_get(13)?,
        created_by: r.try_get(14)?,
        created_at: r.try_get(15)?,
        updated_at: r.try_get(16)?,
        agents: Vec::new(),
    })
}

fn rollout_agent(r: &Row) -> Result<RolloutAgent> {
    let state: String = r.try_get(2)?;
    Ok(RolloutAgent {
        agent_id: id_col(r, 0)?,
        wave: narrow(r.try_get(1)?, "wave")?,
        state: RolloutAgentState::parse(&state)
            .ok_or_else(|| StoreError::Corrupt(format!("rollout Agent state {state:?}")))?,
        revision_id: r.try_get(3)?,
        work_id: r.try_get(4)?,
        code: r.try_get(5)?,
        message: r.try_get(6)?,
        started_at: r.try_get(7)?,
        finished_at: r.try_get(8)?,
    })
}

async fn rollouts_where(
    c: &impl deadpool_postgres::GenericClient,
    condition: &str,
    params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
) -> Result<Vec<Rollout>> {
    let rows = c
        .rows(
            &format!("SELECT {ROLLOUT_COLS} FROM rollouts r {condition}"),
            params,
        )
        .await?;
    let mut out = Vec::new();
    for row in &rows {
        let mut r = rollout(row)?;
        r.agents = c
            .rows(
                "SELECT agent_id, wave, state, revision_id, work_id, code, message, started_at, finished_at
                 FROM rollout_agents WHERE rollout_id = $1 ORDER BY position",
                &[&r.id],
            )
            .await?
            .iter()
            .map(rollout_agent)
            .collect::<Result<_>>()?;
        out.push(r);
    }
    Ok(out)
}

/// A read transaction that sees one snapshot for a rollout and its Agents.
async fn snapshot(c: &mut deadpool_postgres::Object) -> Result<Tx<'_>> {
    Ok(c.build_transaction()
        .isolation_level(tokio_postgres::IsolationLevel::RepeatableRead)
        .read_only(true)
        .start()
        .await?)
}

#[async_trait]
impl RolloutStore for PostgresStore {
    async fn insert_rollout(&self, r: &RolloutRow) -> Result<RolloutInsert> {
        let mut c = self.client().await?;
        let tx = c.transaction().await?;
        for (agent, _) in &r.agents {
            // Locks the Agent against a concurrent rollout or deploy until the insert commits.
            let desired = tx
                .opt(
                    "SELECT desired_state FROM agents WHERE namespace_id = $1 AND id = $2 FOR UPDATE",
                    &[&r.namespace_id, agent],
                )
                .await?
                .map(|row| row.try_get::<_, String>(0))
                .transpose()?;
            if desired.is_none_or(|d| d == "deleted") {
                return Ok(RolloutInsert::AgentUnavailable(agent.clone()));
            }
            if let Some(rollout) = open_rollout_of(&tx, &r.namespace_id, agent).await? {
                return Ok(RolloutInsert::Busy {
                    agent: agent.clone(),
                    rollout,
                });
            }
        }
        let waves = r.agents.iter().map(|(_, w)| w + 1).max().unwrap_or(0);
        let (configuration_id, generation, secret_name, secret_version) =
            subject_columns(&r.subject);
        let secret_version = secret_version.map(i64::from);
        let id: i64 = tx
            .one(
                "INSERT INTO rollouts (namespace_id, configuration_id, configuration_generation, canary, max_parallel, max_failures,
                     pause_between_seconds, manual_promote, state, wave, waves, created_by, created_at, updated_at,
                     secret_name, secret_version)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, 'running', 0, $9, $10, $11, $11, $12, $13) RETURNING id",
                &[
                    &r.namespace_id,
                    &configuration_id,
                    &i64::from(generation),
                    &i64::from(r.canary),
                    &i64::from(r.max_parallel),
                    &i64::from(r.max_failures),
                    &i64::from(r.pause_between_seconds),
                    &r.manual_promote,
                    &i64::from(waves),
                    &r.created_by,
                    &r.now,
                    &secret_name,
                    &secret_version,
                ],
            )
            .await?
            .try_get(0)?;
        for (position, (agent, wave)) in r.agents.iter().enumerate() {
            tx.exec(
                "INSERT INTO rollout_agents (rollout_id, namespace_id, agent_id, position, wave, state) VALUES ($1, $2, $3, $4, $5, 'pending')",
                &[&id, &r.namespace_id, agent, &(position as i64), &i64::from(*wave)],
            )
            .await?;
        }
        tx.commit().await?;
        Ok(RolloutInsert::Created(id))
    }

    async fn rollout(&self, ns: &str, id: i64) -> Result<Option<Rollout>> {
        let mut c = self.client().await?;
        let tx = snapshot(&mut c).await?;
        Ok(
            rollouts_where(&tx, "WHERE namespace_id = $1 AND id = $2", &[&ns, &id])
                .await?
                .into_iter()
                .next(),
        )
    }

    async fn rollouts(&self, ns: &str, limit: u32) -> Result<Vec<Rollout>> {
        let mut c = self.client().await?;
        let tx = snapshot(&mut c).await?;
        rollouts_where(
            &tx,
            "WHERE namespace_id = $1 ORDER BY id DESC LIMIT $2",
            &[&ns, &i64::from(limit)],
        )
        .await
    }

    async fn rollouts_to_advance(&self) -> Result<Vec<Rollout>> {
        let mut c = self.client().await?;
        let tx = snapshot(&mut c).await?;
        rollouts_where(
            &tx,
            &format!(
                "WHERE r.state IN {}
                   OR EXISTS (SELECT 1 FROM rollout_agents a WHERE a.rollout_id = r.id AND a.state = 'deploying')
                 ORDER BY id",
                open_list()
            ),
            &[],
        )
        .await
    }

    async fn rollout_counts(&self) -> Result<Vec<(String, i64)>> {
        let c = self.client().await?;
        c.rows("SELECT state, COUNT(*) FROM rollouts GROUP BY state", &[])
            .await?
            .iter()
            .map(|r| Ok((r.try_get(0)?, r.try_get(1)?)))
            .collect()
    }

    async fn open_rollout_of(&self, ns: &str, agent: &str) -> Result<Option<i64>> {
        let c = self.client().await?;
        open_rollout_of(&c, ns, agent).await
    }

    async fn set_rollout(
        &self,
        id: i64,
        expected: (RolloutState, u32),
        state: RolloutState,
        wave: u32,
        next_wave_at_ms: Option<i64>,
        message: Option<&str>,
        now: i64,
    ) -> Result<bool> {
        let c = self.client().await?;
        Ok(c.exec(
            "UPDATE rollouts SET state = $4, wave = $5, next_wave_at_ms = $6, message = COALESCE($7, message), updated_at = $8
             WHERE id = $1 AND state = $2 AND wave = $3",
            &[
                &id,
                &expected.0.as_str(),
                &i64::from(expected.1),
                &state.as_str(),
                &i64::from(wave),
                &next_wave_at_ms,
                &message,
                &now,
            ],
        )
        .await?
            > 0)
    }

    async fn rollout_next_wave_ms(&self, id: i64) -> Result<Option<i64>> {
        let c = self.client().await?;
        Ok(
            c.opt("SELECT next_wave_at_ms FROM rollouts WHERE id = $1", &[&id])
                .await?
                .map(|r| r.try_get::<_, Option<i64>>(0))
                .transpose()?
                .flatten(),
        )
    }

    async fn start_rollout_deploy(&self, rollout: i64, rev: &mut Revision) -> Result<Option<i64>> {
        let mut c = self.client().await?;
        let tx = c.transaction().await?;
        let pending = tx
            .opt(
                "SELECT 1 FROM rollout_agents a JOIN rollouts r ON r.id = a.rollout_id
                 WHERE a.rollout_id = $1 AND a.agent_id = $2 AND a.state = 'pending' AND r.state = 'running'
                 FOR UPDATE OF a",
                &[&rollout, &rev.agent_id.as_str()],
            )
            .await?;
        if pending.is_none() {
            return Ok(None);
        }
        tx.exec(
            "UPDATE agents SET configuration_id = $3 WHERE namespace_id = $1 AND id = $2",
            &[
                &rev.namespace_id.as_str(),
                &rev.agent_id.as_str(),
                &rev.configuration_id.as_str(),
            ],
        )
        .await?;
        let work = match revisions::insert_revision(&tx, rev, Some(rollout), None).await? {
            RevisionInsert::Queued(work) => work,
            RevisionInsert::InRollout(other) => {
                return Err(StoreError::Database(format!(
                    "rollout {rollout} found rollout {other} owning its own Agent"
                )));
            }
        };
        tx.exec(
            &format!(
                "UPDATE rollout_agents SET state = 'deploying', revision_id = $3, work_id = $4, started_at = {NOW_MS} / 1000
                 WHERE rollout_id = $1 AND agent_id = $2"
            ),
            &[&rollout, &rev.agent_id.as_str(), &rev.id.as_str(), &work],
        )
        .await?;
        tx.commit().await?;
        self.wake_local();
        Ok(Some(work))
    }

    async fn finish_rollout_agent(
        &self,
        rollout: i64,
        agent: &str,
        from: RolloutAgentState,
        state: RolloutAgentState,
        (code, message): (&str, &str),
        now: i64,
    ) -> Result<bool> {
        let c = self.client().await?;
        Ok(c.exec(
            "UPDATE rollout_agents SET state = $4, code = $5, message = $6, finished_at = $7
             WHERE rollout_id = $1 AND agent_id = $2 AND state = $3",
            &[
                &rollout,
                &agent,
                &from.as_str(),
                &state.as_str(),
                &code,
                &message,
                &now,
            ],
        )
        .await?
            > 0)
    }

    async fn skip_pending_rollout_agents(
        &self,
        rollout: i64,
        (code, message): (&str, &str),
        now: i64,
    ) -> Result<usize> {
        let c = self.client().await?;
        let n = c
            .exec(
                "UPDATE rollout_agents SET state = 'skipped', code = $2, message = $3, finished_at = $4
                 WHERE rollout_id = $1 AND state = 'pending'",
                &[&rollout, &code, &message, &now],
            )
            .await?;
        narrow(n as i64, "rollout Agents skipped")
    }
}
