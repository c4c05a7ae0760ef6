//! `Log::truncate_after`: cutting the tail after a sequence. What stays and
//! what goes on the real file system; refusals; readers and tails around a
//! cut; the cut against streaming appends, freezes and concurrent appends; a
//! power cut at every sync and a failure at every write and sync of a cut,
//! in several layouts; and the log against a plain model.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc};

use proptest::prelude::*;
use twinlog::log::format::{self, FRAME_HEADER_LEN, SEGMENT_HEADER_LEN, TRUNCATE_FILE};
use twinlog::log::{
    CrashMode, Entry, Error, Kind, Log, Meta, OpenOptions, Result, SimStorage, Tail, Truncated,
};
use twinlog::wal::{Lsn, Wal, WalError};

// ---------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------

const SIM_DIR: &str = "/sim/log";

fn open_sim(fs: &SimStorage, segment_bytes: u64) -> Result<Log> {
    Log::open_opts(
        SIM_DIR,
        OpenOptions {
            segment_bytes,
            repair: false,
            storage: Some(Arc::new(fs.clone())),
            ..OpenOptions::default()
        },
    )
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

/// A frame as appended: kind, meta bytes, blob.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Frame {
    kind: u16,
    meta: Vec<u8>,
    blob: Vec<u8>,
}

impl Frame {
    /// The frame the test logs hold at `seq` in generation `generation`: a
    /// frame cut and written again at the same number differs from the old
    /// one in content and length.
    fn nth(seq: u64, generation: u64) -> Frame {
        const KINDS: [Kind; 4] = [Kind::Pack, Kind::Refs, Kind::LfsPut, Kind::RepoStore];
        let repo = if seq % 2 == 0 { "a" } else { "b" };
        let seed = seq * 1000 + generation;
        Frame {
            kind: KINDS[(seq % 4) as usize].as_u16(),
            meta: Meta::repo(repo).encode().expect("meta"),
            blob: bytes(seed, 40 + ((seq * 37 + generation * 11) % 150) as usize),
        }
    }

    fn append(&self, log: &Log) -> Result<u64> {
        log.append_raw(self.kind, &self.meta, &self.blob)
    }

    fn frame_len(&self) -> u64 {
        (FRAME_HEADER_LEN + self.meta.len() + self.blob.len()) as u64
    }

    fn is(&self, e: &Entry) -> bool {
        (e.kind, &e.meta, &e.blob) == (self.kind, &self.meta, &self.blob)
    }
}

fn fill(log: &Log, through: u64, generation: u64) {
    for seq in log.head_seq() + 1..=through {
        assert_eq!(
            Frame::nth(seq, generation).append(log).expect("append"),
            seq
        );
    }
}

/// Everything a reader can see of a log.
#[derive(Clone, PartialEq, Eq)]
struct State {
    head: u64,
    first: u64,
    frames: Vec<Entry>,
}

impl std::fmt::Debug for State {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "State {{ first: {}, head: {}, {} frames }}",
            self.first,
            self.head,
            self.frames.len()
        )
    }
}

/// The log as readers see it, read three ways that must agree: frame by
/// frame, as a range, and checked by `verify`.
fn state(log: &Log) -> State {
    let (first, head) = (log.first_seq(), log.head_seq());
    let frames: Vec<Entry> = (first..=head)
        .map(|seq| log.read(seq).unwrap_or_else(|e| panic!("read {seq}: {e}")))
        .collect();
    assert_eq!(log.range(first, u64::MAX).expect("range"), frames);
    assert_eq!(log.verify().expect("verify"), frames.len() as u64);
    assert!(
        matches!(log.read(head + 1), Err(Error::PastHead { .. })),
        "frame {} past the head {head} is served",
        head + 1
    );
    let layout = log.layout();
    assert_eq!(layout.first().map(|s| s.0), Some(first), "{layout:?}");
    assert_eq!(layout.last().map(|s| s.1), Some(head), "{layout:?}");
    for pair in layout.windows(2) {
        assert_eq!(pair[0].1 + 1, pair[1].0, "contiguous: {layout:?}");
    }
    State {
        head,
        first,
        frames,
    }
}

/// `before` with every frame after `seq` gone.
fn cut_state(before: &State, seq: u64) -> State {
    State {
        head: seq,
        first: before.first,
        frames: before
            .frames
            .iter()
            .filter(|e| e.seq <= seq)
            .cloned()
            .collect(),
    }
}

fn names_in(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .expect("list")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// The segment and index files a layout needs, and nothing else of the
/// log's: no leftover segment, index or intent.
fn assert_files_match_layout(names: &[String], log: &Log, what: &str) {
    let mut want: Vec<String> = log
        .layout()
        .iter()
        .flat_map(|s| [format::segment_name(s.0), format::index_name(s.0)])
        .collect();
    want.sort();
    let mut got: Vec<String> = names
        .iter()
        .filter(|n| n.ends_with(".log") || n.ends_with(".idx"))
        .cloned()
        .collect();
    got.sort();
    assert_eq!(got, want, "{what}");
    assert!(
        !names
            .iter()
            .any(|n| n.starts_with(TRUNCATE_FILE) || n.ends_with(".tmp")),
        "{what}: an intent is left: {names:?}"
    );
}

fn sim_names(fs: &SimStorage) -> Vec<String> {
    fs.files()
        .iter()
        .filter(|p| p.parent() == Some(Path::new(SIM_DIR)))
        .filter_map(|p| p.file_name()?.to_str().map(str::to_owned))
        .collect()
}

// ---------------------------------------------------------------------------
// 1: what stays and what goes
// ---------------------------------------------------------------------------

/// A cut inside the open segment keeps the frames before it byte for byte,
/// zeroes everything after them to the preallocated end, says what it cut,
/// and the next append takes the number after the cut, before and after a
/// reopen.
#[test]
fn cut_inside_the_open_segment() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = Log::open_with(dir.path(), 8192).expect("open");
    fill(&log, 12, 0);
    assert_eq!(log.layout().len(), 1, "one segment");
    let before = state(&log);
    let cut = log.truncate_after(7).expect("truncate");
    let cut_bytes: u64 = (8..=12).map(|s| Frame::nth(s, 0).frame_len()).sum();
    assert_eq!(
        cut,
        Truncated {
            old_head: 12,
            head: 7,
            frames: 5,
            bytes: cut_bytes,
            segments_removed: 0,
            open_segment: 1,
        }
    );
    assert_eq!(state(&log), cut_state(&before, 7));

    let seg = std::fs::read(dir.path().join(format::segment_name(1))).expect("segment");
    let end =
        SEGMENT_HEADER_LEN as u64 + (1..=7).map(|s| Frame::nth(s, 0).frame_len()).sum::<u64>();
    assert_eq!(seg.len() as u64, 8192, "preallocated again");
    assert!(
        seg[end as usize..].iter().all(|&b| b == 0),
        "bytes of a cut frame remain"
    );
    let idx = std::fs::metadata(dir.path().join(format::index_name(1))).expect("index");
    assert_eq!(idx.len(), 16 + 7 * 8);

    assert_eq!(Frame::nth(8, 1).append(&log).expect("append"), 8);
    let after = state(&log);
    assert!(Frame::nth(8, 1).is(&after.frames[7]));
    drop(log);
    let log = Log::open_with(dir.path(), 8192).expect("reopen");
    assert_eq!(*log.recovery(), Default::default(), "nothing to recover");
    assert_eq!(state(&log), after);
    assert_files_match_layout(&names_in(dir.path()), &log, "after reopen");
}

