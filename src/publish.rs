//! Publishing a small file by rename: the one way twinlog replaces a
//! configuration, a marker or a manifest, so that a crash leaves the old
//! file or the new one, whole, and a file once published stays published.
//!
//! Each function has a `*_with` form that does its I/O through a
//! [`Storage`], which is how the store publishes (and how crash tests reach
//! it); the plain form uses the real file system.

use std::path::{Path, PathBuf};

use crate::storage::{OpenMode, StdStorage, Storage};

/// Write `bytes` to `path`: to a temporary file beside it first, fsynced,
/// then renamed over `path`, then the directory fsynced so the rename
/// itself survives a crash.
pub fn publish(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    publish_with(&StdStorage, path, bytes)
}

/// [`publish`] through `fs`.
pub fn publish_with(fs: &dyn Storage, path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = temp_beside(path);
    if let Err(e) = write_temp(fs, &tmp, bytes, !sabotage::fsync_skipped()) {
        let _ = fs.remove(&tmp);
        return Err(e);
    }
    fs.rename(&tmp, path)?;
    sync_parent_with(fs, path)
}

/// Replace `path` with `bytes` by rename, without an fsync: for a hint
/// that is checked before it is used, where a crash may leave the old
/// file or the new one (or neither, after a power cut) and either is
/// safe. Costs a write and a rename instead of two device flushes.
pub fn publish_hint(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    publish_hint_with(&StdStorage, path, bytes)
}

/// [`publish_hint`] through `fs`.
pub fn publish_hint_with(fs: &dyn Storage, path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = temp_beside(path);
    if let Err(e) = write_temp(fs, &tmp, bytes, false) {
        let _ = fs.remove(&tmp);
        return Err(e);
    }
    fs.rename(&tmp, path)
}

/// A fresh temporary file holding exactly `bytes` (one a crash left
/// behind is replaced), fsynced when `sync`.
fn write_temp(fs: &dyn Storage, tmp: &Path, bytes: &[u8], sync: bool) -> std::io::Result<()> {
    let f = fs.open(tmp, OpenMode::Create)?;
    f.set_len(0)?;
    f.write_all_at(bytes, 0)?;
    if sync {
        f.sync_all()?;
    }
    Ok(())
}

/// fsync the directory holding `path`.
pub fn sync_parent(path: &Path) -> std::io::Result<()> {
    sync_parent_with(&StdStorage, path)
}

/// [`sync_parent`] through `fs`.
pub fn sync_parent_with(fs: &dyn Storage, path: &Path) -> std::io::Result<()> {
    match path.parent().filter(|d| !d.as_os_str().is_empty()) {
        Some(dir) => fs.sync_dir(dir),
        None => fs.sync_dir(Path::new(".")),
    }
}

/// Rename `from` to `to` (a file or a directory), durably: the
/// directories of both names synced, `to`'s first. Where a crash leaves
/// the old name or the new one, whole.
pub fn move_aside(from: &Path, to: &Path) -> std::io::Result<()> {
    move_aside_with(&StdStorage, from, to)
}

/// [`move_aside`] through `fs`.
pub fn move_aside_with(fs: &dyn Storage, from: &Path, to: &Path) -> std::io::Result<()> {
    fs.rename(from, to)?;
    sync_parent_with(fs, to)?;
    if from.parent() != to.parent() {
        sync_parent_with(fs, from)?;
    }
    Ok(())
}

fn temp_beside(path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(".tmp");
    path.with_file_name(name)
}

/// The negative controls of the store's crash test: a publish that skips
/// the temporary file's fsync, so a crash after the rename can leave the
/// new name on an empty file, and a saved divergent tail renamed into
/// place without its fsync (`node::divergent::save`). Per thread, so one
/// test turning one on does not reach the tests running beside it; absent
/// from a build without the `testing` feature.
pub mod sabotage {
    #[cfg(feature = "testing")]
    thread_local! {
        static SKIP_FSYNC: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
        static SKIP_TAIL_FSYNC: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    }

    /// Whether this thread's publishes skip the temporary file's fsync.
    #[cfg(feature = "testing")]
    pub fn skip_publish_fsync(on: bool) {
        SKIP_FSYNC.with(|s| s.set(on));
    }

    /// Whether this thread's saved tails skip the frames file's fsync.
    #[cfg(feature = "testing")]
    pub fn skip_tail_fsync(on: bool) {
        SKIP_TAIL_FSYNC.with(|s| s.set(on));
    }

    #[cfg(feature = "testing")]
    pub(crate) fn fsync_skipped() -> bool {
        SKIP_FSYNC.with(|s| s.get())
    }

    #[cfg(feature = "testing")]
    pub(crate) fn tail_fsync_skipped() -> bool {
        SKIP_TAIL_FSYNC.with(|s| s.get())
    }

    #[cfg(not(feature = "testing"))]
    pub(crate) fn fsync_skipped() -> bool {
        false
    }

    #[cfg(not(feature = "testing"))]
    pub(crate) fn tail_fsync_skipped() -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::write_file;

    #[test]
    fn a_published_file_replaces_the_old_one_whole() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("primary.toml");
        publish(&path, b"one").expect("publish");
        publish(&path, b"two").expect("publish again");
        assert_eq!(StdStorage.read(&path).expect("read"), b"two");
        let left = StdStorage.list(dir.path()).expect("list");
        assert_eq!(left.len(), 1, "no temporary file is left");
        publish_hint(&path, b"three").expect("a hint");
        assert_eq!(StdStorage.read(&path).expect("read"), b"three");
        let left = StdStorage.list(dir.path()).expect("list");
        assert_eq!(left.len(), 1, "no temporary file is left");
    }

    #[test]
    fn a_temporary_file_a_crash_left_is_replaced_not_appended_to() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("marker");
        write_file(
            &StdStorage,
            &dir.path().join("marker.tmp"),
            b"a longer leftover",
        )
        .expect("leftover");
        publish(&path, b"new").expect("publish");
        assert_eq!(StdStorage.read(&path).expect("read"), b"new");
    }
}
