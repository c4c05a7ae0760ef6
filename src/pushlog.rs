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

mod ipc;

pub use ipc::ARROW_PANICKED;

use std::fs::{File, OpenOptions};
use std::io::Read;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow_array::builder::{FixedSizeBinaryBuilder, StringBuilder, UInt64Builder};
use arrow_array::{Array, FixedSizeBinaryArray, RecordBatch, StringArray, UInt64Array};
use arrow_ipc::writer::StreamWriter;
use arrow_schema::{ArrowError, DataType, Field, Schema, SchemaRef};

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

/// Schema metadata saying what a frame holds.
const KIND_KEY: &str = "twinlog.pushlog";
const KIND_PUSH: &str = "push";
const KIND_CHECKPOINT: &str = "checkpoint";
/// Checkpoint metadata: the archive's length before the compaction that
/// wrote it, so an interrupted compaction can be rolled back.
const ARCHIVE_LEN_KEY: &str = "twinlog.archive_len_before";
/// Checkpoint metadata: the seq and time of the last push it folds, which
/// a checkpoint of no refs (every ref deleted) has no row to carry.
const CHECKPOINT_SEQ_KEY: &str = "twinlog.seq";
const CHECKPOINT_AT_KEY: &str = "twinlog.at_ms";

/// What a checkpoint frame's schema metadata says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct CheckpointMeta {
    archive_len: u64,
    seq: u64,
    at_ms: u64,
}

/// The schema of a push frame: one row per ref update.
pub fn schema() -> SchemaRef {
    schema_with(KIND_PUSH, None)
}

fn schema_with(kind: &str, checkpoint: Option<CheckpointMeta>) -> SchemaRef {
    let mut meta = std::collections::HashMap::new();
    meta.insert(KIND_KEY.to_string(), kind.to_string());
    if let Some(c) = checkpoint {
        meta.insert(ARCHIVE_LEN_KEY.to_string(), c.archive_len.to_string());
        meta.insert(CHECKPOINT_SEQ_KEY.to_string(), c.seq.to_string());
        meta.insert(CHECKPOINT_AT_KEY.to_string(), c.at_ms.to_string());
    }
    Arc::new(Schema::new_with_metadata(fields(), meta))
}

fn fields() -> Vec<Field> {
    vec![
        Field::new("seq", DataType::UInt64, false),
        Field::new("at_ms", DataType::UInt64, false),
        Field::new("ref", DataType::Utf8, false),
        Field::new("old", DataType::FixedSizeBinary(OID_LEN as i32), true),
        Field::new("new", DataType::FixedSizeBinary(OID_LEN as i32), true),
    ]
}

fn to_batch(push: &Push) -> Result<RecordBatch, PushLogError> {
    if push.updates.is_empty() {
        return Err(PushLogError::Empty);
    }
    to_batch_with(push, schema())
}

fn to_batch_with(push: &Push, schema: SchemaRef) -> Result<RecordBatch, PushLogError> {
    let n = push.updates.len();
    let mut seq = UInt64Builder::with_capacity(n);
    let mut at = UInt64Builder::with_capacity(n);
    let mut name = StringBuilder::new();
    let mut old = FixedSizeBinaryBuilder::with_capacity(n, OID_LEN as i32);
    let mut new = FixedSizeBinaryBuilder::with_capacity(n, OID_LEN as i32);
    for u in &push.updates {
        seq.append_value(push.seq);
        at.append_value(push.at_ms);
        name.append_value(&u.name);
        match &u.old {
            Some(o) => old.append_value(o)?,
            None => old.append_null(),
        }
        match &u.new {
            Some(o) => new.append_value(o)?,
            None => new.append_null(),
        }
    }
    Ok(RecordBatch::try_new(
        schema,
        vec![
            Arc::new(seq.finish()),
            Arc::new(at.finish()),
            Arc::new(name.finish()),
            Arc::new(old.finish()),
            Arc::new(new.finish()),
        ],
    )?)
}

fn oid(a: &FixedSizeBinaryArray, i: usize) -> Option<[u8; OID_LEN]> {
    if a.is_null(i) {
        return None;
    }
    let mut o = [0u8; OID_LEN];
    o.copy_from_slice(a.value(i));
    Some(o)
}

