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

/// `occ db migrate`'s copy: everything a coordinator stored in SQLite reads back the same
/// from PostgreSQL, ids continue after the copied ones, and a second copy into the now
/// non-empty database is refused with nothing written.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_sqlite_database_copies_into_postgres_and_reads_back_the_same() {
    let Ok(admin) = std::env::var("CLAWFLEET_TEST_PG_URL") else {
        eprintln!("SKIP: no PostgreSQL");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("occ.db");
    let sqlite: SharedStore = Arc::new(SqliteStore::open(&path).unwrap());
    store_support::fill(&sqlite).await;
    let target = postgres_store(&admin, "copy_target").await;
    let pg = match coordinator::store::Database::parse_url(
        &admin.replace("/postgres?", "/copy_target?"),
        &Default::default(),
        None,
    )
    .unwrap()
    {
        coordinator::store::Database::Postgres(s) => {
            coordinator::store::postgres::PostgresStore::connect(s)
                .await
                .unwrap()
        }
        coordinator::store::Database::Sqlite(_) => unreachable!(),
    };
    let counts = coordinator::store::copy::sqlite_to_postgres(&path, &pg)
        .await
        .unwrap();
    assert!(
        counts.iter().any(|(t, n)| t == "audit" && *n > 0),
        "{counts:?}"
    );
    store_support::same_reads(&sqlite, &target).await;
    // Ids go on after the copied ones.
    let before = sqlite.recent_work("ns", "a1", 1).await.unwrap()[0].id;
    let next = target
        .enqueue(&coordinator::store::Enqueue::deploy("ns", "a1", "rev-1"))
        .await
        .unwrap();
    assert!(next > before, "{next} after {before}");
    let again = coordinator::store::copy::sqlite_to_postgres(&path, &pg).await;
    assert!(
        matches!(
            again,
            Err(coordinator::store::copy::CopyError::TargetNotEmpty { .. })
        ),
        "{again:?}"
    );
}
