//! The claim on a work item, kept alive: a heartbeat renews the lease every third of it, and
//! every host call first makes sure of it: it renews the lease unless the lease was taken or
//! renewed within the last tenth of it. A renewal then could tell nothing new: a claim takes
//! only a lapsed lease, and nine tenths of this one are still to run, counted from before the
//! statement that took it (so on the database's clock too); the fence still travels with the
//! call. Once a renewal says another claim replaced ours, or the lease may have lapsed
//! without a renewal getting through (the database is unreachable), no further host call is
//! issued for the item: another coordinator may own it by now, and its operations carry a
//! higher fence than ours.

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
    /// When the statement that last took or renewed the lease was sent; the lease runs out
    /// one lease later at the earliest. `None` once lost.
    confirmed: Arc<Mutex<Option<Instant>>>,
}

impl Lease {
    /// A lease taken by a claim whose statement was sent at `asked`.
    pub fn new(store: SharedStore, claim: Claim, lease: Duration, asked: Instant) -> Self {
        Self {
            store,
            claim,
            lease,
            confirmed: Arc::new(Mutex::new(Some(asked))),
        }
    }

    fn set(&self, v: Option<Instant>) {
        match self.confirmed.lock() {
            Ok(mut g) => *g = v,
            Err(p) => *p.into_inner() = v,
        }
    }

    fn get(&self) -> Option<Instant> {
        match self.confirmed.lock() {
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
                self.set(Some(started));
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
            Some(confirmed) if Instant::now() + self.lease / 10 < confirmed + self.lease => Ok(()),
            Some(_) => Err(LeaseLost::Lapsed {
                error: "the lease ran out before a renewal got through".to_owned(),
            }),
        }
    }

    /// Before a host call: renews, unless the lease was confirmed within the last tenth of it
    /// (see the module's comment); an error once it is lost.
    pub async fn before_call(&self) -> Result<(), LeaseLost> {
        match self.get() {
            None => Err(LeaseLost::Replaced),
            Some(confirmed) if confirmed.elapsed() < self.lease / 10 => Ok(()),
            Some(_) => self.renew().await,
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

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::store::prelude::*;
    use crate::store::sqlite::SqliteStore;

    /// A store with one claimed item whose claim statement was sent at `asked`.
    async fn claimed(lease: Duration) -> (Arc<SqliteStore>, Claim, Instant) {
        let store = Arc::new(SqliteStore::in_memory().unwrap());
        let asked = Instant::now();
        store
            .enqueue(&crate::store::Enqueue::namespace(
                crate::store::WorkKind::EnsureNamespace,
                "ns",
            ))
            .await
            .unwrap();
        let work = store.claim_work("t", lease).await.unwrap().unwrap();
        (store, work.claim, asked)
    }

    #[tokio::test]
    async fn a_fresh_lease_is_not_renewed_before_a_call_an_older_one_is() {
        let lease = Duration::from_secs(2);
        let (store, claim, asked) = claimed(lease).await;
        let l = Lease::new(store.clone() as SharedStore, claim, lease, asked);
        // Within the first tenth (200 ms): no renewal, nothing asked of the database.
        l.before_call().await.unwrap();
        assert_eq!(l.get(), Some(asked));
        // Later: renewed, and confirmed from the renewal.
        tokio::time::sleep(Duration::from_millis(250)).await;
        l.before_call().await.unwrap();
        assert!(l.get().is_some_and(|c| c > asked));
    }

    #[tokio::test]
    async fn an_older_lease_replaced_meanwhile_stops_the_call() {
        let lease = Duration::from_secs(2);
        let (store, claim, asked) = claimed(lease).await;
        let l = Lease::new(store.clone() as SharedStore, claim, lease, asked);
        // Another claim replaced ours (as after our lease lapsed): a renewal finds out.
        let other = Claim {
            token: claim.token + 1,
            ..claim
        };
        store
            .with_connection(move |c| {
                c.execute(
                    "UPDATE work SET claim_token = ?2 WHERE id = ?1",
                    rusqlite::params![other.work, other.token],
                )
            })
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(250)).await;
        assert_eq!(l.before_call().await, Err(LeaseLost::Replaced));
        assert_eq!(l.before_call().await, Err(LeaseLost::Replaced));
    }
}
