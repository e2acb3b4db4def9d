//! `hostd exec-gateway --supervise` as a process (hostd/src/supervise.rs), without systemd: a
//! relaunch replaces the gateway and ends everything it left behind while the launcher stays,
//! starting the new gateway only when asked; the launcher ends the way its gateway ended. No
//! root needed.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// A gateway stand-in: records its pid (and its helper's, one that ignores SIGTERM in a
/// session of its own, so only the launcher's sweep of descendants can end it), then runs
/// until SIGTERM, which it answers with `on_term`.
fn gateway_script(dir: &Path, on_term: &str) -> String {
    format!(
        "setsid sh -c 'trap \"\" TERM; echo $$ >> {d}/helpers; while :; do sleep 0.05; done' & \
         echo $$ >> {d}/pids; trap '{on_term}' TERM; while :; do sleep 0.05; done",
        d = dir.display()
    )
}

/// How long the launchers here wait for the start after a relaunch's stop.
const START_WAIT_SECS: u64 = 2;

fn launcher(stop_timeout_secs: u64, script: &str) -> Child {
    Command::new(env!("CARGO_BIN_EXE_hostd"))
        .args([
            "exec-gateway",
            "--supervise",
            "--stop-timeout-secs",
            &stop_timeout_secs.to_string(),
            "--start-wait-secs",
            &START_WAIT_SECS.to_string(),
            "--port",
            "40999",
            "--",
            "/bin/sh",
            "-c",
            script,
        ])
        .spawn()
        .unwrap()
}

/// Ends, by their own ids, whatever a failed test left running: the launcher and every
/// gateway and helper it recorded.
struct Cleanup<'a>(&'a Path, u32);

impl Drop for Cleanup<'_> {
    fn drop(&mut self) {
        let recorded = lines(&self.0.join("pids"))
            .into_iter()
            .chain(lines(&self.0.join("helpers")));
        for pid in recorded.chain([self.1 as i32]) {
            if alive(pid) {
                let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
            }
        }
    }
}

/// A launcher running [`gateway_script`] with `on_term`, its records in `dir`; ended by
/// [`Cleanup`] whatever the test's outcome. Returns once its first gateway and that gateway's
/// helper run, with the first gateway's pid.
fn supervised<'a>(
    dir: &'a Path,
    stop_timeout_secs: u64,
    on_term: &str,
) -> (Child, Cleanup<'a>, i32) {
    let l = launcher(stop_timeout_secs, &gateway_script(dir, on_term));
    let cleanup = Cleanup(dir, l.id());
    wait_for_gateways(dir, 1);
    let first = lines(&dir.join("pids"))[0];
    (l, cleanup, first)
}

fn lines(path: &Path) -> Vec<i32> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

fn wait_for(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Waits until `n` gateways and their `n` helpers have recorded their pids (a helper writes
/// its own on its own time).
fn wait_for_gateways(d: &Path, n: usize) {
    wait_for(&format!("{n} gateways and their helpers"), || {
        lines(&d.join("pids")).len() == n && lines(&d.join("helpers")).len() == n
    });
}

/// Waits until no gateway or helper recorded in `d` runs.
fn wait_all_gone(d: &Path) {
    for pid in lines(&d.join("pids"))
        .into_iter()
        .chain(lines(&d.join("helpers")))
    {
        wait_for("every gateway process to be gone", || !alive(pid));
    }
}

fn alive(pid: i32) -> bool {
    // A zombie still answers kill(0); its state says it is gone.
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| {
            s.rsplit_once(')')
                .is_some_and(|(_, rest)| !rest.trim_start().starts_with('Z'))
        })
        .unwrap_or(false)
}

fn wait_exit(child: &mut Child) -> std::process::ExitStatus {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        assert!(Instant::now() < deadline, "the launcher did not end");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn a_relaunch_replaces_the_gateway_and_its_leftovers_and_the_launcher_stays() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (mut l, _cleanup, first) = supervised(d, 5, "exit 0");
    let launcher_pid = Pid::from_raw(l.id() as i32);
    let helper = lines(&d.join("helpers"))[0];

    relaunch(launcher_pid, first);
    wait_for("the second gateway", || lines(&d.join("pids")).len() == 2);
    let second = lines(&d.join("pids"))[1];
    assert_ne!(first, second);
    assert!(!alive(helper), "the first gateway's helper outlived it");
    assert!(alive(second), "the new gateway runs");
    assert!(l.try_wait().unwrap().is_none(), "the launcher stays");

    // A second relaunch works the same way.
    relaunch(launcher_pid, second);
    wait_for("the third gateway", || lines(&d.join("pids")).len() == 3);

    // The unit's stop: the gateway gets SIGTERM and exits 0; so does the launcher, and
    // nothing of the gateway is left.
    kill(launcher_pid, Signal::SIGTERM).unwrap();
    let status = wait_exit(&mut l);
    assert_eq!(status.code(), Some(0), "{status:?}");
    wait_all_gone(d);
}

#[test]
fn the_launcher_ends_as_its_gateway_ended() {
    // Exits by itself with EX_CONFIG: the launcher too (the unit's RestartPreventExitStatus).
    let mut l = launcher(5, "exit 78");
    assert_eq!(wait_exit(&mut l).code(), Some(78));

    // Killed by a signal: the launcher ends by the same signal.
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // Both recorded: the helper writes its pid on its own time.
    let (mut l, _cleanup, gateway) = supervised(d, 5, "exit 0");
    kill(Pid::from_raw(gateway), Signal::SIGKILL).unwrap();
    let status = wait_exit(&mut l);
    assert_eq!(status.signal(), Some(libc_sigkill()), "{status:?}");
    let helper = lines(&d.join("helpers"))[0];
    wait_for("its helper to be gone", || !alive(helper));
}

#[test]
fn a_gateway_that_ignores_sigterm_is_killed_after_the_stop_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (mut l, _cleanup, first) = supervised(d, 1, "");
    let asked = Instant::now();
    relaunch(Pid::from_raw(l.id() as i32), first);
    assert!(
        asked.elapsed() >= Duration::from_millis(900),
        "the relaunch did not wait for the stop timeout: {:?}",
        asked.elapsed()
    );
    wait_for("the second gateway", || lines(&d.join("pids")).len() == 2);
    // The stop waits as long, then kills the gateway; the launcher ends by its SIGKILL.
    kill(Pid::from_raw(l.id() as i32), Signal::SIGTERM).unwrap();
    let status = wait_exit(&mut l);
    assert_eq!(status.signal(), Some(libc_sigkill()), "{status:?}");
    wait_all_gone(d);
}

