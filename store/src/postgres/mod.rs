//! PostgreSQL, for several coordinators on one database (`database = "postgres://…"`). The
//! same behaviour as `store/src/sqlite/` behind the same traits, with what sharing needs:
//!
//! - Time for leases, queue scheduling and the leader lease is the database's clock, so
//!   coordinators on machines whose clocks differ still agree on when a lease lapsed.
//! - Work is claimed with `FOR UPDATE SKIP LOCKED`; a lane (a Namespace) is serialised by a
//!   transaction-scoped advisory lock while a claim checks it, so two coordinators never run
//!   two items of one Agent at once.
//! - Queue changes are announced with `NOTIFY clawfleet_work`; every coordinator listens on a
//!   connection of its own, so new work is picked up at once wherever it was queued.
//! - Connections come from a pool that replaces broken ones: after a database restart the
//!   next calls fail with [`StoreError::Unavailable`] (retried by the worker, 503 in the API)
//!   until new connections get through.
//!
//! One file per aggregate, each implementing its trait from `store/src/lib.rs`.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use clawfleet_protocol::Ident;
use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use futures::StreamExt;
use tokio::sync::Notify;
use tokio_postgres::types::ToSql;
use tokio_postgres::{AsyncMessage, Row};
use tokio_postgres_rustls::MakeRustlsConnect;

use super::database::{PostgresSettings, TlsMode};
use super::seal::{self, Sealer};
use super::{Claim, LeaderLease, LeaseHeld, Pruned, Result, StoreError, StoreMeta};

mod agents;
mod audit;
mod clusters;
mod configurations;
mod drift;
mod hosts;
pub mod migrations;
mod namespaces;
mod revisions;
mod rollouts;
mod secrets;
mod tls;
mod tokens;
mod work;
mod workspace;

pub use migrations::latest as latest_version;

/// The database's clock in milliseconds, as SQL.
pub(super) const NOW_MS: &str = "(extract(epoch from clock_timestamp()) * 1000)::bigint";

/// The notification channel of queue changes.
pub(super) const CHANNEL: &str = "clawfleet_work";

/// The advisory lock key of migrations ("clawfleet" in ASCII, as a number).
const MIGRATION_LOCK: i64 = 0x636c_6177_666c_6565;

pub(super) type Tx<'a> = deadpool_postgres::Transaction<'a>;

