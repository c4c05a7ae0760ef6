//! A repository's large objects: content-addressed files under `lfs/`,
//! named by the hex SHA-256 of their bytes, streamed in and out, and a
//! journal of every put and delete with the seq that did it, which is what
//! lets an erase drop exactly the objects of frames before a seq.
//!
//! Journal records are 48 bytes: `seq u64 | op u32 (1 put, 2 delete) |
//! oid [32] | crc u32` (crc over the first 44). A torn tail is cut.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::frames::{hex, LFS_OID_LEN};
use super::{Result, StoreError};
use crate::publish::sync_parent_with;
use crate::storage::{OpenMode, StdStorage, Storage, StorageFile};

const RECORD_LEN: usize = 48;
const OP_PUT: u32 = 1;
const OP_DELETE: u32 = 2;

/// One journal record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LfsOp {
    pub seq: u64,
    pub put: bool,
    pub oid: [u8; LFS_OID_LEN],
}

fn encode(op: &LfsOp) -> [u8; RECORD_LEN] {
    let mut b = [0u8; RECORD_LEN];
    b[0..8].copy_from_slice(&op.seq.to_le_bytes());
    let code = if op.put { OP_PUT } else { OP_DELETE };
    b[8..12].copy_from_slice(&code.to_le_bytes());
    b[12..44].copy_from_slice(&op.oid);
    let crc = crc32fast::hash(&b[..44]);
    b[44..48].copy_from_slice(&crc.to_le_bytes());
    b
}

fn decode(b: &[u8]) -> Option<LfsOp> {
    let mut c = [0u8; 4];
    c.copy_from_slice(&b[44..48]);
    if crc32fast::hash(&b[..44]) != u32::from_le_bytes(c) {
        return None;
    }
    let mut s = [0u8; 8];
    s.copy_from_slice(&b[0..8]);
    let mut o = [0u8; 4];
    o.copy_from_slice(&b[8..12]);
    let put = match u32::from_le_bytes(o) {
        OP_PUT => true,
        OP_DELETE => false,
        _ => return None,
    };
    let mut oid = [0u8; LFS_OID_LEN];
    oid.copy_from_slice(&b[12..44]);
    Some(LfsOp {
        seq: u64::from_le_bytes(s),
        put,
        oid,
    })
}

/// The large objects of one repository.
#[derive(Debug)]
pub struct Lfs {
    dir: PathBuf,
    /// The store's tmp directory, where puts and journal rewrites are
    /// staged: on the same file system, and out of reach of every name.
    staging: PathBuf,
    fs: Arc<dyn Storage>,
    journal: Arc<dyn StorageFile>,
    journal_path: PathBuf,
    ops: Vec<LfsOp>,
}

impl Lfs {
    /// Open or create the objects of the repository at `repo_dir`, staging
    /// files in `staging` (which the store empties at its open, so partial
    /// puts a crash left behind are gone).
    pub fn open(repo_dir: &Path, staging: &Path) -> Result<Lfs> {
        Self::open_with(StdStorage::shared(), repo_dir, staging)
    }

    /// [`Lfs::open`] through `fs`.
    pub fn open_with(fs: Arc<dyn Storage>, repo_dir: &Path, staging: &Path) -> Result<Lfs> {
        let dir = repo_dir.join("lfs");
        if !fs.exists(&dir)? {
            fs.create_dir_all(&dir)?;
            sync_parent_with(&*fs, &dir)?;
        }
        let journal_path = repo_dir.join("lfs.journal");
        let created = !fs.exists(&journal_path)?;
        let journal = fs.open(&journal_path, OpenMode::Create)?;
        if created {
            // The journal is what an erase reads to find the objects to
            // delete: its name must outlive a power cut as the objects do.
            sync_parent_with(&*fs, &journal_path)?;
        }
        let mut bytes = vec![0; journal.len()? as usize];
        journal.read_exact_at(&mut bytes, 0)?;
        let mut ops = Vec::new();
        for rec in bytes.chunks_exact(RECORD_LEN) {
            match decode(rec) {
                Some(op) => ops.push(op),
                None => break,
            }
        }
        let good = (ops.len() * RECORD_LEN) as u64;
        if good < bytes.len() as u64 {
            tracing::warn!(path = %journal_path.display(), cut = bytes.len() as u64 - good,
                "lfs journal: cutting a torn tail");
            journal.set_len(good)?;
            journal.sync_all()?;
        }
        Ok(Lfs {
            dir,
            staging: staging.to_owned(),
            fs,
            journal,
            journal_path,
            ops,
        })
    }

