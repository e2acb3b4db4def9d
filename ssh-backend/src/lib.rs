//! The SSH backend: pushes signed operations to hostd over persistent `hostd serve` sessions
//! on one persistent russh connection per host.
//!
//! - Host keys are pinned: the key a host presents must equal [`HostTarget::host_key`] (key
//!   data), or the call fails with [`CallError::HostKeyMismatch`] naming both fingerprints.
//! - Each host has a pool of sessions (pool.rs): a session channel that runs `hostd serve`
//!   (the forced command runs anyway), whose hello is read once, and over which envelopes go
//!   one at a time, each answered with progress and one result (hostd reads envelopes until
//!   its input ends). At most [`SshSettings::max_sessions_per_host`] sessions are open per
//!   host (OpenSSH refuses more than `MaxSessions`, 10 by default, per connection); a call
//!   takes an idle session or opens one, so independent Agents do not queue behind each
//!   other up to that many. Idle sessions close after [`SshSettings::session_idle_timeout`],
//!   and none is reused past [`SshSettings::session_max_age`].
//! - A host may name a login user other than root ([`HostTarget::login_user`]) and a jump
//!   host ([`HostTarget::jump`]): the host is then reached through a direct-tcpip channel of
//!   the jump host's connection, one per jump host, shared by every host behind it; both keys
//!   are pinned.
//! - At most [`SshSettings::max_parallel_hosts`] hosts are worked on at once.
//! - The transport gives up [`SshSettings::transport_grace`] after the envelope deadline.
//! - Failed connections are retried with exponential backoff per host (and per jump host).
//! - An idle session that died (hostd exited, its channel closed) is replaced before an
//!   envelope is sent on it. If the session drops after the envelope was sent, the backend
//!   asks `operation-status` (over another session, reconnecting if needed) until the
//!   operation is no longer running (within the original deadline), and returns the recorded
//!   outcome. It never guesses: an operation the host has no record of is a transport error
//!   (safe to retry with a new id), except when a reused session died without acknowledging
//!   the envelope: it may have been dead before the envelope was written, so the same signed
//!   envelope (same operation id, which hostd's journal runs at most once) is sent once more
//!   on a new session.
//!
//! Tests and benchmark (as root; each prints `SKIP: …` otherwise, and fails under `CI=true`):
//! - `cargo test -p clawfleet-coordinator --test ssh loopback::`: a private OpenSSH sshd on
//!   127.0.0.1 with the real hostd (built with cargo on first use, or `$CLAWFLEET_HOSTD_BIN`)
//!   as the forced command: session reuse, the pool's bound, idle and aged sessions, sessions
//!   killed between and during operations, pinning, refused login keys, reconnects, fast
//!   failures, lost results recovered through `operation-status`.
//! - `cargo test -p clawfleet-coordinator --test ssh hosts::`: real test hosts (vm-tests),
//!   including a login user through sudo and a jump host.
//! - `cargo bench -p clawfleet-coordinator --bench transport`: latency against the peer's
//!   transport (a new `ssh` process per operation).

pub mod backend;
pub mod backoff;
mod connection;
mod pinning;
mod pool;
mod relay;
mod session;
mod signer;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clawfleet_protocol::operation::{OperationKind, OperationStatusArgs};
use clawfleet_protocol::result::{OperationResult, OperationState, Outcome, Progress};
use clawfleet_protocol::ssh_key::PrivateKey;
use clawfleet_protocol::{
    Failure, FailureCode, Limits, Message, Operation, OperationId, PROTOCOL_VERSION, Principal,
    SUPPORTED_VERSIONS,
};
use thiserror::Error;
use tokio::sync::Semaphore;
use tracing::Instrument;

use crate::backend::{CallError, CallOptions, HostTarget, ProgressSink};
use clawfleet_api::model::Jump;
use connection::{HostEntry, Link};
pub use pinning::{PinError, PinnedKey};
use session::{Lost, OpenError, OpenSession};
use signer::EnvelopeSigner;

