//! One `hostd serve` session: a session channel that runs hostd, whose hello is read once, and
//! over which any number of envelopes are exchanged one at a time (hostd reads envelopes until
//! its input ends: hostd/src/session.rs). The pool (pool.rs) keeps idle sessions open.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use clawfleet_protocol::framing::FrameDecoder;
use clawfleet_protocol::result::{Hello, Progress, ResultMessage};
use clawfleet_protocol::{Failure, FailureCode, Limits, Message, OperationId, SUPPORTED_VERSIONS};
use russh::client::Msg;
use russh::{Channel, ChannelMsg};

use super::connection::{Connection, HostEntry};
use super::transport;
use crate::backend::CallError;

/// The command asked for; the forced command runs `hostd serve` whatever is asked.
pub(crate) const REMOTE_COMMAND: &str = "hostd serve";

/// How much of hostd's stderr is kept for error messages (the latest bytes).
const STDERR_KEEP: usize = 2048;

/// A session channel with hostd's hello read and checked. Dropping it closes the channel
/// (russh sends no CHANNEL_CLOSE for a dropped channel, which would leak one of sshd's
/// `MaxSessions` slots).
pub(crate) struct OpenSession {
    channel: Option<Channel<Msg>>,
    decoder: FrameDecoder,
    stderr: Vec<u8>,
    pub(crate) hello: Hello,
    /// The connection the channel lives on.
    pub(crate) connection: Arc<Connection>,
    pub(crate) opened_at: Instant,
    pub(crate) idle_since: Instant,
    /// Envelopes answered on this session so far.
    pub(crate) answered: u64,
    /// Sessions open on this host (idle or in use); this one counts until dropped.
    open: Arc<AtomicUsize>,
}

impl std::fmt::Debug for OpenSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpenSession")
            .field("connection", &self.connection.id)
            .field("answered", &self.answered)
            .finish_non_exhaustive()
    }
}

impl Drop for OpenSession {
    fn drop(&mut self) {
        self.open.fetch_sub(1, Ordering::Relaxed);
        if let Some(channel) = self.channel.take()
            && let Ok(rt) = tokio::runtime::Handle::try_current()
        {
            rt.spawn(async move {
                // End of input tells hostd that no more envelopes come; it then exits.
                let _ = channel.eof().await;
                let _ = channel.close().await;
            });
        }
    }
}

/// Why a session could not be opened.
#[derive(Debug)]
pub(crate) enum OpenError {
    /// The connection itself looks broken: worth one more try on a fresh connection.
    Connection(CallError),
    /// The host answered, but not as hostd should (or with the wrong identity).
    Refused(CallError),
}

/// Why no result arrived for an envelope that was (or may have been) sent.
#[derive(Debug, Clone)]
pub(crate) struct Lost {
    pub(crate) reason: String,
    pub(crate) timed_out: bool,
    /// The transport deadline of the call (envelope deadline + grace after sending).
    pub(crate) until: Instant,
    /// hostd sent something for this envelope (progress), so it certainly arrived.
    pub(crate) answered_partly: bool,
    /// The session had answered earlier envelopes: it may have died before this one was sent.
    pub(crate) reused: bool,
}

impl Lost {
    /// Whether the same envelope may be sent again once the host confirms it has no record
    /// of it: the session came from the pool and hostd never acknowledged this envelope, so
    /// it may have been written into a session that was already dead. The same operation id
    /// makes a second delivery safe (hostd's journal runs an id at most once).
    pub(crate) fn may_resend(&self) -> bool {
        self.reused && !self.answered_partly
    }
}

/// The last line hostd wrote to stderr (its closing error, if any), without terminal escapes
/// or control characters, for error messages. On hosts with journald hostd logs there, and
/// stderr holds only fatal errors.
fn stderr_text(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    let mut clean = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            // CSI: ESC [ parameters final-byte
            if chars.peek() == Some(&'[') {
                chars.next();
                for c in chars.by_ref() {
                    if ('@'..='~').contains(&c) {
                        break;
                    }
                }
            }
            continue;
        }
        clean.push(c);
    }
    let last = clean
        .lines()
        .map(str::trim)
        .rfind(|l| !l.is_empty())
        .unwrap_or("");
    let line = clawfleet_protocol::text::clean(last, 300);
    if line.is_empty() {
        String::new()
    } else {
        format!("; hostd's last words: {line}")
    }
}

