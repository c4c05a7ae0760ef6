//! Failover over a simulated link: two boxes through restarts, power cuts,
//! promotions, fences, rejoins and switchovers, with the production
//! machines deciding every step. Clients write blobs from a small alphabet
//! (an empty one among them), so crcs collide all the time; the checker
//! tells frames apart by the write that made them. After every step it
//! reviews the whole run: a frame acknowledged `twin` is on whichever box
//! is the primary, two boxes never hold different writes at one sequence
//! of one epoch, a twin streams a prefix of its primary, a fenced primary
//! acknowledges nothing, and a rejoin saves exactly the frames past the
//! fork before cutting them. Scripted runs walk each path once, with a
//! crash at every step; a property test walks random schedules; and
//! deliberately broken runs (each undoing one rule) show the checker
//! catches the loss each rule prevents.

use proptest::prelude::*;
use twinlog::repl::ack::NotAdmitted;
use twinlog::repl::cluster::{
    Cluster, PromoteError, Refused, RejoinError, Role, Sabotage, Side, Violation, Written,
    PROMOTE_QUIET, SWITCHOVER_WAIT,
};
use twinlog::repl::epochs::{term, LIFE_BITS};
use twinlog::repl::pair::{Fault, PairConfig};
use twinlog::repl::rejoin::RejoinRefusal;
use twinlog::repl::Refusal;

use Side::{A, B};

const T1: u64 = 1 << LIFE_BITS;

fn assert_clean(c: &Cluster) {
    let found = c.check();
    assert!(found.is_empty(), "{found:#?}\n{}", c.journal());
}

/// Write `n` frames to `side`, the blobs cycling through the alphabet,
/// and give them time to be answered.
fn write_n(c: &mut Cluster, side: Side, n: usize, twin: bool) {
    for i in 0..n {
        let w = c.write(side, twin, i as u8);
        assert!(matches!(w, Written::Appended(_)), "{w:?}\n{}", c.journal());
    }
    c.advance(30);
}

fn twin_acked(c: &Cluster) -> usize {
    c.acknowledged().iter().filter(|a| a.twin).count()
}

fn local_acked_by(c: &Cluster, side: Side) -> usize {
    c.acknowledged()
        .iter()
        .filter(|a| !a.twin && a.by == side)
        .count()
}

/// A and B stream, five frames acknowledged `twin`; then the network
/// parts, A takes three `local` writes and one `twin` write that never
/// gets its twin, B is promoted (forced: it heard A a moment ago) and
/// takes two writes of its own.
fn split_brain() -> Cluster {
    let mut c = Cluster::new(PairConfig::default());
    write_n(&mut c, A, 5, true);
    assert_eq!(twin_acked(&c), 5);
    c.partition();
    write_n(&mut c, A, 3, false);
    assert_eq!(c.write(A, true, 1), Written::Appended(9));
    assert!(matches!(c.promote(B, false), Err(PromoteError::Refused(_))));
    assert_eq!(c.promote(B, true), Ok(T1));
    assert_eq!(c.write(B, false, 2), Written::Appended(6));
    assert_eq!(c.write(B, false, 3), Written::Appended(7));
    c.advance(20);
    assert_eq!(local_acked_by(&c, A), 3);
    assert_clean(&c);
    c.heal();
    c
}

#[test]
fn a_rejoin_saves_the_deposed_primarys_divergent_frames_cuts_them_and_follows() {
    let mut c = split_brain();
    // The healed network lets B's call reach A first: A is fenced.
    c.advance(60);
    assert!(c.epochs(A).fenced(), "{}", c.journal());
    assert!(!c.telling_predecessor(B));
    let a_before = c.frames(A);
    assert_eq!(c.rejoin(A, None), Ok(5));
    let r = c.rejoins().last().expect("a rejoin record");
    assert_eq!(r.saved.as_deref(), Some(&a_before[5..]));
    assert_eq!(r.after.as_deref(), Some(&a_before[..5]));
    assert_eq!(c.role(A), Role::Twin);
    assert_clean(&c);
    assert_eq!(c.settle(5_000), Ok(B));
    assert_eq!(c.frames(A), c.frames(B));
    assert_eq!(c.epochs(A).history, c.epochs(B).history);
    write_n(&mut c, B, 3, true);
    assert_eq!(twin_acked(&c), 8);
    assert_clean(&c);
}

