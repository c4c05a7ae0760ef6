//! A consistent snapshot of a store at a seq: its files copied into a
//! directory, then a manifest naming each file's length and crc, written
//! last, so a directory with a manifest that parses is a whole snapshot and
//! every file can be checked against it.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::{Result, Store, StoreError, TMP_DIR};
use crate::log::Log;
use crate::storage::{OpenMode, StdStorage, Storage};

/// The manifest's file name in a snapshot directory.
pub const MANIFEST_NAME: &str = "MANIFEST.json";
/// The manifest format's version.
pub const MANIFEST_FORMAT: u32 = 1;

/// One file of a snapshot.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ManifestFile {
    /// The path under the snapshot directory, `/`-separated.
    pub path: String,
    pub len: u64,
    pub crc32: u32,
}

/// What a snapshot holds.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    pub format: u32,
    /// The log history the store belongs to, hex.
    pub history: String,
    /// The seq the store had applied up to.
    pub at: u64,
    pub files: Vec<ManifestFile>,
}

impl Manifest {
    /// The bytes of every file.
    pub fn bytes(&self) -> u64 {
        self.files.iter().map(|f| f.len).sum()
    }
}

const COPY_PIECE: usize = 1 << 20;

/// Every regular file under a store or a snapshot `dir`, relative, sorted:
/// all but the top level's trash, tmp directory and manifest. No name below
/// the top is left out, since repository and document names may be
/// anything their checks allow.
fn files_under(fs: &dyn Storage, dir: &Path) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        for name in fs.list(&dir.join(&rel))? {
            if rel.as_os_str().is_empty()
                && (name == "trash" || name == TMP_DIR || name == MANIFEST_NAME)
            {
                continue;
            }
            if fs.is_dir(&dir.join(&rel).join(&name))? {
                stack.push(rel.join(&name));
            } else {
                out.push(rel.join(&name));
            }
        }
    }
    out.sort();
    Ok(out)
}

fn rel_string(p: &Path) -> Result<String> {
    let s = p.to_str().ok_or_else(|| StoreError::BadName {
        name: p.to_string_lossy().into_owned(),
        why: "a store file name that is not UTF-8".into(),
    })?;
    Ok(s.to_owned())
}

/// Copy one file, returning its length and crc; the copy is fsynced.
fn copy_file(fs: &dyn Storage, from: &Path, to: &Path) -> Result<(u64, u32)> {
    let dst = fs.open(to, OpenMode::CreateNew)?;
    let mut at = 0;
    let got = read_crc(fs, from, &mut |piece| {
        dst.write_all_at(piece, at)?;
        at += piece.len() as u64;
        Ok(())
    })?;
    dst.sync_all()?;
    Ok(got)
}

/// The length and crc of a file, read in pieces.
pub fn crc_of_file(path: &Path) -> Result<(u64, u32)> {
    crc_of_file_with(&StdStorage, path)
}

/// [`crc_of_file`] through `fs`.
pub fn crc_of_file_with(fs: &dyn Storage, path: &Path) -> Result<(u64, u32)> {
    read_crc(fs, path, &mut |_| Ok(()))
}

fn read_crc(
    fs: &dyn Storage,
    path: &Path,
    each: &mut dyn FnMut(&[u8]) -> std::io::Result<()>,
) -> Result<(u64, u32)> {
    let f = fs.open(path, OpenMode::Read)?;
    let mut buf = vec![0u8; COPY_PIECE];
    let mut crc = crc32fast::Hasher::new();
    let mut len = 0u64;
    loop {
        let n = f.read_at(&mut buf, len)?;
        if n == 0 {
            return Ok((len, crc.finalize()));
        }
        crc.update(&buf[..n]);
        each(&buf[..n])?;
        len += n as u64;
    }
}

impl Store {
    /// Snapshot the store at the log's head into `dest` (which must not
    /// exist): the log is frozen, the store catches up and records its
    /// applied seq, then every file is copied and the manifest written.
    pub fn snapshot(&mut self, log: &Log, dest: &Path) -> Result<Manifest> {
        let _frozen = log.freeze();
        self.catch_up(log)?;
        self.checkpoint()?;
        self.copy_to(dest)
    }

