//! The coordinator's tests' backend: hostd's real engine (`hostd::engine`) over hostd's fake
//! privileged layer (`hostd::fake::FakeSystem`), one temporary state root per host, in process.
//! There is one model of hostd: whatever hostd accepts or refuses, these tests see. Fault
//! injection stays here, in the coordinator's tests: a transport error, a host failure, a
//! wrong host key, or a call that never returns (a coordinator crash mid-call), with or
//! without the host having applied the operation first.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clawfleet_protocol::failure::{Failure, FailureCode};
use clawfleet_protocol::operation::StatusArgs;
use clawfleet_protocol::result::{OperationResult, Step};
use clawfleet_protocol::{Fingerprint, Ident, Operation, OperationId};
use coordinator::backend::{Backend, CallError, CallOptions, Target};
use hostd::config::Config;
use hostd::engine::{Ctx, Engine};
use hostd::fake::FakeSystem;
use hostd::journal::Journal;
use hostd::system::System;

/// What to do at a given call number.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Inject {
    /// Return a transport error; the host sees nothing.
    Transport,
    /// Return this host failure; the host does nothing.
    Fail(FailureCode),
    /// The host presents a key other than the pinned one.
    HostKeyMismatch,
    /// The host refuses the coordinator's login (a coordinator not enrolled there).
    AuthRefused,
    /// Never return (the caller's future is dropped: a crash mid-call). The host applies the
    /// operation first when `applied` is true.
    Hang { applied: bool },
}

/// One Agent as its host's `status` reports it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HostAgent {
    /// Revision id → number, for every snapshot on the host.
    pub snapshots: BTreeMap<String, u64>,
    pub current: Option<String>,
    pub served: Option<String>,
    pub port: Option<u16>,
}

fn host_agent(a: &clawfleet_protocol::result::AgentInventory) -> HostAgent {
    HostAgent {
        snapshots: a
            .revisions
            .iter()
            .map(|r| (r.id.to_string(), r.number.get()))
            .collect(),
        current: a.observation.current.as_ref().map(Ident::to_string),
        served: a.observation.served.as_ref().map(Ident::to_string),
        port: a.observation.port,
    }
}

/// One simulated host: a state root, a unit directory and a journal in a temporary directory.
struct SimHost {
    _dir: tempfile::TempDir,
    config: Config,
    fake: FakeSystem,
    journal: Journal,
}

impl SimHost {
    fn new(name: &str, parent: Option<&std::path::Path>) -> Self {
        let dir = match parent {
            Some(p) => tempfile::tempdir_in(p).unwrap(),
            None => tempfile::tempdir().unwrap(),
        };
        let text = format!(
            "host_name = \"{name}\"\n[limits]\nlock_timeout_ms = 2000\nreadiness_timeout_ms = 2000\n"
        );
        let config = hostd::fake::test_config(dir.path(), &text, &["run"]).unwrap();
        let journal = Journal::open(&dir.path().join("journal"), 1000).unwrap();
        let fake = FakeSystem::new(&config.unit_dir);
        // Like the real test hosts: each Agent in a network namespace of its own.
        fake.set_netns_support(true);
        Self {
            fake,
            _dir: dir,
            config,
            journal,
        }
    }

    fn run(
        &self,
        op: &Operation,
        deadline: Duration,
        fence: Option<u64>,
    ) -> Result<OperationResult, Failure> {
        let engine = Engine::new(
            &self.config,
            &self.fake as &dyn System,
            Fingerprint::new(format!("SHA256:{}", "A".repeat(43))).unwrap(),
        );
        let cancelled = || false;
        let mut on_step = |_: Step| {};
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        let mut ctx = Ctx::new(
            OperationId::new("occ-test-op").unwrap(),
            Instant::now() + deadline,
            now,
            &cancelled,
            &mut on_step,
        );
        // As hostd's session does: the envelope's fence, for fenced operations only.
        ctx.fence = fence.filter(|_| op.kind().is_fenced());
        engine.execute(op, &mut ctx, &self.journal)
    }
}

