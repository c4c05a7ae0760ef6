//! A primary's lease from an outside arbiter (etcd), as rules: when it may
//! acknowledge, when to renew, and when it must fence itself without
//! hearing from anyone.
//!
//! The arbiter starts a lease's time to live when it handles a grant or a
//! keep-alive, which is after this box sent it. So a lease the arbiter
//! renewed for `ttl` holds at least until `sent + ttl` in real time, where
//! `sent` is when this box sent the request that was answered: the
//! arbiter cannot expire it, and so cannot hand the leader key to another
//! box, before then. This box measures that on its own monotonic clock,
//! which may run slower or faster than real time by up to
//! [`LeaseRules::drift`]; and between judging the lease and the answer
//! leaving, the process may stall. So an acknowledgement is allowed only
//! before
//!
//! ```text
//! valid_until = sent + ttl * (1 - drift) - margin
//! ```
//!
//! and the new primary, which takes the leader key only once the arbiter
//! expired the lease, acknowledges only after that: between the last
//! acknowledgement of the old primary and the first of the new one there
//! is at least `ttl * drift + margin`, less whatever stall outlasted the
//! margin.
//!
//! A lease is never extended by an answer to an older request than the
//! one that set it, and a lease the arbiter says is gone is gone for good:
//! a new one is a new life, with a new epoch.

use std::time::{Duration, Instant};

/// The lease's parameters.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LeaseRules {
    /// The time to live asked of the arbiter.
    pub ttl: Duration,
    /// The largest rate by which this box's monotonic clock may run slow
    /// against the arbiter's, as a fraction (0.01: 1%).
    pub drift: f64,
    /// Time kept back for a stall between judging the lease and the
    /// answer leaving the process.
    pub margin: Duration,
}

impl LeaseRules {
    /// A TTL of `ttl` with the default drift (1%) and margin (a tenth of
    /// the TTL, at most 500 ms).
    pub fn new(ttl: Duration) -> LeaseRules {
        LeaseRules {
            ttl,
            drift: 0.01,
            margin: (ttl / 10).min(Duration::from_millis(500)),
        }
    }

    /// How long after sending a request answered with `granted` the
    /// lease may be relied on (zero when the margin eats it all).
    pub fn usable(&self, granted: Duration) -> Duration {
        let drift = self.drift.clamp(0.0, 1.0);
        granted.mul_f64(1.0 - drift).saturating_sub(self.margin)
    }

    /// How often a held lease is renewed: a third of the TTL, so two
    /// renewals can fail before the lease is at risk.
    pub fn renew_every(&self) -> Duration {
        self.ttl / 3
    }
}

/// Why this box may not acknowledge.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LeaseRefusal {
    #[error("no lease from the arbiter yet")]
    NotHeld,
    #[error("the lease ran out {ago_ms} ms ago on this box's clock (not renewed in time)")]
    Expired { ago_ms: u64 },
    #[error("the arbiter says the lease is gone")]
    Lost,
}

/// A request to the arbiter: a grant or a keep-alive, told apart by the
/// order they were sent in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Ask(u64);

/// The lease as this box judges it.
#[derive(Clone, Debug)]
pub struct Lease {
    rules: LeaseRules,
    /// The requests sent and not answered, oldest first, with when.
    asked: Vec<(Ask, Instant)>,
    next_ask: u64,
    /// The newest request answered, and the lease it gave.
    answered: Option<(Ask, Instant)>,
    valid_until: Option<Instant>,
    lost: bool,
}

impl Lease {
    pub fn new(rules: LeaseRules) -> Lease {
        Lease {
            rules,
            asked: Vec::new(),
            next_ask: 0,
            answered: None,
            valid_until: None,
            lost: false,
        }
    }

    pub fn rules(&self) -> LeaseRules {
        self.rules
    }

    /// A grant or keep-alive is sent at `now`.
    pub fn ask(&mut self, now: Instant) -> Ask {
        let ask = Ask(self.next_ask);
        self.next_ask += 1;
        self.asked.push((ask, now));
        ask
    }

    /// The arbiter answered `ask`: the lease lives `granted` more from
    /// when it handled it. An answer to a request older than the one the
    /// lease stands on extends nothing. A `granted` of zero is the
    /// arbiter saying the lease is gone.
    pub fn answered(&mut self, ask: Ask, granted: Duration) {
        let Some(i) = self.asked.iter().position(|(a, _)| *a == ask) else {
            return;
        };
        let (_, sent) = self.asked[i];
        // Requests sent before this one and still unanswered never will
        // be (the arbiter answers in order): forget them.
        self.asked.drain(..=i);
        if self.lost {
            return;
        }
        if granted.is_zero() {
            self.lose();
            return;
        }
        if self.answered.is_some_and(|(a, _)| a > ask) {
            return;
        }
        self.answered = Some((ask, sent));
        let until = sent + self.rules.usable(granted);
        self.valid_until = Some(self.valid_until.map_or(until, |v| v.max(until)));
    }

    /// The arbiter said the lease is gone (revoked, or expired there):
    /// nothing this box does brings it back.
    pub fn lose(&mut self) {
        self.lost = true;
        self.valid_until = None;
        self.asked.clear();
    }

    /// Whether an acknowledgement may leave at `now`.
    pub fn may_acknowledge(&self, now: Instant) -> Result<(), LeaseRefusal> {
        if self.lost {
            return Err(LeaseRefusal::Lost);
        }
        match self.valid_until {
            None => Err(LeaseRefusal::NotHeld),
            Some(until) if now < until => Ok(()),
            Some(until) => Err(LeaseRefusal::Expired {
                ago_ms: now.duration_since(until).as_millis() as u64,
            }),
        }
    }

