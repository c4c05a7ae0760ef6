//! Point-in-time restore from the archive alone, for the day both boxes
//! are gone: a fresh box's log is filled with the archived segments of one
//! lineage, in order, up to a frame boundary (`--until SEQ`, or the last
//! frame archived by a wall-clock time), then its store is rebuilt from
//! the log and its epochs set to the lineage's.
//!
//! Every frame is checked three ways: its piece's crc (and seal), its
//! header's crc, and its payload crc when it commits. Killed and run
//! again, a restore keeps what its log holds and goes on after it.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::bucket::Bucket;
use super::codec::ArchiveKey;
use super::fetch::{open_object, Pieces};
use super::head::{read_head, same_life};
use super::held::check_held;
use super::names::{epochs_through, lineage, SegmentName, SnapshotName};
use super::object::{Content, SegmentInfo};
use super::replay::Replay;
use super::walk::FrameWalk;
use super::Error;
use crate::layout::{LOG_DIR, RESTORING_FILE};
use crate::log::{HistoryId, Log, OpenOptions as LogOptions};
use crate::node::epoch::Epochs;
use crate::publish::sync_parent_with;
use crate::repl::epochs::{EpochHistory, EpochStart};
use crate::storage::{write_file, StdStorage, Storage};
use crate::store::install::InstallPaths;
use crate::store::{Store, StoreOptions};

/// Where a restore stops.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Until {
    /// Everything archived.
    End,
    /// Up to and including this frame.
    Seq(u64),
    /// Up to the last frame archived as durable by this wall-clock time
    /// (ms since the Unix epoch).
    Time(u64),
}

pub struct ArchiveRestoreOptions {
    pub data_dir: PathBuf,
    pub segment_bytes: u64,
    pub bucket: Bucket,
    pub key: Option<ArchiveKey>,
    pub until: Until,
    /// Restore what the bucket holds when its head record says it held
    /// more (the report names the frames lost); refused otherwise.
    pub accept_shorter: bool,
}

/// Counters a progress bar shows.
#[derive(Clone, Copy, Debug, Default)]
pub struct ArchiveProgress {
    pub segments_done: u64,
    pub segments: u64,
    pub frames: u64,
    pub bytes: u64,
    pub head: u64,
    pub target: u64,
}

#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct ArchiveRestoreReport {
    pub resumed: bool,
    pub head: u64,
    pub target: u64,
    pub frames: u64,
    pub segments: u64,
    pub bytes: u64,
    pub lineage: String,
    /// The archived store snapshot the restore started from (0: frame 1).
    pub snapshot_at: u64,
    /// Seconds fetching and writing the frames, syncing the last of them,
    /// and rebuilding the store.
    pub write_secs: f64,
    pub sync_secs: f64,
    pub store_secs: f64,
    /// Resumed: the frames the box held, compared with the archive's and
    /// found equal.
    pub verified: u64,
    /// Resumed: the first held frame that was not the archive's, and why;
    /// it and every frame after it were cut and fetched again.
    pub cut_from: Option<u64>,
    pub cut_why: Option<String>,
    /// The archive's head record: how far it says the archive reached
    /// (None: no record, as from builds before it), and when written.
    pub head_last: Option<u64>,
    pub head_unix_ms: Option<u64>,
    /// With `accept_shorter`: why the head record did not read.
    pub head_unread: Option<String>,
    /// With `accept_shorter`: the frames the head names archived and the
    /// bucket no longer holds, that the restore asked for.
    pub lost: Option<(u64, u64)>,
    /// Objects that did not open (not sealed, under another key, altered)
    /// and were passed over for others holding the same frames.
    pub passed_over: Vec<String>,
}

/// One lineage's segments, oldest first, contiguous from frame 1.
struct Chain {
    history: [u8; 16],
    epochs: Vec<EpochStart>,
    segments: Vec<(SegmentName, u64)>,
    /// The lineage's store snapshots, newest first.
    snapshots: Vec<(SnapshotName, u64)>,
    /// When the newest segment's last frame was marked durable.
    newest_mark_ms: Option<u64>,
    /// Objects that did not open and were passed over for others.
    passed_over: Vec<String>,
}

impl Chain {
    /// The furthest frame a restore can reach: the last archived, or a
    /// snapshot taken past it.
    fn head(&self) -> u64 {
        let segments = self.segments.last().map_or(0, |s| s.0.last);
        let snapshot = self.snapshots.first().map_or(0, |s| s.0.at);
        segments.max(snapshot)
    }
}

