//! Read-only reports: `probe` (no lock, creates nothing) and `status` (the host's inventory).
//! Anything unreadable is listed as a problem, never repaired and never fatal for the report.

use clawfleet_protocol::Ident;
use clawfleet_protocol::operation::AgentRef;
use clawfleet_protocol::result::{
    AgentInventory, Inventory, InventoryProblem, NamespaceInventory, PortRange, ProbeResult,
    RevisionInventory,
};

use super::Engine;
use crate::fsutil;
use crate::layout::dir_name;
use crate::markers::{self, AccountMarker, AgentMarker, NamespaceMarker};

/// What `probe` reports.
pub fn probe(engine: &Engine<'_>) -> ProbeResult {
    let agents = fsutil::list_dir(&engine.layout.ports_dir())
        .map(|names| names.iter().filter(|n| n.ends_with(".json")).count())
        .unwrap_or(0);
    ProbeResult {
        hostd_version: env!("CARGO_PKG_VERSION").to_owned(),
        protocol_versions: engine.config.protocol_versions.clone(),
        system_host_name: crate::config::system_host_name().unwrap_or_default(),
        host_key: engine.host_key.clone(),
        systemd_version: engine.system.systemd_version().ok(),
        missing_tools: missing_tools(engine),
        port_range: PortRange {
            start: engine.config.port_range.0,
            end: engine.config.port_range.1,
        },
        max_agents: engine.config.max_agents,
        agents: u32::try_from(agents).unwrap_or(u32::MAX),
        quotas: Some(crate::quota::support(&engine.config.state_root).describe()),
        network_isolation: Some(network_isolation(engine)),
    }
}

/// `namespaces`, or `unavailable: <what is missing>` (and whether binds are confined by
/// Landlock meanwhile): what the coordinator places by (issue 28).
pub fn network_isolation(engine: &Engine<'_>) -> String {
    match engine.system.netns_support() {
        Ok(()) => NAMESPACES.to_owned(),
        Err(why) => {
            let binds = match crate::launch::net_confinement() {
                Ok(abi) => format!("binds confined to each Agent's port by Landlock ABI {abi}"),
                Err(no) => format!("binds not confined ({no})"),
            };
            format!("unavailable: {why}; {binds}")
        }
    }
}

/// [`network_isolation`] when each Agent has its own network namespace.
pub const NAMESPACES: &str = "namespaces";

/// The tools hostd needs that are missing, and the gateway command (its path) when it is
/// missing or not executable by the Agent accounts.
fn missing_tools(engine: &Engine<'_>) -> Vec<String> {
    let mut missing = engine.system.missing_tools();
    if engine.gateway_command_problem().is_some()
        && let Some(exe) = engine.config.gateway_command.first()
    {
        missing.push(exe.clone());
    }
    missing
}

fn problem(problems: &mut Vec<InventoryProblem>, path: &std::path::Path, message: impl ToString) {
    problems.push(InventoryProblem {
        path: path.display().to_string(),
        message: message.to_string(),
    });
}

/// Why `dir`, a writable directory of an Agent on a btrfs state root with quotas, is not
/// limited, if it is not.
fn not_limited(dir: &std::path::Path) -> Option<String> {
    let file = match std::fs::File::open(dir) {
        Ok(f) => f,
        Err(e) => return Some(format!("cannot check its disk limit: {e}")),
    };
    match crate::quota::btrfs::is_subvolume(std::os::fd::AsFd::as_fd(&file)) {
        Ok(true) => None,
        Ok(false) => Some(
            "not a btrfs subvolume (the Agent was provisioned before quotas were enabled): its disk use is unlimited; recreate the Agent to limit it".to_owned(),
        ),
        Err(e) => Some(format!("cannot check its disk limit: {e}")),
    }
}

