//! A primary taking its life from the arbiter: the epoch by
//! compare-and-swap on the epoch key and the leader key under a new
//! lease, in one transaction ([`crate::repl::arbiter::begin_life`]). Until
//! it holds them it serves nothing: a restarted primary starts fenced.
//! Every read of the arbiter is judged first against what the box
//! remembers ([`crate::repl::amnesia`]): after etcd forgot, a life is
//! taken only above both boxes' histories.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use super::memory::MemoryFile;
use super::peer::{word_of, word_within, Asker, Heard};
use super::{Arbiter, ArbiterError, LeaseGate};
use crate::repl::amnesia::{judge, Judged, Memory, PeerWord};
use crate::repl::arbiter::{self, LeaderRecord, NotNow};
use crate::repl::claim::{claim_life, Claim, Known, Step};
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
        /// The lease, to give back if the box cannot record the epoch.
        lease: i64,
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

/// How long a primary about to take a life on etcd's word waits for the
/// other box's word: a twin that follows it dials back sooner.
const TRUSTED_ASK: Duration = Duration::from_millis(200);

/// How often a primary waiting for its life looks again.
fn poll(ttl: Duration) -> Duration {
    (ttl / 10).clamp(Duration::from_millis(50), Duration::from_millis(500))
}

/// What a box knows beside the arbiter, to judge its word by: its memory
/// of it, its own word, the other box's as heard or asked, and an
/// operator's floor.
pub struct Knowing {
    pub memory: Arc<MemoryFile>,
    /// This box's word now: its epochs, durable head and newest epoch.
    pub own: Arc<dyn Fn() -> PeerWord + Send + Sync>,
    pub heard: Heard,
    pub asker: Option<Asker>,
    /// Where the other box serves as a primary, when known.
    pub peer_addr: Option<String>,
    /// `primary release --arbiter-lost --epoch-above N`: the floor an
    /// operator named, who knows the other box is gone for good.
    pub released_above: Arc<dyn Fn() -> Option<u64> + Send + Sync>,
    /// Why the arbiter is not believed now, shown in status and metrics.
    pub amnesia: watch::Sender<Option<String>>,
}

impl Knowing {
    /// The other box's address: as configured or learned.
    pub(super) fn peer_addr(&self) -> Option<String> {
        self.peer_addr
            .clone()
            .or_else(|| self.memory.get().peer.map(|p| p.addr))
    }

    /// The other box as the leader of `epoch`, when its address and key
    /// are known: it holds a newer epoch than this box (its word said so)
    /// though etcd names no leader.
    pub fn peer_leading(&self, epoch: u64) -> Option<LeaderRecord> {
        let addr = self.peer_addr()?;
        let fingerprint = match &self.asker {
            Some(a) => a.fingerprint().to_string(),
            None => self.memory.get().peer?.fingerprint,
        };
        Some(LeaderRecord {
            epoch,
            fingerprint,
            addr,
        })
    }

    /// A judge of reads while a life is held: why etcd is not believed,
    /// if it forgot what this box knows.
    pub fn forgetting(&self) -> super::gate::Forgetting {
        let (memory, own, amnesia) = (self.memory.clone(), self.own.clone(), self.amnesia.clone());
        Arc::new(
            move |view| match judge_read(view, &memory.get(), own().newest) {
                Judged::Forgot(why) => {
                    let why = why.to_string();
                    amnesia.send_replace(Some(why.clone()));
                    Some(why)
                }
                Judged::Trusted { .. } => None,
            },
        )
    }

    /// Decide on `view` as `claim` does ([`crate::repl::claim`]): when
    /// the arbiter forgot, the other box's word is heard or asked and the
    /// decision made again with it. What the read taught is recorded and
    /// the amnesia shown before the claim is answered.
    pub(super) async fn decide(
        &self,
        view: &crate::repl::arbiter::View,
        claim: impl Fn(&Known) -> Claim,
    ) -> Result<Claim, String> {
        let own = (self.own)();
        let judged = judge_read(view, &self.memory.get(), own.newest);
        let mut known = Known {
            judged,
            own,
            peer: None,
            released_above: (self.released_above)(),
        };
        let mut decided = claim(&known);
        if let Step::AskPeer = decided.step {
            let addr = self.peer_addr();
            let (asker, mine) = (self.asker.as_ref(), known.own.clone());
            let word = match decided.amnesia {
                // etcd forgot: nothing is led without the other's word.
                Some(_) => word_of(&self.heard, asker, addr.as_deref(), mine).await,
                // etcd remembers: the other box, if it answers at once,
                // may still know of a term etcd was rolled back past.
                None => word_within(&self.heard, asker, addr.as_deref(), mine, TRUSTED_ASK).await,
            };
            known.peer = Some(word.map_err(|e| e.to_string()));
            decided = claim(&known);
        }
        self.amnesia
            .send_replace(decided.amnesia.as_ref().map(|a| a.to_string()));
        if let Some(memory) = decided.keep.take() {
            self.memory
                .observe(memory)
                .map_err(|e| format!("recording what etcd holds in ARBITER: {e}"))?;
        }
        Ok(decided)
    }

