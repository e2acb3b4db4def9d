//! Read-only checks of what is on the host against what an operation expects. Every check
//! fails closed and changes nothing.

use std::path::{Path, PathBuf};

use clawfleet_protocol::failure::{Failure, FailureCode};
use clawfleet_protocol::ident::sha256;
use clawfleet_protocol::operation::{AgentRef, NamespaceRef, RevisionRef};
use clawfleet_protocol::{Ident, Sha256Hex};

use super::{Ctx, Engine, fs_failure, marker_failure, ownership, system_failure};
use crate::fsutil::{self, Kind};
use crate::layout::{AgentPaths, dir_name};
use crate::markers::{
    self, AccountMarker, AgentMarker, NamespaceMarker, RevisionMarker, ServedMarker, StartedMarker,
};
use crate::system::Ids;
use crate::unit;

/// Largest snapshot read back for hash verification.
pub(super) const MAX_SNAPSHOT: u64 = 1024 * 1024;

impl Engine<'_> {
    /// The Namespace exists on this host and its marker names exactly this Namespace.
    pub(crate) fn verify_namespace(&self, ns: &NamespaceRef) -> Result<(), Failure> {
        let dir = self.layout.namespace_dir(&ns.id);
        if !fsutil::dir_exists(&dir).map_err(fs_failure)? {
            return Err(Failure::new(
                FailureCode::NamespaceMissing,
                format!("Namespace {} is not on this host; ensure it first", ns.id),
            ));
        }
        let marker: NamespaceMarker =
            markers::read(&self.layout.namespace_marker(&ns.id), "namespace")
                .map_err(marker_failure)?;
        if marker.namespace_id != ns.id || marker.namespace_name != ns.name {
            return Err(ownership(format!(
                "{} belongs to Namespace {} ({}), not {} ({})",
                dir.display(),
                marker.namespace_id,
                marker.namespace_name,
                ns.id,
                ns.name
            )));
        }
        fsutil::expect_kind(&self.layout.agents_dir(&ns.id), Kind::Dir).map_err(fs_failure)?;
        Ok(())
    }

    /// The account marker names this Agent and the live account has the recorded ids.
    pub(crate) fn verify_account(
        &self,
        ns: &Ident,
        agent: &AgentRef,
        paths: &AgentPaths,
    ) -> Result<Ids, Failure> {
        let marker: AccountMarker =
            markers::read(&self.layout.account_marker(&paths.account), "account")
                .map_err(marker_failure)?;
        self.check_account_marker(&marker, ns, agent, &paths.account)?;
        let live = self.system.user(&paths.account).map_err(system_failure)?;
        let group = self.system.group(&paths.account).map_err(system_failure)?;
        match (live, group) {
            (Some(ids), Some(gid))
                if ids.uid == marker.uid && ids.gid == marker.gid && gid == marker.gid =>
            {
                Ok(ids)
            }
            _ => Err(ownership(format!(
                "account {} does not match its marker (uid {}, gid {})",
                paths.account, marker.uid, marker.gid
            ))),
        }
    }

    pub(crate) fn check_account_marker(
        &self,
        marker: &AccountMarker,
        ns: &Ident,
        agent: &AgentRef,
        account: &str,
    ) -> Result<(), Failure> {
        if &marker.namespace_id != ns
            || marker.agent_id != agent.id
            || marker.service_principal_id != agent.service_principal_id
            || marker.account != account
        {
            return Err(ownership(format!(
                "account {account} is bound to Agent {}/{} (service principal {}), not {}/{} ({})",
                marker.namespace_id,
                marker.agent_id,
                marker.service_principal_id,
                ns,
                agent.id,
                agent.service_principal_id
            )));
        }
        if marker.uid == 0 || marker.gid == 0 {
            return Err(ownership(format!(
                "account {account} has uid or gid 0 in its marker"
            )));
        }
        Ok(())
    }

    /// The Agent directory's marker names this Agent, and its parts are what we made.
    pub(crate) fn verify_agent(
        &self,
        ns: &Ident,
        agent: &AgentRef,
        paths: &AgentPaths,
    ) -> Result<AgentMarker, Failure> {
        fsutil::expect_kind(&paths.dir, Kind::Dir).map_err(fs_failure)?;
        let marker: AgentMarker = markers::read(&paths.marker, "agent").map_err(marker_failure)?;
        if &marker.namespace_id != ns
            || marker.agent_id != agent.id
            || marker.service_principal_id != agent.service_principal_id
            || marker.account != paths.account
        {
            return Err(ownership(format!(
                "{} belongs to Agent {}/{} (service principal {}), not {}/{} ({})",
                paths.dir.display(),
                marker.namespace_id,
                marker.agent_id,
                marker.service_principal_id,
                ns,
                agent.id,
                agent.service_principal_id
            )));
        }
        if marker.port < 1024 {
            return Err(ownership(format!(
                "{} names port {}",
                paths.marker.display(),
                marker.port
            )));
        }
        for dir in [&paths.home, &paths.state, &paths.revisions] {
            fsutil::expect_kind(dir, Kind::Dir).map_err(fs_failure)?;
        }
        self.verify_unit_file(ns, &agent.id, paths)?;
        Ok(marker)
    }

    /// A unit file at our unit's name must carry our ownership line.
    pub(crate) fn verify_unit_file(
        &self,
        ns: &Ident,
        agent: &Ident,
        paths: &AgentPaths,
    ) -> Result<Option<String>, Failure> {
        if !fsutil::file_exists(&paths.unit_file).map_err(fs_failure)? {
            return Ok(None);
        }
        let bytes = fsutil::read_small(&paths.unit_file, 64 * 1024).map_err(fs_failure)?;
        let text = String::from_utf8(bytes).map_err(|_| {
            ownership(format!(
                "{} is not a unit hostd wrote",
                paths.unit_file.display()
            ))
        })?;
        if !unit::is_owned_by(&text, ns, agent) {
            return Err(ownership(format!(
                "{} exists but was not written by hostd for this Agent; refusing to touch it",
                paths.unit_file.display()
            )));
        }
        Ok(Some(text))
    }

    /// The revision `current` points at, fully verified; `None` if there is no `current`.
    pub(crate) fn read_current(
        &self,
        ns: &Ident,
        agent: &Ident,
        paths: &AgentPaths,
    ) -> Result<Option<RevisionMarker>, Failure> {
        match fsutil::kind(&paths.current).map_err(fs_failure)? {
            Kind::Missing => return Ok(None),
            Kind::Symlink => {}
            _ => {
                return Err(ownership(format!(
                    "{} is not a symlink",
                    paths.current.display()
                )));
            }
        }
        let target = std::fs::read_link(&paths.current)
            .map_err(fsutil::io_err(&paths.current))
            .map_err(fs_failure)?;
        let name = current_target_name(&target).ok_or_else(|| {
            ownership(format!(
                "{} points at {}, outside revisions/",
                paths.current.display(),
                target.display()
            ))
        })?;
        let dir = paths.revisions.join(&name);
        let marker = self.read_snapshot(ns, agent, &dir)?;
        if dir_name(&marker.revision_id) != name {
            return Err(ownership(format!(
                "{} holds revision {}, whose directory name differs",
                dir.display(),
                marker.revision_id
            )));
        }
        Ok(Some(marker))
    }

    /// Like [`Self::read_current`], for prepare and activate, which repoint `current` anyway:
    /// a `current` under `revisions/` that names no revision (not a revision name, or a
    /// revision directory that does not exist, as a hand edit leaves it) counts as none, with
    /// a warning, so a deploy or `occ agent reconcile` can put it back. A target outside the
    /// Agent's `revisions/` is still refused. A revision directory
    /// that exists but does not verify is still refused: it may be a newer revision that was
    /// tampered with, and nothing may roll back over it unseen.
    pub(crate) fn read_current_repairable(
        &self,
        ctx: &Ctx<'_>,
        ns: &Ident,
        agent: &Ident,
        paths: &AgentPaths,
    ) -> Result<Option<RevisionMarker>, Failure> {
        if matches!(
            fsutil::kind(&paths.current).map_err(fs_failure)?,
            Kind::Symlink
        ) {
            let target = std::fs::read_link(&paths.current)
                .map_err(fsutil::io_err(&paths.current))
                .map_err(fs_failure)?;
            // Only a pointer that stays inside `revisions/` is repaired; one that leaves the
            // Agent's directory (absolute, `..`) looks like tampering and stays refused.
            let inside = {
                let mut parts = target.components();
                parts.next().is_some_and(|c| c.as_os_str() == "revisions")
                    && parts.all(|c| matches!(c, std::path::Component::Normal(_)))
            };
            let names_nothing = inside
                && match current_target_name(&target) {
                    None => true,
                    Some(name) => matches!(
                        fsutil::kind(&paths.revisions.join(name)).map_err(fs_failure)?,
                        Kind::Missing
                    ),
                };
            if names_nothing {
                tracing::warn!(
                    operation_id = %ctx.operation_id,
                    current = %paths.current.display(),
                    target = %target.display(),
                    "current names no revision of this Agent; it will be repointed"
                );
                return Ok(None);
            }
        }
        self.read_current(ns, agent, paths)
    }

    /// Reads and verifies one snapshot directory: marker, ownership, and the hash of its bytes.
    pub(crate) fn read_snapshot(
        &self,
        ns: &Ident,
        agent: &Ident,
        dir: &Path,
    ) -> Result<RevisionMarker, Failure> {
        fsutil::expect_kind(dir, Kind::Dir).map_err(fs_failure)?;
        let marker: RevisionMarker =
            markers::read(&dir.join(super::revision::REVISION_MARKER), "revision")
                .map_err(marker_failure)?;
        if &marker.namespace_id != ns || &marker.agent_id != agent {
            return Err(ownership(format!(
                "{} belongs to Agent {}/{}",
                dir.display(),
                marker.namespace_id,
                marker.agent_id
            )));
        }
        let bytes =
            fsutil::read_small(&dir.join("openclaw.json"), MAX_SNAPSHOT).map_err(fs_failure)?;
        if Sha256Hex::from_digest(&sha256(&bytes)) != marker.configuration_hash {
            return Err(Failure::new(
                FailureCode::SnapshotMismatch,
                format!(
                    "{} does not match its recorded hash",
                    dir.join("openclaw.json").display()
                ),
            ));
        }
        Ok(marker)
    }

    /// This revision's snapshot exists and is exactly the revision referenced.
    pub(crate) fn verify_snapshot(
        &self,
        ns: &Ident,
        agent: &Ident,
        paths: &AgentPaths,
        rev: &RevisionRef,
    ) -> Result<RevisionMarker, Failure> {
        let dir = paths.revision_dir(&rev.id);
        if !fsutil::dir_exists(&dir).map_err(fs_failure)? {
            return Err(Failure::new(
                FailureCode::RevisionNotPrepared,
                format!("revision {} is not prepared on this host", rev.id),
            ));
        }
        let marker = self.read_snapshot(ns, agent, &dir)?;
        snapshot_matches(&marker, rev)?;
        Ok(marker)
    }

    /// `served.json`, if present and valid.
    pub(crate) fn read_served(&self, paths: &AgentPaths) -> Result<Option<ServedMarker>, Failure> {
        markers::read_optional(&paths.served, "served").map_err(marker_failure)
    }

    /// The served revision a candidate could replace without a restart (a secrets-only or a
    /// live configuration change): `served.json` names a revision other than `candidate`,
    /// `current` names that one or the candidate (a retry), the candidate asks for the
    /// managed password (how hostd asks the gateway), and the served snapshot is there, with
    /// the candidate's harness and password use. Its marker and snapshot directory.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn served_for_in_place_change(
        &self,
        ns: &Ident,
        agent: &Ident,
        paths: &AgentPaths,
        candidate: &Ident,
        current: Option<&Ident>,
        harness: &clawfleet_protocol::operation::Harness,
        needs_password: bool,
    ) -> Result<Option<(RevisionMarker, PathBuf)>, Failure> {
        let Some(served) = self.read_served(paths)? else {
            return Ok(None);
        };
        if &served.revision_id == candidate || !needs_password {
            return Ok(None);
        }
        if current.is_none_or(|c| c != &served.revision_id && c != candidate) {
            return Ok(None);
        }
        let dir = paths.revision_dir(&served.revision_id);
        if !fsutil::dir_exists(&dir).map_err(fs_failure)? {
            return Ok(None);
        }
        let marker = self.read_snapshot(ns, agent, &dir)?;
        if &marker.harness != harness || marker.needs_password != needs_password {
            return Ok(None);
        }
        Ok(Some((marker, dir)))
    }

    /// `started.json`, if present and valid.
    pub(crate) fn read_started(
        &self,
        paths: &AgentPaths,
    ) -> Result<Option<StartedMarker>, Failure> {
        markers::read_optional(&paths.started, "started").map_err(marker_failure)
    }

    /// Every snapshot under `revisions/` is exactly what hostd wrote: its marker names this
    /// Agent and the revision its directory is named after, and its bytes match their hash.
    /// `current`, if present, points at one of them.
    pub(crate) fn verify_snapshots(
        &self,
        ns: &Ident,
        agent: &Ident,
        paths: &AgentPaths,
    ) -> Result<(), Failure> {
        for name in fsutil::list_dir(&paths.revisions).map_err(fs_failure)? {
            let dir = paths.revisions.join(&name);
            let marker = self.read_snapshot(ns, agent, &dir)?;
            if dir_name(&marker.revision_id) != name {
                return Err(ownership(format!(
                    "{} holds revision {}, whose directory name differs",
                    dir.display(),
                    marker.revision_id
                )));
            }
        }
        self.read_current(ns, agent, paths)?;
        Ok(())
    }

    /// Whatever is left of the account an account marker records has the recorded ids. A
    /// user or group that is already gone is fine (a retry after a partial removal), one with
    /// other ids is not ours to remove.
    pub(crate) fn verify_remaining_account(&self, marker: &AccountMarker) -> Result<(), Failure> {
        if let Some(ids) = self.system.user(&marker.account).map_err(system_failure)?
            && (ids.uid != marker.uid || ids.gid != marker.gid)
        {
            return Err(ownership(format!(
                "user {} has uid {} and gid {}, its marker says uid {} and gid {}; refusing to remove it",
                marker.account, ids.uid, ids.gid, marker.uid, marker.gid
            )));
        }
        if let Some(gid) = self.system.group(&marker.account).map_err(system_failure)?
            && (gid != marker.gid || gid == 0)
        {
            return Err(ownership(format!(
                "group {} has gid {gid}, its marker says {}; refusing to remove it",
                marker.account, marker.gid
            )));
        }
        Ok(())
    }

    /// Why the configured gateway command cannot start, if it cannot. Its first word must be a
    /// regular file (symlinks followed) that the Agent accounts may execute: they own nothing
    /// on the host and are in no other group, so that is the "others" execute bit.
    pub(crate) fn gateway_command_problem(&self) -> Option<String> {
        gateway_command_problem(&self.config.gateway_command)
    }

    /// Refuses an operation that would start the gateway when its command cannot run.
    pub(crate) fn check_gateway_command(&self) -> Result<(), Failure> {
        match self.gateway_command_problem() {
            None => Ok(()),
            Some(problem) => Err(Failure::new(
                FailureCode::GatewayCommandMissing,
                format!(
                    "{problem}; install the gateway or set gateway_command in hostd.toml (nothing was changed)"
                ),
            )),
        }
    }
}

