//! The fleet under test, shared by the end-to-end suites and the fleet benchmark: real hosts
//! with hostd, `occ init`, `occ serve` as a child process, enrolment, and helpers that drive the
//! CLI/API and check the hosts.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use clawfleet_vm_tests::{TestHost, TestHosts};
use coordinator::client::{Client, ClientError};
use serde_json::{Value, json};

/// The Namespace every scenario uses.
pub const NS: &str = "fleet";

/// What an Agent should be doing, as the test wants it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Want {
    /// Serving `rev`; the gateway's `/info` label is `label`.
    Running { rev: String, label: String },
    /// Stopped; `rev` (the last active revision) stays on the host as a snapshot.
    Stopped { rev: String },
}

/// The desired state of every Agent that still exists (deleted ones are absent).
pub type Model = BTreeMap<String, Want>;

/// Builds a workspace binary with the running test's profile; returns its path.
pub fn build_binary(package: &str, bin: &str) -> PathBuf {
    clawfleet_vm_tests::cargo_build(package, clawfleet_vm_tests::Artifact::Bin, bin)
        .unwrap_or_else(|e| panic!("{e}"))
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("no free loopback port")
        .port()
}

/// Prints how long a phase took.
pub fn phase_done(name: &str, start: Instant) {
    eprintln!("=== phase {name}: {:.1} s", start.elapsed().as_secs_f64());
}

/// How a fleet is set up: its hosts, and its coordinators and their database.
#[derive(Debug, Clone)]
pub struct FleetOptions {
    pub hosts: usize,
    /// `occ serve` processes sharing the state (more than one needs `database`).
    pub coordinators: usize,
    /// `database = …` for occ.toml (a PostgreSQL URL); `None`: SQLite in the state directory.
    pub database: Option<String>,
    /// `[postgres] password_file`.
    pub password_file: Option<PathBuf>,
    /// More occ.toml lines (sections of their own, e.g. `[leader]`).
    pub extra_toml: String,
    /// `[worker] lease_seconds`.
    pub lease_seconds: u32,
    /// Give each host a state root on a loop-mounted btrfs image of this many bytes with
    /// quotas enabled (`HostOptions::btrfs_state_root`), so hostd limits each Agent's disk use
    /// and the coordinator lets several Namespaces share a host; `None`: the host's own
    /// overlay file system, where hostd reports `quotas: unavailable` and a host takes one
    /// Namespace only (`HOST_NOT_QUOTA_LIMITED`).
    pub btrfs_state_roots: Option<u64>,
    /// Run the real OpenClaw gateway (the cached bundle, bound into each host) instead of
    /// the test gateway; Agents then need a document OpenClaw takes, not [`document`]'s.
    pub openclaw: bool,
}

impl Default for FleetOptions {
    fn default() -> Self {
        Self {
            hosts: 3,
            coordinators: 1,
            database: None,
            password_file: None,
            extra_toml: String::new(),
            lease_seconds: 3,
            btrfs_state_roots: None,
            openclaw: false,
        }
    }
}

/// Three (or n) hosts, the coordinator(s) and their state. The hosts' sshd forbids
/// forwarding ([`clawfleet_vm_tests::TestHost::forbid_forwarding`]), as on a STIG host.
pub struct Fleet {
    servers: Vec<Option<Child>>,
    serve_runs: Vec<u32>,
    pub port: u16,
    pub ports: Vec<u16>,
    pub occ_bin: PathBuf,
    /// Coordinator 0's configuration (every coordinator's differs only in `listen`).
    pub config: PathBuf,
    pub configs: Vec<PathBuf>,
    pub api: Client,
    pub apis: Vec<Client>,
    pub dir: tempfile::TempDir,
    pub hosts: TestHosts,
}

