//! The other box's history, when the arbiter forgot: heard from it (its
//! hello as a twin, or its own question) or asked of it over the pinned
//! link (`AskEpochs`, answered `Epochs`). Either box may dial the other;
//! a word is believed only fresh, since the other box may change role.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;

use crate::net::{self, Fingerprint, Identity, NetError, Pins, Role};
use crate::repl::amnesia::PeerWord;
use crate::repl::{PrimaryMsg, TwinMsg};

/// How long a word the other box sent (its hello, its question) is taken
/// as its word now: a twin dials again within its backoff's cap (5 s).
pub const FRESH: Duration = Duration::from_secs(6);

/// How long one question may take.
pub const ASK_DEADLINE: Duration = Duration::from_secs(2);

/// The other box's last word, as heard: shared by whoever hears it (the
/// endpoint) and whoever decides on it (the life or the take-over).
#[derive(Clone, Debug, Default)]
pub struct Heard(Arc<Mutex<Option<(PeerWord, tokio::time::Instant)>>>);

impl Heard {
    pub fn set(&self, word: PeerWord) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) =
            Some((word, crate::node::clock::instant()));
    }

    /// The word heard within [`FRESH`].
    pub fn fresh(&self) -> Option<PeerWord> {
        let g = self.0.lock().unwrap_or_else(|e| e.into_inner());
        g.as_ref()
            .filter(|(_, at)| crate::node::clock::instant().saturating_duration_since(*at) < FRESH)
            .map(|(w, _)| w.clone())
    }
}

/// Why the other box's word could not be had.
#[derive(Debug, thiserror::Error)]
pub enum AskError {
    #[error("the other box said nothing within {ms} ms")]
    Silent { ms: u64 },
    #[error("the other box has not been heard from, and its address is not known here (set `peer` in [failover])")]
    Unknown,
    #[error("{addr}: {why}")]
    Unreached { addr: String, why: String },
    #[error("{addr} answered {answer}, not its epochs")]
    Answer { addr: String, answer: String },
}

/// Asks the other box, pinned by its fingerprint, for its word.
#[derive(Debug)]
pub struct Asker {
    endpoint: quinn::Endpoint,
    fingerprint: Fingerprint,
}

impl Asker {
    /// Dialling as `identity`, the other box pinned as `fingerprint`.
    pub fn new(identity: &Identity, fingerprint: Fingerprint) -> Result<Asker, NetError> {
        let pins = Arc::new(Pins::new().pin(fingerprint, Role::Primary));
        let endpoint = net::client_with(identity, pins, net::Liveness::client(ASK_DEADLINE))?;
        Ok(Asker {
            endpoint,
            fingerprint,
        })
    }

    pub fn fingerprint(&self) -> Fingerprint {
        self.fingerprint
    }

    /// Ask the box at `addr` for its word, telling it `mine`.
    pub async fn ask(&self, addr: &str, mine: PeerWord) -> Result<PeerWord, AskError> {
        let unreached = |why: String| AskError::Unreached {
            addr: addr.to_owned(),
            why,
        };
        let at: SocketAddr = tokio::net::lookup_host(addr)
            .await
            .map_err(|e| unreached(e.to_string()))?
            .next()
            .ok_or_else(|| unreached("the name has no address".into()))?;
        let answer = crate::node::failover::rejoin::ask(
            &self.endpoint,
            at,
            TwinMsg::AskEpochs(mine),
            ASK_DEADLINE,
        )
        .await
        .map_err(|e| unreached(e.to_string()))?;
        match answer {
            Some(PrimaryMsg::Epochs(word)) => Ok(word),
            other => Err(AskError::Answer {
                addr: addr.to_owned(),
                answer: match other {
                    Some(m) => format!("{m:?}"),
                    None => "nothing".into(),
                },
            }),
        }
    }
}

/// The other box's word: as it sent it within [`FRESH`] (its hello, its
/// question), else asked of it at `addr` when that is known. An answer
/// to this box's own question is never kept: a later decision asks
/// again, since the other box's history may have moved on since.
pub async fn word_of(
    heard: &Heard,
    asker: Option<&Asker>,
    addr: Option<&str>,
    mine: PeerWord,
) -> Result<PeerWord, AskError> {
    if let Some(w) = heard.fresh() {
        return Ok(w);
    }
    match (asker, addr) {
        (Some(asker), Some(addr)) => asker.ask(addr, mine).await,
        _ => Err(AskError::Unknown),
    }
}

