//! A pipeline carries many callers' small requests on one stream, each
//! answered by its id; whatever a client sends on it, a request it cannot
//! take is refused by name, the pipeline ends cleanly where its framing is
//! lost, and nothing of a refused request is written.

use std::sync::Arc;
use std::time::Duration;

use twinlog::net::{self, Pins, Role};
use twinlog::node::api::{ClientRole, Piped, PipedAnswer, PIPED_BODY_MAX};
use twinlog::node::{
    ApiError, Client, Durability, PrimaryOptions, Request, Response, WriteRefusal,
};

#[path = "support/in_process.rs"]
mod in_process;
use in_process::{start_exactly, start_with_absent_twin, Running};

const APP: u16 = 0x8000;

fn start(dir: &std::path::Path) -> Running {
    start_exactly(
        dir,
        PrimaryOptions {
            body_piece_deadline: Duration::from_millis(400),
            ..PrimaryOptions::default()
        },
    )
}

/// A raw pipeline, opened and answered `Pipelining`.
struct RawPipe {
    send: quinn::SendStream,
    recv: quinn::RecvStream,
    _conn: quinn::Connection,
    _endpoint: quinn::Endpoint,
}

async fn raw_pipe(r: &Running) -> RawPipe {
    let pins = Arc::new(Pins::new().pin(r.server.fingerprint(), Role::Primary));
    let endpoint = net::client(&r.client, pins).expect("endpoint");
    let conn = net::connect(&endpoint, r.addr).await.expect("connect");
    let (mut send, mut recv) = conn.open_bi().await.expect("stream");
    net::write_msg(&mut send, &Request::Pipeline)
        .await
        .expect("open");
    match net::read_msg::<Response>(&mut recv).await.expect("read") {
        Some(Response::Pipelining {
            in_flight,
            body_bytes,
        }) => assert!(in_flight >= 1 && body_bytes >= PIPED_BODY_MAX),
        other => panic!("a pipeline opened with {other:?}"),
    }
    RawPipe {
        send,
        recv,
        _conn: conn,
        _endpoint: endpoint,
    }
}

impl RawPipe {
    async fn send(&mut self, id: u64, req: Request, body: &[u8]) {
        net::write_msg(&mut self.send, &Piped { id, req })
            .await
            .expect("request");
        self.send.write_all(body).await.expect("body");
    }

    /// The next answer, or None once the primary finished the pipeline.
    async fn answer(&mut self) -> Option<PipedAnswer> {
        tokio::time::timeout(Duration::from_secs(10), net::read_msg(&mut self.recv))
            .await
            .expect("answered in time")
            .expect("read")
    }
}

fn append(blob_len: u64) -> Request {
    Request::Append {
        kind: APP,
        meta: b"piped".to_vec(),
        blob_len,
        durability: Durability::Local,
        once: None,
    }
}

/// Two hundred appends from callers sharing one client: each answered
/// with its own frame, every frame once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_callers_share_one_pipeline_and_each_gets_its_own_frame() {
    let dir = tempfile::tempdir().expect("tempdir");
    let r = start(dir.path());
    let client = Arc::new(r.connect().await);
    let mut calls = tokio::task::JoinSet::new();
    for i in 0..200u32 {
        let client = client.clone();
        calls.spawn(async move {
            let blob = vec![(i % 251) as u8; 1 + (i as usize * 37) % 3000];
            let (seq, _) = client
                .append(APP, &i.to_le_bytes(), &blob, Durability::Local)
                .await
                .expect("append");
            (seq, i, blob)
        });
    }
    let mut seen = std::collections::BTreeSet::new();
    while let Some(done) = calls.join_next().await {
        let (seq, i, blob) = done.expect("call");
        assert!(seen.insert(seq), "frame {seq} answered twice");
        let e = client.read(seq).await.expect("read");
        assert_eq!(e.meta, i.to_le_bytes(), "frame {seq} is another call's");
        assert_eq!(e.blob, blob);
    }
    assert_eq!(seen.len(), 200);
    assert_eq!(r.primary.log().head_seq(), 200);
    assert_eq!(client.status().await.expect("status").head, 200);
}

