//! Clients that break the rules on purpose, speaking the protocol by hand
//! to a real primary daemon, each the way in a review of the client path
//! found, and what holds now:
//!
//! 1. an append announcing 2^63 - 1 (or 2^64 - 1) bytes, a large object
//!    and a push as long, are refused by name: the log is not poisoned and
//!    the daemon restarts clean;
//! 2. read clients that ask for 16 MiB documents and never read them cost
//!    the primary little memory, and what they hold is charged;
//! 3. read clients that never read 8 MiB frames park no thread, and the
//!    store answers beside them;
//! 4. a 65 MiB append trickled a byte at a time holds no writer, and is
//!    cut off by name;
//! 5. read clients piping appends they may not make hold no memory, and an
//!    admin's append is answered;
//! 6. a read client opening every connection there is leaves an admin a
//!    way in (the command line closing its own is in the primary's tests).

#[path = "support/primary_proc.rs"]
mod primary_proc;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use primary_proc::{pattern, start, Pinned};
use twinlog::net;
use twinlog::node::api::{ApiError, ClientRole, Piped, RefMove};
use twinlog::node::{Durability, Request, Response, WriteRefusal};

const MIB: u64 = 1 << 20;

/// The answer to a stream's request, within `limit`.
async fn answer(rx: &mut quinn::RecvStream, limit: Duration) -> Option<Response> {
    tokio::time::timeout(limit, net::read_msg::<Response>(rx))
        .await
        .expect("an answer in time")
        .expect("an answer that decodes")
}

