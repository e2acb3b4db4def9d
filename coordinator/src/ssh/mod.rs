//! The SSH backend: pushes signed operations to hostd over one persistent russh connection
//! per host.
//!
//! - Host keys are pinned: the key a host presents must equal [`HostTarget::host_key`] (key
//!   data), or the call fails with [`CallError::HostKeyMismatch`] naming both fingerprints.
//! - Each call opens a session channel on the host's connection and runs `hostd serve` (the
//!   forced command runs anyway), reads hostd's hello, sends one signed envelope, forwards
//!   progress and returns the one result. Concurrent calls to one host share the connection,
//!   each on its own channel (hostd serves one envelope at a time per session).
//! - At most [`SshSettings::max_parallel_hosts`] hosts are worked on at once; at most
//!   [`SshSettings::max_sessions_per_host`] channels are open per host.
//! - The transport gives up [`SshSettings::transport_grace`] after the envelope deadline.
//! - Failed connections are retried with exponential backoff per host.
//! - If the session drops after the envelope was sent, the backend reconnects and asks
//!   `operation-status` until the operation is no longer running (within the original
//!   deadline), and returns the recorded outcome. It never guesses: an operation the host
//!   has no record of is a transport error (safe to retry with a new id).
//!
//! Tests and benchmark (as root; each prints `SKIP: …` otherwise, and fails under `CI=true`):
//! - `cargo test -p clawfleet-coordinator --test ssh_loopback`: a private OpenSSH sshd on
//!   127.0.0.1 with the real hostd (built with cargo on first use, or `$CLAWFLEET_HOSTD_BIN`)
//!   as the forced command: connection reuse, concurrency, pinning, refused login keys,
//!   reconnects, fast failures, lost results recovered through `operation-status`.
//! - `cargo test -p clawfleet-coordinator --test ssh_hosts`: a real test host (vm-tests).
//! - `cargo bench -p clawfleet-coordinator --bench transport`: latency against the peer's
//!   transport (a new `ssh` process per operation).

mod connection;
mod pinning;
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
use clawfleet_protocol::{Operation, OperationId, Principal};
use thiserror::Error;
use tokio::sync::Semaphore;
use tracing::Instrument;

use crate::backend::{Backend, CallError, CallOptions, HostTarget, ProgressSink, Target};
use connection::HostEntry;
pub use pinning::{PinError, PinnedKey};
use session::{Lost, OpenError};
use signer::EnvelopeSigner;

/// Limits and settings of the SSH backend. Every value is configurable so tests wait
/// seconds; the defaults follow the design's time budget.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SshSettings {
    /// The login user on every host (hostd's forced command sits in its authorized_keys).
    pub user: String,
    /// TCP connect + SSH handshake + authentication; also opening a channel and waiting for
    /// hostd's hello.
    pub connect_timeout: Duration,
    /// How many hosts may have calls in flight at once (calls to a host already being
    /// worked on do not take another slot).
    pub max_parallel_hosts: usize,
    /// Session channels open at once on one host's connection. OpenSSH refuses more than
    /// `MaxSessions` (default 10).
    pub max_sessions_per_host: usize,
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
            max_parallel_hosts: 32,
            max_sessions_per_host: 8,
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
    /// Connection attempts (TCP connect through authentication).
    pub connect_attempts: u64,
    /// Connections established.
    pub connections_opened: u64,
    /// Session channels on which hostd's hello was read.
    pub sessions_opened: u64,
    /// Calls whose session dropped after the envelope was sent.
    pub recoveries: u64,
    /// `operation-status` queries sent during recoveries.
    pub status_queries: u64,
}

#[derive(Debug, Default)]
pub(crate) struct Stats {
    calls: AtomicU64,
    connect_attempts: AtomicU64,
    connections_opened: AtomicU64,
    connection_ids: AtomicU64,
    sessions_opened: AtomicU64,
    recoveries: AtomicU64,
    status_queries: AtomicU64,
}

/// State shared by all calls.
pub(crate) struct Shared {
    settings: SshSettings,
    login_key: Arc<PrivateKey>,
    signer: EnvelopeSigner,
    hosts_limit: Arc<Semaphore>,
    hosts: Mutex<HashMap<HostKey, Arc<HostEntry>>>,
    progress: Option<ProgressSink>,
    stats: Stats,
}

/// A host entry is keyed by everything that decides how to reach and trust it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct HostKey {
    name: String,
    address: String,
    port: u16,
    host_key: String,
}

impl HostKey {
    fn of(t: &HostTarget) -> Self {
        Self {
            name: t.name.to_string(),
            address: t.address.clone(),
            port: t.port,
            host_key: t.host_key.trim().to_owned(),
        }
    }
}

/// The SSH backend. Cheap to clone; clones share connections and limits.
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

