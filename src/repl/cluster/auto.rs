//! Automatic failover in the cluster: each box reads a simulated etcd
//! ([`super::etcd`]) and decides as the daemons do, through
//! [`crate::repl::claim`] on reads judged by [`crate::repl::amnesia`]. A
//! primary takes its life there and serves only while its lease holds
//! ([`crate::repl::lease`]); it records its twin in sync
//! ([`crate::repl::arbiter::SyncState`]); a twin takes the next term once
//! the lease ended; a box the arbiter replaced rejoins the new primary.
//! And etcd forgets: it loses its data, is restored from a snapshot taken
//! earlier in the run, or answers a box late.

use super::etcd::SimEtcd;
use super::*;
use crate::repl::amnesia::{self, Memory, PeerWord};
use crate::repl::arbiter::{self, Keys, LeaderRecord, SyncRecord, SyncState, SyncStep};
use crate::repl::claim::{claim_life, claim_take_over, Known, Step};
use crate::repl::epochs::EpochName;
use crate::repl::lease::{Ask, Lease, LeaseRules};

/// The TTL of the simulated leases.
pub const LEASE_TTL: Duration = Duration::from_millis(1000);

/// How often a box reads the arbiter, as the daemons do: a tenth of the
/// TTL.
const READ_EVERY: Duration = Duration::from_millis(100);

/// Ways to break the arbiter's rules on purpose, for the negative
/// controls of the checker.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ArbiterSabotage {
    /// Every read of etcd is believed, whatever it forgot.
    pub trust_etcd: bool,
    /// After etcd forgot, a box leads on its own history alone, as if
    /// the other box had said the same.
    pub lead_alone: bool,
}

/// The arbiter and each box's side of it.
pub(super) struct Auto {
    etcd: SimEtcd,
    keys: Keys,
    seats: [Seat; 2],
    generations: u64,
    rules: LeaseRules,
    pub(super) sabotage: ArbiterSabotage,
}

impl Auto {
    pub(super) fn new() -> Auto {
        Auto {
            etcd: SimEtcd::new(LEASE_TTL),
            keys: Keys::of("sim").unwrap_or_else(|e| panic!("{e}")),
            seats: [Seat::default(), Seat::default()],
            generations: 0,
            rules: LeaseRules::new(LEASE_TTL),
            sabotage: ArbiterSabotage::default(),
        }
    }
}

/// One box's side of the arbiter.
#[derive(Default)]
struct Seat {
    /// What it remembers of etcd: on its disk, so a power cut keeps it.
    memory: Memory,
    /// An operator's floor after etcd forgot, until a life took it.
    released_above: Option<u64>,
    /// The life it serves and its lease: gone with the process.
    life: Option<Life>,
    next_read: Option<Instant>,
    /// etcd answers this box so late.
    late: Duration,
    /// When etcd handled the last read answered: a later answer is never
    /// of an earlier state, as etcd handles one client's reads in order.
    handled: Option<Instant>,
    /// This box cannot reach etcd.
    cut: bool,
    /// Why it waits, as it last said.
    said: Option<String>,
    /// Why it does not believe etcd now.
    amnesia: Option<String>,
}

/// A life held under a lease.
struct Life {
    epoch: u64,
    id: i64,
    lease: Lease,
    leader_revision: i64,
    sync: SyncState,
    /// What the twin must have acknowledged to be recorded in sync.
    floor: u64,
    /// Keep-alive answers on their way back.
    answers: Vec<(Instant, Ask, Duration)>,
}

fn me(side: Side) -> LeaderRecord {
    LeaderRecord {
        epoch: 0,
        fingerprint: format!("{side:?}"),
        addr: format!("{side:?}:7400"),
    }
}

impl Cluster {
    /// A and B under an arbiter, both at epoch 0: A, the primary, takes
    /// its first life from etcd and B follows it.
    pub fn with_arbiter(cfg: PairConfig) -> Cluster {
        let mut c = Cluster::new(cfg);
        c.auto = Some(Auto::new());
        c
    }

    /// Break the arbiter's rules from now on.
    pub fn sabotage_arbiter(&mut self, sabotage: ArbiterSabotage) {
        self.auto_mut().sabotage = sabotage;
    }

