//! Transport benchmark (not a timed test): per-operation latency of `probe` and of an
//! idempotent `prepare-revision` against ONE real test host with hostd enrolled, sent
//!
//! - over the SSH backend's persistent `hostd serve` session (the default),
//! - over the SSH backend with a new session channel and a new `hostd serve` per operation
//!   (the backend before persistent sessions: `session_max_age` of 1 ns),
//! - through the coordinator's HTTP API (`POST /hosts/{host}/probe`; probe only: no route
//!   sends a bare prepare), `occ serve` running as a child process, and
//! - the peer's way: a NEW `ssh` process per operation (BatchMode, the envelope frame on
//!   stdin, the Result frame read from stdout),
//!
//! printed side by side (median and p90, milliseconds), the transports alternating. It then
//! prints hostd's own time per operation from the host's journal (from hostd's "operation
//! received" to its "operation succeeded" entry, journald's receive timestamps), for
//! operations on a long-lived hostd and on one started for the operation. Last, the same
//! host aged as by long use (100 Agents, its journal at its 10,000-entry limit): the
//! persistent session's probe, idempotent prepare and fenced prepare (the worker's) again.
//!
//! Run: `cargo bench -p clawfleet-coordinator --bench transport` as root with the vm-tests
//! runner packages; prints SKIP otherwise. `BENCH_ITERATIONS` (default 50) and
//! `BENCH_WARMUP` (default 5) tune the runs.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

#[path = "../../hostd/benches/aged_journal/mod.rs"]
mod aged_journal;
#[path = "../tests/ssh_support/mod.rs"]
mod ssh_support;

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use clawfleet_protocol::framing::{FrameDecoder, write_frame};
use clawfleet_protocol::result::{OperationResult, Outcome};
use clawfleet_protocol::{
    Envelope, Fingerprint, HostName, Limits, Message, Operation, OperationId, PROTOCOL_VERSION,
    SignedEnvelope, Target,
};
use clawfleet_vm_tests::TestHost;
use coordinator::backend::{Backend, CallOptions};
use coordinator::client::Client;
use coordinator::ssh::SshSettings;
use serde_json::Value;
use ssh_support::*;

/// The long-lived host's extra Agents (100 with the bench's own) and its journal's entries
/// (the default limit).
const AGED_AGENTS: usize = 99;
const AGED_JOURNAL: usize = 10_000;

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn now_unix() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// The peer's transport: one `ssh` process per operation.
struct PeerSsh<'a> {
    host: &'a TestHost,
    keys: &'a Keys,
    dir: tempfile::TempDir,
    counter: u32,
}

impl<'a> PeerSsh<'a> {
    fn new(host: &'a TestHost, keys: &'a Keys) -> Self {
        let dir = tempfile::tempdir().unwrap();
        keys.write_login_key(&dir.path().join("login"));
        std::fs::write(
            dir.path().join("known_hosts"),
            format!("{} {}\n", host.address(), host.host_public_key().trim()),
        )
        .unwrap();
        Self {
            host,
            keys,
            dir,
            counter: 0,
        }
    }

    fn sign(&mut self, operation: Operation) -> SignedEnvelope {
        self.counter += 1;
        let now = now_unix();
        let envelope = Envelope {
            version: PROTOCOL_VERSION,
            operation_id: OperationId::new(format!(
                "peer-{}-{}-{}",
                std::process::id(),
                now,
                self.counter
            ))
            .unwrap(),
            target: Target {
                host: HostName::new(self.host.name()).unwrap(),
                host_key: Fingerprint::new(self.host.host_key_fingerprint()).unwrap(),
            },
            issuer: self.keys.principal.clone(),
            issued_at: now,
            expires_at: now + 600,
            deadline_seconds: 190,
            fence: None,
            operation,
        };
        SignedEnvelope::sign(&envelope, &self.keys.signing).unwrap()
    }

