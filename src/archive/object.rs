//! An archived object's bytes: the pieces, a footer that lists them and
//! says what the object holds, and a fixed trailer. `docs/FORMAT.md`
//! (*Archive*) documents them.
//!
//! ```text
//! piece 0 | piece 1 | ... | piece n-1 | footer | trailer (72 bytes)
//! ```
//!
//! Writing and reading are sans-IO: the writer turns plaintext pieces into
//! stored bytes, the reader turns stored bytes back and checks them; the
//! caller moves the bytes to and from the object store (a reader needs
//! the trailer, then the footer, then only the pieces it wants).

use std::ops::Range;

use serde::{Deserialize, Serialize};

use super::codec::{self, ArchiveKey, Codec, Sealing, FOOTER_PIECE};
use super::Error;
use crate::repl::epochs::EpochStart;

pub const OBJECT_MAGIC: [u8; 8] = *b"\x89TWO\r\n\x1a\n";
/// Version 2 binds each sealed piece to the object's name (its first and
/// last frame, lineage, generation and sum); version 1 objects, bound to
/// their trailer only, are still read.
pub const OBJECT_VERSION: u32 = 2;
const OLDEST_VERSION: u32 = 1;
pub const TRAILER_LEN: usize = 72;
/// The part of the trailer every piece is bound to (magic to key id).
const BOUND_LEN: usize = 56;

pub const FLAG_ZSTD: u32 = 1;
pub const FLAG_SEALED: u32 = 2;

/// Pieces are this long but the last (plaintext bytes).
pub const PIECE_LEN: u32 = 4 << 20;
const MIN_PIECE_LEN: u32 = 4 << 10;
const MAX_PIECE_LEN: u32 = 64 << 20;
/// A footer longer than this is refused before it is fetched.
pub const MAX_FOOTER_LEN: u64 = 16 << 20;

/// Where the first frame that starts inside a piece starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FrameStart {
    pub seq: u64,
    /// Byte offset inside the piece's plaintext.
    pub offset: u32,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Piece {
    pub stored_len: u32,
    pub plain_crc: u32,
    /// Stored compressed: false for a piece zstd could not shrink, kept
    /// as it was (its reader then spends nothing on it).
    pub compressed: bool,
    /// None: the piece is inside one frame's blob.
    pub first_frame: Option<FrameStart>,
}

/// A wall-clock mark: every frame up to `seq` was durable on the box that
/// archived it by `unix_ms`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TimeMark {
    pub seq: u64,
    pub unix_ms: u64,
}

/// A sealed segment of the log, byte for byte as its file holds it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SegmentInfo {
    pub history: [u8; 16],
    pub first: u64,
    pub last: u64,
    /// The epochs that wrote its frames (those starting at or before
    /// `last`), oldest first.
    pub epochs: Vec<EpochStart>,
    /// 0 for the segment as first sealed; the sequence of the erase frame
    /// that rewrote it otherwise.
    pub generation: u64,
    pub marks: Vec<TimeMark>,
    /// The repositories whose data its frames carry (erased frames carry
    /// none): an erase of the archive rewrites only the objects that
    /// name one of its repositories.
    pub repos: Vec<String>,
}

/// A snapshot of the store at `at`: its files back to back.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotInfo {
    pub history: [u8; 16],
    pub at: u64,
    /// The payload crc of frame `at`.
    pub crc_at: u32,
    pub epochs: Vec<EpochStart>,
    pub files: Vec<SnapshotFile>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotFile {
    pub path: String,
    /// Offset in the object's plaintext.
    pub offset: u64,
    pub len: u64,
    pub crc32: u32,
}

