//! Reading: whole frames, a frame's blob in pieces, meta scans and the
//! sequential cursor behind `range` and the embedding reader.
//!
//! Readers open a sealed segment's files per call (the open segment's are
//! kept between calls) and never take the writer lock: they
//! resolve a sequence to its segment, read its offset from the index (written
//! only once the frame is durable) and check every crc they can.

use std::io;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::format::{self, FrameHeader, FRAME_HEADER_LEN, INDEX_ENTRY_LEN, INDEX_HEADER_LEN};
use super::segment::SegmentReader;
use super::storage::{OpenMode, StorageFile};
use super::{lock, read_lock, Error, Kind, Log, OpenFiles, Result};

/// One frame, read whole.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    pub seq: u64,
    pub kind: u16,
    pub meta: Vec<u8>,
    /// Empty for an erased frame.
    pub blob: Vec<u8>,
    /// The crc written at the first append, over meta then blob.
    pub payload_crc: u32,
}

impl Entry {
    /// The frame's kind.
    pub fn kind(&self) -> Result<Kind> {
        Kind::from_u16(self.kind)
    }
}

/// A frame's header and meta, and where its blob is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Located {
    pub seq: u64,
    pub kind: u16,
    pub meta: Vec<u8>,
    pub blob_len: u64,
    /// The crc stored in the header; checked by `read_pieces`, handed over
    /// unchecked by `read_pieces_from` past byte 0.
    pub payload_crc: u32,
    /// The segment file holding the frame.
    pub segment: PathBuf,
    /// The blob's offset in that file.
    pub blob_offset: u64,
}

impl Located {
    /// The frame's stored header.
    pub fn header(&self) -> FrameHeader {
        FrameHeader {
            seq: self.seq,
            kind: self.kind,
            meta_len: self.meta.len() as u32,
            blob_len: self.blob_len,
            payload_crc: self.payload_crc,
        }
    }

    /// Whether the frame was erased in place.
    pub fn is_erased(&self) -> bool {
        self.kind == Kind::Redacted.as_u16()
    }
}

fn invalid(msg: String) -> Error {
    Error::Io(io::Error::new(io::ErrorKind::InvalidInput, msg))
}

impl Log {
    /// The first sequence of the segment holding `seq`.
    fn segment_of(&self, seq: u64) -> Result<u64> {
        let head = self.head_seq();
        if seq == 0 || seq > head {
            return Err(Error::PastHead { seq, head });
        }
        let segs = read_lock(&self.segs);
        let first = segs.first().map_or(head + 1, |s| s.first);
        if seq < first {
            return Err(Error::BelowFloor { seq, first });
        }
        let i = segs.partition_point(|s| s.first <= seq) - 1;
        Ok(segs[i].first)
    }

    /// Open a file of a retained segment; a file that retention removed
    /// between the lookup and the open is the floor error it is.
    fn open_retained(&self, path: &std::path::Path, seq: u64) -> Result<Arc<dyn StorageFile>> {
        match self.fs.open(path, OpenMode::Read) {
            Ok(f) => Ok(f),
            Err(e) if e.kind() == io::ErrorKind::NotFound && seq < self.first_seq() => {
                Err(Error::BelowFloor {
                    seq,
                    first: self.first_seq(),
                })
            }
            Err(e) => Err(e.into()),
        }
    }

