//! Installing a snapshot on a box: the staged files checked against their
//! manifest, then swapped in for the store and the log restarted after the
//! snapshot's seq, all or nothing across a crash at any step.
//!
//! In a data directory: `snapshot.staging/` holds `base.json` (the
//! snapshot's seq, the crc of the frame at it, the log history) and
//! `files/` (the snapshot as its source wrote it, manifest included), filled
//! piece by piece by the transfer, which resumes from what is there. The
//! install then writes the intent `SNAPSHOT_INSTALL` (a copy of
//! `base.json`), moves `store/` to `store.old/` and `files/` to `store/`,
//! restarts the log after the seq, records `SNAPSHOT_BASE` (what the box
//! says its head frame is, since the log holds no frame at that seq), and
//! removes `store.old/`, the staging directory and the intent. A crash
//! before the intent leaves the old state; after it, `finish` completes the
//! install at the next start.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::snapshot::{self, sync_tree_with};
use super::{Result, StoreError};
use crate::log::{HistoryId, Log};
use crate::publish::{publish_with, sync_parent_with};
use crate::storage::{StdStorage, Storage};

pub use crate::layout::{BASE_FILE, INTENT_FILE, STAGING_DIR};

/// Where a snapshot sits in its log: the seq it was taken at, the payload
/// crc of the frame at that seq, and the log's history.
#[derive(Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotBase {
    pub at: u64,
    pub crc_at: u32,
    pub history: [u8; 16],
}

/// The history in hex, as logs print it everywhere.
impl std::fmt::Debug for SnapshotBase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "SnapshotBase {{ at: {}, crc_at: {:08x}, history: {} }}",
            self.at,
            self.crc_at,
            crate::log::HistoryId(self.history)
        )
    }
}

/// The steps of an install, in order; a crash test stops after each.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum InstallStep {
    /// Every staged file checked against the manifest and fsynced.
    Verified,
    /// The intent is durable: from here on the install completes.
    Intent,
    /// The old store moved aside.
    OldMoved,
    /// The snapshot's files are the store.
    Swapped,
    /// The log restarted after the snapshot's seq.
    Restarted,
    /// The base position recorded.
    Based,
    /// The old store, the staging directory and the intent are gone.
    Done,
}

/// The paths of an install in a data directory.
#[derive(Clone, Debug)]
pub struct InstallPaths {
    pub data: PathBuf,
}

impl InstallPaths {
    pub fn new(data: &Path) -> InstallPaths {
        InstallPaths {
            data: data.to_owned(),
        }
    }
    pub fn staging(&self) -> PathBuf {
        self.data.join(STAGING_DIR)
    }
    /// The staged snapshot: its manifest and files.
    pub fn files(&self) -> PathBuf {
        self.staging().join("files")
    }
    pub fn staged_base(&self) -> PathBuf {
        self.staging().join("base.json")
    }
    pub fn store(&self) -> PathBuf {
        self.data.join(crate::layout::STORE_DIR)
    }
    pub fn old_store(&self) -> PathBuf {
        self.data.join(format!("{}.old", crate::layout::STORE_DIR))
    }
    pub fn intent(&self) -> PathBuf {
        self.data.join(INTENT_FILE)
    }
    pub fn base(&self) -> PathBuf {
        self.data.join(BASE_FILE)
    }
}

fn write_json(fs: &dyn Storage, path: &Path, v: &impl Serialize) -> Result<()> {
    let bytes = serde_json::to_vec(v).map_err(|e| StoreError::BadSnapshot {
        dir: path.to_owned(),
        what: e.to_string(),
    })?;
    publish_with(fs, path, &bytes)?;
    Ok(())
}

/// A snapshot staged (a twin's half-fetched one) before the Erase frame at
/// `erase_seq` may hold erased data: it goes, and a fetch that needs one
/// takes a new one. A staged base that does not read says nothing of its
/// age: it goes too. Answers whether one went.
pub fn drop_staged_before(paths: &InstallPaths, erase_seq: u64) -> std::io::Result<bool> {
    drop_staged_before_with(&StdStorage, paths, erase_seq)
}

