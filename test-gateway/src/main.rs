//! clawfleet-test-gateway: a tiny stand-in for the OpenClaw gateway that follows the same launch
//! contract (the environment and exit codes hostd's `launch.rs` and unit expect), so host-side behaviour can be tested in
//! seconds instead of the real gateway's 20 s start and 1 GB of memory.
//!
//! - `OPENCLAW_GATEWAY_PORT`, `OPENCLAW_CONFIG_PATH` (and `OPENCLAW_GATEWAY_PASSWORD` when the
//!   configuration asks for password auth) come from the environment; any problem with them exits
//!   with status 78, like the real gateway, so systemd's `RestartPreventExitStatus=78` applies.
//! - Listens on `127.0.0.1:<port>` (`0.0.0.0` with `gateway.bind: "lan"`, the cluster rendering)
//!   and serves `GET /readyz`, `GET /healthz`, `GET /info`; for the gateway route's tests a page
//!   (`/x-clawfleet-test/ui`) that uses the echo WebSocket (`/x-clawfleet-test/echo`), and a
//!   report of what authenticated a request (`/x-clawfleet-test/auth`, never a value).
//! - Behaviour switches come from the reserved top-level key `x-clawfleet-test`.
//! - File SecretRefs are resolved at start like OpenClaw's file provider (a ref that cannot be
//!   resolved stops the start with status 1), `secrets.reload` swaps them over the WebSocket RPC
//!   on the same port, and `GET /secrets` reports their fingerprints (never the values).
//!
//! - `clawfleet-test-gateway hold …` is not the gateway: it holds authenticated WebSocket clients
//!   on a gateway for a benchmark and reports which of them were disconnected (`hold.rs`).
//!
//! std only (plus serde_json, sha1/sha2, base64ct and nix): one thread per connection, no async
//! runtime.

mod config;
mod hold;
mod live;
mod rpc;
mod secrets;
mod ws;

use std::io::{BufRead, BufReader, Write};
use std::net::{Ipv4Addr, SocketAddrV4, TcpListener, TcpStream};
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::json;

use crate::config::Settings;

/// Exit status for configuration errors (sysexits `EX_CONFIG`), as the real gateway uses.
const EXIT_CONFIG: u8 = 78;
/// Exit status for a simulated crash or a runtime failure such as a port already in use.
const EXIT_CRASH: u8 = 1;

struct State {
    settings: Settings,
    ready: AtomicBool,
    started: Instant,
    started_unix_ms: u128,
    uid: Option<u32>,
    gid: Option<u32>,
    probe: serde_json::Value,
    /// The workspace as it was when the gateway started.
    workspace: serde_json::Value,
    secrets: secrets::Runtime,
    env_password: Option<String>,
    connections: rpc::Connections,
    /// The configuration file, watched and applied live.
    live: Arc<live::LiveConfig>,
    /// Set on SIGTERM/SIGINT: a connection accepted from then on is closed without a byte,
    /// so a front or proxy before it sends the request to the next gateway instead.
    stopping: AtomicBool,
}

/// SIGTERM and SIGINT, blocked in every thread so one thread can wait for them.
fn term_signals() -> nix::sys::signal::SigSet {
    use nix::sys::signal::{SigSet, Signal};
    let mut set = SigSet::empty();
    set.add(Signal::SIGTERM);
    set.add(Signal::SIGINT);
    set
}

/// Blocks [`term_signals`] before any other thread exists, so every thread inherits the mask
/// and the signal waits, pending, for [`close_sessions_on_term`].
fn block_term_signals() -> bool {
    match term_signals().thread_block() {
        Ok(()) => true,
        Err(e) => {
            eprintln!("clawfleet-test-gateway: cannot block SIGTERM for its handler thread: {e}");
            false
        }
    }
}

/// The gateway's state once it is built; the signal and file-watch threads start before it
/// (see [`close_sessions_on_term`]).
static STATE: std::sync::OnceLock<Arc<State>> = std::sync::OnceLock::new();

