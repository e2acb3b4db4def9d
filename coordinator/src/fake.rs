//! An in-memory backend with hostd's semantics, for the worker's state-machine tests and the
//! API tests. It can fail a chosen call or hang in it (to simulate a coordinator crash
//! mid-call).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use clawfleet_protocol::failure::{Failure, FailureCode};
use clawfleet_protocol::result::*;
use clawfleet_protocol::{Ident, Operation};

use crate::backend::{Backend, CallError, CallOptions, Target};

/// The name a fake call is addressed to.
struct FakeHost {
    name: String,
}

/// One Agent on a fake host.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FakeAgent {
    pub snapshots: BTreeMap<String, u64>,
    pub current: Option<String>,
    pub served: Option<String>,
    pub port: u16,
}

/// What to do at a given call number.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Inject {
    /// Return a transport error.
    Transport,
    /// Return this host failure.
    Fail(FailureCode),
    /// The host presents a key other than the pinned one.
    HostKeyMismatch,
    /// Never return (the caller's future is dropped: a crash mid-call). The host applies the
    /// operation first when `applied` is true.
    Hang { applied: bool },
}

#[derive(Debug, Default)]
struct Hosts {
    namespaces: BTreeSet<(String, String)>,
    agents: BTreeMap<(String, String, String), FakeAgent>,
    next_port: BTreeMap<String, u16>,
    log: Vec<String>,
}

/// The fake backend.
#[derive(Debug, Default)]
pub struct FakeBackend {
    hosts: Mutex<Hosts>,
    calls: AtomicUsize,
    inject: Mutex<BTreeMap<usize, Inject>>,
}

impl FakeBackend {
    pub fn new() -> Self {
        Self::default()
    }

    fn with<T>(&self, f: impl FnOnce(&mut Hosts) -> T) -> T {
        let mut g = match self.hosts.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        f(&mut g)
    }

    /// Injects a behaviour at call number `n` (0-based, counting every call).
    pub fn inject(&self, n: usize, what: Inject) {
        if let Ok(mut m) = self.inject.lock() {
            m.insert(n, what);
        }
    }

