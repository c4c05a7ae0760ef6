//! Recovery: what a crash can leave of a push log, and what `open` makes
//! of it. A scan keeps the whole frames and cuts a torn tail; a compaction
//! interrupted before its swap is rolled back, and an erase interrupted
//! after its commit rename is finished.

use std::path::Path;

use super::codec::{
    decode_contents, next_whole_frame, open_envelope, Fault, Frame, UNFRAMED_START,
};
use super::{archive_path_of, beside, staged_path, Push, PushLogError, ScanError};
use crate::publish::sync_parent_with;
use crate::storage::{OpenMode, Storage};

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PushLogScan {
    /// The refs a compaction folded, as a push of creations (of none when
    /// no ref was left), when the log starts with one.
    pub checkpoint: Option<Push>,
    pub pushes: Vec<Push>,
    /// Where the last whole frame ends.
    pub good_bytes: u64,
    /// Bytes after it: a torn tail.
    pub discarded_bytes: u64,
}

/// Read forward over concatenated frames. A frame that does not check with
/// no whole frame after it is the torn tail a crash leaves: it ends the
/// scan and is no error. Anything else that does not check or decode is
/// [`ScanError::Damaged`] at the frame's offset; a file of format version
/// 1 (bare Arrow IPC streams) or a frame of another version is
/// [`ScanError::Version`].
pub fn scan_frames(bytes: &[u8]) -> Result<PushLogScan, ScanError> {
    if bytes.starts_with(&UNFRAMED_START) {
        return Err(ScanError::Version {
            offset: 0,
            found: 1,
        });
    }
    let mut scan = PushLogScan::default();
    let mut at = 0usize;
    while at < bytes.len() {
        let damaged = |why: String| ScanError::Damaged {
            offset: at as u64,
            why,
        };
        let fault = match open_envelope(&bytes[at..]) {
            Ok((ipc, len)) => {
                match decode_contents(ipc).map_err(|why| damaged(format!("{why} (crc matches)")))? {
                    Frame::Push(push) => scan.pushes.push(push),
                    Frame::Checkpoint(state, _) if at == 0 => scan.checkpoint = Some(state),
                    Frame::Checkpoint(..) => {
                        return Err(damaged("a checkpoint after the first frame".into()))
                    }
                }
                at += len;
                continue;
            }
            Err(fault) => fault,
        };
        // Where a frame after this one could start: past its contents when
        // its envelope checks (they may hold any bytes), else anywhere.
        let from = match fault {
            Fault::Version(found) => {
                return Err(ScanError::Version {
                    offset: at as u64,
                    found,
                })
            }
            Fault::Contents { end, .. } => at.saturating_add(end),
            Fault::Envelope(_) => at + 1,
        };
        if let Some(next) = next_whole_frame(bytes, from) {
            return Err(damaged(format!(
                "{fault}; a whole frame follows at byte {next}"
            )));
        }
        break;
    }
    scan.good_bytes = at as u64;
    scan.discarded_bytes = (bytes.len() - at) as u64;
    Ok(scan)
}

/// A staged compaction that never swapped: the archive may hold the
/// pushes the live log still holds. Cut the archive back to its length
/// before, then drop the staged file.
pub(super) fn roll_back_compaction(fs: &dyn Storage, path: &Path) -> Result<(), PushLogError> {
    let staged = staged_path(path);
    if !fs.exists(&staged)? {
        return Ok(());
    }
    let bytes = fs.read(&staged)?;
    let corrupt = |why: String| PushLogError::Corrupt {
        path: staged.clone(),
        offset: 0,
        why,
    };
    if bytes.starts_with(&UNFRAMED_START) {
        return Err(PushLogError::Version {
            path: staged.clone(),
            offset: 0,
            found: 1,
        });
    }
    // A staged frame that does not check was cut before its fsync (the
    // archive is untouched); one that checks must be a checkpoint.
    let archive_len_before = match open_envelope(&bytes) {
        Ok((ipc, len)) if len == bytes.len() => match decode_contents(ipc) {
            Ok(Frame::Checkpoint(_, archive_len)) => Some(archive_len),
            Ok(Frame::Push(_)) => return Err(corrupt("a staged push, not a checkpoint".into())),
            Err(why) => return Err(corrupt(format!("{why} (crc matches)"))),
        },
        Ok((_, len)) => {
            return Err(corrupt(format!(
                "{} bytes after the staged checkpoint",
                bytes.len() - len
            )))
        }
        Err(Fault::Version(found)) => {
            return Err(PushLogError::Version {
                path: staged.clone(),
                offset: 0,
                found,
            })
        }
        Err(_) => None,
    };
    if let Some(archive_len) = archive_len_before {
        let archive = archive_path_of(path);
        if fs.exists(&archive)? {
            let f = fs.open(&archive, OpenMode::Write)?;
            if f.len()? > archive_len {
                f.set_len(archive_len)?;
                f.sync_all()?;
            }
        }
    }
    fs.remove(&staged)?;
    sync_parent_with(fs, path)?;
    tracing::warn!(path = %path.display(), "push log: rolled back an interrupted compaction");
    Ok(())
}

/// Finish a `retain_from` a crash interrupted, or drop its unfinished
/// staged file.
pub(super) fn finish_retain(fs: &dyn Storage, path: &Path) -> Result<(), PushLogError> {
    let erasing = beside(path, ".erasing");
    if fs.exists(&erasing)? {
        fs.remove(&erasing)?;
    }
    let erased = beside(path, ".erased");
    if !fs.exists(&erased)? {
        return Ok(());
    }
    match fs.remove(&archive_path_of(path)) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e.into()),
    }
    fs.rename(&erased, path)?;
    sync_parent_with(fs, path)?;
    Ok(())
}

/// The pushes of the reflog archive at `archive`, none when it is absent.
/// The archive is appended only inside a compaction, and `open` rolls back
/// one a crash interrupted, cutting the archive to its length before: it
/// has no torn tail, so bytes that do not check there are damage.
pub(super) fn read_archive(fs: &dyn Storage, archive: &Path) -> Result<Vec<Push>, PushLogError> {
    let bytes = match fs.read(archive) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e.into()),
    };
    let scan = scan_frames(&bytes).map_err(|e| e.in_file(archive))?;
    let damage = if scan.checkpoint.is_some() {
        Some((0, "a checkpoint in the reflog archive"))
    } else if scan.discarded_bytes > 0 {
        Some((scan.good_bytes, "a frame that does not check at its end"))
    } else {
        None
    };
    if let Some((offset, why)) = damage {
        return Err(PushLogError::Corrupt {
            path: archive.to_owned(),
            offset,
            why: why.into(),
        });
    }
    Ok(scan.pushes)
}
