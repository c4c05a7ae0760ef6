//! A request's body as the primary reads it: in pieces, each within a
//! deadline, and at a least rate over the whole. A client that stops
//! sending mid-body is cut off by name (`BodyStalled`), and so is one that
//! trickles it (`BodyTooSlow`), instead of holding what it was given for as
//! long as it likes; what it sent becomes visible nowhere.

use std::collections::VecDeque;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use quinn::RecvStream;
use tokio::time::Instant;

use super::PIECE;
use crate::node::api::ApiError;
use crate::node::clock;

/// The default wait for each piece of a body.
pub const DEFAULT_PIECE_DEADLINE: Duration = Duration::from_secs(3);

/// A body must bring a piece (or its rest) within this many piece
/// deadlines: at the default 3 s, about 21 KiB/s. A client trickling a
/// byte now and then never meets the piece deadline, and meets this.
pub const RATE_WINDOW_DEADLINES: u32 = 4;

/// Chunks taken from the stream in one read: what has already arrived is
/// handed on in pieces of up to [`PIECE`] bytes, so a large body costs one
/// hand-off and one write per piece rather than one per packet.
const CHUNKS_PER_READ: usize = 64;

/// A body of `expected` bytes on a request stream.
pub(super) struct Body<'a> {
    recv: &'a mut RecvStream,
    expected: u64,
    /// Bytes handed out so far.
    received: u64,
    deadline: Duration,
    /// Read from the stream, not handed out yet; never past `expected`.
    arrived: VecDeque<Bytes>,
    arrived_bytes: u64,
    /// Take no byte past the body from the stream: on a pipeline the next
    /// request follows it.
    exact: bool,
    /// When the last byte arrived (or the body began).
    last_byte: Instant,
    /// Since when, and from how many bytes, the current rate window runs.
    window: (Instant, u64),
}

impl<'a> Body<'a> {
    pub(super) fn new(recv: &'a mut RecvStream, expected: u64, deadline: Duration) -> Self {
        let now = clock::instant();
        Body {
            recv,
            expected,
            received: 0,
            deadline,
            arrived: VecDeque::new(),
            arrived_bytes: 0,
            exact: false,
            last_byte: now,
            window: (now, 0),
        }
    }

    /// A body followed by more on its stream: read a chunk at a time,
    /// each capped at what is left of the body.
    pub(super) fn exact(recv: &'a mut RecvStream, expected: u64, deadline: Duration) -> Self {
        Body {
            exact: true,
            ..Body::new(recv, expected, deadline)
        }
    }

    /// The body's length.
    pub(super) fn expected(&self) -> u64 {
        self.expected
    }

    /// The primary read nothing for a while, on its own account (the body
    /// waited for room): its deadlines run again from now, as a client
    /// held back by flow control meanwhile could not send.
    pub(super) fn resume(&mut self) {
        let now = clock::instant();
        self.last_byte = now;
        self.window = (now, self.received + self.arrived_bytes);
    }

    /// The next piece (at most [`PIECE`] bytes); `None` once the whole
    /// body arrived. A stream that ends short, fails, or sends nothing
    /// for the deadline is an error naming what arrived.
    pub(super) async fn next(&mut self) -> Result<Option<Bytes>, ApiError> {
        if self.received == self.expected {
            return Ok(None);
        }
        if self.arrived.is_empty() {
            self.read_some().await?;
        }
        let mut piece = match self.arrived.pop_front() {
            Some(first) => first,
            None => return Ok(None),
        };
        if self
            .arrived
            .front()
            .is_some_and(|c| piece.len() + c.len() <= PIECE)
        {
            let mut joined = BytesMut::with_capacity(PIECE.min(self.arrived_bytes as usize));
            joined.extend_from_slice(&piece);
            while let Some(c) = self.arrived.front() {
                if joined.len() + c.len() > PIECE {
                    break;
                }
                joined.extend_from_slice(c);
                self.arrived.pop_front();
            }
            piece = joined.freeze();
        }
        self.arrived_bytes -= piece.len() as u64;
        self.received += piece.len() as u64;
        Ok(Some(piece))
    }

