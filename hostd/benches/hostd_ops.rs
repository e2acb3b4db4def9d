//! hostd footprint and operation latency on a real test host (not a timed test):
//!
//! - (a) size of the SHIPPED hostd binary: `/usr/sbin/hostd` of the current .deb from
//!   `packaging/build.sh`, or, without one, the binary `packaging/build.sh hostd-binary` builds
//!   the same way (hostd in a cargo invocation of its own, no dev-dependencies, so no fault
//!   hooks); the budget is 6 MiB. That binary is the one installed on the test host below.
//! - (b) peak RSS (`VmHWM`) of the `hostd serve` process after one prepare-revision, read over a
//!   second ssh connection while the session is still open (budget 12 MiB)
//!   and its RSS sampled over `HOSTD_BENCH_LONG_SESSION` (10,000) more operations on that one
//!   session, which should stay flat
//! - (c) idempotent prepare-revision over ONE persistent `hostd serve` session (envelope frame
//!   sent → its result frame received), and, for the ratio the design asks for, the same with a
//!   new `ssh` process per operation (the peer's transport)
//! - (d) revision cutover with the test gateway (ready at once): prepare revision n (not timed),
//!   activate revision n (timed), n = 2..=11
//! - (e) the same host aged: its journal at its limit (`[journal] max_entries`, 10,000) with
//!   every envelope expired, 100 more Agents, 40 more revisions; then, on one session, an
//!   idempotent prepare as the coordinator's worker sends it (a higher fence each time, the
//!   worker raises it on every claim), a prepare of a new revision (changes, so it prunes), and
//!   cutovers as in (d). The same fenced prepare on the fresh host is in (c).
//!
//! `HOSTD_BENCH_BINARY` runs another hostd binary instead of the shipped one (an earlier
//! build, for before/after figures).
//!
//! `cargo bench -p clawfleet-hostd --bench hostd_ops`. Needs root and the test-host runner
//! packages; otherwise prints `SKIP: ...` and exits 0.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod aged_journal;
#[path = "../tests/hosts_support/mod.rs"]
mod hosts_support;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use aged_journal::fill_journal;
use clawfleet_protocol::operation::Operation;
use clawfleet_protocol::result::{OperationResult, Outcome, ResultMessage};
use clawfleet_protocol::{Message, OperationId};
use clawfleet_vm_tests::TestHost;
use hosts_support::*;
use serde_json::json;

const NS: &str = "bench-ns";
const AGENT: &str = "bench-agent";
const WARMUP: usize = 5;
const PREPARES: usize = 50;
const FRESH_SSH: usize = 10;
const CUTOVERS: std::ops::RangeInclusive<u64> = 2..=11;
/// At most 5 starts of one unit in any 10 s window (systemd's default start rate limit).
const CUTOVER_PACE: Duration = Duration::from_millis(2100);
/// The long-lived host of (e).
const AGED_AGENTS: usize = 100;
const AGED_REVISIONS: u64 = 40;
const AGED_JOURNAL: usize = 10_000;
const AGED_PREPARES: usize = 30;
const AGED_CHANGES: u64 = 20;
const AGED_CUTOVERS: u64 = 5;

