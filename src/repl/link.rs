//! `Link`: one replication connection over a simulated link, shared by the
//! simulations ([`super::pair::ReplPair`], [`super::cluster::Cluster`]).
//!
//! It holds a [`PrimaryCore`] and a [`TwinCore`], the control messages and
//! frame-stream bytes in flight between them, and plays the drivers' part
//! that only needs the two logs: the primary's handshake lookups and
//! shipping, the twin's adopting of a history, gathering each frame,
//! committing it with the primary's crc checked and one sync per batch.
//! Everything else a core asks for (acknowledgements, epochs, promotion,
//! fencing, the end of the connection) is handed to the simulation that
//! owns the link, as [`LinkEvent`]s in the order the cores asked.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use super::apply::{self, head_frame, Applier, Write};
use super::epochs::EpochHistory;
use super::in_hand::{self, InHand};
use super::msg::{Position, PrimaryMsg, TwinMsg};
use super::primary::{PrimaryAction, PrimaryCore, PrimaryState, PrimaryView, Timers};
use super::twin::{TwinAction, TwinCore, TwinState, TwinView};
use super::Now;
use crate::log::{Error, HistoryId, Log};
use bytes::Bytes;

/// How a simulated pair is set up: the link's shape and the primary's
/// sync, kept with the link so the link needs nothing of the pair.
#[derive(Clone, Copy, Debug)]
pub struct PairConfig {
    pub segment_bytes: u64,
    pub timers: Timers,
    /// The largest chunk of frame-stream bytes the link carries at once.
    pub chunk: usize,
    /// One-way delay of the link.
    pub delay: Duration,
    /// How long the primary's sync of a staged frame takes: longer than
    /// the link's delay, so that a twin can hold a frame the primary then
    /// loses.
    pub primary_sync: Duration,
}

impl Default for PairConfig {
    fn default() -> Self {
        PairConfig {
            segment_bytes: 4096,
            timers: Timers {
                heartbeat: Duration::from_millis(20),
                idle_timeout: Duration::from_millis(150),
            },
            chunk: 700,
            delay: Duration::from_millis(2),
            primary_sync: Duration::from_millis(3),
        }
    }
}

/// Something to break.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// The next control message in flight (either way) is lost.
    DropControl,
    /// The next control message in flight arrives twice.
    DuplicateControl,
    /// The control messages in flight arrive this many milliseconds later.
    DelayControl(u64),
    /// A byte of frame-stream data in flight is flipped.
    CorruptData(usize),
    /// The connection is cut.
    Cut,
    /// The twin loses power: unsynced writes are lost (or a prefix of them
    /// kept, with this seed) and it restarts.
    RestartTwin(Option<u64>),
    /// The primary loses power and restarts.
    RestartPrimary,
}

/// What a core asks of the box it runs on, beyond moving frames.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum LinkEvent {
    Primary(PrimaryAction),
    Twin(TwinAction),
}

/// One connection; see the module documentation.
pub(crate) struct Link {
    cfg: PairConfig,
    pub(crate) primary: PrimaryCore,
    pub(crate) twin: TwinCore,
    /// The steps of a frame still arriving: a frame is applied once it is
    /// whole, so that no partly written frame outlives a pump.
    arriving: Vec<Write>,
    to_primary: VecDeque<(Instant, TwinMsg)>,
    to_twin: VecDeque<(Instant, PrimaryMsg)>,
    data: VecDeque<(Instant, Vec<u8>)>,
    /// What the cores asked since the owner last looked.
    events: Vec<LinkEvent>,
    /// A core ended the connection: nothing more moves.
    closed: bool,
}

/// A log's position at `seq`, as a Hello carries it.
pub(crate) fn position(log: &Log, seq: u64) -> Position {
    if seq == 0 {
        return Position::default();
    }
    let crc = log
        .locate_blob(seq)
        .unwrap_or_else(|e| panic!("position of {seq}: {e}"))
        .payload_crc;
    Position { seq, crc }
}

/// The view a box's log gives a twin core: `epoch` is the newest epoch the
/// box knows of, `epochs` its log's history.
pub(crate) fn twin_view(log: &Log, epochs: EpochHistory) -> TwinView {
    TwinView {
        history: log.history().0,
        head: position(log, log.head_seq()),
        first: log.first_seq(),
        epochs,
    }
}

