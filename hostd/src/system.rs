//! The narrow trait around everything hostd does that needs root or a live systemd: account
//! tools, ownership changes, systemd jobs over D-Bus, and the loopback readiness probe.
//!
//! The operation logic talks only to this trait, so it is unit-tested as an ordinary user over
//! [`crate::fake::FakeSystem`]; the real implementation ([`crate::real`]) is tested on real hosts.
//! Plain file work (markers, snapshots, the `current` pointer) is done directly on a
//! configurable state root, which unit tests point at a temporary directory.

use std::path::Path;
use std::time::Duration;

use thiserror::Error;

pub use crate::listener::Listener;

/// A numeric user and group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ids {
    pub uid: u32,
    pub gid: u32,
}

/// What systemd reports about one unit.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct UnitState {
    /// `ActiveState`: active, reloading, inactive, failed, activating, deactivating.
    pub active_state: String,
    /// `SubState`: running, dead, auto-restart, exited, ...
    pub sub_state: String,
    /// `NRestarts` of the service.
    pub n_restarts: u32,
    /// Whether the unit file is enabled (`UnitFileState` is `enabled`).
    pub enabled: bool,
    /// Whether systemd knows the unit at all (`LoadState` is not `not-found`).
    pub loaded: bool,
    /// `ExecMainStatus`: the exit status of the last main process, 0 if none.
    pub exec_main_status: i32,
}

impl UnitState {
    /// Active and running.
    pub fn is_active(&self) -> bool {
        self.active_state == "active"
    }

    /// systemd gave up on the unit (for example after exit status 78, which
    /// `RestartPreventExitStatus=` keeps from restarting).
    pub fn is_failed(&self) -> bool {
        self.active_state == "failed"
    }
}

/// What systemd reports about a unit's current or last run, for `agent-runtime`. Values
/// systemd does not track (no cgroup accounting, an older systemd) are `None`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct UnitRuntime {
    pub state: UnitState,
    /// `MainPID`, 0 when nothing runs.
    pub main_pid: u32,
    /// `ExecMainCode`: 1 exited, 2 killed, 3 dumped (`CLD_*`), 0 when it never ran.
    pub exec_main_code: i32,
    /// `ExecMainStartTimestamp` and `ExecMainExitTimestamp`, microseconds since the epoch, 0
    /// when unset.
    pub exec_main_start_usec: u64,
    pub exec_main_exit_usec: u64,
    /// `Result`: success, exit-code, signal, core-dump, timeout, start-limit-hit, …
    pub result: String,
    pub memory_current: Option<u64>,
    pub memory_peak: Option<u64>,
    pub cpu_usage_nsec: Option<u64>,
    pub tasks_current: Option<u64>,
    /// `InvocationID` as 32 hex digits, empty when the unit never ran since it was loaded.
    pub invocation_id: String,
    /// The gateway when the main process is its supervising launcher (crate::supervise): its
    /// pid and start (microseconds since the epoch); 0 when the main process is the gateway
    /// itself or nothing runs.
    pub gateway_pid: u32,
    pub gateway_start_usec: u64,
}

/// Which entries of a unit's journal to read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JournalQuery {
    pub unit: String,
    /// Only one run of the unit (its invocation id, 32 hex digits).
    pub invocation: Option<String>,
    /// Only systemd's own messages about the unit (`UNIT=` from PID 1).
    pub supervisor_only: bool,
    pub start: JournalStart,
    /// Newest first.
    pub reverse: bool,
    /// Only entries whose message starts with this text (journalctl's `--grep`).
    pub message_prefix: Option<&'static str>,
    /// Only entries written from the first (included) to the second (excluded) realtime,
    /// microseconds since the epoch: one gateway run within a unit run (crate::supervise).
    pub span: Option<(Option<u64>, Option<u64>)>,
}

