//! The archive's head record: how far the archive of one log reached,
//! written by the uploader after the objects it names
//! (`<prefix>/heads/<history>.twhead`, an object with no pieces whose
//! footer is a [`HeadInfo`], sealed like the others). A bucket that lost
//! its newest objects, or was rolled back, looks complete to a listing;
//! the head says otherwise:
//!
//! - a restore whose segments end before the head's last frame refuses
//!   by name ([`Error::Shorter`]), or with `--accept-shorter` says
//!   exactly which frames it lost;
//! - a serving box compares the head with the objects it lists, and holds
//!   retention while frames the head names are in no object; one whose
//!   own record of the head is newer than the bucket's (rolled back or
//!   deleted) says so, and the uploader writes it again. That record is
//!   kept in the data directory ([`HeadMemory`], `ARCHIVE_HEAD`), so a
//!   head lost while both boxes were down is found at their next start.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;

use super::archiver::Archiver;
use super::bucket::Bucket;
use super::codec::{ArchiveKey, Codec};
use super::names::{epochs_through, lineage};
use super::object::{
    Content, HeadInfo, ObjectReader, ObjectWriter, Trailer, PIECE_LEN, TRAILER_LEN,
};
use super::restore::Until;
use super::seen::covered;
use super::Error;
use crate::repl::epochs::EpochStart;
use crate::storage::{StdStorage, Storage};

/// A head record larger than this is refused unread: it lists no pieces,
/// only its log's epochs.
const MAX_HEAD_LEN: u64 = 1 << 20;

/// Write `info` as the head record of its log.
pub async fn write_head(bucket: &Bucket, codec: &Codec, info: &HeadInfo) -> Result<(), Error> {
    let key = bucket.head_key(&info.history);
    let w = ObjectWriter::new(codec, PIECE_LEN, &key)?;
    let (bytes, _) = w.finish(Content::Head(info.clone()))?;
    let mut up = bucket.writer(&key);
    up.write(Bytes::from(bytes)).await?;
    up.finish().await?;
    Ok(())
}

/// The head record of the log `history`; None when the bucket holds none.
pub async fn read_head(
    bucket: &Bucket,
    key: Option<&ArchiveKey>,
    history: &[u8; 16],
) -> Result<Option<HeadInfo>, Error> {
    let k = bucket.head_key(history);
    // In one request: the uploader rewrites it while others read it.
    let Some(bytes) = bucket.get_small(&k, MAX_HEAD_LEN).await? else {
        return Ok(None);
    };
    let len = bytes.len() as u64;
    let at = len
        .checked_sub(TRAILER_LEN as u64)
        .ok_or_else(|| Error::Corrupt(format!("{k}: {len} bytes, shorter than a trailer")))?;
    let trailer = Trailer::decode(&bytes[at as usize..]).map_err(|e| e.in_object(&k))?;
    let fr = trailer.footer_range(len).map_err(|e| e.in_object(&k))?;
    let footer = bytes[fr.start as usize..fr.end as usize].to_vec();
    let reader = ObjectReader::open(trailer, footer, key, len, &k).map_err(|e| e.in_object(&k))?;
    match &reader.footer().content {
        Content::Head(h) if h.history == *history => Ok(Some(h.clone())),
        _ => Err(Error::Corrupt(format!("{k}: not this log's head record"))),
    }
}

/// Whether `head` records the life of the log whose newest archived
/// segment was written under `epochs`: the same epochs through the last
/// frame both name.
pub fn same_life(head: &HeadInfo, epochs: &[EpochStart]) -> bool {
    let through = epochs.last().map_or(0, |e| e.first);
    lineage(&head.history, &head.epochs, through) == lineage(&head.history, epochs, through)
}

