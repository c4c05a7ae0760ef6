//! Erase reaching the archive. An Erase frame erases the log's frames of
//! some repositories on each box as the store applies it; the archived
//! copies of those frames are rewritten here, on the box that uploads:
//!
//! - as the store applies the Erase frame, the erase is recorded in
//!   [`EraseQueue`] (a file in the data directory, published by rename)
//!   before the store counts the frame applied, so a crash repeats it;
//! - the uploader takes the queue in order: every archived segment of
//!   this log that holds data of one of the repositories below the
//!   erase's `before` (its footer names the repositories it holds) is
//!   downloaded, its frames erased exactly as the log erases them (the
//!   header rewritten as an erased frame with no meta, the meta and blob
//!   zeros), checked and uploaded again as a new generation named by the
//!   Erase frame's sequence; then every older version of the object is
//!   deleted, and an empty marker `erases/<lineage>-<seq>.done` says the
//!   erase reached the archive;
//! - the box that watches drops from its queue the erases whose marker it
//!   lists, so either box may upload after a failover and neither redoes
//!   finished work.
//!
//! Every step is idempotent: a crash or a failed request anywhere leaves
//! the erase in the queue, and doing it again finds what is left to do.
//! A bucket with versioning keeps a deleted object's old versions: see
//! the README (*Archive*) for what it needs.

use std::collections::BTreeMap;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

use super::bucket::Bucket;
use super::codec::Codec;
use super::fetch::{open_object, Opened, Pieces};
use super::names::SegmentName;
use super::object::Content;
use super::upload::{upload_segment, Pace, SegmentJob};
use super::Error;
use crate::log::format::{FrameHeader, FRAME_HEADER_LEN, SEGMENT_HEADER_LEN};
use crate::log::{Kind, Meta};

/// The queue's file in the data directory.
pub const QUEUE_FILE: &str = "ARCHIVE_ERASES";
/// Where a segment being rewritten is kept, in the data directory.
pub const SCRATCH_FILE: &str = "archive-erase.scratch";
const QUEUE_MAGIC: [u8; 8] = *b"TWAERQ01";

/// An erase the archive has yet to see: the Erase frame at `seq` erased
/// the frames before `before` of `repos`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PendingErase {
    pub seq: u64,
    pub before: u64,
    pub repos: Vec<String>,
}

/// The erases the archive has yet to see, oldest first, in one small file.
#[derive(Debug)]
pub struct EraseQueue {
    path: PathBuf,
    lock: Mutex<()>,
}

fn io_err(path: &Path, e: impl std::fmt::Display) -> std::io::Error {
    std::io::Error::other(format!("{}: {e}", path.display()))
}

impl EraseQueue {
    /// The queue of the data directory `data_dir`.
    pub fn at(data_dir: &Path) -> EraseQueue {
        EraseQueue {
            path: data_dir.join(QUEUE_FILE),
            lock: Mutex::new(()),
        }
    }

    fn read(&self) -> std::io::Result<Vec<PendingErase>> {
        let bytes = match std::fs::read(&self.path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(io_err(&self.path, e)),
        };
        let body_len = bytes
            .len()
            .checked_sub(QUEUE_MAGIC.len() + 4)
            .ok_or_else(|| io_err(&self.path, "shorter than its magic and crc"))?;
        let (head, crc) = bytes.split_at(QUEUE_MAGIC.len() + body_len);
        if head[..QUEUE_MAGIC.len()] != QUEUE_MAGIC
            || crc32fast::hash(head).to_le_bytes() != crc[..]
        {
            return Err(io_err(&self.path, "not an erase queue, or corrupt"));
        }
        postcard::from_bytes(&head[QUEUE_MAGIC.len()..]).map_err(|e| io_err(&self.path, e))
    }

