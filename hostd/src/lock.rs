//! Kernel `flock` locks with a time limit. The kernel drops a lock when its holder dies in any
//! way (SIGKILL, a dropped SSH session), so there is never a stale lock to clean up.

use std::fs::{File, OpenOptions, TryLockError};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use thiserror::Error;

/// Why a lock was not taken.
#[derive(Debug, Error)]
pub enum LockError {
    #[error("the lock {path} is held by another operation; gave up after {waited_ms} ms")]
    Timeout { path: String, waited_ms: u128 },
    #[error("cannot open lock file {path}: {source}")]
    Open {
        path: String,
        source: std::io::Error,
    },
    #[error("the operation was cancelled while waiting for {path}")]
    Cancelled { path: String },
}

/// A held lock; released on drop.
#[derive(Debug)]
pub struct LockGuard {
    file: File,
    path: PathBuf,
}

impl LockGuard {
    /// The lock file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Removes the lock file while still holding it (used when its Agent is deleted). Anyone
    /// waiting on the old file notices the unlink after acquiring and retries on a new one.
    pub fn unlink(&self) {
        crate::fsutil::counters::other();
        let _ = std::fs::remove_file(&self.path);
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        let _ = self.file.unlock();
    }
}

/// Takes an exclusive lock on `path` (created 0600 if missing), polling until `timeout`.
/// `cancelled` is checked between polls so a closed session does not wait out the limit.
pub fn acquire(
    path: &Path,
    timeout: Duration,
    cancelled: &dyn Fn() -> bool,
) -> Result<LockGuard, LockError> {
    let start = Instant::now();
    let mut pause = Duration::from_millis(5);
    loop {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(path)
            .map_err(|source| LockError::Open {
                path: path.display().to_string(),
                source,
            })?;
        match file.try_lock() {
            Ok(()) => {
                // The holder before us may have unlinked the file (Agent deleted): then our
                // lock is on an orphan inode and means nothing; start over on the new file.
                let same = match (file.metadata(), std::fs::metadata(path)) {
                    (Ok(a), Ok(b)) => a.ino() == b.ino() && a.dev() == b.dev(),
                    _ => false,
                };
                if same {
                    return Ok(LockGuard {
                        file,
                        path: path.to_path_buf(),
                    });
                }
                continue;
            }
            Err(TryLockError::WouldBlock) => {}
            Err(TryLockError::Error(source)) => {
                return Err(LockError::Open {
                    path: path.display().to_string(),
                    source,
                });
            }
        }
        if cancelled() {
            return Err(LockError::Cancelled {
                path: path.display().to_string(),
            });
        }
        let waited = start.elapsed();
        if waited >= timeout {
            return Err(LockError::Timeout {
                path: path.display().to_string(),
                waited_ms: waited.as_millis(),
            });
        }
        std::thread::sleep(pause.min(timeout - waited));
        pause = (pause * 2).min(Duration::from_millis(100));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn second_holder_times_out_then_gets_it_after_release() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join(".lock");
        let first = acquire(&p, Duration::from_millis(100), &|| false).unwrap();
        let start = Instant::now();
        let err = acquire(&p, Duration::from_millis(200), &|| false).unwrap_err();
        assert!(matches!(err, LockError::Timeout { .. }));
        assert!(start.elapsed() >= Duration::from_millis(200));
        drop(first);
        acquire(&p, Duration::from_millis(100), &|| false).unwrap();
    }

    #[test]
    fn cancellation_stops_the_wait() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join(".lock");
        let _first = acquire(&p, Duration::from_millis(100), &|| false).unwrap();
        let err = acquire(&p, Duration::from_secs(30), &|| true).unwrap_err();
        assert!(matches!(err, LockError::Cancelled { .. }));
    }

    #[test]
    fn an_unlinked_lock_is_not_trusted() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("a.lock");
        let first = acquire(&p, Duration::from_millis(100), &|| false).unwrap();
        let waiter = {
            let p = p.clone();
            std::thread::spawn(move || {
                acquire(&p, Duration::from_secs(5), &|| false)
                    .map(|g| g.file.metadata().unwrap().ino())
            })
        };
        std::thread::sleep(Duration::from_millis(50));
        first.unlink();
        drop(first);
        let ino = waiter.join().unwrap().unwrap();
        assert_eq!(ino, std::fs::metadata(&p).unwrap().ino());
    }
}
