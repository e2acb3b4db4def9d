//! Removal of directory trees an Agent may have filled with anything (issue 11): a chain of
//! directories thousands of levels deep, symlinks to `/etc`, a directory it keeps writing into.
//!
//! A tree is first renamed atomically into its own entry of the trash area (`<state root>/trash/
//! <random>/tree`), so from that moment it is gone from its real name whatever happens next; the
//! rename and both parents are synced. Then it is deleted by a walk that holds at most two open
//! directories (four descriptors) whatever the depth: every subdirectory found is moved up into
//! the trash entry itself, the directory emptied of everything else and removed, and the moved
//! children are handled the same way, until the entry is empty. Nothing is ever followed: links
//! are unlinked, a directory is opened only with `O_NOFOLLOW | O_DIRECTORY`, and another file
//! system (a mount point inside the tree) is refused instead of entered.
//!
//! A removal holds a `flock` on its trash entry. A killed removal leaves an unlocked entry,
//! which [`Trash::finish`] (run before every changing operation) deletes; entries another
//! process is still removing are left to it.

use std::ffi::{CStr, OsStr};
use std::fs::{File, TryLockError};
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use nix::dir::{Dir, Type};
use nix::errno::Errno;
use nix::fcntl::{OFlag, RenameFlags, openat, renameat2};
use nix::sys::stat::{FileStat, Mode, SFlag, fstat, fstatat};
use nix::unistd::{UnlinkatFlags, unlinkat};

use crate::fsutil::{self, FsError};

/// The name a tree has inside its trash entry.
const TREE: &str = "tree";

/// How often one directory may turn out non-empty again after it was emptied (something still
/// writes into it) before the removal gives up and leaves it to a retry.
const MAX_REFILLS: u32 = 1000;

/// The trash area of one state root.
#[derive(Debug, Clone)]
pub struct Trash {
    dir: PathBuf,
}

/// A tree moved into its own trash entry and not deleted yet; the entry stays locked (so no
/// other process deletes it meanwhile) until [`Moved::delete`] or drop.
#[derive(Debug)]
#[must_use = "a moved tree is deleted by Moved::delete (or left for Trash::finish)"]
pub struct Moved {
    trash: Trash,
    path: PathBuf,
    entry: File,
}

impl Moved {
    /// The trash entry that holds the tree.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Deletes the tree and its entry with the bounded walk.
    pub fn delete(self) -> Result<(), FsError> {
        #[cfg(test)]
        BEFORE_DELETE.with(|f| {
            if let Some(f) = f.borrow_mut().as_mut() {
                f(&self.path);
            }
        });
        self.trash.delete_entry(&self.path, &self.entry)
    }
}

#[cfg(test)]
thread_local! {
    /// Called (in tests) when a moved tree's deletion starts, with its entry: engine tests
    /// check there which locks are still held.
    #[allow(clippy::type_complexity)]
    pub(crate) static BEFORE_DELETE: std::cell::RefCell<Option<Box<dyn FnMut(&Path)>>> =
        std::cell::RefCell::new(None);
}

fn errno_err(path: &Path, e: Errno) -> FsError {
    fsutil::io_err(path)(io::Error::from(e))
}