/// Limits and settings of the SSH backend. Every value is configurable so tests wait
/// seconds; the defaults follow the design's time budget. occ.toml's `[ssh]` section sets
/// them (config.rs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SshSettings {
    /// The login user on hosts that name none (hostd's forced command sits in its
    /// authorized_keys).
    pub user: String,
    /// TCP connect + SSH handshake + authentication; also opening a channel and waiting for
    /// hostd's hello.
    pub connect_timeout: Duration,
    /// How many hosts may have calls in flight at once (calls to a host already being
    /// worked on do not take another slot).
    pub max_parallel_hosts: usize,
    /// hostd sessions open at once on one host, idle or in use: as many operations run on
    /// the host at once. OpenSSH refuses more than `MaxSessions` (default 10) per connection.
    pub max_sessions_per_host: usize,
    /// An idle session is closed after this long (its hostd exits).
    pub session_idle_timeout: Duration,
    /// A session is not reused after this long, so a changed hostd configuration, allowed
    /// signers file or hostd binary is in use on every session within this time.
    pub session_max_age: Duration,
    /// Envelope lifetime: `expires_at − issued_at`. hostd refuses lifetimes above its
    /// `max_envelope_lifetime_seconds` (default 3600).
    pub envelope_lifetime: Duration,
    /// Added to the envelope deadline to get the transport timeout.
    pub transport_grace: Duration,
    /// First delay after a failed connection attempt; doubles with each failure.
    pub reconnect_backoff_base: Duration,
    /// Longest delay between connection attempts.
    pub reconnect_backoff_max: Duration,
    /// Interval of `operation-status` polls after a dropped session.
    pub status_poll_interval: Duration,
    /// SSH keepalive interval on idle connections (detects dead peers).
    pub keepalive_interval: Duration,
    /// Unanswered keepalives before the connection counts as dead.
    pub keepalive_max: usize,
}

impl Default for SshSettings {
    fn default() -> Self {
        Self {
            user: "root".to_owned(),
            connect_timeout: Duration::from_secs(10),
            max_parallel_hosts: 16,
            max_sessions_per_host: 8,
            session_idle_timeout: Duration::from_secs(120),
            session_max_age: Duration::from_secs(900),
            envelope_lifetime: Duration::from_secs(600),
            transport_grace: Duration::from_secs(10),
            reconnect_backoff_base: Duration::from_millis(500),
            reconnect_backoff_max: Duration::from_secs(60),
            status_poll_interval: Duration::from_millis(500),
            keepalive_interval: Duration::from_secs(15),
            keepalive_max: 3,
        }
    }
}

/// Why the backend cannot be built.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum SshSetupError {
    #[error("the SSH login key is encrypted; the coordinator needs an unencrypted key")]
    EncryptedLoginKey,
    #[error("the operation-signing key must be an unencrypted Ed25519 key")]
    UnusableSigningKey,
    #[error("SSH setting `{setting}` {message}")]
    Setting {
        setting: &'static str,
        message: &'static str,
    },
}

/// Counters, for tests, benchmarks and metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SshStats {
    /// Calls started (each minted operation id, recovery polls excluded).
    pub calls: u64,
    /// Connection attempts (TCP connect through authentication), jump hosts included.
    pub connect_attempts: u64,
    /// Connections to hosts established.
    pub connections_opened: u64,
    /// Connections to jump hosts established.
    pub jump_connections_opened: u64,
    /// hostd sessions started (hello read): each is one `hostd serve` process on a host.
    pub sessions_opened: u64,
    /// Envelopes sent on a session that had answered an earlier one.
    pub sessions_reused: u64,
    /// Idle sessions found dead (hostd exited, channel or connection closed) and replaced.
    pub sessions_replaced: u64,
    /// Sessions closed after their idle timeout or maximum age.
    pub sessions_retired: u64,
    /// Calls whose session dropped after the envelope was sent.
    pub recoveries: u64,
    /// `operation-status` queries sent during recoveries.
    pub status_queries: u64,
    /// Envelopes sent a second time, with the same operation id, after a reused session died
    /// without acknowledging them and the host confirmed it had no record of them.
    pub resends: u64,
}

#[derive(Debug, Default)]
pub(crate) struct Stats {
    calls: AtomicU64,
    connect_attempts: AtomicU64,
    connections_opened: AtomicU64,
    jump_connections_opened: AtomicU64,
    connection_ids: AtomicU64,
    sessions_opened: AtomicU64,
    sessions_reused: AtomicU64,
    sessions_replaced: AtomicU64,
    sessions_retired: AtomicU64,
    recoveries: AtomicU64,
    status_queries: AtomicU64,
    resends: AtomicU64,
}

/// State shared by all calls.
pub(crate) struct Shared {
    settings: SshSettings,
    login_key: Arc<PrivateKey>,
    signer: EnvelopeSigner,
    hosts_limit: Arc<Semaphore>,
    hosts: Mutex<HashMap<HostTarget, Arc<HostEntry>>>,
    /// One link per jump host, shared by the hosts behind it.
    jumps: Mutex<HashMap<Jump, Arc<Link>>>,
    progress: Option<ProgressSink>,
    stats: Arc<Stats>,
}

