//! A simulated file system for crash and fault tests.
//!
//! Every file has a live image (what reads see) and a durable image (what a
//! power cut leaves): `sync_data`/`sync_all` copy one to the other. Names are
//! the same: a created, removed or renamed name is durable only once its
//! directory is synced. [`SimStorage::crash`] throws away everything not
//! durable, optionally keeping a prefix of each file's unsynced writes (the
//! order a disk may have written them in), and every handle opened before the
//! crash fails from then on. Faults are armed by count: the n-th sync or
//! write from now fails with an I/O error, or the n-th sync crashes the
//! machine before it happens.
//!
//! Directories are implicit: one exists while a name lies under it, and a
//! directory's removal is the removal of every name under it.

use std::any::Any;
use std::collections::{BTreeMap, HashSet};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::SystemTime;

use super::{OpenMode, Storage, StorageFile};

#[derive(Debug, Default, Clone)]
struct Inode {
    /// Shared until written: a sync, a crash and a fork copy a pointer,
    /// not the file (a fresh redb file is megabytes of zeros).
    live: Arc<Vec<u8>>,
    durable: Arc<Vec<u8>>,
    /// Writes since the last sync, oldest first, for a torn crash.
    unsynced: Vec<Write>,
    /// The wall clock at the last write (or the creation): what a
    /// segment's age is read from. Not rolled back by a crash, which the
    /// callers (retention, an erase by time) never need.
    mtime: Option<SystemTime>,
}

#[derive(Debug, Clone)]
enum Write {
    At(u64, Vec<u8>),
    Len(u64),
}

impl Inode {
    fn apply(image: &mut Vec<u8>, write: &Write) {
        match write {
            Write::At(offset, bytes) => {
                let end = *offset as usize + bytes.len();
                if image.len() < end {
                    image.resize(end, 0);
                }
                image[*offset as usize..end].copy_from_slice(bytes);
            }
            Write::Len(len) => image.resize(*len as usize, 0),
        }
    }

    fn created() -> Inode {
        Inode {
            mtime: Some(crate::clock::wall()),
            ..Inode::default()
        }
    }

    fn record(&mut self, write: Write) {
        self.mtime = Some(crate::clock::wall());
        Self::apply(Arc::make_mut(&mut self.live), &write);
        self.unsynced.push(write);
    }

    fn sync(&mut self) {
        self.durable = Arc::clone(&self.live);
        self.unsynced.clear();
    }
}

#[derive(Debug, Default, Clone)]
struct State {
    inodes: Vec<Inode>,
    live_names: BTreeMap<PathBuf, usize>,
    durable_names: BTreeMap<PathBuf, usize>,
    locks: HashSet<LockKey>,
    /// Bumped by every crash; a handle from an older epoch is dead.
    epoch: u64,
    crashed: bool,
    syncs: u64,
    writes: u64,
    fail_sync_in: Option<u64>,
    fail_write_in: Option<u64>,
    crash_sync_in: Option<u64>,
    enospc_after_bytes: Option<u64>,
    /// Directories renamed (to `Some`) or removed (`None`) whose change is
    /// not durable yet: one entry in a parent directory each, so the
    /// whole subtree moves, durably and at once, when either parent is
    /// synced (as a journaling file system commits a rename).
    dir_moves: Vec<(PathBuf, Option<PathBuf>)>,
}

/// Which of the unsynced writes a crash keeps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CrashMode {
    /// Only what was synced survives.
    LoseUnsynced,
    /// Each file keeps its first `n % (unsynced + 1)` unsynced writes, with
    /// `n` derived from the seed and the file: a disk that wrote some of
    /// the page cache out in order before the power went.
    KeepPrefix(u64),
}

/// The simulated file system. Cheap to clone: clones share one disk.
#[derive(Debug, Clone, Default)]
pub struct SimStorage {
    state: Arc<Mutex<State>>,
}

fn crashed() -> io::Error {
    io::Error::other("simulated machine has crashed")
}

fn injected(what: &str) -> io::Error {
    io::Error::other(format!("injected {what} failure"))
}

impl SimStorage {
    /// An empty disk.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock_state(&self) -> MutexGuard<'_, State> {
        // A panic while holding this lock is a test failure already; the
        // state itself is still consistent enough to inspect.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A copy of this disk as it is now, live and durable images alike,
    /// with a future of its own: a test prepares a disk once and runs each
    /// crash on a fork of it. Nothing open on this disk is open on the
    /// copy, and no lock is held there.
    pub fn fork(&self) -> SimStorage {
        let mut state = self.lock_state().clone();
        state.locks.clear();
        state.epoch += 1;
        SimStorage {
            state: Arc::new(Mutex::new(state)),
        }
    }

