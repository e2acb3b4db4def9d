//! Benchmark (not a timed test): the deploy API and the read routes under 8 concurrent HTTP
//! clients while the worker drains the backlog the deploys leave, on SQLite (a file in a
//! temporary directory, as `occ serve` runs it) and on PostgreSQL (a throwaway server from
//! `clawfleet-pg-tests`), side by side in one run. It prints requests/s, p50, p99, max and the
//! count of 5xx answers per route and store, with the targets of the fast-path issue beside
//! them (deploy ≥ 1,000 requests/s with p99 ≤ 20 ms, reads p99 ≤ 20 ms, no 5xx).
//!
//! The coordinator is the real one in process: the router from `coordinator::api` served over
//! loopback HTTP with the same hyper connection setup as `occ serve`, the real worker, and
//! hostd's real engine over its fake privileged layer as the backend
//! (`tests/hostd_engine/mod.rs`; no root needed for the SQLite part). The clients are 8 OS
//! threads with one keep-alive connection each, on the same 2 cores as the coordinator.
//!
//! Phases per store: setup (untimed: hosts, Namespaces, Agents, the Namespaces ensured), then
//! DEPLOY (each client POSTs `…/deploy` for its share of the Agents, one deploy per Agent, the
//! worker running), then READS (each client cycles GET Agent, GET deployment-status, GET the
//! Namespace's Agent list) started as soon as the deploys were sent, while the worker is still
//! draining. The backlog (queued or running work) at the start and end of each phase is
//! printed, so one can see the reads really met a draining worker.
//!
//! Then, per store, the CHURN case on the same Agents (now running): each client deploys its
//! share `CLAWFLEET_BENCH_CHURN_ROUNDS` times over (default 5; 0 skips it), so most revisions
//! are superseded in the queue and the worker retires them, with the same reads meanwhile.
//! It prints how long the drain took after the last deploy was sent against how long the
//! deploys took to send (target: within 2×), the host calls by kind, and failed deploys.
//!
//! `cargo bench -p clawfleet-coordinator --bench api_load`. Knobs: `CLAWFLEET_BENCH_AGENTS`
//! (deploy requests, one per Agent; default 1000), `CLAWFLEET_BENCH_READS` (read requests in
//! all; default 6000), `CLAWFLEET_BENCH_CLIENTS` (default 8), `CLAWFLEET_BENCH_STORES`
//! (`sqlite,postgres` by default), `CLAWFLEET_BENCH_DRAIN_SECONDS` (how long to wait, after
//! the reads, for the worker to finish the backlog; 15), `CLAWFLEET_BENCH_YIELD_PARALLELISM`
//! (the worker's items at once while the API is busy; `worker.yield_parallelism`'s default
//! for each store, and 16 never yields). PostgreSQL needs root and Debian's postgresql package; without them
//! its rows say why they were skipped.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod bench_http;
mod bench_setup;
#[path = "../tests/hostd_engine/mod.rs"]
mod hostd_engine;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bench_http::Http;
use clawfleet_pg_tests::TestPostgres;
use coordinator::api::{AppState, router};
use coordinator::config::{ApiSettings, WorkerSettings};
use coordinator::service::{NewAgent, NewNamespace, Service};
use coordinator::store::SharedStore;
use coordinator::store::database::{Database, PostgresOptions};
use coordinator::store::postgres::PostgresStore;
use coordinator::store::sqlite::SqliteStore;
use coordinator::worker::Worker;
use hostd_engine::EngineBackend;
use serde_json::json;

/// Pool hosts, shared by every Namespace (simulated by hostd's engine, one state root each).
const HOSTS: usize = 4;
/// Agents per Namespace: the list route answers this many.
const AGENTS_PER_NAMESPACE: usize = 100;

/// Targets from the fast-path issue.
const DEPLOY_RPS_TARGET: f64 = 1000.0;
const P99_TARGET_MS: f64 = 20.0;

