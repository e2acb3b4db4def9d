//! Per-Agent disk and inode limits (issue 26, N6): project quotas on the state root's file
//! system. Each Agent's writable directories (`home`, `state`) get the project id of the
//! Agent's uid with the inherit flag, so everything created below them is counted against
//! that project, and the project gets `[quota] max_bytes` / `max_inodes` as hard limits. A
//! write beyond them fails with `EDQUOT` for that Agent only; hostd's own files (journal,
//! markers, ports, sessions) are in project 0, which has no limit, so hostd and every other
//! tenant keep working.
//!
//! Project quotas need the file system to have them turned on (ext4: the `quota` and
//! `project` features and the `prjquota` mount option; XFS: `prjquota`) and a kernel with
//! `quotactl_fd` (Linux 5.14) and the quota formats built in (`CONFIG_QUOTA`,
//! `CONFIG_QFMT_V2` for ext4, `CONFIG_XFS_QUOTA` for XFS). [`support`] says which, and why
//! not; `probe` and `hostd status` report it.
//!
//! On btrfs, which has no project quotas, the same limit comes from quota groups instead
//! ([`btrfs`]): the Agent's writable directories are subvolumes in a level-1 group of its own
//! with `max_bytes` as the limit (btrfs has no inode limit; metadata counts against the bytes).
#![allow(unsafe_code)]

pub mod btrfs;

use std::os::fd::AsRawFd;
use std::path::Path;

use nix::libc;
use thiserror::Error;

/// `PRJQUOTA` of `<linux/quota.h>` (libc has only the user and group types).
const PRJQUOTA: libc::c_int = 2;
/// `FS_IOC_FSGETXATTR` / `FS_IOC_FSSETXATTR` of `<linux/fs.h>`: `_IOR('X', 31, struct
/// fsxattr)` and `_IOW('X', 32, struct fsxattr)`.
const FS_IOC_FSGETXATTR: libc::c_ulong = 0x801c_581f;
const FS_IOC_FSSETXATTR: libc::c_ulong = 0x401c_5820;
/// New files and directories take their parent's project id.
const FS_XFLAG_PROJINHERIT: u32 = 0x0000_0200;
/// `dqb_bhardlimit` counts 1 KiB blocks (`QIF_DQBLKSIZE`).
const QUOTA_BLOCK: u64 = 1024;

/// `struct fsxattr` of `<linux/fs.h>`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
struct FsXattr {
    xflags: u32,
    extsize: u32,
    nextents: u32,
    projid: u32,
    cowextsize: u32,
    pad: [u8; 8],
}

/// `struct if_dqinfo` of `<linux/quota.h>`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
struct DqInfo {
    bgrace: u64,
    igrace: u64,
    flags: u32,
    valid: u32,
}

/// The per-Agent limits (`[quota]` of hostd.toml).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QuotaLimits {
    /// Bytes the Agent's files may use together.
    pub max_bytes: u64,
    /// Files, directories and links the Agent may have.
    pub max_inodes: u64,
}

/// How the state root limits each Agent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mechanism {
    /// ext4 or XFS project quotas: bytes and inodes.
    ProjectQuota,
    /// btrfs quota groups over per-Agent subvolumes: bytes only.
    BtrfsQgroups,
}

/// Whether the state root can have per-Agent limits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Support {
    Enforced(Mechanism),
    /// Why not, as a sentence for the operator.
    Unavailable(String),
}

impl Support {
    /// `enforced: <mechanism>` or `unavailable: <why>`, as `probe` and `hostd status` show
    /// it.
    pub fn describe(&self) -> String {
        match self {
            Support::Enforced(Mechanism::ProjectQuota) => {
                "enforced: project quotas (bytes and inodes)".to_owned()
            }
            Support::Enforced(Mechanism::BtrfsQgroups) => "enforced: btrfs quota groups (bytes only: btrfs has no inode limit, metadata counts against the bytes)".to_owned(),
            Support::Unavailable(why) => format!("unavailable: {why}"),
        }
    }

    /// Whether Agents' writable directories are created as btrfs subvolumes.
    pub fn subvolumes(&self) -> bool {
        *self == Support::Enforced(Mechanism::BtrfsQgroups)
    }
}