fn column<T: 'static>(batch: &RecordBatch, i: usize) -> Result<&T, PushLogError> {
    batch
        .column(i)
        .as_any()
        .downcast_ref::<T>()
        .ok_or_else(|| PushLogError::Shape(format!("column {i} has another type")))
}

fn from_batch(batch: &RecordBatch) -> Result<Push, PushLogError> {
    if batch.schema().fields() != &arrow_schema::Fields::from(fields()) {
        return Err(PushLogError::Shape("another schema".into()));
    }
    if batch.num_rows() == 0 {
        return Err(PushLogError::Empty);
    }
    let seq = column::<UInt64Array>(batch, 0)?;
    let at = column::<UInt64Array>(batch, 1)?;
    let name = column::<StringArray>(batch, 2)?;
    let old = column::<FixedSizeBinaryArray>(batch, 3)?;
    let new = column::<FixedSizeBinaryArray>(batch, 4)?;
    let updates = (0..batch.num_rows())
        .map(|i| RefUpdate {
            name: name.value(i).to_string(),
            old: oid(old, i),
            new: oid(new, i),
        })
        .collect();
    Ok(Push {
        seq: seq.value(0),
        at_ms: at.value(0),
        updates,
    })
}

/// The first bytes of every push log frame; built as the log's magics are.
pub const FRAME_MAGIC: [u8; 8] = *b"\x89TWU\r\n\x1a\n";
/// The push log format version every frame names. Version 1 was bare Arrow
/// IPC streams, with no envelope and no crc; such a file is refused by
/// name ([`PushLogError::Version`]).
pub const PUSHLOG_VERSION: u32 = 2;

// The frame envelope: 24 bytes, then `len` bytes of Arrow IPC stream.
pub const ENV_MAGIC_OFFSET: usize = 0;
pub const ENV_VERSION_OFFSET: usize = ENV_MAGIC_OFFSET + 8;
pub const ENV_LEN_OFFSET: usize = ENV_VERSION_OFFSET + 4;
pub const ENV_CRC_OFFSET: usize = ENV_LEN_OFFSET + 4;
pub const ENV_HEADER_CRC_OFFSET: usize = ENV_CRC_OFFSET + 4;
pub const ENVELOPE_LEN: usize = ENV_HEADER_CRC_OFFSET + 4;

/// How a version 1 file starts: Arrow's continuation marker.
const UNFRAMED_START: [u8; 4] = [0xff; 4];

fn le32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// Put Arrow IPC bytes in a frame's envelope.
fn envelope(ipc: Vec<u8>) -> Result<Vec<u8>, PushLogError> {
    let len = u32::try_from(ipc.len())
        .map_err(|_| PushLogError::Shape(format!("a frame of {} bytes", ipc.len())))?;
    let mut frame = Vec::with_capacity(ENVELOPE_LEN + ipc.len());
    frame.extend_from_slice(&FRAME_MAGIC);
    frame.extend_from_slice(&PUSHLOG_VERSION.to_le_bytes());
    frame.extend_from_slice(&len.to_le_bytes());
    frame.extend_from_slice(&crc32fast::hash(&ipc).to_le_bytes());
    let header_crc = crc32fast::hash(&frame[..ENV_HEADER_CRC_OFFSET]);
    frame.extend_from_slice(&header_crc.to_le_bytes());
    frame.extend_from_slice(&ipc);
    Ok(frame)
}

/// One RecordBatch as a self-contained Arrow IPC stream in an envelope.
fn frame_of(batch: &RecordBatch) -> Result<Vec<u8>, PushLogError> {
    let mut w = StreamWriter::try_new(Vec::new(), &batch.schema())?;
    w.write(batch)?;
    w.finish()?;
    envelope(w.into_inner()?)
}

/// Serialize one push as a frame: the envelope, then a self-contained
/// Arrow IPC stream of schema, one RecordBatch, end of stream.
pub fn encode_frame(push: &Push) -> Result<Vec<u8>, PushLogError> {
    frame_of(&to_batch(push)?)
}