/// Where the simulated hosts keep their state: tmpfs when there is one. On a fleet each host's
/// file system work (journal, markers, snapshots, with their fsyncs) is done by that host's
/// disk and CPU; on this machine's disk it would compete with the coordinator under test.
fn sim_hosts_dir() -> Option<&'static std::path::Path> {
    let shm = std::path::Path::new("/dev/shm");
    shm.is_dir().then_some(shm)
}

/// `CLAWFLEET_BENCH_YIELD_PARALLELISM`: the worker's `yield_parallelism` (the store's default
/// unless given; `16`, its parallelism, never yields, as before the worker yielded to the
/// API).
fn yield_parallelism(sqlite: bool) -> usize {
    let d = WorkerSettings::default();
    let default = if sqlite {
        coordinator::config::YIELD_PARALLELISM_SQLITE
    } else {
        coordinator::config::YIELD_PARALLELISM_POSTGRES
    };
    std::env::var("CLAWFLEET_BENCH_YIELD_PARALLELISM")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|n| (1..=d.parallelism).contains(n))
        .unwrap_or(default)
}

fn knob(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|n| *n > 0)
        .unwrap_or(default)
}

// ---------------------------------------------------------------------------------------------
// Figures.

/// What one phase's requests of one route came to.
#[derive(Default)]
struct Samples {
    latencies: Vec<Duration>,
    server_errors: usize,
    other_errors: usize,
    transport_errors: usize,
}

impl Samples {
    fn add(&mut self, took: Duration, status: std::io::Result<u16>) {
        self.latencies.push(took);
        match status {
            Ok(s) if s >= 500 => self.server_errors += 1,
            Ok(s) if !(200..300).contains(&s) => self.other_errors += 1,
            Ok(_) => {}
            Err(_) => self.transport_errors += 1,
        }
    }

    fn merge(&mut self, other: Samples) {
        self.latencies.extend(other.latencies);
        self.server_errors += other.server_errors;
        self.other_errors += other.other_errors;
        self.transport_errors += other.transport_errors;
    }

    fn quantile_ms(&self, q: f64) -> f64 {
        let mut v = self.latencies.clone();
        v.sort();
        if v.is_empty() {
            return 0.0;
        }
        let i = ((v.len() - 1) as f64 * q).round() as usize;
        v[i].as_secs_f64() * 1000.0
    }
}

/// One printed row.
struct Row {
    store: String,
    route: &'static str,
    samples: Samples,
    /// The phase's wall time (all routes of the phase together).
    wall: Duration,
    /// Requests of the whole phase (for the phase's requests/s).
    phase_requests: usize,
    rps_target: Option<f64>,
}

fn print_rows(rows: &[Row]) {
    println!(
        "{:<10} {:<36} {:>6} {:>9} {:>7} {:>7} {:>7} {:>4} {:>5}  goal (issue 17)",
        "store", "route", "n", "req/s", "p50 ms", "p99 ms", "max ms", "5xx", "other"
    );
    for r in rows {
        let s = &r.samples;
        let rps = r.phase_requests as f64 / r.wall.as_secs_f64().max(1e-9);
        let p99 = s.quantile_ms(0.99);
        let mut goal = format!("p99 <= {P99_TARGET_MS} ms");
        let mut met = p99 <= P99_TARGET_MS && s.server_errors == 0 && s.transport_errors == 0;
        if let Some(t) = r.rps_target {
            goal = format!(">= {t} req/s, {goal}");
            met &= rps >= t;
        }
        goal.push_str(", 0 5xx");
        println!(
            "{:<10} {:<36} {:>6} {:>9.0} {:>7.2} {:>7.2} {:>7.2} {:>4} {:>5}  {goal}: {}",
            r.store,
            r.route,
            s.latencies.len(),
            rps,
            s.quantile_ms(0.5),
            p99,
            s.quantile_ms(1.0),
            s.server_errors + s.transport_errors,
            s.other_errors,
            if met { "MET" } else { "MISSED" },
        );
    }
}

