//! A daemon's store beside its log: opened and caught up at start, fed in
//! sequence order, and on the primary the one place store frames are
//! written, so a push is checked against the state it lands on.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::log::{Kind, Log, Meta};
use crate::pushlog::RefUpdate;
pub use crate::repl::{StoreHealth, StoreStall};
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
    health: Mutex<Health>,
    /// The health as it changes, for status and for the twin's reports.
    reported: tokio::sync::watch::Sender<StoreHealth>,
    /// Called with an Erase frame's seq once the store applied it, before
    /// the store says so: copies of the store taken before it (snapshots)
    /// are dropped there.
    erase_hooks: Mutex<Vec<EraseHook>>,
    /// Other copies of the log's frames an erase reaches.
    erase_also: Option<crate::store::EraseAlso>,
}

/// What [`StoreHost::on_erase`] calls.
pub type EraseHook = Arc<dyn Fn(u64) + Send + Sync>;

/// Where the store stopped and when it was last tried.
#[derive(Default)]
struct Health {
    stalled: Option<StoreStall>,
    /// When the last try that failed was made: a stalled store is retried
    /// at most every [`STALL_RETRY`] by the requests that need it.
    last_try: Option<std::time::Instant>,
}

/// How often requests retry a stalled store by themselves.
pub const STALL_RETRY: std::time::Duration = std::time::Duration::from_secs(1);
/// The longest a follower's applier waits between tries of a stalled store.
pub const STALL_RETRY_CAP: std::time::Duration = std::time::Duration::from_secs(30);

fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
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

