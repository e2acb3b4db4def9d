//! What the Agent unit's environment files held when systemd last started it.
//!
//! systemd reads `EnvironmentFile=` only when it starts a unit, so a gateway relaunched in
//! place (`crate::supervise`) keeps the environment of that start. hostd relaunches in place
//! only while the files still hold what that start read; otherwise it restarts the unit
//! (engine/revision.rs). The unit's `ExecStartPre=+` (`hostd secret-files`, before every start,
//! crash restarts included) records a digest of the files; hostd compares it with the files
//! now. A file changed between that record and systemd's read of it makes the two differ, so
//! the error is always towards a restart.

use std::path::{Path, PathBuf};

use clawfleet_protocol::ident::{hex, sha256};

use crate::fsutil::{self, FsError, Kind};
use crate::layout::ENV_FILES;

/// The record, root-only in the Agent directory.
pub const RECORD_FILE: &str = "start-env.sha256";

/// The largest environment file read (systemd's own limit for one is larger; an Agent's
/// files are a few lines).
pub const ENV_FILE_MAX: u64 = 64 * 1024;

fn record_path(agent_dir: &Path) -> PathBuf {
    agent_dir.join(RECORD_FILE)
}

/// SHA-256 (hex) over each environment file's name, presence and content.
pub fn digest(agent_dir: &Path) -> Result<String, FsError> {
    let mut all = Vec::new();
    for name in ENV_FILES {
        let path = agent_dir.join(name);
        all.extend_from_slice(name.as_bytes());
        all.push(0);
        if fsutil::kind(&path)? == Kind::Missing {
            all.extend_from_slice(b"absent\0");
            continue;
        }
        let bytes = fsutil::read_small(&path, ENV_FILE_MAX)?;
        all.extend_from_slice(format!("{}\0", bytes.len()).as_bytes());
        all.extend_from_slice(&bytes);
    }
    let d = sha256(&all);
    // The contents may be credentials: the buffer does not outlive the digest.
    zeroize::Zeroize::zeroize(&mut all);
    Ok(hex(&d))
}

/// Records the digest of the files now (the unit is about to start and read them).
pub fn record(agent_dir: &Path) -> Result<(), FsError> {
    let d = digest(agent_dir)?;
    fsutil::write_atomic(&record_path(agent_dir), d.as_bytes(), 0o600, |_| Ok(()))
}

/// Forgets the record, so that the next cutover restarts the unit.
pub fn forget(agent_dir: &Path) -> Result<bool, FsError> {
    fsutil::remove_file_if_present(&record_path(agent_dir))
}

/// Whether the files hold what the unit's last start read (false without a record).
pub fn unchanged(agent_dir: &Path) -> Result<bool, FsError> {
    let path = record_path(agent_dir);
    if fsutil::kind(&path)? == Kind::Missing {
        return Ok(false);
    }
    let recorded = fsutil::read_small(&path, 128)?;
    Ok(recorded == digest(agent_dir)?.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_change_to_any_file_or_its_presence_is_seen() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        assert!(!unchanged(d).unwrap(), "no record: not unchanged");
        record(d).unwrap();
        assert!(unchanged(d).unwrap());
        std::fs::write(d.join("env"), "A=1\n").unwrap();
        assert!(!unchanged(d).unwrap(), "a file that appeared");
        record(d).unwrap();
        assert!(unchanged(d).unwrap());
        std::fs::write(d.join("env"), "A=2\n").unwrap();
        assert!(!unchanged(d).unwrap(), "a changed value");
        std::fs::write(d.join("env"), "A=1\n").unwrap();
        assert!(unchanged(d).unwrap(), "the same content again");
        // The same bytes under another file's name are another environment.
        std::fs::remove_file(d.join("env")).unwrap();
        std::fs::write(d.join("launch.env"), "A=1\n").unwrap();
        assert!(!unchanged(d).unwrap(), "moved to another file");
        assert!(forget(d).unwrap());
        assert!(!unchanged(d).unwrap());
    }

    #[test]
    fn an_unreadable_file_is_an_error_not_a_match() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        record(d).unwrap();
        std::fs::create_dir(d.join("launch.env")).unwrap();
        assert!(unchanged(d).is_err());
    }
}
