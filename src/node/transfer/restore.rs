//! Restore a fresh box from a twin: the log reset (a box with history is
//! refused), a snapshot when the twin's log does not reach back far enough,
//! then every frame at the twin's numbers; the store applied at the end.
//!
//! Interrupted at any moment and run again, it resumes where it stopped:
//! frames held stay, and inside a large entry the bytes already written
//! are salvaged from the log's segment before the log opens (which would
//! cut the unfinished frame), written again locally, and only the rest is
//! fetched (`read_pieces_from` on the twin). The crc over the whole entry
//! is checked when it commits.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tokio::time::Instant;

use quinn::Connection;
use serde::{Deserialize, Serialize};

use super::restore_serve::{RestoreFrame, RestoreReq, RestoreResp, RESTORE_PIECE};
use super::snapshot_transfer::{self as snapshot, Fetched, SnapshotError};
use crate::log::{self, HistoryId, Log, OpenOptions as LogOptions};
use crate::net::pumped::PumpedStream;
use crate::net::{self, Fingerprint, Identity, NetError, Pins, Role};
use crate::node::epoch::Epochs;
use crate::publish::{publish_hint_with, publish_with, sync_parent_with};
use crate::storage::{remove_if_exists, write_file, OpenMode, StdStorage, Storage};
use crate::store::install::{self, InstallPaths};
use crate::store::{Store, StoreError, StoreOptions};

pub use crate::layout::{PARTIAL_FILE, RESTORING_FILE, SALVAGE_FILE, SALVAGE_META};
/// Entries from this size on are tracked for salvage.
pub const TRACKED_ENTRY: u64 = 4 << 20;
/// Bytes between two syncs of the restored log.
const SYNC_EVERY: u64 = 64 << 20;

