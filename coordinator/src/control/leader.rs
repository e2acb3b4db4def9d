//! The leader lease. Of the coordinators sharing a database, one at a time runs the singleton
//! loops (drift sweeps, rollout scheduling, retention): the one holding the lease row, which it
//! renews every third of the lease. A leader that dies stops renewing and a follower takes
//! over once the lease lapses, with a higher term; a leader that shuts down cleanly resigns
//! so a follower takes over at its next attempt. A leader that cannot reach the database steps
//! down on its own once its lease may have lapsed, so two leaders never run at once for longer
//! than clock drift allows. Leadership is the lease row, never a session lock (those survive
//! a partition on the database side and break behind transaction poolers).

use tokio::sync::watch;
use tokio::time::Instant;

use crate::config::LeaderSettings;
use crate::store::SharedStore;

/// Whether this coordinator leads right now; loops check it before each pass.
#[derive(Debug, Clone)]
pub struct Leadership(watch::Receiver<bool>);

impl Leadership {
    /// Always the leader: a single coordinator (tests, or loops started without a lease).
    pub fn always() -> Self {
        let (tx, rx) = watch::channel(true);
        // The receiver keeps the value; the sender may go.
        drop(tx);
        Self(rx)
    }

    /// Leadership as a lease loop (or a test) reports it on `rx`.
    pub fn from_receiver(rx: watch::Receiver<bool>) -> Self {
        Self(rx)
    }

    pub fn is_leader(&self) -> bool {
        *self.0.borrow()
    }

    /// Resolves when leadership changes (or never, once the lease loop ended).
    pub async fn changed(&mut self) {
        if self.0.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

/// Takes and renews the lease until `stop` turns true, then resigns.
pub fn spawn(
    store: SharedStore,
    holder: String,
    settings: LeaderSettings,
    mut stop: watch::Receiver<bool>,
) -> (tokio::task::JoinHandle<()>, Leadership) {
    let (tx, rx) = watch::channel(false);
    let task = tokio::spawn(async move {
        let lease = settings.lease;
        let mut last_ok: Option<Instant> = None;
        loop {
            let started = Instant::now();
            match store.lead(&holder, lease).await {
                Ok(l) => {
                    last_ok = Some(started);
                    if l.is_leader != *tx.borrow() {
                        if l.is_leader {
                            tracing::info!(term = l.term, "this coordinator leads now");
                        } else {
                            tracing::info!(term = l.term, leader = %l.holder, "following");
                        }
                    }
                    tx.send_replace(l.is_leader);
                }
                Err(e) => {
                    let lapsed = last_ok.is_none_or(|t| t.elapsed() + lease / 10 >= lease);
                    if lapsed && *tx.borrow() {
                        tracing::warn!("stepping down: cannot renew the leader lease: {e}");
                        tx.send_replace(false);
                    } else {
                        tracing::warn!("cannot renew the leader lease: {e}");
                    }
                }
            }
            tokio::select! {
                _ = tokio::time::sleep(lease / 3) => {}
                _ = stop.changed() => {}
            }
            if *stop.borrow() {
                if *tx.borrow() {
                    tx.send_replace(false);
                    if let Err(e) = store.resign(&holder).await {
                        tracing::warn!("cannot resign the leader lease: {e}");
                    }
                }
                return;
            }
        }
    });
    (task, Leadership(rx))
}
