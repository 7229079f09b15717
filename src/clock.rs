//! Coarse clocks, read at the kernel's tick resolution (1-4 ms): for bookkeeping
//! taken several times per transaction that compares against seconds (server
//! lifetimes, idle and check delays) or is shown rounded (the console's request
//! times). The coarse clocks read a shared page; the precise ones read the
//! time-stamp counter, which is slow in a virtual machine.

use std::time::Duration;

fn read(clock: libc::clockid_t) -> Option<Duration> {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes a timespec into the valid, exclusively borrowed `ts`.
    if unsafe { libc::clock_gettime(clock, &mut ts) } != 0 {
        return None;
    }
    Some(Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32))
}

/// A point in monotonic time, to the tick.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct CoarseInstant(Duration);

impl CoarseInstant {
    pub fn now() -> Self {
        CoarseInstant(read(libc::CLOCK_MONOTONIC_COARSE).unwrap_or_default())
    }

    pub fn elapsed(&self) -> Duration {
        CoarseInstant::now().since(*self)
    }

    /// The time from `earlier` to this instant; zero if `earlier` is later.
    pub fn since(&self, earlier: CoarseInstant) -> Duration {
        self.0.saturating_sub(earlier.0)
    }
}

/// Microseconds since the Unix epoch, to the tick.
pub fn coarse_wall_us() -> u64 {
    match read(libc::CLOCK_REALTIME_COARSE) {
        // Not `as_micros`: its u128 arithmetic runs on every state change.
        Some(d) => d.as_secs().saturating_mul(1_000_000).saturating_add(u64::from(d.subsec_micros())),
        None => crate::stats::now_us(),
    }
}

/// Sleeps for `d`, or for ever when None (a timeout that is off): a `select!` branch
/// for an optional deadline.
pub async fn sleep_opt(d: Option<Duration>) {
    match d {
        Some(d) => tokio::time::sleep(d).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn coarse_clocks_follow_the_precise_ones() {
        let wall = crate::stats::now_us();
        let coarse = coarse_wall_us();
        // Behind by at most a tick (and a little scheduling), never ahead.
        assert!(coarse <= wall + 1 && wall.saturating_sub(coarse) < 100_000, "{wall} vs {coarse}");
        let t = CoarseInstant::now();
        let precise = std::time::Instant::now();
        while precise.elapsed() < Duration::from_millis(30) {
            std::hint::spin_loop();
        }
        let e = t.elapsed();
        assert!(e >= Duration::from_millis(20) && e < Duration::from_secs(5), "{e:?}");
    }
}