/// How far the archive of one log reached, written by the uploader after
/// the segments it names: every frame up to `last` was archived.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeadInfo {
    pub history: [u8; 16],
    /// The epochs that wrote frames up to `last`.
    pub epochs: Vec<EpochStart>,
    /// Every frame from `first` to `last` was archived (`first`: the
    /// lowest frame of the log's first objects, 1 or a snapshot's next).
    pub first: u64,
    pub last: u64,
    /// One more at each write: an older head is a rolled-back one.
    pub generation: u64,
    /// When it was written (ms since the Unix epoch).
    pub unix_ms: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Content {
    Segment(SegmentInfo),
    Snapshot(SnapshotInfo),
    /// A head record: no pieces, its footer says it all.
    Head(HeadInfo),
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Footer {
    pub content: Content,
    pub plain_len: u64,
    pub plain_crc: u32,
    pub piece_len: u32,
    pub pieces: Vec<Piece>,
}

impl Footer {
    /// The plaintext length of piece `i`.
    pub fn piece_plain_len(&self, i: usize) -> u64 {
        let start = i as u64 * u64::from(self.piece_len);
        self.plain_len
            .saturating_sub(start)
            .min(u64::from(self.piece_len))
    }

    /// The piece holding plaintext byte `at`.
    pub fn piece_of(&self, at: u64) -> usize {
        (at / u64::from(self.piece_len)) as usize
    }
}

/// The trailer's fields.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Trailer {
    pub version: u32,
    pub flags: u32,
    pub salt: [u8; 32],
    pub key_id: [u8; 8],
    pub footer_len: u64,
    /// crc32 of the footer's stored bytes.
    pub footer_crc: u32,
    bound: [u8; BOUND_LEN],
}

fn bound_bytes(version: u32, flags: u32, salt: &[u8; 32], key_id: &[u8; 8]) -> [u8; BOUND_LEN] {
    let mut b = [0u8; BOUND_LEN];
    b[0..8].copy_from_slice(&OBJECT_MAGIC);
    b[8..12].copy_from_slice(&version.to_le_bytes());
    b[12..16].copy_from_slice(&flags.to_le_bytes());
    b[16..48].copy_from_slice(salt);
    b[48..56].copy_from_slice(key_id);
    b
}

impl Trailer {
    pub fn encode(&self) -> [u8; TRAILER_LEN] {
        let mut b = [0u8; TRAILER_LEN];
        b[..BOUND_LEN].copy_from_slice(&self.bound);
        b[56..64].copy_from_slice(&self.footer_len.to_le_bytes());
        b[64..68].copy_from_slice(&self.footer_crc.to_le_bytes());
        let crc = crc32fast::hash(&b[..68]);
        b[68..72].copy_from_slice(&crc.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8]) -> Result<Trailer, Error> {
        if b.len() != TRAILER_LEN {
            return Err(Error::Corrupt(format!(
                "a trailer is {TRAILER_LEN} bytes, not {}",
                b.len()
            )));
        }
        if b[0..8] != OBJECT_MAGIC {
            return Err(Error::Corrupt("not an archived object (magic)".into()));
        }
        let crc = u32::from_le_bytes([b[68], b[69], b[70], b[71]]);
        if crc32fast::hash(&b[..68]) != crc {
            return Err(Error::Corrupt("the trailer's crc does not match".into()));
        }
        let version = u32::from_le_bytes([b[8], b[9], b[10], b[11]]);
        if !(OLDEST_VERSION..=OBJECT_VERSION).contains(&version) {
            return Err(Error::Corrupt(format!(
                "archive object version {version}; this build reads {OLDEST_VERSION} to {OBJECT_VERSION}"
            )));
        }
        let flags = u32::from_le_bytes([b[12], b[13], b[14], b[15]]);
        if flags & !(FLAG_ZSTD | FLAG_SEALED) != 0 {
            return Err(Error::Corrupt(format!("unknown flags {flags:#x}")));
        }
        let mut salt = [0u8; 32];
        salt.copy_from_slice(&b[16..48]);
        let mut key_id = [0u8; 8];
        key_id.copy_from_slice(&b[48..56]);
        let mut footer_len = [0u8; 8];
        footer_len.copy_from_slice(&b[56..64]);
        let mut bound = [0u8; BOUND_LEN];
        bound.copy_from_slice(&b[..BOUND_LEN]);
        Ok(Trailer {
            version,
            flags,
            salt,
            key_id,
            footer_len: u64::from_le_bytes(footer_len),
            footer_crc: u32::from_le_bytes([b[64], b[65], b[66], b[67]]),
            bound,
        })
    }

    /// What each sealed piece of the object named `name` is bound to:
    /// the trailer's first bytes, and from version 2 the object's base
    /// name, so a piece or a whole object moved to another name fails to
    /// open.
    fn aad(&self, name: &str) -> Vec<u8> {
        let mut aad = self.bound.to_vec();
        if self.version >= 2 {
            aad.extend_from_slice(base_name(name).as_bytes());
        }
        aad
    }

