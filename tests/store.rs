//! The store fed by the log: every kind applies, a replay after a crash at
//! every frame lands on the state of an uninterrupted run, a lost index is
//! rebuilt from the archive, an erase leaves the state a replay of the
//! erased log gives, and a snapshot holds exactly the store.

mod common;

use common::{copy_dir, files_containing};

use std::collections::BTreeMap;
use std::path::Path;

use twinlog::log::{Kind, Log};
use twinlog::objects::ObjType;
use twinlog::pushlog::RefUpdate;
use twinlog::store::frames::{self, lfs_meta, lfs_oid, FrameParts, PackBuilder, RepoOp};
use twinlog::store::{snapshot, Store, StoreError, StoreOptions};

fn append(log: &Log, f: &FrameParts) -> u64 {
    log.append_raw(f.kind.as_u16(), &f.meta, &f.blob)
        .expect("append")
}

fn pack(repo: &str, objs: &[(ObjType, &[u8])]) -> (FrameParts, Vec<[u8; 20]>) {
    let mut b = PackBuilder::new();
    let oids = objs
        .iter()
        .map(|(t, d)| b.add(*t, d).expect("add"))
        .collect();
    (b.frame(repo).expect("frame"), oids)
}

fn push(repo: &str, name: &str, old: Option<[u8; 20]>, new: Option<[u8; 20]>) -> FrameParts {
    frames::refs_frame(
        repo,
        1_700_000_000_000,
        &[RefUpdate {
            name: name.into(),
            old,
            new,
        }],
    )
    .expect("refs")
}

fn lfs_put(log: &Log, repo: &str, content: &[u8]) -> [u8; 32] {
    let oid = lfs_oid(content);
    log.append_raw(
        Kind::LfsPut.as_u16(),
        &lfs_meta(repo, &oid).expect("meta"),
        content,
    )
    .expect("append");
    oid
}

/// A mixed workload: every kind, duplicate objects across packs, a purge
/// and a re-create, a large object put and deleted, an erase in the middle
/// and frames after it. Returns the erase's `before`.
fn workload(log: &Log) -> u64 {
    append(
        log,
        &frames::repo_frame("acme/a", RepoOp::Create).expect("f"),
    );
    let (p1, o1) = pack(
        "acme/a",
        &[
            (ObjType::Blob, b"MARKER-early blob"),
            (ObjType::Tree, b""),
            (ObjType::Commit, b"tree 4b825dc\n\nfirst"),
            // Its data starts where the pack ends.
            (ObjType::Blob, b""),
        ],
    );
    append(log, &p1);
    append(log, &push("acme/a", "refs/heads/main", None, Some(o1[2])));
    lfs_put(log, "acme/a", &vec![7u8; 300_000]);
    append(log, &frames::repo_frame("b", RepoOp::Create).expect("f"));
    let (pb, _) = pack("b", &[(ObjType::Blob, b"MARKER-early blob")]);
    append(log, &pb);
    append(
        log,
        &frames::doc_frame("policy.toml", b"retain = 3").expect("f"),
    );
    let before = log.head_seq() + 1;
    let (p2, o2) = pack(
        "acme/a",
        &[
            (ObjType::Blob, b"late blob"),
            (ObjType::Tree, b""), // again: indexed where p1 put it
        ],
    );
    append(log, &p2);
    // A pack of objects all indexed already: no rows of its own.
    let (known, _) = pack(
        "acme/a",
        &[(ObjType::Blob, b"late blob"), (ObjType::Tree, b"")],
    );
    append(log, &known);
    append(
        log,
        &push("acme/a", "refs/heads/main", Some(o1[2]), Some(o2[0])),
    );
    let gone = lfs_put(log, "acme/a", b"short-lived");
    log.append_raw(
        Kind::LfsDelete.as_u16(),
        &lfs_meta("acme/a", &gone).expect("meta"),
        &[],
    )
    .expect("append");
    append(log, &frames::repo_frame("b", RepoOp::Purge).expect("f"));
    append(log, &frames::repo_frame("b", RepoOp::Create).expect("f"));
    let (pb2, ob2) = pack("b", &[(ObjType::Blob, b"b again")]);
    append(log, &pb2);
    let (pb3, _) = pack("b", &[(ObjType::Blob, b"b again")]);
    append(log, &pb3);
    append(log, &push("b", "refs/heads/main", None, Some(ob2[0])));
    log.append_raw(0x8123, b"app", b"not the store's")
        .expect("app");
    append(
        log,
        &frames::erase_frame(before, &["acme/a".to_owned()]).expect("f"),
    );
    let (p3, o3) = pack("acme/a", &[(ObjType::Blob, b"after the erase")]);
    append(log, &p3);
    append(log, &push("acme/a", "refs/tags/t", None, Some(o3[0])));
    append(
        log,
        &frames::doc_frame("policy.toml", b"retain = 4").expect("f"),
    );
    before
}

