//! `plan-revision`: what prepare and activate would do for a revision, from the host's real
//! state, changing nothing. It runs the same checks those operations run, in the same order,
//! and takes no lock (a plan is a prediction; the coordinator's plan token catches a change
//! of the desired state in between, and a change on the host shows in the next plan).

use clawfleet_protocol::failure::{Failure, FailureCode};
use clawfleet_protocol::plan::{Change, PlanArgs, PlanResult};

use super::checks::snapshot_matches;
use super::revision::{needs_password, newer_is_current};
use super::{Ctx, Engine, fs_failure};
use crate::fsutil;
use crate::layout::AgentPaths;

impl Engine<'_> {
    /// The plan of a deploy of `args.revision`; a refusal that prepare or activate would
    /// answer is part of the plan, not a failure of it.
    pub(crate) fn plan(&self, ctx: &mut Ctx<'_>, args: &PlanArgs) -> Result<PlanResult, Failure> {
        let paths = self.layout.agent(&args.namespace.id, &args.agent.id);
        let mut plan = PlanResult {
            account: Change::Create,
            agent_directory: Change::Create,
            port: None,
            snapshot: Change::Create,
            password_file: Change::None,
            unit_file: Change::Create,
            daemon_reload: true,
            enable: true,
            restart: true,
            restore_available: None,
            config_live: None,
            refusal: None,
            observation: self.observe(&args.namespace.id, &args.agent.id, &paths),
        };
        // What is there, before any check that could refuse: a refused plan reports the
        // Agent as it is on the host, not a new Agent's defaults.
        self.existing_state(args, &paths, &mut plan);
        if let Err(f) = self.fill_plan(ctx, args, &paths, &mut plan) {
            plan.refusal = Some(f);
        }
        Ok(plan)
    }

    /// Marks what exists as kept (the unit file as replaced, since it was not compared yet)
    /// and reads the Agent's port from its marker, when readable. `fill_plan` refines it.
    fn existing_state(&self, args: &PlanArgs, paths: &AgentPaths, plan: &mut PlanResult) {
        let exists = |p: &std::path::Path| {
            !matches!(
                fsutil::kind(p),
                Ok(fsutil::Kind::Missing) | Err(fsutil::FsError::Io { .. })
            )
        };
        if exists(&self.layout.account_marker(&paths.account)) {
            plan.account = Change::Keep;
        }
        if exists(&paths.dir) {
            plan.agent_directory = Change::Keep;
            plan.port = crate::markers::read::<crate::markers::AgentMarker>(&paths.marker, "agent")
                .ok()
                .map(|m| m.port);
            if exists(&paths.revision_dir(&args.revision.id)) {
                plan.snapshot = Change::Keep;
            }
        }
        if exists(&paths.unit_file) {
            plan.unit_file = Change::Replace;
        }
        if needs_password(args.revision.configuration.value()) {
            plan.password_file = if exists(&paths.password_file) {
                Change::Keep
            } else {
                Change::Create
            };
        }
    }

    fn fill_plan(
        &self,
        ctx: &mut Ctx<'_>,
        args: &PlanArgs,
        paths: &AgentPaths,
        plan: &mut PlanResult,
    ) -> Result<(), Failure> {
        let ns = &args.namespace;
        let agent = &args.agent;
        let rev = &args.revision;
        // Prepare's checks, in prepare's order.
        self.check_egress(args.egress.as_ref())?;
        self.verify_namespace(ns)?;
        self.check_gateway_command()?;
        let existing_unit = self.verify_unit_file(&ns.id, &agent.id, paths)?;
        let marker_path = self.layout.account_marker(&paths.account);
        let ids = if fsutil::kind(&marker_path).map_err(fs_failure)? != fsutil::Kind::Missing {
            plan.account = Change::Keep;
            Some(self.verify_account(&ns.id, agent, paths)?)
        } else {
            self.refuse_foreign_account(paths)?;
            None
        };
        let agent_marker = if fsutil::dir_exists(&paths.dir).map_err(fs_failure)? {
            plan.agent_directory = Change::Keep;
            Some(self.verify_agent(&ns.id, agent, paths)?)
        } else {
            None
        };
        plan.port = agent_marker.as_ref().map(|m| m.port);
        let current = match agent_marker {
            Some(_) => self.read_current_repairable(ctx, &ns.id, &agent.id, paths)?,
            None => None,
        };
        let snapshot_dir = paths.revision_dir(&rev.id);
        if agent_marker.is_some() && fsutil::dir_exists(&snapshot_dir).map_err(fs_failure)? {
            let m = self.read_snapshot(&ns.id, &agent.id, &snapshot_dir)?;
            snapshot_matches(&m, &rev.reference())?;
            plan.snapshot = Change::Keep;
        }
        if newer_is_current(current.as_ref(), &rev.id, rev.number)?
            && let Some(cur) = &current
        {
            return Err(Failure::new(
                FailureCode::Superseded,
                format!(
                    "revision {} (number {}) is already current; this one would not be activated",
                    cur.revision_id, cur.number
                ),
            ));
        }
        if needs_password(rev.configuration.value()) {
            plan.password_file = if fsutil::file_exists(&paths.password_file).map_err(fs_failure)? {
                Change::Keep
            } else {
                Change::Create
            };
        }
        // Activate's decisions.
        let unit_changed = match (&agent_marker, &existing_unit) {
            (Some(m), Some(text)) => {
                // The Agent's network units too: new egress settings rewrite its net unit.
                let changed = *text != self.unit_text(&ns.id, &agent.id, paths, m.port)
                    || !self
                        .companions_to_write(
                            &ns.id,
                            &agent.id,
                            paths,
                            m.port,
                            args.egress.as_ref(),
                        )?
                        .is_empty();
                plan.unit_file = if changed {
                    Change::Replace
                } else {
                    Change::Keep
                };
                changed
            }
            _ => {
                plan.unit_file = if existing_unit.is_some() {
                    Change::Replace
                } else {
                    Change::Create
                };
                true
            }
        };
        plan.daemon_reload = unit_changed;
        let state = self.system.unit_state(&paths.unit_name).ok();
        plan.enable = unit_changed || !state.as_ref().is_some_and(|s| s.enabled);
        let is_current = current.as_ref().is_some_and(|c| c.revision_id == rev.id);
        plan.restart = true;
        if !unit_changed
            && is_current
            && let (Some(m), Some(ids), Some(state)) = (&agent_marker, ids, &state)
        {
            let served = self
                .read_served(paths)?
                .is_some_and(|s| s.revision_id == rev.id);
            let started = self
                .read_started(paths)?
                .is_some_and(|s| s.revision_id == rev.id);
            // As activate decides: it serves this revision and answers, or systemd already
            // runs it and activation only waits for readiness again.
            let serves =
                served && state.is_active() && self.ready_and_owned(paths, m.port, ids.uid)?;
            let runs = started && matches!(state.active_state.as_str(), "active" | "activating");
            plan.restart = !(serves || runs);
        }
        // As activate decides next: a configuration change the running gateway applies live.
        if plan.restart
            && !unit_changed
            && !is_current
            && let (Some(m), Some(ids)) = (&agent_marker, ids)
            && let Some(live) = self.live_plan(
                &super::live::Candidate {
                    namespace: &ns.id,
                    agent: &agent.id,
                    id: &rev.id,
                    harness: &rev.harness,
                    needs_password: needs_password(rev.configuration.value()),
                    configuration: Some(rev.configuration.value()),
                },
                paths,
                current.as_ref().map(|c| &c.revision_id),
                m.port,
                ids,
            )
        {
            plan.restart = false;
            plan.config_live = Some(live.changed);
        }
        if let Some(prev) = &args.restore
            && prev.number < rev.number
            && agent_marker.is_some()
            && self.verify_snapshot(&ns.id, &agent.id, paths, prev).is_ok()
        {
            plan.restore_available = Some(prev.id.clone());
        }
        Ok(())
    }
}
