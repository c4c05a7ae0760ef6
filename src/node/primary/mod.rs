//! The primary: a log, its twin connection and its clients on one QUIC
//! endpoint. The replication decisions are [`PrimaryCore`]'s; this moves
//! bytes between it, the log and the network.
//!
//! Here: the state, its status, the endpoint and each connection's role.
//! `twin_session` serves the twin's connection, `requests` a client's,
//! `pipeline` a client's piped requests, `store_requests` the store's and
//! `answer` what is sent back in pieces; `appender` is the thread small
//! appends queue to. What one client may hold is bounded and shared
//! fairly: `seats` (connections), `shares` (memory and staging space),
//! `body` (a body's deadlines), `stage` (bodies staged before any writer
//! is taken) and `pool` (blocking threads); `refusals` counts what
//! clients were refused. `retain`, `switchover` and `twin_seat` are the
//! rest of the lifecycle.
//!
//! Owns the primary's endpoint, sessions and retention. May not touch: the
//! replication and switchover rules (the cores in [`crate::repl`]), the
//! twin's side, or the failover files (those are [`super::failover`]'s).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use quinn::{Connection, RecvStream, SendStream};
use tokio::sync::{mpsc, watch};

use super::api::{ApiError, ClientRole, Durability, Request, Response, Status};
use super::epoch::Epochs;
use super::refusal::{ReadRefusal, WriteRefusal};
use super::snapshot_transfer::{self as snapshot, SnapshotSource};
use super::store_host::StoreHost;
use crate::log::{Error as LogError, Log};
use crate::net::{self, NetError, Pins, Role};
use crate::repl::apply;
use crate::repl::{PrimaryAction, PrimaryCore, PrimaryState, PrimaryView, Timers, TwinMsg};
use retention::Retention;

mod answer;
mod appender;
mod arbiter_hold;
mod body;
mod once;
mod pipeline;
mod pool;
mod refusals;
mod requests;
mod retain;
pub mod retention;
mod seats;
mod shares;
mod stage;
mod store_requests;
mod switchover;
mod twin_answers;
mod twin_seat;
mod twin_session;
mod verify;

use twin_session::publish;

pub use arbiter_hold::ArbiterShown;
pub use pool::CLIENT_THREADS;
pub use seats::{ADMIN_RESERVE, CLOSE_RECLAIMED};
pub use shares::Split;

/// Appends up to this size are read whole and appended in one call (and
/// share fdatasyncs with concurrent appends); larger blobs stream.
const SMALL_BLOB: u64 = 1 << 20;
/// The largest single charge to the memory budget: a control document
/// read whole. One client's share is never less.
const LARGEST_CHARGE: u64 = crate::store::frames::MAX_DOC_BYTES;

/// A client being served: who it is, in which role, its parts of the
/// memory budget and of the staging space, and what its connection is
/// doing.
#[derive(Clone)]
pub(super) struct Caller {
    holder: shares::Holder,
    memory: shares::Share,
    staging: shares::Share,
    activity: Arc<seats::Activity>,
}
/// The piece a frame's blob moves in.
pub const PIECE: usize = 256 * 1024;

pub use crate::repl::ack::TwinPolicy;

/// How the primary runs.
#[derive(Clone, Copy, Debug)]
pub struct PrimaryOptions {
    pub policy: TwinPolicy,
    pub timers: Timers,
    /// This primary's epoch (raised by each promotion).
    pub epoch: u64,
    /// The longest a client may leave a request's body without sending a
    /// byte: past it the request is cut off (`BodyStalled`), so no client
    /// holds the log's writer or the store.
    pub body_piece_deadline: Duration,
    /// The memory request bodies and answers in hand may hold together
    /// (see `shares`).
    pub memory_budget: u64,
    /// Connections of non-admin clients served at once (see `seats`);
    /// more are closed at once (`CLOSE_TOO_MANY`). The twin is never
    /// counted.
    pub max_clients: usize,
    /// The largest body a request may carry past 1 MiB, staged whole
    /// before the log's writer or the store is taken (see `stage`).
    pub stage_max_body: u64,
    /// The disk space staged bodies share.
    pub staging_space: u64,
}