/// Everything a reader can see of a store, comparable.
#[derive(Debug, PartialEq, Eq)]
struct View {
    applied: u64,
    repos: BTreeMap<String, RepoView>,
    doc: Option<Vec<u8>>,
}

#[derive(Debug, PartialEq, Eq)]
struct RepoView {
    refs: BTreeMap<String, [u8; 20]>,
    history: Vec<(u64, Vec<RefUpdate>)>,
    objects: Vec<(Vec<u8>, ObjType, Vec<u8>)>,
    lfs: Vec<([u8; 32], Vec<u8>)>,
}

fn view(store: &Store) -> View {
    let mut repos = BTreeMap::new();
    for name in store.repos() {
        let repo = store.repo(name).expect("repo");
        let objects = repo
            .object_ids()
            .expect("oids")
            .into_iter()
            .map(|oid| {
                let (t, d) = repo.read_object(&oid).expect("read").expect("present");
                (oid, t, d)
            })
            .collect();
        let lfs = repo
            .lfs()
            .list()
            .expect("list")
            .into_iter()
            .map(|oid| {
                let content = std::fs::read(repo.lfs().path_of(&oid)).expect("read");
                (oid, content)
            })
            .collect();
        repos.insert(
            name.to_owned(),
            RepoView {
                refs: repo.refs(),
                history: repo
                    .history()
                    .expect("history")
                    .into_iter()
                    .map(|p| (p.seq, p.updates))
                    .collect(),
                objects,
                lfs,
            },
        );
    }
    View {
        applied: store.applied(),
        repos,
        doc: store.doc("policy.toml").expect("doc"),
    }
}

fn fresh_store(dir: &Path, log: &Log) -> Store {
    // Push logs compacted every second push, so replays, erases and
    // snapshots meet compacted push logs too.
    let opts = StoreOptions {
        compact_after_pushes: 2,
        ..StoreOptions::default()
    };
    Store::open(dir, log.history(), opts).expect("store")
}

#[test]
fn every_kind_applies() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = Log::open(dir.path().join("log")).expect("log");
    workload(&log);
    let mut store = fresh_store(&dir.path().join("store"), &log);
    let done = store.catch_up(&log).expect("catch up");
    assert_eq!(done.frames, log.head_seq());
    let v = view(&store);
    let a = &v.repos["acme/a"];
    assert_eq!(a.refs.len(), 2);
    let blobs: Vec<&[u8]> = a.objects.iter().map(|(_, _, d)| d.as_slice()).collect();
    assert!(blobs.contains(&&b"late blob"[..]) && blobs.contains(&&b"after the erase"[..]));
    assert!(
        !blobs.contains(&&b"MARKER-early blob"[..]),
        "the erase dropped the early pack's objects"
    );
    assert_eq!(
        a.objects.len(),
        3,
        "late blob, the empty tree, after the erase"
    );
    assert!(a.lfs.is_empty(), "one large object erased, one deleted");
    assert_eq!(a.history.len(), 2, "the push before the erase went");
    assert!(
        store
            .repo("acme/a")
            .expect("repo")
            .dir()
            .join("pushlog.reflog")
            .exists(),
        "the push log was compacted"
    );
    let b = &v.repos["b"];
    assert_eq!(b.objects.len(), 1, "the purge dropped b's first pack");
    assert_eq!(v.doc.as_deref(), Some(&b"retain = 4"[..]));
    // Queries.
    let oid = a.objects[0].0.clone();
    let have = store.have("acme/a", &[&oid, &[9u8; 20]]).expect("have");
    assert_eq!(have, vec![true, false]);
    assert!(matches!(store.refs("nope"), Err(StoreError::NoRepo(_))));
    // Reopen: the same state, and no pack read back (the one whose objects
    // came earlier included).
    drop(store);
    let store = fresh_store(&dir.path().join("store"), &log);
    assert_eq!(view(&store), v);
    // b never saw an erase: its pack of known objects is not read back.
    let b = store.repo("b").expect("repo");
    assert!(b.packs().iter().any(|p| p.known), "{:?}", b.packs());
    assert_eq!(b.reread_at_open(), 0);
    // acme/a did: its known pack is part of the diff, and only it.
    let a = store.repo("acme/a").expect("repo");
    let known = a.packs().iter().filter(|p| p.known && !p.erased).count() as u64;
    assert!(known > 0 && a.reread_at_open() <= known);
}