    fn write(&self, queue: &[PendingErase]) -> std::io::Result<()> {
        if queue.is_empty() {
            return match std::fs::remove_file(&self.path) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(io_err(&self.path, e)),
                _ => crate::publish::sync_parent(&self.path),
            };
        }
        let mut b = QUEUE_MAGIC.to_vec();
        b.extend(postcard::to_stdvec(queue).map_err(|e| io_err(&self.path, e))?);
        let crc = crc32fast::hash(&b);
        b.extend_from_slice(&crc.to_le_bytes());
        crate::publish::publish(&self.path, &b)
    }

    /// The file a segment is rewritten in, beside the queue.
    pub fn scratch(&self) -> PathBuf {
        self.path.with_file_name(SCRATCH_FILE)
    }

    /// The erases not yet seen by the archive, oldest first.
    pub fn pending(&self) -> std::io::Result<Vec<PendingErase>> {
        let _one = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        self.read()
    }

    /// Record an erase, durably; the same Erase frame twice is kept once.
    pub fn push(&self, erase: PendingErase) -> std::io::Result<()> {
        let _one = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        let mut q = self.read()?;
        if q.iter().any(|e| e.seq == erase.seq) {
            return Ok(());
        }
        q.push(erase);
        q.sort_by_key(|e| e.seq);
        self.write(&q)
    }

    /// Forget the erase of the Erase frame at `seq`: the archive has it.
    pub fn done(&self, seq: u64) -> std::io::Result<()> {
        let _one = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        let mut q = self.read()?;
        let before = q.len();
        q.retain(|e| e.seq != seq);
        if q.len() == before {
            return Ok(());
        }
        self.write(&q)
    }
}

/// Whether a frame is erased by an erase of `repos`: a frame of one of
/// them, or an erased frame whose header still has what was erased (a
/// crash cut its erase), as the log's own erase decides.
fn is_target(header: &FrameHeader, meta: &[u8], repos: &[String]) -> bool {
    if header.kind == Kind::Redacted.as_u16() {
        return header.meta_len > 0;
    }
    Kind::from_u16(header.kind).is_ok_and(Kind::carries_repo_data)
        && Meta::repo_of(meta).is_ok_and(|repo| repos.iter().any(|r| r == repo))
}

/// Erase, in the segment file `path`, the frames before `before` that
/// carry data of `repos`, leaving them as the log's erase leaves them:
/// the meta and blob zeros, and the header that of an erased frame with
/// no meta and the crc of those zeros. Answers the frames erased.
pub fn erase_in_file(path: &Path, before: u64, repos: &[String]) -> Result<u64, Error> {
    let io = |e: std::io::Error| Error::Io(format!("{}: {e}", path.display()));
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .map_err(io)?;
    let len = f.metadata().map_err(io)?.len();
    let zeros = vec![0u8; 1 << 20];
    let mut meta = Vec::new();
    let mut at = SEGMENT_HEADER_LEN as u64;
    let mut erased = 0;
    while at < len {
        let mut hb = [0u8; FRAME_HEADER_LEN];
        f.read_exact_at(&mut hb, at).map_err(io)?;
        let header = FrameHeader::decode(&hb)
            .map_err(|e| Error::Corrupt(format!("frame header at byte {at}: {e:?}")))?;
        if header.seq >= before {
            break;
        }
        meta.resize(header.meta_len as usize, 0);
        f.read_exact_at(&mut meta, at + FRAME_HEADER_LEN as u64)
            .map_err(io)?;
        if is_target(&header, &meta, repos) {
            let body = u64::from(header.meta_len) + header.blob_len;
            let mut done = 0u64;
            while done < body {
                let n = (body - done).min(zeros.len() as u64) as usize;
                f.write_all_at(&zeros[..n], at + FRAME_HEADER_LEN as u64 + done)
                    .map_err(io)?;
                done += n as u64;
            }
            let scrubbed = FrameHeader {
                kind: Kind::Redacted.as_u16(),
                ..header
            }
            .as_read();
            f.write_all_at(&scrubbed.encode(), at).map_err(io)?;
            erased += 1;
        }
        at += header.frame_len();
    }
    Ok(erased)
}

/// What carrying one erase to the archive did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ArchiveErased {
    /// Objects rewritten as a new generation.
    pub rewritten: u64,
    /// Frames erased in them.
    pub frames: u64,
    /// Older versions deleted.
    pub deleted: u64,
    /// Store snapshots taken before the erase, deleted.
    pub snapshots_deleted: u64,
}

