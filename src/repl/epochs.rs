//! Epochs: which primary wrote which frames, and where two logs part.
//!
//! Every promotion starts a new epoch. A box keeps, for each epoch its log
//! holds frames of, the first sequence written under it, as Kafka's
//! leader-epoch checkpoint and PostgreSQL's timeline history do. One
//! primary serves an epoch, so two logs that give a sequence the same
//! epoch hold the same frame there; the first sequence where their
//! histories disagree is where they forked. The rules that follow from it
//! live here: the fork point, what a promotion records, and when a primary
//! is fenced.

use serde::{Deserialize, Serialize};

/// The first sequence written under an epoch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EpochStart {
    pub epoch: u64,
    pub first: u64,
}

/// The most epochs a history holds: each promotion adds one, and the
/// handshake carries them all inside one control message.
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

    /// Start `epoch` with the sequence after `head`: a promotion. Epochs
    /// recorded as starting past `head` are dropped first: this log holds
    /// none of their frames, and its own come next.
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
        *self = EpochHistory::try_from(starts)?;
        Ok(())
    }
}

/// The last sequence two logs share: the highest `s`, at most either
/// head, such that both histories give every sequence up to `s` the same
/// epoch. A frame is the same on both logs up to it (one primary per
/// epoch); the handshake still checks the frame there by its crc.
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
        .find(|&s| a.epoch_of(s) != b.epoch_of(s))
        .map_or(upto, |s| s - 1)
}

/// A box's epochs as it keeps them: its log's history, and the newest
/// epoch it has heard of. A primary that heard of an epoch newer than its
/// own was superseded: it is fenced.
#[derive(Clone, Debug, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct EpochState {
    pub history: EpochHistory,
    /// The newest epoch heard of, from a twin, a client or the box it
    /// joins; at least the history's current one.
    pub seen: u64,
    /// Who told of `seen`, when it fenced this box.
    pub fenced_by: Option<String>,
}

