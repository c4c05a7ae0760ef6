//! One repository's state: its pack archive and the object index over it,
//! its push log, its large objects.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::archive::{Archive, Extent, PackAppend, PackRecord};
use super::frames::{PackEvent, PackParser};
use super::lfs::Lfs;
use super::{Result, StoreError};
use crate::objects::{
    IndexEntry, IndexRow, ObjType, ObjectIndex, ObjectReadStack, RebuildTriggers, OID_LEN,
};
use crate::pushlog::{Push, PushLog};
use crate::storage::{StdStorage, Storage};

/// The piece size packs are read back from the archive in.
const ARCHIVE_PIECE: usize = 1 << 20;

/// The object index staged without the rows of erased packs, in the
/// store's tmp directory. One name serves every repository: they are
/// erased (and opened) one after the other, and each staged index is
/// renamed away before the next is written.
const STAGED_INDEX: &str = "objects-erase.redb";

/// A durable step of an erase ([`Repo::erase_before_with`]): what a crash
/// right after it leaves, and a replay of the Erase frame finishes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum EraseStep {
    /// The archive's erase record is durable and the erased packs' bodies
    /// are punched out.
    Archive,
    /// An object index without the erased packs' rows is staged, durable,
    /// in the store's tmp directory (only when the index held such rows).
    IndexStaged,
    /// It replaced the repository's index.
    IndexSwapped,
    /// The objects of live packs the erased packs had indexed first are
    /// indexed again.
    Reindexed,
    /// The push log holds only the pushes of `before` on.
    Pushes,
    /// The large objects only erased frames put are deleted.
    LfsFiles,
    /// The LFS journal holds only the operations of `before` on.
    LfsJournal,
}

/// One repository, open.
pub struct Repo {
    dir: PathBuf,
    /// The store's tmp directory.
    staging: PathBuf,
    archive: Archive,
    index: ObjectReadStack,
    pushes: PushLog,
    lfs: Lfs,
    /// Packs read back from the archive by the last open (a crash left
    /// them without rows).
    reread_at_open: u64,
}

/// A pack being applied: archive bytes and index rows as the blob streams.
pub struct PackApply {
    append: PackAppend,
    parser: PackParser,
    entries: Vec<IndexEntry>,
}

/// The index row of an object the parser finished, whose pack body starts
/// at `body_at` in the archive.
fn collect_entry(ev: PackEvent<'_>, body_at: u64, entries: &mut Vec<IndexEntry>) {
    if let PackEvent::End(h) = ev {
        entries.push(IndexEntry {
            oid: h.oid,
            obj_type: h.obj_type,
            offset: body_at + h.data_at,
            len: h.len,
            uncompressed: h.len,
        });
    }
}

impl Repo {
    /// Open or create the repository in `dir`, then absorb what a crash left
    /// between the archive and the index. Files are staged in `staging`, the
    /// store's tmp directory.
    pub fn open(dir: &Path, staging: &Path, cache_bytes: usize) -> Result<Repo> {
        Self::open_with(StdStorage::shared(), dir, staging, cache_bytes)
    }

