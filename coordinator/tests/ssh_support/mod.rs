//! Shared pieces of the SSH backend's tests and benchmark: the coordinator's keys, hostd
//! built with cargo, a private OpenSSH `sshd` on loopback whose forced command runs hostd,
//! and a real test host with hostd enrolled.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

/// Installs hostd from the project's .deb when a current one was built (always under CI).
#[path = "../../../vm-tests/tests/packages_support/install.rs"]
mod install;

use std::io::Read;
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use clawfleet_protocol::operation::*;
use clawfleet_protocol::result::Hello;
use clawfleet_protocol::ssh_key::{
    Algorithm, LineEnding, PrivateKey, getrandom::SysRng, rand_core::UnwrapErr,
};
use clawfleet_protocol::{Configuration, Fingerprint, HostName, Ident, Principal};
use coordinator::backend::HostTarget;
use coordinator::ssh::{SshBackend, SshSettings};
use serde_json::{Value, json};

pub const PRINCIPAL: &str = "occ@ssh-tests";

/// Whether loopback sshd tests can run; prints SKIP otherwise (fails under CI=true).
pub fn loopback_skip() -> bool {
    let reason = if !nix_is_root() {
        Some("the loopback sshd tests need root (sshd logs in as root and runs hostd)")
    } else if !Path::new("/usr/sbin/sshd").exists() {
        Some("/usr/sbin/sshd not found (apt-get install openssh-server)")
    } else {
        None
    };
    match reason {
        None => false,
        Some(r) => {
            if std::env::var("CI").is_ok_and(|v| v == "true" || v == "1") {
                panic!("CI is set but the loopback sshd tests cannot run: {r}");
            }
            eprintln!("SKIP: {r}");
            true
        }
    }
}

fn nix_is_root() -> bool {
    // /proc/self/status: "Uid:\t<real>\t<effective>…"
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .and_then(|l| l.split_whitespace().nth(2).map(|u| u == "0"))
        })
        .unwrap_or(false)
}

pub fn random_key() -> PrivateKey {
    PrivateKey::random(&mut UnwrapErr(SysRng), Algorithm::Ed25519).unwrap()
}

/// The coordinator's two keys, as `occ init` makes them.
pub struct Keys {
    pub login: PrivateKey,
    pub signing: PrivateKey,
    pub principal: Principal,
}

impl Keys {
    pub fn new() -> Self {
        Self {
            login: random_key(),
            signing: random_key(),
            principal: Principal::new(PRINCIPAL).unwrap(),
        }
    }

    pub fn login_public(&self) -> String {
        self.login.public_key().to_openssh().unwrap()
    }

    pub fn signing_public(&self) -> String {
        self.signing.public_key().to_openssh().unwrap()
    }

    pub fn backend(&self, settings: SshSettings) -> SshBackend {
        SshBackend::new(
            self.login.clone(),
            self.signing.clone(),
            self.principal.clone(),
            settings,
        )
        .unwrap()
    }

    /// Writes the login key as an OpenSSH private key file (0600) for the stock `ssh`.
    pub fn write_login_key(&self, path: &Path) {
        std::fs::write(
            path,
            self.login.to_openssh(LineEnding::LF).unwrap().as_bytes(),
        )
        .unwrap();
        std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(0o600))
            .unwrap();
    }
}

/// Settings with short limits, so tests wait seconds.
pub fn fast_settings() -> SshSettings {
    SshSettings {
        // Generous: on a loaded machine, starting several hostd sessions at once has taken
        // over 5 s before their hellos (a refused or unreachable host still fails at once).
        connect_timeout: Duration::from_secs(15),
        reconnect_backoff_base: Duration::from_millis(100),
        reconnect_backoff_max: Duration::from_secs(1),
        status_poll_interval: Duration::from_millis(200),
        transport_grace: Duration::from_secs(2),
        ..SshSettings::default()
    }
}

pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// What a loopback test starts from: hostd behind a private sshd, and a backend with
/// `settings` that trusts its host key. The keys must outlive the test (they are its files).
pub struct Started {
    pub keys: Keys,
    pub lo: Loopback,
    pub backend: SshBackend,
    pub target: HostTarget,
}

