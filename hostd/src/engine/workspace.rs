//! An Agent's initial workspace files, applied once inside `prepare-revision` before the
//! gateway first starts.
//!
//! Order: the setup request (root-owned, in the Agent directory) is recorded first, which arms
//! the unit's start guard ([`guard`], run by `hostd exec-gateway`); the files are built in a
//! root-owned staging tree, owned by the Agent, and fsynced; they move into the Agent-owned
//! workspace with `renameat2(RENAME_NOREPLACE)` relative to directory handles opened with
//! `O_NOFOLLOW`, so a link or special file the Agent planted is never followed and never
//! replaced; then the root-owned completion marker is written. Once that marker exists a
//! prepare never writes a workspace file again, so edits made in the live workspace stay.
//! Messages name files relative to the workspace, never their content.

use std::fs;
use std::io::{Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::Path;

use clawfleet_protocol::failure::{Failure, FailureCode};
use clawfleet_protocol::result::{Step, WorkspaceOutcome};
use clawfleet_protocol::workspace::{WORKSPACE_MAX_FILE_BYTES, WorkspaceFile, WorkspaceSetup};
use nix::errno::Errno;
use nix::fcntl::{AT_FDCWD, OFlag, RenameFlags, openat, renameat2};
use nix::sys::stat::{FileStat, Mode, SFlag, fstatat};

use super::{Ctx, Engine, fs_failure};
use crate::fsutil;
use crate::layout::{AgentPaths, WORKSPACE_APPLIED_FILE, WORKSPACE_REQUEST_FILE};
use crate::markers::{self, SCHEMA, WorkspaceAppliedMarker, WorkspaceRequestMarker};
use crate::system::Ids;

fn setup_failed(message: impl AsRef<str>) -> Failure {
    Failure::new(FailureCode::WorkspaceSetupFailed, message)
}

/// [`setup_failed`], or `NO_SPACE` (retryable once the Agent freed space in its share) when
/// `e` says the file system or the Agent's quota is full.
fn setup_failed_by(e: Errno, message: impl AsRef<str>) -> Failure {
    if matches!(e, Errno::ENOSPC | Errno::EDQUOT) {
        Failure::new(FailureCode::NoSpace, message)
    } else {
        setup_failed(message)
    }
}

/// Copies the staged entry `name` of `from` (`staged` is its lstat) into `to`, where a rename
/// cannot move it: the workspace is in another btrfs subvolume than the staging directory
/// (the Agent's `state` on a state root with btrfs quotas). Directories are made and filled
/// by the same merge; files are written anew (never through a link, never over anything),
/// fsynced, and given the staged owner.
fn copy_in(
    from: &OwnedFd,
    from_path: &Path,
    to: &OwnedFd,
    name: &str,
    staged: &FileStat,
    shown: &str,
) -> Result<(), Failure> {
    let fail = |e: Errno| {
        setup_failed_by(
            e,
            format!("cannot apply workspace file {shown}: {}", errno_text(e)),
        )
    };
    let owner = (
        Some(nix::unistd::Uid::from_raw(staged.st_uid)),
        Some(nix::unistd::Gid::from_raw(staged.st_gid)),
    );
    if is(staged, SFlag::S_IFDIR) {
        nix::sys::stat::mkdirat(to.as_fd(), name, Mode::from_bits_truncate(0o700)).map_err(fail)?;
        let sub_to = open_dir_at(to, name).map_err(fail)?;
        nix::unistd::fchown(sub_to.as_fd(), owner.0, owner.1).map_err(fail)?;
        let sub_from = open_dir_at(from, name).map_err(fail)?;
        merge(
            &sub_from,
            &from_path.join(name),
            &sub_to,
            &format!("{shown}/"),
        )?;
        return nix::unistd::fsync(sub_to.as_fd()).map_err(fail);
    }
    if !is(staged, SFlag::S_IFREG) {
        return Err(setup_failed(format!(
            "workspace file {shown}: the staged entry is {}",
            kind_text(staged)
        )));
    }
    let mut content = Vec::new();
    let source = openat(
        from.as_fd(),
        name,
        OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(fail)?;
    fs::File::from(source)
        .read_to_end(&mut content)
        .map_err(|e| fail(Errno::from_raw(e.raw_os_error().unwrap_or(libc_eio()))))?;
    let target = openat(
        to.as_fd(),
        name,
        OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::from_bits_truncate(0o600),
    )
    .map_err(fail)?;
    let mut file = fs::File::from(target);
    let io = |e: std::io::Error| fail(Errno::from_raw(e.raw_os_error().unwrap_or(libc_eio())));
    let written = nix::unistd::fchown(file.as_fd(), owner.0, owner.1)
        .map_err(fail)
        .and_then(|()| file.write_all(&content).map_err(io))
        .and_then(|()| file.sync_all().map_err(io));
    if written.is_err() {
        // The file is ours (O_EXCL): a partial one would make a retry (once the Agent freed
        // space) refuse it as "other content".
        drop(file);
        if let Err(e) =
            nix::unistd::unlinkat(to.as_fd(), name, nix::unistd::UnlinkatFlags::NoRemoveDir)
        {
            tracing::warn!("cannot remove the partial workspace file {shown}: {e}");
        }
    }
    written
}

fn libc_eio() -> i32 {
    Errno::EIO as i32
}

/// A sentence for an errno that never carries a path outside the Agent's tree.
fn errno_text(e: Errno) -> &'static str {
    match e {
        Errno::ENOSPC | Errno::EDQUOT => "no space left on the host",
        Errno::ELOOP => "a symbolic link is in the way",
        Errno::ENOTDIR => "something other than a directory is in the way",
        Errno::EEXIST => "something is already there",
        Errno::EACCES | Errno::EPERM => "permission denied",
        _ => "the file system refused the write",
    }
}

fn kind_text(st: &FileStat) -> &'static str {
    match SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits()) {
        SFlag::S_IFLNK => "a symbolic link",
        SFlag::S_IFDIR => "a directory",
        SFlag::S_IFREG => "a different file",
        SFlag::S_IFIFO => "a named pipe",
        SFlag::S_IFSOCK => "a socket",
        _ => "a device or other special file",
    }
}

