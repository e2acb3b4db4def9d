//! Namespaces and their pools (or their cluster).

use async_trait::async_trait;
use clawfleet_protocol::Ident;

use super::{Cached, PostgresStore, claimed_execute as claimed, id_col, work};
use crate::model::Namespace;
use crate::store::{Claim, Enqueue, NamespaceInsert, NamespaceStore, Result};

async fn namespace_in(
    c: &impl deadpool_postgres::GenericClient,
    id: &str,
) -> Result<Option<Namespace>> {
    let Some(r) = c
        .opt(
            "SELECT id, name, deleting, created_at, cluster_name, cluster_ready, single_tenant FROM namespaces WHERE id = $1",
            &[&id],
        )
        .await?
    else {
        return Ok(None);
    };
    let id: Ident = id_col(&r, 0)?;
    let pool = c
        .rows(
            "SELECT host_name, ready FROM namespace_hosts WHERE namespace_id = $1 ORDER BY host_name",
            &[&id.as_str()],
        )
        .await?
        .iter()
        .map(|h| Ok((h.try_get(0)?, h.try_get(1)?)))
        .collect::<Result<Vec<(String, bool)>>>()?;
    let cluster: Option<String> = r.try_get(4)?;
    let cluster_ready: bool = r.try_get(5)?;
    Ok(Some(Namespace::from_pool(
        (id, id_col(&r, 1)?),
        pool,
        cluster.map(|c| (c, cluster_ready)),
        r.try_get(2)?,
        r.try_get(3)?,
        r.try_get(6)?,
    )))
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
        let mut c = self.client().await?;
        let tx = c
            .build_transaction()
            .isolation_level(tokio_postgres::IsolationLevel::RepeatableRead)
            .read_only(true)
            .start()
            .await?;
        namespace_in(&tx, id).await
    }

    async fn namespaces(&self) -> Result<Vec<Namespace>> {
        let mut c = self.client().await?;
        let tx = c
            .build_transaction()
            .isolation_level(tokio_postgres::IsolationLevel::RepeatableRead)
            .read_only(true)
            .start()
            .await?;
        let ids: Vec<String> = tx
            .rows("SELECT id FROM namespaces ORDER BY id", &[])
            .await?
            .iter()
            .map(|r| r.try_get(0))
            .collect::<std::result::Result<_, _>>()?;
        let mut out = Vec::new();
        for id in ids {
            if let Some(ns) = namespace_in(&tx, &id).await? {
                out.push(ns);
            }
        }
        Ok(out)
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
