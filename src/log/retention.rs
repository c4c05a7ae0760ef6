//! Dropping and restarting: retention by whole segments, reset and restart
//! behind an intent file, release and reacquire of the writer's files, and
//! adopting another log's history.

use std::sync::atomic::Ordering;

use super::format::{
    self, FRAME_HEADER_LEN, HISTORY_FILE, HISTORY_MAGIC, INDEX_ENTRY_LEN, RESTART_FILE,
    RESTART_MAGIC, SEGMENT_HEADER_LEN,
};
use super::storage::{write_atomic, OpenMode};
use super::write::{ReleasedAt, Writer};
use super::{lock, read_lock, write_lock, Error, HistoryId, Log, OpenFiles, Result, Seg};

impl Log {
    pub(super) fn check_open_for_retention(&self, w: &Writer) -> Result<()> {
        self.check_poison()?;
        if w.files.is_none() {
            return Err(Error::Released);
        }
        Ok(())
    }

    /// Drop every whole segment whose last sequence is below `seq`. The
    /// open segment is never dropped. Returns the new first sequence.
    pub fn truncate_before(&self, seq: u64) -> Result<u64> {
        let w = lock(&self.writer);
        self.check_open_for_retention(&w)?;
        self.drop_sealed_below(seq)
    }

    /// Retain from `seq`: close the open segment (when it holds anything) so
    /// every frame up to the head sits in a closed segment, then drop every
    /// whole segment below `seq`. Returns the new first sequence. `seq` past
    /// the head retains nothing old: the log keeps its numbers and the next
    /// append takes head + 1.
    pub fn retain_from(&self, seq: u64) -> Result<u64> {
        let mut w = lock(&self.writer);
        self.check_open_for_retention(&w)?;
        if w.open_has_frames() {
            self.roll(&mut w, self.segment_bytes)?;
        }
        self.drop_sealed_below(seq)
    }

    /// Segments are dropped oldest first, so a crash leaves a contiguous
    /// suffix; readers stop seeing them before their files go.
    fn drop_sealed_below(&self, seq: u64) -> Result<u64> {
        let doomed: Vec<u64> = {
            let mut segs = write_lock(&self.segs);
            let sealed = segs.len().saturating_sub(1);
            let n = segs[..sealed].iter().take_while(|s| s.last < seq).count();
            segs.drain(..n).map(|s| s.first).collect()
        };
        for &first in &doomed {
            self.fs.remove(&self.segment_file(first))?;
            self.fs.remove(&self.index_file(first))?;
        }
        if !doomed.is_empty() {
            self.fs.sync_dir(&self.dir)?;
            tracing::info!(dir = %self.dir.display(), dropped = doomed.len(), first = self.first_seq(), "retention dropped segments");
        }
        Ok(self.first_seq())
    }

    /// Start over: drop every segment and begin again at sequence 1 with
    /// nothing in the log: the restore door on a fresh box. Refused with
    /// [`Error::NotFresh`] when the log holds more than `keep_at_most`
    /// frames: a box with history is not fresh.
    pub fn reset(&self, keep_at_most: u64) -> Result<()> {
        let mut w = lock(&self.writer);
        self.check_open_for_retention(&w)?;
        let frames = w.next_seq - self.first_seq();
        if frames > keep_at_most {
            return Err(Error::NotFresh {
                frames,
                keep_at_most,
            });
        }
        self.restart_locked(&mut w, 1)
    }

    /// Start over after `at`: drop every segment; the log is empty with its
    /// head at `at` and the next append taking `at + 1`. What a twin does
    /// once it has installed a snapshot taken at `at`.
    pub fn restart_after(&self, at: u64) -> Result<()> {
        let next = at.checked_add(1).ok_or(Error::PastHead {
            seq: at,
            head: u64::MAX - 1,
        })?;
        let mut w = lock(&self.writer);
        self.check_open_for_retention(&w)?;
        self.restart_locked(&mut w, next)
    }

    /// The intent file makes a restart all or nothing: `open` finishes one
    /// that a crash interrupted.
    fn restart_locked(&self, w: &mut Writer, next: u64) -> Result<()> {
        let intent = format::encode_sealed(&RESTART_MAGIC, &next.to_le_bytes());
        let done = (|| -> Result<OpenFiles> {
            write_atomic(&*self.fs, &self.dir, RESTART_FILE, &intent)?;
            w.files = None;
            self.reader_files_changed();
            let firsts: Vec<u64> = self
                .fs
                .list(&self.dir)?
                .iter()
                .filter_map(|n| format::parse_segment_name(n))
                .collect();
            self.drop_all_segments(&firsts)?;
            let files = self.create_segment(next, self.segment_bytes)?;
            self.fs.remove(&self.dir.join(RESTART_FILE))?;
            self.fs.sync_dir(&self.dir)?;
            Ok(files)
        })();
        let files = match done {
            Ok(f) => f,
            Err(Error::Io(e)) => return Err(self.poison_io("restart", e)),
            Err(e) => {
                let _ = self.poison_with(format!("restart: {e}"));
                return Err(e);
            }
        };
        let generation = w.generation + 1;
        *w = Writer::new(
            next,
            SEGMENT_HEADER_LEN as u64,
            self.segment_bytes,
            Some(files),
        );
        w.generation = generation;
        *write_lock(&self.segs) = vec![Seg {
            first: next,
            last: next - 1,
            bytes: self.segment_bytes,
        }];
        self.head.store(next - 1, Ordering::SeqCst);
        self.reader_files_changed();
        tracing::info!(dir = %self.dir.display(), next, "log restarted");
        Ok(())
    }