fn is(st: &FileStat, kind: SFlag) -> bool {
    SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits()) == kind
}

/// `fstatat` without following a final link; `None` when nothing is there.
fn lstat_at(dir: &OwnedFd, name: &str) -> Result<Option<FileStat>, Errno> {
    match fstatat(dir.as_fd(), name, nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW) {
        Ok(st) => Ok(Some(st)),
        Err(Errno::ENOENT) => Ok(None),
        Err(e) => Err(e),
    }
}

fn open_dir_at(dir: &OwnedFd, name: &str) -> Result<OwnedFd, Errno> {
    openat(
        dir.as_fd(),
        name,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
}

/// Whether the regular file `name` in `dir` holds exactly `want` (read without following a
/// link, without blocking on a pipe, at most one byte more than the limit).
fn same_content(dir: &OwnedFd, name: &str, want: &[u8]) -> bool {
    let Ok(fd) = openat(
        dir.as_fd(),
        name,
        OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC,
        Mode::empty(),
    ) else {
        return false;
    };
    let mut have = Vec::new();
    let limit = (WORKSPACE_MAX_FILE_BYTES + 1) as u64;
    if fs::File::from(fd)
        .take(limit)
        .read_to_end(&mut have)
        .is_err()
    {
        return false;
    }
    have == want
}

impl Engine<'_> {
    /// Applies the Agent's initial workspace files unless the completion marker says they
    /// were applied. Runs under the Agent lock, after the Agent directory exists.
    pub(crate) fn setup_workspace(
        &self,
        ctx: &mut Ctx<'_>,
        paths: &AgentPaths,
        ids: Ids,
        setup: &WorkspaceSetup,
    ) -> Result<WorkspaceOutcome, Failure> {
        // `setup.check()` ran before the prepare changed anything (`Engine::prepare`).
        match fsutil::kind(&paths.workspace_applied).map_err(fs_failure)? {
            fsutil::Kind::File => return Ok(WorkspaceOutcome::AlreadyApplied),
            fsutil::Kind::Missing => {}
            _ => {
                return Err(setup_failed(format!(
                    "{WORKSPACE_APPLIED_FILE} in the Agent directory is not a regular file"
                )));
            }
        }
        ctx.step(Step::WorkspaceSetup)?;
        // The request first: from here on the unit's start guard refuses to start the
        // gateway until the completion marker exists.
        let request = WorkspaceRequestMarker {
            schema: SCHEMA,
            files: setup.manifest.clone(),
        };
        fsutil::create_once(
            &paths.workspace_request,
            &markers::to_bytes(&request),
            0o600,
            |_| Ok(()),
        )
        .map_err(fs_failure)?;
        let Some(files) = &setup.files else {
            return Err(setup_failed(
                "the Agent's initial workspace files were requested but not applied on this \
                 host, and the coordinator no longer holds them; the gateway stays stopped",
            ));
        };
        self.stage(paths, ids, files)?;
        let moved = self.move_into_workspace(paths);
        let _ = self.remove_tree(&paths.workspace_staging);
        moved?;
        let applied = WorkspaceAppliedMarker {
            schema: SCHEMA,
            applied_at: ctx.now_unix,
            files: setup.manifest.clone(),
        };
        fsutil::write_atomic(
            &paths.workspace_applied,
            &markers::to_bytes(&applied),
            0o600,
            |_| Ok(()),
        )
        .map_err(fs_failure)?;
        tracing::info!(
            operation_id = %ctx.operation_id,
            files = setup.manifest.len(),
            "initial workspace files applied"
        );
        Ok(WorkspaceOutcome::Applied)
    }

    /// Builds the workspace tree in the root-owned staging directory: directories 0700 and
    /// files 0600, owned by the Agent, every file fsynced.
    fn stage(&self, paths: &AgentPaths, ids: Ids, files: &[WorkspaceFile]) -> Result<(), Failure> {
        let root = &paths.workspace_staging;
        self.remove_tree(root)?;
        let io = |name: &str, e: std::io::Error| {
            let text = e
                .raw_os_error()
                .map_or("the file system refused the write", |n| {
                    errno_text(Errno::from_raw(n))
                });
            let message = format!("cannot stage workspace file {name}: {text}");
            match e.raw_os_error() {
                Some(n) => setup_failed_by(Errno::from_raw(n), message),
                None => setup_failed(message),
            }
        };
        fs::DirBuilder::new()
            .mode(0o700)
            .create(root)
            .map_err(|e| io("(the workspace)", e))?;
        let chown = |p: &Path, name: &str| {
            self.system.chown(p, ids).map_err(|e| {
                setup_failed(format!(
                    "cannot give workspace file {name} to the Agent: {e}"
                ))
            })
        };
        for file in files {
            let name = file.name.as_str();
            let mut dir = root.to_path_buf();
            let components: Vec<&str> = file.name.components().collect();
            let Some((leaf, parents)) = components.split_last() else {
                continue;
            };
            for c in parents {
                dir.push(c);
                match fs::DirBuilder::new().mode(0o700).create(&dir) {
                    Ok(()) => chown(&dir, name)?,
                    Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                    Err(e) => return Err(io(name, e)),
                }
            }
            let path = dir.join(leaf);
            let mut f = fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .custom_flags(libc_o_nofollow())
                .open(&path)
                .map_err(|e| io(name, e))?;
            f.write_all(&file.content).map_err(|e| io(name, e))?;
            f.sync_all().map_err(|e| io(name, e))?;
            chown(&path, name)?;
        }
        chown(root, "(the workspace)")?;
        fsutil::sync_dir(root).map_err(fs_failure)?;
        Ok(())
    }

    /// Moves the staged tree into `state/workspace`: the whole tree when there is no
    /// workspace yet, else entry by entry where nothing is in the way (an identical file
    /// from an interrupted earlier attempt is kept).
    fn move_into_workspace(&self, paths: &AgentPaths) -> Result<(), Failure> {
        let fail =
            |what: &str, e: Errno| setup_failed(format!("cannot apply {what}: {}", errno_text(e)));
        let state = openat(
            AT_FDCWD,
            &paths.state,
            OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| fail("the workspace", e))?;
        let staged = openat(
            AT_FDCWD,
            &paths.workspace_staging,
            OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| fail("the workspace", e))?;
        match lstat_at(&state, "workspace").map_err(|e| fail("the workspace", e))? {
            None => match renameat2(
                AT_FDCWD,
                &paths.workspace_staging,
                state.as_fd(),
                "workspace",
                RenameFlags::RENAME_NOREPLACE,
            ) {
                Ok(()) => {}
                // `state` is a btrfs subvolume of its own: copied instead.
                Err(Errno::EXDEV) => {
                    let st = nix::sys::stat::fstat(staged.as_fd())
                        .map_err(|e| fail("the workspace", e))?;
                    let fail_by = |e: Errno| {
                        setup_failed_by(e, format!("cannot apply the workspace: {}", errno_text(e)))
                    };
                    nix::sys::stat::mkdirat(
                        state.as_fd(),
                        "workspace",
                        Mode::from_bits_truncate(0o700),
                    )
                    .map_err(fail_by)?;
                    let ws = open_dir_at(&state, "workspace").map_err(fail_by)?;
                    nix::unistd::fchown(
                        ws.as_fd(),
                        Some(nix::unistd::Uid::from_raw(st.st_uid)),
                        Some(nix::unistd::Gid::from_raw(st.st_gid)),
                    )
                    .map_err(fail_by)?;
                    merge(&staged, &paths.workspace_staging, &ws, "")?;
                    nix::unistd::fsync(ws.as_fd()).map_err(fail_by)?;
                }
                Err(e) => return Err(fail("the workspace", e)),
            },
            Some(st) if is(&st, SFlag::S_IFDIR) => {
                let ws = open_dir_at(&state, "workspace").map_err(|e| fail("the workspace", e))?;
                merge(&staged, &paths.workspace_staging, &ws, "")?;
                nix::unistd::fsync(ws.as_fd()).map_err(|e| fail("the workspace", e))?;
            }
            Some(st) => {
                return Err(setup_failed(format!(
                    "the workspace directory is {}; nothing was written into it",
                    kind_text(&st)
                )));
            }
        }
        nix::unistd::fsync(state.as_fd()).map_err(|e| fail("the workspace", e))?;
        Ok(())
    }
}

