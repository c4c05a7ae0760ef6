//! The twin's side of a restore: a box pinned with the restore role
//! connects, learns the twin's position, fetches its snapshot when the
//! twin's log does not reach back to what the box holds, and reads frames
//! from any sequence, resuming inside an entry at any byte.
//!
//! One bidirectional stream per request, each opened by a length-prefixed
//! postcard [`RestoreReq`]. Its first two variants are [`SnapshotReq`]'s,
//! byte for byte, so the snapshot transfer is the one a twin uses with its
//! primary. Documented in docs/PROTOCOL.md.

use std::path::PathBuf;
use std::sync::Arc;

use quinn::{Connection, SendStream};
use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, watch};

use super::snapshot_transfer::{SnapshotError, SnapshotReq, SnapshotSource};
use crate::log::{Error as LogError, Log};
use crate::net::{self, Fingerprint, NetError, Pins, Role};
use crate::node::epoch::Epochs;
use crate::store::install;

/// The piece a restored frame's blob moves in.
pub const RESTORE_PIECE: usize = 1 << 20;

/// What a box being restored asks.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum RestoreReq {
    /// `SnapshotReq::Manifest`.
    Manifest,
    /// `SnapshotReq::File`.
    File { at: u64, path: String, offset: u64 },
    /// The source's position.
    Hello,
    /// Frames from `from` to the head, the first from byte `offset` of its
    /// blob.
    Frames { from: u64, offset: u64 },
    /// The digests of frames `from..=through`, one per `step` frames, as
    /// online verify digests them: a resumed restore checks the frames it
    /// kept against the twin's.
    Digests { from: u64, through: u64, step: u64 },
}

/// What the source answers (snapshot requests are answered as
/// `SnapshotResp`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum RestoreResp {
    /// The source's log: history, first and head sequence, the payload crc
    /// of its head frame, and its epoch.
    Welcome {
        history: [u8; 16],
        first: u64,
        head: u64,
        head_crc: u32,
        epoch: u64,
        /// The source's epoch history, which the restored box takes.
        epochs: crate::repl::EpochHistory,
    },
    /// Frames `from..=through` follow, each a [`RestoreFrame`] and its bytes.
    Frames { through: u64 },
    /// Refused, by name.
    Refused(String),
    /// The digests asked, in order.
    Digests(Vec<crate::repl::verify::Digest>),
}

/// One frame of a restore stream; `blob_len - from` bytes follow, none for
/// an erased frame.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RestoreFrame {
    pub seq: u64,
    pub kind: u16,
    pub meta: Vec<u8>,
    pub blob_len: u64,
    /// The crc the frame's first append computed, over meta and the whole
    /// blob: the receiver checks it over the entry it puts together.
    pub payload_crc: u32,
    /// The first blob byte that follows.
    pub from: u64,
    pub erased: bool,
}

/// What a restore source serves from.
pub struct RestoreSource {
    pub log: Arc<Log>,
    pub snapshots: Arc<SnapshotSource>,
    pub epochs: Arc<Epochs>,
    /// The box's SNAPSHOT_BASE, naming its head frame when its log
    /// restarted after a snapshot.
    pub base: PathBuf,
}

impl RestoreSource {
    fn head_crc(&self) -> Result<u32, crate::store::StoreError> {
        install::head_crc(&self.log, &self.base)
    }
}

/// Accept restore connections until `shutdown`; only peers pinned with the
/// restore role are served.
pub async fn serve(
    source: Arc<RestoreSource>,
    endpoint: quinn::Endpoint,
    pins: Arc<Pins>,
    mut shutdown: watch::Receiver<bool>,
) {
    loop {
        tokio::select! {
            incoming = endpoint.accept() => {
                let Some(incoming) = incoming else { break };
                let (source, pins) = (source.clone(), pins.clone());
                tokio::spawn(async move {
                    let conn = match incoming.await {
                        Ok(c) => c,
                        Err(e) => return tracing::warn!(error = %e, "restore handshake refused"),
                    };
                    match net::peer(&conn, &pins) {
                        Ok((fp, Role::Restore)) => {
                            tracing::info!(peer = %fp, addr = %conn.remote_address(), "restore connected");
                            connection(source, conn, &pins, fp).await;
                        }
                        Ok((_, role)) => conn.close(2u32.into(), format!("{role:?} is not served here").as_bytes()),
                        Err(e) => {
                            tracing::warn!(error = %e, "restore connection without a pinned peer");
                            conn.close(1u32.into(), b"not pinned");
                        }
                    }
                });
            }
            _ = shutdown.changed() => break,
        }
    }
    endpoint.close(0u32.into(), b"shutdown");
}

