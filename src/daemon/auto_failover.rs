//! Automatic failover as the daemons run it (`[failover]`): a primary
//! takes its life from etcd before it serves and ends it when etcd says
//! its lease is gone; a deposed primary rejoins the new one by itself; a
//! twin takes over once the primary's lease ended, if it is eligible.
//! The I/O with etcd is [`crate::node::arbiter`]'s, the rules
//! [`crate::repl::arbiter`]'s and [`crate::repl::lease`]'s.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use super::config::FailoverSection;
use super::{DaemonError, IoAt, PrimaryConfig, Served, TwinConfig};
use crate::node::arbiter::life::{self, Begun, Knowing, NoLife};
use crate::node::arbiter::memory::MemoryFile;
use crate::node::arbiter::peer::{Asker, Heard};
use crate::node::arbiter::sync::SyncRecorder;
use crate::node::arbiter::take_over::{self, TakeOverShown, TookOver};
use crate::node::arbiter::{self, Arbiter};
use crate::node::epoch::Epochs;
use crate::node::Primary;
use crate::repl::amnesia::{Peer, PeerWord};
use crate::repl::arbiter::LeaderRecord;
use crate::repl::epochs::EpochName;
use crate::repl::HandedClient;

/// How long a deposed primary's rejoin may take before it gives up (and
/// is run again by the next start).
pub const REJOIN_DEADLINE: Duration = Duration::from_secs(120);
/// How long one try of the automatic rejoin waits for the new primary.
pub const REJOIN_TRY: Duration = Duration::from_secs(10);

/// What a primary's start under an arbiter found.
pub(super) enum Start {
    /// Serve this life: `epoch` is recorded in the epochs.
    Life(Box<Life>),
    /// A newer term leads: this box is fenced, and with `auto_rejoin` it
    /// rejoins `leader`.
    Replaced { leader: LeaderRecord },
    /// Stopped while waiting.
    Stopped,
}

/// One life under the arbiter.
pub(super) struct Life {
    pub arbiter: Arbiter,
    pub gate: Arc<arbiter::LeaseGate>,
    pub sync: Arc<SyncRecorder>,
    /// Judges each read while the life is held: why etcd is not believed.
    pub forgot: crate::node::arbiter::gate::Forgetting,
}

/// The clients a primary serves, as a twin taking over admits them.
fn clients_of(cfg: &PrimaryConfig) -> Vec<HandedClient> {
    let mut out = Vec::new();
    for (fps, role) in [
        (&cfg.reader_fingerprints, 0u8),
        (&cfg.writer_fingerprints, 1),
        (&cfg.client_fingerprints, 2),
    ] {
        out.extend(fps.iter().map(|f| HandedClient {
            fingerprint: f.to_string(),
            role,
        }));
    }
    out
}

/// This box's word after an amnesia: its epochs, its durable `head`, the
/// newest epoch it knows taken (its own, and what it read from etcd).
fn own_word(
    epochs: &Arc<Epochs>,
    memory: &Arc<MemoryFile>,
    head: impl Fn() -> u64 + Send + Sync + 'static,
    primary: bool,
) -> Arc<dyn Fn() -> PeerWord + Send + Sync> {
    let (epochs, memory) = (epochs.clone(), memory.clone());
    Arc::new(move || PeerWord {
        epochs: epochs.history(),
        head: head(),
        newest: epochs.newest_taken().max(memory.get().epoch),
        primary,
    })
}

/// What a primary knows beside the arbiter ([`Knowing`]): its memory of
/// etcd, its own word, and how to hear the other box's (its twin's hello
/// on the endpoint, or a question to the address it has for it).
pub(super) fn knowing_as_primary(
    cfg: &PrimaryConfig,
    failover: &FailoverSection,
    identity: &crate::net::Identity,
    log: &Arc<crate::log::Log>,
    epochs: &Arc<Epochs>,
    amnesia: &watch::Sender<Option<String>>,
) -> Result<Knowing, DaemonError> {
    let memory = Arc::new(MemoryFile::load(&cfg.data_dir).at("reading ARBITER in", &cfg.data_dir)?);
    let own = {
        let log = log.clone();
        own_word(epochs, &memory, move || log.head_seq(), true)
    };
    let asker = match cfg.twin_fingerprint {
        Some(fp) => Some(Asker::new(identity, fp)?),
        None => None,
    };
    // The other box as configured, else as this box learned it: the
    // primary it replaced, or the leader etcd named.
    let predecessor = crate::node::predecessor::PredecessorFile::load(&cfg.data_dir)
        .ok()
        .flatten()
        .map(|p| p.addr);
    let peer_addr = failover
        .peer
        .as_ref()
        .map(|a| a.to_string())
        .or(predecessor);
    let dir = cfg.data_dir.clone();
    Ok(Knowing {
        memory,
        own,
        heard: Heard::default(),
        asker,
        peer_addr,
        released_above: Arc::new(move || {
            super::held_start::pending(&dir).and_then(|r| r.arbiter_lost_above)
        }),
        amnesia: amnesia.clone(),
    })
}

