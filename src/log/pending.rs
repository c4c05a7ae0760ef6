//! Streaming appends: a frame whose blob arrives in pieces is written
//! under the writer lock as the pieces come, and exists only once it is
//! committed ([`Pending`]).

use std::sync::atomic::Ordering;
use std::sync::MutexGuard;

use super::format::{FrameHeader, FRAME_HEADER_LEN};
use super::write::Writer;
use super::{Error, Log, OpenFiles, Result};

/// A streaming append starts writeback every this many blob bytes.
const WRITEBACK_EVERY: u64 = 8 << 20;

impl Log {
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
        self.check_frame(kind, meta, blob_len)?;
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
        let started = self.log.clock.now();
        self.files
            .log
            .sync_data()
            .map_err(|e| self.log.poison_io("fdatasync", e))?;
        let took = self.log.clock.now().saturating_duration_since(started);
        self.log.sync_time.observe(took);
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