/// What a restore may reach, from how far the archive's objects reach
/// (`reached`, with the time of the newest mark among them) and its head
/// record: the frames a restore to `until` wants that the head says were
/// archived and are gone. None: nothing it wants is lost.
pub fn lost(
    head: &HeadInfo,
    reached: u64,
    newest_mark_ms: Option<u64>,
    until: Until,
) -> Option<(u64, u64)> {
    if head.last <= reached {
        return None;
    }
    let want = match until {
        Until::End => head.last,
        Until::Seq(s) => s.min(head.last),
        // Past the newest mark left, the frames of the lost objects
        // were durable by then: they are wanted.
        Until::Time(t) if newest_mark_ms.is_none_or(|m| t > m) => head.last,
        Until::Time(_) => reached,
    };
    (want > reached).then_some((reached + 1, want))
}

/// The first run of frames the head names archived (`first..=last`) that
/// no object of `present` (the objects of this log a box lists) holds.
pub fn gap_below_head(
    head: &HeadInfo,
    present: &super::seen::Known,
    epochs: &[EpochStart],
) -> Option<(u64, u64)> {
    let mut next = head.first;
    for (first, last) in covered(present, &head.history, epochs) {
        if next > head.last {
            break;
        }
        if last < next {
            continue;
        }
        if first > next {
            return Some((next, (first - 1).min(head.last)));
        }
        next = last + 1;
    }
    (next <= head.last).then_some((next, head.last))
}

/// This box's record of the archive's head, in its data directory.
#[derive(Debug)]
pub struct HeadMemory {
    path: PathBuf,
    fs: Arc<dyn Storage>,
}

impl HeadMemory {
    pub fn at(dir: &Path) -> HeadMemory {
        Self::at_with(StdStorage::shared(), dir)
    }

    /// [`HeadMemory::at`] through `fs`.
    pub fn at_with(fs: Arc<dyn Storage>, dir: &Path) -> HeadMemory {
        HeadMemory {
            path: dir.join(crate::layout::ARCHIVE_HEAD_FILE),
            fs,
        }
    }

    /// The head this box last wrote or read for the log `history`. A
    /// record of another log (the data directory was filled anew) is
    /// none; one that does not read is refused by name: it is what finds
    /// a rolled-back bucket, and must not be quietly forgotten.
    pub fn load(&self, history: &[u8; 16]) -> Result<Option<HeadInfo>, Error> {
        let bytes = match self.fs.read(&self.path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(Error::Io(format!("{}: {e}", self.path.display()))),
        };
        let info: HeadInfo = serde_json::from_slice(&bytes).map_err(|e| {
            Error::Corrupt(format!(
                "{}: not a record of the archive's head ({e}); move it away to start without it",
                self.path.display()
            ))
        })?;
        if info.history != *history {
            tracing::warn!(path = %self.path.display(), "the archive head recorded here is another log's: not used");
            return Ok(None);
        }
        Ok(Some(info))
    }

    /// Keep `info`: written by rename and fsynced.
    pub fn keep(&self, info: &HeadInfo) -> Result<(), Error> {
        let bytes = serde_json::to_vec_pretty(info).map_err(|e| Error::Io(e.to_string()))?;
        crate::publish::publish_with(&*self.fs, &self.path, &bytes)
            .map_err(|e| Error::Io(format!("{}: {e}", self.path.display())))
    }
}

impl Archiver {
    /// Take this box's record of the head from `dir`, and keep it there
    /// from now on. Before the archive's thread starts.
    pub fn remember_head_in(&self, dir: &Path) -> Result<(), Error> {
        let memory = HeadMemory::at(dir);
        let known = memory.load(&self.log.history().0)?;
        if let Ok(mut h) = self.head.lock() {
            *h = known;
        }
        let _ = self.head_memory.set(memory);
        Ok(())
    }

    /// Record `info` as the newest head this box knows, on disk first.
    /// A record that cannot be written is said; the archive goes on (the
    /// bucket's head and objects are as they were), and the next change
    /// tries again.
    fn know_head(&self, info: HeadInfo) {
        self.keep_head(&info);
        if let Ok(mut h) = self.head.lock() {
            *h = Some(info);
        }
    }

