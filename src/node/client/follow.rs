//! A client that follows the primary across failovers: it finds the
//! primary through a [`Locate`] (etcd's leader key, under automatic
//! failover) or from a box that names it (`NotPrimary`, or `Fenced` after
//! a switchover), and sends every append once: each carries the client's
//! id and sequence ([`AppendOnce`]), so an append retried on the new
//! primary after its answer was lost is answered with the frame already
//! there, never written twice. Every request carries the newest epoch
//! the client has seen, so a primary that was superseded refuses it by
//! name instead of answering for a life that is over.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::api::{ApiError, AppendOnce, Durability, NewPrimary, Request};
use super::refusal::WriteRefusal;
use super::{Appended, Client, ClientError, ClientOptions};
use crate::net::{Fingerprint, Identity};

/// Where a primary serves: its epoch, its client address, its
/// certificate's fingerprint.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PrimaryAt {
    pub epoch: u64,
    pub addr: SocketAddr,
    pub fingerprint: Fingerprint,
}

/// A future a [`Locate`] answers with.
pub type Located<'a> = Pin<Box<dyn Future<Output = Result<PrimaryAt, ClientError>> + Send + 'a>>;

/// Who names the current primary (etcd's leader key: `node::arbiter`).
pub trait Locate: Send + Sync {
    fn locate(&self) -> Located<'_>;
}

/// How a following client waits.
#[derive(Clone, Copy, Debug)]
pub struct FollowOptions {
    /// Each connection's waits (see [`ClientOptions`]).
    pub client: ClientOptions,
    /// How long one call goes on finding a primary that takes it: past
    /// it, the last error is returned.
    pub give_up_after: Duration,
    /// The pause between two tries while no primary takes the call.
    pub retry_every: Duration,
}

impl Default for FollowOptions {
    fn default() -> Self {
        FollowOptions {
            client: ClientOptions::default(),
            give_up_after: Duration::from_secs(30),
            retry_every: Duration::from_millis(50),
        }
    }
}

/// The connection in use, with what this primary life said of itself.
struct Current {
    at: PrimaryAt,
    client: Arc<Client>,
    /// The highest sequence known to be in this primary's log: its head
    /// when connected, raised by every answer. An append first sent now
    /// lands past it.
    after: AtomicU64,
}

/// A client of whichever box is the primary; see the module's text.
pub struct Following {
    identity: Arc<Identity>,
    locate: Option<Arc<dyn Locate>>,
    opts: FollowOptions,
    /// This client's name for its appends: 16 random bytes, new with
    /// each `Following`.
    id: [u8; 16],
    next_seq: AtomicU64,
    /// The newest epoch seen: of a primary connected to, or named.
    seen: AtomicU64,
    /// Where to go next when no connection is open and there is no
    /// locator, or a box named the primary.
    named: std::sync::Mutex<Option<PrimaryAt>>,
    current: tokio::sync::Mutex<Option<Arc<Current>>>,
    failovers: AtomicU64,
}

impl std::fmt::Debug for Following {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Following")
            .field("seen_epoch", &self.seen.load(Ordering::SeqCst))
            .field("named", &self.named())
            .finish()
    }
}

/// What to do after a call failed.
enum Next {
    /// Go where this box said the primary is.
    To(PrimaryAt),
    /// Drop the connection and find the primary again.
    Find,
    /// The same connection, after a pause (a switchover pauses writes).
    Again,
    /// Return the error: it is the answer.
    Done,
}

impl Following {
    /// A client that starts at `first` (if known) and finds the primary
    /// through `locate` (if given) whenever the one it talks to is gone or
    /// says it is not the primary. One of the two is needed.
    pub fn new(
        identity: Arc<Identity>,
        first: Option<PrimaryAt>,
        locate: Option<Arc<dyn Locate>>,
        opts: FollowOptions,
    ) -> Result<Following, ClientError> {
        if first.is_none() && locate.is_none() {
            return Err(ClientError::Locate(
                "a following client needs a primary to start at or a way to find one".into(),
            ));
        }
        let id = crate::log::HistoryId::mint()
            .map_err(|e| ClientError::Net(crate::net::NetError::Io(e)))?
            .0;
        Ok(Following {
            identity,
            locate,
            opts,
            id,
            next_seq: AtomicU64::new(0),
            seen: AtomicU64::new(first.map_or(0, |a| a.epoch)),
            named: std::sync::Mutex::new(first),
            current: tokio::sync::Mutex::new(None),
            failovers: AtomicU64::new(0),
        })
    }

    /// The id this client's appends carry.
    pub fn client_id(&self) -> [u8; 16] {
        self.id
    }

    /// The newest epoch this client has seen.
    pub fn seen_epoch(&self) -> u64 {
        self.seen.load(Ordering::SeqCst)
    }

    /// How many times this client moved to another primary.
    pub fn moves(&self) -> u64 {
        self.failovers.load(Ordering::SeqCst)
    }

    /// The primary this client talks to now, if connected.
    pub async fn primary(&self) -> Option<PrimaryAt> {
        self.current.lock().await.as_ref().map(|c| c.at)
    }

    /// Close the connection in use, letting its close go out.
    pub async fn close(&self) {
        let cur = self.current.lock().await.take();
        if let Some(cur) = cur {
            cur.client.close().await;
        }
    }

