//! `Cluster`: two boxes, A and B, taking turns as primary and twin through
//! failovers, fences, rejoins and switchovers, with simulated time. Each
//! box is a real [`Log`] on its own simulated disk, its [`EpochState`]
//! (which a box keeps durably, so it survives a power cut here) and a
//! role. Whenever a running twin reaches a running primary they connect: a
//! [`Link`] running the production cores.
//!
//! A test writes as clients do (`local` or `twin` durability, to either
//! box), acts as the operator does (promote a twin, rejoin a deposed
//! primary, hand over at a switchover, a client's `Fence`) and breaks
//! things (messages dropped, delayed, duplicated or damaged, the link cut
//! or partitioned, power cuts). [`Cluster::check`] reviews the run so far
//! and names every promise broken:
//!
//! - a frame acknowledged `twin` is in the log of whichever box is the
//!   primary (the primary of the newest epoch);
//! - two boxes holding frames at one sequence under one epoch (each box's
//!   epoch history says which) hold the same frame;
//! - a fenced primary acknowledges nothing;
//! - a rejoin saves exactly the frames past the fork, and only then cuts
//!   them, and cuts nothing else;
//! - no acknowledged write vanishes: it is in a log, in a saved tail or
//!   in a log an operator moved aside.
//!
//! The operator's parts follow `crate::daemon::failover`,
//! `crate::node::rejoin` and the switchover of `crate::node::primary`
//! step by step, under the same rules ([`super::ack`], [`super::epochs`]);
//! [`Sabotage`] breaks them on purpose, for tests that show the checker
//! catches it.

use std::time::{Duration, Instant};

use super::ack::{self, AckState, NotAdmitted};
use super::epochs::EpochState;
use super::in_hand::InHand;
use super::link::{self, Link, LinkEvent};
use super::msg::{PrimaryMsg, Refusal};
use super::pair::{open, Fault, PairConfig};
use super::primary::{PrimaryAction, PrimaryCore};
use super::twin::{TwinAction, TwinCore};
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

/// A frame as the checker tells frames apart: every client write carries
/// its own number in its blob, so two writes sharing a crc and a length is
/// too unlikely to matter in these runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FrameId {
    pub seq: u64,
    pub crc: u32,
    pub blob_len: u64,
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

/// What a client write came to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Written {
    /// Appended and acknowledged at once.
    Acknowledged(u64),
    /// Appended; acknowledged `twin` once the twin holds it, if ever.
    Waiting(u64),
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
    /// the fork, or a power cut between the save and the cut).
    pub after: Option<Vec<FrameId>>,
}

/// Why a rejoin stopped. Nothing is cut unless every check passed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RejoinError {
    /// This box is no running primary, or no primary on the other box
    /// answers.
    Unreachable(String),
    /// The other box refused the Hello.
    Refused(Refusal),
    /// The other box serves an epoch no newer than this one's.
    NotNewer { theirs: u64, ours: u64 },
    /// The frame at the fork differs, or the log failed.
    Failed(String),
}

/// A promise broken, as [`Cluster::check`] names it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Violation {
    /// Both boxes are primaries of one epoch.
    TwoPrimariesOfOneEpoch { epoch: u64 },
    /// A frame acknowledged `twin` is not in the primary's log.
    TwinAcknowledgedMissing {
        frame: FrameId,
        primary: Side,
        holds: Option<FrameId>,
    },
    /// The boxes hold different frames at one sequence of one epoch.
    SameEpochDifferentFrames { epoch: u64, a: FrameId, b: FrameId },
    /// A primary acknowledged a write while fenced.
    FencedAcknowledged {
        frame: FrameId,
        by: Side,
        epoch: u64,
        seen: u64,
    },
    /// A rejoin cut frames past the fork that it had not saved.
    CutUnsaved { side: Side, unsaved: Vec<FrameId> },
    /// A rejoin saved other frames than the ones past the fork.
    SavedOtherFrames {
        side: Side,
        past_fork: Vec<FrameId>,
        saved: Vec<FrameId>,
    },
    /// A rejoin's cut left other frames than the shared ones.
    CutElsewhere { side: Side, shared: u64, head: u64 },
    /// An acknowledged write is in no log and no saved tail.
    AcknowledgedLost { frame: FrameId, by: Side },
    /// A primary was told its twin holds more than it does.
    AckPastTwinHead { acked: u64, twin_head: u64 },
}

