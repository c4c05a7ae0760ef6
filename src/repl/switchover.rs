//! A planned switchover, on the primary, as a pure state machine: writes
//! pause, the ones admitted before finish, the twin acknowledges the head,
//! this box records that it holds its writes (durably: a crash from here
//! on brings it back fenced), and only then does the `Handover` leave.
//! The twin's `Promoted` fences this box for good; its explicit
//! `HandoverRefused` lifts the hold; silence past the deadline keeps it,
//! since the twin may have taken over.
//!
//! Admission and the switchover share one [`Gate`]: a write is admitted
//! only while no switchover pauses writes, and a switchover starts
//! draining only once no write can slip in between its check and its
//! count.
//!
//! The node drives it over tokio and its twin session; the simulated
//! cluster drives the same machine.

use std::time::{Duration, Instant};

/// Writes admitted and a switchover's pause, one state: the check and
/// the count can't be parted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Gate {
    paused: bool,
    writers: usize,
}

/// A write arrived while a switchover pauses writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Paused;

impl Gate {
    /// A write asks in: counted, unless writes are paused.
    pub fn admit(&mut self) -> Result<(), Paused> {
        if self.paused {
            return Err(Paused);
        }
        self.writers += 1;
        Ok(())
    }

    /// An admitted write was answered.
    pub fn leave(&mut self) {
        self.writers = self.writers.saturating_sub(1);
    }

    /// Pause writes for a switchover. Answers false when one pauses them
    /// already.
    pub fn pause(&mut self) -> bool {
        !std::mem::replace(&mut self.paused, true)
    }

    /// Writes go on.
    pub fn resume(&mut self) {
        self.paused = false;
    }

    pub fn paused(&self) -> bool {
        self.paused
    }

    /// Admitted writes not answered yet.
    pub fn writers(&self) -> usize {
        self.writers
    }
}

/// Where a switchover stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stage {
    /// Waiting for admitted writes to finish and the twin to acknowledge
    /// the head.
    Draining,
    /// The hold is being recorded; the handover waits for it.
    Holding {
        head: u64,
    },
    /// The hold is on disk: the `Handover` may leave (`asked`: the driver
    /// was told to send it).
    Held {
        head: u64,
        asked: bool,
    },
    /// The `Handover` left.
    HandedOver {
        head: u64,
    },
    Done,
}

/// What the driver must do next.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SwitchAction {
    /// Record, durably, that this primary holds its writes (an
    /// `EpochState::hold`), then call [`Switchover::held`].
    Hold { why: String },
    /// Send the `Handover` at `head` to the twin; call
    /// [`Switchover::handed_over`] once it was queued.
    Handover { head: u64 },
    /// Lift the hold (the twin refused the handover).
    Release,
    /// The switchover ended; writes resume unless it says otherwise.
    Finish(Outcome),
}

/// How a switchover ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The twin promoted itself to `epoch` at `head`: this box is fenced
    /// by that epoch and follows it.
    Promoted { epoch: u64, head: u64 },
    /// Nothing changed on the twin: writes go on.
    Refused(NotSwitched),
    /// The handover left and no answer came: the twin may have taken
    /// over. This box stays held until an operator knows.
    Unknown { head: u64 },
}

/// Why a switchover changed nothing on the twin.
#[derive(Clone, Debug, thiserror::Error)]
pub enum NotSwitched {
    #[error("writes admitted before it did not finish in time")]
    WritesLingered,
    #[error("the twin did not acknowledge the head {head} in time")]
    TwinBehind { head: u64 },
    #[error("the handover could not be sent in time")]
    HandoverNotSent,
    #[error("recording the hold failed: {0}")]
    HoldFailed(std::sync::Arc<std::io::Error>),
    /// The twin refused, or its session ended first: as the driver heard it.
    #[error("{0}")]
    Twin(String),
}

/// Two reasons are the same when they say the same (an I/O error has no
/// equality of its own).
impl PartialEq for NotSwitched {
    fn eq(&self, other: &Self) -> bool {
        std::mem::discriminant(self) == std::mem::discriminant(other)
            && self.to_string() == other.to_string()
    }
}

impl Eq for NotSwitched {}

/// Why a hold is recorded, as `status` shows it.
pub const HOLD_WHY: &str = "a switchover handed the primary role to the twin: until it answers, or an operator checks whether it promoted itself (then `primary rejoin`) or not (then `primary unfence`), this box takes no write";