fn open_dir_at(parent: impl AsFd, name: &CStr) -> Result<OwnedFd, Errno> {
    openat(
        parent,
        name,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
}

fn is_dot(name: &CStr) -> bool {
    matches!(name.to_bytes(), b"." | b"..")
}

fn is_dir(st: &FileStat) -> bool {
    SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT == SFlag::S_IFDIR
}

impl Trash {
    /// The trash area `dir` (normally `<state root>/trash`), created when first needed.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self { dir: dir.into() }
    }

    /// Where the trash is.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Entries in the trash (removals in progress or left by a killed one).
    pub fn entries(&self) -> Result<Vec<String>, FsError> {
        if !fsutil::dir_exists(&self.dir)? {
            return Ok(Vec::new());
        }
        let mut names = Vec::new();
        for entry in std::fs::read_dir(&self.dir).map_err(fsutil::io_err(&self.dir))? {
            let entry = entry.map_err(fsutil::io_err(&self.dir))?;
            names.push(entry.file_name().to_string_lossy().into_owned());
        }
        names.sort();
        Ok(names)
    }

    /// Removes the directory tree at `path` if present: renames it into a trash entry of its own
    /// (atomic, synced), then deletes it there. Returns false when nothing was there; anything
    /// but a directory (a symlink included) is refused and left alone.
    pub fn remove_tree(&self, path: &Path) -> Result<bool, FsError> {
        match self.move_aside(path)? {
            Some(moved) => moved.delete().map(|()| true),
            None => Ok(false),
        }
    }

    /// The first half of [`Trash::remove_tree`]: renames the tree at `path` into a fresh,
    /// locked trash entry (the rename and both parents synced) and returns it, for the caller
    /// to delete with [`Moved::delete`] once it holds no lock another operation may wait for
    /// (a tree of 400,000 files takes seconds to delete). Until then the entry stays locked,
    /// so [`Trash::finish`] leaves it alone; dropped without `delete` (a killed or failed
    /// run), it is an ordinary leftover that the next changing operation finishes. `None`
    /// when nothing was there; anything but a directory is refused and left alone.
    pub fn move_aside(&self, path: &Path) -> Result<Option<Moved>, FsError> {
        match fsutil::kind(path)? {
            fsutil::Kind::Missing => return Ok(None),
            fsutil::Kind::Dir => {}
            other => return Err(fsutil::wrong_type(path, other, fsutil::Kind::Dir)),
        }
        let (entry_path, entry) = loop {
            let (entry_path, entry) = self.new_entry()?;
            fsutil::counters::rename();
            match std::fs::rename(path, entry_path.join(TREE)) {
                Ok(()) => break (entry_path, entry),
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    // Either the tree went (someone else removed it) or our fresh entry did
                    // (a finisher took it while it was empty, before we locked it).
                    if fsutil::kind(path)? == fsutil::Kind::Missing {
                        let _ = std::fs::remove_dir(&entry_path);
                        return Ok(None);
                    }
                }
                Err(e) => {
                    let _ = std::fs::remove_dir(&entry_path);
                    return Err(fsutil::io_err(path)(e));
                }
            }
        };
        // From here the tree is gone from its real name, durably.
        fsutil::sync_dir(path.parent().unwrap_or(Path::new("/")))?;
        fsutil::sync_dir(&entry_path)?;
        crate::fault::point("after-trash-rename");
        Ok(Some(Moved {
            trash: self.clone(),
            path: entry_path,
            entry,
        }))
    }

    /// Makes a fresh, locked, empty trash entry.
    fn new_entry(&self) -> Result<(PathBuf, File), FsError> {
        if fsutil::ensure_dir(&self.dir, 0o700)? {
            fsutil::sync_dir(self.dir.parent().unwrap_or(Path::new("/")))?;
        }
        loop {
            let name = clawfleet_protocol::random::hex(8)
                .map_err(|e| fsutil::io_err(&self.dir)(io::Error::other(e)))?;
            let path = self.dir.join(&name);
            match std::fs::DirBuilder::new().create(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(fsutil::io_err(&path)(e)),
            }
            let Some(entry) = lock_entry(&self.dir, &name)? else {
                continue;
            };
            // A finisher may have removed the entry between mkdir and our lock.
            if fstat(&entry).map_err(|e| errno_err(&path, e))?.st_nlink == 0 {
                continue;
            }
            return Ok((path, entry));
        }
    }

    /// Deletes every trash entry that nobody is removing now (left by a killed removal).
    /// Returns how many it deleted.
    pub fn finish(&self) -> Result<usize, FsError> {
        let mut done = 0;
        for name in self.entries()? {
            let path = self.dir.join(&name);
            match fsutil::kind(&path)? {
                fsutil::Kind::Dir => {}
                fsutil::Kind::Missing => continue,
                // Not something hostd makes here: remove the name, never follow it.
                _ => {
                    fsutil::remove_file_if_present(&path)?;
                    continue;
                }
            }
            let Some(entry) = lock_entry(&self.dir, &name)? else {
                continue;
            };
            tracing::info!(entry = %path.display(), "finishing a removal left in the trash");
            self.delete_entry(&path, &entry)?;
            done += 1;
        }
        Ok(done)
    }

    /// Empties a locked trash entry with the bounded walk and removes it.
    fn delete_entry(&self, path: &Path, entry: &File) -> Result<(), FsError> {
        let token = clawfleet_protocol::random::hex(4)
            .map_err(|e| fsutil::io_err(path)(io::Error::other(e)))?;
        let mut walk = Walk {
            root: entry.as_fd(),
            root_path: path,
            root_dev: fstat(entry).map_err(|e| errno_err(path, e))?.st_dev,
            token,
            moved: 0,
            entry: None,
        };
        walk.empty_root()?;
        let name = path.file_name().unwrap_or(OsStr::new(""));
        match std::fs::remove_dir(self.dir.join(name)) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(fsutil::io_err(path)(e)),
        }
        fsutil::sync_dir(&self.dir)
    }
}

