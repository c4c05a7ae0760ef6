//! A primary without an arbiter that did not stop cleanly may have been
//! deposed while it was down (its twin promoted by hand): it starts held,
//! and acknowledges nothing until its twin says hello at its epoch. A
//! clean stop (SIGTERM) restarts serving at once; `primary release` lifts
//! the hold by hand. Real processes, every wait on a daemon's `/status`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use twinlog::daemon;
use twinlog::net::{Fingerprint, Identity};
use twinlog::node::epoch::HELD_FOR_HELLO;
use twinlog::node::{Client, Durability};

#[path = "support/children.rs"]
mod children;
use children::{fast, pstatus, tstatus, Daemon};
use testkit::{free_tcp, free_udp};

const WAIT: Duration = Duration::from_secs(30);
const KIND: u16 = 0x8000;
const T1: u64 = 1 << twinlog::repl::epochs::LIFE_BITS;

/// A primary A and its twin B, initialized, not started.
struct Pair {
    root: tempfile::TempDir,
    a_cfg: PathBuf,
    b_cfg: PathBuf,
    a_listen: SocketAddr,
    a_metrics: SocketAddr,
    b_metrics: SocketAddr,
    a_fp: Fingerprint,
    admin: Identity,
}

impl Pair {
    fn new() -> Pair {
        let root = tempfile::tempdir().expect("tempdir");
        let (a_listen, a_metrics, b_metrics) = (free_udp(), free_tcp(), free_tcp());
        let (b_cfg, b_fp) = daemon::init_twin(&root.path().join("b"), a_listen, b_metrics, None)
            .expect("twin init");
        let (a_cfg, a_fp) =
            daemon::init_primary(&root.path().join("a"), a_listen, a_metrics, Some(b_fp))
                .expect("primary init");
        daemon::pin_primary(&b_cfg, a_fp).expect("pin");
        fast(&a_cfg, false);
        fast(&b_cfg, true);
        let admin =
            daemon::load_identity(&root.path().join("a").join(daemon::ADMIN_DIR)).expect("admin");
        Pair {
            root,
            a_cfg,
            b_cfg,
            a_listen,
            a_metrics,
            b_metrics,
            a_fp,
            admin,
        }
    }

    fn log(&self, name: &str) -> PathBuf {
        self.root.path().join(format!("{name}.log"))
    }

    fn start_a(&self) -> Daemon {
        Daemon::start("primary", &self.a_cfg, &self.log("a"))
    }

    fn start_b(&self) -> Daemon {
        Daemon::start("twin", &self.b_cfg, &self.log("b"))
    }

    /// A client of A, dialled again until it connects (a port nobody
    /// listens on yet holds a QUIC handshake until a retransmission).
    async fn client(&self) -> Client {
        let by = Instant::now() + WAIT;
        loop {
            let dialled = tokio::time::timeout(
                Duration::from_millis(300),
                Client::connect(&self.admin, self.a_fp, self.a_listen),
            )
            .await;
            if let Ok(Ok(c)) = dialled {
                return c;
            }
            assert!(Instant::now() < by, "no client of A after {WAIT:?}");
        }
    }

    async fn following(&self) {
        testkit::until("B follows A", WAIT, || {
            tstatus(self.b_metrics).filter(|s| s.connected)
        })
        .await;
    }

    /// Until A's status says it is held for its twin's hello.
    async fn held(&self) -> twinlog::node::Status {
        testkit::until("A held for its twin's hello", WAIT, || {
            pstatus(self.a_metrics).filter(|s| {
                s.fenced
                    .as_ref()
                    .is_some_and(|f| f.held && f.by == HELD_FOR_HELLO)
            })
        })
        .await
    }
}

