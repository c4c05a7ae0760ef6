//! The cores' refusals, each by name and with nothing written: a twin of
//! another history, ahead, diverged, below the floor, a sequence gap, a
//! damaged header, a bad version, an ack of what was never sent, silence.

use std::time::Duration;

use twinlog::log::format::{payload_crc, FrameHeader};
use twinlog::repl::wire::frame_prefix;
use twinlog::repl::{
    EpochHistory, HeadFrame, Now, Position, PrimaryAction, PrimaryCore, PrimaryMsg, PrimaryState,
    PrimaryView, Refusal, Timers, TwinAction, TwinCore, TwinMsg, TwinState, TwinView,
    PROTOCOL_VERSION,
};

const H: [u8; 16] = [7; 16];

fn primary(head: u64, first: u64) -> PrimaryCore {
    PrimaryCore::new(
        Timers::default(),
        PrimaryView {
            history: H,
            head,
            first,
            epochs: Default::default(),
        },
        Now::system(),
    )
}

fn hello(history: [u8; 16], seq: u64, crc: u32) -> TwinMsg {
    hello_in(history, seq, crc, Default::default())
}

fn hello_in(history: [u8; 16], seq: u64, crc: u32, epochs: EpochHistory) -> TwinMsg {
    TwinMsg::Hello {
        version: PROTOCOL_VERSION,
        history,
        head: Position { seq, crc },
        first: 1,
        epochs,
    }
}

fn refused(core: &mut PrimaryCore) -> Refusal {
    let mut sent = None;
    while let Some(m) = core.poll_transmit() {
        if let PrimaryMsg::Refuse(r) = m {
            sent = Some(r);
        }
    }
    let mut closed = None;
    while let Some(a) = core.poll_action() {
        assert!(
            !matches!(a, PrimaryAction::Ship { .. }),
            "nothing is shipped to a refused twin"
        );
        if let PrimaryAction::Close(r) = a {
            closed = Some(r);
        }
    }
    assert_eq!(core.state(), PrimaryState::Closed);
    let r = sent.expect("a refusal is sent");
    assert_eq!(
        closed.as_ref(),
        Some(&r),
        "and the connection closes for it"
    );
    r
}

#[test]
fn the_primary_refuses_each_kind_of_twin_by_name() {
    let now = Now::system();
    let mut c = primary(10, 1);
    c.handle_hello(hello([9; 16], 3, 1), |_| Some(HeadFrame::crc(1)), now);
    assert!(matches!(refused(&mut c), Refusal::History { .. }));

    let mut c = primary(10, 1);
    c.handle_hello(hello(H, 11, 1), |_| None, now);
    assert_eq!(
        refused(&mut c),
        Refusal::TwinAhead {
            twin_head: 11,
            primary_head: 10
        }
    );

    let mut c = primary(10, 1);
    c.handle_hello(hello(H, 5, 0xaaaa), |_| Some(HeadFrame::crc(0xbbbb)), now);
    assert_eq!(
        refused(&mut c),
        Refusal::Diverged {
            seq: 5,
            primary_crc: 0xbbbb,
            twin_crc: 0xaaaa
        }
    );

    let mut c = primary(10, 1);
    c.handle_hello(
        TwinMsg::Hello {
            version: 99,
            history: H,
            head: Position::default(),
            first: 1,
            epochs: Default::default(),
        },
        |_| None,
        now,
    );
    assert_eq!(
        refused(&mut c),
        Refusal::Version {
            ours: PROTOCOL_VERSION,
            theirs: 99
        }
    );

    let mut c = primary(10, 1);
    c.handle_message(TwinMsg::Ack { durable: 3 }, now);
    assert!(matches!(refused(&mut c), Refusal::Protocol(_)));
}