/// [`Started`], with tracing on; `None` when the test must skip ([`loopback_skip`] said
/// why).
pub fn start(settings: SshSettings) -> Option<Started> {
    if loopback_skip() {
        return None;
    }
    init_tracing();
    let keys = Keys::new();
    let lo = Loopback::start(&keys);
    let backend = keys.backend(settings);
    let target = lo.target();
    Some(Started {
        keys,
        lo,
        backend,
        target,
    })
}

pub fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("SSH_TEST_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_test_writer()
        .try_init();
}

static HOSTD: Mutex<Option<PathBuf>> = Mutex::new(None);

/// The hostd binary: `$CLAWFLEET_HOSTD_BIN` if set, else built once per process with
/// `cargo build -p clawfleet-hostd --bin hostd` (same target dir and profile as the test),
/// the path read from cargo's JSON messages. Cargo cannot hand one package's binary to
/// another package's tests (`CARGO_BIN_EXE_hostd` exists only in hostd's own tests).
pub fn hostd_binary() -> PathBuf {
    if let Some(p) = std::env::var_os("CLAWFLEET_HOSTD_BIN") {
        let p = PathBuf::from(p);
        assert!(
            p.is_file(),
            "CLAWFLEET_HOSTD_BIN={} is not a file",
            p.display()
        );
        return p;
    }
    let mut built = HOSTD.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(p) = built.as_ref() {
        return p.clone();
    }
    let exe = clawfleet_vm_tests::cargo_build(
        "clawfleet-hostd",
        clawfleet_vm_tests::Artifact::Bin,
        "hostd",
    )
    .unwrap_or_else(|e| panic!("{e}"));
    *built = Some(exe.clone());
    exe
}

static SEQ: AtomicU32 = AtomicU32::new(0);

/// A private OpenSSH sshd on 127.0.0.1 with its own host key; the coordinator's login key
/// is authorised with a forced command that runs hostd (through a small wrapper whose
/// one-shot modes simulate lost results and swallowed envelopes).
pub struct Loopback {
    pub dir: tempfile::TempDir,
    pub state_root: PathBuf,
    pub name: String,
    pub port: u16,
    /// The pinned key line (the host key sshd presents unless told otherwise).
    pub host_pub: String,
    host_key_file: PathBuf,
    sshd: Option<Child>,
}

