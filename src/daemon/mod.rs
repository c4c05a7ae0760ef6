//! What the `primary` and `twin` binaries do, as a library: `init` mints a
//! key and certificate and writes a commented configuration, `serve` runs a
//! daemon until SIGTERM, `status` asks a running one.
//!
//! What a data directory holds is in [`crate::layout`]. The files, by job:
//! `setup` (init, identity, pins), `serve` with `serve_primary` and
//! `serve_twin` (running a daemon), `status_text` and `metrics_text` (what
//! it reports), `check` (`check-log`), `error` (errors and exit codes),
//! `failover` (promote, rejoin, switchover), `auto_failover` (the same
//! under an etcd arbiter), `config` (the TOML files).
//! The items of the child modules below are re-exported here; the imports
//! here are theirs (`use super::*`).

pub mod allocator;
pub mod auto_failover;
pub mod config;
pub mod failover;
pub mod held_start;
pub mod http;
pub mod load;
pub mod notify;
pub mod runtime;

use std::fs::OpenOptions;
use std::io::Write;
use std::net::SocketAddr;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio::sync::watch;

use crate::log::{Log, OpenOptions as LogOptions};
use crate::net::{self, Fingerprint, Identity, NetError, Pins, Role, TlsError};
use crate::node::api::ClientRole;
use crate::node::epoch::Epochs;
use crate::node::{ClientError, Primary, PrimaryOptions, Twin, TwinOptions};
pub use config::{Address, ConfigError, PrimaryConfig, TwinConfig};
pub use config::{AsPrimarySection, TwinRetentionSection};

pub use crate::layout::{
    ADMIN_DIR, CERT_FILE, KEY_FILE, LOG_DIR, PRIMARY_CONFIG, SNAPSHOTS_DIR, STORE_DIR, TWIN_CONFIG,
    TWIN_SLOT,
};

mod arbiter_text;
mod archive;
mod archive_push;
mod archive_text;
mod check;
mod error;
pub mod last_failover;
mod metrics_text;
mod restoring;
mod serve;
mod serve_primary;
mod serve_twin;
mod setup;
mod status_text;

use arbiter_text::{primary_arbiter_metrics, twin_arbiter_metrics};
pub use arbiter_text::{render_primary_arbiter, render_twin_arbiter};
pub use archive_push::archive_push;
use archive_text::archive_metrics;
pub use archive_text::render_archive;
pub use check::*;
pub use error::*;
use metrics_text::*;
pub use restoring::{abandon_restore, Abandoned};
pub use serve::*;
pub use serve_primary::*;
pub use serve_twin::*;
pub use setup::*;
pub use status_text::*;
