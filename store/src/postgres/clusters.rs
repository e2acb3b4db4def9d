//! Registered Kubernetes clusters; their credentials leave the store only through
//! [`ClusterStore::cluster`], for the backend.

use async_trait::async_trait;
use serde_json::Value;
use tokio_postgres::Row;

use super::{Cached, PostgresStore};
use crate::model::{Cluster, ClusterRecord};
use crate::{ClusterStore, Result, StoreError, seal};

fn json(t: String) -> Result<Value> {
    serde_json::from_str(&t).map_err(|e| StoreError::Corrupt(e.to_string()))
}

fn cluster(r: &Row) -> Result<Cluster> {
    Ok(Cluster {
        name: r.try_get(0)?,
        server: r.try_get(1)?,
        settings: json(r.try_get(2)?)?,
        created_at: r.try_get(3)?,
        last_probe: r.try_get::<_, Option<String>>(4)?.map(json).transpose()?,
    })
}

#[async_trait]
impl ClusterStore for PostgresStore {
    async fn insert_cluster(&self, c: &ClusterRecord) -> Result<bool> {
        let credentials = self.sealer.seal_text(
            &seal::cluster_context(&c.cluster.name),
            &c.credentials.to_string(),
        )?;
        let db = self.client().await?;
        Ok(db
            .exec(
                "INSERT INTO clusters (name, server, credentials, settings, created_at, last_probe) VALUES ($1, $2, $3, $4, $5, $6)
                 ON CONFLICT (name) DO NOTHING",
                &[
                    &c.cluster.name,
                    &c.cluster.server,
                    &credentials,
                    &c.cluster.settings.to_string(),
                    &c.cluster.created_at,
                    &c.cluster.last_probe.as_ref().map(Value::to_string),
                ],
            )
            .await?
            > 0)
    }

    async fn update_cluster(&self, c: &ClusterRecord) -> Result<bool> {
        let db = self.client().await?;
        Ok(db
            .exec(
                "UPDATE clusters SET server = $2, credentials = $3, settings = $4, last_probe = $5 WHERE name = $1",
                &[
                    &c.cluster.name,
                    &c.cluster.server,
                    &c.credentials.to_string(),
                    &c.cluster.settings.to_string(),
                    &c.cluster.last_probe.as_ref().map(Value::to_string),
                ],
            )
            .await?
            > 0)
    }

    async fn cluster(&self, name: &str) -> Result<Option<ClusterRecord>> {
        let db = self.client().await?;
        let Some(r) = db
            .opt(
                "SELECT name, server, settings, created_at, last_probe, credentials FROM clusters WHERE name = $1",
                &[&name],
            )
            .await?
        else {
            return Ok(None);
        };
        Ok(Some(ClusterRecord {
            cluster: cluster(&r)?,
            credentials: json(
                self.sealer
                    .open_text(&seal::cluster_context(name), r.try_get(5)?)?,
            )?,
        }))
    }

    async fn clusters(&self) -> Result<Vec<Cluster>> {
        let db = self.client().await?;
        db.rows(
            "SELECT name, server, settings, created_at, last_probe FROM clusters ORDER BY name",
            &[],
        )
        .await?
        .iter()
        .map(cluster)
        .collect()
    }

    async fn delete_cluster(&self, name: &str) -> Result<Option<bool>> {
        let mut db = self.client().await?;
        let tx = db.transaction().await?;
        if tx
            .opt(
                "SELECT 1 FROM clusters WHERE name = $1 FOR UPDATE",
                &[&name],
            )
            .await?
            .is_none()
        {
            return Ok(None);
        }
        let used: i64 = tx
            .one(
                "SELECT COUNT(*) FROM namespaces WHERE cluster_name = $1",
                &[&name],
            )
            .await?
            .try_get(0)?;
        if used > 0 {
            return Ok(Some(false));
        }
        tx.exec("DELETE FROM clusters WHERE name = $1", &[&name])
            .await?;
        tx.commit().await?;
        Ok(Some(true))
    }
}
