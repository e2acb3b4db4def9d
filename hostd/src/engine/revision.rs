//! Revision operations: prepare (stage only), activate (cutover and readiness), verify, stop
//! and retire. All run under the Agent's own lock; the host lock is taken only for inventory
//! changes and never across a wait on the gateway.

use std::time::{Duration, Instant};

use clawfleet_protocol::Ident;
use clawfleet_protocol::egress::Egress;
use clawfleet_protocol::failure::{Failure, FailureCode};
use clawfleet_protocol::operation::{
    ActivateArgs, PrepareArgs, RevisionArgs, RevisionNumber, RevisionRef,
};
use clawfleet_protocol::result::{
    ActivateResult, AgentObservation, PrepareResult, Restored, RetireResult, Step, StopResult,
    VerifyResult,
};
use serde_json::Value;

use super::checks::snapshot_matches;
use super::fastpath::Fast;
use super::hooks::{Event, Subject};
use super::{Ctx, Engine, fs_failure, system_failure};
use crate::fsutil;
use crate::layout::{AgentPaths, dir_name};
use crate::listener::{self, Ownership};
use crate::markers::{self, RevisionMarker, SCHEMA, ServedMarker, StartedMarker};
use crate::secrets as at_rest;
use crate::system::Ids;
use crate::unit;

/// A snapshot's marker, in its directory `dir`.
pub(crate) const REVISION_MARKER: &str = "revision.json";

/// Writes `marker` into the snapshot directory `dir` (root's only).
fn write_revision_marker(
    dir: &std::path::Path,
    marker: &RevisionMarker,
) -> Result<(), fsutil::FsError> {
    fsutil::write_atomic(
        &dir.join(REVISION_MARKER),
        &markers::to_bytes(marker),
        0o600,
        |_| Ok(()),
    )
}

/// The pause after the first readiness probe; each later pause doubles, up to
/// [`FAST_READINESS_PAUSE`] while the wait is younger than [`FAST_READINESS_WINDOW`], then up
/// to [`MAX_READINESS_PAUSE`].
const FIRST_READINESS_PAUSE: Duration = Duration::from_millis(2);
/// Most gateways listen within the first second or two of a restart: polling every 5 ms then
/// sees one within 5 ms of it listening (plain doubling saw a gateway that listened after
/// 70 ms only at the 126 ms probe), for one look at the port's sockets (about 60 µs) per 5 ms.
/// A revision-only cutover's readiness wait is about 25 ms in all, so the cap is most of what
/// hostd adds to it.
const FAST_READINESS_PAUSE: Duration = Duration::from_millis(5);
const FAST_READINESS_WINDOW: Duration = Duration::from_secs(2);
const MAX_READINESS_PAUSE: Duration = Duration::from_secs(1);

/// The pause after `pause` in a readiness wait that started `elapsed` ago.
fn next_readiness_pause(pause: Duration, elapsed: Duration) -> Duration {
    let cap = if elapsed < FAST_READINESS_WINDOW {
        FAST_READINESS_PAUSE
    } else {
        MAX_READINESS_PAUSE
    };
    (pause * 2).min(cap)
}

/// Restarts seen during one readiness wait that mean "crash loop", not "slow start".
const CRASH_LOOP_RESTARTS: u32 = 3;

/// How often a readiness wait asks systemd about the unit (failed, restarting). systemd is
/// busy starting the unit while the gateway comes up, and each question then waits for it;
/// the port's sockets and `/readyz` say when the gateway is up.
const STATE_EVERY: Duration = Duration::from_millis(25);

/// What one readiness wait cost: looks, and the time spent asking systemd, reading the port's
/// sockets and asking `/readyz` with the ownership check after it (µs), for hostd's "ready"
/// line.
#[derive(Debug, Default, Clone, Copy)]
struct Looks {
    polls: u32,
    state_us: u64,
    sockets_us: u64,
    probe_us: u64,
}

impl Looks {
    fn log(self, ctx: &Ctx<'_>) {
        tracing::info!(
            operation_id = %ctx.operation_id,
            polls = self.polls,
            state_us = self.state_us,
            sockets_us = self.sockets_us,
            probe_us = self.probe_us,
            "ready"
        );
    }
}

fn micros(since: Instant) -> u64 {
    u64::try_from(since.elapsed().as_micros()).unwrap_or(u64::MAX)
}

/// Whether the revision `current` points at is newer than revision `number`. Another revision
/// with the same number is a snapshot mismatch: numbers name exactly one revision.
pub(crate) fn newer_is_current(
    current: Option<&RevisionMarker>,
    id: &Ident,
    number: RevisionNumber,
) -> Result<bool, Failure> {
    let Some(cur) = current else {
        return Ok(false);
    };
    if cur.number == number && &cur.revision_id != id {
        return Err(Failure::new(
            FailureCode::SnapshotMismatch,
            format!(
                "revision number {number} is already taken by revision {}",
                cur.revision_id
            ),
        ));
    }
    Ok(cur.number > number)
}

/// Whether a rendered configuration asks for the managed gateway password.
pub(crate) fn needs_password(configuration: &Value) -> bool {
    let auth = &configuration["gateway"]["auth"];
    auth["mode"] == "password" || auth.get("password").is_some()
}

fn random_hex(bytes: usize) -> Result<String, Failure> {
    clawfleet_protocol::random::hex(bytes)
        .map_err(|e| Failure::new(FailureCode::IoFailed, e.to_string()))
}

