//! Issue 13 over the fake layer: hostd keeps the highest fence per Agent and refuses lower
//! ones (and, once an Agent is fenced, unfenced ones) before anything changes.

use std::os::unix::fs::MetadataExt;

use super::*;

fn stop(n: &str, a: &str, rev: &str, number: u64) -> Operation {
    Operation::StopRevision(rargs(n, a, rev, number))
}

fn retire(n: &str, a: &str, rev: &str, number: u64) -> Operation {
    Operation::RetireRevision(rargs(n, a, rev, number))
}

fn delete_agent(n: &str, a: &str) -> Operation {
    Operation::DeleteAgent(AgentArgs {
        namespace: ns(n),
        agent: agent(a),
    })
}

impl Host {
    fn ok_at(&self, op: Operation, fence: Option<u64>) -> OperationResult {
        match self.run_fenced(op.clone(), fence) {
            Ok(r) => r,
            Err(f) => panic!("{} at fence {fence:?} failed: {f}", op.kind()),
        }
    }

    fn fails_at(&self, op: Operation, fence: Option<u64>) -> Failure {
        match self.run_fenced(op.clone(), fence) {
            Ok(r) => panic!("{} at fence {fence:?} should fail, got {r:?}", op.kind()),
            Err(f) => f,
        }
    }

    fn paths(&self, n: &str, a: &str) -> AgentPaths {
        self.layout().agent(&id(n), &id(a))
    }

    /// The fence recorded for an Agent, `None` when it has no record.
    fn recorded_fence(&self, n: &str, a: &str) -> Option<u64> {
        let path = self.paths(n, a).fence;
        let bytes = match std::fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
            Err(e) => panic!("{}: {e}", path.display()),
        };
        let record: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(record["schema"], 1);
        assert_eq!(record["namespaceId"], n);
        assert_eq!(record["agentId"], a);
        Some(record["fence"].as_u64().unwrap())
    }
}

fn current_of(paths: &AgentPaths) -> std::path::PathBuf {
    std::fs::read_link(&paths.current).unwrap()
}

fn assert_stale(f: &Failure, seen: u64, stored: u64) {
    assert_eq!(f.code, FailureCode::FenceStale, "{f}");
    assert!(
        f.message.contains(&format!("fence {seen} "))
            && f.message.contains(&format!("fence {stored},")),
        "the refusal names both fences: {f}"
    );
}

#[test]
fn a_higher_fence_is_stored_and_a_lower_one_refused_before_anything_changes() {
    let h = Host::new();
    h.ok(ensure("ns1"));
    h.ok_at(prepare("ns1", "a1", "rev-1", 1), Some(5));
    assert_eq!(h.recorded_fence("ns1", "a1"), Some(5));
    h.ok_at(activate("ns1", "a1", "rev-1", 1), Some(5));
    h.ok_at(prepare("ns1", "a1", "rev-2", 2), Some(7));
    assert_eq!(h.recorded_fence("ns1", "a1"), Some(7));
    let paths = h.paths("ns1", "a1");
    let served_before = std::fs::read(&paths.served).unwrap();
    let current_before = current_of(&paths);
    assert_eq!(
        current_before,
        AgentPaths::current_target(&id("rev-1")),
        "rev-1 serves"
    );

    // A coordinator still at fence 6 (its claim lapsed; another took over at 7).
    h.fake.clear_calls();
    for op in [
        activate("ns1", "a1", "rev-2", 2),
        prepare("ns1", "a1", "rev-3", 3),
        stop("ns1", "a1", "rev-1", 1),
        retire("ns1", "a1", "rev-2", 2),
        delete_agent("ns1", "a1"),
    ] {
        let kind = op.kind();
        let f = h.fails_at(op, Some(6));
        assert_stale(&f, 6, 7);
        assert!(f.message.contains("a1"), "{kind}: {f}");
    }
    assert!(h.fake.calls().is_empty(), "{:?}", h.fake.calls());
    assert_eq!(current_of(&paths), current_before, "current did not move");
    assert_eq!(std::fs::read(&paths.served).unwrap(), served_before);
    assert!(paths.revision_dir(&id("rev-2")).exists());
    assert!(!paths.revision_dir(&id("rev-3")).exists());
    assert_eq!(h.recorded_fence("ns1", "a1"), Some(7), "the record is kept");

    // The current claim goes on, and a later one is stored.
    h.ok_at(activate("ns1", "a1", "rev-2", 2), Some(7));
    assert_eq!(current_of(&paths), AgentPaths::current_target(&id("rev-2")));
    h.ok_at(stop("ns1", "a1", "rev-2", 2), Some(9));
    assert_eq!(h.recorded_fence("ns1", "a1"), Some(9));

    // Fences are per Agent: another Agent is not held back by a1's.
    h.ok_at(prepare("ns1", "a2", "rev-1", 1), Some(2));
    assert_eq!(h.recorded_fence("ns1", "a2"), Some(2));
}