/// Ends every WebSocket session with 1012 "service restart" (when the state exists yet) and
/// exits 0.
fn close_sessions_and_exit(why: &str) -> ! {
    if let Some(state) = STATE.get() {
        state.stopping.store(true, Ordering::SeqCst);
        let closed = state.connections.close_all(1012, "service restart");
        eprintln!("clawfleet-test-gateway: {why}: closed {closed} sessions with 1012, exiting 0");
    } else {
        eprintln!("clawfleet-test-gateway: {why} while starting, exiting 0");
    }
    std::process::exit(0);
}

/// On SIGTERM or SIGINT: every WebSocket session gets close 1012 "service restart", then the
/// process exits 0. The real gateway does the same on a stop (OpenClaw closes even a socket
/// that has not completed `connect` with 1012 "service restart"), so clients through a
/// cutover see what they would see with it and reconnect at once. As a container's pid 1 (in
/// a Pod) this is also what makes the signals count at all: the kernel ignores them for a
/// pid 1 without a handler. The thread starts first of all, before the start's probes can
/// use up the unit's task limit; if it cannot start, the signals are unblocked again so
/// their default action ends the process.
fn close_sessions_on_term() {
    let spawned = std::thread::Builder::new().spawn(|| {
        if let Ok(sig) = term_signals().wait() {
            close_sessions_and_exit(sig.as_ref());
        }
    });
    if let Err(e) = spawned {
        eprintln!(
            "clawfleet-test-gateway: cannot start the signal thread ({e}); SIGTERM ends the process"
        );
        if let Err(e) = term_signals().thread_unblock() {
            eprintln!("clawfleet-test-gateway: cannot unblock SIGTERM either: {e}");
        }
    }
}

fn main() -> ExitCode {
    // From main to listening: the gateway's own start, which a cutover breakdown subtracts.
    let entered = Instant::now();
    let argv: Vec<String> = std::env::args().skip(1).collect();
    if argv.first().map(String::as_str) == Some("hold") {
        // Benchmark clients, not the gateway (see `hold.rs`).
        return match hold::Args::parse(&argv[1..]).and_then(|a| hold::run(&a)) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("clawfleet-test-gateway hold: {e}");
                ExitCode::from(EXIT_CRASH)
            }
        };
    }
    if block_term_signals() {
        close_sessions_on_term();
    }
    let settings = match config::load(|k| std::env::var(k).ok()) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("clawfleet-test-gateway: configuration error: {e}");
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    write_logs(&settings.switches);
    if settings.switches.crash_at_start {
        eprintln!("clawfleet-test-gateway: crashAtStart is set, exiting 1");
        return ExitCode::from(EXIT_CRASH);
    }
    // Eagerly, before listening: a ref that cannot be resolved stops the start (status 1, so
    // systemd restarts it, as the real gateway does for unavailable required secrets).
    let euid = nix::unistd::geteuid().as_raw();
    let secrets =
        match secrets::Runtime::start(settings.secrets.clone(), euid, secrets::process_env) {
            Ok(rt) => rt,
            Err(e) => {
                eprintln!("clawfleet-test-gateway: Startup failed: {e}");
                return ExitCode::from(EXIT_CRASH);
            }
        };
    write_secret_log_lines(&secrets, &settings.switches.secret_log_lines);
    let listener = match TcpListener::bind(SocketAddrV4::new(settings.listen, settings.port)) {
        Ok(l) => l,
        Err(e) => {
            eprintln!(
                "clawfleet-test-gateway: cannot listen on {}:{}: {e}",
                settings.listen, settings.port
            );
            return ExitCode::from(EXIT_CRASH);
        }
    };
    let (uid, gid) = ids();
    // Watched from before the probes run, which may use up the unit's task limit.
    let live = live::LiveConfig::new(
        std::env::var_os("OPENCLAW_CONFIG_PATH")
            .map_or_else(|| settings.config_path.clone(), std::path::PathBuf::from),
        std::fs::read(&settings.config_path).unwrap_or_default(),
    );
    let poll = settings
        .switches
        .config_poll_ms
        .map_or(live::POLL, Duration::from_millis);
    live.watch(poll, || {
        close_sessions_and_exit("a configuration change that needs a restart")
    });
    let probe = run_probe(&settings.switches.probe);
    let workspace = settings
        .state_dir
        .as_deref()
        .map(|d| workspace_listing(&std::path::Path::new(d).join("workspace")))
        .unwrap_or(serde_json::Value::Null);
    let state = Arc::new(State {
        stopping: AtomicBool::new(false),
        live,
        workspace,
        secrets,
        connections: rpc::Connections::default(),
        env_password: std::env::var("OPENCLAW_GATEWAY_PASSWORD")
            .ok()
            .filter(|p| !p.is_empty()),
        ready: AtomicBool::new(false),
        started: Instant::now(),
        started_unix_ms: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis())
            .unwrap_or(0),
        uid,
        gid,
        probe,
        settings,
    });
    eprintln!(
        "clawfleet-test-gateway: listening on {}:{} config={} label={} start_us={}",
        state.settings.listen,
        state.settings.port,
        state.settings.config_path.display(),
        state.settings.switches.label.as_deref().unwrap_or("-"),
        entered.elapsed().as_micros()
    );
    // Set once; nothing else sets it.
    STATE.get_or_init(|| Arc::clone(&state));
    start_timers(&state);
    for conn in listener.incoming() {
        match conn {
            Ok(stream) => {
                let state = Arc::clone(&state);
                // Under the unit's task limit a thread may not start: that connection is
                // dropped (its client retries), the gateway goes on.
                if let Err(e) = std::thread::Builder::new().spawn(move || handle(stream, &state)) {
                    eprintln!(
                        "clawfleet-test-gateway: cannot start a thread for a connection: {e}"
                    );
                }
            }
            Err(e) => eprintln!("clawfleet-test-gateway: accept failed: {e}"),
        }
    }
    ExitCode::from(EXIT_CRASH)
}

