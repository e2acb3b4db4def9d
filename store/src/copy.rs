//! `occ db migrate --to postgres://…`: copies a SQLite database into an empty PostgreSQL
//! database and checks the copy, for a fleet that outgrows one coordinator.
//!
//! The SQLite side is read inside a write transaction (`BEGIN IMMEDIATE`), so no coordinator
//! writes while it is copied; the PostgreSQL side is written in one transaction, so a copy that
//! fails leaves the target empty. Columns are copied by name with the type the PostgreSQL
//! schema gives them (BIGINT, BOOLEAN, TEXT, BYTEA), so the copy follows the schema rather than
//! a list that could drift from it. Identity sequences continue after the copied ids.

use std::path::Path;

use rusqlite::types::ValueRef;
use thiserror::Error;
use tokio_postgres::types::ToSql;

use super::postgres::PostgresStore;
use super::sqlite::MIGRATIONS;

/// Tables in an order that satisfies every foreign key.
const TABLES: &[&str] = &[
    "hosts",
    "clusters",
    "namespaces",
    "namespace_hosts",
    "configurations",
    "agents",
    "revisions",
    "work",
    "tokens",
    "token_grants",
    "audit",
    "drift",
    "rollouts",
    "rollout_agents",
    "agent_workspace",
    "agent_workspace_files",
    "plan_tokens_used",
    "secret_names",
    "secrets",
];

/// Tables with an identity column whose sequence must continue after the copied ids.
const IDENTITIES: &[&str] = &["work", "audit", "rollouts"];

/// Why the copy did not happen (nothing was written to the target).
#[derive(Debug, Error)]
pub enum CopyError {
    #[error("the SQLite database {path}: {message}")]
    Source { path: String, message: String },
    #[error(
        "the SQLite database is at schema version {found}, this occ writes {known}: run this occ's `occ serve` on it once first, or use the occ that wrote it"
    )]
    SourceVersion { found: i64, known: i64 },
    #[error(
        "the PostgreSQL database is not empty ({table} has {rows} rows): `occ db migrate` only copies into an empty database"
    )]
    TargetNotEmpty { table: String, rows: i64 },
    #[error("the PostgreSQL database: {0}")]
    Target(String),
    #[error("{table}.{column}: row {row} holds {found} where PostgreSQL takes {wanted}")]
    Value {
        table: String,
        column: String,
        row: usize,
        found: &'static str,
        wanted: String,
    },
    #[error("after the copy {table} has {copied} rows in PostgreSQL and {source_rows} in SQLite")]
    Mismatch {
        table: String,
        source_rows: i64,
        copied: i64,
    },
}

impl From<tokio_postgres::Error> for CopyError {
    fn from(e: tokio_postgres::Error) -> Self {
        CopyError::Target(super::StoreError::from(e).to_string())
    }
}

impl From<deadpool_postgres::PoolError> for CopyError {
    fn from(e: deadpool_postgres::PoolError) -> Self {
        CopyError::Target(super::StoreError::from(e).to_string())
    }
}

/// One value on its way, typed for its PostgreSQL column.
#[derive(Debug)]
enum Cell {
    Int(Option<i64>),
    Bool(Option<bool>),
    Text(Option<String>),
    Bytes(Option<Vec<u8>>),
}

impl Cell {
    fn sql(&self) -> &(dyn ToSql + Sync) {
        match self {
            Cell::Int(v) => v,
            Cell::Bool(v) => v,
            Cell::Text(v) => v,
            Cell::Bytes(v) => v,
        }
    }
}

