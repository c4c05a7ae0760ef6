//! Appenders that follow the primary across failovers, and what they had
//! acknowledged.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use twinlog::net::{Fingerprint, Identity};
use twinlog::node::api::ApiError;
use twinlog::node::{Client, ClientError, Durability};

use drills::daemons::{self, Seen};

use crate::{small_blob, small_len, APP_KIND};

/// A frame a writer had acknowledged.
#[derive(Clone, Debug)]
pub struct Ack {
    pub seq: u64,
    pub tag: String,
    pub n: u64,
    pub got: Durability,
    pub at: Instant,
}

impl Ack {
    pub fn meta(&self) -> Vec<u8> {
        format!("{} {}", self.tag, self.n).into_bytes()
    }

    pub fn blob(&self) -> Vec<u8> {
        small_blob(self.n, small_len(self.n))
    }

    pub fn is(&self, f: &Seen) -> bool {
        f.kind == APP_KIND && f.meta == self.meta() && f.blob.as_deref() == Some(&self.blob()[..])
    }
}

/// Appenders that follow the primary: a `Fenced` answer naming a new one
/// sends them there.
pub struct Writers {
    pub acked: Arc<Mutex<Vec<Ack>>>,
    pub stop: Arc<AtomicBool>,
    pub redirects: Arc<AtomicU64>,
    pub longest_us: Arc<AtomicU64>,
    pub fenced: Arc<AtomicU64>,
    pub tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Writers {
    pub fn start(
        admin: &Arc<Identity>,
        fp: Fingerprint,
        addr: SocketAddr,
        tag: &str,
        wants: &[Durability],
        pace: Duration,
    ) -> Writers {
        let mut w = Writers {
            acked: Arc::default(),
            stop: Arc::default(),
            redirects: Arc::default(),
            longest_us: Arc::default(),
            fenced: Arc::default(),
            tasks: Vec::new(),
        };
        for (i, &want) in wants.iter().enumerate() {
            let admin = admin.clone();
            let (acked, stop) = (w.acked.clone(), w.stop.clone());
            let (redirects, longest, fenced) =
                (w.redirects.clone(), w.longest_us.clone(), w.fenced.clone());
            let tag = format!("{tag}-w{i}");
            w.tasks.push(tokio::spawn(async move {
                let (mut fp, mut addr) = (fp, addr);
                let mut client: Option<Client> = None;
                let mut n = 0u64;
                let mut since = Instant::now();
                while !stop.load(Ordering::SeqCst) {
                    if client.is_none() {
                        // A port nobody listens on yet holds a QUIC
                        // handshake until its first retransmission, ~1 s:
                        // dial again sooner.
                        match tokio::time::timeout(
                            Duration::from_millis(200),
                            Client::connect(&admin, fp, addr),
                        )
                        .await
                        {
                            Ok(Ok(c)) => client = Some(c),
                            _ => tokio::time::sleep(Duration::from_millis(20)).await,
                        }
                        continue;
                    }
                    let Some(c) = client.as_ref() else { continue };
                    n += 1;
                    let meta = format!("{tag} {n}").into_bytes();
                    let blob = small_blob(n, small_len(n));
                    let answer = tokio::time::timeout(
                        Duration::from_secs(3),
                        c.append(APP_KIND, &meta, &blob, want),
                    )
                    .await;
                    match answer {
                        Ok(Ok((seq, got))) => {
                            let at = Instant::now();
                            acked.lock().unwrap_or_else(|e| e.into_inner()).push(Ack {
                                seq,
                                tag: tag.clone(),
                                n,
                                got,
                                at,
                            });
                            longest.fetch_max(since.elapsed().as_micros() as u64, Ordering::SeqCst);
                            since = at;
                        }
                        Ok(Err(ClientError::Api(ApiError::Fenced { primary, .. }))) => {
                            fenced.fetch_add(1, Ordering::SeqCst);
                            client = None;
                            let to = primary.and_then(|np| {
                                Some((np.fingerprint.parse().ok()?, np.addr.parse().ok()?))
                            });
                            match to {
                                Some((f, a)) => {
                                    (fp, addr) = (f, a);
                                    redirects.fetch_add(1, Ordering::SeqCst);
                                }
                                None => tokio::time::sleep(Duration::from_millis(50)).await,
                            }
                        }
                        // A primary gone mid-append, or one refusing: dial
                        // again.
                        _ => {
                            client = None;
                            tokio::time::sleep(Duration::from_millis(20)).await;
                        }
                    }
                    if !pace.is_zero() {
                        tokio::time::sleep(pace).await;
                    }
                }
            }));
        }
        w
    }

    pub fn acked(&self) -> Vec<Ack> {
        self.acked.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    pub fn count(&self, want: Durability) -> usize {
        self.acked
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter(|a| a.got == want)
            .count()
    }

    /// Wait for `more` acknowledgements as `want`; false after `limit`.
    pub async fn more(&self, more: usize, want: Durability, limit: Duration) -> bool {
        let at = self.count(want) + more;
        daemons::wait_for(limit, Duration::from_millis(5), || {
            (self.count(want) >= at).then_some(())
        })
        .await
        .is_some()
    }

    /// Stop at once: an append in flight was not acknowledged.
    pub fn abort(self) -> Vec<Ack> {
        for t in &self.tasks {
            t.abort();
        }
        self.acked()
    }

    /// Stop once the appends in flight are answered, so that the primary
    /// takes no more frames afterwards.
    pub async fn halt(mut self) -> (Vec<Ack>, u64, Duration) {
        self.stop.store(true, Ordering::SeqCst);
        for t in std::mem::take(&mut self.tasks) {
            let abort = t.abort_handle();
            if tokio::time::timeout(Duration::from_secs(10), t)
                .await
                .is_err()
            {
                abort.abort();
            }
        }
        let acked = self.acked();
        (
            acked,
            self.redirects.load(Ordering::SeqCst),
            Duration::from_micros(self.longest_us.load(Ordering::SeqCst)),
        )
    }
}

/// The longest a writer went without an acknowledgement across a
/// switchover: the gaps between one writer's consecutive acknowledgements
/// that end inside a switchover's window (from the command to both roles
/// served and 20 more `twin` acknowledgements).
pub fn pause(acked: &[Ack], windows: &[(Instant, Instant)]) -> Duration {
    let mut by_writer: BTreeMap<&str, Vec<Instant>> = BTreeMap::new();
    for a in acked {
        by_writer.entry(a.tag.as_str()).or_default().push(a.at);
    }
    let mut longest = Duration::ZERO;
    for ats in by_writer.values_mut() {
        ats.sort();
        for pair in ats.windows(2) {
            if windows
                .iter()
                .any(|(t0, t1)| pair[1] >= *t0 && pair[1] <= *t1)
            {
                longest = longest.max(pair[1] - pair[0]);
            }
        }
    }
    longest
}
