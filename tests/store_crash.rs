//! The store's files under a simulated power cut: each operation that
//! changes one (a push-log append, compaction and erase, an object-index
//! append and erase, a publish by rename, a store apply of each kind, a
//! snapshot install) and each of the box's own durable files (a rejoin's
//! saved tail and cut, EPOCHS, PREDECESSOR, a promoted box's
//! configurations) is crashed at every sync it makes, and failed at every
//! write and every fsync, one at a time. After each, the reopened file
//! holds exactly the state before the operation or the state after it,
//! never a third; and once the operation has returned, a power cut keeps
//! the state after it.
//!
//! The negative controls turn off an fsync (`publish::sabotage`: a
//! publish's temporary file, a saved tail's frames file) and expect the
//! checker to report what a power cut then leaves under the new name.

#[path = "support/crash_everywhere.rs"]
mod crash_everywhere;

use crash_everywhere::{assert_clean, crash_everywhere, crash_everywhere_with, Coverage};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use twinlog::objects::{IndexEntry, ObjType, ObjectReadStack, RebuildTriggers};
use twinlog::publish::{publish_with, sabotage};
use twinlog::pushlog::{Finish, Push, PushLog, RefUpdate};
use twinlog::storage::{CrashMode, SimStorage, Storage};

fn disk(fs: &SimStorage) -> Arc<dyn Storage> {
    Arc::new(fs.clone())
}

// ---------------------------------------------------------------- push log

fn refs_path() -> PathBuf {
    PathBuf::from("/store/repos/r/refs.pushlog")
}

fn push(seq: u64) -> Push {
    Push {
        seq,
        at_ms: 1_700_000_000_000 + seq,
        updates: vec![
            RefUpdate {
                name: format!("refs/heads/topic-{}", seq % 3),
                old: None,
                new: Some([seq as u8; 20]),
            },
            RefUpdate {
                name: "refs/heads/main".into(),
                old: None,
                new: Some([seq as u8 ^ 0x55; 20]),
            },
        ],
    }
}

/// What a reopened push log holds, short enough to read in a report:
/// each ref with its oid's first byte, the seq of every push ever
/// appended (the archive's, then the live file's), and how many pushes
/// are still in the live file. Every push a test appends is told apart by
/// its seq and its oids' first bytes.
type PushLogState = (Vec<(String, u8)>, Vec<u64>, usize);

fn observe_pushlog(fs: &SimStorage) -> Result<PushLogState, String> {
    let log = PushLog::open_with(disk(fs), refs_path()).map_err(|e| e.to_string())?;
    let history = log.history().map_err(|e| e.to_string())?;
    let refs = log.refs().into_iter().map(|(n, o)| (n, o[0])).collect();
    Ok((
        refs,
        history.iter().map(|p| p.seq).collect(),
        log.pushes().len(),
    ))
}

fn pushes_then(fs: &SimStorage, seqs: std::ops::RangeInclusive<u64>, compact_after: Option<u64>) {
    let mut log = PushLog::open_with(disk(fs), refs_path()).expect("open");
    for seq in seqs {
        log.append(&push(seq)).expect("append");
        if compact_after == Some(seq) {
            log.compact(Finish::Swap).expect("compact");
        }
    }
}

#[test]
fn push_log_append_is_whole_or_absent_at_every_crash() {
    let cov = crash_everywhere(
        &|fs| pushes_then(fs, 1..=3, None),
        &|fs| {
            let mut log = PushLog::open_with(disk(fs), refs_path()).map_err(|e| e.to_string())?;
            log.append(&push(4)).map_err(|e| e.to_string())
        },
        &observe_pushlog,
    );
    assert_clean("push-log append", &cov);
}

#[test]
fn push_log_first_append_of_a_new_file_survives_every_crash() {
    let cov = crash_everywhere(
        &|_| {},
        &|fs| {
            let mut log = PushLog::open_with(disk(fs), refs_path()).map_err(|e| e.to_string())?;
            log.append(&push(1)).map_err(|e| e.to_string())
        },
        &|fs| {
            // Before the first append there is no file at all: an empty
            // log, whatever a crash left of its creation.
            observe_pushlog(fs)
        },
    );
    assert_clean("push-log first append", &cov);
}

