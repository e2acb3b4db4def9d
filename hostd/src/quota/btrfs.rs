//! btrfs quota groups (issue 26, N6), for a state root on btrfs (the default root file system
//! of Fedora and openSUSE), which has no project quotas. Each Agent's writable directories are
//! subvolumes, created at provision, and their level-0 quota groups are members of one level-1
//! group per Agent, `1/<uid>`, whose referenced-bytes limit is `[quota] max_bytes`. A write
//! beyond it fails with `EDQUOT` for that Agent only: hostd's own files are in the top-level
//! subvolume (or wherever the state root is), in no limited group.
//!
//! btrfs has no inode limit: metadata (inodes, directory entries, small files inlined in
//! metadata) counts against the bytes instead. Quotas must be enabled on the file system by the
//! operator (`btrfs quota enable <mount>`); hostd never enables them itself.
//!
//! Everything goes through the btrfs ioctls (`<linux/btrfs.h>`); the structures below mirror
//! that header's layout, and a test checks their sizes against the ioctl numbers.

use nix::libc;
use std::ffi::CStr;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};

/// `BTRFS_SUPER_MAGIC` of `<linux/magic.h>`.
pub(super) const BTRFS_SUPER_MAGIC: i64 = 0x9123_683e;
/// The inode number of every subvolume's root directory (`BTRFS_FIRST_FREE_OBJECTID`).
const SUBVOLUME_ROOT_INO: u64 = 256;
/// `BTRFS_QUOTA_TREE_OBJECTID`.
const QUOTA_TREE: u64 = 8;
/// `BTRFS_QGROUP_STATUS_KEY` and `BTRFS_QGROUP_RELATION_KEY` of `<linux/btrfs_tree.h>`.
const QGROUP_STATUS_KEY: u32 = 240;
const QGROUP_RELATION_KEY: u32 = 246;
/// `BTRFS_QGROUP_STATUS_FLAG_INCONSISTENT`.
const STATUS_INCONSISTENT: u64 = 1 << 1;
/// `BTRFS_QGROUP_LIMIT_MAX_RFER`.
const LIMIT_MAX_RFER: u64 = 1 << 0;
/// `BTRFS_PATH_NAME_MAX`.
const PATH_NAME_MAX: usize = 4087;

const IOCTL_MAGIC: libc::c_ulong = 0x94;

/// `_IOC(dir, 0x94, nr, size)` as `<asm-generic/ioctl.h>` encodes it.
const fn ioc(dir: libc::c_ulong, nr: libc::c_ulong, size: usize) -> libc::c_ulong {
    (dir << 30) | ((size as libc::c_ulong) << 16) | (IOCTL_MAGIC << 8) | nr
}
const WRITE: libc::c_ulong = 1;
const READ: libc::c_ulong = 2;

const IOC_SUBVOL_CREATE: libc::c_ulong = ioc(WRITE, 14, size_of::<VolArgs>());
const IOC_SNAP_DESTROY: libc::c_ulong = ioc(WRITE, 15, size_of::<VolArgs>());
const IOC_TREE_SEARCH: libc::c_ulong = ioc(READ | WRITE, 17, size_of::<SearchArgs>());
const IOC_QGROUP_ASSIGN: libc::c_ulong = ioc(WRITE, 41, size_of::<QgroupAssignArgs>());
const IOC_QGROUP_CREATE: libc::c_ulong = ioc(WRITE, 42, size_of::<QgroupCreateArgs>());
const IOC_QGROUP_LIMIT: libc::c_ulong = ioc(READ, 43, size_of::<QgroupLimitArgs>());
const IOC_INO_LOOKUP: libc::c_ulong = ioc(READ | WRITE, 18, size_of::<InoLookupArgs>());

/// `struct btrfs_ioctl_vol_args`.
#[repr(C)]
struct VolArgs {
    fd: i64,
    name: [u8; PATH_NAME_MAX + 1],
}

/// `struct btrfs_ioctl_ino_lookup_args`.
#[repr(C)]
struct InoLookupArgs {
    treeid: u64,
    objectid: u64,
    name: [u8; 4080],
}

/// `struct btrfs_ioctl_search_key`.
#[repr(C)]
#[derive(Default)]
struct SearchKey {
    tree_id: u64,
    min_objectid: u64,
    max_objectid: u64,
    min_offset: u64,
    max_offset: u64,
    min_transid: u64,
    max_transid: u64,
    min_type: u32,
    max_type: u32,
    nr_items: u32,
    unused: u32,
    unused1: u64,
    unused2: u64,
    unused3: u64,
    unused4: u64,
}

