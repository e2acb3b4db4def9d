//! The drift sweep: every interval (jittered), each host and cluster is asked for its
//! inventory (`status`, read-only) and compared with what the coordinator expects there. Each
//! Agent gets one row: `synced`, `drift` with a reason, `unreachable`, or `converging` while
//! work for it is open. The sweep never repairs anything; `occ agent reconcile` re-applies the
//! active revision on request.
//!
//! Only the leader runs it (`control/mod.rs`, `control/leader.rs`): with SQLite there is only one coordinator; on
//! PostgreSQL, the one holding the leader lease.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use clawfleet_protocol::operation::StatusArgs;
use clawfleet_protocol::result::{AgentInventory, Inventory, OperationResult};
use clawfleet_protocol::{Ident, Operation};

use crate::backend::{Backend, CallOptions, Target};
use crate::model::{Agent, DesiredState, DriftReason, DriftRow, DriftState};
use crate::store::StoreError;
use crate::store::prelude::*;

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
    /// The secret versions the active revision binds (`None` without an active revision).
    secrets: Option<Vec<crate::model::SecretBinding>>,
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
            let secrets = match &agent.active_revision_id {
                Some(active) if agent.desired_state == DesiredState::Running => store
                    .revision(&ns.id, &agent.id, active)
                    .await?
                    .map(|r| r.secrets),
                _ => None,
            };
            expected.entry(target).or_default().push(Expected {
                agent,
                open_work,
                secrets,
            });
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
            Ok(OperationResult::Status(inv)) => compare(name, Words::of(target), &want, &inv, now),
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
/// What a target calls an Agent's workload, a revision's stored copy and an Agent's
/// identity, for drift messages: a host's words never describe a cluster's objects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Words {
    workload: &'static str,
    snapshot: &'static str,
    account: &'static str,
}

impl Words {
    const HOST: Words = Words {
        workload: "unit",
        snapshot: "snapshot",
        account: "account",
    };
    const CLUSTER: Words = Words {
        workload: "Deployment",
        snapshot: "ConfigMap",
        account: "ServiceAccount",
    };

    fn of(target: &Target) -> Words {
        match target {
            Target::Host(_) => Words::HOST,
            Target::Cluster(_) => Words::CLUSTER,
        }
    }
}

fn compare(
    target: &str,
    words: Words,
    want: &[Expected],
    inv: &Inventory,
    now: i64,
) -> Vec<DriftRow> {
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
        let (mut state, mut reason, mut message) = judge(e, words, found.get(&key).copied());
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
                    "the target runs Agent {ns}/{agent} ({} {}), which the coordinator does not place here",
                    words.account, a.account
                ),
                now,
            ));
        }
    }
    label_problems(target, want, inv, &mut rows, now);
    rows
}

/// hostd's directory name of a Namespace, Agent or revision id: the first 32 hex digits of
/// the SHA-256 of the id (hostd's `layout::dir_name`).
fn dir_name(id: &str) -> String {
    let mut h = clawfleet_protocol::ident::hex(&clawfleet_protocol::ident::sha256(id.as_bytes()));
    h.truncate(32);
    h
}

/// The Namespace and Agent directory names in a host path
/// (`…/namespaces/<ns dir>/agents/<agent dir>/…`), and the rest of the path.
fn directories_of(path: &str) -> (Option<&str>, Option<&str>, &str) {
    let Some((_, after)) = path.rsplit_once("/namespaces/") else {
        return (None, None, path);
    };
    let mut parts = after.splitn(4, '/');
    let ns = parts.next().filter(|p| !p.is_empty());
    match (parts.next(), parts.next()) {
        (Some("agents"), Some(agent)) if !agent.is_empty() => {
            (ns, Some(agent), parts.next().unwrap_or(""))
        }
        _ => (ns, None, after.split_once('/').map_or("", |(_, r)| r)),
    }
}

