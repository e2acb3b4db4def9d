//! Small runner-side helpers: commands, mounts, processes, cgroups, files.

use std::fs;
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use sha2::{Digest, Sha256};

use crate::error::{Error, Result};

/// `prog arg arg` for messages.
pub(crate) fn describe(cmd: &Command) -> String {
    let mut s = cmd.get_program().to_string_lossy().into_owned();
    for a in cmd.get_args() {
        s.push(' ');
        s.push_str(&a.to_string_lossy());
    }
    s
}

/// Runs a command to completion; a non-zero exit is an error carrying stderr.
pub(crate) fn run(cmd: &mut Command) -> Result<Output> {
    let out = output(cmd)?;
    if out.status.success() {
        Ok(out)
    } else {
        Err(Error::CommandFailed {
            command: describe(cmd),
            status: out.status.to_string(),
            stderr: tail(&String::from_utf8_lossy(&out.stderr), 20),
        })
    }
}

/// Runs a command to completion and returns its output whatever the exit status.
pub(crate) fn output(cmd: &mut Command) -> Result<Output> {
    cmd.stdin(Stdio::null());
    cmd.output().map_err(|source| Error::Spawn {
        command: describe(cmd),
        source,
    })
}

/// Last `n` lines of a text.
pub(crate) fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Last lines of a log file, or a note that it is unreadable.
pub(crate) fn file_tail(path: &Path, n: usize) -> String {
    match fs::read(path) {
        Ok(b) => tail(&String::from_utf8_lossy(&b), n),
        Err(e) => format!("({} unreadable: {e})", path.display()),
    }
}

/// Absolute path of a program on PATH.
pub(crate) fn which(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0))
}

pub(crate) fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// Lower-case hex sha256.
pub(crate) fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// `n` random bytes as hex, from the kernel's CSPRNG.
pub(crate) fn random_hex(n: usize) -> Result<String> {
    let mut buf = vec![0u8; n];
    let mut f = fs::File::open("/dev/urandom").map_err(|e| Error::io("open", "/dev/urandom", e))?;
    std::io::Read::read_exact(&mut f, &mut buf)
        .map_err(|e| Error::io("read", "/dev/urandom", e))?;
    Ok(buf.iter().map(|b| format!("{b:02x}")).collect())
}

/// Single-quotes a string for a POSIX shell.
pub fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}

pub(crate) fn create_dir_all(path: &Path) -> Result<()> {
    fs::create_dir_all(path).map_err(|e| Error::io("create directory", path, e))
}

/// Writes through a temporary file and rename, so readers never see half a record.
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

/// Writes a file with a mode (replacing it), creating parent directories.
pub(crate) fn write_file(path: &Path, bytes: &[u8], mode: u32) -> Result<()> {
    if let Some(parent) = path.parent() {
        create_dir_all(parent)?;
    }
    fs::write(path, bytes).map_err(|e| Error::io("write", path, e))?;
    fs::set_permissions(path, fs::Permissions::from_mode(mode))
        .map_err(|e| Error::io("chmod", path, e))
}

