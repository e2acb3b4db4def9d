//! The store suite (`store/src/suite.rs`, the store's `suite` feature) against every store: SQLite in memory, SQLite
//! on a file, and a real PostgreSQL server (one fresh database per case). Also what only one
//! store has: SQLite's upgrade from an old schema, PostgreSQL's concurrent migrations,
//! password files and TLS.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;

use clawfleet_pg_tests::{Options, TestPostgres, Tls};
use clawfleet_store::suite::CASES;
use clawfleet_store::suite::{
    CREDENTIAL_SECRET, SECRET_VALUE, WORKSPACE_SECRET, put_secrets, secrets_read_back,
};
use coordinator::store::database::{Database, PostgresOptions, PostgresSettings};
use coordinator::store::postgres::PostgresStore;
use coordinator::store::prelude::*;
use coordinator::store::seal::Sealer;
use coordinator::store::sqlite::SqliteStore;
use coordinator::store::{SharedStore, StoreError};

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
    // No password configured at all: tokio-postgres says only "invalid configuration"; the
    // error names the setting.
    let Database::Postgres(s) =
        Database::parse_url(&plain, &PostgresOptions::default(), None).unwrap()
    else {
        unreachable!()
    };
    let err = PostgresStore::connect(s).await.unwrap_err().to_string();
    assert!(
        err.contains("asks for a password") && err.contains("[postgres] password_file"),
        "{err}"
    );
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
    // Both sides under one key, as `occ db migrate` runs with the coordinator's key file.
    let key = Arc::new(Sealer::ephemeral());
    let sqlite: SharedStore = Arc::new(SqliteStore::open_sealed(&path, key.clone()).unwrap());
    clawfleet_store::suite::fill(&sqlite).await;
    let settings = database_on(&pgs, "copy_target");
    let target: SharedStore = Arc::new(
        PostgresStore::connect_sealed(settings.clone(), key.clone())
            .await
            .unwrap(),
    );
    let pg = PostgresStore::connect_sealed(settings, key).await.unwrap();
    let counts = coordinator::store::copy::sqlite_to_postgres(&path, &pg)
        .await
        .unwrap();
    assert!(
        counts.iter().any(|(t, n)| t == "audit" && *n > 0),
        "{counts:?}"
    );
    clawfleet_store::suite::same_reads(&sqlite, &target).await;
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

/// The secrets of [`put_secrets`] found in any file under `dir`.
fn secrets_in_files(dir: &std::path::Path) -> Vec<String> {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_owned()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if let Ok(bytes) = std::fs::read(&p) {
                for secret in [CREDENTIAL_SECRET, WORKSPACE_SECRET, SECRET_VALUE] {
                    if bytes.windows(secret.len()).any(|w| w == secret.as_bytes()) {
                        found.push(format!("{secret} in {}", p.display()));
                    }
                }
            }
        }
    }
    found
}

fn mode(path: &std::path::Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

/// N15: `occ init` left occ.db 0644 in a 0755 directory, and cluster credentials and workspace
/// contents sat in it in clear. Now the database and its -wal/-shm are 0600 and both secrets
/// are sealed: the files' bytes hold neither, and another key cannot open them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_keeps_secrets_sealed_and_its_files_private() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    std::fs::create_dir(&state).unwrap();
    std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o755)).unwrap();
    let key_file = dir.path().join("encryption.key");
    assert!(Sealer::create_file(&key_file).unwrap());
    assert_eq!(mode(&key_file), 0o600);
    let path = state.join("occ.db");
    let key = Arc::new(Sealer::load(&key_file).unwrap());
    let s: SharedStore = Arc::new(SqliteStore::open_sealed(&path, key.clone()).unwrap());
    put_secrets(&s).await;
    secrets_read_back(&s).await.unwrap();
    for f in ["occ.db", "occ.db-wal", "occ.db-shm"] {
        assert_eq!(mode(&state.join(f)), 0o600, "{f}");
    }
    assert_eq!(secrets_in_files(&state), Vec::<String>::new());
    drop(s);
    assert_eq!(secrets_in_files(&state), Vec::<String>::new());
    // Another key: a clear error naming the setting, nothing returned.
    let other: SharedStore =
        Arc::new(SqliteStore::open_sealed(&path, Arc::new(Sealer::ephemeral())).unwrap());
    let e = secrets_read_back(&other).await.unwrap_err().to_string();
    assert!(
        e.contains("encryption_key_file") && e.contains("cluster c1"),
        "{e}"
    );
    drop(other);
    let again: SharedStore = Arc::new(SqliteStore::open_sealed(&path, key).unwrap());
    secrets_read_back(&again).await.unwrap();
}

