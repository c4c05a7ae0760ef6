//! The store through the primary, over real QUIC on loopback: create,
//! push, refs, history, objects and `have`; refusals that write nothing; a
//! git repository imported; and the twin's store, fed by its log, equal to
//! the primary's.

mod common;

use common::files_containing;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use twinlog::log::{Kind, Log};
use twinlog::net::{self, Identity, Pins, Role};
use twinlog::node::api::RefMove;
use twinlog::node::epoch::Epochs;
use twinlog::node::restore::{self, RestoreOptions};
use twinlog::node::restore_serve::{self, RestoreSource};
use twinlog::node::snapshot_transfer::SnapshotSource;
use twinlog::node::store_host::{Applier, StoreHost};
use twinlog::node::{
    ApiError, Client, ClientError, Durability, Primary, PrimaryOptions, Twin, TwinOptions,
    TwinPolicy,
};
use twinlog::objects::ObjType;
use twinlog::repl::Timers;
use twinlog::store::{PackBuilder, StoreOptions};

/// The bound of every wait on state here: only a broken system reaches it.
const WAIT: Duration = Duration::from_secs(20);

fn fast() -> Timers {
    Timers {
        heartbeat: Duration::from_millis(50),
        idle_timeout: Duration::from_secs(2),
    }
}

struct Pair {
    client: Client,
    primary: Arc<Primary>,
    primary_store: Arc<StoreHost>,
    twin_store: Arc<StoreHost>,
    twin: Arc<Twin>,
    _stops: Vec<watch::Sender<bool>>,
    _applier: tokio::task::JoinHandle<()>,
}

async fn start(dir: &Path) -> Pair {
    let log = Arc::new(Log::open(dir.join("p/log")).expect("log"));
    start_on(dir, log).await
}

/// `start` on a primary log the caller opened (and may have written).
async fn start_on(dir: &Path, log: Arc<Log>) -> Pair {
    let (pid, tid, cid) = (
        Identity::mint().expect("mint"),
        Identity::mint().expect("mint"),
        Identity::mint().expect("mint"),
    );
    let primary_store =
        StoreHost::open(log.clone(), &dir.join("p/store"), StoreOptions::default()).expect("store");
    let pins = Arc::new(
        Pins::new()
            .pin(tid.fingerprint(), Role::Twin)
            .pin(cid.fingerprint(), Role::Client),
    );
    let endpoint = net::server(([127, 0, 0, 1], 0).into(), &pid, pins.clone()).expect("endpoint");
    let addr: SocketAddr = endpoint.local_addr().expect("addr");
    let primary = Primary::with_store(
        log,
        pins,
        PrimaryOptions {
            policy: TwinPolicy::Wait,
            timers: fast(),
            epoch: 0,
            ..PrimaryOptions::default()
        },
        Some(primary_store.clone()),
    );
    let (pstop, pstopped) = watch::channel(false);
    tokio::spawn(primary.clone().serve(endpoint, pstopped));

    let tlog = Arc::new(Log::open(dir.join("t/log")).expect("twin log"));
    let twin_store = StoreHost::open(tlog.clone(), &dir.join("t/store"), StoreOptions::default())
        .expect("store");
    let tpins = Arc::new(Pins::new().pin(pid.fingerprint(), Role::Primary));
    let tend = net::client(&tid, tpins).expect("endpoint");
    let twin = Twin::new(
        tlog,
        Arc::new(Epochs::in_memory(0)),
        addr,
        TwinOptions {
            timers: fast(),
            backoff_base: Duration::from_millis(20),
            backoff_cap: Duration::from_millis(200),
        },
    );
    twin.set_store(twin_store.clone());
    let (tstop, tstopped) = watch::channel(false);
    tokio::spawn(twin.clone().run(tend, tstopped));
    let applier = Applier::start(twin_store.clone()).expect("applier");
    let mut durable = twin.durable();
    let applier_task = tokio::spawn(async move {
        while durable.changed().await.is_ok() {
            applier.wake();
        }
    });
    let client = Client::connect(&cid, pid.fingerprint(), addr)
        .await
        .expect("connect");
    Pair {
        client,
        primary,
        primary_store,
        twin_store,
        twin,
        _stops: vec![pstop, tstop],
        _applier: applier_task,
    }
}

