//! Checked decoding of the push log's Arrow IPC bytes.
//!
//! arrow-ipc's readers trust the lengths and offsets they read: a buffer
//! past the end of a message body panics in arrow-buffer, a field type
//! other than the ones they expect panics in the schema conversion, and a
//! declared length is allocated before it is checked. A crc only proves the
//! bytes are the ones written, not that a writer wrote them well, so every
//! message is walked and checked against the one shape the push log writes
//! (its schema, one batch of five columns) before arrow-ipc decodes the
//! batch's buffers, and that decode runs under `catch_unwind`.

use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};

use arrow_array::RecordBatch;
use arrow_buffer::Buffer;
use arrow_ipc::{Endianness, Message, MessageHeader, MetadataVersion, Type};
use arrow_schema::{DataType, SchemaRef};

use super::codec::{self, fields, CheckpointMeta};
use super::OID_LEN;

/// Every IPC message starts with this, then its metadata length (i32).
const CONTINUATION: [u8; 4] = [0xff; 4];
/// The first and last bytes of an Arrow IPC file.
const FILE_MAGIC: [u8; 6] = *b"ARROW1";
/// Buffers of a push batch: validity and values for each UInt64 and
/// FixedSizeBinary column, validity, offsets and values for the Utf8 one.
const BUFFERS: usize = 2 + 2 + 3 + 2 + 2;
/// The index of each column's validity bitmap among those buffers.
const VALIDITY: [usize; 5] = [0, 2, 4, 7, 9];
/// Buffers of fixed-width elements and the width: the UInt64 values and
/// the Utf8 offsets. arrow-buffer asserts such a buffer is a whole number
/// of elements when it views it typed.
const WIDTHS: [(usize, i64); 3] = [(1, 8), (3, 8), (5, 4)];

/// Why IPC bytes are not what the push log writes.
pub(super) type Why = String;

/// What the schema's metadata says a stream holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum SchemaKind {
    Push,
    Checkpoint(CheckpointMeta),
}

/// What a decode that panicked says; tests look for it, since a panic the
/// checks let through is one to rule out by a check.
pub const ARROW_PANICKED: &str = "arrow-ipc panicked decoding these bytes";

/// Run a check that calls into arrow-ipc, turning a panic into an error.
/// The checks before each call rule out every panic found in arrow-ipc's
/// decoding of these messages; this is the last line of defence (the
/// build unwinds on panic), so that bytes from disk can stop a store by
/// name but never bring the daemon down.
fn guarded<T, E>(
    f: impl FnOnce() -> Result<T, E>,
    panicked: impl FnOnce(Why) -> E,
) -> Result<T, E> {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|_| Err(panicked(ARROW_PANICKED.into())))
}

/// The next IPC message at `*at`: its verified flatbuffer metadata and its
/// body, both within `bytes`; `None` at the end-of-stream marker.
fn next_message<'a>(
    bytes: &'a [u8],
    at: &mut usize,
) -> Result<Option<(Message<'a>, &'a [u8])>, Why> {
    let rest = bytes.get(*at..).unwrap_or_default();
    if rest.len() < 8 || rest[..4] != CONTINUATION {
        return Err(format!("no message prefix at IPC byte {at}"));
    }
    let meta_len = i32::from_le_bytes([rest[4], rest[5], rest[6], rest[7]]);
    if meta_len == 0 {
        *at += 8;
        return Ok(None);
    }
    let meta_len = usize::try_from(meta_len)
        .ok()
        .filter(|&n| n <= rest.len() - 8)
        .ok_or_else(|| {
            format!("metadata of {meta_len} bytes at IPC byte {at} runs past the frame")
        })?;
    let meta = &rest[8..8 + meta_len];
    let message =
        arrow_ipc::root_as_message(meta).map_err(|e| format!("message at IPC byte {at}: {e}"))?;
    let body_at = 8 + meta_len;
    let body_len = usize::try_from(message.bodyLength())
        .ok()
        .filter(|&n| n <= rest.len() - body_at)
        .ok_or_else(|| {
            format!(
                "a body of {} bytes at IPC byte {at} runs past the frame",
                message.bodyLength()
            )
        })?;
    *at += body_at + body_len;
    Ok(Some((message, &rest[body_at..body_at + body_len])))
}