/// Why the bytes at an offset are not a whole frame.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Fault {
    /// The envelope is cut short or does not check: where the frame would
    /// end is unknown.
    Envelope(&'static str),
    /// The envelope checks, but the contents it frames are cut short or
    /// fail their crc; the frame would end at `end` (from the offset).
    Contents { why: &'static str, end: usize },
    /// A whole envelope of another format version.
    Version(u32),
}

impl std::fmt::Display for Fault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Fault::Envelope(why) | Fault::Contents { why, .. } => f.write_str(why),
            Fault::Version(v) => write!(f, "format version {v}"),
        }
    }
}

/// The Arrow IPC bytes of the frame at the front of `bytes`, crc checked,
/// and the frame's whole length.
fn open_envelope(bytes: &[u8]) -> Result<(&[u8], usize), Fault> {
    if bytes.len() < ENVELOPE_LEN {
        return Err(Fault::Envelope("an envelope cut short"));
    }
    if bytes[..8] != FRAME_MAGIC {
        return Err(Fault::Envelope("no frame magic"));
    }
    if crc32fast::hash(&bytes[..ENV_HEADER_CRC_OFFSET]) != le32(bytes, ENV_HEADER_CRC_OFFSET) {
        return Err(Fault::Envelope("the envelope's crc does not match"));
    }
    let version = le32(bytes, ENV_VERSION_OFFSET);
    if version != PUSHLOG_VERSION {
        return Err(Fault::Version(version));
    }
    let end = ENVELOPE_LEN + le32(bytes, ENV_LEN_OFFSET) as usize;
    let Some(ipc) = bytes.get(ENVELOPE_LEN..end) else {
        return Err(Fault::Contents {
            why: "contents cut short",
            end,
        });
    };
    if crc32fast::hash(ipc) != le32(bytes, ENV_CRC_OFFSET) {
        return Err(Fault::Contents {
            why: "the contents' crc does not match",
            end,
        });
    }
    Ok((ipc, end))
}

/// Where the first whole frame at or after `from` starts, if any.
fn next_whole_frame(bytes: &[u8], from: usize) -> Option<usize> {
    let rest = bytes.get(from..)?;
    rest.windows(FRAME_MAGIC.len())
        .enumerate()
        .filter(|(_, w)| *w == FRAME_MAGIC)
        .map(|(i, _)| from + i)
        .find(|&at| open_envelope(&bytes[at..]).is_ok())
}

/// What a frame holds.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Frame {
    Push(Push),
    /// The refs as a compaction folded them, and the archive's length
    /// before that compaction.
    Checkpoint(Push, u64),
}

/// The schema a frame of `kind` is decoded into.
fn schema_of(kind: ipc::SchemaKind) -> SchemaRef {
    match kind {
        ipc::SchemaKind::Push => schema(),
        ipc::SchemaKind::Checkpoint(c) => schema_with(KIND_CHECKPOINT, Some(c)),
    }
}

/// The frame Arrow IPC bytes (crc checked) hold. An error here is never a
/// torn write: the bytes are the ones written.
fn decode_contents(ipc: &[u8]) -> Result<Frame, String> {
    let (kind, batch) = ipc::decode_stream(ipc)?;
    Ok(match kind {
        ipc::SchemaKind::Push => Frame::Push(from_batch(&batch).map_err(|e| e.to_string())?),
        ipc::SchemaKind::Checkpoint(c) => {
            let updates = match batch.num_rows() {
                0 => Vec::new(),
                _ => from_batch(&batch).map_err(|e| e.to_string())?.updates,
            };
            let state = Push {
                seq: c.seq,
                at_ms: c.at_ms,
                updates,
            };
            Frame::Checkpoint(state, c.archive_len)
        }
    })
}

/// What a scan recovered, and what it threw away.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PushLogScan {
    /// The refs a compaction folded, as a push of creations (of none when
    /// no ref was left), when the log starts with one.
    pub checkpoint: Option<Push>,
    pub pushes: Vec<Push>,
    /// Where the last whole frame ends.
    pub good_bytes: u64,
    /// Bytes after it: a torn tail.
    pub discarded_bytes: u64,
}

