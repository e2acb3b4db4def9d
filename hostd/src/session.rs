//! One SSH session of `hostd serve`: a hello, then any number of signed envelopes in, and a
//! result (plus progress events) out for each, over framed stdin/stdout.
//!
//! When the session closes (stdin ends, or SIGHUP/SIGTERM arrives) hostd finishes the step in
//! progress, starts no new one, records the operation's outcome in the journal, releases its
//! locks and exits. The coordinator learns the outcome with `operation-status`.

use std::cell::RefCell;
use std::io::{Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use clawfleet_protocol::failure::{Failure, FailureCode};
use clawfleet_protocol::framing::{FrameError, read_frame, write_frame};
use clawfleet_protocol::result::{Hello, Outcome, Progress, ResultMessage, Step};
use clawfleet_protocol::signing::Rejection;
use clawfleet_protocol::{
    AllowedSigners, HostIdentity, Ident, Limits, Message, SignedEnvelope, Verifier,
};
use thiserror::Error;

use crate::config::Config;
use crate::engine::{Ctx, Engine, step_name};
use crate::journal::{Begin, Journal, Validity};

/// Why a session could not start or had to end early.
#[derive(Debug, Error)]
pub enum SessionError {
    #[error("cannot write to the session: {0}")]
    Write(FrameError),
    #[error("the session's input is not a clawfleet frame stream: {0}")]
    Stream(FrameError),
    #[error("cannot open the operation journal: {0}")]
    Journal(crate::fsutil::FsError),
}

/// Current Unix time in seconds.
pub fn now_unix() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Everything needed to answer envelopes on this host.
pub struct Responder<'a> {
    engine: &'a Engine<'a>,
    verifier: Result<Verifier, Failure>,
    journal: Journal,
    /// The host's clock in Unix seconds ([`now_unix`]; tests move it).
    clock: Box<dyn Fn() -> u64 + 'a>,
    /// The coordinator login key this session authenticated with (`hostd serve --key`,
    /// written into the forced command by `hostd enrol`); `None` shares one bucket.
    login_key: Option<LoginKeyId>,
}

impl std::fmt::Debug for Responder<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Responder").finish_non_exhaustive()
    }
}

/// The verifier of this host's envelopes (and relay opens), or the failure every one of
/// them gets while allowed_signers is unusable (`SIGNERS_FILE_INVALID`; nothing is trusted).
pub fn verifier(
    config: &Config,
    host_key: &clawfleet_protocol::Fingerprint,
) -> Result<Verifier, Failure> {
    AllowedSigners::load(&config.allowed_signers)
        .map(|signers| {
            let mut v = Verifier::new(
                signers,
                HostIdentity {
                    name: config.host_name.clone(),
                    host_key: host_key.clone(),
                },
            );
            v.clock_skew_seconds = config.limits.clock_skew_seconds;
            v.max_lifetime_seconds = config.limits.max_envelope_lifetime_seconds;
            v
        })
        .map_err(|e| {
            Failure::new(
                FailureCode::SignersFileInvalid,
                format!("this host's allowed_signers is not usable: {e}"),
            )
        })
}

impl<'a> Responder<'a> {
    /// Loads allowed_signers (an invalid file makes every envelope fail with
    /// `SIGNERS_FILE_INVALID`, never trusts anything) and opens the journal.
    pub fn new(engine: &'a Engine<'a>, config: &Config) -> Result<Self, SessionError> {
        let verifier = verifier(config, &engine.host_key);
        crate::fsutil::ensure_dir(&config.state_root, 0o755).map_err(SessionError::Journal)?;
        let journal = Journal::open(&engine.layout.journal_dir(), config.journal_max_entries)
            .map_err(SessionError::Journal)?;
        Ok(Self {
            engine,
            verifier,
            journal,
            clock: Box::new(now_unix),
            login_key: None,
        })
    }

    /// Names the coordinator login key the session authenticated with (`hostd serve
    /// --key`): its sessions count against that key's `[limits] max_sessions` only.
    pub fn set_login_key(&mut self, key: Option<LoginKeyId>) {
        self.login_key = key;
    }

    /// Replaces the clock (tests: a host clock stepped ahead and back).
    pub fn set_clock(&mut self, clock: impl Fn() -> u64 + 'a) {
        self.clock = Box::new(clock);
    }