type Params<'a> = &'a [&'a (dyn ToSql + Sync)];

/// Statements prepared once per pooled connection and reused: a plain `query(&str)` parses,
/// describes and plans its text on every call, an extra round trip and most of the
/// database's CPU per statement (the work-queue benchmark measured 13 ms of server CPU per
/// Agent deploy against 3 ms inside the statements). Every statement text here is a fixed
/// string, so each connection's cache stays as small as the store's set of statements.
#[async_trait]
pub(super) trait Cached {
    /// All rows.
    async fn rows(&self, sql: &str, params: Params<'_>) -> Result<Vec<Row>>;
    /// Exactly one row.
    async fn one(&self, sql: &str, params: Params<'_>) -> Result<Row>;
    /// At most one row.
    async fn opt(&self, sql: &str, params: Params<'_>) -> Result<Option<Row>>;
    /// Rows changed.
    async fn exec(&self, sql: &str, params: Params<'_>) -> Result<u64>;
}

#[async_trait]
impl<C: deadpool_postgres::GenericClient + Sync> Cached for C {
    async fn rows(&self, sql: &str, params: Params<'_>) -> Result<Vec<Row>> {
        let st = self.prepare_cached(sql).await?;
        Ok(self.query(&st, params).await?)
    }
    async fn one(&self, sql: &str, params: Params<'_>) -> Result<Row> {
        let st = self.prepare_cached(sql).await?;
        Ok(self.query_one(&st, params).await?)
    }
    async fn opt(&self, sql: &str, params: Params<'_>) -> Result<Option<Row>> {
        let st = self.prepare_cached(sql).await?;
        Ok(self.query_opt(&st, params).await?)
    }
    async fn exec(&self, sql: &str, params: Params<'_>) -> Result<u64> {
        let st = self.prepare_cached(sql).await?;
        Ok(self.execute(&st, params).await?)
    }
}

impl From<tokio_postgres::Error> for StoreError {
    fn from(e: tokio_postgres::Error) -> Self {
        if e.is_closed() {
            return StoreError::Unavailable(e.to_string());
        }
        if let Some(db) = e.as_db_error() {
            let code = db.code().code();
            // Connection exceptions, operator intervention (shutdown, restart), insufficient
            // resources, serialization failures and deadlocks: retry later.
            let transient = code.starts_with("08")
                || code.starts_with("57P")
                || code.starts_with("53")
                || code == "40001"
                || code == "40P01";
            let text = format!("{} (SQLSTATE {code})", db.message());
            return if transient {
                StoreError::Unavailable(text)
            } else {
                StoreError::Database(text)
            };
        }
        let source = std::error::Error::source(&e);
        if source.is_some_and(|s| s.to_string() == "password missing") {
            // tokio-postgres says only "invalid configuration" (its cause holds this).
            return StoreError::Config(
                "the PostgreSQL server asks for a password and none is configured: set \
                 [postgres] password_file in occ.toml (or PGPASSWORD)"
                    .to_owned(),
            );
        }
        // The error's own text is its kind only ("invalid configuration", "error connecting
        // to server"); its cause says what happened.
        let text = match source {
            Some(s) => format!("{e}: {s}"),
            None => e.to_string(),
        };
        if source.is_some_and(|s| s.is::<std::io::Error>()) {
            StoreError::Unavailable(text)
        } else {
            StoreError::Database(text)
        }
    }
}

impl From<deadpool_postgres::PoolError> for StoreError {
    fn from(e: deadpool_postgres::PoolError) -> Self {
        match e {
            deadpool_postgres::PoolError::Backend(e) => e.into(),
            other => StoreError::Unavailable(format!("no database connection: {other}")),
        }
    }
}

/// A column that does not fit its Rust type.
pub(super) fn narrow<T: TryFrom<i64>>(v: i64, what: &str) -> Result<T> {
    T::try_from(v).map_err(|_| StoreError::Corrupt(format!("{what} {v} is out of range")))
}

/// An id column as the typed id it was stored from. Ids are checked when they enter (the
/// API, plans); a row that no longer holds one was edited behind the coordinator's back, and
/// is refused here, naming the column, rather than by every reader above the store.
pub(super) fn id_col<T>(r: &Row, i: usize) -> Result<T>
where
    T: std::str::FromStr,
    T::Err: std::fmt::Display,
{
    let text: String = r.try_get(i)?;
    checked_id(r, i, text)
}

/// An optional id column (see [`id_col`]).
pub(super) fn opt_id_col(r: &Row, i: usize) -> Result<Option<Ident>> {
    let text: Option<String> = r.try_get(i)?;
    text.map(|t| checked_id(r, i, t)).transpose()
}

fn checked_id<T>(r: &Row, i: usize, text: String) -> Result<T>
where
    T: std::str::FromStr,
    T::Err: std::fmt::Display,
{
    text.parse().map_err(|e: T::Err| {
        let column = r.columns().get(i).map_or("?", |c| c.name());
        StoreError::Corrupt(super::bad_column(column, &text, &e))
    })
}

/// Refuses a write on behalf of a claim that another claim replaced. The row lock (`FOR
/// SHARE`) makes a concurrent claim of the item wait until this transaction ends, so the
/// check holds for the whole write.
pub(super) async fn check_claim(tx: &Tx<'_>, claim: &Claim) -> Result<()> {
    let row = tx
        .opt(
            "SELECT 1 FROM work WHERE id = $1 AND claim_token = $2 AND state = 'running' FOR SHARE",
            &[&claim.work, &claim.token],
        )
        .await?;
    match row {
        Some(_) => Ok(()),
        None => Err(claim.lost()),
    }
}

/// One statement on behalf of a claim; rows changed. `sql` is an UPDATE or DELETE ending in
/// its WHERE condition: the claim check is joined to that condition in the same statement
/// (one round trip instead of BEGIN, check, write, COMMIT), with the same row lock
/// (`FOR SHARE`) held until the statement commits. When nothing changed, the claim is asked
/// again on its own to tell a lost claim from a write that matched no row.
pub(super) async fn claimed_execute(
    store: &PostgresStore,
    claim: &Claim,
    sql: &str,
    params: &[&(dyn ToSql + Sync)],
) -> Result<u64> {
    let guarded = claim_guarded(sql, params.len())?;
    let mut all: Vec<&(dyn ToSql + Sync)> = params.to_vec();
    all.push(&claim.work);
    all.push(&claim.token);
    let c = store.client().await?;
    let n = c.exec(&guarded, &all).await?;
    if n == 0 {
        let mut c = c;
        let tx = c.transaction().await?;
        check_claim(&tx, claim).await?;
    }
    Ok(n)
}

/// `sql` (an UPDATE or DELETE whose text ends with its WHERE condition) with the claim check
/// of parameters `$n+1` (work id) and `$n+2` (token) joined to that condition.
fn claim_guarded(sql: &str, n: usize) -> Result<String> {
    let refused = || {
        StoreError::Database(format!(
            "a claimed statement must be an UPDATE or DELETE ending with its WHERE condition: {sql}"
        ))
    };
    let words: Vec<(usize, &str)> = sql
        .split_whitespace()
        .map(|w| (w.as_ptr() as usize - sql.as_ptr() as usize, w))
        .collect();
    let first = words.first().map(|(_, w)| w.to_ascii_uppercase());
    if !matches!(first.as_deref(), Some("UPDATE" | "DELETE"))
        || words
            .iter()
            .any(|(_, w)| w.eq_ignore_ascii_case("RETURNING"))
    {
        return Err(refused());
    }
    let Some(&(at, _)) = words.iter().find(|(_, w)| w.eq_ignore_ascii_case("WHERE")) else {
        return Err(refused());
    };
    let (head, condition) = (sql[..at].trim_end(), sql[at + "WHERE".len()..].trim());
    Ok(format!(
        "WITH {} {head} WHERE EXISTS (SELECT 1 FROM claim) AND ({condition})",
        claim_cte(n + 1, n + 2)
    ))
}

/// The `claim` CTE of a claimed statement: a row while the claim of work id `$work` and
/// token `$token` is current, that row share-locked until the statement commits.
pub(super) fn claim_cte(work: usize, token: usize) -> String {
    format!(
        "claim AS MATERIALIZED (SELECT 1 FROM work WHERE id = ${work} AND claim_token = ${token} AND state = 'running' FOR SHARE)"
    )
}

/// Announces a queue change to every coordinator, when the transaction commits.
pub(super) async fn notify(tx: &Tx<'_>) -> Result<()> {
    static SQL: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| notify_sql(1));
    tx.exec(&SQL, &[&CHANNEL]).await?;
    Ok(())
}

/// The statement of [`notify`], the channel its parameter `$channel`.
pub(super) fn notify_sql(channel: usize) -> String {
    format!("SELECT pg_notify(${channel}, '')")
}

/// Aborts the listener when the store goes.
#[derive(Debug)]
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The PostgreSQL store.
#[derive(Debug)]
pub struct PostgresStore {
    pool: Pool,
    wake: Arc<Notify>,
    _listener: AbortOnDrop,
    shown: String,
    /// Seals cluster credentials and workspace contents (`store/src/seal.rs`).
    pub(super) sealer: Arc<Sealer>,
}

fn pg_config(s: &PostgresSettings) -> tokio_postgres::Config {
    let mut c = tokio_postgres::Config::new();
    if s.host.starts_with('/') {
        c.host_path(&s.host);
    } else {
        c.host(&s.host);
    }
    c.port(s.port)
        .user(&s.user)
        .dbname(&s.dbname)
        .application_name(&s.application_name)
        // Every statement is a fixed text prepared once per connection ([`Cached`]) and finds
        // its rows by key, so one generic plan serves every call: without this the server
        // plans the first five calls of each anew and keeps re-planning the ones whose
        // generic estimate looks worse (the work queue's CTEs), on every call.
        .options("-c plan_cache_mode=force_generic_plan")
        .connect_timeout(s.connect_timeout)
        .keepalives(true)
        .keepalives_idle(Duration::from_secs(30))
        .ssl_mode(match s.tls {
            TlsMode::Disable => tokio_postgres::config::SslMode::Disable,
            TlsMode::Prefer => tokio_postgres::config::SslMode::Prefer,
            TlsMode::Require | TlsMode::VerifyCa | TlsMode::VerifyFull => {
                tokio_postgres::config::SslMode::Require
            }
        });
    if let Some(p) = &s.password {
        c.password(&p.0);
    }
    c
}

fn connector(s: &PostgresSettings) -> Result<MakeRustlsConnect> {
    let config = match tls::client_config(s)? {
        Some(c) => c,
        // Never used with sslmode=disable; one connector type keeps the pool's type simple.
        None => rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .map_err(|e| StoreError::Config(format!("database TLS: {e}")))?
        .with_root_certificates(rustls::RootCertStore::empty())
        .with_no_client_auth(),
    };
    Ok(MakeRustlsConnect::new(config))
}

impl PostgresStore {
    /// Connects, migrates (once, under a lock, whoever starts first) and starts listening for
    /// queue changes.
    /// With a key of this process only (tests; `occ` connects with
    /// [`PostgresStore::connect_sealed`]).
    pub async fn connect(settings: Box<PostgresSettings>) -> Result<Self> {
        Self::connect_sealed(settings, Arc::new(Sealer::ephemeral())).await
    }

    /// Connects, migrates, seals what an older coordinator stored in clear (under the
    /// migration lock) and starts listening for queue changes; seals with `sealer`.
    pub async fn connect_sealed(
        settings: Box<PostgresSettings>,
        sealer: Arc<Sealer>,
    ) -> Result<Self> {
        let config = pg_config(&settings);
        let tls = connector(&settings)?;
        let manager = Manager::from_config(
            config.clone(),
            tls.clone(),
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(manager)
            .max_size(settings.pool_size)
            .runtime(Runtime::Tokio1)
            .wait_timeout(Some(settings.connect_timeout))
            .create_timeout(Some(settings.connect_timeout))
            .recycle_timeout(Some(settings.connect_timeout))
            .build()
            .map_err(|e| StoreError::Config(format!("database pool: {e}")))?;
        let store_shown = settings.shown.clone();
        migrate(&pool).await.map_err(|e| match e {
            StoreError::Unavailable(m) => StoreError::Unavailable(format!("{store_shown}: {m}")),
            other => other,
        })?;
        reseal(&pool, &sealer).await?;
        let wake = Arc::new(Notify::new());
        let listener = tokio::spawn(listen(config, tls, wake.clone()));
        Ok(Self {
            pool,
            wake,
            _listener: AbortOnDrop(listener),
            shown: settings.shown.clone(),
            sealer,
        })
    }

    /// A pooled connection.
    pub(super) async fn client(&self) -> Result<deadpool_postgres::Object> {
        Ok(self.pool.get().await?)
    }

    /// Wakes this process's worker (other coordinators hear the NOTIFY).
    pub(super) fn wake_local(&self) {
        self.wake.notify_one();
    }
}

/// Seals what an older coordinator stored in clear (cluster credentials, workspace contents)
/// in one transaction under the migration lock. The clear row versions stay in the table's
/// files until vacuumed and in the WAL until recycled (the operator guide says so).
async fn reseal(pool: &Pool, sealer: &Sealer) -> Result<()> {
    let mut c = pool.get().await?;
    let tx = c.transaction().await?;
    tx.exec("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])
        .await?;
    let clusters = tx
        .rows(
            "SELECT name, credentials FROM clusters WHERE credentials NOT LIKE 'sealed1:%' FOR UPDATE",
            &[],
        )
        .await?;
    for r in &clusters {
        let name: String = r.try_get(0)?;
        let credentials: String = r.try_get(1)?;
        let sealed = sealer.seal_text(&seal::cluster_context(&name), &credentials)?;
        tx.exec(
            "UPDATE clusters SET credentials = $2 WHERE name = $1",
            &[&name, &sealed],
        )
        .await?;
    }
    let files = tx
        .rows(
            "SELECT namespace_id, agent_id, name, content FROM agent_workspace_files
             WHERE NOT sealed AND content IS NOT NULL FOR UPDATE",
            &[],
        )
        .await?;
    for r in &files {
        let (ns, agent, name): (String, String, String) =
            (r.try_get(0)?, r.try_get(1)?, r.try_get(2)?);
        let content: Vec<u8> = r.try_get(3)?;
        let sealed = sealer.seal(&seal::workspace_context(&ns, &agent, &name), &content)?;
        tx.exec(
            "UPDATE agent_workspace_files SET content = $4, sealed = TRUE
             WHERE namespace_id = $1 AND agent_id = $2 AND name = $3",
            &[&ns, &agent, &name, &sealed],
        )
        .await?;
    }
    tx.commit().await?;
    let n = clusters.len() + files.len();
    if n > 0 {
        tracing::info!("sealed {n} values an older coordinator had stored in clear");
    }
    Ok(())
}

async fn migrate(pool: &Pool) -> Result<()> {
    let mut c = pool.get().await?;
    let tx = c.transaction().await?;
    tx.exec("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])
        .await?;
    tx.batch_execute("CREATE TABLE IF NOT EXISTS schema_version (version BIGINT NOT NULL)")
        .await?;
    let current: i64 = tx
        .one("SELECT COALESCE(MAX(version), 0) FROM schema_version", &[])
        .await?
        .try_get(0)?;
    let latest = migrations::latest();
    if current > latest {
        return Err(StoreError::TooNew {
            found: current,
            known: latest,
        });
    }
    for (i, sql) in migrations::MIGRATIONS.iter().enumerate() {
        let version = migrations::BASELINE + i as i64;
        if version <= current {
            continue;
        }
        tx.batch_execute(sql).await?;
        if i == 0 {
            // The baseline stands for every version up to it.
            for v in 1..=version {
                tx.exec("INSERT INTO schema_version (version) VALUES ($1)", &[&v])
                    .await?;
            }
        } else {
            tx.exec(
                "INSERT INTO schema_version (version) VALUES ($1)",
                &[&version],
            )
            .await?;
        }
    }
    tx.commit().await?;
    Ok(())
}

/// Listens for queue changes on a connection of its own, reconnecting after a failure; every
/// notification (and every reconnection, which may have missed some) wakes the worker.
async fn listen(config: tokio_postgres::Config, tls: MakeRustlsConnect, wake: Arc<Notify>) {
    let mut delay = Duration::from_millis(100);
    loop {
        match config.connect(tls.clone()).await {
            Ok((client, mut connection)) => {
                let woken = wake.clone();
                let driver = tokio::spawn(async move {
                    let mut messages =
                        futures::stream::poll_fn(move |cx| connection.poll_message(cx));
                    while let Some(m) = messages.next().await {
                        match m {
                            Ok(AsyncMessage::Notification(_)) => woken.notify_one(),
                            Ok(_) => {}
                            Err(e) => {
                                tracing::warn!("the queue listener's connection failed: {e}");
                                return;
                            }
                        }
                    }
                });
                match client.batch_execute(&format!("LISTEN {CHANNEL}")).await {
                    Ok(()) => {
                        delay = Duration::from_millis(100);
                        wake.notify_one();
                        let _ = driver.await;
                    }
                    Err(e) => {
                        tracing::warn!("cannot listen for queue changes: {e}");
                        driver.abort();
                    }
                }
            }
            Err(e) => tracing::warn!("the queue listener cannot connect: {e}"),
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(Duration::from_secs(5));
    }
}

#[async_trait]
impl StoreMeta for PostgresStore {
    fn kind(&self) -> &'static str {
        "postgres"
    }

    async fn schema_version(&self) -> Result<i64> {
        let c = self.client().await?;
        Ok(c.one("SELECT MAX(version) FROM schema_version", &[])
            .await?
            .try_get(0)?)
    }

    async fn row_counts(&self) -> Result<Vec<(String, i64)>> {
        let c = self.client().await?;
        let tables: Vec<String> = c
            .rows(
                "SELECT table_name::text FROM information_schema.tables
                 WHERE table_schema = current_schema() AND table_type = 'BASE TABLE' ORDER BY 1",
                &[],
            )
            .await?
            .iter()
            .map(|r| r.try_get(0))
            .collect::<std::result::Result<_, _>>()?;
        let mut out = Vec::new();
        for t in tables {
            // Names come from the catalogue, quoted as identifiers.
            let n: i64 = c
                .one(
                    &format!("SELECT count(*) FROM \"{}\"", t.replace('"', "\"\"")),
                    &[],
                )
                .await?
                .try_get(0)?;
            out.push((t, n));
        }
        Ok(out)
    }
}

/// The one lease row's name.
const LEADER: &str = "singleton";

#[async_trait]
impl LeaderLease for PostgresStore {
    async fn lead(&self, holder: &str, lease: Duration) -> Result<LeaseHeld> {
        let lease_ms = i64::try_from(lease.as_millis()).unwrap_or(i64::MAX);
        let c = self.client().await?;
        c.exec(
            &format!(
                "INSERT INTO leader (name, holder, term, lease_until) VALUES ($1, $2, 1, {NOW_MS} + $3)
                 ON CONFLICT (name) DO UPDATE SET
                   term = CASE WHEN leader.holder = EXCLUDED.holder THEN leader.term ELSE leader.term + 1 END,
                   holder = EXCLUDED.holder, lease_until = EXCLUDED.lease_until
                 WHERE leader.holder = EXCLUDED.holder OR leader.lease_until < {NOW_MS}"
            ),
            &[&LEADER, &holder, &lease_ms],
        )
        .await?;
        let row = c
            .one(
                "SELECT holder, term FROM leader WHERE name = $1",
                &[&LEADER],
            )
            .await?;
        let h: String = row.try_get(0)?;
        Ok(LeaseHeld {
            is_leader: h == holder,
            holder: h,
            term: row.try_get(1)?,
        })
    }

    async fn resign(&self, holder: &str) -> Result<()> {
        let c = self.client().await?;
        c.exec(
            "UPDATE leader SET lease_until = 0 WHERE name = $1 AND holder = $2",
            &[&LEADER, &holder],
        )
        .await?;
        Ok(())
    }

    async fn prune(&self, work_older_than: i64, audit_older_than: i64) -> Result<Pruned> {
        let mut c = self.client().await?;
        let tx = c.transaction().await?;
        let work = tx
            .exec(
                &format!(
                    "DELETE FROM work WHERE state IN ('done', 'failed') AND updated_at < {NOW_MS} - $1::bigint * 1000
                       AND id NOT IN (SELECT a.work_id FROM rollout_agents a JOIN rollouts r ON r.id = a.rollout_id
                                      WHERE a.work_id IS NOT NULL AND r.state IN {})",
                    rollouts::open_list()
                ),
                &[&work_older_than],
            )
            .await?;
        let audit = tx
            .exec(
                &format!("DELETE FROM audit WHERE at < {NOW_MS} / 1000 - $1::bigint"),
                &[&audit_older_than],
            )
            .await?;
        tx.commit().await?;
        Ok(Pruned { work, audit })
    }
}

impl std::fmt::Display for PostgresStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.shown)
    }
}

#[cfg(test)]
mod tests {
    use super::claim_guarded;

    #[test]
    fn a_claimed_statement_gets_the_check_joined_to_its_whole_condition() {
        let g = claim_guarded(
            "UPDATE agents SET a = $3\n   WHERE namespace_id = $1 AND (id = $2 OR x IS NULL)",
            3,
        )
        .unwrap();
        assert!(g.starts_with(
            "WITH claim AS MATERIALIZED (SELECT 1 FROM work WHERE id = $4 AND claim_token = $5"
        ));
        assert!(g.ends_with(
            "UPDATE agents SET a = $3 WHERE EXISTS (SELECT 1 FROM claim) AND (namespace_id = $1 AND (id = $2 OR x IS NULL))"
        ));
        let d = claim_guarded("DELETE FROM namespaces WHERE id = $1", 1).unwrap();
        assert!(
            d.ends_with("DELETE FROM namespaces WHERE EXISTS (SELECT 1 FROM claim) AND (id = $1)")
        );
    }

    #[test]
    fn statements_the_check_cannot_be_joined_to_are_refused() {
        for sql in [
            "UPDATE agents SET a = 1",
            "UPDATE agents SET a = 1 WHERE id = $1 RETURNING a",
            "SELECT 1 FROM work WHERE id = $1",
            "INSERT INTO t VALUES (1)",
        ] {
            let e = claim_guarded(sql, 1).unwrap_err().to_string();
            assert!(e.contains("must be an UPDATE or DELETE"), "{sql}: {e}");
        }
    }
}
