//! Crash, damage and fault tests of the log: torn tails, flipped bits,
//! damaged sealed segments, a power cut at every sync of a workload,
//! injected write and fsync failures, group commit under real concurrency,
//! pieces of a damaged blob, and erase.
//!
//! Most run on [`SimStorage`], which keeps a live and a durable image of
//! every file, so that a test can damage bytes or cut the power anywhere.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use twinlog::log::format::{self, FrameHeader, FRAME_HEADER_LEN, SEGMENT_HEADER_LEN};
use twinlog::log::storage::{OpenMode, StdStorage, Storage, StorageFile};
use twinlog::log::{
    CrashMode, Entry, Error, Kind, Located, Log, Meta, OpenOptions, Result, SimStorage,
};

// ---------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------

/// Where logs live on a simulated disk.
const SIM_DIR: &str = "/sim/log";

fn sim_dir() -> &'static Path {
    Path::new(SIM_DIR)
}

fn sim_opts(fs: &SimStorage, segment_bytes: u64, repair: bool) -> OpenOptions {
    OpenOptions {
        segment_bytes,
        repair,
        storage: Some(Arc::new(fs.clone())),
        ..OpenOptions::default()
    }
}

fn open_sim(fs: &SimStorage, segment_bytes: u64) -> Result<Log> {
    Log::open_opts(sim_dir(), sim_opts(fs, segment_bytes, false))
}

/// Deterministic bytes: a xorshift stream seeded by `seed`.
fn bytes(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 32) as u8
        })
        .collect()
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

/// A frame as written: kind, meta bytes, blob.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Frame {
    kind: u16,
    meta: Vec<u8>,
    blob: Vec<u8>,
}

impl Frame {
    /// A frame of `kind` naming `repo` (no meta at all for an empty repo),
    /// with `len` bytes of blob derived from `seed`.
    fn new(kind: Kind, repo: &str, seed: u64, len: usize) -> Frame {
        let meta = if repo.is_empty() {
            Vec::new()
        } else {
            Meta::repo(repo).encode().expect("encode meta")
        };
        Frame {
            kind: kind.as_u16(),
            meta,
            blob: bytes(seed, len),
        }
    }

    fn of(e: &Entry) -> Frame {
        Frame {
            kind: e.kind,
            meta: e.meta.clone(),
            blob: e.blob.clone(),
        }
    }

    /// The frame as `erase` leaves it.
    /// What an erase leaves of this frame: its kind Redacted, no meta, no
    /// blob.
    fn erased(&self) -> Frame {
        Frame {
            kind: Kind::Redacted.as_u16(),
            meta: Vec::new(),
            blob: Vec::new(),
        }
    }

    /// Whether `erase(_, [repo])` erases this frame (when it is old enough).
    fn erasable_by(&self, repo: &str) -> bool {
        let data = Kind::from_u16(self.kind)
            .is_ok_and(|k| matches!(k, Kind::Pack | Kind::Refs | Kind::LfsPut | Kind::LfsDelete));
        data && Meta::repo_of(&self.meta).is_ok_and(|r| r == repo)
    }

    fn append(&self, log: &Log) -> Result<u64> {
        log.append_raw(self.kind, &self.meta, &self.blob)
    }

    fn frame_len(&self) -> u64 {
        (FRAME_HEADER_LEN + self.meta.len() + self.blob.len()) as u64
    }
}

fn read_frame(log: &Log, seq: u64) -> Frame {
    Frame::of(&log.read(seq).unwrap_or_else(|e| panic!("read {seq}: {e}")))
}

/// Every file of a simulated disk, live bytes.
type Files = Vec<(PathBuf, Vec<u8>)>;

fn snapshot(fs: &SimStorage) -> Files {
    fs.files()
        .into_iter()
        .map(|p| {
            let b = fs.read_file(&p).expect("listed file");
            (p, b)
        })
        .collect()
}

/// A fresh disk holding `files`, with `path` changed by `damage`.
fn disk_with(files: &Files, path: &Path, damage: impl FnOnce(&mut Vec<u8>)) -> SimStorage {
    let fs = SimStorage::new();
    let mut damage = Some(damage);
    for (p, b) in files {
        let mut b = b.clone();
        if p == path {
            (damage.take().expect("one file damaged"))(&mut b);
        }
        fs.write_file(p, &b);
    }
    assert!(damage.is_none(), "{} is not on the disk", path.display());
    fs
}

/// Offsets and headers of the frames in a segment's bytes, from the segment
/// header on until a header does not decode.
fn frames_in(seg: &[u8]) -> Vec<(u64, FrameHeader)> {
    let mut out = Vec::new();
    let mut at = SEGMENT_HEADER_LEN;
    while at + FRAME_HEADER_LEN <= seg.len() {
        let mut hb = [0u8; FRAME_HEADER_LEN];
        hb.copy_from_slice(&seg[at..at + FRAME_HEADER_LEN]);
        let Ok(h) = FrameHeader::decode(&hb) else {
            break;
        };
        out.push((at as u64, h));
        at += h.frame_len() as usize;
    }
    out
}

fn file_of<'a>(files: &'a Files, path: &Path) -> &'a [u8] {
    &files
        .iter()
        .find(|(p, _)| p == path)
        .unwrap_or_else(|| panic!("{} is not on the disk", path.display()))
        .1
}

// ---------------------------------------------------------------------------
// 1, 2: torn tails and flipped bits in the last segment
// ---------------------------------------------------------------------------

/// A log of a few segments whose last segment holds five frames of varied
/// shapes: meta and blob, meta and an empty blob, a blob and no meta.
struct TailLog {
    files: Files,
    /// Every frame, `frames[i]` at sequence `i + 1`.
    frames: Vec<Frame>,
    /// The last segment: path, first sequence, and its frames' offsets.
    last: PathBuf,
    last_first: u64,
    offsets: Vec<u64>,
}

const TAIL_SEGMENT: u64 = 1024;

impl TailLog {
    fn build() -> TailLog {
        let fs = SimStorage::new();
        let log = open_sim(&fs, TAIL_SEGMENT).expect("open");
        let mut frames = Vec::new();
        for i in 0..9u64 {
            let repo = if i % 2 == 0 { "a" } else { "b" };
            frames.push(Frame::new(
                Kind::Pack,
                repo,
                i,
                60 + (i as usize * 37) % 200,
            ));
        }
        for f in &frames {
            f.append(&log).expect("append");
        }
        // Close the open segment, dropping nothing: the tail frames start a
        // segment of their own.
        log.retain_from(1).expect("roll");
        let tail = [
            Frame::new(Kind::Refs, "a", 100, 40),
            Frame::new(Kind::RepoStore, "b", 101, 0),
            Frame::new(Kind::App(0x8001), "", 102, 90),
            Frame::new(Kind::LfsDelete, "a", 103, 0),
            Frame::new(Kind::LfsPut, "b", 104, 150),
        ];
        for f in tail {
            f.append(&log).expect("append");
            frames.push(f);
        }
        let layout = log.layout();
        assert!(layout.len() >= 3, "{layout:?}");
        let (last_first, last_last, _) = *layout.last().expect("a segment");
        assert_eq!(last_last, frames.len() as u64);
        assert_eq!(last_first, frames.len() as u64 - 4);
        drop(log);
        let files = snapshot(&fs);
        let last = format::segment_path(sim_dir(), last_first);
        let found = frames_in(file_of(&files, &last));
        assert_eq!(found.len(), 5);
        let offsets = found.iter().map(|(at, _)| *at).collect();
        TailLog {
            files,
            frames,
            last,
            last_first,
            offsets,
        }
    }

    fn seq_at(&self, i: usize) -> u64 {
        self.last_first + i as u64
    }

    fn frame(&self, seq: u64) -> &Frame {
        &self.frames[seq as usize - 1]
    }

    fn start(&self, i: usize) -> u64 {
        self.offsets[i]
    }

    fn end(&self, i: usize) -> u64 {
        self.offsets[i] + self.frame(self.seq_at(i)).frame_len()
    }