/// Opens and try-locks the trash entry `name`; `None` when another process holds it (or it
/// is gone).
fn lock_entry(trash: &Path, name: &str) -> Result<Option<File>, FsError> {
    let path = trash.join(name);
    let trash_dir = match File::open(trash) {
        Ok(f) => f,
        Err(e) => return Err(fsutil::io_err(trash)(e)),
    };
    let c = std::ffi::CString::new(name.as_bytes())
        .map_err(|e| fsutil::io_err(&path)(io::Error::new(io::ErrorKind::InvalidInput, e)))?;
    let fd = match open_dir_at(&trash_dir, &c) {
        Ok(fd) => fd,
        Err(Errno::ENOENT) => return Ok(None),
        Err(e) => return Err(errno_err(&path, e)),
    };
    let file = File::from(fd);
    match file.try_lock() {
        Ok(()) => Ok(Some(file)),
        Err(TryLockError::WouldBlock) => Ok(None),
        Err(TryLockError::Error(e)) => Err(fsutil::io_err(&path)(e)),
    }
}

/// One bounded walk inside a trash entry.
struct Walk<'a> {
    root: std::os::fd::BorrowedFd<'a>,
    root_path: &'a Path,
    root_dev: u64,
    /// Prefix of the names subdirectories get when moved up into the entry.
    token: String,
    moved: u64,
    /// The trash entry, when this walk empties a btrfs subvolume found in it (`root` is the
    /// subvolume then): subvolumes nested in it are moved up into the entry, never entered.
    entry: Option<std::os::fd::BorrowedFd<'a>>,
}

