//! Host numbers ("slots") shared by every test process on the machine.
//!
//! Slot N owns the names `cfvm-hN` (netns, runner-side veth, machine name, hostname), the
//! addresses 169.254.77.(4N-3) (runner) / .(4N-2) (host), `<state>/hosts/hN` and the cgroups
//! `cfvm-hN`. A process owns a slot while it holds `flock` on `<state>/slots/N.lock`; the kernel
//! drops the lock when the process dies, however it dies. Before creating anything the owner
//! writes `<state>/slots/N.json` with every id it is about to create (and updates it with the
//! nspawn pid), so a slot whose lock is free but whose record remains belongs to a dead run and
//! is torn down from the record alone.

use std::fs::{self, File, TryLockError};
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::Duration;

use nix::sys::signal::Signal;
use serde::{Deserialize, Serialize};

use crate::config::HarnessConfig;
use crate::error::{Error, Result};
use crate::sys;

/// Version of the on-disk record format.
const RECORD_SCHEMA: u32 = 1;

/// Everything a slot's owner created or is about to create, as written to `<state>/slots/N.json`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct SlotRecord {
    pub schema: u32,
    pub slot: u32,
    /// Pid of the test process that owns the slot (informational; the lock is what counts).
    pub owner_pid: u32,
    /// Machine name and hostname.
    pub name: String,
    pub netns: String,
    /// Runner-side veth name (the host side is `host0` inside the netns).
    pub veth: String,
    pub address: Ipv4Addr,
    pub runner_address: Ipv4Addr,
    /// Per-host directory: overlay upper/work, merged root, keys, console log.
    pub run_dir: PathBuf,
    /// Where the overlay is mounted (the container's root directory).
    pub root_mount: PathBuf,
    /// One cgroup directory per hierarchy the nspawn supervisor was placed in.
    pub cgroup_dirs: Vec<PathBuf>,
    /// systemd-nspawn's pid and its start time (clock ticks since boot, against pid reuse).
    pub nspawn_pid: Option<u32>,
    pub nspawn_start_ticks: Option<u64>,
}

impl SlotRecord {
    /// The ids slot `n` uses under `config` (nothing is created).
    pub fn plan(config: &HarnessConfig, n: u32) -> Self {
        let name = slot_name(n);
        let run_dir = config.hosts_dir().join(format!("h{n}"));
        SlotRecord {
            schema: RECORD_SCHEMA,
            slot: n,
            owner_pid: std::process::id(),
            netns: name.clone(),
            veth: name.clone(),
            address: host_address(n),
            runner_address: runner_address(n),
            root_mount: run_dir.join("root"),
            run_dir,
            cgroup_dirs: sys::cgroup_roots().iter().map(|r| r.join(&name)).collect(),
            nspawn_pid: None,
            nspawn_start_ticks: None,
            name,
        }
    }
}

impl SlotRecord {
    /// What of this record still exists on the runner (empty = fully cleaned up): the netns,
    /// the veth, mounts under the run dir, the cgroups, the nspawn process, any process booted
    /// with this machine name, the run dir.
    pub fn leftovers(&self) -> Vec<String> {
        let mut left = Vec::new();
        if Path::new("/run/netns").join(&self.netns).exists() {
            left.push(format!("netns {}", self.netns));
        }
        if Path::new("/sys/class/net").join(&self.veth).exists() {
            left.push(format!("veth {}", self.veth));
        }
        if let Ok(m) = sys::mounts_under(&self.run_dir)
            && !m.is_empty()
        {
            left.push(format!("mounts {m:?}"));
        }
        for d in &self.cgroup_dirs {
            if d.exists() {
                left.push(format!("cgroup {}", d.display()));
            }
        }
        if let Some(pid) = self.nspawn_pid
            && sys::process_alive(pid, self.nspawn_start_ticks)
        {
            left.push(format!("systemd-nspawn pid {pid}"));
        }
        let needle = format!("--machine={}", self.name);
        for pid in sys::pids_with_arg(&needle) {
            left.push(format!("process {pid} with {needle}"));
        }
        if self.run_dir.exists() {
            left.push(format!("directory {}", self.run_dir.display()));
        }
        left
    }
}