    /// The head after cutting the last segment at `cut`: the whole frames.
    fn head_cut_at(&self, cut: u64) -> u64 {
        let whole = (0..self.offsets.len())
            .filter(|&i| self.end(i) <= cut)
            .count();
        self.last_first + whole as u64 - 1
    }

    fn assert_intact(&self, log: &Log, through: u64, what: &str) {
        for seq in 1..=through {
            assert_eq!(
                &read_frame(log, seq),
                self.frame(seq),
                "{what}: frame {seq}"
            );
        }
    }
}

/// A power cut mid-append leaves the last segment cut anywhere (the file
/// even shorter than its preallocation): open keeps exactly the whole frames
/// before the cut, all intact, and the log goes on at the next number.
#[test]
fn torn_tail_at_every_byte_keeps_exactly_the_whole_frames() {
    let t = TailLog::build();
    let n = t.offsets.len();
    for cut in t.start(n - 3)..=t.end(n - 1) {
        let what = format!("cut at {cut}");
        let fs = disk_with(&t.files, &t.last, |b| b.truncate(cut as usize));
        let log = open_sim(&fs, TAIL_SEGMENT).unwrap_or_else(|e| panic!("{what}: open: {e}"));
        let head = t.head_cut_at(cut);
        assert_eq!(log.head_seq(), head, "{what}");
        let boundary = (0..n).any(|i| t.start(i) == cut || t.end(i) == cut);
        let rec = log.recovery();
        match &rec.cut {
            Some(c) => {
                assert!(!boundary, "{what}: a cut at a frame boundary is no damage");
                assert_eq!(c.seq, head + 1, "{what}: {rec:?}");
                assert_eq!(c.segment, t.last, "{what}");
            }
            None => assert!(boundary, "{what}: a torn frame went unreported"),
        }
        t.assert_intact(&log, head, &what);
        assert!(
            matches!(log.read(head + 1), Err(Error::PastHead { .. })),
            "{what}"
        );
        let next = Frame::new(Kind::Refs, "c", cut, 33);
        assert_eq!(next.append(&log).expect("append"), head + 1, "{what}");
        drop(log);
        let log = open_sim(&fs, TAIL_SEGMENT).expect("reopen");
        assert_eq!(log.head_seq(), head + 1, "{what}");
        assert!(log.recovery().cut.is_none(), "{what}: {:?}", log.recovery());
        assert_eq!(read_frame(&log, head + 1), next, "{what}");
        t.assert_intact(&log, head, &what);
    }
}

/// The same cuts on the real file system (preallocation, punch and the
/// truncated file's growth back to capacity go through `StdStorage`).
#[test]
fn torn_tail_on_the_real_file_system() {
    let t = TailLog::build();
    let n = t.offsets.len();
    for cut in (t.start(n - 2)..=t.end(n - 1)).step_by(5) {
        let what = format!("cut at {cut}");
        let dir = tempfile::tempdir().expect("tempdir");
        for (p, b) in &t.files {
            let name = p.file_name().expect("file name");
            std::fs::write(dir.path().join(name), b).expect("copy file");
        }
        let name = t.last.file_name().expect("file name");
        let seg = std::fs::OpenOptions::new()
            .write(true)
            .open(dir.path().join(name))
            .expect("open segment");
        seg.set_len(cut).expect("cut segment");
        drop(seg);
        let log = Log::open_with(dir.path(), TAIL_SEGMENT).expect("open");
        let head = t.head_cut_at(cut);
        assert_eq!(log.head_seq(), head, "{what}");
        t.assert_intact(&log, head, &what);
        let next = Frame::new(Kind::Refs, "c", cut, 500);
        assert_eq!(next.append(&log).expect("append"), head + 1, "{what}");
        drop(log);
        let log = Log::open_with(dir.path(), TAIL_SEGMENT).expect("reopen");
        assert_eq!(log.head_seq(), head + 1, "{what}");
        assert!(log.recovery().cut.is_none(), "{what}: {:?}", log.recovery());
        assert_eq!(read_frame(&log, head + 1), next, "{what}");
    }
}

/// A flipped byte in one of the last frames: open keeps exactly the frames
/// before the damaged one, says it cut, never hands out a frame that fails
/// its crc, and the damaged frame's successors never come back, even when a
/// new frame of the damaged one's exact length takes its place.
#[test]
fn bit_flip_in_the_tail_cuts_at_the_damaged_frame() {
    let t = TailLog::build();
    let n = t.offsets.len();
    let mut cases = Vec::new();
    for at in t.start(n - 2)..t.end(n - 1) {
        cases.push((at, 0xffu8));
        cases.push((at, 1 << (at % 8)));
        if at % 7 == 0 {
            cases.extend((0..8).map(|bit| (at, 1u8 << bit)));
        }
    }
    for (at, mask) in cases {
        let what = format!("byte {at} ^ {mask:#04x}");
        let fs = disk_with(&t.files, &t.last, |b| b[at as usize] ^= mask);
        let log = open_sim(&fs, TAIL_SEGMENT).unwrap_or_else(|e| panic!("{what}: open: {e}"));
        let damaged = (0..n)
            .find(|&i| t.start(i) <= at && at < t.end(i))
            .expect("a frame holds the byte");
        let seq = t.seq_at(damaged);
        assert_eq!(log.head_seq(), seq - 1, "{what}");
        let cut = log
            .recovery()
            .cut
            .as_ref()
            .unwrap_or_else(|| panic!("{what}: damage went unreported: {:?}", log.recovery()));
        assert_eq!((cut.seq, cut.offset), (seq, t.start(damaged)), "{what}");
        t.assert_intact(&log, seq - 1, &what);
        assert_eq!(log.range(1, u64::MAX).expect("range").len() as u64, seq - 1);
        // Same length as the damaged frame, other bytes: had the cut left
        // the next frame's bytes, it would now line up as frame seq + 1.
        let old = t.frame(seq);
        let mut new = old.clone();
        new.blob = bytes(at ^ 0xabcd, old.blob.len());
        new.meta = old.meta.iter().map(|b| b ^ 0x55).collect();
        assert_eq!(new.append(&log).expect("append"), seq, "{what}");
        drop(log);
        let log = open_sim(&fs, TAIL_SEGMENT).expect("reopen");
        assert_eq!(log.head_seq(), seq, "{what}: a stale frame came back");
        assert!(log.recovery().cut.is_none(), "{what}: {:?}", log.recovery());
        assert_eq!(read_frame(&log, seq), new, "{what}");
        t.assert_intact(&log, seq - 1, &what);
        let more = Frame::new(Kind::Refs, "c", at, 10);
        assert_eq!(more.append(&log).expect("append"), seq + 1, "{what}");
        drop(log);
        let log = open_sim(&fs, TAIL_SEGMENT).expect("reopen");
        assert_eq!(log.head_seq(), seq + 1, "{what}");
        assert!(log.recovery().cut.is_none(), "{what}: {:?}", log.recovery());
        assert_eq!(read_frame(&log, seq + 1), more, "{what}");
    }
}

// ---------------------------------------------------------------------------
// 3: damage inside a sealed segment
// ---------------------------------------------------------------------------

const SEALED_SEGMENT: u64 = 512;

/// A log of several sealed segments: its files, its frames, its layout.
fn sealed_log() -> (Files, Vec<Frame>, Vec<(u64, u64, u64)>) {
    let fs = SimStorage::new();
    let log = open_sim(&fs, SEALED_SEGMENT).expect("open");
    let frames: Vec<Frame> = (0..30u64)
        .map(|i| Frame::new(Kind::Pack, "r", i, 40 + (i as usize * 53) % 110))
        .collect();
    for f in &frames {
        f.append(&log).expect("append");
    }
    let layout = log.layout();
    assert!(layout.len() >= 4, "{layout:?}");
    drop(log);
    (snapshot(&fs), frames, layout)
}

