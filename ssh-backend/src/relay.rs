//! The coordinator's end of the gateway relay (issue 30): one session channel per host
//! running `hostd relay` on the host's persistent SSH connection, apart from the operation
//! sessions (their pool and limits), carrying many gateway streams.
//!
//! Each stream is handed to its user as one end of an in-memory duplex pipe; two tasks per
//! stream move bytes between the pipe and the channel: upward only as far as hostd's credit
//! allows, downward granting credit as the bytes are taken. The channel's reader never waits
//! for a stream (what hostd may send is bounded by the credit granted), so a stalled client
//! holds back its own stream only. A ping every [`PING_EVERY`] detects a dead relay: one that
//! answered none for [`PONG_LIMIT`] is closed, its streams reset (their users see the stream
//! end instead of waiting on a silent host), and the next open starts a new one.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use clawfleet_protocol::relay::{
    HEADER_LEN, INITIAL_WINDOW, MAX_PAYLOAD, RELAY_COMMAND, RELAY_VERSION, RelayFrame, RelayHello,
    RelayKind,
};
use clawfleet_protocol::{Failure, FailureCode, SignedEnvelope};
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};
use tokio::sync::{Semaphore, mpsc, oneshot};
use tokio::time::Instant;

use super::connection::Connection;
use super::transport;
use crate::backend::CallError;

/// Keepalive interval on the relay channel.
pub(crate) const PING_EVERY: Duration = Duration::from_secs(15);
/// No pong for this long: the relay is dead.
const PONG_LIMIT: Duration = Duration::from_secs(45);
/// Frames queued for the channel before stream tasks wait.
const WRITE_QUEUE: usize = 1024;
/// Bytes buffered in each stream's in-memory pipe, each way.
const PIPE_BYTES: usize = 256 * 1024;

/// What the channel reader hands a stream's downward task.
enum Down {
    Data(Vec<u8>),
    Eof,
    Reset(String),
}

struct Entry {
    down: mpsc::UnboundedSender<Down>,
    /// hostd's credit for our upward bytes.
    credit: Arc<Semaphore>,
    /// Bytes hostd sent that the stream has not taken yet.
    unacked: Arc<AtomicU32>,
    /// hostd's answer to the open: the `Opened` payload, or its refusal.
    opened: Option<oneshot::Sender<Result<Vec<u8>, Failure>>>,
}

type Streams = Arc<Mutex<HashMap<u32, Entry>>>;

/// One host's relay channel.
pub(crate) struct RelayClient {
    /// The SSH connection it runs on (a new connection means a new relay).
    pub(crate) connection_id: u64,
    tx: mpsc::Sender<RelayFrame>,
    streams: Streams,
    next_id: AtomicU32,
    dead: Arc<AtomicBool>,
    hello: RelayHello,
}

impl std::fmt::Debug for RelayClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RelayClient")
            .field("connection_id", &self.connection_id)
            .field("hello", &self.hello)
            .finish_non_exhaustive()
    }
}

fn lock(streams: &Streams) -> std::sync::MutexGuard<'_, HashMap<u32, Entry>> {
    streams.lock().unwrap_or_else(|p| p.into_inner())
}

