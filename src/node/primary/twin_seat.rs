//! One twin session at a time.
//!
//! The pinned twin is one box, and it runs one connection at a time: a new
//! connection from it means the one this side still holds is dead or dying
//! (the twin restarted, or redialed after a blip this side has not noticed
//! yet). The new one takes the seat at once: the old connection is closed
//! with [`net::CLOSE_REPLACED`], and its session ends (and says why in the
//! status) before the new one reads its Hello, so two sessions never move
//! the twin's hold, acknowledgements or status at the same time. What the
//! hold becomes is then the new session's Hello's to say, as for any
//! session.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use quinn::Connection;
use tokio::sync::OwnedMutexGuard;

use crate::net;

/// How long a new connection waits for the replaced session to end. It
/// ends as soon as its closed connection fails its next read or write;
/// one that does not is not waited for longer.
const TEARDOWN: Duration = Duration::from_secs(2);

#[derive(Default)]
pub(super) struct TwinSeat {
    /// The connection in the seat.
    current: Mutex<Option<Connection>>,
    /// Held by the session in the seat for as long as it runs.
    running: Arc<tokio::sync::Mutex<()>>,
}

/// A session's hold on the seat, until it drops.
pub(super) struct Seated<'a> {
    seat: &'a TwinSeat,
    id: usize,
    _running: Option<OwnedMutexGuard<()>>,
}

impl TwinSeat {
    fn current(&self) -> std::sync::MutexGuard<'_, Option<Connection>> {
        self.current.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Seat `conn`: close the connection in the seat, and wait for its
    /// session to end.
    pub(super) async fn take(&self, conn: &Connection) -> Seated<'_> {
        let old = self.current().replace(conn.clone());
        if let Some(old) = old.filter(|old| old.close_reason().is_none()) {
            tracing::warn!(
                old = %old.remote_address(),
                new = %conn.remote_address(),
                "a new connection from the twin replaces the one held: closing the old one"
            );
            old.close(
                net::CLOSE_REPLACED.into(),
                b"replaced by a newer connection from the twin",
            );
        }
        let running = match tokio::time::timeout(TEARDOWN, self.running.clone().lock_owned()).await
        {
            Ok(guard) => Some(guard),
            Err(_) => {
                tracing::warn!(
                    "the replaced twin session did not end within {TEARDOWN:?}: going on without it"
                );
                None
            }
        };
        Seated {
            seat: self,
            id: conn.stable_id(),
            _running: running,
        }
    }
}

impl Seated<'_> {
    /// Whether a newer connection took the seat.
    pub(super) fn replaced(&self) -> bool {
        self.seat
            .current()
            .as_ref()
            .is_some_and(|c| c.stable_id() != self.id)
    }
}

impl Drop for Seated<'_> {
    fn drop(&mut self) {
        let mut current = self.seat.current();
        if current.as_ref().is_some_and(|c| c.stable_id() == self.id) {
            *current = None;
        }
    }
}
