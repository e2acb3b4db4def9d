//! Both packages together, as an operator runs them: hostd installed from its .deb on a real
//! test host, the coordinator's `occ` taken from its .deb (run on the runner: test hosts cannot
//! reach each other), enrolment with `occ enrol-command` + `occ host enrol`, an Agent deployed
//! from the coordinator, then hostd upgraded to a rebuilt package and rolled back, with a new
//! revision deployed from the coordinator after each step while the Agent keeps serving.
//!
//! Needs root (test hosts) and `packaging/build.sh` output; otherwise prints `SKIP: ...`
//! (fails under `CI=true`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod packages_support;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use clawfleet_vm_tests::{TestHost, skip_unless_hosts};
use packages_support::*;
use serde_json::{Value, json};

const NS: &str = "pkgfleet";
const AGENT: &str = "agent-1";

/// `occ` from the coordinator package, with its own configuration and state on the runner,
/// and its `occ serve` child (killed on drop).
#[derive(Debug)]
struct Occ {
    bin: PathBuf,
    config: PathBuf,
    dir: ScratchDir,
    port: u16,
    serve: Option<Child>,
}

impl Occ {
    fn from_deb(deb: &Path) -> Self {
        let dir = ScratchDir::new("pkgtest-fleet");
        let root = dir.0.join("root");
        let (ok, _, err) = run_local(
            "dpkg-deb",
            &["-x", deb.to_str().unwrap(), root.to_str().unwrap()],
        );
        assert!(ok, "dpkg-deb -x: {err}");
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let config = dir.0.join("occ.toml");
        // The shipped occ.toml plus test settings: short waits, a private state dir and port.
        let shipped = std::fs::read_to_string(root.join("etc/clawfleet/occ.toml")).unwrap();
        std::fs::write(
            &config,
            format!(
                "{shipped}\nlisten = \"127.0.0.1:{port}\"\nstate_dir = \"{}\"\n\
                 [worker]\nlease_seconds = 3\nbackoff_initial_ms = 200\nbackoff_max_ms = 2000\n\
                 poll_ms = 100\nreadiness_recheck_ms = 200\nreadiness_recheck_max_ms = 1000\n\
                 [ssh]\nconnect_timeout_seconds = 5\n",
                dir.0.join("state").display()
            ),
        )
        .unwrap();
        Self {
            bin: root.join("usr/bin/occ"),
            config,
            dir,
            port,
            serve: None,
        }
    }

    fn run(&self, args: &[&str]) -> Output {
        Command::new(&self.bin)
            .arg("--config")
            .arg(&self.config)
            .env("OCC_TOKEN_FILE", self.dir.0.join("operator-admin.token"))
            .args(args)
            .output()
            .unwrap()
    }

    fn ok(&self, args: &[&str]) -> String {
        let out = self.run(args);
        assert!(
            out.status.success(),
            "occ {}: {}{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }

    fn json(&self, args: &[&str]) -> Value {
        let mut all = vec!["--output", "json"];
        all.extend_from_slice(args);
        let text = self.ok(&all);
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("occ {args:?}: {e}: {text}"))
    }

    fn healthz(&self) -> bool {
        let Ok(mut s) = TcpStream::connect(("127.0.0.1", self.port)) else {
            return false;
        };
        let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
        let _ = s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
        let mut answer = String::new();
        let _ = s.read_to_string(&mut answer);
        answer.starts_with("HTTP/1.1 200")
    }

    fn start_serve(&mut self) {
        let log = std::fs::File::create(self.dir.0.join("serve.log")).unwrap();
        let child = Command::new(&self.bin)
            .arg("--config")
            .arg(&self.config)
            .arg("serve")
            .env("OCC_LOG", "info,russh=warn")
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        self.serve = Some(child);
        assert!(
            wait_until(Duration::from_secs(20), || self.healthz()),
            "occ serve did not answer /healthz: {}",
            self.log()
        );
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.0.join("serve.log")).unwrap_or_default()
    }

    /// Writes a new Configuration generation (the test gateway's label = `label`), deploys it
    /// and waits until the coordinator reports it converged and served. Returns the revision.
    fn deploy(&self, label: &str, first: bool) -> String {
        let doc = self.dir.0.join(format!("{label}.json"));
        std::fs::write(
            &doc,
            json!({"logging": {"level": "info"}, "x-clawfleet-test": {"label": label}}).to_string(),
        )
        .unwrap();
        let file = doc.to_str().unwrap();
        if first {
            self.ok(&["configuration", "create", NS, AGENT, "--file", file]);
            self.ok(&["agent", "create", NS, AGENT, "--configuration", AGENT]);
        } else {
            self.ok(&["configuration", "update", NS, AGENT, "--file", file]);
        }
        let rev = self.json(&["agent", "deploy", NS, AGENT])["id"]
            .as_str()
            .unwrap()
            .to_owned();
        let mut last = Value::Null;
        let converged = wait_until(Duration::from_secs(90), || {
            last = self.json(&["agent", "status", NS, AGENT]);
            last["converged"] == json!(true) && last["servedRevisionId"] == json!(rev)
        });
        assert!(converged, "{rev} not served: {last:#}\n{}", self.log());
        rev
    }
}

