//! `hostd relay` in-process against loopback echo servers: opens are verified and resolved
//! from hostd's state, bytes round-trip, credit bounds what one stalled stream holds while
//! the others flow, the stream cap and the idle timeout hold.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Write;
use std::net::{TcpListener, TcpStream};
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clawfleet_protocol::relay::{
    INITIAL_WINDOW, RELAY_VERSION, RelayFrame, RelayHello, RelayKind, RelayOpen, RelayOpened,
    read_relay_frame, write_relay_frame,
};
use clawfleet_protocol::ssh_key::{Algorithm, PrivateKey};
use clawfleet_protocol::{
    AllowedSigners, Failure, FailureCode, Fingerprint, HostIdentity, HostName, Ident, Principal,
    SIGNATURE_NAMESPACE, Target, Verifier,
};
use hostd::relay::{RelaySettings, Resolve};

fn key() -> PrivateKey {
    PrivateKey::random(
        &mut clawfleet_protocol::ssh_key::rand_core::UnwrapErr(
            clawfleet_protocol::ssh_key::getrandom::SysRng,
        ),
        Algorithm::Ed25519,
    )
    .unwrap()
}

fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// Agents and their ports: `team-a/echo` echoes, `team-a/sink` reads nothing.
struct Ports {
    echo: u16,
    sink: u16,
}

impl Resolve for Ports {
    fn port(&self, namespace: &Ident, agent: &Ident) -> Result<u16, Failure> {
        match (namespace.as_str(), agent.as_str()) {
            ("team-a", "echo") => Ok(self.echo),
            ("team-a", "sink") => Ok(self.sink),
            ("team-a", "down") => Ok(1),
            _ => Err(Failure::new(FailureCode::AgentMissing, "no such Agent")),
        }
    }

    /// `echo` has a managed password, `sink` none.
    fn gateway_password(
        &self,
        _namespace: &Ident,
        agent: &Ident,
    ) -> Result<Option<zeroize::Zeroizing<String>>, Failure> {
        Ok((agent.as_str() == "echo").then(|| zeroize::Zeroizing::new(ECHO_PASSWORD.into())))
    }
}

const ECHO_PASSWORD: &str = "pw-of-echo-0123456789";

fn echo_server() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { return };
            std::thread::spawn(move || {
                let mut r = s.try_clone().unwrap();
                let _ = std::io::copy(&mut r, &mut s);
            });
        }
    });
    port
}

/// Accepts connections and never reads them.
fn sink_server() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    std::thread::spawn(move || {
        let mut held: Vec<TcpStream> = Vec::new();
        for s in l.incoming() {
            let Ok(s) = s else { return };
            held.push(s);
        }
    });
    port
}

struct Harness {
    signer: PrivateKey,
    host: HostIdentity,
    chan: UnixStream,
    frames: std::sync::mpsc::Receiver<RelayFrame>,
}

impl Harness {
    fn start(max_streams: u32, idle: Duration) -> (Self, RelayHello) {
        Self::start_with(max_streams, idle, None)
    }