/// `O_NOFOLLOW` for `OpenOptions::custom_flags`.
fn libc_o_nofollow() -> i32 {
    OFlag::O_NOFOLLOW.bits()
}

/// Moves every entry of the staged directory `from` into the workspace directory `to`.
fn merge(from: &OwnedFd, from_path: &Path, to: &OwnedFd, prefix: &str) -> Result<(), Failure> {
    let mut names: Vec<String> = fsutil::list_dir(from_path).map_err(fs_failure)?;
    names.sort();
    for name in names {
        let shown = format!("{prefix}{name}");
        let fail = |e: Errno| {
            setup_failed(format!(
                "cannot apply workspace file {shown}: {}",
                errno_text(e)
            ))
        };
        let staged = lstat_at(from, &name)
            .map_err(fail)?
            .ok_or_else(|| fail(Errno::ENOENT))?;
        match lstat_at(to, &name).map_err(fail)? {
            None => match renameat2(
                from.as_fd(),
                name.as_str(),
                to.as_fd(),
                name.as_str(),
                RenameFlags::RENAME_NOREPLACE,
            ) {
                Ok(()) => {}
                // The workspace is a btrfs subvolume of its own: copied instead.
                Err(Errno::EXDEV) => copy_in(from, from_path, to, &name, &staged, &shown)?,
                Err(e) => return Err(fail(e)),
            },
            Some(there) if is(&staged, SFlag::S_IFDIR) && is(&there, SFlag::S_IFDIR) => {
                let sub_from = open_dir_at(from, &name).map_err(fail)?;
                let sub_to = open_dir_at(to, &name).map_err(fail)?;
                merge(
                    &sub_from,
                    &from_path.join(&name),
                    &sub_to,
                    &format!("{shown}/"),
                )?;
            }
            Some(there) if is(&staged, SFlag::S_IFREG) && is(&there, SFlag::S_IFREG) => {
                let mut want = Vec::new();
                let read = openat(
                    from.as_fd(),
                    name.as_str(),
                    OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
                    Mode::empty(),
                )
                .map_err(fail)
                .and_then(|fd| {
                    fs::File::from(fd)
                        .read_to_end(&mut want)
                        .map_err(|_| fail(Errno::EIO))
                });
                read?;
                if !same_content(to, &name, &want) {
                    return Err(setup_failed(format!(
                        "workspace file {shown} is already in the workspace with other content; nothing was replaced"
                    )));
                }
            }
            Some(there) => {
                return Err(setup_failed(format!(
                    "workspace file {shown}: {} is in its place in the workspace; nothing was replaced",
                    kind_text(&there)
                )));
            }
        }
    }
    Ok(())
}

/// The unit's start guard, run by `hostd exec-gateway` as the Agent before the gateway: when
/// the Agent directory records a workspace setup request, the completion marker must be
/// there (a regular file owned by `trusted_uid`, root on a host, never followed through a
/// link).
pub fn guard(agent_dir: &Path, trusted_uid: u32) -> Result<(), String> {
    let request = agent_dir.join(WORKSPACE_REQUEST_FILE);
    let applied = agent_dir.join(WORKSPACE_APPLIED_FILE);
    let root_file = |p: &Path| {
        fs::symlink_metadata(p).is_ok_and(|m| {
            use std::os::unix::fs::MetadataExt;
            m.file_type().is_file() && m.uid() == trusted_uid
        })
    };
    match fs::symlink_metadata(&request) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        _ if root_file(&applied) => Ok(()),
        _ => Err(
            "the Agent's initial workspace files were requested and have not been applied \
             (no completion marker); the gateway is not started"
                .to_owned(),
        ),
    }
}
