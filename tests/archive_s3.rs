//! The archive against a real S3 server: Garage, one node on loopback
//! (testkit::garage). Segments large enough for multipart uploads, sealed
//! and compressed, archived by the archiver's thread; restored at two
//! points; a server killed mid-archive and restarted, the uploads retried.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use testkit::garage::{self, Garage};
use twinlog::archive::archiver::{ArchiveSettings, Archiver};
use twinlog::archive::bucket::{Bucket, Spec};
use twinlog::archive::codec::{ArchiveKey, Codec};
use twinlog::archive::restore::{restore_from_archive, ArchiveRestoreOptions, Until};
use twinlog::log::{Kind, Log, Meta};
use twinlog::repl::epochs::EpochStart;

const SEGMENT: u64 = 1 << 20;

fn bucket_on(g: &Garage, prefix: &str) -> Bucket {
    Bucket::open(&Spec {
        url: format!("s3://{}/{prefix}", garage::BUCKET),
        endpoint: Some(g.endpoint(0)),
        region: garage::REGION.into(),
        access_key_id: Some(garage::KEY_ID.into()),
        secret_access_key: Some(garage::SECRET.into()),
    })
    .unwrap()
}

fn fill(log: &Log, from: u64, n: u64) {
    for i in from..from + n {
        // Every 40th frame 12 MiB of noise: a multipart upload even
        // compressed.
        let len = if i % 40 == 5 {
            12 << 20
        } else {
            (i * 97 % 2000) as usize
        };
        let mut x = i.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        let blob: Vec<u8> = (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        log.append(Kind::App(0x8002), &Meta::repo("s3"), &blob)
            .unwrap();
    }
    log.sync().unwrap();
}

async fn wait_floor(a: &Archiver, log: &Log, limit: Duration) {
    let by = Instant::now() + limit;
    loop {
        let open_first = log.layout().last().unwrap().0;
        if a.keep_from() == open_first {
            return;
        }
        assert!(Instant::now() < by, "archive status: {:?}", a.status());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn same(src: &Log, data: &Path, through: u64) {
    let got = Log::open(data.join(twinlog::layout::LOG_DIR)).unwrap();
    assert_eq!(got.head_seq(), through);
    for seq in 1..=through {
        assert_eq!(
            got.read(seq).unwrap(),
            src.read(seq).unwrap(),
            "frame {seq}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garage_holds_the_archive_through_a_restart_and_restores_it() {
    let tmp = tempfile::tempdir().unwrap();
    let mut g = Garage::start(&tmp.path().join("garage"), 1).unwrap();
    let log = Arc::new(Log::open_with(tmp.path().join("src"), SEGMENT).unwrap());
    fill(&log, 1, 90);
    let bucket = bucket_on(&g, "pair-a");
    let key = ArchiveKey::mint().unwrap();
    let archiver = Archiver::new(
        log.clone(),
        ArchiveSettings {
            bucket: bucket.clone(),
            codec: Codec {
                zstd_level: Some(1),
                key: Some(key.clone()),
            },
            bytes_per_s: 0,
        },
        Arc::new(|| vec![EpochStart { epoch: 0, first: 1 }]),
    );
    let (stop_tx, stop) = tokio::sync::watch::channel(false);
    let thread = archiver.spawn(stop).unwrap();
    wait_floor(&archiver, &log, Duration::from_secs(120)).await;
    let mid = log.head_seq();

    // The server dies while more is sealed; the archiver retries until it
    // is back, and loses nothing.
    g.nodes[0].kill().unwrap();
    fill(&log, mid + 1, 50);
    let by = Instant::now() + Duration::from_secs(60);
    while archiver.status().last_error.is_none() {
        assert!(
            Instant::now() < by,
            "no upload failed while the server was down"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    g.nodes[0].restart().unwrap();
    wait_floor(&archiver, &log, Duration::from_secs(180)).await;
    assert!(
        archiver.status().last_error.is_none(),
        "{:?}",
        archiver.status()
    );
    stop_tx.send(true).unwrap();
    thread.join().unwrap();

    let archived = bucket.segments().await.unwrap().last().unwrap().0.last;
    for until in [mid - 3, archived] {
        let data = tmp.path().join(format!("restore-{until}"));
        let report = restore_from_archive(
            ArchiveRestoreOptions {
                data_dir: data.clone(),
                segment_bytes: SEGMENT,
                bucket: bucket.clone(),
                key: Some(key.clone()),
                until: Until::Seq(until),
                accept_shorter: false,
            },
            Arc::new(|_| {}),
        )
        .await
        .unwrap();
        assert_eq!(report.head, until);
        same(&log, &data, until);
    }
}