/// The `logLines` and `logBytes` switches: lines on stderr, which systemd sends to the journal.
fn write_logs(sw: &config::Switches) {
    use std::io::Write;
    let password = std::env::var("OPENCLAW_GATEWAY_PASSWORD").unwrap_or_default();
    let mut err = std::io::stderr().lock();
    for line in &sw.log_lines {
        let line = config::expand_env(&line.replace("${PASSWORD}", &password), |name| {
            std::env::var(name).ok()
        });
        let _ = writeln!(err, "{line}");
    }
    let _ = err.flush();
    drop(err);
    if sw.log_bytes > 0 {
        // In the background, so the gateway listens at once; 40 KB lines stay under
        // journald's line limit (48 KiB) and, being few, under its rate limit.
        let total = sw.log_bytes;
        std::thread::spawn(move || {
            let mut err = std::io::stderr().lock();
            let (mut written, mut n) = (0u64, 0u64);
            while written < total {
                let line = format!("filler line {n:012} {}", "x".repeat(40_000));
                let _ = writeln!(err, "{line}");
                written += line.len() as u64 + 1;
                n += 1;
            }
            let _ = err.flush();
        });
    }
}

/// The `secretLogLines` switch: lines with the held secret values, on stderr (the journal).
fn write_secret_log_lines(secrets: &secrets::Runtime, lines: &[String]) {
    use std::io::Write;
    let mut err = std::io::stderr().lock();
    for line in lines {
        let _ = writeln!(err, "{}", secrets.expand(line));
    }
    let _ = err.flush();
}

