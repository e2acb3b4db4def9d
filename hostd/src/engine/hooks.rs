//! Host lifecycle hooks: executables the operator installs under `<hooks_dir>/<event>/`,
//! run by hostd around Namespace preparation and workload start and stop.
//!
//! A hook runs only if it, its event directory and `hooks_dir` are owned by the user hostd
//! runs as (root on a host) and not group- or world-writable; otherwise the operation fails
//! with `HOOK_REFUSED` naming it. Hooks run in lexical order (cleanup in reverse) with a clean
//! environment holding only the ids of what they act on, stdin closed, a time limit
//! (`[limits] hook_timeout_ms`, then the process group is killed) and output bounded; output
//! reaches hostd's journal only redacted. `before-workload-start` hooks may print `NAME=value`
//! lines that become the unit's launch environment for the revision.

use std::collections::BTreeMap;
use std::fs;
use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use clawfleet_protocol::failure::{Failure, FailureCode};
use clawfleet_protocol::redact::Redactor;

use super::{Ctx, Engine};

/// The events, as their directory names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    AfterNamespacePrepared,
    BeforeWorkloadStart,
    BeforeWorkloadStop,
    BeforeNamespaceDelete,
}

impl Event {
    pub fn as_str(self) -> &'static str {
        match self {
            Event::AfterNamespacePrepared => "after-namespace-prepared",
            Event::BeforeWorkloadStart => "before-workload-start",
            Event::BeforeWorkloadStop => "before-workload-stop",
            Event::BeforeNamespaceDelete => "before-namespace-delete",
        }
    }
}

/// What a hook acts on: only ids, never secrets.
#[derive(Debug, Clone, Default)]
pub struct Subject<'a> {
    pub namespace_id: &'a str,
    pub namespace_name: &'a str,
    pub agent_id: Option<&'a str>,
    pub service_principal_id: Option<&'a str>,
    pub revision_id: Option<&'a str>,
    pub revision_number: Option<u64>,
}

/// Most launch environment values all `before-workload-start` hooks together may return.
pub const MAX_LAUNCH_VALUES: usize = 64;
/// Longest launch environment value.
const MAX_VALUE_LEN: usize = 4096;
/// Most bytes of a hook's stdout and of its stderr kept (the rest is read and dropped).
const MAX_OUTPUT: usize = 64 * 1024;
/// How long, after a hook exited, its output may still take to be read to its end.
const OUTPUT_GRACE: Duration = Duration::from_millis(500);
/// Lines of a failing hook's stderr that go (redacted) to hostd's journal.
const LOGGED_LINES: usize = 20;

/// Names a hook may not set, exactly: the unit's own, and those that change how the runtime
/// behaves rather than what the gateway does (TLS verification, proxies, the allocator, trusted
/// CAs, the shell's startup). The one list: refusals and the operator guide come from it.
pub const RESERVED_NAMES: &[&str] = &[
    "HOME",
    "PATH",
    "USER",
    "LOGNAME",
    "SHELL",
    "PWD",
    "TERM",
    "TMPDIR",
    "LANG",
    "LANGUAGE",
    "TZ",
    "TZDIR",
    "INVOCATION_ID",
    "NOTIFY_SOCKET",
    "LISTEN_FDS",
    "LISTEN_PID",
    "LISTEN_FDNAMES",
    "JOURNAL_STREAM",
    "CREDENTIALS_DIRECTORY",
    "RUNTIME_DIRECTORY",
    "STATE_DIRECTORY",
    "MAINPID",
    "HTTPS_PROXY",
    "HTTP_PROXY",
    "ALL_PROXY",
    "NO_PROXY",
    "FTP_PROXY",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
    "CURL_CA_BUNDLE",
    "REQUESTS_CA_BUNDLE",
    "GCONV_PATH",
    "HOSTALIASES",
    "LOCALDOMAIN",
    "RES_OPTIONS",
    "NLSPATH",
    "IFS",
    "ENV",
    "BASH_ENV",
];

