//! The archive against a directory bucket (`file://`): sealed segments
//! uploaded, checked and restored to a frame boundary, under every codec;
//! corrupt objects, wrong keys and gaps refused by name; an interrupted
//! restore resumed; the archiver holding retention's floor. The same code
//! against a real S3 server is `tests/archive_s3.rs`.

use std::path::Path;
use std::sync::Arc;

use twinlog::archive::archiver::{ArchiveSettings, Archiver};
use twinlog::archive::bucket::{Bucket, Spec};
use twinlog::archive::codec::{ArchiveKey, Codec};
use twinlog::archive::names::SegmentName;
use twinlog::archive::object::TimeMark;
use twinlog::archive::restore::{restore_from_archive, ArchiveRestoreOptions, Until};
use twinlog::archive::upload::{upload_segment, Pace, SegmentJob};
use twinlog::archive::Error;
use twinlog::log::{format, Kind, Log, Meta};
use twinlog::repl::epochs::EpochStart;

const SEGMENT: u64 = 256 << 10;
const EPOCHS: [EpochStart; 1] = [EpochStart { epoch: 0, first: 1 }];

fn blob_of(i: u64) -> Vec<u8> {
    let len = match i % 50 {
        7 => 9 << 20, // spans pieces and segments
        _ => (i * 131 % 3000) as usize,
    };
    (0..len).map(|j| (j as u64 * 31 + i) as u8).collect()
}

/// A log of `n` frames in small segments.
fn source_log(dir: &Path, n: u64) -> Log {
    let log = Log::open_with(dir, SEGMENT).unwrap();
    for i in 1..=n {
        log.append(Kind::App(0x8001), &Meta::repo(format!("r{i}")), &blob_of(i))
            .unwrap();
    }
    log.sync().unwrap();
    log
}

fn bucket_in(dir: &Path) -> Bucket {
    Bucket::open(&Spec {
        url: format!("file://{}", dir.display()),
        ..Spec::default()
    })
    .unwrap()
}

async fn archive_all(log: &Log, bucket: &Bucket, codec: &Codec) -> u64 {
    let layout = log.layout();
    let mut pace = Pace::new(0);
    let mut last = 0;
    for &(first, seg_last, _) in &layout[..layout.len() - 1] {
        let path = format::segment_path(log.dir(), first);
        let job = SegmentJob {
            path: &path,
            first,
            history: log.history().0,
            epochs: &EPOCHS,
            generation: 0,
            // Frames up to each segment's last were durable by 10 ms a frame.
            marks: vec![TimeMark {
                seq: seg_last,
                unix_ms: seg_last * 10,
            }],
        };
        last = upload_segment(bucket, codec, job, &mut pace)
            .await
            .unwrap()
            .name
            .last;
    }
    last
}

fn opts(
    data: &Path,
    bucket: &Bucket,
    key: Option<ArchiveKey>,
    until: Until,
) -> ArchiveRestoreOptions {
    ArchiveRestoreOptions {
        data_dir: data.to_owned(),
        segment_bytes: SEGMENT,
        bucket: bucket.clone(),
        key,
        until,
        accept_shorter: false,
    }
}

fn quiet() -> Arc<dyn Fn(&twinlog::archive::restore::ArchiveProgress) + Send + Sync> {
    Arc::new(|_| {})
}

fn assert_same_frames(src: &Log, data: &Path, through: u64) {
    let got = Log::open(data.join(twinlog::layout::LOG_DIR)).unwrap();
    assert_eq!(got.head_seq(), through, "the restored head");
    assert_eq!(got.history(), src.history());
    for seq in 1..=through {
        assert_eq!(
            got.read(seq).unwrap(),
            src.read(seq).unwrap(),
            "frame {seq}"
        );
    }
}