#[test]
fn a_rejoin_cut_short_at_every_step_is_finished_by_running_it_again() {
    // The plan: fence, save, store, cut; then the box turns twin.
    for crash_after in 0..=5 {
        let mut c = split_brain();
        let a_before = c.frames(A);
        assert_eq!(c.rejoin(A, Some(crash_after)), Ok(5), "step {crash_after}");
        assert!(!c.is_up(A));
        assert_clean(&c);
        c.restart(A);
        if crash_after >= 1 {
            assert!(c.epochs(A).fenced(), "the fence came first");
        }
        if crash_after < 5 {
            assert_eq!(c.role(A), Role::Primary);
            assert_eq!(c.rejoin(A, None), Ok(5), "again, after step {crash_after}");
        }
        assert_eq!(c.role(A), Role::Twin);
        let saved: Vec<_> = c.rejoins().iter().filter_map(|r| r.saved.clone()).collect();
        assert!(saved.iter().all(|s| s == &a_before[5..]), "{saved:?}");
        assert_clean(&c);
        assert_eq!(c.settle(5_000), Ok(B), "{}", c.journal());
        assert_clean(&c);
    }
}

#[test]
fn a_promoted_box_fences_its_restarted_predecessor_by_calling_it() {
    let mut c = Cluster::new(PairConfig::default());
    write_n(&mut c, A, 4, true);
    c.crash(A, None);
    c.advance(PROMOTE_QUIET.as_millis() as u64);
    assert_eq!(c.promote(B, false), Ok(T1));
    assert!(c.telling_predecessor(B), "A is down: not heard yet");
    c.advance(200);
    assert!(c.telling_predecessor(B));
    // A comes back in a new life of its old term, and takes a write
    // before B's next call reaches it.
    c.restart(A);
    assert_eq!(term(c.epochs(A).current()), 0);
    assert!(matches!(c.write(A, false, 0), Written::Appended(5)));
    c.advance(60);
    assert!(!c.telling_predecessor(B), "{}", c.journal());
    assert!(c.epochs(A).fenced());
    for twin in [false, true] {
        assert_eq!(
            c.write(A, twin, 1),
            Written::Refused(Refused::NotAdmitted(NotAdmitted::Fenced))
        );
    }
    assert_clean(&c);
    assert_eq!(c.settle(5_000), Ok(B));
    assert_clean(&c);
}

#[test]
fn without_the_call_a_restarted_predecessor_takes_writes_until_an_operator_acts() {
    let mut c = Cluster::new(PairConfig::default());
    c.sabotage(Sabotage {
        no_predecessor_call: true,
        ..Sabotage::default()
    });
    write_n(&mut c, A, 4, true);
    c.crash(A, None);
    c.advance(PROMOTE_QUIET.as_millis() as u64);
    assert_eq!(c.promote(B, false), Ok(T1));
    c.restart(A);
    c.advance(200);
    assert!(!c.epochs(A).fenced(), "nobody told A");
    write_n(&mut c, A, 2, false);
    assert_eq!(local_acked_by(&c, A), 2, "a deposed primary acknowledged");
}

