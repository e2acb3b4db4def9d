//! The operations, one module per area.

pub(crate) mod agent;
pub(crate) mod fence;
pub(crate) mod namespace;
pub(crate) mod probe;
pub(crate) mod reload;
pub(crate) mod revision;
pub(crate) mod runtime;
pub(crate) mod secrets;
pub(crate) mod status;

use std::time::Duration;

use clawfleet_protocol::failure::{Failure, FailureCode};

use crate::render::RenderError;

/// The answer must leave in time: waits stop this much before the deadline.
pub(crate) const ANSWER_MARGIN: Duration = Duration::from_millis(750);

/// A rendering problem is the cluster configuration's or the revision's.
pub(crate) fn render_failure(e: RenderError) -> Failure {
    Failure::new(FailureCode::KubernetesConfigurationInvalid, e.to_string())
}

/// Sleeps `pause`, or less when the deadline (minus the margin) is nearer; false when no time
/// is left.
pub(crate) async fn pause_within(r: &crate::client::Requests, pause: Duration) -> bool {
    let left = r.remaining().saturating_sub(ANSWER_MARGIN);
    if left.is_zero() {
        return false;
    }
    tokio::time::sleep(pause.min(left)).await;
    true
}
