//! The transaction log: one writer, any number of readers, one directory.
//!
//! Frames are numbered from 1 without gaps and kept in segment files, each
//! with an index of 8 bytes per frame. `docs/FORMAT.md` is the byte-level
//! description; this module is its implementation:
//!
//! - [`format`](mod@format): headers, names, offsets;
//! - `open`: recovery, which cuts a torn tail in the last segment only;
//! - `write`: append, staging, rolls and publication;
//! - `group_commit`: one fdatasync for every frame staged before it;
//! - `pending`: streaming appends, whose blob arrives in pieces;
//! - `read`: whole frames, pieces, meta scans;
//! - `erase`, `retention`: in-place erase, dropping and restarting;
//! - `truncate`: cutting the tail after a sequence, behind an intent file;
//! - `guard`: the mutation/freeze gate a snapshot takes;
//! - [`storage`] and `SimStorage`: the I/O seam and its crash simulator
//!   (with the `testing` feature).

mod erase;
mod error;
pub mod format;
mod group_commit;
mod guard;
mod kind;
pub mod once;
mod open;
mod pending;
pub(crate) mod read;
mod retention;
mod segment;
/// The I/O seam, kept under its old name too: it now sits below the log,
/// in [`crate::storage`], so the store and the push log share it.
pub use crate::storage;
mod tail;
mod truncate;
mod write;

use std::any::Any;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};

#[cfg(any(test, feature = "testing"))]
pub use crate::storage::{CrashMode, SimStorage};
pub use erase::Erased;
pub use error::{Error, Result, SegmentDamage};
pub use guard::{FreezeGuard, MutationGuard};
pub use kind::{Kind, Meta, APP_KIND_FIRST};
pub use open::{OpenOptions, Recovery};
pub use pending::Pending;
pub use read::{BlobReader, Entry, Located};
pub use tail::{Tail, TailFrame};
pub use truncate::Truncated;

use group_commit::{Pacing, SyncState};
use guard::FreezeGate;
use storage::{Storage, StorageFile};
use write::Writer;

/// The default segment size.
pub const DEFAULT_SEGMENT_BYTES: u64 = 64 << 20;
/// The smallest segment size accepted.
pub const MIN_SEGMENT_BYTES: u64 = 256;
/// The largest blob a frame written here may hold: 1 TiB. Every writer
/// (a client's append, a twin applying its primary's stream, a restore)
/// is refused past it ([`Error::TooLarge`]) before anything touches the
/// disk; a length that large is a peer's mistake or its lie, and no
/// reservation for it could succeed on the disks this runs on. Frames
/// already on disk are read up to the format's own bound.
pub const MAX_BLOB: u64 = 1 << 40;

/// A log's history id: minted when the log is created, kept in its
/// directory. Two logs with the same id descend from one log.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct HistoryId(pub [u8; 16]);

impl HistoryId {
    /// A fresh random id.
    pub fn mint() -> std::io::Result<HistoryId> {
        let mut id = [0u8; 16];
        let mut filled = 0;
        while filled < id.len() {
            // SAFETY: the pointer and length describe the unfilled tail of
            // `id`, which lives across the call; getrandom writes at most
            // that many bytes.
            let n =
                unsafe { libc::getrandom(id[filled..].as_mut_ptr().cast(), id.len() - filled, 0) };
            if n < 0 {
                let e = std::io::Error::last_os_error();
                if e.kind() != std::io::ErrorKind::Interrupted {
                    return Err(e);
                }
            } else {
                filled += n as usize;
            }
        }
        Ok(HistoryId(id))
    }
}

impl std::fmt::Display for HistoryId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for b in self.0 {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

impl std::fmt::Debug for HistoryId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "HistoryId({self})")
    }
}

/// A segment as readers and retention see it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Seg {
    first: u64,
    /// The last published sequence in it; `first - 1` while it has none.
    last: u64,
    /// Bytes on disk (the preallocated length for the open segment).
    bytes: u64,
}