#[tokio::test]
async fn every_codec_restores_to_any_frame_boundary() {
    let tmp = tempfile::tempdir().unwrap();
    let src = source_log(&tmp.path().join("src"), 120);
    let key = ArchiveKey::mint().unwrap();
    for (name, codec) in [
        ("plain", Codec::default()),
        (
            "zstd-sealed",
            Codec {
                zstd_level: Some(3),
                key: Some(key.clone()),
            },
        ),
    ] {
        let bucket = bucket_in(&tmp.path().join(format!("bucket-{name}")));
        let archived = archive_all(&src, &bucket, &codec).await;
        assert!(archived > 60, "{name}: archived through {archived}");
        for until in [1, 7, 8, archived / 2, archived] {
            let data = tmp.path().join(format!("restore-{name}-{until}"));
            let report = restore_from_archive(
                opts(&data, &bucket, codec.key.clone(), Until::Seq(until)),
                quiet(),
            )
            .await
            .unwrap();
            assert_eq!(report.head, until);
            assert_same_frames(&src, &data, until);
            assert!(!data.join(twinlog::layout::RESTORING_FILE).exists());
        }
        let past = restore_from_archive(
            opts(
                &tmp.path().join(format!("past-{name}")),
                &bucket,
                codec.key.clone(),
                Until::Seq(archived + 1),
            ),
            quiet(),
        )
        .await;
        assert!(matches!(past, Err(Error::Missing(_))), "{name}: {past:?}");
    }
}

#[tokio::test]
async fn sealed_archives_hold_no_plaintext_and_refuse_other_keys() {
    let tmp = tempfile::tempdir().unwrap();
    let src = source_log(&tmp.path().join("src"), 30);
    let key = ArchiveKey::mint().unwrap();
    let bdir = tmp.path().join("bucket");
    let bucket = bucket_in(&bdir);
    let codec = Codec {
        zstd_level: None,
        key: Some(key.clone()),
    };
    archive_all(&src, &bucket, &codec).await;
    let needle = blob_of(3);
    let needle = &needle[..64];
    for entry in walk_files(&bdir) {
        let bytes = std::fs::read(&entry).unwrap();
        assert!(
            !bytes.windows(needle.len()).any(|w| w == needle),
            "{} holds plaintext",
            entry.display()
        );
    }
    let none = restore_from_archive(
        opts(&tmp.path().join("a"), &bucket, None, Until::End),
        quiet(),
    )
    .await;
    assert!(matches!(none, Err(Error::KeyNeeded { .. })), "{none:?}");
    let other = ArchiveKey::mint().unwrap();
    let wrong = restore_from_archive(
        opts(&tmp.path().join("b"), &bucket, Some(other), Until::End),
        quiet(),
    )
    .await;
    assert!(matches!(wrong, Err(Error::WrongKey { .. })), "{wrong:?}");
}

fn walk_files(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(walk_files(&p));
        } else {
            out.push(p);
        }
    }
    out
}

#[tokio::test]
async fn a_corrupt_object_is_refused_and_the_restore_resumes_once_it_is_whole() {
    let tmp = tempfile::tempdir().unwrap();
    let src = source_log(&tmp.path().join("src"), 80);
    let bdir = tmp.path().join("bucket");
    let bucket = bucket_in(&bdir);
    let archived = archive_all(&src, &bucket, &Codec::default()).await;
    let mut objects = walk_files(&bdir);
    objects.sort();
    let victim = objects[objects.len() / 2].clone();
    let good = std::fs::read(&victim).unwrap();
    let mut bad = good.clone();
    bad[100] ^= 0x10;
    std::fs::write(&victim, &bad).unwrap();
    let data = tmp.path().join("restore");
    let first = restore_from_archive(opts(&data, &bucket, None, Until::End), quiet()).await;
    assert!(matches!(first, Err(Error::Corrupt(_))), "{first:?}");
    assert!(data.join(twinlog::layout::RESTORING_FILE).exists());
    std::fs::write(&victim, &good).unwrap();
    let again = restore_from_archive(opts(&data, &bucket, None, Until::End), quiet())
        .await
        .unwrap();
    assert!(again.resumed);
    assert!(
        again.frames < archived,
        "resumed, not started over: {again:?}"
    );
    assert_same_frames(&src, &data, archived);
}

