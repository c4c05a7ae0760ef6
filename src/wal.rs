//! The embedding API: a small write-ahead log over the same files as
//! [`Log`].
//!
//! Four methods write: [`Wal::append`] stages a record and hands out its
//! [`Lsn`], [`Wal::commit`] makes everything staged durable with one write
//! and one fdatasync and answers the durable watermark. [`Wal::reader_from`]
//! replays; [`ExternalReader`] tails from another thread or process.
//!
//! ```
//! # fn main() -> Result<(), twinlog::wal::WalError> {
//! use twinlog::wal::{Lsn, Wal};
//! let dir = tempfile::tempdir().map_err(twinlog::log::Error::from)?;
//! let mut wal = Wal::open(dir.path())?;
//! assert_eq!(wal.append(b"one")?, Lsn(1));
//! assert_eq!(wal.append(b"two")?, Lsn(2));
//! assert_eq!(wal.commit()?, Lsn(2));
//! let mut reader = wal.reader_from(Lsn(2))?;
//! while let Some(record) = reader.next() {
//!     let (lsn, payload) = record?;
//!     assert_eq!((lsn, payload), (Lsn(2), &b"two"[..]));
//! }
//! # Ok(())
//! # }
//! ```

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use crate::clock::Clock;

use crate::log::format::{FrameHeader, FRAME_HEADER_LEN};
use crate::log::storage::Storage;
use crate::log::{self, Error, Kind, Log, OpenOptions, Tail, DEFAULT_SEGMENT_BYTES};

/// A log sequence number. `Lsn(0)` is "none": records start at `Lsn(1)` and
/// are dense from there. A newtype so an LSN is never mixed up with a byte
/// offset or a count.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Lsn(pub u64);

impl Lsn {
    /// The reserved "none" value.
    pub const NONE: Lsn = Lsn(0);
}

/// What the embedding API refuses or fails at.
#[derive(Debug, thiserror::Error)]
pub enum WalError {
    /// The payload exceeds `max_record_size`; nothing is truncated or split.
    #[error("a record of {len} bytes exceeds max_record_size {max}")]
    RecordTooLarge { len: usize, max: usize },
    /// A previous durability failure killed the handle; reopen.
    #[error("the WAL is poisoned by an earlier failure: {0}")]
    Poisoned(String),
    /// Reading below the retention floor is a loud error, never a silent
    /// start at the oldest record.
    #[error("{from:?} is below the retention floor {first:?}")]
    BelowFloor { from: Lsn, first: Lsn },
    /// Any other failure of the log under the WAL.
    #[error(transparent)]
    Log(Error),
}

impl From<Error> for WalError {
    fn from(e: Error) -> Self {
        match e {
            Error::Poisoned(why) => WalError::Poisoned(why),
            Error::BelowFloor { seq, first } => WalError::BelowFloor {
                from: Lsn(seq),
                first: Lsn(first),
            },
            other => WalError::Log(other),
        }
    }
}

/// How to open a [`Wal`].
#[derive(Clone, Debug)]
pub struct WalOptions {
    /// The largest payload `append` takes.
    pub max_record_size: usize,
    /// The segment size.
    pub segment_bytes: u64,
    /// The file system; the real one when None.
    pub storage: Option<Arc<dyn Storage>>,
    /// The clock the log decides by; the machine's unless a test says.
    pub clock: Arc<dyn Clock>,
}

impl Default for WalOptions {
    fn default() -> Self {
        WalOptions {
            max_record_size: 1 << 20,
            segment_bytes: DEFAULT_SEGMENT_BYTES,
            storage: None,
            clock: crate::clock::system(),
        }
    }
}

/// The write-ahead log. Records are frames of [`Kind::Record`] with empty
/// meta; the payload is the frame's blob.
#[derive(Debug)]
pub struct Wal {
    log: Log,
    max_record_size: usize,
    /// Staged frames, encoded back to back, and their lengths.
    staged: Vec<u8>,
    staged_lens: Vec<u64>,
}

impl Wal {
    /// Open or create the WAL at `dir` with the default options.
    pub fn open(dir: impl AsRef<Path>) -> Result<Wal, WalError> {
        Self::open_with(dir, WalOptions::default())
    }

    /// Open or create the WAL at `dir`.
    pub fn open_with(dir: impl AsRef<Path>, opts: WalOptions) -> Result<Wal, WalError> {
        let log = Log::open_opts(
            dir,
            OpenOptions {
                segment_bytes: opts.segment_bytes,
                repair: false,
                storage: opts.storage,
                clock: opts.clock,
            },
        )?;
        Ok(Wal {
            log,
            max_record_size: opts.max_record_size,
            staged: Vec::new(),
            staged_lens: Vec::new(),
        })
    }

    /// The largest payload `append` takes.
    pub fn max_record_size(&self) -> usize {
        self.max_record_size
    }

    /// The log underneath.
    pub fn log(&self) -> &Log {
        &self.log
    }

    /// The durable watermark: every record at or below it is durable.
    pub fn durable(&self) -> Lsn {
        Lsn(self.log.head_seq())
    }

