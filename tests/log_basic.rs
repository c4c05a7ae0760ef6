//! The log's API, method by method, on the real file system.

use twinlog::log::{Error, Kind, Log, Meta};

fn meta(repo: &str) -> Meta {
    Meta::repo(repo)
}

#[test]
fn append_read_reopen_across_segments() {
    let dir = tempfile::tempdir().expect("tempdir");
    {
        let log = Log::open_with(dir.path(), 4096).expect("open");
        assert_eq!(log.head_seq(), 0);
        assert_eq!(log.first_seq(), 1);
        for i in 1..=100u64 {
            let blob = vec![i as u8; (i * 13 % 700) as usize];
            assert_eq!(
                log.append(Kind::Pack, &meta("r"), &blob).expect("append"),
                i
            );
        }
        assert!(log.layout().len() > 5, "{:?}", log.layout());
        let e = log.read(42).expect("read");
        assert_eq!(e.blob, vec![42u8; 546]);
        assert_eq!(e.kind().expect("kind"), Kind::Pack);
        assert_eq!(Meta::decode(&e.meta).expect("meta").repo, "r");
        let all = log.range(1, 1000).expect("range");
        assert_eq!(all.len(), 100);
        assert!(all.iter().enumerate().all(|(i, e)| e.seq == i as u64 + 1));
    }
    let log = Log::open_with(dir.path(), 4096).expect("reopen");
    assert_eq!(log.head_seq(), 100);
    assert!(log.recovery().cut.is_none(), "{:?}", log.recovery());
    for i in 1..=100u64 {
        assert_eq!(
            log.read(i).expect("read").blob.len(),
            (i * 13 % 700) as usize
        );
    }
    assert_eq!(
        log.append(Kind::Refs, &meta("r"), b"x").expect("append"),
        101
    );
    let mut seen = Vec::new();
    log.scan_meta(|seq, kind, m| seen.push((seq, kind, m.to_vec())))
        .expect("scan");
    assert_eq!(seen.len(), 101);
    assert_eq!(seen[100].1, Kind::Refs.as_u16());
}

#[test]
fn second_writer_is_refused_by_name() {
    let dir = tempfile::tempdir().expect("tempdir");
    let _log = Log::open(dir.path()).expect("open");
    assert!(matches!(Log::open(dir.path()), Err(Error::Locked(_))));
}

#[test]
fn append_at_refuses_anything_but_head_plus_one() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = Log::open(dir.path()).expect("open");
    log.set_follower(true);
    assert!(matches!(
        log.append(Kind::Pack, &meta("r"), b"x"),
        Err(Error::Follower)
    ));
    assert!(matches!(log.begin(None, 2, b"", 1), Err(Error::Follower)));
    assert!(matches!(
        log.append_at(2, 2, b"", b"x"),
        Err(Error::Gap {
            expected: 1,
            got: 2
        })
    ));
    assert_eq!(log.append_at(1, 2, b"", b"x").expect("append_at"), 1);
    assert!(matches!(
        log.append_at(1, 2, b"", b"x"),
        Err(Error::Gap {
            expected: 2,
            got: 1
        })
    ));
}

#[test]
fn streaming_append_commits_aborts_and_checks_length() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = Log::open_with(dir.path(), 4096).expect("open");
    let mut p = log
        .begin(None, Kind::LfsPut.as_u16(), b"m", 10_000)
        .expect("begin");
    for chunk in vec![7u8; 10_000].chunks(999) {
        p.write(chunk).expect("write");
    }
    assert!(matches!(
        p.write(b"x"),
        Err(Error::BlobLength {
            announced: 10_000,
            got: 10_001
        })
    ));
    assert_eq!(p.commit().expect("commit"), 1);
    let p = log.begin(None, 2, b"", 5).expect("begin");
    p.abort().expect("abort");
    let mut p = log.begin(None, 2, b"", 5).expect("begin");
    p.write(b"abc").expect("write");
    assert!(matches!(
        p.commit(),
        Err(Error::BlobLength {
            announced: 5,
            got: 3
        })
    ));
    assert_eq!(log.head_seq(), 1);
    assert_eq!(log.append_raw(2, b"", b"after").expect("append"), 2);
    drop(log);
    let log = Log::open_with(dir.path(), 4096).expect("reopen");
    assert_eq!(log.head_seq(), 2);
    assert_eq!(log.read(1).expect("read").blob, vec![7u8; 10_000]);
    assert_eq!(log.read(2).expect("read").blob, b"after");
}

