//! Retention on the primary: whole segments go oldest first once the log
//! passes its byte cap, those the twin has acknowledged before those it has
//! not, like a PostgreSQL replication slot with `max_slot_wal_keep_size`.
//! The twin's position (the slot) is kept in a file so a restarted primary
//! still holds what its twin needs.

use std::path::{Path, PathBuf};

use crate::storage::{write_file, StdStorage, Storage};

/// How much log the primary keeps.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Retention {
    /// Bytes of log past which the oldest whole segments are dropped; 0
    /// keeps everything.
    pub max_bytes: u64,
    /// Where the twin's position is kept across restarts.
    pub slot: Option<PathBuf>,
}

/// What one pass decided.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// Drop every sealed segment whose last frame is below this (0: none).
    pub before: u64,
    /// The drop passes the twin's hold: the twin will be below the floor.
    pub past_hold: bool,
}

/// Decide a pass over `layout` (`(first, last, bytes)` per segment, oldest
/// first, the open one last). Frames from `hold` on are the twin's (the
/// frame at its head proves a shared past at the next handshake);
/// `applied` is how far the primary's own store has applied, which bounds
/// every drop.
pub fn plan(layout: &[(u64, u64, u64)], max_bytes: u64, hold: u64, applied: u64) -> Plan {
    let mut total: u64 = layout.iter().map(|s| s.2).sum();
    let mut out = Plan::default();
    if max_bytes == 0 || total <= max_bytes {
        return out;
    }
    let sealed = layout.len().saturating_sub(1);
    for &(first, last, bytes) in &layout[..sealed] {
        if total <= max_bytes || last > applied || last < first {
            break;
        }
        if last >= hold {
            out.past_hold = true;
        }
        total -= bytes;
        out.before = last + 1;
    }
    out
}

/// A seq as a small file holds it: its 8 bytes, then their crc32 (the
/// slot here, the primary's `RESTART_FLOOR`).
pub fn seq_file_bytes(seq: u64) -> [u8; 12] {
    let mut b = [0u8; 12];
    b[..8].copy_from_slice(&seq.to_le_bytes());
    b[8..].copy_from_slice(&crc32fast::hash(&seq.to_le_bytes()).to_le_bytes());
    b
}

/// The seq of [`seq_file_bytes`]; `None` when the bytes do not check.
pub fn parse_seq_file(b: &[u8]) -> Option<u64> {
    let seq: [u8; 8] = b.get(..8)?.try_into().ok()?;
    (b.len() == 12 && crc32fast::hash(&seq).to_le_bytes() == b[8..])
        .then(|| u64::from_le_bytes(seq))
}

/// The twin's position as the slot file holds it; 0 when there is none.
pub fn load_slot(path: &Path) -> u64 {
    let Ok(b) = StdStorage.read(path) else {
        return 0;
    };
    parse_seq_file(&b).unwrap_or_else(|| {
        tracing::warn!(path = %path.display(), "the twin's slot file does not check: holding nothing");
        0
    })
}

/// Record the twin's position (a staged file renamed over the slot). Not
/// fsynced: an older slot after a power cut only holds more.
pub fn store_slot(path: &Path, seq: u64) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp");
    write_file(&StdStorage, &tmp, &seq_file_bytes(seq))?;
    StdStorage.rename(&tmp, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEGS: [(u64, u64, u64); 4] = [(1, 10, 100), (11, 20, 100), (21, 30, 100), (31, 30, 100)];

    #[test]
    fn under_the_cap_nothing_goes() {
        assert_eq!(plan(&SEGS, 0, 0, 30), Plan::default());
        assert_eq!(plan(&SEGS, 400, 0, 30), Plan::default());
    }

    #[test]
    fn acknowledged_segments_go_first_and_the_hold_is_passed_only_by_need() {
        // 400 bytes, cap 250: two segments must go; the twin holds from 15.
        assert_eq!(
            plan(&SEGS, 250, 15, 30),
            Plan {
                before: 21,
                past_hold: true
            }
        );
        assert_eq!(
            plan(&SEGS, 300, 15, 30),
            Plan {
                before: 11,
                past_hold: false
            }
        );
        // The twin acknowledged everything: what goes is below its hold,
        // but the segment holding its head frame stays unless forced out.
        assert_eq!(
            plan(&SEGS, 200, 30, 30),
            Plan {
                before: 21,
                past_hold: false
            }
        );
        assert_eq!(
            plan(&SEGS, 100, 30, 30),
            Plan {
                before: 31,
                past_hold: true
            }
        );
    }

    #[test]
    fn the_open_segment_and_unapplied_frames_stay() {
        assert_eq!(plan(&SEGS, 1, 30, 30).before, 31);
        assert_eq!(plan(&SEGS, 1, 30, 15).before, 11);
    }

    #[test]
    fn the_slot_round_trips_and_garbage_holds_nothing() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("TWIN_SLOT");
        assert_eq!(load_slot(&p), 0);
        store_slot(&p, 77).expect("store");
        assert_eq!(load_slot(&p), 77);
        write_file(&StdStorage, &p, b"garbage-garb").expect("write");
        assert_eq!(load_slot(&p), 0);
    }
}
