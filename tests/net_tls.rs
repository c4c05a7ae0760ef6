//! QUIC with mutual TLS between pinned peers: a pinned peer connects and is
//! known by its role, an unknown certificate is refused in the handshake,
//! and an oversized message is refused before it is read.

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

#[tokio::test]
async fn a_pinned_twin_connects_and_is_known_by_its_role() {
    let b = boxes();
    let primary_pins = Arc::new(Pins::new().pin(b.twin.fingerprint(), Role::Twin));
    let server = net::server(loopback(), &b.primary, primary_pins.clone()).expect("server");
    let addr = server.local_addr().expect("addr");
    let twin_pins = Arc::new(Pins::new().pin(b.primary.fingerprint(), Role::Primary));
    let client = net::client(&b.twin, twin_pins.clone()).expect("client");

    let accept = tokio::spawn(async move {
        let conn = server
            .accept()
            .await
            .expect("incoming")
            .await
            .expect("handshake");
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
