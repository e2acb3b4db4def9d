//! The embedded default: SQLite (bundled), WAL, `synchronous=FULL`, versioned migrations
//! (`migrations.rs`). One writer connection, and a few reader connections so that reads never
//! wait behind the worker's writes (WAL lets readers see the last commit while a write is in
//! progress). Waiting for a connection is asynchronous; the statements themselves are short
//! and run on the caller's task.
//!
//! One file per aggregate, each implementing its trait from `store/src/lib.rs`.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use clawfleet_protocol::Ident;
use rusqlite::{Connection, OptionalExtension, params};
use tokio::sync::{Notify, Semaphore};

use super::seal::{self, Sealer};
use super::{Claim, LeaderLease, LeaseHeld, Pruned, Result, StoreError, StoreMeta};
use crate::clock::now_ms;

mod agents;
mod audit;
mod clusters;
mod configurations;
mod drift;
mod hosts;
pub mod migrations;
mod namespaces;
mod revisions;
mod rollouts;
mod secrets;
mod tokens;
pub(crate) mod work;
mod workspace;

pub use migrations::MIGRATIONS;

/// Reader connections of a file database.
const READERS: usize = 4;

impl From<rusqlite::Error> for StoreError {
    fn from(e: rusqlite::Error) -> Self {
        // A row mapper's own verdict on a value (see `corrupt`) keeps its meaning.
        if let rusqlite::Error::FromSqlConversionFailure(_, _, inner) = &e
            && let Some(StoreError::Corrupt(what)) = inner.downcast_ref::<StoreError>()
        {
            return StoreError::Corrupt(what.clone());
        }
        match e.sqlite_error_code() {
            Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked) => {
                StoreError::Unavailable(e.to_string())
            }
            _ => StoreError::Database(e.to_string()),
        }
    }
}

/// A value that cannot be decoded, as a rusqlite error (inside row mappers).
pub(super) fn corrupt(i: usize, what: String) -> rusqlite::Error {
    rusqlite::Error::FromSqlConversionFailure(
        i,
        rusqlite::types::Type::Text,
        Box::new(StoreError::Corrupt(what)),
    )
}

/// A JSON column.
pub(super) fn json_col<T: serde::de::DeserializeOwned>(text: String) -> Result<T> {
    serde_json::from_str(&text).map_err(|e| StoreError::Corrupt(e.to_string()))
}

/// A text enum column.
pub(super) fn parse_col<T>(text: &str, what: &str, parse: fn(&str) -> Option<T>) -> Result<T> {
    parse(text).ok_or_else(|| StoreError::Corrupt(format!("{what} {text:?}")))
}