/// Check a schema against the push log's five fields and read what its
/// metadata says the stream holds.
fn check_schema(schema: arrow_ipc::Schema<'_>) -> Result<SchemaKind, Why> {
    if schema.endianness() != Endianness::Little {
        return Err("a big-endian schema".into());
    }
    let got = schema.fields().ok_or("a schema without fields")?;
    let want = fields();
    if got.len() != want.len() {
        return Err(format!(
            "a schema of {} fields, not {}",
            got.len(),
            want.len()
        ));
    }
    for (f, w) in got.iter().zip(&want) {
        let shaped = f.name() == Some(w.name().as_str())
            && f.nullable() == w.is_nullable()
            && f.dictionary().is_none()
            && f.children().is_none_or(|c| c.is_empty())
            && f.custom_metadata().is_none_or(|m| m.is_empty())
            && match w.data_type() {
                DataType::UInt64 => f
                    .type_as_int()
                    .is_some_and(|t| t.bitWidth() == 64 && !t.is_signed()),
                DataType::Utf8 => f.type_type() == Type::Utf8,
                DataType::FixedSizeBinary(_) => f
                    .type_as_fixed_size_binary()
                    .is_some_and(|t| t.byteWidth() == OID_LEN as i32),
                _ => false,
            };
        if !shaped {
            return Err(format!(
                "field {:?} is not the push log's {}",
                f.name(),
                w.name()
            ));
        }
    }
    let mut meta = HashMap::new();
    for kv in schema.custom_metadata().iter().flatten() {
        match (kv.key(), kv.value()) {
            (Some(k), Some(v)) => meta.insert(k, v),
            _ => return Err("schema metadata without a key or value".into()),
        };
    }
    let number = |key: &str| -> Result<u64, Why> {
        meta.get(key)
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| format!("a checkpoint without a number for {key}"))
    };
    match meta.get(codec::KIND_KEY).copied() {
        Some(codec::KIND_PUSH) => Ok(SchemaKind::Push),
        Some(codec::KIND_CHECKPOINT) => Ok(SchemaKind::Checkpoint(CheckpointMeta {
            archive_len: number(codec::ARCHIVE_LEN_KEY)?,
            seq: number(codec::CHECKPOINT_SEQ_KEY)?,
            at_ms: number(codec::CHECKPOINT_AT_KEY)?,
        })),
        other => Err(format!("schema kind {other:?}")),
    }
}

/// Check a record batch message against the push log's shape, of at least
/// `min_rows` rows, then decode it into `schema`.
fn decode_batch(
    message: &Message<'_>,
    body: &[u8],
    schema: SchemaRef,
    min_rows: i64,
) -> Result<RecordBatch, Why> {
    if message.version() != MetadataVersion::V5 {
        return Err(format!("IPC metadata version {:?}", message.version()));
    }
    let batch = message
        .header_as_record_batch()
        .ok_or("a message that is not a record batch")?;
    if batch.compression().is_some() {
        return Err("a compressed batch".into());
    }
    if batch.variadicBufferCounts().is_some_and(|v| !v.is_empty()) {
        return Err("variadic buffers".into());
    }
    let rows = batch.length();
    // Every row holds 20 bytes of each oid column at least, so a row count
    // beyond the body's length is a lie; checked before anything is sized
    // by it.
    if rows < min_rows || rows as u64 > body.len() as u64 {
        return Err(format!("a batch of {rows} rows in {} bytes", body.len()));
    }
    let buffers = batch.buffers().ok_or("a batch without buffers")?;
    if buffers.len() != BUFFERS {
        return Err(format!(
            "a batch of {} buffers, not {BUFFERS}",
            buffers.len()
        ));
    }
    for b in buffers.iter() {
        let in_body = u64::try_from(b.offset())
            .ok()
            .zip(u64::try_from(b.length()).ok())
            .and_then(|(o, l)| o.checked_add(l))
            .is_some_and(|end| end <= body.len() as u64);
        if !in_body {
            return Err(format!(
                "a buffer of {} bytes at {} outside a body of {}",
                b.length(),
                b.offset(),
                body.len()
            ));
        }
    }
    for (i, width) in WIDTHS {
        if buffers.get(i).length() % width != 0 {
            return Err(format!(
                "buffer {i} is not a whole number of {width}-byte values"
            ));
        }
    }
    let nodes = batch.nodes().ok_or("a batch without field nodes")?;
    if nodes.len() != VALIDITY.len() {
        return Err(format!("a batch of {} columns", nodes.len()));
    }
    for ((node, field), validity) in nodes.iter().zip(fields()).zip(VALIDITY) {
        let nulls = node.null_count();
        let shaped = node.length() == rows
            && (0..=rows).contains(&nulls)
            && (field.is_nullable() || nulls == 0)
            // arrow-buffer asserts a validity bitmap covers every row.
            && (nulls == 0 || buffers.get(validity).length() >= (rows + 7) / 8);
        if !shaped {
            return Err(format!(
                "column {} of {} rows ({nulls} null) in a batch of {rows}",
                field.name(),
                node.length()
            ));
        }
    }
    let version = message.version();
    arrow_ipc::reader::read_record_batch(
        &Buffer::from(body),
        batch,
        schema,
        &HashMap::new(),
        None,
        &version,
    )
    .map_err(|e| e.to_string())
}

