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

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use super::msg::{Position, PrimaryMsg, TwinMsg};
use super::primary::{PrimaryAction, PrimaryCore, PrimaryState, PrimaryView, Timers};
use super::twin::{TwinAction, TwinCore, TwinState, TwinView};
use super::wire::{frame_prefix, FrameEvent};
use super::{Backoff, Now};
use crate::log::format::FrameHeader;
use crate::log::{CrashMode, Error, HistoryId, Kind, Log, OpenOptions, SimStorage};

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

struct Frame {
    header: FrameHeader,
    meta: Vec<u8>,
    blob: Vec<u8>,
}

/// The pair; see the module documentation.
pub struct ReplPair {
    cfg: PairConfig,
    now: Now,
    primary_disk: SimStorage,
    twin_disk: SimStorage,
    primary: Log,
    twin: Log,
    primary_core: Option<PrimaryCore>,
    twin_core: Option<TwinCore>,
    /// A frame arriving on the stream, gathered before it is committed.
    arriving: Option<Frame>,
    to_primary: VecDeque<(std::time::Instant, TwinMsg)>,
    to_twin: VecDeque<(std::time::Instant, PrimaryMsg)>,
    data: VecDeque<(std::time::Instant, Vec<u8>)>,
    reconnect_at: Option<std::time::Instant>,
    backoff: Backoff,
    /// The highest sequence the primary was told is durable on the twin.
    max_acked: u64,
    /// Refusals and closes seen, for tests that expect one.
    pub closes: Vec<String>,
    connections: u64,
}