/// An id column as the typed id it was stored from. Ids are checked when they enter (the
/// API, plans); a row that no longer holds one was edited behind the coordinator's back, and
/// is refused here, naming the column, rather than by every reader above the store.
pub(super) fn id_col<T>(r: &rusqlite::Row<'_>, i: usize) -> rusqlite::Result<T>
where
    T: std::str::FromStr,
    T::Err: std::fmt::Display,
{
    let text: String = r.get(i)?;
    text.parse()
        .map_err(|e: T::Err| corrupt(i, bad_id(r, i, &text, &e)))
}

fn bad_id(r: &rusqlite::Row<'_>, i: usize, text: &str, e: &dyn std::fmt::Display) -> String {
    super::bad_column(r.as_ref().column_name(i).unwrap_or("?"), text, e)
}

/// An optional id column (see [`id_col`]).
pub(super) fn opt_id_col(r: &rusqlite::Row<'_>, i: usize) -> rusqlite::Result<Option<Ident>> {
    let text: Option<String> = r.get(i)?;
    match text {
        None => Ok(None),
        Some(text) => Ident::new(text.as_str())
            .map(Some)
            .map_err(|e| corrupt(i, bad_id(r, i, &text, &e))),
    }
}

/// Refuses a write on behalf of a claim that another claim replaced; call inside the write's
/// transaction (the one writer connection makes check and write one atomic step).
pub(super) fn check_claim(c: &Connection, claim: &Claim) -> Result<()> {
    let current: Option<i64> = c
        .query_row(
            "SELECT 1 FROM work WHERE id = ?1 AND claim_token = ?2 AND state = 'running'",
            params![claim.work, claim.token],
            |r| r.get(0),
        )
        .optional()?;
    match current {
        Some(_) => Ok(()),
        None => Err(claim.lost()),
    }
}

/// Reader connections: taken and given back; their number bounded by a semaphore.
#[derive(Debug)]
struct Readers {
    path: PathBuf,
    idle: Mutex<Vec<Connection>>,
    permits: Semaphore,
}

/// The one writer connection and the transaction batch it is gathering (group commit).
///
/// Every write runs in a savepoint of the batch's open transaction, then waits until the
/// batch is committed: the first of its members to come back commits it (one fsync for all
/// of them), the others find it done. With one writer at a time this is a plain transaction
/// per write; under load, the writes that queued while a commit's fsync ran share the next
/// one, so durable writes per second grow with the number of writers instead of being
/// capped by the disk's fsync rate. A write returns only once its batch is durable.
#[derive(Debug)]
struct Writer {
    conn: Connection,
    /// A batch's transaction is open: BEGIN IMMEDIATE ran, COMMIT did not yet.
    open: bool,
    /// The number of the batch being gathered; each commit (or failed commit) moves it on.
    batch: u64,
    /// Recent batches whose commit failed, with the reason, so every member reports it.
    failed: std::collections::VecDeque<(u64, String)>,
}

/// How many failed batches are remembered (members come back within one commit).
const FAILED_BATCHES: usize = 64;

impl Writer {
    fn new(conn: Connection) -> Self {
        Self {
            conn,
            open: false,
            batch: 0,
            failed: std::collections::VecDeque::new(),
        }
    }

    /// Commits the open batch, if any; the batch number moves on either way.
    fn commit(&mut self) -> std::result::Result<(), String> {
        if !self.open {
            return Ok(());
        }
        self.open = false;
        let done = self.batch;
        self.batch += 1;
        match self.conn.execute_batch("COMMIT") {
            Ok(()) => Ok(()),
            Err(e) => {
                let _ = self.conn.execute_batch("ROLLBACK");
                let why = e.to_string();
                self.failed.push_back((done, why.clone()));
                if self.failed.len() > FAILED_BATCHES {
                    self.failed.pop_front();
                }
                Err(why)
            }
        }
    }
}

/// Runs blocking SQLite work on the current thread, telling a multi-threaded runtime so that
/// its other tasks (lease heartbeats, API requests) move to another worker meanwhile.
fn blocking<T>(f: impl FnOnce() -> T) -> T {
    match tokio::runtime::Handle::try_current() {
        Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(f)
        }
        _ => f(),
    }
}

/// The SQLite store.
#[derive(Debug, Clone)]
pub struct SqliteStore {
    writer: Arc<tokio::sync::Mutex<Writer>>,
    /// `None` for an in-memory database (one connection for everything).
    readers: Option<Arc<Readers>>,
    /// Woken whenever work is queued or finished, so the worker picks it up at once.
    wake: Arc<Notify>,
    /// Seals cluster credentials and workspace contents (`store/src/seal.rs`).
    pub(super) sealer: Arc<Sealer>,
}

/// Creates the database file private (0600) if it is missing, and makes it and its `-wal`
/// and `-shm` private if they are not: SQLite gives those the database file's mode, and would
/// create the database with the umask's (0644 in a 0755 directory).
fn private_files(path: &Path) -> Result<()> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let failed = |p: &Path, e: std::io::Error| {
        StoreError::Database(format!("cannot make {} private: {e}", p.display()))
    };
    match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
    {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(failed(path, e)),
    }
    let mut siblings = vec![path.to_owned()];
    for suffix in ["-wal", "-shm"] {
        let mut p = path.as_os_str().to_owned();
        p.push(suffix);
        siblings.push(PathBuf::from(p));
    }
    for p in siblings {
        match std::fs::metadata(&p) {
            Ok(m) if m.permissions().mode() & 0o077 != 0 => {
                std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600))
                    .map_err(|e| failed(&p, e))?;
            }
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(failed(&p, e)),
        }
    }
    Ok(())
}

