//! A deposed primary's divergent tail, saved before a rejoin cuts it.
//!
//! Frames a primary took after the box that replaced it was promoted were
//! at most acknowledged `local`: the new primary never held them. Rejoin
//! cuts them from the log, but never silently: they are first written to
//! `divergent/` in the data directory, as the frame stream the primary
//! ships (each frame's 32-byte header, its meta, its blob; see
//! `docs/FORMAT.md`), in a file fsynced and then named by its manifest,
//! written last. `primary divergent` reads them back.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::log::{Error as LogError, Log};
use crate::publish::{publish_with, sync_parent_with};
use crate::repl::wire::{frame_prefix, FrameDecoder, FrameEvent};
use crate::storage::{Cursor, OpenMode, StdStorage, Storage};

pub use crate::layout::DIVERGENT_DIR;

/// What a saved tail holds: its manifest, beside the frames file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SavedTail {
    /// The frames file, relative to the directory of saved tails.
    pub file: String,
    /// The log's history id (hex).
    pub history: String,
    /// The last frame both logs share: every saved frame follows it.
    pub fork: u64,
    pub first: u64,
    pub last: u64,
    pub frames: u64,
    /// The frames file's length.
    pub bytes: u64,
    /// The epoch this box served when it wrote them.
    pub epoch: u64,
    /// The new primary's epoch, which superseded it.
    pub new_epoch: u64,
    /// The new primary, as the rejoin reached it.
    pub primary: String,
    /// When they were saved, ms since the Unix epoch.
    pub saved_ms: u64,
}

/// One saved frame as `divergent` lists it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SavedFrame {
    pub seq: u64,
    pub kind: u16,
    pub meta_len: u32,
    pub blob_len: u64,
    pub payload_crc: u32,
    /// Whether the frame had been erased before it was saved (its blob is
    /// gone).
    pub erased: bool,
}

/// What to save and why.
pub struct Tail<'a> {
    pub log: &'a Log,
    pub fork: u64,
    pub epoch: u64,
    pub new_epoch: u64,
    pub primary: String,
}

/// Save frames `fork + 1..=head` of the log under `data_dir/divergent/`,
/// durably, before anything is cut, through the log's storage. Answers
/// the manifest and its path.
pub fn save(data_dir: &Path, tail: &Tail<'_>) -> std::io::Result<(SavedTail, PathBuf)> {
    let fs = &**tail.log.storage();
    let dir = data_dir.join(DIVERGENT_DIR);
    fs.create_dir_all(&dir)?;
    sync_parent_with(fs, &dir)?;
    let (first, last) = (tail.fork + 1, tail.log.head_seq());
    let stem = format!("e{}-{first}-{last}", tail.new_epoch);
    let file = format!("{stem}.frames");
    let tmp = dir.join(format!("{file}.tmp"));
    let mut out = std::io::BufWriter::with_capacity(1 << 20, create(fs, &tmp)?);
    let mut bytes = 0u64;
    for seq in first..=last {
        let mut begun = false;
        tail.log
            .read_pieces(seq, 1 << 20, |loc, piece, _last| {
                if !begun {
                    begun = true;
                    let prefix = frame_prefix(&loc.header(), &loc.meta);
                    out.write_all(&prefix)?;
                    bytes += prefix.len() as u64;
                }
                out.write_all(piece)?;
                bytes += piece.len() as u64;
                Ok::<(), LogError>(())
            })
            .map_err(|e| std::io::Error::other(format!("reading frame {seq}: {e}")))?;
    }
    let f = out.into_inner().map_err(|e| e.into_error())?;
    if !crate::publish::sabotage::tail_fsync_skipped() {
        f.file().sync_all()?;
    }
    drop(f);
    fs.rename(&tmp, &dir.join(&file))?;
    let manifest = SavedTail {
        file,
        history: tail.log.history().to_string(),
        fork: tail.fork,
        first,
        last,
        frames: last + 1 - first,
        bytes,
        epoch: tail.epoch,
        new_epoch: tail.new_epoch,
        primary: tail.primary.clone(),
        saved_ms: crate::node::clock::unix_ms(),
    };
    let path = dir.join(format!("{stem}.json"));
    let text = serde_json::to_vec_pretty(&manifest).map_err(std::io::Error::other)?;
    publish_with(fs, &path, &text)?;
    Ok((manifest, path))
}

