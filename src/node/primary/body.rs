//! A request's body as the primary reads it: in pieces, each within a
//! deadline. A client that stops sending mid-body is cut off by name
//! (`BodyStalled`) instead of holding the log's writer, or the store, for
//! as long as it likes; what it sent becomes visible nowhere.

use std::collections::VecDeque;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use quinn::RecvStream;

use super::PIECE;
use crate::node::api::ApiError;

/// The default wait for each piece of a body.
pub const DEFAULT_PIECE_DEADLINE: Duration = Duration::from_secs(3);

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
}

impl<'a> Body<'a> {
    pub(super) fn new(recv: &'a mut RecvStream, expected: u64, deadline: Duration) -> Self {
        Body {
            recv,
            expected,
            received: 0,
            deadline,
            arrived: VecDeque::new(),
            arrived_bytes: 0,
            exact: false,
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

    /// Wait for the next chunks, within the deadline, and take every one
    /// that has arrived (up to [`CHUNKS_PER_READ`]); bytes a client sent
    /// past its body are not the body and are dropped.
    async fn read_some(&mut self) -> Result<(), ApiError> {
        let mut chunks: [Bytes; CHUNKS_PER_READ] = std::array::from_fn(|_| Bytes::new());
        let got = self.received + self.arrived_bytes;
        let left = usize::try_from(self.expected - got).unwrap_or(usize::MAX);
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
        match tokio::time::timeout(self.deadline, read).await {
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
            Err(_) => {
                tracing::warn!(
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
        }
    }

    /// The whole body, for one that is bounded small.
    pub(super) async fn read_all(mut self) -> Result<Vec<u8>, ApiError> {
        let mut out = Vec::with_capacity(usize::try_from(self.expected).unwrap_or(0));
        while self.received < self.expected {
            if self.arrived.is_empty() {
                self.read_some().await?;
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
