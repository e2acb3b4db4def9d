//! The real [`System`]: shadow-utils account tools, `lchown`, systemd over the system D-Bus
//! (zbus + zbus_systemd, never `systemctl`) and a hand-written loopback HTTP probe.
//!
//! The trait is synchronous, so [`RealSystem`] owns a current-thread tokio runtime and drives
//! D-Bus calls with `block_on`. Its methods must therefore not be called from inside another
//! tokio runtime's async context (use a plain thread or `spawn_blocking`).

use std::ffi::OsStr;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Mutex, mpsc};
use std::time::{Duration, Instant};

use zbus::export::futures_core::Stream;
use zbus_systemd::systemd1::{ManagerProxy, ServiceProxy, UnitProxy};

use crate::system::{Ids, System, SystemError, UnitState};

/// Where the account tools are looked up; never the caller's `PATH`.
pub const SAFE_PATH: &str = "/usr/sbin:/usr/bin:/sbin:/bin";

/// The system bus socket whose absence `missing_tools` reports as `dbus`.
pub const SYSTEM_BUS_SOCKET: &str = "/run/dbus/system_bus_socket";

/// The account tools hostd runs.
pub const ACCOUNT_TOOLS: [&str; 3] = ["useradd", "userdel", "groupdel"];

/// How long an account tool may run before it is killed.
const TOOL_TIMEOUT: Duration = Duration::from_secs(60);
/// How much of a tool's stdout and stderr is kept (for the log only).
const TOOL_OUTPUT_MAX: usize = 16 * 1024;
/// Limit for one plain D-Bus call (not a job wait). `Reload` can take a while on big hosts.
const BUS_CALL_TIMEOUT: Duration = Duration::from_secs(90);
/// Longest status line the probe reads.
const STATUS_LINE_MAX: usize = 512;

/// The [`System`] of a real host. Construct once and share; the D-Bus connection is opened on
/// first use, so `probe` and account work succeed on hosts without a bus.
#[derive(Debug)]
pub struct RealSystem {
    runtime: tokio::runtime::Runtime,
    bus: Mutex<Option<zbus::Connection>>,
    tool_timeout: Duration,
    call_timeout: Duration,
    /// [`System::netns_support`], probed once per process.
    netns_support: std::sync::OnceLock<Result<(), String>>,
}

impl RealSystem {
    /// A real system with the default limits.
    pub fn new() -> Result<Self, SystemError> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| SystemError::Bus(format!("cannot start the D-Bus runtime: {e}")))?;
        Ok(Self {
            runtime,
            bus: Mutex::new(None),
            tool_timeout: TOOL_TIMEOUT,
            call_timeout: BUS_CALL_TIMEOUT,
            netns_support: std::sync::OnceLock::new(),
        })
    }

    /// The shared connection, opened (and `Subscribe`d, so systemd emits job signals) on first
    /// use. A failed attempt is not cached: the next call tries again.
    fn connection(&self) -> Result<zbus::Connection, SystemError> {
        let mut slot = self.bus.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(conn) = slot.as_ref() {
            return Ok(conn.clone());
        }
        let timeout = self.call_timeout;
        let conn = self.runtime.block_on(async move {
            let fut = async {
                let conn = zbus::connection::Builder::system()
                    .method_timeout(timeout)
                    .build()
                    .await?;
                let manager = manager(&conn).await?;
                manager.subscribe().await?;
                Ok::<_, zbus::Error>(conn)
            };
            match tokio::time::timeout(timeout, fut).await {
                Ok(Ok(conn)) => Ok(conn),
                Ok(Err(e)) => Err(SystemError::Bus(bus_detail(&e))),
                Err(_) => Err(SystemError::Bus(format!(
                    "no answer from the system bus within {} s",
                    timeout.as_secs()
                ))),
            }
        })?;
        *slot = Some(conn.clone());
        Ok(conn)
    }

    /// Forgets the connection after a transport failure, so the next call reconnects (for
    /// example after dbus-daemon restarted).
    fn drop_connection_if_broken(&self, e: &zbus::Error) {
        if !matches!(e, zbus::Error::MethodError(..) | zbus::Error::FDO(_)) {
            let mut slot = self.bus.lock().unwrap_or_else(|p| p.into_inner());
            *slot = None;
        }
    }

    /// Runs one D-Bus conversation with the call timeout, mapping failures with `on_error`.
    fn bus_call<T, F, Fut>(
        &self,
        f: F,
        on_error: impl FnOnce(&zbus::Error) -> Result<T, SystemError>,
        on_timeout: impl FnOnce() -> SystemError,
    ) -> Result<T, SystemError>
    where
        F: FnOnce(zbus::Connection) -> Fut,
        Fut: Future<Output = zbus::Result<T>>,
    {
        let conn = self.connection()?;
        let timeout = self.call_timeout;
        let result = self
            .runtime
            .block_on(async move { tokio::time::timeout(timeout, f(conn)).await });
        match result {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => {
                self.drop_connection_if_broken(&e);
                on_error(&e)
            }
            Err(_) => Err(on_timeout()),
        }
    }

    /// Queues a job with `queue` and waits for its `JobRemoved`. The signal stream exists
    /// before the job is queued, so a job that finishes at once is not missed.
    /// `Ok(None)` means the unit was not loaded (only possible for stop).
    fn run_job<Q, Fut>(
        &self,
        action: &'static str,
        unit: &str,
        timeout: Duration,
        queue: Q,
    ) -> Result<Option<String>, SystemError>
    where
        Q: FnOnce(ManagerProxy<'static>) -> Fut,
        Fut: Future<Output = zbus::Result<zbus::OwnedObjectPath>>,
    {
        let conn = self.connection()?;
        let unit_name = unit.to_owned();
        let outcome = self.runtime.block_on(async move {
            let deadline = tokio::time::Instant::now() + timeout;
            let manager = manager(&conn).await.map_err(JobFailure::Bus)?;
            let mut removed = manager
                .receive_job_removed()
                .await
                .map_err(JobFailure::Bus)?;
            let job = match tokio::time::timeout_at(deadline, queue(manager.clone())).await {
                Err(_) => return Err(JobFailure::Timeout),
                Ok(Err(e)) => return Err(JobFailure::Bus(e)),
                Ok(Ok(job)) => job,
            };
            loop {
                let next = std::future::poll_fn(|cx| Pin::new(&mut removed).poll_next(cx));
                let signal = match tokio::time::timeout_at(deadline, next).await {
                    Err(_) => return Err(JobFailure::Timeout),
                    Ok(None) => {
                        return Err(JobFailure::Bus(zbus::Error::Failure(
                            "the signal stream ended".into(),
                        )));
                    }
                    Ok(Some(signal)) => signal,
                };
                let Ok(args) = signal.args() else { continue };
                if args.job.as_str() == job.as_str() {
                    return Ok(args.result.to_string());
                }
            }
        });
        match outcome {
            Ok(result) => Ok(Some(result)),
            Err(JobFailure::Timeout) => Err(SystemError::JobTimeout {
                unit: unit_name,
                seconds: whole_seconds(timeout),
            }),
            Err(JobFailure::Bus(e)) => {
                self.drop_connection_if_broken(&e);
                if action == "stop" && is_no_such_unit(&e) {
                    return Ok(None);
                }
                Err(systemd_error(action, unit, &e))
            }
        }
    }

    /// A unit's `MainPID` and `ControlGroup`, for a relaunch in place.
    fn main_and_group(&self, unit: &str) -> Result<(u32, String), SystemError> {
        let name = unit.to_owned();
        self.bus_call(
            |conn| async move {
                let manager = manager(&conn).await?;
                let path = manager.get_unit(name).await?;
                let service = ServiceSnapshot::read(&conn, path).await?;
                Ok((
                    service.get::<u32>("MainPID")?,
                    service.get::<&str>("ControlGroup")?.to_owned(),
                ))
            },
            |e| Err(systemd_error("relaunch", unit, e)),
            || bus_timeout(self.call_timeout),
        )
    }

    /// Sends `signal` to a unit's main process (`KillUnit` with `main`).
    fn kill_main(&self, unit: &str, signal: nix::sys::signal::Signal) -> Result<(), SystemError> {
        let name = unit.to_owned();
        self.bus_call(
            |conn| async move {
                let manager = manager(&conn).await?;
                manager
                    .kill_unit(name, "main".to_owned(), signal as i32)
                    .await
            },
            |e| Err(systemd_error("relaunch", unit, e)),
            || bus_timeout(self.call_timeout),
        )
    }
}

