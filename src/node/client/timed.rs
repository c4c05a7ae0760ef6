//! Every wait on the primary under the client's deadline, and a length the
//! server announces read under a cap: what the client and its tail share.

use std::future::Future;
use std::time::Duration;

use super::error::ClientError;
use crate::net::NetError;

/// The pieces a body is written in, each within the deadline.
pub(super) const BODY_PIECE: usize = 1 << 20;

/// `fut`, a wait on the primary over `conn`, given `after`: past it, or
/// when QUIC gave the connection up for the primary's silence (its idle
/// timeout is the deadline), the deadline's error.
pub(crate) async fn timed<T, E: Into<ClientError>>(
    conn: &quinn::Connection,
    after: Duration,
    fut: impl Future<Output = Result<T, E>>,
) -> Result<T, ClientError> {
    match tokio::time::timeout(after, fut).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(silent(conn, after, e.into())),
        Err(_) => Err(ClientError::Deadline { after }),
    }
}

/// A network error on a connection QUIC gave up for the primary's silence
/// is the deadline's.
pub(super) fn silent(conn: &quinn::Connection, after: Duration, e: ClientError) -> ClientError {
    match (&e, conn.close_reason()) {
        (ClientError::Net(_), Some(quinn::ConnectionError::TimedOut)) => {
            ClientError::Deadline { after }
        }
        _ => e,
    }
}

/// The largest blob [`Client::read`] and [`Tailing::next`] take whole: a
/// frame larger than this is refused by name before anything is read.
pub const MAX_WHOLE_BLOB: u64 = 1 << 30;

/// Read the `len` bytes a server announced, capped at `max`: refused by
/// name past it, and memory grows with the bytes that arrive, never with
/// what was announced, so a server that lies about a length cannot make
/// this side allocate what it never sends. Each piece comes within the
/// deadline `after`.
pub(crate) async fn read_announced(
    conn: &quinn::Connection,
    after: Duration,
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
        let chunk = timed(conn, after, async {
            recv.read_chunk(want, true)
                .await
                .map_err(|e| NetError::Io(std::io::Error::other(e.to_string())))
        })
        .await?;
        match chunk {
            Some(chunk) => out.extend_from_slice(&chunk.bytes),
            None => {
                return Err(ClientError::Unexpected(format!(
                    "{what}: the server announced {len} bytes and sent {}",
                    out.len()
                )))
            }
        }
    }
    Ok(out)
}
