//! Snapshots: an install stopped after every step (as a crash would) opens
//! to the old state or the new one, never a mix; an interrupted fetch
//! resumes from the bytes staged; and a twin that fell below the primary's
//! retention floor while it was down gets a snapshot and converges.

mod common;

use common::{
    assert_holds_the_staging_like_names, assert_same_files, copy_dir, staging_like_workload,
    store_files, STAGING_LIKE_DOCS,
};

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use twinlog::log::{Kind, Log};
use twinlog::net::{self, Identity, Pins, Role};
use twinlog::node::api::RefMove;
use twinlog::node::epoch::Epochs;
use twinlog::node::retention::Retention;
use twinlog::node::snapshot_transfer::{self as snapshot, SnapshotSource};
use twinlog::node::store_host::{Applier, StoreHost};
use twinlog::node::twin::TwinSnapshots;
use twinlog::node::{Client, Durability, Primary, PrimaryOptions, Twin, TwinOptions, TwinPolicy};
use twinlog::objects::ObjType;
use twinlog::repl::Timers;
use twinlog::store::install::{self, InstallPaths, InstallStep, SnapshotBase};
use twinlog::store::{frames, PackBuilder, RepoOp, Store, StoreOptions};

/// A log of `pushes` pushes to one repository, each a pack and a ref move.
fn workload(log: &Log, pushes: u8) {
    let f = frames::repo_frame("r", RepoOp::Create).expect("frame");
    log.append_raw(f.kind.as_u16(), &f.meta, &f.blob)
        .expect("append");
    let mut last = None;
    for i in 0..pushes {
        let mut p = PackBuilder::new();
        let oid = p.add(ObjType::Blob, &vec![i; 3000]).expect("add");
        let f = p.frame("r").expect("frame");
        log.append_raw(f.kind.as_u16(), &f.meta, &f.blob)
            .expect("append");
        let f = frames::refs_frame(
            "r",
            0,
            &[twinlog::pushlog::RefUpdate {
                name: "refs/heads/main".into(),
                old: last,
                new: Some(oid),
            }],
        )
        .expect("refs");
        log.append_raw(f.kind.as_u16(), &f.meta, &f.blob)
            .expect("append");
        last = Some(oid);
    }
}

/// What a store holds, comparable.
fn view(store: &Store) -> (u64, Vec<(String, usize, Vec<u64>)>) {
    let repos = store
        .repos()
        .map(|name| {
            let r = store.repo(name).expect("repo");
            let pushes = r
                .history()
                .expect("history")
                .iter()
                .map(|p| p.seq)
                .collect();
            (name.to_owned(), r.objects(), pushes)
        })
        .collect();
    (store.applied(), repos)
}