impl Engine<'_> {
    /// What the host runs for this Agent now.
    pub(crate) fn observe(
        &self,
        ns: &Ident,
        agent: &Ident,
        paths: &AgentPaths,
    ) -> AgentObservation {
        self.observe_with(ns, agent, paths, None)
    }

    /// [`Engine::observe`] with the unit's state already read by the caller (one systemd
    /// read fewer), or `None` to read it.
    pub(crate) fn observe_with(
        &self,
        ns: &Ident,
        agent: &Ident,
        paths: &AgentPaths,
        state: Option<crate::system::UnitState>,
    ) -> AgentObservation {
        let current = self
            .read_current(ns, agent, paths)
            .ok()
            .flatten()
            .map(|m| m.revision_id);
        let port = markers::read::<markers::AgentMarker>(&paths.marker, "agent")
            .ok()
            .map(|m| m.port);
        let state = match state {
            Some(s) => Some(s),
            None => self.system.unit_state(&paths.unit_name).ok(),
        }
        .filter(|u| u.loaded);
        // Served: confirmed ready (served.json) for the revision `current` names, with the
        // unit up. A candidate that `current` names but that never became ready is not
        // served, and neither is the revision before it, which no longer runs.
        let unit_up = state
            .as_ref()
            .is_some_and(|u| matches!(u.active_state.as_str(), "active" | "reloading"));
        let served = self
            .read_served(paths)
            .ok()
            .flatten()
            .map(|m| m.revision_id)
            .filter(|s| unit_up && current.as_ref() == Some(s));
        let unit = state.map(|u| clawfleet_protocol::result::UnitObservation {
            name: paths.unit_name.clone(),
            active_state: u.active_state,
            sub_state: u.sub_state,
            n_restarts: u.n_restarts,
            enabled: u.enabled,
        });
        AgentObservation {
            current,
            served,
            port,
            unit,
        }
    }

    /// Stages a revision: account, directories, port, immutable snapshot, password file.
    /// Never touches the unit or `current`.
    pub(crate) fn prepare(
        &self,
        ctx: &mut Ctx<'_>,
        args: &PrepareArgs,
    ) -> Result<PrepareResult, Failure> {
        // The request's own limits first, before any lock or side effect: a refused workspace
        // set leaves no account, port, directory, snapshot or fence behind.
        if let Some(setup) = &args.workspace {
            setup.check().map_err(|m| {
                Failure::new(FailureCode::InvalidInput, format!("at `workspace`: {m}"))
            })?;
        }
        self.check_egress(args.egress.as_ref())?;
        let paths = self.layout.agent(&args.namespace.id, &args.agent.id);
        let agent_lock = self.agent_lock(ctx, &paths.lock)?;
        let result = match self.prepare_noop(ctx, args, &paths) {
            Fast::Answer(r) => r,
            Fast::Decline => ctx.commit().and_then(|()| {
                // Refused now if stale; recorded only once every check of the prepare passed
                // (`provision`), so a refused prepare leaves no record for an Agent that never
                // existed. The Agent lock is held throughout: nothing of the Agent changes in
                // between.
                let raise = self.fence_verdict(ctx, &args.namespace.id, &args.agent.id, &paths)?;
                self.prepare_locked(ctx, args, &paths, raise)
            }),
        };
        self.forget_lock_if_absent(&agent_lock, &paths);
        result
    }

    fn prepare_locked(
        &self,
        ctx: &mut Ctx<'_>,
        args: &PrepareArgs,
        paths: &AgentPaths,
        raise_fence: Option<u64>,
    ) -> Result<PrepareResult, Failure> {
        let ns = &args.namespace;
        let agent = &args.agent;
        let rev = &args.revision;
        ctx.step(Step::Verify)?;
        self.verify_namespace(ns)?;
        // Before the coordinator commits to this host: a gateway that cannot start would
        // only crash-loop at activation.
        self.check_gateway_command()?;
        let ids: Ids;
        {
            // Inventory changes only: account, port, directory.
            let _host = self.host_lock(ctx)?;
            ids = self.provision(ctx, &ns.id, agent, paths, raise_fence)?;
        }
        let current = self.read_current_repairable(ctx, &ns.id, &agent.id, paths)?;
        let reference = rev.reference();
        let snapshot_dir = paths.revision_dir(&rev.id);
        let existing = if fsutil::dir_exists(&snapshot_dir).map_err(fs_failure)? {
            let m = self.read_snapshot(&ns.id, &agent.id, &snapshot_dir)?;
            snapshot_matches(&m, &reference)?;
            Some(m)
        } else {
            None
        };
        if newer_is_current(current.as_ref(), &rev.id, rev.number)? {
            // An older candidate: report not ready and write nothing.
            return Ok(PrepareResult {
                ready: false,
                created: false,
                observation: self.observe(&ns.id, &agent.id, paths),
                workspace: None,
            });
        }
        let needs_pw = needs_password(rev.configuration.value());
        let mut created = false;
        if existing.is_none() {
            ctx.step(Step::Snapshot)?;
            self.sweep_pending(&paths.revisions);
            let marker = RevisionMarker {
                schema: SCHEMA,
                namespace_id: ns.id.clone(),
                agent_id: agent.id.clone(),
                revision_id: rev.id.clone(),
                number: rev.number,
                configuration_hash: rev.configuration_hash.clone(),
                harness: rev.harness.clone(),
                needs_password: needs_pw,
                egress: args.egress.clone(),
            };
            let root_group = Ids {
                uid: 0,
                gid: ids.gid,
            };
            let chown = |p: &std::path::Path| {
                self.system
                    .chown(p, root_group)
                    .map_err(|e| fsutil::FsError::Io {
                        path: p.display().to_string(),
                        source: std::io::Error::other(e.to_string()),
                    })
            };
            created = fsutil::create_dir_atomic(&snapshot_dir, 0o750, |tmp| {
                fsutil::write_atomic(
                    &tmp.join("openclaw.json"),
                    rev.configuration.canonical_bytes(),
                    0o640,
                    chown,
                )?;
                write_revision_marker(tmp, &marker)?;
                chown(tmp)
            })
            .map_err(fs_failure)?;
            // Read back what landed: the snapshot must verify before we report ready.
            let m = self.read_snapshot(&ns.id, &agent.id, &snapshot_dir)?;
            snapshot_matches(&m, &reference)?;
            if dir_name(&m.revision_id) != dir_name(&rev.id) {
                return Err(Failure::new(
                    FailureCode::SnapshotMismatch,
                    "snapshot landed under another name",
                ));
            }
        }
        if let Some(m) = existing.as_ref().filter(|m| m.egress != args.egress) {
            // The same revision, prepared again after the Agent's egress settings changed:
            // its marker takes the new ones (the snapshot's configuration stays as it is).
            ctx.step(Step::Snapshot)?;
            let marker = RevisionMarker {
                egress: args.egress.clone(),
                ..m.clone()
            };
            write_revision_marker(&snapshot_dir, &marker).map_err(fs_failure)?;
        }
        let workspace = match &args.workspace {
            Some(setup) => Some(self.setup_workspace(ctx, paths, ids, setup)?),
            None => None,
        };
        if needs_pw {
            ctx.step(Step::PasswordFile)?;
            let line = format!("OPENCLAW_GATEWAY_PASSWORD={}\n", random_hex(32)?);
            fsutil::create_once(&paths.password_file, line.as_bytes(), 0o600, |_| Ok(()))
                .map_err(fs_failure)?;
        }
        if created {
            tracing::info!(operation_id = %ctx.operation_id, agent = %agent.id, revision = %rev.id, "revision prepared");
        }
        Ok(PrepareResult {
            ready: true,
            created,
            observation: self.observe(&ns.id, &agent.id, paths),
            workspace,
        })
    }

    /// The unit text for an Agent.
    pub(crate) fn unit_text(
        &self,
        ns: &Ident,
        agent: &Ident,
        paths: &AgentPaths,
        port: u16,
    ) -> String {
        unit::render(
            ns,
            agent,
            paths,
            port,
            &self.config.gateway_command,
            &self.config.unit,
            self.config.limits.unit_stop_timeout.as_secs().max(1),
            self.agent_net(paths).as_ref(),
        )
    }

    /// The Agent's own network (issue 28), where this host can give it one; `None` runs the
    /// gateway in the host's network as before (its binds confined only by Landlock, where
    /// the kernel has it).
    pub(crate) fn agent_net(&self, paths: &AgentPaths) -> Option<unit::AgentNet> {
        self.agent_net_with(paths, None)
    }

    /// [`Self::agent_net`] for a revision prepared with the Agent's own `egress`: never
    /// wider than the pool's, even after an operator narrowed it since the prepare.
    pub(crate) fn agent_net_with(
        &self,
        paths: &AgentPaths,
        egress: Option<&Egress>,
    ) -> Option<unit::AgentNet> {
        let (egress_ports, egress_allow) = match egress {
            None => (
                self.config.egress_ports.clone(),
                self.config.egress_allow.clone(),
            ),
            Some(e) => e.clipped(&self.config.egress_ports, &self.config.egress_allow),
        };
        self.system.netns_support().ok().map(|()| unit::AgentNet {
            egress_ports,
            egress_allow,
            dns: self.config.dns.clone(),
            ..unit::AgentNet::for_unit(&paths.unit_name, self.config.front_hold_ms)
        })
    }

    /// Refuses the Agent's own egress settings when they ask for more than the pool allows,
    /// or when this host cannot confine an Agent's egress at all (no namespaces): a narrowing
    /// it cannot honour is not silently dropped.
    pub(crate) fn check_egress(&self, egress: Option<&Egress>) -> Result<(), Failure> {
        let Some(e) = egress else {
            return Ok(());
        };
        if let Err(why) = self.system.netns_support() {
            return Err(Failure::new(
                FailureCode::EgressNotAllowed,
                format!(
                    "the Agent has its own egress settings, but this host cannot confine an Agent's egress ({why})"
                ),
            ));
        }
        e.within(&self.config.egress_ports, &self.config.egress_allow)
            .map(|_| ())
            .map_err(|why| {
                Failure::new(
                    FailureCode::EgressNotAllowed,
                    format!("{why} (hostd.toml [network] egress_ports and egress_allow)"),
                )
            })
    }

    /// The egress settings of the revision `current` names (what its network units were
    /// rendered with); none when there is no readable one.
    pub(crate) fn current_egress(
        &self,
        ns: &Ident,
        agent: &Ident,
        paths: &AgentPaths,
    ) -> Option<Egress> {
        let target = std::fs::read_link(&paths.current).ok()?;
        let dir = paths.dir.join(target);
        self.read_snapshot(ns, agent, &dir).ok()?.egress
    }

    /// Whether the Agent's network unit on disk is from before systemd held its namespace
    /// (no `PrivateNetwork=yes`): its namespace is bound under `/run/netns`, and moving it
    /// takes a restart of the unit.
    fn net_unit_from_before(&self, paths: &AgentPaths) -> bool {
        let Some(net) = self.agent_net(paths) else {
            return false;
        };
        fsutil::read_small(&self.layout.unit_dir.join(&net.net_unit), 64 * 1024)
            .is_ok_and(|t| !String::from_utf8_lossy(&t).contains("\nPrivateNetwork=yes\n"))
    }

    /// A running Agent whose network unit was just rewritten (its egress changed) applies it
    /// again in place: systemd runs the unit's `ExecReload=` (`hostd netns-up`), which keeps
    /// the namespace and loads the new rules. Not running: its next start applies them. A
    /// unit `from_before` systemd held the namespace is restarted instead: its old namespace
    /// goes, systemd makes the new one, and restarts the front and gateway that require it.
    fn reapply_network(
        &self,
        ctx: &Ctx<'_>,
        paths: &AgentPaths,
        written: &[(std::path::PathBuf, String)],
        from_before: bool,
    ) -> Result<(), Failure> {
        let Some(net) = self.agent_net(paths) else {
            return Ok(());
        };
        if !written.iter().any(|(f, _)| f.ends_with(&net.net_unit)) {
            return Ok(());
        }
        let state = self
            .system
            .unit_state(&net.net_unit)
            .map_err(system_failure)?;
        if !state.is_active() {
            return Ok(());
        }
        if from_before {
            tracing::info!(operation_id = %ctx.operation_id, unit = %net.net_unit, "moving the Agent into a namespace systemd holds");
            return self
                .system
                .restart_unit(&net.net_unit, self.config.limits.unit_start_timeout)
                .map_err(system_failure);
        }
        tracing::info!(operation_id = %ctx.operation_id, unit = %net.net_unit, "applying the Agent's changed network settings");
        self.system
            .reload_unit(&net.net_unit, self.config.limits.unit_start_timeout)
            .map_err(system_failure)
    }

    /// The Agent's companion unit files (namespace, port socket, front) that differ from
    /// what hostd writes for it: (file, text). Empty without an own network.
    pub(crate) fn companions_to_write(
        &self,
        ns: &Ident,
        agent: &Ident,
        paths: &AgentPaths,
        port: u16,
        egress: Option<&Egress>,
    ) -> Result<Vec<(std::path::PathBuf, String)>, Failure> {
        let Some(net) = self.agent_net_with(paths, egress) else {
            return Ok(Vec::new());
        };
        let mut out = Vec::new();
        for (name, text) in net.render(ns, agent, port) {
            let file = self.layout.unit_dir.join(&name);
            let have = if fsutil::file_exists(&file).map_err(fs_failure)? {
                Some(fsutil::read_small(&file, 64 * 1024).map_err(fs_failure)?)
            } else {
                None
            };
            if have.as_deref() != Some(text.as_bytes()) {
                out.push((file, text));
            }
        }
        Ok(out)
    }

    /// Cuts over to a prepared revision and waits until the gateway is ready.
    pub(crate) fn activate(
        &self,
        ctx: &mut Ctx<'_>,
        args: &ActivateArgs,
    ) -> Result<ActivateResult, Failure> {
        let paths = self.layout.agent(&args.namespace.id, &args.agent.id);
        let agent_lock = self.agent_lock(ctx, &paths.lock)?;
        let result = match self.activate_noop(ctx, args, &paths) {
            Fast::Answer(r) => r,
            Fast::Decline => ctx.commit().and_then(|()| {
                self.check_fence(ctx, &args.namespace.id, &args.agent.id, &paths)?;
                self.activate_locked(ctx, args, &paths)
            }),
        };
        self.forget_lock_if_absent(&agent_lock, &paths);
        result
    }

    fn activate_locked(
        &self,
        ctx: &mut Ctx<'_>,
        args: &ActivateArgs,
        paths: &AgentPaths,
    ) -> Result<ActivateResult, Failure> {
        let ns = &args.namespace;
        let agent = &args.agent;
        let rev = &args.revision;
        ctx.step(Step::Verify)?;
        self.verify_namespace(ns)?;
        self.require_agent_present(&ns.id, &agent.id, paths)?;
        let ids = self.verify_account(&ns.id, agent, paths)?;
        let agent_marker = self.verify_agent(&ns.id, agent, paths)?;
        let snapshot = self.verify_snapshot(&ns.id, &agent.id, paths, rev)?;
        // The revision to put back must be there and intact before anything moves.
        if let Some(prev) = &args.restore {
            // Only back, and only over this candidate: never a roll forward, never the same.
            if prev.number >= rev.number {
                return Err(Failure::new(
                    FailureCode::InvalidInput,
                    format!(
                        "restore names revision {} (number {}), which is not older than the candidate {} (number {})",
                        prev.id, prev.number, rev.id, rev.number
                    ),
                ));
            }
            self.verify_snapshot(&ns.id, &agent.id, paths, prev)?;
        }
        let current = self.read_current_repairable(ctx, &ns.id, &agent.id, paths)?;
        if newer_is_current(current.as_ref(), &snapshot.revision_id, snapshot.number)?
            && let Some(cur) = &current
        {
            return Err(Failure::new(
                FailureCode::Superseded,
                format!(
                    "revision {} (number {}) is already current",
                    cur.revision_id, cur.number
                ),
            ));
        }
        if snapshot.needs_password
            && !fsutil::file_exists(&paths.password_file).map_err(fs_failure)?
        {
            return Err(Failure::new(
                FailureCode::RevisionNotPrepared,
                "the gateway password file is missing; prepare the revision again",
            ));
        }

        let text = self.unit_text(&ns.id, &agent.id, paths, agent_marker.port);
        let existing = self.verify_unit_file(&ns.id, &agent.id, paths)?;
        let companions = self.companions_to_write(
            &ns.id,
            &agent.id,
            paths,
            agent_marker.port,
            snapshot.egress.as_ref(),
        )?;
        // Changed on disk, or changed by an earlier operation that stopped before a reload.
        let differs = existing.as_deref() != Some(text.as_str()) || !companions.is_empty();
        let owed = self.reload_pending(&paths.unit_name)?;
        let unit_changed = differs || owed;
        // Read before the companions are written, and only when they will be.
        let net_from_before = !companions.is_empty() && self.net_unit_from_before(paths);
        if unit_changed {
            // A new unit file means a restart: refuse before writing it.
            self.check_gateway_command()?;
        }
        let state = self
            .system
            .unit_state(&paths.unit_name)
            .map_err(system_failure)?;
        if unit_changed || !state.enabled {
            // The unit file is the Agent's own (its lock is held): written before the host
            // lock, so that a reload another operation starts meanwhile reads it too.
            let ticket = if unit_changed {
                ctx.step(Step::UnitFile)?;
                self.mark_reload_pending(&paths.unit_name)?;
                // The companions first: the gateway's unit names them.
                for (file, companion) in &companions {
                    fsutil::write_atomic(file, companion.as_bytes(), unit::FILE_MODE, |_| Ok(()))
                        .map_err(fs_failure)?;
                }
                if differs {
                    fsutil::write_atomic(
                        &paths.unit_file,
                        text.as_bytes(),
                        unit::FILE_MODE,
                        |_| Ok(()),
                    )
                    .map_err(fs_failure)?;
                }
                // A unit file that did not exist before (and no removal of an older one waits
                // for its reload): systemd has no older version of it, and loads this one when
                // asked for it, where it can (systemd >= 246).
                if existing.is_none()
                    && companions.is_empty()
                    && !owed
                    && self
                        .system
                        .unit_file_loaded(&paths.unit_name, &paths.unit_file)
                        .map_err(system_failure)?
                {
                    self.clear_reload_pending(&paths.unit_name)?;
                    None
                } else {
                    Some(self.reload_ticket())
                }
            } else {
                None
            };
            let host = self.host_lock(ctx)?;
            if let Some(ticket) = ticket {
                self.daemon_reload(ctx, &host, ticket)?;
                self.clear_reload_pending(&paths.unit_name)?;
            }
            self.reapply_network(ctx, paths, &companions, net_from_before)?;
            ctx.step(Step::Enable)?;
            self.system
                .enable_unit(&paths.unit_name)
                .map_err(system_failure)?;
        }

        // A revision that differs from the served one only in its secrets: the running
        // gateway reloads them (see `rotate`).
        if !unit_changed
            && let Some(plan) = self.reload_plan(
                args,
                paths,
                current.as_ref().map(|c| &c.revision_id),
                &snapshot,
                agent_marker.port,
                ids,
            )?
        {
            return self.reload_secrets(ctx, args, paths, plan);
        }
        // A revision whose configuration changed only where the gateway applies changes
        // live: the running gateway reads it without a restart (see `live`); if it does not
        // confirm, the restart below happens after all.
        if !unit_changed
            && let Some(plan) = self.live_plan(
                &super::live::Candidate {
                    namespace: &ns.id,
                    agent: &agent.id,
                    id: &rev.id,
                    harness: &snapshot.harness,
                    needs_password: snapshot.needs_password,
                    configuration: None,
                },
                paths,
                current.as_ref().map(|c| &c.revision_id),
                agent_marker.port,
                ids,
            )
        {
            match self.apply_live(ctx, args, paths, &plan) {
                Ok(result) => return Ok(result),
                Err(why) => {
                    tracing::warn!(operation_id = %ctx.operation_id, agent = %agent.id, revision = %rev.id, changed = ?plan.changed, "the live configuration change was not confirmed ({why}); restarting the gateway on the revision instead");
                }
            }
        }
        let is_current = current.as_ref().is_some_and(|c| c.revision_id == rev.id);
        if !unit_changed && is_current {
            let state = self
                .system
                .unit_state(&paths.unit_name)
                .map_err(system_failure)?;
            let is_served = self
                .read_served(paths)?
                .is_some_and(|s| s.revision_id == rev.id);
            if is_served
                && state.is_active()
                && self.ready_and_owned(paths, agent_marker.port, ids.uid)?
            {
                return Ok(ActivateResult {
                    restarted: false,
                    unit_changed: false,
                    observation: self.observe(&ns.id, &agent.id, paths),
                    restored: None,
                    secrets_reload: None,
                    config_reload: None,
                });
            }
            // A retry: the unit was restarted on this revision and systemd still runs it (or
            // restarts it by Restart=). Wait for it again; restarting an unchanged gateway
            // would only start its warm-up over.
            let started = self
                .read_started(paths)?
                .is_some_and(|s| s.revision_id == rev.id);
            if started && matches!(state.active_state.as_str(), "active" | "activating") {
                tracing::info!(operation_id = %ctx.operation_id, agent = %agent.id, revision = %rev.id, "the unit already runs this revision; waiting for readiness again");
                if args.restore.is_some() {
                    ctx.detach();
                }
                ctx.step(Step::Readiness)?;
                let restored =
                    self.ready_or_restore(ctx, args, paths, agent_marker.port, ids.uid)?;
                return Ok(ActivateResult {
                    restarted: restored.is_some(),
                    unit_changed: false,
                    observation: self.observe(&ns.id, &agent.id, paths),
                    restored,
                    secrets_reload: None,
                    config_reload: None,
                });
            }
        }

        // A gateway that cannot start would only crash-loop into UNIT_FAILED. (A running one
        // is left alone above: its process does not need the file any more.)
        self.check_gateway_command()?;
        // The operator's start hooks, before anything of the cutover: a failing one leaves
        // the previous revision serving. Their launch values replace launch.env.
        ctx.step(Step::Hooks)?;
        let revision_args = args.revision_args();
        let subject = hook_subject(&revision_args, rev);
        let hooks_ran = match self.start_hooks(ctx, &subject)? {
            Some(env) => {
                fsutil::write_atomic(
                    &paths.launch_env,
                    super::hooks::render_env_file(&env).as_bytes(),
                    0o600,
                    |_| Ok(()),
                )
                .map_err(fs_failure)?;
                true
            }
            None => {
                fsutil::remove_file_if_present(&paths.launch_env).map_err(fs_failure)?;
                false
            }
        };
        // An unchanged unit runs the launcher that stays: its gateway can be relaunched in
        // place (`stop_for_relaunch`).
        let in_place = (!unit_changed).then_some(ids);
        let outcome =
            self.cut_over_and_wait(ctx, args, paths, agent_marker.port, ids.uid, in_place);
        // Compensation: the start hooks ran and the candidate does not serve (and nothing
        // was restored in its place), so the stop hooks undo what they set up, once.
        if hooks_ran
            && outcome.is_err()
            && let Err(f) = self.run_hooks_reverse(ctx, Event::BeforeWorkloadStop, &subject)
        {
            tracing::warn!(operation_id = %ctx.operation_id, agent = %agent.id, "compensating before-workload-stop: {f}");
        }
        let restored = outcome?;
        Ok(ActivateResult {
            restarted: true,
            unit_changed,
            observation: self.observe(&ns.id, &agent.id, paths),
            restored,
            secrets_reload: None,
            config_reload: None,
        })
    }

    /// The cutover and the readiness wait (with the restore, when asked for).
    fn cut_over_and_wait(
        &self,
        ctx: &mut Ctx<'_>,
        args: &ActivateArgs,
        paths: &AgentPaths,
        port: u16,
        uid: u32,
        in_place: Option<Ids>,
    ) -> Result<Option<Restored>, Failure> {
        let rev = &args.revision;
        ctx.step(Step::PointerFlip)?;
        // With a revision to restore, the host finishes what it starts here by itself: the
        // candidate becomes ready or the last served revision serves again, whether or not the
        // coordinator is still there (it learns the outcome with operation-status).
        if args.restore.is_some() {
            ctx.detach();
        }
        match self.cut_over(ctx, paths, rev, in_place) {
            Ok(()) => {
                ctx.step(Step::Readiness)?;
                self.ready_or_restore(ctx, args, paths, port, uid)
            }
            // A cutover that failed half way (a restart job that timed out, a bus error)
            // with a restore to go back to: go back.
            Err(f) if args.restore.is_some() => {
                Ok(Some(self.restore(ctx, args, paths, port, uid, f)?))
            }
            Err(f) => Err(f),
        }
    }

    /// Points `current` at `rev` and restarts the unit, or, with `in_place` (the Agent's ids)
    /// where nothing a start reads changed, relaunches its gateway within the running unit:
    /// from the first write until readiness nothing is served, whatever happens to this
    /// process.
    fn cut_over(
        &self,
        ctx: &mut Ctx<'_>,
        paths: &AgentPaths,
        rev: &RevisionRef,
        in_place: Option<Ids>,
    ) -> Result<(), Failure> {
        self.sweep_pending(&paths.dir);
        // Durably forget what served before, then move `current`.
        fsutil::remove_file_if_present(&paths.served).map_err(fs_failure)?;
        fsutil::remove_file_if_present(&paths.started).map_err(fs_failure)?;
        fsutil::sync_dir(&paths.dir).map_err(fs_failure)?;
        fsutil::replace_symlink(&paths.current, &AgentPaths::current_target(&rev.id))
            .map_err(fs_failure)?;
        ctx.step(Step::Restart)?;
        match in_place.and_then(|ids| self.stop_for_relaunch(ctx, paths, rev, ids)) {
            Some(launcher) => {
                // The old gateway is gone: only the new one sees this configuration, so no
                // gateway takes its change for a restart of its own (crate::supervise).
                let written = self.write_live_config(paths, &rev.id);
                if let Err(e) = self.system.start_relaunched(&paths.unit_name, launcher) {
                    tracing::warn!(operation_id = %ctx.operation_id, revision = %rev.id, "the launcher was not asked to start the gateway ({e}); restarting the unit");
                    self.system
                        .restart_unit(&paths.unit_name, self.config.limits.unit_start_timeout)
                        .map_err(system_failure)?;
                }
                written?;
            }
            None => {
                // Replaced just before the restart: a gateway that watches the file and
                // restarts itself on it, or the stop's SIGTERM, comes first; either way the
                // next gateway reads it.
                self.write_live_config(paths, &rev.id)?;
                self.system
                    .restart_unit(&paths.unit_name, self.config.limits.unit_start_timeout)
                    .map_err(system_failure)?;
            }
        }
        self.record_started(ctx, paths, rev)
    }

    /// The first half of a relaunch of the gateway inside its running unit
    /// (`System::stop_for_relaunch`), keeping the sandbox systemd built at the unit's start:
    /// no stop and start jobs, no `ExecStartPre=` (issue 34's cutover overhead). Only where a
    /// restart would give the gateway nothing else: the unit runs, its environment files hold
    /// what its start read (`crate::start_env`), and its runtime directory is there to take
    /// the secrets, written here as the unit's `ExecStartPre=` would. The launcher's pid once
    /// the old gateway is gone; `None`, with the reason logged, when the unit is to be
    /// restarted instead (also when the stop itself failed).
    fn stop_for_relaunch(
        &self,
        ctx: &Ctx<'_>,
        paths: &AgentPaths,
        rev: &RevisionRef,
        ids: Ids,
    ) -> Option<u32> {
        let attempt = || -> Result<u32, String> {
            let state = self
                .system
                .unit_state(&paths.unit_name)
                .map_err(|e| e.to_string())?;
            if (state.active_state.as_str(), state.sub_state.as_str()) != ("active", "running") {
                return Err(format!(
                    "the unit is {}/{}",
                    state.active_state, state.sub_state
                ));
            }
            if !crate::start_env::unchanged(&paths.dir).map_err(|e| e.to_string())? {
                return Err("its environment files are not what its start read".to_owned());
            }
            let runtime = at_rest::runtime_dir(&self.layout.run_dir, &paths.unit_name);
            if fsutil::kind(&runtime).map_err(|e| e.to_string())? != fsutil::Kind::Dir {
                return Err("its runtime directory is missing".to_owned());
            }
            at_rest::materialise_for(&paths.dir, &runtime, ids).map_err(|e| e.to_string())?;
            tracing::info!(operation_id = %ctx.operation_id, revision = %rev.id, "relaunching the gateway in place");
            self.system
                .stop_for_relaunch(&paths.unit_name, self.config.limits.unit_start_timeout)
                .map_err(|e| e.to_string())
        };
        match attempt() {
            Ok(launcher) => Some(launcher),
            Err(why) => {
                tracing::info!(operation_id = %ctx.operation_id, revision = %rev.id, "restarting the unit, not relaunching in place: {why}");
                None
            }
        }
    }

    /// A verified snapshot's configuration, parsed (`Null` when it does not parse, which no
    /// live change matches).
    pub(crate) fn snapshot_configuration(
        &self,
        paths: &AgentPaths,
        revision: &Ident,
    ) -> Result<Value, Failure> {
        let bytes = fsutil::read_small(
            &paths.revision_dir(revision).join("openclaw.json"),
            super::checks::MAX_SNAPSHOT,
        )
        .map_err(fs_failure)?;
        Ok(serde_json::from_slice(&bytes).unwrap_or(Value::Null))
    }

    /// Replaces the gateway's configuration file (`config/openclaw.json`, see
    /// [`AgentPaths::live_config`]) with `revision`'s snapshot: written, synced and renamed over
    /// the old one, root-owned and readable by the Agent's group like the snapshot.
    pub(crate) fn write_live_config(
        &self,
        paths: &AgentPaths,
        revision: &Ident,
    ) -> Result<(), Failure> {
        use std::os::unix::fs::MetadataExt;
        let snapshot = paths.revision_dir(revision).join("openclaw.json");
        let bytes =
            fsutil::read_small(&snapshot, super::checks::MAX_SNAPSHOT).map_err(fs_failure)?;
        let gid = std::fs::metadata(&snapshot)
            .map_err(|e| fs_failure(fsutil::io_err(&snapshot)(e)))?
            .gid();
        let group = Ids { uid: 0, gid };
        let chown = |p: &std::path::Path| {
            self.system
                .chown(p, group)
                .map_err(|e| fsutil::FsError::Io {
                    path: p.display().to_string(),
                    source: std::io::Error::other(e.to_string()),
                })
        };
        let dir = paths.dir.join("config");
        fsutil::ensure_dir(&dir, 0o750).map_err(fs_failure)?;
        chown(&dir).map_err(fs_failure)?;
        fsutil::write_atomic(&paths.live_config, &bytes, 0o640, chown).map_err(fs_failure)
    }

    /// `started.json`: the running unit's process serves `rev` from now on (after a restart,
    /// or a secrets reload of a revision with the same configuration).
    pub(super) fn record_started(
        &self,
        ctx: &Ctx<'_>,
        paths: &AgentPaths,
        rev: &RevisionRef,
    ) -> Result<(), Failure> {
        let started = StartedMarker {
            schema: SCHEMA,
            revision_id: rev.id.clone(),
            started_at: ctx.now_unix,
            operation_id: ctx.operation_id.clone(),
        };
        fsutil::write_atomic(&paths.started, &markers::to_bytes(&started), 0o600, |_| {
            Ok(())
        })
        .map_err(fs_failure)
    }

    /// Waits for the candidate; when it does not become ready and a restore was asked for,
    /// puts the last served revision back, restarts and waits for it. `Some` names what was
    /// restored; a failed restore reports both failures.
    fn ready_or_restore(
        &self,
        ctx: &mut Ctx<'_>,
        args: &ActivateArgs,
        paths: &AgentPaths,
        port: u16,
        uid: u32,
    ) -> Result<Option<Restored>, Failure> {
        let candidate = match self.wait_ready(ctx, paths, port, uid) {
            Ok(looks) => {
                looks.log(ctx);
                self.record_served(ctx, paths, &args.revision)?;
                return Ok(None);
            }
            Err(f) => f,
        };
        if args.restore.is_none() || !restorable(&candidate) {
            return Err(candidate);
        }
        self.restore(ctx, args, paths, port, uid, candidate)
            .map(Some)
    }

    /// Puts the restore revision back after `candidate` failed: verify, cut over, wait,
    /// record served. A failed restore reports both failures.
    fn restore(
        &self,
        ctx: &mut Ctx<'_>,
        args: &ActivateArgs,
        paths: &AgentPaths,
        port: u16,
        uid: u32,
        candidate: Failure,
    ) -> Result<Restored, Failure> {
        let Some(prev) = args.restore.as_ref() else {
            return Err(candidate);
        };
        tracing::warn!(
            operation_id = %ctx.operation_id,
            agent = %args.agent.id,
            candidate = %args.revision.id,
            restore = %prev.id,
            code = %candidate.code,
            "the candidate did not become ready; restoring the last served revision"
        );
        let restore = (|| {
            self.verify_snapshot(&args.namespace.id, &args.agent.id, paths, prev)?;
            ctx.step(Step::PointerFlip)?;
            // A restart, never in place: the candidate may have left anything behind.
            self.cut_over(ctx, paths, prev, None)?;
            ctx.step(Step::Readiness)?;
            self.wait_ready(ctx, paths, port, uid)?.log(ctx);
            self.record_served(ctx, paths, prev)
        })();
        match restore {
            Ok(()) => Ok(Restored {
                revision: prev.id.clone(),
                candidate_failure: candidate,
            }),
            Err(f) => Err(Restored::failed_too(&candidate, &prev.id, &f)),
        }
    }

    /// Writes `served.json` once the gateway answered `/readyz`.
    pub(super) fn record_served(
        &self,
        ctx: &mut Ctx<'_>,
        paths: &AgentPaths,
        rev: &RevisionRef,
    ) -> Result<(), Failure> {
        ctx.step(Step::ServedRecord)?;
        let marker = ServedMarker {
            schema: SCHEMA,
            revision_id: rev.id.clone(),
            served_at: ctx.now_unix,
            operation_id: ctx.operation_id.clone(),
        };
        fsutil::write_atomic(
            &paths.served,
            &markers::to_bytes(&marker),
            0o600,
            |_| Ok(()),
        )
        .map_err(fs_failure)?;
        tracing::info!(operation_id = %ctx.operation_id, revision = %rev.id, "revision serving");
        Ok(())
    }

    /// Fails with `LISTENER_NOT_OWNED` when a socket of another uid than the Agent's account
    /// listens on its port; true when nobody else does and at least the Agent's own listener
    /// is there. With an own network (issue 28) the gateway listens inside the Agent's
    /// namespace, and on the host only PID 1 (root: the Agent's socket unit) may hold the
    /// port.
    fn listener_owned(&self, paths: &AgentPaths, port: u16, uid: u32) -> Result<bool, Failure> {
        if self.agent_net(paths).is_none() {
            let listeners = self.system.listeners(port, None).map_err(system_failure)?;
            let owner = format!("the Agent's account {}", paths.account);
            return owned_or_foreign(&listeners, port, uid, &owner, "");
        }
        let host = self.system.listeners(port, None).map_err(system_failure)?;
        if !owned_or_foreign(
            &host,
            port,
            0,
            "root (the Agent's socket unit)",
            " on the host",
        )? {
            return Ok(false);
        }
        let inside = self
            .system
            .listeners(port, Some(&paths.unit_name))
            .map_err(system_failure)?;
        owned_or_foreign(
            &inside,
            port,
            uid,
            &format!("the Agent's account {}", paths.account),
            " in the Agent's network namespace",
        )
    }

    /// `/readyz` answered 200 and the listener on the port is the Agent's own.
    pub(crate) fn ready_and_owned(
        &self,
        paths: &AgentPaths,
        port: u16,
        uid: u32,
    ) -> Result<bool, Failure> {
        Ok(self.listener_owned(paths, port, uid)? && self.answered_and_owned(paths, port, uid)?)
    }

    /// `/readyz` answered 200, and the listener on the port is still the Agent's own after the
    /// answer: the socket that answered was the Agent's.
    fn answered_and_owned(&self, paths: &AgentPaths, port: u16, uid: u32) -> Result<bool, Failure> {
        if !self.system.probe_ready(port, Duration::from_secs(1)) {
            return Ok(false);
        }
        self.listener_owned(paths, port, uid)
    }

    /// Polls `/readyz`: the first look at once, then pauses of 2 ms doubling to 10 ms for the
    /// first 2 s and to 1 s after, up to the readiness limit. Each look reads the port's
    /// sockets (cheap) and, once the Agent's account listens, asks `/readyz`; systemd's view
    /// of the unit is read at the first look and then at most every [`STATE_EVERY`], since
    /// systemd answers slowly while it is starting the unit. A unit that systemd gave up on, or
    /// that keeps restarting, fails at once. Ready: what the wait cost.
    fn wait_ready(
        &self,
        ctx: &Ctx<'_>,
        paths: &AgentPaths,
        port: u16,
        uid: u32,
    ) -> Result<Looks, Failure> {
        let limit = self.config.limits.readiness_timeout;
        let start = Instant::now();
        // The Agent's port on the host: normally held since its first activation (and pulled
        // in by the gateway's unit), started here again after a squatter kept it from binding.
        if let Some(net) = self.agent_net(paths)
            && let Err(e) = self
                .system
                .start_unit(&net.socket_unit, self.config.limits.unit_start_timeout)
        {
            // Who holds the port instead is what the listener check below reports.
            tracing::warn!(operation_id = %ctx.operation_id, "the Agent's port socket did not start: {e}");
        }
        let mut pause = FIRST_READINESS_PAUSE;
        let mut first_restarts: Option<u32> = None;
        let mut looks = Looks::default();
        let mut read_unit = |looks: &mut Looks| {
            let t = Instant::now();
            let unit = self
                .system
                .unit_state(&paths.unit_name)
                .map_err(system_failure)?;
            looks.state_us += micros(t);
            self.check_unit(ctx, paths, &unit, &mut first_restarts)?;
            Ok::<_, Failure>((Instant::now(), unit))
        };
        let (mut checked, mut unit) = read_unit(&mut looks)?;
        loop {
            looks.polls = looks.polls.saturating_add(1);
            if checked.elapsed() >= STATE_EVERY {
                (checked, unit) = read_unit(&mut looks)?;
            }
            // A squatter on the port fails the activation whatever the unit's state: our
            // gateway cannot bind while it is there.
            let t = Instant::now();
            let owned = self.listener_owned(paths, port, uid)?;
            looks.sockets_us += micros(t);
            if unit.is_active() && owned {
                let t = Instant::now();
                let ready = self.answered_and_owned(paths, port, uid)?;
                looks.probe_us += micros(t);
                if ready {
                    return Ok(looks);
                }
            }
            if start.elapsed() >= limit {
                return Err(Failure::new(
                    FailureCode::ReadinessTimeout,
                    format!(
                        "the gateway did not answer /readyz with 200 within {} ms (unit {} {}, {} restarts)",
                        limit.as_millis(),
                        unit.active_state,
                        unit.sub_state,
                        unit.n_restarts
                    ),
                ));
            }
            if ctx.should_stop() {
                // Leaving the wait keeps the host consistent: nothing is recorded as served,
                // and a later activate waits again (or repairs an interrupted cutover).
                if (ctx.cancelled)() {
                    return Err(crate::journal::aborted_failure(ctx.last_step()));
                }
                return Err(Failure::new(
                    FailureCode::DeadlineExceeded,
                    "the operation deadline passed while waiting for readiness",
                ));
            }
            std::thread::sleep(
                pause
                    .min(limit.saturating_sub(start.elapsed()))
                    .max(Duration::from_millis(1)),
            );
            pause = next_readiness_pause(pause, start.elapsed());
        }
    }

    /// Fails a wait whose unit systemd gave up on, or that restarted
    /// [`CRASH_LOOP_RESTARTS`] times since the wait began.
    fn check_unit(
        &self,
        ctx: &Ctx<'_>,
        paths: &AgentPaths,
        state: &crate::system::UnitState,
        first_restarts: &mut Option<u32>,
    ) -> Result<(), Failure> {
        let base = *first_restarts.get_or_insert(state.n_restarts);
        if state.n_restarts.saturating_sub(base) >= CRASH_LOOP_RESTARTS {
            // `state` may already describe the next run (status 0): ask for the exit.
            let status = self
                .last_exit_status(ctx, paths)
                .map_or_else(|| "unknown".to_owned(), |s| s.to_string());
            return Err(Failure::new(
                FailureCode::UnitFailed,
                format!(
                    "the gateway keeps exiting (last exit status {status}, {} restarts while waiting for readiness)",
                    state.n_restarts - base
                ),
            ));
        }
        if state.is_failed() {
            let why = if state.exec_main_status == 78 {
                "the gateway exited with status 78 (configuration error)".to_owned()
            } else {
                format!(
                    "the gateway unit failed (exit status {})",
                    state.exec_main_status
                )
            };
            return Err(Failure::new(FailureCode::UnitFailed, why));
        }
        Ok(())
    }

    /// Checks a revision without side effects.
    pub(crate) fn verify(
        &self,
        ctx: &mut Ctx<'_>,
        args: &RevisionArgs,
    ) -> Result<VerifyResult, Failure> {
        let ns = &args.namespace;
        let paths = self.layout.agent(&ns.id, &args.agent.id);
        ctx.step(Step::Verify)?;
        self.verify_namespace(ns)?;
        self.require_agent_present(&ns.id, &args.agent.id, &paths)?;
        self.verify_account(&ns.id, &args.agent, &paths)?;
        self.verify_agent(&ns.id, &args.agent, &paths)?;
        self.read_current(&ns.id, &args.agent.id, &paths)?;
        self.verify_snapshot(&ns.id, &args.agent.id, &paths, &args.revision)?;
        Ok(VerifyResult {
            observation: self.observe(&ns.id, &args.agent.id, &paths),
        })
    }

    /// The read-only part of [`Engine::stop_if_current`]: whether `current` names this
    /// revision (so the unit must stop), and if not whether the snapshot exists. Writes
    /// nothing, so the no-op fast path answers with it directly.
    pub(crate) fn stop_plan(
        &self,
        ctx: &mut Ctx<'_>,
        args: &RevisionArgs,
        paths: &AgentPaths,
    ) -> Result<StopPlan, Failure> {
        let ns = &args.namespace;
        ctx.step(Step::Verify)?;
        if !fsutil::dir_exists(&paths.dir).map_err(fs_failure)? {
            return Ok(StopPlan::Nothing { exists: false });
        }
        self.verify_namespace(ns)?;
        self.verify_agent(&ns.id, &args.agent, paths)?;
        self.verify_account(&ns.id, &args.agent, paths)?;
        let current = self.read_current(&ns.id, &args.agent.id, paths)?;
        if !fsutil::dir_exists(&paths.revision_dir(&args.revision.id)).map_err(fs_failure)? {
            return Ok(StopPlan::Nothing { exists: false });
        }
        self.verify_snapshot(&ns.id, &args.agent.id, paths, &args.revision)?;
        if current.is_none_or(|c| c.revision_id != args.revision.id) {
            return Ok(StopPlan::Nothing { exists: true });
        }
        Ok(StopPlan::Stop)
    }

    /// Stops the gateway if `current` names this revision. Keeps snapshots, state, the
    /// password file, the account and the port. Returns whether it stopped the unit, and
    /// whether the snapshot exists.
    fn stop_if_current(
        &self,
        ctx: &mut Ctx<'_>,
        args: &RevisionArgs,
        paths: &AgentPaths,
    ) -> Result<(bool, bool), Failure> {
        if let StopPlan::Nothing { exists } = self.stop_plan(ctx, args, paths)? {
            return Ok((false, exists));
        }
        if fsutil::file_exists(&paths.unit_file).map_err(fs_failure)? {
            ctx.step(Step::Hooks)?;
            // A failing stop hook never keeps a gateway running: it is logged, the stop goes on.
            if let Err(f) = self.run_hooks_reverse(
                ctx,
                Event::BeforeWorkloadStop,
                &hook_subject(args, &args.revision),
            ) {
                tracing::warn!(operation_id = %ctx.operation_id, agent = %args.agent.id, "before-workload-stop: {f}");
            }
            ctx.step(Step::Stop)?;
            self.system
                .stop_unit(&paths.unit_name, self.config.limits.unit_stop_timeout)
                .map_err(system_failure)?;
            let _host = self.host_lock(ctx)?;
            ctx.step(Step::Disable)?;
            self.system
                .disable_unit(&paths.unit_name)
                .map_err(system_failure)?;
        }
        ctx.step(Step::PointerFlip)?;
        fsutil::remove_file_if_present(&paths.current).map_err(fs_failure)?;
        fsutil::remove_file_if_present(&paths.served).map_err(fs_failure)?;
        fsutil::remove_file_if_present(&paths.started).map_err(fs_failure)?;
        fsutil::sync_dir(&paths.dir).map_err(fs_failure)?;
        tracing::info!(operation_id = %ctx.operation_id, agent = %args.agent.id, revision = %args.revision.id, "revision stopped");
        Ok((true, true))
    }

    /// `stop-revision`: repeatable.
    pub(crate) fn stop(
        &self,
        ctx: &mut Ctx<'_>,
        args: &RevisionArgs,
    ) -> Result<StopResult, Failure> {
        let paths = self.layout.agent(&args.namespace.id, &args.agent.id);
        let agent_lock = self.agent_lock(ctx, &paths.lock)?;
        let stopped = match self.stop_noop(ctx, args, &paths) {
            Fast::Answer(r) => {
                self.forget_lock_if_absent(&agent_lock, &paths);
                return r;
            }
            Fast::Decline => ctx.commit().and_then(|()| {
                self.check_fence(ctx, &args.namespace.id, &args.agent.id, &paths)?;
                self.stop_if_current(ctx, args, &paths)
            }),
        };
        self.forget_lock_if_absent(&agent_lock, &paths);
        let (stopped, _) = stopped?;
        Ok(StopResult {
            stopped,
            observation: self.observe(&args.namespace.id, &args.agent.id, &paths),
        })
    }

    /// `retire-revision`: stop if current, then remove the snapshot.
    pub(crate) fn retire(
        &self,
        ctx: &mut Ctx<'_>,
        args: &RevisionArgs,
    ) -> Result<RetireResult, Failure> {
        let paths = self.layout.agent(&args.namespace.id, &args.agent.id);
        let agent_lock = self.agent_lock(ctx, &paths.lock)?;
        let outcome = match self.retire_noop(ctx, args, &paths) {
            Fast::Answer(r) => {
                self.forget_lock_if_absent(&agent_lock, &paths);
                return r;
            }
            Fast::Decline => ctx.commit().and_then(|()| {
                self.check_fence(ctx, &args.namespace.id, &args.agent.id, &paths)?;
                self.stop_if_current(ctx, args, &paths)
            }),
        };
        self.forget_lock_if_absent(&agent_lock, &paths);
        let (stopped, exists) = outcome?;
        if exists {
            ctx.step(Step::Remove)?;
            self.remove_tree(&paths.revision_dir(&args.revision.id))?;
            tracing::info!(operation_id = %ctx.operation_id, agent = %args.agent.id, revision = %args.revision.id, "revision retired");
        }
        Ok(RetireResult {
            stopped,
            removed: exists,
            observation: self.observe(&args.namespace.id, &args.agent.id, &paths),
        })
    }
}

