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
}

/// A connection to a primary.
#[derive(Debug)]
pub struct Client {
    _endpoint: quinn::Endpoint,
    conn: quinn::Connection,
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
        let conn = net::connect(&endpoint, addr).await?;
        Ok(Client {
            _endpoint: endpoint,
            conn,
        })
    }

    async fn call(
        &self,
        req: &Request,
        blob: &[u8],
    ) -> Result<(Response, quinn::RecvStream), ClientError> {
        let (mut send, mut recv) = self.conn.open_bi().await.map_err(NetError::from)?;
        net::write_msg(&mut send, req).await?;
        if !blob.is_empty() {
            send.write_all(blob).await.map_err(NetError::from)?;
        }
        let _ = send.finish();
        let resp = net::read_msg::<Response>(&mut recv)
            .await?
            .ok_or_else(|| ClientError::Unexpected("no answer".into()))?;
        if let Response::Error(e) = resp {
            return Err(e.into());
        }
        Ok((resp, recv))
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
        let req = Request::Append {
            kind,
            meta: meta.to_vec(),
            blob_len: blob.len() as u64,
            durability,
        };
        match self.call(&req, blob).await?.0 {
            Response::Appended { seq, durability } => Ok((seq, durability)),
            other => Err(ClientError::Unexpected(format!("{other:?}"))),
        }
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
        let mut blob = vec![0u8; blob_len as usize];
        recv.read_exact(&mut blob).await.map_err(NetError::from)?;
        Ok(Entry {
            seq,
            kind,
            meta,
            blob,
            payload_crc,
        })
    }

    /// The primary's status.
    pub async fn status(&self) -> Result<Status, ClientError> {
        match self.call(&Request::Status, &[]).await?.0 {
            Response::Status(s) => Ok(s),
            other => Err(ClientError::Unexpected(format!("{other:?}"))),
        }
    }
}
