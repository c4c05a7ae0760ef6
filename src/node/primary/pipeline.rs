//! A pipeline: one long-lived stream on which a client sends small
//! appends (and status requests) one after another, each named by an id,
//! and the primary answers each by its id as it completes.
//!
//! A request on a stream of its own costs the opening and closing of a
//! QUIC stream, a task, and QUIC's per-stream state on both sides; a
//! piped one costs its bytes. One task reads the stream (a read is not
//! cancel-safe, so it never sits in a `select!`), and the pipeline's task
//! drives every request in flight and writes the answers that are ready
//! together.

use std::sync::Arc;

use futures_util::stream::{FuturesUnordered, StreamExt};
use futures_util::FutureExt;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::refusals::Cut;
use super::requests::Streamed;
use super::*;
use crate::node::api::{AppendOnce, Piped, PipedAnswer, PIPED_BODY_MAX};

/// Piped requests one connection has in flight at most.
pub const PIPELINE_IN_FLIGHT: u32 = 64;
/// Bytes of piped blobs one connection holds at most.
pub const PIPELINE_BODY_BYTES: u64 = 16 << 20;

/// What one connection's pipelines hold at once, shared by all of them.
pub(super) struct PipeRoom {
    requests: Arc<Semaphore>,
    bytes: Arc<Semaphore>,
}

impl PipeRoom {
    pub(super) fn new() -> Self {
        PipeRoom {
            requests: Arc::new(Semaphore::new(PIPELINE_IN_FLIGHT as usize)),
            bytes: Arc::new(Semaphore::new(PIPELINE_BODY_BYTES as usize)),
        }
    }
}

/// A request read off the pipeline, holding its room until answered.
struct Arrived {
    id: u64,
    req: Request,
    body: Carried,
    _room: Room,
}

/// What a piped request holds until it is answered: its place among the
/// connection's requests in flight, and its blob's bytes there and in the
/// client's memory share.
#[derive(Default)]
struct Room {
    _request: Option<OwnedSemaphorePermit>,
    _bytes: Option<OwnedSemaphorePermit>,
    _budget: Option<shares::Held>,
}

/// What came with a request.
enum Carried {
    /// Its blob, whole (at most [`PIPED_BODY_MAX`]).
    Blob(Vec<u8>),
    /// A larger blob, streamed into the log by the reader as it arrived:
    /// the frame `seq`, `bytes` long, is durable here and waits for its
    /// answer, counted by the switchover since its admission.
    Appended {
        streamed: Streamed,
        _writing: Option<switchover::Writing>,
    },
    /// Refused before its body was read or anything charged (the body,
    /// 1 MiB at most, was read and dropped); the pipeline goes on.
    Refused(ApiError),
    /// Why it could not be taken; the pipeline ends after it.
    Failed(ApiError),
}

/// What the reader hands the pipeline's task.
enum Read {
    Request(Box<Arrived>),
    /// The pipeline ends; with an error for id 0 when it broke.
    End(Option<ApiError>),
}

impl Primary {
    /// Serve a pipeline until the client finishes its side and every
    /// request it sent is answered.
    pub(super) async fn pipeline(
        self: Arc<Self>,
        caller: &Caller,
        room: Arc<PipeRoom>,
        mut send: SendStream,
        recv: RecvStream,
    ) -> Result<(), NetError> {
        let opened = Response::Pipelining {
            in_flight: PIPELINE_IN_FLIGHT,
            body_bytes: PIPELINE_BODY_BYTES,
        };
        self.send_msg(&mut send, &opened).await?;
        let (tx, mut rx) = mpsc::channel(PIPELINE_IN_FLIGHT as usize);
        let reader = tokio::spawn(read_pipeline(self.clone(), caller.clone(), room, recv, tx));
        let mut in_flight = FuturesUnordered::new();
        let mut reading = true;
        let mut ended_by = None;
        let mut out = Vec::new();
        // The connection is busy while any piped request is in flight.
        let mut busy = None;
        let result = loop {
            if in_flight.is_empty() {
                busy = None;
            }
            tokio::select! {
                read = rx.recv(), if reading => match read {
                    Some(Read::Request(arrived)) => {
                        busy.get_or_insert_with(|| caller.activity.busy());
                        in_flight.push(self.piped(caller.holder.role, *arrived));
                    }
                    Some(Read::End(why)) => {
                        ended_by = why;
                        reading = false;
                    }
                    None => reading = false,
                },
                Some(answer) = in_flight.next(), if !in_flight.is_empty() => {
                    crate::budget::mark(crate::budget::Stage::AnswerReady);
                    // Every answer ready now goes out in one write.
                    out.clear();
                    crate::repl::msg::encode_into(&mut out, &answer);
                    while let Some(Some(more)) = in_flight.next().now_or_never() {
                        crate::repl::msg::encode_into(&mut out, &more);
                    }
                    if let Err(e) = self.send_within(&mut send, &out).await {
                        break Err(e);
                    }
                    crate::budget::mark(crate::budget::Stage::AnswerSent);
                }
                else => break Ok(()),
            }
        };
        reader.abort();
        if result.is_ok() {
            if let Some(why) = ended_by {
                let answer = PipedAnswer {
                    id: 0,
                    resp: self.outgoing(Response::Error(why)),
                };
                self.send_msg(&mut send, &answer).await?;
            }
            let _ = send.finish();
        }
        result
    }

