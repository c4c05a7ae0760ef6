//! Cutting the log's tail: `truncate_after`, all or nothing behind the
//! TRUNCATE intent file. A deposed primary rejoining the new primary as its
//! twin cuts the frames past the fork point this way.

use std::sync::atomic::Ordering;

use super::format::{
    self, INDEX_ENTRY_LEN, INDEX_HEADER_LEN, SEGMENT_HEADER_LEN, TRUNCATE_CRC_OFFSET,
    TRUNCATE_END_OFFSET, TRUNCATE_FILE, TRUNCATE_HEAD_OFFSET, TRUNCATE_MAGIC,
    TRUNCATE_SEGMENT_OFFSET,
};
use super::segment::read_header;
use super::storage::{write_atomic, OpenMode};
use super::write::Writer;
use super::{lock, read_lock, write_lock, Error, Log, OpenFiles, Result};

/// What [`Log::truncate_after`] cut.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Truncated {
    /// The head before the cut, counting frames that were staged and not
    /// yet synced (the cut makes them durable and published first).
    pub old_head: u64,
    /// The head after the cut: the sequence asked for.
    pub head: u64,
    /// Frames cut.
    pub frames: u64,
    /// Bytes of the frames cut: their headers, meta and blobs.
    pub bytes: u64,
    /// Segments removed whole (files and indexes).
    pub segments_removed: u64,
    /// The first sequence of the segment that is now the open one.
    pub open_segment: u64,
}

/// A cut under way, as the TRUNCATE intent file names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct TruncateIntent {
    /// The head after the cut: every frame up to it stays.
    pub head: u64,
    /// The first sequence of the segment that keeps the last frames up to
    /// `head` (none when it is `head + 1`); it becomes the open segment.
    pub segment: u64,
    /// Where the kept frames end in that segment: 64 when it keeps none.
    pub end: u64,
}

const INTENT_BODY_LEN: usize = TRUNCATE_CRC_OFFSET - TRUNCATE_HEAD_OFFSET;

impl TruncateIntent {
    pub(super) fn encode(&self) -> Vec<u8> {
        let mut body = [0u8; INTENT_BODY_LEN];
        for (at, v) in [
            (TRUNCATE_HEAD_OFFSET, self.head),
            (TRUNCATE_SEGMENT_OFFSET, self.segment),
            (TRUNCATE_END_OFFSET, self.end),
        ] {
            body[at - TRUNCATE_HEAD_OFFSET..][..8].copy_from_slice(&v.to_le_bytes());
        }
        format::encode_sealed(&TRUNCATE_MAGIC, &body)
    }

    /// The intent a whole file names; None for a torn or foreign one, or
    /// one no cut writes.
    pub(super) fn decode(b: &[u8]) -> Option<TruncateIntent> {
        let body = format::decode_sealed(&TRUNCATE_MAGIC, b, INTENT_BODY_LEN)?;
        let field = |at: usize| format::u64_at(body, at - TRUNCATE_HEAD_OFFSET);
        let intent = TruncateIntent {
            head: field(TRUNCATE_HEAD_OFFSET),
            segment: field(TRUNCATE_SEGMENT_OFFSET),
            end: field(TRUNCATE_END_OFFSET),
        };
        let sane = intent.segment >= 1
            && intent.head.checked_add(1)? >= intent.segment
            && intent.end >= SEGMENT_HEADER_LEN as u64;
        sane.then_some(intent)
    }

    /// The kept segment's index length: its header and one entry per kept
    /// frame.
    fn index_len(&self) -> u64 {
        INDEX_HEADER_LEN as u64 + (self.head + 1 - self.segment) * INDEX_ENTRY_LEN as u64
    }
}

impl Log {
    /// Cut every frame after `seq`: afterwards the head is `seq`, every
    /// frame up to it is exactly as it was (bytes, crc, erase state, index),
    /// every later one is gone from readers, the index and the disk, and the
    /// next append (`append`, `append_at`, `begin`) takes `seq + 1`. What a
    /// deposed primary does to rejoin as a twin, once it has saved the
    /// frames past the fork elsewhere.
    ///
    /// - `seq` equal to the head does nothing and succeeds.
    /// - `seq` past the head is [`Error::PastHead`].
    /// - `seq + 1` below the oldest retained sequence is
    ///   [`Error::BelowFloor`]. `seq == first_seq() - 1` empties the log at
    ///   that position, as [`Log::restart_after`] would, but keeps the
    ///   oldest segment's file (emptied) and the history id.
    ///
    /// The segment holding `seq + 1` keeps the frames before it and becomes
    /// the open segment again, even if it was sealed; every later segment is
    /// removed. A cut on a segment boundary therefore leaves the segment
    /// ending at `seq` sealed and untouched, and the next one open and empty.
    /// Frames staged and not yet synced are made durable and published
    /// first, like [`Log::release`] does, so there is one head to cut from.
    ///
    /// All or nothing: a TRUNCATE intent file naming the cut is published
    /// before anything is cut, and `open` finishes a cut a crash
    /// interrupted. Takes the writer lock like the other retention
    /// operations (refused while released or poisoned; a failure poisons the
    /// log), waits for a streaming append, a group-commit leader's fsync and
    /// an erase, and, as a framed mutation, for a snapshot's freeze. An
    /// append racing the cut whose frame it publishes and then cuts answers
    /// its number or [`Error::PastHead`], depending on when it looks: stop
    /// appending first. No reader serves a cut frame once this returns; an
    /// embedding cursor that had already read one fails with
    /// [`Error::ReaderPastCut`], and so does a [`super::Tail`] that notices
    /// (see there).
    pub fn truncate_after(&self, seq: u64) -> Result<Truncated> {
        // A snapshot copies the store at the head under a freeze: a cut must
        // not move the head below it mid-copy. Entered before the erase
        // lock, since a frozen snapshot's catch-up may itself erase.
        let _mutation = self.mutation();
        let _erase = lock(&self.erase_lock);
        self.as_leader(|| {
            let mut w = lock(&self.writer);
            self.truncate_locked(&mut w, seq)
        })
    }

