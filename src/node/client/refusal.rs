//! Why the primary refused a write or a read, by name, so that a client
//! can tell a box that must be restarted from a request that was too
//! large without reading an English sentence. Carried inside
//! [`ApiError::Refused`](super::ApiError::Refused) and
//! [`ApiError::Read`](super::ApiError::Read); the variant indices are the
//! wire format (`docs/PROTOCOL.md`).

use serde::{Deserialize, Serialize};

use crate::log::Error as LogError;

/// A write the log, or the write path in front of it, did not take.
/// Nothing of the request was written.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum WriteRefusal {
    /// This box's log is a follower: it takes frames only at its
    /// primary's sequence numbers.
    #[error("this box's log is a follower: it takes no client append")]
    Follower,
    /// A write or fsync failed earlier; the log takes nothing until the
    /// daemon restarts and recovers it.
    #[error("the log is poisoned by an earlier failure ({why}): it takes nothing until the daemon restarts")]
    Poisoned { why: String },
    /// The log gave up its files: the box is being demoted or stopped.
    #[error("the log has released its files: this box is being demoted or stopped")]
    Released,
    /// A length past its limit.
    #[error("{what} of {len} bytes exceeds the limit of {max}")]
    TooLarge { what: String, len: u64, max: u64 },
    /// The body held more or fewer bytes than the request announced.
    #[error("the blob was announced as {announced} bytes, {got} were given")]
    BlobLength { announced: u64, got: u64 },
    /// A kind value that is not a frame kind.
    #[error("{kind} is not a frame kind")]
    InvalidKind { kind: u16 },
    /// Meta bytes that do not decode.
    #[error("bad meta: {why}")]
    BadMeta { why: String },
    /// The disk is full.
    #[error("the disk is full: {why}")]
    NoSpace { why: String },
    /// The file system failed otherwise.
    #[error("I/O error: {why}")]
    Io { why: String },
    /// A retain by hand past the twin's position, without `force`.
    #[error("retaining from {seq} drops frames the twin has not acknowledged (its position is {twin_at}); it would need a snapshot: pass --force (force: true) to retain from {seq} anyway")]
    TwinNotPast { seq: u64, twin_at: u64 },
    /// A retain by hand past what the store has applied.
    #[error("the store has applied up to {applied}: frames past it stay")]
    StoreNotPast { applied: u64 },
    /// The body could not be staged on this box's disk.
    #[error("staging the body failed: {why}")]
    Staging { why: String },
    /// The primary is stopping: the thread that writes went away.
    #[error("the primary is stopping ({why}): nothing was written")]
    Stopping { why: String },
    /// Any other failure of the log.
    #[error("the log failed: {why}")]
    Log { why: String },
    /// A retain by hand past what the archive holds: frames from
    /// `archived_below` on are not archived yet.
    #[error("the archive holds the frames below {archived_below}: frames from it on stay until archived")]
    ArchiveNotPast { archived_below: u64 },
}

impl WriteRefusal {
    /// Its name, as the metrics count it.
    pub fn name(&self) -> &'static str {
        match self {
            WriteRefusal::Follower => "Refused.Follower",
            WriteRefusal::Poisoned { .. } => "Refused.Poisoned",
            WriteRefusal::Released => "Refused.Released",
            WriteRefusal::TooLarge { .. } => "Refused.TooLarge",
            WriteRefusal::BlobLength { .. } => "Refused.BlobLength",
            WriteRefusal::InvalidKind { .. } => "Refused.InvalidKind",
            WriteRefusal::BadMeta { .. } => "Refused.BadMeta",
            WriteRefusal::NoSpace { .. } => "Refused.NoSpace",
            WriteRefusal::Io { .. } => "Refused.Io",
            WriteRefusal::TwinNotPast { .. } => "Refused.TwinNotPast",
            WriteRefusal::StoreNotPast { .. } => "Refused.StoreNotPast",
            WriteRefusal::Staging { .. } => "Refused.Staging",
            WriteRefusal::Stopping { .. } => "Refused.Stopping",
            WriteRefusal::Log { .. } => "Refused.Log",
            WriteRefusal::ArchiveNotPast { .. } => "Refused.ArchiveNotPast",
        }
    }
}

