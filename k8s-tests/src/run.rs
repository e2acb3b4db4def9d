//! One control plane's claim on the machine: a lock file held for its whole life and a record of
//! every pid and directory it created, so a run killed with SIGKILL is torn down by the next one.
//!
//! `<state>/runs/<id>.lock` is held with `flock` by the owner (the kernel drops it when the
//! process dies, however it dies); `<state>/runs/<id>.json` lists the run directory, etcd's data
//! directory, the logs directory and each component's pid with its start time. A record whose
//! lock is free belongs to a dead run: its pids (only while the start time still matches, so a
//! reused pid is never hit) get SIGTERM then SIGKILL, and its directories are removed; its logs
//! stay for a post-mortem (old ones are pruned).

use std::fs::{self, File, TryLockError};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use nix::sys::signal::Signal;
use serde::{Deserialize, Serialize};

use crate::config::HarnessConfig;
use crate::error::{Error, Result};
use crate::sys;

/// Version of the on-disk record format.
pub(crate) const RECORD_SCHEMA: u32 = 1;

/// Logs of dead or failed runs older than this are removed at the next start.
const KEEP_LOGS_FOR: Duration = Duration::from_secs(3 * 24 * 3600);

/// One process a run started.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ProcessRecord {
    pub component: String,
    pub pid: u32,
    /// Start time in clock ticks since boot (from `/proc/<pid>/stat`), against pid reuse.
    pub start_ticks: Option<u64>,
}

/// Everything a run created, as written to `<state>/runs/<id>.json`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RunRecord {
    pub schema: u32,
    pub id: String,
    /// Pid of the test process (informational; the lock is what counts).
    pub owner_pid: u32,
    /// Certificates, tokens, kubeconfigs, stage files.
    pub run_dir: PathBuf,
    /// etcd's data (on tmpfs when available).
    pub etcd_data_dir: PathBuf,
    /// Component logs; kept after failures.
    pub logs_dir: PathBuf,
    pub processes: Vec<ProcessRecord>,
}

impl RunRecord {
    /// Processes and directories of this record that still exist.
    pub fn leftovers(&self) -> Vec<String> {
        let mut left = Vec::new();
        for p in &self.processes {
            if sys::process_alive(p.pid, p.start_ticks) {
                left.push(format!("{} pid {}", p.component, p.pid));
            }
        }
        for d in [&self.run_dir, &self.etcd_data_dir] {
            if d.exists() {
                left.push(format!("directory {}", d.display()));
            }
        }
        left
    }
}

/// A run held by this process; dropping it releases the lock.
#[derive(Debug)]
pub(crate) struct Run {
    pub record_path: PathBuf,
    pub lock_path: PathBuf,
    _lock: File,
}

/// Non-blocking flock; `None` when another open file holds it.
fn try_lock(path: &Path) -> Result<Option<File>> {
    let f = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .map_err(|e| Error::io("open lock file", path, e))?;
    match f.try_lock() {
        Ok(()) => Ok(Some(f)),
        Err(TryLockError::WouldBlock) => Ok(None),
        Err(TryLockError::Error(e)) => Err(Error::io("lock", path, e)),
    }
}

pub(crate) fn read_record(path: &Path) -> Result<Option<RunRecord>> {
    match fs::read(path) {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| Error::BadRecord {
                path: path.to_path_buf(),
                reason: e.to_string(),
            }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(Error::io("read", path, e)),
    }
}

pub(crate) fn write_record(path: &Path, rec: &RunRecord) -> Result<()> {
    let json = serde_json::to_vec_pretty(rec).map_err(|e| Error::BadRecord {
        path: path.to_path_buf(),
        reason: e.to_string(),
    })?;
    sys::write_atomic(path, &json, 0o644)
}

impl Run {
    /// Claims a new run id (the lock is taken before anything is created).
    pub(crate) fn claim(config: &HarnessConfig, id: &str) -> Result<Run> {
        let dir = config.runs_dir();
        sys::create_dir_all(&dir)?;
        let lock_path = dir.join(format!("{id}.lock"));
        let Some(lock) = try_lock(&lock_path)? else {
            return Err(Error::Teardown {
                id: id.to_string(),
                detail: "its lock is already held".into(),
            });
        };
        Ok(Run {
            record_path: dir.join(format!("{id}.json")),
            lock_path,
            _lock: lock,
        })
    }

