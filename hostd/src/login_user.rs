//! `hostd enrol --login-user NAME`, for hosts that forbid root login over SSH: the
//! coordinator logs in as a dedicated system user whose key is forced to run
//! `sudo -n /usr/sbin/hostd serve` (or `... relay` when the coordinator asked for the relay
//! channel, see [`LoginUserRequest::forced_command`]), and a sudoers drop-in lets that user
//! run exactly those two commands as root and nothing else. Root login stays the default;
//! without `--login-user` nothing here runs.
//!
//! Everything the user could change is root's: its home, `~/.ssh` and `authorized_keys` are
//! root-owned and not writable by it, and it has no password (`*`, not locked, so sshd's key
//! login works with or without PAM). The drop-in is checked with `visudo -cf` before it is
//! installed (atomically, 0440), and an existing user is used only if it is a usable login
//! user (a shell that runs the forced command, an absolute home).

use std::ffi::OsStr;
use std::fs;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};

use thiserror::Error;

use clawfleet_protocol::relay::RELAY_COMMAND;

use crate::enrol::FileChange;
use crate::system::SystemError;

/// Where sudo reads drop-ins.
pub const DEFAULT_SUDOERS_DIR: &str = "/etc/sudoers.d";
/// sudo itself, as the forced command names it.
pub const DEFAULT_SUDO: &str = "/usr/bin/sudo";
/// Where a new login user's home is made (`<base>/<name>`), apart from hostd's state root.
pub const DEFAULT_HOME_BASE: &str = "/var/lib/clawfleet-login";
/// The shell sshd runs the forced command with.
const LOGIN_SHELL: &str = "/bin/sh";
/// The prefix of Agent accounts, which sshd refuses (`DenyUsers cfa-*`).
const AGENT_PREFIX: &str = "cfa-";

/// What to set up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoginUserRequest {
    pub name: String,
    /// hostd's own path, the one command the user may run as root (with `serve`).
    pub hostd: PathBuf,
    pub sudo: PathBuf,
    pub sudoers_dir: PathBuf,
    pub home_base: PathBuf,
    /// hostd's state root, which no login user's home may be or contain.
    pub state_root: PathBuf,
}

impl LoginUserRequest {
    /// A request with the standard paths.
    pub fn new(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            hostd: PathBuf::from("/usr/sbin/hostd"),
            sudo: PathBuf::from(DEFAULT_SUDO),
            sudoers_dir: PathBuf::from(DEFAULT_SUDOERS_DIR),
            home_base: PathBuf::from(DEFAULT_HOME_BASE),
            state_root: PathBuf::from("/var/lib/clawfleet"),
        }
    }

    /// The command the login key is forced to run: `sudo -n hostd relay` when the
    /// coordinator asked for the relay channel ([`RELAY_COMMAND`], which sshd passes in
    /// `SSH_ORIGINAL_COMMAND`), `sudo -n hostd serve` for anything else. The choice is made
    /// here, before sudo, because sudo clears the environment: `hostd serve` as root can no
    /// longer see what was asked. `/bin/sh` runs it whatever the user's shell; `case` does
    /// not split or expand the asked command, which never reaches a command line.
    pub fn forced_command(&self) -> String {
        let (sudo, hostd) = (self.sudo.display(), self.hostd.display());
        format!(
            "/bin/sh -c 'case $SSH_ORIGINAL_COMMAND in {relay}) exec {sudo} -n {hostd} relay;; *) exec {sudo} -n {hostd} serve;; esac'",
            relay = RELAY_COMMAND.replace(' ', "[[:space:]]")
        )
    }

    /// The forced command an enrol before the relay channel wrote (`serve` only): a line
    /// with it is this enrol's to replace.
    pub fn earlier_forced_command(&self) -> String {
        format!("{} -n {} serve", self.sudo.display(), self.hostd.display())
    }

    /// The drop-in's path: `clawfleet-hostd-<name>` (no dot, so sudo reads it).
    pub fn sudoers_file(&self) -> PathBuf {
        self.sudoers_dir
            .join(format!("clawfleet-hostd-{}", self.name))
    }

    /// The drop-in's text: the user may run `hostd serve` and `hostd relay` as root without
    /// a password, and nothing else (a command with arguments in sudoers matches only those
    /// arguments).
    pub fn sudoers_text(&self) -> String {
        format!(
            "# Written by `hostd enrol --login-user {name}`: {name} may run exactly\n\
             # `{hostd} serve` and `{hostd} relay` as root (the forced command of the\n\
             # coordinator's key), nothing else.\n\
             {name} ALL=(root) NOPASSWD: {hostd} serve, {hostd} relay\n",
            name = self.name,
            hostd = self.hostd.display()
        )
    }

    /// The drop-in an enrol before the relay channel wrote (`serve` only): this enrol's to
    /// replace.
    fn earlier_sudoers_text(&self) -> String {
        format!(
            "# Written by `hostd enrol --login-user {name}`: {name} may run exactly\n\
             # `{hostd} serve` as root (the forced command of the coordinator's key), nothing else.\n\
             {name} ALL=(root) NOPASSWD: {hostd} serve\n",
            name = self.name,
            hostd = self.hostd.display()
        )
    }
}