/// [`drop_staged_before`] through `fs`.
pub fn drop_staged_before_with(
    fs: &dyn Storage,
    paths: &InstallPaths,
    erase_seq: u64,
) -> std::io::Result<bool> {
    let keep = match read_base_with(fs, &paths.staged_base()) {
        Ok(Some(b)) => b.at >= erase_seq,
        Ok(None) => !fs.exists(&paths.staging())?,
        Err(_) => false,
    };
    if keep || !fs.exists(&paths.staging())? {
        return Ok(false);
    }
    fs.remove_dir_all(&paths.staging())?;
    sync_parent_with(fs, &paths.staging())?;
    tracing::info!(erase_seq, "dropped a staged snapshot taken before an erase");
    Ok(true)
}

/// Read a base file; `None` when there is none.
pub fn read_base(path: &Path) -> Result<Option<SnapshotBase>> {
    read_base_with(&StdStorage, path)
}

/// [`read_base`] through `fs`.
pub fn read_base_with(fs: &dyn Storage, path: &Path) -> Result<Option<SnapshotBase>> {
    match fs.read(path) {
        Ok(b) => serde_json::from_slice(&b)
            .map(Some)
            .map_err(|e| StoreError::BadSnapshot {
                dir: path.to_owned(),
                what: format!("base does not parse: {e}"),
            }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// The payload crc of the frame at `seq`: from the log, or, for the frame
/// a snapshot install restarted the log after (the log holds no frame
/// there), from that install's `base`. 0 for seq 0. When neither knows the
/// frame, the log's own error says why (below its floor, or a frame that
/// does not read): never a made-up crc, which a peer would take for a
/// divergence.
pub fn crc_of_frame(log: &Log, base: Option<&SnapshotBase>, seq: u64) -> Result<u32> {
    if seq == 0 {
        return Ok(0);
    }
    match log.locate_blob(seq) {
        Ok(l) => Ok(l.payload_crc),
        Err(e) => match base.filter(|b| b.at == seq) {
            Some(b) => Ok(b.crc_at),
            None => Err(e.into()),
        },
    }
}

/// The payload crc of `log`'s head frame, from the log or from the base
/// at `base_path` (see [`crc_of_frame`]); a base file that does not read is
/// its error.
pub fn head_crc(log: &Log, base_path: &Path) -> Result<u32> {
    let base = read_base_with(&**log.storage(), base_path)?;
    crc_of_frame(log, base.as_ref(), log.head_seq())
}

/// Record what a staged snapshot is, before its files arrive.
pub fn stage_base(paths: &InstallPaths, base: &SnapshotBase) -> Result<()> {
    stage_base_with(&StdStorage, paths, base)
}

/// [`stage_base`] through `fs`.
pub fn stage_base_with(fs: &dyn Storage, paths: &InstallPaths, base: &SnapshotBase) -> Result<()> {
    fs.create_dir_all(&paths.files())?;
    write_json(fs, &paths.staged_base(), base)
}

/// Install the staged snapshot, stopping after `stop_after` (as a crash
/// would) when given. The store must be closed (its files are moved).
/// Through the log's storage: the store is kept beside the log.
pub fn install(paths: &InstallPaths, log: &Log, stop_after: Option<InstallStep>) -> Result<u64> {
    install_with(&**log.storage(), paths, log, stop_after)
}

/// [`install`] through `fs`.
pub fn install_with(
    fs: &dyn Storage,
    paths: &InstallPaths,
    log: &Log,
    stop_after: Option<InstallStep>,
) -> Result<u64> {
    let base =
        read_base_with(fs, &paths.staged_base())?.ok_or_else(|| StoreError::BadSnapshot {
            dir: paths.staging(),
            what: "no staged snapshot".into(),
        })?;
    let manifest = snapshot::verify_with(fs, &paths.files())?;
    if manifest.at != base.at || manifest.history != HistoryId(base.history).to_string() {
        return Err(StoreError::BadSnapshot {
            dir: paths.files(),
            what: format!(
                "the manifest is of {} at {}, the transfer announced {} at {}",
                manifest.history,
                manifest.at,
                HistoryId(base.history),
                base.at
            ),
        });
    }
    sync_tree_with(fs, &paths.files())?;
    if stop_after == Some(InstallStep::Verified) {
        return Ok(base.at);
    }
    write_json(fs, &paths.intent(), &base)?;
    if stop_after == Some(InstallStep::Intent) {
        return Ok(base.at);
    }
    roll_forward(fs, paths, log, &base, stop_after)?;
    Ok(base.at)
}

/// The steps after the intent; each one finds out whether it is done, so a
/// repeat after a crash finishes the install.
fn roll_forward(
    fs: &dyn Storage,
    paths: &InstallPaths,
    log: &Log,
    base: &SnapshotBase,
    stop_after: Option<InstallStep>,
) -> Result<()> {
    let staged = paths.files();
    if fs.exists(&staged)? && fs.exists(&paths.store())? {
        fs.remove_dir_all(&paths.old_store())?;
        fs.rename(&paths.store(), &paths.old_store())?;
        fs.sync_dir(&paths.data)?;
    }
    if stop_after == Some(InstallStep::OldMoved) {
        return Ok(());
    }
    if fs.exists(&staged)? {
        fs.rename(&staged, &paths.store())?;
        fs.sync_dir(&paths.data)?;
        fs.sync_dir(&paths.staging())?;
    }
    if stop_after == Some(InstallStep::Swapped) {
        return Ok(());
    }
    let history = HistoryId(base.history);
    let restarted =
        log.history() == history && log.head_seq() == base.at && log.first_seq() == base.at + 1;
    if !restarted {
        if log.history() != history {
            // Only a log that holds nothing takes another history.
            if log.first_seq() <= log.head_seq() {
                return Err(StoreError::OtherHistory {
                    store: history.to_string(),
                    log: log.history().to_string(),
                });
            }
            log.restart_after(0)?;
            log.adopt_history(history)?;
        }
        log.restart_after(base.at)?;
    }
    if stop_after == Some(InstallStep::Restarted) {
        return Ok(());
    }
    write_json(fs, &paths.base(), base)?;
    if stop_after == Some(InstallStep::Based) {
        return Ok(());
    }
    fs.remove_dir_all(&paths.old_store())?;
    fs.remove_dir_all(&paths.staging())?;
    fs.remove(&paths.intent())?;
    fs.sync_dir(&paths.data)?;
    tracing::info!(at = base.at, "snapshot installed");
    Ok(())
}

/// At start, before the store opens: finish an install a crash
/// interrupted after its intent. Answers the seq installed, if any.
/// Through the log's storage, as [`install`].
pub fn finish(paths: &InstallPaths, log: &Log) -> Result<Option<u64>> {
    finish_with(&**log.storage(), paths, log)
}

/// [`finish`] through `fs`.
pub fn finish_with(fs: &dyn Storage, paths: &InstallPaths, log: &Log) -> Result<Option<u64>> {
    let Some(base) = read_base_with(fs, &paths.intent())? else {
        return Ok(None);
    };
    tracing::warn!(
        at = base.at,
        "finishing a snapshot install a crash interrupted"
    );
    roll_forward(fs, paths, log, &base, None)?;
    Ok(Some(base.at))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::write_file;

    #[test]
    fn the_head_crc_comes_from_the_log_or_the_base_and_is_never_made_up() {
        let dir = tempfile::tempdir().expect("tempdir");
        let log = Log::open(dir.path().join("log")).expect("open");
        let base_path = dir.path().join(BASE_FILE);
        assert_eq!(head_crc(&log, &base_path).expect("empty"), 0);
        log.append_raw(1000, b"m", b"blob").expect("append");
        let crc = log.locate_blob(1).expect("locate").payload_crc;
        assert_eq!(head_crc(&log, &base_path).expect("from the log"), crc);

        // A restart after a snapshot at 10: the log holds no frame there.
        log.restart_after(10).expect("restart");
        assert!(
            head_crc(&log, &base_path).is_err(),
            "no frame and no base: an error, not a crc"
        );
        let base = SnapshotBase {
            at: 10,
            crc_at: 0xdead_beef,
            history: log.history().0,
        };
        write_json(&StdStorage, &base_path, &base).expect("base");
        assert_eq!(
            head_crc(&log, &base_path).expect("from the base"),
            0xdead_beef
        );

        // A base that does not decode is its error, not "no base".
        write_file(&StdStorage, &base_path, b"{not json").expect("corrupt");
        assert!(head_crc(&log, &base_path).is_err());
    }
}
