//! Persistent SSH connections: one per host and one per jump host (shared by every host
//! behind it). A [`Link`] is created lazily, shared by concurrent calls (one session channel
//! each), replaced when it dies, with exponential backoff after failures. A host behind a jump
//! host is reached through a direct-tcpip channel of the jump host's connection; both keys are
//! pinned.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clawfleet_protocol::Fingerprint;
use russh::client;
use russh::keys::PrivateKeyWithHashAlg;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::pinning::{HandlerError, PinError, PinnedKey, PinningHandler};
use super::pool::SessionPool;
use super::{Shared, transport};
use crate::backend::{CallError, HostTarget};
use clawfleet_api::model::Jump;

/// A live, authenticated connection.
pub(crate) struct Connection {
    /// Unique within the backend (counts every connection ever opened).
    pub(crate) id: u64,
    pub(crate) handle: client::Handle<PinningHandler>,
    /// The local TCP address (direct connections only).
    pub(crate) local_addr: Option<SocketAddr>,
    /// The jump host's connection this one is tunnelled through, kept alive with it.
    _via: Option<Arc<Connection>>,
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection")
            .field("id", &self.id)
            .field("local_addr", &self.local_addr)
            .finish_non_exhaustive()
    }
}

impl Connection {
    pub(crate) fn is_closed(&self) -> bool {
        self.handle.is_closed()
    }

    /// Ends the connection (best effort; the peer may already be gone).
    pub(crate) async fn close(&self, why: &str) {
        let _ = self
            .handle
            .disconnect(russh::Disconnect::ByApplication, why, "en")
            .await;
    }
}

/// The connection slot of one link.
#[derive(Debug, Default)]
struct Slot {
    current: Option<Arc<Connection>>,
    /// Failed attempts since the last success.
    failures: u32,
    /// No new attempt before this instant.
    retry_at: Option<Instant>,
    last_error: Option<CallError>,
}

/// Where one SSH connection goes, as whom, and which key it trusts.
#[derive(Debug)]
pub(crate) struct Endpoint {
    /// For messages: `h1 (192.0.2.1:22)` or `jump host 192.0.2.9:22`.
    pub(crate) label: String,
    /// The name errors are reported under: the host's name, or the jump host's address.
    report_as: String,
    address: String,
    port: u16,
    user: String,
    pub(crate) pinned: Result<PinnedKey, PinError>,
    /// A jump host (shared by the hosts behind it) rather than a host running hostd.
    jump: bool,
}

/// One persistent connection to an endpoint, direct or through a jump host's link.
#[derive(Debug)]
pub(crate) struct Link {
    pub(crate) endpoint: Endpoint,
    via: Option<Arc<Link>>,
    config: Arc<client::Config>,
    slot: tokio::sync::Mutex<Slot>,
    /// Counts connection attempts, so callers queued behind a failed attempt do not each
    /// repeat it.
    attempts: AtomicU64,
    pub(crate) connections_opened: AtomicU64,
}

impl Link {
    fn new(endpoint: Endpoint, via: Option<Arc<Link>>, shared: &Shared) -> Self {
        let mut config = client::Config {
            keepalive_interval: Some(shared.settings.keepalive_interval),
            keepalive_max: shared.settings.keepalive_max,
            inactivity_timeout: None,
            nodelay: true,
            ..Default::default()
        };
        // AES-GCM first: with the CPU's AES instructions ring's AES-GCM moves gateway streams
        // faster than its ChaCha20-Poly1305 (OpenSSH's own first choice, kept second for
        // hosts without AES-GCM). Both are AEAD; the rest of russh's list follows unchanged.
        let mut ciphers = vec![russh::cipher::AES_256_GCM];
        ciphers.extend(
            config
                .preferred
                .cipher
                .iter()
                .copied()
                .filter(|c| *c != russh::cipher::AES_256_GCM),
        );
        config.preferred.cipher = std::borrow::Cow::Owned(ciphers);
        // Negotiate exactly the pinned key's algorithm, as OpenSSH does for known hosts.
        if let Ok(p) = &endpoint.pinned {
            let algorithm = p.key().algorithm();
            if config.preferred.key.contains(&algorithm) {
                config.preferred.key = std::borrow::Cow::Owned(vec![algorithm]);
            }
        }
        Self {
            endpoint,
            via,
            config: Arc::new(config),
            slot: tokio::sync::Mutex::new(Slot::default()),
            attempts: AtomicU64::new(0),
            connections_opened: AtomicU64::new(0),
        }
    }