async fn segment_info(
    bucket: &Bucket,
    name: &SegmentName,
    size: u64,
    key: Option<&ArchiveKey>,
) -> Result<SegmentInfo, Error> {
    let k = bucket.segment_key(name);
    let opened = open_object(bucket, &k, size, key).await?;
    match &opened.reader.footer().content {
        Content::Segment(info) if info.first == name.first && info.last == name.last => {
            Ok(info.clone())
        }
        _ => Err(Error::Corrupt(format!(
            "{k}: its footer names other frames"
        ))),
    }
}

/// Whether `e` is the object's own fault (it does not decode, open or
/// match its name), so another object may stand in for it; a bucket that
/// does not answer is not.
fn object_fault(e: &Error) -> bool {
    matches!(
        e,
        Error::Corrupt(_)
            | Error::KeyNeeded { .. }
            | Error::WrongKey { .. }
            | Error::Unseal { .. }
            | Error::Unsealed { .. }
    )
}

/// The most objects a restore passes over before it gives up: each costs
/// a request or two, and a bucket full of them is refused by name.
const MAX_PASSED_OVER: usize = 1000;

/// The newest lineage in the bucket: the one of the segment reaching
/// furthest (newest generation first) that opens, and its segments from
/// the first, each following the one before. Anyone who can write to the
/// bucket can add objects: one that does not open is passed over for the
/// next (`passed_over`), and one whose frames overlap the chain is not on
/// it, so such objects cannot stop a restore the genuine ones make.
async fn chain(bucket: &Bucket, key: Option<&ArchiveKey>) -> Result<Chain, Error> {
    let mut all = bucket.segments().await?;
    all.sort_by_key(|(n, _)| std::cmp::Reverse((n.last, n.generation)));
    let mut passed_over = Vec::new();
    let mut refused = Vec::new();
    let mut found = None;
    let mut first_fault = None;
    for (n, size) in &all {
        match segment_info(bucket, n, *size, key).await {
            Ok(info) => {
                found = Some(info);
                break;
            }
            Err(e) if object_fault(&e) && passed_over.len() < MAX_PASSED_OVER => {
                tracing::warn!(error = %e, "an archived object does not open: passed over");
                passed_over.push(e.to_string());
                refused.push(*n);
                first_fault.get_or_insert(e);
            }
            Err(e) => return Err(e),
        }
    }
    let info = match (found, first_fault) {
        (Some(info), _) => info,
        (None, Some(e)) => return Err(e),
        (None, None) => {
            return Err(Error::Missing(format!(
                "{}: no archived segment",
                bucket.url()
            )))
        }
    };
    // What did not open is not tried again.
    all.retain(|(n, _)| !refused.contains(n));
    all.sort();
    let segments = path_of(bucket, key, &all, &info, &mut passed_over).await?;
    let mut snapshots: Vec<_> = bucket
        .snapshots()
        .await?
        .into_iter()
        .filter(|(n, _)| n.lineage == lineage(&info.history, &info.epochs, n.at))
        .collect();
    snapshots.sort_by_key(|(n, _)| std::cmp::Reverse(n.at));
    Ok(Chain {
        history: info.history,
        newest_mark_ms: info.marks.last().map(|m| m.unix_ms),
        epochs: info.epochs,
        segments,
        snapshots,
        passed_over,
    })
}

/// The lineage's segments as a chain: from the lowest first frame, each
/// next one starting right after the one before (or, past a gap, the
/// next that starts later). Of several objects starting at one frame, the
/// newest generation that opens; an object that starts inside the chain
/// is not on it.
async fn path_of(
    bucket: &Bucket,
    key: Option<&ArchiveKey>,
    sorted: &[(SegmentName, u64)],
    info: &SegmentInfo,
    passed_over: &mut Vec<String>,
) -> Result<Vec<(SegmentName, u64)>, Error> {
    let ours: Vec<_> = sorted
        .iter()
        .filter(|(n, _)| n.lineage == lineage(&info.history, &info.epochs, n.last))
        .copied()
        .collect();
    let mut path: Vec<(SegmentName, u64)> = Vec::new();
    let mut at = 0;
    while at < ours.len() {
        let first = ours[at].0.first;
        let end = at
            + ours[at..]
                .iter()
                .take_while(|(n, _)| n.first == first)
                .count();
        let starts_inside = path.last().is_some_and(|(p, _)| first <= p.last);
        if !starts_inside {
            let mut group: Vec<_> = ours[at..end].to_vec();
            group.sort_by_key(|(n, _)| std::cmp::Reverse(n.generation));
            path.push(choose(bucket, key, &group, passed_over).await?);
        }
        at = end;
    }
    Ok(path)
}

