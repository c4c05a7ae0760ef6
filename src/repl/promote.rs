//! Promotion, as rules: when a twin may become a primary, and how the
//! promoted box fences the primary it replaced.
//!
//! A twin that heard its primary a moment ago may be cut off from a
//! primary that is alive and taking writes: promoting it then makes two
//! primaries. So a promotion is refused while the twin heard its primary
//! within a window, unless forced ([`may_promote`]).
//!
//! The promoted box then tells its predecessor itself: it says hello to
//! the old primary's address as a twin of the new epoch, over the link
//! whose key the old primary pins, until it is heard
//! ([`Predecessor`]). The old primary's own core checks the epoch by the
//! history that comes with it and fences itself: no operator step, no
//! epoch named by hand.

use std::time::Duration;

use super::epochs::{EpochName, EpochState};
use super::msg::{PrimaryMsg, Refusal, TwinMsg};
use super::rejoin::{LogHead, Rejoin};

/// Why a promotion is refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PromoteRefusal {
    #[error("this twin heard its primary {ago_ms} ms ago, within the {quiet_ms} ms a promotion waits for: the primary may be alive and cut off from this box only, and promoting now would make two primaries taking writes. Stop the old primary first, or wait, or promote with --force, which risks exactly that split brain (the old primary is fenced once this box reaches it, and what it acknowledged meanwhile is saved, not kept, when it rejoins)")]
    HeardPrimary { ago_ms: u64, quiet_ms: u64 },
}

/// Whether a twin that last heard its primary at `last_heard_ms` (ms since
/// the Unix epoch; `None`: never, or not since it started) may be promoted
/// at `now_ms`.
pub fn may_promote(
    last_heard_ms: Option<u64>,
    now_ms: u64,
    quiet: Duration,
    force: bool,
) -> Result<(), PromoteRefusal> {
    let quiet_ms = quiet.as_millis() as u64;
    match last_heard_ms {
        Some(heard) if !force => {
            let ago_ms = now_ms.saturating_sub(heard);
            if ago_ms < quiet_ms {
                return Err(PromoteRefusal::HeardPrimary { ago_ms, quiet_ms });
            }
            Ok(())
        }
        _ => Ok(()),
    }
}

/// What telling the predecessor came to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Told {
    /// It refused this box's hello as a newer epoch's: it fenced itself.
    Fenced,
    /// It serves a newer epoch than this box: this box is the stale one.
    Newer { epoch: u64 },
    /// It did not hear or said something else: try again later.
    NotYet(String),
}

/// The promoted box's message to its predecessor.
#[derive(Clone, Debug)]
pub struct Predecessor {
    epoch: u64,
    rejoin: Rejoin,
}

impl Predecessor {
    /// A box whose epochs are `state`, its log `log`, tells its
    /// predecessor.
    pub fn new(state: EpochState, log: LogHead) -> Predecessor {
        Predecessor {
            epoch: state.current(),
            rejoin: Rejoin::new(state, log),
        }
    }

    /// The Hello: this box's own history, which proves its epoch.
    pub fn hello(&self) -> TwinMsg {
        self.rejoin.hello()
    }

    /// The predecessor's answer to it.
    pub fn answer(&self, answer: Option<PrimaryMsg>) -> Told {
        match answer {
            Some(PrimaryMsg::Refuse(Refusal::StaleEpoch { twin, .. })) if twin == self.epoch => {
                Told::Fenced
            }
            Some(PrimaryMsg::Welcome { epochs, .. }) if epochs.current() > self.epoch => {
                Told::Newer {
                    epoch: epochs.current(),
                }
            }
            Some(PrimaryMsg::Refuse(Refusal::Forked { epoch, .. })) if epoch > self.epoch => {
                Told::Newer { epoch }
            }
            Some(other) => Told::NotYet(format!(
                "it answered {other:?} to a hello of epoch {}",
                EpochName(self.epoch)
            )),
            None => Told::NotYet("it closed the stream without an answer".into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::repl::epochs::{EpochHistory, LIFE_BITS};
    use crate::repl::msg::PROTOCOL_VERSION;

    #[test]
    fn a_twin_that_heard_its_primary_lately_is_not_promoted_unless_forced() {
        let q = Duration::from_secs(10);
        assert_eq!(may_promote(None, 50_000, q, false), Ok(()));
        assert_eq!(may_promote(Some(30_000), 50_000, q, false), Ok(()));
        let err = may_promote(Some(45_000), 50_000, q, false).expect_err("refused");
        assert_eq!(
            err,
            PromoteRefusal::HeardPrimary {
                ago_ms: 5_000,
                quiet_ms: 10_000
            }
        );
        assert!(err.to_string().contains("split brain"), "{err}");
        assert_eq!(may_promote(Some(45_000), 50_000, q, true), Ok(()));
    }

    #[test]
    fn the_predecessor_is_told_once_it_refuses_the_new_epoch() {
        let t1 = 1u64 << LIFE_BITS;
        let mut st = EpochState::new(0);
        st.promote(4).expect("promote");
        let log = LogHead {
            history: [1; 16],
            head: 4,
            head_crc: 0,
            first: 1,
        };
        let p = Predecessor::new(st.clone(), log);
        assert!(
            matches!(p.hello(), TwinMsg::Hello { epochs, .. } if epochs.current() == t1),
            "the hello proves the epoch by its history"
        );
        let stale = PrimaryMsg::Refuse(Refusal::StaleEpoch {
            primary: 3,
            twin: t1,
        });
        assert_eq!(p.answer(Some(stale)), Told::Fenced);
        let newer = PrimaryMsg::Welcome {
            version: PROTOCOL_VERSION,
            history: [1; 16],
            from: 5,
            head: 9,
            first: 1,
            epochs: EpochHistory::single(2 * t1),
        };
        assert_eq!(p.answer(Some(newer)), Told::Newer { epoch: 2 * t1 });
        assert!(matches!(p.answer(None), Told::NotYet(_)));
    }
}
