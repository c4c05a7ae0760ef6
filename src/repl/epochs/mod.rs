//! Epochs: which primary life wrote which frames, and where two logs part.
//!
//! Every life of a primary begins a new epoch, recorded before it serves:
//! a promotion, and a restart of the same box too, as Raft starts a term
//! and Kafka a leader epoch. A primary ships frames before its own sync,
//! so after a power cut its twin may hold frames the primary lost; the
//! primary's next life writes other frames at those sequences, and the
//! epochs, not a crc of the bytes, tell the two apart.
//!
//! An epoch number is a term in its high 32 bits and a life in its low 32
//! ([`EpochName`] prints `term.life`). A promotion takes the next term
//! above every epoch heard of; a restart of a term's primary takes the
//! next life of that term. Only one box is promoted to a term (a
//! promotion goes above every epoch the box heard of, and a box learns of
//! a term before it can follow its primary), so only that box writes
//! under the term's lives, and a promotion outranks every restart of the
//! box it replaced.
//!
//! A box keeps, for each epoch its log holds frames of, the first
//! sequence written under it, as Kafka's leader-epoch checkpoint and
//! PostgreSQL's timeline history do. Two logs that give a sequence the
//! same epoch hold the same frame there; the first sequence where their
//! histories disagree is where they forked. The rules that follow from it
//! live here: the fork point, which frames past it a twin may cut by
//! itself, what a promotion and a restart record, and when a primary is
//! fenced.

use serde::{Deserialize, Serialize};

/// Bits of an epoch number that count the lives of one term.
pub const LIFE_BITS: u32 = 32;
const LIFE_MASK: u64 = (1 << LIFE_BITS) - 1;

/// The term of an epoch: raised by every promotion.
pub fn term(epoch: u64) -> u64 {
    epoch >> LIFE_BITS
}

/// The life of an epoch within its term: raised by every restart.
pub fn life(epoch: u64) -> u64 {
    epoch & LIFE_MASK
}

/// The first epoch of the term after `newest`'s: what a promotion takes.
pub fn next_term(newest: u64) -> u64 {
    (term(newest) + 1) << LIFE_BITS
}

/// An epoch as people read it: `term.life`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EpochName(pub u64);

impl std::fmt::Display for EpochName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}", term(self.0), life(self.0))
    }
}

/// Text that names no epoch.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not an epoch (TERM.LIFE, or a number)")]
pub struct NotAnEpoch(pub String);

impl std::str::FromStr for EpochName {
    type Err = NotAnEpoch;

    /// `term.life`, or the number itself.
    fn from_str(s: &str) -> Result<Self, NotAnEpoch> {
        let bad = || NotAnEpoch(s.to_string());
        match s.split_once('.') {
            Some((t, l)) => {
                let t: u64 = t.parse().map_err(|_| bad())?;
                let l: u64 = l.parse().map_err(|_| bad())?;
                if t > LIFE_MASK || l > LIFE_MASK {
                    return Err(bad());
                }
                Ok(EpochName(t << LIFE_BITS | l))
            }
            None => s.parse().map(EpochName).map_err(|_| bad()),
        }
    }
}

/// The first sequence written under an epoch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EpochStart {
    pub epoch: u64,
    pub first: u64,
}

/// The most epochs a history holds: each promotion adds one, and each
/// restart that was followed by a write, and the handshake carries them
/// all inside one control message. Past it the oldest are dropped: the
/// sequences they covered are then taken as shared with any other log
/// (see [`fork_point`]), which is only ever wrong for a fork older than a
/// thousand lives.
pub const MAX_EPOCHS: usize = 1024;

/// A log's epochs, oldest first: epochs strictly increase and first
/// sequences never decrease. Never empty.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "Vec<EpochStart>", into = "Vec<EpochStart>")]
pub struct EpochHistory {
    starts: Vec<EpochStart>,
}

/// Why a history is refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum EpochError {
    #[error("an epoch history holds at least one epoch")]
    Empty,
    #[error("an epoch history holds at most {MAX_EPOCHS} epochs, not {0}")]
    TooMany(usize),
    #[error("epoch {epoch} starts at sequence 0: sequences start at 1")]
    ZeroFirst { epoch: u64 },
    #[error("epoch {later} follows epoch {earlier}: epochs must increase")]
    NotIncreasing { earlier: u64, later: u64 },
    #[error("epoch {epoch} starts at {first}, before the epoch ahead of it ({before})")]
    StartsBefore { epoch: u64, first: u64, before: u64 },
    #[error("epoch {} is the last life of its term: promote a box to a new term", EpochName(*.epoch))]
    LifeExhausted { epoch: u64 },
}