/// Ways to break the operator's and the drivers' parts on purpose.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Sabotage {
    /// A rejoin cuts without saving the frames past the fork.
    pub skip_save: bool,
    /// A primary admits and acknowledges writes though fenced.
    pub ignore_fence: bool,
    /// A rejoin takes the new primary's epochs but keeps the frames past
    /// the fork instead of cutting them.
    pub keep_tail: bool,
    /// A primary answers `twin` at once, without waiting for its twin.
    pub ack_twin_at_once: bool,
}

/// How long a switchover waits for the twin, as the node's does.
const SWITCHOVER_WAIT: Duration = Duration::from_millis(1000);

/// A switchover under way on a primary: writes are paused.
#[derive(Clone, Copy, Debug)]
struct Handover {
    head: u64,
    /// The `Handover` message was queued.
    sent: bool,
    deadline: Instant,
}

/// One box.
struct Machine {
    disk: SimStorage,
    log: Log,
    /// The log's head when it was last opened (see
    /// [`super::primary::PrimaryView::restart_head`]).
    restart_head: u64,
    epochs: EpochState,
    role: Role,
    up: bool,
    /// `twin` writes appended here and not answered yet.
    waiting: Vec<FrameId>,
    handover: Option<Handover>,
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
    sabotage: Sabotage,
    journal: Vec<String>,
}

/// Every frame of a log, from sequence 1 (the simulation keeps no
/// retention).
pub fn frame_ids(log: &Log) -> Vec<FrameId> {
    (1..=log.head_seq())
        .map(|seq| {
            let l = log
                .locate_blob(seq)
                .unwrap_or_else(|e| panic!("frame {seq} of a simulated log: {e}"));
            FrameId {
                seq,
                crc: l.payload_crc,
                blob_len: l.blob_len,
            }
        })
        .collect()
}

/// A client write's blob: its number, then filler.
fn payload(write: u64, len: usize) -> Vec<u8> {
    let mut b = write.to_le_bytes().to_vec();
    b.extend((0..len).map(|i| (write as usize * 31 + i) as u8));
    b
}

impl Cluster {
    /// A is the primary and B an empty twin, both of epoch 0, about to
    /// connect.
    pub fn new(cfg: PairConfig) -> Cluster {
        let machine = |role| {
            let disk = SimStorage::new();
            let log = open(&disk, &cfg);
            log.set_follower(role == Role::Twin);
            Machine {
                disk,
                log,
                restart_head: 0,
                epochs: EpochState::new(0),
                role,
                up: true,
                waiting: Vec::new(),
                handover: None,
            }
        };
        let now = Now::system();
        Cluster {
            cfg,
            now,
            boxes: [machine(Role::Primary), machine(Role::Twin)],
            link: None,
            partitioned: false,
            reconnect_at: now.at,
            backoff: Backoff::new(Duration::from_millis(5), Duration::from_millis(200)),
            writes: 0,
            acknowledged: Vec::new(),
            rejoins: Vec::new(),
            set_aside: Vec::new(),
            seen: Vec::new(),
            sabotage: Sabotage::default(),
            journal: Vec::new(),
        }
    }

