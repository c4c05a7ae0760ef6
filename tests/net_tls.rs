//! QUIC with mutual TLS between pinned peers: a pinned peer connects and is
//! known by its role, an unknown certificate is refused in the handshake,
//! an oversized message is refused before it is read, a box restarted on
//! its address resets the connections its predecessor left, a bulk
//! transfer on loopback grows its packets past Ethernet's, and a stream
//! read on a blocking thread in batches reads as the stream was written.

use std::sync::Arc;
use std::time::Duration;

use twinlog::net::{self, Identity, NetError, Pins, Role};
use twinlog::repl::msg::{DecodeError, MAX_CONTROL_LEN};
use twinlog::repl::TwinMsg;

struct Boxes {
    primary: Identity,
    twin: Identity,
}

fn boxes() -> Boxes {
    Boxes {
        primary: Identity::mint().expect("mint"),
        twin: Identity::mint().expect("mint"),
    }
}

fn loopback() -> std::net::SocketAddr {
    ([127, 0, 0, 1], 0).into()
}

/// The primary's endpoint pinning the twin, and the twin's pinning the
/// primary.
struct Pinned {
    server: quinn::Endpoint,
    addr: std::net::SocketAddr,
    primary_pins: Arc<Pins>,
    twin_pins: Arc<Pins>,
    client: quinn::Endpoint,
}

fn pinned(b: &Boxes) -> Pinned {
    let primary_pins = Arc::new(Pins::new().pin(b.twin.fingerprint(), Role::Twin));
    let server = net::server(loopback(), &b.primary, primary_pins.clone()).expect("server");
    let addr = server.local_addr().expect("addr");
    let twin_pins = Arc::new(Pins::new().pin(b.primary.fingerprint(), Role::Primary));
    let client = net::client(&b.twin, twin_pins.clone()).expect("client");
    Pinned {
        server,
        addr,
        primary_pins,
        twin_pins,
        client,
    }
}

/// A connection from the twin's endpoint to the primary's: the twin's
/// end, then the primary's.
async fn connected(p: &Pinned) -> (quinn::Connection, quinn::Connection) {
    let (conn, accepted) = tokio::join!(net::connect(&p.client, p.addr), accepted(&p.server));
    (conn.expect("connect"), accepted)
}

/// The next connection `server` accepts, handshake done.
async fn accepted(server: &quinn::Endpoint) -> quinn::Connection {
    server
        .accept()
        .await
        .expect("incoming")
        .await
        .expect("handshake")
}

#[tokio::test]
async fn a_pinned_twin_connects_and_is_known_by_its_role() {
    let b = boxes();
    let Pinned {
        server,
        addr,
        primary_pins,
        twin_pins,
        client,
    } = pinned(&b);

    let accept = tokio::spawn(async move {
        let conn = accepted(&server).await;
        let (_, role) = net::peer(&conn, &primary_pins).expect("peer");
        let (_send, mut recv) = conn.accept_bi().await.expect("stream");
        let msg: Option<TwinMsg> = net::read_msg(&mut recv).await.expect("read");
        (role, msg)
    });
    let conn = net::connect(&client, addr).await.expect("connect");
    assert_eq!(net::peer(&conn, &twin_pins).expect("peer").1, Role::Primary);
    let (mut send, _recv) = conn.open_bi().await.expect("open");
    net::write_msg(&mut send, &TwinMsg::Ack { durable: 42 })
        .await
        .expect("write");
    send.finish().expect("finish");
    let (role, msg) = accept.await.expect("join");
    assert_eq!(role, Role::Twin);
    assert_eq!(msg, Some(TwinMsg::Ack { durable: 42 }));
}

#[tokio::test]
async fn an_unknown_certificate_is_refused_in_the_handshake() {
    let b = boxes();
    let stranger = Identity::mint().expect("mint");
    let primary_pins = Arc::new(Pins::new().pin(b.twin.fingerprint(), Role::Twin));
    let server = net::server(loopback(), &b.primary, primary_pins.clone()).expect("server");
    let addr = server.local_addr().expect("addr");
    let accept = tokio::spawn(async move {
        match server.accept().await {
            Some(incoming) => incoming.await.map(|_| ()),
            None => Ok(()),
        }
    });
    // The stranger pins the primary, but the primary does not pin it.
    let client = net::client(
        &stranger,
        Arc::new(Pins::new().pin(b.primary.fingerprint(), Role::Primary)),
    )
    .expect("client");
    let dialed = tokio::time::timeout(Duration::from_secs(5), net::connect(&client, addr)).await;
    let server_side = tokio::time::timeout(Duration::from_secs(5), accept)
        .await
        .expect("accept ends")
        .expect("join");
    assert!(
        server_side.is_err(),
        "the primary refused the stranger in the handshake"
    );
    // With TLS 1.3 the client may finish its half before the server's
    // refusal arrives; any stream it opens then fails.
    let refusal = match dialed.expect("the dial ends") {
        Ok(conn) => net::NetError::Connection(
            tokio::time::timeout(Duration::from_secs(5), conn.closed())
                .await
                .expect("the stranger's connection is closed by the refusal"),
        ),
        Err(e) => e,
    };
    assert!(
        net::refused_by_peer(&refusal),
        "the stranger can tell its certificate was refused: {refusal}"
    );
    // The primary remembers who knocked, for its status.
    let refused = primary_pins.refused();
    assert_eq!(refused.len(), 1);
    assert_eq!(refused[0].fingerprint, stranger.fingerprint().to_string());

    // And a twin that does not pin the server refuses it.
    let server = net::server(
        loopback(),
        &stranger,
        Arc::new(Pins::new().pin(b.twin.fingerprint(), Role::Twin)),
    )
    .expect("server");
    let addr = server.local_addr().expect("addr");
    tokio::spawn(async move {
        if let Some(i) = server.accept().await {
            let _ = i.await;
        }
    });
    let client = net::client(
        &b.twin,
        Arc::new(Pins::new().pin(b.primary.fingerprint(), Role::Primary)),
    )
    .expect("client");
    let dialed = tokio::time::timeout(Duration::from_secs(5), net::connect(&client, addr))
        .await
        .expect("no hang");
    assert!(
        dialed.is_err(),
        "the twin refused a primary it does not pin"
    );
}

