use super::*;
use proptest::prelude::*;

fn h(starts: &[(u64, u64)]) -> EpochHistory {
    EpochHistory::try_from(
        starts
            .iter()
            .map(|&(epoch, first)| EpochStart { epoch, first })
            .collect::<Vec<_>>(),
    )
    .expect("valid history")
}

#[test]
fn the_fork_is_where_the_histories_first_disagree() {
    let old_primary = h(&[(0, 1), (1, 101)]);
    // The twin was promoted at 150 while the old primary wrote to 170.
    let new_primary = h(&[(0, 1), (1, 101), (2, 151)]);
    assert_eq!(fork_point(&new_primary, 400, &old_primary, 170), 150);
    assert_eq!(fork_point(&old_primary, 170, &new_primary, 400), 150);
    // Nothing written past the promotion: nothing to cut.
    assert_eq!(fork_point(&new_primary, 400, &old_primary, 150), 150);
    // A twin behind shares everything it holds.
    assert_eq!(fork_point(&new_primary, 400, &new_primary, 90), 90);
    // Two promotions from one history at different heads.
    let a = h(&[(0, 1), (3, 60)]);
    let b = h(&[(0, 1), (2, 80)]);
    assert_eq!(fork_point(&a, 100, &b, 100), 59);
    // Nothing in common at all.
    assert_eq!(fork_point(&h(&[(1, 1)]), 10, &h(&[(2, 1)]), 10), 0);
}

#[test]
fn a_promotion_drops_epochs_this_log_holds_no_frame_of() {
    let mut followed = h(&[(0, 1), (1, 101)]);
    followed.begin(2, 90).expect("promote");
    assert_eq!(followed, h(&[(0, 1), (2, 91)]));
    assert!(followed.begin(2, 95).is_err(), "epochs only increase");
    let mut fresh = EpochHistory::default();
    fresh.begin(1, 0).expect("promote an empty log");
    assert_eq!(fresh, h(&[(1, 1)]));
}

#[test]
fn a_bad_history_is_refused_by_name() {
    let bad = |v: Vec<EpochStart>| EpochHistory::try_from(v).expect_err("refused");
    assert_eq!(bad(vec![]), EpochError::Empty);
    let s = |epoch, first| EpochStart { epoch, first };
    assert!(matches!(bad(vec![s(0, 0)]), EpochError::ZeroFirst { .. }));
    assert!(matches!(
        bad(vec![s(2, 1), s(2, 5)]),
        EpochError::NotIncreasing { .. }
    ));
    assert!(matches!(
        bad(vec![s(1, 9), s(2, 5)]),
        EpochError::StartsBefore { .. }
    ));
    assert!(matches!(
        bad((0..=MAX_EPOCHS as u64).map(|e| s(e, 1)).collect()),
        EpochError::TooMany(_)
    ));
    // The wire form is checked the same way.
    let bytes = postcard::to_stdvec(&vec![s(3, 1), s(1, 2)]).expect("encode");
    assert!(postcard::from_bytes::<EpochHistory>(&bytes).is_err());
}

const T1: u64 = 1 << LIFE_BITS;

#[test]
fn a_newer_epoch_fences_a_primary_until_it_follows_or_is_promoted() {
    let mut st = EpochState::new(T1);
    assert!(!st.fenced());
    assert!(st.hear(2 * T1, "twin"));
    assert!(st.fenced());
    assert!(!st.hear(2 * T1, "client"), "already fenced");
    assert_eq!(st.fenced_by.as_deref(), Some("twin"));
    st.follow(h(&[(0, 1), (T1, 5), (2 * T1, 40)]));
    assert!(!st.fenced(), "a twin of the new primary");
    let e = st.promote(50).expect("promote");
    assert_eq!(e, 3 * T1);
    assert_eq!(
        st.history.starts().last(),
        Some(&EpochStart {
            epoch: 3 * T1,
            first: 51
        })
    );
    assert_eq!(st.restart(50), Ok(Some(3 * T1)), "the first serve takes it");
    assert_eq!(st.restart(50), Ok(Some(3 * T1 + 1)), "the next, a life");
    // Promotion goes to the term above every epoch heard of.
    let mut heard = EpochState::new(T1);
    heard.hear(7 * T1 + 3, "client");
    assert_eq!(heard.promote(3).expect("promote"), 8 * T1);
    assert!(!heard.fenced());
}