impl Loopback {
    pub fn start(keys: &Keys) -> Self {
        let hostd = hostd_binary();
        std::fs::create_dir_all("/run/sshd").unwrap();
        let n = SEQ.fetch_add(1, Ordering::SeqCst);
        let dir = tempfile::Builder::new()
            .prefix("clawfleet-ssh-test-")
            .tempdir()
            .unwrap();
        let d = dir.path();
        let name = format!("loop-{}-{n}", std::process::id());
        let state_root = PathBuf::from(format!(
            "/var/lib/clawfleet-ssh-test-{}-{n}",
            std::process::id()
        ));
        let host_key = random_key();
        let host_key_file = d.join("host_ed25519");
        write_private(&host_key_file, &host_key);
        let host_pub = host_key.public_key().to_openssh().unwrap();
        std::fs::write(d.join("host_ed25519.pub"), format!("{host_pub}\n")).unwrap();
        std::fs::write(
            d.join("allowed_signers"),
            format!("{PRINCIPAL} {}\n", keys.signing_public()),
        )
        .unwrap();
        // A long lock timeout: warm sessions send concurrent operations straight into hostd's
        // host lock, and on a loaded machine each holder's fsyncs take long.
        std::fs::write(
            d.join("hostd.toml"),
            format!(
                "host_name = \"{name}\"\nhost_key = \"{hk}\"\nallowed_signers = \"{as_}\"\n\
                 state_root = \"{sr}\"\nunit_dir = \"{sr}/units\"\ngateway_command = [\"/bin/true\"]\n\
                 hooks_dir = \"{d}/hooks\"\n[limits]\nlock_timeout_ms = 15000\n",
                d = d.display(),
                hk = d.join("host_ed25519.pub").display(),
                as_ = d.join("allowed_signers").display(),
                sr = state_root.display(),
            ),
        )
        .unwrap();
        // An after-namespace-prepared hook: it records "<hostd pid> <own pid>" (its parent is
        // the hostd process of the session running the ensure-namespace), then sleeps for
        // the seconds in `hook-sleep` (none unless a test writes it).
        let hook_dir = d.join("hooks/after-namespace-prepared");
        std::fs::create_dir_all(&hook_dir).unwrap();
        for dir in [d.join("hooks"), hook_dir.clone()] {
            std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o755))
                .unwrap();
        }
        let hook = hook_dir.join("10-record");
        std::fs::write(
            &hook,
            format!(
                "#!/bin/sh\n\
                 D='{d}'\n\
                 echo \"$PPID $$\" >> \"$D/hook-runs\"\n\
                 if [ -s \"$D/hook-sleep\" ]; then /bin/sleep \"$(/bin/cat \"$D/hook-sleep\")\"; fi\n",
                d = d.display(),
            ),
        )
        .unwrap();
        std::fs::set_permissions(&hook, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
        // The hello hostd sends, to let the "lose-result" mode pass exactly that through.
        let hello = Hello {
            hostd_version: env!("CARGO_PKG_VERSION").to_owned(),
            protocol_versions: clawfleet_protocol::SUPPORTED_VERSIONS.to_vec(),
            host_key: Fingerprint::of(host_key.public_key()),
        };
        let hello_len = 7 + serde_json::to_vec(&hello).unwrap().len();
        let wrapper = d.join("forced.sh");
        std::fs::write(
            &wrapper,
            format!(
                "#!/bin/sh\n\
                 D='{d}'\n\
                 # One line per session: the pid that becomes hostd (exec keeps it).\n\
                 echo $$ >> \"$D/starts\"\n\
                 H=\"{hostd} --config $D/hostd.toml serve\"\n\
                 # lose-result: hostd runs what it gets, but only its hello reaches the client; the\n\
                 # session ends a second later (hostd sees its output closed).\n\
                 if [ -e \"$D/mode-lose-result\" ]; then rm -f \"$D/mode-lose-result\"; $H | {{ head -c {hello_len}; sleep 1; }}; exit 0; fi\n\
                 # hold: like lose-result, but the session stays open for 20 s.\n\
                 if [ -e \"$D/mode-hold\" ]; then rm -f \"$D/mode-hold\"; $H | {{ head -c {hello_len}; sleep 20; cat > /dev/null; }}; exit 0; fi\n\
                 # swallow: hostd says hello and exits; the envelope goes nowhere.\n\
                 if [ -e \"$D/mode-swallow\" ]; then rm -f \"$D/mode-swallow\"; $H < /dev/null; head -c 1 > /dev/null; exit 0; fi\n\
                 exec $H\n",
                d = d.display(),
                hostd = hostd.display(),
            ),
        )
        .unwrap();
        std::fs::set_permissions(
            &wrapper,
            std::os::unix::fs::PermissionsExt::from_mode(0o755),
        )
        .unwrap();
        std::fs::write(
            d.join("authorized_keys"),
            format!(
                "restrict,command=\"{}\" {}\n",
                wrapper.display(),
                keys.login_public()
            ),
        )
        .unwrap();
        let mut me = Self {
            dir,
            state_root,
            name,
            port: free_port(),
            host_pub,
            host_key_file,
            sshd: None,
        };
        me.start_sshd();
        me
    }

    pub fn target(&self) -> HostTarget {
        HostTarget {
            name: HostName::new(self.name.as_str()).unwrap(),
            address: "127.0.0.1".to_owned(),
            port: self.port,
            host_key: self.host_pub.clone(),
            login_user: None,
            jump: None,
        }
    }

    pub fn fingerprint(&self) -> String {
        clawfleet_protocol::ssh_key::PublicKey::from_openssh(&self.host_pub)
            .unwrap()
            .fingerprint(clawfleet_protocol::ssh_key::HashAlg::Sha256)
            .to_string()
    }

    fn config_text(&self, host_key_file: &Path) -> String {
        let d = self.dir.path();
        format!(
            "ListenAddress 127.0.0.1:{port}\nHostKey {hk}\nPidFile {d}/sshd.pid\n\
             AuthorizedKeysFile {d}/authorized_keys\nStrictModes no\nPermitRootLogin prohibit-password\n\
             PubkeyAuthentication yes\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n\
             UsePAM no\nLogLevel VERBOSE\nMaxSessions 10\nMaxStartups 100:30:200\nPrintMotd no\n\
             AllowTcpForwarding no\nAllowStreamLocalForwarding no\n",
            port = self.port,
            hk = host_key_file.display(),
            d = d.display(),
        )
    }

    /// Starts sshd with the pinned host key.
    pub fn start_sshd(&mut self) {
        let file = self.host_key_file.clone();
        self.start_sshd_with(&file);
    }

    /// Starts sshd presenting another host key; returns that key's fingerprint.
    pub fn start_sshd_with_other_key(&mut self) -> String {
        let other = random_key();
        let file = self.dir.path().join("other_host_ed25519");
        write_private(&file, &other);
        self.start_sshd_with(&file);
        Fingerprint::of(other.public_key()).to_string()
    }

    fn start_sshd_with(&mut self, host_key_file: &Path) {
        assert!(self.sshd.is_none(), "sshd already running");
        let conf = self.dir.path().join("sshd_config");
        std::fs::write(&conf, self.config_text(host_key_file)).unwrap();
        let child = Command::new("/usr/sbin/sshd")
            .arg("-D")
            .arg("-f")
            .arg(&conf)
            .arg("-E")
            .arg(self.dir.path().join("sshd.log"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        self.sshd = Some(child);
        // Ready once it sends its SSH banner.
        let until = Instant::now() + Duration::from_secs(10);
        loop {
            if let Ok(mut s) = TcpStream::connect(("127.0.0.1", self.port)) {
                let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
                let mut buf = [0u8; 7];
                if s.read_exact(&mut buf).is_ok() && &buf == b"SSH-2.0" {
                    return;
                }
            }
            if let Some(c) = self.sshd.as_mut()
                && let Ok(Some(status)) = c.try_wait()
            {
                panic!("sshd exited at start ({status}); log: {}", self.log());
            }
            assert!(
                Instant::now() < until,
                "sshd did not come up: {}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Kills sshd and every session process it started (by pid), so connections drop.
    pub fn stop_sshd(&mut self) {
        let Some(mut child) = self.sshd.take() else {
            return;
        };
        let pids = descendants(child.id());
        let _ = child.kill();
        let _ = child.wait();
        kill_pids(&pids);
    }

    pub fn sshd_running(&self) -> bool {
        self.sshd.is_some()
    }

    /// The pids of the hostd sessions sshd started, in order (one per `hostd serve`).
    pub fn starts(&self) -> Vec<u32> {
        std::fs::read_to_string(self.dir.path().join("starts"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect()
    }

    /// Every run of the after-namespace-prepared hook: (the hostd pid that ran it, its own pid).
    pub fn hook_runs(&self) -> Vec<(u32, u32)> {
        std::fs::read_to_string(self.dir.path().join("hook-runs"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| {
                let (a, b) = l.trim().split_once(' ')?;
                Some((a.parse().ok()?, b.parse().ok()?))
            })
            .collect()
    }

    /// Makes every later hook run sleep `seconds` (0: not at all).
    pub fn hook_sleep(&self, seconds: u32) {
        let path = self.dir.path().join("hook-sleep");
        if seconds == 0 {
            let _ = std::fs::remove_file(path);
        } else {
            std::fs::write(path, seconds.to_string()).unwrap();
        }
    }

    /// hostd's operation journal: every entry, as written (`<state_root>/journal/<id>.json`).
    pub fn journal(&self) -> Vec<Value> {
        let Ok(dir) = std::fs::read_dir(self.state_root.join("journal")) else {
            return Vec::new();
        };
        let mut entries: Vec<Value> = dir
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().ends_with(".json"))
            .filter_map(|e| serde_json::from_slice(&std::fs::read(e.path()).ok()?).ok())
            .collect();
        entries.sort_by_key(|e| e["operationId"].as_str().map(str::to_owned));
        entries
    }

    /// The sshd process that relays a hostd session's channel (hostd's parent).
    pub fn relay_of(&self, hostd_pid: u32) -> u32 {
        parent_of(hostd_pid).unwrap_or_else(|| panic!("hostd {hostd_pid} has no parent"))
    }

    /// Arms a one-shot mode of the forced-command wrapper (for the next session started).
    pub fn arm(&self, mode: &str) {
        std::fs::write(self.dir.path().join(format!("mode-{mode}")), b"").unwrap();
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("sshd.log")).unwrap_or_default()
    }

    /// Logins sshd accepted (one per TCP connection).
    pub fn accepted_logins(&self) -> usize {
        self.log()
            .lines()
            .filter(|l| l.contains("Accepted publickey for root"))
            .count()
    }
}

impl Drop for Loopback {
    fn drop(&mut self) {
        self.stop_sshd();
        // Hooks orphaned by a killed hostd (checked by command line against pid reuse).
        for (_, hook) in self.hook_runs() {
            let cmdline = std::fs::read(format!("/proc/{hook}/cmdline")).unwrap_or_default();
            if String::from_utf8_lossy(&cmdline).contains("10-record") {
                kill_pids(&[hook]);
            }
        }
        let _ = std::fs::remove_dir_all(&self.state_root);
    }
}

fn write_private(path: &Path, key: &PrivateKey) {
    std::fs::write(path, key.to_openssh(LineEnding::LF).unwrap().as_bytes()).unwrap();
    std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
}

/// A port nothing listens on right now.
pub fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

/// Whether a process exists (and is not a zombie).
pub fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rfind(')')
                .and_then(|i| s[i + 1..].split_whitespace().next().map(|st| st != "Z"))
        })
        .unwrap_or(false)
}

/// A process's parent pid.
pub fn parent_of(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = &stat[stat.rfind(')')? + 1..];
    after.split_whitespace().nth(1)?.parse().ok()
}

/// Sends a signal (`-KILL`, `-STOP`, `-CONT`) to one process, by its pid.
pub fn signal(pid: u32, signal: &str) {
    let status = Command::new("kill")
        .args([signal, &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success(), "kill {signal} {pid} failed");
}

/// Waits until a process is gone.
pub fn wait_gone(pid: u32, within: Duration) {
    let until = Instant::now() + within;
    while alive(pid) {
        assert!(Instant::now() < until, "process {pid} still runs");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Every process below `root` (children first found, deepest last).
fn descendants(root: u32) -> Vec<u32> {
    let mut parent_of = Vec::new();
    if let Ok(entries) = std::fs::read_dir("/proc") {
        for e in entries.flatten() {
            let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
                continue;
            };
            let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
                continue;
            };
            // "pid (comm) state ppid …"; comm may hold spaces and parentheses.
            let Some(after) = stat.rfind(')').map(|i| &stat[i + 1..]) else {
                continue;
            };
            if let Some(ppid) = after
                .split_whitespace()
                .nth(1)
                .and_then(|p| p.parse::<u32>().ok())
            {
                parent_of.push((pid, ppid));
            }
        }
    }
    let mut out = Vec::new();
    let mut frontier = vec![root];
    while let Some(p) = frontier.pop() {
        for &(pid, ppid) in &parent_of {
            if ppid == p && !out.contains(&pid) {
                out.push(pid);
                frontier.push(pid);
            }
        }
    }
    out
}

fn kill_pids(pids: &[u32]) {
    if pids.is_empty() {
        return;
    }
    let _ = Command::new("kill")
        .arg("-KILL")
        .args(pids.iter().map(|p| p.to_string()))
        .stderr(Stdio::null())
        .status();
}

// ---- operations ----

pub fn id(s: &str) -> Ident {
    Ident::new(s).unwrap()
}

pub fn ns(n: &str) -> NamespaceRef {
    NamespaceRef {
        id: id(n),
        name: id(&format!("{n}-name")),
    }
}

pub fn agent(a: &str) -> AgentRef {
    AgentRef {
        id: id(a),
        service_principal_id: id(&format!("sp-{a}")),
    }
}

pub fn probe() -> Operation {
    Operation::Probe(ProbeArgs {})
}

pub fn status() -> Operation {
    Operation::Status(StatusArgs::default())
}

pub fn ensure(n: &str) -> Operation {
    Operation::EnsureNamespace(NamespaceArgs { namespace: ns(n) })
}

/// A rendered configuration as the coordinator sends it, with test-gateway switches.
pub fn configuration(switches: Value) -> Configuration {
    let gateway = json!({"mode": "local", "bind": "loopback",
        "auth": {"mode": "password", "password": {"source": "env", "provider": "default", "id": "OPENCLAW_GATEWAY_PASSWORD"}}});
    Configuration::new(json!({"gateway": gateway, "x-clawfleet-test": switches})).unwrap()
}

pub fn spec(rev: &str, number: u64, switches: Value) -> RevisionSpec {
    let configuration = configuration(switches);
    RevisionSpec {
        id: id(rev),
        number: RevisionNumber::new(number).unwrap(),
        harness: Harness {
            id: HarnessId::Openclaw,
            version: HarnessVersion::new("2026.9.6").unwrap(),
            mode: HarnessMode::Embedded,
        },
        configuration_hash: configuration.hash(),
        configuration,
    }
}

pub fn prepare(n: &str, a: &str, rev: &RevisionSpec) -> Operation {
    Operation::PrepareRevision(PrepareArgs {
        workspace: None,
        namespace: ns(n),
        agent: agent(a),
        revision: rev.clone(),
        egress: None,
    })
}

pub fn activate(n: &str, a: &str, rev: &RevisionSpec) -> Operation {
    Operation::ActivateRevision(ActivateArgs::from(RevisionArgs {
        namespace: ns(n),
        agent: agent(a),
        revision: rev.reference(),
    }))
}

// ---- real test hosts ----

/// Installs hostd and the test gateway on a test host, writes hostd.toml with short limits
/// and enrols the coordinator's keys with `hostd enrol`.
pub fn install_hostd(host: &clawfleet_vm_tests::TestHost, keys: &Keys) {
    install::install_hostd_package_or_binary(host, &hostd_binary()).unwrap();
    let gateway = host.install_test_gateway().unwrap();
    let config = format!(
        "host_name = \"{}\"\ngateway_command = [\"{gateway}\"]\n[limits]\nlock_timeout_ms = 3000\nreadiness_timeout_ms = 20000\nunit_stop_timeout_ms = 10000\n",
        host.name()
    );
    host.write_file("/etc/clawfleet/hostd.toml", config.as_bytes(), 0o644)
        .unwrap();
    host.write_file("/tmp/occ-login.pub", keys.login_public().as_bytes(), 0o644)
        .unwrap();
    host.write_file(
        "/tmp/occ-signing.pub",
        keys.signing_public().as_bytes(),
        0o644,
    )
    .unwrap();
    let out = host
        .run_ok(&format!(
            "hostd enrol --ssh-key /tmp/occ-login.pub --signing-key /tmp/occ-signing.pub --principal {PRINCIPAL}"
        ))
        .unwrap();
    assert!(
        out.contains(host.host_key_fingerprint()),
        "enrol prints the fingerprint to pin: {out}"
    );
}

/// How the coordinator's database would describe a test host.
pub fn host_target(host: &clawfleet_vm_tests::TestHost) -> HostTarget {
    HostTarget {
        name: HostName::new(host.name()).unwrap(),
        address: host.address().to_string(),
        port: 22,
        host_key: host.host_public_key().trim().to_owned(),
        login_user: None,
        jump: None,
    }
}

/// The host's clock (Unix seconds), for `journalctl --since @…`.
pub fn host_now(host: &clawfleet_vm_tests::TestHost) -> u64 {
    host.run_ok("date +%s").unwrap().trim().parse().unwrap()
}

/// The host's clock in µs since the epoch: journal entries are selected by the second, so a
/// test that must not see the operations of the same second before it filters with this.
pub fn host_now_us(host: &clawfleet_vm_tests::TestHost) -> u64 {
    host.run_ok("date +%s%6N").unwrap().trim().parse().unwrap()
}

/// One operation as hostd's journald entries tell it: its id, kind, the pid of the hostd
/// process (the session) that ran it, and when hostd logged receiving and finishing it
/// (journald's receive times, µs since the epoch).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostdOp {
    pub id: String,
    pub op: String,
    pub pid: u32,
    pub received_us: u64,
    /// "operation succeeded" or "operation failed".
    pub finished_us: Option<u64>,
    pub succeeded: bool,
}

/// A field of a journal entry (`journalctl -o json`), whatever prefix tracing-journald gave it
/// (`OP` or `F_OP`).
pub fn journal_field<'a>(entry: &'a Value, name: &str) -> Option<&'a str> {
    entry
        .as_object()?
        .iter()
        .find(|(k, _)| *k == name || k.strip_prefix("F_") == Some(name))
        .and_then(|(_, v)| v.as_str())
}

