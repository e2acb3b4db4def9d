//! Issue 17's no-op fast path over the fake layer: operations that change nothing make no
//! fsync, rename or other file system change, no systemd change and never commit their
//! journal entry; operations that change things commit before their first write and write
//! as before.

use crate::fsutil::counters::{self, IoCounts};

use super::*;

/// What one operation did.
#[derive(Debug)]
struct Ran {
    result: Result<OperationResult, Failure>,
    /// How often the engine asked for a durable journal entry.
    commits: usize,
    /// File system changes made before the (first) commit.
    before_commit: Option<IoCounts>,
    io: IoCounts,
    /// systemd changes (the fake's call log) and D-Bus reads.
    calls: Vec<String>,
    bus_reads: usize,
}

impl Host {
    fn counted(&self, op: Operation, fence: Option<u64>) -> Ran {
        self.fake.clear_calls();
        let mut commits = 0;
        let mut before_commit = None;
        let cancelled = || false;
        let mut on_step = |_: Step| {};
        let mut commit = || {
            commits += 1;
            before_commit.get_or_insert_with(counters::get);
            Ok(())
        };
        counters::reset();
        let result = {
            let mut ctx = Ctx::new(
                OperationId::new("op-fast").unwrap(),
                Instant::now() + Duration::from_secs(30),
                1_800_000_000,
                &cancelled,
                &mut on_step,
            );
            ctx.fence = fence;
            ctx.on_commit(&mut commit);
            self.engine().execute(&op, &mut ctx, &self.journal)
        };
        Ran {
            result,
            commits,
            before_commit,
            io: counters::get(),
            calls: self.fake.calls(),
            bus_reads: self.fake.bus_reads(),
        }
    }

    /// Runs `op`, which must succeed without writing anything.
    fn noop(&self, op: Operation, fence: Option<u64>) -> OperationResult {
        let kind = op.kind();
        let ran = self.counted(op, fence);
        assert_eq!(ran.commits, 0, "{kind} committed: {ran:?}");
        assert!(ran.io.is_zero(), "{kind} wrote: {ran:?}");
        assert!(ran.calls.is_empty(), "{kind} changed systemd: {ran:?}");
        assert!(
            ran.bus_reads <= 1,
            "{kind} read systemd more than once: {ran:?}"
        );
        match ran.result {
            Ok(r) => r,
            Err(f) => panic!("{kind} failed: {f}"),
        }
    }

    /// Runs `op`, which must commit before its first write and then write.
    fn changes(&self, op: Operation, fence: Option<u64>) -> Ran {
        let kind = op.kind();
        let ran = self.counted(op, fence);
        assert_eq!(ran.commits, 1, "{kind}: {ran:?}");
        // Before the commit, at most the locks directory is made (once per host, by the
        // Agent lock); nothing of the operation is written.
        let before = ran.before_commit.unwrap();
        assert!(
            before.renames == 0 && before.fsyncs <= 1 && before.other <= 1,
            "{kind} wrote before it committed: {ran:?}"
        );
        assert!(ran.io.fsyncs > 0, "{kind} did not write: {ran:?}");
        if let Err(f) = &ran.result {
            panic!("{kind} failed: {f}");
        }
        ran
    }
}

fn stop(n: &str, a: &str, rev: &str, number: u64) -> Operation {
    Operation::StopRevision(rargs(n, a, rev, number))
}

fn verify(n: &str, a: &str, rev: &str, number: u64) -> Operation {
    Operation::VerifyRevision(rargs(n, a, rev, number))
}

/// Namespace ns1 with Agent a1 serving rev-1, at fence 5.
fn serving() -> Host {
    let h = Host::new();
    h.ok(ensure("ns1"));
    h.ok_fenced(prepare("ns1", "a1", "rev-1", 1), 5);
    h.ok_fenced(activate("ns1", "a1", "rev-1", 1), 5);
    h
}

impl Host {
    fn ok_fenced(&self, op: Operation, fence: u64) -> OperationResult {
        match self.run_fenced(op.clone(), Some(fence)) {
            Ok(r) => r,
            Err(f) => panic!("{} failed: {f}", op.kind()),
        }
    }
}

