//! The leader-only loops: the drift sweep (`crate::drift`), rollout scheduling and retention.
//! Of the coordinators sharing a database, only the one holding the leader lease
//! (`leader.rs`) runs them; each is a pass run by the one runner, [`every`], which waits its
//! interval, ends when `stop` turns true, and skips the pass while this coordinator does not
//! lead.

pub mod leader;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use crate::backend::Backend;
use crate::config::{DriftSettings, RetentionSettings};
use crate::service::Service;
use crate::store::SharedStore;
use leader::Leadership;

/// Runs `pass` after every `interval()` (asked anew each time, so it may be jittered) while
/// this coordinator leads, until `stop` turns true.
pub async fn every<F, Fut>(
    interval: impl Fn() -> Duration,
    leader: Leadership,
    mut stop: watch::Receiver<bool>,
    mut pass: F,
) where
    F: FnMut() -> Fut,
    Fut: Future<Output = ()>,
{
    loop {
        tokio::select! {
            _ = tokio::time::sleep(interval()) => {}
            _ = stop.changed() => return,
        }
        if *stop.borrow() {
            return;
        }
        if !leader.is_leader() {
            continue;
        }
        pass().await;
    }
}

/// Drift sweeps every (jittered) `settings.interval`.
pub async fn run_drift<B: Backend>(
    store: SharedStore,
    backend: Arc<B>,
    settings: DriftSettings,
    leader: Leadership,
    stop: watch::Receiver<bool>,
) {
    let interval = settings.interval;
    every(
        || crate::backoff::jittered(interval),
        leader,
        stop,
        || async {
            match crate::drift::sweep(&*store, &*backend).await {
                Ok(s) => tracing::info!(
                    targets = s.targets,
                    unreachable = s.unreachable_targets,
                    states = ?s.by_state,
                    "drift sweep done"
                ),
                Err(e) => tracing::warn!("drift sweep failed: {e}"),
            }
        },
    )
    .await;
}

/// Rollout scheduler passes every `interval`.
pub async fn run_rollouts(
    service: Service,
    interval: Duration,
    leader: Leadership,
    stop: watch::Receiver<bool>,
) {
    every(
        || interval,
        leader,
        stop,
        || async {
            if let Err(e) = service.advance_rollouts().await {
                tracing::warn!("rollout pass failed: {e}");
            }
        },
    )
    .await;
}

/// Removes finished work and old audit events every `settings.interval`.
pub async fn run_retention(
    store: SharedStore,
    settings: RetentionSettings,
    leader: Leadership,
    stop: watch::Receiver<bool>,
) {
    let interval = settings.interval;
    every(
        || interval,
        leader,
        stop,
        || async {
            match store
                .prune(
                    settings.work.as_secs() as i64,
                    settings.audit.as_secs() as i64,
                )
                .await
            {
                Ok(p) => tracing::info!(work = p.work, audit = p.audit, "retention pass"),
                Err(e) => tracing::warn!("retention pass failed: {e}"),
            }
        },
    )
    .await;
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};

    use super::*;

    /// The runner runs passes while it leads, none while it follows, and ends on stop.
    #[tokio::test]
    async fn passes_run_only_while_leading_and_stop_ends_the_loop() {
        let (lead_tx, lead_rx) = watch::channel(false);
        let (stop_tx, stop_rx) = watch::channel(false);
        let passes = Arc::new(AtomicU32::new(0));
        let counted = passes.clone();
        let task = tokio::spawn(every(
            || Duration::from_millis(20),
            Leadership::from_receiver(lead_rx),
            stop_rx,
            move || {
                let counted = counted.clone();
                async move {
                    counted.fetch_add(1, Ordering::SeqCst);
                }
            },
        ));
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(passes.load(Ordering::SeqCst), 0, "a follower ran a pass");
        lead_tx.send_replace(true);
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(
            passes.load(Ordering::SeqCst) >= 2,
            "the leader ran no passes"
        );
        stop_tx.send_replace(true);
        tokio::time::timeout(Duration::from_secs(5), task)
            .await
            .expect("the loop ends on stop")
            .expect("the loop does not panic");
    }
}
