//! The hostile client (`src/bin/twinlog-hostile`) against a real primary
//! daemon for 20 s with a fixed seed, a well-behaved client beside it:
//! every invariant it checks holds (the daemon never exits and restarts
//! clean, its RSS stays under the documented bound, the steady client's
//! p99 append stays under 100 ms, the log is never poisoned, every refusal
//! is named). And its negative control: the same client against a daemon
//! whose memory budget is off must break its memory bounds.

use std::process::Command;
use std::sync::Mutex;

/// One at a time: the control's load would spoil the other's latencies.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// Run the hostile client with `extra` flags; its exit and its report.
fn hostile(extra: &[&str]) -> (bool, serde_json::Value) {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = Command::new(env!("CARGO_BIN_EXE_twinlog-hostile"))
        .args(["--dir", dir.path().to_str().expect("utf-8")])
        .args(["--secs", "20", "--seed", "27"])
        .args(extra)
        .args([
            "--",
            env!("CARGO_BIN_EXE_twinlog-test-child"),
            "daemon",
            "primary",
        ])
        .arg("{config}")
        .output()
        .expect("run twinlog-hostile");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let report = stdout
        .lines()
        .last()
        .and_then(|l| serde_json::from_str(l).ok())
        .unwrap_or_else(|| {
            let log = std::fs::read_to_string(dir.path().join("primary.log")).unwrap_or_default();
            panic!(
                "no report: {stdout}\nstderr: {}\ndaemon log tail: {}",
                String::from_utf8_lossy(&out.stderr),
                &log[log.len().saturating_sub(4000)..]
            )
        });
    println!("{report}");
    (out.status.success(), report)
}

#[test]
fn a_hostile_client_breaks_no_invariant_beside_a_steady_one() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let (ok, report) = hostile(&[]);
    assert!(ok, "violations: {}", report["violations"]);
    assert!(
        report["acts"].as_u64().is_some_and(|n| n > 20),
        "the hostile client acted: {report}"
    );
    // It met the limits it was sent to meet, each by name.
    for name in [
        "Refused.TooLarge",
        "BodyStalled",
        "BodyTooSlow",
        "Forbidden",
    ] {
        assert!(
            report["named"][name].as_u64().is_some_and(|n| n > 0),
            "no {name} in {}",
            report["named"]
        );
    }
}

#[test]
fn with_the_budget_off_the_hostile_client_breaks_the_memory_bounds() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let (ok, report) = hostile(&["--sabotage", "budget-off"]);
    assert!(!ok, "the control passed: {report}");
    let violations = report["violations"].to_string();
    assert!(
        violations.contains("past the budget") || violations.contains("past the bound"),
        "{violations}"
    );
}