/// Prefixes of names a hook may not set: the loader's (`LD_`), glibc's (`GLIBC_TUNABLES`,
/// `MALLOC_`), Node's (`NODE_OPTIONS`, `NODE_TLS_REJECT_UNAUTHORIZED`, `NODE_EXTRA_CA_CERTS`,
/// …), libuv's, OpenSSL's, the gateway's and clawfleet's own, systemd's and the locale's.
pub const RESERVED_PREFIXES: &[&str] = &[
    "LD_",
    "GLIBC_",
    "MALLOC_",
    "NODE_",
    "UV_",
    "OPENSSL_",
    "OPENCLAW_",
    "CLAWFLEET_",
    "SYSTEMD_",
    "LC_",
];

/// Whether a hook may not set `name` (see [`RESERVED_NAMES`], [`RESERVED_PREFIXES`]).
pub fn reserved(name: &str) -> bool {
    RESERVED_NAMES.contains(&name) || RESERVED_PREFIXES.iter().any(|p| name.starts_with(p))
}

fn valid_name(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some('A'..='Z'))
        && name.len() <= 64
        && chars.all(|c| matches!(c, 'A'..='Z' | '0'..='9' | '_'))
}

fn refused(hook: &str, why: impl AsRef<str>) -> Failure {
    Failure::new(
        FailureCode::HookRefused,
        format!("hook {hook}: {}", why.as_ref()),
    )
}

/// Checks that a path is owned by `owner` and not writable by group or others.
fn check_owner(path: &Path, shown: &str, owner: u32, want_dir: bool) -> Result<(), Failure> {
    let meta =
        fs::symlink_metadata(path).map_err(|e| refused(shown, format!("cannot be read: {e}")))?;
    let kind_ok = if want_dir {
        meta.file_type().is_dir()
    } else {
        meta.file_type().is_file()
    };
    if !kind_ok {
        return Err(refused(
            shown,
            if want_dir {
                "is not a directory (links are not followed)"
            } else {
                "is not a regular file (links are not followed)"
            },
        ));
    }
    if meta.uid() != owner {
        return Err(refused(
            shown,
            format!("is owned by uid {}, not by uid {owner} (root)", meta.uid()),
        ));
    }
    if meta.mode() & 0o022 != 0 {
        return Err(refused(
            shown,
            format!(
                "is group- or world-writable (mode {:o})",
                meta.mode() & 0o7777
            ),
        ));
    }
    if !want_dir && meta.mode() & 0o100 == 0 {
        return Err(refused(shown, "is not executable by its owner"));
    }
    Ok(())
}

/// `(pid, ppid, start time in clock ticks)` of a process, from `/proc/<pid>/stat`.
fn proc_stat(pid: i32) -> Option<(i32, u64)> {
    let text = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may hold spaces and parentheses: the fields start after the last ')'.
    let rest = &text[text.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // rest[0] is the state (field 3); ppid is field 4, starttime field 22.
    let ppid = fields.get(1)?.parse().ok()?;
    let start = fields.get(19)?.parse().ok()?;
    Some((ppid, start))
}

/// The processes descending from this one that started at or after `since` (clock ticks
/// since boot): what one hook started, wherever it moved itself (`setsid`, double fork), since
/// hostd is their subreaper. hostd runs one hook at a time and starts nothing else meanwhile.
fn hook_processes(since: u64) -> Vec<i32> {
    let me = i32::try_from(std::process::id()).unwrap_or(i32::MAX);
    let mut parent_of = BTreeMap::new();
    let Ok(entries) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<i32>().ok())
        else {
            continue;
        };
        if let Some((ppid, start)) = proc_stat(pid) {
            parent_of.insert(pid, (ppid, start));
        }
    }
    let mut out = Vec::new();
    for (&pid, &(_, start)) in &parent_of {
        if pid == me || start < since {
            continue;
        }
        // Walk up (bounded: a pid chain has no cycles, but /proc changes while read).
        let mut at = pid;
        for _ in 0..4096 {
            match parent_of.get(&at) {
                Some(&(ppid, _)) if ppid == me => {
                    out.push(pid);
                    break;
                }
                Some(&(ppid, _)) if ppid > 1 => at = ppid,
                _ => break,
            }
        }
    }
    out
}