    /// Removes the record and the lock file (the lock is still held, so nobody else acts on
    /// this id meanwhile).
    pub(crate) fn forget(&self) {
        let _ = fs::remove_file(&self.record_path);
        let _ = fs::remove_file(&self.lock_path);
    }
}

/// Stops the recorded processes in dependency order (the apiserver's clients, then the
/// apiserver, then etcd: an apiserver whose etcd is gone, or that still serves watches of its
/// clients, takes many seconds to exit): SIGTERM, then SIGKILL after `stop_timeout` per group.
/// Only processes whose start time still matches the record are signalled.
pub(crate) fn stop_processes(processes: &[ProcessRecord], stop_timeout: Duration) -> Vec<String> {
    let rank = |p: &ProcessRecord| match p.component.as_str() {
        "etcd" => 2,
        "kube-apiserver" => 1,
        _ => 0,
    };
    let mut problems = Vec::new();
    for r in 0..=2 {
        let group: Vec<ProcessRecord> =
            processes.iter().filter(|p| rank(p) == r).cloned().collect();
        problems.extend(stop_group(&group, stop_timeout));
    }
    problems
}

fn stop_group(processes: &[ProcessRecord], stop_timeout: Duration) -> Vec<String> {
    let alive = |p: &ProcessRecord| sys::process_alive(p.pid, p.start_ticks);
    for p in processes {
        sys::signal(p.pid, p.start_ticks, Signal::SIGTERM);
    }
    let step = Duration::from_millis(50);
    if !sys::wait_until(stop_timeout, step, || !processes.iter().any(alive)) {
        for p in processes.iter().filter(|p| alive(p)) {
            sys::signal(p.pid, p.start_ticks, Signal::SIGKILL);
        }
        sys::wait_until(Duration::from_secs(5), step, || {
            !processes.iter().any(alive)
        });
    }
    processes
        .iter()
        .filter(|p| alive(p))
        .map(|p| format!("{} pid {} survived SIGKILL", p.component, p.pid))
        .collect()
}

/// Removes what a record names (logs excepted). Safe to repeat and on partial records.
pub(crate) fn teardown(rec: &RunRecord, stop_timeout: Duration) -> Result<()> {
    let mut problems = stop_processes(&rec.processes, stop_timeout);
    for d in [&rec.run_dir, &rec.etcd_data_dir] {
        if d.exists()
            && let Err(e) = fs::remove_dir_all(d)
        {
            problems.push(format!("could not remove {}: {e}", d.display()));
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(Error::Teardown {
            id: rec.id.clone(),
            detail: problems.join("; "),
        })
    }
}

/// Tears down every run whose owner is dead (lock free, record present), from its record, and
/// prunes old logs. Runs of live processes, including this one, are left alone. Returns the
/// reclaimed records.
pub fn reclaim_stale(config: &HarnessConfig) -> Result<Vec<RunRecord>> {
    let dir = config.runs_dir();
    let mut reclaimed = Vec::new();
    let mut errors = Vec::new();
    let Ok(entries) = fs::read_dir(&dir) else {
        return Ok(reclaimed);
    };
    let mut ids: Vec<String> = entries
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            name.strip_suffix(".lock").map(str::to_string)
        })
        .collect();
    ids.sort();
    for id in ids {
        let lock_path = dir.join(format!("{id}.lock"));
        let Some(_lock) = try_lock(&lock_path)? else {
            continue;
        };
        let record_path = dir.join(format!("{id}.json"));
        match read_record(&record_path) {
            Ok(Some(rec)) => {
                eprintln!(
                    "clawfleet-k8s-tests: reclaiming control plane {id} left by dead pid {}",
                    rec.owner_pid
                );
                match teardown(&rec, config.stop_timeout) {
                    Ok(()) => {
                        let _ = fs::remove_file(&record_path);
                        let _ = fs::remove_file(&lock_path);
                        reclaimed.push(rec);
                    }
                    Err(e) => errors.push(e.to_string()),
                }
            }
            Ok(None) => {
                let _ = fs::remove_file(&lock_path);
            }
            Err(e) => errors.push(e.to_string()),
        }
    }
    prune_logs(&config.logs_dir());
    if errors.is_empty() {
        Ok(reclaimed)
    } else {
        Err(Error::Teardown {
            id: "stale runs".into(),
            detail: errors.join("; "),
        })
    }
}