#[test]
fn a_power_cut_then_repeated_payloads_never_pass_for_the_twins_frames() {
    for same_epoch in [false, true] {
        let mut c = Cluster::new(PairConfig::default());
        c.sabotage(Sabotage {
            same_epoch_restart: same_epoch,
            ..Sabotage::default()
        });
        write_n(&mut c, A, 3, true);
        assert_eq!(twin_acked(&c), 3);
        // Frames 4..=6, blobs 0, 1, 2, shipped and on the twin; the
        // primary loses power before its sync.
        for blob in 0..3u8 {
            c.write(A, true, blob);
        }
        c.advance(2);
        assert_eq!(c.log(B).head_seq(), 6, "{}", c.journal());
        c.crash(A, None);
        assert_eq!(c.log(A).head_seq(), 3, "the primary lost 4..=6");
        c.partition();
        c.restart(A);
        // New writes at 4..=6; the last repeats the twin's head blob.
        for blob in [3u8, 3, 2] {
            c.write(A, true, blob);
        }
        c.advance(10);
        c.heal();
        c.advance(100);
        let found = c.check();
        if same_epoch {
            assert!(
                found.iter().any(|v| matches!(
                    v,
                    Violation::TwinDiffers { .. } | Violation::SameEpochDifferentFrames { .. }
                )),
                "the same-epoch restart must be caught: {found:#?}\n{}",
                c.journal()
            );
        } else {
            assert!(found.is_empty(), "{found:#?}\n{}", c.journal());
            assert_eq!(c.frames(A), c.frames(B));
            assert_eq!(twin_acked(&c), 6);
            let cut = c.rejoins().last().expect("the twin cut what A lost");
            assert_eq!((cut.side, cut.fork), (B, 3));
        }
    }
}

#[test]
fn a_fence_naming_a_phantom_epoch_fences_nobody_else() {
    for hearsay in [false, true] {
        let mut c = Cluster::new(PairConfig::default());
        c.sabotage(Sabotage {
            fence_by_hearsay: hearsay,
            ..Sabotage::default()
        });
        write_n(&mut c, A, 3, true);
        c.crash(A, None);
        c.advance(PROMOTE_QUIET.as_millis() as u64);
        assert_eq!(c.promote(B, false), Ok(T1));
        c.restart(A);
        c.advance(60);
        // An operator fences A again, naming an epoch nobody serves.
        c.operator_fence(A, 5 * T1);
        assert!(c.epochs(A).fenced());
        assert_eq!(c.rejoin(A, None), Ok(3));
        c.advance(100);
        if hearsay {
            assert!(
                c.epochs(B).fenced(),
                "the old rule lets the phantom fence B:\n{}",
                c.journal()
            );
        } else {
            assert!(!c.epochs(B).fenced(), "{}", c.journal());
            assert!(c.streaming());
            write_n(&mut c, B, 2, true);
            assert_eq!(twin_acked(&c), 5);
            assert_clean(&c);
        }
    }
}

#[test]
fn a_switchover_hands_over_every_acknowledged_frame_and_the_old_primary_follows() {
    let mut c = Cluster::new(PairConfig::default());
    write_n(&mut c, A, 6, true);
    assert!(c.streaming());
    assert_eq!(c.switchover(A), Ok(()));
    assert_eq!(c.write(A, false, 1), Written::Refused(Refused::Paused));
    c.advance(30);
    assert_eq!(c.role(B), Role::Primary);
    assert_eq!(c.epochs(B).current(), T1);
    assert_eq!(c.role(A), Role::Twin);
    assert_eq!(c.epochs(A).seen, T1);
    assert_eq!(c.write(A, false, 1), Written::Refused(Refused::NotPrimary));
    c.advance(30);
    assert!(c.streaming(), "A follows B:\n{}", c.journal());
    write_n(&mut c, B, 4, true);
    assert_eq!(twin_acked(&c), 10);
    assert_clean(&c);
    assert_eq!(c.settle(5_000), Ok(B));
}