/// See [`Engine::gateway_command_problem`].
pub(crate) fn gateway_command_problem(command: &[String]) -> Option<String> {
    use std::os::unix::fs::PermissionsExt;
    let Some(exe) = command.first() else {
        return Some("the gateway command is empty".to_owned());
    };
    match std::fs::metadata(exe) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            Some(format!("the gateway command {exe} does not exist"))
        }
        Err(e) => Some(format!("the gateway command {exe} cannot be examined: {e}")),
        Ok(m) if !m.is_file() => Some(format!("the gateway command {exe} is not a regular file")),
        Ok(m) if m.permissions().mode() & 0o001 == 0 => Some(format!(
            "the gateway command {exe} is not executable by the Agent accounts (mode {:04o})",
            m.permissions().mode() & 0o7777
        )),
        Ok(_) => None,
    }
}

/// At most this many differing lines are named in a unit drift report.
const UNIT_DRIFT_LINES: usize = 4;

impl Engine<'_> {
    /// How the Agent's unit differs from what hostd would write for it (`status`, and so the
    /// coordinator's drift sweep): a unit file edited by hand (a sandbox line removed, a limit
    /// raised), not ours, or unreadable, and drop-ins next to it, which systemd applies on
    /// top. `None` when it is exactly hostd's or there is no unit file yet (an Agent never
    /// activated; one with a `current` revision has lost its file). The next activation rewrites the file; drop-ins are the operator's.
    pub(crate) fn unit_drift(
        &self,
        ns: &Ident,
        agent: &Ident,
        paths: &AgentPaths,
        port: u16,
    ) -> Option<String> {
        let mut reasons = Vec::new();
        match self.verify_unit_file(ns, agent, paths) {
            Err(f) => reasons.push(f.message),
            // Activation writes the unit file before it moves `current`, and stop keeps it.
            Ok(None) if fsutil::kind(&paths.current).ok() == Some(Kind::Symlink) => {
                reasons.push(format!(
                    "the Agent has a current revision but no unit file at {}",
                    paths.unit_file.display()
                ));
            }
            Ok(None) => {}
            Ok(Some(text)) => {
                let want = self.unit_text(ns, agent, paths, port);
                if text != want {
                    reasons.push(unit_text_diff(&text, &want));
                }
                let egress = self.current_egress(ns, agent, paths);
                if let Some(net) = self.agent_net_with(paths, egress.as_ref()) {
                    reasons.extend(self.network_drift(ns, agent, &net, paths, port));
                }
            }
        }
        let dropins = self.layout.unit_dir.join(format!("{}.d", paths.unit_name));
        if let Ok(names) = fsutil::list_dir(&dropins) {
            let confs: Vec<&String> = names.iter().filter(|n| n.ends_with(".conf")).collect();
            if !confs.is_empty() {
                reasons.push(format!(
                    "drop-ins in {} override the unit: {}",
                    dropins.display(),
                    confs
                        .iter()
                        .map(|n| n.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ));
            }
        }
        (!reasons.is_empty()).then(|| reasons.join("; "))
    }

    /// What is amiss with an Agent's own network (issue 28): a companion unit file missing
    /// or edited, the port socket not listening, or the namespace gone while the gateway
    /// runs.
    fn network_drift(
        &self,
        ns: &Ident,
        agent: &Ident,
        net: &unit::AgentNet,
        paths: &AgentPaths,
        port: u16,
    ) -> Vec<String> {
        let mut reasons = Vec::new();
        for (name, want) in net.render(ns, agent, port) {
            let file = self.layout.unit_dir.join(&name);
            match fsutil::read_small(&file, 64 * 1024) {
                Ok(have) if have == want.as_bytes() => {}
                Ok(have) => reasons.push(format!(
                    "{name}: {}",
                    unit_text_diff(&String::from_utf8_lossy(&have), &want)
                )),
                Err(_) => reasons.push(format!(
                    "the Agent's unit {name} is missing ({} cannot be read)",
                    file.display()
                )),
            }
        }
        let running = self
            .system
            .unit_state(&paths.unit_name)
            .is_ok_and(|s| s.is_active());
        if running {
            if !self.system.netns_held(&net.net_unit) {
                reasons.push(format!(
                    "the Agent's network namespace {} is missing while its gateway runs (its unit {} is not active)",
                    net.netns, net.net_unit
                ));
            }
            match self.system.unit_state(&net.socket_unit) {
                Ok(s) if s.is_active() => {}
                Ok(s) => reasons.push(format!(
                    "the Agent's port socket {} is not listening ({} {})",
                    net.socket_unit, s.active_state, s.sub_state
                )),
                Err(e) => reasons.push(format!(
                    "the Agent's port socket {} cannot be read: {e}",
                    net.socket_unit
                )),
            }
        }
        reasons
    }

    /// An Agent never prepared here (no directory and no account marker) is missing, not
    /// someone else's: `AGENT_MISSING`, where the account check alone said
    /// `OWNERSHIP_MISMATCH`. Anything of it that is there is judged by the usual checks.
    pub(crate) fn require_agent_present(
        &self,
        ns: &Ident,
        agent: &Ident,
        paths: &AgentPaths,
    ) -> Result<(), Failure> {
        let missing = |p: &Path| -> Result<bool, Failure> {
            Ok(fsutil::kind(p).map_err(fs_failure)? == Kind::Missing)
        };
        if missing(&paths.dir)? && missing(&self.layout.account_marker(&paths.account))? {
            return Err(Failure::new(
                FailureCode::AgentMissing,
                format!(
                    "Agent {agent} of Namespace {ns} is not on this host (never prepared, or deleted); prepare a revision first"
                ),
            ));
        }
        Ok(())
    }
}

