//! Appending: staging under the writer lock, group commit outside it,
//! streaming appends, segment rolls and publication.
//!
//! A frame goes through three states. *Staged*: written whole at the end of
//! the open segment, holding its number, read by nobody. *Durable*: an
//! fdatasync of the segment covered it. *Published*: its index entry is
//! written and the head has moved past it; readers see it. A frame is
//! published only after it is durable, and in order.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::MutexGuard;
use std::thread::{self, Thread, ThreadId};
use std::time::{Duration, Instant};

use super::format::{
    self, FrameHeader, FRAME_HEADER_LEN, INDEX_ENTRY_LEN, INDEX_HEADER_LEN, MAX_META_LEN,
    SEGMENT_HEADER_LEN,
};
use super::storage::OpenMode;
use super::{lock, write_lock, Error, Kind, Log, Meta, OpenFiles, Result, Seg};

/// Frames up to this size are copied into one buffer and written with one
/// positioned write; larger blobs are written from the caller's slice.
const COPY_LIMIT: usize = 1 << 20;

/// A streaming append starts writeback every this many blob bytes.
const WRITEBACK_EVERY: u64 = 8 << 20;

/// How long a group-commit waiter sleeps before it looks again on its own.
const WAITER_SAFETY_NET: Duration = Duration::from_millis(50);

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
    pub released_at: Option<super::retention::ReleasedAt>,
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

/// What group-commit leaders learn from the fsyncs before theirs.
#[derive(Debug, Default)]
pub(super) struct Pacing {
    /// Threads the next group is expected to hold.
    expected: AtomicU64,
    /// A moving average of the fdatasync time, in nanoseconds.
    fsync_ns: AtomicU64,
}

/// The longest a leader waits for its group.
const MAX_PATIENCE: Duration = Duration::from_micros(500);

impl Pacing {
    fn expected(&self) -> u64 {
        self.expected.load(Ordering::Relaxed)
    }

    fn expect(&self, frames: u64) {
        self.expected.store(frames, Ordering::Relaxed);
    }

    fn fsynced(&self, took: Duration) {
        let ns = took.as_nanos().min(u128::from(u64::MAX)) as u64;
        let old = self.fsync_ns.load(Ordering::Relaxed);
        let avg = if old == 0 { ns } else { old - old / 8 + ns / 8 };
        self.fsync_ns.store(avg, Ordering::Relaxed);
    }

    fn patience(&self) -> Duration {
        Duration::from_nanos(self.fsync_ns.load(Ordering::Relaxed) / 2).min(MAX_PATIENCE)
    }
}

/// Who waits for durability, and whether a leader is in its fsync.
#[derive(Debug, Default)]
pub(super) struct SyncState {
    leader: bool,
    waiters: Vec<(u64, ThreadId, Thread)>,
}

