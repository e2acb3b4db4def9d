//! Rollouts and their Agents.

use async_trait::async_trait;
use rusqlite::{Connection, OptionalExtension, Row, params};

use super::{SqliteStore, corrupt, id_col, revisions};
use crate::clock::now_ms;
use crate::model::{
    Revision, Rollout, RolloutAgent, RolloutAgentState, RolloutSecret, RolloutState,
};
use crate::rows::subject_columns;
use crate::{Result, RolloutInsert, RolloutRow, RolloutStore};

/// The open states as an SQL list.
pub(super) fn open_list() -> String {
    crate::sql_list(RolloutState::OPEN.iter().map(|s| s.as_str()))
}

/// The open rollout the Agent belongs to (and is not done in), if any.
pub(super) fn open_rollout_of(c: &Connection, ns: &str, agent: &str) -> Result<Option<i64>> {
    Ok(c.query_row(
        &format!(
            "SELECT r.id FROM rollout_agents a JOIN rollouts r ON r.id = a.rollout_id
             WHERE a.namespace_id = ?1 AND a.agent_id = ?2 AND r.state IN {}
               AND a.state IN ('pending', 'deploying') LIMIT 1",
            open_list()
        ),
        params![ns, agent],
        |r| r.get(0),
    )
    .optional()?)
}

const ROLLOUT_COLS: &str = "id, namespace_id, configuration_id, configuration_generation, canary, max_parallel, max_failures, pause_between_seconds, manual_promote, state, wave, waves, next_wave_at_ms, message, created_by, created_at, updated_at, secret_name, secret_version";

fn rollout_row(r: &Row<'_>) -> rusqlite::Result<Rollout> {
    let state: String = r.get(9)?;
    // A secret's rollout names no Configuration (migration 16).
    let secret = match r.get::<_, Option<String>>(17)? {
        Some(_) => Some(RolloutSecret {
            name: id_col(r, 17)?,
            version: r.get(18)?,
        }),
        None => None,
    };
    let (configuration_id, configuration_generation) = match secret {
        Some(_) => (None, None),
        None => (Some(id_col(r, 2)?), Some(r.get(3)?)),
    };
    Ok(Rollout {
        id: r.get(0)?,
        namespace_id: id_col(r, 1)?,
        configuration_id,
        configuration_generation,
        secret,
        canary: r.get(4)?,
        max_parallel: r.get(5)?,
        max_failures: r.get(6)?,
        pause_between_seconds: r.get(7)?,
        manual_promote: r.get::<_, i64>(8)? != 0,
        state: RolloutState::parse(&state)
            .ok_or_else(|| corrupt(9, format!("rollout state {state:?}")))?,
        wave: r.get(10)?,
        waves: r.get(11)?,
        next_wave_at: r.get::<_, Option<i64>>(12)?.map(|ms| ms.div_euclid(1000)),
        message: r.get(13)?,
        created_by: r.get(14)?,
        created_at: r.get(15)?,
        updated_at: r.get(16)?,
        agents: Vec::new(),
    })
}

fn agent_row(r: &Row<'_>) -> rusqlite::Result<RolloutAgent> {
    let state: String = r.get(2)?;
    Ok(RolloutAgent {
        agent_id: id_col(r, 0)?,
        wave: r.get(1)?,
        state: RolloutAgentState::parse(&state)
            .ok_or_else(|| corrupt(2, format!("rollout Agent state {state:?}")))?,
        revision_id: r.get(3)?,
        work_id: r.get(4)?,
        code: r.get(5)?,
        message: r.get(6)?,
        started_at: r.get(7)?,
        finished_at: r.get(8)?,
    })
}

fn with_agents(c: &Connection, mut r: Rollout) -> Result<Rollout> {
    let mut st = c.prepare(
        "SELECT agent_id, wave, state, revision_id, work_id, code, message, started_at, finished_at
         FROM rollout_agents WHERE rollout_id = ?1 ORDER BY position",
    )?;
    r.agents = st
        .query_map([r.id], agent_row)?
        .collect::<rusqlite::Result<_>>()?;
    Ok(r)
}

fn rollouts_where(
    c: &Connection,
    condition: &str,
    params: impl rusqlite::Params,
) -> Result<Vec<Rollout>> {
    let mut st = c.prepare(&format!(
        "SELECT {ROLLOUT_COLS} FROM rollouts r {condition}"
    ))?;
    let rows = st
        .query_map(params, rollout_row)?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    rows.into_iter().map(|r| with_agents(c, r)).collect()
}

#[async_trait]
impl RolloutStore for SqliteStore {
    async fn insert_rollout(&self, r: &RolloutRow) -> Result<RolloutInsert> {
        self.transact(None, |tx| {
            for (agent, _) in &r.agents {
                let desired: Option<String> = tx
                    .query_row(
                        "SELECT desired_state FROM agents WHERE namespace_id = ?1 AND id = ?2",
                        params![r.namespace_id, agent],
                        |row| row.get(0),
                    )
                    .optional()?;
                if desired.is_none_or(|d| d == "deleted") {
                    return Ok(RolloutInsert::AgentUnavailable(agent.clone()));
                }
                if let Some(rollout) = open_rollout_of(tx, &r.namespace_id, agent)? {
                    return Ok(RolloutInsert::Busy {
                        agent: agent.clone(),
                        rollout,
                    });
                }
            }
            let waves = r.agents.iter().map(|(_, w)| w + 1).max().unwrap_or(0);
            let (configuration_id, generation, secret_name, secret_version) = subject_columns(&r.subject);
            tx.execute(
                "INSERT INTO rollouts (namespace_id, configuration_id, configuration_generation, canary, max_parallel, max_failures, pause_between_seconds, manual_promote, state, wave, waves, created_by, created_at, updated_at, secret_name, secret_version)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, 'running', 0, ?9, ?10, ?11, ?11, ?12, ?13)",
                params![r.namespace_id, configuration_id, generation, r.canary, r.max_parallel, r.max_failures, r.pause_between_seconds, i64::from(r.manual_promote), waves, r.created_by, r.now, secret_name, secret_version],
            )?;
            let id = tx.last_insert_rowid();
            for (position, (agent, wave)) in r.agents.iter().enumerate() {
                tx.execute(
                    "INSERT INTO rollout_agents (rollout_id, namespace_id, agent_id, position, wave, state) VALUES (?1, ?2, ?3, ?4, ?5, 'pending')",
                    params![id, r.namespace_id, agent, position as i64, wave],
                )?;
            }
            Ok(RolloutInsert::Created(id))
        })
        .await
    }

