//! Rejoin, as a pure state machine: a deposed primary becomes the new
//! primary's twin by truncate-to-fork, without copying the log again.
//!
//! The box says hello to the new primary as a twin would
//! ([`Rejoin::hello`]). The new primary's core compares the two epoch
//! histories and answers where the logs forked ([`Rejoin::answer`]). This
//! machine then says, from what the box holds ([`LogFacts`]), whether the
//! rejoin may go on and what it does, in order ([`Plan`]): fence the box
//! durably (it is no primary from now on), save the frames past the fork,
//! rewind the store or set it aside to be rebuilt, and cut the log after
//! the fork. Every step is durable before the next, and the plan is the
//! same when run again, so a rejoin a crash interrupted is finished by
//! running it again. `crate::node::rejoin` carries the steps out; the
//! simulated cluster carries out the very same plan.

use super::epochs::{EpochName, EpochState};
use super::msg::{Position, PrimaryMsg, Refusal, TwinMsg, PROTOCOL_VERSION};

/// What the box's log holds, as the hello needs it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LogHead {
    pub history: [u8; 16],
    pub head: u64,
    /// The crc of the frame at the head.
    pub head_crc: u32,
    pub first: u64,
}

/// Where the new primary says the two logs part.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Heard {
    /// The last frame both logs share.
    pub fork: u64,
    /// The new primary's frame there, to check ours by (none when it did
    /// not say: not retained there, or the fork is 0).
    pub fork_crc: Option<u32>,
    /// The new primary's epoch.
    pub epoch: u64,
    /// The new primary no longer holds this log's head: the twin fetches a
    /// snapshot when it starts.
    pub needs_snapshot: bool,
}

/// What the box holds past the fork, for the plan.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LogFacts {
    pub head: u64,
    /// The oldest retained frame.
    pub first: u64,
    /// This log's frame at the fork: its crc and whether it was erased
    /// (none when the fork is 0).
    pub fork_frame: Option<(u32, bool)>,
    /// How far the store applied the log (0: no store).
    pub store_applied: u64,
    /// Whether any frame in `fork + 1..=store_applied` is a store frame.
    pub store_frames_past_fork: bool,
}

/// What becomes of the store.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StoreStep {
    /// It applied nothing past the fork.
    Keep,
    /// It applied frames past the fork, none of them its own: its applied
    /// mark moves back to the fork.
    Rewind { from: u64 },
    /// Store frames are cut: set it aside, to be rebuilt from the log.
    SetAside,
}

/// One step of a rejoin, carried out durably before the next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// Record that `epoch` exists: this box acknowledges no write as a
    /// primary from now on, even if the rejoin stops.
    Fence { epoch: u64 },
    /// Save frames `after + 1..=through` (under `divergent/`), durably.
    Save { after: u64, through: u64 },
    /// Then the store, as said.
    Store(StoreStep),
    /// Then cut the log after `after`.
    Cut { after: u64 },
}

/// A rejoin's plan: its steps in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    pub heard: Heard,
    pub steps: Vec<Step>,
}

/// Why a rejoin stops. Nothing is cut unless every check passed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RejoinRefusal {
    #[error("the new primary refused this box: {0}")]
    Refused(Refusal),
    #[error("the box serves epoch {}, not newer than this box's {}: it is not the primary that superseded this one", EpochName(*.theirs), EpochName(*.ours))]
    NotNewer { theirs: u64, ours: u64 },
    #[error("frame {seq} differs between the two logs (crc {ours:08x} here, {theirs:08x} on the new primary): they share no checked past, so nothing is cut. Restore this box from the new primary's twin instead")]
    ForkFrameDiffers { seq: u64, ours: u32, theirs: u32 },
    #[error("the logs forked after frame {fork}, below this log's retention floor {first}: nothing is cut. Restore this box instead")]
    ForkBelowFloor { fork: u64, first: u64 },
    #[error("store frames past the fork were applied, and this log does not reach back to frame 1 to rebuild the store from ({first}): nothing is cut. Restore this box instead")]
    StoreNotRebuildable { first: u64 },
    #[error("the new primary answered {0}")]
    Protocol(String),
}