/// Of objects holding frames from one first frame, newest generation
/// first, the first that opens; one alone is taken as it is (its fetch
/// opens it).
async fn choose(
    bucket: &Bucket,
    key: Option<&ArchiveKey>,
    group: &[(SegmentName, u64)],
    passed_over: &mut Vec<String>,
) -> Result<(SegmentName, u64), Error> {
    if let [one] = group {
        return Ok(*one);
    }
    let mut first_fault = None;
    for (n, size) in group {
        match segment_info(bucket, n, *size, key).await {
            Ok(_) => return Ok((*n, *size)),
            Err(e) if object_fault(&e) && passed_over.len() < MAX_PASSED_OVER => {
                tracing::warn!(error = %e, "an archived object does not open: passed over");
                passed_over.push(e.to_string());
                first_fault.get_or_insert(e);
            }
            Err(e) => return Err(e),
        }
    }
    Err(first_fault.unwrap_or_else(|| Error::Missing("no object to choose from".into())))
}

/// Whether the chain's segments hold every frame `from..=to`; the first
/// frame missing otherwise.
fn gap_in(chain: &Chain, from: u64, to: u64) -> Option<(u64, u64)> {
    let mut expect = from;
    for (n, _) in chain.segments.iter().filter(|(n, _)| n.last >= from) {
        if expect > to {
            break;
        }
        if n.first > expect {
            return Some((expect, n.first));
        }
        expect = expect.max(n.last + 1);
    }
    (expect <= to).then_some((expect, u64::MAX))
}

/// Where a restore to `target` starts: the newest archived snapshot of
/// the lineage at or before it whose following frames are archived, else
/// frame 1.
fn start_of(chain: &Chain, target: u64) -> Result<Option<(SnapshotName, u64)>, Error> {
    if let Some(s) = chain
        .snapshots
        .iter()
        .find(|(n, _)| n.at <= target && gap_in(chain, n.at + 1, target).is_none())
    {
        return Ok(Some(*s));
    }
    match gap_in(chain, 1, target) {
        None => Ok(None),
        Some((expect, u64::MAX)) => Err(Error::Missing(format!(
            "the archive's segments of this lineage end before frame {expect}"
        ))),
        Some((expect, next)) => Err(Error::Missing(format!(
            "the archive's segments of this lineage skip from frame {expect} to {next}: frames {expect}..{} are not archived, and no archived snapshot starts past them",
            next - 1
        ))),
    }
}

/// Fill the fresh box's store from the archived snapshot and restart its
/// log after the snapshot's frame, as a twin installs one; the install's
/// steps finish after a crash as the twin's do.
async fn install_snapshot(
    opts: &ArchiveRestoreOptions,
    log: &Arc<Log>,
    name: &SnapshotName,
    size: u64,
) -> Result<(), Error> {
    let paths = InstallPaths::new(&opts.data_dir);
    let _ = std::fs::remove_dir_all(paths.staging());
    let key = opts.bucket.snapshot_key(name);
    // The base is staged once the files are whole: before, the staging
    // directory names nothing an install would take.
    let files = paths.files();
    std::fs::create_dir_all(&files).map_err(|e| Error::Io(format!("{}: {e}", files.display())))?;
    let info =
        super::snapshot::download_snapshot(&opts.bucket, &key, size, opts.key.as_ref(), &files)
            .await?;
    if info.at != name.at {
        return Err(Error::Corrupt(format!("{key}: a snapshot at {}", info.at)));
    }
    let base = crate::store::install::SnapshotBase {
        at: info.at,
        crc_at: info.crc_at,
        history: info.history,
    };
    let l = log.clone();
    tokio::task::spawn_blocking(move || {
        crate::store::install::stage_base(&paths, &base)?;
        crate::store::install::install(&paths, &l, None)
    })
    .await
    .map_err(|e| Error::Io(format!("the install's task failed: {e}")))?
    .map_err(|e| Error::Io(format!("installing the snapshot: {e}")))?;
    Ok(())
}

