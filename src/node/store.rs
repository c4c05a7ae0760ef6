//! A daemon's store beside its log: opened and caught up at start, fed in
//! sequence order, and on the primary the one place store frames are
//! written, so a push is checked against the state it lands on.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::log::{Kind, Log, Meta};
use crate::pushlog::RefUpdate;
use crate::store::frames::{self, PackEvent, PackParser, RepoOp};
use crate::store::install::{self, InstallPaths, InstallStep};
use crate::store::{Applied, Manifest, Store, StoreError, StoreOptions};

/// A store and the log that feeds it.
pub struct StoreHost {
    log: Arc<Log>,
    dir: PathBuf,
    opts: StoreOptions,
    /// None only while a snapshot install swaps the files, under the lock.
    store: Mutex<Option<Store>>,
}

/// The store, locked.
pub struct StoreGuard<'a>(MutexGuard<'a, Option<Store>>);

impl std::ops::Deref for StoreGuard<'_> {
    type Target = Store;
    fn deref(&self) -> &Store {
        match self.0.as_ref() {
            Some(s) => s,
            // A guard is made only over Some, and holds the lock that any
            // change to None needs.
            None => unreachable!("a store guard over a closed store"),
        }
    }
}

impl std::ops::DerefMut for StoreGuard<'_> {
    fn deref_mut(&mut self) -> &mut Store {
        match self.0.as_mut() {
            Some(s) => s,
            None => unreachable!("a store guard over a closed store"),
        }
    }
}

/// What a push wrote.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PushDone {
    pub pack_seq: Option<u64>,
    pub refs_seq: Option<u64>,
    pub objects: u64,
}

impl StoreHost {
    /// Open the store in `dir` and apply what the log holds beyond it.
    pub fn open(
        log: Arc<Log>,
        dir: &std::path::Path,
        opts: StoreOptions,
    ) -> Result<Arc<StoreHost>, StoreError> {
        let mut store = Store::open(dir, log.history(), opts)?;
        let done = store.catch_up(&log)?;
        if done.frames > 0 {
            tracing::info!(
                frames = done.frames,
                applied = store.applied(),
                "store caught up with the log"
            );
        }
        Ok(Arc::new(StoreHost {
            log,
            dir: dir.to_owned(),
            opts,
            store: Mutex::new(Some(store)),
        }))
    }

