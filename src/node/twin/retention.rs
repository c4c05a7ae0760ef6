//! Retention on the twin: whole sealed segments go, oldest first, once the
//! log is over its byte cap or a segment is older than the age limit, but
//! only what the twin can spare while still serving a restore:
//!
//! - no frame its store has not applied (the store is fed by the log);
//! - not the segment holding its durable head frame, whose crc proves its
//!   place in the next handshake with the primary and in a restore's Hello
//!   (nor the open segment, which the log never drops);
//! - while a restore is being served, no frame from the first one it asked
//!   for (or the one after the snapshot it was offered).
//!
//! A restore from a twin whose log no longer reaches the box's position
//! starts from the twin's snapshot of its store; a snapshot is taken with
//! the store caught up with the head, whose frame is always kept, so the
//! frames after it are always in the log. The snapshot on offer is kept
//! only while a restore uses it: once the floor passes it and no restore
//! is running it is deleted, so it pins no old data (and holds no copy of
//! dropped bytes) and the next restore takes a fresh one.

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use tokio::sync::watch;

use crate::archive::archiver::Archiver;
use crate::log::{format, Log};
use crate::node::snapshot_transfer::SnapshotSource;
use crate::node::store_host::StoreHost;

/// How long after its last request a restore still pins the frames it
/// needs: a killed restore is rerun within this to resume where it was.
pub const RESTORE_PIN: Duration = Duration::from_secs(600);

/// How often the pass runs.
pub const PASS_EVERY: Duration = Duration::from_millis(500);

/// How much log the twin keeps (`[retention]` in twin.toml).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TwinRetention {
    /// Bytes of log past which the oldest sealed segments go; 0: no cap.
    pub max_bytes: u64,
    /// Sealed segments whose newest frame is older than this go; 0: none.
    pub max_age_secs: u64,
}

impl TwinRetention {
    pub fn is_on(&self) -> bool {
        self.max_bytes > 0 || self.max_age_secs > 0
    }
}

/// One segment as the twin's plan sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SegView {
    pub first: u64,
    pub last: u64,
    pub bytes: u64,
    /// Seconds since its last write (0 when unknown).
    pub age_secs: u64,
}

/// Decide a pass: drop every sealed segment whose last frame is below the
/// answer (0: none). `keep_from` is the lowest frame that must stay.
pub fn twin_plan(segs: &[SegView], r: &TwinRetention, keep_from: u64) -> u64 {
    if !r.is_on() {
        return 0;
    }
    let mut total: u64 = segs.iter().map(|s| s.bytes).sum();
    let mut before = 0;
    let sealed = segs.len().saturating_sub(1);
    for s in &segs[..sealed] {
        let over_cap = r.max_bytes > 0 && total > r.max_bytes;
        let too_old = r.max_age_secs > 0 && s.age_secs > r.max_age_secs;
        if !(over_cap || too_old) || s.last < s.first || s.last >= keep_from {
            break;
        }
        total -= s.bytes;
        before = s.last + 1;
    }
    before
}

/// What the twin's retention shows in status and metrics.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TwinRetentionStatus {
    pub max_bytes: u64,
    pub max_age_secs: u64,
    /// Bytes of log on disk.
    pub log_bytes: u64,
    /// Segments dropped since start.
    pub dropped_segments: u64,
    /// What holds the floor now: "store", "head", "restore" or "" (nothing
    /// to drop).
    pub held_by: String,
    pub last_error: Option<String>,
}

/// The twin's retention: runs its pass off the write path.
pub struct TwinRetainer {
    log: Arc<Log>,
    store: Arc<StoreHost>,
    /// The snapshot offered to restores, when this twin serves them.
    restores: Option<Arc<SnapshotSource>>,
    /// The archive, when on: nothing it lacks is dropped.
    archive: Mutex<Option<Arc<Archiver>>>,
    cfg: TwinRetention,
    status: Mutex<TwinRetentionStatus>,
}

impl TwinRetainer {
    pub fn new(
        log: Arc<Log>,
        store: Arc<StoreHost>,
        restores: Option<Arc<SnapshotSource>>,
        cfg: TwinRetention,
    ) -> Arc<TwinRetainer> {
        Arc::new(TwinRetainer {
            log,
            store,
            restores,
            archive: Mutex::new(None),
            cfg,
            status: Mutex::new(TwinRetentionStatus {
                max_bytes: cfg.max_bytes,
                max_age_secs: cfg.max_age_secs,
                ..TwinRetentionStatus::default()
            }),
        })
    }

    /// Hold retention to what the archive holds.
    pub fn set_archive(&self, archiver: Arc<Archiver>) {
        *self.archive.lock().unwrap_or_else(|e| e.into_inner()) = Some(archiver);
    }

    /// The archive's status, when it is on.
    pub fn archive_status(&self) -> Option<crate::archive::archiver::ArchiveStatus> {
        self.archive().map(|a| a.status())
    }

