//! `Cluster`: two boxes, A and B, taking turns as primary and twin through
//! failovers, fences, rejoins and switchovers, with simulated time. Each
//! box is a real [`Log`] on its own simulated disk, its [`EpochState`]
//! (which a box keeps durably, so it survives a power cut here) and a
//! role. A primary ships each group of writes before its own sync, as the
//! daemon does, so a power cut can take from it frames its twin holds.
//! Whenever a running twin reaches a running primary they connect: a
//! [`Link`] running the production cores.
//!
//! The operator's parts and the drivers' run the production machines, not
//! copies of them: [`super::promote`] (when a twin may be promoted, and
//! how it tells its predecessor), [`super::rejoin`] (the plan of a
//! rejoin, step by step), [`super::switchover`] (the pause, the hold and
//! the handover, and the write admission they share), [`super::ack`]
//! (who may acknowledge what) and [`super::epochs`] (a life per restart).
//! A test writes as clients do, with payloads from a small alphabet so
//! that crcs collide; acts as the operator does; and breaks things:
//! messages dropped, delayed, duplicated or damaged, the link cut or
//! partitioned, power cuts (each box's unsynced suffix lost, shipped or
//! not), a crash at any step of a promotion, a rejoin or a switchover.
//!
//! Frames are told apart by which write made them, never by their bytes:
//! each box keeps, beside its log, the write behind each sequence (a
//! shipped frame carries its write to the twin). [`Cluster::check`]
//! reviews the run so far and names every promise broken
//! ([`check::Violation`]). [`Sabotage`] breaks the rules on purpose, for
//! tests that show the checker catches each broken promise.
//!
//! This file is longer than the others: it is the simulation's one
//! world (the boxes, their disks, the link and the clock, and each step
//! that moves them), read in one pass as the model the checker judges;
//! the operator's steps (`operator.rs`) and the checker (`check.rs`) are
//! apart.

mod auto;
mod check;
mod etcd;
mod operator;

use std::time::{Duration, Instant};

pub use auto::{ArbiterSabotage, LEASE_TTL};
pub use check::Violation;
pub use operator::{PromoteError, RejoinError};

use super::ack::{self, AckState, NotAdmitted};
use super::epochs::{EpochHistory, EpochState};
use super::in_hand::InHand;
use super::link::{self, Link, LinkEvent};
use super::pair::{open, Fault, PairConfig};
use super::primary::PrimaryAction;
use super::promote::Predecessor;
use super::switchover::{Gate, Switchover};
use super::twin::TwinAction;
use super::wire::frame_prefix;
use super::{Backoff, Now};
use crate::log::{CrashMode, Kind, Log, Meta, SimStorage};

/// One of the two boxes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Side {
    A,
    B,
}

impl Side {
    pub const BOTH: [Side; 2] = [Side::A, Side::B];

    pub fn other(self) -> Side {
        match self {
            Side::A => Side::B,
            Side::B => Side::A,
        }
    }

    fn at(self) -> usize {
        match self {
            Side::A => 0,
            Side::B => 1,
        }
    }
}

/// What a box runs as: kept across power cuts, as its configuration is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Primary,
    Twin,
}

/// A frame as the checker knows it: its sequence and the client write
/// that made it. Two writes may carry the same bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FrameId {
    pub seq: u64,
    pub write: u64,
}

/// Why a client write was refused, with nothing appended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refused {
    /// The box is down.
    Down,
    /// The box is a twin.
    NotPrimary,
    /// A switchover pauses writes.
    Paused,
    /// [`ack::admit`] refused it.
    NotAdmitted(NotAdmitted),
}

/// What a client write came to at once: appended (answered once durable
/// as it asked, if ever), or refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Written {
    Appended(u64),
    Refused(Refused),
}

/// A write a client was told is durable.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Acknowledgement {
    pub frame: FrameId,
    pub by: Side,
    /// Acknowledged `twin` (else `local`).
    pub twin: bool,
    /// The box's epochs when it answered.
    pub epochs: EpochState,
}