/// Read forward over concatenated frames. A frame that does not check with
/// no whole frame after it is the torn tail a crash leaves: it ends the
/// scan and is no error. Anything else that does not check or decode is
/// [`ScanError::Damaged`] at the frame's offset; a file of format version
/// 1 (bare Arrow IPC streams) or a frame of another version is
/// [`ScanError::Version`].
pub fn scan_frames(bytes: &[u8]) -> Result<PushLogScan, ScanError> {
    if bytes.starts_with(&UNFRAMED_START) {
        return Err(ScanError::Version {
            offset: 0,
            found: 1,
        });
    }
    let mut scan = PushLogScan::default();
    let mut at = 0usize;
    while at < bytes.len() {
        let damaged = |why: String| ScanError::Damaged {
            offset: at as u64,
            why,
        };
        let fault = match open_envelope(&bytes[at..]) {
            Ok((ipc, len)) => {
                match decode_contents(ipc).map_err(|why| damaged(format!("{why} (crc matches)")))? {
                    Frame::Push(push) => scan.pushes.push(push),
                    Frame::Checkpoint(state, _) if at == 0 => scan.checkpoint = Some(state),
                    Frame::Checkpoint(..) => {
                        return Err(damaged("a checkpoint after the first frame".into()))
                    }
                }
                at += len;
                continue;
            }
            Err(fault) => fault,
        };
        // Where a frame after this one could start: past its contents when
        // its envelope checks (they may hold any bytes), else anywhere.
        let from = match fault {
            Fault::Version(found) => {
                return Err(ScanError::Version {
                    offset: at as u64,
                    found,
                })
            }
            Fault::Contents { end, .. } => at.saturating_add(end),
            Fault::Envelope(_) => at + 1,
        };
        if let Some(next) = next_whole_frame(bytes, from) {
            return Err(damaged(format!(
                "{fault}; a whole frame follows at byte {next}"
            )));
        }
        break;
    }
    scan.good_bytes = at as u64;
    scan.discarded_bytes = (bytes.len() - at) as u64;
    Ok(scan)
}

/// When a log should be compacted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CompactionPolicy {
    /// Pushes in the live log before a compaction is due.
    pub min_pushes: usize,
}

impl Default for CompactionPolicy {
    fn default() -> Self {
        CompactionPolicy { min_pushes: 1024 }
    }
}

/// What one compaction did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CompactionReport {
    /// Pushes moved from the live log to the reflog archive.
    pub retired: usize,
    pub live_bytes_before: u64,
    pub live_bytes_after: u64,
    /// The archive's length after the compaction.
    pub archive_bytes: u64,
}

/// Where a compaction stops: only a crash test asks for anything but
/// `Swap`. Each earlier stop is what a crash right after that step leaves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Finish {
    /// The folded refs are written and fsynced beside the live log.
    Staged,
    /// The retired pushes are appended to the archive and fsynced too.
    Archived,
    /// The staged log replaced the live one (rename, directory fsync).
    Swap,
}

fn sync_dir_of(path: &Path) -> std::io::Result<()> {
    match path.parent().filter(|d| !d.as_os_str().is_empty()) {
        Some(dir) => File::open(dir)?.sync_all(),
        None => File::open(".")?.sync_all(),
    }
}

/// An append-only push log file. One `append` is one push, durable when it
/// returns. Compaction folds the live log's pushes into one checkpoint
/// frame of the current refs and moves the pushes to a reflog archive
/// beside it (`<file>.reflog`), so every push is kept exactly once, across
/// both files, whatever step a crash interrupts.
#[derive(Debug)]
pub struct PushLog {
    path: PathBuf,
    file: File,
    len: u64,
    checkpoint: Option<Push>,
    pushes: Vec<Push>,
}

impl PushLog {
    /// The reflog archive beside a log.
    pub fn archive_path(path: &Path) -> PathBuf {
        let mut name = path.as_os_str().to_owned();
        name.push(".reflog");
        PathBuf::from(name)
    }

    fn staged_path(path: &Path) -> PathBuf {
        Self::beside(path, ".compact")
    }

    fn beside(path: &Path, suffix: &str) -> PathBuf {
        let mut name = path.as_os_str().to_owned();
        name.push(suffix);
        PathBuf::from(name)
    }

