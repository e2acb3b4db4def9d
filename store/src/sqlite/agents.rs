//! Agents: desired state, placement, the active revision and what the target reports.

use async_trait::async_trait;
use clawfleet_protocol::egress::Egress;
use clawfleet_protocol::workspace::WorkspaceFile;
use rusqlite::{OptionalExtension, Row, params};

use super::{SqliteStore, id_col, opt_id_col, parse_col, work, workspace};
use crate::model::{Agent, DesiredState, Host, RestorePolicy};
use crate::{AgentStore, Claim, Enqueue, Result};

const AGENT_COLS: &str = "namespace_id, id, service_principal_id, configuration_id, desired_state, host_name, port, active_revision_id, served_revision_id, created_at, restore, egress";

/// An Agent's row, with its desired state, restore policy and egress as stored (checked by
/// [`finish_agent`]).
type AgentRow = (Agent, String, String, Option<String>);

fn agent_row(r: &Row<'_>) -> rusqlite::Result<AgentRow> {
    Ok((
        Agent {
            namespace_id: id_col(r, 0)?,
            id: id_col(r, 1)?,
            service_principal_id: id_col(r, 2)?,
            configuration_id: id_col(r, 3)?,
            desired_state: DesiredState::Running,
            host: r.get(5)?,
            port: r.get(6)?,
            active_revision_id: opt_id_col(r, 7)?,
            served_revision_id: opt_id_col(r, 8)?,
            restore: RestorePolicy::None,
            created_at: r.get(9)?,
            egress: None,
        },
        r.get(4)?,
        r.get(10)?,
        r.get(11)?,
    ))
}

fn finish_agent((mut a, desired, restore, egress): AgentRow) -> Result<Agent> {
    a.desired_state = parse_col(&desired, "desired state", DesiredState::parse)?;
    a.restore = parse_col(&restore, "restore policy", RestorePolicy::parse)?;
    a.egress = crate::egress_of(egress)?;
    Ok(a)
}

/// What a target reported of an Agent (parameters: Namespace, Agent, port or NULL to keep
/// the one on record, served revision).
pub(super) const SET_OBSERVED: &str = "UPDATE agents SET port = COALESCE(?3, port), served_revision_id = ?4 WHERE namespace_id = ?1 AND id = ?2";

#[async_trait]
impl AgentStore for SqliteStore {
    async fn insert_agent(&self, a: &Agent, files: &[WorkspaceFile], now: i64) -> Result<bool> {
        let egress = crate::egress_text(a.egress.as_ref())?;
        self.transact(None, |tx| {
            let inserted = tx.execute(
                "INSERT OR IGNORE INTO agents (namespace_id, id, service_principal_id, configuration_id, desired_state, created_at, restore, egress)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
                params![a.namespace_id.as_str(), a.id.as_str(), a.service_principal_id.as_str(), a.configuration_id.as_str(), a.desired_state.as_str(), a.created_at, a.restore.as_str(), egress],
            )? > 0;
            if inserted && !files.is_empty() {
                workspace::insert_files(tx, &self.sealer, a, files, now)?;
            }
            Ok(inserted)
        })
        .await
    }

    async fn agent(&self, ns: &str, id: &str) -> Result<Option<Agent>> {
        self.read(|c| {
            c.query_row(
                &format!("SELECT {AGENT_COLS} FROM agents WHERE namespace_id = ?1 AND id = ?2"),
                params![ns, id],
                agent_row,
            )
            .optional()?
            .map(finish_agent)
            .transpose()
        })
        .await
    }

    async fn agents(&self, ns: &str) -> Result<Vec<Agent>> {
        self.read(|c| {
            let mut st = c.prepare(&format!(
                "SELECT {AGENT_COLS} FROM agents WHERE namespace_id = ?1 ORDER BY id"
            ))?;
            let rows = st.query_map([ns], agent_row)?;
            rows.map(|r| finish_agent(r?)).collect()
        })
        .await
    }

    async fn agents_after(&self, ns: &str, after: Option<&str>, limit: u32) -> Result<Vec<Agent>> {
        self.read(|c| {
            let mut st = c.prepare(&format!(
                "SELECT {AGENT_COLS} FROM agents WHERE namespace_id = ?1 AND id > ?2 ORDER BY id LIMIT ?3"
            ))?;
            let rows = st.query_map(params![ns, after.unwrap_or(""), limit], agent_row)?;
            rows.map(|r| finish_agent(r?)).collect()
        })
        .await
    }

