//! What `status` and `/metrics` say of the archive, on either box.

use super::*;
use crate::archive::archiver::ArchiveStatus;

/// The archive's lines of `primary status` and `twin status`.
pub fn render_archive(a: &ArchiveStatus) -> String {
    let role = if a.uploading {
        "this box uploads"
    } else {
        "the other box uploads"
    };
    let mut out = format!(
        "archive: {} ({role}): every frame below {} archived; lag {} segments, {:.1} MiB, {} s\n",
        a.url,
        a.floor,
        a.lag_segments,
        a.lag_bytes as f64 / 1048576.0,
        a.lag_secs
    );
    if let Some(last) = &a.last_upload {
        out.push_str(&format!(
            "archive: last upload {last} at {}; {} segments, {:.1} MiB since start\n",
            utc(a.last_upload_unix_ms),
            a.uploaded_segments,
            a.uploaded_bytes as f64 / 1048576.0
        ));
    }
    if a.erases_pending > 0 {
        out.push_str(&format!(
            "archive: {} erases not yet carried to the archive\n",
            a.erases_pending
        ));
    }
    if a.retention_held {
        out.push_str(&format!(
            "archive: {} objects missing, retention held{}\n",
            a.missing_objects,
            a.missing_first
                .as_ref()
                .map_or(String::new(), |k| format!(" (first: {k})"))
        ));
    }
    if let Some((from, to)) = a.head_gap {
        out.push_str(&format!(
            "archive: frames {from} to {to}, archived as the head record says, are in no object: retention held\n"
        ));
    }
    if let Some(n) = &a.head_note {
        out.push_str(&format!("archive: {n}\n"));
    }
    if let Some(e) = &a.last_error {
        out.push_str(&format!("archive: FAILING, retrying: {e}\n"));
    }
    out
}

/// The archive's metrics.
pub(super) fn archive_metrics(out: &mut String, a: &ArchiveStatus) {
    gauge(
        out,
        "twinlog_archive_uploading",
        "1 on the box that uploads to the archive.",
        u8::from(a.uploading),
    );
    gauge(
        out,
        "twinlog_archive_floor_seq",
        "Every frame below this is archived.",
        a.floor,
    );
    gauge(
        out,
        "twinlog_archive_lag_segments",
        "Sealed segments not yet archived.",
        a.lag_segments,
    );
    gauge(
        out,
        "twinlog_archive_lag_bytes",
        "Bytes of sealed segments not yet archived.",
        a.lag_bytes,
    );
    gauge(
        out,
        "twinlog_archive_lag_seconds",
        "Age of the oldest sealed segment not yet archived.",
        a.lag_secs,
    );
    counter(
        out,
        "twinlog_archive_uploaded_segments_total",
        "Segments uploaded since start.",
        a.uploaded_segments,
    );
    counter(
        out,
        "twinlog_archive_uploaded_bytes_total",
        "Bytes uploaded (as stored) since start.",
        a.uploaded_bytes,
    );
    gauge(
        out,
        "twinlog_archive_erases_pending",
        "Erases applied on this box not yet carried to the archive.",
        a.erases_pending,
    );
    counter(
        out,
        "twinlog_archive_erase_rewrites_total",
        "Archived segments rewritten by erases since start.",
        a.erase_rewrites,
    );
    gauge(
        out,
        "twinlog_archive_last_upload_unix_ms",
        "When the last segment was uploaded (0: none since start).",
        a.last_upload_unix_ms,
    );
    gauge(
        out,
        "twinlog_archive_missing_objects",
        "Archived objects this box recorded that the bucket no longer holds as recorded.",
        a.missing_objects,
    );
    gauge(
        out,
        "twinlog_archive_retention_held",
        "1 while retention drops nothing because archived objects are missing.",
        u8::from(a.retention_held),
    );
    counter(
        out,
        "twinlog_archive_missing_found_total",
        "Archived objects found gone or changed since start.",
        a.missing_found,
    );
    counter(
        out,
        "twinlog_archive_drop_heads_total",
        "HEAD requests made to confirm objects before segments were dropped.",
        a.drop_heads,
    );
    counter(
        out,
        "twinlog_archive_drop_confirmed_segments_total",
        "Segments a HEAD of their objects let leave the box.",
        a.drop_confirmed_segments,
    );
    gauge(
        out,
        "twinlog_archive_head_seq",
        "How far the archive's head record says the archive reached (0: no record).",
        a.head_last,
    );
    gauge(
        out,
        "twinlog_archive_head_gap_frames",
        "Frames the head record names archived that no object holds.",
        a.head_gap.map_or(0, |(from, to)| to + 1 - from),
    );
    gauge(
        out,
        "twinlog_archive_head_mismatch",
        "1 while the bucket's head record is not the one this box recorded (rolled back, gone, unreadable).",
        u8::from(a.head_note.is_some()),
    );
    gauge(
        out,
        "twinlog_archive_failing",
        "1 while the last upload or listing failed.",
        u8::from(a.last_error.is_some()),
    );
}
