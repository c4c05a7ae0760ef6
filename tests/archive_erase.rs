//! Erase reaching the archive, with the daemons as real processes and the
//! archive in a directory (no compression, no encryption, so the bytes can
//! be searched): a repository's packs are archived and dropped from both
//! boxes, the repository is erased, and then no byte of its packs is left
//! in any object of the bucket or any file of either box, every archived
//! segment has one version, the other repository's packs are whole, and a
//! box restored from the archive holds the erased frames as erased.
//!
//! Every wait is on a daemon's `/status`, never a fixed sleep.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use testkit::{free_tcp, free_udp};
use twinlog::archive::bucket::{Bucket, Spec};
use twinlog::archive::restore::{
    restore_from_archive, ArchiveRestoreOptions, ArchiveRestoreReport, Until,
};
use twinlog::daemon::config::{ArchiveSection, Uploader};
use twinlog::daemon::{self, PrimaryConfig, TwinConfig};
use twinlog::log::{Kind, Log};
use twinlog::node::{Client, Durability};
use twinlog::objects::ObjType;
use twinlog::store::{PackBuilder, Store, StoreOptions};

#[path = "support/children.rs"]
mod children;
use children::{fast, pstatus, tstatus, Daemon};

const WAIT: Duration = Duration::from_secs(90);

/// A pack of `repo` whose every 64 bytes name it and its number: any
/// piece of it left anywhere is found. Packs of one repository repeat
/// across pushes (the same bytes at many sequences).
fn pack(repo: &str, n: u64) -> (Vec<u8>, [u8; 20]) {
    let line = format!("SECRET-{repo}-{:05}-", n % 7);
    let mut p = PackBuilder::new();
    let oid = p
        .add(ObjType::Blob, &line.as_bytes().repeat(4000 / line.len()))
        .unwrap();
    (p.into_bytes(), oid)
}

/// A box restored from the archive to `until`: its report, log and store.
async fn restored(bucket: &Bucket, dir: &Path, until: Until) -> (ArchiveRestoreReport, Log, Store) {
    let report = restore_from_archive(
        ArchiveRestoreOptions {
            data_dir: dir.to_owned(),
            segment_bytes: 1 << 20,
            bucket: bucket.clone(),
            key: None,
            until,
            accept_shorter: false,
        },
        Arc::new(|_| {}),
    )
    .await
    .unwrap();
    let log = Log::open_with(dir.join(daemon::LOG_DIR), 1 << 20).unwrap();
    assert_eq!(log.head_seq(), report.head);
    assert_eq!(log.first_seq(), report.snapshot_at + 1, "{report:?}");
    let store = Store::open(
        dir.join(daemon::STORE_DIR),
        log.history(),
        StoreOptions::default(),
    )
    .unwrap();
    assert_eq!(store.applied(), report.head);
    (report, log, store)
}

fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_owned()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else {
                out.push(p);
            }
        }
    }
    out
}

