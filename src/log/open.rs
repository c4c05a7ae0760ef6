//! Opening a log: the lock, the history, a finished truncation or restart,
//! the sealed segments checked, and the last segment scanned frame by frame
//! with its torn tail cut.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, Mutex, RwLock};

use crate::clock::Clock;

use super::format::{
    self, FrameHeader, HISTORY_FILE, HISTORY_MAGIC, INDEX_ENTRY_LEN, INDEX_HEADER_LEN, LOCK_FILE,
    RESTART_FILE, RESTART_MAGIC, SEGMENT_HEADER_LEN, TRUNCATE_FILE,
};
use super::group_commit::SyncState;
use super::guard::FreezeGate;
use super::segment::{read_header, Next, SegmentReader};
use super::storage::{write_atomic, OpenMode, StdStorage, Storage, StorageFile};
use super::truncate::TruncateIntent;
use super::write::Writer;
use super::{
    Error, HistoryId, Kind, Log, OpenFiles, Result, Seg, SegmentDamage, DEFAULT_SEGMENT_BYTES,
    MIN_SEGMENT_BYTES,
};

/// How to open a log.
#[derive(Clone, Debug)]
pub struct OpenOptions {
    /// The size new segments are preallocated to.
    pub segment_bytes: u64,
    /// Cut the log at damage found inside a sealed segment, dropping every
    /// frame from there on, instead of refusing to open. Loud, and data loss.
    pub repair: bool,
    /// The file system; the real one when None.
    pub storage: Option<Arc<dyn Storage>>,
    /// The clock the log times its syncs and paces its group commits by;
    /// the machine's monotonic clock unless a test gives another.
    pub clock: Arc<dyn Clock>,
}

impl Default for OpenOptions {
    fn default() -> Self {
        OpenOptions {
            segment_bytes: DEFAULT_SEGMENT_BYTES,
            repair: false,
            storage: None,
            clock: crate::clock::system(),
        }
    }
}

/// What `open` found and did about it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Recovery {
    /// A torn or damaged tail cut from the last segment.
    pub cut: Option<Cut>,
    /// Segments dropped by the repair option, and why.
    pub repaired: Vec<String>,
    /// A half-made segment (from a crash during a roll) removed.
    pub removed_incomplete: Option<PathBuf>,
    /// An open segment holding no frame, sized past the segment size (for
    /// a frame that never came), shrunk back to a new segment's size.
    pub shrunk_empty: Option<PathBuf>,
    /// A reset or restart that a crash interrupted, finished at this sequence.
    pub finished_restart: Option<u64>,
    /// A `truncate_after` that a crash interrupted, finished: the head it cut to.
    pub finished_truncate: Option<u64>,
}

/// A tail cut from the last segment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cut {
    pub segment: PathBuf,
    /// Where the last whole frame ends; everything from here was zeroed.
    pub offset: u64,
    /// The sequence the first dropped frame would have had.
    pub seq: u64,
    pub reason: String,
}

fn read_small(fs: &dyn Storage, path: &Path) -> std::io::Result<Option<Vec<u8>>> {
    if !fs.exists(path)? {
        return Ok(None);
    }
    let f = fs.open(path, OpenMode::Read)?;
    let len = f.len()?.min(4096) as usize;
    let mut b = vec![0u8; len];
    f.read_exact_at(&mut b, 0)?;
    Ok(Some(b))
}

/// The first sequence a restart intent names, when the file is whole.
pub(super) fn decode_restart(b: &[u8]) -> Option<u64> {
    format::decode_sealed(&RESTART_MAGIC, b, 8).map(|body| format::u64_at(body, 0))
}

fn segment_firsts(fs: &dyn Storage, dir: &Path) -> Result<Vec<u64>> {
    let mut firsts: Vec<u64> = fs
        .list(dir)?
        .iter()
        .filter_map(|n| format::parse_segment_name(n))
        .collect();
    firsts.sort_unstable();
    Ok(firsts)
}

fn read_u64(file: &dyn StorageFile, at: u64) -> std::io::Result<u64> {
    let mut b = [0u8; 8];
    file.read_exact_at(&mut b, at)?;
    Ok(u64::from_le_bytes(b))
}

