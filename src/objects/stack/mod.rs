//! [`ObjectReadStack`]: the redb tail, the Arrow projection and its search
//! tree as one index.
//!
//! Locks, in the only order they are taken:
//!
//! - `rebuilding` serializes rebuilds and `retain`, so no rebuild can swap
//!   in a snapshot taken before a `retain` removed rows;
//! - `writer` is held across every tail commit and the update of the
//!   in-memory totals that follows it, so a snapshot taken under it agrees
//!   with the totals;
//! - `projection` is written only to store a new pointer (and, in `retain`,
//!   across the commit that makes that pointer necessary).
//!
//! Readers never take `writer` or `rebuilding`: a lookup is a read lock
//! held for an `Arc` clone and one atomic load.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock};

use redb::{Database, Durability};

use crate::publish::sync_parent_with;
use crate::storage::{OpenMode, StdStorage, Storage};

use super::entry::{sorted_unique, IndexEntry, IndexRow, ObjType, TAIL_ORDINAL_BIT};
use super::one_table::OneTableFourColumns;
use super::tail::{self, TailRow, Totals, ROWS};
use super::{ObjectIndex, Result};

/// When the projection is rebuilt: thresholds on rows in the tail that the
/// projection does not hold yet. Either one tripping is enough; `None`
/// turns a threshold off.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RebuildTriggers {
    /// Un-absorbed rows, absolute: bounds the redb round trips a batch of
    /// hits can cost.
    pub max_unabsorbed_rows: Option<u64>,
    /// Un-absorbed rows as a fraction of all rows: rebuilds come at
    /// geometric intervals as a repository grows, so their total cost stays
    /// linear in its size.
    pub max_unabsorbed_fraction: Option<f64>,
}

impl Default for RebuildTriggers {
    fn default() -> RebuildTriggers {
        RebuildTriggers {
            max_unabsorbed_rows: Some(100_000),
            max_unabsorbed_fraction: Some(0.10),
        }
    }
}

impl RebuildTriggers {
    /// No automatic rebuild; [`ObjectReadStack::rebuild`] only.
    pub fn never() -> RebuildTriggers {
        RebuildTriggers {
            max_unabsorbed_rows: None,
            max_unabsorbed_fraction: None,
        }
    }
}

/// Which threshold tripped.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum RebuildReason {
    UnabsorbedRows { rows: u64, limit: u64 },
    UnabsorbedFraction { rows: u64, total: u64 },
}

/// Counters of one stack since it was opened.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StackStats {
    /// Rows in the repository (the tail).
    pub total_rows: u64,
    /// Rows the current projection holds.
    pub projection_rows: u64,
    /// Bumped by every projection swap.
    pub generation: u64,
    pub rebuilds: u64,
    /// Oids the projection missed and the tail was asked for.
    pub tail_lookups: u64,
    /// Of those, the ones the tail held (un-absorbed rows).
    pub tail_hits: u64,
    /// Misses answered as absent without asking the tail, because the
    /// projection was complete.
    pub fast_path_misses: u64,
    /// Tail reads that failed inside an infallible `ObjectIndex` method
    /// (logged; the `try_` methods return the error instead).
    pub tail_errors: u64,
}

/// A projection and how much of the tail it covers.
struct Projection<S> {
    index: S,
    rows: u64,
    generation: u64,
}

/// The tail's totals, readable without a lock.
#[derive(Default)]
struct AtomicTotals {
    rows: AtomicU64,
    sum: AtomicU64,
    types: [AtomicU64; 4],
}

impl AtomicTotals {
    /// `rows` last, so a reader that sees the new count sees the rest.
    fn store(&self, t: &Totals) {
        self.sum.store(t.sum, Ordering::Relaxed);
        for (a, v) in self.types.iter().zip(t.types) {
            a.store(v, Ordering::Relaxed);
        }
        self.rows.store(t.rows, Ordering::Release);
    }

    fn load(&self) -> Totals {
        let rows = self.rows.load(Ordering::Acquire);
        Totals {
            rows,
            sum: self.sum.load(Ordering::Relaxed),
            types: [0, 1, 2, 3].map(|i| self.types[i].load(Ordering::Relaxed)),
        }
    }
}

