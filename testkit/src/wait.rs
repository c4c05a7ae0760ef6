//! Waiting on state: a condition checked every few milliseconds until it
//! holds, failing by name after a bound that only a broken system reaches.

use std::time::{Duration, Instant};

/// How often [`until`] and [`until_blocking`] look.
pub const EVERY: Duration = Duration::from_millis(5);

/// Until `cond` gives a value, checked every [`EVERY`]; panics naming
/// `what` after `limit`.
pub async fn until<T>(what: &str, limit: Duration, cond: impl FnMut() -> Option<T>) -> T {
    poll(what, limit, EVERY, cond).await
}

/// Until `cond` gives a value, checked every `every`; panics naming
/// `what` after `limit`.
pub async fn poll<T>(
    what: &str,
    limit: Duration,
    every: Duration,
    mut cond: impl FnMut() -> Option<T>,
) -> T {
    let by = Instant::now() + limit;
    loop {
        if let Some(v) = cond() {
            return v;
        }
        assert!(Instant::now() < by, "still not {what} after {limit:?}");
        tokio::time::sleep(every).await;
    }
}

/// [`until`] for a thread that is not in a runtime.
pub fn until_blocking<T>(what: &str, limit: Duration, mut cond: impl FnMut() -> Option<T>) -> T {
    let by = Instant::now() + limit;
    loop {
        if let Some(v) = cond() {
            return v;
        }
        assert!(Instant::now() < by, "still not {what} after {limit:?}");
        std::thread::sleep(EVERY);
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    #[test]
    fn a_condition_that_comes_true_ends_the_wait_with_its_value() {
        let mut n = 0;
        let got = super::until_blocking("counted to 3", Duration::from_secs(5), || {
            n += 1;
            (n == 3).then_some(n)
        });
        assert_eq!(got, 3);
    }

    #[test]
    #[should_panic(expected = "still not never")]
    fn a_condition_that_never_holds_fails_by_name() {
        super::until_blocking("never", Duration::from_millis(30), || None::<()>);
    }
}
