//! The operation logic over the fake privileged layer: every operation and every refusal.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::{Duration, Instant};

use clawfleet_protocol::failure::FailureCode;
use clawfleet_protocol::operation::*;
use clawfleet_protocol::result::*;
use clawfleet_protocol::{Configuration, Failure, Fingerprint, Ident, Operation, OperationId};
use serde_json::json;

use super::{Ctx, Engine};
use crate::config::Config;
use crate::fake::{Behaviour, FakeSystem};
use crate::journal::Journal;
use crate::layout::Layout;
use crate::system::{Ids, System};

struct Host {
    _dir: tempfile::TempDir,
    config: Config,
    fake: FakeSystem,
    journal: Journal,
}

impl Host {
    fn new() -> Self {
        Self::with_config("")
    }

    fn with_config(extra: &str) -> Self {
        // Not under /tmp: the configuration refuses state roots there.
        let base = Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .unwrap()
            .join("target");
        std::fs::create_dir_all(&base).unwrap();
        let dir = tempfile::Builder::new()
            .prefix("hostd-test-")
            .tempdir_in(&base)
            .unwrap();
        let root = dir.path().join("state");
        let units = dir.path().join("units");
        std::fs::create_dir_all(&units).unwrap();
        let text = format!(
            "host_name = \"h1\"\nstate_root = \"{}\"\nunit_dir = \"{}\"\ngateway_command = [\"/usr/bin/gw\"]\n{extra}\n[limits]\nlock_timeout_ms = 300\nreadiness_timeout_ms = 400\n",
            root.display(),
            units.display()
        );
        let config = Config::parse(&text, "test", || None).unwrap();
        let journal = Journal::open(&dir.path().join("journal"), 100).unwrap();
        Self {
            fake: FakeSystem::new(&units),
            _dir: dir,
            config,
            journal,
        }
    }

    fn engine(&self) -> Engine<'_> {
        Engine::new(
            &self.config,
            &self.fake as &dyn System,
            Fingerprint::new(format!("SHA256:{}", "A".repeat(43))).unwrap(),
        )
    }

    fn layout(&self) -> Layout {
        Layout::new(&self.config.state_root, &self.config.unit_dir)
    }

    fn run(&self, op: Operation) -> Result<OperationResult, Failure> {
        let mut steps = Vec::new();
        let cancelled = || false;
        let mut on_step = |s: Step| steps.push(s);
        let mut ctx = Ctx::new(
            OperationId::new("op-test").unwrap(),
            Instant::now() + Duration::from_secs(30),
            1_800_000_000,
            &cancelled,
            &mut on_step,
        );
        self.engine().execute(&op, &mut ctx, &self.journal)
    }

    fn ok(&self, op: Operation) -> OperationResult {
        match self.run(op.clone()) {
            Ok(r) => r,
            Err(f) => panic!("{} failed: {f}", op.kind()),
        }
    }

    fn fails(&self, op: Operation) -> Failure {
        match self.run(op.clone()) {
            Ok(r) => panic!("{} should fail, got {r:?}", op.kind()),
            Err(f) => f,
        }
    }
}

fn id(s: &str) -> Ident {
    Ident::new(s).unwrap()
}