/// The backend over in-process hostd engines, one per target name (hosts and, for the
/// worker's cluster tests, cluster names too).
#[derive(Default)]
pub struct EngineBackend {
    hosts: Mutex<BTreeMap<String, Arc<SimHost>>>,
    calls: AtomicUsize,
    inject: Mutex<BTreeMap<usize, Inject>>,
    log: Mutex<Vec<String>>,
    /// Agents whose every `activate-revision` fails with this code (a gateway that never
    /// becomes ready), without the host running it.
    failing: Mutex<BTreeMap<String, FailureCode>>,
    /// Activations running now, and the most at once.
    activating: AtomicUsize,
    most_activating: AtomicUsize,
    /// Where the simulated hosts' directories go (`None`: the system's temporary directory).
    parent: Option<std::path::PathBuf>,
    /// Hosts every call to fails with a transport error (the network to them is cut).
    cut_off: Mutex<std::collections::BTreeSet<String>>,
}

impl std::fmt::Debug for EngineBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EngineBackend").finish_non_exhaustive()
    }
}

impl EngineBackend {
    pub fn new() -> Self {
        Self::default()
    }

    /// Simulated hosts with their directories under `parent` (a benchmark puts them on tmpfs:
    /// on a fleet, the hosts' disks and CPUs are not the coordinator's).
    #[allow(dead_code)]
    pub fn with_hosts_in(parent: &std::path::Path) -> Self {
        Self {
            parent: Some(parent.to_path_buf()),
            ..Self::default()
        }
    }

    /// Cuts the network to `host` (every call fails with a transport error) or restores it.
    #[allow(dead_code)]
    pub fn cut_off(&self, host: &str, cut: bool) {
        let mut hosts = self.cut_off.lock().unwrap();
        if cut {
            hosts.insert(host.to_owned());
        } else {
            hosts.remove(host);
        }
    }

    /// Writes a line to an Agent's journal on `host`, as its gateway would.
    #[allow(dead_code)]
    pub fn gateway_log(&self, host: &str, ns: &str, agent: &str, message: &str) {
        let unit = hostd::layout::unit_name(&Ident::new(ns).unwrap(), &Ident::new(agent).unwrap());
        self.host(host).fake.log_line(&unit, message);
    }

    fn host(&self, name: &str) -> Arc<SimHost> {
        let mut hosts = self.hosts.lock().unwrap();
        hosts
            .entry(name.to_owned())
            .or_insert_with(|| Arc::new(SimHost::new(name, self.parent.as_deref())))
            .clone()
    }

    /// Injects a behaviour at call number `n` (0-based, counting every call).
    pub fn inject(&self, n: usize, what: Inject) {
        self.inject.lock().unwrap().insert(n, what);
    }

    /// Every later activation of `agent` fails with `code`.
    pub fn fail_activations_of(&self, agent: &str, code: FailureCode) {
        self.failing.lock().unwrap().insert(agent.to_owned(), code);
    }

    /// Starts counting concurrent activations afresh.
    pub fn reset_concurrency(&self) {
        self.most_activating.store(0, Ordering::SeqCst);
    }

    /// The most `activate-revision` calls that ran at once.
    pub fn most_concurrent_activations(&self) -> usize {
        self.most_activating.load(Ordering::SeqCst)
    }

    /// Calls made so far.
    pub fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }

    /// `"<target> <operation kind>"` for every call, in order.
    pub fn log(&self) -> Vec<String> {
        self.log.lock().unwrap().clone()
    }

    /// Adds a call to [`EngineBackend::log`] that a wrapping backend answered itself.
    #[allow(dead_code)]
    pub fn log_call(&self, target: &str, kind: &str) {
        self.calls.fetch_add(1, Ordering::SeqCst);
        self.log.lock().unwrap().push(format!("{target} {kind}"));
    }

    fn inventory(&self, host: &str) -> Vec<clawfleet_protocol::result::NamespaceInventory> {
        if !self.hosts.lock().unwrap().contains_key(host) {
            return Vec::new();
        }
        let op = Operation::Status(StatusArgs { namespace_id: None });
        match self.host(host).run(&op, Duration::from_secs(10), None) {
            Ok(OperationResult::Status(s)) => s.namespaces,
            other => panic!("status of {host}: {other:?}"),
        }
    }

    /// The Agent as hostd's `status` on that host reports it, if the host has it.
    pub fn agent(&self, host: &str, ns: &str, agent: &str) -> Option<HostAgent> {
        let inventory = self.inventory(host);
        let n = inventory.iter().find(|n| n.id.as_str() == ns)?;
        n.agents
            .iter()
            .find(|a| a.id.as_str() == agent)
            .map(host_agent)
    }

    /// Every Agent on every host: (host, Namespace, Agent) → what `status` reports.
    pub fn all_agents(&self) -> BTreeMap<(String, String, String), HostAgent> {
        let names: Vec<String> = self.hosts.lock().unwrap().keys().cloned().collect();
        let mut out = BTreeMap::new();
        for h in names {
            for n in self.inventory(&h) {
                for a in &n.agents {
                    out.insert(
                        (h.clone(), n.id.to_string(), a.id.to_string()),
                        host_agent(a),
                    );
                }
            }
        }
        out
    }

    /// Whether hostd on that host has the Namespace.
    pub fn has_namespace(&self, host: &str, ns: &str) -> bool {
        self.inventory(host).iter().any(|n| n.id.as_str() == ns)
    }
}

