//! Restore a fresh box from a twin: through the twin's snapshot when its
//! log does not reach back to 1, every erased byte staying erased; refused
//! on a box with history; and, with real processes, a restore killed with
//! SIGKILL ten times inside a 300 MiB entry resumes each time from the
//! bytes it held and ends with the twin's log, frame for frame.

mod common;

use common::{
    assert_holds_the_staging_like_names, assert_same_files, copy_dir, files_containing, push_blob,
    staging_like_workload, store_files, STAGING_LIKE_REPOS,
};

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::watch;
use twinlog::daemon;
use twinlog::log::{Log, Tail};
use twinlog::net::{self, Identity, Pins, Role};
use twinlog::node::epoch::Epochs;
use twinlog::node::restore::{self, RestoreError, RestoreOptions, RestoreReport};
use twinlog::node::restore_serve::{self, RestoreSource};
use twinlog::node::snapshot_transfer::SnapshotSource;
use twinlog::node::store_host::StoreHost;
use twinlog::objects::ObjType;
use twinlog::pushlog::RefUpdate;
use twinlog::store::install::{self, InstallPaths, SnapshotBase};
use twinlog::store::{frames, PackBuilder, RepoOp, Store, StoreOptions};

use testkit::{free_tcp, free_udp};

const MARKER: &[u8] = b"RESTORE-ERASE-MARKER-91b2";

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

/// A twin whose log starts after a snapshot: the source's frames up to
/// `at` are only in that snapshot. Returns the twin's data directory, the
/// source log's head and the source store's view.
fn twin_after_a_snapshot(root: &Path) -> (PathBuf, u64, StoreView) {
    let src = Log::open(root.join("src/log")).expect("log");
    for repo in ["secret", "kept"] {
        append(&src, &frames::repo_frame(repo, RepoOp::Create).expect("f"));
    }
    let mut last = None;
    for i in 0..4u8 {
        let mut data = MARKER.to_vec();
        data.push(i);
        last = Some(push(&src, "secret", &data, last));
    }
    let mut kept = None;
    for i in 0..3u8 {
        kept = Some(push(&src, "kept", &[b'k', i], kept));
    }
    let before = src.head_seq() + 1;
    append(
        &src,
        &frames::erase_frame(before, &["secret".to_owned()]).expect("f"),
    );
    let mut store = Store::open(
        root.join("src/store"),
        src.history(),
        StoreOptions::default(),
    )
    .expect("store");
    let snap = root.join("snap");
    let m = store.snapshot(&src, &snap).expect("snapshot");
    for i in 3..6u8 {
        kept = Some(push(&src, "kept", &[b'k', i], kept));
    }
    store.catch_up(&src).expect("catch up");
    let twin = twin_from(root, &src, &snap, m.at);
    (twin, src.head_seq(), store_view(&store))
}

/// A twin in `root/twin` that installed the snapshot of `src` at `at` in
/// `snap`, then took and applied `src`'s frames after it.
fn twin_from(root: &Path, src: &Log, snap: &Path, at: u64) -> PathBuf {
    let twin = root.join("twin");
    let paths = InstallPaths::new(&twin);
    let tlog = Log::open(twin.join("log")).expect("twin log");
    install::stage_base(
        &paths,
        &SnapshotBase {
            at,
            crc_at: src.locate_blob(at).expect("locate").payload_crc,
            history: src.history().0,
        },
    )
    .expect("stage");
    copy_dir(snap, &paths.files());
    install::install(&paths, &tlog, None).expect("install");
    tlog.set_follower(true);
    for seq in at + 1..=src.head_seq() {
        let e = src.read(seq).expect("read");
        tlog.append_at(seq, e.kind, &e.meta, &e.blob)
            .expect("append_at");
    }
    let mut tstore =
        Store::open(paths.store(), tlog.history(), StoreOptions::default()).expect("store");
    tstore.catch_up(&tlog).expect("catch up");
    assert_eq!(
        tlog.first_seq(),
        at + 1,
        "the twin's log starts after the snapshot"
    );
    twin
}

/// Serve restores from the twin's data directory, in this process.
async fn serve_restores(
    twin: &Path,
    restorer: &Identity,
) -> (SocketAddr, Identity, watch::Sender<bool>) {
    serve_restores_with(twin, restorer, Epochs::in_memory(3)).await
}

