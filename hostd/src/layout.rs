//! Names and paths on the host, all derived from validated identifiers by SHA-256, so no
//! identifier text ever becomes a path component, an account name or a unit name directly.

use std::path::{Path, PathBuf};

use clawfleet_protocol::Ident;
use clawfleet_protocol::ident::{hex, sha256};

/// `n` hex characters of SHA-256 of `text`.
fn hash_prefix(text: &str, n: usize) -> String {
    let mut h = hex(&sha256(text.as_bytes()));
    h.truncate(n);
    h
}

/// The directory name of a Namespace, Agent or revision: 32 hex of SHA-256 of its id.
pub fn dir_name(id: &Ident) -> String {
    hash_prefix(id.as_str(), 32)
}

/// The key that names an Agent's account, unit and lock: `namespaceId:agentId`.
fn agent_key(namespace: &Ident, agent: &Ident) -> String {
    format!("{namespace}:{agent}")
}

/// `cfa-<24 hex>`: 28 characters, within Linux's 32-character limit for user names.
pub fn account_name(namespace: &Ident, agent: &Ident) -> String {
    format!("cfa-{}", hash_prefix(&agent_key(namespace, agent), 24))
}

/// `clawfleet-agent-<32 hex>.service`.
pub fn unit_name(namespace: &Ident, agent: &Ident) -> String {
    format!(
        "clawfleet-agent-{}.service",
        hash_prefix(&agent_key(namespace, agent), 32)
    )
}

/// Whether a file name looks like one of our units (used to report strays, never to adopt).
pub fn is_unit_name(name: &str) -> bool {
    name.strip_prefix("clawfleet-agent-")
        .and_then(|r| r.strip_suffix(".service"))
        .is_some_and(|h| h.len() == 32 && h.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')))
}

/// The setup request of an Agent's initial workspace files (root-owned, in the Agent
/// directory): written before anything of the setup, it arms the unit's start guard.
pub const WORKSPACE_REQUEST_FILE: &str = "workspace-request.json";
/// The completion marker of that setup: the start guard lets the gateway start only with it.
pub const WORKSPACE_APPLIED_FILE: &str = "workspace-applied.json";

/// Paths under the state root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    pub root: PathBuf,
    pub unit_dir: PathBuf,
    /// Where systemd makes units' runtime directories (`/run`; a temporary directory in
    /// tests).
    pub run_dir: PathBuf,
}

/// The Agent directory's environment files, in the order the unit loads them
/// (`EnvironmentFile=`): the gateway password, the operator's own file, what start hooks
/// returned. [`AgentPaths::env_files`] and `crate::start_env` name them from here.
pub const ENV_FILES: [&str; 3] = ["gateway-password.env", "env", "launch.env"];

/// Paths of one Agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentPaths {
    pub dir: PathBuf,
    pub marker: PathBuf,
    pub home: PathBuf,
    pub state: PathBuf,
    pub revisions: PathBuf,
    pub current: PathBuf,
    /// `config/openclaw.json`: the gateway's `OPENCLAW_CONFIG_PATH`, a root-owned copy of
    /// `current`'s configuration replaced (write, fsync, rename) at every cutover. A copy and
    /// not a path through `current`: the gateway's file watch follows the file it opened, so
    /// only a file replaced in place is seen, and a config-only revision applies live
    /// (engine/live.rs).
    pub live_config: PathBuf,
    pub served: PathBuf,
    /// `started.json`: the revision the unit was last (re)started on after `current` named it.
    pub started: PathBuf,
    pub password_file: PathBuf,
    pub operator_env: PathBuf,
    /// `launch.env`: what the `before-workload-start` hooks returned for the revision being
    /// started (root-owned 0600, loaded by the unit).
    pub launch_env: PathBuf,
    /// OpenClaw's default workspace (`$OPENCLAW_STATE_DIR/workspace`), Agent-owned.
    pub workspace: PathBuf,
    pub workspace_request: PathBuf,
    pub workspace_applied: PathBuf,
    /// Root-owned staging tree where the initial workspace files are built before they move
    /// into the workspace.
    pub workspace_staging: PathBuf,
    pub unit_file: PathBuf,
    pub unit_name: String,
    pub account: String,
    pub lock: PathBuf,
    /// `fences/<32 hex>.json`: the highest fence seen for the Agent. Outside the Agent
    /// directory, like the lock, so it outlives `delete-agent` (see `engine::fence`).
    pub fence: PathBuf,
}

impl AgentPaths {
    /// The environment files, in the unit's order ([`ENV_FILES`]).
    pub fn env_files(&self) -> [&Path; 3] {
        [&self.password_file, &self.operator_env, &self.launch_env]
    }

    /// The snapshot directory of a revision.
    pub fn revision_dir(&self, revision: &Ident) -> PathBuf {
        self.revisions.join(dir_name(revision))
    }

    /// The relative target `current` points at for a revision.
    pub fn current_target(revision: &Ident) -> PathBuf {
        Path::new("revisions").join(dir_name(revision))
    }
}

impl Layout {
    /// A layout over a state root and a unit directory.
    pub fn new(root: impl Into<PathBuf>, unit_dir: impl Into<PathBuf>) -> Self {
        Self {
            root: root.into(),
            unit_dir: unit_dir.into(),
            run_dir: PathBuf::from(crate::secrets::RUN_DIR),
        }
    }

    /// The host lock: guards host inventory (accounts, ports, Namespace directories, units).
    pub fn host_lock(&self) -> PathBuf {
        self.root.join(".compute-lock")
    }

    /// Per-Agent lock files live outside the Agent directory so that they survive its removal
    /// while another session waits on them.
    pub fn locks_dir(&self) -> PathBuf {
        self.root.join("locks")
    }