/// `struct btrfs_ioctl_search_args`: the key, then the items found.
#[repr(C)]
struct SearchArgs {
    key: SearchKey,
    buf: [u8; 4096 - size_of::<SearchKey>()],
}

/// `struct btrfs_ioctl_search_header`, which precedes each item in `SearchArgs::buf`.
const SEARCH_HEADER: usize = 32;

/// `struct btrfs_ioctl_qgroup_assign_args`.
#[repr(C)]
struct QgroupAssignArgs {
    assign: u64,
    src: u64,
    dst: u64,
}

/// `struct btrfs_ioctl_qgroup_create_args`.
#[repr(C)]
struct QgroupCreateArgs {
    create: u64,
    qgroupid: u64,
}

/// `struct btrfs_qgroup_limit`.
#[repr(C)]
struct QgroupLimit {
    flags: u64,
    max_rfer: u64,
    max_excl: u64,
    rsv_rfer: u64,
    rsv_excl: u64,
}

/// `struct btrfs_ioctl_qgroup_limit_args`.
#[repr(C)]
struct QgroupLimitArgs {
    qgroupid: u64,
    lim: QgroupLimit,
}

/// The level-1 quota group of the Agent whose account is `uid`: `1/<uid>`.
pub fn agent_qgroup(uid: u32) -> u64 {
    (1 << 48) | u64::from(uid)
}

/// `level/id`, as btrfs-progs writes a quota group.
pub fn qgroup_name(id: u64) -> String {
    format!("{}/{}", id >> 48, id & ((1 << 48) - 1))
}

