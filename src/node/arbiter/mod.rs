//! Automatic failover's I/O: etcd, reached through `etcd-client`. The
//! rules are [`crate::repl::arbiter`]'s (which epoch, who may take over,
//! what to record) and [`crate::repl::lease`]'s (when the lease may be
//! relied on); this reads the keys, runs the transactions and keeps the
//! lease alive.
//!
//! - [`Arbiter`]: one etcd connection and the pair's keys;
//! - [`gate`]: the primary's lease, kept alive, and the judgement every
//!   acknowledgement passes;
//! - [`life`]: a primary taking its life's epoch and the leader key;
//! - [`sync`]: the primary recording whether its twin is in sync;
//! - [`take_over`]: a twin watching for the leader's lease to end;
//! - [`memory`]: what the box remembers of etcd, to tell when it forgot;
//! - [`peer`]: the other box's history, asked for when etcd forgot.
//!
//! Owns the etcd connection. May not touch: the log, the epochs file (its
//! callers record what the arbiter gave), or the sessions.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use etcd_client::{
    Client, Compare as EtcdCompare, CompareOp, ConnectOptions, GetOptions, PutOptions,
    Txn as EtcdTxn, TxnOp,
};

use crate::repl::arbiter::{Compare, Keys, LeaderRecord, Txn, View};

pub mod gate;
pub mod life;
pub mod memory;
pub mod peer;
pub mod sync;
pub mod take_over;

pub use gate::{LeaseGate, LeaseShown};

/// The longest any one call to etcd may take: past it the call failed.
/// A lease's renewal is bounded tighter, by what is left of the lease.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(2);

/// Calls failed in a row after which the connection is made anew.
pub const RECONNECT_AFTER: u32 = 2;

/// How a box reaches the arbiter.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ArbiterOptions {
    /// etcd's client URLs.
    pub endpoints: Vec<String>,
    /// The pair's name (`/twinlog/<cluster>/`).
    pub cluster: String,
    /// The lease's time to live.
    pub ttl: Duration,
    /// Where this box serves clients as the primary (HOST:PORT).
    pub advertise: String,
}

/// What went wrong with the arbiter.
#[derive(Debug, thiserror::Error)]
pub enum ArbiterError {
    #[error("etcd ({endpoints}): {source}")]
    Etcd {
        endpoints: String,
        source: etcd_client::Error,
    },
    #[error("etcd ({endpoints}) did not answer within {ms} ms")]
    Timeout { endpoints: String, ms: u128 },
    #[error("the arbiter's key {key} holds what this build cannot read: {why}")]
    Garbled { key: String, why: String },
    #[error(transparent)]
    Cluster(#[from] crate::repl::arbiter::BadClusterName),
}

/// One etcd connection and the pair's keys. Clones share the connection,
/// and a connection that failed [`RECONNECT_AFTER`] calls in a row is made
/// anew for all of them: one that may be wedged (an HTTP/2 stream cut
/// mid-frame by a partition) is not relied on again.
#[derive(Clone)]
pub struct Arbiter {
    conn: Arc<Conn>,
    keys: Keys,
    options: ArbiterOptions,
}

struct Conn {
    client: Mutex<Client>,
    failed_in_a_row: AtomicU32,
}

impl std::fmt::Debug for Arbiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Arbiter")
            .field("endpoints", &self.options.endpoints)
            .field("cluster", &self.options.cluster)
            .finish()
    }
}

impl Arbiter {
    /// A connection to etcd. It is made lazily: an etcd that is down is
    /// found by the first call, which fails by name, not here.
    pub async fn connect(options: ArbiterOptions) -> Result<Arbiter, ArbiterError> {
        let keys = Keys::of(&options.cluster)?;
        let client = new_client(&options).await?;
        Ok(Arbiter {
            conn: Arc::new(Conn {
                client: Mutex::new(client),
                failed_in_a_row: AtomicU32::new(0),
            }),
            keys,
            options,
        })
    }

