//! `hostd exec-gateway --port P -- COMMAND...`: the first word of every Agent unit's
//! `ExecStart=`. It confines the gateway to binding only its own TCP port, then execs the
//! gateway command in its place, or, with `--supervise` (what units run), runs it as a child
//! and stays to relaunch it in place (`crate::supervise`).
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
//! It also refuses the gateway (with a seccomp filter) the btrfs ioctls that create
//! subvolumes and snapshots: on a btrfs state root with quotas a subvolume the Agent made itself
//! would be outside its quota group (`crate::quota::btrfs`), so unlimited.
//!
//! Unsafe code: the Landlock and seccomp syscalls and prctl, which no dependency offers.
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
    #[error("the launcher cannot supervise the gateway: {call} failed: {source}")]
    Supervise {
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

/// The btrfs ioctls that make a subvolume or a snapshot (`BTRFS_IOC_SNAP_CREATE`,
/// `BTRFS_IOC_SUBVOL_CREATE`, `BTRFS_IOC_SNAP_CREATE_V2`, `BTRFS_IOC_SUBVOL_CREATE_V2` of
/// `<linux/btrfs.h>`), which any user may call on a directory it can write: the new subvolume
/// would get a quota group outside the Agent's own and escape its limit (issue 26, N6).
const BTRFS_CREATE_IOCTLS: [u32; 4] = [0x5000_9401, 0x5000_940e, 0x5000_9417, 0x5000_9418];

/// `AUDIT_ARCH_*` of `<linux/audit.h>` for the architectures hostd is built for.
#[cfg(target_arch = "x86_64")]
const AUDIT_ARCH_NATIVE: Option<u32> = Some(0xc000_003e);
#[cfg(target_arch = "aarch64")]
const AUDIT_ARCH_NATIVE: Option<u32> = Some(0xc000_00b7);
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
const AUDIT_ARCH_NATIVE: Option<u32> = None;

/// Offset of the low 32 bits of the second argument in `struct seccomp_data`.
#[cfg(target_endian = "little")]
const ARG1_LOW: u32 = 24;
#[cfg(target_endian = "big")]
const ARG1_LOW: u32 = 28;

/// The seccomp program: `ioctl` with one of [`BTRFS_CREATE_IOCTLS`] fails with `EPERM`;
/// everything else is allowed (the unit's own `SystemCallFilter=` and
/// `SystemCallArchitectures=native` still apply; a foreign architecture is left to them).
fn subvolume_filter(arch: u32) -> Vec<libc::sock_filter> {
    let stmt = |code: u32, k: u32| libc::sock_filter {
        code: code as u16,
        jt: 0,
        jf: 0,
        k,
    };
    let jump = |k: u32, jt: u8, jf: u8| libc::sock_filter {
        code: (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16,
        jt,
        jf,
        k,
    };
    let load = libc::BPF_LD | libc::BPF_W | libc::BPF_ABS;
    let [a, b, c, d] = BTRFS_CREATE_IOCTLS;
    vec![
        stmt(load, 4),                                              // 0: arch
        jump(arch, 0, 7),                                           // 1: foreign: allow (9)
        stmt(load, 0),                                              // 2: nr
        jump(libc::SYS_ioctl as u32, 0, 5),                         // 3: not ioctl: allow (9)
        stmt(load, ARG1_LOW),                                       // 4: the request
        jump(a, 4, 0),                                              // 5: refuse (10)
        jump(b, 3, 0),                                              // 6
        jump(c, 2, 0),                                              // 7
        jump(d, 1, 0),                                              // 8
        stmt(libc::BPF_RET | libc::BPF_K, libc::SECCOMP_RET_ALLOW), // 9
        stmt(
            libc::BPF_RET | libc::BPF_K,
            libc::SECCOMP_RET_ERRNO | libc::EPERM as u32,
        ), // 10
    ]
}

/// Refuses this thread (and everything it execs) the btrfs ioctls that create subvolumes and
/// snapshots ([`BTRFS_CREATE_IOCTLS`]). `Ok(false)` on an architecture hostd has no number
/// for.
pub fn refuse_subvolumes() -> Result<bool, std::io::Error> {
    let Some(arch) = AUDIT_ARCH_NATIVE else {
        return Ok(false);
    };
    let filter = subvolume_filter(arch);
    let program = libc::sock_fprog {
        len: filter.len() as u16,
        filter: filter.as_ptr().cast_mut(),
    };
    // SAFETY: plain prctl with constant arguments (seccomp needs no_new_privs without
    // CAP_SYS_ADMIN; the unit sets NoNewPrivileges=yes too).
    if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // prctl(PR_SET_SECCOMP), not seccomp(2): the unit's SystemCallFilter= allows prctl and
    // not necessarily the seccomp syscall.
    // SAFETY: `program` points at `filter`, a live array of `len` instructions, for the
    // duration of the call; the kernel copies it.
    let rc = unsafe {
        libc::prctl(
            libc::PR_SET_SECCOMP,
            libc::SECCOMP_MODE_FILTER,
            &raw const program,
            0,
            0,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(true)
}

/// Confines binds to `port` and refuses btrfs subvolume creation, then replaces this process
/// with `command`. Returns only on error.
pub fn exec_gateway(port: u16, command: &[String]) -> Result<Infallible, LaunchError> {
    let (program, args) = command.split_first().ok_or(LaunchError::NoCommand)?;
    confine(port)?;
    let source = std::process::Command::new(program).args(args).exec();
    Err(LaunchError::Exec {
        command: program.clone(),
        source,
    })
}

/// Confines this process, and everything it starts from now on, to binding `port` only and
/// refuses it btrfs subvolume creation (a warning on stderr where the kernel cannot confine
/// binds).
pub fn confine(port: u16) -> Result<(), LaunchError> {
    refuse_subvolumes().map_err(|source| LaunchError::Confine {
        port,
        call: "seccomp (refusing btrfs subvolume creation)",
        source,
    })?;
    match confine_bind(port)? {
        Confinement::Landlock { .. } => {}
        Confinement::Unavailable(why) => eprintln!(
            "hostd exec-gateway: WARNING: binds are not confined to port {port}: {why}; \
             systemd's SocketBindAllow= applies only where systemd has its BPF framework"
        ),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 26, N6: the ioctls that would make a subvolume outside the Agent's quota group
    /// fail with EPERM once refused; other ioctls still work. (The filter applies to the
    /// thread that installs it, so the test installs it in a thread of its own.)
    #[test]
    fn subvolume_creation_is_refused_and_other_ioctls_are_not() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().to_path_buf();
        let attempt = move || {
            let d = std::fs::File::open(&path).unwrap();
            let mut args = [0u8; 4096];
            args[8] = b'x';
            BTRFS_CREATE_IOCTLS.map(|request| {
                // SAFETY: each request reads at most 4096 bytes at `args`.
                let rc = unsafe {
                    libc::ioctl(
                        std::os::fd::AsRawFd::as_raw_fd(&d),
                        request as libc::c_ulong,
                        args.as_mut_ptr(),
                    )
                };
                (rc, std::io::Error::last_os_error().raw_os_error())
            })
        };
        let attempt2 = attempt.clone();
        let before = std::thread::spawn(attempt).join().unwrap();
        for (rc, errno) in before {
            // Not btrfs (ENOTTY), or btrfs, which takes the request: never EPERM.
            assert!(rc == 0 || errno != Some(libc::EPERM), "{before:?}");
        }
        let (after, pending) = std::thread::spawn(move || {
            assert!(refuse_subvolumes().unwrap());
            let after = attempt2();
            let (r, w) = nix::unistd::pipe().unwrap();
            nix::unistd::write(&w, b"abc").unwrap();
            let mut pending: libc::c_int = 0;
            // SAFETY: FIONREAD writes one int.
            let rc = unsafe {
                libc::ioctl(
                    std::os::fd::AsRawFd::as_raw_fd(&r),
                    libc::FIONREAD,
                    &raw mut pending,
                )
            };
            assert_eq!(rc, 0);
            (after, pending)
        })
        .join()
        .unwrap();
        for (rc, errno) in after {
            assert_eq!((rc, errno), (-1, Some(libc::EPERM)), "{after:?}");
        }
        assert_eq!(pending, 3, "other ioctls still work");
    }

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