    /// Keep `info` on disk only.
    fn keep_head(&self, info: &HeadInfo) {
        if let Some(memory) = self.head_memory.get() {
            if let Err(e) = memory.keep(info) {
                tracing::error!(error = %e, "could not keep this box's record of the archive's head");
                self.set_status(|s| {
                    s.last_error = Some(format!("keeping the archive's head: {e}"))
                });
            }
        }
    }

    /// Read the bucket's head record, and compare it with this box's own
    /// record of it: a bucket head older than what this box wrote or saw
    /// was rolled back (or deleted), and the uploader writes it again.
    pub(super) async fn check_head(&self) {
        let history = self.log.history().0;
        let codec = &self.settings.codec;
        let read = read_head(&self.settings.bucket, codec.key.as_ref(), &history).await;
        let mut note = None;
        let known = self.head.lock().map(|h| h.clone()).unwrap_or(None);
        match read {
            Ok(there) => match (&there, &known) {
                (Some(t), Some(k)) if t.generation < k.generation || t.last < k.last => {
                    note = Some(format!(
                        "the head record in the bucket (generation {}, frame {}) is older than the one this box wrote or saw (generation {}, frame {}): rolled back",
                        t.generation, t.last, k.generation, k.last
                    ));
                }
                (None, Some(k)) => {
                    note = Some(format!(
                        "the head record (generation {}, frame {}) is gone from the bucket",
                        k.generation, k.last
                    ));
                }
                (Some(t), k) if k.as_ref() != Some(t) => self.know_head(t.clone()),
                _ => {}
            },
            // Unreadable (altered, unsealed, another key): named, and
            // written again by the uploader; the archiving goes on.
            Err(e) => note = Some(format!("the head record does not read: {e}")),
        }
        if note.is_some() {
            tracing::error!(note = ?note, "the archive's head record is not what this box recorded");
            self.head_dirty
                .store(true, std::sync::atomic::Ordering::SeqCst);
        }
        self.set_status(|s| {
            s.head_note = match (note, &s.head_note) {
                (Some(n), _) => Some(n),
                // Found as written again: said once more, then cleared.
                (None, Some(was)) if !was.ends_with("; written again") => {
                    Some(format!("{was}; written again"))
                }
                (None, _) => None,
            }
        });
    }

    /// After a pass, the uploader writes a new head when the archive
    /// reaches further than the last one said, or the bucket's was found
    /// rolled back. Never lower than the head before it.
    pub(super) async fn advance_head(&self) -> Result<(), Error> {
        let history = self.log.history().0;
        let epochs = (self.epochs)();
        let present = self.seen.lock().map(|s| s.known()).unwrap_or_default();
        let ours = present
            .iter()
            .filter(|(_, last, lin)| *lin == lineage(&history, &epochs, *last));
        let (lowest, reach) =
            ours.fold((u64::MAX, 0), |(lo, hi), &(f, l, _)| (lo.min(f), hi.max(l)));
        let known = self.head.lock().map(|h| h.clone()).unwrap_or(None);
        let dirty = self.head_dirty.load(std::sync::atomic::Ordering::SeqCst);
        let (first, last, generation) = match &known {
            Some(k) if reach <= k.last && !dirty => return Ok(()),
            Some(k) => (k.first, reach.max(k.last), k.generation + 1),
            None if reach == 0 => return Ok(()),
            None => (lowest, reach, 1),
        };
        let info = HeadInfo {
            history,
            first,
            epochs: epochs_through(&epochs, last),
            last,
            generation,
            unix_ms: crate::repl::unix_ms(),
        };
        // On disk first: the record here may be ahead of the bucket (a
        // crash between the two then reads as a rollback at the next
        // start, and the head is written again) but never behind it, so
        // no generation is written twice.
        self.keep_head(&info);
        write_head(&self.settings.bucket, &self.settings.codec, &info).await?;
        self.head_dirty
            .store(false, std::sync::atomic::Ordering::SeqCst);
        if let Ok(mut h) = self.head.lock() {
            *h = Some(info);
        }
        // The note stays until a listing finds the bucket's head as
        // written: an operator sees what happened.
        Ok(())
    }

