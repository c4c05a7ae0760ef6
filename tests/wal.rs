//! The embedding API: LSNs, append then commit, the lending reader, loud
//! errors, and a reader tailing the log from another process.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use twinlog::log::SimStorage;
use twinlog::wal::{Lsn, Wal, WalError, WalOptions};

#[path = "support/wal_records.rs"]
mod wal_records;

use wal_records::{record, small, CHILD_RECORDS};

#[test]
fn lsns_are_dense_from_one_and_commit_is_the_watermark() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut wal = Wal::open_with(dir.path(), small(1024)).expect("open");
    assert_eq!(wal.commit().expect("empty commit"), Lsn::NONE);
    for lsn in 1..=300u64 {
        assert_eq!(wal.append(&record(lsn)).expect("append"), Lsn(lsn));
        if lsn % 7 == 0 {
            assert_eq!(wal.commit().expect("commit"), Lsn(lsn));
        }
    }
    assert_eq!(wal.durable(), Lsn(294));
    assert_eq!(wal.commit().expect("commit"), Lsn(300));
    let syncs = wal.log().frame_syncs();
    assert_eq!(wal.commit().expect("no-op commit"), Lsn(300));
    assert_eq!(wal.log().frame_syncs(), syncs, "a no-op commit does no I/O");
    assert!(wal.log().layout().len() > 3, "records span segments");
    drop(wal);
    let wal = Wal::open_with(dir.path(), small(1024)).expect("reopen");
    let mut reader = wal.reader_from(Lsn(0)).expect("reader");
    let mut next = 1;
    while let Some(r) = reader.next() {
        let (lsn, payload) = r.expect("record");
        assert_eq!(lsn, Lsn(next));
        assert_eq!(payload, &record(next)[..]);
        next += 1;
    }
    assert_eq!(next, 301);
}

#[test]
fn too_large_is_refused_and_nothing_is_split() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut wal = Wal::open_with(dir.path(), small(1024)).expect("open");
    let big = vec![0u8; 2048];
    assert!(matches!(
        wal.append(&big),
        Err(WalError::RecordTooLarge {
            len: 2048,
            max: 1024
        })
    ));
    assert_eq!(wal.append(&[1u8; 1024]).expect("at the limit"), Lsn(1));
    assert_eq!(wal.commit().expect("commit"), Lsn(1));
}

#[test]
fn reading_below_the_retention_floor_is_loud() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut wal = Wal::open_with(dir.path(), small(1024)).expect("open");
    for lsn in 1..=200u64 {
        wal.append(&record(lsn)).expect("append");
    }
    wal.commit().expect("commit");
    let first = wal.truncate_before(Lsn(100)).expect("truncate");
    assert!(first > Lsn(1) && first <= Lsn(100));
    match wal.reader_from(Lsn(1)) {
        Err(WalError::BelowFloor { from, first: f }) => assert_eq!((from, f), (Lsn(1), first)),
        other => panic!("expected BelowFloor, got {other:?}"),
    }
    let mut reader = wal.reader_from(Lsn(150)).expect("reader");
    let (lsn, payload) = reader.next().expect("some").expect("ok");
    assert_eq!((lsn, payload), (Lsn(150), &record(150)[..]));
    let mut from_oldest = wal.reader_from(Lsn(0)).expect("reader");
    assert_eq!(from_oldest.next().expect("some").expect("ok").0, first);
}

#[test]
fn a_failed_commit_poisons_the_wal() {
    let disk = SimStorage::new();
    let opts = WalOptions {
        storage: Some(Arc::new(disk.clone())),
        ..small(1024)
    };
    let mut wal = Wal::open_with("/wal", opts).expect("open");
    wal.append(b"one").expect("append");
    wal.commit().expect("commit");
    disk.fail_sync_in(1);
    wal.append(b"two").expect("append");
    assert!(wal.commit().is_err());
    assert!(matches!(wal.append(b"three"), Err(WalError::Poisoned(_))));
    assert!(matches!(
        wal.commit(),
        Ok(Lsn(1)) | Err(WalError::Poisoned(_))
    ));
    let mut reader = wal.reader_from(Lsn(1)).expect("reads still work");
    assert_eq!(reader.next().expect("some").expect("ok").1, b"one");
}

#[test]
fn external_reader_tails_another_process() {
    let dir = tempfile::tempdir().expect("tempdir");
    // The writer is another process (`twinlog-test-child wal-writer`).
    let mut child = Command::new(env!("CARGO_BIN_EXE_twinlog-test-child"))
        .arg("wal-writer")
        .arg(dir.path())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn writer");
    let mut out = BufReader::new(child.stdout.take().expect("stdout"));
    let mut line = String::new();
    while !line.contains("ready") {
        line.clear();
        assert!(out.read_line(&mut line).expect("read") > 0, "writer died");
    }
    let mut reader = Wal::external_reader(dir.path(), Lsn(1)).expect("external reader");
    for lsn in 1..=CHILD_RECORDS {
        let (got, payload) = reader
            .wait_next(Duration::from_secs(30))
            .expect("a record within 30 s")
            .expect("record");
        assert_eq!(got, Lsn(lsn));
        assert_eq!(payload, record(lsn));
    }
    assert!(child.wait().expect("wait").success());
    assert!(reader.next().is_none());
}
