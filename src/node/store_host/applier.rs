//! The follower's applier: a thread that keeps the store caught up with
//! the log's durable head.

use std::sync::Arc;

use super::{StoreHost, STALL_RETRY, STALL_RETRY_CAP};

/// Keeps a follower's store applied up to its durable head: a thread woken
/// after each durable batch, which catches up with whatever is durable by
/// then, so a burst of batches costs one catch-up.
pub struct Applier {
    wake: std::sync::mpsc::SyncSender<()>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// Wakes an [`Applier`]; cheap to clone into the task that watches the
/// durable head.
#[derive(Clone)]
pub struct ApplierWaker(std::sync::mpsc::SyncSender<()>);

impl ApplierWaker {
    /// Frames became durable.
    pub fn wake(&self) {
        // A full channel means a catch-up is already due.
        let _ = self.0.try_send(());
    }
}

impl Applier {
    /// Start the thread. A frame that does not apply stops the store there,
    /// not the thread: it is shown in [`StoreHost::health`] and tried again
    /// with a capped backoff (a shortage of descriptors or space passes),
    /// at every wake, and at once on an operator's retry; a StoreSkip frame
    /// that names it lets it pass.
    pub fn start(host: Arc<StoreHost>) -> std::io::Result<Applier> {
        let (wake, rx) = std::sync::mpsc::sync_channel::<()>(1);
        let thread = std::thread::Builder::new()
            .name("store-applier".into())
            .spawn(move || {
                use std::sync::mpsc::RecvTimeoutError;
                use tokio::time::Instant;
                let mut backoff = STALL_RETRY;
                // While stalled: when the next try is due. New frames (a
                // StoreSkip among them) bring it to a second after the last
                // try; with none, the wait doubles up to the cap.
                let mut stalled: Option<(Instant, Instant)> = None; // (last try, next try)
                loop {
                    let woke = match stalled {
                        None => rx.recv().map_err(|_| RecvTimeoutError::Disconnected),
                        Some((_, next)) => rx.recv_timeout(
                            next.saturating_duration_since(crate::node::clock::instant()),
                        ),
                    };
                    match woke {
                        Err(RecvTimeoutError::Disconnected) => break,
                        Ok(()) => {
                            if let Some((last, next)) = stalled.as_mut() {
                                *next = (*next).min(*last + STALL_RETRY);
                                if crate::node::clock::instant() < *next {
                                    continue;
                                }
                            }
                        }
                        Err(RecvTimeoutError::Timeout) => {}
                    }
                    match host.retry() {
                        Ok(_) => {
                            stalled = None;
                            backoff = STALL_RETRY;
                        }
                        Err(e) => {
                            if stalled.is_none() {
                                tracing::error!(error = %e, "the store stopped applying the log");
                            }
                            let now = crate::node::clock::instant();
                            stalled = Some((now, now + backoff));
                            backoff = (backoff * 2).min(STALL_RETRY_CAP);
                        }
                    }
                }
                // The last wake may have raced the stop: apply what is
                // durable before the store closes.
                if let Err(e) = host.catch_up() {
                    tracing::error!(error = %e, "the store's last catch-up failed");
                }
            })?;
        Ok(Applier {
            wake,
            thread: Some(thread),
        })
    }

    pub fn waker(&self) -> ApplierWaker {
        ApplierWaker(self.wake.clone())
    }

    /// Frames became durable.
    pub fn wake(&self) {
        let _ = self.wake.try_send(());
    }

    /// Stop once every waker is gone, after a last catch-up, and wait: the
    /// store's files are closed when this returns.
    pub fn stop(mut self) {
        let (dead, _) = std::sync::mpsc::sync_channel(1);
        drop(std::mem::replace(&mut self.wake, dead));
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
