//! The twin: follows a primary, writing its frames at the primary's
//! numbers. The decisions are [`TwinCore`]'s; a dedicated writer thread
//! owns the log's streaming appends and makes one sync per batch (whatever
//! arrived while the previous sync ran); this moves bytes between them.
//!
//! Owns the twin's session with its primary, its writer thread and its
//! retention. May not touch: the rules of following (the [`TwinCore`]),
//! the primary's side, or the failover files (those are
//! [`super::failover`]'s; it calls them).

pub mod retention;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use quinn::Connection;
use tokio::sync::{mpsc, watch};

use crate::log::{Error as LogError, HistoryId, Log};
use crate::net::{self, NetError};
use crate::node::epoch::Epochs;
use crate::node::snapshot_transfer as snapshot;
use crate::node::store_host::StoreHost;
use crate::repl::apply::{self, Applier, Write};
use crate::repl::{Backoff, Position, Refusal, Timers, TwinAction, TwinCore, TwinState, TwinView};
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
pub type Handover =
    dyn Fn(u64, Vec<crate::repl::HandedClient>) -> Result<(u64, String), String> + Send + Sync;

/// What the writer thread reports.
enum Written {
    Committed(u64),
    Synced(u64),
    Failed(LogError),
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

    /// Fetch the primary's snapshot over `conn` (resuming a staged one),
    /// install it and restart the log after it.
    async fn take_snapshot(&self, conn: &Connection, s: &Arc<TwinSnapshots>) -> String {
        let mut last_report = std::time::Instant::now();
        let status = &self.status;
        let mut progress = |held: u64, total: u64| {
            if let Ok(mut st) = status.lock() {
                st.snapshot_held = held;
                st.snapshot_total = total;
            }
            if last_report.elapsed() > Duration::from_secs(2) {
                last_report = std::time::Instant::now();
                tracing::info!(held, total, "fetching the snapshot");
            }
        };
        let fetched = match snapshot::fetch(conn, &s.paths, &mut progress).await {
            Ok(f) => f,
            Err(e) => return format!("snapshot fetch interrupted: {e}"),
        };
        tracing::info!(
            total = fetched.total,
            received = fetched.received,
            reused = fetched.reused,
            "snapshot fetched; installing"
        );
        let s2 = s.clone();
        let installed =
            tokio::task::spawn_blocking(move || s2.store.install_snapshot(&s2.paths, None)).await;
        match installed {
            Ok(Ok(at)) => {
                let base = install::read_base(&s.paths.base()).ok().flatten();
                *self.base.lock().unwrap_or_else(|e| e.into_inner()) = base;
                self.durable.send_replace(self.log.head_seq());
                self.set_status(|st| {
                    st.snapshots_installed += 1;
                    st.snapshot_at = at;
                    st.below_floor = false;
                });
                format!("snapshot installed at {at}: following from {}", at + 1)
            }
            Ok(Err(e)) => {
                // A staged snapshot that does not check is fetched anew.
                if matches!(e, crate::store::StoreError::BadSnapshot { .. }) {
                    let _ = std::fs::remove_dir_all(s.paths.staging());
                }
                format!("snapshot install failed: {e}")
            }
            Err(e) => format!("snapshot install: {e}"),
        }
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
    /// that find a restarted primary are [`TwinCore`]'s.
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
            let mut end = SessionEnd::default();
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
                Ok(why) => why,
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
        let now = tokio::time::Instant::now();
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

    /// The primary lost this log's frames past `after` in a crash, before
    /// they were durable there, so they were never acknowledged: check the
    /// frame at `after` against the primary's `crc`, save the frames past
    /// it (under the data directory's `divergent/`, as a rejoin does), move
    /// the store back to `after`, and cut them.
    async fn cut_lost(&self, after: u64, crc: Option<u32>) -> Result<String, String> {
        let log = self.log.clone();
        let base = *self.base.lock().unwrap_or_else(|e| e.into_inner());
        let snapshots = self.snapshots();
        let store = self.store();
        let epoch = self.epochs.newest();
        let primary = self.primary.to_string();
        let cut = tokio::task::spawn_blocking(move || -> Result<String, String> {
            let head = log.head_seq();
            if after >= head {
                return Ok(format!("nothing past {after} to cut"));
            }
            if let Some(theirs) = crc {
                let here = install::crc_of_frame(&log, base.as_ref(), after)
                    .map_err(|e| format!("this log's frame {after} does not read: {e}"))?;
                let erased = log.locate_blob(after).is_ok_and(|l| l.is_erased());
                if here != theirs && !erased {
                    return Err(format!(
                        "this log's frame {after} (crc {here:08x}) is not the primary's ({theirs:08x}): the logs share no checked past, nothing is cut. Restore this box"
                    ));
                }
            }
            let saved = match &snapshots {
                Some(s) => {
                    let tail = crate::node::divergent::Tail {
                        log: &log,
                        fork: after,
                        epoch,
                        new_epoch: epoch,
                        primary,
                    };
                    let (_, path) = crate::node::divergent::save(&s.paths.data, &tail)
                        .map_err(|e| format!("saving frames {}..={head}: {e}", after + 1))?;
                    path.display().to_string()
                }
                None => "nowhere (no data directory)".into(),
            };
            let truncate = || log.truncate_after(after);
            let moved = match &store {
                Some(host) => host.rewound_for_cut(after, truncate).map_err(|e| e.to_string())?.0,
                None => {
                    truncate().map_err(|e| e.to_string())?;
                    None
                }
            };
            Ok(format!(
                "cut frames {}..={head}, which the primary lost before they were durable there (saved {saved}; store moved back from {moved:?})",
                after + 1
            ))
        })
        .await
        .map_err(|e| e.to_string())??;
        tracing::warn!(after, "{cut}");
        self.durable.send_replace(self.log.head_seq());
        Ok(cut)
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

    async fn session(
        &self,
        endpoint: &quinn::Endpoint,
        backoff: &mut Backoff,
        shutdown: &mut watch::Receiver<bool>,
        end: &mut SessionEnd,
    ) -> Result<String, NetError> {
        let view = self.view().map_err(|e| {
            NetError::Io(std::io::Error::other(format!(
                "this twin's head frame does not read: {e}"
            )))
        })?;
        // A handshake into a dead link would otherwise wait out QUIC's own
        // idle timeout before the next attempt.
        let conn = tokio::time::timeout(
            self.cfg.timers.idle_timeout,
            net::connect(endpoint, self.primary),
        )
        .await
        .map_err(|_| NetError::Io(std::io::Error::from(std::io::ErrorKind::TimedOut)))??;
        let (mut ctl_send, ctl_recv) = conn.open_bi().await?;
        let mut core = TwinCore::new(self.cfg.timers, view, crate::node::clock::now());
        let (msgs_tx, mut msgs) = mpsc::channel(64);
        tokio::spawn(net::forward_msgs(ctl_recv, msgs_tx));
        let (chunks_tx, mut chunks) = mpsc::channel::<Result<bytes::Bytes, NetError>>(8);
        let mut frames_task = None;
        let mut streaming_since = None;
        let (write_tx, write_rx) = mpsc::channel::<Vec<Write>>(WRITE_BATCHES);
        let (written_tx, mut written) = mpsc::unbounded_channel::<Written>();
        // A verify's digests, computed beside the session.
        type Digested = (u64, Result<Vec<crate::repl::verify::Digest>, String>);
        let (digest_tx, mut digested) = mpsc::unbounded_channel::<Digested>();
        let writer = {
            let log = self.log.clone();
            // Named: spawned from a runtime worker, it would carry the
            // worker's name in profiles and `top -H`.
            std::thread::Builder::new()
                .name("twin-writer".into())
                .spawn(move || write_frames(&log, write_rx, written_tx))?
        };
        let mut below_floor = false;
        let (received_before, frames_before) = {
            let s = self.status.lock().unwrap_or_else(|e| e.into_inner());
            (s.received_bytes, s.frame_bytes_received)
        };
        let mut frame_bytes = 0u64;
        let mut store_health = self.store().map(|s| s.watch_health());
        // Reported once streaming starts, then on each change: not per
        // chunk, which is this loop's pace.
        let mut store_unreported = true;
        let result = 'session: loop {
            if store_unreported && core.state() == TwinState::Streaming {
                if let Some(rx) = &store_health {
                    core.report_store(rx.borrow().clone());
                }
                store_unreported = false;
            }
            while let Some(m) = core.poll_transmit() {
                if let Err(e) = net::write_msg(&mut ctl_send, &m).await {
                    break 'session Err(e);
                }
            }
            let mut closed = None;
            while let Some(action) = core.poll_action() {
                match action {
                    TwinAction::AdoptHistory(h) => {
                        if let Err(e) = self.log.adopt_history(HistoryId(h)) {
                            closed = Some(format!("adopting the primary's history: {e}"));
                        }
                    }
                    TwinAction::AdoptEpochs(h) => {
                        let epoch = h.current();
                        if let Err(err) = self.epochs.update(|s| {
                            s.follow(h);
                            Ok(())
                        }) {
                            closed = Some(format!("recording epoch {epoch}: {err}"));
                        }
                    }
                    TwinAction::BelowFloor {
                        first,
                        primary_head,
                    } => {
                        below_floor = true;
                        self.set_status(|s| s.below_floor = true);
                        closed = Some(format!(
                            "below the primary's retention floor {first} (primary head {primary_head}): a snapshot is needed"
                        ));
                    }
                    TwinAction::CutAfter { after, crc } => {
                        // The Close that follows ends this session; the
                        // next Hello reports the cut log.
                        if let Err(e) = self.cut_lost(after, crc).await {
                            tracing::error!(after, error = %e, "cutting the frames the primary lost");
                            self.set_status(|s| s.last_error = Some(e.clone()));
                        }
                    }
                    TwinAction::Digest { id, ask, mib_per_s } => {
                        let (log, epochs, tx) =
                            (self.log.clone(), self.epochs.history(), digest_tx.clone());
                        tokio::spawn(async move {
                            let rate = crate::node::verify::verify_rate(mib_per_s);
                            let d = crate::node::verify::digests(log, epochs, ask, rate).await;
                            let _ = tx.send((id, d.map(|(d, _)| d)));
                        });
                    }
                    TwinAction::Close(why) => {
                        closed = Some(why.to_string());
                        self.set_status(|s| s.refusal = Some(why));
                    }
                    TwinAction::Promote { head, clients } => {
                        let hook = self
                            .handover
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .clone();
                        let done = match hook {
                            Some(h) => h(head, clients),
                            None => Err("this twin cannot be promoted in place".into()),
                        };
                        match done {
                            Ok((epoch, listen)) => {
                                tracing::warn!(epoch = %crate::repl::epochs::EpochName(epoch), head, %listen, "switchover: this box is the primary now");
                                core.promoted(self.epochs.history(), listen);
                                while let Some(m) = core.poll_transmit() {
                                    let _ = net::write_msg(&mut ctl_send, &m).await;
                                }
                                self.promoted.send_replace(true);
                                closed = Some(format!("promoted to epoch {epoch} at a switchover"));
                            }
                            Err(e) => {
                                // Nothing changed here: the old primary
                                // may take writes again.
                                core.handover_refused(format!("the twin's promotion failed: {e}"));
                                while let Some(m) = core.poll_transmit() {
                                    let _ = net::write_msg(&mut ctl_send, &m).await;
                                }
                                closed = Some(format!("the switchover's promotion failed: {e}"))
                            }
                        }
                    }
                }
            }
            if let Some(why) = closed {
                let _ = ctl_send.finish();
                break Ok(why);
            }
            if core.state() == TwinState::Streaming && frames_task.is_none() {
                backoff.reset();
                self.set_status(|s| {
                    s.connected = true;
                    s.below_floor = false;
                    s.refusal = None;
                });
                frames_task = Some(tokio::spawn(read_frames(conn.clone(), chunks_tx.clone())));
                streaming_since = Some(tokio::time::Instant::now());
            }
            self.set_status(|s| {
                s.primary_head = core.primary_head().0;
                s.lag_frames = core.lag_frames();
                s.received_bytes = received_before + conn.stats().udp_rx.bytes;
                s.frame_bytes_received = frames_before + frame_bytes;
            });
            let deadline = crate::node::clock::wake_at(core.poll_timeout());
            tokio::select! {
                msg = msgs.recv() => match msg {
                    Some(Ok(m)) => {
                        self.heard_primary();
                        core.handle_message(m, crate::node::clock::now())
                    }
                    Some(Err(e)) => break Err(e),
                    None => break Ok("the primary closed the control stream".into()),
                },
                chunk = chunks.recv() => match chunk {
                    // A refusal is queued in the core and ends the loop above.
                    Some(Ok(bytes)) => {
                        frame_bytes += bytes.len() as u64;
                        let _ = feed(&mut core, &bytes, &write_tx).await;
                    }
                    Some(Err(e)) => break Err(e),
                    None => break Ok("the frame stream ended".into()),
                },
                Some((id, d)) = digested.recv() => core.digests(id, d),
                done = written.recv() => match done {
                    Some(Written::Committed(seq)) => core.handle_committed(seq),
                    Some(Written::Synced(head)) => {
                        core.handle_synced(head);
                        self.durable.send_replace(head);
                    }
                    Some(Written::Failed(e)) => core.handle_commit_failed(&e),
                    None => break Ok("the writer stopped".into()),
                },
                _ = tokio::time::sleep_until(deadline) => core.handle_timeout(crate::node::clock::now()),
                changed = async {
                    match store_health.as_mut() {
                        Some(rx) => rx.changed().await.is_ok(),
                        None => std::future::pending().await,
                    }
                } => {
                    store_unreported = changed;
                    if !changed {
                        store_health = None;
                    }
                }
                _ = shutdown.changed() => break Ok("shutting down".into()),
            }
        };
        if let Some(t) = frames_task {
            t.abort();
        }
        end.streamed = streaming_since.map_or(Duration::ZERO, |t| t.elapsed());
        // Before this side closes it: what the peer or the transport did.
        end.closed_by = conn.close_reason();
        drop(write_tx);
        // The writer aborts a partial frame and syncs what it committed, so
        // the next Hello reports it; its last sync is acknowledged, when the
        // link still carries it.
        while let Some(done) = written.recv().await {
            match done {
                Written::Committed(seq) => core.handle_committed(seq),
                Written::Synced(head) => {
                    core.handle_synced(head);
                    self.durable.send_replace(head);
                }
                Written::Failed(e) => core.handle_commit_failed(&e),
            }
        }
        while let Some(m) = core.poll_transmit() {
            if net::write_msg(&mut ctl_send, &m).await.is_err() {
                break;
            }
        }
        let _ = ctl_send.finish();
        // After a switchover's `Promoted`, the old primary must hear it
        // before the connection closes (and this process execs the
        // primary): a close discards stream data not yet delivered, and
        // the old primary would then time the switchover out and fence
        // itself, knowing no new primary to name.
        if *self.promoted.borrow() {
            let _ = tokio::time::timeout(PROMOTED_FLUSH, ctl_send.stopped()).await;
        }
        let _ = tokio::task::spawn_blocking(move || writer.join()).await;
        self.durable.send_replace(self.log.head_seq());
        let result = match (below_floor, self.snapshots()) {
            (true, Some(s)) => Ok(self.take_snapshot(&conn, &s).await),
            _ => result,
        };
        // The snapshot, if one came, arrived on this connection too.
        self.set_status(|s| {
            s.received_bytes = received_before + conn.stats().udp_rx.bytes;
            s.frame_bytes_received = frames_before + frame_bytes;
        });
        conn.close(0u32.into(), b"session over");
        result
    }
}

/// How a session ended, besides why: what the next delay depends on.
#[derive(Default)]
struct SessionEnd {
    /// How long it streamed (zero: it never did).
    streamed: Duration,
    /// What closed the connection, when it was not this side.
    closed_by: Option<quinn::ConnectionError>,
}

/// How long a twin promoted at a switchover waits for the old primary to
/// acknowledge its `Promoted` before closing the connection.
const PROMOTED_FLUSH: Duration = Duration::from_secs(2);

/// Batches of writer commands in flight: one batch per chunk read from the
/// stream (at most 256 KiB), so at most a few MiB are buffered, whatever the
/// number of frames in them.
const WRITE_BATCHES: usize = 16;

/// Decode stream bytes with the core and hand their steps to the writer
/// as one batch: the writer syncs when it has caught up, so a batch per
/// chunk lets one sync cover every frame the chunk held.
async fn feed(
    core: &mut TwinCore,
    bytes: &bytes::Bytes,
    writer: &mpsc::Sender<Vec<Write>>,
) -> Result<(), Refusal> {
    let mut batch = Vec::new();
    let decoded = apply::decode(core, bytes, &mut batch);
    if !batch.is_empty() {
        let _ = writer.send(batch).await;
    }
    decoded
}

/// The writer thread: applies each batch as it comes, and syncs once
/// whenever it has caught up with what arrived: one sync per batch.
fn write_frames(
    log: &Log,
    mut rx: mpsc::Receiver<Vec<Write>>,
    out: mpsc::UnboundedSender<Written>,
) {
    let synced = |done: Result<u64, LogError>| match done {
        Ok(head) => Written::Synced(head),
        Err(e) => Written::Failed(e),
    };
    let mut applier = Applier::new(log);
    loop {
        let batch = match rx.try_recv() {
            Ok(batch) => batch,
            Err(mpsc::error::TryRecvError::Empty) => {
                if let Some(done) = applier.sync_if_caught_up() {
                    let _ = out.send(synced(done));
                }
                match rx.blocking_recv() {
                    Some(batch) => batch,
                    None => break,
                }
            }
            Err(mpsc::error::TryRecvError::Disconnected) => break,
        };
        // One `Committed` per batch, for its last frame: the session wakes
        // once per chunk, not once per frame.
        let applied = applier.apply(batch);
        if let Some(seq) = applied.committed {
            let _ = out.send(Written::Committed(seq));
        }
        if let Some(e) = applied.failed {
            let _ = out.send(Written::Failed(e));
        }
    }
    match applier.finish() {
        Some(Ok(head)) => {
            let _ = out.send(Written::Synced(head));
        }
        Some(Err(e)) => tracing::error!(error = %e, "sync after the session failed"),
        None => {}
    }
}

/// The frame stream's chunks, in order, as they arrive.
async fn read_frames(conn: Connection, tx: mpsc::Sender<Result<bytes::Bytes, NetError>>) {
    let mut recv = match conn.accept_uni().await {
        Ok(r) => r,
        Err(e) => {
            let _ = tx.send(Err(e.into())).await;
            return;
        }
    };
    loop {
        match recv.read_chunk(256 * 1024, true).await {
            Ok(Some(chunk)) => {
                if tx.send(Ok(chunk.bytes)).await.is_err() {
                    return;
                }
            }
            Ok(None) => return,
            Err(e) => {
                let _ = tx
                    .send(Err(NetError::Io(std::io::Error::other(e.to_string()))))
                    .await;
                return;
            }
        }
    }
}