/// A rejoin as it went, for the checker.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RejoinRecord {
    pub side: Side,
    /// The rejoining box's log before the rejoin, and the new primary's,
    /// frame by frame from sequence 1.
    pub before: Vec<FrameId>,
    pub new_primary: Vec<FrameId>,
    /// The fork the new primary named.
    pub fork: u64,
    /// The frames saved before the cut; `None` when nothing was saved.
    pub saved: Option<Vec<FrameId>>,
    /// The log after the cut; `None` when nothing was cut (nothing past
    /// the fork, or a power cut before the cut).
    pub after: Option<Vec<FrameId>>,
}

/// Ways to break the rules on purpose: each undoes one rule, and a test
/// shows the checker then finds the loss it leads to.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Sabotage {
    /// A rejoin cuts without saving the frames past the fork.
    pub skip_save: bool,
    /// A primary admits and acknowledges writes though fenced.
    pub ignore_fence: bool,
    /// A rejoin takes the new primary's epochs but keeps the frames past
    /// the fork instead of cutting them.
    pub keep_tail: bool,
    /// A primary answers `twin` without waiting for its twin.
    pub ack_twin_at_once: bool,
    /// A restarted primary keeps its epoch instead of beginning a life.
    pub same_epoch_restart: bool,
    /// An operator's fence records the epoch it names as heard, and a
    /// twin's hello tells the newest epoch its box heard of.
    pub fence_by_hearsay: bool,
    /// A switchover's hold is kept in memory only: a crash loses it.
    pub volatile_hold: bool,
    /// A promoted box never tells its predecessor.
    pub no_predecessor_call: bool,
}

/// How long a switchover waits for the twin, as the node's default does.
pub const SWITCHOVER_WAIT: Duration = Duration::from_millis(1000);

/// How recently a twin may have heard its primary and still be promoted
/// without force.
pub const PROMOTE_QUIET: Duration = Duration::from_millis(300);

/// A write appended and not answered yet.
#[derive(Clone, Copy, Debug)]
struct Pending {
    frame: FrameId,
    twin: bool,
}

/// One box.
struct Machine {
    disk: SimStorage,
    log: Log,
    /// The write behind each frame of the log, from sequence 1.
    writes: Vec<u64>,
    epochs: EpochState,
    role: Role,
    up: bool,
    /// Frames staged and shipped before the sync that makes them durable.
    in_hand: InHand,
    staged: u64,
    sync_due: Option<Instant>,
    waiting: Vec<Pending>,
    gate: Gate,
    switchover: Option<Switchover>,
    /// The hold a switchover recorded is in memory only
    /// ([`Sabotage::volatile_hold`]).
    hold_volatile: bool,
    /// Telling the box it replaced, until heard; when to try next.
    predecessor: Option<(Predecessor, Instant)>,
    /// As a twin: when it last heard its primary.
    heard_primary: Option<Instant>,
    /// What is true of this box whatever its disk says: it handed its role
    /// over, or was told of a newer epoch that some box began, and has
    /// neither become a primary of a newer term since nor a twin. Such a
    /// box must acknowledge nothing.
    deposed: bool,
}

impl Machine {
    fn new(cfg: &PairConfig, role: Role) -> Machine {
        let disk = SimStorage::new();
        let log = open(&disk, cfg);
        log.set_follower(role == Role::Twin);
        Machine {
            disk,
            log,
            writes: Vec::new(),
            epochs: EpochState::new(0),
            role,
            up: true,
            in_hand: InHand::default(),
            staged: 0,
            sync_due: None,
            waiting: Vec::new(),
            gate: Gate::default(),
            switchover: None,
            hold_volatile: false,
            predecessor: None,
            heard_primary: None,
            deposed: false,
        }
    }

    fn frames(&self) -> Vec<FrameId> {
        self.writes
            .iter()
            .enumerate()
            .map(|(i, &write)| FrameId {
                seq: i as u64 + 1,
                write,
            })
            .collect()
    }
}

