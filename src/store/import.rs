//! Import a real git repository: its objects through `git cat-file
//! --batch-all-objects --batch`, its refs through `git for-each-ref`, as the
//! frames a push of all of it would be (a RepoStore create, Pack frames of a
//! bounded size, one Refs frame), so tests and benchmarks run on real data.
//! A repository the store holds already is brought up to date: only the
//! objects it lacks ([`list_objects`], then [`read_objects`] of those), and
//! each ref moved from where it is ([`refs_to_move`]).

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};

use super::frames::{self, FrameParts, PackBuilder, RepoOp};
use super::{Result, StoreError};
use crate::objects::OID_LEN;
use crate::pushlog::RefUpdate;

/// What an import read.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GitImport {
    /// Objects sent, and their bytes.
    pub objects: u64,
    pub bytes: u64,
    pub packs: u64,
    /// Refs created or moved.
    pub refs: u64,
    /// Objects the repository held already, not sent again.
    pub held: u64,
    /// Refs already where git has them.
    pub refs_unchanged: u64,
}

fn git_failed(what: &str, detail: impl std::fmt::Display) -> StoreError {
    StoreError::Io(std::io::Error::other(format!("git {what}: {detail}")))
}

/// Read the repository at `git_dir` and hand over its frames for
/// repository `repo`, in order: the create, the packs (each at most about
/// `pack_bytes`), then the refs. Objects stream from git; memory is one
/// pack.
pub fn read_git_repo(
    git_dir: &Path,
    repo: &str,
    pack_bytes: usize,
    at_ms: u64,
    each: &mut dyn FnMut(FrameParts) -> Result<()>,
) -> Result<GitImport> {
    frames::check_repo_name(repo)?;
    let refs = read_refs(git_dir)?;
    each(frames::repo_frame(repo, RepoOp::Create)?)?;
    let mut done = read_objects(git_dir, repo, pack_bytes, None, each)?;
    if !refs.is_empty() {
        done.refs = refs.len() as u64;
        each(frames::refs_frame(repo, at_ms, &refs)?)?;
    }
    Ok(done)
}

/// Every object id of the repository at `git_dir` (ids only: git reads no
/// object's content for this).
pub fn list_objects(git_dir: &Path) -> Result<Vec<[u8; OID_LEN]>> {
    let out = Command::new("git")
        .arg("-C")
        .arg(git_dir)
        .args([
            "cat-file",
            "--batch-all-objects",
            "--batch-check=%(objectname)",
            "--unordered",
        ])
        .output()
        .map_err(|e| git_failed("cat-file", e))?;
    if !out.status.success() {
        return Err(git_failed(
            "cat-file",
            String::from_utf8_lossy(&out.stderr).trim(),
        ));
    }
    let text = String::from_utf8(out.stdout).map_err(|e| git_failed("cat-file", e))?;
    text.lines()
        .map(|l| {
            frames::unhex::<OID_LEN>(l.trim())
                .ok_or_else(|| git_failed("cat-file", format!("object id {l:?}")))
        })
        .collect()
}

/// The ref updates that bring a repository whose refs are `current` to
/// git's refs (`wanted`, as [`read_refs`] gives them), each from where it
/// is now, as a push would; and how many refs are already there. A ref
/// git does not have is left alone.
pub fn refs_to_move(
    wanted: &[RefUpdate],
    current: &BTreeMap<String, [u8; OID_LEN]>,
) -> (Vec<RefUpdate>, u64) {
    let mut moves = Vec::new();
    let mut unchanged = 0;
    for r in wanted {
        let now = current.get(&r.name).copied();
        if now == r.new {
            unchanged += 1;
        } else {
            moves.push(RefUpdate {
                name: r.name.clone(),
                old: now,
                new: r.new,
            });
        }
    }
    (moves, unchanged)
}

