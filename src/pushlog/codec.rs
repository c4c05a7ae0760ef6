//! The push log's bytes: a push as an Arrow RecordBatch, the batch as a
//! self-contained IPC stream, the stream inside its 24-byte envelope, and
//! the way back, each check named. No file I/O here.

use std::sync::Arc;

use arrow_array::builder::{FixedSizeBinaryBuilder, StringBuilder, UInt64Builder};
use arrow_array::{Array, FixedSizeBinaryArray, RecordBatch, StringArray, UInt64Array};
use arrow_ipc::writer::StreamWriter;
use arrow_schema::{DataType, Field, Schema, SchemaRef};

use super::{ipc, Push, PushLogError, RefUpdate, OID_LEN};

/// Schema metadata saying what a frame holds.
pub(super) const KIND_KEY: &str = "twinlog.pushlog";
pub(super) const KIND_PUSH: &str = "push";
pub(super) const KIND_CHECKPOINT: &str = "checkpoint";
/// Checkpoint metadata: the archive's length before the compaction that
/// wrote it, so an interrupted compaction can be rolled back.
pub(super) const ARCHIVE_LEN_KEY: &str = "twinlog.archive_len_before";
/// Checkpoint metadata: the seq and time of the last push it folds, which
/// a checkpoint of no refs (every ref deleted) has no row to carry.
pub(super) const CHECKPOINT_SEQ_KEY: &str = "twinlog.seq";
pub(super) const CHECKPOINT_AT_KEY: &str = "twinlog.at_ms";

/// What a checkpoint frame's schema metadata says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct CheckpointMeta {
    pub(super) archive_len: u64,
    pub(super) seq: u64,
    pub(super) at_ms: u64,
}

/// The schema of a push frame: one row per ref update.
pub fn schema() -> SchemaRef {
    schema_with(KIND_PUSH, None)
}

pub(super) fn schema_with(kind: &str, checkpoint: Option<CheckpointMeta>) -> SchemaRef {
    let mut meta = std::collections::HashMap::new();
    meta.insert(KIND_KEY.to_string(), kind.to_string());
    if let Some(c) = checkpoint {
        meta.insert(ARCHIVE_LEN_KEY.to_string(), c.archive_len.to_string());
        meta.insert(CHECKPOINT_SEQ_KEY.to_string(), c.seq.to_string());
        meta.insert(CHECKPOINT_AT_KEY.to_string(), c.at_ms.to_string());
    }
    Arc::new(Schema::new_with_metadata(fields(), meta))
}

pub(super) fn fields() -> Vec<Field> {
    vec![
        Field::new("seq", DataType::UInt64, false),
        Field::new("at_ms", DataType::UInt64, false),
        Field::new("ref", DataType::Utf8, false),
        Field::new("old", DataType::FixedSizeBinary(OID_LEN as i32), true),
        Field::new("new", DataType::FixedSizeBinary(OID_LEN as i32), true),
    ]
}

pub(super) fn to_batch(push: &Push) -> Result<RecordBatch, PushLogError> {
    if push.updates.is_empty() {
        return Err(PushLogError::Empty);
    }
    to_batch_with(push, schema())
}

pub(super) fn to_batch_with(push: &Push, schema: SchemaRef) -> Result<RecordBatch, PushLogError> {
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

pub(super) fn oid(a: &FixedSizeBinaryArray, i: usize) -> Option<[u8; OID_LEN]> {
    if a.is_null(i) {
        return None;
    }
    let mut o = [0u8; OID_LEN];
    o.copy_from_slice(a.value(i));
    Some(o)
}

pub(super) fn column<T: 'static>(batch: &RecordBatch, i: usize) -> Result<&T, PushLogError> {
    batch
        .column(i)
        .as_any()
        .downcast_ref::<T>()
        .ok_or_else(|| PushLogError::Shape(format!("column {i} has another type")))
}

pub(super) fn from_batch(batch: &RecordBatch) -> Result<Push, PushLogError> {
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
pub(super) const UNFRAMED_START: [u8; 4] = [0xff; 4];

pub(super) fn le32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// Put Arrow IPC bytes in a frame's envelope.
pub(super) fn envelope(ipc: Vec<u8>) -> Result<Vec<u8>, PushLogError> {
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
pub(super) fn frame_of(batch: &RecordBatch) -> Result<Vec<u8>, PushLogError> {
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
pub(super) enum Fault {
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
pub(super) fn open_envelope(bytes: &[u8]) -> Result<(&[u8], usize), Fault> {
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
pub(super) fn next_whole_frame(bytes: &[u8], from: usize) -> Option<usize> {
    let rest = bytes.get(from..)?;
    rest.windows(FRAME_MAGIC.len())
        .enumerate()
        .filter(|(_, w)| *w == FRAME_MAGIC)
        .map(|(i, _)| from + i)
        .find(|&at| open_envelope(&bytes[at..]).is_ok())
}

/// What a frame holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Frame {
    Push(Push),
    /// The refs as a compaction folded them, and the archive's length
    /// before that compaction.
    Checkpoint(Push, u64),
}

/// The schema a frame of `kind` is decoded into.
pub(super) fn schema_of(kind: ipc::SchemaKind) -> SchemaRef {
    match kind {
        ipc::SchemaKind::Push => schema(),
        ipc::SchemaKind::Checkpoint(c) => schema_with(KIND_CHECKPOINT, Some(c)),
    }
}

/// Why the bytes of a frame (its crc checked) do not decode.
#[derive(Debug, thiserror::Error)]
pub(super) enum ContentsError {
    /// Not one Arrow IPC stream of a known schema and one batch.
    #[error("{0}")]
    Stream(String),
    /// A batch that is not a push.
    #[error(transparent)]
    Batch(#[from] PushLogError),
}

/// The frame Arrow IPC bytes (crc checked) hold. An error here is never a
/// torn write: the bytes are the ones written.
pub(super) fn decode_contents(ipc: &[u8]) -> Result<Frame, ContentsError> {
    let (kind, batch) = ipc::decode_stream(ipc).map_err(ContentsError::Stream)?;
    Ok(match kind {
        ipc::SchemaKind::Push => Frame::Push(from_batch(&batch)?),
        ipc::SchemaKind::Checkpoint(c) => {
            let updates = match batch.num_rows() {
                0 => Vec::new(),
                _ => from_batch(&batch)?.updates,
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