    /// Verifies and executes one envelope; `progress` receives each step as it starts.
    pub fn respond(
        &self,
        signed: &SignedEnvelope,
        cancelled: &dyn Fn() -> bool,
        progress: &mut dyn FnMut(Progress),
    ) -> ResultMessage {
        let now = (self.clock)();
        let verified = match &self.verifier {
            Err(failure) => {
                return ResultMessage {
                    operation_id: None,
                    outcome: Outcome::Failed {
                        failure: failure.clone(),
                    },
                };
            }
            Ok(v) => v.verify(signed, now),
        };
        let verified = match verified {
            Ok(v) => v,
            Err(Rejection {
                operation_id,
                failure,
            }) => {
                tracing::warn!(
                    operation_id = operation_id.as_ref().map(|i| i.as_str()).unwrap_or("-"),
                    code = failure.code.as_str(),
                    "envelope refused: {}",
                    failure.message
                );
                return ResultMessage {
                    operation_id,
                    outcome: Outcome::Failed { failure },
                };
            }
        };
        let env = &verified.envelope;
        let id = env.operation_id.clone();
        let kind = env.operation.kind();
        // A host configured for fewer versions (`protocol_versions`, e.g. a test host standing
        // in for a hostd that predates fencing) refuses the others as that hostd would.
        let speaks = &self.engine.config.protocol_versions;
        if !speaks.contains(&env.version) {
            let failure = Failure::new(
                FailureCode::UnsupportedVersion,
                format!(
                    "protocol version {} is not supported; this side speaks {speaks:?}",
                    env.version
                ),
            );
            tracing::warn!(operation_id = %id, code = failure.code.as_str(), "envelope refused: {}", failure.message);
            return failed(Some(id), failure);
        }
        tracing::info!(
            operation_id = %id,
            op = kind.as_str(),
            agent = env.operation.agent().map_or("-", Ident::as_str),
            revision = env.operation.revision().map_or("-", Ident::as_str),
            fence = env.fence.unwrap_or(0),
            issuer = %env.issuer,
            signer = %verified.signer,
            "operation received"
        );
        let started = Instant::now();
        let deadline = started + Duration::from_secs(u64::from(env.deadline_seconds));

        // Read-only operations are not recorded: they change nothing, so running one again is
        // harmless and always answers from the host as it is now, `probe` and `status` write
        // nothing, and polling cannot crowd changing operations out of the journal. Their ids
        // are therefore not reserved among themselves. An id a recorded operation already has
        // is refused, though, so `operation-status` on it only ever reports that operation.
        let handle = if kind.is_read_only() {
            match self.journal.recorded_kind(&id) {
                Err(e) => {
                    return failed(Some(id), Failure::new(FailureCode::IoFailed, e.to_string()));
                }
                Ok(Some(recorded)) => {
                    return failed(
                        Some(id),
                        Failure::new(
                            FailureCode::ReplayMismatch,
                            format!(
                                "this operation id was used before for a {recorded} operation; a {kind} needs an id of its own",
                            ),
                        ),
                    );
                }
                Ok(None) => None,
            }
        } else {
            // Deferred: the entry is written durably only when the engine is about to change
            // something (`Ctx::commit`); a no-op is recorded cheaply (journal.rs).
            match self.journal.begin_deferred(
                &id,
                kind,
                &verified.body_sha256,
                Validity {
                    issued_at: env.issued_at,
                    expires_at: env.expires_at,
                },
                now,
            ) {
                Err(e) => return failed(Some(id), journal_failure(e, "")),
                Ok(Begin::Recorded(outcome)) => {
                    tracing::info!(operation_id = %id, "replay: returning the recorded outcome");
                    return ResultMessage {
                        operation_id: Some(id),
                        outcome,
                    };
                }
                Ok(Begin::Mismatch) => {
                    return failed(
                        Some(id),
                        Failure::new(
                            FailureCode::ReplayMismatch,
                            "this operation id was used before with a different body",
                        ),
                    );
                }
                Ok(Begin::Unverifiable {
                    expires_at,
                    watermark,
                }) => {
                    return failed(
                        Some(id),
                        Failure::new(
                            FailureCode::ReplayUnverifiable,
                            format!(
                                "this envelope expires at {expires_at}, not after {watermark}, the latest expiry of an operation this host's journal has already pruned: it may have run before and the host can no longer tell, so it does not run; sign a new envelope",
                            ),
                        ),
                    );
                }
                Ok(Begin::LostInCrash {
                    issued_at,
                    issued_at_bound,
                    expires_at_bound,
                }) => {
                    return failed(
                        Some(id),
                        Failure::new(
                            FailureCode::ReplayUnverifiable,
                            format!(
                                "this envelope was issued at {issued_at}, before this host's last crash, which may have lost the journal records of operations issued by {issued_at_bound} and expiring by {expires_at_bound}: it may have run before and the host can no longer tell, so it does not run; sign a new envelope",
                            ),
                        ),
                    );
                }
                Ok(Begin::InProgress) => {
                    return failed(
                        Some(id),
                        Failure::new(
                            FailureCode::OperationInProgress,
                            "another session is executing this operation id now",
                        ),
                    );
                }
                Ok(Begin::Run(h)) => Some(h),
            }
        };
        let handle = RefCell::new(handle);
        // When each step began, for the success line: where an operation's time went.
        let timeline = RefCell::new(String::new());
        let mut on_step = |step: Step| {
            {
                use std::fmt::Write as _;
                let mut t = timeline.borrow_mut();
                let sep = if t.is_empty() { "" } else { " " };
                let _ = write!(
                    t,
                    "{sep}{}@{:.1}",
                    step_name(step),
                    started.elapsed().as_secs_f64() * 1000.0
                );
            }
            if let Some(h) = handle.borrow_mut().as_mut()
                && let Err(e) = h.step(step)
            {
                tracing::warn!(operation_id = %id, "cannot record step {}: {e}", step_name(step));
            }
            progress(Progress {
                operation_id: id.clone(),
                step,
                elapsed_ms: u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
                detail: None,
            });
            crate::fault::point(&format!("{kind}/{}", step_name(step)));
        };
        let mut commit = || -> Result<(), Failure> {
            match handle.borrow_mut().as_mut() {
                Some(h) => h.commit().map_err(|e| {
                    journal_failure(e, "cannot record the operation in the journal: ")
                }),
                None => Ok(()),
            }
        };
        let mut ctx = Ctx::new(id.clone(), deadline, now, cancelled, &mut on_step);
        ctx.fence = env.fence;
        ctx.on_commit(&mut commit);
        let result = self.engine.execute(&env.operation, &mut ctx, &self.journal);
        let last_step = ctx.last_step();
        drop(ctx);
        let outcome = match result {
            Ok(result) => Outcome::Succeeded { result },
            Err(failure) => Outcome::Failed { failure },
        };
        if let Some(h) = handle.into_inner() {
            let after = outcome.failure().and(last_step);
            let committed = h.is_committed();
            if let Err(e) = h.finish(&outcome, after) {
                tracing::error!(operation_id = %id, "cannot record the outcome: {e}");
            }
            if (committed || self.journal.cheap_prune_due())
                && let Err(e) = self.journal.prune(now)
            {
                tracing::warn!(operation_id = %id, "cannot prune the journal: {e}");
            }
        }
        // Logged after the record and the prune, so that the time is everything the
        // operation cost before its answer.
        match outcome.failure() {
            None => {
                let elapsed = started.elapsed();
                tracing::info!(operation_id = %id, op = kind.as_str(), elapsed_ms = elapsed.as_millis() as u64, elapsed_us = elapsed.as_micros() as u64, steps = %timeline.borrow(), "operation succeeded")
            }
            Some(f) => {
                tracing::warn!(operation_id = %id, op = kind.as_str(), code = f.code.as_str(), "operation failed: {}", f.message)
            }
        }
        ResultMessage {
            operation_id: Some(id),
            outcome,
        }
    }
}