fn open(disk: &SimStorage, cfg: &PairConfig) -> Log {
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

fn same_frame(a: &crate::log::Entry, b: &crate::log::Entry) -> bool {
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
            primary_core: None,
            twin_core: None,
            arriving: None,
            to_primary: VecDeque::new(),
            to_twin: VecDeque::new(),
            data: VecDeque::new(),
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
        self.primary_core
            .as_ref()
            .is_some_and(|c| c.state() == PrimaryState::Streaming)
            && self
                .twin_core
                .as_ref()
                .is_some_and(|c| c.state() == TwinState::Streaming)
    }

    /// Append a frame on the primary (durable there when this returns).
    pub fn append(&mut self, kind: Kind, repo: &str, blob: &[u8]) -> u64 {
        let meta = crate::log::Meta::repo(repo);
        let seq = self
            .primary
            .append(kind, &meta, blob)
            .unwrap_or_else(|e| panic!("primary append: {e}"));
        if let Some(core) = self.primary_core.as_mut() {
            core.handle_appended(seq, blob.len() as u64 + 32, self.now);
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
            let acked = self.primary_core.as_ref().map_or(0, PrimaryCore::acked);
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
        if self.primary_core.is_none() && self.twin_core.is_none() {
            return;
        }
        self.closes.push(why.to_string());
        self.primary_core = None;
        self.twin_core = None;
        self.arriving = None;
        self.to_primary.clear();
        self.to_twin.clear();
        self.data.clear();
        // Frames committed and crc-checked stay: sync them so the next Hello
        // reports them.
        if let Err(e) = self.twin.sync() {
            panic!("twin sync at disconnect: {e}");
        }
        self.reconnect_at = Some(self.now.at + self.backoff.next_delay());
    }

    fn position(log: &Log, seq: u64) -> Position {
        if seq == 0 {
            return Position::default();
        }
        let crc = log
            .locate_blob(seq)
            .unwrap_or_else(|e| panic!("position of {seq}: {e}"))
            .payload_crc;
        Position { seq, crc }
    }

    fn connect(&mut self) {
        self.reconnect_at = None;
        self.connections += 1;
        let t = &self.twin;
        let view = TwinView {
            history: t.history().0,
            head: Self::position(t, t.head_seq()),
            first: t.first_seq(),
            epoch: 0,
            epochs: Default::default(),
        };
        self.twin_core = Some(TwinCore::new(self.cfg.timers, view, self.now));
        let p = &self.primary;
        let view = PrimaryView {
            history: p.history().0,
            head: p.head_seq(),
            first: p.first_seq(),
            epochs: Default::default(),
        };
        self.primary_core = Some(PrimaryCore::new(self.cfg.timers, view, self.now));
    }

    /// Deliver what is due, run the timers, carry out every action.
    fn pump(&mut self) {
        if self.reconnect_at.is_some_and(|at| at <= self.now.at) {
            self.connect();
        }
        let now = self.now;
        while self.to_primary.front().is_some_and(|m| m.0 <= now.at) {
            let Some((_, msg)) = self.to_primary.pop_front() else {
                break;
            };
            let Some(core) = self.primary_core.as_mut() else {
                break;
            };
            if core.state() == PrimaryState::AwaitingHello {
                let log = &self.primary;
                let frame_at = |seq| {
                    log.locate_blob(seq).ok().map(|l| super::HeadFrame {
                        crc: l.payload_crc,
                        erased: l.is_erased(),
                    })
                };
                core.handle_hello(msg, frame_at, now);
            } else {
                core.handle_message(msg, now);
            }
        }
        while self.to_twin.front().is_some_and(|m| m.0 <= now.at) {
            let Some((_, msg)) = self.to_twin.pop_front() else {
                break;
            };
            let Some(core) = self.twin_core.as_mut() else {
                break;
            };
            core.handle_message(msg, now);
        }
        self.twin_actions();
        self.receive_frames();
        if let Some(core) = self.primary_core.as_mut() {
            core.handle_timeout(now);
        }
        if let Some(core) = self.twin_core.as_mut() {
            core.handle_timeout(now);
        }
        self.primary_actions();
        self.twin_actions();
        self.transmit();
    }

    fn transmit(&mut self) {
        let at = self.now.at + self.cfg.delay;
        if let Some(core) = self.primary_core.as_mut() {
            while let Some(m) = core.poll_transmit() {
                self.to_twin.push_back((at, m));
            }
        }
        if let Some(core) = self.twin_core.as_mut() {
            while let Some(m) = core.poll_transmit() {
                self.to_primary.push_back((at, m));
            }
        }
    }

    fn primary_actions(&mut self) {
        while let Some(action) = self
            .primary_core
            .as_mut()
            .and_then(PrimaryCore::poll_action)
        {
            match action {
                PrimaryAction::Ship { from, through } => {
                    for seq in from..=through {
                        self.ship(seq);
                    }
                }
                PrimaryAction::Acked(durable) => {
                    assert!(
                        durable <= self.twin.head_seq(),
                        "acknowledged {durable}, the twin holds {} durably",
                        self.twin.head_seq()
                    );
                    self.max_acked = self.max_acked.max(durable);
                }
                PrimaryAction::BelowFloor { twin_head, first } => {
                    self.closes
                        .push(format!("below floor: twin {twin_head}, first {first}"));
                }
                // The pair keeps no store, and one epoch.
                PrimaryAction::TwinStore(_)
                | PrimaryAction::Fence { .. }
                | PrimaryAction::TwinPromoted { .. } => {}
                PrimaryAction::Close(why) => {
                    // Let the refusal reach the twin before the link goes.
                    self.transmit();
                    self.disconnect(&format!("primary: {why}"));
                }
            }
        }
    }

    fn twin_actions(&mut self) {
        while let Some(action) = self.twin_core.as_mut().and_then(TwinCore::poll_action) {
            match action {
                TwinAction::AdoptHistory(h) => {
                    self.twin
                        .adopt_history(HistoryId(h))
                        .unwrap_or_else(|e| panic!("adopt history: {e}"));
                }
                TwinAction::AdoptEpochs(_) | TwinAction::Promote { .. } => {}
                TwinAction::BelowFloor {
                    first,
                    primary_head,
                } => {
                    self.closes.push(format!(
                        "twin below floor: first {first}, head {primary_head}"
                    ));
                }
                TwinAction::Close(why) => {
                    self.transmit();
                    self.disconnect(&format!("twin: {why}"));
                }
            }
        }
    }

    /// Put frame `seq` on the stream as its stored bytes, in chunks.
    fn ship(&mut self, seq: u64) {
        let mut bytes = Vec::new();
        let shipped = self.primary.read_pieces(seq, 1 << 16, |loc, piece, _last| {
            if bytes.is_empty() {
                let header = loc.header();
                bytes.extend_from_slice(&frame_prefix(&header, &loc.meta));
            }
            bytes.extend_from_slice(piece);
            Ok::<(), Error>(())
        });
        shipped.unwrap_or_else(|e| panic!("ship {seq}: {e}"));
        let at = self.now.at + self.cfg.delay;
        for chunk in bytes.chunks(self.cfg.chunk.max(1)) {
            self.data.push_back((at, chunk.to_vec()));
        }
    }

    fn receive_frames(&mut self) {
        let now = self.now.at;
        loop {
            let streaming = self
                .twin_core
                .as_ref()
                .is_some_and(|c| c.state() == TwinState::Streaming);
            if !streaming || self.data.front().is_none_or(|d| d.0 > now) {
                break;
            }
            let Some((_, chunk)) = self.data.pop_front() else {
                break;
            };
            let mut pos = 0;
            while let Some(core) = self.twin_core.as_mut() {
                let (n, ev) = match core.handle_frame_data(&chunk[pos..]) {
                    Ok(x) => x,
                    Err(_) => break,
                };
                let piece = &chunk[pos..pos + n];
                pos += n;
                match ev {
                    None if n == 0 => break,
                    None => {}
                    Some(FrameEvent::Begin(header)) => {
                        self.arriving = Some(Frame {
                            header,
                            meta: core.meta().to_vec(),
                            blob: Vec::new(),
                        });
                    }
                    Some(FrameEvent::Piece) => {
                        if let Some(f) = self.arriving.as_mut() {
                            f.blob.extend_from_slice(piece);
                        }
                    }
                    Some(FrameEvent::End(header)) => {
                        let frame = self.arriving.take();
                        self.commit(header, frame);
                    }
                    Some(FrameEvent::Erased(h)) => {
                        let meta = core.meta().to_vec();
                        match self
                            .twin
                            .stage_erased_at(h.seq, &meta, h.blob_len, h.payload_crc)
                        {
                            Ok(seq) => core.handle_committed(seq),
                            Err(e) => core.handle_commit_failed(e.to_string()),
                        }
                    }
                }
            }
            self.twin_actions();
        }
        // The input at hand is drained: one sync for the batch, one ack.
        if let Some(core) = self.twin_core.as_mut() {
            if core.needs_sync() {
                let head = self
                    .twin
                    .sync()
                    .unwrap_or_else(|e| panic!("twin sync: {e}"));
                core.handle_synced(head);
            }
        }
    }

    fn commit(&mut self, header: FrameHeader, frame: Option<Frame>) {
        let Some(core) = self.twin_core.as_mut() else {
            return;
        };
        let Some(frame) = frame else {
            return core.handle_commit_failed("a frame ended that never began".into());
        };
        let committed = (|| {
            let mut p =
                self.twin
                    .begin(Some(header.seq), header.kind, &frame.meta, header.blob_len)?;
            p.write(&frame.blob)?;
            p.expect_payload_crc(frame.header.payload_crc);
            p.commit_unsynced()
        })();
        match committed {
            Ok(seq) => core.handle_committed(seq),
            Err(e) => core.handle_commit_failed(e.to_string()),
        }
    }
}
