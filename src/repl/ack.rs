//! Who may acknowledge what: the rule a primary applies to every writing
//! request before it appends, again before it answers, and the policy
//! that says how long a `twin` answer waits for the twin and what it
//! becomes when the wait ends.
//!
//! The node layer waits (on the twin's durable head, a fence, a timer) and
//! asks [`TwinPolicy::wait_for`] how long, then [`TwinPolicy::answer`] what
//! to say; the degraded state it keeps is entered and left only as these
//! functions say.

use std::time::Duration;

/// What a writing request may become, decided before anything is
/// appended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admit {
    /// Append, then answer once durable here.
    Local,
    /// Append, then wait for the twin under the policy.
    Twin,
    /// Append, then answer `local` at once: no twin is configured and the
    /// policy falls back to local durability.
    LocalWithoutTwin,
}

/// Why a writing request is refused with nothing appended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NotAdmitted {
    /// A newer epoch exists: this primary acknowledges nothing.
    Fenced,
    /// `twin` durability, and no twin is configured to give it.
    NoTwin,
}

/// The primary as a request finds it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AckState {
    /// A newer epoch fenced this primary.
    pub fenced: bool,
    /// A twin is pinned.
    pub twin_configured: bool,
    /// The policy for an absent twin falls back to local durability.
    pub falls_back: bool,
}

/// Decide before appending: a fenced primary appends nothing, and a
/// `twin` request that no twin can ever acknowledge is refused at once
/// (or answered `local` under a fallback policy) rather than left
/// waiting.
pub fn admit(state: AckState, wants_twin: bool) -> Result<Admit, NotAdmitted> {
    if state.fenced {
        return Err(NotAdmitted::Fenced);
    }
    match (wants_twin, state.twin_configured, state.falls_back) {
        (false, _, _) => Ok(Admit::Local),
        (true, true, _) => Ok(Admit::Twin),
        (true, false, true) => Ok(Admit::LocalWithoutTwin),
        (true, false, false) => Err(NotAdmitted::NoTwin),
    }
}

/// Decide before answering a frame appended here: a primary fenced since
/// the append acknowledges it at no durability.
pub fn may_acknowledge(fenced: bool) -> Result<(), NotAdmitted> {
    if fenced {
        Err(NotAdmitted::Fenced)
    } else {
        Ok(())
    }
}

/// What a `twin` append does while the twin does not acknowledge it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TwinPolicy {
    /// Wait for the twin, however long (the default).
    Wait,
    /// Answer `TwinTimeout` after this long.
    Fail(Duration),
    /// After this long, acknowledge as `local` and keep doing so, without
    /// waiting, until the twin has caught up (degraded).
    FallBack(Duration),
}

/// How long a `twin` answer waits for the twin.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WaitFor {
    /// Not at all: answer `local` now (degraded under a fallback).
    Nothing,
    /// Until the twin acknowledges, a fence, or shutdown.
    Forever,
    /// At most this long.
    UpTo(Duration),
}

/// How a wait for the twin ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Waited {
    /// The twin's durable head reached the frame, or the twin's log now
    /// starts past it (`on_twin` false: a snapshot it installed covers
    /// it, and it never holds the frame itself).
    Reached { on_twin: bool },
    /// The policy's bound passed first.
    TimedOut,
    /// The primary is shutting down.
    Closed,
}

/// The answer to a `twin` append.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TwinAnswer {
    /// Durable on both.
    Twin,
    /// Durable here only, as the fallback allows.
    Local,
    /// The twin will never hold this frame.
    NotOnTwin,
    /// The twin did not acknowledge within the policy.
    TwinTimeout,
}

impl TwinPolicy {
    /// The bound on a `twin` answer's wait; `degraded` is whether an
    /// earlier wait fell back and the twin has not caught up since.
    pub fn wait_for(self, degraded: bool) -> WaitFor {
        match self {
            TwinPolicy::Wait => WaitFor::Forever,
            TwinPolicy::Fail(d) => WaitFor::UpTo(d),
            TwinPolicy::FallBack(_) if degraded => WaitFor::Nothing,
            TwinPolicy::FallBack(d) => WaitFor::UpTo(d),
        }
    }

