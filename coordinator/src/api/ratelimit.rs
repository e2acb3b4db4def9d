//! Per-token limits.
//!
//! [`ReadLimiter`]: a budget for reads that reach hosts or clusters (runtime, logs, plans): a
//! token bucket per token id, refilled continuously at `[api] runtime_reads_per_minute`,
//! holding at most one minute's worth. A read over the budget gets 429 with the seconds until
//! the next one is allowed in Retry-After. The same buckets, at `[api]
//! token_requests_per_minute`, bound every request of a token that is not a global admin.
//!
//! [`Admission`]: who may have a request in progress. Every token has its own share
//! (`token_concurrent_requests`); all tokens together have `max_concurrent_requests`, of which
//! `admin_reserved_requests` only global admin tokens may use; requests without a valid token
//! have their own `unauthenticated_concurrent_requests`. So one token, or many low-role ones,
//! holding slow requests cannot lock the operator out.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::config::ApiSettings;

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

/// Requests in progress per token id.
type Counts = Arc<Mutex<HashMap<String, usize>>>;

/// Why a request was not admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The token has `token_concurrent_requests` in progress already.
    TokenBusy,
    /// The token spent its requests of the minute; retry after this.
    TokenRate(Duration),
    /// The share of the caller's class is in use.
    ServerBusy,
}

/// Who a request is charged to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class<'a> {
    /// A token with the admin role in all Namespaces: may use the reserved share, no rate.
    Admin(&'a str),
    /// Any other valid token.
    Token(&'a str),
    /// No token, or one that is not valid.
    Unauthenticated,
}

/// The concurrency shares and the per-token request rate.
#[derive(Debug)]
pub struct Admission {
    shared: Arc<Semaphore>,
    reserved: Arc<Semaphore>,
    unauthenticated: Arc<Semaphore>,
    /// Token lookups in progress (bounded apart: a lookup holds no share yet).
    pub(super) lookups: Arc<Semaphore>,
    per_token: usize,
    in_progress: Counts,
    rate: ReadLimiter,
    /// How long a request's body may take to arrive.
    pub body_timeout: Duration,
}

/// What an admitted request holds until its answer is ready.
#[derive(Debug)]
pub struct Admitted {
    _permit: OwnedSemaphorePermit,
    slot: Option<(String, Counts)>,
}

impl Drop for Admitted {
    fn drop(&mut self) {
        if let Some((token, map)) = self.slot.take() {
            let mut map = map.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(n) = map.get_mut(&token) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    map.remove(&token);
                }
            }
        }
    }
}

impl Admission {
    /// The shares of `settings` (a reserve larger than the total leaves one shared slot).
    pub fn new(settings: &ApiSettings) -> Self {
        let total = settings.max_concurrent_requests.max(1);
        let reserved = settings.admin_reserved_requests.min(total - 1);
        Self {
            shared: Arc::new(Semaphore::new(total - reserved)),
            reserved: Arc::new(Semaphore::new(reserved)),
            unauthenticated: Arc::new(Semaphore::new(
                settings.unauthenticated_concurrent_requests.max(1),
            )),
            lookups: Arc::new(Semaphore::new(total)),
            per_token: settings.token_concurrent_requests.max(1),
            in_progress: Arc::new(Mutex::new(HashMap::new())),
            rate: ReadLimiter::new(settings.token_requests_per_minute),
            body_timeout: settings.body_timeout,
        }
    }

    /// Admits a request of `class` now, or says why not (never waits).
    pub fn admit(&self, class: Class<'_>) -> Result<Admitted, Refusal> {
        let token = match class {
            Class::Unauthenticated => {
                let permit = self
                    .unauthenticated
                    .clone()
                    .try_acquire_owned()
                    .map_err(|_| Refusal::ServerBusy)?;
                return Ok(Admitted {
                    _permit: permit,
                    slot: None,
                });
            }
            Class::Admin(t) | Class::Token(t) => t,
        };
        // The token's own share first: a token over it never takes from the others'.
        let slot = {
            let mut map = self.in_progress.lock().unwrap_or_else(|p| p.into_inner());
            let n = map.entry(token.to_owned()).or_insert(0);
            if *n >= self.per_token {
                return Err(Refusal::TokenBusy);
            }
            *n += 1;
            Admitted {
                _permit: match self.shared.clone().try_acquire_owned() {
                    Ok(p) => p,
                    Err(_) => match class {
                        Class::Admin(_) => match self.reserved.clone().try_acquire_owned() {
                            Ok(p) => p,
                            Err(_) => {
                                release(&mut map, token);
                                return Err(Refusal::ServerBusy);
                            }
                        },
                        _ => {
                            release(&mut map, token);
                            return Err(Refusal::ServerBusy);
                        }
                    },
                },
                slot: Some((token.to_owned(), self.in_progress.clone())),
            }
        };
        if let Class::Token(t) = class
            && let Err(wait) = self.rate.take(t)
        {
            return Err(Refusal::TokenRate(wait));
        }
        Ok(slot)
    }
}

fn release(map: &mut HashMap<String, usize>, token: &str) {
    if let Some(n) = map.get_mut(token) {
        *n = n.saturating_sub(1);
        if *n == 0 {
            map.remove(token);
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

    fn settings(total: usize, reserved: usize, per_token: usize) -> ApiSettings {
        ApiSettings {
            max_concurrent_requests: total,
            admin_reserved_requests: reserved,
            token_concurrent_requests: per_token,
            unauthenticated_concurrent_requests: 1,
            token_requests_per_minute: 1000,
            ..ApiSettings::default()
        }
    }

    /// A token gets its own share only; many tokens get the shared part only; a global admin
    /// still gets the reserve; requests without a token have their own share.
    #[test]
    fn shares_are_per_token_with_a_reserve_for_admins() {
        let a = Admission::new(&settings(4, 1, 2));
        let one: Vec<_> = (0..2)
            .map(|_| a.admit(Class::Token("t1")).unwrap())
            .collect();
        assert_eq!(a.admit(Class::Token("t1")).unwrap_err(), Refusal::TokenBusy);
        let _two = a.admit(Class::Token("t2")).unwrap();
        assert_eq!(
            a.admit(Class::Token("t3")).unwrap_err(),
            Refusal::ServerBusy
        );
        let admin = a.admit(Class::Admin("adm")).unwrap();
        assert_eq!(
            a.admit(Class::Admin("adm")).unwrap_err(),
            Refusal::ServerBusy
        );
        let anon = a.admit(Class::Unauthenticated).unwrap();
        assert_eq!(
            a.admit(Class::Unauthenticated).unwrap_err(),
            Refusal::ServerBusy
        );
        drop((one, admin, anon));
        // Everything given back: t1 has its share again, and the refused t3 left no count.
        let _again: Vec<_> = (0..2)
            .map(|_| a.admit(Class::Token("t1")).unwrap())
            .collect();
        assert!(a.in_progress.lock().unwrap().get("t3").is_none());
    }

    #[test]
    fn a_token_over_its_rate_waits_but_an_admin_does_not() {
        let a = Admission::new(&ApiSettings {
            token_requests_per_minute: 2,
            ..ApiSettings::default()
        });
        for _ in 0..2 {
            drop(a.admit(Class::Token("t")).unwrap());
        }
        assert!(matches!(
            a.admit(Class::Token("t")).unwrap_err(),
            Refusal::TokenRate(_)
        ));
        for _ in 0..10 {
            drop(a.admit(Class::Admin("adm")).unwrap());
        }
    }
}
