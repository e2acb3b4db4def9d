//! The embedded default: SQLite (bundled), WAL, `synchronous=FULL`, versioned migrations
//! (`migrations.rs`). One writer connection, and a few reader connections so that reads never
//! wait behind the worker's writes (WAL lets readers see the last commit while a write is in
//! progress). Waiting for a connection is asynchronous; the statements themselves are short
//! and run on the caller's task.
//!
//! One file per aggregate, each implementing its trait from `store/mod.rs`.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use rusqlite::{Connection, OptionalExtension, params};
use tokio::sync::{Notify, Semaphore};

use super::{Claim, LeaderLease, Leadership, Pruned, Result, StoreError, StoreMeta};
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
mod tokens;
pub(crate) mod work;
mod workspace;

pub use migrations::MIGRATIONS;
pub(crate) use work::barrier_list;

/// Reader connections of a file database.
const READERS: usize = 4;

impl From<rusqlite::Error> for StoreError {
    fn from(e: rusqlite::Error) -> Self {
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
pub(super) fn json_col(text: String) -> Result<serde_json::Value> {
    serde_json::from_str(&text).map_err(|e| StoreError::Corrupt(e.to_string()))
}

/// A text enum column.
pub(super) fn parse_col<T>(text: &str, what: &str, parse: fn(&str) -> Option<T>) -> Result<T> {
    parse(text).ok_or_else(|| StoreError::Corrupt(format!("{what} {text:?}")))
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
        None => Err(StoreError::ClaimLost {
            work: claim.work,
            token: claim.token,
        }),
    }
}

/// Reader connections: taken and given back; their number bounded by a semaphore.
#[derive(Debug)]
struct Readers {
    path: PathBuf,
    idle: Mutex<Vec<Connection>>,
    permits: Semaphore,
}

/// The SQLite store.
#[derive(Debug, Clone)]
pub struct SqliteStore {
    writer: Arc<tokio::sync::Mutex<Connection>>,
    /// `None` for an in-memory database (one connection for everything).
    readers: Option<Arc<Readers>>,
    /// Woken whenever work is queued or finished, so the worker picks it up at once.
    wake: Arc<Notify>,
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
    /// Opens (creating if needed) and migrates the database file.
    pub fn open(path: &Path) -> Result<Self> {
        let conn = Connection::open(path)?;
        configure(&conn)?;
        migrate(&conn)?;
        Ok(Self {
            writer: Arc::new(tokio::sync::Mutex::new(conn)),
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
            writer: Arc::new(tokio::sync::Mutex::new(conn)),
            readers: None,
            wake: Arc::new(Notify::new()),
        })
    }

    /// Runs a read on a reader connection (the writer's, in memory). Reads of several
    /// statements run in one transaction, so they see one snapshot.
    pub(super) async fn read<T>(&self, f: impl FnOnce(&Connection) -> Result<T>) -> Result<T> {
        let Some(readers) = &self.readers else {
            let c = self.writer.lock().await;
            return f(&c);
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
        let out = {
            let tx = conn.unchecked_transaction()?;
            let out = f(&tx);
            drop(tx);
            out
        };
        match readers.idle.lock() {
            Ok(mut idle) => idle.push(conn),
            Err(p) => p.into_inner().push(conn),
        }
        out
    }

    /// Runs a write on the one writer connection.
    pub(super) async fn write<T>(&self, f: impl FnOnce(&mut Connection) -> Result<T>) -> Result<T> {
        let mut c = self.writer.lock().await;
        f(&mut c)
    }

    /// Runs `f` in an immediate transaction that is committed when it returns `Ok`; with a
    /// claim, refused (nothing written) unless the claim is still current.
    pub(super) async fn transact<T>(
        &self,
        claim: Option<&Claim>,
        f: impl FnOnce(&rusqlite::Transaction<'_>) -> Result<T>,
    ) -> Result<T> {
        self.write(|c| {
            let tx = c.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
            if let Some(claim) = claim {
                check_claim(&tx, claim)?;
            }
            let out = f(&tx)?;
            tx.commit()?;
            Ok(out)
        })
        .await
    }

    /// Direct access to the writer, for tests that plant rows.
    pub async fn with_connection<T>(&self, f: impl FnOnce(&Connection) -> T) -> T {
        let c = self.writer.lock().await;
        f(&c)
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
    async fn lead(&self, holder: &str, lease: Duration) -> Result<Leadership> {
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
            Ok(Leadership {
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
