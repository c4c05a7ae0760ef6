//! The archive on a serving box: the uploader on the box `[archive]`
//! names (the twin unless told), a watcher of the bucket on the other; on
//! both, what retention may drop is what the bucket holds.

use super::config::{ArchiveSection, Uploader};
use super::*;
use crate::archive::archiver::{Archiver, EpochsOf};

/// The epochs that wrote this box's log, as the archiver names segments.
pub(super) fn epochs_of(epochs: &Arc<Epochs>) -> EpochsOf {
    let epochs = epochs.clone();
    Arc::new(move || epochs.history().starts().to_vec())
}

/// Start the archive's thread when `[archive]` is set: uploading when
/// this box is the one `uploader` names (`serving_as`), watching the
/// bucket otherwise.
pub(super) fn start_archive(
    section: Option<&ArchiveSection>,
    data_dir: &Path,
    log: &Arc<Log>,
    epochs: &Arc<Epochs>,
    store: &Arc<crate::node::store_host::StoreHost>,
    serving_as: Uploader,
    shutdown: &watch::Receiver<bool>,
) -> Result<Option<Arc<Archiver>>, DaemonError> {
    let Some(section) = section else {
        return Ok(None);
    };
    let settings = section
        .settings(data_dir)
        .map_err(DaemonError::ArchiveSetup)?;
    let uploading = section.uploader == serving_as;
    let archiver = if uploading {
        Archiver::new(log.clone(), settings, epochs_of(epochs))
    } else {
        Archiver::watcher(log.clone(), settings, epochs_of(epochs))
    };
    archiver
        .remember_head_in(data_dir)
        .map_err(|e| DaemonError::ArchiveSetup(e.to_string()))?;
    archiver.carry_erases(Arc::new(crate::archive::erase::EraseQueue::at(data_dir)));
    if uploading {
        archiver.archive_snapshots(crate::archive::archiver::StoreSnapshots {
            host: store.clone(),
            every_bytes: section.snapshot_every_mib.saturating_mul(1 << 20),
            base_file: data_dir.join(crate::layout::BASE_FILE),
            scratch: data_dir.join(crate::archive::snapshot::SCRATCH_DIR),
        });
    }
    archiver.spawn(shutdown.clone())?;
    tracing::info!(url = %section.url, uploading, "archive on");
    Ok(Some(archiver))
}
