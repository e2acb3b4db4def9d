//! Secrets of a Namespace (see `store/src/sqlite/secrets.rs` for what is kept). A version is
//! allocated by one upsert of the name's row, so concurrent writes of one secret get distinct
//! versions. A deleted version's sealed bytes stay in dead row versions and the WAL until the
//! server recycles them; they are ciphertext under the key-encryption key.

use async_trait::async_trait;
use clawfleet_protocol::{SecretFingerprint, SecretName};
use tokio_postgres::Row;

use super::{Cached, PostgresStore, id_col, narrow};
use crate::model::{SecretValue, SecretVersion};
use crate::seal;
use crate::{Result, SecretStore};

const SELECT: &str = "SELECT name, version, fingerprint, written_by, written_at FROM secrets
     WHERE namespace_id = $1 AND ($2::text IS NULL OR name = $2) ORDER BY name, version";

fn version_row(r: &Row) -> Result<SecretVersion> {
    Ok(SecretVersion {
        name: id_col(r, 0)?,
        version: narrow(r.try_get(1)?, "secret version")?,
        fingerprint: id_col(r, 2)?,
        written_by: r.try_get(3)?,
        written_at: r.try_get(4)?,
    })
}

impl PostgresStore {
    async fn secret_rows(&self, ns: &str, name: Option<&str>) -> Result<Vec<SecretVersion>> {
        let c = self.client().await?;
        c.rows(SELECT, &[&ns, &name])
            .await?
            .iter()
            .map(version_row)
            .collect()
    }
}

#[async_trait]
impl SecretStore for PostgresStore {
    async fn put_secret(
        &self,
        ns: &str,
        name: &SecretName,
        value: &[u8],
        actor: &str,
        now: i64,
    ) -> Result<Option<SecretVersion>> {
        let fingerprint = SecretFingerprint::of(value);
        let mut c = self.client().await?;
        let tx = c.transaction().await?;
        let live = tx
            .opt(
                "SELECT deleting FROM namespaces WHERE id = $1 FOR SHARE",
                &[&ns],
            )
            .await?
            .map(|r| r.try_get::<_, bool>(0))
            .transpose()?;
        if live != Some(false) {
            return Ok(None);
        }
        let version: i64 = tx
            .one(
                "INSERT INTO secret_names (namespace_id, name, last_version) VALUES ($1, $2, 1)
                 ON CONFLICT (namespace_id, name)
                 DO UPDATE SET last_version = secret_names.last_version + 1
                 RETURNING last_version",
                &[&ns, &name.as_str()],
            )
            .await?
            .try_get(0)?;
        let version: u32 = narrow(version, "secret version")?;
        let sealed = self
            .sealer
            .seal(&seal::secret_context(ns, name, version), value)?;
        tx.exec(
            "INSERT INTO secrets (namespace_id, name, version, fingerprint, value, written_by, written_at)
             VALUES ($1, $2, $3, $4, $5, $6, $7)",
            &[
                &ns,
                &name.as_str(),
                &i64::from(version),
                &fingerprint.as_str(),
                &sealed,
                &actor,
                &now,
            ],
        )
        .await?;
        super::audit::insert(
            &tx,
            (actor, "secret.set", &format!("{ns}/{name}")),
            &serde_json::json!({"version": version, "fingerprint": fingerprint}),
            now,
        )
        .await?;
        tx.commit().await?;
        Ok(Some(SecretVersion {
            name: name.clone(),
            version,
            fingerprint,
            written_by: actor.to_owned(),
            written_at: now,
        }))
    }

    async fn secrets(&self, ns: &str) -> Result<Vec<SecretVersion>> {
        self.secret_rows(ns, None).await
    }

    async fn secret_versions(&self, ns: &str, name: &str) -> Result<Vec<SecretVersion>> {
        self.secret_rows(ns, Some(name)).await
    }

    async fn secret_value(
        &self,
        ns: &str,
        name: &str,
        version: u32,
    ) -> Result<Option<SecretValue>> {
        let c = self.client().await?;
        let Some(row) = c
            .opt(
                "SELECT fingerprint, value FROM secrets
                 WHERE namespace_id = $1 AND name = $2 AND version = $3",
                &[&ns, &name, &i64::from(version)],
            )
            .await?
        else {
            return Ok(None);
        };
        let fingerprint: SecretFingerprint = id_col(&row, 0)?;
        let sealed: Vec<u8> = row.try_get(1)?;
        crate::open_secret(&self.sealer, ns, name, version, fingerprint, &sealed).map(Some)
    }

    async fn delete_secret(&self, ns: &str, name: &str, actor: &str, now: i64) -> Result<bool> {
        let mut c = self.client().await?;
        let tx = c.transaction().await?;
        let n = tx
            .exec(
                "DELETE FROM secrets WHERE namespace_id = $1 AND name = $2",
                &[&ns, &name],
            )
            .await?;
        if n == 0 {
            return Ok(false);
        }
        super::audit::insert(
            &tx,
            (actor, "secret.delete", &format!("{ns}/{name}")),
            &serde_json::json!({"versions": n}),
            now,
        )
        .await?;
        tx.commit().await?;
        Ok(true)
    }
}