    /// What is left of the lease at `now` (zero once it ran out).
    pub fn remaining(&self, now: Instant) -> Option<Duration> {
        self.valid_until
            .filter(|_| !self.lost)
            .map(|until| until.saturating_duration_since(now))
    }

    /// When the lease stops allowing acknowledgements, for a timer that
    /// fences the box then, whether or not anyone speaks to it.
    pub fn valid_until(&self) -> Option<Instant> {
        self.valid_until.filter(|_| !self.lost)
    }

    /// When to send the next keep-alive: a third of the TTL after the
    /// request the lease stands on, or at once when none stands.
    pub fn renew_at(&self, now: Instant) -> Instant {
        match self.answered {
            Some((_, sent)) => sent + self.rules.renew_every(),
            None => now,
        }
    }

    pub fn is_lost(&self) -> bool {
        self.lost
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn a_lease_counts_from_when_its_request_was_sent() {
        let t0 = crate::clock::monotonic();
        let rules = LeaseRules {
            ttl: ms(5000),
            drift: 0.01,
            margin: ms(500),
        };
        let mut l = Lease::new(rules);
        assert_eq!(l.may_acknowledge(t0), Err(LeaseRefusal::NotHeld));
        let a = l.ask(t0);
        // Answered 2 s later: the lease still counts from t0.
        l.answered(a, ms(5000));
        let until = t0 + ms(4450);
        assert_eq!(l.valid_until(), Some(until));
        assert!(l.may_acknowledge(until - ms(1)).is_ok());
        assert_eq!(
            l.may_acknowledge(until + ms(10)),
            Err(LeaseRefusal::Expired { ago_ms: 10 })
        );
        assert_eq!(l.renew_at(t0 + ms(2000)), t0 + ms(5000) / 3);
    }

    #[test]
    fn an_older_answer_extends_nothing_and_a_lost_lease_stays_lost() {
        let t0 = crate::clock::monotonic();
        let mut l = Lease::new(LeaseRules::new(ms(3000)));
        let a = l.ask(t0);
        let b = l.ask(t0 + ms(1000));
        l.answered(b, ms(3000));
        let until = l.valid_until().expect("held");
        l.answered(a, ms(3000));
        assert_eq!(l.valid_until(), Some(until), "a is forgotten, b stands");
        let c = l.ask(t0 + ms(2000));
        l.answered(c, Duration::ZERO);
        assert_eq!(l.may_acknowledge(t0 + ms(2001)), Err(LeaseRefusal::Lost));
        let d = l.ask(t0 + ms(2100));
        l.answered(d, ms(3000));
        assert!(l.is_lost() && l.valid_until().is_none());
    }

    /// One run: requests sent at `sends` (ms on this box's clock), each
    /// delayed `delays` before the arbiter handles it and `back` before
    /// its answer arrives; this box's clock runs `slow` slower than real
    /// time. Answers: the last real time this box may acknowledge, and
    /// the real time the arbiter expires the lease.
    fn last_ack_and_expiry(
        rules: LeaseRules,
        slow: f64,
        asks: &[(u64, u64, u64)],
    ) -> Option<(f64, f64)> {
        let t0 = crate::clock::monotonic();
        let real = |local_ms: f64| local_ms * (1.0 + slow);
        let mut l = Lease::new(rules);
        let ttl = rules.ttl.as_secs_f64() * 1000.0;
        let mut expiry: Option<f64> = None;
        let mut local = 0u64;
        for &(gap, to_arbiter, back) in asks {
            local += gap;
            let sent_real = real(local as f64);
            // The arbiter handles it after the delay, and expires the
            // lease ttl after that (if it had not already: then it is
            // gone and answers zero).
            let handled = sent_real + to_arbiter as f64;
            let alive = expiry.is_none_or(|e| handled < e);
            let a = l.ask(t0 + ms(local));
            let answer_real = handled + back as f64;
            let answer_local = answer_real / (1.0 + slow);
            if alive {
                expiry = Some(handled + ttl);
                l.answered(a, rules.ttl);
            } else {
                l.answered(a, Duration::ZERO);
            }
            local = local.max(answer_local.ceil() as u64);
        }
        let until = l.valid_until()?;
        let until_local = until.duration_since(t0).as_secs_f64() * 1000.0;
        Some((real(until_local), expiry?))
    }

    proptest! {
        /// Whatever the delays and however slow this box's clock runs
        /// within the drift, its last acknowledgement comes before the
        /// arbiter expires the lease (and so before any other box can
        /// take the leader key).
        #[test]
        fn the_last_acknowledgement_comes_before_the_arbiter_expires_the_lease(
            slow in 0.0f64..0.01,
            asks in prop::collection::vec((0u64..3000, 0u64..2000, 0u64..2000), 1..12),
        ) {
            let rules = LeaseRules { ttl: ms(3000), drift: 0.01, margin: ms(100) };
            if let Some((last_ack, expiry)) = last_ack_and_expiry(rules, slow, &asks) {
                prop_assert!(last_ack < expiry, "acknowledged until {last_ack} ms, expired at {expiry}");
            }
        }
    }

    /// The negative control: with no drift allowed for, a clock that runs
    /// slow lets this box acknowledge after the arbiter expired its lease.
    #[test]
    fn without_the_drift_a_slow_clock_acknowledges_past_the_expiry() {
        let rules = LeaseRules {
            ttl: ms(3000),
            drift: 0.0,
            margin: Duration::ZERO,
        };
        let (last_ack, expiry) = last_ack_and_expiry(rules, 0.005, &[(0, 0, 0)]).expect("held");
        assert!(last_ack > expiry, "{last_ack} {expiry}");
    }
}