/// A journal write that failed: `NO_SPACE` when the file system is full (issue 26, N6),
/// `IO_FAILED` otherwise.
fn journal_failure(e: crate::fsutil::FsError, prefix: &str) -> Failure {
    let code = match &e {
        crate::fsutil::FsError::Io { source, .. } if crate::fsutil::is_no_space(source) => {
            FailureCode::NoSpace
        }
        _ => FailureCode::IoFailed,
    };
    Failure::new(code, format!("{prefix}{e}"))
}

fn failed(id: Option<clawfleet_protocol::OperationId>, failure: Failure) -> ResultMessage {
    ResultMessage {
        operation_id: id,
        outcome: Outcome::Failed { failure },
    }
}

/// Which coordinator login key a session authenticated with: `hostd enrol` writes it into
/// the key's forced command (`hostd serve --key <id>`), which the holder of the key cannot
/// change, so it names the key as sshd saw it. It is the key's SHA-256 fingerprint in URL-safe
/// base64 (`-` and `_` for `+` and `/`, no `SHA256:`), which is safe as a file name and in a
/// sudoers command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoginKeyId(String);

/// Why a `--key` value is not a login key id.
#[derive(Debug, Error)]
#[error(
    "the login key id {0:?} is not 1 to 64 characters of A-Z, a-z, 0-9, '-' and '_' (hostd enrol writes it into the forced command)"
)]
pub struct LoginKeyIdError(String);

