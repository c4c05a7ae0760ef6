//! A client that stops sending a request's body holds no one up: it is cut
//! off after the piece deadline with `BodyStalled`, nothing of its entry is
//! written, and every other writer goes on meanwhile.

use std::sync::Arc;
use std::time::Duration;

use twinlog::net::{self, Pins, Role};
use twinlog::node::api::ApiError;
use twinlog::node::{Client, Durability, PrimaryOptions, Request, Response};

#[path = "support/in_process.rs"]
mod in_process;
use in_process::{start_exactly, Running};

const PIECE_DEADLINE: Duration = Duration::from_millis(400);

fn start(dir: &std::path::Path) -> Running {
    start_with(dir, PrimaryOptions::default().memory_budget)
}

fn start_with(dir: &std::path::Path, memory_budget: u64) -> Running {
    start_limited(
        dir,
        PrimaryOptions {
            memory_budget,
            ..PrimaryOptions::default()
        },
    )
}

fn start_limited(dir: &std::path::Path, cfg: PrimaryOptions) -> Running {
    start_exactly(
        dir,
        PrimaryOptions {
            body_piece_deadline: PIECE_DEADLINE,
            ..cfg
        },
    )
}

/// Announce an append of `blob_len` bytes, send `send` of them, and hold
/// the stream open: answers the stream to read the primary's answer from.
async fn stall(r: &Running, blob_len: u64, send: usize) -> (quinn::SendStream, quinn::RecvStream) {
    let pins = Arc::new(Pins::new().pin(r.server.fingerprint(), Role::Primary));
    let endpoint = net::client(&r.client, pins).expect("endpoint");
    let conn = net::connect(&endpoint, r.addr).await.expect("connect");
    let (mut tx, rx) = conn.open_bi().await.expect("stream");
    let req = Request::Append {
        kind: 0x8000,
        meta: b"stalled".to_vec(),
        blob_len,
        durability: Durability::Local,
    };
    net::write_msg(&mut tx, &req).await.expect("request");
    tx.write_all(&vec![7u8; send]).await.expect("some bytes");
    // The connection lives as long as its streams are held.
    std::mem::forget(endpoint);
    (tx, rx)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_body_is_cut_off_by_name_and_other_writers_go_on() {
    let dir = tempfile::tempdir().expect("tempdir");
    let r = start(dir.path());
    let client = r.connect().await;
    // A streamed entry (past the whole-read size) and a small one, both
    // stalled after a few bytes; and one that sends nothing at all.
    let mut stalled = [
        stall(&r, 4 << 20, 1000).await,
        stall(&r, 1000, 10).await,
        stall(&r, 8 << 20, 0).await,
    ];
    // Meanwhile every other writer is served, each within a deadline or
    // so of waiting.
    let started = tokio::time::Instant::now();
    for i in 0..20u8 {
        let (seq, _) = tokio::time::timeout(
            Duration::from_secs(5),
            client.append(0x8000, b"", &[i; 100], Durability::Local),
        )
        .await
        .expect("answered while others stall")
        .expect("appended");
        assert_eq!(
            seq,
            u64::from(i) + 1,
            "nothing of a stalled body is in the log"
        );
    }
    println!(
        "20 appends beside 3 stalled bodies: {:?}",
        started.elapsed()
    );
    for (_tx, rx) in stalled.iter_mut() {
        let answer = tokio::time::timeout(Duration::from_secs(10), net::read_msg::<Response>(rx))
            .await
            .expect("answered")
            .expect("read");
        match answer {
            Some(Response::Error(ApiError::BodyStalled { after_ms, .. })) => {
                assert_eq!(after_ms, PIECE_DEADLINE.as_millis() as u64)
            }
            other => panic!("a stalled body answered {other:?}"),
        }
    }
    assert_eq!(r.primary.log().head_seq(), 20, "no stalled entry landed");
    let (seq, _) = client
        .append(0x8000, b"", b"after", Durability::Local)
        .await
        .expect("append after");
    assert_eq!(seq, 21);
}

/// A streamed body under the staging bound is staged whole before the
/// log's writer is taken: a client that stalls mid-body holds no writer
/// even for one piece deadline. With a deadline of 30 s, 20 appends beside
/// two stalled bodies (4 and 64 MiB) are each answered within 2 s, and the
/// stalled ones end by name with nothing of them in the log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_body_under_the_staging_bound_holds_no_writer_at_all() {
    let dir = tempfile::tempdir().expect("tempdir");
    let r = start_exactly(
        dir.path(),
        PrimaryOptions {
            body_piece_deadline: Duration::from_secs(30),
            ..PrimaryOptions::default()
        },
    );
    let client = r.connect().await;
    let mut stalled = [
        stall(&r, 4 << 20, 1000).await,
        stall(&r, 64 << 20, 3 << 20).await,
    ];
    // The staged bytes show before anything is appended.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while r.primary.status().staging_held < (64 << 20) {
        assert!(tokio::time::Instant::now() < deadline, "nothing was staged");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    for i in 0..20u8 {
        let (seq, _) = tokio::time::timeout(
            Duration::from_secs(2),
            client.append(0x8000, b"", &[i; 100], Durability::Local),
        )
        .await
        .expect("answered at once while others stall")
        .expect("appended");
        assert_eq!(seq, u64::from(i) + 1);
    }
    // Ending the stalled streams ends their requests by name.
    for (tx, rx) in stalled.iter_mut() {
        let _ = tx.finish();
        let answer = tokio::time::timeout(Duration::from_secs(10), net::read_msg::<Response>(rx))
            .await
            .expect("answered")
            .expect("read");
        match answer {
            Some(Response::Error(ApiError::BadRequest(why))) => {
                assert!(why.contains("the body ended after"), "{why}")
            }
            other => panic!("a short body answered {other:?}"),
        }
    }
    assert_eq!(r.primary.log().head_seq(), 20, "no stalled entry landed");
    assert_eq!(r.primary.status().staging_held, 0, "staging was given back");
    // A staged body that arrives whole lands whole.
    let blob: Vec<u8> = (0..(5 << 20) + 3).map(|i: u32| (i % 251) as u8).collect();
    let (seq, _) = client
        .append(0x8000, b"whole", &blob, Durability::Local)
        .await
        .expect("a staged append");
    let back = client.read(seq).await.expect("read back");
    assert!(
        back.meta == b"whole" && back.blob == blob,
        "the staged body reads back as sent"
    );
}

