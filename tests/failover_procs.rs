//! The failover cycle with the daemons as real processes: the primary A is
//! SIGKILLed under writers (twin appends, and local ones while its twin B is
//! frozen, so A holds a tail B never saw; B is then killed as it stands);
//! B is promoted with A as its twin
//! to be and served; A, restarted, is fenced and acknowledges nothing; A
//! rejoins B by truncate-to-fork and follows it; then `switchover` hands the
//! role back to A under a writer that follows the redirect.
//!
//! Checked: every frame acknowledged `twin` in any phase is on the final
//! primary byte for byte, and both logs are equal; the saved divergent
//! frames are exactly A's frames past the fork (against a copy of A's log
//! read before the rejoin, and against what its writers were told); the
//! rejoined twin received only the frames past the fork, no snapshot and
//! nothing like the whole log.
//!
//! The daemons are `twinlog-test-child daemon`, which runs the library entry
//! points of the `primary` and `twin` binaries and, as they do, serves the
//! new role in a new program image after a switchover. The offline commands
//! (`twin promote`, `primary rejoin`) and the admin requests (`fence`,
//! `switchover`) are the library calls those binaries make. Every wait is on
//! a daemon's `/status`, never a fixed sleep.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use twinlog::daemon::{self, PrimaryConfig, TwinConfig};
use twinlog::net::{Fingerprint, Identity};
use twinlog::node::api::ApiError;
use twinlog::node::{Client, ClientError, Durability};

#[path = "support/children.rs"]
mod children;
use children::{fast, pstatus, tstatus, Daemon};
use testkit::{free_tcp, free_udp};

/// The bound of every wait on state here: only a broken system reaches it.
const WAIT: Duration = Duration::from_secs(20);

const KIND: u16 = 0x8000;

/// The first epoch of term 1: what the first promotion takes.
const T1: u64 = 1 << twinlog::repl::epochs::LIFE_BITS;

/// A frame as the checks compare it.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Frame {
    kind: u16,
    meta: Vec<u8>,
    blob: Vec<u8>,
}

impl Frame {
    /// What the frame weighs in the replication stream: its 32-byte header,
    /// its meta, its blob.
    fn wire(&self) -> u64 {
        32 + self.meta.len() as u64 + self.blob.len() as u64
    }
}

fn frame(tag: &str, n: u64, len: usize) -> Frame {
    Frame {
        kind: KIND,
        meta: format!("{tag} {n}").into_bytes(),
        blob: (0..len).map(|i| (n as usize * 131 + i * 7) as u8).collect(),
    }
}

/// Every frame of a stopped box's log, opened as its daemon would open it
/// (a live tail would stop at the last frame whose index entry a SIGKILL
/// left unwritten; opening recovers it).
fn frames(dir: &Path) -> BTreeMap<u64, Frame> {
    let log =
        twinlog::log::Log::open_with(dir.join(daemon::LOG_DIR), 1 << 20).expect("open the log");
    (log.first_seq()..=log.head_seq())
        .map(|seq| {
            let e = log.read(seq).expect("read");
            (
                seq,
                Frame {
                    kind: e.kind,
                    meta: e.meta,
                    blob: e.blob,
                },
            )
        })
        .collect()
}

