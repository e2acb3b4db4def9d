//! One call's session channel: `exec hostd serve`, read the hello, send one envelope frame,
//! forward progress, read exactly one result.

use std::sync::Arc;
use std::time::{Duration, Instant};

use clawfleet_protocol::framing::FrameDecoder;
use clawfleet_protocol::result::{Hello, Progress, ResultMessage};
use clawfleet_protocol::{
    Failure, FailureCode, Limits, Message, OperationId, PROTOCOL_VERSION, SignedEnvelope,
};
use russh::client::Msg;
use russh::{Channel, ChannelMsg};

use super::connection::{Connection, HostEntry};
use super::transport;
use crate::backend::CallError;

/// The command asked for; the forced command runs `hostd serve` whatever is asked.
pub(crate) const REMOTE_COMMAND: &str = "hostd serve";

/// How much of hostd's stderr is kept for error messages.
const STDERR_KEEP: usize = 2048;

/// A session channel with hostd's hello read and checked.
pub(crate) struct OpenSession {
    channel: Channel<Msg>,
    decoder: FrameDecoder,
    stderr: Vec<u8>,
    pub(crate) hello: Hello,
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

fn keep_stderr(stderr: &mut Vec<u8>, data: &[u8]) {
    let room = STDERR_KEEP.saturating_sub(stderr.len());
    stderr.extend_from_slice(&data[..data.len().min(room)]);
}

/// Opens a channel, runs hostd and waits for its hello, within `limit`.
pub(crate) async fn open(
    entry: &HostEntry,
    conn: &Arc<Connection>,
    limit: Duration,
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
    let mut session = OpenSession {
        channel,
        decoder: FrameDecoder::new(Limits::default().max_frame),
        stderr: Vec::new(),
        hello: Hello {
            hostd_version: String::new(),
            protocol_versions: Vec::new(),
            host_key: match entry.fingerprint() {
                Some(f) => f.clone(),
                None => {
                    return Err(OpenError::Refused(
                        entry.mismatch("(not checked)".to_owned()),
                    ));
                }
            },
        },
    };
    let hello = tokio::time::timeout(limit, session.read_hello(entry, conn)).await;
    let hello = match hello {
        Err(_) => {
            let _ = session.channel.close().await;
            return Err(OpenError::Refused(transport(
                host,
                format!(
                    "hostd on {label} sent no hello within {} ms{}",
                    limit.as_millis(),
                    stderr_text(&session.stderr)
                ),
            )));
        }
        Ok(Err(e)) => {
            let _ = session.channel.close().await;
            return Err(e);
        }
        Ok(Ok(h)) => h,
    };
    tracing::trace!(
        elapsed_us = started.elapsed().as_micros() as u64,
        "hello read"
    );
    // The hello names the host key hostd is configured with; it must be the pinned one.
    if Some(&hello.host_key) != entry.fingerprint() {
        let _ = session.channel.close().await;
        return Err(OpenError::Refused(
            entry.mismatch(format!("{} (in hostd's hello)", hello.host_key)),
        ));
    }
    if !hello.protocol_versions.contains(&PROTOCOL_VERSION) {
        let _ = session.channel.close().await;
        return Err(OpenError::Refused(CallError::Failed(Failure::new(
            FailureCode::UnsupportedVersion,
            format!(
                "hostd {} on {} speaks protocol versions {:?}; this coordinator speaks {}",
                hello.hostd_version, entry.target.name, hello.protocol_versions, PROTOCOL_VERSION
            ),
        ))));
    }
    session.hello = hello;
    Ok(session)
}

impl OpenSession {
    async fn read_hello(
        &mut self,
        entry: &HostEntry,
        conn: &Arc<Connection>,
    ) -> Result<Hello, OpenError> {
        let host = entry.target.name.as_str();
        let label = entry.label();
        self.channel.exec(true, REMOTE_COMMAND).await.map_err(|e| {
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
            match self.channel.wait().await {
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

    /// Sends the envelope and reads frames until its result. `Err(Lost)` means the envelope
    /// may have reached hostd but no result came back.
    pub(crate) async fn exchange(
        mut self,
        signed: &SignedEnvelope,
        id: &OperationId,
        until: Instant,
        on_progress: &(dyn Fn(&Progress) + Send + Sync),
    ) -> Result<ResultMessage, Lost> {
        let payload = match Message::Envelope(signed.clone())
            .to_frame()
            .map_err(|e| e.to_string())
            .and_then(|f| {
                f.encode(Limits::default().max_frame)
                    .map_err(|e| e.to_string())
            }) {
            Ok(p) => p,
            Err(e) => {
                let _ = self.channel.close().await;
                return Err(Lost {
                    reason: format!("the envelope cannot be framed: {e}"),
                    timed_out: false,
                    until,
                });
            }
        };
        let deadline = tokio::time::Instant::from_std(until);
        let result = tokio::time::timeout_at(
            deadline,
            self.send_and_read(&payload, id, until, on_progress),
        )
        .await;
        let _ = self.channel.close().await;
        match result {
            Ok(r) => r,
            Err(_) => Err(Lost {
                reason: format!(
                    "no result within the transport timeout{}",
                    stderr_text(&self.stderr)
                ),
                timed_out: true,
                until,
            }),
        }
    }

    async fn send_and_read(
        &mut self,
        payload: &[u8],
        id: &OperationId,
        until: Instant,
        on_progress: &(dyn Fn(&Progress) + Send + Sync),
    ) -> Result<ResultMessage, Lost> {
        let lost = |reason: String| Lost {
            reason,
            timed_out: false,
            until,
        };
        self.channel
            .data(payload)
            .await
            .map_err(|e| lost(format!("sending the envelope failed: {e}")))?;
        // No more requests on this session: hostd answers this one and exits.
        let _ = self.channel.eof().await;
        let mut exit = None;
        let mut eof = false;
        loop {
            while let Some(frame) = self
                .decoder
                .next_frame()
                .map_err(|e| lost(format!("hostd's output is not a frame stream: {e}")))?
            {
                match Message::from_frame(&frame, &Limits::default()) {
                    Ok(Message::Progress(p)) => {
                        if &p.operation_id == id {
                            on_progress(&p);
                        } else {
                            tracing::warn!(operation_id = %id, other = %p.operation_id, "progress for another operation ignored");
                        }
                    }
                    Ok(Message::Result(r)) => return Ok(r),
                    Ok(other) => {
                        tracing::warn!(operation_id = %id, "unexpected {} frame ignored", kind_name(&other));
                    }
                    Err(e) => return Err(lost(format!("hostd sent an unreadable frame: {e}"))),
                }
            }
            match self.channel.wait().await {
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
                    return Err(lost(format!(
                        "{how} before the result{}",
                        stderr_text(&self.stderr)
                    )));
                }
                Some(_) => {}
            }
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
