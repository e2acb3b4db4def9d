//! Issue 11, bounded input: a holder of only the SSH login key floods `hostd serve` with
//! 1 MiB frames and never reads a reply. hostd blocks writing replies, and must then stop
//! reading frames too, so its memory stays bounded by a few frames. `hostd serve` runs here as
//! a child process over pipes (no host needed); its VmRSS and VmHWM come from /proc.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Write;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use clawfleet_protocol::framing::{Frame, FrameKind, write_frame};
use clawfleet_protocol::ssh_key::{Algorithm, PrivateKey, getrandom::SysRng, rand_core::UnwrapErr};

const MIB: usize = 1024 * 1024;
/// Frames the attacker tries to send (the unbounded hostd took 1 GB in 3 s).
const FLOOD_FRAMES: usize = 1500;

fn status_kib(pid: u32, field: &str) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
}

#[test]
fn a_flood_of_1_mib_frames_from_a_client_that_never_reads_keeps_hostd_small() {
    // Not under /tmp or /var/tmp (the configuration refuses state roots there), and not in
    // the checkout either, which may itself live under /tmp: the home directory.
    let home = std::env::var_os("HOME").map_or_else(|| "/root".into(), std::path::PathBuf::from);
    let dir = tempfile::Builder::new()
        .prefix(".hostd-flood-")
        .tempdir_in(home)
        .unwrap();
    let key = |name: &str| {
        let k = PrivateKey::random(&mut UnwrapErr(SysRng), Algorithm::Ed25519).unwrap();
        let path = dir.path().join(name);
        std::fs::write(&path, k.public_key().to_openssh().unwrap()).unwrap();
        (path, k)
    };
    let (host_key, _) = key("host_key.pub");
    let (_, signer) = key("signer.pub");
    let signers = dir.path().join("allowed_signers");
    std::fs::write(
        &signers,
        format!(
            "occ@test namespaces=\"clawfleet-operation\" {}\n",
            signer.public_key().to_openssh().unwrap()
        ),
    )
    .unwrap();
    let config = dir.path().join("hostd.toml");
    std::fs::write(
        &config,
        format!(
            "host_name = \"h1\"\nhost_key = \"{}\"\nallowed_signers = \"{}\"\nstate_root = \"{}\"\nunit_dir = \"{}\"\ngateway_command = [\"/bin/true\"]\n",
            host_key.display(),
            signers.display(),
            dir.path().join("state").display(),
            dir.path().join("units").display(),
        ),
    )
    .unwrap();

    let mut child = Command::new(env!("CARGO_BIN_EXE_hostd"))
        .arg("--config")
        .arg(&config)
        .arg("serve")
        .env("HOSTD_LOG", "off")
        .stdin(Stdio::piped())
        // Never read: hostd's replies fill the pipe and its writes block.
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let pid = child.id();
    let mut stdin = child.stdin.take().unwrap();
    let _stdout = child.stdout.take().unwrap();

    let sent = Arc::new(AtomicUsize::new(0));
    let done = Arc::new(AtomicBool::new(false));
    let writer = {
        let (sent, done) = (Arc::clone(&sent), Arc::clone(&done));
        std::thread::spawn(move || {
            let frame = Frame {
                kind: FrameKind::Envelope,
                payload: vec![b'x'; MIB],
            };
            for _ in 0..FLOOD_FRAMES {
                if write_frame(&mut stdin, &frame, MIB).is_err() || stdin.flush().is_err() {
                    break;
                }
                sent.fetch_add(1, Ordering::SeqCst);
            }
            done.store(true, Ordering::SeqCst);
        })
    };

    // Watch until the writer is held back (no progress for 2 s) or has sent everything.
    let start = Instant::now();
    let mut last = (0, Instant::now());
    let mut peak_rss = 0;
    while start.elapsed() < Duration::from_secs(60) && !done.load(Ordering::SeqCst) {
        std::thread::sleep(Duration::from_millis(50));
        peak_rss = peak_rss.max(status_kib(pid, "VmRSS:").unwrap_or(0));
        let n = sent.load(Ordering::SeqCst);
        if n != last.0 {
            last = (n, Instant::now());
        } else if last.1.elapsed() > Duration::from_secs(2) {
            break;
        }
    }
    let hwm = status_kib(pid, "VmHWM:").expect("hostd is still running");
    let frames = sent.load(Ordering::SeqCst);
    println!(
        "flood: {frames} frames of 1 MiB accepted before the client was held back; hostd VmRSS peak {} KiB, VmHWM {} KiB",
        peak_rss, hwm
    );
    // The child is ours: end it by its handle, which also unblocks the writer.
    let _ = child.kill();
    let _ = child.wait();
    let _ = writer.join();

    assert!(
        frames < FLOOD_FRAMES,
        "hostd kept reading all {frames} frames while it could not write its replies"
    );
    assert!(
        hwm < 64 * 1024,
        "hostd's VmHWM {hwm} KiB is not under 64 MiB"
    );
}
