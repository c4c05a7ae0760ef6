//! The epoch rules with the daemons as real processes
//! (`twinlog-test-child daemon`, which runs the `primary` and `twin`
//! binaries' library entry points), each against the way it once broke:
//!
//! - a primary's power cut, then payloads that repeat the twin's: the
//!   twin's frames the primary lost are never taken for the new ones, and
//!   no `twin` acknowledgement is lost;
//! - a fence naming an epoch nobody serves fences that box only, never the
//!   primary it later follows;
//! - a primary killed while its switchover's answer is on the way comes
//!   back fenced;
//! - a promoted box fences its restarted predecessor itself, and a twin
//!   that heard its primary a moment ago is not promoted unless forced.
//!
//! Every wait is on a daemon's `/status`, never a fixed sleep.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use twinlog::daemon::{self, PrimaryConfig, TwinConfig};
use twinlog::log::Log;
use twinlog::net::{Fingerprint, Identity};
use twinlog::node::api::ApiError;
use twinlog::node::{Client, ClientError, Durability, Status, TwinStatus};
use twinlog::repl::epochs::LIFE_BITS;

#[path = "support/children.rs"]
mod children;
#[path = "support/relay.rs"]
mod relay;
use children::{fast, Daemon};
use testkit::{free_tcp, free_udp};

/// The bound of every wait on state here: only a broken system reaches it.
const WAIT: Duration = Duration::from_secs(20);

const KIND: u16 = 0x8000;
const T1: u64 = 1 << LIFE_BITS;

fn pstatus(metrics: SocketAddr) -> Option<Status> {
    daemon::fetch_status::<Status>(metrics)
        .ok()
        .map(|(_, s)| s)
        .filter(|s| s.role == "primary")
}

fn tstatus(metrics: SocketAddr) -> Option<TwinStatus> {
    daemon::fetch_status::<TwinStatus>(metrics)
        .ok()
        .map(|(_, s)| s)
        .filter(|s| s.role == "twin")
}

/// Box A, a primary, and B, its twin, initialized in `root`; B dials
/// `b_dials` (A's address, or a relay in front of it).
struct Pair {
    a_dir: std::path::PathBuf,
    b_dir: std::path::PathBuf,
    a_cfg: std::path::PathBuf,
    b_cfg: std::path::PathBuf,
    a_fp: Fingerprint,
    a_listen: SocketAddr,
    a_metrics: SocketAddr,
    b_metrics: SocketAddr,
    a_admin: Arc<Identity>,
    logs: std::path::PathBuf,
}

fn init_pair(root: &Path, a_listen: SocketAddr, b_dials: SocketAddr) -> Pair {
    let (a_dir, b_dir) = (root.join("a"), root.join("b"));
    let (a_metrics, b_metrics) = (free_tcp(), free_tcp());
    let (b_cfg, b_fp) = daemon::init_twin(&b_dir, b_dials, b_metrics, None).expect("twin init");
    let (a_cfg, a_fp) =
        daemon::init_primary(&a_dir, a_listen, a_metrics, Some(b_fp)).expect("primary init");
    daemon::pin_primary(&b_cfg, a_fp).expect("pin");
    fast(&a_cfg, false);
    fast(&b_cfg, true);
    let a_admin = Arc::new(daemon::load_identity(&a_dir.join(daemon::ADMIN_DIR)).expect("admin"));
    let logs = root.join("logs");
    std::fs::create_dir_all(&logs).expect("logs dir");
    Pair {
        a_dir,
        b_dir,
        a_cfg,
        b_cfg,
        a_fp,
        a_listen,
        a_metrics,
        b_metrics,
        a_admin,
        logs,
    }
}

impl Pair {
    async fn a_client(&self) -> Client {
        Client::connect(&self.a_admin, self.a_fp, self.a_listen)
            .await
            .expect("client of A")
    }

    /// A and B served, B streaming, `n` frames `twin`-acknowledged.
    async fn streaming(&self, n: u64) -> (Daemon, Daemon) {
        let a = Daemon::start("primary", &self.a_cfg, &self.logs.join("a.log"));
        let b = Daemon::start("twin", &self.b_cfg, &self.logs.join("b.log"));
        testkit::until("B streams from A", WAIT, || {
            pstatus(self.a_metrics).filter(|s| s.twin_connected)
        })
        .await;
        let c = self.a_client().await;
        for seq in 1..=n {
            let got = c
                .append(KIND, b"", &blob("a", seq), Durability::Twin)
                .await
                .expect("append");
            assert_eq!(got, (seq, Durability::Twin));
        }
        (a, b)
    }
}

/// Every frame of a stopped box's log: (seq, blob).
fn blobs(dir: &Path) -> Vec<(u64, Vec<u8>)> {
    let log = Log::open_with(dir.join(daemon::LOG_DIR), 1 << 20).expect("open the log");
    (log.first_seq()..=log.head_seq())
        .map(|seq| (seq, log.read(seq).expect("read").blob))
        .collect()
}

fn blob(tag: &str, n: u64) -> Vec<u8> {
    format!("{tag}-{n}").into_bytes()
}