/// Seals what an older coordinator stored in clear (cluster credentials, workspace contents),
/// in one transaction, then checkpoints so the clear bytes leave the WAL too (with
/// `secure_delete` the freed pages are zeroed). The number of values sealed.
fn reseal(conn: &Connection, sealer: &Sealer) -> Result<usize> {
    let tx = conn.unchecked_transaction()?;
    let clusters: Vec<(String, String)> = tx
        .prepare("SELECT name, credentials FROM clusters WHERE credentials NOT LIKE 'sealed1:%'")?
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
        .collect::<rusqlite::Result<_>>()?;
    for (name, credentials) in &clusters {
        let sealed = sealer.seal_text(&seal::cluster_context(name), credentials)?;
        tx.execute(
            "UPDATE clusters SET credentials = ?2 WHERE name = ?1",
            params![name, sealed],
        )?;
    }
    let files: Vec<(String, String, String, Vec<u8>)> = tx
        .prepare(
            "SELECT namespace_id, agent_id, name, content FROM agent_workspace_files
             WHERE sealed = 0 AND content IS NOT NULL",
        )?
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))?
        .collect::<rusqlite::Result<_>>()?;
    for (ns, agent, name, content) in &files {
        let sealed = sealer.seal(&seal::workspace_context(ns, agent, name), content)?;
        tx.execute(
            "UPDATE agent_workspace_files SET content = ?4, sealed = 1
             WHERE namespace_id = ?1 AND agent_id = ?2 AND name = ?3",
            params![ns, agent, name, sealed],
        )?;
    }
    tx.commit()?;
    let n = clusters.len() + files.len();
    if n > 0 {
        conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))?;
        tracing::info!("sealed {n} values an older coordinator had stored in clear");
    }
    Ok(n)
}

fn configure(conn: &Connection) -> Result<()> {
    conn.pragma_update(None, "journal_mode", "WAL")?;
    conn.pragma_update(None, "foreign_keys", "ON")?;
    // Deleted and overwritten content is zeroed in the file, so workspace file contents the
    // store dropped cannot be read back from free pages.
    conn.pragma_update(None, "secure_delete", "ON")?;
    // FULL: an acknowledged deploy survives a power cut, not only a crash.
    conn.pragma_update(None, "synchronous", "FULL")?;
    conn.busy_timeout(Duration::from_secs(5))?;
    Ok(())
}

fn migrate(conn: &Connection) -> Result<()> {
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
    Ok(())
}

impl SqliteStore {
    /// Opens (creating if needed) and migrates the database file, with a key of this process
    /// only (tests; `occ` opens with [`SqliteStore::open_sealed`]).
    pub fn open(path: &Path) -> Result<Self> {
        Self::open_sealed(path, Arc::new(Sealer::ephemeral()))
    }

    /// Opens (creating it 0600 if needed) and migrates the database file, sealing with
    /// `sealer` and sealing what an older coordinator stored in clear.
    pub fn open_sealed(path: &Path, sealer: Arc<Sealer>) -> Result<Self> {
        private_files(path)?;
        let conn = Connection::open(path)?;
        configure(&conn)?;
        migrate(&conn)?;
        reseal(&conn, &sealer)?;
        private_files(path)?;
        Ok(Self {
            sealer,
            writer: Arc::new(tokio::sync::Mutex::new(Writer::new(conn))),
            readers: Some(Arc::new(Readers {
                path: path.to_owned(),
                idle: Mutex::new(Vec::new()),
                permits: Semaphore::new(READERS),
            })),
            wake: Arc::new(Notify::new()),
        })
    }

    /// An in-memory database, for tests.
    pub fn in_memory() -> Result<Self> {
        let conn = Connection::open_in_memory()?;
        configure(&conn)?;
        migrate(&conn)?;
        Ok(Self {
            sealer: Arc::new(Sealer::ephemeral()),
            writer: Arc::new(tokio::sync::Mutex::new(Writer::new(conn))),
            readers: None,
            wake: Arc::new(Notify::new()),
        })
    }