/// A primary's start: wait for the arbiter, then take this life's epoch
/// and the leader key (recorded in `epochs` before anything is served),
/// or learn that a newer term leads. A life the box cannot record gives
/// its lease back and is waited for again: the pair is never left
/// headless by a committed take it then refuses.
#[allow(clippy::too_many_arguments)]
pub(super) async fn start_primary(
    cfg: &PrimaryConfig,
    failover: &FailoverSection,
    fingerprint: &str,
    head: u64,
    epochs: &Epochs,
    knowing: &Knowing,
    waiting: &watch::Sender<Option<String>>,
    shutdown: watch::Receiver<bool>,
) -> Result<Start, DaemonError> {
    let options = failover.options(&cfg.listen);
    let arbiter = Arbiter::connect(options.clone()).await?;
    let me = arbiter::me(fingerprint, &options);
    let clients = clients_of(cfg);
    loop {
        let st = epochs.state();
        let begun = life::begin(
            &arbiter,
            st.current(),
            st.unserved,
            &me,
            &clients,
            knowing,
            waiting,
            shutdown.clone(),
        )
        .await;
        match begun {
            Err(NoLife::Stopped) => return Ok(Start::Stopped),
            Err(NoLife::Arbiter(e)) => return Err(e.into()),
            Ok(Begun::Life {
                epoch,
                gate,
                revision,
                lease,
            }) => {
                let recorded = epochs.update(|s| s.restart_at(head, epoch));
                let epoch = match recorded {
                    Ok(e) => e,
                    Err(e) => {
                        // Refusing is always safe; holding a key this box
                        // will not serve under is not.
                        let _ = arbiter.revoke(lease).await;
                        let why = format!(
                            "epoch {} from etcd could not be recorded here ({e}): its lease was given back",
                            EpochName(epoch)
                        );
                        tracing::error!(why = %why, "this primary does not serve this life");
                        waiting.send_replace(Some(why));
                        let mut stop = shutdown.clone();
                        tokio::select! {
                            _ = tokio::time::sleep(Duration::from_millis(500)) => continue,
                            _ = stop.wait_for(|&s| s) => return Ok(Start::Stopped),
                        }
                    }
                };
                if super::held_start::pending(&cfg.data_dir)
                    .is_some_and(|r| r.arbiter_lost_above.is_some())
                {
                    if let Err(e) = super::held_start::taken(&cfg.data_dir) {
                        tracing::warn!(error = %e, "removing RELEASE");
                    }
                }
                tracing::info!(epoch = %EpochName(epoch), from = head + 1, "serving a new life under the arbiter's lease");
                let twin = cfg
                    .twin_fingerprint
                    .map(|f| f.to_string())
                    .unwrap_or_default();
                let sync = Arc::new(SyncRecorder::new(
                    arbiter.clone(),
                    epoch,
                    revision,
                    twin,
                    head,
                ));
                return Ok(Start::Life(Box::new(Life {
                    arbiter,
                    gate,
                    sync,
                    forgot: knowing.forgetting(),
                })));
            }
            Ok(Begun::Replaced { newer, leader }) => {
                let fenced = epochs.hear(newer, "the arbiter (etcd)");
                if let Err(e) = fenced {
                    tracing::error!(error = %e, "the fence is kept in memory only");
                }
                tracing::warn!(newer = %EpochName(newer), "a newer term leads: this primary is fenced");
                match leader.or_else(|| knowing.peer_leading(newer)) {
                    Some(leader) => {
                        let learned = knowing.memory.update(|m| {
                            m.peer = Some(Peer {
                                addr: leader.addr.clone(),
                                fingerprint: leader.fingerprint.clone(),
                            })
                        });
                        if let Err(e) = learned {
                            tracing::warn!(error = %e, "recording where the new primary serves in ARBITER");
                        }
                        return Ok(Start::Replaced { leader });
                    }
                    // The new primary is between lives: wait for it.
                    None => {
                        let mut stop = shutdown.clone();
                        tokio::select! {
                            _ = tokio::time::sleep(Duration::from_millis(200)) => {}
                            _ = stop.wait_for(|&s| s) => return Ok(Start::Stopped),
                        }
                    }
                }
            }
        }
    }
}

/// A life held: its lease kept alive, and handed on at a switchover.
pub(super) struct Held {
    /// Turns true when etcd says the lease is gone: the serve ends.
    pub lost: watch::Receiver<bool>,
    arbiter: Arbiter,
    gate: Arc<arbiter::LeaseGate>,
}