/// Runs the isolation probes once, before serving, as the gateway's own user in its unit.
fn run_probe(probe: &config::Probe) -> serde_json::Value {
    let mut commands = serde_json::Map::new();
    for (name, cmd) in &probe.commands {
        let result = match std::process::Command::new("/bin/sh")
            .args(["-c", cmd])
            .stdin(std::process::Stdio::null())
            .output()
        {
            Ok(out) => json!({
                "status": out.status.code(),
                "stdout": String::from_utf8_lossy(&out.stdout),
                "stderr": String::from_utf8_lossy(&out.stderr),
            }),
            Err(e) => {
                json!({"status": null, "stdout": "", "stderr": format!("cannot run /bin/sh: {e}")})
            }
        };
        commands.insert(name.clone(), result);
    }
    let mut binds = serde_json::Map::new();
    for port in &probe.bind_ports {
        let result = match TcpListener::bind(SocketAddrV4::new(Ipv4Addr::LOCALHOST, *port)) {
            Ok(_) => json!({"ok": true, "errno": null, "error": null}),
            Err(e) => json!({"ok": false, "errno": e.raw_os_error(), "error": e.to_string()}),
        };
        binds.insert(port.to_string(), result);
    }
    json!({"commands": commands, "binds": binds})
}

/// Readiness and crash timers, so the HTTP side only reads a flag.
fn start_timers(state: &Arc<State>) {
    let sw = &state.settings.switches;
    if !sw.never_ready {
        if sw.ready_after_ms == 0 {
            state.ready.store(true, Ordering::SeqCst);
        } else {
            let delay = Duration::from_millis(sw.ready_after_ms);
            let state = Arc::clone(state);
            std::thread::spawn(move || {
                std::thread::sleep(delay);
                state.ready.store(true, Ordering::SeqCst);
                eprintln!("clawfleet-test-gateway: ready");
            });
        }
    }
    if let Some(ms) = sw.crash_after_ms {
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(ms));
            eprintln!("clawfleet-test-gateway: crashAfterMs={ms} elapsed, exiting 1");
            std::process::exit(i32::from(EXIT_CRASH));
        });
    }
}

/// Effective uid and gid from /proc/self/status (std has no getuid).
fn ids() -> (Option<u32>, Option<u32>) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|rest| rest.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
    };
    (field("Uid:"), field("Gid:"))
}

fn handle(stream: TcpStream, state: &State) {
    if state.stopping.load(Ordering::SeqCst) {
        return;
    }
    let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
    let mut reader = BufReader::new(&stream);
    let mut request_line = String::new();
    if reader.read_line(&mut request_line).is_err() {
        return;
    }
    // Read the header block (bounded); names are lower-cased.
    let mut headers: Vec<(String, String)> = Vec::new();
    let mut header = String::new();
    for _ in 0..100 {
        header.clear();
        match reader.read_line(&mut header) {
            Ok(0) | Err(_) => break,
            Ok(_) if header == "\r\n" || header == "\n" => break,
            Ok(_) => {
                if let Some((name, value)) = header.split_once(':') {
                    headers.push((name.trim().to_ascii_lowercase(), value.trim().to_owned()));
                }
            }
        }
    }
    let mut parts = request_line.split_whitespace();
    let method = parts.next().unwrap_or("");
    let path = parts.next().unwrap_or("");
    let header_value = |name: &str| {
        headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    };
    let wants_upgrade =
        header_value("upgrade").is_some_and(|v| v.eq_ignore_ascii_case("websocket"));
    if method == "GET" && path == UI_PATH {
        let mut out = &stream;
        let _ = write!(
            out,
            "HTTP/1.1 200 OK\r\nContent-Type: text/html; charset=utf-8\r\nContent-Length: {}\r\n\
             Connection: close\r\n\r\n{UI_PAGE}",
            UI_PAGE.len()
        );
        return;
    }
    if method == "GET" && path == AUTH_PATH {
        let body = auth_report(&headers, state.env_password.as_deref()).to_string();
        let mut out = &stream;
        let _ = write!(
            out,
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\
             Connection: close\r\n\r\n{body}",
            body.len()
        );
        return;
    }
    if method == "GET" && wants_upgrade && path == ECHO_PATH {
        echo(reader, &stream, header_value("sec-websocket-key"));
        return;
    }
    if method == "GET" && wants_upgrade {
        upgrade(reader, &stream, state, header_value("sec-websocket-key"));
        return;
    }
    let (status, body) = route(method, path, state);
    let reason = match status {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        _ => "Service Unavailable",
    };
    let response = format!(
        "HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n{body}",
        body.len()
    );
    let mut stream = stream;
    let _ = stream.write_all(response.as_bytes());
}

