//! Benchmark (not a timed test): the web console at fleet size. 10,000 Agents in 50
//! Namespaces over 500 simulated hosts, in SQLite (a file in a temporary directory, as `occ
//! serve` runs it), with a drift finding for most Agents (synced, some drifted, converging,
//! the Agents of 10 hosts unreachable, 2% never observed). The console and the API are served
//! over loopback HTTP by the same router and connection setup as `occ serve`
//! (`coordinator::console::with_api`, `coordinator::api::serve`); one client on a keep-alive
//! connection signs in and then times each page: the time to the answer's first byte and to
//! its end, and its size.
//!
//! It prints, per page, p50/p95/max of the first byte and the whole answer, and the HTML
//! size, beside issue 32's targets (overview first byte p95 ≤ 150 ms and ≤ 200 KB; filtered
//! and paginated lists p95 ≤ 50 ms), and the script's size gzipped (≤ 60 KB).
//!
//! `cargo bench -p clawfleet-coordinator --bench console`. Knobs: `CLAWFLEET_BENCH_AGENTS`
//! (default 10000), `CLAWFLEET_BENCH_HOSTS` (default 500), `CLAWFLEET_BENCH_ROUNDS`
//! (requests per page, default 100).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod bench_setup;
#[path = "../tests/hostd_engine/mod.rs"]
mod hostd_engine;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use coordinator::api::AppState;
use coordinator::config::ApiSettings;
use coordinator::console::ConsoleSettings;
use coordinator::model::{DriftRow, DriftState};
use coordinator::service::{NewAgent, NewNamespace, Service};
use coordinator::store::SharedStore;
use coordinator::store::sqlite::SqliteStore;
use hostd_engine::EngineBackend;
use serde_json::json;

/// Hosts in each Namespace's pool.
const POOL: usize = 10;
/// Namespaces.
const NAMESPACES: usize = 50;

