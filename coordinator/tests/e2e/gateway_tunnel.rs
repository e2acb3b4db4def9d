//! Issue 30 end to end: `occ agent connect` against a real `occ serve` driving a real test
//! host (systemd-nspawn, hostd behind its `restrict` key, sshd with every forwarding off), to
//! the test gateway's echo WebSocket (`/x-clawfleet-test/echo`) through hostd's relay channel:
//! 1 GiB comes back byte for byte on one stream; 256 streams at once each get theirs back;
//! a client that stalls (writes, never reads) does not hold another stream back.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::fleet_support as fleet;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use fleet::{Fleet, FleetOptions, Want, document};

/// `occ agent connect`, killed and reaped when the test ends.
struct Connect(Child);

impl Drop for Connect {
    fn drop(&mut self) {
        if let Err(e) = self.0.kill() {
            eprintln!("occ agent connect: kill: {e}");
        }
        if let Err(e) = self.0.wait() {
            eprintln!("occ agent connect: wait: {e}");
        }
    }
}

/// Starts `occ agent connect NS a1` and returns it with its local address.
fn connect(fleet: &Fleet) -> (Connect, String) {
    let mut child = fleet
        .occ_command(&["agent", "connect", fleet::NS, "a1"])
        .env("OCC_LOG", "error")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let guard = Connect(child);
    let mut line = String::new();
    BufReader::new(stdout).read_line(&mut line).unwrap();
    let addr = line
        .strip_prefix("listening on ")
        .and_then(|r| r.split_whitespace().next())
        .unwrap_or_else(|| panic!("occ agent connect printed {line:?}"))
        .to_owned();
    (guard, addr)
}

/// A WebSocket to the test gateway's echo through the tunnel, past its 101.
fn echo_socket(addr: &str) -> TcpStream {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_nodelay(true).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    write!(
        s,
        "GET /x-clawfleet-test/echo HTTP/1.1\r\nHost: gateway\r\nConnection: Upgrade\r\n\
         Upgrade: websocket\r\nSec-WebSocket-Version: 13\r\n\
         Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n"
    )
    .unwrap();
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        assert_eq!(s.read(&mut b).unwrap(), 1, "the tunnel closed in the head");
        head.push(b[0]);
    }
    let head = String::from_utf8_lossy(&head);
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    s
}

/// Frame `i`'s payload: `len` bytes that differ from frame to frame.
fn payload(i: u64, len: usize) -> Vec<u8> {
    (0..len as u64)
        .map(|j| ((i * 131 + j * 7) % 251) as u8)
        .collect()
}

/// A masked binary frame (the client's side).
fn masked_frame(payload: &[u8]) -> Vec<u8> {
    clawfleet_protocol::websocket::client_frame(0x2, payload, [0x5a, 0x17, 0xc3, 0x80]).to_vec()
}

/// Reads one unmasked frame from the gateway; returns its payload.
fn read_frame(s: &mut TcpStream) -> Vec<u8> {
    let mut head = [0u8; 2];
    s.read_exact(&mut head).unwrap();
    assert_eq!(head[0], 0x82, "not a final binary frame: {head:?}");
    let len = match head[1] & 0x7f {
        126 => {
            let mut l = [0u8; 2];
            s.read_exact(&mut l).unwrap();
            u64::from(u16::from_be_bytes(l))
        }
        127 => {
            let mut l = [0u8; 8];
            s.read_exact(&mut l).unwrap();
            u64::from_be_bytes(l)
        }
        n => u64::from(n),
    };
    let mut payload = vec![0u8; len as usize];
    s.read_exact(&mut payload).unwrap();
    payload
}

/// Sends `frames` frames of `len` bytes and checks each echo as it comes back, the writer
/// and the reader side by side; returns how long it took.
fn echo_frames(s: TcpStream, frames: u64, len: usize) -> Duration {
    let started = Instant::now();
    let mut writer = s.try_clone().unwrap();
    let send = std::thread::spawn(move || {
        for i in 0..frames {
            writer.write_all(&masked_frame(&payload(i, len))).unwrap();
        }
    });
    let mut reader = s;
    for i in 0..frames {
        let got = read_frame(&mut reader);
        assert!(got == payload(i, len), "frame {i} came back changed");
    }
    send.join().unwrap();
    started.elapsed()
}

fn fleet_with_agent() -> Fleet {
    let fleet = Fleet::start_with(FleetOptions {
        hosts: 1,
        ..FleetOptions::default()
    });
    fleet.create_agent("a1", &document("a1-r1", serde_json::json!({})));
    let rev = fleet.deploy("a1");
    fleet.wait_converged(
        &[(
            "a1",
            Want::Running {
                rev,
                label: "a1-r1".into(),
            },
        )],
        Instant::now(),
        Duration::from_secs(120),
    );
    fleet
}

#[test]
fn a_gibibyte_and_256_streams_echo_through_occ_agent_connect_on_a_real_host() {
    clawfleet_vm_tests::skip_unless_hosts!();
    let fleet = fleet_with_agent();
    let (_connect, addr) = connect(&fleet);

    // 1 GiB on one stream, in 1 MiB frames (the echo's largest).
    let frames = 1024;
    let took = echo_frames(echo_socket(&addr), frames, 1 << 20);
    eprintln!(
        "1 GiB echoed through occ agent connect in {:.1} s ({:.0} MB/s each way)",
        took.as_secs_f64(),
        (frames << 20) as f64 / took.as_secs_f64() / 1e6
    );

    // 256 streams at once (the per-token cap), 256 KiB each.
    let started = Instant::now();
    let sockets: Vec<TcpStream> = (0..256).map(|_| echo_socket(&addr)).collect();
    let opened = started.elapsed();
    let workers: Vec<_> = sockets
        .into_iter()
        .map(|s| std::thread::spawn(move || echo_frames(s, 4, 64 << 10)))
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    eprintln!(
        "256 streams opened in {:.2} s and echoed in {:.2} s",
        opened.as_secs_f64(),
        started.elapsed().as_secs_f64()
    );
}

#[test]
fn a_stalled_client_does_not_hold_back_another_stream_on_a_real_host() {
    clawfleet_vm_tests::skip_unless_hosts!();
    let fleet = fleet_with_agent();
    let (_connect, addr) = connect(&fleet);
    let alone = echo_frames(echo_socket(&addr), 64, 1 << 20);

    // A client that writes frames and never reads an echo: every buffer on its way fills
    // and stays full, and its writer blocks until the tunnel goes away when the test ends.
    let mut stalled = echo_socket(&addr);
    std::thread::spawn(move || {
        for i in 0..1024 {
            if stalled
                .write_all(&masked_frame(&payload(i, 1 << 20)))
                .is_err()
            {
                break;
            }
        }
    });
    std::thread::sleep(Duration::from_secs(2));
    let beside = echo_frames(echo_socket(&addr), 64, 1 << 20);
    eprintln!(
        "64 MiB alone in {:.2} s, beside a stalled client in {:.2} s",
        alone.as_secs_f64(),
        beside.as_secs_f64()
    );
    assert!(
        beside < alone * 3 + Duration::from_secs(1),
        "a stalled client slowed another stream: {beside:?} against {alone:?} alone"
    );
}
