//! A client's requests: each on its own stream (or piped, `pipeline`),
//! admitted, dispatched, and answered as durable as it asked.

use super::answer::Opened;
use super::once;
use super::refusals::Cut;
use super::*;
use crate::node::api::AppendOnce;
use crate::store::Repo;

/// How often an answer waiting on a start held for the twin's hello looks
/// again.
const HELD_START_POLL: std::time::Duration = std::time::Duration::from_millis(20);

/// What a streamed append did.
pub(super) enum Streamed {
    /// Wrote the frame `seq`, `bytes` of log.
    Written { seq: u64, bytes: u64 },
    /// Found it sent once before: it is in the log at this seq.
    Repeat(u64),
}

fn refused(e: crate::log::Error) -> ApiError {
    ApiError::Refused(e.into())
}

impl Primary {
    /// A start held for the twin's hello lifts within a round trip of the
    /// twin's reconnect, or gives way to a fence once the box that
    /// replaced this one calls: an answer waits for either (the client's
    /// deadline bounds it), and only then says whether it acknowledges.
    async fn wait_held_start(&self) {
        while self.epochs.held_for_hello()
            && !self.stopping.load(std::sync::atomic::Ordering::SeqCst)
        {
            tokio::time::sleep(HELD_START_POLL).await;
        }
    }

