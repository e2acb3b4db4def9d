//! The state store: SQLite (bundled), WAL, versioned migrations. All SQL lives in this module so
//! a PostgreSQL implementation can follow behind the same functions.

use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};

use rusqlite::{Connection, OptionalExtension, Row, params};
use serde_json::Value;
use thiserror::Error;

mod rollouts;
mod workspace;

pub use rollouts::{RevisionInsert, RolloutInsert, RolloutRow};

use crate::model::{
    Agent, AuditEvent, Cluster, ClusterRecord, Configuration, DesiredState, Grant, Host,
    LastAttempt, Namespace, Revision, RevisionStatus, Role,
};

/// A store failure.
#[derive(Debug, Error)]
pub enum StoreError {
    #[error("database error: {0}")]
    Sql(#[from] rusqlite::Error),
    #[error("stored data is not valid: {0}")]
    Corrupt(String),
    #[error("the database schema is version {found}, newer than this coordinator ({known})")]
    TooNew { found: i64, known: i64 },
}

type Result<T> = std::result::Result<T, StoreError>;

/// Migrations, in order. Never edit a released one; add a new one.
const MIGRATIONS: &[&str] = &[
    // 1: the initial schema.
    "
    CREATE TABLE hosts (
        name TEXT PRIMARY KEY,
        address TEXT NOT NULL,
        port INTEGER NOT NULL,
        host_key TEXT NOT NULL,
        fingerprint TEXT NOT NULL,
        max_agents INTEGER NOT NULL,
        enrolled_at INTEGER NOT NULL,
        last_probe TEXT
    );
    CREATE TABLE namespaces (
        id TEXT PRIMARY KEY,
        name TEXT NOT NULL,
        deleting INTEGER NOT NULL DEFAULT 0,
        created_at INTEGER NOT NULL
    );
    CREATE TABLE namespace_hosts (
        namespace_id TEXT NOT NULL REFERENCES namespaces(id) ON DELETE CASCADE,
        host_name TEXT NOT NULL REFERENCES hosts(name),
        ready INTEGER NOT NULL DEFAULT 0,
        PRIMARY KEY (namespace_id, host_name)
    );
    CREATE TABLE configurations (
        namespace_id TEXT NOT NULL REFERENCES namespaces(id) ON DELETE CASCADE,
        id TEXT NOT NULL,
        generation INTEGER NOT NULL,
        document TEXT NOT NULL,
        created_at INTEGER NOT NULL,
        PRIMARY KEY (namespace_id, id, generation)
    );
    CREATE TABLE agents (
        namespace_id TEXT NOT NULL REFERENCES namespaces(id) ON DELETE CASCADE,
        id TEXT NOT NULL,
        service_principal_id TEXT NOT NULL,
        configuration_id TEXT NOT NULL,
        desired_state TEXT NOT NULL,
        host_name TEXT REFERENCES hosts(name),
        port INTEGER,
        active_revision_id TEXT,
        served_revision_id TEXT,
        created_at INTEGER NOT NULL,
        PRIMARY KEY (namespace_id, id)
    );
    CREATE TABLE revisions (
        namespace_id TEXT NOT NULL,
        agent_id TEXT NOT NULL,
        id TEXT NOT NULL,
        number INTEGER NOT NULL,
        configuration_id TEXT NOT NULL,
        configuration_generation INTEGER NOT NULL,
        configuration_hash TEXT NOT NULL,
        rendered TEXT NOT NULL,
        status TEXT NOT NULL,
        last_code TEXT,
        last_message TEXT,
        last_at INTEGER,
        attempts INTEGER NOT NULL DEFAULT 0,
        created_at INTEGER NOT NULL,
        PRIMARY KEY (namespace_id, agent_id, id),
        UNIQUE (namespace_id, agent_id, number),
        FOREIGN KEY (namespace_id, agent_id) REFERENCES agents(namespace_id, id) ON DELETE CASCADE
    );
    CREATE TABLE work (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        kind TEXT NOT NULL,
        namespace_id TEXT NOT NULL,
        agent_id TEXT,
        revision_id TEXT,
        state TEXT NOT NULL,
        attempts INTEGER NOT NULL DEFAULT 0,
        not_before INTEGER NOT NULL,
        lease_owner TEXT,
        lease_until INTEGER,
        last_code TEXT,
        last_message TEXT,
        created_at INTEGER NOT NULL,
        updated_at INTEGER NOT NULL
    );
    CREATE INDEX work_ready ON work(state, not_before);
    CREATE TABLE tokens (
        id TEXT PRIMARY KEY,
        name TEXT NOT NULL,
        secret_hash TEXT NOT NULL UNIQUE,
        created_at INTEGER NOT NULL,
        revoked INTEGER NOT NULL DEFAULT 0
    );
    CREATE TABLE token_grants (
        token_id TEXT NOT NULL REFERENCES tokens(id) ON DELETE CASCADE,
        namespace TEXT NOT NULL,
        role TEXT NOT NULL,
        PRIMARY KEY (token_id, namespace)
    );
    CREATE TABLE audit (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        at INTEGER NOT NULL,
        actor TEXT NOT NULL,
        action TEXT NOT NULL,
        target TEXT NOT NULL,
        detail TEXT NOT NULL
    );
    ",
    // 2: clusters (the Kubernetes backend); a Namespace is on a host pool or on one cluster.
    "
    CREATE TABLE clusters (
        name TEXT PRIMARY KEY,
        server TEXT NOT NULL,
        credentials TEXT NOT NULL,
        settings TEXT NOT NULL,
        created_at INTEGER NOT NULL,
        last_probe TEXT
    );
    ALTER TABLE namespaces ADD COLUMN cluster_name TEXT REFERENCES clusters(name);
    ALTER TABLE namespaces ADD COLUMN cluster_ready INTEGER NOT NULL DEFAULT 0;
    ",
    // 3: Namespace createdAt in seconds like every other timestamp (it was milliseconds);
    // tokens may expire.
    "
    UPDATE namespaces SET created_at = created_at / 1000 WHERE created_at > 100000000000;
    ALTER TABLE tokens ADD COLUMN expires_at INTEGER;
    ",
    // 4: single-tenant pools (hosts that run one Namespace's Agents only).
    "
    ALTER TABLE namespaces ADD COLUMN single_tenant INTEGER NOT NULL DEFAULT 0;
    ",
    // 5: the evidence of a revision's failed activation (runtimeFailure, JSON).
    "
    ALTER TABLE revisions ADD COLUMN runtime_failure TEXT;
    ",
    // 6: the drift sweep's findings: one row per Agent (or stray thing) per host or cluster.
    "
    CREATE TABLE drift (
        target TEXT NOT NULL,
        namespace_id TEXT NOT NULL,
        agent_id TEXT NOT NULL,
        state TEXT NOT NULL,
        reason TEXT,
        message TEXT NOT NULL,
        checked_at INTEGER NOT NULL,
        PRIMARY KEY (target, namespace_id, agent_id)
    );
    ",
    // 7: what a failed activation does per Agent (restore: none | last-served).
    "
    ALTER TABLE agents ADD COLUMN restore TEXT NOT NULL DEFAULT 'none';
    ",
    // 8: rollouts (one Configuration generation to many Agents, in waves) and their Agents.
    "
    CREATE TABLE rollouts (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        namespace_id TEXT NOT NULL REFERENCES namespaces(id) ON DELETE CASCADE,
        configuration_id TEXT NOT NULL,
        configuration_generation INTEGER NOT NULL,
        canary INTEGER NOT NULL,
        max_parallel INTEGER NOT NULL,
        max_failures INTEGER NOT NULL,
        pause_between_seconds INTEGER NOT NULL,
        manual_promote INTEGER NOT NULL,
        state TEXT NOT NULL,
        wave INTEGER NOT NULL DEFAULT 0,
        waves INTEGER NOT NULL,
        next_wave_at_ms INTEGER,
        message TEXT,
        created_by TEXT NOT NULL,
        created_at INTEGER NOT NULL,
        updated_at INTEGER NOT NULL
    );
    CREATE INDEX rollouts_open ON rollouts(state);
    CREATE TABLE rollout_agents (
        rollout_id INTEGER NOT NULL REFERENCES rollouts(id) ON DELETE CASCADE,
        namespace_id TEXT NOT NULL,
        agent_id TEXT NOT NULL,
        position INTEGER NOT NULL,
        wave INTEGER NOT NULL,
        state TEXT NOT NULL,
        revision_id TEXT,
        work_id INTEGER,
        code TEXT,
        message TEXT,
        started_at INTEGER,
        finished_at INTEGER,
        PRIMARY KEY (rollout_id, agent_id)
    );
    CREATE INDEX rollout_agents_agent ON rollout_agents(namespace_id, agent_id);
    ",
    // 9: initial workspace files (store/workspace.rs): their setup state per Agent, and per
    // file its name, size, digest and, until an activation after the host applied them, its
    // content.
    "
    CREATE TABLE agent_workspace (
        namespace_id TEXT NOT NULL,
        agent_id TEXT NOT NULL,
        state TEXT NOT NULL,
        applied_at INTEGER,
        failure_code TEXT,
        failure_message TEXT,
        updated_at INTEGER NOT NULL,
        PRIMARY KEY (namespace_id, agent_id),
        FOREIGN KEY (namespace_id, agent_id) REFERENCES agents(namespace_id, id) ON DELETE CASCADE
    );
    CREATE TABLE agent_workspace_files (
        namespace_id TEXT NOT NULL,
        agent_id TEXT NOT NULL,
        name TEXT NOT NULL,
        size INTEGER NOT NULL,
        sha256 TEXT NOT NULL,
        content BLOB,
        PRIMARY KEY (namespace_id, agent_id, name),
        FOREIGN KEY (namespace_id, agent_id) REFERENCES agents(namespace_id, id) ON DELETE CASCADE
    );
    ",
];

pub use crate::model::{DriftReason, DriftRow, DriftState};

/// A revision row with its raw status, rendered text and last-attempt columns.
type RevisionRow = (
    Revision,
    String,
    String,
    Option<String>,
    Option<String>,
    Option<i64>,
    u32,
);

/// A claimable work row: id, kind, namespace, agent, revision, attempts, created.
type WorkRow = (
    i64,
    String,
    String,
    Option<String>,
    Option<String>,
    u32,
    i64,
);

/// What inserting a Namespace did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NamespaceInsert {
    Inserted,
    /// A Namespace of that id exists.
    Exists,
    /// The pool would share `host` with `namespace`, and one of the two is single-tenant.
    HostShared {
        host: String,
        namespace: String,
    },
}