impl LoginKeyId {
    pub fn new(id: &str) -> Result<Self, LoginKeyIdError> {
        let ok = !id.is_empty()
            && id.len() <= 64
            && id
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
        if ok {
            Ok(Self(id.to_owned()))
        } else {
            Err(LoginKeyIdError(id.chars().take(80).collect()))
        }
    }

    /// The id of a login key: its SHA-256 fingerprint, URL-safe.
    pub fn of(key: &clawfleet_protocol::ssh_key::PublicKey) -> Self {
        let fingerprint = clawfleet_protocol::signing::fingerprint(key).to_string();
        let body = fingerprint
            .strip_prefix("SHA256:")
            .unwrap_or(&fingerprint)
            .trim_end_matches('=');
        Self(
            body.chars()
                .map(|c| match c {
                    '+' => '-',
                    '/' => '_',
                    c => c,
                })
                .collect(),
        )
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The directory of this key's session slots under `sessions/`: `key-<id>`, or
    /// `unkeyed` for sessions started without `--key` (an enrolment that predates it, a
    /// login user through sudo, an operator's own `hostd serve`).
    pub fn slots_dir(key: Option<&Self>, sessions: &Path) -> std::path::PathBuf {
        match key {
            Some(k) => sessions.join(format!("key-{}", k.0)),
            None => sessions.join("unkeyed"),
        }
    }
}

/// One of a login key's `[limits] max_sessions` session slots, held (a kernel `flock` on
/// `sessions/<key>/<n>.lock`) for as long as the session lives; the kernel releases it
/// however the process ends. A stolen login key can therefore keep at most that many idle
/// root processes open, each only until its idle timeout, and never takes the slots of
/// another coordinator's key (issue 26, N12).
#[derive(Debug)]
pub struct SessionSlot {
    _file: std::fs::File,
}

/// Takes a free slot of `max` in `dir`; `None` when all are held.
pub fn take_slot(dir: &Path, max: u32) -> Result<Option<SessionSlot>, crate::fsutil::FsError> {
    take_slot_from(dir, max, 0)
}

/// [`take_slot`], trying the slots from `first` on (and then from 0): a caller that takes
/// many slots at once starts where it last stopped instead of trying every held one again.
pub fn take_slot_from(
    dir: &Path,
    max: u32,
    first: u32,
) -> Result<Option<SessionSlot>, crate::fsutil::FsError> {
    if let Some(parent) = dir.parent() {
        crate::fsutil::ensure_dir(parent, 0o700)?;
    }
    crate::fsutil::ensure_dir(dir, 0o700)?;
    let first = if max == 0 { 0 } else { first % max };
    for n in (first..max).chain(0..first) {
        let path = dir.join(format!("{n}.lock"));
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .open(&path)
            .map_err(crate::fsutil::io_err(&path))?;
        match file.try_lock() {
            Ok(()) => return Ok(Some(SessionSlot { _file: file })),
            Err(std::fs::TryLockError::WouldBlock) => continue,
            Err(std::fs::TryLockError::Error(e)) => return Err(crate::fsutil::io_err(&path)(e)),
        }
    }
    Ok(None)
}

/// How long a session refused for want of a slot waits for the envelope it answers.
const REFUSED_WAIT: Duration = Duration::from_secs(5);

enum Incoming {
    Frame(clawfleet_protocol::Frame),
    Broken(FrameError),
}

/// Serves one session until its input ends and every request read has been answered, or until
/// `closed` is set (by signal handlers, by the caller's output watcher, or by a failed write).
pub fn serve<R: Read + Send + 'static, W: Write>(
    responder: &Responder<'_>,
    input: R,
    output: W,
    closed: Arc<AtomicBool>,
) -> Result<(), SessionError> {
    serve_while(responder, input, output, closed, &|| false)
}

