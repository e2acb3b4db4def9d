//! The operation journal: a bounded record of the outcome of every changing operation, keyed
//! by operation id. It makes replays safe (the same id and body return the recorded outcome,
//! a different body is refused) and answers `operation-status` after a dropped session.
//!
//! A running operation holds a flock on `<id>.run`; if the entry says "running" but nobody
//! holds that lock, the process died mid-operation and the entry is reported as aborted after
//! its last recorded step. Whoever settles an entry (a replay, `operation-status`, pruning)
//! takes that lock first and reads the entry again under it, so a just-finished outcome is
//! never rewritten as aborted; run files left by killed operations are removed by pruning.
//!
//! Entries are pruned once their envelope has expired by the host's clock, oldest first, found
//! through the prune index (`journal/index.rs`): pruning at the limit reads neither the
//! directory nor the entries, so its cost does not grow with the journal. So that a clock
//! that ran ahead cannot reopen a replay window, pruning first raises a persisted watermark,
//! the latest expiry of any entry it removed (`.pruned.json`), and an envelope whose id the
//! journal does not know and that expires at or before the watermark is refused
//! (`REPLAY_UNVERIFIABLE`): it may have run before, and nothing on the host can tell. A fresh
//! envelope from the coordinator always expires later than anything already pruned.
//!
//! Operations that change nothing (the engine's no-op fast path) are recorded cheaply: the
//! session begins them with [`Journal::begin_deferred`], which takes the run lock and checks
//! for replays but writes no entry; the engine calls [`RunHandle::commit`] (through
//! `Ctx::commit`) before its first write, which writes the running entry durably as
//! [`Journal::begin`] does, so an operation that changes things is recorded exactly as before.
//! One that never committed changed nothing, and its outcome is written without fsync (one
//! write and one rename, no fsync: a killed process loses nothing, the page cache has it).
//! Only a power cut or kernel crash can lose such a record, and so that the lost id cannot run
//! again, the journal first makes sure, durably, that `.unsynced.json` names this boot, the
//! latest `issuedAt` of any such envelope and an expiry bound at or after theirs (raised by
//! [`UNSYNCED_HEADROOM`] at a time). When a journal is opened in a later boot and finds the
//! file of an earlier one, it keeps both bounds in `.crashed.json`: an envelope whose id the
//! journal does not know, issued at or before the issue bound and expiring at or before the
//! expiry bound, might be one whose record was lost, and is refused as
//! `REPLAY_UNVERIFIABLE`. Envelopes issued later (every one the coordinator signs after the
//! reboot) or expiring later run, so the refusal never outlasts the envelopes that could
//! really have run before the crash (a bound on expiry alone refused every new short-lived
//! envelope until the longest-lived one of the earlier boot expired). Replay protection is
//! thus the same for every operation; what a no-op saves is the fsyncs and renames of its
//! entry and of its steps.

use std::fs::{File, OpenOptions, TryLockError};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use clawfleet_protocol::failure::{Failure, FailureCode};
use clawfleet_protocol::operation::OperationKind;
use clawfleet_protocol::result::{OperationResult, OperationState, Outcome, Step};
use clawfleet_protocol::{OperationId, Sha256Hex};
use serde::{Deserialize, Serialize};

use crate::fsutil::{self, FsError};
use crate::markers::{self, MarkerError, SCHEMA};

mod index;

/// Per-thread counts of what the journal reads, for the tests that bound the cost of one
/// operation on a journal at its limit (as [`fsutil::counters`] counts writes).
pub mod counters {
    use std::cell::Cell;

    /// Journal reads on this thread since the last [`reset`].
    #[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
    pub struct ReadCounts {
        /// Entry files read.
        pub entry_reads: u64,
        /// Listings of the journal directory.
        pub listings: u64,
    }

    thread_local! {
        static COUNTS: Cell<ReadCounts> = const { Cell::new(ReadCounts { entry_reads: 0, listings: 0 }) };
    }

    /// The counts so far on this thread.
    pub fn get() -> ReadCounts {
        COUNTS.with(Cell::get)
    }

    /// Starts counting from zero on this thread.
    pub fn reset() {
        COUNTS.with(|c| c.set(ReadCounts::default()));
    }

    pub(super) fn entry_read() {
        COUNTS.with(|c| {
            let mut v = c.get();
            v.entry_reads += 1;
            c.set(v);
        });
    }

    pub(super) fn listing() {
        COUNTS.with(|c| {
            let mut v = c.get();
            v.listings += 1;
            c.set(v);
        });
    }
}

/// One journal entry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Entry {
    pub schema: u32,
    pub operation_id: OperationId,
    pub kind: OperationKind,
    pub body_sha256: Sha256Hex,
    /// The envelope's expiry: the entry is kept at least until then, so a replay inside the
    /// envelope's lifetime is always recognised.
    pub expires_at: u64,
    pub started_at: u64,
    pub state: EntryState,
}

/// Where an operation stands.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "kebab-case", deny_unknown_fields)]
pub enum EntryState {
    Running {
        step: Option<Step>,
    },
    Succeeded {
        result: Box<OperationResult>,
    },
    Failed {
        failure: Failure,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        after_step: Option<Step>,
    },
}

/// The journal's pruning watermark file; never an entry's name (operation ids start with a
/// letter or digit).
const WATERMARK_FILE: &str = ".pruned.json";

/// The file naming the boot whose unsynced records the journal may hold, and a bound on their
/// envelopes' expiry; never an entry's name.
const UNSYNCED_FILE: &str = ".unsynced.json";
/// Serialises raises of [`UNSYNCED_FILE`] between concurrent sessions.
const UNSYNCED_LOCK: &str = ".unsynced.lock";
/// How far past a no-op's expiry a raise of the unsynced expiry bound reaches, in seconds, so
/// that no-ops in quick succession share one durable write. It costs nothing after a crash:
/// the refusal also needs an envelope issued by the exact issue bound.
pub const UNSYNCED_HEADROOM: u64 = 10;
/// The bounds of the records an earlier boot may have lost in a crash; never an entry's name.
const CRASHED_FILE: &str = ".crashed.json";
/// A cheap (unsynced) record also prunes only every this many records: pruning takes the
/// index lock and reads a chunk of the index.
const CHEAP_PRUNE_EVERY: u32 = 32;

/// `.unsynced.json`: records written without fsync in boot `boot_id` have envelopes expiring
/// at or before `expires_at_bound` and issued at or before `issued_at_bound`. A file without
/// `issued_at_bound` was written by an earlier hostd: after a crash its whole expiry bound
/// becomes the watermark, as that hostd did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Unsynced {
    schema: u32,
    boot_id: String,
    expires_at_bound: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    issued_at_bound: Option<u64>,
}

/// `.crashed.json`: an earlier boot ended with records written without fsync, whose envelopes
/// were issued at or before `issued_at_bound` and expire at or before `expires_at_bound`;
/// after several such boots, the largest of each (the latest boot's, since later envelopes are
/// issued and expire later).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Crashed {
    schema: u32,
    issued_at_bound: u64,
    expires_at_bound: u64,
}

/// The kernel's id of the current boot; `None` where there is none (no /proc).
fn current_boot_id() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .ok()
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
}

/// The latest `expiresAt` of any entry pruned so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Watermark {
    schema: u32,
    pruned_expires_at: u64,
}

/// An operation's run lock, as found.
#[derive(Debug)]
enum RunLock {
    /// Held by us: nobody runs the operation.
    Held(File),
    /// Another process runs the operation now.
    Busy,
    /// No run file (only when not asked to create one).
    Missing,
}

/// What to do with an incoming operation id.
#[derive(Debug)]
pub enum Begin {
    /// New id: run it; the handle records progress and the outcome.
    Run(RunHandle),
    /// Seen before with the same body: this is the recorded outcome.
    Recorded(Outcome),
    /// Seen before with a different body.
    Mismatch,
    /// Another live session is running it now.
    InProgress,
    /// A new id whose envelope expires at or before the pruning watermark: it may have run
    /// before (its entry pruned), so it is refused.
    Unverifiable { expires_at: u64, watermark: u64 },
    /// A new id whose envelope was issued before a crash that may have lost records written
    /// without fsync, and expires within their bound: it may have run before, so it is refused.
    LostInCrash {
        issued_at: u64,
        issued_at_bound: u64,
        expires_at_bound: u64,
    },
}