#[derive(Default)]
struct Counters {
    rebuilds: AtomicU64,
    tail_lookups: AtomicU64,
    tail_hits: AtomicU64,
    fast_path_misses: AtomicU64,
    tail_errors: AtomicU64,
}

fn bump(c: &AtomicU64, by: usize) {
    c.fetch_add(by as u64, Ordering::Relaxed);
}

/// A mutex guarding no data: a panic under it leaves nothing inconsistent.
fn lock(m: &Mutex<()>) -> MutexGuard<'_, ()> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Where a stack's tail lives: its file, the storage it is read and
/// written through, and its page cache.
#[derive(Clone, Debug)]
struct TailFile {
    fs: Arc<dyn Storage>,
    path: PathBuf,
    cache_bytes: usize,
}

/// The ordinal of a tail-served row: the tail bit and the arrival number.
fn tail_ordinal(arrival: u64) -> u32 {
    TAIL_ORDINAL_BIT | (arrival & u64::from(!TAIL_ORDINAL_BIT)) as u32
}

/// The read stack: search tree → Arrow columns → redb, in one object.
///
/// `S` is the Arrow layout of the projection. The stack implements
/// [`ObjectIndex`] too, so it drops into any benchmark of the layouts.
pub struct ObjectReadStack<S: ObjectIndex = OneTableFourColumns> {
    db: Database,
    /// The tail's file and page cache, `None` in memory: what
    /// [`swap_in`](Self::swap_in) replaces and reopens.
    file: Option<TailFile>,
    triggers: RebuildTriggers,
    projection: RwLock<Arc<Projection<S>>>,
    writer: Mutex<()>,
    rebuilding: Mutex<()>,
    totals: AtomicTotals,
    fast_path: AtomicBool,
    counters: Counters,
}

impl<S: ObjectIndex> ObjectReadStack<S> {
    /// Open (or create) one repository's stack at `tail_path`, warm-starting
    /// the projection from everything already in the tail.
    ///
    /// `cache_bytes` is redb's page-cache ceiling for this database, a
    /// parameter so the caller reads its configuration once; redb's stock
    /// `Database::create` would take its 1 GiB default per repository.
    pub fn open(tail_path: &Path, triggers: RebuildTriggers, cache_bytes: usize) -> Result<Self> {
        Self::open_with(StdStorage::shared(), tail_path, triggers, cache_bytes)
    }

    /// [`open`](Self::open), the tail's pages read and written through `fs`.
    pub fn open_with(
        fs: Arc<dyn Storage>,
        tail_path: &Path,
        triggers: RebuildTriggers,
        cache_bytes: usize,
    ) -> Result<Self> {
        let db = tail::open_file(&*fs, tail_path, cache_bytes)?;
        let file = TailFile {
            fs,
            path: tail_path.to_owned(),
            cache_bytes,
        };
        Self::over(db, triggers, Some(file))
    }

    /// A stack whose tail has no file behind it. The redb code path is the
    /// same, only the backend differs, so a test of this stack is a test of
    /// the durable one.
    pub fn in_memory(triggers: RebuildTriggers) -> Result<Self> {
        Self::over(tail::open_memory()?, triggers, None)
    }

    fn over(db: Database, triggers: RebuildTriggers, file: Option<TailFile>) -> Result<Self> {
        let (entries, totals) = {
            let txn = db.begin_read()?;
            let table = txn.open_table(ROWS)?;
            tail::scan(&table)?
        };
        let index = S::build(&entries)?;
        let stack = ObjectReadStack {
            db,
            file,
            triggers,
            projection: RwLock::new(Arc::new(Projection {
                index,
                rows: totals.rows,
                generation: 0,
            })),
            writer: Mutex::new(()),
            rebuilding: Mutex::new(()),
            totals: AtomicTotals::default(),
            fast_path: AtomicBool::new(true),
            counters: Counters::default(),
        };
        stack.totals.store(&totals);
        Ok(stack)
    }

