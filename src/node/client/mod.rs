//! The typed client of a primary, used by the command line and the tests.
//!
//! Every wait on the primary has a deadline ([`ClientOptions::deadline`],
//! 5 s unless told): a request's answer must come within it, and so must
//! each piece of a body that streams, either way. So a transfer takes as
//! long as it needs while bytes move (a 1 GiB upload on a slow link is not
//! cut), and a primary that stops answering, or stops taking bytes, ends
//! the call with [`ClientError::Deadline`] after the deadline, never after
//! QUIC's idle timeout: the connection's idle timeout is the deadline too,
//! with keep-alives that keep a quiet connection, or a tail waiting for
//! frames, open. A write's answer also waits a second per MiB of its body,
//! the time to make it durable and ship it to the twin, which starts once
//! the primary has it whole.
//!
//! The folder owns the client side and the wire it shares with the
//! primary: [`api`] (requests and answers), [`refusal`] (refusals by name),
//! the pipe of small requests, the store's calls ([`store_client`]). May
//! not touch the daemons: nothing here serves, only asks.

pub mod api;
mod error;
pub mod follow;
mod pipe;
pub mod refusal;
pub mod status;
pub mod store_client;
mod tail;
mod timed;

pub use error::ClientError;
pub use follow::{FollowOptions, Following, Locate, PrimaryAt};
pub use tail::{FrameHead, Tailing};
pub use timed::MAX_WHOLE_BLOB;
pub(crate) use timed::{read_announced, timed};
use timed::{silent, BODY_PIECE};

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use crate::log::Entry;
use crate::net::{self, Fingerprint, Identity, NetError, Pins, Role};
use api::{ApiError, Durability, PipedRef, Request, Response, Status, PIPED_BODY_MAX};
use pipe::Pipe;

/// A frame as its application appended it: a frame appended once
/// without its id, any other as it is.
pub(crate) fn as_appended(kind: u16, meta: Vec<u8>) -> (u16, Vec<u8>) {
    match crate::log::once::as_appended(kind, &meta) {
        (app, inner, Some(_)) => (app, inner.to_vec()),
        (_, _, None) => (kind, meta),
    }
}

/// How long a client waits for the primary unless told otherwise.
pub const DEFAULT_DEADLINE: Duration = Duration::from_secs(5);

/// A write's answer waits, past the deadline, a second per this many
/// bytes of its body: the primary makes the body durable, and ships it to
/// the twin only once it has it whole. A twin link slower than this needs a
/// longer deadline for large `twin` writes.
const BODY_BYTES_PER_SEC: u64 = 1 << 20;

/// The time a write's answer waits past the deadline for a body of
/// `len` bytes to become durable and reach the twin.
fn syncing(len: u64) -> Duration {
    Duration::from_micros(len.saturating_mul(1_000_000) / BODY_BYTES_PER_SEC)
}

/// How a client waits for the primary.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClientOptions {
    /// The longest wait on the primary: for a request's answer, and for
    /// each piece of a body moving either way. Also the connection's idle
    /// timeout, so a primary gone silent is given up as soon.
    pub deadline: Duration,
}

impl Default for ClientOptions {
    fn default() -> Self {
        ClientOptions {
            deadline: DEFAULT_DEADLINE,
        }
    }
}

/// How long [`Client::close`] gives its close to go out.
const CLOSE_WAIT: Duration = Duration::from_millis(100);

impl Drop for Client {
    fn drop(&mut self) {
        self.conn.close(0u32.into(), b"the client is done");
    }
}

/// How long a restore waits for its handshake with the twin.
pub const CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(3);

/// An acknowledged append.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Appended {
    pub seq: u64,
    pub durability: Durability,
    /// How long the primary waited, after the frame was durable locally,
    /// for the twin to acknowledge it.
    pub twin_wait: std::time::Duration,
}

