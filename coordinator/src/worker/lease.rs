//! The claim on a work item, kept alive: a heartbeat renews the lease every third of it, and
//! every host call first renews it too. Once a renewal says another claim replaced ours, or
//! the lease may have lapsed without a renewal getting through (the database is unreachable),
//! no further host call is issued for the item: another coordinator may own it by now, and its
//! operations carry a higher fence than ours.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use crate::store::{Claim, SharedStore, StoreError};

/// Why the worker stopped acting on an item.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaseLost {
    /// A renewal found another claim in place.
    Replaced,
    /// No renewal got through before the lease ran out.
    Lapsed { error: String },
}

/// A claim, its lease, and when the lease was last known to be good.
#[derive(Debug, Clone)]
pub struct Lease {
    store: SharedStore,
    claim: Claim,
    lease: Duration,
    /// When the lease runs out, as far as this process knows; `None` once lost.
    good_until: Arc<Mutex<Option<Instant>>>,
}

impl Lease {
    /// A lease just taken by a claim.
    pub fn new(store: SharedStore, claim: Claim, lease: Duration) -> Self {
        Self {
            store,
            claim,
            lease,
            good_until: Arc::new(Mutex::new(Some(Instant::now() + lease))),
        }
    }

    fn set(&self, v: Option<Instant>) {
        match self.good_until.lock() {
            Ok(mut g) => *g = v,
            Err(p) => *p.into_inner() = v,
        }
    }

    fn get(&self) -> Option<Instant> {
        match self.good_until.lock() {
            Ok(g) => *g,
            Err(p) => *p.into_inner(),
        }
    }

    /// Renews now. A renewal that fails on the database leaves the lease as good as it was:
    /// the caller decides with [`Lease::check`].
    pub async fn renew(&self) -> Result<(), LeaseLost> {
        if self.get().is_none() {
            return Err(LeaseLost::Replaced);
        }
        let started = Instant::now();
        let outcome = self.store.renew_lease(&self.claim, self.lease).await;
        let took = started.elapsed();
        if took > self.lease / 3 {
            tracing::warn!(
                work = self.claim.work,
                took_ms = took.as_millis() as u64,
                "renewing the lease took more than a third of it"
            );
        }
        match outcome {
            Ok(true) => {
                self.set(Some(started + self.lease));
                Ok(())
            }
            Ok(false) => {
                tracing::warn!(work = self.claim.work, "another claim replaced this one");
                self.set(None);
                Err(LeaseLost::Replaced)
            }
            Err(e) => {
                tracing::warn!(work = self.claim.work, "cannot renew the lease: {e}");
                self.check().map_err(|_| LeaseLost::Lapsed {
                    error: e.to_string(),
                })
            }
        }
    }

    /// Whether the lease is still known to be ours, with a margin of a tenth of it for the
    /// call about to start.
    pub fn check(&self) -> Result<(), LeaseLost> {
        match self.get() {
            None => Err(LeaseLost::Replaced),
            Some(until) if Instant::now() + self.lease / 10 < until => Ok(()),
            Some(_) => Err(LeaseLost::Lapsed {
                error: "the lease ran out before a renewal got through".to_owned(),
            }),
        }
    }

    /// Renews every third of the lease until dropped or lost.
    pub fn heartbeat(&self) -> tokio::task::JoinHandle<()> {
        let me = self.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(me.lease / 3).await;
                if let Err(LeaseLost::Replaced) = me.renew().await {
                    return;
                }
            }
        })
    }
}

impl From<&StoreError> for LeaseLost {
    fn from(e: &StoreError) -> Self {
        match e {
            StoreError::ClaimLost { .. } => LeaseLost::Replaced,
            other => LeaseLost::Lapsed {
                error: other.to_string(),
            },
        }
    }
}