/// What an erase of the archive works with.
pub struct EraseReach<'a> {
    pub bucket: &'a Bucket,
    pub codec: &'a Codec,
    pub history: [u8; 16],
    /// The file a segment is rewritten in.
    pub scratch: &'a Path,
}

async fn download(bucket: &Bucket, opened: &Opened, dest: &Path) -> Result<(), Error> {
    let io = |e: std::io::Error| Error::Io(format!("{}: {e}", dest.display()));
    let mut f = std::io::BufWriter::new(std::fs::File::create(dest).map_err(io)?);
    let mut pieces = Pieces::new(bucket, opened, 0);
    while let Some((_, plain)) = pieces.next().await? {
        f.write_all(&plain).map_err(io)?;
    }
    f.flush().map_err(io)
}

/// Carry one erase to the archive: rewrite every archived segment of this
/// log that holds data of its repositories below its `before`, then
/// delete every older version. Objects of another log are left alone.
pub async fn erase_in_archive(
    reach: &EraseReach<'_>,
    erase: &PendingErase,
    pace: &mut Pace,
) -> Result<ArchiveErased, Error> {
    let mut versions: BTreeMap<(u64, u64, u64), Vec<(SegmentName, u64)>> = BTreeMap::new();
    for (name, size) in reach.bucket.segments().await? {
        if name.first < erase.before {
            versions
                .entry((name.first, name.last, name.lineage))
                .or_default()
                .push((name, size));
        }
    }
    let mut done = ArchiveErased::default();
    for (_, mut v) in versions {
        v.sort_by_key(|(n, _)| n.generation);
        let Some(&(newest, size)) = v.last() else {
            continue;
        };
        let key = reach.bucket.segment_key(&newest);
        let opened = open_object(reach.bucket, &key, size, reach.codec.key.as_ref()).await?;
        let info = match &opened.reader.footer().content {
            Content::Segment(info) if info.history == reach.history => info.clone(),
            _ => continue,
        };
        let keep = if info.repos.iter().any(|r| erase.repos.contains(r)) {
            download(reach.bucket, &opened, reach.scratch).await?;
            let frames = erase_in_file(reach.scratch, erase.before, &erase.repos)?;
            let job = SegmentJob {
                path: reach.scratch,
                first: info.first,
                history: reach.history,
                epochs: &info.epochs,
                generation: erase.seq.max(newest.generation + 1),
                marks: info.marks.clone(),
            };
            let sent = upload_segment(reach.bucket, reach.codec, job, pace).await?;
            tracing::info!(
                old = %key, new = %reach.bucket.segment_key(&sent.name), frames,
                "an archived segment rewritten by an erase"
            );
            done.rewritten += 1;
            done.frames += frames;
            sent.name
        } else {
            newest
        };
        for (n, _) in v.iter().filter(|(n, _)| *n != keep) {
            reach.bucket.delete(&reach.bucket.segment_key(n)).await?;
            done.deleted += 1;
        }
    }
    // A store snapshot taken before the erase holds what it erased.
    for (name, size) in reach.bucket.snapshots().await? {
        if name.at >= erase.seq {
            continue;
        }
        let key = reach.bucket.snapshot_key(&name);
        let opened = open_object(reach.bucket, &key, size, reach.codec.key.as_ref()).await?;
        if matches!(&opened.reader.footer().content, Content::Snapshot(i) if i.history == reach.history)
        {
            reach.bucket.delete(&key).await?;
            done.snapshots_deleted += 1;
        }
    }
    let _ = std::fs::remove_file(reach.scratch);
    Ok(done)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::log::Log;

    #[test]
    fn the_queue_keeps_erases_in_order_once_across_reopens() {
        let dir = tempfile::tempdir().unwrap();
        let q = EraseQueue::at(dir.path());
        assert!(q.pending().unwrap().is_empty());
        let e = |seq| PendingErase {
            seq,
            before: seq,
            repos: vec![format!("r{seq}")],
        };
        q.push(e(9)).unwrap();
        q.push(e(4)).unwrap();
        q.push(e(9)).unwrap();
        let again = EraseQueue::at(dir.path());
        assert_eq!(again.pending().unwrap(), vec![e(4), e(9)]);
        again.done(4).unwrap();
        again.done(4).unwrap();
        assert_eq!(q.pending().unwrap(), vec![e(9)]);
        q.done(9).unwrap();
        assert!(!dir.path().join(QUEUE_FILE).exists());
        // A flipped byte is named, never read as an empty queue.
        q.push(e(3)).unwrap();
        let path = dir.path().join(QUEUE_FILE);
        let mut b = std::fs::read(&path).unwrap();
        let mid = b.len() / 2;
        b[mid] ^= 1;
        std::fs::write(&path, b).unwrap();
        assert!(q.pending().is_err());
    }

    /// The file erase leaves a sealed segment byte for byte as the log's
    /// erase leaves it.
    #[test]
    fn erasing_a_file_matches_the_logs_erase() {
        let dir = tempfile::tempdir().unwrap();
        let log = Log::open_with(dir.path().join("log"), 16 << 10).unwrap();
        for i in 0..60u64 {
            let repo = ["a", "b", "c"][(i % 3) as usize];
            // Repeated blobs: the same bytes in frames of every repository.
            let blob = vec![(i % 4) as u8; 100 + (i % 5) as usize * 700];
            log.append(Kind::Pack, &Meta::repo(repo), &blob).unwrap();
        }
        log.append(Kind::RepoStore, &Meta::repo("a"), b"kept")
            .unwrap();
        log.sync().unwrap();
        let layout = log.layout();
        let sealed = &layout[..layout.len() - 1];
        assert!(sealed.len() >= 2, "{layout:?}");
        let seg = |first: u64| dir.path().join("log").join(format!("{first:020}.log"));
        let copy = |first: u64| dir.path().join(format!("copy-{first}"));
        for &(first, _, _) in sealed {
            std::fs::copy(seg(first), copy(first)).unwrap();
        }
        let repos = vec!["a".to_owned(), "c".to_owned()];
        let before = sealed[1].1;
        let local = log.erase(before, &repos).unwrap();
        let mut n = 0;
        for &(first, _, _) in sealed {
            n += erase_in_file(&copy(first), before, &repos).unwrap();
            assert_eq!(
                std::fs::read(seg(first)).unwrap(),
                std::fs::read(copy(first)).unwrap()
            );
            // Again: nothing left to erase, nothing changes.
            assert_eq!(erase_in_file(&copy(first), before, &repos).unwrap(), 0);
        }
        assert_eq!(n, local.frames);
        assert!(n > 0);
    }

    /// A segment caught between an erase's first step (the header marked
    /// erased) and its last never leaves the box: its bytes are still
    /// there.
    #[tokio::test]
    async fn a_segment_mid_erase_is_not_uploaded() {
        let dir = tempfile::tempdir().unwrap();
        let log = Log::open_with(dir.path().join("log"), 16 << 10).unwrap();
        for i in 0..30u64 {
            log.append(Kind::Pack, &Meta::repo("a"), &vec![i as u8; 2000])
                .unwrap();
        }
        log.sync().unwrap();
        let first = log.layout()[0].0;
        let path = crate::log::format::segment_path(log.dir(), first);
        let at = SEGMENT_HEADER_LEN as u64;
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .unwrap();
        let mut hb = [0u8; FRAME_HEADER_LEN];
        f.read_exact_at(&mut hb, at).unwrap();
        let h = FrameHeader::decode(&hb).unwrap();
        let marked = FrameHeader {
            kind: Kind::Redacted.as_u16(),
            ..h
        };
        f.write_all_at(&marked.encode(), at).unwrap();
        let bucket = Bucket::open(&super::super::bucket::Spec {
            url: format!("file://{}", dir.path().join("bucket").display()),
            ..Default::default()
        })
        .unwrap();
        let job = SegmentJob {
            path: &path,
            first,
            history: log.history().0,
            epochs: &[],
            generation: 0,
            marks: vec![],
        };
        let r = upload_segment(&bucket, &Codec::default(), job, &mut Pace::new(0)).await;
        assert!(matches!(r, Err(Error::EraseUnderway)), "{r:?}");
        assert!(bucket.segments().await.unwrap().is_empty());
    }
}
