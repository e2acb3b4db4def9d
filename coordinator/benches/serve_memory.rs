//! Benchmark (not a timed test): the resident memory of the real `occ serve` process holding
//! 10,000 Agents while 8 clients page through the Namespace's Agent list, the case of the
//! performance issue (unpaged, 8 list clients took `occ serve` from 29 MB to 180 MB).
//!
//! The server is this build's `occ` binary, started as an operator starts it (`occ init`, then
//! `occ serve` on a SQLite file in its state directory); the database is filled beforehand
//! through the coordinator's own service layer (one pool host, one Namespace of N Agents, none
//! deployed, so the worker stays idle). The clients are OS threads with one keep-alive
//! connection each (`bench_http`), each walking the whole list page by page by its
//! `X-Next-Cursor`, round after round. `VmRSS` of the server is sampled every 20 ms from
//! `/proc`; its `VmHWM` (peak) is read at the end. It prints the idle and peak RSS against the
//! target (≤ 64 MB), the list pages' latency and the bytes of one whole list.
//!
//! `cargo bench -p clawfleet-coordinator --bench serve_memory`. Knobs:
//! `CLAWFLEET_BENCH_AGENTS` (default 10000), `CLAWFLEET_BENCH_CLIENTS` (8),
//! `CLAWFLEET_BENCH_ROUNDS` (whole lists per client, 10), `CLAWFLEET_BENCH_PAGE` (the `limit`
//! of each page; unset: the route's default).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod bench_http;
mod bench_setup;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use bench_http::Http;
use coordinator::service::{NewAgent, NewNamespace, Service};
use coordinator::store::SharedStore;
use coordinator::store::database::Database;
use coordinator::store::sqlite::SqliteStore;
use serde_json::json;

/// The target of the performance issue.
const RSS_TARGET_MB: f64 = 64.0;
const NS: &str = "fleet";

fn knob(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|n| *n > 0)
        .unwrap_or(default)
}

/// A `/proc/<pid>/status` field in MB (the kernel gives kB).
fn status_mb(pid: u32, field: &str) -> Option<f64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = text.lines().find(|l| l.starts_with(field))?;
    let kb: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb / 1024.0)
}

fn quantile_ms(sorted: &[Duration], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    sorted[((sorted.len() - 1) as f64 * q).round() as usize].as_secs_f64() * 1000.0
}