    /// The answer once the wait ended, and whether the primary is
    /// degraded from now on: under a fallback, a wait that timed out
    /// answers `local` and later ones do not wait.
    pub fn answer(self, waited: Waited) -> (TwinAnswer, bool) {
        match (self, waited) {
            (_, Waited::Reached { on_twin: true }) => (TwinAnswer::Twin, false),
            (TwinPolicy::FallBack(_), Waited::Reached { on_twin: false }) => {
                (TwinAnswer::Local, false)
            }
            (_, Waited::Reached { on_twin: false }) => (TwinAnswer::NotOnTwin, false),
            (TwinPolicy::FallBack(_), Waited::TimedOut | Waited::Closed) => {
                (TwinAnswer::Local, true)
            }
            (_, Waited::TimedOut | Waited::Closed) => (TwinAnswer::TwinTimeout, false),
        }
    }

    /// How long an answer that needs the twin's store (an erase carried
    /// out there) waits for its report: the same bound, degraded or not,
    /// since no fallback makes an erase happen on the twin.
    pub fn store_wait(self) -> Option<Duration> {
        match self {
            TwinPolicy::Wait => None,
            TwinPolicy::Fail(d) | TwinPolicy::FallBack(d) => Some(d),
        }
    }
}

/// Whether a degraded primary returns to waiting for its twin: once the
/// twin's durable head reached this log's head.
pub fn caught_up(twin_durable: u64, head: u64) -> bool {
    twin_durable >= head
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_policy_bounds_the_wait_and_names_the_answer() {
        let d = Duration::from_millis(250);
        let reached = Waited::Reached { on_twin: true };
        let covered = Waited::Reached { on_twin: false };
        for p in [
            TwinPolicy::Wait,
            TwinPolicy::Fail(d),
            TwinPolicy::FallBack(d),
        ] {
            assert_eq!(p.answer(reached), (TwinAnswer::Twin, false), "{p:?}");
        }
        assert_eq!(TwinPolicy::Wait.wait_for(false), WaitFor::Forever);
        assert_eq!(TwinPolicy::Wait.wait_for(true), WaitFor::Forever);
        assert_eq!(TwinPolicy::Fail(d).wait_for(true), WaitFor::UpTo(d));
        assert_eq!(TwinPolicy::FallBack(d).wait_for(false), WaitFor::UpTo(d));
        assert_eq!(TwinPolicy::FallBack(d).wait_for(true), WaitFor::Nothing);
        for p in [TwinPolicy::Wait, TwinPolicy::Fail(d)] {
            assert_eq!(p.answer(covered), (TwinAnswer::NotOnTwin, false));
            assert_eq!(p.answer(Waited::TimedOut), (TwinAnswer::TwinTimeout, false));
            assert_eq!(p.answer(Waited::Closed), (TwinAnswer::TwinTimeout, false));
        }
        let fb = TwinPolicy::FallBack(d);
        assert_eq!(fb.answer(covered), (TwinAnswer::Local, false));
        assert_eq!(fb.answer(Waited::TimedOut), (TwinAnswer::Local, true));
        assert_eq!(fb.answer(Waited::Closed), (TwinAnswer::Local, true));
        assert_eq!(TwinPolicy::Wait.store_wait(), None);
        assert_eq!(fb.store_wait(), Some(d));
        assert!(caught_up(7, 7) && caught_up(8, 7) && !caught_up(6, 7));
    }

    #[test]
    fn a_fenced_primary_admits_nothing_and_no_twin_is_refused_at_once() {
        let st = |fenced, twin_configured, falls_back| AckState {
            fenced,
            twin_configured,
            falls_back,
        };
        for wants_twin in [false, true] {
            for configured in [false, true] {
                for falls_back in [false, true] {
                    assert_eq!(
                        admit(st(true, configured, falls_back), wants_twin),
                        Err(NotAdmitted::Fenced)
                    );
                }
            }
        }
        assert_eq!(admit(st(false, false, false), false), Ok(Admit::Local));
        assert_eq!(
            admit(st(false, false, false), true),
            Err(NotAdmitted::NoTwin)
        );
        assert_eq!(
            admit(st(false, false, true), true),
            Ok(Admit::LocalWithoutTwin)
        );
        assert_eq!(admit(st(false, true, false), true), Ok(Admit::Twin));
        assert_eq!(may_acknowledge(true), Err(NotAdmitted::Fenced));
        assert_eq!(may_acknowledge(false), Ok(()));
    }
}
