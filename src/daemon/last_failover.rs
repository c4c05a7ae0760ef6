//! The last failover a box went through as the new primary, kept in its
//! data directory (`LAST_FAILOVER`, JSON) because the role changes in a
//! new program image: the twin notes it began when it stops following,
//! and the first primary life that serves completes it. Wall-clock times,
//! as the two halves are in different processes: a figure for `status`,
//! which no decision reads.

use std::path::Path;
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

use crate::node::failover::last::{FailoverCause, LastFailover};

/// The file in the data directory.
pub const LAST_FAILOVER_FILE: &str = "LAST_FAILOVER";

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
struct Kept {
    /// Begun and not yet served: why, and since when (ms since the Unix
    /// epoch).
    pending: Option<(FailoverCause, u64)>,
    last: Option<LastFailover>,
}

/// What this process shows.
static SHOWN: Mutex<Option<LastFailover>> = Mutex::new(None);

fn read(dir: &Path) -> Kept {
    std::fs::read(dir.join(LAST_FAILOVER_FILE))
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default()
}

fn write(dir: &Path, kept: &Kept) {
    let path = dir.join(LAST_FAILOVER_FILE);
    let written = serde_json::to_vec(kept)
        .map_err(std::io::Error::other)
        .and_then(|b| crate::publish::publish_hint(&path, &b));
    if let Err(e) = written {
        tracing::warn!(error = %e, path = %path.display(), "the last failover is not kept: status will not show it");
    }
}

fn show(last: Option<LastFailover>) {
    *SHOWN.lock().unwrap_or_else(|e| e.into_inner()) = last;
}

/// This box is becoming the primary for `cause`; the old primary was last
/// known to lead `ago` before now.
pub fn began(dir: &Path, cause: FailoverCause, ago: std::time::Duration) {
    let mut kept = read(dir);
    let since = crate::clock::unix_ms().saturating_sub(ago.as_millis() as u64);
    kept.pending = Some((cause, since));
    write(dir, &kept);
}

/// A primary life of `epoch` serves from `dir`: a failover begun is
/// complete. Either way, what the directory keeps is what status shows.
pub fn served(dir: &Path, epoch: u64) {
    let mut kept = read(dir);
    if let Some((cause, since)) = kept.pending.take() {
        let now = crate::clock::unix_ms();
        let done = LastFailover {
            epoch,
            cause,
            took_ms: now.saturating_sub(since),
            at_unix_ms: now,
        };
        tracing::warn!(epoch = %crate::repl::epochs::EpochName(epoch), cause = cause.name(), took_ms = done.took_ms, "failover complete: serving as the primary");
        kept.last = Some(done);
        write(dir, &kept);
    }
    show(kept.last);
}

/// A twin serving from `dir` shows the last failover it went through.
pub fn load(dir: &Path) {
    show(read(dir).last);
}

/// The last failover completed, as this process shows it.
pub fn last() -> Option<LastFailover> {
    SHOWN.lock().unwrap_or_else(|e| e.into_inner()).clone()
}

/// Its status line.
pub fn render(f: &LastFailover) -> String {
    format!(
        "last failover: epoch {}, {} ms, at {} ms since the Unix epoch: {}\n",
        crate::repl::epochs::EpochName(f.epoch),
        f.took_ms,
        f.at_unix_ms,
        f.cause.said()
    )
}

/// Its metrics.
pub fn metrics(out: &mut String, f: &LastFailover) {
    use super::metrics_text::gauge;
    gauge(
        out,
        "twinlog_last_failover_seconds",
        "How long the last failover this box went through took, from the old primary last known to lead to this box serving.",
        f.took_ms as f64 / 1000.0,
    );
    gauge(
        out,
        "twinlog_last_failover_epoch",
        "The epoch the last failover this box went through began.",
        f.epoch,
    );
    gauge(
        out,
        "twinlog_last_failover_unix_seconds",
        "When the last failover this box went through completed.",
        f.at_unix_ms as f64 / 1000.0,
    );
    out.push_str(&format!(
        "# HELP twinlog_last_failover_info The cause of the last failover this box went through.\n# TYPE twinlog_last_failover_info gauge\ntwinlog_last_failover_info{{cause=\"{}\"}} 1\n",
        f.cause.name()
    ));
}