/// The finding: A's primary killed, B promoted by hand, A's unit restarts
/// it. A acknowledges nothing, before B's call fences it and after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_primary_that_may_be_deposed_acknowledges_nothing() {
    let pair = Pair::new();
    let mut a = pair.start_a();
    let mut b = pair.start_b();
    pair.following().await;
    let c = pair.client().await;
    for i in 0..3u64 {
        c.append(KIND, b"", &i.to_be_bytes(), Durability::Twin)
            .await
            .expect("a twin append");
    }
    drop(c);
    a.kill();
    b.stop();
    let (b_listen, b_primary_metrics) = (free_udp(), free_tcp());
    let promoted = daemon::failover::promote(
        &pair.b_cfg,
        b_listen,
        b_primary_metrics,
        Some(pair.a_fp),
        true,
    )
    .expect("twin promote");
    assert_eq!(promoted.epoch, T1);

    // A comes back before B serves: held, and a `local` append is written
    // but not acknowledged.
    let _a = pair.start_a();
    let s = pair.held().await;
    assert_eq!(s.head, 3);
    let c = pair.client().await;
    let held = tokio::spawn(async move {
        let r = c.append(KIND, b"", b"late", Durability::Local).await;
        (r, c)
    });
    testkit::until("the held append written", WAIT, || {
        pstatus(pair.a_metrics).filter(|s| s.head == 4)
    })
    .await;

    // B serves and calls A: A is fenced by B's epoch, the held append is
    // refused, and A still acknowledges nothing.
    let _b = Daemon::start("primary", &promoted.config, &pair.log("b2"));
    testkit::until("B's epoch fenced A", WAIT, || {
        pstatus(pair.a_metrics).filter(|s| s.fenced.as_ref().is_some_and(|f| f.epoch == T1))
    })
    .await;
    let started = Instant::now();
    let (r, c) = held.await.expect("the held append's task");
    match r {
        Ok(answer) => panic!("A, maybe deposed, acknowledged {answer:?}"),
        Err(e) => eprintln!("refused {:?} after the fence: {e}", started.elapsed()),
    }
    drop(c);
    let c = pair.client().await;
    for d in [Durability::Local, Durability::Twin] {
        if let Ok(answer) = c.append(KIND, b"", b"later", d).await {
            panic!("the fenced A acknowledged {answer:?}");
        }
    }
}

/// A crash restart with the twin away is held until the twin says hello;
/// an append waiting meanwhile is acknowledged once it does. A clean
/// stop serves at once; `primary release` lifts the hold by hand.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_primary_serves_on_its_twin_s_hello_a_clean_stop_at_once() {
    let pair = Pair::new();
    let mut a = pair.start_a();
    let b = pair.start_b();
    pair.following().await;
    let c = pair.client().await;
    c.append(KIND, b"", b"first", Durability::Twin)
        .await
        .expect("a twin append");
    drop(c);

    // A crash, the twin frozen: held; thawed, its hello lifts the hold
    // and the waiting append is answered `twin`.
    b.signal(libc::SIGSTOP);
    a.kill();
    let mut a = pair.start_a();
    pair.held().await;
    let c = pair.client().await;
    let waiting = tokio::spawn(async move {
        let r = c.append(KIND, b"", b"while held", Durability::Twin).await;
        (r, c)
    });
    b.signal(libc::SIGCONT);
    let (r, c) = waiting.await.expect("the append's task");
    let (seq, d) = r.expect("acknowledged once the twin said hello");
    assert_eq!((seq, d), (2, Durability::Twin));
    assert!(pstatus(pair.a_metrics).expect("status").fenced.is_none());
    drop(c);

    // A clean stop with the twin frozen: the next start serves at once.
    b.signal(libc::SIGSTOP);
    a.stop();
    let mut a = pair.start_a();
    let c = pair.client().await;
    let (_, d) = c
        .append(KIND, b"", b"after a clean stop", Durability::Local)
        .await
        .expect("served at once after a clean stop");
    assert_eq!(d, Durability::Local);
    drop(c);

    // A crash again, the twin still frozen: held; `primary release`
    // lifts it by hand.
    a.kill();
    let _a = pair.start_a();
    pair.held().await;
    let released = daemon::held_start::release(&pair.a_cfg, None).expect("primary release");
    assert_eq!(released, daemon::held_start::Released::HeldStart);
    testkit::until("the hold lifted", WAIT, || {
        pstatus(pair.a_metrics).filter(|s| s.fenced.is_none())
    })
    .await;
    let c = pair.client().await;
    c.append(KIND, b"", b"released", Durability::Local)
        .await
        .expect("acknowledged once released");
    b.signal(libc::SIGCONT);
}