    /// The link to a jump host, shared by every host behind it.
    pub(crate) fn jump(jump: &Jump, shared: &Shared) -> Self {
        let address = format!("{}:{}", jump.address, jump.port);
        Self::new(
            Endpoint {
                label: format!("jump host {address}"),
                report_as: address,
                address: jump.address.clone(),
                port: jump.port,
                user: jump
                    .login_user
                    .clone()
                    .unwrap_or_else(|| shared.settings.user.clone()),
                pinned: PinnedKey::parse(&jump.host_key),
                jump: true,
            },
            None,
            shared,
        )
    }

    /// The live connection, connecting if there is none. A caller finding the link in its
    /// backoff window waits for it when `patient` or when the wait is short (at most the
    /// connect timeout); otherwise it gets the last error at once.
    pub(crate) async fn connection(
        &self,
        shared: &Shared,
        patient: bool,
    ) -> Result<Arc<Connection>, CallError> {
        let attempts_seen = self.attempts.load(Ordering::SeqCst);
        let mut slot = self.slot.lock().await;
        if let Some(conn) = &slot.current {
            if !conn.is_closed() {
                return Ok(conn.clone());
            }
            tracing::info!(link = %self.endpoint.label, connection = conn.id, "the SSH connection closed; reconnecting");
            slot.current = None;
        }
        // Someone else just tried and failed while this caller queued: report that.
        if self.attempts.load(Ordering::SeqCst) != attempts_seen
            && let Some(err) = &slot.last_error
        {
            return Err(err.clone());
        }
        if let Some(at) = slot.retry_at {
            let wait = at.saturating_duration_since(Instant::now());
            if !wait.is_zero() {
                if !patient && wait > shared.settings.connect_timeout {
                    return Err(self.backoff_error(slot.last_error.as_ref(), wait));
                }
                tokio::time::sleep(wait).await;
            }
        }
        self.attempts.fetch_add(1, Ordering::SeqCst);
        shared
            .stats
            .connect_attempts
            .fetch_add(1, Ordering::Relaxed);
        match self.connect(shared, patient).await {
            Ok(conn) => {
                let conn = Arc::new(conn);
                slot.current = Some(conn.clone());
                slot.failures = 0;
                slot.retry_at = None;
                slot.last_error = None;
                self.connections_opened.fetch_add(1, Ordering::Relaxed);
                let counter = if self.endpoint.jump {
                    &shared.stats.jump_connections_opened
                } else {
                    &shared.stats.connections_opened
                };
                counter.fetch_add(1, Ordering::Relaxed);
                tracing::info!(link = %self.endpoint.label, connection = conn.id, local = ?conn.local_addr, "SSH connection established");
                Ok(conn)
            }
            Err(err) => {
                slot.failures = slot.failures.saturating_add(1);
                // The first failure waits the base, each further one twice as long.
                let delay = crate::backoff::exponential(
                    shared.settings.reconnect_backoff_base,
                    shared.settings.reconnect_backoff_max,
                    slot.failures.saturating_sub(1),
                );
                slot.retry_at = Some(Instant::now() + delay);
                slot.last_error = Some(err.clone());
                tracing::warn!(link = %self.endpoint.label, failures = slot.failures, retry_in_ms = delay.as_millis() as u64, "SSH connection failed: {err}");
                Err(err)
            }
        }
    }

