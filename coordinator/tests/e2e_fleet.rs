//! End to end on three real test hosts (issue 5's acceptance): hostd installed and enrolled on
//! each, one `occ serve` child process, a Namespace whose pool is the three hosts. The test
//! deploys ten Agents across the pool, replaces half, stops two, deletes two, kills the
//! coordinator with SIGKILL mid-deployment and restarts it, refuses a host whose SSH host key
//! changed, and finally deletes every Agent and then the Namespace. After each phase the state
//! on every host (`hostd status --json` and the test gateway's `/info`) must equal the desired
//! state held by the coordinator.
//!
//! `benches/fleet.rs` includes this file for the [`fleet`] helpers.
#![allow(clippy::unwrap_used, clippy::expect_used)]

/// The fleet under test: real hosts with hostd, `occ init`, `occ serve` as a child process,
/// enrolment, and helpers that drive the CLI/API and check the hosts. Shared with the bench.
#[allow(dead_code)]
pub mod fleet {
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

    /// Three (or n) hosts, the coordinator and its state.
    pub struct Fleet {
        server: Option<Child>,
        serve_runs: u32,
        pub port: u16,
        pub occ_bin: PathBuf,
        pub config: PathBuf,
        pub api: Client,
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
                for run in 1..=self.serve_runs {
                    let log = self.dir.path().join(format!("serve-{run}.log"));
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
            if let Some(mut child) = self.server.take() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }

