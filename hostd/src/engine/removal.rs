//! `delete-agent` and `delete-namespace`. Both validate everything they will remove before
//! stopping anything, and both are safe to retry after a failure halfway (for example a
//! `groupdel` that failed after `userdel` succeeded): the account marker stays until the
//! account is fully gone, and a retry finds and finishes it.

use clawfleet_protocol::Ident;
use clawfleet_protocol::failure::{Failure, FailureCode};
use clawfleet_protocol::operation::{AgentRef, NamespaceRef};
use clawfleet_protocol::result::{DeleteAgentResult, DeleteNamespaceResult, Step};

use super::hooks::{Event, Subject};
use super::{Ctx, Engine, fs_failure, marker_failure, ownership, system_failure};
use crate::fsutil::{self, Kind};
use crate::layout::{AgentPaths, dir_name};
use crate::markers::{
    self, AccountIntent, AccountMarker, AgentMarker, NamespaceMarker, PortMarker,
};
use crate::trash::Moved;

impl Engine<'_> {
    /// Stops and disables the unit and removes its file. Assumes the file was verified ours.
    fn remove_unit(&self, ctx: &mut Ctx<'_>, paths: &AgentPaths) -> Result<bool, Failure> {
        let had_file = fsutil::file_exists(&paths.unit_file).map_err(fs_failure)?;
        let state = self
            .system
            .unit_state(&paths.unit_name)
            .map_err(system_failure)?;
        if state.loaded {
            ctx.step(Step::Stop)?;
            self.system
                .stop_unit(&paths.unit_name, self.config.limits.unit_stop_timeout)
                .map_err(system_failure)?;
            // A unit that failed stays in systemd's failed list after it is stopped and its
            // file removed, until its failed state is reset.
            self.system
                .reset_failed_unit(&paths.unit_name)
                .map_err(system_failure)?;
        }
        self.remove_companions(ctx, paths)?;
        if had_file {
            ctx.step(Step::Disable)?;
            self.system
                .disable_unit(&paths.unit_name)
                .map_err(system_failure)?;
            ctx.step(Step::Remove)?;
            // Until a reload forgets the unit, systemd still has it loaded from this file.
            self.mark_reload_pending(&paths.unit_name)?;
            fsutil::remove_file_if_present(&paths.unit_file).map_err(fs_failure)?;
        }
        Ok(had_file)
    }

    /// Stops the Agent's network units (front, port socket, namespace: the namespace goes
    /// with its unit's stop) and removes their files. Whether or not this host gives Agents
    /// their own network now: files an earlier hostd wrote go too.
    fn remove_companions(&self, ctx: &mut Ctx<'_>, paths: &AgentPaths) -> Result<(), Failure> {
        let net = crate::unit::AgentNet::for_unit(&paths.unit_name, self.config.front_hold_ms);
        let mut removed = false;
        for name in net.stop_order() {
            let state = self.system.unit_state(name).map_err(system_failure)?;
            if state.loaded {
                ctx.step(Step::Stop)?;
                self.system
                    .stop_unit(name, self.config.limits.unit_stop_timeout)
                    .map_err(system_failure)?;
                self.system
                    .reset_failed_unit(name)
                    .map_err(system_failure)?;
            }
            let file = self.layout.unit_dir.join(name);
            if fsutil::file_exists(&file).map_err(fs_failure)? {
                if !removed {
                    self.mark_reload_pending(&paths.unit_name)?;
                    removed = true;
                }
                fsutil::remove_file_if_present(&file).map_err(fs_failure)?;
            }
        }
        Ok(())
    }

    /// The `before-workload-stop` hooks of an Agent about to be removed, when its gateway
    /// would be running: the unit file is there and `current` names a revision (what
    /// stop-revision stops). As in stop-revision, they run in reverse order and a failing one
    /// is logged and never keeps the removal from going on.
    fn workload_stop_hooks(
        &self,
        ctx: &mut Ctx<'_>,
        ns: &Ident,
        ns_name: &Ident,
        agent: &AgentRef,
        paths: &AgentPaths,
    ) -> Result<(), Failure> {
        if !fsutil::file_exists(&paths.unit_file).map_err(fs_failure)? {
            return Ok(());
        }
        let Some(current) = self.read_current(ns, &agent.id, paths)? else {
            return Ok(());
        };
        ctx.step(Step::Hooks)?;
        let subject = Subject {
            namespace_id: ns.as_str(),
            namespace_name: ns_name.as_str(),
            agent_id: Some(agent.id.as_str()),
            service_principal_id: Some(agent.service_principal_id.as_str()),
            revision_id: Some(current.revision_id.as_str()),
            revision_number: Some(current.number.get()),
        };
        if let Err(f) = self.run_hooks_reverse(ctx, Event::BeforeWorkloadStop, &subject) {
            tracing::warn!(operation_id = %ctx.operation_id, agent = %agent.id, "before-workload-stop: {f}");
        }
        Ok(())
    }

    /// Removes the account (user, then group, then marker) and its port reservations. Each
    /// piece that is already gone is skipped, so this finishes a half-done earlier attempt.
    fn remove_identity(&self, ctx: &mut Ctx<'_>, marker: &AccountMarker) -> Result<(), Failure> {
        ctx.step(Step::AccountRemoval)?;
        // Checked before anything was removed; checked again here because it is cheap and the
        // account tools are the one step that cannot be undone.
        self.verify_remaining_account(marker)?;
        // Its btrfs quota group (its subvolumes, already moved aside, go with the tree),
        // before the uid is free for another Agent.
        crate::quota::release_agent(&self.config.state_root, marker.uid).map_err(|e| {
            Failure::new(
                FailureCode::IoFailed,
                format!("cannot remove the Agent's disk limit: {e}"),
            )
        })?;
        self.remove_account_and_ports(&marker.account, &marker.namespace_id, &marker.agent_id)?;
        fsutil::remove_file_if_present(&self.layout.account_marker(&marker.account))
            .map_err(fs_failure)?;
        Ok(())
    }

    /// Removes what a run killed between its account intent and the account marker left:
    /// the user and group of the intent's name (hostd was creating them), its ports, the
    /// intent.
    fn remove_intended_account(
        &self,
        ctx: &mut Ctx<'_>,
        intent: &AccountIntent,
    ) -> Result<(), Failure> {
        ctx.step(Step::AccountRemoval)?;
        self.remove_account_and_ports(&intent.account, &intent.namespace_id, &intent.agent_id)
    }

    /// The user and group of `account` (those still there), the Agent's port reservations
    /// and any intent to create the account.
    fn remove_account_and_ports(
        &self,
        account: &str,
        ns: &Ident,
        agent: &Ident,
    ) -> Result<(), Failure> {
        if self.system.user(account).map_err(system_failure)?.is_some() {
            self.system.delete_user(account).map_err(system_failure)?;
        }
        if self
            .system
            .group(account)
            .map_err(system_failure)?
            .is_some()
        {
            self.system.delete_group(account).map_err(system_failure)?;
        }
        self.release_ports(ns, agent)?;
        fsutil::remove_file_if_present(&self.layout.account_intent(account)).map_err(fs_failure)?;
        Ok(())
    }

    fn release_ports(&self, ns: &Ident, agent: &Ident) -> Result<(), Failure> {
        let dir = self.layout.ports_dir();
        if !fsutil::dir_exists(&dir).map_err(fs_failure)? {
            return Ok(());
        }
        for name in fsutil::list_dir(&dir).map_err(fs_failure)? {
            let path = dir.join(&name);
            if let Ok(m) = markers::read::<PortMarker>(&path, "port")
                && &m.namespace_id == ns
                && &m.agent_id == agent
            {
                fsutil::remove_file_if_present(&path).map_err(fs_failure)?;
            }
        }
        Ok(())
    }

    /// Removes one Agent completely: unit, directory (state, credentials, snapshots), port,
    /// account. Absence is success. Everything it will remove is validated first (markers,
    /// every snapshot, `current`, the unit file and the live account's ids), so a refusal
    /// leaves all of it in place.
    pub(crate) fn delete_agent(
        &self,
        ctx: &mut Ctx<'_>,
        ns: &NamespaceRef,
        agent: &AgentRef,
    ) -> Result<DeleteAgentResult, Failure> {
        let paths = self.layout.agent(&ns.id, &agent.id);
        let agent_lock = self.agent_lock(ctx, &paths.lock)?;
        let mut moved = None;
        let result = self
            .check_fence(ctx, &ns.id, &agent.id, &paths)
            .and_then(|()| self.delete_agent_locked(ctx, ns, agent, &paths, &mut moved));
        self.forget_lock_if_absent(&agent_lock, &paths);
        drop(agent_lock);
        let result = result?;
        self.delete_moved(ctx, moved)?;
        Ok(result)
    }

    /// Moves a directory tree into the trash under the locks (see `crate::trash`): from then
    /// on it is gone from its name, and [`Engine::delete_moved`] deletes it once the locks
    /// are released.
    fn move_aside(&self, path: &std::path::Path) -> Result<Option<Moved>, Failure> {
        self.trash().move_aside(path).map_err(fs_failure)
    }

    /// Deletes trees [`Engine::move_aside`] moved, with no lock held: a tree of 400,000 files
    /// takes seconds, and another tenant's operation must not wait for it (issue 26, N8). A
    /// failure leaves the entry in the trash, where the next changing operation finishes it
    /// and `status` lists it until then.
    fn delete_moved(&self, ctx: &Ctx<'_>, moved: Option<Moved>) -> Result<(), Failure> {
        let Some(moved) = moved else {
            return Ok(());
        };
        let started = std::time::Instant::now();
        let entry = moved.path().display().to_string();
        moved.delete().map_err(fs_failure)?;
        tracing::info!(operation_id = %ctx.operation_id, entry, ms = started.elapsed().as_millis() as u64, "removed tree deleted outside the locks");
        Ok(())
    }

    fn delete_agent_locked(
        &self,
        ctx: &mut Ctx<'_>,
        ns: &NamespaceRef,
        agent: &AgentRef,
        paths: &AgentPaths,
        moved: &mut Option<Moved>,
    ) -> Result<DeleteAgentResult, Failure> {
        ctx.step(Step::Verify)?;
        if fsutil::dir_exists(&self.layout.namespace_dir(&ns.id)).map_err(fs_failure)? {
            self.verify_namespace(ns)?;
        }
        let account_marker: Option<AccountMarker> =
            markers::read_optional(&self.layout.account_marker(&paths.account), "account")
                .map_err(marker_failure)?;
        if let Some(m) = &account_marker {
            self.check_account_marker(m, &ns.id, agent, &paths.account)?;
            self.verify_remaining_account(m)?;
        }
        let intent = self.account_intent(&ns.id, agent, paths)?;
        let dir_present = fsutil::dir_exists(&paths.dir).map_err(fs_failure)?;
        if dir_present {
            self.verify_agent(&ns.id, agent, paths)?;
            self.verify_snapshots(&ns.id, &agent.id, paths)?;
        } else {
            self.verify_unit_file(&ns.id, &agent.id, paths)?;
        }
        // A running gateway is stopped as stop-revision stops it: its stop hooks first.
        if dir_present {
            self.workload_stop_hooks(ctx, &ns.id, &ns.name, agent, paths)?;
        }
        let host = self.host_lock(ctx)?;
        let unit_removed = self.remove_unit(ctx, paths)?;
        if unit_removed {
            let ticket = self.reload_ticket();
            self.daemon_reload(ctx, &host, ticket)?;
        }
        self.clear_reload_pending(&paths.unit_name)?;
        if dir_present {
            ctx.step(Step::Remove)?;
            *moved = self.move_aside(&paths.dir)?;
        }
        // Leftovers of an interrupted earlier removal (pending names, never read).
        self.sweep_pending(&self.layout.agents_dir(&ns.id));
        if let Some(m) = &account_marker {
            self.remove_identity(ctx, m)?;
        } else if let Some(i) = &intent {
            self.remove_intended_account(ctx, i)?;
        } else {
            self.release_ports(&ns.id, &agent.id)?;
        }
        let removed = dir_present || account_marker.is_some() || intent.is_some() || unit_removed;
        if removed {
            tracing::info!(operation_id = %ctx.operation_id, agent = %agent.id, "agent deleted");
        }
        Ok(DeleteAgentResult { removed })
    }

    /// Removes a Namespace and every Agent in it, after validating the whole set.
    pub(crate) fn delete_namespace(
        &self,
        ctx: &mut Ctx<'_>,
        ns: &NamespaceRef,
    ) -> Result<DeleteNamespaceResult, Failure> {
        ctx.step(Step::Verify)?;
        let ns_dir = self.layout.namespace_dir(&ns.id);
        let present = fsutil::dir_exists(&ns_dir).map_err(fs_failure)?;
        // Validate the deletion set before stopping anything.
        let mut agents: Vec<(AgentRef, AgentPaths)> = Vec::new();
        if present {
            let marker: NamespaceMarker =
                markers::read(&self.layout.namespace_marker(&ns.id), "namespace")
                    .map_err(marker_failure)?;
            if !super::checks::namespace_matches(&marker, ns) {
                return Err(ownership(format!(
                    "{} belongs to Namespace {} ({})",
                    ns_dir.display(),
                    marker.namespace_id,
                    marker.namespace_name
                )));
            }
            let agents_dir = self.layout.agents_dir(&ns.id);
            fsutil::expect_kind(&agents_dir, Kind::Dir).map_err(fs_failure)?;
            for name in fsutil::list_dir(&agents_dir).map_err(fs_failure)? {
                let dir = agents_dir.join(&name);
                let m: AgentMarker =
                    markers::read(&dir.join("agent.json"), "agent").map_err(marker_failure)?;
                if m.namespace_id != ns.id || dir_name(&m.agent_id) != name {
                    return Err(ownership(format!(
                        "{} holds the marker of Agent {}/{}",
                        dir.display(),
                        m.namespace_id,
                        m.agent_id
                    )));
                }
                let agent = AgentRef {
                    id: m.agent_id.clone(),
                    service_principal_id: m.service_principal_id.clone(),
                };
                let paths = self.layout.agent(&ns.id, &agent.id);
                self.verify_agent(&ns.id, &agent, &paths)?;
                self.verify_account(&ns.id, &agent, &paths)?;
                self.verify_snapshots(&ns.id, &agent.id, &paths)?;
                // Refused before the hooks when the fence is stale; checked again under its lock.
                self.fence_verdict(ctx, &ns.id, &agent.id, &paths)?;
                agents.push((agent, paths));
            }
        }
        // Leftover accounts of this Namespace (from a retry after a partial failure).
        let mut leftovers: Vec<AccountMarker> = Vec::new();
        let mut intents: Vec<AccountIntent> = Vec::new();
        let accounts_dir = self.layout.accounts_dir();
        if fsutil::dir_exists(&accounts_dir).map_err(fs_failure)? {
            for name in fsutil::list_dir(&accounts_dir).map_err(fs_failure)? {
                if name.ends_with(".intent") {
                    if let Ok(i) =
                        markers::read::<AccountIntent>(&accounts_dir.join(&name), "account intent")
                        && i.namespace_id == ns.id
                    {
                        intents.push(i);
                    }
                    continue;
                }
                if !name.ends_with(".json") {
                    continue;
                }
                // An unreadable marker of some other Agent must not block this deletion.
                if let Ok(m) = markers::read::<AccountMarker>(&accounts_dir.join(&name), "account")
                    && m.namespace_id == ns.id
                {
                    self.verify_remaining_account(&m)?;
                    leftovers.push(m);
                }
            }
        }
        // The operator's hooks, after the whole set validated and before anything is stopped
        // or removed: a failing hook stops the deletion with nothing removed.
        if present {
            ctx.step(Step::Hooks)?;
            self.run_hooks(
                ctx,
                Event::BeforeNamespaceDelete,
                &Subject {
                    namespace_id: ns.id.as_str(),
                    namespace_name: ns.name.as_str(),
                    ..Subject::default()
                },
            )?;
        }
        // Agent locks in a fixed order, then the host lock: those of the Agents in the
        // directory and of the leftover accounts (a retry after a kill), so every lock file
        // of the Namespace goes with it, unlinked while held.
        let mut lock_paths: std::collections::BTreeSet<std::path::PathBuf> =
            agents.iter().map(|(_, p)| p.lock.clone()).collect();
        for agent_id in leftovers
            .iter()
            .map(|m| &m.agent_id)
            .chain(intents.iter().map(|i| &i.agent_id))
        {
            lock_paths.insert(self.layout.agent(&ns.id, agent_id).lock);
        }
        let mut locks = Vec::new();
        for path in &lock_paths {
            locks.push(self.agent_lock(ctx, path)?);
        }
        for (agent, paths) in &agents {
            self.check_fence(ctx, &ns.id, &agent.id, paths)?;
        }
        for (agent, paths) in &agents {
            self.workload_stop_hooks(ctx, &ns.id, &ns.name, agent, paths)?;
        }
        let host = self.host_lock(ctx)?;
        let mut any_unit = false;
        for (_, paths) in &agents {
            any_unit |= self.remove_unit(ctx, paths)?;
        }
        if any_unit {
            let ticket = self.reload_ticket();
            self.daemon_reload(ctx, &host, ticket)?;
        }
        for (_, paths) in &agents {
            self.clear_reload_pending(&paths.unit_name)?;
        }
        let mut moved = None;
        if present {
            ctx.step(Step::Remove)?;
            moved = self.move_aside(&ns_dir)?;
        }
        for m in &leftovers {
            self.remove_identity(ctx, m)?;
        }
        for i in &intents {
            // An intent whose marker was written too went with the marker above.
            if fsutil::file_exists(&self.layout.account_intent(&i.account)).map_err(fs_failure)? {
                self.remove_intended_account(ctx, i)?;
            }
        }
        for lock in &locks {
            lock.unlink();
        }
        drop(host);
        drop(locks);
        self.delete_moved(ctx, moved)?;
        if !present && leftovers.is_empty() && intents.is_empty() {
            return Ok(DeleteNamespaceResult {
                namespace_id: ns.id.clone(),
                removed: false,
                agents_removed: 0,
            });
        }
        tracing::info!(operation_id = %ctx.operation_id, namespace = %ns.id, agents = agents.len(), "namespace deleted");
        Ok(DeleteNamespaceResult {
            namespace_id: ns.id.clone(),
            removed: true,
            agents_removed: u32::try_from(agents.len()).unwrap_or(u32::MAX),
        })
    }
}