/// What limiting one Agent's directories did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Limited {
    /// Every directory is limited.
    All,
    /// Nothing is: these directories are plain directories on a btrfs state root (the Agent
    /// was provisioned before quotas were enabled), left as they are.
    NotSubvolumes(Vec<String>),
}

#[derive(Debug, Error)]
pub enum QuotaError {
    #[error("cannot open {path}: {source}")]
    Open {
        path: String,
        source: std::io::Error,
    },
    #[error("cannot set project {project} on {path}: {source}")]
    Project {
        path: String,
        project: u32,
        source: std::io::Error,
    },
    #[error("cannot set the limits of project {project} on the file system of {path}: {source}")]
    Limits {
        path: String,
        project: u32,
        source: std::io::Error,
    },
    #[error("cannot create the btrfs subvolume {path}: {source}")]
    Subvolume {
        path: String,
        source: std::io::Error,
    },
    #[error("cannot limit btrfs quota group {group} for {path}: {source}")]
    Qgroup {
        path: String,
        group: String,
        source: std::io::Error,
    },
    #[error("cannot remove btrfs quota group {group} from the file system of {path}: {source}")]
    Release {
        path: String,
        group: String,
        source: std::io::Error,
    },
}

impl QuotaError {
    /// Whether the file system or a quota is full (`ENOSPC`, `EDQUOT`): retryable once
    /// space is freed.
    pub fn is_no_space(&self) -> bool {
        match self {
            QuotaError::Open { source, .. }
            | QuotaError::Project { source, .. }
            | QuotaError::Limits { source, .. }
            | QuotaError::Subvolume { source, .. }
            | QuotaError::Qgroup { source, .. }
            | QuotaError::Release { source, .. } => crate::fsutil::is_no_space(source),
        }
    }
}

fn open_dir(path: &Path) -> Result<std::fs::File, QuotaError> {
    std::fs::File::open(path).map_err(|source| QuotaError::Open {
        path: path.display().to_string(),
        source,
    })
}