/// When an envelope was issued and when it expires (Unix seconds, as it says).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Validity {
    pub issued_at: u64,
    pub expires_at: u64,
}

/// The journal directory.
#[derive(Debug, Clone)]
pub struct Journal {
    dir: PathBuf,
    max_entries: usize,
    /// The current boot's id; without one every record is written durably.
    boot_id: Option<String>,
    /// A bound this process knows `.unsynced.json` holds for this boot (0: none yet).
    unsynced_bound: Arc<AtomicU64>,
    /// The issue bound this process knows `.unsynced.json` holds for this boot (0: none yet).
    unsynced_issued: Arc<AtomicU64>,
    /// What `.crashed.json` said when the journal was opened (it only changes when a journal
    /// is opened in a new boot, before any operation of that boot).
    crashed: Option<Crashed>,
    /// Cheap records since the last prune.
    cheap_since_prune: Arc<AtomicU32>,
}

/// Progress recording for one running operation; holds its run lock.
#[derive(Debug)]
pub struct RunHandle {
    entry: Entry,
    /// The envelope's `issuedAt`, for the unsynced bound.
    issued_at: u64,
    path: PathBuf,
    run_lock_path: PathBuf,
    _run_lock: File,
    /// The running entry is on disk, durably: the operation may change the host.
    committed: bool,
    journal: Journal,
}

fn entry_err(e: MarkerError) -> FsError {
    match e {
        MarkerError::Fs(f) => f,
        other => FsError::Io {
            path: String::new(),
            source: std::io::Error::other(other.to_string()),
        },
    }
}

impl Journal {
    /// A journal in `dir`, created 0700 if missing.
    /// Settles the unsynced records of an earlier boot (see the module documentation).
    pub fn open(dir: &Path, max_entries: usize) -> Result<Self, FsError> {
        Self::open_in_boot(dir, max_entries, current_boot_id())
    }

    /// [`Journal::open`] as in the boot `boot_id` (tests: a reboot).
    pub fn open_in_boot(
        dir: &Path,
        max_entries: usize,
        boot_id: Option<String>,
    ) -> Result<Self, FsError> {
        fsutil::ensure_dir(dir, 0o700)?;
        let mut journal = Self {
            dir: dir.to_path_buf(),
            max_entries,
            boot_id,
            unsynced_bound: Arc::default(),
            unsynced_issued: Arc::default(),
            crashed: None,
            cheap_since_prune: Arc::default(),
        };
        journal.settle_unsynced()?;
        journal.crashed = journal.read_crashed()?;
        // The prune index, rebuilt here if it is missing or of another boot, so that no
        // operation pays for that.
        drop(journal.index()?);
        Ok(journal)
    }

    fn crashed_path(&self) -> PathBuf {
        self.dir.join(CRASHED_FILE)
    }

    fn read_crashed(&self) -> Result<Option<Crashed>, FsError> {
        markers::read_optional(&self.crashed_path(), "journal crash bounds").map_err(entry_err)
    }

    /// Remembers what this boot's `.unsynced.json` covers.
    fn know_unsynced(&self, found: &Unsynced) {
        self.unsynced_bound
            .fetch_max(found.expires_at_bound, Ordering::SeqCst);
        if let Some(issued) = found.issued_at_bound {
            self.unsynced_issued.fetch_max(issued, Ordering::SeqCst);
        }
    }

    fn unsynced_path(&self) -> PathBuf {
        self.dir.join(UNSYNCED_FILE)
    }

    fn read_unsynced(&self) -> Result<Option<Unsynced>, FsError> {
        markers::read_optional(&self.unsynced_path(), "journal unsynced bound").map_err(entry_err)
    }

    /// Takes the lock that serialises changes of `.unsynced.json` (held until dropped).
    fn lock_unsynced(&self) -> Result<File, FsError> {
        let path = self.dir.join(UNSYNCED_LOCK);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .custom_flags(nix::fcntl::OFlag::O_NOFOLLOW.bits())
            .open(&path)
            .map_err(fsutil::io_err(&path))?;
        file.lock().map_err(fsutil::io_err(&path))?;
        Ok(file)
    }

    /// A `.unsynced.json` of another boot means records written without fsync may have been
    /// lost in a crash: its bounds go (durably) into `.crashed.json`, so those envelopes are
    /// refused, and then the file is removed. One of this boot is remembered.
    fn settle_unsynced(&self) -> Result<(), FsError> {
        let Some(found) = self.read_unsynced()? else {
            return Ok(());
        };
        if self.boot_id.as_deref() == Some(found.boot_id.as_str()) {
            self.know_unsynced(&found);
            return Ok(());
        }
        let _lock = self.lock_unsynced()?;
        let Some(found) = self.read_unsynced()? else {
            return Ok(());
        };
        if self.boot_id.as_deref() == Some(found.boot_id.as_str()) {
            self.know_unsynced(&found);
            return Ok(());
        }
        match found.issued_at_bound {
            Some(issued) => {
                let before = self.read_crashed()?;
                let crashed = Crashed {
                    schema: SCHEMA,
                    issued_at_bound: before.map_or(issued, |c| c.issued_at_bound.max(issued)),
                    expires_at_bound: before.map_or(found.expires_at_bound, |c| {
                        c.expires_at_bound.max(found.expires_at_bound)
                    }),
                };
                if before != Some(crashed) {
                    fsutil::write_atomic(
                        &self.crashed_path(),
                        &markers::to_bytes(&crashed),
                        0o600,
                        |_| Ok(()),
                    )?;
                }
                tracing::warn!(
                    previous_boot = %found.boot_id,
                    issued_at_bound = issued,
                    expires_at_bound = found.expires_at_bound,
                    "the journal held records written without fsync in an earlier boot; unknown envelopes issued and expiring by these bounds are refused as possibly seen"
                );
            }
            // Written by an earlier hostd, which knew no issue bound.
            None => {
                if found.expires_at_bound > self.watermark()? {
                    self.write_watermark(found.expires_at_bound)?;
                }
                tracing::warn!(
                    previous_boot = %found.boot_id,
                    watermark = found.expires_at_bound,
                    "the journal held records written without fsync in an earlier boot; envelopes expiring by the watermark are refused as possibly seen"
                );
            }
        }
        fsutil::remove_file_if_present(&self.unsynced_path())?;
        Ok(())
    }

    /// Makes sure `.unsynced.json` covers an envelope issued at `issued_at` and expiring at
    /// `expires_at` for this boot, raising it durably when it does not. False when there is
    /// no boot id, or the file of this boot was written by an earlier hostd without an issue
    /// bound (the caller then writes durably).
    fn cover_unsynced(&self, issued_at: u64, expires_at: u64) -> Result<bool, FsError> {
        if self.unsynced_bound.load(Ordering::SeqCst) >= expires_at
            && self.unsynced_issued.load(Ordering::SeqCst) >= issued_at
        {
            return Ok(true);
        }
        let Some(boot) = self.boot_id.as_deref() else {
            return Ok(false);
        };
        let _lock = self.lock_unsynced()?;
        let (on_disk_expires, on_disk_issued) = match self.read_unsynced()? {
            None => (0, 0),
            Some(u) if u.boot_id == boot => match u.issued_at_bound {
                Some(issued) => (u.expires_at_bound, issued),
                None => return Ok(false),
            },
            // Another boot's, not settled yet (a journal opened before the file appeared
            // cannot be of an earlier boot; be safe anyway).
            Some(_) => return Ok(false),
        };
        if on_disk_expires < expires_at || on_disk_issued < issued_at {
            let record = Unsynced {
                schema: SCHEMA,
                boot_id: boot.to_owned(),
                expires_at_bound: expires_at
                    .saturating_add(UNSYNCED_HEADROOM)
                    .max(on_disk_expires),
                issued_at_bound: Some(issued_at.max(on_disk_issued)),
            };
            fsutil::write_atomic(
                &self.unsynced_path(),
                &markers::to_bytes(&record),
                0o600,
                |_| Ok(()),
            )?;
            self.know_unsynced(&record);
        } else {
            self.unsynced_bound
                .fetch_max(on_disk_expires, Ordering::SeqCst);
            self.unsynced_issued
                .fetch_max(on_disk_issued, Ordering::SeqCst);
        }
        Ok(true)
    }

