//! `hostd relay`: gateway streams for the coordinator (issue 30), over one SSH session
//! channel per host, separate from the operation sessions.
//!
//! The coordinator's key is forced to run `hostd serve`; a session that asked for
//! [`RELAY_COMMAND`] (sshd puts it in `SSH_ORIGINAL_COMMAND`) relays instead. The frames and
//! the signed open are [`clawfleet_protocol::relay`]'s. For each open hostd verifies the
//! signature like an operation's, reads the Agent's port from the Agent's own marker (never
//! from the request) and connects to `127.0.0.1:<port>` only: the Agent's host-held front
//! (issue 28), which waits through cutovers.
//!
//! Threads, std only: one reads the channel and dispatches (never blocks on a stream: a
//! stream's inbound bytes are bounded by the credit it granted), one writes frames to the
//! channel, and two per stream (gateway → channel respecting the peer's credit; channel →
//! gateway granting credit as bytes are written). A stream without a byte either way for
//! the idle timeout is reset; at most `max_streams` are open at once on the host, all relay
//! channels together: each open stream holds one of that many slot files
//! ([`RelaySettings::slots`], a kernel `flock` released however the process ends), so a
//! coordinator that opens many channels (or several coordinators) cannot multiply the cap.

use std::collections::HashMap;
use std::io::{BufReader, BufWriter, Read, Write};
use std::net::{Ipv4Addr, Shutdown, SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, SyncSender, sync_channel};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use clawfleet_protocol::relay::{
    INITIAL_WINDOW, MAX_PAYLOAD, RELAY_VERSION, RelayFrame, RelayFrameError, RelayHello, RelayKind,
    RelayOpen, RelayOpened, read_relay_frame, verify_open, write_relay_frame,
};
use clawfleet_protocol::{Failure, FailureCode, Ident, Limits, SignedEnvelope, Verifier};
use thiserror::Error;
use zeroize::{Zeroize, Zeroizing};

use crate::layout::Layout;
use crate::markers::{self, AgentMarker};

/// The command a relay session asks for.
pub use clawfleet_protocol::relay::RELAY_COMMAND;

/// How long a connect to the Agent's front may take (it accepts at once: systemd listens).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Why a stream the coordinator reset ended.
const REASON_PEER_RESET: &str = "reset by the coordinator";
/// Frames queued for the channel before stream threads wait.
const WRITE_QUEUE: usize = 1024;

/// The relay's limits.
#[derive(Debug, Clone)]
pub struct RelaySettings {
    /// Streams open at once on this host (on this channel without `slots`); more are
    /// refused with `RELAY_STREAM_LIMIT`.
    pub max_streams: u32,
    /// The directory of the host's stream slots (`Layout::relay_slots_dir`), shared by every
    /// relay channel; `None` bounds this channel alone (tests).
    pub slots: Option<std::path::PathBuf>,
    /// A stream without a byte either way for this long is reset.
    pub idle_timeout: Duration,
}

/// Why the relay ended other than by its channel closing.
#[derive(Debug, Error)]
pub enum RelayError {
    #[error("the relay channel broke: {0}")]
    Frame(#[from] RelayFrameError),
}

/// Where an Agent's gateway is, from hostd's own state.
pub trait Resolve: Send + Sync {
    /// The Agent's host-held port.
    fn port(&self, namespace: &Ident, agent: &Ident) -> Result<u16, Failure>;

    /// The Agent's managed gateway password, `None` when it has none (its configuration
    /// takes no password). Asked only by an open with `gatewayAuth`, after [`Resolve::port`].
    fn gateway_password(
        &self,
        namespace: &Ident,
        agent: &Ident,
    ) -> Result<Option<Zeroizing<String>>, Failure>;
}

/// Reads the port from the Agent's marker (`agent.json`).
#[derive(Debug, Clone)]
pub struct MarkerResolver {
    pub layout: Layout,
}

impl Resolve for MarkerResolver {
    fn port(&self, namespace: &Ident, agent: &Ident) -> Result<u16, Failure> {
        let paths = self.layout.agent(namespace, agent);
        let marker: Option<AgentMarker> = markers::read_optional(&paths.marker, "agent")
            .map_err(|e| Failure::new(FailureCode::IoFailed, e.to_string()))?;
        match marker {
            None => Err(Failure::new(
                FailureCode::AgentMissing,
                format!("Agent {namespace}/{agent} is not on this host"),
            )),
            Some(m) if &m.namespace_id != namespace || &m.agent_id != agent => Err(Failure::new(
                FailureCode::OwnershipMismatch,
                format!("the marker of Agent {namespace}/{agent} names another Agent"),
            )),
            Some(m) => Ok(m.port),
        }
    }