/// The two boxes; see the module documentation.
pub struct Cluster {
    cfg: PairConfig,
    now: Now,
    boxes: [Machine; 2],
    /// The connection, and which box is its primary end.
    link: Option<(Side, Link)>,
    /// The network between the boxes is down.
    partitioned: bool,
    reconnect_at: Instant,
    backoff: Backoff,
    writes: u64,
    acknowledged: Vec<Acknowledgement>,
    rejoins: Vec<RejoinRecord>,
    /// Logs an operator moved aside whole, to start a box afresh.
    set_aside: Vec<Vec<FrameId>>,
    /// Broken promises seen as they happened (`check` finds the rest by
    /// looking at the logs).
    seen: Vec<Violation>,
    /// Every epoch a box began: promotions, lives, takeovers.
    begun: std::collections::BTreeSet<u64>,
    sabotage: Sabotage,
    /// The next switchover's twin loses power right after it records its
    /// new epoch, before it answers.
    pub crash_at_takeover: bool,
    /// Automatic failover: the arbiter and each box's side of it.
    auto: Option<auto::Auto>,
    journal: Vec<String>,
}

/// A client write's blob: one of a few, so that crcs collide.
fn payload(alphabet: u8) -> Vec<u8> {
    match alphabet % 4 {
        0 => Vec::new(),
        n => vec![n; 24 * n as usize],
    }
}

impl Cluster {
    /// A is the primary and B an empty twin, both of epoch 0, about to
    /// connect.
    pub fn new(cfg: PairConfig) -> Cluster {
        let now = Now::system();
        Cluster {
            cfg,
            now,
            boxes: [
                Machine::new(&cfg, Role::Primary),
                Machine::new(&cfg, Role::Twin),
            ],
            link: None,
            partitioned: false,
            reconnect_at: now.at,
            backoff: Backoff::new(Duration::from_millis(5), Duration::from_millis(200)),
            writes: 0,
            acknowledged: Vec::new(),
            rejoins: Vec::new(),
            set_aside: Vec::new(),
            seen: Vec::new(),
            begun: [0].into_iter().collect(),
            sabotage: Sabotage::default(),
            crash_at_takeover: false,
            auto: None,
            journal: Vec::new(),
        }
    }

    /// Break the rules from now on.
    pub fn sabotage(&mut self, sabotage: Sabotage) {
        self.sabotage = sabotage;
    }

    fn machine(&self, side: Side) -> &Machine {
        &self.boxes[side.at()]
    }

    fn machine_mut(&mut self, side: Side) -> &mut Machine {
        &mut self.boxes[side.at()]
    }

    pub fn log(&self, side: Side) -> &Log {
        &self.machine(side).log
    }

    /// The frames of a box's log, by the writes that made them.
    pub fn frames(&self, side: Side) -> Vec<FrameId> {
        self.machine(side).frames()
    }

    pub fn epochs(&self, side: Side) -> &EpochState {
        &self.machine(side).epochs
    }

    pub fn role(&self, side: Side) -> Role {
        self.machine(side).role
    }

    pub fn is_up(&self, side: Side) -> bool {
        self.machine(side).up
    }

    /// Whether a twin streams from a primary.
    pub fn streaming(&self) -> bool {
        self.link.as_ref().is_some_and(|(_, l)| l.streaming())
    }

    /// Whether `side` still has its predecessor to tell.
    pub fn telling_predecessor(&self, side: Side) -> bool {
        self.machine(side).predecessor.is_some()
    }

    pub fn acknowledged(&self) -> &[Acknowledgement] {
        &self.acknowledged
    }

    pub fn rejoins(&self) -> &[RejoinRecord] {
        &self.rejoins
    }

    /// What happened so far, one line each, for a failing test to print.
    pub fn journal(&self) -> String {
        self.journal.join("\n")
    }

