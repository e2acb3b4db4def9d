//! The drift sweep: every interval (jittered), each host and cluster is asked for its
//! inventory (`status`, read-only) and compared with what the coordinator expects there. Each
//! Agent gets one row: `synced`, `drift` with a reason, `unreachable`, or `converging` while
//! work for it is open. The sweep never repairs anything; `occ agent reconcile` re-applies the
//! active revision on request.
//!
//! Only the leader runs it (`leader.rs`): with SQLite there is only one coordinator; on
//! PostgreSQL, the one holding the leader lease.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use clawfleet_protocol::operation::StatusArgs;
use clawfleet_protocol::result::{AgentInventory, Inventory, OperationResult};
use clawfleet_protocol::{Ident, Operation};

use crate::backend::{Backend, CallOptions, Target};
use crate::config::DriftSettings;
use crate::model::{Agent, DesiredState, DriftReason, DriftRow, DriftState};
use crate::store::prelude::*;
use crate::store::{SharedStore, StoreError};

/// How long one target may take to answer `status`.
const STATUS_DEADLINE: Duration = Duration::from_secs(60);

/// What one sweep found, for logs and metrics.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SweepSummary {
    pub targets: usize,
    pub unreachable_targets: usize,
    pub by_state: BTreeMap<&'static str, usize>,
}

/// An Agent the coordinator expects on a target.
struct Expected {
    agent: Agent,
    open_work: bool,
}

/// Runs sweeps until `stop` turns true.
pub async fn run<B: Backend>(
    store: SharedStore,
    backend: std::sync::Arc<B>,
    settings: DriftSettings,
    leader: crate::leader::Leadership,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    loop {
        let wait = crate::backoff::jittered(settings.interval);
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = stop.changed() => return,
        }
        if *stop.borrow() {
            return;
        }
        if !leader.is_leader() {
            continue;
        }
        match sweep(&*store, &*backend).await {
            Ok(s) => tracing::info!(
                targets = s.targets,
                unreachable = s.unreachable_targets,
                states = ?s.by_state,
                "drift sweep done"
            ),
            Err(e) => tracing::warn!("drift sweep failed: {e}"),
        }
    }
}

/// One sweep over every host and cluster.
pub async fn sweep<B: Backend>(store: &dyn Store, backend: &B) -> Result<SweepSummary, StoreError> {
    let now = crate::clock::now_seconds();
    let mut expected: BTreeMap<String, Vec<Expected>> = BTreeMap::new();
    let mut targets: BTreeMap<String, Target> = BTreeMap::new();
    for h in store.hosts().await? {
        targets.insert(h.name.to_string(), crate::targets::host(&h));
    }
    for ns in store.namespaces().await? {
        let cluster = crate::targets::cluster(store, &ns).await.ok().flatten();
        if let Some(t) = &cluster {
            targets.insert(t.name().to_owned(), t.clone());
        }
        for agent in store.agents(&ns.id).await? {
            if agent.desired_state == DesiredState::Deleted {
                continue;
            }
            let target = match (&cluster, &agent.host) {
                (Some(c), _) => c.name().to_owned(),
                (None, Some(h)) => h.clone(),
                (None, None) => continue,
            };
            let open_work = !store.open_work(&ns.id, &agent.id).await?.is_empty();
            expected
                .entry(target)
                .or_default()
                .push(Expected { agent, open_work });
        }
    }
    let mut summary = SweepSummary {
        targets: targets.len(),
        ..SweepSummary::default()
    };
    for (name, target) in &targets {
        let want = expected.remove(name).unwrap_or_default();
        let op = Operation::Status(StatusArgs { namespace_id: None });
        let options = CallOptions {
            deadline: STATUS_DEADLINE,
            fence: None,
        };
        let rows = match backend.call(target, op, options).await {
            Ok(OperationResult::Status(inv)) => compare(name, &want, &inv, now),
            Ok(other) => unreachable_rows(
                name,
                &want,
                &format!("the target answered {} to status", other.kind()),
                now,
            ),
            Err(e) => {
                summary.unreachable_targets += 1;
                unreachable_rows(name, &want, &e.to_string(), now)
            }
        };
        for r in &rows {
            *summary.by_state.entry(r.state.as_str()).or_default() += 1;
        }
        store.replace_drift(name, &rows).await?;
    }
    store
        .retain_drift_targets(&targets.keys().cloned().collect::<Vec<_>>())
        .await?;
    Ok(summary)
}