    /// One piped request, answered by its id.
    async fn piped(&self, role: ClientRole, arrived: Arrived) -> PipedAnswer {
        let Arrived { id, req, body, .. } = arrived;
        let _counted = InFlight::enter(&self.inflight);
        let resp = match self.piped_response(role, req, body).await {
            Ok(resp) | Err(resp) => resp,
        };
        PipedAnswer {
            id,
            resp: self.outgoing(resp),
        }
    }

    async fn piped_response(
        &self,
        role: ClientRole,
        req: Request,
        body: Carried,
    ) -> Result<Response, Response> {
        let refused = |e: ApiError| Response::Error(e);
        let blob = match body {
            Carried::Blob(blob) => blob,
            Carried::Refused(e) | Carried::Failed(e) => return Err(refused(e)),
            Carried::Appended { streamed, .. } => {
                let durability = req.durability().unwrap_or(Durability::Local);
                return Ok(match streamed {
                    Streamed::Written { seq, bytes } => {
                        self.acknowledge(seq, bytes, durability).await
                    }
                    Streamed::Repeat(seq) => self.answer_repeat(seq, durability).await,
                });
            }
        };
        if self.stopping.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(refused(ApiError::Refused(WriteRefusal::Stopping {
                why: "the primary is stopping".into(),
            })));
        }
        let _writing = self.gate(&req, role).await.map_err(refused)?;
        match req {
            Request::Append {
                kind,
                meta,
                durability,
                once,
                ..
            } => {
                self.may_append(kind, &meta, once.as_ref())
                    .map_err(refused)?;
                Ok(self
                    .append_in_hand(kind, meta, blob, durability, once)
                    .await)
            }
            Request::Status => Ok(Response::Status(Box::new(self.status()))),
            other => Err(refused(ApiError::BadRequest(format!(
                "{} is not taken on a pipeline: it takes a stream of its own",
                request_name(&other)
            )))),
        }
    }
}

/// Read piped requests and their blobs off `recv`, each holding its room
/// (in the connection's pipelines and in the client's memory share) from
/// before its blob is read until it is answered; a request the client may
/// not make is refused before either. An append past [`PIPED_BODY_MAX`]
/// streams into the log here, as on a stream of its own, and the next
/// request is read once it is durable.
async fn read_pipeline(
    primary: Arc<Primary>,
    caller: Caller,
    room: Arc<PipeRoom>,
    mut recv: RecvStream,
    tx: mpsc::Sender<Read>,
) {
    let deadline = primary.cfg.body_piece_deadline;
    let end = loop {
        let Ok(request_room) = room.requests.clone().acquire_owned().await else {
            break None;
        };
        // A pipeline may wait for its next request as long as it likes;
        // one begun must arrive whole within the deadline.
        let Piped { id, req } = match net::read_msg_within::<Piped>(&mut recv, deadline).await {
            Ok(Some(piped)) => {
                crate::budget::mark(crate::budget::Stage::PrimaryReceived);
                piped
            }
            Ok(None) => break None,
            Err(NetError::Message(e)) => {
                primary.refusals.note(Cut::Undecodable.name());
                break Some(ApiError::BadRequest(format!(
                    "a piped request did not decode: {e}"
                )));
            }
            Err(NetError::Io(e)) if e.kind() == std::io::ErrorKind::TimedOut => {
                primary.refusals.note(Cut::RequestLate.name());
                break Some(ApiError::BadRequest(format!(
                    "a piped request did not arrive whole within {} ms",
                    deadline.as_millis()
                )));
            }
            Err(e) => {
                tracing::debug!(error = %e, "a pipeline's stream failed");
                break None;
            }
        };
        if id == 0 {
            break Some(ApiError::BadRequest(
                "a piped request's id 0 is reserved for the pipeline's own answer".into(),
            ));
        }
        // A request from a client that has seen a newer epoch is refused
        // as one this pipeline does not take: its body is dropped. One
        // whose inner request does not decode announces no body length:
        // the framing is lost, and the pipeline ends.
        let (req, seen_refused) = match req.split_seen() {
            Ok((seen, req)) => (req, primary.seen_refusal(seen)),
            Err(why) => {
                primary.refusals.note(Cut::Undecodable.name());
                break Some(why);
            }
        };
        let len = req.body_len();
        let role = caller.holder.role;
        let taken = match seen_refused {
            Some(why) => Err(why),
            None => primary.taken_on_pipeline(&req, role),
        };
        let (body, room_held) = if let Err(why) = taken {
            // Refused before its body is read or anything is charged; a
            // small body is taken off the stream, and dropped, so the
            // pipeline goes on.
            let body = match len <= PIPED_BODY_MAX {
                true => match body::Body::exact(&mut recv, len, deadline).discard().await {
                    Ok(()) => Carried::Refused(why),
                    Err(e) => Carried::Failed(e),
                },
                false => Carried::Failed(why),
            };
            (body, Room::default())
        } else if len > PIPED_BODY_MAX {
            let body = match &req {
                Request::Append {
                    kind, meta, once, ..
                } => {
                    let (kind, meta, once) = (*kind, meta.clone(), *once);
                    primary
                        .append_piped_stream(&caller, &req, kind, meta, once, &mut recv)
                        .await
                }
                _ => unreachable_taken(),
            };
            (body, Room::default())
        } else {
            let (bytes, budget) = if len > 0 {
                let Ok(bytes) = room.bytes.clone().acquire_many_owned(len as u32).await else {
                    break None;
                };
                (Some(bytes), Some(caller.memory.charge(len).await))
            } else {
                (None, None)
            };
            let body = match body::Body::exact(&mut recv, len, deadline).read_all().await {
                Ok(blob) => Carried::Blob(blob),
                Err(e) => Carried::Failed(e),
            };
            (
                body,
                Room {
                    _request: None,
                    _bytes: bytes,
                    _budget: budget,
                },
            )
        };
        let room_held = Room {
            _request: Some(request_room),
            ..room_held
        };
        // A body not taken whole leaves the framing lost: the pipeline ends
        // after it.
        let broken = matches!(body, Carried::Failed(_));
        let arrived = Arrived {
            id,
            req,
            body,
            _room: room_held,
        };
        if tx.send(Read::Request(Box::new(arrived))).await.is_err() || broken {
            break None;
        }
    };
    let _ = tx.send(Read::End(end)).await;
}