/// The primary shipped frames 11..=13 before its sync and lost them in a
/// power cut; the twin holds them (x, y, c). The restarted primary takes
/// `twin` appends d, e, c at 11..=13 while the twin is away: the last has
/// the very bytes of the twin's frame 13. When the twin comes back, it
/// must not be taken for holding them: it cuts its 11..=13 (saved under
/// `divergent/`) and takes the primary's, and only then are d, e, c
/// acknowledged `twin`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_power_cut_then_repeated_payloads_lose_no_twin_acknowledgement() {
    let root = tempfile::tempdir().expect("tempdir");
    let a_listen = free_udp();
    let p = init_pair(root.path(), a_listen, a_listen);
    let (mut a, mut b) = p.streaming(10).await;
    b.stop();
    a.stop();
    // What A shipped and a power cut took from it: on B only, durable.
    {
        let log = Log::open_with(p.b_dir.join(daemon::LOG_DIR), 1 << 20).expect("B's log");
        log.set_follower(true);
        for (seq, b) in [(11, blob("x", 11)), (12, blob("y", 12)), (13, blob("c", 0))] {
            log.append_at(seq, KIND, b"", &b).expect("append_at");
        }
        log.sync().expect("sync");
    }

    let mut a = Daemon::start("primary", &p.a_cfg, &p.logs.join("a.log"));
    testkit::until("A serves", WAIT, || pstatus(p.a_metrics)).await;
    let c = Arc::new(p.a_client().await);
    let mut waiting = Vec::new();
    for (n, b) in [(11, blob("d", 11)), (12, blob("e", 12)), (13, blob("c", 0))] {
        let c = c.clone();
        waiting.push(tokio::spawn(async move {
            (n, c.append(KIND, b"", &b, Durability::Twin).await)
        }));
        // In order: each is staged before the next is sent.
        testkit::until("the append is staged", WAIT, || {
            pstatus(p.a_metrics).filter(|s| s.head >= n)
        })
        .await;
    }
    let mut b = Daemon::start("twin", &p.b_cfg, &p.logs.join("b.log"));
    for w in waiting {
        let (n, got) = w.await.expect("join");
        assert_eq!(got.expect("twin append"), (n, Durability::Twin));
    }
    let s = testkit::until("the refusal is shown", WAIT, || {
        pstatus(p.a_metrics).filter(|s| s.twin_connected)
    })
    .await;
    assert_eq!(s.twin_acked, 13);
    b.stop();
    a.stop();
    let (on_a, on_b) = (blobs(&p.a_dir), blobs(&p.b_dir));
    assert_eq!(
        on_b, on_a,
        "a `twin` acknowledgement promises the twin holds these very frames"
    );
    assert_eq!(
        on_a[10..].to_vec(),
        vec![(11, blob("d", 11)), (12, blob("e", 12)), (13, blob("c", 0))]
    );
    let saved = twinlog::node::divergent::list(&p.b_dir).expect("list");
    assert_eq!(saved.len(), 1, "{saved:?}");
    assert_eq!((saved[0].fork, saved[0].first, saved[0].last), (10, 11, 13));
}

/// A fence naming an epoch nobody serves holds the box it is sent to, and
/// nobody else: that box, rejoined to the real new primary, does not fence
/// it with the epoch it was told.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fence_naming_a_phantom_epoch_fences_only_its_own_box() {
    let root = tempfile::tempdir().expect("tempdir");
    let a_listen = free_udp();
    let p = init_pair(root.path(), a_listen, a_listen);
    let (mut a, mut b) = p.streaming(5).await;
    a.kill();
    b.stop();
    let (b_listen, b_pmetrics) = (free_udp(), free_tcp());
    let promoted = daemon::failover::promote(&p.b_cfg, b_listen, b_pmetrics, Some(p.a_fp), true)
        .expect("promote");
    let mut b = Daemon::start("primary", &promoted.config, &p.logs.join("b.log"));
    testkit::until("B serves", WAIT, || pstatus(b_pmetrics)).await;
    let mut a = Daemon::start("primary", &p.a_cfg, &p.logs.join("a.log"));
    testkit::until("A serves", WAIT, || pstatus(p.a_metrics)).await;
    // An operator fences A by hand, naming an epoch nobody serves.
    {
        let c = p.a_client().await;
        let s = c.fence(5 * T1).await.expect("fence");
        assert!(s.fenced.is_some(), "{s:?}");
    }
    a.stop();
    daemon::failover::rejoin(
        &p.a_cfg,
        b_listen.into(),
        promoted.fingerprint,
        None,
        Duration::from_secs(10),
    )
    .await
    .expect("rejoin");
    let a_twin_cfg = p.a_dir.join(daemon::TWIN_CONFIG);
    let a_tmetrics = TwinConfig::load(&a_twin_cfg)
        .expect("A's twin.toml")
        .metrics;
    let a_tmetrics: SocketAddr = a_tmetrics.to_string().parse().expect("addr");
    let mut a = Daemon::start("twin", &a_twin_cfg, &p.logs.join("a.log"));
    testkit::until("A follows B", WAIT, || {
        tstatus(a_tmetrics).filter(|s| s.connected)
    })
    .await;
    let bs = pstatus(b_pmetrics).expect("B's status");
    assert!(bs.fenced.is_none(), "the phantom epoch fenced B: {bs:?}");
    let b_cfg = PrimaryConfig::load(&promoted.config).expect("B's primary.toml");
    let c = daemon::load::admin_client(&b_cfg).await.expect("B's admin");
    let got = c
        .append(KIND, b"", b"after", Durability::Twin)
        .await
        .expect("a twin append on B");
    assert_eq!(got.1, Durability::Twin);
    drop(c);
    a.stop();
    b.stop();
}