/// A switchover on A, A's power cut `at_ms` into it, A restarted cut off
/// from B; then A and (if it took over) B each take a `local` write. Answers the cluster and whether both acknowledged one.
fn crash_during_switchover(at_ms: u64, sabotage: Sabotage) -> (Cluster, bool) {
    let mut c = Cluster::new(PairConfig::default());
    c.sabotage(sabotage);
    write_n(&mut c, A, 3, true);
    assert_eq!(c.switchover(A), Ok(()));
    c.advance(at_ms);
    let b_took_over = c.role(B) == Role::Primary;
    c.crash(A, None);
    // Cut off: no call of B's reaches A.
    c.partition();
    c.restart(A);
    c.write(A, false, 0);
    if b_took_over {
        c.write(B, false, 0);
    }
    c.advance(10);
    let both = b_took_over && local_acked_by(&c, A) > 0 && local_acked_by(&c, B) > 0;
    (c, both)
}

#[test]
fn a_primary_that_crashes_at_any_moment_of_a_switchover_comes_back_fenced_or_serving_alone() {
    for at_ms in 0..8 {
        let (mut c, both) = crash_during_switchover(at_ms, Sabotage::default());
        assert!(!both, "at {at_ms} ms, hold kept:\n{}", c.journal());
        assert_clean(&c);
        let settled = c.settle(5_000);
        assert!(
            settled.is_ok(),
            "at {at_ms} ms: {settled:?}\n{}",
            c.journal()
        );
        assert_clean(&c);
    }
}

#[test]
fn the_volatile_hold_is_caught_at_some_moment_of_a_switchover() {
    let volatile = Sabotage {
        volatile_hold: true,
        ..Sabotage::default()
    };
    let caught = (0..8).any(|at_ms| {
        let (c, both) = crash_during_switchover(at_ms, volatile);
        both && !c.check().is_empty()
    });
    assert!(caught, "a hold lost in a crash lets the old primary serve");
}

#[test]
fn a_switchover_whose_answer_is_lost_keeps_the_primary_held_until_the_new_primary_calls() {
    let mut c = Cluster::new(PairConfig::default());
    write_n(&mut c, A, 3, true);
    assert_eq!(c.switchover(A), Ok(()));
    // The Handover reaches B, which takes over; its Promoted is lost with
    // the network.
    c.advance(3);
    assert_eq!(c.role(B), Role::Primary, "{}", c.journal());
    c.partition();
    c.advance(SWITCHOVER_WAIT.as_millis() as u64);
    assert_eq!(c.role(A), Role::Primary);
    assert!(c.epochs(A).fenced(), "the outcome is unknown: held");
    assert_eq!(c.epochs(A).newest(), 0, "a hold names no epoch");
    assert_eq!(
        c.write(A, true, 1),
        Written::Refused(Refused::Paused),
        "writes stay paused"
    );
    assert_clean(&c);
    // Once B's call gets through, A is fenced by B's epoch.
    c.heal();
    c.advance(100);
    assert_eq!(c.epochs(A).seen, T1, "{}", c.journal());
    assert_eq!(c.epochs(A).held, None);
    assert_clean(&c);
    assert_eq!(c.settle(5_000), Ok(B));
    assert_clean(&c);
}

#[test]
fn a_twin_that_crashes_as_it_takes_over_leaves_both_boxes_safe() {
    let mut c = Cluster::new(PairConfig::default());
    write_n(&mut c, A, 3, true);
    c.crash_at_takeover = true;
    assert_eq!(c.switchover(A), Ok(()));
    c.advance(SWITCHOVER_WAIT.as_millis() as u64 + 10);
    assert!(!c.is_up(B));
    assert!(c.epochs(A).fenced(), "held: B may have taken over");
    c.restart(B);
    c.advance(100);
    assert_clean(&c);
    assert_eq!(c.settle(5_000), Ok(B), "{}", c.journal());
    assert_clean(&c);
}

