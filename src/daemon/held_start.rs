//! A primary's start after a crash, without an arbiter: it may have been
//! deposed while it was down (its twin promoted by hand), so it starts
//! held until its twin says hello at its epoch
//! ([`crate::node::epoch::HELD_FOR_HELLO`]). A clean stop (SIGTERM)
//! leaves `CLEAN_STOP`, and the next start serves at once; so does an
//! operator's `primary release`, saying what it risks.
//!
//! `RELEASE` also carries the other release, under an arbiter that
//! forgot: `--arbiter-lost --epoch-above N`, the floor an operator names
//! who knows the other box is gone for good.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::layout::{CLEAN_STOP_FILE, RELEASE_FILE};
use crate::node::epoch::{Epochs, HELD_FOR_HELLO};
use crate::storage::{remove_if_exists, StdStorage, Storage};

/// `RELEASE`: an operator's word, until the daemon takes it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Release {
    /// With `--arbiter-lost`: lead above this epoch without the other
    /// box's history.
    #[serde(default)]
    pub arbiter_lost_above: Option<u64>,
    /// When it was said, ms since the Unix epoch.
    #[serde(default)]
    pub at_ms: u64,
}

/// The release waiting in `dir`, if any (one that does not parse is
/// none, and said).
pub fn pending(dir: &Path) -> Option<Release> {
    let bytes = StdStorage.read(&dir.join(RELEASE_FILE)).ok()?;
    match serde_json::from_slice(&bytes) {
        Ok(r) => Some(r),
        Err(e) => {
            tracing::warn!(error = %e, "RELEASE does not parse: ignored");
            None
        }
    }
}

/// Write `release` durably into `dir`.
pub fn say(dir: &Path, release: &Release) -> std::io::Result<()> {
    let bytes = serde_json::to_vec_pretty(release).map_err(std::io::Error::other)?;
    crate::publish::publish_with(&StdStorage, &dir.join(RELEASE_FILE), &bytes)
}

/// The release was acted on.
pub fn taken(dir: &Path) -> std::io::Result<()> {
    let path = dir.join(RELEASE_FILE);
    if remove_if_exists(&StdStorage, &path)? {
        crate::publish::sync_parent_with(&StdStorage, &path)?;
    }
    Ok(())
}

/// The primary stopped cleanly, serving `epoch`: its next start serves at
/// once.
pub fn stopped_cleanly(dir: &Path, epoch: u64) -> std::io::Result<()> {
    crate::publish::publish_with(
        &StdStorage,
        &dir.join(CLEAN_STOP_FILE),
        epoch.to_string().as_bytes(),
    )
}

/// Whether the last run stopped cleanly at the epoch the box holds; the
/// mark is removed (durably) either way, so a crash from here on counts.
fn took_clean_stop(dir: &Path, epochs: &Epochs) -> std::io::Result<bool> {
    let path = dir.join(CLEAN_STOP_FILE);
    let clean = match StdStorage.read(&path) {
        Ok(b) => std::str::from_utf8(&b)
            .ok()
            .and_then(|t| t.trim().parse::<u64>().ok())
            .is_some_and(|e| e == epochs.current()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(e),
    };
    if remove_if_exists(&StdStorage, &path)? {
        crate::publish::sync_parent_with(&StdStorage, &path)?;
    }
    Ok(clean)
}

/// Before a primary without an arbiter begins its life: whether it
/// starts held. Not when it has no twin (nothing can replace it), never
/// served (a fresh box), was just promoted (its epoch is the newest: no
/// process served it yet), stopped cleanly, or an operator released it.
pub fn start(dir: &Path, epochs: &Epochs, has_twin: bool) -> std::io::Result<bool> {
    let clean = took_clean_stop(dir, epochs)?;
    let st = epochs.state();
    if !has_twin || st.current() == 0 || st.unserved || clean {
        return Ok(false);
    }
    if let Some(r) = pending(dir) {
        if r.arbiter_lost_above.is_none() {
            taken(dir)?;
            tracing::warn!(
                "released by the operator (`primary release`): serving without the twin's hello"
            );
            return Ok(false);
        }
    }
    let held = epochs.hold(HELD_FOR_HELLO)?;
    if held {
        tracing::warn!(
            "this primary did not stop cleanly: held until its twin says hello at its epoch (`primary release` serves without it)"
        );
    }
    Ok(held)
}

/// While this primary is held for its twin's hello: lift the hold when
/// an operator says `primary release`. Ends once the hold is gone.
pub async fn watch_release(dir: std::path::PathBuf, epochs: std::sync::Arc<Epochs>) {
    while epochs.held_for_hello() {
        if pending(&dir).is_some_and(|r| r.arbiter_lost_above.is_none()) {
            match epochs.twin_said_hello() {
                Ok(_) => {
                    tracing::warn!("released by the operator (`primary release`): acknowledging without the twin's hello");
                }
                Err(e) => tracing::error!(error = %e, "lifting the hold"),
            }
            if let Err(e) = taken(&dir) {
                tracing::warn!(error = %e, "removing RELEASE");
            }
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}

/// What `primary release` said.
#[derive(Debug, PartialEq, Eq)]
pub enum Released {
    /// The start held for the twin's hello serves without it.
    HeldStart,
    /// After etcd forgot, the box leads above `above` without the other
    /// box's history.
    ArbiterLost { above: u64 },
}

/// `primary release`: say to the primary of `primary_config` (running or
/// not) that it may serve without what it waits for. `arbiter_lost_above`
/// names the floor after etcd forgot; it is refused below any epoch this
/// box holds or read from etcd.
pub fn release(
    primary_config: &Path,
    arbiter_lost_above: Option<u64>,
) -> Result<Released, super::DaemonError> {
    use super::IoAt;
    let cfg = super::PrimaryConfig::load(primary_config)?;
    let dir = &cfg.data_dir;
    let released = match arbiter_lost_above {
        None => Released::HeldStart,
        Some(above) => {
            if cfg.failover.is_none() {
                return Err(super::DaemonError::Usage(
                    "--arbiter-lost: this primary has no [failover] section, so no arbiter to have lost".into(),
                ));
            }
            // The legacy epoch file's head matters only for directories
            // older than epoch histories; the log is the daemon's.
            let epochs = Epochs::load(dir, 0).at("reading the epochs in", dir)?;
            let memory = crate::node::arbiter::memory::MemoryFile::load(dir)
                .at("reading ARBITER in", dir)?;
            let newest = epochs.newest().max(memory.get().epoch);
            if above < newest {
                return Err(super::DaemonError::ReleaseBelowHistory {
                    asked: above,
                    newest,
                });
            }
            Released::ArbiterLost { above }
        }
    };
    say(
        dir,
        &Release {
            arbiter_lost_above,
            at_ms: crate::node::clock::unix_ms(),
        },
    )
    .at("writing", &dir.join(RELEASE_FILE))?;
    Ok(released)
}
