//! Read-only runtime inspection: `agent-runtime` (the unit's state, its current or last run,
//! cgroup figures, the main process's uid) and `agent-logs` (one page of the unit's journal).
//! Neither takes a lock or writes anything: a read during an activation sees the unit as it is
//! at that moment, and the operation journal does not record them.
//!
//! Every log line is redacted here, before it leaves the host, with the Agent's own gateway
//! password and the values of its operator env file and launch environment among the literal
//! secrets (`crate::unit_log::redact`).

use clawfleet_protocol::failure::{Failure, FailureCode};
use clawfleet_protocol::operation::{AgentRef, NamespaceRef};
use clawfleet_protocol::redact::Redactor;
use clawfleet_protocol::result::Step;
use clawfleet_protocol::runtime::{
    ExitKind, LastExit, LogCursor, LogEntry, LogPage, LogSource, LogStart, LogsArgs, PageBuilder,
    PageLines, RuntimeArgs, RuntimeReport, Workload, WorkloadKind,
};
use clawfleet_protocol::time::format_rfc3339_micros;

use super::{Ctx, Engine, fs_failure, system_failure};
use crate::fsutil;
use crate::layout::AgentPaths;
use crate::system::{JournalQuery, JournalStart, UnitRuntime};

/// Most supervisor entries scanned, newest first, to find the run before the current one.
const PREVIOUS_SCAN_MAX: usize = 10_000;

/// Most supervisor entries scanned, newest first, for the last exit.
const EXIT_SCAN_MAX: usize = 200;

/// One run of the gateway: a unit run (its invocation), or the part of one between two
/// relaunches (`span`, realtime microseconds, see `JournalQuery::span`).
struct GatewayRun {
    invocation: String,
    span: Option<(Option<u64>, Option<u64>)>,
}

/// Largest env file read for its secret values.
use crate::start_env::ENV_FILE_MAX;