/// Keeps the latest [`STDERR_KEEP`] bytes: a long-lived session's last words are at the end.
fn keep_stderr(stderr: &mut Vec<u8>, data: &[u8]) {
    stderr.extend_from_slice(data);
    if stderr.len() > STDERR_KEEP {
        let cut = stderr.len() - STDERR_KEEP;
        stderr.drain(..cut);
    }
}

/// Polls a future once without waiting.
fn poll_now<F: Future>(f: F) -> Option<F::Output> {
    let mut f = std::pin::pin!(f);
    match f.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(v) => Some(v),
        Poll::Pending => None,
    }
}

/// Opens a channel, runs hostd and waits for its hello, within `limit`. `open` counts the
/// host's open sessions.
pub(crate) async fn open(
    entry: &HostEntry,
    conn: &Arc<Connection>,
    limit: Duration,
    open: &Arc<AtomicUsize>,
) -> Result<OpenSession, OpenError> {
    let host = entry.target.name.as_str();
    let label = entry.label();
    let started = Instant::now();
    let channel = match tokio::time::timeout(limit, conn.handle.channel_open_session()).await {
        Err(_) => {
            return Err(OpenError::Connection(transport(
                host,
                format!(
                    "no session channel on the SSH connection to {label} within {} ms",
                    limit.as_millis()
                ),
            )));
        }
        Ok(Err(e)) => {
            let err = transport(
                host,
                format!("cannot open a session channel to {label}: {e}"),
            );
            return Err(
                if conn.is_closed() || !matches!(e, russh::Error::ChannelOpenFailure(_)) {
                    OpenError::Connection(err)
                } else {
                    OpenError::Refused(err)
                },
            );
        }
        Ok(Ok(c)) => c,
    };
    tracing::trace!(
        elapsed_us = started.elapsed().as_micros() as u64,
        "channel open"
    );
    let Some(pinned) = entry.fingerprint().cloned() else {
        let _ = channel.close().await;
        return Err(OpenError::Refused(
            entry.mismatch("(not checked)".to_owned()),
        ));
    };
    open.fetch_add(1, Ordering::Relaxed);
    let now = Instant::now();
    let mut session = OpenSession {
        channel: Some(channel),
        decoder: FrameDecoder::new(Limits::default().max_frame),
        stderr: Vec::new(),
        hello: Hello {
            hostd_version: String::new(),
            protocol_versions: Vec::new(),
            host_key: pinned,
        },
        connection: conn.clone(),
        opened_at: now,
        idle_since: now,
        answered: 0,
        open: open.clone(),
    };
    let hello = match tokio::time::timeout(limit, session.read_hello(entry, conn)).await {
        Err(_) => {
            return Err(OpenError::Refused(transport(
                host,
                format!(
                    "hostd on {label} sent no hello within {} ms{}",
                    limit.as_millis(),
                    stderr_text(&session.stderr)
                ),
            )));
        }
        Ok(Err(e)) => return Err(e),
        Ok(Ok(h)) => h,
    };
    tracing::trace!(
        elapsed_us = started.elapsed().as_micros() as u64,
        "hello read"
    );
    // The hello names the host key hostd is configured with; it must be the pinned one.
    if Some(&hello.host_key) != entry.fingerprint() {
        return Err(OpenError::Refused(
            entry.mismatch(format!("{} (in hostd's hello)", hello.host_key)),
        ));
    }
    if !hello
        .protocol_versions
        .iter()
        .any(|v| SUPPORTED_VERSIONS.contains(v))
    {
        return Err(OpenError::Refused(CallError::Failed(Failure::new(
            FailureCode::UnsupportedVersion,
            format!(
                "hostd {} on {} speaks protocol versions {:?}; this coordinator speaks {:?}",
                hello.hostd_version, entry.target.name, hello.protocol_versions, SUPPORTED_VERSIONS
            ),
        ))));
    }
    entry.set_versions(&hello.protocol_versions);
    session.hello = hello;
    Ok(session)
}

impl OpenSession {
    fn channel(&mut self) -> Result<&mut Channel<Msg>, String> {
        self.channel
            .as_mut()
            .ok_or_else(|| "the session is closed".to_owned())
    }

