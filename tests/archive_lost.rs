//! The bucket loses objects under a serving pair (a lifecycle rule, a
//! wrong `rm`): the daemons as real processes, Garage as the bucket.
//! Writers pause until nothing waits to upload, every archived object is
//! deleted, writing resumes past both boxes' caps. No box drops a segment
//! whose object is gone: each finds them missing, the uploading twin
//! archives again what it holds, retention holds on both while objects
//! stay missing, `status`, `/status` and `/metrics` say so, and `/readyz`
//! stays up. Every wait is on a daemon's `/status`.

use std::sync::Arc;
use std::time::Duration;

use testkit::garage::Garage;
use testkit::{free_tcp, free_udp};
use twinlog::archive::archiver::ArchiveStatus;
use twinlog::archive::bucket::Bucket;
use twinlog::archive::codec::ArchiveKey;
use twinlog::daemon::{self, PrimaryConfig, TwinConfig};
use twinlog::node::{Client, Durability};

#[path = "support/children.rs"]
mod children;
#[path = "support/garage_archive.rs"]
mod garage_archive;
use children::{fast, pstatus, tstatus, Daemon};
use garage_archive::{blob, section};

const WAIT: Duration = Duration::from_secs(90);
const KIND: u16 = 0x8000;

async fn append(c: &Client, from: u64, to: u64) {
    for n in from..=to {
        let (seq, d) = c
            .append(KIND, b"", &blob(n), Durability::Twin)
            .await
            .unwrap();
        assert_eq!((seq, d), (n, Durability::Twin));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn objects_lost_from_the_bucket_hold_retention_and_are_archived_again() {
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
    let sec = section(root.path(), &g, &key, 0);
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
    let _pa = Daemon::start("primary", &a_cfg, &logs.join("a.log"));
    let _pb = Daemon::start("twin", &b_cfg, &logs.join("b.log"));
    testkit::until("the twin streams", WAIT, || {
        pstatus(a_metrics).filter(|s| s.twin_connected)
    })
    .await;
    let admin = Arc::new(daemon::load_identity(&a_dir.join(daemon::ADMIN_DIR)).unwrap());
    let c = Client::connect(&admin, a_fp, listen).await.unwrap();
    let first_run = 2500u64;
    append(&c, 1, first_run).await;

    // Both boxes archive and drop.
    testkit::until(
        "the twin archives everything sealed and drops",
        WAIT,
        || {
            tstatus(b_metrics)
                .filter(|s| s.archive.as_ref().is_some_and(|a| a.lag_segments == 0) && s.first > 1)
        },
    )
    .await;
    testkit::until("the primary drops", WAIT, || {
        pstatus(a_metrics).filter(|s| s.first > 1)
    })
    .await;
    let dropped_before = [
        ("primary", archive_of(a_metrics)),
        ("twin", archive_of(b_metrics)),
    ];

    // Every archived object deleted, as a lifecycle rule would.
    let bucket = Bucket::open(&sec.spec(&a_dir).unwrap()).unwrap();
    let gone = bucket.segments().await.unwrap();
    assert!(!gone.is_empty());
    for (n, _) in &gone {
        bucket.delete(&bucket.segment_key(n)).await.unwrap();
    }
    assert!(bucket.segments().await.unwrap().is_empty());
    let (p_first, t_first) = (
        pstatus(a_metrics).unwrap().first,
        tstatus(b_metrics).unwrap().first,
    );

    // Writing resumes, past both caps. A box may drop a segment only once
    // its object is back in the bucket (the twin archives again what it
    // holds), and then holds once it finds what it lost for good.
    append(&c, first_run + 1, 2 * first_run).await;
    let (lowest, head) = (p_first.min(t_first), 2 * first_run);
    let held = |m| {
        let a = archive_of(m);
        a["retention_held"] == true && a["missing_objects"] != 0
    };
    let both_held = || {
        held(a_metrics)
            && held(b_metrics)
            && tstatus(b_metrics)
                .and_then(|t| t.archive)
                .is_some_and(|a| a.lag_segments == 0)
    };
    testkit::until("both boxes hold, or one drops", WAIT, || {
        let (p, t) = (pstatus(a_metrics)?, tstatus(b_metrics)?);
        (both_held() || p.first > p_first || t.first > t_first).then_some(())
    })
    .await;
    if let Some((from, to)) = nowhere(&bucket, lowest, head, a_metrics, b_metrics).await {
        panic!("acknowledged frames {from} to {to} are on no box and in no object");
    }
    testkit::until("both boxes hold", WAIT, || both_held().then_some(())).await;
    if let Some((from, to)) = nowhere(&bucket, lowest, head, a_metrics, b_metrics).await {
        panic!("acknowledged frames {from} to {to} are on no box and in no object");
    }

    // The twin archived again every sealed segment it holds; what neither
    // box holds stays missing, and says so.
    let t = tstatus(b_metrics).unwrap();
    let listed = bucket.segments().await.unwrap();
    assert!(
        listed.iter().any(|(n, _)| n.first == t.first),
        "the twin's oldest segment is archived: {listed:?}"
    );
    for (who, metrics) in [("primary", a_metrics), ("twin", b_metrics)] {
        let json = archive_of(metrics);
        let missing = json["missing_objects"].as_u64().unwrap_or(0);
        let a: ArchiveStatus = serde_json::from_value(json.clone()).unwrap();
        let text = daemon::render_archive(&a);
        assert!(
            text.contains(&format!(
                "archive: {missing} objects missing, retention held"
            )),
            "{who}: {text}"
        );
        assert!(
            json["missing_found"].as_u64().unwrap_or(0) >= missing,
            "{who}: {json}"
        );
        let m = daemon::http::get(metrics, "/metrics").unwrap();
        assert!(
            m.contains(&format!("twinlog_archive_missing_objects {missing}"))
                && m.contains("twinlog_archive_retention_held 1"),
            "{who}: {m}"
        );
        // The pair still serves.
        assert_eq!(
            daemon::http::get(metrics, "/readyz").unwrap(),
            "ready\n",
            "{who}"
        );
    }
    let (seq, d) = c
        .append(KIND, b"", b"still served", Durability::Twin)
        .await
        .unwrap();
    assert_eq!((seq, d), (2 * first_run + 1, Durability::Twin));

    // Before the objects were lost, each drop cost a HEAD of its object,
    // and the box that did not upload them opened each once under the key
    // (two ranged GETs) before counting on it.
    for (who, a) in dropped_before {
        let (heads, reads, segments) = (
            a["drop_heads"].as_u64().unwrap_or(0),
            a["drop_reads"].as_u64().unwrap_or(0),
            a["drop_confirmed_segments"].as_u64().unwrap_or(0),
        );
        eprintln!("{who}: {heads} HEADs and {reads} GETs for {segments} segments dropped");
        assert!(
            segments > 0 && heads <= 2 * segments && reads <= 2 * heads,
            "{who}: a HEAD per segment dropped, two GETs per object at most: {a}"
        );
    }
}

/// The first run of frames from `lowest` to `head` that is neither on
/// a box (each holds from its first frame on) nor in an object. The boxes
/// are asked first: a box drops only what the bucket held before.
async fn nowhere(
    bucket: &Bucket,
    lowest: u64,
    head: u64,
    a_metrics: std::net::SocketAddr,
    b_metrics: std::net::SocketAddr,
) -> Option<(u64, u64)> {
    let (p, t) = (pstatus(a_metrics).unwrap(), tstatus(b_metrics).unwrap());
    let mut held: Vec<(u64, u64)> = bucket
        .segments()
        .await
        .unwrap()
        .iter()
        .map(|(n, _)| (n.first, n.last))
        .collect();
    held.extend([(p.first, u64::MAX), (t.first, u64::MAX)]);
    held.sort_unstable();
    let mut next = lowest;
    for (first, last) in held {
        if last < next {
            continue;
        }
        if first > next {
            return Some((next, (first - 1).min(head)));
        }
        next = last.saturating_add(1);
    }
    (next <= head).then_some((next, head))
}

/// The `archive` of a daemon's `/status`, as JSON: read the same way from
/// a build that lacks some of its fields.
fn archive_of(metrics: std::net::SocketAddr) -> serde_json::Value {
    daemon::fetch_status::<serde_json::Value>(metrics)
        .map(|(_, s)| s["archive"].clone())
        .unwrap_or_default()
}
