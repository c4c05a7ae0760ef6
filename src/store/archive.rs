//! A repository's pack archive: the objects of every Pack frame applied,
//! appended as records, the journal the object index is a projection of.
//!
//! `magic [8] | version u32 | 0 u32`, then records, each a 40-byte header
//! (`seq u64 | body_len u64 | objects u64 | body_crc u32 | kind u32 |
//! header_crc u32 | 0 u32`, the header crc over its first 32 bytes) and a
//! body. A pack record's body is the Pack frame's blob as it was in the log;
//! an erase record's body is `before u64`: every pack record before it with
//! a smaller seq is erased, its body punched out. Erase is an append, so no
//! byte of a record is ever rewritten and a torn write can only be the tail.
//! Layout in docs/FORMAT.md.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::{Result, StoreError};
use crate::publish::sync_parent_with;
use crate::storage::{write_zeros, OpenMode, StdStorage, Storage, StorageFile};

/// The first bytes of an archive.
pub const ARCHIVE_MAGIC: [u8; 8] = *b"\x89TWP\r\n\x1a\n";
/// The archive format's version.
pub const ARCHIVE_VERSION: u32 = 1;
/// The file header's length.
pub const ARCHIVE_HEADER_LEN: u64 = 16;
/// A record header's length.
pub const RECORD_HEADER_LEN: u64 = 40;
/// A record of a Pack frame's objects.
pub const RECORD_PACK: u32 = 1;
/// A record that erases the pack records before a seq.
pub const RECORD_ERASE: u32 = 2;
/// A record of a Pack frame every object of which the index already held
/// from an earlier pack when it was appended: it has no rows of its own,
/// and that is no sign of a crash.
pub const RECORD_PACK_KNOWN: u32 = 3;

/// A pack in the archive.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PackRecord {
    /// The frame that carried it.
    pub seq: u64,
    /// Where its body (the frame's blob) starts in the file.
    pub body_at: u64,
    pub body_len: u64,
    pub objects: u64,
    pub body_crc: u32,
    /// Erased by a later erase record: its body is punched.
    pub erased: bool,
    /// Every object was indexed from an earlier pack when it came.
    pub known: bool,
}

impl PackRecord {
    /// The extent, `(at, len)` as half-open `[at, at + len)`, holding the
    /// offset of every index row of its objects. A row names where its
    /// object's data starts, after the object's header: a zero-length
    /// object closing the pack starts at the body's end, and nothing
    /// starts at its first byte. So the body's range moved up one byte,
    /// which no other pack's row can fall in (a record header lies
    /// between two bodies).
    pub fn extent(&self) -> (u64, u64) {
        (self.body_at + 1, self.body_len)
    }
}

/// One repository's archive file, open for appends and reads.
#[derive(Debug)]
pub struct Archive {
    path: PathBuf,
    file: Arc<dyn StorageFile>,
    len: u64,
    packs: Vec<PackRecord>,
    /// The largest `before` of the erase records.
    erased_before: u64,
}

fn encode_header(seq: u64, body_len: u64, objects: u64, body_crc: u32, kind: u32) -> [u8; 40] {
    let mut h = [0u8; RECORD_HEADER_LEN as usize];
    h[0..8].copy_from_slice(&seq.to_le_bytes());
    h[8..16].copy_from_slice(&body_len.to_le_bytes());
    h[16..24].copy_from_slice(&objects.to_le_bytes());
    h[24..28].copy_from_slice(&body_crc.to_le_bytes());
    h[28..32].copy_from_slice(&kind.to_le_bytes());
    let crc = crc32fast::hash(&h[..32]);
    h[32..36].copy_from_slice(&crc.to_le_bytes());
    h
}

fn le64(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[..8]);
    u64::from_le_bytes(a)
}

fn le32(b: &[u8]) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[..4]);
    u32::from_le_bytes(a)
}

/// A decoded record header; `None` when it is no whole header.
fn decode_header(h: &[u8; 40]) -> Option<(u64, u64, u64, u32, u32)> {
    if crc32fast::hash(&h[..32]) != le32(&h[32..36]) || le32(&h[36..40]) != 0 {
        return None;
    }
    Some((
        le64(&h[0..8]),
        le64(&h[8..16]),
        le64(&h[16..24]),
        le32(&h[24..28]),
        le32(&h[28..32]),
    ))
}