#[test]
fn an_interrupted_promotion_leaves_a_twin_of_the_new_term_that_fences_the_old_primary() {
    let mut c = Cluster::new(PairConfig::default());
    write_n(&mut c, A, 3, true);
    c.partition();
    c.advance(PROMOTE_QUIET.as_millis() as u64);
    assert_eq!(c.promote_interrupted(B, false), Ok(T1));
    assert_eq!(c.role(B), Role::Twin);
    c.restart(B);
    c.heal();
    c.advance(100);
    assert!(c.epochs(A).fenced(), "B's hello proves its new term");
    assert_clean(&c);
    assert_eq!(c.settle(5_000), Ok(B), "{}", c.journal());
    assert_clean(&c);
}

#[test]
fn a_twin_promoted_before_it_held_a_frame_starts_another_history_the_old_primary_cannot_rejoin() {
    let mut c = Cluster::new(PairConfig::default());
    c.partition();
    assert_eq!(c.write(A, false, 1), Written::Appended(1));
    assert_eq!(c.promote(B, true), Ok(T1));
    assert_ne!(c.log(A).history(), c.log(B).history());
    assert_eq!(c.write(B, false, 1), Written::Appended(1));
    c.advance(10);
    c.heal();
    let before = c.frames(A);
    assert!(matches!(
        c.rejoin(A, None),
        Err(RejoinError::Refused(RejoinRefusal::Refused(
            Refusal::History { .. }
        )))
    ));
    assert_eq!(c.frames(A), before, "nothing was cut");
    assert_eq!(c.role(A), Role::Primary);
    assert_eq!(c.start_afresh(A), Ok(()));
    assert_eq!(c.settle(5_000), Ok(B));
    assert_eq!(c.log(A).history(), c.log(B).history());
    assert_clean(&c);
}

// Deliberately broken runs: the checker names what broke.

#[test]
fn the_checker_catches_a_rejoin_that_cuts_without_saving() {
    let mut c = split_brain();
    let past_fork = c.frames(A)[5..].to_vec();
    c.sabotage(Sabotage {
        skip_save: true,
        ..Sabotage::default()
    });
    assert_eq!(c.rejoin(A, None), Ok(5));
    let found = c.check();
    assert!(
        found.contains(&Violation::CutUnsaved {
            side: A,
            unsaved: past_fork
        }),
        "{found:#?}"
    );
    let lost = found
        .iter()
        .filter(|v| matches!(v, Violation::AcknowledgedLost { by: A, .. }))
        .count();
    assert_eq!(lost, 3, "{found:#?}");
}