/// `cfvm-hN`: short enough for an interface name (15 bytes).
pub fn slot_name(n: u32) -> String {
    format!("cfvm-h{n}")
}

/// Host N = 169.254.77.(4N-2): a /30 per host, the runner's end at 4N-3.
pub fn host_address(n: u32) -> Ipv4Addr {
    Ipv4Addr::new(169, 254, 77, (4 * n - 2) as u8)
}

/// Runner side of host N's /30 = 169.254.77.(4N-3).
pub fn runner_address(n: u32) -> Ipv4Addr {
    Ipv4Addr::new(169, 254, 77, (4 * n - 3) as u8)
}

/// A slot held by this process; dropping it releases the lock.
#[derive(Debug)]
pub(crate) struct Slot {
    pub n: u32,
    pub record_path: PathBuf,
    _lock: File,
}

fn lock_path(config: &HarnessConfig, n: u32) -> PathBuf {
    config.slots_dir().join(format!("{n}.lock"))
}

fn record_path(config: &HarnessConfig, n: u32) -> PathBuf {
    config.slots_dir().join(format!("{n}.json"))
}

/// Non-blocking flock; `None` when another open file (any process, or another thread here)
/// holds it.
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

pub(crate) fn read_record(path: &Path) -> Result<Option<SlotRecord>> {
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

pub(crate) fn write_record(path: &Path, rec: &SlotRecord) -> Result<()> {
    let json = serde_json::to_vec_pretty(rec).map_err(|e| Error::BadRecord {
        path: path.to_path_buf(),
        reason: e.to_string(),
    })?;
    sys::write_atomic(path, &json, 0o644)
}

/// Leftovers with no record (or another tool's) that would collide with slot `n`.
fn blocked_by(n: u32, addresses: &str) -> Option<String> {
    let name = slot_name(n);
    if Path::new("/run/netns").join(&name).exists() {
        return Some(format!("netns {name} exists"));
    }
    if Path::new("/sys/class/net").join(&name).exists() {
        return Some(format!("interface {name} exists"));
    }
    for a in [runner_address(n), host_address(n)] {
        let needle = format!(" {a}/");
        if addresses.contains(&needle) {
            return Some(format!("address {a} is already in use on the runner"));
        }
    }
    None
}

/// Claims the lowest free slot: reclaims it first if a dead run left a record, skips it if
/// something unrecorded occupies its names or addresses.
pub(crate) fn acquire(config: &HarnessConfig) -> Result<Slot> {
    sys::create_dir_all(&config.slots_dir())?;
    let runner_addresses = || {
        sys::output(Command::new("ip").args(["-o", "-4", "addr", "show"]))
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default()
    };
    let mut addresses = runner_addresses();
    for n in 1..=config.max_slots {
        let Some(lock) = try_lock(&lock_path(config, n))? else {
            continue;
        };
        let rp = record_path(config, n);
        match read_record(&rp) {
            Ok(Some(stale)) => {
                eprintln!(
                    "clawfleet-vm-tests: reclaiming {} left by dead pid {}",
                    stale.name, stale.owner_pid
                );
                if let Err(e) = teardown(&stale, None, config.shutdown_timeout) {
                    eprintln!("clawfleet-vm-tests: skipping slot {n}: {e}");
                    continue;
                }
                let _ = fs::remove_file(&rp);
                addresses = runner_addresses();
            }
            Ok(None) => {}
            Err(e) => {
                eprintln!("clawfleet-vm-tests: skipping slot {n}: {e}");
                continue;
            }
        }
        if let Some(why) = blocked_by(n, &addresses) {
            eprintln!("clawfleet-vm-tests: skipping slot {n}: {why} (not recorded by us)");
            continue;
        }
        return Ok(Slot {
            n,
            record_path: rp,
            _lock: lock,
        });
    }
    Err(Error::NoFreeSlot {
        max: config.max_slots,
    })
}

/// What `list` reports about one slot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SlotState {
    /// Held by a live process.
    InUse,
    /// Lock free but a record remains: a dead run's leftovers, reclaimable.
    Stale,
    /// Lock free, nothing recorded.
    Free,
}

