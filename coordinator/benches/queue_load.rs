//! Benchmark (not a timed test): work-queue throughput against a simulated fleet of 10,000
//! hosts that answer instantly, with one coordinator on SQLite and three coordinators sharing
//! one PostgreSQL database. What is measured is the coordinator alone: claims, leases, fences,
//! the deploy's phases and every store write they make; the hosts cost nothing.
//!
//! Each coordinator is the real worker (`coordinator::worker::Worker`, default settings:
//! 16 items in flight) with its own store (for PostgreSQL, its own connection pool) in its own
//! tokio runtime of 2 threads named `occ-N`, as separate `occ serve` processes would be; they
//! share this process only so that one run can count their host calls and CPU per thread.
//! The backend is [`SimFleet`] below, behind the coordinator's `Backend` trait: it answers
//! ensure-namespace, prepare-revision and activate-revision at once, as a healthy hostd would.
//!
//! Set-up (untimed): the hosts, Namespaces of `CLAWFLEET_BENCH_POOL` hosts each (10 by
//! default: placement reads every pool host), one Configuration per Namespace, the Agents
//! spread round-robin over the Namespaces. Then, timed, two drains with every coordinator
//! running: ENSURE (each Namespace made ready on its pool hosts: one ensure-namespace per
//! host) and DEPLOY (`CLAWFLEET_BENCH_AGENTS` deploys, queued first through the service layer
//! as the API queues them, then drained: place, prepare, commit, activate per Agent). A drain
//! ends when no work is queued or running, or after `CLAWFLEET_BENCH_SECONDS`; the figures
//! are over what was done by then.
//!
//! Printed per configuration: Agent deploys (work items) per second and host operations per
//! second, in all and per coordinator, beside the goal (at least 2,000 operations/s
//! in all with 3 coordinators), and CPU time per Agent deploy: the coordinators' threads
//! (`/proc/self/task/*/schedstat`) and, for PostgreSQL, the database server's processes.
//!
//! `cargo bench -p clawfleet-coordinator --bench queue_load`. Knobs: `CLAWFLEET_BENCH_HOSTS`
//! (10000), `CLAWFLEET_BENCH_AGENTS` (6000; 20000 to queue more than any configuration
//! drains in the default limit), `CLAWFLEET_BENCH_POOL` (10), `CLAWFLEET_BENCH_SECONDS`
//! (drain limit, 30), `CLAWFLEET_BENCH_CONFIGS`
//! (`sqlite:1,postgres:3`: store and coordinator count), `CLAWFLEET_BENCH_PG_STATS=1` (load
//! `pg_stat_statements` and print the deploy drain's 25 most expensive statements),
//! `CLAWFLEET_BENCH_EXPLAIN` (an SQL text, e.g. `EXPLAIN ANALYZE …`, run with the full queue
//! just before the deploy drain, with `CLAWFLEET_BENCH_PG_STATS=1`). PostgreSQL needs root
//! and Debian's postgresql package; without them its rows say why they were skipped.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use clawfleet_pg_tests::TestPostgres;
use clawfleet_protocol::result::{
    ActivateResult, AgentObservation, EnsureNamespaceResult, OperationResult, PrepareResult,
};
use clawfleet_protocol::{Failure, FailureCode, Operation};
use coordinator::backend::{Backend, CallError, CallOptions, Target};
use coordinator::config::WorkerSettings;
use coordinator::model::Host;
use coordinator::service::{NewAgent, NewNamespace, Service};
use coordinator::store::SharedStore;
use coordinator::store::database::{Database, PostgresOptions, PostgresSettings};
use coordinator::store::postgres::PostgresStore;
use coordinator::store::sqlite::SqliteStore;
use coordinator::worker::Worker;
use serde_json::json;

const HOST_KEY: &str =
    "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGtlzZ3MFfuteL1oS3yr1Yx72/TNBkiGm1NN+JwrXN+M";
/// The goal for three coordinators on PostgreSQL.
const OPS_GOAL: f64 = 2000.0;
/// Tasks that write the set-up rows at once.
const SETUP_TASKS: usize = 8;

/// `CLAWFLEET_BENCH_PG_STATS=1`: load pg_stat_statements and print the deploy drain's most
/// expensive statements, to see where the database's time goes.
fn pg_stats() -> bool {
    std::env::var("CLAWFLEET_BENCH_PG_STATS").is_ok_and(|v| v == "1")
}