    /// The index and segment files of segment `first` (which holds `seq`),
    /// opened for reading: the open segment's are kept between reads.
    fn segment_files(
        &self,
        first: u64,
        seq: u64,
    ) -> Result<(Arc<dyn StorageFile>, Arc<dyn StorageFile>)> {
        if let Some((kept, files)) = &*lock(&self.reader_files) {
            if *kept == first {
                return Ok((files.idx.clone(), files.log.clone()));
            }
        }
        let generation = self.reader_files_generation.load(Ordering::SeqCst);
        let idx = self.open_retained(&self.index_file(first), seq)?;
        let log = self.open_retained(&self.segment_file(first), seq)?;
        let open_segment = read_lock(&self.segs)
            .last()
            .is_some_and(|s| s.first == first);
        if open_segment && !self.released.load(Ordering::SeqCst) {
            let mut kept = lock(&self.reader_files);
            // Files opened across a change are used once, never kept.
            if self.reader_files_generation.load(Ordering::SeqCst) == generation {
                *kept = Some((
                    first,
                    OpenFiles {
                        log: log.clone(),
                        idx: idx.clone(),
                    },
                ));
            }
        }
        Ok((idx, log))
    }

    /// The open segment's files changed (a roll, a restart, a truncation,
    /// a release or a reacquire): readers open them afresh.
    pub(super) fn reader_files_changed(&self) {
        self.reader_files_generation.fetch_add(1, Ordering::SeqCst);
        *lock(&self.reader_files) = None;
    }

    /// The segment file, the frame's offset and its decoded header.
    pub(super) fn frame_at(
        &self,
        seq: u64,
    ) -> Result<(Arc<dyn StorageFile>, u64, u64, FrameHeader)> {
        // The files' paths are made only for an error: a read is on every
        // frame's path to the twin, and a path is two allocations.
        let first = self.segment_of(seq)?;
        let (idx, file) = self.segment_files(first, seq)?;
        let mut b = [0u8; INDEX_ENTRY_LEN];
        let at = INDEX_HEADER_LEN as u64 + (seq - first) * INDEX_ENTRY_LEN as u64;
        idx.read_exact_at(&mut b, at).map_err(|e| {
            Error::corrupt(
                &self.index_file(first),
                at,
                format!("index entry of {seq}: {e}"),
            )
        })?;
        let offset = u64::from_le_bytes(b);
        let corrupt = |what: String| Error::corrupt(&self.segment_file(first), offset, what);
        let mut hb = [0u8; FRAME_HEADER_LEN];
        file.read_exact_at(&mut hb, offset)
            .map_err(|e| corrupt(format!("header of {seq}: {e}")))?;
        let h = FrameHeader::decode(&hb)
            .map_err(|e| corrupt(format!("header of {seq}: {e:?}")))?
            .as_read();
        if h.seq != seq {
            return Err(corrupt(format!(
                "frame holds sequence {}, the index says {seq}",
                h.seq
            )));
        }
        Ok((file, first, offset, h))
    }

    /// Read one frame whole, its crc checked (an erased frame has no blob
    /// and is not checked).
    pub fn read(&self, seq: u64) -> Result<Entry> {
        let (file, first, offset, h) = self.frame_at(seq)?;
        let corrupt = |what: String| Error::corrupt(&self.segment_file(first), offset, what);
        let body_len = usize::try_from(h.frame_len() - FRAME_HEADER_LEN as u64)
            .map_err(|_| invalid(format!("frame {seq} is too large to read whole")))?;
        let erased = h.kind == Kind::Redacted.as_u16();
        let want = if erased {
            h.meta_len as usize
        } else {
            body_len
        };
        let mut body = vec![0u8; want];
        file.read_exact_at(&mut body, offset + FRAME_HEADER_LEN as u64)
            .map_err(|e| corrupt(format!("body of {seq}: {e}")))?;
        if !erased && crc32fast::hash(&body) != h.payload_crc {
            return Err(corrupt(format!("payload crc of {seq}")));
        }
        let blob = body.split_off(h.meta_len as usize);
        Ok(Entry {
            seq,
            kind: h.kind,
            meta: body,
            blob,
            payload_crc: h.payload_crc,
        })
    }

