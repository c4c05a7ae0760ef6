//! The four columns both Arrow layouts hold, and the search over them.
//!
//! The layouts differ in how the columns are laid out as IPC (four streams
//! of one column, or one stream of four); once decoded they are the same
//! four arrays, aliasing the resident IPC bytes rather than copying them
//! (arrow's `StreamDecoder` slices its input `Buffer`), so `resident_bytes`
//! is the IPC plus the search tree and nothing is held twice.

use std::sync::Arc;

use arrow_array::builder::FixedSizeBinaryBuilder;
use arrow_array::{
    Array, ArrayRef, FixedSizeBinaryArray, FixedSizeListArray, RecordBatch, UInt64Array, UInt8Array,
};
use arrow_buffer::Buffer;
use arrow_ipc::reader::StreamDecoder;
use arrow_ipc::writer::StreamWriter;
use arrow_schema::{DataType, Field, FieldRef, Schema};

use super::entry::{sorted_unique, IndexEntry, IndexRow, ObjType, OID_LEN, TAIL_ORDINAL_BIT};
use super::stree::{prefix, STree};
use super::{Error, Result};

/// Column names, the same in both layouts.
pub(crate) const OID: &str = "oid";
pub(crate) const TYPE: &str = "type";
pub(crate) const EXTENT: &str = "extent";
pub(crate) const UNCOMPRESSED: &str = "uncompressed";

fn extent_item() -> FieldRef {
    Arc::new(Field::new("item", DataType::UInt64, false))
}

/// The four fields: the oid, git's type number, the archive extent as an
/// (offset, len) pair, and the inflated size.
pub(crate) fn fields() -> [Field; 4] {
    [
        Field::new(OID, DataType::FixedSizeBinary(OID_LEN as i32), false),
        Field::new(TYPE, DataType::UInt8, false),
        Field::new(EXTENT, DataType::FixedSizeList(extent_item(), 2), false),
        Field::new(UNCOMPRESSED, DataType::UInt64, false),
    ]
}

/// The four columns of `entries` (sorted, unique), in [`fields`] order.
pub(crate) fn arrays(entries: &[IndexEntry]) -> Result<[ArrayRef; 4]> {
    if entries.len() >= TAIL_ORDINAL_BIT as usize {
        return Err(Error::TooManyRows {
            rows: entries.len(),
        });
    }
    let mut oids = FixedSizeBinaryBuilder::with_capacity(entries.len(), OID_LEN as i32);
    for e in entries {
        oids.append_value(e.oid)?;
    }
    let types = UInt8Array::from_iter_values(entries.iter().map(|e| e.obj_type.as_u8()));
    let extent_values =
        UInt64Array::from_iter_values(entries.iter().flat_map(|e| [e.offset, e.len]));
    let extents = FixedSizeListArray::try_new(extent_item(), 2, Arc::new(extent_values), None)?;
    let uncompressed = UInt64Array::from_iter_values(entries.iter().map(|e| e.uncompressed));
    Ok([
        Arc::new(oids.finish()),
        Arc::new(types),
        Arc::new(extents),
        Arc::new(uncompressed),
    ])
}

/// One IPC stream (schema, one batch, end of stream) of `columns`.
pub(crate) fn ipc_stream(fields: Vec<Field>, columns: Vec<ArrayRef>) -> Result<Buffer> {
    let schema = Arc::new(Schema::new(fields));
    let batch = RecordBatch::try_new(schema.clone(), columns)?;
    let mut w = StreamWriter::try_new(Vec::new(), &schema)?;
    w.write(&batch)?;
    w.finish()?;
    Ok(Buffer::from_vec(w.into_inner()?))
}

/// The one batch of an IPC stream, decoded in place over `ipc`.
pub(crate) fn decode_stream(ipc: &Buffer) -> Result<RecordBatch> {
    let mut input = ipc.clone();
    let mut decoder = StreamDecoder::new();
    let batch = decoder.decode(&mut input)?.ok_or_else(|| Error::Corrupt {
        what: "an IPC section holds no batch".into(),
    })?;
    Ok(batch)
}

/// Column `name` of `batch` as a `T`.
pub(crate) fn column<T: Array + Clone + 'static>(batch: &RecordBatch, name: &str) -> Result<T> {
    batch
        .column_by_name(name)
        .and_then(|c| c.as_any().downcast_ref::<T>())
        .cloned()
        .ok_or_else(|| Error::Corrupt {
            what: format!("column {name} is missing or of another type"),
        })
}

/// The decoded columns and the tree over their oids.
pub(crate) struct Columns {
    oids: FixedSizeBinaryArray,
    types: UInt8Array,
    /// The extent list's values: offset at `2i`, len at `2i + 1`.
    extents: UInt64Array,
    uncompressed: UInt64Array,
    stree: STree,
    /// The IPC the arrays alias; kept so its size is accounted for.
    ipc: Vec<Buffer>,
}

