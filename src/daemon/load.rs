//! `primary load`: a mixed workload through a running primary (small frames
//! from several clients, then one large blob), all with `twin` durability,
//! with live progress; then every acknowledged frame is checked on the
//! twin's log.

use std::collections::BTreeMap;
use std::io::{IsTerminal, Write};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::Poll;
use std::time::{Duration, Instant};

use super::{DaemonError, PrimaryConfig};
use crate::log::Tail;
use crate::node::{Client, ClientOptions, Durability};

/// What a load run did.
#[derive(Debug, Default)]
pub struct LoadReport {
    pub frames: u64,
    pub bytes: u64,
    pub secs: f64,
    pub primary_head: u64,
    pub twin_acked: u64,
    /// Acknowledged frames found whole on the twin, when it was checked.
    pub verified_on_twin: Option<u64>,
}

/// Blob bytes of frame `n`: a pattern a reader can check without a copy.
fn pattern_byte(n: u64, i: u64) -> u8 {
    (n.wrapping_mul(131).wrapping_add(i.wrapping_mul(7))) as u8
}

fn small_blob(n: u64) -> Vec<u8> {
    let len = 64 + (n * 37) % 4000;
    (0..len).map(|i| pattern_byte(n, i)).collect()
}

/// An `AsyncRead` of `len` pattern bytes, counting what it hands out.
struct PatternReader {
    n: u64,
    at: u64,
    len: u64,
    crc: crc32fast::Hasher,
    progress: Arc<AtomicU64>,
}

impl tokio::io::AsyncRead for PatternReader {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let n = (buf.remaining() as u64).min(self.len - self.at) as usize;
        let start = self.at;
        let chunk: Vec<u8> = (0..n as u64)
            .map(|i| pattern_byte(self.n, start + i))
            .collect();
        self.crc.update(&chunk);
        buf.put_slice(&chunk);
        self.at += n as u64;
        self.progress.fetch_add(n as u64, Ordering::Relaxed);
        Poll::Ready(Ok(()))
    }
}

fn local(addr: std::net::SocketAddr) -> std::net::SocketAddr {
    if addr.ip().is_unspecified() {
        std::net::SocketAddr::from(([127, 0, 0, 1], addr.port()))
    } else {
        addr
    }
}

/// Connect as the admin client `init` made, with the default options.
pub async fn admin_client(cfg: &PrimaryConfig) -> Result<Client, DaemonError> {
    admin_client_with(cfg, ClientOptions::default()).await
}

/// Connect as the admin client `init` made.
pub async fn admin_client_with(
    cfg: &PrimaryConfig,
    opts: ClientOptions,
) -> Result<Client, DaemonError> {
    let admin = super::load_identity(&cfg.data_dir.join(super::ADMIN_DIR))?;
    let me = super::load_identity(&cfg.data_dir)?;
    let addr = local(super::resolve("listen", &cfg.listen)?);
    Client::connect_with(&admin, me.fingerprint(), addr, opts)
        .await
        .map_err(|e| DaemonError::PrimaryUnreachable {
            addr,
            listen: cfg.listen.clone(),
            error: Box::new(e),
        })
}

/// The admin client of whichever box is the primary under `cfg`'s
/// `[failover]`: found in etcd and followed across failovers, each append
/// sent once. Waits as `opts` say for each answer, and goes on finding a
/// primary for at least 30 s.
pub async fn following_admin(
    cfg: &PrimaryConfig,
    opts: ClientOptions,
) -> Result<crate::node::Following, DaemonError> {
    use crate::node::{FollowOptions, Following, Locate};
    let Some(failover) = &cfg.failover else {
        return Err(DaemonError::NoFailoverSection);
    };
    let admin = super::load_identity(&cfg.data_dir.join(super::ADMIN_DIR))?;
    let follow = FollowOptions {
        client: opts,
        give_up_after: opts.deadline.max(std::time::Duration::from_secs(30)),
        ..FollowOptions::default()
    };
    let arbiter = crate::node::arbiter::Arbiter::connect(failover.options(&cfg.listen)).await?;
    let locate: std::sync::Arc<dyn Locate> = std::sync::Arc::new(arbiter);
    Following::new(std::sync::Arc::new(admin), None, Some(locate), follow)
        .map_err(DaemonError::request("follow the primary"))
}

fn progress_line(
    done_frames: u64,
    total_frames: u64,
    bytes: u64,
    started: Instant,
    terminal: bool,
) {
    let secs = crate::clock::monotonic()
        .saturating_duration_since(started)
        .as_secs_f64()
        .max(1e-3);
    let line = format!(
        "appended {done_frames}/{total_frames} frames, {:.1} MiB, {:.0} frames/s, {:.1} MiB/s",
        bytes as f64 / 1048576.0,
        done_frames as f64 / secs,
        bytes as f64 / 1048576.0 / secs
    );
    if terminal {
        eprint!("\r{line}   ");
        let _ = std::io::stderr().flush();
    } else {
        eprintln!("{line}");
    }
}