impl Drop for Occ {
    fn drop(&mut self) {
        if let Some(mut c) = self.serve.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// The label the test gateway serves, from its `/info`, via the port hostd reports.
fn served_label(host: &TestHost) -> (String, u16) {
    let o = observation(host, NS, AGENT);
    let port = o["port"].as_u64().unwrap() as u16;
    let (code, info) = curl(host, &format!("http://127.0.0.1:{port}/info"));
    assert_eq!(code, 200, "{info}");
    let info: Value = serde_json::from_str(&info).unwrap();
    (info["label"].as_str().unwrap().to_owned(), port)
}

#[test]
fn agents_deployed_by_the_packaged_coordinator_survive_hostd_upgrade_and_rollback() {
    skip_unless_hosts!();
    let Some(pkgs) = packages_or_skip() else {
        return;
    };
    let Some(next_deb) = pkgs.hostd_deb_next.clone() else {
        missing("no rebuilt hostd .deb in target/packages/test (packaging/build.sh makes it)");
        return;
    };
    let t0 = Instant::now();
    let mut occ = Occ::from_deb(&pkgs.coordinator_deb);
    let host = TestHost::start().unwrap();
    install_hostd_deb(&host, &pkgs.hostd_deb).unwrap();
    let gateway = host.install_test_gateway().unwrap();
    host.write_file(
        "/etc/clawfleet/hostd.toml",
        format!(
            "host_name = \"{}\"\ngateway_command = [\"{gateway}\"]\n\
             [limits]\nreadiness_timeout_ms = 30000\nlock_timeout_ms = 5000\n",
            host.name()
        )
        .as_bytes(),
        0o644,
    )
    .unwrap();

    // The operator's steps: init, serve, print the enrol command, run it on the host, pin.
    let token_file = occ.dir.0.join("operator-admin.token");
    occ.ok(&["init", "--admin-token-file", token_file.to_str().unwrap()]);
    occ.start_serve();
    let enrol = occ.ok(&["enrol-command"]).trim().to_owned();
    assert!(enrol.starts_with("hostd enrol "), "{enrol}");
    let enrolled = host.run_ok(&enrol).unwrap();
    assert!(enrolled.contains(host.host_key_fingerprint()), "{enrolled}");
    occ.ok(&[
        "host",
        "enrol",
        host.name(),
        "--address",
        &host.address().to_string(),
        "--host-key",
        host.host_public_key().trim(),
    ]);
    occ.ok(&["namespace", "create", NS, "--hosts", host.name()]);
    let mut ns = Value::Null;
    assert!(
        wait_until(Duration::from_secs(60), || {
            ns = occ.json(&["namespace", "get", NS]);
            ns["ready"] == json!(true)
        }),
        "Namespace not ready: {ns:#}\n{}",
        occ.log()
    );

    let t = Instant::now();
    let rev1 = occ.deploy("v1", true);
    eprintln!("first deploy from the coordinator: {:?}", t.elapsed());
    let (label, port) = served_label(&host);
    assert_eq!(label, "v1");

    // hostd upgrade and rollback under a serving Agent; the coordinator deploys after each.
    let watcher = Watcher::start(&host, "fleet", &format!("http://127.0.0.1:{port}/readyz"));
    host.install_deb(&next_deb).unwrap();
    let served = occ.json(&["agent", "status", NS, AGENT]);
    assert_eq!(served["servedRevisionId"], json!(rev1), "{served:#}");
    let rev2 = occ.deploy("v2", false);
    assert_eq!(served_label(&host), ("v2".to_owned(), port));
    host.install_deb(&pkgs.hostd_deb).unwrap();
    let rev3 = occ.deploy("v3", false);
    assert_eq!(served_label(&host), ("v3".to_owned(), port));
    let codes = watcher.stop(&host);
    // A revision cutover restarts the gateway, so a few misses are expected there; what must
    // hold is that the Agent answers again after each step and at the end.
    assert_eq!(codes.last().map(String::as_str), Some("ok"), "{codes:?}");
    let o = observation(&host, NS, AGENT);
    assert_eq!(o["served"], json!(rev3), "{o:#}");
    eprintln!(
        "revisions {rev1} -> {rev2} (hostd upgraded) -> {rev3} (hostd rolled back); {} readyz probes, {} misses during two cutovers; total {:?}",
        codes.len(),
        codes.iter().filter(|c| *c != "ok").count(),
        t0.elapsed()
    );
}