/// The host's inventory, optionally for one Namespace.
pub fn inventory(engine: &Engine<'_>, only: Option<&Ident>) -> Inventory {
    let mut out = Inventory::default();
    let subvolumes = crate::quota::support(&engine.config.state_root).subvolumes();
    let ns_root = engine.layout.namespaces_dir();
    let names = match fsutil::dir_exists(&ns_root) {
        Ok(true) => fsutil::list_dir(&ns_root).unwrap_or_default(),
        Ok(false) => Vec::new(),
        Err(e) => {
            problem(&mut out.problems, &ns_root, e);
            Vec::new()
        }
    };
    if only.is_none() {
        match engine.trash().entries() {
            Ok(entries) => {
                for e in entries {
                    problem(
                        &mut out.problems,
                        &engine.layout.trash_dir().join(e),
                        "a removal in progress, or left by a killed one (the next changing operation finishes it)",
                    );
                }
            }
            Err(e) => problem(&mut out.problems, &engine.layout.trash_dir(), e),
        }
    }
    for name in names {
        if only.is_some_and(|id| dir_name(id) != name) {
            continue;
        }
        let dir = ns_root.join(&name);
        let marker: NamespaceMarker = match markers::read(&dir.join("namespace.json"), "namespace")
        {
            Ok(m) => m,
            Err(e) => {
                problem(&mut out.problems, &dir, e);
                continue;
            }
        };
        if dir_name(&marker.namespace_id) != name {
            problem(
                &mut out.problems,
                &dir,
                "directory name does not match its marker",
            );
            continue;
        }
        let mut ns = NamespaceInventory {
            id: marker.namespace_id.clone(),
            name: marker.namespace_name.clone(),
            agents: Vec::new(),
        };
        let agents_dir = engine.layout.agents_dir(&marker.namespace_id);
        for agent_name in fsutil::list_dir(&agents_dir).unwrap_or_default() {
            let adir = agents_dir.join(&agent_name);
            let am: AgentMarker = match markers::read(&adir.join("agent.json"), "agent") {
                Ok(m) => m,
                Err(e) => {
                    problem(&mut out.problems, &adir, e);
                    continue;
                }
            };
            if am.namespace_id != marker.namespace_id || dir_name(&am.agent_id) != agent_name {
                problem(
                    &mut out.problems,
                    &adir,
                    "Agent marker does not match its directory",
                );
                continue;
            }
            let agent = AgentRef {
                id: am.agent_id.clone(),
                service_principal_id: am.service_principal_id.clone(),
            };
            let paths = engine.layout.agent(&marker.namespace_id, &agent.id);
            let mut revisions = Vec::new();
            for rev_name in fsutil::list_dir(&paths.revisions).unwrap_or_default() {
                let rdir = paths.revisions.join(&rev_name);
                // Fully verified, hash included: a tampered snapshot is a problem to show.
                match engine.read_snapshot(&marker.namespace_id, &agent.id, &rdir) {
                    Ok(r) if dir_name(&r.revision_id) == rev_name => {
                        revisions.push(RevisionInventory {
                            id: r.revision_id,
                            number: r.number,
                        })
                    }
                    Ok(_) => problem(
                        &mut out.problems,
                        &rdir,
                        "revision marker does not match its directory",
                    ),
                    Err(f) => problem(&mut out.problems, &rdir, f.message),
                }
            }
            revisions.sort_by_key(|r| r.number);
            if let Err(f) = engine.read_current(&marker.namespace_id, &agent.id, &paths) {
                problem(&mut out.problems, &paths.current, f.message);
            }
            let account_marker = engine.layout.account_marker(&paths.account);
            if let Err(f) = engine.verify_account(&marker.namespace_id, &agent, &paths) {
                problem(&mut out.problems, &account_marker, f.message);
            }
            // On btrfs with quotas, an Agent provisioned before they were enabled has plain
            // directories, which no quota group limits (its data is never moved).
            if subvolumes {
                for dir in [&paths.home, &paths.state] {
                    if let Some(why) = not_limited(dir) {
                        problem(&mut out.problems, dir, why);
                    }
                }
            }
            // Every change of the Agent fails while its fence record is unreadable.
            if let Err(f) = engine.stored_fence(&marker.namespace_id, &agent.id, &paths) {
                problem(
                    &mut out.problems,
                    &paths.fence,
                    format!(
                        "{}; every change of this Agent is refused until it is fixed",
                        f.message
                    ),
                );
            }
            let secrets = match crate::secrets::read_manifest(&paths.dir) {
                Ok(m) => Some(m.secrets),
                Err(e) => {
                    problem(
                        &mut out.problems,
                        &crate::secrets::secrets_dir(&paths.dir),
                        e.to_string(),
                    );
                    None
                }
            };
            ns.agents.push(AgentInventory {
                secrets,
                unit_drift: engine.unit_drift(&marker.namespace_id, &agent.id, &paths, am.port),
                observation: engine.observe(&marker.namespace_id, &agent.id, &paths),
                id: agent.id,
                service_principal_id: agent.service_principal_id,
                account: am.account,
                revisions,
            });
        }
        out.namespaces.push(ns);
    }
    orphaned_accounts(engine, only, &mut out.problems);
    if only.is_none() {
        unreadable_fences(engine, &mut out.problems);
    }
    out
}

