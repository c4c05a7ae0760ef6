//! A stream read on a blocking thread. A task on the runtime takes the
//! stream's chunks as they arrive and hands them over in batches of
//! [`BATCH_BYTES`] or more, so the reading thread wakes once per batch: a
//! `block_on` read from that thread was woken for nearly every packet,
//! and each wake of a sleeping thread on another core costs more than the
//! copy it leads to.

use std::collections::VecDeque;

use bytes::{Buf, Bytes};
use quinn::RecvStream;
use serde::de::DeserializeOwned;
use tokio::runtime::Handle;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use super::NetError;
use crate::repl::msg::{self, DecodeError};

/// Bytes a batch gathers before it is handed over (the stream's end or
/// failure hands over what there is).
pub const BATCH_BYTES: usize = 256 << 10;
/// Batches buffered between the task and the reader: with the stream's
/// window, what a slow reader leaves in memory.
const BATCHES: usize = 8;
/// Chunks taken from the stream at a time.
const CHUNKS_PER_READ: usize = 32;

type Batch = Result<Vec<Bytes>, NetError>;

/// The reading end, for a blocking thread. Dropping it stops the stream.
pub struct PumpedStream {
    rx: mpsc::Receiver<Batch>,
    held: VecDeque<Bytes>,
    pump: JoinHandle<()>,
}

impl PumpedStream {
    /// Start taking `recv`'s chunks on `rt`.
    pub fn start(rt: &Handle, recv: RecvStream) -> PumpedStream {
        let (tx, rx) = mpsc::channel(BATCHES);
        PumpedStream {
            rx,
            held: VecDeque::new(),
            pump: rt.spawn(pump(recv, tx)),
        }
    }

    /// Wait for the next batch; false at the stream's end.
    fn fill(&mut self) -> Result<bool, NetError> {
        match self.rx.blocking_recv() {
            Some(Ok(chunks)) => {
                self.held
                    .extend(chunks.into_iter().filter(|c| !c.is_empty()));
                Ok(true)
            }
            Some(Err(e)) => Err(e),
            None => Ok(false),
        }
    }

    /// Fill `buf` whole; a stream that ends first is `FinishedEarly`.
    pub fn read_exact(&mut self, mut buf: &mut [u8]) -> Result<(), NetError> {
        let wanted = buf.len();
        while !buf.is_empty() {
            let Some(chunk) = self.held.front_mut() else {
                if self.fill()? {
                    continue;
                }
                let got = wanted - buf.len();
                return Err(quinn::ReadExactError::FinishedEarly(got).into());
            };
            let n = chunk.len().min(buf.len());
            buf[..n].copy_from_slice(&chunk[..n]);
            chunk.advance(n);
            if chunk.is_empty() {
                self.held.pop_front();
            }
            buf = &mut buf[n..];
        }
        Ok(())
    }

    /// One length-prefixed control message, as [`super::read_msg`] reads
    /// it; `None` where the stream ended cleanly before it.
    pub fn read_msg<T: DeserializeOwned>(&mut self) -> Result<Option<T>, NetError> {
        while self.held.is_empty() {
            if !self.fill()? {
                return Ok(None);
            }
        }
        let mut prefix = [0u8; 4];
        self.read_exact(&mut prefix)?;
        let len = msg::announced_len(prefix)?;
        let mut body = vec![0u8; len];
        self.read_exact(&mut body)?;
        let msg = postcard::from_bytes(&body).map_err(|e| DecodeError::Malformed(e.to_string()))?;
        Ok(Some(msg))
    }
}

impl Drop for PumpedStream {
    fn drop(&mut self) {
        // The task owns the stream: ending it drops the stream, which
        // tells the peer to stop sending.
        self.pump.abort();
    }
}

async fn pump(mut recv: RecvStream, tx: mpsc::Sender<Batch>) {
    let mut bufs = vec![Bytes::new(); CHUNKS_PER_READ];
    let mut batch = Vec::new();
    let mut gathered = 0;
    loop {
        match recv.read_chunks(&mut bufs).await {
            Ok(Some(n)) => {
                for chunk in &mut bufs[..n] {
                    gathered += chunk.len();
                    batch.push(std::mem::take(chunk));
                }
                if gathered >= BATCH_BYTES {
                    gathered = 0;
                    if tx.send(Ok(std::mem::take(&mut batch))).await.is_err() {
                        return;
                    }
                }
            }
            Ok(None) => {
                if !batch.is_empty() {
                    let _ = tx.send(Ok(batch)).await;
                }
                return;
            }
            Err(e) => {
                if !batch.is_empty() && tx.send(Ok(batch)).await.is_err() {
                    return;
                }
                let _ = tx
                    .send(Err(quinn::ReadExactError::ReadError(e).into()))
                    .await;
                return;
            }
        }
    }
}