#[test]
fn a_twin_below_the_floor_enters_its_named_state() {
    let now = Now::system();
    let mut c = primary(100, 50);
    c.handle_hello(hello(H, 20, 1), |_| None, now);
    assert_eq!(c.state(), PrimaryState::BelowFloor);
    assert_eq!(
        c.poll_transmit(),
        Some(PrimaryMsg::BelowFloor {
            first: 50,
            head: 100
        })
    );
    assert_eq!(
        c.poll_action(),
        Some(PrimaryAction::BelowFloor {
            twin_head: 20,
            first: 50
        })
    );

    let mut t = TwinCore::new(
        Timers::default(),
        TwinView {
            history: H,
            head: Position { seq: 20, crc: 1 },
            first: 1,
            epochs: Default::default(),
        },
        now,
    );
    t.handle_message(
        PrimaryMsg::BelowFloor {
            first: 50,
            head: 100,
        },
        now,
    );
    assert_eq!(t.state(), TwinState::BelowFloor);
    assert_eq!(
        t.poll_action(),
        Some(TwinAction::BelowFloor {
            first: 50,
            primary_head: 100
        })
    );
}

#[test]
fn streaming_is_pipelined_and_acks_are_checked() {
    let now = Now::system();
    let mut c = primary(10, 1);
    c.handle_hello(hello(H, 4, 9), |_| Some(HeadFrame::crc(9)), now);
    assert_eq!(c.state(), PrimaryState::Streaming);
    assert!(matches!(
        c.poll_transmit(),
        Some(PrimaryMsg::Welcome {
            from: 5,
            head: 10,
            ..
        })
    ));
    assert_eq!(c.poll_action(), Some(PrimaryAction::Acked(4)));
    assert_eq!(
        c.poll_action(),
        Some(PrimaryAction::Ship {
            from: 5,
            through: 10
        })
    );
    c.handle_appended(11, 100, now);
    c.handle_appended(12, 100, now);
    assert_eq!(
        c.poll_action(),
        Some(PrimaryAction::Ship {
            from: 11,
            through: 11
        })
    );
    assert_eq!(
        c.poll_action(),
        Some(PrimaryAction::Ship {
            from: 12,
            through: 12
        })
    );
    c.handle_message(TwinMsg::Ack { durable: 8 }, now);
    assert_eq!(c.poll_action(), Some(PrimaryAction::Acked(8)));
    c.handle_message(TwinMsg::Ack { durable: 7 }, now);
    assert_eq!(c.poll_action(), None, "an older ack says nothing");
    let later = now.after(Duration::from_millis(30));
    let s = c.status(later);
    assert_eq!((s.lag_frames, s.lag_bytes), (4, 200));
    assert!(s.lag >= Duration::from_millis(30));
    c.handle_message(TwinMsg::Ack { durable: 13 }, now);
    assert!(
        matches!(refused(&mut c), Refusal::Protocol(_)),
        "an ack of what was never shipped"
    );
}

#[test]
fn silence_ends_a_connection_and_heartbeats_carry_head_and_clock() {
    let now = Now::system();
    let timers = Timers {
        heartbeat: Duration::from_millis(10),
        idle_timeout: Duration::from_millis(100),
    };
    let mut c = PrimaryCore::new(
        timers,
        PrimaryView {
            history: H,
            head: 3,
            first: 1,
            epochs: Default::default(),
        },
        now,
    );
    c.handle_hello(hello(H, 3, 5), |_| Some(HeadFrame::crc(5)), now);
    while c.poll_transmit().is_some() {}
    let t1 = now.after(Duration::from_millis(10));
    c.handle_timeout(t1);
    assert_eq!(
        c.poll_transmit(),
        Some(PrimaryMsg::Heartbeat {
            head: 3,
            unix_ms: t1.unix_ms
        })
    );
    c.handle_timeout(t1);
    assert_eq!(c.poll_transmit(), None, "a spurious timeout does nothing");
    c.handle_timeout(now.after(Duration::from_millis(100)));
    assert_eq!(refused(&mut c), Refusal::Timeout);
}