fn ioctl<T>(fd: BorrowedFd<'_>, request: libc::c_ulong, arg: &mut T) -> std::io::Result<()> {
    // SAFETY: every request passed here is one of the `IOC_*` numbers above, each encoding
    // the size of the `<linux/btrfs.h>` structure that `T` mirrors (checked by the tests); the
    // kernel reads or writes at most that many bytes at `arg`, a live exclusive reference.
    let rc = unsafe { libc::ioctl(fd.as_raw_fd(), request, std::ptr::from_mut(arg)) };
    if rc < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// The file system type (`f_type` of fstatfs) of `fd`.
pub(super) fn fs_type(fd: BorrowedFd<'_>) -> std::io::Result<i64> {
    // SAFETY: an all-zero `statfs` is a valid value of the plain C struct.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: fstatfs(2) writes one `struct statfs` at the pointer, a live exclusive value.
    if unsafe { libc::fstatfs(fd.as_raw_fd(), &raw mut st) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    #[allow(clippy::unnecessary_cast)]
    Ok(st.f_type as i64)
}

/// The quota state of the btrfs file system of `fd`: `Ok(Some(inconsistent))` when quotas are
/// enabled, `Ok(None)` when they are not.
pub(super) fn quota_status(fd: BorrowedFd<'_>) -> std::io::Result<Option<bool>> {
    let items = match search(fd, QUOTA_TREE, 0, QGROUP_STATUS_KEY, 0) {
        Ok(items) => items,
        // No quota tree: quotas are not enabled.
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(None),
        Err(e) => return Err(e),
    };
    let Some((_, data)) = items.first() else {
        return Ok(None);
    };
    // `struct btrfs_qgroup_status_item`: version, generation, flags, rescan (little endian).
    let flags = data
        .get(16..24)
        .and_then(|b| <[u8; 8]>::try_from(b).ok())
        .map(u64::from_le_bytes)
        .unwrap_or(0);
    Ok(Some(flags & STATUS_INCONSISTENT != 0))
}

/// The items of `tree` with key `(objectid, item_type, any offset)`: their offsets and data.
fn search(
    fd: BorrowedFd<'_>,
    tree: u64,
    objectid: u64,
    item_type: u32,
    min_offset: u64,
) -> std::io::Result<Vec<(u64, Vec<u8>)>> {
    let mut found = Vec::new();
    let mut from = min_offset;
    loop {
        let mut args = SearchArgs {
            key: SearchKey {
                tree_id: tree,
                min_objectid: objectid,
                max_objectid: objectid,
                min_offset: from,
                max_offset: u64::MAX,
                min_transid: 0,
                max_transid: u64::MAX,
                min_type: item_type,
                max_type: item_type,
                nr_items: 4096,
                ..SearchKey::default()
            },
            buf: [0; 4096 - size_of::<SearchKey>()],
        };
        ioctl(fd, IOC_TREE_SEARCH, &mut args)?;
        let count = args.key.nr_items;
        if count == 0 {
            return Ok(found);
        }
        let mut at = 0usize;
        let mut last = None;
        for _ in 0..count {
            let header = args.buf.get(at..at + SEARCH_HEADER).ok_or_else(truncated)?;
            let word = |i: usize| {
                header
                    .get(i..i + 8)
                    .and_then(|b| <[u8; 8]>::try_from(b).ok())
                    .map(u64::from_ne_bytes)
                    .ok_or_else(truncated)
            };
            let (item_objectid, offset) = (word(8)?, word(16)?);
            let kind = header
                .get(24..28)
                .and_then(|b| <[u8; 4]>::try_from(b).ok())
                .map(u32::from_ne_bytes)
                .ok_or_else(truncated)?;
            let len = header
                .get(28..32)
                .and_then(|b| <[u8; 4]>::try_from(b).ok())
                .map(u32::from_ne_bytes)
                .ok_or_else(truncated)? as usize;
            at += SEARCH_HEADER;
            let data = args.buf.get(at..at + len).ok_or_else(truncated)?;
            at += len;
            if item_objectid == objectid && kind == item_type {
                found.push((offset, data.to_vec()));
            }
            last = Some(offset);
        }
        match last.and_then(|o| o.checked_add(1)) {
            Some(next) => from = next,
            None => return Ok(found),
        }
    }
}

fn truncated() -> std::io::Error {
    std::io::Error::other("the btrfs tree search answered a truncated item")
}

fn vol_args(name: &CStr) -> std::io::Result<VolArgs> {
    let bytes = name.to_bytes();
    if bytes.len() > PATH_NAME_MAX {
        return Err(std::io::Error::from_raw_os_error(libc::ENAMETOOLONG));
    }
    let mut args = VolArgs {
        fd: 0,
        name: [0; PATH_NAME_MAX + 1],
    };
    args.name[..bytes.len()].copy_from_slice(bytes);
    Ok(args)
}

/// Creates the subvolume `name` in the directory `parent`.
pub(super) fn create_subvolume(parent: BorrowedFd<'_>, name: &CStr) -> std::io::Result<()> {
    let mut args = vol_args(name)?;
    ioctl(parent, IOC_SUBVOL_CREATE, &mut args)
}

/// Deletes the subvolume `name` of the directory `parent` with everything in it (the space is
/// freed by the file system's cleaner, after the call). `ENOTEMPTY` when it holds other
/// subvolumes.
pub fn destroy_subvolume(parent: BorrowedFd<'_>, name: &CStr) -> std::io::Result<()> {
    let mut args = vol_args(name)?;
    ioctl(parent, IOC_SNAP_DESTROY, &mut args)
}

/// Whether the directory `dir` is the root of a btrfs subvolume of the same mount as its
/// parent (not a mount point): what a walk may delete as a subvolume.
pub fn is_subvolume(dir: BorrowedFd<'_>) -> std::io::Result<bool> {
    if fs_type(dir)? != BTRFS_SUPER_MAGIC {
        return Ok(false);
    }
    // SAFETY: an all-zero `statx` is a valid value of the plain C struct.
    let mut stx: libc::statx = unsafe { std::mem::zeroed() };
    // SAFETY: statx(2) with AT_EMPTY_PATH on a descriptor and an empty C string writes one
    // `struct statx` at the pointer, a live exclusive value.
    let rc = unsafe {
        libc::statx(
            dir.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH,
            libc::STATX_INO,
            &raw mut stx,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let mount_root = u64::from(libc::STATX_ATTR_MOUNT_ROOT as u32);
    if stx.stx_attributes_mask & mount_root == 0 {
        return Err(std::io::Error::other(
            "this kernel does not say which directories are mount points (statx, Linux 5.8)",
        ));
    }
    Ok(stx.stx_ino == SUBVOLUME_ROOT_INO && stx.stx_attributes & mount_root == 0)
}

/// The id of the subvolume that holds `dir`.
fn subvolume_id(dir: BorrowedFd<'_>) -> std::io::Result<u64> {
    let mut args = InoLookupArgs {
        treeid: 0,
        objectid: SUBVOLUME_ROOT_INO,
        name: [0; 4080],
    };
    ioctl(dir, IOC_INO_LOOKUP, &mut args)?;
    Ok(args.treeid)
}

fn tolerate(result: std::io::Result<()>, errno: libc::c_int) -> std::io::Result<()> {
    match result {
        Err(e) if e.raw_os_error() == Some(errno) => Ok(()),
        other => other,
    }
}

/// Puts the subvolumes `dirs` into the quota group `1/<uid>` (created if missing) and gives
/// the group `max_bytes` as its referenced-bytes limit. Idempotent. The group calls go
/// through `fs`, a directory outside the Agent's subvolumes (the state root): each starts a
/// transaction that reserves metadata in the subvolume of its descriptor, which a full
/// Agent's own would refuse with `EDQUOT`.
pub(super) fn limit(
    fs: BorrowedFd<'_>,
    dirs: &[&std::fs::File],
    uid: u32,
    max_bytes: u64,
) -> std::io::Result<()> {
    if dirs.is_empty() {
        return Ok(());
    }
    let first = fs;
    let group = agent_qgroup(uid);
    let mut create = QgroupCreateArgs {
        create: 1,
        qgroupid: group,
    };
    tolerate(ioctl(first, IOC_QGROUP_CREATE, &mut create), libc::EEXIST)?;
    for dir in dirs {
        let mut assign = QgroupAssignArgs {
            assign: 1,
            src: subvolume_id(dir.as_fd())?,
            dst: group,
        };
        tolerate(ioctl(fs, IOC_QGROUP_ASSIGN, &mut assign), libc::EEXIST)?;
    }
    let mut lim = QgroupLimitArgs {
        qgroupid: group,
        lim: QgroupLimit {
            flags: LIMIT_MAX_RFER,
            max_rfer: max_bytes,
            max_excl: 0,
            rsv_rfer: 0,
            rsv_excl: 0,
        },
    };
    ioctl(first, IOC_QGROUP_LIMIT, &mut lim)
}

/// The quota groups that are members of `group`.
fn members(fs: BorrowedFd<'_>, group: u64) -> std::io::Result<Vec<u64>> {
    Ok(search(fs, QUOTA_TREE, group, QGROUP_RELATION_KEY, 0)?
        .into_iter()
        .map(|(offset, _)| offset)
        // Relations are stored both ways: the lower levels are the members.
        .filter(|m| m >> 48 < group >> 48)
        .collect())
}

/// Removes the quota group `1/<uid>` from the file system of `fs`: its members first, then the
/// group. Idempotent (a missing group is done).
pub(super) fn release(fs: BorrowedFd<'_>, uid: u32) -> std::io::Result<()> {
    let group = agent_qgroup(uid);
    for member in members(fs, group)? {
        let mut assign = QgroupAssignArgs {
            assign: 0,
            src: member,
            dst: group,
        };
        tolerate(ioctl(fs, IOC_QGROUP_ASSIGN, &mut assign), libc::ENOENT)?;
    }
    let mut destroy = QgroupCreateArgs {
        create: 0,
        qgroupid: group,
    };
    tolerate(ioctl(fs, IOC_QGROUP_CREATE, &mut destroy), libc::ENOENT)
}

/// Whether the quota group `1/<uid>` exists on the file system of `fs`.
pub fn agent_qgroup_exists(fs: BorrowedFd<'_>, uid: u32) -> std::io::Result<bool> {
    /// `BTRFS_QGROUP_INFO_KEY`.
    const QGROUP_INFO_KEY: u32 = 242;
    let group = agent_qgroup(uid);
    Ok(search(fs, QUOTA_TREE, 0, QGROUP_INFO_KEY, group)?
        .iter()
        .any(|(offset, _)| *offset == group))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn structures_have_the_layout_of_linux_btrfs_h() {
        assert_eq!(size_of::<VolArgs>(), 4096);
        assert_eq!(size_of::<InoLookupArgs>(), 4096);
        assert_eq!(size_of::<SearchKey>(), 104);
        assert_eq!(size_of::<SearchArgs>(), 4096);
        assert_eq!(size_of::<QgroupAssignArgs>(), 24);
        assert_eq!(size_of::<QgroupCreateArgs>(), 16);
        assert_eq!(size_of::<QgroupLimitArgs>(), 48);
        // The numbers btrfs-progs uses.
        assert_eq!(IOC_SUBVOL_CREATE, 0x5000_940e);
        assert_eq!(IOC_SNAP_DESTROY, 0x5000_940f);
        assert_eq!(IOC_TREE_SEARCH, 0xd000_9411);
        assert_eq!(IOC_INO_LOOKUP, 0xd000_9412);
        assert_eq!(IOC_QGROUP_ASSIGN, 0x4018_9429);
        assert_eq!(IOC_QGROUP_CREATE, 0x4010_942a);
        assert_eq!(IOC_QGROUP_LIMIT, 0x8030_942b);
    }

    #[test]
    fn an_agent_group_is_level_one_by_uid() {
        assert_eq!(qgroup_name(agent_qgroup(61234)), "1/61234");
        assert_eq!(qgroup_name(257), "0/257");
    }
}
