//! The no-op fast path: under the Agent lock, before anything is written, an idempotent
//! prepare, an activate of the revision already served, a stop of an Agent that is not
//! running the revision and a retire of a revision the host does not hold (already retired,
//! or never prepared here) are recognised with reads alone (markers, snapshot hashes, the unit
//! file, one unit state) and answered as the slow path would answer them, without a durable
//! journal write ([`Ctx::commit`] is never called), fsync, rename or systemd change.
//!
//! Each check here is the read-only prefix of the slow path. Whenever a check finds anything
//! to do, or anything it cannot judge (an error other than a fence refusal), the fast path
//! declines (`None`) and the slow path runs from its start, after [`Ctx::commit`], exactly as
//! before: it repeats the checks and reports any error itself, so the fast path never has to
//! reproduce an error message. Verify-revision needs no fast path: it is read-only and not
//! journaled at all.
//!
//! A higher fence (the coordinator's worker raises it on every claim of the Agent, so the
//! first operation of each claim carries one) does not send a no-op down the slow path: once
//! every check found nothing to do, the fast path records the fence (durably, one atomic
//! write, before the answer) and answers. That is all the slow path would have changed. A
//! lower fence is still refused before anything else, and a refusal or error under a higher
//! fence declines, so the slow path answers it exactly as before. The operation still never
//! commits its journal entry: run again (its record lost in a crash), it finds the fence
//! recorded and answers the same.

use clawfleet_protocol::Ident;
use clawfleet_protocol::failure::Failure;
use clawfleet_protocol::operation::{ActivateArgs, PrepareArgs, RevisionArgs};
use clawfleet_protocol::result::{ActivateResult, PrepareResult, RetireResult, Step, StopResult};

use super::checks::snapshot_matches;
use super::revision::{StopPlan, needs_password, newer_is_current};
use super::{Ctx, Engine};
use crate::fsutil;
use crate::layout::AgentPaths;

/// What the fast path found.
pub(crate) enum Fast<T> {
    /// A no-op (or a refusal that writes nothing): this is the answer.
    Answer(Result<T, Failure>),
    /// Something to do or to judge: run the slow path.
    Decline,
}

/// `?` for the fast path: an error declines (the slow path reports it).
macro_rules! or_decline {
    ($e:expr) => {
        match $e {
            Ok(v) => v,
            Err(_) => return Fast::Decline,
        }
    };
}

/// Declines unless `cond` holds.
macro_rules! require {
    ($cond:expr) => {
        if !$cond {
            return Fast::Decline;
        }
    };
}