    /// Stage a record and answer the LSN it will have. Not durable until
    /// [`Wal::commit`]. Refused with [`WalError::RecordTooLarge`] past
    /// `max_record_size`, and [`WalError::Poisoned`] after a failure.
    pub fn append(&mut self, payload: &[u8]) -> Result<Lsn, WalError> {
        if payload.len() > self.max_record_size {
            return Err(WalError::RecordTooLarge {
                len: payload.len(),
                max: self.max_record_size,
            });
        }
        if let Some(why) = self.log.poisoned_by() {
            return Err(WalError::Poisoned(why));
        }
        let seq = self.log.head_seq() + 1 + self.staged_lens.len() as u64;
        let header = FrameHeader {
            seq,
            kind: Kind::Record.as_u16(),
            meta_len: 0,
            blob_len: payload.len() as u64,
            payload_crc: crc32fast::hash(payload),
        };
        self.staged.extend_from_slice(&header.encode());
        self.staged.extend_from_slice(payload);
        self.staged_lens
            .push((FRAME_HEADER_LEN + payload.len()) as u64);
        Ok(Lsn(seq))
    }

    /// Make every staged record durable and answer the watermark. Rolling
    /// segments and splitting a batch across them happen here. A commit with
    /// nothing staged is a no-op that answers the watermark.
    pub fn commit(&mut self) -> Result<Lsn, WalError> {
        if self.staged_lens.is_empty() {
            return Ok(self.durable());
        }
        let first = self.log.head_seq() + 1;
        let staged = self
            .log
            .stage_encoded(first, &self.staged, &self.staged_lens);
        // Staged records are gone either way: written, or refused with the
        // log poisoned.
        self.staged.clear();
        self.staged_lens.clear();
        let last = staged?;
        self.log.sync_through(last)?;
        Ok(self.durable())
    }

    /// Drop whole segments below `lsn` (a checkpoint's retention). Answers
    /// the new oldest LSN.
    pub fn truncate_before(&self, lsn: Lsn) -> Result<Lsn, WalError> {
        Ok(Lsn(self.log.truncate_before(lsn.0)?))
    }

    /// A reader of the durable records with `lsn >= from`, in order, across
    /// segments. `Lsn(0)` means the oldest retained. Below the retention
    /// floor is [`WalError::BelowFloor`].
    pub fn reader_from(&self, from: Lsn) -> Result<Reader<'_>, WalError> {
        Ok(Reader {
            cursor: log::read::Cursor::new(&self.log, from.0)?,
        })
    }

    /// A reader that follows the WAL at `dir` from another thread or
    /// process while its writer appends.
    pub fn external_reader(dir: impl AsRef<Path>, from: Lsn) -> Result<ExternalReader, WalError> {
        Ok(ExternalReader {
            tail: Tail::open(dir, from.0)?,
            clock: crate::clock::system(),
        })
    }
}

/// A lending reader: each payload borrows the reader's reused buffer and is
/// valid until the next call to [`Reader::next`]. Drive it with
/// `while let Some(record) = reader.next()`.
#[derive(Debug)]
pub struct Reader<'a> {
    cursor: log::read::Cursor<'a>,
}

impl Reader<'_> {
    /// The next record, or None at the durable watermark.
    #[allow(clippy::should_implement_trait)] // a lending iterator cannot be an Iterator
    pub fn next(&mut self) -> Option<Result<(Lsn, &[u8]), WalError>> {
        match self.cursor.next_frame() {
            Ok(Some((h, body))) => Some(Ok((Lsn(h.seq), &body[h.meta_len as usize..]))),
            Ok(None) => None,
            Err(e) => Some(Err(e.into())),
        }
    }
}

/// Tails a WAL from another thread or process ([`Wal::external_reader`]).
#[derive(Debug)]
pub struct ExternalReader {
    tail: Tail,
    clock: Arc<dyn Clock>,
}

impl ExternalReader {
    /// The same reader, timing [`ExternalReader::wait_next`] by `clock`.
    pub fn with_clock(self, clock: Arc<dyn Clock>) -> ExternalReader {
        ExternalReader { clock, ..self }
    }

    /// The next durable record, or None when caught up with the writer.
    #[allow(clippy::should_implement_trait)]
    pub fn next(&mut self) -> Option<Result<(Lsn, &[u8]), WalError>> {
        match self.tail.next() {
            Ok(Some(f)) => Some(Ok((Lsn(f.seq), f.blob))),
            Ok(None) => None,
            Err(e) => Some(Err(e.into())),
        }
    }

    /// The next record, polling until one is durable or `timeout` passes.
    pub fn wait_next(&mut self, timeout: Duration) -> Option<Result<(Lsn, Vec<u8>), WalError>> {
        let deadline = self.clock.now() + timeout;
        loop {
            match self.tail.next() {
                Ok(Some(f)) => return Some(Ok((Lsn(f.seq), f.blob.to_vec()))),
                Ok(None) if self.clock.now() < deadline => {
                    std::thread::sleep(Duration::from_millis(1));
                }
                Ok(None) => return None,
                Err(e) => return Some(Err(e.into())),
            }
        }
    }
}
