//! Store snapshots in the archive: a snapshot's files (its manifest
//! last) back to back in one object, cut into pieces like a segment, so a
//! restore can start from the newest snapshot before its target instead
//! of frame 1, and the archive's log need not reach back that far.
//!
//! The uploading box takes one each time `snapshot_every` bytes of
//! segments were archived since the last; a restore installs it as a
//! twin installs a snapshot ([`crate::store::install`]): the store swapped
//! in, the log restarted after the snapshot's frame, the base recorded.

use std::io::Write;
use std::path::{Component, Path};
use std::sync::atomic::Ordering;

use bytes::Bytes;

use super::bucket::Bucket;
use super::codec::Codec;
use super::fetch::{open_object, Pieces};
use super::names::{epochs_through, lineage, SnapshotName};
use super::object::{Content, ObjectWriter, SnapshotFile, SnapshotInfo, PIECE_LEN};
use super::upload::{read_full, Pace};
use super::Error;
use crate::repl::epochs::EpochStart;
use crate::store::snapshot::{Manifest, MANIFEST_NAME};

/// Where the uploading box takes a snapshot before it is uploaded, in its
/// data directory.
pub const SCRATCH_DIR: &str = "archive-snapshot.scratch";

/// A snapshot taken into `dir` to archive.
pub struct SnapshotJob<'a> {
    pub dir: &'a Path,
    pub manifest: &'a Manifest,
    /// The payload crc of frame `manifest.at`.
    pub crc_at: u32,
    pub history: [u8; 16],
    pub epochs: &'a [EpochStart],
}

/// What one snapshot upload sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SnapshotSent {
    pub name: SnapshotName,
    pub plain_bytes: u64,
    pub stored_bytes: u64,
}

fn io(path: &Path) -> impl Fn(std::io::Error) -> Error + '_ {
    move |e| Error::Io(format!("{}: {e}", path.display()))
}

/// Archive the snapshot in `job.dir`: every file the manifest lists,
/// each checked against the manifest's crc as it is read, then the
/// manifest.
pub async fn upload_snapshot(
    bucket: &Bucket,
    codec: &Codec,
    job: SnapshotJob<'_>,
    pace: &mut Pace,
) -> Result<SnapshotSent, Error> {
    let at = job.manifest.at;
    let manifest_len = std::fs::metadata(job.dir.join(MANIFEST_NAME))
        .map_err(io(job.dir))?
        .len();
    let mut files: Vec<(String, u64, Option<u32>)> = job
        .manifest
        .files
        .iter()
        .map(|f| (f.path.clone(), f.len, Some(f.crc32)))
        .collect();
    files.push((MANIFEST_NAME.to_owned(), manifest_len, None));
    // A first read checks every file against the manifest and sums the
    // bytes the name carries; the second cuts them into pieces.
    let mut chunk = vec![0u8; 1 << 20];
    let mut first = crc32fast::Hasher::new();
    for (path, len, crc) in &files {
        let full = job.dir.join(path);
        let mut f = std::fs::File::open(&full).map_err(io(&full))?;
        let mut h = crc32fast::Hasher::new();
        let mut left = *len;
        while left > 0 {
            let want = (left as usize).min(chunk.len());
            let n = read_full(&mut f, &mut chunk[..want]).map_err(io(&full))?;
            if n == 0 {
                return Err(Error::Changed);
            }
            h.update(&chunk[..n]);
            first.update(&chunk[..n]);
            left -= n as u64;
        }
        if crc.is_some_and(|c| c != h.finalize()) {
            return Err(Error::Corrupt(format!(
                "snapshot file {path}: its bytes do not match the manifest's crc"
            )));
        }
    }
    let summed = first.finalize();
    let sum = match &codec.key {
        Some(k) => {
            let mut parts = summed.to_le_bytes().to_vec();
            parts.extend_from_slice(&at.to_le_bytes());
            k.name_sum(&parts)
        }
        None => summed,
    };
    let name = SnapshotName {
        at,
        lineage: lineage(&job.history, job.epochs, at),
        sum,
    };
    let key = bucket.snapshot_key(&name);
    let mut w = ObjectWriter::new(codec, PIECE_LEN, &key)?;
    let mut listed = Vec::with_capacity(files.len());
    let mut buf: Vec<u8> = Vec::with_capacity(PIECE_LEN as usize);
    let mut offset = 0u64;
    let mut all = crc32fast::Hasher::new();
    let mut up = bucket.writer(&key);
    let result: Result<(), Error> = async {
        for (path, len, crc) in &files {
            let full = job.dir.join(path);
            let mut f = std::fs::File::open(&full).map_err(io(&full))?;
            let mut h = crc32fast::Hasher::new();
            let mut left = *len;
            while left > 0 {
                let want = (left as usize).min(chunk.len());
                let n = read_full(&mut f, &mut chunk[..want]).map_err(io(&full))?;
                if n == 0 {
                    return Err(Error::Changed);
                }
                h.update(&chunk[..n]);
                all.update(&chunk[..n]);
                left -= n as u64;
                let mut rest = &chunk[..n];
                while !rest.is_empty() {
                    let take = (PIECE_LEN as usize - buf.len()).min(rest.len());
                    buf.extend_from_slice(&rest[..take]);
                    rest = &rest[take..];
                    if buf.len() == PIECE_LEN as usize {
                        let stored = w.piece(&buf, None)?;
                        buf.clear();
                        pace.take(stored.len()).await;
                        up.write(Bytes::from(stored)).await?;
                    }
                }
            }
            let got = h.finalize();
            if crc.is_some_and(|c| c != got) {
                return Err(Error::Changed);
            }
            listed.push(SnapshotFile {
                path: path.clone(),
                offset,
                len: *len,
                crc32: got,
            });
            offset += len;
        }
        if !buf.is_empty() {
            let stored = w.piece(&buf, None)?;
            pace.take(stored.len()).await;
            up.write(Bytes::from(stored)).await?;
        }
        Ok(())
    }
    .await;
    if let Err(e) = result {
        up.abort().await;
        return Err(e);
    }
    let stored = w.stored_len();
    let (tail, _) = w.finish(Content::Snapshot(SnapshotInfo {
        history: job.history,
        at,
        crc_at: job.crc_at,
        epochs: epochs_through(job.epochs, at),
        files: listed,
    }))?;
    let stored_bytes = stored + tail.len() as u64;
    if all.finalize() != summed {
        up.abort().await;
        return Err(Error::Changed);
    }
    up.write(Bytes::from(tail)).await?;
    up.finish().await?;
    Ok(SnapshotSent {
        name,
        plain_bytes: offset,
        stored_bytes,
    })
}