#[test]
fn an_install_stopped_after_any_step_opens_to_the_old_state_or_the_new() {
    let root = tempfile::tempdir().expect("tempdir");
    // The source: a log of 1 + 2*8 frames and its store, snapshotted at 17.
    let source_log = Log::open(root.path().join("src/log")).expect("log");
    workload(&source_log, 8);
    let mut source_store = Store::open(
        root.path().join("src/store"),
        source_log.history(),
        StoreOptions::default(),
    )
    .expect("store");
    let new_view = {
        let snap = root.path().join("snap");
        let m = source_store.snapshot(&source_log, &snap).expect("snapshot");
        assert_eq!(m.at, 17);
        view(&source_store)
    };
    let base = SnapshotBase {
        at: 17,
        crc_at: source_log.locate_blob(17).expect("locate").payload_crc,
        history: source_log.history().0,
    };

    // The twin: the first 3 frames of the same history, applied.
    let twin = root.path().join("twin");
    let old_view = {
        let log = Log::open(twin.join("log")).expect("log");
        log.adopt_history(source_log.history()).expect("adopt");
        log.set_follower(true);
        for seq in 1..=3 {
            let e = source_log.read(seq).expect("read");
            log.append_at(seq, e.kind, &e.meta, &e.blob)
                .expect("append_at");
        }
        let mut store =
            Store::open(twin.join("store"), log.history(), StoreOptions::default()).expect("store");
        store.catch_up(&log).expect("catch up");
        let paths = InstallPaths::new(&twin);
        install::stage_base(&paths, &base).expect("stage");
        copy_dir(&root.path().join("snap"), &paths.files());
        view(&store)
    };
    assert_ne!(old_view, new_view);

    // A staged file that does not match its manifest is refused by name,
    // before the intent: the old state stays.
    {
        let dir = root.path().join("damaged");
        copy_dir(&twin, &dir);
        let paths = InstallPaths::new(&dir);
        let archive = paths.files().join("repos/r/archive");
        let mut b = std::fs::read(&archive).expect("read");
        let last = b.len() - 1;
        b[last] ^= 1;
        std::fs::write(&archive, &b).expect("write");
        let log = Log::open(dir.join("log")).expect("log");
        assert!(matches!(
            install::install(&paths, &log, None),
            Err(twinlog::store::StoreError::BadSnapshot { .. })
        ));
        assert!(!paths.intent().exists());
        assert_eq!(log.head_seq(), 3);
        let store =
            Store::open(dir.join("store"), log.history(), StoreOptions::default()).expect("store");
        assert_eq!(view(&store), old_view);
    }

    let steps = [
        InstallStep::Verified,
        InstallStep::Intent,
        InstallStep::OldMoved,
        InstallStep::Swapped,
        InstallStep::Restarted,
        InstallStep::Based,
        InstallStep::Done,
    ];
    for step in steps {
        let dir = root.path().join(format!("crash-{step:?}"));
        copy_dir(&twin, &dir);
        let paths = InstallPaths::new(&dir);
        {
            let log = Log::open(dir.join("log")).expect("log");
            install::install(&paths, &log, Some(step)).expect("install");
        }
        // The crash: everything closed. The next start finishes or not.
        let log = Log::open(dir.join("log")).expect("reopen");
        let finished = install::finish(&paths, &log).expect("finish");
        let store =
            Store::open(dir.join("store"), log.history(), StoreOptions::default()).expect("store");
        let got = view(&store);
        if step >= InstallStep::Intent {
            assert_eq!(got, new_view, "after {step:?}: the new state");
            assert_eq!(
                (log.head_seq(), log.first_seq()),
                (17, 18),
                "after {step:?}"
            );
            assert_eq!(
                install::read_base(&paths.base()).expect("base"),
                Some(base),
                "after {step:?}"
            );
            assert!(!paths.intent().exists() && !paths.old_store().exists());
            assert!(step == InstallStep::Done || finished == Some(17));
        } else {
            assert_eq!(got, old_view, "after {step:?}: the old state");
            assert_eq!(log.head_seq(), 3);
            assert_eq!(finished, None);
        }
    }
}

#[test]
fn a_snapshot_installs_every_file_of_the_store_whatever_the_names() {
    let root = tempfile::tempdir().expect("tempdir");
    let log = Log::open(root.path().join("src/log")).expect("log");
    staging_like_workload(&log);
    let src = root.path().join("src/store");
    let opts = StoreOptions {
        compact_after_pushes: 2,
        ..StoreOptions::default()
    };
    let mut store = Store::open(&src, log.history(), opts).expect("store");
    let snap = root.path().join("snap");
    let m = store.snapshot(&log, &snap).expect("snapshot");
    assert_eq!(m.at, log.head_seq());
    let (want, docs, files) = (view(&store), docs_of(&store), store_files(&src));
    drop(store);
    assert_holds_the_staging_like_names(&files);

    let twin = root.path().join("twin");
    let paths = InstallPaths::new(&twin);
    let tlog = Log::open(twin.join("log")).expect("log");
    install::stage_base(
        &paths,
        &SnapshotBase {
            at: m.at,
            crc_at: log.locate_blob(m.at).expect("locate").payload_crc,
            history: log.history().0,
        },
    )
    .expect("stage");
    copy_dir(&snap, &paths.files());
    install::install(&paths, &tlog, None).expect("install");
    // Compared before the store opens: an object index (redb) writes to
    // its file when opened.
    assert_same_files(&files, &store_files(&paths.store()));
    let store = Store::open(paths.store(), tlog.history(), StoreOptions::default()).expect("store");
    assert_eq!(view(&store), want);
    assert_eq!(docs_of(&store), docs);
}

