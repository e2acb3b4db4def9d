//! One server's claim on the machine: a lock file held for its whole life and a record of its
//! run directory and postmaster, so a test process killed with SIGKILL is cleaned up by the next.
//!
//! `<state>/runs/<id>.lock` is held with `flock` by the owner (the kernel drops it when the
//! process dies, however it dies); `<state>/runs/<id>.json` names the run directory (data
//! directory, socket directory, certificates, server log) and the postmaster's pid with its start
//! time. A record whose lock is free belongs to a dead test process: its postmaster (only while
//! the start time still matches, so a reused pid is never hit) is shut down, its run directory
//! removed, and its server log kept in `<state>/logs/` for a post-mortem (pruned after 3 days).

use std::fs::{self, File, TryLockError};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, SystemTime};

use nix::sys::signal::Signal;
use serde::{Deserialize, Serialize};

use crate::config::HarnessConfig;
use crate::error::{Error, Result};
use crate::sys;

/// Version of the on-disk record format.
pub(crate) const RECORD_SCHEMA: u32 = 1;

/// Kept logs older than this are removed at the next start.
const KEEP_LOGS_FOR: Duration = Duration::from_secs(3 * 24 * 3600);

/// A lock file without a record this old is an abandoned claim (younger ones may be a run that is
/// between taking its lock and writing its first record).
const ABANDONED_LOCK_AGE: Duration = Duration::from_secs(3600);

/// After the postmaster is SIGKILLed, its children notice and exit by themselves; at most this
/// long (and at most the stop timeout).
const ORPHAN_GRACE: Duration = Duration::from_secs(3);

/// How often process exits are polled.
const STEP: Duration = Duration::from_millis(20);

/// The postmaster a run started.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ProcessRecord {
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
    pub port: u16,
    /// Socket directory, certificates and the server log (and the data directory without tmpfs).
    pub run_dir: PathBuf,
    /// The data directory (on tmpfs when available).
    pub data_dir: PathBuf,
    /// The running postmaster, if any.
    pub postmaster: Option<ProcessRecord>,
}

impl RunRecord {
    /// The server log inside the run directory.
    pub fn log_path(&self) -> PathBuf {
        self.run_dir.join(LOG_FILE)
    }

    /// The postmaster and the run directory, when they still exist.
    pub fn leftovers(&self) -> Vec<String> {
        let mut left = Vec::new();
        if let Some(p) = self.postmaster
            && sys::process_alive(p.pid, p.start_ticks)
        {
            left.push(format!("postmaster pid {}", p.pid));
        }
        for d in [&self.run_dir, &self.data_dir] {
            if d.exists() {
                left.push(format!("directory {}", d.display()));
            }
        }
        left
    }
}

/// Name of the server log in a run directory.
pub(crate) const LOG_FILE: &str = "postgres.log";

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
        sys::make_dir(&dir, 0o755, None)?;
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

/// Shuts a postmaster down: fast shutdown (SIGINT: aborts open transactions, stops every
/// backend, writes a checkpoint), then after `stop_timeout` immediate shutdown (SIGQUIT), then
/// after `stop_timeout` again [`kill_postmaster`]. Only signals the pid while its start time
/// matches. Returns what survived.
pub(crate) fn stop_postmaster(p: ProcessRecord, stop_timeout: Duration) -> Vec<String> {
    let alive = || sys::process_alive(p.pid, p.start_ticks);
    for sig in [Signal::SIGINT, Signal::SIGQUIT] {
        if !alive() {
            return Vec::new();
        }
        sys::signal(p.pid, p.start_ticks, sig);
        if sys::wait_until(stop_timeout, STEP, || !alive()) {
            return Vec::new();
        }
    }
    kill_postmaster(p, stop_timeout.min(ORPHAN_GRACE))
}

/// SIGKILLs a postmaster, as a crash would: it is stopped first (SIGSTOP) so it cannot fork while
/// its children are listed (they call setsid(), so its process group does not hold them), then
/// killed; the children, which notice their postmaster's death and exit by themselves, get
/// `grace` and then SIGKILL, so that a new postmaster on the same data directory does not find
/// the old shared memory still attached. Returns what survived.
pub(crate) fn kill_postmaster(p: ProcessRecord, grace: Duration) -> Vec<String> {
    if !sys::process_alive(p.pid, p.start_ticks) {
        return Vec::new();
    }
    sys::signal(p.pid, p.start_ticks, Signal::SIGSTOP);
    let children = sys::children_of(p.pid);
    sys::signal(p.pid, p.start_ticks, Signal::SIGKILL);
    let mut problems = Vec::new();
    if !sys::wait_until(Duration::from_secs(5), STEP, || {
        !sys::process_alive(p.pid, p.start_ticks)
    }) {
        problems.push(format!("postmaster pid {} survived SIGKILL", p.pid));
    }
    let child_alive = |(pid, ticks): &(u32, u64)| sys::process_alive(*pid, Some(*ticks));
    if !sys::wait_until(grace, STEP, || !children.iter().any(child_alive)) {
        for (pid, ticks) in children.iter().filter(|c| child_alive(c)) {
            sys::signal(*pid, Some(*ticks), Signal::SIGKILL);
        }
        sys::wait_until(Duration::from_secs(5), STEP, || {
            !children.iter().any(child_alive)
        });
    }
    problems.extend(
        children
            .iter()
            .filter(|c| child_alive(c))
            .map(|(pid, _)| format!("server process pid {pid} survived SIGKILL")),
    );
    problems
}