/// A path from a snapshot's footer, refused unless it stays inside the
/// directory it is written to.
fn inside(dir: &Path, path: &str) -> Result<std::path::PathBuf, Error> {
    let p = Path::new(path);
    if p.components().all(|c| matches!(c, Component::Normal(_))) && !path.is_empty() {
        Ok(dir.join(p))
    } else {
        Err(Error::Corrupt(format!("snapshot file path {path:?}")))
    }
}

/// Fetch the archived snapshot `key` into `dest` (its files and its
/// manifest), every piece and every file checked. Answers what it holds.
pub async fn download_snapshot(
    bucket: &Bucket,
    key: &str,
    size: u64,
    archive_key: Option<&super::codec::ArchiveKey>,
    dest: &Path,
) -> Result<SnapshotInfo, Error> {
    let opened = open_object(bucket, key, size, archive_key).await?;
    let info = match &opened.reader.footer().content {
        Content::Snapshot(info) => info.clone(),
        Content::Segment(_) | Content::Head(_) => {
            return Err(Error::Corrupt(format!("{key}: not a snapshot")));
        }
    };
    let mut expect = 0u64;
    for f in &info.files {
        if f.offset != expect {
            return Err(Error::Corrupt(format!("{key}: files out of order")));
        }
        expect += f.len;
    }
    if expect != opened.reader.footer().plain_len {
        return Err(Error::Corrupt(format!(
            "{key}: its files make {expect} bytes of {}",
            opened.reader.footer().plain_len
        )));
    }
    let mut pieces = Pieces::new(bucket, &opened, 0);
    let mut plain: Vec<u8> = Vec::new();
    let mut at = 0usize;
    for f in &info.files {
        let path = inside(dest, &f.path)?;
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(io(parent))?;
        }
        let mut out = std::io::BufWriter::new(std::fs::File::create(&path).map_err(io(&path))?);
        let mut h = crc32fast::Hasher::new();
        let mut left = f.len;
        while left > 0 {
            if at == plain.len() {
                match pieces.next().await? {
                    Some((_, p)) => {
                        plain = p;
                        at = 0;
                    }
                    None => return Err(Error::Corrupt(format!("{key}: short of {}", f.path))),
                }
            }
            let n = (left as usize).min(plain.len() - at);
            h.update(&plain[at..at + n]);
            out.write_all(&plain[at..at + n]).map_err(io(&path))?;
            at += n;
            left -= n as u64;
        }
        out.flush().map_err(io(&path))?;
        if h.finalize() != f.crc32 {
            return Err(Error::Corrupt(format!(
                "{key}: {} does not match its crc",
                f.path
            )));
        }
    }
    Ok(info)
}