impl Columns {
    pub(crate) fn new(
        oids: FixedSizeBinaryArray,
        types: UInt8Array,
        extents: FixedSizeListArray,
        uncompressed: UInt64Array,
        ipc: Vec<Buffer>,
    ) -> Result<Columns> {
        let n = oids.len();
        let extents: UInt64Array = extents
            .values()
            .as_any()
            .downcast_ref::<UInt64Array>()
            .cloned()
            .ok_or_else(|| Error::Corrupt {
                what: "extent values are not u64".into(),
            })?;
        let shaped = oids.value_length() == OID_LEN as i32
            && types.len() == n
            && extents.len() == 2 * n
            && uncompressed.len() == n
            && types
                .values()
                .iter()
                .all(|&t| ObjType::from_u8(t).is_some());
        if !shaped {
            return Err(Error::Corrupt {
                what: "projection columns disagree in length or content".into(),
            });
        }
        let keys: Vec<u64> = (0..n).map(|i| prefix(oids.value(i))).collect();
        if keys.windows(2).any(|w| w[0] > w[1]) {
            return Err(Error::Corrupt {
                what: "projection oids are not sorted".into(),
            });
        }
        Ok(Columns {
            stree: STree::build(&keys),
            oids,
            types,
            extents,
            uncompressed,
            ipc,
        })
    }

    /// Sort and fold `entries`, then their four columns.
    pub(crate) fn arrays_of(entries: &[IndexEntry]) -> Result<[ArrayRef; 4]> {
        arrays(&sorted_unique(entries)?)
    }

    pub(crate) fn len(&self) -> usize {
        self.oids.len()
    }

    /// From the tree's lower bound, the row whose oid is `oid`: repeated
    /// 8-byte prefixes are walked, so the full oid decides.
    #[inline]
    fn confirm(&self, oid: &[u8], q: u64, mut at: usize) -> Option<usize> {
        while at < self.len() && self.stree.key(at) == q {
            if self.oids.value(at) == oid {
                return Some(at);
            }
            at += 1;
        }
        None
    }

    pub(crate) fn position(&self, oid: &[u8]) -> Option<usize> {
        if oid.len() != OID_LEN {
            return None;
        }
        let q = prefix(oid);
        self.confirm(oid, q, self.stree.lower_bound(q))
    }

    /// Every oid's row, the tree walked for the whole batch at once.
    pub(crate) fn positions(&self, oids: &[&[u8]]) -> Vec<Option<usize>> {
        let qs: Vec<u64> = oids.iter().map(|o| prefix(o)).collect();
        let mut at = Vec::new();
        self.stree.lower_bounds(&qs, &mut at);
        oids.iter()
            .zip(qs.iter().zip(at))
            .map(|(oid, (&q, at))| {
                if oid.len() == OID_LEN {
                    self.confirm(oid, q, at)
                } else {
                    None
                }
            })
            .collect()
    }

    pub(crate) fn extent(&self, at: usize) -> (u64, u64) {
        (self.extents.value(2 * at), self.extents.value(2 * at + 1))
    }

    pub(crate) fn row(&self, at: usize) -> Option<IndexRow> {
        let (offset, len) = self.extent(at);
        Some(IndexRow {
            ordinal: u32::try_from(at).ok()?,
            obj_type: ObjType::from_u8(self.types.value(at))?,
            offset,
            len,
            uncompressed: self.uncompressed.value(at),
        })
    }

    pub(crate) fn sum_uncompressed(&self) -> u64 {
        self.uncompressed.values().iter().sum()
    }

    pub(crate) fn count_type(&self, t: ObjType) -> usize {
        let t = t.as_u8();
        self.types.values().iter().filter(|&&v| v == t).count()
    }

    pub(crate) fn ipc_bytes(&self) -> usize {
        self.ipc.iter().map(Buffer::len).sum()
    }

    pub(crate) fn resident_bytes(&self) -> usize {
        self.ipc_bytes() + self.stree.resident_bytes()
    }
}

/// `ObjectIndex` for a layout that is a `Columns` in its field `cols`: the
/// layouts differ only in how they build, so everything else is this.
macro_rules! index_over_columns {
    ($t:ty, $name:literal) => {
        impl $crate::objects::ObjectIndex for $t {
            fn build(entries: &[$crate::objects::IndexEntry]) -> $crate::objects::Result<Self> {
                <$t>::from_entries(entries)
            }

            fn lookup(&self, oid: &[u8]) -> Option<$crate::objects::IndexRow> {
                self.cols.position(oid).and_then(|at| self.cols.row(at))
            }

            fn lookup_batch(&self, oids: &[&[u8]]) -> Vec<Option<$crate::objects::IndexRow>> {
                self.cols
                    .positions(oids)
                    .into_iter()
                    .map(|at| at.and_then(|at| self.cols.row(at)))
                    .collect()
            }

            fn ordinals_batch(&self, oids: &[&[u8]]) -> Vec<Option<u32>> {
                self.cols
                    .positions(oids)
                    .into_iter()
                    .map(|at| at.and_then(|at| u32::try_from(at).ok()))
                    .collect()
            }

            fn extents_batch(&self, oids: &[&[u8]]) -> Vec<Option<(u64, u64)>> {
                self.cols
                    .positions(oids)
                    .into_iter()
                    .map(|at| at.map(|at| self.cols.extent(at)))
                    .collect()
            }

            fn sum_uncompressed(&self) -> u64 {
                self.cols.sum_uncompressed()
            }

            fn count_type(&self, t: $crate::objects::ObjType) -> usize {
                self.cols.count_type(t)
            }

            fn len(&self) -> usize {
                self.cols.len()
            }

            fn resident_bytes(&self) -> usize {
                self.cols.resident_bytes()
            }

            fn name(&self) -> &'static str {
                $name
            }

            fn ipc_bytes(&self) -> usize {
                self.cols.ipc_bytes()
            }
        }
    };
}
pub(crate) use index_over_columns;
