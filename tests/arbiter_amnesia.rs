//! etcd is a witness, not the truth: real processes under a real etcd
//! that loses its data or is rolled back to an earlier snapshot. An epoch
//! is taken only above the highest epoch either box recorded; a box that
//! cannot know that epoch does not lead; and a take the box would refuse
//! is never committed, so nobody exits and the pair heals.
//!
//! Each test acts out a finding of the arbiter's adversary: a deposed box
//! leading at an older epoch after etcd lost its data, and a twin taking
//! a term in a rolled-back etcd that it then refused and exited on.

use std::path::Path;
use std::time::Duration;

use twinlog::daemon;
use twinlog::node::epoch::Epochs;
use twinlog::node::Durability;
use twinlog::repl::epochs::LIFE_BITS;

#[path = "support/children.rs"]
mod children;
#[path = "support/etcd_pair.rs"]
mod etcd_pair;
use children::{pstatus, tstatus, Daemon};
use etcd_pair::*;

const T1: u64 = 1 << LIFE_BITS;
const T2: u64 = 2 << LIFE_BITS;

/// The epochs a data directory holds, read beside its running daemon.
fn epochs_of(dir: &Path) -> twinlog::repl::EpochHistory {
    Epochs::load(dir, 0).expect("the epochs read").history()
}

/// The appends of `acked` all read back from the primary of `c`.
async fn reads_back(c: &twinlog::node::Client, acked: &[(u64, Vec<u8>)]) {
    for (seq, b) in acked {
        let e = c.read(*seq).await.expect("an acknowledged frame is there");
        assert_eq!(&e.blob, b, "frame {seq}");
    }
}

/// A was killed and B took over at 1.0, then B died and etcd lost its
/// data, and A started first. A may not lead: the newest epoch it can
/// know of is its own 0.x, and B may hold a newer one. It waits, says
/// why, and acknowledges nothing; once B is back, B leads above both
/// histories and A rejoins it. Nothing acknowledged is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deposed_box_does_not_lead_after_etcd_loses_its_data() {
    let mut pair = Pair::new(daemon::config::Policy::Wait);
    let mut a = pair.start_a();
    let mut b = pair.start_b();
    pair.in_sync().await;
    let c = pair.client(pair.a_fp, pair.a_listen).await;
    let mut acked = append_twin(&c, 0, 20).await;
    drop(c);

    a.kill();
    pair.leads("B", pair.b_metrics, false).await;
    let cb = pair.client(pair.b_fp, pair.b_listen).await;
    for i in 100..110 {
        let (seq, _) = cb
            .append(KIND, b"", &blob(i), Durability::Local)
            .await
            .expect("B acknowledges `local` while A is down");
        acked.push((seq, blob(i)));
    }
    drop(cb);
    assert_eq!(pstatus(pair.b_metrics).expect("B's status").epoch, T1);

    b.kill();
    pair.etcd.wipe().expect("etcd loses its data");
    let a = pair.start_a();
    let waits = testkit::until("A says etcd forgot and it waits", WAIT, || {
        pstatus(pair.a_metrics).filter(|s| s.arbiter_amnesia.is_some() && s.waiting.is_some())
    })
    .await;
    eprintln!("A waits: {:?} / {:?}", waits.arbiter_amnesia, waits.waiting);
    // A client of A is held, not served: its append is not acknowledged
    // while B is away, and never at an epoch below B's.
    let ca = pair.client(pair.a_fp, pair.a_listen).await;
    let held = tokio::spawn(async move {
        ca.append(KIND, b"", b"to the deposed A", Durability::Local)
            .await
    });
    let waited = pstatus(pair.a_metrics).expect("A's status");
    assert!(
        waited.waiting.is_some() && waited.head == 20,
        "A wrote nothing while it waits: {waited:?}"
    );

    let b_primary = pair.b_cfg.with_file_name(daemon::PRIMARY_CONFIG);
    let _b = Daemon::start("primary", &b_primary, &pair.log("b2"));
    pair.leads("B", pair.b_metrics, true).await;
    let s = pstatus(pair.b_metrics).expect("B's status");
    assert!(
        s.epoch > T1 && s.arbiter_amnesia.is_none(),
        "B leads above 1.0, etcd believed again: {s:?}\n{}",
        pair.logs()
    );
    let cb = pair.client(pair.b_fp, pair.b_listen).await;
    let more = append_twin(&cb, 200, 5).await;
    reads_back(&cb, &acked).await;
    reads_back(&cb, &more).await;
    match held.await.expect("the held append's task") {
        Ok(answer) => panic!("the deposed A acknowledged {answer:?}"),
        Err(e) => eprintln!("the append held by A ended: {e}"),
    }
    let t = testkit::until("A follows B as its twin", WAIT, || {
        tstatus(pair.a_metrics).filter(|t| t.connected && t.head >= s.head)
    })
    .await;
    assert_eq!(t.epoch, s.epoch);
    let (ha, hb) = (
        epochs_of(pair.a_cfg.parent().expect("A's dir")),
        epochs_of(pair.b_cfg.parent().expect("B's dir")),
    );
    assert_eq!(ha, hb, "A follows B's history");
    assert!(hb.starts().iter().any(|e| e.epoch == T1));
    eprintln!("healed: B at {}, histories {:?}", s.epoch, hb.starts());
    drop(a);
}