/// What a stop has to do, found by reads alone ([`Engine::stop_plan`]).
pub(crate) enum StopPlan {
    /// `current` does not name the revision: nothing stops. `exists`: its snapshot is there.
    Nothing { exists: bool },
    /// `current` names the revision: stop the unit and remove `current`.
    Stop,
}

/// What the hooks of one revision act on.
/// Whether every listener on `port` belongs to `uid` (false: none listens), or
/// `LISTENER_NOT_OWNED` naming the first that does not.
fn owned_or_foreign(
    listeners: &[listener::Listener],
    port: u16,
    uid: u32,
    owner: &str,
    place: &str,
) -> Result<bool, Failure> {
    match listener::ownership(listeners, uid) {
        Ownership::Owned => Ok(true),
        Ownership::NoListener => Ok(false),
        Ownership::Foreign(l) => Err(Failure::new(
            FailureCode::ListenerNotOwned,
            format!(
                "the socket listening on port {port}{place} (inode {}) belongs to uid {}, not to {owner} (uid {uid}); nothing was recorded as served",
                l.inode, l.uid
            ),
        )),
    }
}

fn hook_subject<'a>(args: &'a RevisionArgs, rev: &'a RevisionRef) -> Subject<'a> {
    Subject {
        namespace_id: args.namespace.id.as_str(),
        namespace_name: args.namespace.name.as_str(),
        agent_id: Some(args.agent.id.as_str()),
        service_principal_id: Some(args.agent.service_principal_id.as_str()),
        revision_id: Some(rev.id.as_str()),
        revision_number: Some(rev.number.get()),
    }
}

