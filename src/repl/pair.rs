//! `ReplPair`: a primary and a twin, each a real [`Log`] on its own
//! simulated disk, their cores joined by an in-memory link with simulated
//! time. A test appends, steps time, and breaks things: it drops, delays
//! and duplicates control messages, damages frame bytes on the wire, cuts
//! the link and restarts either side with a power cut. The pair checks the
//! properties replication promises as it goes:
//!
//! - the twin's log is always a prefix of the primary's, except for frames
//!   the primary lost in a power cut after shipping them and before its
//!   sync, which the next handshake cuts from the twin;
//! - no acknowledgement exceeds what the twin holds durably, and every
//!   acknowledged frame survives either box's power cut and is never cut;
//! - once the faults stop, the twin converges.
//!
//! The primary ships each frame from the buffer in hand as soon as it is
//! staged, and syncs it `PairConfig::primary_sync` later: a frame is
//! acknowledged once both boxes hold it durably.
//!
//! It plays the drivers' part in the simplest way that keeps the cores
//! honest (a frame's blob is gathered before it is committed, where the
//! network driver streams it into a `Pending`).

use std::sync::Arc;
use std::time::Duration;

use super::epochs::{EpochHistory, EpochState};
use super::in_hand::InHand;
use super::link::{self, Link, LinkEvent};
pub use super::link::{Fault, PairConfig};
use super::primary::PrimaryAction;
use super::twin::TwinAction;
use super::wire::frame_prefix;
use super::{Backoff, Now};
use crate::log::{CrashMode, Kind, Log, OpenOptions, SimStorage};

/// The pair; see the module documentation.
pub struct ReplPair {
    cfg: PairConfig,
    now: Now,
    primary_disk: SimStorage,
    twin_disk: SimStorage,
    primary: Log,
    twin: Log,
    /// The connection, while there is one.
    link: Option<Link>,
    reconnect_at: Option<std::time::Instant>,
    backoff: Backoff,
    /// The highest sequence the primary was told is durable on the twin.
    max_acked: u64,
    /// The highest sequence acknowledged to a client: durable on both.
    max_answered: u64,
    /// Frames staged on the primary and shipped before their sync.
    in_hand: InHand,
    /// The last frame staged on the primary, and when the sync covering
    /// the staged frames is done, while one is due.
    staged: u64,
    sync_due: Option<std::time::Instant>,
    /// The primary's epochs: each restart begins a life, kept durably.
    primary_epochs: EpochState,
    /// The twin's log's epochs, taken from the primary's at each Welcome
    /// (durably, as the daemon records them).
    twin_epochs: EpochHistory,
    /// A restart of the primary keeps its epoch (a broken primary, for
    /// tests that show the pair's checks catch the loss it leads to).
    pub same_epoch_restart: bool,
    /// The twin may hold frames past this one that the primary lost, until
    /// a handshake cuts them.
    stale_after: Option<u64>,
    /// Refusals and closes seen, for tests that expect one.
    pub closes: Vec<String>,
    connections: u64,
}

/// The log on a simulated disk, as a box opens it at start.
pub(crate) fn open(disk: &SimStorage, cfg: &PairConfig) -> Log {
    Log::open_opts(
        "/log",
        OpenOptions {
            segment_bytes: cfg.segment_bytes,
            repair: false,
            storage: Some(Arc::new(disk.clone())),
            ..OpenOptions::default()
        },
    )
    .unwrap_or_else(|e| panic!("a simulated log must open: {e}"))
}

pub(crate) fn same_frame(a: &crate::log::Entry, b: &crate::log::Entry) -> bool {
    (a.seq, a.kind, &a.meta, &a.blob, a.payload_crc)
        == (b.seq, b.kind, &b.meta, &b.blob, b.payload_crc)
}

impl ReplPair {
    /// A primary and an empty twin, about to connect.
    pub fn new(cfg: PairConfig) -> Self {
        let primary_disk = SimStorage::new();
        let twin_disk = SimStorage::new();
        let primary = open(&primary_disk, &cfg);
        let twin = open(&twin_disk, &cfg);
        twin.set_follower(true);
        let now = Now::system();
        ReplPair {
            cfg,
            now,
            primary_disk,
            twin_disk,
            primary,
            twin,
            link: None,
            reconnect_at: Some(now.at),
            backoff: Backoff::new(Duration::from_millis(5), Duration::from_millis(200)),
            max_acked: 0,
            max_answered: 0,
            in_hand: InHand::default(),
            staged: 0,
            sync_due: None,
            primary_epochs: EpochState::default(),
            twin_epochs: EpochHistory::default(),
            same_epoch_restart: false,
            stale_after: None,
            closes: Vec::new(),
            connections: 0,
        }
    }

    pub fn primary(&self) -> &Log {
        &self.primary
    }

    pub fn twin(&self) -> &Log {
        &self.twin
    }

