//! What reaches the log applies on every box: a request the store refuses
//! leaves nothing in the log, a request it takes applies on the primary and
//! on a twin fed the same frames; a frame that still does not apply stops
//! the store there, visibly, without stopping the box, until it is retried
//! after a fix or skipped on both boxes by a StoreSkip frame.

use std::path::Path;
use std::sync::Arc;

use proptest::prelude::*;
use twinlog::log::{Kind, Log};
use twinlog::node::store_host::StoreHost;
use twinlog::objects::ObjType;
use twinlog::pushlog::RefUpdate;
use twinlog::store::frames::{self, lfs_oid, PackBuilder};
use twinlog::store::{skips, StoreError, StoreOptions};

fn host(dir: &Path, log: &Arc<Log>) -> Arc<StoreHost> {
    StoreHost::open(log.clone(), dir, StoreOptions::default()).expect("store")
}

/// A twin's log: the primary's history, follower mode.
fn twin_log(dir: &Path, primary: &Log) -> Arc<Log> {
    let log = Log::open(dir).expect("twin log");
    log.adopt_history(primary.history()).expect("adopt");
    log.set_follower(true);
    Arc::new(log)
}

/// Ship every frame the twin lacks, as replication does: at the primary's
/// numbers, erased frames as erased frames, one sync.
fn ship(primary: &Log, twin: &Log) {
    for seq in twin.head_seq() + 1..=primary.head_seq() {
        let loc = primary.locate_blob(seq).expect("locate");
        if loc.is_erased() {
            twin.stage_erased_at(seq, &loc.meta, loc.blob_len, loc.payload_crc)
                .expect("stage erased");
        } else {
            let e = primary.read(seq).expect("read");
            twin.append_at(seq, e.kind, &e.meta, &e.blob)
                .expect("append_at");
        }
    }
    twin.sync().expect("sync");
}

fn one_piece(b: &[u8]) -> impl Iterator<Item = bytes::Bytes> {
    std::iter::once(bytes::Bytes::copy_from_slice(b))
}