    /// A take etcd committed at `epoch` and `revision`, under a new
    /// `generation` when it wrote one: kept in ARBITER before the box acts
    /// on it.
    pub(super) fn record_taken(
        &self,
        epoch: u64,
        revision: i64,
        generation: Option<String>,
    ) -> std::io::Result<()> {
        self.memory
            .update(|m| m.took(epoch, revision, generation))?;
        self.amnesia.send_replace(None);
        Ok(())
    }
}

/// Take a life: `mine` is the epoch the box holds (`unserved`: begun by a
/// promotion no process served), `me` its record, `clients` the clients
/// it serves. Waits while etcd is unreachable, another box's lease
/// holds, or etcd forgot and the other box's history is not in hand,
/// saying why in the log and on `waiting`.
#[allow(clippy::too_many_arguments)]
pub async fn begin(
    arbiter: &Arbiter,
    mine: u64,
    unserved: bool,
    me: &LeaderRecord,
    clients: &[HandedClient],
    knowing: &Knowing,
    waiting: &watch::Sender<Option<String>>,
    mut stop: watch::Receiver<bool>,
) -> Result<Begun, NoLife> {
    let rules = LeaseRules::new(arbiter.options().ttl);
    let mut said = String::new();
    let mut say = |why: String| {
        if why != said {
            tracing::warn!(why = %why, "this primary waits before it serves");
            said = why.clone();
        }
        waiting.send_replace(Some(why));
    };
    loop {
        if *stop.borrow() {
            return Err(NoLife::Stopped);
        }
        match try_begin(arbiter, rules, mine, unserved, me, clients, knowing).await {
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
            Err(Wait::Said(why)) => say(why),
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
    Said(String),
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
    knowing: &Knowing,
) -> Result<Option<Begun>, Wait> {
    let view = arbiter.view().await?;
    let fresh = mint_generation();
    let claim = knowing
        .decide(&view, |known| {
            claim_life(arbiter.keys(), &view, known, mine, unserved, me, &fresh)
        })
        .await
        .map_err(Wait::Said)?;
    let (epoch, mut txn, generation) = match claim.step {
        Step::Take {
            epoch,
            txn,
            generation,
        } => {
            if let Some(amnesia) = &claim.amnesia {
                tracing::warn!(%amnesia, epoch = %EpochName(epoch), "etcd forgot: this box leads above both boxes' histories");
            }
            (epoch, txn, generation)
        }
        Step::Replaced { newer, leader } => return Ok(Some(Begun::Replaced { newer, leader })),
        Step::Led(l) => return Err(Wait::Led(l)),
        Step::NotNow(why) => return Err(Wait::NotNow(why)),
        Step::Wait(why) => return Err(Wait::Said(why)),
        Step::AskPeer => return Err(Wait::Said("the other box's word was not heard".into())),
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
    if let Err(e) = knowing.record_taken(epoch, revision, generation) {
        // Refusing is always safe: give the key back.
        let _ = arbiter.revoke(id).await;
        return Err(Wait::Said(format!(
            "recording the new epoch in ARBITER: {e}"
        )));
    }
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
        lease: id,
    }))
}

/// [`judge`] a read of the arbiter; in a drill's negative control only
/// (feature `drill-sabotage`, `TWINLOG_DRILL_SABOTAGE=trust-etcd`), every
/// read is believed, as a box that takes its epoch from etcd alone would.
pub fn judge_read(view: &crate::repl::arbiter::View, memory: &Memory, newest: u64) -> Judged {
    #[cfg(feature = "drill-sabotage")]
    if trust_etcd() {
        return crate::repl::amnesia::believe(view, memory);
    }
    judge(view, memory, newest)
}

#[cfg(feature = "drill-sabotage")]
fn trust_etcd() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| {
        let on = std::env::var("TWINLOG_DRILL_SABOTAGE").is_ok_and(|v| v == "trust-etcd");
        if on {
            tracing::error!("drill sabotage: this box believes etcd whatever it forgot");
        }
        on
    })
}

/// A new cluster generation: 128 random bits, as hex.
pub fn mint_generation() -> String {
    let mut b = [0u8; 16];
    if ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut b).is_err() {
        // No system randomness: the time and the process, still unique
        // enough to tell one bootstrap from another.
        let t = crate::node::clock::unix_ms() as u128;
        b = (t << 32 | std::process::id() as u128).to_be_bytes();
    }
    b.iter().map(|x| format!("{x:02x}")).collect()
}
