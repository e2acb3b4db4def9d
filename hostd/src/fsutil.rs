//! File system steps that are atomic and refuse anything that is not ours: every write goes to
//! a pending name and is renamed into place, directories are synced after the rename, and
//! paths are checked with `lstat` so a symlink planted by someone else is refused, not followed.
//!
//! File writes are `clawfleet_protocol::atomic_file`'s steps (the coordinator writes its keys
//! and tokens the same way), taken one at a time here so each is counted (see [`counters`])
//! and a caller may change the owner before the rename.

use std::fs;
use std::io;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};

use clawfleet_protocol::atomic_file::{self, AtomicFileError, PENDING_INFIX, PendingFile};
use thiserror::Error;

/// Per-thread counts of the durable and mutating file system calls hostd makes: what the
/// fast-path tests assert to be zero for a no-op, and what the `fastpath` bench prints. Counted
/// per thread because an operation runs on one thread and tests run in parallel; an increment
/// is a thread-local add, nothing next to the call it counts.
pub mod counters {
    use std::cell::Cell;

    /// File system calls made on this thread since the last [`reset`].
    #[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
    pub struct IoCounts {
        /// `fsync` of a file or a directory.
        pub fsyncs: u64,
        /// `rename`.
        pub renames: u64,
        /// Other changes: files, directories, links and symlinks created or removed (not
        /// counting the pending file a rename moves into place).
        pub other: u64,
    }

    impl IoCounts {
        /// Nothing written at all.
        pub fn is_zero(&self) -> bool {
            *self == Self::default()
        }
    }

    thread_local! {
        static COUNTS: Cell<IoCounts> = const { Cell::new(IoCounts { fsyncs: 0, renames: 0, other: 0 }) };
    }

    /// The counts so far on this thread.
    pub fn get() -> IoCounts {
        COUNTS.with(Cell::get)
    }

    /// Starts counting from zero on this thread.
    pub fn reset() {
        COUNTS.with(|c| c.set(IoCounts::default()));
    }

    fn bump(f: impl FnOnce(&mut IoCounts)) {
        COUNTS.with(|c| {
            let mut v = c.get();
            f(&mut v);
            c.set(v);
        });
    }

    pub(crate) fn fsync() {
        bump(|c| c.fsyncs += 1);
    }

    pub(crate) fn rename() {
        bump(|c| c.renames += 1);
    }

    pub(crate) fn other() {
        bump(|c| c.other += 1);
    }
}

/// A file system step that failed or found something foreign.
#[derive(Debug, Error)]
pub enum FsError {
    #[error("{path}: {source}")]
    Io { path: String, source: io::Error },
    #[error("{path} is {found}, expected {expected}")]
    WrongType {
        path: String,
        found: &'static str,
        expected: &'static str,
    },
    #[error("{path} is {size} bytes; at most {max} are read")]
    TooLarge { path: String, size: u64, max: u64 },
}

/// Whether an I/O error says the file system is full or a quota is spent (ENOSPC, EDQUOT):
/// retryable once space is freed, unlike most other I/O failures (issue 26, N6).
pub fn is_no_space(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(code) if code == nix::libc::ENOSPC || code == nix::libc::EDQUOT
    ) || e.kind() == io::ErrorKind::StorageFull
        || e.kind() == io::ErrorKind::QuotaExceeded
}

impl From<AtomicFileError> for FsError {
    fn from(e: AtomicFileError) -> Self {
        match e {
            AtomicFileError::NotAFile { path, found } => FsError::WrongType {
                path: path.display().to_string(),
                found,
                expected: Kind::File.describe(),
            },
            AtomicFileError::Io { path, source, .. } => FsError::Io {
                path: path.display().to_string(),
                source,
            },
        }
    }
}

impl FsError {
    /// Whether this is a plain "does not exist".
    pub fn is_not_found(&self) -> bool {
        matches!(self, FsError::Io { source, .. } if source.kind() == io::ErrorKind::NotFound)
    }
}