/// Large blobs stream into the log on a pipeline between small ones, the
/// request after each read exactly where its blob ends: every caller gets
/// its own frame, whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_blobs_stream_on_a_pipeline_between_small_ones() {
    let dir = tempfile::tempdir().expect("tempdir");
    let r = start(dir.path());
    let client = Arc::new(r.connect().await);
    let mut calls = tokio::task::JoinSet::new();
    for i in 0..24u32 {
        let client = client.clone();
        calls.spawn(async move {
            let len = match i % 3 {
                0 => (PIPED_BODY_MAX as usize) + 1 + i as usize * 7919,
                1 => PIPED_BODY_MAX as usize,
                _ => i as usize,
            };
            let blob: Vec<u8> = (0..len).map(|j| (j as u32 ^ i) as u8).collect();
            let (seq, _) = client
                .append(APP, &i.to_le_bytes(), &blob, Durability::Local)
                .await
                .expect("append");
            (seq, i, blob)
        });
    }
    while let Some(done) = calls.join_next().await {
        let (seq, i, blob) = done.expect("call");
        let e = client.read(seq).await.expect("read");
        assert_eq!(e.meta, i.to_le_bytes(), "frame {seq} is another call's");
        assert!(e.blob == blob, "frame {seq}'s blob is not call {i}'s");
    }
    assert_eq!(r.primary.log().head_seq(), 24);
    // On a raw pipeline: a streamed append, then a small one right after
    // its last byte.
    let mut p = raw_pipe(&r).await;
    let big = vec![5u8; 3 << 20];
    p.send(1, append(big.len() as u64), &big).await;
    p.send(2, append(2), b"ok").await;
    let mut got = vec![
        p.answer().await.expect("one"),
        p.answer().await.expect("two"),
    ];
    got.sort_by_key(|a| a.id);
    for (a, seq) in got.iter().zip([25, 26]) {
        match a.resp {
            Response::Appended { seq: s, .. } => assert_eq!(s, seq, "{got:?}"),
            ref other => panic!("answered {other:?}"),
        }
    }
}

/// Requests a pipeline does not take are refused by id, and the pipeline
/// goes on; answers carry the ids they were asked under.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_a_pipeline_does_not_take_are_refused_by_id_and_it_goes_on() {
    let dir = tempfile::tempdir().expect("tempdir");
    let r = start(dir.path());
    let mut p = raw_pipe(&r).await;
    p.send(7, append(3), b"abc").await;
    p.send(8, Request::Read { seq: 1 }, &[]).await;
    let doc = Request::PutDoc {
        name: "d".into(),
        len: 4,
        durability: Durability::Local,
    };
    p.send(9, doc, b"body").await;
    p.send(10, Request::Status, &[]).await;
    p.send(11, append(0), &[]).await;
    let mut answers = std::collections::BTreeMap::new();
    for _ in 0..5 {
        let a = p.answer().await.expect("an answer");
        answers.insert(a.id, a.resp);
    }
    assert!(
        matches!(answers[&7], Response::Appended { .. }),
        "{answers:?}"
    );
    for id in [8, 9] {
        match &answers[&id] {
            Response::Error(ApiError::BadRequest(why)) => {
                assert!(why.contains("stream of its own"), "{why}")
            }
            other => panic!("request {id} answered {other:?}"),
        }
    }
    assert!(matches!(answers[&10], Response::Status(_)));
    assert!(matches!(answers[&11], Response::Appended { .. }));
    // The client finishes; the primary finishes after its last answer.
    p.send.finish().expect("finish");
    assert!(p.answer().await.is_none());
    assert_eq!(r.primary.log().head_seq(), 2, "the refused wrote nothing");
}