/// A cut several segments back removes the later segments whole, makes the
/// sealed segment holding the cut the open one again (preallocated, taking
/// appends and rolling on), and a reopen agrees.
#[test]
fn cut_several_segments_back_reopens_a_sealed_segment() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = Log::open_with(dir.path(), 512).expect("open");
    fill(&log, 40, 0);
    let layout = log.layout();
    assert!(layout.len() >= 6, "{layout:?}");
    let (kept_first, kept_last, _) = layout[1];
    assert!(kept_last > kept_first, "two frames in {layout:?}");
    let seq = kept_first;
    let before = state(&log);

    let cut = log.truncate_after(seq).expect("truncate");
    assert_eq!(cut.old_head, 40);
    assert_eq!(cut.head, seq);
    assert_eq!(cut.frames, 40 - seq);
    assert_eq!(
        cut.bytes,
        (seq + 1..=40)
            .map(|s| Frame::nth(s, 0).frame_len())
            .sum::<u64>()
    );
    assert_eq!(cut.segments_removed, layout.len() as u64 - 2);
    assert_eq!(cut.open_segment, kept_first);
    assert_eq!(state(&log), cut_state(&before, seq));
    assert_eq!(
        log.layout(),
        vec![layout[0], (kept_first, seq, 512)],
        "the sealed segment is the open one, preallocated"
    );
    assert_files_match_layout(&names_in(dir.path()), &log, "after the cut");

    // Appends go into the segment that was sealed, then roll on.
    assert_eq!(
        Frame::nth(seq + 1, 1).append(&log).expect("append"),
        seq + 1
    );
    assert_eq!(log.layout().len(), 2, "{:?}", log.layout());
    fill(&log, 45, 1);
    assert!(log.layout().len() > 2, "{:?}", log.layout());
    let after = state(&log);
    for e in &after.frames[seq as usize..] {
        assert!(Frame::nth(e.seq, 1).is(e), "frame {}", e.seq);
    }
    drop(log);
    let log = Log::open_with(dir.path(), 512).expect("reopen");
    assert_eq!(state(&log), after);
    assert_files_match_layout(&names_in(dir.path()), &log, "after reopen");
}

/// A cut at the last frame of a sealed segment leaves that segment's files
/// untouched and sealed; the next segment stays, open and empty.
#[test]
fn cut_on_a_segment_boundary_leaves_the_sealed_segment_alone() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = Log::open_with(dir.path(), 512).expect("open");
    fill(&log, 30, 0);
    let layout = log.layout();
    assert!(layout.len() >= 5, "{layout:?}");
    let seq = layout[2].1;
    let sealed = [
        dir.path().join(format::segment_name(layout[2].0)),
        dir.path().join(format::index_name(layout[2].0)),
    ];
    let sealed_bytes: Vec<Vec<u8>> = sealed
        .iter()
        .map(|p| std::fs::read(p).expect("read"))
        .collect();
    let before = state(&log);

    let cut = log.truncate_after(seq).expect("truncate");
    assert_eq!(cut.segments_removed, layout.len() as u64 - 4);
    assert_eq!(cut.open_segment, seq + 1);
    assert_eq!(state(&log), cut_state(&before, seq));
    let now = log.layout();
    assert_eq!(now[..3], layout[..3]);
    assert_eq!(now[3].0, seq + 1);
    assert_eq!(now[3].1, seq, "open and empty");
    for (p, b) in sealed.iter().zip(&sealed_bytes) {
        assert_eq!(
            &std::fs::read(p).expect("read"),
            b,
            "{} changed",
            p.display()
        );
    }
    assert_eq!(
        Frame::nth(seq + 1, 1).append(&log).expect("append"),
        seq + 1
    );
    let after = state(&log);
    drop(log);
    let log = Log::open_with(dir.path(), 512).expect("reopen");
    assert_eq!(state(&log), after);
    assert_files_match_layout(&names_in(dir.path()), &log, "after reopen");
}