/// A switchover's `Promoted` answer is lost (the twin's packets to the
/// primary are dropped), and the old primary is killed while it waits for
/// it. It comes back held: no write is acknowledged by it beside the new
/// primary.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_primary_killed_while_its_switchover_is_answered_comes_back_fenced() {
    let root = tempfile::tempdir().expect("tempdir");
    let (a_listen, relay_at) = (free_udp(), free_udp());
    let relay = relay::Relay::start(relay_at, a_listen).await;
    let p = init_pair(root.path(), a_listen, relay_at);
    let (mut a, _b) = p.streaming(5).await;
    testkit::until("B acknowledged A's head", WAIT, || {
        pstatus(p.a_metrics).filter(|s| s.twin_acked == 5)
    })
    .await;
    // From now on nothing of B's reaches A: its `Promoted` is lost.
    relay.forward.store(false, Ordering::SeqCst);
    let a_cfg = PrimaryConfig::load(&p.a_cfg).expect("A's primary.toml");
    let admin = daemon::load::admin_client(&a_cfg).await.expect("A's admin");
    let switching =
        tokio::spawn(async move { admin.switchover(Duration::from_secs(10)).await.map(|_| ()) });
    testkit::until("B took over", WAIT, || pstatus(p.b_metrics)).await;
    a.kill();
    switching.abort();

    let mut a = Daemon::start("primary", &p.a_cfg, &p.logs.join("a.log"));
    testkit::until("A serves", WAIT, || pstatus(p.a_metrics)).await;
    let c = p.a_client().await;
    match c.append(KIND, b"", b"late", Durability::Local).await {
        Err(ClientError::Api(ApiError::Fenced { seq: None, .. })) => {}
        other => panic!("the old primary, beside the new one, answered {other:?}"),
    }
    let s = pstatus(p.a_metrics).expect("A's status");
    assert!(s.fenced.is_some(), "{s:?}");
    drop(c);
    a.stop();
}

/// B is promoted while A is down; A restarts in a new life of its old
/// term, hears from nobody it knows, and yet is fenced: B calls it. And a
/// twin that heard its primary a moment ago is promoted only with force.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_promoted_box_fences_its_restarted_predecessor() {
    let root = tempfile::tempdir().expect("tempdir");
    let a_listen = free_udp();
    let p = init_pair(root.path(), a_listen, a_listen);
    let (mut a, mut b) = p.streaming(5).await;
    a.kill();
    testkit::until("B heard A lately", WAIT, || {
        twinlog::node::predecessor::heard_primary(&p.b_dir)
    })
    .await;
    b.stop();
    let (b_listen, b_pmetrics) = (free_udp(), free_tcp());
    match daemon::failover::promote(&p.b_cfg, b_listen, b_pmetrics, Some(p.a_fp), false) {
        Err(e) => assert!(e.to_string().contains("--force"), "{e}"),
        Ok(p) => panic!("promoted within the quiet window: {p:?}"),
    }
    let promoted = daemon::failover::promote(&p.b_cfg, b_listen, b_pmetrics, Some(p.a_fp), true)
        .expect("forced");
    assert_eq!(promoted.epoch, T1);
    let mut b = Daemon::start("primary", &promoted.config, &p.logs.join("b.log"));
    testkit::until("B serves", WAIT, || pstatus(b_pmetrics)).await;
    let mut a = Daemon::start("primary", &p.a_cfg, &p.logs.join("a.log"));
    // A did not stop cleanly: it starts held for its twin's hello, then
    // B's call fences it by B's epoch.
    let s = testkit::until("B's call fenced A", WAIT, || {
        pstatus(p.a_metrics).filter(|s| s.fenced.as_ref().is_some_and(|f| !f.held))
    })
    .await;
    let f = s.fenced.expect("fenced");
    assert_eq!((f.epoch, f.held), (T1, false), "{f:?}");
    let c = p.a_client().await;
    match c.append(KIND, b"", b"late", Durability::Local).await {
        Err(ClientError::Api(ApiError::Fenced { newer: T1, .. })) => {}
        other => panic!("the restarted predecessor answered {other:?}"),
    }
    let bs = testkit::until("B shows A told", WAIT, || {
        pstatus(b_pmetrics).filter(|s| s.predecessor.as_ref().is_some_and(|p| p.told))
    })
    .await;
    assert!(bs.fenced.is_none());
    drop(c);
    a.stop();
    b.stop();
}