#[test]
fn a_replay_after_a_crash_at_every_frame_lands_on_the_same_state() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = Log::open(dir.path().join("log")).expect("log");
    workload(&log);
    let whole = {
        let mut s = fresh_store(&dir.path().join("whole"), &log);
        s.catch_up(&log).expect("catch up");
        view(&s)
    };
    let live = dir.path().join("live");
    let mut store = fresh_store(&live, &log);
    for seq in 1..=log.head_seq() {
        store.apply(&log, seq).expect("apply");
        // A crash after this frame's effects, before the applied seq moved
        // (recorded every third frame): the copy replays from its record.
        if seq % 3 == 0 {
            store.checkpoint().expect("checkpoint");
        }
        let crashed = dir.path().join(format!("crash-{seq}"));
        copy_dir(&live, &crashed);
        let mut s = fresh_store(&crashed, &log);
        assert!(s.applied() <= seq);
        let recorded = s.applied();
        s.catch_up(&log).expect("replay");
        assert_eq!(view(&s), whole, "crash after frame {seq}");
        drop(s);
        // A crash inside a pack's append, before its record was durable:
        // the archive's last record cut at bytes through its header and
        // body.
        let is_pack = log.read(seq).expect("read").kind == Kind::Pack.as_u16();
        if is_pack && recorded < seq {
            let repo = twinlog::log::Meta::decode(&log.read(seq).expect("read").meta)
                .expect("meta")
                .repo;
            let archive = live
                .join("repos")
                .join(twinlog::store::repo_dir_name(&repo))
                .join("archive");
            let whole_archive = std::fs::read(&archive).expect("archive");
            let last_len = 40 + log.read(seq).expect("read").blob.len();
            let start = whole_archive.len() - last_len;
            for cut in [
                start + 1,
                start + 20,
                start + 39,
                start + 40,
                whole_archive.len() - 1,
            ] {
                let torn = dir.path().join(format!("torn-{seq}-{cut}"));
                copy_dir(&live, &torn);
                let torn_archive = torn
                    .join("repos")
                    .join(twinlog::store::repo_dir_name(&repo))
                    .join("archive");
                std::fs::write(&torn_archive, &whole_archive[..cut]).expect("cut");
                let mut s = fresh_store(&torn, &log);
                s.catch_up(&log).expect("replay over a torn pack");
                assert_eq!(view(&s), whole, "pack {seq} torn at byte {cut}");
                drop(s);
                std::fs::remove_dir_all(&torn).expect("rm");
            }
        }
        std::fs::remove_dir_all(&crashed).expect("rm");
    }
}

#[test]
fn a_lost_index_is_rebuilt_from_the_archive() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = Log::open(dir.path().join("log")).expect("log");
    workload(&log);
    let path = dir.path().join("store");
    let v = {
        let mut s = fresh_store(&path, &log);
        s.catch_up(&log).expect("catch up");
        view(&s)
    };
    for e in std::fs::read_dir(path.join("repos")).expect("repos") {
        std::fs::remove_file(e.expect("entry").path().join("objects.redb")).expect("rm");
    }
    let s = fresh_store(&path, &log);
    assert_eq!(view(&s), v);
}