/// Copies a run's server log to `<logs>/<id>.log` for a post-mortem; returns where.
pub(crate) fn keep_log(config: &HarnessConfig, rec: &RunRecord) -> Option<PathBuf> {
    let src = rec.log_path();
    if !src.exists() {
        return None;
    }
    let dir = config.logs_dir();
    sys::make_dir(&dir, 0o755, None).ok()?;
    let dst = dir.join(format!("{}.log", rec.id));
    fs::copy(&src, &dst).ok().map(|_| dst)
}

/// The System V segment a crashed server left: `postmaster.pid` is still in its data
/// directory (a clean shutdown removes both), its line 7 names the key and shmid, and
/// /proc/sysvipc/shm lists that key and shmid with nothing attached. PostgreSQL removes it itself
/// at the next start on the same data directory; this is for a data directory about to go.
fn leftover_sysv_segment(data_dir: &Path) -> Option<String> {
    let pid_file = fs::read_to_string(data_dir.join("postmaster.pid")).ok()?;
    let mut ids = pid_file.lines().nth(6)?.split_whitespace();
    let (key, shmid) = (ids.next()?.parse::<i64>().ok()?, ids.next()?);
    let table = fs::read_to_string("/proc/sysvipc/shm").ok()?;
    table.lines().skip(1).find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        let matches = f.first()?.parse::<i64>().ok()? == key && *f.get(1)? == shmid;
        (matches && *f.get(6)? == "0").then(|| shmid.to_string())
    })
}

/// Removes a run's leftover shared memory and its data and run directories, naming what could
/// not be removed. The postmaster must be gone.
pub(crate) fn remove_dirs(rec: &RunRecord) -> Vec<String> {
    let mut problems = Vec::new();
    if let Some(shmid) = leftover_sysv_segment(&rec.data_dir) {
        let removed = Command::new("ipcrm")
            .args(["-m", &shmid])
            .stdin(Stdio::null())
            .output();
        match removed {
            Ok(o) if o.status.success() => {}
            Ok(o) => problems.push(format!(
                "ipcrm -m {shmid} failed: {}",
                String::from_utf8_lossy(&o.stderr).trim()
            )),
            Err(e) => problems.push(format!("could not run ipcrm -m {shmid}: {e}")),
        }
    }
    for d in [&rec.data_dir, &rec.run_dir] {
        if d.exists()
            && let Err(e) = fs::remove_dir_all(d)
        {
            problems.push(format!("could not remove {}: {e}", d.display()));
        }
    }
    problems
}

/// Stops what a record names and removes its directories. Safe to repeat and on partial
/// records.
pub(crate) fn teardown(rec: &RunRecord, stop_timeout: Duration) -> Result<()> {
    let mut problems = match rec.postmaster {
        Some(p) => stop_postmaster(p, stop_timeout),
        None => Vec::new(),
    };
    problems.extend(remove_dirs(rec));
    Error::teardown(&rec.id, problems)
}

fn age(path: &Path) -> Option<Duration> {
    let modified = fs::metadata(path).and_then(|m| m.modified()).ok()?;
    SystemTime::now().duration_since(modified).ok()
}

/// Tears down every run whose owner is dead (lock free, record present), from its record, and
/// prunes old kept logs. Runs of live processes, including this one, are left alone. Returns the
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
        // A record the owner was still writing when it died (write_atomic's temporary file) may
        // be the only one naming its postmaster.
        let tmps: Vec<PathBuf> = fs::read_dir(&dir)
            .map(|entries| {
                entries
                    .filter_map(|e| e.ok())
                    .filter(|e| {
                        e.file_name()
                            .to_string_lossy()
                            .starts_with(&format!("{id}.tmp-"))
                    })
                    .map(|e| e.path())
                    .collect()
            })
            .unwrap_or_default();
        let found = match read_record(&record_path) {
            Ok(None) => Ok(tmps.iter().find_map(|p| read_record(p).ok().flatten())),
            other => other,
        };
        match found {
            Ok(Some(rec)) => {
                eprintln!(
                    "clawfleet-pg-tests: reclaiming PostgreSQL run {id} left by dead pid {}",
                    rec.owner_pid
                );
                let kept = keep_log(config, &rec);
                match teardown(&rec, config.stop_timeout) {
                    Ok(()) => {
                        if let Some(log) = kept {
                            eprintln!("clawfleet-pg-tests: its server log is in {}", log.display());
                        }
                        let _ = fs::remove_file(&record_path);
                        tmps.iter().for_each(|t| drop(fs::remove_file(t)));
                        let _ = fs::remove_file(&lock_path);
                        reclaimed.push(rec);
                    }
                    Err(e) => errors.push(e.to_string()),
                }
            }
            Ok(None) => {
                tmps.iter().for_each(|t| drop(fs::remove_file(t)));
                if age(&lock_path).is_some_and(|a| a > ABANDONED_LOCK_AGE) {
                    let _ = fs::remove_file(&lock_path);
                }
            }
            Err(e) => errors.push(e.to_string()),
        }
    }
    prune_logs(&config.logs_dir());
    Error::teardown("stale runs", errors).map(|()| reclaimed)
}