    /// Syncs (file and directory) made so far.
    pub fn syncs(&self) -> u64 {
        self.lock_state().syncs
    }

    /// Writes made so far.
    pub fn writes(&self) -> u64 {
        self.lock_state().writes
    }

    /// The `n`-th sync from now (1 = the next) fails with an I/O error.
    pub fn fail_sync_in(&self, n: u64) {
        self.lock_state().fail_sync_in = Some(n);
    }

    /// The `n`-th write from now (1 = the next) fails with an I/O error.
    pub fn fail_write_in(&self, n: u64) {
        self.lock_state().fail_write_in = Some(n);
    }

    /// Writes fail with ENOSPC once `bytes` more have been written.
    pub fn fill_disk_after(&self, bytes: u64) {
        self.lock_state().enospc_after_bytes = Some(bytes);
    }

    /// The `n`-th sync from now crashes the machine instead of happening.
    pub fn crash_at_sync(&self, n: u64) {
        self.lock_state().crash_sync_in = Some(n);
    }

    /// Whether an armed crash has happened.
    pub fn has_crashed(&self) -> bool {
        self.lock_state().crashed
    }

    /// Power cut now: keep what `mode` says survives, drop every lock and
    /// kill every open handle. The disk is usable again right after.
    pub fn crash(&self, mode: CrashMode) {
        let mut s = self.lock_state();
        let live: Vec<usize> = s.durable_names.values().copied().collect();
        for (i, inode) in s.inodes.iter_mut().enumerate() {
            let mut image = Arc::clone(&inode.durable);
            if let CrashMode::KeepPrefix(seed) = mode {
                if live.contains(&i) && !inode.unsynced.is_empty() {
                    let mix = seed
                        .wrapping_mul(0x9E37_79B9_7F4A_7C15)
                        .wrapping_add(i as u64 * 0x2545_F491);
                    let keep = (mix % (inode.unsynced.len() as u64 + 1)) as usize;
                    for write in &inode.unsynced[..keep] {
                        Inode::apply(Arc::make_mut(&mut image), write);
                    }
                }
            }
            inode.live = Arc::clone(&image);
            inode.durable = image;
            inode.unsynced.clear();
        }
        s.live_names = s.durable_names.clone();
        s.dir_moves.clear();
        s.locks.clear();
        s.epoch += 1;
        s.crashed = false;
        s.fail_sync_in = None;
        s.fail_write_in = None;
        s.crash_sync_in = None;
        s.enospc_after_bytes = None;
    }

    /// The live bytes of a file, for tests that damage or inspect files.
    pub fn read_file(&self, path: &Path) -> Option<Vec<u8>> {
        let s = self.lock_state();
        s.live_names
            .get(path)
            .map(|&i| s.inodes[i].live.as_ref().clone())
    }

    /// Replace a file's bytes, durably (a test's damage, made on a disk).
    pub fn write_file(&self, path: &Path, bytes: &[u8]) {
        let mut s = self.lock_state();
        let i = match s.live_names.get(path) {
            Some(&i) => i,
            None => {
                s.inodes.push(Inode::created());
                let i = s.inodes.len() - 1;
                s.live_names.insert(path.to_owned(), i);
                s.durable_names.insert(path.to_owned(), i);
                i
            }
        };
        s.inodes[i].live = Arc::new(bytes.to_vec());
        s.inodes[i].mtime = Some(crate::clock::wall());
        s.inodes[i].sync();
    }

    /// Every live file name.
    pub fn files(&self) -> Vec<PathBuf> {
        self.lock_state().live_names.keys().cloned().collect()
    }

    fn count_sync(s: &mut State) -> io::Result<()> {
        if s.crashed {
            return Err(crashed());
        }
        s.syncs += 1;
        if let Some(n) = s.crash_sync_in.as_mut() {
            *n -= 1;
            if *n == 0 {
                s.crash_sync_in = None;
                s.crashed = true;
                return Err(crashed());
            }
        }
        if let Some(n) = s.fail_sync_in.as_mut() {
            *n -= 1;
            if *n == 0 {
                s.fail_sync_in = None;
                return Err(injected("fsync"));
            }
        }
        Ok(())
    }

    fn count_write(s: &mut State, bytes: u64) -> io::Result<()> {
        if s.crashed {
            return Err(crashed());
        }
        s.writes += 1;
        if let Some(n) = s.fail_write_in.as_mut() {
            *n -= 1;
            if *n == 0 {
                s.fail_write_in = None;
                return Err(injected("write"));
            }
        }
        if let Some(left) = s.enospc_after_bytes.as_mut() {
            if *left < bytes {
                return Err(io::Error::from_raw_os_error(libc::ENOSPC));
            }
            *left -= bytes;
        }
        Ok(())
    }
}

