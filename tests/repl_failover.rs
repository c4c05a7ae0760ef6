//! Failover over a simulated link: two boxes through promotions, fences,
//! rejoins and switchovers, with faults in between. After every step the
//! cluster's checker reviews the whole run: a frame acknowledged `twin` is
//! on whichever box is the primary, two boxes never hold different frames
//! at one sequence of one epoch, a fenced primary acknowledges nothing,
//! and a rejoin saves exactly the frames past the fork before cutting
//! them. Scripted runs walk each path once; a property test walks random
//! schedules; deliberately broken runs show the checker catches each
//! broken promise.

use proptest::prelude::*;
use twinlog::repl::ack::NotAdmitted;
use twinlog::repl::cluster::{
    frame_ids, Cluster, Refused, RejoinError, Role, Sabotage, Side, Violation, Written,
};
use twinlog::repl::pair::{Fault, PairConfig};
use twinlog::repl::Refusal;

use Side::{A, B};

fn assert_clean(c: &Cluster) {
    let found = c.check();
    assert!(found.is_empty(), "{found:#?}\n{}", c.journal());
}

/// Write `n` frames to `side` and wait until each is answered.
fn write_acked(c: &mut Cluster, side: Side, n: usize, twin: bool) {
    for i in 0..n {
        let w = c.write(side, twin, 100 + i * 37);
        assert!(
            matches!(w, Written::Acknowledged(_) | Written::Waiting(_)),
            "{w:?}"
        );
    }
    c.advance(30);
}

fn twin_acked(c: &Cluster) -> usize {
    c.acknowledged().iter().filter(|a| a.twin).count()
}

/// A and B stream, five frames acknowledged `twin`; then the network
/// parts, A takes three `local` writes and one `twin` write that never
/// gets its twin, B is promoted and takes two writes of its own.
fn split_brain() -> Cluster {
    let mut c = Cluster::new(PairConfig::default());
    write_acked(&mut c, A, 5, true);
    assert_eq!(twin_acked(&c), 5);
    c.partition();
    for _ in 0..3 {
        assert!(matches!(c.write(A, false, 200), Written::Acknowledged(_)));
    }
    assert_eq!(c.write(A, true, 10), Written::Waiting(9));
    assert_eq!(c.promote(B, false), Ok(1));
    assert_eq!(c.write(B, false, 50), Written::Acknowledged(6));
    assert_eq!(c.write(B, false, 60), Written::Acknowledged(7));
    c.advance(20);
    assert_clean(&c);
    c.heal();
    c
}

#[test]
fn a_rejoin_saves_the_deposed_primarys_divergent_frames_cuts_them_and_follows() {
    let mut c = split_brain();
    let a_before = frame_ids(c.log(A));
    assert_eq!(c.rejoin(A, false), Ok(5));
    let r = c.rejoins().last().expect("a rejoin record");
    assert_eq!(r.saved.as_deref(), Some(&a_before[5..]));
    assert_eq!(r.after.as_deref(), Some(&a_before[..5]));
    assert_eq!(c.role(A), Role::Twin);
    assert_eq!(c.epochs(A).newest(), 1);
    assert_clean(&c);
    assert_eq!(c.settle(5_000), Ok(B));
    assert_eq!(frame_ids(c.log(A)), frame_ids(c.log(B)));
    assert_eq!(c.epochs(A).history, c.epochs(B).history);
    write_acked(&mut c, B, 3, true);
    assert_eq!(twin_acked(&c), 8);
    assert_clean(&c);
}

#[test]
fn a_rejoin_cut_short_after_its_save_is_finished_by_running_it_again() {
    let mut c = split_brain();
    let a_before = frame_ids(c.log(A));
    assert_eq!(c.rejoin(A, true), Ok(5));
    assert!(!c.is_up(A));
    assert_eq!(c.role(A), Role::Primary);
    assert_eq!(frame_ids(c.log(A)), a_before, "nothing was cut yet");
    assert_clean(&c);
    c.restart(A);
    assert!(c.epochs(A).fenced(), "the fence came before the save");
    assert_eq!(
        c.write(A, false, 10),
        Written::Refused(Refused::NotAdmitted(NotAdmitted::Fenced))
    );
    assert_eq!(c.rejoin(A, false), Ok(5));
    let saved: Vec<_> = c.rejoins().iter().map(|r| r.saved.clone()).collect();
    assert_eq!(saved, vec![Some(a_before[5..].to_vec()); 2]);
    assert_clean(&c);
    assert_eq!(c.settle(5_000), Ok(B));
    assert_clean(&c);
}