/// Fills the database `occ serve` will open: a token, one host, one Namespace of `agents`.
async fn populate(db: &Path, agents: usize) -> String {
    let store: SharedStore = Arc::new(SqliteStore::open(db).unwrap());
    let token = bench_setup::admin_token(&store).await;
    let service = Service::new(store.clone());
    // Nothing listens on port 1: a probe by the drift sweep fails at once and nothing leaves
    // loopback.
    bench_setup::enrol_hosts(&service, &["h1".to_owned()], 1).await;
    service
        .create_namespace(
            "bench",
            NewNamespace {
                id: NS.into(),
                name: None,
                hosts: vec!["h1".into()],
                cluster: None,
                single_tenant: false,
            },
            true,
        )
        .await
        .unwrap();
    service
        .put_configuration("bench", NS, "cfg", json!({}), true)
        .await
        .unwrap();
    for i in 0..agents {
        service
            .create_agent(
                "bench",
                NS,
                NewAgent {
                    id: format!("agent-{i:05}"),
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
    }
    token
}

/// The server under test, killed (by its own pid) when dropped.
struct Serve(Child);

impl Drop for Serve {
    fn drop(&mut self) {
        if let Err(e) = self.0.kill() {
            eprintln!("stopping occ serve (pid {}): {e}", self.0.id());
        }
        if let Err(e) = self.0.wait() {
            eprintln!("waiting for occ serve (pid {}): {e}", self.0.id());
        }
    }
}

/// One client's walk through the whole list: pages fetched, their latencies, bytes.
fn walk(http: &mut Http, page: Option<usize>, latencies: &mut Vec<Duration>) -> (usize, usize) {
    let mut cursor: Option<String> = None;
    let (mut agents_bytes, mut pages) = (0, 0);
    loop {
        let mut query: Vec<(&str, String)> = Vec::new();
        if let Some(c) = &cursor {
            query.push(("cursor", c.clone()));
        }
        if let Some(n) = page {
            query.push(("limit", n.to_string()));
        }
        let q = serde_urlencoded::to_string(&query).unwrap();
        let path = format!("/namespaces/{NS}/agents?{q}");
        let t = Instant::now();
        let answer = http.answer("GET", &path).unwrap();
        latencies.push(t.elapsed());
        assert_eq!(answer.status, 200, "GET {path}");
        agents_bytes += answer.body_bytes;
        pages += 1;
        match answer.next_cursor {
            Some(next) => cursor = Some(next),
            None => return (pages, agents_bytes),
        }
    }
}

fn main() {
    let agents = knob("CLAWFLEET_BENCH_AGENTS", 10_000);
    let clients = knob("CLAWFLEET_BENCH_CLIENTS", 8);
    let rounds = knob("CLAWFLEET_BENCH_ROUNDS", 10);
    let page = std::env::var("CLAWFLEET_BENCH_PAGE")
        .ok()
        .and_then(|v| v.parse().ok());

    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let config = dir.path().join("occ.toml");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    std::fs::write(
        &config,
        format!(
            "listen = \"127.0.0.1:{port}\"\nstate_dir = \"{}\"\n",
            state.display()
        ),
    )
    .unwrap();
    let occ = |args: &[&str]| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_occ"));
        cmd.arg("--config").arg(&config).args(args);
        cmd
    };
    let init = occ(&["init"]).stdin(Stdio::null()).output().unwrap();
    assert!(init.status.success(), "occ init: {init:?}");

    let t = Instant::now();
    let Database::Sqlite(db) = Database::sqlite_in(&state) else {
        unreachable!("sqlite_in names a SQLite file")
    };
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let token = runtime.block_on(populate(&db, agents));
    drop(runtime);
    println!(
        "setup: {agents} Agents in Namespace {NS} in {:.1} s (untimed)",
        t.elapsed().as_secs_f64()
    );

    let serve = Serve(
        occ(&["serve"])
            .env("OCC_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let pid = serve.0.id();
    let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let ready = Instant::now();
    while std::net::TcpStream::connect(addr).is_err() {
        assert!(
            ready.elapsed() < Duration::from_secs(30),
            "occ serve did not listen on {addr} within 30 s"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // One list to warm the server's pools and caches, then the idle figure.
    let mut warm = Http::new(addr, &token);
    let (pages, list_bytes) = walk(&mut warm, page, &mut Vec::new());
    std::thread::sleep(Duration::from_secs(2));
    let idle = status_mb(pid, "VmRSS:").unwrap_or(0.0);

    let done = AtomicBool::new(false);
    let t = Instant::now();
    let (latencies, peak_sampled) = std::thread::scope(|scope| {
        let sampler = scope.spawn(|| {
            let mut peak: f64 = 0.0;
            while !done.load(Ordering::Relaxed) {
                peak = peak.max(status_mb(pid, "VmRSS:").unwrap_or(0.0));
                std::thread::sleep(Duration::from_millis(20));
            }
            peak
        });
        let handles: Vec<_> = (0..clients)
            .map(|_| {
                let token = &token;
                scope.spawn(move || {
                    let mut http = Http::new(addr, token);
                    let mut latencies = Vec::new();
                    for _ in 0..rounds {
                        walk(&mut http, page, &mut latencies);
                    }
                    latencies
                })
            })
            .collect();
        let mut all: Vec<Duration> = handles
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect();
        done.store(true, Ordering::Relaxed);
        all.sort();
        (all, sampler.join().unwrap())
    });
    let wall = t.elapsed();
    let hwm = status_mb(pid, "VmHWM:").unwrap_or(0.0);
    std::thread::sleep(Duration::from_secs(2));
    let after = status_mb(pid, "VmRSS:").unwrap_or(0.0);
    drop(serve);

    println!(
        "list: {pages} pages of {} per whole list of {agents} Agents, {:.2} MB per whole list",
        page.map_or_else(|| "the default size".to_owned(), |n| n.to_string()),
        list_bytes as f64 / 1e6
    );
    println!(
        "load: {clients} clients x {rounds} whole lists = {} pages in {:.1} s ({:.0} pages/s); \
         page p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
        latencies.len(),
        wall.as_secs_f64(),
        latencies.len() as f64 / wall.as_secs_f64(),
        quantile_ms(&latencies, 0.5),
        quantile_ms(&latencies, 0.99),
        quantile_ms(&latencies, 1.0),
    );
    let verdict = if hwm <= RSS_TARGET_MB {
        "met"
    } else {
        "MISSED"
    };
    println!(
        "occ serve RSS: idle {idle:.1} MB, peak under load {peak_sampled:.1} MB sampled / \
         {hwm:.1} MB VmHWM, {after:.1} MB 2 s after; target <= {RSS_TARGET_MB:.0} MB: {verdict}"
    );
}
