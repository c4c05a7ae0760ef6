//! The failover cycle with the shipped daemons on loopback: a promoted twin
//! works at once, the deposed primary is fenced, and it rejoins the new
//! primary by truncate-to-fork, its divergent frames saved first and the
//! rest of its log kept.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use twinlog::daemon::{self, DaemonError, PrimaryConfig, Served, TwinConfig};
use twinlog::node::api::ApiError;
use twinlog::node::rejoin::StoreFate;
use twinlog::node::{ClientError, Durability, Status, TwinStatus};

use testkit::{free_tcp, free_udp};

/// The bound of every wait on state here: only a broken system reaches it.
const WAIT: Duration = Duration::from_secs(20);

/// The status a daemon serves on `metrics`, when it answers.
fn status<T: serde::de::DeserializeOwned>(metrics: &daemon::Address) -> Option<T> {
    daemon::fetch_status::<T>(metrics).ok().map(|(_, s)| s)
}

/// The first epoch of term 1: what the first promotion takes.
const T1: u64 = 1 << twinlog::repl::epochs::LIFE_BITS;

struct Running {
    stop: watch::Sender<bool>,
    task: JoinHandle<Result<Served, DaemonError>>,
}

impl Running {
    async fn stop(self) {
        let _ = self.stop.send(true);
        let served = self.task.await.expect("join").expect("stopped cleanly");
        assert_eq!(served, Served::Stopped);
    }

    /// The run ended by itself (a switchover changed the role).
    async fn ended(self) -> Served {
        tokio::time::timeout(Duration::from_secs(20), self.task)
            .await
            .expect("the daemon ended")
            .expect("join")
            .expect("served")
    }
}

fn primary(cfg: &PrimaryConfig) -> Running {
    let (stop, stopped) = watch::channel(false);
    let task = tokio::spawn(daemon::serve_primary(cfg.clone(), stopped));
    Running { stop, task }
}

fn twin(cfg: &TwinConfig) -> Running {
    let (stop, stopped) = watch::channel(false);
    let task = tokio::spawn(daemon::serve_twin(cfg.clone(), stopped));
    Running { stop, task }
}

async fn serving(cfg: &PrimaryConfig) -> twinlog::node::Client {
    testkit::until("status: serving", WAIT, || status::<Status>(&cfg.metrics)).await;
    daemon::load::admin_client(cfg).await.expect("admin client")
}

/// `blob(tag, seq)` appended for each of `seqs`, each answered at its seq
/// with the durability asked.
async fn append_each(
    client: &twinlog::node::Client,
    tag: u8,
    seqs: std::ops::RangeInclusive<u64>,
    durability: Durability,
) {
    for seq in seqs {
        let answered = client
            .append(0x8000, b"", &blob(tag, seq), durability)
            .await
            .unwrap_or_else(|e| panic!("append {seq}: {e}"));
        assert_eq!(answered, (seq, durability));
    }
}

fn blob(tag: u8, seq: u64) -> Vec<u8> {
    let mut b = vec![tag; 200];
    b[..8].copy_from_slice(&seq.to_le_bytes());
    b
}

fn frames_of(dir: &Path) -> Vec<(u64, Vec<u8>)> {
    let log = twinlog::log::Log::open(dir.join(daemon::LOG_DIR)).expect("open log");
    (log.first_seq()..=log.head_seq())
        .map(|s| (s, log.read(s).expect("read").blob))
        .collect()
}

/// A primary A and its twin B, initialized in `root` and pinned to each
/// other.
struct Pair {
    a_dir: std::path::PathBuf,
    b_dir: std::path::PathBuf,
    a_cfg_path: std::path::PathBuf,
    a_fp: twinlog::net::Fingerprint,
    b_twin_cfg: std::path::PathBuf,
    a_cfg: PrimaryConfig,
    b_tcfg: TwinConfig,
}