/// A body past the pipeline's bound on a request that is not an append, a
/// body that stalls, a request under the reserved id 0, bytes that do not
/// decode, and a streamed append refused each end the pipeline by name (the framing past them is
/// lost); nothing of them is written and the primary serves on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pipeline_whose_framing_is_lost_ends_by_name_and_writes_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let r = start(dir.path());

    let mut p = raw_pipe(&r).await;
    p.send(1, append(1), b"x").await;
    let doc = Request::PutDoc {
        name: "d".into(),
        len: PIPED_BODY_MAX + 1,
        durability: Durability::Local,
    };
    p.send(2, doc, &[]).await;
    let mut got = Vec::new();
    while let Some(a) = p.answer().await {
        got.push(a);
    }
    got.sort_by_key(|a| a.id);
    assert_eq!(got.len(), 2, "{got:?}");
    assert!(
        matches!(got[0].resp, Response::Appended { seq: 1, .. }),
        "{got:?}"
    );
    match &got[1] {
        PipedAnswer {
            id: 2,
            resp: Response::Error(ApiError::Refused(WriteRefusal::TooLarge { len, max, .. })),
        } => assert_eq!((*len, *max), (PIPED_BODY_MAX + 1, PIPED_BODY_MAX)),
        other => panic!("an oversized piped blob answered {other:?}"),
    }

    // A body held whole, and one streamed into the log, that stall.
    for len in [1000, 3 << 20] {
        let mut p = raw_pipe(&r).await;
        p.send(5, append(len), &[1u8; 10]).await;
        match p.answer().await {
            Some(PipedAnswer {
                id: 5,
                resp:
                    Response::Error(ApiError::BodyStalled {
                        received, expected, ..
                    }),
            }) => assert_eq!((received, expected), (10, len)),
            other => panic!("a stalled piped body answered {other:?}"),
        }
        assert!(p.answer().await.is_none(), "the pipeline ended");
    }

    let mut p = raw_pipe(&r).await;
    p.send(0, append(1), b"z").await;
    match p.answer().await {
        Some(PipedAnswer {
            id: 0,
            resp: Response::Error(ApiError::BadRequest(why)),
        }) => assert!(why.contains("reserved"), "{why}"),
        other => panic!("a request under id 0 answered {other:?}"),
    }
    assert!(p.answer().await.is_none(), "the pipeline ended");

    let mut p = raw_pipe(&r).await;
    p.send
        .write_all(&[3, 0, 0, 0, 0xff, 0xff, 0xff])
        .await
        .expect("garbage");
    match p.answer().await {
        Some(PipedAnswer {
            id: 0,
            resp: Response::Error(ApiError::BadRequest(why)),
        }) => assert!(why.contains("did not decode"), "{why}"),
        other => panic!("garbage on a pipeline answered {other:?}"),
    }
    assert!(p.answer().await.is_none(), "the pipeline ended");

    // A streamed append refused before its body is read: its body is not
    // taken, so the pipeline ends after its answer.
    let reader = std::collections::HashMap::from([(r.client.fingerprint(), ClientRole::Read)]);
    r.primary.set_client_roles(reader);
    let mut p = raw_pipe(&r).await;
    r.primary.set_client_roles(Default::default());
    p.send(6, append(3 << 20), &[]).await;
    match p.answer().await {
        Some(PipedAnswer {
            id: 6,
            resp: Response::Error(ApiError::Forbidden(_)),
        }) => {}
        other => panic!("a refused streamed append answered {other:?}"),
    }
    assert!(p.answer().await.is_none(), "the pipeline ended");

    assert_eq!(
        r.primary.log().head_seq(),
        1,
        "only the whole append landed"
    );
    let client = r.connect().await;
    let (seq, _) = client
        .append(APP, b"", b"after", Durability::Local)
        .await
        .expect("served on");
    assert_eq!(seq, 2);
}

