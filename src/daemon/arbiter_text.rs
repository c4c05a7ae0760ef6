//! What `status` and `/metrics` say of automatic failover: on a primary
//! its lease and whether the arbiter records its twin in sync, on a twin
//! the leader the arbiter names or why it may not take over, and on both
//! whether etcd answers.

use super::metrics_text::{counter, gauge};
use crate::node::arbiter::take_over::TakeOverShown;
use crate::node::primary::ArbiterShown;

/// The primary's status lines.
pub fn render_primary_arbiter(a: &ArbiterShown) -> String {
    let l = &a.lease;
    let lease = match &l.refused {
        None => format!("held, {} ms left", l.remaining_ms),
        Some(why) => format!("NOT HELD ({why}): it acknowledges nothing"),
    };
    let etcd = match (&l.etcd_reachable, &l.etcd_error) {
        (true, _) => "reachable".to_owned(),
        (false, Some(e)) => format!("UNREACHABLE: {e}"),
        (false, None) => "not asked yet".to_owned(),
    };
    format!(
        "arbiter: lease {lease}; twin {}; etcd {etcd}; renewals {} ({} failed)\n",
        if a.twin_in_sync {
            "recorded in sync"
        } else {
            "NOT recorded in sync: it may not take over"
        },
        l.renewals,
        l.renewals_failed
    )
}

/// The twin's status lines.
pub fn render_twin_arbiter(a: &TakeOverShown) -> String {
    let mut out = match (&a.leader, &a.not_eligible) {
        (Some(l), _) => format!(
            "arbiter: {} leads at {}, epoch {}\n",
            l.fingerprint,
            l.addr,
            crate::repl::epochs::EpochName(l.epoch)
        ),
        (None, Some(why)) => {
            format!("arbiter: no leader, and this twin may not take over: {why}\n")
        }
        (None, None) => "arbiter: not read yet\n".to_owned(),
    };
    if let Some(why) = &a.amnesia {
        out.push_str(&format!("ARBITER AMNESIA: {why}\n"));
    }
    if !a.etcd_reachable {
        if let Some(e) = &a.etcd_error {
            out.push_str(&format!("etcd: UNREACHABLE: {e}\n"));
        }
    }
    out
}

/// The primary's metrics.
pub(super) fn primary_arbiter_metrics(out: &mut String, a: &ArbiterShown) {
    gauge(
        out,
        "twinlog_lease_held",
        "1 while this primary's lease from the arbiter allows acknowledgements.",
        u8::from(a.lease.refused.is_none()),
    );
    gauge(
        out,
        "twinlog_lease_remaining_seconds",
        "What is left of the lease on this box's clock, less the drift and stall margins.",
        a.lease.remaining_ms as f64 / 1000.0,
    );
    gauge(
        out,
        "twinlog_twin_in_sync",
        "1 while the arbiter records the twin in sync (it may take over).",
        u8::from(a.twin_in_sync),
    );
    gauge(
        out,
        "twinlog_etcd_reachable",
        "1 when the last call to etcd was answered.",
        u8::from(a.lease.etcd_reachable),
    );
    counter(
        out,
        "twinlog_lease_renewals_failed_total",
        "Lease renewals that failed.",
        a.lease.renewals_failed,
    );
}

/// The twin's metrics.
pub(super) fn twin_arbiter_metrics(out: &mut String, a: &TakeOverShown) {
    gauge(
        out,
        "twinlog_etcd_reachable",
        "1 when the last call to etcd was answered.",
        u8::from(a.etcd_reachable),
    );
    gauge(
        out,
        "twinlog_take_over_eligible",
        "0 when the arbiter names no leader and this twin may not take over.",
        u8::from(a.not_eligible.is_none()),
    );
    gauge(
        out,
        "twinlog_arbiter_amnesia",
        "1 while etcd forgot what this box knows: nothing is led on its word alone.",
        u8::from(a.amnesia.is_some()),
    );
}