#[tokio::test]
async fn an_oversized_message_is_refused_before_it_is_read() {
    let b = boxes();
    let pins = Arc::new(
        Pins::new()
            .pin(b.twin.fingerprint(), Role::Twin)
            .pin(b.primary.fingerprint(), Role::Primary),
    );
    let server = net::server(loopback(), &b.primary, pins.clone()).expect("server");
    let addr = server.local_addr().expect("addr");
    let accept = tokio::spawn(async move {
        let conn = server
            .accept()
            .await
            .expect("incoming")
            .await
            .expect("handshake");
        let (_send, mut recv) = conn.accept_bi().await.expect("stream");
        net::read_msg::<TwinMsg>(&mut recv).await
    });
    let client = net::client(&b.twin, pins).expect("client");
    let conn = net::connect(&client, addr).await.expect("connect");
    let (mut send, _recv) = conn.open_bi().await.expect("open");
    send.write_all(&(MAX_CONTROL_LEN as u32 + 1).to_le_bytes())
        .await
        .expect("write");
    let got = accept.await.expect("join");
    assert!(
        matches!(got, Err(NetError::Message(DecodeError::TooLarge(n))) if n == MAX_CONTROL_LEN + 1)
    );
}

/// A server endpoint of `identity` on `addr` in a runtime of its own, that
/// holds every connection it accepts: dropping the runtime is a process
/// dying (nothing is sent, not even a close).
fn doomed_server(
    identity: &Identity,
    pins: Arc<Pins>,
    addr: std::net::SocketAddr,
) -> (tokio::runtime::Runtime, std::net::SocketAddr) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    // The endpoint's driver and socket belong to the runtime entered.
    let server = {
        let _in = rt.enter();
        net::server(addr, identity, pins).expect("server")
    };
    let addr = server.local_addr().expect("addr");
    rt.spawn(async move {
        let mut held = Vec::new();
        while let Some(incoming) = server.accept().await {
            if let Ok(conn) = incoming.await {
                held.push(conn);
            }
        }
    });
    (rt, addr)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_endpoint_resets_its_predecessor_s_connections() {
    let b = boxes();
    let server_pins = Arc::new(Pins::new().pin(b.twin.fingerprint(), Role::Twin));
    let (first, addr) = doomed_server(&b.primary, server_pins.clone(), loopback());
    let client = net::client(
        &b.twin,
        Arc::new(Pins::new().pin(b.primary.fingerprint(), Role::Primary)),
    )
    .expect("client");
    let conn = net::connect(&client, addr).await.expect("connect");
    // The connection works: a stream's bytes are acknowledged.
    let (mut send, _recv) = conn.open_bi().await.expect("open");
    send.write_all(b"hello").await.expect("write");

    // The process dies: its tasks and socket go, nothing is sent.
    tokio::task::spawn_blocking(move || first.shutdown_timeout(Duration::from_secs(5)))
        .await
        .expect("shutdown");
    // The next one binds the same address with the same identity (the
    // key read back from its PEM, as a restarted daemon reads it).
    let again = Identity::from_pem(b.primary.cert_pem(), b.primary.key_pem()).expect("pem");
    let (second, at) = doomed_server(&again, server_pins, addr);
    assert_eq!(at, addr);
    // The next packet the client sends finds the new process, which
    // answers with the reset. That may be a path MTU probe the client
    // sent on its own before this write: then the write finds the
    // connection reset already.
    let started = std::time::Instant::now();
    match send.write_all(b"anyone?").await {
        Ok(()) => {}
        // A packet the client sent meanwhile (an acknowledgement, a
        // retransmission) found the new endpoint first.
        Err(quinn::WriteError::ConnectionLost(quinn::ConnectionError::Reset)) => {}
        Err(e) => panic!("write: {e}"),
    }
    let why = tokio::time::timeout(Duration::from_secs(5), conn.closed())
        .await
        .expect("the connection ends well before QUIC's idle timeout");
    let took = started.elapsed();
    eprintln!("reset {took:?} after the first packet to the restarted endpoint");
    assert_eq!(why, quinn::ConnectionError::Reset, "{why}");
    assert!(took < Duration::from_secs(1), "{took:?}");
    // The new endpoint serves a new connection as usual.
    let conn = tokio::time::timeout(Duration::from_secs(5), net::connect(&client, addr))
        .await
        .expect("no hang")
        .expect("a new connection");
    drop(conn);
    tokio::task::spawn_blocking(move || second.shutdown_timeout(Duration::from_secs(5)))
        .await
        .expect("shutdown");
}