/// The SSH backend. Cheap to clone; clones share connections, sessions and limits.
#[derive(Clone)]
pub struct SshBackend {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for SshBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SshBackend")
            .field("settings", &self.shared.settings)
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

pub(crate) fn transport(host: &str, message: String) -> CallError {
    CallError::Transport {
        host: host.to_owned(),
        message,
    }
}

/// What sending an envelope ended with.
enum Attempt {
    /// hostd's answer (success or failure), already checked against the operation.
    Done(Result<OperationResult, CallError>),
    /// Nothing reached hostd.
    NotSent(CallError),
    /// The envelope was sent (or may have been) and no result came back.
    Lost(Lost),
}

/// What `operation-status` told about a lost operation.
enum Recovery {
    /// The recorded outcome, or why it could not be learned in time.
    Known(Result<OperationResult, CallError>),
    /// The host confirmed it has no record: the envelope never arrived.
    NeverArrived(CallError),
}

/// A signed envelope, framed for the session.
struct Framed {
    id: OperationId,
    kind: OperationKind,
    payload: Vec<u8>,
    deadline: Duration,
}

impl SshBackend {
    /// A backend that logs in as `settings.user` (unless a host names another user) with
    /// `login_key` and signs envelopes with `signing_key` as `issuer` (the principal in the
    /// hosts' allowed_signers).
    pub fn new(
        login_key: PrivateKey,
        signing_key: PrivateKey,
        issuer: Principal,
        settings: SshSettings,
    ) -> Result<Self, SshSetupError> {
        if login_key.is_encrypted() {
            return Err(SshSetupError::EncryptedLoginKey);
        }
        if signing_key.is_encrypted()
            || signing_key.algorithm() != clawfleet_protocol::ssh_key::Algorithm::Ed25519
        {
            return Err(SshSetupError::UnusableSigningKey);
        }
        let check = |ok: bool, setting: &'static str, message: &'static str| {
            if ok {
                Ok(())
            } else {
                Err(SshSetupError::Setting { setting, message })
            }
        };
        check(!settings.user.is_empty(), "user", "must not be empty")?;
        check(
            !settings.connect_timeout.is_zero(),
            "connect_timeout",
            "must be positive",
        )?;
        check(
            settings.max_parallel_hosts >= 1,
            "max_parallel_hosts",
            "must be at least 1",
        )?;
        check(
            settings.max_sessions_per_host >= 1,
            "max_sessions_per_host",
            "must be at least 1",
        )?;
        check(
            !settings.session_idle_timeout.is_zero(),
            "session_idle_timeout",
            "must be positive",
        )?;
        check(
            !settings.session_max_age.is_zero(),
            "session_max_age",
            "must be positive",
        )?;
        check(
            settings.envelope_lifetime >= Duration::from_secs(1),
            "envelope_lifetime",
            "must be at least one second",
        )?;
        check(
            !settings.reconnect_backoff_base.is_zero()
                && settings.reconnect_backoff_base <= settings.reconnect_backoff_max,
            "reconnect_backoff_base",
            "must be positive and at most reconnect_backoff_max",
        )?;
        check(
            !settings.status_poll_interval.is_zero(),
            "status_poll_interval",
            "must be positive",
        )?;
        check(
            !settings.keepalive_interval.is_zero() && settings.keepalive_max >= 1,
            "keepalive_interval",
            "must be positive, with keepalive_max at least 1",
        )?;
        let signer = EnvelopeSigner::new(signing_key, issuer, settings.envelope_lifetime);
        Ok(Self {
            shared: Arc::new(Shared {
                hosts_limit: Arc::new(Semaphore::new(settings.max_parallel_hosts)),
                settings,
                login_key: Arc::new(login_key),
                signer,
                hosts: Mutex::new(HashMap::new()),
                jumps: Mutex::new(HashMap::new()),
                progress: None,
                stats: Arc::default(),
            }),
        })
    }

    /// The same backend with a progress sink for every call made through the coordinator's
    /// `Backend::call`. Call this before cloning or sharing the backend.
    pub fn with_progress(mut self, sink: ProgressSink) -> Self {
        match Arc::get_mut(&mut self.shared) {
            Some(shared) => shared.progress = Some(sink),
            None => tracing::warn!("with_progress ignored: the backend is already shared"),
        }
        self
    }

    /// The settings in force.
    pub fn settings(&self) -> &SshSettings {
        &self.shared.settings
    }

    /// Counters since the backend was built.
    pub fn stats(&self) -> SshStats {
        let s = &self.shared.stats;
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        SshStats {
            calls: get(&s.calls),
            connect_attempts: get(&s.connect_attempts),
            connections_opened: get(&s.connections_opened),
            jump_connections_opened: get(&s.jump_connections_opened),
            sessions_opened: get(&s.sessions_opened),
            sessions_reused: get(&s.sessions_reused),
            sessions_replaced: get(&s.sessions_replaced),
            sessions_retired: get(&s.sessions_retired),
            recoveries: get(&s.recoveries),
            status_queries: get(&s.status_queries),
            resends: get(&s.resends),
        }
    }

