//! The replication cores driven over a simulated link: streaming, refusals
//! and random fault schedules, the twin's log always a prefix of the
//! primary's, no acknowledgement past the twin's durable head, and
//! convergence once the faults stop.

use std::time::Duration;

use proptest::prelude::*;
use twinlog::log::Kind;
use twinlog::repl::pair::{Fault, PairConfig, ReplPair};

fn blob(seq: u64, len: usize) -> Vec<u8> {
    (0..len).map(|i| (seq as usize * 13 + i) as u8).collect()
}

#[test]
fn a_fresh_twin_takes_the_history_and_follows_with_one_sync_per_batch() {
    let mut pair = ReplPair::new(PairConfig::default());
    assert_ne!(pair.primary().history(), pair.twin().history());
    for i in 0..50u64 {
        pair.append(Kind::Pack, "acme", &blob(i, (i as usize * 37) % 900));
    }
    pair.append(Kind::LfsPut, "acme", &blob(99, 20_000));
    assert!(pair.converge(5_000), "the twin converges");
    assert_eq!(pair.twin().history(), pair.primary().history());
    assert_eq!(pair.twin().head_seq(), 51);
    assert!(
        pair.twin().frame_syncs() < 51,
        "the twin syncs once per batch, not per frame: {} syncs",
        pair.twin().frame_syncs()
    );
    for i in 0..20u64 {
        pair.append(Kind::Refs, "acme", &blob(i, 10));
        pair.advance(1);
    }
    assert!(pair.converge(5_000));
    assert_eq!(pair.max_acked(), 71);
}

#[test]
fn a_frame_damaged_on_the_wire_is_refused_and_never_written() {
    let mut pair = ReplPair::new(PairConfig::default());
    pair.append(Kind::Pack, "acme", &blob(1, 100));
    assert!(pair.converge(5_000));
    for seq in 2..=10 {
        pair.append(Kind::Pack, "acme", &blob(seq, 3000));
    }
    pair.inject(Fault::CorruptData(1500));
    pair.advance(50);
    assert!(
        pair.closes.iter().any(|c| c.contains("bad frame")),
        "a named refusal: {:?}",
        pair.closes
    );
    pair.check_prefix();
    assert!(pair.converge(5_000));
}

#[test]
fn erased_frames_travel_as_erased() {
    let mut pair = ReplPair::new(PairConfig::default());
    for seq in 1..=6u64 {
        let repo = if seq % 2 == 0 { "gone" } else { "kept" };
        pair.append(Kind::Pack, repo, &blob(seq, 500));
    }
    pair.erase_on_primary(5, "gone");
    assert!(pair.converge(5_000));
    let e = pair.twin().read(2).expect("read");
    assert_eq!(e.kind().expect("kind"), Kind::Redacted);
    assert!(e.blob.is_empty());
    assert_eq!(pair.twin().read(3).expect("read").blob, blob(3, 500));
}

/// The primary ships a frame before its own sync: a power cut between the
/// two leaves the twin holding frames the primary lost. They were never
/// acknowledged; the next handshake has the twin cut them, and both logs
/// go on from the primary's head.
#[test]
fn frames_the_primary_lost_before_its_sync_are_cut_from_the_twin() {
    let mut pair = ReplPair::new(PairConfig::default());
    pair.append(Kind::Pack, "acme", &blob(1, 100));
    assert!(pair.converge(5_000));
    for seq in 2..=4 {
        pair.append(Kind::Pack, "acme", &blob(seq, 100));
    }
    // Past the link's delay, before the primary's sync.
    pair.advance(2);
    assert_eq!(pair.twin().head_seq(), 4, "the twin holds the frames");
    assert_eq!(
        pair.primary().head_seq(),
        1,
        "the primary has not synced them"
    );
    assert_eq!(pair.max_answered(), 1, "so none is acknowledged");
    pair.inject(Fault::RestartPrimary);
    assert_eq!(pair.primary().head_seq(), 1);
    // The primary goes on at its own numbers before the twin is back.
    pair.append(Kind::Pack, "acme", &blob(20, 300));
    assert!(
        pair.converge(5_000),
        "{:?} twin {} primary {}",
        pair.closes,
        pair.twin().head_seq(),
        pair.primary().head_seq()
    );
    assert!(
        pair.closes.iter().any(|c| c == "twin cut after 1"),
        "{:?}",
        pair.closes
    );
    assert_eq!(pair.twin().head_seq(), 2);
    assert_eq!(pair.twin().read(2).expect("read").blob, blob(20, 300));
    assert_eq!(pair.max_answered(), 2);
}

#[derive(Clone, Debug)]
enum Step {
    Append(usize),
    Advance(u64),
    Fault(Fault),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        6 => prop_oneof![4 => 0usize..400, 1 => 400usize..6000].prop_map(Step::Append),
        2 => (1u64..4).prop_map(Step::Advance),
        2 => (1u64..40).prop_map(Step::Advance),
        1 => Just(Step::Fault(Fault::DropControl)),
        1 => Just(Step::Fault(Fault::DuplicateControl)),
        1 => (1u64..300).prop_map(|ms| Step::Fault(Fault::DelayControl(ms))),
        1 => any::<usize>().prop_map(|at| Step::Fault(Fault::CorruptData(at))),
        1 => Just(Step::Fault(Fault::Cut)),
        1 => prop::option::of(any::<u64>()).prop_map(|k| Step::Fault(Fault::RestartTwin(k))),
        1 => Just(Step::Fault(Fault::RestartPrimary)),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Any schedule of faults: the pair asserts at every step that no ack
    /// passes the twin's durable head, that acknowledged frames survive
    /// either box's power cuts and that no cut takes one; here, that the
    /// twin stays a prefix of the primary (but for frames the primary lost
    /// before its sync, until they are cut) and converges once the faults
    /// stop.
    #[test]
    fn the_twin_is_a_prefix_and_converges_under_any_faults(
        steps in prop::collection::vec(step(), 1..80),
        chunk in 50usize..3000,
        primary_sync_ms in 0u64..12,
    ) {
        let mut pair = ReplPair::new(PairConfig {
            chunk,
            primary_sync: Duration::from_millis(primary_sync_ms),
            ..PairConfig::default()
        });
        for s in &steps {
            match s {
                Step::Append(len) => {
                    let seq = pair.primary().head_seq() + 1;
                    pair.append(Kind::Pack, "acme", &blob(seq, *len));
                }
                Step::Advance(ms) => pair.advance(*ms),
                Step::Fault(f) => pair.inject(*f),
            }
            pair.check_prefix();
        }
        prop_assert!(pair.converge(20_000), "no convergence: twin {} primary {}", pair.twin().head_seq(), pair.primary().head_seq());
        // Frames the primary lost before its sync were never answered;
        // everything it holds is, once the faults stop.
        prop_assert_eq!(pair.max_acked(), pair.primary().head_seq());
        prop_assert_eq!(pair.max_answered(), pair.primary().head_seq());
    }
}
