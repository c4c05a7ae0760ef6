//! The receiving side: one [`TwinCore`] per connection to the primary.
//!
//! Call order: [`TwinCore::new`] sends the Hello; feed control messages to
//! [`TwinCore::handle_message`] and frame-stream bytes, once streaming, to
//! [`TwinCore::handle_frame_data`], applying each event it returns to the
//! log (begin, pieces, then a commit without sync that checks the
//! primary's crc) and reporting it with [`TwinCore::handle_committed`].
//! When the input at hand is drained and [`TwinCore::needs_sync`], sync the
//! log once and report the head with [`TwinCore::handle_synced`]: only that
//! head is ever acknowledged. Drain [`TwinCore::poll_transmit`] and
//! [`TwinCore::poll_action`] after each call.

use std::collections::VecDeque;

use super::epochs::{fork_point, lost_on_primary, EpochHistory};
use super::msg::{
    Position, PrimaryMsg, Refusal, StoreHealth, TwinMsg, MAX_STALL_ERROR, PROTOCOL_VERSION,
};
use super::primary::Timers;
use super::wire::{FrameDecoder, FrameEvent};
use super::Now;
use crate::log::Error as LogError;

/// The twin's log as a connection starts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TwinView {
    pub history: [u8; 16],
    /// The durable head and its frame's crc.
    pub head: Position,
    pub first: u64,
    /// The epochs of this box's log; the newest is the one it follows.
    pub epochs: EpochHistory,
}

/// What the driver must do besides applying frame events.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TwinAction {
    /// Take the primary's history before the first frame: this log holds
    /// no frame yet.
    AdoptHistory([u8; 16]),
    /// Record durably that this log's epochs are the primary's (this log
    /// is a prefix of the primary's), before the first frame.
    AdoptEpochs(EpochHistory),
    /// A planned switchover: this box holds the primary's whole log
    /// through `head` durably; promote it (a new epoch, these clients
    /// pinned), then report with [`TwinCore::promoted`].
    Promote {
        head: u64,
        clients: Vec<super::msg::HandedClient>,
    },
    /// The primary no longer holds what follows this log's head: a snapshot
    /// is needed.
    BelowFloor { first: u64, primary_head: u64 },
    /// The primary lost this log's frames past `after` in a crash before
    /// they were durable there: check this log's frame at `after` against
    /// `crc` (none: nothing to check), save the frames past it, cut them,
    /// and connect again. `Close` follows.
    CutAfter { after: u64, crc: Option<u32> },
    /// Digest this log's frames as asked (a verify, `id`), then answer
    /// with [`TwinCore::digests`].
    Digest {
        id: u64,
        ask: super::verify::Ask,
        /// The pace the primary asked for, MiB/s (bounded by the node).
        mib_per_s: u32,
    },
    /// End the connection.
    Close(Refusal),
}

/// Where a connection stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TwinState {
    AwaitingWelcome,
    Streaming,
    BelowFloor,
    Closed,
}

/// The receiving side of one connection.
#[derive(Debug)]
pub struct TwinCore {
    timers: Timers,
    state: TwinState,
    history: [u8; 16],
    epochs: EpochHistory,
    /// The durable head: the only sequence ever acknowledged.
    durable: u64,
    acked: u64,
    /// The sequence the next frame on the stream must carry.
    next: u64,
    /// The last frame committed (not yet synced).
    committed: u64,
    primary_head: u64,
    primary_unix_ms: u64,
    heard: Now,
    /// When the last keepalive went.
    last_beat: std::time::Instant,
    decoder: FrameDecoder,
    transmit: VecDeque<TwinMsg>,
    actions: VecDeque<TwinAction>,
    /// The store report last sent on this connection.
    store_sent: Option<StoreHealth>,
    /// A `Handover` was taken: the driver promotes this box once.
    handed_over: bool,
}

impl TwinCore {
    /// A connection to the primary: the Hello is queued.
    pub fn new(timers: Timers, view: TwinView, now: Now) -> Self {
        let mut transmit = VecDeque::new();
        transmit.push_back(TwinMsg::Hello {
            version: PROTOCOL_VERSION,
            history: view.history,
            head: view.head,
            first: view.first,
            epochs: view.epochs.clone(),
        });
        TwinCore {
            timers,
            state: TwinState::AwaitingWelcome,
            history: view.history,
            epochs: view.epochs,
            durable: view.head.seq,
            acked: view.head.seq,
            next: view.head.seq + 1,
            committed: view.head.seq,
            primary_head: 0,
            primary_unix_ms: 0,
            heard: now,
            last_beat: now.at,
            decoder: FrameDecoder::default(),
            transmit,
            actions: VecDeque::new(),
            store_sent: None,
            handed_over: false,
        }
    }

