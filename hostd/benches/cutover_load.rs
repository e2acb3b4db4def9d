//! Cutovers under load on a real test host (printed figures, not a timed test; issue 28).
//!
//! Two hosts, the same load: an Agent running the test gateway, HTTP clients at
//! `HOSTD_BENCH_RATE` requests per second (default 500: a new connection each, `GET /readyz`,
//! from the runner inside the test host's network namespace, so they go to the host's
//! `127.0.0.1:<port>` like a local client's) and `HOSTD_BENCH_WS` WebSocket clients (default
//! 50, the test gateway's `hold`, on the host), through `HOSTD_BENCH_CUTOVERS` restart-class
//! cutovers (default 20; each a new revision whose configuration differs).
//!
//! - **before**: a host that refuses hostd network namespaces (no CAP_NET_ADMIN): the gateway
//!   listens on the host's port itself, as every hostd before issue 28 did.
//! - **after**: a host with them: the port is held by PID 1 and the Agent's front joins each
//!   connection to the gateway in its namespace, holding new ones during a cutover.
//!
//! For each: requests answered 200, refused (connection refused), failed otherwise (reset,
//! 503, timeout), the request latency p50/p99 outside cutovers, and the WebSocket clients the
//! cutovers disconnected, with their close codes. After: the front's added latency p50
//! (`curl` 300 times through the port, and 300 times straight to the gateway inside the
//! Agent's namespace).
//!
//! `cargo bench -p clawfleet-hostd --bench cutover_load`. Needs root and the test-host runner
//! packages; otherwise prints `SKIP: ...` and exits 0.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../tests/hosts_support/mod.rs"]
mod hosts_support;

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use clawfleet_protocol::operation::*;
use clawfleet_protocol::result::OperationResult;
use clawfleet_vm_tests::{HostOptions, TestHost};
use hosts_support::*;
use serde_json::json;

const THREADS: u32 = 16;

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[derive(Debug, Default)]
struct Tally {
    ok: u64,
    refused: u64,
    failed: u64,
    /// Latencies (µs) of the answered requests.
    latencies: Vec<u64>,
}