/// The lines of a unit file that hostd would not write, and those it would write that are
/// missing, each list cut at [`UNIT_DRIFT_LINES`].
fn unit_text_diff(have: &str, want: &str) -> String {
    let set = |t: &str| -> std::collections::BTreeSet<String> {
        t.lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
            .map(str::to_owned)
            .collect()
    };
    let (have, want) = (set(have), set(want));
    let list = |lines: Vec<&String>| {
        let more = lines.len().saturating_sub(UNIT_DRIFT_LINES);
        let mut shown: Vec<String> = lines
            .into_iter()
            .take(UNIT_DRIFT_LINES)
            .map(|l| format!("`{l}`"))
            .collect();
        if more > 0 {
            shown.push(format!("{more} more"));
        }
        shown.join(", ")
    };
    let added: Vec<&String> = have.difference(&want).collect();
    let missing: Vec<&String> = want.difference(&have).collect();
    let mut parts = Vec::new();
    if !added.is_empty() {
        parts.push(format!("has lines hostd does not write: {}", list(added)));
    }
    if !missing.is_empty() {
        parts.push(format!("lacks lines hostd writes: {}", list(missing)));
    }
    if parts.is_empty() {
        // Same lines, other order, comments or blank lines.
        parts.push("its lines are hostd's, in another order or with other comments".to_owned());
    }
    format!(
        "the unit file differs from what hostd writes: it {}",
        parts.join("; it ")
    )
}

