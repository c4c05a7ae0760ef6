//! A reader that tails a log from another process while its writer appends.
//!
//! It takes no lock and writes nothing. A frame is visible once its index
//! entry is written, which the writer does only after the frame is durable;
//! an entry caught half written reads as "not yet".
//!
//! A cut (`Log::truncate_after`) never lets a tail serve a cut frame: it
//! empties the index of every segment it removes before the name goes, so a
//! tail holding one open finds nothing there. A tail that had already read
//! past the cut fails with [`Error::ReaderPastCut`] once it notices: when it
//! is caught up in the segment of the frame it read last and that frame is
//! no longer there, when it meets a frame that does not start where that
//! one ended, or when the segment holding its next frame comes before the
//! one it was in. One that sat at the very start of a removed segment, or
//! whose frames were replaced by frames of the same lengths before it
//! looked, goes on at the new frames: a tail cannot see the writer's head,
//! so tails are best reopened around a cut.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::format::{self, FrameHeader, FRAME_HEADER_LEN, INDEX_ENTRY_LEN, INDEX_HEADER_LEN};
use super::storage::{OpenMode, StdStorage, Storage, StorageFile};
use super::{Error, Kind, Result};

/// One frame a [`Tail`] read; borrows the tail's buffer.
#[derive(Debug)]
pub struct TailFrame<'a> {
    pub seq: u64,
    pub kind: u16,
    pub meta: &'a [u8],
    /// Empty for an erased frame.
    pub blob: &'a [u8],
}

/// Where the frame a tail read last is, and its header as read.
#[derive(Clone, Copy, Debug)]
struct LastRead {
    segment: u64,
    offset: u64,
    header: FrameHeader,
}

impl LastRead {
    fn end(&self) -> u64 {
        self.offset + self.header.frame_len()
    }

    /// Whether `now`, read where this frame was, is still this frame. An
    /// erase rewrites a frame in place keeping its number and length, so a
    /// frame erased since it was read is the same frame.
    fn same_as(&self, now: &FrameHeader) -> bool {
        let was = &self.header;
        was.seq == now.seq
            && was.frame_len() == now.frame_len()
            && (now.kind == Kind::Redacted.as_u16()
                || (was.kind, was.meta_len, was.payload_crc)
                    == (now.kind, now.meta_len, now.payload_crc))
    }
}

#[derive(Debug)]
struct TailSegment {
    first: u64,
    log: Arc<dyn StorageFile>,
    idx: Arc<dyn StorageFile>,
}

/// A read-only follower of a log directory, in this process or another.
#[derive(Debug)]
pub struct Tail {
    fs: Arc<dyn Storage>,
    dir: PathBuf,
    next: u64,
    /// Where it started: frames from here to `next - 1` were handed out.
    start: u64,
    /// The frame read last, to tell it from one a cut put in its place.
    last_read: Option<LastRead>,
    seg: Option<TailSegment>,
    body: Vec<u8>,
}

impl Tail {
    /// Tail the log at `dir` from sequence `from` (0: the oldest retained).
    /// Below the oldest retained is [`Error::BelowFloor`].
    pub fn open(dir: impl AsRef<Path>, from: u64) -> Result<Tail> {
        Self::open_in(StdStorage::shared(), dir, from)
    }

    /// [`Tail::open`] on another file system.
    pub fn open_in(fs: Arc<dyn Storage>, dir: impl AsRef<Path>, from: u64) -> Result<Tail> {
        let dir = dir.as_ref().to_path_buf();
        let firsts = Self::firsts(&*fs, &dir)?;
        let oldest = firsts.first().copied().unwrap_or(1);
        let from = if from == 0 { oldest } else { from };
        if from < oldest {
            return Err(Error::BelowFloor {
                seq: from,
                first: oldest,
            });
        }
        Ok(Tail {
            fs,
            dir,
            next: from,
            start: from,
            last_read: None,
            seg: None,
            body: Vec::new(),
        })
    }

    fn firsts(fs: &dyn Storage, dir: &Path) -> Result<Vec<u64>> {
        let mut v: Vec<u64> = fs
            .list(dir)?
            .iter()
            .filter_map(|n| format::parse_segment_name(n))
            .collect();
        v.sort_unstable();
        Ok(v)
    }

