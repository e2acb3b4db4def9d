//! Test-only pauses at named points, for the fault matrix (`tests/hosts_faults.rs`): a hostd
//! built with the `fault-hooks` feature stops at the point named in `FAULT_FILE`, records its
//! pid in `<file>.paused` and waits there until the test kills it. Without the feature (every
//! release build: `packaging/build.sh` builds hostd alone, without its dev-dependencies)
//! [`point`] is an empty function and neither the file's name nor this logic is in the binary.
//!
//! Points are the steps of operations, named `<operation>/<step>` (for example
//! `prepare-revision/account`, reached before the step starts), and a few places inside a step:
//! `after-account-intent`, `after-useradd`, `after-trash-rename`.

/// Where a test names the point to pause at.
#[cfg(feature = "fault-hooks")]
pub const FAULT_FILE: &str = "/run/clawfleet-hostd-fault";

/// Pauses here for good when a test asked for this point (only with `fault-hooks`).
#[cfg(not(feature = "fault-hooks"))]
#[inline(always)]
pub fn point(_name: &str) {}

/// Pauses here for good when a test asked for this point (only with `fault-hooks`). The
/// request is used up: the file is removed before the pause, so a retry runs through.
#[cfg(feature = "fault-hooks")]
pub fn point(name: &str) {
    let file = std::env::var_os("HOSTD_FAULT_FILE")
        .map_or_else(|| std::path::PathBuf::from(FAULT_FILE), Into::into);
    let Ok(wanted) = std::fs::read_to_string(&file) else {
        return;
    };
    if wanted.trim() != name {
        return;
    }
    let _ = std::fs::remove_file(&file);
    let mut paused = file.into_os_string();
    paused.push(".paused");
    let _ = std::fs::write(&paused, format!("{} {name}\n", std::process::id()));
    tracing::warn!(point = name, "fault hook: paused until killed");
    loop {
        std::thread::sleep(std::time::Duration::from_secs(1));
    }
}