/// A connection to a primary.
///
/// Appends of a blob in hand and status requests go on two pipelines,
/// shared by every caller of this client and opened at their first use:
/// one for blobs up to [`PIPED_BODY_MAX`] and status, one for larger
/// blobs, so that a large upload never holds up a small append. The other
/// requests take a stream each.
pub struct Client {
    _endpoint: quinn::Endpoint,
    pub(crate) conn: quinn::Connection,
    deadline: Duration,
    pipe: tokio::sync::Mutex<PipeSlot>,
    bulk: tokio::sync::Mutex<PipeSlot>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("primary", &self.conn.remote_address())
            .field("deadline", &self.deadline)
            .finish()
    }
}

/// This client's pipeline.
enum PipeSlot {
    Unopened,
    Open(Arc<Pipe>),
    /// The primary does not take pipelines: every request takes a stream.
    Unsupported,
}

impl Client {
    /// Connect to the primary at `addr`, pinned by `primary`, with the
    /// default options.
    pub async fn connect(
        identity: &Identity,
        primary: Fingerprint,
        addr: SocketAddr,
    ) -> Result<Client, ClientError> {
        Self::connect_with(identity, primary, addr, ClientOptions::default()).await
    }

    /// Connect to the primary at `addr`, pinned by `primary`; the handshake
    /// too is given the deadline.
    pub async fn connect_with(
        identity: &Identity,
        primary: Fingerprint,
        addr: SocketAddr,
        opts: ClientOptions,
    ) -> Result<Client, ClientError> {
        let pins = Arc::new(Pins::new().pin(primary, Role::Primary));
        let endpoint = net::client_with(identity, pins, net::Liveness::client(opts.deadline))?;
        let conn = match tokio::time::timeout(opts.deadline, net::connect(&endpoint, addr)).await {
            Ok(Ok(conn)) => conn,
            // QUIC's idle timeout, the deadline too, may end the handshake
            // first.
            Ok(Err(NetError::Connection(quinn::ConnectionError::TimedOut))) | Err(_) => {
                return Err(ClientError::Deadline {
                    after: opts.deadline,
                })
            }
            Ok(Err(e)) => return Err(e.into()),
        };
        Ok(Client {
            _endpoint: endpoint,
            conn,
            deadline: opts.deadline,
            pipe: tokio::sync::Mutex::new(PipeSlot::Unopened),
            bulk: tokio::sync::Mutex::new(PipeSlot::Unopened),
        })
    }

    /// The longest wait on the primary.
    pub fn deadline(&self) -> Duration {
        self.deadline
    }

    /// Close the connection and give the close a moment to reach the
    /// primary, which frees this client's connection there at once rather
    /// than at its idle timeout. A client that is dropped closes too, but
    /// a process that exits right after may not send it: a command line
    /// calls this before it exits.
    pub async fn close(&self) {
        self.conn.close(0u32.into(), b"the client is done");
        let _ = tokio::time::timeout(CLOSE_WAIT, self._endpoint.wait_idle()).await;
    }

    /// `fut`, a wait on the primary, within the deadline.
    pub(crate) async fn timed<T, E: Into<ClientError>>(
        &self,
        fut: impl Future<Output = Result<T, E>>,
    ) -> Result<T, ClientError> {
        timed(&self.conn, self.deadline, fut).await
    }

    /// A new request stream.
    pub(crate) async fn open(&self) -> Result<(quinn::SendStream, quinn::RecvStream), ClientError> {
        self.timed(async { self.conn.open_bi().await.map_err(NetError::from) })
            .await
    }

    /// A request with its body in memory, and its answer.
    pub(crate) async fn call(
        &self,
        req: &Request,
        blob: &[u8],
    ) -> Result<(Response, quinn::RecvStream), ClientError> {
        let (mut send, mut recv) = self.open().await?;
        let mut body = blob;
        let wrote = self
            .send_body(&mut send, req, blob.len() as u64, &mut body)
            .await;
        let _ = send.finish();
        let resp = self.answer(wrote, &mut recv, blob.len() as u64).await?;
        Ok((resp, recv))
    }