impl Backend for EngineBackend {
    async fn call(
        &self,
        target: impl Into<Target> + Send,
        operation: Operation,
        options: CallOptions,
    ) -> Result<OperationResult, CallError> {
        let target = target.into();
        let name = target.name().to_owned();
        let n = self.calls.fetch_add(1, Ordering::SeqCst);
        self.log
            .lock()
            .unwrap()
            .push(format!("{name} {}", operation.kind()));
        let injected = self.inject.lock().unwrap().remove(&n);
        if self.cut_off.lock().unwrap().contains(&name) {
            return Err(CallError::Transport {
                host: name,
                message: "connection timed out (the host is cut off)".into(),
            });
        }
        let host = self.host(&name);
        let run = |host: Arc<SimHost>, op: Operation| async move {
            tokio::task::spawn_blocking(move || host.run(&op, options.deadline, options.fence))
                .await
                .unwrap()
        };
        match injected {
            Some(Inject::Transport) => {
                return Err(CallError::Transport {
                    host: name,
                    message: "injected transport error".into(),
                });
            }
            Some(Inject::Fail(code)) => {
                return Err(CallError::Failed(Failure::new(code, "injected failure")));
            }
            Some(Inject::AuthRefused) => {
                return Err(CallError::AuthenticationRefused { host: name });
            }
            Some(Inject::HostKeyMismatch) => {
                return Err(CallError::HostKeyMismatch {
                    host: name,
                    presented: "SHA256:other".into(),
                    expected: "SHA256:pinned".into(),
                });
            }
            Some(Inject::Hang { applied }) => {
                if applied {
                    let _ = run(host, operation).await;
                }
                std::future::pending::<()>().await;
                unreachable!("a pending future never resolves");
            }
            None => {}
        }
        let Operation::ActivateRevision(args) = &operation else {
            return run(host, operation).await.map_err(CallError::Failed);
        };
        let failing = self
            .failing
            .lock()
            .unwrap()
            .get(args.agent.id.as_str())
            .copied();
        let now = self.activating.fetch_add(1, Ordering::SeqCst) + 1;
        self.most_activating.fetch_max(now, Ordering::SeqCst);
        // Long enough for overlapping activations to be seen.
        tokio::time::sleep(Duration::from_millis(20)).await;
        let result = match failing {
            Some(code) => Err(CallError::Failed(Failure::new(
                code,
                "injected: the gateway never became ready",
            ))),
            None => run(host, operation).await.map_err(CallError::Failed),
        };
        self.activating.fetch_sub(1, Ordering::SeqCst);
        result
    }
}

/// Records in `store` that the in-process host `host` (enrolled, so probed) enforces per-Agent
/// disk limits, as a host whose state root has project quotas or btrfs quota groups reports
/// it. Its real probe says `quotas: unavailable: …` (its state root is a temporary directory
/// on the runner's file system), and a host without quotas takes one Namespace only
/// (`HOST_NOT_QUOTA_LIMITED`, issue 26): tests that share a host between Namespaces stand for
/// a host that has them. The rest of the probe stays hostd's own answer.
pub async fn with_enforced_quotas(store: &coordinator::store::SharedStore, host: &str) {
    let mut probe = store
        .host(host)
        .await
        .unwrap()
        .and_then(|h| h.last_probe)
        .expect("the host was enrolled, so probed");
    probe["quotas"] = serde_json::json!("enforced: project quotas (bytes and inodes)");
    store.set_host_probe(host, &probe).await.unwrap();
}
