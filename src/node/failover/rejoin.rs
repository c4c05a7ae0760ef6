//! Rejoin, carried out: a deposed primary becomes the new primary's twin
//! by truncate-to-fork, without copying the log again.
//!
//! The rules are [`crate::repl::rejoin`]'s: the hello, what the answer
//! means, and the plan (fence, save, store, cut, in that order). This
//! does the I/O: it asks the new primary, gathers what the box holds past
//! the fork, and carries each step out durably before the next. The twin
//! daemon then follows from the fork, as any twin does. A rejoin
//! interrupted by a crash is finished by running it again.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use super::divergent::{self, SavedTail};
use super::epoch::Epochs;
use crate::log::Log;
use crate::net::{self, NetError};
use crate::repl::rejoin::{LogFacts, LogHead, Rejoin, RejoinRefusal, Step, StoreStep};
use crate::repl::{PrimaryMsg, TwinMsg};
use crate::store::install::{self, InstallPaths};

/// What a rejoin did.
#[derive(Debug)]
pub struct Rejoined {
    /// This log's head before the rejoin.
    pub old_head: u64,
    /// The last frame both logs share: this log's head now.
    pub fork: u64,
    /// The new primary's epoch.
    pub epoch: u64,
    /// The frames cut, saved first; none when the log had none past the
    /// fork.
    pub saved: Option<(SavedTail, PathBuf)>,
    /// Bytes of frames cut from the log.
    pub cut_bytes: u64,
    /// What became of the store.
    pub store: StoreFate,
    /// The new primary no longer holds this log's head: the twin fetches
    /// a snapshot when it starts.
    pub needs_snapshot: bool,
}

/// What a rejoin did to the store.
#[derive(Debug, PartialEq, Eq)]
pub enum StoreFate {
    /// It had applied nothing past the fork.
    Kept,
    /// It had applied frames past the fork, none of them the store's: its
    /// applied mark moved back to the fork.
    Rewound { from: u64 },
    /// Store frames were cut: it was moved aside to this path and is
    /// rebuilt from the log when the twin starts.
    Rebuilt { moved_to: PathBuf },
}