    fn truncate_locked(&self, w: &mut Writer, seq: u64) -> Result<Truncated> {
        self.check_open_for_retention(w)?;
        let staged = w.next_seq - 1;
        if staged > w.published {
            w.files()?
                .log
                .sync_data()
                .map_err(|e| self.poison_io("truncate: fdatasync staged frames", e))?;
            self.publish_through(w, staged)?;
        }
        let old_head = w.published;
        if seq > old_head {
            return Err(Error::PastHead {
                seq,
                head: old_head,
            });
        }
        let first = self.first_seq();
        if seq.saturating_add(1) < first {
            return Err(Error::BelowFloor { seq, first });
        }
        let nothing = Truncated {
            old_head,
            head: seq,
            open_segment: w.open_first,
            ..Truncated::default()
        };
        if seq == old_head {
            return Ok(nothing);
        }

        // seq < head, so seq + 1 is a frame, in the last segment starting
        // at or before it.
        let segs = read_lock(&self.segs).clone();
        let keep = segs.partition_point(|s| s.first <= seq + 1) - 1;
        let kept_first = segs[keep].first;
        let (_, _, end, _) = self.frame_at(seq + 1)?;
        // A sealed segment is cut to its frames; the open one has them up to
        // the writer's end.
        let frames_end = |i: usize| {
            if i + 1 == segs.len() {
                w.end
            } else {
                segs[i].bytes
            }
        };
        let bytes = (frames_end(keep) - end)
            + (keep + 1..segs.len())
                .map(|i| frames_end(i) - SEGMENT_HEADER_LEN as u64)
                .sum::<u64>();
        let intent = TruncateIntent {
            head: seq,
            segment: kept_first,
            end,
        };

        let done = (|| -> Result<(u64, OpenFiles)> {
            write_atomic(&*self.fs, &self.dir, TRUNCATE_FILE, &intent.encode())?;
            // Readers stop seeing the cut frames before their bytes go: the
            // head first, as a reader checks it before the segments.
            self.head.store(seq, Ordering::SeqCst);
            {
                let mut segs = write_lock(&self.segs);
                segs.truncate(keep + 1);
                if let Some(last) = segs.last_mut() {
                    last.last = seq;
                }
            }
            w.files = None;
            self.reader_files_changed();
            let capacity = self.finish_truncate(&intent)?;
            let files = OpenFiles {
                log: self
                    .fs
                    .open(&self.segment_file(kept_first), OpenMode::Write)?,
                idx: self
                    .fs
                    .open(&self.index_file(kept_first), OpenMode::Write)?,
            };
            Ok((capacity, files))
        })();
        let (capacity, files) = match done {
            Ok(d) => d,
            Err(Error::Io(e)) => return Err(self.poison_io("truncate", e)),
            Err(e) => {
                let _ = self.poison_with(format!("truncate: {e}"));
                return Err(e);
            }
        };

        let generation = w.generation + 1;
        *w = Writer::new(kept_first, end, capacity, Some(files));
        w.generation = generation;
        w.next_seq = seq + 1;
        w.published = seq;
        w.indexed_through = seq;
        if let Some(last) = write_lock(&self.segs).last_mut() {
            last.bytes = capacity;
        }
        self.reader_files_changed();
        // Before the writer lock goes, so before any frame past `seq` is
        // published again: a cursor that sees a newer head sees this too.
        self.note_cut(seq);
        let cut = Truncated {
            frames: old_head - seq,
            bytes,
            segments_removed: (segs.len() - keep - 1) as u64,
            open_segment: kept_first,
            ..nothing
        };
        tracing::warn!(
            dir = %self.dir.display(), old_head, head = seq, frames = cut.frames,
            bytes = cut.bytes, segments_removed = cut.segments_removed,
            "log truncated after {seq}"
        );
        Ok(cut)
    }