/// The test-only echo WebSocket (no authentication: it only returns what it is sent).
const ECHO_PATH: &str = "/x-clawfleet-test/echo";

/// A test-only page (the stand-in of the Control UI): it opens the echo WebSocket next to it
/// (a relative URL, so it works below any path prefix), sends a line and shows the answer.
const UI_PATH: &str = "/x-clawfleet-test/ui";

const UI_PAGE: &str = r#"<!doctype html>
<html><head><meta charset="utf-8"><title>test gateway</title></head>
<body><h1>test gateway</h1><p id="out">connecting</p>
<script>
const u = new URL("echo", location.href);
u.protocol = u.protocol === "https:" ? "wss:" : "ws:";
const ws = new WebSocket(u);
ws.onopen = () => ws.send("hello through the route");
ws.onmessage = (e) => { document.getElementById("out").textContent = "echo: " + e.data; };
ws.onerror = () => { document.getElementById("out").textContent = "websocket error"; };
</script></body></html>
"#;

/// A test-only report of what authenticated a request (never a credential's value):
/// whether `Authorization` is `Bearer` and the gateway's password, and which of the
/// caller's credentials reached the gateway.
const AUTH_PATH: &str = "/x-clawfleet-test/auth";

fn auth_report(headers: &[(String, String)], password: Option<&str>) -> serde_json::Value {
    let get = |name: &str| {
        headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    };
    let authorization = match (get("authorization"), password) {
        (None, _) => "absent",
        (Some(v), Some(p)) if v.strip_prefix("Bearer ") == Some(p) => "gateway-password",
        (Some(_), _) => "other",
    };
    json!({
        "authorization": authorization,
        "cookie": get("cookie").is_some(),
        "headers": headers.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(),
    })
}

