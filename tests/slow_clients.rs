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
        once: None,
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
    testkit::until("the stalled bodies staged", Duration::from_secs(10), || {
        (r.primary.status().staging_held >= (64 << 20)).then_some(())
    })
    .await;
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

/// Client connections are shared: past the cap a read client is refused
/// by name while every connection it holds is busy, an idle one of its
/// own is closed for its newer one instead, and an admin gets in past the
/// cap all the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_connections_are_shared_and_an_admin_always_gets_in() {
    use std::collections::HashMap;
    use twinlog::log::Log;
    use twinlog::net::Identity;
    use twinlog::node::api::ClientRole;
    use twinlog::node::Primary;

    let dir = tempfile::tempdir().expect("tempdir");
    let server = Identity::mint().expect("mint");
    let (a, b, admin) = (
        Identity::mint().expect("mint"),
        Identity::mint().expect("mint"),
        Identity::mint().expect("mint"),
    );
    let mut pins = Pins::new();
    let mut roles = HashMap::new();
    for (id, role) in [
        (&a, ClientRole::Read),
        (&b, ClientRole::Read),
        (&admin, ClientRole::Admin),
    ] {
        pins = pins.pin(id.fingerprint(), Role::Client);
        roles.insert(id.fingerprint(), role);
    }
    let pins = Arc::new(pins);
    let log = Arc::new(Log::open(dir.path()).expect("log"));
    let endpoint = net::server(([127, 0, 0, 1], 0).into(), &server, pins.clone()).expect("server");
    let addr = endpoint.local_addr().expect("addr");
    let primary = Primary::new(
        log.clone(),
        pins,
        PrimaryOptions {
            max_clients: 2,
            ..PrimaryOptions::default()
        },
    );
    primary.set_client_roles(roles);
    let (_stop, stopped) = tokio::sync::watch::channel(false);
    tokio::spawn(primary.clone().serve(endpoint, stopped));
    let fp = server.fingerprint();
    let root = Client::connect(&admin, fp, addr).await.expect("admin");
    root.append(0x8000, b"", b"x", Durability::Local)
        .await
        .expect("served");

    // Each reader holds a connection busy with a tail: the cap is reached.
    let (a1, b1) = (
        Client::connect(&a, fp, addr).await.expect("a"),
        Client::connect(&b, fp, addr).await.expect("b"),
    );
    let mut tails = Vec::new();
    for c in [&a1, &b1] {
        let mut t = c.tail(1).await.expect("tail");
        t.next().await.expect("a frame").expect("one");
        tails.push(t);
    }
    // A third read connection finds none idle of its own to give up.
    let b2 = Client::connect(&b, fp, addr)
        .await
        .expect("the handshake itself completes");
    match b2.status().await {
        Err(e) => {
            let why = e.to_string();
            assert!(why.contains("connections, their role's share"), "{why}");
        }
        Ok(_) => panic!("a third read connection was served"),
    }
    // The admin gets in past the cap.
    let root2 = Client::connect(&admin, fp, addr).await.expect("admin");
    root2
        .status()
        .await
        .expect("an admin is served past the cap");
    let s = primary.status();
    assert_eq!(s.refusals.get("Connection.RoleShare"), Some(&1), "{s:?}");

    // A reader whose own connection is idle has it closed for the new one.
    drop(tails.pop());
    testkit::until("b's tail ends", Duration::from_secs(10), || {
        (primary.status().client_requests == 1).then_some(())
    })
    .await;
    let b3 = Client::connect(&b, fp, addr).await.expect("b again");
    b3.status()
        .await
        .expect("served in place of its own idle one");
    assert!(b1.status().await.is_err(), "the idle one was closed");
    assert_eq!(primary.status().refusals.get("Cut.Reclaimed"), Some(&1));
    assert_eq!(log.head_seq(), 1, "nothing of the refused ones landed");
}