/// A database an older coordinator wrote (secrets in clear) still reads, and its secrets are
/// sealed when the store opens, so they leave the files.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_seals_what_an_older_coordinator_stored_in_clear() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("occ.db");
    let key = Arc::new(Sealer::ephemeral());
    let s = SqliteStore::open_sealed(&path, key.clone()).unwrap();
    let shared: SharedStore = Arc::new(s);
    put_secrets(&shared).await;
    drop(shared);
    // As the previous release stored them.
    let s = SqliteStore::open_sealed(&path, key.clone()).unwrap();
    s.with_connection(|c| {
        c.execute(
            "UPDATE clusters SET credentials = ?1",
            [format!("{{\"token\":\"{CREDENTIAL_SECRET}\"}}")],
        )?;
        c.execute(
            "UPDATE agent_workspace_files SET content = ?1, sealed = 0",
            [WORKSPACE_SECRET.as_bytes()],
        )?;
        c.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
    })
    .await
    .unwrap();
    drop(s);
    assert_eq!(secrets_in_files(dir.path()).len(), 2, "the clear rows");
    let s: SharedStore = Arc::new(SqliteStore::open_sealed(&path, key).unwrap());
    secrets_read_back(&s).await.unwrap();
    drop(s);
    assert_eq!(secrets_in_files(dir.path()), Vec::<String>::new());
}

/// The same on PostgreSQL: the columns a dump holds are sealed, the server's files (after a
/// checkpoint) hold neither secret, another key gets a clear error, and rows stored in clear
/// by an older coordinator are sealed when a coordinator connects.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_keeps_secrets_sealed() {
    clawfleet_pg_tests::skip_unless_postgres!();
    let pg = TestPostgres::start().unwrap();
    let settings = database_on(&pg, "sealed");
    let key = Arc::new(Sealer::ephemeral());
    let s: SharedStore = Arc::new(
        PostgresStore::connect_sealed(settings.clone(), key.clone())
            .await
            .unwrap(),
    );
    put_secrets(&s).await;
    secrets_read_back(&s).await.unwrap();
    let dump = |pg: &TestPostgres| {
        pg.psql_in(
            "sealed",
            "SELECT credentials FROM clusters UNION ALL \
             SELECT encode(content, 'escape') FROM agent_workspace_files UNION ALL \
             SELECT encode(value, 'escape') FROM secrets",
        )
        .unwrap()
    };
    let columns = dump(&pg);
    assert!(columns.starts_with("sealed1:"), "{columns}");
    assert!(
        !columns.contains(CREDENTIAL_SECRET)
            && !columns.contains(WORKSPACE_SECRET)
            && !columns.contains(SECRET_VALUE),
        "{columns}"
    );
    pg.psql_in("sealed", "CHECKPOINT").unwrap();
    assert_eq!(secrets_in_files(pg.data_dir()), Vec::<String>::new());
    let other: SharedStore = Arc::new(
        PostgresStore::connect_sealed(settings.clone(), Arc::new(Sealer::ephemeral()))
            .await
            .unwrap(),
    );
    let e = secrets_read_back(&other).await.unwrap_err().to_string();
    assert!(e.contains("encryption_key_file"), "{e}");
    // As the previous release stored them; sealed by the next coordinator that connects.
    pg.psql_in(
        "sealed",
        &format!(
            "UPDATE clusters SET credentials = '{{\"token\":\"{CREDENTIAL_SECRET}\"}}'; \
             UPDATE agent_workspace_files SET content = convert_to('{WORKSPACE_SECRET}', 'UTF8'), sealed = FALSE"
        ),
    )
    .unwrap();
    assert!(dump(&pg).contains(CREDENTIAL_SECRET));
    let next: SharedStore = Arc::new(PostgresStore::connect_sealed(settings, key).await.unwrap());
    secrets_read_back(&next).await.unwrap();
    let columns = dump(&pg);
    assert!(
        !columns.contains(CREDENTIAL_SECRET) && !columns.contains(WORKSPACE_SECRET),
        "{columns}"
    );
}