/// What an erase did on this box.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EraseDone {
    /// The Erase frame's seq.
    pub seq: u64,
    /// Frames this erase rewrote as erased in the log, and the bytes of
    /// meta and blob they held.
    pub frames: u64,
    pub bytes: u64,
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
    /// Neither a store that does not open (a damaged file names itself)
    /// nor a frame that does not apply stops the box from starting: the
    /// store stops there, visibly ([`StoreHost::health`]), retries, and the
    /// log is served as ever.
    pub fn open(
        log: Arc<Log>,
        dir: &std::path::Path,
        opts: StoreOptions,
    ) -> Result<Arc<StoreHost>, StoreError> {
        Self::open_with(log, dir, opts, None)
    }

    /// [`StoreHost::open`], with other copies of the log's frames every
    /// erase must reach ([`crate::store::EraseAlso`]) from the first frame
    /// it applies.
    pub fn open_with(
        log: Arc<Log>,
        dir: &std::path::Path,
        opts: StoreOptions,
        erase_also: Option<crate::store::EraseAlso>,
    ) -> Result<Arc<StoreHost>, StoreError> {
        let host = Arc::new(StoreHost {
            log,
            dir: dir.to_owned(),
            opts,
            erase_also,
            store: Mutex::new(None),
            health: Mutex::new(Health::default()),
            reported: tokio::sync::watch::channel(StoreHealth::default()).0,
            erase_hooks: Mutex::new(Vec::new()),
        });
        match host.catch_up() {
            Ok(done) if done.frames > 0 => tracing::info!(
                frames = done.frames,
                applied = host.applied(),
                "store caught up with the log"
            ),
            Ok(_) => {}
            Err(e) => tracing::error!(error = %e, "the store stopped at a frame it cannot apply"),
        }
        Ok(host)
    }

    /// Call `hook` with each Erase frame's seq once the store applied it,
    /// before the applied seq is published: what a snapshot copied before
    /// it may hold erased data, and must go before anyone is told the
    /// erase was carried out here.
    pub fn on_erase(&self, hook: EraseHook) {
        self.erase_hooks
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(hook);
    }

    fn health_lock(&self) -> MutexGuard<'_, Health> {
        self.health.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn applied(&self) -> u64 {
        self.reported.borrow().applied
    }

    /// How far the store applied and where it stopped, if it did.
    pub fn health(&self) -> StoreHealth {
        self.reported.borrow().clone()
    }

    /// The health as it changes.
    pub fn watch_health(&self) -> tokio::sync::watch::Receiver<StoreHealth> {
        self.reported.subscribe()
    }

    fn publish(&self, store: &Store, stalled: Option<StoreStall>) {
        let now = StoreHealth {
            applied: store.applied(),
            stalled,
            skipped: store.skipped_count(),
        };
        self.reported.send_if_modified(|h| {
            let changed = *h != now;
            *h = now;
            changed
        });
    }

    /// Record how a catch-up went.
    fn note(&self, store: &Store, result: &Result<Applied, StoreError>) {
        let mut h = self.health_lock();
        match result {
            Ok(_) => {
                if let Some(s) = h.stalled.take() {
                    tracing::info!(
                        seq = s.seq,
                        applied = store.applied(),
                        "the store applies again"
                    );
                }
                h.last_try = None;
            }
            Err(e) => {
                let (seq, kind) = match e {
                    StoreError::Apply { seq, kind, .. } => (*seq, *kind),
                    _ => (store.applied() + 1, 0),
                };
                let error = match e {
                    StoreError::Apply { source, .. } => source.to_string(),
                    other => other.to_string(),
                };
                h.last_try = Some(std::time::Instant::now());
                match h.stalled.as_mut() {
                    Some(s) if s.seq == seq => {
                        s.attempts += 1;
                        s.error = error;
                    }
                    _ => {
                        h.stalled = Some(StoreStall {
                            seq,
                            kind,
                            error,
                            since_ms: unix_ms(),
                            attempts: 1,
                        })
                    }
                }
            }
        }
        let stalled = h.stalled.clone();
        drop(h);
        self.publish(store, stalled);
    }

    /// Catch the locked store up, recording its health; while it is
    /// stalled, requests try again at most every [`STALL_RETRY`] and are
    /// refused by name in between, before anything is appended.
    fn caught_up(&self, store: &mut Store, force: bool) -> Result<Applied, StoreError> {
        if !force {
            let h = self.health_lock();
            if let (Some(s), Some(at)) = (&h.stalled, h.last_try) {
                if at.elapsed() < STALL_RETRY {
                    return Err(StoreError::Stalled {
                        seq: s.seq,
                        why: s.error.clone(),
                    });
                }
            }
        }
        let erased_before = store.last_erase();
        let r = store.catch_up(&self.log);
        if store.last_erase() > erased_before {
            let hooks = self
                .erase_hooks
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone();
            for hook in hooks {
                hook(store.last_erase());
            }
        }
        self.note(store, &r);
        r.map_err(|e| match e {
            StoreError::Apply { seq, source, .. } => StoreError::Stalled {
                seq,
                why: source.to_string(),
            },
            other => other,
        })
    }

    /// Apply what was just appended, through `seq`. A failure here is not
    /// a refusal: the frame is durable in the log and the store applies it
    /// once it can, so the answer says so by name.
    fn applied_after(&self, store: &mut Store, seq: u64) -> Result<(), StoreError> {
        match self.caught_up(store, true) {
            Ok(_) => Ok(()),
            Err(e) => Err(StoreError::NotApplied {
                seq,
                why: e.to_string(),
            }),
        }
    }

    /// Try a stalled store again now, whatever the last try's time.
    pub fn retry(&self) -> Result<Applied, StoreError> {
        let mut store = self.lock_or_open(true)?;
        self.caught_up(&mut store, true)
    }

    /// The store, locked, opened first if it is not open (it did not open
    /// at start, or after an install): a failure is recorded as a stop.
    fn lock_or_open(&self, force: bool) -> Result<StoreGuard<'_>, StoreError> {
        let mut g = self.store.lock().unwrap_or_else(|e| e.into_inner());
        if g.is_none() {
            if !force {
                let h = self.health_lock();
                if let (Some(s), Some(at)) = (&h.stalled, h.last_try) {
                    if at.elapsed() < STALL_RETRY {
                        return Err(StoreError::Closed(s.error.clone()));
                    }
                }
            }
            match Store::open(&self.dir, self.log.history(), self.opts).map(|mut s| {
                s.set_erase_also(self.erase_also.clone());
                s
            }) {
                Ok(store) => {
                    if self.health_lock().stalled.take().is_some() {
                        tracing::info!("the store opens again");
                    }
                    self.publish(&store, None);
                    *g = Some(store);
                }
                Err(e) => {
                    let why = format!("the store does not open: {e}");
                    let mut h = self.health_lock();
                    h.last_try = Some(std::time::Instant::now());
                    match h.stalled.as_mut() {
                        Some(s) if s.kind == 0 && s.seq == 0 => {
                            s.attempts += 1;
                            s.error = why.clone();
                        }
                        _ => {
                            h.stalled = Some(StoreStall {
                                seq: 0,
                                kind: 0,
                                error: why.clone(),
                                since_ms: unix_ms(),
                                attempts: 1,
                            })
                        }
                    }
                    let stalled = h.stalled.clone();
                    drop(h);
                    self.reported.send_modify(|r| r.stalled = stalled);
                    return Err(StoreError::Closed(why));
                }
            }
        }
        Ok(StoreGuard(g))
    }

    /// Skip frame `seq` on every box: a StoreSkip frame naming it (by seq
    /// and payload crc) is appended, and each box's store skips it when it
    /// does not apply there, with a record in `SKIPPED`. Refused unless
    /// this store is stalled at `seq`.
    pub fn skip(&self, seq: u64, reason: &str) -> Result<u64, StoreError> {
        let mut store = self.lock()?;
        let stalled_at = self.health_lock().stalled.as_ref().map(|s| s.seq);
        if stalled_at != Some(seq) {
            return Err(StoreError::NotStalledAt {
                seq,
                stalled: stalled_at,
            });
        }
        let crc = self.log.locate_blob(seq)?.payload_crc;
        let f = frames::skip_frame(seq, crc, reason)?;
        let _m = self.log.mutation();
        let at = self.log.append_raw(f.kind.as_u16(), &f.meta, &f.blob)?;
        self.caught_up(&mut store, true)?;
        Ok(at)
    }

    /// The store, locked; refused while a failed install left it closed.
    pub fn lock(&self) -> Result<StoreGuard<'_>, StoreError> {
        let g = self.store.lock().unwrap_or_else(|e| e.into_inner());
        if g.is_none() {
            let why = self
                .health_lock()
                .stalled
                .as_ref()
                .map_or_else(|| "it is not open".to_string(), |s| s.error.clone());
            return Err(StoreError::Closed(why));
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
        let reopened = Store::open(&self.dir, self.log.history(), self.opts).map(|mut s| {
            s.set_erase_also(self.erase_also.clone());
            s
        });
        match reopened {
            Ok(store) => {
                // The installed state is the primary's, applied through the
                // snapshot's seq: whatever stopped this store before is gone.
                *self.health_lock() = Health::default();
                self.publish(&store, None);
                *g = Some(store)
            }
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

    /// Run `cut`, which cuts the log after `after`, with the store first
    /// moved back to `after` when it applied frames past it, and no frame
    /// applied meanwhile. Frames of the store's own past `after` changed
    /// its files, which cannot be undone here: refused by name, nothing
    /// cut. Answers the applied seq the store was moved back from.
    pub fn rewound_for_cut<T>(
        &self,
        after: u64,
        cut: impl FnOnce() -> Result<T, crate::log::Error>,
    ) -> Result<(Option<u64>, T), StoreError> {
        let mut g = self.store.lock().unwrap_or_else(|e| e.into_inner());
        let applied = match g.as_ref() {
            Some(store) => store.applied(),
            None if self.dir.join("APPLIED").exists() => {
                Store::applied_mark(&self.dir, self.log.history())?
            }
            None => 0,
        };
        let mut moved = None;
        if applied > after {
            let mut own = false;
            self.log.scan_kinds::<crate::log::Error>(
                after + 1,
                applied.min(self.log.head_seq()),
                |_, kind| {
                    own |= crate::store::is_store_kind(kind);
                    Ok(())
                },
            )?;
            if own {
                return Err(StoreError::AppliedPastCut { after, applied });
            }
            // Closed while its mark moves; the applier reopens it.
            drop(g.take());
            Store::rewind_to(&self.dir, self.log.history(), after)?;
            moved = Some(applied);
        }
        let done = cut()?;
        if g.is_none() && moved.is_some() {
            // Reopened at its moved mark; should that fail, the applier
            // tries again and reports the stall.
            match Store::open(&self.dir, self.log.history(), self.opts).map(|mut s| {
                s.set_erase_also(self.erase_also.clone());
                s
            }) {
                Ok(store) => *g = Some(store),
                Err(e) => tracing::warn!(error = %e, "the store does not reopen after the cut"),
            }
        }
        Ok((moved, done))
    }

    /// Apply every durable frame not applied yet.
    /// The applied seq, recorded durably: what retention may drop below.
    pub fn applied_durably(&self) -> Result<u64, StoreError> {
        self.lock()?.applied_durably()
    }

    pub fn catch_up(&self) -> Result<Applied, StoreError> {
        let mut store = self.lock_or_open(false)?;
        self.caught_up(&mut store, false)
    }

    /// Create a repository: refused when it exists.
    pub fn create_repo(&self, repo: &str) -> Result<u64, StoreError> {
        let mut store = self.lock()?;
        self.caught_up(&mut store, false)?;
        if store.repo(repo).is_ok() {
            return Err(StoreError::RepoExists(repo.to_owned()));
        }
        let f = frames::repo_frame(repo, RepoOp::Create)?;
        let _m = self.log.mutation();
        let seq = self.log.append_raw(f.kind.as_u16(), &f.meta, &f.blob)?;
        self.applied_after(&mut store, seq)?;
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
        self.caught_up(&mut store, false)?;
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
        self.applied_after(&mut store, done.refs_seq.or(done.pack_seq).unwrap_or(0))?;
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
        self.caught_up(&mut store, false)?;
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
        self.applied_after(&mut store, seq)?;
        Ok(seq)
    }

    /// Delete a large object.
    pub fn lfs_delete(
        &self,
        repo: &str,
        oid: [u8; frames::LFS_OID_LEN],
    ) -> Result<u64, StoreError> {
        let mut store = self.lock()?;
        self.caught_up(&mut store, false)?;
        if !store.repo(repo)?.lfs().contains(&oid) {
            return Err(StoreError::BadPush(format!(
                "no large object {}",
                frames::hex(&oid)
            )));
        }
        let meta = frames::lfs_meta(repo, &oid)?;
        let _m = self.log.mutation();
        let seq = self.log.append_raw(Kind::LfsDelete.as_u16(), &meta, &[])?;
        self.applied_after(&mut store, seq)?;
        Ok(seq)
    }

    /// Delete a repository (a RepoStore Purge frame): refused when there is
    /// none. Its frames stay in the log until retention drops them; `erase`
    /// is what removes its data from the log.
    pub fn delete_repo(&self, repo: &str) -> Result<u64, StoreError> {
        let mut store = self.lock()?;
        self.caught_up(&mut store, false)?;
        store.repo(repo)?;
        let f = frames::repo_frame(repo, RepoOp::Purge)?;
        let _m = self.log.mutation();
        let seq = self.log.append_raw(f.kind.as_u16(), &f.meta, &f.blob)?;
        self.applied_after(&mut store, seq)?;
        Ok(seq)
    }

    /// Delete a control document: refused when there is none.
    pub fn delete_doc(&self, name: &str) -> Result<u64, StoreError> {
        let mut store = self.lock()?;
        self.caught_up(&mut store, false)?;
        if store.doc(name)?.is_none() {
            return Err(StoreError::NoDoc(name.to_owned()));
        }
        let f = frames::doc_delete_frame(name)?;
        let _m = self.log.mutation();
        let seq = self.log.append_raw(f.kind.as_u16(), &f.meta, &f.blob)?;
        self.applied_after(&mut store, seq)?;
        Ok(seq)
    }

    /// Write a control document.
    pub fn put_doc(&self, name: &str, content: &[u8]) -> Result<u64, StoreError> {
        let f = frames::doc_frame(name, content)?;
        self.append_checked(&f)
    }

    /// Erase the data frames of `repos` before `before`, on the log and
    /// the store of every box that applies the frame. `before` past the
    /// frame's own seq could never apply, and is refused here.
    pub fn erase(&self, before: u64, repos: &[String]) -> Result<u64, StoreError> {
        self.erase_counted(before, repos).map(|e| e.seq)
    }

    /// [`StoreHost::erase`], saying what it erased in this box's log.
    pub fn erase_counted(&self, before: u64, repos: &[String]) -> Result<EraseDone, StoreError> {
        let f = frames::erase_frame(before, repos)?;
        let mut store = self.lock()?;
        self.caught_up(&mut store, false)?;
        let _m = self.log.mutation();
        // Under the store's lock no other store frame lands first, but a
        // raw append may: the frame's seq is at least the next one now.
        let next = self.log.head_seq() + 1;
        if before > next {
            return Err(StoreError::BadFrame {
                seq: next,
                why: format!("an erase before {before}, past the next sequence {next}"),
            });
        }
        let seq = self.log.append_raw(f.kind.as_u16(), &f.meta, &f.blob)?;
        self.applied_after(&mut store, seq)?;
        let (frames, bytes) = store.last_erased();
        Ok(EraseDone { seq, frames, bytes })
    }

    /// The first seq from which frames may have been written at or after
    /// `unix_ms`: every frame before it sits in a segment last written
    /// before then. To a segment's precision, and never past what the
    /// time allows: an erase before it erases no frame written later.
    pub fn seq_written_before(&self, unix_ms: u64) -> u64 {
        let at = std::time::UNIX_EPOCH + std::time::Duration::from_millis(unix_ms);
        let mut before = self.log.first_seq();
        for (first, last, _) in self.log.layout() {
            let written =
                std::fs::metadata(crate::log::format::segment_path(self.log.dir(), first))
                    .and_then(|m| m.modified());
            match written {
                Ok(t) if t < at && last >= first => before = last + 1,
                _ => break,
            }
        }
        before
    }

    /// Append a checked frame that needs nothing of the store's state, and
    /// apply it.
    fn append_checked(&self, f: &frames::FrameParts) -> Result<u64, StoreError> {
        let mut store = self.lock()?;
        self.caught_up(&mut store, false)?;
        let _m = self.log.mutation();
        let seq = self.log.append_raw(f.kind.as_u16(), &f.meta, &f.blob)?;
        self.applied_after(&mut store, seq)?;
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
    /// Start the thread. A frame that does not apply stops the store there,
    /// not the thread: it is shown in [`StoreHost::health`] and tried again
    /// with a capped backoff (a shortage of descriptors or space passes),
    /// at every wake, and at once on an operator's retry; a StoreSkip frame
    /// that names it lets it pass.
    pub fn start(host: Arc<StoreHost>) -> std::io::Result<Applier> {
        let (wake, rx) = std::sync::mpsc::sync_channel::<()>(1);
        let thread = std::thread::Builder::new()
            .name("store-applier".into())
            .spawn(move || {
                use std::sync::mpsc::RecvTimeoutError;
                use std::time::Instant;
                let mut backoff = STALL_RETRY;
                // While stalled: when the next try is due. New frames (a
                // StoreSkip among them) bring it to a second after the last
                // try; with none, the wait doubles up to the cap.
                let mut stalled: Option<(Instant, Instant)> = None; // (last try, next try)
                loop {
                    let woke = match stalled {
                        None => rx.recv().map_err(|_| RecvTimeoutError::Disconnected),
                        Some((_, next)) => {
                            rx.recv_timeout(next.saturating_duration_since(Instant::now()))
                        }
                    };
                    match woke {
                        Err(RecvTimeoutError::Disconnected) => break,
                        Ok(()) => {
                            if let Some((last, next)) = stalled.as_mut() {
                                *next = (*next).min(*last + STALL_RETRY);
                                if Instant::now() < *next {
                                    continue;
                                }
                            }
                        }
                        Err(RecvTimeoutError::Timeout) => {}
                    }
                    match host.retry() {
                        Ok(_) => {
                            stalled = None;
                            backoff = STALL_RETRY;
                        }
                        Err(e) => {
                            if stalled.is_none() {
                                tracing::error!(error = %e, "the store stopped applying the log");
                            }
                            let now = Instant::now();
                            stalled = Some((now, now + backoff));
                            backoff = (backoff * 2).min(STALL_RETRY_CAP);
                        }
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
