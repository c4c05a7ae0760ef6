//! Snapshots over the wire: a box that serves frames (a primary to its
//! twin, a twin to a box being restored) also serves a snapshot of its
//! store, and the receiver fetches it file by file into its staging
//! directory, resuming from the bytes it already holds.
//!
//! One bidirectional stream per request, on the connection the receiver
//! already has: `SnapshotReq::Manifest` answers the snapshot's base and its
//! manifest; `SnapshotReq::File` answers a file's bytes from an offset.
//! Documented in docs/PROTOCOL.md.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use quinn::{Connection, RecvStream, SendStream};
use serde::{Deserialize, Serialize};

use crate::net::{self, NetError};
use crate::node::store_host::StoreHost;
use crate::storage::{file_len, OpenMode, StdStorage, Storage, StorageFile};
use crate::store::install::{self, InstallPaths, SnapshotBase};
use crate::store::snapshot::{self as store_snapshot, Manifest, MANIFEST_NAME};
use crate::store::StoreError;

/// Remove the snapshot directories under `dir` (named by their seq)
/// whose seq `drop` picks, durably; answers how many went.
fn remove_snapshots(
    fs: &dyn Storage,
    dir: &Path,
    drop: impl Fn(u64) -> bool,
) -> std::io::Result<usize> {
    let names = match fs.list(dir) {
        Ok(n) => n,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(e),
    };
    let mut removed = 0;
    for name in names {
        if name.parse::<u64>().is_ok_and(&drop) {
            fs.remove_dir_all(&dir.join(name))?;
            removed += 1;
        }
    }
    if removed > 0 {
        fs.sync_dir(dir)?;
    }
    Ok(removed)
}

/// `n` bytes of `file` at `at` into `buf`, off the async threads (as
/// tokio's files are read); answers the buffer.
async fn read_piece(
    file: Arc<dyn StorageFile>,
    mut buf: Vec<u8>,
    n: usize,
    at: u64,
) -> std::io::Result<Vec<u8>> {
    tokio::task::spawn_blocking(move || file.read_exact_at(&mut buf[..n], at).map(|()| buf))
        .await
        .map_err(std::io::Error::other)?
}

/// The first `n` bytes of `buf` written to `file` at `at`, off the async
/// threads; answers the buffer.
async fn write_piece(
    file: Arc<dyn StorageFile>,
    buf: Vec<u8>,
    n: usize,
    at: u64,
) -> std::io::Result<Vec<u8>> {
    tokio::task::spawn_blocking(move || file.write_all_at(&buf[..n], at).map(|()| buf))
        .await
        .map_err(std::io::Error::other)?
}

/// Requests closer together than this belong to one restore, whose lowest
/// frame is kept; a later one starts a new pin.
const RESTORE_USE_FRESH: std::time::Duration = std::time::Duration::from_secs(60);

/// The largest manifest a receiver takes.
pub const MAX_MANIFEST: u64 = 64 << 20;
const PIECE: usize = 1 << 20;

/// What a receiver asks.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum SnapshotReq {
    /// The snapshot on offer (taken now, or the one offered before while
    /// the frame at its seq is still retained).
    Manifest,
    /// A file of the snapshot taken at `at`, from byte `offset` to its end.
    File { at: u64, path: String, offset: u64 },
}

/// What the source answers.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum SnapshotResp {
    /// `len` bytes of the manifest (JSON) follow.
    Manifest { base: SnapshotBase, len: u64 },
    /// `len` bytes of the file follow.
    File { len: u64 },
    /// Refused, by name.
    Refused(String),
}