    /// How many connections were established to this host (1 while the first one lives).
    pub fn host_connections_opened(&self, host: &HostTarget) -> u64 {
        self.existing_entry(host)
            .map(|e| e.link.connections_opened.load(Ordering::Relaxed))
            .unwrap_or(0)
    }

    /// hostd sessions open on this host now (idle or in use), and the most open at once.
    pub fn host_sessions(&self, host: &HostTarget) -> (usize, usize) {
        self.existing_entry(host)
            .map(|e| {
                (
                    e.pool.open.load(Ordering::Relaxed),
                    e.pool.peak.load(Ordering::Relaxed),
                )
            })
            .unwrap_or((0, 0))
    }

    /// The local address of the host's current connection, if one is open and direct (lets a
    /// test find the connection from the server side).
    pub async fn connection_local_addr(&self, host: &HostTarget) -> Option<SocketAddr> {
        let entry = self.existing_entry(host)?;
        let conn = entry.link.current().await?;
        if conn.is_closed() {
            None
        } else {
            conn.local_addr
        }
    }

    /// Test and operator hook: closes the host's connection as if the network dropped it.
    /// Calls in flight on it lose their sessions and recover through `operation-status`.
    /// Returns whether a connection was open.
    pub async fn drop_connection(&self, host: &HostTarget) -> bool {
        match self.existing_entry(host) {
            Some(entry) => {
                tracing::info!(host = %host.name, "dropping the SSH connection on request");
                entry.link.drop_current("dropped on request").await
            }
            None => false,
        }
    }

    /// Test and operator hook: closes the host's idle hostd sessions (their hostd processes
    /// exit); the next call starts a new one. Returns how many were closed.
    pub async fn close_idle_sessions(&self, host: &HostTarget) -> usize {
        match self.existing_entry(host) {
            Some(entry) => entry.pool.close_idle().await,
            None => 0,
        }
    }

    /// Closes every idle session and every connection (for shutdown).
    pub async fn close_all(&self) {
        let entries: Vec<Arc<HostEntry>> = self
            .shared
            .hosts
            .lock()
            .map(|h| h.values().cloned().collect())
            .unwrap_or_default();
        for e in entries {
            let _ = e.pool.close_idle().await;
            e.link.drop_current("coordinator shutting down").await;
        }
        let jumps: Vec<Arc<Link>> = self
            .shared
            .jumps
            .lock()
            .map(|j| j.values().cloned().collect())
            .unwrap_or_default();
        for j in jumps {
            j.drop_current("coordinator shutting down").await;
        }
    }

    /// The recorded state of an operation id on a host (`operation-status`).
    pub async fn operation_status(
        &self,
        host: &HostTarget,
        operation_id: &OperationId,
    ) -> Result<OperationState, CallError> {
        let op = Operation::OperationStatus(OperationStatusArgs {
            operation_id: operation_id.clone(),
        });
        match self
            .call_with_progress(host, op, self.status_options(), None)
            .await?
        {
            OperationResult::OperationStatus(s) => Ok(s.state),
            other => Err(transport(
                host.name.as_str(),
                format!(
                    "hostd answered operation-status with a {} result",
                    other.kind()
                ),
            )),
        }
    }

    fn status_options(&self) -> CallOptions {
        CallOptions {
            fence: None,
            deadline: self
                .shared
                .settings
                .connect_timeout
                .max(Duration::from_secs(5)),
        }
    }

    fn existing_entry(&self, host: &HostTarget) -> Option<Arc<HostEntry>> {
        self.shared
            .hosts
            .lock()
            .ok()?
            .get(&normalised(host))
            .cloned()
    }

    fn entry(&self, host: &HostTarget) -> Result<Arc<HostEntry>, CallError> {
        host.check().map_err(|e| CallError::Unsupported {
            target: host.name.to_string(),
            message: e.to_string(),
        })?;
        let key = normalised(host);
        let mut hosts = self.shared.hosts.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(e) = hosts.get(&key) {
            return Ok(e.clone());
        }
        // The host was re-addressed, re-pinned or moved behind another jump host: forget the
        // old entry (calls still running on it keep their own reference; its idle sessions
        // close with it).
        hosts.retain(|k, _| k.name != key.name);
        let via = key.jump.as_ref().map(|j| {
            let mut jumps = self.shared.jumps.lock().unwrap_or_else(|p| p.into_inner());
            jumps
                .entry(j.clone())
                .or_insert_with(|| Arc::new(Link::jump(j, &self.shared)))
                .clone()
        });
        let entry = Arc::new(HostEntry::new(key.clone(), via, &self.shared));
        hosts.insert(key, entry.clone());
        Ok(entry)
    }