/// The view a box's log gives a primary core.
pub(crate) fn primary_view(log: &Log, epochs: EpochHistory) -> PrimaryView {
    PrimaryView {
        history: log.history().0,
        head: log.head_seq(),
        first: log.first_seq(),
        epochs,
    }
}

impl Link {
    /// A twin dials a primary: both cores start now, the Hello is queued.
    pub(crate) fn connect(cfg: PairConfig, primary: PrimaryView, twin: TwinView, now: Now) -> Link {
        Link {
            cfg,
            primary: PrimaryCore::new(cfg.timers, primary, now),
            twin: TwinCore::new(cfg.timers, twin, now),
            arriving: Vec::new(),
            to_primary: VecDeque::new(),
            to_twin: VecDeque::new(),
            data: VecDeque::new(),
            events: Vec::new(),
            closed: false,
        }
    }

    /// Whether both sides stream.
    pub(crate) fn streaming(&self) -> bool {
        !self.closed
            && self.primary.state() == PrimaryState::Streaming
            && self.twin.state() == TwinState::Streaming
    }

    /// Frames were appended on the primary.
    pub(crate) fn appended(&mut self, head: u64, bytes: u64, now: Now) {
        if !self.closed {
            self.primary.handle_appended(head, bytes, now);
        }
    }

    /// Break something in flight. The faults that end the connection or a
    /// box are the owner's; they do nothing here.
    pub(crate) fn inject(&mut self, fault: Fault) {
        match fault {
            Fault::DropControl => {
                if self.to_primary.pop_front().is_none() {
                    self.to_twin.pop_front();
                }
            }
            Fault::DuplicateControl => {
                if let Some(m) = self.to_primary.front().cloned() {
                    self.to_primary.push_front(m);
                } else if let Some(m) = self.to_twin.front().cloned() {
                    self.to_twin.push_front(m);
                }
            }
            Fault::DelayControl(ms) => {
                let d = Duration::from_millis(ms);
                self.to_primary.iter_mut().for_each(|m| m.0 += d);
                self.to_twin.iter_mut().for_each(|m| m.0 += d);
            }
            Fault::CorruptData(at) => {
                let total: usize = self.data.iter().map(|d| d.1.len()).sum();
                if total > 0 {
                    let mut at = at % total;
                    for (_, chunk) in self.data.iter_mut() {
                        if at < chunk.len() {
                            chunk[at] ^= 0x20;
                            break;
                        }
                        at -= chunk.len();
                    }
                }
            }
            Fault::Cut | Fault::RestartTwin(_) | Fault::RestartPrimary => {}
        }
    }

    /// Deliver what is due, apply the frames that arrived to the twin's
    /// log, run both cores' timers and send what they queued. Answers what
    /// the cores asked of their boxes since the last call, in order; after
    /// a `Close` nothing more moves and the owner drops the link.
    pub(crate) fn pump(
        &mut self,
        primary: &Log,
        in_hand: &InHand,
        twin: &Log,
        now: Now,
    ) -> Vec<LinkEvent> {
        if !self.closed {
            self.deliver(primary, now);
        }
        if !self.closed {
            self.twin_actions(twin);
        }
        if !self.closed {
            self.receive_frames(twin, now);
        }
        if !self.closed {
            self.primary.handle_timeout(now);
            self.twin.handle_timeout(now);
            self.primary_actions(primary, in_hand, twin, now);
        }
        if !self.closed {
            self.twin_actions(twin);
        }
        if !self.closed {
            self.transmit(now);
        }
        std::mem::take(&mut self.events)
    }

    fn deliver(&mut self, primary: &Log, now: Now) {
        while self.to_primary.front().is_some_and(|m| m.0 <= now.at) {
            let Some((_, msg)) = self.to_primary.pop_front() else {
                break;
            };
            if self.primary.state() == PrimaryState::AwaitingHello {
                self.primary
                    .handle_hello(msg, |seq| head_frame(primary, seq), now);
            } else {
                self.primary.handle_message(msg, now);
            }
        }
        while self.to_twin.front().is_some_and(|m| m.0 <= now.at) {
            let Some((_, msg)) = self.to_twin.pop_front() else {
                break;
            };
            self.twin.handle_message(msg, now);
        }
    }

    /// Put what both cores queued on the link.
    pub(crate) fn transmit(&mut self, now: Now) {
        let at = now.at + self.cfg.delay;
        while let Some(m) = self.primary.poll_transmit() {
            self.to_twin.push_back((at, m));
        }
        while let Some(m) = self.twin.poll_transmit() {
            self.to_primary.push_back((at, m));
        }
    }