impl Default for EpochHistory {
    /// A log's history before any promotion: epoch 0 from sequence 1.
    fn default() -> Self {
        EpochHistory {
            starts: vec![EpochStart { epoch: 0, first: 1 }],
        }
    }
}

impl TryFrom<Vec<EpochStart>> for EpochHistory {
    type Error = EpochError;

    fn try_from(starts: Vec<EpochStart>) -> Result<Self, EpochError> {
        if starts.is_empty() {
            return Err(EpochError::Empty);
        }
        if starts.len() > MAX_EPOCHS {
            return Err(EpochError::TooMany(starts.len()));
        }
        for s in &starts {
            if s.first == 0 {
                return Err(EpochError::ZeroFirst { epoch: s.epoch });
            }
        }
        for w in starts.windows(2) {
            if w[1].epoch <= w[0].epoch {
                return Err(EpochError::NotIncreasing {
                    earlier: w[0].epoch,
                    later: w[1].epoch,
                });
            }
            if w[1].first < w[0].first {
                return Err(EpochError::StartsBefore {
                    epoch: w[1].epoch,
                    first: w[1].first,
                    before: w[0].first,
                });
            }
        }
        Ok(EpochHistory { starts })
    }
}

impl From<EpochHistory> for Vec<EpochStart> {
    fn from(h: EpochHistory) -> Self {
        h.starts
    }
}

impl EpochHistory {
    /// A history whose only epoch is `epoch`, from sequence 1.
    pub fn single(epoch: u64) -> Self {
        EpochHistory {
            starts: vec![EpochStart { epoch, first: 1 }],
        }
    }

    pub fn starts(&self) -> &[EpochStart] {
        &self.starts
    }

    /// The newest epoch.
    pub fn current(&self) -> u64 {
        self.starts.last().map_or(0, |s| s.epoch)
    }

    /// The epoch sequence `seq` was written under; `None` before the
    /// oldest epoch's first sequence.
    pub fn epoch_of(&self, seq: u64) -> Option<u64> {
        self.starts
            .iter()
            .rev()
            .find(|s| s.first <= seq)
            .map(|s| s.epoch)
    }

    /// Start `epoch` with the sequence after `head`: a promotion or a
    /// restart. Epochs recorded as starting past `head` are dropped first:
    /// this log holds none of their frames, and its own come next. A full
    /// history drops its oldest epochs.
    pub fn begin(&mut self, epoch: u64, head: u64) -> Result<(), EpochError> {
        let first = head + 1;
        let mut starts: Vec<EpochStart> = self
            .starts
            .iter()
            .copied()
            .filter(|s| s.first < first)
            .collect();
        if let Some(last) = starts.last() {
            if epoch <= last.epoch {
                return Err(EpochError::NotIncreasing {
                    earlier: last.epoch,
                    later: epoch,
                });
            }
        }
        starts.push(EpochStart { epoch, first });
        if starts.len() > MAX_EPOCHS {
            let drop = starts.len() - MAX_EPOCHS;
            tracing::warn!(
                dropped = drop,
                through = starts[drop].first,
                "the epoch history is full: its oldest epochs are dropped"
            );
            starts.drain(..drop);
        }
        *self = EpochHistory::try_from(starts)?;
        Ok(())
    }
}

/// The last sequence two logs share: the highest `s`, at most either
/// head, such that both histories give every sequence up to `s` the same
/// epoch. A frame is the same on both logs up to it (one primary per
/// epoch). A sequence below where a history starts (its oldest epochs
/// dropped, [`MAX_EPOCHS`]) is taken as shared.
pub fn fork_point(a: &EpochHistory, a_head: u64, b: &EpochHistory, b_head: u64) -> u64 {
    let upto = a_head.min(b_head);
    // The epoch of a sequence changes only where an epoch starts, so the
    // first sequence where the two disagree is one of those.
    let mut boundaries: Vec<u64> = a
        .starts
        .iter()
        .chain(b.starts.iter())
        .map(|s| s.first)
        .filter(|&f| f <= upto)
        .collect();
    boundaries.sort_unstable();
    boundaries.dedup();
    boundaries
        .into_iter()
        .find(|&s| match (a.epoch_of(s), b.epoch_of(s)) {
            (Some(x), Some(y)) => x != y,
            _ => false,
        })
        .map_or(upto, |s| s - 1)
}