    /// Sends one operation and waits for its result, forwarding progress to `progress`
    /// (or, when `None`, to the backend's sink if it has one).
    pub async fn call_with_progress(
        &self,
        host: &HostTarget,
        operation: Operation,
        options: CallOptions,
        progress: Option<&ProgressSink>,
    ) -> Result<OperationResult, CallError> {
        let entry = self.entry(host)?;
        let sink = progress.or(self.shared.progress.as_ref()).cloned();
        if entry.fingerprint().is_none() {
            // No usable pin: connect anyway so the error can name the key presented; the
            // handshake refuses it.
            return Err(match entry.connection(&self.shared, false).await {
                Err(e) => e,
                Ok(_) => entry.mismatch("(unchecked)".to_owned()),
            });
        }
        let _host = entry.enter(&self.shared.hosts_limit).await;
        // One session at a time per call, recovery included; the semaphore is never closed.
        let _session_slot = entry.pool.limit.clone().acquire_owned().await.ok();
        let kind = operation.kind();
        let read_only = kind.is_read_only();
        if entry.versions().is_none() {
            // The envelope's version depends on what this hostd accepts: learn it from a
            // session's hello before the first envelope is signed (the session stays pooled).
            let warm = OperationId::new("warm-up")
                .map_err(|e| transport(host.name.as_str(), e.to_string()))?;
            let s = self.session(&entry, &warm, false).await?;
            entry.pool.put(s, &self.shared.stats);
        }
        // A read-only operation whose session dropped is simply sent again once, on a new
        // session.
        let tries = if read_only { 2 } else { 1 };
        let mut last_loss = None;
        for attempt in 0..tries {
            let id = self.shared.signer.mint_id().map_err(|e| {
                transport(
                    host.name.as_str(),
                    format!("cannot mint an operation id: {e}"),
                )
            })?;
            self.shared.stats.calls.fetch_add(1, Ordering::Relaxed);
            let span = tracing::info_span!("ssh_call", host = %host.name, operation_id = %id, op = kind.as_str());
            let framed = self.frame(&entry, &id, operation.clone(), options)?;
            let outcome = self
                .send(&entry, &framed, sink.as_ref(), attempt > 0)
                .instrument(span.clone())
                .await;
            match outcome {
                Attempt::Done(r) => return r,
                Attempt::NotSent(e) => return Err(e),
                Attempt::Lost(lost) if read_only => {
                    tracing::warn!(parent: &span, operation_id = %id, "session lost for a read-only operation: {}", lost.reason);
                    last_loss = Some(lost);
                }
                Attempt::Lost(lost) => {
                    return self
                        .recover_or_resend(&entry, &framed, lost, sink.as_ref())
                        .instrument(span)
                        .await;
                }
            }
        }
        Err(transport(
            host.name.as_str(),
            format!(
                "the session to {} dropped twice before hostd answered a read-only {kind}: {}",
                entry.label(),
                last_loss.map(|l| l.reason).unwrap_or_default()
            ),
        ))
    }

    /// Opens one stream to the gateway of `namespace/agent` on `host` for `caller` (an API
    /// principal, logged by hostd), over the host's relay channel: a session of its own on
    /// the host's SSH connection, started on first use and shared by every stream, never
    /// one of the operation sessions. hostd finds the Agent's port itself.
    pub async fn open_gateway_stream(
        &self,
        host: &HostTarget,
        namespace: &clawfleet_protocol::Ident,
        agent: &clawfleet_protocol::Ident,
        caller: &str,
    ) -> Result<tokio::io::DuplexStream, CallError> {
        self.open_relay_stream(host, namespace, agent, caller, false)
            .await
            .map(|(s, _)| s)
    }

    /// [`SshBackend::open_gateway_stream`], with the Agent's managed gateway password that
    /// hostd answers from its own state (`None` when the Agent's configuration uses none),
    /// for the gateway route to add at the last hop.
    pub async fn open_gateway_stream_with_auth(
        &self,
        host: &HostTarget,
        namespace: &clawfleet_protocol::Ident,
        agent: &clawfleet_protocol::Ident,
        caller: &str,
    ) -> Result<(tokio::io::DuplexStream, Option<String>), CallError> {
        let (stream, opened) = self
            .open_relay_stream(host, namespace, agent, caller, true)
            .await?;
        let opened: clawfleet_protocol::relay::RelayOpened = serde_json::from_slice(&opened)
            .map_err(|e| {
                transport(
                    host.name.as_str(),
                    format!(
                        "hostd's answer to the gateway stream's open is not the gateway's auth \
                         (hostd older than the gateway route?): {e}"
                    ),
                )
            })?;
        Ok((stream, opened.gateway_password))
    }