/// A sealed segment's frames, checked in O(1): header, index length, the
/// first frame at the start, the last frame ending exactly at the file's end.
/// Answers the segment's last sequence and length.
fn check_sealed(
    fs: &dyn Storage,
    dir: &Path,
    first: u64,
    next_first: u64,
    history: HistoryId,
) -> std::result::Result<(u64, u64), SegmentDamage> {
    use SegmentDamage as D;
    let log = fs
        .open(&format::segment_path(dir, first), OpenMode::Read)
        .map_err(D::Unread)?;
    let header = read_header(&*log)?;
    if header.first_seq != first {
        return Err(D::WrongFirst(header.first_seq));
    }
    if header.history != history.0 {
        return Err(D::OtherHistory {
            found: HistoryId(header.history),
            log: history,
        });
    }
    let idx = fs
        .open(&format::index_path(dir, first), OpenMode::Read)
        .map_err(D::IndexUnopened)?;
    let mut ih = [0u8; INDEX_HEADER_LEN];
    idx.read_exact_at(&mut ih, 0)
        .map_err(D::IndexHeaderUnread)?;
    if format::decode_index_header(&ih) != Some(first) {
        return Err(D::IndexOtherSegment);
    }
    let idx_len = idx.len().map_err(D::Unread)?;
    let entries = idx_len.saturating_sub(INDEX_HEADER_LEN as u64);
    let frames = next_first.saturating_sub(first);
    if idx_len < INDEX_HEADER_LEN as u64
        || entries % INDEX_ENTRY_LEN as u64 != 0
        || entries / INDEX_ENTRY_LEN as u64 != frames
        || frames == 0
    {
        return Err(D::IndexLength { entries, frames });
    }
    let first_at = read_u64(&*idx, INDEX_HEADER_LEN as u64).map_err(D::Unread)?;
    if first_at != SEGMENT_HEADER_LEN as u64 {
        return Err(D::FirstIndexedAt(first_at));
    }
    let mut hb = [0u8; format::FRAME_HEADER_LEN];
    log.read_exact_at(&mut hb, first_at)
        .map_err(D::FirstUnread)?;
    match FrameHeader::decode(&hb) {
        Ok(h) if h.seq == first => {}
        Ok(h) => return Err(D::FirstSeq(h.seq)),
        Err(e) => return Err(D::FirstBad(e)),
    }
    let last_at = read_u64(&*idx, idx_len - INDEX_ENTRY_LEN as u64).map_err(D::Unread)?;
    let mut hb = [0u8; format::FRAME_HEADER_LEN];
    log.read_exact_at(&mut hb, last_at)
        .map_err(|source| D::LastUnread {
            at: last_at,
            source,
        })?;
    let last = FrameHeader::decode(&hb).map_err(|error| D::LastBad { at: last_at, error })?;
    let file_len = log.len().map_err(D::Unread)?;
    if last.seq != next_first - 1 {
        return Err(D::LastSeq {
            got: last.seq,
            want: next_first - 1,
        });
    }
    if last_at + last.frame_len() != file_len {
        return Err(D::LastEnd {
            end: last_at + last.frame_len(),
            file_len,
        });
    }
    Ok((next_first - 1, file_len))
}

/// What a scan of the last segment found.
struct Scanned {
    offsets: Vec<u64>,
    end: u64,
    /// Why the scan stopped, when it stopped on bytes that are not zeros.
    damage: Option<String>,
}

/// Scan every frame of the last segment, checking headers, sequence order and
/// payload crcs; stop at the first that fails.
fn scan_last(file: &Arc<dyn StorageFile>, first: u64) -> Result<Scanned> {
    let mut r = SegmentReader::new(file.clone(), SEGMENT_HEADER_LEN as u64)?;
    let mut offsets = Vec::new();
    let damage = loop {
        let at = r.pos();
        let expected = first + offsets.len() as u64;
        let h = match r.next_header()? {
            Next::End => {
                let tail = r.file_len().saturating_sub(at);
                break (tail > 0 && !zeros_at(file, at, tail)?)
                    .then(|| format!("{tail} bytes of a torn header"));
            }
            Next::Bad(e) => {
                let left = (r.file_len() - at).min(format::FRAME_HEADER_LEN as u64);
                break (!zeros_at(file, at, left)?).then(|| format!("header: {e:?}"));
            }
            Next::Frame(h) => h,
        };
        if h.seq != expected {
            break Some(format!(
                "frame holds sequence {}, expected {expected}",
                h.seq
            ));
        }
        let body = h.frame_len() - format::FRAME_HEADER_LEN as u64;
        if at + h.frame_len() > r.file_len() {
            break Some(format!(
                "frame of {} bytes runs past the end of the file",
                h.frame_len()
            ));
        }
        if h.kind == Kind::Redacted.as_u16() {
            r.skip(body);
        } else if r.crc_of(body)? != h.payload_crc {
            break Some("payload crc mismatch".to_string());
        }
        offsets.push(at);
    };
    let end = offsets.last().map_or(SEGMENT_HEADER_LEN as u64, |&at| {
        // Re-derive the end from the last frame rather than the reader, which
        // stopped somewhere inside the damage.
        at + frame_len_at(file, at).unwrap_or(0)
    });
    Ok(Scanned {
        offsets,
        end,
        damage,
    })
}