/// Fence records that cannot be read, of Agents not listed above (deleted ones: re-creating
/// the Agent is refused while its record is unreadable).
fn unreadable_fences(engine: &Engine<'_>, problems: &mut Vec<InventoryProblem>) {
    let dir = engine.layout.fences_dir();
    if !matches!(fsutil::dir_exists(&dir), Ok(true)) {
        return;
    }
    let reported: std::collections::BTreeSet<String> =
        problems.iter().map(|p| p.path.clone()).collect();
    for name in fsutil::list_dir(&dir).unwrap_or_default() {
        let path = dir.join(&name);
        if !name.ends_with(".json") || reported.contains(&path.display().to_string()) {
            continue;
        }
        if let Err(e) = markers::read::<markers::FenceMarker>(&path, "fence") {
            problem(
                problems,
                &path,
                format!("{e}; every change of its Agent is refused until it is fixed"),
            );
        }
    }
}

/// Account markers whose Agent directory is gone (a delete that failed at the account): a
/// retried delete finishes them, until then they are shown.
fn orphaned_accounts(
    engine: &Engine<'_>,
    only: Option<&Ident>,
    problems: &mut Vec<InventoryProblem>,
) {
    let dir = engine.layout.accounts_dir();
    if !matches!(fsutil::dir_exists(&dir), Ok(true)) {
        return;
    }
    for name in fsutil::list_dir(&dir).unwrap_or_default() {
        if name.ends_with(".intent") {
            let path = dir.join(&name);
            match markers::read::<markers::AccountIntent>(&path, "account intent") {
                Ok(i) if only.is_none_or(|id| id == &i.namespace_id) => problem(
                    problems,
                    &path,
                    format!(
                        "account {} of Agent {}/{} is being created, or a killed run left it half made; the Agent's next prepare adopts it, a delete removes it",
                        i.account, i.namespace_id, i.agent_id
                    ),
                ),
                Ok(_) => {}
                Err(e) if only.is_none() => problem(problems, &path, e),
                Err(_) => {}
            }
            continue;
        }
        if !name.ends_with(".json") {
            continue;
        }
        let path = dir.join(&name);
        match markers::read::<AccountMarker>(&path, "account") {
            Ok(m) => {
                if only.is_some_and(|id| id != &m.namespace_id) {
                    continue;
                }
                let paths = engine.layout.agent(&m.namespace_id, &m.agent_id);
                if matches!(fsutil::kind(&paths.dir), Ok(fsutil::Kind::Missing)) {
                    problem(
                        problems,
                        &path,
                        format!(
                            "account {} of Agent {}/{} is left without its Agent directory; delete the Agent again to finish",
                            m.account, m.namespace_id, m.agent_id
                        ),
                    );
                }
            }
            Err(e) if only.is_none() => problem(problems, &path, e),
            Err(_) => {}
        }
    }
}