#[derive(Debug)]
struct SimFile {
    disk: SimStorage,
    inode: usize,
    epoch: u64,
    writable: bool,
}

impl SimFile {
    fn state(&self) -> io::Result<MutexGuard<'_, State>> {
        let s = self.disk.lock_state();
        if s.epoch != self.epoch || s.crashed {
            return Err(crashed());
        }
        Ok(s)
    }

    fn write(&self, write: Write, bytes: u64) -> io::Result<()> {
        if !self.writable {
            return Err(io::Error::from_raw_os_error(libc::EBADF));
        }
        let mut s = self.state()?;
        SimStorage::count_write(&mut s, bytes)?;
        s.inodes[self.inode].record(write);
        Ok(())
    }
}

impl StorageFile for SimFile {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        let s = self.state()?;
        let data = &s.inodes[self.inode].live;
        if offset >= data.len() as u64 {
            return Ok(0);
        }
        let n = buf.len().min(data.len() - offset as usize);
        buf[..n].copy_from_slice(&data[offset as usize..offset as usize + n]);
        Ok(n)
    }

    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.write(Write::At(offset, buf.to_vec()), buf.len() as u64)
    }

    fn sync_data(&self) -> io::Result<()> {
        let mut s = self.state()?;
        SimStorage::count_sync(&mut s)?;
        s.inodes[self.inode].sync();
        Ok(())
    }

    fn sync_all(&self) -> io::Result<()> {
        self.sync_data()
    }

    fn len(&self) -> io::Result<u64> {
        Ok(self.state()?.inodes[self.inode].live.len() as u64)
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        self.write(Write::Len(len), 0)
    }

    fn allocate(&self, offset: u64, len: u64) -> io::Result<()> {
        let end = offset + len;
        if self.len()? < end {
            self.write(Write::Len(end), len)?;
        }
        Ok(())
    }

    fn punch(&self, offset: u64, len: u64) -> io::Result<()> {
        let file_len = self.len()?;
        let end = (offset + len).min(file_len);
        if offset >= end {
            return Ok(());
        }
        self.write(Write::At(offset, vec![0; (end - offset) as usize]), 0)
    }
}

/// What a lock holds: the file a name points to when it names one, as
/// flock(2) locks the inode (a file renamed over a locked one is not
/// locked), else the name itself (a lock file the simulation never writes).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum LockKey {
    Inode(usize),
    Name(PathBuf),
}

#[derive(Debug)]
struct SimLock {
    disk: SimStorage,
    key: LockKey,
    epoch: u64,
}

impl Drop for SimLock {
    fn drop(&mut self) {
        let mut s = self.disk.lock_state();
        if s.epoch == self.epoch {
            s.locks.remove(&self.key);
        }
    }
}

impl SimStorage {
    fn live(&self) -> io::Result<MutexGuard<'_, State>> {
        let s = self.lock_state();
        if s.crashed {
            return Err(crashed());
        }
        Ok(s)
    }
}

/// Take every name under `from` out of `names`, answering them renamed to
/// lie under `to` instead (none when `to` is `None`: a removal).
fn move_subtree(
    names: &mut BTreeMap<PathBuf, usize>,
    from: &Path,
    to: Option<&Path>,
) -> Vec<(PathBuf, usize)> {
    let under: Vec<PathBuf> = names
        .keys()
        .filter(|p| p.as_path() != from && p.starts_with(from))
        .cloned()
        .collect();
    let mut moved = Vec::new();
    for p in under {
        if let Some(i) = names.remove(&p) {
            if let (Some(to), Ok(rest)) = (to, p.strip_prefix(from)) {
                moved.push((to.join(rest), i));
            }
        }
    }
    moved
}

/// Whether a live name lies under `dir`: what makes an implicit directory.
fn has_under(s: &State, dir: &Path) -> bool {
    use std::ops::Bound;
    // Paths order by component, so every name under `dir` follows it
    // directly.
    s.live_names
        .range::<Path, _>((Bound::Excluded(dir), Bound::Unbounded))
        .next()
        .is_some_and(|(p, _)| p.starts_with(dir))
}

fn not_found(path: &Path) -> io::Error {
    io::Error::new(
        io::ErrorKind::NotFound,
        format!("{}: no such file", path.display()),
    )
}