/// Damage to a sealed segment that open's O(1) check sees: refused with
/// `SealedDamage` naming the segment; with `repair`, cut at the damage with
/// every later segment dropped and reported, and the log goes on.
#[test]
fn sealed_damage_refuses_to_open_unless_repaired() {
    let (files, frames, layout) = sealed_log();
    let (first, last, _) = layout[1];
    let seg = format::segment_path(sim_dir(), first);
    let idx = format::index_path(sim_dir(), first);
    let (last_at, _) = *frames_in(file_of(&files, &seg))
        .last()
        .expect("frames in the segment");
    type Damage = Box<dyn Fn(&SimStorage)>;
    let edit = |path: PathBuf, f: fn(&mut Vec<u8>, u64)| -> Damage {
        let files = files.clone();
        Box::new(move |fs: &SimStorage| {
            let mut b = file_of(&files, &path).to_vec();
            f(&mut b, last_at);
            fs.write_file(&path, &b);
        })
    };
    // (what, damage, the head after repair)
    let cases: Vec<(&str, Damage, u64)> = vec![
        (
            "last frame header flipped",
            edit(seg.clone(), |b, at| b[at as usize + 3] ^= 0x10),
            last - 1,
        ),
        (
            "segment truncated inside its last frame",
            edit(seg.clone(), |b, _| b.truncate(b.len() - 7)),
            last - 1,
        ),
        (
            "index one entry short",
            edit(idx.clone(), |b, _| b.truncate(b.len() - 8)),
            last,
        ),
        (
            "index deleted",
            Box::new({
                let idx = idx.clone();
                move |fs: &SimStorage| fs.remove(&idx).expect("remove index")
            }),
            last,
        ),
    ];
    for (what, damage, head) in cases {
        let fs = disk_with(&files, &seg, |_| ());
        damage(&fs);
        match open_sim(&fs, SEALED_SEGMENT) {
            Err(Error::SealedDamage { segment, .. }) => assert_eq!(segment, seg, "{what}"),
            other => panic!("{what}: expected SealedDamage, got {other:?}"),
        }
        let log = Log::open_opts(sim_dir(), sim_opts(&fs, SEALED_SEGMENT, true))
            .unwrap_or_else(|e| panic!("{what}: repair: {e}"));
        let rec = log.recovery();
        assert_eq!(rec.repaired.len(), 1, "{what}: {rec:?}");
        let name = format::segment_name(first);
        assert!(rec.repaired[0].contains(&name), "{what}: {rec:?}");
        assert_eq!(log.head_seq(), head, "{what}: {rec:?}");
        assert_eq!(log.layout().len(), 2, "{what}: {:?}", log.layout());
        for (i, f) in frames.iter().enumerate().take(head as usize) {
            assert_eq!(&read_frame(&log, i as u64 + 1), f, "{what}");
        }
        for &(later, _, _) in &layout[2..] {
            let gone = format::segment_path(sim_dir(), later);
            assert!(
                !fs.files().contains(&gone),
                "{what}: {} kept",
                gone.display()
            );
        }
        let next = Frame::new(Kind::Refs, "r", 999, 20);
        assert_eq!(next.append(&log).expect("append"), head + 1, "{what}");
        drop(log);
        let log = open_sim(&fs, SEALED_SEGMENT).expect("reopen without repair");
        assert_eq!(log.head_seq(), head + 1, "{what}");
        assert_eq!(read_frame(&log, head + 1), next, "{what}");
    }
}

/// A flipped payload byte in the middle of a sealed segment is beyond open's
/// O(1) check: open works, and reading that frame is `Corrupt` (whole, in
/// pieces or in a range) while its neighbours read fine.
#[test]
fn sealed_payload_damage_is_caught_by_reads() {
    let (files, frames, layout) = sealed_log();
    // A sealed segment of at least three frames, not the first.
    let &(first, last, _) = layout[1..layout.len() - 1]
        .iter()
        .find(|(first, last, _)| last - first >= 2)
        .expect("a sealed segment of three frames");
    let seg = format::segment_path(sim_dir(), first);
    let found = frames_in(file_of(&files, &seg));
    let mid = found.len() / 2;
    let (at, h) = found[mid];
    let seq = first + mid as u64;
    assert!(seq < last);
    let byte = at as usize + FRAME_HEADER_LEN + h.meta_len as usize + 5;
    let fs = disk_with(&files, &seg, |b| b[byte] ^= 0x01);
    let log = open_sim(&fs, SEALED_SEGMENT).expect("open");
    assert!(log.recovery().cut.is_none(), "{:?}", log.recovery());
    assert_eq!(log.head_seq(), frames.len() as u64);
    assert!(
        matches!(log.read(seq), Err(Error::Corrupt(_))),
        "{:?}",
        log.read(seq)
    );
    assert_eq!(read_frame(&log, seq - 1), frames[seq as usize - 2]);
    assert_eq!(read_frame(&log, seq + 1), frames[seq as usize]);
    let pieces = log.read_pieces(seq, 16, |_: &Located, _, _| Ok::<(), Error>(()));
    assert!(matches!(pieces, Err(Error::Corrupt(_))), "{pieces:?}");
    assert!(matches!(log.range(1, u64::MAX), Err(Error::Corrupt(_))));
}

// ---------------------------------------------------------------------------
// 4: a power cut at every sync of a workload
// ---------------------------------------------------------------------------

const WORK_SEGMENT: u64 = 1024;
const TRUNCATE_BELOW: u64 = 9;
const RESTART_GAP: u64 = 50;
const ERASED_REPO: &str = "a";

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum Step {
    #[default]
    Untried,
    /// Called, and did not return (yet).
    Tried,
    /// Returned Ok.
    Acked,
}

/// What a workload run did before it stopped.
#[derive(Debug, Default)]
struct Journal {
    /// The number the next frame takes.
    next: u64,
    /// Frames whose append returned Ok.
    acked: BTreeMap<u64, Frame>,
    /// Every frame tried at each number (an aborted streaming append leaves
    /// its number to the next frame).
    tried: BTreeMap<u64, Vec<Frame>>,
    truncate: Step,
    truncated_to: u64,
    erase: Step,
    erase_before: u64,
    restart: Step,
    restart_at: u64,
    /// Frames made so far, for their seeds.
    made: u64,
}

impl Journal {
    fn frame(&mut self, len: usize) -> Frame {
        const KINDS: [Kind; 6] = [
            Kind::Pack,
            Kind::Refs,
            Kind::RepoStore,
            Kind::LfsPut,
            Kind::LfsDelete,
            Kind::App(0x8001),
        ];
        self.made += 1;
        let n = self.made;
        let repo = if n % 5 < 3 { "a" } else { "b" };
        Frame::new(KINDS[n as usize % KINDS.len()], repo, n, len)
    }

    fn tried_at(&mut self, seq: u64, f: &Frame) {
        self.tried.entry(seq).or_default().push(f.clone());
    }

    fn append(&mut self, log: &Log, len: usize) -> Result<u64> {
        let f = self.frame(len);
        self.tried_at(self.next, &f);
        let seq = f.append(log)?;
        assert_eq!(seq, self.next);
        self.acked.insert(seq, f);
        self.next += 1;
        Ok(seq)
    }

    /// A streaming append of `len` bytes in chunks; committed, or aborted
    /// after half of it.
    fn stream(&mut self, log: &Log, len: usize, commit: bool) -> Result<u64> {
        let f = self.frame(len);
        let mut p = log.begin(None, f.kind, &f.meta, len as u64)?;
        let seq = p.seq();
        assert_eq!(seq, self.next);
        self.tried_at(seq, &f);
        let upto = if commit { len } else { len / 2 };
        for chunk in f.blob[..upto].chunks(200) {
            p.write(chunk)?;
        }
        if !commit {
            p.abort()?;
            return Ok(seq);
        }
        p.commit()?;
        self.acked.insert(seq, f);
        self.next += 1;
        Ok(seq)
    }

    fn appends(&mut self, log: &Log, count: usize) -> Result<()> {
        for _ in 0..count {
            let len = (self.made as usize * 131) % 300;
            self.append(log, len)?;
        }
        Ok(())
    }
}

