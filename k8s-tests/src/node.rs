//! A real node for a control plane: containerd (Debian's 1.6), runc, the bridge and host-local
//! CNI plugins, and a kubelet built from the same wrapper module as the control plane, all on
//! this machine, with their own directories, sockets, ports, cgroup subtree, bridge and subnet.
//!
//! Everything the node starts is found again by its id, never by name: the kubelet and
//! containerd by pid and start time, the shims and every container by the cgroup subtree
//! `clawfleet-node-<id>` (containerd's `ShimCgroup` and the kubelet's `cgroupRoot`), mounts by
//! their path under the node's directory, the bridge by its name `cfk<hex>`, CNI cache entries
//! by the network name `clawfleet-node-<id>`. [`Node::shutdown`] (or Drop) tears everything down
//! and then runs [`leftovers`], which a test asserts is empty. The sysctls the kubelet changes
//! are recorded before the first node starts and restored when the last one stops.

use std::fs;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node as KubeNode, PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::Api;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use nix::sys::signal::Signal;
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::config::HarnessConfig;
use crate::control_plane::ControlPlane;
use crate::error::{Error, Result};
use crate::image::BuiltImage;
use crate::run::ProcessRecord;
use crate::sys;

/// The name of the real Node (one per control plane; its kubelet's identity is
/// `system:node:clawfleet-node`, so the apiserver's Node authorizer applies).
pub const REAL_NODE_NAME: &str = "clawfleet-node";
/// The label the real Node carries; a Pod that must run for real selects it.
pub const REAL_NODE_LABEL: (&str, &str) = ("clawfleet.dev/real-node", "true");
/// The StorageClass whose claims the harness provisions as `local` volumes on the real node
/// (a directory under the node's run directory; `fsGroup` applies to them).
pub const NODE_STORAGE_CLASS: &str = "clawfleet-node-local";
const PROVISIONER: &str = "clawfleet.dev/node-local";
/// The sandbox image, imported at start (built from go/pause).
pub const PAUSE_IMAGE: &str = "clawfleet.test/pause:node";
/// Where Debian's packages put the node's runtime parts.
pub const CONTAINERD: &str = "/usr/bin/containerd";
pub const CTR: &str = "/usr/bin/ctr";
pub const RUNC: &str = "/usr/sbin/runc";
pub const CNI_BIN_DIR: &str = "/usr/lib/cni";
const SHIM: &str = "/usr/bin/containerd-shim-runc-v2";
/// The node's binaries in the keyed directory (build-node.sh).
pub const NODE_BINARIES: &[&str] = &["kubelet", "pause"];

/// The sysctls the kubelet sets at start (`setupKernelTunables`) and the bridge plugin may set
/// (`ip_forward`): recorded before the first node, restored after the last.
pub const SYSCTLS: &[&str] = &[
    "vm/overcommit_memory",
    "vm/panic_on_oom",
    "kernel/panic",
    "kernel/panic_on_oops",
    "kernel/keys/root_maxkeys",
    "kernel/keys/root_maxbytes",
    "net/ipv4/ip_forward",
];

/// Subnets are `10.213.<n>.0/24`, one per live node; the bridge holds `.1`, the node's IP.
const SUBNET_PREFIX: [u8; 2] = [10, 213];

/// Version of the node record format.
const NODE_RECORD_SCHEMA: u32 = 1;

/// What one node created, as written to `<state>/nodes/<id>.json` before it is created.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct NodeRecord {
    pub schema: u32,
    pub id: String,
    pub owner_pid: u32,
    pub run_dir: PathBuf,
    pub logs_dir: PathBuf,
    /// The cgroup subtree's name under every hierarchy's root.
    pub cgroup: String,
    pub bridge: String,
    /// The CNI network name (CNI cache entries start with it).
    pub network: String,
    pub subnet: u8,
    pub processes: Vec<ProcessRecord>,
}

impl NodeRecord {
    fn node_ip(&self) -> Ipv4Addr {
        Ipv4Addr::new(SUBNET_PREFIX[0], SUBNET_PREFIX[1], self.subnet, 1)
    }
    fn socket(&self) -> PathBuf {
        self.run_dir.join("containerd.sock")
    }
}

fn nodes_dir(config: &HarnessConfig) -> PathBuf {
    config.state_dir.join("nodes")
}

/// Why the real node cannot run here (beyond the control plane's own prerequisites), or None.
pub fn node_missing_prerequisite(config: &HarnessConfig) -> Option<String> {
    for b in NODE_BINARIES {
        let p = config.node_dir.join(b);
        if !p.is_file() {
            return Some(format!(
                "{} is missing; build it with k8s-tests/build-node.sh or set CLAWFLEET_K8S_NODE_DIR",
                p.display()
            ));
        }
    }
    for p in [CONTAINERD, CTR, RUNC, SHIM] {
        if !Path::new(p).is_file() {
            return Some(format!(
                "{p} is missing; install Debian's packages: apt-get install containerd runc containernetworking-plugins"
            ));
        }
    }
    for p in ["bridge", "host-local", "loopback"] {
        if !Path::new(CNI_BIN_DIR).join(p).is_file() {
            return Some(format!(
                "{CNI_BIN_DIR}/{p} is missing; apt-get install containernetworking-plugins"
            ));
        }
    }
    if !Path::new(crate::gateway_image::BUSYBOX).is_file() {
        return Some(format!(
            "{} is missing (the images' /bin/sh); apt-get install busybox-static",
            crate::gateway_image::BUSYBOX
        ));
    }
    for p in ["tar", "ip"] {
        if which(p).is_none() {
            return Some(format!(
                "`{p}` is not on PATH (the node needs tar and iproute2)"
            ));
        }
    }
    match cgroup_mounts() {
        Ok(m) if m.iter().any(|(_, v2)| !v2) => None,
        Ok(_) => Some(
            "this machine has no cgroup v1 hierarchies: the real node is only done for cgroup v1 \
             hosts (the kubelet here runs with failCgroupV1: false)"
                .into(),
        ),
        Err(e) => Some(e.to_string()),
    }
}

fn which(bin: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join(bin))
            .find(|p| p.is_file())
    })
}