// ---------------------------------------------------------------------------------------------
// The coordinator under test.

/// A coordinator (API + worker) on one store, in its own runtime.
struct Coordinator {
    rt: tokio::runtime::Runtime,
    store: SharedStore,
    addr: SocketAddr,
    token: String,
    agents: Vec<(String, String)>,
    stop: tokio::sync::watch::Sender<bool>,
    backend: Arc<EngineBackend>,
    /// (time, queued or running work) every 50 ms.
    backlog: Arc<Mutex<Vec<(Instant, i64)>>>,
    setup: Duration,
}

impl Coordinator {
    /// `sqlite`: the same store when it is SQLite, whose untimed set-up rows are written
    /// without fsync (the timed phases run with synchronous=FULL, as `occ serve` does).
    fn start(
        open: impl Future<Output = (SharedStore, Option<Arc<SqliteStore>>)>,
        agents: usize,
    ) -> Self {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let t0 = Instant::now();
        let (store, sqlite) = rt.block_on(open);
        let sync = |mode: &str| {
            if let Some(s) = &sqlite {
                rt.block_on(s.with_connection(|c| c.pragma_update(None, "synchronous", mode)))
                    .unwrap();
            }
        };
        sync("OFF");
        let (token, names) = rt.block_on(populate(&store, agents));
        sync("FULL");
        let backend = Arc::new(match sim_hosts_dir() {
            Some(dir) => EngineBackend::with_hosts_in(dir),
            None => EngineBackend::new(),
        });
        let (stop, stop_rx) = tokio::sync::watch::channel(false);
        let settings = WorkerSettings {
            yield_parallelism: yield_parallelism(sqlite.is_some()),
            ..WorkerSettings::default()
        };
        // Wired as `occ serve` wires them: the worker yields to the API's requests.
        let foreground = coordinator::foreground::Foreground::default();
        let worker = Arc::new(
            Worker::new(store.clone(), backend.clone(), settings.clone())
                .yielding_to(foreground.clone()),
        );
        rt.spawn(worker.run(settings.parallelism, stop_rx.clone()));
        let state = Arc::new(AppState {
            service: Service::new(store.clone()),
            backend: backend.clone(),
            foreground,
        });
        let listener = rt
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .unwrap();
        let addr = listener.local_addr().unwrap();
        let mut rx = stop_rx.clone();
        rt.spawn(async move {
            let api = ApiSettings::default();
            let shutdown = async move {
                let _ = rx.wait_for(|s| *s).await;
            };
            coordinator::api::serve(listener, router(state), &api, shutdown).await
        });
        // The Namespaces' ensure work, before anything is timed.
        rt.block_on(async {
            while store.pending_work().await.unwrap() > 0 {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        });
        let backlog = Arc::new(Mutex::new(Vec::new()));
        let (b, s, mut rx) = (backlog.clone(), store.clone(), stop_rx);
        rt.spawn(async move {
            loop {
                if let Ok(n) = s.pending_work().await {
                    b.lock().unwrap().push((Instant::now(), n));
                }
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_millis(50)) => {}
                    _ = rx.changed() => return,
                }
            }
        });
        Self {
            rt,
            store,
            addr,
            token,
            agents: names,
            stop,
            backend,
            backlog,
            setup: t0.elapsed(),
        }
    }

    /// Work queued or running now.
    fn backlog(&self) -> i64 {
        self.rt.block_on(self.store.pending_work()).unwrap_or(-1)
    }

    /// When the backlog was first seen empty after `from`.
    fn drained_at(&self, from: Instant, limit: Duration) -> Option<Instant> {
        let deadline = Instant::now() + limit;
        loop {
            if let Some((t, _)) = self
                .backlog
                .lock()
                .unwrap()
                .iter()
                .find(|(t, n)| *t > from && *n == 0)
            {
                return Some(*t);
            }
            if Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Host calls so far, by operation kind.
    fn host_calls(&self) -> std::collections::BTreeMap<String, usize> {
        let mut out = std::collections::BTreeMap::new();
        for line in self.backend.log() {
            let kind = line.rsplit(' ').next().unwrap_or_default().to_owned();
            *out.entry(kind).or_insert(0) += 1;
        }
        out
    }

    fn work_counts(&self) -> String {
        let counts = self
            .rt
            .block_on(self.store.work_counts())
            .unwrap_or_default();
        counts
            .iter()
            .filter(|(kind, _, _)| kind == "deploy")
            .map(|(_, state, n)| format!("{state} {n}"))
            .collect::<Vec<_>>()
            .join(", ")
    }

    fn stop(self) {
        let _ = self.stop.send(true);
        self.rt.shutdown_timeout(Duration::from_secs(5));
    }
}

/// Hosts, Namespaces of `AGENTS_PER_NAMESPACE` Agents over them, the Agents, and an admin
/// token; the token's secret and the Agents as (Namespace, Agent).
async fn populate(store: &SharedStore, agents: usize) -> (String, Vec<(String, String)>) {
    let token = bench_setup::admin_token(store).await;
    let service = Service::new(store.clone());
    let hosts: Vec<String> = (1..=HOSTS).map(|i| format!("h{i}")).collect();
    bench_setup::enrol_hosts(&service, &hosts, 22).await;
    let mut names = Vec::with_capacity(agents);
    for i in 0..agents {
        let ns = format!("ns{}", i / AGENTS_PER_NAMESPACE);
        if i % AGENTS_PER_NAMESPACE == 0 {
            service
                .create_namespace(
                    "bench",
                    NewNamespace {
                        id: ns.clone(),
                        name: None,
                        hosts: hosts.clone(),
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
        let id = format!("a{i}");
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
        names.push((ns, id));
    }
    (token, names)
}

/// Runs `clients` threads, each given its index; returns their samples per route and the wall
/// time from the first start to the last end.
fn load(
    clients: usize,
    routes: &[&'static str],
    run: impl Fn(usize, &mut Http, &mut [Samples]) + Sync,
    addr: SocketAddr,
    token: &str,
) -> (Vec<Samples>, Duration) {
    let t0 = Instant::now();
    let per_client: Vec<Vec<Samples>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..clients)
            .map(|c| {
                let run = &run;
                scope.spawn(move || {
                    let mut http = Http::new(addr, token);
                    let mut samples: Vec<Samples> =
                        routes.iter().map(|_| Samples::default()).collect();
                    run(c, &mut http, &mut samples);
                    samples
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let wall = t0.elapsed();
    let mut out: Vec<Samples> = routes.iter().map(|_| Samples::default()).collect();
    for samples in per_client {
        for (o, s) in out.iter_mut().zip(samples) {
            o.merge(s);
        }
    }
    (out, wall)
}

fn timed(http: &mut Http, method: &str, path: &str, into: &mut Samples) {
    let t = Instant::now();
    let status = http.request(method, path);
    into.add(t.elapsed(), status);
}

/// The two phases against one coordinator; its rows.
fn measure(
    name: &str,
    c: &Coordinator,
    clients: usize,
    reads: usize,
    drain_limit: Duration,
    rounds: usize,
) -> Vec<Row> {
    let agents = &c.agents;
    let backlog_before = c.backlog();
    let calls_before = c.host_calls();
    let before = Instant::now();
    let (deploy, deploy_wall) = load(
        clients,
        &["POST …/agents/{a}/deploy"],
        |client, http, samples| {
            for _ in 0..rounds {
                for (ns, a) in agents.iter().skip(client).step_by(clients) {
                    timed(
                        http,
                        "POST",
                        &format!("/namespaces/{ns}/agents/{a}/deploy"),
                        &mut samples[0],
                    );
                }
            }
        },
        c.addr,
        &c.token,
    );
    let deploys_sent = Instant::now();
    let backlog_sent = c.backlog();
    const READS: [&str; 3] = [
        "GET …/agents/{a}",
        "GET …/agents/{a}/deployment-status",
        "GET …/agents (100 Agents)",
    ];
    let (read, read_wall) = load(
        clients,
        &READS,
        |client, http, samples| {
            let mut i = client;
            for n in 0..reads.div_ceil(clients) {
                let (ns, a) = &agents[i % agents.len()];
                i += clients * 7 + 1;
                let route = n % READS.len();
                let path = match route {
                    0 => format!("/namespaces/{ns}/agents/{a}"),
                    1 => format!("/namespaces/{ns}/agents/{a}/deployment-status"),
                    _ => format!("/namespaces/{ns}/agents"),
                };
                timed(http, "GET", &path, &mut samples[route]);
            }
        },
        c.addr,
        &c.token,
    );
    let backlog_read = c.backlog();
    let drained = c.drained_at(deploys_sent, drain_limit);
    println!(
        "{name}: backlog (work queued or running) {backlog_before} before the deploys, \
         {backlog_sent} when they were all sent ({:.2} s), {backlog_read} when the reads \
         ended ({:.2} s later); drained {}; deploy work: {}",
        deploy_wall.as_secs_f64(),
        read_wall.as_secs_f64(),
        match drained {
            Some(t) => format!(
                "{:.2} s after the first deploy request ({:.0} deploys/s through the worker)",
                (t - before).as_secs_f64(),
                agents.len() as f64 / (t - before).as_secs_f64().max(1e-9)
            ),
            None => format!(
                "NOT within {} s after the reads (CLAWFLEET_BENCH_DRAIN_SECONDS)",
                drain_limit.as_secs()
            ),
        },
        c.work_counts(),
    );
    if let Some(t) = drained {
        let drain = t.saturating_duration_since(deploys_sent).as_secs_f64();
        let send = deploy_wall.as_secs_f64();
        println!(
            "{name}: {} deploys of {} Agents sent in {send:.2} s; the backlog drained {drain:.2} s \
             after the last was sent ({:.2}× the send time; target ≤ 2×)",
            agents.len() * rounds,
            agents.len(),
            drain / send.max(1e-9)
        );
    }
    let calls_after = c.host_calls();
    println!(
        "{name}: host calls meanwhile: {}",
        calls_after
            .iter()
            .map(|(k, n)| format!("{k} {}", n - calls_before.get(k).copied().unwrap_or(0)))
            .filter(|s| !s.ends_with(" 0"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let read_total: usize = read.iter().map(|s| s.latencies.len()).sum();
    let mut rows = Vec::new();
    for s in deploy {
        rows.push(Row {
            store: name.to_owned(),
            route: "POST …/agents/{a}/deploy",
            phase_requests: s.latencies.len(),
            samples: s,
            wall: deploy_wall,
            rps_target: Some(DEPLOY_RPS_TARGET),
        });
    }
    let mut all_reads = Samples::default();
    for (route, s) in READS.iter().zip(read) {
        let n = s.latencies.len();
        all_reads.merge(Samples {
            latencies: s.latencies.clone(),
            server_errors: s.server_errors,
            other_errors: s.other_errors,
            transport_errors: s.transport_errors,
        });
        rows.push(Row {
            store: name.to_owned(),
            route,
            phase_requests: n,
            samples: s,
            wall: read_wall,
            rps_target: None,
        });
    }
    rows.push(Row {
        store: name.to_owned(),
        route: "all reads",
        phase_requests: read_total,
        samples: all_reads,
        wall: read_wall,
        rps_target: None,
    });
    rows
}

fn main() {
    let agents = knob("CLAWFLEET_BENCH_AGENTS", 1000);
    let drain_limit = Duration::from_secs(knob("CLAWFLEET_BENCH_DRAIN_SECONDS", 15) as u64);
    let reads = knob("CLAWFLEET_BENCH_READS", 6000);
    let clients = knob("CLAWFLEET_BENCH_CLIENTS", 8);
    let churn = knob("CLAWFLEET_BENCH_CHURN_ROUNDS", 5);
    let stores =
        std::env::var("CLAWFLEET_BENCH_STORES").unwrap_or_else(|_| "sqlite,postgres".to_owned());
    println!(
        "api_load: {agents} deploy requests (one per Agent, {AGENTS_PER_NAMESPACE} Agents per \
         Namespace over {HOSTS} hosts of hostd's in-process engine), then {reads} reads, \
         {clients} concurrent HTTP clients (keep-alive), worker running (parallelism {}; \
         while the API is busy {} on SQLite, {} on PostgreSQL)",
        WorkerSettings::default().parallelism,
        yield_parallelism(true),
        yield_parallelism(false)
    );
    let mut rows = Vec::new();
    let mut notes = Vec::new();
    for store in stores.split(',').map(str::trim) {
        match store {
            "sqlite" => {
                let dir = tempfile::tempdir().unwrap();
                let path = dir.path().join("occ.db");
                let c = Coordinator::start(
                    async move {
                        let s = Arc::new(SqliteStore::open(&path).unwrap());
                        (s.clone() as SharedStore, Some(s))
                    },
                    agents,
                );
                println!("sqlite: setup {:.1} s (untimed)", c.setup.as_secs_f64());
                rows.extend(measure("sqlite", &c, clients, reads, drain_limit, 1));
                if churn > 0 {
                    rows.extend(measure(
                        "sqlite churn",
                        &c,
                        clients,
                        reads,
                        drain_limit,
                        churn,
                    ));
                }
                c.stop();
                notes.push(
                    "sqlite: a file in a temporary directory on this machine's disk, WAL, \
                     synchronous=FULL (as occ serve runs it)",
                );
            }
            "postgres" => {
                if let Some(reason) = clawfleet_pg_tests::skip_reason() {
                    println!("skipped PostgreSQL: {reason}");
                    continue;
                }
                let pg = match TestPostgres::start() {
                    Ok(pg) => pg,
                    Err(e) => {
                        println!("skipped PostgreSQL: the test server did not start: {e}");
                        continue;
                    }
                };
                pg.create_role("bench", None).unwrap();
                pg.create_database_owned_by("bench", "bench").unwrap();
                let url = pg.url("bench", "bench");
                let Database::Postgres(settings) =
                    Database::parse_url(&url, &PostgresOptions::default(), None).unwrap()
                else {
                    unreachable!("a postgres:// URL")
                };
                let c = Coordinator::start(
                    async move {
                        let s = PostgresStore::connect(settings).await.unwrap();
                        (Arc::new(s) as SharedStore, None)
                    },
                    agents,
                );
                println!(
                    "postgres: setup {:.1} s (untimed), server {}",
                    c.setup.as_secs_f64(),
                    pg.version()
                );
                rows.extend(measure("postgres", &c, clients, reads, drain_limit, 1));
                if churn > 0 {
                    rows.extend(measure(
                        "postgres churn",
                        &c,
                        clients,
                        reads,
                        drain_limit,
                        churn,
                    ));
                }
                c.stop();
                drop(pg);
                notes.push(
                    "postgres: the throwaway test server of clawfleet-pg-tests on loopback TCP \
                     (fsync=off, data on tmpfs), the coordinator's default pool of 16 connections",
                );
            }
            other => {
                println!("unknown store {other:?} in CLAWFLEET_BENCH_STORES (sqlite, postgres)")
            }
        }
    }
    println!();
    print_rows(&rows);
    for n in notes {
        println!("  {n}");
    }
    println!(
        "  simulated hosts: hostd's engine over its fake privileged layer, in process, state {}",
        sim_hosts_dir().map_or_else(
            || "in the temporary directory (no /dev/shm)".to_owned(),
            |d| format!("on tmpfs ({})", d.display())
        )
    );
    println!(
        "  req/s: requests of the phase / its wall time; reads are one phase of three routes, \
         so their rows share one req/s. 5xx counts transport errors too. Clients, API, worker \
         and hostd's engine share this machine's {} cores.",
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
}