    fn archive(&self) -> Option<Arc<Archiver>> {
        self.archive
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    pub fn status(&self) -> TwinRetentionStatus {
        let mut s = self
            .status
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        s.log_bytes = self.log.bytes();
        s
    }

    fn segs(&self) -> Vec<SegView> {
        // The wall clock, as the segments' times are.
        let now = SystemTime::UNIX_EPOCH + Duration::from_millis(crate::repl::unix_ms());
        self.log
            .layout()
            .into_iter()
            .map(|(first, last, bytes)| {
                let age_secs = self
                    .log
                    .storage()
                    .modified(&format::segment_path(self.log.dir(), first))
                    .ok()
                    .and_then(|t| now.duration_since(t).ok())
                    .map_or(0, |d| d.as_secs());
                SegView {
                    first,
                    last,
                    bytes,
                    age_secs,
                }
            })
            .collect()
    }

    /// One pass; answers the log's first seq after it.
    pub fn pass(&self) -> Result<u64, crate::log::Error> {
        if !self.cfg.is_on() {
            return Ok(self.log.first_seq());
        }
        // Only what the store recorded as applied may go: a store that
        // reopens after a crash starts from its mark.
        let applied = match self.store.applied_durably() {
            Ok(a) => a,
            Err(e) => {
                tracing::warn!(error = %e, "twin retention waits: the store's applied mark is not known");
                return Ok(self.log.first_seq());
            }
        };
        let head = self.log.head_seq();
        // Frames past `applied` feed the store; the head frame proves the
        // twin's place.
        let mut keep_from = (applied + 1).min(head);
        let mut held_by = if applied < head { "store" } else { "head" };
        if let Some(src) = &self.restores {
            if let Some(from) = src.restore_pinned_from(RESTORE_PIN) {
                if from < keep_from {
                    keep_from = from;
                    held_by = "restore";
                }
            }
        }
        if let Some(a) = self.archive() {
            let archived_below = a.keep_from();
            if archived_below < keep_from {
                keep_from = archived_below;
                held_by = "archive";
            }
        }
        let mut before = twin_plan(&self.segs(), &self.cfg, keep_from);
        if let (Some(a), true) = (self.archive(), before > 0) {
            // Only what the bucket was just seen to hold leaves the box.
            before = a.confirm_drop(before);
        }
        let first = if before > 0 {
            let dropped_from = self.log.layout().len();
            let first = self.log.truncate_before(before)?;
            let dropped = dropped_from.saturating_sub(self.log.layout().len()) as u64;
            let mut st = self.status.lock().unwrap_or_else(|e| e.into_inner());
            st.dropped_segments += dropped;
            first
        } else {
            self.log.first_seq()
        };
        if let Some(src) = &self.restores {
            // An offer no restore uses, whose frames after it are gone,
            // pins nothing: it goes, and the next restore takes a fresh one.
            src.forget_unused_below(first, RESTORE_PIN);
        }
        let mut st = self.status.lock().unwrap_or_else(|e| e.into_inner());
        st.held_by = held_by.into();
        st.last_error = None;
        Ok(first)
    }

    /// Passes every [`PASS_EVERY`], on a blocking thread, until `shutdown`.
    pub async fn run(self: Arc<Self>, mut shutdown: watch::Receiver<bool>) {
        loop {
            tokio::select! {
                _ = tokio::time::sleep(PASS_EVERY) => {}
                _ = shutdown.changed() => return,
            }
            let me = self.clone();
            let done = tokio::task::spawn_blocking(move || me.pass()).await;
            let err = match done {
                Ok(Ok(_)) => continue,
                Ok(Err(e)) => e.to_string(),
                Err(e) => format!("the pass panicked: {e}"),
            };
            tracing::error!(error = %err, "twin retention pass failed");
            self.status
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .last_error = Some(err);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn segs(ages: [u64; 4]) -> Vec<SegView> {
        [(1, 10), (11, 20), (21, 30), (31, 30)]
            .iter()
            .zip(ages)
            .map(|(&(first, last), age_secs)| SegView {
                first,
                last,
                bytes: 100,
                age_secs,
            })
            .collect()
    }

    fn cap(max_bytes: u64, max_age_secs: u64) -> TwinRetention {
        TwinRetention {
            max_bytes,
            max_age_secs,
        }
    }

    #[test]
    fn no_limit_or_under_the_cap_drops_nothing() {
        assert_eq!(twin_plan(&segs([0; 4]), &cap(0, 0), 31), 0);
        assert_eq!(twin_plan(&segs([0; 4]), &cap(400, 0), 31), 0);
    }

    #[test]
    fn over_the_cap_the_oldest_sealed_segments_go_down_to_the_cap() {
        assert_eq!(twin_plan(&segs([0; 4]), &cap(250, 0), 31), 21);
        assert_eq!(twin_plan(&segs([0; 4]), &cap(300, 0), 31), 11);
    }

    #[test]
    fn unapplied_frames_and_the_head_frame_stay_whatever_the_cap() {
        // The store applied through 15: the segment holding 15 stays.
        assert_eq!(twin_plan(&segs([0; 4]), &cap(1, 0), 16), 11);
        // Everything applied, head 30: the segment holding 30 stays, and
        // the open one is never dropped.
        assert_eq!(twin_plan(&segs([0; 4]), &cap(1, 0), 30), 21);
    }

    #[test]
    fn segments_older_than_the_age_go_oldest_first_and_a_young_one_stops_it() {
        assert_eq!(twin_plan(&segs([90, 70, 10, 0]), &cap(0, 60), 31), 21);
        assert_eq!(twin_plan(&segs([90, 10, 70, 0]), &cap(0, 60), 31), 11);
        // Age or cap: either is enough.
        assert_eq!(twin_plan(&segs([90, 10, 10, 0]), &cap(250, 60), 31), 21);
    }
}
