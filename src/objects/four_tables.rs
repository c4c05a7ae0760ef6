//! The projection as four IPC sections of one column each: oid, type,
//! extent, uncompressed. A reader of one column maps only its own section.

use arrow_array::{FixedSizeBinaryArray, FixedSizeListArray, UInt64Array, UInt8Array};

use super::columns::{
    column, decode_stream, fields, index_over_columns, ipc_stream, Columns, EXTENT, OID, TYPE,
    UNCOMPRESSED,
};
use super::entry::IndexEntry;
use super::Result;

/// Four RecordBatches, each its own IPC stream, sorted by oid.
pub struct FourTables {
    cols: Columns,
}

impl FourTables {
    fn from_entries(entries: &[IndexEntry]) -> Result<FourTables> {
        let arrays = Columns::arrays_of(entries)?;
        let mut ipc = Vec::with_capacity(4);
        for (field, array) in fields().into_iter().zip(arrays) {
            ipc.push(ipc_stream(vec![field], vec![array])?);
        }
        let section = |i: usize| decode_stream(&ipc[i]);
        let cols = Columns::new(
            column::<FixedSizeBinaryArray>(&section(0)?, OID)?,
            column::<UInt8Array>(&section(1)?, TYPE)?,
            column::<FixedSizeListArray>(&section(2)?, EXTENT)?,
            column::<UInt64Array>(&section(3)?, UNCOMPRESSED)?,
            ipc,
        )?;
        Ok(FourTables { cols })
    }
}

index_over_columns!(FourTables, "FourTables");