/// One request: a new connection, `GET /readyz`, the status line.
fn request(port: u16) -> Result<u64, bool> {
    let t = Instant::now();
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let mut s = match TcpStream::connect_timeout(&addr, Duration::from_secs(5)) {
        Ok(s) => s,
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => return Err(true),
        Err(_) => return Err(false),
    };
    s.set_read_timeout(Some(Duration::from_secs(60))).ok();
    if s.write_all(b"GET /readyz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        .is_err()
    {
        return Err(false);
    }
    let mut buf = [0u8; 64];
    let mut got = 0;
    while got < 12 {
        match s.read(&mut buf[got..]) {
            Ok(0) | Err(_) => return Err(false),
            Ok(n) => got += n,
        }
    }
    if buf.starts_with(b"HTTP/1.1 200") {
        Ok(t.elapsed().as_micros() as u64)
    } else {
        Err(false)
    }
}

/// Runs the load in the test host's network namespace until `stop`.
fn load(
    host: &TestHost,
    port: u16,
    rate: u64,
    stop: Arc<AtomicBool>,
) -> Vec<std::thread::JoinHandle<Tally>> {
    let netns = format!("/run/netns/{}", host.record().netns);
    let interval = Duration::from_nanos(1_000_000_000 * u64::from(THREADS) / rate.max(1));
    (0..THREADS)
        .map(|i| {
            let netns = netns.clone();
            let stop = Arc::clone(&stop);
            std::thread::spawn(move || {
                let f = std::fs::File::open(&netns).unwrap();
                nix::sched::setns(&f, nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
                let mut tally = Tally::default();
                let mut next = Instant::now() + interval * i / THREADS;
                while !stop.load(Ordering::SeqCst) {
                    let now = Instant::now();
                    if next > now {
                        std::thread::sleep(next - now);
                    }
                    next += interval;
                    match request(port) {
                        Ok(us) => {
                            tally.ok += 1;
                            tally.latencies.push(us);
                        }
                        Err(true) => tally.refused += 1,
                        Err(false) => tally.failed += 1,
                    }
                }
                tally
            })
        })
        .collect()
}

fn percentile(sorted: &[u64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i] as f64 / 1000.0
}

fn port_of(r: &OperationResult) -> u16 {
    match r {
        OperationResult::PrepareRevision(p) => p.observation.port.unwrap(),
        other => panic!("{other:?}"),
    }
}

/// `curl` `n` times, p50 of time_total in ms; `netns` runs it in the Agent's namespace.
fn curl_p50(host: &TestHost, port: u16, netns: Option<&str>, n: u32) -> f64 {
    let script = format!(
        "for i in $(seq {n}); do curl -s -o /dev/null -w '%{{time_total}}\\n' http://127.0.0.1:{port}/readyz; done\n"
    );
    host.write_file("/root/cf-latency.sh", script.as_bytes(), 0o755)
        .unwrap();
    let cmd = match netns {
        Some(ns) => format!("ip netns exec {ns} sh /root/cf-latency.sh"),
        None => "sh /root/cf-latency.sh".to_owned(),
    };
    let out = host.run_ok(&cmd).unwrap();
    let mut v: Vec<f64> = out.lines().filter_map(|l| l.trim().parse().ok()).collect();
    v.sort_by(|a, b| a.total_cmp(b));
    v.get(v.len() / 2).copied().unwrap_or(0.0) * 1000.0
}

fn scenario(name: &str, options: &HostOptions, rate: u64, ws: u64, cutovers: u64) {
    let occ = Coordinator::new();
    let host = host_with_hostd_options(&occ, "[network]\nhold_ms = 30000\n", options);
    let isolation = match occ.ok(&host, Operation::Probe(ProbeArgs {})) {
        OperationResult::Probe(p) => p.network_isolation.unwrap_or_default(),
        other => panic!("{other:?}"),
    };
    occ.ok(&host, ensure("ns1"));
    let r1 = spec("rev-1", 1, json!({"label": "rev-1"}));
    let port = port_of(&occ.ok(&host, prepare("ns1", "a1", &r1)));
    occ.ok(
        &host,
        Operation::ActivateRevision(ActivateArgs::from(rargs("ns1", "a1", &r1))),
    );
    let paths = hostd::layout::Layout::new("/var/lib/clawfleet", "/etc/systemd/system")
        .agent(&id("ns1"), &id("a1"));
    // Steady state first: latency outside cutovers.
    let stop = Arc::new(AtomicBool::new(false));
    let threads = load(&host, port, rate, Arc::clone(&stop));
    std::thread::sleep(Duration::from_secs(3));
    stop.store(true, Ordering::SeqCst);
    let mut steady: Vec<u64> = Vec::new();
    for t in threads {
        steady.extend(t.join().unwrap().latencies);
    }
    steady.sort_unstable();

    host.run_ok(&format!(
        "rm -f /tmp/cf-hold-stop /tmp/cf-hold-details.json; systemd-run --unit cf-hold /usr/local/bin/clawfleet-test-gateway hold {port} {} {ws} /tmp/cf-hold-stop 900 /tmp/cf-hold-details.json; sleep 2",
        paths.password_file.display()
    ))
    .unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let t0 = Instant::now();
    let threads = load(&host, port, rate, Arc::clone(&stop));
    let mut cut_ms = Vec::new();
    let mut began_unix_ms = Vec::new();
    for n in 2..=cutovers + 1 {
        let rev = spec(&format!("rev-{n}"), n, json!({"label": format!("rev-{n}")}));
        occ.ok(&host, prepare("ns1", "a1", &rev));
        let t = Instant::now();
        began_unix_ms.push(unix_ms());
        occ.ok(
            &host,
            Operation::ActivateRevision(ActivateArgs::from(rargs("ns1", "a1", &rev))),
        );
        cut_ms.push(t.elapsed().as_millis());
        // systemd's default start limit is not in the way (StartLimitIntervalSec=0), but
        // clients get a moment between two cutovers.
        std::thread::sleep(Duration::from_millis(300));
    }
    std::thread::sleep(Duration::from_secs(1));
    stop.store(true, Ordering::SeqCst);
    let elapsed = t0.elapsed();
    let mut total = Tally::default();
    for t in threads {
        let tally = t.join().unwrap();
        total.ok += tally.ok;
        total.refused += tally.refused;
        total.failed += tally.failed;
    }
    host.run_ok("touch /tmp/cf-hold-stop; sleep 1").unwrap();
    let hold = host
        .run_ok("journalctl -u cf-hold -o cat --no-pager | grep '^{' | tail -1")
        .unwrap();
    cut_ms.sort_unstable();
    // Each reconnection against the start of the cutover that caused it (the latest before
    // it): an upper bound of "reconnected after the new gateway was ready".
    let details = host
        .run_ok("cat /tmp/cf-hold-details.json")
        .unwrap_or_default();
    let reconnected: Vec<u64> = serde_json::from_str(details.trim()).unwrap_or_default();
    let mut after_begin: Vec<u64> = reconnected
        .iter()
        .filter_map(|&at| {
            let began = began_unix_ms.iter().rev().find(|&&b| b <= at)?;
            // In microseconds, as `percentile` takes them.
            Some((at - began) * 1000)
        })
        .collect();
    after_begin.sort_unstable();
    println!(
        "{name}: networkIsolation {isolation:?}\n  {cutovers} cutovers (median {} ms) in {:.1} s at {rate} req/s target: {} requests, {} answered 200, {} refused, {} failed otherwise ({:.0} req/s achieved)\n  steady latency p50 {:.2} ms p99 {:.2} ms\n  {ws} WebSocket clients: {}",
        cut_ms[cut_ms.len() / 2],
        elapsed.as_secs_f64(),
        total.ok + total.refused + total.failed,
        total.ok,
        total.refused,
        total.failed,
        (total.ok + total.refused + total.failed) as f64 / elapsed.as_secs_f64(),
        percentile(&steady, 0.5),
        percentile(&steady, 0.99),
        hold.trim()
    );
    if !after_begin.is_empty() {
        println!(
            "  WebSocket reconnections after their cutover began: {} (p50 {:.0} ms, p95 {:.0} ms, max {} ms)",
            after_begin.len(),
            percentile(&after_begin, 0.5),
            percentile(&after_begin, 0.95),
            after_begin[after_begin.len() - 1] / 1000
        );
    }
    if isolation == hostd::engine::NAMESPACES {
        let netns = hostd::netns::name_for_unit(&paths.unit_name);
        let front = curl_p50(&host, port, None, 300);
        let direct = curl_p50(&host, port, Some(&netns), 300);
        println!(
            "  front's added latency p50: {:.3} ms (curl through the port {front:.3} ms, straight to the gateway {direct:.3} ms)",
            front - direct
        );
    }
}

fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

fn main() {
    if let Some(reason) = clawfleet_vm_tests::skip_reason() {
        println!("SKIP: {reason}");
        return;
    }
    let rate = env_or("HOSTD_BENCH_RATE", 500);
    let ws = env_or("HOSTD_BENCH_WS", 50);
    let cutovers = env_or("HOSTD_BENCH_CUTOVERS", 20);
    scenario(
        "before (the gateway on the host's port)",
        &HostOptions {
            no_net_admin: true,
            ..Default::default()
        },
        rate,
        ws,
        cutovers,
    );
    scenario(
        "after (the port held by the host, the gateway in its namespace)",
        &HostOptions::default(),
        rate,
        ws,
        cutovers,
    );
}