/// A live (not revoked) token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenRow {
    pub id: String,
    pub grants: Vec<Grant>,
    /// Seconds since the epoch after which the token is refused; `None`: never.
    pub expires_at: Option<i64>,
}

/// A unit of deployment work.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Work {
    pub id: i64,
    pub kind: WorkKind,
    pub namespace_id: String,
    pub agent_id: Option<String>,
    pub revision_id: Option<String>,
    pub attempts: u32,
    pub created_at: i64,
}

/// What a work item does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum WorkKind {
    EnsureNamespace,
    Deploy,
    Stop,
    DeleteAgent,
    DeleteNamespace,
}

impl WorkKind {
    pub fn as_str(self) -> &'static str {
        match self {
            WorkKind::EnsureNamespace => "ensure-namespace",
            WorkKind::Deploy => "deploy",
            WorkKind::Stop => "stop",
            WorkKind::DeleteAgent => "delete-agent",
            WorkKind::DeleteNamespace => "delete-namespace",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "ensure-namespace" => WorkKind::EnsureNamespace,
            "deploy" => WorkKind::Deploy,
            "stop" => WorkKind::Stop,
            "delete-agent" => WorkKind::DeleteAgent,
            "delete-namespace" => WorkKind::DeleteNamespace,
            _ => return None,
        })
    }
}

/// Where a work item is in the queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum WorkState {
    /// Waiting for its `not_before` time and a free lane.
    Queued,
    /// Claimed by a worker under a lease.
    Running,
    /// Finished; its last code says how.
    Done,
    /// Finished without success; retrying cannot help (or the budget is spent).
    Failed,
}

impl WorkState {
    pub fn as_str(self) -> &'static str {
        match self {
            WorkState::Queued => "queued",
            WorkState::Running => "running",
            WorkState::Done => "done",
            WorkState::Failed => "failed",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "queued" => WorkState::Queued,
            "running" => WorkState::Running,
            "done" => WorkState::Done,
            "failed" => WorkState::Failed,
            _ => return None,
        })
    }
}

/// A work item as deployment status and `occ ... --wait` show it: what it does, where it is,
/// and its last attempt (code, message, time in seconds), so failed stop and delete work is as
/// visible as a failed revision.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct WorkRecord {
    pub id: i64,
    pub kind: WorkKind,
    pub revision_id: Option<String>,
    pub state: WorkState,
    /// Attempts that counted against the budget.
    pub attempts: u32,
    pub last_attempt: Option<WorkAttempt>,
    /// Seconds since the epoch.
    pub created_at: i64,
}

/// The last attempt at a work item.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct WorkAttempt {
    pub code: String,
    pub message: String,
    /// Seconds since the epoch.
    pub at: i64,
}

const WORK_RECORD_COLS: &str =
    "id, kind, revision_id, state, attempts, last_code, last_message, updated_at, created_at";

fn work_record(r: &Row<'_>) -> rusqlite::Result<WorkRecord> {
    let kind: String = r.get(1)?;
    let state: String = r.get(3)?;
    let corrupt = |i: usize, what: String| {
        rusqlite::Error::FromSqlConversionFailure(
            i,
            rusqlite::types::Type::Text,
            Box::new(StoreError::Corrupt(what)),
        )
    };
    let code: Option<String> = r.get(5)?;
    let updated_ms: i64 = r.get(7)?;
    Ok(WorkRecord {
        id: r.get(0)?,
        kind: WorkKind::parse(&kind).ok_or_else(|| corrupt(1, format!("work kind {kind:?}")))?,
        revision_id: r.get(2)?,
        state: WorkState::parse(&state)
            .ok_or_else(|| corrupt(3, format!("work state {state:?}")))?,
        attempts: r.get(4)?,
        last_attempt: match code {
            Some(code) => Some(WorkAttempt {
                code,
                message: r.get::<_, Option<String>>(6)?.unwrap_or_default(),
                at: updated_ms / 1000,
            }),
            None => None,
        },
        created_at: r.get::<_, i64>(8)? / 1000,
    })
}

/// The store: one SQLite connection behind a mutex (statements are short).
#[derive(Debug, Clone)]
pub struct Store {
    conn: Arc<Mutex<Connection>>,
    /// Woken whenever work is queued or finished, so the worker picks it up at once instead
    /// of at its next poll.
    wake: Arc<tokio::sync::Notify>,
}

fn json_col(text: String) -> Result<Value> {
    serde_json::from_str(&text).map_err(|e| StoreError::Corrupt(e.to_string()))
}

impl Store {
    /// Opens (creating if needed) and migrates the database.
    pub fn open(path: &Path) -> Result<Self> {
        let conn = Connection::open(path)?;
        Self::init(conn)
    }

    /// An in-memory database, for tests.
    pub fn in_memory() -> Result<Self> {
        Self::init(Connection::open_in_memory()?)
    }