/// What happened.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LoginUserOutcome {
    pub name: String,
    pub user: FileChange,
    pub sudoers: FileChange,
    /// The user's authorized_keys (root-owned), where enrol puts the coordinator's key.
    pub authorized_keys: PathBuf,
    pub forced_command: String,
}

/// Why the login user could not be set up.
#[derive(Debug, Error)]
pub enum LoginUserError {
    #[error(
        "--login-user {0:?} is not a valid user name: 1 to 32 of a-z, 0-9, '_' and '-', starting with a letter or '_', not root and not an Agent account (cfa-*)"
    )]
    InvalidName(String),
    #[error("{path} is not installed: --login-user needs sudo (apt-get install sudo)")]
    SudoMissing { path: String },
    #[error(
        "user {name} exists with the shell {shell}, which cannot run the forced command; give it a shell (usermod -s /bin/sh {name}) or choose another name"
    )]
    UnusableShell { name: String, shell: String },
    #[error(
        "user {name} has the home {home:?}; its authorized_keys needs an absolute home of its own, apart from hostd's state root"
    )]
    UnusableHome { name: String, home: String },
    #[error(
        "{path} exists with other content; it was not written by this enrol, so it is not replaced"
    )]
    SudoersConflict { path: String },
    #[error(
        "the sudoers drop-in for {name} did not pass `visudo -cf` ({detail}); nothing was installed"
    )]
    SudoersInvalid { name: String, detail: String },
    #[error(transparent)]
    Tool(#[from] SystemError),
    #[error("cannot write {path}: {source}")]
    Write {
        path: String,
        source: std::io::Error,
    },
}

fn write_err(path: &Path) -> impl FnOnce(std::io::Error) -> LoginUserError + '_ {
    move |source| LoginUserError::Write {
        path: path.display().to_string(),
        source,
    }
}

/// Checks a login user name.
pub fn check_name(name: &str) -> Result<(), LoginUserError> {
    let mut chars = name.chars();
    let ok = name.len() <= 32
        && chars
            .next()
            .is_some_and(|c| c.is_ascii_lowercase() || c == '_')
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '-')
        && name != "root"
        && !name.starts_with(AGENT_PREFIX);
    if ok {
        Ok(())
    } else {
        Err(LoginUserError::InvalidName(name.chars().take(40).collect()))
    }
}

/// Makes sure the login user exists and is usable, and installs its sudoers drop-in.
/// Returns where its authorized_keys goes; the caller (enrol) writes the key there. Checks
/// everything it can before changing anything.
pub fn set_up(req: &LoginUserRequest) -> Result<LoginUserOutcome, LoginUserError> {
    check_name(&req.name)?;
    if !req.sudo.is_file() {
        return Err(LoginUserError::SudoMissing {
            path: req.sudo.display().to_string(),
        });
    }
    let sudoers = req.sudoers_file();
    let text = req.sudoers_text();
    let sudoers_change = match fs::read(&sudoers) {
        Ok(existing) if existing == text.as_bytes() => FileChange::Unchanged,
        Ok(existing) if existing == req.earlier_sudoers_text().as_bytes() => FileChange::Updated,
        Ok(_) => {
            return Err(LoginUserError::SudoersConflict {
                path: sudoers.display().to_string(),
            });
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => FileChange::Created,
        Err(e) => return Err(write_err(&sudoers)(e)),
    };
    let existing = nix::unistd::User::from_name(&req.name).map_err(|e| SystemError::Lookup {
        account: req.name.clone(),
        detail: e.to_string(),
    })?;
    let (home, user_change) = match existing {
        Some(u) => {
            let shell = u.shell.display().to_string();
            if shell.ends_with("nologin") || shell.ends_with("/false") || shell.is_empty() {
                return Err(LoginUserError::UnusableShell {
                    name: req.name.clone(),
                    shell,
                });
            }
            if !u.dir.is_absolute()
                || u.dir == Path::new("/")
                || u.dir.starts_with(&req.state_root)
                || req.state_root.starts_with(&u.dir)
            {
                return Err(LoginUserError::UnusableHome {
                    name: req.name.clone(),
                    home: u.dir.display().to_string(),
                });
            }
            (u.dir, FileChange::Unchanged)
        }
        None => (req.home_base.join(&req.name), FileChange::Created),
    };
    // The drop-in, checked before anything changes.
    if sudoers_change != FileChange::Unchanged {
        check_sudoers(req, &text)?;
    }
    if user_change == FileChange::Created {
        let n = OsStr::new(&req.name);
        crate::real::run_account_tool(
            "useradd",
            &[
                OsStr::new("--system"),
                OsStr::new("--user-group"),
                OsStr::new("--home-dir"),
                home.as_os_str(),
                OsStr::new("--no-create-home"),
                OsStr::new("--shell"),
                OsStr::new(LOGIN_SHELL),
                // No password, and not a locked one: key login works with or without PAM.
                OsStr::new("--password"),
                OsStr::new("*"),
                n,
            ],
            &req.name,
        )?;
    }
    // Home and ~/.ssh root-owned and not writable by the user: it can change nothing there.
    for dir in [home.clone(), home.join(".ssh")] {
        if !dir.is_dir() {
            fs::DirBuilder::new()
                .recursive(true)
                .mode(0o755)
                .create(&dir)
                .map_err(write_err(&dir))?;
        }
        std::os::unix::fs::lchown(&dir, Some(0), Some(0)).map_err(write_err(&dir))?;
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o755)).map_err(write_err(&dir))?;
    }
    if sudoers_change != FileChange::Unchanged {
        install_sudoers(&sudoers, &text)?;
    }
    Ok(LoginUserOutcome {
        name: req.name.clone(),
        user: user_change,
        sudoers: sudoers_change,
        authorized_keys: home.join(".ssh/authorized_keys"),
        forced_command: req.forced_command(),
    })
}

