//! The last failover a box went through, as `status` and the metrics show
//! it: which epoch it made, why, and how long it took.

use serde::{Deserialize, Serialize};

/// Why a box became the primary.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum FailoverCause {
    /// Automatic failover: the primary's lease ended (it renewed none
    /// within the TTL), and this twin, recorded in sync, took over.
    LeaseEnded,
    /// A switchover: the primary handed the role over.
    Switchover,
}

impl FailoverCause {
    pub fn name(self) -> &'static str {
        match self {
            FailoverCause::LeaseEnded => "lease_ended",
            FailoverCause::Switchover => "switchover",
        }
    }

    pub fn said(self) -> &'static str {
        match self {
            FailoverCause::LeaseEnded => {
                "the primary's lease ended, and this twin, recorded in sync, took over"
            }
            FailoverCause::Switchover => "a switchover: the primary handed the role over",
        }
    }
}

/// A failover this box went through, as the new primary.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LastFailover {
    /// The epoch it began.
    pub epoch: u64,
    pub cause: FailoverCause,
    /// From when the old primary was last known to lead (for
    /// `LeaseEnded`, the last read of the arbiter that still named it;
    /// for `Switchover`, when the twin stopped following it) to when
    /// this box served as the primary.
    pub took_ms: u64,
    /// When it served, in ms since the Unix epoch.
    pub at_unix_ms: u64,
}
