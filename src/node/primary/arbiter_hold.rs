//! The primary under an arbiter (automatic failover): every
//! acknowledgement needs this life's unexpired lease, judged as the
//! answer leaves, and a `twin` request is answered `Local` only once "not
//! in sync" is recorded. Without an arbiter none of this applies.

use std::sync::Arc;

use super::*;
use crate::node::arbiter::sync::SyncRecorder;
use crate::node::arbiter::{LeaseGate, LeaseShown};

/// This life's lease and sync record.
#[derive(Debug)]
pub(super) struct Held {
    gate: Arc<LeaseGate>,
    sync: Arc<SyncRecorder>,
}

/// What the arbiter holds of this primary, for `status`.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ArbiterShown {
    pub lease: LeaseShown,
    /// Whether the arbiter records the twin in sync.
    pub twin_in_sync: bool,
}

impl Primary {
    /// Serve under `gate`'s lease, recording the twin's sync state with
    /// `sync`; the twin's acknowledgements are followed from now on to
    /// record it in sync once it caught up. Answers false if a lease was
    /// set already.
    pub fn hold_lease(self: &Arc<Self>, gate: Arc<LeaseGate>, sync: Arc<SyncRecorder>) -> bool {
        if self
            .arbiter
            .set(Held {
                gate,
                sync: sync.clone(),
            })
            .is_err()
        {
            return false;
        }
        let mut acked = self.acked.subscribe();
        let mut streams = self.twin_streams.subscribe();
        tokio::spawn(async move {
            loop {
                // Only what a twin streaming in this life acknowledged
                // counts: before one streams, the head it "acknowledged"
                // is no twin's word.
                if *streams.borrow_and_update() {
                    let a = *acked.borrow_and_update();
                    if let Err(e) = sync.maybe_caught_up(a).await {
                        tracing::warn!(error = %e, "the twin's catching up is not recorded yet");
                    }
                }
                tokio::select! {
                    r = acked.changed() => if r.is_err() { return },
                    r = streams.changed() => if r.is_err() { return },
                }
            }
        });
        true
    }

    /// The arbiter's view of this primary, when it runs under one.
    pub fn arbiter_shown(&self) -> Option<ArbiterShown> {
        self.arbiter.get().map(|h| ArbiterShown {
            lease: h.gate.shown(),
            twin_in_sync: h.sync.in_sync(),
        })
    }

    /// Refused when this life's lease does not hold now; `seq` is a frame
    /// appended here before the refusal.
    pub(super) fn lease_refusal(&self, seq: Option<u64>) -> Option<ApiError> {
        let held = self.arbiter.get()?;
        held.gate
            .may_acknowledge()
            .err()
            .map(|why| ApiError::NoLease {
                why: why.to_string(),
                seq,
            })
    }

    /// An answer as it leaves: an acknowledgement becomes `NoLease` when
    /// the lease does not hold at this moment, and an error is counted by
    /// its name.
    pub(super) fn outgoing(&self, resp: Response) -> Response {
        let seq = match &resp {
            Response::Appended { seq, .. } | Response::Erased { seq, .. } => Some(*seq),
            Response::Pushed {
                pack_seq, refs_seq, ..
            } => refs_seq.or(*pack_seq),
            Response::Retained { .. } => None,
            _ => return self.refusals.answered(resp),
        };
        let resp = match self.lease_refusal(seq) {
            Some(why) => Response::Error(why),
            None => resp,
        };
        self.refusals.answered(resp)
    }

    /// Before a `twin` request for frame `seq` is answered `Local`: "not
    /// in sync" recorded first, or the refusal to give instead.
    pub(super) async fn before_answering_less(&self, seq: u64) -> Result<(), ApiError> {
        let Some(held) = self.arbiter.get() else {
            return Ok(());
        };
        let durable = *self.durable.borrow();
        let acked = *self.acked.borrow();
        held.sync
            .before_answering_less(durable.max(seq), acked)
            .await
            .map_err(|e| ApiError::SyncNotRecorded {
                seq,
                why: e.to_string(),
            })
    }
}
