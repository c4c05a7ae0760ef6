//! The twin's connection: the handshake, shipping frames as the core
//! asks, and what its acknowledgements and messages change here.

use super::*;
use crate::repl::primary::{hold_update, HoldUpdate};

impl Primary {
    /// The append path publishes here so twin sessions ship the new frames.
    pub(super) fn published(&self, seq: u64, bytes: u64) {
        publish(&self.head, seq, bytes);
        self.durable
            .send_if_modified(|d| std::mem::replace(d, seq.max(*d)) < seq);
    }

    pub(super) async fn twin_session(
        self: Arc<Self>,
        conn: &Connection,
    ) -> Result<String, NetError> {
        let _parks = self.twin_answers.session();
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
        if let TwinMsg::AskEpochs(word) = &hello {
            // The other box asks for this log's epochs: etcd forgot, and
            // it leads only with both histories in hand.
            tracing::info!(?word, "the other box asked for this primary's epochs");
            // Its history came over the pinned link, as a hello's does: a
            // newer epoch there fences this primary (etcd was rolled back
            // past that epoch's take, and this box took a life below it).
            let asking = word.epochs.current();
            if asking > self.epochs.current() {
                self.fence(asking, "the other box, asking for this log's epochs");
            }
            let answer = crate::repl::amnesia::PeerWord {
                epochs: self.epochs.history(),
                head: self.log.head_seq(),
                newest: self.epochs.newest(),
                primary: true,
            };
            net::write_msg(&mut ctl_send, &crate::repl::PrimaryMsg::Epochs(answer)).await?;
            let _ = ctl_send.finish();
            let _ = ctl_send.stopped().await;
            return Ok("answered a question for this primary's epochs".into());
        }
        if let TwinMsg::Hello { first, head, .. } = &hello {
            // Before any acknowledgement of this session wakes a waiter.
            let holds_from = crate::repl::primary::twin_holds_from(*first, head.seq);
            self.twin_first
                .store(holds_from, std::sync::atomic::Ordering::SeqCst);
        }
        // Before the view: a frame announced between the view and the loop
        // below would otherwise never reach this session's core.
        let mut head_rx = self.head.subscribe();
        let mut seen_bytes = head_rx.borrow_and_update().1;
        // Frames are shipped before they are durable here: the head the
        // handshake compares with must cover every frame shipped to any
        // session before, or this twin's copy of them would look lost.
        let log = self.log.clone();
        match tokio::task::spawn_blocking(move || log.sync()).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => return Ok(format!("syncing the log before the handshake: {e}")),
            Err(e) => return Ok(format!("syncing the log before the handshake: {e}")),
        }
        let view = PrimaryView {
            history: self.log.history().0,
            head: self.log.head_seq(),
            first: self.log.first_seq(),
            epochs: self.epochs.history(),
        };
        let head = view.head;
        let mut core = PrimaryCore::new(self.cfg.timers, view, crate::node::clock::now());
        tracing::info!(?hello, head, "twin hello");
        core.handle_hello(
            hello,
            |seq| apply::head_frame(&self.log, seq),
            crate::node::clock::now(),
        );
        if core.state() == PrimaryState::Streaming {
            lock(&self.status).twin_refusal = None;
            // The twin follows this primary's epoch: it was not promoted
            // while this box was down, and a start held for that proof
            // serves now.
            match self.epochs.twin_said_hello() {
                Ok(true) => {
                    tracing::info!("the twin said hello at this primary's epoch: held start lifted")
                }
                Ok(false) => {}
                Err(e) => tracing::error!(error = %e, "lifting the held start"),
            }
        }