    /// Open or create the log at `path`. A torn tail is cut (and said so in
    /// the logs), so the next push follows the last whole one; a compaction
    /// a crash interrupted before its swap is rolled back. Damage before
    /// the tail is [`PushLogError::Corrupt`], a file of another format
    /// version [`PushLogError::Version`]: nothing is cut then.
    pub fn open(path: impl AsRef<Path>) -> Result<PushLog, PushLogError> {
        let path = path.as_ref().to_path_buf();
        Self::finish_retain(&path)?;
        Self::roll_back_compaction(&path)?;
        let created = !path.exists();
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)?;
        if created {
            sync_dir_of(&path)?;
        }
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes)?;
        let scan = scan_frames(&bytes).map_err(|e| e.in_file(&path))?;
        if scan.discarded_bytes > 0 {
            tracing::warn!(
                path = %path.display(), kept = scan.good_bytes, discarded = scan.discarded_bytes,
                "push log: cutting a torn tail"
            );
            file.set_len(scan.good_bytes)?;
            file.sync_all()?;
        }
        Ok(PushLog {
            path,
            file,
            len: scan.good_bytes,
            checkpoint: scan.checkpoint,
            pushes: scan.pushes,
        })
    }

    /// A staged compaction that never swapped: the archive may hold the
    /// pushes the live log still holds. Cut the archive back to its length
    /// before, then drop the staged file.
    fn roll_back_compaction(path: &Path) -> Result<(), PushLogError> {
        let staged = Self::staged_path(path);
        if !staged.exists() {
            return Ok(());
        }
        let bytes = std::fs::read(&staged)?;
        let corrupt = |why: String| PushLogError::Corrupt {
            path: staged.clone(),
            offset: 0,
            why,
        };
        if bytes.starts_with(&UNFRAMED_START) {
            return Err(PushLogError::Version {
                path: staged.clone(),
                offset: 0,
                found: 1,
            });
        }
        // A staged frame that does not check was cut before its fsync (the
        // archive is untouched); one that checks must be a checkpoint.
        let archive_len_before = match open_envelope(&bytes) {
            Ok((ipc, len)) if len == bytes.len() => match decode_contents(ipc) {
                Ok(Frame::Checkpoint(_, archive_len)) => Some(archive_len),
                Ok(Frame::Push(_)) => {
                    return Err(corrupt("a staged push, not a checkpoint".into()))
                }
                Err(why) => return Err(corrupt(format!("{why} (crc matches)"))),
            },
            Ok((_, len)) => {
                return Err(corrupt(format!(
                    "{} bytes after the staged checkpoint",
                    bytes.len() - len
                )))
            }
            Err(Fault::Version(found)) => {
                return Err(PushLogError::Version {
                    path: staged.clone(),
                    offset: 0,
                    found,
                })
            }
            Err(_) => None,
        };
        if let Some(archive_len) = archive_len_before {
            let archive = Self::archive_path(path);
            if archive.exists() {
                let f = OpenOptions::new().write(true).open(&archive)?;
                if f.metadata()?.len() > archive_len {
                    f.set_len(archive_len)?;
                    f.sync_all()?;
                }
            }
        }
        std::fs::remove_file(&staged)?;
        sync_dir_of(path)?;
        tracing::warn!(path = %path.display(), "push log: rolled back an interrupted compaction");
        Ok(())
    }

    /// Append one push as one frame, fsynced before this returns.
    pub fn append(&mut self, push: &Push) -> Result<(), PushLogError> {
        let frame = encode_frame(push)?;
        self.file.write_all_at(&frame, self.len)?;
        self.file.sync_data()?;
        self.len += frame.len() as u64;
        self.pushes.push(push.clone());
        Ok(())
    }

    /// Drop every push of a seq before `before`, from the live log and the
    /// archive: the pushes kept are written to `<file>.erasing` (fsync),
    /// which a rename to `<file>.erased` marks whole; then the archive is
    /// removed and `.erased` renamed over the live log. A crash before the
    /// first rename keeps the old log; after it, `open` finishes the job.
    /// The result is an uncompacted log, as if the dropped pushes had never
    /// been appended: an update's `old` is where the kept pushes left its
    /// ref, so none names an object only a dropped push set (a log whose
    /// `old`s already agree and which drops nothing is left as it is).
    /// Returns how many pushes went.
    pub fn retain_from(&mut self, before: u64) -> Result<usize, PushLogError> {
        let history = self.history()?;
        let (mut kept, dropped): (Vec<Push>, Vec<Push>) =
            history.into_iter().partition(|p| p.seq >= before);
        let mut refs = std::collections::BTreeMap::new();
        let mut rebased = false;
        for u in kept.iter_mut().flat_map(|p| p.updates.iter_mut()) {
            let was = refs.get(&u.name).copied();
            rebased |= u.old != was;
            u.old = was;
            match u.new {
                Some(oid) => refs.insert(u.name.clone(), oid),
                None => refs.remove(&u.name),
            };
        }
        if dropped.is_empty() && !rebased {
            return Ok(0);
        }
        let erasing = Self::beside(&self.path, ".erasing");
        {
            let mut bytes = Vec::new();
            for push in &kept {
                bytes.extend_from_slice(&encode_frame(push)?);
            }
            let f = File::create(&erasing)?;
            f.write_all_at(&bytes, 0)?;
            f.sync_all()?;
        }
        std::fs::rename(&erasing, Self::beside(&self.path, ".erased"))?;
        sync_dir_of(&self.path)?;
        Self::finish_retain(&self.path)?;
        *self = PushLog::open(&self.path)?;
        Ok(dropped.len())
    }

    /// Finish a `retain_from` a crash interrupted, or drop its unfinished
    /// staged file.
    fn finish_retain(path: &Path) -> Result<(), PushLogError> {
        let erasing = Self::beside(path, ".erasing");
        if erasing.exists() {
            std::fs::remove_file(&erasing)?;
        }
        let erased = Self::beside(path, ".erased");
        if !erased.exists() {
            return Ok(());
        }
        match std::fs::remove_file(Self::archive_path(path)) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e.into()),
        }
        std::fs::rename(&erased, path)?;
        sync_dir_of(path)?;
        Ok(())
    }

    /// The seq of the last push held, 0 for none.
    pub fn last_seq(&self) -> u64 {
        self.pushes
            .last()
            .or(self.checkpoint.as_ref())
            .map_or(0, |p| p.seq)
    }

    /// The pushes since the last compaction, oldest first.
    pub fn pushes(&self) -> &[Push] {
        &self.pushes
    }

    /// The refs now: the checkpoint, then every push since, in order.
    pub fn refs(&self) -> std::collections::BTreeMap<String, [u8; OID_LEN]> {
        let mut refs = std::collections::BTreeMap::new();
        for push in self.checkpoint.iter().chain(&self.pushes) {
            for u in &push.updates {
                match u.new {
                    Some(oid) => refs.insert(u.name.clone(), oid),
                    None => refs.remove(&u.name),
                };
            }
        }
        refs
    }

    /// Every push ever appended, oldest first: the archive's, then the live
    /// log's.
    pub fn history(&self) -> Result<Vec<Push>, PushLogError> {
        let archive = Self::archive_path(&self.path);
        let mut all = match std::fs::read(&archive) {
            Ok(bytes) => {
                let scan = scan_frames(&bytes).map_err(|e| e.in_file(&archive))?;
                // The archive is appended only inside a compaction, and
                // `open` rolls back one a crash interrupted, cutting the
                // archive to its length before: it has no torn tail, so
                // bytes that do not check there are damage.
                let damage = if scan.checkpoint.is_some() {
                    Some((0, "a checkpoint in the reflog archive"))
                } else if scan.discarded_bytes > 0 {
                    Some((scan.good_bytes, "a frame that does not check at its end"))
                } else {
                    None
                };
                if let Some((offset, why)) = damage {
                    return Err(PushLogError::Corrupt {
                        path: archive,
                        offset,
                        why: why.into(),
                    });
                }
                scan.pushes
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(e) => return Err(e.into()),
        };
        all.extend(self.pushes.iter().cloned());
        Ok(all)
    }

    /// Whether `policy` says a compaction is due.
    pub fn compaction_due(&self, policy: &CompactionPolicy) -> bool {
        self.pushes.len() >= policy.min_pushes.max(1)
    }

    /// Compact: stage one checkpoint frame of the current refs (fsync),
    /// append the live pushes to the archive (fsync), then rename the staged
    /// file over the live log (directory fsync). `finish` stops early, as a
    /// crash would; `open` rolls such a compaction back.
    pub fn compact(&mut self, finish: Finish) -> Result<CompactionReport, PushLogError> {
        let archive_path = Self::archive_path(&self.path);
        let archive_len = std::fs::metadata(&archive_path).map_or(0, |m| m.len());
        let state = Push {
            seq: self
                .pushes
                .last()
                .or(self.checkpoint.as_ref())
                .map_or(0, |p| p.seq),
            at_ms: self
                .pushes
                .last()
                .or(self.checkpoint.as_ref())
                .map_or(0, |p| p.at_ms),
            updates: self
                .refs()
                .into_iter()
                .map(|(name, oid)| RefUpdate {
                    name,
                    old: None,
                    new: Some(oid),
                })
                .collect(),
        };
        // Written even when no ref is left: the staged frame is what tells
        // `open` the archive's length before, and the checkpoint keeps the
        // last seq (`last_seq`) once the pushes have moved out.
        let meta = CheckpointMeta {
            archive_len,
            seq: state.seq,
            at_ms: state.at_ms,
        };
        let frame = frame_of(&to_batch_with(
            &state,
            schema_with(KIND_CHECKPOINT, Some(meta)),
        )?)?;
        let staged_path = Self::staged_path(&self.path);
        {
            let staged = File::create(&staged_path)?;
            staged.write_all_at(&frame, 0)?;
            staged.sync_all()?;
        }
        let mut report = CompactionReport {
            retired: self.pushes.len(),
            live_bytes_before: self.len,
            live_bytes_after: frame.len() as u64,
            archive_bytes: archive_len,
        };
        if finish == Finish::Staged {
            return Ok(report);
        }
        {
            let archive = OpenOptions::new()
                .create(true)
                .append(true)
                .open(&archive_path)?;
            let mut retired = Vec::new();
            for push in &self.pushes {
                retired.extend_from_slice(&encode_frame(push)?);
            }
            std::io::Write::write_all(&mut &archive, &retired)?;
            archive.sync_all()?;
            report.archive_bytes = archive_len + retired.len() as u64;
            if archive_len == 0 {
                sync_dir_of(&archive_path)?;
            }
        }
        if finish == Finish::Archived {
            return Ok(report);
        }
        std::fs::rename(&staged_path, &self.path)?;
        sync_dir_of(&self.path)?;
        self.file = OpenOptions::new().read(true).write(true).open(&self.path)?;
        self.len = frame.len() as u64;
        self.checkpoint = Some(state);
        self.pushes.clear();
        Ok(report)
    }

    /// The file's length: the end of the last whole frame.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether the live log holds no push and no checkpoint.
    pub fn is_empty(&self) -> bool {
        self.pushes.is_empty() && self.checkpoint.is_none()
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// The name of the push log's section in a sealed archive.
pub const SEALED_SECTION: &str = "pushlog";

/// Sealed archive magic, after the manifest at the end of the file.
pub const ARCHIVE_MAGIC: [u8; 8] = *b"\x89TWA\r\n\x1a\n";

/// Pushes as an Arrow IPC file, one RecordBatch per push, so the push
/// boundaries survive sealing and any Arrow reader reads them.
pub fn seal(pushes: &[Push]) -> Result<Vec<u8>, PushLogError> {
    let schema = schema();
    let mut w = arrow_ipc::writer::FileWriter::try_new(Vec::new(), &schema)?;
    for push in pushes {
        w.write(&to_batch(push)?)?;
    }
    w.finish()?;
    Ok(w.into_inner()?)
}

/// An archive of named sections: the sections back to back, then a
/// manifest (per section: name length u16, name, offset u64, length u64),
/// its length u32, and [`ARCHIVE_MAGIC`]. Little-endian. A reader finds a
/// section's byte range from the manifest and needs no twinlog code.
pub fn write_archive(path: &Path, sections: &[(&str, Vec<u8>)]) -> Result<(), PushLogError> {
    let mut out = Vec::new();
    let mut manifest = Vec::new();
    for (name, bytes) in sections {
        let name_len = u16::try_from(name.len())
            .map_err(|_| PushLogError::Shape("section name too long".into()))?;
        manifest.extend_from_slice(&name_len.to_le_bytes());
        manifest.extend_from_slice(name.as_bytes());
        manifest.extend_from_slice(&(out.len() as u64).to_le_bytes());
        manifest.extend_from_slice(&(bytes.len() as u64).to_le_bytes());
        out.extend_from_slice(bytes);
    }
    out.extend_from_slice(&manifest);
    out.extend_from_slice(&(manifest.len() as u32).to_le_bytes());
    out.extend_from_slice(&ARCHIVE_MAGIC);
    let tmp = path.with_extension("tmp");
    {
        let f = File::create(&tmp)?;
        f.write_all_at(&out, 0)?;
        f.sync_all()?;
    }
    std::fs::rename(&tmp, path)?;
    sync_dir_of(path)?;
    Ok(())
}

/// Where section `name` starts in an archive and its bytes, None when it
/// has none.
fn section<'a>(archive: &'a [u8], name: &str) -> Result<Option<(u64, &'a [u8])>, PushLogError> {
    let bad = |what: &str| PushLogError::Shape(format!("archive: {what}"));
    let n = archive.len();
    if n < 12 || archive[n - 8..] != ARCHIVE_MAGIC {
        return Err(bad("no archive magic at the end"));
    }
    let mlen = u32::from_le_bytes([
        archive[n - 12],
        archive[n - 11],
        archive[n - 10],
        archive[n - 9],
    ]) as usize;
    let mstart = n
        .checked_sub(12 + mlen)
        .ok_or_else(|| bad("manifest longer than the file"))?;
    let mut m = &archive[mstart..n - 12];
    while !m.is_empty() {
        let take = |m: &mut &[u8], k: usize| -> Result<Vec<u8>, PushLogError> {
            if m.len() < k {
                return Err(PushLogError::Shape("archive: manifest cut short".into()));
            }
            let (a, b) = m.split_at(k);
            *m = b;
            Ok(a.to_vec())
        };
        let len = u16::from_le_bytes(
            take(&mut m, 2)?
                .try_into()
                .map_err(|_| bad("name length"))?,
        ) as usize;
        let sname = take(&mut m, len)?;
        let off =
            u64::from_le_bytes(take(&mut m, 8)?.try_into().map_err(|_| bad("offset"))?) as usize;
        let slen =
            u64::from_le_bytes(take(&mut m, 8)?.try_into().map_err(|_| bad("length"))?) as usize;
        if sname == name.as_bytes() {
            let end = off
                .checked_add(slen)
                .filter(|&e| e <= mstart)
                .ok_or_else(|| bad("section past the manifest"))?;
            return Ok(Some((off as u64, &archive[off..end])));
        }
    }
    Ok(None)
}

/// Read the sealed push log back out of an archive: Ok(None) when the
/// archive has no push-log section, distinct from a section with no pushes.
pub fn read_sealed(archive: &Path) -> Result<Option<Vec<Push>>, PushLogError> {
    let bytes = std::fs::read(archive)?;
    let Some((base, section)) = section(&bytes, SEALED_SECTION)? else {
        return Ok(None);
    };
    let corrupt = |offset: u64, why: String| PushLogError::Corrupt {
        path: archive.to_owned(),
        offset: base + offset,
        why,
    };
    let batches = ipc::decode_file(section).map_err(|(at, why)| corrupt(at, why))?;
    let mut pushes = Vec::new();
    for (at, batch) in &batches {
        pushes.push(from_batch(batch).map_err(|e| corrupt(*at, e.to_string()))?);
    }
    Ok(Some(pushes))
}

impl PushLog {
    /// Seal every push ever appended (the archive's, then the live log's)
    /// into the `pushlog` section of an archive at `archive`.
    pub fn seal_into(&self, archive: &Path) -> Result<usize, PushLogError> {
        let history = self.history()?;
        write_archive(archive, &[(SEALED_SECTION, seal(&history)?)])?;
        Ok(history.len())
    }
}