    fn gateway_password(
        &self,
        namespace: &Ident,
        agent: &Ident,
    ) -> Result<Option<Zeroizing<String>>, Failure> {
        let paths = self.layout.agent(namespace, agent);
        if !crate::fsutil::file_exists(&paths.password_file).map_err(crate::engine::fs_failure)? {
            return Ok(None);
        }
        crate::engine::managed_password(&paths).map(Some)
    }
}

/// What the channel reader hands a stream's gateway writer.
enum ToGateway {
    Data(Vec<u8>),
    Eof,
    Reset,
}

/// The peer's credit for a stream (bytes hostd may still send) and whether the stream ended.
struct Credit {
    state: Mutex<(u64, bool)>,
    changed: Condvar,
}

impl Credit {
    fn add(&self, n: u64) {
        if let Ok(mut s) = self.state.lock() {
            s.0 = s.0.saturating_add(n);
            self.changed.notify_all();
        }
    }

    fn close(&self) {
        if let Ok(mut s) = self.state.lock() {
            s.1 = true;
            self.changed.notify_all();
        }
    }

    fn is_closed(&self) -> bool {
        self.state.lock().map(|s| s.1).unwrap_or(true)
    }

    /// Waits for credit; `None` once the stream ended.
    fn take(&self, want: u64) -> Option<u64> {
        let mut s = self.state.lock().ok()?;
        loop {
            if s.1 {
                return None;
            }
            if s.0 > 0 {
                let n = s.0.min(want);
                s.0 -= n;
                return Some(n);
            }
            s = self.changed.wait(s).ok()?;
        }
    }
}

/// The reader's handle on one stream.
struct StreamHandle {
    to_gateway: Sender<ToGateway>,
    /// The host-wide slot the stream holds while it is open (released when dropped).
    _slot: Option<crate::session::SessionSlot>,
    /// Bytes received and not yet written to the gateway (bounded by the window).
    unacked: Arc<AtomicU32>,
    credit: Arc<Credit>,
}

type Streams = Arc<Mutex<HashMap<u32, StreamHandle>>>;

/// Runs the relay until its channel closes. `verifier` is `Err` when allowed_signers is
/// unusable: every open is refused with that failure.
pub fn run<R: Read, W: Write + Send + 'static>(
    verifier: Result<Verifier, Failure>,
    resolver: Arc<dyn Resolve>,
    settings: RelaySettings,
    input: R,
    output: W,
    now: fn() -> u64,
) -> Result<(), RelayError> {
    let (tx, rx) = sync_channel::<RelayFrame>(WRITE_QUEUE);
    let writer = std::thread::spawn(move || write_loop(rx, output));
    let hello = RelayHello {
        version: RELAY_VERSION,
        max_streams: settings.max_streams,
        window: INITIAL_WINDOW,
        idle_timeout_seconds: settings.idle_timeout.as_secs(),
    };
    let hello = serde_json::to_vec(&hello).unwrap_or_default();
    if tx
        .send(RelayFrame::new(RelayKind::Hello, 0, hello))
        .is_err()
    {
        return Ok(());
    }
    let verifier = Arc::new(verifier);
    let streams: Streams = Arc::new(Mutex::new(HashMap::new()));
    let mut input = BufReader::with_capacity(256 * 1024, input);
    let result = loop {
        let frame = match read_relay_frame(&mut input) {
            Ok(Some(f)) => f,
            Ok(None) => break Ok(()),
            Err(e) => break Err(e),
        };
        dispatch(frame, &tx, &streams, &verifier, &resolver, &settings, now);
    };
    // The channel is gone: end every stream.
    if let Ok(mut map) = streams.lock() {
        for (_, h) in map.drain() {
            let _ = h.to_gateway.send(ToGateway::Reset);
            h.credit.close();
        }
    }
    drop(tx);
    let _ = writer.join();
    Ok(result?)
}