#[test]
fn an_idempotent_prepare_writes_nothing_and_answers_as_before() {
    let h = serving();
    let slow = h.ok_fenced(prepare("ns1", "a1", "rev-1", 1), 5);
    match h.noop(prepare("ns1", "a1", "rev-1", 1), Some(5)) {
        OperationResult::PrepareRevision(p) => {
            assert!(p.ready && !p.created, "{p:?}");
            assert_eq!(OperationResult::PrepareRevision(p), slow);
        }
        other => panic!("{other:?}"),
    }
    // An older candidate than the revision current: not ready, nothing written.
    h.ok_fenced(prepare("ns1", "a1", "rev-2", 2), 5);
    h.ok_fenced(activate("ns1", "a1", "rev-2", 2), 5);
    match h.noop(prepare("ns1", "a1", "rev-1", 1), Some(5)) {
        OperationResult::PrepareRevision(p) => assert!(!p.ready && !p.created, "{p:?}"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn verify_writes_nothing() {
    let h = serving();
    match h.noop(verify("ns1", "a1", "rev-1", 1), None) {
        OperationResult::VerifyRevision(v) => {
            assert_eq!(
                v.observation.served.as_ref().map(Ident::as_str),
                Some("rev-1")
            )
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn activating_the_served_revision_writes_nothing_and_restarts_nothing() {
    let h = serving();
    let unit = h.layout().agent(&id("ns1"), &id("a1")).unit_name;
    match h.noop(activate("ns1", "a1", "rev-1", 1), Some(5)) {
        OperationResult::ActivateRevision(a) => {
            assert!(
                !a.restarted && !a.unit_changed && a.restored.is_none(),
                "{a:?}"
            );
            assert_eq!(
                a.observation.served.as_ref().map(Ident::as_str),
                Some("rev-1")
            );
        }
        other => panic!("{other:?}"),
    }
    // Not served any more (the gateway went down): the slow path runs and restarts it.
    h.fake.stop_unit(&unit, Duration::from_secs(1)).unwrap();
    let ran = h.changes(activate("ns1", "a1", "rev-1", 1), Some(5));
    assert!(
        ran.calls.iter().any(|c| c.starts_with("restart ")),
        "{ran:?}"
    );
}

#[test]
fn stopping_a_stopped_agent_writes_nothing() {
    let h = serving();
    // Stopping the running revision changes things.
    let ran = h.changes(stop("ns1", "a1", "rev-1", 1), Some(5));
    assert!(ran.calls.iter().any(|c| c.starts_with("stop ")), "{ran:?}");
    match h.noop(stop("ns1", "a1", "rev-1", 1), Some(5)) {
        OperationResult::StopRevision(s) => {
            assert!(!s.stopped && s.observation.current.is_none(), "{s:?}")
        }
        other => panic!("{other:?}"),
    }
    // An Agent the host never had: nothing to stop, no commit, no fsync or rename (the lock
    // file the Agent lock made is unlinked again, so nothing is left behind), unless the stop
    // carries a fence, which is recorded for the Agent even so (durably, without a commit).
    let ghost = h.counted(stop("ns1", "ghost", "rev-1", 1), None);
    assert!(
        matches!(&ghost.result, Ok(OperationResult::StopRevision(s)) if !s.stopped),
        "{ghost:?}"
    );
    assert_eq!(
        (ghost.commits, ghost.io.fsyncs, ghost.io.renames),
        (0, 0, 0),
        "{ghost:?}"
    );
    assert!(ghost.calls.is_empty(), "{ghost:?}");
    // Its first record is a new file: written, synced, renamed into place, directory synced.
    let fenced = h.counted(stop("ns1", "ghost", "rev-1", 1), Some(5));
    assert!(
        matches!(&fenced.result, Ok(OperationResult::StopRevision(s)) if !s.stopped),
        "{fenced:?}"
    );
    assert_eq!(
        (fenced.commits, fenced.io.fsyncs, fenced.io.renames),
        (0, 2, 1),
        "{fenced:?}"
    );
    assert!(fenced.calls.is_empty(), "{fenced:?}");
    assert_eq!(h.fence_of("ns1", "ghost"), Some(5));
    // Later raises overwrite it in place.
    h.fenced_noop(stop("ns1", "ghost", "rev-1", 1), 6);
    assert_eq!(h.fence_of("ns1", "ghost"), Some(6));
}

#[test]
fn changing_operations_commit_before_their_first_write() {
    let h = Host::new();
    h.changes(ensure("ns1"), None);
    h.changes(prepare("ns1", "a1", "rev-1", 1), Some(5));
    let ran = h.changes(activate("ns1", "a1", "rev-1", 1), Some(5));
    assert!(
        ran.calls.iter().any(|c| c.starts_with("restart ")),
        "{ran:?}"
    );
    // A new revision.
    h.changes(prepare("ns1", "a1", "rev-2", 2), Some(5));
    // The same prepare with a higher fence is a no-op that records the fence.
    h.fenced_noop(prepare("ns1", "a1", "rev-2", 2), 6);
    h.noop(prepare("ns1", "a1", "rev-2", 2), Some(6));
    // A prepare whose password file went missing recreates it.
    let paths = h.layout().agent(&id("ns1"), &id("a1"));
    std::fs::remove_file(&paths.password_file).unwrap();
    h.changes(prepare("ns1", "a1", "rev-2", 2), Some(6));
    assert!(paths.password_file.exists());
    h.changes(
        Operation::RetireRevision(rargs("ns1", "a1", "rev-2", 2)),
        Some(6),
    );
}

#[test]
fn a_stale_fence_is_refused_without_a_write_or_a_commit() {
    let h = serving();
    for op in [
        prepare("ns1", "a1", "rev-1", 1),
        activate("ns1", "a1", "rev-1", 1),
        stop("ns1", "a1", "rev-1", 1),
    ] {
        let ran = h.counted(op, Some(4));
        assert_eq!(
            ran.result.as_ref().map_err(|f| f.code).err(),
            Some(FailureCode::FenceStale),
            "{ran:?}"
        );
        assert_eq!(ran.commits, 0, "{ran:?}");
        assert!(ran.io.is_zero() && ran.calls.is_empty(), "{ran:?}");
    }
}

impl Host {
    /// Runs `op` under `fence`, higher than the Agent's: it must take the fast path (no
    /// commit, no systemd change) and write the fence record durably, nothing else.
    fn fenced_noop(&self, op: Operation, fence: u64) -> OperationResult {
        let kind = op.kind();
        let ran = self.counted(op, Some(fence));
        assert_eq!(ran.commits, 0, "{kind} committed: {ran:?}");
        assert!(ran.calls.is_empty(), "{kind} changed systemd: {ran:?}");
        // The fence record overwritten in place: one sync, no rename.
        assert_eq!(
            (ran.io.fsyncs, ran.io.renames),
            (1, 0),
            "{kind} wrote more than the fence: {ran:?}"
        );
        match ran.result {
            Ok(r) => r,
            Err(f) => panic!("{kind} failed: {f}"),
        }
    }

    fn fence_of(&self, n: &str, a: &str) -> Option<u64> {
        let paths = self.layout().agent(&id(n), &id(a));
        crate::markers::read_optional::<crate::markers::FenceMarker>(&paths.fence, "fence")
            .unwrap()
            .map(|m| m.fence)
    }
}

/// Issue 34: the worker raises the fence on every claim, so its prepare never took the no-op
/// fast path. An unchanged prepare (or activate, or stop) under a higher fence answers from
/// the fast path, as the slow path would, after recording the fence durably; a lower fence
/// is still refused, and an equal one writes nothing.
#[test]
fn a_no_op_under_a_higher_fence_records_the_fence_and_takes_the_fast_path() {
    let h = serving();
    let slow = h.ok_fenced(prepare("ns1", "a1", "rev-1", 1), 5);
    let fast = h.fenced_noop(prepare("ns1", "a1", "rev-1", 1), 6);
    assert_eq!(fast, slow);
    assert_eq!(h.fence_of("ns1", "a1"), Some(6));
    // The claim it superseded is refused, before anything is written.
    let stale = h.counted(prepare("ns1", "a1", "rev-1", 1), Some(5));
    assert_eq!(
        stale.result.as_ref().map_err(|f| f.code).err(),
        Some(FailureCode::FenceStale),
        "{stale:?}"
    );
    assert!(stale.io.is_zero() && stale.commits == 0, "{stale:?}");
    h.noop(prepare("ns1", "a1", "rev-1", 1), Some(6));
    // Activate of the served revision and the stop of one not running, each a new claim.
    match h.fenced_noop(activate("ns1", "a1", "rev-1", 1), 7) {
        OperationResult::ActivateRevision(a) => assert!(!a.restarted, "{a:?}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(h.fence_of("ns1", "a1"), Some(7));
    h.fenced_noop(stop("ns1", "a1", "rev-9", 9), 8);
    assert_eq!(h.fence_of("ns1", "a1"), Some(8));
    for op in [
        prepare("ns1", "a1", "rev-1", 1),
        activate("ns1", "a1", "rev-1", 1),
    ] {
        let ran = h.counted(op, Some(7));
        assert_eq!(
            ran.result.as_ref().map_err(|f| f.code).err(),
            Some(FailureCode::FenceStale),
            "{ran:?}"
        );
    }
    // An older candidate under a new claim: not ready, fence recorded, as the slow path does.
    h.ok_fenced(prepare("ns1", "a1", "rev-2", 2), 8);
    h.ok_fenced(activate("ns1", "a1", "rev-2", 2), 8);
    match h.fenced_noop(prepare("ns1", "a1", "rev-1", 1), 9) {
        OperationResult::PrepareRevision(p) => assert!(!p.ready && !p.created, "{p:?}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(h.fence_of("ns1", "a1"), Some(9));
    // Something to do under a higher fence still goes the slow way, and records the fence.
    h.changes(prepare("ns1", "a1", "rev-3", 3), Some(10));
    assert_eq!(h.fence_of("ns1", "a1"), Some(10));
}

fn retire(n: &str, a: &str, rev: &str, number: u64) -> Operation {
    Operation::RetireRevision(rargs(n, a, rev, number))
}

/// Issue 34: a retire of a revision the host does not hold (a retry, or a revision superseded
/// before it reached the host) costs reads alone; one that removes a snapshot or stops the
/// running revision still commits first, and a stale fence is refused without a write.
#[test]
fn retiring_a_revision_the_host_does_not_hold_writes_nothing() {
    let h = serving();
    h.ok_fenced(prepare("ns1", "a1", "rev-2", 2), 5);
    // rev-2 is on the host, not current: removed, the slow way.
    let ran = h.changes(retire("ns1", "a1", "rev-2", 2), Some(5));
    assert!(
        matches!(&ran.result, Ok(OperationResult::RetireRevision(r)) if r.removed && !r.stopped),
        "{ran:?}"
    );
    // Again: nothing to remove, no commit, no write, no systemd call.
    match h.noop(retire("ns1", "a1", "rev-2", 2), Some(5)) {
        OperationResult::RetireRevision(r) => {
            assert!(!r.removed && !r.stopped, "{r:?}");
            assert_eq!(r.observation.current, Some(id("rev-1")), "{r:?}");
        }
        other => panic!("{other:?}"),
    }
    // Never prepared here, under a new claim: the fence is recorded, nothing else.
    match h.fenced_noop(retire("ns1", "a1", "rev-7", 7), 6) {
        OperationResult::RetireRevision(r) => assert!(!r.removed, "{r:?}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(h.fence_of("ns1", "a1"), Some(6));
    let stale = h.counted(retire("ns1", "a1", "rev-7", 7), Some(5));
    assert_eq!(
        stale.result.as_ref().map_err(|f| f.code).err(),
        Some(FailureCode::FenceStale),
        "{stale:?}"
    );
    assert!(stale.io.is_zero() && stale.commits == 0, "{stale:?}");
    // The running revision: stopped and removed, the slow way.
    let ran = h.changes(retire("ns1", "a1", "rev-1", 1), Some(6));
    assert!(
        matches!(&ran.result, Ok(OperationResult::RetireRevision(r)) if r.removed && r.stopped),
        "{ran:?}"
    );
    assert!(ran.calls.iter().any(|c| c.starts_with("stop ")), "{ran:?}");
}
