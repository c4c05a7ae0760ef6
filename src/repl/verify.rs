//! Online verify: are the twin's frames the primary's, while both serve?
//! As DRBD's verify does, both sides digest ranges of their logs and the
//! primary compares; a range that differs is split until the first
//! differing frame is named.
//!
//! A range's digest is SHA-256 (the first 16 bytes) over each frame's
//! sequence, kind, epoch (from the box's epoch history), meta and blob, so
//! two frames that share their bytes but were written in different lives
//! of a primary differ. [`Search`] is the primary's side as a pure state
//! machine: what to ask next, and what the answers mean.

use super::epochs::EpochHistory;
use crate::log::{Error as LogError, Log};

/// A range's digest.
pub type Digest = [u8; 16];

/// What reading and digesting one frame costs besides its blob, in bytes
/// of a pace: about a page read and a digest update.
pub const FRAME_COST: u64 = 4096;

/// The most digests one answer carries: 16 KiB, well inside a control
/// message.
pub const MAX_DIGESTS: u64 = 1024;

/// The digests of frames `from..=through` of `log`, one per `step`
/// frames (the last range may be shorter), the epochs from `epochs`.
/// Reads the blobs in pieces; `read(frames, bytes)` is told of each frame
/// begun and each piece read, so the caller can pace the reading by what
/// it costs: a log of small frames costs its frames more than its bytes
/// (see [`FRAME_COST`]).
pub fn digests(
    log: &Log,
    epochs: &EpochHistory,
    from: u64,
    through: u64,
    step: u64,
    mut read: impl FnMut(u64, u64),
) -> Result<Vec<Digest>, LogError> {
    let step = step.max(1);
    let mut out = Vec::new();
    let mut at = from;
    while at <= through {
        let end = at.saturating_add(step - 1).min(through);
        let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
        for seq in at..=end {
            let epoch = epochs.epoch_of(seq).unwrap_or(0);
            read(1, 0);
            // The frame's identity opens its bytes, once.
            let mut tagged = false;
            let loc = log.read_pieces::<LogError>(seq, 1 << 20, |loc, piece, _last| {
                if !tagged {
                    tagged = true;
                    ctx.update(&frame_tag(seq, loc.kind, epoch, &loc.meta, loc.blob_len));
                }
                read(0, piece.len() as u64);
                ctx.update(piece);
                Ok(())
            })?;
            if !tagged {
                ctx.update(&frame_tag(seq, loc.kind, epoch, &loc.meta, loc.blob_len));
            }
        }
        let d = ctx.finish();
        let mut digest = [0u8; 16];
        digest.copy_from_slice(&d.as_ref()[..16]);
        out.push(digest);
        at = end + 1;
    }
    Ok(out)
}

/// What is digested of a frame besides its blob: sequence, kind, epoch,
/// meta (with its length) and blob length.
fn frame_tag(seq: u64, kind: u16, epoch: u64, meta: &[u8], blob_len: u64) -> Vec<u8> {
    let mut t = Vec::with_capacity(34 + meta.len());
    t.extend_from_slice(&seq.to_le_bytes());
    t.extend_from_slice(&kind.to_le_bytes());
    t.extend_from_slice(&epoch.to_le_bytes());
    t.extend_from_slice(&(meta.len() as u64).to_le_bytes());
    t.extend_from_slice(meta);
    t.extend_from_slice(&blob_len.to_le_bytes());
    t
}

/// A question to both sides: the digests of `from..=through`, one per
/// `step` frames.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ask {
    pub from: u64,
    pub through: u64,
    pub step: u64,
}

/// Where a verify got.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Found {
    /// Ask this next.
    Ask(Ask),
    /// Every frame of the range is the same on both boxes.
    Same,
    /// The first frame that differs.
    Differs(u64),
}

