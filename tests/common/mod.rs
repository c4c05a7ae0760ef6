//! What several integration tests share: copying a directory tree (a crash
//! "snapshot" of a box) and finding the files that hold some bytes.

#![allow(dead_code)] // each test uses its own part

use std::path::{Path, PathBuf};

/// Copy a directory tree, as a crash would leave it for the next start.
pub fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("mkdir");
    for e in std::fs::read_dir(from).expect("read_dir") {
        let e = e.expect("entry");
        let dest = to.join(e.file_name());
        if e.file_type().expect("type").is_dir() {
            copy_dir(&e.path(), &dest);
        } else {
            std::fs::copy(e.path(), &dest).expect("copy");
        }
    }
}

/// Every file under `dir` whose bytes contain `needle`.
pub fn files_containing(dir: &Path, needle: &[u8]) -> Vec<PathBuf> {
    let mut out = Vec::new();
    walk(dir, needle, &mut out);
    out
}

fn walk(dir: &Path, needle: &[u8], out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).expect("read_dir") {
        let e = e.expect("entry");
        let ty = e.file_type().expect("type");
        if ty.is_dir() {
            walk(&e.path(), needle, out);
        } else if ty.is_file() {
            let b = std::fs::read(e.path()).expect("read");
            if b.windows(needle.len()).any(|w| w == needle) {
                out.push(e.path());
            }
        }
    }
}

/// Repository names the store keeps like any other: each looks like a
/// staging file (`tmp-*`, `*.tmp`, `*.staged`) as it is or %-encoded, or
/// like an entry at the top of the store.
pub const STAGING_LIKE_REPOS: &[&str] = &[
    "build.tmp",
    "tmp-x",
    "a.staged",
    "x/y.tmp",
    "données.staged",
    "tmp",
    "trash",
];

/// Document names alike.
pub const STAGING_LIKE_DOCS: &[&str] = &["a.tmp", "tmp-1", "b.staged", "tmp", "MANIFEST.json"];

fn append_parts(log: &twinlog::log::Log, f: &twinlog::store::frames::FrameParts) -> u64 {
    log.append_raw(f.kind.as_u16(), &f.meta, &f.blob)
        .expect("append")
}

/// A push of one blob to `refs/heads/main`: a pack and a ref move.
pub fn push_blob(
    log: &twinlog::log::Log,
    repo: &str,
    data: &[u8],
    old: Option<[u8; 20]>,
) -> [u8; 20] {
    use twinlog::store::frames;
    let mut p = twinlog::store::PackBuilder::new();
    let oid = p.add(twinlog::objects::ObjType::Blob, data).expect("add");
    append_parts(log, &p.frame(repo).expect("frame"));
    let update = twinlog::pushlog::RefUpdate {
        name: "refs/heads/main".into(),
        old,
        new: Some(oid),
    };
    append_parts(log, &frames::refs_frame(repo, 0, &[update]).expect("refs"));
    oid
}

/// Every repository of [`STAGING_LIKE_REPOS`] created and given three
/// pushes and two large objects, every document of [`STAGING_LIKE_DOCS`]
/// written twice, and an erase of `a.staged`'s first push and object (so
/// its push log and LFS journal are rewritten).
pub fn staging_like_workload(log: &twinlog::log::Log) {
    use twinlog::log::Kind;
    use twinlog::store::frames::{self, lfs_meta, lfs_oid, RepoOp};
    let lfs_put = |repo: &str, content: &[u8]| {
        let oid = lfs_oid(content);
        let meta = lfs_meta(repo, &oid).expect("meta");
        log.append_raw(Kind::LfsPut.as_u16(), &meta, content)
            .expect("append");
    };
    let mut heads = Vec::new();
    for repo in STAGING_LIKE_REPOS {
        append_parts(log, &frames::repo_frame(repo, RepoOp::Create).expect("f"));
        heads.push(push_blob(
            log,
            repo,
            format!("{repo} first").as_bytes(),
            None,
        ));
        lfs_put(repo, format!("{repo} first large object").as_bytes());
    }
    let before = log.head_seq() + 1;
    for (repo, head) in STAGING_LIKE_REPOS.iter().zip(&mut heads) {
        for n in ["second", "third"] {
            *head = push_blob(log, repo, format!("{repo} {n}").as_bytes(), Some(*head));
        }
        lfs_put(repo, format!("{repo} second large object").as_bytes());
    }
    for doc in STAGING_LIKE_DOCS {
        for v in ["one", "two"] {
            let content = format!("{doc}: {v}");
            append_parts(log, &frames::doc_frame(doc, content.as_bytes()).expect("f"));
        }
    }
    append_parts(
        log,
        &frames::erase_frame(before, &["a.staged".to_owned()]).expect("f"),
    );
}

/// Files and their bytes, by `/`-separated path.
pub type Files = std::collections::BTreeMap<String, Vec<u8>>;

/// Every regular file under `dir` and its bytes.
pub fn files_of(dir: &Path) -> Files {
    let mut out = Files::new();
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        for e in std::fs::read_dir(dir.join(&rel)).expect("read_dir") {
            let e = e.expect("entry");
            let ty = e.file_type().expect("type");
            let r = rel.join(e.file_name());
            if ty.is_dir() {
                stack.push(r);
            } else if ty.is_file() {
                let name = r.to_str().expect("a UTF-8 path").to_owned();
                out.insert(name, std::fs::read(e.path()).expect("read"));
            }
        }
    }
    out
}

/// The files of the store in `dir`: every file but the manifest a store
/// installed from a snapshot keeps at its top, which says what that
/// snapshot was and is no state of the store.
pub fn store_files(dir: &Path) -> Files {
    let mut f = files_of(dir);
    f.remove(twinlog::store::snapshot::MANIFEST_NAME);
    f
}

/// The same files, byte for byte; a difference is named.
pub fn assert_same_files(want: &Files, got: &Files) {
    let missing: Vec<&String> = want.keys().filter(|k| !got.contains_key(*k)).collect();
    let extra: Vec<&String> = got.keys().filter(|k| !want.contains_key(*k)).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "missing {missing:?}, extra {extra:?}"
    );
    for (path, bytes) in want {
        assert!(
            got[path] == *bytes,
            "{path}: {} bytes, {} wanted",
            got[path].len(),
            bytes.len()
        );
    }
}

/// The files a store made by [`staging_like_workload`] must hold, and
/// nothing staged left in its tmp directory.
pub fn assert_holds_the_staging_like_names(files: &Files) {
    for repo in STAGING_LIKE_REPOS {
        let dir = format!("repos/{}", twinlog::store::repo_dir_name(repo));
        let mut want = vec!["archive", "objects.redb", "pushlog", "lfs.journal"];
        // An erase leaves a push log uncompacted, without its reflog.
        if *repo != "a.staged" {
            want.push("pushlog.reflog");
        }
        for f in want {
            let p = format!("{dir}/{f}");
            assert!(files.contains_key(&p), "no {p}");
        }
        let objects = files
            .keys()
            .filter(|k| k.starts_with(&format!("{dir}/lfs/")))
            .count();
        let want = if *repo == "a.staged" { 1 } else { 2 };
        assert_eq!(objects, want, "large objects of {repo}");
    }
    for doc in STAGING_LIKE_DOCS {
        assert_eq!(
            files.get(&format!("docs/{doc}")).map(Vec::as_slice),
            Some(format!("{doc}: two").as_bytes()),
            "document {doc}"
        );
    }
    let staged: Vec<&String> = files.keys().filter(|k| k.starts_with("tmp/")).collect();
    assert!(staged.is_empty(), "staged files left: {staged:?}");
}