/// Decodes the octal escapes of /proc/self/mountinfo (`\040` = space).
fn unescape_mount(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 4 <= b.len() {
            let digits = &b[i + 1..i + 4];
            if digits.iter().all(|d| (b'0'..=b'7').contains(d)) {
                let v = digits
                    .iter()
                    .fold(0u32, |acc, d| acc * 8 + u32::from(d - b'0'));
                if let Ok(v) = u8::try_from(v) {
                    out.push(v);
                    i += 4;
                    continue;
                }
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Mount points at or below `dir` in this mount namespace, deepest first.
pub(crate) fn mounts_under(dir: &Path) -> Result<Vec<PathBuf>> {
    let text = fs::read_to_string("/proc/self/mountinfo")
        .map_err(|e| Error::io("read", "/proc/self/mountinfo", e))?;
    let mut found: Vec<PathBuf> = text
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(|m| PathBuf::from(unescape_mount(m)))
        .filter(|m| m.starts_with(dir))
        .collect();
    found.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    found.dedup();
    Ok(found)
}

/// Unmounts everything at or below `dir` (stacked mounts too); lazy detach as a last resort.
pub(crate) fn unmount_all_under(dir: &Path) -> Result<()> {
    for attempt in 0..20 {
        let mounts = mounts_under(dir)?;
        if mounts.is_empty() {
            return Ok(());
        }
        for m in mounts {
            let flags = if attempt >= 10 {
                nix::mount::MntFlags::MNT_DETACH
            } else {
                nix::mount::MntFlags::empty()
            };
            let _ = nix::mount::umount2(&m, flags);
        }
        if attempt > 0 {
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    let left = mounts_under(dir)?;
    if left.is_empty() {
        Ok(())
    } else {
        Err(Error::Teardown {
            name: dir.display().to_string(),
            detail: format!("still mounted: {left:?}"),
        })
    }
}

/// Process state letter and start time (clock ticks since boot) from `/proc/<pid>/stat`.
pub(crate) fn proc_stat(pid: u32) -> Option<(char, u64)> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // comm may contain spaces and parentheses: split after the last ')'.
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let state = fields.first()?.chars().next()?;
    // Field 22 of stat is starttime; `rest` starts at field 3.
    let start = fields.get(19)?.parse().ok()?;
    Some((state, start))
}

/// True while `pid` is the same process (same start time) and not a zombie.
pub(crate) fn process_alive(pid: u32, start_ticks: Option<u64>) -> bool {
    match proc_stat(pid) {
        Some((state, start)) => state != 'Z' && start_ticks.is_none_or(|t| t == start),
        None => false,
    }
}

pub(crate) fn signal(pid: u32, sig: Signal) {
    if let Ok(p) = i32::try_from(pid) {
        let _ = kill(Pid::from_raw(p), sig);
    }
}

/// Live processes whose command line contains `arg` as one argument.
pub(crate) fn pids_with_arg(arg: &str) -> Vec<u32> {
    let Ok(rd) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    rd.filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| c.split(|b| *b == 0).any(|a| a == arg.as_bytes()))
                && process_alive(*pid, None)
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

/// The cgroup hierarchies a container must be placed in: the pure v2 root, or on a hybrid
/// machine the v1 `name=systemd` tree plus the v2 `unified` tree,
/// and the v1 `memory` and `pids` trees at this process's own cgroup in each, so that every
/// container has memory and pids cgroups of its own (below ours: its usage still counts
/// where ours does), which a host booted with [`crate::HostOptions::cgroup_limits`] lets its
/// systemd use.
pub(crate) fn cgroup_roots() -> Vec<PathBuf> {
    let base = Path::new("/sys/fs/cgroup");
    if base.join("cgroup.controllers").exists() {
        return vec![base.to_path_buf()];
    }
    let mut roots: Vec<PathBuf> = ["systemd", "unified"]
        .iter()
        .map(|d| base.join(d))
        .filter(|p| p.join("cgroup.procs").exists())
        .collect();
    let own = fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
    for controller in V1_LIMIT_CONTROLLERS {
        let Some(path) = own_v1_cgroup(&own, controller) else {
            continue;
        };
        let dir = base.join(controller).join(path.trim_start_matches('/'));
        if dir.join("cgroup.procs").exists() {
            roots.push(dir);
        }
    }
    roots
}

/// The v1 controllers whose limits a test host's systemd can be given (MemoryMax=, TasksMax=).
pub(crate) const V1_LIMIT_CONTROLLERS: [&str; 2] = ["memory", "pids"];

/// This process's cgroup in the v1 hierarchy of `controller`, from `/proc/self/cgroup` text.
fn own_v1_cgroup<'a>(proc_cgroup: &'a str, controller: &str) -> Option<&'a str> {
    proc_cgroup.lines().find_map(|l| {
        let mut parts = l.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        controllers
            .split(',')
            .any(|c| c == controller)
            .then_some(path)
    })
}

/// All pids in a cgroup and its descendants.
pub(crate) fn cgroup_pids(dir: &Path) -> Vec<u32> {
    let mut pids = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        if let Ok(text) = fs::read_to_string(d.join("cgroup.procs")) {
            pids.extend(text.lines().filter_map(|l| l.trim().parse::<u32>().ok()));
        }
        if let Ok(entries) = fs::read_dir(&d) {
            stack.extend(
                entries
                    .filter_map(|e| e.ok())
                    .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                    .map(|e| e.path()),
            );
        }
    }
    pids
}

/// Kills every process of a cgroup tree (cgroup.kill where available, SIGKILL per pid otherwise)
/// and waits until it is empty.
pub(crate) fn kill_cgroup(dir: &Path, limit: Duration) -> bool {
    if !dir.exists() {
        return true;
    }
    let kill_file = dir.join("cgroup.kill");
    if kill_file.exists() {
        let _ = fs::write(&kill_file, "1");
    }
    wait_until(limit, Duration::from_millis(50), || {
        let pids = cgroup_pids(dir);
        for p in &pids {
            signal(*p, Signal::SIGKILL);
        }
        pids.is_empty()
    })
}

/// Removes a cgroup's sub-cgroups (depth first); the directory itself too if `with_self`.
pub(crate) fn remove_cgroup_tree(dir: &Path, with_self: bool) -> Result<()> {
    if !dir.exists() {
        return Ok(());
    }
    let mut dirs = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        if let Ok(entries) = fs::read_dir(&d) {
            for e in entries.filter_map(|e| e.ok()) {
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    stack.push(e.path());
                }
            }
        }
        dirs.push(d);
    }
    dirs.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    for d in dirs {
        if d == dir && !with_self {
            continue;
        }
        // A cgroup can take a moment to become removable after its last process exits.
        let mut last = None;
        let gone =
            wait_until(
                Duration::from_secs(3),
                Duration::from_millis(50),
                || match fs::remove_dir(&d) {
                    Ok(()) => true,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => true,
                    Err(e) => {
                        last = Some(e);
                        false
                    }
                },
            );
        if !gone && let Some(e) = last {
            return Err(Error::io("remove cgroup", d, e));
        }
    }
    Ok(())
}

/// Removes a directory tree, refusing when anything below it is still mounted (so a failed
/// unmount can never make us delete a host's or the runner's files through a mount).
pub(crate) fn remove_tree(dir: &Path) -> Result<()> {
    if !dir.exists() {
        return Ok(());
    }
    let mounted = mounts_under(dir)?;
    if !mounted.is_empty() {
        return Err(Error::Teardown {
            name: dir.display().to_string(),
            detail: format!("refusing to delete, still mounted: {mounted:?}"),
        });
    }
    fs::remove_dir_all(dir).map_err(|e| Error::io("remove", dir, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_escapes() {
        assert_eq!(unescape_mount(r"/a\040b"), "/a b");
        assert_eq!(unescape_mount(r"/plain"), "/plain");
        assert_eq!(unescape_mount(r"/end\"), "/end\\");
    }

    #[test]
    fn quoting() {
        assert_eq!(shell_quote("a b"), "'a b'");
        assert_eq!(shell_quote("it's"), r"'it'\''s'");
    }

    #[test]
    fn own_process_is_alive() {
        let me = std::process::id();
        let (state, start) = proc_stat(me).unwrap();
        assert_ne!(state, 'Z');
        assert!(process_alive(me, Some(start)));
        assert!(!process_alive(me, Some(start + 1)));
    }
}
