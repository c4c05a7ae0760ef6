//! The typed client of a primary, used by the command line and the tests.

use std::net::SocketAddr;
use std::sync::Arc;

use super::api::{ApiError, Durability, Request, Response, Status};
use crate::log::Entry;
use crate::net::{self, Fingerprint, Identity, NetError, Pins, Role};

/// What a client call fails at.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error(transparent)]
    Net(#[from] NetError),
    #[error(transparent)]
    Api(#[from] ApiError),
    #[error("unexpected answer: {0}")]
    Unexpected(String),
    /// Reading the git repository to import failed.
    #[error("import: {0}")]
    Import(String),
}

/// The largest blob [`Client::read`] and [`Tailing::next`] take whole: a
/// frame larger than this is refused by name before anything is read.
pub const MAX_WHOLE_BLOB: u64 = 1 << 30;

/// Read the `len` bytes a server announced, capped at `max`: refused by
/// name past it, and memory grows with the bytes that arrive, never with
/// what was announced, so a server that lies about a length cannot make
/// this side allocate what it never sends.
pub(crate) async fn read_announced(
    recv: &mut quinn::RecvStream,
    len: u64,
    max: u64,
    what: &str,
) -> Result<Vec<u8>, ClientError> {
    if len > max {
        return Err(ClientError::Unexpected(format!(
            "the server announced {what} of {len} bytes; at most {max} are taken"
        )));
    }
    let mut out = Vec::with_capacity(len.min(1 << 20) as usize);
    while (out.len() as u64) < len {
        let want = ((len - out.len() as u64).min(1 << 20)) as usize;
        match recv.read_chunk(want, true).await {
            Ok(Some(chunk)) => out.extend_from_slice(&chunk.bytes),
            Ok(None) => {
                return Err(ClientError::Unexpected(format!(
                    "{what}: the server announced {len} bytes and sent {}",
                    out.len()
                )))
            }
            Err(e) => {
                return Err(NetError::Io(std::io::Error::other(e.to_string())).into());
            }
        }
    }
    Ok(out)
}

/// How long [`Client::connect`] waits for the handshake.
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
#[derive(Debug)]
pub struct Client {
    _endpoint: quinn::Endpoint,
    pub(crate) conn: quinn::Connection,
}

impl Client {
    /// Connect to the primary at `addr`, pinned by `primary`.
    pub async fn connect(
        identity: &Identity,
        primary: Fingerprint,
        addr: SocketAddr,
    ) -> Result<Client, ClientError> {
        let pins = Arc::new(Pins::new().pin(primary, Role::Primary));
        let endpoint = net::client(identity, pins)?;
        // An unreachable primary would otherwise cost QUIC's whole idle
        // timeout before the caller hears of it.
        let conn = tokio::time::timeout(CONNECT_TIMEOUT, net::connect(&endpoint, addr))
            .await
            .map_err(|_| NetError::Io(std::io::Error::from(std::io::ErrorKind::TimedOut)))??;
        Ok(Client {
            _endpoint: endpoint,
            conn,
        })
    }

    pub(crate) async fn call(
        &self,
        req: &Request,
        blob: &[u8],
    ) -> Result<(Response, quinn::RecvStream), ClientError> {
        let (mut send, mut recv) = self.conn.open_bi().await.map_err(NetError::from)?;
        let wrote = async {
            net::write_msg(&mut send, req).await?;
            if !blob.is_empty() {
                send.write_all(blob).await.map_err(NetError::from)?;
            }
            Ok::<(), NetError>(())
        }
        .await;
        let _ = send.finish();
        let resp = Self::answer(wrote, &mut recv).await?;
        Ok((resp, recv))
    }

    /// A request and then `len` bytes read from `body` a piece at a time:
    /// memory is one piece whatever the size. A body that ends early leaves
    /// the request short, which the primary refuses.
    pub(crate) async fn send_streamed<R: tokio::io::AsyncRead + Unpin>(
        send: &mut quinn::SendStream,
        req: &Request,
        len: u64,
        body: &mut R,
    ) -> Result<(), NetError> {
        use tokio::io::AsyncReadExt;
        net::write_msg(send, req).await?;
        let mut buf = vec![0u8; 1 << 20];
        let mut left = len;
        while left > 0 {
            let want = buf.len().min(left as usize);
            let n = body.read(&mut buf[..want]).await?;
            if n == 0 {
                break;
            }
            send.write_all(&buf[..n]).await?;
            left -= n as u64;
        }
        Ok(())
    }

    /// The answer to a request whose bytes may not all have been taken: a
    /// primary that refuses a request answers before it reads the blob and
    /// stops the stream, and its answer, not the stopped write, says why.
    pub(crate) async fn answer(
        wrote: Result<(), NetError>,
        recv: &mut quinn::RecvStream,
    ) -> Result<Response, ClientError> {
        match (Self::response(recv).await, wrote) {
            (Ok(resp), _) => Ok(resp),
            (Err(ClientError::Api(e)), _) => Err(ClientError::Api(e)),
            (Err(_), Err(write)) => Err(write.into()),
            (Err(read), Ok(())) => Err(read),
        }
    }

    /// The answer to a request: a named error, or the response.
    pub(crate) async fn response(recv: &mut quinn::RecvStream) -> Result<Response, ClientError> {
        match net::read_msg::<Response>(recv).await? {
            None => Err(ClientError::Unexpected("no answer".into())),
            Some(Response::Error(e)) => Err(e.into()),
            Some(resp) => Ok(resp),
        }
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
        };
        Self::appended(self.call(&req, blob).await?.0)
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
        };
        let (mut send, mut recv) = self.conn.open_bi().await.map_err(NetError::from)?;
        let wrote = Self::send_streamed(&mut send, &req, len, &mut blob).await;
        let _ = send.finish();
        Self::appended(Self::answer(wrote, &mut recv).await?)
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
        let blob = read_announced(&mut recv, blob_len, MAX_WHOLE_BLOB, "a frame").await?;
        Ok(Entry {
            seq,
            kind,
            meta,
            blob,
            payload_crc,
        })
    }

    /// Follow the log from `from`: frames as they become durable.
    pub async fn tail(&self, from: u64) -> Result<Tailing, ClientError> {
        let (mut send, recv) = self.conn.open_bi().await.map_err(NetError::from)?;
        net::write_msg(&mut send, &Request::Tail { from }).await?;
        let _ = send.finish();
        Ok(Tailing { recv })
    }

    /// The primary's status.
    pub async fn status(&self) -> Result<Status, ClientError> {
        match self.call(&Request::Status, &[]).await?.0 {
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

    /// Tell the primary of a newer epoch: it fences itself, durably, and
    /// acknowledges no write from then on (admin). Answers its status.
    pub async fn fence(&self, epoch: u64) -> Result<Status, ClientError> {
        match self.call(&Request::Fence { epoch }, &[]).await?.0 {
            Response::Status(s) => Ok(*s),
            other => Err(ClientError::Unexpected(format!("{other:?}"))),
        }
    }
}

/// Frames from a primary as they become durable ([`Client::tail`]).
#[derive(Debug)]
pub struct Tailing {
    recv: quinn::RecvStream,
}

impl Tailing {
    /// The next frame; None when the primary ended the tail.
    pub async fn next(&mut self) -> Result<Option<Entry>, ClientError> {
        let Some(resp) = net::read_msg::<Response>(&mut self.recv).await? else {
            return Ok(None);
        };
        match resp {
            Response::Frame {
                seq,
                kind,
                meta,
                blob_len,
                payload_crc,
            } => {
                let blob =
                    read_announced(&mut self.recv, blob_len, MAX_WHOLE_BLOB, "a frame").await?;
                Ok(Some(Entry {
                    seq,
                    kind,
                    meta,
                    blob,
                    payload_crc,
                }))
            }
            Response::Error(e) => Err(e.into()),
            other => Err(ClientError::Unexpected(format!("{other:?}"))),
        }
    }
}