        let (msgs_tx, mut msgs) = mpsc::channel(64);
        tokio::spawn(net::forward_msgs(ctl_recv, msgs_tx));
        // Further streams the twin opens ask for the snapshot.
        let snapshot_server = self
            .snapshot_source()
            .map(|source| tokio::spawn(snapshot::serve_requests(source, conn.clone())));
        let _stop_serving = AbortOnDrop(snapshot_server);
        let mut ship: Option<mpsc::UnboundedSender<(u64, u64)>> = None;
        let mut shipper = None;
        let mut handover = self.switch.handover.subscribe();
        // A handover asked of this session and not sent yet: the core may
        // not have seen the last appends announced.
        let mut asked: Option<(u64, Vec<crate::repl::HandedClient>)> =
            handover.borrow_and_update().clone();
        // The twin's position is what it says at the handshake
        // (`hold_update`).
        let mut handshake = true;
        // Verify questions, once this session streams, and their answers
        // by id.
        let mut questions =
            (core.state() == PrimaryState::Streaming).then(|| self.verify_questions());
        let mut answers: std::collections::HashMap<u64, verify::VerifyReply> = Default::default();
        let mut next_question = 0u64;
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
                            shipper = Some(tokio::spawn(ship_frames(
                                self.log.clone(),
                                self.in_hand.clone(),
                                frames,
                                rx,
                            )));
                            ship = Some(tx);
                        }
                        if let Some(tx) = &ship {
                            let _ = tx.send((from, through));
                        }
                    }
                    PrimaryAction::Acked(durable) => {
                        crate::budget::mark(crate::budget::Stage::AckReceived);
                        tracing::debug!(durable, "twin acknowledged");
                        let seq_cst = std::sync::atomic::Ordering::SeqCst;
                        match hold_update(durable, std::mem::take(&mut handshake)) {
                            HoldUpdate::Set(hold) => self.hold.store(hold, seq_cst),
                            HoldUpdate::Raise(hold) => {
                                self.hold.fetch_max(hold, seq_cst);
                            }
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
                        let at = crate::node::api::NewPrimary { addr, fingerprint };
                        self.switch.deposed.send_replace(Some(at.clone()));
                        self.switch.tell(switchover::Heard::Promoted { epoch, at });
                    }
                    PrimaryAction::Digests { id, digests, error } => {
                        if let Some(reply) = answers.remove(&id) {
                            let _ = reply.send(match error {
                                Some(e) => Err(e),
                                None => Ok(digests),
                            });
                        }
                    }
                    PrimaryAction::HandoverRefused(why) => {
                        tracing::warn!(why, "the twin refused the handover");
                        self.switch.tell(switchover::Heard::Refused(
                            switchover::NoHandover::TwinRefused(why),
                        ));
                    }
                    PrimaryAction::Fence { epoch } => {
                        let by = format!(
                            "its twin at {}, which follows epoch {}",
                            conn.remote_address(),
                            crate::repl::epochs::EpochName(epoch)
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
                        let said = why.to_string();
                        lock(&self.status).twin_refusal = Some(why);
                        return Ok(said);
                    }
                }
            }
            if let Some((head, clients)) = asked.take() {
                if core.handover(head, clients.clone()) {
                    // Sent with the core's other messages, at the top of
                    // the loop.
                    self.switch.tell(switchover::Heard::Sent);
                    continue;
                } else if core.state() != PrimaryState::Streaming
                    || core.acked() < head
                    || core.status(crate::node::clock::now()).head > head
                {
                    // Not streaming, or the twin is behind the head, or a
                    // frame came past the head handed over: the switchover
                    // must look again.
                    tracing::warn!(head, "this twin session cannot take the handover");
                    self.switch
                        .tell(switchover::Heard::Refused(switchover::NoHandover::NotSent));
                } else {
                    // The core has not seen the head announced yet.
                    asked = Some((head, clients));
                }
            }
            {
                let now = crate::node::clock::now();
                let st = core.status(now);
                let streaming = core.state() == PrimaryState::Streaming;
                self.twin_streams
                    .send_if_modified(|s| std::mem::replace(s, streaming) != streaming);
                let mut s = lock(&self.status);
                s.twin_connected = streaming;
                s.lag_frames = st.lag_frames;
                s.lag_bytes = st.lag_bytes;
                s.lag_ms = st.lag.as_millis() as u64;
                drop(s);
                // Whatever woke this turn, the appends parked since go back
                // to their requests, which find the twin's answer here.
                self.twin_answers.turn(*self.acked.borrow(), streaming);
            }
            let deadline = crate::node::clock::wake_at(core.poll_timeout());
            tokio::select! {
                msg = msgs.recv() => match msg {
                    Some(Ok(m)) => core.handle_message(m, crate::node::clock::now()),
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
                    core.handle_appended(head, bytes - seen_bytes, crate::node::clock::now());
                    seen_bytes = bytes;
                }
                _ = tokio::time::sleep_until(deadline) => core.handle_timeout(crate::node::clock::now()),
                Some((ask, mib_per_s, reply)) = async {
                    match questions.as_mut() {
                        Some(q) => q.recv().await,
                        None => std::future::pending().await,
                    }
                } => {
                    next_question += 1;
                    if core.verify(next_question, ask, mib_per_s) {
                        answers.insert(next_question, reply);
                    } else {
                        let _ = reply.send(Err("the twin does not stream".into()));
                    }
                }
                changed = handover.changed() => {
                    if changed.is_ok() {
                        asked = handover.borrow_and_update().clone();
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
    pub(super) fn fence(&self, epoch: u64, by: &str) {
        match self.epochs.hear(epoch, by) {
            Ok(true) => tracing::error!(
                epoch = %crate::repl::epochs::EpochName(epoch),
                by,
                serving = %crate::repl::epochs::EpochName(self.epochs.current()),
                "FENCED: a newer epoch exists, so another box is primary; this box acknowledges no write from now on (reads go on). Rejoin it as the new primary's twin: primary rejoin"
            ),
            Ok(false) => {}
            Err(e) => {
                tracing::error!(epoch = %crate::repl::epochs::EpochName(epoch), by, error = %e, "FENCED in memory only: recording the fence failed")
            }
        }
    }

    pub(super) fn twin_acked(&self, durable: u64) {
        let moved = self.acked.send_if_modified(|a| {
            let moved = durable > *a;
            *a = (*a).max(durable);
            moved
        });
        if moved {
            lock(&self.status).twin_acks += 1;
        }
        if crate::repl::ack::caught_up(durable, self.log.head_seq()) {
            let mut s = lock(&self.status);
            if s.degraded {
                s.degraded = false;
                tracing::info!(durable, "the twin caught up: twin durability restored");
            }
        }
    }
}

/// Frames through `seq`, `bytes` more of log, are durable here: the twin
/// sessions ship them.
pub(super) fn publish(head: &watch::Sender<(u64, u64)>, seq: u64, bytes: u64) {
    head.send_modify(|(head, total)| {
        if seq > *head {
            *head = seq;
        }
        *total += bytes;
    });
}

/// A client address from what the promoted twin listens on: an
/// unspecified host is the one its connection came from.
pub(super) fn advertised(listen: &str, from: std::net::SocketAddr) -> String {
    match listen.parse::<std::net::SocketAddr>() {
        Ok(a) if a.ip().is_unspecified() => {
            std::net::SocketAddr::new(from.ip(), a.port()).to_string()
        }
        _ => listen.to_string(),
    }
}

/// Aborts a task when the scope that started it ends.
pub(super) struct AbortOnDrop(Option<tokio::task::JoinHandle<()>>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        if let Some(t) = &self.0 {
            t.abort();
        }
    }
}

pub(super) fn send_blocking<T>(tx: &mpsc::Sender<T>, item: T) -> Result<(), LogError> {
    tx.blocking_send(item)
        .map_err(|_| LogError::Io(std::io::Error::other("the receiver went away")))
}

/// Frames `from..=through` of each range, in order, as the stream carries
/// them. A frame in hand (a small append's group, shipped before its sync)
/// goes from the group's own buffer, on this task: no copy and no other
/// thread. What is not in hand (a catch-up, a blob past 1 MiB) is read from
/// the log by a blocking task that hands pieces over a bounded channel, so
/// memory is a few pieces whatever a blob's size.
pub(super) async fn ship_frames(
    log: Arc<Log>,
    in_hand: Arc<crate::repl::in_hand::InHand>,
    mut send: SendStream,
    mut ranges: mpsc::UnboundedReceiver<(u64, u64)>,
) -> Result<(), NetError> {
    // In-hand frames gathered for one write, and their bytes.
    let mut gathered: Vec<bytes::Bytes> = Vec::new();
    let mut gathered_bytes = 0;
    while let Some((from, through)) = ranges.recv().await {
        let mut seq = from;
        while seq <= through {
            match in_hand.get(seq) {
                Some(frame) => {
                    gathered_bytes += frame.len();
                    gathered.push(frame);
                    seq += 1;
                    if gathered_bytes >= PIECE {
                        write_gathered(&mut send, &mut gathered).await?;
                        gathered_bytes = 0;
                    }
                }
                None => {
                    write_gathered(&mut send, &mut gathered).await?;
                    gathered_bytes = 0;
                    // The rest of the range from the log (a frame further
                    // on still in hand is taken from there).
                    ship_from_log(&log, &in_hand, &mut send, seq, through).await?;
                    seq = through + 1;
                }
            }
        }
        // Nothing more queued: what is gathered goes now, not after the
        // next append.
        if ranges.is_empty() {
            write_gathered(&mut send, &mut gathered).await?;
            gathered_bytes = 0;
        }
    }
    write_gathered(&mut send, &mut gathered).await
}

async fn write_gathered(
    send: &mut SendStream,
    gathered: &mut Vec<bytes::Bytes>,
) -> Result<(), NetError> {
    if !gathered.is_empty() {
        send.write_all_chunks(gathered).await?;
        crate::budget::mark(crate::budget::Stage::StreamWritten);
        gathered.clear();
    }
    Ok(())
}

/// Frames `from..=through` read on a blocking task, in pieces of about
/// [`PIECE`]: a run of small frames costs one stream write per piece.
async fn ship_from_log(
    log: &Arc<Log>,
    in_hand: &Arc<crate::repl::in_hand::InHand>,
    send: &mut SendStream,
    from: u64,
    through: u64,
) -> Result<(), NetError> {
    let (tx, mut pieces) = mpsc::channel::<bytes::Bytes>(4);
    let (log, in_hand) = (log.clone(), in_hand.clone());
    let reader = tokio::task::spawn_blocking(move || -> Result<(), LogError> {
        let mut buf = Vec::with_capacity(PIECE);
        for seq in from..=through {
            crate::repl::in_hand::ship_frame(&log, &in_hand, seq, PIECE, |bytes| {
                buf.extend_from_slice(bytes);
                if buf.len() >= PIECE {
                    let out = std::mem::replace(&mut buf, Vec::with_capacity(PIECE));
                    send_blocking(&tx, bytes::Bytes::from(out))?;
                }
                Ok::<(), LogError>(())
            })?;
        }
        if !buf.is_empty() {
            send_blocking(&tx, bytes::Bytes::from(buf))?;
        }
        Ok(())
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