/// Every file under `dir`, relative, with its bytes.
fn files(dir: &Path) -> Vec<(String, Vec<u8>)> {
    fn walk(root: &Path, dir: &Path, out: &mut Vec<(String, Vec<u8>)>) {
        for e in std::fs::read_dir(dir).expect("read_dir") {
            let e = e.expect("entry");
            let p = e.path();
            if e.file_type().expect("type").is_dir() {
                walk(root, &p, out);
            } else {
                let rel = p.strip_prefix(root).expect("under").display().to_string();
                out.push((rel, std::fs::read(&p).expect("read")));
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, dir, &mut out);
    out.sort();
    out
}

#[test]
fn a_name_whose_directory_name_is_too_long_is_refused_with_nothing_appended() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = Arc::new(Log::open(dir.path().join("log")).expect("log"));
    let h = host(&dir.path().join("store"), &log);
    // 29 characters, 87 bytes: 261 bytes as a directory name.
    let name = "日本語のリポジトリ名はとても長くなることがあるのでここで確かめる";
    let name: String = name.chars().take(29).collect();
    assert!(name.len() <= 255);
    let err = h.create_repo(&name).expect_err("refused");
    assert!(matches!(err, StoreError::BadName { .. }), "{err}");
    assert_eq!(log.head_seq(), 0, "nothing appended");
    assert!(h.health().stalled.is_none());
    // The longest name that fits is taken and applies.
    let fits = "é".repeat(42); // 84 bytes, 252 encoded
    h.create_repo(&fits).expect("create");
    assert!(h.lock().expect("lock").repo(&fits).is_ok());
}

/// One request a client could make of the store.
#[derive(Clone, Debug)]
enum Req {
    Create(String),
    Push {
        repo: String,
        blob: Vec<u8>,
        ref_name: String,
    },
    Lfs {
        repo: String,
        content: Vec<u8>,
    },
    Doc {
        name: String,
        content: Vec<u8>,
    },
    Erase {
        back: u64,
        repos: Vec<String>,
    },
}

fn any_name() -> impl Strategy<Value = String> {
    prop_oneof![
        // Any Unicode, any length up to well past every limit.
        prop::collection::vec(any::<char>(), 0..120).prop_map(String::from_iter),
        // Names that look like the store's own files, or are near limits.
        prop::sample::select(vec![
            "build.tmp".to_string(),
            "tmp-1".into(),
            "a.staged".into(),
            "x/y.tmp".into(),
            ".hidden".into(),
            "a/./b".into(),
            "..".into(),
            "a\0b".into(),
            "é".repeat(42),
            "é".repeat(43),
            "a".repeat(255),
            "a".repeat(256),
            "acme/widgets".into(),
        ]),
    ]
}

fn any_req(known: Vec<String>) -> impl Strategy<Value = Req> {
    let repo = prop_oneof![any_name(), prop::sample::select(known)];
    let repo2 = repo.clone();
    let repo3 = repo.clone();
    prop_oneof![
        any_name().prop_map(Req::Create),
        (
            repo,
            prop::collection::vec(any::<u8>(), 0..64),
            prop_oneof![
                Just("refs/heads/main".to_string()),
                prop::collection::vec(any::<char>(), 0..40).prop_map(String::from_iter)
            ]
        )
            .prop_map(|(repo, blob, ref_name)| Req::Push {
                repo,
                blob,
                ref_name
            }),
        (repo2, prop::collection::vec(any::<u8>(), 0..64))
            .prop_map(|(repo, content)| Req::Lfs { repo, content }),
        (any_name(), prop::collection::vec(any::<u8>(), 0..64))
            .prop_map(|(name, content)| Req::Doc { name, content }),
        (0u64..6, prop::collection::vec(repo3, 0..3))
            .prop_map(|(back, repos)| Req::Erase { back, repos }),
    ]
}

fn run(h: &StoreHost, log: &Log, req: &Req, n: usize) -> Result<u64, StoreError> {
    match req {
        Req::Create(name) => h.create_repo(name),
        Req::Push {
            repo,
            blob,
            ref_name,
        } => {
            let mut b = PackBuilder::new();
            let oid = b.add(ObjType::Blob, blob)?;
            let pack = b.frame(repo)?.blob;
            let old = h
                .lock()?
                .refs(repo)
                .ok()
                .and_then(|r| r.get(ref_name).copied());
            let update = RefUpdate {
                name: ref_name.clone(),
                old,
                new: Some(oid),
            };
            let done = h.push(
                repo,
                pack.len() as u64,
                &[update],
                1_700_000_000_000 + n as u64,
                &mut one_piece(&pack),
            )?;
            Ok(done.refs_seq.unwrap_or(0))
        }
        Req::Lfs { repo, content } => h.lfs_put(
            repo,
            lfs_oid(content),
            content.len() as u64,
            &mut one_piece(content),
        ),
        Req::Doc { name, content } => h.put_doc(name, content),
        Req::Erase { back, repos } => {
            let before = (log.head_seq() + 1).saturating_sub(*back).max(1);
            h.erase(before, repos)
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn every_request_is_refused_with_nothing_appended_or_applies_on_both_boxes(
        reqs in prop::collection::vec(any_req(vec!["acme/widgets".into(), "build.tmp".into()]), 1..30)
    ) {
        let dir = tempfile::tempdir().expect("tempdir");
        let plog = Arc::new(Log::open(dir.path().join("p/log")).expect("log"));
        let ph = host(&dir.path().join("p/store"), &plog);
        let tlog = twin_log(&dir.path().join("t/log"), &plog);
        let th = host(&dir.path().join("t/store"), &tlog);
        ph.create_repo("acme/widgets").expect("create");
        for (n, req) in reqs.iter().enumerate() {
            let before = plog.head_seq();
            match run(&ph, &plog, req, n) {
                Ok(_) => prop_assert!(plog.head_seq() > before),
                Err(e) => {
                    prop_assert!(!matches!(e, StoreError::NotApplied { .. }), "{req:?}: {e}");
                    prop_assert_eq!(plog.head_seq(), before, "{:?} was refused ({}) but appended", req, e);
                }
            }
            prop_assert!(ph.health().stalled.is_none(), "{:?}", ph.health());
            ship(&plog, &tlog);
            th.catch_up().map_err(|e| TestCaseError::fail(format!("{req:?}: the twin: {e}")))?;
            prop_assert!(th.health().stalled.is_none(), "{:?}", th.health());
        }
        prop_assert_eq!(th.health().applied, plog.head_seq());
        // Every file of the two stores, byte for byte.
        let (p, t) = (files(&dir.path().join("p/store")), files(&dir.path().join("t/store")));
        prop_assert_eq!(p.iter().map(|f| &f.0).collect::<Vec<_>>(), t.iter().map(|f| &f.0).collect::<Vec<_>>());
        for (a, b) in p.iter().zip(&t) {
            // B-tree pages and the applied marker's two slots are laid out
            // by each box's own history of writes: compared through the API.
            if a.0.ends_with(".redb") || a.0 == "APPLIED" {
                continue;
            }
            prop_assert!(a.1 == b.1, "{} differs", a.0);
        }
        let (ps, ts) = (ph.lock().expect("lock"), th.lock().expect("lock"));
        prop_assert_eq!(ps.repos().collect::<Vec<_>>(), ts.repos().collect::<Vec<_>>());
        for name in ps.repos() {
            let (a, b) = (ps.repo(name).expect("repo"), ts.repo(name).expect("repo"));
            prop_assert_eq!(a.object_ids().expect("oids"), b.object_ids().expect("oids"));
            prop_assert_eq!(a.refs(), b.refs());
        }
    }
}

#[test]
fn a_frame_that_does_not_apply_stops_the_store_there_and_retry_after_the_fix_goes_on() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = Arc::new(Log::open(dir.path().join("log")).expect("log"));
    let store_dir = dir.path().join("store");
    let h = host(&store_dir, &log);
    // Something in the way of the repository's directory: the create is
    // durable in the log and cannot apply until it goes.
    std::fs::write(store_dir.join("repos/blocked"), b"in the way").expect("write");
    let err = h.create_repo("blocked").expect_err("not applied");
    let StoreError::NotApplied { seq, .. } = err else {
        panic!("{err}");
    };
    assert_eq!(seq, 1);
    let health = h.health();
    let stall = health.stalled.expect("stalled");
    assert_eq!((stall.seq, stall.kind), (1, Kind::RepoStore.as_u16()));
    // Further writes are refused by name, with nothing appended.
    let err = h.create_repo("other").expect_err("refused");
    assert!(matches!(err, StoreError::Stalled { seq: 1, .. }), "{err}");
    assert_eq!(log.head_seq(), 1);
    // Skipping needs the store stopped at that very frame.
    assert!(matches!(
        h.skip(2, "wrong frame"),
        Err(StoreError::NotStalledAt {
            seq: 2,
            stalled: Some(1)
        })
    ));
    // The fix, then a retry: the frame applies, the store goes on.
    std::fs::remove_file(store_dir.join("repos/blocked")).expect("rm");
    h.retry().expect("retry");
    assert!(h.health().stalled.is_none());
    assert!(h.lock().expect("lock").repo("blocked").is_ok());
    h.create_repo("other").expect("create");
    assert_eq!(h.health().applied, 2);
}

#[test]
fn a_box_whose_store_cannot_apply_still_opens_and_a_skip_reaches_the_same_decision_on_both() {
    let dir = tempfile::tempdir().expect("tempdir");
    let plog = Arc::new(Log::open(dir.path().join("p/log")).expect("log"));
    let tlog = twin_log(&dir.path().join("t/log"), &plog);
    // A RepoStore frame whose blob is no RepoOp: written past the checks,
    // as an older version's frame or a damaged one would be.
    let meta = twinlog::log::Meta::repo("acme/bad").encode().expect("meta");
    plog.append_raw(Kind::RepoStore.as_u16(), &meta, b"\xff\xff\xff")
        .expect("append");
    plog.append_raw(0x8001, b"", b"application frame after it")
        .expect("append");
    ship(&plog, &tlog);
    // Both boxes open: the store stops at frame 1 and says so.
    let ph = host(&dir.path().join("p/store"), &plog);
    let th = host(&dir.path().join("t/store"), &tlog);
    for h in [&ph, &th] {
        let stall = h.health().stalled.expect("stalled");
        assert_eq!(stall.seq, 1);
        assert!(stall.error.contains("does not decode"), "{}", stall.error);
    }
    // The log is still served.
    assert_eq!(
        plog.read(2).expect("read").blob,
        b"application frame after it"
    );
    // The skip travels as a frame; each box records it and goes on.
    let at = ph.skip(1, "a damaged create").expect("skip");
    assert_eq!(at, 3);
    assert!(ph.health().stalled.is_none());
    assert_eq!(ph.health().applied, 3);
    ship(&plog, &tlog);
    th.retry().expect("retry");
    assert!(th.health().stalled.is_none());
    assert_eq!(th.health().applied, 3);
    for d in ["p/store", "t/store"] {
        let recs = skips::read_skips(&dir.path().join(d)).expect("skips");
        assert_eq!(recs.len(), 1, "{d}");
        assert_eq!((recs[0].seq, recs[0].by), (1, 3), "{d}");
        assert!(recs[0].error.contains("does not decode"), "{d}");
    }
    assert_eq!(ph.health().skipped, 1);
    // The store writes again, and a reopen keeps the skip.
    ph.create_repo("acme/good").expect("create");
    drop(ph);
    let ph = host(&dir.path().join("p/store"), &plog);
    assert!(ph.health().stalled.is_none());
    assert_eq!(ph.health().skipped, 1);
}

#[test]
fn frames_refused_before_the_append_include_oversized_ref_updates() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = Arc::new(Log::open(dir.path().join("log")).expect("log"));
    let h = host(&dir.path().join("store"), &log);
    h.create_repo("r").expect("create");
    let huge = RefUpdate {
        name: "x".repeat((frames::MAX_SMALL_BLOB + 1) as usize),
        old: None,
        new: Some([1; 20]),
    };
    let err = h
        .push("r", 0, &[huge], 0, &mut std::iter::empty())
        .expect_err("refused");
    assert!(matches!(err, StoreError::TooLarge { .. }), "{err}");
    assert_eq!(log.head_seq(), 1);
    let err = h.erase(5, &["r".into()]).expect_err("refused");
    assert!(matches!(err, StoreError::BadFrame { .. }), "{err}");
    assert_eq!(log.head_seq(), 1);
}

#[test]
fn a_store_that_does_not_open_names_the_damage_and_the_box_still_serves_its_log() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = Arc::new(Log::open(dir.path().join("log")).expect("log"));
    let store_dir = dir.path().join("store");
    let h = host(&store_dir, &log);
    h.create_repo("r").expect("create");
    let mut last = None;
    for i in 0..3u8 {
        let mut b = PackBuilder::new();
        let oid = b.add(ObjType::Blob, &[i; 10]).expect("add");
        let pack = b.frame("r").expect("frame").blob;
        let update = RefUpdate {
            name: "refs/heads/main".into(),
            old: last,
            new: Some(oid),
        };
        h.push("r", pack.len() as u64, &[update], 0, &mut one_piece(&pack))
            .expect("push");
        last = Some(oid);
    }
    drop(h);
    // One bit flipped in the push log's first frame: a later frame follows,
    // so it is damage, not a torn tail.
    let repo_dir = store_dir.join("repos/r");
    let pushlog = std::fs::read_dir(&repo_dir)
        .expect("list")
        .map(|e| e.expect("entry").path())
        .find(|p| p.file_name().is_some_and(|n| n == "pushlog"))
        .expect("a push log");
    let good = std::fs::read(&pushlog).expect("read");
    let mut bad = good.clone();
    bad[60] ^= 0x10;
    std::fs::write(&pushlog, &bad).expect("write");

    let h = host(&store_dir, &log);
    let stall = h.health().stalled.expect("stopped");
    assert!(stall.error.contains("does not open"), "{}", stall.error);
    assert!(
        stall.error.contains("pushlog"),
        "names the file: {}",
        stall.error
    );
    assert!(matches!(h.lock(), Err(StoreError::Closed(_))));
    assert!(matches!(h.create_repo("other"), Err(StoreError::Closed(_))));
    assert_eq!(log.head_seq(), 7, "nothing appended");
    assert_eq!(log.read(1).expect("the log serves").seq, 1);
    // The file mended, a retry opens the store with the right refs.
    std::fs::write(&pushlog, &good).expect("write");
    h.retry().expect("retry");
    assert!(h.health().stalled.is_none());
    assert_eq!(
        h.lock().expect("lock").refs("r").expect("refs")["refs/heads/main"],
        last.expect("pushed")
    );
}