    async fn open_relay_stream(
        &self,
        host: &HostTarget,
        namespace: &clawfleet_protocol::Ident,
        agent: &clawfleet_protocol::Ident,
        caller: &str,
        gateway_auth: bool,
    ) -> Result<(tokio::io::DuplexStream, Vec<u8>), CallError> {
        let entry = self.entry(host)?;
        let Some(host_key) = entry.fingerprint().cloned() else {
            return Err(match entry.connection(&self.shared, false).await {
                Err(e) => e,
                Ok(_) => entry.mismatch("(unchecked)".to_owned()),
            });
        };
        let name = host.name.as_str();
        let limit = self.shared.settings.connect_timeout;
        let relay = {
            let mut slot = entry.relay.lock().await;
            match slot.as_ref() {
                Some(r) if r.is_alive() => r.clone(),
                _ => {
                    let conn = entry.connection(&self.shared, false).await?;
                    let r = relay::RelayClient::start(name, &entry.label(), &conn, limit).await?;
                    *slot = Some(r.clone());
                    r
                }
            }
        };
        let signed = self
            .shared
            .signer
            .sign_relay_open(
                &host.name,
                &host_key,
                namespace,
                agent,
                caller,
                gateway_auth,
            )
            .map_err(|e| transport(name, format!("cannot sign the gateway stream's open: {e}")))?;
        relay.open(name, &signed, limit).await
    }

    /// Gateway streams open on `host`'s relay channel (0 without one).
    pub async fn gateway_streams(&self, host: &HostTarget) -> usize {
        let Ok(entry) = self.entry(host) else {
            return 0;
        };
        let slot = entry.relay.lock().await;
        slot.as_ref().map_or(0, |r| r.open_streams())
    }

    /// Signs and frames the envelope for one operation.
    fn frame(
        &self,
        entry: &HostEntry,
        id: &OperationId,
        operation: Operation,
        options: CallOptions,
    ) -> Result<Framed, CallError> {
        let host = entry.target.name.as_str();
        let kind = operation.kind();
        let Some(fingerprint) = entry.fingerprint() else {
            return Err(entry.mismatch("(not checked)".to_owned()));
        };
        // The newest version hostd accepts: version 2 carries the fence; a hostd from before
        // fencing accepts only version 1, and gets its operations unfenced.
        let accepted = entry.versions().unwrap_or_default();
        let version = if accepted.is_empty() || accepted.contains(&PROTOCOL_VERSION) {
            PROTOCOL_VERSION
        } else if let Some(v) = accepted
            .iter()
            .copied()
            .filter(|v| SUPPORTED_VERSIONS.contains(v))
            .max()
        {
            v
        } else {
            return Err(CallError::Failed(Failure::new(
                FailureCode::UnsupportedVersion,
                format!(
                    "hostd on {} speaks protocol versions {accepted:?}; this coordinator speaks {SUPPORTED_VERSIONS:?}",
                    entry.label()
                ),
            )));
        };
        let signed = self
            .shared
            .signer
            .sign(
                id,
                &entry.target.name,
                fingerprint,
                options.deadline,
                (version, options.fence),
                operation,
            )
            .map_err(|e| transport(host, format!("cannot sign the envelope: {e}")))?;
        let payload = Message::Envelope(signed)
            .to_frame()
            .map_err(|e| e.to_string())
            .and_then(|f| {
                f.encode(Limits::default().max_frame)
                    .map_err(|e| e.to_string())
            })
            .map_err(|e| transport(host, format!("the envelope cannot be framed: {e}")))?;
        Ok(Framed {
            id: id.clone(),
            kind,
            payload,
            deadline: Duration::from_secs(u64::from(signer::deadline_seconds(options.deadline))),
        })
    }

    /// A session for one envelope: an idle one from the pool unless `fresh`, else a new one
    /// (a broken connection found on the way is replaced once).
    async fn session(
        &self,
        entry: &Arc<HostEntry>,
        id: &OperationId,
        fresh: bool,
    ) -> Result<OpenSession, CallError> {
        let stats = &self.shared.stats;
        if !fresh && let Some(s) = entry.pool.take(stats) {
            // A session that only said hello (the version warm-up) is new to its first
            // envelope, not reused.
            if s.answered > 0 {
                stats.sessions_reused.fetch_add(1, Ordering::Relaxed);
            }
            return Ok(s);
        }
        for retry in [false, true] {
            let conn = entry.connection(&self.shared, false).await?;
            match session::open(
                entry,
                &conn,
                self.shared.settings.connect_timeout,
                &entry.pool.open,
            )
            .await
            {
                Ok(s) => {
                    stats.sessions_opened.fetch_add(1, Ordering::Relaxed);
                    entry.pool.opened();
                    tracing::debug!(operation_id = %id, connection = conn.id, hostd = %s.hello.hostd_version, "session open");
                    return Ok(s);
                }
                Err(OpenError::Connection(e)) if !retry => {
                    tracing::info!(operation_id = %id, connection = conn.id, "replacing a broken connection: {e}");
                    entry.link.invalidate(&conn, "broken connection").await;
                }
                Err(OpenError::Connection(e) | OpenError::Refused(e)) => return Err(e),
            }
        }
        Err(transport(
            entry.target.name.as_str(),
            format!("no session to {}", entry.label()),
        ))
    }

