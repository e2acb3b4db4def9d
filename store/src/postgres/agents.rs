//! Agents: desired state, placement, the active revision and what the target reports.

use async_trait::async_trait;
use clawfleet_protocol::egress::Egress;
use clawfleet_protocol::workspace::WorkspaceFile;
use tokio_postgres::Row;

use super::hosts::HOST_COLS;
use super::{
    Cached, PostgresStore, claim_cte, claimed_execute, id_col, narrow, opt_id_col, work, workspace,
};
use crate::model::{Agent, DesiredState, Host, RestorePolicy};
use crate::{AgentStore, Claim, Enqueue, Result, StoreError};

const AGENT_COLS: &str = "namespace_id, id, service_principal_id, configuration_id, desired_state, host_name, port, active_revision_id, served_revision_id, created_at, restore, egress";

pub(super) fn agent(r: &Row) -> Result<Agent> {
    let desired: String = r.try_get(4)?;
    let restore: String = r.try_get(10)?;
    Ok(Agent {
        namespace_id: id_col(r, 0)?,
        id: id_col(r, 1)?,
        service_principal_id: id_col(r, 2)?,
        configuration_id: id_col(r, 3)?,
        desired_state: DesiredState::parse(&desired)
            .ok_or_else(|| StoreError::Corrupt(format!("desired state {desired:?}")))?,
        host: r.try_get(5)?,
        port: r
            .try_get::<_, Option<i64>>(6)?
            .map(|p| narrow(p, "Agent port"))
            .transpose()?,
        active_revision_id: opt_id_col(r, 7)?,
        served_revision_id: opt_id_col(r, 8)?,
        restore: RestorePolicy::parse(&restore)
            .ok_or_else(|| StoreError::Corrupt(format!("restore policy {restore:?}")))?,
        created_at: r.try_get(9)?,
        egress: crate::egress_of(r.try_get(11)?)?,
    })
}

#[async_trait]
impl AgentStore for PostgresStore {
    async fn insert_agent(&self, a: &Agent, files: &[WorkspaceFile], now: i64) -> Result<bool> {
        let egress = crate::egress_text(a.egress.as_ref())?;
        let mut c = self.client().await?;
        let tx = c.transaction().await?;
        let inserted = tx
            .exec(
                "INSERT INTO agents (namespace_id, id, service_principal_id, configuration_id, desired_state, created_at, restore, egress)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8) ON CONFLICT (namespace_id, id) DO NOTHING",
                &[
                    &a.namespace_id.as_str(),
                    &a.id.as_str(),
                    &a.service_principal_id.as_str(),
                    &a.configuration_id.as_str(),
                    &a.desired_state.as_str(),
                    &a.created_at,
                    &a.restore.as_str(),
                    &egress,
                ],
            )
            .await?
            > 0;
        if inserted && !files.is_empty() {
            workspace::insert_files(&tx, &self.sealer, a, files, now).await?;
        }
        tx.commit().await?;
        Ok(inserted)
    }

    async fn agent(&self, ns: &str, id: &str) -> Result<Option<Agent>> {
        let c = self.client().await?;
        c.opt(
            &format!("SELECT {AGENT_COLS} FROM agents WHERE namespace_id = $1 AND id = $2"),
            &[&ns, &id],
        )
        .await?
        .as_ref()
        .map(agent)
        .transpose()
    }

    async fn agents(&self, ns: &str) -> Result<Vec<Agent>> {
        let c = self.client().await?;
        c.rows(
            &format!("SELECT {AGENT_COLS} FROM agents WHERE namespace_id = $1 ORDER BY id"),
            &[&ns],
        )
        .await?
        .iter()
        .map(agent)
        .collect()
    }

    async fn agents_after(&self, ns: &str, after: Option<&str>, limit: u32) -> Result<Vec<Agent>> {
        let c = self.client().await?;
        let limit = i64::from(limit);
        c.rows(
            &format!(
                "SELECT {AGENT_COLS} FROM agents WHERE namespace_id = $1 AND id COLLATE \"C\" > $2 ORDER BY id COLLATE \"C\" LIMIT $3"
            ),
            &[&ns, &after.unwrap_or(""), &limit],
        )
        .await?
        .iter()
        .map(agent)
        .collect()
    }

    async fn set_agent_restore(&self, ns: &str, id: &str, restore: RestorePolicy) -> Result<()> {
        let c = self.client().await?;
        c.exec(
            "UPDATE agents SET restore = $3 WHERE namespace_id = $1 AND id = $2",
            &[&ns, &id, &restore.as_str()],
        )
        .await?;
        Ok(())
    }

