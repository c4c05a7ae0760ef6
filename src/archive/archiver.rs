//! The box that archives: a thread of its own (its own small runtime, off
//! the daemon's network thread and its writer) that uploads every sealed
//! segment of the log, oldest first, and tells retention how far the
//! archive reaches: a segment is dropped locally only once it is archived,
//! and only after a HEAD made for that drop found its object as recorded
//! (`seen`). Both boxes list the bucket every `WATCH_EVERY`: an object
//! gone is uploaded again while the uploader holds its segment, and while
//! one is missing retention holds.
//!
//! A failed upload is retried, the same segment first, with a backoff
//! from one second to a minute; `status` shows the last error meanwhile.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use super::bucket::{Bucket, Stored};
use super::codec::Codec;
use super::erase::{erase_in_archive, EraseQueue, EraseReach};
use super::names::{lineage, EraseMark, SegmentName};
use super::object::TimeMark;
use super::seen::{confirm_before, covered, is_covered, Known, Seen};
use super::upload::{upload_segment, Pace, SegmentJob};
use super::Error;
use crate::log::{format, Log};
use crate::repl::epochs::EpochStart;

/// How often the archiver looks for newly sealed segments.
pub const PASS_EVERY: Duration = Duration::from_secs(1);
/// How often each box lists the bucket, to find what it lost.
pub const WATCH_EVERY: Duration = Duration::from_secs(5);
/// How long a retention pass waits for the HEADs before a drop; past it
/// nothing is dropped this pass.
const CONFIRM_WAIT: Duration = Duration::from_secs(30);
const BACKOFF_FIRST: Duration = Duration::from_secs(1);
const BACKOFF_MAX: Duration = Duration::from_secs(60);
/// How often the uploading box marks its head with the time: what
/// `--until-time` is precise to.
const MARK_EVERY: Duration = Duration::from_millis(100);
/// Time marks kept for segments not yet archived (16 bytes each): 2.4
/// hours at one a `MARK_EVERY`; past it, every other one is dropped, so a
/// long outage of the bucket costs precision, never the marks of a span.
const MARKS_KEPT: usize = 86_400;

/// What the archiver is told.
#[derive(Clone, Debug)]
pub struct ArchiveSettings {
    pub bucket: Bucket,
    pub codec: Codec,
    /// Upload pace in bytes a second; 0 unpaced.
    pub bytes_per_s: u64,
}

/// What `status`, `/status` and the metrics show of the archive.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArchiveStatus {
    pub url: String,
    /// Whether this box uploads (the other box may be the one that does).
    pub uploading: bool,
    /// Every frame below this is archived (0: not yet known).
    pub floor: u64,
    /// Sealed segments, and their bytes, not yet archived.
    pub lag_segments: u64,
    pub lag_bytes: u64,
    /// Age of the oldest sealed segment not yet archived.
    pub lag_secs: u64,
    /// Segments and bytes (as stored) uploaded since start.
    pub uploaded_segments: u64,
    pub uploaded_bytes: u64,
    pub last_upload: Option<String>,
    pub last_upload_unix_ms: u64,
    pub last_error: Option<String>,
    /// Erases applied here that the archive has yet to see.
    pub erases_pending: u64,
    /// Archived segments rewritten by erases since start.
    pub erase_rewrites: u64,
    /// Store snapshots archived since start, and the frame of the last.
    pub snapshots_uploaded: u64,
    pub last_snapshot_at: u64,
    /// Archived objects this box recorded that the bucket no longer holds
    /// as recorded, their frames in no other object: while there is one,
    /// retention drops nothing (`retention_held`).
    #[serde(default)]
    pub missing_objects: u64,
    #[serde(default)]
    pub retention_held: bool,
    /// The first of them, by key.
    #[serde(default)]
    pub missing_first: Option<String>,
    /// Objects found missing since start.
    #[serde(default)]
    pub missing_found: u64,
    /// HEAD requests made before drops, and the segments they let go.
    #[serde(default)]
    pub drop_heads: u64,
    /// Ranged GETs made before drops to open objects this box did not
    /// upload (with a key): two per object, once.
    pub drop_reads: u64,
    #[serde(default)]
    pub drop_confirmed_segments: u64,
    /// The head record as this box last wrote or read it: how far the
    /// archive reached, and its generation (0: none yet).
    #[serde(default)]
    pub head_last: u64,
    #[serde(default)]
    pub head_generation: u64,
    /// Frames the head record names archived that no object holds.
    #[serde(default)]
    pub head_gap: Option<(u64, u64)>,
    /// The bucket's head record is not what this box recorded (rolled
    /// back, gone, unreadable).
    #[serde(default)]
    pub head_note: Option<String>,
}