/// One switchover; see the module's description.
#[derive(Debug)]
pub struct Switchover {
    stage: Stage,
    deadline: Instant,
    actions: Vec<SwitchAction>,
}

impl Switchover {
    /// Start one, pausing writes at `gate`. `None` when one is under way.
    pub fn start(gate: &mut Gate, now: Instant, wait: Duration) -> Option<Switchover> {
        if !gate.pause() {
            return None;
        }
        Some(Switchover {
            stage: Stage::Draining,
            deadline: now + wait,
            actions: Vec::new(),
        })
    }

    /// When [`Switchover::poll`] must be called at the latest.
    pub fn deadline(&self) -> Instant {
        self.deadline
    }

    /// Whether the `Handover` left: a crash or a lost answer from here on
    /// may have made the twin the primary.
    pub fn handed_over(&self) -> bool {
        matches!(self.stage, Stage::HandedOver { .. })
    }

    fn finish(&mut self, gate: &mut Gate, outcome: Outcome) {
        if !matches!(outcome, Outcome::Unknown { .. } | Outcome::Promoted { .. }) {
            gate.resume();
        }
        self.stage = Stage::Done;
        self.actions.push(SwitchAction::Finish(outcome));
    }

    /// Look at the state: `head` is the log's head, `acked` the twin's
    /// acknowledged head, `streaming` whether a twin streams. Answers the
    /// next actions.
    pub fn poll(
        &mut self,
        gate: &mut Gate,
        head: u64,
        acked: u64,
        streaming: bool,
        now: Instant,
    ) -> Vec<SwitchAction> {
        match self.stage {
            Stage::Draining if now >= self.deadline => {
                let why = if gate.writers() > 0 {
                    NotSwitched::WritesLingered
                } else {
                    NotSwitched::TwinBehind { head }
                };
                self.finish(gate, Outcome::Refused(why));
            }
            Stage::Draining if gate.writers() == 0 && acked >= head && streaming => {
                self.stage = Stage::Holding { head };
                self.actions.push(SwitchAction::Hold {
                    why: HOLD_WHY.to_string(),
                });
            }
            Stage::Held { .. } if now >= self.deadline => {
                self.actions.push(SwitchAction::Release);
                self.finish(gate, Outcome::Refused(NotSwitched::HandoverNotSent));
            }
            Stage::Held { head, asked: false } if streaming => {
                self.stage = Stage::Held { head, asked: true };
                self.actions.push(SwitchAction::Handover { head });
            }
            Stage::HandedOver { head } if now >= self.deadline => {
                self.finish(gate, Outcome::Unknown { head });
            }
            _ => {}
        }
        std::mem::take(&mut self.actions)
    }

    /// The hold is on disk (or it failed: the switchover stops there and
    /// writes go on, the hold lifted). Poll again at once: the handover is
    /// due.
    pub fn held(&mut self, gate: &mut Gate, result: std::io::Result<()>) -> Vec<SwitchAction> {
        if let Stage::Holding { head } = self.stage {
            match result {
                Ok(()) => self.stage = Stage::Held { head, asked: false },
                Err(e) => {
                    self.actions.push(SwitchAction::Release);
                    self.finish(
                        gate,
                        Outcome::Refused(NotSwitched::HoldFailed(std::sync::Arc::new(e))),
                    );
                }
            }
        }
        std::mem::take(&mut self.actions)
    }

    /// The `Handover` was queued to the twin.
    pub fn sent(&mut self) {
        if let Stage::Held { head, .. } = self.stage {
            self.stage = Stage::HandedOver { head };
        }
    }

    /// The twin answered `Promoted` to `epoch`.
    pub fn promoted(&mut self, gate: &mut Gate, epoch: u64) -> Vec<SwitchAction> {
        if let Stage::HandedOver { head } = self.stage {
            self.finish(gate, Outcome::Promoted { epoch, head });
        }
        std::mem::take(&mut self.actions)
    }