    /// A relay channel whose streams take the host's slots in `slots` (as `hostd relay`
    /// does with `Layout::relay_slots_dir`).
    fn start_with(
        max_streams: u32,
        idle: Duration,
        slots: Option<std::path::PathBuf>,
    ) -> (Self, RelayHello) {
        let signer = key();
        let host = HostIdentity {
            name: HostName::new("host-a").unwrap(),
            host_key: Fingerprint::of(key().public_key()),
        };
        let line = format!(
            "occ namespaces=\"{SIGNATURE_NAMESPACE}\" {}",
            signer.public_key().to_openssh().unwrap()
        );
        let verifier = Verifier::new(AllowedSigners::parse(&line).unwrap(), host.clone());
        let (ours, theirs) = UnixStream::pair().unwrap();
        let input = theirs.try_clone().unwrap();
        let ports = Arc::new(Ports {
            echo: echo_server(),
            sink: sink_server(),
        });
        std::thread::spawn(move || {
            hostd::relay::run(
                Ok(verifier),
                ports,
                RelaySettings {
                    max_streams,
                    idle_timeout: idle,
                    slots,
                },
                input,
                theirs,
                now,
            )
        });
        let mut reader = ours.try_clone().unwrap();
        let (tx, frames) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            while let Ok(Some(f)) = read_relay_frame(&mut reader) {
                if tx.send(f).is_err() {
                    return;
                }
            }
        });
        let hello = frames.recv_timeout(Duration::from_secs(10)).unwrap();
        assert_eq!(hello.kind, RelayKind::Hello);
        let hello: RelayHello = serde_json::from_slice(&hello.payload).unwrap();
        (
            Self {
                signer,
                host,
                chan: ours,
                frames,
            },
            hello,
        )
    }

    fn open_body(&self, agent: &str) -> RelayOpen {
        RelayOpen {
            version: RELAY_VERSION,
            target: Target {
                host: self.host.name.clone(),
                host_key: self.host.host_key.clone(),
            },
            issuer: Principal::new("occ").unwrap(),
            issued_at: now(),
            expires_at: now() + 60,
            namespace: Ident::new("team-a").unwrap(),
            agent: Ident::new(agent).unwrap(),
            caller: "token:test".into(),
            gateway_auth: false,
        }
    }

    fn send(&mut self, f: RelayFrame) {
        write_relay_frame(&mut self.chan, &f).unwrap();
        self.chan.flush().unwrap();
    }

    fn open(&mut self, id: u32, agent: &str) {
        let signed = self.open_body(agent).sign(&self.signer).unwrap();
        self.send(RelayFrame::new(RelayKind::Open, id, signed.to_payload()));
    }

    fn open_with_auth(&mut self, id: u32, agent: &str) {
        let mut body = self.open_body(agent);
        body.gateway_auth = true;
        let signed = body.sign(&self.signer).unwrap();
        self.send(RelayFrame::new(RelayKind::Open, id, signed.to_payload()));
    }

    fn next(&mut self) -> RelayFrame {
        self.frames
            .recv_timeout(Duration::from_secs(30))
            .expect("a frame from hostd within 30 s")
    }

    /// The next frame that is not a credit grant.
    fn next_not_credit(&mut self) -> RelayFrame {
        loop {
            let f = self.next();
            if f.kind != RelayKind::Credit {
                return f;
            }
        }
    }
}

fn refusal_code(f: &RelayFrame) -> FailureCode {
    assert_eq!(f.kind, RelayKind::Refused, "{f:?}");
    serde_json::from_slice::<Failure>(&f.payload).unwrap().code
}