fn quotactl_fd(
    dir: &std::fs::File,
    cmd: libc::c_int,
    id: u32,
    addr: *mut libc::c_void,
) -> std::io::Result<()> {
    // SAFETY: quotactl_fd(2) reads the open descriptor, the command and the id, and reads or
    // writes at most one struct of the command's type at `addr`, which every caller passes as
    // a pointer to a live value of that type.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_quotactl_fd,
            dir.as_raw_fd(),
            libc::QCMD(cmd, PRJQUOTA),
            id as libc::c_ulong,
            addr,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Whether the file system of `root` (which must exist) enforces per-Agent limits, and how.
pub fn support(root: &Path) -> Support {
    let dir = match open_dir(root) {
        Ok(d) => d,
        Err(e) => return Support::Unavailable(e.to_string()),
    };
    match btrfs::fs_type(std::os::fd::AsFd::as_fd(&dir)) {
        Ok(btrfs::BTRFS_SUPER_MAGIC) => return btrfs_support(root, &dir),
        Ok(_) => {}
        Err(e) => {
            return Support::Unavailable(format!(
                "cannot read the file system type of {}: {e}",
                root.display()
            ));
        }
    }
    let mut info = DqInfo::default();
    match quotactl_fd(&dir, libc::Q_GETINFO, 0, (&raw mut info).cast()) {
        Ok(()) => Support::Enforced(Mechanism::ProjectQuota),
        Err(e) => Support::Unavailable(match e.raw_os_error() {
            Some(libc::ESRCH) => format!(
                "the file system of {} does not have project quotas turned on (ext4: `tune2fs -O quota,project` and mount with `prjquota`; XFS: mount with `prjquota`); this kernel would need CONFIG_QUOTA with CONFIG_QFMT_V2 (ext4) or CONFIG_XFS_QUOTA",
                root.display()
            ),
            Some(libc::ENOSYS) => {
                "this kernel has no quotactl_fd (Linux 5.14 or later with CONFIG_QUOTACTL)"
                    .to_owned()
            }
            Some(libc::EPERM) => format!(
                "reading the project quota state of {} is not permitted (a container's seccomp filter?): {e}",
                root.display()
            ),
            Some(libc::ENOTSUP) | Some(libc::EINVAL) => format!(
                "the file system of {} has no project quotas ({e})",
                root.display()
            ),
            _ => format!(
                "cannot read the project quota state of {}: {e}",
                root.display()
            ),
        }),
    }
}

/// [`support`] for a state root on btrfs: quota groups, when the operator enabled them.
fn btrfs_support(root: &Path, dir: &std::fs::File) -> Support {
    match btrfs::quota_status(std::os::fd::AsFd::as_fd(dir)) {
        Ok(Some(_)) => Support::Enforced(Mechanism::BtrfsQgroups),
        Ok(None) => Support::Unavailable(format!(
            "the btrfs file system of {} does not have quotas enabled (run `btrfs quota enable <its mount point>`; hostd never enables them itself); btrfs has no project quotas",
            root.display()
        )),
        Err(e) if e.raw_os_error() == Some(libc::EPERM) => Support::Unavailable(format!(
            "reading the btrfs quota state of {} is not permitted (hostd needs CAP_SYS_ADMIN): {e}",
            root.display()
        )),
        Err(e) => Support::Unavailable(format!(
            "cannot read the btrfs quota state of {}: {e}",
            root.display()
        )),
    }
}

/// Creates the Agent directory `path` as a btrfs subvolume with `mode` (on a state root
/// whose [`support`] is [`Mechanism::BtrfsQgroups`]).
pub fn create_subvolume(path: &Path, mode: u32) -> Result<(), QuotaError> {
    use std::os::unix::ffi::OsStrExt;
    let failed = |source| QuotaError::Subvolume {
        path: path.display().to_string(),
        source,
    };
    let parent = open_dir(path.parent().unwrap_or(Path::new("/")))?;
    let name = path
        .file_name()
        .and_then(|n| std::ffi::CString::new(n.as_bytes()).ok())
        .ok_or_else(|| failed(std::io::Error::from_raw_os_error(libc::EINVAL)))?;
    btrfs::create_subvolume(std::os::fd::AsFd::as_fd(&parent), &name).map_err(failed)?;
    std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(mode))
        .map_err(failed)
}

/// Puts `dir` (and what is created in it from now on) into `project`.
pub fn set_project(dir: &Path, project: u32) -> Result<(), QuotaError> {
    let file = open_dir(dir)?;
    let failed = |source| QuotaError::Project {
        path: dir.display().to_string(),
        project,
        source,
    };
    let mut attr = FsXattr::default();
    // SAFETY: FS_IOC_FSGETXATTR writes one `struct fsxattr`, which `FsXattr` mirrors.
    if unsafe { libc::ioctl(file.as_raw_fd(), FS_IOC_FSGETXATTR, &raw mut attr) } != 0 {
        return Err(failed(std::io::Error::last_os_error()));
    }
    attr.projid = project;
    attr.xflags |= FS_XFLAG_PROJINHERIT;
    // SAFETY: FS_IOC_FSSETXATTR reads one `struct fsxattr`, which `FsXattr` mirrors.
    if unsafe { libc::ioctl(file.as_raw_fd(), FS_IOC_FSSETXATTR, &raw const attr) } != 0 {
        return Err(failed(std::io::Error::last_os_error()));
    }
    Ok(())
}

/// The quota block `limits` sets: hard limits only (no soft limits, no grace).
fn dqblk(limits: QuotaLimits) -> libc::dqblk {
    libc::dqblk {
        dqb_bhardlimit: limits.max_bytes.div_ceil(QUOTA_BLOCK),
        dqb_bsoftlimit: 0,
        dqb_curspace: 0,
        dqb_ihardlimit: limits.max_inodes,
        dqb_isoftlimit: 0,
        dqb_curinodes: 0,
        dqb_btime: 0,
        dqb_itime: 0,
        dqb_valid: libc::QIF_LIMITS,
    }
}

/// Sets `project`'s hard limits on the file system of `dir`.
pub fn set_limits(dir: &Path, project: u32, limits: QuotaLimits) -> Result<(), QuotaError> {
    let file = open_dir(dir)?;
    let mut block = dqblk(limits);
    quotactl_fd(&file, libc::Q_SETQUOTA, project, (&raw mut block).cast()).map_err(|source| {
        QuotaError::Limits {
            path: dir.display().to_string(),
            project,
            source,
        }
    })
}

