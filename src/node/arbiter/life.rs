//! A primary taking its life from the arbiter: the epoch by
//! compare-and-swap on the epoch key and the leader key under a new
//! lease, in one transaction ([`crate::repl::arbiter::begin_life`]). Until
//! it holds them it serves nothing: a restarted primary starts fenced.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use super::{Arbiter, ArbiterError, LeaseGate};
use crate::repl::arbiter::{self, LeaderRecord, NotNow};
use crate::repl::epochs::EpochName;
use crate::repl::lease::LeaseRules;
use crate::repl::HandedClient;

/// What a primary's start found.
#[derive(Debug)]
pub enum Begun {
    /// This life's epoch, held under `gate`'s lease; the leader key was
    /// written at `revision`.
    Life {
        epoch: u64,
        gate: Arc<LeaseGate>,
        revision: i64,
    },
    /// A newer term was taken: another box is, or was made, the primary.
    Replaced {
        newer: u64,
        leader: Option<LeaderRecord>,
    },
}

/// Why the wait for a life ended without one.
#[derive(Debug, thiserror::Error)]
pub enum NoLife {
    #[error("stopped while waiting for the arbiter")]
    Stopped,
    #[error(transparent)]
    Arbiter(#[from] ArbiterError),
}

/// How often a primary waiting for its life looks again.
fn poll(ttl: Duration) -> Duration {
    (ttl / 10).clamp(Duration::from_millis(50), Duration::from_millis(500))
}

/// Take a life: `mine` is the epoch the box holds (`unserved`: begun by a
/// promotion no process served), `me` its record, `clients` the clients
/// it serves. Waits while etcd is unreachable or another box's lease
/// holds, saying why in the log and on `waiting`.
pub async fn begin(
    arbiter: &Arbiter,
    mine: u64,
    unserved: bool,
    me: &LeaderRecord,
    clients: &[HandedClient],
    waiting: &watch::Sender<Option<String>>,
    mut stop: watch::Receiver<bool>,
) -> Result<Begun, NoLife> {
    let rules = LeaseRules::new(arbiter.options().ttl);
    let mut said = String::new();
    let mut say = |why: String| {
        if why != said {
            tracing::warn!(why = %why, "this primary waits for its lease before it serves");
            said = why.clone();
        }
        waiting.send_replace(Some(why));
    };
    loop {
        if *stop.borrow() {
            return Err(NoLife::Stopped);
        }
        match try_begin(arbiter, rules, mine, unserved, me, clients).await {
            Ok(Some(begun)) => {
                waiting.send_replace(None);
                return Ok(begun);
            }
            Ok(None) => say("the arbiter's keys changed under the transaction".into()),
            Err(Wait::Led(l)) => say(format!(
                "{} leads at {}, epoch {}: waiting for its lease to end",
                l.fingerprint,
                l.addr,
                EpochName(l.epoch)
            )),
            Err(Wait::NotNow(why)) => say(why.to_string()),
            Err(Wait::Arbiter(e)) => say(e.to_string()),
        }
        tokio::select! {
            _ = tokio::time::sleep(poll(rules.ttl)) => {}
            _ = stop.wait_for(|&s| s) => return Err(NoLife::Stopped),
        }
    }
}

enum Wait {
    Led(LeaderRecord),
    NotNow(NotNow),
    Arbiter(ArbiterError),
}

impl From<ArbiterError> for Wait {
    fn from(e: ArbiterError) -> Self {
        Wait::Arbiter(e)
    }
}

/// One attempt: `None` when the transaction found the keys changed.
async fn try_begin(
    arbiter: &Arbiter,
    rules: LeaseRules,
    mine: u64,
    unserved: bool,
    me: &LeaderRecord,
    clients: &[HandedClient],
) -> Result<Option<Begun>, Wait> {
    let view = arbiter.view().await?;
    let (epoch, mut txn) = match arbiter::begin_life(arbiter.keys(), &view, mine, unserved, me) {
        Ok(t) => t,
        Err(NotNow::Replaced { newer, .. }) => {
            return Ok(Some(Begun::Replaced {
                newer,
                leader: view.leader.map(|l| l.value),
            }))
        }
        Err(NotNow::Led(l)) => return Err(Wait::Led(l)),
        // `begin_life` refuses only as above; a refusal it may learn
        // later is waited out and said as it is.
        Err(other) => return Err(Wait::NotNow(other)),
    };
    txn.then
        .push(arbiter::record_clients(arbiter.keys(), clients));
    let gate = LeaseGate::new(rules);
    let ask = gate.ask();
    let (id, granted) = arbiter.grant().await?;
    gate.set_id(id);
    gate.answered(ask, granted);
    let Some(revision) = arbiter.run(&txn, id).await? else {
        let _ = arbiter.revoke(id).await;
        return Ok(None);
    };
    // The leader key was this box's own, from an earlier life: that
    // life's lease has nothing left to hold.
    if view.leader.is_some() && view.leader_lease != 0 && view.leader_lease != id {
        if let Err(e) = arbiter.revoke(view.leader_lease).await {
            tracing::debug!(error = %e, "an earlier life's lease was not revoked; it runs out");
        }
    }
    tracing::info!(
        epoch = %EpochName(epoch),
        lease = id,
        granted_ms = granted.as_millis() as u64,
        "this primary holds the leader key under its lease"
    );
    Ok(Some(Begun::Life {
        epoch,
        gate,
        revision,
    }))
}
