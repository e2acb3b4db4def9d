//! Configuration generations (native `openclaw.json` documents).

use async_trait::async_trait;
use clawfleet_protocol::Ident;
use rusqlite::{OptionalExtension, params};
use serde_json::Value;

use super::{SqliteStore, json_col};
use crate::model::Configuration;
use crate::{ConfigurationStore, Result};

#[async_trait]
impl ConfigurationStore for SqliteStore {
    async fn put_configuration(
        &self,
        ns: &str,
        id: &str,
        document: &Value,
        expect_new: bool,
        now: i64,
    ) -> Result<Option<u32>> {
        self.transact(None, |tx| {
            let current: Option<u32> = tx.query_row(
                "SELECT MAX(generation) FROM configurations WHERE namespace_id = ?1 AND id = ?2",
                params![ns, id],
                |r| r.get(0),
            )?;
            if expect_new == current.is_some() {
                return Ok(None);
            }
            let generation = current.unwrap_or(0) + 1;
            tx.execute(
                "INSERT INTO configurations (namespace_id, id, generation, document, created_at) VALUES (?1, ?2, ?3, ?4, ?5)",
                params![ns, id, generation, document.to_string(), now],
            )?;
            Ok(Some(generation))
        })
        .await
    }

    async fn configuration_at(
        &self,
        ns: &Ident,
        id: &Ident,
        generation: Option<u32>,
    ) -> Result<Option<Configuration>> {
        self.read(|c| {
            let row: Option<(u32, String, i64)> = c
                .query_row(
                    "SELECT generation, document, created_at FROM configurations WHERE namespace_id = ?1 AND id = ?2 AND (?3 IS NULL OR generation = ?3) ORDER BY generation DESC LIMIT 1",
                    params![ns.as_str(), id.as_str(), generation],
                    |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
                )
                .optional()?;
            row.map(|(generation, document, created_at)| {
                Ok(Configuration {
                    namespace_id: ns.clone(),
                    id: id.clone(),
                    generation,
                    document: json_col(document)?,
                    created_at,
                })
            })
            .transpose()
        })
        .await
    }
}