impl Storage for SimStorage {
    fn open(&self, path: &Path, mode: OpenMode) -> io::Result<Arc<dyn StorageFile>> {
        let mut s = self.live()?;
        let inode = match (s.live_names.get(path).copied(), mode) {
            // No name, so nothing a crash keeps.
            (_, OpenMode::Unnamed) => {
                s.inodes.push(Inode::created());
                s.inodes.len() - 1
            }
            (Some(_), OpenMode::CreateNew) => {
                return Err(io::Error::new(
                    io::ErrorKind::AlreadyExists,
                    format!("{}: exists", path.display()),
                ))
            }
            (Some(i), _) => i,
            (None, OpenMode::CreateNew | OpenMode::Create) => {
                s.inodes.push(Inode::created());
                let i = s.inodes.len() - 1;
                s.live_names.insert(path.to_owned(), i);
                i
            }
            (None, _) => return Err(not_found(path)),
        };
        Ok(Arc::new(SimFile {
            disk: self.clone(),
            inode,
            epoch: s.epoch,
            writable: mode != OpenMode::Read,
        }))
    }

    fn remove(&self, path: &Path) -> io::Result<()> {
        let mut s = self.live()?;
        s.live_names
            .remove(path)
            .map(|_| ())
            .ok_or_else(|| not_found(path))
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        let mut s = self.live()?;
        if let Some(i) = s.live_names.remove(from) {
            s.live_names.insert(to.to_owned(), i);
            return Ok(());
        }
        if !has_under(&s, from) {
            return Err(not_found(from));
        }
        if has_under(&s, to) {
            // rename(2) replaces only an empty directory.
            return Err(io::Error::from_raw_os_error(libc::ENOTEMPTY));
        }
        let moved = move_subtree(&mut s.live_names, from, Some(to));
        s.live_names.extend(moved);
        s.dir_moves.push((from.to_owned(), Some(to.to_owned())));
        Ok(())
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        let mut s = self.live()?;
        SimStorage::count_sync(&mut s)?;
        let moves = std::mem::take(&mut s.dir_moves);
        for (from, to) in moves {
            let touches =
                from.parent() == Some(dir) || to.as_deref().and_then(Path::parent) == Some(dir);
            if touches {
                let moved = move_subtree(&mut s.durable_names, &from, to.as_deref());
                s.durable_names.extend(moved);
            } else {
                s.dir_moves.push((from, to));
            }
        }
        let in_dir = |p: &PathBuf| p.parent() == Some(dir);
        s.durable_names.retain(|p, _| !in_dir(p));
        let live: Vec<(PathBuf, usize)> = s
            .live_names
            .iter()
            .filter(|(p, _)| in_dir(p))
            .map(|(p, i)| (p.clone(), *i))
            .collect();
        s.durable_names.extend(live);
        Ok(())
    }

    fn list(&self, dir: &Path) -> io::Result<Vec<String>> {
        let s = self.live()?;
        let mut names: Vec<String> = s
            .live_names
            .keys()
            .filter_map(|p| p.strip_prefix(dir).ok()?.components().next())
            .filter_map(|c| c.as_os_str().to_str().map(str::to_owned))
            .collect();
        names.dedup();
        Ok(names)
    }

    fn create_dir_all(&self, _dir: &Path) -> io::Result<()> {
        // Directories are implicit: a name's parent exists once named.
        self.live().map(|_| ())
    }

    fn lock(&self, path: &Path) -> io::Result<Box<dyn Any + Send + Sync>> {
        let mut s = self.live()?;
        let key = match s.live_names.get(path) {
            Some(&i) => LockKey::Inode(i),
            None => LockKey::Name(path.to_owned()),
        };
        if !s.locks.insert(key.clone()) {
            return Err(io::Error::new(
                io::ErrorKind::WouldBlock,
                format!("{}: locked", path.display()),
            ));
        }
        Ok(Box::new(SimLock {
            disk: self.clone(),
            key,
            epoch: s.epoch,
        }))
    }

    fn exists(&self, path: &Path) -> io::Result<bool> {
        let s = self.live()?;
        Ok(s.live_names.contains_key(path) || has_under(&s, path))
    }

    fn is_dir(&self, path: &Path) -> io::Result<bool> {
        Ok(has_under(&*self.live()?, path))
    }

    fn remove_dir_all(&self, dir: &Path) -> io::Result<()> {
        let mut s = self.live()?;
        if has_under(&s, dir) {
            move_subtree(&mut s.live_names, dir, None);
            s.dir_moves.push((dir.to_owned(), None));
        }
        Ok(())
    }

    fn modified(&self, path: &Path) -> io::Result<SystemTime> {
        let s = self.live()?;
        let &i = s.live_names.get(path).ok_or_else(|| not_found(path))?;
        Ok(s.inodes[i].mtime.unwrap_or(SystemTime::UNIX_EPOCH))
    }
}