/// Rows for the problems a target reports (paths it could not read or verify), labelled by
/// the Namespace and Agent they belong to, never by a host path in the AGENT column: a
/// problem in a known Agent's directory joins that Agent's row (which turns to drift if it
/// was synced); one in a directory no known Agent has is an `unknown-agent` row labelled
/// `(unknown agent <dir prefix>)`; anything else is a `(target problem N)` row. The path
/// goes into the message.
fn label_problems(
    target: &str,
    want: &[Expected],
    inv: &Inventory,
    rows: &mut Vec<DriftRow>,
    now: i64,
) {
    let mut namespaces: BTreeMap<String, String> = BTreeMap::new();
    let mut agents: BTreeMap<(String, String), String> = BTreeMap::new();
    let known = want
        .iter()
        .map(|e| (e.agent.namespace_id.to_string(), e.agent.id.to_string()))
        .chain(inv.namespaces.iter().flat_map(|n| {
            n.agents
                .iter()
                .map(move |a| (n.id.to_string(), a.id.to_string()))
        }));
    for (ns, agent) in known {
        let ns_dir = dir_name(&ns);
        agents.insert((ns_dir.clone(), dir_name(&agent)), agent);
        namespaces.insert(ns_dir, ns);
    }
    let mut others = 0;
    for p in &inv.problems {
        // A workload problem of a wanted Agent is already that Agent's row (`compare`).
        if workload_problem(&p.path).is_some_and(|(n, a)| {
            want.iter()
                .any(|e| e.agent.namespace_id.as_str() == n && e.agent.id.as_str() == a)
        }) {
            continue;
        }
        let (ns_dir, agent_dir, rest) = directories_of(&p.path);
        let reason = if p.path.ends_with("/current") {
            DriftReason::CurrentChanged
        } else if p.path.contains("/revisions/") {
            DriftReason::SnapshotChanged
        } else if agent_dir.is_some() && rest.is_empty() {
            DriftReason::UnknownAgent
        } else {
            DriftReason::TargetProblem
        };
        let ns = ns_dir.and_then(|d| namespaces.get(d)).cloned();
        let agent = ns_dir
            .zip(agent_dir)
            .and_then(|(n, a)| agents.get(&(n.to_owned(), a.to_owned())))
            .cloned();
        let message = format!("{}: {}", p.path, p.message);
        if let (Some(ns), Some(agent)) = (&ns, &agent)
            && let Some(r) = rows
                .iter_mut()
                .find(|r| r.namespace_id == *ns && r.agent_id == *agent)
        {
            if r.state == DriftState::Synced {
                r.state = DriftState::Drift;
                r.reason = Some(reason);
                r.message = clawfleet_protocol::text::clean(&message, 300);
            } else {
                r.message =
                    clawfleet_protocol::text::clean(&format!("{}; {message}", r.message), 300);
            }
            continue;
        }
        let label = match (agent, agent_dir) {
            (Some(agent), _) => agent,
            (None, Some(dir)) => format!("(unknown agent {})", dir.get(..8).unwrap_or(dir)),
            (None, None) => {
                others += 1;
                format!("(target problem {others})")
            }
        };
        rows.push(row(
            target,
            ns.as_deref().unwrap_or(""),
            &label,
            DriftState::Drift,
            Some(reason),
            message,
            now,
        ));
    }
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
    words: Words,
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
    // Whatever the Agent should do: its sandbox and limits are not what was deployed.
    if let Some(why) = &inv.unit_drift {
        return drift(UnitFileChanged, why.clone());
    }
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
                    format!(
                        "the Agent is stopped, and its {} is {unit_state}",
                        words.workload
                    ),
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
                        "the {} of the active revision {active} is missing or does not verify",
                        words.snapshot
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
                    format!(
                        "the Agent should run {active}, and its {} is {unit_state}",
                        words.workload
                    ),
                );
            }
            match &o.served {
                Some(s) if s == active => match secrets_differ(e, inv) {
                    Some(why) => drift(SecretsChanged, why),
                    None => (DriftState::Synced, None, format!("serving {active}")),
                },
                Some(s) => drift(
                    ServedNotActive,
                    format!("the target serves {s}, not the active revision {active}"),
                ),
                None => drift(
                    NotServed,
                    format!(
                        "the {} runs, but the target does not record {active} as served",
                        words.workload
                    ),
                ),
            }
        }
    }
}

