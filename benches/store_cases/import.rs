//! `import_objects_per_s`: a git repository imported into a log and its
//! store, end to end: `git cat-file --batch-all-objects` read, every object
//! hashed and packed, the frames appended (durable), and the store applying
//! them (archive, index, push log). The repository is made by script with
//! `git fast-import` (deterministic, tens of thousands of objects); the
//! project's own history is imported too when it is at hand.

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Instant;

use twinlog::log::Log;
use twinlog::store::import::read_git_repo;
use twinlog::store::{Store, StoreOptions};

use super::super::common::Line;
use super::super::BENCH;

const PACK_BYTES: usize = 8 << 20;
const FILES_PER_COMMIT: usize = 10;

/// A repository of `commits` commits, each rewriting 10 files of a few
/// hundred bytes to a few KiB in one directory.
fn synthetic_repo(dir: &Path, commits: usize) {
    let git = |args: &[&str]| Command::new("git").arg("-C").arg(dir).args(args).output();
    std::fs::create_dir_all(dir).expect("mkdir");
    assert!(git(&["init", "-q", "--bare"])
        .expect("git init")
        .status
        .success());
    let mut child = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(["fast-import", "--quiet"])
        .stdin(Stdio::piped())
        .spawn()
        .expect("git fast-import");
    let mut stdin = std::io::BufWriter::new(child.stdin.take().expect("stdin"));
    let mut mark = 0u64;
    for c in 0..commits {
        let mut blobs = Vec::new();
        for f in 0..FILES_PER_COMMIT {
            mark += 1;
            let len = 200 + (c * 131 + f * 977) % 3000;
            let body: String = (0..len)
                .map(|i| (b'a' + ((c * 7 + f * 13 + i) % 26) as u8) as char)
                .collect();
            write!(stdin, "blob\nmark :{mark}\ndata {}\n{body}\n", body.len()).expect("write");
            blobs.push((mark, f));
        }
        let msg = format!("commit {c}\n");
        write!(
            stdin,
            "commit refs/heads/main\ncommitter Bench <bench@example.com> {} +0000\ndata {}\n{msg}",
            1_700_000_000 + c,
            msg.len()
        )
        .expect("write");
        for (m, f) in blobs {
            writeln!(stdin, "M 100644 :{m} src/file{f}.txt").expect("write");
        }
        writeln!(stdin).expect("write");
    }
    drop(stdin);
    assert!(child.wait().expect("fast-import").success());
}

struct Imported {
    objects: u64,
    bytes: u64,
    secs: f64,
}

/// Import into a fresh log and store under `root`.
fn import(root: &Path, git_dir: &Path) -> Imported {
    let log = Log::open(root.join("log")).expect("log");
    let mut store =
        Store::open(root.join("store"), log.history(), StoreOptions::default()).expect("store");
    let started = Instant::now();
    let r = read_git_repo(git_dir, "bench/repo", PACK_BYTES, 0, &mut |f| {
        log.append_raw(f.kind.as_u16(), &f.meta, &f.blob)?;
        store.catch_up(&log)?;
        Ok(())
    })
    .expect("import");
    let secs = started.elapsed().as_secs_f64();
    assert_eq!(
        store.repo("bench/repo").expect("repo").objects() as u64,
        r.objects,
        "every object indexed"
    );
    Imported {
        objects: r.objects,
        bytes: r.bytes,
        secs,
    }
}

/// git's own pace at handing the objects over, for scale.
fn git_only(git_dir: &Path) -> f64 {
    let started = Instant::now();
    let r = read_git_repo(git_dir, "bench/repo", PACK_BYTES, 0, &mut |_| Ok(())).expect("read");
    r.objects as f64 / started.elapsed().as_secs_f64()
}

pub fn run(root: &Path, commits: usize) {
    let repo = root.join("synthetic.git");
    let made = Instant::now();
    synthetic_repo(&repo, commits);
    eprintln!(
        "synthetic repository: {commits} commits in {:.1} s",
        made.elapsed().as_secs_f64()
    );
    let git_rate = git_only(&repo);
    let r = import(&root.join("import-synthetic"), &repo);
    let mut line = Line::new(
        BENCH,
        "import_objects_per_s",
        r.objects as f64 / r.secs,
        "objects/s",
    )
    .int("objects", r.objects)
    .num("mib", r.bytes as f64 / 1048576.0)
    .num("secs", r.secs)
    .num("git_cat_file_objects_per_s", git_rate);
    let own = Path::new(env!("CARGO_MANIFEST_DIR")).join(".git");
    if own.exists() {
        let o = import(&root.join("import-own"), &own);
        line = line
            .int("own_history_objects", o.objects)
            .num("own_history_objects_per_s", o.objects as f64 / o.secs);
    }
    line.print();
}