    /// Forgets a connection that misbehaved (if it is still the current one) and closes it.
    pub(crate) async fn invalidate(&self, conn: &Arc<Connection>, why: &str) {
        let mut slot = self.slot.lock().await;
        if slot.current.as_ref().is_some_and(|c| c.id == conn.id) {
            slot.current = None;
        }
        drop(slot);
        conn.close(why).await;
    }

    /// The current connection, if any (whether or not it is still alive).
    pub(crate) async fn current(&self) -> Option<Arc<Connection>> {
        self.slot.lock().await.current.clone()
    }

    /// Drops the current connection and closes it. Returns whether there was one.
    pub(crate) async fn drop_current(&self, why: &str) -> bool {
        let conn = self.slot.lock().await.current.take();
        match conn {
            Some(c) => {
                c.close(why).await;
                true
            }
            None => false,
        }
    }

    /// Connects, directly or through the jump host's connection; the handshake and
    /// authentication happen within the connect timeout (a jump host's own connection has
    /// its own).
    async fn connect(&self, shared: &Shared, patient: bool) -> Result<Connection, CallError> {
        let Some(jump) = &self.via else {
            return self
                .timed(shared, async {
                    let stream = tokio::net::TcpStream::connect((
                        self.endpoint.address.as_str(),
                        self.endpoint.port,
                    ))
                    .await
                    .map_err(|e| {
                        self.transport(format!("cannot connect to {}: {e}", self.endpoint.label))
                    })?;
                    let _ = stream.set_nodelay(true);
                    let local_addr = stream.local_addr().ok();
                    self.handshake(shared, stream, local_addr, None).await
                })
                .await;
        };
        for retry in [false, true] {
            // Boxed: a link's connection may wait for its jump host's (one level deep).
            let via = Box::pin(jump.connection(shared, patient))
                .await
                .map_err(|e| self.through_jump(e))?;
            let opened = self
                .timed(shared, async {
                    via.handle
                        .channel_open_direct_tcpip(
                            self.endpoint.address.as_str(),
                            u32::from(self.endpoint.port),
                            "127.0.0.1",
                            0,
                        )
                        .await
                        .map_err(|e| {
                            let why = match &e {
                                russh::Error::ChannelOpenFailure(f) => format!("{f:?}"),
                                e => e.to_string(),
                            };
                            self.transport(format!(
                                "{} did not open a channel to {}: {why}",
                                jump.endpoint.label, self.endpoint.label
                            ))
                        })
                })
                .await;
            let channel = match opened {
                Ok(c) => c,
                Err(e) if via.is_closed() && !retry => {
                    tracing::info!(link = %jump.endpoint.label, connection = via.id, "replacing a broken jump host connection: {e}");
                    jump.invalidate(&via, "broken connection").await;
                    continue;
                }
                Err(e) => return Err(e),
            };
            return self
                .timed(
                    shared,
                    self.handshake(shared, channel.into_stream(), None, Some(via)),
                )
                .await;
        }
        Err(self.transport(format!(
            "no connection to {} through {}",
            self.endpoint.label, jump.endpoint.label
        )))
    }

    async fn timed<T>(
        &self,
        shared: &Shared,
        f: impl Future<Output = Result<T, CallError>>,
    ) -> Result<T, CallError> {
        let limit = shared.settings.connect_timeout;
        match tokio::time::timeout(limit, f).await {
            Ok(result) => result,
            Err(_) => Err(self.transport(format!(
                "no SSH connection to {} within {} ms (connect timeout)",
                self.endpoint.label,
                limit.as_millis()
            ))),
        }
    }