fn main() {
    if let Some(reason) = skip_reason() {
        println!("SKIP: {reason}");
        return;
    }
    let t_all = Instant::now();
    let extracted = tempfile::tempdir().unwrap();
    let (binary, source) = shipped_binary(extracted.path());
    let binary = binary.as_path();

    // (a) The binary.
    let size = std::fs::metadata(binary).unwrap().len();
    let file = Command::new("file")
        .arg("-b")
        .arg(binary)
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_else(|e| format!("(file: {e})"));
    let stripped = file.contains(", stripped");
    if !stripped {
        eprintln!("WARNING: {} is not stripped: {file}", binary.display());
    }

    let occ = Coordinator::new();
    let host = TestHost::start().unwrap();
    host.install_hostd(binary).unwrap();
    configure_and_enrol(&host, &occ, "");
    let setup = t_all.elapsed();
    occ.ok(&host, ensure(NS));
    let rev = |n: u64| spec(&format!("rev-{n}"), n, json!({"label": format!("rev-{n}")}));
    let r1 = rev(1);

    let mut session = Session::open(&occ, &host);
    // (b) One prepare-revision (the first: it creates the account, directories and snapshot),
    // then the peak RSS of this session's hostd, read over a second connection.
    let (first, _) = roundtrip(&occ, &host, &mut session, prepare(NS, AGENT, &r1));
    let port = expect_prepare(&first, true);
    let rss = hostd_memory(&host);

    // (c) Idempotent prepare-revision of the same revision, fresh operation ids, one session.
    for _ in 0..WARMUP {
        let (r, _) = roundtrip(&occ, &host, &mut session, prepare(NS, AGENT, &r1));
        expect_prepare(&r, false);
    }
    let mut prepares = Vec::with_capacity(PREPARES);
    for _ in 0..PREPARES {
        let (r, t) = roundtrip(&occ, &host, &mut session, prepare(NS, AGENT, &r1));
        expect_prepare(&r, false);
        prepares.push(t);
    }
    let rss_after = hostd_memory(&host);
    // (c) As the worker sends it: a higher fence each time (its own Agent: a fenced Agent
    // refuses unfenced operations).
    let mut fence = 0u64;
    let mut fenced = |occ: &Coordinator,
                      session: &mut Session,
                      agent: &str,
                      rev: &clawfleet_protocol::operation::RevisionSpec| {
        fence += 1;
        roundtrip_fenced(occ, &host, session, prepare(NS, agent, rev), Some(fence))
    };
    let (r, _) = fenced(&occ, &mut session, "bench-fenced", &r1);
    expect_prepare(&r, true);
    let mut fenced_fresh = Vec::with_capacity(PREPARES);
    for _ in 0..PREPARES {
        let (r, t) = fenced(&occ, &mut session, "bench-fenced", &r1);
        expect_prepare(&r, false);
        fenced_fresh.push(t);
    }

    // (b) The same session over many more operations: its RSS, sampled as it goes, stays flat.
    let long = long_session();
    let mut samples = vec![(0usize, hostd_memory(&host))];
    let t_long = Instant::now();
    for i in 1..=long {
        let (r, _) = roundtrip(&occ, &host, &mut session, prepare(NS, AGENT, &r1));
        expect_prepare(&r, false);
        if i % (long / 10).max(1) == 0 || i == long {
            samples.push((i, hostd_memory(&host)));
        }
    }
    let long_elapsed = t_long.elapsed();

    // (d) Cutovers with the test gateway. Revision 1 first (writes the unit; not timed).
    let mut last_start = Instant::now();
    let (r, _) = roundtrip(
        &occ,
        &host,
        &mut session,
        Operation::ActivateRevision(clawfleet_protocol::operation::ActivateArgs::from(rargs(
            NS, AGENT, &r1,
        ))),
    );
    expect_served(&r, "rev-1");
    let mut cutovers = Vec::new();
    for n in CUTOVERS {
        let rn = rev(n);
        let (r, _) = roundtrip(&occ, &host, &mut session, prepare(NS, AGENT, &rn));
        expect_prepare(&r, true);
        // systemd's default start rate limit (5 starts per 10 s) fails the 6th RestartUnit
        // within 10 s with start-limit-hit, and the unit does not lift it: pace the cutovers.
        std::thread::sleep(CUTOVER_PACE.saturating_sub(last_start.elapsed()));
        last_start = Instant::now();
        let (r, t) = roundtrip(
            &occ,
            &host,
            &mut session,
            Operation::ActivateRevision(clawfleet_protocol::operation::ActivateArgs::from(rargs(
                NS, AGENT, &rn,
            ))),
        );
        if !matches!(r.outcome, Outcome::Succeeded { .. }) {
            let unit = host
                .run_ok("systemctl status --no-pager 'clawfleet-agent-*' | head -8")
                .unwrap_or_default();
            eprintln!("cutover to rev-{n} failed: {:?}\n{unit}", r.outcome);
        }
        expect_served(&r, &format!("rev-{n}"));
        cutovers.push(t);
    }
    let last = format!("rev-{}", CUTOVERS.end());
    let (code, info) = curl(&host, port, "/info");
    assert!(code == 200 && info.contains(&last), "{code} {info}");
    session.finish();

    // The peer's transport for comparison: a new ssh process (and hostd) per operation.
    let mut fresh = Vec::with_capacity(FRESH_SSH);
    let rl = rev(*CUTOVERS.end());
    for _ in 0..FRESH_SSH {
        let t0 = Instant::now();
        let out = occ.call(&host, prepare(NS, AGENT, &rl));
        fresh.push(t0.elapsed());
        expect_prepare(&out, false);
    }

    // (e) The host aged. Journal entries of operations long expired, written as hostd writes
    // them, up to the limit; the index is removed, as on a host upgraded from a hostd without
    // one (it is rebuilt once, when the next session opens the journal).
    let mut session = Session::open(&occ, &host);
    for i in 0..AGED_AGENTS {
        let (r, _) = fenced(&occ, &mut session, &format!("aged-agent-{i}"), &r1);
        expect_prepare(&r, true);
    }
    for n in 1..=AGED_REVISIONS {
        let rn = rev(100 + n);
        let (r, _) = roundtrip(&occ, &host, &mut session, prepare(NS, AGENT, &rn));
        expect_prepare(&r, true);
    }
    session.finish();
    let filled = fill_journal(&host, AGED_JOURNAL);
    let mut session = Session::open(&occ, &host);
    let mut fenced_aged = Vec::with_capacity(AGED_PREPARES);
    for i in 0..AGED_PREPARES + WARMUP {
        let (r, t) = fenced(&occ, &mut session, "aged-agent-7", &r1);
        expect_prepare(&r, false);
        if i >= WARMUP {
            fenced_aged.push(t);
        }
    }
    let mut changes_aged = Vec::new();
    for n in 1..=AGED_CHANGES {
        let rn = rev(200 + n);
        let (r, t) = roundtrip(&occ, &host, &mut session, prepare(NS, AGENT, &rn));
        expect_prepare(&r, true);
        changes_aged.push(t);
    }
    let mut cutovers_aged = Vec::new();
    for n in 1..=AGED_CUTOVERS {
        let rn = rev(300 + n);
        let (r, _) = roundtrip(&occ, &host, &mut session, prepare(NS, AGENT, &rn));
        expect_prepare(&r, true);
        std::thread::sleep(CUTOVER_PACE.saturating_sub(last_start.elapsed()));
        last_start = Instant::now();
        let (r, t) = roundtrip(
            &occ,
            &host,
            &mut session,
            Operation::ActivateRevision(clawfleet_protocol::operation::ActivateArgs::from(rargs(
                NS, AGENT, &rn,
            ))),
        );
        expect_served(&r, &format!("rev-{}", 300 + n));
        cutovers_aged.push(t);
    }
    session.finish();
    let entries_after = host
        .run_ok("ls /var/lib/clawfleet/journal | grep -c '^[^.].*\\.json$'")
        .unwrap_or_default();

    let p = Stats::of(&prepares);
    let pf = Stats::of(&fenced_fresh);
    let f = Stats::of(&fresh);
    let c = Stats::of(&cutovers);
    let mib = |b: u64| b as f64 / (1024.0 * 1024.0);
    println!();
    println!(
        "hostd_ops on {} (systemd-nspawn Debian 12 host, stock OpenSSH, {} runner cores; setup {:.1}s)",
        host.name(),
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        setup.as_secs_f64()
    );
    println!();
    println!("| what | n | median | p90 | min | max |");
    println!("| --- | ---: | ---: | ---: | ---: | ---: |");
    println!(
        "| (a) shipped hostd binary ({source}, strip={stripped}; budget 6 MiB) | 1 | {:.2} MiB ({size} B) | | | |",
        mib(size)
    );
    println!(
        "| (b) peak RSS (VmHWM) of `hostd serve` after one prepare-revision (budget 12 MiB) | 1 | {:.2} MiB ({} kB) | | | |",
        mib(rss.hwm_kb * 1024),
        rss.hwm_kb
    );
    println!(
        "|     same session after {} more prepares (VmHWM / VmRSS) | 1 | {:.2} / {:.2} MiB | | | |",
        WARMUP + PREPARES,
        mib(rss_after.hwm_kb * 1024),
        mib(rss_after.rss_kb * 1024)
    );
    let first_rss = samples.first().map_or(0, |s| s.1.rss_kb);
    let (last_rss, last_hwm) = samples.last().map_or((0, 0), |s| (s.1.rss_kb, s.1.hwm_kb));
    println!(
        "|     same session over {long} more prepares: VmRSS first → last sample (growth), VmHWM | {} | {:.2} → {:.2} MiB ({:+} kB) | VmHWM {:.2} MiB | | |",
        samples.len(),
        mib(first_rss * 1024),
        mib(last_rss * 1024),
        last_rss as i64 - first_rss as i64,
        mib(last_hwm * 1024)
    );
    println!(
        "| (c) idempotent prepare-revision, one persistent session | {} | {} | {} | {} | {} |",
        p.n,
        ms(p.median),
        ms(p.p90),
        ms(p.min),
        ms(p.max)
    );
    println!(
        "|     same, a higher fence each time (as the worker sends it) | {} | {} | {} | {} | {} |",
        pf.n,
        ms(pf.median),
        ms(pf.p90),
        ms(pf.min),
        ms(pf.max)
    );
    println!(
        "|     same, new ssh + hostd per operation (peer transport) | {} | {} | {} | {} | {} |",
        f.n,
        ms(f.median),
        ms(f.p90),
        ms(f.min),
        ms(f.max)
    );
    println!(
        "| (d) cutover: activate-revision n={}..={} (test gateway ready at once) | {} | {} | {} | {} | {} |",
        CUTOVERS.start(),
        CUTOVERS.end(),
        c.n,
        ms(c.median),
        ms(c.p90),
        ms(c.min),
        ms(c.max)
    );
    for (what, samples) in [
        (
            "(e) long-lived host: idempotent prepare-revision, a higher fence each time",
            &fenced_aged,
        ),
        (
            "(e) long-lived host: prepare-revision of a new revision (changes, prunes)",
            &changes_aged,
        ),
        (
            "(e) long-lived host: cutover (activate-revision)",
            &cutovers_aged,
        ),
    ] {
        let s = Stats::of(samples);
        println!(
            "| {what} | {} | {} | {} | {} | {} |",
            s.n,
            ms(s.median),
            ms(s.p90),
            ms(s.min),
            ms(s.max)
        );
    }
    println!();
    println!(
        "long-lived host (e): {} Agents, {} revisions of {AGENT}, journal filled with {filled} expired entries to {AGED_JOURNAL}; {} entries after the run",
        AGED_AGENTS + 2,
        CUTOVERS.end() + AGED_REVISIONS + AGED_CHANGES + AGED_CUTOVERS,
        entries_after.trim()
    );
    println!(
        "persistent session vs new ssh per operation (median): {:.1}x faster",
        f.median.as_secs_f64() / p.median.as_secs_f64().max(1e-9)
    );
    println!(
        "cutovers were paced {} ms apart (activation start to activation start): systemd's default \
         StartLimitBurst=5 / StartLimitIntervalSec=10s makes the 6th start of one unit within 10 s fail \
         (start-limit-hit → SYSTEMD_UNAVAILABLE) and hostd's unit does not lift it",
        CUTOVER_PACE.as_millis()
    );
    println!(
        "long session: {long} prepares in {:.1}s; VmRSS (kB) by operations done: {}",
        long_elapsed.as_secs_f64(),
        samples
            .iter()
            .map(|(n, m)| format!("{n}:{}", m.rss_kb))
            .collect::<Vec<_>>()
            .join(" ")
    );
    println!("binary: {} — {file}", binary.display());
    println!(
        "times: envelope frame written → its result frame read, on the runner; total bench {:.1}s",
        t_all.elapsed().as_secs_f64()
    );
}

