//! The records of the Wal tests (`tests/wal.rs`), shared with the writer
//! process an external reader tails (`twinlog-test-child wal-writer`).

use twinlog::wal::WalOptions;

/// Small segments and records.
pub fn small(max_record_size: usize) -> WalOptions {
    WalOptions {
        max_record_size,
        segment_bytes: 4096,
        storage: None,
        ..WalOptions::default()
    }
}

/// Record `lsn`'s payload.
pub fn record(lsn: u64) -> Vec<u8> {
    format!("record {lsn} ")
        .repeat((lsn % 17) as usize + 1)
        .into_bytes()
}

/// How many records the writer process commits.
pub const CHILD_RECORDS: u64 = 3000;