/// hostd's journald entries since `since` (host clock), in order.
pub fn hostd_journal(host: &clawfleet_vm_tests::TestHost, since: u64) -> Vec<Value> {
    host.run_ok(&format!(
        "journalctl -t hostd -o json --no-pager --since @{since}"
    ))
    .unwrap()
    .lines()
    .filter_map(|l| serde_json::from_str::<Value>(l).ok())
    .collect()
}

/// The operations hostd received since `since` (host clock), in order.
pub fn hostd_ops(host: &clawfleet_vm_tests::TestHost, since: u64) -> Vec<HostdOp> {
    let mut ops: Vec<HostdOp> = Vec::new();
    for e in hostd_journal(host, since) {
        let (Some(id), Some(msg), Some(at)) = (
            journal_field(&e, "OPERATION_ID"),
            journal_field(&e, "MESSAGE"),
            journal_field(&e, "__REALTIME_TIMESTAMP").and_then(|t| t.parse::<u64>().ok()),
        ) else {
            continue;
        };
        if msg.contains("operation received") {
            let (Some(op), Some(pid)) = (
                journal_field(&e, "OP"),
                journal_field(&e, "_PID").and_then(|p| p.parse().ok()),
            ) else {
                continue;
            };
            ops.push(HostdOp {
                id: id.to_owned(),
                op: op.to_owned(),
                pid,
                received_us: at,
                finished_us: None,
                succeeded: false,
            });
        } else if let Some(o) = ops.iter_mut().rev().find(|o| o.id == id)
            && o.finished_us.is_none()
        {
            if msg.contains("operation succeeded") {
                o.finished_us = Some(at);
                o.succeeded = true;
            } else if msg.contains("operation failed") {
                o.finished_us = Some(at);
            }
        }
    }
    ops
}