    fn auto(&self) -> &Auto {
        self.auto
            .as_ref()
            .unwrap_or_else(|| panic!("a cluster made with_arbiter"))
    }

    fn auto_mut(&mut self) -> &mut Auto {
        self.auto
            .as_mut()
            .unwrap_or_else(|| panic!("a cluster made with_arbiter"))
    }

    fn seat(&self, side: Side) -> &Seat {
        &self.auto().seats[side.at()]
    }

    fn seat_mut(&mut self, side: Side) -> &mut Seat {
        &mut self.auto_mut().seats[side.at()]
    }

    /// The box that holds a life and may acknowledge under its lease now.
    pub fn leader(&self) -> Option<Side> {
        Side::BOTH
            .into_iter()
            .find(|&s| self.is_up(s) && self.role(s) == Role::Primary && self.lease_allows(s))
    }

    /// Why `side` waits, as it last said.
    pub fn waits(&self, side: Side) -> Option<&str> {
        self.seat(side).said.as_deref()
    }

    /// Why `side` does not believe etcd now.
    pub fn amnesia(&self, side: Side) -> Option<&str> {
        self.seat(side).amnesia.as_deref()
    }

    /// What `side` remembers of etcd.
    pub fn arbiter_memory(&self, side: Side) -> &Memory {
        &self.seat(side).memory
    }

    /// etcd loses its data.
    pub fn wipe_etcd(&mut self) {
        let now = self.now.at;
        self.auto_mut().etcd.wipe(now);
        self.note("etcd lost its data".into());
        self.pump();
    }

    /// etcd is restored from the snapshot `back` changes ago.
    pub fn restore_etcd(&mut self, back: usize) {
        let now = self.now.at;
        self.auto_mut().etcd.restore(back, now);
        self.note(format!("etcd restored from {back} changes ago"));
        self.pump();
    }

    /// etcd answers `side` `ms` late from now on.
    pub fn etcd_late(&mut self, side: Side, ms: u64) {
        self.seat_mut(side).late = Duration::from_millis(ms);
    }

    /// `side` cannot reach etcd (or can again).
    pub fn etcd_cut(&mut self, side: Side, cut: bool) {
        self.seat_mut(side).cut = cut;
    }

    /// `primary release --arbiter-lost --epoch-above N` on `side`.
    pub fn release_arbiter_lost(&mut self, side: Side, above: u64) -> Result<(), String> {
        let own = self.word(side).newest;
        if above < own {
            return Err(format!(
                "epoch {} is below this box's own {}",
                EpochName(above),
                EpochName(own)
            ));
        }
        self.seat_mut(side).released_above = Some(above);
        Ok(())
    }

    /// Under an arbiter, whether `side` may acknowledge: a primary only
    /// while it holds a life whose lease holds.
    pub(super) fn lease_allows(&self, side: Side) -> bool {
        let Some(auto) = &self.auto else {
            return true;
        };
        if self.role(side) != Role::Primary {
            return true;
        }
        auto.seats[side.at()]
            .life
            .as_ref()
            .is_some_and(|l| l.lease.may_acknowledge(self.now.at).is_ok())
    }

    /// Under an arbiter, whether `side` serves its twin: a primary with a
    /// life.
    pub(super) fn serves(&self, side: Side) -> bool {
        self.auto
            .as_ref()
            .is_none_or(|a| a.seats[side.at()].life.is_some())
    }

    /// A box lost power: its process, and so its life, is gone.
    pub(super) fn arbiter_crash(&mut self, side: Side) {
        if let Some(auto) = self.auto.as_mut() {
            let seat = &mut auto.seats[side.at()];
            seat.life = None;
            seat.next_read = None;
            seat.said = None;
        }
    }

    /// The newest epoch any box began, for the checker.
    fn newest_begun(&self) -> u64 {
        self.begun.iter().next_back().copied().unwrap_or(0)
    }

    /// Under an arbiter: no acknowledgement under an epoch below one
    /// another box began.
    pub(super) fn check_leader(&mut self, side: Side, frame: FrameId) {
        if self.auto.is_none() {
            return;
        }
        let (epoch, newer) = (self.epochs(side).current(), self.newest_begun());
        if newer > epoch {
            self.seen.push(Violation::AckUnderOlderEpoch {
                frame,
                by: side,
                epoch,
                newer,
            });
        }
    }