#[test]
fn push_log_compaction_keeps_every_push_exactly_once_at_every_crash() {
    let cov = crash_everywhere(
        &|fs| pushes_then(fs, 1..=6, Some(3)),
        &|fs| {
            let mut log = PushLog::open_with(disk(fs), refs_path()).map_err(|e| e.to_string())?;
            log.compact(Finish::Swap)
                .map(|_| ())
                .map_err(|e| e.to_string())
        },
        &observe_pushlog,
    );
    assert_clean("push-log compaction", &cov);
}

/// A compaction staged its checkpoint and grew the archive, both fsynced,
/// but never fsynced the directory holding the staged file: a power cut
/// kept the archive's new pushes and lost the staged name, so nothing told
/// `open` to cut the archive back and every retired push was read twice.
#[test]
fn a_compaction_cut_after_its_archive_append_reads_each_push_once() {
    let fs = SimStorage::new();
    pushes_then(&fs, 1..=6, Some(3));
    let mut log = PushLog::open_with(disk(&fs), refs_path()).expect("open");
    log.compact(Finish::Archived).expect("stage and archive");
    drop(log);
    fs.crash(CrashMode::LoseUnsynced);
    let (_, seqs, live) = observe_pushlog(&fs).expect("reopen");
    assert_eq!(seqs, (1..=6).collect::<Vec<_>>(), "each push exactly once");
    assert_eq!(live, 3, "the interrupted compaction is rolled back");
}

#[test]
fn push_log_erase_drops_the_pushes_whole_at_every_crash() {
    let cov = crash_everywhere(
        &|fs| pushes_then(fs, 1..=6, Some(3)),
        &|fs| {
            let mut log = PushLog::open_with(disk(fs), refs_path()).map_err(|e| e.to_string())?;
            log.retain_from(5).map(|_| ()).map_err(|e| e.to_string())
        },
        &observe_pushlog,
    );
    assert_clean("push-log erase", &cov);
}

// ------------------------------------------------------------ object index

fn tail_path() -> PathBuf {
    PathBuf::from("/store/repos/r/objects.redb")
}

const CACHE: usize = 1 << 20;

fn entries(range: std::ops::Range<u8>) -> Vec<IndexEntry> {
    range
        .map(|i| IndexEntry {
            oid: [i; 20],
            obj_type: ObjType::ALL[i as usize % 4],
            offset: u64::from(i) * 100,
            len: 90,
            uncompressed: 200,
        })
        .collect()
}

fn open_stack(fs: &SimStorage) -> Result<ObjectReadStack, String> {
    ObjectReadStack::open_with(disk(fs), &tail_path(), RebuildTriggers::never(), CACHE)
        .map_err(|e| e.to_string())
}

/// Every row the reopened index answers, without the ordinal (which says
/// only whether the projection or the tail served it).
/// An index row as a reopened index answers it: oid, type, offset, length.
type Row = (Vec<u8>, ObjType, u64, u64);

fn observe_index(fs: &SimStorage) -> Result<Vec<Row>, String> {
    let stack = open_stack(fs)?;
    let mut rows = Vec::new();
    for oid in stack.oids_in_order().map_err(|e| e.to_string())? {
        let row = stack
            .try_lookup(&oid)
            .map_err(|e| e.to_string())?
            .ok_or("a listed oid that does not look up")?;
        rows.push((oid, row.obj_type, row.offset, row.len));
    }
    Ok(rows)
}

#[test]
fn object_index_append_is_whole_or_absent_at_every_crash() {
    let cov = crash_everywhere(
        &|fs| {
            open_stack(fs)
                .expect("open")
                .append(&entries(0..8))
                .expect("append");
        },
        &|fs| {
            let stack = open_stack(fs)?;
            stack
                .append(&entries(8..16))
                .map(|_| ())
                .map_err(|e| e.to_string())
        },
        &observe_index,
    );
    assert_clean("object-index append", &cov);
}

