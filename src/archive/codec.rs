//! How an archived object's pieces are stored: each piece compressed
//! (zstd, optional) and then sealed (AES-256-GCM, optional) on its own, so
//! a reader fetches and opens only the pieces it needs.
//!
//! Sealing uses a key of the operator's (a key file of 64 hex digits) but
//! never that key directly: every object draws a random 32-byte salt and
//! seals under HKDF-SHA256(key, salt), with the piece's number as the
//! nonce. Nonces never repeat under one key (a key is one object's, and an
//! object numbers its pieces), and a piece moved to another place or
//! another object fails to open: its number and the object's trailer are
//! the additional data.

use std::path::Path;

use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM, NONCE_LEN};
use ring::hkdf;
use ring::rand::{SecureRandom, SystemRandom};

use super::Error;

/// Bytes of an AES-256-GCM tag: what sealing adds to a piece.
pub const TAG_LEN: usize = 16;

/// The piece number the footer is sealed under: no data piece has it.
pub const FOOTER_PIECE: u64 = u64::MAX;

const HKDF_INFO: &[u8] = b"twinlog archive object v1";

/// The operator's archive keys, read from a key file: the current key,
/// which seals every new object, then older ones, which still open the
/// objects sealed under them (a key ring; one key is a ring of one). Each
/// object's trailer names the key that sealed it by its id.
#[derive(Clone)]
pub struct ArchiveKey {
    /// The current key first; never empty.
    keys: Vec<[u8; 32]>,
}

impl std::fmt::Debug for ArchiveKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ArchiveKey({} keys)", self.keys.len())
    }
}

fn random_key() -> Result<[u8; 32], Error> {
    let mut k = [0u8; 32];
    SystemRandom::new()
        .fill(&mut k)
        .map_err(|_| Error::Key("the system's random source failed".into()))?;
    Ok(k)
}

fn id_of(key: &[u8; 32]) -> [u8; 8] {
    let d = ring::digest::digest(&ring::digest::SHA256, key);
    let mut id = [0u8; 8];
    id.copy_from_slice(&d.as_ref()[..8]);
    id
}

impl ArchiveKey {
    /// A new random key.
    pub fn mint() -> Result<ArchiveKey, Error> {
        Ok(ArchiveKey {
            keys: vec![random_key()?],
        })
    }

    /// The same ring with a new random key in front: new objects are
    /// sealed under it, older ones still open.
    pub fn rotated(&self) -> Result<ArchiveKey, Error> {
        let mut keys = vec![random_key()?];
        keys.extend(self.keys.iter().copied());
        Ok(ArchiveKey { keys })
    }

    /// The ring as its file holds it: each key as 64 hex digits on a line
    /// of its own, the current one first.
    pub fn to_file_text(&self) -> String {
        let mut s = String::new();
        for k in &self.keys {
            s.extend(k.iter().map(|b| format!("{b:02x}")));
            s.push('\n');
        }
        s
    }

