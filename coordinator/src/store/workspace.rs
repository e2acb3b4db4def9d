//! Initial workspace files of Agents: the setup state per Agent and, per file, its name, size,
//! digest and (until an activation succeeded after the target applied them) its content. The
//! content is read only by the worker for a prepare; nothing else returns it.

use clawfleet_protocol::workspace::{WorkspaceFile, WorkspaceName};
use rusqlite::{OptionalExtension, params};

use super::{Result, Store, StoreError};
use crate::model::{Agent, WorkspaceFileInfo, WorkspaceSetupInfo, WorkspaceState};

impl Store {
    /// Inserts an Agent with its initial workspace files in one transaction; false (and
    /// nothing written) when the Agent exists.
    pub fn insert_agent_with_workspace(
        &self,
        a: &Agent,
        files: &[WorkspaceFile],
        now: i64,
    ) -> Result<bool> {
        let mut c = self.c();
        let tx = c.transaction()?;
        let inserted = tx.execute(
            "INSERT OR IGNORE INTO agents (namespace_id, id, service_principal_id, configuration_id, desired_state, created_at, restore)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
            params![a.namespace_id, a.id, a.service_principal_id, a.configuration_id, a.desired_state.as_str(), a.created_at, a.restore.as_str()],
        )? > 0;
        if !inserted {
            return Ok(false);
        }
        if !files.is_empty() {
            tx.execute(
                "INSERT INTO agent_workspace (namespace_id, agent_id, state, updated_at) VALUES (?1, ?2, ?3, ?4)",
                params![a.namespace_id, a.id, WorkspaceState::Pending.as_str(), now],
            )?;
            for f in files {
                let meta = f.meta();
                tx.execute(
                    "INSERT INTO agent_workspace_files (namespace_id, agent_id, name, size, sha256, content)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                    params![a.namespace_id, a.id, meta.name.as_str(), meta.size as i64, meta.sha256.as_str(), f.content],
                )?;
            }
        }
        tx.commit()?;
        Ok(true)
    }

    /// The Agent's workspace setup, or `None` when it was created without files.
    pub fn workspace_setup(&self, ns: &str, agent: &str) -> Result<Option<WorkspaceSetupInfo>> {
        let c = self.c();
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
        let state = WorkspaceState::parse(&state)
            .ok_or_else(|| StoreError::Corrupt(format!("workspace state {state:?}")))?;
        let mut stmt = c.prepare(
            "SELECT name, size, sha256, content IS NOT NULL FROM agent_workspace_files
             WHERE namespace_id = ?1 AND agent_id = ?2 ORDER BY name",
        )?;
        let files = stmt
            .query_map(params![ns, agent], |r| {
                Ok(WorkspaceFileInfo {
                    name: r.get(0)?,
                    size: r.get::<_, i64>(1)?.max(0) as u64,
                    sha256: r.get(2)?,
                    content_held: r.get(3)?,
                })
            })?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        Ok(Some(WorkspaceSetupInfo {
            state,
            applied_at,
            failure_code,
            failure_message,
            updated_at,
            files,
        }))
    }

    /// The contents still held, in name order (empty once dropped).
    pub fn workspace_contents(&self, ns: &str, agent: &str) -> Result<Vec<WorkspaceFile>> {
        let c = self.c();
        let mut stmt = c.prepare(
            "SELECT name, content FROM agent_workspace_files
             WHERE namespace_id = ?1 AND agent_id = ?2 AND content IS NOT NULL ORDER BY name",
        )?;
        let rows = stmt
            .query_map(params![ns, agent], |r| {
                Ok((r.get::<_, String>(0)?, r.get::<_, Vec<u8>>(1)?))
            })?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        rows.into_iter()
            .map(|(name, content)| {
                let name = WorkspaceName::new(name)
                    .map_err(|e| StoreError::Corrupt(format!("workspace file name: {e}")))?;
                Ok(WorkspaceFile { name, content })
            })
            .collect()
    }

    /// Records the target's answer: applied (at `now`, unless already recorded) or failed.
    pub fn set_workspace_state(
        &self,
        ns: &str,
        agent: &str,
        state: WorkspaceState,
        failure: Option<(&str, &str)>,
        now: i64,
    ) -> Result<()> {
        let (code, message) = failure.unzip();
        self.c().execute(
            "UPDATE agent_workspace SET state = ?3,
                applied_at = CASE WHEN ?3 = 'applied' THEN COALESCE(applied_at, ?4) ELSE applied_at END,
                failure_code = ?5, failure_message = ?6, updated_at = ?4
             WHERE namespace_id = ?1 AND agent_id = ?2",
            params![ns, agent, state.as_str(), now, code, message],
        )?;
        Ok(())
    }

