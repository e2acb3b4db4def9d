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
    #[error("systemd cannot be reached over D-Bus: {0}")]
    Bus(String),
    #[error("the systemd job for {unit} did not finish within {seconds} s")]
    JobTimeout { unit: String, seconds: u64 },
    #[error("cannot read the listening sockets from {path}: {detail}")]
    Sockets { path: String, detail: String },
}

/// Everything privileged that hostd does, one method per effect.
pub trait System {
    /// The uid and primary gid of a user, or `None` if no such user exists.
    fn user(&self, name: &str) -> Result<Option<Ids>, SystemError>;
    /// The gid of a group, or `None` if no such group exists.
    fn group(&self, name: &str) -> Result<Option<u32>, SystemError>;
    /// Creates a system group and a system user of the same name whose primary group it is,
    /// with the given home (not created) and no login shell. Returns their ids.
    fn create_account(&self, name: &str, home: &Path) -> Result<Ids, SystemError>;
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
    /// Stops a unit and waits for its job; succeeds if the unit was not loaded or not running.
    fn stop_unit(&self, unit: &str, timeout: Duration) -> Result<(), SystemError>;
    /// The unit's current state; a unit systemd does not know has `loaded == false`.
    fn unit_state(&self, unit: &str) -> Result<UnitState, SystemError>;
    /// systemd's version string, for `probe`.
    fn systemd_version(&self) -> Result<String, SystemError>;

    /// One `GET http://127.0.0.1:<port>/readyz` with the given timeout; true on status 200.
    /// Redirects and every other status are "not ready".
    fn probe_ready(&self, port: u16, timeout: Duration) -> bool;
    /// The TCP sockets listening on `port` (IPv4 and IPv6), with their owners' uids.
    fn listeners(&self, port: u16) -> Result<Vec<Listener>, SystemError>;
    /// Names of the tools hostd needs that are not installed.
    fn missing_tools(&self) -> Vec<String>;
}
