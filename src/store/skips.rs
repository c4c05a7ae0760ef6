//! `SKIPPED`: the frames this store did not apply because an operator's
//! StoreSkip frame said so, one JSON line per frame, appended and fsynced
//! before the applied seq moves past it. The record stays with the store
//! (a snapshot carries it), so what was skipped, where and why is never
//! lost.
//!
//! A last line without its newline is what a crash in the middle of an
//! append leaves: it is cut at open, and the skip is made again when the
//! frame is replayed. Any other line that does not parse is damage and
//! refused by name.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::{Result, StoreError};
use crate::publish::sync_parent_with;
use crate::storage::{OpenMode, StdStorage, Storage};

/// The file's name in the store directory.
pub const SKIPPED_FILE: &str = "SKIPPED";

/// One skipped frame.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SkipRecord {
    /// The frame not applied.
    pub seq: u64,
    /// Its kind and payload crc, as the log holds it.
    pub kind: u16,
    pub crc: u32,
    /// The StoreSkip frame that decided it.
    pub by: u64,
    /// Why it did not apply here.
    pub error: String,
}

pub(crate) struct Skips {
    fs: Arc<dyn Storage>,
    path: PathBuf,
    records: BTreeMap<u64, SkipRecord>,
}

impl Skips {
    pub(crate) fn open(fs: Arc<dyn Storage>, dir: &Path) -> Result<Skips> {
        let path = dir.join(SKIPPED_FILE);
        let (records, whole, len) = parse(&*fs, &path)?;
        if whole < len {
            let f = fs.open(&path, OpenMode::Write)?;
            f.set_len(whole as u64)?;
            f.sync_all()?;
        }
        Ok(Skips { fs, path, records })
    }

    /// Record a skip durably.
    pub(crate) fn record(&mut self, rec: SkipRecord) -> Result<()> {
        let fs = &*self.fs;
        let created = !fs.exists(&self.path)?;
        let f = fs.open(&self.path, OpenMode::Create)?;
        let mut line = serde_json::to_vec(&rec).map_err(|e| StoreError::Corrupt {
            path: self.path.clone(),
            at: 0,
            what: format!("encoding a skip record: {e}"),
        })?;
        line.push(b'\n');
        f.write_all_at(&line, f.len()?)?;
        f.sync_all()?;
        if created {
            sync_parent_with(fs, &self.path)?;
        }
        self.records.insert(rec.seq, rec);
        Ok(())
    }

    pub(crate) fn get(&self, seq: u64) -> Option<&SkipRecord> {
        self.records.get(&seq)
    }

    pub(crate) fn all(&self) -> impl Iterator<Item = &SkipRecord> {
        self.records.values()
    }
}

/// The records in the file, the bytes of whole lines and the file's
/// length.
fn parse(fs: &dyn Storage, path: &Path) -> Result<(BTreeMap<u64, SkipRecord>, usize, usize)> {
    let mut records = BTreeMap::new();
    let bytes = match fs.read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => return Err(e.into()),
    };
    let mut whole = 0;
    for line in bytes.split_inclusive(|&b| b == b'\n') {
        if line.last() != Some(&b'\n') {
            break;
        }
        let rec: SkipRecord = serde_json::from_slice(line).map_err(|e| StoreError::Corrupt {
            path: path.to_owned(),
            at: whole as u64,
            what: format!("a skip record that does not parse: {e}"),
        })?;
        records.insert(rec.seq, rec);
        whole += line.len();
    }
    Ok((records, whole, bytes.len()))
}

/// The skips a store directory records, oldest first, read only.
pub fn read_skips(store_dir: &Path) -> Result<Vec<SkipRecord>> {
    read_skips_with(&StdStorage, store_dir)
}

/// [`read_skips`] through `fs`.
pub fn read_skips_with(fs: &dyn Storage, store_dir: &Path) -> Result<Vec<SkipRecord>> {
    Ok(parse(fs, &store_dir.join(SKIPPED_FILE))?
        .0
        .into_values()
        .collect())
}
