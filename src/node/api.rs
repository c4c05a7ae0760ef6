//! The client protocol: one bidirectional QUIC stream per request, a
//! length-prefixed postcard [`Request`], the request's blob bytes if it has
//! any, then a [`Response`] (and a frame's blob bytes after
//! `Response::Frame`). Documented in `docs/PROTOCOL.md`.

use serde::{Deserialize, Serialize};

/// How durable an append must be before it is acknowledged, as
/// PostgreSQL's `synchronous_commit`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Durability {
    /// Durable on the primary.
    Local,
    /// Durable on the primary, and the twin acknowledged a durable head at
    /// or past it.
    Twin,
}

/// What a client asks.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Request {
    /// Append a frame; `blob_len` bytes follow the request on the stream.
    Append {
        kind: u16,
        meta: Vec<u8>,
        blob_len: u64,
        durability: Durability,
    },
    /// Read one frame.
    Read { seq: u64 },
    /// The primary's state.
    Status,
    /// Frames from `from` on, each as it becomes durable, until the client
    /// closes the stream: a `Response::Frame` and its blob per frame.
    Tail { from: u64 },
}

/// What the primary answers.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Response {
    /// The frame has its sequence and is as durable as `durability` says.
    /// `twin_wait_us` is how long the primary waited, once the frame was
    /// durable locally, for the twin's acknowledgement (0 for `Local`).
    Appended {
        seq: u64,
        durability: Durability,
        twin_wait_us: u64,
    },
    /// A frame: its blob's `blob_len` bytes follow on the stream.
    Frame {
        seq: u64,
        kind: u16,
        meta: Vec<u8>,
        blob_len: u64,
        payload_crc: u32,
    },
    Status(Status),
    /// The request was refused or failed; nothing was changed unless the
    /// error says the frame is durable locally.
    Error(ApiError),
}

/// A request's failure, by name.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum ApiError {
    /// The log refused the frame (follower, poisoned, too large, ...).
    #[error("the log refused: {0}")]
    Refused(String),
    /// The frame is durable on the primary at `seq`, but the twin did not
    /// acknowledge it within the policy's timeout.
    #[error("frame {seq} is durable locally; the twin did not acknowledge it in time")]
    TwinTimeout { seq: u64 },
    /// Past the head, below the retention floor, or unreadable.
    #[error("read: {0}")]
    Read(String),
    /// A request this peer's role may not make.
    #[error("not allowed for this peer: {0}")]
    Forbidden(String),
    /// The request did not decode or its bytes ran short.
    #[error("bad request: {0}")]
    BadRequest(String),
}

/// The primary's view of itself and its twin.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Status {
    pub head: u64,
    pub first: u64,
    /// Whether a twin connection is streaming.
    pub twin_connected: bool,
    /// The twin's acknowledged durable head.
    pub twin_acked: u64,
    /// Acknowledgements from the twin that moved its durable head.
    pub twin_acks: u64,
    pub lag_frames: u64,
    pub lag_bytes: u64,
    pub lag_ms: u64,
    /// `twin` appends currently acknowledged as `local` because the twin is
    /// unreachable (the fall-back policy); cleared when it catches up.
    pub degraded: bool,
    /// Why the last twin connection ended, if it did.
    pub twin_last_error: Option<String>,
}
