//! One booted test host ([`TestHost`]) and a group started in parallel ([`TestHosts`]).

use std::ffi::OsString;
use std::fs;
use std::io::Write;
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::ops::Deref;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::base::{self, BaseRootfs};
use crate::config::HarnessConfig;
use crate::error::{Error, Result};
use crate::signals;
use crate::slot::{self, Slot, SlotRecord};
use crate::sys::{self, shell_quote};

/// Exit status of systemd-nspawn when the guest asked for a reboot.
const NSPAWN_REBOOT_STATUS: i32 = 133;

/// Moves the launching shell into the host's own cgroups, then becomes systemd-nspawn (same pid).
/// Without this, nspawn `--keep-unit` on a machine without systemd puts every container at
/// `/payload` of the runner's cgroup and the second container breaks.
const LAUNCH_SCRIPT: &str = r#"for f in $CFVM_CGROUP_PROCS; do echo $$ > "$f"; done; exec "$@""#;

/// Per-host choices made at boot (they need nspawn arguments).
#[derive(Debug, Clone, Default)]
pub struct HostOptions {
    /// Bind the cached OpenClaw bundle read-only at `/opt/clawfleet-openclaw` (no copy; fetched
    /// once with npm). Without it, [`TestHost::install_openclaw`] copies the ~850 MB bundle.
    pub openclaw: bool,
    /// Let the host's systemd enforce `MemoryMax=` and `TasksMax=` on a runner whose memory
    /// and pids controllers are bound to cgroup v1 (where a pure-v2 container has none): the
    /// container boots with the hybrid layout (`SYSTEMD_NSPAWN_UNIFIED_HIERARCHY=0`) and, once
    /// up, its v1 `memory` and `pids` mounts (its own cgroups, below the runner's) are made
    /// writable and systemd re-executed, so units get cgroups with their limits there. No
    /// effect on a pure-v2 runner.
    pub cgroup_limits: bool,
    /// Read-write binds (runner path, absolute host path), e.g. a loop-mounted file system
    /// of the test's own as the host's `/var/lib/clawfleet`. The runner path must exist and
    /// stays the test's to create and remove.
    pub binds: Vec<(PathBuf, String)>,
    /// Boot the host as a kernel without Landlock would run it (Debian 12's 6.1, RHEL 9's
    /// 5.14): nspawn's own seccomp allowlist, which predates Landlock, stays in force for its
    /// three syscalls, so they fail with EPERM inside the host and hostd's launcher finds no
    /// Landlock to confine binds with.
    pub no_landlock: bool,
    /// Boot the host without `CAP_NET_ADMIN` (nspawn's default for a container that is not
    /// given a private network of its own making): hostd can make a network namespace there
    /// but not configure one, as on a host that refuses it namespaces. Every other host gets
    /// the capability, as hostd has it on a real host (the container has its own network
    /// namespace, so it reaches nothing of the runner's).
    pub no_net_admin: bool,
    /// Give the host a state root (`/var/lib/clawfleet`) on a btrfs image of this many bytes,
    /// loop-mounted on the runner with quotas enabled ([`crate::BtrfsImage`]), made before
    /// boot and torn down after the host is down: unmounted, loop device detached, image
    /// deleted, each checked. [`TestHost::state_fs`] is where it is mounted on the runner.
    pub btrfs_state_root: Option<u64>,
}

#[derive(Debug)]
struct State {
    record: SlotRecord,
    child: Option<Child>,
    down: bool,
    boot_time: Duration,
    /// The btrfs state root of [`HostOptions::btrfs_state_root`].
    state_fs: Option<crate::BtrfsImage>,
}

/// A booted Debian host (systemd PID 1, system D-Bus, sshd) in its own netns, reachable as
/// `root@address()` with [`ssh_key_path`](TestHost::ssh_key_path). Torn down on drop.
#[derive(Debug)]
pub struct TestHost {
    config: HarnessConfig,
    name: String,
    slot_n: u32,
    address: Ipv4Addr,
    runner_address: Ipv4Addr,
    run_dir: PathBuf,
    root: PathBuf,
    lower: PathBuf,
    known_hosts: PathBuf,
    client_key: PathBuf,
    host_public_key: String,
    fingerprint: String,
    machine_id: String,
    /// `--bind-ro=` mounts given to nspawn (runner path, host path).
    binds: Vec<(PathBuf, String)>,
    /// `--bind=` (read-write) mounts given to nspawn (runner path, host path).
    rw_binds: Vec<(PathBuf, String)>,
    /// Where the btrfs state root of [`HostOptions::btrfs_state_root`] is mounted.
    state_fs_mount: Option<PathBuf>,
    cgroup_limits: bool,
    no_landlock: bool,
    no_net_admin: bool,
    state: Mutex<State>,
    // Dropped last: the slot stays ours until teardown has finished.
    slot: Slot,
}