#[test]
fn an_equal_fence_is_accepted_without_writing_the_record() {
    let h = Host::new();
    h.ok(ensure("ns1"));
    h.ok_at(prepare("ns1", "a1", "rev-1", 1), Some(4));
    let record = h.paths("ns1", "a1").fence;
    let before = std::fs::metadata(&record).unwrap();
    h.ok_at(prepare("ns1", "a1", "rev-1", 1), Some(4));
    h.ok_at(activate("ns1", "a1", "rev-1", 1), Some(4));
    h.ok_at(activate("ns1", "a1", "rev-1", 1), Some(4));
    let after = std::fs::metadata(&record).unwrap();
    // A write changes the modification time (in place) or the inode (a rename).
    assert_eq!(
        (before.ino(), before.mtime(), before.mtime_nsec()),
        (after.ino(), after.mtime(), after.mtime_nsec()),
        "an equal fence must not rewrite the record"
    );
    assert_eq!(h.recorded_fence("ns1", "a1"), Some(4));
    assert_eq!(
        crate::fsutil::pending_leftovers(&h.layout().fences_dir()),
        Vec::<std::path::PathBuf>::new()
    );
}

/// Issue 34: the worker raises the fence at every claim, so the first call of every deploy
/// raises it. Over a record of the fixed size that costs one sync and no rename (measured
/// against the same idempotent prepare at an equal fence); a record an older hostd wrote (no
/// padding) is rewritten once by rename, then in place.
#[test]
fn a_raise_overwrites_the_record_in_place_with_one_sync() {
    use crate::fsutil::counters;
    let h = Host::new();
    h.ok(ensure("ns1"));
    h.ok_at(prepare("ns1", "a1", "rev-1", 1), Some(4));
    let record = h.paths("ns1", "a1").fence;
    let first = std::fs::metadata(&record).unwrap();
    assert_eq!(first.len(), crate::engine::fence::RECORD_LEN as u64);

    counters::reset();
    h.ok_at(prepare("ns1", "a1", "rev-1", 1), Some(5));
    let raised = counters::get();
    counters::reset();
    h.ok_at(prepare("ns1", "a1", "rev-1", 1), Some(5));
    let equal = counters::get();
    assert_eq!(
        raised.fsyncs,
        equal.fsyncs + 1,
        "{raised:?} against {equal:?}"
    );
    assert_eq!(
        raised.renames, equal.renames,
        "{raised:?} against {equal:?}"
    );
    assert_eq!(raised.other, equal.other, "{raised:?} against {equal:?}");
    let after = std::fs::metadata(&record).unwrap();
    assert_eq!(
        after.ino(),
        first.ino(),
        "the record was replaced, not overwritten"
    );
    assert_eq!(after.len(), first.len());
    assert_eq!(h.recorded_fence("ns1", "a1"), Some(5));

    // A record as an older hostd wrote it: compact, no padding.
    let old = serde_json::to_vec_pretty(&serde_json::json!({
        "schema": 1, "namespaceId": "ns1", "agentId": "a1", "fence": 5,
    }))
    .unwrap();
    std::fs::write(&record, &old).unwrap();
    h.ok_at(prepare("ns1", "a1", "rev-1", 1), Some(6));
    let rewritten = std::fs::metadata(&record).unwrap();
    assert_eq!(rewritten.len(), crate::engine::fence::RECORD_LEN as u64);
    assert_eq!(h.recorded_fence("ns1", "a1"), Some(6));
    h.ok_at(prepare("ns1", "a1", "rev-1", 1), Some(7));
    assert_eq!(std::fs::metadata(&record).unwrap().ino(), rewritten.ino());
    assert_eq!(h.recorded_fence("ns1", "a1"), Some(7));
    // A lower fence is still refused against what was written in place.
    assert_stale(&h.fails_at(prepare("ns1", "a1", "rev-1", 1), Some(6)), 6, 7);
}