/// Why waiting for a job ended without a result.
enum JobFailure {
    Bus(zbus::Error),
    Timeout,
}

const NO_SUCH_UNIT: &str = "org.freedesktop.systemd1.NoSuchUnit";
const FILE_NOT_FOUND: &str = "org.freedesktop.DBus.Error.FileNotFound";

async fn manager(conn: &zbus::Connection) -> zbus::Result<ManagerProxy<'static>> {
    ManagerProxy::builder(conn)
        .cache_properties(zbus::proxy::CacheProperties::No)
        .build()
        .await
}

/// The D-Bus error name of an error reply, if it is one. zbus reports the standard
/// `org.freedesktop.DBus.Error.*` names (which systemd uses for ENOENT and friends) as
/// `Error::FDO`, and every other name as `Error::MethodError`.
fn error_name(e: &zbus::Error) -> Option<String> {
    use zbus::DBusError;
    match e {
        zbus::Error::MethodError(name, _, _) => Some(name.to_string()),
        zbus::Error::FDO(fdo) => Some(fdo.name().to_string()),
        _ => None,
    }
}

/// Whether systemd answered that the unit or its file does not exist.
fn is_no_such_unit(e: &zbus::Error) -> bool {
    error_name(e).is_some_and(|n| n == NO_SUCH_UNIT || n == FILE_NOT_FOUND)
}

/// A short, safe description of a bus error: the error name and systemd's own message
/// (no secrets there), cleaned of control characters and shortened.
fn bus_detail(e: &zbus::Error) -> String {
    use zbus::DBusError;
    let text = match e {
        zbus::Error::MethodError(name, Some(message), _) => format!("{name}: {message}"),
        zbus::Error::MethodError(name, None, _) => name.to_string(),
        zbus::Error::FDO(fdo) => match fdo.description() {
            Some(d) => format!("{}: {d}", fdo.name()),
            None => fdo.name().to_string(),
        },
        other => other.to_string(),
    };
    sanitize(&text, 240)
}

fn systemd_error(action: &'static str, unit: &str, e: &zbus::Error) -> SystemError {
    SystemError::Systemd {
        action,
        unit: unit.to_owned(),
        detail: bus_detail(e),
    }
}

/// Replaces control characters and cuts the text to `max` characters.
fn sanitize(text: &str, max: usize) -> String {
    clawfleet_protocol::text::clean(text, max)
}

/// Unit names hostd may hand to systemd: plain names, no paths, templates or odd bytes.
fn check_unit_name(action: &'static str, unit: &str) -> Result<(), SystemError> {
    let ok = !unit.is_empty()
        && unit.len() <= 255
        && unit.contains('.')
        && !unit.starts_with('.')
        && !unit.starts_with('-')
        && unit
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-' | b'@' | b':'));
    if ok {
        Ok(())
    } else {
        Err(SystemError::Systemd {
            action,
            unit: sanitize(unit, 80),
            detail: "not a valid unit name".into(),
        })
    }
}

/// Account names the tools accept without surprises: `[a-z_][a-z0-9_-]*`, at most 32 bytes.
/// A leading `-` would be read as an option, so it is refused before any tool runs.
fn check_account_name(tool: &'static str, name: &str) -> Result<(), SystemError> {
    let mut bytes = name.bytes();
    let ok = name.len() <= 32
        && bytes
            .next()
            .is_some_and(|b| b.is_ascii_lowercase() || b == b'_')
        && bytes.all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'_' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(SystemError::AccountTool {
            tool,
            account: sanitize(name, 40),
            detail: "not a valid account name".into(),
        })
    }
}

/// The absolute path of `tool` on [`SAFE_PATH`], if it is an executable file there.
pub fn find_tool(tool: &str) -> Option<PathBuf> {
    SAFE_PATH.split(':').map(Path::new).find_map(|dir| {
        let p = dir.join(tool);
        let meta = std::fs::metadata(&p).ok()?;
        (meta.is_file() && meta.permissions().mode() & 0o111 != 0).then_some(p)
    })
}

/// What is known about a failed tool: a fixed phrase per documented exit status of the
/// shadow-utils tools, never their output.
fn exit_meaning(tool: &str, code: i32) -> Option<&'static str> {
    Some(match (tool, code) {
        (_, 1) => "cannot update the password file",
        (_, 2) => "invalid command syntax",
        (_, 3) => "invalid argument to an option",
        ("useradd", 4) => "uid already in use",
        ("useradd", 6) => "the group does not exist",
        ("userdel", 6) => "the user does not exist",
        ("groupdel", 6) => "the group does not exist",
        ("userdel", 8) => "the user is logged in",
        ("groupdel", 8) => "the group is the primary group of an existing user",
        ("useradd", 9) => "the user or group name is already in use",
        (_, 10) => "cannot update the group file",
        (_, 12) => "cannot create or remove the home directory",
        (_, 14) => "cannot update the SELinux user mapping",
        _ => return None,
    })
}

