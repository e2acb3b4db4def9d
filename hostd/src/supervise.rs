//! `hostd exec-gateway --supervise`: the launcher stays as the Agent unit's main process and
//! runs the gateway as its child, so that a revision cutover relaunches the gateway inside the
//! sandbox systemd already built, instead of restarting the unit (issue 34: a restart's stop
//! and start jobs, its `ExecStartPre=` and the sandbox's set-up were most of a cutover).
//!
//! The protocol with hostd (`System::stop_for_relaunch` and `System::start_relaunched`,
//! engine/revision.rs):
//! - SIGHUP (systemd's `KillUnit` of the main process) stops the gateway for a relaunch: its
//!   process group gets SIGTERM, then SIGKILL after the stop timeout, every descendant left
//!   SIGKILL.
//! - Then the launcher waits for [`START`] (SIGUSR1) and starts the gateway again, from the
//!   same command, in the same environment and confinement (hostd relaunches only when the
//!   unit's environment files are what systemd read at its start, `crate::start_env`).
//!   Between the two, hostd puts the new revision's configuration in place where no gateway
//!   runs to see it change: a gateway that watches its file (OpenClaw does) would take the
//!   change for a restart of its own and end, the unit with it, before the relaunch. Without
//!   [`START`] within the start wait (hostd ended mid-cutover), the launcher starts the
//!   gateway anyway.
//! - SIGTERM or SIGINT (the unit's stop) goes to the gateway's process group; the launcher
//!   waits for it.
//! - When the gateway ends by itself, or after a stop, the launcher ends the same way (the
//!   same exit status, or the same signal), so `Restart=`, `RestartPreventExitStatus=` and
//!   `ExecMainStatus` mean what they meant when the gateway was the main process.
//!
//! The five signals are blocked before anything else and taken with `sigtimedwait`, never in
//! a handler; the gateway starts with an empty mask (std's `Command` resets it). hostd sends a
//! relaunch only once a process runs beside the launcher, that is once the mask is set.
//!
//! Unsafe code: `sigtimedwait` and `raise`, which nix does not offer with a timeout.
#![allow(unsafe_code)]

use std::os::unix::process::CommandExt;
use std::process::Command;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::libc;
use nix::sys::signal::{self, SigSet, SigmaskHow, Signal};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::Pid;

use crate::launch::LaunchError;

/// The first words of the launcher's line between two gateways in the unit's journal: the
/// boundary of a gateway run within one unit run, which `agent-logs --previous` reads
/// (engine/runtime.rs).
pub const RELAUNCHED: &str = "hostd exec-gateway: relaunching the gateway in place";

/// Starts the gateway again after a relaunch's stop: hostd sends it once the new revision's
/// configuration is in place.
pub const START: Signal = Signal::SIGUSR1;

/// The signals the launcher takes while a gateway runs or stops. [`START`] is not among them:
/// it stays pending until the launcher waits for it.
const RUNNING: [Signal; 4] = [
    Signal::SIGHUP,
    Signal::SIGTERM,
    Signal::SIGINT,
    Signal::SIGCHLD,
];

/// How the gateway (and so the launcher) ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    /// It exited with this status.
    Exited(i32),
    /// A signal ended it.
    Signalled(Signal),
    /// The workspace guard refused a start (`EX_CONFIG`, the unit's
    /// `RestartPreventExitStatus=`).
    Refused,
}

/// How long the launcher waits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Waits {
    /// For the gateway to stop before SIGKILL (the unit's `TimeoutStopSec=`).
    pub stop: Duration,
    /// For [`START`] once a relaunch stopped the old gateway, before starting the new one
    /// anyway.
    pub start: Duration,
}

/// What a supervised launch needs.
pub struct Supervised<'a> {
    /// The gateway command and its arguments.
    pub command: &'a [String],
    pub waits: Waits,
    /// Checked before every start: `Err` (a sentence) refuses the start
    /// (engine/workspace.rs's guard).
    pub guard: &'a dyn Fn() -> Result<(), String>,
}

impl std::fmt::Debug for Supervised<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Supervised")
            .field("command", &self.command)
            .field("waits", &self.waits)
            .finish_non_exhaustive()
    }
}