#[test]
fn an_unfenced_operation_is_refused_once_the_agent_is_fenced() {
    let h = Host::new();
    h.ok(ensure("ns1"));
    h.ok_at(prepare("ns1", "a1", "rev-1", 1), Some(3));
    h.ok_at(activate("ns1", "a1", "rev-1", 1), Some(3));
    let paths = h.paths("ns1", "a1");
    h.fake.clear_calls();
    for op in [
        stop("ns1", "a1", "rev-1", 1),
        prepare("ns1", "a1", "rev-2", 2),
        delete_agent("ns1", "a1"),
    ] {
        let f = h.fails_at(op, None);
        assert_eq!(f.code, FailureCode::FenceStale, "{f}");
        assert!(
            f.message.contains("no fence") && f.message.contains("fence 3"),
            "{f}"
        );
    }
    assert!(h.fake.calls().is_empty(), "{:?}", h.fake.calls());
    assert_eq!(current_of(&paths), AgentPaths::current_target(&id("rev-1")));
    assert!(paths.dir.exists() && !paths.revision_dir(&id("rev-2")).exists());
    assert_eq!(h.recorded_fence("ns1", "a1"), Some(3));
}

fn delete_namespace(n: &str) -> Operation {
    Operation::DeleteNamespace(NamespaceArgs { namespace: ns(n) })
}

/// Issue 27: an unfenced (version 1) or stale `delete-namespace` removed a serving Agent
/// fenced at 100 right after a stale `delete-agent` for it had been refused. It is now checked
/// against the fence of every Agent it would remove, before its hooks and again under the
/// Agent locks; a current fence removes the Namespace and raises the records.
#[test]
fn delete_namespace_is_refused_for_a_fenced_agent_unless_its_fence_is_current() {
    let h = Host::new();
    h.ok(ensure("ns1"));
    h.ok_at(prepare("ns1", "a1", "rev-1", 1), Some(100));
    h.ok_at(activate("ns1", "a1", "rev-1", 1), Some(100));
    // An Agent that never had a fence, in the same Namespace.
    h.ok_at(prepare("ns1", "a2", "rev-1", 1), None);
    let paths = h.paths("ns1", "a1");
    assert_stale(&h.fails_at(delete_agent("ns1", "a1"), Some(50)), 50, 100);
    h.fake.clear_calls();
    let f = h.fails_at(delete_namespace("ns1"), None);
    assert_eq!(f.code, FailureCode::FenceStale, "{f}");
    assert!(
        f.message.contains("no fence") && f.message.contains("fence 100"),
        "{f}"
    );
    assert_stale(&h.fails_at(delete_namespace("ns1"), Some(99)), 99, 100);
    assert!(h.fake.calls().is_empty(), "{:?}", h.fake.calls());
    assert!(paths.dir.exists() && paths.unit_file.exists());
    assert_eq!(current_of(&paths), AgentPaths::current_target(&id("rev-1")));
    assert!(h.paths("ns1", "a2").dir.exists());
    assert_eq!(h.recorded_fence("ns1", "a1"), Some(100));
    match h.ok_at(delete_namespace("ns1"), Some(101)) {
        OperationResult::DeleteNamespace(r) => {
            assert!(r.removed);
            assert_eq!(r.agents_removed, 2);
        }
        other => panic!("{other:?}"),
    }
    assert!(!paths.dir.exists() && !paths.unit_file.exists());
    assert_eq!(h.recorded_fence("ns1", "a1"), Some(101));
    assert_eq!(h.recorded_fence("ns1", "a2"), Some(101));
    // A Namespace whose Agents were all deleted needs no fence (the coordinator's own case).
    h.ok(ensure("ns2"));
    h.ok_at(prepare("ns2", "b1", "rev-1", 1), Some(200));
    h.ok_at(delete_agent("ns2", "b1"), Some(201));
    h.ok_at(delete_namespace("ns2"), None);
}

