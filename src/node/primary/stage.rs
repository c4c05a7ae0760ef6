//! A streamed body reaches its writer whole or not at all: a body up to a
//! bound is staged in an unnamed file first, and the log's writer (or the
//! store) is taken only once every byte is in hand. A client that stalls
//! mid-body then holds nothing but its own staging space, and is cut off
//! after the piece deadline as before; the other writers never wait on it.
//!
//! A body past the bound streams into its writer as it arrives, each piece
//! within the deadline: staging it would double its disk traffic, and a
//! body that large is a bulk load whose client sends at speed.
//!
//! The staging file is opened with `O_TMPFILE` in the log's directory, so
//! it has no name and a crash leaves nothing behind. Where the file system
//! cannot do that, it gets a `.tmp` name that is unlinked at once (and that
//! the log's open removes, should a crash fall between the two). It is
//! never synced: its pages are dropped, unwritten, when it closes.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use tokio::sync::mpsc;

use super::body::Body;
use super::budget::Budget;
use super::PIECE;
use crate::node::api::ApiError;
use crate::node::WriteRefusal;

/// Bodies up to this size are staged by default.
pub const DEFAULT_STAGE_MAX_BYTES: u64 = 64 << 20;
/// The staging space all bodies share by default.
pub const DEFAULT_STAGING_BYTES: u64 = 1 << 30;

/// What the async side hands the blocking side.
enum Piece {
    Bytes(Bytes),
    /// The whole body arrived.
    End,
}

/// Where bodies wait for their writer, and how much of that there is.
#[derive(Debug)]
pub(super) struct Staging {
    dir: PathBuf,
    max_body: u64,
    space: Budget,
}

impl Staging {
    /// Staging in `dir` for bodies up to `max_body` bytes (0: none is
    /// staged), `space` bytes of them at once.
    pub(super) fn new(dir: &Path, max_body: u64, space: u64) -> Staging {
        Staging {
            dir: dir.to_owned(),
            max_body: max_body.min(space),
            space: Budget::new(space.max(1)),
        }
    }

    /// Bytes of staging held now.
    pub(super) fn in_use(&self) -> u64 {
        self.space.in_use()
    }

    /// Hand `len` bytes of `recv` to `write` on a blocking thread, as an
    /// iterator of pieces: after the whole body is staged when it is small
    /// enough, else as the pieces arrive. The outer error is why the body
    /// did not arrive whole (then `write` ran on a short body, which it
    /// must refuse, or did not run at all); the inner result is `write`'s.
    pub(super) async fn feed<T, E>(
        &self,
        mut body: Body<'_>,
        write: impl FnOnce(&mut dyn Iterator<Item = Bytes>) -> Result<T, E> + Send + 'static,
    ) -> Result<Result<T, E>, ApiError>
    where
        T: Send + 'static,
        E: Send + 'static,
    {
        let len = body.expected();
        // The first piece is awaited before anything is held: a client
        // that announces a body and sends nothing costs nothing.
        let first = body.next().await?;
        let staged = len > 0 && len <= self.max_body;
        let _space = match staged {
            true => Some(self.space.charge(len).await),
            false => None,
        };
        let (tx, mut rx) = mpsc::channel::<Piece>(4);
        let dir = self.dir.clone();
        let worker = tokio::task::spawn_blocking(move || -> Result<Result<T, E>, ApiError> {
            if staged {
                let mut file = stage_file(&dir).map_err(staging_failed)?;
                loop {
                    match rx.blocking_recv() {
                        Some(Piece::Bytes(b)) => file.write_all(&b).map_err(staging_failed)?,
                        Some(Piece::End) => break,
                        // Cut off: `write` never sees the body.
                        None => {
                            return Err(ApiError::Refused(WriteRefusal::Staging {
                                why: "the body was cut off".into(),
                            }))
                        }
                    }
                }
                file.seek(SeekFrom::Start(0)).map_err(staging_failed)?;
                let mut pieces = StagedPieces {
                    file,
                    left: len,
                    failed: None,
                };
                let written = write(&mut pieces);
                match pieces.failed {
                    Some(e) => Err(staging_failed(e)),
                    None => Ok(written),
                }
            } else {
                let mut pieces = std::iter::from_fn(|| match rx.blocking_recv() {
                    Some(Piece::Bytes(b)) => Some(b),
                    Some(Piece::End) | None => None,
                });
                Ok(write(&mut pieces))
            }
        });
        let mut piece = first;
        let mut cut = None;
        loop {
            let msg = match piece {
                Some(b) => Piece::Bytes(b),
                None => Piece::End,
            };
            let end = matches!(msg, Piece::End);
            if tx.send(msg).await.is_err() || end {
                break;
            }
            piece = match body.next().await {
                Ok(p) => p,
                Err(e) => {
                    cut = Some(e);
                    break;
                }
            };
        }
        drop(tx);
        let done = worker.await;
        if let Some(e) = cut {
            return Err(e);
        }
        match done {
            Ok(r) => r,
            Err(e) => Err(ApiError::Refused(WriteRefusal::Stopping {
                why: format!("the body's writer failed: {e}"),
            })),
        }
    }
}