/// Store snapshots archived by the uploader, one per `every_bytes` of
/// segments archived.
impl super::archiver::Archiver {
    /// Where the newest archived snapshot of this lineage is, and how
    /// many bytes of segments were archived after it: listed once.
    async fn count_since_snapshot(&self) -> Result<(), Error> {
        if self.last_snapshot_at.load(Ordering::SeqCst) != u64::MAX {
            return Ok(());
        }
        let history = self.log.history().0;
        let epochs = (self.epochs)();
        let bucket = &self.settings.bucket;
        let newest = bucket
            .snapshots()
            .await?
            .into_iter()
            .filter(|(n, _)| n.lineage == lineage(&history, &epochs, n.at))
            .map(|(n, _)| n.at)
            .max()
            .unwrap_or(0);
        let since: u64 = bucket
            .segments()
            .await?
            .iter()
            .filter(|(n, _)| n.first > newest && n.lineage == lineage(&history, &epochs, n.last))
            .map(|(_, size)| size)
            .sum();
        self.since_snapshot.store(since, Ordering::SeqCst);
        self.last_snapshot_at.store(newest, Ordering::SeqCst);
        Ok(())
    }

    /// Archive a store snapshot once enough segments were archived since
    /// the last.
    pub(super) async fn snapshot_if_due(&self, pace: &mut Pace) -> Result<(), Error> {
        let Some(s) = self.snapshots.get() else {
            return Ok(());
        };
        if s.every_bytes == 0 {
            return Ok(());
        }
        self.count_since_snapshot().await?;
        if self.since_snapshot.load(Ordering::SeqCst) < s.every_bytes {
            return Ok(());
        }
        if s.host.health().applied <= self.last_snapshot_at.load(Ordering::SeqCst) {
            // A store that has not moved (stalled, or caught up to the
            // last snapshot) would be copied only to be thrown away.
            return Ok(());
        }
        let (host, scratch, base_file) = (s.host.clone(), s.scratch.clone(), s.base_file.clone());
        let log = self.log.clone();
        let taken = tokio::task::spawn_blocking(move || {
            let _ = std::fs::remove_dir_all(&scratch);
            let manifest = host.snapshot_to(&scratch)?;
            let base = crate::store::install::read_base(&base_file)?;
            let crc_at = crate::store::install::crc_of_frame(&log, base.as_ref(), manifest.at)?;
            Ok::<_, crate::store::StoreError>((manifest, crc_at))
        })
        .await
        .map_err(|e| Error::Io(format!("the snapshot's task failed: {e}")))?
        .map_err(|e| Error::Io(format!("store snapshot: {e}")));
        let result = match taken {
            Ok((manifest, _)) if manifest.at <= self.last_snapshot_at.load(Ordering::SeqCst) => {
                // The store has not moved past the last one.
                Ok(())
            }
            Ok((manifest, crc_at)) => {
                let job = super::snapshot::SnapshotJob {
                    dir: &s.scratch,
                    manifest: &manifest,
                    crc_at,
                    history: self.log.history().0,
                    epochs: &(self.epochs)(),
                };
                super::snapshot::upload_snapshot(
                    &self.settings.bucket,
                    &self.settings.codec,
                    job,
                    pace,
                )
                .await
                .map(|sent| {
                    tracing::info!(
                        at = sent.name.at, bytes = sent.stored_bytes,
                        key = %self.settings.bucket.snapshot_key(&sent.name),
                        "archived a store snapshot"
                    );
                    self.since_snapshot.store(0, Ordering::SeqCst);
                    self.last_snapshot_at.store(sent.name.at, Ordering::SeqCst);
                    self.set_status(|st| {
                        st.snapshots_uploaded += 1;
                        st.last_snapshot_at = sent.name.at;
                    });
                })
            }
            Err(e) => Err(e),
        };
        let _ = std::fs::remove_dir_all(&s.scratch);
        result
    }
}