fn moved(name: &str, old: Option<[u8; 20]>, new: Option<[u8; 20]>) -> Vec<RefMove> {
    vec![RefMove {
        name: name.into(),
        old,
        new,
    }]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pushes_land_in_both_stores_and_refusals_write_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let p = start(dir.path()).await;
    let c = &p.client;
    c.create_repo("acme/widgets", Durability::Twin)
        .await
        .expect("create");
    assert!(matches!(
        c.create_repo("acme/widgets", Durability::Twin).await,
        Err(ClientError::Api(ApiError::RepoExists(_)))
    ));
    let mut pack = PackBuilder::new();
    let blob = pack.add(ObjType::Blob, b"hello\n").expect("add");
    let big: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
    let big_oid = pack.add(ObjType::Blob, &big).expect("add");
    let commit = pack
        .add(
            ObjType::Commit,
            b"tree 4b825dc642cb6eb9a060e54bf8d69288fbee4904\n\nfirst\n",
        )
        .expect("add");
    let pushed = c
        .push(
            "acme/widgets",
            &pack.into_bytes(),
            moved("refs/heads/main", None, Some(commit)),
            Durability::Twin,
        )
        .await
        .expect("push");
    assert_eq!(pushed.objects, 3);
    assert_eq!(pushed.durability, Durability::Twin);
    assert_eq!(
        c.read_object("acme/widgets", blob).await.expect("read"),
        Some((ObjType::Blob, b"hello\n".to_vec()))
    );
    assert_eq!(
        c.read_object("acme/widgets", big_oid)
            .await
            .expect("read")
            .map(|(_, d)| d.len()),
        Some(big.len())
    );
    assert_eq!(
        c.have("acme/widgets", &[blob, [0u8; 20], commit])
            .await
            .expect("have"),
        vec![true, false, true]
    );
    assert_eq!(
        c.refs("acme/widgets").await.expect("refs")["refs/heads/main"],
        commit
    );

    // Refusals, each by name, each leaving the log where it was.
    let head = p.primary.log().head_seq();
    assert!(matches!(
        c.push(
            "acme/widgets",
            &[],
            moved("refs/heads/main", None, Some(blob)),
            Durability::Twin
        )
        .await,
        Err(ClientError::Api(ApiError::RefMoved { .. }))
    ));
    let mut bad = PackBuilder::new();
    bad.add(ObjType::Blob, b"will be damaged").expect("add");
    let mut bad = bad.into_bytes();
    let last = bad.len() - 1;
    bad[last] ^= 1;
    assert!(matches!(
        c.push("acme/widgets", &bad, Vec::new(), Durability::Twin)
            .await,
        Err(ClientError::Api(ApiError::BadPush(_)))
    ));
    assert!(matches!(
        c.push(
            "nobody",
            &[],
            moved("refs/heads/x", None, Some(blob)),
            Durability::Twin
        )
        .await,
        Err(ClientError::Api(ApiError::NoRepo(_)))
    ));
    let raw = c
        .append(Kind::Pack.as_u16(), b"", b"raw", Durability::Local)
        .await;
    assert!(
        matches!(raw, Err(ClientError::Api(ApiError::Forbidden(_)))),
        "{raw:?}"
    );
    assert_eq!(p.primary.log().head_seq(), head, "no refusal wrote a frame");

    // An update moves the ref; the history has both pushes.
    let mut pack2 = PackBuilder::new();
    let c2 = pack2
        .add(
            ObjType::Commit,
            b"tree 4b825dc642cb6eb9a060e54bf8d69288fbee4904\n\nsecond\n",
        )
        .expect("add");
    c.push(
        "acme/widgets",
        &pack2.into_bytes(),
        moved("refs/heads/main", Some(commit), Some(c2)),
        Durability::Twin,
    )
    .await
    .expect("push");
    let h = c.push_history("acme/widgets").await.expect("history");
    assert_eq!(h.len(), 2);
    assert_eq!(h[1].updates[0].old, Some(commit));

    converge(&p).await;
}