    /// Whether the session should prune after a cheap record (every [`CHEAP_PRUNE_EVERY`]).
    pub fn cheap_prune_due(&self) -> bool {
        self.cheap_since_prune.fetch_add(1, Ordering::SeqCst) + 1 >= CHEAP_PRUNE_EVERY
    }

    fn write_watermark(&self, pruned_expires_at: u64) -> Result<(), FsError> {
        let mark = Watermark {
            schema: SCHEMA,
            pruned_expires_at,
        };
        fsutil::write_atomic(
            &self.watermark_path(),
            &markers::to_bytes(&mark),
            0o600,
            |_| Ok(()),
        )
    }

    fn entry_path(&self, id: &OperationId) -> PathBuf {
        self.dir.join(format!("{id}.json"))
    }

    fn run_lock_path(&self, id: &OperationId) -> PathBuf {
        self.dir.join(format!("{id}.run"))
    }

    fn watermark_path(&self) -> PathBuf {
        self.dir.join(WATERMARK_FILE)
    }

    /// The latest expiry of any entry pruned so far (0 when none was).
    pub fn watermark(&self) -> Result<u64, FsError> {
        let w: Option<Watermark> =
            markers::read_optional(&self.watermark_path(), "journal watermark")
                .map_err(entry_err)?;
        Ok(w.map_or(0, |w| w.pruned_expires_at))
    }

    /// Takes the run lock of `id` without waiting (creating the file if `create`). A lock
    /// file that its holder unlinked meanwhile (finish, a replay, pruning) guards nothing:
    /// then the one now at the path is tried instead.
    fn lock_run(&self, id: &OperationId, create: bool) -> Result<RunLock, FsError> {
        let path = self.run_lock_path(id);
        if create {
            fsutil::counters::other();
        }
        loop {
            let file = match OpenOptions::new()
                .read(true)
                .write(true)
                .create(create)
                .truncate(false)
                .mode(0o600)
                .custom_flags(nix::fcntl::OFlag::O_NOFOLLOW.bits())
                .open(&path)
            {
                Ok(f) => f,
                Err(e) if !create && e.kind() == std::io::ErrorKind::NotFound => {
                    return Ok(RunLock::Missing);
                }
                Err(e) => return Err(fsutil::io_err(&path)(e)),
            };
            match file.try_lock() {
                Ok(()) => {}
                Err(TryLockError::WouldBlock) => return Ok(RunLock::Busy),
                Err(TryLockError::Error(e)) => return Err(fsutil::io_err(&path)(e)),
            }
            let held = file.metadata().map_err(fsutil::io_err(&path))?;
            match std::fs::symlink_metadata(&path) {
                Ok(now) if now.ino() == held.ino() && now.dev() == held.dev() => {
                    return Ok(RunLock::Held(file));
                }
                Err(e) if !create && e.kind() == std::io::ErrorKind::NotFound => {
                    return Ok(RunLock::Missing);
                }
                _ => continue,
            }
        }
    }

    /// Removes a run file whose lock we hold.
    fn release_run(&self, id: &OperationId, lock: File) {
        fsutil::counters::other();
        let _ = std::fs::remove_file(self.run_lock_path(id));
        drop(lock);
    }

    /// Registers an operation before it runs, writing its running entry durably.
    pub fn begin(
        &self,
        id: &OperationId,
        kind: OperationKind,
        body_sha256: &Sha256Hex,
        validity: Validity,
        now: u64,
    ) -> Result<Begin, FsError> {
        self.begin_inner(id, kind, body_sha256, validity, now, true)
    }

    /// Like [`Journal::begin`] (replays, mismatches, the run lock and the watermark are
    /// checked the same way) but writes no entry yet: [`RunHandle::commit`] writes it before
    /// the operation changes anything, and an operation that never commits is recorded
    /// cheaply by [`RunHandle::finish`] (see the module documentation). Until then
    /// `operation-status` reports the id unknown, which is true of what it did so far.
    pub fn begin_deferred(
        &self,
        id: &OperationId,
        kind: OperationKind,
        body_sha256: &Sha256Hex,
        validity: Validity,
        now: u64,
    ) -> Result<Begin, FsError> {
        self.begin_inner(id, kind, body_sha256, validity, now, false)
    }

    fn begin_inner(
        &self,
        id: &OperationId,
        kind: OperationKind,
        body_sha256: &Sha256Hex,
        validity: Validity,
        now: u64,
        durable: bool,
    ) -> Result<Begin, FsError> {
        let Validity {
            issued_at,
            expires_at,
        } = validity;
        let run_lock = match self.lock_run(id, true)? {
            RunLock::Held(f) => f,
            RunLock::Busy | RunLock::Missing => {
                return Ok(match self.read(id)? {
                    Some(e) if &e.body_sha256 != body_sha256 => Begin::Mismatch,
                    _ => Begin::InProgress,
                });
            }
        };
        // The kind goes into the run file (no fsync: it lives as long as the process), so
        // that `operation-status` can say "running" before the entry is written (a deferred
        // operation waiting for its Agent lock).
        if let Err(e) = write_run_kind(&run_lock, kind) {
            self.release_run(id, run_lock);
            return Err(fsutil::io_err(&self.run_lock_path(id))(e));
        }
        if let Some(existing) = self.read(id)? {
            if &existing.body_sha256 != body_sha256 {
                self.release_run(id, run_lock);
                return Ok(Begin::Mismatch);
            }
            let settled = self.settle(existing);
            self.release_run(id, run_lock);
            return Ok(Begin::Recorded(outcome_of(settled?)));
        }
        let watermark = match self.watermark() {
            Ok(w) => w,
            Err(e) => {
                self.release_run(id, run_lock);
                return Err(e);
            }
        };
        if expires_at <= watermark {
            self.release_run(id, run_lock);
            return Ok(Begin::Unverifiable {
                expires_at,
                watermark,
            });
        }
        if let Some(c) = self.crashed
            && issued_at <= c.issued_at_bound
            && expires_at <= c.expires_at_bound
        {
            self.release_run(id, run_lock);
            return Ok(Begin::LostInCrash {
                issued_at,
                issued_at_bound: c.issued_at_bound,
                expires_at_bound: c.expires_at_bound,
            });
        }
        let entry = Entry {
            schema: SCHEMA,
            operation_id: id.clone(),
            kind,
            body_sha256: body_sha256.clone(),
            expires_at,
            started_at: now,
            state: EntryState::Running { step: None },
        };
        let path = self.entry_path(id);
        if durable
            && let Err(e) = self.index_entry(id, expires_at).and_then(|()| {
                fsutil::write_atomic(&path, &markers::to_bytes(&entry), 0o600, |_| Ok(()))
            })
        {
            self.release_run(id, run_lock);
            return Err(e);
        }
        Ok(Begin::Run(RunHandle {
            entry,
            issued_at,
            path,
            run_lock_path: self.run_lock_path(id),
            _run_lock: run_lock,
            committed: durable,
            journal: self.clone(),
        }))
    }

    /// The kind of the operation recorded under an id, if any. Creates nothing: read-only
    /// operations use it to refuse an id that a recorded operation already has.
    pub fn recorded_kind(&self, id: &OperationId) -> Result<Option<OperationKind>, FsError> {
        Ok(self.read(id)?.map(|e| e.kind))
    }

    fn read(&self, id: &OperationId) -> Result<Option<Entry>, FsError> {
        counters::entry_read();
        markers::read_optional::<Entry>(&self.entry_path(id), "journal entry").map_err(entry_err)
    }

    /// Turns an entry whose process died while running into a failure record (durably) and
    /// returns the entry as it now stands. The caller holds the run lock.
    fn settle(&self, entry: Entry) -> Result<Entry, FsError> {
        let EntryState::Running { step } = entry.state else {
            return Ok(entry);
        };
        let settled = Entry {
            state: EntryState::Failed {
                failure: aborted_failure(step),
                after_step: step,
            },
            ..entry
        };
        fsutil::write_atomic(
            &self.entry_path(&settled.operation_id),
            &markers::to_bytes(&settled),
            0o600,
            |_| Ok(()),
        )?;
        Ok(settled)
    }

