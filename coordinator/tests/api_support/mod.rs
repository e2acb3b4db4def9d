//! What the API tests share: an in-memory store with one global admin token.
#![allow(clippy::unwrap_used)]

use coordinator::model::{Grant, Role};
use coordinator::store::Store;

/// An in-memory store and the secret of its `*:admin` token.
pub fn store_with_admin() -> (Store, String) {
    let store = Store::in_memory().unwrap();
    let (_, admin) = coordinator::tokens::create(
        &store,
        "admin",
        &[Grant {
            namespace: "*".into(),
            role: Role::Admin,
        }],
    )
    .unwrap();
    (store, admin)
}
