//! A twin watching the leader key: once the primary's lease ended (the
//! key is gone), it takes the next term and the leader key under its own
//! lease in one transaction, if the last primary recorded it in sync and
//! it holds what was recorded ([`crate::repl::arbiter::take_over`]).
//! Otherwise it says why it may not, and nothing is promoted. A read of
//! etcd that forgot what this box knows is not acted on: the twin then
//! takes over only with the primary's history in hand
//! ([`crate::repl::amnesia`]).

use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use super::life::{mint_generation, Knowing};
use super::{Arbiter, ArbiterError};
use crate::repl::arbiter::LeaderRecord;
use crate::repl::claim::{claim_take_over, Step as Decided};
use crate::repl::epochs::EpochName;

/// What the watch sees, for `status`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TakeOverShown {
    /// Whether the last read of the arbiter was answered.
    pub etcd_reachable: bool,
    #[serde(default)]
    pub etcd_error: Option<String>,
    /// The leader the arbiter names, if any.
    #[serde(default)]
    pub leader: Option<LeaderRecord>,
    /// With no leader: why this twin may not take over.
    #[serde(default)]
    pub not_eligible: Option<String>,
    /// Why etcd is not believed now: it forgot what this box knows.
    #[serde(default)]
    pub amnesia: Option<String>,
}

/// The term this twin took, under `lease`, with the clients the last
/// primary served.
#[derive(Debug)]
pub struct TookOver {
    pub epoch: u64,
    pub lease: i64,
    pub clients: Vec<crate::repl::HandedClient>,
    /// The last read of the arbiter that still named the old primary (or
    /// the watch's start): the old lease ended after it.
    pub leader_last_seen: tokio::time::Instant,
}

/// How often the twin reads the arbiter: a tenth of the TTL, so a dead
/// primary is replaced within about the TTL and a tenth of it.
fn poll(ttl: Duration) -> Duration {
    (ttl / 10).clamp(Duration::from_millis(50), Duration::from_millis(500))
}

/// Watch until this twin took over (or `stop`): `head` answers its
/// durable head when asked.
pub async fn watch(
    arbiter: Arbiter,
    me: LeaderRecord,
    head: impl Fn() -> u64,
    knowing: Knowing,
    shown: watch::Sender<TakeOverShown>,
    mut stop: watch::Receiver<bool>,
) -> Option<TookOver> {
    let every = poll(arbiter.options().ttl);
    let mut said = String::new();
    let mut leader_last_seen = crate::node::clock::instant();
    loop {
        let step = attempt(&arbiter, &me, head(), &knowing).await;
        let amnesia = knowing.amnesia.borrow().clone();
        match step {
            Ok(Step::TookOver(t)) => {
                return Some(TookOver {
                    leader_last_seen,
                    ..t
                })
            }
            Ok(Step::Led(l)) => {
                leader_last_seen = crate::node::clock::instant();
                shown.send_replace(TakeOverShown {
                    etcd_reachable: true,
                    leader: Some(l),
                    amnesia,
                    ..Default::default()
                });
            }
            Ok(Step::NotEligible { why, led }) => {
                if why != said {
                    // Before any primary led there is nothing to take over;
                    // after etcd forgot, the wait is the pair's rule, not a
                    // fault of its own.
                    if amnesia.is_some() {
                        tracing::warn!(why = %why, "etcd forgot: this twin does not take over");
                    } else if led {
                        tracing::error!(why = %why, "the primary's lease ended and this twin may not take over: nothing is promoted");
                    } else {
                        tracing::info!(why = %why, "no primary has led yet");
                    }
                    said = why.clone();
                }
                shown.send_replace(TakeOverShown {
                    etcd_reachable: true,
                    not_eligible: Some(why),
                    amnesia,
                    ..Default::default()
                });
            }
            Ok(Step::Raced) => {}
            Err(e) => {
                shown.send_modify(|s| {
                    s.etcd_reachable = false;
                    s.etcd_error = Some(e.to_string());
                });
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = stop.wait_for(|&s| s) => return None,
        }
    }
}

enum Step {
    TookOver(TookOver),
    Led(LeaderRecord),
    NotEligible { why: String, led: bool },
    Raced,
}

async fn attempt(
    arbiter: &Arbiter,
    me: &LeaderRecord,
    head: u64,
    knowing: &Knowing,
) -> Result<Step, ArbiterError> {
    let view = arbiter.view().await?;
    let fresh = mint_generation();
    let claim = knowing
        .decide(&view, |known| {
            claim_take_over(arbiter.keys(), &view, known, head, me, &fresh)
        })
        .await;
    let claim = match claim {
        Ok(c) => c,
        // The read is not acted on while what it taught is not kept.
        Err(why) => {
            return Ok(match view.leader {
                None => Step::NotEligible { why, led: true },
                Some(l) => {
                    tracing::warn!(error = %why, "etcd was read");
                    Step::Led(l.value)
                }
            })
        }
    };
    let (epoch, txn, generation) = match claim.step {
        Decided::Take {
            epoch,
            txn,
            generation,
        } => (epoch, txn, generation),
        Decided::Led(l) => return Ok(Step::Led(l)),
        Decided::NotNow(why) => {
            return Ok(Step::NotEligible {
                why: why.to_string(),
                led: view.epoch.is_some() || claim.amnesia.is_some(),
            })
        }
        Decided::Wait(why) => return Ok(Step::NotEligible { why, led: true }),
        Decided::Replaced { .. } | Decided::AskPeer => {
            return Ok(Step::NotEligible {
                why: "the other box's word was not heard".into(),
                led: true,
            })
        }
    };
    let (lease, _) = arbiter.grant().await?;
    let Some(revision) = arbiter.run(&txn, lease).await? else {
        let _ = arbiter.revoke(lease).await;
        return Ok(Step::Raced);
    };
    if let Err(e) = knowing.record_taken(epoch, revision, generation) {
        // Refusing is always safe: give the key back.
        let _ = arbiter.revoke(lease).await;
        return Ok(Step::NotEligible {
            why: format!("recording the new epoch in ARBITER: {e}"),
            led: true,
        });
    }
    tracing::warn!(
        epoch = %EpochName(epoch),
        head,
        "the primary's lease ended: this twin took the next term and the leader key"
    );
    Ok(Step::TookOver(TookOver {
        epoch,
        lease,
        clients: view.clients,
        leader_last_seen: crate::node::clock::instant(),
    }))
}
