//! The primary: a log, its twin connection and its clients on one QUIC
//! endpoint. The replication decisions are [`PrimaryCore`]'s; this moves
//! bytes between it, the log and the network.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use quinn::{Connection, RecvStream, SendStream};
use tokio::sync::{mpsc, watch};

use super::api::{ApiError, ClientRole, Durability, Request, Response, Status};
use super::epoch::Epochs;
use super::retention::Retention;
use super::snapshot::{self, SnapshotSource};
use super::store::StoreHost;
use crate::log::{Error as LogError, Log};
use crate::net::{self, NetError, Pins, Role};
use crate::repl::wire::frame_prefix;
use crate::repl::{Now, PrimaryAction, PrimaryCore, PrimaryState, PrimaryView, Timers, TwinMsg};

mod appender;
mod body;
mod budget;
mod retain;
mod stage;
mod store_requests;
mod switchover;
mod twin_seat;

/// Appends up to this size are read whole and appended in one call (and
/// share fdatasyncs with concurrent appends); larger blobs stream.
const SMALL_BLOB: u64 = 1 << 20;
/// The piece a frame's blob moves in.
pub const PIECE: usize = 256 * 1024;

/// What a `twin` append does while the twin does not acknowledge it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TwinPolicy {
    /// Wait for the twin, however long (the default).
    Wait,
    /// Answer `ApiError::TwinTimeout` after this long.
    Fail(Duration),
    /// After this long, acknowledge as `local` and keep doing so, without
    /// waiting, until the twin has caught up: shown in status and logged.
    FallBack(Duration),
}

/// How the primary runs.
#[derive(Clone, Copy, Debug)]
pub struct PrimaryConfig {
    pub policy: TwinPolicy,
    pub timers: Timers,
    /// This primary's epoch (raised by each promotion).
    pub epoch: u64,
    /// The longest a client may leave a request's body without sending a
    /// byte: past it the request is cut off (`BodyStalled`), so no client
    /// holds the log's writer or the store.
    pub body_piece_deadline: Duration,
    /// The memory request bodies and whole answers may hold together
    /// (see `budget`).
    pub memory_budget: u64,
    /// Client connections served at once; more are closed at once
    /// (`CLOSE_TOO_MANY`). The twin is never counted.
    pub max_clients: usize,
    /// Streamed bodies up to this size are staged whole before the log's
    /// writer or the store is taken (see `stage`); 0 stages none.
    pub stage_max_body: u64,
    /// The disk space staged bodies share.
    pub staging_space: u64,
}

impl Default for PrimaryConfig {
    fn default() -> Self {
        PrimaryConfig {
            policy: TwinPolicy::Wait,
            timers: Timers::default(),
            epoch: 0,
            body_piece_deadline: body::DEFAULT_PIECE_DEADLINE,
            memory_budget: budget::DEFAULT_BUDGET_BYTES,
            max_clients: 64,
            stage_max_body: stage::DEFAULT_STAGE_MAX_BYTES,
            staging_space: stage::DEFAULT_STAGING_BYTES,
        }
    }
}

/// The primary daemon's state, shared by its connections.
pub struct Primary {
    /// The epochs of this box: the one it serves under, and whether a
    /// newer one fenced it.
    epochs: Arc<Epochs>,
    /// Whether a twin is pinned at all: without one, a `twin` append is
    /// refused at once, not left waiting.
    twin_configured: bool,
    /// A planned switchover's state.
    switch: switchover::Switch,
    /// The memory requests hold whole, bounded.
    budget: budget::Budget,
    /// Where streamed bodies wait, whole, for their writer.
    staging: stage::Staging,
    /// Client connections open now.
    clients: std::sync::atomic::AtomicUsize,
    log: Arc<Log>,
    pins: Arc<Pins>,
    cfg: PrimaryConfig,
    /// The published head and the bytes appended through it.
    head: watch::Sender<(u64, u64)>,
    /// The twin's acknowledged durable head.
    acked: watch::Sender<u64>,
    /// The twin's store as it last reported it.
    pub(super) twin_store: watch::Sender<Option<crate::repl::StoreHealth>>,
    status: Mutex<Status>,
    /// Client requests in progress, so a shutdown can let them finish.
    inflight: watch::Sender<usize>,
    stopping: std::sync::atomic::AtomicBool,
    /// The store the log feeds, when this primary keeps one.
    store: Option<Arc<StoreHost>>,
    retention: Mutex<Retention>,
    /// The twin's position: retention keeps the frames from it on.
    hold: std::sync::atomic::AtomicU64,
    /// The position the slot file holds.
    slot_written: std::sync::atomic::AtomicU64,
    /// The snapshot a twin below the floor is given.
    snapshots: Mutex<Option<Arc<SnapshotSource>>>,
    /// The first frame the twin's log holds, as its last Hello said: a
    /// twin that installed a snapshot holds none before it.
    twin_first: std::sync::atomic::AtomicU64,
    /// The lag when the last twin session ended, and when: the lag goes
    /// on growing while no twin is connected.
    lag_at_end: Mutex<Option<LagAtEnd>>,
    /// `twin` appends waiting for the twin now.
    twin_waiting: std::sync::atomic::AtomicU64,
    /// From a publication to the twin's ack covering it.
    ack_delay: crate::metrics::Histogram,
    /// Each pinned client's role; a client pinned and not named here is an
    /// admin (a library user that pins through `Pins` alone).
    client_roles: Mutex<std::collections::HashMap<crate::net::Fingerprint, ClientRole>>,
    /// The twin connection being served: one at a time.
    twin_seat: twin_seat::TwinSeat,
    /// The thread small appends queue to (none when it could not start:
    /// each append then takes a blocking task).
    appender: Option<appender::Appender>,
}

