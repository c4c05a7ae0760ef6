//! The shipping side: one [`PrimaryCore`] per twin connection.
//!
//! Call order: [`PrimaryCore::new`] when a connection is accepted; feed the
//! twin's first message to [`PrimaryCore::handle_hello`] with the primary's
//! crc at the twin's head, later ones to [`PrimaryCore::handle_message`];
//! report local appends with [`PrimaryCore::handle_appended`] and timers with
//! [`PrimaryCore::handle_timeout`]. After each call, drain
//! [`PrimaryCore::poll_transmit`] (control messages to send) and
//! [`PrimaryCore::poll_action`] (frames to ship, acks to report, the end of
//! the connection); [`PrimaryCore::poll_timeout`] says when to call again.

use std::collections::VecDeque;
use std::time::Duration;

use super::epochs::{fork_point, lost_on_primary, EpochHistory};
use super::msg::{HandedClient, PrimaryMsg, Refusal, StoreHealth, TwinMsg, PROTOCOL_VERSION};
use super::Now;

/// Timers of a connection.
#[derive(Clone, Copy, Debug)]
pub struct Timers {
    /// How often a side tells the other it is alive.
    pub heartbeat: Duration,
    /// Silence after which a side gives the connection up.
    pub idle_timeout: Duration,
}

impl Default for Timers {
    fn default() -> Self {
        Timers {
            heartbeat: Duration::from_millis(500),
            idle_timeout: Duration::from_secs(5),
        }
    }
}

/// The primary's log as a connection starts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PrimaryView {
    pub history: [u8; 16],
    pub head: u64,
    pub first: u64,
    /// The epochs of this primary's log; the newest is the one it serves,
    /// begun when this life of the primary began.
    pub epochs: EpochHistory,
}

/// The most frames a primary ships past its durable head: one group of
/// small appends, shipped before the sync that covers it, the next staged
/// only after. A twin further past the start of the primary's life than
/// this did not get there by a crash of the primary (a primary's log put
/// back from an older copy, say): it is refused as [`Refusal::TwinAhead`],
/// and nothing is cut.
pub const MAX_SHIPPED_UNSYNCED: u64 = 256;

/// What the driver must do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PrimaryAction {
    /// Stream frames `from..=through` on the frame stream, in order, after
    /// every frame shipped before.
    Ship { from: u64, through: u64 },
    /// Every frame through this sequence is durable on the twin: clients
    /// waiting for `twin` durability up to it may be answered.
    Acked(u64),
    /// The twin's head is below this log's retention floor: it needs a
    /// snapshot before frames can follow.
    BelowFloor { twin_head: u64, first: u64 },
    /// The twin reported its store.
    TwinStore(StoreHealth),
    /// The twin knows of a newer epoch than this primary's: another box
    /// was promoted. Fence this primary, durably, before anything else.
    Fence { epoch: u64 },
    /// The twin took the handover: it is the primary of `epoch` now,
    /// serving at `listen`. Fence this primary, then follow it.
    TwinPromoted { epoch: u64, listen: String },
    /// The twin answered the handover that it does not take over: nothing
    /// changed there, so this primary may take writes again.
    HandoverRefused(String),
    /// The twin's digests for the verify `id`.
    Digests {
        id: u64,
        digests: Vec<super::verify::Digest>,
        error: Option<String>,
    },
    /// End the connection: a refusal was sent or received, or the twin
    /// went silent.
    Close(Refusal),
}

/// The primary's frame at a twin's head, as the handshake compares it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeadFrame {
    /// Its payload crc.
    pub crc: u32,
    /// Whether it was erased here.
    pub erased: bool,
}

impl HeadFrame {
    /// A frame that was not erased, with this crc.
    pub fn crc(crc: u32) -> HeadFrame {
        HeadFrame { crc, erased: false }
    }
}

/// Where a connection stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PrimaryState {
    AwaitingHello,
    Streaming,
    BelowFloor,
    Closed,
}

/// The replication lag of a twin as the primary sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PrimaryStatus {
    pub state: PrimaryState,
    pub head: u64,
    pub shipped: u64,
    pub acked: u64,
    /// Frames appended here that the twin has not acknowledged.
    pub lag_frames: u64,
    /// Their bytes, as far as this connection saw them appended.
    pub lag_bytes: u64,
    /// Since the oldest of them was appended (zero when there is none).
    pub lag: Duration,
}

