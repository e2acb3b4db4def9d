//! The operation journal: a bounded record of the outcome of every changing operation, keyed
//! by operation id. It makes replays safe (the same id and body return the recorded outcome,
//! a different body is refused) and answers `operation-status` after a dropped session.
//!
//! A running operation holds a flock on `<id>.run`; if the entry says "running" but nobody
//! holds that lock, the process died mid-operation and the entry is reported as aborted after
//! its last recorded step.

use std::fs::{File, OpenOptions, TryLockError};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use clawfleet_protocol::failure::{Failure, FailureCode};
use clawfleet_protocol::operation::OperationKind;
use clawfleet_protocol::result::{OperationResult, OperationState, Outcome, Step};
use clawfleet_protocol::{OperationId, Sha256Hex};
use serde::{Deserialize, Serialize};

use crate::fsutil::{self, FsError};
use crate::markers::{self, MarkerError, SCHEMA};

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
}

/// The journal directory.
#[derive(Debug, Clone)]
pub struct Journal {
    dir: PathBuf,
    max_entries: usize,
}

/// Progress recording for one running operation; holds its run lock.
#[derive(Debug)]
pub struct RunHandle {
    entry: Entry,
    path: PathBuf,
    run_lock_path: PathBuf,
    _run_lock: File,
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
    pub fn open(dir: &Path, max_entries: usize) -> Result<Self, FsError> {
        fsutil::ensure_dir(dir, 0o700)?;
        Ok(Self {
            dir: dir.to_path_buf(),
            max_entries,
        })
    }

    fn entry_path(&self, id: &OperationId) -> PathBuf {
        self.dir.join(format!("{id}.json"))
    }

    fn run_lock_path(&self, id: &OperationId) -> PathBuf {
        self.dir.join(format!("{id}.run"))
    }

    /// Registers an operation before it runs.
    pub fn begin(
        &self,
        id: &OperationId,
        kind: OperationKind,
        body_sha256: &Sha256Hex,
        expires_at: u64,
        now: u64,
    ) -> Result<Begin, FsError> {
        let run_lock_path = self.run_lock_path(id);
        let run_lock = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(&run_lock_path)
            .map_err(fsutil::io_err(&run_lock_path))?;
        match run_lock.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => {
                return Ok(match self.read(id)? {
                    Some(e) if &e.body_sha256 != body_sha256 => Begin::Mismatch,
                    _ => Begin::InProgress,
                });
            }
            Err(TryLockError::Error(e)) => return Err(fsutil::io_err(&run_lock_path)(e)),
        }
        if let Some(existing) = self.read(id)? {
            let _ = std::fs::remove_file(&run_lock_path);
            if &existing.body_sha256 != body_sha256 {
                return Ok(Begin::Mismatch);
            }
            return Ok(Begin::Recorded(self.settle(existing)?));
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
        fsutil::write_atomic(&path, &markers::to_bytes(&entry), 0o600, |_| Ok(()))?;
        Ok(Begin::Run(RunHandle {
            entry,
            path,
            run_lock_path,
            _run_lock: run_lock,
        }))
    }

    /// The kind of the operation recorded under an id, if any. Creates nothing: read-only
    /// operations use it to refuse an id that a recorded operation already has.
    pub fn recorded_kind(&self, id: &OperationId) -> Result<Option<OperationKind>, FsError> {
        Ok(self.read(id)?.map(|e| e.kind))
    }

    fn read(&self, id: &OperationId) -> Result<Option<Entry>, FsError> {
        markers::read_optional::<Entry>(&self.entry_path(id), "journal entry").map_err(entry_err)
    }

    /// Turns an entry whose process died while running into a failure record, and returns
    /// the outcome an entry stands for.
    fn settle(&self, entry: Entry) -> Result<Outcome, FsError> {
        Ok(match entry.state {
            EntryState::Succeeded { result } => Outcome::Succeeded { result: *result },
            EntryState::Failed { failure, .. } => Outcome::Failed { failure },
            EntryState::Running { step } => {
                let failure = aborted_failure(step);
                let settled = Entry {
                    state: EntryState::Failed {
                        failure: failure.clone(),
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
                Outcome::Failed { failure }
            }
        })
    }

    /// What `operation-status` reports for an id.
    pub fn status(&self, id: &OperationId) -> Result<OperationState, FsError> {
        let Some(entry) = self.read(id)? else {
            return Ok(OperationState::Unknown);
        };
        let kind = entry.kind;
        if let EntryState::Running { step } = entry.state {
            let path = self.run_lock_path(id);
            let live = match File::open(&path) {
                Ok(f) => matches!(f.try_lock(), Err(TryLockError::WouldBlock)),
                Err(_) => false,
            };
            if live {
                return Ok(OperationState::Running { kind, step });
            }
        }
        Ok(match self.settle(entry)? {
            Outcome::Succeeded { result } => OperationState::Succeeded {
                kind,
                result: Box::new(result),
            },
            Outcome::Failed { failure } => {
                let after_step = match self.read(id)?.map(|e| e.state) {
                    Some(EntryState::Failed { after_step, .. }) => after_step,
                    _ => None,
                };
                OperationState::Failed {
                    kind,
                    failure,
                    after_step,
                }
            }
        })
    }

    /// Drops the oldest entries beyond the limit, but never one whose envelope could still be
    /// replayed (not yet expired) and never a running one.
    pub fn prune(&self, now: u64) -> Result<usize, FsError> {
        let names = fsutil::list_dir(&self.dir)?;
        let json: Vec<&String> = names.iter().filter(|n| n.ends_with(".json")).collect();
        if json.len() <= self.max_entries {
            return Ok(0);
        }
        let mut entries: Vec<(u64, PathBuf)> = Vec::new();
        for name in json {
            let path = self.dir.join(name);
            match markers::read::<Entry>(&path, "journal entry") {
                Ok(e) if e.expires_at < now && !matches!(e.state, EntryState::Running { .. }) => {
                    entries.push((e.started_at, path))
                }
                Ok(_) => {}
                // An unreadable entry is not ours to judge; it stays and is reported by status.
                Err(_) => {}
            }
        }
        entries.sort();
        let excess = names.iter().filter(|n| n.ends_with(".json")).count() - self.max_entries;
        let mut removed = 0;
        for (_, path) in entries.into_iter().take(excess) {
            if std::fs::remove_file(&path).is_ok() {
                removed += 1;
            }
        }
        Ok(removed)
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

    /// Records the outcome and releases the run lock.
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
        fsutil::write_atomic(&self.path, &markers::to_bytes(&self.entry), 0o600, |_| {
            Ok(())
        })?;
        let _ = std::fs::remove_file(&self.run_lock_path);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clawfleet_protocol::result::DeleteAgentResult;

    fn id(s: &str) -> OperationId {
        OperationId::new(s).unwrap()
    }

    fn hash(c: char) -> Sha256Hex {
        Sha256Hex::new(c.to_string().repeat(64)).unwrap()
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
            .begin(&id("op1"), OperationKind::DeleteAgent, &hash('a'), 10, 1)
            .unwrap()
        else {
            panic!()
        };
        h.finish(&ok(), None).unwrap();
        match j
            .begin(&id("op1"), OperationKind::DeleteAgent, &hash('a'), 10, 2)
            .unwrap()
        {
            Begin::Recorded(o) => assert_eq!(o, ok()),
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            j.begin(&id("op1"), OperationKind::DeleteAgent, &hash('b'), 10, 2)
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
                10,
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
                10,
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
                    expires,
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
}