impl Log {
    /// The writer lock, its wait measured: an uncontended take costs one
    /// try_lock and one histogram bucket.
    fn writer_locked(&self) -> MutexGuard<'_, Writer> {
        match self.writer.try_lock() {
            Ok(w) => {
                self.writer_wait.observe(Duration::ZERO);
                w
            }
            Err(std::sync::TryLockError::Poisoned(e)) => e.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => {
                let started = Instant::now();
                let w = lock(&self.writer);
                self.writer_wait.observe(started.elapsed());
                w
            }
        }
    }

    fn check_writable(&self, w: &Writer) -> Result<()> {
        self.check_poison()?;
        if w.files.is_none() {
            return Err(Error::Released);
        }
        Ok(())
    }

    fn check_frame(&self, kind: u16, meta: &[u8]) -> Result<()> {
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
        Ok(())
    }

    fn check_seq(w: &Writer, seq: Option<u64>) -> Result<u64> {
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
            self.stage_locked(&mut w, Some(seq), kind, meta, blob)?
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
        self.check_frame(Kind::Redacted.as_u16(), meta)?;
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
    ) -> Result<u64> {
        self.check_writable(w)?;
        self.check_frame(kind, meta)?;
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
        Ok(seq)
    }

    /// Make sure a frame of `len` bytes fits the open segment: grow an empty
    /// segment, or roll to a new one sized for it.
    fn make_room(&self, w: &mut Writer, len: u64) -> Result<()> {
        if w.end + len <= w.capacity {
            return Ok(());
        }
        if !w.open_has_frames() {
            let files = w.files()?.clone();
            let grow = w.end + len - w.capacity;
            // A failed allocation changed nothing a reader or a restart
            // sees: out of space, the append fails and the log goes on.
            files.log.allocate(w.capacity, grow).map_err(|e| {
                if is_out_of_space(&e) {
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
        let started = Instant::now();
        let seal = files.log.set_len(w.end).and_then(|()| files.log.sync_all());
        seal.map_err(|e| self.poison_io("seal segment", e))?;
        self.sync_time.observe(started.elapsed());
        let staged = w.next_seq - 1;
        self.write_index(w, staged)?;
        files
            .idx
            .sync_all()
            .map_err(|e| self.poison_io("seal index", e))?;
        let first = w.next_seq;
        let new_files = match self.try_create_segment(first, capacity) {
            Ok(f) => f,
            Err(e) if is_out_of_space(&e) => {
                // The old segment is sealed and durable, cut to its frames,
                // and nothing names the new one: drop it and stay on the
                // old, full, segment. Nothing was lost or half written, so
                // the log is not poisoned: the next append tries again, and
                // succeeds once there is space.
                self.discard_segment(first);
                w.capacity = w.end;
                self.set_open_bytes(w.end);
                self.publish(w, staged);
                tracing::warn!(dir = %self.dir.display(), error = %e, "no space for a new segment: appends wait for space");
                return Err(Error::Io(e));
            }
            Err(e) => return Err(self.poison_io("create segment", e)),
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
        log.write_all_at(&header.encode(), 0)?;
        log.allocate(0, capacity)?;
        log.sync_all()?;
        let idx = self.fs.open(&self.index_file(first), OpenMode::CreateNew)?;
        idx.write_all_at(&format::encode_index_header(first), 0)?;
        idx.sync_all()?;
        self.fs.sync_dir(&self.dir)?;
        Ok(OpenFiles { log, idx })
    }

    /// Write the index entries of staged frames through `target` (all in the
    /// open segment) with one write.
    fn write_index(&self, w: &mut Writer, target: u64) -> Result<()> {
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
    fn publish_quiet(&self, w: &mut Writer, target: u64) -> bool {
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

    /// Wake every waiter a publication through `head` covered.
    fn wake_covered(&self, head: u64) {
        let mut s = lock(&self.sync);
        s.waiters.retain(|(seq, _, thread)| {
            if *seq <= head {
                thread.unpark();
                false
            } else {
                true
            }
        });
    }

    /// Return once frame `seq` is durable, making it so if nobody is: a
    /// waiter becomes the leader when no leader is in its fsync, fdatasyncs
    /// the segment without holding the writer lock (appenders keep staging
    /// behind it), then indexes and publishes everything that fsync covered
    /// and wakes exactly the waiters it covered, and the first one it did
    /// not, to lead next. No lock is held across the fsync.
    pub fn sync_through(&self, seq: u64) -> Result<()> {
        let me = thread::current();
        let mut waited = false;
        loop {
            let mut s = lock(&self.sync);
            if self.head_seq() >= seq {
                if waited && !s.leader {
                    // Woken by a publication that covered us but not every
                    // waiter: make sure somebody leads for the rest.
                    Self::hand_off(&mut s);
                }
                return Ok(());
            }
            if let Err(e) = self.check_poison() {
                Self::hand_off(&mut s);
                return Err(e);
            }
            if s.leader {
                s.waiters.push((seq, me.id(), me.clone()));
                drop(s);
                // The timeout is a safety net only: every path that ends a
                // leadership or publishes wakes the waiters it must.
                thread::park_timeout(WAITER_SAFETY_NET);
                lock(&self.sync).waiters.retain(|(_, id, _)| *id != me.id());
                waited = true;
                continue;
            }
            s.leader = true;
            drop(s);
            let led = self.lead(seq);
            let mut s = lock(&self.sync);
            s.leader = false;
            let head = self.head_seq();
            let failed = led.is_err();
            let mut covered = Vec::new();
            s.waiters.retain(|(wseq, _, thread)| {
                if *wseq <= head || failed {
                    covered.push(thread.clone());
                    false
                } else {
                    true
                }
            });
            // Those released, the ones still waiting and this leader are the
            // threads about to take part in the next group.
            self.pacing
                .expect(covered.len() as u64 + s.waiters.len() as u64 + 1);
            Self::hand_off(&mut s);
            drop(s);
            // The next leader is woken first; the covered ones are woken
            // holding no lock, while its fsync runs.
            for thread in covered {
                thread.unpark();
            }
            led?;
        }
    }

    /// Run `f` as the group-commit leader, once no other leader is in its
    /// fsync: what must not overlap a leader's use of the open segment's
    /// file (release).
    pub(super) fn as_leader<T>(&self, f: impl FnOnce() -> T) -> T {
        loop {
            let mut s = lock(&self.sync);
            if !s.leader {
                s.leader = true;
                break;
            }
            drop(s);
            thread::sleep(std::time::Duration::from_micros(200));
        }
        let out = f();
        let mut s = lock(&self.sync);
        s.leader = false;
        Self::hand_off(&mut s);
        out
    }

    /// Wake the waiter with the lowest sequence, to lead next.
    fn hand_off(s: &mut SyncState) {
        let next = s
            .waiters
            .iter()
            .enumerate()
            .min_by_key(|(_, (seq, _, _))| *seq)
            .map(|(i, _)| i);
        if let Some(i) = next {
            let (_, _, thread) = s.waiters.swap_remove(i);
            thread.unpark();
        }
    }

    /// One leader's turn: capture the staged head and the open segment,
    /// fdatasync it outside the writer lock, publish what it covered.
    fn lead(&self, seq: u64) -> Result<()> {
        self.gather();
        let (target, log, generation) = {
            let w = self.writer_locked();
            self.check_writable(&w)?;
            let target = w.next_seq - 1;
            if target < seq {
                return Err(Error::PastHead { seq, head: target });
            }
            if target <= w.published {
                return Ok(());
            }
            (target, w.files()?.log.clone(), w.generation)
        };
        let started = Instant::now();
        log.sync_data()
            .map_err(|e| self.poison_io("fdatasync", e))?;
        let took = started.elapsed();
        self.pacing.fsynced(took);
        self.sync_time.observe(took);
        self.frame_syncs.fetch_add(1, Ordering::SeqCst);
        let mut w = self.writer_locked();
        if w.generation == generation && w.files.is_some() && target > w.published {
            // Quietly: waking the covered waiters here would hold the writer
            // lock (and every appender) across one futex wake per waiter.
            self.write_index(&mut w, target)?;
            self.publish_quiet(&mut w, target);
        }
        Ok(())
    }

    /// Before a leader captures its group: the threads the last fsync
    /// released are about to stage again, and a leader that captured at
    /// once would leave them for the next fsync, splitting the appenders
    /// into two halves that take turns. Wait, yielding the processor, until
    /// as many threads wait as took part in the last group, for at most half
    /// an fsync. A lone appender expects only itself and never waits.
    fn gather(&self) {
        let expected = self.pacing.expected();
        if expected <= 1 {
            return;
        }
        let deadline = Instant::now() + self.pacing.patience();
        while (lock(&self.sync).waiters.len() as u64 + 1) < expected && Instant::now() < deadline {
            thread::yield_now();
        }
    }

    /// Make a group commit durable and visible: every frame committed with
    /// [`Pending::commit_unsynced`] (or staged) since the last sync is
    /// fdatasynced once, indexed with one write, and published; readers see
    /// it and the head moves only now. Answers the head. Nothing pending:
    /// no I/O. A segment roll inside a group is a sync too: the frames
    /// before it are durable and published when the roll returns.
    pub fn sync(&self) -> Result<u64> {
        let staged = {
            let w = self.writer_locked();
            self.check_poison()?;
            w.next_seq - 1
        };
        if staged > self.head_seq() {
            self.sync_through(staged)?;
        }
        Ok(self.head_seq())
    }

    /// Frames committed and not yet durable ([`Log::sync`] makes them so).
    pub fn unsynced(&self) -> u64 {
        self.writer_locked().unsynced.len() as u64
    }

    /// Begin a streaming append for a blob whose bytes arrive in chunks: the
    /// twin receiving a large entry without holding it in memory. `seq` is
    /// `None` for the next number (refused on a follower) or the number the
    /// frame must get (head + 1, else [`Error::Gap`]). The writer lock is
    /// held until [`Pending::commit`] or [`Pending::abort`]; the frame does
    /// not exist until commit.
    pub fn begin(
        &self,
        seq: Option<u64>,
        kind: u16,
        meta: &[u8],
        blob_len: u64,
    ) -> Result<Pending<'_>> {
        if seq.is_none() && self.is_follower() {
            return Err(Error::Follower);
        }
        let mut w = self.writer_locked();
        self.check_writable(&w)?;
        self.check_frame(kind, meta)?;
        if blob_len > i64::MAX as u64 {
            return Err(Error::TooLarge {
                what: "blob",
                len: blob_len,
                max: i64::MAX as u64,
            });
        }
        let seq = Self::check_seq(&w, seq)?;
        let frame_len = FRAME_HEADER_LEN as u64 + meta.len() as u64 + blob_len;
        self.make_room(&mut w, frame_len)?;
        let files = w.files()?.clone();
        let offset = w.end;
        let mut crc = crc32fast::Hasher::new();
        crc.update(meta);
        Ok(Pending {
            log: self,
            w,
            files,
            seq,
            kind,
            meta: meta.to_vec(),
            blob_len,
            written: 0,
            crc,
            expected_crc: None,
            unkicked: 0,
            offset,
            done: false,
        })
    }
}

/// A streaming append in progress ([`Log::begin`]). Holds the writer lock.
/// Dropped without `commit`, it aborts.
pub struct Pending<'a> {
    log: &'a Log,
    w: MutexGuard<'a, Writer>,
    files: OpenFiles,
    seq: u64,
    kind: u16,
    meta: Vec<u8>,
    blob_len: u64,
    written: u64,
    crc: crc32fast::Hasher,
    /// The crc the frame must carry: the one its first append computed.
    expected_crc: Option<u32>,
    /// Blob bytes written and not yet handed to writeback.
    unkicked: u64,
    offset: u64,
    done: bool,
}

impl std::fmt::Debug for Pending<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pending")
            .field("seq", &self.seq)
            .field("kind", &self.kind)
            .field("blob_len", &self.blob_len)
            .field("written", &self.written)
            .finish()
    }
}

impl Pending<'_> {
    /// The sequence the frame will get.
    pub fn seq(&self) -> u64 {
        self.seq
    }

    /// Blob bytes taken so far.
    pub fn written(&self) -> u64 {
        self.written
    }

    /// Where the blob's bytes go: the segment file and the blob's offset in
    /// it. Every byte `write` took is there (in the page cache at least)
    /// when it returns, so a restore killed mid-entry can salvage them
    /// before the next open cuts the unfinished frame.
    pub fn blob_at(&self) -> (std::path::PathBuf, u64) {
        (
            self.log.segment_file(self.w.open_first),
            self.offset + FRAME_HEADER_LEN as u64 + self.meta.len() as u64,
        )
    }

    /// The announced blob length.
    pub fn blob_len(&self) -> u64 {
        self.blob_len
    }

    /// Refuse to commit unless the payload crc over the meta and the blob
    /// taken equals `crc`: a frame received from another log keeps the crc
    /// its first append computed, checked here before it becomes visible,
    /// never recomputed from what arrived.
    pub fn expect_payload_crc(&mut self, crc: u32) {
        self.expected_crc = Some(crc);
    }

    /// Take the next chunk of the blob. More bytes than announced are
    /// refused with [`Error::BlobLength`] and nothing of the chunk is taken.
    pub fn write(&mut self, chunk: &[u8]) -> Result<()> {
        let got = self.written + chunk.len() as u64;
        if got > self.blob_len {
            return Err(Error::BlobLength {
                announced: self.blob_len,
                got,
            });
        }
        self.log.check_poison()?;
        let at = self.offset + FRAME_HEADER_LEN as u64 + self.meta.len() as u64 + self.written;
        self.files
            .log
            .write_all_at(chunk, at)
            .map_err(|e| self.log.poison_io("write", e))?;
        self.crc.update(chunk);
        self.written = got;
        self.unkicked += chunk.len() as u64;
        if self.unkicked >= WRITEBACK_EVERY {
            // Start writing a large blob back as it arrives, so the commit's
            // fdatasync does not find all of it still dirty.
            let end = at + chunk.len() as u64;
            if let Err(e) = self
                .files
                .log
                .start_writeback(end - self.unkicked, self.unkicked)
            {
                tracing::debug!(error = %e, "early writeback refused");
            }
            self.unkicked = 0;
        }
        Ok(())
    }

    fn finish(&mut self) -> Result<u64> {
        if self.written != self.blob_len {
            let e = Error::BlobLength {
                announced: self.blob_len,
                got: self.written,
            };
            self.abort_inner()?;
            return Err(e);
        }
        self.log.check_poison()?;
        let payload_crc = self.crc.clone().finalize();
        if let Some(expected) = self.expected_crc.filter(|&c| c != payload_crc) {
            self.abort_inner()?;
            return Err(Error::Corrupt(format!(
                "frame {} arrived with payload crc {payload_crc:08x}, its header says {expected:08x}",
                self.seq
            )));
        }
        let header = FrameHeader {
            seq: self.seq,
            kind: self.kind,
            meta_len: self.meta.len() as u32,
            blob_len: self.blob_len,
            payload_crc,
        };
        let mut head = Vec::with_capacity(FRAME_HEADER_LEN + self.meta.len());
        head.extend_from_slice(&header.encode());
        head.extend_from_slice(&self.meta);
        // The header last: until it is written, there is no frame.
        self.files
            .log
            .write_all_at(&head, self.offset)
            .map_err(|e| self.log.poison_io("write", e))?;
        self.done = true;
        self.w.unindexed.push(self.offset);
        self.w.end = self.offset + header.frame_len();
        self.w.next_seq = self.seq + 1;
        Ok(self.seq)
    }

    /// Write the frame and make it durable and visible: one fdatasync, one
    /// index write. Fewer bytes than announced are refused and the frame is
    /// aborted.
    pub fn commit(mut self) -> Result<u64> {
        let seq = self.finish()?;
        let started = Instant::now();
        self.files
            .log
            .sync_data()
            .map_err(|e| self.log.poison_io("fdatasync", e))?;
        self.log.sync_time.observe(started.elapsed());
        self.log.frame_syncs.fetch_add(1, Ordering::SeqCst);
        self.log.publish_through(&mut self.w, seq)?;
        Ok(seq)
    }

    /// Write the frame without syncing: it holds its number and is neither
    /// durable nor visible until [`Log::sync`].
    pub fn commit_unsynced(mut self) -> Result<u64> {
        let seq = self.finish()?;
        self.w.unsynced.push_back(seq);
        Ok(seq)
    }

    /// Drop the frame: its bytes are zeroed and its number stays free.
    pub fn abort(mut self) -> Result<()> {
        self.abort_inner()
    }

    fn abort_inner(&mut self) -> Result<()> {
        if self.done {
            return Ok(());
        }
        self.done = true;
        // Bytes past the end are zeros; a later frame may end anywhere in
        // this range, and what follows it must not look like a header.
        let len = FRAME_HEADER_LEN as u64 + self.meta.len() as u64 + self.written;
        self.files
            .log
            .punch(self.offset, len)
            .map_err(|e| self.log.poison_io("zero aborted frame", e))
    }
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        if let Err(e) = self.abort_inner() {
            tracing::error!(seq = self.seq, error = %e, "abort of a dropped streaming append failed");
        }
    }
}

/// ENOSPC or EDQUOT: the file system has no room, which passes.
fn is_out_of_space(e: &std::io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ENOSPC) | Some(libc::EDQUOT))
}