// An erase of the object index (a retained copy staged, then renamed
// over the tail) is crashed inside `store_apply_of_an_erase_...`, which
// runs it.

// ------------------------------------------------------------------ publish

fn marker_path() -> PathBuf {
    PathBuf::from("/store/install/INTENT")
}

fn observe_published(fs: &SimStorage) -> Result<Option<Vec<u8>>, String> {
    match fs.read(&marker_path()) {
        Ok(bytes) => Ok(Some(bytes)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e.to_string()),
    }
}

fn publish_cov() -> Coverage {
    crash_everywhere(
        // Written straight to the disk, durable: only the publish under
        // test goes through the code the sabotage switch reaches.
        &|fs| fs.write_file(&marker_path(), b"the old intent"),
        &|fs| publish_with(fs, &marker_path(), b"the new intent").map_err(|e| e.to_string()),
        &observe_published,
    )
}

#[test]
fn publish_by_rename_leaves_the_old_file_or_the_new_one_at_every_crash() {
    assert_clean("publish", &publish_cov());
}

/// `cov` run with a sabotage switch on (on this thread), and the switch
/// off again after.
fn sabotaged(switch: fn(bool), cov: impl FnOnce() -> Coverage) -> Coverage {
    switch(true);
    let cov = cov();
    switch(false);
    cov
}

/// A negative control's verdict: the sabotage was seen.
fn assert_caught(cov: &Coverage, missed: &str) {
    assert!(
        !cov.violations.is_empty(),
        "the checker misses {missed}: {cov:?}"
    );
}

#[test]
fn negative_control_a_publish_without_its_fsync_is_caught() {
    let cov = sabotaged(sabotage::skip_publish_fsync, publish_cov);
    assert!(
        cov.violations
            .iter()
            .any(|v| v.contains("neither before nor after")),
        "the checker misses a rename published before its file was durable: {cov:?}"
    );
}

// -------------------------------------------------------------- the store

use twinlog::log::{Kind, Log, OpenOptions};
use twinlog::objects::OID_LEN;
use twinlog::store::frames::{self, lfs_meta, lfs_oid, FrameParts, PackBuilder, RepoOp};
use twinlog::store::install::{self, InstallPaths, SnapshotBase};
use twinlog::store::{Store, StoreOptions};

const DATA: &str = "/data";

fn data() -> &'static Path {
    Path::new(DATA)
}

fn store_dir() -> PathBuf {
    data().join("store")
}

fn open_log(fs: &SimStorage) -> Result<Log, String> {
    let opts = OpenOptions {
        segment_bytes: 1 << 20,
        storage: Some(disk(fs)),
        ..OpenOptions::default()
    };
    Log::open_opts(data().join("log"), opts).map_err(|e| e.to_string())
}

fn open_store(fs: &SimStorage, log: &Log) -> Result<Store, String> {
    let opts = StoreOptions {
        compact_after_pushes: 2,
        ..StoreOptions::default()
    };
    Store::open_with(disk(fs), store_dir(), log.history(), opts).map_err(|e| e.to_string())
}

fn append(log: &Log, f: &FrameParts) -> u64 {
    log.append_raw(f.kind.as_u16(), &f.meta, &f.blob)
        .expect("append")
}

fn pack(repo: &str, objs: &[(ObjType, &[u8])]) -> (FrameParts, Vec<[u8; OID_LEN]>) {
    let mut b = PackBuilder::new();
    let oids = objs
        .iter()
        .map(|(t, d)| b.add(*t, d).expect("add"))
        .collect();
    (b.frame(repo).expect("frame"), oids)
}

fn refs(repo: &str, name: &str, old: Option<[u8; 20]>, new: Option<[u8; 20]>) -> FrameParts {
    let update = RefUpdate {
        name: name.into(),
        old,
        new,
    };
    frames::refs_frame(repo, 1_700_000_000_000, &[update]).expect("refs")
}