    /// One operation: sign, spawn ssh, write the frame, read until the Result frame.
    fn call(&mut self, operation: Operation) -> OperationResult {
        let kind = operation.kind();
        let signed = self.sign(operation);
        let d = self.dir.path();
        let mut child = Command::new("ssh")
            .args(["-F", "/dev/null", "-i"])
            .arg(d.join("login"))
            .args([
                "-o",
                "BatchMode=yes",
                "-o",
                "IdentitiesOnly=yes",
                "-o",
                "StrictHostKeyChecking=yes",
                "-o",
                "LogLevel=ERROR",
                "-o",
                "ConnectTimeout=10",
            ])
            .arg("-o")
            .arg(format!(
                "UserKnownHostsFile={}",
                d.join("known_hosts").display()
            ))
            .arg(format!("root@{}", self.host.address()))
            .arg("hostd serve")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut stdin = child.stdin.take().unwrap();
        let frame = Message::Envelope(signed).to_frame().unwrap();
        write_frame(&mut stdin, &frame, Limits::default().max_frame).unwrap();
        stdin.flush().unwrap();
        drop(stdin);
        let mut stdout = child.stdout.take().unwrap();
        let mut dec = FrameDecoder::new(Limits::default().max_frame);
        let mut buf = [0u8; 8192];
        let result = 'read: loop {
            let n = stdout.read(&mut buf).unwrap();
            assert!(n > 0, "ssh ended before the result");
            dec.push(&buf[..n]);
            while let Some(frame) = dec.next_frame().unwrap() {
                if let Message::Result(r) = Message::from_frame(&frame, &Limits::default()).unwrap()
                {
                    break 'read r;
                }
            }
        };
        let _ = child.wait();
        match result.outcome {
            Outcome::Succeeded { result } => {
                assert_eq!(result.kind(), kind);
                result
            }
            Outcome::Failed { failure } => panic!("{kind} failed over ssh: {failure}"),
        }
    }
}

/// `occ serve` with the host enrolled, for the API column.
struct Occ {
    child: Child,
    api: Client,
    _dir: tempfile::TempDir,
}