/// The hostd binary operators get: from the current .deb when `packaging/build.sh` made one,
/// otherwise built by `packaging/build.sh hostd-binary` (the same build step). Returns it and
/// where it came from.
fn shipped_binary(scratch: &Path) -> (std::path::PathBuf, String) {
    if let Some(other) = std::env::var_os("HOSTD_BENCH_BINARY") {
        let path = std::path::PathBuf::from(other);
        let shown = format!("HOSTD_BENCH_BINARY={}", path.display());
        return (path, shown);
    }
    let dir = install::packages_dir();
    if let Some(deb) = install::find_one(&dir, "clawfleet-hostd_", ".deb")
        && !install::hostd_deb_is_stale(&deb)
    {
        let out = Command::new("dpkg-deb")
            .arg("-x")
            .arg(&deb)
            .arg(scratch)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "dpkg-deb -x {}: {out:?}",
            deb.display()
        );
        return (
            scratch.join("usr/sbin/hostd"),
            format!("from {}", deb.display()),
        );
    }
    let script = install::workspace_dir().join("packaging/build.sh");
    let out = Command::new("bash")
        .arg(&script)
        .arg("hostd-binary")
        .stderr(std::process::Stdio::inherit())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "packaging/build.sh hostd-binary failed"
    );
    let path = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    // Copied away: the next `cargo bench` build puts its own binary at that path again.
    let copy = scratch.join("hostd");
    std::fs::copy(&path, &copy).unwrap();
    (
        copy,
        "`packaging/build.sh hostd-binary`, no current .deb".to_owned(),
    )
}

