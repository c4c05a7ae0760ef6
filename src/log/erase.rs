//! Erase in place: the frames of named repositories rewritten as
//! `Kind::Redacted`, their meta and blobs punched out and their headers
//! left with nothing of what was erased, in three durable steps per
//! segment, with sequence numbers, offsets and the index untouched.

use std::sync::atomic::Ordering;

use super::format::{self, FrameHeader, FRAME_HEADER_LEN};
use super::segment::SegmentReader;
use super::storage::OpenMode;
use super::{lock, read_lock, Error, Kind, Log, Meta, Result};

/// What an erase did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Erased {
    /// Frames rewritten as erased by this call.
    pub frames: u64,
    /// Frames whose blobs were punched (again, for frames erased before).
    pub punched: u64,
    /// Blob bytes punched.
    pub bytes: u64,
    /// Segments touched.
    pub segments: u64,
}

/// A frame to erase: where it is and its header.
struct Target {
    at: u64,
    header: FrameHeader,
}

impl Log {
    /// Erase every frame before `before` that carries data of one of
    /// `repos`: the Pack, Refs, LfsPut and LfsDelete frames whose meta names
    /// one of them exactly. RepoStore frames stay, and frames at or after
    /// `before` are never touched.
    ///
    /// Per segment, three durable steps: the matching headers are rewritten
    /// as [`Kind::Redacted`] (one fdatasync: from then on every reader reads
    /// them as erased, and a crash leaves erased frames, never a frame whose
    /// checksum fails); their meta and blobs are punched out (zeros where
    /// the file system cannot punch; one fsync); then the headers are
    /// rewritten once more with no meta and the crc of the zeros
    /// ([`FrameHeader::as_read`]), so not even the old crc remains (one
    /// fdatasync). An erased frame whose header still has meta (a crash cut
    /// the erase, or an older version kept it) is a target of every erase
    /// whatever its repository, so the next erase finishes the work.
    /// Appends do not wait for it; one erase runs at a time; it considers
    /// published frames only.
    pub fn erase(&self, before: u64, repos: &[String]) -> Result<Erased> {
        let _one = lock(&self.erase_lock);
        self.check_poison()?;
        if self.is_released() {
            return Err(Error::Released);
        }
        let mut done = Erased::default();
        let limit = before.saturating_sub(1).min(self.head_seq());
        if repos.is_empty() || limit == 0 {
            return Ok(done);
        }
        let plan: Vec<(u64, u64)> = read_lock(&self.segs)
            .iter()
            .filter(|s| s.first <= limit && s.first <= s.last)
            .map(|s| (s.first, s.last.min(limit)))
            .collect();
        for (first, last) in plan {
            let targets = self.erase_targets(first, last, repos)?;
            if targets.is_empty() {
                continue;
            }
            self.erase_segment(first, &targets, &mut done)?;
        }
        if done.segments > 0 {
            tracing::info!(
                dir = %self.dir.display(), before, ?repos, frames = done.frames,
                bytes = done.bytes, segments = done.segments, "erased"
            );
        }
        Ok(done)
    }

    fn erase_targets(&self, first: u64, last: u64, repos: &[String]) -> Result<Vec<Target>> {
        let path = self.segment_file(first);
        let file = self.fs.open(&path, OpenMode::Read)?;
        let mut r = SegmentReader::new(file, format::SEGMENT_HEADER_LEN as u64)?;
        let mut meta = Vec::new();
        let mut targets = Vec::new();
        for seq in first..=last {
            let at = r.pos();
            let header = r.expect_stored_frame(seq, &path)?;
            r.read_into(u64::from(header.meta_len), &mut meta)?;
            r.skip(header.blob_len);
            let unfinished = header.kind == Kind::Redacted.as_u16() && header.meta_len > 0;
            let carries = Kind::from_u16(header.kind).is_ok_and(Kind::carries_repo_data);
            if unfinished
                || carries && Meta::repo_of(&meta).is_ok_and(|repo| repos.iter().any(|r| r == repo))
            {
                targets.push(Target { at, header });
            }
        }
        Ok(targets)
    }

    fn erase_segment(&self, first: u64, targets: &[Target], done: &mut Erased) -> Result<()> {
        let path = self.segment_file(first);
        let file = self.fs.open(&path, OpenMode::Write)?;
        for t in targets
            .iter()
            .filter(|t| t.header.kind != Kind::Redacted.as_u16())
        {
            let redacted = FrameHeader {
                kind: Kind::Redacted.as_u16(),
                ..t.header
            };
            file.write_all_at(&redacted.encode(), t.at)
                .map_err(|e| self.poison_io("erase: rewrite header", e))?;
            done.frames += 1;
        }
        file.sync_data()
            .map_err(|e| self.poison_io("erase: fdatasync headers", e))?;
        self.erase_syncs.fetch_add(1, Ordering::SeqCst);
        for t in targets {
            let body = u64::from(t.header.meta_len) + t.header.blob_len;
            file.punch(t.at + FRAME_HEADER_LEN as u64, body)
                .map_err(|e| self.poison_io("erase: punch meta and blob", e))?;
            done.punched += 1;
            done.bytes += body;
        }
        file.sync_all()
            .map_err(|e| self.poison_io("erase: fsync punches", e))?;
        self.erase_syncs.fetch_add(1, Ordering::SeqCst);
        // Only now, with the bytes gone for good, may the header forget
        // the meta's length: a crash before this leaves a header that
        // still says there is meta, which makes the frame a target again.
        for t in targets {
            let scrubbed = FrameHeader {
                kind: Kind::Redacted.as_u16(),
                ..t.header
            }
            .as_read();
            file.write_all_at(&scrubbed.encode(), t.at)
                .map_err(|e| self.poison_io("erase: scrub header", e))?;
        }
        file.sync_data()
            .map_err(|e| self.poison_io("erase: fdatasync scrubbed headers", e))?;
        self.erase_syncs.fetch_add(1, Ordering::SeqCst);
        done.segments += 1;
        Ok(())
    }
}
