//! Whether a 401 or 403 is the identity's real refusal or an API server that is not ready to
//! judge it yet.
//!
//! A kube-apiserver answers 403 for a short while after it starts serving, before its RBAC
//! (and webhook authenticator) caches are filled: measured about 40 ms after a restart, every
//! in-flight request of an identity that was allowed a moment earlier was refused. Treating
//! that as permanent fails every deploy in flight for good. So each cluster keeps a record
//! of its last successful request and its last connection error, and a refusal is retryable
//! for a bounded window ([`SETTLE_WINDOW`]) after a connection error, or when the same
//! identity succeeded shortly before the refusals began. Past the window it is permanent as
//! before: an identity that lost its rights keeps being refused, and then it is the
//! operator's to fix.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long after a connection error (or after the identity's last success) a 401/403 is
/// taken for a server still starting.
pub const SETTLE_WINDOW: Duration = Duration::from_secs(30);

/// What a 401/403 is taken for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// Within the window after a connection error.
    AfterConnectionError,
    /// The identity was accepted shortly before the refusals began.
    AfterRecentSuccess,
    /// The identity's real refusal.
    Permanent,
}

#[derive(Debug, Default, Clone, Copy)]
struct State {
    last_success: Option<Instant>,
    last_connection_error: Option<Instant>,
    /// When the current run of refusals began (cleared by a success).
    refused_since: Option<Instant>,
}

/// One cluster's record. Times are passed in, so tests drive it with a fake clock.
#[derive(Debug, Default)]
pub(crate) struct AuthRecord {
    state: Mutex<State>,
}

fn within(now: Instant, then: Option<Instant>) -> bool {
    then.is_some_and(|t| now.saturating_duration_since(t) <= SETTLE_WINDOW)
}

impl AuthRecord {
    fn with<T>(&self, f: impl FnOnce(&mut State) -> T) -> T {
        let mut g = match self.state.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        f(&mut g)
    }

    /// A request was answered (any status the identity's rights did not decide).
    pub(crate) fn success(&self, now: Instant) {
        self.with(|s| {
            s.last_success = Some(now);
            s.refused_since = None;
        });
    }

    /// The API server could not be reached or dropped the connection.
    pub(crate) fn connection_error(&self, now: Instant) {
        self.with(|s| s.last_connection_error = Some(now));
    }

    /// Classifies a 401/403 received at `now`.
    pub(crate) fn refusal(&self, now: Instant) -> Refusal {
        self.with(|s| {
            let since = *s.refused_since.get_or_insert(now);
            if within(now, s.last_connection_error) {
                Refusal::AfterConnectionError
            } else if within(since, s.last_success) && within(now, Some(since)) {
                Refusal::AfterRecentSuccess
            } else {
                Refusal::Permanent
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn a_refusal_without_history_is_permanent() {
        let rec = AuthRecord::default();
        assert_eq!(rec.refusal(Instant::now()), Refusal::Permanent);
    }

    #[test]
    fn a_refusal_right_after_a_connection_error_is_retryable_for_the_window_only() {
        let t0 = Instant::now();
        let rec = AuthRecord::default();
        rec.connection_error(t0);
        // The restarted server refuses 40 ms after it serves again.
        assert_eq!(rec.refusal(t0 + 40 * MS), Refusal::AfterConnectionError);
        assert_eq!(
            rec.refusal(t0 + SETTLE_WINDOW),
            Refusal::AfterConnectionError
        );
        assert_eq!(rec.refusal(t0 + SETTLE_WINDOW + MS), Refusal::Permanent);
    }

    #[test]
    fn a_refusal_soon_after_the_identitys_success_is_retryable_for_the_window_only() {
        let t0 = Instant::now();
        let rec = AuthRecord::default();
        rec.success(t0);
        let first = t0 + 5 * SETTLE_WINDOW / 6;
        assert_eq!(rec.refusal(first), Refusal::AfterRecentSuccess);
        // The window runs from the first refusal, not from each one.
        assert_eq!(
            rec.refusal(first + SETTLE_WINDOW),
            Refusal::AfterRecentSuccess
        );
        assert_eq!(rec.refusal(first + SETTLE_WINDOW + MS), Refusal::Permanent);
    }

    #[test]
    fn refusals_that_begin_long_after_the_last_success_are_permanent() {
        let t0 = Instant::now();
        let rec = AuthRecord::default();
        rec.success(t0);
        assert_eq!(
            rec.refusal(t0 + SETTLE_WINDOW + MS),
            Refusal::Permanent,
            "rights revoked while the cluster was idle"
        );
        // A success ends the run of refusals; the next run is judged afresh.
        rec.success(t0 + 2 * SETTLE_WINDOW);
        assert_eq!(
            rec.refusal(t0 + 2 * SETTLE_WINDOW + MS),
            Refusal::AfterRecentSuccess
        );
    }

    #[test]
    fn an_old_connection_error_does_not_make_a_refusal_retryable() {
        let t0 = Instant::now();
        let rec = AuthRecord::default();
        rec.connection_error(t0);
        assert_eq!(rec.refusal(t0 + 2 * SETTLE_WINDOW), Refusal::Permanent);
    }
}