/// `first - 1` empties the log where it stands: the floor, the history and
/// the oldest segment's file stay, and the next append takes `first`.
/// Anything lower is below the floor.
#[test]
fn cut_to_first_minus_one_empties_the_log_at_that_position() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = Log::open_with(dir.path(), 512).expect("open");
    fill(&log, 30, 0);
    let first = log.truncate_before(10).expect("retention");
    assert!(first > 1 && first <= 10, "first {first}");
    let history = log.history();

    match log.truncate_after(first - 2) {
        Err(Error::BelowFloor { seq, first: f }) => assert_eq!((seq, f), (first - 2, first)),
        other => panic!("below the floor: {other:?}"),
    }
    assert_eq!(log.head_seq(), 30, "a refusal cuts nothing");

    let cut = log.truncate_after(first - 1).expect("truncate");
    assert_eq!(cut.frames, 31 - first);
    assert_eq!(cut.open_segment, first);
    assert_eq!((log.first_seq(), log.head_seq()), (first, first - 1));
    assert_eq!(log.layout(), vec![(first, first - 1, 512)]);
    assert!(matches!(log.read(first), Err(Error::PastHead { .. })));
    assert_eq!(log.history(), history);
    assert_files_match_layout(&names_in(dir.path()), &log, "emptied");

    assert_eq!(Frame::nth(first, 1).append(&log).expect("append"), first);
    let after = state(&log);
    drop(log);
    let log = Log::open_with(dir.path(), 512).expect("reopen");
    assert_eq!(log.history(), history);
    assert_eq!(state(&log), after);
}

/// At the head a cut does nothing at all; past the head it is refused by
/// name, and so is a poisoned or released log.
#[test]
fn no_op_at_head_and_refusals() {
    let fs = SimStorage::new();
    let log = open_sim(&fs, 512).expect("open");
    assert_eq!(
        log.truncate_after(0).expect("empty log at its head"),
        Truncated {
            open_segment: 1,
            ..Truncated::default()
        }
    );
    fill(&log, 20, 0);
    let before = state(&log);
    let (writes, syncs) = (fs.writes(), fs.syncs());
    let open_segment = log.layout().last().expect("segment").0;
    assert_eq!(
        log.truncate_after(20).expect("at the head"),
        Truncated {
            old_head: 20,
            head: 20,
            open_segment,
            ..Truncated::default()
        }
    );
    assert_eq!((fs.writes(), fs.syncs()), (writes, syncs), "no I/O");
    assert_eq!(state(&log), before);
    match log.truncate_after(21) {
        Err(Error::PastHead { seq: 21, head: 20 }) => {}
        other => panic!("past the head: {other:?}"),
    }
    assert!(matches!(
        log.truncate_after(u64::MAX),
        Err(Error::PastHead { .. })
    ));

    log.release().expect("release");
    assert!(matches!(log.truncate_after(10), Err(Error::Released)));
    log.reacquire().expect("reacquire");
    assert_eq!(state(&log), before);

    fs.fail_write_in(1);
    assert!(Frame::nth(21, 0).append(&log).is_err());
    assert!(matches!(log.truncate_after(10), Err(Error::Poisoned(_))));
    drop(log);
    let log = open_sim(&fs, 512).expect("reopen");
    assert_eq!(state(&log), before);
}

/// Frames staged and not yet synced are part of the log a cut measures:
/// made durable and published first, then cut like any other.
#[test]
fn staged_frames_are_published_then_cut() {
    let fs = SimStorage::new();
    let log = open_sim(&fs, 4096).expect("open");
    fill(&log, 5, 0);
    for seq in 6..=8 {
        let f = Frame::nth(seq, 0);
        assert_eq!(log.stage_raw(f.kind, &f.meta, &f.blob).expect("stage"), seq);
    }
    assert_eq!(log.head_seq(), 5);
    let cut = log.truncate_after(8).expect("at the staged head");
    assert_eq!((cut.old_head, cut.frames), (8, 0));
    assert_eq!(log.head_seq(), 8);
    let f = Frame::nth(9, 0);
    log.stage_raw(f.kind, &f.meta, &f.blob).expect("stage");
    let cut = log.truncate_after(6).expect("truncate");
    assert_eq!((cut.old_head, cut.head, cut.frames), (9, 6, 3));
    assert_eq!(log.unsynced(), 0);
    assert_eq!(log.sync().expect("nothing to sync"), 6);
    assert_eq!(Frame::nth(7, 1).append(&log).expect("append"), 7);
    let after = state(&log);
    drop(log);
    fs.crash(CrashMode::LoseUnsynced);
    let log = open_sim(&fs, 4096).expect("reopen");
    assert_eq!(state(&log), after);
}

/// Frames erased before the cut stay erased, with the crc of their zeros;
/// frames erased after it go with the rest.
#[test]
fn erased_frames_before_the_cut_stay_erased() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = Log::open_with(dir.path(), 1024).expect("open");
    fill(&log, 30, 0);
    let erased = log.erase(25, &["a".to_string()]).expect("erase");
    assert!(erased.frames >= 10, "{erased:?}");
    let before = state(&log);
    log.truncate_after(17).expect("truncate");
    let after = state(&log);
    assert_eq!(after, cut_state(&before, 17));
    for e in &after.frames {
        if e.seq % 2 == 0 {
            assert_eq!(e.kind, Kind::Redacted.as_u16(), "frame {}", e.seq);
            assert!(e.meta.is_empty() && e.blob.is_empty());
        } else {
            assert!(Frame::nth(e.seq, 0).is(e), "frame {}", e.seq);
        }
    }
    drop(log);
    let log = Log::open_with(dir.path(), 1024).expect("reopen");
    assert_eq!(state(&log), after);
    // A later erase still finds nothing left to do in them.
    assert_eq!(log.erase(25, &["a".to_string()]).expect("erase").frames, 0);
}

/// A follower's appends at the leader's numbers carry on from the cut:
/// `append_at` and a streaming append take exactly `seq + 1`.
#[test]
fn follower_appends_at_seq_plus_one_after_a_cut() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = Log::open_with(dir.path(), 512).expect("open");
    log.set_follower(true);
    for seq in 1..=20 {
        let f = Frame::nth(seq, 0);
        log.append_at(seq, f.kind, &f.meta, &f.blob)
            .expect("append_at");
    }
    log.truncate_after(11).expect("truncate");
    let f = Frame::nth(12, 1);
    match log.append_at(13, f.kind, &f.meta, &f.blob) {
        Err(Error::Gap {
            expected: 12,
            got: 13,
        }) => {}
        other => panic!("a gap: {other:?}"),
    }
    assert_eq!(
        log.append_at(12, f.kind, &f.meta, &f.blob)
            .expect("append_at"),
        12
    );
    let g = Frame::nth(13, 1);
    let mut p = log
        .begin(Some(13), g.kind, &g.meta, g.blob.len() as u64)
        .expect("begin");
    for chunk in g.blob.chunks(7) {
        p.write(chunk).expect("write");
    }
    assert_eq!(p.commit().expect("commit"), 13);
    assert!(f.is(&log.read(12).expect("read")));
    assert!(g.is(&log.read(13).expect("read")));
    assert!(matches!(
        log.append(Kind::Pack, &Meta::repo("a"), b"x"),
        Err(Error::Follower)
    ));
}