/// Why the bench cannot run here. `skip_reason` panics under CI; a bench only skips.
fn skip_reason() -> Option<String> {
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let reason = std::panic::catch_unwind(clawfleet_vm_tests::skip_reason);
    std::panic::set_hook(hook);
    match reason {
        Ok(r) => r,
        Err(p) => Some(
            p.downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                .unwrap_or_else(|| "real test hosts cannot run".to_owned()),
        ),
    }
}

/// Sends one fresh envelope on the open session and waits for its result frame.
fn roundtrip(
    occ: &Coordinator,
    host: &TestHost,
    session: &mut Session,
    operation: Operation,
) -> (ResultMessage, Duration) {
    roundtrip_fenced(occ, host, session, operation, None)
}

/// [`roundtrip`] with a fence in the envelope.
fn roundtrip_fenced(
    occ: &Coordinator,
    host: &TestHost,
    session: &mut Session,
    operation: Operation,
    fence: Option<u64>,
) -> (ResultMessage, Duration) {
    let id = occ.next_id();
    let mut envelope = occ.envelope(host, &id, operation);
    envelope.fence = fence;
    let signed = occ.sign(&envelope);
    let want = OperationId::new(&id).unwrap();
    let t0 = Instant::now();
    session.send(&signed);
    let m = session
        .wait_for(
            Duration::from_secs(60),
            |m| matches!(m, Message::Result(r) if r.operation_id.as_ref() == Some(&want)),
        )
        .unwrap_or_else(|| panic!("no result for {id}"));
    let t = t0.elapsed();
    // Keep memory flat over many operations.
    session.received.clear();
    match m {
        Message::Result(r) => (r, t),
        _ => unreachable!(),
    }
}