    async fn read_hello(
        &mut self,
        entry: &HostEntry,
        conn: &Arc<Connection>,
    ) -> Result<Hello, OpenError> {
        let host = entry.target.name.as_str();
        let label = entry.label();
        let gone = |m: String| OpenError::Connection(transport(host, m));
        let channel = self.channel().map_err(gone)?;
        channel.exec(true, REMOTE_COMMAND).await.map_err(|e| {
            OpenError::Connection(transport(host, format!("cannot run hostd on {label}: {e}")))
        })?;
        let mut exit = None;
        loop {
            if let Some(frame) = self.decoder.next_frame().map_err(|e| {
                OpenError::Refused(transport(
                    host,
                    format!("{label} does not speak the clawfleet protocol: {e}"),
                ))
            })? {
                return match Message::from_frame(&frame, &Limits::default()) {
                    Ok(Message::Hello(h)) => Ok(h),
                    Ok(other) => Err(OpenError::Refused(transport(
                        host,
                        format!(
                            "hostd on {label} sent {} before its hello",
                            kind_name(&other)
                        ),
                    ))),
                    Err(e) => Err(OpenError::Refused(transport(
                        host,
                        format!("hostd on {label} sent an unreadable hello: {e}"),
                    ))),
                };
            }
            let msg = self.channel().map_err(gone)?.wait().await;
            match msg {
                Some(ChannelMsg::Data { data }) => {
                    tracing::trace!(bytes = data.len(), "data before hello");
                    self.decoder.push(&data)
                }
                Some(ChannelMsg::ExtendedData { data, .. }) => keep_stderr(&mut self.stderr, &data),
                Some(ChannelMsg::Success) => tracing::trace!("exec accepted"),
                Some(ChannelMsg::Failure) => {
                    return Err(OpenError::Refused(transport(
                        host,
                        format!("sshd on {label} refused to run the command"),
                    )));
                }
                Some(ChannelMsg::ExitStatus { exit_status }) => {
                    exit = Some(exit_status);
                }
                Some(ChannelMsg::Close) | None => {
                    let how = match exit {
                        Some(status) => format!("hostd on {label} exited with status {status}"),
                        None => format!("the session to {label} ended"),
                    };
                    let err = transport(
                        host,
                        format!("{how} before its hello{}", stderr_text(&self.stderr)),
                    );
                    return Err(if conn.is_closed() {
                        OpenError::Connection(err)
                    } else {
                        OpenError::Refused(err)
                    });
                }
                Some(_) => {}
            }
        }
    }

    /// Whether an idle session can take another envelope: its connection is open and
    /// nothing but stderr arrived while it waited (hostd exiting, the channel closing or
    /// stray output all end it). Does not wait.
    pub(crate) fn still_usable(&mut self) -> Result<(), String> {
        if self.connection.is_closed() {
            return Err("its SSH connection closed".to_owned());
        }
        loop {
            let channel = self.channel()?;
            match poll_now(channel.wait()) {
                None => return Ok(()),
                Some(Some(ChannelMsg::ExtendedData { data, .. })) => {
                    keep_stderr(&mut self.stderr, &data)
                }
                Some(Some(
                    ChannelMsg::WindowAdjusted { .. }
                    | ChannelMsg::Success
                    | ChannelMsg::XonXoff { .. },
                )) => {}
                Some(Some(ChannelMsg::Data { data })) => {
                    return Err(format!("hostd sent {} bytes while idle", data.len()));
                }
                Some(Some(ChannelMsg::ExitStatus { exit_status })) => {
                    return Err(format!(
                        "hostd exited with status {exit_status}{}",
                        stderr_text(&self.stderr)
                    ));
                }
                Some(Some(ChannelMsg::ExitSignal { signal_name, .. })) => {
                    return Err(format!("hostd was killed by signal {signal_name:?}"));
                }
                Some(Some(ChannelMsg::Eof)) => return Err("hostd closed its output".to_owned()),
                Some(Some(ChannelMsg::Close) | None) => {
                    return Err("the channel closed".to_owned());
                }
                Some(Some(other)) => {
                    return Err(format!("unexpected {other:?} on an idle session"));
                }
            }
        }
    }

