//! Following a primary's log: frames as they become durable, each blob
//! whole or a piece at a time.

use std::time::Duration;

use super::api::Response;
use super::error::ClientError;
use super::timed::{read_announced, silent, timed, BODY_PIECE, MAX_WHOLE_BLOB};
use crate::log::Entry;
use crate::net::{self, NetError};

/// Frames from a primary as they become durable ([`Client::tail`]).
#[derive(Debug)]
pub struct Tailing {
    recv: quinn::RecvStream,
    conn: quinn::Connection,
    deadline: Duration,
}

/// A frame's head, as [`Tailing::next_streamed`] hands it over before its
/// blob.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FrameHead {
    pub seq: u64,
    pub kind: u16,
    pub meta: Vec<u8>,
    pub blob_len: u64,
    pub payload_crc: u32,
}

impl Tailing {
    pub(super) fn new(
        recv: quinn::RecvStream,
        conn: quinn::Connection,
        deadline: Duration,
    ) -> Tailing {
        Tailing {
            recv,
            conn,
            deadline,
        }
    }

    /// The next frame, its blob handed to `each` a piece at a time as it
    /// arrives (each piece within the deadline), never held whole: a frame
    /// of any size is exported in memory of one piece. The primary checks
    /// the frame's crc as it sends and cuts the stream short, an error
    /// here, when it fails. None when the primary ended the tail.
    pub async fn next_streamed(
        &mut self,
        mut each: impl FnMut(&FrameHead, &[u8]) -> std::io::Result<()>,
    ) -> Result<Option<FrameHead>, ClientError> {
        let next = net::read_msg::<Response>(&mut self.recv)
            .await
            .map_err(|e| silent(&self.conn, self.deadline, e.into()))?;
        let head = match next {
            None => return Ok(None),
            Some(Response::Frame {
                seq,
                kind,
                meta,
                blob_len,
                payload_crc,
            }) => {
                let (kind, meta) = super::as_appended(kind, meta);
                FrameHead {
                    seq,
                    kind,
                    meta,
                    blob_len,
                    payload_crc,
                }
            }
            Some(Response::Error(e)) => return Err(e.into()),
            Some(other) => return Err(ClientError::Unexpected(format!("{other:?}"))),
        };
        let mut got = 0u64;
        while got < head.blob_len {
            let want = (head.blob_len - got).min(BODY_PIECE as u64) as usize;
            let recv = &mut self.recv;
            let chunk = timed(&self.conn, self.deadline, async {
                recv.read_chunk(want, true)
                    .await
                    .map_err(|e| NetError::Io(std::io::Error::other(e.to_string())))
            })
            .await?;
            let Some(chunk) = chunk else {
                return Err(ClientError::Unexpected(format!(
                    "frame {}: the server announced {} bytes and sent {got}",
                    head.seq, head.blob_len
                )));
            };
            each(&head, &chunk.bytes).map_err(NetError::from)?;
            got += chunk.bytes.len() as u64;
        }
        Ok(Some(head))
    }

    /// The next frame; None when the primary ended the tail.
    pub async fn next(&mut self) -> Result<Option<Entry>, ClientError> {
        let next = net::read_msg::<Response>(&mut self.recv)
            .await
            .map_err(|e| silent(&self.conn, self.deadline, e.into()))?;
        let Some(resp) = next else {
            return Ok(None);
        };
        match resp {
            Response::Frame {
                seq,
                kind,
                meta,
                blob_len,
                payload_crc,
            } => {
                let blob = read_announced(
                    &self.conn,
                    self.deadline,
                    &mut self.recv,
                    blob_len,
                    MAX_WHOLE_BLOB,
                    "a frame",
                )
                .await?;
                let (kind, meta) = super::as_appended(kind, meta);
                Ok(Some(Entry {
                    seq,
                    kind,
                    meta,
                    blob,
                    payload_crc,
                }))
            }
            Response::Error(e) => Err(e.into()),
            other => Err(ClientError::Unexpected(format!("{other:?}"))),
        }
    }
}
