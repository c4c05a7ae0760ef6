//! The primary's memory for request bodies and whole answers, bounded
//! whatever clients do: every buffer a request holds whole is charged to
//! one budget before it is allocated, and a request past it waits its turn
//! (within its body's deadline) instead of growing the process.
//!
//! Charged: an append's blob read whole (at most 1 MiB), a control
//! document (at most 16 MiB), and a streamed body's pieces in flight
//! (2 MiB). Objects are read out in pieces, a few at a time per stream,
//! and larger bodies are staged on disk (`stage`), so neither is charged.

use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The default budget: 512 MiB.
pub const DEFAULT_BUDGET_BYTES: u64 = 512 << 20;
/// What a streamed body holds at once: the pieces queued to its writer.
pub const STREAMED_BODY_BYTES: u64 = 2 << 20;

/// Charges are counted in KiB, so a budget of terabytes still fits the
/// semaphore's permit count.
const UNIT: u64 = 1024;

#[derive(Debug)]
pub struct Budget {
    sem: Arc<Semaphore>,
    units: u64,
}

impl Budget {
    pub fn new(bytes: u64) -> Budget {
        let units = (bytes / UNIT).clamp(1, Semaphore::MAX_PERMITS as u64);
        Budget {
            sem: Arc::new(Semaphore::new(units as usize)),
            units,
        }
    }

    /// Hold `bytes` of the budget until the permit drops; a charge larger
    /// than the whole budget takes all of it.
    pub async fn charge(&self, bytes: u64) -> OwnedSemaphorePermit {
        let units = bytes.div_ceil(UNIT).clamp(1, self.units);
        // The semaphore is never closed: it lives as long as the budget.
        match self.sem.clone().acquire_many_owned(units as u32).await {
            Ok(p) => p,
            Err(_) => unreachable_closed(),
        }
    }

    /// Bytes held now.
    pub fn in_use(&self) -> u64 {
        (self.units - self.sem.available_permits() as u64) * UNIT
    }
}

#[cold]
fn unreachable_closed() -> ! {
    // A semaphore is closed only by `close`, which nothing here calls.
    panic!("the memory budget's semaphore was closed")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn charges_past_the_budget_wait_for_earlier_ones() {
        let b = Budget::new(4 << 20);
        let first = b.charge(3 << 20).await;
        assert_eq!(b.in_use(), 3 << 20);
        let second = b.charge(2 << 20);
        tokio::pin!(second);
        assert!(
            futures_poll_once(&mut second).await.is_none(),
            "waits while the budget is held"
        );
        drop(first);
        let _second = second.await;
        assert_eq!(b.in_use(), 2 << 20);
        // A charge larger than the whole budget takes all of it.
        drop(_second);
        let all = b.charge(1 << 40).await;
        assert_eq!(b.in_use(), 4 << 20);
        drop(all);
    }

    async fn futures_poll_once<F: std::future::Future + Unpin>(f: &mut F) -> Option<F::Output> {
        use std::task::Poll;
        std::future::poll_fn(|cx| match std::pin::Pin::new(&mut *f).poll(cx) {
            Poll::Ready(v) => Poll::Ready(Some(v)),
            Poll::Pending => Poll::Ready(None),
        })
        .await
    }
}