/// How one tool run ended, described without its output.
#[derive(Debug)]
enum ToolFailure {
    Missing,
    Spawn(std::io::ErrorKind),
    TimedOut(Duration),
    Exit(ExitStatus),
}

/// Runs a tool from [`SAFE_PATH`] with a clean environment, no shell, no stdin, bounded time
/// and bounded captured output. The output goes only to the debug log, shortened.
fn run_tool(tool: &'static str, args: &[&OsStr], limit: Duration) -> Result<(), ToolFailure> {
    let path = find_tool(tool).ok_or(ToolFailure::Missing)?;
    let mut child = Command::new(&path)
        .args(args)
        // Its own process group, so a timeout can kill whatever the tool started too.
        .process_group(0)
        .env_clear()
        .env("PATH", SAFE_PATH)
        .env("LC_ALL", "C")
        .current_dir("/")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| ToolFailure::Spawn(e.kind()))?;
    let readers = [
        child.stdout.take().map(|s| drain(Box::new(s))),
        child.stderr.take().map(|s| drain(Box::new(s))),
    ];
    let status = wait_bounded(&mut child, limit);
    // A descendant that left the process group could hold the pipes open forever: wait for
    // the readers only briefly, then leave them behind.
    let mut captured = Vec::new();
    for reader in readers.into_iter().flatten() {
        if let Ok(bytes) = reader.recv_timeout(Duration::from_secs(1)) {
            captured.extend_from_slice(&bytes);
        }
    }
    if !captured.is_empty() {
        tracing::debug!(
            tool,
            output = %sanitize(&String::from_utf8_lossy(&captured), 300),
            "account tool output"
        );
    }
    match status {
        Some(Ok(s)) if s.success() => Ok(()),
        Some(Ok(s)) => Err(ToolFailure::Exit(s)),
        Some(Err(e)) => Err(ToolFailure::Spawn(e.kind())),
        None => Err(ToolFailure::TimedOut(limit)),
    }
}

/// Reads a pipe to its end on a thread, keeping at most [`TOOL_OUTPUT_MAX`] bytes (the rest
/// is read and dropped, so the child never blocks on a full pipe).
fn drain(mut pipe: Box<dyn Read + Send>) -> mpsc::Receiver<Vec<u8>> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut kept = Vec::new();
        let mut buf = [0u8; 4096];
        loop {
            match pipe.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    let room = TOOL_OUTPUT_MAX.saturating_sub(kept.len());
                    kept.extend_from_slice(&buf[..n.min(room)]);
                }
            }
        }
        let _ = tx.send(kept);
    });
    rx
}

/// Waits for the child up to `limit`; on timeout kills its process group, reaps it and
/// returns `None`.
fn wait_bounded(child: &mut Child, limit: Duration) -> Option<std::io::Result<ExitStatus>> {
    let deadline = Instant::now() + limit;
    let mut pause = Duration::from_millis(2);
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return Some(Ok(status)),
            Ok(None) if Instant::now() >= deadline => {
                if let Ok(pid) = i32::try_from(child.id()) {
                    let _ = nix::sys::signal::killpg(
                        nix::unistd::Pid::from_raw(pid),
                        nix::sys::signal::Signal::SIGKILL,
                    );
                }
                let _ = child.kill();
                let _ = child.wait();
                return None;
            }
            Ok(None) => {
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(50));
            }
            Err(e) => return Some(Err(e)),
        }
    }
}

/// Runs one account tool (`useradd`, …) for `account` the way Agent accounts are made, for
/// `hostd enrol --login-user`.
pub(crate) fn run_account_tool(
    tool: &'static str,
    args: &[&OsStr],
    account: &str,
) -> Result<(), SystemError> {
    run_tool(tool, args, Duration::from_secs(30)).map_err(|f| tool_error(tool, account, &f))
}

fn tool_error(tool: &'static str, account: &str, failure: &ToolFailure) -> SystemError {
    let detail = match failure {
        ToolFailure::Missing => format!("{tool} is not installed in {SAFE_PATH}"),
        ToolFailure::Spawn(kind) => format!("cannot run {tool}: {kind}"),
        ToolFailure::TimedOut(d) => format!("{tool} did not finish within {} s", d.as_secs()),
        ToolFailure::Exit(status) => match status.code() {
            Some(code) => match exit_meaning(tool, code) {
                Some(meaning) => format!("exit status {code} ({meaning})"),
                None => format!("exit status {code}"),
            },
            None => "killed by a signal".into(),
        },
    };
    SystemError::AccountTool {
        tool,
        account: account.to_owned(),
        detail,
    }
}

fn lookup_error(account: &str, detail: impl std::fmt::Display) -> SystemError {
    SystemError::Lookup {
        account: account.to_owned(),
        detail: detail.to_string(),
    }
}

/// Reads the status code from an HTTP/1.x status line.
fn parse_status_line(line: &[u8]) -> Option<u16> {
    let rest = line
        .strip_prefix(b"HTTP/1.1 ")
        .or_else(|| line.strip_prefix(b"HTTP/1.0 "))?;
    let code = rest.get(..3)?;
    if !code.iter().all(u8::is_ascii_digit) {
        return None;
    }
    match rest.get(3) {
        None | Some(b' ') | Some(b'\r') | Some(b'\n') => {}
        Some(_) => return None,
    }
    std::str::from_utf8(code).ok()?.parse().ok()
}

/// One loopback `GET /readyz` under one overall deadline; the HTTP status, if one came back.
/// The listening sockets on `port` in the calling thread's network namespace.
fn listeners_here(port: u16) -> Result<Vec<crate::listener::Listener>, SystemError> {
    match crate::sock_diag::listeners(port) {
        Ok(found) => return Ok(found),
        // A kernel without sock_diag for TCP: the slower /proc files say the same.
        Err(e) => tracing::debug!("{e}; reading /proc/thread-self/net/tcp instead"),
    }
    let mut all = Vec::new();
    // thread-self: the namespace of this thread, which may have entered an Agent's.
    for path in ["/proc/thread-self/net/tcp", "/proc/thread-self/net/tcp6"] {
        match std::fs::read_to_string(path) {
            Ok(text) => all.extend(crate::listener::parse(&text, port)),
            // No IPv6 on this host: no IPv6 listeners.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && path.ends_with('6') => {}
            Err(e) => {
                return Err(SystemError::Sockets {
                    path: path.to_owned(),
                    detail: e.to_string(),
                });
            }
        }
    }
    Ok(all)
}

