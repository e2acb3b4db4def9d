//! Shared pieces of the package tests (`packages_*.rs`): where `packaging/build.sh` put the
//! packages, installing hostd from its .deb on a test host, and a coordinator stand-in made
//! only of stock tools (`ssh-keygen` keys, envelopes signed with `ssh-keygen -Y sign -n
//! clawfleet-operation`, the forced command reached with stock `ssh`), so these tests depend on
//! nothing but the harness and std.
//!
//! The hostd install helpers are in `install.rs` (std and the harness only), so other crates'
//! real-host tests can include that file alone.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use clawfleet_vm_tests::TestHost;

mod install;
pub use install::*;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

/// The SSHSIG namespace of clawfleet operations.
pub const SIGNATURE_NAMESPACE: &str = "clawfleet-operation";
/// The issuer principal the test coordinator signs as.
pub const PRINCIPAL: &str = "occ@packages-test";

/// The packages `packaging/build.sh` built.
#[derive(Debug, Clone)]
pub struct Packages {
    pub dir: PathBuf,
    pub hostd_deb: PathBuf,
    pub coordinator_deb: PathBuf,
    pub hostd_rpm: PathBuf,
    pub coordinator_rpm: PathBuf,
    /// The same packages with a higher version, for upgrade/downgrade tests.
    pub hostd_deb_next: Option<PathBuf>,
    pub coordinator_deb_next: Option<PathBuf>,
    pub hostd_rpm_next: Option<PathBuf>,
    pub coordinator_rpm_next: Option<PathBuf>,
}

/// The built packages, or `None` after [`missing`] when `packaging/build.sh` has not run.
pub fn packages_or_skip() -> Option<Packages> {
    let dir = packages_dir();
    let want = [
        ("clawfleet-hostd_", ".deb"),
        ("clawfleet-coordinator_", ".deb"),
        ("clawfleet-hostd-", ".rpm"),
        ("clawfleet-coordinator-", ".rpm"),
    ];
    let found: Vec<Option<PathBuf>> = want.iter().map(|(p, s)| find_one(&dir, p, s)).collect();
    if found.iter().any(Option::is_none) {
        missing(&format!(
            "the packages are not built in {} (run packaging/build.sh; .ci/run does)",
            dir.display()
        ));
        return None;
    }
    let mut found = found.into_iter().map(Option::unwrap);
    let test_dir = dir.join("test");
    Some(Packages {
        hostd_deb: found.next().unwrap(),
        coordinator_deb: found.next().unwrap(),
        hostd_rpm: found.next().unwrap(),
        coordinator_rpm: found.next().unwrap(),
        hostd_deb_next: find_one(&test_dir, "clawfleet-hostd_", ".deb"),
        coordinator_deb_next: find_one(&test_dir, "clawfleet-coordinator_", ".deb"),
        hostd_rpm_next: find_one(&test_dir, "clawfleet-hostd-", ".rpm"),
        coordinator_rpm_next: find_one(&test_dir, "clawfleet-coordinator-", ".rpm"),
        dir,
    })
}