/// The twin's store reaches the primary's head and holds what it holds.
async fn converge(p: &Pair) {
    let head = p.primary.log().head_seq();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while p.twin_store.lock().expect("store").applied() < head {
        assert!(
            tokio::time::Instant::now() < deadline,
            "twin store at {} of {head}, twin log at {}",
            p.twin_store.lock().expect("store").applied(),
            p.twin.log().head_seq()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let ps = p.primary_store.lock().expect("store");
    let ts = p.twin_store.lock().expect("store");
    let names: Vec<&str> = ps.repos().collect();
    assert_eq!(names, ts.repos().collect::<Vec<_>>());
    for name in names {
        let (a, b) = (ps.repo(name).expect("repo"), ts.repo(name).expect("repo"));
        assert_eq!(a.refs(), b.refs());
        assert_eq!(a.history().expect("history"), b.history().expect("history"));
        let oids = a.object_ids().expect("oids");
        assert_eq!(oids, b.object_ids().expect("oids"));
        for oid in oids {
            assert_eq!(
                a.read_object(&oid).expect("read"),
                b.read_object(&oid).expect("read")
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repositories_and_documents_are_listed_and_deleted_on_both_boxes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let p = start(dir.path()).await;
    let c = &p.client;
    for r in ["b/two", "a/one", "build.tmp"] {
        c.create_repo(r, Durability::Twin).await.expect("create");
    }
    c.put_doc("policy.toml", b"x = 1", Durability::Twin)
        .await
        .expect("put");
    c.put_doc("a.tmp", b"", Durability::Twin)
        .await
        .expect("put");
    assert_eq!(
        c.list_repos().await.expect("list"),
        vec!["a/one", "b/two", "build.tmp"]
    );
    assert_eq!(
        c.list_docs().await.expect("list"),
        vec!["a.tmp", "policy.toml"]
    );
    c.delete_repo("b/two", Durability::Twin)
        .await
        .expect("delete");
    c.delete_doc("policy.toml", Durability::Twin)
        .await
        .expect("delete");
    assert!(matches!(
        c.delete_repo("b/two", Durability::Twin).await,
        Err(ClientError::Api(ApiError::NoRepo(_)))
    ));
    assert!(matches!(
        c.delete_doc("policy.toml", Durability::Twin).await,
        Err(ClientError::Api(ApiError::NoDoc(_)))
    ));
    assert_eq!(
        c.list_repos().await.expect("list"),
        vec!["a/one", "build.tmp"]
    );
    assert_eq!(c.list_docs().await.expect("list"), vec!["a.tmp"]);
    converge(&p).await;
    let ts = p.twin_store.lock().expect("store");
    assert_eq!(ts.docs().expect("docs"), vec!["a.tmp"]);
    assert!(ts.repo("b/two").is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frame_that_applies_nowhere_stops_both_stores_visibly_and_one_skip_resolves_both() {
    let dir = tempfile::tempdir().expect("tempdir");
    // A create whose blob is no RepoOp, written past the checks.
    let log = Arc::new(Log::open(dir.path().join("p/log")).expect("log"));
    let meta = twinlog::log::Meta::repo("bad").encode().expect("meta");
    log.append_raw(Kind::RepoStore.as_u16(), &meta, b"\xff\xff")
        .expect("append");
    let p = start_on(dir.path(), log).await;
    let c = &p.client;
    // The primary serves; its store says where it stopped and why.
    let st = c.status().await.expect("status");
    let stall = st.store.expect("store").stalled.expect("stalled");
    assert_eq!(stall.seq, 1);
    // The twin follows the log, its store stops at the same frame, and the
    // primary learns of it.
    testkit::until("the twin's store stops at 1 and says so", WAIT, || {
        (p.primary
            .status()
            .twin_store
            .and_then(|h| h.stalled)
            .is_some_and(|s| s.seq == 1))
        .then_some(())
    })
    .await;
    assert_eq!(p.twin.status().store.stalled.map(|s| s.seq), Some(1));
    // Store writes are refused by name; nothing lands.
    let head = p.primary.log().head_seq();
    assert!(matches!(
        c.create_repo("good", Durability::Twin).await,
        Err(ClientError::Api(ApiError::StoreStalled { seq: 1, .. }))
    ));
    assert_eq!(p.primary.log().head_seq(), head);
    // A skip of another frame is refused; of this one, it resolves both.
    assert!(matches!(
        c.store_skip(2, "no", false, Durability::Twin).await,
        Err(ClientError::Api(ApiError::SkipRefused { seq: 2, .. }))
    ));
    let skipped = c
        .store_skip(1, "a damaged create", false, Durability::Twin)
        .await
        .expect("skip");
    assert_eq!(skipped.durability, Durability::Twin);
    testkit::until("both stores apply again", WAIT, || {
        let s = p.primary.status();
        (s.store
            .is_some_and(|h| h.stalled.is_none() && h.skipped == 1)
            && s.twin_store
                .is_some_and(|h| h.stalled.is_none() && h.skipped == 1))
        .then_some(())
    })
    .await;
    c.create_repo("good", Durability::Twin)
        .await
        .expect("create");
    converge(&p).await;
}

/// An erase is answered carried out on both boxes only once both stores
/// applied it: its bytes, the erased objects' ids, its large objects and
/// every snapshot taken before it are gone from both data directories by
/// then; a twin whose store is stopped gets the erase named as not carried
/// out there, and carries it out once its store goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_erase_is_answered_once_both_stores_carried_it_out_snapshots_included() {
    let dir = tempfile::tempdir().expect("tempdir");
    let p = start(dir.path()).await;
    let c = &p.client;
    let marker = b"ERASE-ME-4d1c-snapshot-and-lfs-marker";
    c.create_repo("secret", Durability::Twin)
        .await
        .expect("create");
    let mut pack = PackBuilder::new();
    let mut blob = marker.to_vec();
    blob.extend_from_slice(&[9; 3000]);
    let oid = pack.add(ObjType::Blob, &blob).expect("add");
    c.push(
        "secret",
        &pack.into_bytes(),
        moved("refs/heads/main", None, Some(oid)),
        Durability::Twin,
    )
    .await
    .expect("push");
    let mut lfs = marker.to_vec();
    lfs.extend_from_slice(b" in a large object");
    let lfs_oid = twinlog::store::frames::lfs_oid(&lfs);
    c.lfs_put(
        "secret",
        lfs_oid,
        lfs.len() as u64,
        &lfs[..],
        Durability::Twin,
    )
    .await
    .expect("lfs put");
    converge(&p).await;
    // A snapshot an earlier run left behind is removed at start.
    let orphan = dir.path().join("p/snapshots/2/repos/secret");
    std::fs::create_dir_all(&orphan).expect("mkdir");
    std::fs::write(orphan.join("pushlog"), marker).expect("write");
    // Snapshots on both boxes, taken before the erase, holding the marker.
    let psnap = SnapshotSource::new(
        p.primary_store.clone(),
        &dir.path().join("p/snapshots"),
        None,
    );
    let tsnap = SnapshotSource::new(p.twin_store.clone(), &dir.path().join("t/snapshots"), None);
    for s in [&psnap, &tsnap] {
        let s = s.clone();
        tokio::task::spawn_blocking(move || s.offer())
            .await
            .expect("join")
            .expect("snapshot");
    }
    assert!(
        !orphan.exists(),
        "an earlier run's snapshot is removed at start"
    );
    assert!(!files_containing(&dir.path().join("p/snapshots"), marker).is_empty());
    assert!(!files_containing(&dir.path().join("t/snapshots"), marker).is_empty());

    let head = p.primary.log().head_seq();
    let erased = c
        .erase(head + 1, &["secret".to_owned()], Durability::Twin)
        .await
        .expect("erase");
    assert_eq!(erased.durability, Durability::Twin);
    // No waiting: by the answer, both boxes hold nothing of it.
    for needle in [&marker[..], &oid[..], &lfs_oid[..]] {
        let found = files_containing(dir.path(), needle);
        assert!(found.is_empty(), "erased bytes survive in {found:?}");
    }
    assert!(
        p.twin_store.health().applied >= erased.seq,
        "answered before the twin's store applied it"
    );

    // A twin whose store is stopped: the erase is named as not carried out
    // there, and is carried out once the store goes on.
    let blocked = dir.path().join("t/store/repos/blocked");
    std::fs::write(&blocked, b"in the way").expect("write");
    c.create_repo("blocked", Durability::Twin)
        .await
        .expect("create");
    testkit::until("the twin's store stops", WAIT, || {
        (p.primary
            .status()
            .twin_store
            .is_some_and(|h| h.stalled.is_some()))
        .then_some(())
    })
    .await;
    let mut pack = PackBuilder::new();
    let oid2 = pack.add(ObjType::Blob, &blob[..100]).expect("add");
    c.push(
        "secret",
        &pack.into_bytes(),
        moved("refs/heads/main", None, Some(oid2)),
        Durability::Twin,
    )
    .await
    .expect("push");
    let head = p.primary.log().head_seq();
    let err = c
        .erase(head + 1, &["secret".to_owned()], Durability::Twin)
        .await
        .expect_err("not carried out on the twin");
    assert!(
        matches!(err, ClientError::Api(ApiError::NotCarriedOutOnTwin { .. })),
        "{err}"
    );
    assert!(files_containing(&dir.path().join("p"), &blob[..100]).is_empty());
    std::fs::remove_file(&blocked).expect("rm");
    converge(&p).await;
    let found = files_containing(dir.path(), &blob[..100]);
    assert!(found.is_empty(), "erased bytes survive in {found:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_git_repository_imports_and_reads_back() {
    let dir = tempfile::tempdir().expect("tempdir");
    let git = dir.path().join("src");
    let sh = |args: &[&str]| {
        let out = std::process::Command::new("git")
            .arg("-C")
            .arg(&git)
            .args(args)
            .env("GIT_AUTHOR_NAME", "t")
            .env("GIT_AUTHOR_EMAIL", "t@example.com")
            .env("GIT_COMMITTER_NAME", "t")
            .env("GIT_COMMITTER_EMAIL", "t@example.com")
            .output()
            .expect("git");
        assert!(out.status.success(), "git {args:?}: {:?}", out);
        String::from_utf8(out.stdout).expect("utf8")
    };
    std::fs::create_dir_all(&git).expect("mkdir");
    sh(&["init", "-q", "-b", "main"]);
    for i in 0..5 {
        std::fs::write(
            git.join(format!("f{i}.txt")),
            format!("file {i}\n").repeat(i + 1),
        )
        .expect("write");
        sh(&["add", "."]);
        sh(&["commit", "-q", "-m", &format!("commit {i}")]);
    }
    sh(&["tag", "v1"]);
    let p = start(dir.path()).await;
    let r = p
        .client
        .import_git(&git, "imported", 256, Durability::Twin)
        .await
        .expect("import");
    let count: u64 = sh(&["count-objects", "-v"])
        .lines()
        .find_map(|l| l.strip_prefix("count: "))
        .and_then(|n| n.parse().ok())
        .expect("count");
    assert_eq!(r.objects, count, "every loose object imported");
    assert!(r.packs > 1, "small packs: several pushes");
    let refs = p.client.refs("imported").await.expect("refs");
    let head = sh(&["rev-parse", "HEAD"]);
    assert_eq!(
        twinlog::store::frames::hex(&refs["refs/heads/main"]),
        head.trim()
    );
    assert!(refs.contains_key("refs/tags/v1"));
    let (t, data) = p
        .client
        .read_object(
            "imported",
            twinlog::store::frames::unhex(head.trim()).expect("hex"),
        )
        .await
        .expect("read")
        .expect("present");
    assert_eq!(t, ObjType::Commit);
    assert_eq!(data, sh(&["cat-file", "commit", "HEAD"]).into_bytes());
    converge(&p).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_erase_leaves_no_byte_on_either_box() {
    let dir = tempfile::tempdir().expect("tempdir");
    let p = start(dir.path()).await;
    let c = &p.client;
    let marker = b"ERASE-ME-7f3a9c1e-the-unique-marker";
    for repo in ["secret", "kept"] {
        c.create_repo(repo, Durability::Twin).await.expect("create");
    }
    let mut last = None;
    for i in 0..3u8 {
        let mut secret = PackBuilder::new();
        let mut blob = marker.to_vec();
        blob.extend_from_slice(&[i; 5000]);
        let oid = secret.add(ObjType::Blob, &blob).expect("add");
        c.push(
            "secret",
            &secret.into_bytes(),
            moved("refs/heads/main", last, Some(oid)),
            Durability::Twin,
        )
        .await
        .expect("push");
        last = Some(oid);
        let mut kept = PackBuilder::new();
        kept.add(ObjType::Blob, &[b'k', i]).expect("add");
        c.push("kept", &kept.into_bytes(), Vec::new(), Durability::Twin)
            .await
            .expect("push");
    }
    converge(&p).await;
    let mut before = Vec::new();
    before.extend(files_containing(dir.path(), marker));
    assert!(
        before.len() >= 4,
        "the marker is on both boxes first: {before:?}"
    );

    let head = p.primary.log().head_seq();
    let erased = c
        .erase(head + 1, &["secret".to_owned()], Durability::Twin)
        .await
        .expect("erase");
    // Three packs and three pushes, each with the repository's name.
    assert_eq!((erased.before, erased.frames), (head + 1, 6), "{erased:?}");
    assert!(erased.bytes > 3 * 5000, "{erased:?}");
    converge(&p).await;
    let mut found = Vec::new();
    found.extend(files_containing(dir.path(), marker));
    assert!(found.is_empty(), "erased bytes survive in {found:?}");
    let kept = p
        .primary_store
        .lock()
        .expect("store")
        .repo("kept")
        .expect("repo")
        .objects();
    assert_eq!(kept, 3, "the other repository keeps its objects");
    assert_eq!(
        p.twin_store
            .lock()
            .expect("store")
            .repo("secret")
            .expect("repo")
            .objects(),
        0
    );
    assert!(c.refs("secret").await.expect("refs").is_empty());
    assert!(matches!(
        c.erase(head + 10, &["secret".to_owned()], Durability::Twin)
            .await,
        Err(ClientError::Api(ApiError::BadRequest(_)))
    ));
    // Before a time: every segment so far was last written before a
    // minute from now, so the erase reaches the head, and finds nothing
    // more of the repository to erase.
    let later = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_millis() as u64
        + 60_000;
    let again = c
        .erase_before_time(later, &["secret".to_owned()], Durability::Twin)
        .await
        .expect("erase by time");
    assert_eq!(again.before, again.seq, "{again:?}");
    assert_eq!(again.frames, 0, "{again:?}");

    // A box restored from the twin afterwards brings back no erased byte.
    let restorer = Arc::new(Identity::mint().expect("mint"));
    let twin_id = Identity::mint().expect("mint");
    let pins = Arc::new(Pins::new().pin(restorer.fingerprint(), Role::Restore));
    let endpoint = net::server(([127, 0, 0, 1], 0).into(), &twin_id, pins.clone()).expect("server");
    let addr = endpoint.local_addr().expect("addr");
    let tdir = dir.path().join("t");
    let source = Arc::new(RestoreSource {
        log: p.twin.log().clone(),
        snapshots: SnapshotSource::new(p.twin_store.clone(), &tdir.join("snapshots"), None),
        epochs: Arc::new(Epochs::in_memory(0)),
        base: tdir.join("SNAPSHOT_BASE"),
    });
    let (_stop, stopped) = watch::channel(false);
    tokio::spawn(restore_serve::serve(source, endpoint, pins, stopped));
    let restored = dir.path().join("restored");
    std::fs::create_dir_all(&restored).expect("mkdir");
    let report = restore::restore(
        RestoreOptions {
            data_dir: restored.clone(),
            segment_bytes: twinlog::log::DEFAULT_SEGMENT_BYTES,
            source: addr,
            source_fingerprint: twin_id.fingerprint(),
            identity: restorer,
        },
        Arc::new(|_| {}),
    )
    .await
    .expect("restore");
    assert_eq!(report.head, p.primary.log().head_seq());
    let mut found = Vec::new();
    found.extend(files_containing(&restored, marker));
    assert!(
        found.is_empty(),
        "the restored box holds erased bytes: {found:?}"
    );
    let log = Log::open(restored.join("log")).expect("log");
    let store = twinlog::store::Store::open(
        restored.join("store"),
        log.history(),
        StoreOptions::default(),
    )
    .expect("store");
    assert_eq!(store.repo("kept").expect("repo").objects(), 3);
    assert_eq!(store.repo("secret").expect("repo").objects(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_objects_stream_in_and_out_and_a_bad_hash_lands_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let p = start(dir.path()).await;
    let c = &p.client;
    c.create_repo("media", Durability::Twin)
        .await
        .expect("create");
    let content: Vec<u8> = (0..20_000_000u32).map(|i| (i % 253) as u8).collect();
    let oid = twinlog::store::frames::lfs_oid(&content);
    c.lfs_put(
        "media",
        oid,
        content.len() as u64,
        &content[..],
        Durability::Twin,
    )
    .await
    .expect("put");
    let mut back = Vec::new();
    assert!(c.lfs_get("media", oid, &mut back).await.expect("get"));
    assert!(back == content, "the object reads back whole");

    let head = p.primary.log().head_seq();
    let wrong = [7u8; 32];
    assert!(matches!(
        c.lfs_put("media", wrong, 1000, &content[..1000], Durability::Twin)
            .await,
        Err(ClientError::Api(ApiError::BadPush(_)))
    ));
    assert!(matches!(
        c.lfs_put(
            "media",
            oid,
            content.len() as u64,
            &content[..1000],
            Durability::Twin
        )
        .await,
        Err(ClientError::Api(ApiError::BadPush(_)))
    ));
    assert_eq!(
        p.primary.log().head_seq(),
        head,
        "no refused put wrote a frame"
    );
    assert!(!c
        .lfs_get("media", wrong, &mut Vec::new())
        .await
        .expect("get"));
    converge(&p).await;
    assert!(p
        .twin_store
        .lock()
        .expect("store")
        .repo("media")
        .expect("repo")
        .lfs()
        .contains(&oid));

    // Control documents, written and read back; a bad name refused.
    assert_eq!(c.get_doc("policy.toml").await.expect("get"), None);
    c.put_doc("policy.toml", b"retain = 3\n", Durability::Twin)
        .await
        .expect("put doc");
    assert_eq!(
        c.get_doc("policy.toml").await.expect("get"),
        Some(b"retain = 3\n".to_vec())
    );
    assert!(matches!(
        c.put_doc("../escape", b"x", Durability::Twin).await,
        Err(ClientError::Api(ApiError::BadRequest(_)))
    ));

    c.lfs_delete("media", oid, Durability::Twin)
        .await
        .expect("delete");
    assert!(!c.lfs_get("media", oid, &mut Vec::new()).await.expect("get"));
    converge(&p).await;
    assert!(!p
        .twin_store
        .lock()
        .expect("store")
        .repo("media")
        .expect("repo")
        .lfs()
        .contains(&oid));
}

/// A client that asks for a large object and stops reading holds no lock:
/// the store's other requests go on meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_that_stops_reading_a_large_object_holds_up_no_one() {
    let dir = tempfile::tempdir().expect("tempdir");
    let p = start(dir.path()).await;
    let c = &p.client;
    c.create_repo("media", Durability::Twin)
        .await
        .expect("create");
    let content: Vec<u8> = (0..32_000_000u32).map(|i| (i % 251) as u8).collect();
    let oid = twinlog::store::frames::lfs_oid(&content);
    c.lfs_put(
        "media",
        oid,
        content.len() as u64,
        &content[..],
        Durability::Twin,
    )
    .await
    .expect("put");
    // A sink of 1 KiB drained of one byte, then left: the reader stops,
    // and flow control stops the primary's sending mid-object.
    let (stuck, mut kept) = tokio::io::duplex(1024);
    let slow = c.lfs_get("media", oid, stuck);
    tokio::pin!(slow);
    let mut first = [0u8; 1];
    tokio::select! {
        _ = &mut slow => panic!("the stuck read ended"),
        r = tokio::io::AsyncReadExt::read_exact(&mut kept, &mut first) => {
            r.expect("the object streams");
        }
    }
    let others = async {
        c.create_repo("other", Durability::Twin)
            .await
            .expect("create");
        c.put_doc("d", b"x", Durability::Twin)
            .await
            .expect("put doc");
        assert_eq!(c.get_doc("d").await.expect("get doc"), Some(b"x".to_vec()));
    };
    tokio::select! {
        _ = &mut slow => panic!("the stuck read ended"),
        r = tokio::time::timeout(Duration::from_secs(10), others) => {
            r.expect("the store's requests go on while a reader is stuck");
        }
    }
}