    async fn rollout(&self, ns: &str, id: i64) -> Result<Option<Rollout>> {
        self.read(|c| {
            Ok(
                rollouts_where(c, "WHERE namespace_id = ?1 AND id = ?2", params![ns, id])?
                    .into_iter()
                    .next(),
            )
        })
        .await
    }

    async fn rollouts(&self, ns: &str, limit: u32) -> Result<Vec<Rollout>> {
        self.read(|c| {
            rollouts_where(
                c,
                "WHERE namespace_id = ?1 ORDER BY id DESC LIMIT ?2",
                params![ns, limit],
            )
        })
        .await
    }

    async fn rollouts_to_advance(&self) -> Result<Vec<Rollout>> {
        self.read(|c| {
            rollouts_where(
                c,
                &format!(
                    "WHERE r.state IN {}
                       OR EXISTS (SELECT 1 FROM rollout_agents a WHERE a.rollout_id = r.id AND a.state = 'deploying')
                     ORDER BY id",
                    open_list()
                ),
                [],
            )
        })
        .await
    }

    async fn rollout_counts(&self) -> Result<Vec<(String, i64)>> {
        self.read(|c| {
            let mut st = c.prepare("SELECT state, COUNT(*) FROM rollouts GROUP BY state")?;
            let rows = st.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?;
            Ok(rows.collect::<rusqlite::Result<_>>()?)
        })
        .await
    }

    async fn open_rollout_of(&self, ns: &str, agent: &str) -> Result<Option<i64>> {
        self.read(|c| open_rollout_of(c, ns, agent)).await
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
        self.transact(None, |tx| {
            Ok(tx.execute(
                "UPDATE rollouts SET state = ?4, wave = ?5, next_wave_at_ms = ?6, message = COALESCE(?7, message), updated_at = ?8
                 WHERE id = ?1 AND state = ?2 AND wave = ?3",
                params![id, expected.0.as_str(), expected.1, state.as_str(), wave, next_wave_at_ms, message, now],
            )? > 0)
        })
        .await
    }

    async fn rollout_next_wave_ms(&self, id: i64) -> Result<Option<i64>> {
        self.read(|c| {
            Ok(c.query_row(
                "SELECT next_wave_at_ms FROM rollouts WHERE id = ?1",
                [id],
                |r| r.get(0),
            )
            .optional()?
            .flatten())
        })
        .await
    }

    async fn start_rollout_deploy(&self, rollout: i64, rev: &mut Revision) -> Result<Option<i64>> {
        let started = self
            .transact(None, |tx| {
                let pending: Option<i64> = tx
                    .query_row(
                        "SELECT 1 FROM rollout_agents a JOIN rollouts r ON r.id = a.rollout_id
                         WHERE a.rollout_id = ?1 AND a.agent_id = ?2 AND a.state = 'pending' AND r.state = 'running'",
                        params![rollout, rev.agent_id.as_str()],
                        |r| r.get(0),
                    )
                    .optional()?;
                if pending.is_none() {
                    return Ok(None);
                }
                tx.execute(
                    "UPDATE agents SET configuration_id = ?3 WHERE namespace_id = ?1 AND id = ?2",
                    params![rev.namespace_id.as_str(), rev.agent_id.as_str(), rev.configuration_id.as_str()],
                )?;
                let work = revisions::insert_revision(tx, rev)?;
                tx.execute(
                    "UPDATE rollout_agents SET state = 'deploying', revision_id = ?3, work_id = ?4, started_at = ?5
                     WHERE rollout_id = ?1 AND agent_id = ?2",
                    params![rollout, rev.agent_id.as_str(), rev.id.as_str(), work, now_ms() / 1000],
                )?;
                Ok(Some(work))
            })
            .await?;
        if started.is_some() {
            self.wake.notify_one();
        }
        Ok(started)
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
        self.transact(None, |tx| {
            Ok(tx.execute(
                "UPDATE rollout_agents SET state = ?4, code = ?5, message = ?6, finished_at = ?7
                 WHERE rollout_id = ?1 AND agent_id = ?2 AND state = ?3",
                params![
                    rollout,
                    agent,
                    from.as_str(),
                    state.as_str(),
                    code,
                    message,
                    now
                ],
            )? > 0)
        })
        .await
    }

    async fn skip_pending_rollout_agents(
        &self,
        rollout: i64,
        (code, message): (&str, &str),
        now: i64,
    ) -> Result<usize> {
        self.transact(None, |tx| {
            Ok(tx.execute(
                "UPDATE rollout_agents SET state = 'skipped', code = ?2, message = ?3, finished_at = ?4
                 WHERE rollout_id = ?1 AND state = 'pending'",
                params![rollout, code, message, now],
            )?)
        })
        .await
    }
}