    /// Copy the store's files into `dest` with a manifest; the store must
    /// not change meanwhile (`&mut self` sees to that).
    fn copy_to(&mut self, dest: &Path) -> Result<Manifest> {
        let fs = &*Arc::clone(&self.fs);
        if fs.exists(dest)? {
            return Err(StoreError::BadSnapshot {
                dir: dest.to_owned(),
                what: "the destination exists".into(),
            });
        }
        fs.create_dir_all(dest)?;
        let mut files = Vec::new();
        for rel in files_under(fs, &self.dir)? {
            let to = dest.join(&rel);
            if let Some(parent) = to.parent() {
                if !fs.exists(parent)? {
                    fs.create_dir_all(parent)?;
                }
            }
            let (len, crc32) = copy_file(fs, &self.dir.join(&rel), &to)?;
            files.push(ManifestFile {
                path: rel_string(&rel)?,
                len,
                crc32,
            });
        }
        for sub in ["repos", "docs"] {
            fs.create_dir_all(&dest.join(sub))?;
        }
        sync_tree_with(fs, dest)?;
        let manifest = Manifest {
            format: MANIFEST_FORMAT,
            history: self.history.to_string(),
            at: self.applied,
            files,
        };
        write_manifest_with(fs, dest, &manifest)?;
        Ok(manifest)
    }
}

/// fsync every directory under `dir`, deepest first, then `dir`.
pub fn sync_tree(dir: &Path) -> Result<()> {
    sync_tree_with(&StdStorage, dir)
}

/// [`sync_tree`] through `fs`.
pub fn sync_tree_with(fs: &dyn Storage, dir: &Path) -> Result<()> {
    for name in fs.list(dir)? {
        let path = dir.join(name);
        if fs.is_dir(&path)? {
            sync_tree_with(fs, &path)?;
        }
    }
    fs.sync_dir(dir)?;
    Ok(())
}

/// Write the manifest (a staged file renamed into place, then the directory
/// fsynced): its presence says the snapshot is whole.
pub fn write_manifest(dir: &Path, manifest: &Manifest) -> Result<()> {
    write_manifest_with(&StdStorage, dir, manifest)
}

/// [`write_manifest`] through `fs`.
pub fn write_manifest_with(fs: &dyn Storage, dir: &Path, manifest: &Manifest) -> Result<()> {
    let path = dir.join(MANIFEST_NAME);
    let bytes = serde_json::to_vec_pretty(manifest).map_err(|e| StoreError::BadSnapshot {
        dir: dir.to_owned(),
        what: format!("manifest: {e}"),
    })?;
    crate::publish::publish_with(fs, &path, &bytes)?;
    Ok(())
}

/// Read a snapshot's manifest; a missing or unparsable one is a snapshot
/// that is not whole.
pub fn read_manifest(dir: &Path) -> Result<Manifest> {
    read_manifest_with(&StdStorage, dir)
}

/// [`read_manifest`] through `fs`.
pub fn read_manifest_with(fs: &dyn Storage, dir: &Path) -> Result<Manifest> {
    let bad = |what: String| StoreError::BadSnapshot {
        dir: dir.to_owned(),
        what,
    };
    let bytes = fs
        .read(&dir.join(MANIFEST_NAME))
        .map_err(|e| bad(format!("manifest: {e}")))?;
    let m: Manifest =
        serde_json::from_slice(&bytes).map_err(|e| bad(format!("manifest does not parse: {e}")))?;
    if m.format != MANIFEST_FORMAT {
        return Err(bad(format!("manifest format {}", m.format)));
    }
    for f in &m.files {
        let p = Path::new(&f.path);
        if p.is_absolute()
            || p.components()
                .any(|c| !matches!(c, std::path::Component::Normal(_)))
        {
            return Err(bad(format!(
                "a file path that leaves the snapshot: {}",
                f.path
            )));
        }
    }
    Ok(m)
}

/// Check every file of a snapshot against its manifest: each is there, of
/// its length and crc, and no other file is.
pub fn verify(dir: &Path) -> Result<Manifest> {
    verify_with(&StdStorage, dir)
}

/// [`verify`] through `fs`.
pub fn verify_with(fs: &dyn Storage, dir: &Path) -> Result<Manifest> {
    let m = read_manifest_with(fs, dir)?;
    let bad = |what: String| StoreError::BadSnapshot {
        dir: dir.to_owned(),
        what,
    };
    for f in &m.files {
        let (len, crc) = read_crc(fs, &dir.join(&f.path), &mut |_| Ok(()))
            .map_err(|e| bad(format!("{}: {e}", f.path)))?;
        if len != f.len || crc != f.crc32 {
            return Err(bad(format!(
                "{}: {len} bytes, crc {crc:08x}; the manifest says {} bytes, crc {:08x}",
                f.path, f.len, f.crc32
            )));
        }
    }
    let listed: std::collections::BTreeSet<&str> =
        m.files.iter().map(|f| f.path.as_str()).collect();
    for rel in files_under(fs, dir)? {
        let s = rel_string(&rel)?;
        if !listed.contains(s.as_str()) {
            return Err(bad(format!("{s} is not in the manifest")));
        }
    }
    Ok(m)
}