fn lfs_put(log: &Log, repo: &str, content: &[u8]) -> [u8; 32] {
    let oid = lfs_oid(content);
    let meta = lfs_meta(repo, &oid).expect("meta");
    log.append_raw(Kind::LfsPut.as_u16(), &meta, content)
        .expect("append");
    oid
}

/// Frames of every kind, as a store that has applied them all holds: a
/// repository with objects, refs and a large object, and a document; with
/// `second`, a second repository with an object. One repository is one
/// object index to open per crash state, which is most of a state's cost.
/// Answers the oid of the commit `refs/heads/main` of `acme/a` points at.
fn history(log: &Log, second: bool) -> [u8; 20] {
    append(
        log,
        &frames::repo_frame("acme/a", RepoOp::Create).expect("f"),
    );
    let (p1, o1) = pack(
        "acme/a",
        &[
            (ObjType::Blob, b"an early blob"),
            (ObjType::Commit, b"tree 4b825dc\n\nfirst"),
        ],
    );
    append(log, &p1);
    append(log, &refs("acme/a", "refs/heads/main", None, Some(o1[1])));
    lfs_put(log, "acme/a", &[7u8; 3000]);
    append(
        log,
        &frames::doc_frame("policy.toml", b"retain = 3").expect("f"),
    );
    if second {
        append(log, &frames::repo_frame("b", RepoOp::Create).expect("f"));
        let (pb, _) = pack("b", &[(ObjType::Blob, b"b's blob")]);
        append(log, &pb);
    }
    o1[1]
}

/// Everything a reader sees of a store (and where its log starts and
/// ends), short enough to read in a report.
#[derive(Debug, PartialEq, Eq)]
struct StoreView {
    log: (u64, u64),
    repos: Vec<RepoView>,
    docs: Vec<(String, String)>,
}

#[derive(Debug, PartialEq, Eq)]
struct RepoView {
    name: String,
    refs: Vec<(String, u8)>,
    pushes: Vec<u64>,
    /// Each object's oid's first byte, type and length.
    objects: Vec<(u8, ObjType, usize)>,
    /// Each large object's oid's first byte and length.
    lfs: Vec<(u8, u64)>,
}

fn view(store: &Store, log: &Log) -> Result<StoreView, String> {
    let e = |e: twinlog::store::StoreError| e.to_string();
    let mut repos = Vec::new();
    for name in store.repos() {
        let repo = store.repo(name).map_err(e)?;
        let mut objects = Vec::new();
        for oid in repo.object_ids().map_err(e)? {
            let (t, data) = repo
                .read_object(&oid)
                .map_err(e)?
                .ok_or("an indexed object that does not read")?;
            objects.push((oid[0], t, data.len()));
        }
        let lfs = repo.lfs();
        let large = lfs
            .list()
            .map_err(e)?
            .into_iter()
            .map(|oid| (oid[0], lfs.len_of(&oid).unwrap_or(u64::MAX)))
            .collect();
        repos.push(RepoView {
            name: name.to_owned(),
            refs: repo.refs().into_iter().map(|(n, o)| (n, o[0])).collect(),
            pushes: repo.history().map_err(e)?.iter().map(|p| p.seq).collect(),
            objects,
            lfs: large,
        });
    }
    let mut docs = Vec::new();
    for name in store.docs().map_err(e)? {
        let content = store.doc(&name).map_err(e)?.unwrap_or_default();
        docs.push((name, String::from_utf8_lossy(&content).into_owned()));
    }
    Ok(StoreView {
        log: (log.first_seq(), log.head_seq()),
        repos,
        docs,
    })
}

/// Reopen the log and the store as a restart does (finishing an install
/// a crash interrupted first) and answer what the store shows before it
/// catches up. With a `reference`, the store then catches up from the log
/// and must reach exactly the state of the uncrashed run.
fn observe_store(fs: &SimStorage, reference: Option<&StoreView>) -> Result<StoreView, String> {
    observe_store_at(fs, reference, false)
}

