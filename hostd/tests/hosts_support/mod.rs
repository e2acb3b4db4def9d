//! Shared pieces of the real-host tests: a test host with hostd installed and enrolled, and a
//! coordinator stand-in that signs envelopes and drives `hostd serve` through the stock OpenSSH
//! `ssh` client, exactly as an operator's forced command would run it.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use clawfleet_protocol::framing::{FrameDecoder, write_frame};
use clawfleet_protocol::operation::*;
use clawfleet_protocol::result::{OperationResult, Outcome, Progress, ResultMessage};
use clawfleet_protocol::ssh_key::{
    Algorithm, LineEnding, PrivateKey, getrandom::SysRng, rand_core::UnwrapErr,
};
use clawfleet_protocol::{
    Configuration, Envelope, Failure, Fingerprint, HostName, Ident, Limits, Message, OperationId,
    PROTOCOL_VERSION, Principal, SignedEnvelope, Target,
};
use clawfleet_vm_tests::TestHost;
use serde_json::{Value, json};

/// Installs hostd from the project's .deb when a current one was built (always under CI).
#[path = "../../../vm-tests/tests/packages_support/install.rs"]
pub mod install;

pub const PRINCIPAL: &str = "occ@tests";

/// hostd.toml limits for tests whose candidates fail: readiness gives up after 4 s.
pub const QUICK_READINESS: &str =
    "[limits]\nlock_timeout_ms = 3000\nreadiness_timeout_ms = 4000\nunit_stop_timeout_ms = 10000\n";

/// A coordinator's two keys, as `occ init` would make them.
pub struct Coordinator {
    pub dir: tempfile::TempDir,
    pub login_key: PathBuf,
    pub signing: PrivateKey,
    counter: std::cell::Cell<u32>,
    /// The user `ssh` logs in as: root, or the login user of `hostd enrol --login-user`.
    pub user: String,
}