    /// The twin answered that it does not take over, or the connection
    /// ended before the `Handover` left.
    pub fn refused(&mut self, gate: &mut Gate, why: String) -> Vec<SwitchAction> {
        let why = NotSwitched::Twin(why);
        match self.stage {
            Stage::HandedOver { .. } | Stage::Held { .. } | Stage::Holding { .. } => {
                self.actions.push(SwitchAction::Release);
                self.finish(gate, Outcome::Refused(why));
            }
            Stage::Draining => self.finish(gate, Outcome::Refused(why)),
            Stage::Done => {}
        }
        std::mem::take(&mut self.actions)
    }

    pub fn done(&self) -> bool {
        self.stage == Stage::Done
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_write_slips_between_the_pause_and_the_count() {
        let mut gate = Gate::default();
        assert_eq!(gate.admit(), Ok(()));
        let now = crate::clock::monotonic();
        let mut sw = Switchover::start(&mut gate, now, Duration::from_secs(1)).expect("start");
        assert!(Switchover::start(&mut gate, now, Duration::from_secs(1)).is_none());
        assert_eq!(gate.admit(), Err(Paused), "paused before anything else");
        // The write admitted before still runs: no hold yet.
        assert!(sw.poll(&mut gate, 5, 5, true, now).is_empty());
        gate.leave();
        let a = sw.poll(&mut gate, 5, 5, true, now);
        assert!(matches!(a.as_slice(), [SwitchAction::Hold { .. }]), "{a:?}");
        // Nothing leaves before the hold is on disk.
        assert!(sw.poll(&mut gate, 5, 5, true, now).is_empty());
        assert!(sw.held(&mut gate, Ok(())).is_empty());
        assert_eq!(
            sw.poll(&mut gate, 5, 5, true, now),
            vec![SwitchAction::Handover { head: 5 }]
        );
        assert!(
            sw.poll(&mut gate, 5, 5, true, now).is_empty(),
            "asked once: the session keeps it"
        );
        sw.sent();
        assert!(sw.handed_over());
        let done = sw.promoted(&mut gate, 7);
        assert_eq!(
            done,
            vec![SwitchAction::Finish(Outcome::Promoted {
                epoch: 7,
                head: 5
            })]
        );
        assert_eq!(gate.admit(), Err(Paused), "a deposed primary takes nothing");
    }

    #[test]
    fn silence_after_the_handover_keeps_the_hold_and_a_refusal_lifts_it() {
        let now = crate::clock::monotonic();
        let wait = Duration::from_millis(100);
        let mut gate = Gate::default();
        let mut sw = Switchover::start(&mut gate, now, wait).expect("start");
        sw.poll(&mut gate, 3, 3, true, now);
        sw.held(&mut gate, Ok(()));
        sw.poll(&mut gate, 3, 3, true, now);
        sw.sent();
        let late = sw.poll(&mut gate, 3, 3, true, now + wait);
        assert_eq!(
            late,
            vec![SwitchAction::Finish(Outcome::Unknown { head: 3 })]
        );
        assert!(gate.paused(), "writes stay held");

        let mut gate = Gate::default();
        let mut sw = Switchover::start(&mut gate, now, wait).expect("start");
        sw.poll(&mut gate, 3, 3, true, now);
        sw.held(&mut gate, Ok(()));
        sw.poll(&mut gate, 3, 3, true, now);
        sw.sent();
        let r = sw.refused(&mut gate, "not streaming".into());
        assert_eq!(r[0], SwitchAction::Release);
        assert!(!gate.paused());
        assert_eq!(gate.admit(), Ok(()));
    }

    #[test]
    fn a_twin_behind_or_a_failed_hold_ends_it_with_writes_going_on() {
        let now = crate::clock::monotonic();
        let wait = Duration::from_millis(100);
        let mut gate = Gate::default();
        let mut sw = Switchover::start(&mut gate, now, wait).expect("start");
        assert!(sw.poll(&mut gate, 9, 4, true, now).is_empty());
        let a = sw.poll(&mut gate, 9, 4, true, now + wait);
        assert!(matches!(
            a.as_slice(),
            [SwitchAction::Finish(Outcome::Refused(_))]
        ));
        assert!(!gate.paused());

        let mut sw = Switchover::start(&mut gate, now, wait).expect("start");
        sw.poll(&mut gate, 9, 9, true, now);
        let a = sw.held(&mut gate, Err(std::io::Error::other("disk full")));
        assert_eq!(a[0], SwitchAction::Release);
        assert!(matches!(a[1], SwitchAction::Finish(Outcome::Refused(_))));
        assert!(!gate.paused());
    }
}