/// [`observe_store`], answering what the store shows after it caught up
/// when `caught`.
fn observe_store_at(
    fs: &SimStorage,
    reference: Option<&StoreView>,
    caught: bool,
) -> Result<StoreView, String> {
    let log = open_log(fs)?;
    install::finish_with(fs, &InstallPaths::new(data()), &log).map_err(|e| e.to_string())?;
    let mut store = open_store(fs, &log)?;
    let raw = view(&store, &log)?;
    if let Some(reference) = reference {
        store.catch_up(&log).map_err(|e| e.to_string())?;
        let after = view(&store, &log)?;
        if after != *reference {
            return Err(format!(
                "a catch-up from the log reaches {after:?}, the uncrashed run {reference:?}"
            ));
        }
        if caught {
            return Ok(after);
        }
    }
    Ok(raw)
}

/// Crash everywhere in the apply of the frames `more` appends, on a store
/// that applied `history` and nothing after it: the reopened store shows
/// the state before the frame or after it, and catches up to the state of
/// the uncrashed run.
fn crash_an_apply(what: &str, more: &dyn Fn(&Log, [u8; 20])) -> Coverage {
    crash_an_apply_with(what, more, true, false)
}

/// [`crash_an_apply`]; with `whole` false, for a frame whose apply is
/// several durable steps a replay finishes (an Erase), only the catch-up
/// is checked. With `second`, the history has a second repository.
fn crash_an_apply_with(
    what: &str,
    more: &dyn Fn(&Log, [u8; 20]),
    whole: bool,
    second: bool,
) -> Coverage {
    let setup = |fs: &SimStorage| {
        let log = open_log(fs).expect("log");
        let main = history(&log, second);
        let applied = log.head_seq();
        more(&log, main);
        let mut store = open_store(fs, &log).expect("store");
        for seq in 1..=applied {
            store.apply(&log, seq).expect("apply the history");
        }
        store.checkpoint().expect("checkpoint");
    };
    let op = |fs: &SimStorage| -> Result<(), String> {
        let log = open_log(fs)?;
        let mut store = open_store(fs, &log)?;
        store.catch_up(&log).map(|_| ()).map_err(|e| e.to_string())
    };
    let reference = {
        let fs = SimStorage::new();
        setup(&fs);
        op(&fs).expect("the uncrashed apply");
        observe_store(&fs, None).expect("the uncrashed store")
    };
    let cov = crash_everywhere_with(
        &setup,
        &op,
        &|fs| observe_store_at(fs, Some(&reference), !whole),
        whole,
    );
    eprintln!("{what}:");
    cov
}

#[test]
fn store_apply_of_a_repository_create_is_whole_at_every_crash() {
    let cov = crash_an_apply("create", &|log, _| {
        append(log, &frames::repo_frame("c", RepoOp::Create).expect("f"));
    });
    assert_clean("apply RepoStore create", &cov);
}

#[test]
fn store_apply_of_a_repository_purge_is_whole_at_every_crash() {
    let cov = crash_an_apply_with(
        "purge",
        &|log, _| {
            append(log, &frames::repo_frame("b", RepoOp::Purge).expect("f"));
        },
        true,
        true,
    );
    assert_clean("apply RepoStore purge", &cov);
}

#[test]
fn store_apply_of_a_pack_is_whole_at_every_crash() {
    let cov = crash_an_apply("pack", &|log, _| {
        let (p, _) = pack(
            "acme/a",
            &[(ObjType::Blob, b"a later blob"), (ObjType::Tree, b"")],
        );
        append(log, &p);
    });
    assert_clean("apply Pack", &cov);
}

#[test]
fn store_apply_of_refs_with_a_compaction_is_whole_at_every_crash() {
    // The store compacts a push log after two pushes: this one's second.
    let cov = crash_an_apply("refs", &|log, main| {
        append(log, &refs("acme/a", "refs/tags/v1", None, Some(main)));
    });
    assert_clean("apply Refs", &cov);
}