    /// What `operation-status` reports for an id. A running entry is settled only under its
    /// run lock, after reading it again: an operation that finished between the first read
    /// and the lock keeps its outcome.
    pub fn status(&self, id: &OperationId) -> Result<OperationState, FsError> {
        self.status_between(id, &mut || {})
    }

    /// [`Journal::status`], running `between` after the first read (tests: an operation that
    /// finishes right then).
    fn status_between(
        &self,
        id: &OperationId,
        between: &mut dyn FnMut(),
    ) -> Result<OperationState, FsError> {
        let Some(entry) = self.read(id)? else {
            return self.status_without_entry(id);
        };
        between();
        let entry = match entry.state {
            EntryState::Running { step } => match self.lock_run(id, true)? {
                RunLock::Busy | RunLock::Missing => {
                    return Ok(OperationState::Running {
                        kind: entry.kind,
                        step,
                    });
                }
                RunLock::Held(lock) => {
                    let settled = match self.read(id) {
                        Ok(Some(now)) => self.settle(now).map(Some),
                        other => other,
                    };
                    self.release_run(id, lock);
                    match settled? {
                        Some(e) => e,
                        None => return Ok(OperationState::Unknown),
                    }
                }
            },
            _ => entry,
        };
        let kind = entry.kind;
        Ok(match entry.state {
            EntryState::Succeeded { result } => OperationState::Succeeded { kind, result },
            EntryState::Failed {
                failure,
                after_step,
            } => OperationState::Failed {
                kind,
                failure,
                after_step,
            },
            EntryState::Running { step } => OperationState::Running { kind, step },
        })
    }

    /// An id without an entry: running when a live process holds its run lock (an operation
    /// begun deferred, not committed yet: waiting for its Agent lock, or a no-op under way),
    /// unknown otherwise. A run file nobody holds is left to pruning.
    fn status_without_entry(&self, id: &OperationId) -> Result<OperationState, FsError> {
        match self.lock_run(id, false)? {
            RunLock::Missing | RunLock::Held(_) => Ok(OperationState::Unknown),
            RunLock::Busy => {
                // The holder writes the kind right after taking the lock: a reader can come
                // between the two for a moment.
                for _ in 0..50 {
                    if let Some(kind) = read_run_kind(&self.run_lock_path(id)) {
                        // Finished meanwhile? Then its entry says how.
                        if self.read(id)?.is_some() {
                            return self.status(id);
                        }
                        return Ok(OperationState::Running { kind, step: None });
                    }
                    std::thread::sleep(std::time::Duration::from_millis(1));
                }
                Ok(OperationState::Unknown)
            }
        }
    }

    /// Removes the run files of operations nobody runs any more (their process was killed),
    /// settling their entries first. Returns how many it removed.
    fn prune_run_files(&self, names: &[String]) -> Result<usize, FsError> {
        let mut removed = 0;
        for name in names {
            let Some(id) = name
                .strip_suffix(".run")
                .and_then(|s| OperationId::new(s).ok())
            else {
                continue;
            };
            let RunLock::Held(lock) = self.lock_run(&id, false)? else {
                continue;
            };
            // An unreadable entry is not ours to judge; status reports it.
            if let Ok(Some(entry)) = self.read(&id)
                && let Err(e) = self.settle(entry)
            {
                drop(lock);
                return Err(e);
            }
            self.release_run(&id, lock);
            removed += 1;
        }
        Ok(removed)
    }

    /// The prune index, locked; rebuilt first (reading every entry once, and settling the
    /// run files of killed operations) when it is missing or of another boot.
    fn index(&self) -> Result<index::Locked, FsError> {
        let mut scan = || -> Result<Vec<(u64, u64, OperationId)>, FsError> {
            counters::listing();
            let names = fsutil::list_dir(&self.dir)?;
            let run_files: Vec<String> = names
                .iter()
                .filter(|n| n.ends_with(".run"))
                .cloned()
                .collect();
            if self.prune_run_files(&run_files)? > 0 {
                fsutil::sync_dir(&self.dir)?;
            }
            let mut out = Vec::new();
            for name in names.iter().filter(|n| is_entry_name(n)) {
                let Some(id) = name
                    .strip_suffix(".json")
                    .and_then(|s| OperationId::new(s).ok())
                else {
                    continue;
                };
                counters::entry_read();
                // An unreadable entry is not ours to judge; it stays and is reported by status.
                if let Ok(e) = markers::read::<Entry>(&self.dir.join(name), "journal entry") {
                    out.push((e.started_at, e.expires_at, id));
                }
            }
            Ok(out)
        };
        index::Locked::open(&self.dir, self.boot_id.as_deref(), &mut scan)
    }

    /// Adds the index line of an entry about to be written for the first time.
    fn index_entry(&self, id: &OperationId, expires_at: u64) -> Result<(), FsError> {
        self.index()?.append(id, expires_at)
    }

    /// Removes the run files of operations nobody runs any more (their process was killed),
    /// settling their entries first. Lists the directory: the session runs it when it ends,
    /// not inside an operation. Returns how many it removed.
    pub fn sweep_run_files(&self) -> Result<usize, FsError> {
        counters::listing();
        let mut run_files = Vec::new();
        fsutil::for_each_name(&self.dir, |name| {
            if name.ends_with(".run") {
                run_files.push(name.to_owned());
            }
        })?;
        let removed = self.prune_run_files(&run_files)?;
        if removed > 0 {
            fsutil::sync_dir(&self.dir)?;
        }
        Ok(removed)
    }

    /// Drops the oldest entries beyond the limit, but never one whose envelope could still be
    /// replayed (not yet expired by the host's clock) and never a running one; before it
    /// removes any, it raises the watermark to the latest expiry among them (durably). An
    /// entry whose operation was killed is settled first, and its run file removed. Returns
    /// how many entries it removed.
    ///
    /// It looks at no more than [`index::SCAN_LIMIT`] index lines from the oldest, and reads
    /// no entry except one left running by a killed operation: one prune's cost is bounded
    /// whatever the journal's size. Lines that must stay (not expired yet, or running) are
    /// looked at again by the next prune; while the oldest lines all stay the journal stays
    /// over its limit, which is always safe.
    pub fn prune(&self, now: u64) -> Result<usize, FsError> {
        self.cheap_since_prune.store(0, Ordering::SeqCst);
        let mut index = self.index()?;
        let max = u64::try_from(self.max_entries).unwrap_or(u64::MAX);
        let Some(excess) = index.live().checked_sub(max).filter(|e| *e > 0) else {
            return Ok(0);
        };
        let lines = index.lines()?;
        let mut candidates: Vec<usize> = Vec::new();
        for (at, line) in lines.iter().enumerate() {
            if u64::try_from(candidates.len()).unwrap_or(u64::MAX) >= excess {
                break;
            }
            let Some(id) = line.id.as_ref().filter(|_| !line.dead) else {
                continue;
            };
            if line.expires_at >= now {
                continue;
            }
            match self.lock_run(id, false)? {
                RunLock::Busy => continue,
                RunLock::Missing => candidates.push(at),
                RunLock::Held(lock) => {
                    // Its process was killed: settled first, as a reader would.
                    if let Ok(Some(entry)) = self.read(id)
                        && let Err(e) = self.settle(entry)
                    {
                        drop(lock);
                        return Err(e);
                    }
                    self.release_run(id, lock);
                    candidates.push(at);
                }
            }
        }
        let mut consumed = vec![false; lines.len()];
        for line in lines.iter().enumerate().filter(|(_, l)| l.dead) {
            consumed[line.0] = true;
        }
        let mut removed = 0usize;
        let mut gone = 0u64;
        if let Some(latest) = candidates.iter().map(|at| lines[*at].expires_at).max() {
            if latest > self.watermark()? {
                self.write_watermark(latest)?;
            }
            for at in &candidates {
                let Some(id) = &lines[*at].id else { continue };
                match std::fs::remove_file(self.entry_path(id)) {
                    Ok(()) => removed += 1,
                    // Never written (a failed write), or removed by a prune killed before it
                    // moved past the line.
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => {
                        tracing::warn!(operation_id = %id, "cannot prune the journal entry: {e}");
                        continue;
                    }
                }
                consumed[*at] = true;
                gone += 1;
            }
        }
        let prefix = consumed.iter().take_while(|c| **c).count();
        let head = match prefix.checked_sub(1) {
            Some(last) => lines[last].end,
            None => lines.first().map_or(0, |l| l.offset),
        };
        for at in &candidates {
            if *at >= prefix && consumed[*at] {
                index.mark_dead(&lines[*at])?;
            }
        }
        if removed > 0 {
            fsutil::sync_dir(&self.dir)?;
        }
        index.advance(head, gone)?;
        Ok(removed)
    }
}