impl Walk<'_> {
    fn err(&self, what: &CStr, e: Errno) -> FsError {
        errno_err(&self.root_path.join(OsStr::from_bytes(what.to_bytes())), e)
    }

    /// Passes over the entry until it is empty: each child is removed (a file or link) or
    /// emptied of its files, its subdirectories moved up here, and then removed.
    fn empty_root(&mut self) -> Result<(), FsError> {
        // Every pass removes every child it sees; new children appear only by our own moves,
        // so the passes end when the tree is gone.
        loop {
            // A fresh descriptor of "." each pass: the stream starts from the beginning.
            let mut dir = Dir::openat(
                self.root,
                c".",
                OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
                Mode::empty(),
            )
            .map_err(|e| errno_err(self.root_path, e))?;
            let mut seen = false;
            for entry in dir.iter() {
                let entry = entry.map_err(|e| errno_err(self.root_path, e))?;
                let name = entry.file_name();
                if is_dot(name) {
                    continue;
                }
                seen = true;
                let name = name.to_owned();
                self.remove_child(&name, entry.file_type())?;
            }
            if !seen {
                return Ok(());
            }
        }
    }

    /// Removes `name` (a child of the entry) if it is not a directory; otherwise unlinks its
    /// files, moves its subdirectories up into the entry, and removes it.
    fn remove_child(&mut self, name: &CStr, hint: Option<Type>) -> Result<(), FsError> {
        let is_directory = match hint {
            Some(Type::Directory) => true,
            Some(_) => false,
            None => match fstatat(self.root, name, nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW) {
                Ok(st) => is_dir(&st),
                Err(Errno::ENOENT) => return Ok(()),
                Err(e) => return Err(self.err(name, e)),
            },
        };
        if !is_directory {
            return match unlinkat(self.root, name, UnlinkatFlags::NoRemoveDir) {
                Ok(()) | Err(Errno::ENOENT) => Ok(()),
                // It became a directory meanwhile: the next pass handles it.
                Err(Errno::EISDIR) => Ok(()),
                Err(e) => Err(self.err(name, e)),
            };
        }
        let mut refills = 0;
        loop {
            let fd = match open_dir_at(self.root, name) {
                Ok(fd) => fd,
                Err(Errno::ENOENT) => return Ok(()),
                // Not a directory any more (a link or file put in its place): unlink the name.
                Err(Errno::ELOOP | Errno::ENOTDIR) => {
                    return match unlinkat(self.root, name, UnlinkatFlags::NoRemoveDir) {
                        Ok(()) | Err(Errno::ENOENT) => Ok(()),
                        Err(e) => Err(self.err(name, e)),
                    };
                }
                Err(e) => return Err(self.err(name, e)),
            };
            let st = fstat(&fd).map_err(|e| self.err(name, e))?;
            if st.st_dev != self.root_dev {
                // A btrfs subvolume (an Agent's home or state on a state root with btrfs
                // quotas, or one it made) is part of the tree; a mount point is not.
                if crate::quota::btrfs::is_subvolume(fd.as_fd())
                    .map_err(|e| fsutil::io_err(&self.path_of(name))(e))?
                {
                    return self.remove_subvolume(name, fd, st.st_dev);
                }
                return Err(FsError::Io {
                    path: self
                        .root_path
                        .join(OsStr::from_bytes(name.to_bytes()))
                        .display()
                        .to_string(),
                    source: io::Error::other(
                        "another file system is mounted here; hostd never removes across a mount",
                    ),
                });
            }
            self.empty_dir(&fd, name)?;
            drop(fd);
            match unlinkat(self.root, name, UnlinkatFlags::RemoveDir) {
                Ok(()) | Err(Errno::ENOENT) => return Ok(()),
                Err(Errno::ENOTEMPTY | Errno::EEXIST) if refills < MAX_REFILLS => refills += 1,
                Err(e) => return Err(self.err(name, e)),
            }
        }
    }

    fn path_of(&self, name: &CStr) -> PathBuf {
        self.root_path.join(OsStr::from_bytes(name.to_bytes()))
    }

    /// Removes the btrfs subvolume `name` (open as `fd`, on device `dev`), a child of the
    /// walk's root. In the entry itself it is destroyed at once (`BTRFS_IOC_SNAP_DESTROY`,
    /// the file system's cleaner frees its space, and its level-0 quota group goes with it);
    /// where that is refused (it holds subvolumes of its own, or hostd lacks
    /// `CAP_SYS_ADMIN`) it is emptied by a walk of its own, which moves nested subvolumes up
    /// into the entry, and removed with `rmdir`, which the kernel allows for an empty
    /// subvolume. Inside a subvolume's walk it is moved up into the entry, for the entry's
    /// walk to remove: so at most two subvolumes are open at a time, whatever the nesting.
    fn remove_subvolume(&mut self, name: &CStr, fd: OwnedFd, dev: u64) -> Result<(), FsError> {
        if let Some(entry) = self.entry {
            drop(fd);
            return self.move_into(self.root, name, entry);
        }
        match crate::quota::btrfs::destroy_subvolume(self.root, name) {
            Ok(()) => return Ok(()),
            Err(e) if e.raw_os_error() == Some(nix::libc::ENOENT) => return Ok(()),
            Err(e) => {
                tracing::debug!(subvolume = %self.path_of(name).display(), "subvolume not destroyed at once ({e}); emptying it first");
            }
        }
        let path = self.path_of(name);
        let mut inner = Walk {
            root: fd.as_fd(),
            root_path: &path,
            root_dev: dev,
            token: format!("{}-s", self.token),
            moved: 0,
            entry: Some(self.root),
        };
        inner.empty_root()?;
        drop(fd);
        match unlinkat(self.root, name, UnlinkatFlags::RemoveDir) {
            Ok(()) | Err(Errno::ENOENT) => Ok(()),
            Err(e) => Err(self.err(name, e)),
        }
    }

    /// Moves `name` of `from` into `to` under a fresh name (never replacing anything there).
    fn move_into(
        &mut self,
        from: std::os::fd::BorrowedFd<'_>,
        name: &CStr,
        to: std::os::fd::BorrowedFd<'_>,
    ) -> Result<(), FsError> {
        loop {
            self.moved += 1;
            let fresh =
                std::ffi::CString::new(format!("{}-v{}", self.token, self.moved)).map_err(|e| {
                    fsutil::io_err(self.root_path)(io::Error::new(io::ErrorKind::InvalidInput, e))
                })?;
            match renameat2(
                from,
                name,
                to,
                fresh.as_c_str(),
                RenameFlags::RENAME_NOREPLACE,
            ) {
                Ok(()) | Err(Errno::ENOENT) => return Ok(()),
                Err(Errno::EEXIST) => continue,
                Err(e) => return Err(self.err(name, e)),
            }
        }
    }

    /// Unlinks every non-directory in `dir` and moves every subdirectory up into the entry
    /// under a fresh name (never replacing anything there).
    fn empty_dir(&mut self, dir: &OwnedFd, dir_name: &CStr) -> Result<(), FsError> {
        let names_fd = dir.try_clone().map_err(fsutil::io_err(self.root_path))?;
        let mut names = Dir::from_fd(names_fd).map_err(|e| self.err(dir_name, e))?;
        for entry in names.iter() {
            let entry = entry.map_err(|e| self.err(dir_name, e))?;
            let name = entry.file_name();
            if is_dot(name) {
                continue;
            }
            let directory = match entry.file_type() {
                Some(t) => t == Type::Directory,
                None => match fstatat(dir, name, nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW) {
                    Ok(st) => is_dir(&st),
                    Err(Errno::ENOENT) => continue,
                    Err(e) => return Err(self.err(dir_name, e)),
                },
            };
            if !directory {
                match unlinkat(dir, name, UnlinkatFlags::NoRemoveDir) {
                    Ok(()) | Err(Errno::ENOENT | Errno::EISDIR) => {}
                    Err(e) => return Err(self.err(dir_name, e)),
                }
                continue;
            }
            loop {
                self.moved += 1;
                let to = std::ffi::CString::new(format!("{}-{}", self.token, self.moved)).map_err(
                    |e| {
                        fsutil::io_err(self.root_path)(io::Error::new(
                            io::ErrorKind::InvalidInput,
                            e,
                        ))
                    },
                )?;
                match renameat2(
                    dir,
                    name,
                    self.root,
                    to.as_c_str(),
                    RenameFlags::RENAME_NOREPLACE,
                ) {
                    Ok(()) | Err(Errno::ENOENT) => break,
                    Err(Errno::EEXIST) => continue,
                    Err(e) => return Err(self.err(dir_name, e)),
                }
            }
        }
        Ok(())
    }
}