/// The files under `dir` holding `needle`.
fn holding(dir: &Path, needle: &[u8]) -> Vec<PathBuf> {
    files_under(dir)
        .into_iter()
        .filter(|p| std::fs::read(p).is_ok_and(|b| b.windows(needle.len()).any(|w| w == needle)))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_erase_reaches_every_archived_copy_and_leaves_one_version() {
    let root = tempfile::tempdir().unwrap();
    let bucket_dir = root.path().join("bucket");
    let (a_dir, b_dir) = (root.path().join("a"), root.path().join("b"));
    let (listen, a_metrics, b_metrics) = (free_udp(), free_tcp(), free_tcp());
    let (b_cfg, b_fp) = daemon::init_twin(&b_dir, listen, b_metrics, None).unwrap();
    let (a_cfg, a_fp) = daemon::init_primary(&a_dir, listen, a_metrics, Some(b_fp)).unwrap();
    daemon::pin_primary(&b_cfg, a_fp).unwrap();
    fast(&a_cfg, false);
    fast(&b_cfg, true);
    let sec = ArchiveSection {
        url: format!("file://{}", bucket_dir.display()),
        endpoint: None,
        region: "local".into(),
        credentials_file: None,
        uploader: Uploader::Twin,
        zstd_level: 0,
        key_file: None,
        max_mib_per_s: 0,
        // A store snapshot about every segment.
        snapshot_every_mib: 1,
    };
    let mut a = PrimaryConfig::load(&a_cfg).unwrap();
    a.archive = Some(sec.clone());
    a.retention.max_bytes = 2 << 20;
    std::fs::write(&a_cfg, a.render()).unwrap();
    let mut b = TwinConfig::load(&b_cfg).unwrap();
    b.archive = Some(sec.clone());
    b.retention.max_bytes = 2 << 20;
    std::fs::write(&b_cfg, b.render()).unwrap();

    let logs = root.path().join("logs");
    std::fs::create_dir_all(&logs).unwrap();
    let mut pa = Daemon::start("primary", &a_cfg, &logs.join("a.log"));
    let mut pb = Daemon::start("twin", &b_cfg, &logs.join("b.log"));
    testkit::until("the twin streams", WAIT, || {
        pstatus(a_metrics).filter(|s| s.twin_connected)
    })
    .await;
    let admin = Arc::new(daemon::load_identity(&a_dir.join(daemon::ADMIN_DIR)).unwrap());
    let c = Client::connect(&admin, a_fp, listen).await.unwrap();
    for repo in ["gone", "kept"] {
        c.create_repo(repo, Durability::Twin).await.unwrap();
    }
    // (seq, repo, pack, oid) of every pack pushed.
    let mut pushed = Vec::new();
    for n in 0..1500u64 {
        let repo = if n % 2 == 0 { "gone" } else { "kept" };
        let (p, oid) = pack(repo, n);
        let done = c
            .push(repo, &p, Vec::new(), Durability::Twin)
            .await
            .unwrap();
        pushed.push((done.pack_seq.expect("a pack frame"), repo, p, oid));
    }
    let t = testkit::until("the twin archives and drops", WAIT, || {
        tstatus(b_metrics).filter(|s| {
            s.archive
                .as_ref()
                .is_some_and(|a| a.lag_segments == 0 && a.floor > 1)
                && s.first > 1
        })
    })
    .await;
    testkit::until("the primary drops what is archived", WAIT, || {
        pstatus(a_metrics).filter(|s| s.first > 1)
    })
    .await;
    assert!(!holding(&bucket_dir, b"SECRET-gone-").is_empty());
    let bucket = Bucket::open(&Spec {
        url: sec.url.clone(),
        ..Spec::default()
    })
    .unwrap();

    // Store snapshots were archived beside the segments: a restore to a
    // frame past one starts there.
    let snaps: Vec<u64> = bucket
        .snapshots()
        .await
        .unwrap()
        .iter()
        .map(|(n, _)| n.at)
        .collect();
    assert!(snaps.len() >= 2, "{snaps:?}");
    // The oldest: segments were archived past it before the next came.
    let until = snaps[0] + 3;
    let (report, log, store) = restored(&bucket, &root.path().join("mid"), Until::Seq(until)).await;
    assert_eq!(report.snapshot_at, snaps[0]);
    for (seq, repo, data, oid) in &pushed {
        if *seq <= until {
            assert!(
                store.read_object(repo, oid).unwrap().is_some(),
                "{repo} {seq}"
            );
        }
        if report.snapshot_at < *seq && *seq <= until {
            assert_eq!(&log.read(*seq).unwrap().blob, data, "frame {seq}");
        }
    }
    drop((log, store));

    let erased = c
        .erase(t.head + 1, &["gone".to_owned()], Durability::Twin)
        .await
        .unwrap();
    testkit::until("the erase reaches the archive", WAIT, || {
        tstatus(b_metrics).filter(|s| {
            s.store.applied >= erased.seq
                && s.archive
                    .as_ref()
                    .is_some_and(|a| a.erases_pending == 0 && a.erase_rewrites > 0)
        })
    })
    .await;
    testkit::until(
        "the primary forgets the erase the archive has",
        WAIT,
        || pstatus(a_metrics).filter(|s| s.archive.as_ref().is_some_and(|a| a.erases_pending == 0)),
    )
    .await;

    let left = holding(&bucket_dir, b"SECRET-gone-");
    assert!(
        left.is_empty(),
        "erased bytes left in the archive: {left:?}"
    );
    assert!(!holding(&bucket_dir, b"SECRET-kept-").is_empty());
    for dir in [&a_dir, &b_dir] {
        let left = holding(dir, b"SECRET-gone-");
        assert!(left.is_empty(), "erased bytes left on a box: {left:?}");
    }
    let listed = bucket.segments().await.unwrap();
    let mut spans: Vec<(u64, u64)> = listed.iter().map(|(n, _)| (n.first, n.last)).collect();
    spans.dedup();
    assert_eq!(spans.len(), listed.len(), "older versions kept: {listed:?}");
    assert!(listed.iter().any(|(n, _)| n.generation == erased.seq));
    assert_eq!(bucket.erase_marks().await.unwrap().len(), 1);
    // Every snapshot taken before the erase went, and one after it came.
    let t = testkit::until("a snapshot after the erase", WAIT, || {
        tstatus(b_metrics).filter(|s| {
            s.archive
                .as_ref()
                .is_some_and(|a| a.last_snapshot_at >= erased.seq)
        })
    })
    .await;
    let snaps = bucket.snapshots().await.unwrap();
    assert!(
        snaps.iter().all(|(n, _)| n.at >= erased.seq),
        "{snaps:?} {:?}",
        t.archive
    );
    let left = holding(&bucket_dir, b"SECRET-gone-");
    assert!(
        left.is_empty(),
        "erased bytes left in the archive: {left:?}"
    );

    // Below the primary's floor, an erased frame reads as erased from the
    // archive, and a kept one whole.
    let p = pstatus(a_metrics).unwrap();
    let below: Vec<_> = pushed.iter().filter(|(s, ..)| *s < p.first).collect();
    assert!(below.len() > 4, "{p:?}");
    for (seq, repo, data, _) in below.iter().take(4) {
        let e = c.read(*seq).await.unwrap();
        if *repo == "gone" {
            assert_eq!(
                (e.kind, e.blob.len()),
                (Kind::Redacted.as_u16(), 0),
                "{seq}"
            );
        } else {
            assert_eq!(&e.blob, data, "{seq}");
        }
    }
    drop(c);
    pa.kill();
    pb.kill();

    // A box built from the archive alone holds the erase: from the
    // snapshot taken after it, and, to a frame before it (every older
    // snapshot gone), from frame 1, every erased frame erased.
    let archived_to = listed.iter().map(|(n, _)| n.last).max().unwrap();
    let (report, log, store) = restored(&bucket, &root.path().join("end"), Until::End).await;
    assert_eq!(report.head, archived_to.max(report.snapshot_at));
    assert!(report.snapshot_at >= erased.seq, "{report:?}");
    for (seq, repo, data, oid) in &pushed {
        let object = store.read_object(repo, oid).unwrap();
        assert_eq!(object.is_some(), *repo == "kept", "{repo} {seq}");
        if *seq > report.snapshot_at && *seq <= archived_to {
            assert_eq!(&log.read(*seq).unwrap().blob, data, "frame {seq}");
        }
    }
    drop((log, store));
    let before_erase = archived_to.min(erased.seq - 1);
    let (report, log, _) = restored(
        &bucket,
        &root.path().join("early"),
        Until::Seq(before_erase),
    )
    .await;
    assert_eq!(report.snapshot_at, 0);
    for (seq, repo, data, _) in pushed.iter().filter(|(s, ..)| *s <= before_erase) {
        let e = log.read(*seq).unwrap();
        if *repo == "gone" {
            assert_eq!(e.kind, Kind::Redacted.as_u16(), "frame {seq}");
            assert!(e.blob.is_empty());
        } else {
            assert_eq!(&e.blob, data, "frame {seq}");
        }
    }
}
