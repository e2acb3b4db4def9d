//! `daemon-reload` shared between operations. systemd re-reads every unit file on a reload
//! (80–125 ms on a test host), and hostd runs it under the host lock, so Agents activated
//! together on one host used to wait for one reload each. A reload that *started* after a
//! unit file was written has read that file: an operation that writes its unit file, then
//! takes a [`Ticket`], and finds under the host lock that such a reload has completed, skips
//! its own.
//!
//! The host keeps two counts in `reloads/counts` (reloads started, reloads completed),
//! written only under the host lock. They need no fsync: they only have to grow within one
//! boot, and systemd reads every unit file when it boots. A unit file whose reload was never
//! done (the operation was stopped, or the host lock timed out, after the write) is marked
//! `reloads/<unit>.pending` until one covers it, so the next activation reloads although the
//! file on disk is already what it wants.

use std::path::Path;

use clawfleet_protocol::failure::Failure;
use clawfleet_protocol::result::Step;

use super::{Ctx, Engine, fs_failure, system_failure};
use crate::fsutil;
use crate::lock::LockGuard;

/// The counts file is two decimal numbers; anything longer is not ours.
const COUNTS_MAX: u64 = 64;

/// Which reload covers a unit file written before the ticket was taken: the first one that
/// starts after it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Ticket {
    needs: u64,
}

/// Reloads started and completed on this host (as far as `reloads/counts` says).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Counts {
    started: u64,
    completed: u64,
}

impl Counts {
    fn parse(text: &str) -> Option<Self> {
        let mut words = text.split_whitespace();
        let started = words.next()?.parse().ok()?;
        let completed = words.next()?.parse().ok()?;
        (words.next().is_none() && completed <= started).then_some(Self { started, completed })
    }
}

impl Engine<'_> {
    /// Reads the counts. Missing means none yet; unreadable ones count as none, which can
    /// only cause an extra reload (a ticket needs a completed count above what it read), and
    /// the next reload writes them anew.
    fn reload_counts(&self) -> Counts {
        let path = self.layout.reload_counts();
        match fsutil::read_small(&path, COUNTS_MAX) {
            Ok(bytes) => Counts::parse(&String::from_utf8_lossy(&bytes)).unwrap_or_else(|| {
                tracing::warn!(path = %path.display(), "the daemon-reload counts are not two numbers (started, completed); counting from zero");
                Counts::default()
            }),
            Err(e) if e.is_not_found() => Counts::default(),
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "cannot read the daemon-reload counts; counting from zero");
                Counts::default()
            }
        }
    }

    fn write_reload_counts(&self, counts: Counts) -> Result<(), Failure> {
        fsutil::ensure_dir(&self.layout.reloads_dir(), 0o700).map_err(fs_failure)?;
        let text = format!("{} {}\n", counts.started, counts.completed);
        fsutil::replace_quickly(&self.layout.reload_counts(), text.as_bytes(), 0o600)
            .map_err(fs_failure)
    }

    /// Taken once the unit files a reload must read are in place.
    pub(crate) fn reload_ticket(&self) -> Ticket {
        Ticket {
            needs: self.reload_counts().started.saturating_add(1),
        }
    }

    /// Under the host lock: runs `daemon-reload` unless one that started after `ticket` was
    /// taken has completed. Returns whether it reloaded.
    pub(crate) fn daemon_reload(
        &self,
        ctx: &mut Ctx<'_>,
        _host: &LockGuard,
        ticket: Ticket,
    ) -> Result<bool, Failure> {
        let counts = self.reload_counts();
        if counts.completed >= ticket.needs {
            tracing::info!(operation_id = %ctx.operation_id, reload = counts.completed, "daemon-reload skipped: a reload that started after the unit file was written has completed");
            return Ok(false);
        }
        ctx.step(Step::DaemonReload)?;
        // Started is recorded before the reload: a ticket taken from now on needs the next.
        let n = counts.started.max(counts.completed).saturating_add(1);
        self.write_reload_counts(Counts {
            started: n,
            completed: counts.completed,
        })?;
        self.system.daemon_reload().map_err(system_failure)?;
        self.write_reload_counts(Counts {
            started: n,
            completed: n,
        })?;
        Ok(true)
    }

    /// Marks a unit file as written but not yet read by systemd; before the write.
    pub(crate) fn mark_reload_pending(&self, unit_name: &str) -> Result<(), Failure> {
        fsutil::ensure_dir(&self.layout.reloads_dir(), 0o700).map_err(fs_failure)?;
        fsutil::replace_quickly(&self.layout.reload_pending(unit_name), b"", 0o600)
            .map_err(fs_failure)
    }

    /// Whether a unit file still waits for a reload (see [`Self::mark_reload_pending`]).
    pub(crate) fn reload_pending(&self, unit_name: &str) -> Result<bool, Failure> {
        fsutil::file_exists(&self.layout.reload_pending(unit_name)).map_err(fs_failure)
    }

    /// A reload covered the unit file (or the file is gone).
    pub(crate) fn clear_reload_pending(&self, unit_name: &str) -> Result<(), Failure> {
        remove_quickly(&self.layout.reload_pending(unit_name))
    }
}

/// Removes a pending mark without syncing its directory: a mark that comes back after a power
/// cut only costs a reload.
fn remove_quickly(path: &Path) -> Result<(), Failure> {
    match std::fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(fs_failure(fsutil::io_err(path)(e))),
    }
}

#[cfg(test)]
mod tests {
    use super::Counts;

    #[test]
    fn counts_are_two_numbers_with_completed_not_above_started() {
        assert_eq!(
            Counts::parse("7 6\n"),
            Some(Counts {
                started: 7,
                completed: 6
            })
        );
        assert_eq!(Counts::parse("7 8"), None);
        assert_eq!(Counts::parse("7"), None);
        assert_eq!(Counts::parse("7 6 5"), None);
        assert_eq!(Counts::parse("x 1"), None);
    }
}