impl Engine<'_> {
    /// The fence part shared by every fast path: a refusal is the answer (it writes nothing);
    /// otherwise the fence to record once the operation turns out to be a no-op (`None`: the
    /// record stays as it is).
    fn fence_check<T>(
        &self,
        ctx: &Ctx<'_>,
        ns: &Ident,
        agent: &Ident,
        paths: &AgentPaths,
    ) -> Result<Option<u64>, Fast<T>> {
        self.fence_verdict(ctx, ns, agent, paths)
            .map_err(|f| Fast::Answer(Err(f)))
    }

    /// A fast path's answer: under a higher fence a no-op first records the fence (durably;
    /// a failed write declines, and the slow path reports it), and anything else declines.
    fn answer_fenced<T>(
        &self,
        ctx: &Ctx<'_>,
        ns: &Ident,
        agent: &Ident,
        paths: &AgentPaths,
        raise: Option<u64>,
        answer: Result<T, Failure>,
    ) -> Fast<T> {
        match (raise, answer) {
            (None, answer) => Fast::Answer(answer),
            (Some(_), Err(_)) => Fast::Decline,
            (Some(fence), Ok(value)) => match self.raise_fence(ctx, ns, agent, paths, fence) {
                Ok(()) => Fast::Answer(Ok(value)),
                Err(_) => Fast::Decline,
            },
        }
    }

    /// An idempotent prepare: account, directory, port, snapshot, workspace and password file
    /// all there and ours (what `provision` and `prepare_locked` would find and leave as is),
    /// or a candidate older than the revision already current (answered "not ready").
    pub(crate) fn prepare_noop(
        &self,
        ctx: &mut Ctx<'_>,
        args: &PrepareArgs,
        paths: &AgentPaths,
    ) -> Fast<PrepareResult> {
        let ns = &args.namespace;
        let agent = &args.agent;
        let rev = &args.revision;
        let raise = match self.fence_check(ctx, &ns.id, &agent.id, paths) {
            Ok(raise) => raise,
            Err(fast) => return fast,
        };
        or_decline!(ctx.step(Step::Verify));
        or_decline!(self.verify_namespace(ns));
        or_decline!(self.check_gateway_command());
        // provision: nothing to create and nothing left over from a killed run.
        or_decline!(self.verify_unit_file(&ns.id, &agent.id, paths));
        require!(or_decline!(self.account_intent(&ns.id, agent, paths)).is_none());
        require!(
            or_decline!(fsutil::kind(&self.layout.account_marker(&paths.account)))
                != fsutil::Kind::Missing
        );
        or_decline!(self.verify_account(&ns.id, agent, paths));
        require!(or_decline!(fsutil::dir_exists(&paths.dir)));
        or_decline!(self.verify_agent(&ns.id, agent, paths));
        // The snapshot, or an older candidate (which the slow path answers without writing).
        let current = or_decline!(self.read_current_repairable(ctx, &ns.id, &agent.id, paths));
        let snapshot_dir = paths.revision_dir(&rev.id);
        let exists = or_decline!(fsutil::dir_exists(&snapshot_dir));
        if exists {
            let m = or_decline!(self.read_snapshot(&ns.id, &agent.id, &snapshot_dir));
            or_decline!(snapshot_matches(&m, &rev.reference()));
            // New egress settings for the same revision are written by the slow path.
            require!(m.egress == args.egress);
        }
        if or_decline!(newer_is_current(current.as_ref(), &rev.id, rev.number)) {
            let answer = Ok(PrepareResult {
                ready: false,
                created: false,
                observation: self.observe(&ns.id, &agent.id, paths),
                workspace: None,
            });
            return self.answer_fenced(ctx, &ns.id, &agent.id, paths, raise, answer);
        }
        require!(exists);
        let workspace = match &args.workspace {
            None => None,
            Some(setup) => {
                require!(setup.check().is_ok());
                require!(or_decline!(fsutil::kind(&paths.workspace_applied)) == fsutil::Kind::File);
                Some(clawfleet_protocol::result::WorkspaceOutcome::AlreadyApplied)
            }
        };
        if needs_password(rev.configuration.value()) {
            require!(or_decline!(fsutil::file_exists(&paths.password_file)));
        }
        let answer = Ok(PrepareResult {
            ready: true,
            created: false,
            observation: self.observe(&ns.id, &agent.id, paths),
            workspace,
        });
        self.answer_fenced(ctx, &ns.id, &agent.id, paths, raise, answer)
    }

    /// An activate of the revision already served: `current` names it, the unit file is the
    /// one hostd would write and is enabled, `served.json` names the revision, the unit is
    /// active and `/readyz` answers on a listener the Agent owns.
    pub(crate) fn activate_noop(
        &self,
        ctx: &mut Ctx<'_>,
        args: &ActivateArgs,
        paths: &AgentPaths,
    ) -> Fast<ActivateResult> {
        let ns = &args.namespace;
        let agent = &args.agent;
        let rev = &args.revision;
        let raise = match self.fence_check(ctx, &ns.id, &agent.id, paths) {
            Ok(raise) => raise,
            Err(fast) => return fast,
        };
        or_decline!(ctx.step(Step::Verify));
        or_decline!(self.verify_namespace(ns));
        let ids = or_decline!(self.verify_account(&ns.id, agent, paths));
        let agent_marker = or_decline!(self.verify_agent(&ns.id, agent, paths));
        let snapshot = or_decline!(self.verify_snapshot(&ns.id, &agent.id, paths, rev));
        if let Some(prev) = &args.restore {
            require!(prev.number < rev.number);
            or_decline!(self.verify_snapshot(&ns.id, &agent.id, paths, prev));
        }
        let current = or_decline!(self.read_current_repairable(ctx, &ns.id, &agent.id, paths));
        require!(current.is_some_and(|c| c.revision_id == rev.id));
        if snapshot.needs_password {
            require!(or_decline!(fsutil::file_exists(&paths.password_file)));
        }
        let text = self.unit_text(&ns.id, &agent.id, paths, agent_marker.port);
        let existing = or_decline!(self.verify_unit_file(&ns.id, &agent.id, paths));
        require!(existing.as_deref() == Some(text.as_str()));
        // The Agent's network units (issue 28) are written with the gateway's.
        require!(
            or_decline!(self.companions_to_write(
                &ns.id,
                &agent.id,
                paths,
                agent_marker.port,
                snapshot.egress.as_ref()
            ))
            .is_empty()
        );
        let state = or_decline!(self.system.unit_state(&paths.unit_name));
        require!(state.enabled && state.is_active());
        require!(or_decline!(self.read_served(paths)).is_some_and(|s| s.revision_id == rev.id));
        require!(or_decline!(self.ready_and_owned(
            paths,
            agent_marker.port,
            ids.uid
        )));
        let answer = Ok(ActivateResult {
            restarted: false,
            unit_changed: false,
            observation: self.observe_with(&ns.id, &agent.id, paths, Some(state)),
            restored: None,
            secrets_reload: None,
            config_reload: None,
        });
        self.answer_fenced(ctx, &ns.id, &agent.id, paths, raise, answer)
    }

    /// A stop that stops nothing: the Agent or the revision is not on the host, or `current`
    /// does not name the revision. Errors of these checks are the slow path's errors too, and
    /// it writes nothing before them, so they are the answer as well.
    pub(crate) fn stop_noop(
        &self,
        ctx: &mut Ctx<'_>,
        args: &RevisionArgs,
        paths: &AgentPaths,
    ) -> Fast<StopResult> {
        self.stop_plan_noop(ctx, args, paths, |e, plan| match plan {
            StopPlan::Stop => None,
            StopPlan::Nothing { .. } => Some(StopResult {
                stopped: false,
                observation: e.observe(&args.namespace.id, &args.agent.id, paths),
            }),
        })
    }

    /// A retire that removes nothing: `current` does not name the revision and its snapshot
    /// is not on the host (retired before, or never prepared here). A retry of a retire, and
    /// the worker's retire of superseded revisions, then cost reads alone.
    pub(crate) fn retire_noop(
        &self,
        ctx: &mut Ctx<'_>,
        args: &RevisionArgs,
        paths: &AgentPaths,
    ) -> Fast<RetireResult> {
        self.stop_plan_noop(ctx, args, paths, |e, plan| match plan {
            StopPlan::Nothing { exists: false } => Some(RetireResult {
                stopped: false,
                removed: false,
                observation: e.observe(&args.namespace.id, &args.agent.id, paths),
            }),
            _ => None,
        })
    }

    /// The fence check and [`Engine::stop_plan`] shared by stop and retire: `answer` turns a
    /// plan with nothing to do into the result, or declines (`None`).
    fn stop_plan_noop<T>(
        &self,
        ctx: &mut Ctx<'_>,
        args: &RevisionArgs,
        paths: &AgentPaths,
        answer: impl FnOnce(&Self, StopPlan) -> Option<T>,
    ) -> Fast<T> {
        let (ns, agent) = (&args.namespace.id, &args.agent.id);
        let raise = match self.fence_check(ctx, ns, agent, paths) {
            Ok(raise) => raise,
            Err(fast) => return fast,
        };
        let answer = match self.stop_plan(ctx, args, paths) {
            Err(f) => Err(f),
            Ok(plan) => match answer(self, plan) {
                Some(result) => Ok(result),
                None => return Fast::Decline,
            },
        };
        self.answer_fenced(ctx, ns, agent, paths, raise, answer)
    }
}
