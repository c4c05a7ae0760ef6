//! Hostile and slow clients against a real primary daemon on loopback (a
//! child process, so its memory is its own to measure):
//!
//! - eight clients each start reading a 64 MiB object (four git objects,
//!   four large objects) and then stop reading: the daemon's peak RSS grows
//!   by far less than what they asked for (the objects are sent in pieces,
//!   never held whole), and meanwhile every other client's store requests
//!   and appends are answered at once (no read holds the store's lock);
//! - a client announces a 64 MiB append, sends a little and stalls: the
//!   other writers' p99 stays small (the body is staged, the log's writer
//!   never waits on it), and the stalled request ends in `BodyStalled`
//!   with nothing of it in the log;
//! - 300 connections that say nothing flood the status server of a daemon
//!   allowed 256 descriptors: it spends next to no CPU on them, goes on
//!   serving clients (which need descriptors of their own), and answers
//!   `/status` again once the flood's connections time out.

#[path = "support/primary_proc.rs"]
mod primary_proc;

use std::time::{Duration, Instant};

use primary_proc::{pattern, start_in, Primary};
use twinlog::daemon;
use twinlog::net;
use twinlog::node::api::{ApiError, RefMove};
use twinlog::node::{Client, Durability, Request, Response, Status};
use twinlog::objects::ObjType;
use twinlog::store::frames::{lfs_oid, PackBuilder};

const OBJECT: usize = 64 << 20;

/// A primary with no twin, one of its `[limits]` set as given.
fn start(root: &std::path::Path, key: &str, value: u64) -> Primary {
    start_in(root, &[(key, value)], &[], None)
}

