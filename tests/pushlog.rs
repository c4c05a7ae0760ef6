//! The push log: pushes survive reopens; a frame cut or damaged at any byte
//! when it is the last, or garbage after the last frame, is discarded whole
//! and never an error, and the next push follows the last whole one; damage
//! before the last frame is refused by name with its offset, and no refs
//! are ever read from it.

use twinlog::pushlog::{
    encode_frame, scan_frames, Push, PushLog, PushLogError, RefUpdate, ScanError, ARROW_PANICKED,
    ENVELOPE_LEN,
};

fn oid(n: u8) -> [u8; 20] {
    [n; 20]
}

fn push(seq: u64) -> Push {
    let mut updates = vec![
        RefUpdate {
            name: format!("refs/heads/topic-{seq}"),
            old: None,
            new: Some(oid(seq as u8)),
        },
        RefUpdate {
            name: "refs/heads/main".into(),
            old: Some(oid(1)),
            new: Some(oid(2)),
        },
    ];
    if seq % 3 == 0 {
        updates.push(RefUpdate {
            name: "refs/tags/gone".into(),
            old: Some(oid(9)),
            new: None,
        });
    }
    Push {
        seq,
        at_ms: 1_700_000_000_000 + seq,
        updates,
    }
}

#[test]
fn pushes_round_trip_and_survive_a_reopen() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("refs.pushlog");
    {
        let mut log = PushLog::open(&path).expect("open");
        assert!(log.is_empty());
        for seq in 1..=20 {
            log.append(&push(seq)).expect("append");
        }
    }
    let log = PushLog::open(&path).expect("reopen");
    assert_eq!(
        log.pushes(),
        (1..=20).map(push).collect::<Vec<_>>().as_slice()
    );
    let empty = Push {
        seq: 1,
        at_ms: 0,
        updates: vec![],
    };
    assert!(
        encode_frame(&empty).is_err(),
        "a push moves at least one ref"
    );
}

#[test]
fn a_frame_cut_at_any_byte_is_discarded_whole() {
    let frames: Vec<Vec<u8>> = (1..=3)
        .map(|s| encode_frame(&push(s)).expect("encode"))
        .collect();
    let whole: Vec<u8> = frames.concat();
    let two = frames[0].len() + frames[1].len();
    for cut in two..whole.len() {
        let scan = scan_frames(&whole[..cut]).expect("a torn tail is no error");
        assert_eq!(scan.pushes, vec![push(1), push(2)], "cut at {cut}");
        assert_eq!(scan.good_bytes, two as u64);
        assert_eq!(scan.discarded_bytes, (cut - two) as u64);
    }
    assert_eq!(scan_frames(&whole).expect("scan").pushes.len(), 3);
    let mut garbage = whole.clone();
    garbage.extend_from_slice(&[0u8; 100]);
    garbage.extend_from_slice(b"not arrow at all");
    let scan = scan_frames(&garbage).expect("garbage after the last frame is no error");
    assert_eq!(scan.pushes.len(), 3);
    assert_eq!(scan.good_bytes, whole.len() as u64);
}

/// Three frames, and where the second starts and ends.
fn three_frames() -> (Vec<u8>, std::ops::Range<usize>) {
    let frames: Vec<Vec<u8>> = (1..=3)
        .map(|s| encode_frame(&push(s)).expect("encode"))
        .collect();
    let middle = frames[0].len()..frames[0].len() + frames[1].len();
    (frames.concat(), middle)
}