    pub(super) fn drop_all_segments(&self, firsts: &[u64]) -> Result<()> {
        for &first in firsts {
            self.fs.remove(&self.segment_file(first))?;
            let idx = self.index_file(first);
            if self.fs.exists(&idx)? {
                self.fs.remove(&idx)?;
            }
        }
        self.fs.sync_dir(&self.dir)?;
        Ok(())
    }

    /// Give up the writer's files so the file system under the log can be
    /// unmounted. Waits for an in-flight streaming append (it holds the
    /// writer lock), a group-commit leader's fsync and an erase, makes everything staged durable and
    /// published, syncs both files and closes them; readers open per call
    /// and are unaffected until the unmount itself. Every write refuses with
    /// [`Error::Released`] until [`Log::reacquire`]. Idempotent.
    pub fn release(&self) -> Result<()> {
        let _erase = lock(&self.erase_lock);
        self.as_leader(|| self.release_files())
    }

    fn release_files(&self) -> Result<()> {
        let mut w = lock(&self.writer);
        let Some(files) = w.files.clone() else {
            return Ok(());
        };
        self.check_poison()?;
        files
            .log
            .sync_data()
            .map_err(|e| self.poison_io("release: fdatasync", e))?;
        let staged = w.next_seq - 1;
        self.publish_through(&mut w, staged)?;
        files
            .idx
            .sync_all()
            .map_err(|e| self.poison_io("release: fsync index", e))?;
        let read = (|| -> std::io::Result<ReleasedAt> {
            let log_len = files.log.len()?;
            let idx_len = files.idx.len()?;
            let mut header = vec![0u8; SEGMENT_HEADER_LEN];
            files.log.read_exact_at(&mut header, 0)?;
            let last_frame = if w.open_has_frames() {
                let mut b = [0u8; INDEX_ENTRY_LEN];
                files
                    .idx
                    .read_exact_at(&mut b, idx_len - INDEX_ENTRY_LEN as u64)?;
                let at = u64::from_le_bytes(b);
                let mut h = vec![0u8; FRAME_HEADER_LEN];
                files.log.read_exact_at(&mut h, at)?;
                Some((at, h))
            } else {
                None
            };
            Ok(ReleasedAt {
                log_len,
                idx_len,
                header,
                last_frame,
            })
        })()?;
        w.released_at = Some(read);
        w.files = None;
        self.reader_files_changed();
        self.released.store(true, Ordering::SeqCst);
        tracing::info!(dir = %self.dir.display(), head = self.head_seq(), "log released its files");
        Ok(())
    }

    /// Take the files back after the remount. The open segment must be
    /// exactly as the writer left it: anything else is a different disk, and
    /// is refused with [`Error::SegmentChanged`] rather than appended to.
    /// Idempotent.
    pub fn reacquire(&self) -> Result<()> {
        let mut w = lock(&self.writer);
        if w.files.is_some() {
            return Ok(());
        }
        let Some(at) = w.released_at.as_ref() else {
            return Err(Error::Released);
        };
        let path = self.segment_file(w.open_first);
        let changed = |what: String| Error::SegmentChanged {
            segment: path.clone(),
            what,
        };
        let log = self
            .fs
            .open(&path, OpenMode::Write)
            .map_err(|e| changed(e.to_string()))?;
        let idx = self
            .fs
            .open(&self.index_file(w.open_first), OpenMode::Write)
            .map_err(|e| changed(format!("index: {e}")))?;
        let log_len = log.len()?;
        if log_len != at.log_len {
            return Err(changed(format!("{log_len} bytes long, was {}", at.log_len)));
        }
        let idx_len = idx.len()?;
        if idx_len != at.idx_len {
            return Err(changed(format!(
                "index {idx_len} bytes long, was {}",
                at.idx_len
            )));
        }
        let mut header = vec![0u8; SEGMENT_HEADER_LEN];
        log.read_exact_at(&mut header, 0)?;
        if header != at.header {
            return Err(changed("segment header differs".into()));
        }
        if let Some((offset, bytes)) = &at.last_frame {
            let mut h = vec![0u8; FRAME_HEADER_LEN];
            log.read_exact_at(&mut h, *offset)?;
            if &h != bytes {
                return Err(changed(format!("last frame at {offset} differs")));
            }
        }
        w.files = Some(OpenFiles { log, idx });
        w.released_at = None;
        self.reader_files_changed();
        self.released.store(false, Ordering::SeqCst);
        tracing::info!(dir = %self.dir.display(), "log reacquired its files");
        Ok(())
    }

    /// Take another log's history: a fresh box about to receive a twin's
    /// frames. Refused unless the log holds no frame at all.
    pub fn adopt_history(&self, history: HistoryId) -> Result<()> {
        let w = lock(&self.writer);
        self.check_open_for_retention(&w)?;
        let single = read_lock(&self.segs).len() == 1;
        if w.open_has_frames() || !single {
            return Err(Error::History(format!(
                "a log holding frames keeps its history {}",
                self.history()
            )));
        }
        write_atomic(
            &*self.fs,
            &self.dir,
            HISTORY_FILE,
            &format::encode_sealed(&HISTORY_MAGIC, &history.0),
        )?;
        let files = w.files()?;
        let header = format::SegmentHeader {
            first_seq: w.open_first,
            history: history.0,
            capacity: w.capacity,
        };
        files
            .log
            .write_all_at(&header.encode(), 0)
            .and_then(|()| files.log.sync_all())
            .map_err(|e| self.poison_io("adopt history", e))?;
        *write_lock(&self.history) = history;
        Ok(())
    }
}