fn write_loop<W: Write>(rx: Receiver<RelayFrame>, output: W) {
    let mut out = BufWriter::with_capacity(256 * 1024, output);
    while let Ok(frame) = rx.recv() {
        if write_relay_frame(&mut out, &frame).is_err() {
            return;
        }
        // Write whatever is queued, then flush once.
        while let Ok(more) = rx.try_recv() {
            if write_relay_frame(&mut out, &more).is_err() {
                return;
            }
        }
        if out.flush().is_err() {
            return;
        }
    }
}

fn dispatch(
    frame: RelayFrame,
    tx: &SyncSender<RelayFrame>,
    streams: &Streams,
    verifier: &Arc<Result<Verifier, Failure>>,
    resolver: &Arc<dyn Resolve>,
    settings: &RelaySettings,
    now: fn() -> u64,
) {
    let id = frame.stream;
    match frame.kind {
        RelayKind::Ping => {
            let _ = tx.send(RelayFrame::new(RelayKind::Pong, 0, frame.payload));
        }
        RelayKind::Open => {
            let Ok(mut map) = streams.lock() else { return };
            if id == 0 || map.contains_key(&id) {
                let _ = tx.send(RelayFrame::reset(id, "the stream id is 0 or in use"));
                return;
            }
            if map.len() >= settings.max_streams as usize {
                let f = Failure::new(
                    FailureCode::RelayStreamLimit,
                    format!(
                        "this relay channel already carries {} streams ([limits] max_relay_streams)",
                        settings.max_streams
                    ),
                );
                let _ = tx.send(refusal(id, &f));
                return;
            }
            let slot = match &settings.slots {
                None => None,
                Some(dir) => match crate::session::take_slot_from(dir, settings.max_streams, id) {
                    Ok(Some(slot)) => Some(slot),
                    Ok(None) => {
                        let f = Failure::new(
                            FailureCode::RelayStreamLimit,
                            format!(
                                "this host already carries {} gateway streams on all its relay channels together ([limits] max_relay_streams)",
                                settings.max_streams
                            ),
                        );
                        let _ = tx.send(refusal(id, &f));
                        return;
                    }
                    Err(e) => {
                        let f = Failure::new(
                            FailureCode::Internal,
                            format!("cannot take a gateway stream slot: {e}"),
                        );
                        let _ = tx.send(refusal(id, &f));
                        return;
                    }
                },
            };
            let (to_gateway, from_reader) = std::sync::mpsc::channel();
            let credit = Arc::new(Credit {
                state: Mutex::new((u64::from(INITIAL_WINDOW), false)),
                changed: Condvar::new(),
            });
            let unacked = Arc::new(AtomicU32::new(0));
            map.insert(
                id,
                StreamHandle {
                    to_gateway,
                    _slot: slot,
                    unacked: unacked.clone(),
                    credit: credit.clone(),
                },
            );
            drop(map);
            let stream = Stream {
                id,
                tx: tx.clone(),
                streams: streams.clone(),
                credit,
                unacked,
                idle_timeout: settings.idle_timeout,
            };
            let verifier = verifier.clone();
            let resolver = resolver.clone();
            std::thread::spawn(move || {
                stream.run(
                    &frame.payload,
                    &verifier,
                    resolver.as_ref(),
                    now,
                    from_reader,
                )
            });
        }
        RelayKind::Data => {
            let Ok(map) = streams.lock() else { return };
            let Some(h) = map.get(&id) else { return };
            let len = frame.payload.len() as u32;
            let before = h.unacked.fetch_add(len, Ordering::SeqCst);
            if before.saturating_add(len) > INITIAL_WINDOW {
                let _ = h.to_gateway.send(ToGateway::Reset);
                let _ = tx.send(RelayFrame::reset(
                    id,
                    "the coordinator sent more than its credit on this stream",
                ));
            } else {
                let _ = h.to_gateway.send(ToGateway::Data(frame.payload));
            }
        }
        RelayKind::Credit => {
            let Ok(map) = streams.lock() else { return };
            if let (Some(h), Some(n)) = (map.get(&id), frame.credit_increment()) {
                h.credit.add(u64::from(n));
            }
        }
        RelayKind::Eof => {
            if let Ok(map) = streams.lock()
                && let Some(h) = map.get(&id)
            {
                let _ = h.to_gateway.send(ToGateway::Eof);
            }
        }
        RelayKind::Reset => {
            let handle = streams.lock().ok().and_then(|mut m| m.remove(&id));
            if let Some(h) = handle {
                let _ = h.to_gateway.send(ToGateway::Reset);
                h.credit.close();
            }
        }
        // hostd's own kinds coming back, or a pong to a ping hostd never sends: ignored.
        RelayKind::Hello | RelayKind::Opened | RelayKind::Refused | RelayKind::Pong => {}
    }
}

