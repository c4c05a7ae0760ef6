//! The log's errors: every refusal has a name.

use std::io;
use std::path::PathBuf;

/// A result of the log.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything the log refuses or fails at.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The file system failed.
    #[error("I/O error: {0}")]
    Io(#[from] io::Error),
    /// Bytes on disk do not decode or do not match their crc.
    #[error("corrupt log: {0}")]
    Corrupt(String),
    /// Damage inside a sealed segment: never cut without the repair option.
    #[error("damage inside sealed segment {}: {what} (open with repair to cut the log there)", segment.display())]
    SealedDamage {
        segment: PathBuf,
        what: SegmentDamage,
    },
    /// `append_at` or `begin(Some(_))` asked for a sequence other than head + 1.
    #[error("sequence gap: the next sequence is {expected}, {got} was asked for")]
    Gap { expected: u64, got: u64 },
    /// A follower log takes only `append_at` and `begin(Some(_))`.
    #[error("the log is a follower: only appends at the leader's sequence numbers are taken")]
    Follower,
    /// The log gave up its files (`release`).
    #[error("the log has released its files")]
    Released,
    /// A write or fsync failed earlier; the log must be reopened.
    #[error("the log is poisoned by an earlier failure: {0}")]
    Poisoned(String),
    /// The sequence is older than the oldest retained.
    #[error("sequence {seq} is below the retention floor {first}")]
    BelowFloor { seq: u64, first: u64 },
    /// The sequence is past the head.
    #[error("sequence {seq} is past the head {head}")]
    PastHead { seq: u64, head: u64 },
    /// A reader had read frames that `truncate_after` then cut: what it
    /// handed out is no longer the log, and it must be opened again.
    #[error("the log was cut below frame {read_through}, which this reader had already read: open a new reader")]
    ReaderPastCut { read_through: u64 },
    /// Another writer holds the directory.
    #[error("{} is locked by another writer", .0.display())]
    Locked(PathBuf),
    /// `reacquire` found the open segment changed while released.
    #[error("segment {} changed while released: {what}", segment.display())]
    SegmentChanged { segment: PathBuf, what: String },
    /// `reset` on a log with history.
    #[error("the log holds {frames} frames, more than the {keep_at_most} a reset may drop")]
    NotFresh { frames: u64, keep_at_most: u64 },
    /// A segment size too small to hold a segment header and a frame.
    #[error("a segment size of {len} bytes is below the minimum of {min}")]
    SegmentTooSmall { len: u64, min: u64 },
    /// Something exceeds its limit.
    #[error("{what} of {len} bytes exceeds the limit of {max}")]
    TooLarge {
        what: &'static str,
        len: u64,
        max: u64,
    },
    /// A streaming append received more or fewer bytes than announced.
    #[error("the blob was announced as {announced} bytes, {got} were given")]
    BlobLength { announced: u64, got: u64 },
    /// A kind value that is not a kind.
    #[error("{0} is not a frame kind")]
    InvalidKind(u16),
    /// Meta bytes that do not decode as [`crate::log::Meta`].
    #[error("bad meta: {0}")]
    BadMeta(&'static str),
    /// The log and its history file disagree, or a history cannot be adopted.
    #[error("history: {0}")]
    History(String),
}

/// What is wrong with a segment's files, as a check of them finds it.
#[derive(Debug, thiserror::Error)]
pub enum SegmentDamage {
    #[error("segment header: {0}")]
    HeaderUnread(io::Error),
    #[error("segment header: {0:?}")]
    HeaderBad(super::format::HeaderError),
    #[error("{0}")]
    Unread(io::Error),
    #[error("header names first sequence {0}")]
    WrongFirst(u64),
    #[error("segment of history {found}, the log's is {log}")]
    OtherHistory {
        found: super::HistoryId,
        log: super::HistoryId,
    },
    #[error("index: {0}")]
    IndexUnopened(io::Error),
    #[error("index header: {0}")]
    IndexHeaderUnread(io::Error),
    #[error("index header does not name this segment")]
    IndexOtherSegment,
    #[error("index holds {entries} bytes of entries; the next segment starts {frames} frames on")]
    IndexLength { entries: u64, frames: u64 },
    #[error("first frame indexed at {0}")]
    FirstIndexedAt(u64),
    #[error("first frame: {0}")]
    FirstUnread(io::Error),
    #[error("first frame holds sequence {0}")]
    FirstSeq(u64),
    #[error("first frame: {0:?}")]
    FirstBad(super::format::HeaderError),
    #[error("last frame at {at}: {source}")]
    LastUnread { at: u64, source: io::Error },
    #[error("last frame at {at}: {error:?}")]
    LastBad {
        at: u64,
        error: super::format::HeaderError,
    },
    #[error("last frame holds sequence {got}, not {want}")]
    LastSeq { got: u64, want: u64 },
    #[error("last frame ends at {end}, the file at {file_len}")]
    LastEnd { end: u64, file_len: u64 },
    #[error("ends at {last}, the next segment starts at {next}")]
    NotFollowed { last: u64, next: u64 },
}

impl Error {
    pub(crate) fn corrupt(
        path: &std::path::Path,
        offset: u64,
        what: impl std::fmt::Display,
    ) -> Self {
        Error::Corrupt(format!("{} at offset {offset}: {what}", path.display()))
    }
}