/// One line of `list`.
#[derive(Debug, Clone)]
pub struct SlotStatus {
    pub slot: u32,
    pub state: SlotState,
    pub record: Option<SlotRecord>,
}

fn known_slots(config: &HarnessConfig) -> Vec<u32> {
    let mut slots: Vec<u32> = fs::read_dir(config.slots_dir())
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .filter_map(|e| {
                    let name = e.file_name().to_string_lossy().into_owned();
                    name.strip_suffix(".lock")?.parse().ok()
                })
                .collect()
        })
        .unwrap_or_default();
    slots.sort_unstable();
    slots
}

/// State of every slot that has ever been used on this machine.
pub fn list_slots(config: &HarnessConfig) -> Result<Vec<SlotStatus>> {
    let mut out = Vec::new();
    for n in known_slots(config) {
        let lock = try_lock(&lock_path(config, n))?;
        let record = read_record(&record_path(config, n)).unwrap_or(None);
        let state = match (&lock, &record) {
            (None, _) => SlotState::InUse,
            (Some(_), Some(_)) => SlotState::Stale,
            (Some(_), None) => SlotState::Free,
        };
        out.push(SlotStatus {
            slot: n,
            state,
            record,
        });
    }
    Ok(out)
}

/// Tears down every slot whose owner is dead (lock free, record present), from its record.
/// Slots of live processes, including this one, are left alone. Returns the reclaimed records.
pub fn reclaim_stale(config: &HarnessConfig) -> Result<Vec<SlotRecord>> {
    let mut reclaimed = Vec::new();
    let mut errors = Vec::new();
    for n in known_slots(config) {
        let Some(_lock) = try_lock(&lock_path(config, n))? else {
            continue;
        };
        let rp = record_path(config, n);
        let rec = match read_record(&rp) {
            Ok(Some(r)) => r,
            Ok(None) => continue,
            Err(e) => {
                errors.push(e.to_string());
                continue;
            }
        };
        match teardown(&rec, None, config.shutdown_timeout) {
            Ok(()) => {
                let _ = fs::remove_file(&rp);
                reclaimed.push(rec);
            }
            Err(e) => errors.push(e.to_string()),
        }
    }
    if errors.is_empty() {
        Ok(reclaimed)
    } else {
        Err(Error::Teardown {
            name: "stale slots".into(),
            detail: errors.join("; "),
        })
    }
}