/// Builds a chain of `depth` directories `d/d/d/…` under `top` (through descriptors, since
/// its path is far longer than `PATH_MAX`) and returns the deepest one's descriptor.
#[cfg(test)]
pub(crate) fn deep_chain(top: &Path, depth: usize) -> OwnedFd {
    let mut fd: OwnedFd = File::open(top).unwrap_or_else(|e| panic!("{e}")).into();
    for _ in 0..depth {
        nix::sys::stat::mkdirat(&fd, c"d", Mode::from_bits_truncate(0o755))
            .unwrap_or_else(|e| panic!("mkdirat: {e}"));
        fd = open_dir_at(&fd, c"d").unwrap_or_else(|e| panic!("openat: {e}"));
    }
    fd
}

/// Runs the ignored test `test` of this test binary in a child process whose descriptor limit
/// is `nofile` (`prlimit`, util-linux), with `HOSTD_TRASH_TEST_DIR` set to `dir`; fails unless
/// it passed.
#[cfg(test)]
pub(crate) fn rerun_with_descriptor_limit(test: &str, nofile: u32, dir: &Path) {
    let exe = std::env::current_exe().unwrap_or_else(|e| panic!("{e}"));
    let out = std::process::Command::new("prlimit")
        .arg(format!("--nofile={nofile}:{nofile}"))
        .arg(&exe)
        .args([
            test,
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("HOSTD_TRASH_TEST_DIR", dir)
        .output()
        .unwrap_or_else(|e| panic!("prlimit (util-linux) does not run: {e}"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    println!("{text}");
    assert!(out.status.success(), "{text}");
    assert!(text.contains("1 passed"), "{text}");
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use std::os::unix::fs::symlink;

    fn tree_with_everything(at: &Path, outside: &Path) {
        std::fs::create_dir_all(at.join("home/.ssh")).unwrap();
        std::fs::write(at.join("home/.ssh/authorized_keys"), b"k").unwrap();
        symlink("/etc", at.join("home/etc-link")).unwrap();
        symlink(outside, at.join("home/outside-link")).unwrap();
        symlink(outside.join("f"), at.join("home/outside-file-link")).unwrap();
        std::fs::create_dir_all(at.join("state/wide")).unwrap();
        for i in 0..300 {
            std::fs::write(at.join(format!("state/wide/f{i}")), b"x").unwrap();
            std::fs::create_dir(at.join(format!("state/wide/d{i}"))).unwrap();
        }
        nix::unistd::mkfifo(&at.join("state/fifo"), Mode::from_bits_truncate(0o600)).unwrap();
        let leaf = deep_chain(&at.join("state"), 500);
        // Something at the bottom, and a link back up the chain.
        nix::unistd::symlinkat(outside, &leaf, c"up").unwrap();
    }

    fn outside_dir(root: &Path) -> PathBuf {
        let outside = root.join("outside");
        std::fs::create_dir_all(outside.join("sub")).unwrap();
        std::fs::write(outside.join("f"), b"keep").unwrap();
        outside
    }

    fn assert_outside_intact(outside: &Path) {
        assert_eq!(std::fs::read(outside.join("f")).unwrap(), b"keep");
        assert!(outside.join("sub").is_dir());
    }

    #[test]
    fn a_deep_tree_with_links_is_removed_without_following_them() {
        let root = tempfile::tempdir().unwrap();
        let outside = outside_dir(root.path());
        let agent = root.path().join("agents/a1");
        tree_with_everything(&agent, &outside);
        let trash = Trash::new(root.path().join("trash"));
        assert!(trash.remove_tree(&agent).unwrap());
        assert_eq!(fsutil::kind(&agent).unwrap(), fsutil::Kind::Missing);
        assert!(trash.entries().unwrap().is_empty(), "{:?}", trash.entries());
        assert_outside_intact(&outside);
        assert!(!trash.remove_tree(&agent).unwrap(), "absence is success");
    }

    #[test]
    fn links_and_files_are_refused_as_trees() {
        let root = tempfile::tempdir().unwrap();
        let outside = outside_dir(root.path());
        let link = root.path().join("link");
        symlink(&outside, &link).unwrap();
        let trash = Trash::new(root.path().join("trash"));
        assert!(matches!(
            trash.remove_tree(&link),
            Err(FsError::WrongType { .. })
        ));
        assert!(matches!(
            trash.remove_tree(&outside.join("f")),
            Err(FsError::WrongType { .. })
        ));
        assert_outside_intact(&outside);
        assert!(link.symlink_metadata().is_ok());
    }

    #[test]
    fn a_killed_removal_is_finished_and_a_live_one_is_left_alone() {
        let root = tempfile::tempdir().unwrap();
        let outside = outside_dir(root.path());
        let trash = Trash::new(root.path().join("trash"));
        // A removal killed after its rename, half way through the walk: a moved-up child
        // next to what is left of the tree.
        let killed = trash.dir().join("0123456789abcdef");
        tree_with_everything(&killed.join(TREE), &outside);
        std::fs::create_dir_all(killed.join("abcd-7/x/y")).unwrap();
        // A live one: its entry is locked by the removal running now.
        let (live_path, live_lock) = trash.new_entry().unwrap();
        std::fs::create_dir_all(live_path.join("tree/z")).unwrap();
        // And a stray link in the trash, which is unlinked, never followed.
        symlink(&outside, trash.dir().join("stray")).unwrap();

        assert_eq!(trash.finish().unwrap(), 1);
        let live_name = live_path
            .file_name()
            .unwrap()
            .to_string_lossy()
            .into_owned();
        assert_eq!(trash.entries().unwrap(), vec![live_name]);
        assert!(live_path.join("tree/z").is_dir());
        assert_outside_intact(&outside);
        drop(live_lock);
        assert_eq!(trash.finish().unwrap(), 1);
        assert!(trash.entries().unwrap().is_empty());
    }

    /// Run by [`descriptors_do_not_grow_with_depth`] in a child process whose descriptor
    /// limit is 64 (`prlimit`): std's recursive `remove_dir_all` runs out of descriptors on a
    /// 1,000-level chain there, the trash's walk does not.
    #[test]
    #[ignore = "run by descriptors_do_not_grow_with_depth under prlimit"]
    fn deep_chain_under_a_descriptor_limit() {
        let Some(root) = std::env::var_os("HOSTD_TRASH_TEST_DIR") else {
            return;
        };
        let root = PathBuf::from(root);
        let t0 = std::time::Instant::now();
        for name in ["std", "ours"] {
            drop(deep_chain(&root.join(name), 1000));
        }
        println!("chains built in {:?}", t0.elapsed());
        let t0 = std::time::Instant::now();
        let std_result = std::fs::remove_dir_all(root.join("std"));
        println!("std remove_dir_all: {std_result:?}");
        let trash = Trash::new(root.join("trash"));
        println!("std tried in {:?}", t0.elapsed());
        let t0 = std::time::Instant::now();
        let ours = trash.remove_tree(&root.join("ours"));
        println!("trash: {ours:?} in {:?}", t0.elapsed());
        assert!(ours.unwrap());
        assert!(!root.join("ours").exists());
        assert!(trash.entries().unwrap().is_empty());
        let e = std_result.expect_err("remove_dir_all should run out of descriptors");
        assert_eq!(e.raw_os_error(), Some(libc_emfile()), "{e}");
    }

    fn libc_emfile() -> i32 {
        Errno::EMFILE as i32
    }

    #[test]
    fn descriptors_do_not_grow_with_depth() {
        let root = tempfile::tempdir().unwrap();
        for name in ["std", "ours"] {
            std::fs::create_dir(root.path().join(name)).unwrap();
        }
        rerun_with_descriptor_limit(
            "trash::tests::deep_chain_under_a_descriptor_limit",
            64,
            root.path(),
        );
        assert!(!root.path().join("ours").exists());
    }
}