impl Occ {
    fn start(host: &TestHost) -> Occ {
        let bin = env!("CARGO_BIN_EXE_occ");
        let dir = tempfile::Builder::new()
            .prefix("occ-transport-bench-")
            .tempdir()
            .unwrap();
        let port = free_port();
        let config = dir.path().join("occ.toml");
        std::fs::write(
            &config,
            format!(
                "listen = \"127.0.0.1:{port}\"\nstate_dir = \"{}\"\n",
                dir.path().join("state").display()
            ),
        )
        .unwrap();
        // Client commands read the operator's copy of the first admin token, which `occ init`
        // hands out once and never keeps in the state directory.
        let token_file = dir.path().join("operator-admin.token");
        let occ = |args: &[&str]| {
            let out = Command::new(bin)
                .arg("--config")
                .arg(&config)
                .args(args)
                .env("OCC_LOG", "warn")
                .env("OCC_TOKEN_FILE", &token_file)
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "occ {args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            String::from_utf8_lossy(&out.stdout).into_owned()
        };
        occ(&["init", "--admin-token-file", token_file.to_str().unwrap()]);
        let log = std::fs::File::create(dir.path().join("serve.log")).unwrap();
        let child = Command::new(bin)
            .arg("--config")
            .arg(&config)
            .arg("serve")
            .env("OCC_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        let token = std::fs::read_to_string(&token_file).unwrap();
        let api = Client::new(
            &format!("http://127.0.0.1:{port}"),
            Some(token.trim().to_owned()),
        )
        .unwrap();
        // Owns the child from here on (killed on drop, panics included).
        let me = Occ {
            child,
            api,
            _dir: dir,
        };
        let until = Instant::now() + Duration::from_secs(20);
        while me.api.request("GET", "/healthz", None).is_err() {
            assert!(Instant::now() < until, "occ serve did not come up");
            std::thread::sleep(Duration::from_millis(50));
        }
        host.run_ok(occ(&["enrol-command"]).trim()).unwrap();
        occ(&[
            "host",
            "enrol",
            host.name(),
            "--address",
            &host.address().to_string(),
            "--host-key",
            host.host_public_key().trim(),
        ]);
        me
    }

    fn probe(&self, host: &str) -> Value {
        self.api
            .request("POST", &format!("/hosts/{host}/probe"), None)
            .unwrap()
    }
}

impl Drop for Occ {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[derive(Clone)]
struct Summary {
    median: Duration,
    p90: Duration,
    min: Duration,
}

fn summarise(mut samples: Vec<Duration>) -> Summary {
    samples.sort();
    let at = |q: f64| samples[((samples.len() as f64 - 1.0) * q).round() as usize];
    Summary {
        median: at(0.5),
        p90: at(0.9),
        min: samples[0],
    }
}

fn ms(d: Duration) -> String {
    format!("{:.2}", d.as_secs_f64() * 1000.0)
}

/// hostd's own time per operation since `since`, from its journal: (kind, whether its hostd
/// process answered other operations too, received → succeeded in µs). journald stamps each
/// entry when it arrives (µs); hostd's own elapsed_ms field is too coarse here.
fn hostd_times(host: &TestHost, since: u64) -> Vec<(String, bool, u64)> {
    let ops = hostd_ops(host, since);
    let mut per_pid: BTreeMap<u32, usize> = BTreeMap::new();
    for o in &ops {
        *per_pid.entry(o.pid).or_default() += 1;
    }
    ops.into_iter()
        .filter(|o| o.succeeded)
        .filter_map(|o| {
            Some((
                o.op,
                per_pid.get(&o.pid).copied().unwrap_or(0) > 1,
                o.finished_us?.saturating_sub(o.received_us),
            ))
        })
        .collect()
}

fn main() {
    if let Some(reason) = clawfleet_vm_tests::skip_reason() {
        println!("SKIP: {reason}");
        return;
    }
    let iterations = env_usize("BENCH_ITERATIONS", 50).max(1);
    let warmup = env_usize("BENCH_WARMUP", 5);
    let keys = Keys::new();
    println!("transport benchmark: starting a test host and installing hostd ...");
    let host = TestHost::start().unwrap();
    install_hostd(&host, &keys);
    let target = host_target(&host);
    let rev = spec("bench-r1", 1, serde_json::json!({}));
    let ops: Vec<(&str, Operation)> = vec![
        ("probe", probe()),
        (
            "prepare-revision (idempotent)",
            prepare("bench", "a1", &rev),
        ),
    ];

    let rt = runtime();
    let persistent = keys.backend(fast_settings());
    // The transport before persistent sessions: a new channel and hostd per operation.
    let per_op = keys.backend(SshSettings {
        session_max_age: Duration::from_nanos(1),
        ..fast_settings()
    });
    let options = CallOptions::default();
    rt.block_on(async {
        persistent
            .call(&target, ensure("bench"), options)
            .await
            .unwrap();
        // The first prepare creates the snapshot; every later one verifies and changes nothing.
        persistent
            .call(&target, prepare("bench", "a1", &rev), options)
            .await
            .unwrap();
    });
    let occ = Occ::start(&host);
    let mut peer = PeerSsh::new(&host, &keys);
    let check = |r: &OperationResult| {
        if let OperationResult::PrepareRevision(p) = r {
            assert!(!p.created, "prepare must be idempotent here");
        }
    };
    let since = host_now(&host);
    const COLUMNS: [&str; 4] = [
        "persistent session",
        "new hostd per op",
        "HTTP API",
        "new ssh process per op",
    ];
    // The transports alternate, so all see the same load on the machine.
    let mut results: Vec<(&str, Vec<Option<Summary>>)> = Vec::new();
    for (name, op) in &ops {
        let mut samples: Vec<Vec<Duration>> = vec![Vec::with_capacity(iterations); COLUMNS.len()];
        let is_probe = matches!(op, Operation::Probe(_));
        for i in 0..warmup + iterations {
            let mut took = [None; 4];
            for (b, backend) in [&persistent, &per_op].into_iter().enumerate() {
                let t = Instant::now();
                let r = rt
                    .block_on(backend.call(&target, op.clone(), options))
                    .unwrap();
                took[b] = Some(t.elapsed());
                check(&r);
            }
            if is_probe {
                let t = Instant::now();
                let v = occ.probe(host.name());
                took[2] = Some(t.elapsed());
                assert!(v.is_object(), "{v}");
            }
            let t = Instant::now();
            let r = peer.call(op.clone());
            took[3] = Some(t.elapsed());
            check(&r);
            if i >= warmup {
                for (c, d) in took.iter().enumerate() {
                    if let Some(d) = d {
                        samples[c].push(*d);
                    }
                }
            }
        }
        results.push((
            *name,
            samples
                .into_iter()
                .map(|s| (!s.is_empty()).then(|| summarise(s)))
                .collect(),
        ));
    }
    let stats = persistent.stats();
    let old_stats = per_op.stats();

    println!();
    println!(
        "host {} ({}), {iterations} iterations after {warmup} warm-up (transports alternating), latency per operation in ms",
        host.name(),
        host.address()
    );
    let mut header = format!("{:<31}", "operation");
    let mut sub = format!("{:<31}", "");
    for c in COLUMNS {
        header.push_str(&format!(" | {c:>24}"));
        sub.push_str(&format!(" | {:>7} {:>7} {:>8}", "median", "p90", "min"));
    }
    println!("{header} | {:>11}", "ssh process");
    println!("{sub} | {:>11}", "/ persistent");
    println!("{}", "-".repeat(header.len() + 14));
    for (name, cols) in &results {
        let mut line = format!("{name:<31}");
        for c in cols {
            match c {
                Some(s) => line.push_str(&format!(
                    " | {:>7} {:>7} {:>8}",
                    ms(s.median),
                    ms(s.p90),
                    ms(s.min)
                )),
                None => line.push_str(&format!(" | {:>24}", "-")),
            }
        }
        let ratio = match (&cols[0], &cols[3]) {
            (Some(p), Some(s)) => {
                format!("{:.1}x", s.median.as_secs_f64() / p.median.as_secs_f64())
            }
            _ => "-".to_owned(),
        };
        println!("{line} | {ratio:>11}");
    }
    println!();
    println!(
        "persistent session: {} SSH connection(s), {} hostd session(s) for {} operations; \
         new hostd per op: {} connection(s), {} sessions; ssh: one process, connection and hostd per operation; \
         HTTP API: occ serve on loopback, one HTTP connection per request (the occ CLI's client), \
         the probe result stored in SQLite",
        stats.connections_opened,
        stats.sessions_opened,
        stats.calls,
        old_stats.connections_opened,
        old_stats.sessions_opened,
    );

    // hostd's own share, from its journal.
    let times = hostd_times(&host, since);
    println!();
    println!(
        "hostd's own time per operation (host journal: \"operation received\" -> \"operation succeeded\", after the signature check), ms"
    );
    println!(
        "{:<31} | {:>22} | {:>22}",
        "operation", "long-lived hostd", "hostd started for it"
    );
    println!(
        "{:<31} | {:>7} {:>6} {:>7} | {:>7} {:>6} {:>7}",
        "", "median", "n", "p90", "median", "n", "p90"
    );
    let mut logged = Vec::new();
    for (name, kind) in [
        ("probe", "probe"),
        ("prepare-revision (idempotent)", "prepare-revision"),
    ] {
        let mut line = format!("{name:<31}");
        for reused in [true, false] {
            let v: Vec<Duration> = times
                .iter()
                .filter(|(op, r, _)| op == kind && *r == reused)
                .map(|(_, _, us)| Duration::from_micros(*us))
                .collect();
            if v.is_empty() {
                line.push_str(&format!(" | {:>22}", "-"));
            } else {
                let n = v.len();
                let s = summarise(v);
                line.push_str(&format!(" | {:>7} {n:>6} {:>7}", ms(s.median), ms(s.p90)));
                if reused {
                    logged.push(s.median);
                }
            }
        }
        println!("{line}");
    }
    // A probe does nothing hostd logs outside that window; the rest of its round trip is the
    // transport (SSH, framing, signing and the signature check), about the same for a prepare.
    if let ([probe_logged, prepare_logged], [(_, probe), (_, prepare)]) =
        (logged.as_slice(), results.as_slice())
        && let (Some(probe), Some(prepare)) = (&probe[0], &prepare[0])
    {
        let transport = probe.median.saturating_sub(*probe_logged);
        let hostd = prepare.median.saturating_sub(transport);
        println!();
        println!(
            "persistent session, medians: transport {} ms (probe {} - hostd's logged {}); \
             idempotent prepare {} ms = transport {} + hostd {} ({} logged, the rest outside \
             the logged window: journal begin and finish with their fsyncs and renames)",
            ms(transport),
            ms(probe.median),
            ms(*probe_logged),
            ms(prepare.median),
            ms(transport),
            ms(hostd),
            ms(*prepare_logged),
        );
    }
    // The same host aged as by long use: 99 more Agents with a revision each, then its
    // journal at its limit with expired entries (the prune index removed, as after an
    // upgrade). Then the persistent session's probe and idempotent prepare again, and the
    // prepare as the worker sends it: fenced, a higher fence each time.
    rt.block_on(async {
        for i in 0..AGED_AGENTS {
            persistent
                .call(
                    &target,
                    prepare("bench", &format!("aged{i}"), &rev),
                    options,
                )
                .await
                .unwrap();
        }
    });
    let filled = aged_journal::fill_journal(&host, AGED_JOURNAL);
    let fresh: Vec<Option<Summary>> = results.iter().map(|(_, c)| c[0].clone()).collect();
    let mut aged: Vec<Vec<Duration>> = vec![Vec::new(), Vec::new(), Vec::new()];
    let mut fence = 0;
    for i in 0..warmup + iterations {
        fence += 1;
        let fenced = CallOptions {
            fence: Some(fence),
            ..options
        };
        for (k, (op, opts)) in [
            (probe(), options),
            (prepare("bench", "a1", &rev), options),
            // Another Agent: once fenced, an Agent refuses unfenced operations.
            (prepare("bench", "aged0", &rev), fenced),
        ]
        .into_iter()
        .enumerate()
        {
            let t = Instant::now();
            let r = rt.block_on(persistent.call(&target, op, opts)).unwrap();
            let took = t.elapsed();
            check(&r);
            if i >= warmup {
                aged[k].push(took);
            }
        }
    }
    println!();
    println!(
        "long-lived host: {AGED_AGENTS} more Agents, journal filled with {filled} expired \
         entries to {AGED_JOURNAL}; persistent session, ms (fresh host's median beside it)"
    );
    for (k, name) in [
        "probe",
        "prepare-revision (idempotent)",
        "prepare-revision (idempotent, fenced as the worker sends it)",
    ]
    .into_iter()
    .enumerate()
    {
        let s = summarise(std::mem::take(&mut aged[k]));
        let before = fresh
            .get(k)
            .cloned()
            .flatten()
            .map_or_else(|| "-".to_owned(), |f| ms(f.median));
        println!(
            "  {name:<62} median {:>7} p90 {:>7}  (fresh {before})",
            ms(s.median),
            ms(s.p90)
        );
    }
    drop(occ);
    rt.block_on(persistent.close_all());
    rt.block_on(per_op.close_all());
    drop(host);
}