    /// The highest sequence ever acknowledged to the primary by the twin.
    pub fn max_acked(&self) -> u64 {
        self.max_acked
    }

    /// The highest sequence ever acknowledged to a client: durable on both
    /// boxes.
    pub fn max_answered(&self) -> u64 {
        self.max_answered
    }

    /// Connections made so far.
    pub fn connections(&self) -> u64 {
        self.connections
    }

    /// Whether the link carries a streaming connection.
    pub fn streaming(&self) -> bool {
        self.link.as_ref().is_some_and(Link::streaming)
    }

    /// Stage a frame on the primary and ship it; it is durable there
    /// `primary_sync` later.
    pub fn append(&mut self, kind: Kind, repo: &str, blob: &[u8]) -> u64 {
        if self.staged - self.primary.head_seq() >= super::MAX_SHIPPED_UNSYNCED {
            // As the appender: the next group waits for the last one's sync.
            self.sync_primary();
        }
        let meta = crate::log::Meta::repo(repo)
            .encode()
            .unwrap_or_else(|e| panic!("meta: {e}"));
        let header = self
            .primary
            .stage_framed(kind.as_u16(), &meta, blob)
            .unwrap_or_else(|e| panic!("primary append: {e}"));
        let seq = header.seq;
        let mut bytes = frame_prefix(&header, &meta);
        bytes.extend_from_slice(blob);
        self.in_hand.put([(seq, bytes::Bytes::from(bytes))]);
        self.staged = seq;
        self.sync_due
            .get_or_insert(self.now.at + self.cfg.primary_sync);
        if let Some(link) = self.link.as_mut() {
            link.appended(seq, header.frame_len(), self.now);
        }
        self.pump();
        seq
    }

    /// Erase a repository's frames on the primary, in place, once they
    /// are durable there (an erase covers durable frames only).
    pub fn erase_on_primary(&mut self, before: u64, repo: &str) {
        self.sync_primary();
        self.primary
            .erase(before, &[repo.to_string()])
            .unwrap_or_else(|e| panic!("primary erase: {e}"));
    }

    /// Break something.
    pub fn inject(&mut self, fault: Fault) {
        match fault {
            Fault::DropControl
            | Fault::DuplicateControl
            | Fault::DelayControl(_)
            | Fault::CorruptData(_) => {
                if let Some(link) = self.link.as_mut() {
                    link.inject(fault);
                }
            }
            Fault::Cut => self.disconnect("cut"),
            Fault::RestartTwin(keep) => {
                self.disconnect("twin restart");
                self.twin_disk.crash(match keep {
                    Some(seed) => CrashMode::KeepPrefix(seed),
                    None => CrashMode::LoseUnsynced,
                });
                self.twin = open(&self.twin_disk, &self.cfg);
                self.twin.set_follower(true);
                assert!(
                    self.twin.head_seq() >= self.max_acked,
                    "acknowledged frame lost: twin head {} after a power cut, {} was acknowledged",
                    self.twin.head_seq(),
                    self.max_acked
                );
                self.check_prefix();
            }
            Fault::RestartPrimary => {
                self.disconnect("primary restart");
                let durable = self.primary.head_seq();
                self.primary_disk.crash(CrashMode::LoseUnsynced);
                self.primary = open(&self.primary_disk, &self.cfg);
                assert_eq!(
                    self.primary.head_seq(),
                    durable,
                    "the primary lost durable frames"
                );
                assert!(
                    durable >= self.max_answered,
                    "acknowledged frame lost: primary head {durable} after a power cut, {} was acknowledged",
                    self.max_answered
                );
                // What was staged and not synced is gone, shipped or not:
                // the twin's acks of it promise nothing now (it cuts them).
                self.max_acked = self.max_acked.min(durable);
                self.in_hand = InHand::default();
                self.sync_due = None;
                self.staged = durable;
                if !self.same_epoch_restart {
                    self.primary_epochs
                        .restart(durable)
                        .unwrap_or_else(|e| panic!("a restart's new life: {e}"));
                }
                let lowest = self.stale_after.map_or(durable, |s| s.min(durable));
                if self.twin.head_seq() > durable || self.stale_after.is_some() {
                    self.stale_after = Some(lowest);
                }
            }
        }
    }

    /// Advance the simulated time by `ms` milliseconds, one at a time,
    /// delivering and reacting as it goes.
    pub fn advance(&mut self, ms: u64) {
        for _ in 0..ms {
            self.now = self.now.after(Duration::from_millis(1));
            self.pump();
        }
    }

    /// Run without faults until the twin holds everything the primary does
    /// and has acknowledged it; false when `max_ms` pass first.
    pub fn converge(&mut self, max_ms: u64) -> bool {
        for _ in 0..max_ms {
            let head = self.primary.head_seq();
            let acked = self.link.as_ref().map_or(0, |l| l.primary.acked());
            let synced = self.staged == head;
            if synced && self.twin.head_seq() == head && acked == head && self.streaming() {
                self.check_prefix();
                return true;
            }
            self.advance(1);
        }
        false
    }

