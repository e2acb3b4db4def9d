//! Namespaces and their pools (or their cluster).

use async_trait::async_trait;
use rusqlite::{OptionalExtension, params};

use super::{SqliteStore, id_col, work};
use crate::model::Namespace;
use crate::{Claim, Enqueue, NamespaceInsert, NamespaceStore, Result};
use clawfleet_protocol::Ident;

fn namespace_in(c: &rusqlite::Connection, id: &str) -> Result<Option<Namespace>> {
    type NamespaceRow = (Ident, Ident, bool, i64, Option<String>, bool, bool);
    let row: Option<NamespaceRow> = c
        .query_row(
            "SELECT id, name, deleting, created_at, cluster_name, cluster_ready, single_tenant FROM namespaces WHERE id = ?1",
            [id],
            |r| {
                Ok((
                    id_col(r, 0)?,
                    id_col(r, 1)?,
                    r.get(2)?,
                    r.get(3)?,
                    r.get(4)?,
                    r.get(5)?,
                    r.get(6)?,
                ))
            },
        )
        .optional()?;
    let Some((id, name, deleting, created_at, cluster, cluster_ready, single_tenant)) = row else {
        return Ok(None);
    };
    let mut st = c.prepare(
        "SELECT host_name, ready FROM namespace_hosts WHERE namespace_id = ?1 ORDER BY host_name",
    )?;
    let pool: Vec<(String, bool)> = st
        .query_map([id.as_str()], |r| Ok((r.get(0)?, r.get(1)?)))?
        .collect::<rusqlite::Result<_>>()?;
    Ok(Some(Namespace::from_pool(
        (id, name),
        pool,
        cluster.map(|c| (c, cluster_ready)),
        deleting,
        created_at,
        single_tenant,
    )))
}

#[async_trait]
impl NamespaceStore for SqliteStore {
    async fn insert_namespace(
        &self,
        id: &str,
        name: &str,
        hosts: &[String],
        cluster: Option<&str>,
        single_tenant: bool,
        created_at: i64,
        then: &Enqueue,
    ) -> Result<NamespaceInsert> {
        let out = self
            .transact(None, |tx| {
                for h in hosts {
                    let sharing: Option<String> = tx
                        .query_row(
                            "SELECT n.id FROM namespace_hosts nh JOIN namespaces n ON n.id = nh.namespace_id \
                             WHERE nh.host_name = ?1 AND n.id != ?2 AND (n.single_tenant = 1 OR ?3) LIMIT 1",
                            params![h, id, single_tenant],
                            |r| r.get(0),
                        )
                        .optional()?;
                    if let Some(namespace) = sharing {
                        return Ok(NamespaceInsert::HostShared {
                            host: h.clone(),
                            namespace,
                        });
                    }
                }
                let n = tx.execute(
                    "INSERT OR IGNORE INTO namespaces (id, name, created_at, cluster_name, single_tenant) VALUES (?1, ?2, ?3, ?4, ?5)",
                    params![id, name, created_at, cluster, single_tenant],
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
                work::enqueue(tx, then)?;
                Ok(NamespaceInsert::Inserted)
            })
            .await?;
        if out == NamespaceInsert::Inserted {
            self.wake.notify_one();
        }
        Ok(out)
    }

    async fn namespace(&self, id: &str) -> Result<Option<Namespace>> {
        self.read(|c| namespace_in(c, id)).await
    }

    async fn namespaces(&self) -> Result<Vec<Namespace>> {
        self.read(|c| {
            let ids: Vec<String> = {
                let mut st = c.prepare("SELECT id FROM namespaces ORDER BY id")?;
                st.query_map([], |r| r.get(0))?
                    .collect::<rusqlite::Result<_>>()?
            };
            let mut out = Vec::new();
            for id in ids {
                if let Some(ns) = namespace_in(c, &id)? {
                    out.push(ns);
                }
            }
            Ok(out)
        })
        .await
    }

    async fn mark_namespace_deleting(&self, id: &str, then: &Enqueue) -> Result<bool> {
        let marked = self
            .transact(None, |tx| {
                let agents: i64 = tx.query_row(
                    "SELECT COUNT(*) FROM agents WHERE namespace_id = ?1",
                    [id],
                    |r| r.get(0),
                )?;
                if agents > 0 {
                    return Ok(false);
                }
                tx.execute("UPDATE namespaces SET deleting = 1 WHERE id = ?1", [id])?;
                work::enqueue(tx, then)?;
                Ok(true)
            })
            .await?;
        if marked {
            self.wake.notify_one();
        }
        Ok(marked)
    }

    async fn set_namespace_cluster_ready(
        &self,
        claim: &Claim,
        ns: &str,
        ready: bool,
    ) -> Result<()> {
        self.transact(Some(claim), |tx| {
            tx.execute(
                "UPDATE namespaces SET cluster_ready = ?2 WHERE id = ?1",
                params![ns, ready],
            )?;
            Ok(())
        })
        .await
    }

    async fn set_namespace_host_ready(
        &self,
        claim: &Claim,
        ns: &str,
        host: &str,
        ready: bool,
    ) -> Result<()> {
        self.transact(Some(claim), |tx| {
            tx.execute(
                "UPDATE namespace_hosts SET ready = ?3 WHERE namespace_id = ?1 AND host_name = ?2",
                params![ns, host, ready],
            )?;
            Ok(())
        })
        .await
    }

    async fn delete_namespace_row(&self, claim: &Claim, id: &str) -> Result<()> {
        self.transact(Some(claim), |tx| {
            tx.execute("DELETE FROM namespaces WHERE id = ?1", [id])?;
            Ok(())
        })
        .await
    }
}