#[test]
fn a_twin_that_hears_nothing_says_it_is_alive_five_times_a_heartbeat() {
    let now = Now::system();
    let ms = |n| now.after(Duration::from_millis(n));
    let mut t = TwinCore::new(
        Timers::default(),
        TwinView {
            history: H,
            head: Position { seq: 4, crc: 1 },
            first: 1,
            epochs: Default::default(),
        },
        now,
    );
    let welcome = PrimaryMsg::Welcome {
        version: PROTOCOL_VERSION,
        history: H,
        from: 5,
        head: 9,
        first: 1,
        epochs: Default::default(),
    };
    t.handle_message(welcome, now);
    while t.poll_transmit().is_some() {}
    let ack = Some(TwinMsg::Ack { durable: 4 });
    // The heartbeat is 500 ms: after 100 ms of the primary's silence, an
    // Ack every 100 ms, so a restarted primary's reset comes that soon.
    assert_eq!(t.poll_timeout(), Some(ms(100).at));
    t.handle_timeout(ms(50));
    assert_eq!(t.poll_transmit(), None, "not due");
    for n in [100, 200, 300] {
        t.handle_timeout(ms(n));
        assert_eq!(t.poll_transmit(), ack, "at {n} ms");
        assert_eq!(t.poll_timeout(), Some(ms(n + 100).at));
    }
    // The primary's heartbeat is answered, and the silence counts anew.
    t.handle_message(
        PrimaryMsg::Heartbeat {
            head: 9,
            unix_ms: ms(350).unix_ms,
        },
        ms(350),
    );
    assert_eq!(t.poll_transmit(), ack);
    assert_eq!(t.poll_timeout(), Some(ms(450).at));
    t.handle_timeout(ms(449));
    assert_eq!(t.poll_transmit(), None, "not due");
    t.handle_timeout(ms(450));
    assert_eq!(t.poll_transmit(), ack);
    // Silence past the idle timeout ends the connection, by name.
    t.handle_timeout(ms(350 + 5000));
    assert!(matches!(
        t.poll_action(),
        Some(TwinAction::Close(Refusal::Timeout))
    ));
}

fn twin_streaming(head: u64) -> TwinCore {
    let now = Now::system();
    let mut t = TwinCore::new(
        Timers::default(),
        TwinView {
            history: H,
            head: Position { seq: head, crc: 1 },
            first: 1,
            epochs: Default::default(),
        },
        now,
    );
    t.handle_message(
        PrimaryMsg::Welcome {
            version: PROTOCOL_VERSION,
            history: H,
            from: head + 1,
            head: head + 10,
            first: 1,
            epochs: Default::default(),
        },
        now,
    );
    assert_eq!(t.state(), TwinState::Streaming);
    t
}

fn frame(seq: u64, blob: &[u8]) -> Vec<u8> {
    let h = FrameHeader {
        seq,
        kind: 2,
        meta_len: 0,
        blob_len: blob.len() as u64,
        payload_crc: payload_crc(&[], blob),
    };
    let mut b = frame_prefix(&h, &[]);
    b.extend_from_slice(blob);
    b
}

/// Feed the whole of `bytes`, as a driver does.
fn feed(t: &mut TwinCore, bytes: &[u8]) -> Result<(), Refusal> {
    let mut pos = 0;
    loop {
        let (n, ev) = t.handle_frame_data(&bytes[pos..])?;
        pos += n;
        if n == 0 && ev.is_none() {
            return Ok(());
        }
    }
}