    /// Break the operator's or the drivers' part from now on.
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
        self.epochs(side).fenced() && !self.sabotage.ignore_fence
    }

    /// A client writes `len` bytes to `side`, asking for `twin`
    /// durability or not. The box decides by [`ack::admit`] before it
    /// appends, and by [`ack::may_acknowledge`] before it answers.
    pub fn write(&mut self, side: Side, twin: bool, len: usize) -> Written {
        let m = self.machine(side);
        let refused = if !m.up {
            Some(Refused::Down)
        } else if m.role != Role::Primary {
            Some(Refused::NotPrimary)
        } else if m.handover.is_some() {
            Some(Refused::Paused)
        } else {
            let state = AckState {
                fenced: self.fenced_for_answers(side),
                // Each box's twin is the other box.
                twin_configured: true,
                falls_back: false,
            };
            ack::admit(state, twin).err().map(Refused::NotAdmitted)
        };
        if let Some(why) = refused {
            return Written::Refused(why);
        }
        self.writes += 1;
        let blob = payload(self.writes, len);
        let m = self.machine(side);
        let seq = m
            .log
            .append(Kind::Pack, &Meta::repo("acme"), &blob)
            .unwrap_or_else(|e| panic!("append on {side:?}: {e}"));
        let frame = FrameId {
            seq,
            crc: m
                .log
                .locate_blob(seq)
                .unwrap_or_else(|e| panic!("frame {seq} just appended: {e}"))
                .payload_crc,
            blob_len: blob.len() as u64,
        };
        if let Some((p, link)) = self.link.as_mut() {
            if *p == side {
                link.appended(seq, blob.len() as u64 + 32, self.now);
            }
        }
        let written = if twin && !self.sabotage.ack_twin_at_once {
            self.machine_mut(side).waiting.push(frame);
            Written::Waiting(seq)
        } else {
            self.answer(side, frame, twin);
            Written::Acknowledged(seq)
        };
        self.pump();
        written
    }

    /// Answer a write appended on `side`, unless it is fenced by now.
    fn answer(&mut self, side: Side, frame: FrameId, twin: bool) {
        match ack::may_acknowledge(self.fenced_for_answers(side)) {
            Ok(()) => self.acknowledged.push(Acknowledgement {
                frame,
                by: side,
                twin,
                epochs: self.epochs(side).clone(),
            }),
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

    pub fn heal(&mut self) {
        self.partitioned = false;
    }

    /// `side` loses power: what it had not synced is lost (or, with a
    /// seed, a prefix of it kept), its connection and the clients waiting
    /// on it go, and it stays down until [`Cluster::restart`]. Its epochs
    /// and role survive, as they do on a box's disk.
    pub fn crash(&mut self, side: Side, keep: Option<u64>) {
        if !self.is_up(side) {
            return;
        }
        // A switchover is a request in memory: it dies with the box.
        self.machine_mut(side).handover = None;
        self.drop_link(&format!("{side:?} lost power"), Some(side));
        let cfg = self.cfg;
        let m = self.machine_mut(side);
        m.disk.crash(match keep {
            Some(seed) => CrashMode::KeepPrefix(seed),
            None => CrashMode::LoseUnsynced,
        });
        m.log = open(&m.disk, &cfg);
        m.log.set_follower(m.role == Role::Twin);
        m.restart_head = m.log.head_seq();
        m.up = false;
        m.waiting.clear();
        self.note(format!("{side:?} lost power"));
    }

    /// A box that lost power starts again, in the role it had.
    pub fn restart(&mut self, side: Side) {
        if self.is_up(side) {
            return;
        }
        self.machine_mut(side).up = true;
        self.note(format!("{side:?} restarted"));
        self.pump();
    }

    /// `twin promote`: the twin, stopped, becomes a primary of a new epoch
    /// from its head. With `dial_old`, its own twin daemon then reaches the
    /// old primary once more, as a twin knowing the new epoch, and fences
    /// it. Answers the new epoch.
    pub fn promote(&mut self, side: Side, dial_old: bool) -> Result<u64, String> {
        if !self.is_up(side) || self.role(side) != Role::Twin {
            return Err(format!("{side:?} is no running twin"));
        }
        if self.link.is_some() {
            self.drop_link(&format!("{side:?} stopped to be promoted"), None);
        }
        let m = self.machine_mut(side);
        let head = m.log.head_seq();
        let epoch = m.epochs.promote(head).map_err(|e| e.to_string())?;
        m.role = Role::Primary;
        m.log.set_follower(false);
        self.note(format!("{side:?} promoted to epoch {epoch} at {head}"));
        if dial_old && self.reachable(side.other(), Role::Primary) {
            let newest = self.epochs(side).newest();
            let answer = self.hello_once(side, newest);
            self.note(format!("{side:?}'s twin daemon was answered {answer:?}"));
        }
        Ok(epoch)
    }

    /// Whether `side` runs as `role` and the network reaches it.
    fn reachable(&self, side: Side, role: Role) -> bool {
        !self.partitioned && self.is_up(side) && self.role(side) == role
    }

    /// `from` says hello to the primary on the other box, as a twin whose
    /// newest epoch is `epoch`, and hears the one answer: how a rejoin asks
    /// where the logs part. The other box carries out what its core asks:
    /// a newer epoch fences it.
    fn hello_once(&mut self, from: Side, epoch: u64) -> Option<PrimaryMsg> {
        let to = from.other();
        let (f, t) = (self.machine(from), self.machine(to));
        let view = link::twin_view(&f.log, epoch, f.epochs.history.clone());
        let hello = TwinCore::new(self.cfg.timers, view, self.now).poll_transmit()?;
        let view = link::primary_view(&t.log, t.epochs.history.clone(), t.restart_head);
        let mut core = PrimaryCore::new(self.cfg.timers, view, self.now);
        core.handle_hello(hello, |seq| super::apply::head_frame(&t.log, seq), self.now);
        let answer = core.poll_transmit();
        while let Some(action) = core.poll_action() {
            if let PrimaryAction::Fence { epoch } = action {
                self.fence(to, epoch, "a box saying hello with a newer epoch");
            }
        }
        answer
    }

    /// `side` hears of `epoch`: if it is newer, a primary is fenced.
    fn fence(&mut self, side: Side, epoch: u64, by: &str) {
        if self.machine_mut(side).epochs.hear(epoch, by) {
            self.note(format!("{side:?} fenced by {by}: epoch {epoch}"));
        }
    }

    /// A client that knows the newest epoch a primary serves tells `side`
    /// (the `Fence` request).
    pub fn client_fence(&mut self, side: Side) {
        let newest = Side::BOTH
            .into_iter()
            .filter(|&s| self.role(s) == Role::Primary)
            .map(|s| self.epochs(s).current())
            .max()
            .unwrap_or(0);
        if self.is_up(side) {
            self.fence(side, newest, "a client");
        }
    }

    /// `primary rejoin`, as `crate::node::rejoin` runs it on the stopped
    /// primary `side`: say hello to the other box's primary, hear where
    /// the logs fork, refuse a box that is not newer, fence this one, save
    /// the frames past the fork, then cut them, and run as its twin from
    /// then on. With `lose_power`, the box loses power between the save
    /// and the cut: it is still a fenced primary, and a second rejoin
    /// finishes. Answers the fork.
    pub fn rejoin(&mut self, side: Side, lose_power: bool) -> Result<u64, RejoinError> {
        let failed = |e: crate::log::Error| RejoinError::Failed(e.to_string());
        if !self.is_up(side) || self.role(side) != Role::Primary {
            return Err(RejoinError::Unreachable(format!(
                "{side:?} is no running primary"
            )));
        }
        if !self.reachable(side.other(), Role::Primary) {
            return Err(RejoinError::Unreachable(format!(
                "no primary on {:?} answers",
                side.other()
            )));
        }
        // The daemon is stopped for a rejoin: its connection and the
        // clients waiting on it go.
        if self.link.is_some() {
            self.drop_link(&format!("{side:?} stopped to rejoin"), None);
        }
        self.machine_mut(side).waiting.clear();
        let state = self.epochs(side).clone();
        let old_head = self.log(side).head_seq();
        let answer = self.hello_once(side, state.current());
        let (fork, fork_crc, epoch) = match answer {
            Some(PrimaryMsg::Welcome { epoch, .. }) => (old_head, None, epoch),
            Some(PrimaryMsg::Refuse(Refusal::Forked { at, crc, epoch, .. })) => (at, crc, epoch),
            Some(PrimaryMsg::Refuse(why)) => return Err(RejoinError::Refused(why)),
            other => {
                return Err(RejoinError::Failed(format!(
                    "the Hello was answered {other:?}"
                )))
            }
        };
        if epoch <= state.current() {
            return Err(RejoinError::NotNewer {
                theirs: epoch,
                ours: state.current(),
            });
        }
        self.fence(side, epoch, "the rejoin");
        let log = self.log(side);
        if fork < old_head {
            if let Some(theirs) = fork_crc {
                let here = log.locate_blob(fork).map_err(failed)?;
                if here.payload_crc != theirs {
                    return Err(RejoinError::Failed(format!(
                        "frame {fork} differs between the logs"
                    )));
                }
            }
        }
        let mut record = RejoinRecord {
            side,
            before: frame_ids(log),
            new_primary: frame_ids(self.log(side.other())),
            fork,
            saved: None,
            after: None,
        };
        if fork < old_head {
            // The save reads every frame whole, its crc checked, as
            // `divergent::save` streams them to its file.
            if !self.sabotage.skip_save {
                let saved = (fork + 1..=old_head)
                    .map(|seq| {
                        let e = log.read(seq).map_err(failed)?;
                        Ok(FrameId {
                            seq,
                            crc: e.payload_crc,
                            blob_len: e.blob.len() as u64,
                        })
                    })
                    .collect::<Result<Vec<_>, RejoinError>>()?;
                record.saved = Some(saved);
            }
            if lose_power {
                self.rejoins.push(record);
                self.crash(side, None);
                return Ok(fork);
            }
            if !self.sabotage.keep_tail {
                log.truncate_after(fork).map_err(failed)?;
                record.after = Some(frame_ids(log));
            }
        }
        self.rejoins.push(record);
        if self.sabotage.keep_tail {
            let history = self.epochs(side.other()).history.clone();
            self.machine_mut(side).epochs.follow(history);
        }
        let m = self.machine_mut(side);
        m.role = Role::Twin;
        m.log.set_follower(true);
        self.note(format!(
            "{side:?} rejoined at fork {fork} (head was {old_head})"
        ));
        self.backoff.reset();
        self.reconnect_at = self.now.at;
        self.pump();
        Ok(fork)
    }

    /// A primary that cannot rejoin (its log is of another history than
    /// the new primary's, which was promoted before it held any frame) is
    /// started afresh, as the rejoin's error tells the operator: its data
    /// directory is moved aside whole, and it restores as an empty twin
    /// that takes the new primary's history. Nothing is lost: the frames
    /// are kept where they were moved.
    pub fn start_afresh(&mut self, side: Side) -> Result<(), String> {
        if !self.is_up(side) || self.role(side) != Role::Primary {
            return Err(format!("{side:?} is no running primary"));
        }
        if self.link.is_some() {
            self.drop_link(&format!("{side:?} stopped to start afresh"), None);
        }
        self.set_aside.push(frame_ids(self.log(side)));
        let disk = SimStorage::new();
        let log = open(&disk, &self.cfg);
        log.set_follower(true);
        let m = self.machine_mut(side);
        *m = Machine {
            disk,
            log,
            restart_head: 0,
            epochs: EpochState::new(0),
            role: Role::Twin,
            up: true,
            waiting: Vec::new(),
            handover: None,
        };
        self.note(format!(
            "{side:?} moved its log aside and starts as an empty twin"
        ));
        self.reconnect_at = self.now.at;
        self.pump();
        Ok(())
    }

    /// A planned switchover on the primary `side`: writes pause, and once
    /// the twin acknowledged the head the primary core hands over.
    pub fn switchover(&mut self, side: Side) -> Result<(), String> {
        let streams = self.streaming() && self.link.as_ref().is_some_and(|(p, _)| *p == side);
        let m = self.machine(side);
        if !m.up || m.role != Role::Primary || m.epochs.fenced() || m.handover.is_some() {
            return Err(format!("{side:?} is no running, unfenced primary"));
        }
        if !streams {
            return Err("no twin is streaming".into());
        }
        let head = m.log.head_seq();
        self.machine_mut(side).handover = Some(Handover {
            head,
            sent: false,
            deadline: self.now.at + SWITCHOVER_WAIT,
        });
        self.note(format!("{side:?} hands over at {head}"));
        self.pump();
        Ok(())
    }

    /// Send the `Handover` once the core takes it; give up at the deadline,
    /// fenced when the twin may have taken over.
    fn drive_handovers(&mut self) {
        for side in Side::BOTH {
            let Some(mut h) = self.machine(side).handover else {
                continue;
            };
            if self.now.at >= h.deadline {
                self.fail_switchover(side);
                continue;
            }
            if !h.sent {
                if let Some((p, link)) = self.link.as_mut() {
                    if *p == side && link.primary.handover(h.head, Vec::new()) {
                        link.transmit(self.now);
                        h.sent = true;
                        self.machine_mut(side).handover = Some(h);
                    }
                }
            }
        }
    }

    /// A switchover ended without the twin's answer. Before the Handover
    /// was sent, writes go on; after, the twin may have promoted itself,
    /// and the box fences itself until an operator knows.
    fn fail_switchover(&mut self, side: Side) {
        let Some(h) = self.machine_mut(side).handover.take() else {
            return;
        };
        if h.sent {
            let unknown = self.epochs(side).unknown_successor();
            self.fence(side, unknown, "a switchover whose outcome is unknown");
        } else {
            self.note(format!("{side:?}'s switchover refused: writes go on"));
        }
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
        }
        self.fail_switchover(p);
        self.reconnect_at = self.now.at + self.backoff.next_delay();
    }

    /// A running twin that reaches a running primary connects.
    fn connect_if_due(&mut self) {
        if self.link.is_some() || self.now.at < self.reconnect_at {
            return;
        }
        for p in Side::BOTH {
            let t = p.other();
            if self.reachable(p, Role::Primary) && self.reachable(t, Role::Twin) {
                let (pm, tm) = (self.machine(p), self.machine(t));
                let twin = link::twin_view(&tm.log, tm.epochs.newest(), tm.epochs.history.clone());
                let primary =
                    link::primary_view(&pm.log, pm.epochs.history.clone(), pm.restart_head);
                self.link = Some((p, Link::connect(self.cfg, primary, twin, self.now)));
                self.note(format!("{t:?} connected to {p:?}"));
                return;
            }
        }
    }

    /// Connect, deliver, apply and carry out what the cores ask.
    fn pump(&mut self) {
        self.connect_if_due();
        if let Some((p, link)) = self.link.as_mut() {
            let p = *p;
            let (primary, twin) = (&self.boxes[p.at()].log, &self.boxes[p.other().at()].log);
            // Appends here are durable before they are shipped: nothing in hand.
            let events = link.pump(primary, &InHand::default(), twin, self.now);
            if link.streaming() {
                self.backoff.reset();
            }
            for event in events {
                self.carry_out(p, event);
            }
        }
        self.drive_handovers();
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
                let waiting = std::mem::take(&mut self.machine_mut(p).waiting);
                let (done, still): (Vec<_>, Vec<_>) =
                    waiting.into_iter().partition(|f| f.seq <= durable);
                self.machine_mut(p).waiting = still;
                for frame in done {
                    self.answer(p, frame, true);
                }
            }
            LinkEvent::Primary(PrimaryAction::Fence { epoch }) => {
                self.fence(p, epoch, "its twin, which knows a newer epoch");
            }
            LinkEvent::Primary(PrimaryAction::TwinPromoted { epoch, .. }) => {
                // The switchover is done: fence, then follow the new
                // primary (`follow_after_switchover`).
                self.fence(p, epoch, "the switchover");
                let m = self.machine_mut(p);
                m.handover = None;
                m.role = Role::Twin;
                m.log.set_follower(true);
                m.waiting.clear();
                self.drop_link("switched over", None);
                self.backoff.reset();
                self.reconnect_at = self.now.at;
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
            LinkEvent::Twin(TwinAction::Promote { head, .. }) => self.promote_in_place(t, head),
            LinkEvent::Primary(PrimaryAction::BelowFloor { .. })
            | LinkEvent::Twin(TwinAction::BelowFloor { .. }) => {
                self.note(format!("below the floor: {event:?}"));
            }
            // The link ships frames and adopts the history itself; no box
            // keeps a store here.
            LinkEvent::Primary(_) | LinkEvent::Twin(_) => {}
        }
    }

    /// The twin `side` took a `Handover` at `head`: it becomes a primary
    /// of a new epoch and answers `Promoted` (`promote_in_place`).
    fn promote_in_place(&mut self, side: Side, head: u64) {
        let m = self.machine_mut(side);
        let epoch = match m.epochs.promote(head) {
            Ok(epoch) => epoch,
            Err(e) => return self.note(format!("{side:?} could not take over: {e}")),
        };
        m.role = Role::Primary;
        m.log.set_follower(false);
        self.note(format!("{side:?} took over at {head}: epoch {epoch}"));
        if let Some((_, link)) = self.link.as_mut() {
            link.twin.promoted(epoch, format!("{side:?}"));
            link.transmit(self.now);
        }
    }

    /// Bring the boxes back to one primary streaming to its twin, as an
    /// operator would after the faults: heal the network, start every
    /// box, rejoin a stale primary to the newer one, promote the twin of a
    /// fenced primary. Answers the primary once its twin holds its whole
    /// log, acknowledged; an error when `max_ms` pass first.
    pub fn settle(&mut self, max_ms: u64) -> Result<Side, String> {
        self.heal();
        for side in Side::BOTH {
            self.restart(side);
        }
        for _ in 0..8 {
            self.advance(1);
            let primaries: Vec<Side> = Side::BOTH
                .into_iter()
                .filter(|&s| self.role(s) == Role::Primary)
                .collect();
            match primaries.as_slice() {
                [one, other] => {
                    let stale = if self.epochs(*one).current() < self.epochs(*other).current() {
                        *one
                    } else {
                        *other
                    };
                    match self.rejoin(stale, false) {
                        Ok(_) => {}
                        Err(RejoinError::Refused(Refusal::History { .. })) => {
                            self.start_afresh(stale)?
                        }
                        Err(e) => return Err(format!("rejoin of {stale:?}: {e:?}")),
                    }
                }
                [] => {
                    let best = if self.log(Side::A).head_seq() >= self.log(Side::B).head_seq() {
                        Side::A
                    } else {
                        Side::B
                    };
                    self.promote(best, false)?;
                }
                [p] if self.epochs(*p).fenced() => {
                    self.promote(p.other(), false)?;
                }
                [p] => {
                    let p = *p;
                    for _ in 0..max_ms {
                        let head = self.log(p).head_seq();
                        let acked = self.link.as_ref().map_or(0, |(_, l)| l.primary.acked());
                        if self.streaming()
                            && self.log(p.other()).head_seq() == head
                            && acked == head
                        {
                            return Ok(p);
                        }
                        self.advance(1);
                    }
                    return Err(format!("no convergence within {max_ms} ms"));
                }
                _ => return Err("more than two boxes".into()),
            }
        }
        Err("no settled pair after eight operator steps".into())
    }

    /// Review the run so far: every promise broken, by name.
    pub fn check(&self) -> Vec<Violation> {
        let mut found = self.seen.clone();
        let logs = [frame_ids(self.log(Side::A)), frame_ids(self.log(Side::B))];
        let holds = |side: Side, seq: u64| -> Option<FrameId> {
            logs[side.at()].get((seq as usize).checked_sub(1)?).copied()
        };
        let (ea, eb) = (
            self.epochs(Side::A).current(),
            self.epochs(Side::B).current(),
        );
        if self.role(Side::A) == Role::Primary && self.role(Side::B) == Role::Primary && ea == eb {
            found.push(Violation::TwoPrimariesOfOneEpoch { epoch: ea });
        }
        if let Some(primary) = self.serving() {
            for a in self.acknowledged.iter().filter(|a| a.twin) {
                let holds = holds(primary, a.frame.seq);
                if holds != Some(a.frame) {
                    found.push(Violation::TwinAcknowledgedMissing {
                        frame: a.frame,
                        primary,
                        holds,
                    });
                }
            }
        }
        let (ha, hb) = (&self.epochs(Side::A).history, &self.epochs(Side::B).history);
        for (a, b) in logs[0].iter().zip(logs[1].iter()) {
            let epoch = ha.epoch_of(a.seq);
            if epoch == hb.epoch_of(b.seq) && a != b {
                found.push(Violation::SameEpochDifferentFrames {
                    epoch: epoch.unwrap_or(0),
                    a: *a,
                    b: *b,
                });
            }
        }
        for a in &self.acknowledged {
            if a.epochs.fenced() {
                found.push(Violation::FencedAcknowledged {
                    frame: a.frame,
                    by: a.by,
                    epoch: a.epochs.current(),
                    seen: a.epochs.seen,
                });
            }
        }
        for r in &self.rejoins {
            found.extend(review_rejoin(r));
        }
        for a in &self.acknowledged {
            let in_log = Side::BOTH
                .into_iter()
                .any(|s| holds(s, a.frame.seq) == Some(a.frame));
            let in_saved = self
                .rejoins
                .iter()
                .filter_map(|r| r.saved.as_ref())
                .chain(self.set_aside.iter())
                .any(|saved| saved.contains(&a.frame));
            if !in_log && !in_saved {
                found.push(Violation::AcknowledgedLost {
                    frame: a.frame,
                    by: a.by,
                });
            }
        }
        found
    }
}

/// A rejoin against what the two logs held: the frames past their longest
/// common prefix, and only those, are saved, and the cut keeps exactly
/// that prefix. The fork is found here by comparing frames, not from the
/// epochs the cores compared.
fn review_rejoin(r: &RejoinRecord) -> Vec<Violation> {
    let mut found = Vec::new();
    let shared = r
        .before
        .iter()
        .zip(r.new_primary.iter())
        .take_while(|(a, b)| a == b)
        .count();
    let past_fork = &r.before[shared..];
    match &r.saved {
        Some(saved) if saved.as_slice() != past_fork => {
            found.push(Violation::SavedOtherFrames {
                side: r.side,
                past_fork: past_fork.to_vec(),
                saved: saved.clone(),
            });
        }
        None if r.after.is_some() && !past_fork.is_empty() => {
            found.push(Violation::CutUnsaved {
                side: r.side,
                unsaved: past_fork.to_vec(),
            });
        }
        _ => {}
    }
    if let Some(after) = &r.after {
        if after.as_slice() != &r.before[..shared] {
            found.push(Violation::CutElsewhere {
                side: r.side,
                shared: shared as u64,
                head: after.len() as u64,
            });
        }
    }
    found
}
