//! Retention on the twin: it drops old sealed segments once its store has
//! applied them, down to its cap plus a segment, keeps what a restore being
//! served needs, and a fresh box restored from it afterwards (through its
//! snapshot) holds its log's head and its store, with no erased byte on
//! either box and no copy of the dropped segments left in a snapshot.

mod common;

use common::files_containing;

use std::path::Path;
use std::sync::Arc;

use tokio::sync::watch;
use twinlog::log::{format, Log};
use twinlog::net::{self, Identity, Pins, Role};
use twinlog::node::epoch::Epochs;
use twinlog::node::restore::{self, RestoreOptions};
use twinlog::node::restore_serve::{self, RestoreSource};
use twinlog::node::snapshot_transfer::SnapshotSource;
use twinlog::node::store_host::StoreHost;
use twinlog::node::twin_retention::{TwinRetainer, TwinRetention};
use twinlog::objects::ObjType;
use twinlog::pushlog::RefUpdate;
use twinlog::store::install;
use twinlog::store::{frames, PackBuilder, RepoOp, Store, StoreOptions};

const MARKER: &[u8] = b"TWIN-RETENTION-ERASE-MARKER-5c1e";
const SEGMENT: u64 = 8 << 10;
const CAP: u64 = 32 << 10;

fn append(log: &Log, f: &frames::FrameParts) -> u64 {
    log.append_raw(f.kind.as_u16(), &f.meta, &f.blob)
        .expect("append")
}

fn push(log: &Log, repo: &str, data: &[u8], old: Option<[u8; 20]>) -> [u8; 20] {
    let mut p = PackBuilder::new();
    let oid = p.add(ObjType::Blob, data).expect("add");
    append(log, &p.frame(repo).expect("frame"));
    let f = frames::refs_frame(
        repo,
        0,
        &[RefUpdate {
            name: "refs/heads/main".into(),
            old,
            new: Some(oid),
        }],
    )
    .expect("refs");
    append(log, &f);
    oid
}

fn kept_blob(i: u32) -> Vec<u8> {
    let mut b = format!("kept-{i}-").into_bytes();
    b.resize(1500, b'k' ^ (i as u8));
    b
}

/// Copy the source's frames the twin does not hold yet, at their numbers.
fn follow(src: &Log, twin: &Log) {
    for seq in twin.head_seq() + 1..=src.head_seq() {
        let e = src.read(seq).expect("read");
        twin.append_at(seq, e.kind, &e.meta, &e.blob)
            .expect("append_at");
    }
}

/// Each repository: its name, object ids and pushes' seqs.
type StoreView = Vec<(String, Vec<Vec<u8>>, Vec<u64>)>;

fn store_view(store: &Store) -> StoreView {
    store
        .repos()
        .map(|n| {
            let r = store.repo(n).expect("repo");
            let pushes = r
                .history()
                .expect("history")
                .iter()
                .map(|p| p.seq)
                .collect();
            (n.to_owned(), r.object_ids().expect("oids"), pushes)
        })
        .collect()
}