impl RelayClient {
    /// Opens the relay channel on `conn` and reads hostd's hello.
    pub(crate) async fn start(
        host: &str,
        label: &str,
        conn: &Arc<Connection>,
        limit: Duration,
    ) -> Result<Arc<Self>, CallError> {
        let channel = tokio::time::timeout(limit, conn.handle.channel_open_session())
            .await
            .map_err(|_| {
                transport(
                    host,
                    format!(
                        "no relay channel to {label} within {} ms",
                        limit.as_millis()
                    ),
                )
            })?
            .map_err(|e| transport(host, format!("cannot open a relay channel to {label}: {e}")))?;
        channel
            .exec(true, RELAY_COMMAND)
            .await
            .map_err(|e| transport(host, format!("cannot run `hostd relay` on {label}: {e}")))?;
        let (mut rd, wr) = tokio::io::split(channel.into_stream());
        let hello = tokio::time::timeout(limit, read_frame(&mut rd))
            .await
            .map_err(|_| {
                transport(
                    host,
                    format!(
                        "hostd relay on {label} did not greet within {} ms",
                        limit.as_millis()
                    ),
                )
            })?
            .map_err(|e| transport(host, format!("hostd relay on {label}: {e}")))?;
        let hello = match hello {
            Some(f) if f.kind == RelayKind::Hello => {
                serde_json::from_slice::<RelayHello>(&f.payload).map_err(|e| {
                    transport(
                        host,
                        format!("hostd relay on {label} sent an unreadable hello: {e}"),
                    )
                })?
            }
            Some(f) => {
                return Err(transport(
                    host,
                    format!("hostd relay on {label} sent {:?} before its hello", f.kind),
                ));
            }
            None => {
                return Err(transport(
                    host,
                    format!(
                        "hostd on {label} ended the relay channel at once (a hostd without `hostd relay`, or a login user enrolled by an older hostd: run `hostd enrol --login-user` on the host again)"
                    ),
                ));
            }
        };
        if hello.version != RELAY_VERSION {
            return Err(CallError::Failed(Failure::new(
                FailureCode::UnsupportedVersion,
                format!(
                    "hostd relay on {label} speaks relay version {}; this coordinator speaks {RELAY_VERSION}",
                    hello.version
                ),
            )));
        }
        tracing::info!(
            host,
            connection = conn.id,
            max_streams = hello.max_streams,
            "relay channel started"
        );
        Ok(Arc::new(Self::run(conn.id, rd, wr, hello)))
    }

    /// Runs the relay over a channel whose hello was read: its writer, its reader and its
    /// keepalive, which closes the channel when hostd stops answering pings.
    fn run<R, W>(connection_id: u64, rd: R, wr: W, hello: RelayHello) -> Self
    where
        R: tokio::io::AsyncRead + Unpin + Send + 'static,
        W: tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let (tx, rx) = mpsc::channel(WRITE_QUEUE);
        let streams: Streams = Arc::new(Mutex::new(HashMap::new()));
        let dead = Arc::new(AtomicBool::new(false));
        let last_pong = Arc::new(AtomicU64::new(0));
        let born = Instant::now();
        let writer = tokio::spawn(write_loop(rx, wr, dead.clone()));
        let reader = tokio::spawn(read_loop(
            rd,
            streams.clone(),
            tx.clone(),
            dead.clone(),
            last_pong.clone(),
            born,
        ));
        tokio::spawn(keepalive(
            tx.clone(),
            dead.clone(),
            last_pong,
            born,
            streams.clone(),
            [reader.abort_handle(), writer.abort_handle()],
        ));
        Self {
            connection_id,
            tx,
            streams,
            next_id: AtomicU32::new(1),
            dead,
            hello,
        }
    }

    /// Whether the relay can still carry streams.
    pub(crate) fn is_alive(&self) -> bool {
        !self.dead.load(Ordering::SeqCst)
    }

    /// Streams open right now.
    pub(crate) fn open_streams(&self) -> usize {
        lock(&self.streams).len()
    }

    /// Opens one stream with a signed open; the caller's end of the stream once hostd
    /// connected it to the gateway, and the payload of hostd's `Opened` frame.
    pub(crate) async fn open(
        &self,
        host: &str,
        signed: &SignedEnvelope,
        limit: Duration,
    ) -> Result<(DuplexStream, Vec<u8>), CallError> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        if id == 0 {
            return Err(transport(
                host,
                "the relay channel ran out of stream ids".into(),
            ));
        }
        let (down_tx, down_rx) = mpsc::unbounded_channel();
        let (opened_tx, opened_rx) = oneshot::channel();
        let credit = Arc::new(Semaphore::new(self.hello.window as usize));
        let unacked = Arc::new(AtomicU32::new(0));
        lock(&self.streams).insert(
            id,
            Entry {
                down: down_tx,
                credit: credit.clone(),
                unacked: unacked.clone(),
                opened: Some(opened_tx),
            },
        );
        let forget = || {
            lock(&self.streams).remove(&id);
        };
        if self
            .tx
            .send(RelayFrame::new(RelayKind::Open, id, signed.to_payload()))
            .await
            .is_err()
        {
            forget();
            return Err(transport(host, "the relay channel closed".into()));
        }
        let answer = match tokio::time::timeout(limit, opened_rx).await {
            Ok(Ok(answer)) => answer,
            Ok(Err(_)) => {
                forget();
                return Err(transport(
                    host,
                    "the relay channel closed while the stream opened".into(),
                ));
            }
            Err(_) => {
                forget();
                let _ = self.tx.try_send(RelayFrame::reset(id, "open timed out"));
                return Err(transport(
                    host,
                    format!(
                        "hostd did not open the gateway stream within {} ms",
                        limit.as_millis()
                    ),
                ));
            }
        };
        let opened = match answer {
            Ok(payload) => payload,
            Err(failure) => {
                forget();
                return Err(CallError::Failed(failure));
            }
        };
        let (ours, theirs) = tokio::io::duplex(PIPE_BYTES);
        let (rd, wr) = tokio::io::split(ours);
        let up = tokio::spawn(upward(id, rd, credit, self.tx.clone()));
        let down = tokio::spawn(downward(id, wr, down_rx, unacked, self.tx.clone()));
        let streams = self.streams.clone();
        let tx = self.tx.clone();
        tokio::spawn(async move {
            let _ = down.await;
            up.abort();
            lock(&streams).remove(&id);
            let _ = tx.send(RelayFrame::reset(id, "closed")).await;
        });
        Ok((theirs, opened))
    }
}