/// Appends seen during the connection, for lag in bytes and time.
const MAX_APPEND_MARKS: usize = 1 << 16;

/// The shipping side of one connection.
#[derive(Debug)]
pub struct PrimaryCore {
    timers: Timers,
    state: PrimaryState,
    history: [u8; 16],
    head: u64,
    /// This log's floor at the handshake. While the twin streams, the
    /// retention hold keeps its frames; a read below the floor ends the
    /// session, and the next handshake sees the new floor.
    first: u64,
    epochs: EpochHistory,
    /// A `Handover` was sent: the twin may answer `Promoted`.
    handed_over: bool,
    shipped: u64,
    acked: u64,
    started: Now,
    heard: Now,
    next_heartbeat: std::time::Instant,
    /// `(through, when, bytes)` of appends after `acked`, oldest first.
    marks: VecDeque<(u64, std::time::Instant, u64)>,
    transmit: VecDeque<PrimaryMsg>,
    actions: VecDeque<PrimaryAction>,
    /// From each publication to the twin's ack covering it, not yet taken
    /// by the driver.
    ack_delays: VecDeque<Duration>,
}

impl PrimaryCore {
    /// A connection accepted from a twin; it speaks first.
    pub fn new(timers: Timers, view: PrimaryView, now: Now) -> Self {
        PrimaryCore {
            timers,
            state: PrimaryState::AwaitingHello,
            history: view.history,
            head: view.head,
            first: view.first,
            epochs: view.epochs,
            handed_over: false,
            shipped: 0,
            acked: 0,
            started: now,
            heard: now,
            next_heartbeat: now.at + timers.heartbeat,
            marks: VecDeque::new(),
            transmit: VecDeque::new(),
            actions: VecDeque::new(),
            ack_delays: VecDeque::new(),
        }
    }

    /// Where the connection stands.
    pub fn state(&self) -> PrimaryState {
        self.state
    }

    /// The highest sequence the twin has acknowledged as durable.
    pub fn acked(&self) -> u64 {
        self.acked
    }

    fn refuse(&mut self, why: Refusal) {
        if self.state == PrimaryState::Closed {
            return;
        }
        tracing::warn!(%why, "refusing the twin");
        self.transmit.push_back(PrimaryMsg::Refuse(why.clone()));
        self.close(why);
    }

    fn close(&mut self, why: Refusal) {
        self.state = PrimaryState::Closed;
        self.actions.push_back(PrimaryAction::Close(why));
    }