    fn locate_in(&self, seq: u64) -> Result<(Arc<dyn StorageFile>, Located)> {
        let (file, first, offset, h) = self.frame_at(seq)?;
        let path = self.segment_file(first);
        let mut meta = vec![0u8; h.meta_len as usize];
        file.read_exact_at(&mut meta, offset + FRAME_HEADER_LEN as u64)
            .map_err(|e| Error::corrupt(&path, offset, format!("meta of {seq}: {e}")))?;
        let loc = Located {
            seq,
            kind: h.kind,
            meta,
            blob_len: h.blob_len,
            payload_crc: h.payload_crc,
            blob_offset: offset + FRAME_HEADER_LEN as u64 + u64::from(h.meta_len),
            segment: path,
        };
        Ok((file, loc))
    }

    /// Read a frame's header and meta, and say where its blob is, so a
    /// caller can stream the blob in chunks.
    pub fn locate_blob(&self, seq: u64) -> Result<Located> {
        Ok(self.locate_in(seq)?.1)
    }

    /// One frame's blob in pieces of at most `piece` bytes, never whole.
    /// `each` gets the header and meta ([`Located`]), one piece, and whether
    /// it is the last. The last piece is handed over only after the payload
    /// crc checked out: a frame that fails it ends in [`Error::Corrupt`] with
    /// every piece but the last delivered. An erased frame is one empty last
    /// piece, unchecked; an empty blob checks the crc over the meta and is
    /// one empty last piece. Memory is one piece, whatever the blob's size.
    pub fn read_pieces<E: From<Error>>(
        &self,
        seq: u64,
        piece: usize,
        each: impl FnMut(&Located, &[u8], bool) -> Result<(), E>,
    ) -> Result<Located, E> {
        self.read_pieces_from(seq, 0, piece, each)
    }

    /// [`Log::read_pieces`] from byte `from` of the blob on: a restore
    /// resuming an entry the receiver holds part of. 0 is `read_pieces`
    /// exactly. Otherwise only the blob from `from` is read and the crc,
    /// which is over all of it, is not checked: the last piece carries the
    /// stored crc in [`Located::payload_crc`], and the receiver checks it
    /// over the entry it put together. `from` at the blob's end is one empty
    /// last piece; past it, or on an erased frame, is refused with an
    /// `InvalidInput` I/O error naming both numbers.
    pub fn read_pieces_from<E: From<Error>>(
        &self,
        seq: u64,
        from: u64,
        piece: usize,
        mut each: impl FnMut(&Located, &[u8], bool) -> Result<(), E>,
    ) -> Result<Located, E> {
        if piece == 0 {
            return Err(invalid("a piece of 0 bytes".into()).into());
        }
        let mut reader = self.blob_reader_from(seq, from)?;
        let mut buf = vec![0u8; piece.min(reader.left() as usize)];
        loop {
            let (n, last) = reader.next_piece(&mut buf)?;
            each(reader.located(), &buf[..n], last)?;
            if last {
                return Ok(reader.loc);
            }
        }
    }

    /// A frame's blob to read a piece at a time, as the caller asks for
    /// each ([`BlobReader`]), from byte `from` on (with the crc checks and
    /// refusals of [`Log::read_pieces_from`]).
    pub fn blob_reader_from(&self, seq: u64, from: u64) -> Result<BlobReader> {
        let (file, loc) = self.locate_in(seq)?;
        if loc.is_erased() {
            if from != 0 {
                return Err(invalid(format!(
                    "frame {seq} is erased: no byte {from} to resume at"
                )));
            }
        } else if from > loc.blob_len {
            return Err(invalid(format!(
                "byte {from} is past the end of frame {seq}'s blob of {} bytes",
                loc.blob_len
            )));
        }
        let crc = (from == 0 && !loc.is_erased()).then(|| {
            let mut crc = crc32fast::Hasher::new();
            crc.update(&loc.meta);
            crc
        });
        let pos = if loc.is_erased() { loc.blob_len } else { from };
        Ok(BlobReader {
            file,
            loc,
            pos,
            crc,
            done: false,
        })
    }
}