async fn read_frame<R: tokio::io::AsyncRead + Unpin>(
    rd: &mut R,
) -> Result<Option<RelayFrame>, String> {
    let mut h = [0u8; HEADER_LEN];
    match rd.read_exact(&mut h).await {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e.to_string()),
    }
    let (kind, stream, len) = RelayFrame::parse_header(&h).map_err(|e| e.to_string())?;
    let mut payload = vec![0u8; len];
    rd.read_exact(&mut payload)
        .await
        .map_err(|e| format!("the channel ended inside a frame: {e}"))?;
    Ok(Some(RelayFrame::new(kind, stream, payload)))
}

async fn write_loop<W: tokio::io::AsyncWrite + Unpin>(
    mut rx: mpsc::Receiver<RelayFrame>,
    wr: W,
    dead: Arc<AtomicBool>,
) {
    let mut out = tokio::io::BufWriter::with_capacity(256 * 1024, wr);
    let mut buf = Vec::with_capacity(MAX_PAYLOAD + HEADER_LEN);
    'outer: while let Some(frame) = rx.recv().await {
        let mut next = Some(frame);
        while let Some(f) = next.take() {
            buf.clear();
            if f.encode_into(&mut buf).is_err() || out.write_all(&buf).await.is_err() {
                break 'outer;
            }
            next = rx.try_recv().ok();
        }
        if out.flush().await.is_err() {
            break;
        }
    }
    dead.store(true, Ordering::SeqCst);
    let _ = out.shutdown().await;
}

async fn read_loop<R: tokio::io::AsyncRead + Unpin>(
    rd: R,
    streams: Streams,
    tx: mpsc::Sender<RelayFrame>,
    dead: Arc<AtomicBool>,
    last_pong: Arc<AtomicU64>,
    born: Instant,
) {
    let mut rd = tokio::io::BufReader::with_capacity(256 * 1024, rd);
    let why = loop {
        let frame = match read_frame(&mut rd).await {
            Ok(Some(f)) => f,
            Ok(None) => break "the relay channel closed".to_owned(),
            Err(e) => break format!("the relay channel broke: {e}"),
        };
        let id = frame.stream;
        match frame.kind {
            RelayKind::Opened | RelayKind::Refused => {
                let answer = if frame.kind == RelayKind::Opened {
                    Ok(frame.payload)
                } else {
                    Err(
                        serde_json::from_slice::<Failure>(&frame.payload).unwrap_or_else(|e| {
                            Failure::new(
                                FailureCode::Internal,
                                format!("hostd refused the stream with an unreadable failure: {e}"),
                            )
                        }),
                    )
                };
                if let Some(tx) = lock(&streams).get_mut(&id).and_then(|e| e.opened.take()) {
                    let _ = tx.send(answer);
                }
            }
            RelayKind::Data => {
                let map = lock(&streams);
                if let Some(e) = map.get(&id) {
                    let n = frame.payload.len() as u32;
                    if e.unacked.fetch_add(n, Ordering::SeqCst).saturating_add(n) > INITIAL_WINDOW {
                        let _ = e
                            .down
                            .send(Down::Reset("hostd sent more than its credit".into()));
                    } else {
                        let _ = e.down.send(Down::Data(frame.payload));
                    }
                }
            }
            RelayKind::Credit => {
                if let (Some(e), Some(n)) = (lock(&streams).get(&id), frame.credit_increment()) {
                    e.credit.add_permits(n as usize);
                }
            }
            RelayKind::Eof => {
                if let Some(e) = lock(&streams).get(&id) {
                    let _ = e.down.send(Down::Eof);
                }
            }
            RelayKind::Reset => {
                if let Some(mut e) = lock(&streams).remove(&id) {
                    let why = String::from_utf8_lossy(&frame.payload).into_owned();
                    if let Some(tx) = e.opened.take() {
                        let _ = tx.send(Err(Failure::new(FailureCode::GatewayUnreachable, &why)));
                    }
                    e.credit.close();
                    let _ = e.down.send(Down::Reset(why));
                }
            }
            RelayKind::Ping => {
                let _ = tx.try_send(RelayFrame::new(RelayKind::Pong, 0, frame.payload));
            }
            RelayKind::Pong => {
                last_pong.store(born.elapsed().as_millis() as u64, Ordering::Relaxed);
            }
            RelayKind::Hello | RelayKind::Open => {}
        }
    };
    dead.store(true, Ordering::SeqCst);
    tracing::info!("relay channel ended: {why}");
    end_streams(&streams, &why);
}

