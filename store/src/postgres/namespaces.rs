//! Namespaces and their pools (or their cluster).

use async_trait::async_trait;
use tokio_postgres::Row;

use super::{Cached, PostgresStore, claimed_execute as claimed, id_col, work};
use crate::model::Namespace;
use crate::{Claim, Enqueue, NamespaceInsert, NamespaceStore, Result};

/// A Namespace with its pool (host names and readiness in host order) in one statement, so one
/// snapshot without a transaction.
const NAMESPACE_SELECT: &str = "SELECT n.id, n.name, n.deleting, n.created_at, n.cluster_name, n.cluster_ready, n.single_tenant,
       COALESCE(p.hosts, '{}'), COALESCE(p.ready, '{}')
     FROM namespaces n
     CROSS JOIN LATERAL (
       SELECT array_agg(h.host_name ORDER BY h.host_name) AS hosts, array_agg(h.ready ORDER BY h.host_name) AS ready
       FROM namespace_hosts h WHERE h.namespace_id = n.id) p";

fn namespace_row(r: &Row) -> Result<Namespace> {
    let hosts: Vec<String> = r.try_get(7)?;
    let ready: Vec<bool> = r.try_get(8)?;
    let cluster: Option<String> = r.try_get(4)?;
    let cluster_ready: bool = r.try_get(5)?;
    Ok(Namespace::from_pool(
        (id_col(r, 0)?, id_col(r, 1)?),
        hosts.into_iter().zip(ready).collect(),
        cluster.map(|c| (c, cluster_ready)),
        r.try_get(2)?,
        r.try_get(3)?,
        r.try_get(6)?,
    ))
}

#[async_trait]
impl NamespaceStore for PostgresStore {
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
        let mut c = self.client().await?;
        let tx = c.transaction().await?;
        // The pool's hosts are locked so two Namespaces cannot claim one host for a
        // single-tenant pool at once.
        for h in hosts {
            tx.exec("SELECT 1 FROM hosts WHERE name = $1 FOR UPDATE", &[h])
                .await?;
        }
        for h in hosts {
            let sharing = tx
                .opt(
                    "SELECT n.id FROM namespace_hosts nh JOIN namespaces n ON n.id = nh.namespace_id
                     WHERE nh.host_name = $1 AND n.id != $2 AND (n.single_tenant OR $3) LIMIT 1",
                    &[h, &id, &single_tenant],
                )
                .await?;
            if let Some(r) = sharing {
                return Ok(NamespaceInsert::HostShared {
                    host: h.clone(),
                    namespace: r.try_get(0)?,
                });
            }
        }
        let n = tx
            .exec(
                "INSERT INTO namespaces (id, name, created_at, cluster_name, single_tenant) VALUES ($1, $2, $3, $4, $5)
                 ON CONFLICT (id) DO NOTHING",
                &[&id, &name, &created_at, &cluster, &single_tenant],
            )
            .await?;
        if n == 0 {
            return Ok(NamespaceInsert::Exists);
        }
        for h in hosts {
            tx.exec(
                "INSERT INTO namespace_hosts (namespace_id, host_name) VALUES ($1, $2)",
                &[&id, h],
            )
            .await?;
        }
        work::enqueue(&tx, then).await?;
        tx.commit().await?;
        self.wake_local();
        Ok(NamespaceInsert::Inserted)
    }

    async fn namespace(&self, id: &str) -> Result<Option<Namespace>> {
        let c = self.client().await?;
        c.opt(&format!("{NAMESPACE_SELECT} WHERE n.id = $1"), &[&id])
            .await?
            .as_ref()
            .map(namespace_row)
            .transpose()
    }

    async fn namespaces(&self) -> Result<Vec<Namespace>> {
        let c = self.client().await?;
        c.rows(&format!("{NAMESPACE_SELECT} ORDER BY n.id"), &[])
            .await?
            .iter()
            .map(namespace_row)
            .collect()
    }

    async fn mark_namespace_deleting(&self, id: &str, then: &Enqueue) -> Result<bool> {
        let mut c = self.client().await?;
        let tx = c.transaction().await?;
        tx.exec("SELECT 1 FROM namespaces WHERE id = $1 FOR UPDATE", &[&id])
            .await?;
        let agents: i64 = tx
            .one(
                "SELECT COUNT(*) FROM agents WHERE namespace_id = $1",
                &[&id],
            )
            .await?
            .try_get(0)?;
        if agents > 0 {
            return Ok(false);
        }
        tx.exec(
            "UPDATE namespaces SET deleting = TRUE WHERE id = $1",
            &[&id],
        )
        .await?;
        work::enqueue(&tx, then).await?;
        tx.commit().await?;
        self.wake_local();
        Ok(true)
    }

    async fn set_namespace_cluster_ready(
        &self,
        claim: &Claim,
        ns: &str,
        ready: bool,
    ) -> Result<()> {
        claimed(
            self,
            claim,
            "UPDATE namespaces SET cluster_ready = $2 WHERE id = $1",
            &[&ns, &ready],
        )
        .await?;
        Ok(())
    }

    async fn set_namespace_host_ready(
        &self,
        claim: &Claim,
        ns: &str,
        host: &str,
        ready: bool,
    ) -> Result<()> {
        claimed(
            self,
            claim,
            "UPDATE namespace_hosts SET ready = $3 WHERE namespace_id = $1 AND host_name = $2",
            &[&ns, &host, &ready],
        )
        .await?;
        Ok(())
    }

    async fn delete_namespace_row(&self, claim: &Claim, id: &str) -> Result<()> {
        claimed(self, claim, "DELETE FROM namespaces WHERE id = $1", &[&id]).await?;
        Ok(())
    }
}
