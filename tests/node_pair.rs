//! A primary and a twin over real QUIC on loopback, in one process: twin
//! durability, streamed blobs, the policies for an absent twin, one twin
//! session at a time, the client's deadlines.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use twinlog::log::{Kind, Log};
use twinlog::net::{self, Identity, Pins, Role};
use twinlog::node::epoch::Epochs;
use twinlog::node::{
    ApiError, Client, ClientError, Durability, Primary, PrimaryOptions, Twin, TwinOptions,
    TwinPolicy,
};
use twinlog::repl::{Refusal, Timers};

/// The bound of every wait on state here: only a broken system reaches it.
const WAIT: Duration = Duration::from_secs(10);

struct Ids {
    primary: Identity,
    twin: Identity,
    client: Identity,
}

fn ids() -> Ids {
    Ids {
        primary: Identity::mint().expect("mint"),
        twin: Identity::mint().expect("mint"),
        client: Identity::mint().expect("mint"),
    }
}

fn fast() -> Timers {
    Timers {
        heartbeat: Duration::from_millis(50),
        idle_timeout: Duration::from_secs(2),
    }
}

struct Running {
    primary: Arc<Primary>,
    addr: SocketAddr,
    stop: watch::Sender<bool>,
    /// The serving task: it ends, letting go of the log, after `stop`.
    served: tokio::task::JoinHandle<()>,
}

fn start_primary(ids: &Ids, dir: &std::path::Path, policy: TwinPolicy) -> Running {
    start_primary_at(ids, dir, policy, 0)
}

/// A primary started again over `dir`, as the daemon starts one: a new
/// life of its epoch from `head + 1`.
fn start_primary_life(ids: &Ids, dir: &std::path::Path, policy: TwinPolicy, head: u64) -> Running {
    let epochs = twinlog::node::epoch::Epochs::in_memory(0);
    epochs.begin_life(head).expect("a new life");
    start_primary_with(ids, dir, policy, Arc::new(epochs))
}

fn start_primary_at(ids: &Ids, dir: &std::path::Path, policy: TwinPolicy, epoch: u64) -> Running {
    let epochs = Arc::new(twinlog::node::epoch::Epochs::in_memory(epoch));
    start_primary_with(ids, dir, policy, epochs)
}

fn start_primary_with(
    ids: &Ids,
    dir: &std::path::Path,
    policy: TwinPolicy,
    epochs: Arc<twinlog::node::epoch::Epochs>,
) -> Running {
    let log = Arc::new(Log::open(dir).expect("primary log"));
    let pins = Arc::new(
        Pins::new()
            .pin(ids.twin.fingerprint(), Role::Twin)
            .pin(ids.client.fingerprint(), Role::Client),
    );
    let endpoint =
        net::server(([127, 0, 0, 1], 0).into(), &ids.primary, pins.clone()).expect("endpoint");
    let addr = endpoint.local_addr().expect("addr");
    let primary = Primary::build(
        log,
        pins,
        PrimaryOptions {
            policy,
            timers: fast(),
            epoch: epochs.current(),
            ..PrimaryOptions::default()
        },
        None,
        epochs,
    );
    let (stop, stopped) = watch::channel(false);
    let serving = primary.clone().serve(endpoint, stopped);
    let served = tokio::spawn(async move {
        let _ = serving.await;
    });
    Running {
        primary,
        addr,
        stop,
        served,
    }
}

fn start_twin(
    ids: &Ids,
    dir: &std::path::Path,
    primary: SocketAddr,
) -> (Arc<Twin>, watch::Sender<bool>) {
    start_twin_at(ids, dir, primary, 0)
}

fn start_twin_at(
    ids: &Ids,
    dir: &std::path::Path,
    primary: SocketAddr,
    epoch: u64,
) -> (Arc<Twin>, watch::Sender<bool>) {
    start_twin_on(
        ids,
        Arc::new(Log::open(dir).expect("twin log")),
        primary,
        epoch,
    )
}

fn start_twin_on(
    ids: &Ids,
    log: Arc<Log>,
    primary: SocketAddr,
    epoch: u64,
) -> (Arc<Twin>, watch::Sender<bool>) {
    let pins = Arc::new(Pins::new().pin(ids.primary.fingerprint(), Role::Primary));
    let endpoint = net::client(&ids.twin, pins).expect("endpoint");
    let cfg = TwinOptions {
        timers: fast(),
        backoff_base: Duration::from_millis(20),
        backoff_cap: Duration::from_millis(200),
    };
    let twin = Twin::new(log, Arc::new(Epochs::in_memory(epoch)), primary, cfg);
    let (stop, stopped) = watch::channel(false);
    tokio::spawn(twin.clone().run(endpoint, stopped));
    (twin, stop)
}

