//! The primary recording in the arbiter whether its twin holds every
//! frame it acknowledged (PostgreSQL Patroni's `/sync`): "not in sync"
//! before any `twin` request is answered with less, "in sync" once the
//! twin caught up. Both are written only while this life leads, and one
//! at a time, so a "caught up" judged before a lesser answer can never
//! be written after it.
//!
//! Caught up means the twin acknowledged the floor: the head this life
//! began at, raised to the durable head at each lesser answer. Every
//! frame past the floor that was acknowledged `twin` was acknowledged
//! only once the twin held it; under a steady stream the twin is always
//! a little behind the head, and in sync all the same.

use std::sync::atomic::{AtomicBool, Ordering};

use super::{Arbiter, ArbiterError};
use crate::repl::arbiter::{self, SyncRecord, SyncState, SyncStep};

/// One life's sync record.
#[derive(Debug)]
pub struct SyncRecorder {
    arbiter: Arbiter,
    epoch: u64,
    /// The revision this life wrote its leader key at.
    leader_revision: i64,
    /// The twin's fingerprint.
    twin: String,
    state: tokio::sync::Mutex<Recorded>,
    in_sync: AtomicBool,
}

#[derive(Debug)]
struct Recorded {
    state: SyncState,
    /// What the twin must have acknowledged to be in sync.
    floor: u64,
}

/// Why a record could not be written.
#[derive(Debug, thiserror::Error)]
pub enum SyncError {
    #[error("recording the twin's sync state: {0}")]
    Arbiter(#[from] ArbiterError),
    #[error("this life no longer holds the leader key: its sync record is not written")]
    NotLeading,
}

impl SyncRecorder {
    /// The recorder of the life begun at `epoch` from `head` (its log's
    /// head when it began), whose leader key was written at
    /// `leader_revision`; `twin` is the twin's fingerprint.
    pub fn new(
        arbiter: Arbiter,
        epoch: u64,
        leader_revision: i64,
        twin: String,
        head: u64,
    ) -> SyncRecorder {
        SyncRecorder {
            arbiter,
            epoch,
            leader_revision,
            twin,
            state: tokio::sync::Mutex::new(Recorded {
                state: SyncState::default(),
                floor: head,
            }),
            in_sync: AtomicBool::new(false),
        }
    }

    /// Whether the arbiter holds "in sync" for this life.
    pub fn in_sync(&self) -> bool {
        self.in_sync.load(Ordering::SeqCst)
    }

    /// Before a `twin` request is answered `Local`: "not in sync" is
    /// written, or the error says why it could not be (then the answer
    /// must not be given). `durable` is this box's durable head now,
    /// `acked` the twin's acknowledged head.
    pub async fn before_answering_less(&self, durable: u64, acked: u64) -> Result<(), SyncError> {
        let mut r = self.state.lock().await;
        r.floor = r.floor.max(durable);
        match r.state.before_answering_less() {
            SyncStep::Go => Ok(()),
            SyncStep::Record { in_sync } => self.write(&mut r.state, in_sync, acked).await,
        }
    }

    /// The twin acknowledged `acked`: "in sync" is written when that
    /// reaches the floor and is not recorded already. Answers whether it
    /// was written now.
    pub async fn maybe_caught_up(&self, acked: u64) -> Result<bool, SyncError> {
        let mut r = self.state.lock().await;
        if acked < r.floor {
            return Ok(false);
        }
        match r.state.twin_caught_up() {
            SyncStep::Go => Ok(false),
            SyncStep::Record { in_sync } => {
                self.write(&mut r.state, in_sync, acked).await?;
                Ok(true)
            }
        }
    }

    async fn write(
        &self,
        state: &mut SyncState,
        in_sync: bool,
        acked: u64,
    ) -> Result<(), SyncError> {
        let record = SyncRecord {
            epoch: self.epoch,
            twin: self.twin.clone(),
            in_sync,
            acked,
        };
        let txn = arbiter::record_sync(self.arbiter.keys(), self.leader_revision, &record);
        match self.arbiter.run(&txn, 0).await? {
            Some(_) => {
                state.recorded(in_sync);
                self.in_sync.store(in_sync, Ordering::SeqCst);
                tracing::info!(
                    in_sync,
                    acked,
                    "the twin's sync state is recorded in the arbiter"
                );
                Ok(())
            }
            None => Err(SyncError::NotLeading),
        }
    }
}
