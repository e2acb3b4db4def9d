//! Nothing of the harness remains after a run, nor after a run killed with SIGKILL once the
//! clean-up has run.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use clawfleet_vm_tests::{HarnessConfig, SlotState, TestHost, list_slots, skip_unless_hosts};

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

#[test]
fn nothing_remains_after_a_killed_run_once_cleaned() {
    skip_unless_hosts!();
    let config = HarnessConfig::from_env().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_vmhosts"))
        .args(["up", "1"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut slot = None;
    let deadline = Instant::now() + Duration::from_secs(300);
    for line in BufReader::new(child.stdout.take().unwrap()).lines() {
        let line = line.unwrap();
        if let Some(rest) = line.strip_prefix("slot=") {
            slot = rest
                .split_whitespace()
                .next()
                .map(|n| n.parse::<u32>().unwrap());
        }
        if line == "READY" || Instant::now() > deadline {
            break;
        }
    }
    let slot = slot.expect("vmhosts up printed no slot");
    // SIGKILL: no Drop, no signal handler. The container keeps running without its owner.
    child.kill().unwrap();
    child.wait().unwrap();
    let rec = list_slots(&config)
        .unwrap()
        .into_iter()
        .find(|s| s.slot == slot)
        .and_then(|s| s.record)
        .expect("the killed run's record must remain");
    let left = rec.leftovers();
    assert!(
        left.iter().any(|l| l.starts_with("systemd-nspawn")),
        "expected the orphaned container to still run: {left:?}"
    );
    let stale = list_slots(&config)
        .unwrap()
        .into_iter()
        .find(|s| s.slot == slot)
        .unwrap();
    assert_eq!(stale.state, SlotState::Stale);
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
    assert_eq!(rec.leftovers(), Vec::<String>::new());
}