/// The lag a twin session left, to grow from while the twin is away.
#[derive(Clone, Copy)]
struct LagAtEnd {
    at: std::time::Instant,
    bytes_appended: u64,
    lag_bytes: u64,
    lag_ms: u64,
}

/// Counts a request in progress for as long as it lives.
struct InFlight<'a>(&'a watch::Sender<usize>);

impl<'a> InFlight<'a> {
    fn enter(counter: &'a watch::Sender<usize>) -> Self {
        counter.send_modify(|n| *n += 1);
        InFlight(counter)
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.send_modify(|n| *n -= 1);
    }
}

/// How long a shutdown waits for requests in flight, then for the twin's
/// final acknowledgement.
const DRAIN: Duration = Duration::from_secs(5);
/// How long a stopping primary waits for its connections' closes: they go
/// out at once; a peer that no longer answers would hold the endpoint
/// until QUIC's idle timeout.
const DRAIN_IDLE: Duration = Duration::from_millis(250);

/// A policy's timeout as a person writes it: `2s`, `1.5s`, `250ms`.
fn humantime(d: Duration) -> String {
    if d.subsec_millis() == 0 {
        format!("{}s", d.as_secs())
    } else if d.as_secs() == 0 {
        format!("{}ms", d.as_millis())
    } else {
        format!("{}s", d.as_secs_f64())
    }
}

