//! Every length a writer announces is checked before anything touches the
//! disk, and a frame the disk cannot make room for is refused without
//! poisoning the log or leaving a segment behind: a client's append, a
//! twin applying a lying primary's stream and a restore all write through
//! these calls.

use std::sync::Arc;
use twinlog::log::format::{index_path, segment_path, SegmentHeader};

use twinlog::log::{Error, Log, OpenOptions, SimStorage, MAX_BLOB};

const SEGMENT: u64 = 4096;

fn segments(dir: &std::path::Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .expect("list")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".log"))
        .collect();
    names.sort();
    names
}

#[test]
fn announced_lengths_past_the_cap_are_refused_by_name_before_any_write() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = Log::open_with(dir.path(), SEGMENT).expect("open");
    log.append_raw(0x8000, b"", &[1; 100]).expect("append");
    let before = segments(dir.path());
    for len in [MAX_BLOB + 1, 1 << 62, i64::MAX as u64, u64::MAX] {
        match log.begin(None, 0x8000, b"", len) {
            Err(Error::TooLarge {
                what,
                len: got,
                max,
            }) => {
                assert_eq!((what, got, max), ("blob", len, MAX_BLOB));
            }
            other => panic!("a blob of {len} bytes began: {other:?}"),
        }
        match log.begin(Some(2), 0x8000, b"", len) {
            Err(Error::TooLarge { .. }) => {}
            other => panic!("a follower's blob of {len} bytes began: {other:?}"),
        }
        match log.stage_erased_at(2, b"", len, 0) {
            Err(Error::TooLarge { .. }) => {}
            other => panic!("an erased frame of {len} bytes was staged: {other:?}"),
        }
    }
    assert_eq!(log.poisoned_by(), None);
    assert_eq!(segments(dir.path()), before, "no segment was made");
    assert_eq!(log.append_raw(0x8000, b"", b"after").expect("append"), 2);
}

/// A frame under the cap whose room the disk cannot reserve (2 GiB on a
/// simulated disk with 1 GiB free) is refused as I/O; the log goes on, and
/// no segment is left half made, whether the open segment had to roll or
/// only to grow.
#[test]
fn a_frame_whose_room_cannot_be_reserved_poisons_nothing_and_leaves_no_segment() {
    let disk = SimStorage::new();
    let open = || {
        Log::open_opts(
            "/sim/log",
            OpenOptions {
                segment_bytes: SEGMENT,
                repair: false,
                storage: Some(Arc::new(disk.clone())),
                ..OpenOptions::default()
            },
        )
    };
    let log = open().expect("open");
    disk.fill_disk_after(1 << 30);
    // The open segment is empty: it would grow.
    match log.begin(None, 0x8000, b"", 2 << 30) {
        Err(Error::Io(_)) => {}
        other => panic!("2 GiB began in an empty segment: {other:?}"),
    }
    log.append_raw(0x8000, b"", &[1; 100]).expect("append");
    let before = disk.files();
    // The open segment holds a frame: it would roll.
    match log.begin(None, 0x8000, b"", 2 << 30) {
        Err(Error::Io(_)) => {}
        other => panic!("2 GiB began in a new segment: {other:?}"),
    }
    assert_eq!(log.poisoned_by(), None);
    let mut after = disk.files();
    let mut before = before;
    after.sort();
    before.sort();
    assert_eq!(after, before, "no segment left half made");
    let seq = log.append_raw(0x8000, b"", b"after").expect("append");
    drop(log);
    let log = open().expect("reopen");
    assert_eq!(log.head_seq(), seq);
    assert_eq!(log.read(seq).expect("read").blob, b"after");
}

/// What an earlier build left after an append announcing 2^63 - 1 bytes:
/// the old segment sealed, and a 64-byte segment whose header asks for a
/// capacity no disk can reserve (it wrote the header, then failed to
/// reserve). Opening it must not fail for ever: the empty segment is
/// shrunk back to the segment size, and the log takes appends.
#[test]
fn open_shrinks_a_header_only_segment_an_unreservable_frame_left() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (history, head) = {
        let log = Log::open_with(dir.path(), SEGMENT).expect("open");
        for i in 0..3u8 {
            log.append_raw(0x8000, b"", &[i; 100]).expect("append");
        }
        (log.history(), log.head_seq())
    };
    let next = head + 1;
    {
        // A roll seals the old segment and completes its index; the new
        // one it made is replaced by what the failed roll left.
        let log = Log::open_with(dir.path(), SEGMENT).expect("reopen");
        log.retain_from(1).expect("roll");
    }
    let planted = segment_path(dir.path(), next);
    std::fs::remove_file(index_path(dir.path(), next)).expect("no index yet");
    let header = SegmentHeader {
        first_seq: next,
        history: history.0,
        capacity: i64::MAX as u64 + 88,
    };
    std::fs::write(&planted, header.encode()).expect("plant");

    let log = Log::open_with(dir.path(), SEGMENT).expect("open after the old failure");
    assert_eq!(
        log.recovery().shrunk_empty.as_deref(),
        Some(planted.as_path())
    );
    assert_eq!(log.head_seq(), head);
    assert_eq!(log.append_raw(0x8000, b"", b"new").expect("append"), next);
    drop(log);
    let log = Log::open_with(dir.path(), SEGMENT).expect("reopen");
    assert_eq!(log.read(next).expect("read").blob, b"new");
    assert_eq!(log.recovery().shrunk_empty, None, "done once");
}