/// A frame's blob, read a piece at a time by whoever holds it: between two
/// pieces nothing waits, so a reader that hands each piece to a slow peer
/// parks no thread meanwhile. Memory is the caller's buffer. The last
/// piece is handed out only once the payload crc checked (from byte 0);
/// an erased frame is one empty last piece.
pub struct BlobReader {
    file: Arc<dyn StorageFile>,
    loc: Located,
    pos: u64,
    crc: Option<crc32fast::Hasher>,
    done: bool,
}

impl std::fmt::Debug for BlobReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BlobReader")
            .field("seq", &self.loc.seq)
            .field("pos", &self.pos)
            .finish()
    }
}

impl BlobReader {
    /// The frame's header, meta and place.
    pub fn located(&self) -> &Located {
        &self.loc
    }

    /// Blob bytes not read yet (none for an erased frame).
    pub fn left(&self) -> u64 {
        self.loc.blob_len - self.pos
    }

    /// Read the next piece into `buf`, at most its length: how many bytes,
    /// and whether they are the last (then the crc checked, or the frame is
    /// [`Error::Corrupt`]). Called again after the last, it answers `(0,
    /// true)`.
    pub fn next_piece(&mut self, buf: &mut [u8]) -> Result<(usize, bool)> {
        if self.done {
            return Ok((0, true));
        }
        let n = (buf.len() as u64).min(self.left()) as usize;
        if n == 0 && self.left() > 0 {
            return Err(invalid("a piece of 0 bytes".into()));
        }
        let at = self.loc.blob_offset + self.pos;
        self.file
            .read_exact_at(&mut buf[..n], at)
            .map_err(|e| Error::corrupt(&self.loc.segment, at, e))?;
        self.pos += n as u64;
        let last = self.left() == 0;
        if let Some(crc) = self.crc.as_mut() {
            crc.update(&buf[..n]);
            if last && crc.clone().finalize() != self.loc.payload_crc {
                return Err(Error::corrupt(
                    &self.loc.segment,
                    self.loc.blob_offset,
                    format!("payload crc of {}", self.loc.seq),
                ));
            }
        }
        self.done = last;
        Ok((n, last))
    }
}

impl Log {
    /// Walk every retained frame's header and meta, oldest first, without
    /// its blob: one open and one sequential buffered read per segment, each
    /// blob skipped inside the buffer, one meta buffer reused for every
    /// frame. Bounded by the head at call time; a frame whose header does
    /// not decode, or whose sequence is not the one its position says, is
    /// [`Error::Corrupt`].
    pub fn scan_meta(&self, mut each: impl FnMut(u64, u16, &[u8])) -> Result<()> {
        let mut meta = Vec::new();
        self.walk_segments(|first, last, path, r| {
            for seq in first..=last {
                let h = r.expect_frame(seq, path)?;
                let at = r.pos();
                r.read_into(u64::from(h.meta_len), &mut meta)
                    .map_err(|e| Error::corrupt(path, at, format!("meta of {seq}: {e}")))?;
                r.skip(h.blob_len);
                each(seq, h.kind, &meta);
            }
            Ok(())
        })
    }

    /// Every frame's sequence and kind from `from` through `through`
    /// (bounded by the head), oldest first, reading headers only: one open
    /// and one sequential read per segment, every meta and blob skipped.
    /// What a consumer that acts on a few kinds uses to pass over the rest
    /// without a lookup per frame.
    pub fn scan_kinds<E: From<Error>>(
        &self,
        from: u64,
        through: u64,
        mut each: impl FnMut(u64, u16) -> Result<(), E>,
    ) -> Result<(), E> {
        self.scan_range(from, through, |_| false, |seq, kind, _| each(seq, kind))
    }