/// `occ db rekey`: every sealed value (a secret, cluster credentials, a workspace file)
/// moves to the new key in one step: the new key reads them all, the old one none, and the
/// files hold no value in clear.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_rekey_moves_every_sealed_value_to_the_new_key() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("occ.db");
    let old = Arc::new(Sealer::ephemeral());
    let s: SharedStore = Arc::new(SqliteStore::open_sealed(&path, old.clone()).unwrap());
    put_secrets(&s).await;
    drop(s);
    let new = Arc::new(Sealer::ephemeral());
    let n = coordinator::store::rekey::rekey(&Database::Sqlite(path.clone()), old.clone(), &new)
        .await
        .unwrap();
    assert_eq!(
        (n.secrets, n.cluster_credentials, n.workspace_files),
        (1, 1, 1)
    );
    let with_new: SharedStore = Arc::new(SqliteStore::open_sealed(&path, new.clone()).unwrap());
    secrets_read_back(&with_new).await.unwrap();
    drop(with_new);
    let with_old: SharedStore = Arc::new(SqliteStore::open_sealed(&path, old.clone()).unwrap());
    assert!(secrets_read_back(&with_old).await.is_err());
    assert!(with_old.secret_value("ns", "api-key", 1).await.is_err());
    drop(with_old);
    assert_eq!(secrets_in_files(dir.path()), Vec::<String>::new());
    // A rekey with the wrong current key changes nothing.
    let wrong = Arc::new(Sealer::ephemeral());
    assert!(
        coordinator::store::rekey::rekey(&Database::Sqlite(path.clone()), wrong, &old)
            .await
            .is_err()
    );
    let still: SharedStore = Arc::new(SqliteStore::open_sealed(&path, new).unwrap());
    secrets_read_back(&still).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_rekey_moves_every_sealed_value_to_the_new_key() {
    clawfleet_pg_tests::skip_unless_postgres!();
    let pg = TestPostgres::start().unwrap();
    let settings = database_on(&pg, "rekeyed");
    let old = Arc::new(Sealer::ephemeral());
    let s: SharedStore = Arc::new(
        PostgresStore::connect_sealed(settings.clone(), old.clone())
            .await
            .unwrap(),
    );
    put_secrets(&s).await;
    let new = Arc::new(Sealer::ephemeral());
    let db = Database::Postgres(settings.clone());
    let n = coordinator::store::rekey::rekey(&db, old.clone(), &new)
        .await
        .unwrap();
    assert_eq!(
        (n.secrets, n.cluster_credentials, n.workspace_files),
        (1, 1, 1)
    );
    assert!(
        secrets_read_back(&s).await.is_err(),
        "the old key reads nothing"
    );
    let with_new: SharedStore =
        Arc::new(PostgresStore::connect_sealed(settings, new).await.unwrap());
    secrets_read_back(&with_new).await.unwrap();
}

/// A backend for API tests that reach no target.
struct NoTargets;

impl coordinator::backend::Backend for NoTargets {
    async fn call(
        &self,
        target: impl Into<coordinator::backend::Target> + Send,
        _: clawfleet_protocol::Operation,
        _: coordinator::backend::CallOptions,
    ) -> Result<clawfleet_protocol::result::OperationResult, coordinator::backend::CallError> {
        Err(coordinator::backend::CallError::Unsupported {
            target: target.into().name().to_owned(),
            message: "no targets in this test".into(),
        })
    }
}