impl TestHost {
    /// Starts one host with settings from the environment.
    pub fn start() -> Result<TestHost> {
        let config = HarnessConfig::from_env()?;
        let base = preflight(&config)?;
        TestHost::start_on(&config, &base, &HostOptions::default())
    }

    /// Starts one host with the given settings.
    pub fn start_with(config: &HarnessConfig) -> Result<TestHost> {
        let base = preflight(config)?;
        TestHost::start_on(config, &base, &HostOptions::default())
    }

    /// Starts one host with boot-time options.
    pub fn start_with_options(config: &HarnessConfig, options: &HostOptions) -> Result<TestHost> {
        let base = preflight(config)?;
        TestHost::start_on(config, &base, options)
    }

    /// Starts one host on an already built base rootfs (what [`TestHosts`] calls per host).
    pub fn start_on(
        config: &HarnessConfig,
        base: &BaseRootfs,
        options: &HostOptions,
    ) -> Result<TestHost> {
        let mut binds = Vec::new();
        if options.openclaw {
            let bundle = crate::openclaw::ensure_cached(config)?;
            binds.push((bundle.dir, crate::openclaw::HOST_PREFIX.to_owned()));
        }
        for (from, to) in &options.binds {
            if from.to_string_lossy().contains([',', ':', '\n'])
                || !to.starts_with('/')
                || to.contains([',', ':', '\n'])
            {
                return Err(Error::InvalidSetting {
                    name: "HostOptions::binds",
                    value: format!("{}:{to}", from.display()),
                    reason: "bind paths must be absolute and must not contain ',' or ':'",
                });
            }
        }
        let mut rw_binds = options.binds.clone();
        let state_fs = match options.btrfs_state_root {
            Some(size) => {
                let fs = crate::BtrfsImage::create(size)?;
                rw_binds.push((fs.mount().to_path_buf(), "/var/lib/clawfleet".to_owned()));
                Some(fs)
            }
            None => None,
        };
        let state_fs_mount = state_fs.as_ref().map(|fs| fs.mount().to_path_buf());
        let slot = slot::acquire(config)?;
        let record = SlotRecord::plan(config, slot.n);
        for p in [&record.run_dir, &base.rootfs] {
            if p.to_string_lossy().contains([',', ':', '\n']) {
                return Err(Error::InvalidSetting {
                    name: "CLAWFLEET_VM_STATE_DIR",
                    value: p.display().to_string(),
                    reason: "overlay paths must not contain ',' or ':'",
                });
            }
        }
        // Write the intent before creating anything, so a crash at any point is reclaimable.
        slot::write_record(&slot.record_path, &record)?;
        signals::register(slot.n, slot.record_path.clone(), config.shutdown_timeout);
        let identity = match Identity::create(&record) {
            Ok(i) => i,
            Err(e) => {
                if slot::teardown(&record, None, config.shutdown_timeout).is_ok() {
                    let _ = fs::remove_file(&slot.record_path);
                }
                signals::unregister(slot.n);
                return Err(e);
            }
        };
        let host = TestHost {
            config: config.clone(),
            name: record.name.clone(),
            slot_n: slot.n,
            address: record.address,
            runner_address: record.runner_address,
            run_dir: record.run_dir.clone(),
            root: record.root_mount.clone(),
            lower: base.rootfs.clone(),
            known_hosts: identity.known_hosts,
            client_key: base.client_key.clone(),
            host_public_key: identity.public_key,
            fingerprint: identity.fingerprint,
            machine_id: identity.machine_id,
            binds,
            rw_binds,
            state_fs_mount,
            cgroup_limits: options.cgroup_limits,
            no_landlock: options.no_landlock,
            no_net_admin: options.no_net_admin,
            state: Mutex::new(State {
                record,
                child: None,
                down: false,
                boot_time: Duration::ZERO,
                state_fs,
            }),
            slot,
        };
        // From here on, dropping `host` on error tears everything down.
        host.prepare(&base.client_key.with_extension("pub"))?;
        let mut st = host.lock();
        host.launch(&mut st)?;
        st.boot_time = host.wait_ready(&mut st)?;
        drop(st);
        host.enable_cgroup_limits()?;
        Ok(host)
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Overlay, identity files, netns + veth, cgroups.
    fn prepare(&self, client_pub: &Path) -> Result<()> {
        let rec = self.lock().record.clone();
        for d in ["upper", "work", "root"] {
            sys::create_dir_all(&self.run_dir.join(d))?;
        }
        let data = format!(
            "lowerdir={},upperdir={},workdir={}",
            self.lower.display(),
            self.run_dir.join("upper").display(),
            self.run_dir.join("work").display()
        );
        nix::mount::mount(
            Some(self.name.as_str()),
            &self.root,
            Some("overlay"),
            nix::mount::MsFlags::empty(),
            Some(data.as_str()),
        )
        .map_err(|e| Error::io("mount overlay on", &self.root, e.into()))?;
        let r = &self.root;
        sys::write_file(
            &r.join("etc/machine-id"),
            format!("{}\n", self.machine_id).as_bytes(),
            0o444,
        )?;
        sys::write_file(
            &r.join("etc/hostname"),
            format!("{}\n", self.name).as_bytes(),
            0o644,
        )?;
        let keys = self.run_dir.join("hostkey");
        let private = fs::read(keys.join("ssh_host_ed25519_key"))
            .map_err(|e| Error::io("read", keys.join("ssh_host_ed25519_key"), e))?;
        sys::write_file(&r.join("etc/ssh/ssh_host_ed25519_key"), &private, 0o600)?;
        sys::write_file(
            &r.join("etc/ssh/ssh_host_ed25519_key.pub"),
            format!("{}\n", self.host_public_key).as_bytes(),
            0o644,
        )?;
        let client = fs::read(client_pub).map_err(|e| Error::io("read", client_pub, e))?;
        sys::write_file(&r.join(base::HARNESS_AUTHORIZED_KEYS), &client, 0o600)?;

        let ip = |args: &[&str]| sys::run(Command::new("ip").args(args)).map(|_| ());
        let runner_cidr = format!("{}/30", rec.runner_address);
        let host_cidr = format!("{}/30", rec.address);
        ip(&["netns", "add", &rec.netns])?;
        ip(&[
            "link", "add", &rec.veth, "type", "veth", "peer", "name", "host0", "netns", &rec.netns,
        ])?;
        ip(&["addr", "add", &runner_cidr, "dev", &rec.veth])?;
        ip(&["link", "set", &rec.veth, "up"])?;
        ip(&["-n", &rec.netns, "link", "set", "lo", "up"])?;
        ip(&["-n", &rec.netns, "addr", "add", &host_cidr, "dev", "host0"])?;
        ip(&["-n", &rec.netns, "link", "set", "host0", "up"])?;
        for d in &rec.cgroup_dirs {
            sys::create_dir_all(d)?;
        }
        Ok(())
    }

    /// For [`HostOptions::cgroup_limits`]: makes the container's v1 `memory` and `pids`
    /// mounts (nspawn mounts them read-only) writable inside its mount namespace, then
    /// re-executes its systemd so that units started from now on get cgroups there.
    fn enable_cgroup_limits(&self) -> Result<()> {
        if !self.cgroup_limits {
            return Ok(());
        }
        let controllers: Vec<&str> = sys::V1_LIMIT_CONTROLLERS
            .iter()
            .copied()
            .filter(|c| {
                self.lock()
                    .record
                    .cgroup_dirs
                    .iter()
                    .any(|d| d.starts_with(Path::new("/sys/fs/cgroup").join(c)))
            })
            .collect();
        if controllers.is_empty() {
            return Ok(());
        }
        let init = self.container_init_pid().ok_or_else(|| Error::Remote {
            name: self.name.clone(),
            command: "find the container's init".into(),
            status: "no child of systemd-nspawn".into(),
            stderr: String::new(),
        })?;
        for c in &controllers {
            sys::run(Command::new("nsenter").args([
                "-t",
                &init.to_string(),
                "-m",
                "--",
                "mount",
                "-o",
                "remount,bind,rw",
                &format!("/sys/fs/cgroup/{c}"),
            ]))?;
        }
        self.run_ok("systemctl daemon-reexec").map(|_| ())
    }

    /// The pid (on the runner) of the container's init: systemd-nspawn's child.
    fn container_init_pid(&self) -> Option<u32> {
        let nspawn = self.lock().record.nspawn_pid?;
        let children = fs::read_dir(format!("/proc/{nspawn}/task")).ok()?;
        children
            .filter_map(|t| t.ok())
            .filter_map(|t| fs::read_to_string(t.path().join("children")).ok())
            .flat_map(|s| {
                s.split_whitespace()
                    .filter_map(|p| p.parse::<u32>().ok())
                    .collect::<Vec<_>>()
            })
            .next()
    }

    /// Starts systemd-nspawn for this host and records its pid.
    fn launch(&self, st: &mut State) -> Result<()> {
        for d in &st.record.cgroup_dirs {
            // Sub-cgroups of a previous boot (supervisor/payload/...) would confuse nspawn.
            sys::remove_cgroup_tree(d, false)?;
        }
        let console_path = self.console_log();
        let console = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&console_path)
            .map_err(|e| Error::io("open", &console_path, e))?;
        let console2 = console
            .try_clone()
            .map_err(|e| Error::io("reopen", &console_path, e))?;
        let procs: Vec<String> = st
            .record
            .cgroup_dirs
            .iter()
            .map(|d| d.join("cgroup.procs").display().to_string())
            .collect();
        if !self.no_net_admin {
            // nspawn mounts the container's /proc/sys read-only: forwarding in the host's
            // own network namespace (hostd's Agent egress, issue 28) is turned on from here,
            // as an operator's sysctl.d would on a real host.
            let mut fwd = Command::new("ip");
            fwd.args([
                "netns",
                "exec",
                &st.record.netns,
                "sysctl",
                "-qw",
                "net.ipv4.ip_forward=1",
            ]);
            let out = fwd.output().map_err(|source| Error::Spawn {
                command: sys::describe(&fwd),
                source,
            })?;
            if !out.status.success() {
                return Err(Error::Spawn {
                    command: sys::describe(&fwd),
                    source: std::io::Error::other(
                        String::from_utf8_lossy(&out.stderr).into_owned(),
                    ),
                });
            }
        }
        let mut cmd = Command::new("sh");
        cmd.arg("-c")
            .arg(LAUNCH_SCRIPT)
            .arg("sh")
            .arg("systemd-nspawn")
            .arg("--boot")
            .arg("--register=no")
            .arg("--keep-unit")
            .arg(format!("--directory={}", self.root.display()))
            .arg(format!("--machine={}", self.name))
            .arg(format!(
                "--network-namespace-path=/run/netns/{}",
                st.record.netns
            ))
            .arg("--console=read-only")
            .arg("--link-journal=no")
            .arg("--resolv-conf=off")
            .arg("--timezone=off")
            // nspawn 252's seccomp allowlist predates Landlock and answers EPERM; a host on
            // bare metal has no such filter. hostd confines each gateway's binds with Landlock.
            // Likewise quotactl_fd (Linux 5.14), with which hostd reads and sets project quotas.
            .arg(if self.no_landlock {
                // Denied outright (EPERM), whatever this nspawn's own allowlist holds.
                "--system-call-filter=~landlock_create_ruleset landlock_add_rule landlock_restrict_self"
            } else {
                "--system-call-filter=landlock_create_ruleset landlock_add_rule landlock_restrict_self"
            })
            .arg("--system-call-filter=quotactl quotactl_fd")
            // hostd configures each Agent's network namespace (issue 28).
            .args((!self.no_net_admin).then_some("--capability=CAP_NET_ADMIN"))
            .args(
                self.binds
                    .iter()
                    .map(|(from, to)| format!("--bind-ro={}:{to}", from.display())),
            )
            .args(
                self.rw_binds
                    .iter()
                    .map(|(from, to)| format!("--bind={}:{to}", from.display())),
            )
            .env("CFVM_CGROUP_PROCS", procs.join(" "))
            .env(
                "SYSTEMD_NSPAWN_UNIFIED_HIERARCHY",
                if self.config.unified_cgroup && !self.cgroup_limits {
                    "1"
                } else {
                    "0"
                },
            )
            // Own process group: a terminal's Ctrl-C reaches the test process (which tears
            // down in order), not nspawn directly.
            .process_group(0)
            .stdin(Stdio::null())
            .stdout(Stdio::from(console))
            .stderr(Stdio::from(console2));
        let child = cmd.spawn().map_err(|source| Error::Spawn {
            command: sys::describe(&cmd),
            source,
        })?;
        let pid = child.id();
        st.record.nspawn_pid = Some(pid);
        st.record.nspawn_start_ticks = sys::proc_stat(pid).map(|(_, t)| t);
        st.child = Some(child);
        slot::write_record(&self.slot.record_path, &st.record)
    }