    fn note(&mut self, what: String) {
        self.journal.push(what);
    }

    /// The primary of the newest epoch: of the boxes running as primaries
    /// (up or down), the one whose epoch is highest.
    pub fn serving(&self) -> Option<Side> {
        Side::BOTH
            .into_iter()
            .filter(|&s| self.role(s) == Role::Primary)
            .max_by_key(|&s| self.epochs(s).current())
    }

    /// Whether `side`, as a primary, answers as a fenced one.
    fn fenced_for_answers(&self, side: Side) -> bool {
        (self.epochs(side).fenced() && !self.sabotage.ignore_fence) || !self.lease_allows(side)
    }

    /// A client writes the blob `alphabet` names to `side`, asking for
    /// `twin` durability or not. The box decides by the switchover's gate
    /// and [`ack::admit`] before it appends, and by
    /// [`ack::may_acknowledge`] before it answers.
    pub fn write(&mut self, side: Side, twin: bool, alphabet: u8) -> Written {
        let fenced = self.fenced_for_answers(side);
        let m = self.machine_mut(side);
        let refused = if !m.up {
            Some(Refused::Down)
        } else if m.role != Role::Primary {
            Some(Refused::NotPrimary)
        } else if m.gate.admit().is_err() {
            Some(Refused::Paused)
        } else {
            let state = AckState {
                fenced,
                // Each box's twin is the other box.
                twin_configured: true,
                falls_back: false,
            };
            let admitted = ack::admit(state, twin).err().map(Refused::NotAdmitted);
            if admitted.is_some() {
                m.gate.leave();
            }
            admitted
        };
        if let Some(why) = refused {
            return Written::Refused(why);
        }
        self.writes += 1;
        let write = self.writes;
        let seq = self.stage(side, write, &payload(alphabet));
        let frame = FrameId { seq, write };
        self.machine_mut(side).waiting.push(Pending { frame, twin });
        if twin && self.sabotage.ack_twin_at_once {
            self.answer(side, frame, true);
        }
        self.pump();
        Written::Appended(seq)
    }

    /// Stage a frame on `side` and ship it; it is durable there
    /// `primary_sync` later.
    fn stage(&mut self, side: Side, write: u64, blob: &[u8]) -> u64 {
        if self.machine(side).staged - self.log(side).head_seq() >= super::MAX_SHIPPED_UNSYNCED {
            // As the appender: the next group waits for the last one's sync.
            self.sync(side);
        }
        let meta = Meta::repo("acme")
            .encode()
            .unwrap_or_else(|e| panic!("meta: {e}"));
        let (now, delay) = (self.now, self.cfg.primary_sync);
        let m = self.machine_mut(side);
        let header = m
            .log
            .stage_framed(Kind::Pack.as_u16(), &meta, blob)
            .unwrap_or_else(|e| panic!("append on {side:?}: {e}"));
        let seq = header.seq;
        let mut bytes = frame_prefix(&header, &meta);
        bytes.extend_from_slice(blob);
        m.in_hand.put([(seq, bytes::Bytes::from(bytes))]);
        m.staged = seq;
        m.writes.push(write);
        debug_assert_eq!(m.writes.len() as u64, seq);
        m.sync_due.get_or_insert(now.at + delay);
        if let Some((p, link)) = self.link.as_mut() {
            if *p == side {
                link.appended(seq, header.frame_len(), now);
            }
        }
        seq
    }

    /// `side`'s sync of what it staged: durable and readable from its log
    /// since; the writes it covers are answered.
    fn sync(&mut self, side: Side) {
        let m = self.machine_mut(side);
        m.sync_due = None;
        let head = m
            .log
            .sync()
            .unwrap_or_else(|e| panic!("sync of {side:?}: {e}"));
        m.in_hand.durable_through(head);
        self.answer_waiting(side);
    }