impl Default for PrimaryOptions {
    fn default() -> Self {
        PrimaryOptions {
            policy: TwinPolicy::Wait,
            timers: Timers::default(),
            epoch: 0,
            body_piece_deadline: body::DEFAULT_PIECE_DEADLINE,
            memory_budget: shares::DEFAULT_BUDGET_BYTES,
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
    switch: Arc<switchover::Switch>,
    /// The memory requests hold, bounded and shared.
    budget: shares::Shares,
    /// Where streamed bodies wait, whole, for their writer.
    staging: stage::Staging,
    /// Client connections open now, bounded and shared.
    seats: seats::Seats,
    /// The blocking threads clients' requests may take.
    pool: pool::ClientPool,
    /// What clients were refused, by name.
    refusals: refusals::Refusals,
    log: Arc<Log>,
    pins: Arc<Pins>,
    cfg: PrimaryOptions,
    /// The head the twin sessions ship through, and the bytes appended
    /// through it: frames are announced here once staged, before they are
    /// durable, so that shipping overlaps the local sync.
    head: watch::Sender<(u64, u64)>,
    /// The durable (published) head, for readers of the log.
    durable: watch::Sender<u64>,
    /// Frames staged and shipped before they are durable.
    in_hand: Arc<crate::repl::in_hand::InHand>,
    /// On a promoted box, the call to the primary it replaced.
    predecessor: Arc<Mutex<Option<crate::node::predecessor::PredecessorStatus>>>,
    /// Turns true while a twin streams.
    twin_streams: watch::Sender<bool>,
    /// Where a verify's questions go: the twin session that streams.
    verifier: Mutex<Option<tokio::sync::mpsc::UnboundedSender<verify::VerifyCall>>>,
    /// The last verify's report.
    last_verify: Mutex<Option<crate::node::verify::VerifyReport>>,
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
    /// The archive, when on: retention drops only what it holds.
    archive: Mutex<Option<Arc<crate::archive::archiver::Archiver>>>,
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
    /// The one path of small appends: a thread they queue to (when it
    /// could not start, the same steps on a blocking task per append).
    appender: appender::Appender,
    /// `twin` appends durable here, parked until the twin session's next
    /// turn.
    twin_answers: Arc<twin_answers::TwinAnswers>,
    /// The ids of frames appended once, read from the log at the start
    /// of this life.
    ids: Arc<Mutex<once::AppendIds>>,
    /// Warnings of refused client connections and handshakes, at most one
    /// a second.
    seat_refusals: net::Throttle,
    handshake_refusals: net::Throttle,
    /// Under automatic failover: this life's lease, which every
    /// acknowledgement needs, and its sync record.
    arbiter: std::sync::OnceLock<arbiter_hold::Held>,
}

/// The lag a twin session left, to grow from while the twin is away.
#[derive(Clone, Copy)]
struct LagAtEnd {
    at: tokio::time::Instant,
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
    /// The ids of the frames appended once among the log's newest: read
    /// at the start of each life, a promoted twin's too.
    fn read_ids(log: &Log) -> once::AppendIds {
        let started = crate::node::clock::instant();
        match once::AppendIds::read(log, once::KEPT) {
            Ok(ids) => {
                tracing::info!(
                    ids = ids.len(),
                    from = ids.horizon(),
                    ms = started.elapsed().as_millis() as u64,
                    "read the ids of appends made once"
                );
                ids
            }
            Err(e) => {
                tracing::error!(error = %e, "the ids of appends made once could not be read: a retry of an append sent before now is refused, not written twice");
                once::AppendIds::from_past(log.head_seq(), once::KEPT)
            }
        }
    }

    pub fn new(log: Arc<Log>, pins: Arc<Pins>, cfg: PrimaryOptions) -> Arc<Primary> {
        Self::with_store(log, pins, cfg, None)
    }

    /// A primary that keeps `store` (opened on `log`) and serves the store
    /// requests.
    pub fn with_store(
        log: Arc<Log>,
        pins: Arc<Pins>,
        cfg: PrimaryOptions,
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
        cfg: PrimaryOptions,
        store: Option<Arc<StoreHost>>,
        epochs: Arc<Epochs>,
    ) -> Arc<Primary> {
        let head_seq = log.head_seq();
        let twin_configured = pins.has_role(Role::Twin);
        let head = watch::channel((head_seq, 0)).0;
        let durable = watch::channel(head_seq).0;
        let in_hand = Arc::new(crate::repl::in_hand::InHand::default());
        let ids = Arc::new(Mutex::new(Self::read_ids(&log)));
        let twin_answers = Arc::new(twin_answers::TwinAnswers::default());
        let appender = {
            let (head, durable) = (head.clone(), durable.clone());
            appender::Appender::start(
                log.clone(),
                in_hand.clone(),
                ids.clone(),
                twin_answers.clone(),
                move |seq, bytes| publish(&head, seq, bytes),
                move |seq| {
                    durable.send_if_modified(|d| std::mem::replace(d, seq.max(*d)) < seq);
                },
            )
        };
        Arc::new(Primary {
            epochs,
            twin_configured,
            switch: Default::default(),
            budget: shares::Shares::new(Split::of(
                cfg.memory_budget,
                (cfg.memory_budget / 4).max(LARGEST_CHARGE),
            )),
            staging: stage::Staging::new(log.dir(), cfg.stage_max_body, cfg.staging_space),
            seats: seats::Seats::new(cfg.max_clients),
            pool: Default::default(),
            refusals: Default::default(),
            log,
            pins,
            cfg,
            head,
            durable,
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
            archive: Mutex::new(None),
            twin_first: std::sync::atomic::AtomicU64::new(0),
            lag_at_end: Mutex::new(None),
            twin_waiting: std::sync::atomic::AtomicU64::new(0),
            client_roles: Mutex::new(std::collections::HashMap::new()),
            ack_delay: Default::default(),
            twin_seat: Default::default(),
            ids,
            appender,
            twin_answers,
            in_hand,
            predecessor: Default::default(),
            twin_streams: watch::channel(false).0,
            verifier: Mutex::new(None),
            last_verify: Mutex::new(None),
            seat_refusals: Default::default(),
            handshake_refusals: Default::default(),
            arbiter: std::sync::OnceLock::new(),
        })
    }

    /// Call the primary this box replaced until it heard of this box's
    /// epoch ([`crate::node::predecessor`]), shown in `status`.
    pub fn call_predecessor(
        &self,
        caller: crate::node::predecessor::Caller,
        file: crate::node::predecessor::PredecessorFile,
        shutdown: watch::Receiver<bool>,
    ) -> tokio::task::JoinHandle<()> {
        let status = self.predecessor.clone();
        let streams = self.twin_streams.subscribe();
        tokio::spawn(caller.run(file, status, streams, shutdown))
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

    /// The durable head as it moves.
    pub fn watch_durable(&self) -> watch::Receiver<u64> {
        self.durable.subscribe()
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
        s.client_connections = self.seats.count() as u64;
        s.client_requests = *self.inflight.borrow() as u64;
        s.refusals = self.refusals.snapshot();
        s.unpinned_refused = self.pins.refused_total();
        s.arbiter = self.arbiter_shown();
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
            epoch: epochs.newest(),
            by: epochs.fenced_by.clone().unwrap_or_default(),
            held: epochs.held.is_some(),
        });
        s.predecessor = self
            .predecessor
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        s.last_verify = self
            .last_verify
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        s.twin_configured = self.twin_configured;
        s.archive = self.archive().map(|a| a.status());
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
                            Err(e) => {
                                if let Some(n) = me.handshake_refusals.allow(Duration::from_secs(1)) {
                                    tracing::warn!(error = %e, refused = n, "handshake refused");
                                }
                            }
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
        // A connection still draining (a peer that gave up a handshake
        // half-way leaves one until its idle timeout) would hold the
        // listening port past this return: a primary started again in
        // the same process could not bind it. The endpoint moves to a
        // throwaway port for what is left of its life.
        match std::net::UdpSocket::bind((std::net::Ipv4Addr::LOCALHOST, 0)) {
            Ok(spare) => {
                if let Err(e) = endpoint.rebind(spare) {
                    tracing::warn!(error = %e, "releasing the listening port");
                }
            }
            Err(e) => tracing::warn!(error = %e, "releasing the listening port"),
        }
    }

    /// Serve a connection accepted before this node served (a client
    /// that dialled while the primary waited for its life).
    pub fn adopt(self: Arc<Self>, conn: Connection) {
        tokio::spawn(self.connection(conn));
    }

    async fn connection(self: Arc<Self>, conn: Connection) {
        let peer = match net::peer(&conn, &self.pins) {
            Ok(p) => p,
            Err(e) => {
                if let Some(n) = self.handshake_refusals.allow(Duration::from_secs(1)) {
                    tracing::warn!(error = %e, refused = n, "connection without a pinned peer");
                }
                return conn.close(1u32.into(), b"not pinned");
            }
        };
        if peer.1 != Role::Client {
            tracing::info!(peer = %peer.0, role = ?peer.1, addr = %conn.remote_address(), "connected");
        }
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
                self.twin_streams.send_replace(false);
                let mut s = lock(&self.status);
                s.twin_connected = false;
                s.twin_last_error = Some(why);
                *self.lag_at_end.lock().unwrap_or_else(|e| e.into_inner()) = Some(LagAtEnd {
                    at: crate::node::clock::instant(),
                    bytes_appended: self.head.borrow().1,
                    lag_bytes: s.lag_bytes,
                    lag_ms: s.lag_ms,
                });
            }
            Role::Client => {
                let (fp, _) = peer;
                let name: Arc<str> = fp.to_string().into();
                // A client pinned through `Pins` alone, by a library user,
                // is an admin; the daemon names every client's role.
                let role = self
                    .client_roles
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .get(&fp)
                    .copied()
                    .unwrap_or(ClientRole::Admin);
                let (seat, reclaimed) = match self.seats.take(&name, role, &conn) {
                    Ok(seated) => seated,
                    Err(why) => {
                        self.refusals.note(why.name());
                        if let Some(n) = self.seat_refusals.allow(Duration::from_secs(1)) {
                            tracing::warn!(client = %name, %role, refused = n, "client connection refused: {why}");
                        }
                        return conn.close(net::CLOSE_TOO_MANY.into(), why.to_string().as_bytes());
                    }
                };
                if reclaimed {
                    self.refusals.note(refusals::Cut::Reclaimed.name());
                }
                tracing::debug!(client = %name, %role, addr = %conn.remote_address(), "client connected");
                let holder = shares::Holder { name, role };
                let caller = Caller {
                    memory: self.budget.share(&holder),
                    staging: self.staging.share(&holder),
                    holder,
                    activity: seat.activity.clone(),
                };
                self.clone().client_session(conn, caller).await;
                drop(seat);
            }
            other => conn.close(
                2u32.into(),
                format!("{other:?} is not served here").as_bytes(),
            ),
        }
    }
}