/// Appends, a streaming append larger than a segment, staged frames synced
/// at once, a group commit, an aborted streaming append, a reopen, a
/// truncation, an erase and a restart; stops at the first error.
fn workload(fs: &SimStorage, j: &mut Journal) -> Result<()> {
    let mut log = open_sim(fs, WORK_SEGMENT)?;
    j.next = log.head_seq() + 1;
    j.appends(&log, 8)?;
    j.stream(&log, 1500, true)?;

    let mut staged = Vec::new();
    for _ in 0..3 {
        let f = j.frame(120);
        j.tried_at(j.next, &f);
        let seq = log.stage_raw(f.kind, &f.meta, &f.blob)?;
        assert_eq!(seq, j.next);
        j.next += 1;
        staged.push((seq, f));
    }
    log.sync_through(j.next - 1)?;
    j.acked.extend(staged);

    let mut grouped = Vec::new();
    for _ in 0..2 {
        let f = j.frame(90);
        let mut p = log.begin(None, f.kind, &f.meta, f.blob.len() as u64)?;
        j.tried_at(p.seq(), &f);
        p.write(&f.blob)?;
        let seq = p.commit_unsynced()?;
        j.next = seq + 1;
        grouped.push((seq, f));
    }
    assert_eq!(log.sync()?, j.next - 1);
    j.acked.extend(grouped);

    j.stream(&log, 700, false)?;
    drop(log);
    log = open_sim(fs, WORK_SEGMENT)?;
    assert_eq!(log.head_seq(), j.next - 1);
    j.appends(&log, 5)?;

    j.truncate = Step::Tried;
    j.truncated_to = log.truncate_before(TRUNCATE_BELOW)?;
    j.truncate = Step::Acked;
    j.appends(&log, 3)?;

    j.erase_before = j.next - 2;
    j.erase = Step::Tried;
    log.erase(j.erase_before, &[ERASED_REPO.to_string()])?;
    j.erase = Step::Acked;
    j.appends(&log, 3)?;

    j.restart_at = j.next + RESTART_GAP;
    j.restart = Step::Tried;
    log.restart_after(j.restart_at)?;
    j.restart = Step::Acked;
    j.next = j.restart_at + 1;
    j.appends(&log, 3)?;
    j.stream(&log, 400, true)?;
    Ok(())
}

/// Reopen after a crash and check the log against what the run was told.
fn check_after_crash(fs: &SimStorage, j: &Journal, full: &Journal, what: &str) {
    let log = open_sim(fs, WORK_SEGMENT).unwrap_or_else(|e| panic!("{what}: reopen: {e}"));
    let (first, head) = (log.first_seq(), log.head_seq());
    let restarted = j.restart != Step::Untried && first == full.restart_at + 1;
    if j.restart == Step::Acked {
        assert!(restarted, "{what}: an acknowledged restart was undone");
    }
    if restarted {
        assert!(head >= full.restart_at, "{what}");
    } else {
        match j.truncate {
            Step::Acked => assert_eq!(first, full.truncated_to, "{what}"),
            Step::Tried => assert!(first == 1 || first == full.truncated_to, "{what}"),
            Step::Untried => assert_eq!(first, 1, "{what}"),
        }
    }
    let erased = |seq: u64, f: &Frame| seq < full.erase_before && f.erasable_by(ERASED_REPO);
    // Every acknowledged frame the workload did not drop itself.
    for (&seq, f) in j.acked.range(first..) {
        assert!(seq <= head, "{what}: acknowledged {seq} lost, head {head}");
        let got = read_frame(&log, seq);
        if j.erase == Step::Acked && erased(seq, f) {
            assert_eq!(got, f.erased(), "{what}: frame {seq} not erased");
        } else if j.erase == Step::Tried && erased(seq, f) {
            assert!(got == *f || got == f.erased(), "{what}: frame {seq}");
        } else {
            assert_eq!(&got, f, "{what}: acknowledged frame {seq}");
        }
    }
    // Every frame there is one the workload wrote at that number.
    for seq in first..=head {
        let got = read_frame(&log, seq);
        let candidates = j
            .tried
            .get(&seq)
            .unwrap_or_else(|| panic!("{what}: frame {seq} was never written"));
        let known = candidates.iter().any(|f| {
            got == *f || (j.erase != Step::Untried && erased(seq, f) && got == f.erased())
        });
        assert!(known, "{what}: frame {seq} is none of the frames written");
    }
    let all = log.range(first, head).expect("range");
    assert_eq!(all.len() as u64, head + 1 - first, "{what}");

    let extra = Frame::new(Kind::Refs, "z", head, 77);
    assert_eq!(extra.append(&log).expect("append after crash"), head + 1);
    drop(log);
    let log = open_sim(fs, WORK_SEGMENT).expect("reopen after append");
    assert_eq!(log.head_seq(), head + 1, "{what}");
    assert_eq!(read_frame(&log, head + 1), extra, "{what}");
}

/// A power cut at any sync of any operation (open, append, streaming
/// append, group commit, roll, truncation, erase, restart) loses no
/// acknowledged frame, brings back no frame that was not written at its
/// number, leaves every frame's crc whole, and the log takes further
/// appends; with only synced bytes kept, and with a prefix of the unsynced.
#[test]
fn crash_at_every_sync_keeps_every_acknowledged_frame() {
    let fs = SimStorage::new();
    let mut full = Journal::default();
    workload(&fs, &mut full).expect("the workload runs without faults");
    let total = fs.syncs();
    assert!(total > 40, "only {total} syncs");
    fs.crash(CrashMode::LoseUnsynced);
    check_after_crash(&fs, &full, &full, "after the whole workload");

    for k in 1..=total {
        for mode in [CrashMode::LoseUnsynced, CrashMode::KeepPrefix(k)] {
            let what = format!("crash at sync {k} of {total}, {mode:?}");
            let fs = SimStorage::new();
            fs.crash_at_sync(k);
            let mut j = Journal::default();
            let ran = workload(&fs, &mut j);
            assert!(fs.has_crashed(), "{what}: no crash");
            assert!(ran.is_err(), "{what}: the workload ran through a crash");
            fs.crash(mode);
            check_after_crash(&fs, &j, &full, &what);
        }
    }
}

/// A process that dies at any failed write or fsync of the workload, then a
/// reopen in the same boot, then an append, then a power cut: every frame the
/// reopened log served (and the one it acknowledged) is still there, and
/// every acknowledged frame of the workload too.
#[test]
fn failure_then_reopen_then_power_cut_keeps_every_frame_served() {
    let fs = SimStorage::new();
    let mut full = Journal::default();
    workload(&fs, &mut full).expect("the workload runs without faults");
    let (syncs, writes) = (fs.syncs(), fs.writes());
    let mut lost = Vec::new();
    for fsync in [true, false] {
        for k in 1..=if fsync { syncs } else { writes } {
            let what = format!("{} {k} fails", if fsync { "fsync" } else { "write" });
            let fs = SimStorage::new();
            if fsync {
                fs.fail_sync_in(k);
            } else {
                fs.fail_write_in(k);
            }
            let mut j = Journal::default();
            assert!(workload(&fs, &mut j).is_err(), "{what}: no failure");
            // The process dies and comes back: the page cache stays.
            let log = open_sim(&fs, WORK_SEGMENT).unwrap_or_else(|e| panic!("{what}: {e}"));
            let (first, head) = (log.first_seq(), log.head_seq());
            let served: Vec<Frame> = (first..=head).map(|s| read_frame(&log, s)).collect();
            let extra = Frame::new(Kind::Refs, "z", k, 50);
            assert_eq!(extra.append(&log).expect("append"), head + 1, "{what}");
            drop(log);
            fs.crash(CrashMode::LoseUnsynced);
            let log = open_sim(&fs, WORK_SEGMENT).unwrap_or_else(|e| panic!("{what}: {e}"));
            // An erase that failed may have rewritten headers the reopened
            // log served as erased, and that a power cut then takes back:
            // the erase was never acknowledged, and the next one redoes it.
            let same = |s: u64, e: Entry| {
                let (got, was) = (Frame::of(&e), &served[(s - first) as usize]);
                got == *was || (j.erase == Step::Tried && got.erased() == *was)
            };
            let kept = log.head_seq() > head
                && log.first_seq() == first
                && (first..=head).all(|s| log.read(s).is_ok_and(|e| same(s, e)))
                && log.read(head + 1).is_ok_and(|e| Frame::of(&e) == extra);
            if !kept {
                lost.push(format!(
                    "{what}: served {first}..={head} and appended {}, a power cut left {}..={}",
                    head + 1,
                    log.first_seq(),
                    log.head_seq()
                ));
                continue;
            }
            drop(log);
            j.tried_at(head + 1, &extra);
            j.acked.insert(head + 1, extra);
            check_after_crash(&fs, &j, &full, &what);
        }
    }
    assert!(
        lost.is_empty(),
        "{} cases lost frames: {lost:#?}",
        lost.len()
    );
}

