//! Appending: staging under the writer lock, segment rolls and
//! publication. Group commit, outside the lock, is `group_commit`;
//! streaming appends are `pending`.
//!
//! A frame goes through three states. *Staged*: written whole at the end of
//! the open segment, holding its number, read by nobody. *Durable*: an
//! fdatasync of the segment covered it. *Published*: its index entry is
//! written and the head has moved past it; readers see it. A frame is
//! published only after it is durable, and in order.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::MutexGuard;
use std::time::Duration;

use super::format::{
    self, FrameHeader, FRAME_HEADER_LEN, INDEX_ENTRY_LEN, INDEX_HEADER_LEN, MAX_META_LEN,
    SEGMENT_HEADER_LEN,
};
use super::storage::OpenMode;
use super::{lock, write_lock, Error, Kind, Log, Meta, OpenFiles, Result, Seg};

/// Frames up to this size are copied into one buffer and written with one
/// positioned write; larger blobs are written from the caller's slice.
const COPY_LIMIT: usize = 1 << 20;

/// The writer's state, behind the writer lock.
#[derive(Debug)]
pub(super) struct Writer {
    /// The open segment's files; None while released.
    pub files: Option<OpenFiles>,
    pub open_first: u64,
    /// Staged head + 1: the number the next frame takes.
    pub next_seq: u64,
    /// The published head.
    pub published: u64,
    /// Where the next frame starts in the open segment.
    pub end: u64,
    /// The open segment's allocated length.
    pub capacity: u64,
    /// Offsets of staged frames in the open segment without an index entry,
    /// for sequences `indexed_through + 1` on.
    pub unindexed: Vec<u64>,
    pub indexed_through: u64,
    /// Frames committed with `commit_unsynced` and not yet published.
    pub unsynced: VecDeque<u64>,
    /// Bumped by every roll and restart: a leader that captured a target in
    /// an older generation leaves publication to whoever changed it.
    pub generation: u64,
    /// What `release` left, for `reacquire` to compare.
    pub released_at: Option<ReleasedAt>,
    scratch: Vec<u8>,
}

impl Writer {
    pub fn new(open_first: u64, end: u64, capacity: u64, files: Option<OpenFiles>) -> Writer {
        Writer {
            files,
            open_first,
            next_seq: open_first,
            published: open_first - 1,
            end,
            capacity,
            unindexed: Vec::new(),
            indexed_through: open_first - 1,
            unsynced: VecDeque::new(),
            generation: 0,
            released_at: None,
            scratch: Vec::new(),
        }
    }

    /// A writer with no files, replaced once `open` has recovered.
    pub fn placeholder() -> Writer {
        Writer::new(1, 0, 0, None)
    }

    pub fn files(&self) -> Result<&OpenFiles> {
        self.files.as_ref().ok_or(Error::Released)
    }

    /// Whether the open segment holds any staged frame.
    pub fn open_has_frames(&self) -> bool {
        self.next_seq > self.open_first
    }
}