fn init_pair(root: &Path) -> Pair {
    let (a_dir, b_dir) = (root.join("a"), root.join("b"));
    let a_listen = free_udp();
    let (b_twin_cfg, b_fp) =
        daemon::init_twin(&b_dir, a_listen, free_tcp(), None).expect("twin init");
    let (a_cfg_path, a_fp) =
        daemon::init_primary(&a_dir, a_listen, free_tcp(), Some(b_fp)).expect("primary init");
    daemon::pin_primary(&b_twin_cfg, a_fp).expect("pin");
    let a_cfg = PrimaryConfig::load(&a_cfg_path).expect("load");
    let b_tcfg = TwinConfig::load(&b_twin_cfg).expect("load");
    Pair {
        a_dir,
        b_dir,
        a_cfg_path,
        a_fp,
        b_twin_cfg,
        a_cfg,
        b_tcfg,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_promote_fence_rejoin_by_truncate_to_fork() {
    let root = tempfile::tempdir().expect("tempdir");
    let Pair {
        a_dir,
        b_dir,
        a_cfg_path,
        a_fp,
        b_twin_cfg,
        a_cfg,
        b_tcfg,
    } = init_pair(root.path());

    // A primary and its twin B: 30 frames durable on both.
    let a = primary(&a_cfg);
    let b = twin(&b_tcfg);
    let client = serving(&a_cfg).await;
    // The twin may have dialled before A listened and wait out that attempt:
    // the `twin` appends start once it streams, not within their deadline.
    testkit::until("status: s.twin_connected", WAIT, || {
        status::<Status>(&a_cfg.metrics).filter(|s| s.twin_connected)
    })
    .await;
    append_each(&client, b'a', 1..=30, Durability::Twin).await;
    // The twin goes; A takes 12 more frames, acknowledged `local` only:
    // they are the divergent tail.
    b.stop().await;
    append_each(&client, b'a', 31..=42, Durability::Local).await;
    drop(client);
    a.stop().await;

    // B is promoted with A as its twin to be, and works at once.
    let promoted = daemon::failover::promote(&b_twin_cfg, free_udp(), free_tcp(), Some(a_fp), true)
        .expect("promote");
    assert_eq!((promoted.epoch, promoted.head), (T1, 30));
    let b_cfg = PrimaryConfig::load(&promoted.config).expect("load");
    let b = primary(&b_cfg);
    let b_client = serving(&b_cfg).await;
    append_each(&b_client, b'b', 31..=40, Durability::Local).await;

    // A restarts as a primary, in a new life of its old term. B calls it
    // as a twin of its new term until it is heard: A fences itself,
    // durably, acknowledges nothing from then on, and still serves reads.
    let a = primary(&a_cfg);
    let s: Status = testkit::until("status: s.fenced.is_some()", WAIT, || {
        status::<Status>(&a_cfg.metrics).filter(|s: &Status| s.fenced.is_some())
    })
    .await;
    let f = s.fenced.expect("fenced");
    assert_eq!(
        (f.epoch, f.held),
        (T1, false),
        "fenced by B's proven epoch: {f:?}"
    );
    assert_eq!(s.epoch, 2, "A's second served life of term 0");
    let bs: Status = testkit::until(
        "status: s.predecessor.as_ref().is_some_and(|p| p.told)",
        WAIT,
        || {
            status::<Status>(&b_cfg.metrics)
                .filter(|s: &Status| s.predecessor.as_ref().is_some_and(|p| p.told))
        },
    )
    .await;
    assert!(bs.fenced.is_none(), "B serves on: {bs:?}");
    let a_client = serving(&a_cfg).await;
    for d in [Durability::Local, Durability::Twin] {
        match a_client.append(0x8000, b"", b"late", d).await {
            Err(ClientError::Api(ApiError::Fenced {
                epoch: 2,
                newer: T1,
                seq: None,
                ..
            })) => {}
            other => panic!("a fenced primary answered {other:?}"),
        }
    }
    assert_eq!(
        a_client.read(42).await.expect("reads go on").blob,
        blob(b'a', 42)
    );
    drop(a_client);
    a.stop().await;
    let a = primary(&a_cfg);
    let s: Status = testkit::until("status: serving", WAIT, || status(&a_cfg.metrics)).await;
    assert!(s.fenced.is_some(), "the fence survives a restart");
    let a_client = serving(&a_cfg).await;
    assert!(matches!(
        a_client
            .append(0x8000, b"", b"late", Durability::Local)
            .await,
        Err(ClientError::Api(ApiError::Fenced { .. }))
    ));
    drop(a_client);
    a.stop().await;

    // A rejoins B: frames 31..=42 are saved, then cut; 1..=30 stay.
    let report = daemon::failover::rejoin(
        &a_cfg_path,
        b_cfg.listen.clone(),
        promoted.fingerprint,
        Some(free_tcp().into()),
        Duration::from_secs(10),
    )
    .await
    .expect("rejoin");
    let r = &report.rejoined;
    assert_eq!((r.old_head, r.fork, r.epoch), (42, 30, T1));
    let (saved, _) = r.saved.as_ref().expect("a saved tail");
    assert_eq!((saved.first, saved.last, saved.frames), (31, 42, 12));
    let text = report.to_string();
    assert!(
        text.contains("31..=42") && text.contains("never on the new primary"),
        "{text}"
    );
    let mut listed = Vec::new();
    daemon::failover::divergent(&a_dir, None, std::io::sink()).expect("list");
    for seq in 31..=42u64 {
        let mut out = Vec::new();
        daemon::failover::divergent(&a_dir, Some(seq), &mut out).expect("extract");
        listed.push(out);
    }
    let expected: Vec<Vec<u8>> = (31..=42).map(|s| blob(b'a', s)).collect();
    assert_eq!(
        listed, expected,
        "the saved frames are exactly the divergent tail"
    );
    assert_eq!(frames_of(&a_dir).len(), 30, "the log was cut at the fork");
    // None of the cut frames was the store's: only its applied mark moves
    // back, and it stays back once reopened.
    assert_eq!(r.store, StoreFate::Rewound { from: 42 });
    let history = twinlog::log::Log::open(a_dir.join(daemon::LOG_DIR))
        .expect("open log")
        .history();
    assert_eq!(
        twinlog::store::Store::applied_mark(&a_dir.join(daemon::STORE_DIR), history)
            .expect("the store's mark"),
        30,
        "the store's applied mark after the rejoin"
    );
    assert!(!a_cfg_path.exists(), "primary.toml moved aside");

    // A follows B as its twin; `twin` appends on B are acknowledged.
    let a_tcfg = TwinConfig::load(&report.twin_config).expect("twin.toml");
    let a_twin = twin(&a_tcfg);
    // Following, so that the append below waits for its ack, not for the
    // twin daemon's start and first connection.
    testkit::until("status: s.connected", WAIT, || {
        status::<TwinStatus>(&a_tcfg.metrics).filter(|s: &TwinStatus| s.connected)
    })
    .await;
    let (seq, d) = b_client
        .append(0x8000, b"", &blob(b'b', 41), Durability::Twin)
        .await
        .expect("twin append on the new primary");
    assert_eq!((seq, d), (41, Durability::Twin));
    let st: TwinStatus = testkit::until("status: s.head == 41", WAIT, || {
        status::<TwinStatus>(&a_tcfg.metrics).filter(|s: &TwinStatus| s.head == 41)
    })
    .await;
    assert_eq!(st.epoch, T1);
    // The rejoined twin's store applies the new primary's frames past the
    // fork, not stopped at the mark the cut frames had left.
    let st: TwinStatus = testkit::until(
        "status: s.store.applied == 41 || s.store.stalled.is_some()",
        WAIT,
        || {
            status::<TwinStatus>(&a_tcfg.metrics)
                .filter(|s: &TwinStatus| s.store.applied == 41 || s.store.stalled.is_some())
        },
    )
    .await;
    assert_eq!((st.store.applied, st.store.stalled), (41, None));
    a_twin.stop().await;
    drop(b_client);
    b.stop().await;
    let (on_a, on_b) = (frames_of(&a_dir), frames_of(&b_dir));
    assert_eq!(on_a, on_b, "both boxes hold the same frames");
    for (seq, bytes) in &on_a[..30] {
        assert_eq!(bytes, &blob(b'a', *seq));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_primary_without_a_twin_refuses_twin_appends_at_once() {
    let root = tempfile::tempdir().expect("tempdir");
    let (cfg_path, _) =
        daemon::init_primary(&root.path().join("p"), free_udp(), free_tcp(), None).expect("init");
    let cfg = PrimaryConfig::load(&cfg_path).expect("load");
    let p = primary(&cfg);
    let client = serving(&cfg).await;
    let refused = tokio::time::timeout(
        Duration::from_secs(5),
        client.append(0x8000, b"", b"x", Durability::Twin),
    )
    .await
    .expect("answered at once, not left waiting");
    assert!(
        matches!(refused, Err(ClientError::Api(ApiError::NoTwin))),
        "{refused:?}"
    );
    let (seq, _) = client
        .append(0x8000, b"", b"y", Durability::Local)
        .await
        .expect("local append");
    assert_eq!(seq, 1, "nothing was appended for the refused request");
    let s = client.status().await.expect("status");
    assert!(!s.twin_configured);
    let text = daemon::render_primary_status(&s);
    assert!(text.contains("NONE configured"), "{text}");
    drop(client);
    p.stop().await;
}

/// A primary in `a_dir` and its twin in `b_dir`, pinned to each other,
/// the twin with a client port of its own for when it is promoted.
fn switchable_pair(
    a_dir: &std::path::Path,
    b_dir: &std::path::Path,
) -> (PrimaryConfig, TwinConfig) {
    let a_listen = free_udp();
    let (b_twin_path, b_fp) =
        daemon::init_twin(b_dir, a_listen, free_tcp(), None).expect("twin init");
    let (a_cfg_path, a_fp) =
        daemon::init_primary(a_dir, a_listen, free_tcp(), Some(b_fp)).expect("primary init");
    daemon::pin_primary(&b_twin_path, a_fp).expect("pin");
    let mut b_tcfg = TwinConfig::load(&b_twin_path).expect("load");
    b_tcfg.listen_as_primary = free_udp().into();
    std::fs::write(&b_twin_path, b_tcfg.render()).expect("write twin.toml");
    (PrimaryConfig::load(&a_cfg_path).expect("load"), b_tcfg)
}

/// A planned switchover under a writer: no acknowledged frame is lost, the
/// writer's longest pause is bounded, and the old primary follows the new
/// one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_switchover_loses_nothing_and_the_old_primary_follows() {
    let root = tempfile::tempdir().expect("tempdir");
    let (a_dir, b_dir) = (root.path().join("a"), root.path().join("b"));
    let (a_cfg, b_tcfg) = switchable_pair(&a_dir, &b_dir);
    let admin = daemon::load_identity(&a_dir.join(daemon::ADMIN_DIR)).expect("admin identity");

    let a = primary(&a_cfg);
    let b = twin(&b_tcfg);
    let client = serving(&a_cfg).await;
    testkit::until("status: s.connected", WAIT, || {
        status::<TwinStatus>(&b_tcfg.metrics).filter(|s| s.connected)
    })
    .await;

    // A writer that follows the primary wherever a switchover sends it.
    let (stop_writer, mut writer_stopped) = watch::channel(false);
    let writer = tokio::spawn(async move {
        let mut client = client;
        let mut acked = Vec::new();
        let mut longest = Duration::ZERO;
        let mut n = 0u64;
        while !*writer_stopped.borrow_and_update() {
            n += 1;
            let started = tokio::time::Instant::now();
            match client
                .append(0x8000, b"", &blob(b'w', n), Durability::Twin)
                .await
            {
                Ok((seq, Durability::Twin)) => acked.push((seq, blob(b'w', n))),
                Ok(other) => panic!("acknowledged {other:?}"),
                Err(ClientError::Api(ApiError::Fenced {
                    primary: Some(np), ..
                })) => {
                    let addr: SocketAddr = np.addr.parse().expect("an address");
                    let fp = np.fingerprint.parse().expect("a fingerprint");
                    // The new primary may still be starting: a first packet
                    // to a port nobody listens on yet is retransmitted only
                    // after QUIC's initial timeout, so try again sooner.
                    client = loop {
                        let attempt = twinlog::node::Client::connect(&admin, fp, addr);
                        if let Ok(Ok(c)) =
                            tokio::time::timeout(Duration::from_millis(100), attempt).await
                        {
                            break c;
                        }
                    };
                }
                Err(e) => panic!("append {n}: {e}"),
            }
            longest = longest.max(started.elapsed());
        }
        (acked, longest)
    });
    testkit::until("status: s.head >= 50", WAIT, || {
        status::<Status>(&a_cfg.metrics).filter(|s| s.head >= 50)
    })
    .await;

    let admin_client = daemon::load::admin_client(&a_cfg).await.expect("admin");
    let t0 = std::time::Instant::now();
    let (epoch, head, np) = admin_client
        .switchover(Duration::from_secs(5))
        .await
        .expect("switchover");
    assert_eq!(epoch, T1);
    assert_eq!(np.addr, b_tcfg.listen_as_primary.to_string());
    drop(admin_client);
    let Served::Promoted { primary_config } = b.ended().await else {
        panic!("B did not become a primary");
    };
    eprintln!("switchover answered and B ended: {:?}", t0.elapsed());
    let b_cfg = PrimaryConfig::load(&primary_config).expect("B's primary.toml");
    let b = primary(&b_cfg);
    let Served::Deposed { twin_config } = a.ended().await else {
        panic!("A did not become a twin");
    };
    eprintln!("A ended: {:?}", t0.elapsed());
    let a_tcfg = TwinConfig::load(&twin_config).expect("A's twin.toml");
    let a = twin(&a_tcfg);
    let s: TwinStatus = testkit::until("status: s.connected", WAIT, || {
        status::<TwinStatus>(&a_tcfg.metrics).filter(|s: &TwinStatus| s.connected)
    })
    .await;
    eprintln!("A follows: {:?}", t0.elapsed());
    assert!(s.head >= head);
    testkit::until("status: s.head >= head + 50", WAIT, || {
        status::<Status>(&b_cfg.metrics).filter(|s| s.head >= head + 50)
    })
    .await;
    let _ = stop_writer.send(true);
    let (acked, longest) = writer.await.expect("writer");
    println!(
        "switchover: {} appends acknowledged, longest pause {longest:?}",
        acked.len()
    );
    assert!(
        longest < Duration::from_secs(5),
        "a bounded pause: {longest:?}"
    );
    a.stop().await;
    eprintln!("A stopped: {:?}", t0.elapsed());
    b.stop().await;
    eprintln!("B stopped: {:?}", t0.elapsed());
    let (on_a, on_b) = (frames_of(&a_dir), frames_of(&b_dir));
    assert_eq!(on_a, on_b, "both boxes hold the same frames");
    for (seq, bytes) in &acked {
        assert_eq!(
            &on_b[(*seq - 1) as usize].1,
            bytes,
            "acknowledged frame {seq}"
        );
    }
}

/// A primary ships a group before its own fdatasync: a power cut in
/// between leaves its twin holding frames it lost, which were never
/// acknowledged. Here the twin daemon holds frames 11..=13 that the
/// primary never kept; when the primary serves again the twin saves them
/// under `divergent/`, moves its store back (it had applied them), cuts
/// them and follows the primary's own frame 11.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frames_a_crashed_primary_lost_are_saved_and_cut_on_its_twin() {
    let root = tempfile::tempdir().expect("tempdir");
    let Pair {
        b_dir,
        a_cfg,
        b_tcfg,
        ..
    } = init_pair(root.path());

    let a = primary(&a_cfg);
    let b = twin(&b_tcfg);
    let client = serving(&a_cfg).await;
    testkit::until("status: s.twin_connected", WAIT, || {
        status::<Status>(&a_cfg.metrics).filter(|s| s.twin_connected)
    })
    .await;
    append_each(&client, b'a', 1..=10, Durability::Twin).await;
    drop(client);
    b.stop().await;
    a.stop().await;
    // What the primary shipped and then lost: on the twin only.
    {
        let log = twinlog::log::Log::open(b_dir.join(daemon::LOG_DIR)).expect("open");
        log.set_follower(true);
        for seq in 11..=13 {
            log.append_at(seq, 0x8000, b"", &blob(b'x', seq))
                .expect("append_at");
        }
    }

    let a = primary(&a_cfg);
    let b = twin(&b_tcfg);
    let client = serving(&a_cfg).await;
    testkit::until("status: s.twin_connected", WAIT, || {
        status::<Status>(&a_cfg.metrics).filter(|s| s.twin_connected)
    })
    .await;
    let (seq, d) = client
        .append(0x8000, b"", &blob(b'a', 11), Durability::Twin)
        .await
        .expect("append after the cut");
    assert_eq!((seq, d), (11, Durability::Twin));
    let st: TwinStatus = testkit::until(
        "status: s.head == 11 && (s.store.applied == 11 || s.store.stalled.is_some())",
        WAIT,
        || {
            status::<TwinStatus>(&b_tcfg.metrics).filter(|s: &TwinStatus| {
                s.head == 11 && (s.store.applied == 11 || s.store.stalled.is_some())
            })
        },
    )
    .await;
    assert!(st.store.stalled.is_none(), "the store follows: {st:?}");
    let s: Status = testkit::until("status: serving", WAIT, || status(&a_cfg.metrics)).await;
    let why = s.twin_last_error.unwrap_or_default();
    assert!(why.contains("lost in its crash"), "refused by name: {why}");
    drop(client);
    b.stop().await;
    a.stop().await;

    assert_eq!(
        frames_of(&b_dir),
        (1..=11).map(|s| (s, blob(b'a', s))).collect::<Vec<_>>(),
        "the twin holds the primary's frames, and only those"
    );
    let saved = twinlog::node::divergent::list(&b_dir).expect("list");
    assert_eq!(saved.len(), 1, "{saved:?}");
    assert_eq!((saved[0].fork, saved[0].first, saved[0].last), (10, 11, 13));
    for seq in 11..=13u64 {
        let mut out = Vec::new();
        daemon::failover::divergent(&b_dir, Some(seq), &mut out).expect("extract");
        assert_eq!(out, blob(b'x', seq), "saved frame {seq}");
    }
}

/// Switchovers back and forth on a quiet pair, one right after another:
/// with nothing else happening on either box, each hands over at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn switchovers_back_and_forth_on_a_quiet_pair_each_hand_over() {
    let root = tempfile::tempdir().expect("tempdir");
    let (a_dir, b_dir) = (root.path().join("a"), root.path().join("b"));
    let (mut p_cfg, b_tcfg) = switchable_pair(&a_dir, &b_dir);
    let mut primary_run = primary(&p_cfg);
    let mut twin_run = twin(&b_tcfg);
    let mut t_metrics = b_tcfg.metrics.clone();
    let client = serving(&p_cfg).await;
    append_each(&client, b'q', 1..=5, Durability::Twin).await;
    drop(client);
    let mut epoch = 0;
    for round in 1..=3u64 {
        testkit::until("status: s.connected", WAIT, || {
            status::<TwinStatus>(&t_metrics).filter(|s| s.connected)
        })
        .await;
        let admin = daemon::load::admin_client(&p_cfg).await.expect("admin");
        let t0 = std::time::Instant::now();
        let (got, head, _) = admin
            .switchover(Duration::from_secs(10))
            .await
            .unwrap_or_else(|e| panic!("switchover {round}: {e}"));
        drop(admin);
        assert!(got > epoch, "round {round}: epoch {got} after {epoch}");
        assert_eq!(head, 5);
        eprintln!("switchover {round} answered in {:?}", t0.elapsed());
        epoch = got;
        let Served::Promoted { primary_config } = twin_run.ended().await else {
            panic!("round {round}: the twin did not become a primary");
        };
        let Served::Deposed { twin_config } = primary_run.ended().await else {
            panic!("round {round}: the primary did not become a twin");
        };
        p_cfg = PrimaryConfig::load(&primary_config).expect("the new primary.toml");
        let t_cfg = TwinConfig::load(&twin_config).expect("the new twin.toml");
        t_metrics = t_cfg.metrics.clone();
        primary_run = primary(&p_cfg);
        twin_run = twin(&t_cfg);
    }
    testkit::until("status: s.connected", WAIT, || {
        status::<TwinStatus>(&t_metrics).filter(|s| s.connected)
    })
    .await;
    let client = serving(&p_cfg).await;
    append_each(&client, b'q', 6..=6, Durability::Twin).await;
    drop(client);
    twin_run.stop().await;
    primary_run.stop().await;
}