/// Callers that give up at every point of a call (before, during and
/// after its write) leave the shared pipeline whole: every later call is
/// answered with its own frame.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn callers_that_give_up_midway_leave_the_pipeline_whole() {
    let dir = tempfile::tempdir().expect("tempdir");
    let r = start(dir.path());
    let client = r.connect().await;
    let blob = vec![9u8; 200_000];
    for i in 0..60u32 {
        // Polled never, once or a few times: cut off wherever it got to,
        // and dropped before the next call.
        {
            let meta = i.to_le_bytes();
            let call = client.append(APP, &meta, &blob, Durability::Local);
            tokio::pin!(call);
            for _ in 0..i % 4 {
                let _ = futures_poll_once(&mut call).await;
            }
        }
        let (seq, _) = client
            .append(APP, b"kept", &i.to_le_bytes(), Durability::Local)
            .await
            .expect("a call after one that gave up");
        let e = client.read(seq).await.expect("read");
        assert_eq!(
            (e.meta.as_slice(), e.blob),
            (&b"kept"[..], i.to_le_bytes().to_vec())
        );
    }
}

/// A pipeline whose room is full stops reading, so callers' writes block
/// and are cut off by their deadline half-way; once room frees (the twin's
/// wait fails), the next call finishes what was cut off, so the framing
/// holds, and is answered with its own frame.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_cut_off_half_way_leave_the_pipeline_whole() {
    use twinlog::node::{ClientError, ClientOptions, TwinPolicy};
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = PrimaryOptions {
        policy: TwinPolicy::Fail(Duration::from_millis(600)),
        ..PrimaryOptions::default()
    };
    let r = start_with_absent_twin(dir.path(), cfg);
    let client = Arc::new(
        Client::connect_with(
            &r.client,
            r.server.fingerprint(),
            r.addr,
            ClientOptions {
                deadline: Duration::from_millis(300),
            },
        )
        .await
        .expect("client"),
    );
    // 40 MiB of `twin` appends with no twin: past the room the primary
    // holds per connection and the stream's window, until they fail.
    let mut calls = tokio::task::JoinSet::new();
    for _ in 0..40 {
        let client = client.clone();
        calls.spawn(async move {
            let blob = vec![1u8; PIPED_BODY_MAX as usize];
            client.append(APP, b"", &blob, Durability::Twin).await
        });
    }
    while let Some(done) = calls.join_next().await {
        match done.expect("call") {
            Err(ClientError::Deadline { .. } | ClientError::Api(ApiError::TwinTimeout { .. })) => {}
            other => panic!("a `twin` append with no twin ended {other:?}"),
        }
    }
    let after = async {
        loop {
            // Calls wait behind the room the failing ones hold.
            match client.append(APP, b"after", b"", Durability::Local).await {
                Err(ClientError::Deadline { .. }) => continue,
                done => return done.expect("a call after writes cut off"),
            }
        }
    };
    let (seq, _) = tokio::time::timeout(Duration::from_secs(20), after)
        .await
        .expect("answered once room freed");
    assert_eq!(client.read(seq).await.expect("read").meta, b"after");
    // Every frame is one a caller sent whole: the framing never tore.
    for at in 1..=r.primary.log().head_seq() {
        let e = client.read(at).await.expect("read");
        let whole = (e.meta.is_empty() && e.blob == vec![1u8; PIPED_BODY_MAX as usize])
            || (e.meta == b"after" && e.blob.is_empty());
        assert!(
            whole,
            "frame {at}: {} meta bytes, {} blob bytes",
            e.meta.len(),
            e.blob.len()
        );
    }
}

/// Poll `f` once; its output if it was ready.
async fn futures_poll_once<F: std::future::Future + Unpin>(f: &mut F) -> Option<F::Output> {
    std::future::poll_fn(|cx| {
        std::task::Poll::Ready(match std::pin::Pin::new(&mut *f).poll(cx) {
            std::task::Poll::Ready(v) => Some(v),
            std::task::Poll::Pending => None,
        })
    })
    .await
}
