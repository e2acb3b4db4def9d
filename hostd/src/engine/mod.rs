//! The operation engine: executes one verified operation against the host, step by step.
//!
//! Before every step it checks whether the session closed or the deadline passed; if so it
//! starts no new step and reports the operation as aborted after the last completed one. Each
//! step itself leaves the host consistent, so stopping between steps is always safe.

mod checks;
mod fastpath;
mod fence;
pub mod hooks;
mod inventory;
mod live;
mod namespace;
mod plan;
mod provision;
mod reload;
mod removal;
mod revision;
mod rotate;
mod runtime;
mod secrets;
pub mod workspace;

use std::time::{Duration, Instant};

use clawfleet_protocol::failure::{Failure, FailureCode};
use clawfleet_protocol::result::{OperationResult, Step};
use clawfleet_protocol::{Fingerprint, Operation, OperationId};

use crate::config::Config;
use crate::fsutil::FsError;
use crate::journal::{Journal, aborted_failure};
use crate::layout::Layout;
use crate::lock::{self, LockError, LockGuard};
use crate::markers::MarkerError;
use crate::system::{System, SystemError};

pub use inventory::{NAMESPACES, inventory, network_isolation, probe};
pub(crate) use rotate::managed_password;

/// The host: configuration, layout and the privileged layer.
pub struct Engine<'a> {
    pub config: &'a Config,
    pub layout: Layout,
    pub system: &'a dyn System,
    pub host_key: Fingerprint,
}

impl std::fmt::Debug for Engine<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("layout", &self.layout)
            .finish()
    }
}

/// The per-operation context: identity, deadline, cancellation and progress reporting.
pub struct Ctx<'a> {
    pub operation_id: OperationId,
    pub deadline: Instant,
    pub cancelled: &'a dyn Fn() -> bool,
    pub on_step: &'a mut dyn FnMut(Step),
    last_step: Option<Step>,
    /// Unix seconds when the operation started (for served.json).
    pub now_unix: u64,
    /// The envelope's fence (protocol version 2 on), checked under the Agent lock by
    /// Agent-scoped changes (`fence.rs`). `None` for version 1 envelopes.
    pub fence: Option<u64>,
    /// Makes the operation's journal entry durable (`RunHandle::commit`). The engine calls it
    /// through [`Ctx::commit`] before its first write: an operation found to be a no-op under
    /// the Agent lock never calls it, so it answers without a durable journal write.
    commit: Option<&'a mut dyn FnMut() -> Result<(), Failure>>,
    /// Set once an activation with a restore began its cutover: from then on the operation
    /// runs to its end whatever happens to the session or the deadline (each wait inside it
    /// still has its own limit).
    detached: bool,
}

impl std::fmt::Debug for Ctx<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ctx")
            .field("operation_id", &self.operation_id)
            .field("last_step", &self.last_step)
            .finish()
    }
}

impl<'a> Ctx<'a> {
    /// A context for one operation.
    pub fn new(
        operation_id: OperationId,
        deadline: Instant,
        now_unix: u64,
        cancelled: &'a dyn Fn() -> bool,
        on_step: &'a mut dyn FnMut(Step),
    ) -> Self {
        Self {
            operation_id,
            deadline,
            cancelled,
            on_step,
            last_step: None,
            now_unix,
            fence: None,
            commit: None,
            detached: false,
        }
    }

    /// Sets what [`Ctx::commit`] runs (the session: the journal entry's durable write).
    pub fn on_commit(&mut self, commit: &'a mut dyn FnMut() -> Result<(), Failure>) {
        self.commit = Some(commit);
    }

    /// Called before the operation changes anything on the host: from here on the host may
    /// change, so the journal must know the operation durably (replay protection). Runs the
    /// hook once; later calls do nothing. Without a hook (engine tests) it does nothing.
    pub fn commit(&mut self) -> Result<(), Failure> {
        match self.commit.take() {
            Some(commit) => commit(),
            None => Ok(()),
        }
    }

    /// From now on, steps start and waits go on even if the session closes or the deadline
    /// passes (see `detached`).
    pub fn detach(&mut self) {
        if !self.detached {
            tracing::info!(operation_id = %self.operation_id, "the operation finishes on the host by itself from here");
        }
        self.detached = true;
    }

    /// Declares the next step. Refuses to start it once the session closed or the deadline
    /// passed.
    pub fn step(&mut self, step: Step) -> Result<(), Failure> {
        if self.detached {
            tracing::debug!(operation_id = %self.operation_id, step = step_name(step), "step");
            (self.on_step)(step);
            self.last_step = Some(step);
            return Ok(());
        }
        if (self.cancelled)() {
            return Err(aborted_failure(self.last_step));
        }
        if Instant::now() >= self.deadline {
            return Err(Failure::new(
                FailureCode::DeadlineExceeded,
                format!(
                    "the operation deadline passed before step {}; the host is consistent",
                    step_name(step)
                ),
            ));
        }
        tracing::debug!(operation_id = %self.operation_id, step = step_name(step), "step");
        (self.on_step)(step);
        self.last_step = Some(step);
        Ok(())
    }