    /// Sends one framed envelope and reads frames until its result, within `until`. On
    /// `Ok` the session may take the next envelope (the caller checks [`Self::is_clean`]);
    /// on `Err(Lost)` the envelope may have reached hostd but no result came back, and the
    /// session must be dropped.
    pub(crate) async fn exchange(
        &mut self,
        payload: &[u8],
        id: &OperationId,
        until: Instant,
        on_progress: &(dyn Fn(&Progress) + Send + Sync),
    ) -> Result<ResultMessage, Lost> {
        let reused = self.answered > 0;
        let mut answered_partly = false;
        let deadline = tokio::time::Instant::from_std(until);
        let result = tokio::time::timeout_at(
            deadline,
            self.send_and_read(payload, id, on_progress, &mut answered_partly),
        )
        .await;
        let lost = |reason: String, timed_out: bool, answered_partly: bool| Lost {
            reason,
            timed_out,
            until,
            answered_partly,
            reused,
        };
        match result {
            Ok(Ok(r)) => {
                self.answered += 1;
                self.idle_since = Instant::now();
                Ok(r)
            }
            Ok(Err(reason)) => Err(lost(reason, false, answered_partly)),
            Err(_) => Err(lost(
                format!(
                    "no result within the transport timeout{}",
                    stderr_text(&self.stderr)
                ),
                true,
                answered_partly,
            )),
        }
    }

    /// Whether nothing is left over after a result (a clean session goes back to the pool).
    pub(crate) fn is_clean(&self) -> bool {
        self.decoder.pending() == 0
    }

    async fn send_and_read(
        &mut self,
        payload: &[u8],
        id: &OperationId,
        on_progress: &(dyn Fn(&Progress) + Send + Sync),
        answered_partly: &mut bool,
    ) -> Result<ResultMessage, String> {
        self.channel()?
            .data(payload)
            .await
            .map_err(|e| format!("sending the envelope failed: {e}"))?;
        let mut exit = None;
        let mut eof = false;
        loop {
            while let Some(frame) = self
                .decoder
                .next_frame()
                .map_err(|e| format!("hostd's output is not a frame stream: {e}"))?
            {
                match Message::from_frame(&frame, &Limits::default()) {
                    Ok(Message::Progress(p)) => {
                        if &p.operation_id == id {
                            *answered_partly = true;
                            on_progress(&p);
                        } else {
                            tracing::warn!(operation_id = %id, other = %p.operation_id, "progress for another operation ignored");
                        }
                    }
                    Ok(Message::Result(r)) => return Ok(r),
                    Ok(other) => {
                        tracing::warn!(operation_id = %id, "unexpected {} frame ignored", kind_name(&other));
                    }
                    Err(e) => return Err(format!("hostd sent an unreadable frame: {e}")),
                }
            }
            let msg = self.channel()?.wait().await;
            match msg {
                Some(ChannelMsg::Data { data }) => self.decoder.push(&data),
                Some(ChannelMsg::ExtendedData { data, .. }) => keep_stderr(&mut self.stderr, &data),
                // sshd may report the exit before it forwards the last output: keep
                // reading until the channel ends.
                Some(ChannelMsg::ExitStatus { exit_status }) => {
                    exit = Some(format!("exit status {exit_status}"))
                }
                Some(ChannelMsg::ExitSignal { signal_name, .. }) => {
                    exit = Some(format!("signal {signal_name:?}"))
                }
                Some(ChannelMsg::Eof) => eof = true,
                Some(ChannelMsg::Close) | None => {
                    let how = match (&exit, eof) {
                        (Some(e), _) => format!("hostd ended ({e})"),
                        (None, true) => "hostd closed its output".to_owned(),
                        (None, false) => "the session ended".to_owned(),
                    };
                    return Err(format!(
                        "{how} before the result{}",
                        stderr_text(&self.stderr)
                    ));
                }
                Some(_) => {}
            }
        }
    }

    /// Ends the session now: end of input (hostd exits after the envelope in progress, if
    /// any), then the channel is closed.
    pub(crate) async fn close(mut self) {
        if let Some(channel) = self.channel.take() {
            let _ = channel.eof().await;
            let _ = channel.close().await;
        }
    }
}

fn kind_name(m: &Message) -> &'static str {
    match m {
        Message::Hello(_) => "a hello",
        Message::Envelope(_) => "an envelope",
        Message::Result(_) => "a result",
        Message::Progress(_) => "a progress",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stderr_keeps_the_latest_bytes() {
        let mut kept = Vec::new();
        keep_stderr(&mut kept, &vec![b'a'; STDERR_KEEP]);
        keep_stderr(&mut kept, b"\nlast words\n");
        assert_eq!(kept.len(), STDERR_KEEP);
        assert!(
            stderr_text(&kept).ends_with("last words"),
            "{}",
            stderr_text(&kept)
        );
    }
}