#[test]
fn an_erase_leaves_what_a_replay_of_the_erased_log_gives() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = Log::open(dir.path().join("log")).expect("log");
    let before = workload(&log);
    let erased_in_place = {
        let mut s = fresh_store(&dir.path().join("a"), &log);
        s.catch_up(&log).expect("catch up");
        view(&s)
    };
    log.erase(before, &["acme/a".to_owned()]).expect("erase");
    let mut s = fresh_store(&dir.path().join("b"), &log);
    s.catch_up(&log).expect("replay");
    assert_eq!(view(&s), erased_in_place);
    // No byte of the erased data is anywhere in either store.
    for d in ["a", "b"] {
        assert!(
            files_containing(&dir.path().join(d), b"MARKER").is_empty(),
            "store {d} holds an erased byte"
        );
    }
}

#[test]
fn what_a_crash_left_staged_is_gone_at_the_next_open() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = Log::open(dir.path().join("log")).expect("log");
    workload(&log);
    let path = dir.path().join("store");
    let v = {
        let mut s = fresh_store(&path, &log);
        s.catch_up(&log).expect("catch up");
        view(&s)
    };
    // A put, a document and something else, each staged and never renamed.
    let tmp = path.join(twinlog::store::TMP_DIR);
    std::fs::write(tmp.join("lfs-99"), b"half a large object").expect("write");
    std::fs::write(tmp.join("doc-policy.toml"), b"retain = 9").expect("write");
    std::fs::create_dir_all(tmp.join("stray/deeper")).expect("mkdir");
    let s = fresh_store(&path, &log);
    assert_eq!(view(&s), v);
    assert!(std::fs::read_dir(&tmp).expect("tmp").next().is_none());
}

#[test]
fn a_snapshot_holds_exactly_the_store() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = Log::open(dir.path().join("log")).expect("log");
    workload(&log);
    let mut store = fresh_store(&dir.path().join("store"), &log);
    let snap = dir.path().join("snap");
    let m = store.snapshot(&log, &snap).expect("snapshot");
    assert_eq!(m.at, log.head_seq());
    assert_eq!(snapshot::verify(&snap).expect("verify"), m);
    let v = view(&store);
    drop(store);
    let from_snap = fresh_store(&snap, &log);
    assert_eq!(view(&from_snap), v);
    drop(from_snap);
    // Opening it wrote nothing the manifest does not list... but a damaged
    // file is found by name.
    let victim = m.files.iter().find(|f| f.len > 100).expect("a file");
    let p = snap.join(&victim.path);
    let mut b = std::fs::read(&p).expect("read");
    b[50] ^= 1;
    std::fs::write(&p, &b).expect("write");
    assert!(matches!(
        snapshot::verify(&snap),
        Err(StoreError::BadSnapshot { .. })
    ));
}

#[test]
fn frames_that_do_not_apply_are_refused_by_name() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = Log::open(dir.path().join("log")).expect("log");
    let (p, _) = pack("ghost", &[(ObjType::Blob, b"x")]);
    append(&log, &p);
    let mut s = fresh_store(&dir.path().join("store"), &log);
    let err = s.catch_up(&log).expect_err("refused");
    assert!(
        matches!(&err, StoreError::Apply { seq: 1, source, .. } if matches!(**source, StoreError::NoRepo(_))),
        "{err}"
    );
    assert_eq!(s.applied(), 0);

    let dir = tempfile::tempdir().expect("tempdir");
    let log = Log::open(dir.path().join("log")).expect("log");
    append(&log, &frames::repo_frame("r", RepoOp::Create).expect("f"));
    let (p, _) = pack("r", &[(ObjType::Blob, b"x")]);
    let mut blob = p.blob.clone();
    let last = blob.len() - 1;
    blob[last] ^= 1; // the content no longer hashes to its oid
    log.append_raw(Kind::Pack.as_u16(), &p.meta, &blob)
        .expect("append");
    let mut s = fresh_store(&dir.path().join("store"), &log);
    let err = s.catch_up(&log).expect_err("refused");
    assert!(
        matches!(&err, StoreError::Apply { seq: 2, source, .. } if matches!(**source, StoreError::BadFrame { seq: 2, .. })),
        "{err}"
    );
    assert_eq!(s.applied(), 1);
    assert_eq!(s.repo("r").expect("repo").objects(), 0);

    let other = Log::open(dir.path().join("other")).expect("log");
    drop(s);
    assert!(matches!(
        Store::open(
            dir.path().join("store"),
            other.history(),
            StoreOptions::default()
        ),
        Err(StoreError::OtherHistory { .. })
    ));
}