fn ns(n: &str) -> NamespaceRef {
    NamespaceRef {
        id: id(n),
        name: id(&format!("{n}-name")),
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

fn ensure(n: &str) -> Operation {
    Operation::EnsureNamespace(NamespaceArgs { namespace: ns(n) })
}

fn prepare(n: &str, a: &str, rev: &str, number: u64) -> Operation {
    Operation::PrepareRevision(PrepareArgs {
        namespace: ns(n),
        agent: agent(a),
        revision: spec(rev, number),
    })
}

fn rargs(n: &str, a: &str, rev: &str, number: u64) -> RevisionArgs {
    RevisionArgs {
        namespace: ns(n),
        agent: agent(a),
        revision: spec(rev, number).reference(),
    }
}

fn activate(n: &str, a: &str, rev: &str, number: u64) -> Operation {
    Operation::ActivateRevision(rargs(n, a, rev, number))
}

fn port_of(r: &OperationResult) -> u16 {
    match r {
        OperationResult::PrepareRevision(p) => p.observation.port.unwrap(),
        other => panic!("{other:?}"),
    }
}

#[test]
fn full_lifecycle_over_the_fake() {
    let h = Host::new();
    let created = h.ok(ensure("ns1"));
    assert!(matches!(
        created,
        OperationResult::EnsureNamespace(EnsureNamespaceResult { created: true, .. })
    ));
    assert!(matches!(
        h.ok(ensure("ns1")),
        OperationResult::EnsureNamespace(EnsureNamespaceResult { created: false, .. })
    ));

    h.fake.clear_calls();
    let p = h.ok(prepare("ns1", "a1", "rev-1", 1));
    assert_eq!(port_of(&p), 18700);
    // Preparation never touches systemd.
    assert!(
        h.fake
            .calls()
            .iter()
            .all(|c| c.starts_with("create-account")),
        "{:?}",
        h.fake.calls()
    );
    let paths = h.layout().agent(&id("ns1"), &id("a1"));
    assert!(!paths.current.exists() && !paths.unit_file.exists());
    let pw = std::fs::read_to_string(&paths.password_file).unwrap();
    assert!(pw.starts_with("OPENCLAW_GATEWAY_PASSWORD=") && pw.len() == 27 + 64);
    assert_eq!(
        std::fs::metadata(&paths.password_file)
            .unwrap()
            .permissions()
            .mode()
            & 0o777,
        0o600
    );
    let snap = paths.revision_dir(&id("rev-1")).join("openclaw.json");
    assert_eq!(
        std::fs::metadata(&snap).unwrap().permissions().mode() & 0o777,
        0o640
    );

    // Idempotent prepare: nothing new.
    match h.ok(prepare("ns1", "a1", "rev-1", 1)) {
        OperationResult::PrepareRevision(p) => assert!(p.ready && !p.created),
        other => panic!("{other:?}"),
    }

    h.fake.clear_calls();
    match h.ok(activate("ns1", "a1", "rev-1", 1)) {
        OperationResult::ActivateRevision(r) => {
            assert!(r.restarted && r.unit_changed);
            assert_eq!(r.observation.current, Some(id("rev-1")));
            assert_eq!(r.observation.served, Some(id("rev-1")));
        }
        other => panic!("{other:?}"),
    }
    let calls = h.fake.calls();
    assert_eq!(calls[0], "daemon-reload");
    assert!(calls[1].starts_with("enable "));
    assert!(calls[2].starts_with("restart "));
    assert_eq!(
        std::fs::read_link(&paths.current).unwrap(),
        Path::new("revisions").join(crate::layout::dir_name(&id("rev-1")))
    );

    // Activating again: fast path, no restart, no reload.
    h.fake.clear_calls();
    match h.ok(activate("ns1", "a1", "rev-1", 1)) {
        OperationResult::ActivateRevision(r) => assert!(!r.restarted && !r.unit_changed),
        other => panic!("{other:?}"),
    }
    assert!(h.fake.calls().is_empty(), "{:?}", h.fake.calls());

    // Revision 2: prepare keeps serving 1; activation is a restart without daemon-reload.
    h.ok(prepare("ns1", "a1", "rev-2", 2));
    assert_eq!(
        std::fs::read_to_string(&paths.password_file).unwrap(),
        pw,
        "password is kept"
    );
    h.fake.clear_calls();
    match h.ok(activate("ns1", "a1", "rev-2", 2)) {
        OperationResult::ActivateRevision(r) => assert!(r.restarted && !r.unit_changed),
        other => panic!("{other:?}"),
    }
    assert!(
        !h.fake.calls().iter().any(|c| c == "daemon-reload"),
        "{:?}",
        h.fake.calls()
    );

    // An older candidate: prepare says not ready, activate is superseded.
    match h.ok(prepare("ns1", "a1", "rev-1", 1)) {
        OperationResult::PrepareRevision(p) => assert!(!p.ready),
        other => panic!("{other:?}"),
    }
    assert_eq!(
        h.fails(activate("ns1", "a1", "rev-1", 1)).code,
        FailureCode::Superseded
    );

    // Retire 1, stop 2 (twice), re-activate 2.
    match h.ok(Operation::RetireRevision(rargs("ns1", "a1", "rev-1", 1))) {
        OperationResult::RetireRevision(r) => assert!(r.removed && !r.stopped),
        other => panic!("{other:?}"),
    }
    assert!(!paths.revision_dir(&id("rev-1")).exists());
    match h.ok(Operation::StopRevision(rargs("ns1", "a1", "rev-2", 2))) {
        OperationResult::StopRevision(r) => {
            assert!(r.stopped);
            assert_eq!(r.observation.current, None);
            assert_eq!(r.observation.served, None);
        }
        other => panic!("{other:?}"),
    }
    match h.ok(Operation::StopRevision(rargs("ns1", "a1", "rev-2", 2))) {
        OperationResult::StopRevision(r) => assert!(!r.stopped),
        other => panic!("{other:?}"),
    }
    assert!(paths.revision_dir(&id("rev-2")).exists() && paths.password_file.exists());
    match h.ok(activate("ns1", "a1", "rev-2", 2)) {
        OperationResult::ActivateRevision(r) => assert!(r.restarted),
        other => panic!("{other:?}"),
    }

    // Status shows it.
    match h.ok(Operation::Status(StatusArgs::default())) {
        OperationResult::Status(inv) => {
            assert!(inv.problems.is_empty(), "{:?}", inv.problems);
            assert_eq!(inv.namespaces.len(), 1);
            let a = &inv.namespaces[0].agents[0];
            assert_eq!(a.observation.served, Some(id("rev-2")));
            assert_eq!(a.revisions.len(), 1);
        }
        other => panic!("{other:?}"),
    }

    // Delete the Agent, then the Namespace.
    let account = paths.account.clone();
    match h.ok(Operation::DeleteAgent(AgentArgs {
        namespace: ns("ns1"),
        agent: agent("a1"),
    })) {
        OperationResult::DeleteAgent(r) => assert!(r.removed),
        other => panic!("{other:?}"),
    }
    assert!(!paths.dir.exists() && !paths.unit_file.exists());
    assert!(!h.fake.has_user(&account) && !h.fake.has_group(&account));
    assert!(!h.layout().port_file(18700).exists());
    match h.ok(Operation::DeleteAgent(AgentArgs {
        namespace: ns("ns1"),
        agent: agent("a1"),
    })) {
        OperationResult::DeleteAgent(r) => assert!(!r.removed),
        other => panic!("{other:?}"),
    }
    match h.ok(Operation::DeleteNamespace(NamespaceArgs {
        namespace: ns("ns1"),
    })) {
        OperationResult::DeleteNamespace(r) => assert!(r.removed),
        other => panic!("{other:?}"),
    }
    assert!(!h.layout().namespace_dir(&id("ns1")).exists());
}

#[test]
fn two_agents_get_distinct_ports_accounts_and_units() {
    let h = Host::new();
    h.ok(ensure("ns1"));
    h.ok(ensure("ns2"));
    let p1 = port_of(&h.ok(prepare("ns1", "a", "r1", 1)));
    let p2 = port_of(&h.ok(prepare("ns2", "a", "r1", 1)));
    assert_ne!(p1, p2);
    let l = h.layout();
    let (a1, a2) = (l.agent(&id("ns1"), &id("a")), l.agent(&id("ns2"), &id("a")));
    assert_ne!(a1.account, a2.account);
    assert_ne!(a1.unit_name, a2.unit_name);
    assert_ne!(
        h.fake.user(&a1.account).unwrap(),
        h.fake.user(&a2.account).unwrap()
    );
}

#[test]
fn prepare_needs_its_namespace_and_refuses_foreign_accounts() {
    let h = Host::new();
    assert_eq!(
        h.fails(prepare("ns1", "a1", "r1", 1)).code,
        FailureCode::NamespaceMissing
    );
    h.ok(ensure("ns1"));
    let account = h.layout().agent(&id("ns1"), &id("a1")).account;
    h.fake.add_foreign_user(
        &account,
        Ids {
            uid: 1234,
            gid: 1234,
        },
    );
    let f = h.fails(prepare("ns1", "a1", "r1", 1));
    assert_eq!(f.code, FailureCode::OwnershipMismatch);
    assert!(f.message.contains("refusing to adopt"), "{}", f.message);
    assert!(!h.layout().agent(&id("ns1"), &id("a1")).dir.exists());
}

#[test]
fn a_namespace_with_another_name_is_refused() {
    let h = Host::new();
    h.ok(ensure("ns1"));
    let other = NamespaceRef {
        id: id("ns1"),
        name: id("renamed"),
    };
    let f = h.fails(Operation::EnsureNamespace(NamespaceArgs {
        namespace: other,
    }));
    assert_eq!(f.code, FailureCode::OwnershipMismatch);
}

#[test]
fn a_different_service_principal_is_refused() {
    let h = Host::new();
    h.ok(ensure("ns1"));
    h.ok(prepare("ns1", "a1", "r1", 1));
    let mut op = match prepare("ns1", "a1", "r1", 1) {
        Operation::PrepareRevision(a) => a,
        _ => unreachable!(),
    };
    op.agent.service_principal_id = id("someone-else");
    assert_eq!(
        h.fails(Operation::PrepareRevision(op)).code,
        FailureCode::OwnershipMismatch
    );
}

#[test]
fn snapshots_are_immutable() {
    let h = Host::new();
    h.ok(ensure("ns1"));
    h.ok(prepare("ns1", "a1", "r1", 1));
    // Same id, other content.
    let mut other = spec("r1", 1);
    other.configuration = Configuration::new(json!({"gateway": {"mode": "local"}})).unwrap();
    other.configuration_hash = other.configuration.hash();
    let f = h.fails(Operation::PrepareRevision(PrepareArgs {
        namespace: ns("ns1"),
        agent: agent("a1"),
        revision: other,
    }));
    assert_eq!(f.code, FailureCode::SnapshotMismatch);
    // Tampered bytes on disk.
    let snap = h
        .layout()
        .agent(&id("ns1"), &id("a1"))
        .revision_dir(&id("r1"))
        .join("openclaw.json");
    let mut perms = std::fs::metadata(&snap).unwrap().permissions();
    perms.set_mode(0o644);
    std::fs::set_permissions(&snap, perms).unwrap();
    std::fs::write(&snap, b"{\"gateway\":{\"mode\":\"remote\"}}").unwrap();
    assert_eq!(
        h.fails(activate("ns1", "a1", "r1", 1)).code,
        FailureCode::SnapshotMismatch
    );
    assert_eq!(
        h.fails(prepare("ns1", "a1", "r1", 1)).code,
        FailureCode::SnapshotMismatch
    );
}

#[test]
fn activation_of_an_unprepared_revision_is_refused() {
    let h = Host::new();
    h.ok(ensure("ns1"));
    h.ok(prepare("ns1", "a1", "r1", 1));
    assert_eq!(
        h.fails(activate("ns1", "a1", "r9", 9)).code,
        FailureCode::RevisionNotPrepared
    );
}

#[test]
fn readiness_timeout_and_configuration_exit_are_reported_and_recoverable() {
    let h = Host::new();
    h.ok(ensure("ns1"));
    let port = port_of(&h.ok(prepare("ns1", "a1", "r1", 1)));
    h.fake.set_behaviour(port, Behaviour::NeverReady);
    let start = Instant::now();
    let f = h.fails(activate("ns1", "a1", "r1", 1));
    assert_eq!(f.code, FailureCode::ReadinessTimeout);
    assert!(f.is_retryable());
    assert!(start.elapsed() < Duration::from_secs(3));
    let paths = h.layout().agent(&id("ns1"), &id("a1"));
    assert!(
        paths.current.exists() && !paths.served.exists(),
        "served.json only after readiness"
    );

    h.fake.set_behaviour(port, Behaviour::ExitConfig);
    let f = h.fails(activate("ns1", "a1", "r1", 1));
    assert_eq!(f.code, FailureCode::UnitFailed);
    assert!(f.message.contains("78"), "{}", f.message);

    // A crash loop fails fast instead of waiting out the readiness limit.
    h.fake.set_behaviour(port, Behaviour::CrashLoop);
    let f = h.fails(activate("ns1", "a1", "r1", 1));
    assert_eq!(f.code, FailureCode::UnitFailed);
    assert!(f.message.contains("keeps exiting"), "{}", f.message);

    // Fixed: a later activate repairs the interrupted cutover (current set, served missing).
    h.fake.set_behaviour(port, Behaviour::Ready);
    match h.ok(activate("ns1", "a1", "r1", 1)) {
        OperationResult::ActivateRevision(r) => {
            assert!(r.restarted);
            assert_eq!(r.observation.served, Some(id("r1")));
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn foreign_units_and_tampered_markers_are_refused_without_changes() {
    let h = Host::new();
    h.ok(ensure("ns1"));
    h.ok(prepare("ns1", "a1", "r1", 1));
    let paths = h.layout().agent(&id("ns1"), &id("a1"));
    std::fs::write(&paths.unit_file, "[Service]\nExecStart=/bin/evil\n").unwrap();
    h.fake.clear_calls();
    let f = h.fails(activate("ns1", "a1", "r1", 1));
    assert_eq!(f.code, FailureCode::OwnershipMismatch);
    assert!(h.fake.calls().is_empty());
    assert_eq!(
        std::fs::read_to_string(&paths.unit_file).unwrap(),
        "[Service]\nExecStart=/bin/evil\n"
    );
    let f = h.fails(Operation::DeleteAgent(AgentArgs {
        namespace: ns("ns1"),
        agent: agent("a1"),
    }));
    assert_eq!(f.code, FailureCode::OwnershipMismatch);
    assert!(paths.dir.exists());
    std::fs::remove_file(&paths.unit_file).unwrap();

    // A marker with an extra key.
    let mut v: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&paths.marker).unwrap()).unwrap();
    let original = std::fs::read(&paths.marker).unwrap();
    v["extra"] = json!(true);
    std::fs::write(&paths.marker, v.to_string()).unwrap();
    assert_eq!(
        h.fails(activate("ns1", "a1", "r1", 1)).code,
        FailureCode::OwnershipMismatch
    );
    assert_eq!(
        h.fails(prepare("ns1", "a1", "r1", 1)).code,
        FailureCode::OwnershipMismatch
    );
    // Other Agents are unaffected by this one's corrupt marker.
    h.ok(prepare("ns1", "a2", "r1", 1));
    h.ok(activate("ns1", "a2", "r1", 1));
    std::fs::write(&paths.marker, original).unwrap();

    // A `current` that escapes the Agent directory.
    std::os::unix::fs::symlink("/etc", &paths.current).unwrap();
    assert_eq!(
        h.fails(activate("ns1", "a1", "r1", 1)).code,
        FailureCode::OwnershipMismatch
    );
    std::fs::remove_file(&paths.current).unwrap();

    // A snapshot directory replaced by a symlink.
    let rdir = paths.revision_dir(&id("r1"));
    let moved = paths.dir.join("elsewhere");
    std::fs::rename(&rdir, &moved).unwrap();
    std::os::unix::fs::symlink(&moved, &rdir).unwrap();
    assert_eq!(
        h.fails(activate("ns1", "a1", "r1", 1)).code,
        FailureCode::OwnershipMismatch
    );
}

#[test]
fn delete_agent_is_retry_safe_when_groupdel_fails() {
    let h = Host::new();
    h.ok(ensure("ns1"));
    h.ok(prepare("ns1", "a1", "r1", 1));
    h.ok(activate("ns1", "a1", "r1", 1));
    let paths = h.layout().agent(&id("ns1"), &id("a1"));
    h.fake.fail_next("groupdel");
    let f = h.fails(Operation::DeleteAgent(AgentArgs {
        namespace: ns("ns1"),
        agent: agent("a1"),
    }));
    assert_eq!(f.code, FailureCode::AccountToolFailed);
    assert!(!h.fake.has_user(&paths.account) && h.fake.has_group(&paths.account));
    assert!(h.layout().account_marker(&paths.account).exists());
    match h.ok(Operation::DeleteAgent(AgentArgs {
        namespace: ns("ns1"),
        agent: agent("a1"),
    })) {
        OperationResult::DeleteAgent(r) => assert!(r.removed),
        other => panic!("{other:?}"),
    }
    assert!(!h.fake.has_group(&paths.account));
    assert!(!h.layout().account_marker(&paths.account).exists());
}

#[test]
fn delete_namespace_validates_everything_first_and_is_retry_safe() {
    let h = Host::new();
    h.ok(ensure("ns1"));
    for a in ["a1", "a2"] {
        h.ok(prepare("ns1", a, "r1", 1));
        h.ok(activate("ns1", a, "r1", 1));
    }
    // A corrupt Agent marker: nothing is stopped or removed.
    let p2 = h.layout().agent(&id("ns1"), &id("a2"));
    let original = std::fs::read(&p2.marker).unwrap();
    std::fs::write(&p2.marker, b"{\"schema\":9}").unwrap();
    h.fake.clear_calls();
    let f = h.fails(Operation::DeleteNamespace(NamespaceArgs {
        namespace: ns("ns1"),
    }));
    assert_eq!(f.code, FailureCode::OwnershipMismatch);
    assert!(h.fake.calls().is_empty(), "{:?}", h.fake.calls());
    std::fs::write(&p2.marker, original).unwrap();

    // groupdel fails halfway; the retry finishes.
    h.fake.fail_next("groupdel");
    assert_eq!(
        h.fails(Operation::DeleteNamespace(NamespaceArgs {
            namespace: ns("ns1")
        }))
        .code,
        FailureCode::AccountToolFailed
    );
    assert!(!h.layout().namespace_dir(&id("ns1")).exists());
    match h.ok(Operation::DeleteNamespace(NamespaceArgs {
        namespace: ns("ns1"),
    })) {
        OperationResult::DeleteNamespace(r) => assert!(r.removed),
        other => panic!("{other:?}"),
    }
    for a in ["a1", "a2"] {
        let p = h.layout().agent(&id("ns1"), &id(a));
        assert!(!h.fake.has_user(&p.account) && !h.fake.has_group(&p.account));
        assert!(!p.unit_file.exists());
    }
    match h.ok(Operation::DeleteNamespace(NamespaceArgs {
        namespace: ns("ns1"),
    })) {
        OperationResult::DeleteNamespace(r) => assert!(!r.removed),
        other => panic!("{other:?}"),
    }
}

#[test]
fn ports_run_out_and_hosts_fill_up() {
    let h = Host::with_config("port_range = [20000, 20001]");
    h.ok(ensure("ns1"));
    h.ok(prepare("ns1", "a1", "r1", 1));
    h.ok(prepare("ns1", "a2", "r1", 1));
    assert_eq!(
        h.fails(prepare("ns1", "a3", "r1", 1)).code,
        FailureCode::PortRangeExhausted
    );
    let h = Host::with_config("max_agents = 1");
    h.ok(ensure("ns1"));
    h.ok(prepare("ns1", "a1", "r1", 1));
    assert_eq!(
        h.fails(prepare("ns1", "a2", "r1", 1)).code,
        FailureCode::HostFull
    );
    // A freed port is reused.
    h.ok(Operation::DeleteAgent(AgentArgs {
        namespace: ns("ns1"),
        agent: agent("a1"),
    }));
    h.ok(prepare("ns1", "a2", "r1", 1));
}

#[test]
fn a_held_agent_lock_times_out_but_other_agents_proceed() {
    let h = Host::new();
    h.ok(ensure("ns1"));
    h.ok(prepare("ns1", "a1", "r1", 1));
    let paths = h.layout().agent(&id("ns1"), &id("a1"));
    let held = crate::lock::acquire(&paths.lock, Duration::from_millis(10), &|| false).unwrap();
    let f = h.fails(activate("ns1", "a1", "r1", 1));
    assert_eq!(f.code, FailureCode::LockTimeout);
    assert!(f.is_retryable());
    h.ok(prepare("ns1", "a2", "r1", 1));
    h.ok(activate("ns1", "a2", "r1", 1));
    drop(held);
    h.ok(activate("ns1", "a1", "r1", 1));
}

#[test]
fn a_closed_session_stops_before_the_next_step() {
    let h = Host::new();
    h.ok(ensure("ns1"));
    h.ok(prepare("ns1", "a1", "r1", 1));
    let closed = std::cell::Cell::new(false);
    let cancelled = || closed.get();
    let mut steps = Vec::new();
    let mut on_step = |s: Step| {
        steps.push(s);
        if s == Step::PointerFlip {
            closed.set(true);
        }
    };
    let mut ctx = Ctx::new(
        OperationId::new("op-close").unwrap(),
        Instant::now() + Duration::from_secs(30),
        0,
        &cancelled,
        &mut on_step,
    );
    let engine = h.engine();
    let f = engine
        .execute(&activate("ns1", "a1", "r1", 1), &mut ctx, &h.journal)
        .unwrap_err();
    assert_eq!(f.code, FailureCode::SessionClosed);
    assert!(f.message.contains("pointer-flip"), "{}", f.message);
    drop(ctx);
    assert_eq!(steps.last(), Some(&Step::PointerFlip));
    let paths = h.layout().agent(&id("ns1"), &id("a1"));
    // The flip finished; nothing after it started.
    assert!(paths.current.exists() && !paths.served.exists());
    assert!(!h.fake.calls().iter().any(|c| c.starts_with("restart")));
    // The next activate repairs it.
    h.ok(activate("ns1", "a1", "r1", 1));
}

#[test]
fn probe_and_status_create_nothing() {
    let h = Host::new();
    match h.ok(Operation::Probe(ProbeArgs {})) {
        OperationResult::Probe(p) => {
            assert_eq!(p.protocol_versions, vec![1]);
            assert_eq!(p.agents, 0);
            assert!(p.missing_tools.is_empty());
        }
        other => panic!("{other:?}"),
    }
    h.ok(Operation::Status(StatusArgs::default()));
    assert!(!h.config.state_root.join("namespaces").exists());
    assert!(!h.config.state_root.join(".compute-lock").exists());
}
