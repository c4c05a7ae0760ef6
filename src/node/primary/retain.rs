//! The primary's retention: the twin's position held, the cap applied,
//! segments dropped by hand, and the snapshot on offer kept.

use std::sync::Arc;
use std::time::Duration;

use super::Primary;
use crate::archive::archiver::Archiver;
use crate::node::api::ApiError;
use crate::node::retention::{self, Retention};
use crate::node::snapshot_transfer::SnapshotSource;
use crate::node::WriteRefusal;

/// Why a retention pass stopped.
#[derive(Debug, thiserror::Error)]
pub(super) enum RetentionError {
    #[error(transparent)]
    Store(#[from] crate::store::StoreError),
    #[error(transparent)]
    Log(#[from] crate::log::Error),
}

impl Primary {
    /// Set the retention before serving; the twin's position comes back
    /// from the slot file.
    pub fn set_retention(&self, r: Retention) {
        if let Some(slot) = &r.slot {
            let held = retention::load_slot(slot);
            self.hold.store(held, std::sync::atomic::Ordering::SeqCst);
            self.slot_written
                .store(held, std::sync::atomic::Ordering::SeqCst);
            tracing::info!(
                hold = held,
                cap = r.max_bytes,
                "retention holds the twin's position"
            );
        }
        *self.retention.lock().unwrap_or_else(|e| e.into_inner()) = r;
    }

    /// Offer snapshots to a twin below the floor.
    pub fn set_snapshots(&self, source: Arc<SnapshotSource>) {
        *self.snapshots.lock().unwrap_or_else(|e| e.into_inner()) = Some(source);
    }

    /// Hold retention to what the archive holds.
    pub fn set_archive(&self, archiver: Arc<Archiver>) {
        *self.archive.lock().unwrap_or_else(|e| e.into_inner()) = Some(archiver);
    }

    pub fn archive(&self) -> Option<Arc<Archiver>> {
        self.archive
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Every frame below this is archived, or `u64::MAX` without an
    /// archive.
    fn archived_below(&self) -> u64 {
        self.archive().map_or(u64::MAX, |a| a.keep_from())
    }

    pub(super) fn snapshot_source(&self) -> Option<Arc<SnapshotSource>> {
        self.snapshots
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    pub(super) fn retention(&self) -> Retention {
        self.retention
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    pub(super) fn hold(&self) -> u64 {
        self.hold.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Whether the frame at the twin's position is gone.
    pub(super) fn twin_below_floor(&self) -> bool {
        let first = self.log.first_seq();
        match self.hold() {
            0 => first > 1,
            hold => hold < first,
        }
    }

    /// One retention pass: the store catches up (nothing it has not
    /// applied goes), then whole segments go while the log is over its cap.
    pub(super) fn retention_pass(&self) -> Result<(), RetentionError> {
        let r = self.retention();
        if let Some(slot) = &r.slot {
            // Written when the twin's position moved, not every pass.
            let hold = self.hold();
            let seq_cst = std::sync::atomic::Ordering::SeqCst;
            if self.slot_written.load(seq_cst) != hold {
                match retention::store_slot(slot, hold) {
                    Ok(()) => self.slot_written.store(hold, seq_cst),
                    Err(e) => {
                        tracing::warn!(error = %e, "the twin's slot file could not be written")
                    }
                }
            }
        }
        if r.max_bytes == 0 {
            return Ok(());
        }
        let applied = match &self.store {
            Some(host) => {
                host.catch_up()?;
                host.applied_durably()?
            }
            None => self.log.head_seq(),
        };
        let mut hold = self.hold();
        if let Some(source) = self.snapshot_source() {
            match source.offered_at() {
                // The twin installed it and moved on.
                Some(at) if hold > at => source.forget(),
                // Its frame proves the twin's place once it is installed.
                Some(at) => hold = hold.min(at),
                None => {}
            }
        }
        // What the archive lacks stays, as what the store lacks does.
        let applied = applied.min(self.archived_below().saturating_sub(1));
        let plan = retention::plan(&self.log.layout(), r.max_bytes, hold.max(1), applied);
        if plan.before == 0 {
            return Ok(());
        }
        // Only what the bucket was just seen to hold leaves the box.
        let before = self
            .archive()
            .map_or(plan.before, |a| a.confirm_drop(plan.before));
        let first = self.log.truncate_before(before)?;
        if plan.past_hold {
            tracing::warn!(
                first, twin_position = hold, cap = r.max_bytes,
                "retention passed the twin's position: the twin is below the floor and needs a snapshot"
            );
        }
        Ok(())
    }

    /// Retain from `seq` by hand.
    pub fn retain_from(&self, seq: u64, force: bool) -> Result<u64, ApiError> {
        let hold = self.hold().max(1);
        if seq > hold && !force {
            return Err(ApiError::Refused(WriteRefusal::TwinNotPast {
                seq,
                twin_at: hold,
            }));
        }
        if let Some(host) = &self.store {
            host.catch_up().map_err(ApiError::from)?;
            let applied = host.applied_durably().map_err(ApiError::from)?;
            if seq > applied + 1 {
                return Err(ApiError::Refused(WriteRefusal::StoreNotPast { applied }));
            }
        }
        let archived_below = self.archived_below();
        if seq > archived_below {
            return Err(ApiError::Refused(WriteRefusal::ArchiveNotPast {
                archived_below,
            }));
        }
        if let Some(a) = self.archive() {
            // Every segment the retain drops, its objects seen just now.
            let drops_below = self
                .log
                .layout()
                .iter()
                .filter(|s| s.1 < seq)
                .map(|s| s.1 + 1)
                .max()
                .unwrap_or(0);
            let confirmed = a.confirm_drop(seq);
            if confirmed < drops_below {
                return Err(ApiError::Refused(WriteRefusal::ArchiveNotPast {
                    archived_below: confirmed,
                }));
            }
        }
        let first = self
            .log
            .retain_from(seq)
            .map_err(|e| ApiError::Refused(e.into()))?;
        tracing::warn!(seq, first, force, "retained from a sequence by hand");
        Ok(first)
    }

    /// Retention passes, twice a second, off the async threads.
    pub(super) async fn retain_loop(self: Arc<Self>) {
        loop {
            tokio::time::sleep(Duration::from_millis(500)).await;
            let me = self.clone();
            match tokio::task::spawn_blocking(move || me.retention_pass()).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => tracing::error!(error = %e, "retention pass failed"),
                Err(e) => tracing::error!(error = %e, "retention pass panicked"),
            }
        }
    }
}
