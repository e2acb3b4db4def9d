//! Small helpers: processes by pid (with start time against pid reuse), files, ports.

use std::fs;
use std::io::Write;
use std::net::{Ipv4Addr, TcpListener};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::{Gid, Pid, Uid};

use crate::error::{Error, Result};

pub(crate) fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// What `/proc/<pid>/stat` says about a process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Stat {
    pub state: char,
    pub ppid: u32,
    /// Start time in clock ticks since boot.
    pub start_ticks: u64,
}

pub(crate) fn proc_stat(pid: u32) -> Option<Stat> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // comm may contain spaces and parentheses: split after the last ')'.
    let rest = stat.get(stat.rfind(')')? + 2..)?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // `rest` starts at field 3 (state); field 4 is ppid, field 22 starttime.
    Some(Stat {
        state: fields.first()?.chars().next()?,
        ppid: fields.get(1)?.parse().ok()?,
        start_ticks: fields.get(19)?.parse().ok()?,
    })
}

/// True while `pid` is the same process (same start time) and not a zombie.
pub(crate) fn process_alive(pid: u32, start_ticks: Option<u64>) -> bool {
    proc_stat(pid).is_some_and(|s| s.state != 'Z' && start_ticks.is_none_or(|t| t == s.start_ticks))
}

/// Sends a signal to one pid, only if it is still the process that was recorded.
pub(crate) fn signal(pid: u32, start_ticks: Option<u64>, sig: Signal) {
    if !process_alive(pid, start_ticks) {
        return;
    }
    if let Ok(p) = i32::try_from(pid) {
        let _ = kill(Pid::from_raw(p), sig);
    }
}

/// Live children of `pid` (pid and start time). PostgreSQL's children call setsid(), so they are
/// found by parent, not by process group.
pub(crate) fn children_of(pid: u32) -> Vec<(u32, u64)> {
    let Ok(entries) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(|p| {
            let s = proc_stat(p)?;
            (s.ppid == pid && s.state != 'Z').then_some((p, s.start_ticks))
        })
        .collect()
}

/// Waits until `done` is true or the limit passes; returns whether it became true.
pub(crate) fn wait_until(limit: Duration, step: Duration, mut done: impl FnMut() -> bool) -> bool {
    let t0 = Instant::now();
    loop {
        if done() {
            return true;
        }
        if t0.elapsed() >= limit {
            return false;
        }
        std::thread::sleep(step);
    }
}

/// A port on 127.0.0.1 that was free a moment ago (the kernel picks it from its ephemeral range,
/// so concurrent runs rarely collide, and a server that cannot bind fails its start loudly).
pub(crate) fn free_port() -> Result<u16> {
    TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|source| Error::NoPort { source })
}

pub(crate) fn create_dir_all(path: &Path) -> Result<()> {
    fs::create_dir_all(path).map_err(|e| Error::io("create directory", path, e))
}

/// Gives a path to the server's user.
pub(crate) fn chown(path: &Path, uid: u32, gid: u32) -> Result<()> {
    nix::unistd::chown(path, Some(Uid::from_raw(uid)), Some(Gid::from_raw(gid)))
        .map_err(|e| Error::io("chown", path, e.into()))
}

/// A directory with a mode, owned by `owner` when given.
pub(crate) fn make_dir(path: &Path, mode: u32, owner: Option<(u32, u32)>) -> Result<()> {
    create_dir_all(path)?;
    fs::set_permissions(path, fs::Permissions::from_mode(mode))
        .map_err(|e| Error::io("chmod", path, e))?;
    match owner {
        Some((uid, gid)) => chown(path, uid, gid),
        None => Ok(()),
    }
}

/// Writes through a temporary file and rename, so readers never see half a file.
pub(crate) fn write_atomic(path: &Path, bytes: &[u8], mode: u32) -> Result<()> {
    let tmp = path.with_extension(format!("tmp-{}", std::process::id()));
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(&tmp)
        .map_err(|e| Error::io("create", &tmp, e))?;
    f.write_all(bytes)
        .and_then(|()| f.sync_all())
        .map_err(|e| Error::io("write", &tmp, e))?;
    fs::set_permissions(&tmp, fs::Permissions::from_mode(mode))
        .map_err(|e| Error::io("chmod", &tmp, e))?;
    fs::rename(&tmp, path).map_err(|e| Error::io("rename into place", path, e))
}

/// Writes a file with a mode, owned by `owner` when given (replacing it).
pub(crate) fn write_file(
    path: &Path,
    bytes: &[u8],
    mode: u32,
    owner: Option<(u32, u32)>,
) -> Result<()> {
    fs::write(path, bytes).map_err(|e| Error::io("write", path, e))?;
    fs::set_permissions(path, fs::Permissions::from_mode(mode))
        .map_err(|e| Error::io("chmod", path, e))?;
    match owner {
        Some((uid, gid)) => chown(path, uid, gid),
        None => Ok(()),
    }
}

/// Last `n` lines of a text file, or a note that it is unreadable.
pub(crate) fn file_tail(path: &Path, n: usize) -> String {
    match fs::read(path) {
        Ok(b) => {
            let text = String::from_utf8_lossy(&b);
            let lines: Vec<&str> = text.lines().collect();
            lines[lines.len().saturating_sub(n)..].join("\n")
        }
        Err(e) => format!("({} unreadable: {e})", path.display()),
    }
}

/// `n` random bytes as hex, from the kernel's CSPRNG.
pub(crate) fn random_hex(n: usize) -> Result<String> {
    let mut buf = vec![0u8; n];
    let mut f = fs::File::open("/dev/urandom").map_err(|e| Error::io("open", "/dev/urandom", e))?;
    std::io::Read::read_exact(&mut f, &mut buf)
        .map_err(|e| Error::io("read", "/dev/urandom", e))?;
    Ok(buf.iter().map(|b| format!("{b:02x}")).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_process_is_alive_with_its_parent() {
        let me = std::process::id();
        let Some(s) = proc_stat(me) else {
            panic!("no /proc/self/stat");
        };
        assert_ne!(s.state, 'Z');
        assert_eq!(s.ppid, std::os::unix::process::parent_id());
        assert!(process_alive(me, Some(s.start_ticks)));
        assert!(!process_alive(me, Some(s.start_ticks + 1)));
    }

    #[test]
    fn children_are_found_by_parent() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let kids = children_of(std::process::id());
        assert!(kids.iter().any(|(p, _)| *p == child.id()), "{kids:?}");
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(
            !children_of(std::process::id())
                .iter()
                .any(|(p, _)| *p == child.id())
        );
    }

    #[test]
    fn tail_keeps_the_last_lines() {
        let p = std::env::temp_dir().join(format!("clawfleet-pg-tail-{}", std::process::id()));
        fs::write(&p, "a\nb\nc\n").unwrap();
        assert_eq!(file_tail(&p, 2), "b\nc");
        fs::remove_file(&p).unwrap();
        assert!(file_tail(&p, 2).contains("unreadable"));
    }
}