fn lock(m: &Mutex<Status>) -> std::sync::MutexGuard<'_, Status> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Primary {
    pub fn new(log: Arc<Log>, pins: Arc<Pins>, cfg: PrimaryConfig) -> Arc<Primary> {
        Self::with_store(log, pins, cfg, None)
    }

    /// A primary that keeps `store` (opened on `log`) and serves the store
    /// requests.
    pub fn with_store(
        log: Arc<Log>,
        pins: Arc<Pins>,
        cfg: PrimaryConfig,
        store: Option<Arc<StoreHost>>,
    ) -> Arc<Primary> {
        let epochs = Arc::new(Epochs::in_memory(cfg.epoch));
        Self::build(log, pins, cfg, store, epochs)
    }

    /// A primary whose epochs are `epochs` (kept in its data directory):
    /// it serves under their current epoch, and is fenced by them.
    pub fn build(
        log: Arc<Log>,
        pins: Arc<Pins>,
        cfg: PrimaryConfig,
        store: Option<Arc<StoreHost>>,
        epochs: Arc<Epochs>,
    ) -> Arc<Primary> {
        let head_seq = log.head_seq();
        let twin_configured = pins.has_role(Role::Twin);
        let head = watch::channel((head_seq, 0)).0;
        let appender = {
            let head = head.clone();
            appender::Appender::start(log.clone(), move |seq, bytes| publish(&head, seq, bytes))
        };
        let appender = match appender {
            Ok(a) => Some(a),
            Err(e) => {
                tracing::warn!(error = %e, "no appender thread: appends take blocking tasks");
                None
            }
        };
        Arc::new(Primary {
            epochs,
            twin_configured,
            switch: Default::default(),
            budget: budget::Budget::new(cfg.memory_budget),
            staging: stage::Staging::new(log.dir(), cfg.stage_max_body, cfg.staging_space),
            clients: std::sync::atomic::AtomicUsize::new(0),
            log,
            pins,
            cfg,
            head,
            acked: watch::channel(0).0,
            twin_store: watch::channel(None).0,
            status: Mutex::new(Status::default()),
            inflight: watch::channel(0).0,
            stopping: std::sync::atomic::AtomicBool::new(false),
            store,
            retention: Mutex::new(Retention::default()),
            hold: std::sync::atomic::AtomicU64::new(0),
            slot_written: std::sync::atomic::AtomicU64::new(u64::MAX),
            snapshots: Mutex::new(None),
            twin_first: std::sync::atomic::AtomicU64::new(0),
            lag_at_end: Mutex::new(None),
            twin_waiting: std::sync::atomic::AtomicU64::new(0),
            client_roles: Mutex::new(std::collections::HashMap::new()),
            ack_delay: Default::default(),
            twin_seat: Default::default(),
            appender,
        })
    }

    /// The role of each pinned client named here (the others are admins).
    pub fn set_client_roles(
        &self,
        roles: std::collections::HashMap<crate::net::Fingerprint, ClientRole>,
    ) {
        *self.client_roles.lock().unwrap_or_else(|e| e.into_inner()) = roles;
    }

    pub fn log(&self) -> &Arc<Log> {
        &self.log
    }

    /// From each publication to the twin's ack covering it, since start.
    pub fn ack_delay(&self) -> &crate::metrics::Histogram {
        &self.ack_delay
    }

    /// Status as `primary status` shows it.
    pub fn status(&self) -> Status {
        let mut s = lock(&self.status).clone();
        s.memory_held = self.budget.in_use();
        s.staging_held = self.staging.in_use();
        s.client_connections = self.clients.load(std::sync::atomic::Ordering::SeqCst) as u64;
        s.head = self.log.head_seq();
        s.first = self.log.first_seq();
        s.twin_acked = *self.acked.borrow();
        s.retention_max_bytes = self.retention().max_bytes;
        s.log_bytes = self.log.bytes();
        s.twin_hold = self.hold();
        s.twin_below_floor = self.twin_below_floor();
        s.store = self.store.as_ref().map(|h| h.health());
        s.twin_store = self.twin_store.borrow().clone();
        s.policy = match self.cfg.policy {
            TwinPolicy::Wait => "wait".into(),
            TwinPolicy::Fail(d) => format!("fail {}", humantime(d)),
            TwinPolicy::FallBack(d) => format!("fallback {}", humantime(d)),
        };
        s.twin_waiting = self.twin_waiting.load(std::sync::atomic::Ordering::SeqCst);
        s.log_poisoned = self.log.poisoned_by();
        s.role = "primary".into();
        s.refused_peers = self.pins.refused();
        let epochs = self.epochs.state();
        s.epoch = epochs.current();
        s.fenced = epochs.fenced().then(|| crate::node::api::Fence {
            epoch: epochs.seen,
            by: epochs.fenced_by.clone().unwrap_or_default(),
        });
        s.twin_configured = self.twin_configured;
        s.build = env!("CARGO_PKG_VERSION").into();
        if !s.twin_connected {
            // No session measures the lag: what is not acknowledged is
            // behind, connected or not, and it grows while the twin is away.
            s.lag_frames = s.head.saturating_sub(s.twin_acked);
            let end = *self.lag_at_end.lock().unwrap_or_else(|e| e.into_inner());
            match end {
                Some(end) if s.lag_frames > 0 => {
                    let appended = self.head.borrow().1;
                    s.lag_bytes = end.lag_bytes + appended.saturating_sub(end.bytes_appended);
                    s.lag_ms = end.lag_ms + end.at.elapsed().as_millis() as u64;
                }
                _ if s.lag_frames == 0 => {
                    s.lag_bytes = 0;
                    s.lag_ms = 0;
                }
                _ => {}
            }
        }
        s
    }

    /// Accept connections until `shutdown` turns true; then stop accepting,
    /// let the requests in flight finish, wait for the twin's final
    /// acknowledgement of the head (each bounded), and close.
    pub async fn serve(
        self: Arc<Self>,
        endpoint: quinn::Endpoint,
        mut shutdown: watch::Receiver<bool>,
    ) {
        let retainer = tokio::spawn(self.clone().retain_loop());
        loop {
            tokio::select! {
                incoming = endpoint.accept() => {
                    let Some(incoming) = incoming else { break };
                    let me = self.clone();
                    tokio::spawn(async move {
                        match incoming.await {
                            Ok(conn) => me.connection(conn).await,
                            Err(e) => tracing::warn!(error = %e, "handshake refused"),
                        }
                    });
                }
                _ = shutdown.changed() => break,
            }
        }
        self.stopping
            .store(true, std::sync::atomic::Ordering::SeqCst);
        endpoint.set_server_config(None);
        let mut inflight = self.inflight.subscribe();
        if tokio::time::timeout(DRAIN, inflight.wait_for(|&n| n == 0))
            .await
            .is_err()
        {
            tracing::warn!("requests still in flight after {DRAIN:?}: closing anyway");
        }
        if lock(&self.status).twin_connected {
            let head = self.log.head_seq();
            let mut acked = self.acked.subscribe();
            let acked_in_time = tokio::time::timeout(DRAIN, acked.wait_for(|&a| a >= head))
                .await
                .is_ok_and(|r| r.is_ok());
            if acked_in_time {
                tracing::info!(head, "the twin acknowledged the final head");
            } else {
                tracing::warn!(head, "the twin did not acknowledge the final head in time");
            }
        }
        retainer.abort();
        endpoint.close(0u32.into(), b"shutdown");
        // A peer gone without a close (SIGKILLed, unplugged) would hold
        // this until QUIC's idle timeout: a deposed primary would follow
        // as the twin 10 s late, with the new primary's `twin` appends
        // waiting meanwhile.
        if tokio::time::timeout(DRAIN_IDLE, endpoint.wait_idle())
            .await
            .is_err()
        {
            tracing::info!(
                "a peer did not answer the close within {DRAIN_IDLE:?}: stopping anyway"
            );
        }
    }

    async fn connection(self: Arc<Self>, conn: Connection) {
        let peer = match net::peer(&conn, &self.pins) {
            Ok(p) => p,
            Err(e) => {
                tracing::warn!(error = %e, "connection without a pinned peer");
                return conn.close(1u32.into(), b"not pinned");
            }
        };
        tracing::info!(peer = %peer.0, role = ?peer.1, addr = %conn.remote_address(), "connected");
        match peer.1 {
            Role::Twin => {
                // Held until this session's end is recorded below, so the
                // session that replaces it starts after.
                let seated = self.twin_seat.take(&conn).await;
                let end = self.clone().twin_session(&conn).await;
                let why = match &end {
                    _ if seated.replaced() => {
                        "replaced by a newer connection from the twin".to_string()
                    }
                    Ok(why) => why.clone(),
                    Err(e) => e.to_string(),
                };
                tracing::warn!(reason = %why, "twin connection ended");
                let mut s = lock(&self.status);
                s.twin_connected = false;
                s.twin_last_error = Some(why);
                *self.lag_at_end.lock().unwrap_or_else(|e| e.into_inner()) = Some(LagAtEnd {
                    at: std::time::Instant::now(),
                    bytes_appended: self.head.borrow().1,
                    lag_bytes: s.lag_bytes,
                    lag_ms: s.lag_ms,
                });
            }
            Role::Client => {
                let clients = self
                    .clients
                    .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                if clients >= self.cfg.max_clients {
                    tracing::warn!(peer = %peer.0, max = self.cfg.max_clients, "too many client connections: refused");
                    conn.close(
                        net::CLOSE_TOO_MANY.into(),
                        format!(
                            "this primary serves at most {} client connections",
                            self.cfg.max_clients
                        )
                        .as_bytes(),
                    );
                } else {
                    self.clone().client_session(conn).await;
                }
                self.clients
                    .fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
            }
            other => conn.close(
                2u32.into(),
                format!("{other:?} is not served here").as_bytes(),
            ),
        }
    }

    /// The append path publishes here so twin sessions ship the new frames.
    fn published(&self, seq: u64, bytes: u64) {
        publish(&self.head, seq, bytes)
    }

    async fn twin_session(self: Arc<Self>, conn: &Connection) -> Result<String, NetError> {
        // A twin that connects and stays silent is given the idle timeout,
        // like any silent peer.
        let silent = self.cfg.timers.idle_timeout;
        let hello = tokio::time::timeout(silent, async {
            let (send, mut recv) = conn.accept_bi().await?;
            let hello = net::read_msg::<TwinMsg>(&mut recv).await?;
            Ok::<_, NetError>((send, recv, hello))
        })
        .await;
        let (mut ctl_send, ctl_recv, hello) = match hello {
            Ok(opened) => opened?,
            Err(_) => return Ok("the twin sent no Hello within the idle timeout".into()),
        };
        let Some(hello) = hello else {
            return Ok("the twin left before its Hello".into());
        };
        if let TwinMsg::Hello { first, head, .. } = &hello {
            // Before any acknowledgement of this session wakes a waiter.
            let holds_from = if head.seq == 0 {
                1
            } else {
                (*first).min(head.seq + 1)
            };
            self.twin_first
                .store(holds_from, std::sync::atomic::Ordering::SeqCst);
        }
        let view = PrimaryView {
            history: self.log.history().0,
            head: self.log.head_seq(),
            first: self.log.first_seq(),
            epochs: self.epochs.history(),
        };
        let head = view.head;
        let mut core = PrimaryCore::new(self.cfg.timers, view, Now::system());
        tracing::info!(?hello, head, "twin hello");
        let log = &self.log;
        let frame_at = |seq| {
            log.locate_blob(seq).ok().map(|l| crate::repl::HeadFrame {
                crc: l.payload_crc,
                erased: l.is_erased(),
            })
        };
        core.handle_hello(hello, frame_at, Now::system());

        let (msgs_tx, mut msgs) = mpsc::channel(64);
        tokio::spawn(net::forward_msgs(ctl_recv, msgs_tx));
        // Further streams the twin opens ask for the snapshot.
        let snapshot_server = self
            .snapshot_source()
            .map(|source| tokio::spawn(snapshot::serve_requests(source, conn.clone())));
        let _stop_serving = AbortOnDrop(snapshot_server);
        let mut ship: Option<mpsc::UnboundedSender<(u64, u64)>> = None;
        let mut shipper = None;
        let mut head_rx = self.head.subscribe();
        let mut seen_bytes = head_rx.borrow_and_update().1;
        let mut handover = self.switch.handover.subscribe();
        // The twin's position is what it says at the handshake, even when
        // lower than an earlier session's (a replaced twin).
        let mut handshake = true;
        loop {
            while let Some(m) = core.poll_transmit() {
                net::write_msg(&mut ctl_send, &m).await?;
            }
            for d in core.take_ack_delays() {
                self.ack_delay.observe(d);
            }
            while let Some(action) = core.poll_action() {
                match action {
                    PrimaryAction::Ship { from, through } => {
                        if ship.is_none() {
                            let (tx, rx) = mpsc::unbounded_channel();
                            let frames = conn.open_uni().await?;
                            shipper = Some(tokio::spawn(ship_frames(self.log.clone(), frames, rx)));
                            ship = Some(tx);
                        }
                        if let Some(tx) = &ship {
                            let _ = tx.send((from, through));
                        }
                    }
                    PrimaryAction::Acked(durable) => {
                        tracing::debug!(durable, "twin acknowledged");
                        if std::mem::take(&mut handshake) {
                            self.hold
                                .store(durable, std::sync::atomic::Ordering::SeqCst);
                        } else {
                            self.hold
                                .fetch_max(durable, std::sync::atomic::Ordering::SeqCst);
                        }
                        self.twin_acked(durable)
                    }
                    PrimaryAction::BelowFloor { twin_head, first } => {
                        tracing::warn!(twin_head, first, "the twin is below the retention floor");
                    }
                    PrimaryAction::TwinPromoted { epoch, listen } => {
                        let addr = advertised(&listen, conn.remote_address());
                        let fingerprint = net::peer(conn, &self.pins)
                            .map(|(fp, _)| fp.to_string())
                            .unwrap_or_default();
                        self.fence(epoch, &format!("a switchover to {addr}"));
                        self.switch
                            .deposed
                            .send_replace(Some(crate::node::api::NewPrimary { addr, fingerprint }));
                    }
                    PrimaryAction::Fence { epoch } => {
                        let by = format!(
                            "its twin at {}, which follows epoch {epoch}",
                            conn.remote_address()
                        );
                        self.fence(epoch, &by);
                    }
                    PrimaryAction::TwinStore(health) => {
                        if let Some(st) = &health.stalled {
                            tracing::warn!(seq = st.seq, error = %st.error, "the twin's store is stopped");
                        }
                        self.twin_store.send_replace(Some(health));
                    }
                    PrimaryAction::Close(why) => {
                        let _ = ctl_send.finish();
                        return Ok(why.to_string());
                    }
                }
            }
            {
                let now = Now::system();
                let st = core.status(now);
                let mut s = lock(&self.status);
                s.twin_connected = core.state() == PrimaryState::Streaming;
                s.lag_frames = st.lag_frames;
                s.lag_bytes = st.lag_bytes;
                s.lag_ms = st.lag.as_millis() as u64;
            }
            let deadline = core.poll_timeout().map_or_else(
                || tokio::time::Instant::now() + Duration::from_secs(1),
                tokio::time::Instant::from_std,
            );
            tokio::select! {
                msg = msgs.recv() => match msg {
                    Some(Ok(m)) => core.handle_message(m, Now::system()),
                    Some(Err(e)) => return Err(e),
                    None => {
                        if core.state() == PrimaryState::BelowFloor && self.snapshot_source().is_some() {
                            // The twin fetches the snapshot on this
                            // connection, then closes it.
                            let why = conn.closed().await;
                            return Ok(format!("the twin below the floor left: {why}"));
                        }
                        return Ok("the twin closed its control stream".into());
                    }
                },
                changed = head_rx.changed() => {
                    if changed.is_err() {
                        return Ok("shutting down".into());
                    }
                    let (head, bytes) = *head_rx.borrow_and_update();
                    core.handle_appended(head, bytes - seen_bytes, Now::system());
                    seen_bytes = bytes;
                }
                _ = tokio::time::sleep_until(deadline) => core.handle_timeout(Now::system()),
                changed = handover.changed() => {
                    if changed.is_ok() {
                        let asked = handover.borrow_and_update().clone();
                        if let Some((head, clients)) = asked {
                            if !core.handover(head, clients) {
                                tracing::warn!(head, "this twin session cannot take the handover");
                            }
                        }
                    }
                }
                ended = async { match shipper.as_mut() { Some(h) => h.await, None => std::future::pending().await } } => {
                    return Ok(match ended {
                        Ok(Ok(())) => "the frame stream ended".into(),
                        Ok(Err(e)) => format!("shipping failed: {e}"),
                        Err(e) => format!("shipper: {e}"),
                    });
                }
            }
        }
    }

    /// A newer epoch was heard of from `by`: from now on, durably, this
    /// primary acknowledges no write. Should the fence not reach the disk,
    /// it holds in memory all the same and the failure is logged: refusing
    /// writes is always safe.
    fn fence(&self, epoch: u64, by: &str) {
        match self.epochs.hear(epoch, by) {
            Ok(true) => tracing::error!(
                epoch,
                by,
                serving = self.epochs.current(),
                "FENCED: a newer epoch exists, so another box is primary; this box acknowledges no write from now on (reads go on). Rejoin it as the new primary's twin: primary rejoin"
            ),
            Ok(false) => {}
            Err(e) => tracing::error!(epoch, by, error = %e, "FENCED in memory only: recording the fence failed"),
        }
    }

    /// May a request asking for `durability` append at all?
    fn admit(
        &self,
        durability: Durability,
    ) -> Result<crate::repl::ack::Admit, crate::repl::ack::NotAdmitted> {
        let state = crate::repl::ack::AckState {
            fenced: self.epochs.fenced(),
            twin_configured: self.twin_configured,
            falls_back: matches!(self.cfg.policy, TwinPolicy::FallBack(_)),
        };
        crate::repl::ack::admit(state, durability == Durability::Twin)
    }

    /// A refusal by name; `seq` is a frame appended here before it.
    fn refusal(&self, why: crate::repl::ack::NotAdmitted, seq: Option<u64>) -> ApiError {
        match why {
            crate::repl::ack::NotAdmitted::NoTwin => ApiError::NoTwin,
            crate::repl::ack::NotAdmitted::Fenced => {
                let st = self.epochs.state();
                ApiError::Fenced {
                    epoch: st.current(),
                    newer: st.seen,
                    by: st.fenced_by.unwrap_or_default(),
                    seq,
                    primary: self.switch.deposed.borrow().clone(),
                }
            }
        }
    }

    fn twin_acked(&self, durable: u64) {
        let moved = self.acked.send_if_modified(|a| {
            let moved = durable > *a;
            *a = (*a).max(durable);
            moved
        });
        if moved {
            lock(&self.status).twin_acks += 1;
        }
        if durable >= self.log.head_seq() {
            let mut s = lock(&self.status);
            if s.degraded {
                s.degraded = false;
                tracing::info!(durable, "the twin caught up: twin durability restored");
            }
        }
    }

    async fn client_session(self: Arc<Self>, conn: Connection) {
        let (client, role): (Arc<str>, ClientRole) = match net::peer(&conn, &self.pins) {
            Ok((fp, _)) => (
                fp.to_string().into(),
                self.client_roles
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .get(&fp)
                    .copied()
                    .unwrap_or(ClientRole::Admin),
            ),
            Err(_) => ("(unpinned)".into(), ClientRole::Read),
        };
        loop {
            if self.stopping.load(std::sync::atomic::Ordering::SeqCst) {
                return;
            }
            let (send, recv) = match conn.accept_bi().await {
                Ok(s) => s,
                Err(e) => {
                    tracing::debug!(error = %e, "client gone");
                    return;
                }
            };
            let me = self.clone();
            let client = client.clone();
            tokio::spawn(async move {
                if let Err(e) = me.request(&client, role, send, recv).await {
                    tracing::warn!(error = %e, "client request failed");
                }
            });
        }
    }

    async fn request(
        self: Arc<Self>,
        client: &str,
        role: ClientRole,
        mut send: SendStream,
        mut recv: RecvStream,
    ) -> Result<(), NetError> {
        let _counted = InFlight::enter(&self.inflight);
        let Some(req) = net::read_msg::<Request>(&mut recv).await? else {
            return Ok(());
        };
        if req.needs() > role {
            // Refused before a byte of its body is read: nothing is written.
            let why = ApiError::Forbidden(format!(
                "this needs the {} role; this client's role is {role}",
                req.needs()
            ));
            net::write_msg(&mut send, &Response::Error(why)).await?;
            let _ = send.finish();
            return Ok(());
        }
        let mut _writing = None;
        if let Some(durability) = req.durability() {
            if *self.switch.handing_over.borrow() {
                self.pause_for_switchover().await;
            }
            if let Err(why) = self.admit(durability) {
                net::write_msg(&mut send, &Response::Error(self.refusal(why, None))).await?;
                let _ = send.finish();
                return Ok(());
            }
            _writing = Some(switchover::Writing::enter(&self.switch.writers));
        }
        let response = match req {
            Request::Switchover { wait_ms } => {
                self.switchover(Duration::from_millis(wait_ms)).await
            }
            Request::Fence { epoch } => {
                self.fence(epoch, &format!("the admin client {client}"));
                Response::Status(Box::new(self.status()))
            }
            Request::Append {
                kind,
                meta,
                blob_len,
                durability,
            } => {
                self.append(kind, meta, blob_len, durability, &mut recv)
                    .await
            }
            Request::Read { seq } => return self.read(seq, send).await,
            Request::Tail { from } => return self.tail(from, send).await,
            Request::Status => Response::Status(Box::new(self.status())),
            Request::CreateRepo { repo, durability } => self.create_repo(repo, durability).await,
            Request::Push {
                repo,
                pack_len,
                updates,
                durability,
            } => {
                self.push(repo, pack_len, updates, durability, &mut recv)
                    .await
            }
            Request::Erase {
                before,
                repos,
                durability,
            } => self.erase(before, repos, durability).await,
            Request::EraseBeforeTime {
                before_unix_ms,
                repos,
                durability,
            } => {
                self.erase_before_time(before_unix_ms, repos, durability)
                    .await
            }
            Request::RetainFrom { seq, force } => {
                let me = self.clone();
                match tokio::task::spawn_blocking(move || me.retain_from(seq, force)).await {
                    Ok(Ok(first)) => Response::Retained { first },
                    Ok(Err(e)) => Response::Error(e),
                    Err(e) => Response::Error(ApiError::Refused(e.to_string())),
                }
            }
            Request::LfsPut {
                repo,
                oid,
                len,
                durability,
            } => self.lfs_put(repo, oid, len, durability, &mut recv).await,
            Request::LfsDelete {
                repo,
                oid,
                durability,
            } => self.lfs_delete(repo, oid, durability).await,
            Request::LfsGet { repo, oid } => return self.lfs_get(repo, oid, send).await,
            Request::ReadObject { repo, oid } => return self.read_object(repo, oid, send).await,
            Request::PutDoc {
                name,
                len,
                durability,
            } => self.put_doc(name, len, durability, &mut recv).await,
            Request::StoreRetry => self.store_retry().await,
            Request::DeleteRepo { repo, durability } => {
                self.store_write(move |host| host.delete_repo(&repo), durability)
                    .await
            }
            Request::DeleteDoc { name, durability } => {
                self.store_write(move |host| host.delete_doc(&name), durability)
                    .await
            }
            Request::StoreSkip {
                seq,
                reason,
                force,
                durability,
            } => self.store_skip(seq, reason, force, durability).await,
            Request::Refs { .. }
            | Request::PushHistory { .. }
            | Request::Have { .. }
            | Request::GetDoc { .. }
            | Request::ListRepos
            | Request::ListDocs => return self.store_read(req, send).await,
        };
        net::write_msg(&mut send, &response).await?;
        let _ = send.finish();
        Ok(())
    }

    async fn append(
        &self,
        kind: u16,
        meta: Vec<u8>,
        blob_len: u64,
        durability: Durability,
        recv: &mut RecvStream,
    ) -> Response {
        let meta_len = meta.len() as u64;
        if self.store.is_some() && store_requests::is_store_kind(kind) {
            return Response::Error(ApiError::Forbidden(format!(
                "kind {kind} is the store's: it is written by the store requests, which check it"
            )));
        }
        let _held = self
            .budget
            .charge(blob_len.min(SMALL_BLOB.max(budget::STREAMED_BODY_BYTES)))
            .await;
        let appended = if blob_len <= SMALL_BLOB {
            let blob = match body::Body::new(recv, blob_len, self.cfg.body_piece_deadline)
                .read_all()
                .await
            {
                Ok(b) => b,
                Err(e) => return Response::Error(e),
            };
            if let Some(appender) = &self.appender {
                // The appender published the frame with its group.
                return match appender.append(kind, meta, blob).await {
                    Ok(seq) => self.answer(seq, durability).await,
                    Err(e) => Response::Error(e),
                };
            }
            let log = self.log.clone();
            match tokio::task::spawn_blocking(move || log.append_raw(kind, &meta, &blob)).await {
                Ok(r) => r.map_err(|e| ApiError::Refused(e.to_string())),
                Err(e) => Err(ApiError::Refused(e.to_string())),
            }
        } else {
            self.append_streamed(kind, meta, blob_len, recv).await
        };
        let seq = match appended {
            Ok(seq) => seq,
            Err(e) => return Response::Error(e),
        };
        self.acknowledge(seq, 32 + meta_len + blob_len, durability)
            .await
    }

    /// A frame durable here up to `seq` (`bytes` more of log): published to
    /// the twin sessions, then answered as durable as `durability` asks,
    /// under the policy for an absent twin.
    pub(super) async fn acknowledge(
        &self,
        seq: u64,
        bytes: u64,
        durability: Durability,
    ) -> Response {
        self.published(seq, bytes);
        self.answer(seq, durability).await
    }

    /// The answer to a write whose frame `seq` is durable here and
    /// published: as durable as `durability` asks, under the policy for
    /// an absent twin.
    async fn answer(&self, seq: u64, durability: Durability) -> Response {
        if let Err(why) = crate::repl::ack::may_acknowledge(self.epochs.fenced()) {
            return Response::Error(self.refusal(why, Some(seq)));
        }
        let local = Response::Appended {
            seq,
            durability: Durability::Local,
            twin_wait_us: 0,
        };
        match durability {
            Durability::Local => local,
            Durability::Twin if !self.twin_configured => local,
            Durability::Twin => {
                let started = std::time::Instant::now();
                let mut resp = self.wait_for_twin(seq).await;
                if let Response::Appended { twin_wait_us, .. } = &mut resp {
                    *twin_wait_us = started.elapsed().as_micros() as u64;
                }
                resp
            }
        }
    }

    /// A large blob, staged whole when it is small enough and then written
    /// through a `Pending` on a blocking thread; memory is a few pieces
    /// whatever the size. The log's writer is taken only once the body is
    /// in hand (or, past the staging bound, its first piece), and a client
    /// that stops sending is cut off after the piece deadline: the entry is
    /// dropped, nothing of it is visible, and the other writers go on.
    async fn append_streamed(
        &self,
        kind: u16,
        meta: Vec<u8>,
        blob_len: u64,
        recv: &mut RecvStream,
    ) -> Result<u64, ApiError> {
        let log = self.log.clone();
        let written = self
            .staging
            .feed(
                recv,
                blob_len,
                self.cfg.body_piece_deadline,
                move |pieces| {
                    let mut p = log.begin(None, kind, &meta, blob_len)?;
                    for piece in pieces {
                        p.write(&piece)?;
                    }
                    // A short body makes commit refuse with BlobLength.
                    p.commit()
                },
            )
            .await?;
        written.map_err(|e| ApiError::Refused(e.to_string()))
    }

    async fn wait_for_twin(&self, seq: u64) -> Response {
        self.twin_waiting
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let answer = self.wait_for_twin_counted(seq).await;
        self.twin_waiting
            .fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
        match crate::repl::ack::may_acknowledge(self.epochs.fenced()) {
            Ok(()) => answer,
            Err(why) => Response::Error(self.refusal(why, Some(seq))),
        }
    }

    async fn wait_for_twin_counted(&self, seq: u64) -> Response {
        let twin = Response::Appended {
            seq,
            durability: Durability::Twin,
            twin_wait_us: 0,
        };
        let local = Response::Appended {
            seq,
            durability: Durability::Local,
            twin_wait_us: 0,
        };
        // A twin that installed a snapshot past this frame will never hold
        // it: its log starts after the snapshot's seq.
        let missed = Response::Error(ApiError::NotOnTwin { seq });
        let twin_first = &self.twin_first;
        let on_twin = |s: u64| s >= twin_first.load(std::sync::atomic::Ordering::SeqCst);
        let mut acked = self.acked.subscribe();
        let mut fenced = self.epochs.watch_fenced();
        let reached = async {
            tokio::select! {
                r = acked.wait_for(|&a| a >= seq || !on_twin(seq)) => r.map(|_| ()),
                // A fence answers every waiter at once (below).
                _ = fenced.wait_for(|&f| f) => Ok(()),
            }
        };
        match self.cfg.policy {
            TwinPolicy::Wait => match reached.await {
                Ok(_) if on_twin(seq) => twin,
                Ok(_) => missed,
                Err(_) => Response::Error(ApiError::TwinTimeout { seq }),
            },
            TwinPolicy::Fail(after) => match tokio::time::timeout(after, reached).await {
                Ok(Ok(_)) if on_twin(seq) => twin,
                Ok(Ok(_)) => missed,
                _ => Response::Error(ApiError::TwinTimeout { seq }),
            },
            TwinPolicy::FallBack(after) => {
                if lock(&self.status).degraded {
                    return local;
                }
                match tokio::time::timeout(after, reached).await {
                    Ok(Ok(_)) if on_twin(seq) => twin,
                    Ok(Ok(_)) => local,
                    _ => {
                        let mut s = lock(&self.status);
                        if !s.degraded {
                            s.degraded = true;
                            tracing::warn!(seq, "the twin did not acknowledge in time: appends fall back to local durability");
                        }
                        local
                    }
                }
            }
        }
    }

    async fn read(&self, seq: u64, mut send: SendStream) -> Result<(), NetError> {
        match self.write_frame(seq, &mut send).await? {
            FrameSent::Whole => {
                let _ = send.finish();
            }
            FrameSent::Nothing(e) => {
                net::write_msg(&mut send, &Response::Error(ApiError::Read(e))).await?;
                let _ = send.finish();
            }
            FrameSent::Cut => {}
        }
        Ok(())
    }

    /// Frames from `from` on, each as it becomes durable, until the client
    /// goes or the primary stops.
    async fn tail(&self, from: u64, mut send: SendStream) -> Result<(), NetError> {
        let first = self.log.first_seq();
        let mut next = from.max(1);
        if next < first {
            let e = format!("sequence {next} is below the retention floor {first}");
            net::write_msg(&mut send, &Response::Error(ApiError::Read(e))).await?;
            let _ = send.finish();
            return Ok(());
        }
        let mut head_rx = self.head.subscribe();
        loop {
            while next <= self.log.head_seq() {
                match self.write_frame(next, &mut send).await? {
                    FrameSent::Whole => next += 1,
                    FrameSent::Nothing(e) => {
                        net::write_msg(&mut send, &Response::Error(ApiError::Read(e))).await?;
                        let _ = send.finish();
                        return Ok(());
                    }
                    FrameSent::Cut => return Ok(()),
                }
            }
            if self.stopping.load(std::sync::atomic::Ordering::SeqCst) {
                let _ = send.finish();
                return Ok(());
            }
            tokio::select! {
                changed = head_rx.changed() => if changed.is_err() { return Ok(()) },
                // Wakes a tail now and then to notice a shutdown.
                _ = tokio::time::sleep(Duration::from_millis(500)) => {}
            }
        }
    }

    /// One frame as `Response::Frame` and its blob, read in pieces by a
    /// blocking reader.
    async fn write_frame(&self, seq: u64, send: &mut SendStream) -> Result<FrameSent, NetError> {
        let (tx, mut rx) = mpsc::channel::<Result<Vec<u8>, String>>(4);
        let log = self.log.clone();
        tokio::task::spawn_blocking(move || {
            let mut first = true;
            let read = log.read_pieces(seq, PIECE, |loc, piece, _last| {
                if first {
                    first = false;
                    let head = Response::Frame {
                        seq,
                        kind: loc.kind,
                        meta: loc.meta.clone(),
                        blob_len: if loc.is_erased() { 0 } else { loc.blob_len },
                        payload_crc: loc.payload_crc,
                    };
                    send_blocking(&tx, Ok(crate::repl::msg::encode(&head)))?;
                }
                if !piece.is_empty() {
                    send_blocking(&tx, Ok(piece.to_vec()))?;
                }
                Ok::<(), LogError>(())
            });
            if let Err(e) = read {
                let _ = tx.blocking_send(Err(e.to_string()));
            }
        });
        let mut sent_any = false;
        while let Some(item) = rx.recv().await {
            match item {
                Ok(bytes) => {
                    sent_any = true;
                    send.write_all(&bytes).await?;
                }
                Err(e) if !sent_any => return Ok(FrameSent::Nothing(e)),
                // The frame failed after its head was sent: cut the stream so
                // the client never takes a short frame for a whole one.
                Err(_) => {
                    let _ = send.reset(3u32.into());
                    return Ok(FrameSent::Cut);
                }
            }
        }
        Ok(FrameSent::Whole)
    }
}

