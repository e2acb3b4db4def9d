//! Real Linux test hosts: Debian with systemd as PID 1, a system D-Bus and sshd, booted with
//! `systemd-nspawn --boot` on the test machine (which itself need not run systemd), each in its
//! own network namespace on 169.254.77.(4N-2). Tests drive them over real `ssh`.
//!
//! ```no_run
//! use clawfleet_vm_tests::{skip_unless_hosts, TestHosts};
//!
//! # fn t() {
//! skip_unless_hosts!(); // prints "SKIP: ..." and returns when not root / no nspawn (fails under CI=true)
//! let hosts = TestHosts::start(2).unwrap();
//! for h in hosts.iter() {
//!     assert_eq!(h.run_ok("systemctl is-system-running").unwrap().trim(), "running");
//! }
//! // dropped: powered off, netns/veth/overlay/cgroups removed
//! # }
//! ```
//!
//! See vm-tests/README.md for the ids recorded per host and how leftovers are reclaimed.

mod base;
mod btrfs;
mod config;
mod error;
mod gateway;
mod host;
pub mod openclaw;
mod runner;
mod signals;
mod slot;
mod sys;

pub use base::{BaseRootfs, INCLUDES, detect_mirror, ensure_base_rootfs, recipe_key};
pub use btrfs::BtrfsImage;
pub use config::HarnessConfig;
pub use error::{Error, Result};
pub use gateway::{Artifact, TEST_GATEWAY_REMOTE_PATH, cargo_build, test_gateway_binary};
pub use host::{HostOptions, TestHost, TestHosts, preflight};
pub use runner::{
    dpkg_installed, missing_packages, missing_runner_packages, parse_runner_packages,
    runner_packages,
};
pub use slot::{
    SlotRecord, SlotState, SlotStatus, host_address, list_slots, reclaim_stale, runner_address,
    slot_name,
};
pub use sys::shell_quote;

/// Runner tools the harness calls (apt packages in vm-tests/RUNNER-PACKAGES).
const TOOLS: &[(&str, &str)] = &[
    ("systemd-nspawn", "systemd-container"),
    ("debootstrap", "debootstrap"),
    ("ip", "iproute2"),
    ("ssh", "openssh-client"),
    ("ssh-keygen", "openssh-client"),
];

/// Why real test hosts cannot run here, or `None` when they can. Under `CI=true` a missing
/// prerequisite is a failure, not a skip: this panics with the reason, so CI can never pass by
/// silently skipping the real-host tests.
pub fn skip_reason() -> Option<String> {
    let reason = missing_prerequisite();
    if let Some(r) = &reason {
        let ci = std::env::var("CI").is_ok_and(|v| v == "true" || v == "1");
        if ci {
            panic!("CI is set but real test hosts cannot run: {r}");
        }
    }
    reason
}

fn missing_prerequisite() -> Option<String> {
    if !sys::is_root() {
        return Some(
            "real test hosts need root (network namespaces, overlay mounts, systemd-nspawn); \
             run the tests as root"
                .into(),
        );
    }
    for (tool, package) in TOOLS {
        if sys::which(tool).is_none() {
            return Some(format!(
                "{tool} not found (package {package}); install the runner packages: \
                 apt-get install --no-install-recommends {}",
                runner_packages().join(" ")
            ));
        }
    }
    if sys::cgroup_roots().is_empty() {
        return Some("no usable cgroup hierarchy under /sys/fs/cgroup".into());
    }
    let fs_list = std::fs::read_to_string("/proc/filesystems").unwrap_or_default();
    if !fs_list.lines().any(|l| l.trim_end().ends_with("overlay")) {
        return Some("the kernel has no overlay file system (modprobe overlay)".into());
    }
    None
}

/// Returns from the calling test with a "SKIP: ..." line when real test hosts cannot run
/// (see [`skip_reason`]; under `CI=true` it fails instead).
#[macro_export]
macro_rules! skip_unless_hosts {
    () => {
        if let Some(reason) = $crate::skip_reason() {
            eprintln!("SKIP: {reason}");
            return;
        }
    };
}