/// Kills everything a hook started (see [`hook_processes`]) and reaps what became hostd's
/// child, until nothing is left or `limit` passed. A hook's daemons, `setsid` or double-forked,
/// never outlive it: a hook is a step of an operation, and what must keep running belongs in
/// a unit of its own.
fn kill_hook_processes(since: u64, limit: Duration) -> usize {
    let started = Instant::now();
    let mut killed = 0;
    loop {
        let left = hook_processes(since);
        if left.is_empty() {
            return killed;
        }
        for &pid in &left {
            let pid = nix::unistd::Pid::from_raw(pid);
            if nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL).is_ok() {
                killed += 1;
            }
            // Reparented to hostd (the subreaper) or its own: reap it once it died.
            let _ = nix::sys::wait::waitpid(pid, Some(nix::sys::wait::WaitPidFlag::WNOHANG));
        }
        if started.elapsed() >= limit {
            return killed;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// This process's start time in clock ticks since boot (`/proc/self/stat`), 0 if unreadable.
fn start_ticks(pid: u32) -> u64 {
    i32::try_from(pid)
        .ok()
        .and_then(proc_stat)
        .map_or(0, |(_, start)| start)
}

/// One finished hook's output.
struct Ran {
    stdout: Vec<u8>,
}

impl Engine<'_> {
    /// The hooks of an event in lexical order, each checked; empty when the event has no
    /// directory (or `hooks_dir` does not exist).
    pub(crate) fn hooks(&self, event: Event) -> Result<Vec<(String, PathBuf)>, Failure> {
        let root = &self.config.hooks_dir;
        let dir = root.join(event.as_str());
        match fs::symlink_metadata(&dir) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            _ => {}
        }
        let owner = nix::unistd::geteuid().as_raw();
        check_owner(root, &root.display().to_string(), owner, true)?;
        check_owner(&dir, &format!("directory {}", event.as_str()), owner, true)?;
        let mut names: Vec<String> = fs::read_dir(&dir)
            .map_err(|e| refused(event.as_str(), format!("directory cannot be listed: {e}")))?
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            // Editors' and package managers' leftovers are not hooks.
            .filter(|n| {
                !n.starts_with('.')
                    && !n.ends_with('~')
                    && !n.ends_with(".dpkg-old")
                    && !n.ends_with(".dpkg-new")
                    && !n.ends_with(".rpmsave")
                    && !n.ends_with(".rpmnew")
            })
            .collect();
        names.sort();
        names
            .into_iter()
            .map(|n| {
                let path = dir.join(&n);
                let shown = format!("{}/{n}", event.as_str());
                check_owner(&path, &shown, owner, false)?;
                Ok((shown, path))
            })
            .collect()
    }

    /// Runs one hook to its end, within the limit.
    fn run_hook(
        &self,
        ctx: &Ctx<'_>,
        event: Event,
        shown: &str,
        path: &Path,
        subject: &Subject<'_>,
    ) -> Result<Ran, Failure> {
        let mut cmd = Command::new(path);
        cmd.env_clear()
            .env(
                "PATH",
                "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            )
            .env("CLAWFLEET_EVENT", event.as_str())
            .env("CLAWFLEET_OPERATION_ID", ctx.operation_id.as_str())
            .env("CLAWFLEET_NAMESPACE_ID", subject.namespace_id)
            .env("CLAWFLEET_NAMESPACE_NAME", subject.namespace_name)
            .current_dir("/")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            // Its own process group, so the limit kills what it started too.
            .process_group(0);
        for (key, value) in [
            ("CLAWFLEET_AGENT_ID", subject.agent_id),
            (
                "CLAWFLEET_SERVICE_PRINCIPAL_ID",
                subject.service_principal_id,
            ),
            ("CLAWFLEET_REVISION_ID", subject.revision_id),
        ] {
            if let Some(v) = value {
                cmd.env(key, v);
            }
        }
        if let Some(n) = subject.revision_number {
            cmd.env("CLAWFLEET_REVISION_NUMBER", n.to_string());
        }
        // Orphans of the hook (a `setsid` daemon whose parent exited) become hostd's children
        // instead of init's, so they stay findable and killable (kill_hook_processes).
        if let Err(e) = nix::sys::prctl::set_child_subreaper(true) {
            tracing::warn!(operation_id = %ctx.operation_id, "cannot become the hooks' subreaper: {e}");
        }
        let mut child = cmd.spawn().map_err(|e| {
            Failure::new(
                FailureCode::HookFailed,
                format!("hook {shown} cannot be started: {e}"),
            )
        })?;
        // Each pipe is drained on its own thread, which hands over what it kept through a
        // channel: a hook that leaves a daemon holding its stdout (setsid, outside the process
        // group) cannot keep hostd waiting past the grace below.
        let reader = |pipe: Option<Box<dyn Read + Send>>| {
            let kept = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
            let (tx, rx) = std::sync::mpsc::channel::<()>();
            let sink = std::sync::Arc::clone(&kept);
            std::thread::spawn(move || {
                if let Some(mut p) = pipe {
                    let mut buf = [0u8; 8192];
                    while let Ok(n) = p.read(&mut buf) {
                        if n == 0 {
                            break;
                        }
                        if let Ok(mut k) = sink.lock() {
                            let room = MAX_OUTPUT.saturating_sub(k.len());
                            k.extend_from_slice(&buf[..n.min(room)]);
                        }
                    }
                }
                let _ = tx.send(());
            });
            move || {
                // Until the end of the pipe, or what arrived within the grace.
                let _ = rx.recv_timeout(OUTPUT_GRACE);
                kept.lock().map(|k| k.clone()).unwrap_or_default()
            }
        };
        let out = reader(
            child
                .stdout
                .take()
                .map(|p| Box::new(p) as Box<dyn Read + Send>),
        );
        let err = reader(
            child
                .stderr
                .take()
                .map(|p| Box::new(p) as Box<dyn Read + Send>),
        );
        let limit = self.config.limits.hook_timeout;
        let started = Instant::now();
        let since = start_ticks(child.id());
        let pgid = nix::unistd::Pid::from_raw(i32::try_from(child.id()).unwrap_or(i32::MAX));
        let status = loop {
            match child.try_wait() {
                Ok(Some(status)) => break Some(status),
                Ok(None) if started.elapsed() >= limit => {
                    let _ = nix::sys::signal::killpg(pgid, nix::sys::signal::Signal::SIGKILL);
                    let _ = child.wait();
                    break None;
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(5)),
                Err(e) => {
                    let _ = nix::sys::signal::killpg(pgid, nix::sys::signal::Signal::SIGKILL);
                    let _ = child.wait();
                    return Err(Failure::new(
                        FailureCode::HookFailed,
                        format!("hook {shown} cannot be waited for: {e}"),
                    ));
                }
            }
        };
        // A grandchild that keeps the pipes open is in the group and was killed, or exits.
        let _ = nix::sys::signal::killpg(pgid, nix::sys::signal::Signal::SIGKILL);
        // And everything else it started, in another group or session (setsid) included.
        let stray = if since > 0 {
            kill_hook_processes(since, Duration::from_secs(5))
        } else {
            0
        };
        if stray > 0 {
            tracing::warn!(operation_id = %ctx.operation_id, hook = shown, processes = stray, "killed what the hook left running");
        }
        let stdout = out();
        let stderr = err();
        let log_stderr = |what: &str| {
            let mut r = Redactor::default();
            for line in String::from_utf8_lossy(&stderr).lines().take(LOGGED_LINES) {
                tracing::warn!(operation_id = %ctx.operation_id, hook = shown, "{what}: {}", r.line(line).text);
            }
        };
        match status {
            None => {
                log_stderr("hook killed at its limit");
                Err(Failure::new(
                    FailureCode::HookTimeout,
                    format!(
                        "hook {shown} did not finish within {} ms and was killed",
                        limit.as_millis()
                    ),
                ))
            }
            Some(s) if s.success() => {
                tracing::info!(operation_id = %ctx.operation_id, hook = shown, ms = started.elapsed().as_millis() as u64, "hook ran");
                Ok(Ran { stdout })
            }
            Some(s) => {
                log_stderr("hook failed");
                Err(Failure::new(
                    FailureCode::HookFailed,
                    format!(
                        "hook {shown} failed ({s}); its redacted stderr is in hostd's journal under the operation id"
                    ),
                ))
            }
        }
    }

    /// Runs an event's hooks in order; the first failure stops the rest.
    pub(crate) fn run_hooks(
        &self,
        ctx: &Ctx<'_>,
        event: Event,
        subject: &Subject<'_>,
    ) -> Result<(), Failure> {
        for (shown, path) in self.hooks(event)? {
            self.run_hook(ctx, event, &shown, &path, subject)?;
        }
        Ok(())
    }

    /// Runs an event's hooks in reverse order (cleanup), each one even when an earlier one
    /// failed; the first failure is returned.
    pub(crate) fn run_hooks_reverse(
        &self,
        ctx: &Ctx<'_>,
        event: Event,
        subject: &Subject<'_>,
    ) -> Result<(), Failure> {
        let mut first = None;
        for (shown, path) in self.hooks(event)?.into_iter().rev() {
            if let Err(f) = self.run_hook(ctx, event, &shown, &path, subject) {
                first.get_or_insert(f);
            }
        }
        first.map_or(Ok(()), Err)
    }

    /// Runs the `before-workload-start` hooks and returns the launch environment they
    /// printed, checked; `None` when there are none.
    pub(crate) fn start_hooks(
        &self,
        ctx: &Ctx<'_>,
        subject: &Subject<'_>,
    ) -> Result<Option<BTreeMap<String, String>>, Failure> {
        let hooks = self.hooks(Event::BeforeWorkloadStart)?;
        if hooks.is_empty() {
            return Ok(None);
        }
        let mut env = BTreeMap::new();
        for (shown, path) in hooks {
            let ran = self.run_hook(ctx, Event::BeforeWorkloadStart, &shown, &path, subject)?;
            parse_launch_env(&shown, &ran.stdout, &mut env)?;
        }
        Ok(Some(env))
    }
}

fn output_refused(hook: &str, why: impl AsRef<str>) -> Failure {
    Failure::new(
        FailureCode::HookOutputRefused,
        format!("hook {hook}: {}", why.as_ref()),
    )
}

/// Adds a start hook's `NAME=value` lines to `env` (blank lines and `#` comments skipped).
pub(crate) fn parse_launch_env(
    hook: &str,
    stdout: &[u8],
    env: &mut BTreeMap<String, String>,
) -> Result<(), Failure> {
    let text = std::str::from_utf8(stdout)
        .map_err(|_| output_refused(hook, "printed output that is not UTF-8"))?;
    for (i, line) in text.lines().enumerate() {
        let n = i + 1;
        if line.trim().is_empty() || line.starts_with('#') {
            continue;
        }
        let Some((name, value)) = line.split_once('=') else {
            return Err(output_refused(hook, format!("line {n} is not NAME=value")));
        };
        if !valid_name(name) {
            return Err(output_refused(
                hook,
                format!("line {n}: the name must match ^[A-Z][A-Z0-9_]{{0,63}}$"),
            ));
        }
        if reserved(name) {
            return Err(output_refused(
                hook,
                format!(
                    "line {n}: {name} is reserved for the launch itself (it changes how the runtime behaves: TLS, proxies, loader, allocator, …); see the operator guide's list"
                ),
            ));
        }
        if value.len() > MAX_VALUE_LEN || value.chars().any(char::is_control) {
            return Err(output_refused(
                hook,
                format!(
                    "line {n}: the value of {name} is longer than {MAX_VALUE_LEN} bytes or holds control characters"
                ),
            ));
        }
        if Redactor::default().line(value).count > 0 {
            return Err(output_refused(
                hook,
                format!(
                    "line {n}: the value of {name} looks like a credential; pass a reference to it instead"
                ),
            ));
        }
        env.insert(name.to_owned(), value.to_owned());
        if env.len() > MAX_LAUNCH_VALUES {
            return Err(output_refused(
                hook,
                format!("the start hooks returned more than {MAX_LAUNCH_VALUES} values"),
            ));
        }
    }
    Ok(())
}

/// The launch environment as a systemd `EnvironmentFile=` (values double-quoted, `\` and `"`
/// escaped, so systemd reads them back verbatim).
pub(crate) fn render_env_file(env: &BTreeMap<String, String>) -> String {
    let mut out = String::from("# Written by hostd from the before-workload-start hooks.\n");
    for (k, v) in env {
        let escaped = v.replace('\\', "\\\\").replace('"', "\\\"");
        out.push_str(&format!("{k}=\"{escaped}\"\n"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn launch_values_are_checked() {
        let mut env = BTreeMap::new();
        parse_launch_env(
            "h",
            b"# c\n\nCRED_REF=vault:kv/agent-1\nREGION=eu-west\n",
            &mut env,
        )
        .unwrap();
        assert_eq!(env.len(), 2);
        for (bad, want) in [
            ("HOME=/x", "reserved"),
            ("LD_PRELOAD=/x.so", "reserved"),
            ("OPENCLAW_GATEWAY_PORT=1", "reserved"),
            ("NODE_OPTIONS=--x", "reserved"),
            (
                "NODE_TLS_REJECT_UNAUTHORIZED=0",
                "NODE_TLS_REJECT_UNAUTHORIZED is reserved",
            ),
            (
                "GLIBC_TUNABLES=glibc.malloc.x=1",
                "GLIBC_TUNABLES is reserved",
            ),
            ("HTTPS_PROXY=http://evil:8080", "HTTPS_PROXY is reserved"),
            ("HTTP_PROXY=http://evil:8080", "HTTP_PROXY is reserved"),
            ("LD_LIBRARY_PATH=/tmp", "LD_LIBRARY_PATH is reserved"),
            ("SSL_CERT_FILE=/tmp/ca.pem", "SSL_CERT_FILE is reserved"),
            ("lower=1", "must match"),
            ("NOEQUALS", "not NAME=value"),
            (
                "TOKEN=sk-ant-api03-abcdefghijklmnopqrstuvwxyz0123456789",
                "looks like a credential",
            ),
        ] {
            let f = parse_launch_env("h", bad.as_bytes(), &mut BTreeMap::new()).unwrap_err();
            assert_eq!(f.code, FailureCode::HookOutputRefused);
            assert!(f.message.contains(want), "{bad}: {f}");
            assert!(!f.message.contains("abcdefghij"), "{f}");
        }
        let many: String = (0..=MAX_LAUNCH_VALUES)
            .map(|i| format!("V{i}=x\n"))
            .collect();
        assert!(parse_launch_env("h", many.as_bytes(), &mut BTreeMap::new()).is_err());
        let file = render_env_file(&BTreeMap::from([(
            "A".to_owned(),
            r#"x "q" \ y"#.to_owned(),
        )]));
        assert!(file.contains(r#"A="x \"q\" \\ y""#), "{file}");
    }
}