/// The pids of the `hostd serve` processes running on the host.
pub fn hostd_serve_pids(host: &clawfleet_vm_tests::TestHost) -> Vec<u32> {
    host.run_ok("ps -C hostd -o pid=,args= || true")
        .unwrap()
        .lines()
        .filter(|l| l.contains(" serve"))
        .filter_map(|l| l.split_whitespace().next()?.parse().ok())
        .collect()
}

/// hostd's journal entry for an operation id (`/var/lib/clawfleet/journal/<id>.json`).
pub fn journal_entry(host: &clawfleet_vm_tests::TestHost, id: &str) -> Option<Value> {
    let out = host
        .run(&format!("cat /var/lib/clawfleet/journal/{id}.json"))
        .unwrap();
    serde_json::from_slice(&out.stdout).ok()
}

/// The entries of hostd's journal (`/var/lib/clawfleet/journal/*.json`).
pub fn journal_entries(host: &clawfleet_vm_tests::TestHost) -> Vec<Value> {
    let text = host
        .run_ok("for f in /var/lib/clawfleet/journal/*.json; do [ -f \"$f\" ] && cat \"$f\"; done; true")
        .unwrap();
    serde_json::Deserializer::from_str(&text)
        .into_iter::<Value>()
        .map(|v| v.unwrap())
        .collect()
}

