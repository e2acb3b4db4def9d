//! Enrolled hosts and their pinned keys.

use async_trait::async_trait;
use serde_json::Value;
use tokio_postgres::Row;

use super::{Cached, PostgresStore, id_col, narrow};
use crate::model::{Fencing, Host};
use crate::{HostStore, Result, StoreError};

pub(super) const HOST_COLS: &str = "name, address, port, host_key, fingerprint, max_agents, enrolled_at, last_probe, login_user, jump";

pub(super) fn host(r: &Row) -> Result<Host> {
    Ok(Host {
        name: id_col(r, 0)?,
        address: r.try_get(1)?,
        port: narrow(r.try_get(2)?, "host port")?,
        host_key: r.try_get(3)?,
        fingerprint: r.try_get(4)?,
        max_agents: narrow(r.try_get(5)?, "host max_agents")?,
        enrolled_at: r.try_get(6)?,
        last_probe: r
            .try_get::<_, Option<String>>(7)?
            .map(|t| serde_json::from_str(&t).map_err(|e| StoreError::Corrupt(e.to_string())))
            .transpose()?,
        login_user: r.try_get(8)?,
        jump: crate::jump_of(r.try_get(9)?)?,
        fencing: Fencing::Unknown,
    }
    .with_fencing())
}

#[async_trait]
impl HostStore for PostgresStore {
    async fn insert_host(&self, h: &Host) -> Result<bool> {
        let c = self.client().await?;
        Ok(c.exec(
            "INSERT INTO hosts (name, address, port, host_key, fingerprint, max_agents, enrolled_at, login_user, jump)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) ON CONFLICT (name) DO NOTHING",
            &[
                &h.name.as_str(),
                &h.address,
                &i64::from(h.port),
                &h.host_key,
                &h.fingerprint,
                &i64::from(h.max_agents),
                &h.enrolled_at,
                &h.login_user,
                &crate::jump_text(h)?,
            ],
        )
        .await?
            > 0)
    }

    async fn update_host(&self, h: &Host) -> Result<bool> {
        let c = self.client().await?;
        Ok(c.exec(
            "UPDATE hosts SET address = $2, port = $3, host_key = $4, fingerprint = $5, max_agents = $6, last_probe = NULL,
                 login_user = $7, jump = $8 WHERE name = $1",
            &[
                &h.name.as_str(),
                &h.address,
                &i64::from(h.port),
                &h.host_key,
                &h.fingerprint,
                &i64::from(h.max_agents),
                &h.login_user,
                &crate::jump_text(h)?,
            ],
        )
        .await?
            > 0)
    }

    async fn delete_host(&self, name: &str) -> Result<Option<bool>> {
        let mut c = self.client().await?;
        let tx = c.transaction().await?;
        if tx
            .opt("SELECT 1 FROM hosts WHERE name = $1 FOR UPDATE", &[&name])
            .await?
            .is_none()
        {
            return Ok(None);
        }
        let used: i64 = tx
            .one(
                "SELECT (SELECT COUNT(*) FROM namespace_hosts WHERE host_name = $1) + (SELECT COUNT(*) FROM agents WHERE host_name = $1)",
                &[&name],
            )
            .await?
            .try_get(0)?;
        if used > 0 {
            return Ok(Some(false));
        }
        tx.exec("DELETE FROM hosts WHERE name = $1", &[&name])
            .await?;
        tx.commit().await?;
        Ok(Some(true))
    }

    async fn host(&self, name: &str) -> Result<Option<Host>> {
        let c = self.client().await?;
        c.opt(
            &format!("SELECT {HOST_COLS} FROM hosts WHERE name = $1"),
            &[&name],
        )
        .await?
        .as_ref()
        .map(host)
        .transpose()
    }

    async fn hosts(&self) -> Result<Vec<Host>> {
        let c = self.client().await?;
        c.rows(&format!("SELECT {HOST_COLS} FROM hosts ORDER BY name"), &[])
            .await?
            .iter()
            .map(host)
            .collect()
    }

    async fn set_host_probe(&self, name: &str, probe: &Value) -> Result<()> {
        let c = self.client().await?;
        c.exec(
            "UPDATE hosts SET last_probe = $2 WHERE name = $1",
            &[&name, &probe.to_string()],
        )
        .await?;
        Ok(())
    }

    async fn agents_on_host(&self, name: &str) -> Result<u32> {
        let c = self.client().await?;
        let n: i64 = c
            .one("SELECT COUNT(*) FROM agents WHERE host_name = $1", &[&name])
            .await?
            .try_get(0)?;
        narrow(n, "agent count")
    }

    async fn host_loads(&self, names: &[String]) -> Result<Vec<(Host, u32)>> {
        let c = self.client().await?;
        let rows = c
            .rows(
                &format!(
                    "SELECT {HOST_COLS}, (SELECT COUNT(*) FROM agents a WHERE a.host_name = h.name)
                     FROM hosts h WHERE h.name = ANY($1)"
                ),
                &[&names],
            )
            .await?;
        let mut found = std::collections::HashMap::new();
        for r in &rows {
            let load: i64 = r.try_get(10)?;
            let h = host(r)?;
            found.insert(h.name.to_string(), (h, narrow(load, "agent count")?));
        }
        Ok(names.iter().filter_map(|n| found.remove(n)).collect())
    }
}
