//! The push log: an append-only file of ref updates, one push per frame,
//! fsynced per push. A frame is a 24-byte envelope (magic, format version,
//! length, crc of the contents, crc of the envelope) around a
//! self-contained Arrow IPC stream (schema, one RecordBatch, end of
//! stream). Layout in docs/FORMAT.md.
//!
//! The frame boundary is the transaction boundary: a push is visible whole
//! or not at all. [`scan_frames`] reads forward while frames check. Only
//! the last append can be torn by a crash, so a frame that does not check
//! with no whole frame after it is a torn tail, cut at open and never an
//! error; one with a whole frame after it is damage, refused by name with
//! its offset and never decoded into refs. A frame whose crc checks but
//! whose contents do not decode was written wrong, not torn, and is
//! refused too.

mod archive;
mod codec;
mod compaction;
mod file;
mod ipc;
mod recovery;

pub use archive::{
    read_sealed, read_sealed_with, seal, write_archive, write_archive_with, ARCHIVE_MAGIC,
    SEALED_SECTION,
};
pub use codec::{
    encode_frame, schema, ENVELOPE_LEN, ENV_CRC_OFFSET, ENV_HEADER_CRC_OFFSET, ENV_LEN_OFFSET,
    ENV_MAGIC_OFFSET, ENV_VERSION_OFFSET, FRAME_MAGIC, PUSHLOG_VERSION,
};
pub use compaction::{CompactionPolicy, CompactionReport, Finish};
pub use file::PushLog;
pub use ipc::ARROW_PANICKED;
pub use recovery::{scan_frames, PushLogScan};

use std::path::{Path, PathBuf};

use arrow_schema::ArrowError;

/// The length of an object id.
pub const OID_LEN: usize = 20;

/// One ref moved by a push: created (`old` None), deleted (`new` None) or
/// updated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RefUpdate {
    pub name: String,
    pub old: Option<[u8; OID_LEN]>,
    pub new: Option<[u8; OID_LEN]>,
}

/// One push: the log sequence that carried it, when, and its updates.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Push {
    pub seq: u64,
    pub at_ms: u64,
    pub updates: Vec<RefUpdate>,
}

/// What the push log fails at.
#[derive(Debug, thiserror::Error)]
pub enum PushLogError {
    #[error("I/O: {0}")]
    Io(#[from] std::io::Error),
    #[error("Arrow: {0}")]
    Arrow(#[from] ArrowError),
    #[error("a push must move at least one ref")]
    Empty,
    #[error("a frame does not hold a push: {0}")]
    Shape(String),
    /// Bytes that do not check or decode where whole frames follow them
    /// (damage, not a torn tail), or a frame whose crc checks but whose
    /// contents are not a push.
    #[error("push log {}: damaged at byte {offset}: {why}", path.display())]
    Corrupt {
        path: PathBuf,
        offset: u64,
        why: String,
    },
    /// A file of another push log format version: refused rather than
    /// read as damage or cut as a torn tail.
    #[error(
        "push log {}: format version {found} at byte {offset}; this build reads version {PUSHLOG_VERSION}",
        path.display()
    )]
    Version {
        path: PathBuf,
        offset: u64,
        found: u32,
    },
}

/// Why bytes do not scan as a push log, before a path names them.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ScanError {
    /// See [`PushLogError::Corrupt`].
    #[error("damaged at byte {offset}: {why}")]
    Damaged { offset: u64, why: String },
    /// See [`PushLogError::Version`].
    #[error("format version {found} at byte {offset}; this build reads version {PUSHLOG_VERSION}")]
    Version { offset: u64, found: u32 },
}

impl ScanError {
    /// The error, naming the file the bytes were read from.
    pub fn in_file(self, path: &Path) -> PushLogError {
        let path = path.to_owned();
        match self {
            ScanError::Damaged { offset, why } => PushLogError::Corrupt { path, offset, why },
            ScanError::Version { offset, found } => PushLogError::Version {
                path,
                offset,
                found,
            },
        }
    }
}

/// The reflog archive beside the log at `path`.
fn archive_path_of(path: &Path) -> PathBuf {
    beside(path, ".reflog")
}

/// Where a compaction stages its checkpoint.
fn staged_path(path: &Path) -> PathBuf {
    beside(path, ".compact")
}

fn beside(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(suffix);
    PathBuf::from(name)
}