impl From<LogError> for WriteRefusal {
    fn from(e: LogError) -> WriteRefusal {
        match e {
            LogError::Follower => WriteRefusal::Follower,
            LogError::Poisoned(why) => WriteRefusal::Poisoned { why },
            LogError::Released => WriteRefusal::Released,
            LogError::TooLarge { what, len, max } => WriteRefusal::TooLarge {
                what: what.into(),
                len,
                max,
            },
            LogError::BlobLength { announced, got } => WriteRefusal::BlobLength { announced, got },
            LogError::InvalidKind(kind) => WriteRefusal::InvalidKind { kind },
            LogError::BadMeta(why) => WriteRefusal::BadMeta { why: why.into() },
            LogError::Io(e) => io_refusal(&e),
            other => WriteRefusal::Log {
                why: other.to_string(),
            },
        }
    }
}

/// A failed write to the disk, with a full disk named as such.
pub fn io_refusal(e: &std::io::Error) -> WriteRefusal {
    if e.kind() == std::io::ErrorKind::StorageFull || e.raw_os_error() == Some(libc::ENOSPC) {
        WriteRefusal::NoSpace { why: e.to_string() }
    } else {
        WriteRefusal::Io { why: e.to_string() }
    }
}

/// A read that found no frame to send. Nothing of a frame was sent.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum ReadRefusal {
    /// Retention dropped the frame: the log starts at `first`.
    #[error("sequence {seq} is below the retention floor {first}")]
    BelowFloor { seq: u64, first: u64 },
    /// The frame is not written yet.
    #[error("sequence {seq} is past the head {head}")]
    PastHead { seq: u64, head: u64 },
    /// The frame is there and does not read: the disk failed, or its
    /// bytes do not check.
    #[error("frame {seq} does not read: {why}")]
    Unreadable { seq: u64, why: String },
}

impl ReadRefusal {
    /// Its name, as the metrics count it.
    pub fn name(&self) -> &'static str {
        match self {
            ReadRefusal::BelowFloor { .. } => "Read.BelowFloor",
            ReadRefusal::PastHead { .. } => "Read.PastHead",
            ReadRefusal::Unreadable { .. } => "Read.Unreadable",
        }
    }

    /// The log's failure to read frame `seq`, by name.
    pub fn of(seq: u64, e: LogError) -> ReadRefusal {
        match e {
            LogError::BelowFloor { seq, first } => ReadRefusal::BelowFloor { seq, first },
            LogError::PastHead { seq, head } => ReadRefusal::PastHead { seq, head },
            other => ReadRefusal::Unreadable {
                seq,
                why: other.to_string(),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_log_s_refusals_keep_their_names_and_figures() {
        assert_eq!(
            WriteRefusal::from(LogError::Follower),
            WriteRefusal::Follower
        );
        assert_eq!(
            WriteRefusal::from(LogError::TooLarge {
                what: "meta",
                len: 70_000,
                max: 65_535
            }),
            WriteRefusal::TooLarge {
                what: "meta".into(),
                len: 70_000,
                max: 65_535
            }
        );
        assert_eq!(
            WriteRefusal::from(LogError::BlobLength {
                announced: 10,
                got: 4
            }),
            WriteRefusal::BlobLength {
                announced: 10,
                got: 4
            }
        );
        let full = std::io::Error::from_raw_os_error(libc::ENOSPC);
        assert!(matches!(
            WriteRefusal::from(LogError::Io(full)),
            WriteRefusal::NoSpace { .. }
        ));
        let denied = std::io::Error::from_raw_os_error(libc::EACCES);
        assert!(matches!(
            WriteRefusal::from(LogError::Io(denied)),
            WriteRefusal::Io { .. }
        ));
        assert!(matches!(
            WriteRefusal::from(LogError::Corrupt("x".into())),
            WriteRefusal::Log { .. }
        ));
    }

    #[test]
    fn a_read_names_the_floor_and_the_head() {
        assert_eq!(
            ReadRefusal::of(3, LogError::BelowFloor { seq: 3, first: 9 }),
            ReadRefusal::BelowFloor { seq: 3, first: 9 }
        );
        assert_eq!(
            ReadRefusal::of(12, LogError::PastHead { seq: 12, head: 11 }),
            ReadRefusal::PastHead { seq: 12, head: 11 }
        );
        assert!(matches!(
            ReadRefusal::of(5, LogError::Corrupt("bad crc".into())),
            ReadRefusal::Unreadable { seq: 5, .. }
        ));
    }
}