/// Send a byte every `every_ms` on `tx`, counting each in `sent`, until
/// the primary stops taking them (or a minute passes).
fn trickle(
    mut tx: quinn::SendStream,
    sent: Arc<AtomicU64>,
    every_ms: u64,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        for _ in 0..60_000 / every_ms {
            if tx.write_all(&[7]).await.is_err() {
                return;
            }
            sent.fetch_add(1, Ordering::SeqCst);
            // The trickle's pace is the hostile client's behaviour under
            // test, not a wait.
            tokio::time::sleep(Duration::from_millis(every_ms)).await;
        }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lengths_no_disk_can_hold_are_refused_by_name_and_the_primary_restarts_clean() {
    let root = tempfile::tempdir().expect("tempdir");
    let writer = Pinned::new(ClientRole::Write);
    let mut p = start(root.path(), &[], &[&writer]);
    p.serving().await;
    let admin = p.admin().await;
    admin
        .create_repo("r", Durability::Local)
        .await
        .expect("create");
    let conn = p.connect(&writer.id).await.expect("connect");
    let huge = [i64::MAX as u64, u64::MAX];
    let mut requests: Vec<Request> = huge
        .iter()
        .map(|&len| Request::Append {
            kind: 0x8000,
            meta: Vec::new(),
            blob_len: len,
            durability: Durability::Local,
            once: None,
        })
        .collect();
    requests.push(Request::LfsPut {
        repo: "r".into(),
        oid: [1; 32],
        len: i64::MAX as u64,
        durability: Durability::Local,
    });
    requests.push(Request::Push {
        repo: "r".into(),
        pack_len: u64::MAX,
        updates: vec![RefMove {
            name: "refs/heads/main".into(),
            old: None,
            new: Some([2; 20]),
        }],
        durability: Durability::Local,
    });
    let mut answers = Vec::new();
    for req in &requests {
        let (mut tx, mut rx) = conn.ask(req).await;
        // One byte of the body: enough to start a write that trusts the
        // length.
        let _ = tx.write_all(&[1]).await;
        answers.push(answer(&mut rx, Duration::from_secs(20)).await);
    }
    assert_eq!(p.status().log_poisoned, None, "answered {answers:?}");
    for (req, answer) in requests.iter().zip(answers) {
        match answer {
            Some(Response::Error(ApiError::Refused(WriteRefusal::TooLarge { len, .. })))
                if len == req.body_len() => {}
            other => panic!("{req:?} answered {other:?}"),
        }
    }
    let (seq, _) = admin
        .append(0x8000, b"", b"after", Durability::Local)
        .await
        .expect("the log takes appends");
    drop((admin, conn));

    p.restart().await;
    let admin = p.admin().await;
    let (next, _) = admin
        .append(0x8000, b"", b"restarted", Durability::Local)
        .await
        .expect("append after the restart");
    assert_eq!(next, seq + 1);
    assert_eq!(p.status().log_poisoned, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unread_16_mib_documents_cost_little_memory_and_what_they_hold_is_charged() {
    let root = tempfile::tempdir().expect("tempdir");
    let reader = Pinned::new(ClientRole::Read);
    // Answers wait this long for a reader before they are cut off.
    let p = start(
        root.path(),
        &[("body_piece_timeout_ms", 30_000)],
        &[&reader],
    );
    p.serving().await;
    let admin = p.admin().await;
    let doc = pattern(3, 16 << 20);
    admin
        .put_doc("big", &doc, Durability::Local)
        .await
        .expect("put");
    drop(doc);
    let before = p.proc_field("VmRSS");
    p.reset_peak();
    // Each stream takes 64 KiB, enough for every answer's head; nothing
    // after it is read.
    let (mut held, mut conns) = (Vec::new(), Vec::new());
    for _ in 0..2 {
        let conn = p
            .connect_windows(&reader.id, 64 << 10, 64 << 20)
            .await
            .expect("connect");
        for _ in 0..32 {
            let (tx, mut rx) = conn.ask(&Request::GetDoc { name: "big".into() }).await;
            match answer(&mut rx, Duration::from_secs(20)).await {
                Some(Response::Object { len, .. }) => assert_eq!(len, 16 << 20),
                other => panic!("GetDoc answered {other:?}"),
            }
            held.push((tx, rx));
        }
        conns.push(conn);
    }
    let grew = p.proc_field("VmHWM").saturating_sub(before);
    let charged = p.status().memory_held;
    println!(
        "64 unread 16 MiB documents: RSS grew {} MiB, {} MiB charged",
        grew >> 20,
        charged >> 20
    );
    assert!(
        grew < 256 * MIB,
        "the primary grew by {} MiB for 64 unread 16 MiB documents",
        grew >> 20
    );
    assert!(charged > 0, "what the unread answers hold is charged");
    drop((held, conns));
    testkit::until("every charge given back", Duration::from_secs(60), || {
        (p.status().memory_held == 0).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unread_8_mib_frames_park_no_thread_and_the_store_answers_beside_them() {
    let root = tempfile::tempdir().expect("tempdir");
    let readers = [Pinned::new(ClientRole::Read), Pinned::new(ClientRole::Read)];
    let p = start(
        root.path(),
        &[("body_piece_timeout_ms", 30_000)],
        &[&readers[0], &readers[1]],
    );
    p.serving().await;
    let admin = p.admin().await;
    let (seq, _) = admin
        .append(0x8000, b"", &pattern(4, 8 << 20), Durability::Local)
        .await
        .expect("an 8 MiB frame");
    // 17 connections of 32 reads each: more than tokio's 512 blocking
    // threads, were each to wait on its reader.
    let (mut held, mut conns) = (Vec::new(), Vec::new());
    for c in 0..17 {
        let conn = p
            .connect_windows(&readers[c % 2].id, 64 << 10, 64 << 20)
            .await
            .expect("connect");
        for _ in 0..32 {
            held.push(conn.ask(&Request::Read { seq }).await);
        }
        conns.push(conn);
    }
    // Every read has begun once its head arrived (each stream takes 64 KiB
    // and no more).
    let heads = futures_util::future::join_all(held.iter_mut().map(|(_, rx)| async {
        let head = tokio::time::timeout(Duration::from_secs(20), net::read_msg::<Response>(rx));
        matches!(head.await, Ok(Ok(Some(Response::Frame { .. }))))
    }))
    .await;
    let threads = p.proc_field("Threads");
    let begun = heads.iter().filter(|&&h| h).count();
    println!("544 unread 8 MiB frames: {begun} begun, the primary runs {threads} threads");
    assert!(threads < 150, "{threads} threads for 544 unread frames");
    assert_eq!(begun, 544, "every read began");
    for round in 0..3u8 {
        let repos = tokio::time::timeout(Duration::from_secs(5), admin.list_repos())
            .await
            .expect("repo list answered beside the unread frames")
            .expect("repo list");
        assert!(repos.is_empty());
        tokio::time::timeout(
            Duration::from_secs(5),
            admin.put_doc("d", &[round; 100], Durability::Local),
        )
        .await
        .expect("doc put answered beside the unread frames")
        .expect("doc put");
    }
    drop((held, conns));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trickled_65_mib_append_holds_no_writer_and_is_cut_off_by_name() {
    let root = tempfile::tempdir().expect("tempdir");
    let writer = Pinned::new(ClientRole::Write);
    let p = start(root.path(), &[("body_piece_timeout_ms", 1000)], &[&writer]);
    p.serving().await;
    let admin = p.admin().await;
    let conn = p.connect(&writer.id).await.expect("connect");
    let (tx, mut rx) = conn
        .ask(&Request::Append {
            kind: 0x8000,
            meta: b"trickled".to_vec(),
            blob_len: 65 * MIB,
            durability: Durability::Local,
            once: None,
        })
        .await;
    // A byte every half piece deadline: no piece deadline ever passes.
    let sent = Arc::new(AtomicU64::new(0));
    let trickle = trickle(tx, sent.clone(), 500);
    testkit::until("the trickle begins", Duration::from_secs(10), || {
        (sent.load(Ordering::SeqCst) >= 2).then_some(())
    })
    .await;
    for i in 0..10u8 {
        tokio::time::timeout(
            Duration::from_secs(2),
            admin.append(0x8000, b"", &[i; 128], Durability::Local),
        )
        .await
        .expect("answered beside the trickle")
        .expect("append");
    }
    match answer(&mut rx, Duration::from_secs(30)).await {
        Some(Response::Error(e)) => {
            let why = e.to_string();
            assert!(why.contains("too slowly"), "{why}");
        }
        other => panic!("the trickled append answered {other:?}"),
    }
    trickle.abort();
    assert_eq!(p.status().head, 10, "nothing of the trickled body landed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_clients_piping_appends_hold_no_memory_and_an_admin_is_answered() {
    let root = tempfile::tempdir().expect("tempdir");
    let readers = [Pinned::new(ClientRole::Read), Pinned::new(ClientRole::Read)];
    let p = start(
        root.path(),
        &[("memory_budget_mib", 64)],
        &[&readers[0], &readers[1]],
    );
    p.serving().await;
    let admin = p.admin().await;
    // Six connections of 16 pipelines, each with a 1 MiB append a reader
    // may not make, its body trickled: 96 MiB asked of a 64 MiB budget.
    let started = Arc::new(AtomicU64::new(0));
    let (mut conns, mut trickles) = (Vec::new(), Vec::new());
    for c in 0..6 {
        let conn = p.connect(&readers[c % 2].id).await.expect("connect");
        for _ in 0..16 {
            let (mut tx, mut rx) = conn.ask(&Request::Pipeline).await;
            match answer(&mut rx, Duration::from_secs(10)).await {
                Some(Response::Pipelining { .. }) => {}
                other => panic!("a pipeline answered {other:?}"),
            }
            let piped = Piped {
                id: 1,
                req: Request::Append {
                    kind: 0x8000,
                    meta: Vec::new(),
                    blob_len: MIB,
                    durability: Durability::Local,
                    once: None,
                },
            };
            net::write_msg(&mut tx, &piped).await.expect("piped");
            trickles.push((trickle(tx, started.clone(), 500), rx));
        }
        conns.push(conn);
    }
    testkit::until("every pipeline trickles", Duration::from_secs(20), || {
        (started.load(Ordering::SeqCst) >= 96).then_some(())
    })
    .await;
    let held = p.status().memory_held;
    tokio::time::timeout(
        Duration::from_secs(5),
        admin.append(0x8000, b"", &[1; 512 << 10], Durability::Local),
    )
    .await
    .expect("an admin's append answered beside the read pipelines")
    .expect("append");
    println!(
        "96 forbidden piped appends trickling: {} KiB held",
        held >> 10
    );
    assert!(
        held < 8 * MIB,
        "{} MiB held for appends a reader may not make",
        held >> 20
    );
    for (t, _) in trickles {
        t.abort();
    }
    drop(conns);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_client_opening_every_connection_leaves_an_admin_a_way_in() {
    let root = tempfile::tempdir().expect("tempdir");
    let reader = Pinned::new(ClientRole::Read);
    let p = start(root.path(), &[], &[&reader]);
    p.serving().await;
    let admin = p.admin().await;
    admin
        .append(0x8000, b"", b"one", Durability::Local)
        .await
        .expect("append");
    drop(admin);
    // 64 connections, each held busy by a tail.
    let (mut tails, mut refused) = (Vec::new(), Vec::new());
    for _ in 0..64 {
        let c = twinlog::node::Client::connect(&reader.id, p.fp, p.listen)
            .await
            .expect("the handshake completes");
        let tailed = async {
            let mut t = c.tail(1).await?;
            t.next().await.map(|e| (t, e))
        };
        match tailed.await {
            Ok((t, Some(_))) => tails.push((c, t)),
            Ok((_, None)) => panic!("a tail ended"),
            Err(e) => refused.push(e.to_string()),
        }
    }
    println!(
        "64 read connections: {} served, {} refused",
        tails.len(),
        refused.len()
    );
    assert!(
        refused.iter().all(|why| why.contains("connections")),
        "refused by name: {refused:?}"
    );
    let admin = tokio::time::timeout(Duration::from_secs(10), p.admin())
        .await
        .expect("the admin connects");
    admin
        .append(0x8000, b"", b"admin", Durability::Local)
        .await
        .expect("an admin is served beside 64 read connections");
    drop(tails);
}
