//! Each Agent's own network namespace (issue 28). hostd names it after the Agent's unit,
//! `clawfleet-<32 hex>`, under `/run/netns` (iproute2's place, a tmpfs: the namespace is made
//! again at every boot by the Agent's `clawfleet-net-<hash>.service`, which runs
//! `hostd netns-up`). The gateway unit and the Agent's front join it with systemd's
//! `NetworkNamespacePath=`: the gateway listens on the loopback inside it, which no sibling
//! Agent can reach or bind, on any kernel (no Landlock needed).
//!
//! hostd itself enters a namespace only from a thread of its own ([`run_in`]): a network
//! namespace is a per-thread attribute, and a socket keeps the namespace it was made in.

use std::path::{Path, PathBuf};
use std::process::Command;

use thiserror::Error;

/// Where named network namespaces live (iproute2's convention).
pub const RUN_DIR: &str = "/run/netns";

/// Where iproute2's `ip` may be; the first that exists is used.
const IP_PATHS: [&str; 4] = ["/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"];

/// Why a namespace could not be made, removed or entered.
#[derive(Debug, Error)]
pub enum NetnsError {
    #[error("iproute2's ip is not installed (looked for {})", IP_PATHS.join(", "))]
    NoIp,
    #[error("`ip {args}` failed: {detail}")]
    Ip { args: String, detail: String },
    #[error("cannot enter the network namespace {path}: {source}")]
    Enter {
        path: String,
        source: std::io::Error,
    },
    #[error("the thread that entered the network namespace {path} ended abnormally")]
    Thread { path: String },
}

/// The namespace name of the Agent whose unit is `unit_name`
/// (`clawfleet-agent-<h>.service` → `clawfleet-<h>`).
pub fn name_for_unit(unit_name: &str) -> String {
    let hash = unit_name
        .strip_prefix("clawfleet-agent-")
        .and_then(|r| r.strip_suffix(".service"))
        .unwrap_or(unit_name);
    format!("clawfleet-{hash}")
}

/// The namespace's file.
pub fn path(name: &str) -> PathBuf {
    Path::new(RUN_DIR).join(name)
}

/// Whether `name` is a name [`name_for_unit`] gives: nothing else reaches `ip`.
pub fn is_name(name: &str) -> bool {
    name.strip_prefix("clawfleet-")
        .is_some_and(|h| h.len() == 32 && h.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')))
}

fn ip_binary() -> Result<&'static str, NetnsError> {
    IP_PATHS
        .into_iter()
        .find(|p| Path::new(p).is_file())
        .ok_or(NetnsError::NoIp)
}

fn ip(args: &[&str]) -> Result<(), NetnsError> {
    let out = Command::new(ip_binary()?)
        .args(args)
        .output()
        .map_err(|e| NetnsError::Ip {
            args: args.join(" "),
            detail: e.to_string(),
        })?;
    if out.status.success() {
        return Ok(());
    }
    Err(NetnsError::Ip {
        args: args.join(" "),
        detail: format!(
            "{}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ),
    })
}

/// Makes the namespace (if it is not there) with its loopback up. Idempotent: a namespace
/// file left without its mount (a crash half way) is removed and made again.
pub fn up(name: &str) -> Result<(), NetnsError> {
    if path(name).exists() {
        if ip(&["-n", name, "link", "set", "lo", "up"]).is_ok() {
            return Ok(());
        }
        ip(&["netns", "delete", name])?;
    }
    ip(&["netns", "add", name])?;
    ip(&["-n", name, "link", "set", "lo", "up"])
}

/// Removes the namespace; succeeds when it is not there.
pub fn down(name: &str) -> Result<(), NetnsError> {
    if !path(name).exists() {
        return Ok(());
    }
    ip(&["netns", "delete", name])
}

/// Runs `f` on a thread of its own that has entered the namespace at `path` (sockets `f`
/// makes stay in it), and returns what `f` returned.
pub fn run_in<T, F>(path: &Path, f: F) -> Result<T, NetnsError>
where
    T: Send + 'static,
    F: FnOnce() -> T + Send + 'static,
{
    let shown = path.display().to_string();
    let file = std::fs::File::open(path).map_err(|source| NetnsError::Enter {
        path: shown.clone(),
        source,
    })?;
    let thread = std::thread::spawn(move || {
        nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET)
            .map_err(std::io::Error::from)?;
        Ok::<T, std::io::Error>(f())
    });
    match thread.join() {
        Ok(Ok(t)) => Ok(t),
        Ok(Err(source)) => Err(NetnsError::Enter {
            path: shown,
            source,
        }),
        Err(_) => Err(NetnsError::Thread { path: shown }),
    }
}

/// Whether this host can give each Agent a namespace of its own: `ip` is installed and the
/// kernel lets hostd make a network namespace. The error names what is missing.
///
/// It makes a namespace on a thread of its own (gone with the thread: nothing is left
/// behind) and brings its loopback up there with `ip`, which runs in the thread's namespace.
pub fn probe() -> Result<(), String> {
    let ip = ip_binary().map_err(|e| e.to_string())?;
    std::thread::spawn(move || {
        nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET).map_err(|e| {
            format!("the kernel refuses hostd a network namespace (unshare: {e})")
        })?;
        let out = Command::new(ip)
            .args(["link", "set", "lo", "up"])
            .output()
            .map_err(|e| format!("cannot run {ip}: {e}"))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(format!(
                "hostd cannot configure a network namespace (`ip link set lo up` in a new one: {}; CAP_NET_ADMIN missing?)",
                String::from_utf8_lossy(&out.stderr).trim()
            ))
        }
    })
    .join()
    .map_err(|_| "the thread that tried to make a network namespace ended abnormally".to_owned())?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_the_unit() {
        let n = name_for_unit("clawfleet-agent-0123456789abcdef0123456789abcdef.service");
        assert_eq!(n, "clawfleet-0123456789abcdef0123456789abcdef");
        assert!(is_name(&n));
        assert!(!is_name("clawfleet-xyz"));
        assert!(!is_name("other"));
        assert_eq!(
            path(&n),
            Path::new("/run/netns/clawfleet-0123456789abcdef0123456789abcdef")
        );
    }
}
