//! `hostd exec-gateway --port P -- COMMAND...`: the first word of every Agent unit's
//! `ExecStart=`. It confines the gateway to binding only its own TCP port, then execs the
//! gateway command in its place (same pid, same sandbox, nothing of hostd left running).
//!
//! The confinement is a Landlock ruleset (Linux 6.7+, Landlock ABI 4) that handles
//! `LANDLOCK_ACCESS_NET_BIND_TCP` with one rule for the Agent's port: a compromised gateway
//! cannot bind a sibling's port while the sibling is stopped or restarting (the bind fails with
//! EACCES). The unit also carries `SocketBindAllow=tcp:<port>` + `SocketBindDeny=any`, which
//! does the same where systemd is built with its BPF framework; Debian 12's systemd 252 is not
//! (`-BPF_FRAMEWORK`) and ignores them. On a kernel without Landlock networking the gateway
//! still starts, with a warning in the unit's journal saying that binds are not confined.
//! Connecting is never restricted (the gateway talks to its model providers).
//!
//! The only unsafe code in hostd: the Landlock syscalls and one prctl, which no dependency
//! offers.
#![allow(unsafe_code)]

use std::convert::Infallible;
use std::os::unix::process::CommandExt;

use nix::libc;
use thiserror::Error;

/// `LANDLOCK_CREATE_RULESET_VERSION`.
const CREATE_RULESET_VERSION: u32 = 1;
/// `LANDLOCK_ACCESS_NET_BIND_TCP`.
const ACCESS_NET_BIND_TCP: u64 = 1;
/// `LANDLOCK_RULE_NET_PORT`.
const RULE_NET_PORT: libc::c_int = 2;
/// The first Landlock ABI with network rules.
const NET_ABI: i64 = 4;

/// `struct landlock_ruleset_attr` as of ABI 4 (the kernel accepts this prefix of later ones).
#[derive(Debug)]
#[repr(C)]
struct RulesetAttr {
    handled_access_fs: u64,
    handled_access_net: u64,
}

/// `struct landlock_net_port_attr`.
#[derive(Debug)]
#[repr(C)]
struct NetPortAttr {
    allowed_access: u64,
    port: u64,
}

/// Why the gateway was not started.
#[derive(Debug, Error)]
pub enum LaunchError {
    #[error("exec-gateway needs the gateway command after --")]
    NoCommand,
    #[error("cannot confine binds to port {port}: {call} failed: {source}")]
    Confine {
        port: u16,
        call: &'static str,
        source: std::io::Error,
    },
    #[error("cannot run the gateway command {command}: {source}")]
    Exec {
        command: String,
        source: std::io::Error,
    },
}

/// What [`confine_bind`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Confinement {
    /// Binds are confined to the port (the kernel's Landlock ABI).
    Landlock { abi: i64 },
    /// The kernel cannot confine binds; the sentence says why.
    Unavailable(String),
}

/// The Landlock ABI the kernel offers, or why there is none.
fn landlock_abi() -> Result<i64, String> {
    // SAFETY: the documented version query: no attribute pointer, size 0, the version flag.
    let abi = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<RulesetAttr>(),
            0usize,
            CREATE_RULESET_VERSION,
        )
    };
    if abi < 0 {
        return Err(format!(
            "the kernel offers no Landlock ({})",
            std::io::Error::last_os_error()
        ));
    }
    Ok(abi)
}

/// Decides from the kernel's ABI whether binds can be confined.
pub fn supports_net(abi: Result<i64, String>) -> Result<i64, String> {
    match abi {
        Ok(abi) if abi >= NET_ABI => Ok(abi),
        Ok(abi) => Err(format!(
            "the kernel's Landlock ABI {abi} has no network rules (ABI {NET_ABI}, Linux 6.7, needed)"
        )),
        Err(e) => Err(e),
    }
}

/// The Landlock ABI with network rules this kernel offers, or why there is none.
pub fn net_confinement() -> Result<i64, String> {
    supports_net(landlock_abi())
}

/// Confines this process and everything it execs to binding TCP `port` only.
pub fn confine_bind(port: u16) -> Result<Confinement, LaunchError> {
    let abi = match supports_net(landlock_abi()) {
        Ok(abi) => abi,
        Err(why) => return Ok(Confinement::Unavailable(why)),
    };
    let fail = |call: &'static str| LaunchError::Confine {
        port,
        call,
        source: std::io::Error::last_os_error(),
    };
    let attr = RulesetAttr {
        handled_access_fs: 0,
        handled_access_net: ACCESS_NET_BIND_TCP,
    };
    // SAFETY: a valid attribute of the size passed; the result is a new descriptor or -1.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            &attr as *const RulesetAttr,
            size_of::<RulesetAttr>(),
            0u32,
        )
    };
    if fd < 0 {
        return Err(fail("landlock_create_ruleset"));
    }
    let fd = fd as libc::c_int;
    let rule = NetPortAttr {
        allowed_access: ACCESS_NET_BIND_TCP,
        port: u64::from(port),
    };
    // SAFETY: fd is the ruleset just created; the rule points to a valid attribute.
    let added = unsafe {
        libc::syscall(
            libc::SYS_landlock_add_rule,
            fd,
            RULE_NET_PORT,
            &rule as *const NetPortAttr,
            0u32,
        )
    };
    if added < 0 {
        let e = fail("landlock_add_rule");
        // SAFETY: closing our own descriptor.
        unsafe { libc::close(fd) };
        return Err(e);
    }
    // Landlock needs no_new_privs (the unit sets NoNewPrivileges=yes; say it again here).
    // SAFETY: plain prctl with constant arguments.
    if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
        let e = fail("prctl(PR_SET_NO_NEW_PRIVS)");
        // SAFETY: closing our own descriptor.
        unsafe { libc::close(fd) };
        return Err(e);
    }
    // SAFETY: fd is a valid ruleset descriptor; flags 0.
    let restricted = unsafe { libc::syscall(libc::SYS_landlock_restrict_self, fd, 0u32) };
    let e = (restricted < 0).then(|| fail("landlock_restrict_self"));
    // SAFETY: closing our own descriptor; the restriction outlives it.
    unsafe { libc::close(fd) };
    match e {
        Some(e) => Err(e),
        None => Ok(Confinement::Landlock { abi }),
    }
}

/// Confines binds to `port`, then replaces this process with `command`. Returns only on error.
pub fn exec_gateway(port: u16, command: &[String]) -> Result<Infallible, LaunchError> {
    let (program, args) = command.split_first().ok_or(LaunchError::NoCommand)?;
    match confine_bind(port)? {
        Confinement::Landlock { .. } => {}
        Confinement::Unavailable(why) => eprintln!(
            "hostd exec-gateway: WARNING: binds are not confined to port {port}: {why}; \
             systemd's SocketBindAllow= applies only where systemd has its BPF framework"
        ),
    }
    let source = std::process::Command::new(program).args(args).exec();
    Err(LaunchError::Exec {
        command: program.clone(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn network_rules_need_abi_4() {
        assert_eq!(supports_net(Ok(4)), Ok(4));
        assert_eq!(supports_net(Ok(7)), Ok(7));
        assert!(supports_net(Ok(3)).unwrap_err().contains("ABI 3"));
        assert!(supports_net(Err("none".into())).is_err());
    }

    #[test]
    fn a_missing_command_is_refused() {
        assert!(matches!(exec_gateway(1, &[]), Err(LaunchError::NoCommand)));
    }
}
