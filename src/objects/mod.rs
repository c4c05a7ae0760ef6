//! The object index of one repository: where each object's bytes sit in the
//! repository's archive file, keyed by its 20-byte oid.
//!
//! Three layers, one object ([`ObjectReadStack`]):
//!
//! - a durable **tail** in redb (`tail`), written by every append and the
//!   only layer that is always complete;
//! - an Arrow **projection** of the tail, sorted by oid, in one of two
//!   layouts ([`FourTables`], [`OneTableFourColumns`]), rebuilt from a scan
//!   of the tail when enough rows have arrived since the last build;
//! - a static search tree ([`stree`]) over the projection's oids, walked
//!   level by level for a whole batch of lookups at once.
//!
//! A lookup asks the projection first and the tail for what the projection
//! does not hold. The archive is append-only (enforced by
//! [`ObjectReadStack::append`]), so the projection can be incomplete but
//! never wrong; [`ObjectReadStack::retain`] and the pair
//! [`ObjectReadStack::stage_retained`] / [`ObjectReadStack::swap_in`] are
//! the exceptions, and rebuild the projection before they return.

mod backend;
mod columns;
mod entry;
mod four_tables;
mod one_table;
mod stack;
pub mod stree;
mod tail;

pub use entry::{IndexEntry, IndexRow, ObjType, OID_LEN, TAIL_ORDINAL_BIT};
pub use four_tables::FourTables;
pub use one_table::OneTableFourColumns;
pub use stack::{ObjectReadStack, RebuildReason, RebuildTriggers, StackStats};

use arrow_schema::ArrowError;

/// What the object index fails at.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An oid already present with other facts: the archive is append-only,
    /// so this batch is refused whole.
    #[error("oid {oid} is already present with other facts")]
    Conflict { oid: String },
    #[error("an oid is {OID_LEN} bytes, not {len}")]
    BadOid { len: usize },
    /// Projection ordinals are 31 bits; the top bit marks a tail row.
    #[error("{rows} rows do not fit a projection's 31-bit ordinals")]
    TooManyRows { rows: usize },
    /// Bytes in the tail or an IPC section that this code did not write.
    #[error("corrupt object index: {what}")]
    Corrupt { what: String },
    /// Boxed: redb's error is large, and every `Result` here would carry it.
    #[error("redb: {0}")]
    Redb(Box<redb::Error>),
    #[error("Arrow: {0}")]
    Arrow(#[from] ArrowError),
    #[error("I/O: {0}")]
    Io(#[from] std::io::Error),
    /// A file operation asked of a tail that has no file.
    #[error("the tail is in memory: it has no file to replace")]
    InMemory,
}

pub type Result<T> = std::result::Result<T, Error>;

/// redb splits its errors by operation; callers here only need "redb failed".
macro_rules! from_redb {
    ($($t:ty),*) => {$(
        impl From<$t> for Error {
            fn from(e: $t) -> Error {
                Error::Redb(Box::new(e.into()))
            }
        }
    )*};
}
from_redb!(
    redb::Error,
    redb::DatabaseError,
    redb::TransactionError,
    redb::TableError,
    redb::StorageError,
    redb::CommitError
);

/// An oid → row index over one repository's objects.
///
/// Implemented by the two Arrow layouts and by the stack over them, so one
/// benchmark or test can drive all three. Lookups take `&[u8]` because oids
/// arrive off the wire: one of the wrong length is simply a miss.
pub trait ObjectIndex: Sized + Send + Sync {
    /// An index over `entries`, in any order. The same oid twice with the
    /// same facts is one row; with different facts, [`Error::Conflict`].
    fn build(entries: &[IndexEntry]) -> Result<Self>;

    fn lookup(&self, oid: &[u8]) -> Option<IndexRow>;

    /// `out[i]` answers `oids[i]`.
    fn lookup_batch(&self, oids: &[&[u8]]) -> Vec<Option<IndexRow>>;

    /// oid → ordinal only: the floor cost of a lookup, no payload column read.
    fn ordinals_batch(&self, oids: &[&[u8]]) -> Vec<Option<u32>>;

    /// oid → (offset, len) in the archive: the partial-row path.
    fn extents_batch(&self, oids: &[&[u8]]) -> Vec<Option<(u64, u64)>>;

    /// Uncompressed bytes of every object: the quota gate.
    fn sum_uncompressed(&self) -> u64;

    fn count_type(&self, t: ObjType) -> usize;

    fn len(&self) -> usize;

    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes this index keeps in memory.
    fn resident_bytes(&self) -> usize;

    fn name(&self) -> &'static str;

    /// Bytes of Arrow IPC held resident; comparable across layouts.
    fn ipc_bytes(&self) -> usize;
}
