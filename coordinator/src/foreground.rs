//! API requests in progress, for background work to yield to: on a coordinator whose cores
//! and database connections serve both, a draining worker otherwise takes what deploy and
//! read requests wait for, and they are answered several times more slowly. The worker
//! ([`crate::worker::Worker::yielding_to`]) runs at most `worker.yield_parallelism` items while
//! [`Foreground::busy`], and all of `worker.parallelism` otherwise.
//!
//! Only admitted requests of valid tokens count (the API's `admit` enters them), so requests
//! nobody authenticated cannot slow convergence down.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// How long after its last request ended the API still counts as busy: a client's next
/// request on a kept-alive connection comes well within it, so a steady stream of requests is
/// not seen as idle between two of them.
pub const GRACE: Duration = Duration::from_millis(20);

/// The gauge, shared by the API (which enters requests) and the worker (which asks).
#[derive(Debug, Clone)]
pub struct Foreground(Arc<Inner>);

#[derive(Debug)]
struct Inner {
    since: Instant,
    in_progress: AtomicUsize,
    /// Requests entered so far.
    entered: AtomicU64,
    /// When a request last ended, in microseconds after `since`; 0 before the first.
    last_end: AtomicU64,
}

impl Default for Foreground {
    fn default() -> Self {
        Self(Arc::new(Inner {
            since: Instant::now(),
            in_progress: AtomicUsize::new(0),
            entered: AtomicU64::new(0),
            last_end: AtomicU64::new(0),
        }))
    }
}

impl Foreground {
    /// Counts a request as in progress until the returned guard is dropped.
    pub fn enter(&self) -> InProgress {
        self.0.in_progress.fetch_add(1, Ordering::AcqRel);
        self.0.entered.fetch_add(1, Ordering::Relaxed);
        InProgress(self.0.clone())
    }

    /// Requests entered so far (what the API counted, for tests and diagnostics).
    pub fn entered(&self) -> u64 {
        self.0.entered.load(Ordering::Relaxed)
    }

    /// Whether a request is in progress, or one ended less than [`GRACE`] ago.
    pub fn busy(&self) -> bool {
        self.busy_at(Instant::now())
    }

    fn busy_at(&self, now: Instant) -> bool {
        if self.0.in_progress.load(Ordering::Acquire) > 0 {
            return true;
        }
        let last = self.0.last_end.load(Ordering::Acquire);
        last != 0 && micros(now.saturating_duration_since(self.0.since)) < last + micros(GRACE)
    }
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// A request in progress ([`Foreground::enter`]).
#[derive(Debug)]
pub struct InProgress(Arc<Inner>);

impl Drop for InProgress {
    fn drop(&mut self) {
        // The end is recorded before the count drops, so whoever sees no request in
        // progress sees this one's end.
        let at = micros(self.0.since.elapsed()).max(1);
        self.0.last_end.fetch_max(at, Ordering::AcqRel);
        self.0.in_progress.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn busy_while_a_request_is_in_progress_and_for_the_grace_after() {
        let f = Foreground::default();
        assert!(!f.busy(), "no request yet");
        let a = f.enter();
        let b = f.enter();
        assert!(f.busy());
        drop(a);
        assert!(f.busy(), "one still in progress");
        drop(b);
        let ended = Instant::now();
        assert!(f.busy_at(ended), "within the grace");
        assert!(!f.busy_at(ended + GRACE + Duration::from_millis(5)));
        // A later request starts it again.
        let c = f.clone().enter();
        assert!(f.busy_at(ended + GRACE * 10));
        drop(c);
        assert_eq!(f.entered(), 3);
    }
}