/// Whether a candidate's failure is one a restore answers: it did not become ready.
fn restorable(f: &Failure) -> bool {
    matches!(
        f.code,
        FailureCode::ReadinessTimeout | FailureCode::UnitFailed | FailureCode::ListenerNotOwned
    )
}

#[cfg(test)]
mod readiness_tests {
    use std::time::Duration;

    use super::{FIRST_READINESS_PAUSE, MAX_READINESS_PAUSE, next_readiness_pause};

    /// The probes of the first 2 s come at most 5 ms apart; later ones back off to 1 s.
    #[test]
    fn readiness_polls_fast_at_first_then_backs_off() {
        let mut pause = FIRST_READINESS_PAUSE;
        let mut elapsed = Duration::ZERO;
        let mut early = Vec::new();
        while elapsed < Duration::from_secs(2) {
            early.push(pause);
            elapsed += pause;
            pause = next_readiness_pause(pause, elapsed);
        }
        assert_eq!(&early[..4], &[2, 4, 5, 5].map(Duration::from_millis));
        assert!(
            early.iter().all(|p| *p <= Duration::from_millis(5)),
            "{early:?}"
        );
        for _ in 0..10 {
            pause = next_readiness_pause(pause, Duration::from_secs(3));
        }
        assert_eq!(pause, MAX_READINESS_PAUSE);
    }
}
