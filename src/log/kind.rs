//! What a frame is ([`Kind`]) and which repository it carries data of
//! ([`Meta`]).

use super::error::{Error, Result};

/// The kind of a frame, stored as a `u16` in its header.
///
/// `1..=0x7fff` belong to twinlog (the named kinds, the rest reserved);
/// `0x8000..=0xffff` are free for applications ([`Kind::App`]) and are
/// never interpreted by twinlog. 0 is never a kind: a zeroed header is no
/// frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    /// A repository created or purged.
    RepoStore,
    /// Objects of a repository (a pack).
    Pack,
    /// A push: ref updates of a repository.
    Refs,
    /// A large object stored.
    LfsPut,
    /// A large object deleted.
    LfsDelete,
    /// A control document.
    ControlDoc,
    /// A frame whose data was erased in place ([`crate::log::Log::erase`]).
    Redacted,
    /// An erase to carry out (before, repositories): travels to the twin as a
    /// frame so both erase the same frames.
    Erase,
    /// A record of the embedding [`crate::wal::Wal`].
    Record,
    /// An operator's decision that the store skips one frame it cannot
    /// apply: travels as a frame so every box makes the same decision.
    StoreSkip,
    /// A control document deleted.
    DocDelete,
    /// An application's frame appended once: its meta starts with the
    /// append's id ([`crate::log::once`]), so a retry is never written
    /// twice, on this box or on the twin that takes over.
    Once,
    /// A kind of twinlog's reserved range this version does not name.
    Reserved(u16),
    /// An application's own kind, `0x8000..=0xffff`.
    App(u16),
}

/// The first kind of the range free for applications.
pub const APP_KIND_FIRST: u16 = 0x8000;

impl Kind {
    /// The stored value.
    pub fn as_u16(self) -> u16 {
        match self {
            Kind::RepoStore => 1,
            Kind::Pack => 2,
            Kind::Refs => 3,
            Kind::LfsPut => 4,
            Kind::LfsDelete => 5,
            Kind::ControlDoc => 6,
            Kind::Redacted => 7,
            Kind::Erase => 8,
            Kind::Record => 9,
            Kind::StoreSkip => 10,
            Kind::DocDelete => 11,
            Kind::Once => 12,
            Kind::Reserved(v) | Kind::App(v) => v,
        }
    }

    /// The kind a stored value names; `Err(Error::InvalidKind)` for 0 and for
    /// a `Reserved`/`App` value outside its range.
    pub fn from_u16(v: u16) -> Result<Kind> {
        Ok(match v {
            0 => return Err(Error::InvalidKind(v)),
            1 => Kind::RepoStore,
            2 => Kind::Pack,
            3 => Kind::Refs,
            4 => Kind::LfsPut,
            5 => Kind::LfsDelete,
            6 => Kind::ControlDoc,
            7 => Kind::Redacted,
            8 => Kind::Erase,
            9 => Kind::Record,
            10 => Kind::StoreSkip,
            11 => Kind::DocDelete,
            12 => Kind::Once,
            v if v < APP_KIND_FIRST => Kind::Reserved(v),
            v => Kind::App(v),
        })
    }

    /// A checked application kind.
    pub fn app(v: u16) -> Result<Kind> {
        if v >= APP_KIND_FIRST {
            Ok(Kind::App(v))
        } else {
            Err(Error::InvalidKind(v))
        }
    }

    /// Whether [`crate::log::Log::erase`] erases frames of this kind: the
    /// ones that carry a repository's data. RepoStore stays so a replay
    /// keeps its creates and purges in order.
    pub fn carries_repo_data(self) -> bool {
        matches!(
            self,
            Kind::Pack | Kind::Refs | Kind::LfsPut | Kind::LfsDelete | Kind::Redacted
        )
    }
}

/// The meta of a twinlog frame: which repository it carries data of, and a
/// detail of the kind's own (a ref name, an object id...).
///
/// Encoded as `version u8 = 1`, `repo_len u16`, the repository's UTF-8
/// name, then the detail bytes to the end. Application kinds may use any
/// meta bytes with the `_raw` methods; `erase` decodes only the kinds it
/// erases.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Meta {
    /// The repository, or empty for a frame of no repository.
    pub repo: String,
    /// The kind's own detail.
    pub detail: Vec<u8>,
}

const META_VERSION: u8 = 1;

impl Meta {
    /// Meta naming a repository.
    pub fn repo(repo: impl Into<String>) -> Meta {
        Meta {
            repo: repo.into(),
            detail: Vec::new(),
        }
    }

    /// The stored bytes. Refused when the name exceeds 65,535 bytes.
    pub fn encode(&self) -> Result<Vec<u8>> {
        let len = u16::try_from(self.repo.len()).map_err(|_| Error::TooLarge {
            what: "repository name",
            len: self.repo.len() as u64,
            max: u64::from(u16::MAX),
        })?;
        let mut b = Vec::with_capacity(3 + self.repo.len() + self.detail.len());
        b.push(META_VERSION);
        b.extend_from_slice(&len.to_le_bytes());
        b.extend_from_slice(self.repo.as_bytes());
        b.extend_from_slice(&self.detail);
        Ok(b)
    }

    /// Decode stored bytes; `Err(Error::BadMeta)` names what is wrong.
    pub fn decode(b: &[u8]) -> Result<Meta> {
        let repo = Self::repo_of(b)?;
        let start = 3 + repo.len();
        Ok(Meta {
            repo: repo.to_owned(),
            detail: b[start..].to_vec(),
        })
    }

    /// The repository name of stored bytes without copying them.
    pub fn repo_of(b: &[u8]) -> Result<&str> {
        if b.len() < 3 || b[0] != META_VERSION {
            return Err(Error::BadMeta("no meta header"));
        }
        let len = usize::from(u16::from_le_bytes([b[1], b[2]]));
        let name = b
            .get(3..3 + len)
            .ok_or(Error::BadMeta("repository name runs past the meta"))?;
        std::str::from_utf8(name).map_err(|_| Error::BadMeta("repository name is not UTF-8"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_round_trip() {
        for v in 1..=u16::MAX {
            assert_eq!(Kind::from_u16(v).map(Kind::as_u16).ok(), Some(v));
        }
        assert!(Kind::from_u16(0).is_err());
        assert!(Kind::app(7).is_err());
    }

    #[test]
    fn meta_round_trips_and_refuses_garbage() {
        let m = Meta {
            repo: "acme/widgets".into(),
            detail: b"refs/heads/main".to_vec(),
        };
        let b = m.encode().expect("encode");
        assert_eq!(Meta::decode(&b).expect("decode"), m);
        assert_eq!(Meta::repo_of(&b).expect("repo"), "acme/widgets");
        assert!(Meta::decode(&[]).is_err());
        assert!(Meta::decode(&[1, 9, 0, b'a']).is_err());
        assert!(Meta::decode(&[2, 0, 0]).is_err());
    }
}