/// Every cgroup hierarchy mounted here: (mount point, is cgroup2).
fn cgroup_mounts() -> Result<Vec<(PathBuf, bool)>> {
    let path = Path::new("/proc/self/mountinfo");
    let text = fs::read_to_string(path).map_err(|e| Error::io("read", path, e))?;
    Ok(text
        .lines()
        .filter_map(|l| {
            let (left, right) = l.split_once(" - ")?;
            let mount_point = left.split(' ').nth(4)?;
            let fstype = right.split(' ').next()?;
            match fstype {
                "cgroup" => Some((PathBuf::from(unescape(mount_point)), false)),
                "cgroup2" => Some((PathBuf::from(unescape(mount_point)), true)),
                _ => None,
            }
        })
        .collect())
}

/// mountinfo escapes space, tab, newline and backslash as octal.
fn unescape(s: &str) -> String {
    s.replace("\\040", " ")
        .replace("\\011", "\t")
        .replace("\\012", "\n")
        .replace("\\134", "\\")
}

/// Mount points at or under `dir`, deepest first.
fn mounts_under(dir: &Path) -> Vec<PathBuf> {
    let Ok(text) = fs::read_to_string("/proc/self/mountinfo") else {
        return Vec::new();
    };
    let mut found: Vec<PathBuf> = text
        .lines()
        .filter_map(|l| l.split(' ').nth(4).map(|m| PathBuf::from(unescape(m))))
        .filter(|m| m.starts_with(dir))
        .collect();
    found.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    found.dedup();
    found
}

/// Directories of the subtree, deepest first, in every hierarchy.
fn cgroup_dirs(cgroup: &str) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for (mount, _) in cgroup_mounts().unwrap_or_default() {
        let top = mount.join(cgroup);
        if top.is_dir() {
            collect_dirs(&top, &mut out);
        }
    }
    out.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    out
}

fn collect_dirs(dir: &Path, out: &mut Vec<PathBuf>) {
    out.push(dir.to_path_buf());
    if let Ok(rd) = fs::read_dir(dir) {
        for e in rd.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                collect_dirs(&e.path(), out);
            }
        }
    }
}

/// Every pid in the subtree, in any hierarchy.
fn cgroup_pids(cgroup: &str) -> Vec<u32> {
    let mut pids: Vec<u32> = cgroup_dirs(cgroup)
        .iter()
        .filter_map(|d| fs::read_to_string(d.join("cgroup.procs")).ok())
        .flat_map(|t| {
            t.lines()
                .filter_map(|l| l.trim().parse().ok())
                .collect::<Vec<u32>>()
        })
        .collect();
    pids.sort_unstable();
    pids.dedup();
    pids
}

/// Creates `<hierarchy>/<path>` everywhere (cpuset: with its parent's cpus and mems).
fn make_cgroup(path: &str) -> Result<()> {
    for (mount, _) in cgroup_mounts()? {
        let mut dir = mount.clone();
        for part in path.split('/') {
            dir = dir.join(part);
            if !dir.is_dir() {
                fs::create_dir(&dir).map_err(|e| Error::io("create cgroup", &dir, e))?;
            }
            for knob in ["cpuset.cpus", "cpuset.mems"] {
                let mine = dir.join(knob);
                let cur = fs::read_to_string(&mine).unwrap_or_default();
                if mine.exists() && cur.trim().is_empty() {
                    let parent = dir.parent().map(|p| p.join(knob)).unwrap_or_default();
                    let value =
                        fs::read_to_string(&parent).map_err(|e| Error::io("read", &parent, e))?;
                    fs::write(&mine, value.trim()).map_err(|e| Error::io("write", &mine, e))?;
                }
            }
        }
    }
    Ok(())
}

/// Moves `pid` into `<hierarchy>/<path>` in every hierarchy.
fn enter_cgroup(path: &str, pid: u32) -> Result<()> {
    for (mount, _) in cgroup_mounts()? {
        let procs = mount.join(path).join("cgroup.procs");
        fs::write(&procs, pid.to_string()).map_err(|e| Error::io("write", &procs, e))?;
    }
    Ok(())
}

fn read_sysctl(name: &str) -> Result<String> {
    let p = Path::new("/proc/sys").join(name);
    fs::read_to_string(&p)
        .map(|s| s.trim().to_owned())
        .map_err(|e| Error::io("read", &p, e))
}

/// Directories outside the node's own that containerd 1.6 and libcni create at fixed paths
/// (the shims' sockets, runc's default root, the CNI result cache), children first: those that
/// did not exist before the first node are removed (when empty) after the last one.
pub const MACHINE_DIRS: &[&str] = &[
    "/var/lib/cni/results",
    "/var/lib/cni",
    "/run/containerd/s",
    "/run/containerd/runc",
    "/run/containerd",
];

/// The machine's sysctl values (and which [`MACHINE_DIRS`] existed) before the first live node.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
struct SysctlLedger {
    values: Vec<(String, String)>,
    #[serde(default)]
    dirs_before: Vec<(String, bool)>,
}

fn ledger_path(config: &HarnessConfig) -> PathBuf {
    nodes_dir(config).join("sysctls.json")
}

fn with_nodes_lock<T>(config: &HarnessConfig, f: impl FnOnce() -> Result<T>) -> Result<T> {
    let path = nodes_dir(config).join(".machine.lock");
    let file = fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|e| Error::io("open lock file", &path, e))?;
    file.lock().map_err(|e| Error::io("lock", &path, e))?;
    let out = f();
    drop(file);
    out
}

/// Ids of node records whose lock someone holds (live nodes), other than `except`.
fn live_nodes(config: &HarnessConfig, except: &str) -> Vec<String> {
    let mut live = Vec::new();
    let Ok(rd) = fs::read_dir(nodes_dir(config)) else {
        return live;
    };
    for e in rd.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(id) = name.strip_suffix(".lock") else {
            continue;
        };
        if id == except || id.starts_with('.') {
            continue;
        }
        if let Ok(f) = fs::OpenOptions::new().read(true).open(e.path())
            && f.try_lock().is_err()
        {
            live.push(id.to_owned());
        }
    }
    live
}

/// How many nodes of this machine are live now (their owners hold their locks). A test that
/// compares the machine's sysctls with its own reading needs to know it was the only one.
pub fn live_node_count(config: &HarnessConfig) -> usize {
    live_nodes(config, "").len()
}

