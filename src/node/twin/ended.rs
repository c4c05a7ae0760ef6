//! Why a twin's session with its primary ended, and why a cut of the
//! frames the primary lost failed: by name, each saying what happened.

use crate::log::Error as LogError;
use crate::node::snapshot_transfer::SnapshotError;
use crate::repl::Refusal;
use crate::store::StoreError;

/// Why a session ended, when the link itself did not fail.
#[derive(Debug, thiserror::Error)]
pub enum Ended {
    #[error("adopting the primary's history: {0}")]
    AdoptHistory(LogError),
    #[error("recording epoch {epoch}: {error}")]
    RecordEpoch { epoch: u64, error: std::io::Error },
    #[error(
        "below the primary's retention floor {first} (primary head {primary_head}): a snapshot is needed"
    )]
    BelowFloor { first: u64, primary_head: u64 },
    /// The core refused what the primary sent, or the primary this twin.
    #[error("{0}")]
    Refused(Refusal),
    #[error("promoted to epoch {epoch} at a switchover")]
    Promoted { epoch: u64 },
    #[error("the switchover's promotion failed: {0}")]
    PromotionFailed(super::HandoverFailed),
    #[error("the primary closed the control stream")]
    ControlClosed,
    #[error("the frame stream ended")]
    FrameStreamOver,
    #[error("the writer stopped")]
    WriterStopped,
    #[error("shutting down")]
    ShuttingDown,
    #[error("snapshot installed at {at}: following from {}", at + 1)]
    SnapshotInstalled { at: u64 },
    #[error("snapshot fetch interrupted: {0}")]
    SnapshotFetch(SnapshotError),
    #[error("snapshot install failed: {0}")]
    SnapshotInstall(StoreError),
    #[error("snapshot install: {0}")]
    SnapshotInstallStopped(tokio::task::JoinError),
}

/// Why the frames the primary lost were not cut.
#[derive(Debug, thiserror::Error)]
pub enum CutError {
    #[error("this log's frame {after} does not read: {error}")]
    Unreadable { after: u64, error: StoreError },
    #[error(
        "this log's frame {after} (crc {here:08x}) is not the primary's ({theirs:08x}): the logs share no checked past, nothing is cut. Restore this box"
    )]
    NotThePrimarys { after: u64, here: u32, theirs: u32 },
    #[error("saving frames {from}..={head}: {error}")]
    Save {
        from: u64,
        head: u64,
        error: std::io::Error,
    },
    #[error("{0}")]
    Store(StoreError),
    #[error("{0}")]
    Log(LogError),
    #[error("{0}")]
    Stopped(tokio::task::JoinError),
}