#[test]
fn group_commit_via_commit_unsynced_and_sync() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = Log::open(dir.path()).expect("open");
    log.set_follower(true);
    for seq in 1..=10 {
        let mut p = log.begin(Some(seq), 2, b"", 3).expect("begin");
        p.write(b"abc").expect("write");
        p.commit_unsynced().expect("commit");
    }
    assert_eq!(log.head_seq(), 0);
    assert_eq!(log.unsynced(), 10);
    assert!(matches!(log.read(1), Err(Error::PastHead { .. })));
    let before = log.frame_syncs();
    assert_eq!(log.sync().expect("sync"), 10);
    assert_eq!(log.frame_syncs() - before, 1);
    assert_eq!(log.unsynced(), 0);
    assert_eq!(log.sync().expect("sync"), 10);
    assert_eq!(log.frame_syncs() - before, 1);
}

#[test]
fn retention_and_restarts() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = Log::open_with(dir.path(), 1024).expect("open");
    for _ in 0..50 {
        log.append_raw(2, b"", &[1u8; 100]).expect("append");
    }
    let layout = log.layout();
    let (f2, _, _) = layout[2];
    assert_eq!(log.truncate_before(f2).expect("truncate"), f2);
    assert!(matches!(log.read(1), Err(Error::BelowFloor { seq: 1, .. })));
    assert_eq!(log.retain_from(1000).expect("retain"), 51);
    assert_eq!(log.head_seq(), 50);
    assert_eq!(log.append_raw(2, b"", b"x").expect("append"), 51);
    log.restart_after(500).expect("restart");
    assert_eq!((log.first_seq(), log.head_seq()), (501, 500));
    assert_eq!(log.append_raw(2, b"", b"x").expect("append"), 501);
    assert!(matches!(
        log.reset(0),
        Err(Error::NotFresh {
            frames: 1,
            keep_at_most: 0
        })
    ));
    log.reset(1).expect("reset");
    assert_eq!((log.first_seq(), log.head_seq()), (1, 0));
    drop(log);
    let log = Log::open_with(dir.path(), 1024).expect("reopen");
    assert_eq!((log.first_seq(), log.head_seq()), (1, 0));
}

#[test]
fn release_reacquire_refuses_a_changed_segment() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = Log::open(dir.path()).expect("open");
    log.append_raw(2, b"", b"one").expect("append");
    log.release().expect("release");
    log.release().expect("release twice");
    assert!(matches!(log.append_raw(2, b"", b"x"), Err(Error::Released)));
    assert_eq!(log.read(1).expect("read while released").blob, b"one");
    log.reacquire().expect("reacquire");
    log.reacquire().expect("reacquire twice");
    assert_eq!(log.append_raw(2, b"", b"two").expect("append"), 2);
    log.release().expect("release");
    let seg = dir.path().join("00000000000000000001.log");
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(&seg)
        .expect("open seg");
    f.set_len(100).expect("shrink");
    assert!(matches!(log.reacquire(), Err(Error::SegmentChanged { .. })));
}

#[test]
fn verify_finds_a_flipped_payload_byte_in_a_sealed_segment() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = Log::open_with(dir.path(), 1024).expect("open");
    for i in 0..40u8 {
        log.append_raw(2, b"", &[i; 100]).expect("append");
    }
    assert_eq!(log.verify().expect("verify"), 40);
    drop(log);
    let seg = dir.path().join("00000000000000000001.log");
    let mut bytes = std::fs::read(&seg).expect("read seg");
    bytes[64 + 32 + 50] ^= 0x40;
    std::fs::write(&seg, bytes).expect("write seg");
    let log = Log::open_with(dir.path(), 1024).expect("a payload flip in a sealed segment opens");
    assert!(matches!(log.read(1), Err(Error::Corrupt(_))));
    assert!(matches!(log.verify(), Err(Error::Corrupt(_))));
    assert_eq!(
        log.read(2).expect("the next frame reads").blob,
        vec![1u8; 100]
    );
}

#[test]
fn history_is_minted_once_kept_across_reopens_and_adopted_only_when_empty() {
    let a = tempfile::tempdir().expect("tempdir");
    let b = tempfile::tempdir().expect("tempdir");
    let la = Log::open(a.path()).expect("open a");
    let lb = Log::open(b.path()).expect("open b");
    let ha = la.history();
    assert_ne!(ha, lb.history(), "two new logs have two histories");
    lb.adopt_history(ha).expect("an empty log adopts a history");
    assert_eq!(lb.history(), ha);
    la.append_raw(2, b"", b"x").expect("append");
    assert!(matches!(
        la.adopt_history(twinlog::log::HistoryId([1; 16])),
        Err(Error::History(_))
    ));
    drop((la, lb));
    assert_eq!(Log::open(a.path()).expect("reopen a").history(), ha);
    assert_eq!(Log::open(b.path()).expect("reopen b").history(), ha);
}