/// Writes the operation's kind into its run file, whose lock the caller holds.
fn write_run_kind(file: &File, kind: OperationKind) -> std::io::Result<()> {
    use std::io::{Seek, Write};
    let mut f = file;
    f.set_len(0)?;
    f.seek(std::io::SeekFrom::Start(0))?;
    f.write_all(kind.as_str().as_bytes())
}

/// The kind a run file names, if it names one yet.
fn read_run_kind(path: &Path) -> Option<OperationKind> {
    let text = std::fs::read_to_string(path).ok()?;
    serde_json::from_value(serde_json::Value::String(text)).ok()
}

/// An entry's file name (`<operation id>.json`; dot files are the journal's own records).
fn is_entry_name(name: &str) -> bool {
    name.ends_with(".json") && !name.starts_with('.')
}

/// The outcome a settled entry stands for.
fn outcome_of(entry: Entry) -> Outcome {
    match entry.state {
        EntryState::Succeeded { result } => Outcome::Succeeded { result: *result },
        EntryState::Failed { failure, .. } => Outcome::Failed { failure },
        // Settled entries are never running; answer as a dead one would be.
        EntryState::Running { step } => Outcome::Failed {
            failure: aborted_failure(step),
        },
    }
}

/// The failure recorded for an operation whose process died or whose session closed.
pub fn aborted_failure(step: Option<Step>) -> Failure {
    let after = step
        .map(|s| {
            format!(
                " after step {}",
                serde_json::to_string(&s).unwrap_or_default()
            )
        })
        .unwrap_or_default();
    Failure::new(
        FailureCode::SessionClosed,
        format!(
            "the operation was aborted{after}; the host is consistent and the operation can be retried"
        ),
    )
}

impl RunHandle {
    /// Records the step about to start.
    pub fn step(&mut self, step: Step) -> Result<(), FsError> {
        self.entry.state = EntryState::Running { step: Some(step) };
        if !self.committed {
            // Written with the entry at commit, if the operation ever commits.
            return Ok(());
        }
        // Not fsynced: after a power cut the record names an earlier step, which is still
        // true ("aborted after step X" with an earlier X). The start and the outcome are.
        fsutil::replace_quickly(&self.path, &markers::to_bytes(&self.entry), 0o600)
    }

    /// The last step recorded.
    pub fn last_step(&self) -> Option<Step> {
        match &self.entry.state {
            EntryState::Running { step } => *step,
            _ => None,
        }
    }

    /// Writes the running entry, with the last step, durably: from now on the operation may
    /// change the host. Once only; later calls do nothing.
    pub fn commit(&mut self) -> Result<(), FsError> {
        if self.committed {
            return Ok(());
        }
        self.journal
            .index_entry(&self.entry.operation_id, self.entry.expires_at)?;
        fsutil::write_atomic(&self.path, &markers::to_bytes(&self.entry), 0o600, |_| {
            Ok(())
        })?;
        self.committed = true;
        Ok(())
    }

    /// Whether [`RunHandle::commit`] ran (or the entry was begun durably).
    pub fn is_committed(&self) -> bool {
        self.committed
    }

    /// Records the outcome and releases the run lock: durably if the operation committed,
    /// otherwise without fsync once `.unsynced.json` covers it (see the module documentation).
    pub fn finish(mut self, outcome: &Outcome, after_step: Option<Step>) -> Result<(), FsError> {
        self.entry.state = match outcome {
            Outcome::Succeeded { result } => EntryState::Succeeded {
                result: Box::new(result.clone()),
            },
            Outcome::Failed { failure } => EntryState::Failed {
                failure: failure.clone(),
                after_step,
            },
        };
        let bytes = markers::to_bytes(&self.entry);
        if !self.committed
            && let Err(e) = self
                .journal
                .index_entry(&self.entry.operation_id, self.entry.expires_at)
        {
            // The record matters more than its line: unindexed, the entry is pruned only
            // after the next rebuild of the index.
            tracing::warn!(operation_id = %self.entry.operation_id, "cannot index the journal entry: {e}");
        }
        let cheap = !self.committed
            && match self
                .journal
                .cover_unsynced(self.issued_at, self.entry.expires_at)
            {
                Ok(covered) => covered,
                Err(e) => {
                    tracing::warn!(operation_id = %self.entry.operation_id, "cannot raise the journal's unsynced bound, recording durably: {e}");
                    false
                }
            };
        let written = if cheap {
            fsutil::replace_quickly(&self.path, &bytes, 0o600)
        } else {
            fsutil::write_atomic(&self.path, &bytes, 0o600, |_| Ok(()))
        };
        // The run file goes whether or not the record could be written (a full disk): we
        // hold its lock, so nothing else runs the operation, and a committed entry left
        // "running" is settled as aborted by the next reader, as after a crash.
        fsutil::counters::other();
        let _ = std::fs::remove_file(&self.run_lock_path);
        written
    }
}

#[cfg(test)]
mod tests {
    use super::counters as journal_counters;
    use super::*;
    use crate::fsutil::counters;
    use clawfleet_protocol::result::DeleteAgentResult;

    fn id(s: &str) -> OperationId {
        OperationId::new(s).unwrap()
    }

    fn hash(c: char) -> Sha256Hex {
        Sha256Hex::new(c.to_string().repeat(64)).unwrap()
    }

    /// An envelope issued at 1 that expires at `expires_at`.
    fn v(expires_at: u64) -> Validity {
        Validity {
            issued_at: 1,
            expires_at,
        }
    }

    fn ok() -> Outcome {
        Outcome::Succeeded {
            result: OperationResult::DeleteAgent(DeleteAgentResult { removed: true }),
        }
    }