/// A bulk transfer on loopback grows its packets past Ethernet's 1,452
/// bytes by path MTU discovery, and the larger packets arrive: a bound
/// past what one segmented send can carry would lose every batch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bulk_transfer_grows_its_packets_and_loses_none() {
    let b = boxes();
    let p = pinned(&b);
    let (conn, server_conn) = connected(&p).await;
    let received = tokio::spawn(async move {
        let mut recv = server_conn.accept_uni().await.expect("stream");
        let mut buf = vec![0u8; 1 << 20];
        let mut n = 0usize;
        while let Some(k) = recv.read(&mut buf).await.expect("read") {
            n += k;
        }
        (n, server_conn)
    });
    let mut send = conn.open_uni().await.expect("open");
    let piece = vec![0x5au8; 1 << 20];
    for _ in 0..64 {
        send.write_all(&piece).await.expect("write");
    }
    send.finish().expect("finish");
    let (n, _server_conn) = received.await.expect("join");
    assert_eq!(n, 64 << 20);
    let path = conn.stats().path;
    assert!(
        path.current_mtu > 1452 && path.current_mtu <= net::MAX_UDP_PAYLOAD,
        "{path:?}"
    );
    assert!(path.lost_packets * 100 <= path.sent_packets, "{path:?}");
}

/// A stream read on a blocking thread through `PumpedStream` gives every
/// message and byte in order, however the reads cut the batches; a stream
/// that ends inside a read is `FinishedEarly` with what it had, one that
/// ends between messages is `None`, and a reset stream is an error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pumped_stream_reads_in_order_and_names_how_it_ended() {
    use twinlog::net::pumped::PumpedStream;

    struct Read {
        first: Option<TwinMsg>,
        bytes: Vec<u8>,
        second: Option<TwinMsg>,
        after: Option<TwinMsg>,
    }

    let b = boxes();
    let p = pinned(&b);
    let (conn, server_conn) = connected(&p).await;
    let rt = tokio::runtime::Handle::current();
    // Bytes of a known pattern, past several batches, between messages.
    let blob: Vec<u8> = (0..(3 << 20) + 12_345u32)
        .map(|i| (i % 251) as u8)
        .collect();
    for ending in ["finished", "cut short", "reset"] {
        let mut send = conn.open_uni().await.expect("open");
        net::write_msg(&mut send, &TwinMsg::Ack { durable: 7 })
            .await
            .expect("message");
        let body = match ending {
            "cut short" => &blob[..1000],
            _ => &blob[..],
        };
        send.write_all(body).await.expect("bytes");
        net::write_msg(&mut send, &TwinMsg::Ack { durable: 8 })
            .await
            .expect("message");
        match ending {
            "reset" => send.reset(9u32.into()).expect("reset"),
            _ => send.finish().expect("finish"),
        }
        let recv = server_conn.accept_uni().await.expect("accept");
        let (rt, len) = (rt.clone(), blob.len());
        let read = tokio::task::spawn_blocking(move || -> Result<Read, NetError> {
            let mut pumped = PumpedStream::start(&rt, recv);
            let first = pumped.read_msg()?;
            let mut bytes = vec![0u8; len];
            // Reads of an odd size, so that they cut the batches anywhere.
            for piece in bytes.chunks_mut(77_777) {
                pumped.read_exact(piece)?;
            }
            let second = pumped.read_msg()?;
            let after = pumped.read_msg()?;
            Ok(Read {
                first,
                bytes,
                second,
                after,
            })
        })
        .await
        .expect("join");
        match ending {
            "finished" => {
                let r = read.expect("read whole");
                assert!(matches!(r.first, Some(TwinMsg::Ack { durable: 7 })));
                assert!(r.bytes == blob, "the bytes differ");
                assert!(matches!(r.second, Some(TwinMsg::Ack { durable: 8 })));
                assert!(r.after.is_none(), "nothing after the end");
            }
            "cut short" => {
                // The 1,000 bytes and the second message, then the end,
                // all inside the first read of the bytes.
                let e = read.err().expect("cut short");
                assert!(
                    matches!(
                        e,
                        NetError::Read {
                            source: quinn::ReadExactError::FinishedEarly(n)
                        } if n > 1000 && n < 77_777
                    ),
                    "{e}"
                );
            }
            _ => {
                // Wherever the reset overtook the reads.
                let e = read.err().expect("reset");
                assert!(
                    matches!(
                        e,
                        NetError::Read {
                            source: quinn::ReadExactError::ReadError(quinn::ReadError::Reset(_))
                        }
                    ),
                    "{e}"
                );
            }
        }
    }
}
