//! The frames drills append: a frame's meta names it, and its kind,
//! repository and blob follow from the name, so a checker can tell any frame
//! it finds (acknowledged or not) from garbage.
//!
//! A name is `{repo}|{tag}|{len}`: the repository it carries data of, a tag
//! unique in the run, and the blob's length.

use twinlog::log::{format, Kind, Meta};

use crate::{DrillError, Result};

/// The repository the drills erase.
pub const ERASED_REPO: &str = "gone";
/// The repository the drills keep.
pub const KEPT_REPO: &str = "keep";

/// FNV-1a of a name: the seed of its blob.
pub fn hash(name: &str) -> u64 {
    name.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// `len` deterministic bytes seeded by `seed`.
pub fn bytes(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut out = Vec::with_capacity(len);
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let word = x.to_le_bytes();
        let take = (len - out.len()).min(8);
        out.extend_from_slice(&word[..take]);
    }
    out
}

/// A frame of the drill, as the writer made it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Frame {
    pub name: String,
    pub repo: String,
    pub kind: Kind,
    pub meta: Vec<u8>,
    pub blob_len: u64,
}

impl Frame {
    /// The frame called `name`; refused when the name is not a drill's.
    pub fn named(name: &str) -> Result<Frame> {
        let mut parts = name.split('|');
        let (Some(repo), Some(_tag), Some(len), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(DrillError(format!("{name:?} is not a drill frame name")));
        };
        let blob_len: u64 = len
            .parse()
            .map_err(|e| DrillError(format!("{name:?}: blob length: {e}")))?;
        let kind = match hash(name) % 4 {
            0 => Kind::Pack,
            1 => Kind::Refs,
            2 => Kind::LfsPut,
            _ => Kind::LfsDelete,
        };
        let meta = Meta {
            repo: repo.to_owned(),
            detail: name.as_bytes().to_vec(),
        }
        .encode()
        .map_err(|e| DrillError(format!("{name:?}: meta: {e}")))?;
        Ok(Frame {
            name: name.to_owned(),
            repo: repo.to_owned(),
            kind,
            meta,
            blob_len,
        })
    }

    /// A new frame name: the repository and length from `seed`, `tag`
    /// unique, small blobs up to `max_len` bytes.
    pub fn small(tag: &str, seed: u64, max_len: u64) -> Result<Frame> {
        let repo = if seed.is_multiple_of(3) {
            ERASED_REPO
        } else {
            KEPT_REPO
        };
        let len = (seed >> 8) % (max_len + 1);
        Frame::named(&format!("{repo}|{tag}|{len}"))
    }

    /// The blob, whole.
    pub fn blob(&self) -> Result<Vec<u8>> {
        let len = usize::try_from(self.blob_len)
            .map_err(|_| DrillError(format!("{}: blob too large", self.name)))?;
        Ok(bytes(hash(&self.name), len))
    }

    /// The payload crc its first append computes.
    pub fn payload_crc(&self) -> Result<u32> {
        Ok(format::payload_crc(&self.meta, &self.blob()?))
    }

    /// Whether an erase of [`ERASED_REPO`] erases it.
    pub fn erasable(&self) -> bool {
        self.repo == ERASED_REPO && self.kind.carries_repo_data()
    }
}

/// The name a stored meta carries: the detail of a drill's meta.
pub fn name_of_meta(meta: &[u8]) -> Result<String> {
    let m = Meta::decode(meta).map_err(|e| DrillError(format!("frame meta: {e}")))?;
    String::from_utf8(m.detail).map_err(|_| DrillError("frame name is not UTF-8".into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_garbage_is_refused() {
        let f = Frame::small("t1", 0x1234_5678, 3000).expect("frame");
        assert_eq!(Frame::named(&f.name).expect("named"), f);
        assert_eq!(name_of_meta(&f.meta).expect("meta"), f.name);
        assert_eq!(f.blob().expect("blob").len() as u64, f.blob_len);
        assert!(Frame::named("x|y").is_err());
        assert!(Frame::named("x|y|z").is_err());
        assert!(Frame::named("x|y|1|2").is_err());
    }
}