    /// Make the journal, the objects' names and the staging directory
    /// durable: for a replay that finds its operation already journaled.
    pub fn sync(&self) -> Result<()> {
        self.journal.sync_all()?;
        self.fs.sync_dir(&self.dir)?;
        self.fs.sync_dir(&self.staging)?;
        Ok(())
    }

    /// The seq of the last put or delete, 0 for none.
    pub fn last_seq(&self) -> u64 {
        self.ops.last().map_or(0, |o| o.seq)
    }

    /// The file of an object.
    pub fn path_of(&self, oid: &[u8; LFS_OID_LEN]) -> PathBuf {
        self.dir.join(hex(oid))
    }

    /// Whether the object is present.
    pub fn contains(&self, oid: &[u8; LFS_OID_LEN]) -> bool {
        self.fs.exists(&self.path_of(oid)).unwrap_or(false)
    }

    /// Start a put of frame `seq`.
    pub fn begin_put(&self, seq: u64, oid: [u8; LFS_OID_LEN]) -> Result<LfsPut> {
        // A seq is one frame of the whole store: no other staged file has it.
        let tmp = self.staging.join(format!("lfs-{seq}"));
        let file = self.fs.open(&tmp, OpenMode::Create)?;
        file.set_len(0)?;
        Ok(LfsPut {
            tmp,
            file,
            written: 0,
            oid,
            seq,
            hasher: ring::digest::Context::new(&ring::digest::SHA256),
        })
    }

    /// Finish a put: the content must hash to its oid. Durable (the file,
    /// then both directories the rename touched), then journaled.
    pub fn finish_put(&mut self, put: LfsPut) -> Result<()> {
        let got = put.hasher.finish();
        if got.as_ref() != put.oid {
            let _ = self.fs.remove(&put.tmp);
            return Err(StoreError::BadFrame {
                seq: put.seq,
                why: format!(
                    "large object {} hashes to {}",
                    hex(&put.oid),
                    hex(got.as_ref())
                ),
            });
        }
        put.file.sync_all()?;
        self.fs.rename(&put.tmp, &self.path_of(&put.oid))?;
        self.fs.sync_dir(&self.dir)?;
        self.fs.sync_dir(&self.staging)?;
        self.record(LfsOp {
            seq: put.seq,
            put: true,
            oid: put.oid,
        })
    }