    fn init(conn: Connection) -> Result<Self> {
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.pragma_update(None, "foreign_keys", "ON")?;
        // Deleted and overwritten content is zeroed in the file, so workspace file contents
        // the store dropped (store/workspace.rs) cannot be read back from free pages.
        conn.pragma_update(None, "secure_delete", "ON")?;
        // FULL: an acknowledged deploy survives a power cut, not only a crash.
        conn.pragma_update(None, "synchronous", "FULL")?;
        conn.busy_timeout(std::time::Duration::from_secs(5))?;
        conn.execute_batch("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")?;
        let current: i64 = conn.query_row(
            "SELECT COALESCE(MAX(version), 0) FROM schema_version",
            [],
            |r| r.get(0),
        )?;
        let known = MIGRATIONS.len() as i64;
        if current > known {
            return Err(StoreError::TooNew {
                found: current,
                known,
            });
        }
        for (i, sql) in MIGRATIONS.iter().enumerate().skip(current as usize) {
            let tx = conn.unchecked_transaction()?;
            tx.execute_batch(sql)?;
            tx.execute(
                "INSERT INTO schema_version (version) VALUES (?1)",
                [i as i64 + 1],
            )?;
            tx.commit()?;
        }
        Ok(Self {
            conn: Arc::new(Mutex::new(conn)),
            wake: Arc::new(tokio::sync::Notify::new()),
        })
    }

    /// Resolves when work was queued or finished since the last wait (a stored permit makes a
    /// wake-up between two waits count).
    pub async fn work_changed(&self) {
        self.wake.notified().await;
    }

    /// Tells a waiting worker that the queue changed.
    pub fn wake_worker(&self) {
        self.wake.notify_one();
    }

