//! The blocking threads clients' requests may use at once. Each task a
//! client's request runs on the blocking pool (a piece read from the log
//! or the store, a piece written to a staging file, a store write) is
//! short and never waits on the client; and at most [`CLIENT_THREADS`]
//! run at once, so however many requests clients pile up, the pool keeps
//! its threads for replication, the store and the twin's handshake.

use std::sync::Arc;

use tokio::sync::Semaphore;
use tokio::task::JoinError;

/// Blocking tasks of clients' requests running at once, at most; tokio's
/// pool holds up to 512 threads.
pub const CLIENT_THREADS: usize = 32;

#[derive(Debug)]
pub(super) struct ClientPool(Arc<Semaphore>);

impl Default for ClientPool {
    fn default() -> Self {
        ClientPool(Arc::new(Semaphore::new(CLIENT_THREADS)))
    }
}

impl ClientPool {
    /// Run `f` on the blocking pool once one of the clients' places is
    /// free.
    pub(super) async fn run<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, JoinError> {
        // The semaphore is never closed: it lives as long as this.
        let place = self.0.clone().acquire_owned().await;
        tokio::task::spawn_blocking(move || {
            let _place = place;
            f()
        })
        .await
    }
}