/// Every document of the workload's names, as the store reads it.
fn docs_of(store: &Store) -> Vec<Option<Vec<u8>>> {
    STAGING_LIKE_DOCS
        .iter()
        .map(|d| store.doc(d).expect("doc"))
        .collect()
}

fn fast() -> Timers {
    Timers {
        heartbeat: Duration::from_millis(50),
        idle_timeout: Duration::from_secs(2),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interrupted_fetch_resumes_from_the_staged_bytes() {
    let root = tempfile::tempdir().expect("tempdir");
    let log = Arc::new(Log::open(root.path().join("p/log")).expect("log"));
    workload(&log, 20);
    let host = StoreHost::open(
        log.clone(),
        &root.path().join("p/store"),
        StoreOptions::default(),
    )
    .expect("store");
    let source = SnapshotSource::new(host, &root.path().join("p/snapshots"), None);
    let (sid, cid) = (
        Identity::mint().expect("mint"),
        Identity::mint().expect("mint"),
    );
    let server = net::server(
        ([127, 0, 0, 1], 0).into(),
        &sid,
        Arc::new(Pins::new().pin(cid.fingerprint(), Role::Twin)),
    )
    .expect("server");
    let addr = server.local_addr().expect("addr");
    let src = source.clone();
    tokio::spawn(async move {
        while let Some(incoming) = server.accept().await {
            if let Ok(conn) = incoming.await {
                tokio::spawn(snapshot::serve_requests(src.clone(), conn));
            }
        }
    });
    let client = net::client(
        &cid,
        Arc::new(Pins::new().pin(sid.fingerprint(), Role::Primary)),
    )
    .expect("client");
    let conn = net::connect(&client, addr).await.expect("connect");
    let paths = InstallPaths::new(&root.path().join("t"));
    let first = snapshot::fetch(&conn, &paths, &mut |_, _| {})
        .await
        .expect("fetch");
    assert_eq!(first.reused, 0);
    assert_eq!(first.received, first.total);
    // An interruption: the archive cut short, the index gone.
    let files = paths.files().join("repos/r");
    let archive = files.join("archive");
    let len = std::fs::metadata(&archive).expect("meta").len();
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(&archive)
        .expect("open");
    f.set_len(len / 3).expect("cut");
    let index_len = std::fs::metadata(files.join("objects.redb"))
        .expect("meta")
        .len();
    std::fs::remove_file(files.join("objects.redb")).expect("rm");
    let again = snapshot::fetch(&conn, &paths, &mut |_, _| {})
        .await
        .expect("fetch again");
    assert_eq!(again.base, first.base, "the same snapshot is offered");
    assert_eq!(
        again.received,
        len - len / 3 + index_len,
        "only the missing bytes moved"
    );
    assert_eq!(again.reused + again.received, again.total);
    twinlog::store::snapshot::verify(&paths.files()).expect("whole again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_twin_below_the_floor_gets_a_snapshot_and_converges() {
    let root = tempfile::tempdir().expect("tempdir");
    let (pid, tid, cid) = (
        Identity::mint().expect("mint"),
        Identity::mint().expect("mint"),
        Identity::mint().expect("mint"),
    );
    let plog = Arc::new(Log::open_with(root.path().join("p/log"), 64 << 10).expect("log"));
    let pstore = StoreHost::open(
        plog.clone(),
        &root.path().join("p/store"),
        StoreOptions::default(),
    )
    .expect("store");
    let pins = Arc::new(
        Pins::new()
            .pin(tid.fingerprint(), Role::Twin)
            .pin(cid.fingerprint(), Role::Client),
    );
    let endpoint = net::server(([127, 0, 0, 1], 0).into(), &pid, pins.clone()).expect("server");
    let addr: SocketAddr = endpoint.local_addr().expect("addr");
    let primary = Primary::with_store(
        plog.clone(),
        pins,
        PrimaryOptions {
            policy: TwinPolicy::Wait,
            timers: fast(),
            epoch: 0,
            ..PrimaryOptions::default()
        },
        Some(pstore.clone()),
    );
    primary.set_retention(Retention {
        max_bytes: 256 << 10,
        slot: Some(root.path().join("p/TWIN_SLOT")),
    });
    primary.set_snapshots(SnapshotSource::new(
        pstore.clone(),
        &root.path().join("p/snapshots"),
        None,
    ));
    let (_pstop, pstopped) = watch::channel(false);
    tokio::spawn(primary.clone().serve(endpoint, pstopped));

    let tdir = root.path().join("t");
    let tlog = Arc::new(Log::open_with(tdir.join("log"), 64 << 10).expect("log"));
    let tstore =
        StoreHost::open(tlog.clone(), &tdir.join("store"), StoreOptions::default()).expect("store");
    let twin = Twin::new(
        tlog.clone(),
        Arc::new(Epochs::in_memory(0)),
        addr,
        TwinOptions {
            timers: fast(),
            backoff_base: Duration::from_millis(20),
            backoff_cap: Duration::from_millis(200),
        },
    );
    twin.set_snapshots(TwinSnapshots {
        paths: InstallPaths::new(&tdir),
        store: tstore.clone(),
    })
    .expect("snapshots");
    let applier = Applier::start(tstore.clone()).expect("applier");
    let waker = applier.waker();
    let mut durable = twin.durable();
    tokio::spawn(async move {
        while durable.changed().await.is_ok() {
            waker.wake();
        }
    });
    let run_twin = || {
        let endpoint = net::client(
            &tid,
            Arc::new(Pins::new().pin(pid.fingerprint(), Role::Primary)),
        )
        .expect("endpoint");
        let (stop, stopped) = watch::channel(false);
        let task = tokio::spawn(twin.clone().run(endpoint, stopped));
        (stop, task)
    };
    let client = Client::connect(&cid, pid.fingerprint(), addr)
        .await
        .expect("connect");
    client
        .create_repo("r", Durability::Local)
        .await
        .expect("create");
    let mut last = None;
    let mut push = |i: u32| {
        let mut p = PackBuilder::new();
        let blob: Vec<u8> = (0..20_000u32).map(|j| (i * 31 + j) as u8).collect();
        let oid = p.add(ObjType::Blob, &blob).expect("add");
        let moved = vec![RefMove {
            name: "refs/heads/main".into(),
            old: last,
            new: Some(oid),
        }];
        last = Some(oid);
        (p.into_bytes(), moved)
    };
    let (stop, task) = run_twin();
    for i in 0..5 {
        let (pack, moved) = push(i);
        client
            .push("r", &pack, moved, Durability::Twin)
            .await
            .expect("push");
    }
    // The twin goes down; the primary writes well past its cap.
    let _ = stop.send(true);
    task.await.expect("twin stopped");
    for i in 5..60 {
        let (pack, moved) = push(i);
        client
            .push("r", &pack, moved, Durability::Local)
            .await
            .expect("push");
    }
    // Retention runs in passes: one during the pushes may pass the twin
    // while later pushes take the log back over its cap, so the wait is for
    // both, the cap allowing the open segment.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let st = loop {
        let st = primary.status();
        if st.twin_below_floor && st.log_bytes <= (256 << 10) + (64 << 10) {
            break st;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "retention never passed the twin and held the log to its cap: {st:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(st.first > tlog.head_seq(), "{st:?}");

    // A `twin` append made while the twin is away: the snapshot the twin
    // comes back to is taken past it, so the twin will never hold it, and
    // the answer says so instead of acknowledging it as on the twin.
    let before = plog.head_seq();
    let waiting = {
        let c = Client::connect(&cid, pid.fingerprint(), addr)
            .await
            .expect("connect");
        tokio::spawn(async move {
            c.append(
                0x8000,
                b"",
                b"made while the twin was away",
                Durability::Twin,
            )
            .await
        })
    };
    // It is in the primary's log before the twin returns, so the snapshot
    // is taken past it.
    testkit::until(
        "the append in the primary's log",
        Duration::from_secs(10),
        || (plog.head_seq() != before).then_some(()),
    )
    .await;
    // The twin returns, below the floor: a snapshot, then the stream.
    let (_stop, _task) = run_twin();
    let head = plog.head_seq();
    // The twin counts an install in its status only after the installed
    // store and log are there for anyone to see: the wait is for the count
    // too, not only for the twin's store and log at the head.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let ts = loop {
        let ts = twin.status();
        let applied = tstore.lock().expect("store").applied();
        if ts.snapshots_installed > 0 && applied >= head && tlog.head_seq() >= head {
            break ts;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "twin at {} (store {applied}) of {head}: {ts:?}",
            tlog.head_seq(),
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(ts.snapshots_installed, 1, "{ts:?}");
    let answer = waiting.await.expect("join");
    assert!(
        matches!(
            answer,
            Err(twinlog::node::ClientError::Api(
                twinlog::node::ApiError::NotOnTwin { .. }
            ))
        ),
        "{answer:?}"
    );
    assert!(ts.snapshot_at >= st.first - 1);
    assert_eq!(
        view(&pstore.lock().expect("store")),
        view(&tstore.lock().expect("store"))
    );
    // Frames after the snapshot are byte for byte the primary's.
    for seq in ts.snapshot_at + 1..=head {
        assert_eq!(
            tlog.read(seq).expect("twin"),
            plog.read(seq).expect("primary")
        );
    }
    // And the stream goes on.
    let (pack, moved) = push(99);
    let done = client
        .push("r", &pack, moved, Durability::Twin)
        .await
        .expect("push");
    assert_eq!(done.durability, Durability::Twin);
    assert_eq!(
        tlog.read(plog.head_seq()).expect("twin").kind,
        Kind::Refs.as_u16()
    );
    drop(applier);
}

/// A snapshot the twin staged from the primary before an erase its store
/// then applies may hold erased data: it is dropped there and then.
#[test]
fn a_snapshot_staged_before_an_erase_is_dropped_when_the_erase_applies() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = Arc::new(Log::open(dir.path().join("log")).expect("log"));
    let host = StoreHost::open(
        log.clone(),
        &dir.path().join("store"),
        StoreOptions::default(),
    )
    .expect("store");
    host.create_repo("r").expect("create");
    let twin = Twin::new(
        log.clone(),
        Arc::new(Epochs::in_memory(0)),
        "127.0.0.1:9".parse().expect("addr"),
        TwinOptions::default(),
    );
    let paths = InstallPaths::new(dir.path());
    install::stage_base(
        &paths,
        &SnapshotBase {
            at: 1,
            crc_at: 0,
            history: log.history().0,
        },
    )
    .expect("stage");
    std::fs::write(paths.files().join("held"), b"erased-later").expect("write");
    twin.set_snapshots(TwinSnapshots {
        paths: InstallPaths::new(dir.path()),
        store: host.clone(),
    })
    .expect("snapshots");
    // The Erase frame arrives as the primary's frames do, and applies.
    let f = frames::erase_frame(2, &["r".to_owned()]).expect("frame");
    log.append_at(log.head_seq() + 1, f.kind.as_u16(), &f.meta, &f.blob)
        .expect("append_at");
    host.catch_up().expect("apply");
    assert!(!paths.staging().exists(), "the staged snapshot is gone");
}