    /// The SSH handshake with the pinned key, then public-key authentication.
    async fn handshake<S>(
        &self,
        shared: &Shared,
        stream: S,
        local_addr: Option<SocketAddr>,
        via: Option<Arc<Connection>>,
    ) -> Result<Connection, CallError>
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let label = &self.endpoint.label;
        let presented = Arc::new(Mutex::new(None));
        let handler = PinningHandler {
            pinned: self.endpoint.pinned.as_ref().ok().cloned(),
            presented: presented.clone(),
        };
        let mut handle = client::connect_stream(self.config.clone(), stream, handler)
            .await
            .map_err(|e| match e {
                HandlerError::KeyMismatch { presented } => self.mismatch(presented),
                HandlerError::Ssh(e) => {
                    // A refusal in check_server_key can surface as a plain SSH error.
                    let seen = presented.lock().ok().and_then(|s| s.clone());
                    match seen {
                        Some(p) if !self.pinned_matches_fingerprint(&p) => self.mismatch(p),
                        _ => self.transport(format!("SSH handshake with {label} failed: {e}")),
                    }
                }
            })?;
        let login = shared.login_key.clone();
        let hash_alg = if login.algorithm().is_rsa() {
            handle
                .best_supported_rsa_hash()
                .await
                .ok()
                .flatten()
                .flatten()
        } else {
            None
        };
        let auth = handle
            .authenticate_publickey(
                self.endpoint.user.clone(),
                PrivateKeyWithHashAlg::new(login, hash_alg),
            )
            .await
            .map_err(|e| self.transport(format!("SSH authentication with {label} failed: {e}")))?;
        if !auth.success() {
            let _ = handle
                .disconnect(russh::Disconnect::ByApplication, "", "en")
                .await;
            return Err(CallError::AuthenticationRefused {
                host: self.endpoint.report_as.clone(),
            });
        }
        Ok(Connection {
            id: shared.stats.connection_ids.fetch_add(1, Ordering::Relaxed) + 1,
            handle,
            local_addr,
            _via: via,
        })
    }

    fn transport(&self, message: String) -> CallError {
        transport(&self.endpoint.report_as, message)
    }

    /// A jump host's error, as the error of the host behind it.
    fn through_jump(&self, e: CallError) -> CallError {
        let host = self.endpoint.report_as.clone();
        match e {
            CallError::Transport { message, .. } => CallError::Transport { host, message },
            CallError::HostKeyMismatch {
                host: jump,
                presented,
                expected,
            } => CallError::HostKeyMismatch {
                host: format!("{jump} (the jump host of {host})"),
                presented,
                expected,
            },
            CallError::AuthenticationRefused { host: jump } => CallError::AuthenticationRefused {
                host: format!("{jump} (the jump host of {host})"),
            },
            other => other,
        }
    }

    fn pinned_matches_fingerprint(&self, presented: &str) -> bool {
        self.endpoint
            .pinned
            .as_ref()
            .is_ok_and(|p| p.fingerprint().as_str() == presented)
    }

    /// The error for an endpoint that presented `presented` instead of the pinned key.
    pub(crate) fn mismatch(&self, presented: String) -> CallError {
        CallError::HostKeyMismatch {
            host: self.endpoint.report_as.clone(),
            presented,
            expected: match &self.endpoint.pinned {
                Ok(p) => p.fingerprint().to_string(),
                Err(e) => format!("no usable key ({e})"),
            },
        }
    }

    fn backoff_error(&self, last: Option<&CallError>, wait: Duration) -> CallError {
        match last {
            Some(CallError::Transport { host, message }) => CallError::Transport {
                host: host.clone(),
                message: format!(
                    "{message} (backing off: next connection attempt in {} ms)",
                    wait.as_millis()
                ),
            },
            Some(other) => other.clone(),
            None => self.transport(format!(
                "backing off after failed connections to {}: next attempt in {} ms",
                self.endpoint.label,
                wait.as_millis()
            )),
        }
    }
}

/// Calls in flight on one host, and the cross-host permit they share.
#[derive(Debug, Default)]
struct Active {
    calls: usize,
    permit: Option<OwnedSemaphorePermit>,
}