    fn primary_actions(&mut self, primary: &Log, in_hand: &InHand, twin: &Log, now: Now) {
        while let Some(action) = self.primary.poll_action() {
            match action {
                PrimaryAction::Ship { from, through } => {
                    for seq in from..=through {
                        self.ship(primary, in_hand, seq, now);
                    }
                }
                PrimaryAction::Close(why) => {
                    // The refusal reaches the twin before the close does,
                    // as the daemon waits for it to be read.
                    while let Some(m) = self.primary.poll_transmit() {
                        self.twin.handle_message(m, now);
                    }
                    self.twin_actions(twin);
                    self.closed = true;
                    self.events
                        .push(LinkEvent::Primary(PrimaryAction::Close(why)));
                    return;
                }
                other => self.events.push(LinkEvent::Primary(other)),
            }
        }
    }

    fn twin_actions(&mut self, twin: &Log) {
        while let Some(action) = self.twin.poll_action() {
            match action {
                TwinAction::AdoptHistory(h) => {
                    // Before the first frame: the log holds none yet.
                    twin.adopt_history(HistoryId(h))
                        .unwrap_or_else(|e| panic!("adopt history: {e}"));
                }
                TwinAction::CutAfter { after, crc } => {
                    // Before the Close that follows: the next Hello reports
                    // the cut log.
                    if let Some(crc) = crc {
                        let here = twin
                            .locate_blob(after)
                            .unwrap_or_else(|e| panic!("the twin's frame {after}: {e}"));
                        assert!(
                            here.is_erased() || here.payload_crc == crc,
                            "the twin's frame {after} is not the primary's: no shared past to cut to"
                        );
                    }
                    twin.truncate_after(after)
                        .unwrap_or_else(|e| panic!("cutting the twin after {after}: {e}"));
                    self.events
                        .push(LinkEvent::Twin(TwinAction::CutAfter { after, crc }));
                }
                TwinAction::Close(why) => {
                    self.closed = true;
                    self.events.push(LinkEvent::Twin(TwinAction::Close(why)));
                    return;
                }
                other => self.events.push(LinkEvent::Twin(other)),
            }
        }
    }

    /// Put frame `seq` on the stream as its stored bytes, in chunks.
    fn ship(&mut self, primary: &Log, in_hand: &InHand, seq: u64, now: Now) {
        let mut bytes = Vec::new();
        in_hand::ship_frame(primary, in_hand, seq, 1 << 16, |piece| {
            bytes.extend_from_slice(piece);
            Ok::<(), Error>(())
        })
        .unwrap_or_else(|e| panic!("ship {seq}: {e}"));
        let at = now.at + self.cfg.delay;
        for chunk in bytes.chunks(self.cfg.chunk.max(1)) {
            self.data.push_back((at, chunk.to_vec()));
        }
    }

    /// Apply the chunks that arrived, as the twin's writer does: the whole
    /// frames among them in one batch per chunk, then one sync for all.
    fn receive_frames(&mut self, twin: &Log, now: Now) {
        let mut applier = Applier::new(twin);
        loop {
            let streaming = self.twin.state() == TwinState::Streaming;
            if self.closed || !streaming || self.data.front().is_none_or(|d| d.0 > now.at) {
                break;
            }
            let Some((_, chunk)) = self.data.pop_front() else {
                break;
            };
            // A refusal is queued in the core, which is closed and says why.
            let _ = apply::decode(&mut self.twin, &Bytes::from(chunk), &mut self.arriving);
            let whole = self.arriving.iter().rposition(Write::ends_frame);
            if let Some(last) = whole {
                let applied = applier.apply(self.arriving.drain(..=last));
                if let Some(seq) = applied.committed {
                    self.twin.handle_committed(seq);
                }
                if let Some(e) = applied.failed {
                    self.twin.handle_commit_failed(&e);
                }
            }
            self.twin_actions(twin);
        }
        // The input at hand is drained: one sync for the batch, one ack.
        if !self.closed {
            match applier.sync_if_caught_up() {
                Some(Ok(head)) => self.twin.handle_synced(head),
                Some(Err(e)) => self.twin.handle_commit_failed(&e),
                None => {}
            }
        }
    }
}