/// Issue 27: a fenced prepare refused for a full port range, a full host, a foreign account
/// or a missing gateway wrote a fence record for an Agent that never existed. The record is
/// written only once every check passed; a refusal for an existing Agent keeps its record.
#[test]
fn a_refused_prepare_leaves_no_fence_record() {
    let refused = |h: &Host, a: &str, code: FailureCode| {
        let f = h.fails_at(prepare("ns1", a, "r1", 1), Some(5));
        assert_eq!(f.code, code, "{f}");
        assert_eq!(h.recorded_fence("ns1", a), None, "{code:?}");
        assert_nothing_of(h, a);
    };
    let h = Host::with_config("port_range = [20000, 20000]");
    h.ok(ensure("ns1"));
    h.ok_at(prepare("ns1", "a1", "r1", 1), Some(4));
    refused(&h, "a2", FailureCode::PortRangeExhausted);

    let h = Host::with_config("max_agents = 1");
    h.ok(ensure("ns1"));
    h.ok_at(prepare("ns1", "a1", "r1", 1), Some(4));
    refused(&h, "a2", FailureCode::HostFull);

    let mut h = Host::new();
    h.ok(ensure("ns1"));
    let account = h.paths("ns1", "a3").account;
    h.fake.add_foreign_user(
        &account,
        Ids {
            uid: 4242,
            gid: 4242,
        },
    );
    let f = h.fails_at(prepare("ns1", "a3", "r1", 1), Some(5));
    assert_eq!(f.code, FailureCode::OwnershipMismatch, "{f}");
    assert_eq!(h.recorded_fence("ns1", "a3"), None);

    h.ok_at(prepare("ns1", "a1", "r1", 1), Some(4));
    h.config.gateway_command[0] = "/nonexistent/node".to_owned();
    refused(&h, "a2", FailureCode::GatewayCommandMissing);
    // An existing Agent's record stays as it was.
    assert_eq!(
        h.fails_at(prepare("ns1", "a1", "r2", 2), Some(6)).code,
        FailureCode::GatewayCommandMissing
    );
    assert_eq!(h.recorded_fence("ns1", "a1"), Some(4));
}

#[test]
fn a_never_fenced_agent_accepts_unfenced_operations_and_gets_no_record() {
    let h = Host::new();
    h.ok(ensure("ns1"));
    h.ok_at(prepare("ns1", "a1", "rev-1", 1), None);
    h.ok_at(activate("ns1", "a1", "rev-1", 1), None);
    h.ok_at(stop("ns1", "a1", "rev-1", 1), None);
    h.ok_at(delete_agent("ns1", "a1"), None);
    assert_eq!(h.recorded_fence("ns1", "a1"), None);
    assert!(
        !h.layout().fences_dir().exists(),
        "nothing fenced, nothing written"
    );
    // Upgrading the coordinator: the first fenced operation starts the record.
    h.ok_at(prepare("ns1", "a1", "rev-1", 1), Some(1));
    assert_eq!(h.recorded_fence("ns1", "a1"), Some(1));
}

#[test]
fn the_record_outlives_delete_agent_so_a_stale_coordinator_cannot_recreate_the_agent() {
    let h = Host::new();
    h.ok(ensure("ns1"));
    h.ok_at(prepare("ns1", "a1", "rev-1", 1), Some(10));
    h.ok_at(delete_agent("ns1", "a1"), Some(11));
    let paths = h.paths("ns1", "a1");
    assert!(!paths.dir.exists());
    assert_eq!(h.recorded_fence("ns1", "a1"), Some(11));
    assert_stale(
        &h.fails_at(prepare("ns1", "a1", "rev-1", 1), Some(10)),
        10,
        11,
    );
    assert!(!paths.dir.exists(), "the stale prepare created nothing");
    assert!(!h.layout().port_file(18700).exists());
    // Re-created by the coordinator: its global counter gives higher fences.
    h.ok_at(prepare("ns1", "a1", "rev-1", 1), Some(12));
    assert!(paths.dir.exists());
    assert_eq!(h.recorded_fence("ns1", "a1"), Some(12));
}

