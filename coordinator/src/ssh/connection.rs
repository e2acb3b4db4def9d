//! One persistent SSH connection per host: created lazily, shared by concurrent calls (one
//! session channel each), replaced when it dies, with exponential backoff after failures.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clawfleet_protocol::Fingerprint;
use russh::client;
use russh::keys::PrivateKeyWithHashAlg;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::pinning::{HandlerError, PinError, PinnedKey, PinningHandler};
use super::{Shared, transport};
use crate::backend::{CallError, HostTarget};

/// A live, authenticated connection.
pub(crate) struct Connection {
    /// Unique within the backend (counts every connection ever opened).
    pub(crate) id: u64,
    pub(crate) handle: client::Handle<PinningHandler>,
    pub(crate) local_addr: Option<SocketAddr>,
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

/// The connection slot of one host.
#[derive(Debug, Default)]
struct Slot {
    current: Option<Arc<Connection>>,
    /// Failed attempts since the last success.
    failures: u32,
    /// No new attempt before this instant.
    retry_at: Option<Instant>,
    last_error: Option<CallError>,
}

/// Calls in flight on one host, and the cross-host permit they share.
#[derive(Debug, Default)]
struct Active {
    calls: usize,
    permit: Option<OwnedSemaphorePermit>,
}

/// Everything the backend keeps per host.
#[derive(Debug)]
pub(crate) struct HostEntry {
    pub(crate) target: HostTarget,
    pub(crate) pinned: Result<PinnedKey, PinError>,
    config: Arc<client::Config>,
    slot: tokio::sync::Mutex<Slot>,
    /// Counts connection attempts, so callers queued behind a failed attempt do not each
    /// repeat it.
    attempts: AtomicU64,
    pub(crate) connections_opened: AtomicU64,
    /// Bounds the session channels open at once (OpenSSH's MaxSessions defaults to 10).
    pub(crate) sessions: Arc<Semaphore>,
    active: Mutex<Active>,
    gate: tokio::sync::Mutex<()>,
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
    pub(crate) fn new(target: HostTarget, shared: &Shared) -> Self {
        let pinned = PinnedKey::parse(&target.host_key);
        let mut config = client::Config {
            keepalive_interval: Some(shared.settings.keepalive_interval),
            keepalive_max: shared.settings.keepalive_max,
            inactivity_timeout: None,
            nodelay: true,
            ..Default::default()
        };
        // Negotiate exactly the pinned key's algorithm, as OpenSSH does for known hosts.
        if let Ok(p) = &pinned {
            let algorithm = p.key().algorithm();
            if config.preferred.key.contains(&algorithm) {
                config.preferred.key = std::borrow::Cow::Owned(vec![algorithm]);
            }
        }
        Self {
            target,
            pinned,
            config: Arc::new(config),
            slot: tokio::sync::Mutex::new(Slot::default()),
            attempts: AtomicU64::new(0),
            connections_opened: AtomicU64::new(0),
            sessions: Arc::new(Semaphore::new(shared.settings.max_sessions_per_host.max(1))),
            active: Mutex::new(Active::default()),
            gate: tokio::sync::Mutex::new(()),
        }
    }