fn segment_files_below(dir: &Path, first: u64) -> Vec<String> {
    std::fs::read_dir(dir)
        .expect("read_dir")
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| format::parse_segment_name(n).is_some_and(|f| f < first))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_twin_drops_applied_segments_to_its_cap_and_a_restore_from_it_still_works() {
    let root = tempfile::tempdir().expect("tempdir");
    let src = Log::open(root.path().join("src/log")).expect("src log");
    for repo in ["secret", "kept"] {
        append(&src, &frames::repo_frame(repo, RepoOp::Create).expect("f"));
    }
    let mut secret = None;
    for i in 0..3u8 {
        let mut data = MARKER.to_vec();
        data.push(i);
        secret = Some(push(&src, "secret", &data, secret));
    }
    let mut kept = None;
    for i in 0..40 {
        kept = Some(push(&src, "kept", &kept_blob(i), kept));
    }
    let before = src.head_seq() + 1;
    append(
        &src,
        &frames::erase_frame(before, &["secret".to_owned()]).expect("f"),
    );
    for i in 40..60 {
        kept = Some(push(&src, "kept", &kept_blob(i), kept));
    }

    // The twin: small segments, its store applied through its head.
    let tdir = root.path().join("twin");
    let tlog = Arc::new(Log::open_with(tdir.join("log"), SEGMENT).expect("twin log"));
    tlog.set_follower(true);
    tlog.adopt_history(src.history()).expect("history");
    follow(&src, &tlog);
    let host =
        StoreHost::open(tlog.clone(), &tdir.join("store"), StoreOptions::default()).expect("host");
    host.catch_up().expect("catch up");
    assert_eq!(host.health().applied, tlog.head_seq());
    assert!(tlog.bytes() > 3 * CAP, "{} bytes", tlog.bytes());

    let snapshots = SnapshotSource::new(
        host.clone(),
        &tdir.join("snapshots"),
        Some(tdir.join(install::BASE_FILE)),
    );
    let retainer = TwinRetainer::new(
        tlog.clone(),
        host.clone(),
        Some(snapshots.clone()),
        TwinRetention {
            max_bytes: CAP,
            max_age_secs: 0,
        },
    );
    let first = retainer.pass().expect("pass");
    assert!(
        first > before,
        "the erased frames' segments went: first {first}"
    );
    assert!(
        tlog.bytes() <= CAP + SEGMENT,
        "{} bytes kept, cap {CAP}",
        tlog.bytes()
    );
    assert!(
        segment_files_below(&tdir.join("log"), first).is_empty(),
        "dropped segments left files"
    );
    assert!(retainer.status().dropped_segments > 0);

    // A fresh box restores from the twin: through its snapshot, since the
    // twin's log no longer reaches back to 1.
    let box_id = Arc::new(Identity::mint().expect("mint"));
    let twin_id = Identity::mint().expect("mint");
    let pins = Arc::new(Pins::new().pin(box_id.fingerprint(), Role::Restore));
    let endpoint = net::server(([127, 0, 0, 1], 0).into(), &twin_id, pins.clone()).expect("server");
    let addr = endpoint.local_addr().expect("addr");
    let source = Arc::new(RestoreSource {
        log: tlog.clone(),
        snapshots: snapshots.clone(),
        epochs: Arc::new(Epochs::in_memory(2)),
        base: tdir.join(install::BASE_FILE),
    });
    let (_stop, stopped) = watch::channel(false);
    tokio::spawn(restore_serve::serve(source, endpoint, pins, stopped));
    let data = root.path().join("box");
    std::fs::create_dir_all(&data).expect("mkdir");
    let report = restore::restore(
        RestoreOptions {
            data_dir: data.clone(),
            segment_bytes: twinlog::log::DEFAULT_SEGMENT_BYTES,
            source: addr,
            source_fingerprint: twin_id.fingerprint(),
            identity: box_id.clone(),
        },
        Arc::new(|_| {}),
    )
    .await
    .expect("restore");
    let at = report.snapshot_at.expect("restored through a snapshot");
    assert!(
        at + 1 >= first,
        "the snapshot at {at} is below the floor {first}"
    );
    assert_eq!(report.head, tlog.head_seq());
    let blog = Log::open(data.join("log")).expect("box log");
    assert_eq!(blog.head_seq(), tlog.head_seq());
    let bstore =
        Store::open(data.join("store"), blog.history(), StoreOptions::default()).expect("store");
    let tview = store_view(&host.lock().expect("twin store"));
    assert_eq!(store_view(&bstore), tview, "the box holds the twin's store");
    drop((blog, bstore));

    // While the restore's pin holds, the frames after its snapshot stay
    // however far the log grows.
    for i in 60..120 {
        kept = Some(push(&src, "kept", &kept_blob(i), kept));
    }
    follow(&src, &tlog);
    host.catch_up().expect("catch up");
    retainer.pass().expect("pass");
    assert_eq!(retainer.status().held_by, "restore");
    assert!(
        tlog.first_seq() <= at,
        "the snapshot's frame {at} went under a restore's pin (first {})",
        tlog.first_seq()
    );

    // No erased byte anywhere on either box; the snapshot directory holds
    // the offered snapshot only.
    let mut found = files_containing(&tdir, MARKER);
    found.extend(files_containing(&data, MARKER));
    assert!(found.is_empty(), "erased bytes in {found:?}");
    let offered: Vec<String> = std::fs::read_dir(tdir.join("snapshots"))
        .expect("snapshots")
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(offered, vec![at.to_string()]);
}

#[test]
fn a_twin_never_drops_what_its_store_has_not_applied() {
    let root = tempfile::tempdir().expect("tempdir");
    let src = Log::open(root.path().join("src/log")).expect("src log");
    append(
        &src,
        &frames::repo_frame("kept", RepoOp::Create).expect("f"),
    );
    let mut kept = None;
    for i in 0..40 {
        kept = Some(push(&src, "kept", &kept_blob(i), kept));
    }
    let tdir = root.path().join("twin");
    let tlog = Arc::new(Log::open_with(tdir.join("log"), SEGMENT).expect("twin log"));
    tlog.set_follower(true);
    tlog.adopt_history(src.history()).expect("history");
    // The store applies half of the log, then the rest arrives unapplied.
    for seq in 1..=40 {
        let e = src.read(seq).expect("read");
        tlog.append_at(seq, e.kind, &e.meta, &e.blob)
            .expect("append_at");
    }
    let host =
        StoreHost::open(tlog.clone(), &tdir.join("store"), StoreOptions::default()).expect("host");
    host.catch_up().expect("catch up");
    follow(&src, &tlog);
    let applied = host.health().applied;
    assert_eq!(applied, 40);
    let retainer = TwinRetainer::new(
        tlog.clone(),
        host.clone(),
        None,
        TwinRetention {
            max_bytes: 1,
            max_age_secs: 0,
        },
    );
    let first = retainer.pass().expect("pass");
    assert!(first > 1 && first <= applied + 1, "first {first}");
    assert_eq!(retainer.status().held_by, "store");
    for seq in applied + 1..=tlog.head_seq() {
        tlog.read(seq).expect("an unapplied frame is still there");
    }
}
