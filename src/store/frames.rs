//! What the store's frames carry: the bytes of each kind's blob and meta
//! detail, encoders for the writers and decoders for the applier.
//!
//! Every decoder checks lengths against limits before it allocates: a frame
//! is durable in the log before the store reads it, and a frame that does
//! not decode is refused by name, never skipped.

use serde::{Deserialize, Serialize};

use super::{Result, StoreError};
use crate::log::{Kind, Meta};
use crate::objects::{ObjType, OID_LEN};
use crate::pushlog::RefUpdate;

/// The largest object a pack may carry: larger content goes to LFS.
pub const MAX_OBJECT_BYTES: u64 = 256 << 20;
/// The largest control document.
pub const MAX_DOC_BYTES: u64 = 16 << 20;
/// The largest encoded RepoStore, Refs or Erase blob.
pub const MAX_SMALL_BLOB: u64 = 4 << 20;
/// An object record's header in a pack: type, oid, length.
pub const OBJECT_HEADER_LEN: usize = 1 + OID_LEN + 8;
/// The length of a large object's id (SHA-256).
pub const LFS_OID_LEN: usize = 32;

/// What a RepoStore frame does to its repository.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum RepoOp {
    Create,
    Purge,
}

/// One ref update as a Refs frame carries it: name, old, new.
pub type RefTriple = (String, Option<[u8; OID_LEN]>, Option<[u8; OID_LEN]>);

/// A Refs frame's blob: one push.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RefsBody {
    pub at_ms: u64,
    pub updates: Vec<RefTriple>,
}

/// An Erase frame's blob: erase the data frames of `repos` before `before`,
/// in the log and in the store.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EraseBody {
    pub before: u64,
    pub repos: Vec<String>,
}

/// A StoreSkip frame's blob: the store skips frame `seq` (whose payload
/// crc is `crc`) on every box where it does not apply.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SkipBody {
    pub seq: u64,
    pub crc: u32,
    /// The operator's reason, kept with the record.
    pub reason: String,
}

/// The longest reason a StoreSkip frame carries.
pub const MAX_SKIP_REASON: usize = 1024;

/// A frame ready to append: kind, encoded meta, blob.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FrameParts {
    pub kind: Kind,
    pub meta: Vec<u8>,
    pub blob: Vec<u8>,
}

fn encode_meta(repo: &str, detail: &[u8]) -> Result<Vec<u8>> {
    Ok(Meta {
        repo: repo.to_owned(),
        detail: detail.to_vec(),
    }
    .encode()?)
}

/// A RepoStore, Refs, Erase or StoreSkip blob, refused here when it is
/// larger than the applier reads ([`MAX_SMALL_BLOB`]).
fn small_blob<T: Serialize>(v: &T) -> Result<Vec<u8>> {
    let b = postcard_bytes(v)?;
    if b.len() as u64 > MAX_SMALL_BLOB {
        return Err(StoreError::TooLarge {
            what: "RepoStore, Refs or Erase blob",
            len: b.len() as u64,
            max: MAX_SMALL_BLOB,
        });
    }
    Ok(b)
}

fn postcard_bytes<T: Serialize>(v: &T) -> Result<Vec<u8>> {
    postcard::to_stdvec(v).map_err(|e| StoreError::BadFrame {
        seq: 0,
        why: format!("encoding: {e}"),
    })
}

/// The longest directory name a file system takes (`NAME_MAX` on Linux):
/// a repository's directory is one component, its name %-encoded.
pub const MAX_REPO_DIR_NAME: usize = 255;

/// Check a repository name: non-empty UTF-8 of at most 255 bytes, no NUL,
/// no `..` component, and a directory name ([`super::repo_dir_name`]) of
/// at most [`MAX_REPO_DIR_NAME`] bytes, so every name maps to one
/// directory and back on every box. A name refused here never reaches the
/// log: what the log holds must apply wherever it is replayed.
pub fn check_repo_name(name: &str) -> Result<()> {
    let bad = |why: &str| {
        Err(StoreError::BadName {
            name: name.to_owned(),
            why: why.to_owned(),
        })
    };
    if name.is_empty() || name.len() > 255 {
        return bad("a repository name has 1 to 255 bytes");
    }
    if name.contains('\0') {
        return bad("a repository name has no NUL");
    }
    if name
        .split('/')
        .any(|c| c.is_empty() || c == "." || c == "..")
    {
        return bad("a repository name has no empty, '.' or '..' component");
    }
    let dir_len = super::repo_dir_name(name).len();
    if dir_len > MAX_REPO_DIR_NAME {
        return Err(StoreError::BadName {
            name: name.to_owned(),
            why: format!(
                "its directory name (each byte outside [A-Za-z0-9._-] as %XX) has {dir_len} bytes, \
                 more than the {MAX_REPO_DIR_NAME} a file name may have"
            ),
        });
    }
    Ok(())
}