static SUDO_DEB: Mutex<Option<PathBuf>> = Mutex::new(None);

/// Installs sudo on a test host (the base rootfs has none) from Debian's package, fetched
/// once per process on the runner with `apt-get download` (the hosts have no network).
pub fn install_sudo(host: &clawfleet_vm_tests::TestHost) {
    if host.run("command -v sudo").unwrap().status.success() {
        return;
    }
    let deb = {
        let mut cached = SUDO_DEB.lock().unwrap_or_else(|p| p.into_inner());
        if cached.is_none() {
            let dir =
                std::env::temp_dir().join(format!("clawfleet-ssh-sudo-{}", std::process::id()));
            std::fs::create_dir_all(&dir).unwrap();
            let out = Command::new("apt-get")
                .args(["download", "sudo"])
                .current_dir(&dir)
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "apt-get download sudo failed (the login-user tests need Debian's sudo package): {}",
                String::from_utf8_lossy(&out.stderr)
            );
            let deb = std::fs::read_dir(&dir)
                .unwrap()
                .flatten()
                .map(|e| e.path())
                .find(|p| p.extension().is_some_and(|e| e == "deb"))
                .expect("apt-get download wrote no .deb");
            *cached = Some(deb);
        }
        cached.clone().unwrap()
    };
    host.install_deb(&deb).unwrap();
}

