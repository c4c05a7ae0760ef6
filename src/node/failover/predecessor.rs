//! A promoted box and the primary it replaced, carried out: the rules are
//! [`crate::repl::promote`]'s. `twin promote` writes `PREDECESSOR` (the
//! old primary's address and fingerprint, from the twin's configuration);
//! the new primary then calls that address, as a twin of its new epoch,
//! until the old primary answers that it fenced itself, or follows this
//! box as its twin. A twin records when it last heard its primary
//! (`HEARD_PRIMARY`), which is what `twin promote` checks its quiet window
//! against.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use super::epoch::Epochs;
use crate::log::Log;
use crate::net::{self, Fingerprint, Identity, NetError, Pins, Role};
use crate::node::clock::unix_ms;
use crate::repl::promote::{Predecessor, Told};
use crate::repl::rejoin::LogHead;
use crate::storage::{remove_if_exists, StdStorage, Storage};

pub use crate::layout::{HEARD_PRIMARY_FILE, PREDECESSOR_FILE};

/// `PREDECESSOR`: the primary this box replaced.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PredecessorFile {
    /// Its address, as the twin's configuration named it.
    pub addr: String,
    /// Its certificate fingerprint.
    pub fingerprint: String,
    /// The epoch this box was promoted to.
    pub epoch: u64,
    /// It heard of that epoch: it is fenced, or it follows this box.
    pub told: bool,
    /// When it was told, ms since the Unix epoch.
    #[serde(default)]
    pub told_ms: u64,
}

/// What `status` shows of the call.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PredecessorStatus {
    pub addr: String,
    pub epoch: u64,
    pub told: bool,
    pub attempts: u64,
    pub last_error: Option<String>,
}

impl PredecessorFile {
    pub fn load(dir: &Path) -> std::io::Result<Option<PredecessorFile>> {
        Self::load_with(&StdStorage, dir)
    }

    /// [`PredecessorFile::load`] through `fs`.
    pub fn load_with(fs: &dyn Storage, dir: &Path) -> std::io::Result<Option<PredecessorFile>> {
        match fs.read(&dir.join(PREDECESSOR_FILE)) {
            Ok(b) => serde_json::from_slice(&b)
                .map(Some)
                .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Written durably: a crash after a promotion must not forget the call.
    pub fn save(&self, dir: &Path) -> std::io::Result<()> {
        self.save_with(&StdStorage, dir)
    }

    /// [`PredecessorFile::save`] through `fs`.
    pub fn save_with(&self, fs: &dyn Storage, dir: &Path) -> std::io::Result<()> {
        let bytes = serde_json::to_vec_pretty(self).map_err(std::io::Error::other)?;
        crate::publish::publish_with(fs, &dir.join(PREDECESSOR_FILE), &bytes)
    }
}

/// This box no longer owes a call (it became a twin, or its predecessor
/// heard of it at a switchover).
pub fn forget(dir: &Path) -> std::io::Result<()> {
    forget_with(&StdStorage, dir)
}

/// [`forget`] through `fs`.
pub fn forget_with(fs: &dyn Storage, dir: &Path) -> std::io::Result<()> {
    let path = dir.join(PREDECESSOR_FILE);
    if remove_if_exists(fs, &path)? {
        crate::publish::sync_parent_with(fs, &path)?;
    }
    Ok(())
}

/// When the twin in `dir` last heard its primary, ms since the Unix epoch.
pub fn heard_primary(dir: &Path) -> Option<u64> {
    let bytes = StdStorage.read(&dir.join(HEARD_PRIMARY_FILE)).ok()?;
    std::str::from_utf8(&bytes).ok()?.trim().parse().ok()
}

/// Record that the twin in `dir` heard its primary now. Not synced: a
/// power cut that loses it also stopped the twin hearing anything.
pub fn record_heard(dir: &Path) -> std::io::Result<()> {
    crate::publish::publish_hint(
        &dir.join(HEARD_PRIMARY_FILE),
        unix_ms().to_string().as_bytes(),
    )
}

/// How often a twin records that it heard its primary.
pub const HEARD_EVERY: Duration = Duration::from_secs(1);

/// The call to the predecessor, run by a promoted primary.
pub struct Caller {
    pub dir: PathBuf,
    pub log: Arc<Log>,
    pub epochs: Arc<Epochs>,
    /// A client endpoint of this box's identity that pins the
    /// predecessor as a primary ([`Caller::endpoint`]).
    pub endpoint: quinn::Endpoint,
    /// How long one call may take.
    pub deadline: Duration,
}

/// Calls are cheap (one handshake attempt), and until one is heard a
/// restarted predecessor may take `local` writes: call often.
const FIRST_RETRY: Duration = Duration::from_millis(100);
const LAST_RETRY: Duration = Duration::from_secs(1);
/// The longest one call waits for an answer: a live box on the other end
/// answers a handshake within milliseconds, and a call to a box that is
/// down must not hold up the next one.
pub const CALL_DEADLINE: Duration = Duration::from_secs(1);

/// Why a call to the predecessor could not be made or did not reach it.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    #[error("reading {file}: {0}", file = crate::layout::PREDECESSOR_FILE)]
    File(std::io::Error),
    #[error("the fingerprint {0:?} does not parse")]
    Fingerprint(String),
    #[error("{0}")]
    Endpoint(NetError),
    #[error("resolving {addr}: {error}")]
    Resolve { addr: String, error: std::io::Error },
    #[error("{0} resolves to no address")]
    NoAddress(String),
    #[error("reaching {addr}: {error}")]
    Unreached { addr: SocketAddr, error: NetError },
}

impl Caller {
    /// The endpoint to call `file`'s box from, as `identity`. Its
    /// connections give up by QUIC's own idle timeout, the call's
    /// deadline: a handshake never answered ends on both sides, rather
    /// than be dropped half-way and left to the other side's timeout.
    pub fn endpoint(
        identity: &Identity,
        file: &PredecessorFile,
    ) -> Result<quinn::Endpoint, CallError> {
        let fp: Fingerprint = file
            .fingerprint
            .parse()
            .map_err(|_| CallError::Fingerprint(file.fingerprint.clone()))?;
        let pins = Arc::new(Pins::new().pin(fp, Role::Primary));
        net::client_with(identity, pins, net::Liveness::client(CALL_DEADLINE))
            .map_err(CallError::Endpoint)
    }