/// What the uploader needs to archive store snapshots.
pub struct StoreSnapshots {
    pub host: Arc<crate::node::store_host::StoreHost>,
    /// Bytes of segments archived between two snapshots (0: none).
    pub every_bytes: u64,
    /// The box's `SNAPSHOT_BASE`: the crc of the frame its log restarted
    /// after, when it did.
    pub base_file: std::path::PathBuf,
    /// Where a snapshot is taken before it is uploaded.
    pub scratch: std::path::PathBuf,
}

/// A retention pass asking which segments below `before` may go.
struct Confirm {
    before: u64,
    reply: std::sync::mpsc::SyncSender<u64>,
}

/// A drill's negative control only (feature `drill-sabotage`, and
/// `TWINLOG_DRILL_SABOTAGE=archive-floor-off` in the environment):
/// retention ignores the archive (its floor and the HEADs before a drop),
/// so segments leave the box before the bucket holds them, and a restore
/// from the archive finds a hole.
#[cfg(feature = "drill-sabotage")]
fn floor_ignored() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| {
        let on = std::env::var("TWINLOG_DRILL_SABOTAGE").is_ok_and(|v| v == "archive-floor-off");
        if on {
            tracing::error!("drill sabotage: retention ignores the archive's floor");
        }
        on
    })
}

/// Where the epochs that wrote the log come from.
pub type EpochsOf = Arc<dyn Fn() -> Vec<EpochStart> + Send + Sync>;

pub struct Archiver {
    pub(super) log: Arc<Log>,
    /// False on the box that only watches what the other uploads.
    uploading: bool,
    pub(super) settings: ArchiveSettings,
    pub(super) epochs: EpochsOf,
    floor: AtomicU64,
    status: Mutex<ArchiveStatus>,
    marks: Mutex<VecDeque<TimeMark>>,
    /// The listing and footers the box's tiered reads share.
    tiered: Arc<super::tiered::TieredCache>,
    /// The erases this box applied that the archive has yet to see.
    erases: std::sync::OnceLock<Arc<EraseQueue>>,
    pub(super) snapshots: std::sync::OnceLock<StoreSnapshots>,
    /// Bytes of segments archived since the newest archived snapshot, and
    /// that snapshot's frame (`u64::MAX`: not yet listed).
    pub(super) since_snapshot: AtomicU64,
    pub(super) last_snapshot_at: AtomicU64,
    /// The objects this box recorded, and those it found gone.
    pub(super) seen: Mutex<Seen>,
    /// Objects are missing: retention drops nothing.
    held: std::sync::atomic::AtomicBool,
    /// The head record this box last wrote or read, and whether the
    /// bucket's must be written again.
    pub(super) head: Mutex<Option<super::object::HeadInfo>>,
    pub(super) head_dirty: std::sync::atomic::AtomicBool,
    /// Where this box keeps its record of the head (none in tests that
    /// run an archiver without a data directory).
    pub(super) head_memory: std::sync::OnceLock<super::head::HeadMemory>,
    /// Where retention's confirmations go, once the thread runs.
    confirms: Mutex<Option<tokio::sync::mpsc::UnboundedSender<Confirm>>>,
}

fn now_ms() -> u64 {
    crate::clock::unix_ms()
}

impl Archiver {
    /// The archiver of the box that uploads.
    pub fn new(log: Arc<Log>, settings: ArchiveSettings, epochs: EpochsOf) -> Arc<Archiver> {
        Self::build(log, settings, epochs, true)
    }

    /// The archiver of the box that does not upload: it lists the bucket
    /// every few seconds and holds its own retention to what it finds.
    pub fn watcher(log: Arc<Log>, settings: ArchiveSettings, epochs: EpochsOf) -> Arc<Archiver> {
        Self::build(log, settings, epochs, false)
    }