    /// Each running box keeps its lease and reads the arbiter, as its
    /// daemon does.
    pub(super) fn drive_arbiter(&mut self) {
        if self.auto.is_none() {
            return;
        }
        for side in Side::BOTH {
            if !self.is_up(side) {
                continue;
            }
            self.keep_lease(side);
            // As the daemon's recorder, at each acknowledgement.
            self.record_sync(side);
            let now = self.now.at;
            let seat = self.seat_mut(side);
            if seat.next_read.is_some_and(|at| at > now) {
                continue;
            }
            seat.next_read = Some(now + READ_EVERY);
            if !seat.cut {
                self.read_arbiter(side);
            }
        }
    }

    /// A life's keep-alives: sent a third of the TTL after the one the
    /// lease stands on, their answers taken as they arrive. A lease etcd
    /// says is gone ends the life: the serve ends and a new life is
    /// sought.
    fn keep_lease(&mut self, side: Side) {
        let now = self.now.at;
        let seen = self.epochs(side).seen;
        let auto = self.auto_mut();
        let seat = &mut auto.seats[side.at()];
        let Some(life) = seat.life.as_mut() else {
            return;
        };
        if seen > life.epoch {
            // Fenced by a newer epoch while its lease holds (etcd was
            // rolled back past that epoch's take): the life ends and the
            // key is given back, so the newer one can lead.
            let (id, epoch) = (life.id, life.epoch);
            auto.etcd.revoke(id, now);
            seat.life = None;
            seat.next_read = None;
            self.note(format!(
                "{side:?} is fenced by a newer epoch: its life at {} ends and its lease is given back",
                EpochName(epoch)
            ));
            if self.link.as_ref().is_some_and(|(p, _)| *p == side) {
                self.drop_link(&format!("{side:?} was fenced"), None);
            }
            return;
        }
        let (due, later): (Vec<_>, Vec<_>) = life.answers.drain(..).partition(|a| a.0 <= now);
        life.answers = later;
        for (_, ask, granted) in due {
            life.lease.answered(ask, granted);
        }
        if life.lease.is_lost() {
            let epoch = life.epoch;
            seat.life = None;
            seat.next_read = None;
            self.note(format!(
                "{side:?}'s lease of epoch {} is gone: its serve ends",
                EpochName(epoch)
            ));
            if self.link.as_ref().is_some_and(|(p, _)| *p == side) {
                self.drop_link(&format!("{side:?}'s lease is gone"), None);
            }
            return;
        }
        if life.answers.is_empty() && !seat.cut && now >= life.lease.renew_at(now) {
            let ask = life.lease.ask(now);
            let granted = auto.etcd.keep_alive(life.id, now);
            life.answers.push((now + seat.late, ask, granted));
            self.judge_while_serving(side);
        }
    }

    /// With each renewal a serving primary reads the arbiter too: one
    /// that forgot what this box knows (restored under its lease) ends
    /// the life, so the lease it restored does not outlive the amnesia.
    fn judge_while_serving(&mut self, side: Side) {
        let own = self.word(side);
        let now = self.now.at;
        let auto = self.auto_mut();
        let trust = auto.sabotage.trust_etcd;
        let seat = &mut auto.seats[side.at()];
        let then = now.checked_sub(seat.late).unwrap_or(now);
        let then = seat.handled.map_or(then, |h| h.max(then));
        seat.handled = Some(then);
        let view = auto.etcd.view(&auto.keys, now, then);
        if trust {
            return;
        }
        if let amnesia::Judged::Forgot(why) = amnesia::judge(&view, &seat.memory, own.newest) {
            if let Some(life) = seat.life.as_mut() {
                life.lease.lose();
            }
            seat.amnesia = Some(why.to_string());
            self.note(format!("{side:?} serving: {why}: its life ends"));
        }
    }

    /// This box's word after an amnesia, as its daemon answers it.
    fn word(&self, side: Side) -> PeerWord {
        let st = self.epochs(side);
        PeerWord {
            epochs: st.history.clone(),
            head: self.log(side).head_seq(),
            newest: st.newest_taken().max(self.seat(side).memory.epoch),
            primary: self.role(side) == Role::Primary,
        }
    }

