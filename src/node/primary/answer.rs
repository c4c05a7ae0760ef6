//! Answers to clients: a head, then what follows it (a frame's blob, an
//! object, a document, a listing), a piece at a time.
//!
//! Every piece in hand is charged to the client's memory share first. Each
//! is read by a short task of its own on the clients' part of the blocking
//! pool, and sent from here with the send deadline: a client that stops
//! reading has its stream reset after it (`Cut.SendStalled`), holding
//! meanwhile one piece and QUIC's send window, and no thread waits on it.

use std::io::Read as _;

use quinn::SendStream;
use serde::Serialize;

use super::refusals::Cut;
use super::*;
use crate::archive::tiered::ArchivedFrames;
use crate::log::BlobReader;
use crate::node::api::MAX_LISTING;
use crate::storage::Cursor;
use crate::store::{GitObjectReader, LfsObject};

/// Why a piece of an answer did not read: the answer is cut short.
#[derive(Debug, thiserror::Error)]
pub(super) enum PieceError {
    #[error("reading a frame's blob: {0}")]
    Log(#[from] crate::log::Error),
    #[error("reading an object: {0}")]
    Store(#[from] crate::store::StoreError),
    #[error("reading a document: {0}")]
    Doc(#[from] std::io::Error),
}

/// What follows an answer's head, read a piece at a time by whoever holds
/// it; nothing waits between two pieces.
pub(super) trait Pieces: Send + 'static {
    /// Read the next bytes into `buf`, at most its length: how many; 0 at
    /// the end. An error cuts the answer short.
    fn next_piece(&mut self, buf: &mut [u8]) -> Result<usize, PieceError>;
}

impl Pieces for BlobReader {
    fn next_piece(&mut self, buf: &mut [u8]) -> Result<usize, PieceError> {
        Ok(BlobReader::next_piece(self, buf).map(|(n, _)| n)?)
    }
}

impl Pieces for GitObjectReader {
    fn next_piece(&mut self, buf: &mut [u8]) -> Result<usize, PieceError> {
        Ok(GitObjectReader::next_piece(self, buf)?)
    }
}

impl Pieces for LfsObject {
    fn next_piece(&mut self, buf: &mut [u8]) -> Result<usize, PieceError> {
        Ok(LfsObject::next_piece(self, buf)?)
    }
}

/// A control document's file, as it was when opened.
pub(super) struct DocPieces(pub(super) Cursor);

impl Pieces for DocPieces {
    fn next_piece(&mut self, buf: &mut [u8]) -> Result<usize, PieceError> {
        Ok(self.0.read(buf)?)
    }
}

/// An object opened under the store's lock: its head, and its bytes to
/// read without the lock.
pub(super) struct Opened {
    pub(super) obj_type: u8,
    pub(super) len: u64,
    pub(super) pieces: Box<dyn Pieces>,
}

impl Opened {
    /// A large object: untyped on the wire.
    pub(super) fn lfs(o: crate::store::lfs::LfsObject) -> Opened {
        Opened {
            obj_type: 0,
            len: o.len,
            pieces: Box::new(o),
        }
    }

    /// A git object, with its type.
    pub(super) fn git(o: crate::store::repo::GitObject) -> Opened {
        Opened {
            obj_type: o.obj_type.as_u8(),
            len: o.len(),
            pieces: Box::new(o.reader()),
        }
    }
}

/// How a frame went out on a client stream.
pub(super) enum FrameSent {
    Whole,
    /// Nothing was sent: the read failed before the frame's head.
    Nothing(ReadRefusal),
    /// The stream was reset after a partial frame, or the client stopped
    /// taking it.
    Cut,
}

impl Primary {
    /// Write `bytes` to a client within the send deadline; past it the
    /// stream is reset, counted, and the error says so.
    pub(super) async fn send_within(
        &self,
        send: &mut SendStream,
        bytes: &[u8],
    ) -> Result<(), NetError> {
        let deadline = self.cfg.body_piece_deadline;
        match tokio::time::timeout(deadline, send.write_all(bytes)).await {
            Ok(r) => Ok(r?),
            Err(_) => {
                self.cut(send, Cut::SendStalled);
                Err(NetError::SendStalled {
                    after_ms: deadline.as_millis() as u64,
                })
            }
        }
    }

    /// One message to a client within the send deadline, an error in it
    /// counted by its name.
    pub(super) async fn send_msg<T: Serialize>(
        &self,
        send: &mut SendStream,
        msg: &T,
    ) -> Result<(), NetError> {
        self.send_within(send, &crate::repl::msg::encode(msg)).await
    }

    /// An answer to a client, an error counted by its name, and the end of
    /// the stream.
    pub(super) async fn answer_with(
        &self,
        send: &mut SendStream,
        resp: Response,
    ) -> Result<(), NetError> {
        let resp = self.outgoing(resp);
        self.send_msg(send, &resp).await?;
        let _ = send.finish();
        Ok(())
    }

    /// Reset a client's stream, counted by why.
    pub(super) fn cut(&self, send: &mut SendStream, why: Cut) {
        self.refusals.note(why.name());
        let _ = send.reset(why.code().into());
    }

    /// Send `first`, then every piece of `rest`, each read on the
    /// clients' part of the blocking pool.
    async fn send_pieces(
        &self,
        send: &mut SendStream,
        first: &[u8],
        rest: Option<Box<dyn Pieces>>,
    ) -> Result<bool, NetError> {
        self.send_within(send, first).await?;
        let Some(mut rest) = rest else {
            return Ok(true);
        };
        let mut buf = vec![0u8; PIECE];
        loop {
            let read = self
                .pool
                .run(move || {
                    let n = rest.next_piece(&mut buf);
                    (rest, buf, n)
                })
                .await;
            let (back, piece, n) = match read {
                Ok(r) => r,
                Err(e) => {
                    tracing::warn!(error = %e, "a piece of an answer did not read");
                    self.cut(send, Cut::ReadFailed);
                    return Ok(false);
                }
            };
            (rest, buf) = (back, piece);
            match n {
                Ok(0) => return Ok(true),
                Ok(n) => self.send_within(send, &buf[..n]).await?,
                Err(why) => {
                    // A client never takes a short answer for a whole one.
                    tracing::warn!(%why, "cutting an answer short");
                    self.cut(send, Cut::ReadFailed);
                    return Ok(false);
                }
            }
        }
    }

    /// One frame as `Response::Frame` and its blob, each piece read by a
    /// task of its own: opened and its first piece read together (a small
    /// frame is whole, its crc checked, before its head goes).
    pub(super) async fn write_frame(
        &self,
        caller: &Caller,
        seq: u64,
        send: &mut SendStream,
    ) -> Result<FrameSent, NetError> {
        let _piece = caller.memory.charge(PIECE as u64).await;
        let log = self.log.clone();
        let opened = self.pool.run(move || open_frame(&log, seq)).await;
        let (head, rest) = match opened {
            Ok(Ok(opened)) => opened,
            Ok(Err(refusal)) => return Ok(FrameSent::Nothing(refusal)),
            Err(e) => {
                let why = e.to_string();
                return Ok(FrameSent::Nothing(ReadRefusal::Unreadable { seq, why }));
            }
        };
        let rest = rest.map(|r| Box::new(r) as Box<dyn Pieces>);
        Ok(match self.send_pieces(send, &head, rest).await? {
            true => FrameSent::Whole,
            false => FrameSent::Cut,
        })
    }

    pub(super) async fn read(
        &self,
        caller: &Caller,
        seq: u64,
        mut send: SendStream,
    ) -> Result<(), NetError> {
        let mut sent = self.write_frame(caller, seq, &mut send).await?;
        if let FrameSent::Nothing(ReadRefusal::BelowFloor { .. }) = sent {
            if let Some(src) = self.archive().map(|a| a.tiered_source()) {
                let _held = caller
                    .memory
                    .charge(u64::from(crate::archive::object::PIECE_LEN))
                    .await;
                sent = match ArchivedFrames::at(src, seq).await {
                    Ok(mut frames) => self.send_archived(&mut frames, seq, &mut send).await?,
                    // Not archived either: below the floor it stays.
                    Err(crate::archive::Error::Missing(_)) => sent,
                    Err(e) => FrameSent::Nothing(archive_refusal(seq, e)),
                };
            }
        }
        match sent {
            FrameSent::Whole => {
                let _ = send.finish();
            }
            FrameSent::Nothing(e) => {
                self.answer_with(&mut send, Response::Error(ApiError::Read(e)))
                    .await?
            }
            FrameSent::Cut => {}
        }
        Ok(())
    }

    /// The cursor's next frame (`seq`), from the archive: its head, then
    /// its blob a piece at a time; a frame that does not check is cut.
    async fn send_archived(
        &self,
        frames: &mut ArchivedFrames,
        seq: u64,
        send: &mut SendStream,
    ) -> Result<FrameSent, NetError> {
        let head = match frames.next_frame().await {
            Ok(h) if h.seq == seq => h,
            Ok(h) => {
                let why = format!("the archive gave frame {} for {seq}", h.seq);
                return Ok(FrameSent::Nothing(ReadRefusal::Unreadable { seq, why }));
            }
            Err(e) => return Ok(FrameSent::Nothing(archive_refusal(seq, e))),
        };
        let msg = Response::Frame {
            seq,
            kind: head.kind,
            meta: head.meta,
            blob_len: head.blob_len,
            payload_crc: head.payload_crc,
        };
        self.send_msg(send, &msg).await?;
        loop {
            match frames.blob_piece(PIECE).await {
                Ok(p) if p.is_empty() => return Ok(FrameSent::Whole),
                Ok(p) => self.send_within(send, &p).await?,
                Err(e) => {
                    tracing::warn!(seq, error = %e, "an archived frame did not read");
                    self.cut(send, Cut::ReadFailed);
                    return Ok(FrameSent::Cut);
                }
            }
        }
    }

    /// Frames from `from` on, each as it becomes durable, until the client
    /// goes or the primary stops.
    pub(super) async fn tail(
        &self,
        caller: &Caller,
        from: u64,
        mut send: SendStream,
    ) -> Result<(), NetError> {
        let first = self.log.first_seq();
        let mut next = from.max(1);
        if next < first {
            let Some(src) = self.archive().map(|a| a.tiered_source()) else {
                let e = ReadRefusal::BelowFloor { seq: next, first };
                return self
                    .answer_with(&mut send, Response::Error(ApiError::Read(e)))
                    .await;
            };
            // Below the floor, from the archive, until the log holds the
            // next frame: retention drops only what the archive holds.
            let _held = caller
                .memory
                .charge(u64::from(crate::archive::object::PIECE_LEN))
                .await;
            let mut frames = match ArchivedFrames::at(src, next).await {
                Ok(f) => f,
                Err(e) => {
                    let e = match e {
                        crate::archive::Error::Missing(_) => {
                            ReadRefusal::BelowFloor { seq: next, first }
                        }
                        e => archive_refusal(next, e),
                    };
                    return self
                        .answer_with(&mut send, Response::Error(ApiError::Read(e)))
                        .await;
                }
            };
            while next < self.log.first_seq() {
                match self.send_archived(&mut frames, next, &mut send).await? {
                    FrameSent::Whole => next += 1,
                    FrameSent::Nothing(e) => {
                        return self
                            .answer_with(&mut send, Response::Error(ApiError::Read(e)))
                            .await
                    }
                    FrameSent::Cut => return Ok(()),
                }
            }
        }
        let mut head_rx = self.durable.subscribe();
        loop {
            while next <= self.log.head_seq() {
                match self.write_frame(caller, next, &mut send).await? {
                    FrameSent::Whole => next += 1,
                    FrameSent::Nothing(e) => {
                        return self
                            .answer_with(&mut send, Response::Error(ApiError::Read(e)))
                            .await
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
                // A client that stopped reading ends its tail now, not at
                // the next frame.
                _ = send.stopped() => return Ok(()),
                // Wakes a tail now and then to notice a shutdown.
                _ = tokio::time::sleep(Duration::from_millis(500)) => {}
            }
        }
    }

    /// An object read out: `Object` with its length, then its bytes a
    /// piece at a time; a failure past the head resets the stream. The
    /// object is opened under the store's lock and read without it, so a
    /// client that reads slowly holds no one up.
    pub(super) async fn send_object(
        &self,
        caller: &Caller,
        mut send: SendStream,
        open: impl FnOnce(&crate::store::Store) -> Result<Option<Opened>, crate::store::StoreError>
            + Send
            + 'static,
    ) -> Result<(), NetError> {
        let host = match self.store() {
            Ok(h) => h,
            Err(e) => return self.answer_with(&mut send, Response::Error(e)).await,
        };
        let _piece = caller.memory.charge(PIECE as u64).await;
        let opened = self
            .pool
            .run(move || host.lock().and_then(|store| open(&store)))
            .await
            .unwrap_or_else(|e| Err(crate::store::StoreError::Closed(e.to_string())));
        let o = match opened {
            Ok(Some(o)) => o,
            Ok(None) => return self.answer_with(&mut send, Response::Absent).await,
            Err(e) => return self.answer_with(&mut send, Response::Error(e.into())).await,
        };
        let head = crate::repl::msg::encode(&Response::Object {
            obj_type: o.obj_type,
            len: o.len,
        });
        if self.send_pieces(&mut send, &head, Some(o.pieces)).await? {
            let _ = send.finish();
        }
        Ok(())
    }

    /// The store's listings and `Have`: answered from the state the store
    /// has applied. A listing is built under the store's lock, charged to
    /// the client before it is held any longer (built again, once there is
    /// room, when there was none), and sent in pieces.
    pub(super) async fn store_read(
        &self,
        caller: &Caller,
        req: Request,
        mut send: SendStream,
    ) -> Result<(), NetError> {
        let host = match self.store() {
            Ok(h) => h,
            Err(e) => return self.answer_with(&mut send, Response::Error(e)).await,
        };
        let mut held: Option<(shares::Held, u64)> = None;
        let built = loop {
            let (host, req, memory) = (host.clone(), req.clone(), caller.memory.clone());
            let prior = held.take();
            let built = self
                .pool
                .run(move || {
                    let (resp, trailer) = store_requests::store_answer(&host, req)?;
                    let len = trailer.len() as u64;
                    if len > MAX_LISTING {
                        return Err(ApiError::Refused(WriteRefusal::TooLarge {
                            what: "a listing".into(),
                            len,
                            max: MAX_LISTING,
                        }));
                    }
                    let charge = match prior {
                        Some((h, room)) if room >= len => Some(h),
                        _ => memory.try_charge(len),
                    };
                    Ok(match charge {
                        Some(h) => Ok((resp, trailer, h)),
                        None => Err(len),
                    })
                })
                .await
                .unwrap_or_else(|e| Err(ApiError::Store(e.to_string())));
            match built {
                Ok(Ok(done)) => break Ok(done),
                Ok(Err(len)) => held = Some((caller.memory.charge(len).await, len)),
                Err(e) => break Err(e),
            }
        };
        match built {
            Ok((resp, trailer, _held)) => {
                let mut out = crate::repl::msg::encode(&resp);
                let split = trailer.len().min(PIECE);
                out.extend_from_slice(&trailer[..split]);
                self.send_within(&mut send, &out).await?;
                for piece in trailer[split..].chunks(PIECE) {
                    self.send_within(&mut send, piece).await?;
                }
                let _ = send.finish();
                Ok(())
            }
            Err(e) => self.answer_with(&mut send, Response::Error(e)).await,
        }
    }
}

/// A frame's head message and first piece, and the reader of the rest
/// when there is more.
/// Why the archive did not give a frame, as a read refusal.
fn archive_refusal(seq: u64, e: crate::archive::Error) -> ReadRefusal {
    ReadRefusal::Unreadable {
        seq,
        why: format!("below the local floor, from the archive: {e}"),
    }
}

fn open_frame(log: &Log, seq: u64) -> Result<(Vec<u8>, Option<BlobReader>), ReadRefusal> {
    let mut reader = log
        .blob_reader_from(seq, 0)
        .map_err(|e| ReadRefusal::of(seq, e))?;
    let loc = reader.located();
    let head = Response::Frame {
        seq,
        kind: loc.kind,
        meta: loc.meta.clone(),
        blob_len: if loc.is_erased() { 0 } else { loc.blob_len },
        payload_crc: loc.payload_crc,
    };
    let mut out = crate::repl::msg::encode(&head);
    let at = out.len();
    out.resize(at + reader.left().min(PIECE as u64) as usize, 0);
    let (n, last) = reader
        .next_piece(&mut out[at..])
        .map_err(|e| ReadRefusal::of(seq, e))?;
    out.truncate(at + n);
    Ok((out, (!last).then_some(reader)))
}