    /// The footer's range in an object of `object_len` bytes, checked.
    pub fn footer_range(&self, object_len: u64) -> Result<Range<u64>, Error> {
        let end = object_len
            .checked_sub(TRAILER_LEN as u64)
            .ok_or_else(|| Error::Corrupt("an object shorter than its trailer".into()))?;
        if self.footer_len > MAX_FOOTER_LEN || self.footer_len > end {
            return Err(Error::Corrupt(format!(
                "a footer of {} bytes in an object of {object_len}",
                self.footer_len
            )));
        }
        Ok(end - self.footer_len..end)
    }
}

/// A drill's negative control only (feature `drill-sabotage`, and
/// `TWINLOG_DRILL_SABOTAGE=accept-unsealed` in the environment): with a
/// key, an object that is not sealed is read anyway, as builds before the
/// rule did, so anyone who can write to the bucket can substitute frames.
#[cfg(feature = "drill-sabotage")]
fn unsealed_accepted() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| {
        let on = std::env::var("TWINLOG_DRILL_SABOTAGE").is_ok_and(|v| v == "accept-unsealed");
        if on {
            tracing::error!("drill sabotage: objects that are not sealed are read under a key");
        }
        on
    })
}

/// An object's name without its prefix: what its pieces are bound to.
fn base_name(name: &str) -> &str {
    name.rsplit('/').next().unwrap_or(name)
}

/// Turns plaintext pieces into an object's stored bytes.
pub struct ObjectWriter {
    level: Option<i32>,
    sealing: Option<Sealing>,
    trailer: Trailer,
    /// The additional data every sealed piece carries.
    aad: Vec<u8>,
    piece_len: u32,
    pieces: Vec<Piece>,
    crc: crc32fast::Hasher,
    plain_len: u64,
    stored_len: u64,
}

impl ObjectWriter {
    /// A writer of the object to be stored under `name` (its key in the
    /// bucket; the prefix does not count).
    pub fn new(codec: &Codec, piece_len: u32, name: &str) -> Result<ObjectWriter, Error> {
        if !(MIN_PIECE_LEN..=MAX_PIECE_LEN).contains(&piece_len) {
            return Err(Error::Codec(format!(
                "a piece length of {piece_len} is outside {MIN_PIECE_LEN}..={MAX_PIECE_LEN}"
            )));
        }
        let mut flags = 0;
        if codec.zstd_level.is_some() {
            flags |= FLAG_ZSTD;
        }
        let (sealing, salt, key_id) = match &codec.key {
            Some(k) => {
                flags |= FLAG_SEALED;
                let salt = codec::salt()?;
                (Some(Sealing::new(k, &salt)?), salt, k.id())
            }
            None => (None, [0u8; 32], [0u8; 8]),
        };
        let trailer = Trailer {
            version: OBJECT_VERSION,
            flags,
            salt,
            key_id,
            footer_len: 0,
            footer_crc: 0,
            bound: bound_bytes(OBJECT_VERSION, flags, &salt, &key_id),
        };
        Ok(ObjectWriter {
            level: codec.zstd_level,
            sealing,
            aad: trailer.aad(name),
            trailer,
            piece_len,
            pieces: Vec::new(),
            crc: crc32fast::Hasher::new(),
            plain_len: 0,
            stored_len: 0,
        })
    }

    /// Stored bytes written so far.
    pub fn stored_len(&self) -> u64 {
        self.stored_len
    }

    /// The next piece's stored bytes. Every piece but the last is exactly
    /// `piece_len` bytes of plaintext.
    pub fn piece(
        &mut self,
        plain: &[u8],
        first_frame: Option<FrameStart>,
    ) -> Result<Vec<u8>, Error> {
        if plain.is_empty() || plain.len() > self.piece_len as usize {
            return Err(Error::Codec(format!(
                "a piece of {} bytes (1..={} allowed)",
                plain.len(),
                self.piece_len
            )));
        }
        if self.plain_len % u64::from(self.piece_len) != 0 {
            return Err(Error::Codec("a piece after a short one".into()));
        }
        self.crc.update(plain);
        let mut stored = codec::compress(self.level, plain)?;
        let compressed = self.level.is_some() && stored.len() < plain.len();
        if self.level.is_some() && !compressed {
            stored.clear();
            stored.extend_from_slice(plain);
        }
        let index = self.pieces.len() as u64;
        if let Some(s) = &self.sealing {
            s.seal(index, &self.aad, &mut stored)?;
        }
        let stored_len = u32::try_from(stored.len())
            .map_err(|_| Error::Codec("a stored piece over 4 GiB".into()))?;
        self.pieces.push(Piece {
            stored_len,
            plain_crc: crc32fast::hash(plain),
            compressed,
            first_frame,
        });
        self.plain_len += plain.len() as u64;
        self.stored_len += stored.len() as u64;
        Ok(stored)
    }

