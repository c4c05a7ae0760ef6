//! The twin: follows a primary, writing its frames at the primary's
//! numbers. The decisions are [`TwinCore`](crate::repl::TwinCore)'s; a dedicated writer thread
//! owns the log's streaming appends and makes one sync per batch (whatever
//! arrived while the previous sync ran); this moves bytes between them.
//!
//! Owns the twin's session with its primary, its writer thread and its
//! retention. May not touch: the rules of following (the [`TwinCore`](crate::repl::TwinCore)),
//! the primary's side, or the failover files (those are
//! [`super::failover`]'s; it calls them).

mod ended;
mod repair;
pub mod retention;
mod session;
mod writer;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;

use crate::log::Log;
use crate::net::{self};
use crate::node::epoch::Epochs;
use crate::node::store_host::StoreHost;
use crate::repl::{Backoff, Position, Refusal, Timers, TwinView};
use crate::store::install::{self, InstallPaths, SnapshotBase};

/// What the twin's status shows.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TwinStatus {
    pub head: u64,
    pub first: u64,
    pub connected: bool,
    pub primary_head: u64,
    pub lag_frames: u64,
    pub below_floor: bool,
    pub last_error: Option<String>,
    /// The refusal, by name, that ended the last session (either side's),
    /// until a session streams again.
    pub refusal: Option<Refusal>,
    /// A snapshot being fetched: bytes held and its size.
    pub snapshot_held: u64,
    pub snapshot_total: u64,
    /// Snapshots installed since start, and the seq of the last.
    pub snapshots_installed: u64,
    pub snapshot_at: u64,
    /// This box's store: how far it applied, where it stopped.
    pub store: crate::repl::StoreHealth,
    /// What poisoned the log, once a failed write or fsync did.
    pub log_poisoned: Option<String>,
    /// `twin`.
    pub role: String,
    /// The newest primary epoch this box followed.
    pub epoch: u64,
    /// The twinlog version serving.
    pub build: String,
    /// The twin's retention: its limits, the log's bytes, what it dropped.
    #[serde(default)]
    pub retention: retention::TwinRetentionStatus,
    /// Bytes received from primaries since start, as QUIC counted them on
    /// the wire (UDP payloads: frames, snapshots, control messages and
    /// their framing): what following cost the network, which is how a
    /// rejoin is seen to move only the frames past the fork.
    #[serde(default)]
    pub received_bytes: u64,
    /// Frame-stream bytes received since start: each frame's header, meta
    /// and blob as the primary shipped them.
    #[serde(default)]
    pub frame_bytes_received: u64,
    /// Under automatic failover: the arbiter's leader, and why this twin
    /// may not take over when it has none.
    #[serde(default)]
    pub arbiter: Option<crate::node::arbiter::take_over::TakeOverShown>,
    /// The last failover this box went through as the new primary (before
    /// it was deposed and followed another).
    #[serde(default)]
    pub last_failover: Option<crate::node::failover::last::LastFailover>,
    /// With `[archive]` on: its floor, its lag and its last upload.
    #[serde(default)]
    pub archive: Option<crate::archive::archiver::ArchiveStatus>,
}

/// Where a twin stages and installs the snapshots it fetches.
pub struct TwinSnapshots {
    pub paths: InstallPaths,
    pub store: Arc<StoreHost>,
}

/// How the twin runs.
#[derive(Clone, Copy, Debug)]
pub struct TwinOptions {
    pub timers: Timers,
    pub backoff_base: Duration,
    pub backoff_cap: Duration,
}

impl Default for TwinOptions {
    fn default() -> Self {
        TwinOptions {
            timers: Timers::default(),
            backoff_base: Duration::from_millis(100),
            backoff_cap: Duration::from_secs(5),
        }
    }
}

/// The twin daemon's state.
pub struct Twin {
    log: Arc<Log>,
    epochs: Arc<Epochs>,
    primary: SocketAddr,
    cfg: TwinOptions,
    status: Mutex<TwinStatus>,
    durable: watch::Sender<u64>,
    snapshots: Mutex<Option<Arc<TwinSnapshots>>>,
    /// The store the log feeds here, whose health is reported to the
    /// primary.
    store: Mutex<Option<Arc<StoreHost>>>,
    /// The position the log restarted after, when it holds no frame there.
    base: Mutex<Option<SnapshotBase>>,
    /// This box's certificate fingerprint, to name when the primary
    /// refuses it.
    fingerprint: Mutex<Option<String>>,
    /// The retention that drops old segments here, once set.
    retainer: Mutex<Option<Arc<retention::TwinRetainer>>>,
    /// What a planned switchover runs to make this box a primary.
    handover: Mutex<Option<Arc<Handover>>>,
    /// Turns true once a switchover made this box a primary: the twin
    /// stops following.
    promoted: watch::Sender<bool>,
    /// Where this twin records when it last heard its primary, and when
    /// it last did.
    heard: Mutex<(Option<std::path::PathBuf>, Option<tokio::time::Instant>)>,
}