#[test]
fn store_apply_of_a_large_object_put_and_delete_is_whole_at_every_crash() {
    let put = crash_an_apply("lfs put", &|log, _| {
        lfs_put(log, "acme/a", &[9u8; 2000]);
    });
    assert_clean("apply LfsPut", &put);
    let delete = crash_an_apply("lfs delete", &|log, _| {
        let oid = lfs_oid(&[7u8; 3000]);
        let meta = lfs_meta("acme/a", &oid).expect("meta");
        log.append_raw(Kind::LfsDelete.as_u16(), &meta, &[])
            .expect("append");
    });
    assert_clean("apply LfsDelete", &delete);
}

#[test]
fn store_apply_of_a_document_put_and_delete_is_whole_at_every_crash() {
    let put = crash_an_apply("doc", &|log, _| {
        append(
            log,
            &frames::doc_frame("policy.toml", b"retain = 4").expect("f"),
        );
    });
    assert_clean("apply ControlDoc", &put);
    let delete = crash_an_apply("doc delete", &|log, _| {
        append(log, &frames::doc_delete_frame("policy.toml").expect("f"));
    });
    assert_clean("apply DocDelete", &delete);
}

#[test]
fn store_apply_of_an_erase_is_whole_at_every_crash() {
    // Erases what the first four frames put in acme/a: its first pack,
    // push and large object, in the log and in the store. Its steps are
    // durable one by one (see `EraseStep`) and a replay finishes them, so
    // a reopened store may show a step half done until it catches up.
    let cov = crash_an_apply_with(
        "erase",
        &|log, _| {
            append(
                log,
                &frames::erase_frame(5, &["acme/a".to_owned()]).expect("f"),
            );
        },
        false,
        false,
    );
    assert_clean("apply Erase", &cov);
}

#[test]
fn snapshot_install_leaves_the_old_store_or_the_new_one_at_every_crash() {
    let paths = InstallPaths::new(data());
    let setup = |fs: &SimStorage| {
        let log = open_log(fs).expect("log");
        history(&log, false);
        let mut store = open_store(fs, &log).expect("store");
        // What a twin staged from its primary: the store at frame 7.
        let manifest = store.snapshot(&log, &paths.files()).expect("snapshot");
        let base = SnapshotBase {
            at: manifest.at,
            crc_at: log.locate_blob(manifest.at).expect("locate").payload_crc,
            history: log.history().0,
        };
        install::stage_base_with(fs, &paths, &base).expect("stage");
        // The box's own store went on past it.
        append(
            &log,
            &frames::doc_frame("policy.toml", b"retain = 5").expect("f"),
        );
        append(&log, &frames::repo_frame("c", RepoOp::Create).expect("f"));
        store.catch_up(&log).expect("then the rest");
    };
    let cov = crash_everywhere(
        &setup,
        &|fs| {
            let log = open_log(fs)?;
            install::install_with(fs, &paths, &log, None)
                .map(|_| ())
                .map_err(|e| e.to_string())
        },
        &|fs| observe_store(fs, None),
    );
    assert_clean("snapshot install", &cov);
}

#[test]
fn negative_control_a_document_published_without_its_fsync_is_caught() {
    let cov = sabotaged(sabotage::skip_publish_fsync, || {
        crash_an_apply("doc, sabotaged", &|log, _| {
            append(
                log,
                &frames::doc_frame("policy.toml", b"retain = 4").expect("f"),
            );
        })
    });
    assert_caught(
        &cov,
        "a document renamed into place before its bytes were durable",
    );
}

// ------------------------------------------- a rejoin's save and cut

use twinlog::node::divergent;
use twinlog::node::epoch::{Epochs, EPOCHS_FILE};
use twinlog::node::predecessor::{self, PredecessorFile};

/// The frames a deposed primary holds: 8, the last 3 of them past the
/// fork with the new primary.
const FORK: u64 = 5;

fn divergent_log(fs: &SimStorage) {
    let log = open_log(fs).expect("log");
    for i in 0..8u8 {
        append(
            &log,
            &frames::doc_frame("policy.toml", &[i; 300]).expect("f"),
        );
    }
}