/// Gives the Agent's writable directories `dirs` the limits `limits` by `mechanism`: the
/// project `project` (its uid), or the btrfs quota group `1/<project>` of their subvolumes
/// (set through the state root `root`).
/// Directories that are not subvolumes on btrfs are left alone and named in the answer.
pub fn limit_agent(
    root: &Path,
    mechanism: Mechanism,
    dirs: &[&Path],
    project: u32,
    limits: QuotaLimits,
) -> Result<Limited, QuotaError> {
    match mechanism {
        Mechanism::ProjectQuota => {
            for dir in dirs {
                set_project(dir, project)?;
            }
            if let Some(first) = dirs.first() {
                set_limits(first, project, limits)?;
            }
            Ok(Limited::All)
        }
        Mechanism::BtrfsQgroups => {
            let mut subvolumes = Vec::new();
            let mut plain = Vec::new();
            for dir in dirs {
                let file = open_dir(dir)?;
                let is =
                    btrfs::is_subvolume(std::os::fd::AsFd::as_fd(&file)).map_err(|source| {
                        QuotaError::Qgroup {
                            path: dir.display().to_string(),
                            group: btrfs::qgroup_name(btrfs::agent_qgroup(project)),
                            source,
                        }
                    })?;
                if is {
                    subvolumes.push(file);
                } else {
                    plain.push(dir.display().to_string());
                }
            }
            let files: Vec<&std::fs::File> = subvolumes.iter().collect();
            let fs = open_dir(root)?;
            btrfs::limit(
                std::os::fd::AsFd::as_fd(&fs),
                &files,
                project,
                limits.max_bytes,
            )
            .map_err(|source| QuotaError::Qgroup {
                path: dirs
                    .first()
                    .map(|d| d.display().to_string())
                    .unwrap_or_default(),
                group: btrfs::qgroup_name(btrfs::agent_qgroup(project)),
                source,
            })?;
            Ok(if plain.is_empty() {
                Limited::All
            } else {
                Limited::NotSubvolumes(plain)
            })
        }
    }
}

/// Removes what [`limit_agent`] made for the Agent whose account is `uid` that outlives its
/// directories: its btrfs quota group (project quotas keep nothing but the limits of the
/// project id, which the next Agent of that uid overwrites). A no-op where the state root
/// `root` has no btrfs quotas, and when the group is already gone.
pub fn release_agent(root: &Path, uid: u32) -> Result<(), QuotaError> {
    if !support(root).subvolumes() {
        return Ok(());
    }
    let dir = open_dir(root)?;
    btrfs::release(std::os::fd::AsFd::as_fd(&dir), uid).map_err(|source| QuotaError::Release {
        path: root.display().to_string(),
        group: btrfs::qgroup_name(btrfs::agent_qgroup(uid)),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_are_hard_limits_in_kib_blocks_and_inodes() {
        let b = dqblk(QuotaLimits {
            max_bytes: 10 * 1024 * 1024 + 1,
            max_inodes: 5000,
        });
        assert_eq!(b.dqb_bhardlimit, 10 * 1024 + 1);
        assert_eq!(b.dqb_ihardlimit, 5000);
        assert_eq!((b.dqb_bsoftlimit, b.dqb_isoftlimit), (0, 0));
        assert_eq!(b.dqb_valid, libc::QIF_BLIMITS | libc::QIF_ILIMITS);
        assert_eq!(size_of::<FsXattr>(), 28);
        assert_eq!(size_of::<DqInfo>(), 24);
    }

    #[test]
    fn a_file_system_without_project_quotas_says_why() {
        let dir = tempfile::tempdir().unwrap();
        // The temporary directory's file system: whatever it is, the answer is a sentence.
        match support(dir.path()) {
            Support::Enforced(_) => {}
            Support::Unavailable(why) => assert!(!why.is_empty()),
        }
        assert!(
            support(&dir.path().join("missing"))
                .describe()
                .starts_with("unavailable: cannot open")
        );
    }
}