/// The last frame archived as durable by `unix_ms`, from the segments'
/// time marks, newest segment first.
async fn seq_at_time(
    bucket: &Bucket,
    chain: &Chain,
    key: Option<&ArchiveKey>,
    unix_ms: u64,
) -> Result<u64, Error> {
    for (n, size) in chain.segments.iter().rev() {
        let info = segment_info(bucket, n, *size, key).await?;
        if let Some(m) = info.marks.iter().rev().find(|m| m.unix_ms <= unix_ms) {
            return Ok(m.seq);
        }
        if info.marks.first().is_some_and(|m| m.unix_ms > unix_ms) && n.first > 1 {
            // Every frame of this segment was marked after the time: look
            // at the segment before, whose last frame came before them.
            continue;
        }
    }
    Err(Error::NothingByTime { unix_ms })
}

fn open_fresh_log(
    opts: &ArchiveRestoreOptions,
    fs: &Arc<dyn Storage>,
) -> Result<(Log, bool), Error> {
    let data = &opts.data_dir;
    let marker = data.join(RESTORING_FILE);
    let resumed = fs.exists(&marker).unwrap_or(false);
    let log = Log::open_opts(
        data.join(LOG_DIR),
        LogOptions {
            segment_bytes: opts.segment_bytes,
            storage: Some(fs.clone()),
            ..LogOptions::default()
        },
    )?;
    if !resumed {
        log.reset(0).map_err(|e| match e {
            crate::log::Error::NotFresh { frames, .. } => {
                Error::NotFresh(format!("its log holds {frames} frames"))
            }
            other => Error::Log(other),
        })?;
        let store = InstallPaths::new(data).store();
        if fs.list(&store).is_ok_and(|d| !d.is_empty()) {
            return Err(Error::NotFresh("its store holds data".into()));
        }
        let from = format!("--from-archive {}", opts.bucket.url());
        write_file(&**fs, &marker, &crate::layout::restoring_marker(&from))
            .map_err(|e| Error::Io(format!("{}: {e}", marker.display())))?;
        sync_parent_with(&**fs, &marker).map_err(|e| Error::Io(e.to_string()))?;
    }
    log.set_follower(true);
    Ok((log, resumed))
}

/// Bytes written between two syncs asked of the background syncer: the
/// device writes them back while the next ones are fetched, and the last
/// sync has little left to do.
const SYNC_EVERY: u64 = 64 << 20;
/// Pieces in flight between the fetches and the writer (4 MiB each).
pub(super) const PIECES_QUEUED: usize = 6;

async fn sync(log: &Arc<Log>) -> Result<(), Error> {
    let l = log.clone();
    tokio::task::spawn_blocking(move || l.sync())
        .await
        .map_err(|e| Error::Io(format!("the sync's task failed: {e}")))??;
    Ok(())
}

/// What the fetches hand the writer, in order.
pub(super) enum Feed {
    /// The next segment's pieces follow.
    Segment(SegmentName, String),
    Piece(Vec<u8>),
    /// The segment's pieces are all sent.
    End,
}

/// What the writer did.
#[derive(Default)]
struct Written {
    frames: u64,
    bytes: u64,
    segments: u64,
}

