//! The machine's clocks, read here and nowhere else below the node layer.
//!
//! The log and the embedding API decide by a [`Clock`] they are given
//! (`OpenOptions::clock`), the real monotonic clock unless a test hands
//! them a [`ManualClock`]; the replication cores take the time as an
//! argument (`repl::Now`). [`unix_ms`] is the one wall clock, for stamps
//! that are shown and recorded, never for a deadline. The node layer's
//! clock, `node::clock`, is tokio's, so a test that pauses tokio's time
//! pauses the node's deadlines too.

use std::fmt::Debug;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// A monotonic clock, as a component that decides by time is given it.
pub trait Clock: Send + Sync + Debug {
    /// The current instant.
    fn now(&self) -> Instant;
}

/// The machine's monotonic clock.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Instant {
        Instant::now()
    }
}

/// The machine's monotonic clock, shared: what a log decides by unless
/// told otherwise.
pub fn system() -> Arc<dyn Clock> {
    Arc::new(SystemClock)
}

/// The machine's monotonic clock, read once: for code that sleeps on a
/// thread (not on tokio's timer), whose deadline must run on the same
/// clock as its sleep.
pub fn monotonic() -> Instant {
    Instant::now()
}

/// `CLOCK_MONOTONIC` in nanoseconds: the clock an `Instant` reads, as a
/// number that compares across the processes of one machine (the budget's
/// marks). 0 if the clock cannot be read.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec through a pointer to a
    // local that outlives the call.
    let ret = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    if ret != 0 {
        return 0;
    }
    (ts.tv_sec as u64).saturating_mul(1_000_000_000) + ts.tv_nsec as u64
}

/// The wall clock, in milliseconds since the Unix epoch: for what is
/// shown and recorded, never for a deadline.
pub fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// The wall clock as a `SystemTime`: for file times and stamps, never
/// for a deadline.
pub fn wall() -> SystemTime {
    SystemTime::now()
}

/// A clock that moves only when told: a test's, so that what a component
/// decides by time does not depend on how fast the machine runs.
#[derive(Debug)]
pub struct ManualClock {
    at: Mutex<Instant>,
}

impl Default for ManualClock {
    fn default() -> Self {
        ManualClock::new()
    }
}

impl ManualClock {
    /// A clock standing at an arbitrary instant (the machine's now; only
    /// the distances from it mean anything).
    pub fn new() -> ManualClock {
        ManualClock {
            at: Mutex::new(Instant::now()),
        }
    }

    /// Move the clock `d` forward.
    pub fn advance(&self, d: Duration) {
        *self.at.lock().unwrap_or_else(|e| e.into_inner()) += d;
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Instant {
        *self.at.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_manual_clock_moves_only_when_told() {
        let c = ManualClock::new();
        let t0 = c.now();
        assert_eq!(c.now(), t0);
        c.advance(Duration::from_secs(3));
        assert_eq!(c.now().duration_since(t0), Duration::from_secs(3));
    }
}