/// What every erased datum carries, so a raw byte search finds any copy.
const SECRET: &[u8] = b"SECRET-7f3a";

/// The repository an erase empties in [`secret_workload`].
const ERASED: &str = "s";

/// Secret blobs in the erased repository's first pack.
const ERASED_BLOBS: usize = 2000;

/// Every file under `dir` holding one of `needles` (all of one length),
/// with the needle found: one read of each file.
fn files_holding(dir: &Path, needles: &[&[u8]]) -> Vec<(String, Vec<u8>)> {
    let Some(len) = needles.first().map(|n| n.len()) else {
        return Vec::new();
    };
    let set: std::collections::HashSet<&[u8]> = needles.iter().copied().collect();
    let mut out = Vec::new();
    for (path, bytes) in common::files_of(dir) {
        if let Some(w) = bytes.windows(len).find(|w| set.contains(w)) {
            out.push((path, w.to_vec()));
        }
    }
    out
}

/// What an erase must leave no trace of: the ids of the objects and large
/// objects only frames before `before` brought.
struct Secrets {
    before: u64,
    erase_seq: u64,
    oids: Vec<[u8; 20]>,
    lfs: Vec<[u8; 32]>,
    /// Brought before `before` and again after it: it stays.
    brought_again: [u8; 20],
}

/// Before `before`, into [`ERASED`]: objects holding [`SECRET`], an empty
/// tree and an empty blob each closing its pack (a zero-length object's
/// data starts where its pack ends), a commit `main` points at, a ref
/// named with the secret, enough pushes for a compaction (checkpoint and
/// reflog archive), a zero-length and a secret large object. After it: an
/// object brought again, a push moving `main` off the erased commit, a
/// delete of the erased large object, the erase, and frames after it.
/// Another repository keeps its own data throughout.
fn secret_workload(log: &Log) -> Secrets {
    let secret = |s: &str| [SECRET, s.as_bytes()].concat();
    append(log, &frames::repo_frame(ERASED, RepoOp::Create).expect("f"));
    append(
        log,
        &frames::repo_frame("other", RepoOp::Create).expect("f"),
    );
    let blob = secret(" blob");
    let commit = secret(" commit");
    // Enough rows that their removal frees whole pages of the index.
    let many: Vec<Vec<u8>> = (0..ERASED_BLOBS)
        .map(|i| secret(&format!(" {i}")))
        .collect();
    let mut objs = vec![(ObjType::Blob, &blob[..]), (ObjType::Commit, &commit[..])];
    objs.extend(many.iter().map(|b| (ObjType::Blob, &b[..])));
    objs.push((ObjType::Tree, &b""[..]));
    let (p1, o1) = pack(ERASED, &objs);
    append(log, &p1);
    let (p2, o2) = pack(ERASED, &[(ObjType::Blob, b"")]);
    append(log, &p2);
    let (p3, o3) = pack(ERASED, &[(ObjType::Blob, b"brought again")]);
    append(log, &p3);
    append(log, &push(ERASED, "refs/heads/main", None, Some(o1[1])));
    let secret_ref = format!("refs/heads/{}", String::from_utf8_lossy(SECRET));
    append(log, &push(ERASED, &secret_ref, None, Some(o1[0])));
    append(log, &push(ERASED, "refs/tags/empty", None, Some(o2[0])));
    let empty_large = lfs_put(log, ERASED, b"");
    let secret_large = lfs_put(log, ERASED, &secret(" large object"));
    let (po, oo) = pack("other", &[(ObjType::Blob, b"other's own")]);
    append(log, &po);
    append(log, &push("other", "refs/heads/main", None, Some(oo[0])));
    let before = log.head_seq() + 1;
    let (p4, o4) = pack(
        ERASED,
        &[(ObjType::Blob, b"brought again"), (ObjType::Blob, b"kept")],
    );
    append(log, &p4);
    append(
        log,
        &push(ERASED, "refs/heads/main", Some(o1[1]), Some(o4[1])),
    );
    log.append_raw(
        Kind::LfsDelete.as_u16(),
        &lfs_meta(ERASED, &secret_large).expect("meta"),
        &[],
    )
    .expect("append");
    lfs_put(log, ERASED, b"a kept large object");
    let erase_seq = append(
        log,
        &frames::erase_frame(before, &[ERASED.to_owned()]).expect("f"),
    );
    let (p5, o5) = pack(ERASED, &[(ObjType::Blob, b"after the erase")]);
    append(log, &p5);
    append(log, &push(ERASED, "refs/tags/after", None, Some(o5[0])));
    Secrets {
        before,
        erase_seq,
        oids: o1.iter().chain(&o2).copied().collect(),
        lfs: vec![empty_large, secret_large],
        brought_again: o3[0],
    }
}