fn row(
    target: &str,
    ns: &str,
    agent: &str,
    state: DriftState,
    reason: Option<DriftReason>,
    message: impl Into<String>,
    now: i64,
) -> DriftRow {
    DriftRow {
        target: target.to_owned(),
        namespace_id: ns.to_owned(),
        agent_id: agent.to_owned(),
        state,
        reason,
        message: clawfleet_protocol::text::clean(&message.into(), 300),
        checked_at: now,
    }
}

fn unreachable_rows(target: &str, want: &[Expected], why: &str, now: i64) -> Vec<DriftRow> {
    want.iter()
        .map(|e| {
            row(
                target,
                &e.agent.namespace_id,
                &e.agent.id,
                DriftState::Unreachable,
                None,
                why,
                now,
            )
        })
        .collect()
}

/// The rows of one target from its inventory.
fn compare(target: &str, want: &[Expected], inv: &Inventory, now: i64) -> Vec<DriftRow> {
    let mut found: BTreeMap<(Ident, Ident), &AgentInventory> = BTreeMap::new();
    for ns in &inv.namespaces {
        for a in &ns.agents {
            found.insert((ns.id.clone(), a.id.clone()), a);
        }
    }
    // Problems a target attributes to one Agent's workload (`namespaces/<ns>/agents/<agent>/
    // workload`): the Agent drifted, whatever its unit says.
    let mut workload: BTreeMap<(String, String), &str> = BTreeMap::new();
    for p in &inv.problems {
        if let Some(key) = workload_problem(&p.path) {
            workload.insert(key, p.message.as_str());
        }
    }
    let mut rows = Vec::new();
    let mut known = BTreeSet::new();
    for e in want {
        let key = (e.agent.namespace_id.clone(), e.agent.id.clone());
        known.insert(key.clone());
        let (mut state, mut reason, mut message) = judge(e, found.get(&key).copied());
        if state != DriftState::Converging
            && let Some(m) = workload.get(&(key.0.to_string(), key.1.to_string()))
        {
            state = DriftState::Drift;
            reason = Some(DriftReason::WorkloadChanged);
            message = (*m).to_owned();
        }
        rows.push(row(target, &key.0, &key.1, state, reason, message, now));
    }
    for ((ns, agent), a) in &found {
        if !known.contains(&(ns.clone(), agent.clone())) {
            rows.push(row(
                target,
                ns,
                agent,
                DriftState::Drift,
                Some(DriftReason::UnknownAgent),
                format!(
                    "the target runs Agent {ns}/{agent} (account {}), which the coordinator does not place here",
                    a.account
                ),
                now,
            ));
        }
    }
    for p in &inv.problems {
        if workload_problem(&p.path).is_some_and(|k| {
            known
                .iter()
                .any(|(n, a)| (n.as_str(), a.as_str()) == (k.0.as_str(), k.1.as_str()))
        }) {
            continue;
        }
        let reason = if p.path.ends_with("/current") {
            DriftReason::CurrentChanged
        } else if p.path.contains("/revisions/") {
            DriftReason::SnapshotChanged
        } else if p
            .path
            .rsplit_once("/agents/")
            .is_some_and(|(_, rest)| !rest.contains('/'))
        {
            DriftReason::UnknownAgent
        } else {
            DriftReason::TargetProblem
        };
        rows.push(row(
            target,
            "",
            &p.path,
            DriftState::Drift,
            Some(reason),
            &p.message,
            now,
        ));
    }
    rows
}

/// `(Namespace, Agent)` of a problem path `namespaces/<ns>/agents/<agent>/workload`.
fn workload_problem(path: &str) -> Option<(String, String)> {
    let rest = path
        .strip_prefix("namespaces/")?
        .strip_suffix("/workload")?;
    let (ns, agent) = rest.split_once("/agents/")?;
    (!ns.contains('/') && !agent.contains('/')).then(|| (ns.to_owned(), agent.to_owned()))
}

