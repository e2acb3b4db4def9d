//! Secrets of a Namespace: one row per version with its sealed value, fingerprint, writer and
//! time; and per name the last version issued, so a version number is never reused. Only
//! [`SecretStore::secret_value`] opens a value. A delete zeroes the freed pages
//! (`secure_delete`) and checkpoints, so the sealed bytes leave the WAL too.

use async_trait::async_trait;
use clawfleet_protocol::{SecretFingerprint, SecretName};
use rusqlite::{Connection, OptionalExtension, params};

use super::{SqliteStore, audit, id_col};
use crate::model::{SecretValue, SecretVersion};
use crate::seal;
use crate::{Result, SecretStore, StoreError};

const COLS: &str = "name, version, fingerprint, written_by, written_at";

fn version_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<SecretVersion> {
    Ok(SecretVersion {
        name: id_col(r, 0)?,
        version: r.get(1)?,
        fingerprint: id_col(r, 2)?,
        written_by: r.get(3)?,
        written_at: r.get(4)?,
    })
}

fn versions(c: &Connection, ns: &str, name: Option<&str>) -> Result<Vec<SecretVersion>> {
    let mut st = c.prepare(&format!(
        "SELECT {COLS} FROM secrets WHERE namespace_id = ?1 AND (?2 IS NULL OR name = ?2)
         ORDER BY name, version"
    ))?;
    Ok(st
        .query_map(params![ns, name], version_row)?
        .collect::<rusqlite::Result<Vec<_>>>()?)
}

#[async_trait]
impl SecretStore for SqliteStore {
    async fn put_secret(
        &self,
        ns: &str,
        name: &SecretName,
        value: &[u8],
        actor: &str,
        now: i64,
    ) -> Result<Option<SecretVersion>> {
        let fingerprint = SecretFingerprint::of(value);
        self.transact(None, |tx| {
            let live: Option<bool> = tx
                .query_row(
                    "SELECT deleting FROM namespaces WHERE id = ?1",
                    params![ns],
                    |r| r.get(0),
                )
                .optional()?;
            if live != Some(false) {
                return Ok(None);
            }
            let last: Option<u32> = tx
                .query_row(
                    "SELECT last_version FROM secret_names WHERE namespace_id = ?1 AND name = ?2",
                    params![ns, name.as_str()],
                    |r| r.get(0),
                )
                .optional()?;
            let version = last.unwrap_or(0).checked_add(1).ok_or_else(|| {
                StoreError::Corrupt(format!("secret {ns}/{name}: version counter at its end"))
            })?;
            tx.execute(
                "INSERT INTO secret_names (namespace_id, name, last_version) VALUES (?1, ?2, ?3)
                 ON CONFLICT (namespace_id, name) DO UPDATE SET last_version = excluded.last_version",
                params![ns, name.as_str(), version],
            )?;
            let sealed = self
                .sealer
                .seal(&seal::secret_context(ns, name, version), value)?;
            tx.execute(
                "INSERT INTO secrets (namespace_id, name, version, fingerprint, value, written_by, written_at)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
                params![ns, name.as_str(), version, fingerprint.as_str(), sealed, actor, now],
            )?;
            audit::insert(
                tx,
                (actor, "secret.set", &format!("{ns}/{name}")),
                &serde_json::json!({"version": version, "fingerprint": fingerprint}),
                now,
            )?;
            Ok(Some(SecretVersion {
                name: name.clone(),
                version,
                fingerprint: fingerprint.clone(),
                written_by: actor.to_owned(),
                written_at: now,
            }))
        })
        .await
    }

    async fn secrets(&self, ns: &str) -> Result<Vec<SecretVersion>> {
        self.read(|c| versions(c, ns, None)).await
    }

    async fn secret_versions(&self, ns: &str, name: &str) -> Result<Vec<SecretVersion>> {
        self.read(|c| versions(c, ns, Some(name))).await
    }

    async fn secret_value(
        &self,
        ns: &str,
        name: &str,
        version: u32,
    ) -> Result<Option<SecretValue>> {
        let row = self
            .read(|c| {
                Ok(c.query_row(
                    "SELECT fingerprint, value FROM secrets
                     WHERE namespace_id = ?1 AND name = ?2 AND version = ?3",
                    params![ns, name, version],
                    |r| Ok((id_col::<SecretFingerprint>(r, 0)?, r.get::<_, Vec<u8>>(1)?)),
                )
                .optional()?)
            })
            .await?;
        let Some((fingerprint, sealed)) = row else {
            return Ok(None);
        };
        crate::open_secret(&self.sealer, ns, name, version, fingerprint, &sealed).map(Some)
    }

    async fn delete_secret(&self, ns: &str, name: &str, actor: &str, now: i64) -> Result<bool> {
        let deleted = self
            .transact(None, |tx| {
                let n = tx.execute(
                    "DELETE FROM secrets WHERE namespace_id = ?1 AND name = ?2",
                    params![ns, name],
                )?;
                if n > 0 {
                    audit::insert(
                        tx,
                        (actor, "secret.delete", &format!("{ns}/{name}")),
                        &serde_json::json!({"versions": n}),
                        now,
                    )?;
                }
                Ok(n > 0)
            })
            .await?;
        if deleted {
            self.write(|c| {
                c.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))?;
                Ok(())
            })
            .await?;
        }
        Ok(deleted)
    }
}
