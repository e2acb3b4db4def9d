//! What the API tests share: an in-memory store with one global admin token.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;

use coordinator::model::{Grant, Role};
use coordinator::store::SharedStore;
use coordinator::store::sqlite::SqliteStore;

/// An in-memory store and the secret of its `*:admin` token.
pub async fn store_with_admin() -> (SharedStore, String) {
    let store: SharedStore = Arc::new(SqliteStore::in_memory().unwrap());
    let (_, admin) = coordinator::tokens::create(
        &*store,
        "admin",
        &[Grant {
            namespace: "*".into(),
            role: Role::Admin,
        }],
    )
    .await
    .unwrap();
    (store, admin)
}
