//! An erase reaches every copy of what it erases beside the log and the
//! store: the frames a rejoin saved under `divergent/` (and a store it set
//! aside there), and a snapshot a twin staged before the erase. Each is
//! checked by scanning the raw files for the erased bytes.

use std::path::Path;
use std::sync::{Arc, Mutex};

use twinlog::log::{Kind, Log, Meta};
use twinlog::node::divergent;
use twinlog::node::store_host::StoreHost;
use twinlog::store::install::{self, InstallPaths, SnapshotBase};
use twinlog::store::{frames, RepoOp, StoreOptions};

const MARKER: &[u8] = b"ERASE-ME-4c1d-marker";

/// The files under `dir` whose bytes hold `needle`.
fn holding(dir: &Path, needle: &[u8]) -> Vec<std::path::PathBuf> {
    let mut found = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return found;
    };
    for e in entries.flatten() {
        let path = e.path();
        if path.is_dir() {
            found.extend(holding(&path, needle));
        } else if std::fs::read(&path).is_ok_and(|b| b.windows(needle.len()).any(|w| w == needle)) {
            found.push(path);
        }
    }
    found
}

fn blob(n: u8) -> Vec<u8> {
    let mut b = MARKER.to_vec();
    b.extend(std::iter::repeat_n(n, 3000));
    b
}

#[test]
fn an_erase_reaches_the_saved_tails_and_the_stores_set_aside() {
    let root = tempfile::tempdir().expect("tempdir");
    let data = root.path();
    let log = Log::open(data.join("log")).expect("log");
    for i in 0..6u8 {
        let repo = if i % 2 == 0 { "secret" } else { "kept" };
        log.append(Kind::Pack, &Meta::repo(repo), &blob(i))
            .expect("append");
    }
    let (saved, _) = divergent::save(
        data,
        &divergent::Tail {
            log: &log,
            fork: 0,
            epoch: 0,
            new_epoch: 1 << 32,
            primary: "127.0.0.1:1".into(),
        },
    )
    .expect("save");
    let dir = data.join(divergent::DIVERGENT_DIR);
    // A store a rejoin set aside, and a file no manifest names.
    let aside = dir
        .join("store-e4294967296-1")
        .join("repos")
        .join(twinlog::store::repo_dir_name("secret"));
    std::fs::create_dir_all(&aside).expect("mkdir");
    std::fs::write(aside.join("objects"), MARKER).expect("write");
    std::fs::write(dir.join("e1-9-9.frames.tmp"), MARKER).expect("write");
    assert!(!holding(&dir, MARKER).is_empty());

    // Frames 1..=4 only: 5 and 6 are past `before`.
    let n = divergent::erase(data, 5, &["secret".to_string()]).expect("erase");
    assert_eq!(n, 2, "frames 1 and 3");
    let left = holding(&dir, MARKER);
    assert_eq!(
        left.len(),
        1,
        "only the tail file, for frames 2, 4 and 5: {left:?}"
    );
    let tails = divergent::list(data).expect("list");
    assert_eq!(tails.len(), 1);
    assert_ne!(tails[0].file, saved.file, "a new file");
    assert!(!dir.join(&saved.file).exists(), "the old file is gone");
    assert!(!aside.exists(), "the set-aside store lost the repository");
    let mut seen = Vec::new();
    divergent::read(
        &dir.join(&tails[0].file),
        |_| true,
        |f, meta, blob| {
            seen.push((f.seq, f.erased, meta.is_empty(), blob.len()));
            Ok(())
        },
    )
    .expect("the rewritten tail reads, every crc checked");
    assert_eq!(
        seen,
        vec![
            (1, true, true, 0),
            (2, false, false, blob(1).len()),
            (3, true, true, 0),
            (4, false, false, blob(3).len()),
            (5, false, false, blob(4).len()),
            (6, false, false, blob(5).len()),
        ]
    );
    // Again: nothing more to erase, nothing changes.
    assert_eq!(
        divergent::erase(data, 5, &["secret".to_string()]).expect("again"),
        0
    );
}

#[test]
fn a_snapshot_staged_before_an_erase_goes() {
    let root = tempfile::tempdir().expect("tempdir");
    let paths = InstallPaths::new(root.path());
    let base = |at| SnapshotBase {
        at,
        crc_at: 0,
        history: [1; 16],
    };
    install::stage_base(&paths, &base(10)).expect("stage");
    std::fs::create_dir_all(paths.files()).expect("mkdir");
    std::fs::write(paths.files().join("objects"), MARKER).expect("write");
    assert!(install::drop_staged_before(&paths, 12).expect("drop"));
    assert!(!paths.staging().exists());
    install::stage_base(&paths, &base(20)).expect("stage");
    assert!(!install::drop_staged_before(&paths, 12).expect("kept"));
    assert!(paths.staging().exists(), "taken after the erase: kept");
}

#[test]
fn a_store_opening_applies_its_erases_to_the_copies_too() {
    let root = tempfile::tempdir().expect("tempdir");
    let log = Arc::new(Log::open(root.path().join("log")).expect("log"));
    let create = frames::repo_frame("secret", RepoOp::Create).expect("frame");
    log.append_raw(create.kind.as_u16(), &create.meta, &create.blob)
        .expect("append");
    let erase = frames::erase_frame(2, &["secret".to_string()]).expect("frame");
    let seq = log
        .append_raw(erase.kind.as_u16(), &erase.meta, &erase.blob)
        .expect("append");
    let calls = Arc::new(Mutex::new(Vec::new()));
    let seen = calls.clone();
    let host = StoreHost::open_with(
        log,
        &root.path().join("store"),
        StoreOptions::default(),
        Some(Arc::new(move |at, before, repos: &[String]| {
            seen.lock()
                .expect("lock")
                .push((at, before, repos.to_vec()));
            Ok(0)
        })),
    )
    .expect("open");
    assert_eq!(host.health().applied, seq);
    assert_eq!(
        *calls.lock().expect("lock"),
        vec![(seq, 2, vec!["secret".to_string()])],
        "the erase applied at the store's start reached the copies"
    );
}