    fn build(
        log: Arc<Log>,
        settings: ArchiveSettings,
        epochs: EpochsOf,
        uploading: bool,
    ) -> Arc<Archiver> {
        let url = settings.bucket.url().to_owned();
        Arc::new(Archiver {
            log,
            uploading,
            settings,
            epochs,
            floor: AtomicU64::new(0),
            status: Mutex::new(ArchiveStatus {
                url,
                uploading,
                ..ArchiveStatus::default()
            }),
            marks: Mutex::new(VecDeque::new()),
            tiered: Arc::default(),
            erases: std::sync::OnceLock::new(),
            snapshots: std::sync::OnceLock::new(),
            since_snapshot: AtomicU64::new(0),
            last_snapshot_at: AtomicU64::new(u64::MAX),
            seen: Mutex::default(),
            held: std::sync::atomic::AtomicBool::new(false),
            head: Mutex::default(),
            head_dirty: std::sync::atomic::AtomicBool::new(false),
            head_memory: std::sync::OnceLock::new(),
            confirms: Mutex::default(),
        })
    }

    /// Archive a snapshot of `s.host`'s store each time `s.every_bytes`
    /// of segments were archived (the uploader).
    pub fn archive_snapshots(&self, s: StoreSnapshots) {
        let _ = self.snapshots.set(s);
    }

    /// Carry the erases recorded in `queue` to the archive (the uploader),
    /// or forget those the archive says it has (the watcher).
    pub fn carry_erases(&self, queue: Arc<EraseQueue>) {
        let _ = self.erases.set(queue);
    }

    /// What a reader of frames below the local floor needs.
    pub fn tiered_source(&self) -> super::tiered::TieredSource {
        super::tiered::TieredSource {
            bucket: self.settings.bucket.clone(),
            key: self.settings.codec.key.clone(),
            history: self.log.history().0,
            epochs: (self.epochs)(),
            cache: Some(self.tiered.clone()),
        }
    }

    /// The lowest sequence retention must keep for the archive: every
    /// frame below it is archived. 0 until the first pass has listed the
    /// bucket, and while an archived object is missing: nothing may go.
    pub fn keep_from(&self) -> u64 {
        #[cfg(feature = "drill-sabotage")]
        if floor_ignored() {
            return u64::MAX;
        }
        if self.held.load(Ordering::SeqCst) {
            return 0;
        }
        self.floor.load(Ordering::SeqCst)
    }

    /// Which segments below `before` may leave the box now, asked by a
    /// retention pass (a blocking thread) right before it drops: those
    /// whose objects a HEAD made for this call finds as recorded at upload
    /// or listing (one request per object). Segments whose frames are all
    /// below the answer may go; the log's first sequence means none.
    pub fn confirm_drop(&self, before: u64) -> u64 {
        #[cfg(feature = "drill-sabotage")]
        if floor_ignored() {
            return before;
        }
        let first = self.log.first_seq();
        if before <= first {
            return before;
        }
        let tx = self.confirms.lock().ok().and_then(|c| c.clone());
        let Some(tx) = tx else {
            return first;
        };
        let (reply, answer) = std::sync::mpsc::sync_channel(1);
        if tx.send(Confirm { before, reply }).is_err() {
            return first;
        }
        answer.recv_timeout(CONFIRM_WAIT).unwrap_or(first)
    }

    /// Answer retention's confirmations, beside the uploads.
    async fn serve_confirms(&self, mut rx: tokio::sync::mpsc::UnboundedReceiver<Confirm>) {
        while let Some(c) = rx.recv().await {
            let layout = self.log.layout();
            let sealed = &layout[..layout.len().saturating_sub(1)];
            let (history, epochs) = (self.log.history().0, (self.epochs)());
            let ours = |n: &SegmentName| n.lineage == lineage(&history, &epochs, n.last);
            let before = c.before.min(self.keep_from());
            let bucket = &self.settings.bucket;
            let key = self.settings.codec.key.as_ref();
            let done = confirm_before(bucket, key, &self.seen, sealed, before, ours).await;
            self.update_floor(&history, &epochs);
            self.set_status(|s| {
                s.drop_heads += done.heads;
                s.drop_reads += done.reads;
                s.drop_confirmed_segments += done.segments;
            });
            let _ = c.reply.send(done.before);
        }
    }

