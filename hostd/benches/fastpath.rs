//! The no-op fast path, in-process over the fake privileged layer (not a timed test): how long
//! hostd's own work takes for operations that change nothing, and how many durable writes and
//! systemd calls they make. The session's responder runs each signed envelope exactly as
//! `hostd serve` does (verification, journal, engine), on a state root on this machine's disk.
//!
//! - idempotent prepare-revision (the revision is already prepared)
//! - verify-revision (read-only)
//! - activate-revision of the revision already served
//! - stop-revision of an Agent already stopped
//! - idempotent prepare-revision as the coordinator's worker sends it: a higher fence each
//!   time (the worker raises the fence on every claim of the Agent)
//! - for contrast, prepare-revision of a new revision each time (the slow path, which writes)
//!
//! and the same again on a long-lived host: the journal at its limit (`[journal] max_entries`,
//! 10,000 by default) with every envelope expired, 100 Agents, one of them with 50 revisions.
//!
//! `cargo bench -p clawfleet-hostd --bench fastpath` (no root needed). `FASTPATH_BENCH_DIR`
//! picks where the state root lives (default: the system temp directory); `FASTPATH_N` the
//! number of timed operations per row (default 300; the long-lived host's rows take at most
//! 100).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Instant;

use clawfleet_protocol::operation::*;
use clawfleet_protocol::result::{OperationResult, Outcome};
use clawfleet_protocol::ssh_key::{Algorithm, PrivateKey, getrandom::SysRng, rand_core::UnwrapErr};
use clawfleet_protocol::{
    Configuration, Envelope, Fingerprint, HostName, Ident, OperationId, PROTOCOL_VERSION,
    Principal, SignedEnvelope, Target,
};
use hostd::engine::Engine;
use hostd::fake::FakeSystem;
use hostd::fsutil::counters;
use hostd::session::{Responder, now_unix};
use serde_json::json;

const WARMUP: usize = 10;

/// Makes the next operation of one row.
type MakeOp = Box<dyn FnMut() -> Operation>;

struct Bench {
    config: hostd::config::Config,
    fake: FakeSystem,
    key: PrivateKey,
    host_key: Fingerprint,
    next: std::cell::Cell<u64>,
    /// The fence of Agent-scoped changes; raised before each envelope while `raising`.
    fence: std::cell::Cell<u64>,
    raising: std::cell::Cell<bool>,
}

impl Bench {
    fn envelope(&self, operation: Operation) -> SignedEnvelope {
        let n = self.next.get();
        self.next.set(n + 1);
        let now = now_unix();
        // Fenced as the coordinator's claims are (the Agent-scoped changes only).
        let scoped = matches!(
            operation,
            Operation::PrepareRevision(_)
                | Operation::ActivateRevision(_)
                | Operation::StopRevision(_)
        );
        if scoped && self.raising.get() {
            self.fence.set(self.fence.get() + 1);
        }
        let fence = scoped.then_some(self.fence.get());
        let env = Envelope {
            version: PROTOCOL_VERSION,
            operation_id: OperationId::new(format!("bench-{n}")).unwrap(),
            target: Target {
                host: HostName::new("h1").unwrap(),
                host_key: self.host_key.clone(),
            },
            issuer: Principal::new("occ@test").unwrap(),
            issued_at: now,
            expires_at: now + 300,
            deadline_seconds: 60,
            fence,
            operation,
        };
        SignedEnvelope::sign(&env, &self.key).unwrap()
    }
}

fn id(s: &str) -> Ident {
    Ident::new(s).unwrap()
}

fn ns() -> NamespaceRef {
    NamespaceRef {
        id: id("ns1"),
        name: id("ns1-name"),
    }
}

fn agent(a: &str) -> AgentRef {
    AgentRef {
        id: id(a),
        service_principal_id: id(&format!("sp-{a}")),
    }
}

fn spec(rev: &str, number: u64) -> RevisionSpec {
    let configuration = Configuration::new(json!({
        "gateway": {"mode": "local", "bind": "loopback", "auth": {"mode": "password"}},
        "x-clawfleet-test": {"label": rev}
    }))
    .unwrap();
    RevisionSpec {
        id: id(rev),
        number: RevisionNumber::new(number).unwrap(),
        harness: Harness {
            id: HarnessId::Openclaw,
            version: HarnessVersion::new("2026.9.6").unwrap(),
            mode: HarnessMode::Embedded,
        },
        configuration_hash: configuration.hash(),
        configuration,
    }
}