    /// The footer and the trailer: the object's last bytes.
    pub fn finish(self, content: Content) -> Result<(Vec<u8>, Footer), Error> {
        let footer = Footer {
            content,
            plain_len: self.plain_len,
            plain_crc: self.crc.finalize(),
            piece_len: self.piece_len,
            pieces: self.pieces,
        };
        let mut out =
            postcard::to_stdvec(&footer).map_err(|e| Error::Codec(format!("footer: {e}")))?;
        if let Some(s) = &self.sealing {
            s.seal(FOOTER_PIECE, &self.aad, &mut out)?;
        }
        let mut trailer = self.trailer;
        trailer.footer_len = out.len() as u64;
        trailer.footer_crc = crc32fast::hash(&out);
        out.extend_from_slice(&trailer.encode());
        Ok((out, footer))
    }
}

/// An object opened from its trailer and footer: gives each piece's range
/// and opens pieces.
pub struct ObjectReader {
    trailer: Trailer,
    /// The object's name, as refusals say it, and what its pieces are
    /// bound to.
    name: String,
    aad: Vec<u8>,
    sealing: Option<Sealing>,
    footer: Footer,
    /// Stored offset of each piece, and the footer's start last.
    offsets: Vec<u64>,
}

impl ObjectReader {
    /// Open the object stored under `name` from its trailer and footer.
    /// With a key, an object that is not sealed is refused: anyone who can
    /// write to the bucket could have put it there.
    pub fn open(
        trailer: Trailer,
        mut footer_stored: Vec<u8>,
        key: Option<&ArchiveKey>,
        object_len: u64,
        name: &str,
    ) -> Result<ObjectReader, Error> {
        let object = || name.to_owned();
        #[cfg(feature = "drill-sabotage")]
        let key = key.filter(|_| trailer.flags & FLAG_SEALED != 0 || !unsealed_accepted());
        if crc32fast::hash(&footer_stored) != trailer.footer_crc {
            return Err(Error::Corrupt("the footer does not match its crc".into()));
        }
        let aad = trailer.aad(name);
        let sealing = match (trailer.flags & FLAG_SEALED != 0, key) {
            (true, None) => return Err(Error::KeyNeeded { object: object() }),
            (true, Some(k)) => {
                let Some(s) = Sealing::for_id(k, &trailer.key_id, &trailer.salt) else {
                    let given: Vec<String> = k.ids().iter().map(|id| codec::hex(id)).collect();
                    return Err(Error::WrongKey {
                        object: object(),
                        sealed_under: codec::hex(&trailer.key_id),
                        given: given.join(", "),
                    });
                };
                let s = s?;
                s.open(FOOTER_PIECE, &aad, &mut footer_stored)
                    .map_err(|_| Error::Unseal {
                        object: object(),
                        piece: FOOTER_PIECE,
                    })?;
                Some(s)
            }
            (false, Some(_)) => {
                return Err(Error::Unsealed {
                    object: object(),
                    claims: super::names::claims(name),
                })
            }
            (false, None) => None,
        };
        let footer: Footer = postcard::from_bytes(&footer_stored)
            .map_err(|e| Error::Corrupt(format!("footer: {e}")))?;
        if !(MIN_PIECE_LEN..=MAX_PIECE_LEN).contains(&footer.piece_len) {
            return Err(Error::Corrupt(format!("piece length {}", footer.piece_len)));
        }
        let want = footer.plain_len.div_ceil(u64::from(footer.piece_len));
        if footer.pieces.len() as u64 != want {
            return Err(Error::Corrupt(format!(
                "{} pieces for {} bytes",
                footer.pieces.len(),
                footer.plain_len
            )));
        }
        let mut offsets = Vec::with_capacity(footer.pieces.len() + 1);
        let mut at = 0u64;
        for p in &footer.pieces {
            offsets.push(at);
            at += u64::from(p.stored_len);
        }
        offsets.push(at);
        if at + trailer.footer_len + TRAILER_LEN as u64 != object_len {
            return Err(Error::Corrupt(format!(
                "pieces, footer and trailer make {} bytes; the object is {object_len}",
                at + trailer.footer_len + TRAILER_LEN as u64
            )));
        }
        Ok(ObjectReader {
            trailer,
            name: name.to_owned(),
            aad,
            sealing,
            footer,
            offsets,
        })
    }

