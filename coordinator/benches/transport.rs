//! Transport benchmark (not a timed test): per-operation latency of `probe` and of an
//! idempotent `prepare-revision` against ONE real test host with hostd enrolled, sent
//!
//! - over the SSH backend's persistent russh connection (one channel per operation), and
//! - the peer's way: a NEW `ssh` process per operation (BatchMode, the envelope frame on
//!   stdin, the Result frame read from stdout),
//!
//! printed side by side (median and p90, milliseconds) with the ratio.
//!
//! Run: `cargo bench -p clawfleet-coordinator --bench transport` as root with the vm-tests
//! runner packages; prints SKIP otherwise. `BENCH_ITERATIONS` (default 50) and
//! `BENCH_WARMUP` (default 5) tune the runs.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

#[path = "../tests/ssh_support/mod.rs"]
mod ssh_support;

use std::io::{Read, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use clawfleet_protocol::framing::{FrameDecoder, write_frame};
use clawfleet_protocol::result::{OperationResult, Outcome};
use clawfleet_protocol::{
    Envelope, Fingerprint, HostName, Limits, Message, Operation, OperationId, PROTOCOL_VERSION,
    SignedEnvelope, Target,
};
use clawfleet_vm_tests::TestHost;
use coordinator::backend::{Backend, CallOptions};
use ssh_support::*;

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
    format!("{:.1}", d.as_secs_f64() * 1000.0)
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
    let backend = keys.backend(fast_settings());
    let options = CallOptions::default();
    rt.block_on(async {
        backend
            .call(&target, ensure("bench"), options)
            .await
            .unwrap();
        // The first prepare creates the snapshot; every later one verifies and changes nothing.
        backend
            .call(&target, prepare("bench", "a1", &rev), options)
            .await
            .unwrap();
    });
    let mut peer = PeerSsh::new(&host, &keys);
    let check = |r: &OperationResult| {
        if let OperationResult::PrepareRevision(p) = r {
            assert!(!p.created, "prepare must be idempotent here");
        }
    };
    // The two transports alternate, so both see the same load on the machine.
    let mut russh_results = Vec::new();
    let mut peer_results = Vec::new();
    for (name, op) in &ops {
        let mut russh_samples = Vec::with_capacity(iterations);
        let mut peer_samples = Vec::with_capacity(iterations);
        for i in 0..warmup + iterations {
            let t = Instant::now();
            let r = rt
                .block_on(backend.call(&target, op.clone(), options))
                .unwrap();
            let russh_took = t.elapsed();
            check(&r);
            let t = Instant::now();
            let r = peer.call(op.clone());
            let peer_took = t.elapsed();
            check(&r);
            if i >= warmup {
                russh_samples.push(russh_took);
                peer_samples.push(peer_took);
            }
        }
        russh_results.push((*name, summarise(russh_samples)));
        peer_results.push((*name, summarise(peer_samples)));
    }
    let russh_connections = backend.stats().connections_opened;

    println!();
    println!(
        "host {} ({}), {iterations} iterations after {warmup} warm-up (transports alternating), latency per operation in ms",
        host.name(),
        host.address()
    );
    println!(
        "{:<31} | {:>27} | {:>27} | {:>12}",
        "operation", "russh persistent", "new ssh process per op", "ratio"
    );
    println!(
        "{:<31} | {:>8} {:>8} {:>9} | {:>8} {:>8} {:>9} | {:>12}",
        "", "median", "p90", "min", "median", "p90", "min", "ssh / russh"
    );
    println!("{}", "-".repeat(31 + 3 + 27 + 3 + 27 + 3 + 12));
    for ((name, r), (_, p)) in russh_results.iter().zip(&peer_results) {
        println!(
            "{:<31} | {:>8} {:>8} {:>9} | {:>8} {:>8} {:>9} | {:>11.1}x",
            name,
            ms(r.median),
            ms(r.p90),
            ms(r.min),
            ms(p.median),
            ms(p.p90),
            ms(p.min),
            p.median.as_secs_f64() / r.median.as_secs_f64()
        );
    }
    println!();
    println!(
        "russh: {russh_connections} SSH connection(s) for {} operations; ssh: one process and connection per operation",
        (iterations + warmup) * ops.len() + 2
    );
    rt.block_on(backend.close_all());
    drop(host);
}
