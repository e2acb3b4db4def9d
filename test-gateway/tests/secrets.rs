//! File SecretRefs end to end: the real binary on loopback, its start, `GET /secrets`, and the
//! `secrets.reload` / status RPC over its WebSocket (a minimal RFC 6455 client below).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use base64ct::Encoding;
use serde_json::{Value, json};
use sha1::Digest;

const BIN: &str = env!("CARGO_BIN_EXE_clawfleet-test-gateway");

struct Scratch(PathBuf);

impl Scratch {
    fn new(tag: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("cftg-s-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }
    fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
    /// Writes a secret file atomically (temp + rename in the same directory), like hostd.
    fn secret(&self, name: &str, bytes: &[u8], mode: u32) -> PathBuf {
        let tmp = self.path(&format!(".{name}.tmp"));
        std::fs::write(&tmp, bytes).unwrap();
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(mode)).unwrap();
        let p = self.path(name);
        std::fs::rename(&tmp, &p).unwrap();
        p
    }
    fn config(&self, json: &Value) -> PathBuf {
        let p = self.path("openclaw.json");
        std::fs::write(&p, json.to_string()).unwrap();
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

fn command(port: u16, config: &Path, password: Option<&str>) -> Command {
    let mut c = Command::new(BIN);
    c.env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env("OPENCLAW_GATEWAY_PORT", port.to_string())
        .env("OPENCLAW_CONFIG_PATH", config)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    if let Some(pw) = password {
        c.env("OPENCLAW_GATEWAY_PASSWORD", pw);
    }
    c
}

fn start(port: u16, config: &Path, password: Option<&str>) -> Gateway {
    let gw = Gateway(command(port, config, password).spawn().unwrap());
    let t0 = Instant::now();
    while get(port, "/healthz").is_none() {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "the gateway never listened"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    gw
}

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

fn secrets_status(port: u16) -> Value {
    let (status, body) = get(port, "/secrets").unwrap();
    assert_eq!(status, 200, "{body}");
    serde_json::from_str(&body).unwrap()
}

fn fp(bytes: &[u8]) -> String {
    use sha2::Digest as _;
    let hex: String = sha2::Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("sha256:{hex}")
}

/// A WebSocket client speaking the gateway protocol.
struct Ws {
    out: TcpStream,
    input: BufReader<TcpStream>,
    next_id: u64,
    /// The code and reason of the server's close frame, once received.
    closed: Option<(u16, String)>,
}

impl Ws {
    /// Upgrades, checks the accept key, and returns the `connect.challenge` event too.
    fn open(port: u16) -> (Ws, Value) {
        let s = TcpStream::connect(("127.0.0.1", port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let key = "dGhlIHNhbXBsZSBub25jZQ==";
        let mut out = s.try_clone().unwrap();
        write!(
            out,
            "GET / HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\n\
             Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
        )
        .unwrap();
        let mut input = BufReader::new(s);
        let mut line = String::new();
        input.read_line(&mut line).unwrap();
        assert!(line.starts_with("HTTP/1.1 101"), "{line}");
        let mut accept = None;
        loop {
            line.clear();
            input.read_line(&mut line).unwrap();
            if line == "\r\n" {
                break;
            }
            if let Some(v) = line.strip_prefix("Sec-WebSocket-Accept:") {
                accept = Some(v.trim().to_owned());
            }
        }
        let mut h = sha1::Sha1::new();
        h.update(format!("{key}258EAFA5-E914-47DA-95CA-C5AB0DC85B11").as_bytes());
        assert_eq!(
            accept.as_deref(),
            Some(base64ct::Base64::encode_string(&h.finalize()).as_str())
        );
        let mut ws = Ws {
            out,
            input,
            next_id: 0,
            closed: None,
        };
        let challenge = ws.recv().expect("a challenge");
        (ws, challenge)
    }

    fn send(&mut self, v: &Value) {
        let payload = v.to_string().into_bytes();
        let mask = [0x12u8, 0x34, 0x56, 0x78];
        let mut frame = vec![0x81u8];
        match payload.len() {
            n if n < 126 => frame.push(0x80 | n as u8),
            n => {
                frame.push(0x80 | 126);
                frame.extend_from_slice(&(n as u16).to_be_bytes());
            }
        }
        frame.extend_from_slice(&mask);
        frame.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
        self.out.write_all(&frame).unwrap();
    }

    /// The next text frame as JSON, or `None` when the server closed.
    fn recv(&mut self) -> Option<Value> {
        let mut head = [0u8; 2];
        self.input.read_exact(&mut head).ok()?;
        assert_eq!(head[1] & 0x80, 0, "server frames are not masked");
        let len = match head[1] & 0x7F {
            126 => {
                let mut b = [0u8; 2];
                self.input.read_exact(&mut b).unwrap();
                usize::from(u16::from_be_bytes(b))
            }
            127 => {
                let mut b = [0u8; 8];
                self.input.read_exact(&mut b).unwrap();
                usize::try_from(u64::from_be_bytes(b)).unwrap()
            }
            n => usize::from(n),
        };
        let mut payload = vec![0u8; len];
        self.input.read_exact(&mut payload).unwrap();
        match head[0] & 0x0F {
            0x1 => Some(serde_json::from_slice(&payload).unwrap()),
            0x8 => {
                let code = payload
                    .get(..2)
                    .map_or(0, |b| u16::from_be_bytes([b[0], b[1]]));
                let reason = String::from_utf8_lossy(payload.get(2..).unwrap_or_default());
                self.closed = Some((code, reason.into_owned()));
                None
            }
            other => panic!("unexpected opcode {other}"),
        }
    }

    fn call(&mut self, method: &str, params: Value) -> Value {
        self.next_id += 1;
        let id = format!("r{}", self.next_id);
        self.send(&json!({"type": "req", "id": id, "method": method, "params": params}));
        let res = self.recv().expect("a response");
        assert_eq!(res["type"], "res", "{res}");
        assert_eq!(res["id"], id.as_str(), "{res}");
        res
    }

    /// `connect` as a device-less client; returns the whole response.
    fn connect(&mut self, client: (&str, &str), scopes: &[&str], password: Option<&str>) -> Value {
        let auth = password.map_or(json!({}), |p| json!({"password": p}));
        self.call(
            "connect",
            json!({"minProtocol": 4, "maxProtocol": 4,
                   "client": {"id": client.0, "version": "test", "platform": "linux",
                              "mode": client.1},
                   "role": "operator", "scopes": scopes, "auth": auth}),
        )
    }
}

/// A configuration binding `bot` (singleValue) at `channels.slack.botToken`, password auth.
fn bot_config(dir: &Scratch) -> Value {
    json!({
        "gateway": {"mode": "local", "bind": "loopback", "auth": {"mode": "password"}},
        "secrets": {"providers": {"clawfleet-bot": {
            "source": "file", "path": dir.path("bot").to_string_lossy(), "mode": "singleValue"}}},
        "channels": {"slack": {"botToken":
            {"source": "file", "provider": "clawfleet-bot", "id": "value"}}},
    })
}

/// Runs the gateway expecting it to exit within 10 s; a gateway that keeps running fails the test.
fn run_to_exit(mut c: Command) -> (i32, String) {
    let mut child = Gateway(c.spawn().unwrap());
    let t0 = Instant::now();
    let status = loop {
        if let Some(status) = child.0.try_wait().unwrap() {
            break status;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "the gateway kept running instead of refusing to start"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut stderr = String::new();
    child
        .0
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    (status.code().unwrap_or(-1), stderr)
}

fn exit_with(dir: &Scratch, config: &Value) -> (i32, String) {
    let path = dir.config(config);
    run_to_exit(command(free_port(), &path, Some("pw")))
}

#[test]
fn startup_fails_naming_the_unresolved_ref() {
    let dir = Scratch::new("start");
    let config = bot_config(&dir);
    // Missing file.
    let (code, err) = exit_with(&dir, &config);
    assert_eq!(code, 1, "{err}");
    for want in [
        "Startup failed",
        "file:clawfleet-bot:value",
        "channels.slack.botToken",
        "secrets.providers.clawfleet-bot.path is not readable",
    ] {
        assert!(err.contains(want), "{want:?} not in {err}");
    }
    // World-readable, group-writable, a symlink: each refused with OpenClaw's sentence.
    dir.secret("bot", b"tok", 0o644);
    let (code, err) = exit_with(&dir, &config);
    assert_eq!(code, 1);
    assert!(err.contains("permissions are too open"), "{err}");
    dir.secret("bot", b"tok", 0o620);
    let (code, err) = exit_with(&dir, &config);
    assert_eq!(code, 1);
    assert!(err.contains("permissions are too open"), "{err}");
    let real = dir.secret("real", b"tok", 0o600);
    std::fs::remove_file(dir.path("bot")).unwrap();
    std::os::unix::fs::symlink(&real, dir.path("bot")).unwrap();
    let (code, err) = exit_with(&dir, &config);
    assert_eq!(code, 1);
    assert!(err.contains("must not be a symlink"), "{err}");
    // A SecretRef the test gateway does not resolve is a configuration error (78).
    let mut exec_ref = config.clone();
    exec_ref["channels"]["slack"]["botToken"] =
        json!({"source": "exec", "provider": "vault", "id": "slack/bot"});
    let (code, err) = exit_with(&dir, &exec_ref);
    assert_eq!(code, 78);
    assert!(err.contains("channels.slack.botToken"), "{err}");
}

#[test]
fn startup_refuses_a_file_of_another_owner() {
    if !nix::unistd::geteuid().is_root() {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "startup_refuses_a_file_of_another_owner needs root under CI=true"
        );
        eprintln!("SKIP startup_refuses_a_file_of_another_owner: not root, cannot chown");
        return;
    }
    let dir = Scratch::new("owner");
    let p = dir.secret("bot", b"tok", 0o600);
    std::os::unix::fs::chown(&p, Some(65534), Some(65534)).unwrap();
    let (code, err) = exit_with(&dir, &bot_config(&dir));
    assert_eq!(code, 1);
    assert!(
        err.contains("must be owned by the effective user (uid=0)"),
        "{err}"
    );
}

#[test]
fn reload_swaps_fingerprints_and_keeps_the_last_good_snapshot() {
    let dir = Scratch::new("reload");
    let v1 = b"xoxb-first-value-7c1f";
    let v2 = b"xoxb-second-value-93ab";
    dir.secret("bot", v1, 0o400);
    let cfg = dir.config(&bot_config(&dir));
    let port = free_port();
    let mut gw = start(port, &cfg, Some("pw"));

    let s = secrets_status(port);
    assert_eq!(s["generation"], 1);
    assert_eq!(s["providers"]["clawfleet-bot"]["fingerprint"], fp(v1));
    assert_eq!(s["providers"]["clawfleet-bot"]["mode"], "singleValue");
    assert_eq!(s["refs"][0]["fingerprint"], fp(v1));
    assert_eq!(s["refs"][0]["paths"], json!(["channels.slack.botToken"]));
    assert_eq!(s["lastReload"], Value::Null);

    let (mut ws, challenge) = Ws::open(port);
    assert_eq!(challenge["event"], "connect.challenge");
    assert!(challenge["payload"]["nonce"].is_string() && challenge["payload"]["ts"].is_u64());
    let hello = ws.connect(
        ("gateway-client", "backend"),
        &["operator.admin"],
        Some("pw"),
    );
    assert_eq!(hello["ok"], true, "{hello}");
    assert_eq!(hello["payload"]["type"], "hello-ok");
    assert_eq!(hello["payload"]["protocol"], 4);
    assert_eq!(
        hello["payload"]["auth"]["scopes"],
        json!(["operator.admin"])
    );

    // Another client, connected through every reload below: rotating a non-auth secret must
    // not disconnect anyone.
    let (mut bystander, _) = Ws::open(port);
    bystander.connect(("cli", "cli"), &["operator.read"], Some("pw"));

    // Rotation: a new file (atomically), then the reload swaps.
    dir.secret("bot", v2, 0o400);
    let res = ws.call("secrets.reload", json!({}));
    assert_eq!(res["ok"], true, "{res}");
    assert_eq!(res["payload"], json!({"ok": true, "warningCount": 0}));
    let s = secrets_status(port);
    assert_eq!(s["generation"], 2);
    assert_eq!(s["refs"][0]["fingerprint"], fp(v2));
    assert_eq!(s["lastReload"]["ok"], true);
    let rpc = ws.call("x-clawfleet-test.secrets.status", json!({}));
    assert_eq!(rpc["payload"]["refs"][0]["fingerprint"], fp(v2), "{rpc}");

    // A bad file (0644, then a symlink) fails the reload; the last good snapshot stays.
    dir.secret("bot", b"xoxb-bad-value", 0o644);
    let res = ws.call("secrets.reload", json!({}));
    assert_eq!(res["ok"], false, "{res}");
    assert_eq!(res["error"]["code"], "UNAVAILABLE");
    assert_eq!(res["error"]["message"], "secrets.reload failed");
    let reason = res["error"]["details"]["reason"].as_str().unwrap();
    assert!(reason.contains("permissions are too open"), "{reason}");
    assert!(reason.contains("file:clawfleet-bot:value"), "{reason}");
    let s = secrets_status(port);
    assert_eq!(s["generation"], 2);
    assert_eq!(s["refs"][0]["fingerprint"], fp(v2));
    assert_eq!(s["lastReload"]["ok"], false);
    assert!(
        s["lastReload"]["error"]
            .as_str()
            .unwrap()
            .contains("too open")
    );
    let real = dir.secret("elsewhere", b"xoxb-linked", 0o600);
    std::fs::remove_file(dir.path("bot")).unwrap();
    std::os::unix::fs::symlink(&real, dir.path("bot")).unwrap();
    let res = ws.call("secrets.reload", json!({}));
    let reason = res["error"]["details"]["reason"].as_str().unwrap();
    assert!(reason.contains("must not be a symlink"), "{reason}");
    assert_eq!(secrets_status(port)["refs"][0]["fingerprint"], fp(v2));

    // Repaired: the next reload swaps again, on the same connection.
    std::fs::remove_file(dir.path("bot")).unwrap();
    dir.secret("bot", v1, 0o600);
    assert_eq!(ws.call("secrets.reload", json!({}))["ok"], true);
    let s = secrets_status(port);
    assert_eq!(s["generation"], 3);
    assert_eq!(s["refs"][0]["fingerprint"], fp(v1));
    assert_eq!(s["reloads"], json!({"ok": 2, "failed": 2}));
    let seen = bystander.call("x-clawfleet-test.secrets.status", json!({}));
    assert_eq!(seen["payload"]["generation"], 3, "{seen}");
    assert_eq!(bystander.closed, None);

    // No value anywhere in what the gateway reports or logs.
    let (_, info) = get(port, "/info").unwrap();
    drop(ws);
    gw.0.kill().unwrap();
    let mut stderr = String::new();
    gw.0.stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    for text in [&info, &s.to_string(), &stderr] {
        for value in [&v1[..], &v2[..], b"xoxb-bad-value", b"xoxb-linked"] {
            assert!(
                !text.contains(std::str::from_utf8(value).unwrap()),
                "a value leaked: {text}"
            );
        }
    }
    assert!(stderr.contains("secrets.reload failed"), "{stderr}");
}

#[test]
fn reload_needs_the_password_and_the_admin_scope() {
    let dir = Scratch::new("auth");
    dir.secret("bot", b"tok", 0o600);
    let cfg = dir.config(&bot_config(&dir));
    let port = free_port();
    let _gw = start(port, &cfg, Some("pw"));

    let (mut ws, _) = Ws::open(port);
    let res = ws.connect(
        ("gateway-client", "backend"),
        &["operator.admin"],
        Some("nope"),
    );
    assert_eq!(res["ok"], false);
    assert_eq!(
        res["error"]["message"],
        "unauthorized: gateway password mismatch"
    );
    assert!(
        ws.recv().is_none(),
        "the connection is closed after a failed connect"
    );

    // The first request must be connect.
    let (mut ws, _) = Ws::open(port);
    let res = ws.call("secrets.reload", json!({}));
    assert_eq!(res["ok"], false);
    assert!(ws.recv().is_none());

    // A device-less client that is not the local backend or CLI keeps no scopes.
    let (mut ws, _) = Ws::open(port);
    let hello = ws.connect(("webchat", "webchat"), &["operator.admin"], Some("pw"));
    assert_eq!(hello["payload"]["auth"]["scopes"], json!([]));
    let res = ws.call("secrets.reload", json!({}));
    assert_eq!(res["error"]["code"], "FORBIDDEN");
    assert_eq!(res["error"]["details"]["missingScope"], "operator.admin");

    // Read scope: status yes, reload no.
    let (mut ws, _) = Ws::open(port);
    ws.connect(("cli", "cli"), &["operator.read"], Some("pw"));
    assert_eq!(
        ws.call("x-clawfleet-test.secrets.status", json!({}))["ok"],
        true
    );
    assert_eq!(
        ws.call("secrets.reload", json!({}))["error"]["code"],
        "FORBIDDEN"
    );
    assert_eq!(
        secrets_status(port)["reloads"],
        json!({"ok": 0, "failed": 0})
    );
}

#[test]
fn a_password_secret_ref_rotates_and_ends_the_open_sessions() {
    let dir = Scratch::new("pwref");
    dir.secret("pw", b"first-password\n", 0o600);
    let cfg = dir.config(&json!({
        "gateway": {"mode": "local", "auth": {"mode": "password",
            "password": {"source": "file", "provider": "clawfleet-pw", "id": "value"}}},
        "secrets": {"providers": {"clawfleet-pw": {
            "source": "file", "path": dir.path("pw").to_string_lossy(), "mode": "singleValue"}}},
    }));
    let port = free_port();
    // No OPENCLAW_GATEWAY_PASSWORD: the ref is the password (its trailing newline dropped).
    let _gw = start(port, &cfg, None);
    let (mut admin, _) = Ws::open(port);
    let hello = admin.connect(
        ("gateway-client", "backend"),
        &["operator.admin"],
        Some("first-password"),
    );
    assert_eq!(hello["ok"], true, "{hello}");
    let (mut bystander, _) = Ws::open(port);
    bystander.connect(("cli", "cli"), &[], Some("first-password"));
    dir.secret("pw", b"second-password", 0o600);
    assert_eq!(admin.call("secrets.reload", json!({}))["ok"], true);
    assert!(bystander.recv().is_none());
    assert_eq!(bystander.closed.as_ref().map(|c| c.0), Some(4001));
    let (mut old, _) = Ws::open(port);
    let res = old.connect(("cli", "cli"), &[], Some("first-password"));
    assert_eq!(res["ok"], false, "{res}");
    let (mut new, _) = Ws::open(port);
    assert_eq!(
        new.connect(("cli", "cli"), &["operator.read"], Some("second-password"))["ok"],
        true
    );
    let status = new.call("x-clawfleet-test.secrets.status", json!({}));
    assert_eq!(
        status["payload"]["refs"][0]["fingerprint"],
        fp(b"second-password")
    );
    assert_eq!(
        status["payload"]["providers"]["clawfleet-pw"]["fingerprint"],
        fp(b"second-password")
    );
    // As OpenClaw 2026.9.6 does (seen live), a changed gateway password ends the sessions that
    // were open at the reload, the caller's included, with 4001 "gateway auth changed".
    assert!(admin.recv().is_none());
    assert_eq!(
        admin.closed,
        Some((4001, "gateway auth changed".to_owned()))
    );
}

/// The coordinator renders `gateway.auth.password` as an env SecretRef: it must resolve from the
/// unit's environment, and its absence stops the start naming the ref.
#[test]
fn the_rendered_env_password_ref_is_the_password() {
    let dir = Scratch::new("envpw");
    let cfg = dir.config(&json!({
        "gateway": {"mode": "local", "bind": "loopback", "auth": {"mode": "password",
            "password": {"source": "env", "provider": "default", "id": "OPENCLAW_GATEWAY_PASSWORD"}}},
    }));
    let (code, err) = run_to_exit(command(free_port(), &cfg, None));
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("env:default:OPENCLAW_GATEWAY_PASSWORD")
            && err.contains("gateway.auth.password")
            && err.contains("missing or empty"),
        "{err}"
    );
    let port = free_port();
    let _gw = start(port, &cfg, Some("env-pw"));
    let s = secrets_status(port);
    assert_eq!(s["refs"][0]["source"], "env");
    assert_eq!(s["refs"][0]["fingerprint"], fp(b"env-pw"));
    let (mut ws, _) = Ws::open(port);
    assert_eq!(ws.connect(("cli", "cli"), &[], Some("env-pw"))["ok"], true);
}

/// `secretLogLines` prints the held values at start and after each good reload (a gateway that
/// leaks its secrets into the journal, for the redaction tests); a failed reload prints nothing.
#[test]
fn secret_log_lines_print_the_held_values() {
    let dir = Scratch::new("loglines");
    dir.secret("bot", b"value-one", 0o600);
    let mut config = bot_config(&dir);
    config["x-clawfleet-test"] =
        json!({"secretLogLines": ["held=${SECRET:file:clawfleet-bot:value}"]});
    let cfg = dir.config(&config);
    let port = free_port();
    let mut gw = start(port, &cfg, Some("pw"));
    let (mut ws, _) = Ws::open(port);
    ws.connect(
        ("gateway-client", "backend"),
        &["operator.admin"],
        Some("pw"),
    );
    dir.secret("bot", b"value-two", 0o600);
    assert_eq!(ws.call("secrets.reload", json!({}))["ok"], true);
    dir.secret("bot", b"value-bad", 0o660);
    assert_eq!(ws.call("secrets.reload", json!({}))["ok"], false);
    drop(ws);
    gw.0.kill().unwrap();
    let mut stderr = String::new();
    gw.0.stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    let held: Vec<&str> = stderr.lines().filter(|l| l.starts_with("held=")).collect();
    assert_eq!(held, ["held=value-one", "held=value-two"], "{stderr}");
}

/// hostd's own RPC client (`hostd::gateway_rpc`, what hostd uses on a host) against this
/// gateway: it connects with the password, reloads a rotated file, and a bad file gives
/// `UNAVAILABLE` with the reason while the held fingerprint stays the last good one.
#[test]
fn hostds_client_reloads_and_sees_the_refusal() {
    use hostd::gateway_rpc::{GatewayRpc, RpcError};
    let dir = Scratch::new("hostd-rpc");
    dir.secret("bot", b"xoxb-hostd-one", 0o600);
    let cfg = dir.config(&bot_config(&dir));
    let port = free_port();
    let _gw = start(port, &cfg, Some("pw"));
    let timeout = Duration::from_secs(5);

    let e = GatewayRpc::connect(port, "not-the-pw", timeout).unwrap_err();
    assert!(matches!(&e, RpcError::Refused { .. }), "{e:?}");

    dir.secret("bot", b"xoxb-hostd-two", 0o600);
    let mut rpc = GatewayRpc::connect(port, "pw", timeout).unwrap();
    let answer = rpc.request("secrets.reload", json!({})).unwrap();
    assert_eq!(answer["ok"], true, "{answer}");
    assert_eq!(
        secrets_status(port)["providers"]["clawfleet-bot"]["fingerprint"],
        fp(b"xoxb-hostd-two")
    );

    dir.secret("bot", b"xoxb-hostd-bad", 0o644);
    let e = rpc.request("secrets.reload", json!({})).unwrap_err();
    match &e {
        RpcError::Refused { code, details, .. } => {
            assert_eq!(code, "UNAVAILABLE");
            assert!(details.is_some(), "{e:?}");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        secrets_status(port)["providers"]["clawfleet-bot"]["fingerprint"],
        fp(b"xoxb-hostd-two"),
        "the gateway keeps its last good snapshot"
    );
}