fn blob(seq: u64, len: usize) -> Vec<u8> {
    (0..len).map(|i| (seq as usize * 7 + i) as u8).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twin_appends_are_on_both_logs_byte_for_byte() {
    let ids = ids();
    let pdir = tempfile::tempdir().expect("tempdir");
    let tdir = tempfile::tempdir().expect("tempdir");
    let p = start_primary(&ids, pdir.path(), TwinPolicy::Wait);
    let (twin, _twin_stop) = start_twin(&ids, tdir.path(), p.addr);
    let client = Arc::new(
        Client::connect(&ids.client, ids.primary.fingerprint(), p.addr)
            .await
            .expect("client"),
    );
    let mut tail = client.tail(1).await.expect("tail");

    let mut tasks = Vec::new();
    for t in 0..8u64 {
        let client = client.clone();
        tasks.push(tokio::spawn(async move {
            let mut got = Vec::new();
            for i in 0..25u64 {
                let b = blob(t * 100 + i, 100 + (i as usize * 31) % 400);
                let (seq, d) = client
                    .append(Kind::Pack.as_u16(), b"m", &b, Durability::Twin)
                    .await
                    .expect("append");
                assert_eq!(d, Durability::Twin);
                got.push((seq, b));
            }
            got
        }));
    }
    let big = blob(999, 5 << 20);
    let (big_seq, d) = client
        .append(Kind::LfsPut.as_u16(), b"big", &big, Durability::Twin)
        .await
        .expect("big append");
    assert_eq!(d, Durability::Twin);
    let mut acked = vec![(big_seq, big)];
    for t in tasks {
        acked.extend(t.await.expect("join"));
    }
    assert_eq!(acked.len(), 201);
    // Acknowledged as twin-durable: on the twin now, whatever happens next.
    for (seq, b) in &acked {
        let on_twin = twin.log().read(*seq).expect("on the twin");
        assert_eq!(&on_twin.blob, b, "frame {seq}");
        let on_primary = p.primary.log().read(*seq).expect("on the primary");
        assert_eq!(on_twin, on_primary);
    }
    assert_eq!(
        client.read(big_seq).await.expect("read back").blob.len(),
        5 << 20
    );
    let by_seq: std::collections::HashMap<u64, Vec<u8>> = acked.iter().cloned().collect();
    for seq in 1..=201u64 {
        let e = tail.next().await.expect("tail").expect("a frame");
        assert_eq!(e.seq, seq, "the tail follows in order");
        assert!(
            Some(&e.blob) == by_seq.get(&seq),
            "frame {seq} through the tail"
        );
    }
    let status = client.status().await.expect("status");
    assert_eq!(status.head, 201);
    assert!(status.twin_connected);
    assert!(twin.history_matches(p.primary.log()));
    let _ = p.stop.send(true);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_absent_twin_fails_or_falls_back_as_configured_and_never_silently() {
    let ids = ids();
    let pdir = tempfile::tempdir().expect("tempdir");
    let p = start_primary(
        &ids,
        pdir.path(),
        TwinPolicy::Fail(Duration::from_millis(200)),
    );
    let client = Client::connect(&ids.client, ids.primary.fingerprint(), p.addr)
        .await
        .expect("client");
    let err = client
        .append(2, b"", b"x", Durability::Twin)
        .await
        .expect_err("no twin");
    assert!(
        matches!(err, ClientError::Api(ApiError::TwinTimeout { seq: 1 })),
        "{err:?}"
    );
    let (seq, d) = client
        .append(2, b"", b"y", Durability::Local)
        .await
        .expect("local");
    assert_eq!((seq, d), (2, Durability::Local));
    // The lag is what the twin has not acknowledged, connected or not.
    let st = client.status().await.expect("status");
    assert_eq!((st.head, st.twin_acked, st.lag_frames), (2, 0, 2), "{st:?}");
    assert_eq!(st.policy, "fail 200ms");
    assert_eq!(st.twin_waiting, 0);
    let _ = p.stop.send(true);

    let pdir = tempfile::tempdir().expect("tempdir");
    let tdir = tempfile::tempdir().expect("tempdir");
    let p = start_primary(
        &ids,
        pdir.path(),
        TwinPolicy::FallBack(Duration::from_millis(200)),
    );
    let client = Client::connect(&ids.client, ids.primary.fingerprint(), p.addr)
        .await
        .expect("client");
    let (_, d) = client
        .append(2, b"", b"x", Durability::Twin)
        .await
        .expect("fall back");
    assert_eq!(d, Durability::Local);
    assert!(
        client.status().await.expect("status").degraded,
        "the fall-back shows in status"
    );
    let (_, d) = client
        .append(2, b"", b"y", Durability::Twin)
        .await
        .expect("still local");
    assert_eq!(d, Durability::Local);
    let (_twin, _stop) = start_twin(&ids, tdir.path(), p.addr);
    let mut cleared = false;
    for _ in 0..100 {
        let (_, d) = client
            .append(2, b"", b"z", Durability::Twin)
            .await
            .expect("append");
        if d == Durability::Twin && !client.status().await.expect("status").degraded {
            cleared = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        cleared,
        "twin durability comes back once the twin caught up"
    );
    let _ = p.stop.send(true);
}

/// Under `wait`, appends waiting for an absent twin show in the status,
/// and so does the lag they make.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn appends_waiting_for_an_absent_twin_show_in_the_status() {
    let ids = ids();
    let pdir = tempfile::tempdir().expect("tempdir");
    let p = start_primary(&ids, pdir.path(), TwinPolicy::Wait);
    let client = Arc::new(
        Client::connect(&ids.client, ids.primary.fingerprint(), p.addr)
            .await
            .expect("client"),
    );
    let waiting: Vec<_> = (0..3)
        .map(|_| {
            let c = client.clone();
            tokio::spawn(async move { c.append(2, b"", b"w", Durability::Twin).await })
        })
        .collect();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let st = loop {
        let st = client.status().await.expect("status");
        if st.twin_waiting == 3 {
            break st;
        }
        assert!(tokio::time::Instant::now() < deadline, "{st:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(st.policy, "wait");
    assert_eq!(st.lag_frames, 3, "{st:?}");
    for w in waiting {
        w.abort();
    }
    let _ = p.stop.send(true);
}

/// A twin whose log holds another frame at its head, or more frames past
/// the primary's than a crash of the primary can have lost, is refused by
/// name, and nothing is written on either side.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_diverged_or_ahead_twin_is_refused_by_name_and_nothing_is_written() {
    let ids = ids();
    let pdir = tempfile::tempdir().expect("tempdir");
    {
        let log = Log::open(pdir.path()).expect("primary log");
        for i in 1..=5u64 {
            log.append_raw(2, b"", &blob(i, 10)).expect("append");
        }
    }
    let far = 5 + twinlog::repl::MAX_SHIPPED_UNSYNCED + 1;
    for (case, frames, differ_at) in [("diverged", 5u64, Some(5u64)), ("ahead", far, None)] {
        let tdir = tempfile::tempdir().expect("tempdir");
        {
            let primary_log = Log::open(pdir.path()).expect("primary log");
            let twin_log = Log::open(tdir.path()).expect("twin log");
            twin_log
                .adopt_history(primary_log.history())
                .expect("same history");
            for i in 1..=frames {
                let b = if Some(i) == differ_at {
                    b"another".to_vec()
                } else {
                    blob(i, 10)
                };
                twin_log.stage_raw(2, b"", &b).expect("append");
            }
            twin_log.sync().expect("sync");
        }
        let before_twin = std::fs::read_dir(tdir.path()).expect("ls").count();
        let p = start_primary(&ids, pdir.path(), TwinPolicy::Wait);
        let (twin, stop) = start_twin(&ids, tdir.path(), p.addr);
        testkit::until(&format!("{case}: the twin refused"), WAIT, || {
            let t = twin.status();
            (t.refusal.is_some()
                && t.last_error.is_some()
                && p.primary.status().twin_refusal.is_some())
            .then_some(())
        })
        .await;
        let (on_twin, on_primary) = (
            twin.status().refusal.expect("the twin's refusal"),
            p.primary
                .status()
                .twin_refusal
                .expect("the primary's refusal"),
        );
        match case {
            "diverged" => assert!(
                matches!(on_twin, Refusal::Diverged { seq: 5, .. }),
                "{case}: {on_twin:?}"
            ),
            _ => assert_eq!(
                on_twin,
                Refusal::TwinAhead {
                    twin_head: far,
                    primary_head: 5
                },
                "{case}"
            ),
        }
        assert_eq!(on_primary, on_twin, "{case}: the primary says why too");
        assert!(twin.status().last_error.is_some(), "{case}: and in words");
        assert_eq!(
            twin.log().head_seq(),
            frames,
            "{case}: nothing written on the twin"
        );
        assert_eq!(
            p.primary.log().head_seq(),
            5,
            "{case}: nothing written on the primary"
        );
        let _ = stop.send(true);
        let _ = p.stop.send(true);
        // The next case opens the primary's log again: wait until this
        // primary has let go of it.
        p.served.await.expect("the primary's serving task");
        drop(p.primary);
        assert_eq!(
            std::fs::read_dir(tdir.path()).expect("ls").count(),
            before_twin
        );
    }
}

/// After a promotion, the old primary is refused by a twin that knows the
/// newer epoch, and it refuses such a twin: it can never stream into a box
/// that has moved on. A twin of an older epoch follows and records the
/// newer one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_superseded_primary_is_refused_by_epoch() {
    let ids = ids();
    let pdir = tempfile::tempdir().expect("tempdir");
    let tdir = tempfile::tempdir().expect("tempdir");
    let p = start_primary_at(&ids, pdir.path(), TwinPolicy::Wait, 1);
    let (twin, stop) = start_twin_at(&ids, tdir.path(), p.addr, 2);
    let mut why = None;
    for _ in 0..100 {
        tokio::time::sleep(Duration::from_millis(20)).await;
        if let Some(e) = twin.status().last_error {
            why = Some(e);
            break;
        }
    }
    let why = why.expect("refused");
    assert!(why.contains("epoch"), "refused by name: {why}");
    assert_eq!(twin.log().head_seq(), 0, "nothing written");
    let _ = stop.send(true);
    let _ = p.stop.send(true);
    p.served.await.expect("the primary's serving task");

    // A twin of an older epoch follows the newer primary.
    let pdir = tempfile::tempdir().expect("tempdir");
    let p = start_primary_at(&ids, pdir.path(), TwinPolicy::Wait, 3);
    let client = Client::connect(&ids.client, ids.primary.fingerprint(), p.addr)
        .await
        .expect("client");
    let tdir = tempfile::tempdir().expect("tempdir");
    let (twin, _stop) = start_twin_at(&ids, tdir.path(), p.addr, 1);
    let (_, d) = client
        .append(2, b"", b"x", Durability::Twin)
        .await
        .expect("append");
    assert_eq!(d, Durability::Twin);
    assert!(twin.status().last_error.is_none());
    let _ = p.stop.send(true);
}

/// A server that announces more than it sends, or more than any frame may
/// be, is refused by name: the client never allocates what was announced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_caps_every_length_a_server_announces() {
    use twinlog::node::api::{Request, Response};
    let ids = ids();
    let pins = Arc::new(Pins::new().pin(ids.client.fingerprint(), Role::Client));
    let server = net::server(([127, 0, 0, 1], 0).into(), &ids.primary, pins).expect("server");
    let addr = server.local_addr().expect("addr");
    tokio::spawn(async move {
        let Some(incoming) = server.accept().await else {
            return;
        };
        let Ok(conn) = incoming.await else { return };
        // Two requests, two lies.
        for announced in [1u64 << 40, 100] {
            let Ok((mut send, mut recv)) = conn.accept_bi().await else {
                return;
            };
            let _ = net::read_msg::<Request>(&mut recv).await;
            let _ = net::write_msg(
                &mut send,
                &Response::Frame {
                    seq: 1,
                    kind: 0x8001,
                    meta: Vec::new(),
                    blob_len: announced,
                    payload_crc: 0,
                },
            )
            .await;
            let _ = send.write_all(b"only ten..").await;
            let _ = send.finish();
        }
        conn.closed().await;
    });
    let client = Client::connect(&ids.client, ids.primary.fingerprint(), addr)
        .await
        .expect("connect");
    let err = client.read(1).await.expect_err("a terabyte is refused");
    assert!(
        matches!(&err, ClientError::Unexpected(why) if why.contains("at most")),
        "{err}"
    );
    let err = client.read(1).await.expect_err("a short blob is refused");
    assert!(
        matches!(&err, ClientError::Unexpected(why) if why.contains("sent 10")),
        "{err}"
    );
}

/// A twin connection spoken by hand: connected, its control stream open.
async fn hand_twin(
    ids: &Ids,
    addr: SocketAddr,
) -> (
    quinn::Endpoint,
    quinn::Connection,
    quinn::SendStream,
    quinn::RecvStream,
) {
    let pins = Arc::new(Pins::new().pin(ids.primary.fingerprint(), Role::Primary));
    let endpoint = net::client(&ids.twin, pins).expect("endpoint");
    let conn = net::connect(&endpoint, addr).await.expect("connect");
    let (send, recv) = conn.open_bi().await.expect("control stream");
    (endpoint, conn, send, recv)
}

/// Say Hello with head `seq` of the primary's own log and expect Welcome.
async fn hello(
    p: &Running,
    client: &Client,
    send: &mut quinn::SendStream,
    recv: &mut quinn::RecvStream,
    seq: u64,
) {
    use twinlog::repl::{Position, PrimaryMsg, TwinMsg, PROTOCOL_VERSION};
    let crc = client.read(seq).await.expect("read").payload_crc;
    let hello = TwinMsg::Hello {
        version: PROTOCOL_VERSION,
        history: p.primary.log().history().0,
        head: Position { seq, crc },
        first: 1,
        epochs: Default::default(),
    };
    net::write_msg(send, &hello).await.expect("hello");
    match net::read_msg::<PrimaryMsg>(recv).await.expect("answer") {
        Some(PrimaryMsg::Welcome { from, .. }) => assert_eq!(from, seq + 1),
        other => panic!("no Welcome: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_twin_connection_replaces_the_old_and_the_hold_is_its_hello_s() {
    let ids = ids();
    let pdir = tempfile::tempdir().expect("tempdir");
    let p = start_primary(&ids, pdir.path(), TwinPolicy::Wait);
    let client = Client::connect(&ids.client, ids.primary.fingerprint(), p.addr)
        .await
        .expect("client");
    for n in 0..5 {
        client
            .append(0x8000, b"", &blob(n, 100), Durability::Local)
            .await
            .expect("append");
    }
    let (_e1, first, mut send1, mut recv1) = hand_twin(&ids, p.addr).await;
    hello(&p, &client, &mut send1, &mut recv1, 5).await;
    testkit::until("holding the twin at 5", WAIT, || {
        let s = p.primary.status();
        (s.twin_connected && s.twin_hold == 5).then_some(())
    })
    .await;

    // The same twin dials again (restarted, or back after a blip): the old
    // connection is closed at once, by name, before the new one says a word.
    let (_e2, second, mut send2, mut recv2) = hand_twin(&ids, p.addr).await;
    let why = tokio::time::timeout(Duration::from_secs(5), first.closed())
        .await
        .expect("the old connection is closed at once");
    match &why {
        quinn::ConnectionError::ApplicationClosed(c) => {
            assert_eq!(c.error_code, quinn::VarInt::from_u32(net::CLOSE_REPLACED));
            assert_eq!(
                &c.reason[..],
                b"replaced by a newer connection from the twin"
            );
        }
        other => panic!("closed otherwise: {other}"),
    }
    testkit::until("showing the replacement", WAIT, || {
        (p.primary
            .status()
            .twin_last_error
            .is_some_and(|e| e.contains("replaced")))
        .then_some(())
    })
    .await;
    // The replacement moved nothing the twin did not say.
    assert_eq!(p.primary.status().twin_hold, 5);

    hello(&p, &client, &mut send2, &mut recv2, 5).await;
    testkit::until("streaming to the new connection", WAIT, || {
        p.primary.status().twin_connected.then_some(())
    })
    .await;
    assert_eq!(p.primary.status().twin_hold, 5);
    assert!(second.close_reason().is_none(), "the new one serves");

    // A twin that comes back lower (a box restored from an older copy)
    // is held where its Hello says, as any session's first word.
    let (_e3, _third, mut send3, mut recv3) = hand_twin(&ids, p.addr).await;
    tokio::time::timeout(Duration::from_secs(5), second.closed())
        .await
        .expect("the second is replaced in turn");
    hello(&p, &client, &mut send3, &mut recv3, 3).await;
    testkit::until("holding the twin at 3", WAIT, || {
        let s = p.primary.status();
        (s.twin_connected && s.twin_hold == 3).then_some(())
    })
    .await;
    let _ = p.stop.send(true);
}

/// A primary that accepts a client and its requests and never answers nor
/// reads a byte: its connection stays alive (QUIC acknowledges), nothing
/// else happens.
fn mute_primary(ids: &Ids) -> SocketAddr {
    let pins = Arc::new(Pins::new().pin(ids.client.fingerprint(), Role::Client));
    let server = net::server(([127, 0, 0, 1], 0).into(), &ids.primary, pins).expect("server");
    let addr = server.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Some(incoming) = server.accept().await {
            let Ok(conn) = incoming.await else { continue };
            tokio::spawn(async move {
                let mut held = Vec::new();
                while let Ok(streams) = conn.accept_bi().await {
                    held.push(streams);
                }
            });
        }
    });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_the_primary_never_answers_ends_at_the_client_s_deadline() {
    use twinlog::node::ClientOptions;
    let ids = ids();
    let addr = mute_primary(&ids);
    let deadline = Duration::from_millis(300);
    let margin = Duration::from_millis(700);
    let client = Client::connect_with(
        &ids.client,
        ids.primary.fingerprint(),
        addr,
        ClientOptions { deadline },
    )
    .await
    .expect("connect");

    // A request and its answer: the whole wait.
    let started = std::time::Instant::now();
    let err = client.status().await.expect_err("no answer");
    let took = started.elapsed();
    assert!(
        matches!(err, ClientError::Deadline { after } if after == deadline),
        "{err}"
    );
    assert!(took >= deadline && took < deadline + margin, "{took:?}");
    eprintln!("status: {err} after {took:?}");

    // A body the primary stops taking (past the stream's 8 MiB window): the
    // piece that does not move ends it.
    let big = vec![7u8; 24 << 20];
    let started = std::time::Instant::now();
    let err = client
        .append_reader(0x8000, b"", big.len() as u64, &big[..], Durability::Local)
        .await
        .expect_err("stalled");
    let took = started.elapsed();
    assert!(
        matches!(err, ClientError::Deadline { after } if after == deadline),
        "{err}"
    );
    assert!(
        took < deadline + margin + Duration::from_secs(1),
        "{took:?}"
    );

    // A tail waits for frames as long as none come: the keep-alives hold the
    // connection, and no deadline cuts the wait.
    let mut tail = client.tail(1).await.expect("tail");
    let waited = tokio::time::timeout(deadline * 4, tail.next()).await;
    assert!(waited.is_err(), "the tail ended: {waited:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_twin_append_waiting_for_an_absent_twin_ends_at_the_client_s_deadline() {
    use twinlog::node::ClientOptions;
    let ids = ids();
    let pdir = tempfile::tempdir().expect("tempdir");
    let p = start_primary(&ids, pdir.path(), TwinPolicy::Wait);
    let deadline = Duration::from_millis(400);
    let client = Client::connect_with(
        &ids.client,
        ids.primary.fingerprint(),
        p.addr,
        ClientOptions { deadline },
    )
    .await
    .expect("connect");
    let started = std::time::Instant::now();
    let err = client
        .append(0x8000, b"", b"waits for a twin", Durability::Twin)
        .await
        .expect_err("no twin");
    let took = started.elapsed();
    assert!(
        matches!(err, ClientError::Deadline { after } if after >= deadline),
        "{err}"
    );
    assert!(took < deadline + Duration::from_secs(1), "{took:?}");
    // What was asked was done all the same: the frame is durable here.
    assert_eq!(p.primary.status().head, 1);
    let _ = p.stop.send(true);
}

/// What the log refuses reaches the client by name, with its figures: a
/// client matches on the variant, not on a sentence.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_reach_the_client_by_name() {
    use twinlog::node::{ReadRefusal, WriteRefusal};
    let ids = ids();
    let dir = tempfile::tempdir().expect("tempdir");
    let p = start_primary(&ids, dir.path(), TwinPolicy::Wait);
    let client = Client::connect(&ids.client, ids.primary.fingerprint(), p.addr)
        .await
        .expect("connect");
    let refused = client.append(0, b"", b"x", Durability::Local).await;
    assert!(
        matches!(
            &refused,
            Err(ClientError::Api(ApiError::Refused(
                WriteRefusal::InvalidKind { kind: 0 }
            )))
        ),
        "{refused:?}"
    );
    for i in 0..3u64 {
        client
            .append(0x8001, b"", &blob(i, 10), Durability::Local)
            .await
            .expect("append");
    }
    let past = client.read(9).await;
    assert!(
        matches!(
            &past,
            Err(ClientError::Api(ApiError::Read(ReadRefusal::PastHead {
                seq: 9,
                head: 3
            })))
        ),
        "{past:?}"
    );
    // The twin has acknowledged nothing: retaining past it needs force.
    let retained = client.retain_from(3, false).await;
    assert!(
        matches!(
            &retained,
            Err(ClientError::Api(ApiError::Refused(
                WriteRefusal::TwinNotPast { seq: 3, .. }
            )))
        ),
        "{retained:?}"
    );
    // Forced, it goes ahead; retention drops whole segments, so the one
    // segment here stays.
    assert_eq!(client.retain_from(3, true).await.expect("forced"), 1);
    let _ = p.stop.send(true);
    let _ = p.served.await;
}

/// With an archive on, a retain by hand never drops what the bucket does
/// not hold, forced or not: `ArchiveNotPast` names where it stops.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retain_past_the_archive_is_refused_even_forced() {
    use twinlog::archive::archiver::{ArchiveSettings, Archiver};
    use twinlog::archive::bucket::{Bucket, Spec};
    use twinlog::node::WriteRefusal;
    let ids = ids();
    let dir = tempfile::tempdir().expect("tempdir");
    let p = start_primary(&ids, &dir.path().join("log"), TwinPolicy::Wait);
    let bucket = Bucket::open(&Spec {
        url: format!("file://{}", dir.path().join("bucket").display()),
        ..Spec::default()
    })
    .expect("bucket");
    // Not started: it has not listed the bucket, so nothing is archived.
    let archiver = Archiver::new(
        p.primary.log().clone(),
        ArchiveSettings {
            bucket,
            codec: Default::default(),
            bytes_per_s: 0,
        },
        Arc::new(Vec::new),
    );
    p.primary.set_archive(archiver);
    let client = Client::connect(&ids.client, ids.primary.fingerprint(), p.addr)
        .await
        .expect("connect");
    for i in 0..3u64 {
        client
            .append(0x8001, b"", &blob(i, 10), Durability::Local)
            .await
            .expect("append");
    }
    let retained = client.retain_from(3, true).await;
    assert!(
        matches!(
            &retained,
            Err(ClientError::Api(ApiError::Refused(
                WriteRefusal::ArchiveNotPast { archived_below: 0 }
            )))
        ),
        "{retained:?}"
    );
    let s = client.status().await.expect("status");
    assert_eq!(s.first, 1, "nothing dropped");
    assert!(
        s.archive.is_some_and(|a| a.uploading),
        "the status shows the archive"
    );
    let _ = p.stop.send(true);
    let _ = p.served.await;
}

/// A twin whose disk fills says so by name: its session ends with
/// `WriteFailed`, the primary's status shows it, and nothing the twin
/// acknowledged is lost from the primary.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_twin_whose_disk_fills_ends_its_session_by_name() {
    use twinlog::log::{OpenOptions, SimStorage};
    let ids = ids();
    let pdir = tempfile::tempdir().expect("tempdir");
    let p = start_primary(&ids, pdir.path(), TwinPolicy::Fail(Duration::from_secs(1)));
    let disk = Arc::new(SimStorage::new());
    let tlog = Log::open_opts(
        "/twin/log",
        OpenOptions {
            storage: Some(disk.clone()),
            ..OpenOptions::default()
        },
    )
    .expect("twin log");
    let (twin, stop_t) = start_twin_on(&ids, Arc::new(tlog), p.addr, 0);
    let client = Client::connect(&ids.client, ids.primary.fingerprint(), p.addr)
        .await
        .expect("connect");
    let (seq, d) = client
        .append(0x8001, b"", &blob(1, 1000), Durability::Twin)
        .await
        .expect("append while the disk has room");
    assert_eq!((seq, d), (1, Durability::Twin));
    disk.fill_disk_after(64 << 10);
    let mut acked = vec![1];
    for i in 2..200u64 {
        match client
            .append(0x8001, b"", &blob(i, 1000), Durability::Twin)
            .await
        {
            Ok((seq, Durability::Twin)) => acked.push(seq),
            Ok(other) => panic!("a `twin` append answered {other:?}"),
            Err(ClientError::Api(ApiError::TwinTimeout { .. })) => break,
            Err(e) => panic!("append {i}: {e}"),
        }
    }
    testkit::until("the primary names the twin's failed write", WAIT, || {
        (p.primary
            .status()
            .twin_last_error
            .is_some_and(|e| e.contains("the twin failed writing or syncing")))
        .then_some(())
    })
    .await;
    let reader = Client::connect(&ids.client, ids.primary.fingerprint(), p.addr)
        .await
        .expect("connect");
    for &seq in &acked {
        assert_eq!(
            reader.read(seq).await.expect("read").blob,
            blob(seq, 1000),
            "frame {seq}"
        );
    }
    let _ = stop_t.send(true);
    drop(twin);
    let _ = p.stop.send(true);
    let _ = p.served.await;
}

