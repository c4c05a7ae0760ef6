//! `twin promote`: a stopped twin becomes a primary under a new epoch with
//! every frame it held; its own twin daemon, started by mistake against the
//! old primary, is refused by epoch and writes nothing; a running twin
//! cannot be promoted.

use std::time::Duration;

use tokio::sync::watch;
use twinlog::daemon::{self, PrimaryConfig, TwinConfig};
use twinlog::node::{Durability, TwinStatus};
use twinlog::repl::Refusal;

use testkit::{free_tcp, free_udp};

/// The bound of every wait on state here: only a broken system reaches it.
const WAIT: Duration = Duration::from_secs(20);

/// The admin client of a primary that was just started, once it answers.
async fn serving(cfg: &PrimaryConfig) -> twinlog::node::Client {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let dialed = tokio::time::timeout(Duration::from_secs(2), async {
            let c = daemon::load::admin_client(cfg).await.ok()?;
            c.status().await.ok().map(|_| c)
        })
        .await;
        if let Ok(Some(client)) = dialed {
            return client;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the primary did not answer within 30 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_promoted_twin_serves_its_frames_and_the_old_primary_is_refused() {
    let root = tempfile::tempdir().expect("tempdir");
    let (pdir, tdir) = (root.path().join("p"), root.path().join("t"));
    let listen = free_udp();
    let (tcfg, twin_fp) = daemon::init_twin(&tdir, listen, free_tcp(), None).expect("twin init");
    let (pcfg, primary_fp) =
        daemon::init_primary(&pdir, listen, free_tcp(), Some(twin_fp)).expect("primary init");
    daemon::pin_primary(&tcfg, primary_fp).expect("pin");
    let pc = PrimaryConfig::load(&pcfg).expect("load");
    let tc = TwinConfig::load(&tcfg).expect("load");

    let (stop_p, stopped) = watch::channel(false);
    let primary = tokio::spawn(daemon::serve_primary(pc.clone(), stopped));
    let (stop_t, stopped) = watch::channel(false);
    let twin = tokio::spawn(daemon::serve_twin(tc.clone(), stopped));
    let client = serving(&pc).await;
    for i in 0..20u8 {
        let (_, d) = client
            .append(0x8000, b"", &[i; 100], Durability::Twin)
            .await
            .expect("append");
        assert_eq!(d, Durability::Twin);
    }

    let running = daemon::failover::promote(&tcfg, free_udp(), free_tcp(), None, true)
        .expect_err("a running twin");
    assert!(
        matches!(
            &running,
            daemon::DaemonError::Running {
                before: "promoting",
                ..
            }
        ),
        "{running}"
    );

    let _ = stop_t.send(true);
    twin.await.expect("join").expect("twin stopped");
    let check = daemon::check_log(&tc.data_dir.join(daemon::LOG_DIR)).expect("check-log");
    assert_eq!((check.first, check.last, check.frames), (1, 20, 20));
    let promoted =
        daemon::failover::promote(&tcfg, free_udp(), free_tcp(), None, true).expect("promote");
    assert_eq!(
        (promoted.epoch, promoted.head),
        (1 << twinlog::repl::epochs::LIFE_BITS, 20)
    );

    // The promoted box's twin daemon, started by mistake: refused by epoch.
    let (stop_t, stopped) = watch::channel(false);
    let twin = tokio::spawn(daemon::serve_twin(tc.clone(), stopped));
    let status: TwinStatus = testkit::until("the condition", WAIT, || {
        daemon::fetch_status::<TwinStatus>(&tc.metrics)
            .ok()
            .map(|(_, s)| s)
            .filter(|s| s.refusal.is_some() && s.last_error.is_some())
    })
    .await;
    assert!(
        matches!(status.refusal, Some(Refusal::StaleEpoch { .. })),
        "refused by epoch: {:?} ({:?})",
        status.refusal,
        status.last_error
    );
    assert_eq!(status.head, 20, "nothing written");
    let _ = stop_t.send(true);
    twin.await.expect("join").expect("twin stopped");
    let _ = stop_p.send(true);
    primary.await.expect("join").expect("primary stopped");

    // The promoted box serves as a primary, with every frame.
    let np = PrimaryConfig::load(&promoted.config).expect("load promoted");
    let (stop_np, stopped) = watch::channel(false);
    let new_primary = tokio::spawn(daemon::serve_primary(np.clone(), stopped));
    let client = serving(&np).await;
    for seq in 1..=20u64 {
        assert_eq!(
            client.read(seq).await.expect("read").blob,
            vec![(seq - 1) as u8; 100]
        );
    }
    let (seq, d) = client
        .append(0x8000, b"", b"after", Durability::Local)
        .await
        .expect("append");
    assert_eq!((seq, d), (21, Durability::Local));
    let _ = stop_np.send(true);
    new_primary.await.expect("join").expect("stopped");
}
