//! The I/O seam at the bottom of the crate: every byte the log, the store
//! and the push log read or write, every fsync, rename and directory
//! listing goes through [`Storage`].
//!
//! [`StdStorage`] is the real file system. `SimStorage` (with the `testing` feature) keeps a
//! live and a durable image of every file and name so that tests can crash at
//! any sync and reopen what a power cut would have left, or inject write and
//! fsync failures.

use std::any::Any;
use std::fmt::Debug;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;
use std::sync::Arc;
use std::time::SystemTime;

mod util;
pub use util::{copy_file, file_len, remove_if_exists, write_file, Cursor};

#[cfg(any(test, feature = "testing"))]
mod sim;
#[cfg(any(test, feature = "testing"))]
pub use sim::{CrashMode, SimStorage};

/// How a file is opened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpenMode {
    /// Read only; the file must exist.
    Read,
    /// Read and write; the file must exist.
    Write,
    /// Read and write; the file must not exist yet.
    CreateNew,
    /// Read and write; created empty when it does not exist, kept as it is
    /// when it does. The new name is durable only once its directory is
    /// synced.
    Create,
    /// Read and write; a new file with no name in the directory `path`
    /// (O_TMPFILE, or a name unlinked at once where the file system has
    /// none): never durable, gone when its last handle closes.
    Unnamed,
}

/// A file of the log. Every method takes `&self`: positioned I/O needs no
/// cursor, so one handle is shared by the writer and a group-commit leader.
// `len` is a file's length, not a collection's: there is no `is_empty`.
#[allow(clippy::len_without_is_empty)]
pub trait StorageFile: Send + Sync + Debug {
    /// Read at `offset`; fewer bytes than asked only at the end of the file.
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize>;
    /// Write all of `buf` at `offset`.
    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()>;
    /// fdatasync(2).
    fn sync_data(&self) -> io::Result<()>;
    /// fsync(2).
    fn sync_all(&self) -> io::Result<()>;
    /// The file's length.
    fn len(&self) -> io::Result<u64>;
    /// Truncate or extend.
    fn set_len(&self, len: u64) -> io::Result<()>;
    /// Reserve blocks for `offset..offset + len`, extending the file
    /// (fallocate mode 0): later writes there need no allocation.
    fn allocate(&self, offset: u64, len: u64) -> io::Result<()>;
    /// Turn `offset..offset + len` into zeros without changing the length:
    /// FALLOC_FL_PUNCH_HOLE, or written zeros where the file system cannot.
    fn punch(&self, offset: u64, len: u64) -> io::Result<()>;

    /// Start writing `offset..offset + len` back to the device without
    /// waiting (sync_file_range WRITE), so a later fdatasync has less left
    /// to do. A hint: it makes nothing durable.
    fn start_writeback(&self, _offset: u64, _len: u64) -> io::Result<()> {
        Ok(())
    }

    /// Let the kernel drop the cached pages of `offset..offset + len`
    /// (posix_fadvise DONTNEED; `len` 0 is to the end): a writer of bytes
    /// nobody will read soon gives back the memory it filled, so the next
    /// bytes reuse warm pages instead of taking cold ones and evicting
    /// others'. A hint: dirty pages stay, and nothing changes on disk.
    fn drop_cached(&self, _offset: u64, _len: u64) -> io::Result<()> {
        Ok(())
    }

    /// Read exactly `buf.len()` bytes at `offset`.
    fn read_exact_at(&self, mut buf: &mut [u8], mut offset: u64) -> io::Result<()> {
        while !buf.is_empty() {
            match self.read_at(buf, offset)? {
                0 => {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        format!("file ends before offset {}", offset + buf.len() as u64),
                    ))
                }
                n => {
                    buf = &mut buf[n..];
                    offset += n as u64;
                }
            }
        }
        Ok(())
    }
}

/// A directory of files: the log's whole view of the file system.
pub trait Storage: Send + Sync + Debug {
    /// Open a file.
    fn open(&self, path: &Path, mode: OpenMode) -> io::Result<Arc<dyn StorageFile>>;
    /// Remove a file.
    fn remove(&self, path: &Path) -> io::Result<()>;
    /// Rename a file, replacing `to`.
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()>;
    /// fsync a directory, making the names in it durable.
    fn sync_dir(&self, dir: &Path) -> io::Result<()>;
    /// The names of the files in a directory, unordered.
    fn list(&self, dir: &Path) -> io::Result<Vec<String>>;
    /// Create a directory and its parents; fsyncs the parent it created in.
    fn create_dir_all(&self, dir: &Path) -> io::Result<()>;
    /// Take an exclusive lock on `path` (created when missing), held until
    /// the returned value is dropped. `WouldBlock` when another holder has it.
    fn lock(&self, path: &Path) -> io::Result<Box<dyn Any + Send + Sync>>;
    /// Whether a file or directory exists.
    fn exists(&self, path: &Path) -> io::Result<bool>;
    /// Whether `path` is a directory. What the store and the push log need
    /// and the log does not: a storage made for the log alone (a test's
    /// wrapper) need not answer, and says so.
    fn is_dir(&self, path: &Path) -> io::Result<bool> {
        Err(unsupported("is_dir", path))
    }
    /// Remove a directory and everything under it. A directory that is not
    /// there is no error. Durable once the parent directory is synced.
    /// Unsupported by default, as [`Storage::is_dir`].
    fn remove_dir_all(&self, dir: &Path) -> io::Result<()> {
        Err(unsupported("remove_dir_all", dir))
    }