    /// Delete an object (absent is fine: a replay repeats deletes), then
    /// journal it. The directory is fsynced either way: an object found
    /// absent may be the removal of a try whose fsync failed.
    pub fn delete(&mut self, seq: u64, oid: [u8; LFS_OID_LEN]) -> Result<()> {
        match self.fs.remove(&self.path_of(&oid)) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e.into()),
        }
        self.fs.sync_dir(&self.dir)?;
        self.record(LfsOp {
            seq,
            put: false,
            oid,
        })
    }

    fn record(&mut self, op: LfsOp) -> Result<()> {
        let at = (self.ops.len() * RECORD_LEN) as u64;
        self.journal.write_all_at(&encode(&op), at)?;
        self.journal.sync_data()?;
        self.ops.push(op);
        Ok(())
    }

    /// Drop what frames before `before` put: the objects
    /// ([`erase_files_before`](Self::erase_files_before)), then their
    /// journal records ([`erase_journal_before`](Self::erase_journal_before)).
    /// Idempotent.
    pub fn erase_before(&mut self, before: u64) -> Result<u64> {
        let dropped = self.erase_files_before(before)?;
        self.erase_journal_before(before)?;
        Ok(dropped)
    }

    /// Delete the objects whose last operation is a put before `before`;
    /// answers how many were there. Idempotent: a repeat finds them gone.
    pub fn erase_files_before(&mut self, before: u64) -> Result<u64> {
        let mut last: BTreeMap<[u8; LFS_OID_LEN], LfsOp> = BTreeMap::new();
        for op in &self.ops {
            last.insert(op.oid, *op);
        }
        let mut dropped = 0;
        for op in last.values().filter(|o| o.put && o.seq < before) {
            match self.fs.remove(&self.path_of(&op.oid)) {
                Ok(()) => dropped += 1,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(e.into()),
            }
        }
        self.fs.sync_dir(&self.dir)?;
        Ok(dropped)
    }

    /// Rewrite the journal (a staged file, renamed over) with the records
    /// of `before` on, less the deletes of an object no put kept brought
    /// first: such a delete removed what the erase removes, or nothing, and
    /// keeping it would keep the erased object's id. Idempotent, and a
    /// store replaying the erased log, whose erased puts never came,
    /// rewrites its journal to the same records.
    pub fn erase_journal_before(&mut self, before: u64) -> Result<()> {
        let mut put = std::collections::HashSet::new();
        let kept: Vec<LfsOp> = self
            .ops
            .iter()
            .copied()
            .filter(|o| o.seq >= before)
            .filter(|o| {
                if o.put {
                    put.insert(o.oid);
                }
                o.put || put.contains(&o.oid)
            })
            .collect();
        if kept.len() == self.ops.len() {
            return Ok(());
        }
        // The repositories of one erase are rewritten one after the
        // other, each renamed away before the next is staged.
        let staged = self.staging.join(format!("lfs-journal-{before}"));
        let f = self.fs.open(&staged, OpenMode::Create)?;
        f.set_len(0)?;
        let bytes: Vec<u8> = kept.iter().flat_map(encode).collect();
        f.write_all_at(&bytes, 0)?;
        f.sync_all()?;
        self.fs.rename(&staged, &self.journal_path)?;
        sync_parent_with(&*self.fs, &self.journal_path)?;
        self.fs.sync_dir(&self.staging)?;
        self.journal = self.fs.open(&self.journal_path, OpenMode::Write)?;
        self.ops = kept;
        Ok(())
    }

    /// An object's bytes in pieces of at most `piece`, its SHA-256 checked
    /// at the end: `Ok(false)` when there is no such object. Memory is one
    /// piece.
    pub fn read(
        &self,
        oid: &[u8; LFS_OID_LEN],
        piece: usize,
        each: &mut dyn FnMut(&[u8]) -> Result<()>,
    ) -> Result<bool> {
        match self.open_object(oid)? {
            Some(object) => {
                object.read(piece, each)?;
                Ok(true)
            }
            None => Ok(false),
        }
    }

    /// An object opened for reading: once open, it reads without the
    /// store (an object is never rewritten, and a delete only unlinks it),
    /// so no lock is held while a slow reader takes its pieces.
    pub fn open_object(&self, oid: &[u8; LFS_OID_LEN]) -> Result<Option<LfsObject>> {
        let path = self.path_of(oid);
        let file = match self.fs.open(&path, OpenMode::Read) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        let len = file.len()?;
        Ok(Some(LfsObject {
            file,
            pos: 0,
            len,
            path,
            oid: *oid,
            sha: Some(ring::digest::Context::new(&ring::digest::SHA256)),
        }))
    }

    /// An object's length, when present.
    pub fn len_of(&self, oid: &[u8; LFS_OID_LEN]) -> Option<u64> {
        let file = self.fs.open(&self.path_of(oid), OpenMode::Read).ok()?;
        file.len().ok()
    }

    /// The present objects, by oid.
    pub fn list(&self) -> Result<Vec<[u8; LFS_OID_LEN]>> {
        let mut out = Vec::new();
        for name in self.fs.list(&self.dir)? {
            if let Some(oid) = super::frames::unhex::<LFS_OID_LEN>(&name) {
                out.push(oid);
            }
        }
        out.sort_unstable();
        Ok(out)
    }
}

/// A large object being written.
pub struct LfsPut {
    tmp: PathBuf,
    file: Arc<dyn StorageFile>,
    /// Bytes written so far: where the next piece goes.
    written: u64,
    oid: [u8; LFS_OID_LEN],
    seq: u64,
    hasher: ring::digest::Context,
}

impl LfsPut {
    pub fn write(&mut self, bytes: &[u8]) -> Result<()> {
        self.hasher.update(bytes);
        self.file.write_all_at(bytes, self.written)?;
        self.written += bytes.len() as u64;
        Ok(())
    }
}

/// A large object open for reading ([`Lfs::open_object`]), read a piece
/// at a time as its holder asks for each: nothing waits between two.
pub struct LfsObject {
    file: Arc<dyn StorageFile>,
    /// Where the next piece is read from.
    pos: u64,
    pub len: u64,
    path: PathBuf,
    oid: [u8; LFS_OID_LEN],
    /// Taken when the hash is checked, at the end of the file.
    sha: Option<ring::digest::Context>,
}

