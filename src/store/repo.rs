//! One repository's state: its pack archive and the object index over it,
//! its push log, its large objects.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::archive::{Archive, PackAppend, PackRecord};
use super::frames::{PackEvent, PackParser};
use super::lfs::Lfs;
use super::{Result, StoreError};
use crate::objects::{
    IndexEntry, IndexRow, ObjType, ObjectIndex, ObjectReadStack, RebuildTriggers, OID_LEN,
};
use crate::pushlog::{Push, PushLog};

/// The piece size packs are read back from the archive in.
const ARCHIVE_PIECE: usize = 1 << 20;

/// One repository, open.
pub struct Repo {
    dir: PathBuf,
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
        if !dir.exists() {
            std::fs::create_dir_all(dir)?;
            super::sync_dir(dir)?;
        }
        let archive = Archive::open(&dir.join("archive"))?;
        let index = ObjectReadStack::open(
            &dir.join("objects.redb"),
            RebuildTriggers::default(),
            cache_bytes,
        )?;
        let pushes = PushLog::open(dir.join("pushlog"))?;
        let lfs = Lfs::open(dir, staging)?;
        let mut repo = Repo {
            dir: dir.to_owned(),
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
        if !erased.is_empty() && self.index.extents_with_rows(&erased)?.contains(&true) {
            self.drop_rows_in(&erased)?;
        }
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

    /// Drop the index rows whose data lies in one of `extents`.
    fn drop_rows_in(&mut self, extents: &[(u64, u64)]) -> Result<u64> {
        let oids = self.index.oids_in_order()?;
        let refs: Vec<&[u8]> = oids.iter().map(Vec::as_slice).collect();
        let rows = self.index.try_lookup_batch(&refs)?;
        let inside = |offset: u64| {
            extents
                .iter()
                .any(|(at, len)| offset >= *at && offset < at + len)
        };
        let doomed: std::collections::HashSet<Vec<u8>> = oids
            .iter()
            .zip(rows)
            .filter(|(_, r)| r.as_ref().is_some_and(|r| inside(r.offset)))
            .map(|(o, _)| o.clone())
            .collect();
        if doomed.is_empty() {
            return Ok(0);
        }
        Ok(self.index.retain(&|oid| !doomed.contains(oid))?)
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
        let extents = self.archive.erase_before(before)?;
        self.drop_rows_in(&extents)?;
        for rec in &self.live_packs() {
            self.reindex(rec)?;
        }
        self.pushes.retain_from(before)?;
        self.lfs.erase_before(before)?;
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