fn refusal(id: u32, failure: &Failure) -> RelayFrame {
    RelayFrame::new(
        RelayKind::Refused,
        id,
        serde_json::to_vec(failure).unwrap_or_default(),
    )
}

/// One stream's own state.
struct Stream {
    id: u32,
    tx: SyncSender<RelayFrame>,
    streams: Streams,
    credit: Arc<Credit>,
    unacked: Arc<AtomicU32>,
    idle_timeout: Duration,
}

/// The `Opened` payload of an open that asked for the gateway's auth: the Agent's managed
/// password from hostd's own state ([`RelayOpened`]).
fn opened_with_auth(open: &RelayOpen, resolver: &dyn Resolve) -> Result<Vec<u8>, Failure> {
    let password = resolver.gateway_password(&open.namespace, &open.agent)?;
    let body = RelayOpened {
        gateway_password: password.as_ref().map(|p| p.as_str().to_owned()),
    };
    let bytes = serde_json::to_vec(&body).map_err(|e| {
        Failure::new(
            FailureCode::Internal,
            format!("the relay's opened answer does not encode: {e}"),
        )
    })?;
    let mut body = body;
    if let Some(p) = body.gateway_password.as_mut() {
        p.zeroize();
    }
    Ok(bytes)
}

fn elapsed_ms(start: Instant) -> u64 {
    start.elapsed().as_millis() as u64
}

impl Stream {
    fn forget(&self) {
        if let Ok(mut m) = self.streams.lock() {
            m.remove(&self.id);
        }
        self.credit.close();
    }

    fn run(
        self,
        open: &[u8],
        verifier: &Result<Verifier, Failure>,
        resolver: &dyn Resolve,
        now: fn() -> u64,
        from_reader: Receiver<ToGateway>,
    ) {
        let (open, socket) = match self.connect(open, verifier, resolver, now) {
            Ok(v) => v,
            Err(failure) => {
                tracing::info!(stream = self.id, code = %failure.code, "relay stream refused: {}", failure.message);
                self.forget();
                let _ = self.tx.send(refusal(self.id, &failure));
                return;
            }
        };
        let _ = socket.set_nodelay(true);
        let opened = if open.gateway_auth {
            match opened_with_auth(&open, resolver) {
                Ok(payload) => payload,
                Err(failure) => {
                    tracing::info!(stream = self.id, code = %failure.code, "relay stream refused: {}", failure.message);
                    self.forget();
                    let _ = socket.shutdown(Shutdown::Both);
                    let _ = self.tx.send(refusal(self.id, &failure));
                    return;
                }
            }
        } else {
            Vec::new()
        };
        if self
            .tx
            .send(RelayFrame::new(RelayKind::Opened, self.id, opened))
            .is_err()
        {
            self.forget();
            return;
        }
        let started = Instant::now();
        let last = Arc::new(AtomicU64::new(0));
        let ended = Arc::new(AtomicBool::new(false));
        let to_channel = {
            let Ok(reader) = socket.try_clone() else {
                self.forget();
                let _ = self
                    .tx
                    .send(RelayFrame::reset(self.id, "cannot use the gateway socket"));
                return;
            };
            let tx = self.tx.clone();
            let credit = self.credit.clone();
            let last = last.clone();
            let ended = ended.clone();
            let id = self.id;
            std::thread::spawn(move || {
                gateway_to_channel(id, reader, tx, credit, last, started, ended)
            })
        };
        let (to_gateway, reason) =
            self.channel_to_gateway(&socket, from_reader, &last, started, &ended);
        // Ended first, so the reader that the shutdown wakes does not report an end of its own.
        self.credit.close();
        let _ = socket.shutdown(Shutdown::Both);
        let from_gateway = to_channel.join().unwrap_or(0);
        self.forget();
        // However it ended, the coordinator learns that the stream is gone (a reset of a
        // stream it already reset is ignored).
        if reason != REASON_PEER_RESET {
            let _ = self.tx.send(RelayFrame::reset(self.id, reason));
        }
        tracing::info!(
            stream = self.id,
            namespace = %open.namespace,
            agent = %open.agent,
            caller = %open.caller,
            bytes_to_gateway = to_gateway,
            bytes_from_gateway = from_gateway,
            duration_ms = elapsed_ms(started),
            reason,
            "relay stream closed"
        );
    }