    /// [`Repo::open`], every file through `fs`.
    pub fn open_with(
        fs: Arc<dyn Storage>,
        dir: &Path,
        staging: &Path,
        cache_bytes: usize,
    ) -> Result<Repo> {
        if !fs.exists(dir)? {
            fs.create_dir_all(dir)?;
            crate::publish::sync_parent_with(&*fs, dir)?;
        }
        let archive = Archive::open_with(&*fs, &dir.join("archive"))?;
        let index = ObjectReadStack::open_with(
            Arc::clone(&fs),
            &dir.join("objects.redb"),
            RebuildTriggers::default(),
            cache_bytes,
        )?;
        let pushes = PushLog::open_with(Arc::clone(&fs), dir.join("pushlog"))?;
        let lfs = Lfs::open_with(fs, dir, staging)?;
        let mut repo = Repo {
            dir: dir.to_owned(),
            staging: staging.to_owned(),
            archive,
            index,
            pushes,
            lfs,
            reread_at_open: 0,
        };
        repo.reread_at_open = repo.absorb()?;
        Ok(repo)
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Make the index agree with the archive: rows of erased packs go, and
    /// the objects of every pack without rows are indexed (those another
    /// pack indexed first stay as they are). The diff of two durable facts,
    /// so nothing can drift: see `ObjectReadStack::extents_with_rows`.
    /// Returns the packs re-read.
    fn absorb(&mut self) -> Result<u64> {
        let erased: Vec<(u64, u64)> = self
            .archive
            .packs()
            .iter()
            .filter(|p| p.erased)
            .map(PackRecord::extent)
            .collect();
        self.drop_rows_in(&erased, &mut |_| {})?;
        // A pack every object of which came earlier has no rows by design,
        // unless an erase since moved rows into it (the packs that held
        // them first are gone): only then is it part of the diff.
        let erased_some = self.archive.erased_before() > 0;
        let live: Vec<PackRecord> = self
            .live_packs()
            .into_iter()
            .filter(|p| !p.known || erased_some)
            .collect();
        let extents: Vec<(u64, u64)> = live.iter().map(PackRecord::extent).collect();
        let has = self.index.extents_with_rows(&extents)?;
        let mut reread = 0;
        for (rec, has_rows) in live.iter().zip(has) {
            if !has_rows {
                self.reindex(rec)?;
                reread += 1;
            }
        }
        Ok(reread)
    }

    /// The packs not erased that carry objects.
    fn live_packs(&self) -> Vec<PackRecord> {
        self.archive
            .packs()
            .iter()
            .filter(|p| !p.erased && p.objects > 0)
            .copied()
            .collect()
    }

    /// Index a pack already in the archive.
    fn reindex(&mut self, rec: &PackRecord) -> Result<()> {
        let mut parser = PackParser::new(rec.seq);
        let mut entries = Vec::new();
        let body_at = rec.body_at;
        self.archive.read_body(rec, ARCHIVE_PIECE, &mut |piece| {
            parser.feed(piece, &mut |ev| {
                collect_entry(ev, body_at, &mut entries);
                Ok(())
            })
        })?;
        parser.finish()?;
        self.index_new(entries)
    }

    /// Index the entries whose oids the index does not hold yet: an object
    /// pushed again is found where it was first stored.
    fn index_new(&mut self, entries: Vec<IndexEntry>) -> Result<()> {
        let fresh = self.fresh(entries)?;
        if !fresh.is_empty() {
            self.index.append(&fresh)?;
        }
        Ok(())
    }

    /// The entries whose oids the index does not hold, each once.
    fn fresh(&self, mut entries: Vec<IndexEntry>) -> Result<Vec<IndexEntry>> {
        let mut seen = std::collections::HashSet::with_capacity(entries.len());
        entries.retain(|e| seen.insert(e.oid));
        let present = {
            let oids: Vec<&[u8]> = entries.iter().map(|e| &e.oid[..]).collect();
            self.index.try_lookup_batch(&oids)?
        };
        Ok(entries
            .into_iter()
            .zip(present)
            .filter(|(_, p)| p.is_none())
            .map(|(e, _)| e)
            .collect())
    }

    /// Drop the index rows whose data lies in one of `extents`: the rows
    /// kept are written to a new index file that replaces the old one, so
    /// no byte of a dropped row stays in a free page. Nothing is written
    /// when no row lies there, which is what a repeat after the swap finds.
    fn drop_rows_in(
        &mut self,
        extents: &[(u64, u64)],
        step: &mut dyn FnMut(EraseStep),
    ) -> Result<u64> {
        if extents.is_empty() || !self.index.extents_with_rows(extents)?.contains(&true) {
            return Ok(0);
        }
        let inside = |e: &IndexEntry| {
            extents
                .iter()
                .any(|&(at, len)| e.offset >= at && e.offset - at < len)
        };
        let staged = self.staging.join(STAGED_INDEX);
        let dropped = self.index.stage_retained(&|e| !inside(e), &staged)?;
        step(EraseStep::IndexStaged);
        self.index.swap_in(&staged)?;
        step(EraseStep::IndexSwapped);
        Ok(dropped)
    }

    /// The seq of the last pack in the archive.
    pub fn last_pack_seq(&self) -> u64 {
        self.archive.last_seq()
    }

    /// Start applying the Pack frame `seq`.
    pub fn begin_pack(&self, seq: u64) -> Result<PackApply> {
        Ok(PackApply {
            append: self.archive.begin_pack(seq)?,
            parser: PackParser::new(seq),
            entries: Vec::new(),
        })
    }

    /// The pack's next piece: into the archive, through the parser.
    pub fn pack_piece(&self, p: &mut PackApply, piece: &[u8]) -> Result<()> {
        self.archive.write(&mut p.append, piece)?;
        let body_at = p.append.body_at();
        let entries = &mut p.entries;
        p.parser.feed(piece, &mut |ev| {
            collect_entry(ev, body_at, entries);
            Ok(())
        })
    }

    /// The pack is whole: durable in the archive, then indexed. Returns the
    /// objects it carried.
    pub fn finish_pack(&mut self, p: PackApply) -> Result<u64> {
        let objects = p.parser.finish()?;
        let fresh = self.fresh(p.entries)?;
        self.archive
            .finish_pack(p.append, objects, objects > 0 && fresh.is_empty())?;
        if !fresh.is_empty() {
            self.index.append(&fresh)?;
        }
        Ok(objects)
    }

    /// Append a push unless the push log already holds it, then compact
    /// the push log once it holds `compact_after` pushes (a crash inside a
    /// compaction is rolled back or finished by the push log's open, and
    /// every push stays exactly once).
    pub fn apply_push(&mut self, compact_after: usize, push: &Push) -> Result<()> {
        if self.pushes.last_seq() >= push.seq {
            // Found, and perhaps only in the page cache: see `sync`.
            self.pushes.sync()?;
            return Ok(());
        }
        self.pushes.append(push)?;
        let policy = crate::pushlog::CompactionPolicy {
            min_pushes: compact_after,
        };
        if self.pushes.compaction_due(&policy) {
            self.pushes.compact(crate::pushlog::Finish::Swap)?;
        }
        Ok(())
    }

    /// Make the archive, the push log and the large objects' journal
    /// durable. A replay that finds a frame's effect already here calls it
    /// before the store records the frame applied: a try whose fsync
    /// failed leaves its bytes readable in the page cache, not durable, and
    /// a power cut after the mark moved would lose them for good.
    pub fn sync(&self) -> Result<()> {
        self.archive.sync()?;
        self.pushes.sync()?;
        self.lfs.sync()
    }

    pub fn lfs(&self) -> &Lfs {
        &self.lfs
    }

    pub fn lfs_mut(&mut self) -> &mut Lfs {
        &mut self.lfs
    }

    /// Drop every datum frames before `before` brought: their packs (rows
    /// and bodies), pushes and large objects. Objects a later pack carried
    /// too are indexed again where that pack holds them, so the state is the
    /// one a replay of the erased log gives. Idempotent.
    pub fn erase_before(&mut self, before: u64) -> Result<()> {
        self.erase_before_with(before, &mut |_| {})
    }

    /// [`erase_before`](Self::erase_before), calling `step` after each of
    /// its durable steps: a crash test copies the store there.
    pub fn erase_before_with(
        &mut self,
        before: u64,
        step: &mut dyn FnMut(EraseStep),
    ) -> Result<()> {
        let extents = self.archive.erase_before(before)?;
        step(EraseStep::Archive);
        self.drop_rows_in(&extents, step)?;
        for rec in &self.live_packs() {
            self.reindex(rec)?;
        }
        step(EraseStep::Reindexed);
        self.pushes.retain_from(before)?;
        step(EraseStep::Pushes);
        self.lfs.erase_files_before(before)?;
        step(EraseStep::LfsFiles);
        self.lfs.erase_journal_before(before)?;
        step(EraseStep::LfsJournal);
        Ok(())
    }

    /// The current refs.
    pub fn refs(&self) -> BTreeMap<String, [u8; OID_LEN]> {
        self.pushes.refs()
    }

    /// Every push, oldest first.
    pub fn history(&self) -> Result<Vec<Push>> {
        Ok(self.pushes.history()?)
    }

    /// An object's type and bytes, its oid checked.
    /// An object's stored length, from the index alone: what reading it
    /// whole will hold.
    pub fn read_object(&self, oid: &[u8]) -> Result<Option<(ObjType, Vec<u8>)>> {
        let Some(row) = self.index.try_lookup(oid)? else {
            return Ok(None);
        };
        let data = self.archive.read_at(row.offset, row.len)?;
        if super::frames::git_oid(row.obj_type, &data)[..] != *oid {
            return Err(StoreError::Corrupt {
                path: self.archive.path().to_owned(),
                at: row.offset,
                what: format!("object {} does not hash to its id", super::frames::hex(oid)),
            });
        }
        Ok(Some((row.obj_type, data)))
    }

    /// An object opened to be read out without the store's lock (see
    /// [`GitObject::read`]); None when the repository lacks it.
    pub fn open_object(&self, oid: &[u8]) -> Result<Option<GitObject>> {
        let Some(row) = self.index.try_lookup(oid)? else {
            return Ok(None);
        };
        let mut id = [0u8; OID_LEN];
        if oid.len() != id.len() {
            return Ok(None);
        }
        id.copy_from_slice(oid);
        Ok(Some(GitObject {
            obj_type: row.obj_type,
            extent: self.archive.open_extent(row.offset, row.len)?,
            oid: id,
        }))
    }

    /// Which of `oids` the repository holds: one batched pass, and one
    /// tail read for the misses unless the projection is complete.
    pub fn have(&self, oids: &[&[u8]]) -> Result<Vec<bool>> {
        Ok(self
            .index
            .try_lookup_batch(oids)?
            .into_iter()
            .map(|r: Option<IndexRow>| r.is_some())
            .collect())
    }

    /// Every object id, in order: a full scan, for checks and tools.
    pub fn object_ids(&self) -> Result<Vec<Vec<u8>>> {
        Ok(self.index.oids_in_order()?)
    }

    /// Objects in the repository.
    pub fn objects(&self) -> usize {
        self.index.len()
    }

    /// Packs the last open read back from the archive to index them.
    pub fn reread_at_open(&self) -> u64 {
        self.reread_at_open
    }

    /// The archive's packs, for checks and reports.
    pub fn packs(&self) -> &[PackRecord] {
        self.archive.packs()
    }
}

/// A git object open for reading ([`Repo::open_object`]).
#[derive(Debug)]
pub struct GitObject {
    pub obj_type: ObjType,
    extent: Extent,
    oid: [u8; OID_LEN],
}

impl GitObject {
    pub fn len(&self) -> u64 {
        self.extent.len
    }