    /// May a request asking for `durability` append at all?
    pub(super) fn admit(
        &self,
        durability: Durability,
    ) -> Result<crate::repl::ack::Admit, crate::repl::ack::NotAdmitted> {
        let state = crate::repl::ack::AckState {
            // A start held for the twin's hello takes writes: their answers
            // wait for the hello (or the fence that replaces the hold).
            fenced: self.epochs.fenced() && !self.epochs.held_for_hello(),
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

    /// A request from a client that has seen epoch `seen`, refused when
    /// that is newer than this primary's: by `NotPrimary` when this box
    /// knows where the newer primary serves, else by `StaleEpoch`.
    pub(super) fn seen_refusal(&self, seen: Option<u64>) -> Option<ApiError> {
        let seen = seen?;
        let st = self.epochs.state();
        let epoch = st.current();
        if seen <= epoch {
            return None;
        }
        let known = self.switch.deposed.borrow().clone();
        Some(match known {
            Some(np) if st.seen > epoch => ApiError::NotPrimary {
                epoch: st.seen,
                addr: np.addr,
                fingerprint: np.fingerprint,
            },
            _ => ApiError::StaleEpoch { epoch, seen },
        })
    }

    pub(super) async fn client_session(self: Arc<Self>, conn: Connection, caller: Caller) {
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
            let caller = caller.clone();
            let room = room.clone();
            tokio::spawn(async move {
                if let Err(e) = me.stream(&caller, room, send, recv).await {
                    tracing::debug!(client = %caller.holder.name, error = %e, "client request failed");
                }
            });
        }
    }

    /// A client's stream: one request, or a pipeline of them. The request
    /// must arrive within the piece deadline of the stream's opening.
    async fn stream(
        self: Arc<Self>,
        caller: &Caller,
        room: Arc<pipeline::PipeRoom>,
        mut send: SendStream,
        mut recv: RecvStream,
    ) -> Result<(), NetError> {
        let first = tokio::time::timeout(
            self.cfg.body_piece_deadline,
            net::read_msg::<Request>(&mut recv),
        );
        let req = match first.await {
            Ok(Ok(Some(req))) => req,
            Ok(Ok(None)) => return Ok(()),
            Ok(Err(NetError::Message(e))) => {
                self.refusals.note(Cut::Undecodable.name());
                let why = ApiError::BadRequest(format!("the request did not decode: {e}"));
                return self.answer_with(&mut send, Response::Error(why)).await;
            }
            Ok(Err(e)) => return Err(e),
            Err(_) => {
                self.cut(&mut send, Cut::RequestLate);
                let _ = recv.stop(Cut::RequestLate.code().into());
                return Ok(());
            }
        };
        let req = match req.split_seen() {
            Ok((seen, req)) => match self.seen_refusal(seen) {
                None => req,
                Some(why) => return self.answer_with(&mut send, Response::Error(why)).await,
            },
            Err(why) => return self.answer_with(&mut send, Response::Error(why)).await,
        };
        match req {
            Request::Pipeline => self.pipeline(caller, room, send, recv).await,
            req => {
                let _busy = caller.activity.busy();
                self.request(caller, req, send, recv).await
            }
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
        if let Some(why) = self.lease_refusal(None) {
            return Err(why);
        }
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
        caller: &Caller,
        req: Request,
        mut send: SendStream,
        mut recv: RecvStream,
    ) -> Result<(), NetError> {
        let _counted = InFlight::enter(&self.inflight);
        let _writing = match self.gate(&req, caller.holder.role).await {
            Ok(writing) => writing,
            Err(why) => return self.answer_with(&mut send, Response::Error(why)).await,
        };
        let response = match req {
            Request::Switchover { wait_ms } => {
                self.switchover(Duration::from_millis(wait_ms)).await
            }
            Request::Verify {
                from,
                through,
                mib_per_s,
            } => Response::Verified(self.verify(from, through, mib_per_s).await),
            Request::Fence { epoch } => {
                // A hold: the epoch is the operator's note, proven by no
                // box, so it fences this box and is told to nobody.
                let client = &caller.holder.name;
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
                once,
            } => {
                self.append(caller, kind, meta, blob_len, durability, once, &mut recv)
                    .await
            }
            Request::Read { seq } => return self.read(caller, seq, send).await,
            Request::Tail { from } => return self.tail(caller, from, send).await,
            Request::Status => Response::Status(Box::new(self.status())),
            Request::CreateRepo { repo, durability } => self.create_repo(repo, durability).await,
            Request::Push {
                repo,
                pack_len,
                updates,
                durability,
            } => {
                self.push(caller, repo, pack_len, updates, durability, &mut recv)
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
                match self.pool.run(move || me.retain_from(seq, force)).await {
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
            } => {
                self.lfs_put(caller, repo, oid, len, durability, &mut recv)
                    .await
            }
            Request::LfsDelete {
                repo,
                oid,
                durability,
            } => self.lfs_delete(repo, oid, durability).await,
            Request::LfsGet { repo, oid } => {
                let open = move |r: &Repo| Ok(r.lfs().open_object(&oid)?.map(Opened::lfs));
                return self.send_repo_object(caller, repo, send, open).await;
            }
            Request::ReadObject { repo, oid } => {
                let open = move |r: &Repo| Ok(r.open_object(&oid)?.map(Opened::git));
                return self.send_repo_object(caller, repo, send, open).await;
            }
            Request::GetDoc { name } => return self.get_doc(caller, name, send).await,
            Request::PutDoc {
                name,
                len,
                durability,
            } => self.put_doc(caller, name, len, durability, &mut recv).await,
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
            | Request::ListRepos
            | Request::ListDocs => return self.store_read(caller, req, send).await,
            Request::Pipeline => Response::Error(ApiError::BadRequest(
                "a pipeline is asked for as a stream's first request".into(),
            )),
            Request::Seen { .. } => Response::Error(ApiError::BadRequest(
                "a Seen request is taken as a stream's or a piped request's own".into(),
            )),
        };
        self.answer_with(&mut send, response).await
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) async fn append(
        &self,
        caller: &Caller,
        kind: u16,
        meta: Vec<u8>,
        blob_len: u64,
        durability: Durability,
        once: Option<AppendOnce>,
        recv: &mut RecvStream,
    ) -> Response {
        if let Err(e) = self.may_append(kind, &meta, once.as_ref()) {
            return Response::Error(e);
        }
        if blob_len <= SMALL_BLOB {
            let _held = caller.memory.charge(blob_len).await;
            return match body::Body::new(recv, blob_len, self.cfg.body_piece_deadline)
                .read_all()
                .await
            {
                Ok(blob) => {
                    self.append_in_hand(kind, meta, blob, durability, once)
                        .await
                }
                Err(e) => Response::Error(e),
            };
        }
        let body = body::Body::new(recv, blob_len, self.cfg.body_piece_deadline);
        match self.append_streamed(caller, kind, meta, once, body).await {
            Ok(Streamed::Written { seq, bytes }) => self.acknowledge(seq, bytes, durability).await,
            Ok(Streamed::Repeat(seq)) => self.answer_repeat(seq, durability).await,
            Err(e) => Response::Error(e),
        }
    }

    /// A body of `len` bytes, past what is read whole, is taken only up to
    /// the staging bound: refused by name before a byte of it is read.
    pub(super) fn body_fits(&self, what: &str, len: u64) -> Result<(), ApiError> {
        let max = self.staging.max_body().max(SMALL_BLOB);
        if len > max {
            return Err(ApiError::Refused(WriteRefusal::TooLarge {
                what: what.into(),
                len,
                max,
            }));
        }
        Ok(())
    }

    /// Raw appends of the store's kinds are the store requests' alone;
    /// `Once` frames are written by appends sent once, which must be of
    /// an application's kind with meta that leaves room for the id.
    pub(super) fn may_append(
        &self,
        kind: u16,
        meta: &[u8],
        once: Option<&AppendOnce>,
    ) -> Result<(), ApiError> {
        if self.store.is_some() && store_requests::is_store_kind(kind) {
            return Err(ApiError::Forbidden(format!(
                "kind {kind} is the store's: it is written by the store requests, which check it"
            )));
        }
        if kind == crate::log::Kind::Once.as_u16() {
            return Err(ApiError::Forbidden(format!(
                "kind {kind} is written by appends sent once (`once`), which check it"
            )));
        }
        if once.is_some() {
            if kind < crate::log::APP_KIND_FIRST {
                return Err(ApiError::Refused(WriteRefusal::InvalidKind { kind }));
            }
            let max = crate::log::once::MAX_ONCE_META_LEN;
            if meta.len() > max {
                return Err(ApiError::Refused(WriteRefusal::TooLarge {
                    what: "the meta of an append sent once".into(),
                    len: meta.len() as u64,
                    max: max as u64,
                }));
            }
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
        once: Option<AppendOnce>,
    ) -> Response {
        // The appender published the frame with its group, before its sync.
        match self
            .appender
            .append(
                &self.pool,
                kind,
                meta,
                blob,
                once,
                durability == Durability::Twin && self.twin_configured,
            )
            .await
        {
            Ok(seq) => self.answer(seq, durability).await,
            Err(e) => Response::Error(e),
        }
    }

    /// A frame durable here up to `seq` (`bytes` more of log): published to
    /// the twin sessions, then answered as durable as `durability` asks,
    /// under the policy for an absent twin. The second publish point, for
    /// what is not a small append (a blob past 1 MiB, the store's writes):
    /// such a frame is never in hand whole, so it cannot be shipped before
    /// its sync as the appender's groups are; the twin reads it from the
    /// log once its own commit made it durable.
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
        self.wait_held_start().await;
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
                let started = crate::node::clock::instant();
                let mut resp = self.wait_for_twin(seq).await;
                if let Response::Appended { twin_wait_us, .. } = &mut resp {
                    *twin_wait_us = started.elapsed().as_micros() as u64;
                }
                resp
            }
        }
    }

    /// A large blob, staged whole and then written through a `Pending` on a
    /// blocking thread; memory is a few pieces whatever the size. The log's
    /// writer is taken only once the body is in hand: a client that stops
    /// sending or trickles is cut off, nothing of its entry is visible, and
    /// the other writers never wait on it. Sent `once`, the id is checked
    /// and recorded under the ids' lock around the write, as the
    /// appender's group does: a repeat writes nothing.
    pub(super) async fn append_streamed(
        &self,
        caller: &Caller,
        kind: u16,
        meta: Vec<u8>,
        once: Option<AppendOnce>,
        body: body::Body<'_>,
    ) -> Result<Streamed, ApiError> {
        let log = self.log.clone();
        let ids = self.ids.clone();
        let blob_len = body.expected();
        let written = self
            .staged(caller, "an append's blob", body, move |pieces| {
                // Only an append sent once takes the ids' lock.
                let mut ids = once
                    .as_ref()
                    .map(|_| ids.lock().unwrap_or_else(|e| e.into_inner()));
                let (kind, meta) = match (&once, ids.as_deref()) {
                    (Some(o), Some(table)) => match table.find(o)? {
                        once::Found::Written(seq) => return Ok(Streamed::Repeat(seq)),
                        once::Found::New => (
                            crate::log::Kind::Once.as_u16(),
                            crate::log::once::wrap(kind, o.id(), &meta),
                        ),
                    },
                    _ => (kind, meta),
                };
                let mut p = log.begin(None, kind, &meta, blob_len).map_err(refused)?;
                for piece in pieces {
                    p.write(&piece).map_err(refused)?;
                }
                // A short body makes commit refuse with BlobLength.
                let seq = p.commit().map_err(refused)?;
                if let (Some(o), Some(table)) = (&once, ids.as_deref_mut()) {
                    table.record(o.id(), seq);
                }
                let bytes =
                    crate::log::format::FRAME_HEADER_LEN as u64 + meta.len() as u64 + blob_len;
                Ok(Streamed::Written { seq, bytes })
            })
            .await?;
        written
    }

    /// An append sent once whose frame is in the log at `seq` already:
    /// answered once that frame is durable here, as durable as
    /// `durability` asks. Nothing is written.
    pub(super) async fn answer_repeat(&self, seq: u64, durability: Durability) -> Response {
        let mut durable = self.durable.subscribe();
        loop {
            if self.log.head_seq() >= seq {
                break;
            }
            if let Some(why) = self.log.poisoned_by() {
                return Response::Error(ApiError::Refused(WriteRefusal::Poisoned { why }));
            }
            // The appender's sync of that frame's group is under way.
            let _ = tokio::time::timeout(Duration::from_millis(100), durable.changed()).await;
        }
        self.answer(seq, durability).await
    }

    /// A streamed body: refused by name past the staging bound before a
    /// byte of it is read; otherwise its pieces in hand charged to the
    /// client, staged whole, and handed to `write` on a blocking thread
    /// (see `Staging::feed`).
    pub(super) async fn staged<T, E>(
        &self,
        caller: &Caller,
        what: &str,
        body: body::Body<'_>,
        write: impl FnOnce(&mut dyn Iterator<Item = bytes::Bytes>) -> Result<T, E> + Send + 'static,
    ) -> Result<Result<T, E>, ApiError>
    where
        T: Send + 'static,
        E: Send + 'static,
    {
        self.body_fits(what, body.expected())?;
        let _held = caller.memory.charge(shares::STREAMED_BODY_BYTES).await;
        self.staging
            .feed(&caller.staging, &self.pool, body, write)
            .await
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
            TwinAnswer::Local => {
                // Under an arbiter the twin is recorded out of sync
                // before it is answered less, so it never takes over
                // without this frame.
                if let Err(why) = self.before_answering_less(seq).await {
                    return Response::Error(why);
                }
                Durability::Local
            }
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
}