fn judge(
    e: &Expected,
    found: Option<&AgentInventory>,
) -> (DriftState, Option<DriftReason>, String) {
    use DriftReason::*;
    let drift = |r: DriftReason, m: String| (DriftState::Drift, Some(r), m);
    if e.open_work {
        return (
            DriftState::Converging,
            None,
            "work for the Agent is open".to_owned(),
        );
    }
    let a = &e.agent;
    let Some(inv) = found else {
        return match (a.desired_state, &a.active_revision_id) {
            (DesiredState::Running, Some(_)) | (DesiredState::Stopped, _) => drift(
                MissingOnTarget,
                "the coordinator places the Agent here, and the target does not have it".to_owned(),
            ),
            _ => (DriftState::Synced, None, "not deployed yet".to_owned()),
        };
    };
    let o = &inv.observation;
    let unit_state = o
        .unit
        .as_ref()
        .map(|u| format!("{}/{}", u.active_state, u.sub_state))
        .unwrap_or_else(|| "absent".to_owned());
    let unit_up = o
        .unit
        .as_ref()
        .is_some_and(|u| matches!(u.active_state.as_str(), "active" | "reloading"));
    match a.desired_state {
        DesiredState::Stopped | DesiredState::Deleted => {
            if unit_up {
                return drift(
                    UnitRunningWhileStopped,
                    format!("the Agent is stopped, and its unit is {unit_state}"),
                );
            }
            (DriftState::Synced, None, "stopped".to_owned())
        }
        DesiredState::Running => {
            let Some(active) = &a.active_revision_id else {
                return (DriftState::Synced, None, "not deployed yet".to_owned());
            };
            if !inv.revisions.iter().any(|r| r.id == *active) {
                return drift(
                    SnapshotChanged,
                    format!(
                        "the snapshot of the active revision {active} is missing or does not verify"
                    ),
                );
            }
            if o.current.as_ref().map(|c| c.as_str()) != Some(active.as_str()) {
                return drift(
                    CurrentChanged,
                    format!(
                        "current names {}, not the active revision {active}",
                        o.current.as_ref().map_or("nothing", |c| c.as_str())
                    ),
                );
            }
            if !unit_up {
                return drift(
                    UnitNotRunning,
                    format!("the Agent should run {active}, and its unit is {unit_state}"),
                );
            }
            match &o.served {
                Some(s) if s == active => (DriftState::Synced, None, format!("serving {active}")),
                Some(s) => drift(
                    ServedNotActive,
                    format!("the target serves {s}, not the active revision {active}"),
                ),
                None => drift(
                    NotServed,
                    format!("the unit runs, but the target does not record {active} as served"),
                ),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use clawfleet_protocol::operation::RevisionNumber;
    use clawfleet_protocol::result::{
        AgentObservation, InventoryProblem, NamespaceInventory, RevisionInventory, UnitObservation,
    };

    use super::*;
    use crate::model::RestorePolicy;

    fn id(s: &str) -> Ident {
        Ident::new(s).unwrap()
    }

    /// Issue 27 item 4: a Deployment whose Pod template was edited (the cluster reports it as
    /// the Agent's `…/workload` problem) is the Agent's drift, not `synced` beside a
    /// target-wide problem row.
    #[test]
    fn an_edited_workload_is_the_agents_drift() {
        let agent = Agent {
            namespace_id: id("ns1"),
            id: id("a1"),
            service_principal_id: id("a1"),
            configuration_id: id("cfg"),
            desired_state: DesiredState::Running,
            host: None,
            port: Some(18789),
            active_revision_id: Some(id("r1")),
            served_revision_id: Some(id("r1")),
            restore: RestorePolicy::None,
            created_at: 0,
        };
        let serving = AgentInventory {
            id: id("a1"),
            service_principal_id: id("a1"),
            account: "gw-a1".into(),
            revisions: vec![RevisionInventory {
                id: id("r1"),
                number: RevisionNumber::new(1).unwrap(),
            }],
            observation: AgentObservation {
                current: Some(id("r1")),
                served: Some(id("r1")),
                port: Some(18789),
                unit: Some(UnitObservation {
                    name: "gw-a1".into(),
                    active_state: "active".into(),
                    sub_state: "Running".into(),
                    n_restarts: 0,
                    enabled: true,
                }),
            },
        };
        let mut inv = Inventory {
            namespaces: vec![NamespaceInventory {
                id: id("ns1"),
                name: id("ns1"),
                agents: vec![serving],
            }],
            problems: Vec::new(),
        };
        let want = [Expected {
            agent,
            open_work: false,
        }];
        let rows = compare("c1", &want, &inv, 0);
        assert_eq!(rows.len(), 1, "{rows:?}");
        assert_eq!(rows[0].state, DriftState::Synced, "{rows:?}");

        inv.problems.push(InventoryProblem {
            path: "namespaces/ns1/agents/a1/workload".into(),
            message: "the Pod template differs (container sidecar was added)".into(),
        });
        let rows = compare("c1", &want, &inv, 0);
        assert_eq!(rows.len(), 1, "one row, the Agent's: {rows:?}");
        assert_eq!(rows[0].agent_id, "a1");
        assert_eq!(rows[0].state, DriftState::Drift, "{rows:?}");
        assert_eq!(rows[0].reason, Some(DriftReason::WorkloadChanged));
        assert!(rows[0].message.contains("sidecar"), "{rows:?}");
    }
}