    async fn set_agent_egress(&self, ns: &str, id: &str, egress: Option<&Egress>) -> Result<()> {
        let egress = crate::egress_text(egress)?;
        let c = self.client().await?;
        c.exec(
            "UPDATE agents SET egress = $3 WHERE namespace_id = $1 AND id = $2",
            &[&ns, &id, &egress],
        )
        .await?;
        Ok(())
    }

    async fn set_agent_configuration(
        &self,
        ns: &str,
        id: &str,
        configuration_id: &str,
    ) -> Result<()> {
        let c = self.client().await?;
        c.exec(
            "UPDATE agents SET configuration_id = $3 WHERE namespace_id = $1 AND id = $2",
            &[&ns, &id, &configuration_id],
        )
        .await?;
        Ok(())
    }

    async fn set_desired(
        &self,
        ns: &str,
        id: &str,
        desired: DesiredState,
        then: Option<&Enqueue>,
    ) -> Result<Option<i64>> {
        let mut c = self.client().await?;
        let tx = c.transaction().await?;
        tx.exec(
            "UPDATE agents SET desired_state = $3 WHERE namespace_id = $1 AND id = $2",
            &[&ns, &id, &desired.as_str()],
        )
        .await?;
        let queued = match then {
            Some(w) => Some(work::enqueue(&tx, w).await?),
            None => None,
        };
        tx.commit().await?;
        if queued.is_some() {
            self.wake_local();
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
        // One statement: the claim check (its row lock held to the end), the choice (the rule
        // of `targets::least_loaded_of`: fewest Agents among hosts with room, then the order
        // given), the placement if the Agent has none yet, and the row of the host it has
        // now (the update's, or the one it had).
        static PLACE: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
            format!(
                "WITH {},
                 choice AS MATERIALIZED (
                   SELECT h.name FROM hosts h
                   CROSS JOIN LATERAL (SELECT COUNT(*) AS load FROM agents a WHERE a.host_name = h.name) l
                   WHERE h.name = ANY($3) AND l.load < h.max_agents
                   ORDER BY l.load, array_position($3, h.name) LIMIT 1),
                 placed AS (
                   UPDATE agents SET host_name = (SELECT name FROM choice)
                   WHERE namespace_id = $1 AND id = $2 AND host_name IS NULL
                     AND EXISTS (SELECT 1 FROM claim) AND EXISTS (SELECT 1 FROM choice)
                   RETURNING host_name)
                 SELECT {HOST_COLS}, EXISTS (SELECT 1 FROM claim)
                 FROM (SELECT 1) one LEFT JOIN hosts ON hosts.name = COALESCE(
                   (SELECT host_name FROM placed),
                   (SELECT host_name FROM agents WHERE namespace_id = $1 AND id = $2))",
                claim_cte(4, 5)
            )
        });
        let c = self.client().await?;
        let row = c
            .one(&PLACE, &[&ns, &id, &candidates, &claim.work, &claim.token])
            .await?;
        if !row.try_get::<_, bool>(10)? {
            return Err(claim.lost());
        }
        if row.try_get::<_, Option<String>>(0)?.is_none() {
            return Ok(None);
        }
        Ok(Some(super::hosts::host(&row)?))
    }

    async fn set_agent_observed(
        &self,
        claim: &Claim,
        ns: &str,
        id: &str,
        port: Option<u16>,
        served: Option<&str>,
    ) -> Result<()> {
        claimed_execute(
            self,
            claim,
            "UPDATE agents SET port = COALESCE($3, port), served_revision_id = $4 WHERE namespace_id = $1 AND id = $2",
            &[&ns, &id, &port.map(i64::from), &served],
        )
        .await?;
        Ok(())
    }

    async fn cas_active_revision(
        &self,
        claim: &Claim,
        ns: &str,
        id: &str,
        expected: Option<&str>,
        new: Option<&str>,
    ) -> Result<bool> {
        Ok(claimed_execute(
            self,
            claim,
            "UPDATE agents SET active_revision_id = $4
             WHERE namespace_id = $1 AND id = $2 AND active_revision_id IS NOT DISTINCT FROM $3",
            &[&ns, &id, &expected, &new],
        )
        .await?
            > 0)
    }

    async fn delete_agent_row(&self, claim: &Claim, ns: &str, id: &str) -> Result<()> {
        claimed_execute(
            self,
            claim,
            "DELETE FROM agents WHERE namespace_id = $1 AND id = $2",
            &[&ns, &id],
        )
        .await?;
        Ok(())
    }
}