impl std::fmt::Debug for Fleet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fleet").field("port", &self.port).finish()
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        if std::thread::panicking() {
            // The coordinator's log explains most failures.
            for log in self.serve_logs() {
                let text = std::fs::read_to_string(&log).unwrap_or_default();
                let lines: Vec<&str> = text.lines().collect();
                let tail = &lines[lines.len().saturating_sub(60)..];
                eprintln!(
                    "--- last {} lines of {}:\n{}",
                    tail.len(),
                    log.display(),
                    tail.join("\n")
                );
            }
        }
        for server in &mut self.servers {
            if let Some(mut child) = server.take() {
                // A stopped (SIGSTOP) coordinator must be continued to die cleanly.
                let _ = Command::new("kill")
                    .args(["-CONT", &child.id().to_string()])
                    .status();
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}

impl Fleet {
    /// Boots `n` hosts (none for a cluster-only run), installs hostd and the test gateway
    /// (short limits), runs
    /// `occ init` and `occ serve`, enrols every host and creates the Namespace [`NS`]
    /// with all of them as its pool, and waits until it is ready everywhere.
    pub fn start(n: usize) -> Fleet {
        Self::start_with(FleetOptions {
            hosts: n,
            ..FleetOptions::default()
        })
    }

    /// [`Fleet::start`] with more than the host count to choose: several coordinators, a
    /// PostgreSQL database, more occ.toml.
    pub fn start_with(options: FleetOptions) -> Fleet {
        let n = options.hosts;
        let t = Instant::now();
        let occ_bin = PathBuf::from(env!("CARGO_BIN_EXE_occ"));
        let (hostd, hosts) = if n == 0 {
            (PathBuf::new(), TestHosts::none())
        } else {
            (
                build_binary("clawfleet-hostd", "hostd"),
                clawfleet_vm_tests::HarnessConfig::from_env()
                    .and_then(|config| {
                        TestHosts::start_with_options(
                            &config,
                            n,
                            &clawfleet_vm_tests::HostOptions {
                                btrfs_state_root: options.btrfs_state_roots,
                                openclaw: options.openclaw,
                                ..clawfleet_vm_tests::HostOptions::default()
                            },
                        )
                    })
                    .expect("cannot start the test hosts"),
            )
        };
        eprintln!("{n} hosts up in {:.1} s", hosts.started_in().as_secs_f64());
        std::thread::scope(|s| {
            for h in hosts.iter() {
                let hostd = &hostd;
                s.spawn(move || {
                    // Forwarding off, as on a STIG host: nothing the coordinator does
                    // through a host (operations, gateway streams) may need it.
                    h.forbid_forwarding()
                        .expect("cannot turn sshd's forwarding off");
                    h.install_hostd(hostd).expect("cannot install hostd");
                    // The gateway's launch words, and how long its readiness may take.
                    let (command, limits) = if options.openclaw {
                        let paths = h.install_openclaw().expect("cannot install OpenClaw");
                        let words = [
                            paths.node.as_str(),
                            paths.openclaw_mjs.as_str(),
                            "gateway",
                            "run",
                        ];
                        let command = words.map(|w| format!("\"{w}\"")).join(", ");
                        (
                            command,
                            "readiness_timeout_ms = 120000\nunit_stop_timeout_ms = 60000",
                        )
                    } else {
                        let gateway = h
                            .install_test_gateway()
                            .expect("cannot install the test gateway");
                        (format!("\"{gateway}\""), "readiness_timeout_ms = 30000")
                    };
                    let toml = format!(
                        "host_name = \"{}\"\ngateway_command = [{command}]\n\
                         [limits]\n{limits}\nlock_timeout_ms = 5000\n",
                        h.name()
                    );
                    h.write_file("/etc/clawfleet/hostd.toml", toml.as_bytes(), 0o644)
                        .expect("cannot write hostd.toml");
                });
            }
        });
        let dir = tempfile::Builder::new()
            .prefix("occ-e2e-")
            .tempdir()
            .expect("no temporary directory");
        let ports: Vec<u16> = (0..options.coordinators.max(1))
            .map(|_| free_port())
            .collect();
        let mut database = String::new();
        if let Some(url) = &options.database {
            database = format!("database = \"{url}\"\n");
        }
        let mut postgres = String::new();
        if let Some(file) = &options.password_file {
            postgres = format!("[postgres]\npassword_file = \"{}\"\n", file.display());
        }
        let configs: Vec<PathBuf> = ports
            .iter()
            .enumerate()
            .map(|(i, port)| {
                let config = dir.path().join(if i == 0 {
                    "occ.toml".to_owned()
                } else {
                    format!("occ-{i}.toml")
                });
                std::fs::write(
                    &config,
                    format!(
                        "listen = \"127.0.0.1:{port}\"\nstate_dir = \"{}\"\n{database}\
                         [worker]\nlease_seconds = {}\nbackoff_initial_ms = 200\nbackoff_max_ms = 2000\n\
                         poll_ms = 100\nreadiness_recheck_ms = 200\nreadiness_recheck_max_ms = 1000\n\
                         operation_deadline_seconds = 60\n\
                         [ssh]\nconnect_timeout_seconds = 5\n{postgres}{}",
                        dir.path().join("state").display(),
                        options.lease_seconds,
                        options.extra_toml
                    ),
                )
                .expect("cannot write occ.toml");
                config
            })
            .collect();
        let port = ports[0];
        let clients = |token: Option<String>| -> Vec<Client> {
            ports
                .iter()
                .map(|p| {
                    Client::new(&format!("http://127.0.0.1:{p}"), token.clone())
                        .expect("bad server URL")
                })
                .collect()
        };
        let mut fleet = Fleet {
            servers: ports.iter().map(|_| None).collect(),
            serve_runs: ports.iter().map(|_| 0).collect(),
            port,
            api: Client::new(&format!("http://127.0.0.1:{port}"), None).expect("bad server URL"),
            apis: clients(None),
            ports: ports.clone(),
            occ_bin,
            config: configs[0].clone(),
            configs,
            dir,
            hosts,
        };
        // The operator's copy of the first admin token, outside the state directory; client
        // commands read it through OCC_TOKEN_FILE (see `occ`).
        let token_file = fleet.dir.path().join("operator-admin.token");
        fleet.occ_ok(&["init", "--admin-token-file", token_file.to_str().unwrap()]);
        let token = std::fs::read_to_string(&token_file).expect("occ init wrote no admin token");
        fleet.api = Client::new(
            &format!("http://127.0.0.1:{port}"),
            Some(token.trim().to_owned()),
        )
        .expect("bad server URL");
        fleet.apis = clients(Some(token.trim().to_owned()));
        for i in 0..fleet.ports.len() {
            fleet.start_serve_at(i);
        }
        let enrol = fleet.occ_ok(&["enrol-command"]).trim().to_owned();
        for h in fleet.hosts.iter() {
            h.run_ok(&enrol).expect("hostd enrol failed on the host");
            fleet.occ_ok(&[
                "host",
                "enrol",
                h.name(),
                "--address",
                &h.address().to_string(),
                "--host-key",
                h.host_public_key().trim(),
            ]);
        }
        // With no hosts (a cluster-only run) there is no host-pool Namespace.
        if n > 0 {
            let names = fleet.host_names().join(",");
            fleet.occ_ok(&["namespace", "create", NS, "--hosts", &names]);
            fleet.wait_namespace_ready(Duration::from_secs(60));
        }
        eprintln!(
            "fleet ready ({} hosts enrolled, Namespace {NS} ready) in {:.1} s",
            fleet.hosts.len(),
            t.elapsed().as_secs_f64()
        );
        fleet
    }

    pub fn host_names(&self) -> Vec<String> {
        self.hosts.iter().map(|h| h.name().to_owned()).collect()
    }

    pub fn host(&self, name: &str) -> &TestHost {
        self.hosts
            .iter()
            .find(|h| h.name() == name)
            .unwrap_or_else(|| panic!("no test host named {name}"))
    }

    /// `occ --config <cfg> <args>` with the operator's admin token, not yet started (for a
    /// command that runs beside the test, such as a log follow).
    /// The operator's copy of the first admin token (what `occ init` handed out).
    pub fn admin_token(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("operator-admin.token"))
            .expect("occ init wrote no admin token")
            .trim()
            .to_owned()
    }

    pub fn occ_command(&self, args: &[&str]) -> Command {
        let mut command = Command::new(&self.occ_bin);
        command
            .arg("--config")
            .arg(&self.config)
            .args(args)
            .env("OCC_LOG", "warn")
            .env(
                "OCC_TOKEN_FILE",
                self.dir.path().join("operator-admin.token"),
            )
            .stdin(Stdio::null());
        command
    }

    /// `occ --config <cfg> <args>`.
    pub fn occ(&self, args: &[&str]) -> Output {
        self.occ_command(args)
            .output()
            .unwrap_or_else(|e| panic!("cannot run occ {}: {e}", args.join(" ")))
    }

    /// `occ <args>`; panics (with stderr) unless it succeeds. Returns stdout.
    pub fn occ_ok(&self, args: &[&str]) -> String {
        let out = self.occ(args);
        assert!(
            out.status.success(),
            "occ {} failed ({}): {}{}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// `occ --output json <args>`, parsed.
    pub fn occ_json(&self, args: &[&str]) -> Value {
        let mut all = vec!["--output", "json"];
        all.extend_from_slice(args);
        let text = self.occ_ok(&all);
        serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("occ {} printed no JSON ({e}): {text}", args.join(" ")))
    }

    /// Starts `occ serve` (again) on the same state dir and waits until it answers.
    pub fn start_serve(&mut self) {
        self.start_serve_at(0);
    }

    fn serve_log(&self, i: usize, run: u32) -> PathBuf {
        self.dir.path().join(if i == 0 {
            format!("serve-{run}.log")
        } else {
            format!("serve-{i}-{run}.log")
        })
    }

    fn serve_logs(&self) -> Vec<PathBuf> {
        let mut out = Vec::new();
        for (i, runs) in self.serve_runs.iter().enumerate() {
            for run in 1..=*runs {
                out.push(self.serve_log(i, run));
            }
        }
        out
    }

    /// Starts coordinator `i`'s `occ serve` (again) and waits until it answers.
    pub fn start_serve_at(&mut self, i: usize) {
        self.start_serve_with(i, &[]);
    }

    /// [`Fleet::start_serve_at`] with more environment variables (e.g. a test-only fault hook).
    pub fn start_serve_with(&mut self, i: usize, env: &[(&str, &str)]) {
        assert!(
            self.servers[i].is_none(),
            "occ serve {i} is already running"
        );
        self.serve_runs[i] += 1;
        let log_path = self.serve_log(i, self.serve_runs[i]);
        let log = std::fs::File::create(&log_path).expect("cannot create the serve log");
        let mut child = Command::new(&self.occ_bin)
            .arg("--config")
            .arg(&self.configs[i])
            .arg("serve")
            .env("OCC_LOG", "info,russh=warn")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("cannot share the log file"))
            .stderr(log)
            .spawn()
            .expect("cannot start occ serve");
        let start = Instant::now();
        let health = Client::new(&format!("http://127.0.0.1:{}", self.ports[i]), None)
            .expect("bad server URL");
        loop {
            if let Some(status) = child.try_wait().expect("cannot poll occ serve") {
                panic!(
                    "occ serve {i} exited early ({status}): {}",
                    std::fs::read_to_string(&log_path).unwrap_or_default()
                );
            }
            if health.request("GET", "/healthz", None).is_ok() {
                break;
            }
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "occ serve {i} did not answer /healthz within 20 s"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        self.servers[i] = Some(child);
    }

    /// Lines of every `occ serve` run's log that contain `needle`.
    pub fn serve_log_lines(&self, needle: &str) -> Vec<String> {
        self.serve_logs()
            .into_iter()
            .map(|log| std::fs::read_to_string(log).unwrap_or_default() + "\n")
            .collect::<String>()
            .lines()
            .filter(|l| l.contains(needle))
            .map(str::to_owned)
            .collect()
    }

    /// Lines of coordinator `i`'s current run's log that contain `needle`.
    pub fn serve_log_lines_at(&self, i: usize, needle: &str) -> Vec<String> {
        std::fs::read_to_string(self.serve_log(i, self.serve_runs[i]))
            .unwrap_or_default()
            .lines()
            .filter(|l| l.contains(needle))
            .map(str::to_owned)
            .collect()
    }

    /// The pid of the running `occ serve`.
    pub fn serve_pid(&self) -> u32 {
        self.serve_pid_at(0)
    }

    /// The pid of coordinator `i`'s `occ serve`.
    pub fn serve_pid_at(&self, i: usize) -> u32 {
        self.servers[i]
            .as_ref()
            .unwrap_or_else(|| panic!("occ serve {i} is not running"))
            .id()
    }

    /// Whether coordinator `i` is stopped (SIGSTOP), from `/proc/<pid>/stat`.
    pub fn is_stopped(&self, i: usize) -> bool {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.serve_pid_at(i)))
            .unwrap_or_default();
        // The state follows the command name in parentheses.
        stat.rsplit_once(") ")
            .is_some_and(|(_, rest)| rest.starts_with('T'))
    }

    /// Stops coordinator `i` with SIGTERM (a clean shutdown), then reaps it.
    pub fn stop_serve_at(&mut self, i: usize) -> u32 {
        self.signal_serve(i, "-TERM", Duration::from_secs(15))
    }

    /// Which coordinator runs as `pid`, if any.
    pub fn coordinator_of(&self, pid: u32) -> Option<usize> {
        self.servers
            .iter()
            .position(|s| s.as_ref().is_some_and(|c| c.id() == pid))
    }

    /// `kill -9 <pid>` of the `occ serve` child, then reaps it.
    pub fn kill_serve(&mut self) -> u32 {
        self.kill_serve_at(0)
    }

    /// `kill -9` of coordinator `i`, then reaps it.
    pub fn kill_serve_at(&mut self, i: usize) -> u32 {
        self.signal_serve(i, "-KILL", Duration::from_secs(10))
    }

    /// `kill -TERM <pid>` (graceful stop), then reaps it.
    pub fn stop_serve(&mut self) -> u32 {
        self.signal_serve(0, "-TERM", Duration::from_secs(15))
    }

    /// Sends later CLI and API requests to coordinator `i` (e.g. while coordinator 0 is
    /// stopped).
    pub fn use_coordinator(&mut self, i: usize) {
        self.config = self.configs[i].clone();
        self.api = self.apis[i].clone();
        self.port = self.ports[i];
    }

    /// Sends `signal` (e.g. `-STOP`, `-CONT`) to coordinator `i` without waiting for it.
    pub fn signal_only(&self, i: usize, signal: &str) {
        let pid = self.serve_pid_at(i);
        let status = Command::new("kill")
            .args([signal, &pid.to_string()])
            .status()
            .expect("cannot run kill");
        assert!(status.success(), "kill {signal} {pid} failed");
    }

    fn signal_serve(&mut self, i: usize, signal: &str, within: Duration) -> u32 {
        let mut child = self.servers[i]
            .take()
            .unwrap_or_else(|| panic!("occ serve {i} is not running"));
        let pid = child.id();
        let status = Command::new("kill")
            .args([signal, &pid.to_string()])
            .status()
            .expect("cannot run kill");
        assert!(status.success(), "kill {signal} {pid} failed");
        let start = Instant::now();
        loop {
            if child.try_wait().expect("cannot poll occ serve").is_some() {
                return pid;
            }
            if start.elapsed() > within {
                let _ = child.kill();
                let _ = child.wait();
                panic!("occ serve (pid {pid}) did not exit within {within:?} of {signal}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn wait_namespace_ready(&self, timeout: Duration) {
        let start = Instant::now();
        loop {
            let ns = self
                .api
                .request("GET", &format!("/namespaces/{NS}"), None)
                .expect("cannot read the Namespace");
            if ns["ready"] == json!(true) {
                return;
            }
            assert!(
                start.elapsed() < timeout,
                "Namespace {NS} not ready on every pool host after {timeout:?}: {ns}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn doc_path(&self, agent: &str) -> PathBuf {
        self.dir.path().join(format!("cfg-{agent}.json"))
    }

    /// Creates a Configuration named after the Agent and the Agent using it.
    pub fn create_agent(&self, agent: &str, document: &Value) {
        let path = self.doc_path(agent);
        std::fs::write(&path, document.to_string()).expect("cannot write the document");
        let file = path.display().to_string();
        self.occ_ok(&["configuration", "create", NS, agent, "--file", &file]);
        self.occ_ok(&["agent", "create", NS, agent, "--configuration", agent]);
    }

    /// Adds a generation to the Agent's Configuration.
    pub fn update_configuration(&self, agent: &str, document: &Value) {
        let path = self.doc_path(agent);
        std::fs::write(&path, document.to_string()).expect("cannot write the document");
        let file = path.display().to_string();
        self.occ_ok(&["configuration", "update", NS, agent, "--file", &file]);
    }

    /// `occ agent deploy` (no wait); returns the new revision id.
    pub fn deploy(&self, agent: &str) -> String {
        let rev = self.occ_json(&["agent", "deploy", NS, agent]);
        rev["id"]
            .as_str()
            .unwrap_or_else(|| panic!("deploy of {agent} answered no revision: {rev}"))
            .to_owned()
    }

    /// `POST .../deploy` over the API directly (the bench's timed path).
    pub fn deploy_api(&self, agent: &str) -> String {
        let rev = self
            .api
            .request(
                "POST",
                &format!("/namespaces/{NS}/agents/{agent}/deploy"),
                None,
            )
            .unwrap_or_else(|e| panic!("deploy of {agent} refused: {e}"));
        rev["id"].as_str().expect("no revision id").to_owned()
    }

    pub fn status(&self, agent: &str) -> Result<Value, ClientError> {
        self.api.request(
            "GET",
            &format!("/namespaces/{NS}/agents/{agent}/deployment-status"),
            None,
        )
    }

    /// The API's view of every Agent in [`NS`], by id.
    pub fn api_agents(&self) -> BTreeMap<String, Value> {
        let list = self
            .api
            .request("GET", &format!("/namespaces/{NS}/agents"), None)
            .expect("cannot list Agents");
        list.as_array()
            .expect("the Agent list is not an array")
            .iter()
            .map(|a| (a["id"].as_str().unwrap_or_default().to_owned(), a.clone()))
            .collect()
    }

    /// Waits until every Agent matches its [`Want`] in the coordinator (converged, the
    /// right active and served revision). Returns when each was first seen converged,
    /// measured from `since`. Panics on a failed revision or after `timeout`.
    ///
    /// Every [`CONVERGE_POLL`] one Agent list shows which Agents serve what they should, and
    /// only those are asked for their deployment-status (converged also needs no open work);
    /// every [`FULL_PASS_EVERY`] all open ones are, to catch a failed revision. Seen
    /// converged is then within one list poll of it, for one request per poll.
    pub fn wait_converged(
        &self,
        wants: &[(&str, Want)],
        since: Instant,
        timeout: Duration,
    ) -> BTreeMap<String, Duration> {
        let mut done: BTreeMap<String, Duration> = BTreeMap::new();
        let mut full_pass: Option<Instant> = None;
        loop {
            let full = full_pass.is_none_or(|t| t.elapsed() >= FULL_PASS_EVERY);
            if full {
                full_pass = Some(Instant::now());
            }
            let listed = if full {
                BTreeMap::new()
            } else {
                self.api_agents()
            };
            let mut waiting = 0;
            let mut last: BTreeMap<&str, Value> = BTreeMap::new();
            for (agent, want) in wants {
                if done.contains_key(*agent) {
                    continue;
                }
                if !full && !listed.get(*agent).is_some_and(|a| serves_want(a, want)) {
                    waiting += 1;
                    continue;
                }
                let s = self
                    .status(agent)
                    .unwrap_or_else(|e| panic!("deployment-status of {agent}: {e}"));
                if matches_want(&s, want) {
                    done.insert((*agent).to_owned(), since.elapsed());
                    continue;
                }
                let newest = s["revisions"]
                    .as_array()
                    .and_then(|r| r.last())
                    .cloned()
                    .unwrap_or(Value::Null);
                let idle = s["openWork"].as_array().is_some_and(|w| w.is_empty());
                if newest["status"] == "failed" && idle {
                    panic!(
                        "{agent}: revision {} failed: {} {} (wanted {want:?})",
                        newest["id"],
                        newest["lastAttempt"]["code"],
                        newest["lastAttempt"]["message"]
                    );
                }
                last.insert(agent, s);
            }
            if last.is_empty() && waiting == 0 {
                return done;
            }
            if full && since.elapsed() > timeout {
                let detail: Vec<String> = last
                    .iter()
                    .map(|(a, s)| {
                        let newest = s["revisions"]
                            .as_array()
                            .and_then(|r| r.last())
                            .cloned()
                            .unwrap_or(Value::Null);
                        format!(
                            "  {a}: desired {} active {} served {} converged {} newest {} {} {} {}; open work {}",
                            s["desiredState"],
                            s["activeRevisionId"],
                            s["servedRevisionId"],
                            s["converged"],
                            newest["id"],
                            newest["status"],
                            newest["lastAttempt"]["code"],
                            newest["lastAttempt"]["message"],
                            s["openWork"]
                        )
                    })
                    .collect();
                panic!(
                    "{} of {} Agents not converged after {timeout:?}:\n{}",
                    last.len(),
                    wants.len(),
                    detail.join("\n")
                );
            }
            std::thread::sleep(CONVERGE_POLL);
        }
    }

    /// Waits until the Agents are gone from the coordinator (404).
    pub fn wait_deleted(&self, agents: &[&str], timeout: Duration) {
        let start = Instant::now();
        let mut left: BTreeSet<&str> = agents.iter().copied().collect();
        while !left.is_empty() {
            left.retain(|a| match self.status(a) {
                Err(ClientError::Api { status: 404, .. }) => false,
                Ok(s) => {
                    let idle = s["openWork"].as_array().is_some_and(|w| w.is_empty());
                    assert!(
                        !idle || s["desiredState"] != "deleted",
                        "{a}: deletion has no open work but the Agent remains: {s}"
                    );
                    true
                }
                Err(e) => panic!("deployment-status of {a}: {e}"),
            });
            assert!(
                start.elapsed() < timeout || left.is_empty(),
                "Agents {left:?} not deleted after {timeout:?}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// `hostd status --json` on one host.
    pub fn inventory(&self, host: &TestHost) -> Value {
        let text = host
            .run_ok("hostd status --json")
            .unwrap_or_else(|e| panic!("hostd status on {}: {e}", host.name()));
        serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("hostd status on {} is not JSON ({e}): {text}", host.name()))
    }

    /// Checks that the state on every host equals `model` (and the coordinator agrees):
    /// Namespaces, the set of Agents per host, current/served revision, snapshots, unit
    /// state, port, and the running gateway's `/info` label. `namespace` says whether
    /// [`NS`] should exist on the hosts. Returns the number of Agents per host.
    pub fn check_hosts(&self, model: &Model, namespace: bool) -> BTreeMap<String, usize> {
        let api = if namespace {
            self.api_agents()
        } else {
            BTreeMap::new()
        };
        let api_ids: BTreeSet<&String> = api.keys().collect();
        let model_ids: BTreeSet<&String> = model.keys().collect();
        assert_eq!(
            api_ids, model_ids,
            "the coordinator's Agents differ from the model"
        );
        let mut per_host = BTreeMap::new();
        for host in self.hosts.iter() {
            let inv = self.inventory(host);
            let name = host.name();
            assert_eq!(
                inv["problems"],
                json!([]),
                "{name}: hostd status reports problems"
            );
            let namespaces: Vec<&str> = inv["namespaces"]
                .as_array()
                .expect("no namespaces array")
                .iter()
                .filter_map(|n| n["id"].as_str())
                .collect();
            let wanted_ns: Vec<&str> = if namespace { vec![NS] } else { vec![] };
            assert_eq!(namespaces, wanted_ns, "{name}: Namespaces on the host");
            let on_host: BTreeMap<String, Value> = inv["namespaces"]
                .as_array()
                .unwrap()
                .iter()
                .flat_map(|n| n["agents"].as_array().cloned().unwrap_or_default())
                .map(|a| (a["id"].as_str().unwrap_or_default().to_owned(), a))
                .collect();
            let expected: BTreeSet<&String> = api
                .iter()
                .filter(|(_, a)| a["host"] == name)
                .map(|(id, _)| id)
                .collect();
            let actual: BTreeSet<&String> = on_host.keys().collect();
            assert_eq!(actual, expected, "{name}: the Agents on the host");
            per_host.insert(name.to_owned(), expected.len());
            let mut probes: Vec<(String, u64, String)> = Vec::new();
            for (id, a) in &on_host {
                let want = &model[id];
                let coord = &api[id];
                let o = &a["observation"];
                let revs: Vec<&str> = a["revisions"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .filter_map(|r| r["id"].as_str())
                    .collect();
                let port = o["port"]
                    .as_u64()
                    .unwrap_or_else(|| panic!("{name}/{id}: no port: {a}"));
                assert_eq!(
                    coord["port"].as_u64(),
                    Some(port),
                    "{name}/{id}: the coordinator's port differs from the host's"
                );
                match want {
                    Want::Running { rev, label } => {
                        assert_eq!(o["current"], json!(rev), "{name}/{id}: current ({a})");
                        assert_eq!(o["served"], json!(rev), "{name}/{id}: served ({a})");
                        assert_eq!(
                            o["unit"]["activeState"], "active",
                            "{name}/{id}: unit state ({a})"
                        );
                        assert_eq!(o["unit"]["enabled"], true, "{name}/{id}: enabled ({a})");
                        assert_eq!(
                            revs,
                            vec![rev.as_str()],
                            "{name}/{id}: snapshots on the host (predecessors retired)"
                        );
                        assert_eq!(
                            coord["activeRevisionId"],
                            json!(rev),
                            "{id}: the coordinator's active revision"
                        );
                        assert_eq!(
                            coord["servedRevisionId"],
                            json!(rev),
                            "{id}: the coordinator's served revision"
                        );
                        probes.push((id.clone(), port, label.clone()));
                    }
                    Want::Stopped { rev } => {
                        assert_eq!(o["current"], Value::Null, "{name}/{id}: current ({a})");
                        assert_eq!(o["served"], Value::Null, "{name}/{id}: served ({a})");
                        assert_ne!(
                            o["unit"]["activeState"], "active",
                            "{name}/{id}: unit of a stopped Agent ({a})"
                        );
                        assert_ne!(
                            o["unit"]["enabled"], true,
                            "{name}/{id}: unit of a stopped Agent stays disabled ({a})"
                        );
                        assert!(
                            revs.contains(&rev.as_str()),
                            "{name}/{id}: the stopped revision's snapshot is kept ({a})"
                        );
                        assert_eq!(
                            coord["activeRevisionId"],
                            Value::Null,
                            "{id}: a stopped Agent has no active revision"
                        );
                        probes.push((id.clone(), port, String::new()));
                    }
                }
            }
            if probes.is_empty() {
                continue;
            }
            // One ssh round trip per host: /info of each running gateway, /readyz of
            // each stopped one (which must not answer).
            let script: Vec<String> = probes
                .iter()
                .map(|(_, port, label)| {
                    if label.is_empty() {
                        format!(
                            "curl -s -o /dev/null -w '%{{http_code}}' --max-time 3 http://127.0.0.1:{port}/readyz; echo"
                        )
                    } else {
                        format!("curl -s --max-time 5 http://127.0.0.1:{port}/info; echo")
                    }
                })
                .collect();
            let out = host
                .run(&script.join("; "))
                .unwrap_or_else(|e| panic!("{name}: curl: {e}"));
            let text = String::from_utf8_lossy(&out.stdout).into_owned();
            let lines: Vec<&str> = text.lines().collect();
            assert_eq!(lines.len(), probes.len(), "{name}: curl output: {text}");
            for ((id, port, label), line) in probes.iter().zip(lines) {
                if label.is_empty() {
                    assert_eq!(
                        line, "000",
                        "{name}/{id}: a stopped gateway must not answer on port {port}"
                    );
                    continue;
                }
                let info: Value = serde_json::from_str(line).unwrap_or_else(|e| {
                    panic!("{name}/{id}: /info on port {port} is not JSON ({e}): {line:?}")
                });
                assert_eq!(info["label"], json!(label), "{name}/{id}: served label");
                assert_eq!(info["ready"], true, "{name}/{id}: gateway ready");
                assert_eq!(info["port"].as_u64(), Some(*port), "{name}/{id}: port");
            }
        }
        per_host
    }
}

/// Whether a deployment-status document shows the Agent converged on `want`.
/// How often [`Fleet::wait_converged`] lists the Agents.
const CONVERGE_POLL: Duration = Duration::from_millis(20);
/// How often [`Fleet::wait_converged`] asks every open Agent for its deployment-status.
const FULL_PASS_EVERY: Duration = Duration::from_millis(500);

/// Whether an Agent, as the Agent list shows it, runs (or stopped) as `want` says: worth
/// asking its deployment-status whether it converged.
fn serves_want(agent: &Value, want: &Want) -> bool {
    match want {
        Want::Running { rev, .. } => {
            agent["desiredState"] == "running"
                && agent["activeRevisionId"] == json!(rev)
                && agent["servedRevisionId"] == json!(rev)
        }
        Want::Stopped { .. } => {
            agent["desiredState"] == "stopped" && agent["activeRevisionId"].is_null()
        }
    }
}

pub fn matches_want(s: &Value, want: &Want) -> bool {
    if s["converged"] != json!(true) {
        return false;
    }
    match want {
        Want::Running { rev, .. } => {
            s["desiredState"] == "running"
                && s["activeRevisionId"] == json!(rev)
                && s["servedRevisionId"] == json!(rev)
        }
        Want::Stopped { .. } => s["desiredState"] == "stopped" && s["activeRevisionId"].is_null(),
    }
}

/// The test gateway's configuration with a label (and optional extra switches).
pub fn document(label: &str, extra: Value) -> Value {
    let mut switches = json!({"label": label});
    if let Value::Object(m) = extra {
        for (k, v) in m {
            switches[k] = v;
        }
    }
    json!({"logging": {"level": "info"}, "x-clawfleet-test": switches})
}

/// hostd's step timeline from its success line (`STEPS`: `verify@0.2 pointer-flip@1.0 …`, ms
/// since the operation began) and its total (`ELAPSED_US`): each step with its duration in µs,
/// from its start to the next one's (the last to the end).
#[allow(dead_code)]
pub fn step_durations(steps: &str, total_us: u64) -> Vec<(String, u64)> {
    let marks: Vec<(&str, f64)> = steps
        .split_whitespace()
        .filter_map(|m| {
            let (name, at) = m.split_once('@')?;
            Some((name, at.parse().ok()?))
        })
        .collect();
    marks
        .iter()
        .enumerate()
        .map(|(i, (name, at))| {
            let end = marks
                .get(i + 1)
                .map_or(total_us as f64 / 1000.0, |(_, next)| *next);
            ((*name).to_owned(), ((end - at) * 1000.0).max(0.0) as u64)
        })
        .collect()
}

/// A field of a hostd journal entry (`journalctl -o json`), whatever prefix tracing-journald
/// gave it (`OP` or `F_OP`).
pub fn journal_field<'a>(entry: &'a Value, name: &str) -> Option<&'a str> {
    entry
        .as_object()?
        .iter()
        .find(|(k, _)| *k == name || k.strip_prefix("F_") == Some(name))
        .and_then(|(_, v)| v.as_str())
}

/// Median of durations (the upper one for an even count).
pub fn median(values: &[Duration]) -> Duration {
    let mut v = values.to_vec();
    v.sort();
    v.get(v.len() / 2).copied().unwrap_or_default()
}

/// Replaces the key in a known_hosts file (`<addr> <type> <base64>`) with `public_key`.
pub fn pin_in_known_hosts(path: &Path, address: &str, public_key: &str) {
    let fields: Vec<&str> = public_key.split_whitespace().take(2).collect();
    std::fs::write(path, format!("{address} {}\n", fields.join(" ")))
        .expect("cannot rewrite known_hosts");
}