/// Check a control document's name: `[A-Za-z0-9._-]`, 1 to 128 bytes, not
/// starting with a dot.
pub fn check_doc_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 128
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(StoreError::BadName {
            name: name.to_owned(),
            why: "a document name is 1 to 128 of [A-Za-z0-9._-], not starting with '.'".into(),
        })
    }
}

/// A RepoStore frame.
pub fn repo_frame(repo: &str, op: RepoOp) -> Result<FrameParts> {
    check_repo_name(repo)?;
    Ok(FrameParts {
        kind: Kind::RepoStore,
        meta: encode_meta(repo, &[])?,
        blob: postcard_bytes(&op)?,
    })
}

/// A Refs frame: one push of `updates`.
pub fn refs_frame(repo: &str, at_ms: u64, updates: &[RefUpdate]) -> Result<FrameParts> {
    check_repo_name(repo)?;
    if updates.is_empty() {
        return Err(StoreError::BadPush("a push moves at least one ref".into()));
    }
    let body = RefsBody {
        at_ms,
        updates: updates
            .iter()
            .map(|u| (u.name.clone(), u.old, u.new))
            .collect(),
    };
    Ok(FrameParts {
        kind: Kind::Refs,
        meta: encode_meta(repo, &[])?,
        blob: small_blob(&body)?,
    })
}

/// An Erase frame.
pub fn erase_frame(before: u64, repos: &[String]) -> Result<FrameParts> {
    for r in repos {
        check_repo_name(r)?;
    }
    Ok(FrameParts {
        kind: Kind::Erase,
        meta: encode_meta("", &[])?,
        blob: small_blob(&EraseBody {
            before,
            repos: repos.to_vec(),
        })?,
    })
}

/// A StoreSkip frame: skip frame `seq` (payload crc `crc`).
pub fn skip_frame(seq: u64, crc: u32, reason: &str) -> Result<FrameParts> {
    if reason.len() > MAX_SKIP_REASON {
        return Err(StoreError::TooLarge {
            what: "skip reason",
            len: reason.len() as u64,
            max: MAX_SKIP_REASON as u64,
        });
    }
    Ok(FrameParts {
        kind: Kind::StoreSkip,
        meta: encode_meta("", &[])?,
        blob: small_blob(&SkipBody {
            seq,
            crc,
            reason: reason.to_owned(),
        })?,
    })
}

/// A DocDelete frame: delete control document `name`.
pub fn doc_delete_frame(name: &str) -> Result<FrameParts> {
    check_doc_name(name)?;
    Ok(FrameParts {
        kind: Kind::DocDelete,
        meta: encode_meta("", name.as_bytes())?,
        blob: Vec::new(),
    })
}

/// A ControlDoc frame.
pub fn doc_frame(name: &str, content: &[u8]) -> Result<FrameParts> {
    check_doc_name(name)?;
    if content.len() as u64 > MAX_DOC_BYTES {
        return Err(StoreError::TooLarge {
            what: "control document",
            len: content.len() as u64,
            max: MAX_DOC_BYTES,
        });
    }
    Ok(FrameParts {
        kind: Kind::ControlDoc,
        meta: encode_meta("", name.as_bytes())?,
        blob: content.to_vec(),
    })
}

/// The meta of an LfsPut or LfsDelete frame; an LfsPut's blob is the
/// object's bytes, streamed.
pub fn lfs_meta(repo: &str, oid: &[u8; LFS_OID_LEN]) -> Result<Vec<u8>> {
    check_repo_name(repo)?;
    encode_meta(repo, oid)
}