/// A frame that open finds and publishes must be durable: a process that
/// died between staging a frame and its fdatasync leaves the frame in the
/// page cache only; if the next open hands it out as committed, a power cut
/// must not take it back (else a reader or twin holds a frame the log then
/// gives another content under the same number).
#[test]
fn open_makes_the_frames_it_publishes_durable() {
    let fs = SimStorage::new();
    let log = open_sim(&fs, 4096).expect("open");
    log.append_raw(2, b"", b"synced").expect("append");
    log.stage_raw(2, b"", b"staged, never synced")
        .expect("stage");
    drop(log);
    let log = open_sim(&fs, 4096).expect("reopen");
    let published = log.head_seq();
    let seen = log.read(published).expect("read").blob;
    drop(log);
    fs.crash(CrashMode::LoseUnsynced);
    let log = open_sim(&fs, 4096).expect("reopen after power cut");
    assert!(
        log.head_seq() >= published,
        "open published {published} ({:?}), a power cut took the head back to {}",
        String::from_utf8_lossy(&seen),
        log.head_seq()
    );
}

/// A damaged header of the last segment must not make open silently delete
/// a segment full of acknowledged frames: open treats a bad header there as
/// a half-made segment from a crashed roll, which never holds a frame.
#[test]
fn damaged_last_segment_header_is_not_silently_dropped() {
    let fs = SimStorage::new();
    let log = open_sim(&fs, 4096).expect("open");
    for i in 0..5u64 {
        log.append_raw(2, b"", &bytes(i, 100)).expect("append");
    }
    drop(log);
    let seg = format::segment_path(sim_dir(), 1);
    let mut b = fs.read_file(&seg).expect("segment");
    b[format::SEG_CAPACITY_OFFSET] ^= 0x01;
    fs.write_file(&seg, &b);
    match open_sim(&fs, 4096) {
        Err(_) => {}
        Ok(log) => assert_eq!(
            log.head_seq(),
            5,
            "five acknowledged frames dropped: {:?}",
            log.recovery()
        ),
    }
}

// ---------------------------------------------------------------------------
// 5: injected write and fsync failures, a full disk
// ---------------------------------------------------------------------------

fn assert_poisoned(log: &Log, what: &str) {
    let r = log.append_raw(2, b"", b"after");
    assert!(matches!(r, Err(Error::Poisoned(_))), "{what}: append {r:?}");
    let r = log.stage_raw(2, b"", b"after");
    assert!(matches!(r, Err(Error::Poisoned(_))), "{what}: stage {r:?}");
    let r = log.begin(None, 2, b"", 5).map(|p| p.seq());
    assert!(matches!(r, Err(Error::Poisoned(_))), "{what}: begin {r:?}");
    let r = log.sync();
    assert!(matches!(r, Err(Error::Poisoned(_))), "{what}: sync {r:?}");
    let r = log.erase(u64::MAX, &["r".to_string()]);
    assert!(matches!(r, Err(Error::Poisoned(_))), "{what}: erase {r:?}");
    let r = log.truncate_before(2);
    assert!(
        matches!(r, Err(Error::Poisoned(_))),
        "{what}: truncate {r:?}"
    );
}

/// Appends until one fails; answers the frames acknowledged and the error.
fn append_until_error(log: &Log, upto: u64) -> (Vec<(u64, Frame)>, Error) {
    let mut acked = Vec::new();
    for i in 0..upto {
        let f = Frame::new(Kind::Pack, "r", i, (i as usize * 89) % 400);
        let r = if i % 4 == 3 {
            // Some through a streaming append.
            log.begin(None, f.kind, &f.meta, f.blob.len() as u64)
                .and_then(|mut p| {
                    p.write(&f.blob)?;
                    p.commit()
                })
        } else {
            f.append(log)
        };
        match r {
            Ok(seq) => acked.push((seq, f)),
            Err(e) => return (acked, e),
        }
    }
    panic!("no append failed in {upto}");
}

/// Reopen on the same disk: no poison, every acknowledged frame intact, and
/// appends work and survive a power cut.
fn check_reopened(fs: &SimStorage, acked: &[(u64, Frame)], what: &str) {
    let log = open_sim(fs, SEALED_SEGMENT).unwrap_or_else(|e| panic!("{what}: reopen: {e}"));
    assert!(log.poisoned_by().is_none(), "{what}");
    for (seq, f) in acked {
        assert_eq!(&read_frame(&log, *seq), f, "{what}");
    }
    let head = log.head_seq();
    assert!(head >= acked.last().map_or(0, |(s, _)| *s), "{what}");
    assert_eq!(log.append_raw(2, b"", b"next").expect("append"), head + 1);
    drop(log);
    let log = open_sim(fs, SEALED_SEGMENT).expect("reopen after append");
    assert_eq!(log.head_seq(), head + 1, "{what}");
    assert_eq!(log.read(head + 1).expect("read").blob, b"next", "{what}");
}

/// After a failure and a reopen, what the reopened log acknowledges is
/// durable: a power cut keeps the frames acknowledged before the failure and
/// the one appended after the reopen. Answers what was lost.
fn power_cut_after_reopen(fs: &SimStorage, acked: &[(u64, Frame)]) -> Result<(), String> {
    let log = open_sim(fs, SEALED_SEGMENT).map_err(|e| format!("reopen: {e}"))?;
    let head = log.head_seq();
    let seq = log
        .append_raw(2, b"", b"next")
        .map_err(|e| format!("append: {e}"))?;
    drop(log);
    fs.crash(CrashMode::LoseUnsynced);
    let log = open_sim(fs, SEALED_SEGMENT).map_err(|e| format!("reopen after power cut: {e}"))?;
    if log.head_seq() < seq {
        return Err(format!(
            "{seq}, acknowledged after the reopen at head {head}, lost; files {:?}",
            fs.files()
        ));
    }
    for (seq, f) in acked {
        if log.read(*seq).map(|e| Frame::of(&e)).ok().as_ref() != Some(f) {
            return Err(format!("acknowledged frame {seq} lost"));
        }
    }
    Ok(())
}

/// The n-th write or fsync fails (a frame, an index entry, a roll's seal or
/// new segment): the call that hit it fails with the I/O error, the log is
/// poisoned with a reason naming it and refuses every later write, frames
/// committed before still read, and a reopen clears the poison.
#[test]
fn injected_failures_poison_the_log_until_reopened() {
    for n in 1..=25 {
        for fsync in [false, true] {
            let what = format!("{} {n} fails", if fsync { "fsync" } else { "write" });
            let fs = SimStorage::new();
            let log = open_sim(&fs, SEALED_SEGMENT).expect("open");
            if fsync {
                fs.fail_sync_in(n);
            } else {
                fs.fail_write_in(n);
            }
            let (acked, err) = append_until_error(&log, 200);
            assert!(matches!(err, Error::Io(_)), "{what}: {err:?}");
            let reason = log
                .poisoned_by()
                .unwrap_or_else(|| panic!("{what}: not poisoned"));
            assert!(reason.contains("injected"), "{what}: {reason}");
            assert_poisoned(&log, &what);
            for (seq, f) in &acked {
                assert_eq!(&read_frame(&log, *seq), f, "{what}");
            }
            drop(log);
            check_reopened(&fs, &acked, &what);
        }
    }
}