#[test]
fn freeze_waits_for_mutations_in_flight_and_holds_back_new_ones() {
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::Barrier;
    use std::time::Duration;

    let dir = tempfile::tempdir().expect("tempdir");
    let log = Log::open(dir.path()).expect("open");
    let stage = AtomicU32::new(0);
    let entered = Barrier::new(2);
    std::thread::scope(|s| {
        s.spawn(|| {
            let _outer = log.mutation();
            let _nested = log.mutation();
            entered.wait();
            // The freeze is under way, waiting for this mutation.
            testkit::wait::until_blocking("freezing", Duration::from_secs(30), || {
                log.freeze_state().0.then_some(())
            });
            stage.store(1, Ordering::SeqCst);
        });
        entered.wait();
        let frozen = log.freeze();
        assert_eq!(
            stage.load(Ordering::SeqCst),
            1,
            "freeze returned before the mutation ended"
        );
        let _mine = log.mutation(); // the freezing thread itself passes
        let blocked = s.spawn(|| {
            let _m = log.mutation();
            stage.load(Ordering::SeqCst)
        });
        // The other thread is held back at the gate.
        testkit::wait::until_blocking("a mutation held back", Duration::from_secs(30), || {
            (log.freeze_state().1 == 1).then_some(())
        });
        stage.store(2, Ordering::SeqCst);
        drop(_mine);
        drop(frozen);
        assert_eq!(
            blocked.join().expect("join"),
            2,
            "a mutation started during the freeze"
        );
    });
}

#[test]
fn a_tail_checks_large_frames_a_piece_at_a_time() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = Log::open(dir.path()).expect("open");
    log.append_raw(2, b"m", b"small").expect("append");
    let big: Vec<u8> = (0..3u32 << 20).map(|i| i as u8).collect();
    log.append_raw(2, b"", &big).expect("append");
    let mut tail = twinlog::log::Tail::open(dir.path(), 0).expect("tail");
    let h1 = tail.next_checked().expect("check").expect("frame 1");
    let h2 = tail.next_checked().expect("check").expect("frame 2");
    assert_eq!((h1.seq, h2.seq, h2.blob_len), (1, 2, 3 << 20));
    assert!(tail.next_checked().expect("check").is_none(), "caught up");
    drop(log);
    let seg = dir.path().join("00000000000000000001.log");
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(&seg)
        .expect("open seg");
    std::os::unix::fs::FileExt::write_all_at(&f, b"X", 64 + 32 + 1 + 5 + 32 + 2_000_000)
        .expect("damage");
    let mut tail = twinlog::log::Tail::open(dir.path(), 0).expect("tail");
    assert!(tail.next_checked().expect("frame 1 is whole").is_some());
    assert!(matches!(tail.next_checked(), Err(Error::Corrupt(_))));
}

#[test]
fn scan_kinds_walks_headers_from_any_sequence_across_segments() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = Log::open_with(dir.path(), 4096).expect("open");
    let kinds = [Kind::Pack, Kind::Refs, Kind::App(0x8000), Kind::Record];
    for i in 0..200u64 {
        let k = kinds[(i % 4) as usize];
        log.append(k, &meta("r"), &vec![i as u8; (i as usize * 37) % 700])
            .expect("append");
    }
    assert!(log.layout().len() > 5, "several segments");
    for from in [1, 2, 57, 199, 200] {
        let mut seen = Vec::new();
        log.scan_kinds::<twinlog::log::Error>(from, 10_000, |seq, kind| {
            seen.push((seq, kind));
            Ok(())
        })
        .expect("scan");
        let want: Vec<(u64, u16)> = (from..=200)
            .map(|s| (s, kinds[((s - 1) % 4) as usize].as_u16()))
            .collect();
        assert_eq!(seen, want, "from {from}");
    }
    let mut n = 0;
    log.scan_kinds::<twinlog::log::Error>(10, 20, |_, _| {
        n += 1;
        Ok(())
    })
    .expect("scan");
    assert_eq!(n, 11);
    log.truncate_before(100).expect("truncate");
    assert!(log
        .scan_kinds::<twinlog::log::Error>(1, 5, |_, _| Ok(()))
        .is_err());
}
