//! The epoch a box follows or serves: raised by every promotion, kept in
//! the data directory, so that a primary a promotion superseded is refused
//! by every twin that knows of the promotion.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// The file the epoch lives in, beside the log.
pub const EPOCH_FILE: &str = "EPOCH";

/// A box's epoch, durable when `path` is set.
#[derive(Debug, Default)]
pub struct Epoch {
    path: Option<PathBuf>,
    value: AtomicU64,
}

impl Epoch {
    /// An epoch that lives only in memory (tests).
    pub fn in_memory(value: u64) -> Epoch {
        Epoch {
            path: None,
            value: AtomicU64::new(value),
        }
    }

    /// The epoch kept in `dir`; 0 when there is none yet.
    pub fn load(dir: &Path) -> std::io::Result<Epoch> {
        let path = dir.join(EPOCH_FILE);
        let value = match std::fs::read_to_string(&path) {
            Ok(text) => text.trim().parse().map_err(|_| {
                std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!("{}: not an epoch: {text:?}", path.display()),
                )
            })?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => 0,
            Err(e) => return Err(e),
        };
        Ok(Epoch {
            path: Some(path),
            value: AtomicU64::new(value),
        })
    }

    pub fn get(&self) -> u64 {
        self.value.load(Ordering::SeqCst)
    }

    /// Raise the epoch to `to` (never lower it), durably: temp file, fsync,
    /// rename, directory fsync.
    pub fn raise(&self, to: u64) -> std::io::Result<()> {
        if to <= self.get() {
            return Ok(());
        }
        if let Some(path) = &self.path {
            let tmp = path.with_extension("tmp");
            {
                let mut f = std::fs::File::create(&tmp)?;
                std::io::Write::write_all(&mut f, format!("{to}\n").as_bytes())?;
                f.sync_all()?;
            }
            std::fs::rename(&tmp, path)?;
            if let Some(dir) = path.parent() {
                std::fs::File::open(dir)?.sync_all()?;
            }
        }
        self.value.store(to, Ordering::SeqCst);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_epoch_is_kept_and_never_lowered() {
        let dir = tempfile::tempdir().expect("tempdir");
        let e = Epoch::load(dir.path()).expect("load");
        assert_eq!(e.get(), 0);
        e.raise(3).expect("raise");
        e.raise(2).expect("no-op");
        assert_eq!(Epoch::load(dir.path()).expect("reload").get(), 3);
        std::fs::write(dir.path().join(EPOCH_FILE), "x").expect("damage");
        assert!(Epoch::load(dir.path()).is_err());
    }
}