    /// The twin's retained frames are the primary's, byte for byte, up to
    /// the primary's durable head (and, until a handshake cut them, up to
    /// where the primary lost frames the twin holds).
    pub fn check_prefix(&self) {
        let (first, head) = (self.twin.first_seq(), self.twin.head_seq());
        if self.stale_after.is_none() {
            assert!(
                head <= self.staged,
                "the twin's head {head} is past the primary's staged head {}",
                self.staged
            );
        }
        let through = head
            .min(self.primary.head_seq())
            .min(self.stale_after.unwrap_or(u64::MAX));
        for seq in first..=through {
            let t = self
                .twin
                .read(seq)
                .unwrap_or_else(|e| panic!("twin read {seq}: {e}"));
            let p = self
                .primary
                .read(seq)
                .unwrap_or_else(|e| panic!("primary read {seq}: {e}"));
            assert!(
                same_frame(&t, &p),
                "frame {seq} differs: twin {t:?}, primary {p:?}"
            );
        }
    }

    fn disconnect(&mut self, why: &str) {
        if self.link.take().is_none() {
            return;
        }
        self.closes.push(why.to_string());
        // Frames committed and crc-checked stay: sync them so the next Hello
        // reports them.
        if let Err(e) = self.twin.sync() {
            panic!("twin sync at disconnect: {e}");
        }
        self.reconnect_at = Some(self.now.at + self.backoff.next_delay());
    }

    fn connect(&mut self) {
        self.reconnect_at = None;
        self.connections += 1;
        let twin = link::twin_view(&self.twin, self.twin_epochs.clone());
        // Every frame shipped before is durable before the handshake.
        self.sync_primary();
        if self.stale_after.is_some_and(|s| self.twin.head_seq() <= s) {
            // The twin lost what the primary lost, in a crash of its own.
            self.stale_after = None;
        }
        let primary = link::primary_view(&self.primary, self.primary_epochs.history.clone());
        self.link = Some(Link::connect(self.cfg, primary, twin, self.now));
    }

    /// The primary's sync of what it staged: readable from its log since.
    fn sync_primary(&mut self) {
        self.sync_due = None;
        let head = self
            .primary
            .sync()
            .unwrap_or_else(|e| panic!("primary sync: {e}"));
        self.in_hand.durable_through(head);
        self.answer();
    }

    /// Clients hear of what is durable on both boxes.
    fn answer(&mut self) {
        let both = self.primary.head_seq().min(self.max_acked);
        self.max_answered = self.max_answered.max(both);
    }

    /// Deliver what is due, run the timers, carry out every action.
    fn pump(&mut self) {
        if self.sync_due.is_some_and(|at| at <= self.now.at) {
            self.sync_primary();
        }
        if self.reconnect_at.is_some_and(|at| at <= self.now.at) {
            self.connect();
        }
        let Some(link) = self.link.as_mut() else {
            return;
        };
        let events = link.pump(&self.primary, &self.in_hand, &self.twin, self.now);
        for event in events {
            match event {
                LinkEvent::Primary(PrimaryAction::Acked(durable)) => {
                    assert!(
                        durable <= self.twin.head_seq(),
                        "acknowledged {durable}, the twin holds {} durably",
                        self.twin.head_seq()
                    );
                    self.max_acked = self.max_acked.max(durable);
                    self.answer();
                }
                LinkEvent::Twin(TwinAction::CutAfter { after, .. }) => {
                    assert!(
                        after >= self.max_answered,
                        "the twin cut after {after}, {} was acknowledged",
                        self.max_answered
                    );
                    assert!(
                        self.stale_after.is_some(),
                        "the twin cut after {after} with nothing lost on the primary"
                    );
                    self.stale_after = None;
                    self.closes.push(format!("twin cut after {after}"));
                }
                LinkEvent::Primary(PrimaryAction::BelowFloor { twin_head, first }) => {
                    self.closes
                        .push(format!("below floor: twin {twin_head}, first {first}"));
                }
                LinkEvent::Primary(PrimaryAction::Close(why)) => {
                    self.disconnect(&format!("primary: {why}"));
                }
                LinkEvent::Twin(TwinAction::BelowFloor {
                    first,
                    primary_head,
                }) => {
                    self.closes.push(format!(
                        "twin below floor: first {first}, head {primary_head}"
                    ));
                }
                LinkEvent::Twin(TwinAction::Close(why)) => {
                    self.disconnect(&format!("twin: {why}"));
                }
                LinkEvent::Twin(TwinAction::AdoptEpochs(history)) => {
                    self.twin_epochs = history;
                }
                // The pair keeps no store; the link ships frames and
                // adopts the history itself.
                LinkEvent::Primary(_) | LinkEvent::Twin(_) => {}
            }
        }
    }
}