/// No file of the store holds the secret, an erased object's id or an
/// erased large object's id; what the erase must take is gone from the
/// repository, and what a later frame brought again is there.
fn assert_no_trace(store: &Store, s: &Secrets) {
    let dir = store.dir();
    let found = files_containing(dir, SECRET);
    assert!(found.is_empty(), "the secret is in {found:?}");
    let oids: Vec<&[u8]> = s.oids.iter().map(|o| &o[..]).collect();
    let found = files_holding(dir, &oids);
    assert!(found.is_empty(), "erased object ids in {found:02x?}");
    let lfs: Vec<&[u8]> = s.lfs.iter().map(|o| &o[..]).collect();
    let found = files_holding(dir, &lfs);
    assert!(found.is_empty(), "erased large object ids in {found:02x?}");
    let repo = store.repo(ERASED).expect("repo");
    for oid in &s.oids {
        assert_eq!(repo.read_object(oid).expect("read"), None);
    }
    assert!(repo.have(&oids).expect("have").iter().all(|h| !h));
    for oid in &s.lfs {
        assert!(!repo.lfs().contains(oid));
    }
    assert!(repo.read_object(&s.brought_again).expect("read").is_some());
}

#[test]
fn an_erase_leaves_no_erased_byte_nor_id_in_any_file_of_the_store() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = Log::open(dir.path().join("log")).expect("log");
    let s = secret_workload(&log);
    let mut in_place = fresh_store(&dir.path().join("a"), &log);
    in_place.catch_up(&log).expect("catch up");
    // The log is erased now: a store fed from it never sees the data.
    let mut replayed = fresh_store(&dir.path().join("b"), &log);
    replayed.catch_up(&log).expect("replay");
    let v = view(&in_place);
    assert_eq!(v, view(&replayed));
    let a = &v.repos[ERASED];
    assert_eq!(a.refs.len(), 2, "main and the tag after the erase: {a:?}");
    assert_eq!(a.lfs.len(), 1, "{a:?}");
    assert!(v.repos["other"].objects.len() == 1);
    for store in [&in_place, &replayed] {
        assert_no_trace(store, &s);
    }
    // And so after a reopen.
    drop(in_place);
    let in_place = fresh_store(&dir.path().join("a"), &log);
    assert_eq!(view(&in_place), v);
    assert_no_trace(&in_place, &s);
}