    /// A request and its blob in hand on a pipeline, and its answer; on a
    /// stream of its own where the primary takes no pipelines.
    pub(crate) async fn piped(&self, req: Request, body: &[u8]) -> Result<Response, ClientError> {
        let slot = match body.len() as u64 > PIPED_BODY_MAX {
            true => &self.bulk,
            false => &self.pipe,
        };
        let mut retried = false;
        loop {
            let Some(pipe) = self.pipe(slot).await? else {
                return Ok(self.call(&req, body).await?.0);
            };
            let mut waiting = match self.timed(pipe.enter()).await {
                Ok(waiting) => waiting,
                // A pipeline that ended before this call took its place in
                // it was sent nothing of this call: a new one takes it.
                Err(ClientError::Net(_)) if !retried => {
                    retried = true;
                    continue;
                }
                Err(e) => return Err(e),
            };
            let head = crate::repl::msg::encode(&PipedRef {
                id: waiting.id(),
                req: &req,
            });
            crate::budget::mark(crate::budget::Stage::ClientSend);
            pipe.write(&[&head, body], self.deadline)
                .await
                .map_err(|e| silent(&self.conn, self.deadline, e))?;
            let after = self.deadline.saturating_add(syncing(body.len() as u64));
            let answer = waiting.answer(after).await;
            crate::budget::mark(crate::budget::Stage::ClientReceived);
            return match answer {
                Ok(Response::Error(e)) => Err(e.into()),
                Ok(resp) => Ok(resp),
                Err(e) => Err(silent(&self.conn, self.deadline, e)),
            };
        }
    }

    /// The pipeline in `slot`, opened at the first call and again after
    /// one ended; `None` when the primary takes none.
    async fn pipe(
        &self,
        slot: &tokio::sync::Mutex<PipeSlot>,
    ) -> Result<Option<Arc<Pipe>>, ClientError> {
        let mut slot = slot.lock().await;
        match &*slot {
            PipeSlot::Open(pipe) if pipe.ended().is_none() => return Ok(Some(pipe.clone())),
            PipeSlot::Unsupported => return Ok(None),
            _ => {}
        }
        let (mut send, mut recv) = self.open().await?;
        self.timed(net::write_msg(&mut send, &Request::Pipeline))
            .await?;
        match self.timed(Self::response(&mut recv)).await {
            Ok(Response::Pipelining { in_flight, .. }) => {
                let pipe = Arc::new(Pipe::new(send, recv, in_flight));
                *slot = PipeSlot::Open(pipe.clone());
                Ok(Some(pipe))
            }
            // A primary from before pipelines does not know the request.
            Err(ClientError::Api(ApiError::BadRequest(_))) => {
                *slot = PipeSlot::Unsupported;
                Ok(None)
            }
            Err(e) => Err(e),
            Ok(other) => Err(ClientError::Unexpected(format!("{other:?}"))),
        }
    }

    /// A request with a body of `len` bytes read from `body`, and its
    /// answer.
    pub(crate) async fn call_streamed<R: tokio::io::AsyncRead + Unpin>(
        &self,
        req: &Request,
        len: u64,
        body: &mut R,
    ) -> Result<Response, ClientError> {
        let (mut send, mut recv) = self.open().await?;
        let wrote = self.send_body(&mut send, req, len, body).await;
        let _ = send.finish();
        self.answer(wrote, &mut recv, len).await
    }