    /// The sequence the next frame will have.
    pub fn next_seq(&self) -> u64 {
        self.next
    }

    /// Open the segment that holds `next`, or the one after the current;
    /// `left` is the segment the tail is leaving, when it let go of it.
    fn find_segment(&mut self, left: Option<u64>) -> Result<bool> {
        let firsts = Self::firsts(&*self.fs, &self.dir)?;
        let Some(&first) = firsts.iter().rev().find(|&&f| f <= self.next) else {
            return match firsts.first() {
                Some(&oldest) => Err(Error::BelowFloor {
                    seq: self.next,
                    first: oldest,
                }),
                None => Ok(false),
            };
        };
        let current = left.or_else(|| self.seg.as_ref().map(|s| s.first));
        if self.seg.as_ref().is_some_and(|s| s.first == first) {
            return Ok(true);
        }
        // Segments only ever come after the one being read: one before it
        // holding `next` means a cut removed the segment and what was read.
        if self.has_read() && current.is_some_and(|c| first < c) {
            return Err(self.past_cut());
        }
        let open = |p: PathBuf| self.fs.open(&p, OpenMode::Read);
        let (log, idx) = match (
            open(format::segment_path(&self.dir, first)),
            open(format::index_path(&self.dir, first)),
        ) {
            (Ok(l), Ok(i)) => (l, i),
            // Removed or not yet whole between the listing and the open.
            _ => return Ok(false),
        };
        self.seg = Some(TailSegment { first, log, idx });
        Ok(true)
    }

