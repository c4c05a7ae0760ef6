//! Rejoin: a deposed primary becomes the new primary's twin by
//! truncate-to-fork, without copying the log again.
//!
//! The box says hello to the new primary as a twin would. The primary's
//! core compares the two epoch histories ([`crate::repl::fork_point`]) and
//! answers where the logs forked, with its frame there; this checks that
//! frame, fences the box durably (it is no primary from now on), saves the
//! frames past the fork ([`super::divergent`]), rewinds the store when
//! none of them was the store's (or has it rebuilt from the log when some
//! were), and cuts the log after the fork. The twin daemon then follows
//! from there, as any twin does. Every step can be run again: a rejoin
//! interrupted by a crash is finished by running it again.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use super::divergent::{self, SavedTail};
use super::epoch::Epochs;
use crate::log::Log;
use crate::net::{self, NetError};
use crate::repl::{PrimaryMsg, Refusal, TwinMsg, PROTOCOL_VERSION};
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
    #[error("the box at {addr} refused this one: {why}")]
    Refused { addr: SocketAddr, why: Refusal },
    #[error("the box at {addr} serves epoch {theirs}, not newer than this box's {ours}: it is not the primary that superseded this one")]
    NotNewer {
        addr: SocketAddr,
        theirs: u64,
        ours: u64,
    },
    #[error("frame {seq} differs between the two logs (crc {ours:08x} here, {theirs:08x} on the new primary): they share no checked past, so nothing is cut. Restore this box from the new primary's twin instead")]
    ForkFrameDiffers { seq: u64, ours: u32, theirs: u32 },
    #[error("the logs forked after frame {fork}, below this log's retention floor {first}: nothing is cut. Restore this box instead")]
    ForkBelowFloor { fork: u64, first: u64 },
    #[error("store frames past the fork were applied, and this log does not reach back to frame 1 to rebuild the store from ({first}): nothing is cut. Restore this box instead")]
    StoreNotRebuildable { first: u64 },
    #[error("the new primary answered {0}")]
    Protocol(String),
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

/// What the new primary said to this box's Hello.
enum Answer {
    /// Nothing to cut: the log is a prefix of the primary's.
    Welcome { epoch: u64 },
    /// The primary no longer holds this log's head: a snapshot follows.
    BelowFloor,
    /// The logs forked after `at`.
    Forked {
        at: u64,
        crc: Option<u32>,
        epoch: u64,
    },
}