/// Where a journal read starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JournalStart {
    /// From the oldest entry.
    Head,
    /// The newest `n` entries, oldest first, optionally not older than `since` (Unix seconds).
    Tail { n: u32, since: Option<u64> },
    /// From `since` (Unix seconds) on.
    Since(u64),
    /// After the entry with this cursor.
    After(String),
}

/// One journal entry as hostd reads it. `message` is already cut to its limit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JournalRecord {
    pub cursor: String,
    pub realtime_usec: u64,
    pub message: String,
    /// Written by systemd (PID 1) about the unit, not by the unit's own processes.
    pub from_supervisor: bool,
    /// journald cut the writer's line at its line limit (`_LINE_BREAK=line-max`): the line
    /// goes on in the next entry.
    pub cut: bool,
    /// The run the entry belongs to.
    pub invocation: Option<String>,
    /// systemd's `EXIT_CODE` and `EXIT_STATUS` on its "Main process exited" message.
    pub exit: Option<(String, i32)>,
}

/// A failure of a privileged call. Messages are safe to show: no command output, no secrets.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum SystemError {
    #[error("account tool {tool} failed for {account}: {detail}")]
    AccountTool {
        tool: &'static str,
        account: String,
        detail: String,
    },
    #[error("cannot look up account {account}: {detail}")]
    Lookup { account: String, detail: String },
    #[error("cannot change the owner of {path}: {detail}")]
    Chown { path: String, detail: String },
    #[error("systemd {action} of {unit} failed: {detail}")]
    Systemd {
        action: &'static str,
        unit: String,
        detail: String,
    },
    #[error("the gateway of {unit} cannot be relaunched in place: {detail}")]
    Relaunch { unit: String, detail: String },
    #[error("systemd cannot be reached over D-Bus: {0}")]
    Bus(String),
    #[error("the systemd job for {unit} did not finish within {seconds} s")]
    JobTimeout { unit: String, seconds: u64 },
    #[error("cannot read the listening sockets from {path}: {detail}")]
    Sockets { path: String, detail: String },
    #[error("the journal cannot be read: {detail}")]
    Journal { detail: String },
    #[error("the journal has no entry at the cursor given ({detail})")]
    JournalCursor { detail: String },
}

/// Everything privileged that hostd does, one method per effect.
pub trait System {
    /// The uid and primary gid of a user, or `None` if no such user exists.
    fn user(&self, name: &str) -> Result<Option<Ids>, SystemError>;
    /// The gid of a group, or `None` if no such group exists.
    fn group(&self, name: &str) -> Result<Option<u32>, SystemError>;
    /// Whether any user has the uid `id` or any group the gid `id`.
    fn id_in_use(&self, id: u32) -> Result<bool, SystemError>;
    /// Creates a system group and a system user of the same name whose primary group it is,
    /// both with the id `id` (uid and gid), with the given home (not created) and no login
    /// shell. Returns their ids.
    fn create_account(&self, name: &str, home: &Path, id: u32) -> Result<Ids, SystemError>;
    /// Removes a user (never its home: hostd removes Agent directories itself).
    fn delete_user(&self, name: &str) -> Result<(), SystemError>;
    /// Removes a group.
    fn delete_group(&self, name: &str) -> Result<(), SystemError>;
    /// Changes the owner of one path without following symlinks.
    fn chown(&self, path: &Path, ids: Ids) -> Result<(), SystemError>;

