//! How long the coordinator waits before trying again: one rule for the SSH reconnects after
//! failed connections, the worker's retries of failed work, and the spread of the drift
//! sweep's interval.

use std::time::Duration;

/// `base · 2^doublings`, at most `max`. Computed in nanoseconds that saturate instead of
/// overflowing, so growth reaches `max` for any settings and never exceeds it.
pub fn exponential(base: Duration, max: Duration, doublings: u32) -> Duration {
    let nanos = base.as_nanos();
    if nanos == 0 {
        return Duration::ZERO;
    }
    let grown = if doublings < nanos.leading_zeros() {
        nanos << doublings
    } else {
        u128::MAX
    };
    if grown >= max.as_nanos() {
        return max;
    }
    // Below `max`, so the seconds fit.
    Duration::new(
        (grown / 1_000_000_000) as u64,
        (grown % 1_000_000_000) as u32,
    )
}

/// `interval` ± up to a tenth, so coordinators and hosts are not asked in lockstep. If the
/// system's random source fails, the interval is a tenth short (never longer).
pub fn jittered(interval: Duration) -> Duration {
    let tenth = interval.as_millis() as u64 / 10;
    if tenth == 0 {
        return interval;
    }
    let mut b = [0u8; 8];
    let r = match clawfleet_protocol::random::fill(&mut b) {
        Ok(()) => u64::from_le_bytes(b),
        Err(_) => 0,
    };
    interval - Duration::from_millis(tenth) + Duration::from_millis(r % (2 * tenth + 1))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(v: u64) -> Duration {
        Duration::from_millis(v)
    }

    #[test]
    fn doubles_from_the_base_up_to_the_cap() {
        let d: Vec<u128> = (0..=6)
            .map(|n| exponential(ms(100), ms(2000), n).as_millis())
            .collect();
        assert_eq!(d, vec![100, 200, 400, 800, 1600, 2000, 2000]);
        // Growth is strict until the cap, and the cap holds for any count.
        for n in 0..64 {
            let (a, b) = (
                exponential(ms(1), ms(60_000), n),
                exponential(ms(1), ms(60_000), n + 1),
            );
            assert!(a < b || a == ms(60_000), "{n}: {a:?} then {b:?}");
            assert!(b <= ms(60_000), "{n}: {b:?}");
        }
        assert_eq!(exponential(ms(100), ms(2000), u32::MAX), ms(2000));
    }

    #[test]
    fn huge_settings_saturate_at_the_cap() {
        assert_eq!(
            exponential(Duration::MAX / 2, Duration::MAX, 40),
            Duration::MAX
        );
        // A base above the cap waits the cap.
        assert_eq!(
            exponential(Duration::from_secs(3600), ms(300_000), 0),
            ms(300_000)
        );
        // Far past where a 32-bit factor would overflow, a long cap is still reached.
        let day = Duration::from_secs(86_400);
        assert_eq!(exponential(Duration::from_nanos(1), day, 50), day);
        assert_eq!(
            exponential(Duration::from_nanos(1), day, 40),
            Duration::from_nanos(1 << 40)
        );
        assert_eq!(exponential(Duration::ZERO, day, 10), Duration::ZERO);
    }

    #[test]
    fn ssh_failures_and_worker_attempts_keep_their_schedules() {
        // SSH: the first failure waits the base (doublings = failures − 1).
        let ssh = |failures: u32| exponential(ms(500), ms(60_000), failures.saturating_sub(1));
        assert_eq!(ssh(0), ms(500));
        assert_eq!(ssh(1), ms(500));
        assert_eq!(ssh(2), ms(1000));
        assert_eq!(ssh(8), ms(60_000));
        // Worker: attempts already spent double the initial delay (defaults 1 s to 300 s).
        let worker = |attempts: u32| exponential(ms(1000), ms(300_000), attempts);
        assert_eq!(worker(0), ms(1000));
        assert_eq!(worker(3), ms(8000));
        assert_eq!(worker(9), ms(300_000));
    }

    #[test]
    fn jitter_stays_within_a_tenth_and_varies() {
        let interval = ms(10_000);
        let samples: Vec<Duration> = (0..200).map(|_| jittered(interval)).collect();
        for s in &samples {
            assert!(*s >= ms(9000) && *s <= ms(11_000), "{s:?}");
        }
        assert!(samples.iter().any(|s| *s != samples[0]), "no jitter at all");
        // Below 10 ms there is no whole millisecond to spread.
        assert_eq!(jittered(ms(9)), ms(9));
    }
}