/// What a reopen finds of a save and cut: the log's frames (seq, crc),
/// once every saved tail is checked whole (every frame its manifest
/// counts, every byte, each crc) and a cut log is checked to have saved
/// what it cut. A torn tail counted as saved, or a cut with nothing
/// saved, is an error.
fn observe_save_and_cut(fs: &SimStorage) -> Result<Vec<(u64, u32)>, String> {
    let log = open_log(fs)?;
    let tails = divergent::list_with(fs, data()).map_err(|e| e.to_string())?;
    for t in &tails {
        let path = data().join(divergent::DIVERGENT_DIR).join(&t.file);
        let mut seqs = Vec::new();
        let n = divergent::read_with(
            fs,
            &path,
            |_| false,
            |f, _, _| {
                seqs.push(f.seq);
                Ok(())
            },
        )
        .map_err(|e| format!("a saved tail that does not read whole: {e}"))?;
        let len = fs.read(&path).map_err(|e| e.to_string())?.len() as u64;
        if n != t.frames || len != t.bytes || seqs != (t.first..=t.last).collect::<Vec<_>>() {
            return Err(format!(
                "a saved tail counted as {} frames, {} bytes, holds {n} frames, {len} bytes",
                t.frames, t.bytes
            ));
        }
    }
    let head = log.head_seq();
    if head < 8 && !tails.iter().any(|t| t.first == head + 1 && t.last == 8) {
        return Err(format!("cut to {head} with no saved tail of what it cut"));
    }
    (log.first_seq()..=head)
        .map(|seq| {
            log.locate_blob(seq)
                .map(|l| (seq, l.payload_crc))
                .map_err(|e| e.to_string())
        })
        .collect()
}

fn save_and_cut(fs: &SimStorage) -> Result<(), String> {
    let log = open_log(fs)?;
    let tail = divergent::Tail {
        log: &log,
        fork: FORK,
        epoch: 1 << 32,
        new_epoch: 2 << 32,
        primary: "127.0.0.1:7000".into(),
    };
    divergent::save(data(), &tail).map_err(|e| e.to_string())?;
    log.truncate_after(FORK)
        .map(|_| ())
        .map_err(|e| e.to_string())
}

fn save_and_cut_cov() -> Coverage {
    crash_everywhere(&divergent_log, &save_and_cut, &observe_save_and_cut)
}

#[test]
fn a_rejoins_save_and_cut_keeps_the_tail_whole_or_the_log_uncut_at_every_crash() {
    assert_clean("rejoin save and cut", &save_and_cut_cov());
}

#[test]
fn negative_control_a_tail_saved_without_its_fsync_is_caught() {
    let cov = sabotaged(sabotage::skip_tail_fsync, save_and_cut_cov);
    assert!(
        cov.violations
            .iter()
            .any(|v| v.contains("does not read whole") || v.contains("holds")),
        "the checker misses a saved tail named before its bytes were durable: {cov:?}"
    );
}

// ------------------------- EPOCHS, PREDECESSOR, a promoted configuration

fn epochs_of(fs: &SimStorage) -> Result<Epochs, String> {
    Epochs::load_with(disk(fs), data(), 0).map_err(|e| e.to_string())
}

fn epochs_cov() -> Coverage {
    crash_everywhere(
        &|fs| {
            let e = epochs_of(fs).expect("epochs");
            e.begin_life(0).expect("a life");
            // Made durable straight on the disk: only the write under test
            // goes through the code the sabotage switch reaches.
            let path = data().join(EPOCHS_FILE);
            fs.write_file(&path, &fs.read(&path).expect("EPOCHS"));
        },
        &|fs| {
            epochs_of(fs)?
                .hear(7 << 32, "the new primary")
                .map(|_| ())
                .map_err(|e| e.to_string())
        },
        &|fs| epochs_of(fs).map(|e| e.state()),
    )
}

#[test]
fn epochs_are_whole_or_absent_at_every_crash() {
    assert_clean("EPOCHS", &epochs_cov());
}

#[test]
fn negative_control_epochs_published_without_their_fsync_are_caught() {
    let cov = sabotaged(sabotage::skip_publish_fsync, epochs_cov);
    assert_caught(
        &cov,
        "an EPOCHS file renamed into place before its bytes were durable",
    );
}