impl Held {
    /// A switchover fenced this box (recorded before the handover left):
    /// its lease ends now, so the leader key is free for the new primary
    /// at once instead of a TTL later.
    pub async fn hand_over(&self) {
        match self.arbiter.revoke(self.gate.id()).await {
            Ok(()) => tracing::info!("the lease is handed over: the leader key is free"),
            Err(e) => {
                tracing::warn!(error = %e, "the lease was not revoked: the new primary waits for it to run out")
            }
        }
    }
}

/// Hold the life: keep its lease alive, and end the serve when etcd says
/// the lease is gone.
pub(super) fn hold_life(
    node: &Arc<Primary>,
    life: Box<Life>,
    epochs: &Arc<Epochs>,
    shutdown: watch::Receiver<bool>,
) -> Held {
    node.hold_lease(life.gate.clone(), life.sync);
    let lost = life.gate.watch_lost();
    life.gate
        .clone()
        .keep(life.arbiter.clone(), life.forgot.clone(), shutdown.clone());
    give_back_when_fenced(
        epochs.clone(),
        life.gate.clone(),
        life.arbiter.clone(),
        shutdown,
    );
    Held {
        lost,
        arbiter: life.arbiter,
        gate: life.gate,
    }
}

/// A life fenced by a newer epoch while its lease holds (etcd was rolled
/// back past that epoch's take, so it let this box lead below it) gives
/// its lease back: the newer box can then lead, and this one follows it.
fn give_back_when_fenced(
    epochs: Arc<Epochs>,
    gate: Arc<arbiter::LeaseGate>,
    arbiter: Arbiter,
    mut stop: watch::Receiver<bool>,
) {
    let mut fenced = epochs.watch_fenced();
    tokio::spawn(async move {
        let newer = async {
            loop {
                let st = epochs.state();
                if st.seen > st.current() {
                    return st.seen;
                }
                if fenced.changed().await.is_err() {
                    return std::future::pending().await;
                }
            }
        };
        let newer = tokio::select! {
            n = newer => n,
            _ = stop.wait_for(|&s| s) => return,
        };
        // The fence already stops every acknowledgement; the revoke frees
        // the leader key, and the next renewal, refused, ends the serve
        // (a switchover's hand-over does the same, and ends it sooner).
        tracing::warn!(newer = %EpochName(newer), "fenced by a newer epoch while holding the lease: the lease is given back");
        if let Err(e) = arbiter.revoke(gate.id()).await {
            tracing::warn!(error = %e, "the lease was not revoked: the newer box waits for it to run out");
        }
    });
}

/// After a serve: a primary a newer term replaced rejoins it as its twin
/// (`auto_rejoin`), and one whose lease ended starts again as a new life.
pub async fn after_primary_serve(
    served: Served,
    primary_config: &std::path::Path,
    shutdown: watch::Receiver<bool>,
) -> Result<Served, DaemonError> {
    let served = stop_wins(served, &shutdown);
    match served {
        Served::Replaced { leader } => {
            let addr: super::Address = leader.addr.parse().map_err(|_| DaemonError::BadLeader {
                what: "address",
                value: leader.addr.clone(),
            })?;
            let fp: crate::net::Fingerprint =
                leader
                    .fingerprint
                    .parse()
                    .map_err(|_| DaemonError::BadLeader {
                        what: "fingerprint",
                        value: leader.fingerprint.clone(),
                    })?;
            tracing::warn!(primary = %leader.addr, epoch = %EpochName(leader.epoch), "rejoining the new primary as its twin (auto_rejoin)");
            let Some(report) = rejoin_while_it_waits(primary_config, addr, fp, shutdown).await?
            else {
                return Ok(Served::Stopped);
            };
            Ok(Served::Deposed {
                twin_config: report.twin_config,
            })
        }
        other => Ok(other),
    }
}

/// A stop asked while the serve was ending (its lease lost, a newer term
/// found) wins over what that end would start next (a new life, a
/// rejoin): the SIGTERM that came meanwhile ends the daemon, and the next
/// start finds the same state. A switchover's end (`Deposed`,
/// `Promoted`) already rewrote the configuration, and is carried on.
pub fn stop_wins(served: Served, shutdown: &watch::Receiver<bool>) -> Served {
    match served {
        Served::LeaseLost | Served::Replaced { .. } if *shutdown.borrow() => {
            tracing::info!("stopping as asked, before what the serve's end would start");
            Served::Stopped
        }
        other => other,
    }
}