/// Records the sysctls unless a live node already did (under the machine lock).
fn record_sysctls(config: &HarnessConfig) -> Result<()> {
    let path = ledger_path(config);
    if path.exists() {
        return Ok(());
    }
    let mut values = Vec::new();
    for s in SYSCTLS {
        values.push(((*s).to_owned(), read_sysctl(s)?));
    }
    let dirs_before = MACHINE_DIRS
        .iter()
        .map(|d| ((*d).to_owned(), Path::new(d).exists()))
        .collect();
    let ledger = SysctlLedger {
        values,
        dirs_before,
    };
    let json = serde_json::to_vec_pretty(&ledger).map_err(|e| Error::BadRecord {
        path: path.clone(),
        reason: e.to_string(),
    })?;
    sys::write_atomic(&path, &json, 0o644)
}

/// Restores the recorded sysctls when no other node is live; returns what it wrote.
fn restore_sysctls(config: &HarnessConfig, me: &str) -> Result<Vec<String>> {
    let path = ledger_path(config);
    if !live_nodes(config, me).is_empty() {
        return Ok(Vec::new());
    }
    let bytes = match fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(Error::io("read", &path, e)),
    };
    let ledger: SysctlLedger = serde_json::from_slice(&bytes).map_err(|e| Error::BadRecord {
        path: path.clone(),
        reason: e.to_string(),
    })?;
    let mut changed = Vec::new();
    for (name, value) in &ledger.values {
        let now = read_sysctl(name)?;
        if &now != value {
            let p = Path::new("/proc/sys").join(name);
            fs::write(&p, value).map_err(|e| Error::io("write", &p, e))?;
            changed.push(format!("{name}: {now} -> {value}"));
        }
    }
    for (dir, existed) in &ledger.dirs_before {
        // Only when empty: nothing of anyone else's is ever removed.
        if !existed && fs::remove_dir(dir).is_ok() {
            changed.push(format!("removed the empty {dir}"));
        }
    }
    fs::remove_file(&path).map_err(|e| Error::io("remove", &path, e))?;
    Ok(changed)
}

/// Sysctls that differ from the ledger while no node is live (a leftover).
fn sysctl_leftovers(config: &HarnessConfig, me: &str, before: &SysctlLedger) -> Vec<String> {
    if !live_nodes(config, me).is_empty() {
        return Vec::new();
    }
    let mut left: Vec<String> = before
        .values
        .iter()
        .filter_map(|(name, value)| {
            let now = read_sysctl(name).ok()?;
            (&now != value).then(|| format!("sysctl {name} is {now}, was {value}"))
        })
        .collect();
    for (dir, existed) in &before.dirs_before {
        if !existed && Path::new(dir).exists() {
            left.push(format!(
                "{dir} did not exist before the first node and is still there"
            ));
        }
    }
    left
}

fn ip(args: &[&str]) -> std::result::Result<String, String> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("cannot run ip: {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!(
            "ip {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

fn link_exists(name: &str) -> bool {
    Path::new("/sys/class/net").join(name).exists()
}

/// Interfaces enslaved to `bridge`.
fn bridge_ports(bridge: &str) -> Vec<String> {
    fs::read_dir(Path::new("/sys/class/net").join(bridge).join("brif"))
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// A subnet number no address on this machine and no live node record uses.
fn pick_subnet(config: &HarnessConfig) -> Result<u8> {
    let addrs = ip(&["-4", "-o", "addr", "show"]).map_err(|reason| Error::Node { reason })?;
    let mut taken: Vec<u8> = Vec::new();
    for r in list_node_records(config) {
        taken.push(r.subnet);
    }
    for n in 1..=254u8 {
        let net = format!(" {}.{}.{n}.", SUBNET_PREFIX[0], SUBNET_PREFIX[1]);
        if !taken.contains(&n) && !addrs.contains(&net) {
            return Ok(n);
        }
    }
    Err(Error::Node {
        reason: "no free 10.213.<n>.0/24 subnet is left".into(),
    })
}

fn list_node_records(config: &HarnessConfig) -> Vec<NodeRecord> {
    let Ok(rd) = fs::read_dir(nodes_dir(config)) else {
        return Vec::new();
    };
    rd.flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == "json"))
        .filter_map(|e| fs::read(e.path()).ok())
        .filter_map(|b| serde_json::from_slice::<NodeRecord>(&b).ok())
        .collect()
}

/// Tears down the nodes of dead test processes (records whose lock is free).
pub fn reclaim_stale_nodes(config: &HarnessConfig) -> Vec<String> {
    let mut report = Vec::new();
    for rec in list_node_records(config) {
        let lock = nodes_dir(config).join(format!("{}.lock", rec.id));
        let Ok(f) = fs::OpenOptions::new().read(true).write(true).open(&lock) else {
            continue;
        };
        if f.try_lock().is_err() {
            continue;
        }
        let problems = teardown_parts(config, &rec, Duration::from_secs(2));
        report.push(format!("reclaimed node {}: {problems:?}", rec.id));
        let _ = fs::remove_file(nodes_dir(config).join(format!("{}.json", rec.id)));
        let _ = fs::remove_file(&lock);
    }
    report
}

/// Everything of `rec` that still exists on the machine: processes, cgroups, mounts, the
/// bridge and its ports, the run directory, CNI cache entries, pod network namespaces.
pub fn leftovers(rec: &NodeRecord) -> Vec<String> {
    let mut left = Vec::new();
    for p in &rec.processes {
        if sys::process_alive(p.pid, p.start_ticks) {
            left.push(format!("{} pid {}", p.component, p.pid));
        }
    }
    for pid in cgroup_pids(&rec.cgroup) {
        left.push(format!("pid {pid} in cgroup {}", rec.cgroup));
    }
    for d in cgroup_dirs(&rec.cgroup) {
        left.push(format!("cgroup {}", d.display()));
    }
    for m in mounts_under(&rec.run_dir) {
        left.push(format!("mount {}", m.display()));
    }
    if link_exists(&rec.bridge) {
        left.push(format!("bridge {}", rec.bridge));
        for port in bridge_ports(&rec.bridge) {
            left.push(format!("veth {port} on {}", rec.bridge));
        }
    }
    if rec.run_dir.exists() {
        left.push(format!("directory {}", rec.run_dir.display()));
    }
    for e in cni_cache_entries(rec) {
        left.push(format!("CNI cache {}", e.display()));
    }
    // Processes anywhere that still name the node's directory (a shim outside the subtree).
    let needle = rec.run_dir.to_string_lossy().into_owned();
    if let Ok(rd) = fs::read_dir("/proc") {
        for e in rd.flatten() {
            let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
                continue;
            };
            if let Ok(cmd) = fs::read(e.path().join("cmdline"))
                && String::from_utf8_lossy(&cmd).contains(&needle)
                && sys::process_alive(pid, None)
            {
                left.push(format!("pid {pid} names {needle}"));
            }
        }
    }
    left
}