impl Coordinator {
    pub fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let login = PrivateKey::random(&mut UnwrapErr(SysRng), Algorithm::Ed25519).unwrap();
        let login_key = dir.path().join("login_ed25519");
        std::fs::write(
            &login_key,
            login.to_openssh(LineEnding::LF).unwrap().as_bytes(),
        )
        .unwrap();
        std::fs::set_permissions(
            &login_key,
            std::os::unix::fs::PermissionsExt::from_mode(0o600),
        )
        .unwrap();
        std::fs::write(
            dir.path().join("login_ed25519.pub"),
            login.public_key().to_openssh().unwrap(),
        )
        .unwrap();
        Self {
            dir,
            login_key,
            signing: PrivateKey::random(&mut UnwrapErr(SysRng), Algorithm::Ed25519).unwrap(),
            counter: std::cell::Cell::new(0),
            user: "root".to_owned(),
        }
    }

    pub fn login_public(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("login_ed25519.pub")).unwrap()
    }

    pub fn signing_public(&self) -> String {
        self.signing.public_key().to_openssh().unwrap()
    }

    /// A fresh operation id.
    pub fn next_id(&self) -> String {
        let n = self.counter.get() + 1;
        self.counter.set(n);
        format!("op-{}-{n}", std::process::id())
    }

    pub fn envelope(&self, host: &TestHost, id: &str, operation: Operation) -> Envelope {
        let now = hostd::session::now_unix();
        Envelope {
            version: PROTOCOL_VERSION,
            operation_id: OperationId::new(id).unwrap(),
            target: Target {
                host: HostName::new(host.name()).unwrap(),
                host_key: Fingerprint::new(host.host_key_fingerprint()).unwrap(),
            },
            issuer: Principal::new(PRINCIPAL).unwrap(),
            issued_at: now,
            expires_at: now + 600,
            deadline_seconds: 120,
            fence: None,
            operation,
        }
    }

    pub fn sign(&self, envelope: &Envelope) -> SignedEnvelope {
        SignedEnvelope::sign(envelope, &self.signing).unwrap()
    }

    /// `ssh` as the coordinator: its own key, the host's pinned key, the forced command.
    pub fn ssh(&self, host: &TestHost) -> Command {
        let mut c = Command::new("ssh");
        let known = self.dir.path().join(format!("known_hosts-{}", host.name()));
        std::fs::write(
            &known,
            format!("{} {}\n", host.address(), host.host_public_key().trim()),
        )
        .unwrap();
        c.args(["-F", "/dev/null", "-i"])
            .arg(&self.login_key)
            .args([
                "-o",
                "BatchMode=yes",
                "-o",
                "IdentitiesOnly=yes",
                "-o",
                "StrictHostKeyChecking=yes",
            ])
            .arg("-o")
            .arg(format!("UserKnownHostsFile={}", known.display()))
            .args(["-o", "LogLevel=ERROR", "-o", "ConnectTimeout=10"])
            .arg(format!("{}@{}", self.user, host.address()))
            // The forced command runs whatever we ask for; say what we mean anyway.
            .arg("hostd serve");
        c
    }

    /// One session: sends the envelopes, closes stdin, returns everything hostd wrote.
    pub fn session(&self, host: &TestHost, envelopes: &[SignedEnvelope]) -> Vec<Message> {
        let mut s = Session::open(self, host);
        for e in envelopes {
            s.send(e);
        }
        s.finish()
    }

    /// Runs one operation in its own session and returns its result.
    pub fn call(&self, host: &TestHost, operation: Operation) -> ResultMessage {
        let id = self.next_id();
        let signed = self.sign(&self.envelope(host, &id, operation));
        let mut s = Session::open(self, host);
        s.send(&signed);
        let (out, stderr) = s.finish_with_stderr();
        results(&out)
            .into_iter()
            .next()
            .unwrap_or_else(|| panic!("no result in {out:?}; {stderr}"))
    }

    /// Like [`call`], but the operation must succeed.
    pub fn ok(&self, host: &TestHost, operation: Operation) -> OperationResult {
        let kind = operation.kind();
        match self.call(host, operation).outcome {
            Outcome::Succeeded { result } => result,
            Outcome::Failed { failure } => panic!("{kind} failed: {failure}"),
        }
    }

    /// Like [`call`], but the operation must fail; returns the failure.
    pub fn fails(&self, host: &TestHost, operation: Operation) -> Failure {
        let kind = operation.kind();
        match self.call(host, operation).outcome {
            Outcome::Succeeded { result } => panic!("{kind} should have failed: {result:?}"),
            Outcome::Failed { failure } => failure,
        }
    }
}

/// A live session whose messages arrive on a channel as hostd writes them.
pub struct Session {
    pub child: Child,
    stdin: Option<ChildStdin>,
    rx: mpsc::Receiver<Message>,
    pub received: Vec<Message>,
    /// What ssh (and hostd before its first frame) wrote to stderr, for a failure's message.
    stderr: Option<std::thread::JoinHandle<String>>,
}