    fn named(&self) -> Option<PrimaryAt> {
        *self.named.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn saw(&self, epoch: u64) {
        self.seen.fetch_max(epoch, Ordering::SeqCst);
    }

    /// Append a frame of an application's `kind`, at most once however
    /// often it must be sent; answered as durable as `durability` asks, by
    /// whichever box is the primary. Failovers and lost answers are gone
    /// through for up to [`FollowOptions::give_up_after`].
    pub async fn append(
        &self,
        kind: u16,
        meta: &[u8],
        blob: &[u8],
        durability: Durability,
    ) -> Result<Appended, ClientError> {
        let seq = self.next_seq.fetch_add(1, Ordering::SeqCst) + 1;
        // Fixed at the first send: the frame, if written anywhere, is past
        // what that primary's log held then.
        let mut after = None;
        let by = crate::node::clock::instant() + self.opts.give_up_after;
        loop {
            let failed = match self.connection().await {
                Err(e) => e,
                Ok(cur) => {
                    let once = AppendOnce {
                        client: self.id,
                        seq,
                        after: *after.get_or_insert(cur.after.load(Ordering::SeqCst)),
                    };
                    let req = Request::seen(
                        self.seen_epoch(),
                        &Request::Append {
                            kind,
                            meta: meta.to_vec(),
                            blob_len: blob.len() as u64,
                            durability,
                            once: Some(once),
                        },
                    );
                    match cur.client.append_with(req, blob).await {
                        Ok(appended) => {
                            cur.after.fetch_max(appended.seq, Ordering::SeqCst);
                            return Ok(appended);
                        }
                        Err(e) => {
                            self.after_failure(&cur, &e).await;
                            if matches!(next_after(&e), Next::Done) {
                                return Err(e);
                            }
                            e
                        }
                    }
                }
            };
            if crate::node::clock::instant() >= by {
                return Err(failed);
            }
            tokio::time::sleep(self.opts.retry_every).await;
        }
    }

    /// What a failure on `cur` changes: where to go next.
    async fn after_failure(&self, cur: &Arc<Current>, e: &ClientError) {
        let drop_it = match next_after(e) {
            Next::To(at) => {
                self.saw(at.epoch);
                *self.named.lock().unwrap_or_else(|e| e.into_inner()) = Some(at);
                true
            }
            Next::Find => true,
            Next::Again | Next::Done => false,
        };
        if drop_it {
            let mut slot = self.current.lock().await;
            if slot.as_ref().is_some_and(|c| Arc::ptr_eq(c, cur)) {
                tracing::info!(primary = %cur.at.addr, epoch = %crate::repl::epochs::EpochName(cur.at.epoch), error = %e, "leaving this primary");
                *slot = None;
            }
        }
    }

    /// The connection in use, or a new one to the primary as named or
    /// located now.
    async fn connection(&self) -> Result<Arc<Current>, ClientError> {
        let mut slot = self.current.lock().await;
        if let Some(cur) = slot.as_ref() {
            return Ok(cur.clone());
        }
        let at = self.find().await?;
        let client =
            Client::connect_with(&self.identity, at.fingerprint, at.addr, self.opts.client).await?;
        let status = client.status().await?;
        // The epoch it serves, which may be past the one it was named by.
        let at = PrimaryAt {
            epoch: status.epoch.max(at.epoch),
            ..at
        };
        self.saw(at.epoch);
        let cur = Arc::new(Current {
            at,
            client: Arc::new(client),
            after: AtomicU64::new(status.head),
        });
        let before = self.named();
        if before.is_some_and(|b| b.addr != at.addr) {
            self.failovers.fetch_add(1, Ordering::SeqCst);
        }
        *self.named.lock().unwrap_or_else(|e| e.into_inner()) = Some(at);
        *slot = Some(cur.clone());
        Ok(cur)
    }

    /// Where the primary is: as the locator says, or as last named.
    async fn find(&self) -> Result<PrimaryAt, ClientError> {
        if let Some(locate) = &self.locate {
            match locate.locate().await {
                Ok(at) => {
                    self.saw(at.epoch);
                    return Ok(at);
                }
                // The last primary named (by a box, or connected to).
                Err(e) => return self.named().ok_or(e),
            }
        }
        self.named()
            .ok_or_else(|| ClientError::Locate("no primary is known and none is named".into()))
    }
}

/// Where a failed call sends the client next.
fn next_after(e: &ClientError) -> Next {
    match e {
        ClientError::Net(_) | ClientError::Deadline { .. } => Next::Find,
        ClientError::Api(api) => match api {
            ApiError::NotPrimary {
                epoch,
                addr,
                fingerprint,
            } => named(*epoch, addr, fingerprint).map_or(Next::Find, Next::To),
            ApiError::Fenced {
                newer,
                primary: Some(NewPrimary { addr, fingerprint }),
                ..
            } => named(*newer, addr, fingerprint).map_or(Next::Find, Next::To),
            ApiError::Fenced { .. }
            | ApiError::StaleEpoch { .. }
            | ApiError::NoLease { .. }
            | ApiError::SyncNotRecorded { .. }
            | ApiError::Refused(
                WriteRefusal::Stopping { .. } | WriteRefusal::Released | WriteRefusal::Follower,
            ) => Next::Find,
            ApiError::SwitchoverRefused { .. } => Next::Again,
            _ => Next::Done,
        },
        _ => Next::Done,
    }
}

/// A primary a box named, when its address and fingerprint parse.
fn named(epoch: u64, addr: &str, fingerprint: &str) -> Option<PrimaryAt> {
    Some(PrimaryAt {
        epoch,
        addr: addr.parse().ok()?,
        fingerprint: fingerprint.parse().ok()?,
    })
}
