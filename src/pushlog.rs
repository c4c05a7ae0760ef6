//! The push log: an append-only file of ref updates, one push per
//! self-contained Arrow IPC stream frame (schema, one RecordBatch, end of
//! stream), fsynced per push.
//!
//! The frame boundary is the transaction boundary: a push is visible whole
//! or not at all. Every frame parses on its own, so recovery needs no side
//! file: [`scan_frames`] reads forward while frames parse and stops at the
//! first that does not. A torn tail is discarded whole and is never an
//! error; Arrow's continuation marker and length prefix every message, so a
//! truncated frame ends inside a message and is never taken for a whole
//! one.

use std::fs::{File, OpenOptions};
use std::io::{Cursor, Read};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow_array::builder::{FixedSizeBinaryBuilder, StringBuilder, UInt64Builder};
use arrow_array::{Array, FixedSizeBinaryArray, RecordBatch, StringArray, UInt64Array};
use arrow_ipc::reader::StreamReader;
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
}

/// The schema of a push frame: one row per ref update.
pub fn schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("seq", DataType::UInt64, false),
        Field::new("at_ms", DataType::UInt64, false),
        Field::new("ref", DataType::Utf8, false),
        Field::new("old", DataType::FixedSizeBinary(OID_LEN as i32), true),
        Field::new("new", DataType::FixedSizeBinary(OID_LEN as i32), true),
    ]))
}

fn to_batch(push: &Push) -> Result<RecordBatch, PushLogError> {
    if push.updates.is_empty() {
        return Err(PushLogError::Empty);
    }
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
        schema(),
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
    if batch.schema() != schema() {
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

/// Serialize one push as a self-contained Arrow IPC stream frame: schema,
/// one RecordBatch, end of stream.
pub fn encode_frame(push: &Push) -> Result<Vec<u8>, PushLogError> {
    let batch = to_batch(push)?;
    let mut w = StreamWriter::try_new(Vec::new(), &schema())?;
    w.write(&batch)?;
    w.finish()?;
    Ok(w.into_inner()?)
}

/// The end-of-stream marker every frame ends with.
const EOS: [u8; 8] = [0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0];

/// One frame from the front of `bytes`: its push and length, or None when
/// the bytes do not hold a whole frame of exactly one push.
fn decode_frame(bytes: &[u8]) -> Option<(Push, usize)> {
    let mut cursor = Cursor::new(bytes);
    let push = {
        let mut reader = StreamReader::try_new(&mut cursor, None).ok()?;
        let batch = reader.next()?.ok()?;
        if reader.next().is_some() || !reader.is_finished() {
            return None;
        }
        from_batch(&batch).ok()?
    };
    let end = cursor.position() as usize;
    (end >= EOS.len() && bytes[end - EOS.len()..end] == EOS).then_some((push, end))
}

/// What a scan recovered, and what it threw away.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PushLogScan {
    pub pushes: Vec<Push>,
    /// Where the last whole frame ends.
    pub good_bytes: u64,
    /// Bytes after it: a torn or damaged tail.
    pub discarded_bytes: u64,
}

/// Read forward over concatenated frames, stopping at the first that does
/// not parse. Never errors on a torn tail: that is the expected state after
/// a crash.
pub fn scan_frames(bytes: &[u8]) -> PushLogScan {
    let mut scan = PushLogScan::default();
    let mut at = 0usize;
    while at < bytes.len() {
        match decode_frame(&bytes[at..]) {
            Some((push, len)) => {
                scan.pushes.push(push);
                at += len;
            }
            None => break,
        }
    }
    scan.good_bytes = at as u64;
    scan.discarded_bytes = (bytes.len() - at) as u64;
    scan
}

/// An append-only push log file. One `append` is one push, durable when it
/// returns.
#[derive(Debug)]
pub struct PushLog {
    path: PathBuf,
    file: File,
    len: u64,
    pushes: Vec<Push>,
}

impl PushLog {
    /// Open or create the log at `path`. A torn tail is cut (and said so in
    /// the logs), so the next push follows the last whole one.
    pub fn open(path: impl AsRef<Path>) -> Result<PushLog, PushLogError> {
        let path = path.as_ref().to_path_buf();
        let created = !path.exists();
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)?;
        if created {
            if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
                File::open(dir)?.sync_all()?;
            }
        }
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes)?;
        let scan = scan_frames(&bytes);
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
            pushes: scan.pushes,
        })
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

    /// Every push, oldest first.
    pub fn pushes(&self) -> &[Push] {
        &self.pushes
    }

    /// The file's length: the end of the last whole frame.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether no push was ever appended.
    pub fn is_empty(&self) -> bool {
        self.pushes.is_empty()
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}