/// A relaunch as hostd does it: SIGHUP, then, once the old gateway is gone, SIGUSR1.
fn relaunch(launcher: Pid, old: i32) {
    kill(launcher, Signal::SIGHUP).unwrap();
    wait_for("the old gateway to be gone", || !alive(old));
    kill(launcher, Signal::SIGUSR1).unwrap();
}

fn libc_sigkill() -> i32 {
    Signal::SIGKILL as i32
}

/// Between a relaunch's stop and hostd's SIGUSR1 no gateway runs (hostd puts the new
/// configuration in place then); a SIGUSR1 left from before does not start one early; without
/// SIGUSR1 the launcher starts the gateway once its start wait passes.
#[test]
fn a_relaunch_starts_the_new_gateway_only_when_asked_or_after_the_start_wait() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (mut l, _cleanup, first) = supervised(d, 5, "exit 0");
    let launcher_pid = Pid::from_raw(l.id() as i32);

    // A late SIGUSR1 from an earlier relaunch, pending before this one.
    kill(launcher_pid, Signal::SIGUSR1).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    assert!(
        alive(l.id() as i32),
        "SIGUSR1 outside a relaunch ended the launcher"
    );
    kill(launcher_pid, Signal::SIGHUP).unwrap();
    wait_for("the old gateway to be gone", || !alive(first));
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(
        lines(&d.join("pids")).len(),
        1,
        "a gateway started before hostd asked for it"
    );
    kill(launcher_pid, Signal::SIGUSR1).unwrap();
    wait_for_gateways(d, 2);
    let second = lines(&d.join("pids"))[1];

    // hostd gone after the stop: the start wait passes and the gateway starts anyway.
    kill(launcher_pid, Signal::SIGHUP).unwrap();
    let stopped = Instant::now();
    wait_for("the second gateway to be gone", || !alive(second));
    wait_for("the third gateway", || lines(&d.join("pids")).len() == 3);
    let waited = stopped.elapsed();
    assert!(
        waited >= Duration::from_secs(START_WAIT_SECS) - Duration::from_millis(100),
        "started after {waited:?}, before the start wait passed"
    );

    // Nothing of the gateways outlives the unit's stop.
    wait_for_gateways(d, 3);
    kill(launcher_pid, Signal::SIGTERM).unwrap();
    assert_eq!(wait_exit(&mut l).code(), Some(0));
    wait_all_gone(d);
}

/// The unit's stop while the launcher waits for the start ends the launcher, without a new
/// gateway.
#[test]
fn a_stop_during_the_start_wait_ends_the_launcher() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (mut l, _cleanup, first) = supervised(d, 5, "exit 0");
    let launcher_pid = Pid::from_raw(l.id() as i32);
    kill(launcher_pid, Signal::SIGHUP).unwrap();
    wait_for("the old gateway to be gone", || !alive(first));
    kill(launcher_pid, Signal::SIGTERM).unwrap();
    let status = wait_exit(&mut l);
    assert_eq!(status.code(), Some(0), "{status:?}");
    assert_eq!(lines(&d.join("pids")).len(), 1, "a new gateway started");
}