    /// Forgets the contents (names, sizes and digests stay); the number of files dropped.
    /// With `secure_delete` the freed pages are zeroed, and the checkpoint moves them into the
    /// database file and truncates the WAL, so the bytes are gone from disk, not only from
    /// queries.
    pub fn drop_workspace_contents(&self, ns: &str, agent: &str) -> Result<usize> {
        let c = self.c();
        let n = c.execute(
            "UPDATE agent_workspace_files SET content = NULL
             WHERE namespace_id = ?1 AND agent_id = ?2 AND content IS NOT NULL",
            params![ns, agent],
        )?;
        if n > 0 {
            c.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))?;
        }
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{DesiredState, RestorePolicy};
    use clawfleet_protocol::FailureCode;

    fn agent(id: &str) -> Agent {
        Agent {
            namespace_id: "ns".into(),
            id: id.into(),
            service_principal_id: format!("sp-{id}"),
            configuration_id: "cfg".into(),
            desired_state: DesiredState::Stopped,
            host: None,
            port: None,
            active_revision_id: None,
            served_revision_id: None,
            restore: RestorePolicy::None,
            created_at: 1,
        }
    }

    fn file(name: &str, content: &str) -> WorkspaceFile {
        WorkspaceFile {
            name: WorkspaceName::new(name).unwrap(),
            content: content.as_bytes().to_vec(),
        }
    }

    #[test]
    fn files_are_stored_with_the_agent_and_their_contents_can_be_dropped() {
        let s = Store::in_memory().unwrap();
        s.c()
            .execute_batch("INSERT INTO namespaces (id, name, created_at) VALUES ('ns', 'ns', 1);")
            .unwrap();
        let files = [file("b.md", "bee"), file("a.md", "ay")];
        assert!(
            s.insert_agent_with_workspace(&agent("a1"), &files, 5)
                .unwrap()
        );
        // A second create stores nothing more.
        assert!(
            !s.insert_agent_with_workspace(&agent("a1"), &[file("c.md", "x")], 6)
                .unwrap()
        );
        let info = s.workspace_setup("ns", "a1").unwrap().unwrap();
        assert_eq!(info.state, WorkspaceState::Pending);
        let names: Vec<&str> = info.files.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(names, ["a.md", "b.md"]);
        assert!(info.files.iter().all(|f| f.content_held));
        assert_eq!(s.workspace_contents("ns", "a1").unwrap()[1].content, b"bee");
        s.set_workspace_state(
            "ns",
            "a1",
            WorkspaceState::Failed,
            Some((FailureCode::WorkspaceSetupFailed.as_str(), "a link")),
            7,
        )
        .unwrap();
        let info = s.workspace_setup("ns", "a1").unwrap().unwrap();
        assert_eq!(
            info.failure_code.as_deref(),
            Some(FailureCode::WorkspaceSetupFailed.as_str())
        );
        s.set_workspace_state("ns", "a1", WorkspaceState::Applied, None, 8)
            .unwrap();
        s.set_workspace_state("ns", "a1", WorkspaceState::Applied, None, 9)
            .unwrap();
        let info = s.workspace_setup("ns", "a1").unwrap().unwrap();
        assert_eq!(
            (info.state, info.applied_at, info.failure_code),
            (WorkspaceState::Applied, Some(8), None)
        );
        assert_eq!(s.drop_workspace_contents("ns", "a1").unwrap(), 2);
        assert!(s.workspace_contents("ns", "a1").unwrap().is_empty());
        let info = s.workspace_setup("ns", "a1").unwrap().unwrap();
        assert!(info.files.iter().all(|f| !f.content_held && f.size > 0));
        // Without files there is no setup; deleting the Agent deletes its rows.
        assert!(s.insert_agent_with_workspace(&agent("a2"), &[], 5).unwrap());
        assert!(s.workspace_setup("ns", "a2").unwrap().is_none());
        s.delete_agent_row("ns", "a1").unwrap();
        let left: i64 = s
            .c()
            .query_row("SELECT COUNT(*) FROM agent_workspace_files", [], |r| {
                r.get(0)
            })
            .unwrap();
        assert_eq!(left, 0);
    }
}