    fn console_tail(&self) -> String {
        sys::file_tail(&self.console_log(), 25)
    }

    /// Waits for sshd to accept the harness key and for systemd to finish booting.
    fn wait_ready(&self, st: &mut State) -> Result<Duration> {
        let t0 = Instant::now();
        let limit = self.config.boot_timeout;
        let step = self.config.poll_interval;
        let sock = SocketAddr::from((self.address, 22));
        let mut stage = "waiting for sshd to listen";
        let mut ssh_ok = false;
        loop {
            if let Some(child) = st.child.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                return Err(Error::NspawnExited {
                    name: self.name.clone(),
                    status: status.to_string(),
                    console: self.console_tail(),
                });
            }
            if TcpStream::connect_timeout(&sock, Duration::from_millis(500)).is_ok() {
                stage = "waiting for sshd to accept the harness key";
                if self.run("true").is_ok_and(|o| o.status.success()) {
                    ssh_ok = true;
                    break;
                }
            }
            if t0.elapsed() >= limit {
                break;
            }
            std::thread::sleep(step);
        }
        if !ssh_ok {
            return Err(Error::BootTimeout {
                name: self.name.clone(),
                timeout: limit,
                stage: stage.into(),
                console: self.console_tail(),
            });
        }
        let left = limit.saturating_sub(t0.elapsed()).as_secs().max(1);
        let out = self.run(&format!(
            "timeout {left} systemctl is-system-running --wait"
        ))?;
        let state = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        match state.as_str() {
            "running" => Ok(t0.elapsed()),
            "degraded" => {
                let failed = self
                    .run("systemctl --failed --no-legend --plain")
                    .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
                    .unwrap_or_default();
                eprintln!(
                    "clawfleet-vm-tests: {} booted degraded; failed units:\n{failed}",
                    self.name
                );
                Ok(t0.elapsed())
            }
            "starting" | "initializing" | "" => Err(Error::BootTimeout {
                name: self.name.clone(),
                timeout: limit,
                stage: format!("systemd still {state:?}"),
                console: self.console_tail(),
            }),
            _ => Err(Error::BootState {
                name: self.name.clone(),
                state,
            }),
        }
    }

    /// Host name, `cfvm-hN` (also the machine name and the netns name).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Host number N (1..=63), unique on the machine while this host lives.
    pub fn slot(&self) -> u32 {
        self.slot_n
    }

    /// The host's address, 169.254.77.(4N-2); sshd listens on port 22.
    pub fn address(&self) -> Ipv4Addr {
        self.address
    }

    /// The runner's address on the host's link, 169.254.77.(4N-3): the only address the host
    /// can reach (useful for a test server the host should talk to).
    pub fn runner_address(&self) -> Ipv4Addr {
        self.runner_address
    }

    /// SHA256 fingerprint of the host's own ed25519 host key (`SHA256:...`), for pinning.
    pub fn host_key_fingerprint(&self) -> &str {
        &self.fingerprint
    }

    /// The host key as an OpenSSH public key line (`ssh-ed25519 AAAA... root@cfvm-hN`).
    pub fn host_public_key(&self) -> &str {
        &self.host_public_key
    }

    /// Private key authorised for root (in `/etc/ssh/clawfleet-vm-tests/authorized_keys`, so
    /// tests may rewrite `/root/.ssh/authorized_keys` freely).
    pub fn ssh_key_path(&self) -> &Path {
        &self.client_key
    }

    /// known_hosts file pinning this host's key under its address.
    pub fn known_hosts_path(&self) -> &Path {
        &self.known_hosts
    }

    /// The host's `/etc/machine-id` (kept across reboots).
    pub fn machine_id(&self) -> &str {
        &self.machine_id
    }

    /// The host's root file system as seen from the runner (the overlay's merged dir).
    pub fn root_dir(&self) -> &Path {
        &self.root
    }

    /// The container console (boot messages), for diagnosing a failed test.
    pub fn console_log(&self) -> PathBuf {
        self.run_dir.join("console.log")
    }

    /// Time from starting nspawn to sshd + finished boot, for the latest boot.
    pub fn boot_duration(&self) -> Duration {
        self.lock().boot_time
    }

    /// The ids recorded for this host's slot.
    pub fn record(&self) -> SlotRecord {
        self.lock().record.clone()
    }

    /// ssh options (without destination) that pin this host's key and use the harness key:
    /// for `scp`, `rsync -e` or a test's own `ssh` invocation.
    pub fn ssh_options(&self) -> Vec<OsString> {
        let mut v: Vec<OsString> = vec!["-F".into(), "/dev/null".into(), "-i".into()];
        v.push(self.client_key.clone().into());
        for o in [
            "BatchMode=yes".to_owned(),
            "IdentitiesOnly=yes".to_owned(),
            "StrictHostKeyChecking=yes".to_owned(),
            format!("UserKnownHostsFile={}", self.known_hosts.display()),
            "GlobalKnownHostsFile=/dev/null".to_owned(),
            "UpdateHostKeys=no".to_owned(),
            "LogLevel=ERROR".to_owned(),
            format!(
                "ConnectTimeout={}",
                self.config.ssh_connect_timeout.as_secs().max(1)
            ),
            "ServerAliveInterval=5".to_owned(),
            "ServerAliveCountMax=6".to_owned(),
        ] {
            v.push("-o".into());
            v.push(o.into());
        }
        v
    }

    /// `ssh <options> root@<address>`; append the remote command and run it.
    pub fn ssh_command(&self) -> Command {
        let mut c = Command::new("ssh");
        c.args(self.ssh_options())
            .arg(format!("root@{}", self.address));
        c
    }

    /// Runs a shell command as root over real ssh; any exit status is returned as is (ssh's 255
    /// means the connection failed).
    pub fn run(&self, command: &str) -> Result<Output> {
        sys::output(self.ssh_command().arg(command))
    }

    /// Like [`run`](TestHost::run), but a non-zero exit is an error; returns stdout.
    pub fn run_ok(&self, command: &str) -> Result<String> {
        let out = self.run(command)?;
        self.check(command, out)
    }

    fn check(&self, command: &str, out: Output) -> Result<String> {
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(Error::Remote {
                name: self.name.clone(),
                command: command.to_owned(),
                status: out.status.to_string(),
                stderr: sys::tail(&String::from_utf8_lossy(&out.stderr), 20),
            })
        }
    }

    /// Runs a command with `input` on its stdin; a non-zero exit is an error; returns stdout.
    pub fn run_with_input(&self, command: &str, input: &[u8]) -> Result<String> {
        let mut cmd = self.ssh_command();
        cmd.arg(command)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().map_err(|source| Error::Spawn {
            command: sys::describe(&cmd),
            source,
        })?;
        let out = std::thread::scope(|s| {
            if let Some(mut stdin) = child.stdin.take() {
                s.spawn(move || {
                    let _ = stdin.write_all(input);
                });
            }
            child.wait_with_output()
        })
        .map_err(|source| Error::Spawn {
            command: sys::describe(&cmd),
            source,
        })?;
        self.check(command, out)
    }

    /// Writes `contents` to `remote_path` on the host over ssh (parent directories created,
    /// atomic rename, given mode, owned by root).
    pub fn write_file(&self, remote_path: &str, contents: &[u8], mode: u32) -> Result<()> {
        let q = shell_quote(remote_path);
        let tmp = shell_quote(&format!("{remote_path}.cfvm-tmp"));
        let script = format!(
            "set -e; mkdir -p -- \"$(dirname -- {q})\"; cat > {tmp}; chmod {mode:o} {tmp}; mv -f -- {tmp} {q}"
        );
        self.run_with_input(&script, contents).map(|_| ())
    }

    /// Copies a local file to `remote_path` on the host over ssh with the given mode.
    pub fn install_file(&self, local: &Path, remote_path: &str, mode: u32) -> Result<()> {
        let meta = fs::metadata(local).map_err(|e| Error::io("read", local, e))?;
        if !meta.is_file() {
            return Err(Error::BadLocalFile {
                path: local.to_path_buf(),
                reason: "not a regular file".into(),
            });
        }
        let bytes = fs::read(local).map_err(|e| Error::io("read", local, e))?;
        self.write_file(remote_path, &bytes, mode)
    }

    /// Configures sshd as hardened sites do (a STIG's `AllowTcpForwarding no`, and every
    /// other forwarding off: `DisableForwarding yes`), reloads it, and checks that the
    /// running configuration says so. What the coordinator needs of a host must then work
    /// without any forwarding (its gateway relay is a command of hostd's, not a forward).
    pub fn forbid_forwarding(&self) -> Result<()> {
        let conf = "/etc/ssh/sshd_config.d/10-clawfleet-vm-tests-no-forwarding.conf";
        self.write_file(
            conf,
            b"# written by clawfleet-vm-tests: forwarding off, as hardened sites set it\n\
              AllowTcpForwarding no\nAllowStreamLocalForwarding no\nDisableForwarding yes\n\
              PermitTunnel no\nX11Forwarding no\nAllowAgentForwarding no\n",
            0o644,
        )?;
        let effective = self.run_ok("sshd -t && systemctl reload ssh && sshd -T")?;
        let off = effective
            .lines()
            .any(|l| l.trim() == "allowtcpforwarding no")
            && effective
                .lines()
                .any(|l| l.trim() == "disableforwarding yes");
        if off {
            Ok(())
        } else {
            Err(Error::Remote {
                name: self.name.clone(),
                command: "sshd -T".to_owned(),
                status: "forwarding still on".to_owned(),
                stderr: sys::tail(&effective, 20),
            })
        }
    }

    /// Installs a hostd build as `/usr/sbin/hostd` (the .deb once packaging exists).
    pub fn install_hostd(&self, binary: &Path) -> Result<()> {
        self.install_file(binary, "/usr/sbin/hostd", 0o755)
    }

    /// Installs a .deb (e.g. the clawfleet-hostd package) with `dpkg -i`; its dependencies
    /// must already be in the base rootfs, since hosts have no network.
    pub fn install_deb(&self, deb: &Path) -> Result<()> {
        let remote = "/var/tmp/clawfleet-vm-tests-install.deb";
        self.install_file(deb, remote, 0o644)?;
        self.run_ok(&format!(
            "DEBIAN_FRONTEND=noninteractive dpkg -i {remote} && rm -f {remote}"
        ))
        .map(|_| ())
    }

    /// Installs the workspace's test gateway (built on demand, see
    /// [`test_gateway_binary`](crate::test_gateway_binary)); returns its path on the host.
    pub fn install_test_gateway(&self) -> Result<String> {
        let local = crate::gateway::test_gateway_binary()?;
        let remote = crate::gateway::TEST_GATEWAY_REMOTE_PATH;
        self.install_file(&local, remote, 0o755)?;
        Ok(remote.to_owned())
    }

    /// Installs the real OpenClaw gateway (Node 24 + openclaw, fetched once into the cache)
    /// under `/opt/clawfleet-openclaw` in this host; returns the paths for `ExecStart=`.
    pub fn install_openclaw(&self) -> Result<crate::openclaw::OpenClawPaths> {
        if self.lock().down {
            return Err(Error::ShutDown {
                name: self.name.clone(),
            });
        }
        if self
            .binds
            .iter()
            .any(|(_, to)| to == crate::openclaw::HOST_PREFIX)
        {
            return Ok(crate::openclaw::host_paths());
        }
        let bundle = crate::openclaw::ensure_cached(&self.config)?;
        crate::openclaw::install_into(&bundle, &self.root)
    }

    /// Reboots the guest (`systemctl reboot`): nspawn exits 133, the harness boots it again on
    /// the same overlay and waits until sshd and systemd are back. Returns the new boot time.
    pub fn reboot(&self) -> Result<Duration> {
        let mut st = self.lock();
        if st.down {
            return Err(Error::ShutDown {
                name: self.name.clone(),
            });
        }
        // The connection may be cut by the reboot; success is judged by nspawn's exit status.
        let _ = self.run("systemctl --no-block reboot");
        let limit = self.config.shutdown_timeout + self.config.boot_timeout;
        let mut status = None;
        let exited = sys::wait_until(limit, self.config.poll_interval, || {
            match st.child.as_mut().map(|c| c.try_wait()) {
                Some(Ok(Some(s))) => {
                    status = Some(s);
                    true
                }
                Some(Ok(None)) => false,
                _ => true,
            }
        });
        let code = status.and_then(|s| s.code());
        if !exited || code != Some(NSPAWN_REBOOT_STATUS) {
            return Err(Error::Reboot {
                name: self.name.clone(),
                detail: match status {
                    Some(s) => format!("exited with {s} instead of 133"),
                    None => format!("did not exit within {limit:?}"),
                },
            });
        }
        st.child = None;
        self.launch(&mut st)?;
        st.boot_time = self.wait_ready(&mut st)?;
        drop(st);
        self.enable_cgroup_limits()?;
        Ok(self.boot_duration())
    }

    /// Powers the host off and removes everything it used (same as dropping it, but returns
    /// the error). Resources that could not be removed stay recorded for `vmhosts clean`.
    pub fn shutdown(self) -> Result<()> {
        self.teardown()
    }

    fn teardown(&self) -> Result<()> {
        let mut st = self.lock();
        if st.down {
            return Ok(());
        }
        st.down = true;
        let rec = st.record.clone();
        let result = slot::teardown(&rec, st.child.as_mut(), self.config.shutdown_timeout);
        if result.is_ok() {
            let _ = fs::remove_file(&self.slot.record_path);
        }
        signals::unregister(self.slot_n);
        // The state root's file system, once nothing of the host uses it.
        let fs_result = match st.state_fs.as_mut() {
            Some(state_fs) if result.is_ok() => state_fs.teardown(),
            _ => Ok(()),
        };
        result.and(fs_result)
    }

    /// Where the btrfs state root of [`HostOptions::btrfs_state_root`] is mounted on the
    /// runner.
    pub fn state_fs(&self) -> Option<&Path> {
        self.state_fs_mount.as_deref()
    }

    /// Tears the host down now (what drop does), reporting what failed: a test that made
    /// resources through [`HostOptions`] asserts their removal with it.
    pub fn shut_down(&self) -> Result<()> {
        self.teardown()
    }
}