    /// When a file was last written. What retention and an erase by time
    /// ask of a segment; unsupported by default, as [`Storage::is_dir`].
    fn modified(&self, path: &Path) -> io::Result<SystemTime> {
        Err(unsupported("modified", path))
    }

    /// A whole file's bytes: for the small files read at open (markers,
    /// journals, manifests), never for a segment or a blob. Read to its
    /// end, past the length it reports: a /proc file reports none.
    fn read(&self, path: &Path) -> io::Result<Vec<u8>> {
        let f = self.open(path, OpenMode::Read)?;
        let len = usize::try_from(f.len()?)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "file too long to read"))?;
        let mut bytes = vec![0; len.max(4096)];
        let mut filled = 0;
        loop {
            if filled == bytes.len() {
                bytes.resize(filled * 2, 0);
            }
            match f.read_at(&mut bytes[filled..], filled as u64)? {
                0 => break,
                n => filled += n,
            }
        }
        bytes.truncate(filled);
        Ok(bytes)
    }
}

fn unsupported(what: &str, path: &Path) -> io::Error {
    io::Error::new(
        io::ErrorKind::Unsupported,
        format!("{}: this storage has no {what}", path.display()),
    )
}

/// The real file system.
#[derive(Debug, Default, Clone, Copy)]
pub struct StdStorage;

impl StdStorage {
    /// The shared instance.
    pub fn shared() -> Arc<dyn Storage> {
        Arc::new(StdStorage)
    }
}

#[derive(Debug)]
struct StdFile(File);

fn cvt(ret: libc::c_int) -> io::Result<()> {
    if ret == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

impl StorageFile for StdFile {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        loop {
            match self.0.read_at(buf, offset) {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                other => return other,
            }
        }
    }

    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.0.write_all_at(buf, offset)
    }

    fn sync_data(&self) -> io::Result<()> {
        self.0.sync_data()
    }

    fn sync_all(&self) -> io::Result<()> {
        self.0.sync_all()
    }

    fn len(&self) -> io::Result<u64> {
        Ok(self.0.metadata()?.len())
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        self.0.set_len(len)
    }

    fn allocate(&self, offset: u64, len: u64) -> io::Result<()> {
        if len == 0 {
            return Ok(());
        }
        let (off, len) = off_len(offset, len)?;
        // SAFETY: fallocate reads only its integer arguments; the descriptor
        // is owned by `self.0` and open for the duration of the call.
        let ret = unsafe { libc::fallocate(self.0.as_raw_fd(), 0, off, len) };
        match cvt(ret) {
            Err(e) if e.raw_os_error() == Some(libc::EOPNOTSUPP) => {
                // A file system without fallocate: extend the length, which
                // is what callers rely on; blocks are allocated at write time.
                let end = offset.saturating_add(len as u64);
                if self.len()? < end {
                    self.0.set_len(end)?;
                }
                Ok(())
            }
            other => other,
        }
    }

    fn start_writeback(&self, offset: u64, len: u64) -> io::Result<()> {
        let (off, l) = off_len(offset, len)?;
        // SAFETY: integers only, on a descriptor we own.
        cvt(unsafe {
            libc::sync_file_range(self.0.as_raw_fd(), off, l, libc::SYNC_FILE_RANGE_WRITE)
        })
    }

    fn drop_cached(&self, offset: u64, len: u64) -> io::Result<()> {
        let (off, l) = off_len(offset, len)?;
        // SAFETY: integers only, on a descriptor we own.
        let ret =
            unsafe { libc::posix_fadvise(self.0.as_raw_fd(), off, l, libc::POSIX_FADV_DONTNEED) };
        // posix_fadvise answers the error number itself, not -1 and errno.
        if ret == 0 {
            Ok(())
        } else {
            Err(io::Error::from_raw_os_error(ret))
        }
    }

    fn punch(&self, offset: u64, len: u64) -> io::Result<()> {
        if len == 0 {
            return Ok(());
        }
        let (off, l) = off_len(offset, len)?;
        // SAFETY: as in `allocate`: integers only, on a descriptor we own.
        let ret = unsafe {
            libc::fallocate(
                self.0.as_raw_fd(),
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                off,
                l,
            )
        };
        match cvt(ret) {
            Err(e) if e.raw_os_error() == Some(libc::EOPNOTSUPP) => write_zeros(self, offset, len),
            other => other,
        }
    }
}

fn off_len(offset: u64, len: u64) -> io::Result<(libc::off_t, libc::off_t)> {
    let off = libc::off_t::try_from(offset)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "offset out of range"))?;
    let l = libc::off_t::try_from(len)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "length out of range"))?;
    Ok((off, l))
}