    /// This box's store as it is now: reported to the primary once
    /// streaming, and again whenever it changes.
    pub fn report_store(&mut self, mut health: StoreHealth) {
        if self.state != TwinState::Streaming {
            return;
        }
        if let Some(s) = health.stalled.as_mut() {
            if s.error.len() > MAX_STALL_ERROR {
                let mut cut = MAX_STALL_ERROR;
                while !s.error.is_char_boundary(cut) {
                    cut -= 1;
                }
                s.error.truncate(cut);
            }
        }
        if self.store_sent.as_ref() == Some(&health) {
            return;
        }
        self.store_sent = Some(health.clone());
        self.transmit.push_back(TwinMsg::Store(health));
    }

    pub fn state(&self) -> TwinState {
        self.state
    }

    /// The durable head this connection knows.
    pub fn durable(&self) -> u64 {
        self.durable
    }

    /// The primary's head as last heard, and its clock then.
    pub fn primary_head(&self) -> (u64, u64) {
        (self.primary_head, self.primary_unix_ms)
    }

    /// Frames the primary holds that are not durable here.
    pub fn lag_frames(&self) -> u64 {
        self.primary_head.saturating_sub(self.durable)
    }

    fn refuse(&mut self, why: Refusal) -> Refusal {
        if self.state != TwinState::Closed {
            tracing::warn!(%why, "refusing the primary");
            self.transmit.push_back(TwinMsg::Refuse(why.clone()));
            self.state = TwinState::Closed;
            self.actions.push_back(TwinAction::Close(why.clone()));
        }
        why
    }

