//! Publishing a small file by rename: the one way twinlog replaces a
//! configuration, a marker or a manifest, so that a crash leaves the old
//! file or the new one, whole, and a file once published stays published.

use std::io::Write;
use std::path::{Path, PathBuf};

/// Write `bytes` to `path`: to a temporary file beside it first, fsynced,
/// then renamed over `path`, then the directory fsynced so the rename
/// itself survives a crash.
pub fn publish(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = temp_beside(path);
    let written = (|| {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()
    })();
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    std::fs::rename(&tmp, path)?;
    sync_parent(path)
}

/// Replace `path` with `bytes` by rename, without an fsync: for a hint
/// that is checked before it is used, where a crash may leave the old
/// file or the new one (or neither, after a power cut) and either is
/// safe. Costs a write and a rename instead of two device flushes.
pub fn publish_hint(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = temp_beside(path);
    if let Err(e) = std::fs::write(&tmp, bytes) {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    std::fs::rename(&tmp, path)
}

/// fsync the directory holding `path`.
pub fn sync_parent(path: &Path) -> std::io::Result<()> {
    match path.parent().filter(|d| !d.as_os_str().is_empty()) {
        Some(dir) => std::fs::File::open(dir)?.sync_all(),
        None => std::fs::File::open(".")?.sync_all(),
    }
}

fn temp_beside(path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(".tmp");
    path.with_file_name(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_published_file_replaces_the_old_one_whole() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("primary.toml");
        publish(&path, b"one").expect("publish");
        publish(&path, b"two").expect("publish again");
        assert_eq!(std::fs::read(&path).expect("read"), b"two");
        let left: Vec<_> = std::fs::read_dir(dir.path()).expect("list").collect();
        assert_eq!(left.len(), 1, "no temporary file is left");
        publish_hint(&path, b"three").expect("a hint");
        assert_eq!(std::fs::read(&path).expect("read"), b"three");
        let left: Vec<_> = std::fs::read_dir(dir.path()).expect("list").collect();
        assert_eq!(left.len(), 1, "no temporary file is left");
    }
}