#[test]
fn an_erase_stopped_after_any_of_its_durable_steps_is_finished_by_the_replay_with_no_trace() {
    use twinlog::store::repo::{EraseStep, Repo};
    let dir = tempfile::tempdir().expect("tempdir");
    let log = Log::open(dir.path().join("log")).expect("log");
    let s = secret_workload(&log);
    // The store up to the frame before the erase, recorded.
    let live = dir.path().join("live");
    {
        let mut store = fresh_store(&live, &log);
        for seq in 1..s.erase_seq {
            store.apply(&log, seq).expect("apply");
        }
        store.checkpoint().expect("checkpoint");
    }
    // An uninterrupted run; it erases the log first, as every apply of
    // the Erase frame does.
    let whole = {
        let mut store = fresh_store(&dir.path().join("whole"), &log);
        store.catch_up(&log).expect("catch up");
        assert_no_trace(&store, &s);
        view(&store)
    };
    // The store's part of the erase, the store copied after each durable
    // step as a crash there leaves it: the applied seq has not moved.
    let mut crashes = Vec::new();
    {
        let repo_dir = live
            .join("repos")
            .join(twinlog::store::repo_dir_name(ERASED));
        let tmp = live.join(twinlog::store::TMP_DIR);
        let mut repo = Repo::open(&repo_dir, &tmp, 1 << 20).expect("repo");
        repo.erase_before_with(s.before, &mut |step| {
            let to = dir.path().join(format!("crash-{step:?}"));
            copy_dir(&live, &to);
            crashes.push((step, to));
        })
        .expect("erase");
    }
    let steps: Vec<EraseStep> = crashes.iter().map(|(step, _)| *step).collect();
    assert_eq!(
        steps,
        [
            EraseStep::Archive,
            EraseStep::IndexStaged,
            EraseStep::IndexSwapped,
            EraseStep::Reindexed,
            EraseStep::Pushes,
            EraseStep::LfsFiles,
            EraseStep::LfsJournal,
        ]
    );
    for (step, path) in crashes {
        let mut store = fresh_store(&path, &log);
        assert_eq!(store.applied(), s.erase_seq - 1, "after {step:?}");
        store.catch_up(&log).expect("replay");
        assert_eq!(view(&store), whole, "after {step:?}");
        assert_no_trace(&store, &s);
        drop(store);
        std::fs::remove_dir_all(&path).expect("rm");
    }
}

/// The applied mark is synced when a frame of the store's applies, not
/// after a catch-up over plain frames: a store that stops without closing
/// (a crash) reopens from the older mark, rescans the plain frames and
/// lands where it was; `applied_durably` (what retention drops below)
/// records the mark first, so a log cut below it never strands a store.
#[test]
fn plain_frames_leave_the_mark_behind_until_it_is_needed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = Log::open(dir.path().join("log")).expect("log");
    let store_dir = dir.path().join("store");
    let create = frames::repo_frame("r", RepoOp::Create).expect("frame");
    let mut store = fresh_store(&store_dir, &log);
    let created = append(&log, &create);
    store.catch_up(&log).expect("catch up");
    assert_eq!(
        Store::applied_mark(&store_dir, log.history()).expect("mark"),
        created,
        "a store frame's apply is durable at once"
    );
    for i in 0..50u8 {
        log.append_raw(0x8000, b"", &[i; 10]).expect("append");
    }
    store.catch_up(&log).expect("catch up");
    assert_eq!(store.applied(), created + 50);
    assert_eq!(
        Store::applied_mark(&store_dir, log.history()).expect("mark"),
        created,
        "plain frames cost no sync of the mark"
    );
    // A crash: the store's files as they are, without its close.
    let crashed = dir.path().join("crashed");
    copy_dir(&store_dir, &crashed);
    {
        let mut s = fresh_store(&crashed, &log);
        assert_eq!(s.applied(), created, "reopened from the older mark");
        s.catch_up(&log).expect("the rescan");
        assert_eq!(s.applied(), created + 50);
        assert_eq!(view(&s), view(&store), "the same state, nothing twice");
    }
    // Retention asks for the durable mark: recorded before it answers.
    assert_eq!(store.applied_durably().expect("durably"), created + 50);
    assert_eq!(
        Store::applied_mark(&store_dir, log.history()).expect("mark"),
        created + 50
    );
    // A clean close records it too.
    log.append_raw(0x8000, b"", b"one more").expect("append");
    store.catch_up(&log).expect("catch up");
    drop(store);
    assert_eq!(
        Store::applied_mark(&store_dir, log.history()).expect("mark"),
        created + 51
    );
}
