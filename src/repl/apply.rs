//! Applying the frame stream to a twin's log, and reading a primary's
//! frames onto it: the code the twin daemon's writer thread, the primary's
//! shipper and the simulations (`ReplPair`,
//! `Cluster`) share, so that the fault-schedule tests run
//! the bytes-to-log path the daemons run.
//!
//! The twin side is two steps, split where the daemon hands work from its
//! network task to its writer thread: [`decode`] turns stream bytes into
//! [`Write`] commands with the core, and an [`Applier`] carries them out
//! on the log (a streaming append per frame, committed without sync once
//! its crc checked) and syncs once whenever it has caught up with what
//! arrived: one sync per batch.

use bytes::Bytes;

use super::msg::Refusal;
use super::primary::HeadFrame;
use super::twin::TwinCore;
use super::wire::{frame_prefix, FrameEvent};
use crate::log::format::FrameHeader;
use crate::log::{Error as LogError, Log, Pending};

/// One step of applying the stream to the log.
#[derive(Debug)]
pub enum Write {
    /// A frame begins: its header and meta.
    Begin(FrameHeader, Vec<u8>),
    /// Bytes of the frame's blob.
    Piece(Bytes),
    /// The frame's blob is complete: commit it once its crc checks.
    End,
    /// A frame whose blob the primary erased: its header and meta.
    Erased(FrameHeader, Vec<u8>),
}

impl Write {
    /// Whether a frame is whole after this step.
    pub fn ends_frame(&self) -> bool {
        matches!(self, Write::End | Write::Erased(..))
    }
}

/// Decode stream bytes with the core, pushing their steps onto `batch`.
/// A refusal ends the input: the core is closed and says why.
pub fn decode(core: &mut TwinCore, bytes: &Bytes, batch: &mut Vec<Write>) -> Result<(), Refusal> {
    let mut pos = 0;
    loop {
        let (n, ev) = core.handle_frame_data(&bytes[pos..])?;
        let piece = bytes.slice(pos..pos + n);
        pos += n;
        batch.push(match ev {
            None if n == 0 => return Ok(()),
            None => continue,
            Some(FrameEvent::Begin(h)) => Write::Begin(h, core.meta().to_vec()),
            Some(FrameEvent::Piece) => Write::Piece(piece),
            Some(FrameEvent::End(_)) => Write::End,
            Some(FrameEvent::Erased(h)) => Write::Erased(h, core.meta().to_vec()),
        });
    }
}

/// What applying a batch did: the last frame it committed, and the
/// failure that stopped it (the rest of the batch is dropped: the core
/// refuses the stream on it).
#[derive(Debug, Default)]
pub struct Applied {
    pub committed: Option<u64>,
    pub failed: Option<LogError>,
}

/// Applies [`Write`]s to a follower log; see the module documentation.
pub struct Applier<'a> {
    log: &'a Log,
    /// The frame being written, between its `Begin` and its `End`.
    pending: Option<Pending<'a>>,
    /// Frames committed since the last sync.
    unsynced: bool,
}

impl<'a> Applier<'a> {
    pub fn new(log: &'a Log) -> Applier<'a> {
        Applier {
            log,
            pending: None,
            unsynced: false,
        }
    }

    /// Carry out a batch of steps, in order.
    pub fn apply(&mut self, batch: impl IntoIterator<Item = Write>) -> Applied {
        let mut applied = Applied::default();
        for step in batch {
            match self.step(step) {
                Ok(Some(seq)) => {
                    self.unsynced = true;
                    applied.committed = Some(seq);
                }
                Ok(None) => {}
                Err(e) => {
                    self.pending = None;
                    applied.failed = Some(e);
                    break;
                }
            }
        }
        applied
    }

    fn step(&mut self, step: Write) -> Result<Option<u64>, LogError> {
        match step {
            Write::Begin(h, meta) => {
                let mut p = self.log.begin(Some(h.seq), h.kind, &meta, h.blob_len)?;
                p.expect_payload_crc(h.payload_crc);
                self.pending = Some(p);
                Ok(None)
            }
            Write::Piece(bytes) => match self.pending.as_mut() {
                Some(p) => p.write(&bytes).map(|()| None),
                None => Ok(None),
            },
            Write::End => match self.pending.take() {
                Some(p) => p.commit_unsynced().map(Some),
                None => Ok(None),
            },
            Write::Erased(h, meta) => self
                .log
                .stage_erased_at(h.seq, &meta, h.blob_len, h.payload_crc)
                .map(Some),
        }
    }

    /// Whether a frame is partly written.
    pub fn mid_frame(&self) -> bool {
        self.pending.is_some()
    }

    /// Sync what was committed, when anything was and no frame is partly
    /// written: the caller has caught up with what arrived. Answers the
    /// durable head.
    pub fn sync_if_caught_up(&mut self) -> Option<Result<u64, LogError>> {
        if !self.unsynced || self.pending.is_some() {
            return None;
        }
        self.unsynced = false;
        Some(self.log.sync())
    }

    /// The stream ended: a partly written frame is aborted and what was
    /// committed is synced, so that the next Hello reports it.
    pub fn finish(mut self) -> Option<Result<u64, LogError>> {
        drop(self.pending.take());
        self.sync_if_caught_up()
    }
}

/// Frame `seq` of the primary's log as the stream carries it: its prefix,
/// then its stored blob in pieces of at most `piece` bytes, each handed to
/// `out` in order.
pub fn ship_frame<E: From<LogError>>(
    log: &Log,
    seq: u64,
    piece: usize,
    mut out: impl FnMut(&[u8]) -> Result<(), E>,
) -> Result<(), E> {
    let mut first = true;
    log.read_pieces(seq, piece, |loc, bytes, _last| {
        if first {
            first = false;
            out(&frame_prefix(&loc.header(), &loc.meta))?;
        }
        out(bytes)
    })
    .map(|_| ())
}

/// The primary's frame at `seq`, as the handshake compares it with the
/// twin's head; `None` when the log holds no such frame.
pub fn head_frame(log: &Log, seq: u64) -> Option<HeadFrame> {
    log.locate_blob(seq).ok().map(|l| HeadFrame {
        crc: l.payload_crc,
        erased: l.is_erased(),
    })
}