    /// Runs a read on a reader connection (the writer's, in memory). Reads of several
    /// statements run in one transaction, so they see one snapshot.
    pub(super) async fn read<T>(&self, f: impl FnOnce(&Connection) -> Result<T>) -> Result<T> {
        let Some(readers) = &self.readers else {
            let mut w = self.writer.lock().await;
            // In memory, reads share the writer: they see only committed batches.
            if let Err(why) = blocking(|| w.commit()) {
                return Err(StoreError::Unavailable(format!("commit failed: {why}")));
            }
            return blocking(|| f(&w.conn));
        };
        let _permit = readers
            .permits
            .acquire()
            .await
            .map_err(|e| StoreError::Unavailable(e.to_string()))?;
        let taken = match readers.idle.lock() {
            Ok(mut idle) => idle.pop(),
            Err(p) => p.into_inner().pop(),
        };
        let conn = match taken {
            Some(c) => c,
            None => {
                let c = Connection::open(&readers.path)?;
                c.busy_timeout(Duration::from_secs(5))?;
                // Readers never write: a statement that tried would fail here, not corrupt.
                c.pragma_update(None, "query_only", "ON")?;
                c
            }
        };
        let out = blocking(|| {
            let tx = conn.unchecked_transaction()?;
            let out = f(&tx);
            drop(tx);
            out
        });
        match readers.idle.lock() {
            Ok(mut idle) => idle.push(conn),
            Err(p) => p.into_inner().push(conn),
        }
        out
    }

    /// Runs `f` on the writer connection outside any transaction (after committing the
    /// batch being gathered), e.g. a checkpoint.
    pub(super) async fn write<T>(&self, f: impl FnOnce(&mut Connection) -> Result<T>) -> Result<T> {
        let mut w = self.writer.lock().await;
        blocking(|| {
            w.commit()
                .map_err(|why| StoreError::Unavailable(format!("commit failed: {why}")))?;
            f(&mut w.conn)
        })
    }

    /// Runs `f` as one transaction (a savepoint of the batch being gathered) and returns once
    /// it is durable ([`Writer`]); `f`'s error rolls back its own changes only. With a
    /// claim, refused (nothing written) unless the claim is still current.
    pub(super) async fn transact<T>(
        &self,
        claim: Option<&Claim>,
        f: impl FnOnce(&Connection) -> Result<T>,
    ) -> Result<T> {
        let (out, batch) = {
            let mut w = self.writer.lock().await;
            blocking(|| {
                if !w.open {
                    w.conn.execute_batch("BEGIN IMMEDIATE")?;
                    w.open = true;
                }
                w.conn.execute_batch("SAVEPOINT write")?;
                let out = match claim {
                    Some(claim) => check_claim(&w.conn, claim).and_then(|()| f(&w.conn)),
                    None => f(&w.conn),
                };
                let end = match out {
                    Ok(_) => w.conn.execute_batch("RELEASE write"),
                    Err(_) => w.conn.execute_batch("ROLLBACK TO write; RELEASE write"),
                };
                if let Err(e) = end {
                    // The batch's transaction is in an unknown state: abandon all of it.
                    let _ = w.conn.execute_batch("ROLLBACK");
                    w.open = false;
                    let done = w.batch;
                    w.batch += 1;
                    w.failed.push_back((done, e.to_string()));
                    return Err(StoreError::from(e));
                }
                Ok((out, w.batch))
            })?
        };
        // Writers queued behind this one join the batch now; the first member back commits.
        // In a task of its own, so a caller that goes away (a client that hung up) still
        // leaves its batch committed rather than open until the next write.
        let writer = self.writer.clone();
        let committed = tokio::spawn(async move {
            let mut w = writer.lock().await;
            if w.batch == batch {
                blocking(|| w.commit())
            } else {
                match w.failed.iter().find(|(b, _)| *b == batch) {
                    Some((_, why)) => Err(why.clone()),
                    None => Ok(()),
                }
            }
        });
        match committed.await {
            Ok(Ok(())) => out,
            Ok(Err(why)) => Err(StoreError::Unavailable(format!("commit failed: {why}"))),
            Err(e) => Err(StoreError::Unavailable(format!(
                "the commit did not finish: {e}"
            ))),
        }
    }

    /// Direct access to the writer, for tests that plant rows.
    pub async fn with_connection<T>(&self, f: impl FnOnce(&Connection) -> T) -> T {
        let mut w = self.writer.lock().await;
        let _ = w.commit();
        f(&w.conn)
    }
}

#[async_trait]
impl StoreMeta for SqliteStore {
    fn kind(&self) -> &'static str {
        "sqlite"
    }

    async fn schema_version(&self) -> Result<i64> {
        self.read(|c| Ok(c.query_row("SELECT MAX(version) FROM schema_version", [], |r| r.get(0))?))
            .await
    }

    async fn row_counts(&self) -> Result<Vec<(String, i64)>> {
        self.read(|c| {
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
        })
        .await
    }
}