impl EpochState {
    /// A fresh box: epoch `epoch` from sequence 1, nothing newer heard of.
    pub fn new(epoch: u64) -> Self {
        EpochState {
            history: EpochHistory::single(epoch),
            seen: epoch,
            fenced_by: None,
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

    /// A primary holding this state may acknowledge nothing: a newer
    /// epoch exists, so another box is, or was made, the primary.
    pub fn fenced(&self) -> bool {
        self.seen > self.current()
    }

    /// `epoch` was heard of from `by`. Answers whether that fences a
    /// primary that was not fenced before.
    pub fn hear(&mut self, epoch: u64, by: &str) -> bool {
        if epoch <= self.newest() {
            return false;
        }
        let was = self.fenced();
        self.seen = epoch;
        if !was {
            self.fenced_by = Some(by.to_string());
        }
        !was
    }

    /// The epoch that fences this primary when a switchover's `Handover`
    /// went unanswered: the twin may have promoted itself, which takes an
    /// epoch past this box's current one, so `current + 1` fences. Never a
    /// guess past the newest heard of: once this box follows the new
    /// primary, its Hello tells the newest epoch it heard of, and one that
    /// no box serves would fence that primary.
    pub fn unknown_successor(&self) -> u64 {
        self.current() + 1
    }

    /// Promote: a new epoch above every one heard of, from `head + 1`.
    /// Answers the new epoch.
    pub fn promote(&mut self, head: u64) -> Result<u64, EpochError> {
        let next = self.newest() + 1;
        self.history.begin(next, head)?;
        self.seen = next;
        self.fenced_by = None;
        Ok(next)
    }

    /// Follow a primary whose history is `primary`: this log is a prefix
    /// of that primary's (the handshake checked it), so its history is the
    /// primary's.
    pub fn follow(&mut self, primary: EpochHistory) {
        self.seen = self.seen.max(primary.current());
        self.history = primary;
        if !self.fenced() {
            self.fenced_by = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn h(starts: &[(u64, u64)]) -> EpochHistory {
        EpochHistory::try_from(
            starts
                .iter()
                .map(|&(epoch, first)| EpochStart { epoch, first })
                .collect::<Vec<_>>(),
        )
        .expect("valid history")
    }

    #[test]
    fn the_fork_is_where_the_histories_first_disagree() {
        let old_primary = h(&[(0, 1), (1, 101)]);
        // The twin was promoted at 150 while the old primary wrote to 170.
        let new_primary = h(&[(0, 1), (1, 101), (2, 151)]);
        assert_eq!(fork_point(&new_primary, 400, &old_primary, 170), 150);
        assert_eq!(fork_point(&old_primary, 170, &new_primary, 400), 150);
        // Nothing written past the promotion: nothing to cut.
        assert_eq!(fork_point(&new_primary, 400, &old_primary, 150), 150);
        // A twin behind shares everything it holds.
        assert_eq!(fork_point(&new_primary, 400, &new_primary, 90), 90);
        // Two promotions from one history at different heads.
        let a = h(&[(0, 1), (3, 60)]);
        let b = h(&[(0, 1), (2, 80)]);
        assert_eq!(fork_point(&a, 100, &b, 100), 59);
        // Nothing in common at all.
        assert_eq!(fork_point(&h(&[(1, 1)]), 10, &h(&[(2, 1)]), 10), 0);
    }

    #[test]
    fn a_promotion_drops_epochs_this_log_holds_no_frame_of() {
        let mut followed = h(&[(0, 1), (1, 101)]);
        followed.begin(2, 90).expect("promote");
        assert_eq!(followed, h(&[(0, 1), (2, 91)]));
        assert!(followed.begin(2, 95).is_err(), "epochs only increase");
        let mut fresh = EpochHistory::default();
        fresh.begin(1, 0).expect("promote an empty log");
        assert_eq!(fresh, h(&[(1, 1)]));
    }

    #[test]
    fn a_bad_history_is_refused_by_name() {
        let bad = |v: Vec<EpochStart>| EpochHistory::try_from(v).expect_err("refused");
        assert_eq!(bad(vec![]), EpochError::Empty);
        let s = |epoch, first| EpochStart { epoch, first };
        assert!(matches!(bad(vec![s(0, 0)]), EpochError::ZeroFirst { .. }));
        assert!(matches!(
            bad(vec![s(2, 1), s(2, 5)]),
            EpochError::NotIncreasing { .. }
        ));
        assert!(matches!(
            bad(vec![s(1, 9), s(2, 5)]),
            EpochError::StartsBefore { .. }
        ));
        assert!(matches!(
            bad((0..=MAX_EPOCHS as u64).map(|e| s(e, 1)).collect()),
            EpochError::TooMany(_)
        ));
        // The wire form is checked the same way.
        let bytes = postcard::to_stdvec(&vec![s(3, 1), s(1, 2)]).expect("encode");
        assert!(postcard::from_bytes::<EpochHistory>(&bytes).is_err());
    }

    #[test]
    fn a_newer_epoch_fences_a_primary_until_it_follows_or_is_promoted() {
        let mut st = EpochState::new(1);
        assert!(!st.fenced());
        assert!(st.hear(2, "twin"));
        assert!(st.fenced());
        assert!(!st.hear(2, "client"), "already fenced");
        assert_eq!(st.fenced_by.as_deref(), Some("twin"));
        st.follow(h(&[(0, 1), (1, 5), (2, 40)]));
        assert!(!st.fenced(), "a twin of the new primary");
        let e = st.promote(50).expect("promote");
        assert_eq!(e, 3);
        assert_eq!(
            st.history.starts().last(),
            Some(&EpochStart {
                epoch: 3,
                first: 51
            })
        );
        // Promotion goes above every epoch heard of.
        let mut heard = EpochState::new(1);
        heard.hear(7, "client");
        assert_eq!(heard.promote(3).expect("promote"), 8);
        assert!(!heard.fenced());
    }

    #[test]
    fn an_unanswered_handover_fences_with_no_epoch_past_the_newest_heard_of() {
        let mut old = EpochState::new(0);
        // A client told of the twin's promotion before the switchover gave
        // up waiting for its answer.
        assert!(old.hear(1, "a client"));
        old.hear(old.unknown_successor(), "a switchover");
        assert_eq!(old.newest(), 1, "no phantom epoch 2");
        // Rejoined, it follows the new primary and its Hello tells epoch 1:
        // no newer than the primary's, which it would otherwise fence.
        old.follow(h(&[(0, 1), (1, 4)]));
        assert_eq!(old.newest(), 1);
        assert!(!old.fenced());
        // Unanswered with nothing heard of, it still fences.
        let mut alone = EpochState::new(3);
        assert!(alone.hear(alone.unknown_successor(), "a switchover"));
        assert!(alone.fenced());
    }

    /// Logs as the epochs that wrote each frame: a history of each, and a
    /// reference fork by walking both.
    fn history_of(epochs: &[u64]) -> EpochHistory {
        let mut starts = vec![EpochStart { epoch: 0, first: 1 }];
        for (i, &e) in epochs.iter().enumerate() {
            if e != starts.last().map_or(0, |s| s.epoch) {
                starts.push(EpochStart {
                    epoch: e,
                    first: i as u64 + 1,
                });
            }
        }
        EpochHistory::try_from(starts).expect("increasing")
    }

    proptest! {
        #[test]
        fn the_fork_point_is_the_longest_common_prefix_of_epochs(
            common in proptest::collection::vec(0u64..3, 0..20),
            a_tail in proptest::collection::vec(0u64..3, 0..20),
            b_tail in proptest::collection::vec(0u64..3, 0..20),
        ) {
            // Epochs written frame by frame, never decreasing; each tail
            // after the common prefix runs under its own epochs.
            let mut common: Vec<u64> = common;
            common.sort_unstable();
            let top = common.last().copied().unwrap_or(0);
            let mut a: Vec<u64> = a_tail.iter().map(|e| top + 1 + 2 * e).collect();
            let mut b: Vec<u64> = b_tail.iter().map(|e| top + 2 + 2 * e).collect();
            a.sort_unstable();
            b.sort_unstable();
            let a_log: Vec<u64> = common.iter().chain(a.iter()).copied().collect();
            let b_log: Vec<u64> = common.iter().chain(b.iter()).copied().collect();
            let expected = a_log.iter().zip(b_log.iter()).take_while(|(x, y)| x == y).count() as u64;
            let got = fork_point(&history_of(&a_log), a_log.len() as u64, &history_of(&b_log), b_log.len() as u64);
            prop_assert_eq!(got, expected);
        }
    }
}
