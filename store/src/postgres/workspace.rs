//! Initial workspace files of Agents (see `store/src/sqlite/workspace.rs` for what is kept and
//! for how long). Dropping contents rewrites the table (`VACUUM FULL`), so no dead row
//! version keeps them in the table's files; PostgreSQL's WAL and any base backups still hold
//! them until the server recycles those, which the operator guide says.

use async_trait::async_trait;
use clawfleet_protocol::workspace::{WorkspaceFile, WorkspaceName};

use super::{Cached, PostgresStore, Tx, claimed_execute, id_col, narrow};
use crate::model::{Agent, WorkspaceFileInfo, WorkspaceSetupInfo, WorkspaceState};
use crate::seal::{self, Sealer};
use crate::{Claim, Result, StoreError, WorkspaceStore};

/// Stores an Agent's files inside the transaction that inserts the Agent.
pub(super) async fn insert_files(
    tx: &Tx<'_>,
    sealer: &Sealer,
    a: &Agent,
    files: &[WorkspaceFile],
    now: i64,
) -> Result<()> {
    tx.exec(
        "INSERT INTO agent_workspace (namespace_id, agent_id, state, updated_at) VALUES ($1, $2, $3, $4)",
        &[
            &a.namespace_id.as_str(),
            &a.id.as_str(),
            &WorkspaceState::Pending.as_str(),
            &now,
        ],
    )
    .await?;
    for f in files {
        let meta = f.meta();
        let sealed = sealer.seal(
            &seal::workspace_context(a.namespace_id.as_str(), a.id.as_str(), meta.name.as_str()),
            &f.content,
        )?;
        tx.exec(
            "INSERT INTO agent_workspace_files (namespace_id, agent_id, name, size, sha256, content, sealed)
             VALUES ($1, $2, $3, $4, $5, $6, TRUE)",
            &[
                &a.namespace_id.as_str(),
                &a.id.as_str(),
                &meta.name.as_str(),
                &(meta.size as i64),
                &meta.sha256.as_str(),
                &sealed,
            ],
        )
        .await?;
    }
    Ok(())
}

#[async_trait]
impl WorkspaceStore for PostgresStore {
    async fn workspace_setup(&self, ns: &str, agent: &str) -> Result<Option<WorkspaceSetupInfo>> {
        let mut c = self.client().await?;
        // Most Agents have no workspace files: one statement tells, without a transaction.
        let any = c
            .opt(
                "SELECT 1 FROM agent_workspace WHERE namespace_id = $1 AND agent_id = $2",
                &[&ns, &agent],
            )
            .await?;
        if any.is_none() {
            return Ok(None);
        }
        // The state and the files from one snapshot.
        let tx = c
            .build_transaction()
            .isolation_level(tokio_postgres::IsolationLevel::RepeatableRead)
            .read_only(true)
            .start()
            .await?;
        let Some(r) = tx
            .opt(
                "SELECT state, applied_at, failure_code, failure_message, updated_at FROM agent_workspace
                 WHERE namespace_id = $1 AND agent_id = $2",
                &[&ns, &agent],
            )
            .await?
        else {
            return Ok(None);
        };
        let state: String = r.try_get(0)?;
        let files = tx
            .rows(
                "SELECT name, size, sha256, content IS NOT NULL FROM agent_workspace_files
                 WHERE namespace_id = $1 AND agent_id = $2 ORDER BY name",
                &[&ns, &agent],
            )
            .await?
            .iter()
            .map(|f| {
                Ok(WorkspaceFileInfo {
                    name: id_col(f, 0)?,
                    size: narrow(f.try_get::<_, i64>(1)?.max(0), "file size")?,
                    sha256: id_col(f, 2)?,
                    content_held: f.try_get(3)?,
                })
            })
            .collect::<Result<_>>()?;
        Ok(Some(WorkspaceSetupInfo {
            state: WorkspaceState::parse(&state)
                .ok_or_else(|| StoreError::Corrupt(format!("workspace state {state:?}")))?,
            applied_at: r.try_get(1)?,
            failure_code: r.try_get(2)?,
            failure_message: r.try_get(3)?,
            updated_at: r.try_get(4)?,
            files,
        }))
    }

    async fn workspace_contents(&self, ns: &str, agent: &str) -> Result<Vec<WorkspaceFile>> {
        let c = self.client().await?;
        c.rows(
            "SELECT name, content, sealed FROM agent_workspace_files
             WHERE namespace_id = $1 AND agent_id = $2 AND content IS NOT NULL ORDER BY name",
            &[&ns, &agent],
        )
        .await?
        .iter()
        .map(|r| {
            let name: String = r.try_get(0)?;
            let content: Vec<u8> = r.try_get(1)?;
            let content = if r.try_get::<_, bool>(2)? {
                self.sealer
                    .open(&seal::workspace_context(ns, agent, &name), &content)?
            } else {
                content
            };
            Ok(WorkspaceFile {
                name: WorkspaceName::new(name)
                    .map_err(|e| StoreError::Corrupt(format!("workspace file name: {e}")))?,
                content,
            })
        })
        .collect()
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
        claimed_execute(
            self,
            claim,
            "UPDATE agent_workspace SET state = $3,
                applied_at = CASE WHEN $3 = 'applied' THEN COALESCE(applied_at, $4) ELSE applied_at END,
                failure_code = $5, failure_message = $6, updated_at = $4
             WHERE namespace_id = $1 AND agent_id = $2",
            &[&ns, &agent, &state.as_str(), &now, &code, &message],
        )
        .await?;
        Ok(())
    }

    async fn drop_workspace_contents(&self, claim: &Claim, ns: &str, agent: &str) -> Result<usize> {
        let n = claimed_execute(
            self,
            claim,
            "UPDATE agent_workspace_files SET content = NULL
             WHERE namespace_id = $1 AND agent_id = $2 AND content IS NOT NULL",
            &[&ns, &agent],
        )
        .await?;
        if n > 0 {
            let c = self.client().await?;
            c.batch_execute("VACUUM FULL agent_workspace_files").await?;
        }
        narrow(n as i64, "workspace files dropped")
    }
}