/// `visudo -cf` on the text in a scratch file (skipped, with a log line, where visudo is not
/// installed).
fn check_sudoers(req: &LoginUserRequest, text: &str) -> Result<(), LoginUserError> {
    let Some(visudo) = crate::real::find_tool("visudo") else {
        tracing::warn!("visudo is not installed; the sudoers drop-in is installed unchecked");
        return Ok(());
    };
    let dir = std::env::temp_dir().join(format!("hostd-sudoers-{}", std::process::id()));
    fs::DirBuilder::new()
        .mode(0o700)
        .create(&dir)
        .map_err(write_err(&dir))?;
    let scratch = dir.join("check");
    let result = fs::write(&scratch, text)
        .and_then(|()| fs::set_permissions(&scratch, fs::Permissions::from_mode(0o440)))
        .map_err(write_err(&scratch))
        .and_then(|()| {
            std::process::Command::new(&visudo)
                .arg("-cf")
                .arg(&scratch)
                .env_clear()
                .stdin(std::process::Stdio::null())
                .output()
                .map_err(write_err(&visudo))
        });
    let _ = fs::remove_dir_all(&dir);
    let out = result?;
    if out.status.success() {
        Ok(())
    } else {
        Err(LoginUserError::SudoersInvalid {
            name: req.name.clone(),
            detail: format!("{}", out.status),
        })
    }
}

/// Installs the drop-in atomically, 0440 root: written under a name with a dot (which sudo
/// skips), synced, renamed into place, the directory synced.
fn install_sudoers(path: &Path, text: &str) -> Result<(), LoginUserError> {
    crate::fsutil::write_atomic(path, text.as_bytes(), 0o440, |_| Ok(())).map_err(|e| {
        LoginUserError::Write {
            path: path.display().to_string(),
            source: std::io::Error::other(e.to_string()),
        }
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn names_are_checked() {
        for ok in ["clawfleet", "occ_login", "a", "ops-1"] {
            check_name(ok).unwrap();
        }
        for bad in [
            "",
            "root",
            "cfa-123",
            "Upper",
            "1abc",
            "a b",
            "a.b",
            "a/b",
            &"x".repeat(33),
            "ü",
        ] {
            assert!(check_name(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn the_drop_in_allows_exactly_serve_and_relay_and_the_key_runs_them_through_sudo() {
        let req = LoginUserRequest::new("clawfleet");
        assert_eq!(
            req.forced_command(),
            "/bin/sh -c 'case $SSH_ORIGINAL_COMMAND in hostd[[:space:]]relay) exec /usr/bin/sudo -n /usr/sbin/hostd relay;; *) exec /usr/bin/sudo -n /usr/sbin/hostd serve;; esac'"
        );
        let text = req.sudoers_text();
        let rules: Vec<&str> = text.lines().filter(|l| !l.starts_with('#')).collect();
        assert_eq!(
            rules,
            ["clawfleet ALL=(root) NOPASSWD: /usr/sbin/hostd serve, /usr/sbin/hostd relay"]
        );
        assert_ne!(req.earlier_sudoers_text(), text);
        assert_eq!(
            req.sudoers_file(),
            Path::new("/etc/sudoers.d/clawfleet-hostd-clawfleet")
        );
        assert!(
            !req.sudoers_file()
                .file_name()
                .unwrap()
                .to_string_lossy()
                .contains('.')
        );
    }
}