/// Removes everything a record names, in an order that never deletes through a mount:
/// nspawn (graceful, then SIGKILL) → cgroup.kill → unmount → netns/veth → dirs. Safe to repeat,
/// and safe when only part of the record was ever created. `child` is given when this process
/// spawned nspawn, so it is waited for (reaped) rather than polled.
pub(crate) fn teardown(
    rec: &SlotRecord,
    mut child: Option<&mut Child>,
    shutdown_timeout: Duration,
) -> Result<()> {
    let mut problems = Vec::new();
    let step = Duration::from_millis(50);
    if let Some(pid) = rec.nspawn_pid {
        let gone = |child: &mut Option<&mut Child>| match child {
            Some(c) => !matches!(c.try_wait(), Ok(None)),
            None => !sys::process_alive(pid, rec.nspawn_start_ticks),
        };
        if !gone(&mut child) {
            // nspawn turns SIGTERM into SIGRTMIN+3 for the container's systemd: a clean poweroff.
            sys::signal(pid, Signal::SIGTERM);
            if !sys::wait_until(shutdown_timeout, step, || gone(&mut child)) {
                sys::signal(pid, Signal::SIGKILL);
                if !sys::wait_until(Duration::from_secs(5), step, || gone(&mut child)) {
                    problems.push(format!("systemd-nspawn pid {pid} survived SIGKILL"));
                }
            }
        }
    }
    // A SIGKILLed nspawn leaves the container running: kill whatever is left in its cgroups.
    for dir in &rec.cgroup_dirs {
        if !sys::kill_cgroup(dir, Duration::from_secs(10)) {
            problems.push(format!("processes remain in {}", dir.display()));
        }
    }
    for dir in &rec.cgroup_dirs {
        if let Err(e) = sys::remove_cgroup_tree(dir, true) {
            problems.push(e.to_string());
        }
    }
    if let Err(e) = sys::unmount_all_under(&rec.run_dir) {
        problems.push(e.to_string());
    }
    if Path::new("/run/netns").join(&rec.netns).exists() {
        // Deleting the netns destroys host0 and with it the veth pair.
        if let Err(e) = sys::run(Command::new("ip").args(["netns", "del", &rec.netns])) {
            problems.push(e.to_string());
        }
    }
    // The kernel removes the runner side of the pair asynchronously after the netns goes.
    let veth = Path::new("/sys/class/net").join(&rec.veth);
    if !sys::wait_until(Duration::from_secs(2), step, || !veth.exists())
        && let Err(e) = sys::run(Command::new("ip").args(["link", "del", &rec.veth]))
        && veth.exists()
    {
        problems.push(e.to_string());
    }
    let propagate = Path::new("/run/systemd/nspawn/propagate").join(&rec.name);
    if propagate.exists() && sys::mounts_under(&propagate).is_ok_and(|m| m.is_empty()) {
        let _ = fs::remove_dir_all(&propagate);
    }
    if let Err(e) = sys::remove_tree(&rec.run_dir) {
        problems.push(e.to_string());
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(Error::Teardown {
            name: rec.name.clone(),
            detail: problems.join("; "),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_follow_the_note() {
        assert_eq!(host_address(1), Ipv4Addr::new(169, 254, 77, 2));
        assert_eq!(runner_address(1), Ipv4Addr::new(169, 254, 77, 1));
        assert_eq!(host_address(2), Ipv4Addr::new(169, 254, 77, 6));
        assert_eq!(host_address(3), Ipv4Addr::new(169, 254, 77, 10));
        assert_eq!(host_address(63), Ipv4Addr::new(169, 254, 77, 250));
        assert_eq!(runner_address(63), Ipv4Addr::new(169, 254, 77, 249));
        assert!(slot_name(63).len() <= 15);
    }

    #[test]
    fn record_round_trips_and_rejects_unknown_fields() {
        let cfg = HarnessConfig {
            state_dir: "/var/lib/x".into(),
            ..HarnessConfig::default()
        };
        let rec = SlotRecord::plan(&cfg, 5);
        assert_eq!(rec.run_dir, PathBuf::from("/var/lib/x/hosts/h5"));
        let json = serde_json::to_string(&rec).unwrap();
        assert_eq!(serde_json::from_str::<SlotRecord>(&json).unwrap(), rec);
        let extra = json.replacen('{', "{\"surprise\":1,", 1);
        assert!(serde_json::from_str::<SlotRecord>(&extra).is_err());
    }

    #[test]
    fn locks_exclude_within_one_process() {
        let dir = std::env::temp_dir().join(format!("cfvm-lock-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let p = dir.join("1.lock");
        let first = try_lock(&p).unwrap();
        assert!(first.is_some());
        assert!(try_lock(&p).unwrap().is_none());
        drop(first);
        assert!(try_lock(&p).unwrap().is_some());
        fs::remove_dir_all(&dir).unwrap();
    }
}