/// The primary's side of one verify of `from..=through`.
#[derive(Clone, Debug)]
pub struct Search {
    /// The range still to compare at the coarse step.
    next: u64,
    through: u64,
    coarse: u64,
    /// A range that differed, being split.
    narrowing: Option<Ask>,
    pending: Option<Ask>,
}

impl Search {
    /// Compare `from..=through`, `step` frames per digest at first.
    pub fn new(from: u64, through: u64, step: u64) -> Search {
        Search {
            next: from,
            through,
            coarse: step.max(1),
            narrowing: None,
            pending: None,
        }
    }

    /// What to ask next, or the end.
    pub fn step(&mut self) -> Found {
        if let Some(p) = self.pending {
            return Found::Ask(p);
        }
        let ask = match self.narrowing {
            Some(range) => range,
            None => {
                if self.next > self.through {
                    return Found::Same;
                }
                let span = self.coarse.saturating_mul(MAX_DIGESTS);
                let through = self.next.saturating_add(span - 1).min(self.through);
                Ask {
                    from: self.next,
                    through,
                    step: self.coarse,
                }
            }
        };
        self.pending = Some(ask);
        Found::Ask(ask)
    }

    /// Both sides' digests of the pending question.
    pub fn answer(&mut self, ours: &[Digest], theirs: &[Digest]) -> Found {
        let Some(ask) = self.pending.take() else {
            return self.step();
        };
        match ours.iter().zip(theirs.iter()).position(|(a, b)| a != b) {
            None if ours.len() == theirs.len() => {
                self.narrowing = None;
                self.next = ask.through + 1;
                self.step()
            }
            // A side answered fewer ranges: the first it lacks differs.
            None => self.differs_in(ask, ours.len().min(theirs.len())),
            Some(i) => self.differs_in(ask, i),
        }
    }

    fn differs_in(&mut self, ask: Ask, i: usize) -> Found {
        let from = ask.from + i as u64 * ask.step;
        if ask.step == 1 {
            return Found::Differs(from);
        }
        let through = from.saturating_add(ask.step - 1).min(ask.through);
        let step = ask.step.div_ceil(MAX_DIGESTS).max(1);
        self.narrowing = Some(Ask {
            from,
            through,
            step,
        });
        self.step()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Digest a model log, one value per frame, the way both sides would.
    fn model(frames: &[u8], ask: Ask) -> Vec<Digest> {
        let mut out = Vec::new();
        let mut at = ask.from;
        while at <= ask.through {
            let end = (at + ask.step - 1).min(ask.through);
            let mut d = [0u8; 16];
            for s in at..=end {
                d[(s % 16) as usize] ^= frames[s as usize - 1].wrapping_add(s as u8);
            }
            out.push(d);
            at = end + 1;
        }
        out
    }

    #[test]
    fn the_search_names_the_first_differing_frame() {
        let ours: Vec<u8> = (0..20_000u32).map(|i| (i % 251) as u8).collect();
        for bad in [1u64, 2, 4096, 4097, 19_999, 20_000] {
            let mut theirs = ours.clone();
            theirs[bad as usize - 1] ^= 0x55;
            theirs[19_999] ^= 0x11; // a later difference too
            let mut s = Search::new(1, 20_000, 64);
            let mut asks = 0;
            let found = loop {
                match s.step() {
                    Found::Ask(a) => {
                        asks += 1;
                        let (o, t) = (model(&ours, a), model(&theirs, a));
                        match s.answer(&o, &t) {
                            Found::Ask(_) => continue,
                            other => break other,
                        }
                    }
                    other => break other,
                }
            };
            assert_eq!(found, Found::Differs(bad), "planted at {bad}");
            assert!(asks <= 4, "{asks} questions");
        }
        let mut same = Search::new(1, 20_000, 64);
        loop {
            match same.step() {
                Found::Ask(a) => {
                    if let Found::Same = same.answer(&model(&ours, a), &model(&ours, a)) {
                        break;
                    }
                }
                Found::Same => break,
                other => panic!("{other:?}"),
            }
        }
    }
}