/// A failover to B (1.0), a failover back to A (2.0), then etcd restored
/// from a snapshot taken before both, whose sync record names B, with A
/// frozen so that B reads it first. Nobody takes 1.0 (or any epoch) a
/// second time, nobody exits, and the pair heals under a new epoch above
/// 2.0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_etcd_rolled_back_to_an_older_snapshot_gives_no_epoch_twice() {
    let mut pair = Pair::new(daemon::config::Policy::Wait);
    let mut a = pair.start_a();
    let mut b = pair.start_b();
    pair.in_sync().await;
    let c = pair.client(pair.a_fp, pair.a_listen).await;
    let mut acked = append_twin(&c, 0, 10).await;
    drop(c);
    let snapshot = pair.root.path().join("etcd-snapshot");
    pair.etcd.snapshot_to(&snapshot).expect("a snapshot");

    // A failover to B, and A back as its twin.
    a.kill();
    pair.leads("B", pair.b_metrics, false).await;
    let a_cfg = pair.a_cfg.clone();
    let a = Daemon::start("primary", &a_cfg, &pair.log("a2"));
    pair.leads("B", pair.b_metrics, true).await;
    let cb = pair.client(pair.b_fp, pair.b_listen).await;
    acked.extend(append_twin(&cb, 100, 10).await);
    drop(cb);

    // A failover back to A, and B back as its twin.
    b.kill();
    pair.leads("A", pair.a_metrics, false).await;
    let b_primary = pair.b_cfg.with_file_name(daemon::PRIMARY_CONFIG);
    let mut b = Daemon::start("primary", &b_primary, &pair.log("b2"));
    pair.leads("A", pair.a_metrics, true).await;
    let s = pstatus(pair.a_metrics).expect("A's status");
    assert_eq!(s.epoch, T2, "A leads 2.0");
    let ca = pair.client(pair.a_fp, pair.a_listen).await;
    acked.extend(append_twin(&ca, 200, 10).await);
    drop(ca);

    // A frozen, etcd rolled back: the leader key the snapshot holds runs
    // out with nobody renewing it, and its sync record names B in sync at
    // 0.1. B may not take 1.0 (or any term) on that word: it says etcd
    // forgot, and it cannot reach A to compare histories.
    a.signal(libc::SIGSTOP);
    pair.etcd
        .restore_from(&snapshot)
        .expect("etcd rolled back to the snapshot");
    let t = testkit::until("B says etcd forgot", WAIT, || {
        tstatus(pair.b_metrics).filter(|t| {
            t.arbiter
                .as_ref()
                .is_some_and(|a| a.amnesia.is_some() && a.leader.is_none())
        })
    })
    .await;
    eprintln!("B: {:?}", t.arbiter);
    assert!(b.alive(), "B exited\n{}", pair.logs());
    a.signal(libc::SIGCONT);
    // A's lease is not in the snapshot: it ends its life, and leads again
    // only above both histories, B following it.
    let healed = until_async("A acknowledges `twin` after the rollback", || async {
        let s = pstatus(pair.a_metrics)?;
        if s.epoch <= T2
            || !s
                .arbiter
                .as_ref()
                .is_some_and(|a| a.lease.held && a.twin_in_sync)
        {
            return None;
        }
        let c = tokio::time::timeout(
            Duration::from_secs(1),
            twinlog::node::Client::connect(&pair.admin, pair.a_fp, pair.a_listen),
        )
        .await
        .ok()?
        .ok()?;
        let (seq, d) = c
            .append(KIND, b"", b"after the rollback", Durability::Twin)
            .await
            .ok()?;
        (d == Durability::Twin).then_some((c, seq, s.epoch))
    })
    .await;
    assert!(b.alive(), "B exited\n{}", pair.logs());
    let (c, seq, epoch) = healed;
    assert!(seq > acked.last().map_or(0, |a| a.0));
    reads_back(&c, &acked).await;
    let t = testkit::until("B follows A at the new epoch", WAIT, || {
        tstatus(pair.b_metrics).filter(|t| t.connected && t.epoch == epoch)
    })
    .await;
    let (ha, hb) = (
        epochs_of(pair.a_cfg.parent().expect("A's dir")),
        epochs_of(pair.b_cfg.parent().expect("B's dir")),
    );
    assert_eq!(ha, hb, "B follows A's history");
    let epochs: Vec<u64> = ha.starts().iter().map(|e| e.epoch).collect();
    assert!(
        epochs.contains(&T1) && epochs.contains(&T2) && epochs.last() == Some(&epoch),
        "one history, each epoch once: {epochs:?}\n{}",
        pair.logs()
    );
    eprintln!("healed at {epoch:#x} (head {}): {epochs:?}", t.head);
}