    /// A request and then `len` bytes read from `body` a piece at a time,
    /// each piece taken by the primary within the deadline: memory is one
    /// piece whatever the size. A body that ends early leaves the request
    /// short, which the primary refuses.
    async fn send_body<R: tokio::io::AsyncRead + Unpin>(
        &self,
        send: &mut quinn::SendStream,
        req: &Request,
        len: u64,
        body: &mut R,
    ) -> Result<(), ClientError> {
        use tokio::io::AsyncReadExt;
        self.timed(net::write_msg(send, req)).await?;
        let mut buf = vec![0u8; BODY_PIECE.min(len as usize)];
        let mut left = len;
        while left > 0 {
            let want = buf.len().min(left as usize);
            // The caller's reader (a file, stdin) is not the primary: it is
            // not timed.
            let n = body.read(&mut buf[..want]).await.map_err(NetError::from)?;
            if n == 0 {
                break;
            }
            self.timed(async { send.write_all(&buf[..n]).await.map_err(NetError::from) })
                .await?;
            left -= n as u64;
        }
        Ok(())
    }

    /// The answer to a request whose bytes may not all have been taken: a
    /// primary that refuses a request answers before it reads the blob and
    /// stops the stream, and its answer, not the stopped write, says why.
    /// It waits the deadline, and a second more per MiB of `body_len`.
    async fn answer(
        &self,
        wrote: Result<(), ClientError>,
        recv: &mut quinn::RecvStream,
        body_len: u64,
    ) -> Result<Response, ClientError> {
        // A primary that stopped taking bytes will not answer either.
        if let Err(e @ ClientError::Deadline { .. }) = wrote {
            return Err(e);
        }
        let after = self.deadline.saturating_add(syncing(body_len));
        match (timed(&self.conn, after, Self::response(recv)).await, wrote) {
            (Ok(resp), _) => Ok(resp),
            (Err(e @ (ClientError::Api(_) | ClientError::Deadline { .. })), _) => Err(e),
            (Err(_), Err(write)) => Err(write),
            (Err(read), Ok(())) => Err(read),
        }
    }

    /// The answer to a request: a named error, or the response.
    async fn response(recv: &mut quinn::RecvStream) -> Result<Response, ClientError> {
        match net::read_msg::<Response>(recv).await? {
            None => Err(ClientError::Unexpected("no answer".into())),
            Some(Response::Error(e)) => Err(e.into()),
            Some(resp) => Ok(resp),
        }
    }

    /// The `len` bytes announced after an answer on `recv`, capped at
    /// `max`, each piece within the deadline.
    pub(crate) async fn read_body(
        &self,
        recv: &mut quinn::RecvStream,
        len: u64,
        max: u64,
        what: &str,
    ) -> Result<Vec<u8>, ClientError> {
        read_announced(&self.conn, self.deadline, recv, len, max, what).await
    }

    /// Append a frame; answers its sequence and the durability reached
    /// (`Local` for a `Twin` append only under the fall-back policy).
    pub async fn append(
        &self,
        kind: u16,
        meta: &[u8],
        blob: &[u8],
        durability: Durability,
    ) -> Result<(u64, Durability), ClientError> {
        self.append_timed(kind, meta, blob, durability)
            .await
            .map(|a| (a.seq, a.durability))
    }

    /// [`Client::append`], with how long the primary waited for the twin.
    pub async fn append_timed(
        &self,
        kind: u16,
        meta: &[u8],
        blob: &[u8],
        durability: Durability,
    ) -> Result<Appended, ClientError> {
        let req = Request::Append {
            kind,
            meta: meta.to_vec(),
            blob_len: blob.len() as u64,
            durability,
            once: None,
        };
        Self::appended(self.piped(req, blob).await?)
    }

    /// An append request built by the caller (`once`, inside `Seen`),
    /// with its blob in hand, and its acknowledgement.
    pub async fn append_with(&self, req: Request, blob: &[u8]) -> Result<Appended, ClientError> {
        Self::appended(self.piped(req, blob).await?)
    }

    pub(crate) fn appended(resp: Response) -> Result<Appended, ClientError> {
        match resp {
            Response::Appended {
                seq,
                durability,
                twin_wait_us,
            } => Ok(Appended {
                seq,
                durability,
                twin_wait: std::time::Duration::from_micros(twin_wait_us),
            }),
            other => Err(ClientError::Unexpected(format!("{other:?}"))),
        }
    }