    /// Answer the writes waiting on `side` that are durable as they asked.
    fn answer_waiting(&mut self, side: Side) {
        let head = self.log(side).head_seq();
        let acked = match &self.link {
            Some((p, l)) if *p == side => l.primary.acked(),
            _ => 0,
        };
        let waiting = std::mem::take(&mut self.machine_mut(side).waiting);
        let (done, still): (Vec<_>, Vec<_>) = waiting
            .into_iter()
            .partition(|w| w.frame.seq <= head && (!w.twin || w.frame.seq <= acked));
        self.machine_mut(side).waiting = still;
        for w in done {
            if !(w.twin && self.sabotage.ack_twin_at_once) {
                self.answer(side, w.frame, w.twin);
            }
            self.machine_mut(side).gate.leave();
        }
    }

    /// Answer a write appended on `side`, unless it is fenced by now.
    fn answer(&mut self, side: Side, frame: FrameId, twin: bool) {
        match ack::may_acknowledge(self.fenced_for_answers(side)) {
            Ok(()) => {
                if self.machine(side).deposed {
                    self.seen
                        .push(Violation::DeposedAcknowledged { frame, by: side });
                }
                self.check_leader(side, frame);
                self.acknowledged.push(Acknowledgement {
                    frame,
                    by: side,
                    twin,
                    epochs: self.epochs(side).clone(),
                })
            }
            Err(why) => self.note(format!("{side:?} refused {frame:?}: {why:?}")),
        }
    }

    /// Advance the simulated time by `ms` milliseconds, one at a time.
    pub fn advance(&mut self, ms: u64) {
        for _ in 0..ms {
            self.now = self.now.after(Duration::from_millis(1));
            self.pump();
        }
    }

    /// Break something on the link; [`Fault::Cut`] ends the connection.
    /// The faults that restart a box are [`Cluster::crash`]'s.
    pub fn inject(&mut self, fault: Fault) {
        match fault {
            Fault::Cut => self.drop_link("cut", None),
            Fault::RestartTwin(_) | Fault::RestartPrimary => {}
            other => {
                if let Some((_, link)) = self.link.as_mut() {
                    link.inject(other);
                }
            }
        }
    }

    /// The network between the boxes goes down until [`Cluster::heal`].
    pub fn partition(&mut self) {
        self.partitioned = true;
        self.drop_link("partition", None);
    }

    /// Whether the network between the boxes is down.
    pub fn is_partitioned(&self) -> bool {
        self.partitioned
    }

    pub fn heal(&mut self) {
        self.partitioned = false;
    }

    /// `side` loses power: what it had not synced is lost (or, with a
    /// seed, a prefix of it kept), shipped or not; its connection, its
    /// switchover and the clients waiting on it go, and it stays down
    /// until [`Cluster::restart`]. Its epochs, role and the call it owes
    /// its predecessor survive, as they do on a box's disk.
    pub fn crash(&mut self, side: Side, keep: Option<u64>) {
        if !self.is_up(side) {
            return;
        }
        self.drop_link(&format!("{side:?} lost power"), Some(side));
        self.arbiter_crash(side);
        let cfg = self.cfg;
        let m = self.machine_mut(side);
        m.switchover = None;
        m.gate = Gate::default();
        m.waiting.clear();
        m.in_hand = InHand::default();
        m.sync_due = None;
        if std::mem::take(&mut m.hold_volatile) {
            m.epochs.release();
        }
        m.disk.crash(match keep {
            Some(seed) => CrashMode::KeepPrefix(seed),
            None => CrashMode::LoseUnsynced,
        });
        m.log = open(&m.disk, &cfg);
        m.log.set_follower(m.role == Role::Twin);
        let head = m.log.head_seq();
        m.writes.truncate(head as usize);
        m.staged = head;
        m.up = false;
        self.note(format!("{side:?} lost power, back at {head}"));
    }