    /// The name the built projection reports about itself (`S`'s name), so
    /// a caller that selected a layout can check that the selection took.
    /// Not [`ObjectIndex::name`], which is the stack's own.
    pub fn projection_name(&self) -> &'static str {
        self.view().0.index.name()
    }

    /// The current projection, and whether it covers every row.
    ///
    /// Complete means a miss in the projection is an absence. Sound because
    /// the projection is built from a scan of the tail, so its rows are a
    /// subset of the tail's, and the tail only grows outside `retain`
    /// (which holds the write lock across its commit and swap, so the count
    /// read here under the read lock belongs to the same state as the
    /// pointer) and `swap_in` (which no reader can overlap: `&mut self`):
    /// equal counts mean equal sets. An append between this check
    /// and the lookup only makes the lookup answer as of an instant earlier.
    fn view(&self) -> (Arc<Projection<S>>, bool) {
        let guard = self
            .projection
            .read()
            .unwrap_or_else(PoisonError::into_inner);
        let p = Arc::clone(&guard);
        let complete = p.rows == self.totals.rows.load(Ordering::Acquire);
        (p, complete)
    }

    /// The projection covers every row in the repository, so a projection
    /// miss need not ask the tail. A have negotiation is mostly misses, and
    /// without this each one is a redb round trip.
    pub fn projection_is_complete(&self) -> bool {
        self.view().1
    }

    /// Turn the complete-projection fast path off (every miss asks redb):
    /// for benchmarks measuring what the fast path saves.
    #[doc(hidden)]
    pub fn set_fast_path(&self, on: bool) {
        self.fast_path.store(on, Ordering::Relaxed);
    }

    /// Append objects to the tail in one durable commit (redb
    /// `Durability::Immediate`): once this returns, the rows survive a
    /// crash.
    ///
    /// Append-only is enforced, not assumed: an oid already present with
    /// the same facts is a no-op (a re-pushed pack repeats objects), one
    /// with other facts is [`Error::Conflict`](super::Error::Conflict) and
    /// nothing of the batch is written. Without that refusal a projection
    /// hit could return a superseded row.
    ///
    /// Rebuilds inline if the batch trips a threshold, and says which.
    pub fn append(&self, entries: &[IndexEntry]) -> Result<Option<RebuildReason>> {
        let batch = sorted_unique(entries)?;
        if batch.is_empty() {
            return Ok(None);
        }
        {
            let _w = lock(&self.writer);
            let added = tail::append(&self.db, &batch)?;
            if added.rows > 0 {
                let mut t = self.totals.load();
                t.rows += added.rows;
                t.sum += added.sum;
                for (a, b) in t.types.iter_mut().zip(added.types) {
                    *a += b;
                }
                self.totals.store(&t);
            }
        }
        self.maybe_rebuild()
    }

    /// Which threshold, if any, is tripped now. A pure read, so a read-only
    /// repository's maintenance tick can poll it.
    pub fn rebuild_due(&self) -> Option<RebuildReason> {
        let projected = self.view().0.rows;
        let total = self.totals.rows.load(Ordering::Acquire);
        let rows = total.saturating_sub(projected);
        if rows == 0 {
            return None;
        }
        if let Some(limit) = self.triggers.max_unabsorbed_rows {
            if rows >= limit {
                return Some(RebuildReason::UnabsorbedRows { rows, limit });
            }
        }
        if let Some(f) = self.triggers.max_unabsorbed_fraction {
            if rows as f64 >= f * total as f64 {
                return Some(RebuildReason::UnabsorbedFraction { rows, total });
            }
        }
        None
    }

    /// Rebuild if [`rebuild_due`](Self::rebuild_due) says so.
    pub fn maybe_rebuild(&self) -> Result<Option<RebuildReason>> {
        match self.rebuild_due() {
            None => Ok(None),
            Some(reason) => {
                self.rebuild_inner(true)?;
                Ok(Some(reason))
            }
        }
    }

    /// Rebuild the projection from a full ordered scan of the tail and swap
    /// it in, bumping the generation. Readers keep the old projection until
    /// the swap; the write lock is held for the pointer store only.
    pub fn rebuild(&self) -> Result<()> {
        self.rebuild_inner(false)
    }

    /// `only_if_due`: two appends that trip a threshold together rebuild
    /// once; the second finds the first's projection when it gets the lock.
    fn rebuild_inner(&self, only_if_due: bool) -> Result<()> {
        let _r = lock(&self.rebuilding);
        if only_if_due && self.rebuild_due().is_none() {
            return Ok(());
        }
        let txn = {
            let _w = lock(&self.writer);
            self.db.begin_read()?
        };
        let (entries, totals) = {
            let table = txn.open_table(ROWS)?;
            tail::scan(&table)?
        };
        drop(txn);
        let index = S::build(&entries)?;
        drop(entries);
        self.swap(index, totals.rows);
        Ok(())
    }

    fn swap(&self, index: S, rows: u64) {
        let mut guard = self
            .projection
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        let generation = guard.generation + 1;
        *guard = Arc::new(Projection {
            index,
            rows,
            generation,
        });
        drop(guard);
        bump(&self.counters.rebuilds, 1);
    }

    pub fn stats(&self) -> StackStats {
        let p = self.view().0;
        let c = &self.counters;
        StackStats {
            total_rows: self.totals.rows.load(Ordering::Acquire),
            projection_rows: p.rows,
            generation: p.generation,
            rebuilds: c.rebuilds.load(Ordering::Relaxed),
            tail_lookups: c.tail_lookups.load(Ordering::Relaxed),
            tail_hits: c.tail_hits.load(Ordering::Relaxed),
            fast_path_misses: c.fast_path_misses.load(Ordering::Relaxed),
            tail_errors: c.tail_errors.load(Ordering::Relaxed),
        }
    }

    /// Rows in the projection now; `stats().total_rows` minus this is the
    /// un-absorbed tail.
    pub fn projection_len(&self) -> usize {
        self.view().0.rows as usize
    }

    /// Every oid in the repository in oid order (which is ordinal order: the
    /// tail is keyed by the raw oid). A full scan, for a GC that has to name
    /// what is not live.
    pub fn oids_in_order(&self) -> Result<Vec<Vec<u8>>> {
        tail::oids_in_order(&self.db)
    }

    /// Which of these archive extents already have rows: `out[i]` is true
    /// iff some row's offset lies in `[offset, offset + len)` of
    /// `extents[i]`.
    ///
    /// The crash-recovery diff: a pack is un-absorbed iff its extent is in
    /// the journal and no row points into it, and both are durable facts,
    /// so the answer is derived rather than stored and cannot drift. The
    /// tail and not the projection, because the question is what survived.
    ///
    /// One ordered scan that stops once every extent has a row. Oid order
    /// is uncorrelated with packs, so with every pack absorbed it stops
    /// after a few rows per pack; it runs to the end only when some pack
    /// has no rows, which is when the caller re-resolves that pack anyway.
    /// A zero-length extent is false without looking.
    pub fn extents_with_rows(&self, extents: &[(u64, u64)]) -> Result<Vec<bool>> {
        tail::extents_with_rows(&self.db, extents)
    }

    /// Drop every row `live` rejects; answers how many went.
    ///
    /// Not append-only, for a GC that has computed reachability. The
    /// projection is rebuilt in the same call, and swapped under the write
    /// lock held across the commit: a tree that still answered for a
    /// deleted oid would be wrong, not incomplete. redb keeps the bytes of
    /// a removed row in free pages until they are reused, so the file still
    /// holds them; [`stage_retained`](Self::stage_retained) and
    /// [`swap_in`](Self::swap_in) leave none.
    pub fn retain(&self, live: &dyn Fn(&[u8]) -> bool) -> Result<u64> {
        let _r = lock(&self.rebuilding);
        let _w = lock(&self.writer);
        let mut txn = self.db.begin_write()?;
        txn.set_durability(Durability::Immediate);
        let (removed, entries, totals) = {
            let mut table = txn.open_table(ROWS)?;
            let mut removed = 0u64;
            table.retain(|oid, _| {
                let keep = live(&oid[..]);
                removed += u64::from(!keep);
                keep
            })?;
            let (entries, totals) = tail::scan(&table)?;
            (removed, entries, totals)
        };
        let index = S::build(&entries)?;
        drop(entries);
        let mut guard = self
            .projection
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        if removed > 0 {
            txn.commit()?;
        } else {
            txn.abort()?;
        }
        self.totals.store(&totals);
        let generation = guard.generation + 1;
        *guard = Arc::new(Projection {
            index,
            rows: totals.rows,
            generation,
        });
        drop(guard);
        bump(&self.counters.rebuilds, 1);
        Ok(removed)
    }

    /// Write every row `keep` accepts, with its arrival number, into a new
    /// tail file at `staged` (one that was there goes first), durable, for
    /// [`swap_in`](Self::swap_in). Answers how many rows were left out.
    ///
    /// For a removal that must leave no byte of a row in the file: redb
    /// keeps freed pages' bytes until they are reused, and its
    /// `Database::compact` too leaves copies of removed keys, so the rows
    /// kept go into a file that never held the others. An append between
    /// this and the swap would be lost with the old file: `&mut self`.
    pub fn stage_retained(
        &mut self,
        keep: &dyn Fn(&IndexEntry) -> bool,
        staged: &Path,
    ) -> Result<u64> {
        let Some(TailFile {
            fs, cache_bytes, ..
        }) = self.file.clone()
        else {
            return Err(super::Error::InMemory);
        };
        match fs.remove(staged) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e.into()),
        }
        let fresh = tail::open_file(&*fs, staged, cache_bytes)?;
        let left_out = tail::copy_retained(&self.db, &fresh, keep)?;
        // Closed before it is synced: redb writes its clean-shutdown state
        // as it closes.
        drop(fresh);
        fs.open(staged, OpenMode::Read)?.sync_all()?;
        Ok(left_out)
    }

    /// Publish a tail [`stage_retained`](Self::stage_retained) wrote: rename
    /// it over the tail's file, fsync both directories, open it and rebuild
    /// the projection from it. A crash leaves the old file or the new one.
    /// If the open fails, this stack still reads the old file's rows
    /// (unlinked), so a retry of the whole removal finds them and repeats
    /// it.
    pub fn swap_in(&mut self, staged: &Path) -> Result<()> {
        let Some(TailFile {
            fs,
            path,
            cache_bytes,
        }) = self.file.clone()
        else {
            return Err(super::Error::InMemory);
        };
        fs.rename(staged, &path)?;
        sync_parent_with(&*fs, &path)?;
        sync_parent_with(&*fs, staged)?;
        let db = tail::open_file(&*fs, &path, cache_bytes)?;
        let (entries, totals) = {
            let txn = db.begin_read()?;
            let table = txn.open_table(ROWS)?;
            tail::scan(&table)?
        };
        let index = S::build(&entries)?;
        drop(entries);
        self.db = db;
        self.totals.store(&totals);
        self.swap(index, totals.rows);
        Ok(())
    }

    /// Fill the slots of `out` the projection left empty from the tail, in
    /// one read transaction; skipped when the projection is complete.
    fn fill_from_tail<T>(
        &self,
        oids: &[&[u8]],
        out: &mut [Option<T>],
        complete: bool,
        f: impl Fn(&TailRow) -> T,
    ) -> Result<()> {
        if complete && self.fast_path.load(Ordering::Relaxed) {
            let misses = out.iter().filter(|r| r.is_none()).count();
            bump(&self.counters.fast_path_misses, misses);
            return Ok(());
        }
        let misses: Vec<usize> = (0..out.len()).filter(|&i| out[i].is_none()).collect();
        if misses.is_empty() {
            return Ok(());
        }
        bump(&self.counters.tail_lookups, misses.len());
        let rows = tail::get_many(&self.db, oids, &misses)?;
        bump(&self.counters.tail_hits, rows.len());
        for (i, r) in rows {
            out[i] = Some(f(&r));
        }
        Ok(())
    }

    /// [`ObjectIndex::lookup_batch`], with a tail error returned rather
    /// than logged.
    pub fn try_lookup_batch(&self, oids: &[&[u8]]) -> Result<Vec<Option<IndexRow>>> {
        let (p, complete) = self.view();
        let mut out = p.index.lookup_batch(oids);
        self.fill_from_tail(oids, &mut out, complete, |r| {
            r.entry.row(tail_ordinal(r.arrival))
        })?;
        Ok(out)
    }

    /// [`ObjectIndex::lookup`], with a tail error returned rather than
    /// logged.
    pub fn try_lookup(&self, oid: &[u8]) -> Result<Option<IndexRow>> {
        let (p, complete) = self.view();
        let mut out = [p.index.lookup(oid)];
        self.fill_from_tail(&[oid], &mut out, complete, |r| {
            r.entry.row(tail_ordinal(r.arrival))
        })?;
        let [row] = out;
        Ok(row)
    }

    pub fn try_ordinals_batch(&self, oids: &[&[u8]]) -> Result<Vec<Option<u32>>> {
        let (p, complete) = self.view();
        let mut out = p.index.ordinals_batch(oids);
        self.fill_from_tail(oids, &mut out, complete, |r| tail_ordinal(r.arrival))?;
        Ok(out)
    }

    pub fn try_extents_batch(&self, oids: &[&[u8]]) -> Result<Vec<Option<(u64, u64)>>> {
        let (p, complete) = self.view();
        let mut out = p.index.extents_batch(oids);
        self.fill_from_tail(oids, &mut out, complete, |r| (r.entry.offset, r.entry.len))?;
        Ok(out)
    }

    /// The infallible trait methods cannot return a tail error: it is
    /// logged and counted, and the slots the tail would have filled stay
    /// empty.
    fn or_logged<T>(&self, r: Result<Vec<Option<T>>>, n: usize) -> Vec<Option<T>> {
        r.unwrap_or_else(|e| {
            bump(&self.counters.tail_errors, 1);
            tracing::error!(error = %e, "object index: tail read failed, its slots answer absent");
            (0..n).map(|_| None).collect()
        })
    }
}