    /// The next frame, or None when the tail has caught up with the writer
    /// (call again later). The frame is read whole: for frames of any size,
    /// [`Tail::next_checked`] keeps memory to one piece.
    #[allow(clippy::should_implement_trait)] // lends its buffer: not an Iterator
    pub fn next(&mut self) -> Result<Option<TailFrame<'_>>> {
        let Some((h, offset, path)) = self.next_header()? else {
            return Ok(None);
        };
        let Some(seg) = self.seg.as_ref() else {
            return Ok(None);
        };
        let erased = h.kind == Kind::Redacted.as_u16();
        let len = if erased {
            u64::from(h.meta_len)
        } else {
            h.frame_len() - FRAME_HEADER_LEN as u64
        };
        self.body.resize(len as usize, 0);
        seg.log
            .read_exact_at(&mut self.body, offset + FRAME_HEADER_LEN as u64)
            .map_err(|e| Error::corrupt(&path, offset, e))?;
        if !erased && crc32fast::hash(&self.body) != h.payload_crc {
            return Err(Error::corrupt(
                &path,
                offset,
                format!("payload crc of {}", h.seq),
            ));
        }
        let first = seg.first;
        self.advance(first, offset, &h);
        let (meta, blob) = self.body.split_at(h.meta_len as usize);
        Ok(Some(TailFrame {
            seq: h.seq,
            kind: h.kind,
            meta,
            blob,
        }))
    }

    /// The next frame's header, its payload crc checked through a buffer of
    /// one piece (not for an erased frame), without handing over its bytes:
    /// what a check of a log holding blobs of any size needs.
    pub fn next_checked(&mut self) -> Result<Option<FrameHeader>> {
        const PIECE: usize = 1 << 20;
        let Some((h, offset, path)) = self.next_header()? else {
            return Ok(None);
        };
        let Some(seg) = self.seg.as_ref() else {
            return Ok(None);
        };
        if h.kind != Kind::Redacted.as_u16() {
            let mut crc = crc32fast::Hasher::new();
            let body = h.frame_len() - FRAME_HEADER_LEN as u64;
            self.body.resize(PIECE.min(body as usize), 0);
            let mut at = 0u64;
            while at < body {
                let n = (body - at).min(PIECE as u64) as usize;
                seg.log
                    .read_exact_at(&mut self.body[..n], offset + FRAME_HEADER_LEN as u64 + at)
                    .map_err(|e| Error::corrupt(&path, offset, e))?;
                crc.update(&self.body[..n]);
                at += n as u64;
            }
            if crc.finalize() != h.payload_crc {
                return Err(Error::corrupt(
                    &path,
                    offset,
                    format!("payload crc of {}", h.seq),
                ));
            }
        }
        let first = seg.first;
        self.advance(first, offset, &h);
        Ok(Some(h))
    }

    fn advance(&mut self, segment: u64, offset: u64, h: &FrameHeader) {
        self.next += 1;
        self.last_read = Some(LastRead {
            segment,
            offset,
            header: *h,
        });
    }

    /// The header of frame `next`, its offset and segment, once it is there.
    fn next_header(&mut self) -> Result<Option<(FrameHeader, u64, PathBuf)>> {
        let Some(offset) = self.next_offset()? else {
            return Ok(None);
        };
        let Some(seg) = self.seg.as_ref() else {
            return Ok(None);
        };
        // Frames lie back to back: the next one in the segment of the last
        // starts where it ended, unless a cut put others in their place.
        if self
            .last_read
            .is_some_and(|r| r.segment == seg.first && r.end() != offset)
        {
            return Err(self.past_cut());
        }
        let path = format::segment_path(&self.dir, seg.first);
        let mut hb = [0u8; FRAME_HEADER_LEN];
        if seg.log.read_exact_at(&mut hb, offset).is_err() {
            return Ok(None);
        }
        match FrameHeader::decode(&hb).map(FrameHeader::as_read) {
            Ok(h) if h.seq == self.next => Ok(Some((h, offset, path))),
            _ => Ok(None),
        }
    }

    /// The frame read last is still where it was: at the end of what the
    /// tail has read, before it waits or moves on, a cut is found here.
    fn check_last_read(&self) -> Result<()> {
        let (Some(r), Some(seg)) = (self.last_read, self.seg.as_ref()) else {
            return Ok(());
        };
        if r.segment != seg.first {
            return Ok(());
        }
        let at = INDEX_HEADER_LEN as u64 + (r.header.seq - seg.first) * INDEX_ENTRY_LEN as u64;
        let mut b = [0u8; INDEX_ENTRY_LEN];
        if seg.idx.read_at(&mut b, at)? < INDEX_ENTRY_LEN || u64::from_le_bytes(b) != r.offset {
            return Err(self.past_cut());
        }
        let mut hb = [0u8; FRAME_HEADER_LEN];
        let still = seg.log.read_exact_at(&mut hb, r.offset).is_ok()
            && FrameHeader::decode(&hb).is_ok_and(|h| r.same_as(&h.as_read()));
        if !still {
            return Err(self.past_cut());
        }
        Ok(())
    }

    fn has_read(&self) -> bool {
        self.next > self.start
    }

    fn past_cut(&self) -> Error {
        Error::ReaderPastCut {
            read_through: self.next - 1,
        }
    }

    /// The offset of frame `next` once its index entry is there.
    fn next_offset(&mut self) -> Result<Option<u64>> {
        for _ in 0..2 {
            if self.seg.is_none() && !self.find_segment(None)? {
                return Ok(None);
            }
            let Some(seg) = self.seg.as_ref() else {
                return Ok(None);
            };
            let at = INDEX_HEADER_LEN as u64 + (self.next - seg.first) * INDEX_ENTRY_LEN as u64;
            let mut b = [0u8; INDEX_ENTRY_LEN];
            if seg.idx.read_at(&mut b, at)? == INDEX_ENTRY_LEN {
                let offset = u64::from_le_bytes(b);
                return Ok((offset != 0).then_some(offset));
            }
            self.check_last_read()?;
            // Past this segment's index: a roll may have opened the next.
            let current = seg.first;
            if self.last_read.is_none_or(|r| r.segment != current) {
                // Nothing read here yet: a cut may have removed this segment
                // and a new one taken its number, so open it afresh.
                self.seg = None;
            }
            if !self.find_segment(Some(current))?
                || self.seg.as_ref().is_some_and(|s| s.first == current)
            {
                return Ok(None);
            }
        }
        Ok(None)
    }
}
