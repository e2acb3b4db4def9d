//! The harness's error type: one human sentence per variant, so a failed test says what broke.

use std::path::PathBuf;
use std::time::Duration;

/// Everything that can go wrong while building, starting, driving or tearing down test hosts.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A runner-side tool could not be started at all (usually: not installed).
    #[error("could not run `{command}` (is it installed? see vm-tests/RUNNER-PACKAGES): {source}")]
    Spawn {
        command: String,
        #[source]
        source: std::io::Error,
    },

    /// A runner-side tool ran and failed.
    #[error("`{command}` failed ({status}): {stderr}")]
    CommandFailed {
        command: String,
        status: String,
        stderr: String,
    },

    /// A file-system operation on the runner failed.
    #[error("could not {action} {}: {source}", path.display())]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// The machine's apt sources name no Debian mirror for the suite.
    #[error(
        "no Debian mirror for suite {suite} found in /etc/apt/sources.list.d/*.sources or \
         /etc/apt/sources.list; set CLAWFLEET_VM_MIRROR"
    )]
    NoMirror { suite: String },

    /// An environment setting of the harness has a value it cannot use.
    #[error("setting {name}={value:?} is invalid: {reason}")]
    InvalidSetting {
        name: &'static str,
        value: String,
        reason: &'static str,
    },

    /// Every host number is held by a live process or blocked by a leftover.
    #[error("no free test host slot: all {max} are in use or blocked (try `vmhosts list`)")]
    NoFreeSlot { max: u32 },

    /// A slot record on disk could not be parsed, so its resources cannot be found.
    #[error("slot record {} is unreadable: {reason}", path.display())]
    BadRecord { path: PathBuf, reason: String },

    /// systemd-nspawn ended while the harness waited for the host.
    #[error("systemd-nspawn for {name} exited during boot ({status}); console tail:\n{console}")]
    NspawnExited {
        name: String,
        status: String,
        console: String,
    },

    /// The host did not reach sshd + a finished boot in time.
    #[error("{name} was not ready within {timeout:?} ({stage}); console tail:\n{console}")]
    BootTimeout {
        name: String,
        timeout: Duration,
        stage: String,
        console: String,
    },

    /// The host finished booting in a state other than running/degraded.
    #[error("{name} finished booting as {state:?}, not running")]
    BootState { name: String, state: String },

    /// The guest did not end with the reboot exit status 133 after `systemctl reboot`.
    #[error("{name} did not reboot: systemd-nspawn {detail}")]
    Reboot { name: String, detail: String },

    /// A command run on the host over ssh failed.
    #[error("`{command}` on {name} failed ({status}): {stderr}")]
    Remote {
        name: String,
        command: String,
        status: String,
        stderr: String,
    },

    /// The host was already shut down when it was used.
    #[error("{name} is already shut down")]
    ShutDown { name: String },

    /// Some resources of a host could not be removed; they stay recorded for `vmhosts clean`.
    #[error("teardown of {name} left resources behind: {detail}")]
    Teardown { name: String, detail: String },

    /// A workspace binary (the test gateway, hostd, occ, an example) could not be built or found.
    #[error("could not build {target} with cargo: {detail}")]
    Build { target: String, detail: String },

    /// A local file to install is not a regular readable file.
    #[error("{} cannot be installed: {reason}", path.display())]
    BadLocalFile { path: PathBuf, reason: String },
}

/// Result alias of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub(crate) fn io(
        action: &'static str,
        path: impl Into<PathBuf>,
        source: std::io::Error,
    ) -> Self {
        Error::Io {
            action,
            path: path.into(),
            source,
        }
    }
}