// ---------------------------------------------------------------------------
// 2: readers and tails around a cut
// ---------------------------------------------------------------------------

/// No reader serves a cut frame once the cut returns: lookups, pieces,
/// scans and ranges stop at the new head, then serve the new frames.
#[test]
fn readers_never_see_cut_frames() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = Log::open_with(dir.path(), 512).expect("open");
    fill(&log, 30, 0);
    log.truncate_after(9).expect("truncate");
    for seq in [10, 20, 30] {
        assert!(
            matches!(log.read(seq), Err(Error::PastHead { .. })),
            "{seq}"
        );
        assert!(matches!(log.locate_blob(seq), Err(Error::PastHead { .. })));
        let r = log.read_pieces::<Error>(seq, 64, |_, _, _| panic!("a piece of a cut frame"));
        assert!(matches!(r, Err(Error::PastHead { .. })));
    }
    let mut kinds = Vec::new();
    log.scan_kinds::<Error>(1, u64::MAX, |seq, _| {
        kinds.push(seq);
        Ok(())
    })
    .expect("scan_kinds");
    assert_eq!(kinds, (1..=9).collect::<Vec<_>>());
    let mut metas = 0;
    log.scan_meta(|_, _, _| metas += 1).expect("scan_meta");
    assert_eq!(metas, 9);

    fill(&log, 25, 1);
    for seq in 10..=25 {
        let e = log.read(seq).expect("read");
        assert!(Frame::nth(seq, 1).is(&e), "frame {seq} is the new one");
        let mut blob = Vec::new();
        log.read_pieces::<Error>(seq, 16, |_, p, _| {
            blob.extend_from_slice(p);
            Ok(())
        })
        .expect("pieces");
        assert_eq!(blob, Frame::nth(seq, 1).blob);
    }
    assert!(matches!(log.read(26), Err(Error::PastHead { .. })));
}

/// A tail at or before the cut reads the kept frames, then the new ones;
/// a tail that had read a frame the cut removed fails by name whether it
/// sat in a removed segment or in the one cut short, rather than go on.
#[test]
fn tails_around_a_cut() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = Log::open_with(dir.path(), 512).expect("open");
    fill(&log, 30, 0);
    let layout = log.layout();
    let seq = layout[2].0;
    assert!(layout[2].1 > seq, "two frames in {layout:?}");
    let read = |tail: &mut Tail, n: u64| {
        for _ in 0..n {
            let f = tail.next().expect("tail").expect("a frame");
            assert!(Frame::nth(f.seq, 0).blob == f.blob, "frame {}", f.seq);
        }
    };
    let mut behind = Tail::open(dir.path(), 0).expect("tail");
    read(&mut behind, seq - 2);
    let mut at_cut = Tail::open(dir.path(), 0).expect("tail");
    read(&mut at_cut, seq);
    let mut in_cut_segment = Tail::open(dir.path(), 0).expect("tail");
    read(&mut in_cut_segment, seq + 1);
    let mut in_removed_segment = Tail::open(dir.path(), 0).expect("tail");
    read(&mut in_removed_segment, layout[4].0 + 1);
    let mut caught_up = Tail::open(dir.path(), 0).expect("tail");
    read(&mut caught_up, 30);
    assert!(caught_up.next().expect("tail").is_none());
    let mut from_far = Tail::open(dir.path(), 28).expect("tail");

    log.truncate_after(seq).expect("truncate");
    // Caught up with the cut log, before anything is written again.
    assert!(at_cut.next().expect("at the head").is_none());
    for t in [&mut in_removed_segment, &mut caught_up] {
        match t.next() {
            Err(Error::ReaderPastCut { read_through }) => assert!(read_through > seq),
            other => panic!("a tail past the cut: {:?}", other.map(|f| f.map(|f| f.seq))),
        }
    }
    fill(&log, 35, 1);
    // Back past where it was: the frame it meets does not start where the
    // one it read ended.
    match in_cut_segment.next() {
        Err(Error::ReaderPastCut { read_through }) => assert_eq!(read_through, seq + 1),
        other => panic!("a tail past the cut: {:?}", other.map(|f| f.map(|f| f.seq))),
    }
    for (t, from) in [(&mut behind, seq - 1), (&mut at_cut, seq + 1)] {
        for want in from..=35 {
            let f = t.next().expect("tail").expect("a frame");
            assert_eq!(f.seq, want);
            let generation = if want <= seq { 0 } else { 1 };
            assert_eq!(f.blob, Frame::nth(want, generation).blob, "frame {want}");
        }
        assert!(t.next().expect("tail").is_none());
    }
    // A tail that had read nothing only waited for a number: it reads on.
    assert_eq!(from_far.next().expect("tail").expect("frame").seq, 28);
}