impl Drop for TestHost {
    fn drop(&mut self) {
        if let Err(e) = self.teardown() {
            eprintln!("clawfleet-vm-tests: {e} (run `vmhosts clean`)");
        }
    }
}

/// Per-host identity made on the runner before boot: ssh host key, machine-id, known_hosts.
struct Identity {
    public_key: String,
    fingerprint: String,
    machine_id: String,
    known_hosts: PathBuf,
}

impl Identity {
    fn create(rec: &SlotRecord) -> Result<Identity> {
        let keys = rec.run_dir.join("hostkey");
        if rec.run_dir.exists() {
            sys::unmount_all_under(&rec.run_dir)?;
            sys::remove_tree(&rec.run_dir)?;
        }
        sys::create_dir_all(&keys)?;
        let key = keys.join("ssh_host_ed25519_key");
        let comment = format!("root@{}", rec.name);
        sys::run(
            Command::new("ssh-keygen")
                .args(["-q", "-t", "ed25519", "-N", "", "-C", &comment, "-f"])
                .arg(&key),
        )?;
        let pub_path = key.with_extension("pub");
        let public_key = fs::read_to_string(&pub_path)
            .map_err(|e| Error::io("read", &pub_path, e))?
            .trim()
            .to_owned();
        let out = sys::run(Command::new("ssh-keygen").arg("-lf").arg(&pub_path))?;
        let listing = String::from_utf8_lossy(&out.stdout).into_owned();
        let fingerprint = listing
            .split_whitespace()
            .find(|w| w.starts_with("SHA256:"))
            .map(str::to_owned)
            .ok_or_else(|| Error::CommandFailed {
                command: format!("ssh-keygen -lf {}", pub_path.display()),
                status: "unexpected output".into(),
                stderr: listing.clone(),
            })?;
        let known_hosts = rec.run_dir.join("known_hosts");
        let key_fields: Vec<&str> = public_key.split_whitespace().take(2).collect();
        sys::write_file(
            &known_hosts,
            format!("{} {}\n", rec.address, key_fields.join(" ")).as_bytes(),
            0o644,
        )?;
        Ok(Identity {
            public_key,
            fingerprint,
            machine_id: sys::random_hex(16)?,
            known_hosts,
        })
    }
}

