//! The primary's restart head, kept across restarts until a twin says
//! hello: frames are shipped before they are durable here, so after a
//! crash the twin may hold frames past the head this log came back at.
//! The handshake cuts them from the twin ([`crate::repl::Refusal::LostOnPrimary`]),
//! after checking its frame at the restart head. A second crash before
//! any twin said hello must not raise that head past frames the twin holds
//! from before the first: the lowest one is kept in a file until then.

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering::SeqCst;

use super::Primary;
use crate::node::retention::{parse_seq_file, seq_file_bytes};

impl Primary {
    /// Keep the restart head in `path` (the data directory's
    /// `RESTART_FLOOR`): the lower of the head this log opened at and the
    /// one a restart before left there, durably, before anything is shipped.
    pub fn set_restart_floor(&self, path: PathBuf) -> std::io::Result<()> {
        let here = self.restart_head.load(SeqCst);
        let floor = match read(&path) {
            Some(left) if left < here => {
                tracing::warn!(
                    left,
                    head = here,
                    "no twin said hello since an earlier restart: its frames past {left} are checked against this log"
                );
                left
            }
            _ => here,
        };
        crate::publish::publish(&path, &seq_file_bytes(floor))?;
        self.restart_head.store(floor, SeqCst);
        *self.restart_floor.lock().unwrap_or_else(|e| e.into_inner()) = Some(path);
        Ok(())
    }

    /// A twin said hello and streams: its log is a prefix of this one, so
    /// only a later crash can leave it ahead, and that crash's restart head
    /// is the one to keep.
    pub(super) fn twin_reconciled(&self) {
        let path = self
            .restart_floor
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(path) = path {
            let removed =
                std::fs::remove_file(&path).and_then(|()| crate::publish::sync_parent(&path));
            if let Err(e) = removed {
                if e.kind() != std::io::ErrorKind::NotFound {
                    tracing::warn!(path = %path.display(), error = %e, "removing the restart floor");
                }
            }
        }
    }
}

/// The floor a restart left, if it reads: one that does not is ignored,
/// which can only make the twin's check at the restart head fail (a
/// refusal by name), never cut more.
fn read(path: &Path) -> Option<u64> {
    let b = std::fs::read(path).ok()?;
    parse_seq_file(&b).or_else(|| {
        tracing::warn!(path = %path.display(), "the restart floor does not check: ignored");
        None
    })
}