fn staging_failed(e: std::io::Error) -> ApiError {
    match crate::node::refusal::io_refusal(&e) {
        full @ WriteRefusal::NoSpace { .. } => ApiError::Refused(full),
        _ => ApiError::Refused(WriteRefusal::Staging { why: e.to_string() }),
    }
}

/// An unnamed file in `dir`, or one whose name is gone at once.
fn stage_file(dir: &Path) -> std::io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    let unnamed = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .mode(0o600)
        .custom_flags(libc::O_TMPFILE)
        .open(dir);
    match unnamed {
        Ok(f) => Ok(f),
        // Older kernels and some file systems have no O_TMPFILE.
        Err(e) if matches!(e.raw_os_error(), Some(libc::EOPNOTSUPP | libc::EISDIR)) => {
            static NEXT: AtomicU64 = AtomicU64::new(0);
            let n = NEXT.fetch_add(1, Ordering::Relaxed);
            let path = dir.join(format!("staging-{}-{n}.tmp", std::process::id()));
            let f = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&path)?;
            std::fs::remove_file(&path)?;
            Ok(f)
        }
        Err(e) => Err(e),
    }
}

/// A staged body read back in pieces; a read that fails ends the pieces
/// early (the writer refuses the short body) and is kept to report.
struct StagedPieces {
    file: File,
    left: u64,
    failed: Option<std::io::Error>,
}

impl Iterator for StagedPieces {
    type Item = Bytes;

    fn next(&mut self) -> Option<Bytes> {
        if self.left == 0 || self.failed.is_some() {
            return None;
        }
        let n = (PIECE as u64).min(self.left) as usize;
        let mut buf = vec![0u8; n];
        match self.file.read_exact(&mut buf) {
            Ok(()) => {
                self.left -= n as u64;
                Some(Bytes::from(buf))
            }
            Err(e) => {
                self.failed = Some(e);
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_staging_file_has_no_name_and_reads_back_what_was_written() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut f = stage_file(dir.path()).expect("stage");
        let body: Vec<u8> = (0..PIECE * 2 + 17).map(|i| i as u8).collect();
        f.write_all(&body).expect("write");
        f.seek(SeekFrom::Start(0)).expect("seek");
        assert_eq!(
            std::fs::read_dir(dir.path()).expect("list").count(),
            0,
            "nothing is left under a name"
        );
        let pieces = StagedPieces {
            file: f,
            left: body.len() as u64,
            failed: None,
        };
        let back: Vec<u8> = pieces.flat_map(|b| b.to_vec()).collect();
        assert_eq!(back, body);
    }
}