    fn client(&self) -> Client {
        self.conn
            .client
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// A call's outcome, counted: after [`RECONNECT_AFTER`] failures in a
    /// row the connection is made anew (kept as it is if that fails too).
    async fn counted<T>(&self, r: Result<T, ArbiterError>) -> Result<T, ArbiterError> {
        match &r {
            Err(ArbiterError::Etcd { .. } | ArbiterError::Timeout { .. }) => {
                let n = self.conn.failed_in_a_row.fetch_add(1, Ordering::SeqCst) + 1;
                if n % RECONNECT_AFTER == 0 {
                    match new_client(&self.options).await {
                        Ok(c) => {
                            *self.conn.client.lock().unwrap_or_else(|e| e.into_inner()) = c;
                        }
                        Err(e) => {
                            tracing::debug!(error = %e, "reconnecting to etcd failed: the old connection is kept")
                        }
                    }
                }
            }
            _ => self.conn.failed_in_a_row.store(0, Ordering::SeqCst),
        }
        r
    }

    pub fn keys(&self) -> &Keys {
        &self.keys
    }

    pub fn options(&self) -> &ArbiterOptions {
        &self.options
    }

    fn endpoints(&self) -> String {
        self.options.endpoints.join(",")
    }

    /// The pair's keys, read in one revision.
    pub async fn view(&self) -> Result<View, ArbiterError> {
        let mut c = self.client();
        let got = within(
            &self.endpoints(),
            CALL_TIMEOUT,
            c.get(
                self.keys.prefix.as_bytes(),
                Some(GetOptions::new().with_prefix()),
            ),
        )
        .await;
        let resp = self.counted(got).await?;
        let mut view = View {
            revision: resp.header().map_or(0, |h| h.revision()),
            ..View::default()
        };
        for kv in resp.kvs() {
            let key = String::from_utf8_lossy(kv.key()).into_owned();
            view.read(&self.keys, &key, kv.value(), kv.mod_revision(), kv.lease())
                .map_err(|why| ArbiterError::Garbled { key, why })?;
        }
        Ok(view)
    }

    /// Run `txn`, its leased writes under `lease`. Answers the revision
    /// its writes were made at, or `None` when a comparison failed and
    /// nothing was written.
    pub async fn run(&self, txn: &Txn, lease: i64) -> Result<Option<i64>, ArbiterError> {
        let when: Vec<EtcdCompare> = txn
            .when
            .iter()
            .map(|c| match c {
                Compare::Absent(key) => {
                    EtcdCompare::create_revision(key.as_bytes(), CompareOp::Equal, 0)
                }
                Compare::Unchanged(key, rev) => {
                    EtcdCompare::mod_revision(key.as_bytes(), CompareOp::Equal, *rev)
                }
            })
            .collect();
        let then: Vec<TxnOp> = txn
            .then
            .iter()
            .map(|p| {
                let opts = p.leased.then(|| PutOptions::new().with_lease(lease));
                TxnOp::put(p.key.as_bytes(), p.value.clone(), opts)
            })
            .collect();
        let mut c = self.client();
        let ran = within(
            &self.endpoints(),
            CALL_TIMEOUT,
            c.txn(EtcdTxn::new().when(when).and_then(then)),
        )
        .await;
        let resp = self.counted(ran).await?;
        Ok(resp
            .succeeded()
            .then(|| resp.header().map_or(0, |h| h.revision())))
    }

    /// A new lease of the configured time to live: its id and what etcd
    /// granted.
    pub async fn grant(&self) -> Result<(i64, Duration), ArbiterError> {
        let ttl = self.options.ttl.as_secs().max(1) as i64;
        let mut c = self.client();
        let granted = within(&self.endpoints(), CALL_TIMEOUT, c.lease_grant(ttl, None)).await;
        let resp = self.counted(granted).await?;
        Ok((resp.id(), Duration::from_secs(resp.ttl().max(0) as u64)))
    }

    /// End `lease` at once: the keys under it are deleted.
    pub async fn revoke(&self, lease: i64) -> Result<(), ArbiterError> {
        let mut c = self.client();
        let revoked = match within(&self.endpoints(), CALL_TIMEOUT, c.lease_revoke(lease)).await {
            Ok(_) => Ok(()),
            // Already gone is what was asked for.
            Err(ArbiterError::Etcd { source, .. })
                if source.to_string().contains("requested lease not found") =>
            {
                Ok(())
            }
            Err(e) => Err(e),
        };
        self.counted(revoked).await
    }

    /// One renewal of `lease`, waiting at most `limit`: what etcd granted
    /// from when it handled it (zero: the lease is gone). etcd renews a
    /// lease to the time to live it was granted with, which is at least
    /// the one asked for (it raises, never lowers).
    pub async fn keep_alive(&self, lease: i64, limit: Duration) -> Result<Duration, ArbiterError> {
        let mut c = self.client();
        // Opening the keep-alive stream sends one renewal and waits for
        // its answer, which is refused when the lease is gone.
        let renewed = match within(&self.endpoints(), limit, c.lease_keep_alive(lease)).await {
            Ok(_) => Ok(self.options.ttl),
            Err(ArbiterError::Etcd {
                source: etcd_client::Error::LeaseKeepAliveError(why),
                ..
            }) if why.contains("lease not found") => Ok(Duration::ZERO),
            Err(e) => Err(e),
        };
        self.counted(renewed).await
    }
}

/// A lazily made connection to `options`' etcd.
async fn new_client(options: &ArbiterOptions) -> Result<Client, ArbiterError> {
    let connect = ConnectOptions::new()
        .with_connect_timeout(CALL_TIMEOUT)
        .with_timeout(CALL_TIMEOUT)
        .with_keep_alive(Duration::from_secs(1), CALL_TIMEOUT);
    within(
        &options.endpoints.join(","),
        CALL_TIMEOUT,
        Client::connect(&options.endpoints, Some(connect)),
    )
    .await
}

/// `call`, failed by name when etcd errs or does not answer in `limit`.
async fn within<T>(
    endpoints: &str,
    limit: Duration,
    call: impl std::future::Future<Output = Result<T, etcd_client::Error>>,
) -> Result<T, ArbiterError> {
    match tokio::time::timeout(limit, call).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(source)) => Err(ArbiterError::Etcd {
            endpoints: endpoints.to_owned(),
            source,
        }),
        Err(_) => Err(ArbiterError::Timeout {
            endpoints: endpoints.to_owned(),
            ms: limit.as_millis(),
        }),
    }
}