/// Hand over the objects of the repository at `git_dir` as Pack frames for
/// `repo` of about `pack_bytes` each: all of them (`only` None), or those
/// listed. Objects stream from git; memory is one pack.
pub fn read_objects(
    git_dir: &Path,
    repo: &str,
    pack_bytes: usize,
    only: Option<Vec<[u8; OID_LEN]>>,
    each: &mut dyn FnMut(FrameParts) -> Result<()>,
) -> Result<GitImport> {
    let mut done = GitImport::default();
    if only.as_ref().is_some_and(|o| o.is_empty()) {
        return Ok(done);
    }
    let mut git = Command::new("git");
    git.arg("-C").arg(git_dir);
    match only {
        None => git.args(["cat-file", "--batch-all-objects", "--batch", "--unordered"]),
        Some(_) => git.args(["cat-file", "--batch"]).stdin(Stdio::piped()),
    };
    let mut child = git
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| git_failed("cat-file", e))?;
    // The ids are written from a thread while this one reads the objects:
    // written first, git's output would fill its pipe and stall both.
    let feeder = match (only, child.stdin.take()) {
        (Some(oids), Some(mut stdin)) => Some(std::thread::spawn(move || {
            let mut w = std::io::BufWriter::new(&mut stdin);
            for oid in oids {
                writeln!(w, "{}", frames::hex(&oid))?;
            }
            w.flush()
        })),
        _ => None,
    };
    let read = pack_objects(&mut child, repo, pack_bytes, &mut done, each);
    if read.is_err() {
        let _ = child.kill();
    }
    let fed = feeder.map(|f| f.join());
    let status = child.wait()?;
    read?;
    if !status.success() {
        let mut err = String::new();
        if let Some(mut e) = child.stderr.take() {
            let _ = e.read_to_string(&mut err);
        }
        return Err(git_failed("cat-file", format!("{status}: {}", err.trim())));
    }
    match fed {
        Some(Ok(Err(e))) => return Err(git_failed("cat-file", format!("writing ids: {e}"))),
        Some(Err(_)) => return Err(git_failed("cat-file", "the id writer panicked")),
        _ => {}
    }
    Ok(done)
}

/// Read `git cat-file --batch` output into packs.
fn pack_objects(
    child: &mut Child,
    repo: &str,
    pack_bytes: usize,
    done: &mut GitImport,
    each: &mut dyn FnMut(FrameParts) -> Result<()>,
) -> Result<()> {
    let stdout = child
        .stdout
        .take()
        .ok_or_else(|| git_failed("cat-file", "no stdout"))?;
    let mut r = BufReader::with_capacity(1 << 20, stdout);
    let mut pack = PackBuilder::new();
    let mut line = String::new();
    let mut data = Vec::new();
    loop {
        line.clear();
        if r.read_line(&mut line)? == 0 {
            break;
        }
        if let Some(oid) = line.trim_end().strip_suffix(" missing") {
            return Err(git_failed("cat-file", format!("object {oid} is missing")));
        }
        let mut parts = line.trim_end().split(' ');
        let (Some(oid_hex), Some(ty), Some(size)) = (parts.next(), parts.next(), parts.next())
        else {
            return Err(git_failed("cat-file", format!("unexpected line {line:?}")));
        };
        let t = frames::type_named(ty)
            .ok_or_else(|| git_failed("cat-file", format!("object type {ty}")))?;
        let size: u64 = size
            .parse()
            .map_err(|_| git_failed("cat-file", format!("object size {size}")))?;
        if size > frames::MAX_OBJECT_BYTES {
            return Err(StoreError::TooLarge {
                what: "git object",
                len: size,
                max: frames::MAX_OBJECT_BYTES,
            });
        }
        data.clear();
        data.resize(size as usize + 1, 0);
        r.read_exact(&mut data)?;
        data.pop();
        let oid = pack.add(t, &data)?;
        if frames::hex(&oid) != oid_hex {
            return Err(git_failed(
                "cat-file",
                format!("object {oid_hex} hashes to {}", frames::hex(&oid)),
            ));
        }
        done.objects += 1;
        done.bytes += size;
        if pack.len() >= pack_bytes {
            each(std::mem::take(&mut pack).frame(repo)?)?;
            done.packs += 1;
        }
    }
    if !pack.is_empty() {
        each(pack.frame(repo)?)?;
        done.packs += 1;
    }
    Ok(())
}

/// The repository's refs as a push that creates each.
pub fn read_refs(git_dir: &Path) -> Result<Vec<RefUpdate>> {
    let out = Command::new("git")
        .arg("-C")
        .arg(git_dir)
        .args(["for-each-ref", "--format=%(objectname) %(refname)"])
        .output()
        .map_err(|e| git_failed("for-each-ref", e))?;
    if !out.status.success() {
        return Err(git_failed(
            "for-each-ref",
            String::from_utf8_lossy(&out.stderr).trim(),
        ));
    }
    let text = String::from_utf8(out.stdout).map_err(|e| git_failed("for-each-ref", e))?;
    let mut refs = Vec::new();
    for line in text.lines() {
        let Some((oid, name)) = line.split_once(' ') else {
            continue;
        };
        let new = frames::unhex::<OID_LEN>(oid)
            .ok_or_else(|| git_failed("for-each-ref", format!("object id {oid}")))?;
        refs.push(RefUpdate {
            name: name.to_owned(),
            old: None,
            new: Some(new),
        });
    }
    Ok(refs)
}