/// Attaches the path to an I/O error.
pub fn io_err(path: &Path) -> impl FnOnce(io::Error) -> FsError + '_ {
    move |source| FsError::Io {
        path: path.display().to_string(),
        source,
    }
}

/// What a path is, without following symlinks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Missing,
    File,
    Dir,
    Symlink,
    Other,
}

impl Kind {
    fn describe(self) -> &'static str {
        match self {
            Kind::Missing => "missing",
            Kind::File => "a regular file",
            Kind::Dir => "a directory",
            Kind::Symlink => "a symlink",
            Kind::Other => "a special file",
        }
    }
}

/// `lstat` as a [`Kind`].
pub fn kind(path: &Path) -> Result<Kind, FsError> {
    match fs::symlink_metadata(path) {
        Ok(m) => {
            let t = m.file_type();
            Ok(if t.is_symlink() {
                Kind::Symlink
            } else if t.is_dir() {
                Kind::Dir
            } else if t.is_file() {
                Kind::File
            } else {
                Kind::Other
            })
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Kind::Missing),
        Err(e) => Err(io_err(path)(e)),
    }
}

pub(crate) fn wrong_type(path: &Path, found: Kind, expected: Kind) -> FsError {
    FsError::WrongType {
        path: path.display().to_string(),
        found: found.describe(),
        expected: expected.describe(),
    }
}

/// Requires `path` to be of kind `expected`.
pub fn expect_kind(path: &Path, expected: Kind) -> Result<(), FsError> {
    match kind(path)? {
        found if found == expected => Ok(()),
        found => Err(wrong_type(path, found, expected)),
    }
}

/// True if `path` is of kind `expected`, false if missing; anything else is an error.
fn exists_as(path: &Path, expected: Kind) -> Result<bool, FsError> {
    match kind(path)? {
        Kind::Missing => Ok(false),
        found if found == expected => Ok(true),
        found => Err(wrong_type(path, found, expected)),
    }
}

/// True if `path` is a real directory, false if missing; anything else is an error.
pub fn dir_exists(path: &Path) -> Result<bool, FsError> {
    exists_as(path, Kind::Dir)
}

/// True if `path` is a regular file, false if missing; anything else is an error.
pub fn file_exists(path: &Path) -> Result<bool, FsError> {
    exists_as(path, Kind::File)
}

/// Creates a directory with `mode` if it is missing (and syncs its parent, so the new
/// directory survives a power cut); an existing non-directory is an error.
pub fn ensure_dir(path: &Path, mode: u32) -> Result<bool, FsError> {
    if dir_exists(path)? {
        return Ok(false);
    }
    counters::other();
    match fs::DirBuilder::new().mode(mode).create(path) {
        Ok(()) => {
            set_mode(path, mode)?;
            sync_dir(parent(path))?;
            Ok(true)
        }
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
            expect_kind(path, Kind::Dir)?;
            Ok(false)
        }
        Err(e) => Err(io_err(path)(e)),
    }
}

/// Sets permission bits exactly (the umask does not apply).
pub fn set_mode(path: &Path, mode: u32) -> Result<(), FsError> {
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).map_err(io_err(path))
}

/// fsync a directory so a rename inside it is durable.
pub fn sync_dir(dir: &Path) -> Result<(), FsError> {
    counters::fsync();
    Ok(atomic_file::sync_dir(dir)?)
}

/// A sibling name for staging: `<name>.pending-<pid>-<random>`
/// (`clawfleet_protocol::atomic_file::pending_name`). Fails when the system's random source
/// does.
pub fn pending_name(target: &Path) -> Result<PathBuf, FsError> {
    Ok(atomic_file::pending_name(target)?)
}

fn parent(path: &Path) -> &Path {
    atomic_file::parent_dir(path)
}