pub fn probe_status(port: u16, timeout: Duration) -> Option<u16> {
    let deadline = Instant::now() + timeout;
    let remaining = || {
        deadline
            .checked_duration_since(Instant::now())
            .filter(|d| !d.is_zero())
    };
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let mut stream = TcpStream::connect_timeout(&addr, remaining()?).ok()?;
    stream.set_write_timeout(Some(remaining()?)).ok()?;
    stream
        .write_all(b"GET /readyz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        .ok()?;
    let mut line = Vec::with_capacity(64);
    let mut buf = [0u8; 256];
    loop {
        if let Some(end) = line.iter().position(|&b| b == b'\n') {
            return parse_status_line(&line[..=end]);
        }
        if line.len() >= STATUS_LINE_MAX {
            return None;
        }
        stream.set_read_timeout(Some(remaining()?)).ok()?;
        let n = stream.read(&mut buf).ok()?;
        if n == 0 {
            return None;
        }
        let room = STATUS_LINE_MAX - line.len();
        line.extend_from_slice(&buf[..n.min(room)]);
    }
}

impl System for RealSystem {
    fn user(&self, name: &str) -> Result<Option<Ids>, SystemError> {
        let user = nix::unistd::User::from_name(name).map_err(|e| lookup_error(name, e))?;
        let Some(user) = user else { return Ok(None) };
        let ids = Ids {
            uid: user.uid.as_raw(),
            gid: user.gid.as_raw(),
        };
        if ids.uid == 0 || ids.gid == 0 {
            return Err(lookup_error(
                name,
                "it has uid or gid 0, which hostd never uses",
            ));
        }
        Ok(Some(ids))
    }

    fn group(&self, name: &str) -> Result<Option<u32>, SystemError> {
        let group = nix::unistd::Group::from_name(name).map_err(|e| lookup_error(name, e))?;
        let Some(group) = group else { return Ok(None) };
        let gid = group.gid.as_raw();
        if gid == 0 {
            return Err(lookup_error(name, "it has gid 0, which hostd never uses"));
        }
        Ok(Some(gid))
    }

    fn id_in_use(&self, id: u32) -> Result<bool, SystemError> {
        let shown = || format!("uid/gid {id}");
        let user = nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(id))
            .map_err(|e| lookup_error(&shown(), e))?;
        let group = nix::unistd::Group::from_gid(nix::unistd::Gid::from_raw(id))
            .map_err(|e| lookup_error(&shown(), e))?;
        Ok(user.is_some() || group.is_some())
    }

    fn create_account(&self, name: &str, home: &Path, id: u32) -> Result<Ids, SystemError> {
        check_account_name("useradd", name)?;
        let home_ok = home.is_absolute()
            && home
                .to_str()
                .is_some_and(|h| !h.chars().any(|c| c == ':' || c.is_control()));
        if !home_ok {
            return Err(SystemError::AccountTool {
                tool: "useradd",
                account: name.to_owned(),
                detail:
                    "the home directory must be an absolute path without ':' or control characters"
                        .into(),
            });
        }
        let n = OsStr::new(name);
        let id_text = id.to_string();
        // `--user-group` gives the group the uid as gid only when that lies in the system
        // group range: the range is narrowed to exactly this id (`-K`), so the group gets it
        // or useradd fails. Same for the uid range, which only silences useradd's warning.
        let keys: Vec<std::ffi::OsString> =
            ["SYS_UID_MIN", "SYS_UID_MAX", "SYS_GID_MIN", "SYS_GID_MAX"]
                .iter()
                .flat_map(|k| [std::ffi::OsString::from("-K"), format!("{k}={id}").into()])
                .collect();
        let mut argv: Vec<&OsStr> = vec![
            OsStr::new("--system"),
            OsStr::new("--uid"),
            OsStr::new(&id_text),
        ];
        argv.extend(keys.iter().map(|k| k.as_os_str()));
        // One tool for user and group (`--user-group`): each run of an account tool costs
        // 15–30 ms, under the host lock.
        argv.extend([
            OsStr::new("--user-group"),
            OsStr::new("--home-dir"),
            home.as_os_str(),
            OsStr::new("--no-create-home"),
            OsStr::new("--shell"),
            OsStr::new("/usr/sbin/nologin"),
            n,
        ]);
        let added = run_tool("useradd", &argv, self.tool_timeout);
        if let Err(failure) = added {
            // useradd writes the group and the user together, but should a group of the name
            // be left (the caller checked that none existed), remove it so a retry starts
            // clean.
            if self.group(name).ok().flatten().is_some()
                && let Err(f) = run_tool("groupdel", &[n], self.tool_timeout)
            {
                tracing::warn!(account = name, failure = ?f, "could not roll back the group");
            }
            return Err(tool_error("useradd", name, &failure));
        }
        let ids = self
            .user(name)?
            .ok_or_else(|| lookup_error(name, "useradd succeeded but the user is not found"))?;
        let gid = self
            .group(name)?
            .ok_or_else(|| lookup_error(name, "useradd succeeded but the group is not found"))?;
        if gid != ids.gid {
            return Err(lookup_error(
                name,
                "the user's primary group is not the group of the same name",
            ));
        }
        if ids.uid != id || ids.gid != id {
            return Err(lookup_error(
                name,
                format!(
                    "useradd gave uid {} and gid {} instead of {id}",
                    ids.uid, ids.gid
                ),
            ));
        }
        Ok(ids)
    }

    /// Idempotent: a user that does not exist is already deleted.
    fn delete_user(&self, name: &str) -> Result<(), SystemError> {
        check_account_name("userdel", name)?;
        if nix::unistd::User::from_name(name)
            .map_err(|e| lookup_error(name, e))?
            .is_none()
        {
            return Ok(());
        }
        match run_tool("userdel", &[OsStr::new(name)], self.tool_timeout) {
            Ok(()) => Ok(()),
            Err(ToolFailure::Exit(s)) if s.code() == Some(6) => Ok(()),
            Err(f) => Err(tool_error("userdel", name, &f)),
        }
    }

    /// Idempotent: `userdel` already removes a same-named private group on Debian
    /// (`USERGROUPS_ENAB`), so an absent group is success.
    fn delete_group(&self, name: &str) -> Result<(), SystemError> {
        check_account_name("groupdel", name)?;
        if nix::unistd::Group::from_name(name)
            .map_err(|e| lookup_error(name, e))?
            .is_none()
        {
            return Ok(());
        }
        match run_tool("groupdel", &[OsStr::new(name)], self.tool_timeout) {
            Ok(()) => Ok(()),
            Err(ToolFailure::Exit(s)) if s.code() == Some(6) => Ok(()),
            Err(f) => Err(tool_error("groupdel", name, &f)),
        }
    }

    fn chown(&self, path: &Path, ids: Ids) -> Result<(), SystemError> {
        std::os::unix::fs::lchown(path, Some(ids.uid), Some(ids.gid)).map_err(|e| {
            SystemError::Chown {
                path: path.display().to_string(),
                detail: e.to_string(),
            }
        })
    }

    fn daemon_reload(&self) -> Result<(), SystemError> {
        let seconds = self.call_timeout.as_secs();
        self.bus_call(
            |conn| async move { manager(&conn).await?.reload().await },
            |e| Err(systemd_error("daemon-reload", "the manager", e)),
            || SystemError::JobTimeout {
                unit: "daemon-reload".into(),
                seconds,
            },
        )
    }

    /// Creates the `[Install]` links only; systemd reads them at the next boot or reload, and
    /// `UnitFileState` reflects them at once.
    fn enable_unit(&self, unit: &str) -> Result<(), SystemError> {
        check_unit_name("enable", unit)?;
        let name = unit.to_owned();
        self.bus_call(
            |conn| async move {
                manager(&conn)
                    .await?
                    .enable_unit_files(vec![name], false, false)
                    .await
                    .map(|_| ())
            },
            |e| Err(systemd_error("enable", unit, e)),
            || bus_timeout(self.call_timeout),
        )
    }

    fn disable_unit(&self, unit: &str) -> Result<(), SystemError> {
        check_unit_name("disable", unit)?;
        let name = unit.to_owned();
        self.bus_call(
            |conn| async move {
                manager(&conn)
                    .await?
                    .disable_unit_files(vec![name], false)
                    .await
                    .map(|_| ())
            },
            // No unit file at all: nothing can be enabled.
            |e| {
                if is_no_such_unit(e) {
                    Ok(())
                } else {
                    Err(systemd_error("disable", unit, e))
                }
            },
            || bus_timeout(self.call_timeout),
        )
    }

    fn reset_failed_unit(&self, unit: &str) -> Result<(), SystemError> {
        check_unit_name("reset-failed", unit)?;
        let name = unit.to_owned();
        self.bus_call(
            |conn| async move { manager(&conn).await?.reset_failed_unit(name).await },
            // Not loaded: nothing failed to forget.
            |e| {
                if is_no_such_unit(e) {
                    Ok(())
                } else {
                    Err(systemd_error("reset-failed", unit, e))
                }
            },
            || bus_timeout(self.call_timeout),
        )
    }

    fn restart_unit(&self, unit: &str, timeout: Duration) -> Result<(), SystemError> {
        check_unit_name("restart", unit)?;
        let name = unit.to_owned();
        let result = self.run_job("restart", unit, timeout, |m| async move {
            m.restart_unit(name, "replace".into()).await
        })?;
        job_result("restart", unit, result)
    }

    fn reload_unit(&self, unit: &str, timeout: Duration) -> Result<(), SystemError> {
        check_unit_name("reload", unit)?;
        let name = unit.to_owned();
        let result = self.run_job("reload", unit, timeout, |m| async move {
            m.reload_unit(name, "replace".into()).await
        })?;
        job_result("reload", unit, result)
    }

    fn stop_for_relaunch(&self, unit: &str, timeout: Duration) -> Result<u32, SystemError> {
        check_unit_name("relaunch", unit)?;
        let refuse = |detail: String| SystemError::Relaunch {
            unit: unit.to_owned(),
            detail,
        };
        let (main, cgroup) = self.main_and_group(unit)?;
        if main == 0 || !is_supervising_launcher(main) {
            return Err(refuse(format!(
                "its main process ({main}) is not hostd's supervising launcher"
            )));
        }
        let procs = crate::cgroup::procs_path(Path::new(crate::cgroup::ROOT), &cgroup)
            .ok_or_else(|| refuse(format!("no cgroup hierarchy lists its group {cgroup:?}")))?;
        let before: Vec<u32> = crate::cgroup::read_pids(&procs)
            .map_err(|e| refuse(format!("cannot read {}: {e}", procs.display())))?
            .into_iter()
            .filter(|p| *p != main)
            .collect();
        if before.is_empty() {
            // The launcher has not started the gateway yet (nor blocked its signals).
            return Err(refuse("no gateway runs under its launcher yet".to_owned()));
        }
        self.kill_main(unit, nix::sys::signal::Signal::SIGHUP)?;
        // The old gateway's processes are gone once none of them is in the unit any more.
        let deadline = Instant::now() + timeout;
        loop {
            let now = crate::cgroup::read_pids(&procs)
                .map_err(|e| refuse(format!("cannot read {}: {e}", procs.display())))?;
            if !before.iter().any(|p| now.contains(p)) {
                return Ok(main);
            }
            if Instant::now() >= deadline {
                return Err(SystemError::JobTimeout {
                    unit: unit.to_owned(),
                    seconds: whole_seconds(timeout),
                });
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    fn start_relaunched(&self, unit: &str, launcher: u32) -> Result<(), SystemError> {
        check_unit_name("relaunch", unit)?;
        let (main, _) = self.main_and_group(unit)?;
        if main != launcher {
            return Err(SystemError::Relaunch {
                unit: unit.to_owned(),
                detail: format!(
                    "its main process is {main} now, not the launcher {launcher} that stopped its gateway"
                ),
            });
        }
        self.kill_main(unit, crate::supervise::START)
    }

    fn stop_unit(&self, unit: &str, timeout: Duration) -> Result<(), SystemError> {
        check_unit_name("stop", unit)?;
        let name = unit.to_owned();
        let result = self.run_job("stop", unit, timeout, |m| async move {
            m.stop_unit(name, "replace".into()).await
        })?;
        job_result("stop", unit, result)
    }

    fn unit_state(&self, unit: &str) -> Result<UnitState, SystemError> {
        check_unit_name("status", unit)?;
        let name = unit.to_owned();
        let is_service = unit.ends_with(".service");
        self.bus_call(
            |conn| async move {
                let manager = manager(&conn).await?;
                // LoadUnit, not GetUnit: an unreferenced, stopped unit may be unloaded
                // although its file exists; LoadUnit reads it and says not-found otherwise.
                let path = manager.load_unit(name.clone()).await?;
                let unit = UnitProxy::builder(&conn)
                    .path(path.clone())
                    .cache_properties(zbus::proxy::CacheProperties::No)
                    .build()
                    .await?;
                let load_state = unit.load_state().await?;
                let mut state = UnitState {
                    active_state: unit.active_state().await?,
                    sub_state: unit.sub_state().await?,
                    loaded: load_state != "not-found",
                    ..UnitState::default()
                };
                // Read from disk each time: the property can lag behind EnableUnitFiles.
                state.enabled = match manager.get_unit_file_state(name).await {
                    Ok(s) => s == "enabled",
                    Err(e) if is_no_such_unit(&e) => false,
                    Err(e) => return Err(e),
                };
                if is_service && state.loaded {
                    let service = ServiceProxy::builder(&conn)
                        .path(path)
                        .cache_properties(zbus::proxy::CacheProperties::No)
                        .build()
                        .await?;
                    state.n_restarts = service.n_restarts().await?;
                    state.exec_main_status = service.exec_main_status().await?;
                }
                Ok(state)
            },
            |e| Err(systemd_error("status", unit, e)),
            || bus_timeout(self.call_timeout),
        )
    }

    fn unit_file_loaded(&self, unit: &str, file: &Path) -> Result<bool, SystemError> {
        check_unit_name("status", unit)?;
        let name = unit.to_owned();
        let Some(file) = file.to_str().map(str::to_owned) else {
            return Ok(false);
        };
        self.bus_call(
            |conn| async move {
                let manager = manager(&conn).await?;
                let path = manager.load_unit(name).await?;
                let unit = UnitProxy::builder(&conn)
                    .path(path)
                    .cache_properties(zbus::proxy::CacheProperties::No)
                    .build()
                    .await?;
                Ok(unit.load_state().await? == "loaded"
                    && unit.fragment_path().await? == file
                    && !unit.need_daemon_reload().await?)
            },
            |e| Err(systemd_error("status", unit, e)),
            || bus_timeout(self.call_timeout),
        )
    }

    fn systemd_version(&self) -> Result<String, SystemError> {
        self.bus_call(
            |conn| async move { manager(&conn).await?.version().await },
            |e| Err(SystemError::Bus(bus_detail(e))),
            || bus_timeout(self.call_timeout),
        )
    }

    fn probe_ready(&self, port: u16, timeout: Duration) -> bool {
        probe_status(port, timeout) == Some(200)
    }

    fn listeners(
        &self,
        port: u16,
        unit: Option<&str>,
    ) -> Result<Vec<crate::listener::Listener>, SystemError> {
        let Some(unit) = unit else {
            return listeners_here(port);
        };
        let fail = |e: crate::netns::NetnsError| SystemError::Sockets {
            path: format!("the network namespace of {unit}"),
            detail: e.to_string(),
        };
        match crate::netns::of_unit(unit).map_err(fail)? {
            None => Ok(Vec::new()),
            Some(file) => {
                crate::netns::run_in_file(file, unit.to_owned(), move || listeners_here(port))
                    .map_err(fail)?
            }
        }
    }

    fn netns_support(&self) -> Result<(), String> {
        self.netns_support.get_or_init(crate::netns::probe).clone()
    }

    fn netns_held(&self, net_unit: &str) -> bool {
        self.unit_state(net_unit).is_ok_and(|s| s.is_active())
    }

    fn start_unit(&self, unit: &str, timeout: Duration) -> Result<(), SystemError> {
        check_unit_name("start", unit)?;
        let name = unit.to_owned();
        let result = self.run_job("start", unit, timeout, |m| async move {
            m.start_unit(name, "replace".into()).await
        })?;
        job_result("start", unit, result)
    }

    fn unit_runtime(&self, unit: &str) -> Result<crate::system::UnitRuntime, SystemError> {
        let state = self.unit_state(unit)?;
        if !state.loaded {
            return Ok(crate::system::UnitRuntime {
                state,
                ..Default::default()
            });
        }
        let name = unit.to_owned();
        self.bus_call(
            |conn| async move {
                let manager = manager(&conn).await?;
                let path = manager.load_unit(name).await?;
                let unit = UnitProxy::builder(&conn)
                    .path(path.clone())
                    .cache_properties(zbus::proxy::CacheProperties::No)
                    .build()
                    .await?;
                // One GetAll of the Service interface: systemd builds the answer in one go, so
                // the exit code, status and time belong to the same run. Property by property,
                // a restart between two reads paired a new run's status 0 with the last
                // run's exit.
                let service = ServiceSnapshot::read(&conn, path).await?;
                let mut state = state;
                state.n_restarts = service.get("NRestarts")?;
                state.exec_main_status = service.get("ExecMainStatus")?;
                // systemd answers u64::MAX for what it does not track; an older systemd
                // lacks some properties altogether (MemoryPeak before 254).
                let tracked = |name: &str| service.get::<u64>(name).ok().filter(|v| *v != u64::MAX);
                let main_pid: u32 = service.get("MainPID")?;
                let (gateway_pid, gateway_start_usec) =
                    supervised_gateway(main_pid).unwrap_or_default();
                Ok(crate::system::UnitRuntime {
                    main_pid,
                    gateway_pid,
                    gateway_start_usec,
                    exec_main_code: service.get("ExecMainCode")?,
                    exec_main_start_usec: service.get("ExecMainStartTimestamp")?,
                    exec_main_exit_usec: service.get("ExecMainExitTimestamp")?,
                    result: service.get::<&str>("Result")?.to_owned(),
                    memory_current: tracked("MemoryCurrent"),
                    memory_peak: tracked("MemoryPeak"),
                    cpu_usage_nsec: tracked("CPUUsageNSec"),
                    tasks_current: tracked("TasksCurrent"),
                    invocation_id: unit
                        .invocation_id()
                        .await?
                        .iter()
                        .map(|b| format!("{b:02x}"))
                        .collect(),
                    state,
                })
            },
            |e| Err(systemd_error("status", unit, e)),
            || bus_timeout(self.call_timeout),
        )
    }

    fn process_uid(&self, pid: u32) -> Option<u32> {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
        status
            .lines()
            .find_map(|l| l.strip_prefix("Uid:"))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|uid| uid.parse().ok())
    }

    fn read_journal(
        &self,
        query: &crate::system::JournalQuery,
        deadline: Instant,
        visit: &mut dyn FnMut(crate::system::JournalRecord) -> bool,
    ) -> Result<(), SystemError> {
        let journalctl = find_tool("journalctl").ok_or_else(|| SystemError::Journal {
            detail: "journalctl is not installed".to_owned(),
        })?;
        crate::unit_log::read(&journalctl, query, deadline, visit)
    }

    fn missing_tools(&self) -> Vec<String> {
        let mut missing: Vec<String> = ACCOUNT_TOOLS
            .iter()
            .filter(|t| find_tool(t).is_none())
            .map(|t| (*t).to_owned())
            .collect();
        if !Path::new(SYSTEM_BUS_SOCKET).exists() {
            missing.push("dbus".into());
        }
        missing
    }
}

/// All properties of a unit's `org.freedesktop.systemd1.Service` interface from one `GetAll`:
/// a consistent picture of one moment of the service.
struct ServiceSnapshot(std::collections::HashMap<String, zbus::OwnedVariant>);

impl ServiceSnapshot {
    async fn read(conn: &zbus::Connection, path: zbus::OwnedObjectPath) -> zbus::Result<Self> {
        let properties = zbus::fdo::PropertiesProxy::builder(conn)
            .destination("org.freedesktop.systemd1")
            .path(path)
            .cache_properties(zbus::proxy::CacheProperties::No)
            .build()
            .await?;
        let interface =
            zbus::names::InterfaceName::from_static_str("org.freedesktop.systemd1.Service")?;
        Ok(Self(properties.get_all(interface).await?))
    }

    /// One property, converted; a missing or mistyped one is an error naming it.
    fn get<'a, T>(&'a self, name: &str) -> zbus::Result<T>
    where
        T: TryFrom<&'a zbus::OwnedVariant>,
    {
        let value = self
            .0
            .get(name)
            .ok_or_else(|| zbus::Error::Failure(format!("systemd did not report {name}")))?;
        T::try_from(value).map_err(|_| {
            zbus::Error::Failure(format!("systemd reported {name} with an unexpected type"))
        })
    }
}

/// Whether `pid` runs `hostd exec-gateway --supervise` (crate::supervise), not the gateway
/// itself (a unit started before the launcher stayed).
fn is_supervising_launcher(pid: u32) -> bool {
    let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
        return false;
    };
    let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
    // Only the launcher's own options, before the gateway command's `--`.
    let own = args.iter().take_while(|a| **a != b"--");
    args.get(1) == Some(&&b"exec-gateway"[..]) && own.clone().any(|a| *a == b"--supervise")
}

