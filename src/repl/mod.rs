//! Replication as pure state machines.
//!
//! This module imports no tokio, quinn or file system: its cores take
//! messages, frame-stream bytes, local events and the time as arguments and
//! answer messages to send and actions to carry out, the way quinn-proto is
//! driven by quinn. The network driver only moves bytes, timers and events;
//! `pair::ReplPair` (with the `testing` feature) drives both cores over a simulated link with
//! simulated time, which is how every interleaving is tested without a
//! socket; `cluster::Cluster` does so for two boxes through failovers,
//! fences, rejoins and switchovers.
//!
//! - [`ack`]: who may acknowledge what (fencing, no twin);
//! - [`arbiter`]: automatic failover's rules; [`amnesia`]: an arbiter
//!   that forgot, told from one that remembers; [`claim`]: one decision
//!   on one read of it;
//! - [`epochs`]: which epoch wrote which frames, the fork point, fencing;
//! - [`msg`]: the control messages and their encoding;
//! - [`wire`]: the frame stream, a log's own bytes;
//! - [`in_hand`]: frames shipped before they are durable on the primary;
//! - [`verify`]: the twin's frames compared with the primary's, by
//!   digests of ranges;
//! - [`apply`]: the frame stream read from a primary's log and applied to
//!   a twin's, shared by the daemons and the simulations;
//! - [`primary`]: the shipping side; [`twin`]: the receiving side;
//! - [`promote`], [`rejoin`], [`switchover`]: the failover rules, as
//!   the daemons and the simulated cluster carry them out;
//! - [`Backoff`]: capped reconnect delays.

pub mod ack;
pub mod amnesia;
pub mod apply;
pub mod arbiter;
pub mod claim;
#[cfg(any(test, feature = "testing"))]
pub mod cluster;
pub mod epochs;
pub mod in_hand;
pub mod lease;
#[cfg(any(test, feature = "testing"))]
mod link;
pub mod msg;
#[cfg(any(test, feature = "testing"))]
pub mod pair;
pub mod primary;
pub mod promote;
pub mod rejoin;
pub mod switchover;
pub mod twin;
pub mod verify;
pub mod wire;

use std::time::{Duration, Instant};

pub use epochs::{fork_point, EpochHistory, EpochStart, EpochState};
pub use msg::{
    HandedClient, Position, PrimaryMsg, Refusal, StoreHealth, StoreStall, TwinMsg, PROTOCOL_VERSION,
};
pub use primary::{
    HeadFrame, PrimaryAction, PrimaryCore, PrimaryState, PrimaryStatus, PrimaryView, Timers,
    MAX_SHIPPED_UNSYNCED,
};
pub use twin::{TwinAction, TwinCore, TwinState, TwinView};
pub use wire::{FrameDecoder, FrameEvent};

/// The time, as the cores take it: a monotonic instant for timers and the
/// wall clock (milliseconds since the Unix epoch) for what is reported to
/// the other side.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Now {
    pub at: Instant,
    pub unix_ms: u64,
}

/// The wall clock, in milliseconds since the Unix epoch: for what is
/// shown and recorded, never for a deadline.
pub use crate::clock::unix_ms;

impl Now {
    /// The machine's clocks, as a driver without tokio's (a simulation,
    /// a test) gives them to the cores.
    pub fn system() -> Now {
        Now {
            at: crate::clock::monotonic(),
            unix_ms: unix_ms(),
        }
    }

    /// `d` later.
    pub fn after(self, d: Duration) -> Now {
        Now {
            at: self.at + d,
            unix_ms: self.unix_ms + d.as_millis() as u64,
        }
    }
}

/// Reconnect delays: doubling from `base` up to `cap`, back to `base` once a
/// connection streams. After a connection that streamed a while, or that a
/// restarted peer reset, the first redial is immediate: the peer was there
/// a moment ago, and a restart or a blip is over sooner than a backoff.
/// Never twice in a row without a connection streaming a while in between,
/// so a peer that ends every connection at once is not dialed in a loop.
#[derive(Clone, Copy, Debug)]
pub struct Backoff {
    base: Duration,
    cap: Duration,
    failures: u32,
    /// The last delay was an immediate redial.
    redialed_at_once: bool,
}

/// How long a connection must have streamed to count as working fine.
pub const STREAMED_FINE: Duration = Duration::from_secs(1);

impl Backoff {
    pub fn new(base: Duration, cap: Duration) -> Self {
        Backoff {
            base,
            cap,
            failures: 0,
            redialed_at_once: false,
        }
    }

    /// The delay before the next attempt, after one more failure.
    pub fn next_delay(&mut self) -> Duration {
        self.redialed_at_once = false;
        let d = self
            .base
            .saturating_mul(1u32 << self.failures.min(16))
            .min(self.cap);
        self.failures = self.failures.saturating_add(1);
        d
    }

    /// The delay before redialing a peer whose connection streamed for
    /// `streamed` (zero: it never did), and which a restarted process of
    /// the peer reset when `peer_restarted`.
    pub fn after_session(&mut self, streamed: Duration, peer_restarted: bool) -> Duration {
        let fine = streamed >= STREAMED_FINE;
        if fine {
            self.failures = 0;
            self.redialed_at_once = false;
        }
        if (fine || peer_restarted) && !self.redialed_at_once {
            self.redialed_at_once = true;
            return Duration::ZERO;
        }
        self.next_delay()
    }

    /// A connection worked: start again from `base`.
    pub fn reset(&mut self) {
        self.failures = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_to_its_cap_and_resets() {
        let mut b = Backoff::new(Duration::from_millis(10), Duration::from_millis(70));
        let got: Vec<u128> = (0..5).map(|_| b.next_delay().as_millis()).collect();
        assert_eq!(got, vec![10, 20, 40, 70, 70]);
        b.reset();
        assert_eq!(b.next_delay(), Duration::from_millis(10));
    }

    #[test]
    fn a_peer_that_was_there_is_redialed_at_once_but_never_in_a_loop() {
        let ms = Duration::from_millis;
        let mut b = Backoff::new(ms(10), ms(70));
        // A connection that streamed a while: at once, then the backoff.
        assert_eq!(b.after_session(STREAMED_FINE, false), Duration::ZERO);
        assert_eq!(b.next_delay(), ms(10));
        assert_eq!(b.next_delay(), ms(20));
        // A restarted peer reset the connection: it is up, dial at once.
        assert_eq!(b.after_session(Duration::ZERO, true), Duration::ZERO);
        // A peer that resets again before anything streamed a while waits.
        assert_eq!(b.after_session(Duration::ZERO, true), ms(40));
        // So does one that ends every connection at once, Welcome or not.
        let mut b = Backoff::new(ms(10), ms(70));
        b.reset();
        assert_eq!(b.after_session(ms(5), false), ms(10));
        assert_eq!(b.after_session(ms(5), false), ms(20));
        // Streaming a while again earns the next immediate redial, each
        // time, and starts the backoff over.
        assert_eq!(b.after_session(ms(1500), false), Duration::ZERO);
        assert_eq!(b.after_session(ms(1500), true), Duration::ZERO);
        assert_eq!(b.next_delay(), ms(10));
    }
}
