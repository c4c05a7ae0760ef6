//! The archive with the daemons as real processes and a real S3 server
//! (Garage, one node, on loopback): the twin uploads every sealed segment,
//! encrypted; both boxes drop only what the bucket holds; then both boxes
//! are destroyed and a fresh one is filled from the archive alone, every
//! `twin`-acknowledged frame it reaches present byte for byte.
//!
//! Every wait is on a daemon's `/status`, never a fixed sleep.

use std::sync::Arc;
use std::time::Duration;

use testkit::garage::Garage;
use testkit::{free_tcp, free_udp};
use twinlog::archive::codec::ArchiveKey;
use twinlog::archive::restore::{restore_from_archive, ArchiveRestoreOptions, Until};
use twinlog::daemon::{self, PrimaryConfig, TwinConfig};
use twinlog::log::Log;
use twinlog::node::{Client, Durability};

#[path = "support/children.rs"]
mod children;
#[path = "support/garage_archive.rs"]
mod garage_archive;
use children::{fast, pstatus, tstatus, Daemon};
use garage_archive::{blob, section};

const WAIT: Duration = Duration::from_secs(60);
const KIND: u16 = 0x8000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_twin_archives_retention_waits_for_it_and_a_fresh_box_restores_from_it() {
    let root = tempfile::tempdir().unwrap();
    let g = Garage::start(&root.path().join("garage"), 1).unwrap();
    let key = ArchiveKey::mint().unwrap();
    let (a_dir, b_dir) = (root.path().join("a"), root.path().join("b"));
    let (listen, a_metrics, b_metrics) = (free_udp(), free_tcp(), free_tcp());
    let (b_cfg, b_fp) = daemon::init_twin(&b_dir, listen, b_metrics, None).unwrap();
    let (a_cfg, a_fp) = daemon::init_primary(&a_dir, listen, a_metrics, Some(b_fp)).unwrap();
    daemon::pin_primary(&b_cfg, a_fp).unwrap();
    fast(&a_cfg, false);
    fast(&b_cfg, true);
    let sec = section(root.path(), &g, &key, 1024);
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
    let frames = 3000u64;
    for n in 1..=frames {
        let (seq, d) = c
            .append(KIND, b"", &blob(n), Durability::Twin)
            .await
            .unwrap();
        assert_eq!((seq, d), (n, Durability::Twin));
    }

    // The twin uploads; both boxes drop what the bucket holds, and only
    // that.
    let t = testkit::until("the twin archives and drops", WAIT, || {
        tstatus(b_metrics).filter(|s| {
            s.archive
                .as_ref()
                .is_some_and(|a| a.uploading && a.lag_segments == 0 && a.floor > 1)
                && s.first > 1
        })
    })
    .await;
    let ta = t.archive.clone().unwrap();
    assert!(
        t.first <= ta.floor,
        "the twin dropped past the archive: {t:?}"
    );
    assert!(ta.last_error.is_none(), "{ta:?}");
    let p = testkit::until("the primary sees the archive and drops", WAIT, || {
        pstatus(a_metrics).filter(|s| {
            s.archive
                .as_ref()
                .is_some_and(|a| !a.uploading && a.floor > 1)
                && s.first > 1
        })
    })
    .await;
    assert!(p.first <= p.archive.as_ref().unwrap().floor, "{p:?}");
    let archived_to = ta.floor - 1;

    // Below the primary's floor, reads and tails come from the archive,
    // and a tail goes on into the log.
    for seq in [1, 2, p.first / 2, p.first - 1] {
        let e = c.read(seq).await.unwrap();
        assert_eq!(
            (e.seq, e.blob),
            (seq, blob(seq)),
            "read {seq} below the floor {}",
            p.first
        );
    }
    let mut tail = c.tail(p.first - 3).await.unwrap();
    for seq in p.first - 3..p.first + 3 {
        let e = tail.next().await.unwrap().expect("a frame");
        assert_eq!((e.seq, e.blob), (seq, blob(seq)), "tail across the floor");
    }
    drop(tail);
    drop(c);
    pa.kill();
    pb.kill();

    // Both boxes gone: a fresh one, from the archive alone.
    std::fs::remove_dir_all(&a_dir).unwrap();
    std::fs::remove_dir_all(&b_dir).unwrap();
    let fresh = root.path().join("fresh");
    let (f_cfg, _) = daemon::init_primary(&fresh, free_udp(), free_tcp(), None).unwrap();
    let mut f = PrimaryConfig::load(&f_cfg).unwrap();
    f.archive = Some(sec.clone());
    std::fs::write(&f_cfg, f.render()).unwrap();
    let settings = sec.settings(&fresh).unwrap();
    for until in [archived_to / 3, archived_to] {
        let dir = root.path().join(format!("fresh-{until}"));
        let report = restore_from_archive(
            ArchiveRestoreOptions {
                data_dir: dir.clone(),
                segment_bytes: 1 << 20,
                bucket: settings.bucket.clone(),
                key: settings.codec.key.clone(),
                until: Until::Seq(until),
                accept_shorter: false,
            },
            Arc::new(|_| {}),
        )
        .await
        .unwrap();
        assert_eq!(report.head, until);
        let log = Log::open_with(dir.join(daemon::LOG_DIR), 1 << 20).unwrap();
        assert_eq!((log.first_seq(), log.head_seq()), (1, until));
        for n in 1..=until {
            assert_eq!(log.read(n).unwrap().blob, blob(n), "frame {n}");
        }
    }
}