    /// A control message from the primary.
    pub fn handle_message(&mut self, msg: PrimaryMsg, now: Now) {
        self.heard = now;
        if self.state == TwinState::Closed {
            return;
        }
        match msg {
            PrimaryMsg::Epochs(_) => {
                self.refuse(Refusal::Protocol(
                    "Epochs, which no twin asks of its primary".into(),
                ));
            }
            PrimaryMsg::Welcome {
                version,
                history,
                from,
                head,
                first: _,
                epochs,
            } => {
                if self.state != TwinState::AwaitingWelcome {
                    self.refuse(Refusal::Protocol("a second Welcome".into()));
                    return;
                }
                if version != PROTOCOL_VERSION {
                    self.refuse(Refusal::Version {
                        ours: PROTOCOL_VERSION,
                        theirs: version,
                    });
                    return;
                }
                let epoch = epochs.current();
                if epoch < self.epochs.current() {
                    self.refuse(Refusal::StaleEpoch {
                        primary: epoch,
                        twin: self.epochs.current(),
                    });
                    return;
                }
                if history != self.history {
                    if self.durable != 0 {
                        self.refuse(Refusal::History {
                            primary: history,
                            twin: self.history,
                        });
                        return;
                    }
                    self.history = history;
                    self.actions.push_back(TwinAction::AdoptHistory(history));
                }
                if head < self.durable {
                    self.refuse(Refusal::TwinAhead {
                        twin_head: self.durable,
                        primary_head: head,
                    });
                    return;
                }
                if from != self.durable + 1 {
                    self.refuse(Refusal::Protocol(format!(
                        "frames offered from {from}, this log's head is {}",
                        self.durable
                    )));
                    return;
                }
                // The primary checked the fork point; a twin checks too,
                // and never takes frames over ones the primary never had.
                let fork = fork_point(&epochs, u64::MAX, &self.epochs, self.durable);
                if fork < self.durable && self.durable > 0 {
                    self.refuse(Refusal::Forked {
                        at: fork,
                        twin_head: self.durable,
                        crc: None,
                        epoch,
                    });
                    return;
                }
                if epochs != self.epochs {
                    self.epochs = epochs.clone();
                    self.actions.push_back(TwinAction::AdoptEpochs(epochs));
                }
                self.primary_head = head;
                self.state = TwinState::Streaming;
            }
            PrimaryMsg::BelowFloor { first, head } => {
                if self.state != TwinState::AwaitingWelcome {
                    self.refuse(Refusal::Protocol("BelowFloor after the handshake".into()));
                    return;
                }
                self.primary_head = head;
                self.state = TwinState::BelowFloor;
                self.actions.push_back(TwinAction::BelowFloor {
                    first,
                    primary_head: head,
                });
            }
            PrimaryMsg::Heartbeat { head, unix_ms } => {
                self.primary_head = self.primary_head.max(head);
                self.primary_unix_ms = unix_ms;
                if self.state == TwinState::Streaming {
                    // Tells the primary this side is alive, and repeats the
                    // durable head in case an ack went missing.
                    self.transmit.push_back(TwinMsg::Ack {
                        durable: self.durable,
                    });
                }
            }
            PrimaryMsg::Refuse(why) => {
                tracing::warn!(%why, "the primary refused");
                if let Refusal::LostOnPrimary {
                    after,
                    crc,
                    ref epochs,
                    ..
                } = why
                {
                    // Cut only what the rule, checked here too, says the
                    // primary lost: a primary cannot talk a twin out of
                    // frames it acknowledged.
                    let fork = fork_point(epochs, u64::MAX, &self.epochs, self.durable);
                    if self.state == TwinState::AwaitingWelcome
                        && after < self.durable
                        && fork == after
                        && lost_on_primary(epochs, &self.epochs, after, self.durable)
                    {
                        self.actions.push_back(TwinAction::CutAfter { after, crc });
                    } else if self.state == TwinState::AwaitingWelcome {
                        tracing::error!(
                            after,
                            fork,
                            "the primary says it lost frames its own history does not show lost: nothing is cut"
                        );
                    }
                }
                self.state = TwinState::Closed;
                self.actions.push_back(TwinAction::Close(why));
            }
            PrimaryMsg::Verify {
                id,
                from,
                through,
                step,
                mib_per_s,
            } => {
                let ranges = (through.saturating_sub(from) + 1).div_ceil(step.max(1));
                let why = if self.state != TwinState::Streaming {
                    Some("a verify before streaming".to_string())
                } else if from == 0 || through < from || step == 0 {
                    Some(format!("a verify of {from}..={through} by {step}"))
                } else if ranges > super::verify::MAX_DIGESTS {
                    Some(format!("a verify of {ranges} ranges"))
                } else if through > self.durable {
                    Some(format!(
                        "frames to {through} asked, this twin holds {} durably",
                        self.durable
                    ))
                } else {
                    None
                };
                match why {
                    Some(why) => self.transmit.push_back(TwinMsg::Digests {
                        id,
                        digests: Vec::new(),
                        error: Some(why),
                    }),
                    None => self.actions.push_back(TwinAction::Digest {
                        id,
                        ask: super::verify::Ask {
                            from,
                            through,
                            step,
                        },
                        mib_per_s,
                    }),
                }
            }
            PrimaryMsg::Handover { head, clients } => {
                // A second one would promote the box again, to another
                // epoch than the one it answers `Promoted` with.
                if self.handed_over {
                    self.refuse(Refusal::Protocol("a second Handover".into()));
                    return;
                }
                // Only a twin holding every frame through the primary's
                // head, durably and nothing past it, may take over: then
                // no acknowledged frame is left behind.
                if self.state != TwinState::Streaming
                    || self.durable != head
                    || self.committed != head
                    || !self.decoder.at_boundary()
                {
                    self.refuse(Refusal::Protocol(format!(
                        "a handover at {head}, this twin holds {} durably",
                        self.durable
                    )));
                    return;
                }
                self.handed_over = true;
                self.actions
                    .push_back(TwinAction::Promote { head, clients });
            }
        }
    }

    /// The box was promoted to `epoch` after a `Handover`: tell the old
    /// primary, which fences itself, and end this connection.
    pub fn promoted(&mut self, epochs: EpochHistory, listen: String) {
        if self.state == TwinState::Streaming {
            self.transmit
                .push_back(TwinMsg::Promoted { epochs, listen });
            self.state = TwinState::Closed;
        }
    }

