//! Where the harness finds PostgreSQL and keeps its state, and how long it waits: defaults, and
//! the `CLAWFLEET_PG_*` environment variables that override them.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::error::{Error, Result};

/// Where Debian's packages put one directory per major version (`<root>/<major>/bin`).
pub const DEBIAN_ROOT: &str = "/usr/lib/postgresql";

/// The programs the harness runs from the binary directory.
pub const BINARIES: &[&str] = &["postgres", "initdb", "pg_isready", "psql"];

/// The unprivileged system user Debian's package creates; initdb and postgres refuse root.
pub const OS_USER: &str = "postgres";

/// Default state directory: run locks and records, run directories, kept logs, templates.
pub const DEFAULT_STATE_DIR: &str = "/var/lib/clawfleet-pg-tests";

/// The harness's settings.
#[derive(Debug, Clone)]
pub struct HarnessConfig {
    /// `postgres`, `initdb`, `pg_isready` and `psql` (`CLAWFLEET_PG_BIN_DIR`; default the newest
    /// `/usr/lib/postgresql/<major>/bin` that has them all).
    pub bin_dir: PathBuf,
    /// Runs, kept logs and the initdb template (`CLAWFLEET_PG_STATE_DIR`,
    /// `/var/lib/clawfleet-pg-tests`). Must be reachable by the `postgres` user.
    pub state_dir: PathBuf,
    /// Spawn to accepting connections, crash recovery included (`CLAWFLEET_PG_START_TIMEOUT_SECS`, 60).
    pub start_timeout: Duration,
    /// Fast shutdown (SIGINT) before immediate shutdown (SIGQUIT) and then SIGKILL
    /// (`CLAWFLEET_PG_STOP_TIMEOUT_SECS`, 5).
    pub stop_timeout: Duration,
    /// Put data directories on tmpfs (/dev/shm) when it is there (`CLAWFLEET_PG_TMPFS`, 1):
    /// copying the template there takes 0.2-0.3 s instead of 1-3 s on a disk other builds keep
    /// busy, at about 25 MiB of memory per idle server.
    pub data_on_tmpfs: bool,
    /// Keep the server log after a clean teardown too (`CLAWFLEET_PG_KEEP_LOGS=1`); it is always
    /// kept when a test panics or the start fails.
    pub keep_logs: bool,
    /// uid and gid of [`OS_USER`].
    pub uid: u32,
    pub gid: u32,
}

fn secs(name: &'static str, value: String) -> Result<Duration> {
    value
        .trim()
        .parse::<f64>()
        .ok()
        .filter(|v| v.is_finite() && *v > 0.0)
        .map(Duration::from_secs_f64)
        .ok_or(Error::InvalidSetting {
            name,
            value,
            reason: "expected a positive number of seconds",
        })
}

fn flag(name: &'static str, value: String) -> Result<bool> {
    match value.trim() {
        "1" | "true" | "yes" => Ok(true),
        "0" | "false" | "no" => Ok(false),
        _ => Err(Error::InvalidSetting {
            name,
            value,
            reason: "expected 1 or 0",
        }),
    }
}

fn absolute(name: &'static str, value: String) -> Result<PathBuf> {
    let p = PathBuf::from(&value);
    if p.is_absolute() {
        Ok(p)
    } else {
        Err(Error::InvalidSetting {
            name,
            value,
            reason: "expected an absolute path",
        })
    }
}

/// /dev/shm when it is a tmpfs mount.
fn tmpfs_base() -> Option<PathBuf> {
    let mounts = std::fs::read_to_string("/proc/self/mounts").ok()?;
    mounts
        .lines()
        .any(|l| {
            let mut f = l.split(' ');
            let _dev = f.next();
            f.next() == Some("/dev/shm") && f.next() == Some("tmpfs")
        })
        .then(|| PathBuf::from("/dev/shm"))
}

/// `"15"` → `[15]`, `"9.6"` → `[9, 6]`; `None` for anything else.
fn version_key(name: &str) -> Option<Vec<u32>> {
    name.split('.').map(|p| p.parse().ok()).collect()
}

fn has_binaries(dir: &Path) -> bool {
    BINARIES.iter().all(|b| dir.join(b).is_file())
}

/// The newest `<root>/<major>/bin` holding every binary of [`BINARIES`].
pub fn newest_bin_dir(root: &Path) -> Option<PathBuf> {
    let entries = std::fs::read_dir(root).ok()?;
    entries
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let key = version_key(e.file_name().to_str()?)?;
            let bin = e.path().join("bin");
            has_binaries(&bin).then_some((key, bin))
        })
        .max_by(|a, b| a.0.cmp(&b.0))
        .map(|(_, bin)| bin)
}