/// A twin whose head frame does not read does not stream on a guess: the
/// session ends with the error, the twin's status names it, and the
/// primary never counts the twin as connected.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_twin_whose_head_does_not_read_names_it_and_does_not_stream() {
    use twinlog::log::{format, OpenOptions, SimStorage};
    let ids = ids();
    let pdir = tempfile::tempdir().expect("tempdir");
    let p = start_primary(&ids, pdir.path(), TwinPolicy::Wait);
    let disk = Arc::new(SimStorage::new());
    let dir = std::path::Path::new("/twin/log");
    let tlog = Log::open_opts(
        dir,
        OpenOptions {
            storage: Some(disk.clone()),
            ..OpenOptions::default()
        },
    )
    .expect("twin log");
    tlog.set_follower(true);
    for seq in 1..=3u64 {
        tlog.append_at(seq, 0x8001, b"", &blob(seq, 100))
            .expect("append");
    }
    tlog.sync().expect("sync");
    // The head's index entry points at the segment's own header.
    let idx = dir.join(format::index_name(1));
    let mut bytes = disk.read_file(&idx).expect("index");
    let at = format::INDEX_HEADER_LEN + 2 * format::INDEX_ENTRY_LEN;
    bytes[at..at + 8].copy_from_slice(&0u64.to_le_bytes());
    disk.write_file(&idx, &bytes);
    let (twin, stop_t) = start_twin_on(&ids, Arc::new(tlog), p.addr, 0);
    testkit::until("the twin names its unreadable head", WAIT, || {
        (twin
            .status()
            .last_error
            .is_some_and(|e| e.contains("head frame does not read")))
        .then_some(())
    })
    .await;
    assert!(
        !p.primary.status().twin_connected,
        "the twin never streamed"
    );
    let _ = stop_t.send(true);
    let _ = p.stop.send(true);
    let _ = p.served.await;
}