/// [`serve`], also ending the session between two operations once `stale` says the
/// configuration it was started with has changed on disk: sessions are long-lived (the
/// coordinator keeps them open), and an operator who edits hostd.toml expects the next
/// operation to use it. The coordinator replaces an ended session transparently.
pub fn serve_while<R: Read + Send + 'static, W: Write>(
    responder: &Responder<'_>,
    input: R,
    output: W,
    closed: Arc<AtomicBool>,
    stale: &dyn Fn() -> bool,
) -> Result<(), SessionError> {
    let served = serve_until_done(responder, input, output, closed, stale);
    // Run files of killed operations: a listing of the journal, done when nobody waits.
    if let Err(e) = responder.journal.sweep_run_files() {
        tracing::warn!("cannot sweep the journal's run files: {e}");
    }
    served
}

fn serve_until_done<R: Read + Send + 'static, W: Write>(
    responder: &Responder<'_>,
    input: R,
    output: W,
    closed: Arc<AtomicBool>,
    stale: &dyn Fn() -> bool,
) -> Result<(), SessionError> {
    let limits = Limits::default();
    let output = RefCell::new(output);
    let send = |message: &Message| -> Result<(), SessionError> {
        let frame = message.to_frame().map_err(|e| {
            SessionError::Write(FrameError::Io(std::io::Error::other(e.to_string())))
        })?;
        write_frame(&mut *output.borrow_mut(), &frame, limits.max_frame)
            .map_err(SessionError::Write)
    };
    send(&Message::Hello(Hello {
        hostd_version: env!("CARGO_PKG_VERSION").to_owned(),
        protocol_versions: responder.engine.config.protocol_versions.clone(),
        host_key: responder.engine.host_key.clone(),
    }))?;

    // End of input means "no more requests", not "session gone": queued envelopes still run.
    // A gone session is noticed through `closed` (signals, the output watcher, write errors).
    // Room for one frame only: the reader reads the next frame when the previous one has been
    // taken, so a client that floods frames and never reads the replies (hostd blocked writing)
    // holds hostd's memory to a few frames, not to everything it sent.
    let (tx, rx) = mpsc::sync_channel::<Incoming>(1);
    std::thread::spawn(move || {
        let mut input = input;
        loop {
            match read_frame(&mut input, limits.max_frame) {
                Ok(Some(frame)) => {
                    if tx.send(Incoming::Frame(frame)).is_err() {
                        break;
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    let _ = tx.send(Incoming::Broken(e));
                    break;
                }
            }
        }
    });

    let config = responder.engine.config;
    // Held until the session returns.
    let key = responder.login_key.as_ref();
    let key_name = key.map_or("unkeyed", |k| k.as_str());
    let _slot = match take_slot(
        &LoginKeyId::slots_dir(key, &responder.engine.layout.sessions_dir()),
        config.limits.max_sessions,
    ) {
        Ok(Some(slot)) => Some(slot),
        Ok(None) => {
            tracing::warn!(
                max_sessions = config.limits.max_sessions,
                login_key = key_name,
                "every session slot of this login key is taken; answering SESSION_LIMIT and ending the session"
            );
            let failure = Failure::new(
                FailureCode::SessionLimit,
                format!(
                    "this login key ({key_name}) already has {} hostd sessions open on this host ([limits] max_sessions, per key); retry later",
                    config.limits.max_sessions
                ),
            );
            // Answer the first envelope (its sender waits for a result), then end.
            if let Ok(Incoming::Frame(_)) = rx.recv_timeout(REFUSED_WAIT) {
                let _ = send(&Message::Result(failed(None, failure)));
            }
            return Ok(());
        }
        Err(e) => {
            // Not a reason to refuse work: the limit guards the host, the operations are
            // the job (and an unwritable state root fails them clearly anyway).
            tracing::warn!("cannot take a session slot: {e}");
            None
        }
    };
    let idle_limit = config.limits.session_idle_timeout;
    let mut last_frame = Instant::now();

    let cancelled = || closed.load(Ordering::SeqCst);
    loop {
        let incoming = match rx.recv_timeout(Duration::from_millis(200)) {
            Ok(i) => {
                last_frame = Instant::now();
                i
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {
                if cancelled() {
                    return Ok(());
                }
                if last_frame.elapsed() >= idle_limit {
                    tracing::info!(
                        idle_seconds = idle_limit.as_secs(),
                        "no frame within the idle timeout; ending the session"
                    );
                    return Ok(());
                }
                if stale() {
                    tracing::info!("the configuration changed; ending the session");
                    return Ok(());
                }
                continue;
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => return Ok(()),
        };
        let frame = match incoming {
            // Not run under a configuration that is no longer the operator's: unanswered, the
            // envelope is sent again on a new session (a read) or recovered with
            // operation-status, which finds it never ran (a change).
            Incoming::Frame(_) if stale() => {
                tracing::info!(
                    "the configuration changed; ending the session before this envelope"
                );
                return Ok(());
            }
            Incoming::Frame(f) => f,
            Incoming::Broken(e) => {
                let code = match e {
                    FrameError::TooLarge { .. } => FailureCode::InputTooLarge,
                    _ => FailureCode::InvalidInput,
                };
                let _ = send(&Message::Result(failed(
                    None,
                    Failure::new(code, e.to_string()),
                )));
                return Err(SessionError::Stream(e));
            }
        };
        let reply = match Message::from_frame(&frame, &limits) {
            Ok(Message::Envelope(signed)) => {
                let mut progress = |p: Progress| {
                    if send(&Message::Progress(p)).is_err() {
                        closed.store(true, Ordering::SeqCst);
                    }
                };
                responder.respond(&signed, &cancelled, &mut progress)
            }
            Ok(_) => failed(
                None,
                Failure::new(
                    FailureCode::InvalidInput,
                    "hostd accepts only envelope frames",
                ),
            ),
            Err(e) => {
                let failure = match e {
                    clawfleet_protocol::framing::MessageError::Decode(d) => d.to_failure(),
                    other => Failure::new(FailureCode::InvalidInput, other.to_string()),
                };
                failed(None, failure)
            }
        };
        if let Err(e) = send(&Message::Result(reply)) {
            // The peer is gone; the outcome is in the journal.
            tracing::info!("session output closed: {e}");
            return Ok(());
        }
        if stale() {
            tracing::info!("the configuration changed; ending the session");
            return Ok(());
        }
    }
}

/// Reads an envelope body and its armored signature for `hostd apply`. A file over the
/// session's limits is refused with `INPUT_TOO_LARGE`, as the same bytes in a frame would
/// be (read at most one byte past the limit, whatever its size says); one that cannot be read
/// is `INVALID_INPUT`, naming it.
pub fn read_envelope_files(body: &Path, signature: &Path) -> Result<SignedEnvelope, Failure> {
    let limits = Limits::default();
    let read = |p: &Path, what: &str, max: usize| -> Result<Vec<u8>, Failure> {
        let unreadable = |e: std::io::Error| {
            Failure::new(
                FailureCode::InvalidInput,
                format!("cannot read the {what} {}: {e}", p.display()),
            )
        };
        let file = std::fs::File::open(p).map_err(unreadable)?;
        let mut bytes = Vec::new();
        file.take(max as u64 + 1)
            .read_to_end(&mut bytes)
            .map_err(unreadable)?;
        if bytes.len() > max {
            return Err(Failure::new(
                FailureCode::InputTooLarge,
                format!(
                    "the {what} {} is larger than {max} bytes, the most an envelope may be",
                    p.display()
                ),
            ));
        }
        Ok(bytes)
    };
    let body = read(body, "envelope", limits.max_envelope)?;
    let signature = String::from_utf8(read(signature, "signature", limits.max_signature)?)
        .map_err(|_| {
            Failure::new(
                FailureCode::InvalidInput,
                format!("the signature {} is not text", signature.display()),
            )
        })?;
    Ok(SignedEnvelope { body, signature })
}
