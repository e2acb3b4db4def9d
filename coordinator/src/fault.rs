//! Test-only stops at named points, for the fencing test (`tests/e2e/ha.rs`): an `occ` built
//! with the `fault-hooks` feature, run with `OCC_FAULT_STOP_BEFORE=<operation kind>`, stops
//! itself (SIGSTOP) right before it sends the first operation of that kind, after renewing its
//! lease, as a coordinator paused at the worst moment would. The test continues it with
//! SIGCONT. Without the feature (every release build: `packaging/build.sh` builds occ without
//! its dev-dependencies) [`before_call`] is empty and neither the variable's name nor this
//! logic is in the binary.

/// Stops here once when a test asked for this operation kind (only with `fault-hooks`).
#[cfg(not(feature = "fault-hooks"))]
#[inline(always)]
pub fn before_call(_kind: &str) {}

/// Stops here once when a test asked for this operation kind (only with `fault-hooks`).
#[cfg(feature = "fault-hooks")]
pub fn before_call(kind: &str) {
    use std::sync::atomic::{AtomicBool, Ordering};
    static USED: AtomicBool = AtomicBool::new(false);
    if std::env::var("OCC_FAULT_STOP_BEFORE").ok().as_deref() != Some(kind)
        || USED.swap(true, Ordering::SeqCst)
    {
        return;
    }
    let pid = std::process::id();
    tracing::warn!(op = kind, pid, "fault hook: stopping before the call");
    // Raised on this thread, not sent to the process (`kill -STOP <pid>`): a process-directed
    // signal is taken by whichever thread the kernel picks, and on a loaded machine this one
    // went on and sent the call before the stop took hold. A thread-directed SIGSTOP stops
    // the process before this thread returns from the raise.
    if let Err(e) = nix::sys::signal::raise(nix::sys::signal::Signal::SIGSTOP) {
        tracing::error!(op = kind, "fault hook: cannot stop: {e}");
    }
}