    /// The digests of a verify `id`, or why there are none (told to the
    /// primary in words: the wire carries the reason as text).
    pub fn digests<E: std::error::Error>(
        &mut self,
        id: u64,
        digests: Result<Vec<super::verify::Digest>, E>,
    ) {
        if self.state != TwinState::Streaming {
            return;
        }
        let (digests, error) = match digests {
            Ok(d) => (d, None),
            Err(e) => (Vec::new(), Some(e.to_string())),
        };
        self.transmit
            .push_back(TwinMsg::Digests { id, digests, error });
    }

    /// The box could not be promoted after a `Handover` (nothing changed
    /// here): tell the old primary, which takes writes again.
    pub fn handover_refused(&mut self, why: String) {
        if self.state == TwinState::Streaming && self.handed_over {
            self.handed_over = false;
            self.transmit.push_back(TwinMsg::HandoverRefused(why));
        }
    }

    /// Bytes of the frame stream. Answers how many were taken and the event
    /// they completed (a `Piece` is the bytes taken; a frame's meta is
    /// [`TwinCore::meta`]); call again with the rest until nothing is taken
    /// and nothing given. A header that does not decode, a frame out of
    /// sequence, or data before the handshake is refused by name.
    pub fn handle_frame_data(
        &mut self,
        input: &[u8],
    ) -> Result<(usize, Option<FrameEvent>), Refusal> {
        if self.state != TwinState::Streaming {
            return Err(self.refuse(Refusal::Protocol("frame data outside streaming".into())));
        }
        let (n, ev) = match self.decoder.decode(input) {
            Ok(x) => x,
            Err(e) => return Err(self.refuse(Refusal::BadFrame(e.0))),
        };
        match ev {
            Some(FrameEvent::Begin(h) | FrameEvent::Erased(h)) if h.seq != self.next => Err(self
                .refuse(Refusal::Gap {
                    expected: self.next,
                    got: h.seq,
                })),
            Some(FrameEvent::End(h) | FrameEvent::Erased(h)) => {
                self.next = h.seq + 1;
                // The primary holds at least what it ships.
                self.primary_head = self.primary_head.max(h.seq);
                Ok((n, ev))
            }
            _ => Ok((n, ev)),
        }
    }

    /// The meta of the frame last begun on the stream.
    pub fn meta(&self) -> &[u8] {
        self.decoder.meta()
    }

    /// Every frame through `seq` is committed in the log (not yet synced):
    /// a writer may report a run of frames once, by its last.
    pub fn handle_committed(&mut self, seq: u64) {
        debug_assert!(
            seq > self.committed,
            "committed {seq} after {}",
            self.committed
        );
        self.committed = self.committed.max(seq);
    }

    /// Writing, committing or syncing a frame failed. Nothing of it is
    /// visible; the connection ends with the refusal that names why: the
    /// bytes that arrived are not the frame (a crc, a length, a kind), or
    /// the frame is not the next one, or the twin's own disk failed.
    pub fn handle_commit_failed(&mut self, e: &LogError) {
        self.refuse(match e {
            LogError::Gap { expected, got } => Refusal::Gap {
                expected: *expected,
                got: *got,
            },
            LogError::TooLarge { what, len, max } => Refusal::TooLarge {
                what: (*what).into(),
                len: *len,
                max: *max,
            },
            LogError::Corrupt(_)
            | LogError::BlobLength { .. }
            | LogError::InvalidKind(_)
            | LogError::BadMeta(_) => Refusal::BadFrame(e.to_string()),
            _ => Refusal::WriteFailed(e.to_string()),
        });
    }

    /// Whether frames are committed that no sync has covered yet.
    pub fn needs_sync(&self) -> bool {
        self.committed > self.durable
    }

    /// The log was synced and its head is `head`: acknowledge it.
    pub fn handle_synced(&mut self, head: u64) {
        if head > self.durable {
            self.durable = head;
        }
        if self.durable > self.acked && self.state == TwinState::Streaming {
            self.acked = self.durable;
            self.transmit.push_back(TwinMsg::Ack {
                durable: self.durable,
            });
        }
    }

    /// Timers: giving up on a silent primary, and keepalives (an `Ack` of
    /// the durable head). A call before anything is due does nothing.
    pub fn handle_timeout(&mut self, now: Now) {
        if self.state == TwinState::Closed {
            return;
        }
        if now.at.duration_since(self.heard.at) >= self.timers.idle_timeout {
            self.refuse(Refusal::Timeout);
            return;
        }
        if now.at >= self.next_beat() {
            if self.state == TwinState::Streaming {
                self.transmit.push_back(TwinMsg::Ack {
                    durable: self.durable,
                });
            }
            self.last_beat = now.at;
        }
    }