#[test]
fn a_bit_flip_anywhere_in_a_middle_frame_is_refused_by_name_with_its_offset() {
    let (whole, middle) = three_frames();
    for i in middle.clone() {
        for bit in 0..8 {
            let mut bad = whole.clone();
            bad[i] ^= 1 << bit;
            match scan_frames(&bad) {
                Err(ScanError::Damaged { offset, .. }) => {
                    assert_eq!(offset, middle.start as u64, "flip at {i}.{bit}")
                }
                other => panic!("flip at {i}.{bit}: {other:?}"),
            }
        }
    }
    // Through `open`: named with the file and the offset, and the file is
    // left as it is for whoever repairs it.
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("refs.pushlog");
    for i in [
        middle.start,
        middle.start + 13,
        middle.start + ENVELOPE_LEN + 100,
        middle.end - 1,
    ] {
        let mut bad = whole.clone();
        bad[i] ^= 0x40;
        std::fs::write(&path, &bad).expect("write");
        match PushLog::open(&path) {
            Err(PushLogError::Corrupt {
                path: p, offset, ..
            }) => {
                assert_eq!(p, path);
                assert_eq!(offset, middle.start as u64, "flip at {i}");
            }
            other => panic!("flip at {i}: {other:?}"),
        }
        assert_eq!(std::fs::read(&path).expect("read"), bad, "nothing cut");
    }
}

#[test]
fn a_bit_flip_anywhere_in_the_last_frame_is_cut_as_a_torn_tail() {
    let (whole, middle) = three_frames();
    for i in middle.end..whole.len() {
        let mut bad = whole.clone();
        bad[i] ^= 1 << (i % 8);
        let scan = scan_frames(&bad).expect("a damaged last frame is a torn tail");
        assert_eq!(scan.pushes, vec![push(1), push(2)], "flip at {i}");
        assert_eq!(scan.good_bytes, middle.end as u64);
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("refs.pushlog");
    let mut bad = whole.clone();
    bad[middle.end + ENVELOPE_LEN + 200] ^= 1;
    std::fs::write(&path, &bad).expect("write");
    let mut log = PushLog::open(&path).expect("open");
    assert_eq!(log.pushes(), &[push(1), push(2)]);
    assert_eq!(log.len(), middle.end as u64, "cut after the second frame");
    log.append(&push(4)).expect("append after the cut");
}

#[test]
fn a_frame_whose_crc_matches_but_whose_arrow_bytes_were_altered_never_panics() {
    let frame = encode_frame(&push(3)).expect("encode");
    let ipc = &frame[ENVELOPE_LEN..];
    let enveloped = |ipc: &[u8]| {
        let mut f = frame[..ENVELOPE_LEN].to_vec();
        f[12..16].copy_from_slice(&(ipc.len() as u32).to_le_bytes());
        f[16..20].copy_from_slice(&crc32fast::hash(ipc).to_le_bytes());
        let header_crc = crc32fast::hash(&f[..20]);
        f[20..24].copy_from_slice(&header_crc.to_le_bytes());
        f.extend_from_slice(ipc);
        f
    };
    assert_eq!(
        scan_frames(&enveloped(ipc)).expect("scan").pushes,
        vec![push(3)]
    );
    let mut refused = 0;
    for i in 0..ipc.len() {
        for x in [0x01, 0x80, 0xff] {
            let mut altered = ipc.to_vec();
            altered[i] ^= x;
            // A written frame of other bytes: refused at its offset, or (an
            // oid or a name's byte) another push; a panic fails the test.
            match scan_frames(&enveloped(&altered)) {
                // Refused by the checks before arrow-ipc, not by catching
                // its panic.
                Err(ScanError::Damaged { offset: 0, why }) if !why.contains(ARROW_PANICKED) => {
                    refused += 1
                }
                Ok(scan) => assert_eq!(scan.pushes.len(), 1, "alteration at {i}"),
                other => panic!("alteration at {i}: {other:?}"),
            }
        }
    }
    assert!(
        refused > ipc.len(),
        "most alterations are refused: {refused}"
    );
}

#[test]
fn a_version_1_file_of_bare_arrow_streams_is_refused_by_name_and_left_as_it_is() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("refs.pushlog");
    // Version 1 wrote each push's Arrow IPC stream with no envelope.
    let old: Vec<u8> = (1..=2)
        .flat_map(|s| encode_frame(&push(s)).expect("encode")[ENVELOPE_LEN..].to_vec())
        .collect();
    std::fs::write(&path, &old).expect("write");
    match PushLog::open(&path) {
        Err(PushLogError::Version {
            path: p, found: 1, ..
        }) => assert_eq!(p, path),
        other => panic!("{other:?}"),
    }
    assert_eq!(std::fs::read(&path).expect("read"), old, "nothing cut");
}