fn kind_of(v: &ValueRef<'_>) -> &'static str {
    match v {
        ValueRef::Null => "NULL",
        ValueRef::Integer(_) => "an integer",
        ValueRef::Real(_) => "a real number",
        ValueRef::Text(_) => "text",
        ValueRef::Blob(_) => "a blob",
    }
}

fn cell(v: ValueRef<'_>, pg_type: &str) -> Option<Cell> {
    Some(match (pg_type, v) {
        ("bigint", ValueRef::Null) => Cell::Int(None),
        ("bigint", ValueRef::Integer(i)) => Cell::Int(Some(i)),
        ("boolean", ValueRef::Null) => Cell::Bool(None),
        ("boolean", ValueRef::Integer(i)) => Cell::Bool(Some(i != 0)),
        ("text", ValueRef::Null) => Cell::Text(None),
        ("text", ValueRef::Text(t)) => Cell::Text(Some(String::from_utf8(t.to_vec()).ok()?)),
        ("bytea", ValueRef::Null) => Cell::Bytes(None),
        ("bytea", ValueRef::Blob(b)) => Cell::Bytes(Some(b.to_vec())),
        _ => return None,
    })
}

/// Copies every row of the SQLite database at `source` into `target` (migrated, empty) and
/// returns the rows per table, as checked in both.
pub async fn sqlite_to_postgres(
    source: &Path,
    target: &PostgresStore,
) -> Result<Vec<(String, i64)>, CopyError> {
    let src_err = |e: rusqlite::Error| CopyError::Source {
        path: source.display().to_string(),
        message: e.to_string(),
    };
    if !source.exists() {
        return Err(CopyError::Source {
            path: source.display().to_string(),
            message: "does not exist".to_owned(),
        });
    }
    let mut sqlite =
        rusqlite::Connection::open_with_flags(source, rusqlite::OpenFlags::SQLITE_OPEN_READ_WRITE)
            .map_err(src_err)?;
    sqlite
        .busy_timeout(std::time::Duration::from_secs(10))
        .map_err(src_err)?;
    let found: i64 = sqlite
        .query_row(
            "SELECT COALESCE(MAX(version), 0) FROM schema_version",
            [],
            |r| r.get(0),
        )
        .map_err(src_err)?;
    let known = MIGRATIONS.len() as i64;
    if found != known {
        return Err(CopyError::SourceVersion { found, known });
    }
    // No coordinator writes to the source while it is read.
    let read = sqlite
        .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
        .map_err(src_err)?;
    let mut pg = target
        .client()
        .await
        .map_err(|e| CopyError::Target(e.to_string()))?;
    let tx = pg.transaction().await?;
    for table in TABLES.iter().chain(["leader"].iter()) {
        let rows: i64 = tx
            .query_one(&format!("SELECT count(*) FROM {table}"), &[])
            .await?
            .try_get(0)?;
        if rows > 0 {
            return Err(CopyError::TargetNotEmpty {
                table: (*table).to_owned(),
                rows,
            });
        }
    }
    let mut counts = Vec::new();
    for table in TABLES {
        let columns: Vec<(String, String)> = tx
            .query(
                "SELECT column_name::text, data_type::text FROM information_schema.columns
                 WHERE table_schema = current_schema() AND table_name = $1 ORDER BY ordinal_position",
                &[table],
            )
            .await?
            .iter()
            .map(|r| Ok((r.try_get(0)?, r.try_get(1)?)))
            .collect::<Result<_, tokio_postgres::Error>>()?;
        let names: Vec<&str> = columns.iter().map(|(n, _)| n.as_str()).collect();
        let placeholders: Vec<String> = (1..=columns.len()).map(|i| format!("${i}")).collect();
        let insert = tx
            .prepare(&format!(
                "INSERT INTO {table} ({}) VALUES ({})",
                names.join(", "),
                placeholders.join(", ")
            ))
            .await?;
        let mut stmt = read
            .prepare(&format!("SELECT {} FROM {table}", names.join(", ")))
            .map_err(src_err)?;
        let mut rows = stmt.query([]).map_err(src_err)?;
        let mut n = 0usize;
        while let Some(row) = rows.next().map_err(src_err)? {
            n += 1;
            let mut cells = Vec::with_capacity(columns.len());
            for (i, (column, pg_type)) in columns.iter().enumerate() {
                let v = row.get_ref(i).map_err(src_err)?;
                let found = kind_of(&v);
                cells.push(cell(v, pg_type).ok_or_else(|| CopyError::Value {
                    table: (*table).to_owned(),
                    column: column.clone(),
                    row: n,
                    found,
                    wanted: pg_type.clone(),
                })?);
            }
            let params: Vec<&(dyn ToSql + Sync)> = cells.iter().map(Cell::sql).collect();
            tx.execute(&insert, &params).await?;
        }
        counts.push(((*table).to_owned(), n as i64));
    }
    for table in IDENTITIES {
        tx.execute(
            &format!(
                "SELECT setval(pg_get_serial_sequence('{table}', 'id'), COALESCE((SELECT MAX(id) FROM {table}), 0) + 1, false)"
            ),
            &[],
        )
        .await?;
    }
    // Fences go on from the highest one issued, so hosts accept the new coordinators.
    let fence: i64 = read
        .query_row("SELECT value FROM fence_counter WHERE id = 1", [], |r| {
            r.get(0)
        })
        .map_err(src_err)?;
    if fence > 0 {
        tx.execute("SELECT setval('agent_fence', $1)", &[&fence])
            .await?;
    }
    // The check: both sides count the same rows in every table.
    for (table, copied) in &counts {
        let source_rows: i64 = read
            .query_row(&format!("SELECT count(*) FROM {table}"), [], |r| r.get(0))
            .map_err(src_err)?;
        let in_target: i64 = tx
            .query_one(&format!("SELECT count(*) FROM {table}"), &[])
            .await?
            .try_get(0)?;
        if source_rows != in_target || *copied != in_target {
            return Err(CopyError::Mismatch {
                table: table.clone(),
                source_rows,
                copied: in_target,
            });
        }
    }
    tx.commit().await?;
    drop(read);
    Ok(counts)
}