fn set_of(signals: &[Signal]) -> SigSet {
    let mut set = SigSet::empty();
    for s in signals {
        set.add(*s);
    }
    set
}

/// Blocks the launcher's signals ([`RUNNING`] and [`START`]); call first, before confinement
/// or anything that can take time, so that none of them kills the launcher by its default
/// action.
pub fn block_signals() -> Result<(), LaunchError> {
    let mut all = set_of(&RUNNING);
    all.add(START);
    signal::pthread_sigmask(SigmaskHow::SIG_BLOCK, Some(&all), None).map_err(|e| {
        LaunchError::Supervise {
            call: "sigprocmask",
            source: e.into(),
        }
    })
}

/// The next of the blocked signals, or `None` once `timeout` passes (`None`: wait for ever).
fn next_signal(set: &SigSet, timeout: Option<Duration>) -> Option<Signal> {
    let ts = timeout.map(|t| libc::timespec {
        tv_sec: t.as_secs() as libc::time_t,
        tv_nsec: libc::c_long::from(t.subsec_nanos() as i32),
    });
    loop {
        let ts_ptr = ts.as_ref().map_or(std::ptr::null(), |t| t as *const _);
        // SAFETY: `set` is a valid sigset; no siginfo wanted; `ts_ptr` is null or points at a
        // live timespec.
        let rc = unsafe { libc::sigtimedwait(set.as_ref(), std::ptr::null_mut(), ts_ptr) };
        if rc >= 0 {
            return Signal::try_from(rc).ok();
        }
        match Errno::last() {
            Errno::EINTR => continue,
            // EAGAIN: the timeout passed.
            _ => return None,
        }
    }
}

/// Reaps every ended child; `Some` with the gateway's end once `gateway` is among them.
fn reap(gateway: Pid) -> Option<End> {
    let mut ended = None;
    loop {
        match waitpid(None, Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::Exited(pid, code)) if pid == gateway => ended = Some(End::Exited(code)),
            Ok(WaitStatus::Signaled(pid, sig, _)) if pid == gateway => {
                ended = Some(End::Signalled(sig));
            }
            Ok(WaitStatus::StillAlive) | Err(_) => return ended,
            Ok(_) => {}
        }
    }
}

/// The launcher's children now: the gateway, and what it left behind, which a subreaper
/// inherits (`/proc/<pid>/task/<pid>/children`; the launcher is single-threaded). A kernel
/// built without that file (`CONFIG_PROC_CHILDREN`) gives the other processes of the
/// launcher's own cgroup instead, which are the unit's: all of them its descendants.
fn children() -> Option<Vec<i32>> {
    let me = std::process::id();
    if let Ok(text) = std::fs::read_to_string(format!("/proc/{me}/task/{me}/children")) {
        return Some(
            text.split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect(),
        );
    }
    others_in_own_cgroup()
}

/// The other processes of this process's cgroup.
fn others_in_own_cgroup() -> Option<Vec<i32>> {
    let own = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    others_in_cgroup(
        std::path::Path::new(crate::cgroup::ROOT),
        &own,
        std::process::id(),
    )
}

/// The processes other than `me` in the cgroup that `proc_cgroup` (`me`'s
/// `/proc/<pid>/cgroup`) names, under the cgroup mount `root`.
fn others_in_cgroup(root: &std::path::Path, proc_cgroup: &str, me: u32) -> Option<Vec<i32>> {
    let procs = crate::cgroup::procs_path(root, crate::cgroup::own_group(proc_cgroup)?)?;
    Some(
        crate::cgroup::read_pids(&procs)
            .ok()?
            .into_iter()
            .filter(|p| *p != me)
            .filter_map(|p| i32::try_from(p).ok())
            .collect(),
    )
}

