//! Nothing of the harness remains after a run, nor after a run killed with SIGKILL once the
//! clean-up has run.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use std::time::{Duration, Instant};

use clawfleet_vm_tests::{
    HarnessConfig, SlotRecord, SlotState, TestHost, list_slots, skip_unless_hosts,
};

#[test]
fn nothing_remains_after_a_normal_run() {
    skip_unless_hosts!();
    let host = TestHost::start().unwrap();
    let rec = host.record();
    let present = rec.leftovers();
    for what in [
        "netns",
        "veth",
        "mounts",
        "cgroup",
        "systemd-nspawn",
        "directory",
    ] {
        assert!(
            present.iter().any(|l| l.starts_with(what)),
            "{what} missing while up: {present:?}"
        );
    }
    let t0 = Instant::now();
    host.shutdown().unwrap();
    eprintln!("teardown of one host: {:.2}s", t0.elapsed().as_secs_f64());
    assert_eq!(rec.leftovers(), Vec::<String>::new());
    let config = HarnessConfig::from_env().unwrap();
    let status = list_slots(&config).unwrap();
    let mine = status.iter().find(|s| s.slot == rec.slot).unwrap();
    assert_ne!(mine.state, SlotState::Stale, "record must be gone");
}

/// Starts `vmhosts up 1` and returns it with its slot's record once the host is up.
fn spawn_vmhosts_up(config: &HarnessConfig) -> (Child, SlotRecord) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_vmhosts"))
        .args(["up", "1"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut slot = None;
    for line in BufReader::new(child.stdout.take().unwrap()).lines() {
        let line = line.unwrap();
        if let Some(rest) = line.strip_prefix("slot=") {
            slot = rest
                .split_whitespace()
                .next()
                .map(|n| n.parse::<u32>().unwrap());
        }
        if line == "READY" {
            break;
        }
    }
    let slot = slot.expect("vmhosts up printed no slot");
    let rec = list_slots(config)
        .unwrap()
        .into_iter()
        .find(|s| s.slot == slot)
        .and_then(|s| s.record)
        .expect("the live run's record");
    assert!(rec.nspawn_pid.is_some());
    (child, rec)
}

#[test]
fn sigterm_and_sigint_tear_down_before_exit() {
    skip_unless_hosts!();
    let config = HarnessConfig::from_env().unwrap();
    for sig in [Signal::SIGTERM, Signal::SIGINT] {
        let (mut child, rec) = spawn_vmhosts_up(&config);
        kill(Pid::from_raw(child.id() as i32), sig).unwrap();
        let status = child.wait().unwrap();
        assert_eq!(status.code(), Some(128 + sig as i32), "{sig}");
        assert_eq!(rec.leftovers(), Vec::<String>::new(), "{sig}");
    }
}

#[test]
fn a_panic_tears_down() {
    skip_unless_hosts!();
    let rec = std::thread::spawn(|| {
        let host = TestHost::start().unwrap();
        let rec = host.record();
        std::panic::panic_any(rec);
    })
    .join()
    .unwrap_err()
    .downcast::<SlotRecord>()
    .unwrap();
    assert_eq!(rec.leftovers(), Vec::<String>::new());
}

#[test]
fn nothing_remains_after_a_killed_run_once_cleaned() {
    skip_unless_hosts!();
    let config = HarnessConfig::from_env().unwrap();
    let (mut child, rec) = spawn_vmhosts_up(&config);
    let slot = rec.slot;
    // SIGKILL: no Drop, no signal handler. The container keeps running without its owner.
    child.kill().unwrap();
    child.wait().unwrap();
    let state = list_slots(&config)
        .unwrap()
        .into_iter()
        .find(|s| s.slot == slot)
        .map(|s| s.state);
    let left = rec.leftovers();
    if state == Some(SlotState::Stale) {
        assert!(
            left.iter().any(|l| l.starts_with("systemd-nspawn")),
            "expected the orphaned container to still run: {left:?}"
        );
    } else {
        // Another test process's start-up reclaimed it already (shared slots).
        eprintln!("slot {slot} was reclaimed by another process first: {state:?}");
    }
    let t0 = Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_vmhosts"))
        .arg("clean")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Another test process's start-up may have reclaimed it first; either way it must be gone.
    eprintln!("{stdout}");
    eprintln!(
        "clean-up of a killed run: {:.2}s",
        t0.elapsed().as_secs_f64()
    );
    // If another process was reclaiming it at that moment, give it time to finish.
    let t1 = Instant::now();
    while !rec.leftovers().is_empty() && t1.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(rec.leftovers(), Vec::<String>::new());
}
