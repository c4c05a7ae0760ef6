//! Import a real git repository: its objects through `git cat-file
//! --batch-all-objects --batch`, its refs through `git for-each-ref`, as the
//! frames a push of all of it would be (a RepoStore create, Pack frames of a
//! bounded size, one Refs frame), so tests and benchmarks run on real data.

use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::process::{Command, Stdio};

use super::frames::{self, FrameParts, PackBuilder, RepoOp};
use super::{Result, StoreError};
use crate::objects::OID_LEN;
use crate::pushlog::RefUpdate;

/// What an import read.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GitImport {
    pub objects: u64,
    pub bytes: u64,
    pub packs: u64,
    pub refs: u64,
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
    let mut done = GitImport::default();
    let refs = read_refs(git_dir)?;
    each(frames::repo_frame(repo, RepoOp::Create)?)?;
    let mut child = Command::new("git")
        .arg("-C")
        .arg(git_dir)
        .args(["cat-file", "--batch-all-objects", "--batch", "--unordered"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| git_failed("cat-file", e))?;
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
    let status = child.wait()?;
    if !status.success() {
        let mut err = String::new();
        if let Some(mut e) = child.stderr.take() {
            let _ = e.read_to_string(&mut err);
        }
        return Err(git_failed("cat-file", format!("{status}: {}", err.trim())));
    }
    if !pack.is_empty() {
        each(pack.frame(repo)?)?;
        done.packs += 1;
    }
    if !refs.is_empty() {
        done.refs = refs.len() as u64;
        each(frames::refs_frame(repo, at_ms, &refs)?)?;
    }
    Ok(done)
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
