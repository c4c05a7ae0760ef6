//! Compaction: the live log's pushes folded into one checkpoint frame of
//! the current refs, the pushes themselves moved to the reflog archive, in
//! three durable steps a crash can interrupt anywhere (`open` rolls an
//! unfinished one back).

use super::codec::{
    encode_frame, frame_of, schema_with, to_batch_with, CheckpointMeta, KIND_CHECKPOINT,
};
use super::{archive_path_of, staged_path, Push, PushLog, PushLogError, RefUpdate};
use crate::publish::sync_parent_with;
use crate::storage::OpenMode;

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

impl PushLog {
    /// Whether `policy` says a compaction is due.
    pub fn compaction_due(&self, policy: &CompactionPolicy) -> bool {
        self.pushes.len() >= policy.min_pushes.max(1)
    }

    /// Compact: stage one checkpoint frame of the current refs (fsync, then
    /// a directory fsync), append the live pushes to the archive (fsync),
    /// then rename the staged file over the live log (directory fsync). `finish` stops early, as a
    /// crash would; `open` rolls such a compaction back.
    pub fn compact(&mut self, finish: Finish) -> Result<CompactionReport, PushLogError> {
        let fs = &*self.fs;
        let archive_path = archive_path_of(&self.path);
        let archive_len = match fs.open(&archive_path, OpenMode::Read) {
            Ok(f) => f.len()?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => 0,
            Err(e) => return Err(e.into()),
        };
        let last = self.pushes.last().or(self.checkpoint.as_ref());
        let state = Push {
            seq: last.map_or(0, |p| p.seq),
            at_ms: last.map_or(0, |p| p.at_ms),
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
        let staged_path = staged_path(&self.path);
        {
            let staged = fs.open(&staged_path, OpenMode::Create)?;
            staged.set_len(0)?;
            staged.write_all_at(&frame, 0)?;
            staged.sync_all()?;
        }
        // The staged file's name must be durable before the archive grows:
        // it is what tells `open` to cut the archive back. Without this
        // fsync a power cut could keep the archive's new pushes and lose
        // the staged name, and every retired push would be read twice.
        sync_parent_with(fs, &staged_path)?;
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
            let archive = fs.open(&archive_path, OpenMode::Create)?;
            let mut retired = Vec::new();
            for push in &self.pushes {
                retired.extend_from_slice(&encode_frame(push)?);
            }
            archive.write_all_at(&retired, archive_len)?;
            archive.sync_all()?;
            report.archive_bytes = archive_len + retired.len() as u64;
            if archive_len == 0 {
                sync_parent_with(fs, &archive_path)?;
            }
        }
        if finish == Finish::Archived {
            return Ok(report);
        }
        fs.rename(&staged_path, &self.path)?;
        sync_parent_with(fs, &self.path)?;
        self.file = fs.open(&self.path, OpenMode::Write)?;
        self.len = frame.len() as u64;
        self.checkpoint = Some(state);
        self.pushes.clear();
        Ok(report)
    }
}