/// The SHA-256 that names a large object.
pub fn lfs_oid(content: &[u8]) -> [u8; LFS_OID_LEN] {
    let d = ring::digest::digest(&ring::digest::SHA256, content);
    let mut oid = [0u8; LFS_OID_LEN];
    oid.copy_from_slice(d.as_ref());
    oid
}

/// A blob of a small kind (RepoStore, Refs, Erase), decoded.
pub fn decode_small<T: for<'de> Deserialize<'de>>(seq: u64, blob: &[u8]) -> Result<T> {
    postcard::from_bytes(blob).map_err(|e| StoreError::BadFrame {
        seq,
        why: format!("blob does not decode: {e}"),
    })
}

/// git's name for a type in the object header.
pub fn type_name(t: ObjType) -> &'static str {
    match t {
        ObjType::Commit => "commit",
        ObjType::Tree => "tree",
        ObjType::Blob => "blob",
        ObjType::Tag => "tag",
    }
}

/// The type git names `name`.
pub fn type_named(name: &str) -> Option<ObjType> {
    Some(match name {
        "commit" => ObjType::Commit,
        "tree" => ObjType::Tree,
        "blob" => ObjType::Blob,
        "tag" => ObjType::Tag,
        _ => return None,
    })
}

/// The git object id of content: SHA-1 over `"<type> <len>\0"` and the
/// bytes, hashed incrementally so an object is checked as it streams.
pub struct OidHasher(ring::digest::Context);

impl OidHasher {
    pub fn new(t: ObjType, len: u64) -> OidHasher {
        let mut ctx = ring::digest::Context::new(&ring::digest::SHA1_FOR_LEGACY_USE_ONLY);
        ctx.update(format!("{} {len}\0", type_name(t)).as_bytes());
        OidHasher(ctx)
    }

    pub fn update(&mut self, data: &[u8]) {
        self.0.update(data);
    }

    pub fn finish(self) -> [u8; OID_LEN] {
        let mut oid = [0u8; OID_LEN];
        oid.copy_from_slice(self.0.finish().as_ref());
        oid
    }
}

/// The git object id of a whole object.
pub fn git_oid(t: ObjType, data: &[u8]) -> [u8; OID_LEN] {
    let mut h = OidHasher::new(t, data.len() as u64);
    h.update(data);
    h.finish()
}

/// Builds a Pack frame's blob: object records, each
/// `type u8 | oid [20] | len u64 LE | data`.
#[derive(Default)]
pub struct PackBuilder {
    bytes: Vec<u8>,
    objects: u64,
}

impl PackBuilder {
    pub fn new() -> PackBuilder {
        PackBuilder::default()
    }

    /// Add an object; its oid is computed here, so a pack never names an
    /// object by anything but its content.
    pub fn add(&mut self, t: ObjType, data: &[u8]) -> Result<[u8; OID_LEN]> {
        if data.len() as u64 > MAX_OBJECT_BYTES {
            return Err(StoreError::TooLarge {
                what: "object in a pack",
                len: data.len() as u64,
                max: MAX_OBJECT_BYTES,
            });
        }
        let oid = git_oid(t, data);
        self.bytes.push(t.as_u8());
        self.bytes.extend_from_slice(&oid);
        self.bytes
            .extend_from_slice(&(data.len() as u64).to_le_bytes());
        self.bytes.extend_from_slice(data);
        self.objects += 1;
        Ok(oid)
    }

    pub fn len(&self) -> usize {
        self.bytes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.objects == 0
    }

    pub fn objects(&self) -> u64 {
        self.objects
    }

    /// The Pack frame for repository `repo`.
    pub fn frame(self, repo: &str) -> Result<FrameParts> {
        check_repo_name(repo)?;
        Ok(FrameParts {
            kind: Kind::Pack,
            meta: encode_meta(repo, &[])?,
            blob: self.bytes,
        })
    }

    /// The blob alone.
    pub fn into_bytes(self) -> Vec<u8> {
        self.bytes
    }
}

/// One object of a pack as the parser meets it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ObjectHead {
    pub obj_type: ObjType,
    pub oid: [u8; OID_LEN],
    pub len: u64,
    /// Where the object's data starts in the pack's blob.
    pub data_at: u64,
}

/// What the parser hands over, piece by piece.
pub enum PackEvent<'a> {
    /// An object's header.
    Head(ObjectHead),
    /// Bytes of the current object's data.
    Data(&'a [u8]),
    /// The current object ended, and its content hashed to its oid.
    End(ObjectHead),
}