#[test]
fn the_twin_refuses_a_gap_and_a_damaged_header() {
    let mut t = twin_streaming(4);
    feed(&mut t, &frame(5, b"x")).expect("frame 5 is next");
    let err = feed(&mut t, &frame(7, b"x")).expect_err("a gap");
    assert_eq!(
        err,
        Refusal::Gap {
            expected: 6,
            got: 7
        }
    );
    assert_eq!(
        t.poll_transmit()
            .map(|m| matches!(m, TwinMsg::Hello { .. })),
        Some(true)
    );
    assert_eq!(t.poll_transmit(), Some(TwinMsg::Refuse(err)));

    let mut t = twin_streaming(4);
    let mut bad = frame(5, b"x");
    bad[3] ^= 1;
    assert!(matches!(feed(&mut t, &bad), Err(Refusal::BadFrame(_))));
    assert_eq!(t.state(), TwinState::Closed);
}

#[test]
fn the_twin_acks_only_what_a_sync_made_durable() {
    let mut t = twin_streaming(0);
    while t.poll_transmit().is_some() {}
    t.handle_committed(1);
    t.handle_committed(2);
    assert!(t.needs_sync());
    assert_eq!(t.poll_transmit(), None, "nothing acked before the sync");
    t.handle_synced(2);
    assert_eq!(t.poll_transmit(), Some(TwinMsg::Ack { durable: 2 }));
    assert!(!t.needs_sync());
}

#[test]
fn a_twin_with_frames_refuses_another_history_and_a_fresh_one_adopts_it() {
    let now = Now::system();
    let welcome = PrimaryMsg::Welcome {
        version: PROTOCOL_VERSION,
        history: [1; 16],
        from: 4,
        head: 9,
        first: 1,
        epochs: Default::default(),
    };
    let mut t = TwinCore::new(
        Timers::default(),
        TwinView {
            history: H,
            head: Position { seq: 3, crc: 1 },
            first: 1,
            epochs: Default::default(),
        },
        now,
    );
    t.handle_message(welcome, now);
    assert!(matches!(
        t.poll_action(),
        Some(TwinAction::Close(Refusal::History { .. }))
    ));

    let welcome = PrimaryMsg::Welcome {
        version: PROTOCOL_VERSION,
        history: [1; 16],
        from: 1,
        head: 9,
        first: 1,
        epochs: Default::default(),
    };
    let mut t = TwinCore::new(
        Timers::default(),
        TwinView {
            history: H,
            head: Position::default(),
            first: 1,
            epochs: Default::default(),
        },
        now,
    );
    t.handle_message(welcome, now);
    assert_eq!(t.poll_action(), Some(TwinAction::AdoptHistory([1; 16])));
    assert_eq!(t.state(), TwinState::Streaming);
}

/// An erase keeps no crc of what it erased: a twin whose head is a frame
/// the primary has erased since (the twin erases it when it applies the
/// Erase frame that follows) is welcomed, not refused as diverged, and
/// its store reports arrive only once it streams.
#[test]
fn a_twin_head_erased_on_the_primary_since_is_welcomed() {
    let now = Now::system();
    let mut c = primary(10, 1);
    c.handle_hello(
        hello(H, 5, 0xaaaa),
        |_| {
            Some(HeadFrame {
                crc: 0xbbbb,
                erased: true,
            })
        },
        now,
    );
    assert_eq!(c.state(), PrimaryState::Streaming);
    assert!(matches!(
        c.poll_transmit(),
        Some(PrimaryMsg::Welcome { from: 6, .. })
    ));
    c.handle_message(
        TwinMsg::Store(twinlog::repl::StoreHealth {
            applied: 5,
            ..Default::default()
        }),
        now,
    );
    let mut reported = None;
    while let Some(a) = c.poll_action() {
        if let PrimaryAction::TwinStore(h) = a {
            reported = Some(h.applied);
        }
    }
    assert_eq!(reported, Some(5));

    let mut c = primary(10, 1);
    c.handle_message(TwinMsg::Store(Default::default()), now);
    assert!(matches!(refused(&mut c), Refusal::Protocol(_)));
}

const LIFE: u64 = 1;