/// SIGKILLs every descendant until none is left (or `deadline`): a gateway's helpers must not
/// outlive it into the next one. Each killed child's own children are reparented here (the
/// launcher is a subreaper) and killed in the next round. Only descendants: never a process
/// the launcher did not start, wherever it runs.
fn kill_leftovers(deadline: Instant) {
    loop {
        let _ = reap(Pid::from_raw(0));
        let Some(left) = children() else {
            return;
        };
        if left.is_empty() || Instant::now() >= deadline {
            return;
        }
        for pid in left {
            // Gone meanwhile: nothing more to do for it.
            let _ = signal::kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Starts the gateway in a process group of its own.
fn start(s: &Supervised<'_>) -> Result<Pid, LaunchError> {
    let (program, args) = s.command.split_first().ok_or(LaunchError::NoCommand)?;
    let child = Command::new(program)
        .args(args)
        .process_group(0)
        .spawn()
        .map_err(|source| LaunchError::Exec {
            command: program.clone(),
            source,
        })?;
    let pid = i32::try_from(child.id()).map_err(|_| LaunchError::Supervise {
        call: "spawn",
        source: std::io::Error::other("the gateway's pid is out of range"),
    })?;
    // The launcher reaps it with waitpid; dropping the handle does not wait.
    drop(child);
    Ok(Pid::from_raw(pid))
}

/// Waits for the gateway to end, up to `timeout`; `None` when it is still running.
fn wait_end(set: &SigSet, gateway: Pid, timeout: Duration, stop: &mut bool) -> Option<End> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(end) = reap(gateway) {
            return Some(end);
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return None;
        }
        // SIGCHLD: reaped above; SIGHUP: the relaunch under way already answers it.
        if let Some(Signal::SIGTERM | Signal::SIGINT) = next_signal(set, Some(left)) {
            *stop = true;
            let _ = signal::killpg(gateway, Signal::SIGTERM);
        }
    }
}

/// Stops the gateway for a relaunch or a stop: SIGTERM to its group, SIGKILL after the
/// timeout, then whatever of the unit is left. Returns how it ended.
fn stop_gateway(s: &Supervised<'_>, set: &SigSet, gateway: Pid, stop: &mut bool) -> End {
    // Its group may be gone already (it ended on its own just now); the wait says.
    let _ = signal::killpg(gateway, Signal::SIGTERM);
    let end = match wait_end(set, gateway, s.waits.stop, stop) {
        Some(end) => end,
        None => {
            eprintln!(
                "hostd exec-gateway: the gateway did not stop within {} s; killing it",
                s.waits.stop.as_secs()
            );
            let _ = signal::killpg(gateway, Signal::SIGKILL);
            wait_end(set, gateway, Duration::from_secs(5), stop)
                .unwrap_or(End::Signalled(Signal::SIGKILL))
        }
    };
    kill_leftovers(Instant::now() + s.waits.stop);
    end
}

/// Forgets a [`START`] still pending: one from before this relaunch (sent too late for an
/// earlier one), since hostd sends this relaunch's only once the old gateway is gone.
fn discard_start() {
    let only = set_of(&[START]);
    while next_signal(&only, Some(Duration::ZERO)).is_some() {}
}

/// After a relaunch's stop: waits for [`START`], the unit's stop (`*stop` set), or the start
/// wait to pass, reaping what ends meanwhile. Another SIGHUP is the relaunch under way.
fn wait_start(s: &Supervised<'_>, stop: &mut bool) {
    let set = set_of(&[
        START,
        Signal::SIGHUP,
        Signal::SIGTERM,
        Signal::SIGINT,
        Signal::SIGCHLD,
    ]);
    let deadline = Instant::now() + s.waits.start;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            eprintln!(
                "hostd exec-gateway: hostd did not ask for the gateway's start within {} s; starting it",
                s.waits.start.as_secs()
            );
            return;
        }
        match next_signal(&set, Some(left)) {
            Some(sig) if sig == START => return,
            Some(Signal::SIGTERM | Signal::SIGINT) => {
                *stop = true;
                return;
            }
            Some(Signal::SIGCHLD) => {
                let _ = reap(Pid::from_raw(0));
            }
            Some(Signal::SIGHUP) => {}
            // The wait passed (looked at above), or sigtimedwait failed: do not spin.
            _ => std::thread::sleep(Duration::from_millis(1)),
        }
    }
}