fn prune_logs(dir: &Path) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for e in entries.filter_map(|e| e.ok()) {
        if age(&e.path()).is_some_and(|a| a > KEEP_LOGS_FOR) {
            let _ = fs::remove_file(e.path());
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
            bin_dir: PathBuf::from("/nonexistent"),
            state_dir: std::env::temp_dir()
                .join(format!("clawfleet-pg-run-{tag}-{}", std::process::id())),
            start_timeout: Duration::from_secs(5),
            stop_timeout: Duration::from_millis(300),
            keep_logs: false,
            data_on_tmpfs: false,
            uid: 0,
            gid: 0,
        }
    }

    #[test]
    fn record_round_trips_and_rejects_unknown_fields() {
        let rec = RunRecord {
            schema: RECORD_SCHEMA,
            id: "1-ab".into(),
            owner_pid: 1,
            port: 5999,
            run_dir: "/r".into(),
            data_dir: "/d".into(),
            postmaster: Some(ProcessRecord {
                pid: 7,
                start_ticks: Some(9),
            }),
        };
        let json = serde_json::to_string(&rec).unwrap();
        assert_eq!(serde_json::from_str::<RunRecord>(&json).unwrap(), rec);
        let extra = json.replacen('{', "{\"surprise\":1,", 1);
        assert!(serde_json::from_str::<RunRecord>(&extra).is_err());
    }

    /// A "postmaster" that ignores SIGINT and SIGQUIT (a shell trapping them) is still stopped,
    /// by SIGKILL, and so is its child; the dead owner's run directory goes, its log is kept,
    /// and a live run of this process is left alone.
    #[test]
    fn a_dead_owners_run_is_reclaimed_and_a_live_one_is_not() {
        let cfg = temp_config("reclaim");
        let runs = cfg.runs_dir();
        sys::create_dir_all(&runs).unwrap();
        let run_dir = runs.join("dead");
        sys::create_dir_all(&run_dir).unwrap();
        fs::write(run_dir.join(LOG_FILE), "last words\n").unwrap();
        let mut child = Command::new("sh")
            .args(["-c", "trap '' INT QUIT; sleep 60 & wait"])
            .spawn()
            .unwrap();
        let pid = child.id();
        assert!(sys::wait_until(
            Duration::from_secs(5),
            Duration::from_millis(20),
            || { !sys::children_of(pid).is_empty() }
        ));
        let grandchild = sys::children_of(pid)[0];
        let rec = RunRecord {
            schema: RECORD_SCHEMA,
            id: "dead".into(),
            owner_pid: 999_999,
            port: 1,
            run_dir: run_dir.clone(),
            data_dir: run_dir.join("data"),
            postmaster: Some(ProcessRecord {
                pid,
                start_ticks: sys::proc_stat(pid).map(|s| s.start_ticks),
            }),
        };
        fs::write(runs.join("dead.lock"), "").unwrap();
        write_record(&runs.join("dead.json"), &rec).unwrap();
        // An owner that died while writing its record: only the temporary file names its run.
        let half_dir = runs.join("half");
        sys::create_dir_all(&half_dir).unwrap();
        let half = RunRecord {
            id: "half".into(),
            run_dir: half_dir.clone(),
            data_dir: half_dir.join("data"),
            postmaster: None,
            ..rec.clone()
        };
        fs::write(runs.join("half.lock"), "").unwrap();
        fs::write(
            runs.join("half.tmp-123"),
            serde_json::to_vec(&half).unwrap(),
        )
        .unwrap();
        let live = Run::claim(&cfg, "live").unwrap();
        write_record(
            &live.record_path,
            &RunRecord {
                id: "live".into(),
                postmaster: None,
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
        assert_eq!(
            reclaimed.iter().map(|r| r.id.as_str()).collect::<Vec<_>>(),
            vec!["dead", "half"]
        );
        assert!(!half_dir.exists());
        assert!(!runs.join("half.tmp-123").exists() && !runs.join("half.lock").exists());
        let status = child.wait().unwrap();
        assert!(!status.success());
        assert!(!sys::process_alive(grandchild.0, Some(grandchild.1)));
        assert!(!run_dir.exists());
        assert!(!runs.join("dead.json").exists());
        assert_eq!(
            fs::read_to_string(cfg.logs_dir().join("dead.log")).unwrap(),
            "last words\n"
        );
        assert!(live.record_path.exists());
        assert!(rec.leftovers().is_empty(), "{:?}", rec.leftovers());
        live.forget();
        drop(live);
        fs::remove_dir_all(&cfg.state_dir).unwrap();
    }
}