/// A new, empty file at `path` (one a crash left there is emptied).
fn create(fs: &dyn Storage, path: &Path) -> std::io::Result<Cursor> {
    let f = fs.open(path, OpenMode::Create)?;
    f.set_len(0)?;
    Ok(Cursor::new(f))
}

/// The names in `dir`; none when it is not there.
fn names(fs: &dyn Storage, dir: &Path) -> std::io::Result<Vec<String>> {
    match fs.list(dir) {
        Ok(mut n) => {
            n.sort();
            Ok(n)
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(e),
    }
}

/// Every saved tail in `data_dir`, oldest first: the manifests that name
/// a whole frames file.
pub fn list(data_dir: &Path) -> std::io::Result<Vec<SavedTail>> {
    list_with(&StdStorage, data_dir)
}

/// [`list`] through `fs`.
pub fn list_with(fs: &dyn Storage, data_dir: &Path) -> std::io::Result<Vec<SavedTail>> {
    let dir = data_dir.join(DIVERGENT_DIR);
    let mut out = Vec::new();
    for name in names(fs, &dir)? {
        let path = dir.join(name);
        if path.extension().is_some_and(|x| x == "json") {
            let text = fs.read(&path)?;
            let m: SavedTail = serde_json::from_slice(&text).map_err(|e| {
                std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!("{}: {e}", path.display()),
                )
            })?;
            out.push(m);
        }
    }
    out.sort_by_key(|m| (m.saved_ms, m.first));
    Ok(out)
}

/// Read a frames file, calling `each` with every frame, its meta, and its
/// blob when `keep(seq)` asks for it (otherwise, and for an erased frame,
/// empty: memory stays small whatever the blobs). Each frame's payload
/// crc is checked: a damaged or cut file is an error naming the frame.
pub fn read(
    path: &Path,
    keep: impl Fn(u64) -> bool,
    each: impl FnMut(&SavedFrame, &[u8], &[u8]) -> std::io::Result<()>,
) -> std::io::Result<u64> {
    read_with(&StdStorage, path, keep, each)
}

/// [`read`] through `fs`.
pub fn read_with(
    fs: &dyn Storage,
    path: &Path,
    keep: impl Fn(u64) -> bool,
    mut each: impl FnMut(&SavedFrame, &[u8], &[u8]) -> std::io::Result<()>,
) -> std::io::Result<u64> {
    let mut f = Cursor::new(fs.open(path, OpenMode::Read)?);
    let mut decoder = FrameDecoder::default();
    let mut buf = vec![0u8; 1 << 16];
    let (mut filled, mut at) = (0usize, 0usize);
    let mut blob = Vec::new();
    let mut crc = crc32fast::Hasher::new();
    let mut keeping = false;
    let mut frames = 0u64;
    let bad = |why: String| std::io::Error::new(std::io::ErrorKind::InvalidData, why);
    let mut eof = false;
    loop {
        if at == filled && !eof {
            filled = f.read(&mut buf)?;
            at = 0;
            eof = filled == 0;
        }
        if eof && decoder.at_boundary() {
            return Ok(frames);
        }
        let (n, ev) = decoder
            .decode(&buf[at..filled])
            .map_err(|e| bad(format!("{}: {e}", path.display())))?;
        let piece = &buf[at..at + n];
        at += n;
        if eof && ev.is_none() {
            return Err(bad(format!(
                "{}: cut inside a frame after {frames} whole frames",
                path.display()
            )));
        }
        match ev {
            Some(FrameEvent::Begin(h)) => {
                blob.clear();
                crc = crc32fast::Hasher::new();
                crc.update(decoder.meta());
                keeping = keep(h.seq);
            }
            Some(FrameEvent::Piece) => {
                crc.update(piece);
                if keeping {
                    blob.extend_from_slice(piece);
                }
            }
            Some(FrameEvent::End(h)) | Some(FrameEvent::Erased(h)) => {
                let erased = matches!(ev, Some(FrameEvent::Erased(_)));
                if erased {
                    blob.clear();
                }
                let meta = decoder.meta().to_vec();
                if !erased {
                    let got = std::mem::replace(&mut crc, crc32fast::Hasher::new()).finalize();
                    if got != h.payload_crc {
                        return Err(bad(format!(
                            "{}: frame {} does not match its crc",
                            path.display(),
                            h.seq
                        )));
                    }
                }
                let frame = SavedFrame {
                    seq: h.seq,
                    kind: h.kind,
                    meta_len: h.meta_len,
                    blob_len: if erased { 0 } else { h.blob_len },
                    payload_crc: h.payload_crc,
                    erased,
                };
                each(&frame, &meta, &blob)?;
                frames += 1;
            }
            None => {}
        }
    }
}