    /// The store, locked; refused while a failed install left it closed.
    pub fn lock(&self) -> Result<StoreGuard<'_>, StoreError> {
        let g = self.store.lock().unwrap_or_else(|e| e.into_inner());
        if g.is_none() {
            return Err(StoreError::Closed(
                "a snapshot install failed to reopen it; restart the daemon".into(),
            ));
        }
        Ok(StoreGuard(g))
    }

    /// Snapshot the store at the log's head into `dest`.
    pub fn snapshot_to(&self, dest: &Path) -> Result<Manifest, StoreError> {
        self.lock()?.snapshot(&self.log, dest)
    }

    /// Install the snapshot staged in the data directory: the store is
    /// closed, the files swapped and the log restarted (all or nothing
    /// across a crash, see `store::install`), then the store reopened.
    pub fn install_snapshot(
        &self,
        paths: &InstallPaths,
        stop_after: Option<InstallStep>,
    ) -> Result<u64, StoreError> {
        let mut g = self.store.lock().unwrap_or_else(|e| e.into_inner());
        drop(g.take());
        let installed = install::install(paths, &self.log, stop_after);
        let reopened = Store::open(&self.dir, self.log.history(), self.opts);
        match reopened {
            Ok(store) => *g = Some(store),
            Err(e) => {
                tracing::error!(error = %e, "the store does not reopen after a snapshot install");
                return Err(e);
            }
        }
        installed
    }

    pub fn log(&self) -> &Arc<Log> {
        &self.log
    }

    /// Apply every durable frame not applied yet.
    pub fn catch_up(&self) -> Result<Applied, StoreError> {
        self.lock()?.catch_up(&self.log)
    }

    /// Create a repository: refused when it exists.
    pub fn create_repo(&self, repo: &str) -> Result<u64, StoreError> {
        let mut store = self.lock()?;
        store.catch_up(&self.log)?;
        if store.repo(repo).is_ok() {
            return Err(StoreError::RepoExists(repo.to_owned()));
        }
        let f = frames::repo_frame(repo, RepoOp::Create)?;
        let _m = self.log.mutation();
        let seq = self.log.append_raw(f.kind.as_u16(), &f.meta, &f.blob)?;
        store.catch_up(&self.log)?;
        Ok(seq)
    }

    /// A push: the pack's `pack_len` bytes from `pieces` (checked object by
    /// object as they stream into the log; a pack that does not check is
    /// aborted and leaves nothing), then the ref updates, which must move
    /// each ref from where it is now. Both frames are durable and applied
    /// when this returns.
    pub fn push(
        &self,
        repo: &str,
        pack_len: u64,
        updates: &[RefUpdate],
        at_ms: u64,
        pieces: &mut dyn Iterator<Item = bytes::Bytes>,
    ) -> Result<PushDone, StoreError> {
        let mut store = self.lock()?;
        store.catch_up(&self.log)?;
        store.repo(repo)?;
        if pack_len == 0 && updates.is_empty() {
            return Err(StoreError::BadPush(
                "a push carries objects or ref updates".into(),
            ));
        }
        let refs = if updates.is_empty() {
            None
        } else {
            store.check_push(repo, updates)?;
            Some(frames::refs_frame(repo, at_ms, updates)?)
        };
        let _m = self.log.mutation();
        let mut done = PushDone::default();
        if pack_len > 0 {
            let meta = Meta::repo(repo).encode()?;
            let mut pending = self.log.begin(None, Kind::Pack.as_u16(), &meta, pack_len)?;
            let mut parser = PackParser::new(0);
            let mut got = 0u64;
            for piece in pieces {
                got += piece.len() as u64;
                if got > pack_len {
                    break;
                }
                parser.feed(&piece, &mut |ev| {
                    if let PackEvent::End(_) = ev {
                        done.objects += 1;
                    }
                    Ok(())
                })?;
                pending.write(&piece)?;
            }
            if got != pack_len {
                return Err(StoreError::BadPush(format!(
                    "the pack is {pack_len} bytes, {got} arrived"
                )));
            }
            parser.finish()?;
            done.pack_seq = Some(pending.commit()?);
        }
        if let Some(f) = refs {
            done.refs_seq = Some(self.log.append_raw(f.kind.as_u16(), &f.meta, &f.blob)?);
        }
        store.catch_up(&self.log)?;
        Ok(done)
    }

    /// Put a large object: its `len` bytes from `pieces` stream into an
    /// LfsPut frame while their SHA-256 is computed; bytes that do not hash
    /// to `oid` abort the frame and nothing lands.
    pub fn lfs_put(
        &self,
        repo: &str,
        oid: [u8; frames::LFS_OID_LEN],
        len: u64,
        pieces: &mut dyn Iterator<Item = bytes::Bytes>,
    ) -> Result<u64, StoreError> {
        let mut store = self.lock()?;
        store.catch_up(&self.log)?;
        store.repo(repo)?;
        let meta = frames::lfs_meta(repo, &oid)?;
        let _m = self.log.mutation();
        let mut pending = self.log.begin(None, Kind::LfsPut.as_u16(), &meta, len)?;
        let mut sha = ring::digest::Context::new(&ring::digest::SHA256);
        let mut got = 0u64;
        for piece in pieces {
            got += piece.len() as u64;
            if got > len {
                break;
            }
            sha.update(&piece);
            pending.write(&piece)?;
        }
        if got != len {
            return Err(StoreError::BadPush(format!(
                "the object is {len} bytes, {got} arrived"
            )));
        }
        if sha.finish().as_ref() != oid {
            return Err(StoreError::BadPush(format!(
                "the object does not hash to {}",
                frames::hex(&oid)
            )));
        }
        let seq = pending.commit()?;
        store.catch_up(&self.log)?;
        Ok(seq)
    }

    /// Delete a large object.
    pub fn lfs_delete(
        &self,
        repo: &str,
        oid: [u8; frames::LFS_OID_LEN],
    ) -> Result<u64, StoreError> {
        let mut store = self.lock()?;
        store.catch_up(&self.log)?;
        if !store.repo(repo)?.lfs().contains(&oid) {
            return Err(StoreError::BadPush(format!(
                "no large object {}",
                frames::hex(&oid)
            )));
        }
        let meta = frames::lfs_meta(repo, &oid)?;
        let _m = self.log.mutation();
        let seq = self.log.append_raw(Kind::LfsDelete.as_u16(), &meta, &[])?;
        store.catch_up(&self.log)?;
        Ok(seq)
    }

    /// Append any other store frame (an erase, a document) and apply it.
    pub fn append_frame(&self, f: &frames::FrameParts) -> Result<u64, StoreError> {
        let mut store = self.lock()?;
        store.catch_up(&self.log)?;
        let _m = self.log.mutation();
        let seq = self.log.append_raw(f.kind.as_u16(), &f.meta, &f.blob)?;
        store.catch_up(&self.log)?;
        Ok(seq)
    }
}

/// Keeps a follower's store applied up to its durable head: a thread woken
/// after each durable batch, which catches up with whatever is durable by
/// then, so a burst of batches costs one catch-up.
pub struct Applier {
    wake: std::sync::mpsc::SyncSender<()>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// Wakes an [`Applier`]; cheap to clone into the task that watches the
/// durable head.
#[derive(Clone)]
pub struct ApplierWaker(std::sync::mpsc::SyncSender<()>);

impl ApplierWaker {
    /// Frames became durable.
    pub fn wake(&self) {
        // A full channel means a catch-up is already due.
        let _ = self.0.try_send(());
    }
}

impl Applier {
    /// Start the thread. A frame that does not apply stops it loudly: the
    /// log keeps the frames, and the next start applies them or fails the
    /// same way.
    pub fn start(host: Arc<StoreHost>) -> std::io::Result<Applier> {
        let (wake, rx) = std::sync::mpsc::sync_channel::<()>(1);
        let thread = std::thread::Builder::new()
            .name("store-applier".into())
            .spawn(move || {
                while rx.recv().is_ok() {
                    if let Err(e) = host.catch_up() {
                        tracing::error!(error = %e, "the store stopped applying the log");
                        return;
                    }
                }
                // The last wake may have raced the stop: apply what is
                // durable before the store closes.
                if let Err(e) = host.catch_up() {
                    tracing::error!(error = %e, "the store's last catch-up failed");
                }
            })?;
        Ok(Applier {
            wake,
            thread: Some(thread),
        })
    }

    pub fn waker(&self) -> ApplierWaker {
        ApplierWaker(self.wake.clone())
    }

    /// Frames became durable.
    pub fn wake(&self) {
        let _ = self.wake.try_send(());
    }

    /// Stop once every waker is gone, after a last catch-up, and wait: the
    /// store's files are closed when this returns.
    pub fn stop(mut self) {
        let (dead, _) = std::sync::mpsc::sync_channel(1);
        drop(std::mem::replace(&mut self.wake, dead));
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