#[test]
fn a_promoted_twins_hello_fences_the_old_primary_which_then_acknowledges_nothing() {
    let mut c = Cluster::new(PairConfig::default());
    write_acked(&mut c, A, 4, true);
    assert_eq!(c.promote(B, true), Ok(1));
    assert!(c.epochs(A).fenced(), "StaleEpoch told A of epoch 1");
    assert_eq!(c.epochs(A).seen, 1);
    for twin in [false, true] {
        assert_eq!(
            c.write(A, twin, 10),
            Written::Refused(Refused::NotAdmitted(NotAdmitted::Fenced))
        );
    }
    assert_eq!(c.rejoin(A, false), Ok(4), "nothing to cut");
    assert_eq!(c.rejoins().last().and_then(|r| r.saved.clone()), None);
    assert_eq!(c.settle(5_000), Ok(B));
    assert_clean(&c);
}

#[test]
fn a_client_fences_a_stale_primary_that_took_local_writes_in_a_split_brain() {
    let mut c = split_brain();
    assert!(!c.epochs(A).fenced(), "nothing told A yet");
    c.client_fence(A);
    assert!(c.epochs(A).fenced());
    assert_eq!(
        c.write(A, false, 10),
        Written::Refused(Refused::NotAdmitted(NotAdmitted::Fenced))
    );
    // The newer primary refuses a rejoin the wrong way round, and its
    // Hello fences nothing that is not older.
    assert!(c.rejoin(B, false).is_err());
    assert!(!c.epochs(B).fenced());
    assert_clean(&c);
    assert_eq!(c.settle(5_000), Ok(B));
    assert_clean(&c);
}

#[test]
fn a_switchover_hands_over_every_acknowledged_frame_and_the_old_primary_follows() {
    let mut c = Cluster::new(PairConfig::default());
    write_acked(&mut c, A, 6, true);
    assert!(c.streaming());
    assert_eq!(c.switchover(A), Ok(()));
    assert_eq!(c.write(A, false, 10), Written::Refused(Refused::Paused));
    c.advance(30);
    assert_eq!(c.role(B), Role::Primary);
    assert_eq!(c.epochs(B).current(), 1);
    assert_eq!(c.role(A), Role::Twin);
    assert_eq!(c.epochs(A).seen, 1);
    assert_eq!(c.write(A, false, 10), Written::Refused(Refused::NotPrimary));
    c.advance(30);
    assert!(c.streaming(), "A follows B:\n{}", c.journal());
    write_acked(&mut c, B, 4, true);
    assert_eq!(twin_acked(&c), 10);
    assert_clean(&c);
    assert_eq!(c.settle(5_000), Ok(B));
}

#[test]
fn a_switchover_whose_answer_is_lost_fences_the_primary() {
    let mut c = Cluster::new(PairConfig::default());
    write_acked(&mut c, A, 3, true);
    assert_eq!(c.switchover(A), Ok(()));
    // The Handover reaches B, which takes over; its Promoted is lost with
    // the connection.
    c.advance(3);
    assert_eq!(c.role(B), Role::Primary, "{}", c.journal());
    c.inject(Fault::Cut);
    assert_eq!(c.role(A), Role::Primary);
    assert!(c.epochs(A).fenced(), "the outcome is unknown: fenced");
    assert_eq!(
        c.write(A, true, 10),
        Written::Refused(Refused::NotAdmitted(NotAdmitted::Fenced))
    );
    assert_clean(&c);
    assert_eq!(c.settle(5_000), Ok(B));
    assert_clean(&c);
}