/// The primary ships frames before its own sync: a crash between the two
/// leaves the twin holding frames the primary lost. Here the twin holds
/// frames 4..=6 the primary never kept, and the restarted primary took a
/// frame 4 of its own before the twin came back. The twin is told to cut
/// after the primary's restart head, checks its frame there, cuts, and
/// follows the primary's frame 4.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frames_the_primary_lost_in_a_crash_are_cut_from_the_twin() {
    let ids = ids();
    let pdir = tempfile::tempdir().expect("tempdir");
    let tdir = tempfile::tempdir().expect("tempdir");
    let p = start_primary(&ids, pdir.path(), TwinPolicy::Wait);
    let tlog = Arc::new(Log::open(tdir.path()).expect("twin log"));
    let (twin, stop_twin) = start_twin_on(&ids, tlog.clone(), p.addr, 0);
    let client = Client::connect(&ids.client, ids.primary.fingerprint(), p.addr)
        .await
        .expect("client");
    for i in 1..=3u8 {
        let (_, d) = client
            .append(2, b"", &[i], Durability::Twin)
            .await
            .expect("append");
        assert_eq!(d, Durability::Twin);
    }
    let _ = stop_twin.send(true);
    let _ = p.stop.send(true);
    p.served.await.expect("the primary's serving task");
    drop(p.primary);
    drop(client);
    testkit::until("the twin stopped", WAIT, || {
        (!twin.status().connected).then_some(())
    })
    .await;
    // What the primary shipped and lost: on the twin only.
    for seq in 4..=6u64 {
        tlog.append_at(seq, 2, b"", b"lost").expect("append_at");
    }

    // The primary restarted at 3, in a new life, and appends a frame 4
    // of its own.
    let p = start_primary_life(&ids, pdir.path(), TwinPolicy::Wait, 3);
    let client = Client::connect(&ids.client, ids.primary.fingerprint(), p.addr)
        .await
        .expect("client");
    let (seq, _) = client
        .append(2, b"", b"kept", Durability::Local)
        .await
        .expect("append");
    assert_eq!(seq, 4);

    let (twin, _stop) = start_twin_on(&ids, tlog.clone(), p.addr, 0);
    testkit::until("the twin follows the primary's frame 4", WAIT, || {
        (tlog.head_seq() == 4 && tlog.read(4).is_ok_and(|e| e.blob == b"kept")).then_some(())
    })
    .await;
    let why = p.primary.status().twin_last_error.unwrap_or_default();
    assert!(why.contains("lost in its crash"), "refused by name: {why}");
    for seq in 1..=3u64 {
        assert_eq!(tlog.read(seq).expect("kept").blob, [seq as u8]);
    }
    let (seq, d) = client
        .append(2, b"", b"after", Durability::Twin)
        .await
        .expect("append");
    assert_eq!((seq, d), (5, Durability::Twin));
    assert!(twin.status().connected);
    let _ = p.stop.send(true);
}