/// Tails at every position of a log when it is cut and written again past
/// where they were, with frames of one size (so the new segments take the
/// old numbers and offsets) and of varied sizes: none serves a cut frame,
/// none stalls, and each reaches the new head or fails by name.
#[test]
fn no_tail_serves_a_cut_frame_or_stalls() {
    for same_size in [true, false] {
        let frame = |seq: u64, generation: u64| {
            let mut f = Frame::nth(seq, generation);
            if same_size {
                f.meta = Meta::repo("a").encode().expect("meta");
                f.blob = bytes(seq * 1000 + generation, 90);
            }
            f
        };
        let dir = tempfile::tempdir().expect("tempdir");
        let log = Log::open_with(dir.path(), 512).expect("open");
        for seq in 1..=30 {
            frame(seq, 0).append(&log).expect("append");
        }
        let seq = log.layout()[2].0 + 1;
        let mut tails: Vec<Tail> = (0..=30)
            .map(|n| {
                let mut t = Tail::open(dir.path(), 0).expect("tail");
                for _ in 0..n {
                    t.next().expect("tail").expect("a frame");
                }
                t
            })
            .collect();
        log.truncate_after(seq).expect("truncate");
        for s in seq + 1..=40 {
            frame(s, 1).append(&log).expect("append");
        }
        for (n, t) in tails.iter_mut().enumerate() {
            let what = format!("same size {same_size}, tail at {n}");
            loop {
                match t.next() {
                    Ok(Some(f)) => {
                        let generation = if f.seq <= seq { 0 } else { 1 };
                        assert_eq!(f.blob, frame(f.seq, generation).blob, "{what}: {}", f.seq);
                    }
                    Ok(None) => {
                        assert_eq!(t.next_seq(), 41, "{what}: stalled");
                        break;
                    }
                    Err(Error::ReaderPastCut { read_through }) => {
                        assert!(read_through > seq, "{what}");
                        break;
                    }
                    Err(e) => panic!("{what}: {e}"),
                }
            }
        }
    }
}

/// An embedding reader (the WAL's cursor) holding buffered bytes of the
/// frames a cut removed reads the new frames, not its buffer; one that had
/// read a cut frame fails by name.
#[test]
fn wal_readers_around_a_cut() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut wal = Wal::open(dir.path()).expect("open");
    for i in 1..=10u64 {
        wal.append(&bytes(i, 50)).expect("append");
    }
    wal.commit().expect("commit");
    let mut before_cut = wal.reader_from(Lsn(1)).expect("reader");
    for i in 1..=5u64 {
        let (lsn, payload) = before_cut.next().expect("record").expect("read");
        assert_eq!((lsn, payload), (Lsn(i), &bytes(i, 50)[..]));
    }
    let mut past_cut = wal.reader_from(Lsn(1)).expect("reader");
    for _ in 1..=9 {
        past_cut.next().expect("record").expect("read");
    }
    let log = wal.log();
    log.truncate_after(7).expect("truncate");
    for i in 8..=10u64 {
        log.append_raw(Kind::Record.as_u16(), b"", &bytes(100 + i, 60))
            .expect("append");
    }
    for i in 6..=10u64 {
        let (lsn, payload) = before_cut.next().expect("record").expect("read");
        let want = if i <= 7 {
            bytes(i, 50)
        } else {
            bytes(100 + i, 60)
        };
        assert_eq!((lsn, payload), (Lsn(i), &want[..]), "record {i}");
    }
    assert!(before_cut.next().is_none());
    match past_cut.next() {
        Some(Err(WalError::Log(Error::ReaderPastCut { read_through: 9 }))) => {}
        other => panic!("a reader past the cut: {other:?}"),
    }
}

// ---------------------------------------------------------------------------
// 3: what a cut waits for
// ---------------------------------------------------------------------------

/// A cut begun while a streaming append holds the writer waits for its
/// commit and cuts with it counted: never between its bytes and its header.
#[test]
fn a_cut_waits_for_a_streaming_append() {
    let fs = SimStorage::new();
    let log = open_sim(&fs, 4096).expect("open");
    fill(&log, 10, 0);
    let (begun, wait_begun) = mpsc::channel();
    let cut = std::thread::scope(|s| {
        s.spawn(|| {
            let f = Frame::nth(11, 0);
            let mut p = log
                .begin(None, f.kind, &f.meta, f.blob.len() as u64)
                .expect("begin");
            begun.send(()).expect("send");
            for chunk in f.blob.chunks(10) {
                p.write(chunk).expect("write");
            }
            p.commit().expect("commit")
        });
        wait_begun.recv().expect("begun");
        log.truncate_after(8).expect("truncate")
    });
    assert_eq!((cut.old_head, cut.frames), (11, 3));
    assert_eq!(Frame::nth(9, 1).append(&log).expect("append"), 9);
}

/// A cut waits while another thread holds a snapshot's freeze: the frame
/// appended under the freeze is counted by the cut that was asked for
/// before it.
#[test]
fn a_cut_waits_for_a_freeze() {
    let fs = SimStorage::new();
    let log = open_sim(&fs, 4096).expect("open");
    fill(&log, 10, 0);
    let (asking, wait_asking) = mpsc::channel();
    let cut = std::thread::scope(|s| {
        let frozen = log.freeze();
        let cutter = s.spawn(|| {
            asking.send(()).expect("send");
            log.truncate_after(8).expect("truncate")
        });
        wait_asking.recv().expect("asking");
        Frame::nth(11, 0)
            .append(&log)
            .expect("append under the freeze");
        drop(frozen);
        cutter.join().expect("cutter")
    });
    assert_eq!((cut.old_head, cut.frames), (11, 3));
}