#[test]
fn an_unanswered_handover_fences_with_no_epoch_the_new_primary_would_be_fenced_by() {
    let mut c = Cluster::new(PairConfig::default());
    write_acked(&mut c, A, 3, true);
    assert_eq!(c.switchover(A), Ok(()));
    c.advance(3);
    assert_eq!(c.role(B), Role::Primary, "{}", c.journal());
    // A client tells A of epoch 1 before A gives up on the answer, which
    // is lost.
    c.client_fence(A);
    assert_eq!(c.epochs(A).seen, 1);
    c.inject(Fault::DropControl);
    c.advance(1_100);
    assert_eq!(c.epochs(A).seen, 1, "fenced, with no epoch past 1");
    assert_eq!(c.rejoin(A, false), Ok(3));
    c.advance(50);
    assert!(
        !c.epochs(B).fenced(),
        "A's Hello fenced B:\n{}",
        c.journal()
    );
    assert!(c.streaming());
    assert_clean(&c);
}

#[test]
fn a_twin_promoted_before_it_held_a_frame_starts_another_history_the_old_primary_cannot_rejoin() {
    let mut c = Cluster::new(PairConfig::default());
    c.partition();
    assert_eq!(c.write(A, false, 100), Written::Acknowledged(1));
    assert_eq!(c.promote(B, false), Ok(1));
    assert_ne!(c.log(A).history(), c.log(B).history());
    assert_eq!(c.write(B, false, 100), Written::Acknowledged(1));
    c.heal();
    let before = frame_ids(c.log(A));
    assert!(matches!(
        c.rejoin(A, false),
        Err(RejoinError::Refused(Refusal::History { .. }))
    ));
    assert_eq!(frame_ids(c.log(A)), before, "nothing was cut");
    assert_eq!(c.role(A), Role::Primary);
    // The operator moves A's data aside and starts it as an empty twin.
    assert_eq!(c.start_afresh(A), Ok(()));
    assert_eq!(c.settle(5_000), Ok(B));
    assert_eq!(c.log(A).history(), c.log(B).history());
    assert_clean(&c);
}

// Deliberately broken runs: the checker names what broke.

#[test]
fn the_checker_catches_a_rejoin_that_cuts_without_saving() {
    let mut c = split_brain();
    let past_fork = frame_ids(c.log(A))[5..].to_vec();
    c.sabotage(Sabotage {
        skip_save: true,
        ..Sabotage::default()
    });
    assert_eq!(c.rejoin(A, false), Ok(5));
    let found = c.check();
    assert!(
        found.contains(&Violation::CutUnsaved {
            side: A,
            unsaved: past_fork.clone()
        }),
        "{found:#?}"
    );
    // The three `local` writes past the fork are gone for good.
    let lost = found
        .iter()
        .filter(|v| matches!(v, Violation::AcknowledgedLost { by: A, .. }))
        .count();
    assert_eq!(lost, 3, "{found:#?}");
}

#[test]
fn the_checker_catches_a_primary_that_ignores_its_fence() {
    let mut c = split_brain();
    c.client_fence(A);
    c.sabotage(Sabotage {
        ignore_fence: true,
        ..Sabotage::default()
    });
    let Written::Acknowledged(seq) = c.write(A, false, 10) else {
        panic!("the sabotaged primary acknowledges");
    };
    let found = c.check();
    assert!(
        found.iter().any(|v| matches!(
            v,
            Violation::FencedAcknowledged { frame, by: A, epoch: 0, seen: 1 } if frame.seq == seq
        )),
        "{found:#?}"
    );
}

#[test]
fn the_checker_catches_a_rejoin_that_keeps_its_tail_under_the_new_epochs() {
    let mut c = split_brain();
    c.sabotage(Sabotage {
        keep_tail: true,
        ..Sabotage::default()
    });
    assert_eq!(c.rejoin(A, false), Ok(5));
    let found = c.check();
    let differ: Vec<u64> = found
        .iter()
        .filter_map(|v| match v {
            Violation::SameEpochDifferentFrames { epoch: 1, a, .. } => Some(a.seq),
            _ => None,
        })
        .collect();
    assert_eq!(differ, vec![6, 7], "{found:#?}");
}

#[test]
fn the_checker_catches_a_twin_acknowledgement_the_new_primary_lacks() {
    let mut c = Cluster::new(PairConfig::default());
    write_acked(&mut c, A, 2, true);
    c.partition();
    c.sabotage(Sabotage {
        ack_twin_at_once: true,
        ..Sabotage::default()
    });
    assert_eq!(c.write(A, true, 10), Written::Acknowledged(3));
    assert_eq!(c.promote(B, false), Ok(1));
    let found = c.check();
    assert!(
        found.iter().any(|v| matches!(
            v,
            Violation::TwinAcknowledgedMissing { frame, primary: B, holds: None } if frame.seq == 3
        )),
        "{found:#?}"
    );
}

