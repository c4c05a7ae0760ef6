//! A streamed body reaches its writer whole or not at all: every body past
//! what is read whole into memory is staged in an unnamed file first, and
//! the log's writer (or the store) is taken only once every byte is in
//! hand. A client that stalls or trickles mid-body then holds nothing but
//! its own staging space until it is cut off; the other writers never wait
//! on it, and no thread waits on it either: each piece is written to the
//! file by a short task of its own once it has arrived.
//!
//! The staging file is opened with `O_TMPFILE` in the log's directory, so
//! it has no name and a crash leaves nothing behind. Where the file system
//! cannot do that, it gets a `.tmp` name that is unlinked at once (and that
//! the log's open removes, should a crash fall between the two). It is
//! never synced: its pages are dropped, unwritten, when it closes.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use bytes::Bytes;

use super::body::Body;
use super::pool::ClientPool;
use super::shares::{Holder, Share, Shares, Split};
use super::PIECE;
use crate::node::api::ApiError;
use crate::node::WriteRefusal;
use crate::storage::{Cursor, OpenMode, StdStorage, Storage};

/// The largest body taken by default (all of it staged).
pub const DEFAULT_STAGE_MAX_BYTES: u64 = 1 << 30;
/// The staging space all bodies share by default.
pub const DEFAULT_STAGING_BYTES: u64 = 2 << 30;

/// Pieces gathered before one write to the staging file.
const WRITE_BYTES: u64 = 1 << 20;

/// Where bodies wait for their writer, and how much of that there is.
#[derive(Debug)]
pub(super) struct Staging {
    dir: PathBuf,
    max_body: u64,
    space: Shares,
}

impl Staging {
    /// Staging in `dir` for bodies up to `max_body` bytes, `space` bytes
    /// of them at once, shared among clients (one client may hold half of
    /// it, or one largest body when that is more).
    pub(super) fn new(dir: &Path, max_body: u64, space: u64) -> Staging {
        let space = space.max(1);
        let max_body = max_body.min(space);
        Staging {
            dir: dir.to_owned(),
            max_body,
            space: Shares::new(Split::of(space, (space / 2).max(max_body))),
        }
    }

    /// The largest body taken.
    pub(super) fn max_body(&self) -> u64 {
        self.max_body
    }

    /// Bytes of staging held now.
    pub(super) fn in_use(&self) -> u64 {
        self.space.in_use()
    }

    /// `holder`'s part of the staging space.
    pub(super) fn share(&self, holder: &Holder) -> Share {
        self.space.share(holder)
    }

    /// Stage the body whole, then hand it to `write` on a blocking thread
    /// as an iterator of pieces. The outer error is why the body did not
    /// arrive whole or could not be staged (then `write` did not run); the
    /// inner result is `write`'s.
    pub(super) async fn feed<T, E>(
        &self,
        share: &Share,
        pool: &ClientPool,
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
        let _space = match len {
            0 => None,
            _ => Some(share.charge(len).await),
        };
        body.resume();
        let dir = self.dir.clone();
        let mut file = pool
            .run(move || stage_file(&dir))
            .await
            .map_err(stopped)?
            .map_err(staging_failed)?;
        let mut pieces: Vec<Bytes> = first.into_iter().collect();
        loop {
            let mut gathered: u64 = pieces.iter().map(|p| p.len() as u64).sum();
            let mut whole = false;
            while gathered < WRITE_BYTES {
                match body.next().await? {
                    Some(p) => {
                        gathered += p.len() as u64;
                        pieces.push(p);
                    }
                    None => {
                        whole = true;
                        break;
                    }
                }
            }
            let batch = std::mem::take(&mut pieces);
            file = pool
                .run(move || -> std::io::Result<Cursor> {
                    for p in batch {
                        file.write_all(&p)?;
                    }
                    Ok(file)
                })
                .await
                .map_err(stopped)?
                .map_err(staging_failed)?;
            if whole {
                break;
            }
        }
        let written = pool
            .run(move || -> Result<Result<T, E>, ApiError> {
                let mut pieces = StagedPieces {
                    file: Cursor::new(file.file().clone()),
                    left: len,
                    failed: None,
                };
                let written = write(&mut pieces);
                match pieces.failed {
                    Some(e) => Err(staging_failed(e)),
                    None => Ok(written),
                }
            })
            .await
            .map_err(stopped)?;
        written
    }
}

fn stopped(e: tokio::task::JoinError) -> ApiError {
    ApiError::Refused(WriteRefusal::Stopping {
        why: format!("the body's writer failed: {e}"),
    })
}

fn staging_failed(e: std::io::Error) -> ApiError {
    match crate::node::refusal::io_refusal(&e) {
        full @ WriteRefusal::NoSpace { .. } => ApiError::Refused(full),
        _ => ApiError::Refused(WriteRefusal::Staging { why: e.to_string() }),
    }
}

/// An unnamed file in `dir` (see [`OpenMode::Unnamed`]), written from its
/// start. On the real disk, which the log's directory is.
fn stage_file(dir: &Path) -> std::io::Result<Cursor> {
    Ok(Cursor::new(StdStorage.open(dir, OpenMode::Unnamed)?))
}

/// A staged body read back in pieces; a read that fails ends the pieces
/// early (the writer refuses the short body) and is kept to report.
struct StagedPieces {
    file: Cursor,
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
        assert_eq!(
            StdStorage.list(dir.path()).expect("list").len(),
            0,
            "nothing is left under a name"
        );
        let pieces = StagedPieces {
            file: Cursor::new(f.file().clone()),
            left: body.len() as u64,
            failed: None,
        };
        let back: Vec<u8> = pieces.flat_map(|b| b.to_vec()).collect();
        assert_eq!(back, body);
    }
}