    /// Wait for the next chunks, within the deadlines, and take every one
    /// that has arrived (up to [`CHUNKS_PER_READ`]); bytes a client sent
    /// past its body are not the body and are dropped.
    async fn read_some(&mut self) -> Result<(), ApiError> {
        let mut chunks: [Bytes; CHUNKS_PER_READ] = std::array::from_fn(|_| Bytes::new());
        let got = self.received + self.arrived_bytes;
        let left = usize::try_from(self.expected - got).unwrap_or(usize::MAX);
        let window = self.deadline * RATE_WINDOW_DEADLINES;
        let until = (self.last_byte + self.deadline).min(self.window.0 + window);
        let (recv, exact) = (&mut *self.recv, self.exact);
        let read = async {
            if exact {
                let chunk = recv.read_chunk(left, true).await?;
                Ok(chunk.map(|c| {
                    chunks[0] = c.bytes;
                    1
                }))
            } else {
                recv.read_chunks(&mut chunks).await
            }
        };
        match tokio::time::timeout_at(until, read).await {
            Ok(Ok(Some(n))) => {
                let mut room = self.expected - got;
                for mut c in chunks.into_iter().take(n) {
                    c.truncate(usize::try_from(room).unwrap_or(usize::MAX));
                    if c.is_empty() {
                        continue;
                    }
                    room -= c.len() as u64;
                    self.arrived_bytes += c.len() as u64;
                    self.arrived.push_back(c);
                }
                let now = clock::instant();
                self.last_byte = now;
                let (_, from) = self.window;
                let got = self.received + self.arrived_bytes;
                if got - from >= self.least_per_window(from) {
                    self.window = (now, got);
                }
                Ok(())
            }
            Ok(Ok(None)) => Err(ApiError::BadRequest(format!(
                "the body ended after {got} of its {} bytes",
                self.expected
            ))),
            Ok(Err(e)) => Err(ApiError::BadRequest(format!(
                "the body failed after {got} of its {} bytes: {e}",
                self.expected
            ))),
            Err(_) if clock::instant() >= self.last_byte + self.deadline => {
                tracing::debug!(
                    received = got,
                    expected = self.expected,
                    "a client stopped sending a body: cut off"
                );
                Err(ApiError::BodyStalled {
                    received: got,
                    expected: self.expected,
                    after_ms: self.deadline.as_millis() as u64,
                })
            }
            Err(_) => {
                tracing::debug!(
                    received = got,
                    expected = self.expected,
                    "a client trickled a body: cut off"
                );
                Err(ApiError::BodyTooSlow {
                    received: got,
                    expected: self.expected,
                    min_bytes: self.least_per_window(self.window.1),
                    after_ms: window.as_millis() as u64,
                })
            }
        }
    }

    /// What a rate window that began at `from` bytes must bring: a piece,
    /// or the rest of the body.
    fn least_per_window(&self, from: u64) -> u64 {
        (PIECE as u64).min(self.expected - from)
    }

    /// Read the body and drop it, holding one read's chunks at a time:
    /// what a refused request on a pipeline sent must be taken off the
    /// stream to keep its framing, and costs nothing held.
    pub(super) async fn discard(mut self) -> Result<(), ApiError> {
        while self.received < self.expected {
            if self.arrived.is_empty() {
                self.read_some().await?;
            }
            while let Some(c) = self.arrived.pop_front() {
                self.received += c.len() as u64;
                self.arrived_bytes -= c.len() as u64;
            }
        }
        Ok(())
    }

    /// The whole body, for one that is bounded small.
    pub(super) async fn read_all(mut self) -> Result<Vec<u8>, ApiError> {
        // Grown as bytes arrive (doubling, never past the length
        // announced), not to that length before they do.
        let expected = usize::try_from(self.expected).unwrap_or(usize::MAX);
        let mut out = Vec::with_capacity(expected.min(PIECE));
        while self.received < self.expected {
            if self.arrived.is_empty() {
                self.read_some().await?;
            }
            let need = out.len() + self.arrived_bytes as usize;
            if need > out.capacity() {
                let to = need.max(out.capacity() * 2).min(expected);
                out.reserve_exact(to - out.len());
            }
            for c in self.arrived.drain(..) {
                out.extend_from_slice(&c);
                self.received += c.len() as u64;
            }
            self.arrived_bytes = 0;
        }
        Ok(out)
    }
}