/// A snapshot transfer's failure.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    #[error(transparent)]
    Net(#[from] NetError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("I/O: {0}")]
    Io(#[from] std::io::Error),
    #[error("the source refused: {0}")]
    Refused(String),
    #[error("snapshot protocol: {0}")]
    Protocol(String),
}

/// The snapshot a box offers, taken on demand and kept while its seq is
/// retained, so an interrupted transfer resumes against the same files.
pub struct SnapshotSource {
    host: Arc<StoreHost>,
    dir: PathBuf,
    /// The box's own base: the crc of its first frame's predecessor, when
    /// its log restarted after a snapshot of its own.
    own_base: Option<PathBuf>,
    current: Mutex<Option<Offered>>,
    /// Snapshots taken before this seq may hold data an erase removed:
    /// they are dropped, and never offered again.
    erased_through: std::sync::atomic::AtomicU64,
    /// The lowest frame a restore being served needs, and when it last
    /// asked: the twin's retention keeps the frames from there on.
    restore_use: Mutex<Option<(u64, tokio::time::Instant)>>,
}

#[derive(Clone)]
struct Offered {
    base: SnapshotBase,
    manifest: Manifest,
    bytes: Vec<u8>,
}

impl SnapshotSource {
    /// Snapshots live under `dir`; `own_base` is the box's SNAPSHOT_BASE.
    /// What an earlier run left under `dir` is removed: nothing offers it
    /// any more, and it may hold data erased since.
    pub fn new(host: Arc<StoreHost>, dir: &Path, own_base: Option<PathBuf>) -> Arc<SnapshotSource> {
        if let Err(e) = remove_snapshots(&**host.log().storage(), dir, |_| true) {
            tracing::error!(dir = %dir.display(), error = %e, "removing old snapshots");
        }
        let source = Arc::new(SnapshotSource {
            host: host.clone(),
            dir: dir.to_owned(),
            own_base,
            current: Mutex::new(None),
            erased_through: std::sync::atomic::AtomicU64::new(0),
            restore_use: Mutex::new(None),
        });
        let weak = Arc::downgrade(&source);
        host.on_erase(Arc::new(move |erase_seq| {
            if let Some(source) = weak.upgrade() {
                source.erased(erase_seq);
            }
        }));
        source
    }

    /// An erase at `erase_seq` was applied: every snapshot taken before it
    /// goes, now, before the erase is reported carried out. Runs under the
    /// store's lock, so it takes no lock of its own that `ensure` holds
    /// across a snapshot: `ensure` sees the mark and takes a new one.
    fn erased(&self, erase_seq: u64) {
        self.erased_through
            .fetch_max(erase_seq, std::sync::atomic::Ordering::SeqCst);
        match remove_snapshots(self.fs(), &self.dir, |at| at < erase_seq) {
            Ok(0) => {}
            Ok(n) => tracing::info!(
                erase_seq,
                removed = n,
                "dropped snapshots taken before an erase"
            ),
            Err(e) => tracing::error!(error = %e, "dropping snapshots taken before an erase"),
        }
    }

    /// The storage snapshots are taken on: the log's, as the store's.
    fn fs(&self) -> &dyn Storage {
        &**self.host.log().storage()
    }

    fn current(&self) -> std::sync::MutexGuard<'_, Option<Offered>> {
        self.current.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The seq of the snapshot on offer: retention keeps its frame.
    pub fn offered_at(&self) -> Option<u64> {
        self.current().as_ref().map(|o| o.base.at)
    }

    /// Drop the offered snapshot once no receiver needs it.
    pub fn forget(&self) {
        if let Some(o) = self.current().take() {
            let _ = self
                .fs()
                .remove_dir_all(&self.dir.join(o.base.at.to_string()));
            tracing::info!(at = o.base.at, "dropped the offered snapshot");
        }
    }

    /// A receiver needs the frames from `from` on: a restore asking for
    /// them, or for the snapshot at `from` (whose frame proves its base).
    /// A use older than the pin window starts afresh.
    pub fn note_restore(&self, from: u64) {
        let now = crate::node::clock::instant();
        let mut u = self.restore_use.lock().unwrap_or_else(|e| e.into_inner());
        let low = match *u {
            Some((f, at)) if now.duration_since(at) < RESTORE_USE_FRESH => f.min(from),
            _ => from,
        };
        *u = Some((low, now));
    }

    /// The lowest frame a restore used within `window` needs.
    pub fn restore_pinned_from(&self, window: std::time::Duration) -> Option<u64> {
        let u = *self.restore_use.lock().unwrap_or_else(|e| e.into_inner());
        u.filter(|(_, at)| at.elapsed() < window).map(|(f, _)| f)
    }

    /// Drop the snapshot on offer when the log no longer holds every frame
    /// after it and no restore used it within `window`: it pins nothing
    /// then, and the next receiver gets a fresh one.
    pub fn forget_unused_below(&self, first: u64, window: std::time::Duration) {
        let stale = self.offered_at().is_some_and(|at| at + 1 < first);
        if stale && self.restore_pinned_from(window).is_none() {
            self.forget();
        }
    }

    /// Take (or keep) the snapshot on offer, as a receiver's first request
    /// does: its seq and manifest.
    pub fn offer(&self) -> Result<(u64, Manifest), StoreError> {
        let o = self.ensure()?;
        Ok((o.base.at, o.manifest))
    }

    /// The payload crc of the frame at `at`, from the log or the base.
    fn crc_at(&self, at: u64) -> Result<u32, StoreError> {
        let base = match self.own_base.as_deref() {
            Some(path) => install::read_base_with(self.fs(), path)?,
            None => None,
        };
        install::crc_of_frame(self.host.log(), base.as_ref(), at)
    }

    /// The snapshot to offer: the current one while the frame at its seq
    /// is retained (or is this box's own base), else a new one.
    fn ensure(&self) -> Result<Offered, StoreError> {
        let log = self.host.log();
        let mut cur = self.current();
        if let Some(o) = cur.as_ref() {
            let erased_since = o.base.at
                < self
                    .erased_through
                    .load(std::sync::atomic::Ordering::SeqCst);
            if !erased_since && o.base.at + 1 >= log.first_seq() && self.crc_at(o.base.at).is_ok() {
                return Ok(o.clone());
            }
        }
        let fs = self.fs();
        fs.create_dir_all(&self.dir)?;
        let taking = self.dir.join("taking");
        fs.remove_dir_all(&taking)?;
        let manifest = self.host.snapshot_to(&taking)?;
        let at = manifest.at;
        let crc_at = self.crc_at(at)?;
        let dest = self.dir.join(at.to_string());
        fs.remove_dir_all(&dest)?;
        fs.rename(&taking, &dest)?;
        if let Some(old) = cur.take() {
            if old.base.at != at {
                let _ = fs.remove_dir_all(&self.dir.join(old.base.at.to_string()));
            }
        }
        let bytes = fs.read(&dest.join(MANIFEST_NAME))?;
        let offered = Offered {
            base: SnapshotBase {
                at,
                crc_at,
                history: log.history().0,
            },
            manifest,
            bytes,
        };
        tracing::info!(
            at,
            bytes = offered.manifest.bytes(),
            files = offered.manifest.files.len(),
            "snapshot taken to offer"
        );
        *cur = Some(offered.clone());
        Ok(offered)
    }

    /// Answer one request stream.
    pub async fn serve(
        self: Arc<Self>,
        send: SendStream,
        mut recv: RecvStream,
    ) -> Result<(), SnapshotError> {
        let Some(req) = net::read_msg::<SnapshotReq>(&mut recv).await? else {
            return Ok(());
        };
        self.answer(req, send).await
    }

    /// Answer a request already read from its stream.
    pub async fn answer(
        self: Arc<Self>,
        req: SnapshotReq,
        mut send: SendStream,
    ) -> Result<(), SnapshotError> {
        match req {
            SnapshotReq::Manifest => {
                let me = self.clone();
                let offered = tokio::task::spawn_blocking(move || me.ensure())
                    .await
                    .map_err(|e| SnapshotError::Protocol(e.to_string()))?;
                match offered {
                    Ok(o) => {
                        self.note_restore(o.base.at);
                        let resp = SnapshotResp::Manifest {
                            base: o.base,
                            len: o.bytes.len() as u64,
                        };
                        net::write_msg(&mut send, &resp).await?;
                        send.write_all(&o.bytes).await.map_err(NetError::from)?;
                    }
                    Err(e) => {
                        net::write_msg(&mut send, &SnapshotResp::Refused(e.to_string())).await?;
                    }
                }
            }
            SnapshotReq::File { at, path, offset } => {
                let file = {
                    let cur = self.current();
                    cur.as_ref()
                        .filter(|o| o.base.at == at)
                        .and_then(|o| o.manifest.files.iter().find(|f| f.path == path))
                        .map(|f| (self.dir.join(at.to_string()).join(&f.path), f.len))
                };
                self.note_restore(at);
                let Some((full, len)) = file else {
                    let why = format!("no file {path:?} in a snapshot at {at} on offer");
                    net::write_msg(&mut send, &SnapshotResp::Refused(why)).await?;
                    let _ = send.finish();
                    return Ok(());
                };
                if offset > len {
                    let why = format!("offset {offset} past the end of {path} ({len} bytes)");
                    net::write_msg(&mut send, &SnapshotResp::Refused(why)).await?;
                    let _ = send.finish();
                    return Ok(());
                }
                net::write_msg(&mut send, &SnapshotResp::File { len: len - offset }).await?;
                let f = self.fs().open(&full, OpenMode::Read)?;
                let mut at = offset;
                let mut buf = vec![0u8; PIECE];
                while at < len {
                    let n = (PIECE as u64).min(len - at) as usize;
                    buf = read_piece(f.clone(), buf, n, at).await?;
                    send.write_all(&buf[..n]).await.map_err(NetError::from)?;
                    at += n as u64;
                }
            }
        }
        let _ = send.finish();
        Ok(())
    }
}

/// Serve every further stream a receiver opens on `conn` as a snapshot
/// request, until the connection ends.
pub async fn serve_requests(source: Arc<SnapshotSource>, conn: Connection) {
    while let Ok((send, recv)) = conn.accept_bi().await {
        let s = source.clone();
        tokio::spawn(async move {
            if let Err(e) = s.serve(send, recv).await {
                tracing::warn!(error = %e, "a snapshot request failed");
            }
        });
    }
}

/// How far a fetch got.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Fetched {
    pub base: Option<SnapshotBase>,
    /// Bytes of the snapshot.
    pub total: u64,
    /// Bytes received by this fetch.
    pub received: u64,
    /// Bytes already staged by an earlier, interrupted fetch.
    pub reused: u64,
}