/// `/healthz` answered 200 while PostgreSQL was down. Now it asks the database (one cheap
/// query, a short timeout): 200 while it answers, 503 `DATABASE_UNAVAILABLE` while it is
/// down, 200 again once it is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn healthz_says_when_postgres_is_down() {
    clawfleet_pg_tests::skip_unless_postgres!();
    let pg = TestPostgres::start().unwrap();
    let store = postgres_store(&pg, "health").await;
    let state = Arc::new(coordinator::api::AppState {
        foreground: Default::default(),
        service: coordinator::service::Service::new(store),
        backend: Arc::new(NoTargets),
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let router = coordinator::api::router(state);
    let settings = coordinator::config::ApiSettings::default();
    tokio::spawn(async move {
        coordinator::api::serve(listener, router, &settings, std::future::pending()).await
    });
    let health = || {
        let url = url.clone();
        tokio::task::spawn_blocking(move || {
            let c = coordinator::client::Client::new(&url, None).unwrap();
            let t0 = std::time::Instant::now();
            let r = c.request("GET", "/healthz", None);
            (r, t0.elapsed())
        })
    };
    let (r, _) = health().await.unwrap();
    assert_eq!(r.unwrap()["status"], "ok");
    pg.stop().unwrap();
    let (r, took) = health().await.unwrap();
    match r {
        Err(coordinator::client::ClientError::Api { status, code, .. }) => {
            assert_eq!((status, code.as_str()), (503, "DATABASE_UNAVAILABLE"));
        }
        other => panic!("healthz with the database down: {other:?}"),
    }
    assert!(took < std::time::Duration::from_secs(5), "{took:?}");
    pg.start_again().unwrap();
    let mut last = None;
    for _ in 0..50 {
        let (r, _) = health().await.unwrap();
        if let Ok(v) = &r {
            assert_eq!(v["status"], "ok");
            return;
        }
        last = Some(r);
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    panic!("healthz stayed down after the restart: {last:?}");
}

/// Waits for `store`'s queue-change signal for up to `limit`; whether it came.
async fn woken(store: &PostgresStore, limit: std::time::Duration) -> bool {
    tokio::time::timeout(limit, store.work_changed())
        .await
        .is_ok()
}

/// An item's end wakes the other coordinators on the database only when queued work of its
/// lane waited on it: every listening coordinator wakes for each notification, and an end
/// that frees nothing has nothing for them to claim.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_an_end_wakes_other_coordinators_only_when_its_lane_has_queued_work() {
    use coordinator::store::{Enqueue, WorkEnd, WorkState};
    use std::time::Duration;
    clawfleet_pg_tests::skip_unless_postgres!();
    let pg = TestPostgres::start().unwrap();
    let settings = database_on(&pg, "wake");
    let a = PostgresStore::connect(settings.clone()).await.unwrap();
    let b = PostgresStore::connect(settings).await.unwrap();
    // b listens: an enqueue by a reaches it. Then no signal is left over.
    a.enqueue(&Enqueue::deploy("ns", "a1", "r1")).await.unwrap();
    assert!(
        woken(&b, Duration::from_secs(10)).await,
        "b never heard a's enqueue"
    );
    a.enqueue(&Enqueue::deploy("ns", "a1", "r2")).await.unwrap();
    a.enqueue(&Enqueue::deploy("ns", "a2", "r1")).await.unwrap();
    while woken(&b, Duration::from_millis(300)).await {}
    let lease = Duration::from_secs(30);
    let batch = a.claim_batch("a", lease, 10).await.unwrap();
    let lanes: Vec<_> = batch.iter().map(|w| w.revision_id.clone()).collect();
    assert_eq!(lanes.len(), 2, "{lanes:?}");
    let done = || WorkEnd::Finished {
        state: WorkState::Done,
        code: "OK",
        message: "",
    };
    // a2's lane has nothing queued (a1's queued deploy is another lane): nobody is woken.
    assert!(a.end_work(&batch[1].claim, done()).await.unwrap());
    assert!(
        !woken(&b, Duration::from_millis(700)).await,
        "an end that freed no queued work woke another coordinator"
    );
    // a1's second deploy waited on its first: its end wakes b, which claims it.
    assert!(a.end_work(&batch[0].claim, done()).await.unwrap());
    assert!(
        woken(&b, Duration::from_secs(10)).await,
        "b was not woken for a1's queued deploy"
    );
    let next = b.claim_batch("b", lease, 10).await.unwrap();
    assert_eq!(next.len(), 1);
    assert_eq!(next[0].revision_id.as_deref(), Some("r2"));
}
