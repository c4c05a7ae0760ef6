//! `APPLIED`: the log history a store belongs to and the seq it has applied
//! up to, in two 512-byte slots written in turn, each `magic [8] |
//! history [16] | seq u64 | crc u32` (crc over the first 32 bytes). A write
//! goes to the slot not holding the current record and is made durable with
//! one fdatasync, so a torn write leaves the other slot whole.

use std::path::Path;
use std::sync::Arc;

use super::Result;
use crate::log::HistoryId;
use crate::publish::sync_parent_with;
use crate::storage::{OpenMode, Storage, StorageFile};

const MAGIC: [u8; 8] = *b"TWSTORE1";
const SLOT: u64 = 512;

pub(crate) struct AppliedMarker {
    file: Arc<dyn StorageFile>,
    history: HistoryId,
    applied: u64,
    /// The slot holding the current record.
    slot: u64,
}

fn encode(history: HistoryId, seq: u64) -> [u8; 36] {
    let mut b = [0u8; 36];
    b[..8].copy_from_slice(&MAGIC);
    b[8..24].copy_from_slice(&history.0);
    b[24..32].copy_from_slice(&seq.to_le_bytes());
    let crc = crc32fast::hash(&b[..32]);
    b[32..36].copy_from_slice(&crc.to_le_bytes());
    b
}

fn decode(b: &[u8; 36]) -> Option<(HistoryId, u64)> {
    let mut crc = [0u8; 4];
    crc.copy_from_slice(&b[32..36]);
    if b[..8] != MAGIC || crc32fast::hash(&b[..32]) != u32::from_le_bytes(crc) {
        return None;
    }
    let mut h = [0u8; 16];
    h.copy_from_slice(&b[8..24]);
    let mut s = [0u8; 8];
    s.copy_from_slice(&b[24..32]);
    Some((HistoryId(h), u64::from_le_bytes(s)))
}

impl AppliedMarker {
    /// Open the marker, or create it at 0 for `history`.
    pub(crate) fn open(fs: &dyn Storage, path: &Path, history: HistoryId) -> Result<AppliedMarker> {
        let created = !fs.exists(path)?;
        let file = fs.open(path, OpenMode::Create)?;
        let mut best: Option<(HistoryId, u64, u64)> = None;
        for slot in 0..2 {
            let mut b = [0u8; 36];
            if file.read_exact_at(&mut b, slot * SLOT).is_err() {
                continue;
            }
            if let Some((h, seq)) = decode(&b) {
                if best.is_none_or(|(_, s, _)| seq > s) {
                    best = Some((h, seq, slot));
                }
            }
        }
        let (history, applied, slot) = match best {
            Some(b) => b,
            None => {
                file.write_all_at(&encode(history, 0), 0)?;
                file.set_len(2 * SLOT)?;
                file.sync_all()?;
                if created {
                    sync_parent_with(fs, path)?;
                }
                (history, 0, 0)
            }
        };
        Ok(AppliedMarker {
            file,
            history,
            applied,
            slot,
        })
    }

    pub(crate) fn history(&self) -> HistoryId {
        self.history
    }

    pub(crate) fn applied(&self) -> u64 {
        self.applied
    }

    /// Belong to another history: only a store that has applied nothing
    /// may, as a fresh follower's log adopts its leader's history.
    pub(crate) fn rebind(&mut self, history: HistoryId) -> Result<()> {
        debug_assert_eq!(self.applied, 0);
        let slot = 1 - self.slot;
        self.file.write_all_at(&encode(history, 0), slot * SLOT)?;
        self.file.sync_data()?;
        self.slot = slot;
        self.history = history;
        Ok(())
    }

    /// Record `seq` durably.
    /// Record `seq`, below the mark, in both slots: `open` takes the slot
    /// with the higher seq, so a lower one written to a single slot would
    /// lose to the other slot at the next open. The slot not current is
    /// written first: a crash between the two writes leaves the old mark,
    /// and a rejoin run again rewinds again.
    pub(crate) fn rewind(&mut self, seq: u64) -> Result<()> {
        let bytes = encode(self.history, seq);
        for slot in [1 - self.slot, self.slot] {
            self.file.write_all_at(&bytes, slot * SLOT)?;
            self.file.sync_data()?;
        }
        self.applied = seq;
        Ok(())
    }

    pub(crate) fn record(&mut self, seq: u64) -> Result<()> {
        let slot = 1 - self.slot;
        self.file
            .write_all_at(&encode(self.history, seq), slot * SLOT)?;
        self.file.sync_data()?;
        self.slot = slot;
        self.applied = seq;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::StdStorage;
    use crate::storage::{OpenMode, Storage};

    #[test]
    fn a_rewind_survives_a_reopen() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("APPLIED");
        let h = HistoryId([3; 16]);
        let mut m = AppliedMarker::open(&StdStorage, &path, h).expect("open");
        m.record(300).expect("record");
        m.record(347).expect("record");
        m.rewind(228).expect("rewind");
        drop(m);
        let mut m = AppliedMarker::open(&StdStorage, &path, h).expect("reopen");
        assert_eq!(m.applied(), 228, "the higher slot must not win back");
        m.record(229).expect("record after the rewind");
        drop(m);
        assert_eq!(
            AppliedMarker::open(&StdStorage, &path, h)
                .expect("reopen")
                .applied(),
            229
        );
    }

    #[test]
    fn a_torn_slot_leaves_the_other() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("APPLIED");
        let h = HistoryId([3; 16]);
        let mut m = AppliedMarker::open(&StdStorage, &path, h).expect("open");
        m.record(5).expect("record");
        m.record(9).expect("record");
        drop(m);
        let m = AppliedMarker::open(&StdStorage, &path, HistoryId([9; 16])).expect("reopen");
        assert_eq!((m.history(), m.applied()), (h, 9));
        // Tear the newer slot (slot 0 holds 9 after two records).
        let f = StdStorage.open(&path, OpenMode::Write).expect("open");
        f.write_all_at(&[0xff; 10], 20).expect("tear");
        let m = AppliedMarker::open(&StdStorage, &path, h).expect("reopen");
        assert_eq!(m.applied(), 5);
    }
}
