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
use crate::fake::{Behaviour, FakeSystem, test_config};
use crate::journal::Journal;
use crate::layout::{AgentPaths, Layout};
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
        let dir = tempfile::tempdir().unwrap();
        let text = format!(
            "host_name = \"h1\"\n{extra}\n[limits]\nlock_timeout_ms = 300\nreadiness_timeout_ms = 400\n"
        );
        let config = test_config(dir.path(), &text, &["run"]).unwrap();
        let journal = Journal::open(&dir.path().join("journal"), 100).unwrap();
        Self {
            fake: FakeSystem::new(&config.unit_dir),
            _dir: dir,
            config,
            journal,
        }
    }

    fn engine(&self) -> Engine<'_> {
        let mut engine = Engine::new(
            &self.config,
            &self.fake as &dyn System,
            Fingerprint::new(format!("SHA256:{}", "A".repeat(43))).unwrap(),
        );
        engine.layout.run_dir = self.layout().run_dir;
        engine
    }

    /// The host's layout, its units' runtime directories in its own temporary directory.
    fn layout(&self) -> Layout {
        let mut layout = Layout::new(&self.config.state_root, &self.config.unit_dir);
        layout.run_dir = self._dir.path().join("run");
        layout
    }

    fn run(&self, op: Operation) -> Result<OperationResult, Failure> {
        self.run_fenced(op, None)
    }

    /// Runs `op` as an envelope with `fence` would (protocol version 2).
    fn run_fenced(&self, op: Operation, fence: Option<u64>) -> Result<OperationResult, Failure> {
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
        ctx.fence = fence;
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
        workspace: None,
        namespace: ns(n),
        agent: agent(a),
        revision: spec(rev, number),
        egress: None,
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
    Operation::ActivateRevision(ActivateArgs::from(rargs(n, a, rev, number)))
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
    // The account's passwd home is not its Agent-writable home/: only the unit sets HOME.
    assert!(
        h.fake
            .calls()
            .iter()
            .all(|c| c.ends_with(" home=/nonexistent")),
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

/// Issue 34 (cutover overhead): a revision cutover whose unit file and environment files
/// are what the running unit started with relaunches the gateway inside the unit instead of
/// restarting it; anything a start would read anew, or a relaunch that fails, restarts it.
#[test]
fn a_cutover_relaunches_the_gateway_in_place_only_when_a_restart_would_give_it_nothing_new() {
    let h = Host::new();
    let unit = running_agent(&h, "a1");
    let paths = h.layout().agent(&id("ns1"), &id("a1"));
    // What the unit's ExecStartPre= does at every start (`hostd secret-files`).
    let started = || {
        std::fs::create_dir_all(crate::secrets::runtime_dir(&h.layout().run_dir, &unit)).unwrap();
        crate::start_env::record(&paths.dir).unwrap();
    };
    let cutover = |rev: &str, n: u64| {
        h.ok(prepare("ns1", "a1", rev, n));
        h.fake.clear_calls();
        match h.ok(activate("ns1", "a1", rev, n)) {
            OperationResult::ActivateRevision(r) => {
                assert!(r.restarted && !r.unit_changed, "{r:?}");
                assert_eq!(r.observation.served, Some(id(rev)), "{r:?}");
            }
            other => panic!("{other:?}"),
        }
        let calls = h.fake.calls();
        (
            calls.contains(&format!("relaunch {unit}")),
            calls.contains(&format!("restart {unit}")),
        )
    };
    let label = |config: &str| -> String {
        let v: serde_json::Value = serde_json::from_str(config).unwrap();
        v["x-clawfleet-test"]["label"].as_str().unwrap().to_owned()
    };

    // No record of what the running unit's start read (a unit from before, or a failed
    // record): a restart.
    assert_eq!(cutover("rev-2", 2), (false, true));
    started();
    assert_eq!(cutover("rev-3", 3), (true, false), "in place");
    assert_eq!(
        std::fs::read_link(&paths.current).unwrap(),
        AgentPaths::current_target(&id("rev-3"))
    );
    // The new configuration appears only once the old gateway is gone (a gateway that
    // watches its file would take it for a restart of its own), and before the new one starts.
    assert_eq!(
        label(&h.fake.config_at_relaunch_stop(&unit).unwrap()),
        "rev-2"
    );
    assert_eq!(
        label(&std::fs::read_to_string(&paths.live_config).unwrap()),
        "rev-3"
    );
    let calls = h.fake.calls();
    let at = |c: &str| calls.iter().position(|x| *x == format!("{c} {unit}"));
    assert!(at("relaunch") < at("relaunch-start"), "{calls:?}");
    assert_eq!(cutover("rev-4", 4), (true, false), "in place again");
    assert_eq!(
        label(&h.fake.config_at_relaunch_stop(&unit).unwrap()),
        "rev-3"
    );

    // The operator's env file changed since the start: systemd must read it, so a restart.
    std::fs::write(&paths.operator_env, "MODEL_KEY=k2\n").unwrap();
    assert_eq!(cutover("rev-5", 5), (false, true));
    started();
    assert_eq!(cutover("rev-6", 6), (true, false));

    // A relaunch that fails (the launcher is gone, a bus error): the unit is restarted.
    h.fake.fail_next("relaunch");
    assert_eq!(cutover("rev-7", 7), (true, true));
    // So is one whose launcher cannot be asked to start the new gateway; the unit's start
    // reads the new configuration.
    started();
    h.fake.fail_next("relaunch-start");
    assert_eq!(cutover("rev-7b", 8), (true, true));
    assert_eq!(
        label(&std::fs::read_to_string(&paths.live_config).unwrap()),
        "rev-7b"
    );

    // A stopped unit is started, never relaunched.
    started();
    h.ok(Operation::StopRevision(rargs("ns1", "a1", "rev-7b", 8)));
    assert_eq!(cutover("rev-8", 9), (false, true));
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
        workspace: None,
        namespace: ns("ns1"),
        agent: agent("a1"),
        revision: other,
        egress: None,
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

    // Fixed: systemd's Restart= brings the gateway up, and a later activate waits for it
    // again without restarting it (current set, served missing).
    h.fake.set_behaviour(port, Behaviour::Ready);
    let unit = h.layout().agent(&id("ns1"), &id("a1")).unit_name;
    let restarts = h.fake.restarts(&unit);
    match h.ok(activate("ns1", "a1", "r1", 1)) {
        OperationResult::ActivateRevision(r) => {
            assert!(!r.restarted);
            assert_eq!(r.observation.served, Some(id("r1")));
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(h.fake.restarts(&unit), restarts);
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
        // The retry found the Agents only by their leftover accounts; their lock files go too.
        assert!(!p.lock.exists(), "{a}'s lock file is left");
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

/// The activation is stopped once its unit file is written, before any reload: the file on
/// disk is then already what the next attempt wants, and that attempt still reloads.
#[test]
fn a_unit_file_written_without_its_reload_is_reloaded_by_the_next_activation() {
    let h = Host::new();
    h.ok(ensure("ns1"));
    h.ok(prepare("ns1", "a1", "r1", 1));
    let closed = std::cell::Cell::new(false);
    let cancelled = || closed.get();
    let mut on_step = |s: Step| {
        if s == Step::UnitFile {
            closed.set(true);
        }
    };
    let mut ctx = Ctx::new(
        OperationId::new("op-unit").unwrap(),
        Instant::now() + Duration::from_secs(30),
        0,
        &cancelled,
        &mut on_step,
    );
    h.fake.clear_calls();
    let f = h
        .engine()
        .execute(&activate("ns1", "a1", "r1", 1), &mut ctx, &h.journal)
        .unwrap_err();
    drop(ctx);
    assert_eq!(f.code, FailureCode::SessionClosed);
    let paths = h.layout().agent(&id("ns1"), &id("a1"));
    assert!(paths.unit_file.exists(), "the unit file was written");
    assert!(h.layout().reload_pending(&paths.unit_name).exists());
    assert!(!h.fake.calls().iter().any(|c| c == "daemon-reload"));

    h.fake.clear_calls();
    match h.ok(activate("ns1", "a1", "r1", 1)) {
        OperationResult::ActivateRevision(r) => assert!(r.restarted && r.unit_changed),
        other => panic!("{other:?}"),
    }
    assert_eq!(h.fake.calls()[0], "daemon-reload", "{:?}", h.fake.calls());
    assert!(!h.layout().reload_pending(&paths.unit_name).exists());
    assert_eq!(
        std::fs::read_to_string(h.layout().reload_counts()).unwrap(),
        "1 1\n"
    );
}

/// A reload that started after a unit file was written covers it: the operation that waited
/// for the host lock meanwhile does not reload again. One that started before does not.
#[test]
fn a_reload_started_after_the_unit_file_was_written_is_shared() {
    let h = Host::new();
    h.ok(ensure("ns1"));
    h.ok(prepare("ns1", "a1", "r1", 1));
    let engine = h.engine();
    let cancelled = || false;
    let mut on_step = |_: Step| {};
    let mut ctx = Ctx::new(
        OperationId::new("op-share").unwrap(),
        Instant::now() + Duration::from_secs(30),
        0,
        &cancelled,
        &mut on_step,
    );
    // Another operation's reload is under way (started, not completed) when this one takes
    // its ticket: that reload may have read the directory before the write.
    let counts = h.layout().reload_counts();
    std::fs::create_dir_all(counts.parent().unwrap()).unwrap();
    std::fs::write(&counts, "4 3\n").unwrap();
    let ticket = engine.reload_ticket();
    std::fs::write(&counts, "4 4\n").unwrap();
    let host = engine.host_lock(&mut ctx).unwrap();
    h.fake.clear_calls();
    assert!(engine.daemon_reload(&mut ctx, &host, ticket).unwrap());
    assert_eq!(h.fake.calls(), ["daemon-reload"]);
    assert_eq!(std::fs::read_to_string(&counts).unwrap(), "5 5\n");
    drop(host);

    // Taken while nothing ran: the next reload to complete covers it.
    let ticket = engine.reload_ticket();
    std::fs::write(&counts, "6 6\n").unwrap();
    let host = engine.host_lock(&mut ctx).unwrap();
    h.fake.clear_calls();
    assert!(!engine.daemon_reload(&mut ctx, &host, ticket).unwrap());
    assert!(h.fake.calls().is_empty(), "{:?}", h.fake.calls());

    // Counts that are not ours count as none: a reload, and they are written anew.
    std::fs::write(&counts, "garbage").unwrap();
    let ticket = engine.reload_ticket();
    assert!(engine.daemon_reload(&mut ctx, &host, ticket).unwrap());
    assert_eq!(std::fs::read_to_string(&counts).unwrap(), "1 1\n");
}

/// On a systemd that loads a new unit file when it is referenced, a first activation needs
/// no reload; a reload owed by a removal whose own reload failed is still done.
#[test]
fn a_new_unit_file_that_systemd_loaded_needs_no_reload_unless_one_is_owed() {
    let h = Host::new();
    h.fake.set_loads_new_units(true);
    h.ok(ensure("ns1"));
    h.ok(prepare("ns1", "a1", "r1", 1));
    h.fake.clear_calls();
    match h.ok(activate("ns1", "a1", "r1", 1)) {
        OperationResult::ActivateRevision(r) => assert!(r.restarted && r.unit_changed),
        other => panic!("{other:?}"),
    }
    let calls = h.fake.calls();
    assert!(!calls.iter().any(|c| c == "daemon-reload"), "{calls:?}");
    assert!(calls[0].starts_with("enable "), "{calls:?}");
    let paths = h.layout().agent(&id("ns1"), &id("a1"));
    assert!(!h.layout().reload_pending(&paths.unit_name).exists());

    // The removal's reload fails after the unit file is gone: systemd may still have it.
    h.fake.fail_next("daemon-reload");
    let delete = Operation::DeleteAgent(AgentArgs {
        namespace: ns("ns1"),
        agent: agent("a1"),
    });
    h.fails(delete);
    assert!(!paths.unit_file.exists());
    assert!(h.layout().reload_pending(&paths.unit_name).exists());
    h.ok(prepare("ns1", "a1", "r1", 1));
    h.fake.clear_calls();
    h.ok(activate("ns1", "a1", "r1", 1));
    assert_eq!(h.fake.calls()[0], "daemon-reload", "{:?}", h.fake.calls());
    assert!(!h.layout().reload_pending(&paths.unit_name).exists());
}

#[test]
fn probe_and_status_create_nothing() {
    let h = Host::new();
    match h.ok(Operation::Probe(ProbeArgs {})) {
        OperationResult::Probe(p) => {
            assert_eq!(
                p.protocol_versions,
                clawfleet_protocol::SUPPORTED_VERSIONS.to_vec()
            );
            assert_eq!(p.agents, 0);
            assert!(p.missing_tools.is_empty());
        }
        other => panic!("{other:?}"),
    }
    h.ok(Operation::Status(StatusArgs::default()));
    assert!(!h.config.state_root.join("namespaces").exists());
    assert!(!h.config.state_root.join(".compute-lock").exists());
}

fn delete(n: &str, a: &str) -> Operation {
    Operation::DeleteAgent(AgentArgs {
        namespace: ns(n),
        agent: agent(a),
    })
}

fn status(h: &Host) -> Inventory {
    match h.ok(Operation::Status(StatusArgs::default())) {
        OperationResult::Status(inv) => inv,
        other => panic!("{other:?}"),
    }
}

/// Everything of one Agent that a refused deletion must leave in place.
fn assert_agent_intact(h: &Host, a: &str, port: u16) {
    let paths = h.layout().agent(&id("ns1"), &id(a));
    assert!(paths.dir.exists(), "directory");
    assert!(paths.unit_file.exists(), "unit file");
    assert!(h.fake.has_user(&paths.account), "user");
    assert!(h.fake.has_group(&paths.account), "group");
    assert!(h.layout().account_marker(&paths.account).exists(), "marker");
    assert!(h.layout().port_file(port).exists(), "port");
    assert!(h.fake.unit(&paths.unit_name).is_active(), "unit still runs");
    let inv = status(h);
    assert!(
        inv.namespaces[0].agents.iter().any(|x| x.id == id(a)),
        "status still shows the Agent: {inv:?}"
    );
}

/// Replaces one JSON field of a marker file, returning the original bytes.
fn edit_marker(path: &Path, field: &str, value: serde_json::Value) -> Vec<u8> {
    let original = std::fs::read(path).unwrap();
    let mut v: serde_json::Value = serde_json::from_slice(&original).unwrap();
    v[field] = value;
    std::fs::write(path, serde_json::to_vec_pretty(&v).unwrap()).unwrap();
    original
}

#[test]
fn delete_agent_refuses_a_tampered_snapshot_and_removes_nothing() {
    let h = Host::new();
    h.ok(ensure("ns1"));
    let port = port_of(&h.ok(prepare("ns1", "a1", "r1", 1)));
    h.ok(activate("ns1", "a1", "r1", 1));
    h.ok(prepare("ns1", "a1", "r2", 2));
    let paths = h.layout().agent(&id("ns1"), &id("a1"));
    let marker = paths.revision_dir(&id("r2")).join("revision.json");
    for (field, value, code) in [
        ("revisionId", json!("r9"), FailureCode::OwnershipMismatch),
        (
            "configurationHash",
            json!("0".repeat(64)),
            FailureCode::SnapshotMismatch,
        ),
    ] {
        let original = edit_marker(&marker, field, value);
        h.fake.clear_calls();
        let f = h.fails(delete("ns1", "a1"));
        assert_eq!(f.code, code, "{field}: {f}");
        assert!(!f.is_retryable(), "permanent: {f}");
        assert!(h.fake.calls().is_empty(), "{field}: {:?}", h.fake.calls());
        assert!(marker.exists(), "the tampered snapshot is kept");
        assert_agent_intact(&h, "a1", port);
        let inv = status(&h);
        assert!(
            inv.problems
                .iter()
                .any(|p| p.path == paths.revision_dir(&id("r2")).display().to_string()),
            "{field}: status shows the problem: {:?}",
            inv.problems
        );
        // Permanently: a retry is refused the same way.
        assert_eq!(h.fails(delete("ns1", "a1")).code, code);
        std::fs::write(&marker, original).unwrap();
    }
    assert!(status(&h).problems.is_empty());
    h.ok(delete("ns1", "a1"));
    assert!(!paths.dir.exists());
}

#[test]
fn delete_agent_refuses_an_account_marker_with_another_uid_and_removes_nothing() {
    let h = Host::new();
    h.ok(ensure("ns1"));
    let port = port_of(&h.ok(prepare("ns1", "a1", "r1", 1)));
    h.ok(activate("ns1", "a1", "r1", 1));
    let paths = h.layout().agent(&id("ns1"), &id("a1"));
    let marker = h.layout().account_marker(&paths.account);
    let original = edit_marker(&marker, "uid", json!(4242));
    for _ in 0..2 {
        h.fake.clear_calls();
        let f = h.fails(delete("ns1", "a1"));
        assert_eq!(f.code, FailureCode::OwnershipMismatch, "{f}");
        assert!(!f.is_retryable());
        assert!(f.message.contains("4242"), "{f}");
        assert!(h.fake.calls().is_empty(), "{:?}", h.fake.calls());
        assert_agent_intact(&h, "a1", port);
    }
    let inv = status(&h);
    assert!(
        inv.problems
            .iter()
            .any(|p| p.path == marker.display().to_string()),
        "status shows the problem: {:?}",
        inv.problems
    );
    // delete-namespace refuses it the same way.
    h.fake.clear_calls();
    assert_eq!(
        h.fails(Operation::DeleteNamespace(NamespaceArgs {
            namespace: ns("ns1")
        }))
        .code,
        FailureCode::OwnershipMismatch
    );
    assert!(h.fake.calls().is_empty(), "{:?}", h.fake.calls());
    std::fs::write(&marker, original).unwrap();
    h.ok(delete("ns1", "a1"));
    assert!(!h.fake.has_user(&paths.account));
}

#[test]
fn delete_namespace_refuses_a_tampered_snapshot_and_removes_nothing() {
    let h = Host::new();
    h.ok(ensure("ns1"));
    let port = port_of(&h.ok(prepare("ns1", "a1", "r1", 1)));
    h.ok(activate("ns1", "a1", "r1", 1));
    let paths = h.layout().agent(&id("ns1"), &id("a1"));
    let marker = paths.revision_dir(&id("r1")).join("revision.json");
    edit_marker(&marker, "configurationHash", json!("0".repeat(64)));
    h.fake.clear_calls();
    let f = h.fails(Operation::DeleteNamespace(NamespaceArgs {
        namespace: ns("ns1"),
    }));
    assert_eq!(f.code, FailureCode::SnapshotMismatch, "{f}");
    assert!(h.fake.calls().is_empty(), "{:?}", h.fake.calls());
    assert_agent_intact(&h, "a1", port);
}

/// Nothing of a new Agent is on the host: no account, marker, directory, port or lock file.
fn assert_nothing_of(h: &Host, a: &str) {
    let l = h.layout();
    let paths = l.agent(&id("ns1"), &id(a));
    assert!(!h.fake.has_user(&paths.account), "user");
    assert!(!h.fake.has_group(&paths.account), "group");
    assert!(!l.account_marker(&paths.account).exists(), "account marker");
    assert!(!paths.dir.exists(), "directory");
    assert!(!paths.lock.exists(), "lock file");
    if l.ports_dir().exists() {
        for name in std::fs::read_dir(l.ports_dir()).unwrap() {
            let text = std::fs::read_to_string(name.unwrap().path()).unwrap();
            assert!(!text.contains(&format!("\"{a}\"")), "port reserved: {text}");
        }
    }
    assert!(
        !h.fake
            .calls()
            .iter()
            .any(|c| c.starts_with(&format!("create-account {} ", paths.account))),
        "{:?}",
        h.fake.calls()
    );
}

#[test]
fn a_prepare_refused_for_ports_or_room_creates_nothing() {
    let h = Host::with_config("port_range = [20000, 20000]");
    h.ok(ensure("ns1"));
    h.ok(prepare("ns1", "a1", "r1", 1));
    h.fake.clear_calls();
    assert_eq!(
        h.fails(prepare("ns1", "a2", "r1", 1)).code,
        FailureCode::PortRangeExhausted
    );
    assert_nothing_of(&h, "a2");

    let h = Host::with_config("max_agents = 1");
    h.ok(ensure("ns1"));
    h.ok(prepare("ns1", "a1", "r1", 1));
    h.fake.clear_calls();
    assert_eq!(
        h.fails(prepare("ns1", "a2", "r1", 1)).code,
        FailureCode::HostFull
    );
    assert_nothing_of(&h, "a2");
}

#[test]
fn a_prepare_refused_for_a_foreign_unit_file_creates_nothing() {
    let h = Host::new();
    h.ok(ensure("ns1"));
    let paths = h.layout().agent(&id("ns1"), &id("a1"));
    std::fs::write(&paths.unit_file, "[Service]\nExecStart=/bin/evil\n").unwrap();
    h.fake.clear_calls();
    let f = h.fails(prepare("ns1", "a1", "r1", 1));
    assert_eq!(f.code, FailureCode::OwnershipMismatch, "{f}");
    assert_nothing_of(&h, "a1");
    assert_eq!(
        std::fs::read_to_string(&paths.unit_file).unwrap(),
        "[Service]\nExecStart=/bin/evil\n"
    );
    // Delete is refused too (the unit is not ours) and, with nothing of the Agent left
    // behind, there is nothing else to strand.
    assert_eq!(
        h.fails(delete("ns1", "a1")).code,
        FailureCode::OwnershipMismatch
    );
    assert_nothing_of(&h, "a1");
    // Once the foreign file is gone, the same prepare goes through.
    std::fs::remove_file(&paths.unit_file).unwrap();
    h.ok(prepare("ns1", "a1", "r1", 1));
}

#[test]
fn a_prepare_without_its_namespace_leaves_no_lock_file() {
    let h = Host::new();
    assert_eq!(
        h.fails(prepare("ns1", "a1", "r1", 1)).code,
        FailureCode::NamespaceMissing
    );
    assert_nothing_of(&h, "a1");
    // Stopping an Agent the host never had leaves none either.
    h.ok(Operation::StopRevision(rargs("ns1", "a1", "r1", 1)));
    assert_nothing_of(&h, "a1");
}

#[test]
fn a_candidate_that_is_not_ready_is_not_reported_as_served() {
    let h = Host::new();
    h.ok(ensure("ns1"));
    let port = port_of(&h.ok(prepare("ns1", "a1", "r1", 1)));
    h.ok(activate("ns1", "a1", "r1", 1));
    h.ok(prepare("ns1", "a1", "r2", 2));
    let paths = h.layout().agent(&id("ns1"), &id("a1"));
    h.fake.set_behaviour(port, Behaviour::NeverReady);
    assert_eq!(
        h.fails(activate("ns1", "a1", "r2", 2)).code,
        FailureCode::ReadinessTimeout
    );
    assert!(!paths.served.exists(), "served.json no longer names r1");
    let observed = |h: &Host| match h.ok(Operation::VerifyRevision(rargs("ns1", "a1", "r2", 2))) {
        OperationResult::VerifyRevision(v) => v.observation,
        other => panic!("{other:?}"),
    };
    let o = observed(&h);
    assert_eq!(o.current, Some(id("r2")));
    assert_eq!(
        o.served, None,
        "neither r1 (no longer runs) nor r2 (not ready)"
    );
    let inv = status(&h);
    assert_eq!(inv.namespaces[0].agents[0].observation.served, None);

    // A served.json that does not match `current` (say, from a host upgraded mid-cutover)
    // is not believed.
    let stale = crate::markers::ServedMarker {
        schema: crate::markers::SCHEMA,
        revision_id: id("r1"),
        served_at: 1,
        operation_id: OperationId::new("op-old").unwrap(),
    };
    std::fs::write(&paths.served, crate::markers::to_bytes(&stale)).unwrap();
    assert_eq!(observed(&h).served, None);
    assert_eq!(status(&h).namespaces[0].agents[0].observation.served, None);
    std::fs::remove_file(&paths.served).unwrap();
}

#[test]
fn a_retried_activation_waits_for_the_running_candidate_instead_of_restarting_it() {
    let h = Host::new();
    h.ok(ensure("ns1"));
    let port = port_of(&h.ok(prepare("ns1", "a1", "r1", 1)));
    h.ok(activate("ns1", "a1", "r1", 1));
    h.ok(prepare("ns1", "a1", "r2", 2));
    let paths = h.layout().agent(&id("ns1"), &id("a1"));
    h.fake.set_behaviour(port, Behaviour::NeverReady);
    let before = h.fake.restarts(&paths.unit_name);
    assert_eq!(
        h.fails(activate("ns1", "a1", "r2", 2)).code,
        FailureCode::ReadinessTimeout
    );
    assert_eq!(h.fake.restarts(&paths.unit_name), before + 1, "one cutover");
    // Retries while the candidate still warms up: no restart, no reload.
    for _ in 0..3 {
        h.fake.clear_calls();
        assert_eq!(
            h.fails(activate("ns1", "a1", "r2", 2)).code,
            FailureCode::ReadinessTimeout
        );
        assert!(h.fake.calls().is_empty(), "{:?}", h.fake.calls());
    }
    // It becomes ready: the retry records it as served, still without a restart.
    h.fake.set_behaviour(port, Behaviour::Ready);
    h.fake.clear_calls();
    match h.ok(activate("ns1", "a1", "r2", 2)) {
        OperationResult::ActivateRevision(r) => {
            assert!(!r.restarted && !r.unit_changed);
            assert_eq!(r.observation.served, Some(id("r2")));
        }
        other => panic!("{other:?}"),
    }
    assert!(h.fake.calls().is_empty(), "{:?}", h.fake.calls());

    // A unit systemd gave up on is restarted, though.
    h.fake.set_behaviour(port, Behaviour::ExitConfig);
    h.fake.clear_calls();
    assert_eq!(
        h.fails(activate("ns1", "a1", "r2", 2)).code,
        FailureCode::UnitFailed
    );
    assert_eq!(h.fake.restarts(&paths.unit_name), 1);
    // And so is a unit stopped behind hostd's back (it no longer runs anything).
    h.fake.set_behaviour(port, Behaviour::Ready);
    h.fake
        .stop_unit(&paths.unit_name, Duration::from_secs(1))
        .unwrap();
    h.fake.clear_calls();
    match h.ok(activate("ns1", "a1", "r2", 2)) {
        OperationResult::ActivateRevision(r) => assert!(r.restarted),
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_missing_or_unexecutable_gateway_command_is_probed_and_fails_prepare_fast() {
    let mut h = Host::new();
    h.ok(ensure("ns1"));
    let probe_missing = |h: &Host| match h.ok(Operation::Probe(ProbeArgs {})) {
        OperationResult::Probe(p) => p.missing_tools,
        other => panic!("{other:?}"),
    };
    assert!(probe_missing(&h).is_empty());
    let gateway = h.config.gateway_command[0].clone();

    // Missing.
    h.config.gateway_command[0] = "/nonexistent/node".to_owned();
    assert_eq!(probe_missing(&h), vec!["/nonexistent/node".to_owned()]);
    h.fake.clear_calls();
    let f = h.fails(prepare("ns1", "a1", "r1", 1));
    assert_eq!(f.code, FailureCode::GatewayCommandMissing, "{f}");
    assert!(!f.is_retryable());
    assert!(f.message.contains("/nonexistent/node"), "{f}");
    assert_nothing_of(&h, "a1");

    // Present but not executable.
    h.config.gateway_command[0] = gateway.clone();
    std::fs::set_permissions(&gateway, std::fs::Permissions::from_mode(0o644)).unwrap();
    assert_eq!(probe_missing(&h), vec![gateway.clone()]);
    let f = h.fails(prepare("ns1", "a1", "r1", 1));
    assert_eq!(f.code, FailureCode::GatewayCommandMissing, "{f}");
    assert!(f.message.contains("not executable"), "{f}");
    assert_nothing_of(&h, "a1");

    // Removed between prepare and activate: activation refuses before the cutover.
    std::fs::set_permissions(&gateway, std::fs::Permissions::from_mode(0o755)).unwrap();
    h.ok(prepare("ns1", "a1", "r1", 1));
    std::fs::set_permissions(&gateway, std::fs::Permissions::from_mode(0o644)).unwrap();
    h.fake.clear_calls();
    assert_eq!(
        h.fails(activate("ns1", "a1", "r1", 1)).code,
        FailureCode::GatewayCommandMissing
    );
    assert!(h.fake.calls().is_empty(), "{:?}", h.fake.calls());
    assert!(!h.layout().agent(&id("ns1"), &id("a1")).current.exists());

    // A gateway that already serves is left alone: re-activating it needs no restart.
    std::fs::set_permissions(&gateway, std::fs::Permissions::from_mode(0o755)).unwrap();
    h.ok(activate("ns1", "a1", "r1", 1));
    std::fs::set_permissions(&gateway, std::fs::Permissions::from_mode(0o644)).unwrap();
    match h.ok(activate("ns1", "a1", "r1", 1)) {
        OperationResult::ActivateRevision(r) => assert!(!r.restarted),
        other => panic!("{other:?}"),
    }
    // But a new revision, which needs a restart, is refused before the cutover.
    std::fs::set_permissions(&gateway, std::fs::Permissions::from_mode(0o755)).unwrap();
    h.ok(prepare("ns1", "a1", "r2", 2));
    std::fs::set_permissions(&gateway, std::fs::Permissions::from_mode(0o644)).unwrap();
    assert_eq!(
        h.fails(activate("ns1", "a1", "r2", 2)).code,
        FailureCode::GatewayCommandMissing
    );
    match h.ok(Operation::VerifyRevision(rargs("ns1", "a1", "r1", 1))) {
        OperationResult::VerifyRevision(v) => {
            assert_eq!(v.observation.current, Some(id("r1")));
            assert_eq!(v.observation.served, Some(id("r1")));
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_listener_of_another_uid_on_the_port_fails_activation_and_nothing_is_served() {
    let h = Host::new();
    h.ok(ensure("ns1"));
    let port = port_of(&h.ok(prepare("ns1", "a1", "r1", 1)));
    let paths = h.layout().agent(&id("ns1"), &id("a1"));
    // While the Agent is not running, another uid takes its port and answers /readyz.
    h.fake.set_squatter(port, 4242);
    let f = h.fails(activate("ns1", "a1", "r1", 1));
    assert_eq!(f.code, FailureCode::ListenerNotOwned, "{f}");
    assert!(f.is_retryable());
    assert!(
        f.message.contains("uid 4242") && f.message.contains(&paths.account),
        "{f}"
    );
    assert!(!paths.served.exists(), "no served.json for a squatter");
    // The squatter leaves: the retry succeeds.
    h.fake.clear_squatter(port);
    h.ok(activate("ns1", "a1", "r1", 1));
    assert!(paths.served.exists());
    // A squatter next to the running gateway (say, on the IPv6 side) is refused as well, even
    // on the no-restart path of a repeated activation.
    h.fake.set_squatter(port, 4242);
    assert_eq!(
        h.fails(activate("ns1", "a1", "r1", 1)).code,
        FailureCode::ListenerNotOwned
    );
}

fn logs(a: &str, start: clawfleet_protocol::runtime::LogStart, limit: u32) -> Operation {
    Operation::AgentLogs(clawfleet_protocol::runtime::LogsArgs {
        namespace: ns("ns1"),
        agent: agent(a),
        start,
        previous: false,
        limit: clawfleet_protocol::runtime::PageLines::new(limit).unwrap(),
    })
}

fn page(r: OperationResult) -> clawfleet_protocol::runtime::LogPage {
    match r {
        OperationResult::AgentLogs(p) => p,
        other => panic!("{other:?}"),
    }
}

fn running_agent(h: &Host, a: &str) -> String {
    h.ok(ensure("ns1"));
    h.ok(prepare("ns1", a, "rev-1", 1));
    h.ok(activate("ns1", a, "rev-1", 1));
    h.layout().agent(&id("ns1"), &id(a)).unit_name
}

#[test]
fn runtime_reports_the_unit_the_main_uid_and_takes_no_lock_or_write() {
    use clawfleet_protocol::runtime::{RuntimeArgs, WorkloadKind};
    let h = Host::new();
    let unit = running_agent(&h, "a1");
    h.fake.log_line(&unit, "listening on 127.0.0.1");
    h.fake.clear_calls();
    let r = h.ok(Operation::AgentRuntime(RuntimeArgs {
        namespace: ns("ns1"),
        agent: agent("a1"),
        evidence_lines: 5,
    }));
    let OperationResult::AgentRuntime(r) = r else {
        panic!("{r:?}")
    };
    let w = r.workload.expect("a workload");
    assert_eq!(w.kind, WorkloadKind::SystemdUnit);
    assert_eq!(w.name, unit);
    assert_eq!(w.active_state, "active");
    assert!(w.main_pid.is_some() && w.memory_current_bytes.is_some());
    assert_eq!(
        w.main_uid, r.account_uid,
        "the gateway runs as the Agent's account"
    );
    assert_eq!(r.observation.served, Some(id("rev-1")));
    assert_eq!(
        r.recent_lines.last().map(|l| l.message.as_str()),
        Some("listening on 127.0.0.1")
    );
    assert!(h.fake.calls().is_empty(), "{:?}", h.fake.calls());
    // An Agent the host does not have.
    let f = h.fails(Operation::AgentRuntime(RuntimeArgs {
        namespace: ns("ns1"),
        agent: agent("nobody"),
        evidence_lines: 0,
    }));
    assert_eq!(f.code, FailureCode::AgentMissing);
}

#[test]
fn log_pages_are_redacted_bounded_and_continue_by_cursor_exactly_once() {
    use clawfleet_protocol::runtime::LogStart;
    let h = Host::new();
    let unit = running_agent(&h, "a1");
    let paths = h.layout().agent(&id("ns1"), &id("a1"));
    let pw = std::fs::read_to_string(&paths.password_file).unwrap();
    let pw = pw.trim().split_once('=').unwrap().1.to_owned();
    h.fake.log_line(&unit, &format!("password is {pw} here"));
    h.fake
        .log_line(&unit, "Authorization: Bearer abcdef0123456789");
    for n in 0..25 {
        h.fake.log_line(&unit, &format!("line {n}"));
    }
    // Forward pages of 10 from the start: every line once, in order.
    let mut seen = Vec::new();
    let mut start = LogStart::Since { since_unix: 0 };
    loop {
        let p = page(h.ok(logs("a1", start.clone(), 10)));
        assert!(p.entries.len() <= 10);
        seen.extend(p.entries.iter().map(|e| e.message.clone()));
        if !p.more {
            // Nothing new after the last cursor: the same cursor again, no entries.
            let again = page(h.ok(logs(
                "a1",
                LogStart::After {
                    cursor: p.cursor.clone().unwrap(),
                },
                10,
            )));
            assert!(again.entries.is_empty() && again.cursor == p.cursor);
            break;
        }
        start = LogStart::After {
            cursor: p.cursor.unwrap(),
        };
    }
    let gateway: Vec<&String> = seen.iter().filter(|m| !m.starts_with("Started ")).collect();
    assert_eq!(gateway.len(), 27, "{seen:?}");
    assert_eq!(gateway[0], "password is [REDACTED] here");
    assert_eq!(gateway[1], "Authorization: Bearer [REDACTED]");
    assert!(seen.iter().all(|m| !m.contains(&pw)));
    let lines: Vec<&String> = gateway[2..].to_vec();
    assert_eq!(lines.len(), 25);
    for (n, l) in lines.iter().enumerate() {
        assert_eq!(**l, format!("line {n}"));
    }
    // A tail gives the newest.
    let tail = page(h.ok(logs(
        "a1",
        LogStart::Tail {
            lines: clawfleet_protocol::runtime::PageLines::new(3).unwrap(),
            since_unix: None,
        },
        1000,
    )));
    let msgs: Vec<&str> = tail.entries.iter().map(|e| e.message.as_str()).collect();
    assert_eq!(msgs, ["line 22", "line 23", "line 24"]);
    // A cursor the journal does not have.
    let f = h.fails(logs(
        "a1",
        LogStart::After {
            cursor: clawfleet_protocol::runtime::LogCursor::new("fake;i=99999").unwrap(),
        },
        10,
    ));
    assert_eq!(f.code, FailureCode::LogCursorInvalid);
}

/// The Agent's own secrets (its password, its operator env file's values, its launch values
/// named as secrets) never show in a log page: whole, or split by a journald line cut.
#[test]
fn log_pages_never_show_the_agents_env_values_even_across_journald_cuts() {
    use clawfleet_protocol::runtime::LogStart;
    let h = Host::new();
    let unit = running_agent(&h, "a1");
    let paths = h.layout().agent(&id("ns1"), &id("a1"));
    let pw = std::fs::read_to_string(&paths.password_file).unwrap();
    let pw = pw.trim().split_once('=').unwrap().1.to_owned();
    std::fs::write(
        &paths.operator_env,
        "# the operator's\nUPSTREAM_CREDENTIALS=\"op env value 1\"\nREGION=eu-central-1x\n",
    )
    .unwrap();
    let mut launch = std::collections::BTreeMap::new();
    launch.insert("DB_PASSWORD".to_owned(), "hunter2hunter2".to_owned());
    launch.insert("LOG_STYLE".to_owned(), "verbose-json".to_owned());
    std::fs::write(&paths.launch_env, super::hooks::render_env_file(&launch)).unwrap();
    h.fake
        .log_line(&unit, "connecting to the db with hunter2hunter2 now");
    h.fake
        .log_line(&unit, "upstream auth op env value 1 loaded");
    h.fake
        .log_line(&unit, "log style verbose-json in region eu-central-1x");
    let (head, tail) = pw.split_at(pw.len() / 2);
    h.fake.log_cut(
        &unit,
        &format!("{} the password is {head}", "x".repeat(100)),
    );
    h.fake
        .log_line(&unit, &format!("{tail} and the line goes on"));
    h.fake.log_cut(&unit, "retrying with hunter2hun");
    h.fake.log_line(&unit, "ter2 again");
    let p = page(h.ok(logs("a1", LogStart::Since { since_unix: 0 }, 1000)));
    let lines: Vec<&str> = p
        .entries
        .iter()
        .map(|e| e.message.as_str())
        .filter(|m| !m.starts_with("Started "))
        .collect();
    let joined = lines.join("\n");
    for secret in [
        pw.as_str(),
        tail,
        "hunter2hunter2",
        "ter2",
        "op env value 1",
    ] {
        assert!(!joined.contains(secret), "{secret:?} shows:\n{joined}");
    }
    assert_eq!(
        lines,
        [
            "connecting to the db with [REDACTED] now",
            "upstream auth [REDACTED] loaded",
            // Launch values not named as secrets are not secrets.
            "log style verbose-json in region [REDACTED]",
            &format!("{} the password is [REDACTED]", "x".repeat(100)),
            "[REDACTED] and the line goes on",
            "retrying with [REDACTED]",
            "[REDACTED] again",
        ]
    );
}

#[test]
fn previous_reads_the_run_before_a_restart() {
    use clawfleet_protocol::runtime::{LogStart, LogsArgs, PageLines};
    let h = Host::new();
    let unit = running_agent(&h, "a1");
    let previous = |h: &Host| {
        h.run(Operation::AgentLogs(LogsArgs {
            namespace: ns("ns1"),
            agent: agent("a1"),
            start: LogStart::Since { since_unix: 0 },
            previous: true,
            limit: PageLines::max(),
        }))
    };
    h.fake.log_line(&unit, "first run");
    assert_eq!(
        previous(&h).unwrap_err().code,
        FailureCode::PreviousRunMissing
    );
    h.ok(prepare("ns1", "a1", "rev-2", 2));
    h.ok(activate("ns1", "a1", "rev-2", 2));
    h.fake.log_line(&unit, "second run");
    let p = page(previous(&h).unwrap());
    let msgs: Vec<&str> = p.entries.iter().map(|e| e.message.as_str()).collect();
    assert!(
        msgs.contains(&"first run") && !msgs.contains(&"second run"),
        "{msgs:?}"
    );
    assert!(p.invocation_id.is_some());
}

/// A cutover in place is no new unit run, yet the gateway's run before is still the one it
/// replaced: the span between the launcher's relaunch lines, in the same unit run.
#[test]
fn previous_reads_the_gateway_run_before_a_relaunch_in_place() {
    use clawfleet_protocol::runtime::{LogStart, LogsArgs, PageLines};
    let h = Host::new();
    let unit = running_agent(&h, "a1");
    let paths = h.layout().agent(&id("ns1"), &id("a1"));
    // What the unit's ExecStartPre= does at every start.
    std::fs::create_dir_all(crate::secrets::runtime_dir(&h.layout().run_dir, &unit)).unwrap();
    crate::start_env::record(&paths.dir).unwrap();
    let logs = |start: LogStart| {
        let p = page(
            h.run(Operation::AgentLogs(LogsArgs {
                namespace: ns("ns1"),
                agent: agent("a1"),
                start,
                previous: true,
                limit: PageLines::max(),
            }))
            .unwrap(),
        );
        p.entries
            .iter()
            .map(|e| e.message.clone())
            .filter(|m| m.ends_with(" run"))
            .collect::<Vec<_>>()
    };
    let cutover = |rev: &str, n: u64| {
        h.ok(prepare("ns1", "a1", rev, n));
        h.fake.clear_calls();
        h.ok(activate("ns1", "a1", rev, n));
        assert!(h.fake.calls().contains(&format!("relaunch {unit}")));
    };
    h.fake.log_line(&unit, "first run");
    cutover("rev-2", 2);
    h.fake.log_line(&unit, "second run");
    assert_eq!(logs(LogStart::Since { since_unix: 0 }), ["first run"]);
    cutover("rev-3", 3);
    h.fake.log_line(&unit, "third run");
    assert_eq!(logs(LogStart::Since { since_unix: 0 }), ["second run"]);
    assert_eq!(
        logs(LogStart::Tail {
            lines: PageLines::new(5).unwrap(),
            since_unix: None
        }),
        ["second run"]
    );
    // After a restart (a new unit run), the previous run is the last gateway of the unit's
    // run before: the third, not the three of them.
    std::fs::write(&paths.operator_env, "K=v\n").unwrap();
    h.ok(prepare("ns1", "a1", "rev-4", 4));
    h.ok(activate("ns1", "a1", "rev-4", 4));
    h.fake.log_line(&unit, "fourth run");
    assert_eq!(logs(LogStart::Since { since_unix: 0 }), ["third run"]);
}

#[test]
fn a_current_that_names_no_revision_is_repointed_but_an_unverifiable_one_is_refused() {
    let h = Host::new();
    running_agent(&h, "a1");
    let paths = h.layout().agent(&id("ns1"), &id("a1"));
    let flip = |target: &str| {
        let tmp = paths.dir.join("current.hand");
        let _ = std::fs::remove_file(&tmp);
        std::os::unix::fs::symlink(target, &tmp).unwrap();
        std::fs::rename(&tmp, &paths.current).unwrap();
    };
    // Outside revisions/, then a revision name with no directory: both repointed.
    for target in [
        "revisions/handmade",
        "revisions/0123456789abcdef0123456789abcdef",
    ] {
        flip(target);
        h.ok(prepare("ns1", "a1", "rev-1", 1));
        h.ok(activate("ns1", "a1", "rev-1", 1));
        let now = std::fs::read_link(&paths.current).unwrap();
        assert_eq!(now, AgentPaths::current_target(&id("rev-1")), "{target}");
    }
    // A revision directory that exists but does not verify: refused, nothing changed.
    let fake = paths.revisions.join("0123456789abcdef0123456789abcdef");
    std::fs::create_dir(&fake).unwrap();
    flip("revisions/0123456789abcdef0123456789abcdef");
    let f = h.fails(activate("ns1", "a1", "rev-1", 1));
    assert_eq!(f.code, FailureCode::OwnershipMismatch, "{f}");
    assert_eq!(
        std::fs::read_link(&paths.current).unwrap(),
        Path::new("revisions/0123456789abcdef0123456789abcdef")
    );
}

fn activate_restoring(n: &str, a: &str, rev: &str, number: u64, back: (&str, u64)) -> Operation {
    let mut args = ActivateArgs::from(rargs(n, a, rev, number));
    args.restore = Some(spec(back.0, back.1).reference());
    Operation::ActivateRevision(args)
}

#[test]
fn a_candidate_that_is_not_ready_is_replaced_by_the_last_served_revision_when_asked() {
    let h = Host::new();
    running_agent(&h, "a1");
    let paths = h.layout().agent(&id("ns1"), &id("a1"));
    h.ok(prepare("ns1", "a1", "rev-2", 2));
    h.fake.set_revision_behaviour(
        &crate::layout::dir_name(&id("rev-2")),
        Behaviour::NeverReady,
    );
    // Without restore: the seed's behaviour, the candidate stays and fails.
    let f = h.fails(activate("ns1", "a1", "rev-2", 2));
    assert_eq!(f.code, FailureCode::ReadinessTimeout);
    assert_eq!(
        std::fs::read_link(&paths.current).unwrap(),
        AgentPaths::current_target(&id("rev-2"))
    );
    // With restore: rev-1 serves again, the answer says why.
    let r = h.ok(activate_restoring("ns1", "a1", "rev-2", 2, ("rev-1", 1)));
    let OperationResult::ActivateRevision(a) = r else {
        panic!("{r:?}")
    };
    let restored = a.restored.expect("restored");
    assert_eq!(restored.revision, id("rev-1"));
    assert_eq!(
        restored.candidate_failure.code,
        FailureCode::ReadinessTimeout
    );
    assert_eq!(a.observation.served, Some(id("rev-1")));
    assert_eq!(a.observation.current, Some(id("rev-1")));
    let served: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&paths.served).unwrap()).unwrap();
    assert_eq!(served["revisionId"], "rev-1");
    // The snapshot of the candidate stays (immutable), nothing was retired.
    assert!(paths.revision_dir(&id("rev-2")).exists());
    // Restoring the candidate itself, or a newer revision, is refused before anything moves.
    let f = h.fails(activate_restoring("ns1", "a1", "rev-2", 2, ("rev-2", 2)));
    assert_eq!(f.code, FailureCode::InvalidInput);
    h.ok(prepare("ns1", "a1", "rev-3", 3));
    let f = h.fails(activate_restoring("ns1", "a1", "rev-2", 2, ("rev-3", 3)));
    assert_eq!(f.code, FailureCode::InvalidInput);
    assert_eq!(
        std::fs::read_link(&paths.current).unwrap(),
        AgentPaths::current_target(&id("rev-1"))
    );
}

#[test]
fn a_cutover_that_fails_half_way_goes_back_to_the_restore_revision() {
    let h = Host::new();
    running_agent(&h, "a1");
    h.ok(prepare("ns1", "a1", "rev-2", 2));
    // The restart job onto the candidate fails (a timed-out job, a bus error).
    h.fake.fail_next("restart");
    let r = h.ok(activate_restoring("ns1", "a1", "rev-2", 2, ("rev-1", 1)));
    let OperationResult::ActivateRevision(a) = r else {
        panic!("{r:?}")
    };
    let restored = a.restored.expect("restored");
    assert_eq!(
        restored.candidate_failure.code,
        FailureCode::SystemdUnavailable
    );
    assert_eq!(a.observation.served, Some(id("rev-1")));
}

#[test]
fn a_restore_finishes_on_the_host_when_the_session_closes_during_the_cutover() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let h = Host::new();
    running_agent(&h, "a1");
    h.ok(prepare("ns1", "a1", "rev-2", 2));
    h.fake.set_revision_behaviour(
        &crate::layout::dir_name(&id("rev-2")),
        Behaviour::NeverReady,
    );
    let run = |op: Operation| {
        let closed = AtomicBool::new(false);
        let cancelled = || closed.load(Ordering::SeqCst);
        // The session closes as soon as the unit restarts on the candidate.
        let mut on_step = |s: Step| {
            if s == Step::Restart {
                closed.store(true, Ordering::SeqCst);
            }
        };
        let mut ctx = Ctx::new(
            OperationId::new("op-cut").unwrap(),
            Instant::now() + Duration::from_secs(30),
            1_800_000_000,
            &cancelled,
            &mut on_step,
        );
        h.engine().execute(&op, &mut ctx, &h.journal)
    };
    // Without restore the operation stops at its next step.
    let f = run(activate("ns1", "a1", "rev-2", 2)).unwrap_err();
    assert_eq!(f.code, FailureCode::SessionClosed, "{f}");
    // With restore it goes on by itself and rev-1 serves again.
    let r = run(activate_restoring("ns1", "a1", "rev-2", 2, ("rev-1", 1))).unwrap();
    let OperationResult::ActivateRevision(a) = r else {
        panic!("{r:?}")
    };
    assert_eq!(a.restored.map(|r| r.revision), Some(id("rev-1")));
    assert_eq!(a.observation.served, Some(id("rev-1")));
}

fn plan_of(
    h: &Host,
    n: &str,
    a: &str,
    rev: &str,
    number: u64,
    restore: Option<(&str, u64)>,
) -> clawfleet_protocol::plan::PlanResult {
    let op = Operation::PlanRevision(clawfleet_protocol::plan::PlanArgs {
        namespace: ns(n),
        agent: agent(a),
        revision: spec(rev, number),
        restore: restore.map(|(r, k)| spec(r, k).reference()),
        egress: None,
    });
    match h.ok(op) {
        OperationResult::PlanRevision(p) => *p,
        other => panic!("{other:?}"),
    }
}

/// What a deploy then did: (snapshot created, unit file written and daemon-reload, restarted).
fn deploy_did(h: &Host, n: &str, a: &str, rev: &str, number: u64) -> (bool, bool, bool) {
    let reloads = |h: &Host| {
        h.fake
            .calls()
            .iter()
            .filter(|c| *c == "daemon-reload")
            .count()
    };
    let before = reloads(h);
    let OperationResult::PrepareRevision(p) = h.ok(prepare(n, a, rev, number)) else {
        panic!("prepare answered something else")
    };
    let OperationResult::ActivateRevision(act) = h.ok(activate(n, a, rev, number)) else {
        panic!("activate answered something else")
    };
    assert_eq!(act.unit_changed, reloads(h) > before);
    (p.created, act.unit_changed, act.restarted)
}

#[test]
fn a_plan_predicts_what_prepare_and_activate_then_do_and_changes_nothing() {
    use clawfleet_protocol::plan::Change;
    let mut h = Host::new();
    h.ok(ensure("n1"));
    fn walk(dir: &Path, out: &mut Vec<(String, Vec<u8>)>) {
        let mut entries: Vec<_> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        entries.sort();
        for p in entries {
            let meta = std::fs::symlink_metadata(&p).unwrap();
            let name = p.display().to_string();
            if meta.file_type().is_symlink() {
                out.push((
                    name,
                    std::fs::read_link(&p)
                        .unwrap()
                        .display()
                        .to_string()
                        .into_bytes(),
                ));
            } else if meta.is_dir() {
                out.push((name, Vec::new()));
                walk(&p, out);
            } else {
                out.push((name, std::fs::read(&p).unwrap()));
            }
        }
    }
    let tree = |h: &Host| {
        let mut out = Vec::new();
        walk(&h.config.state_root, &mut out);
        walk(&h.config.unit_dir, &mut out);
        out
    };
    // A new Agent: everything is created, the unit is written and started.
    let before = tree(&h);
    let calls = h.fake.calls().len();
    let p = plan_of(&h, "n1", "a1", "rev-1", 1, None);
    assert_eq!(tree(&h), before, "a plan wrote something");
    assert_eq!(
        h.fake.calls().len(),
        calls,
        "a plan made a changing call: {:?}",
        h.fake.calls()
    );
    assert_eq!(
        (p.account, p.agent_directory, p.snapshot, p.unit_file),
        (
            Change::Create,
            Change::Create,
            Change::Create,
            Change::Create
        )
    );
    assert_eq!(p.password_file, Change::Create);
    assert!(p.refusal.is_none(), "{p:?}");
    let did = deploy_did(&h, "n1", "a1", "rev-1", 1);
    assert_eq!((p.snapshot.writes(), p.daemon_reload, p.restart), did);

    // The same revision again: nothing to do.
    let p = plan_of(&h, "n1", "a1", "rev-1", 1, None);
    assert_eq!(
        (
            p.account,
            p.agent_directory,
            p.snapshot,
            p.unit_file,
            p.password_file
        ),
        (
            Change::Keep,
            Change::Keep,
            Change::Keep,
            Change::Keep,
            Change::Keep
        )
    );
    assert_eq!(
        (p.snapshot.writes(), p.daemon_reload, p.restart),
        (false, false, false)
    );
    assert_eq!(
        (p.snapshot.writes(), p.daemon_reload, p.restart),
        deploy_did(&h, "n1", "a1", "rev-1", 1)
    );

    // A new revision: a snapshot and a restart, no daemon-reload; rev-1 could be restored.
    let before = tree(&h);
    let calls = h.fake.calls().len();
    let p = plan_of(&h, "n1", "a1", "rev-2", 2, Some(("rev-1", 1)));
    assert_eq!(tree(&h), before, "a plan wrote something");
    assert_eq!(h.fake.calls().len(), calls);
    assert_eq!(
        p.restore_available.as_ref().map(|r| r.as_str()),
        Some("rev-1")
    );
    assert_eq!(
        (p.snapshot.writes(), p.daemon_reload, p.restart),
        (true, false, true)
    );
    assert_eq!(
        (p.snapshot.writes(), p.daemon_reload, p.restart),
        deploy_did(&h, "n1", "a1", "rev-2", 2)
    );

    // A changed unit setting on the host: the unit is rewritten, reloaded and restarted.
    h.config.unit.tasks_max = Some(77);
    let p = plan_of(&h, "n1", "a1", "rev-3", 3, None);
    assert_eq!(p.unit_file, Change::Replace);
    assert_eq!(
        (p.snapshot.writes(), p.daemon_reload, p.restart),
        (true, true, true)
    );
    assert_eq!(
        (p.snapshot.writes(), p.daemon_reload, p.restart),
        deploy_did(&h, "n1", "a1", "rev-3", 3)
    );

    // An older revision is refused as activate would refuse it, and nothing is planned.
    let p = plan_of(&h, "n1", "a1", "rev-1", 1, None);
    assert_eq!(
        p.refusal.as_ref().map(|f| f.code),
        Some(FailureCode::Superseded),
        "{p:?}"
    );
    // A missing Namespace too.
    let p = plan_of(&h, "n9", "a1", "rev-1", 1, None);
    assert_eq!(
        p.refusal.as_ref().map(|f| f.code),
        Some(FailureCode::NamespaceMissing),
        "{p:?}"
    );
}

// ---- initial workspace files (engine/workspace.rs) ----

const SECRET_MARK: &str = "unique-content-marker-7f3a";

fn ws_file(name: &str, content: &str) -> clawfleet_protocol::workspace::WorkspaceFile {
    clawfleet_protocol::workspace::WorkspaceFile {
        name: clawfleet_protocol::workspace::WorkspaceName::new(name).unwrap(),
        content: content.as_bytes().to_vec(),
    }
}

fn three_files() -> Vec<clawfleet_protocol::workspace::WorkspaceFile> {
    vec![
        ws_file("AGENTS.md", &format!("# agents {SECRET_MARK}\n")),
        ws_file("SOUL.md", "be kind\n"),
        ws_file("memory/notes.md", "first note\n"),
    ]
}

fn prepare_with(
    rev: &str,
    number: u64,
    files: Option<Vec<clawfleet_protocol::workspace::WorkspaceFile>>,
) -> Operation {
    let manifest = three_files().iter().map(|f| f.meta()).collect();
    Operation::PrepareRevision(PrepareArgs {
        workspace: Some(clawfleet_protocol::workspace::WorkspaceSetup { manifest, files }),
        namespace: ns("ns1"),
        agent: agent("a1"),
        revision: spec(rev, number),
        egress: None,
    })
}

fn workspace_outcome(r: &OperationResult) -> Option<WorkspaceOutcome> {
    match r {
        OperationResult::PrepareRevision(p) => p.workspace,
        other => panic!("{other:?}"),
    }
}

/// Issue 27: the workspace set's limits (count, size, total, duplicates) were checked after
/// provisioning, so a refused set left an account, a port, a directory, a snapshot and a
/// fence behind. They are checked before anything.
#[test]
fn a_refused_workspace_set_leaves_nothing_behind() {
    use clawfleet_protocol::workspace::{
        WORKSPACE_MAX_FILE_BYTES, WORKSPACE_MAX_FILES, WORKSPACE_MAX_TOTAL_BYTES, WorkspaceSetup,
    };
    let big = |n: usize| "x".repeat(n);
    let sets: Vec<(&str, Vec<clawfleet_protocol::workspace::WorkspaceFile>)> = vec![
        (
            "too many",
            (0..=WORKSPACE_MAX_FILES)
                .map(|i| ws_file(&format!("f{i}.md"), "x"))
                .collect(),
        ),
        (
            "too large",
            vec![ws_file("big.md", &big(WORKSPACE_MAX_FILE_BYTES + 1))],
        ),
        (
            "total",
            (0..3)
                .map(|i| ws_file(&format!("t{i}.md"), &big(WORKSPACE_MAX_TOTAL_BYTES / 2 - 1)))
                .collect(),
        ),
        (
            "twice",
            vec![ws_file("SOUL.md", "a\n"), ws_file("SOUL.md", "a\n")],
        ),
    ];
    for (what, files) in sets {
        let h = Host::new();
        h.ok(ensure("ns1"));
        h.fake.clear_calls();
        let manifest = files.iter().map(|f| f.meta()).collect();
        let op = Operation::PrepareRevision(PrepareArgs {
            workspace: Some(WorkspaceSetup {
                manifest,
                files: Some(files),
            }),
            namespace: ns("ns1"),
            agent: agent("a1"),
            revision: spec("r1", 1),
            egress: None,
        });
        let f = match h.run_fenced(op, Some(5)) {
            Ok(r) => panic!("{what}: accepted: {r:?}"),
            Err(f) => f,
        };
        assert_eq!(f.code, FailureCode::InvalidInput, "{what}: {f}");
        assert!(f.message.contains("workspace"), "{what}: {f}");
        assert_nothing_of(&h, "a1");
        let paths = h.layout().agent(&id("ns1"), &id("a1"));
        assert!(!paths.fence.exists(), "{what}: fence record");
        assert!(h.fake.calls().is_empty(), "{what}: {:?}", h.fake.calls());
    }
}

#[test]
fn workspace_files_are_applied_once_and_live_edits_are_kept() {
    let h = Host::new();
    h.ok(ensure("ns1"));
    let paths = h.layout().agent(&id("ns1"), &id("a1"));
    let r = h.ok(prepare_with("rev-1", 1, Some(three_files())));
    assert_eq!(workspace_outcome(&r), Some(WorkspaceOutcome::Applied));
    let read = |n: &str| std::fs::read_to_string(paths.workspace.join(n)).unwrap();
    assert_eq!(read("SOUL.md"), "be kind\n");
    assert_eq!(read("memory/notes.md"), "first note\n");
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&paths.workspace.join("AGENTS.md")), 0o600);
    assert_eq!(mode(&paths.workspace.join("memory")), 0o700);
    assert_eq!(mode(&paths.workspace), 0o700);
    assert!(paths.workspace_request.is_file() && paths.workspace_applied.is_file());
    assert!(!paths.workspace_staging.exists());
    // The markers hold names and digests, never content.
    for marker in [&paths.workspace_request, &paths.workspace_applied] {
        let text = std::fs::read_to_string(marker).unwrap();
        assert!(
            text.contains("memory/notes.md") && !text.contains(SECRET_MARK),
            "{text}"
        );
    }
    // Nor does the snapshot or the result.
    let snapshot = paths.revision_dir(&id("rev-1"));
    for f in std::fs::read_dir(&snapshot).unwrap() {
        let text = std::fs::read_to_string(f.unwrap().path()).unwrap();
        assert!(!text.contains(SECRET_MARK));
    }
    assert!(!serde_json::to_string(&r).unwrap().contains(SECRET_MARK));

    // An edit in the live workspace survives later revisions, with or without the contents.
    std::fs::write(paths.workspace.join("SOUL.md"), "edited live\n").unwrap();
    let r2 = h.ok(prepare_with("rev-2", 2, Some(three_files())));
    assert_eq!(
        workspace_outcome(&r2),
        Some(WorkspaceOutcome::AlreadyApplied)
    );
    let r3 = h.ok(prepare_with("rev-3", 3, None));
    assert_eq!(
        workspace_outcome(&r3),
        Some(WorkspaceOutcome::AlreadyApplied)
    );
    assert_eq!(read("SOUL.md"), "edited live\n");
    // A prepare without a setup reports nothing about it.
    assert_eq!(
        workspace_outcome(&h.ok(prepare("ns1", "a1", "rev-4", 4))),
        None
    );
}

#[test]
fn a_planted_link_is_never_followed_and_setup_fails_until_it_is_gone() {
    let h = Host::new();
    h.ok(ensure("ns1"));
    let paths = h.layout().agent(&id("ns1"), &id("a1"));
    // First prepare without the setup creates the Agent (its state directory).
    h.ok(prepare("ns1", "a1", "rev-1", 1));
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("AGENTS.md"), "not yours\n").unwrap();

    // A link at the workspace directory itself.
    std::os::unix::fs::symlink(outside.path(), &paths.workspace).unwrap();
    let f = h.fails(prepare_with("rev-2", 2, Some(three_files())));
    assert_eq!(f.code, FailureCode::WorkspaceSetupFailed, "{f}");
    assert!(f.message.contains("symbolic link"), "{f}");
    assert!(
        !f.message.contains(SECRET_MARK) && !f.message.contains("/tmp"),
        "{f}"
    );
    assert_eq!(
        std::fs::read_to_string(outside.path().join("AGENTS.md")).unwrap(),
        "not yours\n"
    );
    assert_eq!(std::fs::read_dir(outside.path()).unwrap().count(), 1);
    assert!(paths.workspace_request.is_file() && !paths.workspace_applied.exists());
    assert!(!paths.workspace_staging.exists());
    // The start guard holds while the setup is requested and not applied.
    let uid = nix::unistd::getuid().as_raw();
    assert!(super::workspace::guard(&paths.dir, uid).is_err());

    // A link at one file's place inside a real workspace directory.
    std::fs::remove_file(&paths.workspace).unwrap();
    std::fs::create_dir(&paths.workspace).unwrap();
    std::os::unix::fs::symlink(
        outside.path().join("AGENTS.md"),
        paths.workspace.join("AGENTS.md"),
    )
    .unwrap();
    let f = h.fails(prepare_with("rev-2", 2, Some(three_files())));
    assert_eq!(f.code, FailureCode::WorkspaceSetupFailed, "{f}");
    assert!(
        f.message
            .contains("AGENTS.md: a symbolic link is in its place"),
        "{f}"
    );
    assert_eq!(
        std::fs::read_to_string(outside.path().join("AGENTS.md")).unwrap(),
        "not yours\n"
    );
    // A named pipe is refused the same way, and never opened.
    std::fs::remove_file(paths.workspace.join("AGENTS.md")).unwrap();
    nix::unistd::mkfifo(
        &paths.workspace.join("AGENTS.md"),
        nix::sys::stat::Mode::from_bits_truncate(0o600),
    )
    .unwrap();
    let f = h.fails(prepare_with("rev-2", 2, Some(three_files())));
    assert!(f.message.contains("a named pipe is in its place"), "{f}");

    // Once the obstacle is gone the next pass applies them; the files that an interrupted
    // attempt left (none here) or identical ones are kept.
    std::fs::remove_file(paths.workspace.join("AGENTS.md")).unwrap();
    std::fs::write(paths.workspace.join("SOUL.md"), "be kind\n").unwrap();
    let r = h.ok(prepare_with("rev-2", 2, Some(three_files())));
    assert_eq!(workspace_outcome(&r), Some(WorkspaceOutcome::Applied));
    assert!(super::workspace::guard(&paths.dir, uid).is_ok());
    // A different file already there is refused, naming it.
    let h2 = Host::new();
    h2.ok(ensure("ns1"));
    h2.ok(prepare("ns1", "a1", "rev-1", 1));
    let p2 = h2.layout().agent(&id("ns1"), &id("a1"));
    std::fs::create_dir_all(p2.workspace.join("memory")).unwrap();
    std::fs::write(p2.workspace.join("memory/notes.md"), "mine\n").unwrap();
    let f = h2.fails(prepare_with("rev-2", 2, Some(three_files())));
    assert!(
        f.message
            .contains("memory/notes.md is already in the workspace with other content"),
        "{f}"
    );
    assert_eq!(
        std::fs::read_to_string(p2.workspace.join("memory/notes.md")).unwrap(),
        "mine\n"
    );
}

#[test]
fn a_setup_without_contents_that_was_never_applied_fails_and_the_guard_holds() {
    let h = Host::new();
    h.ok(ensure("ns1"));
    let paths = h.layout().agent(&id("ns1"), &id("a1"));
    let uid = nix::unistd::getuid().as_raw();
    let f = h.fails(prepare_with("rev-1", 1, None));
    assert_eq!(f.code, FailureCode::WorkspaceSetupFailed);
    assert!(f.message.contains("no longer holds them"), "{f}");
    assert!(super::workspace::guard(&paths.dir, uid).is_err());
    // Contents that are not the manifest's are refused as input.
    let mut other = three_files();
    other[1] = ws_file("SOUL.md", "something else\n");
    let f = h.fails(prepare_with("rev-1", 1, Some(other)));
    assert_eq!(f.code, FailureCode::InvalidInput, "{f}");
    // No request at all: the guard lets the gateway start.
    let bare = tempfile::tempdir().unwrap();
    assert!(super::workspace::guard(bare.path(), uid).is_ok());
    // A completion marker owned by someone else does not count.
    std::fs::write(
        bare.path().join(crate::layout::WORKSPACE_REQUEST_FILE),
        "{}",
    )
    .unwrap();
    std::fs::write(
        bare.path().join(crate::layout::WORKSPACE_APPLIED_FILE),
        "{}",
    )
    .unwrap();
    assert!(super::workspace::guard(bare.path(), uid + 1).is_err());
    assert!(super::workspace::guard(bare.path(), uid).is_ok());
}

// ---- host hooks (engine/hooks.rs) ----

/// Installs a hook script for `event` (mode 0700 unless given) in the test host's hooks_dir.
fn hook(h: &Host, event: &str, name: &str, body: &str, mode: u32) -> std::path::PathBuf {
    let root = &h.config.hooks_dir;
    let dir = root.join(event);
    std::fs::create_dir_all(&dir).unwrap();
    for d in [root.as_path(), dir.as_path()] {
        std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let p = dir.join(name);
    std::fs::write(&p, format!("#!/bin/sh\n{body}\n")).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
    p
}

fn hook_log(h: &Host) -> std::path::PathBuf {
    h.config.state_root.parent().unwrap().join("hooks.log")
}

fn read_log(h: &Host) -> Vec<String> {
    std::fs::read_to_string(hook_log(h))
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

#[test]
fn hooks_run_in_order_with_a_clean_environment_and_start_hooks_set_the_launch_environment() {
    let h = Host::new();
    let log = hook_log(&h).display().to_string();
    hook(
        &h,
        "after-namespace-prepared",
        "10-ns",
        &format!("echo ns:$CLAWFLEET_NAMESPACE_ID >> {log}"),
        0o700,
    );
    hook(
        &h,
        "before-workload-start",
        "20-b",
        &format!(
            "echo start-b:$CLAWFLEET_REVISION_ID:$CLAWFLEET_REVISION_NUMBER >> {log}; echo REGION=eu-west"
        ),
        0o700,
    );
    hook(
        &h,
        "before-workload-start",
        "10-a",
        &format!(
            "echo start-a:$CLAWFLEET_AGENT_ID:$CLAWFLEET_SERVICE_PRINCIPAL_ID >> {log}; \
             env | cut -d= -f1 | sort | tr '\\n' ' ' >> {log}; echo >> {log}; \
             echo '# a comment'; echo CRED_REF=vault:kv/agents/a1"
        ),
        0o700,
    );
    hook(
        &h,
        "before-workload-stop",
        "10-a",
        &format!("echo stop-a >> {log}"),
        0o700,
    );
    hook(
        &h,
        "before-workload-stop",
        "20-b",
        &format!("echo stop-b >> {log}"),
        0o700,
    );
    // Editors' leftovers are not hooks.
    hook(
        &h,
        "before-workload-stop",
        "10-a~",
        &format!("echo backup >> {log}"),
        0o700,
    );
    h.ok(ensure("ns1"));
    h.ok(prepare("ns1", "a1", "rev-1", 1));
    h.ok(activate("ns1", "a1", "rev-1", 1));
    let paths = h.layout().agent(&id("ns1"), &id("a1"));
    let env = std::fs::read_to_string(&paths.launch_env).unwrap();
    assert!(
        env.contains("CRED_REF=\"vault:kv/agents/a1\"\n") && env.contains("REGION=\"eu-west\"\n"),
        "{env}"
    );
    assert_eq!(
        std::fs::metadata(&paths.launch_env)
            .unwrap()
            .permissions()
            .mode()
            & 0o777,
        0o600
    );
    let unit = std::fs::read_to_string(&paths.unit_file).unwrap();
    assert!(
        unit.contains(&format!(
            "EnvironmentFile=-{}\n",
            paths.launch_env.display()
        )),
        "{unit}"
    );
    h.ok(Operation::StopRevision(rargs("ns1", "a1", "rev-1", 1)));
    let lines = read_log(&h);
    assert_eq!(lines[0], "ns:ns1");
    assert_eq!(lines[1], "start-a:a1:sp-a1");
    // Only the ids and PATH (sh adds PWD, SHLVL and _ itself).
    let names: Vec<&str> = lines[2]
        .split_whitespace()
        .filter(|n| !matches!(*n, "PWD" | "SHLVL" | "_"))
        .collect();
    assert_eq!(
        names,
        [
            "CLAWFLEET_AGENT_ID",
            "CLAWFLEET_EVENT",
            "CLAWFLEET_NAMESPACE_ID",
            "CLAWFLEET_NAMESPACE_NAME",
            "CLAWFLEET_OPERATION_ID",
            "CLAWFLEET_REVISION_ID",
            "CLAWFLEET_REVISION_NUMBER",
            "CLAWFLEET_SERVICE_PRINCIPAL_ID",
            "PATH"
        ],
        "{}",
        lines[2]
    );
    assert_eq!(lines[3], "start-b:rev-1:1");
    // Cleanup in reverse order.
    assert_eq!(&lines[4..], ["stop-b", "stop-a"]);
}

#[test]
fn a_failing_start_hook_prevents_the_launch_and_the_previous_revision_keeps_serving() {
    let h = Host::new();
    h.ok(ensure("ns1"));
    h.ok(prepare("ns1", "a1", "rev-1", 1));
    h.ok(activate("ns1", "a1", "rev-1", 1));
    let log = hook_log(&h).display().to_string();
    hook(
        &h,
        "before-workload-start",
        "10-fail",
        "echo 'token sk-ant-api03-abcdefghijklmnopqrstuvwx' >&2; exit 3",
        0o700,
    );
    hook(
        &h,
        "before-workload-stop",
        "10-stop",
        &format!("echo stop >> {log}"),
        0o700,
    );
    h.ok(prepare("ns1", "a1", "rev-2", 2));
    h.fake.clear_calls();
    let f = h.fails(activate("ns1", "a1", "rev-2", 2));
    assert_eq!(f.code, FailureCode::HookFailed, "{f}");
    assert!(
        f.message.contains("before-workload-start/10-fail") && !f.message.contains("sk-ant"),
        "{f}"
    );
    assert!(
        !h.fake.calls().iter().any(|c| c.starts_with("restart")),
        "{:?}",
        h.fake.calls()
    );
    let paths = h.layout().agent(&id("ns1"), &id("a1"));
    let current = std::fs::read_link(&paths.current).unwrap();
    assert_eq!(current, AgentPaths::current_target(&id("rev-1")));
    // No start hook succeeded, so nothing is compensated.
    assert!(read_log(&h).is_empty());
}

#[test]
fn a_readiness_failure_after_the_start_hooks_runs_the_stop_hooks_once() {
    let h = Host::new();
    let log = hook_log(&h).display().to_string();
    hook(
        &h,
        "before-workload-start",
        "10-ok",
        &format!("echo start >> {log}"),
        0o700,
    );
    hook(
        &h,
        "before-workload-stop",
        "10-stop",
        &format!("echo stop:$CLAWFLEET_REVISION_ID >> {log}"),
        0o700,
    );
    h.ok(ensure("ns1"));
    let port = port_of(&h.ok(prepare("ns1", "a1", "rev-1", 1)));
    h.fake.set_behaviour(port, Behaviour::NeverReady);
    let f = h.fails(activate("ns1", "a1", "rev-1", 1));
    assert_eq!(f.code, FailureCode::ReadinessTimeout, "{f}");
    assert_eq!(read_log(&h), ["start", "stop:rev-1"]);
}

#[test]
fn unsafe_hooks_are_refused_and_hanging_ones_killed() {
    let mut h = Host::new();
    h.config.limits.hook_timeout = Duration::from_millis(300);
    h.ok(ensure("ns1"));
    let p = hook(&h, "before-workload-start", "10-gw", "exit 0", 0o770);
    h.ok(prepare("ns1", "a1", "rev-1", 1));
    let f = h.fails(activate("ns1", "a1", "rev-1", 1));
    assert_eq!(f.code, FailureCode::HookRefused, "{f}");
    assert!(
        f.message.contains("before-workload-start/10-gw")
            && f.message.contains("group- or world-writable"),
        "{f}"
    );
    // A link is not followed.
    std::fs::remove_file(&p).unwrap();
    std::os::unix::fs::symlink("/bin/true", &p).unwrap();
    let f = h.fails(activate("ns1", "a1", "rev-1", 1));
    assert!(f.message.contains("not a regular file"), "{f}");
    std::fs::remove_file(&p).unwrap();
    // A writable event directory makes every hook in it untrusted.
    hook(&h, "before-workload-start", "10-gw", "exit 0", 0o700);
    let dir = h.config.hooks_dir.join("before-workload-start");
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    let f = h.fails(activate("ns1", "a1", "rev-1", 1));
    assert!(f.message.contains("directory before-workload-start"), "{f}");
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    // A hook that hangs (with a child of its own) is killed at the limit.
    hook(
        &h,
        "before-workload-start",
        "10-gw",
        "sleep 30 & sleep 30",
        0o700,
    );
    let t = Instant::now();
    let f = h.fails(activate("ns1", "a1", "rev-1", 1));
    assert_eq!(f.code, FailureCode::HookTimeout, "{f}");
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    // A reserved name or a credential-looking value is refused, naming the line.
    hook(
        &h,
        "before-workload-start",
        "10-gw",
        "echo LD_PRELOAD=/tmp/x.so",
        0o700,
    );
    let f = h.fails(activate("ns1", "a1", "rev-1", 1));
    assert_eq!(f.code, FailureCode::HookOutputRefused, "{f}");
    assert!(f.message.contains("LD_PRELOAD is reserved"), "{f}");
    hook(
        &h,
        "before-workload-start",
        "10-gw",
        "echo API_KEY=sk-ant-api03-abcdefghijklmnopqrstuvwxyz",
        0o700,
    );
    let f = h.fails(activate("ns1", "a1", "rev-1", 1));
    assert!(
        f.message.contains("looks like a credential") && !f.message.contains("sk-ant"),
        "{f}"
    );
}

#[test]
fn a_failing_namespace_delete_hook_removes_nothing() {
    let h = Host::new();
    h.ok(ensure("ns1"));
    hook(&h, "before-namespace-delete", "10-keep", "exit 1", 0o700);
    let f = h.fails(Operation::DeleteNamespace(NamespaceArgs {
        namespace: ns("ns1"),
    }));
    assert_eq!(f.code, FailureCode::HookFailed, "{f}");
    assert!(h.layout().namespace_marker(&id("ns1")).is_file());
    hook(&h, "before-namespace-delete", "10-keep", "exit 0", 0o700);
    h.ok(Operation::DeleteNamespace(NamespaceArgs {
        namespace: ns("ns1"),
    }));
    assert!(!h.layout().namespace_dir(&id("ns1")).exists());
}

#[test]
fn a_hook_that_leaves_a_daemon_holding_its_output_does_not_keep_hostd_waiting() {
    let h = Host::new();
    let pid_file = h.config.state_root.parent().unwrap().join("daemon.pid");
    hook(
        &h,
        "before-workload-start",
        "10-daemon",
        &format!(
            "setsid sh -c 'echo $$ > {}; exec sleep 30' & \
             while [ ! -s {} ]; do sleep 0.01; done; echo DAEMON_REF=started",
            pid_file.display(),
            pid_file.display()
        ),
        0o700,
    );
    h.ok(ensure("ns1"));
    h.ok(prepare("ns1", "a1", "rev-1", 1));
    let t = Instant::now();
    let outcome = h.run(activate("ns1", "a1", "rev-1", 1));
    let elapsed = t.elapsed();
    // The daemon is this test's to remove, by its own pid.
    if let Ok(pid) = std::fs::read_to_string(&pid_file)
        && let Ok(pid) = pid.trim().parse::<i32>()
    {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
    assert!(outcome.is_ok(), "{outcome:?}");
    assert!(
        elapsed < Duration::from_secs(5),
        "hostd waited {elapsed:?} for the daemon's pipe"
    );
    // What the hook printed before it exited still counts.
    let env = std::fs::read_to_string(h.layout().agent(&id("ns1"), &id("a1")).launch_env).unwrap();
    assert!(env.contains("DAEMON_REF=\"started\""), "{env}");
}

mod fastpath;
mod fences;
mod hardening;

/// Issue 27: activating (or verifying) an Agent that was never prepared on the host said
/// `OWNERSHIP_MISMATCH`, as if something foreign were in the way. It is `AGENT_MISSING`, and
/// nothing is left behind.
#[test]
fn activating_a_never_prepared_agent_is_agent_missing() {
    let h = Host::new();
    h.ok(ensure("ns1"));
    h.fake.clear_calls();
    let f = h.fails(activate("ns1", "a1", "r1", 1));
    assert_eq!(f.code, FailureCode::AgentMissing, "{f}");
    assert!(
        f.message.contains("a1") && f.message.contains("prepare"),
        "{f}"
    );
    let f = h.fails(Operation::VerifyRevision(rargs("ns1", "a1", "r1", 1)));
    assert_eq!(f.code, FailureCode::AgentMissing, "{f}");
    assert_nothing_of(&h, "a1");
    assert!(h.fake.calls().is_empty(), "{:?}", h.fake.calls());
}

/// Issue 27: a hand-edited unit file (NoNewPrivileges removed, MemoryMax raised) was reported
/// as synced. `status` names how the unit differs from hostd's text, and a drop-in; the next
/// activation rewrites the file.
#[test]
fn status_reports_a_hand_edited_unit_file_and_drop_ins() {
    let h = Host::new();
    h.ok(ensure("ns1"));
    h.ok(prepare("ns1", "a1", "r1", 1));
    h.ok(activate("ns1", "a1", "r1", 1));
    let drift = |h: &Host| match h.ok(Operation::Status(StatusArgs::default())) {
        OperationResult::Status(inv) => inv.namespaces[0].agents[0].unit_drift.clone(),
        other => panic!("{other:?}"),
    };
    assert_eq!(drift(&h), None);
    let paths = h.layout().agent(&id("ns1"), &id("a1"));
    let text = std::fs::read_to_string(&paths.unit_file).unwrap();
    let edited = text
        .replace("NoNewPrivileges=yes\n", "")
        .replace("MemoryMax=2G\n", "MemoryMax=64G\n");
    assert_ne!(edited, text);
    std::fs::write(&paths.unit_file, &edited).unwrap();
    let why = drift(&h).expect("drift reported");
    assert!(
        why.contains("`MemoryMax=64G`")
            && why.contains("`MemoryMax=2G`")
            && why.contains("`NoNewPrivileges=yes`"),
        "{why}"
    );
    // A drop-in next to a correct file.
    std::fs::write(&paths.unit_file, &text).unwrap();
    let dropins = h.config.unit_dir.join(format!("{}.d", paths.unit_name));
    std::fs::create_dir_all(&dropins).unwrap();
    std::fs::write(
        dropins.join("override.conf"),
        "[Service]\nMemoryMax=infinity\n",
    )
    .unwrap();
    let why = drift(&h).expect("drift reported");
    assert!(why.contains("override.conf"), "{why}");
    std::fs::remove_dir_all(&dropins).unwrap();
    // A unit file removed under an activated Agent.
    std::fs::remove_file(&paths.unit_file).unwrap();
    let why = drift(&h).expect("drift reported");
    assert!(why.contains("no unit file"), "{why}");
    // Activation puts hostd's text back.
    std::fs::write(&paths.unit_file, &edited).unwrap();
    h.ok(activate("ns1", "a1", "r1", 1));
    assert_eq!(drift(&h), None);
}

/// Issue 28: on a host that gives Agents their own network namespace, activation writes the
/// namespace, port socket and front units next to the gateway's, starts the socket, and the
/// gateway's listener counts only inside the namespace with root holding the port on the
/// host; drift names a missing companion and a missing namespace; delete removes them.
#[test]
fn an_agent_with_its_own_network_gets_its_companion_units_and_their_drift() {
    let h = Host::new();
    h.fake.set_netns_support(true);
    h.ok(ensure("ns1"));
    h.ok(prepare("ns1", "a1", "r1", 1));
    h.fake.clear_calls();
    h.ok(activate("ns1", "a1", "r1", 1));
    let paths = h.layout().agent(&id("ns1"), &id("a1"));
    let net = crate::unit::AgentNet::for_unit(&paths.unit_name, h.config.front_hold_ms);
    let unit = std::fs::read_to_string(&paths.unit_file).unwrap();
    assert!(
        unit.contains(&format!("\nJoinsNamespaceOf={}\n", net.net_unit))
            && unit.contains("\nPrivateNetwork=yes\n"),
        "{unit}"
    );
    for name in [&net.net_unit, &net.socket_unit, &net.front_unit] {
        let file = h.config.unit_dir.join(name);
        let text = std::fs::read_to_string(&file).unwrap();
        assert!(
            crate::unit::is_owned_by(&text, &id("ns1"), &id("a1")),
            "{text}"
        );
        let mode = std::fs::metadata(&file).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, crate::unit::FILE_MODE, "{name}");
    }
    let calls = h.fake.calls();
    assert!(
        calls.contains(&format!("start {}", net.socket_unit)),
        "{calls:?}"
    );
    let drift = |h: &Host| match h.ok(Operation::Status(StatusArgs::default())) {
        OperationResult::Status(inv) => inv.namespaces[0].agents[0].unit_drift.clone(),
        other => panic!("{other:?}"),
    };
    assert_eq!(drift(&h), None);
    // A squatter on the host's side of the port is not the socket unit's root.
    h.fake.set_squatter(18700, 1234);
    h.ok(prepare("ns1", "a1", "r2", 2));
    let f = h.fails(activate("ns1", "a1", "r2", 2));
    assert_eq!(f.code, FailureCode::ListenerNotOwned, "{f}");
    assert!(
        f.message.contains("on the host") && f.message.contains("uid 1234"),
        "{f}"
    );
    h.fake.clear_squatter(18700);
    h.ok(activate("ns1", "a1", "r2", 2));

    std::fs::remove_file(h.config.unit_dir.join(&net.front_unit)).unwrap();
    let why = drift(&h).expect("drift reported");
    assert!(
        why.contains(&net.front_unit) && why.contains("missing"),
        "{why}"
    );
    h.fake.remove_netns(true);
    let why = drift(&h).expect("drift reported");
    assert!(
        why.contains("network namespace") && why.contains(&net.netns),
        "{why}"
    );
    h.fake.remove_netns(false);
    // The next activation writes the missing file again.
    h.ok(activate("ns1", "a1", "r2", 2));
    assert_eq!(drift(&h), None);

    h.fake.clear_calls();
    match h.ok(Operation::DeleteAgent(AgentArgs {
        namespace: ns("ns1"),
        agent: agent("a1"),
    })) {
        OperationResult::DeleteAgent(r) => assert!(r.removed),
        other => panic!("{other:?}"),
    }
    for name in [&net.net_unit, &net.socket_unit, &net.front_unit] {
        assert!(!h.config.unit_dir.join(name).exists(), "{name} removed");
    }
}

fn prepare_with_egress(
    n: &str,
    a: &str,
    rev: &str,
    number: u64,
    egress: Option<clawfleet_protocol::egress::Egress>,
) -> Operation {
    match prepare(n, a, rev, number) {
        Operation::PrepareRevision(args) => {
            Operation::PrepareRevision(PrepareArgs { egress, ..args })
        }
        other => other,
    }
}

/// Issue 28: an Agent's own egress settings narrow the pool's. Asking for more than the pool
/// allows is refused with EGRESS_NOT_ALLOWED before anything is created; a narrowing is
/// rendered into the Agent's network unit at activation, which reloads the running unit; the
/// same revision prepared again with other settings takes them; a plan shows the rewrite;
/// drift compares with the settings of the revision served.
#[test]
fn an_agents_egress_narrows_the_pools_and_is_applied_at_activation() {
    use clawfleet_protocol::egress::Egress;
    let h = Host::with_config(
        "[network]\negress_ports = [443, 8443]\negress_allow = [\"10.1.0.0/16\"]",
    );
    h.fake.set_netns_support(true);
    h.ok(ensure("ns1"));
    let paths = h.layout().agent(&id("ns1"), &id("a1"));
    let wider = Egress {
        ports: Some(vec![443, 22]),
        allow: None,
    };
    let f = h.fails(prepare_with_egress("ns1", "a1", "r1", 1, Some(wider)));
    assert_eq!(f.code, FailureCode::EgressNotAllowed, "{f}");
    assert!(f.message.contains("egress.ports[1] is 22"), "{f}");
    assert!(!paths.dir.exists(), "nothing created");
    let f = h.fails(prepare_with_egress(
        "ns1",
        "a1",
        "r1",
        1,
        Some(Egress {
            ports: None,
            allow: Some(vec!["169.254.169.254/32".into()]),
        }),
    ));
    assert_eq!(f.code, FailureCode::EgressNotAllowed, "{f}");

    let narrow = Egress {
        ports: Some(vec![8443]),
        allow: Some(vec!["10.1.2.0/24".into()]),
    };
    h.ok(prepare_with_egress(
        "ns1",
        "a1",
        "r1",
        1,
        Some(narrow.clone()),
    ));
    h.ok(activate("ns1", "a1", "r1", 1));
    let net = crate::unit::AgentNet::for_unit(&paths.unit_name, h.config.front_hold_ms);
    let net_file = h.config.unit_dir.join(&net.net_unit);
    let text = std::fs::read_to_string(&net_file).unwrap();
    assert!(
        text.contains(" --egress-port 8443 --egress-allow 10.1.2.0/24\n")
            && !text.contains("--egress-port 443 "),
        "{text}"
    );
    let drift = |h: &Host| match h.ok(Operation::Status(StatusArgs::default())) {
        OperationResult::Status(inv) => inv.namespaces[0].agents[0].unit_drift.clone(),
        other => panic!("{other:?}"),
    };
    assert_eq!(
        drift(&h),
        None,
        "drift reads the served revision's settings"
    );

    // The same revision again, with the pool's settings: the net unit is rewritten and the
    // running unit reloaded.
    h.fake
        .start_unit(&net.net_unit, Duration::from_secs(1))
        .unwrap();
    let plan = match h.ok(Operation::PlanRevision(
        clawfleet_protocol::plan::PlanArgs {
            namespace: ns("ns1"),
            agent: agent("a1"),
            revision: spec("r1", 1),
            restore: None,
            egress: None,
        },
    )) {
        OperationResult::PlanRevision(p) => *p,
        other => panic!("{other:?}"),
    };
    assert!(plan.daemon_reload && plan.refusal.is_none(), "{plan:?}");
    h.ok(prepare("ns1", "a1", "r1", 1));
    h.fake.clear_calls();
    h.ok(activate("ns1", "a1", "r1", 1));
    let text = std::fs::read_to_string(&net_file).unwrap();
    assert!(
        text.contains(" --egress-port 443 --egress-port 8443 --egress-allow 10.1.0.0/16\n"),
        "{text}"
    );
    let calls = h.fake.calls();
    assert!(
        calls.contains(&format!("reload {}", net.net_unit)),
        "{calls:?}"
    );
    assert_eq!(drift(&h), None);
    // Unchanged: no reload.
    h.fake.clear_calls();
    h.ok(activate("ns1", "a1", "r1", 1));
    assert!(!h.fake.calls().iter().any(|c| c.starts_with("reload")));
}

/// An Agent whose network unit is from before systemd held its namespace (no
/// `PrivateNetwork=yes`; the namespace bound under /run/netns) moves at its next activation:
/// its net unit is restarted, not reloaded (a reload would run the new netns-up in the host's
/// namespace, which it refuses).
#[test]
fn an_agent_from_before_systemd_held_namespaces_moves_by_a_restart() {
    let h = Host::new();
    h.fake.set_netns_support(true);
    h.ok(ensure("ns1"));
    h.ok(prepare("ns1", "a1", "r1", 1));
    h.ok(activate("ns1", "a1", "r1", 1));
    let paths = h.layout().agent(&id("ns1"), &id("a1"));
    let net = crate::unit::AgentNet::for_unit(&paths.unit_name, h.config.front_hold_ms);
    let file = h.config.unit_dir.join(&net.net_unit);
    let old = std::fs::read_to_string(&file)
        .unwrap()
        .replace("PrivateNetwork=yes\n", "");
    std::fs::write(&file, old).unwrap();
    h.fake
        .start_unit(&net.net_unit, Duration::from_secs(1))
        .unwrap();
    h.ok(prepare("ns1", "a1", "r2", 2));
    h.fake.clear_calls();
    h.ok(activate("ns1", "a1", "r2", 2));
    let calls = h.fake.calls();
    assert!(
        calls.contains(&format!("restart {}", net.net_unit)),
        "{calls:?}"
    );
    assert!(!calls.iter().any(|c| c.starts_with("reload")), "{calls:?}");
    assert!(
        std::fs::read_to_string(&file)
            .unwrap()
            .contains("\nPrivateNetwork=yes\n")
    );
}

/// Issue 28: an Agent with egress settings on a host that cannot give it a namespace is
/// refused, not silently left with the host's network.
#[test]
fn egress_settings_are_refused_where_the_host_cannot_confine_egress() {
    let h = Host::new();
    h.fake.set_netns_support(false);
    h.ok(ensure("ns1"));
    let f = h.fails(prepare_with_egress(
        "ns1",
        "a1",
        "r1",
        1,
        Some(clawfleet_protocol::egress::Egress {
            ports: Some(vec![]),
            allow: None,
        }),
    ));
    assert_eq!(f.code, FailureCode::EgressNotAllowed, "{f}");
    assert!(f.message.contains("cannot confine"), "{f}");
    h.ok(prepare("ns1", "a1", "r1", 1));
}

/// Issue 27: the failed unit of a deleted Agent stayed in systemd's failed list. Deleting the
/// Agent (or its Namespace) resets the unit's failed state after stopping it.
#[test]
fn deleting_an_agent_resets_its_failed_unit() {
    for namespace in [false, true] {
        let h = Host::new();
        h.ok(ensure("ns1"));
        let port = port_of(&h.ok(prepare("ns1", "a1", "r1", 1)));
        h.fake.set_behaviour(port, Behaviour::ExitConfig);
        h.fails(activate("ns1", "a1", "r1", 1));
        let paths = h.layout().agent(&id("ns1"), &id("a1"));
        assert!(h.fake.unit_state(&paths.unit_name).unwrap().is_failed());
        h.fake.clear_calls();
        h.ok(if namespace {
            Operation::DeleteNamespace(NamespaceArgs {
                namespace: ns("ns1"),
            })
        } else {
            Operation::DeleteAgent(AgentArgs {
                namespace: ns("ns1"),
                agent: agent("a1"),
            })
        });
        let calls = h.fake.calls();
        let stop = calls
            .iter()
            .position(|c| c == &format!("stop {}", paths.unit_name));
        let reset = calls
            .iter()
            .position(|c| c == &format!("reset-failed {}", paths.unit_name));
        assert!(
            matches!((stop, reset), (Some(s), Some(r)) if s < r),
            "{calls:?}"
        );
    }
}
mod security;