    /// Parse a key file's text: one key of 64 hex digits per line, the
    /// current one first; blank lines and lines starting with `#` are
    /// skipped.
    pub fn parse(text: &str) -> Result<ArchiveKey, Error> {
        let mut keys: Vec<[u8; 32]> = Vec::new();
        for (n, line) in text.lines().enumerate() {
            let t = line.trim();
            if t.is_empty() || t.starts_with('#') {
                continue;
            }
            if t.len() != 64 || !t.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(Error::Key(format!(
                    "line {}: a key is 64 hex digits (32 bytes), not {} characters",
                    n + 1,
                    t.len()
                )));
            }
            let mut k = [0u8; 32];
            for (i, out) in k.iter_mut().enumerate() {
                *out = u8::from_str_radix(&t[2 * i..2 * i + 2], 16)
                    .map_err(|e| Error::Key(format!("line {}: not hex: {e}", n + 1)))?;
            }
            if !keys.contains(&k) {
                keys.push(k);
            }
        }
        if keys.is_empty() {
            return Err(Error::Key("the key file holds no key".into()));
        }
        Ok(ArchiveKey { keys })
    }

    /// Read a key file. A file others may read is refused: the key opens
    /// every archived byte.
    pub fn load(path: &Path) -> Result<ArchiveKey, Error> {
        use std::os::unix::fs::PermissionsExt;
        let meta =
            std::fs::metadata(path).map_err(|e| Error::Key(format!("{}: {e}", path.display())))?;
        if meta.permissions().mode() & 0o077 != 0 {
            return Err(Error::Key(format!(
                "{} may be read by others (mode {:o}): chmod 600 it",
                path.display(),
                meta.permissions().mode() & 0o777
            )));
        }
        let text = std::fs::read_to_string(path)
            .map_err(|e| Error::Key(format!("{}: {e}", path.display())))?;
        ArchiveKey::parse(&text).map_err(|e| Error::Key(format!("{}: {e}", path.display())))
    }

    /// A short public name of the current key (the first 8 bytes of its
    /// SHA-256), recorded in each object it seals.
    pub fn id(&self) -> [u8; 8] {
        id_of(&self.keys[0])
    }

    /// Every key's id, the current one first.
    pub fn ids(&self) -> Vec<[u8; 8]> {
        self.keys.iter().map(id_of).collect()
    }

    /// The key of the ring whose id is `id`.
    fn by_id(&self, id: &[u8; 8]) -> Option<&[u8; 32]> {
        self.keys.iter().find(|k| id_of(k) == *id)
    }

    /// A keyed checksum of a name's parts, under the current key: an
    /// encrypted archive's object names tell nothing of the plaintext.
    pub fn name_sum(&self, parts: &[u8]) -> u32 {
        let k = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, &self.keys[0]);
        let tag = ring::hmac::sign(&k, parts);
        let b = tag.as_ref();
        u32::from_le_bytes([b[0], b[1], b[2], b[3]])
    }
}

/// What a writer does to each piece.
#[derive(Clone, Debug, Default)]
pub struct Codec {
    /// zstd level, or no compression.
    pub zstd_level: Option<i32>,
    /// Seal every piece under this key, or store them in the clear.
    pub key: Option<ArchiveKey>,
}

/// One object's sealing state: the key derived from the operator's key and
/// the object's salt.
pub struct Sealing {
    key: LessSafeKey,
}

struct OkmLen;

impl hkdf::KeyType for OkmLen {
    fn len(&self) -> usize {
        32
    }
}

impl Sealing {
    /// Sealing under the ring's current key.
    pub fn new(key: &ArchiveKey, salt: &[u8; 32]) -> Result<Sealing, Error> {
        Self::with(&key.keys[0], salt)
    }

    /// Opening under the key of the ring named `id`; None when the ring
    /// has no such key.
    pub fn for_id(
        key: &ArchiveKey,
        id: &[u8; 8],
        salt: &[u8; 32],
    ) -> Option<Result<Sealing, Error>> {
        key.by_id(id).map(|k| Self::with(k, salt))
    }

    fn with(key: &[u8; 32], salt: &[u8; 32]) -> Result<Sealing, Error> {
        let prk = hkdf::Salt::new(hkdf::HKDF_SHA256, salt).extract(key);
        let info = [HKDF_INFO];
        let okm = prk
            .expand(&info, OkmLen)
            .map_err(|_| Error::Key("key derivation failed".into()))?;
        let mut derived = [0u8; 32];
        okm.fill(&mut derived)
            .map_err(|_| Error::Key("key derivation failed".into()))?;
        let unbound = UnboundKey::new(&AES_256_GCM, &derived)
            .map_err(|_| Error::Key("AES-256-GCM refused the key".into()))?;
        Ok(Sealing {
            key: LessSafeKey::new(unbound),
        })
    }

    fn nonce(piece: u64) -> Nonce {
        let mut n = [0u8; NONCE_LEN];
        n[4..].copy_from_slice(&piece.to_be_bytes());
        Nonce::assume_unique_for_key(n)
    }

    /// Seal `buf` in place and append its tag.
    pub fn seal(&self, piece: u64, aad: &[u8], buf: &mut Vec<u8>) -> Result<(), Error> {
        self.key
            .seal_in_place_append_tag(Self::nonce(piece), Aad::from(aad), buf)
            .map_err(|_| Error::Key("sealing failed".into()))
    }

    /// Open a sealed piece in place: the plaintext is left in `buf`.
    pub fn open(&self, piece: u64, aad: &[u8], buf: &mut Vec<u8>) -> Result<(), Error> {
        let plain_len = self
            .key
            .open_in_place(Self::nonce(piece), Aad::from(aad), buf)
            .map_err(|_| Error::Unseal {
                object: String::new(),
                piece,
            })?
            .len();
        buf.truncate(plain_len);
        Ok(())
    }
}