/// Ends every stream of a relay that ended: an open still waiting gets `SESSION_CLOSED`, an
/// open stream its reset (its user reads the end).
fn end_streams(streams: &Streams, why: &str) {
    for (_, mut e) in lock(streams).drain() {
        if let Some(tx) = e.opened.take() {
            let _ = tx.send(Err(Failure::new(FailureCode::SessionClosed, why)));
        }
        e.credit.close();
        let _ = e.down.send(Down::Reset(why.to_owned()));
    }
}

async fn keepalive(
    tx: mpsc::Sender<RelayFrame>,
    dead: Arc<AtomicBool>,
    last_pong: Arc<AtomicU64>,
    born: Instant,
    streams: Streams,
    channel: [tokio::task::AbortHandle; 2],
) {
    let mut tick = tokio::time::interval(PING_EVERY);
    tick.tick().await;
    loop {
        tick.tick().await;
        if dead.load(Ordering::SeqCst) {
            return;
        }
        let now = born.elapsed().as_millis() as u64;
        if now.saturating_sub(last_pong.load(Ordering::Relaxed)) > PONG_LIMIT.as_millis() as u64 {
            let why = format!(
                "the relay channel answered no ping for {} s",
                PONG_LIMIT.as_secs()
            );
            tracing::warn!("{why}; closing it");
            dead.store(true, Ordering::SeqCst);
            // The reader would wait on the silent host, the writer on the stream tasks:
            // stopping both drops the channel's halves, which closes it.
            for task in &channel {
                task.abort();
            }
            end_streams(&streams, &why);
            return;
        }
        if tx
            .send(RelayFrame::new(
                RelayKind::Ping,
                0,
                now.to_be_bytes().to_vec(),
            ))
            .await
            .is_err()
        {
            return;
        }
    }
}

/// The caller's bytes to hostd, as far as hostd's credit allows.
async fn upward<R: tokio::io::AsyncRead + Unpin>(
    id: u32,
    mut rd: R,
    credit: Arc<Semaphore>,
    tx: mpsc::Sender<RelayFrame>,
) {
    let mut buf = vec![0u8; MAX_PAYLOAD];
    loop {
        // Take what credit there is (at least one byte), then read at most that much.
        let Ok(first) = credit.acquire().await else {
            return;
        };
        first.forget();
        let more = credit.available_permits().min(MAX_PAYLOAD - 1);
        if more > 0
            && let Ok(p) = credit.try_acquire_many(more as u32)
        {
            p.forget();
        }
        let allowed = 1 + more;
        let n = match rd.read(&mut buf[..allowed]).await {
            Ok(0) | Err(_) => {
                let _ = tx
                    .send(RelayFrame::new(RelayKind::Eof, id, Vec::new()))
                    .await;
                return;
            }
            Ok(n) => n,
        };
        if n < allowed {
            credit.add_permits(allowed - n);
        }
        if tx
            .send(RelayFrame::new(RelayKind::Data, id, buf[..n].to_vec()))
            .await
            .is_err()
        {
            return;
        }
    }
}