/// Zeros written in 64 KiB pieces: the fallback where a hole cannot be punched.
pub(crate) fn write_zeros(file: &dyn StorageFile, offset: u64, len: u64) -> io::Result<()> {
    const CHUNK: u64 = 64 * 1024;
    let zeros = vec![0u8; CHUNK.min(len) as usize];
    let mut at = offset;
    let end = offset + len;
    while at < end {
        let n = (end - at).min(CHUNK) as usize;
        file.write_all_at(&zeros[..n], at)?;
        at += n as u64;
    }
    Ok(())
}

/// An unnamed file in `dir`, or one whose name is gone at once.
fn unnamed(dir: &Path) -> io::Result<Arc<dyn StorageFile>> {
    use std::sync::atomic::{AtomicU64, Ordering};
    let mut opts = OpenOptions::new();
    opts.read(true).write(true).mode(0o600);
    match opts
        .clone()
        .custom_flags(libc::O_TMPFILE | libc::O_CLOEXEC)
        .open(dir)
    {
        Ok(f) => Ok(Arc::new(StdFile(f))),
        // Older kernels and some file systems have no O_TMPFILE.
        Err(e) if matches!(e.raw_os_error(), Some(libc::EOPNOTSUPP | libc::EISDIR)) => {
            static NEXT: AtomicU64 = AtomicU64::new(0);
            let n = NEXT.fetch_add(1, Ordering::Relaxed);
            let path = dir.join(format!("staging-{}-{n}.tmp", std::process::id()));
            let f = opts
                .create_new(true)
                .custom_flags(libc::O_CLOEXEC)
                .open(&path)?;
            std::fs::remove_file(&path)?;
            Ok(Arc::new(StdFile(f)))
        }
        Err(e) => Err(e),
    }
}

#[derive(Debug)]
struct StdLock(#[allow(dead_code)] File);

impl Storage for StdStorage {
    fn open(&self, path: &Path, mode: OpenMode) -> io::Result<Arc<dyn StorageFile>> {
        let mut opts = OpenOptions::new();
        opts.read(true);
        match mode {
            OpenMode::Unnamed => return unnamed(path),
            OpenMode::Read => {}
            OpenMode::Write => {
                opts.write(true);
            }
            OpenMode::CreateNew => {
                opts.write(true).create_new(true);
            }
            OpenMode::Create => {
                opts.write(true).create(true).truncate(false);
            }
        }
        opts.custom_flags(libc::O_CLOEXEC);
        Ok(Arc::new(StdFile(opts.open(path)?)))
    }

    fn remove(&self, path: &Path) -> io::Result<()> {
        std::fs::remove_file(path)
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        std::fs::rename(from, to)
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        File::open(dir)?.sync_all()
    }

    fn list(&self, dir: &Path) -> io::Result<Vec<String>> {
        let mut names = Vec::new();
        for entry in std::fs::read_dir(dir)? {
            let entry = entry?;
            if let Some(name) = entry.file_name().to_str() {
                names.push(name.to_owned());
            }
        }
        Ok(names)
    }

    fn create_dir_all(&self, dir: &Path) -> io::Result<()> {
        if dir.is_dir() {
            return Ok(());
        }
        std::fs::create_dir_all(dir)?;
        if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
            self.sync_dir(parent)?;
        }
        Ok(())
    }

    fn lock(&self, path: &Path) -> io::Result<Box<dyn Any + Send + Sync>> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .custom_flags(libc::O_CLOEXEC)
            .open(path)?;
        // SAFETY: flock takes a descriptor we own and an integer flag.
        cvt(unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) })?;
        Ok(Box::new(StdLock(file)))
    }

    fn exists(&self, path: &Path) -> io::Result<bool> {
        path.try_exists()
    }

    fn is_dir(&self, path: &Path) -> io::Result<bool> {
        match std::fs::metadata(path) {
            Ok(m) => Ok(m.is_dir()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(e),
        }
    }

    fn remove_dir_all(&self, dir: &Path) -> io::Result<()> {
        match std::fs::remove_dir_all(dir) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            other => other,
        }
    }

    fn modified(&self, path: &Path) -> io::Result<SystemTime> {
        std::fs::metadata(path)?.modified()
    }
}

/// Publish a small file by rename: temp file, fsync, rename, fsync the dir.
pub(crate) fn write_atomic(
    fs: &dyn Storage,
    dir: &Path,
    name: &str,
    bytes: &[u8],
) -> std::io::Result<()> {
    let tmp = dir.join(format!("{name}.tmp"));
    if fs.exists(&tmp)? {
        fs.remove(&tmp)?;
    }
    let f = fs.open(&tmp, OpenMode::CreateNew)?;
    f.write_all_at(bytes, 0)?;
    f.sync_all()?;
    fs.rename(&tmp, &dir.join(name))?;
    fs.sync_dir(dir)
}

/// Append `bytes` to `path`, created if missing, without a sync: for
/// diagnostics (the budget's marks), never for state.
pub(crate) fn append_text(path: &Path, bytes: &[u8]) -> io::Result<()> {
    use std::io::Write;
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)?
        .write_all(bytes)
}
