//! Configuration generations (native `openclaw.json` documents).

use async_trait::async_trait;
use clawfleet_protocol::Ident;
use serde_json::Value;

use super::{Cached, PostgresStore, narrow};
use crate::model::Configuration;
use crate::{ConfigurationStore, Result, StoreError};

#[async_trait]
impl ConfigurationStore for PostgresStore {
    async fn put_configuration(
        &self,
        ns: &str,
        id: &str,
        document: &Value,
        expect_new: bool,
        now: i64,
    ) -> Result<Option<u32>> {
        let mut c = self.client().await?;
        let tx = c.transaction().await?;
        // Serialises generations of one Configuration: the Namespace row is the lock.
        tx.exec("SELECT 1 FROM namespaces WHERE id = $1 FOR UPDATE", &[&ns])
            .await?;
        let current: Option<i64> = tx
            .one(
                "SELECT MAX(generation) FROM configurations WHERE namespace_id = $1 AND id = $2",
                &[&ns, &id],
            )
            .await?
            .try_get(0)?;
        if expect_new == current.is_some() {
            return Ok(None);
        }
        let generation = current.unwrap_or(0) + 1;
        tx.exec(
            "INSERT INTO configurations (namespace_id, id, generation, document, created_at) VALUES ($1, $2, $3, $4, $5)",
            &[&ns, &id, &generation, &document.to_string(), &now],
        )
        .await?;
        tx.commit().await?;
        Ok(Some(narrow(generation, "configuration generation")?))
    }

    async fn configuration_at(
        &self,
        ns: &Ident,
        id: &Ident,
        generation: Option<u32>,
    ) -> Result<Option<Configuration>> {
        let c = self.client().await?;
        let Some(r) = c
            .opt(
                "SELECT generation, document, created_at FROM configurations
                 WHERE namespace_id = $1 AND id = $2 AND ($3::bigint IS NULL OR generation = $3)
                 ORDER BY generation DESC LIMIT 1",
                &[&ns.as_str(), &id.as_str(), &generation.map(i64::from)],
            )
            .await?
        else {
            return Ok(None);
        };
        let document: String = r.try_get(1)?;
        Ok(Some(Configuration {
            namespace_id: ns.clone(),
            id: id.clone(),
            generation: narrow(r.try_get(0)?, "configuration generation")?,
            document: serde_json::from_str(&document)
                .map_err(|e| StoreError::Corrupt(e.to_string()))?,
            created_at: r.try_get(2)?,
        }))
    }
}