    /// Ask the other box for its word, over the link between them. A
    /// primary asked by a box of a newer epoch hears of it, as it would
    /// from that box's hello.
    fn ask_peer(&mut self, side: Side) -> Result<PeerWord, String> {
        let other = side.other();
        if self.partitioned || !self.is_up(other) {
            return Err(format!("{other:?} does not answer"));
        }
        let asking = self.epochs(side).current();
        if self.role(other) == Role::Primary && asking > self.epochs(other).current() {
            self.fence(other, asking, "the other box, asking for this log's epochs");
        }
        Ok(self.word(other))
    }

    fn say(&mut self, side: Side, why: String) {
        if self.seat(side).said.as_deref() != Some(&why) {
            self.note(format!("{side:?} waits: {why}"));
            self.seat_mut(side).said = Some(why);
        }
    }

    /// One read of the arbiter and what `side` does on it.
    fn read_arbiter(&mut self, side: Side) {
        let now = self.now.at;
        let role = self.role(side);
        if role == Role::Primary && self.seat(side).life.is_some() {
            return;
        }
        let own = self.word(side);
        let (mine, unserved) = (self.epochs(side).current(), self.epochs(side).unserved);
        let head = self.log(side).head_seq();
        let auto = self.auto_mut();
        auto.generations += 1;
        let fresh = format!("generation-{}", auto.generations);
        let (late, sabotage) = (auto.seats[side.at()].late, auto.sabotage);
        let seat = &mut auto.seats[side.at()];
        let then = now.checked_sub(late).unwrap_or(now);
        let then = seat.handled.map_or(then, |h| h.max(then));
        seat.handled = Some(then);
        let view = auto.etcd.view(&auto.keys, now, then);
        let seat = &auto.seats[side.at()];
        let judged = if sabotage.trust_etcd {
            amnesia::believe(&view, &seat.memory)
        } else {
            amnesia::judge(&view, &seat.memory, own.newest)
        };
        let mut known = Known {
            judged,
            own,
            peer: None,
            released_above: seat.released_above,
        };
        let keys = auto.keys.clone();
        let claim = |known: &Known| match role {
            Role::Primary => claim_life(&keys, &view, known, mine, unserved, &me(side), &fresh),
            Role::Twin => claim_take_over(&keys, &view, known, head, &me(side), &fresh),
        };
        let mut decided = claim(&known);
        if let Step::AskPeer = decided.step {
            known.peer = Some(if sabotage.lead_alone {
                Ok(known.own.clone())
            } else {
                self.ask_peer(side)
            });
            decided = claim(&known);
        }
        let seat = self.seat_mut(side);
        seat.amnesia = decided.amnesia.as_ref().map(|a| a.to_string());
        if let Some(memory) = decided.keep {
            seat.memory = memory;
        }
        match decided.step {
            Step::Take {
                epoch,
                txn,
                generation,
            } => self.take(side, epoch, &txn, generation),
            Step::Replaced { newer, .. } => self.replaced(side, newer),
            Step::Led(l) => {
                let why = format!("{} leads, epoch {}", l.fingerprint, EpochName(l.epoch));
                self.say(side, why)
            }
            Step::NotNow(why) => self.say(side, why.to_string()),
            Step::Wait(why) => self.say(side, why),
            Step::AskPeer => self.say(side, "the other box's word was not heard".into()),
        }
    }