/// How long a stream's request may take to arrive once the stream is
/// open.
const REQUEST_DEADLINE: std::time::Duration = std::time::Duration::from_secs(10);

/// The application close code of a restore connection whose pin expired
/// while it was open.
pub const CLOSE_PIN_EXPIRED: u32 = 6;

/// Serve one restore peer's requests until it goes, or its pin expires:
/// an expiry ends an open connection as it refuses a new handshake.
async fn connection(source: Arc<RestoreSource>, conn: Connection, pins: &Pins, fp: Fingerprint) {
    let expired = async {
        match pins.expiry(&fp) {
            Some(until_ms) => {
                let left = until_ms.saturating_sub(crate::node::clock::unix_ms());
                tokio::time::sleep(std::time::Duration::from_millis(left)).await
            }
            None => std::future::pending().await,
        }
    };
    tokio::pin!(expired);
    loop {
        let accepted = tokio::select! {
            a = conn.accept_bi() => a,
            () = &mut expired => {
                tracing::warn!(peer = %fp, "a restore pin expired: its connection is closed");
                conn.close(CLOSE_PIN_EXPIRED.into(), b"the restore pin expired");
                return;
            }
        };
        let Ok((send, mut recv)) = accepted else {
            return;
        };
        if pins.role(&fp) != Some(Role::Restore) {
            conn.close(CLOSE_PIN_EXPIRED.into(), b"the restore pin expired");
            return;
        }
        let source = source.clone();
        tokio::spawn(async move {
            let read =
                tokio::time::timeout(REQUEST_DEADLINE, net::read_msg::<RestoreReq>(&mut recv));
            let req = match read.await {
                Ok(Ok(Some(r))) => r,
                Ok(Ok(None)) => return,
                Ok(Err(e)) => {
                    return tracing::warn!(error = %e, "a restore request does not decode")
                }
                Err(_) => return tracing::warn!("a restore request did not arrive in time"),
            };
            if let Err(e) = answer(&source, req, send).await {
                tracing::warn!(error = %e, "a restore request failed");
            }
        });
    }
}