impl HarnessConfig {
    /// Defaults overridden by the `CLAWFLEET_PG_*` environment variables; an error when there
    /// is no PostgreSQL to run or no `postgres` user to run it as.
    pub fn from_env() -> Result<Self> {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
        let bin_dir = match var("CLAWFLEET_PG_BIN_DIR") {
            Some(v) => absolute("CLAWFLEET_PG_BIN_DIR", v)?,
            None => newest_bin_dir(Path::new(DEBIAN_ROOT)).ok_or_else(|| Error::NoPostgres {
                reason: format!(
                    "no {DEBIAN_ROOT}/<version>/bin with {}; install Debian's `postgresql` \
                     package (.ci/run does) or set CLAWFLEET_PG_BIN_DIR",
                    BINARIES.join(", ")
                ),
            })?,
        };
        if let Some(missing) = BINARIES.iter().find(|b| !bin_dir.join(b).is_file()) {
            return Err(Error::NoPostgres {
                reason: format!("{} is missing", bin_dir.join(missing).display()),
            });
        }
        let user = match nix::unistd::User::from_name(OS_USER) {
            Ok(Some(u)) => u,
            Ok(None) => {
                return Err(Error::NoPostgres {
                    reason: format!(
                        "there is no `{OS_USER}` system user (Debian's postgresql-common \
                         package creates it); initdb and postgres refuse to run as root"
                    ),
                });
            }
            Err(e) => {
                return Err(Error::NoPostgres {
                    reason: format!("cannot look up the `{OS_USER}` user: {e}"),
                });
            }
        };
        let mut c = HarnessConfig {
            bin_dir,
            state_dir: PathBuf::from(DEFAULT_STATE_DIR),
            start_timeout: Duration::from_secs(60),
            stop_timeout: Duration::from_secs(5),
            keep_logs: false,
            data_on_tmpfs: true,
            uid: user.uid.as_raw(),
            gid: user.gid.as_raw(),
        };
        if let Some(v) = var("CLAWFLEET_PG_STATE_DIR") {
            c.state_dir = absolute("CLAWFLEET_PG_STATE_DIR", v)?;
        }
        if let Some(v) = var("CLAWFLEET_PG_START_TIMEOUT_SECS") {
            c.start_timeout = secs("CLAWFLEET_PG_START_TIMEOUT_SECS", v)?;
        }
        if let Some(v) = var("CLAWFLEET_PG_STOP_TIMEOUT_SECS") {
            c.stop_timeout = secs("CLAWFLEET_PG_STOP_TIMEOUT_SECS", v)?;
        }
        if let Some(v) = var("CLAWFLEET_PG_TMPFS") {
            c.data_on_tmpfs = flag("CLAWFLEET_PG_TMPFS", v)?;
        }
        if let Some(v) = var("CLAWFLEET_PG_KEEP_LOGS") {
            c.keep_logs = flag("CLAWFLEET_PG_KEEP_LOGS", v)?;
        }
        Ok(c)
    }

    /// Locks, records and directories of runs (`<state>/runs`).
    pub fn runs_dir(&self) -> PathBuf {
        self.state_dir.join("runs")
    }

    /// Server logs kept after failures (`<state>/logs`).
    pub fn logs_dir(&self) -> PathBuf {
        self.state_dir.join("logs")
    }

    /// initdb's output per server version, copied for each run (`<state>/templates`).
    pub fn templates_dir(&self) -> PathBuf {
        self.state_dir.join("templates")
    }

    /// Where a run's data directory goes: `/dev/shm/clawfleet-pg-<id>` when
    /// [`data_on_tmpfs`](Self::data_on_tmpfs) and /dev/shm is a tmpfs, else `<run dir>/data`.
    pub fn data_dir_for(&self, id: &str, run_dir: &Path) -> PathBuf {
        match self.data_on_tmpfs.then(tmpfs_base).flatten() {
            Some(base) => base.join(format!("clawfleet-pg-{id}")),
            None => run_dir.join("data"),
        }
    }

    /// Path of one program in the binary directory.
    pub fn binary(&self, name: &str) -> PathBuf {
        self.bin_dir.join(name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_newest_complete_version_wins() {
        let root =
            std::env::temp_dir().join(format!("clawfleet-pg-versions-{}", std::process::id()));
        for (v, complete) in [
            ("9.6", true),
            ("15", true),
            ("16", false),
            ("13", true),
            ("x", true),
        ] {
            let bin = root.join(v).join("bin");
            std::fs::create_dir_all(&bin).unwrap();
            let names: &[&str] = if complete { BINARIES } else { &BINARIES[..2] };
            for b in names {
                std::fs::write(bin.join(b), "").unwrap();
            }
        }
        assert_eq!(newest_bin_dir(&root), Some(root.join("15").join("bin")));
        std::fs::remove_dir_all(&root).unwrap();
        assert_eq!(newest_bin_dir(&root), None);
    }

    #[test]
    fn version_keys_order_numerically() {
        assert!(version_key("10") > version_key("9.6"));
        assert_eq!(version_key("15"), Some(vec![15]));
        assert_eq!(version_key("15beta"), None);
    }

    #[test]
    fn bad_settings_are_refused() {
        assert!(secs("X", "0".into()).is_err());
        assert!(secs("X", "abc".into()).is_err());
        assert_eq!(
            secs("X", "2.5".into()).ok(),
            Some(Duration::from_millis(2500))
        );
        assert!(flag("X", "maybe".into()).is_err());
        assert!(absolute("X", "relative/dir".into()).is_err());
    }
}
