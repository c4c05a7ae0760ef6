//! A request's body as the primary reads it: in pieces, each within a
//! deadline. A client that stops sending mid-body is cut off by name
//! (`BodyStalled`) instead of holding the log's writer, or the store, for
//! as long as it likes; what it sent becomes visible nowhere.

use std::time::Duration;

use quinn::RecvStream;

use super::PIECE;
use crate::node::api::ApiError;

/// The default wait for each piece of a body.
pub const DEFAULT_PIECE_DEADLINE: Duration = Duration::from_secs(3);

/// A body of `expected` bytes on a request stream.
pub(super) struct Body<'a> {
    recv: &'a mut RecvStream,
    expected: u64,
    received: u64,
    deadline: Duration,
}

impl<'a> Body<'a> {
    pub(super) fn new(recv: &'a mut RecvStream, expected: u64, deadline: Duration) -> Self {
        Body {
            recv,
            expected,
            received: 0,
            deadline,
        }
    }

    /// The next piece (at most [`PIECE`] bytes); `None` once the whole
    /// body arrived. A stream that ends short, fails, or sends nothing
    /// for the deadline is an error naming what arrived.
    pub(super) async fn next(&mut self) -> Result<Option<bytes::Bytes>, ApiError> {
        let left = self.expected - self.received;
        if left == 0 {
            return Ok(None);
        }
        let want = PIECE.min(usize::try_from(left).unwrap_or(PIECE));
        match tokio::time::timeout(self.deadline, self.recv.read_chunk(want, true)).await {
            Ok(Ok(Some(chunk))) => {
                self.received += chunk.bytes.len() as u64;
                Ok(Some(chunk.bytes))
            }
            Ok(Ok(None)) => Err(ApiError::BadRequest(format!(
                "the body ended after {} of its {} bytes",
                self.received, self.expected
            ))),
            Ok(Err(e)) => Err(ApiError::BadRequest(format!(
                "the body failed after {} of its {} bytes: {e}",
                self.received, self.expected
            ))),
            Err(_) => {
                tracing::warn!(
                    received = self.received,
                    expected = self.expected,
                    "a client stopped sending a body: cut off"
                );
                Err(ApiError::BodyStalled {
                    received: self.received,
                    expected: self.expected,
                    after_ms: self.deadline.as_millis() as u64,
                })
            }
        }
    }

    /// The whole body, for one that is bounded small.
    pub(super) async fn read_all(mut self) -> Result<Vec<u8>, ApiError> {
        let mut out = Vec::with_capacity(usize::try_from(self.expected).unwrap_or(0));
        while let Some(piece) = self.next().await? {
            out.extend_from_slice(&piece);
        }
        Ok(out)
    }
}
