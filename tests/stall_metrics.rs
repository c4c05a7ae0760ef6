//! What a slow round waits on is measured: every sync of the log lands in
//! its histogram, every take of the writer lock in the wait histogram, and
//! the primary's core times each publication to the twin's ack covering it.

use std::sync::Arc;
use std::time::Duration;

use twinlog::log::{Kind, Log, Meta};
use twinlog::repl::{
    HeadFrame, Now, Position, PrimaryCore, PrimaryView, Timers, TwinMsg, PROTOCOL_VERSION,
};

#[test]
fn every_sync_and_every_writer_lock_take_is_counted() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = Arc::new(Log::open_with(dir.path(), 4096).expect("log"));
    let before = log.sync_time().snapshot().count;
    for i in 0..20u8 {
        log.append(Kind::Record, &Meta::default(), &[i; 1000])
            .expect("append");
    }
    let syncs = log.sync_time().snapshot();
    // One fdatasync per append, and a seal per roll (1000-byte frames in
    // 4 KiB segments).
    assert!(syncs.count - before >= 20, "{syncs:?}");
    assert_eq!(syncs.buckets.iter().sum::<u64>(), syncs.count);
    let waits = log.writer_wait().snapshot();
    assert!(waits.count >= 40, "stage and lead each take it: {waits:?}");

    // A streaming append holds the writer lock: an appender behind it
    // waits, and the wait is measured.
    let pending = log
        .begin(
            None,
            Kind::Record.as_u16(),
            &Meta::default().encode().expect("meta"),
            3,
        )
        .expect("begin");
    let waited_before = log.writer_wait().snapshot();
    let l2 = log.clone();
    let (tid_tx, tid_rx) = std::sync::mpsc::channel();
    let appender = std::thread::spawn(move || {
        // SAFETY: gettid has no preconditions.
        tid_tx.send(unsafe { libc::gettid() }).expect("send");
        l2.append(Kind::Record, &Meta::default(), b"behind")
            .expect("append")
    });
    let tid = tid_rx.recv().expect("tid");
    // Wait until the appender sleeps on the lock.
    let stat = format!("/proc/self/task/{tid}/stat");
    while !std::fs::read_to_string(&stat)
        .map(|s| s.rsplit(") ").next().is_some_and(|r| r.starts_with('S')))
        .unwrap_or(false)
    {
        std::thread::yield_now();
    }
    let mut p = pending;
    p.write(b"abc").expect("write");
    p.commit().expect("commit");
    appender.join().expect("appender");
    let waited = log.writer_wait().snapshot();
    assert!(waited.count > waited_before.count, "{waited:?}");
    assert!(
        waited.sum_ns > waited_before.sum_ns,
        "the appender's wait is measured: {waited:?}"
    );
}

#[test]
fn the_primary_core_times_each_publication_to_the_ack_covering_it() {
    let h = [7; 16];
    let t0 = Now::system();
    let mut c = PrimaryCore::new(
        Timers::default(),
        PrimaryView {
            history: h,
            head: 4,
            first: 1,
            epochs: Default::default(),
        },
        t0,
    );
    c.handle_hello(
        TwinMsg::Hello {
            version: PROTOCOL_VERSION,
            history: h,
            head: Position { seq: 4, crc: 9 },
            first: 1,
            epochs: Default::default(),
        },
        |_| Some(HeadFrame::crc(9)),
        t0,
    );
    c.handle_appended(5, 100, t0);
    c.handle_appended(6, 100, t0.after(Duration::from_millis(10)));
    c.handle_appended(7, 100, t0.after(Duration::from_millis(20)));
    assert_eq!(c.take_ack_delays().count(), 0);
    c.handle_message(
        TwinMsg::Ack { durable: 6 },
        t0.after(Duration::from_millis(50)),
    );
    let delays: Vec<Duration> = c.take_ack_delays().collect();
    assert_eq!(
        delays,
        vec![Duration::from_millis(50), Duration::from_millis(40)],
        "one per publication the ack covered"
    );
    c.handle_message(
        TwinMsg::Ack { durable: 7 },
        t0.after(Duration::from_millis(60)),
    );
    assert_eq!(
        c.take_ack_delays().collect::<Vec<_>>(),
        vec![Duration::from_millis(40)]
    );
}