impl<S: ObjectIndex> ObjectIndex for ObjectReadStack<S> {
    /// A stack over `entries` with an in-memory tail, fully absorbed: every
    /// entry lands in redb and the projection is built from it.
    fn build(entries: &[IndexEntry]) -> Result<Self> {
        let stack = Self::in_memory(RebuildTriggers::default())?;
        stack.append(entries)?;
        if !stack.projection_is_complete() {
            stack.rebuild()?;
        }
        Ok(stack)
    }

    /// Projection first; a miss falls through to redb, which always knows.
    /// `None` means the tail said no (or the projection was complete).
    fn lookup(&self, oid: &[u8]) -> Option<IndexRow> {
        let r = self.try_lookup(oid).map(|row| vec![row]);
        self.or_logged(r, 1).pop().flatten()
    }

    /// One batched tree pass, then one redb transaction for every slot the
    /// projection left empty.
    fn lookup_batch(&self, oids: &[&[u8]]) -> Vec<Option<IndexRow>> {
        self.or_logged(self.try_lookup_batch(oids), oids.len())
    }

    /// oid → ordinal; a tail-served ordinal carries [`TAIL_ORDINAL_BIT`].
    fn ordinals_batch(&self, oids: &[&[u8]]) -> Vec<Option<u32>> {
        self.or_logged(self.try_ordinals_batch(oids), oids.len())
    }

    fn extents_batch(&self, oids: &[&[u8]]) -> Vec<Option<(u64, u64)>> {
        self.or_logged(self.try_extents_batch(oids), oids.len())
    }

    /// Over the whole repository without a scan: running totals of the
    /// tail, kept under the writer lock. Exact because a row never changes
    /// its bytes once written.
    fn sum_uncompressed(&self) -> u64 {
        self.totals.load().sum
    }

    fn count_type(&self, t: ObjType) -> usize {
        self.totals.load().types[t.slot()] as usize
    }

    /// Objects in the repository, not in the projection: what `lookup`
    /// resolves. [`projection_len`](Self::projection_len) is the other.
    fn len(&self) -> usize {
        self.totals.rows.load(Ordering::Acquire) as usize
    }

    /// The projection's bytes; the tail is on disk or in redb's own cache
    /// and counting it would make the number incomparable with the layouts.
    fn resident_bytes(&self) -> usize {
        self.view().0.index.resident_bytes()
    }

    fn name(&self) -> &'static str {
        "ObjectReadStack"
    }

    fn ipc_bytes(&self) -> usize {
        self.view().0.index.ipc_bytes()
    }
}

#[cfg(test)]
mod tests;