/// What a restore fails at, by name.
#[derive(Debug, thiserror::Error)]
pub enum RestoreError {
    #[error("the box holds a log already ({0}); a restore fills a fresh box only")]
    NotFresh(String),
    #[error("the box and the twin disagree: {0}")]
    Diverged(String),
    #[error(transparent)]
    Net(#[from] NetError),
    #[error("log: {0}")]
    Log(#[from] log::Error),
    #[error("store: {0}")]
    Store(#[from] StoreError),
    #[error("snapshot: {0}")]
    Snapshot(#[from] SnapshotError),
    #[error("I/O: {0}")]
    Io(#[from] std::io::Error),
    #[error("the twin refused: {0}")]
    Refused(String),
    #[error("restore protocol: {0}")]
    Protocol(String),
    /// A frame whose announced lengths cannot be: refused before any of
    /// it is written.
    #[error("the twin announced frame {seq} with {what}")]
    BadLength { seq: u64, what: String },
}

/// Where to restore from and into.
pub struct RestoreOptions {
    pub data_dir: PathBuf,
    pub segment_bytes: u64,
    pub source: SocketAddr,
    pub source_fingerprint: Fingerprint,
    pub identity: Arc<Identity>,
}

/// How far a restore is.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Progress {
    pub snapshot_held: u64,
    pub snapshot_total: u64,
    /// Frames and blob bytes written by this run.
    pub frames: u64,
    pub bytes: u64,
    pub head: u64,
    pub target: u64,
}

/// What a restore did.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct RestoreReport {
    /// The run found an earlier one's work.
    pub resumed: bool,
    /// The frame the run started at, and the byte inside it.
    pub started_at_seq: u64,
    pub started_at_byte: u64,
    /// Bytes of an unfinished entry taken back from the log's segment.
    pub salvaged_bytes: u64,
    pub snapshot_at: Option<u64>,
    pub snapshot_received: u64,
    pub snapshot_reused: u64,
    pub frames: u64,
    /// Blob bytes received and written by this run.
    pub received_bytes: u64,
    pub head: u64,
    pub first: u64,
    pub epoch: u64,
    /// From the start of the run to its first new byte written.
    pub first_new_byte_ms: Option<f64>,
    pub secs: f64,
    /// An earlier run's frames past this sequence were cut: the twin had
    /// since cut them too (frames its primary lost) and holds others
    /// there, written in another epoch.
    pub cut_after: Option<u64>,
    /// Frames an earlier run kept, checked against the twin's by digest
    /// before this run went on.
    pub verified: u64,
    /// A kept frame differed from the twin's: everything from it was cut
    /// and fetched again (this names the last frame kept).
    pub verify_cut_after: Option<u64>,
}

/// The entry being written, as the partial file says.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct PartialEntry {
    seq: u64,
    kind: u16,
    meta: Vec<u8>,
    blob_len: u64,
    payload_crc: u32,
    segment: PathBuf,
    blob_at: u64,
    written: u64,
    /// crc32 of the blob's first `written` bytes.
    crc_written: u32,
}

fn json(v: &impl Serialize) -> std::io::Result<Vec<u8>> {
    serde_json::to_vec(v).map_err(std::io::Error::other)
}

fn read_json<T: for<'de> Deserialize<'de>>(fs: &dyn Storage, path: &Path) -> Option<T> {
    let b = fs.read(path).ok()?;
    serde_json::from_slice(&b).ok()
}

/// Before the log opens: keep the bytes of an entry a killed run was
/// writing. Answers the salvaged entry (its bytes in `restore.partial`).
fn salvage(fs: &dyn Storage, data: &Path) -> std::io::Result<Option<PartialEntry>> {
    let side: Option<PartialEntry> = read_json(fs, &data.join(SALVAGE_META));
    let Some(p) = read_json::<PartialEntry>(fs, &data.join(PARTIAL_FILE)) else {
        return Ok(side);
    };
    if side
        .as_ref()
        .is_some_and(|s| s.seq == p.seq && s.written >= p.written)
    {
        fs.remove(&data.join(PARTIAL_FILE))?;
        return Ok(side);
    }
    let out_path = data.join(SALVAGE_FILE);
    let tmp = out_path.with_extension("tmp");
    let out = fs.open(&tmp, OpenMode::Create)?;
    out.set_len(0)?;
    let mut crc = crc32fast::Hasher::new();
    let mut buf = vec![0u8; RESTORE_PIECE];
    // The record is a hint (published without fsyncs): after a power cut
    // the segment it names may be gone or shorter, and its bytes may not
    // be the ones it counted. Any of those fetches the entry whole.
    let copied = (|| -> std::io::Result<()> {
        let seg = fs.open(&p.segment, OpenMode::Read)?;
        let mut pos = 0;
        while pos < p.written {
            let n = (buf.len() as u64).min(p.written - pos) as usize;
            seg.read_exact_at(&mut buf[..n], p.blob_at + pos)?;
            crc.update(&buf[..n]);
            out.write_all_at(&buf[..n], pos)?;
            pos += n as u64;
        }
        Ok(())
    })();
    let checks = match &copied {
        Ok(()) => crc.finalize() == p.crc_written,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => false,
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => false,
        Err(_) => {
            let _ = fs.remove(&tmp);
            return copied.map(|()| None);
        }
    };
    if !checks {
        tracing::warn!(
            seq = p.seq,
            written = p.written,
            "the unfinished entry's bytes are not all there or do not check: fetching it whole"
        );
        let _ = fs.remove(&tmp);
        fs.remove(&data.join(PARTIAL_FILE))?;
        return Ok(None);
    }
    fs.rename(&tmp, &out_path)?;
    publish_with(fs, &data.join(SALVAGE_META), &json(&p)?)?;
    fs.remove(&data.join(PARTIAL_FILE))?;
    tracing::info!(
        seq = p.seq,
        bytes = p.written,
        "salvaged the bytes of an unfinished entry"
    );
    Ok(Some(p))
}

fn drop_partial(fs: &dyn Storage, data: &Path) {
    for f in [PARTIAL_FILE, SALVAGE_FILE, SALVAGE_META] {
        let _ = remove_if_exists(fs, &data.join(f));
    }
}

async fn ask(
    conn: &Connection,
    req: &RestoreReq,
) -> Result<(RestoreResp, quinn::RecvStream), RestoreError> {
    let (mut send, mut recv) = conn.open_bi().await.map_err(NetError::from)?;
    net::write_msg(&mut send, req).await?;
    let _ = send.finish();
    match net::read_msg::<RestoreResp>(&mut recv).await? {
        None => Err(RestoreError::Protocol("no answer".into())),
        Some(RestoreResp::Refused(why)) => Err(RestoreError::Refused(why)),
        Some(r) => Ok((r, recv)),
    }
}

struct Welcome {
    history: [u8; 16],
    first: u64,
    head: u64,
    head_crc: u32,
    epoch: u64,
    epochs: crate::repl::EpochHistory,
}

/// The frames this box holds must be the twin's by the epochs that wrote
/// them, never by a crc: since an earlier run fetched them, the twin may
/// have cut frames its primary lost and taken others at those sequences.
/// The box keeps the twin's epoch history as it fetches (`EPOCHS`, on disk
/// before any frame fetched under it); frames past where that history and
/// the twin's now part are cut (this box never served them, so nothing
/// of them was acknowledged here). Answers where it cut.
fn reconcile(log: &Log, epochs: &Epochs, w: &Welcome) -> Result<Option<u64>, RestoreError> {
    let ours = epochs.history();
    let head = log.head_seq();
    let fork = crate::repl::fork_point(&w.epochs, u64::MAX, &ours, head);
    let cut = if fork < head {
        tracing::warn!(
            fork,
            head,
            "the twin holds other frames than this box's earlier run fetched past {fork}: they are cut and fetched again"
        );
        log.truncate_after(fork)?;
        Some(fork)
    } else {
        None
    };
    if ours != w.epochs {
        epochs.update(|s| {
            s.follow(w.epochs.clone());
            Ok(())
        })?;
    }
    Ok(cut)
}

/// Check the frames an earlier run kept against the twin's, by the
/// digests online verify uses (sequence, kind, epoch, meta and blob):
/// a crc passing on this box's disk proves no more than that the bytes
/// are what this box wrote. Answers how many were compared and the first
/// that differs. Frames below the twin's first are no longer on it and
/// keep their crcs' word alone.
async fn verify_kept(
    conn: &Connection,
    log: &Arc<Log>,
    epochs: &Epochs,
    w: &Welcome,
) -> Result<(u64, Option<u64>), RestoreError> {
    use crate::repl::verify::{digests, Found, Search};
    let (from, through) = (log.first_seq().max(w.first), log.head_seq().min(w.head));
    if from > through {
        return Ok((0, None));
    }
    if from > log.first_seq() {
        tracing::warn!(
            first = log.first_seq(),
            twin_first = w.first,
            "kept frames below the twin's first are checked by their crcs only"
        );
    }
    let history = epochs.history();
    let mut search = Search::new(from, through, 64);
    let mut step = search.step();
    while let Found::Ask(a) = step {
        let (l, h) = (log.clone(), history.clone());
        let ours = tokio::task::spawn_blocking(move || {
            digests(&l, &h, a.from, a.through, a.step, |_, _| {})
        })
        .await
        .map_err(|e| RestoreError::Protocol(e.to_string()))??;
        let req = RestoreReq::Digests {
            from: a.from,
            through: a.through,
            step: a.step,
        };
        let theirs = match ask(conn, &req).await?.0 {
            RestoreResp::Digests(d) => d,
            other => return Err(RestoreError::Protocol(format!("{other:?} to Digests"))),
        };
        step = search.answer(&ours, &theirs);
    }
    Ok(match step {
        Found::Differs(seq) => (seq - from, Some(seq)),
        _ => (through - from + 1, None),
    })
}

async fn hello(conn: &Connection) -> Result<Welcome, RestoreError> {
    match ask(conn, &RestoreReq::Hello).await?.0 {
        RestoreResp::Welcome {
            history,
            first,
            head,
            head_crc,
            epoch,
            epochs,
        } => Ok(Welcome {
            history,
            first,
            head,
            head_crc,
            epoch,
            epochs,
        }),
        other => Err(RestoreError::Protocol(format!("{other:?} to Hello"))),
    }
}

/// Restore the box in `opts.data_dir` from the twin. `progress` sees the
/// counters as they move (from a blocking thread).
pub async fn restore(
    opts: RestoreOptions,
    progress: Arc<dyn Fn(&Progress) + Send + Sync>,
) -> Result<RestoreReport, RestoreError> {
    let started = crate::node::clock::instant();
    let data = opts.data_dir.clone();
    let paths = InstallPaths::new(&data);
    // The box's real disk: the log, the store and the restore's own
    // files all go through it.
    let fs: Arc<dyn Storage> = StdStorage::shared();
    let marker = data.join(RESTORING_FILE);
    let resumed = fs.exists(&marker).unwrap_or(false);
    let salvaged = salvage(&*fs, &data)?;
    let log = Arc::new(Log::open_opts(
        data.join(crate::layout::LOG_DIR),
        LogOptions {
            segment_bytes: opts.segment_bytes,
            storage: Some(fs.clone()),
            ..LogOptions::default()
        },
    )?);
    if !resumed {
        log.reset(0).map_err(|e| match e {
            log::Error::NotFresh { frames, .. } => {
                RestoreError::NotFresh(format!("{frames} frames"))
            }
            other => RestoreError::Log(other),
        })?;
        if fs.list(&paths.store()).is_ok_and(|d| !d.is_empty()) {
            return Err(RestoreError::NotFresh("its store holds data".into()));
        }
        let from = format!(
            "--twin {} --twin-fingerprint {}",
            opts.source, opts.source_fingerprint
        );
        write_file(&*fs, &marker, &crate::layout::restoring_marker(&from))?;
        sync_parent_with(&*fs, &marker)?;
    }
    log.set_follower(true);
    install::finish(&paths, &log)?;

    let pins = Arc::new(Pins::new().pin(opts.source_fingerprint, Role::Twin));
    let endpoint = net::client(&opts.identity, pins)?;
    let conn = tokio::time::timeout(
        crate::node::client::CONNECT_TIMEOUT,
        net::connect(&endpoint, opts.source),
    )
    .await
    .map_err(|_| NetError::Io(std::io::Error::from(std::io::ErrorKind::TimedOut)))??;
    let w = hello(&conn).await?;
    let history = HistoryId(w.history);
    if log.history() != history {
        if log.first_seq() <= log.head_seq() {
            return Err(RestoreError::Diverged(format!(
                "this box's log is of history {}, the twin's {history}",
                log.history()
            )));
        }
        log.adopt_history(history)?;
    }
    let epochs = Epochs::load_with(fs.clone(), &data, log.head_seq())?;
    let mut cut_after = reconcile(&log, &epochs, &w)?;
    if log.head_seq() > w.head {
        return Err(RestoreError::Diverged(format!(
            "this box holds up to {}, the twin only {}",
            log.head_seq(),
            w.head
        )));
    }
    let mut report = RestoreReport {
        resumed,
        cut_after,
        ..RestoreReport::default()
    };
    if resumed {
        let (verified, differs) = verify_kept(&conn, &log, &epochs, &w).await?;
        report.verified = verified;
        if let Some(seq) = differs {
            tracing::warn!(
                seq,
                "a frame an earlier run kept differs from the twin's: it and every later one are cut and fetched again"
            );
            log.truncate_after(seq - 1)?;
            report.verify_cut_after = Some(seq - 1);
        }
    }
    let mut prog = Progress {
        head: log.head_seq(),
        target: w.head,
        ..Progress::default()
    };
    if log.head_seq() + 1 < w.first {
        let p2 = progress.clone();
        let mut shown = prog;
        let mut on_bytes = move |held: u64, total: u64| {
            shown.snapshot_held = held;
            shown.snapshot_total = total;
            p2(&shown);
        };
        let fetched: Fetched = snapshot::fetch_with(&fs, &conn, &paths, &mut on_bytes).await?;
        let (l2, p3) = (log.clone(), paths.clone());
        let at = tokio::task::spawn_blocking(move || install::install(&p3, &l2, None))
            .await
            .map_err(|e| RestoreError::Protocol(e.to_string()))??;
        report.snapshot_at = Some(at);
        report.snapshot_received = fetched.received;
        report.snapshot_reused = fetched.reused;
        prog.head = log.head_seq();
    }
    report.started_at_seq = log.head_seq() + 1;

    // Frames, until the box holds the twin's head.
    let handle = tokio::runtime::Handle::current();
    let mut partial = salvaged.filter(|p| p.seq == log.head_seq() + 1);
    if partial.is_none() {
        drop_partial(&*fs, &data);
    }
    report.started_at_byte = partial.as_ref().map_or(0, |p| p.written);
    report.salvaged_bytes = report.started_at_byte;
    loop {
        let w = hello(&conn).await?;
        if let Some(cut) = reconcile(&log, &epochs, &w)? {
            cut_after = Some(cut_after.map_or(cut, |c| c.min(cut)));
            report.cut_after = cut_after;
            partial = None;
            drop_partial(&*fs, &data);
            prog.head = log.head_seq();
        }
        let target = w.head;
        if log.head_seq() >= target {
            break;
        }
        prog.target = target;
        let pulled = {
            let (log, conn, data, handle, progress) = (
                log.clone(),
                conn.clone(),
                data.clone(),
                handle.clone(),
                progress.clone(),
            );
            let part = partial.take();
            let started_at = started;
            tokio::task::spawn_blocking(move || {
                pull(
                    &handle, &conn, &log, &data, part, prog, &*progress, started_at,
                )
            })
            .await
            .map_err(|e| RestoreError::Protocol(e.to_string()))??
        };
        prog = pulled.progress;
        report.frames += pulled.frames;
        report.received_bytes += pulled.bytes;
        if report.first_new_byte_ms.is_none() {
            report.first_new_byte_ms = pulled.first_new_byte_ms;
        }
    }

    // The box's head must be the twin's, frame for frame.
    let w = hello(&conn).await?;
    let ours = install::head_crc(&log, &paths.base())?;
    if log.head_seq() != w.head || ours != w.head_crc {
        return Err(RestoreError::Diverged(format!(
            "head {} crc {ours:08x} here, {} crc {:08x} on the twin",
            log.head_seq(),
            w.head,
            w.head_crc
        )));
    }
    conn.close(0u32.into(), b"restored");
    let (l2, store_dir) = (log.clone(), paths.store());
    tokio::task::spawn_blocking(move || -> Result<(), StoreError> {
        let mut store = Store::open(&store_dir, l2.history(), StoreOptions::default())?;
        store.catch_up(&l2)?;
        Ok(())
    })
    .await
    .map_err(|e| RestoreError::Protocol(e.to_string()))??;
    // The restored log is the source's: so are its epochs.
    epochs
        .update(|s| {
            s.follow(w.epochs.clone());
            Ok(())
        })
        .map_err(|e| RestoreError::Protocol(format!("epochs: {e}")))?;
    log.set_follower(false);
    drop_partial(&*fs, &data);
    fs.remove(&marker)?;
    sync_parent_with(&*fs, &marker)?;
    report.head = log.head_seq();
    report.first = log.first_seq();
    report.epoch = w.epoch;
    report.secs = started.elapsed().as_secs_f64();
    Ok(report)
}

/// The blob bytes written since the last sync, by segment: once synced,
/// their pages are given back. Nothing reads a restored box's frames
/// before it serves, and a restore of many GiB would otherwise fill the
/// page cache with them, evicting what others use and taking fresh pages
/// (on a VM whose host reclaims idle guest memory, cold ones: the copy
/// into them ran at a seventh of its warm speed).
#[derive(Default)]
struct Written {
    ranges: Vec<(PathBuf, u64, u64)>,
}

impl Written {
    fn add(&mut self, segment: &Path, at: u64, len: u64) {
        match self.ranges.last_mut() {
            Some((seg, _, end)) if seg == segment && *end <= at => *end = at + len,
            _ => self.ranges.push((segment.to_path_buf(), at, at + len)),
        }
    }

    /// After a sync: the pages are clean, and dropping them loses nothing.
    fn drop_cached(&mut self, fs: &dyn Storage) {
        for (segment, from, to) in self.ranges.drain(..) {
            let dropped = fs
                .open(&segment, OpenMode::Read)
                .and_then(|f| f.drop_cached(from, to - from));
            if let Err(e) = dropped {
                tracing::debug!(segment = %segment.display(), error = %e, "restored pages not dropped");
            }
        }
    }
}

struct Pulled {
    frames: u64,
    bytes: u64,
    progress: Progress,
    first_new_byte_ms: Option<f64>,
}

/// One frames request, written as it streams; runs on a blocking thread
/// and waits on the network through the runtime's handle.
#[allow(clippy::too_many_arguments)]
fn pull(
    rt: &tokio::runtime::Handle,
    conn: &Connection,
    log: &Log,
    data: &Path,
    partial: Option<PartialEntry>,
    mut prog: Progress,
    progress: &(dyn Fn(&Progress) + Send + Sync),
    started: Instant,
) -> Result<Pulled, RestoreError> {
    let from = log.head_seq() + 1;
    let offset = partial.as_ref().map_or(0, |p| p.written);
    let (resp, recv) = rt.block_on(ask(conn, &RestoreReq::Frames { from, offset }))?;
    let RestoreResp::Frames { through } = resp else {
        return Err(RestoreError::Protocol(format!("{resp:?} to Frames")));
    };
    let mut out = Pulled {
        frames: 0,
        bytes: 0,
        progress: prog,
        first_new_byte_ms: None,
    };
    let mut recv = PumpedStream::start(rt, recv);
    let mut unsynced_bytes = 0u64;
    let mut written = Written::default();
    let mut buf = vec![0u8; RESTORE_PIECE];
    let mut last_shown = crate::node::clock::instant();
    for seq in from..=through {
        let h: RestoreFrame = recv.read_msg()?.ok_or_else(|| {
            RestoreError::Protocol(format!("the stream ended before frame {seq}"))
        })?;
        if h.seq != seq {
            return Err(RestoreError::Protocol(format!(
                "frame {} where {seq} was due",
                h.seq
            )));
        }
        let want_from = if seq == from { offset } else { 0 };
        if h.from != want_from {
            return Err(RestoreError::Protocol(format!(
                "frame {seq} from byte {}, {want_from} was asked",
                h.from
            )));
        }
        if h.from > h.blob_len || (h.erased && h.from > 0) {
            return Err(RestoreError::BadLength {
                seq,
                what: format!(
                    "its blob of {} bytes resumed at byte {}",
                    h.blob_len, h.from
                ),
            });
        }
        if h.blob_len > log::MAX_BLOB {
            return Err(RestoreError::BadLength {
                seq,
                what: format!(
                    "a blob of {} bytes, past the log's limit of {}",
                    h.blob_len,
                    log::MAX_BLOB
                ),
            });
        }
        if h.erased {
            log.stage_erased_at(seq, &h.meta, h.blob_len, h.payload_crc)?;
        } else {
            let mut p = log.begin(Some(seq), h.kind, &h.meta, h.blob_len)?;
            p.expect_payload_crc(h.payload_crc);
            let tracked = h.blob_len >= TRACKED_ENTRY;
            let mut crc = crc32fast::Hasher::new();
            let (segment, blob_at) = p.blob_at();
            written.add(&segment, blob_at, h.blob_len);
            // Where the entry got to, for a run after a kill to salvage.
            // A hint, not a promise: salvage checks the bytes it names
            // against `crc_written`, so it is published without fsyncs,
            // which at one record a piece would cost two device flushes a
            // MiB.
            let record = |written: u64, crc: &crc32fast::Hasher| -> std::io::Result<()> {
                if !tracked {
                    return Ok(());
                }
                publish_hint_with(
                    &**log.storage(),
                    &data.join(PARTIAL_FILE),
                    &json(&PartialEntry {
                        seq,
                        kind: h.kind,
                        meta: h.meta.clone(),
                        blob_len: h.blob_len,
                        payload_crc: h.payload_crc,
                        segment: segment.clone(),
                        blob_at,
                        written,
                        crc_written: crc.clone().finalize(),
                    })?,
                )
            };
            // The salvaged bytes first, from the side file.
            if h.from > 0 {
                let side = log
                    .storage()
                    .open(&data.join(SALVAGE_FILE), OpenMode::Read)?;
                let mut pos = 0;
                while pos < h.from {
                    let n = (buf.len() as u64).min(h.from - pos) as usize;
                    side.read_exact_at(&mut buf[..n], pos)?;
                    p.write(&buf[..n])?;
                    crc.update(&buf[..n]);
                    pos += n as u64;
                }
                record(pos, &crc)?;
            }
            let mut left = h.blob_len - h.from;
            while left > 0 {
                let n = (buf.len() as u64).min(left) as usize;
                recv.read_exact(&mut buf[..n])?;
                p.write(&buf[..n])?;
                if out.first_new_byte_ms.is_none() {
                    out.first_new_byte_ms = Some(started.elapsed().as_secs_f64() * 1000.0);
                }
                crc.update(&buf[..n]);
                left -= n as u64;
                out.bytes += n as u64;
                unsynced_bytes += n as u64;
                record(p.written(), &crc)?;
                prog.bytes += n as u64;
                if last_shown.elapsed().as_millis() >= 200 {
                    last_shown = crate::node::clock::instant();
                    progress(&prog);
                }
            }
            p.commit_unsynced()?;
        }
        out.frames += 1;
        prog.frames += 1;
        prog.head = seq;
        unsynced_bytes += 64;
        if unsynced_bytes >= SYNC_EVERY || seq == through {
            log.sync()?;
            unsynced_bytes = 0;
            written.drop_cached(&**log.storage());
            drop_partial(&**log.storage(), data);
            progress(&prog);
        }
    }
    out.progress = prog;
    Ok(out)
}