/// Erase reaches saved tails too: every saved frame before `before` that
/// carries data of one of `repos` (as [`Log::erase`] chooses them) is
/// rewritten as erased, keeping its number, kind and length and nothing
/// else. Each tail that holds one is copied to a new file without those
/// bytes (fsynced, renamed into place, the directory fsynced), its
/// manifest is pointed at the new file (published), and the old file is
/// punched out and removed; a crash in between leaves the old file
/// unnamed, which [`sweep`] removes. Answers the frames erased.
pub fn erase(data_dir: &Path, before: u64, repos: &[String]) -> std::io::Result<u64> {
    erase_with(&StdStorage, data_dir, before, repos)
}

/// [`erase`] through `fs`.
pub fn erase_with(
    fs: &dyn Storage,
    data_dir: &Path,
    before: u64,
    repos: &[String],
) -> std::io::Result<u64> {
    sweep_with(fs, data_dir)?;
    let dir = data_dir.join(DIVERGENT_DIR);
    let mut erased = 0;
    for tail in list_with(fs, data_dir)? {
        if tail.first >= before || repos.is_empty() {
            continue;
        }
        let old = dir.join(&tail.file);
        let stem = tail.file.trim_end_matches(".frames");
        let file = format!("{stem}.x{before}.frames");
        let tmp = dir.join(format!("{file}.tmp"));
        let (n, bytes) = rewrite(fs, &old, &tmp, before, repos)?;
        if n == 0 {
            fs.remove(&tmp)?;
            continue;
        }
        fs.rename(&tmp, &dir.join(&file))?;
        sync_parent_with(fs, &dir.join(&file))?;
        let manifest = SavedTail {
            file: file.clone(),
            bytes,
            ..tail.clone()
        };
        let text = serde_json::to_vec_pretty(&manifest).map_err(std::io::Error::other)?;
        publish_with(
            fs,
            &dir.join(format!("{}.json", manifest_stem(&tail))),
            &text,
        )?;
        gone(fs, &old)?;
        erased += n;
    }
    // A store a rejoin set aside (to be rebuilt from the log) is a stale
    // copy: the erased repositories go from it whole.
    for name in names(fs, &dir)? {
        let path = dir.join(&name);
        if !name.starts_with("store-") || !fs.is_dir(&path)? {
            continue;
        }
        for repo in repos {
            let r = path.join("repos").join(crate::store::repo_dir_name(repo));
            if fs.exists(&r)? {
                remove_tree(fs, &r)?;
                sync_parent_with(fs, &r)?;
            }
        }
    }
    Ok(erased)
}

/// Every file under `dir` punched out, then the tree removed.
fn remove_tree(fs: &dyn Storage, dir: &Path) -> std::io::Result<()> {
    for name in fs.list(dir)? {
        let path = dir.join(name);
        if fs.is_dir(&path)? {
            remove_tree(fs, &path)?;
        } else {
            gone(fs, &path)?;
        }
    }
    fs.remove_dir_all(dir)
}

/// The manifest's name of a tail, as [`save`] wrote it.
fn manifest_stem(tail: &SavedTail) -> String {
    format!("e{}-{}-{}", tail.new_epoch, tail.first, tail.last)
}