/// The gateway a supervising launcher runs (its first child) and when it started, in
/// microseconds since the epoch.
fn supervised_gateway(main: u32) -> Option<(u32, u64)> {
    if main == 0 || !is_supervising_launcher(main) {
        return None;
    }
    let children = std::fs::read_to_string(format!("/proc/{main}/task/{main}/children")).ok()?;
    let pid: u32 = children.split_whitespace().next()?.parse().ok()?;
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Field 22 (starttime, clock ticks after boot), counted after the command's ')'.
    let ticks: u64 = stat
        .rsplit_once(')')?
        .1
        .split_whitespace()
        .nth(19)?
        .parse()
        .ok()?;
    let boot: u64 = std::fs::read_to_string("/proc/stat")
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("btime "))?
        .trim()
        .parse()
        .ok()?;
    let hz = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .and_then(|v| u64::try_from(v).ok())
        .filter(|v| *v > 0)?;
    Some((pid, boot * 1_000_000 + ticks * 1_000_000 / hz))
}

/// Seconds for messages, rounded up so a sub-second limit never reads "0 s".
fn whole_seconds(d: Duration) -> u64 {
    d.as_millis().div_ceil(1000).try_into().unwrap_or(u64::MAX)
}

fn bus_timeout(limit: Duration) -> SystemError {
    SystemError::Bus(format!(
        "no answer from systemd within {} s",
        whole_seconds(limit)
    ))
}