    pub fn is_empty(&self) -> bool {
        self.extent.len == 0
    }

    /// Its bytes in pieces of at most `piece` (see [`GitObjectReader`]).
    /// Memory is one piece.
    pub fn read(self, piece: usize, each: &mut dyn FnMut(&[u8]) -> Result<()>) -> Result<()> {
        let mut buf = vec![0u8; piece.min(self.extent.len as usize).max(1)];
        let mut reader = self.reader();
        loop {
            match reader.next_piece(&mut buf)? {
                0 => return Ok(()),
                n => each(&buf[..n])?,
            }
        }
    }

    /// Its bytes, a piece at a time as the caller asks for each.
    pub fn reader(self) -> GitObjectReader {
        let hasher = super::frames::OidHasher::new(self.obj_type, self.extent.len);
        GitObjectReader {
            object: self,
            pos: 0,
            hasher: Some(hasher),
        }
    }
}

/// A git object's bytes read a piece at a time, hashed on the way: the
/// last piece is handed out only once the object hashes to its id (an
/// erase zeroed it meanwhile, or the disk did, is an error instead).
/// Nothing waits between two pieces.
pub struct GitObjectReader {
    object: GitObject,
    pos: u64,
    /// Taken when the hash is checked.
    hasher: Option<super::frames::OidHasher>,
}

impl GitObjectReader {
    /// Read the next bytes into `buf`, at most its length: how many; 0 at
    /// the end.
    pub fn next_piece(&mut self, buf: &mut [u8]) -> Result<usize> {
        let o = &self.object;
        let n = (buf.len() as u64).min(o.extent.len - self.pos) as usize;
        o.extent.read_at(self.pos, &mut buf[..n])?;
        self.pos += n as u64;
        if let Some(h) = self.hasher.as_mut() {
            h.update(&buf[..n]);
        }
        if self.pos == o.extent.len {
            if let Some(h) = self.hasher.take() {
                if h.finish() != o.oid {
                    return Err(StoreError::Corrupt {
                        path: o.extent.path.clone(),
                        at: o.extent.offset,
                        what: format!(
                            "object {} does not hash to its id",
                            super::frames::hex(&o.oid)
                        ),
                    });
                }
            }
        }
        Ok(n)
    }
}