/// Why a rejoin stopped. Nothing is cut unless every check before passed.
#[derive(Debug, thiserror::Error)]
pub enum RejoinError {
    #[error("reaching the new primary at {addr}: {source}")]
    Connect { addr: SocketAddr, source: NetError },
    #[error("{addr}: {why}")]
    Refused {
        addr: SocketAddr,
        why: RejoinRefusal,
    },
    #[error("{what}: {source}")]
    Io {
        what: String,
        source: std::io::Error,
    },
    #[error("the log: {0}")]
    Log(#[from] crate::log::Error),
    #[error("the store: {0}")]
    Store(#[from] crate::store::StoreError),
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> RejoinError {
    let what = what.into();
    move |source| RejoinError::Io { what, source }
}

/// Say hello as a twin and hear the one answer. The connection is closed
/// again: the twin daemon makes its own. Also how a promoted box tells
/// its predecessor.
pub(crate) async fn ask(
    endpoint: &quinn::Endpoint,
    addr: SocketAddr,
    hello: TwinMsg,
    deadline: Duration,
) -> Result<Option<PrimaryMsg>, NetError> {
    let talk = async {
        let conn = net::connect(endpoint, addr).await?;
        let (mut send, mut recv) = conn.open_bi().await?;
        net::write_msg(&mut send, &hello).await?;
        let answer = net::read_msg::<PrimaryMsg>(&mut recv).await?;
        conn.close(0u32.into(), b"hello answered");
        Ok::<_, NetError>(answer)
    };
    tokio::time::timeout(deadline, talk)
        .await
        .map_err(|_| NetError::Io(std::io::Error::from(std::io::ErrorKind::TimedOut)))?
}

/// Where a rejoin runs.
pub struct RejoinAt<'a> {
    pub data_dir: &'a Path,
    pub log: Arc<Log>,
    pub epochs: &'a Epochs,
    /// The store's directory, when the box keeps one.
    pub store_dir: Option<PathBuf>,
    pub endpoint: &'a quinn::Endpoint,
    pub primary: SocketAddr,
    /// How long the new primary has to answer.
    pub deadline: Duration,
}

/// Rejoin the new primary at `at.primary` as its twin: see the module's
/// description. The log must not be open elsewhere (the daemon stopped).
pub async fn rejoin(at: RejoinAt<'_>) -> Result<Rejoined, RejoinError> {
    let log = at.log.clone();
    let old_head = log.head_seq();
    let paths = InstallPaths::new(at.data_dir);
    let machine = Rejoin::new(
        at.epochs.state(),
        LogHead {
            history: log.history().0,
            head: old_head,
            head_crc: install::head_crc(&log, &paths.base())?,
            first: log.first_seq(),
        },
    );
    let answer = ask(at.endpoint, at.primary, machine.hello(), at.deadline)
        .await
        .map_err(|source| RejoinError::Connect {
            addr: at.primary,
            source,
        })?;
    let refused = |why| RejoinError::Refused {
        addr: at.primary,
        why,
    };
    let heard = machine.answer(answer).map_err(refused)?;
    let fork = heard.fork;
    // What the store applied past the fork, for the plan.
    let fs = log.storage().clone();
    // A mark that cannot be looked at counts as none (`Path::exists`).
    let store_dir = at
        .store_dir
        .clone()
        .filter(|d| fs.exists(&d.join("APPLIED")).unwrap_or(false));
    let store_applied = match &store_dir {
        Some(dir) => crate::store::Store::applied_mark_with(&*fs, dir, log.history())?,
        None => 0,
    };
    let mut store_frames_past_fork = false;
    if store_applied > fork && fork < old_head {
        log.scan_kinds::<crate::log::Error>(fork + 1, store_applied.min(old_head), |_, kind| {
            store_frames_past_fork |= crate::store::is_store_kind(kind);
            Ok(())
        })?;
    }
    let fork_frame = match fork {
        0 => None,
        _ if fork >= old_head || fork < log.first_seq() => None,
        _ => {
            let here = log.locate_blob(fork)?;
            Some((here.payload_crc, here.is_erased()))
        }
    };
    let facts = LogFacts {
        head: old_head,
        first: log.first_seq(),
        fork_frame,
        store_applied,
        store_frames_past_fork,
    };
    let (plan, stop) = match machine.plan(heard, facts) {
        Ok(plan) => (plan, None),
        Err((plan, why)) => (plan, Some(why)),
    };
    let mut done = Rejoined {
        old_head,
        fork,
        epoch: heard.epoch,
        saved: None,
        cut_bytes: 0,
        store: StoreFate::Kept,
        needs_snapshot: heard.needs_snapshot,
    };
    for step in plan.steps {
        match step {
            Step::Fence { epoch } => {
                // From here on this box is no primary, even if the rejoin
                // stops.
                at.epochs
                    .hear(epoch, &format!("the rejoin to {}", at.primary))
                    .map_err(io("recording the fence"))?;
            }
            Step::Save { after, .. } => {
                let (log, data_dir) = (log.clone(), at.data_dir.to_owned());
                let (old_epoch, primary) = (at.epochs.current(), at.primary.to_string());
                let (manifest, path) = tokio::task::spawn_blocking(move || {
                    let tail = divergent::Tail {
                        log: &log,
                        fork: after,
                        epoch: old_epoch,
                        new_epoch: heard.epoch,
                        primary,
                    };
                    divergent::save(&data_dir, &tail)
                })
                .await
                .map_err(|e| io("saving the divergent frames")(std::io::Error::other(e)))?
                .map_err(io("saving the divergent frames"))?;
                tracing::warn!(
                    fork = after,
                    first = manifest.first,
                    last = manifest.last,
                    frames = manifest.frames,
                    path = %path.display(),
                    "saved the frames the new primary never held, before cutting them"
                );
                done.saved = Some((manifest, path));
            }
            Step::Store(StoreStep::Keep) => {}
            Step::Store(StoreStep::Rewind { from }) => {
                if let Some(dir) = &store_dir {
                    crate::store::Store::rewind_to_with(&*fs, dir, log.history(), fork)?;
                    done.store = StoreFate::Rewound { from };
                }
            }
            Step::Store(StoreStep::SetAside) => {
                if let Some(dir) = &store_dir {
                    let moved_to = at.data_dir.join(divergent::DIVERGENT_DIR).join(format!(
                        "store-e{}-{}",
                        heard.epoch,
                        fork + 1
                    ));
                    crate::publish::move_aside_with(&*fs, dir, &moved_to)
                        .map_err(io("moving the store aside"))?;
                    done.store = StoreFate::Rebuilt { moved_to };
                }
            }
            Step::Cut { after } => {
                done.cut_bytes = log.truncate_after(after)?.bytes;
            }
        }
    }
    match stop {
        Some(why) => Err(refused(why)),
        None => Ok(done),
    }
}