#[test]
fn damage_in_the_reflog_archive_is_refused_by_name_even_in_its_last_frame() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("refs.pushlog");
    let mut log = PushLog::open(&path).expect("open");
    for seq in 1..=3 {
        log.append(&push(seq)).expect("append");
    }
    log.compact(twinlog::pushlog::Finish::Swap)
        .expect("compact");
    let archive = PushLog::archive_path(&path);
    let good = std::fs::read(&archive).expect("read");
    let second = encode_frame(&push(1)).expect("encode").len();
    let last = second + encode_frame(&push(2)).expect("encode").len();
    for (i, offset) in [(second + 40, second), (good.len() - 1, last)] {
        let mut bad = good.clone();
        bad[i] ^= 1;
        std::fs::write(&archive, &bad).expect("write");
        match log.history() {
            Err(PushLogError::Corrupt {
                path: p, offset: o, ..
            }) => {
                assert_eq!(p, archive);
                assert_eq!(o, offset as u64, "flip at {i}");
            }
            other => panic!("flip at {i}: {other:?}"),
        }
        assert!(
            log.retain_from(2).is_err(),
            "no erase over a damaged archive"
        );
    }
    std::fs::write(&archive, &good).expect("write");
    assert_eq!(log.history().expect("history").len(), 3);
}

#[test]
fn reopening_after_a_torn_append_cuts_it_and_goes_on() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("refs.pushlog");
    {
        let mut log = PushLog::open(&path).expect("open");
        log.append(&push(1)).expect("append");
        log.append(&push(2)).expect("append");
    }
    let full = std::fs::read(&path).expect("read");
    let third = encode_frame(&push(3)).expect("encode");
    for cut in [1, 8, third.len() / 2, third.len() - 1] {
        let mut torn = full.clone();
        torn.extend_from_slice(&third[..cut]);
        std::fs::write(&path, &torn).expect("write");
        let mut log = PushLog::open(&path).expect("a torn tail is not an error");
        assert_eq!(log.pushes(), &[push(1), push(2)]);
        assert_eq!(
            std::fs::metadata(&path).expect("stat").len(),
            full.len() as u64,
            "cut to the last whole frame"
        );
        log.append(&push(4)).expect("append after the cut");
        drop(log);
        let log = PushLog::open(&path).expect("reopen");
        assert_eq!(log.pushes(), &[push(1), push(2), push(4)]);
        std::fs::write(&path, &full).expect("restore");
    }
}

#[test]
fn a_frame_of_four_refs_costs_what_the_seed_measured() {
    let p = Push {
        seq: 7,
        at_ms: 1,
        updates: (0..4)
            .map(|i| RefUpdate {
                name: format!("refs/heads/b{i}"),
                old: Some(oid(i)),
                new: Some(oid(i + 1)),
            })
            .collect(),
    };
    let frame = encode_frame(&p).expect("encode");
    // Schema per frame plus a batch with Arrow's 64-byte alignment: a few
    // KiB at most, never the size of a database page per push.
    assert!(frame.len() < 4096, "{} bytes", frame.len());
    eprintln!("bytes per frame, 4 refs: {}", frame.len());
}

use twinlog::pushlog::{CompactionPolicy, Finish};