    /// The frames the head record names archived that no object this box
    /// lists holds, the head's last frame and its generation.
    pub(super) fn head_gap(&self, present: &super::seen::Known) -> (Option<(u64, u64)>, u64, u64) {
        let epochs = (self.epochs)();
        match self.head.lock().map(|h| h.clone()) {
            Ok(Some(h)) => (gap_below_head(&h, present, &epochs), h.last, h.generation),
            _ => (None, 0, 0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(last: u64) -> HeadInfo {
        HeadInfo {
            history: [1; 16],
            first: 1,
            epochs: vec![EpochStart { epoch: 0, first: 1 }],
            last,
            generation: 3,
            unix_ms: 5_000,
        }
    }

    #[test]
    fn a_restore_wants_what_the_head_names_and_the_objects_lack() {
        let h = head(1495);
        assert_eq!(lost(&h, 1370, Some(4_000), Until::End), Some((1371, 1495)));
        assert_eq!(lost(&h, 1495, Some(4_000), Until::End), None);
        assert_eq!(lost(&h, 1370, None, Until::Seq(1000)), None);
        assert_eq!(lost(&h, 1370, None, Until::Seq(1400)), Some((1371, 1400)));
        assert_eq!(lost(&h, 1370, None, Until::Seq(9000)), Some((1371, 1495)));
        assert_eq!(lost(&h, 1370, Some(4_000), Until::Time(3_000)), None);
        assert_eq!(
            lost(&h, 1370, Some(4_000), Until::Time(4_001)),
            Some((1371, 1495))
        );
    }

    #[test]
    fn the_record_of_the_head_survives_a_reload_and_a_garbled_one_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let m = HeadMemory::at(dir.path());
        assert_eq!(m.load(&[1; 16]).expect("none yet"), None);
        m.keep(&head(70)).expect("keep");
        let again = HeadMemory::at(dir.path());
        assert_eq!(again.load(&[1; 16]).expect("read"), Some(head(70)));
        assert_eq!(again.load(&[2; 16]).expect("another log's"), None);
        std::fs::write(
            dir.path().join(crate::layout::ARCHIVE_HEAD_FILE),
            b"{garbled",
        )
        .expect("write");
        let err = again.load(&[1; 16]).expect_err("garbled");
        assert!(err.to_string().contains("ARCHIVE_HEAD"), "{err}");
    }

    #[test]
    fn frames_the_head_names_in_no_object_are_found() {
        let mut h = head(100);
        let e = h.epochs.clone();
        let lin = |last| lineage(&h.history, &e, last);
        let objects = |v: &[(u64, u64)]| -> crate::archive::seen::Known {
            v.iter().map(|&(f, l)| (f, l, lin(l))).collect()
        };
        let gap = |h: &HeadInfo, v: &[(u64, u64)]| gap_below_head(h, &objects(v), &e);
        assert_eq!(gap(&h, &[(1, 50), (51, 100)]), None);
        assert_eq!(gap(&h, &[(1, 50), (51, 130)]), None);
        assert_eq!(gap(&h, &[(1, 50), (71, 100)]), Some((51, 70)));
        assert_eq!(gap(&h, &[(1, 50)]), Some((51, 100)));
        assert_eq!(gap(&h, &[]), Some((1, 100)), "every object gone");
        // An archive that starts at a snapshot's frame.
        h.first = 40;
        assert_eq!(gap(&h, &[(40, 100)]), None);
        assert_eq!(gap(&h, &[(1, 39), (60, 100)]), Some((40, 59)));
    }
}