    /// Append a blob of `len` bytes read from `blob` in pieces: memory is a
    /// piece whatever the size. A reader that ends early makes the primary
    /// refuse the frame.
    pub async fn append_reader<R: tokio::io::AsyncRead + Unpin>(
        &self,
        kind: u16,
        meta: &[u8],
        len: u64,
        mut blob: R,
        durability: Durability,
    ) -> Result<Appended, ClientError> {
        let req = Request::Append {
            kind,
            meta: meta.to_vec(),
            blob_len: len,
            durability,
            once: None,
        };
        Self::appended(self.call_streamed(&req, len, &mut blob).await?)
    }

    /// Read one frame whole.
    pub async fn read(&self, seq: u64) -> Result<Entry, ClientError> {
        let (resp, mut recv) = self.call(&Request::Read { seq }, &[]).await?;
        let Response::Frame {
            seq,
            kind,
            meta,
            blob_len,
            payload_crc,
        } = resp
        else {
            return Err(ClientError::Unexpected(format!("{resp:?}")));
        };
        let blob = self
            .read_body(&mut recv, blob_len, MAX_WHOLE_BLOB, "a frame")
            .await?;
        let (kind, meta) = as_appended(kind, meta);
        Ok(Entry {
            seq,
            kind,
            meta,
            blob,
            payload_crc,
        })
    }

    /// Follow the log from `from`: frames as they become durable. The
    /// wait for the next frame has no deadline (a quiet log sends none);
    /// a primary gone silent still ends it after the deadline.
    pub async fn tail(&self, from: u64) -> Result<Tailing, ClientError> {
        let (mut send, recv) = self.open().await?;
        self.timed(net::write_msg(&mut send, &Request::Tail { from }))
            .await?;
        let _ = send.finish();
        Ok(Tailing::new(recv, self.conn.clone(), self.deadline))
    }

    /// The primary's status.
    pub async fn status(&self) -> Result<Status, ClientError> {
        match self.piped(Request::Status, &[]).await? {
            Response::Status(s) => Ok(*s),
            other => Err(ClientError::Unexpected(format!("{other:?}"))),
        }
    }

    /// Hand the primary role to the twin (admin): answers the new epoch,
    /// the head the twin took over at, and where the new primary serves.
    pub async fn switchover(
        &self,
        wait: std::time::Duration,
    ) -> Result<(u64, u64, crate::node::api::NewPrimary), ClientError> {
        let req = Request::Switchover {
            wait_ms: wait.as_millis() as u64,
        };
        match self.call(&req, &[]).await?.0 {
            Response::SwitchedOver {
                epoch,
                head,
                primary,
            } => Ok((epoch, head, primary)),
            other => Err(ClientError::Unexpected(format!("{other:?}"))),
        }
    }

    /// Compare the twin's frames with the primary's (admin), each box
    /// digesting at `mib_per_s` (0: the default): what it found. The
    /// answer waits as long as the verify takes, `timeout` at most.
    pub async fn verify(
        &self,
        from: u64,
        through: u64,
        mib_per_s: u32,
    ) -> Result<crate::node::verify::VerifyReport, ClientError> {
        let req = Request::Verify {
            from,
            through,
            mib_per_s,
        };
        match self.call(&req, &[]).await?.0 {
            Response::Verified(r) => Ok(r),
            other => Err(ClientError::Unexpected(format!("{other:?}"))),
        }
    }

    /// Hold the primary (admin): it fences itself, durably, and
    /// acknowledges no write until `primary unfence`; `epoch` is the
    /// operator's note (0: none), proven by no box. Answers its status.
    pub async fn fence(&self, epoch: u64) -> Result<Status, ClientError> {
        match self.call(&Request::Fence { epoch }, &[]).await?.0 {
            Response::Status(s) => Ok(*s),
            other => Err(ClientError::Unexpected(format!("{other:?}"))),
        }
    }
}