#[test]
fn a_signed_open_reaches_the_agents_port_and_bytes_round_trip() {
    let (mut h, hello) = Harness::start(16, Duration::from_secs(60));
    assert_eq!(hello.window, INITIAL_WINDOW);
    h.open(1, "echo");
    assert_eq!(h.next().kind, RelayKind::Opened);
    // 8 MiB both ways, within and past the window, granting credit as it arrives.
    let total = 8 << 20;
    let mut sent = 0usize;
    let mut got = Vec::new();
    let mut credit = INITIAL_WINDOW as usize;
    let chunk: Vec<u8> = (0..60_000u32).map(|i| (i % 251) as u8).collect();
    while got.len() < total {
        while sent < total && credit >= chunk.len() {
            let n = chunk.len().min(total - sent);
            h.send(RelayFrame::new(RelayKind::Data, 1, chunk[..n].to_vec()));
            sent += n;
            credit -= n;
        }
        let f = h.next();
        match f.kind {
            RelayKind::Credit => credit += f.credit_increment().unwrap() as usize,
            RelayKind::Data => {
                got.extend_from_slice(&f.payload);
                h.send(RelayFrame::credit(1, f.payload.len() as u32));
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    let want: Vec<u8> = std::iter::repeat_n(chunk.clone(), total / chunk.len() + 1)
        .flatten()
        .take(total)
        .collect();
    assert_eq!(got.len(), want.len());
    assert!(got == want, "the echoed bytes differ");
    // Half-close: the echo server closes, hostd says Eof.
    h.send(RelayFrame::new(RelayKind::Eof, 1, vec![]));
    assert_eq!(h.next_not_credit().kind, RelayKind::Eof);
}

/// An open that asks for the gateway's auth gets the Agent's managed password (from hostd's
/// resolver, never from the request) in its `Opened` frame; a plain open gets nothing.
#[test]
fn an_open_with_gateway_auth_is_answered_the_managed_password() {
    let (mut h, _) = Harness::start(16, Duration::from_secs(60));
    h.open(1, "echo");
    let plain = h.next();
    assert_eq!((plain.kind, plain.payload.len()), (RelayKind::Opened, 0));
    h.open_with_auth(3, "echo");
    let opened = h.next();
    assert_eq!(opened.kind, RelayKind::Opened);
    let body: RelayOpened = serde_json::from_slice(&opened.payload).unwrap();
    assert_eq!(body.gateway_password.as_deref(), Some(ECHO_PASSWORD));
    // An Agent without a managed password: opened, and null.
    h.open_with_auth(5, "sink");
    let opened = h.next_not_credit();
    assert_eq!(opened.kind, RelayKind::Opened);
    let body: RelayOpened = serde_json::from_slice(&opened.payload).unwrap();
    assert_eq!(body.gateway_password, None);
}

#[test]
fn opens_are_refused_with_their_own_codes() {
    let (mut h, _) = Harness::start(16, Duration::from_secs(60));
    h.open(1, "nobody");
    assert_eq!(refusal_code(&h.next()), FailureCode::AgentMissing);
    h.open(2, "down");
    assert_eq!(refusal_code(&h.next()), FailureCode::GatewayUnreachable);
    // Signed by a key that is not enrolled.
    let signed = h.open_body("echo").sign(&key()).unwrap();
    h.send(RelayFrame::new(RelayKind::Open, 3, signed.to_payload()));
    assert_eq!(refusal_code(&h.next()), FailureCode::UnknownSigner);
    // Expired.
    let mut old = h.open_body("echo");
    old.issued_at -= 120;
    old.expires_at = old.issued_at + 60;
    let signed = old.sign(&h.signer).unwrap();
    h.send(RelayFrame::new(RelayKind::Open, 4, signed.to_payload()));
    assert_eq!(refusal_code(&h.next()), FailureCode::EnvelopeExpired);
    // Garbage.
    h.send(RelayFrame::new(RelayKind::Open, 5, b"not an open".to_vec()));
    assert_eq!(h.next().kind, RelayKind::Refused);
    // A ping is answered on the same channel.
    h.send(RelayFrame::new(RelayKind::Ping, 0, b"12345678".to_vec()));
    let pong = h.next();
    assert_eq!(
        (pong.kind, pong.payload),
        (RelayKind::Pong, b"12345678".to_vec())
    );
}

#[test]
fn the_stream_cap_refuses_and_a_closed_stream_frees_its_place() {
    let (mut h, _) = Harness::start(2, Duration::from_secs(60));
    h.open(1, "echo");
    assert_eq!(h.next().kind, RelayKind::Opened);
    h.open(2, "echo");
    assert_eq!(h.next().kind, RelayKind::Opened);
    h.open(3, "echo");
    assert_eq!(refusal_code(&h.next()), FailureCode::RelayStreamLimit);
    h.send(RelayFrame::reset(1, "done"));
    std::thread::sleep(Duration::from_millis(200));
    h.open(4, "echo");
    assert_eq!(h.next_not_credit().kind, RelayKind::Opened);
}

/// The cap is the host's: two relay channels (two `hostd relay` processes, say two
/// coordinators) share it through the slot files, and a stream that ends gives its slot back
/// to whichever channel asks next.
#[test]
fn the_stream_cap_holds_across_channels() {
    let slots = tempfile::tempdir().unwrap();
    let dir = slots.path().join("relay-streams");
    let (mut a, hello) = Harness::start_with(2, Duration::from_secs(60), Some(dir.clone()));
    assert_eq!(hello.max_streams, 2);
    let (mut b, _) = Harness::start_with(2, Duration::from_secs(60), Some(dir.clone()));
    a.open(1, "echo");
    assert_eq!(a.next().kind, RelayKind::Opened);
    b.open(1, "echo");
    assert_eq!(b.next().kind, RelayKind::Opened);
    // Each channel holds one stream of its own two: the host holds two of its two.
    a.open(2, "echo");
    let refused = a.next();
    assert_eq!(refusal_code(&refused), FailureCode::RelayStreamLimit);
    let message = serde_json::from_slice::<Failure>(&refused.payload)
        .unwrap()
        .message;
    assert!(message.contains("all its relay channels"), "{message}");
    b.open(2, "echo");
    assert_eq!(refusal_code(&b.next()), FailureCode::RelayStreamLimit);
    // b's stream ends: its slot goes to a.
    b.send(RelayFrame::reset(1, "done"));
    std::thread::sleep(Duration::from_millis(200));
    a.open(3, "echo");
    assert_eq!(a.next_not_credit().kind, RelayKind::Opened);
    // A channel that ends gives back every slot its streams held.
    a.chan.shutdown(std::net::Shutdown::Both).unwrap();
    std::thread::sleep(Duration::from_millis(500));
    b.open(3, "echo");
    assert_eq!(b.next_not_credit().kind, RelayKind::Opened);
    b.open(4, "echo");
    assert_eq!(b.next_not_credit().kind, RelayKind::Opened);
}

#[test]
fn a_stalled_stream_holds_only_its_window_while_another_flows() {
    let (mut h, _) = Harness::start(16, Duration::from_secs(60));
    h.open(1, "sink");
    assert_eq!(h.next().kind, RelayKind::Opened);
    h.open(2, "echo");
    assert_eq!(h.next().kind, RelayKind::Opened);
    // Fill the sink's window: the gateway reads nothing, so at most the socket buffers
    // and the window are ever in flight; credit stops coming.
    let chunk = vec![7u8; 65_536];
    for _ in 0..(INITIAL_WINDOW as usize / chunk.len()) {
        h.send(RelayFrame::new(RelayKind::Data, 1, chunk.clone()));
    }
    // The echo stream still round-trips promptly.
    let started = Instant::now();
    for round in 0..50u8 {
        h.send(RelayFrame::new(RelayKind::Data, 2, vec![round; 1000]));
        loop {
            let f = h.next();
            if f.kind == RelayKind::Data && f.stream == 2 {
                assert_eq!(f.payload, vec![round; 1000]);
                h.send(RelayFrame::credit(2, 1000));
                break;
            }
        }
    }
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "50 round trips took {:?} next to a stalled stream",
        started.elapsed()
    );
    // Sending past the credit resets the offending stream only (once the sink's socket
    // buffers are full, nothing is acknowledged any more).
    for _ in 0..1024 {
        h.send(RelayFrame::new(RelayKind::Data, 1, chunk.clone()));
    }
    loop {
        let f = h.next();
        if f.kind == RelayKind::Reset {
            assert_eq!(f.stream, 1);
            break;
        }
    }
}

#[test]
fn an_idle_stream_is_reset() {
    let (mut h, _) = Harness::start(16, Duration::from_secs(1));
    h.open(1, "echo");
    assert_eq!(h.next().kind, RelayKind::Opened);
    let f = h.next();
    assert_eq!((f.kind, f.stream), (RelayKind::Reset, 1));
    assert_eq!(String::from_utf8_lossy(&f.payload), "idle timeout");
}
