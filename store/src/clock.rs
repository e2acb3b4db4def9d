//! The coordinator's one wall clock. The API shows every timestamp in whole seconds since the
//! epoch (UTC); milliseconds are only used inside the worker for its own scheduling.

use std::time::{SystemTime, UNIX_EPOCH};

/// Milliseconds since the epoch (0 if the clock is before 1970).
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// Seconds since the epoch, the unit of every `createdAt`, `at` and `expiresAt` in the API.
pub fn now_seconds() -> i64 {
    now_ms() / 1000
}