/// Frames through `seq`, `bytes` more of log, are durable here: the twin
/// sessions ship them.
fn publish(head: &watch::Sender<(u64, u64)>, seq: u64, bytes: u64) {
    head.send_modify(|(head, total)| {
        if seq > *head {
            *head = seq;
        }
        *total += bytes;
    });
}

/// A client address from what the promoted twin listens on: an
/// unspecified host is the one its connection came from.
fn advertised(listen: &str, from: std::net::SocketAddr) -> String {
    match listen.parse::<std::net::SocketAddr>() {
        Ok(a) if a.ip().is_unspecified() => {
            std::net::SocketAddr::new(from.ip(), a.port()).to_string()
        }
        _ => listen.to_string(),
    }
}

/// How a frame went out on a client stream.
enum FrameSent {
    Whole,
    /// Nothing was sent: the read failed before the frame's head.
    Nothing(String),
    /// The stream was reset after a partial frame.
    Cut,
}

/// Aborts a task when the scope that started it ends.
struct AbortOnDrop(Option<tokio::task::JoinHandle<()>>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        if let Some(t) = &self.0 {
            t.abort();
        }
    }
}

fn send_blocking<T>(tx: &mpsc::Sender<T>, item: T) -> Result<(), LogError> {
    tx.blocking_send(item)
        .map_err(|_| LogError::Io(std::io::Error::other("the receiver went away")))
}

