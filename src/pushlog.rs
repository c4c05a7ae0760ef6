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

/// Schema metadata saying what a frame holds.
const KIND_KEY: &str = "twinlog.pushlog";
const KIND_PUSH: &str = "push";
const KIND_CHECKPOINT: &str = "checkpoint";
/// Checkpoint metadata: the archive's length before the compaction that
/// wrote it, so an interrupted compaction can be rolled back.
const ARCHIVE_LEN_KEY: &str = "twinlog.archive_len_before";

/// The schema of a push frame: one row per ref update.
pub fn schema() -> SchemaRef {
    schema_with(KIND_PUSH, None)
}

fn schema_with(kind: &str, archive_len: Option<u64>) -> SchemaRef {
    let mut meta = std::collections::HashMap::new();
    meta.insert(KIND_KEY.to_string(), kind.to_string());
    if let Some(len) = archive_len {
        meta.insert(ARCHIVE_LEN_KEY.to_string(), len.to_string());
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
    to_batch_with(push, schema())
}

fn to_batch_with(push: &Push, schema: SchemaRef) -> Result<RecordBatch, PushLogError> {
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

/// What a frame holds.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Frame {
    Push(Push),
    /// The refs as a compaction folded them, and the archive's length
    /// before that compaction.
    Checkpoint(Push, u64),
}

/// One frame from the front of `bytes` and its length, or None when the
/// bytes do not hold a whole frame of exactly one batch.
fn decode_frame(bytes: &[u8]) -> Option<(Frame, usize)> {
    let mut cursor = Cursor::new(bytes);
    let frame = {
        let mut reader = StreamReader::try_new(&mut cursor, None).ok()?;
        let meta = reader.schema().metadata().clone();
        let batch = reader.next()?.ok()?;
        if reader.next().is_some() || !reader.is_finished() {
            return None;
        }
        let push = from_batch(&batch).ok()?;
        match meta.get(KIND_KEY).map(String::as_str) {
            Some(KIND_PUSH) => Frame::Push(push),
            Some(KIND_CHECKPOINT) => {
                let len = meta.get(ARCHIVE_LEN_KEY)?.parse().ok()?;
                Frame::Checkpoint(push, len)
            }
            _ => return None,
        }
    };
    let end = cursor.position() as usize;
    (end >= EOS.len() && bytes[end - EOS.len()..end] == EOS).then_some((frame, end))
}

/// What a scan recovered, and what it threw away.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PushLogScan {
    /// The refs a compaction folded, as a push of creations, when the log
    /// starts with one.
    pub checkpoint: Option<Push>,
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
            Some((Frame::Push(push), len)) => {
                scan.pushes.push(push);
                at += len;
            }
            Some((Frame::Checkpoint(state, _), len)) if at == 0 => {
                scan.checkpoint = Some(state);
                at += len;
            }
            _ => break,
        }
    }
    scan.good_bytes = at as u64;
    scan.discarded_bytes = (bytes.len() - at) as u64;
    scan
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
    /// a crash interrupted before its swap is rolled back.
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
        if let Some((Frame::Checkpoint(_, archive_len), _)) = decode_frame(&bytes) {
            let archive = Self::archive_path(path);
            if archive.exists() {
                let f = OpenOptions::new().write(true).open(&archive)?;
                if f.metadata()?.len() > archive_len {
                    f.set_len(archive_len)?;
                    f.sync_all()?;
                }
            }
        }
        // A staged file that does not parse was cut before its fsync, and
        // the archive was not touched yet.
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
            Ok(bytes) => scan_frames(&bytes).pushes,
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
        let mut frame = Vec::new();
        if !state.updates.is_empty() {
            let batch = to_batch_with(&state, schema_with(KIND_CHECKPOINT, Some(archive_len)))?;
            let mut w = StreamWriter::try_new(Vec::new(), &batch.schema())?;
            w.write(&batch)?;
            w.finish()?;
            frame = w.into_inner()?;
        }
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
        self.checkpoint = (!state.updates.is_empty()).then_some(state);
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

/// The byte range of section `name` in an archive, None when it has none.
fn section<'a>(archive: &'a [u8], name: &str) -> Result<Option<&'a [u8]>, PushLogError> {
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
            return Ok(Some(&archive[off..end]));
        }
    }
    Ok(None)
}

/// Read the sealed push log back out of an archive: Ok(None) when the
/// archive has no push-log section, distinct from a section with no pushes.
pub fn read_sealed(archive: &Path) -> Result<Option<Vec<Push>>, PushLogError> {
    let bytes = std::fs::read(archive)?;
    let Some(section) = section(&bytes, SEALED_SECTION)? else {
        return Ok(None);
    };
    let reader = arrow_ipc::reader::FileReader::try_new(Cursor::new(section), None)?;
    let mut pushes = Vec::new();
    for batch in reader {
        pushes.push(from_batch(&batch?)?);
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