/// This box's record as the leader it would be.
pub fn me(fingerprint: &str, options: &ArbiterOptions) -> LeaderRecord {
    LeaderRecord {
        epoch: 0,
        fingerprint: fingerprint.to_owned(),
        addr: options.advertise.clone(),
    }
}

/// Why the arbiter's leader could not be dialled.
#[derive(Debug, thiserror::Error)]
pub enum FollowError {
    #[error(transparent)]
    Arbiter(#[from] ArbiterError),
    #[error("the arbiter names no primary now (a failover may be under way)")]
    NoLeader,
    #[error("the arbiter's leader record does not parse: {0}")]
    BadRecord(String),
    #[error(transparent)]
    Client(#[from] crate::node::ClientError),
}

impl Arbiter {
    /// The primary the arbiter names now: its epoch, fingerprint and
    /// address, parsed.
    pub async fn leader(
        &self,
    ) -> Result<(u64, crate::net::Fingerprint, std::net::SocketAddr), FollowError> {
        let view = self.view().await?;
        let l = view.leader.ok_or(FollowError::NoLeader)?.value;
        let fp = l
            .fingerprint
            .parse()
            .map_err(|_| FollowError::BadRecord(format!("fingerprint {:?}", l.fingerprint)))?;
        let addr = tokio::net::lookup_host(&l.addr)
            .await
            .ok()
            .and_then(|mut a| a.next())
            .ok_or_else(|| FollowError::BadRecord(format!("address {:?}", l.addr)))?;
        Ok((l.epoch, fp, addr))
    }

    /// A client of the primary the arbiter names now.
    pub async fn dial_leader(
        &self,
        identity: &crate::net::Identity,
        opts: crate::node::ClientOptions,
    ) -> Result<(u64, crate::node::Client), FollowError> {
        let (epoch, fp, addr) = self.leader().await?;
        let c = crate::node::Client::connect_with(identity, fp, addr, opts).await?;
        Ok((epoch, c))
    }
}

/// A client finds the primary where the arbiter's leader key names it.
impl crate::node::client::Locate for Arbiter {
    fn locate(&self) -> crate::node::client::follow::Located<'_> {
        Box::pin(async move {
            let (epoch, fingerprint, addr) = self
                .leader()
                .await
                .map_err(|e| crate::node::ClientError::Locate(format!("etcd: {e}")))?;
            Ok(crate::node::client::PrimaryAt {
                epoch,
                addr,
                fingerprint,
            })
        })
    }
}
