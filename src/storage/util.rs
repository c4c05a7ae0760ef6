//! Small functions over [`Storage`] and [`StorageFile`], built on the trait's
//! own methods so that every storage (the real one, the simulated one)
//! gets them with the same crash semantics: nothing here syncs unless it
//! says so.

use std::io;
use std::path::Path;
use std::sync::Arc;

use super::{OpenMode, Storage, StorageFile};

/// A file's length; `None` when there is no such file.
pub fn file_len(fs: &dyn Storage, path: &Path) -> io::Result<Option<u64>> {
    match fs.open(path, OpenMode::Read) {
        Ok(f) => f.len().map(Some),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// Remove a file that may not be there; answers whether it was. Durable
/// once its directory is synced.
pub fn remove_if_exists(fs: &dyn Storage, path: &Path) -> io::Result<bool> {
    match fs.remove(path) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e),
    }
}

/// Create or replace the file at `path` with `bytes`, as
/// `std::fs::write`: not synced, so durable only once the caller syncs
/// the file and its directory.
pub fn write_file(fs: &dyn Storage, path: &Path, bytes: &[u8]) -> io::Result<()> {
    let f = fs.open(path, OpenMode::Create)?;
    f.set_len(0)?;
    f.write_all_at(bytes, 0)
}

/// Copy `from` to a new file `to` in 1 MiB pieces, fsynced; answers the
/// bytes copied. The new name is durable once its directory is synced.
pub fn copy_file(fs: &dyn Storage, from: &Path, to: &Path) -> io::Result<u64> {
    let src = fs.open(from, OpenMode::Read)?;
    let dst = fs.open(to, OpenMode::Create)?;
    dst.set_len(0)?;
    let mut buf = vec![0u8; 1 << 20];
    let mut at = 0u64;
    loop {
        match src.read_at(&mut buf, at)? {
            0 => break,
            n => {
                dst.write_all_at(&buf[..n], at)?;
                at += n as u64;
            }
        }
    }
    dst.sync_all()?;
    Ok(at)
}

/// A position in a [`StorageFile`], for code that reads or writes a file
/// as a stream (`std::io::Read`, `Write`; wrap it in a `BufReader` or a
/// `BufWriter`). Writing never syncs: call [`Cursor::file`]'s `sync_all`.
#[derive(Debug)]
pub struct Cursor {
    file: Arc<dyn StorageFile>,
    pos: u64,
}

impl Cursor {
    /// At the start of `file`.
    pub fn new(file: Arc<dyn StorageFile>) -> Cursor {
        Cursor::at(file, 0)
    }

    /// At `pos` in `file`.
    pub fn at(file: Arc<dyn StorageFile>, pos: u64) -> Cursor {
        Cursor { file, pos }
    }

    /// The file under the cursor.
    pub fn file(&self) -> &Arc<dyn StorageFile> {
        &self.file
    }
}

impl io::Read for Cursor {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.file.read_at(buf, self.pos)?;
        self.pos += n as u64;
        Ok(n)
    }
}

impl io::Write for Cursor {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.file.write_all_at(buf, self.pos)?;
        self.pos += buf.len() as u64;
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}