/// Writes `bytes` to a new pending sibling of `target` (exclusive create with exactly
/// `mode`, which never follows a symlink), fsyncs it when `durable` and runs `prepare` (for
/// chown). The pending file is removed when it is dropped without being moved into place, so
/// on every failure.
fn write_pending(
    target: &Path,
    bytes: &[u8],
    mode: u32,
    durable: bool,
    prepare: impl FnOnce(&Path) -> Result<(), FsError>,
) -> Result<PendingFile, FsError> {
    let mut pending = PendingFile::create(target, mode)?;
    pending.write_all(bytes)?;
    if durable {
        counters::fsync();
        pending.sync()?;
    }
    prepare(pending.path())?;
    Ok(pending)
}

/// Writes a file atomically with `mode`: a pending file (see [`write_pending`]) renamed over
/// the target, then the directory synced. A target that exists but is not a regular file is
/// refused before anything is written.
pub fn write_atomic(
    target: &Path,
    bytes: &[u8],
    mode: u32,
    prepare: impl FnOnce(&Path) -> Result<(), FsError>,
) -> Result<(), FsError> {
    file_exists(target)?;
    let pending = write_pending(target, bytes, mode, true, prepare)?;
    counters::rename();
    pending.rename_into_place()?;
    sync_dir(parent(target))
}

/// Overwrites a regular file that holds exactly `bytes.len()` bytes in place, from its first
/// byte, and syncs its data: one `fdatasync`, no new file, no rename, no directory sync. For
/// a fixed-size record within one 512-byte sector: a device writes a sector whole, so a power
/// cut leaves the old record or the new one. `Ok(false)`, with nothing written, when the file
/// is missing or has another size (write it with [`write_atomic`] then). Never follows a
/// symlink.
pub fn overwrite_record(path: &Path, bytes: &[u8]) -> Result<bool, FsError> {
    use std::os::unix::fs::{FileExt, OpenOptionsExt};
    let file = match fs::OpenOptions::new()
        .write(true)
        .custom_flags(nix::fcntl::OFlag::O_NOFOLLOW.bits())
        .open(path)
    {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(io_err(path)(e)),
    };
    let meta = file.metadata().map_err(io_err(path))?;
    if !meta.is_file() || meta.len() != bytes.len() as u64 {
        return Ok(false);
    }
    file.write_all_at(bytes, 0).map_err(io_err(path))?;
    counters::fsync();
    file.sync_data().map_err(io_err(path))?;
    Ok(true)
}

/// Like [`write_atomic`] (readers see the old or the new file, never a mix) but without
/// fsync: for records whose loss in a power cut only makes them older, such as the step a
/// running operation last reported.
pub fn replace_quickly(target: &Path, bytes: &[u8], mode: u32) -> Result<(), FsError> {
    file_exists(target)?;
    let pending = write_pending(target, bytes, mode, false, |_| Ok(()))?;
    counters::rename();
    Ok(pending.rename_into_place()?)
}

/// Creates a file with `mode` only if it does not exist yet (never replaces): returns false
/// when the file already existed.
pub fn create_once(
    target: &Path,
    bytes: &[u8],
    mode: u32,
    prepare: impl FnOnce(&Path) -> Result<(), FsError>,
) -> Result<bool, FsError> {
    if file_exists(target)? {
        return Ok(false);
    }
    let pending = write_pending(target, bytes, mode, true, prepare)?;
    // link(2) fails if the target appeared meanwhile: never replace.
    counters::other();
    if !pending.link_into_place()? {
        return Ok(false);
    }
    sync_dir(parent(target))?;
    Ok(true)
}

/// Builds a directory completely under a pending name, then renames it into place, so the
/// target is either absent or complete. Returns false if the target already existed.
pub fn create_dir_atomic(
    target: &Path,
    mode: u32,
    build: impl FnOnce(&Path) -> Result<(), FsError>,
) -> Result<bool, FsError> {
    if dir_exists(target)? {
        return Ok(false);
    }
    let pending = pending_name(target)?;
    counters::other();
    let result = (|| {
        fs::DirBuilder::new()
            .mode(mode)
            .create(&pending)
            .map_err(io_err(&pending))?;
        set_mode(&pending, mode)?;
        build(&pending)?;
        sync_dir(&pending)?;
        counters::rename();
        fs::rename(&pending, target).map_err(io_err(target))?;
        sync_dir(parent(target))
    })();
    if result.is_err() {
        let _ = fs::remove_dir_all(&pending);
    }
    result.map(|()| true)
}