    /// [`Log::scan_kinds`], with the meta of the frames whose kind `want`
    /// names (empty for the others): the blobs are skipped inside the
    /// buffer, one meta buffer is reused for every frame.
    pub fn scan_range<E: From<Error>>(
        &self,
        from: u64,
        through: u64,
        want: impl Fn(u16) -> bool,
        mut each: impl FnMut(u64, u16, &[u8]) -> Result<(), E>,
    ) -> Result<(), E> {
        let through = through.min(self.head_seq());
        if from > through {
            return Ok(());
        }
        if from < self.first_seq() {
            return Err(Error::BelowFloor {
                seq: from,
                first: self.first_seq(),
            }
            .into());
        }
        let segs: Vec<(u64, u64)> = read_lock(&self.segs)
            .iter()
            .map(|s| (s.first, s.last.min(through)))
            .filter(|(first, last)| first <= last && *last >= from)
            .collect();
        let mut meta = Vec::new();
        for (first, last) in segs {
            let start = from.max(first);
            let (file, seg_first, offset, _) = self.frame_at(start)?;
            let path = self.segment_file(seg_first);
            let mut r = SegmentReader::new(file, offset).map_err(Error::from)?;
            for seq in start..=last {
                let h = r.expect_frame(seq, &path)?;
                meta.clear();
                if want(h.kind) {
                    let at = r.pos();
                    r.read_into(u64::from(h.meta_len), &mut meta)
                        .map_err(|e| Error::corrupt(&path, at, format!("meta of {seq}: {e}")))?;
                    r.skip(h.blob_len);
                } else {
                    r.skip(u64::from(h.meta_len) + h.blob_len);
                }
                each(seq, h.kind, &meta)?;
            }
        }
        Ok(())
    }

    /// Every retained segment holding a published frame, oldest first, as
    /// `(first, last, path, reader at the first frame)`, bounded by the head
    /// at call time: one open and one sequential buffered read each.
    fn walk_segments(
        &self,
        mut each: impl FnMut(u64, u64, &std::path::Path, &mut SegmentReader) -> Result<()>,
    ) -> Result<()> {
        let head = self.head_seq();
        let segs: Vec<(u64, u64)> = read_lock(&self.segs)
            .iter()
            .map(|s| (s.first, s.last.min(head)))
            .filter(|(first, last)| first <= last)
            .collect();
        for (first, last) in segs {
            let path = self.segment_file(first);
            let file = self.open_retained(&path, first)?;
            let mut r = SegmentReader::new(file, format::SEGMENT_HEADER_LEN as u64)?;
            each(first, last, &path, &mut r)?;
        }
        Ok(())
    }

    /// Read every retained frame and check its crc: the full check that
    /// `open` leaves to the reads (it checks sealed segments in O(1)).
    /// Answers how many frames were checked; the first bad one is
    /// [`Error::Corrupt`].
    pub fn verify(&self) -> Result<u64> {
        let mut checked = 0;
        // One buffer of memory whatever the frames' sizes.
        self.walk_segments(|first, last, path, r| {
            for seq in first..=last {
                let h = r.expect_frame(seq, path)?;
                let at = r.pos();
                let body = h.frame_len() - FRAME_HEADER_LEN as u64;
                if h.kind == Kind::Redacted.as_u16() {
                    r.skip(body);
                } else if r
                    .crc_of(body)
                    .map_err(|e| Error::corrupt(path, at, format!("body of {seq}: {e}")))?
                    != h.payload_crc
                {
                    return Err(Error::corrupt(path, at, format!("payload crc of {seq}")));
                }
                checked += 1;
            }
            Ok(())
        })?;
        Ok(checked)
    }

    /// Read `from..=to` whole (bounded by the head).
    pub fn range(&self, from: u64, to: u64) -> Result<Vec<Entry>> {
        let to = to.min(self.head_seq());
        let mut out = Vec::new();
        if from > to {
            return Ok(out);
        }
        let mut cursor = Cursor::new(self, from)?;
        while cursor.next_seq() <= to {
            match cursor.next_frame()? {
                Some((h, body)) => {
                    let (meta, blob) = body.split_at(h.meta_len as usize);
                    out.push(Entry {
                        seq: h.seq,
                        kind: h.kind,
                        meta: meta.to_vec(),
                        blob: blob.to_vec(),
                        payload_crc: h.payload_crc,
                    });
                }
                None => break,
            }
        }
        Ok(out)
    }
}