fn prune_logs(dir: &Path) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    let now = SystemTime::now();
    for e in entries.filter_map(|e| e.ok()) {
        let old = e
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|m| now.duration_since(m).ok())
            .is_some_and(|age| age > KEEP_LOGS_FOR);
        if old {
            let _ = fs::remove_dir_all(e.path());
        }
    }
}

/// The records of every run on the machine, each with whether its owner is alive.
pub fn list_runs(config: &HarnessConfig) -> Result<Vec<(RunRecord, bool)>> {
    let dir = config.runs_dir();
    let mut out = Vec::new();
    let Ok(entries) = fs::read_dir(&dir) else {
        return Ok(out);
    };
    for e in entries.filter_map(|e| e.ok()) {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(id) = name.strip_suffix(".json") else {
            continue;
        };
        if let Some(rec) = read_record(&e.path())? {
            let live = try_lock(&dir.join(format!("{id}.lock")))?.is_none();
            out.push((rec, live));
        }
    }
    out.sort_by(|a, b| a.0.id.cmp(&b.0.id));
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp_config(tag: &str) -> HarnessConfig {
        HarnessConfig {
            state_dir: std::env::temp_dir()
                .join(format!("clawfleet-k8s-run-{tag}-{}", std::process::id())),
            stop_timeout: Duration::from_secs(2),
            ..HarnessConfig::default()
        }
    }

    #[test]
    fn record_round_trips_and_rejects_unknown_fields() {
        let rec = RunRecord {
            schema: RECORD_SCHEMA,
            id: "1-ab".into(),
            owner_pid: 1,
            run_dir: "/r".into(),
            etcd_data_dir: "/e".into(),
            logs_dir: "/l".into(),
            processes: vec![ProcessRecord {
                component: "etcd".into(),
                pid: 7,
                start_ticks: Some(9),
            }],
        };
        let json = serde_json::to_string(&rec).unwrap();
        assert_eq!(serde_json::from_str::<RunRecord>(&json).unwrap(), rec);
        let extra = json.replacen('{', "{\"surprise\":1,", 1);
        assert!(serde_json::from_str::<RunRecord>(&extra).is_err());
    }

    #[test]
    fn a_dead_runs_process_and_dirs_are_reclaimed_and_a_live_run_is_not() {
        let cfg = temp_config("reclaim");
        let runs = cfg.runs_dir();
        fs::create_dir_all(&runs).unwrap();
        // A "dead" run: its lock file exists but nobody holds it; its process is a sleep.
        let mut child = std::process::Command::new("sleep")
            .arg("600")
            .spawn()
            .unwrap();
        let pid = child.id();
        let ticks = sys::proc_stat(pid).map(|s| s.1);
        let run_dir = cfg.state_dir.join("dead-run");
        fs::create_dir_all(&run_dir).unwrap();
        let rec = RunRecord {
            schema: RECORD_SCHEMA,
            id: "dead".into(),
            owner_pid: 999_999,
            run_dir: run_dir.clone(),
            etcd_data_dir: cfg.state_dir.join("dead-etcd"),
            logs_dir: cfg.logs_dir().join("dead"),
            processes: vec![ProcessRecord {
                component: "sleep".into(),
                pid,
                start_ticks: ticks,
            }],
        };
        fs::write(runs.join("dead.lock"), b"").unwrap();
        write_record(&runs.join("dead.json"), &rec).unwrap();
        // A live run of this very process.
        let live = Run::claim(&cfg, "live").unwrap();
        write_record(
            &live.record_path,
            &RunRecord {
                id: "live".into(),
                processes: vec![],
                ..rec.clone()
            },
        )
        .unwrap();

        let listed = list_runs(&cfg).unwrap();
        assert_eq!(
            listed
                .iter()
                .map(|(r, l)| (r.id.as_str(), *l))
                .collect::<Vec<_>>(),
            vec![("dead", false), ("live", true)]
        );
        let reclaimed = reclaim_stale(&cfg).unwrap();
        assert_eq!(reclaimed.len(), 1);
        // The sleep got SIGTERM; reap it (it is our child here).
        let status = child.wait().unwrap();
        assert!(!status.success());
        assert!(!run_dir.exists());
        assert!(!runs.join("dead.json").exists());
        assert!(live.record_path.exists());
        assert!(rec.leftovers().is_empty(), "{:?}", rec.leftovers());
        live.forget();
        drop(live);
        fs::remove_dir_all(&cfg.state_dir).unwrap();
    }
}