/// An existing snapshot must be exactly the revision asked for.
pub(crate) fn snapshot_matches(marker: &RevisionMarker, rev: &RevisionRef) -> Result<(), Failure> {
    let mut differs = Vec::new();
    if marker.revision_id != rev.id {
        differs.push(format!(
            "revision id {} (not {})",
            marker.revision_id, rev.id
        ));
    }
    if marker.number != rev.number {
        differs.push(format!("number {} (not {})", marker.number, rev.number));
    }
    if marker.configuration_hash != rev.configuration_hash {
        differs.push(format!(
            "configuration hash {} (not {})",
            marker.configuration_hash, rev.configuration_hash
        ));
    }
    if differs.is_empty() {
        return Ok(());
    }
    // Only what differs: repeating equal values made a changed id read as no change at all.
    Err(Failure::new(
        FailureCode::SnapshotMismatch,
        format!(
            "the snapshot at revision {}'s directory holds {}",
            rev.id,
            differs.join(" and ")
        ),
    ))
}

/// `revisions/<32 hex>` exactly, or nothing.
fn current_target_name(target: &Path) -> Option<String> {
    let mut parts = target.components();
    let first = parts.next()?;
    let second = parts.next()?;
    if parts.next().is_some() || first.as_os_str() != "revisions" {
        return None;
    }
    let name = second.as_os_str().to_str()?;
    (name.len() == 32 && name.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')))
        .then(|| name.to_owned())
}

/// Whether a namespace marker matches a reference (used where the marker is already read).
pub(crate) fn namespace_matches(marker: &NamespaceMarker, ns: &NamespaceRef) -> bool {
    marker.namespace_id == ns.id && marker.namespace_name == ns.name
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 27: a changed revision id was reported as "holds number 1 with hash X, not
    /// number 1 with hash X". The message says what differs, and only that.
    #[test]
    fn a_snapshot_mismatch_says_what_differs() {
        use clawfleet_protocol::operation::{
            Harness, HarnessId, HarnessMode, HarnessVersion, RevisionNumber,
        };
        let hash = |c: char| Sha256Hex::new(c.to_string().repeat(64)).unwrap();
        let marker = RevisionMarker {
            schema: 1,
            namespace_id: Ident::new("ns1").unwrap(),
            agent_id: Ident::new("a1").unwrap(),
            revision_id: Ident::new("rev-1").unwrap(),
            number: RevisionNumber::new(1).unwrap(),
            configuration_hash: hash('a'),
            harness: Harness {
                id: HarnessId::Openclaw,
                version: HarnessVersion::new("2026.9.6").unwrap(),
                mode: HarnessMode::Embedded,
            },
            needs_password: false,
            egress: None,
        };
        let asked = |id: &str, number: u64, h: char| RevisionRef {
            id: Ident::new(id).unwrap(),
            number: RevisionNumber::new(number).unwrap(),
            configuration_hash: hash(h),
        };
        assert!(snapshot_matches(&marker, &asked("rev-1", 1, 'a')).is_ok());
        let f = snapshot_matches(&marker, &asked("rev-x", 1, 'a')).unwrap_err();
        assert_eq!(f.code, FailureCode::SnapshotMismatch);
        assert!(f.message.contains("revision id rev-1 (not rev-x)"), "{f}");
        assert!(
            !f.message.contains("number") && !f.message.contains("hash"),
            "{f}"
        );
        let f = snapshot_matches(&marker, &asked("rev-1", 2, 'b')).unwrap_err();
        assert!(
            f.message.contains("number 1 (not 2)")
                && f.message
                    .contains(&format!("hash {} (not {})", hash('a'), hash('b'))),
            "{f}"
        );
        assert!(!f.message.contains("revision id"), "{f}");
    }

    #[test]
    fn gateway_commands_must_be_executable_files() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let exe = dir.path().join("gw");
        let cmd = |p: &Path| vec![p.display().to_string(), "run".to_owned()];
        let missing = gateway_command_problem(&cmd(&exe)).unwrap();
        assert!(missing.contains("does not exist"), "{missing}");
        std::fs::write(&exe, "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o644)).unwrap();
        let plain = gateway_command_problem(&cmd(&exe)).unwrap();
        assert!(
            plain.contains("not executable") && plain.contains("0644"),
            "{plain}"
        );
        std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o750)).unwrap();
        assert!(
            gateway_command_problem(&cmd(&exe)).is_some(),
            "not for others"
        );
        std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert_eq!(gateway_command_problem(&cmd(&exe)), None);
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&exe, &link).unwrap();
        assert_eq!(
            gateway_command_problem(&cmd(&link)),
            None,
            "symlinks are followed"
        );
        let d = gateway_command_problem(&cmd(dir.path())).unwrap();
        assert!(d.contains("not a regular file"), "{d}");
    }

    #[test]
    fn current_targets_are_confined() {
        let ok = format!("revisions/{}", "a".repeat(32));
        assert!(current_target_name(Path::new(&ok)).is_some());
        for bad in [
            "/etc",
            "revisions/../../etc",
            "revisions",
            "other/aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
            "revisions/AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA",
            "revisions/aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa/x",
        ] {
            assert!(current_target_name(Path::new(bad)).is_none(), "{bad}");
        }
    }
}