    /// The next keepalive: a heartbeat after the last, or, once the primary
    /// has been silent a fifth of a heartbeat, a fifth of one after the
    /// last. A primary that restarted on its address answers the first
    /// packet after its start with a stateless reset, which ends this
    /// connection at once; the transport's keep-alive stops once the peer
    /// is silent, so these are the packets that find the new process.
    fn next_beat(&self) -> std::time::Instant {
        let probe = self.timers.heartbeat / 5;
        let regular = self.last_beat + self.timers.heartbeat;
        regular.min((self.last_beat + probe).max(self.heard.at + probe))
    }

    /// When [`TwinCore::handle_timeout`] is next due.
    pub fn poll_timeout(&self) -> Option<std::time::Instant> {
        (self.state != TwinState::Closed).then(|| {
            self.next_beat()
                .min(self.heard.at + self.timers.idle_timeout)
        })
    }

    pub fn poll_transmit(&mut self) -> Option<TwinMsg> {
        self.transmit.pop_front()
    }

    pub fn poll_action(&mut self) -> Option<TwinAction> {
        self.actions.pop_front()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn streaming_twin() -> TwinCore {
        let now = Now {
            at: crate::clock::monotonic(),
            unix_ms: 0,
        };
        let view = TwinView {
            history: [1; 16],
            head: Position { seq: 3, crc: 9 },
            first: 1,
            epochs: EpochHistory::default(),
        };
        let mut t = TwinCore::new(Timers::default(), view, now);
        t.handle_message(
            PrimaryMsg::Welcome {
                version: PROTOCOL_VERSION,
                history: [1; 16],
                from: 4,
                head: 3,
                first: 1,
                epochs: EpochHistory::default(),
            },
            now,
        );
        assert_eq!(t.state(), TwinState::Streaming);
        while t.poll_transmit().is_some() {}
        t
    }

    #[test]
    fn a_handover_arriving_twice_promotes_once_and_the_second_is_refused() {
        let mut t = streaming_twin();
        let now = t.heard;
        let handover = PrimaryMsg::Handover {
            head: 3,
            clients: Vec::new(),
        };
        // Both arrive before the driver looks at the actions, as a driver
        // taking a batch of messages sees them.
        t.handle_message(handover.clone(), now);
        t.handle_message(handover, now);
        let actions: Vec<TwinAction> = std::iter::from_fn(|| t.poll_action()).collect();
        let promotes = actions
            .iter()
            .filter(|a| matches!(a, TwinAction::Promote { head: 3, .. }))
            .count();
        assert_eq!(promotes, 1, "{actions:?}");
        assert!(
            matches!(actions.last(), Some(TwinAction::Close(Refusal::Protocol(why))) if why.contains("second Handover")),
            "{actions:?}"
        );
    }
    /// What the twin tells the primary when a frame does not commit.
    fn refusal_for(e: LogError) -> Option<TwinMsg> {
        let mut t = streaming_twin();
        t.handle_commit_failed(&e);
        std::iter::from_fn(|| t.poll_transmit()).last()
    }

    #[test]
    fn a_frame_that_does_not_commit_is_refused_by_its_cause() {
        assert_eq!(
            refusal_for(LogError::Io(std::io::Error::from_raw_os_error(
                libc::ENOSPC
            ))),
            Some(TwinMsg::Refuse(Refusal::WriteFailed(
                LogError::Io(std::io::Error::from_raw_os_error(libc::ENOSPC)).to_string()
            )))
        );
        assert!(matches!(
            refusal_for(LogError::Poisoned("fsync failed".into())),
            Some(TwinMsg::Refuse(Refusal::WriteFailed(_)))
        ));
        assert_eq!(
            refusal_for(LogError::Gap {
                expected: 4,
                got: 6
            }),
            Some(TwinMsg::Refuse(Refusal::Gap {
                expected: 4,
                got: 6
            }))
        );
        assert!(matches!(
            refusal_for(LogError::Corrupt("payload crc".into())),
            Some(TwinMsg::Refuse(Refusal::BadFrame(_)))
        ));
    }
}
