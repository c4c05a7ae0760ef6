//! The twin's writer thread and the frame stream feeding it: bytes read
//! from the primary's stream, decoded by the core into steps, applied and
//! synced on a thread of their own, each result reported back.

use quinn::Connection;
use tokio::sync::mpsc;

use crate::log::{Error as LogError, Log};
use crate::net::NetError;
use crate::repl::apply::{self, Applier, Write};
use crate::repl::{Refusal, TwinCore};

/// What the writer thread reports.
pub(super) enum Written {
    Committed(u64),
    Synced(u64),
    /// A batch committed through `committed` and the sync that followed at
    /// once, in one report: one wake of the session, not two.
    CommittedSynced {
        committed: u64,
        synced: Result<u64, LogError>,
    },
    Failed(LogError),
}

/// Batches of writer commands in flight: one batch per read from the
/// stream (at most [`CHUNKS_PER_READ`] chunks of a packet each), so at most
/// a few MiB are buffered, whatever the number of frames in them.
pub(super) const WRITE_BATCHES: usize = 16;

/// Chunks taken from the frame stream at a time: whatever has arrived, so
/// that a stream of large frames wakes the writer once per read, not once
/// per packet.
pub(super) const CHUNKS_PER_READ: usize = 32;

/// Decode stream bytes with the core and hand their steps to the writer
/// as one batch: the writer syncs when it has caught up, so a batch per
/// read lets one sync cover every frame the read held. A refusal stops
/// the decoding at the chunk that caused it.
pub(super) async fn feed(
    core: &mut TwinCore,
    chunks: &[bytes::Bytes],
    writer: &mpsc::Sender<Vec<Write>>,
) -> Result<(), Refusal> {
    let mut batch = Vec::new();
    let mut decoded = Ok(());
    for bytes in chunks {
        decoded = apply::decode(core, bytes, &mut batch);
        if decoded.is_err() {
            break;
        }
    }
    if !batch.is_empty() {
        let _ = writer.send(batch).await;
    }
    decoded
}

/// The writer thread: applies each batch as it comes, and syncs once
/// whenever it has caught up with what arrived: one sync per batch.
pub(super) fn write_frames(
    log: &Log,
    mut rx: mpsc::Receiver<Vec<Write>>,
    out: mpsc::UnboundedSender<Written>,
) {
    let synced = |done: Result<u64, LogError>| match done {
        Ok(head) => Written::Synced(head),
        Err(e) => Written::Failed(e),
    };
    let mut applier = Applier::new(log);
    loop {
        let batch = match rx.try_recv() {
            Ok(batch) => batch,
            Err(mpsc::error::TryRecvError::Empty) => {
                if let Some(done) = applier.sync_if_caught_up() {
                    let _ = out.send(synced(done));
                }
                match rx.blocking_recv() {
                    Some(batch) => batch,
                    None => break,
                }
            }
            Err(mpsc::error::TryRecvError::Disconnected) => break,
        };
        crate::budget::mark(crate::budget::Stage::TwinWriterWoken);
        // One `Committed` per batch, for its last frame: the session wakes
        // once per chunk, not once per frame.
        let applied = applier.apply(batch);
        if let (Some(committed), None, true) = (applied.committed, &applied.failed, rx.is_empty()) {
            // Caught up: the sync comes now, and its report carries the
            // commit.
            if let Some(synced) = applier.sync_if_caught_up() {
                crate::budget::mark(crate::budget::Stage::TwinSynced);
                let _ = out.send(Written::CommittedSynced { committed, synced });
                continue;
            }
        }
        if let Some(seq) = applied.committed {
            let _ = out.send(Written::Committed(seq));
        }
        if let Some(e) = applied.failed {
            let _ = out.send(Written::Failed(e));
        }
    }
    match applier.finish() {
        Some(Ok(head)) => {
            let _ = out.send(Written::Synced(head));
        }
        Some(Err(e)) => tracing::error!(error = %e, "sync after the session failed"),
        None => {}
    }
}

/// The frame stream's chunks, in order, as they arrive: every chunk
/// arrived, up to [`CHUNKS_PER_READ`], at a time.
pub(super) async fn read_frames(
    conn: Connection,
    tx: mpsc::Sender<Result<Vec<bytes::Bytes>, NetError>>,
) {
    let mut recv = match conn.accept_uni().await {
        Ok(r) => r,
        Err(e) => {
            let _ = tx.send(Err(e.into())).await;
            return;
        }
    };
    let mut bufs = vec![bytes::Bytes::new(); CHUNKS_PER_READ];
    loop {
        match recv.read_chunks(&mut bufs).await {
            Ok(Some(n)) => {
                crate::budget::mark(crate::budget::Stage::TwinReceived);
                let read = bufs[..n].iter_mut().map(std::mem::take).collect();
                if tx.send(Ok(read)).await.is_err() {
                    return;
                }
            }
            Ok(None) => return,
            Err(e) => {
                let _ = tx
                    .send(Err(NetError::Io(std::io::Error::other(e.to_string()))))
                    .await;
                return;
            }
        }
    }
}