    /// One envelope over one session. The session goes back to the pool after a complete
    /// exchange and is dropped (closed) otherwise.
    async fn send(
        &self,
        entry: &Arc<HostEntry>,
        framed: &Framed,
        sink: Option<&ProgressSink>,
        fresh: bool,
    ) -> Attempt {
        let host = entry.target.name.as_str();
        let id = &framed.id;
        let mut session = match self.session(entry, id, fresh).await {
            Ok(s) => s,
            Err(e) => return Attempt::NotSent(e),
        };
        let until = Instant::now() + framed.deadline + self.shared.settings.transport_grace;
        let name = entry.target.name.clone();
        let forward = |p: &Progress| {
            tracing::debug!(operation_id = %id, step = ?p.step, elapsed_ms = p.elapsed_ms, "progress");
            if let Some(sink) = sink {
                sink(&name, p);
            }
        };
        tracing::debug!(operation_id = %id, deadline_s = framed.deadline.as_secs(), reused = session.answered > 0, "sending the envelope");
        let started = Instant::now();
        let reply = match session.exchange(&framed.payload, id, until, &forward).await {
            Err(lost) => return Attempt::Lost(lost),
            Ok(reply) => reply,
        };
        entry.pool.put(session, &self.shared.stats);
        let elapsed_us = started.elapsed().as_micros() as u64;
        if let Some(other) = &reply.operation_id
            && other != id
        {
            return Attempt::Done(Err(transport(
                host,
                format!("hostd answered {id} with the result of {other}"),
            )));
        }
        let r = check_outcome(host, id, framed.kind, reply.outcome);
        match &r {
            Ok(_) => tracing::info!(operation_id = %id, elapsed_us, "operation succeeded"),
            Err(e) => {
                tracing::warn!(operation_id = %id, elapsed_us, code = %e.code(), "operation failed: {e}")
            }
        }
        Attempt::Done(r)
    }

    /// A changing operation's session dropped after the envelope was sent: learn the outcome
    /// with `operation-status`; if the host never got an envelope written into a reused
    /// session, send the same envelope once more on a new session.
    async fn recover_or_resend(
        &self,
        entry: &Arc<HostEntry>,
        framed: &Framed,
        lost: Lost,
        sink: Option<&ProgressSink>,
    ) -> Result<OperationResult, CallError> {
        let may_resend = lost.may_resend();
        match self.recover(entry, framed, &lost).await {
            Recovery::Known(r) => r,
            Recovery::NeverArrived(e) if !may_resend => Err(e),
            Recovery::NeverArrived(_) => {
                tracing::info!(operation_id = %framed.id, "the envelope went into a session that had died; sending it again on a new session");
                self.shared.stats.resends.fetch_add(1, Ordering::Relaxed);
                match self.send(entry, framed, sink, true).await {
                    Attempt::Done(r) => r,
                    Attempt::NotSent(e) => Err(e),
                    Attempt::Lost(again) => match self.recover(entry, framed, &again).await {
                        Recovery::Known(r) => r,
                        Recovery::NeverArrived(e) => Err(e),
                    },
                }
            }
        }
    }

