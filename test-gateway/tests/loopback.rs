//! Runs the real binary on loopback and checks the launch contract from the outside.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_clawfleet-test-gateway");

struct Scratch(PathBuf);

impl Scratch {
    fn new(tag: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("cftg-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }
    fn config(&self, json: &str) -> PathBuf {
        let p = self.0.join("openclaw.json");
        std::fs::write(&p, json).unwrap();
        p
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

struct Gateway(Child);

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn command(port: Option<u16>, config: Option<&Path>) -> Command {
    let mut c = Command::new(BIN);
    c.env_clear()
        .env("PATH", "/usr/bin:/bin")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    if let Some(p) = port {
        c.env("OPENCLAW_GATEWAY_PORT", p.to_string());
    }
    if let Some(cfg) = config {
        c.env("OPENCLAW_CONFIG_PATH", cfg);
    }
    c
}

/// Minimal HTTP GET; returns (status, body), or None while nothing listens.
fn get(port: u16, path: &str) -> Option<(u16, String)> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(s, "GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n").ok()?;
    let mut raw = String::new();
    s.read_to_string(&mut raw).ok()?;
    let status = raw.split_whitespace().nth(1)?.parse().ok()?;
    let body = raw.split_once("\r\n\r\n")?.1.to_owned();
    Some((status, body))
}

fn wait_status(port: u16, path: &str, want: u16, limit: Duration) -> Duration {
    let t0 = Instant::now();
    loop {
        if get(port, path).is_some_and(|(s, _)| s == want) {
            return t0.elapsed();
        }
        assert!(t0.elapsed() < limit, "{path} never answered {want}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn exit_code(mut c: Command) -> (i32, String) {
    let out = c.output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn configuration_errors_exit_78() {
    let dir = Scratch::new("cfgerr");
    let good = dir.config("{}");
    assert_eq!(exit_code(command(None, Some(&good))).0, 78, "no port");
    assert_eq!(exit_code(command(Some(0), Some(&good))).0, 78, "port 0");
    assert_eq!(exit_code(command(Some(free_port()), None)).0, 78, "no path");
    let missing = dir.0.join("missing.json");
    assert_eq!(exit_code(command(Some(free_port()), Some(&missing))).0, 78);
    let bad = dir.config("{not json");
    assert_eq!(exit_code(command(Some(free_port()), Some(&bad))).0, 78);
    let unknown = dir.config(r#"{"x-clawfleet-test":{"surprise":true}}"#);
    let (code, err) = exit_code(command(Some(free_port()), Some(&unknown)));
    assert_eq!(code, 78);
    assert!(err.contains("surprise"), "{err}");
    let pw = dir.config(r#"{"gateway":{"auth":{"mode":"password"}}}"#);
    let (code, err) = exit_code(command(Some(free_port()), Some(&pw)));
    assert_eq!(code, 78);
    assert!(err.contains("OPENCLAW_GATEWAY_PASSWORD"), "{err}");
}

#[test]
fn crash_at_start_exits_1() {
    let dir = Scratch::new("crash0");
    let cfg = dir.config(r#"{"x-clawfleet-test":{"crashAtStart":true}}"#);
    assert_eq!(exit_code(command(Some(free_port()), Some(&cfg))).0, 1);
}

#[test]
fn crash_after_delay_exits_1_after_serving() {
    let dir = Scratch::new("crashlater");
    let cfg = dir.config(r#"{"x-clawfleet-test":{"crashAfterMs":700}}"#);
    let port = free_port();
    let t0 = Instant::now();
    let mut gw = Gateway(command(Some(port), Some(&cfg)).spawn().unwrap());
    wait_status(port, "/readyz", 200, Duration::from_secs(5));
    let status = gw.0.wait().unwrap();
    assert_eq!(status.code(), Some(1));
    assert!(t0.elapsed() >= Duration::from_millis(700));
}

#[test]
fn ready_after_delay_and_info() {
    let dir = Scratch::new("ready");
    let text = r#"{"gateway":{"mode":"local","auth":{"mode":"password"}},
        "x-clawfleet-test":{"readyAfterMs":600,"label":"rev-42"}}"#;
    let real = dir.config(text);
    let link = dir.0.join("current.json");
    std::os::unix::fs::symlink(&real, &link).unwrap();
    let port = free_port();
    let mut c = command(Some(port), Some(&link));
    c.env("OPENCLAW_GATEWAY_PASSWORD", "pw-1")
        .env("OPENCLAW_STATE_DIR", &dir.0)
        .current_dir(&dir.0);
    let gw = Gateway(c.spawn().unwrap());
    // 503 before ready (health is live), then 200 after the delay.
    wait_status(port, "/healthz", 200, Duration::from_secs(5));
    let (s, body) = get(port, "/readyz").unwrap();
    assert_eq!(s, 503, "{body}");
    wait_status(port, "/readyz", 200, Duration::from_secs(5));
    let (s, body) = get(port, "/info").unwrap();
    assert_eq!(s, 200);
    let info: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(info["pid"], gw.0.id());
    assert_eq!(info["label"], "rev-42");
    assert_eq!(info["port"], port);
    assert_eq!(
        info["configPath"],
        std::fs::canonicalize(&real)
            .unwrap()
            .to_string_lossy()
            .as_ref()
    );
    let sha = sha2_hex(text.as_bytes());
    assert_eq!(info["configSha256"], sha.as_str());
    assert_eq!(info["passwordSha256"], sha2_hex(b"pw-1").as_str());
    assert!(info["uid"].is_u64() && info["gid"].is_u64(), "{info}");
    assert!(info["startedAtUnixMs"].as_u64().unwrap() > 0);
    assert_eq!(info["ready"], true);
    assert_eq!(get(port, "/nope").unwrap().0, 404);
}

#[test]
fn never_ready_stays_503() {
    let dir = Scratch::new("never");
    let cfg = dir.config(r#"{"x-clawfleet-test":{"neverReady":true}}"#);
    let port = free_port();
    let _gw = Gateway(command(Some(port), Some(&cfg)).spawn().unwrap());
    wait_status(port, "/healthz", 200, Duration::from_secs(5));
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(get(port, "/readyz").unwrap().0, 503);
}

fn sha2_hex(b: &[u8]) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(b)
        .iter()
        .map(|x| format!("{x:02x}"))
        .collect()
}

/// A stop (SIGTERM, as systemd and the kubelet send) closes every WebSocket session with 1012
/// "service restart", as OpenClaw does, and exits 0; `hold` clients reconnect at once to the
/// next gateway on the port and say how long that took.
#[test]
fn a_stop_closes_sessions_with_1012_and_held_clients_reconnect() {
    let dir = Scratch::new("stop1012");
    let cfg = dir.config(r#"{"gateway": {"mode": "local", "auth": {"mode": "password"}}}"#);
    let password_file = dir.0.join("env");
    std::fs::write(&password_file, "OPENCLAW_GATEWAY_PASSWORD=pw1012\n").unwrap();
    let port = free_port();
    let gateway = |cfg: &Path| {
        let mut c = command(Some(port), Some(cfg));
        c.env("OPENCLAW_GATEWAY_PASSWORD", "pw1012");
        let gw = Gateway(c.spawn().unwrap());
        wait_status(port, "/healthz", 200, Duration::from_secs(10));
        gw
    };
    let mut first = gateway(&cfg);
    let stop_file = dir.0.join("stop");
    let details = dir.0.join("details.json");
    let hold = Command::new(BIN)
        .arg("hold")
        .arg(port.to_string())
        .arg(&password_file)
        .arg("3")
        .arg(&stop_file)
        .arg("60")
        .arg(&details)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // All three connected (hold exits with an error otherwise); give them a moment to settle.
    std::thread::sleep(Duration::from_millis(500));
    let stopped_at = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(first.0.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let status = first.0.wait().unwrap();
    assert_eq!(status.code(), Some(0), "a stopped gateway exits 0");
    let _second = gateway(&cfg);
    // The clients retry every 50 ms: all three are back well within this.
    std::thread::sleep(Duration::from_secs(1));
    std::fs::write(&stop_file, "").unwrap();
    let out = hold.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let summary: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(summary["disconnected"], 3, "{summary}");
    assert_eq!(
        summary["closeCodes"],
        serde_json::json!([1012, 1012, 1012]),
        "{summary}"
    );
    assert_eq!(summary["reconnected"], 3, "{summary}");
    assert_eq!(summary["unreconnected"], 0, "{summary}");
    let at: Vec<u64> = serde_json::from_slice(&std::fs::read(&details).unwrap()).unwrap();
    assert_eq!(at.len(), 3);
    assert!(
        at.iter().all(|&t| t >= stopped_at),
        "{at:?} before the stop at {stopped_at}"
    );
}