    /// `daemon-reload`, waiting until systemd has finished it.
    fn daemon_reload(&self) -> Result<(), SystemError>;
    /// Enables a unit file in the unit directory (`WantedBy=` links).
    fn enable_unit(&self, unit: &str) -> Result<(), SystemError>;
    /// Disables a unit file; succeeds if it was not enabled.
    fn disable_unit(&self, unit: &str) -> Result<(), SystemError>;
    /// Restarts (or starts) a unit and waits for its job to finish, subscribing to
    /// `JobRemoved` before the job is queued. A job result other than `done` is an error.
    fn restart_unit(&self, unit: &str, timeout: Duration) -> Result<(), SystemError>;
    /// The first half of a relaunch in place: asks the unit's supervising launcher (its main
    /// process, crate::supervise) to stop its gateway (SIGHUP through `KillUnit`), then waits
    /// until every other process the unit ran before is gone. The launcher then waits for
    /// [`System::start_relaunched`] before it starts the gateway again. Returns the launcher's
    /// pid. Fails before any signal when the main process is not such a launcher or runs
    /// nothing yet.
    fn stop_for_relaunch(&self, unit: &str, timeout: Duration) -> Result<u32, SystemError>;
    /// The second half: asks `launcher`, which [`System::stop_for_relaunch`] answered, to
    /// start the gateway (`crate::supervise::START` through `KillUnit`). Fails, sending
    /// nothing, when the unit's main process is another one now.
    fn start_relaunched(&self, unit: &str, launcher: u32) -> Result<(), SystemError>;
    /// Stops a unit and waits for its job; succeeds if the unit was not loaded or not running.
    fn stop_unit(&self, unit: &str, timeout: Duration) -> Result<(), SystemError>;
    /// ReloadUnit: runs the unit's `ExecReload=` (the Agent's network unit applies its egress
    /// again without removing the namespace).
    fn reload_unit(&self, unit: &str, timeout: Duration) -> Result<(), SystemError>;
    /// Forgets a unit's failed state (`ResetFailedUnit`), so a removed Agent's unit leaves
    /// systemd's failed list; succeeds if systemd does not know the unit.
    fn reset_failed_unit(&self, unit: &str) -> Result<(), SystemError>;
    /// The unit's current state; a unit systemd does not know has `loaded == false`.
    fn unit_state(&self, unit: &str) -> Result<UnitState, SystemError>;
    /// Whether systemd has the unit loaded from `file` as the file is now: `LoadUnit` (which
    /// reads a unit systemd did not find before once its file exists, on systemd 246 and
    /// later), then `LoadState` loaded, `FragmentPath` the file and `NeedDaemonReload` false.
    fn unit_file_loaded(&self, unit: &str, file: &Path) -> Result<bool, SystemError>;
    /// systemd's version string, for `probe`.
    fn systemd_version(&self) -> Result<String, SystemError>;

    /// One `GET http://127.0.0.1:<port>/readyz` with the given timeout; true on status 200.
    /// Redirects and every other status are "not ready".
    fn probe_ready(&self, port: u16, timeout: Duration) -> bool;
    /// The TCP sockets listening on `port` (IPv4 and IPv6), with their owners' uids, in the
    /// host's network namespace or, with `unit`, in the network namespace of that unit's
    /// running processes (none when nothing of it runs).
    fn listeners(&self, port: u16, unit: Option<&str>) -> Result<Vec<Listener>, SystemError>;
    /// Whether this host can give each Agent a network namespace of its own (issue 28);
    /// the error says what is missing.
    fn netns_support(&self) -> Result<(), String>;
    /// Whether the Agent's network namespace is there: systemd holds it while its network
    /// unit `net_unit` is active.
    fn netns_held(&self, net_unit: &str) -> bool;
    /// Starts a unit (a no-op when it is active) and waits for its job.
    fn start_unit(&self, unit: &str, timeout: Duration) -> Result<(), SystemError>;
    /// Names of the tools hostd needs that are not installed.
    fn missing_tools(&self) -> Vec<String>;

    /// The unit's state with its current or last run; a unit systemd does not know has
    /// `state.loaded == false`.
    fn unit_runtime(&self, unit: &str) -> Result<UnitRuntime, SystemError>;
    /// The real uid of a running process, `None` when it is gone.
    fn process_uid(&self, pid: u32) -> Option<u32>;
    /// Reads the unit's journal entries in order, handing each to `visit` until it returns
    /// false or `deadline` passes. Memory stays bounded whatever the entries' sizes.
    fn read_journal(
        &self,
        query: &JournalQuery,
        deadline: std::time::Instant,
        visit: &mut dyn FnMut(JournalRecord) -> bool,
    ) -> Result<(), SystemError>;
}