async fn request(
    conn: &Connection,
    req: &SnapshotReq,
) -> Result<(SnapshotResp, RecvStream), SnapshotError> {
    let (mut send, mut recv) = conn.open_bi().await.map_err(NetError::from)?;
    net::write_msg(&mut send, req).await?;
    let _ = send.finish();
    match net::read_msg::<SnapshotResp>(&mut recv).await? {
        None => Err(SnapshotError::Protocol("no answer".into())),
        Some(SnapshotResp::Refused(why)) => Err(SnapshotError::Refused(why)),
        Some(resp) => Ok((resp, recv)),
    }
}

/// Fetch the snapshot on offer into the staging directory: a staged
/// snapshot of the same base keeps its bytes and only the rest moves.
/// `progress` sees (bytes held, total) as they grow.
pub async fn fetch(
    conn: &Connection,
    paths: &InstallPaths,
    progress: &mut (dyn FnMut(u64, u64) + Send),
) -> Result<Fetched, SnapshotError> {
    fetch_with(&StdStorage::shared(), conn, paths, progress).await
}

/// [`fetch`], staged through `fs`.
pub async fn fetch_with(
    fs: &Arc<dyn Storage>,
    conn: &Connection,
    paths: &InstallPaths,
    progress: &mut (dyn FnMut(u64, u64) + Send),
) -> Result<Fetched, SnapshotError> {
    let (resp, mut recv) = request(conn, &SnapshotReq::Manifest).await?;
    let SnapshotResp::Manifest { base, len } = resp else {
        return Err(SnapshotError::Protocol(format!(
            "{resp:?} to a manifest request"
        )));
    };
    if len > MAX_MANIFEST {
        return Err(SnapshotError::Protocol(format!(
            "a manifest of {len} bytes"
        )));
    }
    let mut bytes = vec![0u8; len as usize];
    recv.read_exact(&mut bytes).await.map_err(NetError::from)?;
    let staged = install::read_base_with(&**fs, &paths.staged_base())?;
    if staged != Some(base) {
        if fs.exists(&paths.staging())? {
            tracing::info!(?staged, offered = ?base, "a different snapshot is on offer: staging anew");
            fs.remove_dir_all(&paths.staging())?;
        }
        install::stage_base_with(&**fs, paths, &base)?;
    }
    let files_dir = paths.files();
    let manifest_path = files_dir.join(MANIFEST_NAME);
    crate::publish::publish_with(&**fs, &manifest_path, &bytes)?;
    let manifest = store_snapshot::read_manifest_with(&**fs, &files_dir)?;
    if manifest.at != base.at {
        return Err(SnapshotError::Protocol(format!(
            "the manifest is at {}, the base at {}",
            manifest.at, base.at
        )));
    }
    let mut out = Fetched {
        base: Some(base),
        total: manifest.bytes(),
        ..Fetched::default()
    };
    let mut held = 0u64;
    for f in &manifest.files {
        let local = files_dir.join(&f.path);
        let have = file_len(&**fs, &local).ok().flatten().unwrap_or(0);
        let have = if have > f.len { 0 } else { have };
        out.reused += have;
        held += have;
        progress(held, out.total);
        if let Some(parent) = local.parent() {
            fs.create_dir_all(parent)?;
        }
        if have == f.len {
            if f.len == 0 && !fs.exists(&local)? {
                fs.open(&local, OpenMode::Create)?;
            }
            continue;
        }
        let req = SnapshotReq::File {
            at: base.at,
            path: f.path.clone(),
            offset: have,
        };
        let (resp, mut recv) = request(conn, &req).await?;
        match resp {
            SnapshotResp::File { len } if len == f.len - have => {}
            other => {
                return Err(SnapshotError::Protocol(format!(
                    "{other:?} for {} from {have}",
                    f.path
                )))
            }
        }
        let file = fs.open(&local, OpenMode::Create)?;
        file.set_len(have)?;
        let mut at = have;
        let mut buf = vec![0u8; PIECE];
        while at < f.len {
            let n = (PIECE as u64).min(f.len - at) as usize;
            recv.read_exact(&mut buf[..n])
                .await
                .map_err(NetError::from)?;
            buf = write_piece(file.clone(), buf, n, at).await?;
            at += n as u64;
            held += n as u64;
            out.received += n as u64;
            progress(held, out.total);
        }
        let synced = file.clone();
        tokio::task::spawn_blocking(move || synced.sync_all())
            .await
            .map_err(std::io::Error::other)??;
    }
    Ok(out)
}
