//! The archive: sealed segments and store snapshots kept in an
//! S3-compatible bucket, past the reach of one pair's disks.
//!
//! - [`object`]: an archived object's bytes (pieces, footer, trailer);
//! - [`codec`]: each piece compressed and sealed on its own;
//! - [`walk`]: a segment's frames checked against their crcs, in pieces;
//! - [`names`]: object names, unique per lineage, segment and version;
//! - [`bucket`]: the S3-compatible bucket (or a directory);
//! - [`upload`]: one sealed segment checked, cut, sealed and sent;
//! - [`archiver`]: the thread that archives every sealed segment and
//!   holds retention's floor;
//! - `seen`: what the box recorded of the bucket, checked before a drop;
//! - [`erase`]: erases carried to the archived copies of their frames;
//! - [`snapshot`]: store snapshots archived, and fetched back;
//! - [`push`]: a stopped box's sealed segments archived from the CLI;
//! - [`restore`]: a fresh box filled from the archive to a frame or time;
//! - [`head`]: the head record, how far the archive reached;
//! - [`held`]: a resumed restore's frames compared with the archive's;
//! - [`tiered`]: frames below the local floor read from the archive.

pub mod archiver;
pub mod bucket;
pub mod codec;
pub mod erase;
pub mod fetch;
pub mod head;
pub mod held;
pub mod names;
pub mod object;
pub mod push;
pub mod replay;
pub mod restore;
pub(crate) mod seen;
#[cfg(test)]
mod seen_model;
pub mod snapshot;
pub mod tiered;
pub mod upload;
pub mod walk;

/// What the archive refuses or fails at.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Stored bytes do not decode or do not match their crc.
    #[error("corrupt archive object: {0}")]
    Corrupt(String),
    /// The object is sealed and no key was given.
    #[error("{object}: the object is encrypted: name the key file ([archive] key_file)")]
    KeyNeeded { object: String },
    /// The object was sealed under another key.
    #[error("{object}: encrypted under key {sealed_under}, which the key file does not hold (it holds {given})")]
    WrongKey {
        object: String,
        sealed_under: String,
        given: String,
    },
    /// A piece failed to open: altered, moved or renamed, or sealed under
    /// another key (the footer is piece 2^64 - 1).
    #[error("{object}: {} does not open under this key: altered, moved or renamed", piece_name(*.piece))]
    Unseal { object: String, piece: u64 },
    /// An object that is not sealed, in an archive read with a key: anyone
    /// who can write to the bucket could have put it there.
    #[error("{object}: not encrypted, where every object of this archive is (it claims {claims}): refused, as anyone who can write to the bucket could have put it there")]
    Unsealed { object: String, claims: String },
    /// The key file is missing, unreadable or malformed.
    #[error("archive key: {0}")]
    Key(String),
    /// Compression or encoding failed.
    #[error("archive codec: {0}")]
    Codec(String),
    /// The archive's URL or settings do not make a bucket.
    #[error("archive: {0}")]
    Spec(String),
    /// The bucket refused or failed a request (after its retries).
    #[error("archive bucket: {0}")]
    Store(#[from] object_store::Error),
    /// A local file failed.
    #[error("archive: {0}")]
    Io(String),
    /// A segment's bytes changed while it was being archived (an erase
    /// rewrote it): the next pass archives its new bytes.
    #[error("the segment changed while it was archived")]
    Changed,
    /// A segment holds a frame an erase has begun and not finished: it
    /// is archived once the erase is done.
    #[error("an erase of the segment is under way")]
    EraseUnderway,
    /// The log refused a restored frame.
    #[error("log: {0}")]
    Log(#[from] crate::log::Error),
    /// What a restore needs is not in the archive.
    #[error("{0}")]
    Missing(String),
    /// The archive's head record says it reached further than its
    /// segments do: objects were lost, or the bucket rolled back.
    #[error("the archive's head record (generation {generation}) says frames up to {head_last} were archived, but its segments reach frame {reached}: frames {from} to {to}, which this restore asks for, are gone from the bucket (deleted, or the bucket rolled back). Restore what is there with --accept-shorter")]
    Shorter {
        head_last: u64,
        generation: u64,
        reached: u64,
        from: u64,
        to: u64,
    },
    /// `--until-time` before every time mark the archive holds.
    #[error(
        "no archived frame was marked as durable by then: the archive's first marks are later"
    )]
    NothingByTime { unix_ms: u64 },
    /// The box is not fresh: a restore fills an empty box.
    #[error("the box is not fresh: {0}")]
    NotFresh(String),
}

/// A piece as refusals name it.
fn piece_name(piece: u64) -> String {
    if piece == codec::FOOTER_PIECE {
        "its footer".into()
    } else {
        format!("piece {piece}")
    }
}

impl Error {
    /// The same error, naming the object it was found in.
    pub fn in_object(self, key: &str) -> Error {
        match self {
            Error::Corrupt(m) => Error::Corrupt(format!("{key}: {m}")),
            Error::Unseal { piece, .. } => Error::Unseal {
                object: key.to_owned(),
                piece,
            },
            other => other,
        }
    }
}