/// One rejoin: see the module's description.
#[derive(Clone, Debug)]
pub struct Rejoin {
    state: EpochState,
    log: LogHead,
}

impl Rejoin {
    /// A rejoin of a box whose epochs are `state` and whose log is `log`.
    pub fn new(state: EpochState, log: LogHead) -> Rejoin {
        Rejoin { state, log }
    }

    /// The Hello to send: the box's own epochs, never one it only heard
    /// of.
    pub fn hello(&self) -> TwinMsg {
        TwinMsg::Hello {
            version: PROTOCOL_VERSION,
            history: self.log.history,
            head: Position {
                seq: self.log.head,
                crc: self.log.head_crc,
            },
            first: self.log.first,
            epochs: self.state.history.clone(),
        }
    }

    /// The new primary's answer: where the logs part, and whether it is
    /// newer at all.
    pub fn answer(&self, answer: Option<PrimaryMsg>) -> Result<Heard, RejoinRefusal> {
        let head = self.log.head;
        let heard = match answer {
            Some(PrimaryMsg::Welcome { epochs, .. }) => Heard {
                fork: head,
                fork_crc: None,
                epoch: epochs.current(),
                needs_snapshot: false,
            },
            Some(PrimaryMsg::BelowFloor { .. }) => Heard {
                fork: head,
                fork_crc: None,
                epoch: self.state.newest(),
                needs_snapshot: true,
            },
            Some(PrimaryMsg::Refuse(Refusal::Forked { at, crc, epoch, .. })) => Heard {
                fork: at,
                fork_crc: crc,
                epoch,
                needs_snapshot: false,
            },
            Some(PrimaryMsg::Refuse(why)) => return Err(RejoinRefusal::Refused(why)),
            Some(other) => return Err(RejoinRefusal::Protocol(format!("{other:?} to a Hello"))),
            None => return Err(RejoinRefusal::Protocol("nothing to a Hello".into())),
        };
        let ours = self.state.current();
        if heard.epoch <= ours {
            return Err(RejoinRefusal::NotNewer {
                theirs: heard.epoch,
                ours,
            });
        }
        Ok(heard)
    }