/// A compaction stopped after any step, as a crash would stop it, leaves
/// every push exactly once across the live log and the archive, and the
/// same refs; a finished one shrinks the live log to one checkpoint frame.
#[test]
fn compaction_keeps_every_push_exactly_once_whatever_step_it_stops_at() {
    for finish in [Finish::Staged, Finish::Archived, Finish::Swap] {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("refs.pushlog");
        let mut log = PushLog::open(&path).expect("open");
        for seq in 1..=10 {
            log.append(&push(seq)).expect("append");
        }
        // A first compaction that finished, so the archive is not empty.
        assert!(log.compaction_due(&CompactionPolicy { min_pushes: 10 }));
        log.compact(Finish::Swap).expect("compact");
        for seq in 11..=30 {
            log.append(&push(seq)).expect("append");
        }
        let refs = log.refs();
        let before = log.len();
        let report = log.compact(finish).expect("compact");
        drop(log);
        let log = PushLog::open(&path).expect("reopen");
        let history: Vec<u64> = log
            .history()
            .expect("history")
            .iter()
            .map(|p| p.seq)
            .collect();
        assert_eq!(
            history,
            (1..=30).collect::<Vec<_>>(),
            "{finish:?}: every push once"
        );
        assert_eq!(log.refs(), refs, "{finish:?}: the same refs");
        assert!(!PushLog::archive_path(&path)
            .with_extension("compact")
            .exists());
        if finish == Finish::Swap {
            assert!(log.pushes().is_empty());
            assert!(log.len() < before, "{} -> {}", before, log.len());
            eprintln!(
                "compaction of {} pushes: live log {} -> {} bytes",
                report.retired, report.live_bytes_before, report.live_bytes_after
            );
        } else {
            assert_eq!(log.pushes().len(), 20, "{finish:?}: rolled back");
        }
        let mut log = log;
        log.append(&push(31)).expect("append after");
        assert_eq!(log.history().expect("history").len(), 31);
    }
}

/// A compaction after every ref was deleted still writes its checkpoint:
/// an interrupted one is rolled back with every push once, and a finished
/// one keeps the last seq, so a replayed push is not appended again.
#[test]
fn a_compaction_that_leaves_no_refs_keeps_every_push_once_and_the_last_seq() {
    let created = Push {
        seq: 5,
        at_ms: 1,
        updates: vec![RefUpdate {
            name: "refs/heads/gone".into(),
            old: None,
            new: Some(oid(1)),
        }],
    };
    let deleted = Push {
        seq: 6,
        at_ms: 2,
        updates: vec![RefUpdate {
            name: "refs/heads/gone".into(),
            old: Some(oid(1)),
            new: None,
        }],
    };
    for finish in [Finish::Staged, Finish::Archived, Finish::Swap] {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("refs.pushlog");
        let mut log = PushLog::open(&path).expect("open");
        log.append(&created).expect("append");
        log.append(&deleted).expect("append");
        log.compact(finish).expect("compact");
        assert_eq!(log.last_seq(), 6, "{finish:?}");
        drop(log);
        let log = PushLog::open(&path).expect("reopen");
        let seqs: Vec<u64> = log
            .history()
            .expect("history")
            .iter()
            .map(|p| p.seq)
            .collect();
        assert_eq!(seqs, vec![5, 6], "{finish:?}: every push once");
        assert!(log.refs().is_empty());
        assert_eq!(log.last_seq(), 6, "{finish:?}: the last seq kept");
    }
}

use twinlog::pushlog::{read_sealed, write_archive};

/// Sealing keeps one RecordBatch per push; read_sealed tells "no section"
/// from "a section with no pushes"; and pyarrow, with no twinlog code,
/// reads exactly the pushes written out of the section's byte range.
#[test]
fn a_sealed_section_is_read_back_by_twinlog_and_by_pyarrow() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("refs.pushlog");
    let mut log = PushLog::open(&path).expect("open");
    for seq in 1..=12 {
        log.append(&push(seq)).expect("append");
    }
    log.compact(Finish::Swap).expect("compact");
    for seq in 13..=15 {
        log.append(&push(seq)).expect("append");
    }
    let archive = dir.path().join("sealed.twa");
    assert_eq!(log.seal_into(&archive).expect("seal"), 15);
    let back = read_sealed(&archive).expect("read").expect("a section");
    assert_eq!(back, (1..=15).map(push).collect::<Vec<_>>());

    let other = dir.path().join("other.twa");
    write_archive(&other, &[("objects", vec![1, 2, 3])]).expect("write");
    assert_eq!(
        read_sealed(&other).expect("read"),
        None,
        "no push-log section"
    );
    let empty = dir.path().join("empty.twa");
    write_archive(
        &empty,
        &[("pushlog", twinlog::pushlog::seal(&[]).expect("seal"))],
    )
    .expect("write");
    assert_eq!(
        read_sealed(&empty).expect("read"),
        Some(vec![]),
        "a section with no pushes"
    );

    let script = r#"