/// Reads a small regular file (never through a symlink).
pub fn read_small(path: &Path, max: u64) -> Result<Vec<u8>, FsError> {
    expect_kind(path, Kind::File)?;
    let meta = fs::symlink_metadata(path).map_err(io_err(path))?;
    if meta.len() > max {
        return Err(FsError::TooLarge {
            path: path.display().to_string(),
            size: meta.len(),
            max,
        });
    }
    fs::read(path).map_err(io_err(path))
}

/// Removes a file (or a symlink, never followed) if present, and syncs its directory so the
/// removal is durable; a directory or special file is refused.
pub fn remove_file_if_present(path: &Path) -> Result<bool, FsError> {
    match kind(path)? {
        Kind::Missing => Ok(false),
        Kind::File | Kind::Symlink => {
            counters::other();
            match fs::remove_file(path) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
                Err(e) => return Err(io_err(path)(e)),
            }
            sync_dir(parent(path))?;
            Ok(true)
        }
        other => Err(wrong_type(path, other, Kind::File)),
    }
}

/// Points the symlink `link` at `target` atomically (pending symlink, rename, dir fsync).
pub fn replace_symlink(link: &Path, target: &Path) -> Result<(), FsError> {
    let pending = pending_name(link)?;
    counters::other();
    std::os::unix::fs::symlink(target, &pending).map_err(io_err(&pending))?;
    counters::rename();
    if let Err(e) = fs::rename(&pending, link) {
        let _ = fs::remove_file(&pending);
        return Err(io_err(link)(e));
    }
    sync_dir(parent(link))
}

/// Entry names of a directory, sorted, skipping our own pending leftovers.
pub fn list_dir(path: &Path) -> Result<Vec<String>, FsError> {
    let mut names = Vec::new();
    for entry in fs::read_dir(path).map_err(io_err(path))? {
        let entry = entry.map_err(io_err(path))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.contains(PENDING_INFIX) {
            names.push(name);
        }
    }
    names.sort();
    Ok(names)
}

/// Calls `f` with each name in a directory, as [`list_dir`] lists them (pending names left
/// out), in no order and without collecting them: for directories that can hold many
/// thousands of files.
pub fn for_each_name(path: &Path, mut f: impl FnMut(&str)) -> Result<(), FsError> {
    for entry in fs::read_dir(path).map_err(io_err(path))? {
        let entry = entry.map_err(io_err(path))?;
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if !name.contains(PENDING_INFIX) {
            f(&name);
        }
    }
    Ok(())
}