    pub(crate) fn label(&self) -> String {
        format!(
            "{} ({}:{})",
            self.target.name, self.target.address, self.target.port
        )
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

    /// The live connection, connecting if there is none. A caller finding the host in its
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
            tracing::info!(host = %self.target.name, connection = conn.id, "the SSH connection closed; reconnecting");
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
                    return Err(backoff_error(slot.last_error.as_ref(), self, wait));
                }
                tokio::time::sleep(wait).await;
            }
        }
        self.attempts.fetch_add(1, Ordering::SeqCst);
        shared
            .stats
            .connect_attempts
            .fetch_add(1, Ordering::Relaxed);
        match self.connect(shared).await {
            Ok(conn) => {
                let conn = Arc::new(conn);
                slot.current = Some(conn.clone());
                slot.failures = 0;
                slot.retry_at = None;
                slot.last_error = None;
                self.connections_opened.fetch_add(1, Ordering::Relaxed);
                shared
                    .stats
                    .connections_opened
                    .fetch_add(1, Ordering::Relaxed);
                tracing::info!(host = %self.target.name, connection = conn.id, local = ?conn.local_addr, "SSH connection established");
                Ok(conn)
            }
            Err(err) => {
                slot.failures = slot.failures.saturating_add(1);
                let delay = backoff_delay(
                    shared.settings.reconnect_backoff_base,
                    shared.settings.reconnect_backoff_max,
                    slot.failures,
                );
                slot.retry_at = Some(Instant::now() + delay);
                slot.last_error = Some(err.clone());
                tracing::warn!(host = %self.target.name, failures = slot.failures, retry_in_ms = delay.as_millis() as u64, "SSH connection failed: {err}");
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

    /// TCP connect, handshake with the pinned key, public-key authentication; all within
    /// the connect timeout.
    async fn connect(&self, shared: &Shared) -> Result<Connection, CallError> {
        let label = self.label();
        let host = self.target.name.to_string();
        let limit = shared.settings.connect_timeout;
        let attempt = async {
            let stream =
                tokio::net::TcpStream::connect((self.target.address.as_str(), self.target.port))
                    .await
                    .map_err(|e| transport(&host, format!("cannot connect to {label}: {e}")))?;
            let _ = stream.set_nodelay(true);
            let local_addr = stream.local_addr().ok();
            let presented = Arc::new(Mutex::new(None));
            let handler = PinningHandler {
                pinned: self.pinned.as_ref().ok().cloned(),
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
                            _ => {
                                transport(&host, format!("SSH handshake with {label} failed: {e}"))
                            }
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
                    shared.settings.user.clone(),
                    PrivateKeyWithHashAlg::new(login, hash_alg),
                )
                .await
                .map_err(|e| {
                    transport(
                        &host,
                        format!("SSH authentication with {label} failed: {e}"),
                    )
                })?;
            if !auth.success() {
                let _ = handle
                    .disconnect(russh::Disconnect::ByApplication, "", "en")
                    .await;
                return Err(CallError::AuthenticationRefused { host: host.clone() });
            }
            Ok(Connection {
                id: shared.stats.connection_ids.fetch_add(1, Ordering::Relaxed) + 1,
                handle,
                local_addr,
            })
        };
        match tokio::time::timeout(limit, attempt).await {
            Ok(result) => result,
            Err(_) => Err(transport(
                &host,
                format!(
                    "no SSH connection to {label} within {} ms (connect timeout)",
                    limit.as_millis()
                ),
            )),
        }
    }

    fn pinned_matches_fingerprint(&self, presented: &str) -> bool {
        self.pinned
            .as_ref()
            .is_ok_and(|p| p.fingerprint().as_str() == presented)
    }

    /// The error for a host that presented `presented` instead of the pinned key.
    pub(crate) fn mismatch(&self, presented: String) -> CallError {
        CallError::HostKeyMismatch {
            host: self.target.name.to_string(),
            presented,
            expected: self.expected_text(),
        }
    }

    /// The pinned fingerprint, or why there is none.
    pub(crate) fn expected_text(&self) -> String {
        match &self.pinned {
            Ok(p) => p.fingerprint().to_string(),
            Err(e) => format!("no usable key ({e})"),
        }
    }

    /// The fingerprint envelopes name (only when a key is pinned).
    pub(crate) fn fingerprint(&self) -> Option<&Fingerprint> {
        self.pinned.as_ref().ok().map(|p| p.fingerprint())
    }
}

/// `base · 2^(failures−1)`, at most `max`.
pub(crate) fn backoff_delay(base: Duration, max: Duration, failures: u32) -> Duration {
    let exp = failures.saturating_sub(1).min(30);
    base.saturating_mul(1u32 << exp).min(max)
}

fn backoff_error(last: Option<&CallError>, entry: &HostEntry, wait: Duration) -> CallError {
    match last {
        Some(CallError::Transport { host, message }) => CallError::Transport {
            host: host.clone(),
            message: format!(
                "{message} (backing off: next connection attempt in {} ms)",
                wait.as_millis()
            ),
        },
        Some(other) => other.clone(),
        None => transport(
            entry.target.name.as_str(),
            format!(
                "backing off after failed connections to {}: next attempt in {} ms",
                entry.label(),
                wait.as_millis()
            ),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_the_cap() {
        let base = Duration::from_millis(100);
        let max = Duration::from_secs(2);
        let d: Vec<u128> = (1..=7)
            .map(|n| backoff_delay(base, max, n).as_millis())
            .collect();
        assert_eq!(d, vec![100, 200, 400, 800, 1600, 2000, 2000]);
        assert_eq!(backoff_delay(base, max, 0).as_millis(), 100);
        assert_eq!(backoff_delay(base, max, u32::MAX), max);
    }
}