/// Appenders that follow the primary: a `Fenced` answer naming the new one
/// sends them there. Every acknowledgement is recorded with the frame.
struct Writers {
    acked: Arc<Mutex<Vec<(u64, Frame, Durability)>>>,
    stop: Arc<AtomicBool>,
    /// Held: no writer starts an append; `busy` counts those in flight.
    paused: Arc<AtomicBool>,
    busy: Arc<AtomicU64>,
    redirects: Arc<AtomicU64>,
    longest_ms: Arc<AtomicU64>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Writers {
    fn start(
        admin: Arc<Identity>,
        fp: Fingerprint,
        addr: SocketAddr,
        tag: &'static str,
        wants: &[Durability],
    ) -> Writers {
        let w = Writers {
            acked: Arc::default(),
            stop: Arc::default(),
            paused: Arc::default(),
            busy: Arc::default(),
            redirects: Arc::default(),
            longest_ms: Arc::default(),
            tasks: Vec::new(),
        };
        let tasks = wants
            .iter()
            .enumerate()
            .map(|(i, &want)| {
                let (admin, acked, stop) = (admin.clone(), w.acked.clone(), w.stop.clone());
                let (redirects, longest) = (w.redirects.clone(), w.longest_ms.clone());
                let (paused, busy) = (w.paused.clone(), w.busy.clone());
                tokio::spawn(async move {
                    let (mut fp, mut addr) = (fp, addr);
                    let mut client: Option<Client> = None;
                    let mut n = i as u64 * 1_000_000;
                    let mut since = Instant::now();
                    while !stop.load(Ordering::SeqCst) {
                        if client.is_none() {
                            // A port nobody listens on yet would hold a QUIC
                            // handshake until its first retransmission, ~1 s.
                            match tokio::time::timeout(
                                Duration::from_millis(200),
                                Client::connect(&admin, fp, addr),
                            )
                            .await
                            {
                                Ok(Ok(c)) => client = Some(c),
                                _ => tokio::time::sleep(Duration::from_millis(20)).await,
                            }
                            continue;
                        }
                        let Some(c) = client.as_ref() else { continue };
                        busy.fetch_add(1, Ordering::SeqCst);
                        if paused.load(Ordering::SeqCst) {
                            busy.fetch_sub(1, Ordering::SeqCst);
                            tokio::time::sleep(Duration::from_millis(5)).await;
                            continue;
                        }
                        n += 1;
                        let f = frame(tag, n, 100 + (n as usize * 97) % 2000);
                        let answer = tokio::time::timeout(
                            Duration::from_secs(2),
                            c.append(KIND, &f.meta, &f.blob, want),
                        )
                        .await;
                        busy.fetch_sub(1, Ordering::SeqCst);
                        match answer {
                            Ok(Ok((seq, got))) => {
                                acked.lock().expect("lock").push((seq, f, got));
                                let ms = since.elapsed().as_millis() as u64;
                                longest.fetch_max(ms, Ordering::SeqCst);
                                since = Instant::now();
                            }
                            Ok(Err(ClientError::Api(ApiError::Fenced {
                                primary: Some(np),
                                ..
                            }))) => {
                                fp = np.fingerprint.parse().expect("a fingerprint");
                                addr = np.addr.parse().expect("an address");
                                redirects.fetch_add(1, Ordering::SeqCst);
                                client = None;
                            }
                            // A primary gone mid-append, or one not taking
                            // writes: dial again.
                            _ => {
                                client = None;
                                tokio::time::sleep(Duration::from_millis(20)).await;
                            }
                        }
                    }
                })
            })
            .collect();
        Writers { tasks, ..w }
    }

    fn count(&self, want: Durability) -> usize {
        let acked = self.acked.lock().expect("lock");
        acked.iter().filter(|a| a.2 == want).count()
    }

    /// Until no append is in flight, and none starts until `resume`.
    async fn pause(&self) {
        self.paused.store(true, Ordering::SeqCst);
        testkit::until("the writers idle", WAIT, || {
            (self.busy.load(Ordering::SeqCst) == 0).then_some(())
        })
        .await;
    }

    fn resume(&self) {
        self.paused.store(false, Ordering::SeqCst);
    }

    async fn more(&self, n: usize, want: Durability, what: &str) {
        let at = self.count(want) + n;
        testkit::until(what, WAIT, || (self.count(want) >= at).then_some(())).await;
    }

    /// Stop at once: an append in flight was not acknowledged.
    fn abort(self) -> Vec<(u64, Frame, Durability)> {
        for t in &self.tasks {
            t.abort();
        }
        let acked = self.acked.lock().expect("lock").clone();
        acked
    }

    async fn halt(self) -> (Vec<(u64, Frame, Durability)>, u64, u64) {
        self.stop.store(true, Ordering::SeqCst);
        for t in self.tasks {
            let _ = tokio::time::timeout(Duration::from_secs(5), t).await;
        }
        let acked = self.acked.lock().expect("lock").clone();
        (
            acked,
            self.redirects.load(Ordering::SeqCst),
            self.longest_ms.load(Ordering::SeqCst),
        )
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_promote_rejoin_and_switch_back_with_real_processes() {
    let started = Instant::now();
    let root = tempfile::tempdir().expect("tempdir");
    let (a_dir, b_dir, logs) = (
        root.path().join("a"),
        root.path().join("b"),
        root.path().join("logs"),
    );
    std::fs::create_dir_all(&logs).expect("logs");
    let (a_listen, a_metrics, b_twin_metrics) = (free_udp(), free_tcp(), free_tcp());
    let (b_twin_cfg, b_fp) =
        daemon::init_twin(&b_dir, a_listen, b_twin_metrics, None).expect("twin init");
    let (a_cfg, a_fp) =
        daemon::init_primary(&a_dir, a_listen, a_metrics, Some(b_fp)).expect("primary init");
    daemon::pin_primary(&b_twin_cfg, a_fp).expect("pin");
    fast(&a_cfg, false);
    fast(&b_twin_cfg, true);
    let a_admin = Arc::new(daemon::load_identity(&a_dir.join(daemon::ADMIN_DIR)).expect("admin"));

    // A with its twin B; 8 MiB of frames on both, so that a rejoin copying
    // the log would show.
    let mut a = Daemon::start("primary", &a_cfg, &logs.join("a.log"));
    let mut b = Daemon::start("twin", &b_twin_cfg, &logs.join("b.log"));
    testkit::until("B follows A", WAIT, || {
        tstatus(b_twin_metrics).filter(|s| s.connected)
    })
    .await;
    let mut twin_acked: Vec<(u64, Frame)> = Vec::new();
    {
        let c = Client::connect(&a_admin, a_fp, a_listen)
            .await
            .expect("client");
        for n in 0..128 {
            let f = frame("preload", n, 64 << 10);
            let (seq, d) = c
                .append(KIND, &f.meta, &f.blob, Durability::Twin)
                .await
                .expect("preload");
            assert_eq!(d, Durability::Twin);
            twin_acked.push((seq, f));
        }
    }

    // Writers on A; B frozen, so A's local appends past B's head are the
    // divergent tail; then A is SIGKILLed with the writers running.
    let w1 = Writers::start(
        a_admin.clone(),
        a_fp,
        a_listen,
        "one",
        &[Durability::Twin, Durability::Twin, Durability::Local],
    );
    w1.more(30, Durability::Twin, "twin appends on A").await;
    b.signal(libc::SIGSTOP);
    let frozen_at = testkit::until("A's status", WAIT, || pstatus(a_metrics))
        .await
        .twin_acked;
    testkit::until("a local tail on A past B's head", WAIT, || {
        pstatus(a_metrics).filter(|s| s.head >= frozen_at + 40)
    })
    .await;
    a.kill();
    let w1_acked = w1.abort();
    // B dies frozen: datagrams A sent it are still in its socket buffer, and
    // a thawed B would take them and leave A no tail of its own.
    b.kill();
    let a_before = frames(&a_dir);
    let a_head = *a_before.keys().last().expect("A holds frames");
    for (seq, f, d) in &w1_acked {
        if *d == Durability::Twin {
            twin_acked.push((*seq, f.clone()));
        }
    }

    // B promoted, with A as its twin to be, and served.
    let (b_listen, b_metrics) = (free_udp(), free_tcp());
    let promoted = daemon::failover::promote(&b_twin_cfg, b_listen, b_metrics, Some(a_fp), true)
        .expect("twin promote");
    let fork = promoted.head;
    assert_eq!(promoted.epoch, T1);
    assert!(
        fork < a_head,
        "A holds frames past B's head ({a_head} > {fork})"
    );
    let b_cfg = PrimaryConfig::load(&promoted.config).expect("B's primary.toml");
    let mut b = Daemon::start("primary", &promoted.config, &logs.join("b.log"));
    testkit::until("B serves", WAIT, || pstatus(b_metrics)).await;
    let b_admin = Arc::new(daemon::load_identity(&b_dir.join(daemon::ADMIN_DIR)).expect("admin"));
    let w2 = Writers::start(
        b_admin.clone(),
        promoted.fingerprint,
        b_listen,
        "two",
        &[Durability::Twin, Durability::Local],
    );
    w2.more(20, Durability::Local, "local appends on B").await;

    // A restarted as a primary: B calls it until it is heard, and A,
    // fenced by B's epoch, acknowledges nothing.
    let mut a = Daemon::start("primary", &a_cfg, &logs.join("a.log"));
    testkit::until("B's epoch fenced A", WAIT, || {
        pstatus(a_metrics).filter(|s| s.fenced.as_ref().is_some_and(|f| f.epoch == T1))
    })
    .await;
    {
        let c = Client::connect(&a_admin, a_fp, a_listen)
            .await
            .expect("client");
        for d in [Durability::Local, Durability::Twin] {
            match c.append(KIND, b"late", b"late", d).await {
                Err(ClientError::Api(ApiError::Fenced { seq: None, .. })) => {}
                other => panic!("the fenced A answered {other:?}"),
            }
        }
        let s = pstatus(a_metrics).expect("status");
        assert!(
            s.fenced.is_some() && s.head == a_head,
            "A head {a_head}: {s:?}"
        );
    }
    a.stop();

    // A rejoins B: its frames past the fork saved, exactly, then cut.
    let report = daemon::failover::rejoin(
        &a_cfg,
        b_listen.into(),
        promoted.fingerprint,
        None,
        Duration::from_secs(10),
    )
    .await
    .expect("primary rejoin");
    let r = &report.rejoined;
    assert_eq!((r.old_head, r.fork, r.epoch), (a_head, fork, T1));
    assert!(!r.needs_snapshot);
    let (saved, _) = r.saved.as_ref().expect("a saved tail");
    assert_eq!((saved.first, saved.last), (fork + 1, a_head));
    let mut on_disk = BTreeMap::new();
    for t in twinlog::node::divergent::list(&a_dir).expect("list") {
        let path = a_dir
            .join(twinlog::node::divergent::DIVERGENT_DIR)
            .join(&t.file);
        twinlog::node::divergent::read(
            &path,
            |_| true,
            |f, meta, blob| {
                let kept = Frame {
                    kind: f.kind,
                    meta: meta.to_vec(),
                    blob: blob.to_vec(),
                };
                assert!(
                    on_disk.insert(f.seq, kept).is_none(),
                    "frame {} twice",
                    f.seq
                );
                Ok(())
            },
        )
        .expect("read the saved tail");
    }
    let past_fork: BTreeMap<u64, Frame> = a_before
        .range(fork + 1..)
        .map(|(s, f)| (*s, f.clone()))
        .collect();
    assert!(
        on_disk == past_fork,
        "the saved frames are not A's frames past the fork"
    );
    let told_local_past_fork = w1_acked
        .iter()
        .filter(|(seq, _, d)| *d == Durability::Local && *seq > fork)
        .count();
    for (seq, f, d) in &w1_acked {
        if *seq > fork {
            assert_eq!(
                *d,
                Durability::Local,
                "frame {seq} past the fork acknowledged {d:?}"
            );
            assert_eq!(
                on_disk.get(seq),
                Some(f),
                "acknowledged local frame {seq} not saved as written"
            );
        }
    }
    assert!(
        told_local_past_fork > 0,
        "no local acknowledgement past the fork"
    );
    let a_cut = frames(&a_dir);
    assert!(
        a_cut.keys().last() == Some(&fork) && a_cut.iter().all(|(s, f)| a_before.get(s) == Some(f)),
        "A's log is its old log cut at the fork"
    );
    let prefix_bytes: u64 = a_cut.values().map(Frame::wire).sum();

    // A follows B: it receives the frames past the fork, no more.
    let a_twin = TwinConfig::load(&report.twin_config).expect("A's twin.toml");
    let a_twin_metrics = a_twin.metrics.resolve().expect("metrics address");
    let mut a = Daemon::start("twin", &report.twin_config, &logs.join("a.log"));
    // The writers paused, B's head stands still: a status of A's then
    // counts no frame in flight (B ships a group before its own sync, so
    // under load A may hold bytes past B's durable head).
    w2.pause().await;
    let b_head_then = testkit::until("B's head", WAIT, || pstatus(b_metrics))
        .await
        .head;
    let caught_up = testkit::until("A catches up with B", WAIT, || {
        tstatus(a_twin_metrics).filter(|s| s.connected && s.head >= b_head_then)
    })
    .await;
    let b_head_after = testkit::until("B's head", WAIT, || pstatus(b_metrics))
        .await
        .head;
    w2.resume();
    w2.more(10, Durability::Twin, "twin appends on B with A as its twin")
        .await;

    // Switch back to A under the writers, which follow the redirect.
    let switched = Instant::now();
    let b_client = daemon::load::admin_client(&b_cfg)
        .await
        .expect("admin client");
    let (epoch, handed_at, np) = b_client
        .switchover(Duration::from_secs(5))
        .await
        .expect("switchover");
    drop(b_client);
    assert_eq!(
        (epoch, np.addr.as_str()),
        (2 * T1, a_listen.to_string().as_str())
    );
    testkit::until("A serves as the primary of epoch 2.0", WAIT, || {
        pstatus(a_metrics).filter(|s| s.role == "primary" && s.epoch == 2 * T1)
    })
    .await;
    testkit::until("B follows A", WAIT, || {
        tstatus(b_metrics).filter(|s| s.connected && s.epoch == 2 * T1)
    })
    .await;
    // The deposed B follows at once: it once waited out QUIC's 10 s idle
    // timeout on a connection no peer closed, and A's `twin` appends with
    // it.
    assert!(
        switched.elapsed() < Duration::from_secs(5),
        "B followed A {:?} after the switchover began",
        switched.elapsed()
    );
    w2.more(
        20,
        Durability::Twin,
        "twin appends on A after the switchover",
    )
    .await;
    let (w2_acked, redirects, longest_ms) = w2.halt().await;
    assert!(redirects > 0, "the writers were never redirected");
    let a_head_final = testkit::until("A's status", WAIT, || pstatus(a_metrics))
        .await
        .head;
    testkit::until("B holds A's head", WAIT, || {
        tstatus(b_metrics).filter(|s| s.head >= a_head_final)
    })
    .await;
    // A primary promoted in place stops at once: its shutdown once waited
    // out QUIC's 10 s idle timeout on a connection no peer closed, which
    // after a further switchover held the new primary's `twin` appends as
    // long.
    let stopping = Instant::now();
    a.stop();
    assert!(
        stopping.elapsed() < Duration::from_secs(5),
        "A took {:?} to stop",
        stopping.elapsed()
    );
    b.stop();

    // Every twin acknowledgement is on the final primary, byte for byte.
    for (seq, f, d) in &w2_acked {
        if *d == Durability::Twin {
            twin_acked.push((*seq, f.clone()));
        }
    }
    let (on_a, on_b) = (frames(&a_dir), frames(&b_dir));
    assert!(on_a == on_b, "both boxes hold the same frames");
    for (seq, f) in &twin_acked {
        assert_eq!(on_a.get(seq), Some(f), "twin-acknowledged frame {seq}");
    }
    assert!(handed_at >= b_head_after);

    // The rejoin moved the frames past the fork and nothing more.
    let moved_lower: u64 = on_a
        .range(fork + 1..=caught_up.head)
        .map(|(_, f)| f.wire())
        .sum();
    let moved_upper: u64 = on_a
        .range(fork + 1..=b_head_after)
        .map(|(_, f)| f.wire())
        .sum();
    assert_eq!(caught_up.snapshots_installed, 0, "{caught_up:?}");
    assert!(
        caught_up.frame_bytes_received >= moved_lower
            && caught_up.frame_bytes_received <= moved_upper,
        "frame bytes received {} outside {moved_lower}..={moved_upper}",
        caught_up.frame_bytes_received
    );
    assert!(
        caught_up.received_bytes <= moved_upper * 3 / 2 + (64 << 10),
        "the rejoined twin received {} bytes for {moved_upper} bytes of frames past the fork",
        caught_up.received_bytes
    );
    assert!(
        caught_up.received_bytes < prefix_bytes,
        "the rejoined twin received {} bytes; the log up to the fork is {prefix_bytes}",
        caught_up.received_bytes
    );
    eprintln!(
        "fork {fork}, A's tail {}..={a_head} saved ({} acknowledged local); rejoin received {} B ({} B of frames, {moved_lower}..={moved_upper} due; log to the fork {prefix_bytes} B); switchover at {handed_at}, {redirects} redirects, longest append wait {longest_ms} ms; {} twin acknowledgements checked in {:?}",
        fork + 1,
        told_local_past_fork,
        caught_up.received_bytes,
        caught_up.frame_bytes_received,
        twin_acked.len(),
        started.elapsed()
    );
}