    /// The twin's first message. `frame_at(seq)` is this log's frame at
    /// `seq`, when it is retained here.
    ///
    /// A twin that follows a newer epoch is refused, and this primary
    /// learns it was superseded ([`PrimaryAction::Fence`]): the twin's
    /// history proves that epoch. A twin of another history is refused,
    /// unless it holds no frame at all (it takes this log's history). Then
    /// the fork point of the two epoch histories says what the logs share,
    /// whatever the frames' bytes: a twin holding frames past it that
    /// earlier lives of this primary wrote and lost in a crash
    /// ([`super::epochs::lost_on_primary`]) is refused as
    /// [`Refusal::LostOnPrimary`], and cuts them; one holding frames of
    /// another epoch past it is refused as [`Refusal::Forked`], naming the
    /// fork and this log's frame there, so that rejoin can cut what was
    /// never here. The view's head must cover every frame shipped before
    /// (sync before taking it). A twin ahead otherwise, or holding another
    /// frame at its head under the same epoch, is refused by name. A twin
    /// whose head frame is no longer retained here is below the floor.
    /// Otherwise frames follow from its head + 1.
    ///
    /// A frame erased here matches whatever the twin holds there: an erase
    /// leaves no crc of what it erased, and the twin erases the same frame
    /// when it applies the Erase frame that follows it in this log.
    pub fn handle_hello(
        &mut self,
        hello: TwinMsg,
        frame_at: impl Fn(u64) -> Option<HeadFrame>,
        now: Now,
    ) {
        self.heard = now;
        let TwinMsg::Hello {
            version,
            history,
            head,
            first: _,
            epochs,
        } = hello
        else {
            return self.refuse(Refusal::Protocol("the first message must be Hello".into()));
        };
        if self.state != PrimaryState::AwaitingHello {
            return self.refuse(Refusal::Protocol("a second Hello".into()));
        }
        if version != PROTOCOL_VERSION {
            return self.refuse(Refusal::Version {
                ours: PROTOCOL_VERSION,
                theirs: version,
            });
        }
        let ours = self.epochs.current();
        let theirs = epochs.current();
        if theirs > ours {
            self.actions
                .push_back(PrimaryAction::Fence { epoch: theirs });
            return self.refuse(Refusal::StaleEpoch {
                primary: ours,
                twin: theirs,
            });
        }
        let fresh = head.seq == 0;
        if history != self.history && !fresh {
            return self.refuse(Refusal::History {
                primary: self.history,
                twin: history,
            });
        }
        // Frames past this primary's head will be written under its
        // current epoch: the twin's frames past the fork were written by
        // an earlier life of this primary and lost here, or by another
        // box, or (under this very epoch) past what this log ever held.
        let fork = fork_point(&self.epochs, u64::MAX, &epochs, head.seq).min(self.head);
        if fork < head.seq {
            let crc_at_fork = match fork {
                0 => None,
                _ => frame_at(fork).filter(|f| !f.erased).map(|f| f.crc),
            };
            if lost_on_primary(&self.epochs, &epochs, fork, head.seq) {
                if head.seq - fork > MAX_SHIPPED_UNSYNCED {
                    return self.refuse(Refusal::TwinAhead {
                        twin_head: head.seq,
                        primary_head: self.head,
                    });
                }
                return self.refuse(Refusal::LostOnPrimary {
                    after: fork,
                    twin_head: head.seq,
                    crc: crc_at_fork,
                    epochs: self.epochs.clone(),
                });
            }
            if epochs.epoch_of(fork + 1) != self.epochs.epoch_of(fork + 1) {
                return self.refuse(Refusal::Forked {
                    at: fork,
                    twin_head: head.seq,
                    crc: crc_at_fork,
                    epoch: ours,
                });
            }
        }
        if head.seq > self.head {
            return self.refuse(Refusal::TwinAhead {
                twin_head: head.seq,
                primary_head: self.head,
            });
        }
        if head.seq > 0 {
            match frame_at(head.seq) {
                Some(f) if f.erased || f.crc == head.crc => {}
                Some(f) => {
                    return self.refuse(Refusal::Diverged {
                        seq: head.seq,
                        primary_crc: f.crc,
                        twin_crc: head.crc,
                    })
                }
                // The frame that would prove a shared past is gone here.
                None => return self.below_floor(head.seq),
            }
        } else if self.first > 1 {
            return self.below_floor(0);
        }
        self.state = PrimaryState::Streaming;
        self.shipped = head.seq;
        self.acked = head.seq;
        self.transmit.push_back(PrimaryMsg::Welcome {
            version: PROTOCOL_VERSION,
            history: self.history,
            from: head.seq + 1,
            head: self.head,
            first: self.first,
            epochs: self.epochs.clone(),
        });
        if head.seq > 0 {
            self.actions.push_back(PrimaryAction::Acked(head.seq));
        }
        self.ship();
    }

    fn below_floor(&mut self, twin_head: u64) {
        self.state = PrimaryState::BelowFloor;
        self.transmit.push_back(PrimaryMsg::BelowFloor {
            first: self.first,
            head: self.head,
        });
        self.actions.push_back(PrimaryAction::BelowFloor {
            twin_head,
            first: self.first,
        });
    }

    fn ship(&mut self) {
        if self.state == PrimaryState::Streaming && self.head > self.shipped {
            self.actions.push_back(PrimaryAction::Ship {
                from: self.shipped + 1,
                through: self.head,
            });
            self.shipped = self.head;
        }
    }