/// How the secrets the target holds for the Agent differ from those its active revision
/// binds (names, versions, fingerprints; never values), if the target reports them.
fn secrets_differ(e: &Expected, inv: &AgentInventory) -> Option<String> {
    let (Some(want), Some(held)) = (&e.secrets, &inv.secrets) else {
        return None;
    };
    let want: BTreeSet<(String, u64, String)> = want
        .iter()
        .map(|b| {
            (
                b.name.to_string(),
                u64::from(b.version),
                b.fingerprint.as_str().to_owned(),
            )
        })
        .collect();
    let held: BTreeSet<(String, u64, String)> = held
        .iter()
        .map(|v| {
            (
                v.name.to_string(),
                v.version,
                v.fingerprint.as_str().to_owned(),
            )
        })
        .collect();
    if want == held {
        return None;
    }
    let list = |set: &BTreeSet<(String, u64, String)>| {
        if set.is_empty() {
            return "none".to_owned();
        }
        set.iter()
            .map(|(n, v, f)| format!("{n} v{v} ({f})"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    Some(format!(
        "the target holds secrets {}, and the active revision {} binds {}",
        list(&held),
        e.agent
            .active_revision_id
            .as_ref()
            .map_or("-", |r| r.as_str()),
        list(&want)
    ))
}

#[cfg(test)]
mod tests {
    use clawfleet_protocol::result::{AgentObservation, RevisionInventory, UnitObservation};

    use super::*;
    use crate::model::RestorePolicy;

    fn ident(s: &str) -> Ident {
        Ident::new(s).unwrap()
    }

    /// Issue 27: an Agent whose unit file was edited by hand (its sandbox or limits) was
    /// `synced`; the target's report of it makes the row `drift` with its own reason.
    #[test]
    fn a_unit_that_differs_from_the_targets_text_is_drift() {
        let expected = Expected {
            agent: Agent {
                namespace_id: ident("ns1"),
                id: ident("a1"),
                service_principal_id: ident("sp1"),
                configuration_id: ident("c1"),
                desired_state: DesiredState::Running,
                host: Some("h1".to_owned()),
                port: Some(18700),
                active_revision_id: Some(ident("r1")),
                served_revision_id: Some(ident("r1")),
                restore: RestorePolicy::None,
                created_at: 0,
                egress: None,
            },
            open_work: false,
            secrets: None,
        };
        let mut inv = AgentInventory {
            id: ident("a1"),
            service_principal_id: ident("sp1"),
            account: "cfa-0".to_owned(),
            revisions: vec![RevisionInventory {
                id: ident("r1"),
                number: clawfleet_protocol::operation::RevisionNumber::new(1).unwrap(),
            }],
            observation: AgentObservation {
                current: Some(ident("r1")),
                served: Some(ident("r1")),
                port: Some(18700),
                unit: Some(UnitObservation {
                    name: "clawfleet-agent-0.service".to_owned(),
                    active_state: "active".to_owned(),
                    sub_state: "running".to_owned(),
                    n_restarts: 0,
                    enabled: true,
                }),
            },
            unit_drift: None,
            secrets: None,
        };
        assert_eq!(
            judge(&expected, Words::HOST, Some(&inv)).0,
            DriftState::Synced
        );
        inv.unit_drift = Some("it lacks lines hostd writes: `NoNewPrivileges=yes`".to_owned());
        let (state, reason, message) = judge(&expected, Words::HOST, Some(&inv));
        assert_eq!(state, DriftState::Drift);
        assert_eq!(reason, Some(DriftReason::UnitFileChanged));
        assert!(message.contains("NoNewPrivileges=yes"), "{message}");

        // Issue 29: the secrets the host holds are not those the active revision binds.
        use clawfleet_protocol::sealed::{SecretFingerprint, SecretName, SecretVersion};
        inv.unit_drift = None;
        let name = SecretName::new("slack-bot").unwrap();
        let mut expected = expected;
        expected.secrets = Some(vec![crate::model::SecretBinding {
            name: name.clone(),
            version: 2,
            fingerprint: SecretFingerprint::of(b"v2"),
        }]);
        let held = |version: u64, value: &[u8]| {
            Some(vec![SecretVersion {
                name: name.clone(),
                version,
                fingerprint: SecretFingerprint::of(value),
            }])
        };
        inv.secrets = held(2, b"v2");
        assert_eq!(
            judge(&expected, Words::HOST, Some(&inv)).0,
            DriftState::Synced
        );
        inv.secrets = held(1, b"v1");
        let (state, reason, message) = judge(&expected, Words::HOST, Some(&inv));
        assert_eq!(
            (state, reason),
            (DriftState::Drift, Some(DriftReason::SecretsChanged))
        );
        assert!(
            message.contains("slack-bot v1") && message.contains("slack-bot v2"),
            "{message}"
        );
        inv.secrets = Some(Vec::new());
        let (_, reason, message) = judge(&expected, Words::HOST, Some(&inv));
        assert_eq!(reason, Some(DriftReason::SecretsChanged), "{message}");
        assert!(message.contains("holds secrets none"), "{message}");
        // A target that does not report its secrets (a hostd from before) is not judged on them.
        inv.secrets = None;
        assert_eq!(
            judge(&expected, Words::HOST, Some(&inv)).0,
            DriftState::Synced
        );
    }
}

#[cfg(test)]
mod problem_labels {
    use clawfleet_protocol::result::{AgentObservation, InventoryProblem, NamespaceInventory};

    use super::*;

    fn id(s: &str) -> Ident {
        Ident::new(s).unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    /// Problem rows name the Namespace and Agent, never a host path in the AGENT column (the
    /// path used to be the row's Agent id).
    #[test]
    fn problem_rows_are_labelled_by_namespace_and_agent_not_by_path() {
        let root = "/var/lib/clawfleet/namespaces";
        let (ns, a1) = (dir_name("ns1"), dir_name("a1"));
        let stray = "f".repeat(32);
        let inv = Inventory {
            namespaces: vec![NamespaceInventory {
                id: id("ns1"),
                name: id("ns1"),
                agents: vec![AgentInventory {
                    id: id("a1"),
                    service_principal_id: id("a1"),
                    account: "cfa-1".into(),
                    revisions: Vec::new(),
                    observation: AgentObservation::default(),
                    unit_drift: None,
                    secrets: None,
                }],
            }],
            problems: vec![
                InventoryProblem {
                    path: format!("{root}/{ns}/agents/{a1}/revisions/{}", "0".repeat(32)),
                    message: "the snapshot does not verify".into(),
                },
                InventoryProblem {
                    path: format!("{root}/{ns}/agents/{stray}"),
                    message: "no Agent marker".into(),
                },
                InventoryProblem {
                    path: "/var/lib/clawfleet/trash/1-x".into(),
                    message: "a removal in progress".into(),
                },
            ],
        };
        let rows = compare("h1", Words::HOST, &[], &inv, 0);
        let labels: Vec<(&str, &str, Option<DriftReason>)> = rows
            .iter()
            .map(|r| (r.namespace_id.as_str(), r.agent_id.as_str(), r.reason))
            .collect();
        assert_eq!(
            labels,
            [
                ("ns1", "a1", Some(DriftReason::UnknownAgent)),
                (
                    "ns1",
                    "(unknown agent ffffffff)",
                    Some(DriftReason::UnknownAgent)
                ),
                ("", "(target problem 1)", Some(DriftReason::TargetProblem)),
            ]
        );
        assert!(rows[0].message.contains("/revisions/"), "{:?}", rows[0]);
        assert!(rows[1].message.contains(&stray), "{:?}", rows[1]);
        assert!(rows.iter().all(|r| !r.agent_id.contains('/')), "{rows:?}");
    }
}

#[cfg(test)]
mod workload_tests {
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
            egress: None,
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
            unit_drift: None,
            secrets: None,
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
            secrets: None,
        }];
        let rows = compare("c1", Words::CLUSTER, &want, &inv, 0);
        assert_eq!(rows.len(), 1, "{rows:?}");
        assert_eq!(rows[0].state, DriftState::Synced, "{rows:?}");

        inv.problems.push(InventoryProblem {
            path: "namespaces/ns1/agents/a1/workload".into(),
            message: "the Pod template differs (container sidecar was added)".into(),
        });
        let rows = compare("c1", Words::CLUSTER, &want, &inv, 0);
        assert_eq!(rows.len(), 1, "one row, the Agent's: {rows:?}");
        assert_eq!(rows[0].agent_id, "a1");
        assert_eq!(rows[0].state, DriftState::Drift, "{rows:?}");
        assert_eq!(rows[0].reason, Some(DriftReason::WorkloadChanged));
        assert!(rows[0].message.contains("sidecar"), "{rows:?}");
    }

    /// Issue 27: a cluster's drift messages use a cluster's words (Deployment, ConfigMap,
    /// ServiceAccount), never a host's (unit, snapshot, account).
    #[test]
    fn a_clusters_drift_is_worded_for_a_cluster() {
        let agent = |id_: &str, state: DesiredState| Agent {
            namespace_id: id("ns1"),
            id: id(id_),
            service_principal_id: id(id_),
            configuration_id: id("cfg"),
            desired_state: state,
            host: None,
            port: Some(18789),
            active_revision_id: Some(id("r1")),
            served_revision_id: Some(id("r1")),
            restore: RestorePolicy::None,
            created_at: 0,
            egress: None,
        };
        let observed = |id_: &str, revisions: Vec<RevisionInventory>, state: &str| AgentInventory {
            id: id(id_),
            service_principal_id: id(id_),
            account: format!("gw-{id_}"),
            revisions,
            observation: AgentObservation {
                current: Some(id("r1")),
                served: None,
                port: Some(18789),
                unit: Some(UnitObservation {
                    name: format!("gw-{id_}"),
                    active_state: state.into(),
                    sub_state: "Pending".into(),
                    n_restarts: 0,
                    enabled: true,
                }),
            },
            unit_drift: None,
            secrets: None,
        };
        let r1 = || {
            vec![RevisionInventory {
                id: id("r1"),
                number: RevisionNumber::new(1).unwrap(),
            }]
        };
        let inv = Inventory {
            namespaces: vec![NamespaceInventory {
                id: id("ns1"),
                name: id("ns1"),
                agents: vec![
                    observed("down", r1(), "activating"),
                    observed("stopped", r1(), "active"),
                    observed("gone", Vec::new(), "active"),
                    observed("unserved", r1(), "active"),
                    observed("stray", r1(), "active"),
                ],
            }],
            problems: Vec::new(),
        };
        let want: Vec<Expected> = [
            ("down", DesiredState::Running),
            ("stopped", DesiredState::Stopped),
            ("gone", DesiredState::Running),
            ("unserved", DesiredState::Running),
        ]
        .into_iter()
        .map(|(a, s)| Expected {
            agent: agent(a, s),
            open_work: false,
            secrets: None,
        })
        .collect();
        let rows = compare("c1", Words::CLUSTER, &want, &inv, 0);
        assert_eq!(rows.len(), 5, "{rows:?}");
        for r in &rows {
            assert_eq!(r.state, DriftState::Drift, "{r:?}");
            for host_word in ["unit", "snapshot", "(account"] {
                assert!(!r.message.contains(host_word), "{host_word}: {r:?}");
            }
        }
        let text: Vec<&str> = rows.iter().map(|r| r.message.as_str()).collect();
        for cluster_word in [
            "its Deployment is",
            "the ConfigMap of",
            "the Deployment runs",
            "ServiceAccount gw-stray",
        ] {
            assert!(
                text.iter().any(|m| m.contains(cluster_word)),
                "{cluster_word}: {text:?}"
            );
        }
        // A host keeps its own words.
        let rows = compare("h1", Words::HOST, &want, &inv, 0);
        assert!(
            rows.iter().any(|r| r.message.contains("its unit is")),
            "{rows:?}"
        );
    }
}