/// The one lease row's name.
const LEADER: &str = "singleton";

#[async_trait]
impl LeaderLease for SqliteStore {
    async fn lead(&self, holder: &str, lease: Duration) -> Result<LeaseHeld> {
        let now = now_ms();
        let until = now.saturating_add(lease.as_millis() as i64);
        self.transact(None, |tx| {
            tx.execute(
                "INSERT INTO leader (name, holder, term, lease_until) VALUES (?1, ?2, 1, ?3)
                 ON CONFLICT (name) DO UPDATE SET
                   term = CASE WHEN leader.holder = excluded.holder THEN leader.term ELSE leader.term + 1 END,
                   holder = excluded.holder, lease_until = excluded.lease_until
                 WHERE leader.holder = excluded.holder OR leader.lease_until < ?4",
                params![LEADER, holder, until, now],
            )?;
            let (h, term): (String, i64) = tx.query_row(
                "SELECT holder, term FROM leader WHERE name = ?1",
                [LEADER],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )?;
            Ok(LeaseHeld {
                is_leader: h == holder,
                holder: h,
                term,
            })
        })
        .await
    }

    async fn resign(&self, holder: &str) -> Result<()> {
        self.transact(None, |tx| {
            tx.execute(
                "UPDATE leader SET lease_until = 0 WHERE name = ?1 AND holder = ?2",
                params![LEADER, holder],
            )?;
            Ok(())
        })
        .await
    }

    async fn prune(&self, work_older_than: i64, audit_older_than: i64) -> Result<Pruned> {
        let now = now_ms();
        self.transact(None, |tx| {
            // Work rows keep milliseconds; a rollout's Agents name their work, so only work no
            // open rollout still follows goes.
            let work = tx.execute(
                &format!("DELETE FROM work WHERE state IN ('done', 'failed') AND updated_at < ?1
                   AND id NOT IN (SELECT a.work_id FROM rollout_agents a JOIN rollouts r ON r.id = a.rollout_id
                                  WHERE a.work_id IS NOT NULL AND r.state IN {})", rollouts::open_list()),
                [now - work_older_than.saturating_mul(1000)],
            )?;
            let audit = tx.execute(
                "DELETE FROM audit WHERE at < ?1",
                [now / 1000 - audit_older_than],
            )?;
            Ok(Pruned {
                work: work as u64,
                audit: audit as u64,
            })
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    /// Group commit: concurrent writes share commits, each write's error undoes only its own
    /// changes, and every write that returned Ok is in the file after it is reopened.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_writes_share_commits_and_fail_alone() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("occ.db");
        let store = SqliteStore::open(&path).unwrap();
        store
            .write(|c| Ok(c.execute_batch("CREATE TABLE t (x INTEGER NOT NULL)")?))
            .await
            .unwrap();
        let mut set = tokio::task::JoinSet::new();
        for i in 0..64i64 {
            let store = store.clone();
            set.spawn(async move {
                store
                    .transact(None, |c| {
                        c.execute("INSERT INTO t (x) VALUES (?1)", [i])?;
                        if i % 4 == 0 {
                            return Err(StoreError::Corrupt(format!("write {i} refused")));
                        }
                        Ok(i)
                    })
                    .await
            });
        }
        let mut ok = 0;
        while let Some(r) = set.join_next().await {
            match r.unwrap() {
                Ok(i) => {
                    assert_ne!(i % 4, 0);
                    ok += 1;
                }
                Err(e) => assert!(e.to_string().contains("refused"), "{e}"),
            }
        }
        assert_eq!(ok, 48);
        let commits = store.writer.lock().await.batch;
        eprintln!("64 concurrent writes in {commits} commits");
        assert!(commits <= 64 + 1, "{commits}");
        drop(store);
        let reopened = SqliteStore::open(&path).unwrap();
        let (n, refused): (i64, i64) = reopened
            .read(|c| {
                Ok(c.query_row(
                    "SELECT count(*), count(*) FILTER (WHERE x % 4 = 0) FROM t",
                    [],
                    |r| Ok((r.get(0)?, r.get(1)?)),
                )?)
            })
            .await
            .unwrap();
        assert_eq!((n, refused), (48, 0));
    }
}