    /// Calls made so far.
    pub fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }

    /// The call log: `host op agent rev`.
    pub fn log(&self) -> Vec<String> {
        self.with(|h| h.log.clone())
    }

    /// The state of one Agent on one host.
    pub fn agent(&self, host: &str, ns: &str, agent: &str) -> Option<FakeAgent> {
        self.with(|h| {
            h.agents
                .get(&(host.to_owned(), ns.to_owned(), agent.to_owned()))
                .cloned()
        })
    }

    /// Every Agent on every host: (host, namespace, agent) → state.
    pub fn all_agents(&self) -> BTreeMap<(String, String, String), FakeAgent> {
        self.with(|h| h.agents.clone())
    }

    /// Whether a Namespace exists on a host.
    pub fn has_namespace(&self, host: &str, ns: &str) -> bool {
        self.with(|h| h.namespaces.contains(&(host.to_owned(), ns.to_owned())))
    }

    fn observation(a: &FakeAgent) -> AgentObservation {
        AgentObservation {
            current: a.current.as_deref().and_then(|s| Ident::new(s).ok()),
            served: a.served.as_deref().and_then(|s| Ident::new(s).ok()),
            port: Some(a.port),
            unit: None,
        }
    }

    fn apply(&self, host: &str, op: &Operation) -> Result<OperationResult, Failure> {
        self.with(|h| {
            h.log.push(format!("{host} {}", op.kind()));
            let fail = |code, msg: &str| Err(Failure::new(code, msg));
            match op {
                Operation::EnsureNamespace(a) => {
                    h.namespaces
                        .insert((host.to_owned(), a.namespace.id.to_string()));
                    Ok(OperationResult::EnsureNamespace(EnsureNamespaceResult {
                        namespace_id: a.namespace.id.clone(),
                        created: true,
                    }))
                }
                Operation::DeleteNamespace(a) => {
                    let ns = a.namespace.id.to_string();
                    h.namespaces.remove(&(host.to_owned(), ns.clone()));
                    h.agents.retain(|(ho, n, _), _| !(ho == host && *n == ns));
                    Ok(OperationResult::DeleteNamespace(DeleteNamespaceResult {
                        namespace_id: a.namespace.id.clone(),
                        removed: true,
                        agents_removed: 0,
                    }))
                }
                Operation::PrepareRevision(a) => {
                    if !h
                        .namespaces
                        .contains(&(host.to_owned(), a.namespace.id.to_string()))
                    {
                        return fail(FailureCode::NamespaceMissing, "ensure first");
                    }
                    let key = (
                        host.to_owned(),
                        a.namespace.id.to_string(),
                        a.agent.id.to_string(),
                    );
                    if !h.agents.contains_key(&key) {
                        let port = h.next_port.entry(host.to_owned()).or_insert(18700);
                        let p = *port;
                        *port += 1;
                        h.agents.insert(
                            key.clone(),
                            FakeAgent {
                                port: p,
                                ..Default::default()
                            },
                        );
                    }
                    let Some(agent) = h.agents.get_mut(&key) else {
                        return fail(FailureCode::Internal, "agent vanished");
                    };
                    let current_number = agent
                        .current
                        .as_ref()
                        .and_then(|c| agent.snapshots.get(c))
                        .copied();
                    if current_number.is_some_and(|n| n > a.revision.number.get()) {
                        return Ok(OperationResult::PrepareRevision(PrepareResult {
                            ready: false,
                            created: false,
                            observation: Self::observation(agent),
                        }));
                    }
                    let created = agent
                        .snapshots
                        .insert(a.revision.id.to_string(), a.revision.number.get())
                        .is_none();
                    Ok(OperationResult::PrepareRevision(PrepareResult {
                        ready: true,
                        created,
                        observation: Self::observation(agent),
                    }))
                }
                Operation::ActivateRevision(a) => {
                    let key = (
                        host.to_owned(),
                        a.namespace.id.to_string(),
                        a.agent.id.to_string(),
                    );
                    let Some(agent) = h.agents.get_mut(&key) else {
                        return fail(FailureCode::RevisionNotPrepared, "no agent");
                    };
                    let rev = a.revision.id.to_string();
                    if !agent.snapshots.contains_key(&rev) {
                        return fail(FailureCode::RevisionNotPrepared, "not prepared");
                    }
                    let current_number = agent
                        .current
                        .as_ref()
                        .and_then(|c| agent.snapshots.get(c))
                        .copied();
                    if current_number.is_some_and(|n| n > a.revision.number.get()) {
                        return fail(FailureCode::Superseded, "newer is current");
                    }
                    let restarted = agent.served.as_deref() != Some(&rev);
                    agent.current = Some(rev.clone());
                    agent.served = Some(rev);
                    Ok(OperationResult::ActivateRevision(ActivateResult {
                        restarted,
                        unit_changed: false,
                        observation: Self::observation(agent),
                    }))
                }
                Operation::StopRevision(a) | Operation::RetireRevision(a) => {
                    let key = (
                        host.to_owned(),
                        a.namespace.id.to_string(),
                        a.agent.id.to_string(),
                    );
                    let retire = matches!(op, Operation::RetireRevision(_));
                    let Some(agent) = h.agents.get_mut(&key) else {
                        return Ok(OperationResult::StopRevision(StopResult {
                            stopped: false,
                            observation: AgentObservation::default(),
                        }));
                    };
                    let rev = a.revision.id.to_string();
                    let stopped = agent.current.as_deref() == Some(&rev);
                    if stopped {
                        agent.current = None;
                        agent.served = None;
                    }
                    let removed = retire && agent.snapshots.remove(&rev).is_some();
                    let observation = Self::observation(agent);
                    Ok(if retire {
                        OperationResult::RetireRevision(RetireResult {
                            stopped,
                            removed,
                            observation,
                        })
                    } else {
                        OperationResult::StopRevision(StopResult {
                            stopped,
                            observation,
                        })
                    })
                }
                Operation::DeleteAgent(a) => {
                    let key = (
                        host.to_owned(),
                        a.namespace.id.to_string(),
                        a.agent.id.to_string(),
                    );
                    let removed = h.agents.remove(&key).is_some();
                    Ok(OperationResult::DeleteAgent(DeleteAgentResult { removed }))
                }
                Operation::Probe(_)
                | Operation::Status(_)
                | Operation::VerifyRevision(_)
                | Operation::OperationStatus(_) => {
                    fail(FailureCode::Internal, "not modelled by the fake")
                }
            }
        })
    }
}

impl Backend for FakeBackend {
    async fn call(
        &self,
        target: impl Into<Target> + Send,
        operation: Operation,
        _options: CallOptions,
    ) -> Result<OperationResult, CallError> {
        // A cluster is modelled as one more host named after it.
        let target = target.into();
        let host = FakeHost {
            name: target.name().to_owned(),
        };
        let host = &host;
        let n = self.calls.fetch_add(1, Ordering::SeqCst);
        let injected = self.inject.lock().ok().and_then(|mut m| m.remove(&n));
        match injected {
            Some(Inject::Transport) => {
                return Err(CallError::Transport {
                    host: host.name.clone(),
                    message: "injected".into(),
                });
            }
            Some(Inject::Fail(code)) => {
                return Err(CallError::Failed(Failure::new(code, "injected")));
            }
            Some(Inject::HostKeyMismatch) => {
                return Err(CallError::HostKeyMismatch {
                    host: host.name.clone(),
                    presented: "SHA256:injected".into(),
                    expected: "SHA256:pinned".into(),
                });
            }
            Some(Inject::Hang { applied }) => {
                if applied {
                    let _ = self.apply(&host.name, &operation);
                }
                std::future::pending::<()>().await;
            }
            None => {}
        }
        self.apply(&host.name, &operation)
            .map_err(CallError::Failed)
    }
}
