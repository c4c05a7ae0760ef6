//! Waiting on state: a condition checked every few milliseconds until it
//! holds, failing by name after a bound that only a broken system reaches.

use std::time::{Duration, Instant};

/// Until `cond` gives a value, checked every 10 ms; panics naming `what`
/// after `limit`.
pub fn until<T>(what: &str, limit: Duration, mut cond: impl FnMut() -> Option<T>) -> T {
    let by = Instant::now() + limit;
    loop {
        if let Some(v) = cond() {
            return v;
        }
        assert!(Instant::now() < by, "still not {what} after {limit:?}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    #[test]
    fn a_condition_that_comes_true_ends_the_wait_with_its_value() {
        let mut n = 0;
        let got = super::until("counted to 3", Duration::from_secs(5), || {
            n += 1;
            (n == 3).then_some(n)
        });
        assert_eq!(got, 3);
    }

    #[test]
    #[should_panic(expected = "still not never")]
    fn a_condition_that_never_holds_fails_by_name() {
        super::until("never", Duration::from_millis(30), || None::<()>);
    }
}