    /// `side` runs `txn`, which takes `epoch`, under a new lease; once it
    /// committed, the box records the epoch and serves it.
    fn take(&mut self, side: Side, epoch: u64, txn: &arbiter::Txn, generation: Option<String>) {
        let now = self.now.at;
        let role = self.role(side);
        let (mine, unserved) = (self.epochs(side).current(), self.epochs(side).unserved);
        let auto = self.auto_mut();
        let id = auto.etcd.grant(now);
        let mut lease = Lease::new(auto.rules);
        let ask = lease.ask(now);
        lease.answered(ask, LEASE_TTL);
        let Some(revision) = auto.etcd.run(txn, id, now) else {
            auto.etcd.revoke(id, now);
            return self.say(
                side,
                "the arbiter's keys changed under the transaction".into(),
            );
        };
        auto.seats[side.at()]
            .memory
            .took(epoch, revision, generation);
        let newest = self.newest_begun();
        if epoch <= newest && !(role == Role::Primary && unserved && epoch == mine) {
            self.seen.push(Violation::EpochNotAbove {
                side,
                epoch,
                newest,
            });
        }
        let head = self.log(side).head_seq();
        let recorded = match role {
            Role::Primary => self.machine_mut(side).epochs.restart_at(head, epoch),
            Role::Twin => self.machine_mut(side).epochs.promote_to(head, epoch),
        };
        if let Err(e) = recorded {
            self.auto_mut().etcd.revoke(id, now);
            self.seen.push(Violation::RefusedWhatItTook {
                side,
                epoch,
                why: e.to_string(),
            });
            return;
        }
        self.began(side, Some(epoch));
        if role == Role::Twin {
            self.drop_link(&format!("{side:?} took over"), None);
            self.become_primary(side);
        }
        let seat = self.seat_mut(side);
        seat.life = Some(Life {
            epoch,
            id,
            lease,
            leader_revision: revision,
            sync: SyncState::default(),
            floor: head,
            answers: Vec::new(),
        });
        seat.released_above = None;
        seat.said = None;
        seat.amnesia = None;
        self.reconnect_at = now;
        let how = match role {
            Role::Primary => "began a life",
            Role::Twin => "took over",
        };
        self.note(format!("{side:?} {how} at epoch {}", EpochName(epoch)));
    }

    /// etcd says a newer term leads: `side` is fenced by it and rejoins
    /// the new primary once it serves (`auto_rejoin`).
    fn replaced(&mut self, side: Side, newer: u64) {
        self.fence(side, newer, "the arbiter (etcd)");
        let other = side.other();
        if !(self.reachable(other, Role::Primary) && self.serves(other)) {
            return self.say(side, "a newer term leads: waiting for it to serve".into());
        }
        if let Err(e) = self.rejoin(side, None) {
            self.say(side, format!("rejoining {other:?}: {e:?}"));
        }
    }

    /// A serving primary records its twin in sync once the twin
    /// acknowledged the head its life began at.
    fn record_sync(&mut self, side: Side) {
        let now = self.now.at;
        let acked = match &self.link {
            Some((p, l)) if *p == side && l.streaming() => l.primary.acked(),
            _ => return,
        };
        let auto = self.auto_mut();
        let Some(life) = auto.seats[side.at()].life.as_mut() else {
            return;
        };
        if acked < life.floor {
            return;
        }
        let SyncStep::Record { in_sync } = life.sync.twin_caught_up() else {
            return;
        };
        let record = SyncRecord {
            epoch: life.epoch,
            twin: format!("{:?}", side.other()),
            in_sync,
            acked,
        };
        let txn = arbiter::record_sync(&auto.keys, life.leader_revision, &record);
        if auto.etcd.run(&txn, 0, now).is_some() {
            life.sync.recorded(in_sync);
        }
    }

    /// Under an arbiter, bring the pair back as an operator would: heal
    /// the network and etcd's reach, start every box, and wait for one
    /// primary streaming to its twin; a box whose rejoin is refused for
    /// its history is started afresh. Answers the primary.
    pub fn settle_auto(&mut self, max_ms: u64) -> Result<Side, String> {
        self.heal();
        for side in Side::BOTH {
            self.etcd_cut(side, false);
            self.etcd_late(side, 0);
            self.restart(side);
        }
        for _ in 0..max_ms / 10 {
            self.advance(10);
            if let Some(p) = self.leader().filter(|&p| self.settled_on(p)) {
                return Ok(p);
            }
            for side in Side::BOTH {
                let refused = self
                    .seat(side)
                    .said
                    .as_deref()
                    .is_some_and(|s| s.contains("History"));
                if refused && self.role(side) == Role::Primary {
                    self.start_afresh(side)?;
                    self.seat_mut(side).said = None;
                }
            }
        }
        Err(format!(
            "no settled pair within {max_ms} ms: A waits ({:?}), B waits ({:?})",
            self.waits(Side::A),
            self.waits(Side::B)
        ))
    }
}
