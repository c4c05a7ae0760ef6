//! One session with the primary: dialed, followed until it ends, closed
//! with what the writer committed acknowledged. The decisions are the
//! [`TwinCore`]'s; each step here carries its actions and events.

use std::time::Duration;

use quinn::Connection;
use tokio::sync::{mpsc, watch};

use super::ended::Ended;
use super::writer::{self, Written, WRITE_BATCHES};
use super::Twin;
use crate::log::HistoryId;
use crate::net::{self, NetError};
use crate::repl::apply::Write;
use crate::repl::msg::PrimaryMsg;
use crate::repl::verify::Digest;
use crate::repl::{Backoff, StoreHealth, TwinAction, TwinCore, TwinState};

/// How a session ended, besides why: what the next delay depends on.
#[derive(Default)]
pub(super) struct SessionEnd {
    /// How long it streamed (zero: it never did).
    pub(super) streamed: Duration,
    /// What closed the connection, when it was not this side.
    pub(super) closed_by: Option<quinn::ConnectionError>,
}

/// How long a twin promoted at a switchover waits for the old primary to
/// acknowledge its `Promoted` before closing the connection.
const PROMOTED_FLUSH: Duration = Duration::from_secs(2);

/// A verify's digests, computed beside the session.
type Digested = (u64, Result<Vec<Digest>, crate::node::verify::DigestError>);

/// A session's connection, its core and the channels to the tasks and the
/// writer thread beside it.
struct Session<'t> {
    twin: &'t Twin,
    conn: Connection,
    ctl_send: quinn::SendStream,
    core: TwinCore,
    msgs: mpsc::Receiver<Result<PrimaryMsg, NetError>>,
    chunks_tx: mpsc::Sender<Result<Vec<bytes::Bytes>, NetError>>,
    chunks: mpsc::Receiver<Result<Vec<bytes::Bytes>, NetError>>,
    frames_task: Option<tokio::task::JoinHandle<()>>,
    streaming_since: Option<tokio::time::Instant>,
    write_tx: mpsc::Sender<Vec<Write>>,
    written: mpsc::UnboundedReceiver<Written>,
    digest_tx: mpsc::UnboundedSender<Digested>,
    digested: mpsc::UnboundedReceiver<Digested>,
    writer: std::thread::JoinHandle<()>,
    below_floor: bool,
    /// The status's byte counts when the session began, which it adds to.
    received_before: u64,
    frames_before: u64,
    frame_bytes: u64,
    store_health: Option<watch::Receiver<StoreHealth>>,
    /// Reported once streaming starts, then on each change: not per chunk,
    /// which is the loop's pace.
    store_unreported: bool,
}

impl Twin {
    /// One session: dial, follow until it ends, close, and take the
    /// primary's snapshot when the log was below its retention floor.
    pub(super) async fn session(
        &self,
        endpoint: &quinn::Endpoint,
        backoff: &mut Backoff,
        shutdown: &mut watch::Receiver<bool>,
        end: &mut SessionEnd,
    ) -> Result<Ended, NetError> {
        let mut session = Session::open(self, endpoint).await?;
        let result = session.follow(backoff, shutdown).await;
        let (conn, below_floor, counted) = session.close(end).await;
        let result = match (below_floor, self.snapshots()) {
            (true, Some(s)) => Ok(self.take_snapshot(&conn, &s).await),
            _ => result,
        };
        // The snapshot, if one came, arrived on this connection too.
        let (received_before, frames_before, frame_bytes) = counted;
        self.set_status(|s| {
            s.received_bytes = received_before + conn.stats().udp_rx.bytes;
            s.frame_bytes_received = frames_before + frame_bytes;
        });
        conn.close(0u32.into(), b"session over");
        result
    }
}

