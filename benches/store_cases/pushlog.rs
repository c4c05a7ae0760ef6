//! `pushlog_bytes_per_push*`: what a push of 4 ref updates costs on disk,
//! as one frame (an envelope around a self-contained Arrow IPC stream), and
//! what compaction leaves in the live file.

use std::path::Path;

use twinlog::pushlog::{encode_frame, Finish, Push, PushLog, RefUpdate, ENVELOPE_LEN};

use super::super::common::Line;
use super::super::BENCH;

const REFS_PER_PUSH: usize = 4;

fn push(seq: u64) -> Push {
    let oid = |n: u64| {
        let mut o = [0u8; 20];
        o[..8].copy_from_slice(&n.to_le_bytes());
        o[8..16].copy_from_slice(&(n ^ 0x5555).to_le_bytes());
        o
    };
    Push {
        seq,
        at_ms: 1_700_000_000_000 + seq,
        updates: (0..REFS_PER_PUSH as u64)
            .map(|r| RefUpdate {
                name: format!("refs/heads/feature-{r}"),
                old: (seq > 1).then(|| oid(seq * 8 + r - 8)),
                new: Some(oid(seq * 8 + r)),
            })
            .collect(),
    }
}

pub fn run(root: &Path, pushes: u64) {
    let path = root.join("bench.pushlog");
    let mut log = PushLog::open(&path).expect("open");
    for seq in 1..=pushes {
        log.append(&push(seq)).expect("append");
    }
    let bytes = std::fs::metadata(&path).expect("meta").len();
    let frame_bytes = encode_frame(&push(2)).expect("frame");
    let frame = frame_bytes.len() as f64;
    // After the envelope, the first IPC message is the schema: continuation
    // marker, metadata length, metadata (a schema message has no body).
    let at = ENVELOPE_LEN + 4;
    let meta_len = u32::from_le_bytes([
        frame_bytes[at],
        frame_bytes[at + 1],
        frame_bytes[at + 2],
        frame_bytes[at + 3],
    ]);
    let schema = 8.0 + f64::from(meta_len);
    let envelope = ENVELOPE_LEN as f64;
    let per_push = bytes as f64 / pushes as f64;
    Line::new(BENCH, "pushlog_bytes_per_push", per_push, "bytes")
        .lower_is_better()
        .int("pushes", pushes)
        .int("refs_per_push", REFS_PER_PUSH as u64)
        .num("bytes_per_ref", per_push / REFS_PER_PUSH as f64)
        .num("schema_bytes", schema)
        .num("envelope_bytes", envelope)
        .num("batch_bytes", frame - envelope - schema - 8.0)
        .num("end_of_stream_bytes", 8.0)
        .num("schema_share", schema / frame)
        .print();

    let report = log.compact(Finish::Swap).expect("compact");
    let live = std::fs::metadata(&path).expect("meta").len();
    Line::new(
        BENCH,
        "pushlog_bytes_per_push_compacted",
        live as f64 / pushes as f64,
        "bytes",
    )
    .lower_is_better()
    .baseline("pushlog_bytes_per_push", per_push)
    .int("pushes", pushes)
    .int("live_bytes_before", report.live_bytes_before)
    .int("live_bytes_after", live)
    .int("reflog_archive_bytes", report.archive_bytes)
    .print();
}
