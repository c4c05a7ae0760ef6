//! The ids of the frames appended once (`Request::Append` with `once`),
//! so that a retry is answered with the frame already in the log instead
//! of a second copy.
//!
//! The log is the record: every such frame carries its id
//! ([`crate::log::once`]), and a primary life starts by reading the ids
//! of its log's newest frames, a promoted twin's too, so a retry across
//! a failover finds the frame the old primary shipped. The table keeps
//! the newest [`KEPT`] ids and knows every id from its `horizon` on; a
//! retry whose original may be older is refused by name, never written
//! twice (`ApiError::RetryUnresolved`).
//!
//! Checked and recorded under one lock with the frame's staging (the
//! appender's group, a streamed append's write), so two copies of one
//! append sent at once are one frame.

use std::collections::{HashMap, VecDeque};

use crate::log::once::{self, AppendId};
use crate::log::{Kind, Log};
use crate::node::api::{ApiError, AppendOnce};

/// The ids kept: about 40 bytes each. Also the frames a primary life
/// reads back when it starts, so it bounds that read too.
pub(super) const KEPT: usize = 1 << 20;

/// Where an append sent once stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Found {
    /// It is in the log at this sequence.
    Written(u64),
    /// It is not: write it.
    New,
}

/// The ids of frames appended once, newest [`KEPT`].
pub(super) struct AppendIds {
    seqs: HashMap<AppendId, u64>,
    /// The same, oldest first, to forget the oldest.
    order: VecDeque<(u64, AppendId)>,
    /// Every frame appended once at or past this sequence is known here.
    horizon: u64,
    kept: usize,
}

impl AppendIds {
    /// The ids of the frames appended once among `log`'s newest `kept`
    /// frames: one sequential read of their headers, and of the meta of
    /// `Once` frames only.
    pub(super) fn read(log: &Log, kept: usize) -> Result<AppendIds, crate::log::Error> {
        let head = log.head_seq();
        let from = log
            .first_seq()
            .max(head.saturating_sub(kept as u64).saturating_add(1));
        let mut ids = AppendIds {
            seqs: HashMap::new(),
            order: VecDeque::new(),
            horizon: from,
            kept,
        };
        let once_kind = Kind::Once.as_u16();
        log.scan_range::<crate::log::Error>(
            from,
            head,
            |kind| kind == once_kind,
            |seq, kind, meta| {
                if kind == once_kind {
                    if let Some((_, id, _)) = once::unwrap(meta) {
                        ids.record(id, seq);
                    }
                }
                Ok(())
            },
        )?;
        Ok(ids)
    }

    /// A table that knows no frame up to `head`: what a life starts with
    /// when its log's ids could not be read. A retry of an append sent
    /// before then is refused, never written twice.
    pub(super) fn from_past(head: u64, kept: usize) -> AppendIds {
        AppendIds {
            seqs: HashMap::new(),
            order: VecDeque::new(),
            horizon: head.saturating_add(1),
            kept,
        }
    }

    /// Where `once` stands: written (at which sequence), new, or a retry
    /// this table cannot resolve.
    pub(super) fn find(&self, once: &AppendOnce) -> Result<Found, ApiError> {
        if let Some(&seq) = self.seqs.get(&once.id()) {
            return Ok(Found::Written(seq));
        }
        // The frame, if written, is past `after`: known here when that
        // is at or past the horizon.
        if once.after.saturating_add(1) >= self.horizon {
            return Ok(Found::New);
        }
        Err(ApiError::RetryUnresolved {
            client_seq: once.seq,
            after: once.after,
            horizon: self.horizon,
        })
    }

    /// `id` was staged at `seq`.
    pub(super) fn record(&mut self, id: AppendId, seq: u64) {
        if self.seqs.insert(id, seq).is_none() {
            self.order.push_back((seq, id));
        }
        while self.order.len() > self.kept {
            if let Some((oldest, id)) = self.order.pop_front() {
                self.seqs.remove(&id);
                self.horizon = self.horizon.max(oldest + 1);
            }
        }
    }

    /// How many ids are kept.
    pub(super) fn len(&self) -> usize {
        self.seqs.len()
    }

    /// The least sequence from which every id is known.
    pub(super) fn horizon(&self) -> u64 {
        self.horizon
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn once(client: u8, seq: u64, after: u64) -> AppendOnce {
        AppendOnce {
            client: [client; 16],
            seq,
            after,
        }
    }

    fn empty(kept: usize) -> AppendIds {
        AppendIds {
            seqs: HashMap::new(),
            order: VecDeque::new(),
            horizon: 1,
            kept,
        }
    }

    #[test]
    fn a_recorded_append_is_found_at_its_sequence_and_others_are_new() {
        let mut ids = empty(8);
        ids.record(once(1, 1, 0).id(), 5);
        assert_eq!(ids.find(&once(1, 1, 0)), Ok(Found::Written(5)));
        assert_eq!(ids.find(&once(1, 2, 0)), Ok(Found::New));
        assert_eq!(ids.find(&once(2, 1, 0)), Ok(Found::New));
    }

    #[test]
    fn a_retry_older_than_what_is_kept_is_refused_not_written_again() {
        let mut ids = empty(2);
        for (i, seq) in [10u64, 11, 12].into_iter().enumerate() {
            ids.record(once(1, i as u64 + 1, 0).id(), seq);
        }
        // The first (at 10) was forgotten: a retry sent after 9 may be it.
        assert_eq!(ids.horizon(), 11);
        assert!(matches!(
            ids.find(&once(1, 1, 9)),
            Err(ApiError::RetryUnresolved { horizon: 11, .. })
        ));
        // Sent after 10 was in the log: it is past it, so it would be known.
        assert_eq!(ids.find(&once(1, 9, 10)), Ok(Found::New));
        assert_eq!(ids.find(&once(1, 3, 0)), Ok(Found::Written(12)));
        assert_eq!(ids.len(), 2);
    }
}