    /// A message after the Hello.
    pub fn handle_message(&mut self, msg: TwinMsg, now: Now) {
        self.heard = now;
        match msg {
            TwinMsg::Hello { .. } => self.refuse(Refusal::Protocol("a second Hello".into())),
            TwinMsg::AskEpochs(_) => {
                self.refuse(Refusal::Protocol("AskEpochs after the Hello".into()))
            }
            TwinMsg::Ack { durable } => self.handle_ack(durable, now),
            TwinMsg::Store(health) => match self.state {
                PrimaryState::Streaming => self.actions.push_back(PrimaryAction::TwinStore(health)),
                PrimaryState::Closed => {}
                _ => self.refuse(Refusal::Protocol("a store report before streaming".into())),
            },
            TwinMsg::Refuse(why) => {
                if self.state != PrimaryState::Closed {
                    tracing::warn!(%why, "the twin refused");
                    self.close(why);
                }
            }
            TwinMsg::Promoted { epochs, listen } => {
                if !self.handed_over {
                    return self.refuse(Refusal::Protocol("Promoted without a Handover".into()));
                }
                // The twin proves its promotion by its history: this log's
                // through the head handed over, then its own new term.
                let epoch = epochs.current();
                let shares = fork_point(&self.epochs, self.head, &epochs, self.head) == self.head;
                if epoch <= self.epochs.current() || !shares {
                    return self.refuse(Refusal::Protocol(format!(
                        "promoted to epoch {} with a history that does not extend this primary's (epoch {})",
                        super::epochs::EpochName(epoch),
                        super::epochs::EpochName(self.epochs.current())
                    )));
                }
                self.actions
                    .push_back(PrimaryAction::TwinPromoted { epoch, listen });
            }
            TwinMsg::Digests { id, digests, error } => {
                if self.state == PrimaryState::Streaming {
                    self.actions
                        .push_back(PrimaryAction::Digests { id, digests, error });
                }
            }
            TwinMsg::HandoverRefused(why) => {
                if !self.handed_over {
                    return self.refuse(Refusal::Protocol(
                        "HandoverRefused without a Handover".into(),
                    ));
                }
                self.handed_over = false;
                self.actions.push_back(PrimaryAction::HandoverRefused(why));
            }
        }
    }

    /// Ask the twin for the digests of `ask` (a verify, `id`), read at
    /// `mib_per_s`. Answers
    /// whether it was queued: only to a twin that streams.
    pub fn verify(&mut self, id: u64, ask: super::verify::Ask, mib_per_s: u32) -> bool {
        if self.state != PrimaryState::Streaming {
            return false;
        }
        self.transmit.push_back(PrimaryMsg::Verify {
            id,
            from: ask.from,
            through: ask.through,
            step: ask.step,
            mib_per_s,
        });
        true
    }

    /// Hand the primary role to the twin (a planned switchover): allowed
    /// once the twin has acknowledged this primary's whole log through
    /// `head`, which the caller stopped writing at. Answers whether the
    /// `Handover` was queued.
    pub fn handover(&mut self, head: u64, clients: Vec<HandedClient>) -> bool {
        if self.state != PrimaryState::Streaming
            || self.handed_over
            || head != self.head
            || self.acked < head
        {
            return false;
        }
        self.handed_over = true;
        self.transmit
            .push_back(PrimaryMsg::Handover { head, clients });
        true
    }

    fn handle_ack(&mut self, durable: u64, now: Now) {
        match self.state {
            PrimaryState::Streaming => {}
            PrimaryState::Closed => return,
            _ => return self.refuse(Refusal::Protocol("an Ack before streaming".into())),
        }
        if durable > self.shipped {
            return self.refuse(Refusal::Protocol(format!(
                "Ack of {durable}, only {} shipped",
                self.shipped
            )));
        }
        // An older or repeated ack says nothing new.
        if durable > self.acked {
            self.acked = durable;
            while let Some(m) = self.marks.front().filter(|m| m.0 <= durable) {
                if self.ack_delays.len() < MAX_APPEND_MARKS {
                    self.ack_delays
                        .push_back(now.at.saturating_duration_since(m.1));
                }
                self.marks.pop_front();
            }
            self.actions.push_back(PrimaryAction::Acked(durable));
        }
    }

