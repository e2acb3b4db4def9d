//! The store suite (`tests/store_support/mod.rs`) against every store: SQLite in memory, SQLite
//! on a file, and a real PostgreSQL server (one fresh database per case). Also what only one
//! store has: SQLite's upgrade from an old schema, PostgreSQL's concurrent migrations,
//! password files and TLS.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod store_support;

use std::sync::Arc;

use coordinator::store::sqlite::SqliteStore;
use coordinator::store::{SharedStore, StoreError};
use store_support::CASES;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sqlite_in_memory_passes_the_store_suite() {
    for (name, case) in CASES {
        eprintln!("case {name}");
        let s: SharedStore = Arc::new(SqliteStore::in_memory().unwrap());
        case(s).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sqlite_on_a_file_passes_the_store_suite() {
    let dir = tempfile::tempdir().unwrap();
    for (i, (name, case)) in CASES.iter().enumerate() {
        eprintln!("case {name}");
        let s: SharedStore =
            Arc::new(SqliteStore::open(&dir.path().join(format!("occ-{i}.db"))).unwrap());
        case(s).await;
    }
}

#[tokio::test]
async fn sqlite_refuses_a_newer_schema() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("occ.db");
    let s = SqliteStore::open(&path).unwrap();
    s.with_connection(|c| c.execute("INSERT INTO schema_version VALUES (99)", []))
        .await
        .unwrap();
    drop(s);
    assert!(matches!(
        SqliteStore::open(&path),
        Err(StoreError::TooNew { found: 99, .. })
    ));
}

/// A fresh database on the test server, as a store.
async fn postgres_store(admin_url: &str, db: &str) -> SharedStore {
    let (client, conn) = tokio_postgres::connect(admin_url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    client
        .batch_execute(&format!("DROP DATABASE IF EXISTS {db}"))
        .await
        .unwrap();
    client
        .batch_execute(&format!("CREATE DATABASE {db}"))
        .await
        .unwrap();
    let url = admin_url.replace("/postgres?", &format!("/{db}?"));
    let database = coordinator::store::Database::parse_url(
        &url,
        &coordinator::store::database::PostgresOptions::default(),
        None,
    )
    .unwrap();
    coordinator::store::open(&database).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_passes_the_store_suite() {
    let Ok(admin) = std::env::var("CLAWFLEET_TEST_PG_URL") else {
        eprintln!("SKIP: no PostgreSQL");
        return;
    };
    for (i, (name, case)) in CASES.iter().enumerate() {
        eprintln!("case {name}");
        case(postgres_store(&admin, &format!("suite_{i}")).await).await;
    }
}
