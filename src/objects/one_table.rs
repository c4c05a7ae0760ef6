//! The projection as one IPC stream of one RecordBatch with four columns:
//! one section to write, map and check.

use arrow_array::{FixedSizeBinaryArray, FixedSizeListArray, UInt64Array, UInt8Array};

use super::columns::{
    column, decode_stream, fields, index_over_columns, ipc_stream, Columns, EXTENT, OID, TYPE,
    UNCOMPRESSED,
};
use super::entry::IndexEntry;
use super::Result;

/// One RecordBatch of oid, type, extent and uncompressed, sorted by oid.
pub struct OneTableFourColumns {
    cols: Columns,
}

impl OneTableFourColumns {
    fn from_entries(entries: &[IndexEntry]) -> Result<OneTableFourColumns> {
        let arrays = Columns::arrays_of(entries)?;
        let ipc = ipc_stream(fields().to_vec(), arrays.to_vec())?;
        let batch = decode_stream(&ipc)?;
        let cols = Columns::new(
            column::<FixedSizeBinaryArray>(&batch, OID)?,
            column::<UInt8Array>(&batch, TYPE)?,
            column::<FixedSizeListArray>(&batch, EXTENT)?,
            column::<UInt64Array>(&batch, UNCOMPRESSED)?,
            vec![ipc],
        )?;
        Ok(OneTableFourColumns { cols })
    }
}

index_over_columns!(OneTableFourColumns, "OneTableFourColumns");
