//! A per-token budget for reads that reach hosts or clusters (runtime and logs): a token
//! bucket per token id, refilled continuously at `[api] runtime_reads_per_minute`, holding at
//! most one minute's worth. A read over the budget gets 429 with the seconds until the next
//! one is allowed in Retry-After.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Buckets kept at most; the least recently used go first (a bucket left alone for a minute
/// is full again anyway).
const MAX_BUCKETS: usize = 10_000;

/// The limiter shared by the routes it guards.
#[derive(Debug)]
pub struct ReadLimiter {
    per_minute: f64,
    buckets: Mutex<HashMap<String, (f64, Instant)>>,
}

impl ReadLimiter {
    /// A limiter allowing `per_minute` reads per token per minute (at least 1).
    pub fn new(per_minute: u32) -> Self {
        Self {
            per_minute: f64::from(per_minute.max(1)),
            buckets: Mutex::new(HashMap::new()),
        }
    }

    /// Takes one read from the token's budget, or says how long to wait for one.
    pub fn take(&self, token_id: &str) -> Result<(), Duration> {
        self.take_at(token_id, Instant::now())
    }

    fn take_at(&self, token_id: &str, now: Instant) -> Result<(), Duration> {
        let mut buckets = self.buckets.lock().unwrap_or_else(|p| p.into_inner());
        if buckets.len() >= MAX_BUCKETS && !buckets.contains_key(token_id) {
            let full_again = Duration::from_secs(60);
            buckets.retain(|_, (_, at)| now.saturating_duration_since(*at) < full_again);
        }
        let rate = self.per_minute / 60.0;
        let (tokens, at) = buckets
            .entry(token_id.to_owned())
            .or_insert((self.per_minute, now));
        *tokens = (*tokens + now.saturating_duration_since(*at).as_secs_f64() * rate)
            .min(self.per_minute);
        *at = now;
        if *tokens >= 1.0 {
            *tokens -= 1.0;
            Ok(())
        } else {
            Err(Duration::from_secs_f64((1.0 - *tokens) / rate))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_gets_its_budget_then_waits_and_others_are_not_affected() {
        let l = ReadLimiter::new(3);
        let t0 = Instant::now();
        for _ in 0..3 {
            assert!(l.take_at("a", t0).is_ok());
        }
        let wait = l.take_at("a", t0).unwrap_err();
        assert!(
            wait > Duration::from_secs(19) && wait <= Duration::from_secs(20),
            "{wait:?}"
        );
        assert!(l.take_at("b", t0).is_ok());
        assert!(l.take_at("a", t0 + Duration::from_secs(20)).is_ok());
    }
}
