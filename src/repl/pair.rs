//! `ReplPair`: a primary and a twin, each a real [`Log`] on its own
//! simulated disk, their cores joined by an in-memory link with simulated
//! time. A test appends, steps time, and breaks things: it drops, delays
//! and duplicates control messages, damages frame bytes on the wire, cuts
//! the link and restarts either side with a power cut. The pair checks the
//! properties replication promises as it goes:
//!
//! - the twin's log is always a prefix of the primary's;
//! - no acknowledgement exceeds what the twin holds durably, and every
//!   acknowledged frame survives the twin's power cut;
//! - once the faults stop, the twin converges.
//!
//! It plays the drivers' part in the simplest way that keeps the cores
//! honest (a frame's blob is gathered before it is committed, where the
//! network driver streams it into a `Pending`).

use std::sync::Arc;
use std::time::Duration;

use super::link::{self, Link, LinkEvent};
use super::primary::{PrimaryAction, Timers};
use super::twin::TwinAction;
use super::{Backoff, Now};
use crate::log::{CrashMode, Kind, Log, OpenOptions, SimStorage};

/// How the pair is set up.
#[derive(Clone, Copy, Debug)]
pub struct PairConfig {
    pub segment_bytes: u64,
    pub timers: Timers,
    /// The largest chunk of frame-stream bytes the link carries at once.
    pub chunk: usize,
    /// One-way delay of the link.
    pub delay: Duration,
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

    /// The highest sequence ever acknowledged to the primary.
    pub fn max_acked(&self) -> u64 {
        self.max_acked
    }

    /// Connections made so far.
    pub fn connections(&self) -> u64 {
        self.connections
    }

    /// Whether the link carries a streaming connection.
    pub fn streaming(&self) -> bool {
        self.link.as_ref().is_some_and(Link::streaming)
    }

    /// Append a frame on the primary (durable there when this returns).
    pub fn append(&mut self, kind: Kind, repo: &str, blob: &[u8]) -> u64 {
        let meta = crate::log::Meta::repo(repo);
        let seq = self
            .primary
            .append(kind, &meta, blob)
            .unwrap_or_else(|e| panic!("primary append: {e}"));
        if let Some(link) = self.link.as_mut() {
            link.appended(seq, blob.len() as u64 + 32, self.now);
        }
        self.pump();
        seq
    }

    /// Erase a repository's frames on the primary, in place.
    pub fn erase_on_primary(&mut self, before: u64, repo: &str) {
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
                let head = self.primary.head_seq();
                self.primary_disk.crash(CrashMode::LoseUnsynced);
                self.primary = open(&self.primary_disk, &self.cfg);
                assert_eq!(
                    self.primary.head_seq(),
                    head,
                    "the primary lost appended frames"
                );
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
            if self.twin.head_seq() == head && acked == head && self.streaming() {
                self.check_prefix();
                return true;
            }
            self.advance(1);
        }
        false
    }

    /// The twin's retained frames are the primary's, byte for byte.
    pub fn check_prefix(&self) {
        let (first, head) = (self.twin.first_seq(), self.twin.head_seq());
        assert!(
            head <= self.primary.head_seq(),
            "the twin's head {head} is past the primary's {}",
            self.primary.head_seq()
        );
        for seq in first..=head {
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
        // The pair keeps one epoch: both logs are of epoch 0 throughout.
        let twin = link::twin_view(&self.twin, 0, Default::default());
        let primary = link::primary_view(&self.primary, Default::default());
        self.link = Some(Link::connect(self.cfg, primary, twin, self.now));
    }

    /// Deliver what is due, run the timers, carry out every action.
    fn pump(&mut self) {
        if self.reconnect_at.is_some_and(|at| at <= self.now.at) {
            self.connect();
        }
        let Some(link) = self.link.as_mut() else {
            return;
        };
        for event in link.pump(&self.primary, &self.twin, self.now) {
            match event {
                LinkEvent::Primary(PrimaryAction::Acked(durable)) => {
                    assert!(
                        durable <= self.twin.head_seq(),
                        "acknowledged {durable}, the twin holds {} durably",
                        self.twin.head_seq()
                    );
                    self.max_acked = self.max_acked.max(durable);
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
                // The pair keeps no store and one epoch; the link ships
                // frames and adopts the history itself.
                LinkEvent::Primary(_) | LinkEvent::Twin(_) => {}
            }
        }
    }
}