/// Whether a twin's frames `fork + 1..=twin_head`, past the fork of its
/// history `twin` from the primary's `primary`, are frames that primary
/// lost: written under earlier lives of the term whose life the primary
/// began at `fork + 1`. A primary begins a life at the sequence after the
/// head its log came back at, so every frame an earlier life of it wrote
/// past that head was lost there before it was durable, and was never
/// acknowledged: the twin may save and cut it by itself. Frames of
/// another term past the fork were written by another box, which may have
/// acknowledged them `local`: only an operator's rejoin cuts those.
pub fn lost_on_primary(
    primary: &EpochHistory,
    twin: &EpochHistory,
    fork: u64,
    twin_head: u64,
) -> bool {
    if twin_head <= fork {
        return false;
    }
    let began = match primary.epoch_of(fork + 1) {
        Some(p)
            if primary.starts.contains(&EpochStart {
                epoch: p,
                first: fork + 1,
            }) =>
        {
            p
        }
        _ => return false,
    };
    let Some(at_fork) = twin.epoch_of(fork + 1) else {
        return false;
    };
    std::iter::once(at_fork)
        .chain(
            twin.starts
                .iter()
                .filter(|s| s.first > fork + 1 && s.first <= twin_head)
                .map(|s| s.epoch),
        )
        .all(|e| term(e) == term(began) && e < began)
}

/// A box's epochs as it keeps them: its log's history, the newest epoch
/// it has heard of, and a hold. A primary that heard of an epoch newer
/// than its own was superseded, and one under a hold was told to stop:
/// either way it is fenced.
#[derive(Clone, Debug, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct EpochState {
    pub history: EpochHistory,
    /// The newest epoch heard of, proven by the box that serves it (its
    /// history, over a link that pins its key); at least the history's
    /// current one. Never sent on: a box tells others its own epoch only.
    pub seen: u64,
    /// Who told of `seen`, or why the hold was set, while fenced.
    pub fenced_by: Option<String>,
    /// Fenced without a newer epoch: an operator's fence, or a switchover
    /// whose handover left and whose outcome is not known. Names no epoch,
    /// so it fences this box and nobody else.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held: Option<String>,
    /// The current epoch was begun by a promotion and no process has
    /// served it yet: the first to serve takes it as its life.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub unserved: bool,
}

impl EpochState {
    /// A fresh box: epoch `epoch` from sequence 1, nothing newer heard of.
    pub fn new(epoch: u64) -> Self {
        EpochState {
            history: EpochHistory::single(epoch),
            seen: epoch,
            fenced_by: None,
            held: None,
            unserved: false,
        }
    }

    /// The epoch this box writes under (a primary) or follows (a twin).
    pub fn current(&self) -> u64 {
        self.history.current()
    }

    /// The newest epoch known here.
    pub fn newest(&self) -> u64 {
        self.seen.max(self.current())
    }

    /// The newest epoch known to have been taken by a life: [`newest`](Self::newest),
    /// less an epoch this box's own promotion began and no process served
    /// yet (an arbiter learns of that one only when its life begins).
    pub fn newest_taken(&self) -> u64 {
        if !self.unserved {
            return self.newest();
        }
        let starts = self.history.starts();
        starts.len().checked_sub(2).map_or(0, |i| starts[i].epoch)
    }

    /// A primary holding this state may acknowledge nothing: a newer
    /// epoch exists, so another box is, or was made, the primary; or a
    /// hold stops it.
    pub fn fenced(&self) -> bool {
        self.seen > self.current() || self.held.is_some()
    }

    /// `epoch` was heard of from `by`, which proved it. Answers whether
    /// that fences a primary that was not fenced before. A hold gives way
    /// to the proven fence.
    pub fn hear(&mut self, epoch: u64, by: &str) -> bool {
        if epoch <= self.newest() {
            return false;
        }
        let was = self.fenced();
        self.seen = epoch;
        if self.held.take().is_some() || !was {
            self.fenced_by = Some(by.to_string());
        }
        !was
    }

    /// Fence this primary without naming an epoch, for `why`. Answers
    /// whether it was not fenced before.
    pub fn hold(&mut self, why: &str) -> bool {
        if self.fenced() {
            return false;
        }
        self.held = Some(why.to_string());
        self.fenced_by = Some(why.to_string());
        true
    }