fn frame_len_at(file: &Arc<dyn StorageFile>, at: u64) -> Option<u64> {
    let mut hb = [0u8; format::FRAME_HEADER_LEN];
    file.read_exact_at(&mut hb, at).ok()?;
    FrameHeader::decode(&hb).ok().map(|h| h.frame_len())
}

fn zeros_at(file: &Arc<dyn StorageFile>, at: u64, len: u64) -> Result<bool> {
    let mut b = vec![0u8; len as usize];
    let n = file.read_at(&mut b, at)?;
    Ok(b[..n].iter().all(|&x| x == 0))
}

impl Log {
    /// Open or create the log with explicit options.
    pub fn open_opts(dir: impl AsRef<Path>, opts: OpenOptions) -> Result<Self> {
        let dir = dir.as_ref().to_path_buf();
        let fs = opts.storage.clone().unwrap_or_else(StdStorage::shared);
        if opts.segment_bytes < MIN_SEGMENT_BYTES {
            return Err(Error::SegmentTooSmall {
                len: opts.segment_bytes,
                min: MIN_SEGMENT_BYTES,
            });
        }
        fs.create_dir_all(&dir)?;
        let lock = match fs.lock(&dir.join(LOCK_FILE)) {
            Ok(l) => l,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                return Err(Error::Locked(dir));
            }
            Err(e) => return Err(e.into()),
        };
        for name in fs.list(&dir)? {
            if name.ends_with(".tmp") {
                fs.remove(&dir.join(&name))?;
            }
        }
        let mut recovery = Recovery::default();
        let mut firsts = segment_firsts(&*fs, &dir)?;
        let history = match read_small(&*fs, &dir.join(HISTORY_FILE))? {
            Some(b) => {
                let body = format::decode_sealed(&HISTORY_MAGIC, &b, 16)
                    .ok_or_else(|| Error::History("HISTORY file does not decode".into()))?;
                let mut id = [0u8; 16];
                id.copy_from_slice(body);
                HistoryId(id)
            }
            None if firsts.is_empty() => {
                let id = HistoryId::mint()?;
                write_atomic(
                    &*fs,
                    &dir,
                    HISTORY_FILE,
                    &format::encode_sealed(&HISTORY_MAGIC, &id.0),
                )?;
                tracing::info!(dir = %dir.display(), history = %id, "created log");
                id
            }
            None => return Err(Error::History("segments without a HISTORY file".into())),
        };
        let truncate = read_small(&*fs, &dir.join(TRUNCATE_FILE))?;
        let restart = read_small(&*fs, &dir.join(RESTART_FILE))?;
        let log = Log {
            dir: dir.clone(),
            fs: fs.clone(),
            segment_bytes: opts.segment_bytes,
            history: RwLock::new(history),
            writer: Mutex::new(Writer::placeholder()),
            segs: RwLock::new(Vec::new()),
            head: AtomicU64::new(0),
            pacing: Default::default(),
            sync: Mutex::new(SyncState::default()),
            poisoned: AtomicBool::new(false),
            poison: Mutex::new(None),
            follower: AtomicBool::new(false),
            released: AtomicBool::new(false),
            reader_files: Mutex::new(None),
            reader_files_generation: AtomicU64::new(0),
            frame_syncs: AtomicU64::new(0),
            erase_syncs: AtomicU64::new(0),
            sync_time: Default::default(),
            writer_wait: Default::default(),
            erase_lock: Mutex::new(()),
            cut_count: AtomicU64::new(0),
            cut_heads: Mutex::new(Vec::new()),
            gate: FreezeGate::default(),
            recovery: Recovery::default(),
            clock: opts.clock.clone(),
            _lock: lock,
        };
        // Before the segments are checked: a cut stopped halfway may have
        // left a sealed segment last, with the frames it cuts still in it.
        if let Some(b) = truncate {
            let intent = TruncateIntent::decode(&b)
                .ok_or_else(|| Error::Corrupt("TRUNCATE intent file does not decode".into()))?;
            tracing::warn!(dir = %dir.display(), head = intent.head, "finishing a truncation a crash interrupted");
            log.finish_truncate(&intent)?;
            recovery.finished_truncate = Some(intent.head);
            firsts = segment_firsts(&*fs, &dir)?;
        }
        if let Some(b) = restart {
            let next = decode_restart(&b)
                .ok_or_else(|| Error::Corrupt("RESTART intent file does not decode".into()))?;
            tracing::warn!(dir = %dir.display(), next, "finishing a restart a crash interrupted");
            log.drop_all_segments(&firsts)?;
            log.create_segment(next, log.segment_bytes)?;
            fs.remove(&dir.join(RESTART_FILE))?;
            fs.sync_dir(&dir)?;
            recovery.finished_restart = Some(next);
            firsts = vec![next];
        }
        if firsts.is_empty() {
            log.create_segment(1, log.segment_bytes)?;
            firsts.push(1);
        }
        let mut log = log;
        log.recover(firsts, opts.repair, &mut recovery)?;
        log.recovery = recovery;
        Ok(log)
    }

    /// Check the sealed segments, scan the last, cut its tail, and set up
    /// the writer.
    fn recover(&self, mut firsts: Vec<u64>, repair: bool, recovery: &mut Recovery) -> Result<()> {
        let fs = &*self.fs;
        let history = self.history();
        // A last segment whose header never became whole was being created
        // by a roll: nothing was written to it.
        if let Some(&last) = firsts.last() {
            let path = self.segment_file(last);
            let f = fs.open(&path, OpenMode::Read)?;
            if let Err(what) = read_header(&*f) {
                // A roll that stopped before the header was whole wrote no
                // frame: a frame header after it is damage, not a half-made
                // segment, and is never deleted.
                if !zeros_at(
                    &f,
                    SEGMENT_HEADER_LEN as u64,
                    format::FRAME_HEADER_LEN as u64,
                )? {
                    return Err(Error::Corrupt(format!(
                        "{}: {what}, and frames follow it",
                        path.display()
                    )));
                }
                tracing::warn!(segment = %path.display(), "removing a segment a crash left half made");
                fs.remove(&path)?;
                let idx = self.index_file(last);
                if fs.exists(&idx)? {
                    fs.remove(&idx)?;
                }
                fs.sync_dir(&self.dir)?;
                recovery.removed_incomplete = Some(path);
                firsts.pop();
                if firsts.is_empty() {
                    self.create_segment(last, self.segment_bytes)?;
                    firsts.push(last);
                }
            }
        }
        let mut segs = Vec::with_capacity(firsts.len());
        let mut i = 0;
        while i + 1 < firsts.len() {
            let first = firsts[i];
            match check_sealed(fs, &self.dir, first, firsts[i + 1], history) {
                Ok((last, bytes)) => segs.push(Seg { first, last, bytes }),
                Err(what) if repair => {
                    let dropped: Vec<u64> = firsts.drain(i + 1..).collect();
                    tracing::error!(
                        segment = %self.segment_file(first).display(), %what,
                        dropped = dropped.len(),
                        "REPAIR: cutting the log inside a sealed segment, dropping every later segment"
                    );
                    recovery.repaired.push(format!(
                        "{}: {what}; dropped segments starting at {dropped:?}",
                        self.segment_file(first).display()
                    ));
                    for d in dropped.iter().rev() {
                        fs.remove(&self.segment_file(*d))?;
                        if fs.exists(&self.index_file(*d))? {
                            fs.remove(&self.index_file(*d))?;
                        }
                    }
                    fs.sync_dir(&self.dir)?;
                    break;
                }
                Err(what) => {
                    return Err(Error::SealedDamage {
                        segment: self.segment_file(first),
                        what,
                    })
                }
            }
            i += 1;
        }
        let first = *firsts
            .last()
            .ok_or_else(|| Error::Corrupt("no segment".into()))?;
        if let Some(prev) = segs.last() {
            if prev.last + 1 != first {
                return Err(Error::SealedDamage {
                    segment: self.segment_file(prev.first),
                    what: SegmentDamage::NotFollowed {
                        last: prev.last,
                        next: first,
                    },
                });
            }
        }
        let path = self.segment_file(first);
        let log_file = fs.open(&path, OpenMode::Write)?;
        let mut header = read_header(&*log_file)
            .map_err(|what| Error::Corrupt(format!("{}: {what}", path.display())))?;
        if header.first_seq != first {
            return Err(Error::Corrupt(format!(
                "{}: header names first sequence {}",
                path.display(),
                header.first_seq
            )));
        }
        let scanned = scan_last(&log_file, first)?;
        if header.history != history.0 {
            if !scanned.offsets.is_empty() || !segs.is_empty() {
                return Err(Error::History(format!(
                    "{} belongs to history {}, the log's is {history}",
                    path.display(),
                    HistoryId(header.history)
                )));
            }
            // An empty log whose history was adopted while a crash cut the
            // header's rewrite: the HISTORY file is the truth.
            header.history = history.0;
            log_file.write_all_at(&header.encode(), 0)?;
            log_file.sync_all()?;
        }
        let mut file_len = log_file.len()?;
        if scanned.offsets.is_empty()
            && (header.capacity > self.segment_bytes || file_len > self.segment_bytes)
        {
            // An empty open segment needs no more room than a new one. One
            // sized for a frame that never came (a reservation refused, or
            // an append aborted) is shrunk back: its size is only what it
            // asked the disk for, and asking again could fail for ever.
            tracing::warn!(
                segment = %path.display(), capacity = header.capacity, file_len,
                "an open segment without frames shrunk to the segment size"
            );
            log_file.set_len(SEGMENT_HEADER_LEN as u64)?;
            header.capacity = self.segment_bytes;
            log_file.write_all_at(&header.encode(), 0)?;
            log_file.sync_all()?;
            recovery.shrunk_empty = Some(path.clone());
            file_len = SEGMENT_HEADER_LEN as u64;
        }
        let capacity = header.capacity.max(self.segment_bytes).max(scanned.end);
        let next_seq = first + scanned.offsets.len() as u64;
        if let Some(reason) = &scanned.damage {
            tracing::warn!(
                segment = %path.display(), offset = scanned.end, next_seq, %reason,
                "cutting the log's torn tail"
            );
            recovery.cut = Some(Cut {
                segment: path.clone(),
                offset: scanned.end,
                seq: next_seq,
                reason: reason.clone(),
            });
        }
        if scanned.end < file_len {
            // Zeros from the end on: no byte of a torn or aborted frame may
            // later follow a shorter frame and read as a header.
            log_file.punch(scanned.end, file_len - scanned.end)?;
        }
        let capacity = capacity.max(file_len);
        if scanned.end < capacity {
            // The punch left a hole; reserve the blocks again so appends
            // never allocate on their fsync path.
            log_file.allocate(scanned.end, capacity - scanned.end)?;
        }
        // The scan may have found frames that a writer which died before
        // its fdatasync left in the page cache only, and the segment's name
        // may never have been synced (a roll that failed after creating it):
        // make both durable before anything in them is published.
        log_file.sync_all()?;
        let idx = self.rebuild_index(first, &scanned.offsets)?;
        fs.sync_dir(&self.dir)?;
        let last = next_seq - 1;
        segs.push(Seg {
            first,
            last,
            bytes: capacity,
        });
        let mut w = Writer::new(
            first,
            scanned.end,
            capacity,
            Some(OpenFiles { log: log_file, idx }),
        );
        w.next_seq = next_seq;
        w.published = last;
        w.indexed_through = last;
        *super::lock(&self.writer) = w;
        *super::write_lock(&self.segs) = segs;
        self.head.store(last, std::sync::atomic::Ordering::SeqCst);
        Ok(())
    }

    /// Make the last segment's index match its scanned frames, keeping what
    /// already matches.
    fn rebuild_index(&self, first: u64, offsets: &[u64]) -> Result<Arc<dyn StorageFile>> {
        let path = self.index_file(first);
        let idx = if self.fs.exists(&path)? {
            self.fs.open(&path, OpenMode::Write)?
        } else {
            let f = self.fs.open(&path, OpenMode::CreateNew)?;
            self.fs.sync_dir(&self.dir)?;
            f
        };
        let len = idx.len()?;
        let mut have =
            vec![0u8; len.min(INDEX_HEADER_LEN as u64 + 8 * offsets.len() as u64) as usize];
        let n = idx.read_at(&mut have, 0)?;
        have.truncate(n);
        let mut want = format::encode_index_header(first).to_vec();
        for off in offsets {
            want.extend_from_slice(&off.to_le_bytes());
        }
        let keep = have.iter().zip(&want).take_while(|(a, b)| a == b).count();
        if keep < want.len() || len != want.len() as u64 {
            if len > keep as u64 {
                idx.set_len(keep as u64)?;
            }
            idx.write_all_at(&want[keep..], keep as u64)?;
            idx.set_len(want.len() as u64)?;
        }
        Ok(idx)
    }
}