    async fn set_agent_restore(&self, ns: &str, id: &str, restore: RestorePolicy) -> Result<()> {
        self.transact(None, |tx| {
            tx.execute(
                "UPDATE agents SET restore = ?3 WHERE namespace_id = ?1 AND id = ?2",
                params![ns, id, restore.as_str()],
            )?;
            Ok(())
        })
        .await
    }

    async fn set_agent_egress(&self, ns: &str, id: &str, egress: Option<&Egress>) -> Result<()> {
        let egress = crate::egress_text(egress)?;
        self.transact(None, |tx| {
            tx.execute(
                "UPDATE agents SET egress = ?3 WHERE namespace_id = ?1 AND id = ?2",
                params![ns, id, egress],
            )?;
            Ok(())
        })
        .await
    }

    async fn set_agent_configuration(
        &self,
        ns: &str,
        id: &str,
        configuration_id: &str,
    ) -> Result<()> {
        self.transact(None, |tx| {
            tx.execute(
                "UPDATE agents SET configuration_id = ?3 WHERE namespace_id = ?1 AND id = ?2",
                params![ns, id, configuration_id],
            )?;
            Ok(())
        })
        .await
    }

    async fn set_desired(
        &self,
        ns: &str,
        id: &str,
        desired: DesiredState,
        then: Option<&Enqueue>,
    ) -> Result<Option<i64>> {
        let queued = self
            .transact(None, |tx| {
                tx.execute(
                    "UPDATE agents SET desired_state = ?3 WHERE namespace_id = ?1 AND id = ?2",
                    params![ns, id, desired.as_str()],
                )?;
                then.map(|w| work::enqueue(tx, w)).transpose()
            })
            .await?;
        if queued.is_some() {
            self.wake.notify_one();
        }
        Ok(queued)
    }

    async fn place_agent(
        &self,
        claim: &Claim,
        ns: &str,
        id: &str,
        candidates: &[String],
    ) -> Result<Option<Host>> {
        self.transact(Some(claim), |tx| {
            let placed: Option<String> = tx
                .query_row(
                    "SELECT host_name FROM agents WHERE namespace_id = ?1 AND id = ?2",
                    params![ns, id],
                    |r| r.get(0),
                )
                .optional()?
                .flatten();
            if let Some(name) = placed {
                return super::hosts::host(tx, &name);
            }
            let Some(host) = crate::least_loaded_of(super::hosts::loads(tx, candidates)?)
            else {
                return Ok(None);
            };
            let n = tx.execute(
                "UPDATE agents SET host_name = ?3 WHERE namespace_id = ?1 AND id = ?2 AND host_name IS NULL",
                params![ns, id, host.name.as_str()],
            )?;
            Ok((n > 0).then_some(host))
        })
        .await
    }

    async fn set_agent_observed(
        &self,
        claim: &Claim,
        ns: &str,
        id: &str,
        port: Option<u16>,
        served: Option<&str>,
    ) -> Result<()> {
        self.transact(Some(claim), |tx| {
            tx.execute(SET_OBSERVED, params![ns, id, port, served])?;
            Ok(())
        })
        .await
    }

    async fn cas_active_revision(
        &self,
        claim: &Claim,
        ns: &str,
        id: &str,
        expected: Option<&str>,
        new: Option<&str>,
    ) -> Result<bool> {
        self.transact(Some(claim), |tx| {
            Ok(tx.execute(
                "UPDATE agents SET active_revision_id = ?4 WHERE namespace_id = ?1 AND id = ?2 AND active_revision_id IS ?3",
                params![ns, id, expected, new],
            )? > 0)
        })
        .await
    }

    async fn delete_agent_row(&self, claim: &Claim, ns: &str, id: &str) -> Result<()> {
        self.transact(Some(claim), |tx| {
            tx.execute(
                "DELETE FROM agents WHERE namespace_id = ?1 AND id = ?2",
                params![ns, id],
            )?;
            Ok(())
        })
        .await
    }
}
