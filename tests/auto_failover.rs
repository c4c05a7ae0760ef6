//! Automatic failover with real processes and a real etcd (Debian's
//! `etcd-server` on loopback, `testkit::etcd`): the primary A and its
//! twin B run as `twinlog-test-child daemon` under a `[failover]` section,
//! which serves a new role in a new program image as the shipped binaries
//! do. Every wait is on a daemon's `/status` or on etcd, never a fixed
//! sleep.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use twinlog::daemon::{self, PrimaryConfig, TwinConfig};
use twinlog::net::{Fingerprint, Identity};
use twinlog::node::api::ApiError;
use twinlog::node::failover::last::FailoverCause;
use twinlog::node::{Client, ClientError, Durability};

#[path = "support/children.rs"]
mod children;
use children::{fast, pstatus, tstatus, Daemon};
use testkit::etcd::Etcd;
use testkit::{free_tcp, free_udp};

const WAIT: Duration = Duration::from_secs(30);
const KIND: u16 = 0x8000;
/// The lease's time to live in these tests: etcd's least.
const TTL_S: u64 = 2;

/// Until the future `cond` makes gives a value, tried every 20 ms;
/// panics naming `what` after [`WAIT`].
async fn until_async<T, F: std::future::Future<Output = Option<T>>>(
    what: &str,
    mut cond: impl FnMut() -> F,
) -> T {
    let by = Instant::now() + WAIT;
    loop {
        if let Some(v) = cond().await {
            return v;
        }
        assert!(Instant::now() < by, "still not {what} after {WAIT:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn blob(n: u64) -> Vec<u8> {
    format!("frame {n} ").repeat(8).into_bytes()
}

/// A pair under one etcd: A the primary, B its twin, both with
/// `[failover]`; the daemons are not started.
struct Pair {
    root: tempfile::TempDir,
    etcd: Etcd,
    a_cfg: PathBuf,
    b_cfg: PathBuf,
    a_metrics: SocketAddr,
    b_metrics: SocketAddr,
    a_listen: SocketAddr,
    b_listen: SocketAddr,
    b_fp: Fingerprint,
    a_fp: Fingerprint,
    admin: Identity,
    /// With `Pair::cuttable`: A's link to etcd, and B's to A.
    a_to_etcd: Option<testkit::proxy::Proxy>,
    b_to_a: Option<testkit::proxy::Proxy>,
}

impl Pair {
    fn new(policy: daemon::config::Policy) -> Pair {
        Pair::with_ttl(policy, TTL_S)
    }

    fn with_ttl(policy: daemon::config::Policy, ttl_s: u64) -> Pair {
        let root = tempfile::tempdir().expect("tempdir");
        let etcd = Etcd::start(&root.path().join("etcd")).expect("etcd starts");
        let url = etcd.endpoint();
        let a_listen = free_udp();
        Pair::with(root, policy, etcd, url, a_listen, a_listen, ttl_s)
    }

    /// A pair whose primary A reaches etcd, and whose twin B reaches A,
    /// through relays the test can cut.
    async fn cuttable(policy: daemon::config::Policy) -> Pair {
        let root = tempfile::tempdir().expect("tempdir");
        let etcd = Etcd::start(&root.path().join("etcd")).expect("etcd starts");
        let a_to_etcd = testkit::proxy::tcp(etcd.client_addr())
            .await
            .expect("relay");
        let a_listen = free_udp();
        let b_to_a = testkit::proxy::udp(a_listen).await.expect("relay");
        let url = format!("http://{}", a_to_etcd.addr);
        let mut pair = Pair::with(root, policy, etcd, url, a_listen, b_to_a.addr, TTL_S);
        pair.a_to_etcd = Some(a_to_etcd);
        pair.b_to_a = Some(b_to_a);
        pair
    }

    /// `a_etcd`: where A reaches etcd; `b_sees_a`: where B reaches A.
    fn with(
        root: tempfile::TempDir,
        policy: daemon::config::Policy,
        etcd: Etcd,
        a_etcd: String,
        a_listen: SocketAddr,
        b_sees_a: SocketAddr,
        ttl_s: u64,
    ) -> Pair {
        let (a_dir, b_dir) = (root.path().join("a"), root.path().join("b"));
        let b_listen = free_udp();
        let (a_metrics, b_metrics) = (free_tcp(), free_tcp());
        let (b_cfg, b_fp) =
            daemon::init_twin(&b_dir, b_sees_a, b_metrics, None).expect("twin init");
        let (a_cfg, a_fp) =
            daemon::init_primary(&a_dir, a_listen, a_metrics, Some(b_fp)).expect("primary init");
        daemon::pin_primary(&b_cfg, a_fp).expect("pin");
        fast(&a_cfg, false);
        fast(&b_cfg, true);
        let failover = daemon::config::FailoverSection {
            etcd: vec![etcd.endpoint()],
            cluster: "pair-1".into(),
            lease_ttl_s: ttl_s,
            auto_rejoin: true,
            advertise: None,
        };
        let mut a = PrimaryConfig::load(&a_cfg).expect("load");
        a.failover = Some(daemon::config::FailoverSection {
            etcd: vec![a_etcd],
            ..failover.clone()
        });
        a.durability = daemon::config::DurabilitySection {
            policy,
            timeout_ms: 300,
        };
        std::fs::write(&a_cfg, a.render()).expect("write");
        let mut b = TwinConfig::load(&b_cfg).expect("load");
        b.failover = Some(failover);
        b.listen_as_primary = b_listen.into();
        b.as_primary.durability = a.durability.clone();
        std::fs::write(&b_cfg, b.render()).expect("write");
        let admin = daemon::load_identity(&a_dir.join(daemon::ADMIN_DIR)).expect("admin");
        Pair {
            root,
            etcd,
            a_cfg,
            b_cfg,
            a_metrics,
            b_metrics,
            a_listen,
            b_listen,
            b_fp,
            a_fp,
            admin,
            a_to_etcd: None,
            b_to_a: None,
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

    async fn client(&self, fp: Fingerprint, addr: SocketAddr) -> Client {
        // A first packet to a port nobody listens on yet is sent again
        // only after QUIC's initial timeout: try again sooner.
        until_async("a client connects", || async {
            tokio::time::timeout(
                Duration::from_millis(200),
                Client::connect(&self.admin, fp, addr),
            )
            .await
            .ok()
            .and_then(|c| c.ok())
        })
        .await
    }

    /// A holds its lease and the arbiter records B in sync.
    async fn in_sync(&self) {
        testkit::until("A holds its lease, B recorded in sync", WAIT, || {
            pstatus(self.a_metrics)
                .and_then(|s| s.arbiter)
                .filter(|a| a.lease.held && a.twin_in_sync)
        })
        .await;
    }

    fn logs(&self) -> String {
        ["a", "b"]
            .iter()
            .map(|n| {
                let text = std::fs::read_to_string(self.log(n)).unwrap_or_default();
                let tail: Vec<&str> = text.lines().rev().take(30).collect();
                format!(
                    "--- {n} ---\n{}",
                    tail.into_iter().rev().collect::<Vec<_>>().join("\n")
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// Until the box named `name` holds its lease (and, with `in_sync`, the
/// arbiter records its twin in sync).
async fn leads(name: &str, metrics: SocketAddr, in_sync: bool) {
    let what = format!(
        "{name} holds its lease{}",
        if in_sync { ", its twin in sync" } else { "" }
    );
    testkit::until(&what, WAIT, || {
        pstatus(metrics)
            .and_then(|s| s.arbiter)
            .filter(|a| a.lease.held && (a.twin_in_sync || !in_sync))
    })
    .await;
}

/// Append `n` frames `twin` from `first`, each answered `twin`.
async fn append_twin(c: &Client, first: u64, n: u64) -> Vec<(u64, Vec<u8>)> {
    let mut out = Vec::new();
    for i in first..first + n {
        let (seq, d) = c
            .append(KIND, b"", &blob(i), Durability::Twin)
            .await
            .expect("a twin append");
        assert_eq!(d, Durability::Twin);
        out.push((seq, blob(i)));
    }
    out
}

async fn holds(c: &Client, acked: &[(u64, Vec<u8>)]) {
    for (seq, b) in acked {
        let e = c.read(*seq).await.expect("an acknowledged frame is there");
        assert_eq!(&e.blob, b, "frame {seq}");
    }
}

/// Kill the primary: the twin takes the next term and serves once the
/// lease ended, holding every frame acknowledged `twin`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_primary_is_replaced_by_its_twin_and_loses_no_twin_ack() {
    let pair = Pair::new(daemon::config::Policy::Wait);
    let mut a = pair.start_a();
    let _b = pair.start_b();
    pair.in_sync().await;
    let c = pair.client(pair.a_fp, pair.a_listen).await;
    let acked = append_twin(&c, 0, 40).await;
    drop(c);

    a.kill();
    let killed = Instant::now();
    let c = pair.client(pair.b_fp, pair.b_listen).await;
    let served = until_async("B acknowledges a write as the primary", || async {
        match c.append(KIND, b"", b"first", Durability::Local).await {
            Ok((seq, _)) => Some((seq, killed.elapsed())),
            Err(_) => None,
        }
    })
    .await;
    let (first_seq, took) = served;
    // The target (the TTL and a second) is the benchmark's,
    // `auto_failover_ms`, on a quiet machine; here, on a shared one, the
    // bound only says the lease's end, not a person, made B the primary.
    assert!(
        took <= Duration::from_secs(2 * TTL_S + 2),
        "B served {took:?} after the kill (TTL {TTL_S} s)"
    );
    assert!(first_seq > acked.last().map_or(0, |a| a.0));
    holds(&c, &acked).await;
    let s = pstatus(pair.b_metrics).expect("B's status");
    let last = s
        .last_failover
        .clone()
        .expect("B shows the failover it went through");
    assert_eq!(last.cause, FailoverCause::LeaseEnded);
    assert_eq!(last.epoch, s.epoch);
    assert!(
        Duration::from_millis(last.took_ms) <= took,
        "{last:?}: longer than from the kill to B's first answer ({took:?})"
    );
    let arb = s.arbiter.expect("B runs under the arbiter");
    assert!(arb.lease.held, "{arb:?}");
    eprintln!("served {took:?} after the kill; B's status: {last:?}");
}

/// A switchover under the arbiter hands the lease over: the old primary,
/// fenced by the handover, ends its lease, so the new primary takes the
/// leader key at once, not a TTL later (10 s here), and the old one
/// follows it as its twin.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_switchover_hands_the_lease_over() {
    let ttl = Duration::from_secs(10);
    let pair = Pair::with_ttl(daemon::config::Policy::Wait, ttl.as_secs());
    let _a = pair.start_a();
    let _b = pair.start_b();
    pair.in_sync().await;
    let ca = pair.client(pair.a_fp, pair.a_listen).await;
    let acked = append_twin(&ca, 0, 10).await;

    let started = Instant::now();
    let (_, _, np) = ca
        .switchover(Duration::from_secs(10))
        .await
        .expect("the switchover");
    assert_eq!(np.fingerprint, pair.b_fp.to_string());
    let cb = pair.client(pair.b_fp, pair.b_listen).await;
    let took = until_async("B acknowledges `twin`, A following it", || async {
        match cb.append(KIND, b"", b"after", Durability::Twin).await {
            Ok((_, Durability::Twin)) => Some(started.elapsed()),
            _ => None,
        }
    })
    .await;
    assert!(
        took < ttl / 2,
        "B served {took:?} after the switchover began: it waited for A's lease to run out"
    );
    holds(&cb, &acked).await;
    let arb = pstatus(pair.b_metrics)
        .and_then(|s| s.arbiter)
        .expect("B runs under the arbiter");
    assert!(arb.lease.held, "{arb:?}");
}

/// Not in sync when the lease ends (the twin was frozen while appends
/// fell back to local): nothing is promoted, and the twin says why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_twin_out_of_sync_when_the_lease_ends_is_not_promoted() {
    let pair = Pair::new(daemon::config::Policy::Fallback);
    let mut a = pair.start_a();
    let b = pair.start_b();
    pair.in_sync().await;
    let c = pair.client(pair.a_fp, pair.a_listen).await;
    for i in 0..5 {
        c.append(KIND, b"", &blob(i), Durability::Twin)
            .await
            .expect("appended");
    }
    testkit::until("B sees A lead", WAIT, || {
        tstatus(pair.b_metrics)
            .and_then(|s| s.arbiter)
            .and_then(|a| a.leader)
    })
    .await;

    b.signal(libc::SIGSTOP);
    testkit::until("B stopped", WAIT, || b.stopped().then_some(())).await;
    let (_, d) = c
        .append(KIND, b"", b"while B is away", Durability::Twin)
        .await
        .expect("answered under fallback");
    assert_eq!(d, Durability::Local);
    let arb = pstatus(pair.a_metrics)
        .and_then(|s| s.arbiter)
        .expect("A's arbiter status");
    assert!(!arb.twin_in_sync, "recorded out of sync before the answer");
    drop(c);

    a.kill();
    b.signal(libc::SIGCONT);
    let why = testkit::until("B says why it may not take over", WAIT, || {
        tstatus(pair.b_metrics)
            .and_then(|s| s.arbiter)
            .and_then(|a| a.not_eligible)
            .filter(|w| w.contains("did not record this twin in sync"))
    })
    .await;
    assert!(why.contains("acknowledged `twin` may be missing"), "{why}");
    let s = tstatus(pair.b_metrics).expect("B is still the twin");
    assert_eq!(s.role, "twin");
}

/// The arbiter down: nothing promotes; the primary acknowledges while
/// its lease holds, then refuses every write by name (`NoLease`), and
/// that is no later than the lease's time to live after etcd stopped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_etcd_down_the_primary_stops_acknowledging_within_the_ttl() {
    let pair = Pair::new(daemon::config::Policy::Wait);
    let _a = pair.start_a();
    let _b = pair.start_b();
    pair.in_sync().await;
    let c = pair.client(pair.a_fp, pair.a_listen).await;
    append_twin(&c, 0, 3).await;

    pair.etcd.pause().expect("etcd paused");
    let paused = Instant::now();
    let mut last_ack = None;
    let refused = loop {
        match c.append(KIND, b"", b"etcd down", Durability::Twin).await {
            Ok(_) => last_ack = Some(paused.elapsed()),
            Err(ClientError::Api(e @ ApiError::NoLease { .. })) => break e,
            Err(e) => panic!("refused otherwise: {e}"),
        }
        assert!(
            paused.elapsed() < WAIT,
            "still acknowledging {:?} after etcd stopped",
            paused.elapsed()
        );
    };
    let last = last_ack.unwrap_or_default();
    assert!(
        last < Duration::from_secs(TTL_S),
        "acknowledged {last:?} after etcd stopped, past the TTL"
    );
    assert!(refused.to_string().contains("lease"), "{refused}");
    let s = tstatus(pair.b_metrics).expect("B's status");
    assert_eq!(s.role, "twin", "nothing promoted while etcd is down");
    pair.etcd.resume().expect("etcd resumed");
}

/// Cut the primary off from etcd and from its twin: it fences itself
/// (refuses by name) before the new primary's first acknowledgement, on
/// the test's one clock; once the links mend, it learns its lease is
/// gone and rejoins the new primary as its twin.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_primary_cut_off_fences_itself_before_the_new_primary_acknowledges() {
    let pair = Pair::cuttable(daemon::config::Policy::Wait).await;
    let _a = pair.start_a();
    let _b = pair.start_b();
    pair.in_sync().await;
    let ca = pair.client(pair.a_fp, pair.a_listen).await;
    let acked = append_twin(&ca, 0, 10).await;

    // A writer on A (its own link stays up), `local` so no wait on the
    // cut twin: every acknowledgement's arrival, on this clock.
    // It ends at A's refusal, or when told: a primary that does not fence
    // itself (the negative control) would keep it going for ever.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let told = stop.clone();
    let writer = tokio::spawn(async move {
        let mut arrivals = Vec::new();
        while !told.load(std::sync::atomic::Ordering::SeqCst) {
            match ca.append(KIND, b"", b"cut off", Durability::Local).await {
                Ok((seq, _)) => arrivals.push((seq, Instant::now())),
                Err(ClientError::Api(ApiError::NoLease { .. })) => {
                    return (arrivals, Instant::now())
                }
                Err(e) => panic!("A refused otherwise: {e}"),
            }
        }
        (arrivals, Instant::now())
    });
    let (to_etcd, to_a) = (
        pair.a_to_etcd.clone().expect("relay"),
        pair.b_to_a.clone().expect("relay"),
    );
    to_etcd.cut(true);
    to_a.cut(true);
    let cut = Instant::now();

    let cb = pair.client(pair.b_fp, pair.b_listen).await;
    let (first_b, b_acked_at) = until_async("B acknowledges as the primary", || async {
        cb.append(KIND, b"", b"new primary", Durability::Local)
            .await
            .ok()
            .map(|(seq, _)| (seq, Instant::now()))
    })
    .await;
    // A fenced itself before B's first answer, so its writer has ended
    // or ends at its next answer; else it is stopped a moment later, and
    // its acknowledgements after B's first say so below.
    let mut writer = writer;
    let ended = tokio::time::timeout(Duration::from_secs(1), &mut writer).await;
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let (a_acks, a_fenced_at) = match ended {
        Ok(done) => done,
        Err(_) => writer.await,
    }
    .expect("the writer on A");
    let a_last = a_acks.last().map(|(_, at)| *at).unwrap_or(cut);
    assert!(
        a_last < b_acked_at,
        "A acknowledged at {:?}, B first at {:?} (from the cut)",
        a_last - cut,
        b_acked_at - cut
    );
    assert!(a_fenced_at <= b_acked_at + Duration::from_millis(50) || a_last < b_acked_at);
    eprintln!(
        "A's last ack {:?} after the cut, B's first {:?}: a margin of {:?}",
        a_last - cut,
        b_acked_at - cut,
        b_acked_at - a_last
    );
    assert!(first_b > acked.last().map_or(0, |a| a.0));
    holds(&cb, &acked).await;

    // Mended: A finds its lease gone and rejoins B as its twin.
    to_etcd.cut(false);
    to_a.cut(false);
    testkit::until("A follows B as its twin", WAIT, || {
        tstatus(pair.a_metrics).filter(|s| s.connected)
    })
    .await;
    append_twin(&cb, 100, 3).await;
}

impl Drop for Pair {
    /// A failed test shows what the daemons said.
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("{}", self.logs());
        }
    }
}

/// A client retrying across a failover writes each append once and loses
/// no acknowledged frame. First by hand: an append whose answer was lost
/// on A, sent again to B once B took over, is answered with the frame A
/// shipped, not written twice. Then under load: following clients (they
/// find the primary in etcd and send each append once) go through a
/// second failover, and the log holds every acknowledged frame, each once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_retrying_across_a_failover_writes_each_append_once_and_loses_no_ack() {
    use twinlog::node::api::{AppendOnce, Request};
    use twinlog::node::arbiter::{Arbiter, ArbiterOptions};
    use twinlog::node::{FollowOptions, Following};

    let pair = Pair::new(daemon::config::Policy::Wait);
    let mut a = pair.start_a();
    let mut b = pair.start_b();
    pair.in_sync().await;

    let ca = pair.client(pair.a_fp, pair.a_listen).await;
    let head = ca.status().await.expect("A's status").head;
    let once = AppendOnce {
        client: [7; 16],
        seq: 1,
        after: head,
    };
    let req = || Request::Append {
        kind: KIND,
        meta: b"m".to_vec(),
        blob_len: 9,
        durability: Durability::Twin,
        once: Some(once),
    };
    let first = ca.append_with(req(), b"only once").await.expect("appended");
    let again = ca
        .append_with(req(), b"only once")
        .await
        .expect("sent again");
    assert_eq!(again.seq, first.seq, "sent again to the same primary");
    assert_eq!(ca.status().await.expect("status").head, first.seq);
    drop(ca);
    a.kill();
    // B takes over; A comes back as its twin, so that a `twin` append
    // can be answered again.
    leads("B", pair.b_metrics, false).await;
    let _a = pair.start_a();
    leads("B", pair.b_metrics, true).await;
    let cb = pair.client(pair.b_fp, pair.b_listen).await;
    let retried = cb
        .append_with(req(), b"only once")
        .await
        .expect("B answers the retry");
    assert_eq!(
        retried.seq, first.seq,
        "the retry on the new primary is answered with the frame the old one shipped"
    );
    assert_eq!(retried.durability, Durability::Twin);
    let e = cb.read(first.seq).await.expect("the frame");
    assert_eq!(
        (e.kind, &e.meta[..], &e.blob[..]),
        (KIND, &b"m"[..], &b"only once"[..])
    );

    let arbiter = Arbiter::connect(ArbiterOptions {
        endpoints: vec![pair.etcd.endpoint()],
        cluster: "pair-1".into(),
        ttl: Duration::from_secs(TTL_S),
        advertise: String::new(),
    })
    .await
    .expect("etcd");
    let admin =
        daemon::load_identity(&pair.root.path().join("a").join(daemon::ADMIN_DIR)).expect("admin");
    let following = std::sync::Arc::new(
        Following::new(
            std::sync::Arc::new(admin),
            None,
            Some(std::sync::Arc::new(arbiter)),
            FollowOptions::default(),
        )
        .expect("a following client"),
    );
    const WRITERS: u64 = 4;
    const EACH: u64 = 40;
    let acked = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let writers: Vec<_> = (0..WRITERS)
        .map(|w| {
            let (f, acked) = (following.clone(), acked.clone());
            tokio::spawn(async move {
                for i in 0..EACH {
                    let blob = format!("writer {w} append {i}").into_bytes();
                    let got = f
                        .append(KIND, b"", &blob, Durability::Twin)
                        .await
                        .unwrap_or_else(|e| panic!("writer {w} append {i}: {e}"));
                    assert_eq!(got.durability, Durability::Twin);
                    acked.lock().expect("lock").push((got.seq, blob));
                }
            })
        })
        .collect();
    testkit::until("a third of the appends acknowledged", WAIT, || {
        (acked.lock().expect("lock").len() as u64 >= WRITERS * EACH / 3).then_some(())
    })
    .await;
    b.kill();
    // A takes over; B comes back as its twin, so that the writers'
    // `twin` appends, waiting or sent again meanwhile, are answered.
    leads("A", pair.a_metrics, false).await;
    // B was promoted: it starts from the primary's configuration it wrote,
    // finds the newer term and rejoins.
    let b_promoted = pair.b_cfg.with_file_name(daemon::PRIMARY_CONFIG);
    let _b = Daemon::start("primary", &b_promoted, &pair.log("b2"));
    for w in writers {
        w.await.expect("a writer");
    }
    assert!(following.moves() >= 1, "the client moved to A");

    let c = pair.client(pair.a_fp, pair.a_listen).await;
    let head = c.status().await.expect("A's status").head;
    let mut copies = std::collections::HashMap::new();
    for seq in 1..=head {
        let e = c.read(seq).await.expect("a frame");
        *copies.entry(e.blob).or_insert(0u32) += 1;
    }
    let acked = acked.lock().expect("lock").clone();
    assert_eq!(acked.len() as u64, WRITERS * EACH);
    for (seq, blob) in &acked {
        assert_eq!(
            copies.get(blob),
            Some(&1),
            "frame {seq}: {:?}",
            String::from_utf8_lossy(blob)
        );
        let e = c.read(*seq).await.expect("an acknowledged frame");
        assert_eq!(&e.blob, blob, "frame {seq}");
    }
    let twice: Vec<_> = copies.iter().filter(|(_, &n)| n > 1).collect();
    assert!(twice.is_empty(), "written twice: {twice:?}");
    eprintln!(
        "{} appends through {} moves; the log holds each once",
        acked.len(),
        following.moves()
    );
}