/// Make this box a primary at a switchover: given the head it holds and
/// the clients to pin, answers the new epoch and where it will serve.
pub type Handover = dyn Fn(u64, Vec<crate::repl::HandedClient>) -> Result<(u64, String), HandoverFailed>
    + Send
    + Sync;

/// Why a switchover's handover did not make this box a primary (nothing
/// changed here).
#[derive(Debug, thiserror::Error)]
pub enum HandoverFailed {
    /// No [`Handover`] was set on this twin.
    #[error("this twin cannot be promoted in place")]
    NotSet,
    /// The promotion the daemon runs failed, as it says.
    #[error(transparent)]
    Promotion(Box<dyn std::error::Error + Send + Sync>),
}

impl Twin {
    pub fn new(
        log: Arc<Log>,
        epochs: Arc<Epochs>,
        primary: SocketAddr,
        cfg: TwinOptions,
    ) -> Arc<Twin> {
        log.set_follower(true);
        let head = log.head_seq();
        Arc::new(Twin {
            log,
            epochs,
            primary,
            cfg,
            status: Mutex::new(TwinStatus::default()),
            durable: watch::channel(head).0,
            snapshots: Mutex::new(None),
            store: Mutex::new(None),
            base: Mutex::new(None),
            fingerprint: Mutex::new(None),
            retainer: Mutex::new(None),
            handover: Mutex::new(None),
            promoted: watch::channel(false).0,
            heard: Mutex::new((None, None)),
        })
    }

    /// What a planned switchover runs to make this box a primary; without
    /// one, a `Handover` is refused.
    pub fn set_handover(&self, h: Arc<Handover>) {
        *self.handover.lock().unwrap_or_else(|e| e.into_inner()) = Some(h);
    }

    /// Turns true once a switchover made this box a primary.
    pub fn watch_promoted(&self) -> watch::Receiver<bool> {
        self.promoted.subscribe()
    }

    /// The retention whose state the status shows (its pass runs on its
    /// own, see [`retention::TwinRetainer::run`]).
    pub fn set_retainer(&self, r: Arc<retention::TwinRetainer>) {
        *self.retainer.lock().unwrap_or_else(|e| e.into_inner()) = Some(r);
    }

    /// Fetch and install a snapshot when the primary says this twin is
    /// below its floor. Reads the base position a past install recorded.
    pub fn set_snapshots(&self, s: TwinSnapshots) -> Result<(), crate::store::StoreError> {
        *self.base.lock().unwrap_or_else(|e| e.into_inner()) = install::read_base(&s.paths.base())?;
        self.set_store(s.store.clone());
        // A snapshot staged from the primary before an erase this store has
        // now applied may hold erased data: it goes (the daemon's store
        // drops it as the erase applies, even at its start; this covers a
        // store opened without that).
        let paths = InstallPaths {
            data: s.paths.data.clone(),
        };
        s.store.on_erase(Arc::new(move |erase_seq| {
            if let Err(e) = install::drop_staged_before(&paths, erase_seq) {
                tracing::error!(error = %e, "dropping a staged snapshot taken before an erase");
            }
        }));
        *self.snapshots.lock().unwrap_or_else(|e| e.into_inner()) = Some(Arc::new(s));
        Ok(())
    }

    /// This box's certificate fingerprint: named in the status when the
    /// primary refuses it.
    pub fn set_fingerprint(&self, fp: &crate::net::Fingerprint) {
        *self.fingerprint.lock().unwrap_or_else(|e| e.into_inner()) = Some(fp.to_string());
    }

    /// The store this twin's log feeds: its health shows in the status and
    /// is reported to the primary.
    pub fn set_store(&self, store: Arc<StoreHost>) {
        *self.store.lock().unwrap_or_else(|e| e.into_inner()) = Some(store);
    }

