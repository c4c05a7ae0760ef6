//! Crash an operation on a simulated disk at every sync it makes, and
//! fail every write and every fsync it makes, one at a time; check each
//! state a reopen finds against the states before and after an uncrashed
//! run.

use std::fmt::Debug;

use twinlog::storage::{CrashMode, SimStorage};

/// What crashing one operation everywhere covered.
#[derive(Debug, Default)]
pub struct Coverage {
    pub syncs: u64,
    pub writes: u64,
    /// Crash states checked: every sync crashed, with and without a prefix
    /// of the unsynced writes kept, every write and fsync failed (reopened
    /// live and after a power cut), and a power cut once it returned.
    pub states: u64,
    pub violations: Vec<String>,
}

/// Fixed seeds for the torn crashes: each keeps a different prefix of
/// every file's unsynced writes. One keeps the suite small: a redb open
/// costs milliseconds, and every crash state opens the store twice.
const TORN_SEEDS: [u64; 1] = [7];

/// Run `op` on a disk `setup` prepared, crashing and failing it at every
/// step, and check each reopened state (`observe`) against the states
/// before and after an uncrashed run.
pub fn crash_everywhere<S: PartialEq + Debug>(
    setup: &dyn Fn(&SimStorage),
    op: &dyn Fn(&SimStorage) -> Result<(), String>,
    observe: &dyn Fn(&SimStorage) -> Result<S, String>,
) -> Coverage {
    crash_everywhere_with(setup, op, observe, true)
}

/// [`crash_everywhere`], for an `observe` that sees the operation
/// (`changes`) or one that sees only what a replay makes of it.
pub fn crash_everywhere_with<S: PartialEq + Debug>(
    setup: &dyn Fn(&SimStorage),
    op: &dyn Fn(&SimStorage) -> Result<(), String>,
    observe: &dyn Fn(&SimStorage) -> Result<S, String>,
    changes: bool,
) -> Coverage {
    let base = SimStorage::new();
    setup(&base);
    let fresh = || base.fork();
    let before = observe(&fresh()).expect("the state before opens");
    let fs = fresh();
    let (syncs0, writes0) = (fs.syncs(), fs.writes());
    op(&fs).expect("the uncrashed operation");
    let mut cov = Coverage {
        syncs: fs.syncs() - syncs0,
        writes: fs.writes() - writes0,
        ..Coverage::default()
    };
    let after = observe(&fs).expect("the state after opens");
    assert_eq!(
        before != after,
        changes,
        "whether the operation changes what is observed"
    );

    // Counts the state and answers what is wrong with it, if anything.
    let states = std::cell::Cell::new(0u64);
    let check = |fs: &SimStorage, what: String| -> Option<String> {
        states.set(states.get() + 1);
        match observe(fs) {
            Ok(s) if s == before || s == after => None,
            Ok(s) => Some(format!(
                "{what}: neither before nor after: {s:?}\nbefore {before:?}\nafter {after:?}"
            )),
            Err(e) => Some(format!("{what}: reopen failed: {e}")),
        }
    };
    let mut violations = Vec::new();

    // Durable when it returns: a power cut right after keeps it.
    let fs = fresh();
    op(&fs).expect("the uncrashed operation");
    fs.crash(CrashMode::LoseUnsynced);
    violations.extend(check(&fs, "a power cut after it returned".into()));

    for k in 1..=cov.syncs {
        let modes = std::iter::once(CrashMode::LoseUnsynced)
            .chain(TORN_SEEDS.iter().map(|&s| CrashMode::KeepPrefix(s)));
        for mode in modes {
            let fs = fresh();
            fs.crash_at_sync(k);
            let _ = op(&fs);
            assert!(fs.has_crashed(), "sync {k} of {} crashed", cov.syncs);
            fs.crash(mode);
            violations.extend(check(&fs, format!("crash at sync {k} ({mode:?})")));
        }
    }
    type Arm = fn(&SimStorage, u64);
    let failures: [(&str, u64, Arm); 2] = [
        ("write", cov.writes, |fs, k| fs.fail_write_in(k)),
        ("fsync", cov.syncs, |fs, k| fs.fail_sync_in(k)),
    ];
    for (what, n, arm) in failures {
        for k in 1..=n {
            let fs = fresh();
            arm(&fs, k);
            // A failure the operation could not report (one in a close,
            // after it returned) must have cost nothing it acknowledged.
            let acknowledged = op(&fs).is_ok();
            let mut check_failed = |fs: &SimStorage, how: &str| {
                let what = format!("failed {what} {k} of {n}, {how}");
                if acknowledged {
                    states.set(states.get() + 1);
                    match observe(fs) {
                        Ok(s) if s == after => {}
                        Ok(s) => violations.push(format!(
                            "{what}: acknowledged, and the state is not after it: {s:?}"
                        )),
                        Err(e) => violations.push(format!("{what}: reopen failed: {e}")),
                    }
                } else {
                    violations.extend(check(fs, what));
                }
            };
            check_failed(&fs, "reopened");
            fs.crash(CrashMode::LoseUnsynced);
            check_failed(&fs, "then a power cut");
        }
    }
    cov.states = states.get();
    cov.violations = violations;
    cov
}

pub fn assert_clean(what: &str, cov: &Coverage) {
    assert!(
        cov.syncs > 0,
        "{what}: the operation makes something durable"
    );
    assert!(
        cov.violations.is_empty(),
        "{what}: {} of {} crash states are neither before nor after:\n{}",
        cov.violations.len(),
        cov.states,
        cov.violations.join("\n")
    );
    eprintln!(
        "{what}: {} syncs, {} writes, {} crash states",
        cov.syncs, cov.writes, cov.states
    );
}