/// A failed roll (its new segment created, the directory never synced),
/// then a reopen in the same boot: the reopened log adopts the new segment
/// and must make its name durable before it acknowledges a frame in it, or
/// a power cut takes the acknowledged frame away with the name.
#[test]
fn power_cut_after_a_failure_and_reopen_keeps_what_was_acknowledged() {
    let mut failed = Vec::new();
    for n in 1..=25 {
        for fsync in [false, true] {
            let what = format!("{} {n} fails", if fsync { "fsync" } else { "write" });
            let fs = SimStorage::new();
            let log = open_sim(&fs, SEALED_SEGMENT).expect("open");
            if fsync {
                fs.fail_sync_in(n);
            } else {
                fs.fail_write_in(n);
            }
            let (acked, _) = append_until_error(&log, 200);
            let reason = log.poisoned_by().unwrap_or_default();
            drop(log);
            if let Err(lost) = power_cut_after_reopen(&fs, &acked) {
                failed.push(format!("{what} ({reason}): {lost}"));
            }
        }
    }
    assert!(failed.is_empty(), "acknowledged frames lost: {failed:#?}");
}

/// A full disk (ENOSPC at a frame, a roll's preallocation...) poisons the
/// log like any failed write, naming the cause; once space is back a reopen
/// goes on.
#[test]
fn full_disk_poisons_the_log_until_reopened() {
    let mut recovered_in_place = 0;
    for budget in [0u64, 100, 700, 1500, 3000, 5000, 9000] {
        let what = format!("disk full after {budget} bytes");
        let fs = SimStorage::new();
        let log = open_sim(&fs, SEALED_SEGMENT).expect("open");
        fs.fill_disk_after(budget);
        let (acked, err) = append_until_error(&log, 500);
        match &err {
            Error::Io(e) => assert_eq!(e.raw_os_error(), Some(libc::ENOSPC), "{what}: {e}"),
            other => panic!("{what}: {other:?}"),
        }
        match log.poisoned_by() {
            Some(reason) => {
                assert!(reason.contains("No space left"), "{what}: {reason}");
                assert_poisoned(&log, &what);
            }
            None => {
                // Out of space creating a segment: nothing was half
                // written, so the log refuses appends until space returns,
                // and takes them again without a restart.
                recovered_in_place += 1;
                let r = log.append_raw(2, b"", b"still full");
                assert!(
                    matches!(&r, Err(Error::Io(e)) if e.raw_os_error() == Some(libc::ENOSPC)),
                    "{what}: {r:?}"
                );
                assert!(log.poisoned_by().is_none(), "{what}");
                fs.fill_disk_after(u64::MAX);
                let seq = log.append_raw(2, b"", b"space again").expect("append");
                assert_eq!(seq, acked.last().map_or(0, |(s, _)| *s) + 1, "{what}");
                for (seq, f) in &acked {
                    assert_eq!(&read_frame(&log, *seq), f, "{what}");
                }
            }
        }
        drop(log);
        fs.fill_disk_after(u64::MAX);
        check_reopened(&fs, &acked, &what);
    }
    assert!(
        recovered_in_place > 0,
        "some budget runs out at a segment's creation"
    );
}

/// A failed fdatasync is never retried into a success: the pages it failed
/// to write may be gone, so a later sync saying Ok would acknowledge lost
/// data. Staged frames, group commits and streaming appends alike.
#[test]
fn failed_fsync_is_never_retried() {
    let fs = SimStorage::new();
    let log = open_sim(&fs, 4096).expect("open");
    log.append_raw(2, b"", b"one").expect("append");
    let seq = log.stage_raw(2, b"", b"two").expect("stage");
    fs.fail_sync_in(1);
    let r = log.sync_through(seq);
    assert!(matches!(r, Err(Error::Io(_))), "{r:?}");
    for _ in 0..3 {
        let r = log.sync_through(seq);
        assert!(matches!(r, Err(Error::Poisoned(_))), "{r:?}");
        assert!(log.sync().is_err());
    }
    assert_eq!(log.head_seq(), 1);
    assert!(matches!(log.read(seq), Err(Error::PastHead { .. })));
    assert_eq!(log.read(1).expect("read").blob, b"one");
    drop(log);

    let log = open_sim(&fs, 4096).expect("reopen");
    let head = log.head_seq();
    let mut p = log.begin(None, 2, b"m", 3).expect("begin");
    p.write(b"abc").expect("write");
    let seq = p.commit_unsynced().expect("commit");
    fs.fail_sync_in(1);
    assert!(log.sync().is_err());
    assert!(log.sync().is_err());
    assert!(matches!(log.sync_through(seq), Err(Error::Poisoned(_))));
    assert_eq!(log.head_seq(), head);
    drop(log);

    let log = open_sim(&fs, 4096).expect("reopen");
    let head = log.head_seq();
    let mut p = log.begin(None, 2, b"", 3).expect("begin");
    p.write(b"xyz").expect("write");
    fs.fail_sync_in(1);
    assert!(matches!(p.commit(), Err(Error::Io(_))));
    assert!(log.sync().is_err());
    assert!(matches!(
        log.sync_through(head + 1),
        Err(Error::Poisoned(_))
    ));
    assert_eq!(log.head_seq(), head);
}

// ---------------------------------------------------------------------------
// 6: group commit under real concurrency
// ---------------------------------------------------------------------------

/// Whether `dir` is on a file system whose fdatasync costs nothing (tmpfs,
/// ramfs): there, a leader is done before anyone else has staged a frame,
/// and there is nothing to batch.
fn on_memory_fs(dir: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let mut path = dir.as_os_str().as_bytes().to_vec();
    path.push(0);
    // SAFETY: statfs is plain old data, for which all zeros is a value.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: statfs reads the NUL-terminated path and writes one struct
    // that lives across the call.
    let ret = unsafe { libc::statfs(path.as_ptr().cast(), &mut st) };
    const TMPFS_MAGIC: i64 = 0x0102_1994;
    const RAMFS_MAGIC: i64 = 0x8584_58f6;
    ret == 0 && matches!(st.f_type as i64, TMPFS_MAGIC | RAMFS_MAGIC)
}

/// The real file system with a disk's floor under every fdatasync, for a
/// directory on tmpfs (see [`on_memory_fs`]).
#[derive(Debug)]
struct DiskLatency(Arc<dyn Storage>);

#[derive(Debug)]
struct DiskLatencyFile(Arc<dyn StorageFile>);

const DISK_SYNC: std::time::Duration = std::time::Duration::from_micros(200);

impl Storage for DiskLatency {
    fn open(&self, path: &Path, mode: OpenMode) -> std::io::Result<Arc<dyn StorageFile>> {
        Ok(Arc::new(DiskLatencyFile(self.0.open(path, mode)?)))
    }
    fn remove(&self, path: &Path) -> std::io::Result<()> {
        self.0.remove(path)
    }
    fn rename(&self, from: &Path, to: &Path) -> std::io::Result<()> {
        self.0.rename(from, to)
    }
    fn sync_dir(&self, dir: &Path) -> std::io::Result<()> {
        self.0.sync_dir(dir)
    }
    fn list(&self, dir: &Path) -> std::io::Result<Vec<String>> {
        self.0.list(dir)
    }
    fn create_dir_all(&self, dir: &Path) -> std::io::Result<()> {
        self.0.create_dir_all(dir)
    }
    fn lock(&self, path: &Path) -> std::io::Result<Box<dyn std::any::Any + Send + Sync>> {
        self.0.lock(path)
    }
    fn exists(&self, path: &Path) -> std::io::Result<bool> {
        self.0.exists(path)
    }
}

impl StorageFile for DiskLatencyFile {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<usize> {
        self.0.read_at(buf, offset)
    }
    fn write_all_at(&self, buf: &[u8], offset: u64) -> std::io::Result<()> {
        self.0.write_all_at(buf, offset)
    }
    fn sync_data(&self) -> std::io::Result<()> {
        // The disk's latency is what this storage simulates, not a wait.
        std::thread::sleep(DISK_SYNC);
        self.0.sync_data()
    }
    fn sync_all(&self) -> std::io::Result<()> {
        std::thread::sleep(DISK_SYNC);
        self.0.sync_all()
    }
    fn len(&self) -> std::io::Result<u64> {
        self.0.len()
    }
    fn set_len(&self, len: u64) -> std::io::Result<()> {
        self.0.set_len(len)
    }
    fn allocate(&self, offset: u64, len: u64) -> std::io::Result<()> {
        self.0.allocate(offset, len)
    }
    fn punch(&self, offset: u64, len: u64) -> std::io::Result<()> {
        self.0.punch(offset, len)
    }
}