/// `None` (unit not loaded, stop only) and `done` succeed; any other job result fails.
fn job_result(action: &'static str, unit: &str, result: Option<String>) -> Result<(), SystemError> {
    match result.as_deref() {
        None | Some("done") => Ok(()),
        Some(other) => Err(SystemError::Systemd {
            action,
            unit: unit.to_owned(),
            detail: format!("job result {}", sanitize(other, 40)),
        }),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use std::io::{BufRead, BufReader};
    use std::net::TcpListener;
    use std::thread;

    use super::*;

    /// Serves one connection with `reply` after reading the request head; returns the port and
    /// a receiver for the request text.
    fn serve_once(reply: &'static [u8], delay: Duration) -> (u16, mpsc::Receiver<String>) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let (tx, rx) = mpsc::channel();
        thread::spawn(move || {
            let (stream, _) = listener.accept().unwrap();
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let mut head = String::new();
            loop {
                let mut line = String::new();
                if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                    break;
                }
                head.push_str(&line);
            }
            let _ = tx.send(head);
            thread::sleep(delay);
            let mut stream = stream;
            let _ = stream.write_all(reply);
            thread::sleep(Duration::from_millis(100));
        });
        (port, rx)
    }

    fn probe(port: u16, timeout: Duration) -> bool {
        RealSystem::new().unwrap().probe_ready(port, timeout)
    }

    #[test]
    fn status_200_is_ready_and_the_request_is_exact() {
        let (port, rx) = serve_once(
            b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
            Duration::ZERO,
        );
        assert!(probe(port, Duration::from_secs(2)));
        assert_eq!(
            rx.recv().unwrap(),
            "GET /readyz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
        );
    }

    #[test]
    fn http_1_0_200_is_ready() {
        let (port, _rx) = serve_once(b"HTTP/1.0 200 OK\r\n\r\n", Duration::ZERO);
        assert!(probe(port, Duration::from_secs(2)));
    }

    #[test]
    fn status_503_is_not_ready() {
        let (port, _rx) = serve_once(b"HTTP/1.1 503 Service Unavailable\r\n\r\n", Duration::ZERO);
        assert_eq!(probe_status(port, Duration::from_secs(2)), Some(503));
        let (port, _rx) = serve_once(b"HTTP/1.1 503 Service Unavailable\r\n\r\n", Duration::ZERO);
        assert!(!probe(port, Duration::from_secs(2)));
    }

    #[test]
    fn redirect_is_not_ready() {
        let (port, _rx) = serve_once(
            b"HTTP/1.1 302 Found\r\nLocation: /readyz\r\n\r\n",
            Duration::ZERO,
        );
        assert!(!probe(port, Duration::from_secs(2)));
    }

    #[test]
    fn garbage_is_not_ready() {
        for reply in [
            &b"SSH-2.0-OpenSSH_9.2\r\n"[..],
            b"HTTP/1.1 2000 OK\r\n\r\n",
            b"HTTP/1.1 20 OK\r\n\r\n",
            b"HTTP/2 200\r\n\r\n",
            b"\x00\x01\x02\n",
        ] {
            let reply: &'static [u8] = Box::leak(reply.to_vec().into_boxed_slice());
            let (port, _rx) = serve_once(reply, Duration::ZERO);
            assert!(!probe(port, Duration::from_secs(2)), "{reply:?}");
        }
    }

    #[test]
    fn endless_status_line_is_bounded() {
        let reply: &'static [u8] = Box::leak(vec![b'A'; 64 * 1024].into_boxed_slice());
        let (port, _rx) = serve_once(reply, Duration::ZERO);
        let started = Instant::now();
        assert_eq!(probe_status(port, Duration::from_secs(2)), None);
        assert!(started.elapsed() < Duration::from_secs(2));
    }

    #[test]
    fn closed_connection_is_not_ready() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        thread::spawn(move || {
            let (stream, _) = listener.accept().unwrap();
            drop(stream);
        });
        assert!(!probe(port, Duration::from_secs(2)));
    }

    #[test]
    fn refused_connection_is_not_ready() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        drop(listener);
        assert!(!probe(port, Duration::from_secs(1)));
    }

    #[test]
    fn slow_server_hits_the_timeout() {
        let (port, _rx) = serve_once(b"HTTP/1.1 200 OK\r\n\r\n", Duration::from_millis(1500));
        let started = Instant::now();
        assert!(!probe(port, Duration::from_millis(300)));
        let took = started.elapsed();
        assert!(took >= Duration::from_millis(250), "{took:?}");
        assert!(took < Duration::from_millis(1200), "{took:?}");
    }

    #[test]
    fn status_line_parsing() {
        assert_eq!(parse_status_line(b"HTTP/1.1 200 OK\r\n"), Some(200));
        assert_eq!(parse_status_line(b"HTTP/1.1 200\r\n"), Some(200));
        assert_eq!(parse_status_line(b"HTTP/1.1 204 No Content\r\n"), Some(204));
        assert_eq!(parse_status_line(b"HTTP/1.1 2x0 OK\r\n"), None);
        assert_eq!(parse_status_line(b"http/1.1 200 OK\r\n"), None);
    }

    #[test]
    fn account_names_are_checked_before_any_tool_runs() {
        assert!(check_account_name("useradd", "cfa-0123456789abcdef01234567").is_ok());
        for bad in [
            "",
            "-r",
            "Root",
            "a b",
            "a:b",
            "a/b",
            &"a".repeat(33),
            "1abc",
        ] {
            assert!(check_account_name("useradd", bad).is_err(), "{bad:?}");
        }
        let sys = RealSystem::new().unwrap();
        let err = sys
            .create_account("--help", Path::new("/nonexistent"), 400_000)
            .unwrap_err();
        assert!(matches!(err, SystemError::AccountTool { .. }), "{err}");
        let err = sys
            .create_account("cfa-x", Path::new("relative/home"), 400_000)
            .unwrap_err();
        assert!(err.to_string().contains("absolute"), "{err}");
        let err = sys
            .create_account("cfa-x", Path::new("/var/lib/a:b"), 400_000)
            .unwrap_err();
        assert!(err.to_string().contains("':'"), "{err}");
    }

    #[test]
    fn unit_names_are_checked() {
        assert!(check_unit_name("restart", "clawfleet-agent-0123.service").is_ok());
        for bad in [
            "",
            "-x.service",
            "../x.service",
            "x",
            "a b.service",
            "x/y.service",
        ] {
            assert!(check_unit_name("restart", bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn tool_errors_name_the_status_not_the_output() {
        let status = Command::new("/bin/sh")
            .args(["-c", "exit 9"])
            .status()
            .unwrap();
        let e = tool_error("useradd", "cfa-x", &ToolFailure::Exit(status));
        assert_eq!(
            e.to_string(),
            "account tool useradd failed for cfa-x: exit status 9 (the user or group name is already in use)"
        );
    }

    #[test]
    fn tool_runner_bounds_time_and_output_and_clears_the_environment() {
        // `sh` stands in for an account tool here: it lives on the safe PATH.
        let out = run_tool(
            "sh",
            &[
                OsStr::new("-c"),
                OsStr::new("test -z \"$HOME\" && test \"$PATH\" = /usr/sbin:/usr/bin:/sbin:/bin"),
            ],
            Duration::from_secs(10),
        );
        assert!(out.is_ok(), "{out:?}");
        let started = Instant::now();
        let out = run_tool(
            "sh",
            &[OsStr::new("-c"), OsStr::new("sleep 30")],
            Duration::from_millis(200),
        );
        assert!(matches!(out, Err(ToolFailure::TimedOut(_))), "{out:?}");
        assert!(started.elapsed() < Duration::from_secs(5));
        // Lots of output neither blocks the child nor grows without bound.
        let out = run_tool(
            "sh",
            &[
                OsStr::new("-c"),
                OsStr::new("head -c 1000000 /dev/zero; exit 3"),
            ],
            Duration::from_secs(10),
        );
        assert!(
            matches!(&out, Err(ToolFailure::Exit(s)) if s.code() == Some(3)),
            "{out:?}"
        );
        assert!(matches!(
            run_tool("no-such-tool-here", &[], Duration::from_secs(1)),
            Err(ToolFailure::Missing)
        ));
    }

    #[test]
    fn missing_tools_names_only_known_things() {
        let sys = RealSystem::new().unwrap();
        for m in sys.missing_tools() {
            assert!(ACCOUNT_TOOLS.contains(&m.as_str()) || m == "dbus", "{m}");
        }
    }

    #[test]
    fn lookups_of_absent_accounts_are_none() {
        let sys = RealSystem::new().unwrap();
        assert_eq!(sys.user("cfa-surely-absent-0000").unwrap(), None);
        assert_eq!(sys.group("cfa-surely-absent-0000").unwrap(), None);
        // Idempotent deletes: nothing to do, no tool runs.
        sys.delete_user("cfa-surely-absent-0000").unwrap();
        sys.delete_group("cfa-surely-absent-0000").unwrap();
    }

    #[test]
    fn root_is_refused_by_lookups() {
        let sys = RealSystem::new().unwrap();
        assert!(sys.user("root").is_err());
        assert!(sys.group("root").is_err());
    }

    #[test]
    fn bus_errors_without_a_bus_are_clean() {
        if Path::new(SYSTEM_BUS_SOCKET).exists() {
            return;
        }
        let sys = RealSystem::new().unwrap();
        let e = sys.systemd_version().unwrap_err();
        assert!(matches!(e, SystemError::Bus(_)), "{e}");
        // The failed connect is not cached as a success; it fails the same way again.
        assert!(sys.unit_state("x.service").is_err());
        assert!(!sys.probe_ready(1, Duration::from_millis(100)));
    }
}