/// Everything the backend keeps per host: its connection and its hostd sessions.
#[derive(Debug)]
pub(crate) struct HostEntry {
    pub(crate) target: HostTarget,
    pub(crate) link: Link,
    pub(crate) pool: Arc<SessionPool>,
    /// The protocol versions hostd said it accepts in its latest hello (`None` until one).
    pub(crate) versions: Mutex<Option<Vec<u32>>>,
    active: Mutex<Active>,
    gate: tokio::sync::Mutex<()>,
    /// The host's gateway relay channel (relay.rs), started on first use.
    pub(crate) relay: tokio::sync::Mutex<Option<Arc<super::relay::RelayClient>>>,
}

/// Holds one host's share of the cross-host parallelism limit while a call runs.
#[derive(Debug)]
pub(crate) struct HostGuard {
    entry: Arc<HostEntry>,
}

impl Drop for HostGuard {
    fn drop(&mut self) {
        let mut active = self.entry.active.lock().unwrap_or_else(|p| p.into_inner());
        active.calls = active.calls.saturating_sub(1);
        if active.calls == 0 {
            active.permit = None;
        }
    }
}

impl HostEntry {
    /// `via` is the jump host's shared link when the target names one.
    pub(crate) fn new(target: HostTarget, via: Option<Arc<Link>>, shared: &Shared) -> Self {
        let mut label = format!("{} ({}:{})", target.name, target.address, target.port);
        if let Some(v) = &via {
            label.push_str(&format!(" through {}", v.endpoint.label));
        }
        let endpoint = Endpoint {
            label,
            report_as: target.name.to_string(),
            address: target.address.clone(),
            port: target.port,
            user: target
                .login_user
                .clone()
                .unwrap_or_else(|| shared.settings.user.clone()),
            pinned: PinnedKey::parse(&target.host_key),
            jump: false,
        };
        Self {
            link: Link::new(endpoint, via, shared),
            pool: Arc::new(SessionPool::new(&shared.settings)),
            target,
            versions: Mutex::new(None),
            active: Mutex::new(Active::default()),
            gate: tokio::sync::Mutex::new(()),
            relay: tokio::sync::Mutex::new(None),
        }
    }

    pub(crate) fn label(&self) -> String {
        self.link.endpoint.label.clone()
    }

    /// What hostd accepts, as its latest hello said.
    pub(crate) fn versions(&self) -> Option<Vec<u32>> {
        self.versions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    pub(crate) fn set_versions(&self, versions: &[u32]) {
        *self.versions.lock().unwrap_or_else(|p| p.into_inner()) = Some(versions.to_vec());
    }

    /// Joins the calls in flight on this host; the first one takes a permit of the
    /// cross-host limit, which the last one to leave gives back.
    pub(crate) async fn enter(self: &Arc<Self>, hosts: &Arc<Semaphore>) -> HostGuard {
        let _gate = self.gate.lock().await;
        {
            let mut active = self.active.lock().unwrap_or_else(|p| p.into_inner());
            if active.calls > 0 {
                active.calls += 1;
                return HostGuard {
                    entry: self.clone(),
                };
            }
        }
        // The semaphore is never closed, so this only waits.
        let permit = hosts.clone().acquire_owned().await.ok();
        let mut active = self.active.lock().unwrap_or_else(|p| p.into_inner());
        active.calls += 1;
        active.permit = permit;
        HostGuard {
            entry: self.clone(),
        }
    }

    /// The host's live connection (see [`Link::connection`]).
    pub(crate) async fn connection(
        &self,
        shared: &Shared,
        patient: bool,
    ) -> Result<Arc<Connection>, CallError> {
        self.link.connection(shared, patient).await
    }

    /// The error for a host that presented `presented` instead of the pinned key.
    pub(crate) fn mismatch(&self, presented: String) -> CallError {
        self.link.mismatch(presented)
    }

    /// The fingerprint envelopes name (only when a key is pinned).
    pub(crate) fn fingerprint(&self) -> Option<&Fingerprint> {
        self.link
            .endpoint
            .pinned
            .as_ref()
            .ok()
            .map(|p| p.fingerprint())
    }
}