impl Session {
    pub fn open(coordinator: &Coordinator, host: &TestHost) -> Self {
        let mut child = coordinator
            .ssh(host)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take();
        let mut err = child.stderr.take().unwrap();
        let stderr = std::thread::spawn(move || {
            let mut text = String::new();
            let _ = err.read_to_string(&mut text);
            text
        });
        let mut stdout = child.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut dec = FrameDecoder::new(Limits::default().max_frame);
            let mut buf = [0u8; 8192];
            loop {
                match stdout.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        dec.push(&buf[..n]);
                        while let Ok(Some(frame)) = dec.next_frame() {
                            let m = Message::from_frame(&frame, &Limits::default()).unwrap();
                            if tx.send(m).is_err() {
                                return;
                            }
                        }
                    }
                }
            }
        });
        Self {
            child,
            stdin,
            rx,
            received: Vec::new(),
            stderr: Some(stderr),
        }
    }

    pub fn send(&mut self, signed: &SignedEnvelope) {
        let frame = Message::Envelope(signed.clone()).to_frame().unwrap();
        let stdin = self.stdin.as_mut().unwrap();
        write_frame(stdin, &frame, Limits::default().max_frame).unwrap();
        stdin.flush().unwrap();
    }

    /// Waits for a message matching `pred`, up to `limit`.
    pub fn wait_for(
        &mut self,
        limit: Duration,
        pred: impl Fn(&Message) -> bool,
    ) -> Option<Message> {
        let end = Instant::now() + limit;
        loop {
            let left = end.saturating_duration_since(Instant::now());
            match self.rx.recv_timeout(left) {
                Ok(m) => {
                    self.received.push(m.clone());
                    if pred(&m) {
                        return Some(m);
                    }
                }
                Err(_) => return None,
            }
        }
    }

    /// Closes stdin and collects everything until hostd ends the session.
    pub fn finish(self) -> Vec<Message> {
        self.finish_with_stderr().0
    }

    /// [`Session::finish`], with what ssh wrote to stderr and how it exited.
    pub fn finish_with_stderr(mut self) -> (Vec<Message>, String) {
        drop(self.stdin.take());
        while let Ok(m) = self.rx.recv_timeout(Duration::from_secs(180)) {
            self.received.push(m);
        }
        let status = self.child.wait();
        let stderr = self
            .stderr
            .take()
            .and_then(|h| h.join().ok())
            .unwrap_or_default();
        (
            self.received,
            format!("ssh exited {status:?}; stderr: {stderr:?}"),
        )
    }

    /// Cuts the session from the client side (the ssh client dies).
    pub fn kill_client(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn results(messages: &[Message]) -> Vec<ResultMessage> {
    messages
        .iter()
        .filter_map(|m| match m {
            Message::Result(r) => Some(r.clone()),
            _ => None,
        })
        .collect()
}

pub fn progress(messages: &[Message]) -> Vec<Progress> {
    messages
        .iter()
        .filter_map(|m| match m {
            Message::Progress(p) => Some(p.clone()),
            _ => None,
        })
        .collect()
}

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

/// A rendered configuration as the coordinator would send it, with test-gateway switches.
pub fn configuration(port_hint: Option<u16>, switches: Value) -> Configuration {
    let mut gateway = json!({"mode": "local", "bind": "loopback",
        "auth": {"mode": "password", "password": {"source": "env", "provider": "default", "id": "OPENCLAW_GATEWAY_PASSWORD"}}});
    if let Some(p) = port_hint {
        gateway["port"] = json!(p);
    }
    Configuration::new(json!({"gateway": gateway, "x-clawfleet-test": switches})).unwrap()
}

pub fn spec(rev: &str, number: u64, switches: Value) -> RevisionSpec {
    let configuration = configuration(None, switches);
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

pub fn ensure(n: &str) -> Operation {
    Operation::EnsureNamespace(NamespaceArgs { namespace: ns(n) })
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

pub fn rargs(n: &str, a: &str, rev: &RevisionSpec) -> RevisionArgs {
    RevisionArgs {
        namespace: ns(n),
        agent: agent(a),
        revision: rev.reference(),
    }
}

/// Boots a host, installs hostd and the test gateway, writes hostd.toml with short limits,
/// and enrols the coordinator with `hostd enrol` (twice: it must be idempotent).
pub fn host_with_hostd(coordinator: &Coordinator, extra_config: &str) -> TestHost {
    host_with_hostd_options(coordinator, extra_config, &Default::default())
}

/// [`host_with_hostd`] on a host booted with `options`.
pub fn host_with_hostd_options(
    coordinator: &Coordinator,
    extra_config: &str,
    options: &clawfleet_vm_tests::HostOptions,
) -> TestHost {
    let config = clawfleet_vm_tests::HarnessConfig::from_env().unwrap();
    let host = TestHost::start_with_options(&config, options).unwrap();
    install_hostd(&host, coordinator, extra_config);
    host
}

pub fn install_hostd(host: &TestHost, coordinator: &Coordinator, extra_config: &str) {
    install::install_hostd_package_or_binary(host, Path::new(env!("CARGO_BIN_EXE_hostd"))).unwrap();
    configure_and_enrol(host, coordinator, extra_config);
}

/// Boots a host with this test build of hostd (not the package: the fault matrix needs its
/// test-only hooks), configured and enrolled like [`host_with_hostd`].
pub fn host_with_test_build_of_hostd(coordinator: &Coordinator, extra_config: &str) -> TestHost {
    let host = TestHost::start().unwrap();
    host.install_hostd(Path::new(env!("CARGO_BIN_EXE_hostd")))
        .unwrap();
    configure_and_enrol(&host, coordinator, extra_config);
    host
}

/// The test gateway, hostd.toml (short limits unless `extra_config` has `[limits]`) and the
/// coordinator's keys through `hostd enrol` (twice: it must be idempotent).
pub fn configure_and_enrol(host: &TestHost, coordinator: &Coordinator, extra_config: &str) {
    let gateway = host.install_test_gateway().unwrap();
    let config = format!(
        "host_name = \"{}\"\ngateway_command = [\"{gateway}\"]\n{extra_config}\n",
        host.name()
    );
    let config = if config.contains("[limits]") {
        config
    } else {
        format!(
            "{config}[limits]\nlock_timeout_ms = 3000\nreadiness_timeout_ms = 20000\nunit_stop_timeout_ms = 10000\n"
        )
    };
    host.write_file("/etc/clawfleet/hostd.toml", config.as_bytes(), 0o644)
        .unwrap();
    host.write_file(
        "/tmp/occ-login.pub",
        coordinator.login_public().as_bytes(),
        0o644,
    )
    .unwrap();
    host.write_file(
        "/tmp/occ-signing.pub",
        coordinator.signing_public().as_bytes(),
        0o644,
    )
    .unwrap();
    let enrol = format!(
        "hostd enrol --ssh-key /tmp/occ-login.pub --signing-key /tmp/occ-signing.pub --principal {PRINCIPAL}"
    );
    let first = host.run_ok(&enrol).unwrap();
    assert!(
        first.contains(host.host_key_fingerprint()),
        "enrol prints the fingerprint to pin: {first}"
    );
    let before = host
        .run_ok("sha256sum /root/.ssh/authorized_keys /etc/clawfleet/allowed_signers")
        .unwrap();
    host.run_ok(&enrol).unwrap();
    let after = host
        .run_ok("sha256sum /root/.ssh/authorized_keys /etc/clawfleet/allowed_signers")
        .unwrap();
    assert_eq!(before, after, "a second enrol changes nothing");
}

/// The pid of an Agent unit's gateway: the child of its launcher, which stays as the unit's
/// main process (hostd/src/supervise.rs); 0 when nothing runs.
#[allow(dead_code)]
pub fn unit_gateway_pid(host: &TestHost, unit: &str) -> u32 {
    host.run_ok(&format!(
        "m=$(systemctl show -P MainPID {unit}); \
         if [ \"$m\" != 0 ]; then cut -d' ' -f1 /proc/$m/task/$m/children 2>/dev/null; fi"
    ))
    .unwrap()
    .trim()
    .parse()
    .unwrap_or(0)
}

/// `curl` inside the host.
pub fn curl(host: &TestHost, port: u16, path: &str) -> (u16, String) {
    let out = host
        .run_ok(&format!(
            "curl -s -o /tmp/curl-body -w '%{{http_code}}' http://127.0.0.1:{port}{path}; echo; cat /tmp/curl-body 2>/dev/null || true"
        ))
        .unwrap();
    let mut lines = out.splitn(2, '\n');
    let code = lines.next().unwrap_or("0").trim().parse().unwrap_or(0);
    (code, lines.next().unwrap_or("").to_owned())
}