// Random schedules.

#[derive(Clone, Debug)]
enum Step {
    /// A client writes to the primary of the newest epoch, or with
    /// `stale` to the other box (a client that has not heard of the
    /// newest).
    Write {
        stale: bool,
        twin: bool,
        len: usize,
    },
    Advance(u64),
    Fault(Fault),
    Partition,
    Heal,
    Crash(Side, Option<u64>),
    Restart(Side),
    Promote(Side, bool),
    Rejoin(Side, bool),
    Switchover(Side),
    ClientFence(Side),
}

fn side() -> impl Strategy<Value = Side> {
    prop_oneof![Just(A), Just(B)]
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        16 => (prop::bool::weighted(0.25), any::<bool>(), 0usize..3000)
            .prop_map(|(stale, twin, len)| Step::Write { stale, twin, len }),
        8 => (1u64..60).prop_map(Step::Advance),
        1 => Just(Step::Fault(Fault::DropControl)),
        1 => Just(Step::Fault(Fault::DuplicateControl)),
        1 => (1u64..300).prop_map(|ms| Step::Fault(Fault::DelayControl(ms))),
        1 => any::<usize>().prop_map(|at| Step::Fault(Fault::CorruptData(at))),
        1 => Just(Step::Fault(Fault::Cut)),
        1 => Just(Step::Partition),
        2 => Just(Step::Heal),
        2 => (side(), prop::option::of(any::<u64>())).prop_map(|(s, k)| Step::Crash(s, k)),
        3 => side().prop_map(Step::Restart),
        1 => (side(), any::<bool>()).prop_map(|(s, dial)| Step::Promote(s, dial)),
        2 => (side(), prop::bool::weighted(0.2)).prop_map(|(s, cut)| Step::Rejoin(s, cut)),
        2 => side().prop_map(Step::Switchover),
        1 => side().prop_map(Step::ClientFence),
    ]
}

fn run(c: &mut Cluster, s: &Step) {
    // An operator step whose preconditions do not hold is refused, as the
    // commands are; the run goes on.
    match s {
        Step::Write { stale, twin, len } => {
            let primary = c.serving().unwrap_or(A);
            let at = if *stale { primary.other() } else { primary };
            c.write(at, *twin, *len);
        }
        Step::Advance(ms) => c.advance(*ms),
        Step::Fault(f) => c.inject(*f),
        Step::Partition => c.partition(),
        Step::Heal => c.heal(),
        Step::Crash(side, keep) => c.crash(*side, *keep),
        Step::Restart(side) => c.restart(*side),
        Step::Promote(side, dial) => {
            let _ = c.promote(*side, *dial);
        }
        Step::Rejoin(side, cut_short) => {
            let _ = c.rejoin(*side, *cut_short);
        }
        Step::Switchover(side) => {
            let _ = c.switchover(*side);
        }
        Step::ClientFence(side) => c.client_fence(*side),
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// Any schedule of writes, faults and operator steps keeps every
    /// promise at every step; then the operator's usual moves bring the
    /// boxes back to a primary and a twin holding the same log, still
    /// keeping every promise.
    #[test]
    fn every_promise_holds_through_failovers_fences_rejoins_and_switchovers(
        steps in prop::collection::vec(step(), 1..150),
        chunk in 50usize..3000,
        delay_ms in 1u64..8,
    ) {
        let delay = std::time::Duration::from_millis(delay_ms);
        let mut c = Cluster::new(PairConfig { chunk, delay, ..PairConfig::default() });
        for s in &steps {
            run(&mut c, s);
            let found = c.check();
            prop_assert!(found.is_empty(), "after {:?}: {:#?}\n{}", s, found, c.journal());
        }
        let settled = c.settle(20_000);
        prop_assert!(settled.is_ok(), "{:?}\n{}", settled, c.journal());
        let found = c.check();
        prop_assert!(found.is_empty(), "after settling: {:#?}\n{}", found, c.journal());
        prop_assert_eq!(frame_ids(c.log(A)), frame_ids(c.log(B)));
    }
}