/// libcni's result cache (`/var/lib/cni/results/<network>-<container>-<ifname>`), which
/// containerd 1.6 cannot move: this node's entries, those of its bridge network by name and
/// those of containerd's own loopback network (`cni-loopback-<sandbox>-lo`, which a stopped
/// sandbox leaves behind) by the network namespace path under the node's directory that the
/// entry records.
fn cni_cache_entries(rec: &NodeRecord) -> Vec<PathBuf> {
    let prefix = format!("{}-", rec.network);
    let needle = rec.run_dir.to_string_lossy().into_owned();
    fs::read_dir("/var/lib/cni/results")
        .map(|rd| {
            rd.flatten()
                .filter(|e| {
                    e.file_name().to_string_lossy().starts_with(&prefix)
                        || fs::read_to_string(e.path()).is_ok_and(|c| c.contains(&needle))
                })
                .map(|e| e.path())
                .collect()
        })
        .unwrap_or_default()
}

/// The sockets containerd 1.6's shims of this node listen on: `/run/containerd/s/<hex>`, the
/// hex being sha256 of `<containerd address>/<namespace>/<task id>` (runtime/v2/shim's
/// `SocketAddress`), for the tasks in the node's state directory. A shim removes its socket
/// when it exits cleanly; one that was killed leaves it.
fn shim_sockets(rec: &NodeRecord) -> Vec<PathBuf> {
    use sha2::{Digest, Sha256};
    let tasks = rec
        .run_dir
        .join("containerd/state/io.containerd.runtime.v2.task/k8s.io");
    let Ok(rd) = fs::read_dir(&tasks) else {
        return Vec::new();
    };
    rd.flatten()
        .map(|e| {
            let key = rec
                .socket()
                .join("k8s.io")
                .join(e.file_name())
                .to_string_lossy()
                .into_owned();
            let hex: String = Sha256::digest(key.as_bytes())
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect();
            Path::new("/run/containerd/s").join(hex)
        })
        .collect()
}

/// Stops and removes everything of `rec` (without the API): the kubelet and containerd by
/// pid, everything in the cgroup subtree, mounts under the run directory, the cgroups, the
/// bridge, the CNI cache entries and the run directory. Returns what it could not do.
fn teardown_parts(config: &HarnessConfig, rec: &NodeRecord, stop_timeout: Duration) -> Vec<String> {
    let mut problems = Vec::new();
    // The kubelet first (it would restart containers), then containerd.
    for component in ["kubelet", "containerd"] {
        for p in rec.processes.iter().filter(|p| p.component == component) {
            sys::signal(p.pid, p.start_ticks, Signal::SIGTERM);
            if !sys::wait_until(stop_timeout, Duration::from_millis(50), || {
                !sys::process_alive(p.pid, p.start_ticks)
            }) {
                sys::signal(p.pid, p.start_ticks, Signal::SIGKILL);
                sys::wait_until(Duration::from_secs(5), Duration::from_millis(50), || {
                    !sys::process_alive(p.pid, p.start_ticks)
                });
            }
        }
    }
    let shim_sockets = shim_sockets(rec);
    // Shims and containers: everything in the subtree, by cgroup.
    let emptied = sys::wait_until(Duration::from_secs(10), Duration::from_millis(100), || {
        let pids = cgroup_pids(&rec.cgroup);
        for pid in &pids {
            sys::signal(*pid, None, Signal::SIGKILL);
        }
        pids.is_empty()
    });
    if !emptied {
        problems.push(format!("cgroup {} still has processes", rec.cgroup));
    }
    for m in mounts_under(&rec.run_dir) {
        if let Err(e) = nix::mount::umount2(&m, nix::mount::MntFlags::MNT_DETACH) {
            problems.push(format!("umount {}: {e}", m.display()));
        }
    }
    for d in cgroup_dirs(&rec.cgroup) {
        // A cgroup whose last task just died can be busy for a moment.
        let ok = sys::wait_until(Duration::from_secs(3), Duration::from_millis(50), || {
            fs::remove_dir(&d).is_ok() || !d.exists()
        });
        if !ok {
            problems.push(format!("rmdir {}", d.display()));
        }
    }
    if link_exists(&rec.bridge) {
        // Pod veths go with their network namespaces (unmounted above); the bridge is ours.
        if let Err(e) = ip(&["link", "del", &rec.bridge]) {
            problems.push(e);
        }
    }
    for e in cni_cache_entries(rec) {
        if let Err(err) = fs::remove_file(&e) {
            problems.push(format!("remove {}: {err}", e.display()));
        }
    }
    for s in &shim_sockets {
        if s.exists()
            && let Err(e) = fs::remove_file(s)
        {
            problems.push(format!("remove {}: {e}", s.display()));
        }
    }
    if rec.run_dir.exists()
        && let Err(e) = fs::remove_dir_all(&rec.run_dir)
    {
        problems.push(format!("remove {}: {e}", rec.run_dir.display()));
    }
    match with_nodes_lock(config, || restore_sysctls(config, &rec.id)) {
        Ok(changed) if !changed.is_empty() => {
            eprintln!(
                "clawfleet-k8s-tests: node {}: restored sysctls {changed:?}",
                rec.id
            )
        }
        Ok(_) => {}
        Err(e) => problems.push(e.to_string()),
    }
    problems
}

/// What a node's teardown found: the sysctls it restored and what was left behind after it.
#[derive(Debug, Clone, Default)]
pub struct TeardownReport {
    /// Problems while tearing down (each a sentence).
    pub problems: Vec<String>,
    /// [`leftovers`] after the teardown: empty when nothing was left.
    pub leftovers: Vec<String>,
    /// Sysctls that differ from before the first node, and [`MACHINE_DIRS`] that did not exist
    /// then and still do (only checked when no other node is live).
    pub sysctls: Vec<String>,
}