/// The transaction log: one writer, any number of readers, one directory.
///
/// `append` is O(1) in the size of the log: a positioned write at the known
/// end of the open segment, one fdatasync, one 8-byte index append.
pub struct Log {
    dir: PathBuf,
    fs: Arc<dyn Storage>,
    segment_bytes: u64,
    history: RwLock<HistoryId>,
    /// The writer lock: staging, rolls, retention and publication.
    writer: Mutex<Writer>,
    /// Published segments, oldest first, the open one last.
    segs: RwLock<Vec<Seg>>,
    /// The newest published (durable and readable) sequence.
    head: AtomicU64,
    pacing: Pacing,
    sync: Mutex<SyncState>,
    poisoned: AtomicBool,
    poison: Mutex<Option<String>>,
    follower: AtomicBool,
    released: AtomicBool,
    /// The open segment's files as readers opened them, `(first, files)`,
    /// kept between reads: a reader of fresh frames (the shipper, the
    /// store's applier, a tail) otherwise paid two opens and two closes
    /// per frame. Dropped whenever the open segment's files change.
    reader_files: Mutex<Option<(u64, OpenFiles)>>,
    /// Raised at each such change, so that files opened before it are
    /// never kept after it.
    reader_files_generation: AtomicU64,
    frame_syncs: AtomicU64,
    erase_syncs: AtomicU64,
    /// Time per fdatasync (and fsync of a seal) of the log's segments.
    sync_time: crate::metrics::Histogram,
    /// Time spent waiting for the writer lock on the write path.
    writer_wait: crate::metrics::Histogram,
    erase_lock: Mutex<()>,
    /// How many `truncate_after` cuts this log made since it was opened,
    /// and the head each left: what a cursor checks its position against.
    cut_count: AtomicU64,
    cut_heads: Mutex<Vec<u64>>,
    gate: FreezeGate,
    recovery: Recovery,
    /// What the log decides by time with ([`OpenOptions::clock`]).
    clock: Arc<dyn crate::clock::Clock>,
    _lock: Box<dyn Any + Send + Sync>,
}

impl std::fmt::Debug for Log {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Log")
            .field("dir", &self.dir)
            .field("history", &self.history())
            .field("first_seq", &self.first_seq())
            .field("head_seq", &self.head_seq())
            .field("follower", &self.is_follower())
            .field("released", &self.is_released())
            .field("poisoned_by", &self.poisoned_by())
            .finish()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every critical section leaves its state consistent before anything
    // that can panic, so a poisoned std mutex carries no torn state.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn read_lock<T>(l: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    l.read().unwrap_or_else(|e| e.into_inner())
}

fn write_lock<T>(l: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    l.write().unwrap_or_else(|e| e.into_inner())
}

impl Log {
    /// Open or create the log at `dir`, cutting a torn tail if there is one.
    pub fn open(dir: impl AsRef<Path>) -> Result<Self> {
        Self::open_opts(dir, OpenOptions::default())
    }