/// The one writer of a restore, on a blocking thread: each segment's
/// frames checked (`FrameWalk`) and written at their sequences up to
/// `target`, unsynced; a sync asked of `syncer` every `SYNC_EVERY` bytes,
/// which runs beside the writes. Stops at `target` (dropping `rx` stops
/// the fetches).
fn write_all(
    log: Arc<Log>,
    history: [u8; 16],
    target: u64,
    mut rx: tokio::sync::mpsc::Receiver<Feed>,
    syncer: std::sync::mpsc::SyncSender<()>,
    progress: &dyn Fn(&Written),
) -> Result<Written, Error> {
    let mut done = Written::default();
    let mut since_sync = 0u64;
    let mut current: Option<(SegmentName, String, FrameWalk, Replay<'_>)> = None;
    while let Some(feed) = rx.blocking_recv() {
        match feed {
            Feed::Segment(name, key) => {
                current = Some((
                    name,
                    key,
                    FrameWalk::new(name.first, history),
                    Replay::new(&log, target),
                ));
            }
            Feed::Piece(plain) => {
                let Some((_, key, walk, replay)) = current.as_mut() else {
                    return Err(Error::Io("a piece before its segment".into()));
                };
                walk.feed(&plain).map_err(|e| e.in_object(key))?;
                replay.feed(&plain).map_err(|e| e.in_object(key))?;
                done.bytes += plain.len() as u64;
                since_sync += plain.len() as u64;
                if since_sync >= SYNC_EVERY {
                    since_sync = 0;
                    // Full: a sync is pending already, which covers these.
                    let _ = syncer.try_send(());
                }
                if replay.reached_until() {
                    done.frames += replay.written();
                    done.segments += 1;
                    progress(&done);
                    return Ok(done);
                }
                // Frames as they land, not only at each segment's end.
                progress(&Written {
                    frames: done.frames + replay.written(),
                    ..done
                });
            }
            Feed::End => {
                let Some((name, key, walk, replay)) = current.take() else {
                    return Err(Error::Io("a segment's end before its start".into()));
                };
                replay.finish().map_err(|e| e.in_object(&key))?;
                let last = walk.finish().map_err(|e| e.in_object(&key))?;
                if last != name.last {
                    return Err(Error::Corrupt(format!(
                        "{key}: ends at frame {last}, not {}",
                        name.last
                    )));
                }
                done.frames += replay.written();
                done.segments += 1;
                progress(&done);
                if name.last >= target {
                    return Ok(done);
                }
            }
        }
    }
    Ok(done)
}

/// Fetch the segments in order into `tx`, the next one's first pieces on
/// their way while the writer takes the last of this one's.
pub(super) async fn fetch_all(
    bucket: &Bucket,
    key: Option<&ArchiveKey>,
    wanted: &[(SegmentName, u64)],
    tx: tokio::sync::mpsc::Sender<Feed>,
) -> Result<(), Error> {
    for (name, size) in wanted {
        let k = bucket.segment_key(name);
        let opened = open_object(bucket, &k, *size, key).await?;
        if tx.send(Feed::Segment(*name, k.clone())).await.is_err() {
            return Ok(());
        }
        let mut pieces = Pieces::new(bucket, &opened, 0);
        while let Some((_, plain)) = pieces.next().await? {
            if tx.send(Feed::Piece(plain)).await.is_err() {
                // The writer stopped: at the target, or on an error it
                // reports.
                return Ok(());
            }
        }
        if tx.send(Feed::End).await.is_err() {
            return Ok(());
        }
    }
    Ok(())
}

/// A drill's negative control only (feature `drill-sabotage`, and
/// `TWINLOG_DRILL_SABOTAGE=ignore-head` in the environment): a restore
/// ignores the archive's head record, as builds before it did, so a
/// bucket that lost its newest objects restores shorter, silently.
#[cfg(feature = "drill-sabotage")]
fn head_ignored() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| {
        let on = std::env::var("TWINLOG_DRILL_SABOTAGE").is_ok_and(|v| v == "ignore-head");
        if on {
            tracing::error!("drill sabotage: the restore ignores the archive's head record");
        }
        on
    })
}

