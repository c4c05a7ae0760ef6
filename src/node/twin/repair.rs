//! What a session can end in besides a reconnect: fetching and installing
//! the primary's snapshot when this log is below its retention floor, and
//! cutting the frames a crashed primary lost before they were durable.

use std::sync::Arc;
use std::time::Duration;

use quinn::Connection;

use super::ended::{CutError, Ended};
use super::{Twin, TwinSnapshots};
use crate::node::snapshot_transfer as snapshot;
use crate::store::install;

impl Twin {
    /// Fetch the primary's snapshot over `conn` (resuming a staged one),
    /// install it and restart the log after it.
    pub(super) async fn take_snapshot(&self, conn: &Connection, s: &Arc<TwinSnapshots>) -> Ended {
        let mut last_report = crate::node::clock::instant();
        let status = &self.status;
        let mut progress = |held: u64, total: u64| {
            if let Ok(mut st) = status.lock() {
                st.snapshot_held = held;
                st.snapshot_total = total;
            }
            if last_report.elapsed() > Duration::from_secs(2) {
                last_report = crate::node::clock::instant();
                tracing::info!(held, total, "fetching the snapshot");
            }
        };
        let fetched =
            match snapshot::fetch_with(self.log.storage(), conn, &s.paths, &mut progress).await {
                Ok(f) => f,
                Err(e) => return Ended::SnapshotFetch(e),
            };
        tracing::info!(
            total = fetched.total,
            received = fetched.received,
            reused = fetched.reused,
            "snapshot fetched; installing"
        );
        let s2 = s.clone();
        let installed =
            tokio::task::spawn_blocking(move || s2.store.install_snapshot(&s2.paths, None)).await;
        match installed {
            Ok(Ok(at)) => {
                let base = install::read_base_with(&**self.log.storage(), &s.paths.base())
                    .ok()
                    .flatten();
                *self.base.lock().unwrap_or_else(|e| e.into_inner()) = base;
                self.durable.send_replace(self.log.head_seq());
                self.set_status(|st| {
                    st.snapshots_installed += 1;
                    st.snapshot_at = at;
                    st.below_floor = false;
                });
                Ended::SnapshotInstalled { at }
            }
            Ok(Err(e)) => {
                // A staged snapshot that does not check is fetched anew.
                if matches!(e, crate::store::StoreError::BadSnapshot { .. }) {
                    let _ = self.log.storage().remove_dir_all(&s.paths.staging());
                }
                Ended::SnapshotInstall(e)
            }
            Err(e) => Ended::SnapshotInstallStopped(e),
        }
    }

    /// The primary lost this log's frames past `after` in a crash, before
    /// they were durable there, so they were never acknowledged: check the
    /// frame at `after` against the primary's `crc`, save the frames past
    /// it (under the data directory's `divergent/`, as a rejoin does), move
    /// the store back to `after`, and cut them.
    pub(super) async fn cut_lost(&self, after: u64, crc: Option<u32>) -> Result<String, CutError> {
        let log = self.log.clone();
        let base = *self.base.lock().unwrap_or_else(|e| e.into_inner());
        let snapshots = self.snapshots();
        let store = self.store();
        let epoch = self.epochs.newest();
        let primary = self.primary.to_string();
        let cut = tokio::task::spawn_blocking(move || -> Result<String, CutError> {
            let head = log.head_seq();
            if after >= head {
                return Ok(format!("nothing past {after} to cut"));
            }
            if let Some(theirs) = crc {
                let here = install::crc_of_frame(&log, base.as_ref(), after)
                    .map_err(|error| CutError::Unreadable { after, error })?;
                let erased = log.locate_blob(after).is_ok_and(|l| l.is_erased());
                if here != theirs && !erased {
                    return Err(CutError::NotThePrimarys { after, here, theirs });
                }
            }
            let saved = match &snapshots {
                Some(s) => {
                    let tail = crate::node::divergent::Tail {
                        log: &log,
                        fork: after,
                        epoch,
                        new_epoch: epoch,
                        primary,
                    };
                    let (_, path) = crate::node::divergent::save(&s.paths.data, &tail)
                        .map_err(|error| CutError::Save {
                            from: after + 1,
                            head,
                            error,
                        })?;
                    path.display().to_string()
                }
                None => "nowhere (no data directory)".into(),
            };
            let truncate = || log.truncate_after(after);
            let moved = match &store {
                Some(host) => host
                    .rewound_for_cut(after, truncate)
                    .map_err(CutError::Store)?
                    .0,
                None => {
                    truncate().map_err(CutError::Log)?;
                    None
                }
            };
            Ok(format!(
                "cut frames {}..={head}, which the primary lost before they were durable there (saved {saved}; store moved back from {moved:?})",
                after + 1
            ))
        })
        .await
        .map_err(CutError::Stopped)??;
        tracing::warn!(after, "{cut}");
        self.durable.send_replace(self.log.head_seq());
        Ok(cut)
    }
}