    fn c(&self) -> MutexGuard<'_, Connection> {
        match self.conn.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        }
    }

    /// Schema version.
    pub fn schema_version(&self) -> Result<i64> {
        Ok(self
            .c()
            .query_row("SELECT MAX(version) FROM schema_version", [], |r| r.get(0))?)
    }

    // ---- drift ----

    /// Replaces every drift row of one target with a sweep's findings, in one transaction.
    pub fn replace_drift(&self, target: &str, rows: &[DriftRow]) -> Result<()> {
        let mut c = self.c();
        let tx = c.transaction()?;
        tx.execute("DELETE FROM drift WHERE target = ?1", params![target])?;
        for r in rows {
            tx.execute(
                "INSERT OR REPLACE INTO drift (target, namespace_id, agent_id, state, reason, message, checked_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
                params![target, r.namespace_id, r.agent_id, r.state.as_str(), r.reason.map(DriftReason::as_str), r.message, r.checked_at],
            )?;
        }
        tx.commit()?;
        Ok(())
    }

    /// Drops the rows of targets no sweep covers any more (a forgotten host or cluster).
    pub fn retain_drift_targets(&self, targets: &[String]) -> Result<()> {
        let c = self.c();
        let known: std::collections::BTreeSet<&str> = targets.iter().map(String::as_str).collect();
        let mut st = c.prepare("SELECT DISTINCT target FROM drift")?;
        let stale: Vec<String> = st
            .query_map([], |r| r.get::<_, String>(0))?
            .collect::<rusqlite::Result<Vec<_>>>()?
            .into_iter()
            .filter(|t| !known.contains(t.as_str()))
            .collect();
        for t in stale {
            c.execute("DELETE FROM drift WHERE target = ?1", params![t])?;
        }
        Ok(())
    }

    /// Every drift row, by target, Namespace and Agent.
    pub fn drift(&self) -> Result<Vec<DriftRow>> {
        let c = self.c();
        let mut st = c.prepare(
            "SELECT target, namespace_id, agent_id, state, reason, message, checked_at FROM drift ORDER BY target, namespace_id, agent_id",
        )?;
        let rows = st.query_map([], |r| {
            Ok((
                r.get::<_, String>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, String>(2)?,
                r.get::<_, String>(3)?,
                r.get::<_, Option<String>>(4)?,
                r.get::<_, String>(5)?,
                r.get::<_, i64>(6)?,
            ))
        })?;
        let mut out = Vec::new();
        for row in rows {
            let (target, namespace_id, agent_id, state, reason, message, checked_at) = row?;
            out.push(DriftRow {
                target,
                namespace_id,
                agent_id,
                state: DriftState::parse(&state)
                    .ok_or_else(|| StoreError::Corrupt(format!("drift state {state:?}")))?,
                reason: match reason {
                    Some(r) => Some(
                        DriftReason::parse(&r)
                            .ok_or_else(|| StoreError::Corrupt(format!("drift reason {r:?}")))?,
                    ),
                    None => None,
                },
                message,
                checked_at,
            });
        }
        Ok(out)
    }

    // ---- audit ----

    pub fn audit(
        &self,
        actor: &str,
        action: &str,
        target: &str,
        detail: &Value,
        now: i64,
    ) -> Result<()> {
        self.c().execute(
            "INSERT INTO audit (at, actor, action, target, detail) VALUES (?1, ?2, ?3, ?4, ?5)",
            params![now, actor, action, target, detail.to_string()],
        )?;
        Ok(())
    }

    pub fn audit_events(&self, limit: u32) -> Result<Vec<AuditEvent>> {
        self.audit_events_of(limit, None)
    }

    /// The newest audit events, optionally of one action only.
    pub fn audit_events_of(&self, limit: u32, action: Option<&str>) -> Result<Vec<AuditEvent>> {
        let c = self.c();
        let mut st = c.prepare(
            "SELECT id, at, actor, action, target, detail FROM audit WHERE ?2 IS NULL OR action = ?2 ORDER BY id DESC LIMIT ?1",
        )?;
        let rows = st.query_map(params![limit, action], |r| {
            Ok((
                r.get(0)?,
                r.get(1)?,
                r.get(2)?,
                r.get(3)?,
                r.get(4)?,
                r.get::<_, String>(5)?,
            ))
        })?;
        let mut out = Vec::new();
        for row in rows {
            let (id, at, actor, action, target, detail) = row?;
            out.push(AuditEvent {
                id,
                at,
                actor,
                action,
                target,
                detail: json_col(detail)?,
            });
        }
        Ok(out)
    }

    // ---- tokens ----

    pub fn create_token(
        &self,
        id: &str,
        name: &str,
        secret_hash: &str,
        grants: &[Grant],
        now: i64,
        expires_at: Option<i64>,
    ) -> Result<()> {
        let mut c = self.c();
        let tx = c.transaction()?;
        tx.execute(
            "INSERT INTO tokens (id, name, secret_hash, created_at, expires_at) VALUES (?1, ?2, ?3, ?4, ?5)",
            params![id, name, secret_hash, now, expires_at],
        )?;
        for g in grants {
            tx.execute(
                "INSERT INTO token_grants (token_id, namespace, role) VALUES (?1, ?2, ?3)",
                params![id, g.namespace, g.role.as_str()],
            )?;
        }
        tx.commit()?;
        Ok(())
    }

    /// The token for a secret's hash, if the token exists and is not revoked.
    pub fn token_by_hash(&self, secret_hash: &str) -> Result<Option<TokenRow>> {
        let c = self.c();
        let row: Option<(String, Option<i64>)> = c
            .query_row(
                "SELECT id, expires_at FROM tokens WHERE secret_hash = ?1 AND revoked = 0",
                [secret_hash],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .optional()?;
        let Some((id, expires_at)) = row else {
            return Ok(None);
        };
        let mut st = c.prepare("SELECT namespace, role FROM token_grants WHERE token_id = ?1")?;
        let grants = st
            .query_map([&id], |r| {
                Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?))
            })?
            .filter_map(|r| r.ok())
            .filter_map(|(namespace, role)| {
                Role::parse(&role).map(|role| Grant { namespace, role })
            })
            .collect();
        Ok(Some(TokenRow {
            id,
            grants,
            expires_at,
        }))
    }

    /// Revokes a token; false if there was none.
    pub fn revoke_token(&self, id: &str) -> Result<bool> {
        Ok(self.c().execute(
            "UPDATE tokens SET revoked = 1 WHERE id = ?1 AND revoked = 0",
            [id],
        )? > 0)
    }

    pub fn token_count(&self) -> Result<i64> {
        Ok(self
            .c()
            .query_row("SELECT COUNT(*) FROM tokens", [], |r| r.get(0))?)
    }

    // ---- hosts ----

    pub fn insert_host(&self, h: &Host) -> Result<bool> {
        let n = self.c().execute(
            "INSERT OR IGNORE INTO hosts (name, address, port, host_key, fingerprint, max_agents, enrolled_at)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
            params![h.name, h.address, h.port, h.host_key, h.fingerprint, h.max_agents, h.enrolled_at],
        )?;
        Ok(n > 0)
    }

    pub fn update_host(&self, h: &Host) -> Result<bool> {
        let n = self.c().execute(
            "UPDATE hosts SET address = ?2, port = ?3, host_key = ?4, fingerprint = ?5, max_agents = ?6, last_probe = NULL WHERE name = ?1",
            params![h.name, h.address, h.port, h.host_key, h.fingerprint, h.max_agents],
        )?;
        Ok(n > 0)
    }

    /// Removes a host that no Namespace pool and no Agent uses; `None` if it does not exist,
    /// `Some(false)` if it is still in use.
    pub fn delete_host(&self, name: &str) -> Result<Option<bool>> {
        let mut c = self.c();
        let tx = c.transaction()?;
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
        tx.commit()?;
        Ok(Some(true))
    }

    fn host_row(r: &Row<'_>) -> rusqlite::Result<(Host, Option<String>)> {
        Ok((
            Host {
                name: r.get(0)?,
                address: r.get(1)?,
                port: r.get(2)?,
                host_key: r.get(3)?,
                fingerprint: r.get(4)?,
                max_agents: r.get(5)?,
                enrolled_at: r.get(6)?,
                last_probe: None,
            },
            r.get(7)?,
        ))
    }

    fn finish_host((mut h, probe): (Host, Option<String>)) -> Result<Host> {
        h.last_probe = probe.map(json_col).transpose()?;
        Ok(h)
    }

    pub fn host(&self, name: &str) -> Result<Option<Host>> {
        let row = self
            .c()
            .query_row(
                "SELECT name, address, port, host_key, fingerprint, max_agents, enrolled_at, last_probe FROM hosts WHERE name = ?1",
                [name],
                Self::host_row,
            )
            .optional()?;
        row.map(Self::finish_host).transpose()
    }

    pub fn hosts(&self) -> Result<Vec<Host>> {
        let c = self.c();
        let mut st = c.prepare(
            "SELECT name, address, port, host_key, fingerprint, max_agents, enrolled_at, last_probe FROM hosts ORDER BY name",
        )?;
        let rows = st.query_map([], Self::host_row)?;
        rows.map(|r| Self::finish_host(r?)).collect()
    }

    pub fn set_host_probe(&self, name: &str, probe: &Value) -> Result<()> {
        self.c().execute(
            "UPDATE hosts SET last_probe = ?2 WHERE name = ?1",
            params![name, probe.to_string()],
        )?;
        Ok(())
    }

    /// Agents placed on a host (not deleted).
    pub fn agents_on_host(&self, name: &str) -> Result<u32> {
        Ok(self.c().query_row(
            "SELECT COUNT(*) FROM agents WHERE host_name = ?1",
            [name],
            |r| r.get(0),
        )?)
    }

    // ---- clusters ----

    /// Stores a registered cluster; false if the name exists.
    pub fn insert_cluster(&self, c: &ClusterRecord) -> Result<bool> {
        Ok(self.c().execute(
            "INSERT OR IGNORE INTO clusters (name, server, credentials, settings, created_at, last_probe) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            params![
                c.cluster.name,
                c.cluster.server,
                c.credentials.to_string(),
                c.cluster.settings.to_string(),
                c.cluster.created_at,
                c.cluster.last_probe.as_ref().map(Value::to_string)
            ],
        )? > 0)
    }

    fn cluster_row(
        r: &Row<'_>,
    ) -> rusqlite::Result<(String, String, String, String, i64, Option<String>)> {
        r.try_into()
    }

    fn finish_cluster(
        (name, server, credentials, settings, created_at, probe): (
            String,
            String,
            String,
            String,
            i64,
            Option<String>,
        ),
    ) -> Result<ClusterRecord> {
        Ok(ClusterRecord {
            cluster: Cluster {
                name,
                server,
                settings: json_col(settings)?,
                created_at,
                last_probe: probe.map(json_col).transpose()?,
            },
            credentials: json_col(credentials)?,
        })
    }

    /// A cluster with its credentials (for the backend only; never for the API).
    pub fn cluster(&self, name: &str) -> Result<Option<ClusterRecord>> {
        let row = self
            .c()
            .query_row(
                "SELECT name, server, credentials, settings, created_at, last_probe FROM clusters WHERE name = ?1",
                [name],
                Self::cluster_row,
            )
            .optional()?;
        row.map(Self::finish_cluster).transpose()
    }

    /// Every cluster, without credentials.
    pub fn clusters(&self) -> Result<Vec<Cluster>> {
        let c = self.c();
        let mut st = c.prepare(
            "SELECT name, server, credentials, settings, created_at, last_probe FROM clusters ORDER BY name",
        )?;
        let rows = st.query_map([], Self::cluster_row)?;
        rows.map(|r| Self::finish_cluster(r?).map(|c| c.cluster))
            .collect()
    }

    /// Removes a cluster no Namespace uses; `None` if it does not exist, `Some(false)` if it
    /// is in use.
    pub fn delete_cluster(&self, name: &str) -> Result<Option<bool>> {
        let mut c = self.c();
        let tx = c.transaction()?;
        let exists: i64 = tx.query_row(
            "SELECT COUNT(*) FROM clusters WHERE name = ?1",
            [name],
            |r| r.get(0),
        )?;
        if exists == 0 {
            return Ok(None);
        }
        let used: i64 = tx.query_row(
            "SELECT COUNT(*) FROM namespaces WHERE cluster_name = ?1",
            [name],
            |r| r.get(0),
        )?;
        if used > 0 {
            return Ok(Some(false));
        }
        tx.execute("DELETE FROM clusters WHERE name = ?1", [name])?;
        tx.commit()?;
        Ok(Some(true))
    }

    // ---- namespaces ----

    /// Inserts a Namespace on a host pool (`hosts`) or on one cluster, and queues its
    /// `ensure-namespace` work. Refused, with nothing written, when the id exists or the
    /// pool would share a host with a single-tenant Namespace (or, for a single-tenant one,
    /// with any other Namespace). `now_ms` schedules the work; the
    /// Namespace's `createdAt` is kept in seconds like every other.
    pub fn insert_namespace(
        &self,
        id: &str,
        name: &str,
        hosts: &[String],
        cluster: Option<&str>,
        single_tenant: bool,
        now_ms: i64,
    ) -> Result<NamespaceInsert> {
        let now = now_ms;
        let mut c = self.c();
        let tx = c.transaction()?;
        for h in hosts {
            let sharing: Option<(String, bool)> = tx
                .query_row(
                    "SELECT n.id, n.single_tenant FROM namespace_hosts nh JOIN namespaces n ON n.id = nh.namespace_id \
                     WHERE nh.host_name = ?1 AND n.id != ?2 AND (n.single_tenant = 1 OR ?3) LIMIT 1",
                    params![h, id, single_tenant],
                    |r| Ok((r.get(0)?, r.get(1)?)),
                )
                .optional()?;
            if let Some((namespace, _)) = sharing {
                return Ok(NamespaceInsert::HostShared {
                    host: h.clone(),
                    namespace,
                });
            }
        }
        let n = tx.execute(
            "INSERT OR IGNORE INTO namespaces (id, name, created_at, cluster_name, single_tenant) VALUES (?1, ?2, ?3, ?4, ?5)",
            params![id, name, now_ms / 1000, cluster, single_tenant],
        )?;
        if n == 0 {
            return Ok(NamespaceInsert::Exists);
        }
        for h in hosts {
            tx.execute(
                "INSERT INTO namespace_hosts (namespace_id, host_name) VALUES (?1, ?2)",
                params![id, h],
            )?;
        }
        tx.execute(
            "INSERT INTO work (kind, namespace_id, state, not_before, created_at, updated_at) VALUES ('ensure-namespace', ?1, 'queued', ?2, ?2, ?2)",
            params![id, now],
        )?;
        tx.commit()?;
        self.wake_worker();
        Ok(NamespaceInsert::Inserted)
    }

    pub fn namespace(&self, id: &str) -> Result<Option<Namespace>> {
        let c = self.c();
        type NamespaceRow = (String, String, bool, i64, Option<String>, bool, bool);
        let row: Option<NamespaceRow> = c
            .query_row(
                "SELECT id, name, deleting, created_at, cluster_name, cluster_ready, single_tenant FROM namespaces WHERE id = ?1",
                [id],
                |r| NamespaceRow::try_from(r),
            )
            .optional()?;
        let Some((id, name, deleting, created_at, cluster, cluster_ready, single_tenant)) = row
        else {
            return Ok(None);
        };
        let mut st = c.prepare("SELECT host_name, ready FROM namespace_hosts WHERE namespace_id = ?1 ORDER BY host_name")?;
        let pool: Vec<(String, bool)> = st
            .query_map([&id], |r| Ok((r.get(0)?, r.get(1)?)))?
            .collect::<rusqlite::Result<_>>()?;
        let ready_hosts: Vec<String> = pool
            .iter()
            .filter(|(_, r)| *r)
            .map(|(h, _)| h.clone())
            .collect();
        Ok(Some(Namespace {
            ready: match &cluster {
                Some(_) => cluster_ready,
                None => !pool.is_empty() && ready_hosts.len() == pool.len(),
            },
            cluster,
            hosts: pool.into_iter().map(|(h, _)| h).collect(),
            ready_hosts,
            id,
            name,
            deleting,
            created_at,
            single_tenant,
        }))
    }

    pub fn namespaces(&self) -> Result<Vec<Namespace>> {
        let ids: Vec<String> = {
            let c = self.c();
            let mut st = c.prepare("SELECT id FROM namespaces ORDER BY id")?;
            st.query_map([], |r| r.get(0))?
                .collect::<rusqlite::Result<_>>()?
        };
        let mut out = Vec::new();
        for id in ids {
            if let Some(ns) = self.namespace(&id)? {
                out.push(ns);
            }
        }
        Ok(out)
    }

    pub fn set_namespace_cluster_ready(&self, ns: &str, ready: bool) -> Result<()> {
        self.c().execute(
            "UPDATE namespaces SET cluster_ready = ?2 WHERE id = ?1",
            params![ns, ready],
        )?;
        Ok(())
    }

    pub fn set_namespace_host_ready(&self, ns: &str, host: &str, ready: bool) -> Result<()> {
        self.c().execute(
            "UPDATE namespace_hosts SET ready = ?3 WHERE namespace_id = ?1 AND host_name = ?2",
            params![ns, host, ready],
        )?;
        Ok(())
    }

    /// Marks a Namespace for deletion if it has no Agents; false if it has some.
    pub fn mark_namespace_deleting(&self, id: &str, now: i64) -> Result<bool> {
        let mut c = self.c();
        let tx = c.transaction()?;
        let agents: i64 = tx.query_row(
            "SELECT COUNT(*) FROM agents WHERE namespace_id = ?1",
            [id],
            |r| r.get(0),
        )?;
        if agents > 0 {
            return Ok(false);
        }
        tx.execute("UPDATE namespaces SET deleting = 1 WHERE id = ?1", [id])?;
        tx.execute(
            "INSERT INTO work (kind, namespace_id, state, not_before, created_at, updated_at) VALUES ('delete-namespace', ?1, 'queued', ?2, ?2, ?2)",
            params![id, now],
        )?;
        tx.commit()?;
        self.wake_worker();
        Ok(true)
    }

    pub fn delete_namespace_row(&self, id: &str) -> Result<()> {
        self.c()
            .execute("DELETE FROM namespaces WHERE id = ?1", [id])?;
        Ok(())
    }

    // ---- configurations ----

    /// Adds a generation; returns its number. `expect_new` refuses an existing id.
    pub fn put_configuration(
        &self,
        ns: &str,
        id: &str,
        document: &Value,
        expect_new: bool,
        now: i64,
    ) -> Result<Option<u32>> {
        let mut c = self.c();
        let tx = c.transaction()?;
        let current: Option<u32> = tx.query_row(
            "SELECT MAX(generation) FROM configurations WHERE namespace_id = ?1 AND id = ?2",
            params![ns, id],
            |r| r.get(0),
        )?;
        if expect_new == current.is_some() {
            return Ok(None);
        }
        let generation = current.unwrap_or(0) + 1;
        tx.execute(
            "INSERT INTO configurations (namespace_id, id, generation, document, created_at) VALUES (?1, ?2, ?3, ?4, ?5)",
            params![ns, id, generation, document.to_string(), now],
        )?;
        tx.commit()?;
        Ok(Some(generation))
    }

    pub fn configuration(&self, ns: &str, id: &str) -> Result<Option<Configuration>> {
        self.configuration_at(ns, id, None)
    }

    /// One generation of a Configuration (`None`: the latest).
    pub fn configuration_at(
        &self,
        ns: &str,
        id: &str,
        generation: Option<u32>,
    ) -> Result<Option<Configuration>> {
        let row: Option<(u32, String, i64)> = self
            .c()
            .query_row(
                "SELECT generation, document, created_at FROM configurations WHERE namespace_id = ?1 AND id = ?2 AND (?3 IS NULL OR generation = ?3) ORDER BY generation DESC LIMIT 1",
                params![ns, id, generation],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
            )
            .optional()?;
        row.map(|(generation, document, created_at)| {
            Ok(Configuration {
                namespace_id: ns.to_owned(),
                id: id.to_owned(),
                generation,
                document: json_col(document)?,
                created_at,
            })
        })
        .transpose()
    }

    // ---- agents ----

    pub fn insert_agent(&self, a: &Agent) -> Result<bool> {
        Ok(self.c().execute(
            "INSERT OR IGNORE INTO agents (namespace_id, id, service_principal_id, configuration_id, desired_state, created_at, restore)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
            params![a.namespace_id, a.id, a.service_principal_id, a.configuration_id, a.desired_state.as_str(), a.created_at, a.restore.as_str()],
        )? > 0)
    }

    fn agent_row(r: &Row<'_>) -> rusqlite::Result<(Agent, String, String)> {
        Ok((
            Agent {
                namespace_id: r.get(0)?,
                id: r.get(1)?,
                service_principal_id: r.get(2)?,
                configuration_id: r.get(3)?,
                desired_state: DesiredState::Running,
                host: r.get(5)?,
                port: r.get(6)?,
                active_revision_id: r.get(7)?,
                served_revision_id: r.get(8)?,
                restore: crate::model::RestorePolicy::None,
                created_at: r.get(9)?,
            },
            r.get(4)?,
            r.get(10)?,
        ))
    }

    fn finish_agent((mut a, desired, restore): (Agent, String, String)) -> Result<Agent> {
        a.desired_state = DesiredState::parse(&desired)
            .ok_or_else(|| StoreError::Corrupt(format!("desired state {desired:?}")))?;
        a.restore = crate::model::RestorePolicy::parse(&restore)
            .ok_or_else(|| StoreError::Corrupt(format!("restore policy {restore:?}")))?;
        Ok(a)
    }

    const AGENT_COLS: &'static str = "namespace_id, id, service_principal_id, configuration_id, desired_state, host_name, port, active_revision_id, served_revision_id, created_at, restore";

    pub fn agent(&self, ns: &str, id: &str) -> Result<Option<Agent>> {
        let sql = format!(
            "SELECT {} FROM agents WHERE namespace_id = ?1 AND id = ?2",
            Self::AGENT_COLS
        );
        let row = self
            .c()
            .query_row(&sql, params![ns, id], Self::agent_row)
            .optional()?;
        row.map(Self::finish_agent).transpose()
    }

    pub fn agents(&self, ns: &str) -> Result<Vec<Agent>> {
        let sql = format!(
            "SELECT {} FROM agents WHERE namespace_id = ?1 ORDER BY id",
            Self::AGENT_COLS
        );
        let c = self.c();
        let mut st = c.prepare(&sql)?;
        let rows = st.query_map([ns], Self::agent_row)?;
        rows.map(|r| Self::finish_agent(r?)).collect()
    }

    /// Sets what a failed activation of the Agent does.
    pub fn set_agent_restore(
        &self,
        ns: &str,
        id: &str,
        restore: crate::model::RestorePolicy,
    ) -> Result<()> {
        self.c().execute(
            "UPDATE agents SET restore = ?3 WHERE namespace_id = ?1 AND id = ?2",
            params![ns, id, restore.as_str()],
        )?;
        Ok(())
    }

    pub fn set_agent_configuration(
        &self,
        ns: &str,
        id: &str,
        configuration_id: &str,
    ) -> Result<()> {
        self.c().execute(
            "UPDATE agents SET configuration_id = ?3 WHERE namespace_id = ?1 AND id = ?2",
            params![ns, id, configuration_id],
        )?;
        Ok(())
    }

    /// Sets the placement once; returns the placement in force afterwards.
    pub fn place_agent(&self, ns: &str, id: &str, host: &str) -> Result<Option<String>> {
        let c = self.c();
        c.execute(
            "UPDATE agents SET host_name = ?3 WHERE namespace_id = ?1 AND id = ?2 AND host_name IS NULL",
            params![ns, id, host],
        )?;
        Ok(c.query_row(
            "SELECT host_name FROM agents WHERE namespace_id = ?1 AND id = ?2",
            params![ns, id],
            |r| r.get(0),
        )?)
    }

    pub fn set_agent_observed(
        &self,
        ns: &str,
        id: &str,
        port: Option<u16>,
        served: Option<&str>,
    ) -> Result<()> {
        self.c().execute(
            "UPDATE agents SET port = COALESCE(?3, port), served_revision_id = ?4 WHERE namespace_id = ?1 AND id = ?2",
            params![ns, id, port, served],
        )?;
        Ok(())
    }

    /// Compare-and-set of the active revision; true if it was `expected` and is now `new`.
    pub fn cas_active_revision(
        &self,
        ns: &str,
        id: &str,
        expected: Option<&str>,
        new: Option<&str>,
    ) -> Result<bool> {
        Ok(self.c().execute(
            "UPDATE agents SET active_revision_id = ?4 WHERE namespace_id = ?1 AND id = ?2 AND active_revision_id IS ?3",
            params![ns, id, expected, new],
        )? > 0)
    }

    /// Sets the desired state and queues the work that realises it, in one transaction.
    /// Returns the queued work's id (none for `running`, which a deploy realises).
    pub fn set_desired(
        &self,
        ns: &str,
        id: &str,
        desired: DesiredState,
        now: i64,
    ) -> Result<Option<i64>> {
        let mut c = self.c();
        let tx = c.transaction()?;
        tx.execute(
            "UPDATE agents SET desired_state = ?3 WHERE namespace_id = ?1 AND id = ?2",
            params![ns, id, desired.as_str()],
        )?;
        let kind = match desired {
            DesiredState::Stopped => "stop",
            DesiredState::Deleted => "delete-agent",
            DesiredState::Running => {
                tx.commit()?;
                return Ok(None);
            }
        };
        tx.execute(
            "INSERT INTO work (kind, namespace_id, agent_id, state, not_before, created_at, updated_at) VALUES (?1, ?2, ?3, 'queued', ?4, ?4, ?4)",
            params![kind, ns, id, now],
        )?;
        let work = tx.last_insert_rowid();
        tx.commit()?;
        self.wake_worker();
        Ok(Some(work))
    }

    pub fn delete_agent_row(&self, ns: &str, id: &str) -> Result<()> {
        self.c().execute(
            "DELETE FROM agents WHERE namespace_id = ?1 AND id = ?2",
            params![ns, id],
        )?;
        Ok(())
    }

    // ---- revisions ----

    /// Creates the next revision of an Agent and queues its deployment; desired becomes running.
    /// The number (and the id derived from it) is allocated inside the same transaction, so
    /// concurrent deploys of one Agent get distinct numbers. Refused (nothing written) while
    /// the Agent belongs to an open rollout.
    pub fn create_revision(&self, r: &mut Revision, now: i64) -> Result<RevisionInsert> {
        let mut c = self.c();
        let tx = c.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
        if let Some(rollout) = rollouts::open_rollout_of(&tx, &r.namespace_id, &r.agent_id)? {
            return Ok(RevisionInsert::InRollout(rollout));
        }
        let work = Self::insert_revision(&tx, r, now)?;
        tx.commit()?;
        self.wake_worker();
        Ok(RevisionInsert::Queued(work))
    }

    /// Inserts the next revision and its deploy work inside `tx`; returns the work's id.
    fn insert_revision(tx: &rusqlite::Transaction<'_>, r: &mut Revision, now: i64) -> Result<i64> {
        let last: i64 = tx.query_row(
            "SELECT COALESCE(MAX(number), 0) FROM revisions WHERE namespace_id = ?1 AND agent_id = ?2",
            params![r.namespace_id, r.agent_id],
            |row| row.get(0),
        )?;
        r.number = last as u64 + 1;
        r.id = format!("rev-{}", r.number);
        r.status = RevisionStatus::Pending;
        tx.execute(
            "INSERT INTO revisions (namespace_id, agent_id, id, number, configuration_id, configuration_generation, configuration_hash, rendered, status, created_at)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, 'pending', ?9)",
            params![r.namespace_id, r.agent_id, r.id, r.number as i64, r.configuration_id, r.configuration_generation, r.configuration_hash, r.rendered.to_string(), r.created_at],
        )?;
        tx.execute(
            "UPDATE agents SET desired_state = 'running' WHERE namespace_id = ?1 AND id = ?2",
            params![r.namespace_id, r.agent_id],
        )?;
        tx.execute(
            "INSERT INTO work (kind, namespace_id, agent_id, revision_id, state, not_before, created_at, updated_at) VALUES ('deploy', ?1, ?2, ?3, 'queued', ?4, ?4, ?4)",
            params![r.namespace_id, r.agent_id, r.id, now],
        )?;
        Ok(tx.last_insert_rowid())
    }

    /// Queues a deploy of an existing revision (a reconcile: the same revision applied again).
    pub fn queue_deploy(&self, ns: &str, agent: &str, revision: &str, now: i64) -> Result<i64> {
        let c = self.c();
        c.execute(
            "INSERT INTO work (kind, namespace_id, agent_id, revision_id, state, not_before, created_at, updated_at) VALUES ('deploy', ?1, ?2, ?3, 'queued', ?4, ?4, ?4)",
            params![ns, agent, revision, now],
        )?;
        let work = c.last_insert_rowid();
        drop(c);
        self.wake_worker();
        Ok(work)
    }

    fn revision_row(r: &Row<'_>) -> rusqlite::Result<RevisionRow> {
        Ok((
            Revision {
                namespace_id: r.get(0)?,
                agent_id: r.get(1)?,
                id: r.get(2)?,
                number: r.get::<_, i64>(3)? as u64,
                configuration_id: r.get(4)?,
                configuration_generation: r.get(5)?,
                configuration_hash: r.get(6)?,
                status: RevisionStatus::Pending,
                last_attempt: None,
                created_at: r.get(13)?,
                runtime_failure: r
                    .get::<_, Option<String>>(14)?
                    .and_then(|t| serde_json::from_str(&t).ok()),
                rendered: Value::Null,
            },
            r.get(8)?,
            r.get(7)?,
            r.get(9)?,
            r.get(10)?,
            r.get(11)?,
            r.get(12)?,
        ))
    }

    fn finish_revision(
        (mut rev, status, rendered, code, message, at, attempts): RevisionRow,
    ) -> Result<Revision> {
        rev.status = RevisionStatus::parse(&status)
            .ok_or_else(|| StoreError::Corrupt(format!("revision status {status:?}")))?;
        rev.rendered = json_col(rendered)?;
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

    const REV_COLS: &'static str = "namespace_id, agent_id, id, number, configuration_id, configuration_generation, configuration_hash, rendered, status, last_code, last_message, last_at, attempts, created_at, runtime_failure";

    pub fn revision(&self, ns: &str, agent: &str, id: &str) -> Result<Option<Revision>> {
        let sql = format!(
            "SELECT {} FROM revisions WHERE namespace_id = ?1 AND agent_id = ?2 AND id = ?3",
            Self::REV_COLS
        );
        let row = self
            .c()
            .query_row(&sql, params![ns, agent, id], Self::revision_row)
            .optional()?;
        row.map(Self::finish_revision).transpose()
    }

    pub fn revisions(&self, ns: &str, agent: &str) -> Result<Vec<Revision>> {
        let sql = format!(
            "SELECT {} FROM revisions WHERE namespace_id = ?1 AND agent_id = ?2 ORDER BY number",
            Self::REV_COLS
        );
        let c = self.c();
        let mut st = c.prepare(&sql)?;
        let rows = st.query_map(params![ns, agent], Self::revision_row)?;
        rows.map(|r| Self::finish_revision(r?)).collect()
    }

    /// Records (or with `None` clears) the evidence of a revision's failed activation.
    pub fn set_runtime_failure(
        &self,
        ns: &str,
        agent: &str,
        id: &str,
        evidence: Option<&Value>,
    ) -> Result<()> {
        let text = evidence.map(Value::to_string);
        self.c().execute(
            "UPDATE revisions SET runtime_failure = ?4 WHERE namespace_id = ?1 AND agent_id = ?2 AND id = ?3",
            params![ns, agent, id, text],
        )?;
        Ok(())
    }

    pub fn set_revision_status(
        &self,
        ns: &str,
        agent: &str,
        id: &str,
        status: RevisionStatus,
    ) -> Result<()> {
        self.c().execute(
            "UPDATE revisions SET status = ?4 WHERE namespace_id = ?1 AND agent_id = ?2 AND id = ?3",
            params![ns, agent, id, status.as_str()],
        )?;
        Ok(())
    }

    /// The commit point: compare-and-set of `activeRevisionId` from `expected` to `candidate`,
    /// and in the same transaction the candidate becomes `activating` and the revision it
    /// replaces (if it was `active`) `superseded`, so revision states never disagree with
    /// `activeRevisionId`. False if the active revision was not `expected`.
    pub fn commit_revision(
        &self,
        ns: &str,
        agent: &str,
        expected: Option<&str>,
        candidate: &str,
    ) -> Result<bool> {
        let mut c = self.c();
        let tx = c.transaction()?;
        let n = tx.execute(
            "UPDATE agents SET active_revision_id = ?4 WHERE namespace_id = ?1 AND id = ?2 AND active_revision_id IS ?3",
            params![ns, agent, expected, candidate],
        )?;
        if n == 0 {
            return Ok(false);
        }
        tx.execute(
            "UPDATE revisions SET status = 'activating' WHERE namespace_id = ?1 AND agent_id = ?2 AND id = ?3",
            params![ns, agent, candidate],
        )?;
        if let Some(old) = expected {
            tx.execute(
                "UPDATE revisions SET status = 'superseded' WHERE namespace_id = ?1 AND agent_id = ?2 AND id = ?3 AND status IN ('active', 'activating', 'stopped')",
                params![ns, agent, old],
            )?;
        }
        tx.commit()?;
        Ok(true)
    }

    pub fn record_attempt(
        &self,
        ns: &str,
        agent: &str,
        id: &str,
        code: &str,
        message: &str,
        now: i64,
    ) -> Result<()> {
        self.c().execute(
            "UPDATE revisions SET last_code = ?4, last_message = ?5, last_at = ?6, attempts = attempts + 1 WHERE namespace_id = ?1 AND agent_id = ?2 AND id = ?3",
            params![ns, agent, id, code, message, now],
        )?;
        Ok(())
    }

    // ---- work ----

    /// Claims the next runnable work item under a lease: queued and due, or running with an
    /// expired lease (its worker died). Never two items of the same Agent or Namespace-level
    /// item at once.
    pub fn claim_work(&self, owner: &str, now_ms: i64, lease_ms: i64) -> Result<Option<Work>> {
        let mut c = self.c();
        let tx = c.transaction()?;
        let row: Option<WorkRow> = tx
            .query_row(
                "SELECT w.id, w.kind, w.namespace_id, w.agent_id, w.revision_id, w.attempts, w.created_at FROM work w
                 WHERE ((w.state = 'queued' AND w.not_before <= ?1) OR (w.state = 'running' AND w.lease_until < ?1))
                   AND NOT EXISTS (
                     SELECT 1 FROM work o WHERE o.id != w.id AND o.state = 'running' AND o.lease_until >= ?1
                       AND o.namespace_id = w.namespace_id
                       AND (o.agent_id IS w.agent_id OR o.agent_id IS NULL OR w.agent_id IS NULL))
                   AND NOT EXISTS (
                     SELECT 1 FROM work e WHERE e.id < w.id AND e.state IN ('queued', 'running')
                       AND e.namespace_id = w.namespace_id
                       AND (e.agent_id IS w.agent_id OR e.agent_id IS NULL OR w.agent_id IS NULL)
                       AND e.kind IN ('ensure-namespace', 'delete-namespace', 'delete-agent'))
                 ORDER BY w.not_before, w.id LIMIT 1",
                [now_ms],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?, r.get(5)?, r.get(6)?)),
            )
            .optional()?;
        let Some((id, kind, namespace_id, agent_id, revision_id, attempts, created_at)) = row
        else {
            return Ok(None);
        };
        tx.execute(
            "UPDATE work SET state = 'running', lease_owner = ?2, lease_until = ?3, updated_at = ?4 WHERE id = ?1",
            params![id, owner, now_ms + lease_ms, now_ms],
        )?;
        tx.commit()?;
        let kind = WorkKind::parse(&kind)
            .ok_or_else(|| StoreError::Corrupt(format!("work kind {kind:?}")))?;
        Ok(Some(Work {
            id,
            kind,
            namespace_id,
            agent_id,
            revision_id,
            attempts,
            created_at,
        }))
    }

    /// Extends a lease; false if another worker took the item meanwhile.
    pub fn renew_lease(&self, id: i64, owner: &str, until_ms: i64) -> Result<bool> {
        Ok(self.c().execute(
            "UPDATE work SET lease_until = ?3 WHERE id = ?1 AND lease_owner = ?2 AND state = 'running'",
            params![id, owner, until_ms],
        )? > 0)
    }

    /// Finishes an item (done or failed); a failure counts as one more attempt.
    pub fn finish_work(
        &self,
        id: i64,
        owner: &str,
        state: WorkState,
        code: &str,
        message: &str,
        now_ms: i64,
    ) -> Result<()> {
        self.c().execute(
            "UPDATE work SET state = ?3, last_code = ?4, last_message = ?5, lease_owner = NULL, lease_until = NULL, updated_at = ?6,
                 attempts = attempts + ?7
             WHERE id = ?1 AND lease_owner = ?2",
            params![id, owner, state.as_str(), code, message, now_ms, i64::from(state == WorkState::Failed)],
        )?;
        Ok(())
    }

    /// Puts an item back in the queue for later.
    pub fn requeue_work(
        &self,
        id: i64,
        owner: &str,
        not_before_ms: i64,
        count_attempt: bool,
        (code, message): (&str, &str),
        now_ms: i64,
    ) -> Result<()> {
        self.c().execute(
            "UPDATE work SET state = 'queued', not_before = ?3, attempts = attempts + ?4, last_code = ?5, last_message = ?6,
                 lease_owner = NULL, lease_until = NULL, updated_at = ?7
             WHERE id = ?1 AND lease_owner = ?2",
            params![id, owner, not_before_ms, i64::from(count_attempt), code, message, now_ms],
        )?;
        Ok(())
    }

    /// Open work for an Agent (for deployment status), oldest first.
    pub fn open_work(&self, ns: &str, agent: &str) -> Result<Vec<WorkRecord>> {
        let c = self.c();
        let mut st = c.prepare(&format!(
            "SELECT {WORK_RECORD_COLS} FROM work
             WHERE namespace_id = ?1 AND agent_id = ?2 AND state IN ('queued', 'running') ORDER BY id"
        ))?;
        let rows = st.query_map(params![ns, agent], work_record)?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    /// The newest work items of an Agent, finished or not, newest first.
    pub fn recent_work(&self, ns: &str, agent: &str, limit: u32) -> Result<Vec<WorkRecord>> {
        let c = self.c();
        let mut st = c.prepare(&format!(
            "SELECT {WORK_RECORD_COLS} FROM work
             WHERE namespace_id = ?1 AND agent_id = ?2 ORDER BY id DESC LIMIT ?3"
        ))?;
        let rows = st.query_map(params![ns, agent, limit], work_record)?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    /// One work item of an Agent.
    pub fn work_item(&self, ns: &str, agent: &str, id: i64) -> Result<Option<WorkRecord>> {
        Ok(self
            .c()
            .query_row(
                &format!(
                    "SELECT {WORK_RECORD_COLS} FROM work WHERE namespace_id = ?1 AND agent_id = ?2 AND id = ?3"
                ),
                params![ns, agent, id],
                work_record,
            )
            .optional()?)
    }

    /// Number of items not finished (for /metrics and tests).
    /// Work queued or running, and when the oldest of it was created (milliseconds).
    pub fn pending_work_age(&self) -> Result<(i64, Option<i64>)> {
        Ok(self.c().query_row(
            "SELECT COUNT(*), MIN(created_at) FROM work WHERE state IN ('queued', 'running')",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )?)
    }

    pub fn pending_work(&self) -> Result<i64> {
        Ok(self.c().query_row(
            "SELECT COUNT(*) FROM work WHERE state IN ('queued', 'running')",
            [],
            |r| r.get(0),
        )?)
    }

    /// Rows per table, for tests that prove a refused request stored nothing.
    pub fn row_counts(&self) -> Result<Vec<(String, i64)>> {
        let c = self.c();
        let mut st = c.prepare(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' ORDER BY name",
        )?;
        let tables = st
            .query_map([], |r| r.get::<_, String>(0))?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        let mut out = Vec::new();
        for t in tables {
            // Names come from sqlite_master, quoted as identifiers.
            let n: i64 = c.query_row(
                &format!("SELECT count(*) FROM \"{}\"", t.replace('"', "\"\"")),
                [],
                |r| r.get(0),
            )?;
            out.push((t, n));
        }
        Ok(out)
    }

    /// Work counts by state (for /metrics).
    pub fn work_counts(&self) -> Result<Vec<(String, String, i64)>> {
        let c = self.c();
        let mut st = c.prepare("SELECT kind, state, COUNT(*) FROM work GROUP BY kind, state")?;
        let rows = st.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn migration_3_moves_namespace_times_to_seconds_and_keeps_tokens() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("occ.db");
        {
            // A database as schema version 2 left it: createdAt in milliseconds.
            let c = Connection::open(&path).unwrap();
            c.execute_batch("CREATE TABLE schema_version (version INTEGER NOT NULL)")
                .unwrap();
            for (i, sql) in MIGRATIONS[..2].iter().enumerate() {
                c.execute_batch(sql).unwrap();
                c.execute("INSERT INTO schema_version VALUES (?1)", [i as i64 + 1])
                    .unwrap();
            }
            c.execute(
                "INSERT INTO namespaces (id, name, created_at) VALUES ('ns1', 'ns1', 1796119114123)",
                [],
            )
            .unwrap();
            c.execute(
                "INSERT INTO tokens (id, name, secret_hash, created_at) VALUES ('t1', 'x', 'h', 1796119114)",
                [],
            )
            .unwrap();
        }
        let s = Store::open(&path).unwrap();
        assert_eq!(s.namespace("ns1").unwrap().unwrap().created_at, 1796119114);
        let t = s.token_by_hash("h").unwrap().unwrap();
        assert_eq!((t.id.as_str(), t.expires_at), ("t1", None));
        // A new Namespace is stored in seconds too.
        assert!(
            s.insert_namespace("ns2", "ns2", &[], None, false, 1796119115999)
                .unwrap()
                == NamespaceInsert::Inserted
        );
        assert_eq!(s.namespace("ns2").unwrap().unwrap().created_at, 1796119115);
    }

    #[test]
    fn migrations_apply_once_and_a_newer_schema_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("occ.db");
        let s = Store::open(&path).unwrap();
        assert_eq!(s.schema_version().unwrap(), MIGRATIONS.len() as i64);
        drop(s);
        let s = Store::open(&path).unwrap();
        assert_eq!(s.schema_version().unwrap(), MIGRATIONS.len() as i64);
        s.c()
            .execute("INSERT INTO schema_version VALUES (99)", [])
            .unwrap();
        drop(s);
        assert!(matches!(
            Store::open(&path),
            Err(StoreError::TooNew { found: 99, .. })
        ));
    }

    #[test]
    fn claims_respect_leases_and_per_agent_exclusivity() {
        let s = Store::in_memory().unwrap();
        s.insert_host(&Host {
            name: "h1".into(),
            address: "127.0.0.1".into(),
            port: 22,
            host_key: "k".into(),
            fingerprint: "f".into(),
            max_agents: 10,
            enrolled_at: 0,
            last_probe: None,
        })
        .unwrap();
        s.insert_namespace("ns", "ns", &["h1".into()], None, false, 0)
            .unwrap();
        let ensure = s.claim_work("w1", 0, 1000).unwrap().unwrap();
        assert_eq!(ensure.kind, WorkKind::EnsureNamespace);
        // While a Namespace-level item runs, nothing else in the Namespace is claimed.
        assert!(s.claim_work("w2", 10, 1000).unwrap().is_none());
        // An expired lease is reclaimed by another worker.
        let again = s.claim_work("w2", 2000, 1000).unwrap().unwrap();
        assert_eq!(again.id, ensure.id);
        s.finish_work(again.id, "w2", WorkState::Done, "OK", "", 2001)
            .unwrap();
        // The first worker lost the lease: its finish does nothing.
        s.finish_work(again.id, "w1", WorkState::Failed, "X", "", 2002)
            .unwrap();
        assert_eq!(s.pending_work().unwrap(), 0);
    }
}