impl<'t> Session<'t> {
    /// Dial the primary, open the control stream and start the writer.
    async fn open(twin: &'t Twin, endpoint: &quinn::Endpoint) -> Result<Session<'t>, NetError> {
        let view = twin.view().map_err(|e| {
            NetError::Io(std::io::Error::other(format!(
                "this twin's head frame does not read: {e}"
            )))
        })?;
        // A handshake into a dead link would otherwise wait out QUIC's own
        // idle timeout before the next attempt.
        let conn = tokio::time::timeout(
            twin.cfg.timers.idle_timeout,
            net::connect(endpoint, twin.primary),
        )
        .await
        .map_err(|_| NetError::Io(std::io::Error::from(std::io::ErrorKind::TimedOut)))??;
        let (ctl_send, ctl_recv) = conn.open_bi().await?;
        let core = TwinCore::new(twin.cfg.timers, view, crate::node::clock::now());
        let (msgs_tx, msgs) = mpsc::channel(64);
        tokio::spawn(net::forward_msgs(ctl_recv, msgs_tx));
        let (chunks_tx, chunks) = mpsc::channel::<Result<Vec<bytes::Bytes>, NetError>>(8);
        let (write_tx, write_rx) = mpsc::channel::<Vec<Write>>(WRITE_BATCHES);
        let (written_tx, written) = mpsc::unbounded_channel::<Written>();
        let (digest_tx, digested) = mpsc::unbounded_channel::<Digested>();
        let writer = {
            let log = twin.log.clone();
            // Named: spawned from a runtime worker, it would carry the
            // worker's name in profiles and `top -H`.
            std::thread::Builder::new()
                .name("twin-writer".into())
                .spawn(move || writer::write_frames(&log, write_rx, written_tx))?
        };
        let (received_before, frames_before) = {
            let s = twin.status.lock().unwrap_or_else(|e| e.into_inner());
            (s.received_bytes, s.frame_bytes_received)
        };
        Ok(Session {
            twin,
            conn,
            ctl_send,
            core,
            msgs,
            chunks_tx,
            chunks,
            frames_task: None,
            streaming_since: None,
            write_tx,
            written,
            digest_tx,
            digested,
            writer,
            below_floor: false,
            received_before,
            frames_before,
            frame_bytes: 0,
            store_health: twin.store().map(|s| s.watch_health()),
            store_unreported: true,
        })
    }

    /// Follow until the core closes the session, the link fails, or
    /// `shutdown` turns true; answers why it ended.
    async fn follow(
        &mut self,
        backoff: &mut Backoff,
        shutdown: &mut watch::Receiver<bool>,
    ) -> Result<Ended, NetError> {
        loop {
            self.report_store();
            self.transmit().await?;
            if let Some(why) = self.act().await {
                let _ = self.ctl_send.finish();
                return Ok(why);
            }
            self.start_streaming(backoff);
            self.show_progress();
            if let Some(ended) = self.next_event(shutdown).await {
                return ended;
            }
        }
    }

    /// The store's health, to the core once streaming and on each change.
    fn report_store(&mut self) {
        if self.store_unreported && self.core.state() == TwinState::Streaming {
            if let Some(rx) = &self.store_health {
                self.core.report_store(rx.borrow().clone());
            }
            self.store_unreported = false;
        }
    }

    /// Send what the core has queued for the primary.
    async fn transmit(&mut self) -> Result<(), NetError> {
        while let Some(m) = self.core.poll_transmit() {
            net::write_msg(&mut self.ctl_send, &m).await?;
            crate::budget::mark(crate::budget::Stage::TwinAckSent);
        }
        Ok(())
    }

    /// Send what the core has queued, giving up at the first failure: the
    /// session is ending either way.
    async fn transmit_last(&mut self) {
        while let Some(m) = self.core.poll_transmit() {
            if net::write_msg(&mut self.ctl_send, &m).await.is_err() {
                break;
            }
        }
    }

    /// Send all the core has queued, each message tried even when one
    /// before it failed.
    async fn transmit_regardless(&mut self) {
        while let Some(m) = self.core.poll_transmit() {
            let _ = net::write_msg(&mut self.ctl_send, &m).await;
        }
    }

    /// Carry out the core's actions; answers why the session closes, when
    /// one of them closes it.
    async fn act(&mut self) -> Option<Ended> {
        let twin = self.twin;
        let mut closed = None;
        while let Some(action) = self.core.poll_action() {
            match action {
                TwinAction::AdoptHistory(h) => {
                    if let Err(e) = twin.log.adopt_history(HistoryId(h)) {
                        closed = Some(Ended::AdoptHistory(e));
                    }
                }
                TwinAction::AdoptEpochs(h) => {
                    let epoch = h.current();
                    if let Err(err) = twin.epochs.update(|s| {
                        s.follow(h);
                        Ok(())
                    }) {
                        closed = Some(Ended::RecordEpoch { epoch, error: err });
                    }
                }
                TwinAction::BelowFloor {
                    first,
                    primary_head,
                } => {
                    self.below_floor = true;
                    twin.set_status(|s| s.below_floor = true);
                    closed = Some(Ended::BelowFloor {
                        first,
                        primary_head,
                    });
                }
                TwinAction::CutAfter { after, crc } => {
                    // The Close that follows ends this session; the next
                    // Hello reports the cut log.
                    if let Err(e) = twin.cut_lost(after, crc).await {
                        tracing::error!(after, error = %e, "cutting the frames the primary lost");
                        twin.set_status(|s| s.last_error = Some(e.to_string()));
                    }
                }
                TwinAction::Digest { id, ask, mib_per_s } => {
                    let (log, epochs, tx) = (
                        twin.log.clone(),
                        twin.epochs.history(),
                        self.digest_tx.clone(),
                    );
                    tokio::spawn(async move {
                        let rate = crate::node::verify::verify_rate(mib_per_s);
                        let d = crate::node::verify::digests(log, epochs, ask, rate).await;
                        let _ = tx.send((id, d.map(|(d, _)| d)));
                    });
                }
                TwinAction::Close(why) => {
                    twin.set_status(|s| s.refusal = Some(why.clone()));
                    closed = Some(Ended::Refused(why));
                }
                TwinAction::Promote { head, clients } => {
                    closed = Some(self.promote(head, clients).await);
                }
            }
        }
        closed
    }

    /// A switchover hands this box the primary's role: run the handover
    /// and tell the old primary how it went; answers why the session ends.
    async fn promote(&mut self, head: u64, clients: Vec<crate::repl::HandedClient>) -> Ended {
        let twin = self.twin;
        let hook = twin
            .handover
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let done = match hook {
            Some(h) => h(head, clients),
            None => Err(super::HandoverFailed::NotSet),
        };
        match done {
            Ok((epoch, listen)) => {
                tracing::warn!(epoch = %crate::repl::epochs::EpochName(epoch), head, %listen, "switchover: this box is the primary now");
                self.core.promoted(twin.epochs.history(), listen);
                self.transmit_regardless().await;
                twin.promoted.send_replace(true);
                Ended::Promoted { epoch }
            }
            Err(e) => {
                // Nothing changed here: the old primary may take writes
                // again.
                self.core
                    .handover_refused(format!("the twin's promotion failed: {e}"));
                self.transmit_regardless().await;
                Ended::PromotionFailed(e)
            }
        }
    }

    /// Once the core streams: read the frame stream and show the link up.
    fn start_streaming(&mut self, backoff: &mut Backoff) {
        if self.core.state() == TwinState::Streaming && self.frames_task.is_none() {
            backoff.reset();
            self.twin.set_status(|s| {
                s.connected = true;
                s.below_floor = false;
                s.refusal = None;
            });
            self.frames_task = Some(tokio::spawn(writer::read_frames(
                self.conn.clone(),
                self.chunks_tx.clone(),
            )));
            self.streaming_since = Some(crate::node::clock::instant());
        }
    }

    /// The status's view of the primary and the bytes received.
    fn show_progress(&self) {
        let (core, conn) = (&self.core, &self.conn);
        let (received_before, frames_before, frame_bytes) =
            (self.received_before, self.frames_before, self.frame_bytes);
        self.twin.set_status(|s| {
            s.primary_head = core.primary_head().0;
            s.lag_frames = core.lag_frames();
            s.received_bytes = received_before + conn.stats().udp_rx.bytes;
            s.frame_bytes_received = frames_before + frame_bytes;
        });
    }

    /// Wait for the next event and hand it to the core; answers how the
    /// session ended when the event ends it.
    async fn next_event(
        &mut self,
        shutdown: &mut watch::Receiver<bool>,
    ) -> Option<Result<Ended, NetError>> {
        let deadline = crate::node::clock::wake_at(self.core.poll_timeout());
        tokio::select! {
            msg = self.msgs.recv() => match msg {
                Some(Ok(m)) => {
                    self.twin.heard_primary();
                    self.core.handle_message(m, crate::node::clock::now())
                }
                Some(Err(e)) => return Some(Err(e)),
                None => return Some(Ok(Ended::ControlClosed)),
            },
            chunk = self.chunks.recv() => match chunk {
                // A refusal is queued in the core and ends the session.
                Some(Ok(read)) => {
                    self.frame_bytes += read.iter().map(|b| b.len() as u64).sum::<u64>();
                    let _ = writer::feed(&mut self.core, &read, &self.write_tx).await;
                }
                Some(Err(e)) => return Some(Err(e)),
                None => return Some(Ok(Ended::FrameStreamOver)),
            },
            Some((id, d)) = self.digested.recv() => self.core.digests(id, d),
            done = self.written.recv() => match done {
                Some(done) => self.handle_written(done),
                None => return Some(Ok(Ended::WriterStopped)),
            },
            _ = tokio::time::sleep_until(deadline) => {
                self.core.handle_timeout(crate::node::clock::now())
            }
            changed = async {
                match self.store_health.as_mut() {
                    Some(rx) => rx.changed().await.is_ok(),
                    None => std::future::pending().await,
                }
            } => {
                self.store_unreported = changed;
                if !changed {
                    self.store_health = None;
                }
            }
            _ = shutdown.changed() => return Some(Ok(Ended::ShuttingDown)),
        }
        None
    }

    /// What the writer thread did, to the core.
    fn handle_written(&mut self, done: Written) {
        match done {
            Written::Committed(seq) => self.core.handle_committed(seq),
            Written::Synced(head) => self.synced(head),
            Written::CommittedSynced { committed, synced } => {
                self.core.handle_committed(committed);
                match synced {
                    Ok(head) => self.synced(head),
                    Err(e) => self.core.handle_commit_failed(&e),
                }
            }
            Written::Failed(e) => self.core.handle_commit_failed(&e),
        }
    }

    fn synced(&mut self, head: u64) {
        self.core.handle_synced(head);
        self.twin.durable.send_replace(head);
    }

    /// End the session: the writer finishes and its last sync is
    /// acknowledged while the link carries it. Answers the connection,
    /// whether the log was below the primary's floor, and the byte counts.
    async fn close(mut self, end: &mut SessionEnd) -> (Connection, bool, (u64, u64, u64)) {
        if let Some(t) = self.frames_task.take() {
            t.abort();
        }
        end.streamed = self.streaming_since.map_or(Duration::ZERO, |t| t.elapsed());
        // Before this side closes it: what the peer or the transport did.
        end.closed_by = self.conn.close_reason();
        // The writer aborts a partial frame and syncs what it committed, so
        // the next Hello reports it; it ends once its sender is dropped,
        // here by putting one that is never used in its place.
        let (idle_tx, _) = mpsc::channel(1);
        drop(std::mem::replace(&mut self.write_tx, idle_tx));
        while let Some(done) = self.written.recv().await {
            self.handle_written(done);
        }
        self.transmit_last().await;
        let _ = self.ctl_send.finish();
        // After a switchover's `Promoted`, the old primary must hear it
        // before the connection closes (and this process execs the
        // primary): a close discards stream data not yet delivered, and
        // the old primary would then time the switchover out and fence
        // itself, knowing no new primary to name.
        if *self.twin.promoted.borrow() {
            let _ = tokio::time::timeout(PROMOTED_FLUSH, self.ctl_send.stopped()).await;
        }
        let writer = self.writer;
        let _ = tokio::task::spawn_blocking(move || writer.join()).await;
        self.twin.durable.send_replace(self.twin.log.head_seq());
        (
            self.conn,
            self.below_floor,
            (self.received_before, self.frames_before, self.frame_bytes),
        )
    }
}