/// Decode one stream (schema, one batch, end of stream, nothing after):
/// the schema's kind and the batch.
pub(super) fn decode_stream(ipc: &[u8]) -> Result<(SchemaKind, RecordBatch), Why> {
    guarded(
        || {
            let mut at = 0;
            let (message, _) = next_message(ipc, &mut at)?.ok_or("a stream without a schema")?;
            if message.header_type() != MessageHeader::Schema {
                return Err("a stream that does not start with its schema".into());
            }
            let schema = message
                .header_as_schema()
                .ok_or("a schema message without a schema")?;
            let kind = check_schema(schema)?;
            let (message, body) = next_message(ipc, &mut at)?.ok_or("a stream without a batch")?;
            // A checkpoint of no refs has no rows; a push moves one at least.
            let min_rows = match kind {
                SchemaKind::Push => 1,
                SchemaKind::Checkpoint(_) => 0,
            };
            let batch = decode_batch(&message, body, codec::schema_of(kind), min_rows)?;
            if next_message(ipc, &mut at)?.is_some() {
                return Err("a stream of more than one batch".into());
            }
            if at != ipc.len() {
                return Err(format!(
                    "{} bytes after the end of the stream",
                    ipc.len() - at
                ));
            }
            Ok((kind, batch))
        },
        |why| why,
    )
}

/// Decode an Arrow IPC file of push batches (a sealed section): each batch
/// and where its block starts, in order, or the byte of the section where
/// it went wrong.
pub(super) fn decode_file(file: &[u8]) -> Result<Vec<(u64, RecordBatch)>, (u64, Why)> {
    guarded(
        || {
            let n = file.len();
            if n < 8 + 10 || file[..6] != FILE_MAGIC || file[n - 6..] != FILE_MAGIC {
                return Err((0, "not an Arrow IPC file".into()));
            }
            let footer_len =
                i32::from_le_bytes([file[n - 10], file[n - 9], file[n - 8], file[n - 7]]);
            let footer_at = usize::try_from(footer_len)
                .ok()
                .and_then(|l| (n - 10).checked_sub(l))
                .filter(|&at| at >= 8)
                .ok_or_else(|| ((n - 10) as u64, format!("a footer of {footer_len} bytes")))?;
            let bad_footer = |why: String| (footer_at as u64, why);
            let footer = arrow_ipc::root_as_footer(&file[footer_at..n - 10])
                .map_err(|e| bad_footer(format!("footer: {e}")))?;
            let schema = footer
                .schema()
                .ok_or_else(|| bad_footer("no schema".into()))?;
            if check_schema(schema).map_err(bad_footer)? != SchemaKind::Push {
                return Err(bad_footer("a sealed section of another kind".into()));
            }
            if footer.dictionaries().is_some_and(|d| !d.is_empty()) {
                return Err(bad_footer("dictionaries".into()));
            }
            let mut batches = Vec::new();
            for block in footer.recordBatches().iter().flatten() {
                let at = block.offset();
                let range = usize::try_from(at)
                    .ok()
                    .filter(|&a| a >= 8)
                    .zip(usize::try_from(block.metaDataLength()).ok())
                    .zip(usize::try_from(block.bodyLength()).ok())
                    .and_then(|((a, m), b)| Some((a, a.checked_add(m)?.checked_add(b)?)))
                    .filter(|&(_, end)| end <= footer_at);
                let Some((start, end)) = range else {
                    return Err(bad_footer(format!(
                        "a batch block at {at} outside the file"
                    )));
                };
                let bytes = &file[start..end];
                let bad = |why: Why| (start as u64, why);
                let mut pos = 0;
                let (message, body) = next_message(bytes, &mut pos)
                    .map_err(bad)?
                    .ok_or_else(|| bad("an end-of-stream marker for a batch".into()))?;
                if pos != bytes.len() {
                    return Err(bad("a block whose length is not its message's".into()));
                }
                let batch = decode_batch(&message, body, super::schema(), 1).map_err(bad)?;
                batches.push((start as u64, batch));
            }
            Ok(batches)
        },
        |why| (0, why),
    )
}
