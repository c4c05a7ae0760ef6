//! The primary's `Status`: what it says of itself and its twin, over the
//! client protocol (`Request::Status`), on `/status` and in `primary
//! status`.

use serde::{Deserialize, Serialize};

use super::api::Fence;

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
    /// The refusal, by name, that ended the last twin session (either
    /// side's), until a session streams again.
    pub twin_refusal: Option<crate::repl::Refusal>,
    /// The log's byte cap (0: none) and its bytes now.
    pub retention_max_bytes: u64,
    pub log_bytes: u64,
    /// The twin's position the retention holds: frames from it on are kept
    /// until the cap forces them out.
    pub twin_hold: u64,
    /// The frame at the twin's position is no longer retained: the twin
    /// needs a snapshot.
    pub twin_below_floor: bool,
    /// This box's store, when it keeps one.
    pub store: Option<crate::repl::StoreHealth>,
    /// The twin's store as it last reported it.
    pub twin_store: Option<crate::repl::StoreHealth>,
    /// The durability policy for a twin that does not acknowledge: `wait`,
    /// `fail 2s`, `fallback 2s`.
    pub policy: String,
    /// `twin` appends waiting for the twin's acknowledgement now.
    pub twin_waiting: u64,
    /// What poisoned the log, once a failed write or fsync did: every write
    /// is refused until a restart.
    pub log_poisoned: Option<String>,
    /// `primary`.
    pub role: String,
    /// The epoch this primary serves under.
    pub epoch: u64,
    /// The twinlog version serving.
    pub build: String,
    /// The last certificates refused because they are not pinned here.
    pub refused_peers: Vec<crate::net::Refused>,
    /// Set once a newer epoch fenced this primary: it acknowledges no
    /// write from then on.
    #[serde(default)]
    pub fenced: Option<Fence>,
    /// Whether a twin is pinned: without one, `twin` appends are refused
    /// at once with `NoTwin`.
    #[serde(default)]
    pub twin_configured: bool,
    /// Bytes of the memory budget requests hold now.
    #[serde(default)]
    pub memory_held: u64,
    /// Client connections open now.
    #[serde(default)]
    pub client_connections: u64,
    /// Client requests in progress now (a tail counts while it runs).
    #[serde(default)]
    pub client_requests: u64,
    /// Bytes of streamed bodies staged now, waiting to be whole.
    #[serde(default)]
    pub staging_held: u64,
    /// On a promoted box: the call to the primary it replaced.
    #[serde(default)]
    pub predecessor: Option<crate::node::predecessor::PredecessorStatus>,
    /// The last verify of the twin's frames against this log.
    #[serde(default)]
    pub last_verify: Option<crate::node::verify::VerifyReport>,
    /// What clients were refused since start, by the refusal's name
    /// (`ApiError::name`, or how a connection or stream was cut).
    #[serde(default)]
    pub refusals: std::collections::BTreeMap<String, u64>,
    /// Handshakes refused since start because the certificate is not
    /// pinned.
    #[serde(default)]
    pub unpinned_refused: u64,
    /// Under automatic failover: this life's lease and whether the
    /// arbiter records the twin in sync.
    #[serde(default)]
    pub arbiter: Option<crate::node::primary::ArbiterShown>,
    /// The last failover this box went through as the new primary.
    #[serde(default)]
    pub last_failover: Option<crate::node::failover::last::LastFailover>,
    /// With `[archive]` on: its floor, its lag and its last upload.
    #[serde(default)]
    pub archive: Option<crate::archive::archiver::ArchiveStatus>,
    /// Why this primary does not serve yet: waiting for its lease, for
    /// the other box's history after etcd forgot.
    #[serde(default)]
    pub waiting: Option<String>,
    /// Why etcd is not believed now: it forgot what this box knows.
    #[serde(default)]
    pub arbiter_amnesia: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Status travels in postcard, which has no field names: a field left
    /// out when empty (`skip_serializing_if`) would shift every one after
    /// it, and the client could not read a primary's status under an
    /// arbiter.
    #[test]
    fn a_status_under_an_arbiter_reads_back_as_sent_whatever_is_empty() {
        for refused in [None, Some("no lease yet".to_string())] {
            let mut status = Status::default();
            let mut shown = crate::node::primary::ArbiterShown::default();
            shown.lease.refused = refused.clone();
            shown.lease.etcd_error = refused;
            status.arbiter = Some(shown);
            let resp = super::super::api::Response::Status(Box::new(status.clone()));
            let bytes = crate::repl::msg::encode(&resp);
            let (back, _) =
                crate::repl::msg::decode::<super::super::api::Response>(&bytes).expect("decodes");
            assert_eq!(back, resp);
        }
    }
}
