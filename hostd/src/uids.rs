//! Agent uids: each is handed out once per host, never again (issue 26, N5).
//!
//! `useradd --system` gives a new account the highest free system uid, so a deleted Agent's
//! uid went to the next Agent created, which then read what the kernel still keeps per uid
//! (the persistent keyring) and owned whatever files the old one left. Now every Agent
//! account gets uid = gid from a dedicated range (`[accounts] uid_range` in hostd.toml),
//! allocated upwards from a high-water mark that only grows: `<state root>/uids.json`,
//! written durably (write-then-rename, fsync) *before* the account tool runs, so a run
//! killed after `useradd` never hands the same uid out again. A removed account's uid is
//! simply retired: the mark is already past it. Ids some other user or group holds are
//! skipped. The mark is read and written under the host lock, like the accounts.

use std::path::Path;

use clawfleet_protocol::failure::{Failure, FailureCode};
use serde::{Deserialize, Serialize};

use crate::fsutil::{self, FsError};
use crate::markers::{self, MarkerError, SCHEMA};
use crate::system::{System, SystemError};

/// `uids.json`: the lowest uid never handed out.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HighWater {
    pub schema: u32,
    pub next: u32,
}

/// Why no uid could be allocated.
#[derive(Debug, thiserror::Error)]
pub enum UidError {
    #[error(
        "no uid is left in accounts.uid_range [{start}, {end}]: every uid in it was handed out once (uids are never reused); widen the range"
    )]
    Exhausted { start: u32, end: u32 },
    #[error(transparent)]
    Marker(#[from] MarkerError),
    #[error(transparent)]
    Fs(#[from] FsError),
    #[error(transparent)]
    System(#[from] SystemError),
}

impl UidError {
    /// The operation's failure: an exhausted range is `HOST_FULL` (no Agent can be added
    /// until the operator widens it), the rest as their kind.
    pub fn into_failure(self) -> Failure {
        match self {
            UidError::Exhausted { .. } => Failure::new(FailureCode::HostFull, self.to_string()),
            UidError::Marker(e) => crate::engine::marker_failure(e),
            UidError::Fs(e) => crate::engine::fs_failure(e),
            UidError::System(e) => crate::engine::system_failure(e),
        }
    }
}

/// Takes the next uid of `range` that no user or group holds, moves the high-water mark in
/// `file` past it (durably) and returns it. Call under the host lock.
pub fn allocate(file: &Path, range: (u32, u32), system: &dyn System) -> Result<u32, UidError> {
    let (start, end) = range;
    let mark: Option<HighWater> = markers::read_optional(file, "uid high-water mark")?;
    // A range moved up starts at its start; one moved down never goes below the mark.
    let mut id = mark.map_or(start, |m| m.next).max(start);
    loop {
        if id > end {
            return Err(UidError::Exhausted { start, end });
        }
        if !system.id_in_use(id)? {
            break;
        }
        id += 1;
    }
    let next = HighWater {
        schema: SCHEMA,
        next: id.saturating_add(1),
    };
    fsutil::write_atomic(file, &markers::to_bytes(&next), 0o600, |_| Ok(()))?;
    Ok(id)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fake::FakeSystem;

    #[test]
    fn uids_only_grow_and_skip_ids_in_use() {
        let dir = tempfile::tempdir().unwrap();
        let fake = FakeSystem::new(dir.path());
        let file = dir.path().join("uids.json");
        assert_eq!(allocate(&file, (500_000, 500_003), &fake).unwrap(), 500_000);
        // Held by some other user: skipped.
        fake.create_account("other", Path::new("/nonexistent"), 500_001)
            .unwrap();
        assert_eq!(allocate(&file, (500_000, 500_003), &fake).unwrap(), 500_002);
        // A range moved down never hands out what was handed out before.
        assert_eq!(allocate(&file, (400_000, 500_003), &fake).unwrap(), 500_003);
        let f = allocate(&file, (500_000, 500_003), &fake).unwrap_err();
        assert!(f.to_string().contains("accounts.uid_range"), "{f}");
        // A garbled mark is refused, never reset to the start of the range.
        std::fs::write(&file, b"{\"schema\":1,\"next\":\"x\"}").unwrap();
        assert!(allocate(&file, (500_000, 600_000), &fake).is_err());
    }
}
