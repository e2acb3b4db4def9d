//! The store suite (`tests/store_support/mod.rs`) against every store: SQLite in memory, SQLite
//! on a file, and a real PostgreSQL server (one fresh database per case). Also what only one
//! store has: SQLite's upgrade from an old schema, PostgreSQL's concurrent migrations,
//! password files and TLS.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod store_support;

use std::sync::Arc;

use clawfleet_pg_tests::{Options, TestPostgres, Tls};
use coordinator::store::database::{Database, PostgresOptions, PostgresSettings};
use coordinator::store::postgres::PostgresStore;
use coordinator::store::prelude::*;
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

/// A database of its own on the test server, owned by a role of its own, as settings.
fn database_on(pg: &TestPostgres, name: &str) -> Box<PostgresSettings> {
    pg.create_role(name, None).unwrap();
    pg.create_database_owned_by(name, name).unwrap();
    match Database::parse_url(&pg.url(name, name), &PostgresOptions::default(), None).unwrap() {
        Database::Postgres(s) => s,
        Database::Sqlite(_) => unreachable!(),
    }
}

async fn postgres_store(pg: &TestPostgres, name: &str) -> SharedStore {
    Arc::new(PostgresStore::connect(database_on(pg, name)).await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_passes_the_store_suite() {
    clawfleet_pg_tests::skip_unless_postgres!();
    let pg = TestPostgres::start().unwrap();
    for (i, (name, case)) in CASES.iter().enumerate() {
        eprintln!("case {name}");
        case(postgres_store(&pg, &format!("suite_{i}")).await).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_coordinators_starting_together_migrate_once_and_a_newer_schema_is_refused() {
    clawfleet_pg_tests::skip_unless_postgres!();
    let pg = TestPostgres::start().unwrap();
    let settings = database_on(&pg, "together");
    let mut starts = Vec::new();
    for _ in 0..4 {
        let s = settings.clone();
        starts.push(tokio::spawn(async move { PostgresStore::connect(s).await }));
    }
    for s in starts {
        let store = s.await.unwrap().unwrap();
        assert_eq!(
            store.schema_version().await.unwrap(),
            coordinator::store::postgres::latest_version()
        );
    }
    let versions = pg
        .psql_in("together", "SELECT count(*) FROM schema_version")
        .unwrap();
    assert_eq!(
        versions,
        coordinator::store::postgres::latest_version().to_string(),
        "each version recorded once"
    );
    pg.psql_in("together", "INSERT INTO schema_version VALUES (99)")
        .unwrap();
    assert!(matches!(
        PostgresStore::connect(settings).await,
        Err(StoreError::TooNew { found: 99, .. })
    ));
}

/// The password comes from the password file (scram-sha-256 over TCP), a wrong one is refused
/// without echoing it, and TLS with sslmode=verify-full reaches the server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_takes_its_password_from_a_file_and_tls_as_libpq_does() {
    clawfleet_pg_tests::skip_unless_postgres!();
    let pg = TestPostgres::start_with(&Options::default().tls(Tls::On)).unwrap();
    pg.create_role("occ", Some("s3cret-pw")).unwrap();
    pg.create_database_owned_by("occ", "occ").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("pw");
    let open = async |password: &str, url: &str| {
        std::fs::write(&file, format!("{password}\n")).unwrap();
        let options = PostgresOptions {
            password_file: Some(file.clone()),
            pool_size: Some(2),
        };
        let Database::Postgres(s) = Database::parse_url(url, &options, None).unwrap() else {
            unreachable!()
        };
        PostgresStore::connect(s).await
    };
    let plain = pg.url("occ", "occ");
    let store = open("s3cret-pw", &plain).await.unwrap();
    assert_eq!(store.token_count().await.unwrap(), 0);
    let err = open("wrong-pw", &plain).await.unwrap_err().to_string();
    assert!(
        !err.contains("wrong-pw") && !err.contains("s3cret"),
        "{err}"
    );
    assert!(err.contains("password"), "{err}");
    let tls = pg.tls_url("occ", "occ").unwrap();
    assert!(tls.contains("sslmode=verify-full"), "{tls}");
    let store = open("s3cret-pw", &tls).await.unwrap();
    assert_eq!(
        store.schema_version().await.unwrap(),
        coordinator::store::postgres::latest_version()
    );
    // The server says the session is encrypted.
    let ssl = pg
        .psql_in(
            "occ",
            "SELECT count(*) FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid) WHERE a.usename = 'occ' AND s.ssl",
        )
        .unwrap();
    assert_ne!(ssl, "0", "no TLS session of occ");
    // verify-full checks the name: the certificate does not name 127.0.0.2.
    let wrong_name = tls.replace("127.0.0.1", "127.0.0.2");
    if std::net::TcpStream::connect(("127.0.0.2", pg.port())).is_ok() {
        assert!(open("s3cret-pw", &wrong_name).await.is_err());
    }
}

/// `occ db migrate`'s copy: everything a coordinator stored in SQLite reads back the same
/// from PostgreSQL, ids continue after the copied ones, and a second copy into the now
/// non-empty database is refused with nothing written.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_sqlite_database_copies_into_postgres_and_reads_back_the_same() {
    clawfleet_pg_tests::skip_unless_postgres!();
    let pgs = TestPostgres::start().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("occ.db");
    let sqlite: SharedStore = Arc::new(SqliteStore::open(&path).unwrap());
    store_support::fill(&sqlite).await;
    let settings = database_on(&pgs, "copy_target");
    let target: SharedStore = Arc::new(PostgresStore::connect(settings.clone()).await.unwrap());
    let pg = PostgresStore::connect(settings).await.unwrap();
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
    // Fences go on from the highest one the SQLite coordinator issued.
    let issued = sqlite
        .claim_work("source", std::time::Duration::from_secs(30))
        .await
        .unwrap()
        .and_then(|w| w.fence)
        .unwrap();
    let taken = loop {
        let w = target
            .claim_work("target", std::time::Duration::from_secs(30))
            .await
            .unwrap()
            .unwrap();
        if let Some(f) = w.fence {
            break f;
        }
    };
    assert!(
        taken >= issued,
        "PostgreSQL's first fence {taken} is below SQLite's {issued}"
    );
    let again = coordinator::store::copy::sqlite_to_postgres(&path, &pg).await;
    assert!(
        matches!(
            again,
            Err(coordinator::store::copy::CopyError::TargetNotEmpty { .. })
        ),
        "{again:?}"
    );
}