    impl Fleet {
        /// Boots `n` hosts, installs hostd and the test gateway (short limits), runs
        /// `occ init` and `occ serve`, enrols every host and creates the Namespace [`NS`]
        /// with all of them as its pool, and waits until it is ready everywhere.
        pub fn start(n: usize) -> Fleet {
            let t = Instant::now();
            let hostd = build_binary("clawfleet-hostd", "hostd");
            let occ_bin = PathBuf::from(env!("CARGO_BIN_EXE_occ"));
            let hosts = TestHosts::start(n).expect("cannot start the test hosts");
            eprintln!("{n} hosts up in {:.1} s", hosts.started_in().as_secs_f64());
            std::thread::scope(|s| {
                for h in hosts.iter() {
                    let hostd = &hostd;
                    s.spawn(move || {
                        h.install_hostd(hostd).expect("cannot install hostd");
                        let gateway = h
                            .install_test_gateway()
                            .expect("cannot install the test gateway");
                        let toml = format!(
                            "host_name = \"{}\"\ngateway_command = [\"{gateway}\"]\n\
                             [limits]\nreadiness_timeout_ms = 30000\nlock_timeout_ms = 5000\n",
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
            let port = free_port();
            let config = dir.path().join("occ.toml");
            std::fs::write(
                &config,
                format!(
                    "listen = \"127.0.0.1:{port}\"\nstate_dir = \"{}\"\n\
                     [worker]\nlease_seconds = 3\nbackoff_initial_ms = 200\nbackoff_max_ms = 2000\n\
                     poll_ms = 100\nreadiness_recheck_ms = 200\nreadiness_recheck_max_ms = 1000\n\
                     [ssh]\nconnect_timeout_seconds = 5\n",
                    dir.path().join("state").display()
                ),
            )
            .expect("cannot write occ.toml");
            let mut fleet = Fleet {
                server: None,
                serve_runs: 0,
                port,
                api: Client::new(&format!("http://127.0.0.1:{port}"), None)
                    .expect("bad server URL"),
                occ_bin,
                config,
                dir,
                hosts,
            };
            fleet.occ_ok(&["init"]);
            let token = std::fs::read_to_string(fleet.dir.path().join("state/admin.token"))
                .expect("occ init wrote no admin token");
            fleet.api = Client::new(
                &format!("http://127.0.0.1:{port}"),
                Some(token.trim().to_owned()),
            )
            .expect("bad server URL");
            fleet.start_serve();
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
            let names = fleet.host_names().join(",");
            fleet.occ_ok(&["namespace", "create", NS, "--hosts", &names]);
            fleet.wait_namespace_ready(Duration::from_secs(60));
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

        /// `occ --config <cfg> <args>`.
        pub fn occ(&self, args: &[&str]) -> Output {
            Command::new(&self.occ_bin)
                .arg("--config")
                .arg(&self.config)
                .args(args)
                .env("OCC_LOG", "warn")
                .stdin(Stdio::null())
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
            assert!(self.server.is_none(), "occ serve is already running");
            self.serve_runs += 1;
            let log_path = self
                .dir
                .path()
                .join(format!("serve-{}.log", self.serve_runs));
            let log = std::fs::File::create(&log_path).expect("cannot create the serve log");
            let mut child = Command::new(&self.occ_bin)
                .arg("--config")
                .arg(&self.config)
                .arg("serve")
                .env("OCC_LOG", "info,russh=warn")
                .stdin(Stdio::null())
                .stdout(log.try_clone().expect("cannot share the log file"))
                .stderr(log)
                .spawn()
                .expect("cannot start occ serve");
            let start = Instant::now();
            loop {
                if let Some(status) = child.try_wait().expect("cannot poll occ serve") {
                    panic!(
                        "occ serve exited early ({status}): {}",
                        std::fs::read_to_string(&log_path).unwrap_or_default()
                    );
                }
                if self.api.request("GET", "/healthz", None).is_ok() {
                    break;
                }
                assert!(
                    start.elapsed() < Duration::from_secs(20),
                    "occ serve did not answer /healthz within 20 s"
                );
                std::thread::sleep(Duration::from_millis(50));
            }
            self.server = Some(child);
        }

        /// Lines of every `occ serve` run's log that contain `needle`.
        pub fn serve_log_lines(&self, needle: &str) -> Vec<String> {
            (1..=self.serve_runs)
                .map(|run| {
                    let log = self.dir.path().join(format!("serve-{run}.log"));
                    std::fs::read_to_string(log).unwrap_or_default() + "\n"
                })
                .collect::<String>()
                .lines()
                .filter(|l| l.contains(needle))
                .map(str::to_owned)
                .collect()
        }

        /// The pid of the running `occ serve`.
        pub fn serve_pid(&self) -> u32 {
            self.server.as_ref().expect("occ serve is not running").id()
        }

        /// `kill -9 <pid>` of the `occ serve` child, then reaps it.
        pub fn kill_serve(&mut self) -> u32 {
            self.signal_serve("-KILL", Duration::from_secs(10))
        }

        /// `kill -TERM <pid>` (graceful stop), then reaps it.
        pub fn stop_serve(&mut self) -> u32 {
            self.signal_serve("-TERM", Duration::from_secs(15))
        }

        fn signal_serve(&mut self, signal: &str, within: Duration) -> u32 {
            let mut child = self.server.take().expect("occ serve is not running");
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
        pub fn wait_converged(
            &self,
            wants: &[(&str, Want)],
            since: Instant,
            timeout: Duration,
        ) -> BTreeMap<String, Duration> {
            let mut done: BTreeMap<String, Duration> = BTreeMap::new();
            loop {
                let mut last: BTreeMap<&str, Value> = BTreeMap::new();
                for (agent, want) in wants {
                    if done.contains_key(*agent) {
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
                if last.is_empty() {
                    return done;
                }
                if since.elapsed() > timeout {
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
                std::thread::sleep(Duration::from_millis(100));
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
            serde_json::from_str(&text).unwrap_or_else(|e| {
                panic!("hostd status on {} is not JSON ({e}): {text}", host.name())
            })
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
            Want::Stopped { .. } => {
                s["desiredState"] == "stopped" && s["activeRevisionId"].is_null()
            }
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
}

#[test]
fn fleet_end_to_end_on_three_hosts() {
    use std::collections::BTreeMap;
    use std::time::{Duration, Instant};

    use coordinator::client::ClientError;
    use fleet::{Fleet, Model, NS, Want, document, phase_done, pin_in_known_hosts};
    use serde_json::json;

    clawfleet_vm_tests::skip_unless_hosts!();
    let total = Instant::now();
    let converge = Duration::from_secs(180);

    let t = Instant::now();
    let mut fleet = Fleet::start(3);
    phase_done(
        "setup (build hostd, 3 hosts, hostd + gateway, occ init/serve, enrol)",
        t,
    );

    // 1. Ten Agents across the pool.
    let t = Instant::now();
    let agents: Vec<String> = (0..10).map(|i| format!("a{i:02}")).collect();
    let mut model = Model::new();
    for a in &agents {
        fleet.create_agent(a, &document(&format!("{a}-v1"), json!({})));
    }
    let t_deploy = Instant::now();
    let mut wants = Vec::new();
    for a in &agents {
        let rev = fleet.deploy(a);
        assert_eq!(rev, "rev-1", "{a}: first revision");
        let want = Want::Running {
            rev,
            label: format!("{a}-v1"),
        };
        model.insert(a.clone(), want.clone());
        wants.push((a.as_str(), want));
    }
    let times = fleet.wait_converged(&wants, t_deploy, converge);
    eprintln!(
        "10 Agents converged in {:.1} s (slowest)",
        times
            .values()
            .max()
            .copied()
            .unwrap_or_default()
            .as_secs_f64()
    );
    let per_host = fleet.check_hosts(&model, true);
    eprintln!("placement: {per_host:?}");
    assert_eq!(
        per_host.len(),
        3,
        "placement covers every host: {per_host:?}"
    );
    assert!(
        per_host.values().all(|n| *n >= 1),
        "Agents are spread over all three hosts: {per_host:?}"
    );
    assert_eq!(per_host.values().sum::<usize>(), 10);
    phase_done("1: deploy 10 Agents", t);

    // 2. Replace half: a new Configuration generation (label v2) and a deploy.
    let t = Instant::now();
    let mut wants = Vec::new();
    for a in &agents[..5] {
        fleet.update_configuration(a, &document(&format!("{a}-v2"), json!({})));
        let rev = fleet.deploy(a);
        assert_eq!(rev, "rev-2", "{a}: second revision");
        let want = Want::Running {
            rev,
            label: format!("{a}-v2"),
        };
        model.insert(a.clone(), want.clone());
        wants.push((a.as_str(), want));
    }
    fleet.wait_converged(&wants, t, converge);
    fleet.check_hosts(&model, true);
    for a in &agents[..5] {
        let revs = fleet.occ_json(&["agent", "revisions", NS, a]);
        let statuses: Vec<(&str, &str)> = revs
            .as_array()
            .unwrap()
            .iter()
            .map(|r| (r["id"].as_str().unwrap(), r["status"].as_str().unwrap()))
            .collect();
        assert_eq!(
            statuses,
            vec![("rev-1", "retired"), ("rev-2", "active")],
            "{a}: revision statuses after the replacement"
        );
    }
    phase_done("2: replace 5 Agents (v2)", t);

    // 3. Stop two.
    let t = Instant::now();
    let mut wants = Vec::new();
    for a in &agents[5..7] {
        let out = fleet.occ_ok(&["agent", "stop", NS, a]);
        assert!(out.contains("stopped"), "occ agent stop: {out}");
        let want = Want::Stopped {
            rev: "rev-1".to_owned(),
        };
        model.insert(a.clone(), want.clone());
        wants.push((a.as_str(), want));
    }
    fleet.wait_converged(&wants, t, converge);
    fleet.check_hosts(&model, true);
    phase_done("3: stop 2 Agents", t);

    // 4. Delete two (one running v1, one running v1 on whatever host).
    let t = Instant::now();
    for a in &agents[7..9] {
        fleet.occ_ok(&["agent", "delete", NS, a]);
        model.remove(a);
    }
    let deleted: Vec<&str> = agents[7..9].iter().map(String::as_str).collect();
    fleet.wait_deleted(&deleted, converge);
    fleet.check_hosts(&model, true);
    for h in fleet.hosts.iter() {
        // No unit or account of a deleted Agent is left behind.
        let units = h
            .run_ok("ls /etc/systemd/system | grep -c '^clawfleet-agent-' || true")
            .unwrap();
        let accounts = h.run_ok("grep -c '^cfa-' /etc/passwd || true").unwrap();
        let n = fleet.inventory(h)["namespaces"][0]["agents"]
            .as_array()
            .map_or(0, Vec::len);
        assert_eq!(units.trim(), n.to_string(), "{}: unit files", h.name());
        assert_eq!(accounts.trim(), n.to_string(), "{}: accounts", h.name());
    }
    phase_done("4: delete 2 Agents", t);

    // 5. kill -9 the coordinator mid-deployment, restart it on the same state dir.
    let t = Instant::now();
    let crash: Vec<String> = (0..6).map(|i| format!("c{i:02}")).collect();
    for (i, a) in crash.iter().enumerate() {
        // All but the first take 3 s to become ready, so they are in flight at the kill.
        let delay = if i == 0 { 0 } else { 3000 };
        fleet.create_agent(
            a,
            &document(&format!("{a}-v1"), json!({"readyAfterMs": delay})),
        );
    }
    let mut wants = Vec::new();
    for a in &crash {
        let rev = fleet.deploy(a);
        let want = Want::Running {
            rev,
            label: format!("{a}-v1"),
        };
        model.insert(a.clone(), want.clone());
        wants.push((a.as_str(), want));
    }
    let first = Instant::now();
    let converged_at_kill = loop {
        let converged: Vec<&str> = wants
            .iter()
            .filter(|(a, w)| fleet.status(a).is_ok_and(|s| fleet::matches_want(&s, w)))
            .map(|(a, _)| *a)
            .collect();
        if !converged.is_empty() {
            break converged;
        }
        assert!(
            first.elapsed() < Duration::from_secs(120),
            "no crash-phase Agent converged within 120 s"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    let pid = fleet.kill_serve();
    eprintln!(
        "kill -9 occ serve (pid {pid}) {:.1} s after the deploys, with {converged_at_kill:?} converged",
        first.elapsed().as_secs_f64()
    );
    assert!(
        converged_at_kill.len() < crash.len(),
        "work must be in flight at the kill (all converged already)"
    );
    let restart = Instant::now();
    fleet.start_serve();
    let times = fleet.wait_converged(&wants, restart, converge);
    eprintln!(
        "after the restart (pid {}), all {} converged in {:.1} s",
        fleet.serve_pid(),
        crash.len(),
        times
            .values()
            .max()
            .copied()
            .unwrap_or_default()
            .as_secs_f64()
    );
    fleet.check_hosts(&model, true);
    phase_done("5: kill -9 mid-deployment and restart", t);

    // 6. A changed host key is refused, and nothing changes on that host.
    let t = Instant::now();
    let api = fleet.api_agents();
    let host_of = |a: &str| api[a]["host"].as_str().unwrap().to_owned();
    let victim_agent = "a00";
    let x = host_of(victim_agent);
    let other_agent = agents[..5]
        .iter()
        .find(|a| host_of(a) != x)
        .cloned()
        .or_else(|| {
            ["a09", "c00", "c01", "c02", "c03", "c04", "c05"]
                .iter()
                .find(|a| host_of(a) != x)
                .map(|a| (*a).to_owned())
        })
        .expect("an Agent on another host");
    let before = fleet.inventory(fleet.host(&x));
    // The coordinator keeps one connection per host open; stop it so that the next call
    // makes a new connection and sees the new key.
    fleet.stop_serve();
    let new_key = fleet
        .host(&x)
        .run_ok(
            "set -e; mkdir -p /root/cf-old-hostkey; \
             cp -a /etc/ssh/ssh_host_ed25519_key /etc/ssh/ssh_host_ed25519_key.pub /root/cf-old-hostkey/; \
             rm -f /etc/ssh/ssh_host_ed25519_key /etc/ssh/ssh_host_ed25519_key.pub; \
             ssh-keygen -q -t ed25519 -N '' -C rekeyed -f /etc/ssh/ssh_host_ed25519_key; \
             systemctl restart ssh; cat /etc/ssh/ssh_host_ed25519_key.pub",
        )
        .expect("cannot re-key the host's sshd");
    let address = fleet.host(&x).address().to_string();
    pin_in_known_hosts(fleet.host(&x).known_hosts_path(), &address, &new_key);
    fleet.start_serve();
    // (i) probe: 409 HOST_KEY_MISMATCH over the API and through the CLI.
    match fleet
        .api
        .request("POST", &format!("/hosts/{x}/probe"), None)
    {
        Err(ClientError::Api {
            status,
            code,
            message,
        }) => {
            assert_eq!(
                code, "HOST_KEY_MISMATCH",
                "probe of the re-keyed host: {message}"
            );
            assert!(status == 409 || status == 502, "HTTP status {status}");
            eprintln!("probe {x}: HTTP {status} {code}: {message}");
        }
        other => panic!("probe of the re-keyed host {x} must be refused, got {other:?}"),
    }
    let out = fleet.occ(&["--output", "json", "host", "probe", &x]);
    assert!(!out.status.success(), "occ host probe {x} must fail");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("HOST_KEY_MISMATCH"),
        "occ host probe {x}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // (ii) a deploy to an Agent on that host fails permanently with HOST_KEY_MISMATCH ...
    fleet.update_configuration(
        victim_agent,
        &document(&format!("{victim_agent}-v3"), json!({})),
    );
    let failed_rev = fleet.deploy(victim_agent);
    // ... while an Agent on another host still deploys.
    fleet.update_configuration(
        &other_agent,
        &document(&format!("{other_agent}-v3"), json!({})),
    );
    let other_rev = fleet.deploy(&other_agent);
    let start = Instant::now();
    let last_attempt = loop {
        let s = fleet.occ_json(&["agent", "status", NS, victim_agent]);
        let rev = s["revisions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["id"] == json!(failed_rev))
            .cloned()
            .expect("the new revision is listed");
        let idle = s["openWork"].as_array().is_some_and(|w| w.is_empty());
        if rev["status"] == "failed" && idle {
            assert_eq!(
                s["activeRevisionId"], "rev-2",
                "the active revision is unchanged"
            );
            assert_eq!(
                s["servedRevisionId"], "rev-2",
                "the served revision is unchanged"
            );
            break rev["lastAttempt"].clone();
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "the deploy to the re-keyed host did not fail within 60 s: {s}"
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    eprintln!("{victim_agent} {failed_rev} on {x}: lastAttempt {last_attempt}");
    assert_eq!(
        last_attempt["code"], "HOST_KEY_MISMATCH",
        "lastAttempt: {last_attempt}"
    );
    let other_want = Want::Running {
        rev: other_rev,
        label: format!("{other_agent}-v3"),
    };
    fleet.wait_converged(&[(other_agent.as_str(), other_want.clone())], t, converge);
    model.insert(other_agent.clone(), other_want);
    // Nothing changed on the re-keyed host: the same inventory, a00 still serves v2.
    let after = fleet.inventory(fleet.host(&x));
    assert_eq!(
        after, before,
        "hostd status on the re-keyed host {x} changed"
    );
    fleet.check_hosts(&model, true);
    // The operator re-pins the host's new key (PUT /hosts/{host}, `occ host enrol --replace`):
    // the coordinator talks to the host again, with the new key pinned.
    let current = fleet
        .api
        .request("GET", &format!("/hosts/{x}"), None)
        .expect("cannot read the host record");
    let repinned = fleet
        .api
        .request(
            "PUT",
            &format!("/hosts/{x}"),
            Some(&serde_json::json!({
                "address": address,
                "port": current["port"],
                "maxAgents": current["maxAgents"],
                "hostKey": new_key.trim(),
            })),
        )
        .expect("cannot re-pin the host key");
    assert_ne!(
        repinned["fingerprint"], current["fingerprint"],
        "re-pinning must change the pinned fingerprint"
    );
    let start = Instant::now();
    loop {
        match fleet
            .api
            .request("POST", &format!("/hosts/{x}/probe"), None)
        {
            Ok(_) => break,
            Err(e) => assert!(
                start.elapsed() < Duration::from_secs(30),
                "probe of {x} after re-pinning its key still fails: {e}"
            ),
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    // And a new deploy to the Agent on that host converges.
    let rev = fleet.deploy(victim_agent);
    let want = Want::Running {
        rev,
        label: format!("{victim_agent}-v3"),
    };
    fleet.wait_converged(&[(victim_agent, want.clone())], Instant::now(), converge);
    model.insert(victim_agent.to_owned(), want);
    fleet.check_hosts(&model, true);
    phase_done("6: changed host key refused, nothing changed, re-pinned", t);

    // 7. Delete everything: the Namespace first (409 while it has Agents), then every Agent,
    // then the Namespace.
    let t = Instant::now();
    match fleet
        .api
        .request("DELETE", &format!("/namespaces/{NS}"), None)
    {
        Err(ClientError::Api { status, code, .. }) => {
            assert_eq!(status, 409, "DELETE of a non-empty Namespace");
            assert_eq!(code, "NAMESPACE_NOT_EMPTY");
        }
        other => panic!("DELETE of a non-empty Namespace must answer 409, got {other:?}"),
    }
    let out = fleet.occ(&["namespace", "delete", NS]);
    assert!(
        !out.status.success(),
        "occ namespace delete of a non-empty Namespace"
    );
    let all: Vec<String> = model.keys().cloned().collect();
    for a in &all {
        fleet.occ_ok(&["agent", "delete", NS, a]);
    }
    let refs: Vec<&str> = all.iter().map(String::as_str).collect();
    fleet.wait_deleted(&refs, converge);
    model.clear();
    fleet.check_hosts(&model, true);
    let answer = fleet.occ_json(&["namespace", "delete", NS]);
    assert_eq!(answer["deleting"], true, "{answer}");
    let start = Instant::now();
    loop {
        match fleet.api.request("GET", &format!("/namespaces/{NS}"), None) {
            Err(ClientError::Api { status: 404, .. }) => break,
            Ok(ns) => assert!(
                start.elapsed() < converge,
                "Namespace {NS} not deleted after {converge:?}: {ns}"
            ),
            Err(e) => panic!("GET /namespaces/{NS}: {e}"),
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let empty: BTreeMap<String, usize> = fleet.check_hosts(&model, false);
    assert!(empty.values().all(|n| *n == 0));
    for h in fleet.hosts.iter() {
        let left = h
            .run_ok(
                "ls /etc/systemd/system | grep '^clawfleet-agent-' || true; \
                 grep '^cfa-' /etc/passwd || true",
            )
            .unwrap();
        assert_eq!(
            left.trim(),
            "",
            "{}: units or accounts left behind",
            h.name()
        );
    }
    phase_done("7: delete all Agents, 409, then the Namespace", t);
    let errors = fleet.serve_log_lines("ERROR");
    eprintln!("occ serve logged {} ERROR lines", errors.len());
    for l in errors.iter().take(20) {
        eprintln!("  {l}");
    }
    let panics = fleet.serve_log_lines("panicked");
    assert!(panics.is_empty(), "occ serve panicked: {panics:?}");
    eprintln!(
        "e2e fleet: all phases passed in {:.1} s",
        total.elapsed().as_secs_f64()
    );
}
