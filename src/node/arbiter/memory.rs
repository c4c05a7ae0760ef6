//! What a box remembers of the arbiter, kept in its data directory
//! (`ARBITER`, JSON): read before every judgement of etcd's keys, written
//! (temp file, fsync, rename, directory fsync) before the box acts on
//! what it learned. The rules are [`crate::repl::amnesia`]'s.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use crate::repl::amnesia::Memory;
use crate::storage::{StdStorage, Storage};

pub use crate::layout::ARBITER_FILE;

/// The memory of one data directory.
#[derive(Debug)]
pub struct MemoryFile {
    path: PathBuf,
    fs: Arc<dyn Storage>,
    now: Mutex<Memory>,
    /// When a change of the revision alone was last written.
    revision_written: Mutex<Option<std::time::Instant>>,
}

/// A newer revision alone is written at most this often: etcd's revision
/// moves with every write to it, anyone's, and a revision kept a little
/// behind only detects a rollback a little less finely.
pub const REVISION_EVERY: std::time::Duration = std::time::Duration::from_secs(10);

impl MemoryFile {
    /// The memory kept in `dir`; none yet is an empty one.
    pub fn load(dir: &Path) -> std::io::Result<MemoryFile> {
        Self::load_with(StdStorage::shared(), dir)
    }

    /// [`MemoryFile::load`] through `fs`.
    pub fn load_with(fs: Arc<dyn Storage>, dir: &Path) -> std::io::Result<MemoryFile> {
        let path = dir.join(ARBITER_FILE);
        let now = match fs.read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| {
                std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!("{}: not an arbiter memory: {e}", path.display()),
                )
            })?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Memory::default(),
            Err(e) => return Err(e),
        };
        Ok(MemoryFile {
            path,
            fs,
            now: Mutex::new(now),
            revision_written: Mutex::new(None),
        })
    }

    /// The memory as it is now.
    pub fn get(&self) -> Memory {
        self.lock().clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Memory> {
        self.now.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Keep `next`: on disk before it is seen here. Nothing is written
    /// when nothing changed.
    pub fn set(&self, next: Memory) -> std::io::Result<()> {
        let mut now = self.lock();
        if *now == next {
            return Ok(());
        }
        let bytes = serde_json::to_vec_pretty(&next).map_err(std::io::Error::other)?;
        crate::publish::publish_with(&*self.fs, &self.path, &bytes)?;
        *now = next;
        Ok(())
    }

    /// Keep what a trusted read taught: at once when the generation, the
    /// epoch or the peer changed, a newer revision alone at most every
    /// [`REVISION_EVERY`].
    pub fn observe(&self, next: Memory) -> std::io::Result<()> {
        let now = self.get();
        let only_revision = Memory {
            revision: now.revision,
            ..next.clone()
        } == now;
        if only_revision {
            let mut last = self
                .revision_written
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            let t = crate::node::clock::instant().into_std();
            if last.is_some_and(|l| t.saturating_duration_since(l) < REVISION_EVERY) {
                return Ok(());
            }
            *last = Some(t);
        }
        self.set(next)
    }

    /// Change the memory with `f`, kept as [`MemoryFile::set`] keeps it.
    pub fn update(&self, f: impl FnOnce(&mut Memory)) -> std::io::Result<()> {
        let mut next = self.get();
        f(&mut next);
        self.set(next)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::repl::amnesia::Peer;

    #[test]
    fn the_memory_survives_a_reload_and_a_garbled_file_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let m = MemoryFile::load(dir.path()).expect("empty");
        assert_eq!(m.get(), Memory::default());
        m.update(|m| {
            m.generation = Some("g1".into());
            m.epoch = 7;
            m.revision = 40;
            m.peer = Some(Peer {
                addr: "127.0.0.1:7400".into(),
                fingerprint: "ab".into(),
            });
        })
        .expect("kept");
        let again = MemoryFile::load(dir.path()).expect("reload");
        assert_eq!(again.get(), m.get());
        std::fs::write(dir.path().join(ARBITER_FILE), b"{not json").expect("write");
        let err = MemoryFile::load(dir.path()).expect_err("garbled");
        assert!(err.to_string().contains("ARBITER"), "{err}");
    }
}