/// Rejoin the new primary, asking again while it cannot be reached: one
/// that took the term a moment ago answers "waiting for its life" (its
/// endpoint is up, its life not yet begun) until etcd grants its lease.
/// Nothing here changes before an answer, so asking again is safe. Each
/// try waits at most [`REJOIN_TRY`], the whole at most
/// [`REJOIN_DEADLINE`]; None when `shutdown` came first (checked between
/// tries, so a stop waits for one try at most).
async fn rejoin_while_it_waits(
    primary_config: &std::path::Path,
    addr: super::Address,
    fp: crate::net::Fingerprint,
    mut shutdown: watch::Receiver<bool>,
) -> Result<Option<super::failover::RejoinReport>, DaemonError> {
    let deadline = crate::node::clock::instant() + REJOIN_DEADLINE;
    let mut pause = Duration::from_millis(50);
    loop {
        let left = deadline.saturating_duration_since(crate::node::clock::instant());
        let tried =
            super::failover::rejoin(primary_config, addr.clone(), fp, None, left.min(REJOIN_TRY))
                .await;
        match tried {
            Err(DaemonError::Rejoin(e))
                if matches!(*e, crate::node::rejoin::RejoinError::Connect { .. })
                    && crate::node::clock::instant() + pause < deadline =>
            {
                tracing::info!(error = %e, retry_in_ms = pause.as_millis() as u64, "the new primary is not answering yet");
                tokio::select! {
                    _ = tokio::time::sleep(pause) => {}
                    _ = shutdown.wait_for(|&s| s) => return Ok(None),
                }
                pause = (pause * 2).min(Duration::from_secs(1));
            }
            other => return other.map(Some),
        }
        if *shutdown.borrow() {
            return Ok(None);
        }
    }
}

/// A twin under an arbiter: watch for the primary's lease to end and take
/// over when eligible. Answers what the watch sees (for `status`) and a
/// receiver of the term taken.
pub(super) async fn watch_as_twin(
    cfg: &TwinConfig,
    failover: &FailoverSection,
    identity: &crate::net::Identity,
    epochs: &Arc<Epochs>,
    durable: watch::Receiver<u64>,
    shutdown: watch::Receiver<bool>,
) -> Result<
    (
        watch::Receiver<TakeOverShown>,
        watch::Receiver<Option<Arc<TookOver>>>,
    ),
    DaemonError,
> {
    let options = failover.options(&cfg.listen_as_primary);
    let arbiter = Arbiter::connect(options.clone()).await?;
    let me = arbiter::me(&identity.fingerprint().to_string(), &options);
    let memory = Arc::new(MemoryFile::load(&cfg.data_dir).at("reading ARBITER in", &cfg.data_dir)?);
    let own = {
        let durable = durable.clone();
        own_word(epochs, &memory, move || *durable.borrow(), false)
    };
    let asker = match cfg.primary_fingerprint {
        Some(fp) => Some(Asker::new(identity, fp)?),
        None => None,
    };
    // The primary this twin follows is the other box.
    let peer_addr = Some(failover.peer.as_ref().unwrap_or(&cfg.primary).to_string());
    let knowing = Knowing {
        memory,
        own,
        heard: Heard::default(),
        asker,
        peer_addr,
        released_above: Arc::new(|| None),
        amnesia: watch::channel(None).0,
    };
    let (shown_tx, shown) = watch::channel(TakeOverShown::default());
    let (took_tx, took) = watch::channel(None);
    tokio::spawn(async move {
        let head = move || *durable.borrow();
        if let Some(t) = take_over::watch(arbiter, me, head, knowing, shown_tx, shutdown).await {
            took_tx.send_replace(Some(Arc::new(t)));
        }
    });
    Ok((shown, took))
}

/// A take-over the twin could not record: the lease is given back, so
/// the leader key is free again at once, and the twin serves on.
pub(super) async fn give_back(cfg: &TwinConfig, failover: &FailoverSection, lease: i64) {
    let options = failover.options(&cfg.listen_as_primary);
    match Arbiter::connect(options).await {
        Ok(a) => match a.revoke(lease).await {
            Ok(()) => tracing::warn!("the take-over's lease was given back"),
            Err(e) => {
                tracing::warn!(error = %e, "the take-over's lease was not given back: it runs out")
            }
        },
        Err(e) => {
            tracing::warn!(error = %e, "the take-over's lease was not given back: it runs out")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stop_asked_as_the_serve_ended_wins_over_a_new_life_or_a_rejoin() {
        let (tx, rx) = watch::channel(false);
        let ended = |s: &Served| std::mem::discriminant(s);
        assert_eq!(
            ended(&stop_wins(Served::LeaseLost, &rx)),
            ended(&Served::LeaseLost)
        );
        tx.send_replace(true);
        assert_eq!(
            ended(&stop_wins(Served::LeaseLost, &rx)),
            ended(&Served::Stopped)
        );
        let twin_config = std::path::PathBuf::from("twin.toml");
        assert_eq!(
            ended(&stop_wins(Served::Deposed { twin_config }, &rx)),
            ended(&Served::Deposed {
                twin_config: "x".into()
            }),
            "a switchover's end is carried on: its configuration is written"
        );
    }
}