fn knob(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Hosts, Namespaces over pools of [`POOL`] of them, the Agents, and drift findings.
async fn populate(store: &SharedStore, agents: usize, hosts: usize) -> String {
    let token = bench_setup::admin_token(store).await;
    let service = Service::new(store.clone());
    let names: Vec<String> = (0..hosts).map(|i| format!("h{i:03}")).collect();
    bench_setup::enrol_hosts(&service, &names, 22).await;
    let per_ns = agents.div_ceil(NAMESPACES);
    let now = coordinator::clock::now_seconds();
    let mut rows: std::collections::BTreeMap<String, Vec<DriftRow>> = Default::default();
    for n in 0..NAMESPACES {
        let ns = format!("ns{n:02}");
        let pool: Vec<String> = (0..POOL)
            .map(|k| names[(n * POOL + k) % hosts].clone())
            .collect();
        service
            .create_namespace(
                "bench",
                NewNamespace {
                    id: ns.clone(),
                    name: None,
                    hosts: pool.clone(),
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
        for i in 0..per_ns.min(agents - n * per_ns) {
            let id = format!("a{i:04}");
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
            let host = &pool[i % POOL];
            let host_index = (n * POOL + i % POOL) % hosts;
            let (state, reason) = if host_index < 10 {
                (DriftState::Unreachable, None)
            } else if i % 50 == 7 {
                continue; // never observed
            } else if i % 50 == 3 {
                (
                    DriftState::Drift,
                    Some(coordinator::model::DriftReason::UnitNotRunning),
                )
            } else if i % 50 == 5 {
                (DriftState::Converging, None)
            } else {
                (DriftState::Synced, None)
            };
            rows.entry(host.clone()).or_default().push(DriftRow {
                target: host.clone(),
                namespace_id: ns.clone(),
                agent_id: id,
                state,
                reason,
                message: String::new(),
                checked_at: now,
            });
        }
    }
    for (host, rows) in rows {
        store.replace_drift(&host, &rows).await.unwrap();
    }
    token
}

/// One keep-alive connection with the console's session cookie.
struct Client {
    conn: BufReader<TcpStream>,
    cookie: String,
}

/// One answer: the time to its first byte, to its end, its status and size.
struct Timed {
    first: Duration,
    whole: Duration,
    status: u16,
    bytes: usize,
}

impl Client {
    fn new(addr: SocketAddr, token: &str) -> Self {
        let s = TcpStream::connect(addr).unwrap();
        s.set_nodelay(true).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        Client {
            conn: BufReader::new(s),
            cookie: format!("occ_console={token}"),
        }
    }

    fn get(&mut self, path: &str) -> Timed {
        let start = Instant::now();
        write!(
            self.conn.get_mut(),
            "GET {path} HTTP/1.1\r\nHost: bench\r\nCookie: {}\r\n\r\n",
            self.cookie
        )
        .unwrap();
        self.conn.get_mut().flush().unwrap();
        let mut line = String::new();
        self.conn.read_line(&mut line).unwrap();
        let first = start.elapsed();
        let status: u16 = line.get(9..12).and_then(|s| s.parse().ok()).unwrap_or(0);
        let mut length = 0usize;
        loop {
            line.clear();
            self.conn.read_line(&mut line).unwrap();
            if line == "\r\n" {
                break;
            }
            if let Some((k, v)) = line.split_once(':')
                && k.eq_ignore_ascii_case("content-length")
            {
                length = v.trim().parse().unwrap();
            }
        }
        let mut body = vec![0u8; length];
        self.conn.read_exact(&mut body).unwrap();
        Timed {
            first,
            whole: start.elapsed(),
            status,
            bytes: length,
        }
    }
}

/// A page's target: first byte p95 in ms, and its most bytes (0: no size target).
type Target = Option<(f64, usize)>;

fn pct(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn ms(d: Duration) -> String {
    format!("{:.1}", d.as_secs_f64() * 1000.0)
}

fn main() {
    let agents = knob("CLAWFLEET_BENCH_AGENTS", 10_000);
    let hosts = knob("CLAWFLEET_BENCH_HOSTS", 500);
    let rounds = knob("CLAWFLEET_BENCH_ROUNDS", 100);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let store: SharedStore = Arc::new(SqliteStore::open(&dir.path().join("occ.db")).unwrap());
    let setup = Instant::now();
    let token = rt.block_on(populate(&store, agents, hosts));
    println!(
        "console bench: {agents} Agents, {NAMESPACES} Namespaces, {hosts} hosts, SQLite; setup {:.1} s",
        setup.elapsed().as_secs_f64()
    );
    let state = Arc::new(AppState {
        foreground: Default::default(),
        service: Service::new(store.clone()),
        backend: Arc::new(EngineBackend::new()),
    });
    let settings = ApiSettings::default();
    let router = coordinator::console::with_api(state, ConsoleSettings::default(), &settings);
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let addr = listener.local_addr().unwrap();
    rt.spawn(async move {
        coordinator::api::serve(listener, router, &settings, std::future::pending()).await
    });
    let mut client = Client::new(addr, &token);
    let pages: &[(&str, String, Target)] = &[
        ("overview", "/console".into(), Some((150.0, 200 * 1024))),
        (
            "namespace, first page",
            "/console/namespaces/ns07".into(),
            Some((50.0, 0)),
        ),
        (
            "namespace, next page",
            "/console/namespaces/ns07?after=a0099".into(),
            Some((50.0, 0)),
        ),
        (
            "namespace, filtered (drift)",
            "/console/namespaces/ns07?state=drift".into(),
            Some((50.0, 0)),
        ),
        (
            "namespace, filtered (unknown)",
            "/console/namespaces/ns07?state=unknown".into(),
            Some((50.0, 0)),
        ),
        (
            "hosts, first page",
            "/console/hosts".into(),
            Some((50.0, 0)),
        ),
        (
            "hosts, next page",
            "/console/hosts?after=h099".into(),
            Some((50.0, 0)),
        ),
        (
            "audit (100 newest)",
            "/console/audit".into(),
            Some((50.0, 0)),
        ),
        (
            "agent",
            "/console/namespaces/ns07/agents/a0001".into(),
            None,
        ),
    ];
    println!(
        "{:<30} {:>9} {:>9} {:>9} {:>10} {:>9} {:>10}  target",
        "page", "first p50", "first p95", "first max", "whole p95", "KB", "status"
    );
    for (name, path, target) in pages {
        // One warm-up request (the first query of each kind prepares its statements).
        client.get(path);
        let mut first = Vec::with_capacity(rounds);
        let mut whole = Vec::with_capacity(rounds);
        let mut bytes = 0;
        let mut status = 0;
        for _ in 0..rounds {
            let t = client.get(path);
            first.push(t.first);
            whole.push(t.whole);
            bytes = t.bytes;
            status = t.status;
        }
        first.sort();
        whole.sort();
        let target = match target {
            Some((p95, 0)) => format!("first byte p95 ≤ {p95} ms"),
            Some((p95, size)) => format!("first byte p95 ≤ {p95} ms, ≤ {} KB", size / 1024),
            None => String::new(),
        };
        println!(
            "{:<30} {:>9} {:>9} {:>9} {:>10} {:>9.1} {:>10}  {target}",
            name,
            ms(pct(&first, 0.5)),
            ms(pct(&first, 0.95)),
            ms(first[first.len() - 1]),
            ms(pct(&whole, 0.95)),
            bytes as f64 / 1024.0,
            status,
        );
    }
    let script = include_bytes!("../src/console/assets/console.js");
    let style = include_bytes!("../src/console/assets/console.css");
    for (name, bytes) in [("console.js", &script[..]), ("console.css", &style[..])] {
        let gz = gzip_len(bytes);
        println!(
            "{name}: {} bytes, {} bytes gzipped -9{}",
            bytes.len(),
            gz.map_or("?".into(), |n| n.to_string()),
            if name.ends_with(".js") {
                " (target ≤ 60 KB gzipped)"
            } else {
                ""
            }
        );
    }
}

/// The size of `bytes` gzipped by the system's gzip -9, if it runs.
fn gzip_len(bytes: &[u8]) -> Option<usize> {
    let mut child = std::process::Command::new("gzip")
        .arg("-9c")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .ok()?;
    child.stdin.take()?.write_all(bytes).ok()?;
    let out = child.wait_with_output().ok()?;
    Some(out.stdout.len())
}