/// Reclaims dead runs' leftovers and makes sure the base rootfs exists.
pub fn preflight(config: &HarnessConfig) -> Result<BaseRootfs> {
    match slot::reclaim_stale(config) {
        Ok(reclaimed) => {
            for r in reclaimed {
                eprintln!(
                    "clawfleet-vm-tests: reclaimed {} left by dead pid {}",
                    r.name, r.owner_pid
                );
            }
        }
        Err(e) => eprintln!("clawfleet-vm-tests: {e}"),
    }
    base::ensure_base_rootfs(config)
}

/// Several hosts started in parallel; dereferences to `[TestHost]`. Torn down (in parallel) on
/// drop.
#[derive(Debug)]
pub struct TestHosts {
    hosts: Vec<TestHost>,
    started_in: Duration,
}

impl TestHosts {
    /// No hosts at all (for a harness that needs none this time, such as a cluster-only
    /// coordinator run); needs no root and builds no rootfs.
    pub fn none() -> TestHosts {
        TestHosts {
            hosts: Vec::new(),
            started_in: Duration::ZERO,
        }
    }

    /// Starts `n` hosts in parallel with settings from the environment.
    pub fn start(n: usize) -> Result<TestHosts> {
        TestHosts::start_with(&HarnessConfig::from_env()?, n)
    }