    pub fn status(&self) -> ArchiveStatus {
        self.status.lock().map(|s| s.clone()).unwrap_or_default()
    }

    pub(super) fn set_status(&self, f: impl FnOnce(&mut ArchiveStatus)) {
        if let Ok(mut s) = self.status.lock() {
            f(&mut s);
        }
    }

    /// Start the archiver's thread; it stops when `stop` turns true.
    pub fn spawn(
        self: &Arc<Self>,
        mut stop: watch::Receiver<bool>,
    ) -> std::io::Result<std::thread::JoinHandle<()>> {
        let me = Arc::clone(self);
        std::thread::Builder::new()
            .name("twinlog-archive".into())
            .spawn(move || {
                let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
                if let Ok(mut c) = me.confirms.lock() {
                    *c = Some(tx);
                }
                let rt = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(rt) => rt,
                    Err(e) => {
                        me.set_status(|s| s.last_error = Some(format!("runtime: {e}")));
                        return;
                    }
                };
                rt.block_on(async move {
                    tokio::select! {
                        _ = me.run() => {}
                        _ = me.mark_periodically() => {}
                        _ = me.serve_confirms(rx) => {}
                        _ = stop.wait_for(|s| *s) => {}
                    }
                });
            })
    }

    async fn run(&self) {
        let mut backoff = BACKOFF_FIRST;
        let mut listed_at: Option<Instant> = None;
        let mut pace = Pace::new(self.settings.bytes_per_s);
        loop {
            match self.step(&mut listed_at, &mut pace).await {
                Ok(()) => {
                    backoff = BACKOFF_FIRST;
                    self.set_status(|s| s.last_error = None);
                    let pause = if self.uploading {
                        PASS_EVERY
                    } else {
                        WATCH_EVERY
                    };
                    tokio::time::sleep(pause).await;
                }
                Err(e) => {
                    tracing::warn!(error = %e, retry_in_ms = backoff.as_millis() as u64, "archive upload failed");
                    self.set_status(|s| s.last_error = Some(e.to_string()));
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(BACKOFF_MAX);
                }
            }
        }
    }

    /// One step: the bucket listed when due (at start, then every
    /// `WATCH_EVERY`), then on the uploader a pass, the erases and a
    /// snapshot when due.
    async fn step(&self, listed_at: &mut Option<Instant>, pace: &mut Pace) -> Result<(), Error> {
        let first = listed_at.is_none();
        if !self.uploading || listed_at.is_none_or(|t| t.elapsed() >= WATCH_EVERY) {
            self.audit().await?;
            *listed_at = Some(crate::clock::monotonic());
        }
        if first || !self.uploading {
            return self.erases(None).await;
        }
        self.pass(pace).await?;
        self.advance_head().await?;
        self.erases(Some(pace)).await?;
        self.snapshot_if_due(pace).await
    }

    /// List the bucket: what this box recorded and the bucket lacks is
    /// missing (the uploader archives it again while it holds the
    /// segment), what others uploaded is recorded.
    async fn audit(&self) -> Result<(), Error> {
        // The head first: one written after this listing names only
        // objects the listing holds.
        self.check_head().await;
        let listed = self.settings.bucket.segments_stored().await?;
        let (history, epochs) = (self.log.history().0, (self.epochs)());
        let ours = |n: &SegmentName| n.lineage == lineage(&history, &epochs, n.last);
        if let Ok(mut s) = self.seen.lock() {
            s.audit(listed, ours, !self.uploading);
        }
        self.update_floor(&history, &epochs);
        Ok(())
    }

    /// A time mark every `MARK_EVERY` while uploading, uploads in flight
    /// or not: what `--until-time` restores by.
    async fn mark_periodically(&self) {
        if !self.uploading {
            return std::future::pending().await;
        }
        let mut tick = tokio::time::interval(MARK_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            self.mark();
        }
    }

    fn mark(&self) {
        let m = TimeMark {
            seq: self.log.head_seq(),
            unix_ms: now_ms(),
        };
        if let Ok(mut marks) = self.marks.lock() {
            if marks.back().is_none_or(|b| b.seq != m.seq) {
                marks.push_back(m);
            }
            if marks.len() > MARKS_KEPT {
                thin(&mut marks);
            }
        }
    }

    /// The marks of frames `first..=last`; they stay until the segment
    /// is archived (a failed upload takes them again).
    fn marks_for(&self, first: u64, last: u64) -> Vec<TimeMark> {
        let Ok(marks) = self.marks.lock() else {
            return Vec::new();
        };
        marks
            .iter()
            .copied()
            .filter(|m| (first..=last).contains(&m.seq))
            .collect()
    }

    fn forget_marks_through(&self, last: u64) {
        if let Ok(mut marks) = self.marks.lock() {
            while marks.front().is_some_and(|m| m.seq <= last) {
                marks.pop_front();
            }
        }
    }

    /// One pass: upload every sealed segment the bucket lacks, oldest
    /// first, and move the floor past each.
    async fn pass(&self, pace: &mut Pace) -> Result<(), Error> {
        let history = self.log.history().0;
        let layout = self.log.layout();
        let sealed = &layout[..layout.len().saturating_sub(1)];
        let epochs = (self.epochs)();
        let mut result = Ok(());
        let runs = covered(&self.known(), &history, &epochs);
        for &(first, last, _) in sealed {
            if last < first || is_covered(&runs, first, last) {
                continue;
            }
            let path = format::segment_path(self.log.dir(), first);
            let job = SegmentJob {
                path: &path,
                first,
                history,
                epochs: &epochs,
                generation: 0,
                marks: self.marks_for(first, last),
            };
            match upload_segment(&self.settings.bucket, &self.settings.codec, job, pace).await {
                Ok(sent) => {
                    let key = self.settings.bucket.segment_key(&sent.name);
                    tracing::info!(first, last = sent.name.last, bytes = sent.stored_bytes, %key, "archived a segment");
                    if let Ok(mut s) = self.seen.lock() {
                        let stored = Stored {
                            size: sent.stored_bytes,
                            e_tag: sent.e_tag.clone(),
                        };
                        s.record_uploaded(sent.name, stored);
                    }
                    self.since_snapshot
                        .fetch_add(sent.plain_bytes, Ordering::SeqCst);
                    self.forget_marks_through(sent.name.last);
                    self.set_status(|s| {
                        s.uploaded_segments += 1;
                        s.uploaded_bytes += sent.stored_bytes;
                        s.last_upload = Some(key);
                        s.last_upload_unix_ms = now_ms();
                        s.last_error = None;
                    });
                    // After each upload, not each pass: a pass through a
                    // backlog takes minutes, and retention on both boxes
                    // waits on this floor.
                    self.update_floor(&history, &epochs);
                }
                Err(e) => {
                    let still_there = self
                        .log
                        .layout()
                        .iter()
                        .any(|s| s.0 == first && s.1 == last);
                    if still_there {
                        result = Err(e);
                        break;
                    }
                    tracing::info!(
                        first,
                        "a segment left the log while it was archived: skipped"
                    );
                }
            }
        }
        self.update_floor(&history, &epochs);
        result
    }

    /// The objects recorded present.
    fn known(&self) -> Known {
        self.seen.lock().map(|s| s.known()).unwrap_or_default()
    }

    /// The erases still to carry to the archive, oldest first: done here
    /// with `pace` (the uploader), or only forgotten once the bucket says
    /// it has them (the watcher).
    async fn erases(&self, pace: Option<&mut Pace>) -> Result<(), Error> {
        let Some(queue) = self.erases.get() else {
            return Ok(());
        };
        let io = |e: std::io::Error| Error::Io(e.to_string());
        let pending = queue.pending().map_err(io)?;
        self.set_status(|s| s.erases_pending = pending.len() as u64);
        if pending.is_empty() {
            return Ok(());
        }
        let history = self.log.history().0;
        let epochs = (self.epochs)();
        let bucket = &self.settings.bucket;
        let marks = bucket.erase_marks().await?;
        let scratch = queue.scratch();
        let mut pace = pace;
        for e in pending {
            let mark = EraseMark {
                lineage: lineage(&history, &epochs, e.seq),
                seq: e.seq,
            };
            if !marks.contains(&mark) {
                let Some(pace) = pace.as_deref_mut() else {
                    continue;
                };
                let reach = EraseReach {
                    bucket,
                    codec: &self.settings.codec,
                    history,
                    scratch: &scratch,
                };
                let done = erase_in_archive(&reach, &e, pace).await?;
                bucket.put_erase_mark(&mark).await?;
                tracing::info!(
                    erase = e.seq,
                    before = e.before,
                    rewritten = done.rewritten,
                    frames = done.frames,
                    deleted = done.deleted,
                    "an erase reached the archive"
                );
                self.tiered.forget();
                if done.snapshots_deleted > 0 {
                    // A snapshot after the erase replaces them at once.
                    self.last_snapshot_at.store(0, Ordering::SeqCst);
                    self.since_snapshot.store(u64::MAX / 2, Ordering::SeqCst);
                }
                self.set_status(|s| s.erase_rewrites += done.rewritten);
            }
            queue.done(e.seq).map_err(io)?;
            self.set_status(|s| s.erases_pending = s.erases_pending.saturating_sub(1));
        }
        Ok(())
    }

    fn update_floor(&self, history: &[u8; 16], epochs: &[EpochStart]) {
        let ours = |n: &SegmentName| n.lineage == lineage(history, epochs, n.last);
        // Poisoned: as if objects were missing, so nothing goes.
        let (known, missing, found) = match self.seen.lock() {
            Ok(mut s) => (s.known(), s.missing(ours), s.found_missing),
            Err(_) => (Known::default(), Vec::new(), 0),
        };
        let (head_gap, head_last, head_generation) = self.head_gap(&known);
        let held = !missing.is_empty() || head_gap.is_some() || self.seen.is_poisoned();
        let known = &known;
        let layout = self.log.layout();
        let sealed = &layout[..layout.len().saturating_sub(1)];
        let mut floor = layout.last().map_or(0, |s| s.0);
        let mut lag_segments = 0;
        let mut lag_bytes = 0;
        let mut oldest_lagging: Option<u64> = None;
        let runs = covered(known, history, epochs);
        for &(first, last, bytes) in sealed {
            if !is_covered(&runs, first, last) {
                if oldest_lagging.is_none() {
                    floor = first;
                    oldest_lagging = Some(first);
                }
                lag_segments += 1;
                lag_bytes += bytes;
            }
        }
        let lag_secs = oldest_lagging
            .and_then(|first| {
                std::fs::metadata(format::segment_path(self.log.dir(), first))
                    .and_then(|m| m.modified())
                    .ok()
            })
            .and_then(|t| t.elapsed().ok())
            .map_or(0, |d| d.as_secs());
        self.floor.store(floor, Ordering::SeqCst);
        self.held.store(held, Ordering::SeqCst);
        let bucket = &self.settings.bucket;
        self.set_status(|s| {
            s.missing_objects = missing.len() as u64;
            s.head_gap = head_gap;
            s.head_last = head_last;
            s.head_generation = head_generation;
            s.retention_held = held;
            s.missing_first = missing.first().map(|n| bucket.segment_key(n));
            s.missing_found = found;
            s.floor = floor;
            s.lag_segments = lag_segments;
            s.lag_bytes = lag_bytes;
            s.lag_secs = lag_secs;
        });
    }
}

/// Every other mark dropped, the newest kept: each span of frames keeps
/// a mark at half the precision.
fn thin(marks: &mut VecDeque<TimeMark>) {
    let mut from_newest = marks.len();
    marks.retain(|_| {
        from_newest -= 1;
        from_newest % 2 == 0
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thinning_halves_the_marks_keeps_the_newest_and_spans_the_same_frames() {
        for len in [2, 3, 10, 11] {
            let mut marks: VecDeque<TimeMark> = (1..=len)
                .map(|seq| TimeMark {
                    seq,
                    unix_ms: seq * 100,
                })
                .collect();
            thin(&mut marks);
            assert_eq!(marks.len() as u64, len.div_ceil(2), "{len}");
            assert_eq!(marks.back().map(|m| m.seq), Some(len), "{len}");
            assert!(marks.front().is_some_and(|m| m.seq <= 2), "{len}");
            assert!(marks
                .iter()
                .zip(marks.iter().skip(1))
                .all(|(a, b)| b.seq == a.seq + 2));
        }
    }
}
