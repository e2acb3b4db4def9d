//! The harness's error type: one sentence per variant, so a failed test says what broke.

use std::path::PathBuf;
use std::time::Duration;

/// Everything that can go wrong while preparing, starting, using or tearing down a server.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// No usable PostgreSQL server binaries (or no `postgres` system user) on this machine.
    #[error("PostgreSQL cannot run here: {reason}")]
    NoPostgres { reason: String },

    /// A program could not be started at all.
    #[error("could not start {program} ({}): {source}", path.display())]
    Spawn {
        program: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// A program ran and failed (initdb, psql, cp).
    #[error("{program} failed ({status}): {stderr}")]
    Command {
        program: &'static str,
        status: String,
        stderr: String,
    },

    /// A file-system operation failed.
    #[error("could not {action} {}: {source}", path.display())]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// An environment setting of the harness has a value it cannot use.
    #[error("setting {name}={value:?} is invalid: {reason}")]
    InvalidSetting {
        name: &'static str,
        value: String,
        reason: &'static str,
    },

    /// A name or server setting a test passed is not one the harness can quote safely.
    #[error("{what} {value:?} is invalid: {reason}")]
    InvalidInput {
        what: &'static str,
        value: String,
        reason: &'static str,
    },

    /// No free loopback port could be reserved.
    #[error("could not reserve a free port on 127.0.0.1: {source}")]
    NoPort {
        #[source]
        source: std::io::Error,
    },

    /// Making the TLS certificates failed.
    #[error("could not make the {what}: {source}")]
    Pki {
        what: &'static str,
        #[source]
        source: rcgen::Error,
    },

    /// The postmaster exited while the harness waited for it.
    #[error("the postmaster (pid {pid}) exited ({status}); last lines of {}:\n{tail}", log.display())]
    Exited {
        pid: u32,
        status: String,
        log: PathBuf,
        tail: String,
    },

    /// The server did not accept connections in time.
    #[error(
        "PostgreSQL did not accept connections on 127.0.0.1:{port} within {timeout:?} \
         (pg_isready: {last}); last lines of {}:\n{tail}",
        log.display()
    )]
    NotReady {
        port: u16,
        timeout: Duration,
        last: String,
        log: PathBuf,
        tail: String,
    },

    /// The server is not running (stopped or killed) and the call needs it.
    #[error("the PostgreSQL server of run {id} is not running (call start_again first)")]
    NotRunning { id: String },

    /// `start_again` while the server still runs.
    #[error("the PostgreSQL server of run {id} is already running (pid {pid})")]
    AlreadyRunning { id: String, pid: u32 },

    /// A run record on disk could not be parsed, so its processes cannot be found.
    #[error("run record {} is unreadable: {reason}", path.display())]
    BadRecord { path: PathBuf, reason: String },

    /// Some processes or files of a run could not be removed.
    #[error("teardown of PostgreSQL run {id} left things behind: {detail}")]
    Teardown { id: String, detail: String },
}

/// Result alias of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// `Ok` when nothing was left behind, else one [`Error::Teardown`] naming everything.
    pub(crate) fn teardown(id: &str, problems: Vec<String>) -> Result<()> {
        if problems.is_empty() {
            Ok(())
        } else {
            Err(Error::Teardown {
                id: id.to_string(),
                detail: problems.join("; "),
            })
        }
    }

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