/// Removes the sudo package [`install_sudo`] downloaded, when dropped (hold one for the test).
pub struct SudoDownload;

impl Drop for SudoDownload {
    fn drop(&mut self) {
        if let Some(deb) = SUDO_DEB.lock().unwrap_or_else(|p| p.into_inner()).take()
            && let Some(dir) = deb.parent()
        {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// Sets up a dedicated login user for the coordinator, as `hostd enrol --login-user` will:
/// its authorized_keys runs `sudo -n /usr/sbin/hostd serve` as the forced command, and a
/// sudoers drop-in allows exactly that. Root no longer accepts the coordinator's key.
pub fn add_login_user(host: &clawfleet_vm_tests::TestHost, user: &str, keys: &Keys) {
    install_sudo(host);
    host.run_ok(&format!(
        "useradd --system --create-home --shell /bin/sh {user} && usermod -p '*' {user} && \
         install -d -m 700 -o {user} -g {user} /home/{user}/.ssh && \
         sed -i '/{principal}/d' /root/.ssh/authorized_keys",
        principal = keys
            .login_public()
            .split_whitespace()
            .nth(1)
            .unwrap()
            .replace('/', "\\/"),
    ))
    .unwrap();
    // The forced command and drop-in `hostd enrol --login-user` writes (serve, and relay
    // when the coordinator asks for the relay channel).
    let request = hostd::login_user::LoginUserRequest::new(user);
    host.write_file(
        &format!("/home/{user}/.ssh/authorized_keys"),
        format!(
            "restrict,command=\"{}\" {}\n",
            request.forced_command(),
            keys.login_public()
        )
        .as_bytes(),
        0o600,
    )
    .unwrap();
    host.write_file(
        "/etc/sudoers.d/clawfleet-hostd",
        request.sudoers_text().as_bytes(),
        0o440,
    )
    .unwrap();
    host.run_ok(&format!(
        "chown {user}:{user} /home/{user}/.ssh/authorized_keys && visudo -cq"
    ))
    .unwrap();
}

/// Sets up a jump host account for the coordinator: port forwarding to `targets` only, no
/// shell, no session.
pub fn add_jump_user(
    host: &clawfleet_vm_tests::TestHost,
    user: &str,
    keys: &Keys,
    targets: &[String],
) {
    host.run_ok(&format!(
        "useradd --system --create-home --shell /usr/sbin/nologin {user} && usermod -p '*' {user} && \
         install -d -m 700 -o {user} -g {user} /home/{user}/.ssh"
    ))
    .unwrap();
    let permit: Vec<String> = targets
        .iter()
        .map(|t| format!("permitopen=\"{t}\""))
        .collect();
    host.write_file(
        &format!("/home/{user}/.ssh/authorized_keys"),
        format!(
            "restrict,port-forwarding,{},command=\"/bin/false\" {}\n",
            permit.join(","),
            keys.login_public()
        )
        .as_bytes(),
        0o600,
    )
    .unwrap();
    host.run_ok(&format!(
        "chown {user}:{user} /home/{user}/.ssh/authorized_keys"
    ))
    .unwrap();
}

/// A private link between two test hosts' network namespaces (a veth pair whose ends live
/// only there, deleted with either namespace): `a` gets `169.254.78.(4n+1)`, `b` gets
/// `169.254.78.(4n+2)`. Nothing else can reach these addresses: the runner has no route.
pub struct HostLink {
    netns: String,
    name: String,
    pub a_address: String,
    pub b_address: String,
}

impl HostLink {
    pub fn new(a: &clawfleet_vm_tests::TestHost, b: &clawfleet_vm_tests::TestHost, n: u8) -> Self {
        let (na, nb) = (a.record().netns, b.record().netns);
        let name = format!("cfl{n}");
        let a_address = format!("169.254.78.{}", 4 * n + 1);
        let b_address = format!("169.254.78.{}", 4 * n + 2);
        let run = |args: &str| {
            let out = Command::new("sh")
                .arg("-c")
                .arg(format!("ip {args}"))
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "ip {args}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        };
        run(&format!(
            "link add name {name} netns {na} type veth peer name {name} netns {nb}"
        ));
        run(&format!("-n {na} addr add {a_address}/30 dev {name}"));
        run(&format!("-n {nb} addr add {b_address}/30 dev {name}"));
        run(&format!("-n {na} link set {name} up"));
        run(&format!("-n {nb} link set {name} up"));
        Self {
            netns: na,
            name,
            a_address,
            b_address,
        }
    }
}

impl Drop for HostLink {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["-n", &self.netns, "link", "del", &self.name])
            .stderr(Stdio::null())
            .status();
    }
}
