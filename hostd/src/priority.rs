//! The relay's CPU priority: `hostd relay` moves gateway bytes, `hostd serve` runs the
//! operations the coordinator waits on. On a host whose cores are busy with both, the relay
//! yields (a higher nice value), so a burst of gateway traffic delays operations less. The
//! relay's throughput on an idle core is unchanged: nice only orders runnable work.
//!
//! Unsafe code: `setpriority(2)`, which no dependency offers.
#![allow(unsafe_code)]

use nix::libc;

/// The nice value `hostd relay` runs at.
pub const RELAY_NICE: i32 = 10;

/// Sets the calling thread's nice value to `nice` (Linux keeps it per thread; threads
/// started afterwards inherit it, so call this before starting any).
pub fn set_nice(nice: i32) -> std::io::Result<()> {
    // SAFETY: setpriority takes plain integers and touches no memory of ours; who = 0 is
    // the calling thread.
    let rc = unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, nice) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thread_lowers_its_own_priority() {
        std::thread::spawn(|| {
            set_nice(RELAY_NICE).unwrap_or_else(|e| panic!("setpriority: {e}"));
            // SAFETY: getpriority takes plain integers.
            let now = unsafe { libc::getpriority(libc::PRIO_PROCESS, 0) };
            assert_eq!(now, RELAY_NICE);
        })
        .join()
        .unwrap_or_else(|_| panic!("the thread panicked"));
    }
}