impl Log {
    /// The writer lock, its wait measured: an uncontended take costs one
    /// try_lock and one histogram bucket.
    pub(super) fn writer_locked(&self) -> MutexGuard<'_, Writer> {
        match self.writer.try_lock() {
            Ok(w) => {
                self.writer_wait.observe(Duration::ZERO);
                w
            }
            Err(std::sync::TryLockError::Poisoned(e)) => e.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => {
                let started = self.clock.now();
                let w = lock(&self.writer);
                self.writer_wait
                    .observe(self.clock.now().saturating_duration_since(started));
                w
            }
        }
    }

    pub(super) fn check_writable(&self, w: &Writer) -> Result<()> {
        self.check_poison()?;
        if w.files.is_none() {
            return Err(Error::Released);
        }
        Ok(())
    }

    pub(super) fn check_frame(&self, kind: u16, meta: &[u8], blob_len: u64) -> Result<()> {
        if kind == 0 {
            return Err(Error::InvalidKind(0));
        }
        if meta.len() > MAX_META_LEN {
            return Err(Error::TooLarge {
                what: "meta",
                len: meta.len() as u64,
                max: MAX_META_LEN as u64,
            });
        }
        if blob_len > super::MAX_BLOB {
            return Err(Error::TooLarge {
                what: "blob",
                len: blob_len,
                max: super::MAX_BLOB,
            });
        }
        Ok(())
    }

    pub(super) fn check_seq(w: &Writer, seq: Option<u64>) -> Result<u64> {
        match seq {
            Some(s) if s != w.next_seq => Err(Error::Gap {
                expected: w.next_seq,
                got: s,
            }),
            _ => Ok(w.next_seq),
        }
    }

    /// Append one transaction with the next sequence number. Durable when
    /// this returns. Refused on a follower.
    pub fn append(&self, kind: Kind, meta: &Meta, blob: &[u8]) -> Result<u64> {
        let seq = self.stage(kind, meta, blob)?;
        self.sync_through(seq)?;
        Ok(seq)
    }

    /// [`Log::append`] with raw kind and meta bytes. Durable when this returns.
    pub fn append_raw(&self, kind: u16, meta: &[u8], blob: &[u8]) -> Result<u64> {
        let seq = self.stage_raw(kind, meta, blob)?;
        self.sync_through(seq)?;
        Ok(seq)
    }

    /// [`Log::append`], but the caller says which sequence number the entry
    /// must get: the twin's path, which holds the primary's numbers. Refuses
    /// anything but head + 1 with [`Error::Gap`]. Works on a follower.
    pub fn append_at(&self, seq: u64, kind: u16, meta: &[u8], blob: &[u8]) -> Result<u64> {
        let seq = {
            let mut w = self.writer_locked();
            self.stage_locked(&mut w, Some(seq), kind, meta, blob)?.seq
        };
        self.sync_through(seq)?;
        Ok(seq)
    }

    /// Stage, at `seq` (head + 1 only), a frame another log erased: kind
    /// Redacted, the meta and the payload crc it kept, and a blob of
    /// `blob_len` bytes that were punched out there and are zeros here (a
    /// hole, never written). Not durable until a sync; works on a follower.
    pub fn stage_erased_at(
        &self,
        seq: u64,
        meta: &[u8],
        blob_len: u64,
        payload_crc: u32,
    ) -> Result<u64> {
        let mut w = self.writer_locked();
        self.check_writable(&w)?;
        self.check_frame(Kind::Redacted.as_u16(), meta, blob_len)?;
        let seq = Self::check_seq(&w, Some(seq))?;
        let header = FrameHeader {
            seq,
            kind: Kind::Redacted.as_u16(),
            meta_len: meta.len() as u32,
            blob_len,
            payload_crc,
        };
        let len = header.frame_len();
        self.make_room(&mut w, len)?;
        let at = w.end;
        let mut head = Vec::with_capacity(FRAME_HEADER_LEN + meta.len());
        head.extend_from_slice(&header.encode());
        head.extend_from_slice(meta);
        w.files()?
            .log
            .write_all_at(&head, at)
            .map_err(|e| self.poison_io("write", e))?;
        w.unindexed.push(at);
        w.unsynced.push_back(seq);
        w.end = at + len;
        w.next_seq = seq + 1;
        Ok(seq)
    }

    /// [`Log::append`] without waiting for durability, for a frame that a
    /// later frame's sync covers. Refused on a follower.
    pub fn stage(&self, kind: Kind, meta: &Meta, blob: &[u8]) -> Result<u64> {
        self.stage_raw(kind.as_u16(), &meta.encode()?, blob)
    }

    /// [`Log::append_raw`] without waiting for durability: the frame is whole
    /// in the segment and holds its number; nobody reads it and it is not
    /// acknowledged until [`Log::sync_through`] (or any later sync) makes it
    /// durable. The caller must not change any state the frame describes
    /// before then: the log is written before the state.
    pub fn stage_raw(&self, kind: u16, meta: &[u8], blob: &[u8]) -> Result<u64> {
        self.stage_framed(kind, meta, blob).map(|h| h.seq)
    }

    /// [`Log::stage_raw`], answering the header the frame was written
    /// with (its seq and payload crc): a primary ships the frame from the
    /// bytes in hand without computing the crc again.
    pub fn stage_framed(&self, kind: u16, meta: &[u8], blob: &[u8]) -> Result<FrameHeader> {
        if self.is_follower() {
            return Err(Error::Follower);
        }
        let mut w = self.writer_locked();
        self.stage_locked(&mut w, None, kind, meta, blob)
    }

    /// Stage frames the caller encoded (the embedding [`crate::wal::Wal`]'s
    /// commit): `frames` holds them back to back, `lens` their lengths, and
    /// the first must carry the next sequence. As many as fit the open
    /// segment go in one positioned write; a roll splits the rest. Answers
    /// the last sequence.
    pub(crate) fn stage_encoded(&self, first_seq: u64, frames: &[u8], lens: &[u64]) -> Result<u64> {
        if self.is_follower() {
            return Err(Error::Follower);
        }
        let mut w = self.writer_locked();
        self.check_writable(&w)?;
        Self::check_seq(&w, Some(first_seq))?;
        let mut start = 0usize;
        let mut i = 0;
        while i < lens.len() {
            self.make_room(&mut w, lens[i])?;
            let at = w.end;
            let mut len = 0u64;
            let mut offsets = Vec::new();
            while i < lens.len() && (len == 0 || at + len + lens[i] <= w.capacity) {
                offsets.push(at + len);
                len += lens[i];
                i += 1;
            }
            let files = w.files()?.clone();
            let bytes = &frames[start..start + len as usize];
            files
                .log
                .write_all_at(bytes, at)
                .map_err(|e| self.poison_io("write", e))?;
            start += len as usize;
            w.end = at + len;
            w.next_seq += offsets.len() as u64;
            w.unindexed.extend_from_slice(&offsets);
        }
        Ok(w.next_seq - 1)
    }

    pub(super) fn stage_locked(
        &self,
        w: &mut Writer,
        seq: Option<u64>,
        kind: u16,
        meta: &[u8],
        blob: &[u8],
    ) -> Result<FrameHeader> {
        self.check_writable(w)?;
        self.check_frame(kind, meta, blob.len() as u64)?;
        let seq = Self::check_seq(w, seq)?;
        let header = FrameHeader {
            seq,
            kind,
            meta_len: meta.len() as u32,
            blob_len: blob.len() as u64,
            payload_crc: format::payload_crc(meta, blob),
        };
        let len = header.frame_len();
        self.make_room(w, len)?;
        let at = w.end;
        let files = w.files()?.clone();
        let written = if len as usize <= COPY_LIMIT {
            let mut buf = std::mem::take(&mut w.scratch);
            buf.clear();
            buf.extend_from_slice(&header.encode());
            buf.extend_from_slice(meta);
            buf.extend_from_slice(blob);
            let r = files.log.write_all_at(&buf, at);
            w.scratch = buf;
            r
        } else {
            let mut head = Vec::with_capacity(FRAME_HEADER_LEN + meta.len());
            head.extend_from_slice(&header.encode());
            head.extend_from_slice(meta);
            // The blob first: a crash between the two writes leaves no
            // header, so no frame.
            files
                .log
                .write_all_at(blob, at + head.len() as u64)
                .and_then(|()| files.log.write_all_at(&head, at))
        };
        written.map_err(|e| self.poison_io("write", e))?;
        w.unindexed.push(at);
        w.end = at + len;
        w.next_seq = seq + 1;
        Ok(header)
    }

    /// Make sure a frame of `len` bytes fits the open segment: grow an empty
    /// segment, or roll to a new one sized for it.
    pub(super) fn make_room(&self, w: &mut Writer, len: u64) -> Result<()> {
        if w.end + len <= w.capacity {
            return Ok(());
        }
        if !w.open_has_frames() {
            let files = w.files()?.clone();
            let grow = w.end + len - w.capacity;
            // A failed allocation changed nothing a reader or a restart
            // sees: with no room for the frame, the append fails and the
            // log goes on.
            files.log.allocate(w.capacity, grow).map_err(|e| {
                if cannot_reserve(&e) {
                    Error::Io(e)
                } else {
                    self.poison_io("allocate", e)
                }
            })?;
            w.capacity += grow;
            self.set_open_bytes(w.capacity);
            return Ok(());
        }
        let capacity = self.segment_bytes.max(SEGMENT_HEADER_LEN as u64 + len);
        self.roll(w, capacity)
    }

    fn set_open_bytes(&self, bytes: u64) {
        if let Some(last) = write_lock(&self.segs).last_mut() {
            last.bytes = bytes;
        }
    }

    /// Seal the open segment and open a new one at the next sequence:
    /// the old segment is cut to its frames and fsynced, its index completed
    /// and fsynced, then the new segment's header and index are written and
    /// fsynced, then the directory; only then does it become the open one.
    /// Everything staged in the old segment is durable and is published.
    pub(super) fn roll(&self, w: &mut Writer, capacity: u64) -> Result<()> {
        let files = w.files()?.clone();
        let started = self.clock.now();
        let seal = files.log.set_len(w.end).and_then(|()| files.log.sync_all());
        seal.map_err(|e| self.poison_io("seal segment", e))?;
        self.sync_time
            .observe(self.clock.now().saturating_duration_since(started));
        let staged = w.next_seq - 1;
        self.write_index(w, staged)?;
        files
            .idx
            .sync_all()
            .map_err(|e| self.poison_io("seal index", e))?;
        let first = w.next_seq;
        let new_files = match self.try_create_segment(first, capacity) {
            Ok(f) => f,
            Err(e) if cannot_reserve(&e) => {
                // The old segment is sealed and durable, cut to its frames,
                // and nothing names the new one: drop it and stay on the
                // old, full, segment. Nothing was lost or half written, so
                // the log is not poisoned: the next append tries again, and
                // succeeds once there is space.
                self.discard_segment(first);
                w.capacity = w.end;
                self.set_open_bytes(w.end);
                self.publish(w, staged);
                tracing::warn!(dir = %self.dir.display(), capacity, error = %e, "no room for a new segment: the append is refused");
                return Err(Error::Io(e));
            }
            Err(e) => {
                // Never left half made, whatever failed: a restart would
                // take it for the open segment.
                self.discard_segment(first);
                return Err(self.poison_io("create segment", e));
            }
        };
        let sealed_bytes = w.end;
        w.files = Some(new_files);
        w.open_first = first;
        w.end = SEGMENT_HEADER_LEN as u64;
        w.capacity = capacity;
        w.unindexed.clear();
        w.indexed_through = first - 1;
        w.generation += 1;
        {
            let mut segs = write_lock(&self.segs);
            if let Some(old) = segs.last_mut() {
                old.bytes = sealed_bytes;
                old.last = staged;
            }
            segs.push(Seg {
                first,
                last: first - 1,
                bytes: capacity,
            });
        }
        // After the segments say which is open, so that nothing opened
        // before is kept.
        self.reader_files_changed();
        self.publish(w, staged);
        Ok(())
    }

    /// Create a segment and its index, durably named, preallocated to
    /// `capacity`.
    pub(super) fn create_segment(&self, first: u64, capacity: u64) -> Result<OpenFiles> {
        self.try_create_segment(first, capacity)
            .map_err(|e| self.poison_io("create segment", e))
    }

    /// Remove a segment and index that [`Log::try_create_segment`] began
    /// and did not finish: no frame is in them and nothing refers to them.
    fn discard_segment(&self, first: u64) {
        for path in [self.segment_file(first), self.index_file(first)] {
            if let Err(e) = self.fs.remove(&path) {
                if e.kind() != std::io::ErrorKind::NotFound {
                    tracing::warn!(path = %path.display(), error = %e, "removing an unfinished segment");
                }
            }
        }
        let _ = self.fs.sync_dir(&self.dir);
    }

    fn try_create_segment(&self, first: u64, capacity: u64) -> std::io::Result<OpenFiles> {
        let log = self
            .fs
            .open(&self.segment_file(first), OpenMode::CreateNew)?;
        let header = format::SegmentHeader {
            first_seq: first,
            history: self.history().0,
            capacity,
        };
        // The room first, then the header: a segment whose capacity could
        // not be reserved never has a header that names it.
        log.allocate(0, capacity)?;
        log.write_all_at(&header.encode(), 0)?;
        log.sync_all()?;
        let idx = self.fs.open(&self.index_file(first), OpenMode::CreateNew)?;
        idx.write_all_at(&format::encode_index_header(first), 0)?;
        idx.sync_all()?;
        self.fs.sync_dir(&self.dir)?;
        Ok(OpenFiles { log, idx })
    }

    /// Write the index entries of staged frames through `target` (all in the
    /// open segment) with one write.
    pub(super) fn write_index(&self, w: &mut Writer, target: u64) -> Result<()> {
        if target <= w.indexed_through {
            return Ok(());
        }
        let n = (target - w.indexed_through) as usize;
        let mut bytes = Vec::with_capacity(n * INDEX_ENTRY_LEN);
        for off in &w.unindexed[..n] {
            bytes.extend_from_slice(&off.to_le_bytes());
        }
        let at = INDEX_HEADER_LEN as u64
            + (w.indexed_through + 1 - w.open_first) * INDEX_ENTRY_LEN as u64;
        w.files()?
            .idx
            .write_all_at(&bytes, at)
            .map_err(|e| self.poison_io("write index", e))?;
        w.unindexed.drain(..n);
        w.indexed_through = target;
        Ok(())
    }

    /// Index and publish every frame through `target`, all durable.
    pub(super) fn publish_through(&self, w: &mut Writer, target: u64) -> Result<()> {
        if target <= w.published {
            return Ok(());
        }
        self.write_index(w, target)?;
        self.publish(w, target);
        Ok(())
    }

    /// Move the head to `target`, whose frames are durable and indexed.
    fn publish(&self, w: &mut Writer, target: u64) {
        if self.publish_quiet(w, target) {
            self.wake_covered(target);
        }
    }

    /// [`Log::publish`] without waking anybody: a group-commit leader wakes
    /// the waiters it covered once it holds no lock. Answers whether the
    /// head moved.
    pub(super) fn publish_quiet(&self, w: &mut Writer, target: u64) -> bool {
        if target <= w.published {
            return false;
        }
        w.published = target;
        while w.unsynced.front().is_some_and(|&s| s <= target) {
            w.unsynced.pop_front();
        }
        if let Some(last) = write_lock(&self.segs).last_mut() {
            last.last = target.max(last.first - 1);
        }
        self.head.store(target, Ordering::SeqCst);
        true
    }
}

/// A reservation the file system refused without writing anything: no
/// room (ENOSPC, EDQUOT: which passes), or a length it cannot hold (EFBIG,
/// EINVAL, or one past `off_t`). The log is not poisoned by it.
fn cannot_reserve(e: &std::io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::ENOSPC | libc::EDQUOT | libc::EFBIG | libc::EINVAL)
    ) || e.kind() == std::io::ErrorKind::InvalidInput
}

/// The open segment as `release` left it.
#[derive(Debug)]
pub(super) struct ReleasedAt {
    pub(super) log_len: u64,
    pub(super) idx_len: u64,
    pub(super) header: Vec<u8>,
    /// The last frame's offset and header bytes, when it has one.
    pub(super) last_frame: Option<(u64, Vec<u8>)>,
}