/// Checks a prepare-revision result; returns the Agent's port.
fn expect_prepare(r: &ResultMessage, created: bool) -> u16 {
    match &r.outcome {
        Outcome::Succeeded {
            result: OperationResult::PrepareRevision(p),
        } => {
            assert!(p.ready && p.created == created, "{p:?}");
            p.observation.port.unwrap()
        }
        other => panic!("prepare-revision: {other:?}"),
    }
}

fn expect_served(r: &ResultMessage, rev: &str) {
    match &r.outcome {
        Outcome::Succeeded {
            result: OperationResult::ActivateRevision(a),
        } => assert_eq!(
            a.observation.served.as_ref().map(|s| s.as_str()),
            Some(rev),
            "{a:?}"
        ),
        other => panic!("activate-revision: {other:?}"),
    }
}

/// Operations in the long-session memory check: `HOSTD_BENCH_LONG_SESSION` (default 10,000,
/// the figure; about half a minute here).
fn long_session() -> usize {
    std::env::var("HOSTD_BENCH_LONG_SESSION")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000)
}

struct Memory {
    hwm_kb: u64,
    rss_kb: u64,
}

/// VmHWM and VmRSS of the (single) `hostd serve` process on the host, over a second connection.
fn hostd_memory(host: &TestHost) -> Memory {
    let out = host
        .run_ok(
            "for p in $(pgrep -x hostd); do \
               if tr '\\0' ' ' < /proc/$p/cmdline | awk '{exit !($2 == \"serve\")}'; then \
                 echo \"$p $(awk '/^VmHWM:/{h=$2} /^VmRSS:/{r=$2} END{print h, r}' /proc/$p/status)\"; \
               fi; done",
        )
        .unwrap();
    let rows: Vec<Vec<u64>> = out
        .lines()
        .map(|l| l.split_whitespace().map(|w| w.parse().unwrap()).collect())
        .collect();
    assert_eq!(
        rows.len(),
        1,
        "expected exactly one `hostd serve` process: {out}"
    );
    Memory {
        hwm_kb: rows[0][1],
        rss_kb: rows[0][2],
    }
}

struct Stats {
    n: usize,
    median: Duration,
    p90: Duration,
    min: Duration,
    max: Duration,
}

impl Stats {
    /// Nearest-rank percentiles.
    fn of(samples: &[Duration]) -> Self {
        let mut s = samples.to_vec();
        s.sort();
        let rank = |p: f64| s[((p * s.len() as f64).ceil() as usize).clamp(1, s.len()) - 1];
        Self {
            n: s.len(),
            median: rank(0.5),
            p90: rank(0.9),
            min: s[0],
            max: s[s.len() - 1],
        }
    }
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1000.0)
}