impl Engine<'_> {
    /// The Agent's paths, once its Namespace and directory are verified as this Agent's.
    pub(crate) fn inspected(
        &self,
        ns: &NamespaceRef,
        agent: &AgentRef,
    ) -> Result<AgentPaths, Failure> {
        self.verify_namespace(ns)?;
        let paths = self.layout.agent(&ns.id, &agent.id);
        if !fsutil::dir_exists(&paths.dir).map_err(fs_failure)? {
            return Err(Failure::new(
                FailureCode::AgentMissing,
                format!("Agent {}/{} is not on this host", ns.id, agent.id),
            ));
        }
        self.verify_agent(&ns.id, agent, &paths)?;
        Ok(paths)
    }

    /// `agent-runtime`.
    pub(crate) fn agent_runtime(
        &self,
        ctx: &mut Ctx<'_>,
        args: &RuntimeArgs,
    ) -> Result<RuntimeReport, Failure> {
        ctx.step(Step::Verify)?;
        let paths = self.inspected(&args.namespace, &args.agent)?;
        let account_uid = self
            .verify_account(&args.namespace.id, &args.agent, &paths)
            .ok()
            .map(|ids| ids.uid);
        let run = self
            .system
            .unit_runtime(&paths.unit_name)
            .map_err(system_failure)?;
        let mut workload = run.state.loaded.then(|| self.workload(&paths, &run));
        if let Some(w) = &mut workload
            && w.last_exit.is_none()
        {
            // systemd forgets the last exit when the next run starts (a crash loop between
            // two runs); its journal message about that exit remains.
            w.last_exit = self.last_exit_from_journal(ctx, &paths);
        }
        let recent_lines = match PageLines::new(args.evidence_lines) {
            Ok(lines) => {
                let start = LogStart::Tail {
                    lines,
                    since_unix: None,
                };
                self.read_page(ctx, &paths, &start, false, lines)?.entries
            }
            Err(_) => Vec::new(),
        };
        Ok(RuntimeReport {
            observation: self.observe(&args.namespace.id, &args.agent.id, &paths),
            workload,
            account_uid,
            events: Vec::new(),
            recent_lines,
        })
    }

    fn workload(&self, paths: &AgentPaths, run: &UnitRuntime) -> Workload {
        let at = |usec: u64| (usec > 0).then(|| format_rfc3339_micros(usec));
        // The gateway's process: under a supervising launcher (crate::supervise) its child,
        // which a cutover relaunches within the same unit run.
        let (gateway_pid, started_usec) = if run.gateway_pid > 0 {
            (run.gateway_pid, run.gateway_start_usec)
        } else {
            (run.main_pid, run.exec_main_start_usec)
        };
        let kind = match run.exec_main_code {
            1 => Some(ExitKind::Exited),
            2 => Some(ExitKind::Killed),
            3 => Some(ExitKind::Dumped),
            _ => None,
        };
        Workload {
            kind: WorkloadKind::SystemdUnit,
            name: paths.unit_name.clone(),
            active_state: run.state.active_state.clone(),
            sub_state: run.state.sub_state.clone(),
            restarts: run.state.n_restarts,
            main_pid: (gateway_pid > 0).then_some(gateway_pid),
            main_uid: (gateway_pid > 0)
                .then(|| self.system.process_uid(gateway_pid))
                .flatten(),
            started_at: (gateway_pid > 0).then(|| at(started_usec)).flatten(),
            last_exit: kind.map(|kind| LastExit {
                kind,
                status: run.state.exec_main_status,
                at: at(run.exec_main_exit_usec),
                reason: (!run.result.is_empty()).then(|| run.result.clone()),
            }),
            memory_current_bytes: run.memory_current,
            memory_peak_bytes: run.memory_peak,
            cpu_usage_nanos: run.cpu_usage_nsec,
            tasks_current: run.tasks_current,
            invocation_id: (!run.invocation_id.is_empty()).then(|| run.invocation_id.clone()),
        }
    }

    /// The first of systemd's own journal entries about the unit, newest first, for which
    /// `pick` gives a value; at most `max` entries are looked at.
    fn newest_supervisor_entry<T>(
        &self,
        ctx: &Ctx<'_>,
        paths: &AgentPaths,
        max: usize,
        mut pick: impl FnMut(&crate::system::JournalRecord) -> Option<T>,
    ) -> Result<Option<T>, Failure> {
        let query = JournalQuery {
            unit: paths.unit_name.clone(),
            invocation: None,
            supervisor_only: true,
            start: JournalStart::Head,
            reverse: true,
            message_prefix: None,
            span: None,
        };
        let mut found = None;
        let mut seen = 0usize;
        self.system
            .read_journal(&query, ctx.deadline, &mut |record| {
                seen += 1;
                found = pick(&record);
                found.is_none() && seen < max
            })
            .map_err(system_failure)?;
        Ok(found)
    }

    /// The exit status of the unit's last run that ended: systemd's snapshot of the service
    /// when it still holds that run's exit, else its journal (a restart clears the snapshot).
    pub(crate) fn last_exit_status(&self, ctx: &Ctx<'_>, paths: &AgentPaths) -> Option<i32> {
        match self.system.unit_runtime(&paths.unit_name) {
            Ok(run) if run.exec_main_code != 0 => Some(run.state.exec_main_status),
            _ => self
                .last_exit_from_journal(ctx, paths)
                .map(|exit| exit.status),
        }
    }

    /// The newest "Main process exited" of the unit, from systemd's own journal entries.
    fn last_exit_from_journal(&self, ctx: &Ctx<'_>, paths: &AgentPaths) -> Option<LastExit> {
        self.newest_supervisor_entry(ctx, paths, EXIT_SCAN_MAX, |record| {
            let (code, status) = record.exit.as_ref()?;
            let kind = match code.as_str() {
                "exited" => ExitKind::Exited,
                "killed" => ExitKind::Killed,
                "dumped" => ExitKind::Dumped,
                _ => return None,
            };
            Some(LastExit {
                kind,
                status: *status,
                at: Some(format_rfc3339_micros(record.realtime_usec)),
                reason: None,
            })
        })
        .ok()
        .flatten()
    }

    /// `agent-logs`.
    pub(crate) fn agent_logs(
        &self,
        ctx: &mut Ctx<'_>,
        args: &LogsArgs,
    ) -> Result<LogPage, Failure> {
        ctx.step(Step::Verify)?;
        let paths = self.inspected(&args.namespace, &args.agent)?;
        self.read_page(ctx, &paths, &args.start, args.previous, args.limit)
    }

    fn read_page(
        &self,
        ctx: &Ctx<'_>,
        paths: &AgentPaths,
        start: &LogStart,
        previous: bool,
        limit: PageLines,
    ) -> Result<LogPage, Failure> {
        let (invocation, span) = if previous {
            let run = self.previous_run(ctx, paths)?;
            (Some(run.invocation), run.span)
        } else {
            (None, None)
        };
        let (journal_start, tail, limit) = match start {
            LogStart::Tail { lines, since_unix } => (
                JournalStart::Tail {
                    n: lines.get().min(limit.get()),
                    since: *since_unix,
                },
                true,
                PageLines::new(lines.get().min(limit.get())).unwrap_or(limit),
            ),
            LogStart::Since { since_unix } => (JournalStart::Since(*since_unix), false, limit),
            LogStart::After { cursor } => (
                JournalStart::After(cursor.as_str().to_owned()),
                false,
                limit,
            ),
        };
        let query = JournalQuery {
            unit: paths.unit_name.clone(),
            invocation: invocation.clone(),
            supervisor_only: false,
            start: journal_start,
            reverse: false,
            message_prefix: None,
            span,
        };
        let mut page = PageBuilder::new(limit, tail);
        if let LogStart::After { cursor } = start {
            page.keep_cursor(Some(cursor.clone()));
        }
        let mut redactor = Redactor::new(self.agent_secrets(paths)?);
        self.system
            .read_journal(&query, ctx.deadline, &mut |record| {
                let redacted = crate::unit_log::redact(&mut redactor, &record);
                let entry = LogEntry {
                    at: format_rfc3339_micros(record.realtime_usec),
                    source: if record.from_supervisor {
                        LogSource::Supervisor
                    } else {
                        LogSource::Gateway
                    },
                    message: redacted.text,
                };
                page.push(entry, LogCursor::new(record.cursor).ok(), redacted.count)
            })
            .map_err(system_failure)?;
        Ok(page.finish(invocation))
    }

    /// The gateway's run before its current (or last) one. A cutover in place relaunches
    /// the gateway within the unit's run (crate::supervise), so that is the span between the
    /// launcher's last two relaunch lines in the unit's current run, when it has one;
    /// otherwise the unit's run before, from systemd's own messages about the unit, newest
    /// first, from its last relaunch line on if it has any.
    fn previous_run(&self, ctx: &Ctx<'_>, paths: &AgentPaths) -> Result<GatewayRun, Failure> {
        let current = self
            .system
            .unit_runtime(&paths.unit_name)
            .map_err(system_failure)?
            .invocation_id;
        if !current.is_empty() {
            let relaunches = self.relaunches(ctx, paths, &current, 2)?;
            if let Some(&newest) = relaunches.first() {
                return Ok(GatewayRun {
                    invocation: current,
                    span: Some((relaunches.get(1).copied(), Some(newest))),
                });
            }
        }
        let found = self.newest_supervisor_entry(ctx, paths, PREVIOUS_SCAN_MAX, |record| {
            record
                .invocation
                .clone()
                .filter(|id| !id.is_empty() && *id != current)
        })?;
        if let Some(invocation) = found {
            let last = self.relaunches(ctx, paths, &invocation, 1)?;
            return Ok(GatewayRun {
                span: last.first().map(|from| (Some(*from), None)),
                invocation,
            });
        }
        Err(Failure::new(
            FailureCode::PreviousRunMissing,
            format!(
                "the journal holds no run of {} before the current one",
                paths.unit_name
            ),
        ))
    }

    /// When the launcher relaunched the gateway within the unit's run `invocation`, newest
    /// first, at most `max` (realtime microseconds of its lines).
    fn relaunches(
        &self,
        ctx: &Ctx<'_>,
        paths: &AgentPaths,
        invocation: &str,
        max: usize,
    ) -> Result<Vec<u64>, Failure> {
        let query = JournalQuery {
            unit: paths.unit_name.clone(),
            invocation: Some(invocation.to_owned()),
            supervisor_only: false,
            start: JournalStart::Head,
            reverse: true,
            message_prefix: Some(crate::supervise::RELAUNCHED),
            span: None,
        };
        let mut found = Vec::new();
        self.system
            .read_journal(&query, ctx.deadline, &mut |record| {
                // Only the launcher's own line, not systemd's about the unit.
                if !record.from_supervisor {
                    found.push(record.realtime_usec);
                }
                found.len() < max
            })
            .map_err(system_failure)?;
        Ok(found)
    }

    /// The Agent's literal secrets: its gateway password, the values of its operator env
    /// file (hostd never writes that file; it reads it only for this), and the values of its
    /// launch environment (what start hooks returned) whose name says they are secret
    /// (`DB_PASSWORD=…`: the value alone need not look like one). A file that is there but
    /// cannot be read fails the read: no page leaves without its redaction.
    fn agent_secrets(&self, paths: &AgentPaths) -> Result<Vec<String>, Failure> {
        let mut secrets = Vec::new();
        for file in paths.env_files() {
            if matches!(
                fsutil::kind(file).map_err(fs_failure)?,
                fsutil::Kind::Missing
            ) {
                continue;
            }
            let bytes = fsutil::read_small(file, ENV_FILE_MAX).map_err(|e| {
                Failure::new(
                    FailureCode::IoFailed,
                    format!("the log is not read without its redaction: {e}"),
                )
            })?;
            let all = file != paths.launch_env;
            secrets.extend(
                crate::unit_log::env_file(&String::from_utf8_lossy(&bytes))
                    .into_iter()
                    .filter(|(name, _)| all || clawfleet_protocol::redact::is_secret_name(name))
                    .map(|(_, value)| value),
            );
        }
        Ok(secrets)
    }
}