/// The offset of the first whole record header at or after `from`, if
/// any: what tells damage in place from a torn tail. Reads in pieces; the
/// zero field at the header's end filters before the crc is computed.
fn next_whole_header(file: &dyn StorageFile, from: u64, file_len: u64) -> Result<Option<u64>> {
    const PIECE: usize = 1 << 20;
    let hl = RECORD_HEADER_LEN as usize;
    let mut buf = vec![0u8; PIECE + hl];
    let mut at = from;
    while at + RECORD_HEADER_LEN <= file_len {
        let n = ((file_len - at) as usize).min(PIECE + hl);
        file.read_exact_at(&mut buf[..n], at)?;
        let mut h = [0u8; 40];
        for i in 0..=n - hl {
            if buf[i + 36..i + 40] == [0; 4] {
                h.copy_from_slice(&buf[i..i + hl]);
                if let Some((_, body_len, _, _, _)) = decode_header(&h) {
                    let body_at = at + (i + hl) as u64;
                    if body_len <= file_len - body_at {
                        return Ok(Some(at + i as u64));
                    }
                }
            }
        }
        at += (n - hl + 1) as u64;
    }
    Ok(None)
}

impl Archive {
    /// Open or create the archive at `path`. A torn last record (a header
    /// that does not check, a body past the end or whose crc fails) is cut
    /// and said so; damage anywhere else is [`StoreError::Corrupt`].
    pub fn open(path: &Path) -> Result<Archive> {
        Self::open_with(&StdStorage, path)
    }