/// The echo WebSocket: every data frame comes back as sent ([`ws::echo`]).
fn echo(mut reader: BufReader<&TcpStream>, stream: &TcpStream, key: Option<&str>) {
    let mut out = stream;
    let Some(key) = key.filter(|k| !k.is_empty()) else {
        let _ = write!(
            out,
            "HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        );
        return;
    };
    // A byte path under test may pause longer than the request timeout.
    let _ = stream.set_read_timeout(None);
    if write!(
        out,
        "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Accept: {}\r\n\r\n",
        ws::accept_key(key)
    )
    .is_ok()
    {
        let _ = ws::echo(&mut reader, &mut out);
    }
}

/// The WebSocket upgrade (any path, as the gateway's port serves its RPC on all of them), then
/// the RPC session on this thread until the client leaves.
fn upgrade(
    mut reader: BufReader<&TcpStream>,
    stream: &TcpStream,
    state: &State,
    key: Option<&str>,
) {
    let mut out = stream;
    let Some(key) = key.filter(|k| !k.is_empty()) else {
        let body = json!({"error": "Sec-WebSocket-Key is missing"}).to_string();
        let _ = write!(
            out,
            "HTTP/1.1 400 Bad Request\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\
             Connection: close\r\n\r\n{body}",
            body.len()
        );
        return;
    };
    // Stopping since the request came in: no 101 (see `State::stopping`).
    if state.stopping.load(Ordering::SeqCst) {
        return;
    }
    let accepted = write!(
        out,
        "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Accept: {}\r\n\r\n",
        ws::accept_key(key)
    );
    if accepted.is_err() {
        return;
    }
    let ctx = rpc::Context {
        secrets: &state.secrets,
        connections: &state.connections,
        env_password: state.env_password.as_deref(),
        auth_none: state.settings.auth_none,
        label: state.settings.switches.label.as_deref(),
        live: &state.live,
        secret_log_lines: &state.settings.switches.secret_log_lines,
    };
    rpc::serve(&mut reader, stream, &ctx);
}

fn route(method: &str, path: &str, state: &State) -> (u16, String) {
    if method != "GET" && method != "HEAD" {
        return (405, json!({"error": "method not allowed"}).to_string());
    }
    let ready = state.ready.load(Ordering::SeqCst);
    match path {
        "/readyz" if ready => (200, json!({"ready": true, "failing": []}).to_string()),
        "/readyz" => (
            503,
            json!({"ready": false, "failing": ["startup"]}).to_string(),
        ),
        "/healthz" => (200, json!({"ok": true, "status": "live"}).to_string()),
        "/info" => (200, info(state, ready).to_string()),
        "/secrets" => (200, state.secrets.status_json().to_string()),
        _ => (404, json!({"error": "not found"}).to_string()),
    }
}

fn info(state: &State, ready: bool) -> serde_json::Value {
    let s = &state.settings;
    json!({
        "pid": std::process::id(),
        "uid": state.uid,
        "gid": state.gid,
        "port": s.port,
        "configPath": s.config_path.to_string_lossy(),
        // The configuration in effect: the one it started with, or one applied live since.
        "configSha256": state.live.applied_sha256(),
        "startConfigSha256": s.config_sha256,
        "liveReloads": state.live.reloads(),
        "label": s.switches.label,
        "passwordSha256": s.password_sha256,
        "stateDir": s.state_dir,
        "home": s.home,
        "cwd": std::env::current_dir().ok().map(|p| p.to_string_lossy().into_owned()),
        "startedAtUnixMs": state.started_unix_ms as u64,
        "uptimeMs": state.started.elapsed().as_millis() as u64,
        "ready": ready,
        "probe": state.probe,
        "workspaceAtStart": state.workspace,
        "secrets": state.secrets.status_json(),
        // What a host's before-workload-start hooks handed over (the tests name them HOOK_*).
        "hookEnv": std::env::vars()
            .filter(|(k, _)| k.starts_with("HOOK_"))
            .collect::<std::collections::BTreeMap<String, String>>(),
    })
}

/// Every regular file under the workspace (at most 64, 4 levels deep) with its sha256, mode
/// and owner, keyed by its path relative to the workspace; links and special files are
/// listed by kind and never opened. `null` when there is no workspace directory.
fn workspace_listing(root: &std::path::Path) -> serde_json::Value {
    use sha2::Digest;
    use std::os::unix::fs::MetadataExt;
    fn walk(
        dir: &std::path::Path,
        prefix: &str,
        depth: usize,
        out: &mut serde_json::Map<String, serde_json::Value>,
    ) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for e in entries.flatten() {
            if out.len() >= 64 {
                return;
            }
            let name = format!("{prefix}{}", e.file_name().to_string_lossy());
            let Ok(meta) = std::fs::symlink_metadata(e.path()) else {
                continue;
            };
            let mode = format!("{:o}", meta.mode() & 0o7777);
            if meta.is_dir() {
                out.insert(
                    name.clone(),
                    json!({"kind": "dir", "mode": mode, "uid": meta.uid()}),
                );
                if depth < 4 {
                    walk(&e.path(), &format!("{name}/"), depth + 1, out);
                }
            } else if meta.is_file() {
                let sha = std::fs::read(e.path())
                    .map(|b| {
                        sha2::Sha256::digest(&b)
                            .iter()
                            .map(|x| format!("{x:02x}"))
                            .collect::<String>()
                    })
                    .unwrap_or_default();
                out.insert(
                    name,
                    json!({"kind": "file", "sha256": sha, "mode": mode, "uid": meta.uid()}),
                );
            } else {
                out.insert(
                    name,
                    json!({"kind": "other", "mode": mode, "uid": meta.uid()}),
                );
            }
        }
    }
    if !root.is_dir() {
        return serde_json::Value::Null;
    }
    let mut out = serde_json::Map::new();
    walk(root, "", 1, &mut out);
    serde_json::Value::Object(out)
}
