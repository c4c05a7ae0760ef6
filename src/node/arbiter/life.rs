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
use super::peer::{word_of, Asker, Heard};
use super::{Arbiter, ArbiterError, LeaseGate};
use crate::repl::amnesia::{after_amnesia, judge, life_above, Amnesia, Judged, Memory, PeerWord};
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

    /// After etcd forgot: the floor this box's epoch must go above, from an
    /// operator's release or the other box's word, or why it may not lead
    /// (`hint` says what an operator may do about it).
    pub(super) async fn floor_after(
        &self,
        amnesia: &Amnesia,
        own: &PeerWord,
        arbiter_epoch: u64,
        hint: &str,
    ) -> Result<u64, String> {
        if let Some(n) = (self.released_above)() {
            return Ok(n.max(own.newest).max(arbiter_epoch));
        }
        let addr = self.peer_addr();
        let peer = word_of(
            &self.heard,
            self.asker.as_ref(),
            addr.as_deref(),
            own.clone(),
        )
        .await
        .map_err(|e| {
            format!("{amnesia}; this box leads only with the other box's history, and {e}{hint}")
        })?;
        after_amnesia(own, &peer, arbiter_epoch).map_err(|d| format!("{amnesia}; {d}"))
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
        self.memory.update(|m| {
            if let Some(g) = generation {
                // Revisions are counted anew within a generation.
                m.generation = Some(g);
                m.revision = revision;
            }
            m.epoch = m.epoch.max(epoch);
            m.revision = m.revision.max(revision);
        })?;
        self.amnesia.send_replace(None);
        Ok(())
    }

    /// Record `memory`; a failure is said and the arbiter not acted on.
    fn keep(&self, memory: Memory) -> Result<(), Wait> {
        self.memory
            .observe(memory)
            .map_err(|e| Wait::Said(format!("recording what etcd holds in ARBITER: {e}")))
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
    let own = (knowing.own)();
    let (epoch, mut txn, generation) = match judge_read(&view, &knowing.memory.get(), own.newest) {
        Judged::Trusted { memory, bootstrap } => {
            knowing.amnesia.send_replace(None);
            knowing.keep(memory)?;
            let (epoch, txn) = match arbiter::begin_life(arbiter.keys(), &view, mine, unserved, me)
            {
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
            if bootstrap {
                let g = mint_generation();
                let txn = arbiter::with_generation(txn, arbiter.keys(), &view, &g);
                (epoch, txn, Some(g))
            } else {
                (epoch, txn, None)
            }
        }
        Judged::Forgot(amnesia) => {
            knowing.amnesia.send_replace(Some(amnesia.to_string()));
            let arbiter_epoch = view.epoch.as_ref().map_or(0, |v| v.value);
            let floor = knowing
                .floor_after(
                    &amnesia,
                    &own,
                    arbiter_epoch,
                    ": `primary release --arbiter-lost --epoch-above N` if it is gone for good",
                )
                .await
                .map_err(Wait::Said)?;
            let epoch = life_above(mine, floor);
            let g = mint_generation();
            let txn =
                arbiter::take_after_amnesia(arbiter.keys(), &view, epoch, me, &g).map_err(|e| {
                    match e {
                        NotNow::Led(l) => Wait::Led(l),
                        other => Wait::NotNow(other),
                    }
                })?;
            tracing::warn!(%amnesia, epoch = %EpochName(epoch), "etcd forgot: this box leads above both boxes' histories");
            (epoch, txn, Some(g))
        }
    };
    // Never an epoch this box would refuse to record.
    if epoch <= own.newest && !(unserved && epoch == mine) {
        return Err(Wait::Said(format!(
            "the arbiter would give epoch {}, not above this box's {}",
            EpochName(epoch),
            EpochName(own.newest)
        )));
    }
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
        return Judged::Trusted {
            memory: Memory {
                generation: view.generation.as_ref().map(|g| g.value.clone()),
                epoch: view.epoch.as_ref().map_or(0, |e| e.value),
                revision: view.revision,
                peer: memory.peer.clone(),
            },
            bootstrap: view.generation.is_none(),
        };
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
