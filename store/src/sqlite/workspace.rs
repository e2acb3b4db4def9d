//! Initial workspace files of Agents: the setup state per Agent and, per file, its name, size,
//! digest and (until an activation succeeded after the target applied them) its content. The
//! content is read only by the worker for a prepare; nothing else returns it.

use async_trait::async_trait;
use clawfleet_protocol::workspace::{WorkspaceFile, WorkspaceName};
use rusqlite::{Connection, OptionalExtension, params};

use super::{SqliteStore, id_col, parse_col};
use crate::model::{Agent, WorkspaceFileInfo, WorkspaceSetupInfo, WorkspaceState};
use crate::seal::{self, Sealer};
use crate::{Claim, Result, StoreError, WorkspaceStore};

/// Stores an Agent's files inside the transaction that inserts the Agent.
pub(super) fn insert_files(
    tx: &Connection,
    sealer: &Sealer,
    a: &Agent,
    files: &[WorkspaceFile],
    now: i64,
) -> Result<()> {
    tx.execute(
        "INSERT INTO agent_workspace (namespace_id, agent_id, state, updated_at) VALUES (?1, ?2, ?3, ?4)",
        params![a.namespace_id.as_str(), a.id.as_str(), WorkspaceState::Pending.as_str(), now],
    )?;
    for f in files {
        let meta = f.meta();
        let sealed = sealer.seal(
            &seal::workspace_context(a.namespace_id.as_str(), a.id.as_str(), meta.name.as_str()),
            &f.content,
        )?;
        tx.execute(
            "INSERT INTO agent_workspace_files (namespace_id, agent_id, name, size, sha256, content, sealed)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, 1)",
            params![a.namespace_id.as_str(), a.id.as_str(), meta.name.as_str(), meta.size as i64, meta.sha256.as_str(), sealed],
        )?;
    }
    Ok(())
}

#[async_trait]
impl WorkspaceStore for SqliteStore {
    async fn workspace_setup(&self, ns: &str, agent: &str) -> Result<Option<WorkspaceSetupInfo>> {
        self.read(|c| {
            let row = c
                .query_row(
                    "SELECT state, applied_at, failure_code, failure_message, updated_at FROM agent_workspace
                     WHERE namespace_id = ?1 AND agent_id = ?2",
                    params![ns, agent],
                    |r| {
                        Ok((
                            r.get::<_, String>(0)?,
                            r.get::<_, Option<i64>>(1)?,
                            r.get::<_, Option<String>>(2)?,
                            r.get::<_, Option<String>>(3)?,
                            r.get::<_, i64>(4)?,
                        ))
                    },
                )
                .optional()?;
            let Some((state, applied_at, failure_code, failure_message, updated_at)) = row else {
                return Ok(None);
            };
            let mut stmt = c.prepare(
                "SELECT name, size, sha256, content IS NOT NULL FROM agent_workspace_files
                 WHERE namespace_id = ?1 AND agent_id = ?2 ORDER BY name",
            )?;
            let files = stmt
                .query_map(params![ns, agent], |r| {
                    Ok(WorkspaceFileInfo {
                        name: id_col(r, 0)?,
                        size: r.get::<_, i64>(1)?.max(0) as u64,
                        sha256: id_col(r, 2)?,
                        content_held: r.get(3)?,
                    })
                })?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            Ok(Some(WorkspaceSetupInfo {
                state: parse_col(&state, "workspace state", WorkspaceState::parse)?,
                applied_at,
                failure_code,
                failure_message,
                updated_at,
                files,
            }))
        })
        .await
    }

    async fn workspace_contents(&self, ns: &str, agent: &str) -> Result<Vec<WorkspaceFile>> {
        self.read(|c| {
            let mut stmt = c.prepare(
                "SELECT name, content, sealed FROM agent_workspace_files
                 WHERE namespace_id = ?1 AND agent_id = ?2 AND content IS NOT NULL ORDER BY name",
            )?;
            let rows = stmt
                .query_map(params![ns, agent], |r| {
                    Ok((
                        r.get::<_, String>(0)?,
                        r.get::<_, Vec<u8>>(1)?,
                        r.get::<_, bool>(2)?,
                    ))
                })?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            rows.into_iter()
                .map(|(name, content, sealed)| {
                    let content = if sealed {
                        self.sealer
                            .open(&seal::workspace_context(ns, agent, &name), &content)?
                    } else {
                        content
                    };
                    let name = WorkspaceName::new(name)
                        .map_err(|e| StoreError::Corrupt(format!("workspace file name: {e}")))?;
                    Ok(WorkspaceFile { name, content })
                })
                .collect()
        })
        .await
    }

    async fn set_workspace_state(
        &self,
        claim: &Claim,
        ns: &str,
        agent: &str,
        state: WorkspaceState,
        failure: Option<(&str, &str)>,
        now: i64,
    ) -> Result<()> {
        let (code, message) = failure.unzip();
        self.transact(Some(claim), |tx| {
            tx.execute(
                "UPDATE agent_workspace SET state = ?3,
                    applied_at = CASE WHEN ?3 = 'applied' THEN COALESCE(applied_at, ?4) ELSE applied_at END,
                    failure_code = ?5, failure_message = ?6, updated_at = ?4
                 WHERE namespace_id = ?1 AND agent_id = ?2",
                params![ns, agent, state.as_str(), now, code, message],
            )?;
            Ok(())
        })
        .await
    }

    /// With `secure_delete` the freed pages are zeroed, and the checkpoint moves them into
    /// the database file and truncates the WAL, so the bytes are gone from disk, not only from
    /// queries.
    async fn drop_workspace_contents(&self, claim: &Claim, ns: &str, agent: &str) -> Result<usize> {
        let n = self
            .transact(Some(claim), |tx| {
                Ok(tx.execute(
                    "UPDATE agent_workspace_files SET content = NULL
                     WHERE namespace_id = ?1 AND agent_id = ?2 AND content IS NOT NULL",
                    params![ns, agent],
                )?)
            })
            .await?;
        if n > 0 {
            self.write(|c| {
                c.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))?;
                Ok(())
            })
            .await?;
        }
        Ok(n)
    }
}