/// `taken_on_pipeline` lets through no other request past
/// [`PIPED_BODY_MAX`] than an append.
#[cold]
fn unreachable_taken() -> Carried {
    Carried::Failed(ApiError::BadRequest(
        "a piped request's body past 1 MiB other than an append's".into(),
    ))
}

impl Primary {
    /// Whether a pipeline takes `req` from a client of `role`: what is
    /// refused here is refused before its body is read or any of it is
    /// charged.
    fn taken_on_pipeline(&self, req: &Request, role: ClientRole) -> Result<(), ApiError> {
        if req.needs() > role {
            return Err(ApiError::Forbidden(format!(
                "this needs the {} role; this client's role is {role}",
                req.needs()
            )));
        }
        let len = req.body_len();
        match req {
            Request::Append {
                kind, meta, once, ..
            } => {
                self.may_append(*kind, meta, once.as_ref())?;
                self.body_fits("an append's blob", len)
            }
            Request::Status => Ok(()),
            _ if len > PIPED_BODY_MAX => Err(ApiError::Refused(WriteRefusal::TooLarge {
                what: "a piped request's body other than an append's".into(),
                len,
                max: PIPED_BODY_MAX,
            })),
            other => Err(ApiError::BadRequest(format!(
                "{} is not taken on a pipeline: it takes a stream of its own",
                request_name(other)
            ))),
        }
    }
}

impl Primary {
    /// A piped append past [`PIPED_BODY_MAX`]: admitted, then its body
    /// streamed into the log exactly (the next request follows it).
    async fn append_piped_stream(
        &self,
        caller: &Caller,
        req: &Request,
        kind: u16,
        meta: Vec<u8>,
        once: Option<AppendOnce>,
        recv: &mut RecvStream,
    ) -> Carried {
        let _counted = InFlight::enter(&self.inflight);
        let _busy = caller.activity.busy();
        if self.stopping.load(std::sync::atomic::Ordering::SeqCst) {
            return Carried::Failed(ApiError::Refused(WriteRefusal::Stopping {
                why: "the primary is stopping".into(),
            }));
        }
        let writing = match self.gate(req, caller.holder.role).await {
            Ok(writing) => writing,
            Err(e) => return Carried::Failed(e),
        };
        if let Err(e) = self.may_append(kind, &meta, once.as_ref()) {
            return Carried::Failed(e);
        }
        let len = req.body_len();
        let body = body::Body::exact(recv, len, self.cfg.body_piece_deadline);
        match self.append_streamed(caller, kind, meta, once, body).await {
            Ok(streamed) => Carried::Appended {
                streamed,
                _writing: writing,
            },
            Err(e) => Carried::Failed(e),
        }
    }
}

/// A request's name, for a refusal.
fn request_name(req: &Request) -> String {
    let debug = format!("{req:?}");
    debug
        .split([' ', '{', '('])
        .next()
        .unwrap_or_default()
        .to_owned()
}