import struct, sys
import pyarrow as pa
data = open(sys.argv[1], 'rb').read()
assert data[-8:] == b'\x89TWA\r\n\x1a\n'
mlen = struct.unpack('<I', data[-12:-8])[0]
m = data[-12 - mlen:-12]
sections = {}
while m:
    (n,) = struct.unpack('<H', m[:2]); name = m[2:2 + n].decode(); m = m[2 + n:]
    off, ln = struct.unpack('<QQ', m[:16]); m = m[16:]
    sections[name] = data[off:off + ln]
r = pa.ipc.open_file(pa.BufferReader(sections['pushlog']))
for i in range(r.num_record_batches):
    b = r.get_batch(i)
    print(b.column(0)[0].as_py(), b.num_rows)
"#;
    let out = std::process::Command::new("python3")
        .args(["-c", script])
        .arg(&archive)
        .output()
        .expect("python3 runs (.ci/run installs pyarrow)");
    assert!(
        out.status.success(),
        "pyarrow read failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<(u64, usize)> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| {
            let mut it = l
                .split_whitespace()
                .map(|x| x.parse::<u64>().expect("number"));
            (it.next().expect("seq"), it.next().expect("rows") as usize)
        })
        .collect();
    let want: Vec<(u64, usize)> = (1..=15).map(|s| (s, push(s).updates.len())).collect();
    assert_eq!(
        lines, want,
        "pyarrow sees one batch per push, exactly the pushes written"
    );
}

#[test]
fn retain_from_drops_old_pushes_from_a_compacted_log_whatever_a_crash_stops() {
    use twinlog::pushlog::Finish;
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("refs.pushlog");
    let build = || {
        let _ = std::fs::remove_dir_all(dir.path());
        std::fs::create_dir_all(dir.path()).expect("mkdir");
        let mut log = PushLog::open(&path).expect("open");
        for seq in 1..=6 {
            log.append(&push(seq)).expect("append");
        }
        log.compact(Finish::Swap).expect("compact");
        for seq in 7..=9 {
            log.append(&push(seq)).expect("append");
        }
        log
    };
    let seqs = |log: &PushLog| -> Vec<u64> {
        log.history()
            .expect("history")
            .iter()
            .map(|p| p.seq)
            .collect()
    };
    let mut log = build();
    assert_eq!(log.retain_from(5).expect("retain"), 4);
    assert_eq!(seqs(&log), vec![5, 6, 7, 8, 9]);
    drop(log);
    let log = PushLog::open(&path).expect("reopen");
    assert_eq!(seqs(&log), vec![5, 6, 7, 8, 9]);
    assert!(!PushLog::archive_path(&path).exists());

    // A crash while the kept pushes were being written: the old log stays.
    let log = build();
    drop(log);
    let beside = |s: &str| {
        let mut p = path.as_os_str().to_owned();
        p.push(s);
        std::path::PathBuf::from(p)
    };
    std::fs::write(beside(".erasing"), b"torn").expect("write");
    let log = PushLog::open(&path).expect("reopen");
    assert_eq!(seqs(&log), (1..=9).collect::<Vec<_>>());
    assert!(!beside(".erasing").exists());

    // A crash after the kept pushes were marked whole: open finishes.
    let log = build();
    let kept: Vec<u8> = (5..=9)
        .flat_map(|s| encode_frame(&push(s)).expect("f"))
        .collect();
    drop(log);
    std::fs::write(beside(".erased"), &kept).expect("write");
    let log = PushLog::open(&path).expect("reopen");
    assert_eq!(seqs(&log), vec![5, 6, 7, 8, 9]);
}