/// A primary that restarted at `restart_head` in its second life, with
/// `head` frames now; the twin's history is its first life's.
fn restarted_primary(head: u64, restart_head: u64) -> PrimaryCore {
    PrimaryCore::new(
        Timers::default(),
        PrimaryView {
            history: H,
            head,
            first: 1,
            epochs: second_life(restart_head),
        },
        Now::system(),
    )
}

fn second_life(restart_head: u64) -> EpochHistory {
    let mut h = EpochHistory::default();
    h.begin(LIFE, restart_head).expect("a life");
    h
}

/// Frames are shipped before the primary's sync: a twin holding frames
/// of the primary's earlier life past where its new life began is told
/// to cut them after that point, with the primary's frame there to check,
/// whatever the bytes of the frames at those sequences. Further ahead than
/// one unsynced group, nothing is cut.
#[test]
fn a_twin_past_the_restart_head_is_told_to_cut_what_the_primary_lost() {
    let now = Now::system();
    let frame = |seq: u64| Some(HeadFrame::crc(seq as u32 * 7));
    let lost = |after, twin_head, crc| Refusal::LostOnPrimary {
        after,
        twin_head,
        crc,
        epochs: second_life(10),
    };
    // Ahead of the primary, which restarted at its head.
    let mut c = restarted_primary(10, 10);
    c.handle_hello(hello(H, 14, 1), frame, now);
    assert_eq!(refused(&mut c), lost(10, 14, Some(70)));
    // The primary took frames of its own since: another frame at the
    // twin's head.
    let mut c = restarted_primary(20, 10);
    c.handle_hello(hello(H, 14, 1), frame, now);
    assert_eq!(refused(&mut c), lost(10, 14, Some(70)));
    // The same bytes at the twin's head (a retried write, an empty blob):
    // still another frame, written in another life.
    let mut c = restarted_primary(20, 10);
    c.handle_hello(hello(H, 14, 14 * 7), frame, now);
    assert_eq!(refused(&mut c), lost(10, 14, Some(70)));
    // A twin of this life streams on.
    let mut c = restarted_primary(20, 10);
    c.handle_hello(hello_in(H, 14, 14 * 7, second_life(10)), frame, now);
    assert_eq!(c.state(), PrimaryState::Streaming);
    // At or below where the life began, a difference is a divergence.
    let mut c = restarted_primary(20, 10);
    c.handle_hello(hello(H, 10, 1), frame, now);
    assert!(matches!(refused(&mut c), Refusal::Diverged { seq: 10, .. }));
    // Further ahead than one unsynced group: not a crash of this primary.
    let far = 10 + twinlog::repl::MAX_SHIPPED_UNSYNCED + 1;
    let mut c = restarted_primary(10, 10);
    c.handle_hello(hello(H, far, 1), frame, now);
    assert!(matches!(refused(&mut c), Refusal::TwinAhead { .. }));
    // The frame where the life began is gone here: the epochs still
    // prove what was lost.
    let mut c = restarted_primary(10, 10);
    c.handle_hello(hello(H, 12, 1), |_| None, now);
    assert_eq!(refused(&mut c), lost(10, 12, None));
}

#[test]
fn a_twin_told_its_frames_were_lost_on_the_primary_cuts_them_then_closes() {
    let now = Now::system();
    let mut t = TwinCore::new(
        Timers::default(),
        TwinView {
            history: H,
            head: Position { seq: 14, crc: 1 },
            first: 1,
            epochs: Default::default(),
        },
        now,
    );
    let why = Refusal::LostOnPrimary {
        after: 10,
        twin_head: 14,
        crc: Some(70),
        epochs: second_life(10),
    };
    t.handle_message(PrimaryMsg::Refuse(why.clone()), now);
    assert_eq!(
        t.poll_action(),
        Some(TwinAction::CutAfter {
            after: 10,
            crc: Some(70)
        })
    );
    assert_eq!(t.poll_action(), Some(TwinAction::Close(why)));
    assert_eq!(t.state(), TwinState::Closed);
}
