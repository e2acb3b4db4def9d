//! Enrolled hosts and their pinned keys.

use async_trait::async_trait;
use rusqlite::{Connection, OptionalExtension, Row, params};
use serde_json::Value;

use super::{SqliteStore, id_col, json_col};
use crate::model::{Fencing, Host};
use crate::{HostStore, Result};

const HOST_COLS: &str = "name, address, port, host_key, fingerprint, max_agents, enrolled_at, last_probe, login_user, jump";

fn host_row(r: &Row<'_>) -> rusqlite::Result<(Host, Option<String>, Option<String>)> {
    Ok((
        Host {
            name: id_col(r, 0)?,
            address: r.get(1)?,
            port: r.get(2)?,
            host_key: r.get(3)?,
            fingerprint: r.get(4)?,
            max_agents: r.get(5)?,
            enrolled_at: r.get(6)?,
            last_probe: None,
            login_user: r.get(8)?,
            jump: None,
            fencing: Fencing::Unknown,
        },
        r.get(7)?,
        r.get(9)?,
    ))
}

fn finish_host((mut h, probe, jump): (Host, Option<String>, Option<String>)) -> Result<Host> {
    h.last_probe = probe.map(json_col).transpose()?;
    h.jump = crate::jump_of(jump)?;
    Ok(h.with_fencing())
}

/// One enrolled host, on a read connection or inside the writer's transaction.
pub(super) fn host(c: &Connection, name: &str) -> Result<Option<Host>> {
    c.prepare_cached(&format!("SELECT {HOST_COLS} FROM hosts WHERE name = ?1"))?
        .query_row([name], host_row)
        .optional()?
        .map(finish_host)
        .transpose()
}

/// The enrolled hosts among `names`, in that order, with their Agent counts (for placement,
/// on a read connection or inside the writer's transaction).
pub(super) fn loads(c: &Connection, names: &[String]) -> Result<Vec<(Host, u32)>> {
    let mut host_st =
        c.prepare_cached(&format!("SELECT {HOST_COLS} FROM hosts WHERE name = ?1"))?;
    let mut load_st = c.prepare_cached("SELECT COUNT(*) FROM agents WHERE host_name = ?1")?;
    let mut out = Vec::with_capacity(names.len());
    for name in names {
        let Some(h) = host_st.query_row([name], host_row).optional()? else {
            continue;
        };
        let load: u32 = load_st.query_row([name], |r| r.get(0))?;
        out.push((finish_host(h)?, load));
    }
    Ok(out)
}

#[async_trait]
impl HostStore for SqliteStore {
    async fn insert_host(&self, h: &Host) -> Result<bool> {
        self.transact(None, |tx| {
            Ok(tx.execute(
                "INSERT OR IGNORE INTO hosts (name, address, port, host_key, fingerprint, max_agents, enrolled_at, login_user, jump)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
                params![h.name.as_str(), h.address, h.port, h.host_key, h.fingerprint, h.max_agents, h.enrolled_at, h.login_user, crate::jump_text(h)?],
            )? > 0)
        })
        .await
    }

    async fn update_host(&self, h: &Host) -> Result<bool> {
        self.transact(None, |tx| {
            Ok(tx.execute(
                "UPDATE hosts SET address = ?2, port = ?3, host_key = ?4, fingerprint = ?5, max_agents = ?6, last_probe = NULL,
                     login_user = ?7, jump = ?8 WHERE name = ?1",
                params![h.name.as_str(), h.address, h.port, h.host_key, h.fingerprint, h.max_agents, h.login_user, crate::jump_text(h)?],
            )? > 0)
        })
        .await
    }

    async fn delete_host(&self, name: &str) -> Result<Option<bool>> {
        self.transact(None, |tx| {
            let exists: i64 =
                tx.query_row("SELECT COUNT(*) FROM hosts WHERE name = ?1", [name], |r| {
                    r.get(0)
                })?;
            if exists == 0 {
                return Ok(None);
            }
            let used: i64 = tx.query_row(
                "SELECT (SELECT COUNT(*) FROM namespace_hosts WHERE host_name = ?1) + (SELECT COUNT(*) FROM agents WHERE host_name = ?1)",
                [name],
                |r| r.get(0),
            )?;
            if used > 0 {
                return Ok(Some(false));
            }
            tx.execute("DELETE FROM hosts WHERE name = ?1", [name])?;
            Ok(Some(true))
        })
        .await
    }

    async fn host(&self, name: &str) -> Result<Option<Host>> {
        self.read(|c| host(c, name)).await
    }

    async fn hosts(&self) -> Result<Vec<Host>> {
        self.read(|c| {
            let mut st = c.prepare(&format!("SELECT {HOST_COLS} FROM hosts ORDER BY name"))?;
            let rows = st.query_map([], host_row)?;
            rows.map(|r| finish_host(r?)).collect()
        })
        .await
    }

    async fn set_host_probe(&self, name: &str, probe: &Value) -> Result<()> {
        self.transact(None, |tx| {
            tx.execute(
                "UPDATE hosts SET last_probe = ?2 WHERE name = ?1",
                params![name, probe.to_string()],
            )?;
            Ok(())
        })
        .await
    }

    async fn agents_on_host(&self, name: &str) -> Result<u32> {
        self.read(|c| {
            Ok(c.query_row(
                "SELECT COUNT(*) FROM agents WHERE host_name = ?1",
                [name],
                |r| r.get(0),
            )?)
        })
        .await
    }

    async fn host_loads(&self, names: &[String]) -> Result<Vec<(Host, u32)>> {
        let names = names.to_vec();
        self.read(move |c| loads(c, &names)).await
    }
}