/// Parses a pack's blob as it streams in pieces of any size, checking every
/// object's oid against its content. Memory is one object header.
pub struct PackParser {
    pos: u64,
    head: [u8; OBJECT_HEADER_LEN],
    have: usize,
    current: Option<(ObjectHead, u64, OidHasher)>,
    objects: u64,
    seq: u64,
}

impl PackParser {
    /// A parser for the pack of frame `seq` (named in errors).
    pub fn new(seq: u64) -> PackParser {
        PackParser {
            pos: 0,
            head: [0; OBJECT_HEADER_LEN],
            have: 0,
            current: None,
            objects: 0,
            seq,
        }
    }

    fn bad(&self, why: String) -> StoreError {
        StoreError::BadFrame { seq: self.seq, why }
    }

    /// Feed the next piece; `each` sees every event in order.
    pub fn feed(
        &mut self,
        mut piece: &[u8],
        each: &mut dyn FnMut(PackEvent<'_>) -> Result<()>,
    ) -> Result<()> {
        while !piece.is_empty() {
            if let Some((head, left, hasher)) = self.current.as_mut() {
                let n = (*left).min(piece.len() as u64) as usize;
                hasher.update(&piece[..n]);
                *left -= n as u64;
                self.pos += n as u64;
                let head = *head;
                let done = *left == 0;
                each(PackEvent::Data(&piece[..n]))?;
                piece = &piece[n..];
                if done {
                    self.end_object(head, each)?;
                }
                continue;
            }
            let n = (OBJECT_HEADER_LEN - self.have).min(piece.len());
            self.head[self.have..self.have + n].copy_from_slice(&piece[..n]);
            self.have += n;
            self.pos += n as u64;
            piece = &piece[n..];
            if self.have == OBJECT_HEADER_LEN {
                self.have = 0;
                self.start_object(each)?;
            }
        }
        Ok(())
    }

    fn start_object(&mut self, each: &mut dyn FnMut(PackEvent<'_>) -> Result<()>) -> Result<()> {
        let obj_type = ObjType::from_u8(self.head[0])
            .ok_or_else(|| self.bad(format!("object type {} is not a git type", self.head[0])))?;
        let mut oid = [0u8; OID_LEN];
        oid.copy_from_slice(&self.head[1..1 + OID_LEN]);
        let mut len_b = [0u8; 8];
        len_b.copy_from_slice(&self.head[1 + OID_LEN..]);
        let len = u64::from_le_bytes(len_b);
        if len > MAX_OBJECT_BYTES {
            return Err(self.bad(format!(
                "an object of {len} bytes exceeds the pack limit of {MAX_OBJECT_BYTES}"
            )));
        }
        let head = ObjectHead {
            obj_type,
            oid,
            len,
            data_at: self.pos,
        };
        each(PackEvent::Head(head))?;
        let hasher = OidHasher::new(obj_type, len);
        if len == 0 {
            self.end_object_with(head, hasher, each)
        } else {
            self.current = Some((head, len, hasher));
            Ok(())
        }
    }

    fn end_object(
        &mut self,
        head: ObjectHead,
        each: &mut dyn FnMut(PackEvent<'_>) -> Result<()>,
    ) -> Result<()> {
        let (_, _, hasher) = self
            .current
            .take()
            .ok_or_else(|| self.bad("an object ended twice".into()))?;
        self.end_object_with(head, hasher, each)
    }

    fn end_object_with(
        &mut self,
        head: ObjectHead,
        hasher: OidHasher,
        each: &mut dyn FnMut(PackEvent<'_>) -> Result<()>,
    ) -> Result<()> {
        let got = hasher.finish();
        if got != head.oid {
            return Err(self.bad(format!("object {} hashes to {}", hex(&head.oid), hex(&got))));
        }
        self.objects += 1;
        each(PackEvent::End(head))
    }

    /// The pack ended: refused when it ends inside an object.
    pub fn finish(&self) -> Result<u64> {
        if self.have != 0 || self.current.is_some() {
            return Err(self.bad(format!(
                "the pack ends inside an object at byte {}",
                self.pos
            )));
        }
        Ok(self.objects)
    }
}

/// Lower-case hex of bytes.
pub fn hex(b: &[u8]) -> String {
    let mut s = String::with_capacity(b.len() * 2);
    for x in b {
        s.push_str(&format!("{x:02x}"));
    }
    s
}

/// Bytes of lower-case or upper-case hex, `None` when it is not hex of `N`
/// bytes.
pub fn unhex<const N: usize>(s: &str) -> Option<[u8; N]> {
    let b = s.as_bytes();
    if b.len() != N * 2 {
        return None;
    }
    let mut out = [0u8; N];
    for (i, pair) in b.chunks_exact(2).enumerate() {
        let hi = (pair[0] as char).to_digit(16)?;
        let lo = (pair[1] as char).to_digit(16)?;
        out[i] = (hi * 16 + lo) as u8;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn git_oid_matches_git() {
        // `printf 'hello\n' | git hash-object --stdin`
        assert_eq!(
            hex(&git_oid(ObjType::Blob, b"hello\n")),
            "ce013625030ba8dba906f756967f9e9ca394464a"
        );
        // The empty tree every git knows.
        assert_eq!(
            hex(&git_oid(ObjType::Tree, b"")),
            "4b825dc642cb6eb9a060e54bf8d69288fbee4904"
        );
    }

    fn parse_all(blob: &[u8], piece: usize) -> Result<Vec<(ObjectHead, Vec<u8>)>> {
        let mut p = PackParser::new(7);
        let mut out: Vec<(ObjectHead, Vec<u8>)> = Vec::new();
        let mut data = Vec::new();
        for chunk in blob.chunks(piece.max(1)) {
            p.feed(chunk, &mut |ev| {
                match ev {
                    PackEvent::Head(_) => data.clear(),
                    PackEvent::Data(d) => data.extend_from_slice(d),
                    PackEvent::End(h) => out.push((h, std::mem::take(&mut data))),
                }
                Ok(())
            })?;
        }
        p.finish()?;
        Ok(out)
    }

    #[test]
    fn packs_parse_in_pieces_of_any_size() {
        let mut b = PackBuilder::new();
        let objs: Vec<(ObjType, Vec<u8>)> = vec![
            (ObjType::Blob, b"hello\n".to_vec()),
            (ObjType::Tree, Vec::new()),
            (ObjType::Commit, vec![7u8; 1000]),
        ];
        for (t, d) in &objs {
            b.add(*t, d).expect("add");
        }
        let blob = b.into_bytes();
        for piece in [1, 2, 7, 29, 30, 64, 4096] {
            let got = parse_all(&blob, piece).expect("parse");
            assert_eq!(got.len(), 3);
            for ((h, d), (t, want)) in got.iter().zip(&objs) {
                assert_eq!(h.obj_type, *t);
                assert_eq!(d, want);
                assert_eq!(h.oid, git_oid(*t, want));
            }
        }
    }

    #[test]
    fn bad_packs_are_refused_by_name() {
        let mut b = PackBuilder::new();
        b.add(ObjType::Blob, b"abc").expect("add");
        let blob = b.into_bytes();
        // Cut anywhere inside: never parsed as whole.
        for cut in 1..blob.len() {
            assert!(parse_all(&blob[..cut], 5).is_err(), "cut at {cut}");
        }
        let mut flipped = blob.clone();
        let last = flipped.len() - 1;
        flipped[last] ^= 1;
        assert!(matches!(
            parse_all(&flipped, 64),
            Err(StoreError::BadFrame { seq: 7, .. })
        ));
        let mut bad_type = blob;
        bad_type[0] = 9;
        assert!(parse_all(&bad_type, 64).is_err());
    }

    #[test]
    fn names_are_checked() {
        assert!(check_repo_name("acme/widgets").is_ok());
        for bad in ["", "a//b", "../x", "a/./b", "x\0y"] {
            assert!(check_repo_name(bad).is_err(), "{bad:?}");
        }
        assert!(check_doc_name("policy.toml").is_ok());
        for bad in ["", ".hidden", "a/b", "a b"] {
            assert!(check_doc_name(bad).is_err(), "{bad:?}");
        }
        assert_eq!(unhex::<2>("0aFf"), Some([0x0a, 0xff]));
        assert_eq!(unhex::<2>("0aF"), None);
        assert_eq!(unhex::<1>("zz"), None);
    }
}