fn predecessor_cov() -> Coverage {
    let file = PredecessorFile {
        addr: "10.0.0.1:7000".into(),
        fingerprint: "ab".repeat(32),
        epoch: 3 << 32,
        told: false,
        told_ms: 0,
    };
    crash_everywhere(
        &|_| {},
        &|fs| file.save_with(fs, data()).map_err(|e| e.to_string()),
        &|fs| PredecessorFile::load_with(fs, data()).map_err(|e| e.to_string()),
    )
}

#[test]
fn a_predecessor_file_is_whole_or_absent_at_every_crash() {
    assert_clean("PREDECESSOR", &predecessor_cov());
}

#[test]
fn forgetting_the_predecessor_is_durable_at_every_crash() {
    let cov = crash_everywhere(
        &|fs| {
            PredecessorFile::default()
                .save_with(fs, data())
                .expect("save")
        },
        &|fs| predecessor::forget_with(fs, data()).map_err(|e| e.to_string()),
        &|fs| PredecessorFile::load_with(fs, data()).map_err(|e| e.to_string()),
    );
    assert_clean("PREDECESSOR forgotten", &cov);
}

#[test]
fn negative_control_a_predecessor_file_without_its_fsync_is_caught() {
    let cov = sabotaged(sabotage::skip_publish_fsync, predecessor_cov);
    assert_caught(
        &cov,
        "a PREDECESSOR renamed into place before its bytes were durable",
    );
}

/// A switchover promoting a twin in place: its primary configuration
/// published, then its twin configuration moved aside (to
/// `twin.toml.promoted`), for a later rejoin to take back.
fn promote_configs(fs: &SimStorage) -> Result<(), String> {
    publish_with(
        fs,
        &data().join("primary.toml"),
        b"listen = \"[::]:7000\"\n",
    )
    .map_err(|e| e.to_string())?;
    twinlog::publish::move_aside_with(
        fs,
        &data().join("twin.toml"),
        &data().join("twin.toml.promoted"),
    )
    .map_err(|e| e.to_string())
}

/// Each configuration whole or absent: the twin's is under one name or
/// the other, never both nor neither; the primary's is whole or absent,
/// and present once the twin's moved.
fn observe_configs(fs: &SimStorage) -> Result<(bool, bool), String> {
    let read = |name: &str| match fs.read(&data().join(name)) {
        Ok(b) => Ok(Some(b)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e.to_string()),
    };
    let twin = read("twin.toml")?;
    let aside = read("twin.toml.promoted")?;
    let primary = read("primary.toml")?;
    let twins = [&twin, &aside].into_iter().flatten().collect::<Vec<_>>();
    if twins.len() != 1 || twins[0] != b"primary = \"10.0.0.1:7000\"\n" {
        return Err(format!(
            "the twin's configuration is not whole once: {twins:?}"
        ));
    }
    match &primary {
        Some(b) if b != b"listen = \"[::]:7000\"\n" => {
            return Err(format!("a torn primary configuration: {b:?}"))
        }
        None if aside.is_some() => return Err("moved aside before the primary's".into()),
        _ => {}
    }
    Ok((primary.is_some(), aside.is_some()))
}

fn promote_cov() -> Coverage {
    let setup = |fs: &SimStorage| {
        fs.write_file(&data().join("twin.toml"), b"primary = \"10.0.0.1:7000\"\n")
    };
    // The primary's configuration written and not yet moved aside is a
    // state the promotion's rerun finishes: observed as "before" the move.
    crash_everywhere(&setup, &promote_configs, &|fs| {
        observe_configs(fs).map(|(_, moved)| moved)
    })
}

#[test]
fn a_promoted_boxs_configurations_are_whole_or_absent_at_every_crash() {
    assert_clean("promoted configurations", &promote_cov());
}

#[test]
fn negative_control_configurations_moved_without_their_fsyncs_are_caught() {
    let cov = sabotaged(sabotage::skip_publish_fsync, promote_cov);
    assert_caught(
        &cov,
        "a configuration published or moved before it was durable",
    );
}