    /// Learns a lost operation's recorded outcome with `operation-status`, polling while the
    /// host still runs it, within the original transport deadline (at least one query is
    /// always made).
    async fn recover(&self, entry: &Arc<HostEntry>, framed: &Framed, lost: &Lost) -> Recovery {
        let settings = &self.shared.settings;
        let host = entry.target.name.as_str();
        let (id, kind) = (&framed.id, framed.kind);
        self.shared.stats.recoveries.fetch_add(1, Ordering::Relaxed);
        let what = if lost.timed_out {
            "timed out"
        } else {
            "dropped"
        };
        tracing::warn!(operation_id = %id, timed_out = lost.timed_out, "no result ({}); asking the host for the recorded outcome", lost.reason);
        let lost_at = Instant::now();
        // Within the call's own transport deadline, but always with time for a reconnect
        // and one query.
        let give_up = lost.until.max(lost_at + settings.connect_timeout);
        // hostd may still be reading the envelope out of its pipe when the first query
        // lands; "unknown" counts only once confirmed a moment later.
        let confirm_unknown_after = Duration::from_secs(1).max(settings.status_poll_interval);
        let mut polls = 0u32;
        let mut last_problem: String;
        loop {
            polls += 1;
            self.shared
                .stats
                .status_queries
                .fetch_add(1, Ordering::Relaxed);
            match self.query_status(entry, id).await {
                Ok(OperationState::Running { step, .. }) => {
                    tracing::info!(operation_id = %id, ?step, "still running on the host");
                    last_problem = format!(
                        "the host still runs it (step {})",
                        step.map(|s| format!("{s:?}"))
                            .unwrap_or_else(|| "-".to_owned())
                    );
                }
                Ok(OperationState::Succeeded { kind: k, result }) => {
                    tracing::info!(operation_id = %id, polls, "recovered: the host recorded success");
                    if k != kind || result.kind() != kind {
                        return Recovery::Known(Err(transport(
                            host,
                            format!("operation-status reports {id} as a {k}, but it was a {kind}"),
                        )));
                    }
                    return Recovery::Known(Ok(*result));
                }
                Ok(OperationState::Failed {
                    kind: k,
                    failure,
                    after_step,
                }) => {
                    tracing::warn!(operation_id = %id, polls, code = failure.code.as_str(), ?after_step, "recovered: the host recorded a failure: {}", failure.message);
                    if k != kind {
                        return Recovery::Known(Err(transport(
                            host,
                            format!("operation-status reports {id} as a {k}, but it was a {kind}"),
                        )));
                    }
                    return Recovery::Known(Err(CallError::Failed(failure)));
                }
                Ok(OperationState::Unknown) => {
                    if lost_at.elapsed() >= confirm_unknown_after {
                        tracing::warn!(operation_id = %id, polls, "the host has no record of the operation");
                        return Recovery::NeverArrived(transport(
                            host,
                            format!(
                                "the session to {} {what} after operation {id} was sent ({}), and the host has no record of it: it never arrived; safe to retry with a new operation id",
                                entry.label(),
                                lost.reason
                            ),
                        ));
                    }
                    last_problem = "the host has no record of it yet".to_owned();
                }
                Err(
                    e @ (CallError::HostKeyMismatch { .. }
                    | CallError::AuthenticationRefused { .. }),
                ) => {
                    return Recovery::Known(Err(e));
                }
                Err(e) => {
                    tracing::info!(operation_id = %id, "operation-status failed: {e}");
                    last_problem = e.to_string();
                }
            }
            let now = Instant::now();
            if now >= give_up {
                break;
            }
            tokio::time::sleep(settings.status_poll_interval.min(give_up - now)).await;
        }
        Recovery::Known(Err(transport(
            host,
            format!(
                "the session to {} {what} after operation {id} was sent ({}), and its outcome is still unknown at the transport deadline: {last_problem}; ask operation-status for {id} later",
                entry.label(),
                lost.reason
            ),
        )))
    }

    /// One `operation-status` query for `id`, with its own id, over the (re)connected host.
    async fn query_status(
        &self,
        entry: &Arc<HostEntry>,
        id: &OperationId,
    ) -> Result<OperationState, CallError> {
        let host = entry.target.name.as_str();
        let status_id = self
            .shared
            .signer
            .mint_id()
            .map_err(|e| transport(host, format!("cannot mint an operation id: {e}")))?;
        let op = Operation::OperationStatus(OperationStatusArgs {
            operation_id: id.clone(),
        });
        // Patient: wait out the reconnect backoff rather than failing at once.
        entry.connection(&self.shared, true).await?;
        let framed = self.frame(entry, &status_id, op, self.status_options())?;
        match self.send(entry, &framed, None, false).await {
            Attempt::Done(Ok(OperationResult::OperationStatus(s))) => {
                if &s.operation_id != id {
                    return Err(transport(
                        host,
                        format!(
                            "operation-status answered for {} instead of {id}",
                            s.operation_id
                        ),
                    ));
                }
                Ok(s.state)
            }
            Attempt::Done(Ok(other)) => Err(transport(
                host,
                format!("operation-status answered with a {} result", other.kind()),
            )),
            Attempt::Done(Err(e)) | Attempt::NotSent(e) => Err(e),
            Attempt::Lost(l) => Err(transport(
                host,
                format!("the operation-status session dropped too: {}", l.reason),
            )),
        }
    }
}

/// A target as the backend keys it (the pinned key lines trimmed).
fn normalised(t: &HostTarget) -> HostTarget {
    let mut t = t.clone();
    t.host_key = t.host_key.trim().to_owned();
    if let Some(j) = &mut t.jump {
        j.host_key = j.host_key.trim().to_owned();
    }
    t
}

/// Maps hostd's outcome to the call's result, checking that it answers this operation.
fn check_outcome(
    host: &str,
    id: &OperationId,
    kind: OperationKind,
    outcome: Outcome,
) -> Result<OperationResult, CallError> {
    match outcome {
        Outcome::Succeeded { result } if result.kind() == kind => Ok(result),
        Outcome::Succeeded { result } => Err(transport(
            host,
            format!("hostd answered {kind} {id} with a {} result", result.kind()),
        )),
        Outcome::Failed { failure } => Err(CallError::Failed(failure)),
    }
}