/// Bodies held whole are charged to the memory budget before they are
/// read: with a 3 MiB budget, 12 writers of 1 MiB blobs never make the
/// primary hold more than 3 MiB of them, and every one is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_held_whole_stay_inside_the_memory_budget() {
    let dir = tempfile::tempdir().expect("tempdir");
    let budget = 3 << 20;
    let r = Arc::new(start_with(dir.path(), budget));
    let mut writers = Vec::new();
    for w in 0..12u8 {
        let r = r.clone();
        writers.push(tokio::spawn(async move {
            let client = r.connect().await;
            for _ in 0..4 {
                client
                    .append(0x8000, b"", &vec![w; 1 << 20], Durability::Local)
                    .await
                    .expect("append");
            }
        }));
    }
    let mut most = 0;
    while writers.iter().any(|w| !w.is_finished()) {
        most = most.max(r.primary.status().memory_held);
        tokio::task::yield_now().await;
    }
    for w in writers {
        w.await.expect("writer");
    }
    println!("most held: {most} bytes of a {budget}-byte budget");
    assert!(
        most <= budget,
        "held {most} bytes past the budget of {budget}"
    );
    assert!(most > 0, "the bodies were charged");
    assert_eq!(r.primary.log().head_seq(), 48);
    assert_eq!(
        r.primary.status().memory_held,
        0,
        "every charge was given back"
    );
}

/// Client connections past the cap are closed at once by name; the ones
/// served go on, and a slot freed is taken again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_connections_past_the_cap_are_refused_by_name() {
    let dir = tempfile::tempdir().expect("tempdir");
    let r = start_limited(
        dir.path(),
        PrimaryOptions {
            max_clients: 2,
            ..PrimaryOptions::default()
        },
    );
    let connect = || Client::connect(&r.client, r.server.fingerprint(), r.addr);
    let first = connect().await.expect("first");
    let second = connect().await.expect("second");
    for c in [&first, &second] {
        c.append(0x8000, b"", b"x", Durability::Local)
            .await
            .expect("served");
    }
    let third = connect().await.expect("the handshake itself completes");
    match third.append(0x8000, b"", b"x", Durability::Local).await {
        Err(e) => {
            let why = e.to_string();
            assert!(why.contains("at most 2 client connections"), "{why}");
        }
        Ok(_) => panic!("a third connection was served"),
    }
    assert_eq!(
        r.primary.log().head_seq(),
        2,
        "nothing of the refused one landed"
    );
    drop(first);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let fourth = connect().await.expect("connect");
        if fourth
            .append(0x8000, b"", b"y", Durability::Local)
            .await
            .is_ok()
        {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the freed slot was never taken"
        );
        tokio::task::yield_now().await;
    }
    second
        .append(0x8000, b"", b"z", Durability::Local)
        .await
        .expect("still served");
}