    fn store(&self) -> Option<Arc<StoreHost>> {
        self.store.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn snapshots(&self) -> Option<Arc<TwinSnapshots>> {
        self.snapshots
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    pub fn log(&self) -> &Arc<Log> {
        &self.log
    }

    /// Whether this twin's log shares `other`'s history.
    pub fn history_matches(&self, other: &Log) -> bool {
        self.log.history() == other.history()
    }

    /// The durable head, as it moves.
    pub fn durable(&self) -> watch::Receiver<u64> {
        self.durable.subscribe()
    }

    pub fn status(&self) -> TwinStatus {
        let mut s = self
            .status
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        s.head = self.log.head_seq();
        s.first = self.log.first_seq();
        s.log_poisoned = self.log.poisoned_by();
        s.role = "twin".into();
        s.epoch = self.epochs.current();
        s.build = env!("CARGO_PKG_VERSION").into();
        if let Some(store) = self.store() {
            s.store = store.health();
        }
        let retainer = self
            .retainer
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        s.archive = retainer.as_ref().and_then(|r| r.archive_status());
        s.retention = match retainer {
            Some(r) => r.status(),
            None => retention::TwinRetentionStatus {
                log_bytes: self.log.bytes(),
                ..Default::default()
            },
        };
        s
    }

    fn set_status(&self, f: impl FnOnce(&mut TwinStatus)) {
        f(&mut self.status.lock().unwrap_or_else(|e| e.into_inner()));
    }

    /// Follow the primary until `shutdown` turns true, reconnecting with a
    /// capped backoff and resuming from the durable head each time. A
    /// connection that streamed a while, or that a restarted primary reset,
    /// is redialed at once ([`Backoff::after_session`]). The keepalives
    /// that find a restarted primary are [`TwinCore`](crate::repl::TwinCore)'s.
    pub async fn run(
        self: Arc<Self>,
        endpoint: quinn::Endpoint,
        mut shutdown: watch::Receiver<bool>,
    ) {
        let mut backoff = Backoff::new(self.cfg.backoff_base, self.cfg.backoff_cap);
        loop {
            if *shutdown.borrow() {
                break;
            }
            let mut end = session::SessionEnd::default();
            let ended = self
                .session(&endpoint, &mut backoff, &mut shutdown, &mut end)
                .await;
            if *self.promoted.borrow() {
                break;
            }
            let restarted = matches!(end.closed_by, Some(quinn::ConnectionError::Reset));
            let replaced = matches!(
                &end.closed_by,
                Some(quinn::ConnectionError::ApplicationClosed(c))
                    if c.error_code == quinn::VarInt::from_u32(net::CLOSE_REPLACED)
            );
            let why = match ended {
                _ if restarted => "the primary restarted: its new process reset the \
                                   connection (a stateless reset)"
                    .to_string(),
                // The primary took a newer connection of this certificate:
                // one this process did not make, since it runs one at a time.
                _ if replaced => format!(
                    "the primary replaced this connection with a newer one from this box's \
                     certificate: is a second twin running with this key? Retrying in {:?}",
                    self.cfg.backoff_cap
                ),
                Ok(why) => why.to_string(),
                Err(e) if net::refused_by_peer(&e) => {
                    let fp = self
                        .fingerprint
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .clone()
                        .unwrap_or_else(|| "(see `twin init`)".into());
                    format!(
                        "the primary refused this box's certificate: it is not pinned there. \
                         On the primary: primary pin-twin --config <primary.toml> {fp}, \
                         then restart it ({e})"
                    )
                }
                Err(e) => e.to_string(),
            };
            tracing::warn!(reason = %why, "connection to the primary ended");
            self.set_status(|s| {
                s.connected = false;
                s.last_error = Some(why);
            });
            // Two twins of one key would replace each other in turn: the
            // longest wait keeps that a slow, visible flap.
            let delay = if replaced {
                self.cfg.backoff_cap
            } else {
                backoff.after_session(end.streamed, restarted)
            };
            tokio::select! {
                _ = tokio::time::sleep(delay) => {}
                _ = shutdown.changed() => break,
            }
        }
        endpoint.close(0u32.into(), b"shutdown");
    }

    /// Record in `dir` when this twin last hears its primary
    /// (`HEARD_PRIMARY`, which `twin promote` checks).
    pub fn record_heard_in(&self, dir: std::path::PathBuf) {
        self.heard.lock().unwrap_or_else(|e| e.into_inner()).0 = Some(dir);
    }

    /// The primary was heard: recorded, at most once a second.
    fn heard_primary(&self) {
        let now = crate::node::clock::instant();
        let dir = {
            let mut h = self.heard.lock().unwrap_or_else(|e| e.into_inner());
            if h.1
                .is_some_and(|at| now < at + crate::node::predecessor::HEARD_EVERY)
            {
                return;
            }
            h.1 = Some(now);
            h.0.clone()
        };
        if let Some(dir) = dir {
            tokio::task::spawn_blocking(move || {
                if let Err(e) = crate::node::predecessor::record_heard(&dir) {
                    tracing::warn!(error = %e, "recording when the primary was last heard");
                }
            });
        }
    }

    /// What this twin holds, for its Hello. A head frame that does not
    /// read is this box's error, never a crc the primary would take for a
    /// divergence.
    fn view(&self) -> Result<TwinView, crate::store::StoreError> {
        let head = self.log.head_seq();
        let base = *self.base.lock().unwrap_or_else(|e| e.into_inner());
        // A log restarted after a snapshot holds no frame at its head: the
        // snapshot's base says what that frame was.
        let crc = install::crc_of_frame(&self.log, base.as_ref(), head)?;
        Ok(TwinView {
            history: self.log.history().0,
            head: Position { seq: head, crc },
            first: self.log.first_seq(),
            epochs: self.epochs.history(),
        })
    }
}