/// What an attempt ended with.
enum Attempt {
    /// hostd's answer (success or failure), already checked against the operation.
    Done(Result<OperationResult, CallError>),
    /// Nothing reached hostd.
    NotSent(CallError),
    /// The envelope was sent (or may have been) and no result came back.
    Lost(Lost),
}

impl SshBackend {
    /// A backend that logs in as `settings.user` with `login_key` and signs envelopes with
    /// `signing_key` as `issuer` (the principal in the hosts' allowed_signers).
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
                progress: None,
                stats: Stats::default(),
            }),
        })
    }

    /// The same backend with a progress sink for every call made through [`Backend::call`].
    /// Call this before cloning or sharing the backend.
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
        SshStats {
            calls: s.calls.load(Ordering::Relaxed),
            connect_attempts: s.connect_attempts.load(Ordering::Relaxed),
            connections_opened: s.connections_opened.load(Ordering::Relaxed),
            sessions_opened: s.sessions_opened.load(Ordering::Relaxed),
            recoveries: s.recoveries.load(Ordering::Relaxed),
            status_queries: s.status_queries.load(Ordering::Relaxed),
        }
    }

    /// How many connections were established to this host (1 while the first one lives).
    pub fn host_connections_opened(&self, host: &HostTarget) -> u64 {
        self.existing_entry(host)
            .map(|e| e.connections_opened.load(Ordering::Relaxed))
            .unwrap_or(0)
    }

    /// The local address of the host's current connection, if one is open (lets a test find
    /// the connection from the server side).
    pub async fn connection_local_addr(&self, host: &HostTarget) -> Option<SocketAddr> {
        let entry = self.existing_entry(host)?;
        let conn = entry.current().await?;
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
                entry.drop_current("dropped on request").await
            }
            None => false,
        }
    }

    /// Closes every connection (for shutdown).
    pub async fn close_all(&self) {
        let entries: Vec<Arc<HostEntry>> = self
            .shared
            .hosts
            .lock()
            .map(|h| h.values().cloned().collect())
            .unwrap_or_default();
        for e in entries {
            e.drop_current("coordinator shutting down").await;
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
        let key = HostKey::of(host);
        self.shared.hosts.lock().ok()?.get(&key).cloned()
    }

    fn entry(&self, host: &HostTarget) -> Arc<HostEntry> {
        let key = HostKey::of(host);
        let mut hosts = self.shared.hosts.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(e) = hosts.get(&key) {
            return e.clone();
        }
        // The host was re-addressed or re-pinned: forget the old entry (calls still running
        // on it keep their own reference).
        hosts.retain(|k, _| k.name != key.name);
        let entry = Arc::new(HostEntry::new(host.clone(), &self.shared));
        hosts.insert(key, entry.clone());
        entry
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
        let entry = self.entry(host);
        let sink = progress.or(self.shared.progress.as_ref()).cloned();
        let _host = entry.enter(&self.shared.hosts_limit).await;
        // Per-host channel limit; the semaphore is never closed.
        let _channel = entry.sessions.clone().acquire_owned().await.ok();
        let kind = operation.kind();
        let read_only = kind.is_read_only();
        // A read-only operation whose session dropped is simply sent again once.
        let tries = if read_only { 2 } else { 1 };
        let mut last_loss = None;
        for _ in 0..tries {
            let id = self.shared.signer.mint_id().map_err(|e| {
                transport(
                    host.name.as_str(),
                    format!("cannot mint an operation id: {e}"),
                )
            })?;
            self.shared.stats.calls.fetch_add(1, Ordering::Relaxed);
            let span = tracing::info_span!("ssh_call", host = %host.name, operation_id = %id, op = kind.as_str());
            let outcome = self
                .attempt(&entry, &id, operation.clone(), options, sink.as_ref())
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
                    return self.recover(&entry, &id, kind, lost).instrument(span).await;
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

    /// One envelope over one session channel. A broken connection found before sending is
    /// replaced once.
    async fn attempt(
        &self,
        entry: &Arc<HostEntry>,
        id: &OperationId,
        operation: Operation,
        options: CallOptions,
        sink: Option<&ProgressSink>,
    ) -> Attempt {
        let settings = &self.shared.settings;
        let host = entry.target.name.as_str();
        let kind = operation.kind();
        let Some(fingerprint) = entry.fingerprint().cloned() else {
            // No usable pin: connect anyway so the error can name the key presented; the
            // handshake refuses it.
            return Attempt::NotSent(match entry.connection(&self.shared, false).await {
                Err(e) => e,
                Ok(_) => entry.mismatch("(unchecked)".to_owned()),
            });
        };
        let mut session = None;
        for retry in [false, true] {
            let conn = match entry.connection(&self.shared, false).await {
                Ok(c) => c,
                Err(e) => return Attempt::NotSent(e),
            };
            match session::open(entry, &conn, settings.connect_timeout).await {
                Ok(s) => {
                    self.shared
                        .stats
                        .sessions_opened
                        .fetch_add(1, Ordering::Relaxed);
                    tracing::debug!(operation_id = %id, connection = conn.id, hostd = %s.hello.hostd_version, "session open");
                    session = Some(s);
                    break;
                }
                Err(OpenError::Connection(e)) if !retry => {
                    tracing::info!(operation_id = %id, connection = conn.id, "replacing a broken connection: {e}");
                    entry.invalidate(&conn, "broken connection").await;
                }
                Err(OpenError::Connection(e) | OpenError::Refused(e)) => {
                    return Attempt::NotSent(e);
                }
            }
        }
        let Some(session) = session else {
            return Attempt::NotSent(transport(host, format!("no session to {}", entry.label())));
        };
        let signed = match self.shared.signer.sign(
            id,
            &entry.target.name,
            &fingerprint,
            options.deadline,
            operation,
        ) {
            Ok(s) => s,
            Err(e) => {
                return Attempt::NotSent(transport(host, format!("cannot sign the envelope: {e}")));
            }
        };
        let deadline = Duration::from_secs(u64::from(signer::deadline_seconds(options.deadline)));
        let until = Instant::now() + deadline + settings.transport_grace;
        let name = entry.target.name.clone();
        let forward = |p: &Progress| {
            tracing::debug!(operation_id = %id, step = ?p.step, elapsed_ms = p.elapsed_ms, "progress");
            if let Some(sink) = sink {
                sink(&name, p);
            }
        };
        tracing::debug!(operation_id = %id, deadline_s = deadline.as_secs(), "envelope sent");
        let started = Instant::now();
        match session.exchange(&signed, id, until, &forward).await {
            Err(lost) => Attempt::Lost(lost),
            Ok(reply) => {
                let elapsed_ms = started.elapsed().as_millis() as u64;
                if let Some(other) = &reply.operation_id
                    && other != id
                {
                    return Attempt::Done(Err(transport(
                        host,
                        format!("hostd answered {id} with the result of {other}"),
                    )));
                }
                let r = check_outcome(host, id, kind, reply.outcome);
                match &r {
                    Ok(_) => tracing::info!(operation_id = %id, elapsed_ms, "operation succeeded"),
                    Err(e) => {
                        tracing::warn!(operation_id = %id, elapsed_ms, code = e.code(), "operation failed: {e}")
                    }
                }
                Attempt::Done(r)
            }
        }
    }

    /// The session dropped after the envelope was sent: learn the recorded outcome with
    /// `operation-status`, polling while the host still runs the operation, within the
    /// original transport deadline (at least one query is always made).
    async fn recover(
        &self,
        entry: &Arc<HostEntry>,
        id: &OperationId,
        kind: OperationKind,
        lost: Lost,
    ) -> Result<OperationResult, CallError> {
        let settings = &self.shared.settings;
        let host = entry.target.name.as_str();
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
                        return Err(transport(
                            host,
                            format!("operation-status reports {id} as a {k}, but it was a {kind}"),
                        ));
                    }
                    return Ok(*result);
                }
                Ok(OperationState::Failed {
                    kind: k,
                    failure,
                    after_step,
                }) => {
                    tracing::warn!(operation_id = %id, polls, code = failure.code.as_str(), ?after_step, "recovered: the host recorded a failure: {}", failure.message);
                    if k != kind {
                        return Err(transport(
                            host,
                            format!("operation-status reports {id} as a {k}, but it was a {kind}"),
                        ));
                    }
                    return Err(CallError::Failed(failure));
                }
                Ok(OperationState::Unknown) => {
                    if lost_at.elapsed() >= confirm_unknown_after {
                        tracing::warn!(operation_id = %id, polls, "the host has no record of the operation");
                        return Err(transport(
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
                    return Err(e);
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
        Err(transport(
            host,
            format!(
                "the session to {} {what} after operation {id} was sent ({}), and its outcome is still unknown at the transport deadline: {last_problem}; ask operation-status for {id} later",
                entry.label(),
                lost.reason
            ),
        ))
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
        let options = self.status_options();
        match self.attempt(entry, &status_id, op, options, None).await {
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

impl Backend for SshBackend {
    fn call(
        &self,
        target: impl Into<Target> + Send,
        operation: Operation,
        options: CallOptions,
    ) -> impl Future<Output = Result<OperationResult, CallError>> + Send {
        let target = target.into();
        async move {
            match target {
                Target::Host(host) => {
                    self.call_with_progress(&host, operation, options, None)
                        .await
                }
                Target::Cluster(c) => Err(CallError::Unsupported {
                    target: c.name,
                    message: "the SSH backend reaches hosts only".into(),
                }),
            }
        }
    }
}