/// `Field` of a .deb's control file, read on the runner.
pub fn deb_field(deb: &Path, field: &str) -> String {
    let out = Command::new("dpkg-deb")
        .arg("-f")
        .arg(deb)
        .arg(field)
        .output()
        .unwrap();
    assert!(out.status.success(), "dpkg-deb -f {}", deb.display());
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

/// Runs a command on the runner; returns (success, stdout, stderr).
pub fn run_local(program: &str, args: &[&str]) -> (bool, String, String) {
    let out = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {program}: {e}"));
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

pub fn have_tool(program: &str) -> bool {
    Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {program} >/dev/null"))
        .status()
        .is_ok_and(|s| s.success())
}

/// A scratch directory removed on drop.
#[derive(Debug)]
pub struct ScratchDir(pub PathBuf);

impl ScratchDir {
    pub fn new(tag: &str) -> Self {
        static N: AtomicU32 = AtomicU32::new(0);
        let p = std::env::temp_dir().join(format!(
            "clawfleet-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::SeqCst)
        ));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        Self(p)
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

pub fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// `clawfleet-agent-<32 hex>.service` and `cfa-<24 hex>` for an Agent, as hostd's `layout.rs` names them.
pub fn agent_names(namespace: &str, agent: &str) -> (String, String) {
    let h = sha256_hex(format!("{namespace}:{agent}").as_bytes());
    (
        format!("clawfleet-agent-{}.service", &h[..32]),
        format!("cfa-{}", &h[..24]),
    )
}

/// A coordinator made of stock tools: two ed25519 keys from `ssh-keygen` (SSH login and
/// operation signing, as `occ init` makes them) and envelopes signed with `ssh-keygen -Y sign`.
#[derive(Debug)]
pub struct StockCoordinator {
    pub dir: ScratchDir,
    pub login_key: PathBuf,
    pub signing_key: PathBuf,
    counter: AtomicU32,
}

impl StockCoordinator {
    pub fn new() -> Self {
        let dir = ScratchDir::new("pkgtest-occ");
        let keygen = |name: &str| {
            let path = dir.0.join(name);
            let (ok, _, err) = run_local(
                "ssh-keygen",
                &[
                    "-q",
                    "-t",
                    "ed25519",
                    "-N",
                    "",
                    "-C",
                    PRINCIPAL,
                    "-f",
                    path.to_str().unwrap(),
                ],
            );
            assert!(ok, "ssh-keygen: {err}");
            path
        };
        let login_key = keygen("login_ed25519");
        let signing_key = keygen("signing_ed25519");
        Self {
            dir,
            login_key,
            signing_key,
            counter: AtomicU32::new(0),
        }
    }

    pub fn login_public(&self) -> String {
        std::fs::read_to_string(self.login_key.with_extension("pub")).unwrap()
    }

    pub fn signing_public(&self) -> String {
        std::fs::read_to_string(self.signing_key.with_extension("pub")).unwrap()
    }

    /// `hostd enrol` on the host with this coordinator's public keys; returns its output.
    pub fn enrol(&self, host: &TestHost) -> String {
        host.write_file(
            "/var/tmp/occ-login.pub",
            self.login_public().as_bytes(),
            0o644,
        )
        .unwrap();
        host.write_file(
            "/var/tmp/occ-signing.pub",
            self.signing_public().as_bytes(),
            0o644,
        )
        .unwrap();
        host.run_ok(&format!(
            "hostd enrol --ssh-key /var/tmp/occ-login.pub --signing-key /var/tmp/occ-signing.pub --principal {PRINCIPAL}"
        ))
        .unwrap()
    }

    /// A signed envelope for `operation` addressed to `host`: (file stem, body, signature).
    pub fn envelope(&self, host: &TestHost, operation: Value) -> SignedFile {
        let n = self.counter.fetch_add(1, Ordering::SeqCst) + 1;
        let id = format!("pkgtest-{}-{n}", std::process::id());
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs();
        let envelope = json!({
            "version": 1,
            "operationId": id,
            "target": {"host": host.name(), "hostKey": host.host_key_fingerprint()},
            "issuer": PRINCIPAL,
            "issuedAt": now,
            "expiresAt": now + 600,
            "deadlineSeconds": 120,
            "operation": operation,
        });
        let body = serde_json::to_vec(&envelope).unwrap();
        let path = self.dir.0.join(format!("{id}.json"));
        std::fs::write(&path, &body).unwrap();
        let (ok, _, err) = run_local(
            "ssh-keygen",
            &[
                "-q",
                "-Y",
                "sign",
                "-f",
                self.signing_key.to_str().unwrap(),
                "-n",
                SIGNATURE_NAMESPACE,
                path.to_str().unwrap(),
            ],
        );
        assert!(ok, "ssh-keygen -Y sign: {err}");
        let signature = std::fs::read_to_string(format!("{}.sig", path.display())).unwrap();
        SignedFile {
            id,
            body,
            signature,
        }
    }

    /// `ssh` as the coordinator: its own key, the host's pinned key, the forced command.
    fn ssh(&self, host: &TestHost) -> Command {
        let known = self.dir.0.join(format!("known_hosts-{}", host.name()));
        std::fs::write(
            &known,
            format!("{} {}\n", host.address(), host.host_public_key().trim()),
        )
        .unwrap();
        let mut c = Command::new("ssh");
        c.args(["-F", "/dev/null", "-i"])
            .arg(&self.login_key)
            .args(["-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes"])
            .args(["-o", "StrictHostKeyChecking=yes", "-o", "LogLevel=ERROR"])
            .arg("-o")
            .arg(format!("UserKnownHostsFile={}", known.display()))
            .args(["-o", "ConnectTimeout=10"])
            .arg(format!("root@{}", host.address()))
            // The forced command runs whatever we ask; the key may run only `hostd serve`.
            .arg("true");
        c
    }

    /// One `hostd serve` session over the forced command: sends the envelopes as frames,
    /// closes its side, and returns every frame hostd wrote as (kind, JSON payload)
    /// (1 hello, 3 result, 4 progress).
    pub fn session(&self, host: &TestHost, envelopes: &[SignedFile]) -> Vec<(u8, Value)> {
        let mut input = Vec::new();
        for e in envelopes {
            let mut payload = Vec::new();
            payload.extend_from_slice(&(e.body.len() as u32).to_be_bytes());
            payload.extend_from_slice(&e.body);
            payload.extend_from_slice(e.signature.as_bytes());
            input.extend_from_slice(b"CF");
            input.push(2);
            input.extend_from_slice(&(payload.len() as u32).to_be_bytes());
            input.extend_from_slice(&payload);
        }
        let mut child = self
            .ssh(host)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut stdin = child.stdin.take().unwrap();
        let writer = std::thread::spawn(move || {
            let _ = stdin.write_all(&input);
        });
        let mut out = Vec::new();
        child.stdout.take().unwrap().read_to_end(&mut out).unwrap();
        writer.join().unwrap();
        let status = child.wait().unwrap();
        let mut err = String::new();
        let _ = child.stderr.take().unwrap().read_to_string(&mut err);
        let mut frames = Vec::new();
        let mut rest = &out[..];
        while rest.len() >= 7 {
            assert_eq!(&rest[..2], b"CF", "bad frame magic (stderr: {err})");
            let kind = rest[2];
            let len = u32::from_be_bytes(rest[3..7].try_into().unwrap()) as usize;
            let payload = &rest[7..7 + len];
            frames.push((kind, serde_json::from_slice(payload).unwrap()));
            rest = &rest[7 + len..];
        }
        assert!(
            rest.is_empty() && !frames.is_empty(),
            "session ended with {status}, {} stray bytes, stderr: {err}",
            rest.len()
        );
        frames
    }

    /// Runs the envelopes in one session; every one must succeed. Returns their results.
    pub fn session_ok(&self, host: &TestHost, envelopes: &[SignedFile]) -> Vec<Value> {
        let frames = self.session(host, envelopes);
        assert_eq!(frames[0].0, 1, "hello first: {frames:?}");
        let results: Vec<Value> = frames
            .into_iter()
            .filter(|(k, _)| *k == 3)
            .map(|(_, v)| v)
            .collect();
        assert_eq!(results.len(), envelopes.len(), "{results:#?}");
        for (r, e) in results.iter().zip(envelopes) {
            assert_eq!(r["operationId"], json!(e.id), "{r:#}");
            assert_eq!(r["outcome"]["outcome"], "succeeded", "{r:#}");
        }
        results
            .into_iter()
            .map(|mut r| r["outcome"]["result"].take())
            .collect()
    }

    /// Copies the envelope and its signature to the host, checks the signature there the way
    /// an auditor does (`ssh-keygen -Y verify` against /etc/clawfleet/allowed_signers), and
    /// runs it with `hostd apply`. Returns the result (it must succeed).
    pub fn apply_ok(&self, host: &TestHost, envelope: &SignedFile) -> Value {
        let remote = format!("/var/tmp/{}.json", envelope.id);
        host.write_file(&remote, &envelope.body, 0o600).unwrap();
        host.write_file(
            &format!("{remote}.sig"),
            envelope.signature.as_bytes(),
            0o600,
        )
        .unwrap();
        let verdict = host
            .run_ok(&format!(
                "ssh-keygen -Y verify -f /etc/clawfleet/allowed_signers -I {PRINCIPAL} \
                 -n {SIGNATURE_NAMESPACE} -s {remote}.sig < {remote} 2>&1"
            ))
            .unwrap();
        assert!(
            verdict.contains(&format!(
                "Good \"{SIGNATURE_NAMESPACE}\" signature for {PRINCIPAL}"
            )),
            "{verdict}"
        );
        let out = host.run_ok(&format!("hostd apply {remote}")).unwrap();
        let mut r: Value = serde_json::from_str(&out).unwrap();
        assert_eq!(r["outcome"]["outcome"], "succeeded", "{r:#}");
        r["outcome"]["result"].take()
    }
}

/// An envelope as it travels: the exact signed bytes and the armored SSHSIG signature.
#[derive(Debug, Clone)]
pub struct SignedFile {
    pub id: String,
    pub body: Vec<u8>,
    pub signature: String,
}

pub fn namespace_ref(ns: &str) -> Value {
    json!({"id": ns, "name": format!("{ns}-name")})
}

pub fn agent_ref(agent: &str) -> Value {
    json!({"id": agent, "servicePrincipalId": format!("sp-{agent}")})
}

/// The canonical bytes (keys sorted, no whitespace) of a rendered configuration for the test
/// gateway, and their SHA-256: hostd recomputes the hash from the document it receives.
pub fn configuration(label: &str) -> (Value, String) {
    let canonical = format!(
        "{{\"gateway\":{{\"auth\":{{\"mode\":\"password\",\"password\":{{\"id\":\"OPENCLAW_GATEWAY_PASSWORD\",\
         \"provider\":\"default\",\"source\":\"env\"}}}},\"bind\":\"loopback\",\"mode\":\"local\"}},\
         \"x-clawfleet-test\":{{\"label\":\"{label}\"}}}}"
    );
    (
        serde_json::from_str(&canonical).unwrap(),
        sha256_hex(canonical.as_bytes()),
    )
}

pub fn ensure_namespace(ns: &str) -> Value {
    json!({"op": "ensure-namespace", "namespace": namespace_ref(ns)})
}

pub fn prepare_revision(ns: &str, agent: &str, rev: &str, number: u64) -> Value {
    let (configuration, hash) = configuration(rev);
    json!({"op": "prepare-revision", "namespace": namespace_ref(ns), "agent": agent_ref(agent),
        "revision": {"id": rev, "number": number,
            "harness": {"id": "openclaw", "version": "2026.9.6", "mode": "embedded"},
            "configuration": configuration, "configurationHash": hash}})
}

pub fn revision_op(op: &str, ns: &str, agent: &str, rev: &str, number: u64) -> Value {
    let (_, hash) = configuration(rev);
    json!({"op": op, "namespace": namespace_ref(ns), "agent": agent_ref(agent),
        "revision": {"id": rev, "number": number, "configurationHash": hash}})
}

pub fn probe() -> Value {
    json!({"op": "probe"})
}

/// `hostd status --json` on the host.
pub fn status(host: &TestHost) -> Value {
    serde_json::from_str(&host.run_ok("hostd status --json").unwrap()).unwrap()
}

/// The observation of one Agent in `hostd status --json`.
pub fn observation(host: &TestHost, ns: &str, agent: &str) -> Value {
    let s = status(host);
    let found = s["namespaces"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|n| n["id"] == ns)
        .flat_map(|n| n["agents"].as_array().unwrap().iter())
        .find(|a| a["id"] == agent)
        .unwrap_or_else(|| panic!("{ns}/{agent} not in status: {s:#}"));
    assert_eq!(s["problems"], json!([]), "{s:#}");
    found["observation"].clone()
}

/// `curl` inside the host: (status code, body).
pub fn curl(host: &TestHost, url: &str) -> (u16, String) {
    let out = host
        .run_ok(&format!(
            "curl -s -m 5 -o /var/tmp/curl-body -w '%{{http_code}}' {url}; echo; cat /var/tmp/curl-body 2>/dev/null; rm -f /var/tmp/curl-body"
        ))
        .unwrap();
    let (code, body) = out.split_once('\n').unwrap_or((&out, ""));
    (code.trim().parse().unwrap_or(0), body.to_owned())
}

/// Polls `check` until it returns true or `limit` passes.
pub fn wait_until(limit: Duration, mut check: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + limit;
    loop {
        if check() {
            return true;
        }
        if Instant::now() >= end {
            return false;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// A loop inside the host (a transient systemd service) that asks `url` every 100 ms and logs
/// `ok` (a 2xx answer) or `fail`, so a test can prove an endpoint never stopped answering while it acted.
#[derive(Debug)]
pub struct Watcher {
    unit: String,
    log: String,
}

impl Watcher {
    pub fn start(host: &TestHost, name: &str, url: &str) -> Self {
        let unit = format!("pkgtest-watch-{name}");
        let log = format!("/var/log/{unit}.log");
        // No '%' in the command: systemd would read it as a specifier.
        host.run_ok(&format!(
            "rm -f {log}; systemd-run --quiet --unit={unit} /bin/sh -c \
             'while :; do if curl -sf -m 1 -o /dev/null {url}; then echo ok; else echo fail; fi >> {log}; sleep 0.1; done'"
        ))
        .unwrap();
        let w = Self { unit, log };
        assert!(
            wait_until(Duration::from_secs(10), || w.codes(host).len() >= 2),
            "the watcher never wrote"
        );
        w
    }

    pub fn codes(&self, host: &TestHost) -> Vec<String> {
        host.run_ok(&format!("cat {} 2>/dev/null || true", self.log))
            .unwrap()
            .lines()
            .map(str::to_owned)
            .collect()
    }

    /// Stops the loop; returns every line it logged (`ok` or `fail`).
    pub fn stop(self, host: &TestHost) -> Vec<String> {
        host.run_ok(&format!("systemctl stop {}", self.unit))
            .unwrap();
        self.codes(host)
    }
}
