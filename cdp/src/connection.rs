//! The DevTools protocol over `--remote-debugging-pipe`: JSON messages separated by NUL bytes,
//! written to the browser's fd 3 and read from its fd 4. No WebSocket, no port to find or
//! to leave open: the pipe dies with the process.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{ChildStdin, ChildStdout};
use tokio::sync::{Notify, oneshot};

use crate::CdpError;

/// One event the browser sent, in the order it arrived.
#[derive(Debug, Clone)]
pub struct Event {
    /// The DevTools method, e.g. `Network.requestWillBeSent`.
    pub method: String,
    /// Its parameters, as sent.
    pub params: Value,
}

type Reply = Result<Value, String>;

#[derive(Default)]
struct Shared {
    pending: HashMap<u64, oneshot::Sender<Reply>>,
    /// Events per session id (`""` for the browser's own).
    events: HashMap<String, Vec<Event>>,
    closed: Option<String>,
}

/// The pipe to one browser process, shared by the browser and its pages.
pub(crate) struct Connection {
    writer: tokio::sync::Mutex<ChildStdin>,
    next_id: AtomicU64,
    shared: Arc<Mutex<Shared>>,
    notify: Arc<Notify>,
    log: PathBuf,
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection")
            .field("log", &self.log)
            .finish_non_exhaustive()
    }
}

fn lock(shared: &Mutex<Shared>) -> MutexGuard<'_, Shared> {
    // A panic elsewhere must not hide the browser's messages from the test that waits on them.
    shared.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Connection {
    /// Starts the reader task; `log` is the browser's stderr, quoted when the pipe closes.
    pub(crate) fn start(stdin: ChildStdin, stdout: ChildStdout, log: PathBuf) -> Arc<Connection> {
        let shared = Arc::new(Mutex::new(Shared::default()));
        let notify = Arc::new(Notify::new());
        tokio::spawn(read_loop(stdout, shared.clone(), notify.clone()));
        Arc::new(Connection {
            writer: tokio::sync::Mutex::new(stdin),
            next_id: AtomicU64::new(1),
            shared,
            notify,
            log,
        })
    }

    fn closed_error(&self, reason: String) -> CdpError {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let tail: Vec<&str> = text.lines().rev().take(5).collect();
        let log_tail = tail.into_iter().rev().collect::<Vec<_>>().join(" | ");
        CdpError::Closed { reason, log_tail }
    }

    /// Sends one command (to a page's session, or to the browser when `session` is `None`)
    /// and waits for its answer.
    pub(crate) async fn call(
        &self,
        session: Option<&str>,
        method: &str,
        params: Value,
        timeout: Duration,
    ) -> Result<Value, CdpError> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        {
            let mut shared = lock(&self.shared);
            if let Some(reason) = &shared.closed {
                let reason = reason.clone();
                drop(shared);
                return Err(self.closed_error(reason));
            }
            shared.pending.insert(id, tx);
        }
        let mut message = json!({ "id": id, "method": method, "params": params });
        if let Some(session) = session {
            message["sessionId"] = Value::String(session.to_owned());
        }
        let mut bytes = serde_json::to_vec(&message).map_err(|e| CdpError::BadMessage {
            detail: format!("the parameters of {method} do not serialize: {e}"),
        })?;
        bytes.push(0);
        let written = {
            let mut writer = self.writer.lock().await;
            match writer.write_all(&bytes).await {
                Ok(()) => writer.flush().await,
                Err(e) => Err(e),
            }
        };
        if let Err(e) = written {
            lock(&self.shared).pending.remove(&id);
            return Err(self.closed_error(format!("writing {method}: {e}")));
        }
        match tokio::time::timeout(timeout, rx).await {
            Err(_) => {
                lock(&self.shared).pending.remove(&id);
                Err(CdpError::Timeout {
                    what: format!("the answer to {method}"),
                    millis: timeout.as_millis(),
                })
            }
            Ok(Err(_)) => {
                let reason = lock(&self.shared)
                    .closed
                    .clone()
                    .unwrap_or_else(|| "no answer".into());
                Err(self.closed_error(reason))
            }
            Ok(Ok(Err(message))) => Err(CdpError::Protocol {
                method: method.to_owned(),
                message,
            }),
            Ok(Ok(Ok(result))) => Ok(result),
        }
    }

    /// Every event recorded for `session` so far.
    pub(crate) fn events(&self, session: &str) -> Vec<Event> {
        lock(&self.shared)
            .events
            .get(session)
            .cloned()
            .unwrap_or_default()
    }

    /// How many events `session` has recorded: a mark for [`Connection::wait_event`].
    pub(crate) fn mark(&self, session: &str) -> usize {
        lock(&self.shared).events.get(session).map_or(0, Vec::len)
    }

    /// Waits for the first event of `session` at or after `from` that `matches`.
    pub(crate) async fn wait_event(
        &self,
        session: &str,
        from: usize,
        what: &str,
        matches: impl Fn(&Event) -> bool,
        timeout: Duration,
    ) -> Result<Event, CdpError> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let notified = self.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let shared = lock(&self.shared);
                if let Some(found) = shared
                    .events
                    .get(session)
                    .and_then(|events| events.get(from..))
                    .and_then(|events| events.iter().find(|e| matches(e)))
                {
                    return Ok(found.clone());
                }
                if let Some(reason) = &shared.closed {
                    let reason = reason.clone();
                    drop(shared);
                    return Err(self.closed_error(reason));
                }
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return Err(CdpError::Timeout {
                    what: what.to_owned(),
                    millis: timeout.as_millis(),
                });
            }
        }
    }
}

async fn read_loop(stdout: ChildStdout, shared: Arc<Mutex<Shared>>, notify: Arc<Notify>) {
    let mut reader = BufReader::new(stdout);
    let mut buffer = Vec::new();
    let reason = loop {
        buffer.clear();
        match reader.read_until(0, &mut buffer).await {
            Ok(0) => break "the browser closed the pipe".to_owned(),
            Ok(_) => {}
            Err(e) => break format!("reading the pipe: {e}"),
        }
        if buffer.last() == Some(&0) {
            buffer.pop();
        }
        let message: Value = match serde_json::from_slice(&buffer) {
            Ok(message) => message,
            Err(e) => break format!("a message that is not JSON ({e})"),
        };
        dispatch(&shared, message);
        notify.notify_waiters();
    };
    let mut state = lock(&shared);
    state.closed = Some(reason.clone());
    for (_, tx) in state.pending.drain() {
        // The receiver may have timed out already; nothing else waits for this answer.
        tx.send(Err(format!("closed: {reason}"))).ok();
    }
    drop(state);
    notify.notify_waiters();
}

fn dispatch(shared: &Mutex<Shared>, message: Value) {
    let mut state = lock(shared);
    if let Some(id) = message.get("id").and_then(Value::as_u64) {
        if let Some(tx) = state.pending.remove(&id) {
            let reply = match message.get("error") {
                Some(error) => Err(error
                    .get("message")
                    .and_then(Value::as_str)
                    .map_or_else(|| error.to_string(), str::to_owned)),
                None => Ok(message.get("result").cloned().unwrap_or(Value::Null)),
            };
            // The caller may have given up (timeout); the answer is then of no use.
            tx.send(reply).ok();
        }
        return;
    }
    let Some(method) = message.get("method").and_then(Value::as_str) else {
        return;
    };
    let session = message
        .get("sessionId")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let event = Event {
        method: method.to_owned(),
        params: message.get("params").cloned().unwrap_or(Value::Null),
    };
    state
        .events
        .entry(session.to_owned())
        .or_default()
        .push(event);
}