    /// The last step started.
    pub fn last_step(&self) -> Option<Step> {
        self.last_step
    }

    /// Whether the session closed or the deadline passed (for waits inside a step).
    pub fn should_stop(&self) -> bool {
        !self.detached && ((self.cancelled)() || Instant::now() >= self.deadline)
    }

    /// Time left before the deadline.
    pub fn remaining(&self) -> Duration {
        self.deadline.saturating_duration_since(Instant::now())
    }
}

/// The wire name of a step.
pub fn step_name(step: Step) -> String {
    serde_json::to_value(step)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_default()
}

pub(crate) fn fs_failure(e: FsError) -> Failure {
    match e {
        FsError::WrongType { .. } => Failure::new(FailureCode::OwnershipMismatch, e.to_string()),
        FsError::TooLarge { .. } => Failure::new(FailureCode::OwnershipMismatch, e.to_string()),
        FsError::Io { ref source, .. } if crate::fsutil::is_no_space(source) => Failure::new(
            FailureCode::NoSpace,
            format!("{e} (free space on the host's state root, then retry)"),
        ),
        FsError::Io { .. } => Failure::new(FailureCode::IoFailed, e.to_string()),
    }
}

pub(crate) fn marker_failure(e: MarkerError) -> Failure {
    match e {
        MarkerError::Fs(f) => fs_failure(f),
        other => Failure::new(FailureCode::OwnershipMismatch, other.to_string()),
    }
}

pub(crate) fn system_failure(e: SystemError) -> Failure {
    let code = match e {
        SystemError::AccountTool { .. } | SystemError::Lookup { .. } => {
            FailureCode::AccountToolFailed
        }
        SystemError::Chown { .. } | SystemError::Sockets { .. } => FailureCode::IoFailed,
        SystemError::Journal { .. } => FailureCode::JournalUnavailable,
        SystemError::JournalCursor { .. } => FailureCode::LogCursorInvalid,
        SystemError::Systemd { .. }
        | SystemError::Bus(_)
        | SystemError::JobTimeout { .. }
        | SystemError::Relaunch { .. } => FailureCode::SystemdUnavailable,
    };
    Failure::new(code, e.to_string())
}

pub(crate) fn ownership(message: impl AsRef<str>) -> Failure {
    Failure::new(FailureCode::OwnershipMismatch, message)
}

impl<'a> Engine<'a> {
    /// An engine over a configuration and a privileged layer.
    pub fn new(config: &'a Config, system: &'a dyn System, host_key: Fingerprint) -> Self {
        Self {
            layout: Layout::new(&config.state_root, &config.unit_dir),
            config,
            system,
            host_key,
        }
    }

    fn lock(&self, ctx: &Ctx<'_>, path: &std::path::Path) -> Result<LockGuard, Failure> {
        lock::acquire(path, self.config.limits.lock_timeout, ctx.cancelled).map_err(|e| match e {
            LockError::Timeout { .. } => Failure::new(FailureCode::LockTimeout, e.to_string()),
            LockError::Cancelled { .. } => aborted_failure(ctx.last_step()),
            LockError::Open { .. } => Failure::new(FailureCode::IoFailed, e.to_string()),
        })
    }

    /// The host lock: host inventory only, never held across a gateway wait.
    pub(crate) fn host_lock(&self, ctx: &mut Ctx<'_>) -> Result<LockGuard, Failure> {
        ctx.step(Step::HostLock)?;
        crate::fsutil::ensure_dir(&self.layout.root, 0o755).map_err(fs_failure)?;
        self.lock(ctx, &self.layout.host_lock())
    }

    /// One Agent's lock, held through its activation including the readiness wait.
    pub(crate) fn agent_lock(
        &self,
        ctx: &mut Ctx<'_>,
        lock_path: &std::path::Path,
    ) -> Result<LockGuard, Failure> {
        ctx.step(Step::AgentLock)?;
        crate::fsutil::ensure_dir(&self.layout.root, 0o755).map_err(fs_failure)?;
        crate::fsutil::ensure_dir(&self.layout.locks_dir(), 0o700).map_err(fs_failure)?;
        self.lock(ctx, lock_path)
    }

    /// The trash area, where removed directory trees are deleted (`crate::trash`).
    pub(crate) fn trash(&self) -> crate::trash::Trash {
        crate::trash::Trash::new(self.layout.trash_dir())
    }

    /// Moves a directory tree into the trash and deletes it there (see `crate::trash`).
    pub(crate) fn remove_tree(&self, path: &std::path::Path) -> Result<bool, Failure> {
        self.trash().remove_tree(path).map_err(fs_failure)
    }