/// Runs the gateway until it ends or the unit stops, relaunching it on SIGHUP. The caller has
/// blocked the signals ([`block_signals`]) and confined this process (inherited by every
/// gateway it starts). Returns how the last gateway ended.
pub fn run(s: &Supervised<'_>) -> Result<End, LaunchError> {
    let set = set_of(&RUNNING);
    // Helpers the gateway leaves behind are reparented here, not to PID 1, so a relaunch can
    // end them. SAFETY: plain prctl with constant arguments.
    if unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) } != 0 {
        return Err(LaunchError::Supervise {
            call: "prctl(PR_SET_CHILD_SUBREAPER)",
            source: std::io::Error::last_os_error(),
        });
    }
    let mut generation: u64 = 0;
    loop {
        if let Err(why) = (s.guard)() {
            eprintln!("hostd exec-gateway: {why}");
            return Ok(End::Refused);
        }
        generation += 1;
        // Before the new gateway exists, so that every line of the old run is journaled
        // before this one and every line of the new run after it, through the one stream
        // the launcher and its gateways share.
        if generation > 1 {
            eprintln!("{RELAUNCHED} (start {generation})");
        }
        let gateway = start(s)?;
        let mut stop = false;
        loop {
            match next_signal(&set, None) {
                Some(Signal::SIGCHLD) => {
                    if let Some(end) = reap(gateway) {
                        kill_leftovers(Instant::now() + s.waits.stop);
                        return Ok(end);
                    }
                }
                Some(Signal::SIGTERM | Signal::SIGINT) => {
                    stop = true;
                    return Ok(stop_gateway(s, &set, gateway, &mut stop));
                }
                Some(Signal::SIGHUP) => {
                    discard_start();
                    eprintln!(
                        "hostd exec-gateway: stopping the gateway (pid {gateway}) for a relaunch"
                    );
                    let end = stop_gateway(s, &set, gateway, &mut stop);
                    if !stop {
                        wait_start(s, &mut stop);
                    }
                    if stop {
                        return Ok(end);
                    }
                    break;
                }
                // Only a failing sigtimedwait answers nothing without a timeout: do not spin.
                None => std::thread::sleep(Duration::from_millis(10)),
                _ => {}
            }
        }
    }
}

/// Ends this process the way the gateway ended: its exit status, or its signal (raised with
/// the default action, unblocked). Returns the exit status to use should the signal not end
/// it (one whose default action is to continue).
pub fn end_like(end: End) -> u8 {
    match end {
        End::Exited(code) => u8::try_from(code).unwrap_or(1),
        End::Refused => 78,
        End::Signalled(sig) => {
            // SAFETY: resetting a disposition to its default.
            let _ = unsafe { signal::signal(sig, signal::SigHandler::SigDfl) };
            let mut one = SigSet::empty();
            one.add(sig);
            let _ = signal::pthread_sigmask(SigmaskHow::SIG_UNBLOCK, Some(&one), None);
            // SAFETY: raising a signal at this thread.
            let _ = unsafe { libc::raise(sig as libc::c_int) };
            128u8.saturating_add(sig as u8)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Without `/proc/<pid>/task/<pid>/children`, a relaunch finds what to end in the
    /// launcher's cgroup, on a unified or a legacy layout: every other process, never the
    /// launcher; nothing at all when the launcher is in the root group.
    #[test]
    fn the_cgroup_lists_every_process_but_the_launcher() {
        let root = tempfile::tempdir().unwrap();
        for dir in ["system.slice/a.service", "systemd/system.slice/b.service"] {
            let dir = root.path().join(dir);
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join("cgroup.procs"), "7\n8\n9\n").unwrap();
        }
        assert_eq!(
            others_in_cgroup(root.path(), "0::/system.slice/a.service\n", 8),
            Some(vec![7, 9])
        );
        assert_eq!(
            others_in_cgroup(
                root.path(),
                "1:name=systemd:/system.slice/b.service\n0::/\n",
                7
            ),
            Some(vec![8, 9])
        );
        assert_eq!(others_in_cgroup(root.path(), "0::/\n", 7), None);
        assert_eq!(
            others_in_cgroup(root.path(), "0::/system.slice/c.service\n", 7),
            None
        );
    }
}