    pub fn footer(&self) -> &Footer {
        &self.footer
    }

    pub fn pieces(&self) -> usize {
        self.footer.pieces.len()
    }

    /// Stored bytes of pieces `from..to`.
    pub fn pieces_range(&self, from: usize, to: usize) -> Range<u64> {
        self.offsets[from]..self.offsets[to]
    }

    /// Open piece `i` from its stored bytes: decrypted, decompressed and
    /// checked against its crc.
    pub fn open_piece(&self, i: usize, mut stored: Vec<u8>) -> Result<Vec<u8>, Error> {
        let p = self
            .footer
            .pieces
            .get(i)
            .ok_or_else(|| Error::Corrupt(format!("no piece {i}")))?;
        if stored.len() != p.stored_len as usize {
            return Err(Error::Corrupt(format!(
                "piece {i} is {} bytes, {} expected",
                stored.len(),
                p.stored_len
            )));
        }
        if let Some(s) = &self.sealing {
            s.open(i as u64, &self.aad, &mut stored)
                .map_err(|_| Error::Unseal {
                    object: self.name.clone(),
                    piece: i as u64,
                })?;
        }
        let plain_len = self.footer.piece_plain_len(i) as usize;
        if p.compressed && self.trailer.flags & FLAG_ZSTD == 0 {
            return Err(Error::Corrupt(format!(
                "piece {i} is compressed in an object without zstd"
            )));
        }
        let plain = codec::decompress(p.compressed, stored, plain_len)?;
        if plain.len() != plain_len || crc32fast::hash(&plain) != p.plain_crc {
            return Err(Error::Corrupt(format!("piece {i} does not match its crc")));
        }
        Ok(plain)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NAME: &str = "p/segments/00000000000000000001-00000000000000000002-0000000000000007-00000000000000000000-00000000.twseg";
    const OTHER: &str = "p/segments/00000000000000000001-00000000000000000002-0000000000000007-00000000000000000009-00000000.twseg";

    fn build_as(codec: &Codec, plain: &[u8], piece_len: u32, name: &str, legacy: bool) -> Vec<u8> {
        let mut w = ObjectWriter::new(codec, piece_len, name).unwrap();
        if legacy {
            // As builds before version 2 wrote it: bound to the trailer.
            let t = &mut w.trailer;
            t.version = 1;
            t.bound = bound_bytes(1, t.flags, &t.salt, &t.key_id);
            w.aad = t.aad(name);
        }
        let mut out = Vec::new();
        for c in plain.chunks(piece_len as usize) {
            out.extend(w.piece(c, None).unwrap());
        }
        let content = Content::Segment(SegmentInfo {
            history: [1; 16],
            first: 1,
            last: 2,
            epochs: vec![],
            generation: 0,
            marks: vec![],
            repos: vec![],
        });
        let (tail, _) = w.finish(content).unwrap();
        out.extend(tail);
        out
    }

    fn build(codec: &Codec, plain: &[u8], piece_len: u32) -> Vec<u8> {
        build_as(codec, plain, piece_len, NAME, false)
    }
    fn read_as(obj: &[u8], key: Option<&ArchiveKey>, name: &str) -> Result<Vec<u8>, Error> {
        let start = obj
            .len()
            .checked_sub(TRAILER_LEN)
            .ok_or_else(|| Error::Corrupt("short".into()))?;
        let t = Trailer::decode(&obj[start..])?;
        let fr = t.footer_range(obj.len() as u64)?;
        let r = ObjectReader::open(
            t,
            obj[fr.start as usize..fr.end as usize].to_vec(),
            key,
            obj.len() as u64,
            name,
        )?;
        let mut plain = Vec::new();
        for i in 0..r.pieces() {
            let rg = r.pieces_range(i, i + 1);
            plain.extend(r.open_piece(i, obj[rg.start as usize..rg.end as usize].to_vec())?);
        }
        Ok(plain)
    }

    fn read_all(obj: &[u8], key: Option<&ArchiveKey>) -> Result<Vec<u8>, Error> {
        read_as(obj, key, NAME)
    }
    fn sample(n: usize) -> Vec<u8> {
        (0..n).map(|i| (i * 7 % 251) as u8).collect()
    }

    #[test]
    fn every_codec_round_trips() {
        let key = ArchiveKey::mint().unwrap();
        let plain = sample(20_000);
        for (level, k) in [
            (None, None),
            (Some(1), None),
            (None, Some(key.clone())),
            (Some(3), Some(key.clone())),
        ] {
            let codec = Codec {
                zstd_level: level,
                key: k.clone(),
            };
            let obj = build(&codec, &plain, 4096);
            assert_eq!(read_all(&obj, k.as_ref()).unwrap(), plain);
            if k.is_some() {
                let needle = &plain[100..132];
                assert!(!obj.windows(needle.len()).any(|w| w == needle));
                assert!(matches!(
                    read_all(&obj, None),
                    Err(Error::KeyNeeded { object }) if object == NAME
                ));
                let other = ArchiveKey::mint().unwrap();
                let wrong = read_all(&obj, Some(&other));
                assert!(
                    matches!(&wrong, Err(Error::WrongKey { object, .. }) if object == NAME),
                    "{wrong:?}"
                );
            }
        }
    }

    #[test]
    fn with_a_key_an_unsealed_object_is_refused_by_name() {
        let key = ArchiveKey::mint().unwrap();
        let plain = sample(9_000);
        let clear = build(&Codec::default(), &plain, 4096);
        let got = read_all(&clear, Some(&key));
        match &got {
            Err(Error::Unsealed { object, claims }) => {
                assert_eq!(object, NAME);
                assert!(claims.contains("frames 1 to 2"), "{claims}");
            }
            other => panic!("{other:?}"),
        }
        assert!(got.unwrap_err().to_string().contains(NAME));
        assert_eq!(read_all(&clear, None).unwrap(), plain, "no key: read");
    }

    #[test]
    fn a_sealed_object_under_another_name_does_not_open() {
        let key = ArchiveKey::mint().unwrap();
        let codec = Codec {
            zstd_level: None,
            key: Some(key.clone()),
        };
        let plain = sample(9_000);
        let obj = build(&codec, &plain, 4096);
        // The prefix is not bound: an archive copied elsewhere restores.
        let moved = NAME.replacen("p/", "elsewhere/deeper/", 1);
        assert_eq!(read_as(&obj, Some(&key), &moved).unwrap(), plain);
        let renamed = read_as(&obj, Some(&key), OTHER);
        assert!(
            matches!(&renamed, Err(Error::Unseal { object, piece: FOOTER_PIECE }) if object == OTHER),
            "{renamed:?}"
        );
        // Another object's piece does not open in this one either.
        let mut spliced = obj.clone();
        spliced[..100].copy_from_slice(&build_as(&codec, &plain, 4096, OTHER, false)[..100]);
        assert!(read_all(&spliced, Some(&key)).is_err());
        // Version 1 objects, bound to their trailer only, still open.
        let legacy = build_as(&codec, &plain, 4096, NAME, true);
        assert_eq!(read_all(&legacy, Some(&key)).unwrap(), plain);
        assert_eq!(read_as(&legacy, Some(&key), OTHER).unwrap(), plain);
    }

    #[test]
    fn any_flipped_or_cut_byte_is_refused() {
        let key = ArchiveKey::mint().unwrap();
        let plain = sample(9_000);
        for k in [None, Some(key)] {
            let codec = Codec {
                zstd_level: Some(1),
                key: k.clone(),
            };
            let obj = build(&codec, &plain, 4096);
            for at in (0..obj.len()).step_by(7) {
                let mut bad = obj.clone();
                bad[at] ^= 0x40;
                match read_all(&bad, k.as_ref()) {
                    Err(_) => {}
                    Ok(p) => assert_ne!(p, plain, "a flip at {at} went unseen"),
                }
            }
            for cut in [1, 10, TRAILER_LEN, obj.len() - 1] {
                assert!(read_all(&obj[..obj.len() - cut], k.as_ref()).is_err());
            }
        }
    }
}