/// Restore the box in `opts.data_dir` from the archive.
pub async fn restore_from_archive(
    opts: ArchiveRestoreOptions,
    progress: Arc<dyn Fn(&ArchiveProgress) + Send + Sync>,
) -> Result<ArchiveRestoreReport, Error> {
    let key = opts.key.as_ref();
    let chain = chain(&opts.bucket, key).await?;
    let archived_head = chain.head();
    // A bucket that lost its newest objects looks complete: its head
    // record says how far it reached.
    let (head, head_unread) = match read_head(&opts.bucket, key, &chain.history).await {
        Ok(h) => (h.filter(|h| same_life(h, &chain.epochs)), None),
        // Altered or foreign: how far the archive reached is not known.
        Err(e) if opts.accept_shorter => (None, Some(e.to_string())),
        Err(e) => return Err(e),
    };
    #[cfg(feature = "drill-sabotage")]
    let head = head.filter(|_| !head_ignored());
    let lost = head
        .as_ref()
        .and_then(|h| super::head::lost(h, archived_head, chain.newest_mark_ms, opts.until));
    if let (Some(h), Some((from, to))) = (&head, lost) {
        if !opts.accept_shorter {
            return Err(Error::Shorter {
                head_last: h.last,
                generation: h.generation,
                reached: archived_head,
                from,
                to,
            });
        }
    }
    let target = match opts.until {
        Until::End => archived_head,
        Until::Seq(s) if s > archived_head && lost.is_some() => archived_head,
        Until::Seq(s) if s > archived_head => {
            return Err(Error::Missing(format!(
                "--until {s}: the archive reaches frame {}",
                head.as_ref()
                    .map_or(archived_head, |h| h.last.max(archived_head))
            )))
        }
        Until::Seq(s) => s,
        Until::Time(t) => seq_at_time(&opts.bucket, &chain, key, t).await?,
    };
    if target == 0 {
        return Err(Error::Missing("nothing to restore before frame 1".into()));
    }
    let fs: Arc<dyn Storage> = StdStorage::shared();
    let (log, resumed) = open_fresh_log(&opts, &fs)?;
    let history = HistoryId(chain.history);
    if log.history() != history {
        if log.first_seq() <= log.head_seq() {
            return Err(Error::NotFresh(format!(
                "its log is of history {}, the archive's {history}",
                log.history()
            )));
        }
        log.adopt_history(history)?;
    }
    if log.head_seq() > target {
        return Err(Error::NotFresh(format!(
            "its log holds up to frame {}, past --until {target}",
            log.head_seq()
        )));
    }
    let paths = InstallPaths::new(&opts.data_dir);
    // An install a crash cut after its intent is finished first.
    crate::store::install::finish(&paths, &log)
        .map_err(|e| Error::Io(format!("finishing the snapshot's install: {e}")))?;
    let log = Arc::new(log);
    let mut report = ArchiveRestoreReport {
        resumed,
        target,
        head_last: head.as_ref().map(|h| h.last),
        head_unread,
        head_unix_ms: head.as_ref().map(|h| h.unix_ms),
        lost,
        lineage: format!("{:016x}", lineage(&chain.history, &chain.epochs, target)),
        passed_over: chain.passed_over.clone(),
        ..ArchiveRestoreReport::default()
    };
    if log.head_seq() >= log.first_seq() {
        // Nothing an earlier run left is believed: compared first.
        let (from, to) = (log.first_seq(), log.head_seq());
        if let Some((expect, _)) = gap_in(&chain, from, to) {
            return Err(Error::Missing(format!(
                "this box holds frames {from} to {to}; the archive's segments of this lineage skip frame {expect}"
            )));
        }
        let covering: Vec<_> = chain
            .segments
            .iter()
            .filter(|(n, _)| n.last >= from && n.first <= to)
            .copied()
            .collect();
        let held = check_held(&opts.bucket, key, chain.history, log.clone(), &covering).await?;
        report.verified = held.checked;
        if let Some(d) = held.differs {
            cut_from(&opts.data_dir, &fs, &log, d.seq)?;
            report.cut_from = Some(d.seq);
            report.cut_why = Some(d.what);
        }
    }
    let mut snapshot_at = 0;
    if log.head_seq() == 0 {
        if let Some((name, size)) = start_of(&chain, target)? {
            install_snapshot(&opts, &log, &name, size).await?;
            snapshot_at = name.at;
        }
    } else if let Some((expect, _)) = gap_in(&chain, log.head_seq() + 1, target) {
        return Err(Error::Missing(format!(
            "the archive's segments of this lineage skip frame {expect}"
        )));
    }
    report.snapshot_at = snapshot_at;
    let wanted: Vec<_> = chain
        .segments
        .iter()
        .filter(|(n, _)| n.first <= target && n.last > log.head_seq())
        .collect();
    let prog = ArchiveProgress {
        segments: wanted.len() as u64,
        head: log.head_seq(),
        target,
        ..ArchiveProgress::default()
    };
    progress(&prog);
    let wanted: Vec<(SegmentName, u64)> = wanted.into_iter().copied().collect();
    let started = crate::clock::monotonic();
    let (tx, rx) = tokio::sync::mpsc::channel(PIECES_QUEUED);
    let (sync_tx, sync_rx) = std::sync::mpsc::sync_channel::<()>(1);
    let l = log.clone();
    let syncer = std::thread::Builder::new()
        .name("twinlog-restore-sync".into())
        .spawn(move || -> Result<(), Error> {
            while sync_rx.recv().is_ok() {
                l.sync()?;
            }
            Ok(())
        })
        .map_err(|e| Error::Io(format!("the restore's syncer: {e}")))?;
    let (l, history, shown) = (log.clone(), chain.history, progress.clone());
    let base = prog;
    let writer = tokio::task::spawn_blocking(move || {
        write_all(l, history, target, rx, sync_tx, &|w: &Written| {
            let mut p = base;
            p.segments_done = w.segments;
            p.frames = w.frames;
            p.bytes = w.bytes;
            // Written, not yet synced: the log's head moves with the syncs.
            p.head = base.head + w.frames;
            shown(&p);
        })
    });
    let fetched = fetch_all(&opts.bucket, key, &wanted, tx).await;
    let written = writer
        .await
        .map_err(|e| Error::Io(format!("the restore's writer failed: {e}")))?;
    let synced = syncer
        .join()
        .map_err(|_| Error::Io("the restore's syncer panicked".into()))?;
    let written = written?;
    fetched?;
    synced?;
    report.frames = written.frames;
    report.segments = written.segments;
    report.bytes = written.bytes;
    report.write_secs = started.elapsed().as_secs_f64();
    let t = crate::clock::monotonic();
    sync(&log).await?;
    report.sync_secs = t.elapsed().as_secs_f64();
    if log.head_seq() != target {
        return Err(Error::Missing(format!(
            "the archive's segments ended at frame {}, before {target}",
            log.head_seq()
        )));
    }
    let t = crate::clock::monotonic();
    finish(&opts.data_dir, &fs, log, &chain.epochs, target).await?;
    report.store_secs = t.elapsed().as_secs_f64();
    report.head = target;
    Ok(report)
}