/// Say hello as a twin and hear where the logs part. The connection is
/// closed again: the twin daemon makes its own.
async fn ask(
    endpoint: &quinn::Endpoint,
    addr: SocketAddr,
    hello: TwinMsg,
    deadline: Duration,
) -> Result<Answer, RejoinError> {
    let talk = async {
        let conn = net::connect(endpoint, addr).await?;
        let (mut send, mut recv) = conn.open_bi().await?;
        net::write_msg(&mut send, &hello).await?;
        let answer = net::read_msg::<PrimaryMsg>(&mut recv).await?;
        conn.close(0u32.into(), b"rejoin asked");
        Ok::<_, NetError>(answer)
    };
    let answer = tokio::time::timeout(deadline, talk)
        .await
        .map_err(|_| RejoinError::Connect {
            addr,
            source: NetError::Io(std::io::Error::from(std::io::ErrorKind::TimedOut)),
        })?
        .map_err(|source| RejoinError::Connect { addr, source })?;
    match answer {
        Some(PrimaryMsg::Welcome { epoch, .. }) => Ok(Answer::Welcome { epoch }),
        Some(PrimaryMsg::BelowFloor { .. }) => Ok(Answer::BelowFloor),
        Some(PrimaryMsg::Refuse(Refusal::Forked { at, crc, epoch, .. })) => {
            Ok(Answer::Forked { at, crc, epoch })
        }
        Some(PrimaryMsg::Refuse(why)) => Err(RejoinError::Refused { addr, why }),
        Some(other) => Err(RejoinError::Protocol(format!("{other:?} to a Hello"))),
        None => Err(RejoinError::Protocol("nothing to a Hello".into())),
    }
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
    let head_crc = install::head_crc(&log, &paths.base())?;
    let state = at.epochs.state();
    let hello = TwinMsg::Hello {
        version: PROTOCOL_VERSION,
        history: log.history().0,
        head: crate::repl::Position {
            seq: old_head,
            crc: head_crc,
        },
        first: log.first_seq(),
        // The newest epoch this box knows of is its own: a box it fenced
        // itself for would refuse this Hello as stale only if older.
        epoch: state.current(),
        epochs: state.history.clone(),
    };
    let (fork, fork_crc, epoch, needs_snapshot) =
        match ask(at.endpoint, at.primary, hello, at.deadline).await? {
            Answer::Welcome { epoch } => (old_head, None, epoch, false),
            Answer::BelowFloor => (old_head, None, state.newest(), true),
            Answer::Forked { at, crc, epoch } => (at, crc, epoch, false),
        };
    if epoch <= state.current() {
        return Err(RejoinError::NotNewer {
            addr: at.primary,
            theirs: epoch,
            ours: state.current(),
        });
    }
    // From here on this box is no primary, even if the rejoin stops.
    at.epochs
        .hear(epoch, &format!("the rejoin to {}", at.primary))
        .map_err(io("recording the fence"))?;
    let mut saved = None;
    let mut cut_bytes = 0;
    let mut store = StoreFate::Kept;
    if fork < old_head {
        let first = log.first_seq();
        if fork + 1 < first {
            return Err(RejoinError::ForkBelowFloor { fork, first });
        }
        if let Some(theirs) = fork_crc {
            let here = log.locate_blob(fork)?;
            if !here.is_erased() && here.payload_crc != theirs {
                return Err(RejoinError::ForkFrameDiffers {
                    seq: fork,
                    ours: here.payload_crc,
                    theirs,
                });
            }
        }
        // The store may have applied frames past the fork. Frames of its
        // own among them changed its files: it is rebuilt from the log,
        // which needs the log from frame 1. Otherwise only its applied
        // mark moves back.
        let store_dir = at.store_dir.clone().filter(|d| d.join("APPLIED").exists());
        let applied = match &store_dir {
            Some(dir) => crate::store::Store::applied_mark(dir, log.history())?,
            None => 0,
        };
        let mut store_frames_applied = false;
        if applied > fork {
            log.scan_kinds::<crate::log::Error>(fork + 1, applied.min(old_head), |_, kind| {
                store_frames_applied |= crate::store::is_store_kind(kind);
                Ok(())
            })?;
        }
        if store_frames_applied && first > 1 {
            return Err(RejoinError::StoreNotRebuildable { first });
        }
        let (manifest, path) = {
            let (log, data_dir) = (log.clone(), at.data_dir.to_owned());
            let (old_epoch, primary) = (state.current(), at.primary.to_string());
            tokio::task::spawn_blocking(move || {
                let tail = divergent::Tail {
                    log: &log,
                    fork,
                    epoch: old_epoch,
                    new_epoch: epoch,
                    primary,
                };
                divergent::save(&data_dir, &tail)
            })
            .await
            .map_err(|e| RejoinError::Protocol(format!("saving the divergent frames: {e}")))?
            .map_err(io("saving the divergent frames"))?
        };
        tracing::warn!(
            fork,
            first = manifest.first,
            last = manifest.last,
            frames = manifest.frames,
            path = %path.display(),
            "saved the frames the new primary never held, before cutting them"
        );
        saved = Some((manifest, path));
        if let Some(dir) = &store_dir {
            if store_frames_applied {
                let moved_to = at
                    .data_dir
                    .join(divergent::DIVERGENT_DIR)
                    .join(format!("store-e{epoch}-{}", fork + 1));
                std::fs::rename(dir, &moved_to).map_err(io("moving the store aside"))?;
                crate::publish::sync_parent(dir).map_err(io("moving the store aside"))?;
                store = StoreFate::Rebuilt { moved_to };
            } else if applied > fork {
                crate::store::Store::rewind_to(dir, log.history(), fork)?;
                store = StoreFate::Rewound { from: applied };
            }
        }
        let cut = log.truncate_after(fork)?;
        cut_bytes = cut.bytes;
    }
    Ok(Rejoined {
        old_head,
        fork,
        epoch,
        saved,
        cut_bytes,
        store,
        needs_snapshot,
    })
}