    fn connect(
        &self,
        open: &[u8],
        verifier: &Result<Verifier, Failure>,
        resolver: &dyn Resolve,
        now: fn() -> u64,
    ) -> Result<(RelayOpen, TcpStream), Failure> {
        let verifier = verifier.as_ref().map_err(Clone::clone)?;
        let signed =
            SignedEnvelope::from_payload(open, &Limits::default()).map_err(|e| e.to_failure())?;
        let open = verify_open(verifier, &signed, now()).map_err(|r| r.failure)?;
        let port = resolver.port(&open.namespace, &open.agent)?;
        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
        let socket = TcpStream::connect_timeout(&addr, CONNECT_TIMEOUT).map_err(|e| {
            Failure::new(
                FailureCode::GatewayUnreachable,
                format!(
                    "the gateway of Agent {}/{} does not accept connections on its port {port}: {e}",
                    open.namespace, open.agent
                ),
            )
        })?;
        tracing::info!(stream = self.id, namespace = %open.namespace, agent = %open.agent, caller = %open.caller, port, "relay stream opened");
        Ok((open, socket))
    }

    /// Writes what the channel brings to the gateway, granting credit as it goes. Returns
    /// the bytes written and why it ended.
    fn channel_to_gateway(
        &self,
        socket: &TcpStream,
        from_reader: Receiver<ToGateway>,
        last: &AtomicU64,
        started: Instant,
        ended: &AtomicBool,
    ) -> (u64, &'static str) {
        let mut w = socket;
        let mut total = 0u64;
        let mut eof = false;
        loop {
            if ended.load(Ordering::SeqCst) && eof {
                return (total, "closed");
            }
            match from_reader.recv_timeout(Duration::from_millis(500)) {
                Ok(ToGateway::Data(bytes)) => {
                    last.store(elapsed_ms(started), Ordering::Relaxed);
                    if w.write_all(&bytes).is_err() {
                        let _ = self.tx.send(RelayFrame::reset(
                            self.id,
                            "the gateway closed the connection",
                        ));
                        return (total, "gateway write failed");
                    }
                    let n = bytes.len() as u32;
                    total += u64::from(n);
                    self.unacked.fetch_sub(n, Ordering::SeqCst);
                    let _ = self.tx.send(RelayFrame::credit(self.id, n));
                }
                Ok(ToGateway::Eof) => {
                    eof = true;
                    let _ = socket.shutdown(Shutdown::Write);
                }
                Ok(ToGateway::Reset) => return (total, REASON_PEER_RESET),
                Err(RecvTimeoutError::Disconnected) => return (total, "relay ended"),
                Err(RecvTimeoutError::Timeout) => {
                    let idle = elapsed_ms(started).saturating_sub(last.load(Ordering::Relaxed));
                    if idle >= self.idle_timeout.as_millis() as u64 {
                        return (total, "idle timeout");
                    }
                }
            }
        }
    }
}

/// Reads from the gateway and sends it on as far as the coordinator's credit allows.
fn gateway_to_channel(
    id: u32,
    mut socket: TcpStream,
    tx: SyncSender<RelayFrame>,
    credit: Arc<Credit>,
    last: Arc<AtomicU64>,
    started: Instant,
    ended: Arc<AtomicBool>,
) -> u64 {
    let mut total = 0u64;
    let mut buf = vec![0u8; MAX_PAYLOAD];
    while let Some(allowed) = credit.take(MAX_PAYLOAD as u64) {
        let n = match socket.read(&mut buf[..allowed as usize]) {
            Ok(0) | Err(_) => {
                // A stream ended from the channel's side says nothing more.
                if !credit.is_closed() {
                    let _ = tx.send(RelayFrame::new(RelayKind::Eof, id, Vec::new()));
                }
                break;
            }
            Ok(n) => n,
        };
        // Give back what was not used.
        credit.add(allowed - n as u64);
        last.store(elapsed_ms(started), Ordering::Relaxed);
        total += n as u64;
        if tx
            .send(RelayFrame::new(RelayKind::Data, id, buf[..n].to_vec()))
            .is_err()
        {
            break;
        }
    }
    ended.store(true, Ordering::SeqCst);
    total
}