/// A running real node. Drop it before its [`ControlPlane`].
pub struct Node {
    config: HarnessConfig,
    record: NodeRecord,
    record_path: PathBuf,
    lock_path: PathBuf,
    _lock: fs::File,
    children: Vec<Child>,
    /// Set by [`Node::join`] (the control plane's admin client).
    client: Option<kube::Client>,
    provisioner: Option<tokio::task::JoinHandle<()>>,
    sysctls_before: SysctlLedger,
    started_in: Duration,
    timings: NodeTimings,
    keep_logs: bool,
    done: bool,
}

/// What a node's start took, by part.
#[derive(Debug, Clone, Copy, Default)]
pub struct NodeTimings {
    /// [`Node::prepare`]: the record, bridge, cgroups, containerd answering, pause imported
    /// (needs no control plane, so it can run while one starts).
    pub prepare: Duration,
    /// [`Node::join`]: the kubelet started until its Node is Ready, the StorageClass.
    pub join: Duration,
}

impl std::fmt::Display for NodeTimings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "containerd and pause {:.1} s, kubelet to Node Ready {:.1} s",
            self.prepare.as_secs_f64(),
            self.join.as_secs_f64()
        )
    }
}

fn write_node_record(path: &Path, rec: &NodeRecord) -> Result<()> {
    let json = serde_json::to_vec_pretty(rec).map_err(|e| Error::BadRecord {
        path: path.to_path_buf(),
        reason: e.to_string(),
    })?;
    sys::write_atomic(path, &json, 0o644)
}

impl Node {
    /// Starts a real node for `cp` and waits until its Node is Ready ([`Node::prepare`] then
    /// [`Node::join`]).
    pub async fn start(cp: &ControlPlane) -> Result<Node> {
        let mut node = Node::prepare(cp.harness_config()).await?;
        node.join(cp).await?;
        Ok(node)
    }

    /// The part of a start that needs no control plane, so it can run while one starts: the
    /// record, the bridge, the directories and cgroups, containerd up and the pause image
    /// imported (and whatever else [`Node::import_image`] adds before the join). `config` must
    /// be the one the control plane is started with. Dropping the result tears it down.
    pub async fn prepare(config: &HarnessConfig) -> Result<Node> {
        let config = config.clone();
        if let Some(reason) = node_missing_prerequisite(&config) {
            return Err(Error::Node { reason });
        }
        let dir = nodes_dir(&config);
        sys::create_dir_all(&dir)?;
        for line in reclaim_stale_nodes(&config) {
            eprintln!("clawfleet-k8s-tests: {line}");
        }
        let hex = sys::random_hex(3)?;
        let id = format!("{}-{hex}", std::process::id());
        let lock_path = dir.join(format!("{id}.lock"));
        let lock = fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(|e| Error::io("open lock file", &lock_path, e))?;
        lock.try_lock().map_err(|e| Error::Node {
            reason: format!("cannot lock {}: {e}", lock_path.display()),
        })?;
        let record_path = dir.join(format!("{id}.json"));
        let (record, sysctls_before) = with_nodes_lock(&config, || {
            let subnet = pick_subnet(&config)?;
            let record = NodeRecord {
                schema: NODE_RECORD_SCHEMA,
                id: id.clone(),
                owner_pid: std::process::id(),
                run_dir: dir.join(&id),
                logs_dir: config.logs_dir().join(format!("node-{id}")),
                cgroup: format!("clawfleet-node-{id}"),
                bridge: format!("cfk{hex}"),
                network: format!("clawfleet-node-{id}"),
                subnet,
                processes: Vec::new(),
            };
            // Recorded before anything exists, so a crash from here on is reclaimable.
            write_node_record(&record_path, &record)?;
            record_sysctls(&config)?;
            let ledger: SysctlLedger = fs::read(ledger_path(&config))
                .ok()
                .and_then(|b| serde_json::from_slice(&b).ok())
                .unwrap_or(SysctlLedger {
                    values: Vec::new(),
                    dirs_before: Vec::new(),
                });
            let gw = format!("{}/24", record.node_ip());
            ip(&["link", "add", &record.bridge, "type", "bridge"])
                .and_then(|_| ip(&["addr", "add", &gw, "dev", &record.bridge]))
                .and_then(|_| ip(&["link", "set", &record.bridge, "up"]))
                .map_err(|reason| Error::Node { reason })?;
            Ok((record, ledger))
        })?;
        let mut node = Node {
            keep_logs: config.keep_logs,
            config,
            record,
            record_path,
            lock_path,
            _lock: lock,
            children: Vec::new(),
            client: None,
            provisioner: None,
            sysctls_before,
            started_in: Duration::ZERO,
            timings: NodeTimings::default(),
            done: false,
        };
        let t0 = Instant::now();
        match node.boot_runtime().await {
            Ok(()) => {
                node.timings.prepare = t0.elapsed();
                Ok(node)
            }
            Err(e) => {
                node.keep_logs = true;
                Err(e)
            }
        }
    }

    /// Joins a prepared node to `cp` (the control plane of the same [`HarnessConfig`]): the
    /// kubelet starts with a serving certificate from the run's CA and the node's identity,
    /// and this waits until its Node is Ready; then the node's StorageClass and provisioner.
    pub async fn join(&mut self, cp: &ControlPlane) -> Result<()> {
        if self.client.is_some() {
            return Err(Error::Node {
                reason: format!("node {} has already joined a control plane", self.record.id),
            });
        }
        let theirs = cp.harness_config();
        if theirs.state_dir != self.config.state_dir || theirs.node_dir != self.config.node_dir {
            return Err(Error::Node {
                reason: format!(
                    "node {} was prepared with state dir {} and node dir {}, the control plane runs with {} and {}",
                    self.record.id,
                    self.config.state_dir.display(),
                    self.config.node_dir.display(),
                    theirs.state_dir.display(),
                    theirs.node_dir.display()
                ),
            });
        }
        let t0 = Instant::now();
        self.client = Some(cp.client().await?);
        match self.boot_kubelet(cp).await {
            Ok(()) => {
                self.timings.join = t0.elapsed();
                self.started_in = self.timings.prepare + self.timings.join;
                Ok(())
            }
            Err(e) => {
                self.keep_logs = true;
                Err(e)
            }
        }
    }