    /// A box that lost power starts again, in the role it had; a primary
    /// begins a new life.
    pub fn restart(&mut self, side: Side) {
        if self.is_up(side) {
            return;
        }
        let same_epoch = self.sabotage.same_epoch_restart;
        let arbiter = self.auto.is_some();
        let m = self.machine_mut(side);
        m.up = true;
        let life = match m.role {
            // Under an arbiter the life is taken there.
            Role::Primary if !same_epoch && !arbiter => {
                let head = m.log.head_seq();
                m.epochs
                    .restart(head)
                    .unwrap_or_else(|e| panic!("{side:?}'s new life: {e}"))
            }
            _ => None,
        };
        self.begun.extend(life);
        self.note(format!("{side:?} restarted (life {life:?})"));
        self.pump();
    }

    /// Whether `side` runs as `role` and the network reaches it.
    fn reachable(&self, side: Side, role: Role) -> bool {
        !self.partitioned && self.is_up(side) && self.role(side) == role
    }

    /// The history a box's twin hello carries: its own, or (sabotaged)
    /// one that claims the newest epoch it heard of.
    fn hello_history(&self, side: Side) -> EpochHistory {
        let st = self.epochs(side);
        let mut h = st.history.clone();
        if self.sabotage.fence_by_hearsay && st.newest() > st.current() {
            let head = self.log(side).head_seq();
            let _ = h.begin(st.newest(), head);
        }
        h
    }

    /// `side` hears of `epoch`: if it is newer, a primary is fenced.
    fn fence(&mut self, side: Side, epoch: u64, by: &str) {
        let real = self.begun.contains(&epoch);
        let m = self.machine_mut(side);
        if real && epoch > m.epochs.current() {
            m.deposed = true;
        }
        if m.epochs.hear(epoch, by) {
            self.note(format!(
                "{side:?} fenced by {by}: epoch {}",
                super::epochs::EpochName(epoch)
            ));
        }
    }

    /// `side` became the primary of `epoch`, or a twin: nothing deposes it.
    fn began(&mut self, side: Side, epoch: Option<u64>) {
        self.begun.extend(epoch);
        self.machine_mut(side).deposed = false;
    }

    /// End the connection. The twin end, unless it is `dying`, syncs what
    /// it committed, as its daemon does when a connection ends.
    fn drop_link(&mut self, why: &str, dying: Option<Side>) {
        let Some((p, _)) = self.link.take() else {
            return;
        };
        self.note(format!("connection closed: {why}"));
        let t = p.other();
        if dying != Some(t) && self.is_up(t) {
            if let Err(e) = self.log(t).sync() {
                panic!("sync of {t:?} at the end of a connection: {e}");
            }
            self.follow_writes(p);
        }
        self.reconnect_at = self.now.at + self.backoff.next_delay();
    }

    /// A running twin that reaches a running primary connects.
    fn connect_if_due(&mut self) {
        if self.link.is_some() || self.now.at < self.reconnect_at {
            return;
        }
        for p in Side::BOTH {
            let t = p.other();
            if self.reachable(p, Role::Primary) && self.serves(p) && self.reachable(t, Role::Twin) {
                // Every frame shipped before is durable before the
                // handshake, as the twin session syncs first.
                self.sync(p);
                let twin = link::twin_view(self.log(t), self.hello_history(t));
                let primary = link::primary_view(self.log(p), self.epochs(p).history.clone());
                self.link = Some((p, Link::connect(self.cfg, primary, twin, self.now)));
                self.note(format!("{t:?} connected to {p:?}"));
                return;
            }
        }
    }

    /// The twin's log holds the frames the link applied: they carry the
    /// primary's writes.
    fn follow_writes(&mut self, p: Side) {
        let t = p.other();
        if self.role(t) != Role::Twin {
            // It took over: its log is its own now.
            return;
        }
        let head = self.log(t).head_seq() as usize;
        let from = self.machine(t).writes.len().min(head);
        let Some(shipped) = self.machine(p).writes.get(from..head) else {
            // Nothing was applied: a twin ahead of its primary is refused.
            return;
        };
        let shipped = shipped.to_vec();
        let tm = self.machine_mut(t);
        tm.writes.truncate(from);
        tm.writes.extend(shipped);
    }