/// Cuts among concurrent appenders (group commit, rolls): every frame the
/// log keeps is whole and is one an appender wrote at that number, and a
/// reopen sees the same log.
#[test]
fn cuts_interleave_with_concurrent_appends() {
    const THREADS: u64 = 3;
    const EACH: u64 = 120;
    let fs = SimStorage::new();
    let log = open_sim(&fs, 2048).expect("open");
    let tagged = |id: u64| {
        let mut b = bytes(id, 40 + (id % 90) as usize);
        b[..8].copy_from_slice(&id.to_le_bytes());
        b
    };
    let appending = AtomicU64::new(THREADS);
    let cut_frames = std::thread::scope(|s| {
        for t in 0..THREADS {
            let (log, appending) = (&log, &appending);
            s.spawn(move || {
                for i in 0..EACH {
                    // A frame a cut removes after it was published and
                    // before its append looked is past the head by then.
                    match log.append_raw(Kind::Pack.as_u16(), b"", &tagged(t * 1000 + i)) {
                        Ok(_) | Err(Error::PastHead { .. }) => {}
                        Err(e) => panic!("append: {e}"),
                    }
                }
                appending.fetch_sub(1, Ordering::SeqCst);
            });
        }
        let (log, appending) = (&log, &appending);
        let cutter = s.spawn(move || {
            let (mut cuts, mut frames) = (0, 0);
            while appending.load(Ordering::SeqCst) > 0 || cuts < 10 {
                let head = log.head_seq();
                // A cut of a log with nothing past the cut point proves
                // nothing and is not counted: on a loaded machine the
                // cutter may start long before the appenders' first
                // frames, or spin past them.
                if head < 4 {
                    if appending.load(Ordering::SeqCst) == 0 {
                        break;
                    }
                    std::thread::yield_now();
                    continue;
                }
                let cut = log
                    .truncate_after(head.saturating_sub(3))
                    .expect("truncate");
                assert!(cut.old_head >= head && cut.head <= cut.old_head);
                cuts += 1;
                frames += cut.frames;
            }
            frames
        });
        cutter.join().expect("cutter")
    });
    assert!(cut_frames >= 3, "{cut_frames} frames cut");
    let after = state(&log);
    for e in &after.frames {
        let id = u64::from_le_bytes(e.blob[..8].try_into().expect("8 bytes"));
        assert_eq!(e.blob, tagged(id), "frame {}", e.seq);
    }
    drop(log);
    fs.crash(CrashMode::LoseUnsynced);
    let log = open_sim(&fs, 2048).expect("reopen");
    assert_eq!(state(&log), after);
}

// ---------------------------------------------------------------------------
// 4: a power cut at every sync, a failure at every write and sync
// ---------------------------------------------------------------------------

/// A log to cut, and where.
struct Layout {
    what: &'static str,
    segment_bytes: u64,
    frames: u64,
    /// Erase repository "a" before this sequence first.
    erase_before: Option<u64>,
    /// Drop the whole segments below this sequence first.
    floor: Option<u64>,
    /// Where to cut, from the segments the frames made.
    cut: fn(&[(u64, u64, u64)]) -> u64,
}

const LAYOUTS: [Layout; 4] = [
    Layout {
        what: "inside the open segment",
        segment_bytes: 8192,
        frames: 20,
        erase_before: Some(6),
        floor: None,
        cut: |l| {
            assert_eq!(l.len(), 1, "{l:?}");
            9
        },
    },
    Layout {
        what: "several segments back",
        segment_bytes: 512,
        frames: 40,
        erase_before: Some(12),
        floor: None,
        cut: |l| {
            assert!(l.len() >= 6 && l[1].1 > l[1].0, "{l:?}");
            l[1].0
        },
    },
    Layout {
        what: "on a segment boundary",
        segment_bytes: 512,
        frames: 30,
        erase_before: None,
        floor: None,
        cut: |l| {
            assert!(l.len() >= 5, "{l:?}");
            l[2].1
        },
    },
    Layout {
        what: "to the floor",
        segment_bytes: 512,
        frames: 30,
        erase_before: None,
        floor: Some(10),
        cut: |l| {
            assert!(l[0].0 > 1, "{l:?}");
            l[0].0 - 1
        },
    },
];

const MODES: [CrashMode; 4] = [
    CrashMode::LoseUnsynced,
    CrashMode::KeepPrefix(1),
    CrashMode::KeepPrefix(2),
    CrashMode::KeepPrefix(0xdead_beef),
];