    /// [`Archive::open`] through `fs`.
    pub fn open_with(fs: &dyn Storage, path: &Path) -> Result<Archive> {
        let created = !fs.exists(path)?;
        let file = fs.open(path, OpenMode::Create)?;
        let corrupt = |at: u64, what: String| StoreError::Corrupt {
            path: path.to_owned(),
            at,
            what,
        };
        if created || file.len()? < ARCHIVE_HEADER_LEN {
            let mut h = [0u8; ARCHIVE_HEADER_LEN as usize];
            h[..8].copy_from_slice(&ARCHIVE_MAGIC);
            h[8..12].copy_from_slice(&ARCHIVE_VERSION.to_le_bytes());
            file.set_len(0)?;
            file.write_all_at(&h, 0)?;
            file.sync_all()?;
            sync_parent_with(fs, path)?;
        }
        let mut h = [0u8; ARCHIVE_HEADER_LEN as usize];
        file.read_exact_at(&mut h, 0)?;
        if h[..8] != ARCHIVE_MAGIC {
            return Err(corrupt(0, "not a pack archive (magic)".into()));
        }
        if le32(&h[8..12]) != ARCHIVE_VERSION {
            return Err(corrupt(8, format!("archive version {}", le32(&h[8..12]))));
        }
        let file_len = file.len()?;
        let mut at = ARCHIVE_HEADER_LEN;
        let mut packs: Vec<PackRecord> = Vec::new();
        let mut erased_before = 0;
        // Where the last whole record starts and its header, for the body
        // check of the one record a crash can have torn.
        let mut last: Option<(u64, u64, u32, u32)> = None;
        while at + RECORD_HEADER_LEN <= file_len {
            let mut hb = [0u8; RECORD_HEADER_LEN as usize];
            file.read_exact_at(&mut hb, at)?;
            let Some((seq, body_len, objects, body_crc, kind)) = decode_header(&hb) else {
                // A torn append leaves nothing whole after it; a whole
                // record further on means this one was damaged in place,
                // and cutting here would drop it and every one after.
                if let Some(next) = next_whole_header(&*file, at + 1, file_len)? {
                    return Err(corrupt(
                        at,
                        format!(
                            "a record header that does not check, with a whole record after it at {next}"
                        ),
                    ));
                }
                break;
            };
            let body_at = at + RECORD_HEADER_LEN;
            if body_len > file_len - body_at {
                break;
            }
            match kind {
                RECORD_PACK | RECORD_PACK_KNOWN => {
                    if packs.last().is_some_and(|p| p.seq >= seq) {
                        return Err(corrupt(at, format!("pack of seq {seq} out of order")));
                    }
                    packs.push(PackRecord {
                        seq,
                        body_at,
                        body_len,
                        objects,
                        body_crc,
                        erased: false,
                        known: kind == RECORD_PACK_KNOWN,
                    });
                }
                RECORD_ERASE if body_len == 8 => {
                    let mut b = [0u8; 8];
                    file.read_exact_at(&mut b, body_at)?;
                    if crc32fast::hash(&b) != body_crc {
                        break;
                    }
                    let before = u64::from_le_bytes(b);
                    erased_before = erased_before.max(before);
                    for p in packs.iter_mut().filter(|p| p.seq < before) {
                        p.erased = true;
                    }
                }
                _ => return Err(corrupt(at, format!("record kind {kind}"))),
            }
            last = Some((at, body_len, body_crc, kind));
            at = body_at + body_len;
        }
        // Only the last record can be torn: every append syncs before the
        // next one starts.
        if let Some((rec_at, body_len, body_crc, RECORD_PACK | RECORD_PACK_KNOWN)) = last {
            let torn = crc_of(&*file, rec_at + RECORD_HEADER_LEN, body_len)? != body_crc;
            if torn && !packs.last().is_some_and(|p| p.erased) {
                packs.pop();
                at = rec_at;
            }
        }
        if at < file_len {
            tracing::warn!(path = %path.display(), kept = at, cut = file_len - at,
                "pack archive: cutting a torn tail");
            file.set_len(at)?;
            file.sync_all()?;
        }
        Ok(Archive {
            path: path.to_owned(),
            file,
            len: at,
            packs,
            erased_before,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Every pack record, oldest first.
    pub fn packs(&self) -> &[PackRecord] {
        &self.packs
    }

    /// The seq of the last pack appended, 0 for none.
    pub fn last_seq(&self) -> u64 {
        self.packs.last().map_or(0, |p| p.seq)
    }

    /// The largest `before` an erase record named.
    pub fn erased_before(&self) -> u64 {
        self.erased_before
    }

    /// Start appending the pack of frame `seq`.
    pub fn begin_pack(&self, seq: u64) -> Result<PackAppend> {
        if seq <= self.last_seq() {
            return Err(StoreError::Corrupt {
                path: self.path.clone(),
                at: self.len,
                what: format!("pack {seq} after pack {}", self.last_seq()),
            });
        }
        Ok(PackAppend {
            seq,
            body_at: self.len + RECORD_HEADER_LEN,
            written: 0,
            crc: crc32fast::Hasher::new(),
        })
    }

    /// Write the pack's next bytes.
    pub fn write(&self, pack: &mut PackAppend, bytes: &[u8]) -> Result<()> {
        self.file.write_all_at(bytes, pack.body_at + pack.written)?;
        pack.crc.update(bytes);
        pack.written += bytes.len() as u64;
        Ok(())
    }

    /// Write the record's header and make the record durable. `known`:
    /// the index held every object already.
    pub fn finish_pack(
        &mut self,
        pack: PackAppend,
        objects: u64,
        known: bool,
    ) -> Result<PackRecord> {
        let body_crc = pack.crc.finalize();
        let at = pack.body_at - RECORD_HEADER_LEN;
        let kind = if known {
            RECORD_PACK_KNOWN
        } else {
            RECORD_PACK
        };
        let h = encode_header(pack.seq, pack.written, objects, body_crc, kind);
        self.file.write_all_at(&h, at)?;
        self.file.sync_data()?;
        let rec = PackRecord {
            seq: pack.seq,
            body_at: pack.body_at,
            body_len: pack.written,
            objects,
            body_crc,
            erased: false,
            known,
        };
        self.len = pack.body_at + pack.written;
        self.packs.push(rec);
        Ok(rec)
    }

    /// Erase every pack record of a seq before `before`: an erase record,
    /// durable, then the bodies punched and synced. Returns the extents
    /// erased (those erased before included, so a repeat finishes the
    /// job a crash interrupted).
    pub fn erase_before(&mut self, before: u64) -> Result<Vec<(u64, u64)>> {
        if before > self.erased_before {
            let body = before.to_le_bytes();
            let h = encode_header(0, 8, 0, crc32fast::hash(&body), RECORD_ERASE);
            self.file.write_all_at(&h, self.len)?;
            self.file
                .write_all_at(&body, self.len + RECORD_HEADER_LEN)?;
            self.file.sync_data()?;
            self.len += RECORD_HEADER_LEN + 8;
            self.erased_before = before;
        }
        let mut extents = Vec::new();
        for p in self.packs.iter_mut().filter(|p| p.seq < before) {
            p.erased = true;
            if p.body_len > 0 {
                punch(&*self.file, p.body_at, p.body_len)?;
            }
            extents.push(p.extent());
        }
        self.file.sync_all()?;
        Ok(extents)
    }

    /// Make every record durable: for a replay that finds its pack
    /// already here (see `Repo::sync`).
    pub fn sync(&self) -> Result<()> {
        Ok(self.file.sync_all()?)
    }

    /// Read `len` bytes at `offset` (an object's data, as its index row
    /// says).
    pub fn read_at(&self, offset: u64, len: u64) -> Result<Vec<u8>> {
        let end = offset.checked_add(len).filter(|e| *e <= self.len);
        if offset < ARCHIVE_HEADER_LEN || end.is_none() {
            return Err(StoreError::Corrupt {
                path: self.path.clone(),
                at: offset,
                what: format!("an extent of {len} bytes past the archive's {}", self.len),
            });
        }
        let mut b = vec![0u8; len as usize];
        self.file.read_exact_at(&mut b, offset)?;
        Ok(b)
    }

    /// An extent opened to be read later without the archive: the file is
    /// only ever appended to, so the bytes stay where they are (an erase
    /// zeroes a body in place, which the reader's hash check catches).
    pub fn open_extent(&self, offset: u64, len: u64) -> Result<Extent> {
        let end = offset.checked_add(len).filter(|e| *e <= self.len);
        if offset < ARCHIVE_HEADER_LEN || end.is_none() {
            return Err(StoreError::Corrupt {
                path: self.path.clone(),
                at: offset,
                what: format!("an extent of {len} bytes past the archive's {}", self.len),
            });
        }
        Ok(Extent {
            file: Arc::clone(&self.file),
            path: self.path.clone(),
            offset,
            len,
        })
    }

    /// A pack's body in pieces of at most `piece` bytes.
    pub fn read_body(
        &self,
        rec: &PackRecord,
        piece: usize,
        each: &mut dyn FnMut(&[u8]) -> Result<()>,
    ) -> Result<()> {
        let mut buf = vec![0u8; piece.min(rec.body_len as usize).max(1)];
        let mut pos = 0;
        while pos < rec.body_len {
            let n = (buf.len() as u64).min(rec.body_len - pos) as usize;
            self.file.read_exact_at(&mut buf[..n], rec.body_at + pos)?;
            each(&buf[..n])?;
            pos += n as u64;
        }
        Ok(())
    }

    /// The file's length.
    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.packs.is_empty()
    }
}

/// A pack being appended.
pub struct PackAppend {
    seq: u64,
    body_at: u64,
    written: u64,
    crc: crc32fast::Hasher,
}

impl PackAppend {
    /// Where the body starts in the file: an object at byte `x` of the
    /// frame's blob is at `body_at() + x`.
    pub fn body_at(&self) -> u64 {
        self.body_at
    }
}

fn crc_of(file: &dyn StorageFile, at: u64, len: u64) -> io::Result<u32> {
    let mut crc = crc32fast::Hasher::new();
    let mut buf = vec![0u8; (1 << 20).min(len as usize).max(1)];
    let mut pos = 0;
    while pos < len {
        let n = (buf.len() as u64).min(len - pos) as usize;
        file.read_exact_at(&mut buf[..n], at + pos)?;
        crc.update(&buf[..n]);
        pos += n as u64;
    }
    Ok(crc.finalize())
}

/// Bytes of an archive opened by [`Archive::open_extent`].
#[derive(Debug)]
pub struct Extent {
    file: Arc<dyn StorageFile>,
    pub path: PathBuf,
    pub offset: u64,
    pub len: u64,
}

impl Extent {
    /// `buf.len()` bytes from `pos` on.
    pub fn read_at(&self, pos: u64, buf: &mut [u8]) -> Result<()> {
        Ok(self.file.read_exact_at(buf, self.offset + pos)?)
    }
}

/// Deallocate a range of a store file, or zero it where the file system
/// cannot punch, whatever the reason it gives.
pub(crate) fn punch(file: &dyn StorageFile, at: u64, len: u64) -> io::Result<()> {
    match file.punch(at, len) {
        Ok(()) => Ok(()),
        Err(_) => write_zeros(file, at, len),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::write_file;

    fn append(a: &mut Archive, seq: u64, body: &[u8]) -> PackRecord {
        let mut p = a.begin_pack(seq).expect("begin");
        a.write(&mut p, body).expect("write");
        a.finish_pack(p, 1, false).expect("finish")
    }

    #[test]
    fn records_survive_reopen_and_a_torn_tail_is_cut_at_every_byte() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("archive");
        let mut a = Archive::open(&path).expect("open");
        append(&mut a, 3, b"first pack");
        let whole = a.len();
        append(&mut a, 9, b"second pack body");
        let full = StdStorage.read(&path).expect("read");
        drop(a);
        for cut in whole..full.len() as u64 {
            write_file(&StdStorage, &path, &full[..cut as usize]).expect("write");
            let a = Archive::open(&path).expect("reopen");
            assert_eq!(a.packs().len(), 1, "cut at {cut}");
            assert_eq!(a.len(), whole);
            assert_eq!(StdStorage.read(&path).expect("read").len() as u64, whole);
        }
        write_file(&StdStorage, &path, &full).expect("write");
        let mut flipped = full.clone();
        let last = flipped.len() - 1;
        flipped[last] ^= 1;
        write_file(&StdStorage, &path, &flipped).expect("write");
        assert_eq!(Archive::open(&path).expect("open").packs().len(), 1);
        write_file(&StdStorage, &path, &full).expect("write");
        let a = Archive::open(&path).expect("open");
        assert_eq!(a.last_seq(), 9);
        let p = a.packs()[1];
        assert_eq!(
            a.read_at(p.body_at, p.body_len).expect("read"),
            b"second pack body"
        );
    }

    /// A flip in a record's header with whole records after it is damage,
    /// refused by name at its offset: cutting there as if it were a torn
    /// tail would drop that pack and every one after it.
    #[test]
    fn a_damaged_header_before_the_tail_is_refused_not_cut() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("archive");
        let mut a = Archive::open(&path).expect("open");
        append(&mut a, 1, b"first");
        let second_at = a.len();
        append(&mut a, 2, b"second");
        let third_at = a.len();
        append(&mut a, 3, b"third");
        drop(a);
        let full = StdStorage.read(&path).expect("read");
        for byte in second_at..second_at + RECORD_HEADER_LEN {
            let mut bad = full.clone();
            bad[byte as usize] ^= 0x04;
            write_file(&StdStorage, &path, &bad).expect("write");
            match Archive::open(&path) {
                Err(StoreError::Corrupt { at, .. }) => assert_eq!(at, second_at, "flip at {byte}"),
                other => panic!("flip at {byte}: {:?}", other.map(|a| a.packs().len())),
            }
            assert_eq!(
                StdStorage.read(&path).expect("read"),
                bad,
                "nothing is cut: flip at {byte}"
            );
        }
        // The last record's header damaged is a torn tail, as before.
        let mut bad = full.clone();
        bad[third_at as usize + 3] ^= 0x04;
        write_file(&StdStorage, &path, &bad).expect("write");
        assert_eq!(Archive::open(&path).expect("open").packs().len(), 2);
    }

    #[test]
    fn erase_is_an_append_and_punches_the_bodies() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("archive");
        let mut a = Archive::open(&path).expect("open");
        append(&mut a, 1, b"MARKER-erased");
        append(&mut a, 5, b"kept");
        let ext = a.erase_before(5).expect("erase");
        assert_eq!(ext.len(), 1);
        drop(a);
        let raw = StdStorage.read(&path).expect("read");
        assert!(!raw.windows(6).any(|w| w == b"MARKER"));
        let a = Archive::open(&path).expect("reopen");
        assert!(a.packs()[0].erased && !a.packs()[1].erased);
        assert_eq!(a.erased_before(), 5);
        assert!(Archive::open(&dir.path().join("archive")).is_ok());
        assert!(a.begin_pack(5).is_err(), "a pack never goes behind another");
    }

    #[test]
    fn a_foreign_file_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("archive");
        write_file(&StdStorage, &path, b"definitely not an archive").expect("write");
        assert!(matches!(
            Archive::open(&path),
            Err(StoreError::Corrupt { at: 0, .. })
        ));
    }
}
