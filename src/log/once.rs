//! Frames appended once: an application frame stored as kind
//! [`Kind::Once`](super::Kind::Once), whose meta starts with the append's
//! id, the client's own name for it. A primary that finds an id in its
//! log answers a retry with the frame already there instead of writing it
//! twice; the id travels with the frame, so the twin that takes over finds
//! it too. `docs/FORMAT.md` (*Meta of twinlog kinds*) has the bytes.

use super::format::MAX_META_LEN;
use super::kind::APP_KIND_FIRST;

/// The version byte of a `Once` frame's meta.
const ONCE_VERSION: u8 = 1;
/// The bytes a `Once` frame's meta has before the application's meta:
/// version, kind, client, client sequence.
pub const ONCE_PREFIX_LEN: usize = 1 + 2 + 16 + 8;
/// The largest application meta a frame appended once may carry.
pub const MAX_ONCE_META_LEN: usize = MAX_META_LEN - ONCE_PREFIX_LEN;

/// A client's name for one of its appends: which client (16 random bytes
/// it chose), and its sequence among the client's appends.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AppendId {
    pub client: [u8; 16],
    pub seq: u64,
}

/// The stored meta of an application frame of `kind` appended once as
/// `id`. The caller checks `kind` is an application's and `meta` fits
/// [`MAX_ONCE_META_LEN`].
pub fn wrap(kind: u16, id: AppendId, meta: &[u8]) -> Vec<u8> {
    let mut b = Vec::with_capacity(ONCE_PREFIX_LEN + meta.len());
    b.push(ONCE_VERSION);
    b.extend_from_slice(&kind.to_le_bytes());
    b.extend_from_slice(&id.client);
    b.extend_from_slice(&id.seq.to_le_bytes());
    b.extend_from_slice(meta);
    b
}

/// A `Once` frame's parts: the application's kind, the append's id and
/// the application's meta. None when the meta is not one this version
/// writes (a frame of that kind but damaged meta is nobody's retry).
pub fn unwrap(meta: &[u8]) -> Option<(u16, AppendId, &[u8])> {
    if meta.len() < ONCE_PREFIX_LEN || meta[0] != ONCE_VERSION {
        return None;
    }
    let kind = u16::from_le_bytes([meta[1], meta[2]]);
    if kind < APP_KIND_FIRST {
        return None;
    }
    let mut client = [0u8; 16];
    client.copy_from_slice(&meta[3..19]);
    let mut seq = [0u8; 8];
    seq.copy_from_slice(&meta[19..27]);
    let id = AppendId {
        client,
        seq: u64::from_le_bytes(seq),
    };
    Some((kind, id, &meta[ONCE_PREFIX_LEN..]))
}

/// What a reader shows of a frame: a `Once` frame as the application
/// appended it (its kind, its meta) with its id; any other frame as it is.
pub fn as_appended(kind: u16, meta: &[u8]) -> (u16, &[u8], Option<AppendId>) {
    if kind == super::Kind::Once.as_u16() {
        if let Some((app, id, rest)) = unwrap(meta) {
            return (app, rest, Some(id));
        }
    }
    (kind, meta, None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_id_and_meta_come_back_as_wrapped() {
        let id = AppendId {
            client: [7; 16],
            seq: 0x0102_0304_0506_0708,
        };
        let stored = wrap(0x8001, id, b"app meta");
        assert_eq!(stored.len(), ONCE_PREFIX_LEN + 8);
        assert_eq!(unwrap(&stored), Some((0x8001, id, &b"app meta"[..])));
        let (kind, meta, got) = as_appended(super::super::Kind::Once.as_u16(), &stored);
        assert_eq!((kind, meta, got), (0x8001, &b"app meta"[..], Some(id)));
    }

    #[test]
    fn short_or_foreign_meta_is_no_id() {
        let id = AppendId {
            client: [1; 16],
            seq: 1,
        };
        let stored = wrap(0x8000, id, b"");
        assert!(unwrap(&stored[..ONCE_PREFIX_LEN - 1]).is_none());
        let mut other_version = stored.clone();
        other_version[0] = 2;
        assert!(unwrap(&other_version).is_none());
        // A twinlog kind inside is no application's frame.
        let inner_reserved = wrap(9, id, b"");
        assert!(unwrap(&inner_reserved).is_none());
        assert_eq!(as_appended(0x8000, b"x"), (0x8000, &b"x"[..], None));
    }
}