impl LfsObject {
    /// Its bytes in pieces of at most `piece`, its SHA-256 checked at the
    /// end. Memory is one piece.
    pub fn read(mut self, piece: usize, each: &mut dyn FnMut(&[u8]) -> Result<()>) -> Result<()> {
        let mut buf = vec![0u8; piece.max(1)];
        loop {
            match self.next_piece(&mut buf)? {
                0 => return Ok(()),
                n => each(&buf[..n])?,
            }
        }
    }

    /// Read the next bytes into `buf`, at most its length: how many; 0 at
    /// the end, once the object hashed to its name (an error otherwise).
    pub fn next_piece(&mut self, buf: &mut [u8]) -> Result<usize> {
        let Some(sha) = self.sha.as_mut() else {
            return Ok(0);
        };
        let n = self.file.read_at(buf, self.pos)?;
        self.pos += n as u64;
        if n > 0 {
            sha.update(&buf[..n]);
            return Ok(n);
        }
        let sha = self.sha.take().map(|s| s.finish());
        if sha.as_ref().map(|d| d.as_ref()) != Some(&self.oid[..]) {
            return Err(StoreError::Corrupt {
                path: self.path.clone(),
                at: 0,
                what: "a large object that does not hash to its name".into(),
            });
        }
        Ok(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::{StdStorage, Storage};
    use crate::store::frames::lfs_oid;

    fn put(l: &mut Lfs, seq: u64, content: &[u8]) -> [u8; 32] {
        let oid = lfs_oid(content);
        let mut p = l.begin_put(seq, oid).expect("begin");
        for c in content.chunks(3) {
            p.write(c).expect("write");
        }
        l.finish_put(p).expect("finish");
        oid
    }

    #[test]
    fn puts_deletes_and_erase_follow_the_journal() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut l = Lfs::open(dir.path(), dir.path()).expect("open");
        let a = put(&mut l, 2, b"early object");
        let b = put(&mut l, 4, b"late object");
        let c = put(&mut l, 5, b"deleted later");
        l.delete(6, c).expect("delete");
        assert!(l.contains(&a) && l.contains(&b) && !l.contains(&c));
        assert_eq!(l.erase_before(3).expect("erase"), 1);
        assert!(!l.contains(&a) && l.contains(&b));
        drop(l);
        let l = Lfs::open(dir.path(), dir.path()).expect("reopen");
        assert_eq!(l.last_seq(), 6);
        assert_eq!(l.list().expect("list"), vec![b]);
        assert!(l.ops.iter().all(|o| o.seq >= 3));
    }

    #[test]
    fn an_erase_keeps_no_record_naming_an_object_only_erased_frames_put() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut l = Lfs::open(dir.path(), dir.path()).expect("open");
        let empty = put(&mut l, 1, b"");
        let erased = put(&mut l, 2, b"erased object");
        let again = put(&mut l, 3, b"put again later");
        l.delete(5, erased).expect("delete");
        put(&mut l, 6, b"put again later");
        l.delete(7, again).expect("delete");
        let kept = put(&mut l, 8, b"kept");
        l.delete(9, [9u8; 32]).expect("a delete of nothing");
        l.erase_before(4).expect("erase");
        assert_eq!(l.list().expect("list"), vec![kept]);
        let journal = StdStorage.read(&l.journal_path).expect("read");
        for oid in [empty, erased, [9u8; 32]] {
            assert!(!journal.windows(32).any(|w| w == oid), "{}", hex(&oid));
        }
        let seqs: Vec<u64> = l.ops.iter().map(|o| o.seq).collect();
        assert_eq!(seqs, vec![6, 7, 8], "a delete after a kept put stays");
        l.erase_before(4).expect("a repeat");
        assert_eq!(StdStorage.read(&l.journal_path).expect("read"), journal);
    }

    #[test]
    fn a_put_that_does_not_hash_to_its_oid_is_refused_and_leaves_nothing() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut l = Lfs::open(dir.path(), dir.path()).expect("open");
        let mut p = l.begin_put(1, [7u8; 32]).expect("begin");
        p.write(b"other bytes").expect("write");
        assert!(matches!(
            l.finish_put(p),
            Err(StoreError::BadFrame { seq: 1, .. })
        ));
        assert!(l.list().expect("list").is_empty());
        assert_eq!(l.last_seq(), 0);
    }
}