/// Frames in order from a sequence on, across segments, through one reused
/// buffer; each read only once the head covers it.
#[derive(Debug)]
pub(crate) struct Cursor<'a> {
    log: &'a Log,
    next: u64,
    /// Where it started: frames from here to `next - 1` were handed out.
    start: u64,
    /// The log's cut count when the cursor last checked it.
    cuts_seen: u64,
    /// The reader over the segment holding `next`, with that segment's first
    /// sequence and the head when its buffer was last filled.
    reader: Option<(u64, SegmentReader, u64)>,
    body: Vec<u8>,
}

impl<'a> Cursor<'a> {
    /// A cursor at `from`; 0 means the oldest retained. Below the floor is
    /// [`Error::BelowFloor`], never a silent jump to the oldest.
    pub fn new(log: &'a Log, from: u64) -> Result<Self> {
        let first = log.first_seq();
        let from = if from == 0 { first } else { from };
        if from < first {
            return Err(Error::BelowFloor { seq: from, first });
        }
        Ok(Cursor {
            log,
            next: from,
            start: from,
            cuts_seen: log.cuts(),
            reader: None,
            body: Vec::new(),
        })
    }

    pub fn next_seq(&self) -> u64 {
        self.next
    }

    /// The next frame's header and body (meta then blob; the blob is empty
    /// for an erased frame), or None at the head.
    pub fn next_frame(&mut self) -> Result<Option<(FrameHeader, &[u8])>> {
        let head = self.log.head_seq();
        // Read after the head: a cut is noted before any frame past it is
        // published again, so a head that covers such a frame brings it.
        let cuts = self.log.cuts();
        if cuts != self.cuts_seen {
            // The buffer may hold bytes of frames the cut removed.
            self.reader = None;
            let lowest = self.log.lowest_cut_since(self.cuts_seen);
            if self.next > self.start && lowest.is_some_and(|h| h < self.next - 1) {
                return Err(Error::ReaderPastCut {
                    read_through: self.next - 1,
                });
            }
            self.cuts_seen = cuts;
        }
        let seq = self.next;
        if seq > head {
            return Ok(None);
        }
        let in_reader = match &self.reader {
            Some((first, _, _)) => {
                let segs = read_lock(&self.log.segs);
                let i = segs.partition_point(|s| s.first <= seq);
                i > 0 && segs[i - 1].first == *first
            }
            None => false,
        };
        if !in_reader {
            let (file, _, offset, _) = self.log.frame_at(seq)?;
            let first = self.log.segment_of(seq)?;
            self.reader = Some((first, SegmentReader::new(file, offset)?, head));
        }
        let Some((first, r, filled_at)) = self.reader.as_mut() else {
            return Ok(None);
        };
        if seq > *filled_at {
            // The buffer may hold zeros read before this frame was written.
            r.refresh_len()?;
            *filled_at = head;
        }
        let path = self.log.segment_file(*first);
        let at = r.pos();
        let h = r.expect_frame(seq, &path)?;
        let body_len = h.frame_len() - FRAME_HEADER_LEN as u64;
        if h.kind == Kind::Redacted.as_u16() {
            r.read_into(u64::from(h.meta_len), &mut self.body)?;
            r.skip(h.blob_len);
        } else {
            r.read_into(body_len, &mut self.body)
                .map_err(|e| Error::corrupt(&path, at, format!("body of {seq}: {e}")))?;
            if crc32fast::hash(&self.body) != h.payload_crc {
                return Err(Error::corrupt(&path, at, format!("payload crc of {seq}")));
            }
        }
        self.next += 1;
        Ok(Some((h, &self.body)))
    }
}