    /// Frames were appended here: the head is now `head`, `bytes` more on
    /// disk.
    pub fn handle_appended(&mut self, head: u64, bytes: u64, now: Now) {
        if head <= self.head {
            return;
        }
        self.head = head;
        if self.marks.len() == MAX_APPEND_MARKS {
            // Merge the two newest marks: the oldest time, which lag needs,
            // stays exact.
            if let (Some(last), Some(prev)) = (self.marks.pop_back(), self.marks.pop_back()) {
                self.marks.push_back((last.0, prev.1, prev.2 + last.2));
            }
        }
        self.marks.push_back((head, now.at, bytes));
        self.ship();
    }

    /// Timers: heartbeats, and giving up on a silent twin. A call before
    /// anything is due does nothing.
    pub fn handle_timeout(&mut self, now: Now) {
        if self.state == PrimaryState::Closed {
            return;
        }
        if now.at.duration_since(self.heard.at) >= self.timers.idle_timeout {
            return self.refuse(Refusal::Timeout);
        }
        if now.at >= self.next_heartbeat {
            self.transmit.push_back(PrimaryMsg::Heartbeat {
                head: self.head,
                unix_ms: now.unix_ms,
            });
            self.next_heartbeat = now.at + self.timers.heartbeat;
        }
    }

    /// When [`PrimaryCore::handle_timeout`] is next due.
    pub fn poll_timeout(&self) -> Option<std::time::Instant> {
        (self.state != PrimaryState::Closed).then(|| {
            self.next_heartbeat
                .min(self.heard.at + self.timers.idle_timeout)
        })
    }

    /// The next control message to send.
    pub fn poll_transmit(&mut self) -> Option<PrimaryMsg> {
        self.transmit.pop_front()
    }

    /// The next thing the driver must do.
    pub fn poll_action(&mut self) -> Option<PrimaryAction> {
        self.actions.pop_front()
    }

    /// The time from each publication to the twin's ack that covered it,
    /// since the last call.
    pub fn take_ack_delays(&mut self) -> impl Iterator<Item = Duration> + '_ {
        self.ack_delays.drain(..)
    }

    /// The twin's lag as seen from here.
    pub fn status(&self, now: Now) -> PrimaryStatus {
        let pending = self.marks.iter().filter(|m| m.0 > self.acked);
        let lag = match self.marks.iter().find(|m| m.0 > self.acked) {
            Some(m) => now.at.duration_since(m.1),
            None if self.head > self.acked => now.at.duration_since(self.started.at),
            None => Duration::ZERO,
        };
        PrimaryStatus {
            state: self.state,
            head: self.head,
            shipped: self.shipped,
            acked: self.acked,
            lag_frames: self.head.saturating_sub(self.acked),
            lag_bytes: pending.map(|m| m.2).sum(),
            lag,
        }
    }
}

/// The lowest frame a twin that said `Hello { first, head }` will hold: a
/// twin whose log starts past its head (a snapshot installed) never holds
/// the frames before its first. A `twin` answer for a frame below it is
/// `NotOnTwin`, not a wait.
pub fn twin_holds_from(first: u64, head: u64) -> u64 {
    if head == 0 {
        1
    } else {
        first.min(head + 1)
    }
}

/// How a twin's acknowledgement moves the retention hold (the lowest frame
/// the twin still needs from this log).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HoldUpdate {
    /// The session's first acknowledgement: the twin's position as it
    /// says it now, even below an earlier session's (a replaced twin,
    /// or one put back from an older copy, needs those frames again).
    Set(u64),
    /// Later ones only raise it: acknowledgements may cross.
    Raise(u64),
}

/// The hold update for an acknowledgement of `durable`.
pub fn hold_update(durable: u64, first_of_session: bool) -> HoldUpdate {
    if first_of_session {
        HoldUpdate::Set(durable)
    } else {
        HoldUpdate::Raise(durable)
    }
}

#[cfg(test)]
mod hold_tests {
    use super::*;

    #[test]
    fn the_hold_follows_the_session_s_first_ack_then_only_rises() {
        assert_eq!(twin_holds_from(1, 0), 1);
        assert_eq!(twin_holds_from(1, 40), 1);
        // Installed a snapshot at 100, nothing past it yet.
        assert_eq!(twin_holds_from(101, 100), 101);
        assert_eq!(twin_holds_from(101, 120), 101);
        assert_eq!(hold_update(7, true), HoldUpdate::Set(7));
        assert_eq!(hold_update(7, false), HoldUpdate::Raise(7));
    }
}