impl Layout {
    /// The log on a fresh disk, the state before the cut, the sequence to
    /// cut after and the state after it.
    fn build(&self) -> (SimStorage, Log, State, u64, State) {
        let fs = SimStorage::new();
        let log = open_sim(&fs, self.segment_bytes).expect("open");
        fill(&log, self.frames, 0);
        if let Some(before) = self.erase_before {
            log.erase(before, &["a".to_string()]).expect("erase");
        }
        if let Some(floor) = self.floor {
            log.truncate_before(floor).expect("retention");
        }
        let before = state(&log);
        let seq = (self.cut)(&log.layout());
        let after = cut_state(&before, seq);
        (fs, log, before, seq, after)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Outcome {
    Before,
    After,
}

/// Reopen and check the log is exactly as before the cut or exactly as
/// after it, with no file of the cut left; then that an append takes the
/// next number and survives a power cut.
fn reopen_before_or_after(
    fs: &SimStorage,
    layout: &Layout,
    before: &State,
    after: &State,
    what: &str,
) -> Outcome {
    let log = open_sim(fs, layout.segment_bytes).unwrap_or_else(|e| panic!("{what}: reopen: {e}"));
    let got = state(&log);
    let outcome = if got == *before {
        Outcome::Before
    } else if got == *after {
        Outcome::After
    } else {
        panic!("{what}: neither before ({before:?}) nor after ({after:?}): {got:?}");
    };
    assert_files_match_layout(&sim_names(fs), &log, what);
    let next = Frame::nth(got.head + 1, 7);
    assert_eq!(next.append(&log).expect("append"), got.head + 1, "{what}");
    drop(log);
    fs.crash(CrashMode::LoseUnsynced);
    let log = open_sim(fs, layout.segment_bytes).expect("reopen after append");
    let again = state(&log);
    assert_eq!(again.head, got.head + 1, "{what}");
    assert_eq!(again.frames[..got.frames.len()], got.frames[..], "{what}");
    assert!(next.is(again.frames.last().expect("a frame")), "{what}");
    outcome
}

/// A power cut at every sync a cut makes, keeping only what was synced or
/// a prefix of the unsynced writes of each file, leaves the log exactly as
/// before the cut or exactly as after it, never between, in every layout;
/// both happen, and the log takes appends at the next number.
#[test]
fn crash_at_every_sync_leaves_the_log_before_or_after_the_cut() {
    for layout in &LAYOUTS {
        let (fs, log, before, seq, after) = layout.build();
        let syncs = fs.syncs();
        log.truncate_after(seq).expect("a cut without faults");
        let total = fs.syncs() - syncs;
        assert!(total >= 4, "{}: {total} syncs", layout.what);
        drop(log);
        // Every sync of a returned cut is behind it: a power cut now keeps it.
        fs.crash(CrashMode::LoseUnsynced);
        let what = format!("{}: after the cut returned", layout.what);
        assert_eq!(
            reopen_before_or_after(&fs, layout, &before, &after, &what),
            Outcome::After
        );

        for mode in MODES {
            let mut outcomes = Vec::new();
            for k in 1..=total {
                let what = format!("{}: crash at sync {k} of {total}, {mode:?}", layout.what);
                let (fs, log, _, _, _) = layout.build();
                fs.crash_at_sync(k);
                let r = log.truncate_after(seq);
                assert!(r.is_err(), "{what}: the cut ran through a crash");
                assert!(fs.has_crashed(), "{what}: no crash");
                drop(log);
                fs.crash(mode);
                outcomes.push(reopen_before_or_after(&fs, layout, &before, &after, &what));
            }
            assert_eq!(outcomes.first(), Some(&Outcome::Before), "{}", layout.what);
            assert_eq!(outcomes.last(), Some(&Outcome::After), "{}", layout.what);
            // Once the intent is durable the cut is decided.
            let decided = outcomes.iter().position(|&o| o == Outcome::After);
            if let Some(i) = decided {
                assert!(
                    outcomes[i..].iter().all(|&o| o == Outcome::After),
                    "{}, {mode:?}: {outcomes:?}",
                    layout.what
                );
            }
        }
    }
}

/// A write or a sync of the cut that fails poisons the log; the log
/// reopened from what the failed process left, and again after a power
/// cut, is exactly as before or exactly as after the cut.
#[test]
fn failure_at_every_write_and_sync_leaves_the_log_before_or_after_the_cut() {
    for layout in &LAYOUTS {
        let (fs, log, _, seq, _) = layout.build();
        let (writes, syncs) = (fs.writes(), fs.syncs());
        log.truncate_after(seq).expect("a cut without faults");
        let (writes, syncs) = (fs.writes() - writes, fs.syncs() - syncs);
        assert!(writes >= 3, "{}: {writes} writes", layout.what);
        let faults = (1..=writes)
            .map(|k| ("write", k))
            .chain((1..=syncs).map(|k| ("sync", k)));
        for (step, k) in faults {
            let what = format!("{}: {step} {k} fails", layout.what);
            let (fs, log, before, _, after) = layout.build();
            if step == "write" {
                fs.fail_write_in(k);
            } else {
                fs.fail_sync_in(k);
            }
            assert!(
                log.truncate_after(seq).is_err(),
                "{what}: the cut ran through"
            );
            assert!(
                matches!(log.append_raw(2, b"", b"x"), Err(Error::Poisoned(_))),
                "{what}: not poisoned"
            );
            assert!(matches!(log.truncate_after(seq), Err(Error::Poisoned(_))));
            drop(log);
            let outcome = reopen_before_or_after(&fs, layout, &before, &after, &what);
            for mode in [CrashMode::LoseUnsynced, CrashMode::KeepPrefix(3)] {
                // The reopen made its outcome durable: a power cut keeps it
                // (with the frame the check appended).
                fs.crash(mode);
                let log = open_sim(&fs, layout.segment_bytes).expect("reopen");
                let want = if outcome == Outcome::Before {
                    &before
                } else {
                    &after
                };
                let got = state(&log);
                assert_eq!(got.head, want.head + 1, "{what}, {mode:?}");
                assert_eq!(got.frames[..want.frames.len()], want.frames[..], "{what}");
            }
        }
    }
}

/// Every file of a simulated disk, live bytes, on a disk of its own.
fn copy_disk(fs: &SimStorage) -> SimStorage {
    let copy = SimStorage::new();
    for p in fs.files() {
        copy.write_file(&p, &fs.read_file(&p).expect("listed file"));
    }
    copy
}

/// `open` finishing a cut a crash interrupted is itself cut by a power
/// cut at each of its syncs: the next open finishes it, with the same
/// outcome.
#[test]
fn a_crash_while_open_finishes_a_cut_is_finished_by_the_next_open() {
    let layout = &LAYOUTS[1];
    let (fs, log, before, seq, after) = layout.build();
    let syncs = fs.syncs();
    log.truncate_after(seq).expect("cut");
    let total = fs.syncs() - syncs;
    drop(log);
    let mut finished = 0;
    for k in 1..=total {
        let (fs, log, _, _, _) = layout.build();
        fs.crash_at_sync(k);
        assert!(log.truncate_after(seq).is_err());
        drop(log);
        fs.crash(CrashMode::LoseUnsynced);
        let left = copy_disk(&fs);
        let intent = Path::new(SIM_DIR).join(TRUNCATE_FILE);
        if left.read_file(&intent).is_none() {
            continue;
        }
        // Count the syncs of an open that finishes the cut.
        let probe = copy_disk(&left);
        let s0 = probe.syncs();
        let log = open_sim(&probe, layout.segment_bytes).expect("open");
        assert_eq!(log.recovery().finished_truncate, Some(seq));
        assert_eq!(state(&log), after);
        let open_syncs = probe.syncs() - s0;
        drop(log);
        for j in 1..=open_syncs {
            for mode in [CrashMode::LoseUnsynced, CrashMode::KeepPrefix(5)] {
                let what = format!("cut crashed at sync {k}, open at sync {j}, {mode:?}");
                let disk = copy_disk(&left);
                disk.crash_at_sync(j);
                assert!(open_sim(&disk, layout.segment_bytes).is_err(), "{what}");
                disk.crash(mode);
                let outcome = reopen_before_or_after(&disk, layout, &before, &after, &what);
                assert_eq!(outcome, Outcome::After, "{what}");
            }
        }
        finished += 1;
    }
    assert!(finished >= 2, "{finished} crashes left an intent to finish");
}

/// An intent file that does not decode stops `open` by name rather than be
/// guessed at.
#[test]
fn a_damaged_intent_is_refused() {
    let (fs, log, _, seq, _) = LAYOUTS[1].build();
    fs.crash_at_sync(4);
    assert!(log.truncate_after(seq).is_err());
    drop(log);
    fs.crash(CrashMode::LoseUnsynced);
    let intent = Path::new(SIM_DIR).join(TRUNCATE_FILE);
    let mut b = fs
        .read_file(&intent)
        .expect("the intent is durable by the 4th sync");
    b[10] ^= 1;
    fs.write_file(&intent, &b);
    match open_sim(&fs, LAYOUTS[1].segment_bytes) {
        Err(Error::Corrupt(what)) => assert!(what.contains("TRUNCATE"), "{what}"),
        other => panic!("a damaged intent: {other:?}"),
    }
}

// ---------------------------------------------------------------------------
// 5: against a model
// ---------------------------------------------------------------------------

#[derive(Clone, Debug)]
enum Op {
    Append {
        len: usize,
    },
    Stream {
        len: usize,
        commit: bool,
    },
    Stage {
        count: u64,
    },
    /// Cut after `head - back`; a negative `back` is past the head.
    TruncateAfter {
        back: i64,
    },
    TruncateBefore {
        back: u64,
    },
    Reopen,
    Crash {
        keep_prefix: Option<u64>,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0usize..400).prop_map(|len| Op::Append { len }),
        2 => (0usize..700, any::<bool>()).prop_map(|(len, commit)| Op::Stream { len, commit }),
        1 => (1u64..4).prop_map(|count| Op::Stage { count }),
        4 => (-2i64..20).prop_map(|back| Op::TruncateAfter { back }),
        1 => (0u64..20).prop_map(|back| Op::TruncateBefore { back }),
        1 => Just(Op::Reopen),
        1 => prop::option::of(any::<u64>()).prop_map(|keep_prefix| Op::Crash { keep_prefix }),
    ]
}

/// The model: the frames from `first` on, in order.
struct Model {
    first: u64,
    frames: Vec<Vec<u8>>,
    made: u64,
}

impl Model {
    fn head(&self) -> u64 {
        self.first + self.frames.len() as u64 - 1
    }