#[tokio::test]
async fn a_box_with_history_is_refused_and_a_gap_is_named() {
    let tmp = tempfile::tempdir().unwrap();
    let src = source_log(&tmp.path().join("src"), 60);
    let bdir = tmp.path().join("bucket");
    let bucket = bucket_in(&bdir);
    archive_all(&src, &bucket, &Codec::default()).await;
    let busy = tmp.path().join("busy");
    drop(source_log(&busy.join(twinlog::layout::LOG_DIR), 3));
    let r = restore_from_archive(opts(&busy, &bucket, None, Until::End), quiet()).await;
    assert!(matches!(r, Err(Error::NotFresh(_))), "{r:?}");
    let segs = bucket.segments().await.unwrap();
    let (second, _) = segs[1];
    bucket.delete(&bucket.segment_key(&second)).await.unwrap();
    let r = restore_from_archive(
        opts(&tmp.path().join("gap"), &bucket, None, Until::End),
        quiet(),
    )
    .await;
    match r {
        Err(Error::Missing(m)) => assert!(m.contains("skip"), "{m}"),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn the_archiver_uploads_sealed_segments_and_holds_the_floor() {
    let tmp = tempfile::tempdir().unwrap();
    let src = Arc::new(source_log(&tmp.path().join("src"), 70));
    let bucket = bucket_in(&tmp.path().join("bucket"));
    let archiver = Archiver::new(
        src.clone(),
        ArchiveSettings {
            bucket: bucket.clone(),
            codec: Codec::default(),
            bytes_per_s: 0,
        },
        Arc::new(|| EPOCHS.to_vec()),
    );
    assert_eq!(
        archiver.keep_from(),
        0,
        "nothing may go before the bucket is listed"
    );
    let (stop_tx, stop) = tokio::sync::watch::channel(false);
    let thread = archiver.spawn(stop).unwrap();
    let open_first = src.layout().last().unwrap().0;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while archiver.keep_from() != open_first {
        assert!(
            std::time::Instant::now() < deadline,
            "{:?}",
            archiver.status()
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let st = archiver.status();
    assert_eq!(st.lag_segments, 0, "{st:?}");
    assert_eq!(
        st.uploaded_segments as usize,
        src.layout().len() - 1,
        "{st:?}"
    );
    assert!(st.last_error.is_none());
    stop_tx.send(true).unwrap();
    thread.join().unwrap();
    let listed = bucket.segments().await.unwrap();
    assert_eq!(listed.len(), src.layout().len() - 1);
}

async fn whole(frames: &mut twinlog::archive::tiered::ArchivedFrames) -> (u64, Vec<u8>, Vec<u8>) {
    let head = frames.next_frame().await.unwrap();
    let mut blob = Vec::new();
    loop {
        let p = frames.blob_piece(100_000).await.unwrap();
        if p.is_empty() {
            break;
        }
        blob.extend(p);
    }
    assert_eq!(blob.len() as u64, head.blob_len);
    (head.seq, head.meta, blob)
}

#[tokio::test]
async fn tiered_reads_find_any_frame_and_walk_on_across_pieces_and_segments() {
    use twinlog::archive::tiered::{ArchivedFrames, TieredSource};
    let tmp = tempfile::tempdir().unwrap();
    let src = source_log(&tmp.path().join("src"), 110);
    let bucket = bucket_in(&tmp.path().join("bucket"));
    let codec = Codec {
        zstd_level: Some(1),
        key: Some(ArchiveKey::mint().unwrap()),
    };
    let archived = archive_all(&src, &bucket, &codec).await;
    let source = TieredSource {
        bucket: bucket.clone(),
        key: codec.key.clone(),
        history: src.history().0,
        epochs: EPOCHS.to_vec(),
        cache: None,
    };
    for seq in [1, 6, 7, 8, 57, archived] {
        let mut at = ArchivedFrames::at(source.clone(), seq).await.unwrap();
        let (s, meta, blob) = whole(&mut at).await;
        let want = src.read(seq).unwrap();
        assert_eq!((s, meta, blob), (seq, want.meta, want.blob), "frame {seq}");
    }
    // One cursor over everything, large frames' blobs left unread on
    // some: the next frame is found all the same.
    let mut cur = ArchivedFrames::at(source.clone(), 1).await.unwrap();
    assert_eq!(cur.archived_through(), archived);
    for seq in 1..=archived {
        if seq % 3 == 0 {
            let head = cur.next_frame().await.unwrap();
            assert_eq!(head.seq, seq);
            continue;
        }
        let (s, _, blob) = whole(&mut cur).await;
        assert_eq!((s, blob), (seq, src.read(seq).unwrap().blob));
    }
    assert!(matches!(cur.next_frame().await, Err(Error::Missing(_))));
    assert!(matches!(
        ArchivedFrames::at(source.clone(), archived + 1).await,
        Err(Error::Missing(_))
    ));

    // The same segment unencrypted, put under the sealed object's name by
    // someone without the key: never served.
    let clear = bucket_in(&tmp.path().join("clear"));
    archive_all(&src, &clear, &Codec::default()).await;
    let (sealed, _) = bucket.segments().await.unwrap()[0];
    let (plain, size) = clear.segments().await.unwrap()[0];
    let bytes = clear
        .get_range(&clear.segment_key(&plain), 0..size)
        .await
        .unwrap();
    let mut up = bucket.writer(&bucket.segment_key(&sealed));
    up.write(bytes).await.unwrap();
    up.finish().await.unwrap();
    let source = TieredSource {
        cache: None,
        ..source
    };
    let got = ArchivedFrames::at(source, 1).await.map(|_| ());
    assert!(
        matches!(&got, Err(Error::Unsealed { object, .. }) if object.ends_with(&bucket.segment_key(&sealed))),
        "{got:?}"
    );
}

#[tokio::test]
async fn until_time_restores_through_the_last_frame_marked_by_then() {
    let tmp = tempfile::tempdir().unwrap();
    let src = source_log(&tmp.path().join("src"), 60);
    let bucket = bucket_in(&tmp.path().join("bucket"));
    archive_all(&src, &bucket, &Codec::default()).await;
    let lasts: Vec<u64> = src.layout().iter().map(|s| s.1).collect();
    let (a, b) = (lasts[0], lasts[2]);
    for (i, (t, want)) in [(a * 10, a), (b * 10 + 9, b), (lasts[3] * 10 - 1, b)]
        .into_iter()
        .enumerate()
    {
        let data = tmp.path().join(format!("t{i}"));
        let r = restore_from_archive(opts(&data, &bucket, None, Until::Time(t)), quiet())
            .await
            .unwrap();
        assert_eq!(r.head, want, "until {t} ms");
        assert_same_frames(&src, &data, want);
    }
    let early = restore_from_archive(
        opts(
            &tmp.path().join("early"),
            &bucket,
            None,
            Until::Time(a * 10 - 1),
        ),
        quiet(),
    )
    .await;
    assert!(
        matches!(early, Err(Error::NothingByTime { .. })),
        "{early:?}"
    );
}

/// Objects anyone who can write to the bucket could add, beside a sealed
/// archive's own: one claiming the first segment's frames under a newer
/// generation, one claiming frames far past the archive's end, one
/// starting inside the chain. None opens under the key; the restore
/// passes over the first two by name, never puts the third on its chain,
/// and restores the genuine frames exactly.
#[tokio::test]
async fn objects_that_do_not_open_are_passed_over_for_the_genuine_ones() {
    let tmp = tempfile::tempdir().unwrap();
    let src = source_log(&tmp.path().join("src"), 120);
    let key = ArchiveKey::mint().unwrap();
    let bucket = bucket_in(&tmp.path().join("bucket"));
    let codec = Codec {
        zstd_level: None,
        key: Some(key.clone()),
    };
    let archived = archive_all(&src, &bucket, &codec).await;
    let genuine = bucket.segments().await.unwrap();
    assert!(genuine.len() >= 3, "{genuine:?}");
    let (first, _) = genuine[0];
    let (second, _) = genuine[1];
    let (newest, _) = *genuine.last().unwrap();
    let junk = [
        SegmentName {
            generation: first.generation + 5,
            ..first
        },
        SegmentName {
            last: 1_000_000,
            generation: newest.generation + 9,
            ..newest
        },
        SegmentName {
            first: first.first + 1,
            last: second.last,
            ..second
        },
    ];
    for name in junk {
        let mut up = bucket.writer(&bucket.segment_key(&name));
        up.write(bytes::Bytes::from(vec![0x5a; 4096]))
            .await
            .unwrap();
        up.finish().await.unwrap();
    }
    let data = tmp.path().join("box");
    let report = restore_from_archive(opts(&data, &bucket, Some(key), Until::End), quiet())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(report.head, archived);
    assert_eq!(report.passed_over.len(), 2, "{:?}", report.passed_over);
    for name in &junk[..2] {
        let key = bucket.segment_key(name);
        assert!(
            report.passed_over.iter().any(|said| said.contains(&key)),
            "{key} not named in {:?}",
            report.passed_over
        );
    }
    assert_same_frames(&src, &data, archived);
}