    /// Deletes what killed removals left in the trash (entries a live removal holds are left
    /// to it). A failure here is logged, not fatal: it never concerns this operation's Agent
    /// alone, and `status` lists what stays.
    fn finish_trash(&self, ctx: &Ctx<'_>) {
        match self.trash().finish() {
            Ok(0) => {}
            Ok(n) => {
                tracing::info!(operation_id = %ctx.operation_id, entries = n, "finished removals left in the trash")
            }
            Err(e) => {
                tracing::warn!(operation_id = %ctx.operation_id, "cannot finish the trash: {e}")
            }
        }
    }

    /// Removes our own pending leftovers (from a killed run) in `dir`: directories through
    /// the trash, files directly.
    pub(crate) fn sweep_pending(&self, dir: &std::path::Path) {
        for path in crate::fsutil::pending_leftovers(dir) {
            let removed = match crate::fsutil::kind(&path) {
                Ok(crate::fsutil::Kind::Dir) => self.trash().remove_tree(&path).map(|_| ()),
                _ => crate::fsutil::remove_file_if_present(&path).map(|_| ()),
            };
            if let Err(e) = removed {
                tracing::warn!("cannot remove the leftover {}: {e}", path.display());
            }
        }
    }

    /// Unlinks an Agent's lock file, while holding it, when nothing of the Agent is on the
    /// host (no directory, no account marker): an operation refused for an Agent the host
    /// never had, or a stop of one already gone, leaves no lock file behind. A waiter on the
    /// unlinked file notices and retries on a new one.
    pub(crate) fn forget_lock_if_absent(
        &self,
        lock: &LockGuard,
        paths: &crate::layout::AgentPaths,
    ) {
        let absent = |p: &std::path::Path| {
            matches!(crate::fsutil::kind(p), Ok(crate::fsutil::Kind::Missing))
        };
        if absent(&paths.dir) && absent(&self.layout.account_marker(&paths.account)) {
            lock.unlink();
        }
    }

    /// Executes one operation. `journal` answers `operation-status`.
    pub fn execute(
        &self,
        operation: &Operation,
        ctx: &mut Ctx<'_>,
        journal: &Journal,
    ) -> Result<OperationResult, Failure> {
        if !operation.kind().is_read_only() {
            // Operations without a no-op fast path change the host from their start on.
            if !matches!(
                operation,
                Operation::PrepareRevision(_)
                    | Operation::ActivateRevision(_)
                    | Operation::StopRevision(_)
                    | Operation::RetireRevision(_)
            ) {
                ctx.commit()?;
            }
            self.finish_trash(ctx);
        }
        match operation {
            Operation::Probe(_) => Ok(OperationResult::Probe(probe(self))),
            Operation::Status(args) => Ok(OperationResult::Status(inventory(
                self,
                args.namespace_id.as_ref(),
            ))),
            Operation::OperationStatus(args) => {
                let state = journal.status(&args.operation_id).map_err(fs_failure)?;
                Ok(OperationResult::OperationStatus(
                    clawfleet_protocol::result::OperationStatusResult {
                        operation_id: args.operation_id.clone(),
                        state,
                    },
                ))
            }
            Operation::EnsureNamespace(args) => self
                .ensure_namespace(ctx, &args.namespace)
                .map(OperationResult::EnsureNamespace),
            Operation::DeleteNamespace(args) => self
                .delete_namespace(ctx, &args.namespace)
                .map(OperationResult::DeleteNamespace),
            Operation::PrepareRevision(args) => self
                .prepare(ctx, args)
                .map(OperationResult::PrepareRevision),
            Operation::ActivateRevision(args) => self
                .activate(ctx, args)
                .map(OperationResult::ActivateRevision),
            Operation::VerifyRevision(args) => {
                self.verify(ctx, args).map(OperationResult::VerifyRevision)
            }
            Operation::StopRevision(args) => {
                self.stop(ctx, args).map(OperationResult::StopRevision)
            }
            Operation::RetireRevision(args) => {
                self.retire(ctx, args).map(OperationResult::RetireRevision)
            }
            Operation::AgentRuntime(args) => self
                .agent_runtime(ctx, args)
                .map(|r| OperationResult::AgentRuntime(Box::new(r))),
            Operation::AgentLogs(args) => {
                self.agent_logs(ctx, args).map(OperationResult::AgentLogs)
            }
            Operation::DeleteAgent(args) => self
                .delete_agent(ctx, &args.namespace, &args.agent)
                .map(OperationResult::DeleteAgent),
            Operation::PlanRevision(args) => self
                .plan(ctx, args)
                .map(|p| OperationResult::PlanRevision(Box::new(p))),
            Operation::PutSecrets(args) => {
                self.put_secrets(ctx, args).map(OperationResult::PutSecrets)
            }
        }
    }
}

#[cfg(test)]
mod tests;