    /// [`Log::open`] with a segment size (tests roll segments small).
    pub fn open_with(dir: impl AsRef<Path>, segment_bytes: u64) -> Result<Self> {
        Self::open_opts(
            dir,
            OpenOptions {
                segment_bytes,
                ..OpenOptions::default()
            },
        )
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The storage the log was opened on: what the files kept beside it
    /// (the store, the epochs, saved tails) are written through too.
    pub fn storage(&self) -> &Arc<dyn Storage> {
        &self.fs
    }

    /// The history id this log belongs to.
    pub fn history(&self) -> HistoryId {
        *read_lock(&self.history)
    }

    /// What `open` found and cut.
    pub fn recovery(&self) -> &Recovery {
        &self.recovery
    }

    /// The segment size new segments are preallocated to.
    pub fn segment_bytes(&self) -> u64 {
        self.segment_bytes
    }

    /// Make this log follower-only (a twin; a box being restored): `append`
    /// and `begin(None)` refuse with [`Error::Follower`], `append_at` works.
    pub fn set_follower(&self, on: bool) {
        self.follower.store(on, Ordering::SeqCst);
    }

    /// See [`Log::set_follower`].
    pub fn is_follower(&self) -> bool {
        self.follower.load(Ordering::SeqCst)
    }

    /// The newest committed sequence; 0 when nothing has been committed.
    pub fn head_seq(&self) -> u64 {
        self.head.load(Ordering::SeqCst)
    }

    /// The oldest sequence still retained; head + 1 when the log is empty.
    pub fn first_seq(&self) -> u64 {
        read_lock(&self.segs).first().map_or(1, |s| s.first)
    }

    /// What poisoned the log, if anything did ([`Error::Poisoned`]).
    pub fn poisoned_by(&self) -> Option<String> {
        lock(&self.poison).clone()
    }

    /// How many fdatasyncs made frames durable since this log was opened.
    /// Rolls, releases and cuts sync too, rarely, and are not counted.
    pub fn frame_syncs(&self) -> u64 {
        self.frame_syncs.load(Ordering::SeqCst)
    }

    /// Time per sync of the log's segments since this log was opened.
    pub fn sync_time(&self) -> &crate::metrics::Histogram {
        &self.sync_time
    }

    /// Time appenders, the group-commit leader and streaming appends
    /// waited for the writer lock (a streaming append holds it for its
    /// whole entry).
    pub fn writer_wait(&self) -> &crate::metrics::Histogram {
        &self.writer_wait
    }

    /// How many fsyncs [`Log::erase`] made since this log was opened.
    pub fn erase_syncs(&self) -> u64 {
        self.erase_syncs.load(Ordering::SeqCst)
    }

    /// The files are given up ([`Log::release`]).
    pub fn is_released(&self) -> bool {
        self.released.load(Ordering::SeqCst)
    }

    /// The segments as retention sees them, oldest first, the open one last:
    /// `(first, last, bytes)`; `last` is `first - 1` for a segment that holds
    /// no frame yet. Only whole segments are ever dropped, so the bytes a
    /// `from` keeps are the sum of the segments at and after the one holding it.
    pub fn layout(&self) -> Vec<(u64, u64, u64)> {
        read_lock(&self.segs)
            .iter()
            .map(|s| (s.first, s.last, s.bytes))
            .collect()
    }

    /// Bytes on disk across all segments.
    pub fn bytes(&self) -> u64 {
        read_lock(&self.segs).iter().map(|s| s.bytes).sum()
    }

    fn poison_with(&self, what: String) -> Error {
        let mut p = lock(&self.poison);
        if p.is_none() {
            tracing::error!(dir = %self.dir.display(), %what, "log poisoned");
            *p = Some(what.clone());
        }
        self.poisoned.store(true, Ordering::SeqCst);
        Error::Poisoned(what)
    }

    /// Latch a failed write or fsync: the log refuses every later write.
    /// Answers the original error, so the caller that hit it sees the cause.
    fn poison_io(&self, doing: &str, e: std::io::Error) -> Error {
        let _ = self.poison_with(format!("{doing}: {e}"));
        Error::Io(e)
    }

    fn check_poison(&self) -> Result<()> {
        if self.poisoned.load(Ordering::SeqCst) {
            return Err(Error::Poisoned(self.poisoned_by().unwrap_or_default()));
        }
        Ok(())
    }

    fn segment_file(&self, first: u64) -> PathBuf {
        format::segment_path(&self.dir, first)
    }

    fn index_file(&self, first: u64) -> PathBuf {
        format::index_path(&self.dir, first)
    }

    /// Record a cut to `head` for the cursors reading this log.
    fn note_cut(&self, head: u64) {
        let mut heads = lock(&self.cut_heads);
        heads.push(head);
        self.cut_count.store(heads.len() as u64, Ordering::SeqCst);
    }

    /// How many cuts there were so far.
    fn cuts(&self) -> u64 {
        self.cut_count.load(Ordering::SeqCst)
    }

    /// The lowest head a cut after the first `seen` left, if there was one.
    fn lowest_cut_since(&self, seen: u64) -> Option<u64> {
        let heads = lock(&self.cut_heads);
        let seen = usize::try_from(seen).unwrap_or(usize::MAX);
        heads.get(seen..).and_then(|h| h.iter().copied().min())
    }
}

/// An open segment's files, shared by the writer and a group-commit leader.
#[derive(Clone, Debug)]
struct OpenFiles {
    log: Arc<dyn StorageFile>,
    idx: Arc<dyn StorageFile>,
}
