//! Small helpers: processes by pid (with start time against pid reuse), files, ports, logs.

use std::fs;
use std::io::Write;
use std::net::{Ipv4Addr, TcpListener};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::error::{Error, Result};

pub(crate) fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// Process state letter and start time (clock ticks since boot) from `/proc/<pid>/stat`.
pub(crate) fn proc_stat(pid: u32) -> Option<(char, u64)> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // comm may contain spaces and parentheses: split after the last ')'.
    let rest = stat.get(stat.rfind(')')? + 2..)?;
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

/// Sends a signal to one pid, only if it is still the process that was recorded.
pub(crate) fn signal(pid: u32, start_ticks: Option<u64>, sig: Signal) {
    if !process_alive(pid, start_ticks) {
        return;
    }
    if let Ok(p) = i32::try_from(pid) {
        let _ = kill(Pid::from_raw(p), sig);
    }
}

/// Resident set size of a process in KiB (for the memory figures), from `/proc/<pid>/status`.
pub(crate) fn rss_kib(pid: u32) -> Option<u64> {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
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

/// `n` distinct ports on 127.0.0.1 that were free a moment ago: all are bound at once, so they
/// differ from each other; the kernel picks them from its ephemeral range, so concurrent runs
/// rarely collide, and a component that cannot bind fails the start loudly.
pub(crate) fn free_ports<const N: usize>() -> Result<[u16; N]> {
    let mut held = Vec::with_capacity(N);
    let mut ports = [0u16; N];
    for p in ports.iter_mut() {
        let l = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .map_err(|source| Error::NoPort { source })?;
        *p = l
            .local_addr()
            .map(|a| a.port())
            .map_err(|source| Error::NoPort { source })?;
        held.push(l);
    }
    Ok(ports)
}

pub(crate) fn create_dir_all(path: &Path) -> Result<()> {
    fs::create_dir_all(path).map_err(|e| Error::io("create directory", path, e))
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

/// Writes a file with a mode (replacing it).
pub(crate) fn write_file(path: &Path, bytes: &[u8], mode: u32) -> Result<()> {
    fs::write(path, bytes).map_err(|e| Error::io("write", path, e))?;
    fs::set_permissions(path, fs::Permissions::from_mode(mode))
        .map_err(|e| Error::io("chmod", path, e))
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

/// `n` random bytes as hex, from the kernel's CSPRNG.
pub(crate) fn random_hex(n: usize) -> Result<String> {
    let mut buf = vec![0u8; n];
    let mut f = fs::File::open("/dev/urandom").map_err(|e| Error::io("open", "/dev/urandom", e))?;
    std::io::Read::read_exact(&mut f, &mut buf)
        .map_err(|e| Error::io("read", "/dev/urandom", e))?;
    Ok(buf.iter().map(|b| format!("{b:02x}")).collect())
}

/// Standard base64 (for kubeconfig `*-data` fields).
pub(crate) fn base64(bytes: &[u8]) -> String {
    const T: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(T[((n >> (18 - 6 * i)) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_matches_rfc4648_vectors() {
        for (input, want) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ] {
            assert_eq!(base64(input.as_bytes()), want);
        }
    }

    #[test]
    fn own_process_is_alive_and_has_rss() {
        let me = std::process::id();
        let Some((state, start)) = proc_stat(me) else {
            panic!("no /proc/self/stat");
        };
        assert_ne!(state, 'Z');
        assert!(process_alive(me, Some(start)));
        assert!(!process_alive(me, Some(start + 1)));
        assert!(rss_kib(me).is_some_and(|k| k > 0));
    }

    #[test]
    fn free_ports_are_distinct_and_nonzero() {
        let [a, b, c] = free_ports::<3>().unwrap();
        assert!(a != 0 && b != 0 && c != 0);
        assert!(a != b && b != c && a != c);
    }
}
