//! The push log file: open (with recovery), append one push per frame,
//! read the refs and the whole history, drop pushes for an erase.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::codec::encode_frame;
use super::recovery::{finish_retain, read_archive, roll_back_compaction, scan_frames};
use super::{archive_path_of, beside, Push, PushLogError, OID_LEN};
use crate::publish::sync_parent_with;
use crate::storage::{OpenMode, StdStorage, Storage, StorageFile};

/// An append-only push log file. One `append` is one push, durable when it
/// returns. Compaction folds the live log's pushes into one checkpoint
/// frame of the current refs and moves the pushes to a reflog archive
/// beside it (`<file>.reflog`), so every push is kept exactly once, across
/// both files, whatever step a crash interrupts.
#[derive(Debug)]
pub struct PushLog {
    pub(super) fs: Arc<dyn Storage>,
    pub(super) path: PathBuf,
    pub(super) file: Arc<dyn StorageFile>,
    pub(super) len: u64,
    pub(super) checkpoint: Option<Push>,
    pub(super) pushes: Vec<Push>,
}

impl PushLog {
    /// The reflog archive beside a log.
    pub fn archive_path(path: &Path) -> PathBuf {
        archive_path_of(path)
    }

    /// Open or create the log at `path`. A torn tail is cut (and said so in
    /// the logs), so the next push follows the last whole one; a compaction
    /// a crash interrupted before its swap is rolled back. Damage before
    /// the tail is [`PushLogError::Corrupt`], a file of another format
    /// version [`PushLogError::Version`]: nothing is cut then.
    pub fn open(path: impl AsRef<Path>) -> Result<PushLog, PushLogError> {
        Self::open_with(StdStorage::shared(), path)
    }

    /// [`PushLog::open`], every byte through `fs`.
    pub fn open_with(
        fs: Arc<dyn Storage>,
        path: impl AsRef<Path>,
    ) -> Result<PushLog, PushLogError> {
        let path = path.as_ref().to_path_buf();
        finish_retain(&*fs, &path)?;
        roll_back_compaction(&*fs, &path)?;
        let created = !fs.exists(&path)?;
        let file = fs.open(&path, OpenMode::Create)?;
        if created {
            sync_parent_with(&*fs, &path)?;
        }
        let mut bytes = vec![0; file.len()? as usize];
        file.read_exact_at(&mut bytes, 0)?;
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
            fs,
            path,
            file,
            len: scan.good_bytes,
            checkpoint: scan.checkpoint,
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
        let fs = Arc::clone(&self.fs);
        let erasing = beside(&self.path, ".erasing");
        {
            let mut bytes = Vec::new();
            for push in &kept {
                bytes.extend_from_slice(&encode_frame(push)?);
            }
            let f = fs.open(&erasing, OpenMode::Create)?;
            f.set_len(0)?;
            f.write_all_at(&bytes, 0)?;
            f.sync_all()?;
        }
        fs.rename(&erasing, &beside(&self.path, ".erased"))?;
        sync_parent_with(&*fs, &self.path)?;
        finish_retain(&*fs, &self.path)?;
        *self = PushLog::open_with(fs, &self.path)?;
        Ok(dropped.len())
    }

    /// Make the file and its name durable: for a replay that finds its
    /// push already here, which an append whose fsync failed may have left
    /// readable and not yet durable.
    pub fn sync(&self) -> Result<(), PushLogError> {
        self.file.sync_all()?;
        sync_parent_with(&*self.fs, &self.path)?;
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
        let mut all = read_archive(&*self.fs, &archive_path_of(&self.path))?;
        all.extend(self.pushes.iter().cloned());
        Ok(all)
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

    /// The storage the log does its I/O through.
    pub fn storage(&self) -> &Arc<dyn Storage> {
        &self.fs
    }
}