#[test]
fn the_checker_catches_a_primary_that_ignores_its_fence() {
    let mut c = split_brain();
    c.advance(60);
    assert!(c.epochs(A).fenced());
    c.sabotage(Sabotage {
        ignore_fence: true,
        ..Sabotage::default()
    });
    let Written::Appended(seq) = c.write(A, false, 1) else {
        panic!("the sabotaged primary appends");
    };
    c.advance(10);
    let found = c.check();
    assert!(
        found.iter().any(|v| matches!(
            v,
            Violation::FencedAcknowledged { frame, by: A, .. } if frame.seq == seq
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
    assert_eq!(c.rejoin(A, None), Ok(5));
    let found = c.check();
    assert!(
        found
            .iter()
            .any(|v| matches!(v, Violation::SameEpochDifferentFrames { .. })),
        "{found:#?}"
    );
}

#[test]
fn the_checker_catches_a_twin_acknowledgement_the_new_primary_lacks() {
    let mut c = Cluster::new(PairConfig::default());
    write_n(&mut c, A, 2, true);
    c.partition();
    c.sabotage(Sabotage {
        ack_twin_at_once: true,
        ..Sabotage::default()
    });
    assert_eq!(c.write(A, true, 1), Written::Appended(3));
    assert_eq!(c.promote(B, true), Ok(T1));
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
enum Op {
    /// A client writes to the primary of the newest epoch, or with
    /// `stale` to the other box (a client that has not heard of the
    /// newest), a blob from the alphabet.
    Write {
        stale: bool,
        twin: bool,
        blob: u8,
    },
    /// Writes of one blob each, at once: a group shipped before its sync.
    Burst {
        n: u8,
        twin: bool,
        blob: u8,
    },
    Advance(u64),
    Fault(Fault),
    /// The primary of the newest epoch loses power.
    CrashServing(Option<u64>),
    /// Writes of one blob each to the primary, then its power cut once
    /// the twin holds frames it has not synced (or at its sync), and it
    /// restarts: the twin may hold frames the primary lost.
    BurstThenCrash {
        n: u8,
        blob: u8,
    },
    Partition,
    Heal,
    Crash(Side, Option<u64>),
    Restart(Side),
    Promote(Side, bool),
    PromoteInterrupted(Side),
    Rejoin(Side, Option<usize>),
    Switchover(Side),
    /// The next takeover's twin loses power as it records its epoch.
    CrashAtTakeover,
    OperatorFence(Side, u64),
}

fn side() -> impl Strategy<Value = Side> {
    prop_oneof![Just(A), Just(B)]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        16 => (prop::bool::weighted(0.25), any::<bool>(), 0u8..4)
            .prop_map(|(stale, twin, blob)| Op::Write { stale, twin, blob }),
        4 => (1u8..6, any::<bool>(), 0u8..4)
            .prop_map(|(n, twin, blob)| Op::Burst { n, twin, blob }),
        8 => (1u64..60).prop_map(Op::Advance),
        3 => prop::option::weighted(0.2, any::<u64>()).prop_map(Op::CrashServing),
        3 => (1u8..6, 0u8..4).prop_map(|(n, blob)| Op::BurstThenCrash { n, blob }),
        1 => Just(Op::Fault(Fault::DropControl)),
        1 => Just(Op::Fault(Fault::DuplicateControl)),
        1 => (1u64..300).prop_map(|ms| Op::Fault(Fault::DelayControl(ms))),
        1 => any::<usize>().prop_map(|at| Op::Fault(Fault::CorruptData(at))),
        1 => Just(Op::Fault(Fault::Cut)),
        1 => Just(Op::Partition),
        2 => Just(Op::Heal),
        3 => (side(), prop::option::of(any::<u64>())).prop_map(|(s, k)| Op::Crash(s, k)),
        3 => side().prop_map(Op::Restart),
        1 => (side(), any::<bool>()).prop_map(|(s, force)| Op::Promote(s, force)),
        1 => side().prop_map(Op::PromoteInterrupted),
        2 => (side(), prop::option::weighted(0.3, 0usize..5)).prop_map(|(s, k)| Op::Rejoin(s, k)),
        2 => side().prop_map(Op::Switchover),
        1 => Just(Op::CrashAtTakeover),
        1 => (side(), 1u64..4).prop_map(|(s, t)| Op::OperatorFence(s, t << LIFE_BITS)),
    ]
}

fn run(c: &mut Cluster, s: &Op) {
    // An operator step whose preconditions do not hold is refused, as the
    // commands are; the run goes on.
    match s {
        Op::Write { stale, twin, blob } => {
            let primary = c.serving().unwrap_or(A);
            let at = if *stale { primary.other() } else { primary };
            c.write(at, *twin, *blob);
        }
        Op::Burst { n, twin, blob } => {
            let at = c.serving().unwrap_or(A);
            for i in 0..*n {
                c.write(at, *twin, blob.wrapping_add(i));
            }
        }
        Op::Advance(ms) => c.advance(*ms),
        Op::Fault(f) => c.inject(*f),
        Op::CrashServing(keep) => {
            let at = c.serving().unwrap_or(A);
            c.crash(at, *keep);
        }
        Op::BurstThenCrash { n, blob } => {
            let at = c.serving().unwrap_or(A);
            let durable = c.log(at).head_seq();
            for i in 0..*n {
                c.write(at, true, blob.wrapping_add(i));
            }
            for _ in 0..3 {
                if c.log(at.other()).head_seq() > durable || c.log(at).head_seq() > durable {
                    break;
                }
                c.advance(1);
            }
            c.crash(at, None);
            c.restart(at);
        }
        Op::Partition => c.partition(),
        Op::Heal => c.heal(),
        Op::Crash(side, keep) => c.crash(*side, *keep),
        Op::Restart(side) => c.restart(*side),
        Op::Promote(side, force) => {
            let _ = c.promote(*side, *force);
        }
        Op::PromoteInterrupted(side) => {
            let _ = c.promote_interrupted(*side, true);
        }
        Op::Rejoin(side, crash_after) => {
            let _ = c.rejoin(*side, *crash_after);
        }
        Op::Switchover(side) => {
            let _ = c.switchover(*side);
        }
        Op::CrashAtTakeover => c.crash_at_takeover = true,
        Op::OperatorFence(side, epoch) => c.operator_fence(*side, *epoch),
    }
}

/// Run `ops` on a cluster broken by `sabotage`; the first violation found.
fn first_violation(
    ops: &[Op],
    sabotage: Sabotage,
    chunk: usize,
    delay_ms: u64,
) -> Result<(), String> {
    let delay = std::time::Duration::from_millis(delay_ms);
    let mut c = Cluster::new(PairConfig {
        chunk,
        delay,
        ..PairConfig::default()
    });
    c.sabotage(sabotage);
    for s in ops {
        run(&mut c, s);
        let found = c.check();
        if !found.is_empty() {
            return Err(format!("after {s:?}: {found:#?}\n{}", c.journal()));
        }
    }
    if let Err(e) = c.settle(20_000) {
        return Err(format!("settling: {e}\n{}", c.journal()));
    }
    let found = c.check();
    if !found.is_empty() {
        return Err(format!("after settling: {found:#?}\n{}", c.journal()));
    }
    if c.frames(A) != c.frames(B) {
        return Err(format!("the settled logs differ\n{}", c.journal()));
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2048, ..ProptestConfig::default() })]

    /// Any schedule of writes, faults, power cuts and operator steps keeps
    /// every promise at every step; then the operator's usual moves bring
    /// the boxes back to a primary and a twin holding the same log, still
    /// keeping every promise.
    #[test]
    fn every_promise_holds_through_failovers_fences_rejoins_and_switchovers(
        ops in prop::collection::vec(op(), 1..150),
        chunk in 50usize..3000,
        delay_ms in 1u64..8,
    ) {
        let run = first_violation(&ops, Sabotage::default(), chunk, delay_ms);
        prop_assert!(run.is_ok(), "{}", run.err().unwrap_or_default());
    }
}

/// The same random schedules with one rule undone: some schedule must
/// break a promise, or the checker has stopped checking.
fn random_schedules_catch(sabotage: Sabotage) {
    use proptest::test_runner::{Config, TestRunner};
    let mut runner = TestRunner::new(Config {
        cases: 2000,
        failure_persistence: None,
        ..Config::default()
    });
    let strategy = (prop::collection::vec(op(), 1..150), 50usize..3000, 1u64..8);
    let outcome = runner.run(&strategy, |(ops, chunk, delay_ms)| {
        first_violation(&ops, sabotage, chunk, delay_ms)
            .map_err(proptest::test_runner::TestCaseError::fail)
    });
    assert!(
        outcome.is_err(),
        "no schedule of {} found the broken rule {sabotage:?}",
        2000
    );
}

#[test]
fn random_schedules_catch_a_restart_in_the_same_epoch() {
    random_schedules_catch(Sabotage {
        same_epoch_restart: true,
        ..Sabotage::default()
    });
}

#[test]
fn random_schedules_catch_a_fence_by_hearsay() {
    random_schedules_catch(Sabotage {
        fence_by_hearsay: true,
        ..Sabotage::default()
    });
}

#[test]
fn random_schedules_catch_a_hold_lost_in_a_crash() {
    random_schedules_catch(Sabotage {
        volatile_hold: true,
        ..Sabotage::default()
    });
}