/// Why a restore request was not answered whole.
#[derive(Debug, thiserror::Error)]
enum AnswerError {
    #[error("a snapshot request: {0}")]
    Snapshot(#[from] SnapshotError),
    #[error(transparent)]
    Net(#[from] NetError),
}

async fn answer(
    source: &Arc<RestoreSource>,
    req: RestoreReq,
    mut send: SendStream,
) -> Result<(), AnswerError> {
    match req {
        RestoreReq::Manifest => Ok(source
            .snapshots
            .clone()
            .answer(SnapshotReq::Manifest, send)
            .await?),
        RestoreReq::File { at, path, offset } => Ok(source
            .snapshots
            .clone()
            .answer(SnapshotReq::File { at, path, offset }, send)
            .await?),
        RestoreReq::Hello => {
            let head = source.log.head_seq();
            // A head that does not read is refused, not served as another
            // frame.
            let resp = match source.head_crc() {
                Ok(head_crc) => RestoreResp::Welcome {
                    history: source.log.history().0,
                    first: source.log.first_seq(),
                    head,
                    head_crc,
                    epoch: source.epochs.current(),
                    epochs: source.epochs.history(),
                },
                Err(e) => RestoreResp::Refused(format!("this box's head frame {head}: {e}")),
            };
            net::write_msg(&mut send, &resp).await?;
            let _ = send.finish();
            Ok(())
        }
        RestoreReq::Frames { from, offset } => Ok(frames(source, from, offset, send).await?),
        RestoreReq::Digests {
            from,
            through,
            step,
        } => {
            let resp = digests(source, from, through, step).await;
            net::write_msg(&mut send, &resp).await?;
            let _ = send.finish();
            Ok(())
        }
    }
}

/// The digests of `from..=through`, or why not: a range this log does not
/// hold, or more ranges than one answer carries.
async fn digests(source: &Arc<RestoreSource>, from: u64, through: u64, step: u64) -> RestoreResp {
    let (first, head) = (source.log.first_seq(), source.log.head_seq());
    if step == 0 || from < first || through > head || from > through {
        return RestoreResp::Refused(format!(
            "digests of {from}..={through} by {step}: this log holds {first}..={head}"
        ));
    }
    let ranges = (through - from) / step + 1;
    if ranges > crate::repl::verify::MAX_DIGESTS {
        return RestoreResp::Refused(format!(
            "{ranges} digests asked, at most {}",
            crate::repl::verify::MAX_DIGESTS
        ));
    }
    let (log, epochs) = (source.log.clone(), source.epochs.history());
    let digested = tokio::task::spawn_blocking(move || {
        crate::repl::verify::digests(&log, &epochs, from, through, step, |_, _| {})
    })
    .await;
    match digested {
        Ok(Ok(d)) => RestoreResp::Digests(d),
        Ok(Err(e)) => RestoreResp::Refused(format!("digesting {from}..={through}: {e}")),
        Err(e) => RestoreResp::Refused(format!("digesting {from}..={through}: {e}")),
    }
}

/// What the blocking reader hands the stream.
enum Out {
    Head(RestoreFrame),
    /// Handed to the stream as it is: a chunk written whole is not copied
    /// again.
    Bytes(bytes::Bytes),
    Failed(String),
}

async fn frames(
    source: &Arc<RestoreSource>,
    from: u64,
    offset: u64,
    mut send: SendStream,
) -> Result<(), NetError> {
    let log = source.log.clone();
    // Pinned before the floor is read: retention keeps these frames while
    // the restore runs.
    source.snapshots.note_restore(from);
    let (first, through) = (log.first_seq(), log.head_seq());
    if from < first || from > through + 1 {
        let why = format!("frames from {from}: this log holds {first}..={through}");
        net::write_msg(&mut send, &RestoreResp::Refused(why)).await?;
        let _ = send.finish();
        return Ok(());
    }
    net::write_msg(&mut send, &RestoreResp::Frames { through }).await?;
    let (tx, mut rx) = mpsc::channel::<Out>(8);
    let pin = source.snapshots.clone();
    let reader = tokio::task::spawn_blocking(move || {
        let send = |o: Out| tx.blocking_send(o).is_ok();
        for seq in from..=through {
            // A long stream keeps its pin fresh.
            pin.note_restore(seq);
            let skip = if seq == from { offset } else { 0 };
            let mut first = true;
            let read =
                log.read_pieces_from::<LogError>(seq, skip, RESTORE_PIECE, |loc, piece, _| {
                    if std::mem::take(&mut first) {
                        let head = RestoreFrame {
                            seq,
                            kind: loc.kind,
                            meta: loc.meta.clone(),
                            blob_len: loc.blob_len,
                            payload_crc: loc.payload_crc,
                            from: skip,
                            erased: loc.is_erased(),
                        };
                        if !send(Out::Head(head)) {
                            return Err(LogError::Io(std::io::Error::other("the receiver left")));
                        }
                    }
                    if !piece.is_empty() && !send(Out::Bytes(bytes::Bytes::copy_from_slice(piece)))
                    {
                        return Err(LogError::Io(std::io::Error::other("the receiver left")));
                    }
                    Ok(())
                });
            if let Err(e) = read {
                send(Out::Failed(format!("frame {seq}: {e}")));
                return;
            }
        }
    });
    while let Some(out) = rx.recv().await {
        match out {
            Out::Head(h) => net::write_msg(&mut send, &h).await?,
            Out::Bytes(b) => send.write_chunk(b).await.map_err(NetError::from)?,
            Out::Failed(why) => {
                tracing::error!(%why, "a restore stream failed");
                // A frame cut short is never taken for a whole one.
                let _ = send.reset(1u32.into());
                return Ok(());
            }
        }
    }
    let _ = reader.await;
    let _ = send.finish();
    Ok(())
}
