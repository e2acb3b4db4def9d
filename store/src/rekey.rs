//! `occ db rekey`: replaces the key-encryption key (`store/src/seal.rs`). Every sealed value
//! (secret values, cluster credentials, workspace file contents) is opened with the current
//! key and sealed with the new one in one transaction, so either all of them move to the new
//! key or none does. Coordinators are stopped meanwhile; afterwards the new key file replaces
//! the old one.

use std::sync::Arc;

use super::database::Database;
use super::postgres::PostgresStore;
use super::seal::{self, Sealer};
use super::{Result, StoreError};

/// How many values moved to the new key, per kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Rekeyed {
    pub secrets: usize,
    pub cluster_credentials: usize,
    pub workspace_files: usize,
}

/// Reseals every sealed value of `database` from `old` to `new`.
pub async fn rekey(database: &Database, old: Arc<Sealer>, new: &Sealer) -> Result<Rekeyed> {
    match database {
        Database::Sqlite(path) => {
            // Opening migrates the schema and seals what an older coordinator left in clear.
            drop(super::sqlite::SqliteStore::open_sealed(path, old.clone())?);
            let mut conn = rusqlite::Connection::open(path)?;
            conn.busy_timeout(std::time::Duration::from_secs(10))?;
            conn.pragma_update(None, "secure_delete", "ON")?;
            let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
            let n = sqlite_rekey(&tx, &old, new)?;
            tx.commit()?;
            conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))?;
            Ok(n)
        }
        Database::Postgres(settings) => {
            let store = PostgresStore::connect_sealed(settings.clone(), old.clone()).await?;
            let mut c = store.client().await?;
            let tx = c.transaction().await?;
            let n = postgres_rekey(&tx, &old, new).await?;
            tx.commit().await?;
            Ok(n)
        }
    }
}

fn sqlite_rekey(tx: &rusqlite::Connection, old: &Sealer, new: &Sealer) -> Result<Rekeyed> {
    use rusqlite::params;
    let mut n = Rekeyed::default();
    let secrets: Vec<(String, String, u32, Vec<u8>)> = tx
        .prepare("SELECT namespace_id, name, version, value FROM secrets")?
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))?
        .collect::<rusqlite::Result<_>>()?;
    for (ns, name, version, sealed) in secrets {
        let context = seal::secret_context(&ns, &name, version);
        let plain = zeroize::Zeroizing::new(old.open(&context, &sealed)?);
        tx.execute(
            "UPDATE secrets SET value = ?4 WHERE namespace_id = ?1 AND name = ?2 AND version = ?3",
            params![ns, name, version, new.seal(&context, &plain)?],
        )?;
        n.secrets += 1;
    }
    let clusters: Vec<(String, String)> = tx
        .prepare("SELECT name, credentials FROM clusters")?
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
        .collect::<rusqlite::Result<_>>()?;
    for (name, stored) in clusters {
        let context = seal::cluster_context(&name);
        let plain = zeroize::Zeroizing::new(old.open_text(&context, stored)?);
        tx.execute(
            "UPDATE clusters SET credentials = ?2 WHERE name = ?1",
            params![name, new.seal_text(&context, &plain)?],
        )?;
        n.cluster_credentials += 1;
    }
    let files: Vec<(String, String, String, Vec<u8>)> = tx
        .prepare(
            "SELECT namespace_id, agent_id, name, content FROM agent_workspace_files
             WHERE sealed = 1 AND content IS NOT NULL",
        )?
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))?
        .collect::<rusqlite::Result<_>>()?;
    for (ns, agent, name, sealed) in files {
        let context = seal::workspace_context(&ns, &agent, &name);
        let plain = zeroize::Zeroizing::new(old.open(&context, &sealed)?);
        tx.execute(
            "UPDATE agent_workspace_files SET content = ?4
             WHERE namespace_id = ?1 AND agent_id = ?2 AND name = ?3",
            params![ns, agent, name, new.seal(&context, &plain)?],
        )?;
        n.workspace_files += 1;
    }
    Ok(n)
}

async fn postgres_rekey(
    tx: &deadpool_postgres::Transaction<'_>,
    old: &Sealer,
    new: &Sealer,
) -> Result<Rekeyed> {
    let mut n = Rekeyed::default();
    let narrow =
        |v: i64| u32::try_from(v).map_err(|_| StoreError::Corrupt(format!("secret version {v}")));
    for r in tx
        .query(
            "SELECT namespace_id, name, version, value FROM secrets FOR UPDATE",
            &[],
        )
        .await?
    {
        let (ns, name, version): (String, String, i64) =
            (r.try_get(0)?, r.try_get(1)?, r.try_get(2)?);
        let sealed: Vec<u8> = r.try_get(3)?;
        let context = seal::secret_context(&ns, &name, narrow(version)?);
        let plain = zeroize::Zeroizing::new(old.open(&context, &sealed)?);
        tx.execute(
            "UPDATE secrets SET value = $4 WHERE namespace_id = $1 AND name = $2 AND version = $3",
            &[&ns, &name, &version, &new.seal(&context, &plain)?],
        )
        .await?;
        n.secrets += 1;
    }
    for r in tx
        .query("SELECT name, credentials FROM clusters FOR UPDATE", &[])
        .await?
    {
        let (name, stored): (String, String) = (r.try_get(0)?, r.try_get(1)?);
        let context = seal::cluster_context(&name);
        let plain = zeroize::Zeroizing::new(old.open_text(&context, stored)?);
        tx.execute(
            "UPDATE clusters SET credentials = $2 WHERE name = $1",
            &[&name, &new.seal_text(&context, &plain)?],
        )
        .await?;
        n.cluster_credentials += 1;
    }
    for r in tx
        .query(
            "SELECT namespace_id, agent_id, name, content FROM agent_workspace_files
             WHERE sealed AND content IS NOT NULL FOR UPDATE",
            &[],
        )
        .await?
    {
        let (ns, agent, name): (String, String, String) =
            (r.try_get(0)?, r.try_get(1)?, r.try_get(2)?);
        let sealed: Vec<u8> = r.try_get(3)?;
        let context = seal::workspace_context(&ns, &agent, &name);
        let plain = zeroize::Zeroizing::new(old.open(&context, &sealed)?);
        tx.execute(
            "UPDATE agent_workspace_files SET content = $4
             WHERE namespace_id = $1 AND agent_id = $2 AND name = $3",
            &[&ns, &agent, &name, &new.seal(&context, &plain)?],
        )
        .await?;
        n.workspace_files += 1;
    }
    Ok(n)
}