    /// Sync, connect, deliver, apply and carry out what the cores and the
    /// operator's machines ask.
    fn pump(&mut self) {
        for side in Side::BOTH {
            let m = self.machine(side);
            if m.up && m.sync_due.is_some_and(|at| at <= self.now.at) {
                self.sync(side);
            }
        }
        self.connect_if_due();
        if let Some((p, mut link)) = self.link.take() {
            let (pm, tm) = (&self.boxes[p.at()], &self.boxes[p.other().at()]);
            let events = link.pump(&pm.log, &pm.in_hand, &tm.log, self.now);
            let streaming = link.streaming();
            self.link = Some((p, link));
            self.follow_writes(p);
            if streaming {
                self.backoff.reset();
                let now = self.now.at;
                self.machine_mut(p.other()).heard_primary = Some(now);
            }
            for event in events {
                self.carry_out(p, event);
            }
        }
        self.drive_switchovers();
        self.call_predecessors();
        self.drive_arbiter();
    }

    /// Carry out what a core of the connection whose primary end is `p`
    /// asked.
    fn carry_out(&mut self, p: Side, event: LinkEvent) {
        let t = p.other();
        match event {
            LinkEvent::Primary(PrimaryAction::Acked(durable)) => {
                let twin_head = self.log(t).head_seq();
                if durable > twin_head {
                    self.seen.push(Violation::AckPastTwinHead {
                        acked: durable,
                        twin_head,
                    });
                }
                self.answer_waiting(p);
            }
            LinkEvent::Primary(PrimaryAction::Fence { epoch }) => {
                self.fence(p, epoch, "its twin, which follows a newer epoch");
            }
            LinkEvent::Primary(PrimaryAction::TwinPromoted { epoch, .. }) => {
                self.switchover_answered(p, Ok(epoch));
            }
            LinkEvent::Primary(PrimaryAction::HandoverRefused(why)) => {
                self.switchover_answered(p, Err(why));
            }
            LinkEvent::Primary(PrimaryAction::Close(why)) => {
                self.drop_link(&format!("{p:?} (primary): {why}"), None);
            }
            LinkEvent::Twin(TwinAction::Close(why)) => {
                self.drop_link(&format!("{t:?} (twin): {why}"), None);
            }
            LinkEvent::Twin(TwinAction::AdoptEpochs(history)) => {
                self.machine_mut(t).epochs.follow(history);
            }
            LinkEvent::Twin(TwinAction::CutAfter { after, .. }) => {
                self.cut_lost(t, after);
            }
            LinkEvent::Twin(TwinAction::Promote { head, .. }) => self.take_over(t, head),
            LinkEvent::Primary(PrimaryAction::BelowFloor { .. })
            | LinkEvent::Twin(TwinAction::BelowFloor { .. }) => {
                self.note(format!("below the floor: {event:?}"));
            }
            // The link ships frames and adopts the history itself; no box
            // keeps a store here.
            LinkEvent::Primary(_) | LinkEvent::Twin(_) => {}
        }
    }

    /// The twin `side` was told its frames past `after` were lost on its
    /// primary: it saves them (as a rejoin does) and cuts them.
    fn cut_lost(&mut self, side: Side, after: u64) {
        let m = self.machine(side);
        let before = m.frames();
        let saved = before[after as usize..].to_vec();
        if let Err(e) = m.log.truncate_after(after) {
            panic!("{side:?} cutting after {after}: {e}");
        }
        self.machine_mut(side).writes.truncate(after as usize);
        let other = self.frames(side.other());
        self.note(format!(
            "{side:?} cut {} frames its primary lost, after {after}",
            saved.len()
        ));
        self.rejoins.push(RejoinRecord {
            side,
            before,
            new_primary: other,
            fork: after,
            saved: Some(saved),
            after: Some(self.frames(side)),
        });
    }
}