/// A stream of the protocol, opened by hand so the test decides when to
/// read its answer; its connection lives as long as the test.
async fn raw_stream(p: &Primary, req: &Request) -> (quinn::SendStream, quinn::RecvStream) {
    let conn = p.connect(&p.admin).await.expect("connect");
    let stream = conn.ask(req).await;
    std::mem::forget(conn);
    stream
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_stopped_readers_of_64_mib_objects_cost_little_memory_and_hold_no_one_up() {
    let root = tempfile::tempdir().expect("tempdir");
    // The readers stop for as long as the rounds below take, which on a
    // loaded machine passed the default 3 s send deadline, and the
    // daemon rightly cut them: the deadline is not what this measures.
    let p = start_in(
        root.path(),
        &[
            ("memory_budget_mib", 512),
            ("body_piece_timeout_ms", 60_000),
        ],
        &[],
        None,
    );
    p.serving().await;
    let c = Client::connect(&p.admin, p.fp, p.listen)
        .await
        .expect("client");
    c.create_repo("big", Durability::Local)
        .await
        .expect("create");
    let git = pattern(1, OBJECT);
    let mut pack = PackBuilder::new();
    let git_oid = pack.add(ObjType::Blob, &git).expect("add");
    let pack = pack.into_bytes();
    let main = vec![RefMove {
        name: "refs/heads/main".into(),
        old: None,
        new: Some(git_oid),
    }];
    c.push("big", &pack, main, Durability::Local)
        .await
        .expect("push");
    drop(pack);
    let lfs = pattern(2, OBJECT);
    let lfs_id = lfs_oid(&lfs);
    c.lfs_put("big", lfs_id, lfs.len() as u64, &lfs[..], Durability::Local)
        .await
        .expect("lfs put");

    // The peak from here on: what the readers cost.
    p.reset_peak();
    let before = p.proc_field("VmRSS");

    let mut readers = Vec::new();
    for i in 0..8 {
        let req = if i % 2 == 0 {
            Request::ReadObject {
                repo: "big".into(),
                oid: git_oid,
            }
        } else {
            Request::LfsGet {
                repo: "big".into(),
                oid: lfs_id,
            }
        };
        let (tx, mut rx) = raw_stream(&p, &req).await;
        match net::read_msg::<Response>(&mut rx).await.expect("head") {
            Some(Response::Object { len, .. }) => assert_eq!(len, OBJECT as u64),
            other => panic!("a read answered {other:?}"),
        }
        // A first piece, then the reader stops reading.
        let mut first = vec![0u8; 1 << 20];
        rx.read_exact(&mut first).await.expect("a first piece");
        readers.push((i, tx, rx, first));
    }
    // While they hold their reads open, the store and the log serve the
    // others at once.
    for round in 0..5u8 {
        let started = Instant::now();
        c.create_repo(&format!("r{round}"), Durability::Local)
            .await
            .expect("create");
        c.put_doc("d", &[round; 100], Durability::Local)
            .await
            .expect("put doc");
        assert_eq!(c.get_doc("d").await.expect("doc"), Some(vec![round; 100]));
        c.append(0x8000, b"", &[round; 64], Durability::Local)
            .await
            .expect("append");
        let took = started.elapsed();
        assert!(
            took < Duration::from_secs(2),
            "round {round} took {took:?} beside stopped readers"
        );
    }
    let peak = p.proc_field("VmHWM");
    let grew = peak.saturating_sub(before);
    println!(
        "8 stopped readers of 64 MiB objects: RSS {} MiB before, peak {} MiB (+{} MiB)",
        before >> 20,
        peak >> 20,
        grew >> 20
    );
    // Each connection may hold its QUIC send window (8 MiB) and a few
    // pieces: 8 x 9 MiB, well under the 512 MiB the objects would take.
    assert!(
        grew < 128 << 20,
        "the daemon grew by {} MiB for 8 stopped readers",
        grew >> 20
    );

    // Each reader then reads on to the end and gets the object whole.
    for (i, _tx, mut rx, first) in readers {
        let rest = rx.read_to_end(OBJECT).await.expect("the rest");
        let whole = [first, rest].concat();
        let want = if i % 2 == 0 { &git } else { &lfs };
        assert!(whole == *want, "reader {i} got its object whole");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_64_mib_append_holds_up_no_other_writer() {
    let root = tempfile::tempdir().expect("tempdir");
    let p = start(root.path(), "body_piece_timeout_ms", 4000);
    p.serving().await;
    let (mut stalled_tx, mut stalled_rx) = raw_stream(
        &p,
        &Request::Append {
            kind: 0x8000,
            meta: b"stalled".to_vec(),
            blob_len: 64 << 20,
            durability: Durability::Local,
            once: None,
        },
    )
    .await;
    stalled_tx
        .write_all(&[7u8; 1000])
        .await
        .expect("a few bytes");
    let stalled_at = Instant::now();
    testkit::until("the stalled body staged", Duration::from_secs(10), || {
        let (_, s) = daemon::fetch_status::<Status>(p.metrics).expect("status");
        (s.staging_held > 0).then_some(())
    })
    .await;

    let mut writers = Vec::new();
    for w in 0..8u8 {
        let c = Client::connect(&p.admin, p.fp, p.listen)
            .await
            .expect("client");
        writers.push(tokio::spawn(async move {
            let mut took = Vec::new();
            for i in 0..25u8 {
                let started = Instant::now();
                c.append(0x8000, b"", &[w ^ i; 128], Durability::Local)
                    .await
                    .expect("append");
                took.push(started.elapsed());
            }
            took
        }));
    }
    let mut took = Vec::new();
    for w in writers {
        took.extend(w.await.expect("writer"));
    }
    let done = stalled_at.elapsed();
    took.sort();
    let p99 = took[took.len() * 99 / 100];
    println!(
        "200 appends beside a stalled 64 MiB append: p99 {p99:?}, max {:?}, all done {done:?} after the stall began",
        took[took.len() - 1]
    );
    assert!(
        p99 < Duration::from_secs(1),
        "p99 {p99:?} beside a stalled body"
    );
    match net::read_msg::<Response>(&mut stalled_rx)
        .await
        .expect("answer")
    {
        Some(Response::Error(ApiError::BodyStalled {
            received, after_ms, ..
        })) => {
            assert_eq!(after_ms, 4000);
            assert_eq!(received, 1000);
        }
        other => panic!("the stalled append answered {other:?}"),
    }
    let c = Client::connect(&p.admin, p.fp, p.listen)
        .await
        .expect("client");
    let (_, s) = daemon::fetch_status::<Status>(p.metrics).expect("status");
    assert_eq!(s.head, 200, "nothing of the stalled body is in the log");
    assert_eq!(s.staging_held, 0, "its staging was given back");
    let (seq, _) = c
        .append(0x8000, b"", b"after", Durability::Local)
        .await
        .expect("append after");
    assert_eq!(seq, 201);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_idle_status_connections_costs_little_cpu_and_blocks_no_client() {
    let root = tempfile::tempdir().expect("tempdir");
    let p = start_in(
        root.path(),
        &[("max_client_connections", 64)],
        &[],
        Some(256),
    );
    p.serving().await;
    let c = Client::connect(&p.admin, p.fp, p.listen)
        .await
        .expect("client");
    let metrics = p.metrics;
    let flood: Vec<std::net::TcpStream> = tokio::task::spawn_blocking(move || {
        (0..300)
            .map(|_| std::net::TcpStream::connect(metrics).expect("connect"))
            .collect()
    })
    .await
    .expect("the flood");
    // A window to sample the daemon's CPU in while the flood is held: the
    // sleep is the measurement.
    let before = p.daemon.cpu_secs();
    let window = Instant::now();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let idle_cpu = p.daemon.cpu_secs() - before;
    let window = window.elapsed();
    // Clients go on, store included: the flood took no descriptor they need.
    for round in 0..20u8 {
        c.create_repo(&format!("r{round}"), Durability::Local)
            .await
            .expect("create beside the flood");
        c.append(0x8000, b"", &[round; 64], Durability::Local)
            .await
            .expect("append beside the flood");
    }
    println!("300 idle status connections: {idle_cpu:.2} s of CPU in {window:?}");
    assert!(
        idle_cpu < 0.5,
        "{idle_cpu:.2} s of CPU in {window:?} on idle connections"
    );
    // Each idle connection is dropped after the head deadline, so `/status`
    // is answered again while the flood is still held open.
    testkit::poll(
        "/status answered again",
        Duration::from_secs(30),
        Duration::from_millis(50),
        || {
            daemon::fetch_status::<Status>(metrics)
                .is_ok_and(|(_, s)| s.head == 40)
                .then_some(())
        },
    )
    .await;
    drop(flood);
}
