//! Readers keep the open segment's files between reads: every change of
//! those files (a roll, a cut, a restart, retention, a release) is seen by
//! the next read, and no file retention removed is held open.

use std::path::Path;

use twinlog::log::{Error, Log};

const KIND: u16 = 1000;

fn blob(tag: u8, n: u64) -> Vec<u8> {
    vec![tag; 100 + (n % 7) as usize]
}

fn append(log: &Log, tag: u8, n: u64) -> u64 {
    log.append_raw(KIND, &[tag], &blob(tag, n)).expect("append")
}

fn assert_reads(log: &Log, seq: u64, tag: u8, n: u64) {
    let e = log.read(seq).expect("read");
    assert_eq!((e.meta, e.blob), (vec![tag], blob(tag, n)), "frame {seq}");
}

/// The files under `dir` this process holds open, as `/proc` names them
/// (a removed one ends in ` (deleted)`).
fn held_open(dir: &Path) -> Vec<String> {
    let dir = dir.to_string_lossy().to_string();
    std::fs::read_dir("/proc/self/fd")
        .expect("/proc/self/fd")
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .map(|p| p.to_string_lossy().to_string())
        .filter(|p| p.starts_with(&dir))
        .collect()
}

fn removed_but_open(dir: &Path) -> Vec<String> {
    let mut held = held_open(dir);
    held.retain(|p| p.ends_with("(deleted)"));
    held
}

/// A log in `dir` holding frames 1..=`frames` of `tag`, the last one read
/// (so that its segment's files are kept).
fn filled(dir: &Path, segment_bytes: u64, frames: u64, tag: u8) -> Log {
    let log = Log::open_with(dir, segment_bytes).expect("open");
    for n in 1..=frames {
        assert_eq!(append(&log, tag, n), n);
    }
    assert_reads(&log, frames, tag, frames);
    log
}

const SEGMENT: u64 = 64 << 20;

#[test]
fn a_cut_and_new_frames_at_the_same_numbers_read_back_new() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = filled(dir.path(), SEGMENT, 10, 1);
    log.truncate_after(5).expect("cut");
    assert!(matches!(log.read(8), Err(Error::PastHead { .. })));
    for n in 6..=10 {
        assert_eq!(append(&log, 2, n), n);
    }
    assert_reads(&log, 5, 1, 5);
    assert_reads(&log, 8, 2, 8);
}

#[test]
fn a_restart_is_read_from_its_new_segment() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = filled(dir.path(), SEGMENT, 10, 1);
    log.restart_after(20).expect("restart");
    assert!(removed_but_open(dir.path()).is_empty());
    assert!(matches!(log.read(10), Err(Error::BelowFloor { .. })));
    assert_eq!(append(&log, 3, 21), 21);
    assert_reads(&log, 21, 3, 21);
}

#[test]
fn rolls_and_retention_leave_no_removed_segment_open() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = Log::open_with(dir.path(), 4096).expect("open");
    for n in 1..=200 {
        let seq = append(&log, 4, n);
        // Every frame is read while its segment is the open one.
        assert_reads(&log, seq, 4, n);
    }
    let segments = std::fs::read_dir(dir.path())
        .expect("dir")
        .filter(|e| {
            e.as_ref()
                .is_ok_and(|e| e.path().extension().is_some_and(|x| x == "log"))
        })
        .count();
    assert!(segments > 3, "{segments} segments");
    let first = log.retain_from(150).expect("retain");
    assert!(first > 1);
    assert!(
        removed_but_open(dir.path()).is_empty(),
        "{:?}",
        removed_but_open(dir.path())
    );
    assert!(matches!(log.read(1), Err(Error::BelowFloor { .. })));
    assert_reads(&log, 200, 4, 200);
}

#[test]
fn a_released_log_holds_no_file_for_its_readers() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = filled(dir.path(), SEGMENT, 5, 5);
    log.release().expect("release");
    assert_reads(&log, 4, 5, 4);
    let segments: Vec<_> = held_open(dir.path())
        .into_iter()
        .filter(|p| p.ends_with(".log") || p.ends_with(".idx"))
        .collect();
    assert!(
        segments.is_empty(),
        "a released log keeps {segments:?} open"
    );
    log.reacquire().expect("reacquire");
    assert_eq!(append(&log, 6, 6), 6);
    assert_reads(&log, 6, 6, 6);
}
