//! The names in a data directory, in one leaf module that every layer may
//! read (the log, the store, the node and the daemons), so that none of
//! them reaches into another for a file name.
//!
//! A data directory holds:
//! - `cert.pem` and `key.pem` (0600): the box's identity;
//! - `primary.toml` or `twin.toml`: what `init` wrote, which the daemon
//!   serves with;
//! - `admin/` on a primary: the local admin client's identity;
//! - `log/`: the log (`docs/FORMAT.md`), and beside it `EPOCHS`, the
//!   epochs this box served or heard of (`EPOCH` in older directories);
//! - `store/`: the store the log feeds;
//! - `TWIN_SLOT` on a primary: the twin's position its retention holds;
//! - `snapshots/` on a primary: the snapshot a twin below the floor gets;
//! - `snapshot.staging/`, `SNAPSHOT_INSTALL` and `SNAPSHOT_BASE`: a
//!   snapshot being received, the install's intent, and the position the
//!   log restarted after;
//! - `divergent/`: tails a rejoin saved before it cut them;
//! - `HEARD_PRIMARY` on a twin: when it last heard its primary, which
//!   `twin promote` reads;
//! - `PREDECESSOR` on a promoted box: the primary it replaced, which it
//!   calls until it is heard;
//! - `ARCHIVE_ERASES` with an archive: the erases the archive has yet to
//!   see, `archive-erase.scratch` while one rewrites a segment, and
//!   `archive-snapshot.scratch/` while a store snapshot is archived;
//! - `ARBITER` under `[failover]`: what the box remembers of etcd;
//! - `RELEASE`: an operator's release of a held primary, until it is
//!   taken; `CLEAN_STOP`: the primary stopped cleanly;
//! - `RESTORING`, `RESTORE_PARTIAL`, `restore.partial` and
//!   `restore.partial.json` while a restore fills the directory.

pub const CERT_FILE: &str = "cert.pem";
pub const KEY_FILE: &str = "key.pem";
pub const ADMIN_DIR: &str = "admin";
pub const PRIMARY_CONFIG: &str = "primary.toml";
pub const TWIN_CONFIG: &str = "twin.toml";
/// The log's directory.
pub const LOG_DIR: &str = "log";
/// The store's directory.
pub const STORE_DIR: &str = "store";
/// The epochs, beside the log (JSON, see `docs/FORMAT.md`).
pub const EPOCHS_FILE: &str = "EPOCHS";
/// The single epoch number older data directories kept.
pub const LEGACY_EPOCH_FILE: &str = "EPOCH";
/// The twin's position the primary's retention holds, across restarts.
pub const TWIN_SLOT: &str = "TWIN_SLOT";
/// A file older builds kept on a primary (the head it restarted at); the
/// epoch history says it now, and a primary removes it when it starts.
pub const RESTART_FLOOR: &str = "RESTART_FLOOR";
/// Snapshots a primary offers to a twin below its floor.
pub const SNAPSHOTS_DIR: &str = "snapshots";
/// A snapshot being received.
pub const STAGING_DIR: &str = "snapshot.staging";
/// The install intent.
pub const INTENT_FILE: &str = "SNAPSHOT_INSTALL";
/// The position the box's log restarted after.
pub const BASE_FILE: &str = "SNAPSHOT_BASE";
/// The directory of saved tails.
pub const DIVERGENT_DIR: &str = "divergent";
/// When a twin last heard its primary (ms since the Unix epoch, text).
pub const HEARD_PRIMARY_FILE: &str = "HEARD_PRIMARY";
/// The primary a promoted box replaced and whether it heard of it (JSON).
pub const PREDECESSOR_FILE: &str = "PREDECESSOR";
/// What this box remembers of the arbiter (JSON): the cluster
/// generation, the newest epoch and revision it read there.
pub const ARBITER_FILE: &str = "ARBITER";
/// An operator's word to a held primary (`primary release`, JSON).
pub const RELEASE_FILE: &str = "RELEASE";
/// Written when a primary stopped cleanly (its epoch): its next start
/// serves at once, where one after a crash starts held.
pub const CLEAN_STOP_FILE: &str = "CLEAN_STOP";
/// This box's record of the archive's head record (JSON): how far it
/// knows the archive reached, so that a head the bucket lost or rolled
/// back while the box was down is found at its next start.
pub const ARCHIVE_HEAD_FILE: &str = "ARCHIVE_HEAD";
/// Marks a data directory a restore is filling; no daemon serves it.
pub const RESTORING_FILE: &str = "RESTORING";
/// The marker's line naming what the restore reads from.
pub const RESTORING_FROM: &str = "from: ";

/// The marker's text: a restore fills the box, from `from` as the
/// command line says it (`--from-archive URL`, `--twin ADDR ...`), which
/// is what `serve` names to finish it.
pub fn restoring_marker(from: &str) -> Vec<u8> {
    format!("a restore is filling this box\n{RESTORING_FROM}{from}\n").into_bytes()
}
/// Where the entry being written is, and how much of it, updated as it
/// streams.
pub const PARTIAL_FILE: &str = "RESTORE_PARTIAL";
/// Salvaged bytes of that entry, and what they are.
pub const SALVAGE_FILE: &str = "restore.partial";
pub const SALVAGE_META: &str = "restore.partial.json";