/// `primary verify` while both serve: the twin's frames are the
/// primary's; then a twin whose frame 10 was replaced by another valid
/// frame (the rest, its head included, the same: no handshake notices)
/// is found out at exactly that frame.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_names_the_first_frame_the_twin_holds_otherwise() {
    let ids = ids();
    let pdir = tempfile::tempdir().expect("tempdir");
    let tdir = tempfile::tempdir().expect("tempdir");
    let p = start_primary(&ids, pdir.path(), TwinPolicy::Wait);
    let tlog = Arc::new(Log::open(tdir.path()).expect("twin log"));
    let (twin, stop_twin) = start_twin_on(&ids, tlog.clone(), p.addr, 0);
    let client = Client::connect(&ids.client, ids.primary.fingerprint(), p.addr)
        .await
        .expect("client");
    for seq in 1..=20u64 {
        let (_, d) = client
            .append(2, b"m", &blob(seq, 300), Durability::Twin)
            .await
            .expect("append");
        assert_eq!(d, Durability::Twin);
    }
    let clean = client.verify(0, 0, 0).await.expect("verify");
    assert_eq!((clean.from, clean.through), (1, 20), "{clean:?}");
    assert_eq!(
        clean.mib_per_s,
        twinlog::node::verify::VERIFY_MIB_PER_S,
        "0 asks for the default pace"
    );
    assert_eq!((clean.first_difference, clean.stopped), (None, None));
    assert!(clean.bytes >= 20 * 300);

    let _ = stop_twin.send(true);
    testkit::until("the twin stopped", WAIT, || {
        (!twin.status().connected).then_some(())
    })
    .await;
    drop(twin);
    // Frame 10 replaced by another valid frame; 11..=20 as they were.
    let plog = p.primary.log().clone();
    tlog.truncate_after(9).expect("cut");
    tlog.append_at(10, 2, b"m", b"not the primary's")
        .expect("plant");
    for seq in 11..=20u64 {
        let e = plog.read(seq).expect("read");
        tlog.append_at(seq, e.kind, &e.meta, &e.blob)
            .expect("append_at");
    }
    tlog.sync().expect("sync");
    let (twin, _stop) = start_twin_on(&ids, tlog.clone(), p.addr, 0);
    testkit::until("the twin streams again", WAIT, || {
        twin.status().connected.then_some(())
    })
    .await;
    testkit::until("the twin acknowledged its head", WAIT, || {
        (p.primary.status().twin_acked == 20).then_some(())
    })
    .await;
    let found = client.verify(0, 0, u32::MAX).await.expect("verify");
    assert_eq!(found.first_difference, Some(10), "{found:?}");
    assert_eq!(
        found.mib_per_s,
        twinlog::node::verify::MAX_VERIFY_MIB_PER_S,
        "a pace past the bound is held to it"
    );
    let s = p.primary.status();
    assert_eq!(
        s.last_verify.and_then(|r| r.first_difference),
        Some(10),
        "status shows it"
    );
    let _ = p.stop.send(true);
}