/// Frames `from..=through` of each range, in order, as their stored bytes:
/// a blocking reader hands pieces over a bounded channel to the stream, so
/// memory is a few pieces whatever a blob's size.
async fn ship_frames(
    log: Arc<Log>,
    mut send: SendStream,
    mut ranges: mpsc::UnboundedReceiver<(u64, u64)>,
) -> Result<(), NetError> {
    let (tx, mut pieces) = mpsc::channel::<bytes::Bytes>(4);
    let reader = tokio::task::spawn_blocking(move || -> Result<(), LogError> {
        // Frames are gathered into buffers of about a piece, so a run of
        // small frames costs one stream write per piece, not two per frame.
        let mut buf = Vec::with_capacity(PIECE);
        let flush = |buf: &mut Vec<u8>| -> Result<(), LogError> {
            if buf.is_empty() {
                return Ok(());
            }
            let out = std::mem::replace(buf, Vec::with_capacity(PIECE));
            send_blocking(&tx, bytes::Bytes::from(out))
        };
        while let Some((from, through)) = ranges.blocking_recv() {
            for seq in from..=through {
                let mut first = true;
                log.read_pieces(seq, PIECE, |loc, piece, _last| {
                    if first {
                        first = false;
                        let header = loc.header();
                        buf.extend_from_slice(&frame_prefix(&header, &loc.meta));
                    }
                    buf.extend_from_slice(piece);
                    if buf.len() >= PIECE {
                        flush(&mut buf)?;
                    }
                    Ok::<(), LogError>(())
                })?;
            }
            // Nothing more queued: what is gathered goes now, not after the
            // next append.
            if ranges.is_empty() {
                flush(&mut buf)?;
            }
        }
        flush(&mut buf)
    });
    while let Some(bytes) = pieces.recv().await {
        send.write_chunk(bytes).await?;
    }
    match reader.await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(NetError::Io(std::io::Error::other(e.to_string()))),
        Err(e) => Err(NetError::Io(std::io::Error::other(e.to_string()))),
    }
}