    /// Carry out a cut on disk and remove its intent. Every step may be
    /// done again: `open` runs this for an intent a crash left. Answers the
    /// length the kept segment is preallocated to.
    pub(super) fn finish_truncate(&self, intent: &TruncateIntent) -> Result<u64> {
        // Names of either kind: a crash between the two removals of one
        // segment leaves the other file, which must not outlive the cut.
        let mut past: Vec<u64> = self
            .fs
            .list(&self.dir)?
            .iter()
            .filter_map(|n| format::parse_segment_name(n).or_else(|| format::parse_index_name(n)))
            .filter(|&first| first > intent.segment)
            .collect();
        past.sort_unstable();
        past.dedup();
        for &first in past.iter().rev() {
            let idx = self.index_file(first);
            if self.fs.exists(&idx)? {
                // A tail holding this index open finds no frame in it from
                // now on, rather than the cut frames its handle still reaches.
                let f = self.fs.open(&idx, OpenMode::Write)?;
                if f.len()? > INDEX_HEADER_LEN as u64 {
                    f.set_len(INDEX_HEADER_LEN as u64)?;
                }
                self.fs.remove(&idx)?;
            }
            let log = self.segment_file(first);
            if self.fs.exists(&log)? {
                self.fs.remove(&log)?;
            }
        }
        if !past.is_empty() {
            self.fs.sync_dir(&self.dir)?;
        }

        let path = self.segment_file(intent.segment);
        let log = self.fs.open(&path, OpenMode::Write)?;
        let header = read_header(&*log)
            .map_err(|what| Error::Corrupt(format!("{}: {what}", path.display())))?;
        if header.first_seq != intent.segment {
            return Err(Error::Corrupt(format!(
                "{}: header names first sequence {}",
                path.display(),
                header.first_seq
            )));
        }
        let len = log.len()?;
        if len < intent.end {
            return Err(Error::Corrupt(format!(
                "{} is {len} bytes long; the cut keeps frames up to {}",
                path.display(),
                intent.end
            )));
        }
        // The index first: a reader never finds an entry pointing past the
        // kept frames. One shorter than the cut is the open segment's, whose
        // entries `open` rebuilds from its frames.
        let idx_path = self.index_file(intent.segment);
        if self.fs.exists(&idx_path)? {
            let idx = self.fs.open(&idx_path, OpenMode::Write)?;
            if idx.len()? > intent.index_len() {
                idx.set_len(intent.index_len())?;
            }
            idx.sync_all()?;
        }
        // Cut, not zeroed in place: no byte of a cut frame remains for open's
        // scan to read as a frame, and a sealed segment gets its
        // preallocation back as the open one.
        let capacity = header.capacity.max(self.segment_bytes).max(intent.end);
        log.set_len(intent.end)?;
        log.allocate(intent.end, capacity - intent.end)?;
        log.sync_all()?;

        self.fs.remove(&self.dir.join(TRUNCATE_FILE))?;
        self.fs.sync_dir(&self.dir)?;
        Ok(capacity)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::log::format::TRUNCATE_FILE_LEN;

    #[test]
    fn intent_round_trips_at_the_documented_offsets() {
        let intent = TruncateIntent {
            head: 0x0102_0304_0506_0708,
            segment: 0x0102_0304_0506_0700,
            end: 4096,
        };
        let b = intent.encode();
        assert_eq!(b.len(), TRUNCATE_FILE_LEN);
        assert_eq!(b[..8], TRUNCATE_MAGIC);
        assert_eq!(format::u64_at(&b, TRUNCATE_HEAD_OFFSET), intent.head);
        assert_eq!(format::u64_at(&b, TRUNCATE_SEGMENT_OFFSET), intent.segment);
        assert_eq!(format::u64_at(&b, TRUNCATE_END_OFFSET), intent.end);
        let crc = u32::from_le_bytes(b[TRUNCATE_CRC_OFFSET..][..4].try_into().expect("4 bytes"));
        assert_eq!(crc, crc32fast::hash(&b[..TRUNCATE_CRC_OFFSET]));
        assert_eq!(TruncateIntent::decode(&b), Some(intent));
    }

    #[test]
    fn torn_or_impossible_intents_do_not_decode() {
        let good = TruncateIntent {
            head: 9,
            segment: 5,
            end: 200,
        };
        let b = good.encode();
        for cut in 0..b.len() {
            assert_eq!(TruncateIntent::decode(&b[..cut]), None, "torn at {cut}");
        }
        for i in 0..b.len() {
            let mut d = b.clone();
            d[i] ^= 1;
            assert_eq!(TruncateIntent::decode(&d), None, "flip at {i}");
        }
        for bad in [
            TruncateIntent { segment: 0, ..good },
            TruncateIntent {
                segment: 11,
                ..good
            },
            TruncateIntent { end: 63, ..good },
        ] {
            assert_eq!(TruncateIntent::decode(&bad.encode()), None, "{bad:?}");
        }
        let empties = TruncateIntent {
            head: 4,
            segment: 5,
            end: SEGMENT_HEADER_LEN as u64,
        };
        assert_eq!(TruncateIntent::decode(&empties.encode()), Some(empties));
        assert_eq!(empties.index_len(), INDEX_HEADER_LEN as u64);
    }
}