#[test]
fn a_malformed_or_foreign_record_is_refused_naming_the_file_and_left_as_it_is() {
    let h = Host::new();
    h.ok(ensure("ns1"));
    let paths = h.paths("ns1", "a1");
    std::fs::create_dir_all(h.layout().fences_dir()).unwrap();
    let shown = paths.fence.display().to_string();
    let foreign = serde_json::json!({
        "schema": 1, "namespaceId": "ns1", "agentId": "other", "fence": 1
    })
    .to_string();
    for bad in [
        "not json".to_owned(),
        r#"{"schema": 1, "namespaceId": "ns1", "agentId": "a1", "fence": -1}"#.to_owned(),
        r#"{"schema": 2, "namespaceId": "ns1", "agentId": "a1", "fence": 1}"#.to_owned(),
        foreign,
    ] {
        std::fs::write(&paths.fence, &bad).unwrap();
        for fence in [Some(9), None] {
            let f = h.fails_at(prepare("ns1", "a1", "rev-1", 1), fence);
            assert_eq!(f.code, FailureCode::OwnershipMismatch, "{bad}: {f}");
            assert!(f.message.contains(&shown), "{bad}: names the file: {f}");
            assert_eq!(std::fs::read_to_string(&paths.fence).unwrap(), bad);
            assert!(!paths.dir.exists(), "nothing prepared");
        }
    }
    // A directory where the record belongs is refused too, and stays.
    std::fs::remove_file(&paths.fence).unwrap();
    std::fs::create_dir(&paths.fence).unwrap();
    let f = h.fails_at(prepare("ns1", "a1", "rev-1", 1), Some(9));
    assert!(f.message.contains(&shown), "{f}");
    assert!(paths.fence.is_dir() && !paths.dir.exists());
}

/// Issue 27: with an Agent's fence record unreadable every change of the Agent fails, and
/// `status` reported no problem. It names the file (and so for a deleted Agent's record,
/// which would refuse re-creating it).
#[test]
fn status_reports_an_unreadable_fence_record() {
    let h = Host::new();
    h.ok(ensure("ns1"));
    h.ok_at(prepare("ns1", "a1", "rev-1", 1), Some(3));
    h.ok_at(prepare("ns1", "a2", "rev-1", 1), Some(3));
    h.ok_at(delete_agent("ns1", "a2"), Some(4));
    for a in ["a1", "a2"] {
        std::fs::write(h.paths("ns1", a).fence, b"{not json").unwrap();
    }
    assert_eq!(
        h.fails_at(prepare("ns1", "a1", "rev-2", 2), Some(5)).code,
        FailureCode::OwnershipMismatch
    );
    let problems = match h.ok(Operation::Status(StatusArgs::default())) {
        OperationResult::Status(inv) => inv.problems,
        other => panic!("{other:?}"),
    };
    for a in ["a1", "a2"] {
        let path = h.paths("ns1", a).fence.display().to_string();
        let found: Vec<_> = problems.iter().filter(|p| p.path == path).collect();
        assert_eq!(found.len(), 1, "{a}: {problems:?}");
        assert!(found[0].message.contains("refused"), "{:?}", found[0]);
    }
    // One Namespace's view shows its listed Agent's record too.
    let problems = match h.ok(Operation::Status(StatusArgs {
        namespace_id: Some(id("ns1")),
    })) {
        OperationResult::Status(inv) => inv.problems,
        other => panic!("{other:?}"),
    };
    let path = h.paths("ns1", "a1").fence.display().to_string();
    assert!(problems.iter().any(|p| p.path == path), "{problems:?}");
}

/// Issue 27: a refused `plan-revision` reported a new Agent's defaults (account: create,
/// port: null) for an Agent that exists. It reports what is on the host.
#[test]
fn a_refused_plan_reports_the_agent_as_it_is() {
    use clawfleet_protocol::plan::{Change, PlanArgs};
    let mut h = Host::new();
    h.ok(ensure("ns1"));
    let port = port_of(&h.ok(prepare("ns1", "a1", "rev-1", 1)));
    h.ok(activate("ns1", "a1", "rev-1", 1));
    h.config.gateway_command[0] = "/nonexistent/node".to_owned();
    let plan = match h.ok(Operation::PlanRevision(PlanArgs {
        namespace: ns("ns1"),
        agent: agent("a1"),
        revision: spec("rev-1", 1),
        restore: None,
        egress: None,
    })) {
        OperationResult::PlanRevision(p) => *p,
        other => panic!("{other:?}"),
    };
    let refusal = plan.refusal.as_ref().expect("refused");
    assert_eq!(
        refusal.code,
        FailureCode::GatewayCommandMissing,
        "{refusal}"
    );
    assert_eq!(plan.account, Change::Keep, "{plan:?}");
    assert_eq!(plan.agent_directory, Change::Keep, "{plan:?}");
    assert_eq!(plan.port, Some(port), "{plan:?}");
    assert_eq!(plan.snapshot, Change::Keep, "{plan:?}");
    assert_eq!(plan.password_file, Change::Keep, "{plan:?}");
    assert_ne!(plan.unit_file, Change::Create, "{plan:?}");
}