/// The other box's word before a life on etcd's word: heard (its twin's
/// hello reaches this waiting primary) or asked, whichever comes first
/// within `limit`. A box that is down, or a twin that does not dial back
/// in time, leaves nothing; the caller goes on without it.
pub async fn word_within(
    heard: &Heard,
    asker: Option<&Asker>,
    addr: Option<&str>,
    mine: PeerWord,
    limit: Duration,
) -> Result<PeerWord, AskError> {
    if let Some(w) = heard.fresh() {
        return Ok(w);
    }
    let asked = async {
        if let (Some(asker), Some(addr)) = (asker, addr) {
            if let Ok(w) = asker.ask(addr, mine).await {
                return w;
            }
        }
        std::future::pending().await
    };
    let hello = async {
        loop {
            tokio::time::sleep(Duration::from_millis(10)).await;
            if let Some(w) = heard.fresh() {
                return w;
            }
        }
    };
    tokio::select! {
        w = asked => Ok(w),
        w = hello => Ok(w),
        _ = tokio::time::sleep(limit) => Err(AskError::Silent { ms: limit.as_millis() as u64 }),
    }
}

/// The most client connections held while a primary waits: past it, a
/// client is closed and dials again.
pub const MAX_HELD_CLIENTS: usize = 256;

/// Client connections that arrived while the primary waited, handed to
/// the node once it serves.
pub type HeldClients = Arc<Mutex<Vec<quinn::Connection>>>;

/// Answer on `endpoint` while this primary waits for its life: a twin's
/// hello is heard (its epochs and head) and the connection closed, to be
/// dialled again once this box serves; `AskEpochs` is heard and answered
/// with `mine()`; a client's connection is held for the node (its
/// requests wait). Ends at `stop`, leaving the endpoint to the serve.
pub async fn answer_while_waiting(
    endpoint: quinn::Endpoint,
    pins: Arc<Pins>,
    mine: Arc<dyn Fn() -> PeerWord + Send + Sync>,
    heard: Heard,
    clients: HeldClients,
    mut stop: watch::Receiver<bool>,
) {
    loop {
        let incoming = tokio::select! {
            i = endpoint.accept() => i,
            _ = stop.wait_for(|&s| s) => return,
        };
        let Some(incoming) = incoming else { return };
        let (pins, mine, heard, clients) =
            (pins.clone(), mine.clone(), heard.clone(), clients.clone());
        tokio::spawn(async move {
            if let Err(e) = answer_one(incoming, &pins, &*mine, &heard, &clients).await {
                tracing::debug!(error = %e, "a connection while waiting for the life ended");
            }
        });
    }
}

async fn answer_one(
    incoming: quinn::Incoming,
    pins: &Pins,
    mine: &(dyn Fn() -> PeerWord + Send + Sync),
    heard: &Heard,
    clients: &HeldClients,
) -> Result<(), NetError> {
    let conn = incoming.await?;
    let (_, role) = net::peer(&conn, pins)?;
    if role != Role::Twin {
        let mut held = clients.lock().unwrap_or_else(|e| e.into_inner());
        if held.len() < MAX_HELD_CLIENTS {
            held.push(conn);
        } else {
            conn.close(2u32.into(), b"this primary is waiting for its life");
        }
        return Ok(());
    }
    let talk = async {
        let (mut send, mut recv) = conn.accept_bi().await?;
        match net::read_msg::<TwinMsg>(&mut recv).await? {
            Some(TwinMsg::Hello { epochs, head, .. }) => {
                heard.set(PeerWord {
                    newest: epochs.current(),
                    epochs,
                    head: head.seq,
                    primary: false,
                });
            }
            Some(TwinMsg::AskEpochs(word)) => {
                heard.set(word);
                net::write_msg(&mut send, &PrimaryMsg::Epochs(mine())).await?;
                let _ = send.finish();
                let _ = send.stopped().await;
            }
            _ => {}
        }
        Ok::<_, NetError>(())
    };
    let r = tokio::time::timeout(ASK_DEADLINE, talk).await;
    conn.close(2u32.into(), b"this primary is waiting for its life");
    match r {
        Ok(r) => r,
        Err(_) => Ok(()),
    }
}