/// hostd's bytes to the caller, granting credit once the caller's pipe took them.
async fn downward<W: tokio::io::AsyncWrite + Unpin>(
    id: u32,
    mut wr: W,
    mut rx: mpsc::UnboundedReceiver<Down>,
    unacked: Arc<AtomicU32>,
    tx: mpsc::Sender<RelayFrame>,
) {
    while let Some(msg) = rx.recv().await {
        match msg {
            Down::Data(bytes) => {
                if wr.write_all(&bytes).await.is_err() {
                    return;
                }
                let n = bytes.len() as u32;
                unacked.fetch_sub(n, Ordering::SeqCst);
                if tx.send(RelayFrame::credit(id, n)).await.is_err() {
                    return;
                }
            }
            Down::Eof => {
                let _ = wr.shutdown().await;
                // Keep the stream until the caller is done sending (its upward task).
            }
            Down::Reset(why) => {
                tracing::debug!(stream = id, "gateway stream reset: {why}");
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use clawfleet_protocol::ssh_key::{
        Algorithm, PrivateKey, getrandom::SysRng, rand_core::UnwrapErr,
    };

    /// A host that answers the relay's pings, then goes silent (a hung `hostd relay`, a link
    /// that drops packets): after [`PONG_LIMIT`] the relay is dead, its open stream ends for
    /// its user instead of waiting, and the channel is closed (the host reads its end). On
    /// paused time, so the test takes no 45 s.
    #[tokio::test(start_paused = true)]
    async fn a_relay_that_answers_no_ping_is_closed_and_its_streams_end() {
        let (ours, hosts) = tokio::io::duplex(1 << 20);
        let (rd, wr) = tokio::io::split(ours);
        let relay = RelayClient::run(
            1,
            rd,
            wr,
            RelayHello {
                version: RELAY_VERSION,
                max_streams: 8,
                window: INITIAL_WINDOW,
                idle_timeout_seconds: 3600,
            },
        );
        let (mut host_rd, mut host_wr) = tokio::io::split(hosts);
        let answer_pings = Arc::new(AtomicBool::new(true));
        let host = {
            let answer_pings = answer_pings.clone();
            tokio::spawn(async move {
                // Answer the open, and pings while told to; return when the channel ends.
                let mut buf = Vec::new();
                while let Ok(Some(f)) = read_frame(&mut host_rd).await {
                    let reply = match f.kind {
                        RelayKind::Open => {
                            Some(RelayFrame::new(RelayKind::Opened, f.stream, vec![]))
                        }
                        RelayKind::Ping if answer_pings.load(Ordering::SeqCst) => {
                            Some(RelayFrame::new(RelayKind::Pong, 0, f.payload))
                        }
                        _ => None,
                    };
                    if let Some(r) = reply {
                        buf.clear();
                        r.encode_into(&mut buf).unwrap();
                        host_wr.write_all(&buf).await.unwrap();
                    }
                }
            })
        };
        let key = PrivateKey::random(&mut UnwrapErr(SysRng), Algorithm::Ed25519).unwrap();
        let signed = SignedEnvelope::sign_bytes(b"open".to_vec(), &key).unwrap();
        let (mut stream, _) = relay
            .open("h1", &signed, Duration::from_secs(5))
            .await
            .unwrap();
        // Answered pings keep it alive well past the limit.
        tokio::time::sleep(PONG_LIMIT * 2).await;
        assert!(relay.is_alive());
        assert_eq!(relay.open_streams(), 1);
        // Silence.
        answer_pings.store(false, Ordering::SeqCst);
        tokio::time::sleep(PONG_LIMIT + PING_EVERY * 2).await;
        assert!(!relay.is_alive(), "a silent relay is still counted alive");
        let mut byte = [0u8; 1];
        let read = tokio::time::timeout(Duration::from_secs(1), stream.read(&mut byte)).await;
        assert!(
            matches!(read, Ok(Ok(0)) | Ok(Err(_))),
            "the stream did not end: {read:?}"
        );
        assert_eq!(relay.open_streams(), 0);
        tokio::time::timeout(Duration::from_secs(1), host)
            .await
            .expect("the channel was not closed")
            .unwrap();
    }
}