    /// The steps, from what the box holds. The fence comes first, so a
    /// rejoin refused after it still leaves the box fenced: the newer
    /// primary exists whatever this box's log says.
    pub fn plan(&self, heard: Heard, facts: LogFacts) -> Result<Plan, (Plan, RejoinRefusal)> {
        let mut steps = vec![Step::Fence { epoch: heard.epoch }];
        let fork = heard.fork;
        let refuse = |steps: Vec<Step>, why| Err((Plan { heard, steps }, why));
        if fork < facts.head {
            if fork + 1 < facts.first {
                return refuse(
                    steps,
                    RejoinRefusal::ForkBelowFloor {
                        fork,
                        first: facts.first,
                    },
                );
            }
            if let (Some(theirs), Some((ours, erased))) = (heard.fork_crc, facts.fork_frame) {
                if !erased && ours != theirs {
                    return refuse(
                        steps,
                        RejoinRefusal::ForkFrameDiffers {
                            seq: fork,
                            ours,
                            theirs,
                        },
                    );
                }
            }
            let store = if facts.store_applied > fork && facts.store_frames_past_fork {
                if facts.first > 1 {
                    return refuse(
                        steps,
                        RejoinRefusal::StoreNotRebuildable { first: facts.first },
                    );
                }
                StoreStep::SetAside
            } else if facts.store_applied > fork {
                StoreStep::Rewind {
                    from: facts.store_applied,
                }
            } else {
                StoreStep::Keep
            };
            steps.push(Step::Save {
                after: fork,
                through: facts.head,
            });
            steps.push(Step::Store(store));
            steps.push(Step::Cut { after: fork });
        }
        Ok(Plan { heard, steps })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::repl::epochs::{EpochHistory, LIFE_BITS};

    const T1: u64 = 1 << LIFE_BITS;

    fn rejoin(head: u64) -> Rejoin {
        Rejoin::new(
            EpochState::new(0),
            LogHead {
                history: [1; 16],
                head,
                head_crc: 9,
                first: 1,
            },
        )
    }

    fn forked(at: u64, crc: Option<u32>) -> Option<PrimaryMsg> {
        Some(PrimaryMsg::Refuse(Refusal::Forked {
            at,
            twin_head: 9,
            crc,
            epoch: T1,
        }))
    }

    fn facts(head: u64) -> LogFacts {
        LogFacts {
            head,
            first: 1,
            fork_frame: Some((5, false)),
            store_applied: 0,
            store_frames_past_fork: false,
        }
    }

    #[test]
    fn a_fork_is_fenced_saved_and_cut_in_that_order() {
        let r = rejoin(9);
        assert!(
            matches!(r.hello(), TwinMsg::Hello { epochs, .. } if epochs == EpochHistory::default())
        );
        let heard = r.answer(forked(5, Some(5))).expect("newer");
        let plan = r.plan(heard, facts(9)).expect("plan");
        assert_eq!(
            plan.steps,
            vec![
                Step::Fence { epoch: T1 },
                Step::Save {
                    after: 5,
                    through: 9
                },
                Step::Store(StoreStep::Keep),
                Step::Cut { after: 5 },
            ]
        );
    }

    #[test]
    fn nothing_is_cut_unless_every_check_passed_but_the_fence_stays() {
        let r = rejoin(9);
        let heard = r.answer(forked(5, Some(6))).expect("newer");
        let (plan, why) = r.plan(heard, facts(9)).expect_err("differs");
        assert_eq!(plan.steps, vec![Step::Fence { epoch: T1 }]);
        assert!(matches!(
            why,
            RejoinRefusal::ForkFrameDiffers { seq: 5, .. }
        ));
        let heard = r.answer(forked(5, None)).expect("newer");
        let below = LogFacts {
            first: 8,
            ..facts(9)
        };
        assert!(matches!(
            r.plan(heard, below),
            Err((_, RejoinRefusal::ForkBelowFloor { .. }))
        ));
        let store = LogFacts {
            first: 2,
            store_applied: 8,
            store_frames_past_fork: true,
            ..facts(9)
        };
        assert!(matches!(
            r.plan(heard, store),
            Err((_, RejoinRefusal::StoreNotRebuildable { .. }))
        ));
        // An erased frame at the fork matches whatever the primary holds.
        let erased = LogFacts {
            fork_frame: Some((0, true)),
            ..facts(9)
        };
        assert!(r.plan(heard, erased).is_ok());
    }

    #[test]
    fn the_store_moves_back_or_aside_as_its_frames_say() {
        let r = rejoin(9);
        let heard = r.answer(forked(5, None)).expect("newer");
        let step = |applied, own| {
            let f = LogFacts {
                store_applied: applied,
                store_frames_past_fork: own,
                ..facts(9)
            };
            r.plan(heard, f).expect("plan").steps[2]
        };
        assert_eq!(step(5, false), Step::Store(StoreStep::Keep));
        assert_eq!(step(8, false), Step::Store(StoreStep::Rewind { from: 8 }));
        assert_eq!(step(8, true), Step::Store(StoreStep::SetAside));
    }

    #[test]
    fn a_box_no_newer_is_refused_and_a_prefix_cuts_nothing() {
        let r = rejoin(9);
        let welcome = |epoch| {
            Some(PrimaryMsg::Welcome {
                version: PROTOCOL_VERSION,
                history: [1; 16],
                from: 10,
                head: 12,
                first: 1,
                epochs: EpochHistory::single(epoch),
            })
        };
        assert_eq!(
            r.answer(welcome(0)),
            Err(RejoinRefusal::NotNewer { theirs: 0, ours: 0 })
        );
        let heard = r.answer(welcome(T1)).expect("newer");
        assert_eq!(
            r.plan(heard, facts(9)).expect("plan").steps,
            vec![Step::Fence { epoch: T1 }]
        );
        assert!(matches!(
            r.answer(Some(PrimaryMsg::Refuse(Refusal::Timeout))),
            Err(RejoinRefusal::Refused(Refusal::Timeout))
        ));
    }
}
