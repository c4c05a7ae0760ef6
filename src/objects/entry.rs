//! The index's vocabulary: object types, entries going in, rows coming out.

use super::{Error, Result};

/// The length of an object id (SHA-1).
pub const OID_LEN: usize = 20;

/// Set in an ordinal that the tail served rather than the projection: such
/// an ordinal names no projection row. Its other bits are the row's arrival
/// number, so two tail rows never share one while fewer than 2^31 rows have
/// ever arrived.
pub const TAIL_ORDINAL_BIT: u32 = 1 << 31;

/// A git object type, with git's own numbers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ObjType {
    Commit,
    Tree,
    Blob,
    Tag,
}

impl ObjType {
    pub const ALL: [ObjType; 4] = [ObjType::Commit, ObjType::Tree, ObjType::Blob, ObjType::Tag];

    pub fn as_u8(self) -> u8 {
        match self {
            ObjType::Commit => 1,
            ObjType::Tree => 2,
            ObjType::Blob => 3,
            ObjType::Tag => 4,
        }
    }

    pub fn from_u8(v: u8) -> Option<ObjType> {
        match v {
            1 => Some(ObjType::Commit),
            2 => Some(ObjType::Tree),
            3 => Some(ObjType::Blob),
            4 => Some(ObjType::Tag),
            _ => None,
        }
    }

    /// 0..4, for per-type counters.
    pub(crate) fn slot(self) -> usize {
        usize::from(self.as_u8() - 1)
    }
}

/// One object as an append states it: where its bytes sit in the
/// repository's archive file (`offset`, `len`) and its size once inflated.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct IndexEntry {
    pub oid: [u8; OID_LEN],
    pub obj_type: ObjType,
    pub offset: u64,
    pub len: u64,
    pub uncompressed: u64,
}

impl IndexEntry {
    /// An entry for an oid that arrived as bytes of unchecked length.
    pub fn new(
        oid: &[u8],
        obj_type: ObjType,
        offset: u64,
        len: u64,
        uncompressed: u64,
    ) -> Result<IndexEntry> {
        let oid = <[u8; OID_LEN]>::try_from(oid).map_err(|_| Error::BadOid { len: oid.len() })?;
        Ok(IndexEntry {
            oid,
            obj_type,
            offset,
            len,
            uncompressed,
        })
    }

    /// The same object: everything but the oid agrees.
    pub fn same_facts(&self, other: &IndexEntry) -> bool {
        self.obj_type == other.obj_type
            && self.offset == other.offset
            && self.len == other.len
            && self.uncompressed == other.uncompressed
    }

    pub(crate) fn row(&self, ordinal: u32) -> IndexRow {
        IndexRow {
            ordinal,
            obj_type: self.obj_type,
            offset: self.offset,
            len: self.len,
            uncompressed: self.uncompressed,
        }
    }
}

/// What a lookup answers. `ordinal` is the row's position in the
/// projection, or [`TAIL_ORDINAL_BIT`] set when the tail served it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct IndexRow {
    pub ordinal: u32,
    pub obj_type: ObjType,
    pub offset: u64,
    pub len: u64,
    pub uncompressed: u64,
}

/// Lower-case hex, for error messages.
pub(crate) fn hex(oid: &[u8]) -> String {
    oid.iter().map(|b| format!("{b:02x}")).collect()
}

/// `entries` sorted by oid with repeats folded: a repeat with the same
/// facts is one entry, with other facts the whole batch is refused.
pub(crate) fn sorted_unique(entries: &[IndexEntry]) -> Result<Vec<IndexEntry>> {
    let mut v = entries.to_vec();
    v.sort_by_key(|e| e.oid);
    let mut out: Vec<IndexEntry> = Vec::with_capacity(v.len());
    for e in v {
        match out.last() {
            Some(last) if last.oid == e.oid => {
                if !last.same_facts(&e) {
                    return Err(Error::Conflict { oid: hex(&e.oid) });
                }
            }
            _ => out.push(e),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e(first: u8, offset: u64) -> IndexEntry {
        let mut oid = [0; OID_LEN];
        oid[0] = first;
        IndexEntry {
            oid,
            obj_type: ObjType::Blob,
            offset,
            len: 1,
            uncompressed: 1,
        }
    }

    #[test]
    fn types_keep_gits_numbers() {
        for t in ObjType::ALL {
            assert_eq!(ObjType::from_u8(t.as_u8()), Some(t));
        }
        assert_eq!(ObjType::Commit.as_u8(), 1);
        assert_eq!(ObjType::Tag.as_u8(), 4);
        assert_eq!(ObjType::from_u8(0), None);
        assert_eq!(ObjType::from_u8(5), None);
    }

    #[test]
    fn a_short_oid_is_refused_by_name() {
        let r = IndexEntry::new(&[1; 19], ObjType::Tree, 0, 0, 0);
        assert!(matches!(r, Err(Error::BadOid { len: 19 })));
    }

    #[test]
    fn repeats_fold_and_conflicts_refuse() {
        let v = sorted_unique(&[e(2, 5), e(1, 3), e(2, 5)]).expect("same facts fold");
        assert_eq!(v, vec![e(1, 3), e(2, 5)]);
        let r = sorted_unique(&[e(2, 5), e(2, 6)]);
        assert!(matches!(r, Err(Error::Conflict { .. })));
    }
}