#[test]
fn each_restart_begins_a_life_that_every_promotion_outranks() {
    let mut st = EpochState::new(T1);
    assert_eq!(st.restart(10), Ok(Some(T1 + 1)));
    // A restart with nothing written since replaces the empty life.
    assert_eq!(st.restart(10), Ok(Some(T1 + 2)));
    assert_eq!(st.history, h(&[(T1, 1), (T1 + 2, 11)]));
    assert_eq!(st.restart(12), Ok(Some(T1 + 3)));
    assert_eq!(st.history, h(&[(T1, 1), (T1 + 2, 11), (T1 + 3, 13)]));
    assert_eq!(EpochName(st.current()).to_string(), "1.3");
    // The twin promoted meanwhile outranks every later restart.
    assert!(next_term(T1 + 3) > T1 + 1000);
    // A fenced primary begins a life too, and stays fenced.
    st.hear(2 * T1, "the new primary");
    assert_eq!(st.restart(20), Ok(Some(T1 + 4)));
    assert!(st.fenced());
    st.hold("an operator");
    assert_eq!(st.restart(21), Ok(Some(T1 + 5)));
    assert!(st.fenced());
    // Never up to the epoch that fenced it.
    let mut odd = EpochState::new(T1);
    odd.hear(T1 + 1, "a later life of this term");
    assert_eq!(odd.restart(3), Ok(None));
    assert!(odd.fenced());
    let mut last = EpochState::new(T1 | LIFE_MASK);
    assert!(matches!(
        last.restart(1),
        Err(EpochError::LifeExhausted { .. })
    ));
}

#[test]
fn a_hold_fences_this_box_alone_and_gives_way_to_a_proven_fence() {
    let mut st = EpochState::new(T1);
    assert!(st.hold("a switchover under way"));
    assert!(st.fenced());
    assert_eq!(st.newest(), T1, "a hold names no epoch");
    assert!(!st.hold("again"), "already fenced");
    assert!(st.release());
    assert!(!st.fenced());
    assert_eq!(st.fenced_by, None);
    st.hold("an operator");
    assert!(!st.hear(2 * T1, "the new primary"), "fenced already");
    assert_eq!(st.held, None, "the proven fence replaces the hold");
    assert_eq!(st.fenced_by.as_deref(), Some("the new primary"));
    assert!(!st.release(), "a proven fence is not lifted");
    assert!(st.fenced());
    // Following a primary lifts a hold: a twin holds nothing back.
    let mut twin = EpochState::new(T1);
    twin.hold("an operator");
    twin.follow(h(&[(T1, 1)]));
    assert!(!twin.fenced());
}

#[test]
fn epoch_names_read_back() {
    for e in [0, 1, T1, T1 + 7, 12 * T1 + 3] {
        let name = EpochName(e).to_string();
        assert_eq!(name.parse::<EpochName>(), Ok(EpochName(e)), "{name}");
    }
    assert_eq!("5".parse::<EpochName>(), Ok(EpochName(5)));
    assert!("1.x".parse::<EpochName>().is_err());
    assert!("4294967296.0".parse::<EpochName>().is_err());
}

#[test]
fn a_file_from_before_terms_becomes_one_term_per_promotion() {
    let old = EpochState {
        history: h(&[(0, 1), (1, 40), (3, 90)]),
        seen: 4,
        fenced_by: Some("twin".into()),
        held: None,
        unserved: false,
    };
    let st = old.from_untermed().expect("convert");
    assert_eq!(st.history, h(&[(0, 1), (T1, 40), (3 * T1, 90)]));
    assert_eq!(st.seen, 4 * T1);
}

