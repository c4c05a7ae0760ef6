//! A restore trusts its source no more than it must: a source that
//! announces a frame whose blob no log may hold is refused by name before
//! anything of it is written (the box's log opens clean afterwards), and a
//! twin ends an open restore connection when the pin that let it in
//! expires, as it refuses new handshakes then.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use twinlog::log::{Log, MAX_BLOB};
use twinlog::net::{self, Identity, Pins, Role};
use twinlog::node::epoch::Epochs;
use twinlog::node::restore::{self, RestoreError, RestoreOptions};
use twinlog::node::restore_serve::{
    self, RestoreFrame, RestoreReq, RestoreResp, RestoreSource, CLOSE_PIN_EXPIRED,
};
use twinlog::node::snapshot_transfer::SnapshotSource;
use twinlog::node::store_host::StoreHost;
use twinlog::store::{install, StoreOptions};

/// A restore source that answers `Hello` with a log of one frame and
/// `Frames` with that frame announced as `blob_len` bytes, then one byte.
async fn lying_source(
    restorer: &Identity,
    blob_len: u64,
) -> (std::net::SocketAddr, Identity, tokio::task::JoinHandle<()>) {
    let id = Identity::mint().expect("mint");
    let pins = Arc::new(Pins::new().pin(restorer.fingerprint(), Role::Restore));
    let endpoint = net::server(([127, 0, 0, 1], 0).into(), &id, pins).expect("server");
    let addr = endpoint.local_addr().expect("addr");
    let served = tokio::spawn(async move {
        let Some(incoming) = endpoint.accept().await else {
            return;
        };
        let Ok(conn) = incoming.await else { return };
        while let Ok((mut send, mut recv)) = conn.accept_bi().await {
            let Ok(Some(req)) = net::read_msg::<RestoreReq>(&mut recv).await else {
                return;
            };
            match req {
                RestoreReq::Hello => {
                    let welcome = RestoreResp::Welcome {
                        history: [7; 16],
                        first: 1,
                        head: 1,
                        head_crc: 0,
                        epoch: 1,
                        epochs: Epochs::in_memory(1).history(),
                    };
                    let _ = net::write_msg(&mut send, &welcome).await;
                }
                RestoreReq::Frames { from, .. } => {
                    let _ = net::write_msg(&mut send, &RestoreResp::Frames { through: 1 }).await;
                    let frame = RestoreFrame {
                        seq: from,
                        kind: 0x8000,
                        meta: Vec::new(),
                        blob_len,
                        payload_crc: 0,
                        from: 0,
                        erased: false,
                    };
                    let _ = net::write_msg(&mut send, &frame).await;
                    let _ = send.write_all(&[1]).await;
                }
                _ => return,
            }
            let _ = send.finish();
        }
    });
    (addr, id, served)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_source_announcing_a_blob_past_the_limit_is_refused_and_writes_nothing() {
    for blob_len in [MAX_BLOB + 1, i64::MAX as u64, u64::MAX] {
        let root = tempfile::tempdir().expect("tempdir");
        let me = Arc::new(Identity::mint().expect("mint"));
        let (addr, source, served) = lying_source(&me, blob_len).await;
        let r = restore::restore(
            RestoreOptions {
                data_dir: root.path().to_owned(),
                segment_bytes: 4096,
                source: addr,
                source_fingerprint: source.fingerprint(),
                identity: me.clone(),
            },
            Arc::new(|_| {}),
        )
        .await;
        match r {
            Err(RestoreError::BadLength { seq: 1, what }) => {
                assert!(what.contains(&blob_len.to_string()), "{what}")
            }
            other => panic!("a blob of {blob_len} bytes restored as {other:?}"),
        }
        served.abort();
        let log = Log::open_with(root.path().join("log"), 4096).expect("the box's log opens");
        assert_eq!(log.head_seq(), 0);
        assert_eq!(log.layout().len(), 1, "no segment was made for it");
        assert_eq!(log.poisoned_by(), None);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_restore_connection_ends_when_its_pin_expires() {
    let root = tempfile::tempdir().expect("tempdir");
    let log = Arc::new(Log::open(root.path().join("log")).expect("log"));
    log.append_raw(0x8000, b"", b"one").expect("append");
    let host = StoreHost::open(
        log.clone(),
        &root.path().join("store"),
        StoreOptions::default(),
    )
    .expect("host");
    let base = root.path().join(install::BASE_FILE);
    let source = Arc::new(RestoreSource {
        log,
        snapshots: SnapshotSource::new(host, &root.path().join("snapshots"), Some(base.clone())),
        epochs: Arc::new(Epochs::in_memory(1)),
        base,
    });
    let (twin, restorer) = (
        Identity::mint().expect("mint"),
        Identity::mint().expect("mint"),
    );
    let until = twinlog::repl::Now::system().unix_ms + 1500;
    let pins = Arc::new(Pins::new().pin_until(restorer.fingerprint(), Role::Restore, until));
    let endpoint = net::server(([127, 0, 0, 1], 0).into(), &twin, pins.clone()).expect("server");
    let addr = endpoint.local_addr().expect("addr");
    let (_stop, stopped) = watch::channel(false);
    tokio::spawn(restore_serve::serve(source, endpoint, pins, stopped));

    let client = net::client(
        &restorer,
        Arc::new(Pins::new().pin(twin.fingerprint(), Role::Twin)),
    )
    .expect("client");
    let conn = net::connect(&client, addr).await.expect("connect");
    let (mut send, mut recv) = conn.open_bi().await.expect("stream");
    net::write_msg(&mut send, &RestoreReq::Hello)
        .await
        .expect("hello");
    let _ = send.finish();
    match net::read_msg::<RestoreResp>(&mut recv)
        .await
        .expect("answer")
    {
        Some(RestoreResp::Welcome { head: 1, .. }) => {}
        other => panic!("hello answered {other:?}"),
    }
    // Nothing more is asked: the connection ends by itself at the expiry.
    let closed = tokio::time::timeout(Duration::from_secs(20), conn.closed())
        .await
        .expect("closed once the pin expired");
    match closed {
        quinn::ConnectionError::ApplicationClosed(c) => {
            assert_eq!(u64::from(c.error_code), u64::from(CLOSE_PIN_EXPIRED))
        }
        other => panic!("closed by {other:?}"),
    }
    assert!(twinlog::repl::Now::system().unix_ms >= until);
}