    /// Call until the predecessor heard, or `shutdown`. `status` shows how
    /// it goes; `told` is called once this box's twin streams (the
    /// predecessor rejoined).
    pub async fn run(
        self,
        file: PredecessorFile,
        status: Arc<Mutex<Option<PredecessorStatus>>>,
        mut twin_streams: watch::Receiver<bool>,
        mut shutdown: watch::Receiver<bool>,
    ) {
        let set = |f: &dyn Fn(&mut PredecessorStatus)| {
            let mut s = status.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(s) = s.as_mut() {
                f(s);
            }
        };
        *status.lock().unwrap_or_else(|e| e.into_inner()) = Some(PredecessorStatus {
            addr: file.addr.clone(),
            epoch: file.epoch,
            told: file.told,
            attempts: 0,
            last_error: None,
        });
        if file.told {
            return;
        }
        let mut delay = FIRST_RETRY;
        loop {
            let outcome = tokio::select! {
                o = self.call(&file) => o,
                _ = twin_streams.wait_for(|&s| s) => Ok(Told::Fenced),
                _ = shutdown.changed() => return,
            };
            set(&|s| s.attempts += 1);
            match outcome {
                Ok(Told::Fenced) => {
                    let told = PredecessorFile {
                        told: true,
                        told_ms: unix_ms(),
                        ..file.clone()
                    };
                    if let Err(e) = told.save(&self.dir) {
                        tracing::warn!(error = %e, "recording that the predecessor was told");
                    }
                    tracing::warn!(predecessor = %file.addr, "the primary this box replaced heard of its epoch: it is fenced");
                    set(&|s| {
                        s.told = true;
                        s.last_error = None;
                    });
                    return;
                }
                Ok(Told::Newer { epoch }) => {
                    let by = format!(
                        "its predecessor at {}, which serves a newer epoch",
                        file.addr
                    );
                    if let Err(e) = self.epochs.hear(epoch, &by) {
                        tracing::error!(error = %e, "FENCED in memory only: recording the fence failed");
                    }
                    tracing::error!(epoch = %crate::repl::epochs::EpochName(epoch), predecessor = %file.addr, "FENCED: the box this one replaced serves a newer epoch");
                    set(&|s| {
                        s.last_error = Some(format!(
                            "it serves a newer epoch {epoch}: this box is fenced"
                        ))
                    });
                    return;
                }
                Ok(Told::NotYet(why)) => set(&|s| s.last_error = Some(why.clone())),
                Err(e) => set(&|s| s.last_error = Some(e.to_string())),
            }
            tokio::select! {
                _ = tokio::time::sleep(delay) => {}
                _ = shutdown.changed() => return,
            }
            delay = (delay * 2).min(LAST_RETRY);
        }
    }

    /// One call: dial, say hello, hear the answer.
    async fn call(&self, file: &PredecessorFile) -> Result<Told, CallError> {
        let addr: SocketAddr = tokio::net::lookup_host(&file.addr)
            .await
            .map_err(|error| CallError::Resolve {
                addr: file.addr.clone(),
                error,
            })?
            .next()
            .ok_or_else(|| CallError::NoAddress(file.addr.clone()))?;
        let head = self.log.head_seq();
        let head_crc = self
            .log
            .locate_blob(head)
            .map(|l| l.payload_crc)
            .unwrap_or(0);
        let call = Predecessor::new(
            self.epochs.state(),
            LogHead {
                history: self.log.history().0,
                head,
                head_crc,
                first: self.log.first_seq(),
            },
        );
        // QUIC gives a call up at its deadline; this bound is only the
        // last resort.
        super::rejoin::ask(&self.endpoint, addr, call.hello(), 2 * self.deadline)
            .await
            .map(|a| call.answer(a))
            .map_err(|error| CallError::Unreached { addr, error })
    }
}
