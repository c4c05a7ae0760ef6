//! A client's requests: each on its own stream (or piped, `pipeline`),
//! admitted, dispatched, and answered as durable as it asked.

use super::*;

impl Primary {
    /// May a request asking for `durability` append at all?
    pub(super) fn admit(
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
    pub(super) fn refusal(&self, why: crate::repl::ack::NotAdmitted, seq: Option<u64>) -> ApiError {
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

    pub(super) async fn client_session(self: Arc<Self>, conn: Connection) {
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
        let room = Arc::new(pipeline::PipeRoom::new());
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
            let room = room.clone();
            tokio::spawn(async move {
                if let Err(e) = me.stream(&client, role, room, send, recv).await {
                    tracing::warn!(error = %e, "client request failed");
                }
            });
        }
    }

    /// A client's stream: one request, or a pipeline of them.
    async fn stream(
        self: Arc<Self>,
        client: &str,
        role: ClientRole,
        room: Arc<pipeline::PipeRoom>,
        send: SendStream,
        mut recv: RecvStream,
    ) -> Result<(), NetError> {
        match net::read_msg::<Request>(&mut recv).await? {
            None => Ok(()),
            Some(Request::Pipeline) => self.pipeline(role, room, send, recv).await,
            Some(req) => self.request(client, role, req, send, recv).await,
        }
    }

    /// Whether `req` may go ahead for a client of `role`: refused by name
    /// (before a byte of its body is read: nothing is written), or let in,
    /// a write counted by the switchover until it is answered.
    pub(super) async fn gate(
        &self,
        req: &Request,
        role: ClientRole,
    ) -> Result<Option<switchover::Writing>, ApiError> {
        if req.needs() > role {
            return Err(ApiError::Forbidden(format!(
                "this needs the {} role; this client's role is {role}",
                req.needs()
            )));
        }
        let Some(durability) = req.durability() else {
            return Ok(None);
        };
        let writing = self.enter_write().await;
        self.admit(durability)
            .map_err(|why| self.refusal(why, None))?;
        match writing {
            Ok(writing) => Ok(Some(writing)),
            // Paused and not fenced: a switchover still under way after
            // the longest a write waits.
            Err(()) => Err(ApiError::SwitchoverRefused {
                why: "a switchover under way pauses writes; try again".into(),
            }),
        }
    }

    pub(super) async fn request(
        self: Arc<Self>,
        client: &str,
        role: ClientRole,
        req: Request,
        mut send: SendStream,
        mut recv: RecvStream,
    ) -> Result<(), NetError> {
        let _counted = InFlight::enter(&self.inflight);
        let _writing = match self.gate(&req, role).await {
            Ok(writing) => writing,
            Err(why) => {
                net::write_msg(&mut send, &Response::Error(why)).await?;
                let _ = send.finish();
                return Ok(());
            }
        };
        let response = match req {
            Request::Switchover { wait_ms } => {
                self.switchover(Duration::from_millis(wait_ms)).await
            }
            Request::Verify { from, through } => {
                Response::Verified(self.verify(from, through).await)
            }
            Request::Fence { epoch } => {
                // A hold: the epoch is the operator's note, proven by no
                // box, so it fences this box and is told to nobody.
                let why = match epoch {
                    0 => format!("held by the admin client {client}"),
                    e => format!(
                        "held by the admin client {client}, naming epoch {}",
                        crate::repl::epochs::EpochName(e)
                    ),
                };
                match self.epochs.hold(&why) {
                    Ok(true) => {
                        tracing::error!(by = %why, "HELD: this box acknowledges no write from now on (reads go on)")
                    }
                    Ok(false) => {}
                    Err(e) => {
                        tracing::error!(error = %e, "HELD in memory only: recording the hold failed")
                    }
                }
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
                    Err(e) => Response::Error(ApiError::Refused(WriteRefusal::Stopping {
                        why: e.to_string(),
                    })),
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
            Request::Pipeline => Response::Error(ApiError::BadRequest(
                "a pipeline is asked for as a stream's first request".into(),
            )),
        };
        net::write_msg(&mut send, &response).await?;
        let _ = send.finish();
        Ok(())
    }

    pub(super) async fn append(
        &self,
        kind: u16,
        meta: Vec<u8>,
        blob_len: u64,
        durability: Durability,
        recv: &mut RecvStream,
    ) -> Response {
        if let Err(e) = self.may_append(kind) {
            return Response::Error(e);
        }
        let _held = self
            .budget
            .charge(blob_len.min(SMALL_BLOB.max(budget::STREAMED_BODY_BYTES)))
            .await;
        if blob_len <= SMALL_BLOB {
            return match body::Body::new(recv, blob_len, self.cfg.body_piece_deadline)
                .read_all()
                .await
            {
                Ok(blob) => self.append_in_hand(kind, meta, blob, durability).await,
                Err(e) => Response::Error(e),
            };
        }
        let meta_len = meta.len() as u64;
        let body = body::Body::new(recv, blob_len, self.cfg.body_piece_deadline);
        match self.append_streamed(kind, meta, body).await {
            Ok(seq) => {
                self.acknowledge(
                    seq,
                    crate::log::format::FRAME_HEADER_LEN as u64 + meta_len + blob_len,
                    durability,
                )
                .await
            }
            Err(e) => Response::Error(e),
        }
    }

    /// Raw appends of the store's kinds are the store requests' alone.
    pub(super) fn may_append(&self, kind: u16) -> Result<(), ApiError> {
        if self.store.is_some() && store_requests::is_store_kind(kind) {
            return Err(ApiError::Forbidden(format!(
                "kind {kind} is the store's: it is written by the store requests, which check it"
            )));
        }
        Ok(())
    }

    /// A small frame whose blob is in hand: appended with the next group
    /// and answered as durable as `durability` asks.
    pub(super) async fn append_in_hand(
        &self,
        kind: u16,
        meta: Vec<u8>,
        blob: Vec<u8>,
        durability: Durability,
    ) -> Response {
        if let Some(appender) = &self.appender {
            // The appender published the frame with its group.
            return match appender.append(kind, meta, blob).await {
                Ok(seq) => self.answer(seq, durability).await,
                Err(e) => Response::Error(e),
            };
        }
        let bytes = (crate::log::format::FRAME_HEADER_LEN + meta.len() + blob.len()) as u64;
        let log = self.log.clone();
        let appended =
            match tokio::task::spawn_blocking(move || log.append_raw(kind, &meta, &blob)).await {
                Ok(r) => r.map_err(|e| ApiError::Refused(e.into())),
                Err(e) => Err(ApiError::Refused(WriteRefusal::Stopping {
                    why: e.to_string(),
                })),
            };
        match appended {
            Ok(seq) => self.acknowledge(seq, bytes, durability).await,
            Err(e) => Response::Error(e),
        }
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
    pub(super) async fn answer(&self, seq: u64, durability: Durability) -> Response {
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
    pub(super) async fn append_streamed(
        &self,
        kind: u16,
        meta: Vec<u8>,
        body: body::Body<'_>,
    ) -> Result<u64, ApiError> {
        let log = self.log.clone();
        let blob_len = body.expected();
        let written = self
            .staging
            .feed(body, move |pieces| {
                let mut p = log.begin(None, kind, &meta, blob_len)?;
                for piece in pieces {
                    p.write(&piece)?;
                }
                // A short body makes commit refuse with BlobLength.
                p.commit()
            })
            .await?;
        written.map_err(|e| ApiError::Refused(e.into()))
    }

    pub(super) async fn wait_for_twin(&self, seq: u64) -> Response {
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

    /// Wait for the twin as the policy bounds it (`repl::ack`), and
    /// answer as it says.
    pub(super) async fn wait_for_twin_counted(&self, seq: u64) -> Response {
        use crate::repl::ack::{TwinAnswer, WaitFor, Waited};
        let policy = self.cfg.policy;
        let degraded = lock(&self.status).degraded;
        let waited = match policy.wait_for(degraded) {
            WaitFor::Nothing => None,
            WaitFor::Forever => Some(self.twin_reached(seq).await),
            WaitFor::UpTo(d) => Some(
                tokio::time::timeout(d, self.twin_reached(seq))
                    .await
                    .unwrap_or(Waited::TimedOut),
            ),
        };
        let answer = match waited {
            None => TwinAnswer::Local,
            Some(waited) => {
                let (answer, degrade) = policy.answer(waited);
                if degrade {
                    let mut s = lock(&self.status);
                    if !s.degraded {
                        s.degraded = true;
                        tracing::warn!(seq, "the twin did not acknowledge in time: appends fall back to local durability");
                    }
                }
                answer
            }
        };
        let durability = match answer {
            TwinAnswer::Twin => Durability::Twin,
            TwinAnswer::Local => Durability::Local,
            TwinAnswer::NotOnTwin => return Response::Error(ApiError::NotOnTwin { seq }),
            TwinAnswer::TwinTimeout => return Response::Error(ApiError::TwinTimeout { seq }),
        };
        Response::Appended {
            seq,
            durability,
            twin_wait_us: 0,
        }
    }

    /// Until the twin's durable head reaches `seq`, its log starts past
    /// `seq` (a snapshot it installed covers it), a fence (which answers
    /// every waiter at once, checked by the caller), or shutdown.
    async fn twin_reached(&self, seq: u64) -> crate::repl::ack::Waited {
        use crate::repl::ack::Waited;
        let twin_first = &self.twin_first;
        let on_twin = || seq >= twin_first.load(std::sync::atomic::Ordering::SeqCst);
        let mut acked = self.acked.subscribe();
        let mut fenced = self.epochs.watch_fenced();
        let ended = tokio::select! {
            r = acked.wait_for(|&a| a >= seq || !on_twin()) => r.is_ok(),
            r = fenced.wait_for(|&f| f) => r.is_ok(),
        };
        if ended {
            Waited::Reached { on_twin: on_twin() }
        } else {
            Waited::Closed
        }
    }

    pub(super) async fn read(&self, seq: u64, mut send: SendStream) -> Result<(), NetError> {
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
    pub(super) async fn tail(&self, from: u64, mut send: SendStream) -> Result<(), NetError> {
        let first = self.log.first_seq();
        let mut next = from.max(1);
        if next < first {
            let e = ReadRefusal::BelowFloor { seq: next, first };
            net::write_msg(&mut send, &Response::Error(ApiError::Read(e))).await?;
            let _ = send.finish();
            return Ok(());
        }
        let mut head_rx = self.durable.subscribe();
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
    pub(super) async fn write_frame(
        &self,
        seq: u64,
        send: &mut SendStream,
    ) -> Result<FrameSent, NetError> {
        let (tx, mut rx) = mpsc::channel::<Result<Vec<u8>, ReadRefusal>>(4);
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
                let _ = tx.blocking_send(Err(ReadRefusal::of(seq, e)));
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

/// How a frame went out on a client stream.
pub(super) enum FrameSent {
    Whole,
    /// Nothing was sent: the read failed before the frame's head.
    Nothing(ReadRefusal),
    /// The stream was reset after a partial frame.
    Cut,
}