    fn client(&self) -> Result<kube::Client> {
        self.client.clone().ok_or_else(|| Error::Node {
            reason: format!("node {} has not joined a control plane", self.record.id),
        })
    }

    async fn boot_runtime(&mut self) -> Result<()> {
        let rec = self.record.clone();
        let r = &rec.run_dir;
        for d in [
            r.clone(),
            r.join("cni/net.d"),
            r.join("cni/ipam"),
            r.join("kubelet"),
            r.join("pod-logs"),
            r.join("volumes"),
            rec.logs_dir.clone(),
        ] {
            sys::create_dir_all(&d)?;
        }
        make_cgroup(&rec.cgroup)?;
        make_cgroup(&format!("{}/daemons", rec.cgroup))?;
        make_cgroup(&format!("{}/shims", rec.cgroup))?;
        sys::write_file(
            &r.join("containerd.toml"),
            self.containerd_toml().as_bytes(),
            0o644,
        )?;
        let conflist = json!({
            "cniVersion": "1.0.0",
            "name": rec.network,
            "plugins": [{
                "type": "bridge",
                "bridge": rec.bridge,
                "isGateway": true,
                "ipMasq": false,
                "hairpinMode": true,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{ "subnet": format!("{}.{}.{}.0/24", SUBNET_PREFIX[0], SUBNET_PREFIX[1], rec.subnet) }]],
                    "dataDir": r.join("cni/ipam"),
                },
            }],
        });
        sys::write_file(
            &r.join("cni/net.d/10-clawfleet.conflist"),
            conflist.to_string().as_bytes(),
            0o644,
        )?;
        let deadline = Instant::now() + self.config.start_timeout;

        let containerd_args: Vec<std::ffi::OsString> =
            vec!["--config".into(), r.join("containerd.toml").into()];
        self.spawn("containerd", Path::new(CONTAINERD), &containerd_args)?;
        let sock = rec.socket();
        self.wait("containerd's socket", deadline, || {
            std::os::unix::net::UnixStream::connect(&sock)
                .map(drop)
                .map_err(|e| e.to_string())
        })
        .await?;
        let pause = self.pause_image()?;
        self.import_image(&pause)?;
        Ok(())
    }

    async fn boot_kubelet(&mut self, cp: &ControlPlane) -> Result<()> {
        let rec = self.record.clone();
        let r = &rec.run_dir;
        let ip: std::net::IpAddr = rec.node_ip().into();
        let cert = cp.pki().serving_cert_with_ips(REAL_NODE_NAME, &[], &[ip])?;
        sys::write_file(&r.join("kubelet.crt"), cert.cert_pem.as_bytes(), 0o644)?;
        sys::write_file(&r.join("kubelet.key"), cert.key_pem.as_bytes(), 0o600)?;
        let [kubelet_port, healthz_port] = sys::free_ports::<2>()?;
        sys::write_file(
            &r.join("kubelet.yaml"),
            self.kubelet_yaml(kubelet_port, healthz_port).as_bytes(),
            0o644,
        )?;
        let deadline = Instant::now() + self.config.start_timeout;
        let client = self.client()?;

        let kubelet_args: Vec<std::ffi::OsString> = vec![
            "--config".into(),
            r.join("kubelet.yaml").into(),
            "--kubeconfig".into(),
            cp.node_kubeconfig_path().into(),
            "--root-dir".into(),
            r.join("kubelet").into(),
            "--cert-dir".into(),
            r.join("kubelet/pki").into(),
            "--hostname-override".into(),
            REAL_NODE_NAME.into(),
            "--node-ip".into(),
            rec.node_ip().to_string().into(),
            "--node-labels".into(),
            format!("{}={}", REAL_NODE_LABEL.0, REAL_NODE_LABEL.1).into(),
            // 3: the prober logs each successful probe ("Probe succeeded"), the evidence that
            // a readiness probe really reached the container.
            "--v".into(),
            "3".into(),
        ];
        self.spawn(
            "kubelet",
            &self.config.node_dir.join("kubelet"),
            &kubelet_args,
        )?;
        let nodes: Api<KubeNode> = Api::all(client.clone());
        loop {
            self.check_alive()?;
            let ready = nodes
                .get_opt(REAL_NODE_NAME)
                .await
                .ok()
                .flatten()
                .is_some_and(|n| {
                    n.status
                        .and_then(|s| s.conditions)
                        .unwrap_or_default()
                        .iter()
                        .any(|c| c.type_ == "Ready" && c.status == "True")
                });
            if ready {
                break;
            }
            if Instant::now() > deadline {
                return Err(Error::Node {
                    reason: format!(
                        "the Node {REAL_NODE_NAME} did not become Ready; kubelet log:\n{}",
                        sys::file_tail(&rec.logs_dir.join("kubelet.log"), 20)
                    ),
                });
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let classes: Api<StorageClass> = Api::all(client.clone());
        let class: StorageClass = serde_json::from_value(json!({
            "apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
            "metadata": { "name": NODE_STORAGE_CLASS },
            "provisioner": PROVISIONER,
            "reclaimPolicy": "Delete",
            "volumeBindingMode": "Immediate",
        }))
        .map_err(|e| Error::Node {
            reason: format!("the StorageClass: {e}"),
        })?;
        match classes.create(&PostParams::default(), &class).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 409 => {}
            Err(e) => {
                return Err(Error::Node {
                    reason: format!("creating the StorageClass {NODE_STORAGE_CLASS}: {e}"),
                });
            }
        }
        self.provisioner = Some(tokio::spawn(provision(client, r.join("volumes"))));
        Ok(())
    }

    fn containerd_toml(&self) -> String {
        let rec = &self.record;
        let r = rec.run_dir.display();
        format!(
            r#"version = 2
root = "{r}/containerd/root"
state = "{r}/containerd/state"
oom_score = 0
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]
[grpc]
  address = "{r}/containerd.sock"
[ttrpc]
  address = "{r}/containerd.sock.ttrpc"
[debug]
  address = ""
[metrics]
  address = ""
[plugins."io.containerd.internal.v1.opt"]
  path = "{r}/containerd/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{PAUSE_IMAGE}"
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  enable_selinux = false
  disable_apparmor = true
  # This machine's root lacks CAP_SYS_RESOURCE: runc may not lower oom_score_adj.
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        BinaryName = "{RUNC}"
        Root = "{r}/runc"
        ShimCgroup = "/{cg}/shims"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{CNI_BIN_DIR}"
    conf_dir = "{r}/cni/net.d"
"#,
            cg = rec.cgroup
        )
    }

    fn kubelet_yaml(&self, port: u16, healthz_port: u16) -> String {
        let rec = &self.record;
        let r = rec.run_dir.display();
        format!(
            r#"apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupRoot: /{cg}
containerRuntimeEndpoint: unix://{r}/containerd.sock
address: {ip}
port: {port}
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: {healthz_port}
tlsCertFile: {r}/kubelet.crt
tlsPrivateKeyFile: {r}/kubelet.key
authentication:
  anonymous: {{enabled: true}}
  webhook: {{enabled: false}}
authorization: {{mode: AlwaysAllow}}
podLogsDir: {r}/pod-logs
staticPodPath: ""
failSwapOn: false
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {{"memory.available": "1Mi", "nodefs.available": "1%", "imagefs.available": "1%", "nodefs.inodesFree": "1%"}}
serializeImagePulls: false
syncFrequency: 5s
nodeStatusUpdateFrequency: 5s
resolvConf: ""
localStorageCapacityIsolation: false
makeIPTablesUtilChains: false
"#,
            cg = rec.cgroup,
            ip = rec.node_ip(),
        )
    }

    fn spawn(
        &mut self,
        component: &'static str,
        bin: &Path,
        args: &[std::ffi::OsString],
    ) -> Result<()> {
        let log_path = self.record.logs_dir.join(format!("{component}.log"));
        let log = fs::File::create(&log_path).map_err(|e| Error::io("create", &log_path, e))?;
        let err = log
            .try_clone()
            .map_err(|e| Error::io("dup", &log_path, e))?;
        let child = Command::new(bin)
            .args(args)
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(err)
            .spawn()
            .map_err(|source| Error::Spawn {
                component: component.to_owned(),
                path: bin.to_path_buf(),
                source,
            })?;
        let pid = child.id();
        self.record.processes.push(ProcessRecord {
            component: component.to_owned(),
            pid,
            start_ticks: sys::proc_stat(pid).map(|(_, t)| t),
        });
        self.children.push(child);
        write_node_record(&self.record_path, &self.record)?;
        enter_cgroup(&format!("{}/daemons", self.record.cgroup), pid)?;
        Ok(())
    }

    fn check_alive(&mut self) -> Result<()> {
        for (i, child) in self.children.iter_mut().enumerate() {
            if let Ok(Some(status)) = child.try_wait() {
                let p = &self.record.processes[i];
                let log = self.record.logs_dir.join(format!("{}.log", p.component));
                return Err(Error::Exited {
                    component: p.component.clone(),
                    pid: p.pid,
                    status: status.to_string(),
                    tail: sys::file_tail(&log, 20),
                    log,
                });
            }
        }
        Ok(())
    }

    async fn wait(
        &mut self,
        what: &str,
        deadline: Instant,
        mut f: impl FnMut() -> std::result::Result<(), String>,
    ) -> Result<()> {
        loop {
            self.check_alive()?;
            let last = match f() {
                Ok(()) => return Ok(()),
                Err(e) => e,
            };
            if Instant::now() > deadline {
                return Err(Error::Node {
                    reason: format!("waiting for {what}: {last}"),
                });
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    fn pause_image(&self) -> Result<BuiltImage> {
        let work = self.record.run_dir.join("images/pause");
        let root = work.join("rootfs");
        crate::image::minimal_rootfs(
            &root,
            None,
            &[("/pause", &self.config.node_dir.join("pause"))],
        )?;
        let (repo, tag) = PAUSE_IMAGE
            .rsplit_once(':')
            .unwrap_or((PAUSE_IMAGE, "node"));
        crate::image::build_archive(
            &root,
            json!({ "Entrypoint": ["/pause"], "User": "65535:65535" }),
            repo,
            Some(tag),
            &work.join("out"),
        )
    }

    /// Imports an image archive into the node's containerd (namespace `k8s.io`, where the
    /// kubelet's images live). The image keeps the name its index gives it.
    pub fn import_image(&self, image: &BuiltImage) -> Result<()> {
        let sock = self.record.socket();
        let mut cmd = Command::new(CTR);
        cmd.arg("--address")
            .arg(&sock)
            .args(["-n", "k8s.io", "images", "import"]);
        let out = cmd.arg(&image.archive).output().map_err(|e| Error::Node {
            reason: format!("cannot run {CTR}: {e}"),
        })?;
        if !out.status.success() {
            return Err(Error::Node {
                reason: format!(
                    "ctr images import {} failed: {}{}",
                    image.archive.display(),
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                ),
            });
        }
        Ok(())
    }

    /// The node's IP (its bridge's address; the kubelet listens there).
    pub fn ip(&self) -> Ipv4Addr {
        self.record.node_ip()
    }

    /// The record of what this node created.
    pub fn record(&self) -> &NodeRecord {
        &self.record
    }

    /// `<state>/nodes/<id>.json`.
    pub fn record_path(&self) -> &Path {
        &self.record_path
    }

    /// From the first spawn to a Ready Node.
    pub fn started_in(&self) -> Duration {
        self.started_in
    }

    /// What the start took, by part.
    pub fn timings(&self) -> NodeTimings {
        self.timings
    }

    /// The kubelet's and containerd's logs.
    pub fn logs_dir(&self) -> &Path {
        &self.record.logs_dir
    }

    /// The kubelet's log (removed with the logs at a clean teardown: read it before).
    pub fn kubelet_log(&self) -> PathBuf {
        self.record.logs_dir.join("kubelet.log")
    }

    /// Keep the logs after a clean teardown too.
    pub fn keep_logs(&mut self) {
        self.keep_logs = true;
    }

    /// A work directory under the node's run directory (removed at teardown).
    pub fn work_dir(&self, name: &str) -> Result<PathBuf> {
        let d = self.record.run_dir.join("work").join(name);
        sys::create_dir_all(&d)?;
        Ok(d)
    }

    /// Cordons the node (so a controller's replacement Pods stay Pending instead of starting
    /// here again), deletes the Pods bound to it and waits (up to `limit`) for the kubelet to
    /// stop them, so their sandboxes go through CNI DEL rather than a kill.
    pub async fn drain(&self, limit: Duration) {
        let Some(client) = self.client.clone() else {
            return;
        };
        let nodes: Api<KubeNode> = Api::all(client.clone());
        let cordon = json!({ "spec": { "unschedulable": true } });
        if let Err(e) = nodes
            .patch(
                REAL_NODE_NAME,
                &PatchParams::default(),
                &Patch::Merge(&cordon),
            )
            .await
        {
            eprintln!(
                "clawfleet-k8s-tests: node {}: cannot cordon {REAL_NODE_NAME} before the drain: {e}",
                self.record.id
            );
        }
        let pods: Api<Pod> = Api::all(client.clone());
        let lp = ListParams::default().fields(&format!("spec.nodeName={REAL_NODE_NAME}"));
        if let Ok(list) = pods.list(&lp).await {
            for p in list.items {
                let (Some(ns), Some(name)) = (p.metadata.namespace, p.metadata.name) else {
                    continue;
                };
                let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
                let _ = api
                    .delete(&name, &DeleteParams::default().grace_period(1))
                    .await;
            }
        }
        let deadline = Instant::now() + limit;
        loop {
            let containers = cgroup_pids(&format!("{}/kubepods", self.record.cgroup));
            if containers.is_empty() {
                break;
            }
            if Instant::now() >= deadline {
                eprintln!(
                    "clawfleet-k8s-tests: node {}: the drain's {} s passed with pids {containers:?} still in its Pods' cgroups; the teardown kills them",
                    self.record.id,
                    limit.as_secs()
                );
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Drains the node, tears it down and reports what it restored and what was left.
    pub async fn shutdown(mut self) -> TeardownReport {
        self.drain(Duration::from_secs(20)).await;
        self.teardown()
    }

    fn teardown(&mut self) -> TeardownReport {
        if self.done {
            return TeardownReport::default();
        }
        self.done = true;
        if let Some(p) = self.provisioner.take() {
            p.abort();
        }
        let problems = teardown_parts(&self.config, &self.record, self.config.stop_timeout);
        for c in &mut self.children {
            let _ = c.try_wait();
        }
        let leftovers = leftovers(&self.record);
        let sysctls = sysctl_leftovers(&self.config, &self.record.id, &self.sysctls_before);
        if problems.is_empty() && leftovers.is_empty() {
            let _ = fs::remove_file(&self.record_path);
            let _ = fs::remove_file(&self.lock_path);
            if !self.keep_logs && !std::thread::panicking() {
                let _ = fs::remove_dir_all(&self.record.logs_dir);
            }
        } else {
            eprintln!(
                "clawfleet-k8s-tests: node {} teardown: problems {problems:?}, leftovers {leftovers:?}; logs in {}",
                self.record.id,
                self.record.logs_dir.display()
            );
        }
        TeardownReport {
            problems,
            leftovers,
            sysctls,
        }
    }
}

impl std::fmt::Debug for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Node")
            .field("record", &self.record)
            .finish_non_exhaustive()
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.teardown();
    }
}

/// The harness's provisioner for [`NODE_STORAGE_CLASS`]: each unbound claim gets a directory
/// and a `local` PersistentVolume on the real node, bound to it by `claimRef`; a released
/// volume is deleted with its directory.
async fn provision(client: kube::Client, dir: PathBuf) {
    let claims: Api<PersistentVolumeClaim> = Api::all(client.clone());
    let volumes: Api<PersistentVolume> = Api::all(client.clone());
    loop {
        if let Ok(list) = claims.list(&ListParams::default()).await {
            for c in list.items {
                let spec = c.spec.clone().unwrap_or_default();
                if spec.storage_class_name.as_deref() != Some(NODE_STORAGE_CLASS)
                    || spec.volume_name.is_some()
                    || c.metadata.deletion_timestamp.is_some()
                {
                    continue;
                }
                let (Some(uid), Some(ns), Some(name)) = (
                    c.metadata.uid.clone(),
                    c.metadata.namespace.clone(),
                    c.metadata.name.clone(),
                ) else {
                    continue;
                };
                let path = dir.join(format!("pvc-{uid}"));
                if fs::create_dir_all(&path).is_err() {
                    continue;
                }
                let size = spec
                    .resources
                    .and_then(|r| r.requests)
                    .and_then(|r| r.get("storage").cloned())
                    .map(|q| q.0)
                    .unwrap_or_else(|| "1Gi".into());
                let pv = serde_json::from_value::<PersistentVolume>(json!({
                    "apiVersion": "v1", "kind": "PersistentVolume",
                    "metadata": {
                        "name": format!("pvc-{uid}"),
                        "annotations": { "pv.kubernetes.io/provisioned-by": PROVISIONER },
                    },
                    "spec": {
                        "capacity": { "storage": size },
                        "accessModes": spec.access_modes.unwrap_or_else(|| vec!["ReadWriteOnce".into()]),
                        "persistentVolumeReclaimPolicy": "Delete",
                        "storageClassName": NODE_STORAGE_CLASS,
                        "volumeMode": "Filesystem",
                        "claimRef": {
                            "apiVersion": "v1", "kind": "PersistentVolumeClaim",
                            "namespace": ns, "name": name, "uid": uid,
                        },
                        "local": { "path": path },
                        "nodeAffinity": { "required": { "nodeSelectorTerms": [{
                            "matchExpressions": [{
                                "key": "kubernetes.io/hostname", "operator": "In",
                                "values": [REAL_NODE_NAME],
                            }],
                        }] } },
                    },
                }));
                if let Ok(pv) = pv {
                    let _ = volumes.create(&PostParams::default(), &pv).await;
                }
            }
        }
        if let Ok(list) = volumes.list(&ListParams::default()).await {
            for v in list.items {
                let ours = v
                    .metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get("pv.kubernetes.io/provisioned-by"))
                    .is_some_and(|p| p == PROVISIONER);
                let released = v
                    .status
                    .as_ref()
                    .and_then(|s| s.phase.as_deref())
                    .is_some_and(|p| p == "Released" || p == "Failed");
                if ours
                    && released
                    && let Some(name) = v.metadata.name.clone()
                {
                    let _ = fs::remove_dir_all(dir.join(&name));
                    let _ = volumes.delete(&name, &DeleteParams::default()).await;
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}