    #[test]
    fn replays_return_the_record_and_mismatches_are_caught() {
        let dir = tempfile::tempdir().unwrap();
        let j = Journal::open(dir.path(), 100).unwrap();
        let Begin::Run(h) = j
            .begin(&id("op1"), OperationKind::DeleteAgent, &hash('a'), v(10), 1)
            .unwrap()
        else {
            panic!()
        };
        h.finish(&ok(), None).unwrap();
        match j
            .begin(&id("op1"), OperationKind::DeleteAgent, &hash('a'), v(10), 2)
            .unwrap()
        {
            Begin::Recorded(o) => assert_eq!(o, ok()),
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            j.begin(&id("op1"), OperationKind::DeleteAgent, &hash('b'), v(10), 2)
                .unwrap(),
            Begin::Mismatch
        ));
        assert!(matches!(
            j.status(&id("op1")).unwrap(),
            OperationState::Succeeded { .. }
        ));
        assert_eq!(j.status(&id("nope")).unwrap(), OperationState::Unknown);
    }

    #[test]
    fn a_running_entry_is_in_progress_and_a_dead_one_is_aborted() {
        let dir = tempfile::tempdir().unwrap();
        let j = Journal::open(dir.path(), 100).unwrap();
        let Begin::Run(mut h) = j
            .begin(
                &id("op2"),
                OperationKind::ActivateRevision,
                &hash('a'),
                v(10),
                1,
            )
            .unwrap()
        else {
            panic!()
        };
        h.step(Step::Restart).unwrap();
        assert!(matches!(
            j.status(&id("op2")).unwrap(),
            OperationState::Running {
                step: Some(Step::Restart),
                ..
            }
        ));
        assert!(matches!(
            j.begin(
                &id("op2"),
                OperationKind::ActivateRevision,
                &hash('a'),
                v(10),
                1
            )
            .unwrap(),
            Begin::InProgress
        ));
        // The process "dies": its lock goes away without finish().
        drop(h);
        match j.status(&id("op2")).unwrap() {
            OperationState::Failed {
                failure,
                after_step,
                ..
            } => {
                assert_eq!(failure.code, FailureCode::SessionClosed);
                assert_eq!(after_step, Some(Step::Restart));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn pruning_keeps_unexpired_entries() {
        let dir = tempfile::tempdir().unwrap();
        let j = Journal::open(dir.path(), 16).unwrap();
        for i in 0..40u64 {
            let expires = if i < 30 { 100 } else { 10_000 };
            let Begin::Run(h) = j
                .begin(
                    &id(&format!("op{i}")),
                    OperationKind::DeleteAgent,
                    &hash('a'),
                    v(expires),
                    i,
                )
                .unwrap()
            else {
                panic!()
            };
            h.finish(&ok(), None).unwrap();
        }
        let removed = j.prune(1000).unwrap();
        assert_eq!(removed, 24);
        for i in 30..40 {
            assert!(matches!(
                j.status(&id(&format!("op{i}"))).unwrap(),
                OperationState::Succeeded { .. }
            ));
        }
        assert_eq!(j.status(&id("op0")).unwrap(), OperationState::Unknown);
    }

    /// Over the limit with nothing expired, a prune removes nothing and reads no entry; once
    /// entries expire it removes the oldest of them.
    #[test]
    fn a_prune_with_nothing_expired_waits_for_the_first_expiry() {
        let dir = tempfile::tempdir().unwrap();
        let j = Journal::open(dir.path(), 16).unwrap();
        let record = |op: &str, expires: u64, now: u64| {
            begin_run(&j, op, expires, now).finish(&ok(), None).unwrap();
        };
        for i in 0..20u64 {
            record(&format!("op{i}"), 500 + i, 100);
        }
        journal_counters::reset();
        assert_eq!(j.prune(100).unwrap(), 0);
        assert_eq!(journal_counters::get(), Default::default());
        // An entry that has already expired goes, though newer than the ones that stay.
        record("short", 50, 150);
        assert_eq!(j.prune(200).unwrap(), 1);
        assert_eq!(j.prune(500).unwrap(), 0);
        // 20 entries over a limit of 16, and by 503 three have expired: op0..op2.
        assert_eq!(j.prune(503).unwrap(), 3);
        for op in ["op0", "op2", "short"] {
            assert_eq!(j.status(&id(op)).unwrap(), OperationState::Unknown);
        }
        assert!(matches!(
            j.status(&id("op3")).unwrap(),
            OperationState::Succeeded { .. }
        ));
        // Still over (18 entries with one more): the next look is after op3's expiry.
        record("later", 700, 503);
        assert_eq!(j.prune(503).unwrap(), 0);
        assert_eq!(j.prune(504).unwrap(), 1);
        assert_eq!(j.status(&id("op3")).unwrap(), OperationState::Unknown);
    }

    fn begin_run(j: &Journal, op: &str, expires: u64, now: u64) -> RunHandle {
        match j
            .begin(
                &id(op),
                OperationKind::DeleteAgent,
                &hash('a'),
                v(expires),
                now,
            )
            .unwrap()
        {
            Begin::Run(h) => h,
            other => panic!("{op}: {other:?}"),
        }
    }

    /// The issue's scenario at the journal: the host clock runs ahead, pruning removes an
    /// entry whose envelope had not expired by real time, the clock is stepped back, and the
    /// same envelope comes again.
    #[test]
    fn pruning_raises_a_watermark_that_refuses_what_it_can_no_longer_recognise() {
        let dir = tempfile::tempdir().unwrap();
        let j = Journal::open(dir.path(), 2).unwrap();
        let real_now = 1_000;
        begin_run(&j, "del-1", real_now + 300, real_now)
            .finish(&ok(), None)
            .unwrap();
        // The clock an hour ahead: three more operations, then a prune that removes del-1.
        let ahead = real_now + 3_600;
        for i in 0..3 {
            begin_run(&j, &format!("later-{i}"), ahead + 300, ahead)
                .finish(&ok(), None)
                .unwrap();
        }
        assert_eq!(j.prune(ahead).unwrap(), 1);
        assert_eq!(j.status(&id("del-1")).unwrap(), OperationState::Unknown);
        assert_eq!(j.watermark().unwrap(), real_now + 300);
        // Back to real time: the replay of del-1 (same body, still unexpired) is refused.
        match j
            .begin(
                &id("del-1"),
                OperationKind::DeleteAgent,
                &hash('a'),
                v(real_now + 300),
                real_now,
            )
            .unwrap()
        {
            Begin::Unverifiable {
                expires_at,
                watermark,
            } => assert_eq!((expires_at, watermark), (real_now + 300, real_now + 300)),
            other => panic!("{other:?}"),
        }
        assert!(!dir.path().join("del-1.run").exists());
        assert!(!dir.path().join("del-1.json").exists());
        // A fresh envelope expires later than anything pruned, and runs.
        begin_run(&j, "fresh", real_now + 301, real_now + 1)
            .finish(&ok(), None)
            .unwrap();
        // The watermark survives a reopen and never goes down.
        let j = Journal::open(dir.path(), 2).unwrap();
        assert_eq!(j.watermark().unwrap(), real_now + 300);
        assert!(j.prune(real_now + 10).unwrap() <= 1);
        assert!(j.watermark().unwrap() >= real_now + 300);
    }

    #[test]
    fn operation_status_never_rewrites_a_just_finished_outcome_as_aborted() {
        let dir = tempfile::tempdir().unwrap();
        let j = Journal::open(dir.path(), 100).unwrap();
        let mut h = Some(begin_run(&j, "op3", 10, 1));
        // The operation finishes between operation-status's first read (running) and its
        // look at the run lock.
        let state = j
            .status_between(&id("op3"), &mut || {
                if let Some(h) = h.take() {
                    h.finish(&ok(), None).unwrap();
                }
            })
            .unwrap();
        assert!(
            matches!(state, OperationState::Succeeded { .. }),
            "{state:?}"
        );
        assert!(matches!(
            j.status(&id("op3")).unwrap(),
            OperationState::Succeeded { .. }
        ));
    }

    #[test]
    fn run_files_of_killed_operations_are_pruned_and_live_ones_kept() {
        let dir = tempfile::tempdir().unwrap();
        let j = Journal::open(dir.path(), 100).unwrap();
        let mut killed = begin_run(&j, "killed", 10, 1);
        killed.step(Step::Account).unwrap();
        // The process dies: its lock goes, its run file stays.
        drop(killed);
        assert!(dir.path().join("killed.run").exists());
        // A run file with no entry at all (killed between the two).
        std::fs::write(dir.path().join("orphan.run"), b"").unwrap();
        let live = begin_run(&j, "live", 10, 1);
        assert_eq!(j.sweep_run_files().unwrap(), 2);
        assert!(!dir.path().join("killed.run").exists());
        assert!(!dir.path().join("orphan.run").exists());
        assert!(dir.path().join("live.run").exists());
        match j.status(&id("killed")).unwrap() {
            OperationState::Failed { after_step, .. } => {
                assert_eq!(after_step, Some(Step::Account))
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            j.status(&id("live")).unwrap(),
            OperationState::Running { .. }
        ));
        live.finish(&ok(), None).unwrap();
        assert!(!dir.path().join("live.run").exists());
    }

    fn begin_deferred(j: &Journal, op: &str, body: char, expires: u64) -> Begin {
        j.begin_deferred(
            &id(op),
            OperationKind::PrepareRevision,
            &hash(body),
            v(expires),
            1,
        )
        .unwrap()
    }

    /// A no-op's record: no entry until the outcome, which is written without fsync once the
    /// boot's bound covers it; replays and mismatches are caught exactly as for others.
    #[test]
    fn a_deferred_operation_that_never_commits_is_recorded_cheaply_and_replay_safe() {
        let dir = tempfile::tempdir().unwrap();
        let j = Journal::open_in_boot(dir.path(), 100, Some("boot-a".into())).unwrap();
        let Begin::Run(mut h) = begin_deferred(&j, "noop-1", 'a', 1_000) else {
            panic!()
        };
        h.step(Step::Verify).unwrap();
        // Nothing on disk but the run file; a second session with the id waits its turn.
        assert!(!dir.path().join("noop-1.json").exists());
        assert!(matches!(
            j.status(&id("noop-1")).unwrap(),
            OperationState::Running { .. }
        ));
        assert!(matches!(
            begin_deferred(&j, "noop-1", 'a', 1_000),
            Begin::InProgress
        ));
        counters::reset();
        h.finish(&ok(), None).unwrap();
        // The first cheap record raised the boot's bound durably (one write_atomic) ...
        let first = counters::get();
        assert_eq!((first.fsyncs, first.renames), (2, 2), "{first:?}");
        let Begin::Run(h) = begin_deferred(&j, "noop-2", 'a', 1_000 + UNSYNCED_HEADROOM) else {
            panic!()
        };
        counters::reset();
        h.finish(&ok(), None).unwrap();
        // ... the next within its headroom is one rename, no fsync.
        let next = counters::get();
        assert_eq!((next.fsyncs, next.renames), (0, 1), "{next:?}");
        match begin_deferred(&j, "noop-1", 'a', 1_000) {
            Begin::Recorded(o) => assert_eq!(o, ok()),
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            begin_deferred(&j, "noop-1", 'b', 1_000),
            Begin::Mismatch
        ));
        assert!(matches!(
            j.status(&id("noop-2")).unwrap(),
            OperationState::Succeeded { .. }
        ));
        assert!(!dir.path().join("noop-1.run").exists());
    }

    /// Issue 27: `operation-status` answered `unknown` while a deferred operation waited for
    /// its Agent lock (no entry yet). Its live run lock says it is running.
    #[test]
    fn a_deferred_operation_not_yet_committed_is_running() {
        let dir = tempfile::tempdir().unwrap();
        let j = Journal::open_in_boot(dir.path(), 100, Some("boot-a".into())).unwrap();
        let Begin::Run(h) = begin_deferred(&j, "waiting", 'a', 1_000) else {
            panic!()
        };
        assert_eq!(
            j.status(&id("waiting")).unwrap(),
            OperationState::Running {
                kind: OperationKind::PrepareRevision,
                step: None
            }
        );
        h.finish(&ok(), None).unwrap();
        assert!(matches!(
            j.status(&id("waiting")).unwrap(),
            OperationState::Succeeded { .. }
        ));
        // A run file nobody holds (a killed process) is not running.
        let Begin::Run(h) = begin_deferred(&j, "killed", 'a', 1_000) else {
            panic!()
        };
        drop(h);
        assert_eq!(j.status(&id("killed")).unwrap(), OperationState::Unknown);
        assert_eq!(j.status(&id("never")).unwrap(), OperationState::Unknown);
    }

    /// A committed operation is recorded as `begin` records it: running entry durable before
    /// the first change, the last step in it, a killed run reported aborted after that step.
    #[test]
    fn a_committed_deferred_operation_is_recorded_durably() {
        let dir = tempfile::tempdir().unwrap();
        let j = Journal::open_in_boot(dir.path(), 100, Some("boot-a".into())).unwrap();
        let Begin::Run(mut h) = begin_deferred(&j, "change", 'a', 1_000) else {
            panic!()
        };
        h.step(Step::Verify).unwrap();
        counters::reset();
        h.commit().unwrap();
        assert!(h.is_committed());
        assert_eq!(counters::get().fsyncs, 2);
        assert!(matches!(
            j.status(&id("change")).unwrap(),
            OperationState::Running {
                step: Some(Step::Verify),
                ..
            }
        ));
        h.step(Step::Snapshot).unwrap();
        drop(h);
        match j.status(&id("change")).unwrap() {
            OperationState::Failed { after_step, .. } => {
                assert_eq!(after_step, Some(Step::Snapshot))
            }
            other => panic!("{other:?}"),
        }
        // No unsynced bound was needed.
        assert!(!dir.path().join(UNSYNCED_FILE).exists());
    }

    /// A crash can lose a record written without fsync. The journal of the next boot refuses
    /// every unknown envelope issued and expiring within that boot's bounds, so no such
    /// envelope runs again, while one issued later (or expiring later) does; a reopen in the
    /// same boot changes nothing.
    #[test]
    fn after_a_reboot_the_unsynced_bounds_refuse_what_may_have_been_lost() {
        let dir = tempfile::tempdir().unwrap();
        let j = Journal::open_in_boot(dir.path(), 100, Some("boot-a".into())).unwrap();
        let Begin::Run(h) = begin_deferred(&j, "noop-1", 'a', 1_000) else {
            panic!()
        };
        h.finish(&ok(), None).unwrap();
        let bound = 1_000 + UNSYNCED_HEADROOM;
        // Same boot: nothing changes.
        let j = Journal::open_in_boot(dir.path(), 100, Some("boot-a".into())).unwrap();
        assert_eq!(j.watermark().unwrap(), 0);
        assert!(!dir.path().join(CRASHED_FILE).exists());
        // The record is lost in a power cut, and the host boots again.
        std::fs::remove_file(dir.path().join("noop-1.json")).unwrap();
        let j = Journal::open_in_boot(dir.path(), 100, Some("boot-b".into())).unwrap();
        assert!(!dir.path().join(UNSYNCED_FILE).exists());
        assert!(matches!(
            begin_deferred(&j, "noop-1", 'a', 1_000),
            Begin::LostInCrash { .. }
        ));
        assert!(matches!(
            begin_deferred(&j, "issued-then", 'a', bound),
            Begin::LostInCrash { .. }
        ));
        assert!(matches!(
            begin_deferred(&j, "fresh", 'a', bound + 1),
            Begin::Run(_)
        ));
        // Without a boot id nothing is written unsynced.
        let j = Journal::open_in_boot(dir.path(), 100, None).unwrap();
        let Begin::Run(h) = begin_deferred(&j, "noop-3", 'a', bound + 100) else {
            panic!()
        };
        counters::reset();
        h.finish(&ok(), None).unwrap();
        assert_eq!(counters::get().fsyncs, 2);
        assert!(!dir.path().join(UNSYNCED_FILE).exists());
    }

    fn deferred_at(j: &Journal, op: &str, issued_at: u64, expires_at: u64) -> Begin {
        j.begin_deferred(
            &id(op),
            OperationKind::PrepareRevision,
            &hash('a'),
            Validity {
                issued_at,
                expires_at,
            },
            issued_at,
        )
        .unwrap()
    }

    /// Issue 27: one no-op under a 3,600 s envelope, then a clean reboot. The refusal covers
    /// only envelopes issued by the last unsynced record's issue time: every envelope the
    /// coordinator signs after the reboot runs whatever its lifetime (a bound on expiry alone
    /// refused every 600 s envelope for the next 50 minutes), an id the journal still holds
    /// answers from its record, and one issued before the crash and unknown is refused.
    #[test]
    fn after_a_reboot_only_envelopes_issued_before_it_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let t0 = 1_800_000_000;
        let j = Journal::open_in_boot(dir.path(), 100, Some("boot-a".into())).unwrap();
        let Begin::Run(h) = deferred_at(&j, "long-noop", t0, t0 + 3_600) else {
            panic!()
        };
        h.finish(&ok(), None).unwrap();
        let Begin::Run(h) = deferred_at(&j, "kept-noop", t0, t0 + 600) else {
            panic!()
        };
        h.finish(&ok(), None).unwrap();
        // A clean reboot a minute later: the records survived (long-noop's is lost below).
        std::fs::remove_file(dir.path().join("long-noop.json")).unwrap();
        let j = Journal::open_in_boot(dir.path(), 100, Some("boot-b".into())).unwrap();
        let after = t0 + 60;
        match deferred_at(&j, "new-600", after, after + 600) {
            Begin::Run(h) => h.finish(&ok(), None).unwrap(),
            other => panic!("an envelope issued after the reboot was refused: {other:?}"),
        }
        assert!(matches!(
            deferred_at(&j, "new-10", after + 1, after + 11),
            Begin::Run(_)
        ));
        // The journal answers for what it holds.
        assert!(matches!(
            deferred_at(&j, "kept-noop", t0, t0 + 600),
            Begin::Recorded(_)
        ));
        // What may have run before the crash and is not known is refused.
        match deferred_at(&j, "long-noop", t0, t0 + 3_600) {
            Begin::LostInCrash {
                issued_at,
                issued_at_bound,
                expires_at_bound,
            } => assert_eq!(
                (issued_at, issued_at_bound, expires_at_bound),
                (t0, t0, t0 + 3_600 + UNSYNCED_HEADROOM)
            ),
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            deferred_at(&j, "other-then", t0 - 5, t0 + 100),
            Begin::LostInCrash { .. }
        ));
        // Nothing else was refused by the watermark, and the bounds survive a reopen.
        assert_eq!(j.watermark().unwrap(), 0);
        let j = Journal::open_in_boot(dir.path(), 100, Some("boot-b".into())).unwrap();
        assert!(matches!(
            deferred_at(&j, "long-noop", t0, t0 + 3_600),
            Begin::LostInCrash { .. }
        ));
    }

    /// A `.unsynced.json` an earlier hostd wrote (no issue bound) is settled as that hostd
    /// did, and in its own boot makes the new hostd record durably.
    #[test]
    fn an_unsynced_file_without_an_issue_bound_is_settled_as_before() {
        let dir = tempfile::tempdir().unwrap();
        let old = br#"{"schema":1,"bootId":"boot-a","expiresAtBound":5000}"#;
        std::fs::write(dir.path().join(UNSYNCED_FILE), old).unwrap();
        let j = Journal::open_in_boot(dir.path(), 100, Some("boot-a".into())).unwrap();
        let Begin::Run(h) = deferred_at(&j, "noop", 100, 200) else {
            panic!()
        };
        counters::reset();
        h.finish(&ok(), None).unwrap();
        assert_eq!(counters::get().fsyncs, 2, "recorded durably");
        assert_eq!(
            std::fs::read(dir.path().join(UNSYNCED_FILE)).unwrap(),
            old.to_vec()
        );
        let j = Journal::open_in_boot(dir.path(), 100, Some("boot-b".into())).unwrap();
        assert_eq!(j.watermark().unwrap(), 5000);
        assert!(matches!(
            deferred_at(&j, "late", 4_000, 5_000),
            Begin::Unverifiable { .. }
        ));
    }

    /// Issue 34: at its limit, every changing operation re-read the whole journal. One
    /// operation (begin, finish, prune) on a journal at its limit, every envelope expired,
    /// reads at most its own entry and lists nothing, and still removes the oldest entry.
    #[test]
    fn one_operation_on_a_journal_at_its_limit_reads_a_bounded_number_of_entries() {
        let dir = tempfile::tempdir().unwrap();
        let max = 3_000usize;
        // A journal an earlier hostd left at its limit (no index yet).
        for i in 0..max {
            let entry = Entry {
                schema: SCHEMA,
                operation_id: id(&format!("old-{i}")),
                kind: OperationKind::DeleteAgent,
                body_sha256: hash('a'),
                expires_at: 100 + i as u64,
                started_at: i as u64,
                state: EntryState::Succeeded {
                    result: Box::new(OperationResult::DeleteAgent(DeleteAgentResult {
                        removed: true,
                    })),
                },
            };
            std::fs::write(
                dir.path().join(format!("old-{i}.json")),
                markers::to_bytes(&entry),
            )
            .unwrap();
        }
        // Opening it builds the index, reading every entry once.
        journal_counters::reset();
        let j = Journal::open_in_boot(dir.path(), max, Some("boot-a".into())).unwrap();
        let built = journal_counters::get();
        assert_eq!((built.listings, built.entry_reads), (1, max as u64));
        let now = 1_000_000;
        for n in 0..50 {
            journal_counters::reset();
            begin_run(&j, &format!("new-{n}"), now + 600, now)
                .finish(&ok(), None)
                .unwrap();
            let removed = j.prune(now).unwrap();
            let reads = journal_counters::get();
            assert_eq!(removed, 1, "operation {n}");
            assert!(
                reads.entry_reads <= 2 && reads.listings == 0,
                "operation {n} on a journal of {max} entries: {reads:?}"
            );
            assert!(!dir.path().join(format!("old-{n}.json")).exists());
            assert!(dir.path().join(format!("old-{}.json", n + 1)).exists());
        }
        assert_eq!(j.watermark().unwrap(), 100 + 49);
        assert_eq!(
            j.status(&id("new-0")).unwrap(),
            OperationState::Succeeded {
                kind: OperationKind::DeleteAgent,
                result: Box::new(OperationResult::DeleteAgent(DeleteAgentResult {
                    removed: true
                }))
            }
        );
        let entries = fsutil::list_dir(dir.path())
            .unwrap()
            .into_iter()
            .filter(|n| is_entry_name(n))
            .count();
        assert_eq!(entries, max);
        // A new boot rebuilds the index once (a crash may have lost lines of it), a reopen in
        // the same boot does not.
        journal_counters::reset();
        drop(Journal::open_in_boot(dir.path(), max, Some("boot-b".into())).unwrap());
        assert_eq!(journal_counters::get().listings, 1);
        journal_counters::reset();
        let j = Journal::open_in_boot(dir.path(), max, Some("boot-b".into())).unwrap();
        assert_eq!(journal_counters::get(), Default::default());
        begin_run(&j, "after-reboot", now + 600, now)
            .finish(&ok(), None)
            .unwrap();
        assert_eq!(j.prune(now).unwrap(), 1);
        begin_run(&j, "after-reboot-2", now + 600, now)
            .finish(&ok(), None)
            .unwrap();
        assert_eq!(j.prune(now).unwrap(), 1);
        assert_eq!(journal_counters::get().listings, 0);
    }

    /// An entry that must stay (not expired, or running) does not hold the others back: the
    /// expired ones behind it go, and it goes once it can.
    #[test]
    fn pruning_passes_entries_that_must_stay_and_comes_back_to_them() {
        let dir = tempfile::tempdir().unwrap();
        let j = Journal::open_in_boot(dir.path(), 4, Some("boot-a".into())).unwrap();
        begin_run(&j, "long", 5_000, 1).finish(&ok(), None).unwrap();
        let running = begin_run(&j, "running", 50, 1);
        for i in 0..10 {
            begin_run(&j, &format!("short-{i}"), 100, 2)
                .finish(&ok(), None)
                .unwrap();
        }
        // 12 entries over a limit of 4: the 8 oldest expired ones go, long and running stay.
        assert_eq!(j.prune(1_000).unwrap(), 8);
        for i in 0..8 {
            assert_eq!(
                j.status(&id(&format!("short-{i}"))).unwrap(),
                OperationState::Unknown
            );
        }
        assert!(matches!(
            j.status(&id("long")).unwrap(),
            OperationState::Succeeded { .. }
        ));
        assert!(matches!(
            j.status(&id("running")).unwrap(),
            OperationState::Running { .. }
        ));
        assert_eq!(j.prune(1_000).unwrap(), 0);
        running.finish(&ok(), None).unwrap();
        begin_run(&j, "next", 6_000, 3).finish(&ok(), None).unwrap();
        // 5 entries: the oldest that can go is "running" (finished now).
        assert_eq!(j.prune(1_000).unwrap(), 1);
        assert_eq!(j.status(&id("running")).unwrap(), OperationState::Unknown);
        begin_run(&j, "next-2", 6_000, 4)
            .finish(&ok(), None)
            .unwrap();
        assert_eq!(j.prune(5_001).unwrap(), 1);
        assert_eq!(j.status(&id("long")).unwrap(), OperationState::Unknown);
        // A killed operation's entry is settled and pruned like any other.
        let mut killed = begin_run(&j, "killed", 5_100, 5);
        killed.step(Step::Account).unwrap();
        drop(killed);
        for i in 0..4 {
            begin_run(&j, &format!("fresh-{i}"), 9_000, 6)
                .finish(&ok(), None)
                .unwrap();
        }
        assert_eq!(j.prune(5_200).unwrap(), 3);
        assert_eq!(j.status(&id("killed")).unwrap(), OperationState::Unknown);
        assert!(!dir.path().join("killed.run").exists());
    }
}