/// Eight threads appending at once share fdatasyncs: at most one per two
/// frames (a slower machine only batches more), and every frame lands once.
#[test]
fn concurrent_appends_share_fsyncs() {
    const THREADS: u64 = 8;
    const EACH: u64 = 200;
    // The target directory is on a real disk more often than /tmp.
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("tempdir");
    let storage: Option<Arc<dyn Storage>> = on_memory_fs(dir.path())
        .then(|| Arc::new(DiskLatency(StdStorage::shared())) as Arc<dyn Storage>);
    let opts = OpenOptions {
        storage,
        ..OpenOptions::default()
    };
    let log = Log::open_opts(dir.path(), opts).expect("open");
    std::thread::scope(|s| {
        for t in 0..THREADS {
            let log = &log;
            s.spawn(move || {
                for i in 0..EACH {
                    log.append_raw(Kind::App(0x8000).as_u16(), b"", &tagged(t * 1000 + i))
                        .expect("append");
                }
            });
        }
    });
    let frames = THREADS * EACH;
    assert_eq!(log.head_seq(), frames);
    let syncs = log.frame_syncs();
    assert!(
        syncs <= frames / 2,
        "{syncs} fdatasyncs for {frames} frames"
    );
    let mut seen = std::collections::HashSet::new();
    for e in log.range(1, frames).expect("range") {
        let id = u64::from_le_bytes(e.blob[..8].try_into().expect("8 bytes"));
        assert_eq!(e.blob, tagged(id), "frame {}", e.seq);
        assert!(seen.insert(id), "frame {id} twice");
    }
    assert_eq!(seen.len() as u64, frames);
}

/// 128 bytes that name `id` in their first eight.
fn tagged(id: u64) -> Vec<u8> {
    let mut b = bytes(id, 128);
    b[..8].copy_from_slice(&id.to_le_bytes());
    b
}

// ---------------------------------------------------------------------------
// 7: a blob in pieces, damaged or resumed
// ---------------------------------------------------------------------------

/// Why a piece reader stopped early.
#[derive(Debug)]
enum Stop {
    Log(Error),
    Enough,
}

impl From<Error> for Stop {
    fn from(e: Error) -> Self {
        Stop::Log(e)
    }
}

/// Every call a piece reader got: the piece and whether it was the last.
type Calls = Vec<(Vec<u8>, bool)>;

fn pieces(log: &Log, seq: u64, from: u64, piece: usize) -> (Calls, Result<Located>) {
    let mut got = Vec::new();
    let r = log.read_pieces_from(seq, from, piece, |_, p, last| {
        got.push((p.to_vec(), last));
        Ok::<(), Error>(())
    });
    (got, r)
}

fn flip_on_disk(path: &Path, at: u64) {
    use std::os::unix::fs::FileExt;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .expect("open segment");
    let mut b = [0u8; 1];
    f.read_exact_at(&mut b, at).expect("read byte");
    b[0] ^= 0x20;
    f.write_all_at(&b, at).expect("write byte");
}

/// `read_pieces` hands over every piece of a damaged blob but the last,
/// then `Corrupt`; `read_pieces_from` resumes anywhere in a blob with the
/// stored crc for the receiver to check over the whole, gives one empty last
/// piece at the end and refuses past it; an erased frame is one empty piece
/// and cannot be resumed.
#[test]
fn read_pieces_over_damaged_resumed_and_erased_blobs() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = Log::open_with(dir.path(), 4096).expect("open");
    let big = |seed| Frame::new(Kind::LfsPut, "a", seed, 3500);
    let sealed = big(1).append(&log).expect("append");
    let erased = Frame::new(Kind::Pack, "gone", 2, 300)
        .append(&log)
        .expect("append");
    let empty = Frame::new(Kind::Refs, "a", 3, 0)
        .append(&log)
        .expect("append");
    let open = big(4).append(&log).expect("append");
    let layout = log.layout();
    assert!(layout.len() >= 2, "{layout:?}");
    let (open_first, _, _) = *layout.last().expect("a segment");
    assert!(sealed < open_first && open >= open_first, "{layout:?}");

    for (seq, f) in [(sealed, big(1)), (open, big(4))] {
        let len = f.blob.len() as u64;
        let (whole, r) = pieces(&log, seq, 0, 1000);
        let loc = r.expect("read_pieces_from 0");
        assert_eq!(loc.payload_crc, format::payload_crc(&f.meta, &f.blob));
        let mut same = Vec::new();
        log.read_pieces(seq, 1000, |_, p, last| {
            same.push((p.to_vec(), last));
            Ok::<(), Error>(())
        })
        .expect("read_pieces");
        assert_eq!(whole, same, "from 0 is read_pieces");
        assert_eq!(whole.concat_blob(), f.blob);
        assert_eq!(whole.iter().filter(|(_, last)| *last).count(), 1);
        assert!(whole.last().expect("pieces").1);

        // A receiver holding the first 1234 bytes resumes there.
        let mut first = Vec::new();
        let r = log.read_pieces(seq, 1234, |_, p, _| {
            first.extend_from_slice(p);
            Err(Stop::Enough)
        });
        match r {
            Err(Stop::Enough) => {}
            Err(Stop::Log(e)) => panic!("first part: {e}"),
            Ok(loc) => panic!("a reader that stopped read to the end: {loc:?}"),
        }
        let (rest, r) = pieces(&log, seq, 1234, 500);
        let loc = r.expect("resume");
        assert_eq!(loc.payload_crc, format::payload_crc(&f.meta, &f.blob));
        let assembled = [first.clone(), rest.concat_blob()].concat();
        assert_eq!(assembled, f.blob);
        assert_eq!(format::payload_crc(&loc.meta, &assembled), loc.payload_crc);

        let (end, r) = pieces(&log, seq, len, 500);
        r.expect("at the end");
        assert_eq!(end, vec![(Vec::new(), true)]);
        let (past, r) = pieces(&log, seq, len + 1, 500);
        assert!(past.is_empty());
        match r {
            Err(Error::Io(e)) => {
                assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput);
                let msg = e.to_string();
                assert!(msg.contains(&(len + 1).to_string()), "{msg}");
                assert!(msg.contains(&len.to_string()), "{msg}");
            }
            other => panic!("past the end: {other:?}"),
        }

        // Damage a byte of the blob past the resume point.
        flip_on_disk(&loc.segment, loc.blob_offset + 2500);
        let (got, r) = pieces(&log, seq, 0, 1000);
        assert!(matches!(r, Err(Error::Corrupt(_))), "{r:?}");
        assert_eq!(got.len(), 3, "every piece but the last");
        assert!(got.iter().all(|(p, last)| p.len() == 1000 && !last));
        assert!(matches!(log.read(seq), Err(Error::Corrupt(_))));
        let (rest, r) = pieces(&log, seq, 1234, 500);
        let loc = r.expect("a resumed read is unchecked");
        let assembled = [first, rest.concat_blob()].concat();
        assert_ne!(format::payload_crc(&loc.meta, &assembled), loc.payload_crc);
    }

    let (got, r) = pieces(&log, empty, 0, 100);
    r.expect("empty blob");
    assert_eq!(got, vec![(Vec::new(), true)]);

    log.erase(erased + 1, &["gone".to_string()]).expect("erase");
    let mut calls = Vec::new();
    let loc = log
        .read_pieces(erased, 100, |_, p, last| {
            calls.push((p.to_vec(), last));
            Ok::<(), Error>(())
        })
        .expect("erased");
    assert!(loc.is_erased());
    assert_eq!(calls, vec![(Vec::new(), true)]);
    let (got, r) = pieces(&log, erased, 5, 100);
    assert!(got.is_empty());
    match r {
        Err(Error::Io(e)) => assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput),
        other => panic!("resume in an erased frame: {other:?}"),
    }
}

trait ConcatBlob {
    fn concat_blob(&self) -> Vec<u8>;
}

impl ConcatBlob for Calls {
    fn concat_blob(&self) -> Vec<u8> {
        self.iter().flat_map(|(p, _)| p.iter().copied()).collect()
    }
}

// ---------------------------------------------------------------------------
// 8: erase
// ---------------------------------------------------------------------------