/// Copy the frames file `from` to `to`, the frames erase chooses written
/// as erased; in pieces, whatever the blobs' sizes. Answers the frames it
/// erased and the new file's length.
fn rewrite(
    fs: &dyn Storage,
    from: &Path,
    to: &Path,
    before: u64,
    repos: &[String],
) -> std::io::Result<(u64, u64)> {
    use crate::log::format::FrameHeader;
    use crate::log::{Kind, Meta};
    let mut input = Cursor::new(fs.open(from, OpenMode::Read)?);
    let mut out = std::io::BufWriter::with_capacity(1 << 20, create(fs, to)?);
    let bad = |why: String| std::io::Error::new(std::io::ErrorKind::InvalidData, why);
    let mut decoder = FrameDecoder::default();
    let mut buf = vec![0u8; 1 << 16];
    let (mut filled, mut at, mut eof) = (0usize, 0usize, false);
    let (mut erased, mut bytes, mut copying) = (0u64, 0u64, true);
    loop {
        if at == filled && !eof {
            filled = input.read(&mut buf)?;
            at = 0;
            eof = filled == 0;
        }
        if eof && decoder.at_boundary() {
            break;
        }
        let (n, ev) = decoder
            .decode(&buf[at..filled])
            .map_err(|e| bad(format!("{}: {e}", from.display())))?;
        let piece = &buf[at..at + n];
        at += n;
        if eof && ev.is_none() {
            return Err(bad(format!("{}: cut inside a frame", from.display())));
        }
        let mut put = |b: &[u8]| -> std::io::Result<()> {
            out.write_all(b)?;
            bytes += b.len() as u64;
            Ok(())
        };
        match ev {
            Some(FrameEvent::Begin(h)) => {
                let chosen = h.seq < before
                    && Kind::from_u16(h.kind).is_ok_and(Kind::carries_repo_data)
                    && Meta::repo_of(decoder.meta()).is_ok_and(|r| repos.iter().any(|x| x == r));
                copying = !chosen;
                if chosen {
                    let gone = FrameHeader {
                        kind: Kind::Redacted.as_u16(),
                        ..h
                    }
                    .as_read();
                    put(&gone.encode())?;
                    erased += 1;
                } else {
                    put(&frame_prefix(&h, decoder.meta()))?;
                }
            }
            Some(FrameEvent::Piece) if copying => put(piece)?,
            Some(FrameEvent::Erased(h)) => put(&frame_prefix(&h, decoder.meta()))?,
            _ => {}
        }
    }
    let f = out.into_inner().map_err(|e| e.into_error())?;
    f.file().sync_all()?;
    Ok((erased, bytes))
}

/// Punch a file out, then remove it: what it held does not linger in
/// freed blocks where the file system can punch.
fn gone(fs: &dyn Storage, path: &Path) -> std::io::Result<()> {
    match fs.open(path, OpenMode::Write) {
        Ok(f) => {
            crate::store::punch(&*f, 0, f.len()?)?;
            f.sync_all()?;
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    }
    fs.remove(path)?;
    sync_parent_with(fs, path)
}

/// Remove what no manifest names in `divergent/`: a frames file an erase
/// replaced, or one a crash left before its manifest was written.
pub fn sweep(data_dir: &Path) -> std::io::Result<()> {
    sweep_with(&StdStorage, data_dir)
}

/// [`sweep`] through `fs`.
pub fn sweep_with(fs: &dyn Storage, data_dir: &Path) -> std::io::Result<()> {
    let dir = data_dir.join(DIVERGENT_DIR);
    let named: std::collections::HashSet<String> = list_with(fs, data_dir)?
        .into_iter()
        .map(|t| t.file)
        .collect();
    for name in names(fs, &dir)? {
        let path = dir.join(&name);
        let stray = name.ends_with(".tmp") || (name.ends_with(".frames") && !named.contains(&name));
        if stray && !fs.is_dir(&path)? {
            gone(fs, &path)?;
        }
    }
    Ok(())
}