    /// Starts `n` hosts in parallel; if any fails, the others are torn down and the first
    /// error is returned.
    pub fn start_with(config: &HarnessConfig, n: usize) -> Result<TestHosts> {
        TestHosts::start_with_options(config, n, &HostOptions::default())
    }

    /// Starts `n` hosts in parallel with boot-time options.
    pub fn start_with_options(
        config: &HarnessConfig,
        n: usize,
        options: &HostOptions,
    ) -> Result<TestHosts> {
        let base = preflight(config)?;
        let t0 = Instant::now();
        let results: Vec<Result<TestHost>> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..n)
                .map(|_| s.spawn(|| TestHost::start_on(config, &base, options)))
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join().unwrap_or_else(|_| {
                        Err(Error::Teardown {
                            name: "test host".into(),
                            detail: "the thread starting it panicked".into(),
                        })
                    })
                })
                .collect()
        });
        let mut hosts = Vec::with_capacity(n);
        let mut first_err = None;
        for r in results {
            match r {
                Ok(h) => hosts.push(h),
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
        }
        let group = TestHosts {
            hosts,
            started_in: t0.elapsed(),
        };
        match first_err {
            Some(e) => Err(e), // `group` drops here and tears the started ones down
            None => Ok(group),
        }
    }

    /// Wall time to boot all hosts (excluding the base rootfs build).
    pub fn started_in(&self) -> Duration {
        self.started_in
    }

    /// Shuts all hosts down in parallel; returns the first error.
    pub fn shutdown(mut self) -> Result<()> {
        shutdown_all(std::mem::take(&mut self.hosts))
    }
}

fn shutdown_all(hosts: Vec<TestHost>) -> Result<()> {
    let results: Vec<Result<()>> = std::thread::scope(|s| {
        let handles: Vec<_> = hosts
            .into_iter()
            .map(|h| s.spawn(move || h.shutdown()))
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join().unwrap_or_else(|_| {
                    Err(Error::Teardown {
                        name: "test host".into(),
                        detail: "the thread shutting it down panicked".into(),
                    })
                })
            })
            .collect()
    });
    results.into_iter().collect()
}

impl Deref for TestHosts {
    type Target = [TestHost];
    fn deref(&self) -> &[TestHost] {
        &self.hosts
    }
}

impl Drop for TestHosts {
    fn drop(&mut self) {
        if let Err(e) = shutdown_all(std::mem::take(&mut self.hosts)) {
            eprintln!("clawfleet-vm-tests: {e} (run `vmhosts clean`)");
        }
    }
}