#[test]
fn frames_past_a_restart_are_lost_on_the_primary_but_not_past_a_promotion() {
    // The primary restarted at 3 (life 1.1 from 4); the twin holds
    // frames 4..=6 of life 1.0, shipped before the crash.
    let primary = h(&[(0, 1), (T1, 2), (T1 + 1, 4)]);
    let twin = h(&[(0, 1), (T1, 2)]);
    let fork = fork_point(&primary, u64::MAX, &twin, 6);
    assert_eq!(fork, 3);
    assert!(lost_on_primary(&primary, &twin, fork, 6));
    // Two crashes: lives 1.0 and 1.1 both lost past 3.
    let twice = h(&[(0, 1), (T1, 2), (T1 + 2, 4)]);
    let twin2 = h(&[(0, 1), (T1, 2), (T1 + 1, 5)]);
    assert!(lost_on_primary(&twice, &twin2, 3, 8));
    // A promotion's fork is another box's frames: not the twin's to cut.
    let promoted = h(&[(0, 1), (T1, 2), (2 * T1, 4)]);
    assert!(!lost_on_primary(&promoted, &twin, 3, 6));
    // A twin of a newer life than the primary's is not lost there.
    let newer = h(&[(0, 1), (T1, 2), (T1 + 5, 4)]);
    assert!(!lost_on_primary(&primary, &newer, 3, 6));
    // Nothing past the fork, or a fork that is no life's start.
    assert!(!lost_on_primary(&primary, &twin, 3, 3));
    assert!(!lost_on_primary(&primary, &twin, 2, 6));
}

#[test]
fn a_full_history_drops_its_oldest_and_those_sequences_count_as_shared() {
    let mut full = EpochHistory::single(0);
    for i in 1..=MAX_EPOCHS as u64 + 5 {
        full.begin(i, i * 10).expect("begin");
    }
    assert_eq!(full.starts().len(), MAX_EPOCHS);
    let oldest = full.starts()[0].first;
    assert!(oldest > 1);
    // A twin that kept the whole past agrees on the dropped part.
    let mut whole = EpochHistory::single(0);
    for i in 1..=MAX_EPOCHS as u64 + 5 {
        whole.starts.push(EpochStart {
            epoch: i,
            first: i * 10 + 1,
        });
    }
    let head = (MAX_EPOCHS as u64 + 5) * 10 + 3;
    assert_eq!(fork_point(&full, head, &whole, head), head);
}

/// Logs as the epochs that wrote each frame: a history of each, and a
/// reference fork by walking both.
fn history_of(epochs: &[u64]) -> EpochHistory {
    let mut starts = vec![EpochStart { epoch: 0, first: 1 }];
    for (i, &e) in epochs.iter().enumerate() {
        if e != starts.last().map_or(0, |s| s.epoch) {
            starts.push(EpochStart {
                epoch: e,
                first: i as u64 + 1,
            });
        }
    }
    EpochHistory::try_from(starts).expect("increasing")
}

proptest! {
    #[test]
    fn the_fork_point_is_the_longest_common_prefix_of_epochs(
        common in proptest::collection::vec(0u64..3, 0..20),
        a_tail in proptest::collection::vec(0u64..3, 0..20),
        b_tail in proptest::collection::vec(0u64..3, 0..20),
    ) {
        // Epochs written frame by frame, never decreasing; each tail
        // after the common prefix runs under its own epochs.
        let mut common: Vec<u64> = common;
        common.sort_unstable();
        let top = common.last().copied().unwrap_or(0);
        let mut a: Vec<u64> = a_tail.iter().map(|e| top + 1 + 2 * e).collect();
        let mut b: Vec<u64> = b_tail.iter().map(|e| top + 2 + 2 * e).collect();
        a.sort_unstable();
        b.sort_unstable();
        let a_log: Vec<u64> = common.iter().chain(a.iter()).copied().collect();
        let b_log: Vec<u64> = common.iter().chain(b.iter()).copied().collect();
        let expected = a_log.iter().zip(b_log.iter()).take_while(|(x, y)| x == y).count() as u64;
        let got = fork_point(&history_of(&a_log), a_log.len() as u64, &history_of(&b_log), b_log.len() as u64);
        prop_assert_eq!(got, expected);
    }
}