    /// Lift a hold: the box it was for said it did not take over. A fence
    /// by a newer epoch stays. Answers whether a hold was lifted.
    pub fn release(&mut self) -> bool {
        if self.held.take().is_none() {
            return false;
        }
        if !self.fenced() {
            self.fenced_by = None;
        }
        true
    }

    /// A primary starts serving (a start, a restart): a new life of its
    /// term, from `head + 1`, fenced or not (a fenced primary still
    /// streams its log to its twin, and frames it lost in the crash may be
    /// there). The first process to serve a promotion takes the epoch the
    /// promotion began. Answers the epoch it serves; `None` when the next
    /// life would reach the epoch that fenced it, which is then kept.
    pub fn restart(&mut self, head: u64) -> Result<Option<u64>, EpochError> {
        let current = self.current();
        if std::mem::take(&mut self.unserved) {
            return Ok(Some(current));
        }
        if life(current) == LIFE_MASK {
            return Err(EpochError::LifeExhausted { epoch: current });
        }
        let next = current + 1;
        if self.seen > current && next >= self.seen {
            return Ok(None);
        }
        self.history.begin(next, head)?;
        self.seen = self.seen.max(next);
        Ok(Some(next))
    }

    /// Promote: the next term above every epoch heard of, from `head + 1`.
    /// Answers the new epoch.
    pub fn promote(&mut self, head: u64) -> Result<u64, EpochError> {
        let next = next_term(self.newest());
        self.history.begin(next, head)?;
        self.seen = next;
        self.fenced_by = None;
        self.held = None;
        self.unserved = true;
        Ok(next)
    }

    /// A primary starts serving under `epoch`, which the arbiter gave it
    /// (see [`crate::repl::arbiter::begin_life`]): the epoch a promotion
    /// began and no process served yet, or a newer life. Answers the
    /// epoch.
    pub fn restart_at(&mut self, head: u64, epoch: u64) -> Result<u64, EpochError> {
        let current = self.current();
        let unserved = std::mem::take(&mut self.unserved);
        if unserved && epoch == current {
            return Ok(current);
        }
        if epoch <= current {
            return Err(EpochError::NotIncreasing {
                earlier: current,
                later: epoch,
            });
        }
        self.history.begin(epoch, head)?;
        self.seen = self.seen.max(epoch);
        if !self.fenced() {
            self.fenced_by = None;
        }
        Ok(epoch)
    }

    /// Promote to `epoch`, the term the arbiter's transaction gave this
    /// box (see [`crate::repl::arbiter::take_over`]), from `head + 1`.
    pub fn promote_to(&mut self, head: u64, epoch: u64) -> Result<u64, EpochError> {
        let newest = self.newest();
        if epoch <= newest {
            return Err(EpochError::NotIncreasing {
                earlier: newest,
                later: epoch,
            });
        }
        self.history.begin(epoch, head)?;
        self.seen = epoch;
        self.fenced_by = None;
        self.held = None;
        self.unserved = true;
        Ok(epoch)
    }

    /// Follow a primary whose history is `primary`: this log is a prefix
    /// of that primary's (the handshake checked it), so its history is the
    /// primary's. A twin holds nothing back.
    pub fn follow(&mut self, primary: EpochHistory) {
        self.seen = self.seen.max(primary.current());
        self.history = primary;
        self.held = None;
        if !self.fenced() {
            self.fenced_by = None;
        }
    }

    /// The same state from a file written before epochs had terms: every
    /// epoch then was a promotion, so each becomes a term.
    pub fn from_untermed(mut self) -> Result<Self, EpochError> {
        let starts: Vec<EpochStart> = self
            .history
            .starts
            .iter()
            .map(|s| {
                Ok(EpochStart {
                    epoch: s
                        .epoch
                        .checked_mul(1 << LIFE_BITS)
                        .ok_or(EpochError::LifeExhausted { epoch: s.epoch })?,
                    first: s.first,
                })
            })
            .collect::<Result<_, EpochError>>()?;
        self.history = EpochHistory::try_from(starts)?;
        self.seen = self
            .seen
            .checked_mul(1 << LIFE_BITS)
            .ok_or(EpochError::LifeExhausted { epoch: self.seen })?;
        Ok(self)
    }
}

#[cfg(test)]
mod tests;
