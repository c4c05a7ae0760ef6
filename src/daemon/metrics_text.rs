//! The `/metrics` text: gauges and counters of the log, the store and the
//! twin's retention.

use super::*;

/// `twinlog_role{role="..."} 1`: which daemon this box runs.
pub(super) fn role_metrics(out: &mut String, role: &str) {
    out.push_str(&format!(
        "# HELP twinlog_role The role this box serves in (1 for its role).\n# TYPE twinlog_role gauge\ntwinlog_role{{role=\"{role}\"}} 1\n"
    ));
}

pub(super) fn gauge(out: &mut String, name: &str, help: &str, value: impl std::fmt::Display) {
    out.push_str(&format!(
        "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {value}\n"
    ));
}

pub(super) fn counter(out: &mut String, name: &str, help: &str, value: impl std::fmt::Display) {
    out.push_str(&format!(
        "# HELP {name} {help}\n# TYPE {name} counter\n{name} {value}\n"
    ));
}

/// What clients hold and were refused, on a primary.
pub(super) fn client_metrics(out: &mut String, s: &crate::node::Status) {
    gauge(
        out,
        "twinlog_client_connections",
        "Client connections served now.",
        s.client_connections,
    );
    gauge(
        out,
        "twinlog_memory_held_bytes",
        "Bytes of the memory budget clients' requests hold now.",
        s.memory_held,
    );
    gauge(
        out,
        "twinlog_staging_held_bytes",
        "Bytes of staging space bodies hold now.",
        s.staging_held,
    );
    counter(
        out,
        "twinlog_unpinned_handshakes_total",
        "Handshakes refused because the certificate is not pinned.",
        s.unpinned_refused,
    );
    let name = "twinlog_client_refusals_total";
    out.push_str(&format!(
        "# HELP {name} What clients were refused, by the refusal's name.\n# TYPE {name} counter\n"
    ));
    for (refusal, n) in &s.refusals {
        out.push_str(&format!("{name}{{refusal=\"{refusal}\"}} {n}\n"));
    }
}

/// A store's health as metrics named `{prefix}_…`.
pub(super) fn store_metrics(
    out: &mut String,
    prefix: &str,
    whose: &str,
    h: &crate::repl::StoreHealth,
) {
    gauge(
        out,
        &format!("{prefix}_applied_seq"),
        &format!("{whose}: the seq applied up to."),
        h.applied,
    );
    gauge(
        out,
        &format!("{prefix}_stalled"),
        &format!("{whose}: 1 while stopped at a frame that does not apply."),
        u8::from(h.stalled.is_some()),
    );
    gauge(
        out,
        &format!("{prefix}_stalled_seq"),
        &format!("{whose}: the frame it is stopped at (0: none)."),
        h.stalled.as_ref().map_or(0, |s| s.seq),
    );
    counter(
        out,
        &format!("{prefix}_skipped_total"),
        &format!("{whose}: frames skipped by StoreSkip frames."),
        h.skipped,
    );
}

/// The metrics every daemon's log has.
pub(super) fn log_metrics(log: &Log) -> String {
    let mut out = String::new();
    gauge(
        &mut out,
        "twinlog_head_seq",
        "The newest durable sequence.",
        log.head_seq(),
    );
    gauge(
        &mut out,
        "twinlog_first_seq",
        "The oldest retained sequence.",
        log.first_seq(),
    );
    gauge(
        &mut out,
        "twinlog_log_bytes",
        "Bytes of the log on disk.",
        log.bytes(),
    );
    counter(
        &mut out,
        "twinlog_frame_syncs_total",
        "fdatasyncs that made frames durable.",
        log.frame_syncs(),
    );
    gauge(
        &mut out,
        "twinlog_log_poisoned",
        "1 once a failed write or fsync stopped the log taking writes, until a restart.",
        u8::from(log.poisoned_by().is_some()),
    );
    stall_metrics(&mut out, log);
    out
}

/// What a slow round waits on: the disk's syncs, the writer lock, and the
/// page cache's bytes still to reach the disk.
pub(super) fn stall_metrics(out: &mut String, log: &Log) {
    log.sync_time().render(
        out,
        "twinlog_log_sync_seconds",
        "Time per fdatasync of the log (and fsync of a segment sealed at a roll).",
    );
    log.writer_wait().render(
        out,
        "twinlog_log_writer_lock_wait_seconds",
        "Time waiting for the log's writer lock on the write path (a streaming entry holds it whole).",
    );
    if let Some((dirty, writeback)) = crate::metrics::dirty_and_writeback() {
        gauge(
            out,
            "twinlog_dirty_bytes",
            "Dirty in /proc/meminfo: page-cache bytes not yet written to disk.",
            dirty,
        );
        gauge(
            out,
            "twinlog_writeback_bytes",
            "Writeback in /proc/meminfo: bytes being written to disk now.",
            writeback,
        );
    }
}

/// The twin's retention as metrics.
pub(super) fn twin_retention_metrics(
    out: &mut String,
    r: &crate::node::twin_retention::TwinRetentionStatus,
) {
    gauge(
        out,
        "twinlog_retention_max_bytes",
        "The log's byte cap (0: none).",
        r.max_bytes,
    );
    gauge(
        out,
        "twinlog_retention_max_age_seconds",
        "The age past which sealed segments go (0: none).",
        r.max_age_secs,
    );
    counter(
        out,
        "twinlog_retention_dropped_segments_total",
        "Segments retention dropped since start.",
        r.dropped_segments,
    );
    gauge(
        out,
        "twinlog_retention_failing",
        "1 while the last retention pass failed.",
        u8::from(r.last_error.is_some()),
    );
}