const MARK: &[u8] = b"<<erase-me-7f3a91>>";
const ERASE_SEGMENT: u64 = 2048;
const ERASE_BEFORE: u64 = 36;

/// Frames of repos "a" and "b" and "a"'s RepoStore frames, interleaved;
/// "a"'s data frames before [`ERASE_BEFORE`] carry [`MARK`].
fn erase_frames() -> Vec<Frame> {
    const KINDS: [Kind; 4] = [Kind::Pack, Kind::Refs, Kind::LfsPut, Kind::LfsDelete];
    (1..=45u64)
        .map(|seq| {
            let (kind, repo) = match seq % 3 {
                0 => (KINDS[(seq / 3) as usize % 4], "a"),
                1 => (KINDS[(seq / 3) as usize % 4], "b"),
                _ if seq % 5 == 0 => (Kind::RepoStore, "a"),
                _ => (Kind::Refs, "ab"),
            };
            let mut f = Frame::new(kind, repo, seq, 40 + (seq as usize * 71) % 300);
            if f.erasable_by("a") && seq < ERASE_BEFORE {
                let at = f.blob.len() / 3;
                f.blob.splice(at..at, MARK.iter().copied());
            }
            f
        })
        .collect()
}

fn erase_targets(frames: &[Frame]) -> Vec<u64> {
    (1..ERASE_BEFORE)
        .filter(|&seq| frames[seq as usize - 1].erasable_by("a"))
        .collect()
}

fn assert_erased(log: &Log, frames: &[Frame], what: &str) {
    let targets = erase_targets(frames);
    for (i, f) in frames.iter().enumerate() {
        let seq = i as u64 + 1;
        let want = if targets.contains(&seq) {
            f.erased()
        } else {
            f.clone()
        };
        assert_eq!(read_frame(log, seq), want, "{what}: frame {seq}");
    }
}

/// Erase rewrites exactly "a"'s data frames before `before` as Redacted with
/// no blob, in two syncs per segment touched, leaves every other frame, the
/// numbers and the layout alone, leaves no byte of the erased blobs in any
/// file, and is idempotent.
#[test]
fn erase_redacts_one_repos_data_and_leaves_no_byte_of_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let frames = erase_frames();
    let log = Log::open_with(dir.path(), ERASE_SEGMENT).expect("open");
    for f in &frames {
        f.append(&log).expect("append");
    }
    let targets = erase_targets(&frames);
    assert!(targets.len() >= 8, "{targets:?}");
    let layout = log.layout();
    let touched = layout
        .iter()
        .filter(|(first, last, _)| targets.iter().any(|t| first <= t && t <= last))
        .count() as u64;
    assert!(touched >= 2, "{layout:?}");
    let (head, first) = (log.head_seq(), log.first_seq());
    let syncs = log.erase_syncs();

    let done = log.erase(ERASE_BEFORE, &["a".to_string()]).expect("erase");
    assert_eq!(done.frames, targets.len() as u64);
    assert_eq!(done.punched, targets.len() as u64);
    let body_bytes: u64 = targets
        .iter()
        .map(|&s| {
            let f = &frames[s as usize - 1];
            (f.meta.len() + f.blob.len()) as u64
        })
        .sum();
    assert_eq!(done.bytes, body_bytes);
    assert_eq!(done.segments, touched);
    assert_eq!(log.erase_syncs() - syncs, 3 * touched);
    // Nothing of an erased frame is served: no meta, and the crc of the
    // zeros its bytes now are, not of what they were.
    for &seq in &targets {
        let e = log.read(seq).expect("read");
        let f = &frames[seq as usize - 1];
        let len = (f.meta.len() + f.blob.len()) as u64;
        assert_eq!(
            e.payload_crc,
            twinlog::log::format::crc_of_zeros(len),
            "frame {seq}"
        );
        assert!(e.meta.is_empty());
    }
    assert_eq!((log.head_seq(), log.first_seq()), (head, first));
    assert_eq!(log.layout(), layout);
    assert_erased(&log, &frames, "after erase");
    let files_hold_mark = |dir: &Path| {
        std::fs::read_dir(dir)
            .expect("list")
            .map(|e| e.expect("entry").path())
            .filter(|p| contains(&std::fs::read(p).expect("read file"), MARK))
            .collect::<Vec<_>>()
    };
    assert!(files_hold_mark(dir.path()).is_empty());

    let again = log
        .erase(ERASE_BEFORE, &["a".to_string()])
        .expect("erase again");
    assert_eq!(again.frames, 0, "{again:?}");
    assert_eq!(again.segments, 0, "a finished erase is not redone");
    assert_erased(&log, &frames, "after a second erase");
    assert_eq!(log.append_raw(2, b"", b"next").expect("append"), head + 1);
    drop(log);

    let log = Log::open_with(dir.path(), ERASE_SEGMENT).expect("reopen");
    assert!(log.recovery().cut.is_none(), "{:?}", log.recovery());
    assert_eq!(log.head_seq(), head + 1);
    assert_erased(&log, &frames, "after reopen");
    assert!(files_hold_mark(dir.path()).is_empty());
}

/// A power cut inside an erase, at its punch sync or at the sync of its
/// scrubbed headers, leaves erased frames (never a frame failing its crc,
/// and none that serves its meta or old crc), maybe with the bytes still on
/// disk or the meta's length still in the header; the next erase after
/// reopen finishes both, whichever repository it names.
#[test]
fn erase_cut_between_its_steps_is_finished_by_the_next() {
    let frames = erase_frames();
    let targets = erase_targets(&frames);
    for (crash_sync, mode) in [
        (2, CrashMode::LoseUnsynced),
        (2, CrashMode::KeepPrefix(7)),
        (3, CrashMode::LoseUnsynced),
        (3, CrashMode::KeepPrefix(7)),
    ] {
        let what = format!("crash at sync {crash_sync}, {mode:?}");
        let fs = SimStorage::new();
        let log = open_sim(&fs, ERASE_SEGMENT).expect("open");
        for f in &frames {
            f.append(&log).expect("append");
        }
        let disk_holds_mark = |fs: &SimStorage| {
            fs.files()
                .iter()
                .any(|p| contains(&fs.read_file(p).expect("file"), MARK))
        };
        // Sync 1 makes the first segment's redacted headers durable; sync 2
        // is the fsync of its punches, sync 3 that of its scrubbed headers.
        fs.crash_at_sync(crash_sync);
        assert!(log.erase(ERASE_BEFORE, &["a".to_string()]).is_err());
        assert!(fs.has_crashed());
        drop(log);
        fs.crash(mode);
        if crash_sync == 2 && mode == CrashMode::LoseUnsynced {
            assert!(disk_holds_mark(&fs), "{what}: the punches were not lost");
        }

        let log = open_sim(&fs, ERASE_SEGMENT).expect("reopen");
        assert_eq!(log.head_seq(), frames.len() as u64, "{what}");
        let mut redacted = 0;
        for (i, f) in frames.iter().enumerate() {
            let seq = i as u64 + 1;
            let got = read_frame(&log, seq);
            if targets.contains(&seq) && got == f.erased() {
                redacted += 1;
            } else {
                assert_eq!(&got, f, "{what}: frame {seq}");
            }
        }
        assert!(redacted > 0, "{what}: the header sync was lost");
        log.range(1, u64::MAX).expect("every crc holds");

        // Another repository's erase finishes what the cut one left.
        let done = log
            .erase(ERASE_BEFORE, &["not-a".to_string()])
            .expect("erase");
        assert_eq!(done.frames, 0, "{what}");
        let done = log.erase(ERASE_BEFORE, &["a".to_string()]).expect("erase");
        assert_eq!(done.frames, targets.len() as u64 - redacted, "{what}");
        assert_erased(&log, &frames, &what);
        assert!(!disk_holds_mark(&fs), "{what}: erased bytes left on disk");
        drop(log);
        fs.crash(CrashMode::LoseUnsynced);
        let log = open_sim(&fs, ERASE_SEGMENT).expect("reopen");
        assert_erased(&log, &frames, &what);
        assert!(!disk_holds_mark(&fs), "{what}");
    }
}