/// `serve_restores` from a twin whose epochs are `epochs`.
async fn serve_restores_with(
    twin: &Path,
    restorer: &Identity,
    epochs: Epochs,
) -> (SocketAddr, Identity, watch::Sender<bool>) {
    let log = Arc::new(Log::open(twin.join("log")).expect("log"));
    let host =
        StoreHost::open(log.clone(), &twin.join("store"), StoreOptions::default()).expect("host");
    let id = Identity::mint().expect("mint");
    let pins = Arc::new(Pins::new().pin(restorer.fingerprint(), Role::Restore));
    let endpoint = net::server(([127, 0, 0, 1], 0).into(), &id, pins.clone()).expect("server");
    let addr = endpoint.local_addr().expect("addr");
    let source = Arc::new(RestoreSource {
        log,
        snapshots: SnapshotSource::new(
            host,
            &twin.join("snapshots"),
            Some(twin.join(install::BASE_FILE)),
        ),
        epochs: Arc::new(epochs),
        base: twin.join(install::BASE_FILE),
    });
    let (stop, stopped) = watch::channel(false);
    tokio::spawn(restore_serve::serve(source, endpoint, pins, stopped));
    (addr, id, stop)
}

/// Restore the box at `data` from the twin serving at `addr`.
async fn restore_into(
    data: &Path,
    addr: SocketAddr,
    twin_id: &Identity,
    box_id: &Arc<Identity>,
) -> Result<restore::RestoreReport, RestoreError> {
    restore::restore(
        RestoreOptions {
            data_dir: data.to_owned(),
            segment_bytes: twinlog::log::DEFAULT_SEGMENT_BYTES,
            source: addr,
            source_fingerprint: twin_id.fingerprint(),
            identity: box_id.clone(),
        },
        Arc::new(|_| {}),
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fresh_box_restores_through_the_twin_s_snapshot_and_no_erased_byte_returns() {
    let root = tempfile::tempdir().expect("tempdir");
    let (twin, head, view) = twin_after_a_snapshot(root.path());
    let box_id = Arc::new(Identity::mint().expect("mint"));
    let (addr, twin_id, _stop) = serve_restores(&twin, &box_id).await;
    let data = root.path().join("box");
    std::fs::create_dir_all(&data).expect("mkdir");
    let opts = || RestoreOptions {
        data_dir: data.clone(),
        segment_bytes: twinlog::log::DEFAULT_SEGMENT_BYTES,
        source: addr,
        source_fingerprint: twin_id.fingerprint(),
        identity: box_id.clone(),
    };
    let report = restore::restore(opts(), Arc::new(|_| {}))
        .await
        .expect("restore");
    assert!(report.snapshot_at.is_some(), "{report:?}");
    assert_eq!(report.head, head);
    assert_eq!(report.epoch, 3, "the box takes the twin's epoch");
    let log = Log::open(data.join("log")).expect("log");
    assert_eq!(log.head_seq(), head);
    let store =
        Store::open(data.join("store"), log.history(), StoreOptions::default()).expect("store");
    assert_eq!(
        store_view(&store),
        view,
        "the store a replay on the source gives"
    );
    assert_eq!(Epochs::load(&data, 0).expect("epochs").current(), 3);
    drop((log, store));
    let mut found = Vec::new();
    found.extend(files_containing(&data, MARKER));
    found.extend(files_containing(&twin, MARKER));
    assert!(found.is_empty(), "erased bytes in {found:?}");

    // The box now has history: a second restore into it is refused.
    let again = restore::restore(opts(), Arc::new(|_| {})).await;
    assert!(matches!(again, Err(RestoreError::NotFresh(_))), "{again:?}");
}

/// A restore killed near its end, resumed after its twin cut frames its
/// primary lost and took others at those sequences, the last with the same
/// bytes: the epochs tell the box's earlier frames from the twin's new
/// ones, the box cuts and fetches them again, and ends with the twin's
/// log frame for frame.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resumed_restore_cuts_the_frames_its_twin_replaced_whatever_their_bytes() {
    let root = tempfile::tempdir().expect("tempdir");
    let twin = root.path().join("twin");
    let blobs: [&[u8]; 6] = [b"one", b"two", b"three", b"a", b"b", b"c"];
    {
        let log = Log::open(twin.join("log")).expect("log");
        for b in blobs {
            log.append_raw(0x8000, b"", b).expect("append");
        }
    }
    let box_id = Arc::new(Identity::mint().expect("mint"));
    let data = root.path().join("box");
    std::fs::create_dir_all(&data).expect("mkdir");
    {
        let (addr, twin_id, stop) = serve_restores_with(&twin, &box_id, Epochs::in_memory(0)).await;
        let report = restore_into(&data, addr, &twin_id, &box_id)
            .await
            .expect("restore");
        assert_eq!(report.head, 6);
        let _ = stop.send(true);
    }
    // As a run killed before it finished leaves the box.
    std::fs::write(
        data.join(restore::RESTORING_FILE),
        b"killed
",
    )
    .expect("mark");
    // The twin cut 4..=6 (its primary lost them) and took the primary's
    // next life's frames there: d, e, then c again.
    {
        let log = testkit::wait::until(
            "the restore server lets go of the twin's log",
            Duration::from_secs(10),
            || Log::open(twin.join("log")).ok(),
        )
        .await;
        log.set_follower(true);
        log.truncate_after(3).expect("cut");
        for (seq, b) in [(4, &b"d"[..]), (5, b"e"), (6, b"c"), (7, b"f")] {
            log.append_at(seq, 0x8000, b"", b).expect("append_at");
        }
    }
    let next_life = Epochs::in_memory(0);
    next_life.begin_life(3).expect("a life");
    let (addr, twin_id, stop) = serve_restores_with(&twin, &box_id, next_life).await;
    let report = restore_into(&data, addr, &twin_id, &box_id)
        .await
        .expect("resumed restore");
    assert!(report.resumed);
    assert_eq!(report.cut_after, Some(3), "{report:?}");
    assert_eq!(report.head, 7);
    let _ = stop.send(true);
    let theirs = testkit::wait::until(
        "the restore server lets go of the twin's log",
        Duration::from_secs(10),
        || Log::open(twin.join("log")).ok(),
    )
    .await;
    let ours = Log::open(data.join("log")).expect("log");
    for seq in 1..=7 {
        let (a, b) = (
            ours.read(seq).expect("ours"),
            theirs.read(seq).expect("theirs"),
        );
        assert_eq!(
            (a.blob, a.payload_crc),
            (b.blob, b.payload_crc),
            "frame {seq}"
        );
    }
    assert_eq!(
        Epochs::load(&data, 7)
            .expect("epochs")
            .history()
            .epoch_of(4),
        Some(1),
        "the box keeps the twin's epochs"
    );
}

/// A restore killed after it wrote its frames, resumed after a kept
/// frame changed on the box's disk into another whole frame (its own crc
/// good, its epoch the same): the resumed run checks what it kept
/// against the twin by digest, cuts from the frame that differs, and
/// fetches it again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resumed_restore_checks_the_frames_it_kept_and_fetches_a_changed_one_again() {
    let root = tempfile::tempdir().expect("tempdir");
    let twin = root.path().join("twin");
    {
        let log = Log::open(twin.join("log")).expect("log");
        for i in 0..300u32 {
            log.append_raw(0x8000, b"", format!("frame {i}").as_bytes())
                .expect("append");
        }
    }
    let box_id = Arc::new(Identity::mint().expect("mint"));
    let data = root.path().join("box");
    std::fs::create_dir_all(&data).expect("mkdir");
    let (addr, twin_id, _stop) = serve_restores_with(&twin, &box_id, Epochs::in_memory(0)).await;
    let report = restore_into(&data, addr, &twin_id, &box_id)
        .await
        .expect("restore");
    assert_eq!(report.head, 300);
    std::fs::write(data.join(restore::RESTORING_FILE), b"killed\n").expect("mark");
    // Frame 211 becomes another whole frame, as a bad disk or a hand may
    // leave it; the frames after it are the twin's again.
    {
        let log = Log::open(data.join("log")).expect("log");
        log.set_follower(true);
        log.truncate_after(210).expect("cut");
        log.append_at(211, 0x8000, b"", b"not the twin's")
            .expect("append_at");
        for seq in 212..=300u64 {
            log.append_at(seq, 0x8000, b"", format!("frame {}", seq - 1).as_bytes())
                .expect("append_at");
        }
        log.sync().expect("sync");
    }
    let report = restore_into(&data, addr, &twin_id, &box_id)
        .await
        .expect("resumed restore");
    assert!(report.resumed);
    assert_eq!(report.verify_cut_after, Some(210), "{report:?}");
    assert_eq!(report.verified, 210, "{report:?}");
    assert_eq!(report.frames, 90, "fetched again from 211: {report:?}");
    let ours = Log::open(data.join("log")).expect("log");
    for seq in [1, 210, 211, 212, 300] {
        assert_eq!(
            ours.read(seq).expect("ours").blob,
            format!("frame {}", seq - 1).into_bytes(),
            "frame {seq}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restored_box_holds_every_file_of_the_twin_s_store_whatever_the_names() {
    let root = tempfile::tempdir().expect("tempdir");
    let src = Log::open(root.path().join("src/log")).expect("log");
    staging_like_workload(&src);
    let opts = StoreOptions {
        compact_after_pushes: 2,
        ..StoreOptions::default()
    };
    let mut store = Store::open(root.path().join("src/store"), src.history(), opts).expect("store");
    let snap = root.path().join("snap");
    let m = store.snapshot(&src, &snap).expect("snapshot");
    // A push to each repository after the snapshot: the twin applies it to
    // the repository the snapshot gave it.
    for repo in STAGING_LIKE_REPOS {
        let head = store.refs(repo).expect("refs")["refs/heads/main"];
        push_blob(&src, repo, format!("{repo} after").as_bytes(), Some(head));
    }
    drop(store);
    let twin = twin_from(root.path(), &src, &snap, m.at);
    assert_holds_the_staging_like_names(&store_files(&twin.join("store")));
    let view_of = |dir: PathBuf| {
        let store = Store::open(dir, src.history(), StoreOptions::default()).expect("store");
        store_view(&store)
    };
    let twin_view = view_of(twin.join("store"));

    let box_id = Arc::new(Identity::mint().expect("mint"));
    let (addr, twin_id, _stop) = serve_restores(&twin, &box_id).await;
    let data = root.path().join("box");
    std::fs::create_dir_all(&data).expect("mkdir");
    let report = restore_into(&data, addr, &twin_id, &box_id)
        .await
        .expect("restore");
    assert_eq!(report.snapshot_at, Some(src.head_seq()), "{report:?}");
    // Both stores have been opened since the copy, and an object index
    // (redb) writes to its file when opened: the indexes are compared by
    // what they hold, every other file byte for byte.
    let without_indexes = |dir: &Path| {
        let mut f = store_files(dir);
        f.retain(|path, _| !path.ends_with("/objects.redb"));
        f
    };
    assert_same_files(
        &without_indexes(&twin.join("store")),
        &without_indexes(&data.join("store")),
    );
    assert_eq!(view_of(data.join("store")), twin_view);
}

// ---- The same with real processes, killed inside a large entry. ----

const BIG: u64 = 300 << 20;

/// A child process (`twinlog-test-child`): `["daemon", "twin", config]`,
/// or `["restore", config, twin address, twin fingerprint]`, printing its
/// report.
fn child(args: &[&std::ffi::OsStr], log: &Path) -> Child {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .expect("log file");
    Command::new(env!("CARGO_BIN_EXE_twinlog-test-child"))
        .args(args)
        .stdout(Stdio::piped())
        .stderr(log)
        .spawn()
        .expect("spawn")
}

fn big_piece(i: u64) -> Vec<u8> {
    (0..1u64 << 20)
        .map(|j| ((i * 131 + j * 7) % 251) as u8)
        .collect()
}

/// The twin's log: small frames, a 300 MiB entry, small frames.
fn fill_twin_log(dir: &Path) {
    let log = Log::open(dir).expect("log");
    log.set_follower(true);
    let mut seq = 1;
    for i in 0..50u64 {
        log.append_at(seq, 0x8000, b"small", &i.to_le_bytes().repeat(40))
            .expect("append");
        seq += 1;
    }
    let mut p = log.begin(Some(seq), 0x8001, b"big", BIG).expect("begin");
    for i in 0..BIG >> 20 {
        p.write(&big_piece(i)).expect("write");
    }
    p.commit().expect("commit");
    seq += 1;
    for i in 0..20u64 {
        log.append_at(seq, 0x8000, b"after", &i.to_le_bytes().repeat(9))
            .expect("append");
        seq += 1;
    }
}

fn partial_written(data: &Path) -> Option<u64> {
    let b = std::fs::read(data.join(restore::PARTIAL_FILE)).ok()?;
    let v: serde_json::Value = serde_json::from_slice(&b).ok()?;
    v.get("written")?.as_u64()
}

#[test]
fn a_restore_killed_ten_times_inside_a_large_entry_resumes_each_time() {
    let root = tempfile::tempdir().expect("tempdir");
    let (tdir, pdir) = (root.path().join("twin"), root.path().join("box"));
    let restore_addr = free_udp();
    let twin_metrics = free_tcp();
    let (tcfg, twin_fp) =
        daemon::init_twin(&tdir, free_udp(), twin_metrics, None).expect("twin init");
    let (pcfg, box_fp) = daemon::init_primary(&pdir, free_udp(), free_tcp(), None).expect("init");
    daemon::pin_restore(&tcfg, box_fp, Some(restore_addr), None).expect("pin");
    // The twin's primary is gone (it never existed here): the twin keeps
    // trying it and serves restores meanwhile.
    daemon::pin_primary(&tcfg, Identity::mint().expect("mint").fingerprint()).expect("pin");
    fill_twin_log(&tdir.join(daemon::LOG_DIR));
    let logs = root.path().join("logs.txt");
    let mut twin = child(
        &["daemon".as_ref(), "twin".as_ref(), tcfg.as_os_str()],
        &logs,
    );
    // The twin binds its restore server before its status server: once
    // the status port answers, restores are served.
    let started = Instant::now();
    while std::net::TcpStream::connect(twin_metrics).is_err() {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the twin did not start within 30 s: {}",
            std::fs::read_to_string(&logs).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let (from, fp) = (restore_addr.to_string(), twin_fp.to_string());
    let restore_args = [
        "restore".as_ref(),
        pcfg.as_os_str(),
        from.as_ref(),
        fp.as_ref(),
    ];
    // Each run killed once it has written past a point further on than
    // the last; each rerun's first record of the entry starts at or past
    // where the killed run got.
    let mut held = 0u64;
    let mut seed = 0x9e37_79b9_u64;
    for kill in 0..10u64 {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let point = (kill * 25 + 10) * (1 << 20) + (seed >> 40) % (8 << 20);
        let mut run = child(&restore_args, &logs);
        let started = Instant::now();
        let mut first_seen = None;
        loop {
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "run {kill} never reached byte {point}"
            );
            if let Some(w) = partial_written(&pdir) {
                first_seen.get_or_insert(w);
                if w >= point {
                    break;
                }
            }
            assert!(
                run.try_wait().expect("wait").is_none(),
                "run {kill} ended before it was killed: {}",
                std::fs::read_to_string(&logs).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(2));
        }
        run.kill().expect("kill");
        run.wait().expect("reap");
        if let Some(first) = first_seen {
            assert!(
                first >= held,
                "run {kill} started the entry at byte {first}, {held} were held"
            );
        }
        held = partial_written(&pdir).unwrap_or(held);
        assert!(
            held >= point,
            "run {kill}: {held} recorded, killed past {point}"
        );
    }
    let done = child(&restore_args, &logs)
        .wait_with_output()
        .expect("final run");
    assert!(
        done.status.success(),
        "final run failed; see {}",
        logs.display()
    );
    let report: RestoreReport = {
        let text = String::from_utf8(done.stdout).expect("utf8");
        // The harness may print its own words before it on the line.
        let line = text
            .lines()
            .find_map(|l| l.find("{\"resumed\"").map(|i| &l[i..]))
            .expect("a report line");
        let v: serde_json::Value = serde_json::from_str(line).expect("json");
        RestoreReport {
            resumed: v["resumed"].as_bool().expect("resumed"),
            started_at_seq: v["started_at_seq"].as_u64().expect("seq"),
            started_at_byte: v["started_at_byte"].as_u64().expect("byte"),
            salvaged_bytes: v["salvaged_bytes"].as_u64().expect("salvaged"),
            received_bytes: v["received_bytes"].as_u64().expect("received"),
            head: v["head"].as_u64().expect("head"),
            ..RestoreReport::default()
        }
    };
    assert!(report.resumed);
    assert_eq!(report.started_at_seq, 51, "inside the large entry");
    assert!(report.started_at_byte >= held, "{report:?}, {held} held");
    let after: u64 = (0..20u64)
        .map(|i| i.to_le_bytes().repeat(9).len() as u64)
        .sum();
    assert_eq!(
        report.received_bytes,
        BIG - report.started_at_byte + after,
        "only the bytes the box did not hold moved"
    );
    let _ = Command::new("kill")
        .args(["-TERM", &twin.id().to_string()])
        .status();
    twin.wait().expect("twin stopped");

    // The box's log is the twin's, frame for frame.
    let read_all = |dir: PathBuf| {
        let mut t = Tail::open(dir, 0).expect("tail");
        let mut out = Vec::new();
        while let Some(h) = t.next_checked().expect("frame") {
            out.push(h);
        }
        out
    };
    let ours = read_all(pdir.join(daemon::LOG_DIR));
    let theirs = read_all(tdir.join(daemon::LOG_DIR));
    assert_eq!(ours.len(), 71);
    assert_eq!(ours, theirs);
    let log = Log::open(pdir.join(daemon::LOG_DIR)).expect("log");
    let big = log.locate_blob(51).expect("big");
    assert_eq!(big.kind, 0x8001);
    assert_eq!(big.blob_len, BIG);
    log.read_pieces::<twinlog::log::Error>(51, 1 << 20, |_, _, _| Ok(()))
        .expect("the whole entry checks");
    assert!(!pdir.join(restore::RESTORING_FILE).exists());
}

/// The record of an entry a killed run was writing is a hint, published
/// without fsyncs: after a power cut it may name bytes that are gone (the
/// segment lost, or its crc not the bytes'). The next run fetches the
/// entry whole instead of failing or keeping bytes that do not check.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partial_record_whose_bytes_are_gone_fetches_the_entry_whole() {
    let root = tempfile::tempdir().expect("tempdir");
    let twin = root.path().join("twin");
    {
        let log = Log::open(twin.join("log")).expect("log");
        log.set_follower(true);
        log.append_at(1, 0x8000, b"small", b"one").expect("append");
        let big = 6u64 << 20;
        let mut p = log.begin(Some(2), 0x8001, b"big", big).expect("begin");
        for i in 0..big >> 20 {
            p.write(&big_piece(i)).expect("write");
        }
        p.commit().expect("commit");
        log.append_at(3, 0x8000, b"small", b"three")
            .expect("append");
    }
    let box_id = Arc::new(Identity::mint().expect("mint"));
    let (addr, twin_id, _stop) = serve_restores(&twin, &box_id).await;
    for (case, segment) in [
        ("segment gone", root.path().join("no-such-segment")),
        ("bytes differ", twin.join("log").join("HISTORY")),
    ] {
        let data = root.path().join(format!("box-{}", case.replace(' ', "-")));
        std::fs::create_dir_all(&data).expect("mkdir");
        let record = serde_json::json!({
            "seq": 2, "kind": 0x8001, "meta": b"big", "blob_len": 6u64 << 20,
            "payload_crc": 0, "segment": segment, "blob_at": 0,
            "written": 8, "crc_written": 0x1234_5678u32,
        });
        std::fs::write(data.join(restore::PARTIAL_FILE), record.to_string()).expect("record");
        let report = restore_into(&data, addr, &twin_id, &box_id)
            .await
            .unwrap_or_else(|e| panic!("{case}: {e}"));
        assert_eq!(report.head, 3, "{case}");
        assert_eq!(report.salvaged_bytes, 0, "{case}: nothing salvaged");
        let log = Log::open(data.join("log")).expect("log");
        log.read_pieces::<twinlog::log::Error>(2, 1 << 20, |_, _, _| Ok(()))
            .expect("the whole entry checks");
        assert!(!data.join(restore::PARTIAL_FILE).exists(), "{case}");
    }
}

/// A twin whose restart base does not read refuses a restore by name
/// instead of serving a head crc it cannot vouch for, and the box is left
/// as fresh as it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_twin_whose_base_does_not_read_refuses_a_restore() {
    let root = tempfile::tempdir().expect("tempdir");
    let (twin, _, _) = twin_after_a_snapshot(root.path());
    std::fs::write(twin.join(install::BASE_FILE), b"{ not a base").expect("damage the base");
    let box_id = Arc::new(Identity::mint().expect("mint"));
    let (addr, twin_id, _stop) = serve_restores(&twin, &box_id).await;
    let data = root.path().join("box");
    std::fs::create_dir_all(&data).expect("mkdir");
    let refused = restore_into(&data, addr, &twin_id, &box_id).await;
    assert!(
        matches!(&refused, Err(RestoreError::Refused(why)) if why.contains("head frame")),
        "{refused:?}"
    );
    let log = Log::open(data.join("log")).expect("the box's log");
    assert_eq!(log.head_seq(), 0, "nothing was restored");
}