/// Run the workload: `frames` small frames from 8 concurrent clients, then
/// one blob of `blob_mib` MiB; check the twin's log at `twin_log` if given.
pub async fn run(
    cfg: &PrimaryConfig,
    frames: u64,
    blob_mib: u64,
    twin_log: Option<&Path>,
    opts: ClientOptions,
) -> Result<LoadReport, DaemonError> {
    let started = crate::clock::monotonic();
    let terminal = std::io::stderr().is_terminal();
    let acked: Arc<Mutex<BTreeMap<u64, (u32, u64)>>> = Arc::new(Mutex::new(BTreeMap::new()));
    let done = Arc::new(AtomicU64::new(0));
    let bytes = Arc::new(AtomicU64::new(0));
    let next = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let client = admin_client_with(cfg, opts).await?;
        let (acked, done, bytes, next) = (acked.clone(), done.clone(), bytes.clone(), next.clone());
        tasks.push(tokio::spawn(async move {
            loop {
                let n = next.fetch_add(1, Ordering::Relaxed);
                if n >= frames {
                    return Ok::<(), DaemonError>(());
                }
                let blob = small_blob(n);
                let a = client
                    .append_timed(
                        crate::log::APP_KIND_FIRST,
                        &n.to_le_bytes(),
                        &blob,
                        Durability::Twin,
                    )
                    .await
                    .map_err(DaemonError::request("append"))?;
                if a.durability != Durability::Twin {
                    return Err(DaemonError::AckedAs {
                        seq: a.seq,
                        durability: a.durability,
                    });
                }
                let crc = crate::log::format::payload_crc(&n.to_le_bytes(), &blob);
                acked
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(a.seq, (crc, blob.len() as u64));
                done.fetch_add(1, Ordering::Relaxed);
                bytes.fetch_add(blob.len() as u64, Ordering::Relaxed);
            }
        }));
    }
    let ticker = {
        let (done, bytes) = (done.clone(), bytes.clone());
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(if terminal { 200 } else { 2000 })).await;
                progress_line(
                    done.load(Ordering::Relaxed),
                    frames + 1,
                    bytes.load(Ordering::Relaxed),
                    started,
                    terminal,
                );
            }
        })
    };
    for t in tasks {
        t.await.map_err(|error| DaemonError::Task {
            what: "an appender",
            error,
        })??;
    }
    if blob_mib > 0 {
        let client = admin_client_with(cfg, opts).await?;
        let len = blob_mib << 20;
        let meta = u64::MAX.to_le_bytes();
        let mut reader = PatternReader {
            n: u64::MAX,
            at: 0,
            len,
            crc: crc32fast::Hasher::new(),
            progress: bytes.clone(),
        };
        reader.crc.update(&meta);
        let a = client
            .append_reader(
                crate::log::APP_KIND_FIRST,
                &meta,
                len,
                &mut reader,
                Durability::Twin,
            )
            .await
            .map_err(DaemonError::request("blob append"))?;
        acked
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(a.seq, (reader.crc.clone().finalize(), len));
        done.fetch_add(1, Ordering::Relaxed);
    }
    ticker.abort();
    progress_line(
        done.load(Ordering::Relaxed),
        frames + u64::from(blob_mib > 0),
        bytes.load(Ordering::Relaxed),
        started,
        terminal,
    );
    if terminal {
        eprintln!();
    }
    let status = admin_client_with(cfg, opts)
        .await?
        .status()
        .await
        .map_err(DaemonError::request("status"))?;
    let acked = acked.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let verified_on_twin = match twin_log {
        Some(dir) => Some(verify_on_twin(dir, &acked)?),
        None => None,
    };
    Ok(LoadReport {
        frames: acked.len() as u64,
        bytes: bytes.load(Ordering::Relaxed),
        secs: crate::clock::monotonic()
            .saturating_duration_since(started)
            .as_secs_f64(),
        primary_head: status.head,
        twin_acked: status.twin_acked,
        verified_on_twin,
    })
}

/// Every acknowledged frame, read back from the twin's log directory (no
/// lock taken: the twin keeps running): same crc, same length.
fn verify_on_twin(dir: &Path, acked: &BTreeMap<u64, (u32, u64)>) -> Result<u64, DaemonError> {
    let mut tail = Tail::open(dir, 0).map_err(|error| DaemonError::TwinLogUnread {
        dir: dir.to_owned(),
        error,
    })?;
    let mut verified = 0;
    // Every frame's crc is checked on the way, a piece at a time: the
    // header's crc being the acknowledged one is then the frame's.
    while let Some(h) = tail.next_checked()? {
        if let Some(&(crc, len)) = acked.get(&h.seq) {
            if h.payload_crc != crc || h.blob_len != len {
                return Err(DaemonError::DiffersOnTwin { seq: h.seq });
            }
            verified += 1;
        }
    }
    if verified != acked.len() as u64 {
        return Err(DaemonError::MissingOnTwin {
            verified,
            acked: acked.len(),
        });
    }
    Ok(verified)
}
