//! The `hostd serve` sessions kept open per host, so an operation costs one exchange of frames
//! rather than a new channel, a new hostd process (through the login shell) and hostd's set-up
//! (its D-Bus connection among it).
//!
//! - At most [`SshSettings::max_sessions_per_host`] sessions exist per host, idle or in use: a
//!   call holds one permit of [`SessionPool::limit`] from before it takes a session until after
//!   it gave it back (or dropped it), recovery included, and takes an idle session before it
//!   opens a new one.
//! - The most recently used idle session is taken first, so under light load the others stay
//!   idle and close after [`SshSettings::session_idle_timeout`]. A session older than
//!   [`SshSettings::session_max_age`] is not reused, so changes to hostd's configuration, its
//!   allowed signers and its binary reach every session within that time.
//! - An idle session whose hostd exited or whose channel or connection closed is dropped when
//!   found and replaced by a new one.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use tokio::sync::Semaphore;

use super::session::OpenSession;
use super::{SshSettings, Stats};

/// One host's sessions.
#[derive(Debug)]
pub(crate) struct SessionPool {
    /// Calls working on the host at once, each with at most one session.
    pub(crate) limit: Arc<Semaphore>,
    /// Sessions open now, idle or in use (each session counts itself until dropped).
    pub(crate) open: Arc<AtomicUsize>,
    /// The most sessions open at once.
    pub(crate) peak: AtomicUsize,
    idle: Mutex<Idle>,
    idle_timeout: Duration,
    max_age: Duration,
}

#[derive(Debug, Default)]
struct Idle {
    sessions: Vec<OpenSession>,
    /// Whether a task is closing the sessions that idle too long.
    reaper: bool,
}

impl SessionPool {
    pub(crate) fn new(settings: &SshSettings) -> Self {
        Self {
            limit: Arc::new(Semaphore::new(settings.max_sessions_per_host.max(1))),
            open: Arc::new(AtomicUsize::new(0)),
            peak: AtomicUsize::new(0),
            idle: Mutex::new(Idle::default()),
            idle_timeout: settings.session_idle_timeout,
            max_age: settings.session_max_age,
        }
    }

    /// Records a newly opened session in the peak count.
    pub(crate) fn opened(&self) {
        self.peak
            .fetch_max(self.open.load(Ordering::Relaxed), Ordering::Relaxed);
    }

    /// Why a session must not take another envelope, if it must not.
    fn expired(&self, s: &OpenSession, now: Instant) -> Option<&'static str> {
        if now.saturating_duration_since(s.idle_since) >= self.idle_timeout {
            Some("idle timeout")
        } else if now.saturating_duration_since(s.opened_at) >= self.max_age {
            Some("maximum age")
        } else {
            None
        }
    }

    /// The most recently used idle session that can take an envelope; the expired and dead
    /// ones found on the way are closed.
    pub(crate) fn take(&self, stats: &Stats) -> Option<OpenSession> {
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        while let Some(mut s) = idle.sessions.pop() {
            if let Some(why) = self.expired(&s, Instant::now()) {
                tracing::debug!(connection = s.connection.id, "closing a session ({why})");
                stats.sessions_retired.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            match s.still_usable() {
                Ok(()) => return Some(s),
                Err(why) => {
                    tracing::info!(
                        connection = s.connection.id,
                        "an idle hostd session ended ({why}); it will be replaced"
                    );
                    stats.sessions_replaced.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        None
    }

    /// Gives a session back after a complete exchange; it is closed instead if something
    /// was left over or it reached its maximum age.
    pub(crate) fn put(self: &Arc<Self>, s: OpenSession, stats: &Arc<Stats>) {
        if !s.is_clean() {
            tracing::warn!(
                connection = s.connection.id,
                "hostd sent more than its result; closing the session"
            );
            return;
        }
        if self.expired(&s, Instant::now()).is_some() {
            stats.sessions_retired.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        idle.sessions.push(s);
        if !idle.reaper
            && let Ok(rt) = tokio::runtime::Handle::try_current()
        {
            idle.reaper = true;
            rt.spawn(reap(Arc::downgrade(self), stats.clone()));
        }
    }

    /// Closes every idle session (shutdown, or on request); returns how many.
    pub(crate) async fn close_idle(&self) -> usize {
        let sessions =
            std::mem::take(&mut self.idle.lock().unwrap_or_else(|p| p.into_inner()).sessions);
        let n = sessions.len();
        for s in sessions {
            s.close().await;
        }
        n
    }

    /// Closes the expired idle sessions; returns when the next one expires (None: no idle
    /// session is left, and the reaper has stopped).
    fn close_expired(&self, stats: &Stats) -> Option<Instant> {
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        let before = idle.sessions.len();
        idle.sessions.retain(|s| self.expired(s, now).is_none());
        let closed = before - idle.sessions.len();
        if closed > 0 {
            tracing::debug!(closed, "closed idle hostd sessions");
            stats
                .sessions_retired
                .fetch_add(closed as u64, Ordering::Relaxed);
        }
        let next = idle
            .sessions
            .iter()
            .map(|s| (s.idle_since + self.idle_timeout).min(s.opened_at + self.max_age))
            .min();
        if next.is_none() {
            idle.reaper = false;
        }
        next
    }
}

/// Closes sessions as they expire, while the pool has idle ones.
async fn reap(pool: Weak<SessionPool>, stats: Arc<Stats>) {
    loop {
        let next = match pool.upgrade() {
            Some(p) => p.close_expired(&stats),
            None => return,
        };
        match next {
            Some(at) => tokio::time::sleep_until(tokio::time::Instant::from_std(at)).await,
            None => return,
        }
    }
}
