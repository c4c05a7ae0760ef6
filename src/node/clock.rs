//! The node layer's one clock. The sans-IO cores take a [`Now`]; the node
//! layer builds it from tokio's clock, the same one its sleeps and
//! timeouts run on, so a core's deadline and the sleep that waits for it
//! agree, and a test that pauses tokio's time pauses both. Every deadline
//! and duration the node and the daemons measure on tokio's timer reads
//! [`instant`]; what sleeps on a thread instead reads the machine's clock
//! through [`crate::clock`], and stamps are [`unix_ms`].

pub use crate::repl::unix_ms;
use crate::repl::Now;

/// Now, on tokio's clock; `unix_ms` is the wall clock, for what is shown
/// and recorded, never for a deadline.
pub fn now() -> Now {
    Now {
        at: instant().into_std(),
        unix_ms: unix_ms(),
    }
}

/// The instant on tokio's clock: for deadlines awaited on tokio's timer
/// and for durations measured beside them.
pub fn instant() -> tokio::time::Instant {
    tokio::time::Instant::now()
}

/// When a core's loop wakes next: the core's deadline (`poll_timeout`), or
/// a second from now when it has none, to look again.
pub fn wake_at(deadline: Option<std::time::Instant>) -> tokio::time::Instant {
    deadline.map_or_else(
        || instant() + std::time::Duration::from_secs(1),
        tokio::time::Instant::from_std,
    )
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    #[tokio::test(start_paused = true)]
    async fn paused_time_moves_the_cores_clock() {
        let before = super::now();
        tokio::time::sleep(Duration::from_secs(30)).await;
        let after = super::now();
        assert_eq!(after.at.duration_since(before.at), Duration::from_secs(30));
    }
}