fn knob(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|n| *n > 0)
        .unwrap_or(default)
}

// ---------------------------------------------------------------------------------------------
// The simulated fleet.

/// Hosts that answer at once, as a healthy hostd would: a Namespace is ensured, a revision is
/// prepared (ready, nothing newer current) and activated (current and served, with a port).
/// One instance per coordinator, so each counts its own calls.
#[derive(Debug, Default)]
struct SimFleet {
    ensure: AtomicU64,
    prepare: AtomicU64,
    activate: AtomicU64,
    /// Anything else: none is expected in a run of first deploys (printed when not zero).
    other: AtomicU64,
}

impl Backend for SimFleet {
    async fn call(
        &self,
        target: impl Into<Target> + Send,
        operation: Operation,
        _options: CallOptions,
    ) -> Result<OperationResult, CallError> {
        let target = target.into();
        let nothing = AgentObservation {
            current: None,
            served: None,
            port: None,
            unit: None,
        };
        match operation {
            Operation::EnsureNamespace(a) => {
                self.ensure.fetch_add(1, Ordering::Relaxed);
                Ok(OperationResult::EnsureNamespace(EnsureNamespaceResult {
                    namespace_id: a.namespace.id,
                    created: true,
                }))
            }
            Operation::PrepareRevision(_) => {
                self.prepare.fetch_add(1, Ordering::Relaxed);
                Ok(OperationResult::PrepareRevision(PrepareResult {
                    ready: true,
                    created: true,
                    observation: nothing,
                    workspace: None,
                }))
            }
            Operation::ActivateRevision(a) => {
                let n = self.activate.fetch_add(1, Ordering::Relaxed);
                Ok(OperationResult::ActivateRevision(ActivateResult {
                    restarted: true,
                    unit_changed: true,
                    observation: AgentObservation {
                        current: Some(a.revision.id.clone()),
                        served: Some(a.revision.id),
                        port: Some(20000 + (n % 10000) as u16),
                        unit: None,
                    },
                    restored: None,
                    secrets_reload: None,
                    config_reload: None,
                }))
            }
            other => {
                self.other.fetch_add(1, Ordering::Relaxed);
                Err(CallError::Failed(Failure::new(
                    FailureCode::InvalidInput,
                    format!(
                        "the simulated host {} answers ensure, prepare and activate only, not {}",
                        target.name(),
                        other.kind()
                    ),
                )))
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// CPU time.

/// CPU time of one thread or process from its `schedstat` (nanoseconds on the CPU).
fn schedstat(path: &str) -> Option<Duration> {
    let text = std::fs::read_to_string(path).ok()?;
    let ns: u64 = text.split_whitespace().next()?.parse().ok()?;
    Some(Duration::from_nanos(ns))
}

/// CPU time of this process's threads named `occ-{i}`, by `i`.
fn coordinator_cpu() -> BTreeMap<usize, Duration> {
    let mut out = BTreeMap::new();
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return out;
    };
    for t in tasks.flatten() {
        let dir = t.path();
        let Ok(comm) = std::fs::read_to_string(dir.join("comm")) else {
            continue;
        };
        let Some(i) = comm
            .trim()
            .strip_prefix("occ-")
            .and_then(|i| i.parse::<usize>().ok())
        else {
            continue;
        };
        if let Some(cpu) = schedstat(&dir.join("schedstat").to_string_lossy()) {
            *out.entry(i).or_default() += cpu;
        }
    }
    out
}

/// CPU time of the PostgreSQL server's processes (the postmaster and its children), by pid.
fn server_cpu(pg: &TestPostgres) -> BTreeMap<u32, Duration> {
    pg.server_pids()
        .into_iter()
        .filter_map(|pid| Some((pid, schedstat(&format!("/proc/{pid}/schedstat"))?)))
        .collect()
}

/// CPU spent between two readings; processes that appeared in between count from zero.
fn cpu_between<K: Ord>(before: &BTreeMap<K, Duration>, after: &BTreeMap<K, Duration>) -> Duration {
    after
        .iter()
        .map(|(k, a)| a.saturating_sub(before.get(k).copied().unwrap_or_default()))
        .sum()
}

// ---------------------------------------------------------------------------------------------
// Coordinators.

/// One coordinator: a runtime named `occ-{i}` and its own store.
struct Occ {
    rt: tokio::runtime::Runtime,
    store: SharedStore,
    /// The same store when it is SQLite (for its set-up durability).
    sqlite: Option<Arc<SqliteStore>>,
}

/// Where the coordinators' stores come from.
enum Db {
    Sqlite(std::path::PathBuf),
    Postgres(Box<PostgresSettings>),
}

impl Occ {
    fn start(i: usize, db: &Db) -> Self {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name(format!("occ-{i}"))
            .enable_all()
            .build()
            .unwrap();
        let (store, sqlite): (SharedStore, _) = match db {
            Db::Sqlite(path) => {
                let s = Arc::new(SqliteStore::open(path).unwrap());
                (s.clone(), Some(s))
            }
            Db::Postgres(settings) => (
                Arc::new(
                    rt.block_on(PostgresStore::connect(settings.clone()))
                        .unwrap(),
                ),
                None,
            ),
        };
        Self { rt, store, sqlite }
    }
}

/// One drain: every coordinator's worker runs until nothing is queued or running, or the
/// limit passes.
struct Drain {
    wall: Duration,
    /// Host calls per coordinator, by kind: (ensure, prepare, activate, other).
    calls: Vec<[u64; 4]>,
    /// Coordinator CPU per coordinator.
    cpu: Vec<Duration>,
    /// Database server CPU (PostgreSQL only).
    server_cpu: Option<Duration>,
    /// Work still queued or running at the end.
    left: i64,
}

fn drain(occs: &[Occ], limit: Duration, pg: Option<&TestPostgres>) -> Drain {
    let settings = WorkerSettings::default();
    let fleets: Vec<Arc<SimFleet>> = occs.iter().map(|_| Arc::default()).collect();
    let (stop, stop_rx) = tokio::sync::watch::channel(false);
    let cpu0 = coordinator_cpu();
    let server0 = pg.map(server_cpu);
    let t0 = Instant::now();
    let tasks: Vec<_> = occs
        .iter()
        .zip(&fleets)
        .map(|(o, fleet)| {
            let worker = Arc::new(Worker::new(
                o.store.clone(),
                fleet.clone(),
                settings.clone(),
            ));
            o.rt.spawn(worker.run(settings.parallelism, stop_rx.clone()))
        })
        .collect();
    let watcher = &occs[0];
    let mut left;
    loop {
        std::thread::sleep(Duration::from_millis(50));
        left = watcher
            .rt
            .block_on(watcher.store.pending_work())
            .unwrap_or(-1);
        if left == 0 || t0.elapsed() > limit {
            break;
        }
    }
    let wall = t0.elapsed();
    let cpu1 = coordinator_cpu();
    let server1 = pg.map(server_cpu);
    let _ = stop.send(true);
    for (o, t) in occs.iter().zip(tasks) {
        let _ = o.rt.block_on(t);
    }
    Drain {
        wall,
        calls: fleets
            .iter()
            .map(|f| {
                [
                    f.ensure.load(Ordering::Relaxed),
                    f.prepare.load(Ordering::Relaxed),
                    f.activate.load(Ordering::Relaxed),
                    f.other.load(Ordering::Relaxed),
                ]
            })
            .collect(),
        cpu: (0..occs.len())
            .map(|i| {
                cpu1.get(&i)
                    .copied()
                    .unwrap_or_default()
                    .saturating_sub(cpu0.get(&i).copied().unwrap_or_default())
            })
            .collect(),
        server_cpu: server0.zip(server1).map(|(a, b)| cpu_between(&a, &b)),
        left,
    }
}

/// The hosts, Namespaces, Configurations and Agents, written by several tasks at once.
async fn populate(
    store: &SharedStore,
    hosts: usize,
    pool: usize,
    agents: usize,
) -> Vec<(String, String)> {
    let names: Vec<String> = (0..hosts).map(|i| format!("h{i:05}")).collect();
    let namespaces = hosts.div_ceil(pool);
    let mut set = tokio::task::JoinSet::new();
    for t in 0..SETUP_TASKS {
        let (store, names) = (store.clone(), names.clone());
        set.spawn(async move {
            for (i, name) in names.iter().enumerate().skip(t).step_by(SETUP_TASKS) {
                let host = Host {
                    name: clawfleet_protocol::HostName::new(name.as_str()).unwrap(),
                    address: format!("10.{}.{}.{}", i >> 16, (i >> 8) & 255, i & 255),
                    port: 22,
                    host_key: HOST_KEY.into(),
                    fingerprint: "SHA256:simulated".into(),
                    max_agents: 100,
                    enrolled_at: 1,
                    last_probe: None,
                    login_user: None,
                    jump: None,
                    fencing: Default::default(),
                };
                assert!(store.insert_host(&host).await.unwrap());
            }
        });
    }
    set.join_all().await;
    let service = Service::new(store.clone());
    let mut set = tokio::task::JoinSet::new();
    for t in 0..SETUP_TASKS {
        let (service, names) = (service.clone(), names.clone());
        set.spawn(async move {
            for n in (t..namespaces).step_by(SETUP_TASKS) {
                let ns = format!("ns{n:04}");
                let end = ((n + 1) * pool).min(names.len());
                service
                    .create_namespace(
                        "bench",
                        NewNamespace {
                            id: ns.clone(),
                            name: None,
                            hosts: names[n * pool..end].to_vec(),
                            cluster: None,
                            single_tenant: false,
                        },
                        true,
                    )
                    .await
                    .unwrap();
                service
                    .put_configuration("bench", &ns, "cfg", json!({}), true)
                    .await
                    .unwrap();
            }
        });
    }
    set.join_all().await;
    let mut set = tokio::task::JoinSet::new();
    for t in 0..SETUP_TASKS {
        let service = service.clone();
        set.spawn(async move {
            let mut mine = Vec::new();
            for j in (t..agents).step_by(SETUP_TASKS) {
                let ns = format!("ns{:04}", j % namespaces);
                let id = format!("a{j:05}");
                service
                    .create_agent(
                        "bench",
                        &ns,
                        NewAgent {
                            id: id.clone(),
                            service_principal_id: None,
                            configuration_id: "cfg".into(),
                            harness_auth: None,
                            restore: None,
                            workspace_files: Vec::new(),
                            egress: None,
                        },
                    )
                    .await
                    .unwrap();
                mine.push((ns, id));
            }
            mine
        });
    }
    set.join_all().await.into_iter().flatten().collect()
}

/// Queues one deploy per Agent through the service layer (a new revision and its work item,
/// as `POST …/deploy` does); how long that took.
async fn enqueue(store: &SharedStore, agents: &[(String, String)]) -> Duration {
    let t0 = Instant::now();
    let service = Service::new(store.clone());
    let mut set = tokio::task::JoinSet::new();
    for t in 0..SETUP_TASKS {
        let service = service.clone();
        let mine: Vec<(String, String)> = agents
            .iter()
            .skip(t)
            .step_by(SETUP_TASKS)
            .cloned()
            .collect();
        set.spawn(async move {
            for (ns, a) in mine {
                service.deploy("bench", &ns, &a).await.unwrap();
            }
        });
    }
    set.join_all().await;
    t0.elapsed()
}

/// SQLite's durability for the untimed set-up: its rows are written without fsync; the
/// drains run as `occ serve` does (synchronous=FULL). Nothing to do for PostgreSQL.
fn sqlite_sync(o: &Occ, mode: &str) {
    if let Some(s) = &o.sqlite {
        o.rt.block_on(s.with_connection(|c| c.pragma_update(None, "synchronous", mode)))
            .unwrap();
    }
}

/// One configuration's figures, printed as one line per drain.
struct Figures {
    config: String,
    /// `ensure*` when that drain ran without fsync (SQLite's set-up).
    ensure_label: &'static str,
    setup: Duration,
    enqueue: Duration,
    agents: usize,
    ensure: Drain,
    deploy: Drain,
    deploy_counts: String,
}

fn run_config(
    store_kind: &str,
    coordinators: usize,
    hosts: usize,
    pool: usize,
    agents: usize,
    limit: Duration,
    pg: Option<&TestPostgres>,
) -> Figures {
    let dir = tempfile::tempdir().unwrap();
    let db = match (store_kind, pg) {
        ("postgres", Some(pg)) => {
            let name = format!("queue{coordinators}");
            pg.create_role(&name, None).unwrap();
            pg.create_database_owned_by(&name, &name).unwrap();
            let Database::Postgres(settings) =
                Database::parse_url(&pg.url(&name, &name), &PostgresOptions::default(), None)
                    .unwrap()
            else {
                unreachable!("a postgres:// URL")
            };
            Db::Postgres(settings)
        }
        _ => Db::Sqlite(dir.path().join("occ.db")),
    };
    let t0 = Instant::now();
    let occs: Vec<Occ> = (0..coordinators).map(|i| Occ::start(i, &db)).collect();
    let first = &occs[0];
    let first_is_sqlite = first.sqlite.is_some();
    sqlite_sync(first, "OFF");
    let names = first
        .rt
        .block_on(populate(&first.store, hosts, pool, agents));
    let setup = t0.elapsed();
    // SQLite ensures its 10,000 hosts at fsync speed for over a minute: that drain is set-up
    // there (and so marked), timed as is on PostgreSQL.
    let ensure = drain(&occs, limit, pg);
    let enqueue_took = first.rt.block_on(enqueue(&first.store, &names));
    sqlite_sync(first, "FULL");
    if let (true, Some(pg), Db::Postgres(_)) = (pg_stats(), pg, &db) {
        let name = format!("queue{coordinators}");
        pg.psql_in(
            &name,
            "CREATE EXTENSION IF NOT EXISTS pg_stat_statements; SELECT pg_stat_statements_reset()",
        )
        .unwrap();
        if let Ok(sql) = std::env::var("CLAWFLEET_BENCH_EXPLAIN") {
            println!(
                "{}",
                pg.psql_in(&name, &sql).unwrap_or_else(|e| e.to_string())
            );
        }
    }
    let deploy = drain(&occs, limit, pg);
    if let (true, Some(pg), Db::Postgres(_)) = (pg_stats(), pg, &db) {
        let name = format!("queue{coordinators}");
        let top = pg
            .psql_in(
                &name,
                "SELECT round(total_exec_time)::bigint AS ms, calls, round((total_exec_time / calls)::numeric, 3) AS ms_per_call, \
                 rows, left(regexp_replace(query, '\\s+', ' ', 'g'), 160) AS query \
                 FROM pg_stat_statements ORDER BY total_exec_time DESC LIMIT 25",
            )
            .unwrap_or_else(|e| format!("pg_stat_statements: {e}"));
        println!(
            "postgres x{coordinators} deploy drain, statements by total time (ms, calls, ms per call, rows, statement):\n{top}"
        );
    }
    let counts = first
        .rt
        .block_on(first.store.work_counts())
        .unwrap_or_default();
    let deploy_counts = counts
        .iter()
        .filter(|(kind, _, _)| kind == "deploy")
        .map(|(_, state, n)| format!("{state} {n}"))
        .collect::<Vec<_>>()
        .join(", ");
    for o in occs {
        o.rt.shutdown_timeout(Duration::from_secs(5));
    }
    Figures {
        config: format!("{store_kind} x{coordinators}"),
        ensure_label: if first_is_sqlite { "ensure*" } else { "ensure" },
        setup,
        enqueue: enqueue_took,
        agents,
        ensure,
        deploy,
        deploy_counts,
    }
}

fn main() {
    let hosts = knob("CLAWFLEET_BENCH_HOSTS", 10_000);
    let agents = knob("CLAWFLEET_BENCH_AGENTS", 6_000);
    let pool = knob("CLAWFLEET_BENCH_POOL", 10).min(hosts);
    let limit = Duration::from_secs(knob("CLAWFLEET_BENCH_SECONDS", 30) as u64);
    let configs = std::env::var("CLAWFLEET_BENCH_CONFIGS")
        .unwrap_or_else(|_| "sqlite:1,postgres:3".to_owned());
    println!(
        "queue_load: {agents} Agent deploys over {hosts} simulated hosts ({} Namespaces of {pool} \
         hosts), instant backend, worker default settings; drain limit {} s",
        hosts.div_ceil(pool),
        limit.as_secs()
    );
    let mut pg: Option<Result<TestPostgres, String>> = None;
    let mut results = Vec::new();
    for config in configs.split(',').map(str::trim) {
        let (kind, n) = config.split_once(':').unwrap_or((config, "1"));
        let mut n: usize = n.parse().unwrap_or(1).max(1);
        if kind == "sqlite" && n > 1 {
            println!("sqlite:{n}: SQLite serves one coordinator; running sqlite:1");
            n = 1;
        }
        let server = match kind {
            "sqlite" => None,
            "postgres" => {
                let server = pg.get_or_insert_with(|| {
                    if let Some(reason) = clawfleet_pg_tests::skip_reason() {
                        return Err(reason);
                    }
                    let mut options = clawfleet_pg_tests::Options::default();
                    if pg_stats() {
                        options = options.setting("shared_preload_libraries", "pg_stat_statements");
                    }
                    TestPostgres::start_with(&options)
                        .map_err(|e| format!("the test server did not start: {e}"))
                });
                match server {
                    Ok(s) => Some(&*s),
                    Err(reason) => {
                        println!("skipped PostgreSQL x{n}: {reason}");
                        continue;
                    }
                }
            }
            other => {
                println!(
                    "unknown store {other:?} in CLAWFLEET_BENCH_CONFIGS (sqlite:N, postgres:N)"
                );
                continue;
            }
        };
        let f = run_config(kind, n, hosts, pool, agents, limit, server);
        println!(
            "{}: setup {:.1} s (untimed); {} deploys queued in {:.1} s ({:.0}/s); deploy work \
             at the end: {}",
            f.config,
            f.setup.as_secs_f64(),
            f.agents,
            f.enqueue.as_secs_f64(),
            f.agents as f64 / f.enqueue.as_secs_f64().max(1e-9),
            f.deploy_counts
        );
        results.push(f);
    }
    println!();
    println!(
        "{:<12} {:<7} {:>6} {:>7} {:>9} {:>9} {:>10}  {:<28} {:>11} {:>10}",
        "config",
        "drain",
        "wall s",
        "items",
        "items/s",
        "host ops",
        "host ops/s",
        "per coordinator (ops/s)",
        "occ CPU/item",
        "db CPU/item"
    );
    for f in &results {
        for (what, d, items) in [
            (f.ensure_label, &f.ensure, None),
            ("deploy", &f.deploy, Some(f.agents)),
        ] {
            let ops: u64 = d.calls.iter().map(|c| c.iter().sum::<u64>()).sum();
            let secs = d.wall.as_secs_f64().max(1e-9);
            // Items: Namespaces ensured on every pool host, or Agents activated.
            let done: u64 = match items {
                Some(_) => d.calls.iter().map(|c| c[2]).sum(),
                None => d.calls.iter().map(|c| c[0]).sum(),
            };
            let per: Vec<String> = d
                .calls
                .iter()
                .map(|c| format!("{:.0}", c.iter().sum::<u64>() as f64 / secs))
                .collect();
            let cpu: Duration = d.cpu.iter().sum();
            let per_item = |t: Duration| {
                if done == 0 {
                    "-".to_owned()
                } else {
                    format!("{:.2} ms", t.as_secs_f64() * 1000.0 / done as f64)
                }
            };
            println!(
                "{:<12} {:<7} {:>6.2} {:>7} {:>9.0} {:>9} {:>10.0}  {:<28} {:>11} {:>10}{}{}",
                f.config,
                what,
                secs,
                done,
                done as f64 / secs,
                ops,
                ops as f64 / secs,
                per.join(" / "),
                per_item(cpu),
                d.server_cpu.map_or("-".to_owned(), per_item),
                if d.left > 0 {
                    format!("  NOT DRAINED: {} items left", d.left)
                } else {
                    String::new()
                },
                if d.calls.iter().any(|c| c[3] > 0) {
                    "  (unexpected operations answered with a failure)".to_owned()
                } else {
                    String::new()
                },
            );
        }
        let deploy_ops: u64 = f.deploy.calls.iter().map(|c| c.iter().sum::<u64>()).sum();
        let rate = deploy_ops as f64 / f.deploy.wall.as_secs_f64().max(1e-9);
        if f.config == "postgres x3" {
            println!(
                "{:<12} goal: >= {OPS_GOAL} host operations/s in all while deploying (issue 13, 3 coordinators on PostgreSQL): {:.0} -> {}",
                f.config,
                rate,
                if rate >= OPS_GOAL { "MET" } else { "MISSED" }
            );
        } else {
            println!(
                "{:<12} {:.0} host operations/s in all while deploying (the goal of {OPS_GOAL} is for 3 coordinators on PostgreSQL)",
                f.config, rate
            );
        }
    }
    println!(
        "  items: ensure = ensure-namespace calls (one per Namespace and pool host), deploy = \
         Agents activated; a deploy is 2 host operations (prepare, activate). CPU: on-CPU time \
         of the coordinators' runtime threads (schedstat) and of the PostgreSQL server's \
         processes, per item. SQLite: a file on this machine's disk, WAL, synchronous=FULL. \
         ensure*: run without fsync (set-up). PostgreSQL: the throwaway test server (fsync=off, \
         tmpfs), pool of 16 per coordinator. \
         All coordinators share this machine's {} cores.",
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
}
