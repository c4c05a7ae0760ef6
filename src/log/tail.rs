//! A reader that tails a log from another process while its writer appends.
//!
//! It takes no lock and writes nothing. A frame is visible once its index
//! entry is written, which the writer does only after the frame is durable;
//! an entry caught half written reads as "not yet".

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

    /// Open the segment that holds `next`, or the one after the current.
    fn find_segment(&mut self) -> Result<bool> {
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
        if self.seg.as_ref().is_some_and(|s| s.first == first) {
            return Ok(true);
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
        self.next += 1;
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
        self.next += 1;
        Ok(Some(h))
    }

    /// The header of frame `next`, its offset and segment, once it is there.
    fn next_header(&mut self) -> Result<Option<(FrameHeader, u64, PathBuf)>> {
        let Some(offset) = self.next_offset()? else {
            return Ok(None);
        };
        let Some(seg) = self.seg.as_ref() else {
            return Ok(None);
        };
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

    /// The offset of frame `next` once its index entry is there.
    fn next_offset(&mut self) -> Result<Option<u64>> {
        for _ in 0..2 {
            if self.seg.is_none() && !self.find_segment()? {
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
            // Past this segment's index: a roll may have opened the next.
            let current = seg.first;
            if !self.find_segment()? || self.seg.as_ref().is_some_and(|s| s.first == current) {
                return Ok(None);
            }
        }
        Ok(None)
    }
}
