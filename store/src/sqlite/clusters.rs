//! Registered Kubernetes clusters; their credentials leave the store only through
//! [`ClusterStore::cluster`], for the backend.

use async_trait::async_trait;
use rusqlite::{OptionalExtension, Row, params};
use serde_json::Value;

use super::{SqliteStore, json_col};
use crate::model::{Cluster, ClusterRecord};
use crate::{ClusterStore, Result, seal};

/// name, server, settings, created_at, last_probe.
type ClusterRow = (String, String, String, i64, Option<String>);

fn cluster_row(r: &Row<'_>) -> rusqlite::Result<ClusterRow> {
    r.try_into()
}

fn finish_cluster((name, server, settings, created_at, probe): ClusterRow) -> Result<Cluster> {
    Ok(Cluster {
        name,
        server,
        settings: json_col(settings)?,
        created_at,
        last_probe: probe.map(json_col).transpose()?,
    })
}

#[async_trait]
impl ClusterStore for SqliteStore {
    async fn insert_cluster(&self, c: &ClusterRecord) -> Result<bool> {
        let credentials = self.sealer.seal_text(
            &seal::cluster_context(&c.cluster.name),
            &c.credentials.to_string(),
        )?;
        self.transact(None, |tx| {
            Ok(tx.execute(
                "INSERT OR IGNORE INTO clusters (name, server, credentials, settings, created_at, last_probe) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                params![
                    c.cluster.name,
                    c.cluster.server,
                    credentials,
                    c.cluster.settings.to_string(),
                    c.cluster.created_at,
                    c.cluster.last_probe.as_ref().map(Value::to_string)
                ],
            )? > 0)
        })
        .await
    }

    async fn update_cluster(&self, c: &ClusterRecord) -> Result<bool> {
        self.transact(None, |tx| {
            Ok(tx.execute(
                "UPDATE clusters SET server = ?2, credentials = ?3, settings = ?4, last_probe = ?5 WHERE name = ?1",
                params![
                    c.cluster.name,
                    c.cluster.server,
                    c.credentials.to_string(),
                    c.cluster.settings.to_string(),
                    c.cluster.last_probe.as_ref().map(Value::to_string)
                ],
            )? > 0)
        })
        .await
    }

    async fn cluster(&self, name: &str) -> Result<Option<ClusterRecord>> {
        self.read(|c| {
            let row: Option<(ClusterRow, String)> = c
                .query_row(
                    "SELECT name, server, settings, created_at, last_probe, credentials FROM clusters WHERE name = ?1",
                    [name],
                    |r| Ok((cluster_row(r)?, r.get(5)?)),
                )
                .optional()?;
            row.map(|(row, credentials)| {
                Ok(ClusterRecord {
                    cluster: finish_cluster(row)?,
                    credentials: json_col(
                        self.sealer
                            .open_text(&seal::cluster_context(name), credentials)?,
                    )?,
                })
            })
            .transpose()
        })
        .await
    }

    async fn clusters(&self) -> Result<Vec<Cluster>> {
        self.read(|c| {
            let mut st = c.prepare(
                "SELECT name, server, settings, created_at, last_probe FROM clusters ORDER BY name",
            )?;
            let rows = st.query_map([], cluster_row)?;
            rows.map(|r| finish_cluster(r?)).collect()
        })
        .await
    }

    async fn delete_cluster(&self, name: &str) -> Result<Option<bool>> {
        self.transact(None, |tx| {
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
            Ok(Some(true))
        })
        .await
    }
}