/// Our own pending leftovers (from a killed run) in a directory; a missing or unreadable
/// directory has none.
pub fn pending_leftovers(path: &Path) -> Vec<PathBuf> {
    let Ok(entries) = fs::read_dir(path) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().contains(PENDING_INFIX))
        .map(|e| e.path())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    #[test]
    fn pending_leftovers_are_invisible_to_listings_and_found_for_sweeping() {
        let dir = tempfile::tempdir().unwrap();
        fs::create_dir_all(dir.path().join("u.pending-1-2/x")).unwrap();
        fs::write(dir.path().join("f"), b"x").unwrap();
        assert_eq!(list_dir(dir.path()).unwrap(), vec!["f"]);
        assert_eq!(
            pending_leftovers(dir.path()),
            vec![dir.path().join("u.pending-1-2")]
        );
        assert!(pending_leftovers(&dir.path().join("missing")).is_empty());
    }

    #[test]
    fn atomic_write_replaces_files_and_refuses_symlinks() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("a.json");
        write_atomic(&f, b"one", 0o600, |_| Ok(())).unwrap();
        write_atomic(&f, b"two", 0o640, |_| Ok(())).unwrap();
        assert_eq!(fs::read(&f).unwrap(), b"two");
        assert_eq!(fs::metadata(&f).unwrap().mode() & 0o777, 0o640);
        let link = dir.path().join("l");
        std::os::unix::fs::symlink("/etc/passwd", &link).unwrap();
        assert!(matches!(
            write_atomic(&link, b"x", 0o600, |_| Ok(())),
            Err(FsError::WrongType { .. })
        ));
        assert_eq!(list_dir(dir.path()).unwrap(), vec!["a.json", "l"]);
    }

    #[test]
    fn each_write_counts_its_durable_steps() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("m.json");
        let counted = |step: &dyn Fn()| {
            counters::reset();
            step();
            counters::get()
        };
        let io = counters::IoCounts {
            fsyncs: 2,
            renames: 1,
            other: 0,
        };
        assert_eq!(
            counted(&|| write_atomic(&f, b"1", 0o600, |_| Ok(())).unwrap()),
            io,
            "write_atomic: the file and its directory synced, one rename"
        );
        assert_eq!(
            counted(&|| replace_quickly(&f, b"2", 0o600).unwrap()),
            counters::IoCounts {
                fsyncs: 0,
                renames: 1,
                other: 0
            }
        );
        let once = dir.path().join("once");
        assert_eq!(
            counted(&|| assert!(create_once(&once, b"3", 0o600, |_| Ok(())).unwrap())),
            counters::IoCounts {
                fsyncs: 2,
                renames: 0,
                other: 1
            }
        );
        // The prepare hook sees the pending file; its failure leaves nothing behind.
        let failed = write_atomic(&f, b"4", 0o600, |p| {
            assert!(p.to_string_lossy().contains(PENDING_INFIX));
            Err(io_err(p)(io::Error::other("refused by the test")))
        });
        assert!(failed.is_err());
        assert_eq!(fs::read(&f).unwrap(), b"2");
        assert!(pending_leftovers(dir.path()).is_empty());
    }

    #[test]
    fn create_once_never_replaces() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("secret");
        assert!(create_once(&f, b"first", 0o600, |_| Ok(())).unwrap());
        assert!(!create_once(&f, b"second", 0o600, |_| Ok(())).unwrap());
        assert_eq!(fs::read(&f).unwrap(), b"first");
        assert_eq!(list_dir(dir.path()).unwrap(), vec!["secret"]);
    }

    #[test]
    fn atomic_dirs_appear_complete_or_not_at_all() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().join("rev");
        let failed = create_dir_atomic(&d, 0o750, |p| {
            fs::write(p.join("x"), b"1").map_err(io_err(p))?;
            Err(FsError::WrongType {
                path: "x".into(),
                found: "a test",
                expected: "success",
            })
        });
        assert!(failed.is_err());
        assert_eq!(kind(&d).unwrap(), Kind::Missing);
        assert!(
            list_dir(dir.path()).unwrap().is_empty(),
            "pending dir left behind"
        );
        assert!(
            create_dir_atomic(&d, 0o750, |p| fs::write(p.join("x"), b"1")
                .map_err(io_err(p)))
            .unwrap()
        );
        assert!(!create_dir_atomic(&d, 0o750, |_| Ok(())).unwrap());
        assert_eq!(fs::read(d.join("x")).unwrap(), b"1");
    }

    #[test]
    fn symlink_flip_is_atomic_and_kinds_do_not_follow_links() {
        let dir = tempfile::tempdir().unwrap();
        let link = dir.path().join("current");
        replace_symlink(&link, Path::new("revisions/a")).unwrap();
        replace_symlink(&link, Path::new("revisions/b")).unwrap();
        assert_eq!(fs::read_link(&link).unwrap(), PathBuf::from("revisions/b"));
        assert_eq!(kind(&link).unwrap(), Kind::Symlink);
        assert!(dir_exists(&link).is_err());
        assert!(read_small(&link, 10).is_err());
    }

    #[test]
    fn read_small_is_bounded() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("big");
        fs::write(&f, vec![b'x'; 100]).unwrap();
        assert!(matches!(read_small(&f, 10), Err(FsError::TooLarge { .. })));
        assert_eq!(read_small(&f, 100).unwrap().len(), 100);
    }
}
