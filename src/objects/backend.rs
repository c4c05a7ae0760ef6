//! redb's pages through the crate's storage seam: a [`redb::StorageBackend`]
//! over a [`StorageFile`], so a simulated crash reaches the object index's
//! tail as it reaches the log, the push log and every other store file.

use std::any::Any;
use std::fmt;
use std::io;
use std::path::Path;
use std::sync::Arc;

use crate::storage::{OpenMode, Storage, StorageFile};

/// One redb database file, opened through a [`Storage`] and locked for as
/// long as the database holds it, as redb's own file backend locks it.
pub(crate) struct SeamBackend {
    file: Arc<dyn StorageFile>,
    _lock: Box<dyn Any + Send + Sync>,
}

impl fmt::Debug for SeamBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SeamBackend")
            .field("file", &self.file)
            .finish_non_exhaustive()
    }
}

impl SeamBackend {
    /// Open or create the database file at `path`. A new file's name is
    /// the caller's to make durable (`tail::open_file` renames it into
    /// place once redb has written it).
    pub(crate) fn open(fs: &dyn Storage, path: &Path) -> io::Result<SeamBackend> {
        let file = fs.open(path, OpenMode::Create)?;
        // The lock is taken on the database file itself, the file redb's
        // own backend would flock, so two opens refuse each other either way.
        let lock = fs.lock(path)?;
        Ok(SeamBackend { file, _lock: lock })
    }
}

impl redb::StorageBackend for SeamBackend {
    fn len(&self) -> io::Result<u64> {
        self.file.len()
    }

    fn read(&self, offset: u64, len: usize) -> io::Result<Vec<u8>> {
        let mut buf = vec![0; len];
        self.file.read_exact_at(&mut buf, offset)?;
        Ok(buf)
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        self.file.set_len(len)
    }

    /// `eventual` asks only for a barrier; on Linux redb's own backend
    /// answers it with an fdatasync too, and so does this one.
    fn sync_data(&self, _eventual: bool) -> io::Result<()> {
        self.file.sync_data()
    }

    fn write(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        self.file.write_all_at(data, offset)
    }
}
