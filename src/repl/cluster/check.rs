//! The cluster's checker: every promise of a pair, reviewed against the
//! logs, the writes behind their frames, the acknowledgements and the
//! rejoins of a run, each broken one by name.

use super::*;

/// A promise broken, as [`Cluster::check`] names it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Violation {
    /// Both boxes are primaries of one epoch.
    TwoPrimariesOfOneEpoch { epoch: u64 },
    /// A frame acknowledged `twin` is not in the primary's log.
    TwinAcknowledgedMissing {
        frame: FrameId,
        primary: Side,
        holds: Option<FrameId>,
    },
    /// The boxes hold different writes at one sequence of one epoch.
    SameEpochDifferentFrames { epoch: u64, a: FrameId, b: FrameId },
    /// A twin streams from its primary holding another write than the
    /// primary's at a sequence both hold.
    TwinDiffers { primary: FrameId, twin: FrameId },
    /// A primary acknowledged a write while fenced.
    FencedAcknowledged {
        frame: FrameId,
        by: Side,
        epoch: u64,
        seen: u64,
    },
    /// A rejoin cut frames past the fork that it had not saved.
    CutUnsaved { side: Side, unsaved: Vec<FrameId> },
    /// A rejoin saved other frames than the ones past the fork.
    SavedOtherFrames {
        side: Side,
        past_fork: Vec<FrameId>,
        saved: Vec<FrameId>,
    },
    /// A rejoin's cut left other frames than the shared ones.
    CutElsewhere { side: Side, shared: u64, head: u64 },
    /// An acknowledged write is in no log and no saved tail.
    AcknowledgedLost { frame: FrameId, by: Side },
    /// A primary was told its twin holds more than it does.
    AckPastTwinHead { acked: u64, twin_head: u64 },
    /// A box acknowledged a write after it handed its role over, or after
    /// it was told of a newer primary: two primaries took writes.
    DeposedAcknowledged { frame: FrameId, by: Side },
    /// A box records as heard an epoch that no box ever began: a fence
    /// that no primary proved.
    PhantomEpoch { side: Side, epoch: u64 },
    /// Under an arbiter: a box took an epoch not above every epoch begun
    /// before it, so epochs went backwards.
    EpochNotAbove { side: Side, epoch: u64, newest: u64 },
    /// Under an arbiter: a box acknowledged a write under an epoch below
    /// one another box began: two boxes led at once, or epochs went
    /// backwards and the older life's writes will be cut.
    AckUnderOlderEpoch {
        frame: FrameId,
        by: Side,
        epoch: u64,
        newer: u64,
    },
    /// Under an arbiter: a box refused to record an epoch its
    /// transaction took, leaving the pair headless.
    RefusedWhatItTook { side: Side, epoch: u64, why: String },
}

impl Cluster {
    /// Review the run so far: every promise broken, by name.
    pub fn check(&self) -> Vec<Violation> {
        let mut found = self.seen.clone();
        let logs = [self.frames(Side::A), self.frames(Side::B)];
        let holds = |side: Side, seq: u64| -> Option<FrameId> {
            logs[side.at()].get((seq as usize).checked_sub(1)?).copied()
        };
        let (ea, eb) = (
            self.epochs(Side::A).current(),
            self.epochs(Side::B).current(),
        );
        if self.role(Side::A) == Role::Primary && self.role(Side::B) == Role::Primary && ea == eb {
            found.push(Violation::TwoPrimariesOfOneEpoch { epoch: ea });
        }
        if let Some(primary) = self.serving() {
            for a in self.acknowledged.iter().filter(|a| a.twin) {
                let holds = holds(primary, a.frame.seq);
                if holds != Some(a.frame) {
                    found.push(Violation::TwinAcknowledgedMissing {
                        frame: a.frame,
                        primary,
                        holds,
                    });
                }
            }
        }
        let (ha, hb) = (&self.epochs(Side::A).history, &self.epochs(Side::B).history);
        for (a, b) in logs[0].iter().zip(logs[1].iter()) {
            let epoch = ha.epoch_of(a.seq);
            if epoch == hb.epoch_of(b.seq) && a != b {
                found.push(Violation::SameEpochDifferentFrames {
                    epoch: epoch.unwrap_or(0),
                    a: *a,
                    b: *b,
                });
            }
        }
        if let Some((p, link)) = &self.link {
            if link.streaming() {
                let (pl, tl) = (&logs[p.at()], &logs[p.other().at()]);
                if let Some((primary, twin)) = pl.iter().zip(tl.iter()).find(|(x, y)| x != y) {
                    found.push(Violation::TwinDiffers {
                        primary: *primary,
                        twin: *twin,
                    });
                }
            }
        }
        for a in &self.acknowledged {
            if a.epochs.fenced() {
                found.push(Violation::FencedAcknowledged {
                    frame: a.frame,
                    by: a.by,
                    epoch: a.epochs.current(),
                    seen: a.epochs.seen,
                });
            }
        }
        for r in &self.rejoins {
            found.extend(review_rejoin(r));
        }
        let newest_begun = self.begun.iter().next_back().copied().unwrap_or(0);
        for side in Side::BOTH {
            let seen = self.epochs(side).seen;
            if seen > newest_begun {
                found.push(Violation::PhantomEpoch { side, epoch: seen });
            }
        }
        for a in &self.acknowledged {
            let in_log = Side::BOTH
                .into_iter()
                .any(|s| holds(s, a.frame.seq) == Some(a.frame));
            let in_saved = self
                .rejoins
                .iter()
                .filter_map(|r| r.saved.as_ref())
                .chain(self.set_aside.iter())
                .any(|saved| saved.contains(&a.frame));
            if !in_log && !in_saved {
                found.push(Violation::AcknowledgedLost {
                    frame: a.frame,
                    by: a.by,
                });
            }
        }
        found
    }
}

/// A rejoin against what the two logs held: the frames past their longest
/// common prefix, and only those, are saved, and the cut keeps exactly
/// that prefix. The fork is found here by comparing writes, not from the
/// epochs the cores compared.
fn review_rejoin(r: &RejoinRecord) -> Vec<Violation> {
    let mut found = Vec::new();
    let shared = r
        .before
        .iter()
        .zip(r.new_primary.iter())
        .take_while(|(a, b)| a == b)
        .count();
    let past_fork = &r.before[shared..];
    match &r.saved {
        Some(saved) if saved.as_slice() != past_fork => {
            found.push(Violation::SavedOtherFrames {
                side: r.side,
                past_fork: past_fork.to_vec(),
                saved: saved.clone(),
            });
        }
        None if r.after.is_some() && !past_fork.is_empty() => {
            found.push(Violation::CutUnsaved {
                side: r.side,
                unsaved: past_fork.to_vec(),
            });
        }
        _ => {}
    }
    if let Some(after) = &r.after {
        if after.as_slice() != &r.before[..shared] {
            found.push(Violation::CutElsewhere {
                side: r.side,
                shared: shared as u64,
                head: after.len() as u64,
            });
        }
    }
    found
}