/// Cut the held frames from `seq` on: they are not the archive's. A store
/// that applied one of them goes too (the restore rebuilds it from the
/// log), first, so that a crash between leaves no store ahead of its log;
/// one installed from a snapshot cannot be rebuilt, and is refused.
fn cut_from(data: &Path, fs: &Arc<dyn Storage>, log: &Log, seq: u64) -> Result<(), Error> {
    let store = InstallPaths::new(data).store();
    if fs.list(&store).is_ok_and(|d| !d.is_empty()) {
        // Unreadable: as if it applied everything.
        let applied = Store::applied_mark_with(&**fs, &store, log.history()).unwrap_or(u64::MAX);
        if applied >= seq {
            if log.first_seq() > 1 {
                return Err(Error::NotFresh(format!(
                    "frame {seq} it holds is not the archive's, and its store, installed from a snapshot, applied it: abandon the restore (`primary restore --abandon`) and run it again"
                )));
            }
            fs.remove_dir_all(&store)
                .map_err(|e| Error::Io(format!("{}: {e}", store.display())))?;
        }
    }
    log.truncate_after(seq - 1)?;
    Ok(())
}

/// The store rebuilt from the log, the epochs of the lineage, the marker
/// gone: the box is whole.
async fn finish(
    data: &Path,
    fs: &Arc<dyn Storage>,
    log: Arc<Log>,
    epochs: &[EpochStart],
    target: u64,
) -> Result<(), Error> {
    let (l2, store_dir) = (log.clone(), InstallPaths::new(data).store());
    tokio::task::spawn_blocking(move || -> Result<(), Error> {
        let mut store = Store::open(&store_dir, l2.history(), StoreOptions::default())
            .map_err(|e| Error::Io(format!("store: {e}")))?;
        store
            .catch_up(&l2)
            .map_err(|e| Error::Io(format!("store: {e}")))?;
        Ok(())
    })
    .await
    .map_err(|e| Error::Io(format!("the store's task failed: {e}")))??;
    let history = EpochHistory::try_from(epochs_through(epochs, target))
        .map_err(|e| Error::Corrupt(format!("the archive's epochs: {e}")))?;
    let ep = Epochs::load_with(fs.clone(), data, log.head_seq())
        .map_err(|e| Error::Io(format!("epochs: {e}")))?;
    ep.update(|s| {
        s.follow(history);
        Ok(())
    })
    .map_err(|e| Error::Io(format!("epochs: {e}")))?;
    log.set_follower(false);
    let marker = data.join(RESTORING_FILE);
    fs.remove(&marker)
        .map_err(|e| Error::Io(format!("{}: {e}", marker.display())))?;
    sync_parent_with(&**fs, &marker).map_err(|e| Error::Io(e.to_string()))?;
    Ok(())
}