    /// One record per Agent of the highest fence seen (`engine::fence`), kept outside the
    /// Agent directory so that a deleted Agent's record stays and a stale coordinator cannot
    /// re-create what a newer one removed.
    pub fn fences_dir(&self) -> PathBuf {
        self.root.join("fences")
    }

    /// `daemon-reload` bookkeeping shared by operations (`engine::reload`).
    pub fn reloads_dir(&self) -> PathBuf {
        self.root.join("reloads")
    }

    pub fn reload_counts(&self) -> PathBuf {
        self.reloads_dir().join("counts")
    }

    /// A unit file written but not yet read by a reload.
    pub fn reload_pending(&self, unit_name: &str) -> PathBuf {
        self.reloads_dir().join(format!("{unit_name}.pending"))
    }

    pub fn accounts_dir(&self) -> PathBuf {
        self.root.join("accounts")
    }

    pub fn account_marker(&self, account: &str) -> PathBuf {
        self.accounts_dir().join(format!("{account}.json"))
    }

    /// The intent to create an account (see `markers::AccountIntent`); not `.json`, so never
    /// read as an account marker.
    pub fn account_intent(&self, account: &str) -> PathBuf {
        self.accounts_dir().join(format!("{account}.intent"))
    }

    /// One file per reserved port: allocation never depends on reading other Agents' markers.
    pub fn ports_dir(&self) -> PathBuf {
        self.root.join("ports")
    }

    pub fn port_file(&self, port: u16) -> PathBuf {
        self.ports_dir().join(format!("{port}.json"))
    }

    /// Where directory trees go to be deleted (see `crate::trash`).
    /// Session slots (`crate::session`): `<n>.lock`, one held per open `hostd serve`.
    pub fn sessions_dir(&self) -> PathBuf {
        self.root.join("sessions")
    }

    /// Gateway stream slots (`crate::relay`): `<n>.lock`, one held per open stream of every
    /// `hostd relay` channel, so `[limits] max_relay_streams` bounds the host, not a channel.
    pub fn relay_slots_dir(&self) -> PathBuf {
        self.root.join("relay-streams")
    }

    /// The uid high-water mark (`crate::uids`).
    pub fn uids_file(&self) -> PathBuf {
        self.root.join("uids.json")
    }

    pub fn trash_dir(&self) -> PathBuf {
        self.root.join("trash")
    }

    pub fn journal_dir(&self) -> PathBuf {
        self.root.join("journal")
    }

    pub fn namespaces_dir(&self) -> PathBuf {
        self.root.join("namespaces")
    }

    pub fn namespace_dir(&self, namespace: &Ident) -> PathBuf {
        self.namespaces_dir().join(dir_name(namespace))
    }

    pub fn namespace_marker(&self, namespace: &Ident) -> PathBuf {
        self.namespace_dir(namespace).join("namespace.json")
    }

    pub fn agents_dir(&self, namespace: &Ident) -> PathBuf {
        self.namespace_dir(namespace).join("agents")
    }

    /// Every path of one Agent.
    pub fn agent(&self, namespace: &Ident, agent: &Ident) -> AgentPaths {
        let dir = self.agents_dir(namespace).join(dir_name(agent));
        let unit_name = unit_name(namespace, agent);
        AgentPaths {
            marker: dir.join("agent.json"),
            home: dir.join("home"),
            state: dir.join("state"),
            revisions: dir.join("revisions"),
            current: dir.join("current"),
            live_config: dir.join("config").join("openclaw.json"),
            served: dir.join("served.json"),
            started: dir.join("started.json"),
            password_file: dir.join(ENV_FILES[0]),
            operator_env: dir.join(ENV_FILES[1]),
            launch_env: dir.join(ENV_FILES[2]),
            workspace: dir.join("state").join("workspace"),
            workspace_request: dir.join(WORKSPACE_REQUEST_FILE),
            workspace_applied: dir.join(WORKSPACE_APPLIED_FILE),
            workspace_staging: dir.join(".workspace-staging"),
            unit_file: self.unit_dir.join(&unit_name),
            lock: self.locks_dir().join(format!(
                "{}.lock",
                hash_prefix(&agent_key(namespace, agent), 32)
            )),
            fence: self.fences_dir().join(format!(
                "{}.json",
                hash_prefix(&agent_key(namespace, agent), 32)
            )),
            account: account_name(namespace, agent),
            unit_name,
            dir,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(s: &str) -> Ident {
        Ident::new(s).unwrap()
    }

    #[test]
    fn names_have_the_designed_shapes() {
        let account = account_name(&id("ns"), &id("a"));
        assert_eq!(account.len(), 28);
        assert!(account.starts_with("cfa-"));
        let unit = unit_name(&id("ns"), &id("a"));
        assert!(is_unit_name(&unit), "{unit}");
        assert_eq!(dir_name(&id("ns")).len(), 32);
    }

    #[test]
    fn the_namespace_is_part_of_agent_names() {
        assert_ne!(
            account_name(&id("ns1"), &id("a")),
            account_name(&id("ns2"), &id("a"))
        );
        assert_ne!(
            unit_name(&id("ns1"), &id("a")),
            unit_name(&id("ns2"), &id("a"))
        );
        // "a:b" + "c" and "a" + "b:c" cannot collide: ':' is not an identifier character.
        assert!(Ident::new("a:b").is_err());
    }

    #[test]
    fn stray_unit_names_are_not_ours() {
        assert!(!is_unit_name("clawfleet-agent-xyz.service"));
        assert!(!is_unit_name("sshd.service"));
    }
}