fn prepare(a: &str, rev: &str, n: u64) -> Operation {
    Operation::PrepareRevision(PrepareArgs {
        workspace: None,
        namespace: ns(),
        agent: agent(a),
        revision: spec(rev, n),
        egress: None,
    })
}

fn rargs(a: &str, rev: &str, n: u64) -> RevisionArgs {
    RevisionArgs {
        namespace: ns(),
        agent: agent(a),
        revision: spec(rev, n).reference(),
    }
}

struct Row {
    what: &'static str,
    micros: Vec<f64>,
    io: counters::IoCounts,
    calls: usize,
    bus_reads: usize,
}

fn main() {
    let n: usize = std::env::var("FASTPATH_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(300);
    let base = std::env::var_os("FASTPATH_BENCH_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(std::env::temp_dir);
    let dir = tempfile::tempdir_in(&base).unwrap();
    let key = PrivateKey::random(&mut UnwrapErr(SysRng), Algorithm::Ed25519).unwrap();
    let signers = dir.path().join("allowed_signers");
    std::fs::write(
        &signers,
        format!(
            "occ@test namespaces=\"clawfleet-operation\" {}\n",
            key.public_key().to_openssh().unwrap()
        ),
    )
    .unwrap();
    let mut config =
        hostd::fake::test_config(dir.path(), "host_name = \"h1\"\n", &["run"]).unwrap();
    config.allowed_signers = signers;
    let b = Bench {
        fake: FakeSystem::new(&config.unit_dir),
        config,
        key,
        host_key: Fingerprint::new(format!("SHA256:{}", "Q".repeat(43))).unwrap(),
        next: std::cell::Cell::new(0),
        fence: std::cell::Cell::new(7),
        raising: std::cell::Cell::new(false),
    };
    let engine = Engine::new(&b.config, &b.fake, b.host_key.clone());
    let responder = Responder::new(&engine, &b.config).unwrap();
    let run = |op: Operation| -> OperationResult {
        let signed = b.envelope(op);
        let r = responder.respond(&signed, &|| false, &mut |_| {});
        match r.outcome {
            Outcome::Succeeded { result } => result,
            Outcome::Failed { failure } => panic!("{failure}"),
        }
    };

    // Agent a serves rev-1; Agent b was activated and stopped.
    run(Operation::EnsureNamespace(NamespaceArgs {
        namespace: ns(),
    }));
    run(prepare("a", "rev-1", 1));
    run(Operation::ActivateRevision(ActivateArgs::from(rargs(
        "a", "rev-1", 1,
    ))));
    run(prepare("b", "rev-1", 1));
    run(Operation::ActivateRevision(ActivateArgs::from(rargs(
        "b", "rev-1", 1,
    ))));
    run(Operation::StopRevision(rargs("b", "rev-1", 1)));

    run(prepare("d", "rev-1", 1));

    let fresh = std::rc::Rc::new(std::cell::Cell::new(1u64));
    let mut rows = Vec::new();
    let measure =
        |rows: &mut Vec<Row>, what: &'static str, n: usize, raising: bool, make: &mut MakeOp| {
            b.raising.set(raising);
            for _ in 0..WARMUP {
                run(make());
            }
            let envelopes: Vec<SignedEnvelope> = (0..n).map(|_| b.envelope(make())).collect();
            b.fake.clear_calls();
            counters::reset();
            let mut micros = Vec::with_capacity(n);
            for signed in &envelopes {
                let t0 = Instant::now();
                let r = responder.respond(signed, &|| false, &mut |_| {});
                micros.push(t0.elapsed().as_secs_f64() * 1e6);
                if let Outcome::Failed { failure } = r.outcome {
                    panic!("{what}: {failure}");
                }
            }
            b.raising.set(false);
            rows.push(Row {
                what,
                micros,
                io: counters::get(),
                calls: b.fake.calls().len(),
                bus_reads: b.fake.bus_reads(),
            });
        };
    let new_revision = |a: &'static str| -> MakeOp {
        let fresh = fresh.clone();
        Box::new(move || {
            fresh.set(fresh.get() + 1);
            prepare(a, &format!("rev-{}", fresh.get()), fresh.get())
        })
    };
    let cases: Vec<(&'static str, bool, MakeOp)> = vec![
        (
            "prepare-revision, already prepared",
            false,
            Box::new(|| prepare("a", "rev-1", 1)),
        ),
        (
            "verify-revision",
            false,
            Box::new(|| Operation::VerifyRevision(rargs("a", "rev-1", 1))),
        ),
        (
            "activate-revision, already served",
            false,
            Box::new(|| Operation::ActivateRevision(ActivateArgs::from(rargs("a", "rev-1", 1)))),
        ),
        (
            "stop-revision, already stopped",
            false,
            Box::new(|| Operation::StopRevision(rargs("b", "rev-1", 1))),
        ),
        (
            "prepare-revision, already prepared, higher fence each time (as the worker sends it)",
            true,
            Box::new(|| prepare("d", "rev-1", 1)),
        ),
        (
            "prepare-revision of a new revision (changes)",
            false,
            new_revision("c"),
        ),
    ];
    for (what, raising, mut make) in cases {
        measure(&mut rows, what, n, raising, &mut make);
    }

    // The long-lived host: 100 Agents, one with 50 revisions, and the journal at its limit
    // with every envelope expired (written as entries of earlier operations would be).
    for i in 0..100 {
        run(prepare(&format!("agent-{i}"), "rev-1", 1));
    }
    for _ in 0..50 {
        run(new_revision("e")());
    }
    let journal = engine.layout.journal_dir();
    let max = b.config.journal_max_entries;
    let long_ago = now_unix() - 86_400;
    let mut have = std::fs::read_dir(&journal)
        .unwrap()
        .filter(|e| {
            let name = e.as_ref().unwrap().file_name();
            let name = name.to_string_lossy();
            name.ends_with(".json") && !name.starts_with('.')
        })
        .count();
    let mut k = 0u64;
    while have < max {
        k += 1;
        let entry = hostd::journal::Entry {
            schema: hostd::markers::SCHEMA,
            operation_id: OperationId::new(format!("aged-{k}")).unwrap(),
            kind: OperationKind::PrepareRevision,
            body_sha256: clawfleet_protocol::Sha256Hex::new("a".repeat(64)).unwrap(),
            expires_at: long_ago + k,
            started_at: long_ago - 300 + k,
            state: hostd::journal::EntryState::Failed {
                failure: clawfleet_protocol::failure::Failure::new(
                    clawfleet_protocol::failure::FailureCode::Internal,
                    "bench filler",
                ),
                after_step: None,
            },
        };
        std::fs::write(
            journal.join(format!("aged-{k}.json")),
            hostd::markers::to_bytes(&entry),
        )
        .unwrap();
        have += 1;
    }
    let aged_n = n.min(100);
    let aged: Vec<(&'static str, bool, MakeOp)> = vec![
        (
            "long-lived host: prepare-revision, already prepared, higher fence each time",
            true,
            Box::new(|| prepare("agent-7", "rev-1", 1)),
        ),
        (
            "long-lived host: activate-revision, already served",
            false,
            Box::new(|| Operation::ActivateRevision(ActivateArgs::from(rargs("a", "rev-1", 1)))),
        ),
        (
            "long-lived host: prepare-revision of a new revision (changes)",
            false,
            new_revision("e"),
        ),
    ];
    for (what, raising, mut make) in aged {
        measure(&mut rows, what, aged_n, raising, &mut make);
    }

    println!();
    println!(
        "fastpath: {n} operations per row ({} on the long-lived host), in-process over the fake privileged layer, state root on {}",
        n.min(100),
        base.display()
    );
    println!();
    println!(
        "| operation | median µs | p90 µs | ops/s (1/median) | fsyncs/op | renames/op | other writes/op | systemd changes/op | D-Bus reads/op |"
    );
    println!("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
    for r in &rows {
        let mut s = r.micros.clone();
        s.sort_by(|a, b| a.total_cmp(b));
        let rank = |p: f64| s[((p * s.len() as f64).ceil() as usize).clamp(1, s.len()) - 1];
        let n = r.micros.len();
        let per = |x: u64| x as f64 / n as f64;
        println!(
            "| {} | {:.0} | {:.0} | {:.0} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} |",
            r.what,
            rank(0.5),
            rank(0.9),
            1e6 / rank(0.5),
            per(r.io.fsyncs),
            per(r.io.renames),
            per(r.io.other),
            r.calls as f64 / n as f64,
            r.bus_reads as f64 / n as f64,
        );
    }
    println!();
    println!(
        "µs: one signed envelope through Responder::respond (signature check, journal, engine); \
         counts from hostd::fsutil::counters and the fake's call log"
    );
}
