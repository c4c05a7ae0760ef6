//! A daemon's store beside its log: opened and caught up at start, fed in
//! sequence order, and on the primary the one place store frames are
//! written, so a push is checked against the state it lands on.
//!
//! Owns the store's place in a daemon: opening, catching up, feeding and
//! its health. May not touch the store's own format and rules (those are
//! [`crate::store`]'s), nor the sessions that bring it frames.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::log::Log;
use crate::node::clock::unix_ms;
pub use crate::repl::{StoreHealth, StoreStall};
use crate::store::frames::{self};
use crate::store::install::{self, InstallPaths, InstallStep};
use crate::store::{Applied, Manifest, Store, StoreError, StoreOptions};

mod applier;
mod writes;

pub use applier::{Applier, ApplierWaker};

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
    last_try: Option<tokio::time::Instant>,
}

/// How often requests retry a stalled store by themselves.
pub const STALL_RETRY: std::time::Duration = std::time::Duration::from_secs(1);
/// The longest a follower's applier waits between tries of a stalled store.
pub const STALL_RETRY_CAP: std::time::Duration = std::time::Duration::from_secs(30);

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
                h.last_try = Some(crate::node::clock::instant());
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
            match self.open_store().map(|mut s| {
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
                    h.last_try = Some(crate::node::clock::instant());
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
        let reopened = self.open_store().map(|mut s| {
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

    /// The store, opened through the log's storage: the two are kept on
    /// one disk and crash together.
    fn open_store(&self) -> Result<Store, StoreError> {
        Store::open_with(
            self.log.storage().clone(),
            &self.dir,
            self.log.history(),
            self.opts,
        )
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
            None if self
                .log
                .storage()
                .exists(&self.dir.join("APPLIED"))
                .unwrap_or(false) =>
            {
                Store::applied_mark_with(&**self.log.storage(), &self.dir, self.log.history())?
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
            Store::rewind_to_with(&**self.log.storage(), &self.dir, self.log.history(), after)?;
            moved = Some(applied);
        }
        let done = cut()?;
        if g.is_none() && moved.is_some() {
            // Reopened at its moved mark; should that fail, the applier
            // tries again and reports the stall.
            match self.open_store().map(|mut s| {
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
}