/// Bytes as lowercase hex (a key id, as refusals show it).
pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// A fresh random salt for one object.
pub fn salt() -> Result<[u8; 32], Error> {
    let mut s = [0u8; 32];
    SystemRandom::new()
        .fill(&mut s)
        .map_err(|_| Error::Key("the system's random source failed".into()))?;
    Ok(s)
}

/// Compress a piece (or not).
pub fn compress(level: Option<i32>, plain: &[u8]) -> Result<Vec<u8>, Error> {
    match level {
        Some(l) => zstd::bulk::compress(plain, l).map_err(|e| Error::Codec(format!("zstd: {e}"))),
        None => Ok(plain.to_vec()),
    }
}

/// Decompress a piece whose plaintext is `plain_len` bytes: never more is
/// allocated, whatever the stored bytes claim.
pub fn decompress(compressed: bool, stored: Vec<u8>, plain_len: usize) -> Result<Vec<u8>, Error> {
    if !compressed {
        return Ok(stored);
    }
    let out = zstd::bulk::decompress(&stored, plain_len)
        .map_err(|e| Error::Codec(format!("zstd: {e}")))?;
    if out.len() != plain_len {
        return Err(Error::Corrupt(format!(
            "a piece decompressed to {} bytes, {plain_len} expected",
            out.len()
        )));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_text_round_trips_and_bad_text_is_refused() {
        let k = ArchiveKey::mint().unwrap();
        let back = ArchiveKey::parse(&k.to_file_text()).unwrap();
        assert_eq!(k.keys, back.keys);
        assert!(ArchiveKey::parse("abc").is_err());
        assert!(ArchiveKey::parse(&"zz".repeat(32)).is_err());
        assert!(ArchiveKey::parse("# only a comment\n\n").is_err());
        // A ring: the new key first, the old ones kept, in order.
        let r = k.rotated().unwrap().rotated().unwrap();
        let back = ArchiveKey::parse(&format!("# ring\n{}", r.to_file_text())).unwrap();
        assert_eq!(back.keys, r.keys);
        assert_eq!(back.ids().len(), 3);
        assert_eq!(back.ids()[2], k.id());
        assert_ne!(back.id(), k.id());
        assert!(Sealing::for_id(&back, &k.id(), &[0; 32]).is_some());
        assert!(Sealing::for_id(&k, &back.id(), &[0; 32]).is_none());
    }

    #[test]
    fn a_key_file_others_may_read_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("k");
        std::fs::write(&f, ArchiveKey::mint().unwrap().to_file_text()).unwrap();
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = ArchiveKey::load(&f).unwrap_err().to_string();
        assert!(e.contains("chmod 600"), "{e}");
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert!(ArchiveKey::load(&f).is_ok());
        assert!(ArchiveKey::load(&dir.path().join("missing")).is_err());
    }

    #[test]
    fn a_sealed_piece_opens_only_with_its_key_number_and_data() {
        let k = ArchiveKey::mint().unwrap();
        let salt = salt().unwrap();
        let s = Sealing::new(&k, &salt).unwrap();
        let mut buf = b"hello archive".to_vec();
        s.seal(3, b"aad", &mut buf).unwrap();
        assert!(!buf.windows(5).any(|w| w == b"hello"));
        let mut moved = buf.clone();
        assert!(matches!(
            s.open(4, b"aad", &mut moved),
            Err(Error::Unseal { piece: 4, .. })
        ));
        let mut other_data = buf.clone();
        assert!(s.open(3, b"aae", &mut other_data).is_err());
        let other_key = Sealing::new(&ArchiveKey::mint().unwrap(), &salt).unwrap();
        let mut wrong = buf.clone();
        assert!(other_key.open(3, b"aad", &mut wrong).is_err());
        s.open(3, b"aad", &mut buf).unwrap();
        assert_eq!(buf, b"hello archive");
    }

    #[test]
    fn decompression_is_bounded_by_the_declared_length() {
        let plain = vec![7u8; 100_000];
        let c = compress(Some(3), &plain).unwrap();
        assert!(c.len() < 1_000);
        assert!(decompress(true, c.clone(), 1_000).is_err());
        assert_eq!(decompress(true, c, 100_000).unwrap(), plain);
    }
}