    fn blob(&mut self, len: usize) -> Vec<u8> {
        self.made += 1;
        bytes(self.made, len)
    }
}

struct Harness {
    disk: SimStorage,
    segment_bytes: u64,
    log: Option<Log>,
    model: Model,
}

impl Harness {
    fn open(&mut self) {
        self.log = None;
        self.log = Some(open_sim(&self.disk, self.segment_bytes).expect("open"));
    }

    fn log(&self) -> &Log {
        self.log.as_ref().expect("open log")
    }

    fn apply(&mut self, op: &Op) {
        let head = self.model.head();
        match *op {
            Op::Append { len } => {
                let blob = self.model.blob(len);
                let seq = self.log().append_raw(2, b"m", &blob).expect("append");
                assert_eq!(seq, head + 1);
                self.model.frames.push(blob);
            }
            Op::Stream { len, commit } => {
                let blob = self.model.blob(len);
                let mut p = self.log().begin(None, 3, b"", len as u64).expect("begin");
                for chunk in blob.chunks(97) {
                    p.write(chunk).expect("write");
                }
                if commit {
                    assert_eq!(p.commit().expect("commit"), head + 1);
                    self.model.frames.push(blob);
                } else {
                    p.abort().expect("abort");
                }
            }
            Op::Stage { count } => {
                for _ in 0..count {
                    let blob = self.model.blob(50);
                    self.log().stage_raw(4, b"", &blob).expect("stage");
                    self.model.frames.push(blob);
                }
                self.log().sync().expect("sync");
            }
            Op::TruncateAfter { back } => {
                let Some(seq) = head.checked_add_signed(-back) else {
                    return;
                };
                let first = self.model.first;
                match self.log().truncate_after(seq) {
                    Ok(cut) => {
                        assert!(seq <= head && seq + 1 >= first, "cut after {seq}");
                        assert_eq!(
                            (cut.old_head, cut.head, cut.frames),
                            (head, seq, head - seq)
                        );
                        self.model.frames.truncate((seq + 1 - first) as usize);
                    }
                    Err(Error::PastHead { seq: s, head: h }) => {
                        assert_eq!((s, h), (seq, head));
                        assert!(seq > head);
                    }
                    Err(Error::BelowFloor { seq: s, first: f }) => {
                        assert_eq!((s, f), (seq, first));
                        assert!(seq + 1 < first);
                    }
                    Err(e) => panic!("truncate_after({seq}): {e}"),
                }
            }
            Op::TruncateBefore { back } => {
                let first = self
                    .log()
                    .truncate_before(head.saturating_sub(back))
                    .expect("retention");
                let dropped = (first - self.model.first) as usize;
                self.model.frames.drain(..dropped);
                self.model.first = first;
            }
            Op::Reopen => self.open(),
            Op::Crash { keep_prefix } => {
                // Everything above returned, so it is durable.
                self.log = None;
                self.disk.crash(match keep_prefix {
                    Some(seed) => CrashMode::KeepPrefix(seed),
                    None => CrashMode::LoseUnsynced,
                });
                self.open();
            }
        }
    }

    fn check(&self) {
        let log = self.log();
        let got = state(log);
        assert_eq!((got.first, got.head), (self.model.first, self.model.head()));
        for (e, blob) in got.frames.iter().zip(&self.model.frames) {
            assert_eq!(&e.blob, blob, "frame {}", e.seq);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn log_matches_a_model_through_appends_cuts_and_reopens(
        segment_bytes in prop_oneof![Just(256u64), 300u64..1500, Just(4096u64)],
        ops in prop::collection::vec(op(), 1..40),
    ) {
        let mut h = Harness {
            disk: SimStorage::new(),
            segment_bytes,
            log: None,
            model: Model { first: 1, frames: Vec::new(), made: 0 },
        };
        h.open();
        for op in &ops {
            h.apply(op);
            h.check();
        }
    }
}
