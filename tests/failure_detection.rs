//! Real primary and twin processes on loopback, with their default timers:
//! how soon a failure is noticed. A primary killed with SIGKILL and started
//! again is followed by its twin at once (the new process answers the old
//! connection's packets with a stateless reset), and a client call to a
//! primary stopped with SIGSTOP ends at the client's deadline, by name.

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use twinlog::daemon;
use twinlog::node::{Client, ClientError, ClientOptions, Durability, Status, TwinStatus};

use testkit::{free_tcp, free_udp};

/// The bound of every wait on state here: only a broken system reaches it.
const WAIT: Duration = Duration::from_secs(20);

/// The status a daemon serves on `metrics`, when it answers.
fn status<T: serde::de::DeserializeOwned>(metrics: SocketAddr) -> Option<T> {
    daemon::fetch_status::<T>(metrics).ok().map(|(_, s)| s)
}
#[path = "support/children.rs"]
mod children;

use children::Daemon;

struct Pair {
    pcfg: std::path::PathBuf,
    tcfg: std::path::PathBuf,
    listen: SocketAddr,
    pmetrics: SocketAddr,
    tmetrics: SocketAddr,
    admin: twinlog::net::Identity,
    primary_fp: twinlog::net::Fingerprint,
}

fn pair(root: &Path) -> Pair {
    let (pdir, tdir) = (root.join("p"), root.join("t"));
    let listen: SocketAddr = free_udp();
    let (pmetrics, tmetrics) = (free_tcp(), free_tcp());
    let (tcfg, twin_fp) = daemon::init_twin(&tdir, listen, tmetrics, None).expect("twin init");
    let (pcfg, primary_fp) =
        daemon::init_primary(&pdir, listen, pmetrics, Some(twin_fp)).expect("primary init");
    daemon::pin_primary(&tcfg, primary_fp).expect("pin");
    let admin = daemon::load_identity(&pdir.join(daemon::ADMIN_DIR)).expect("admin");
    Pair {
        pcfg,
        tcfg,
        listen,
        pmetrics,
        tmetrics,
        admin,
        primary_fp,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_primary_is_followed_at_once() {
    let root = tempfile::tempdir().expect("tempdir");
    let p = pair(root.path());
    let logs = root.path();
    let mut primary = Daemon::start("primary", &p.pcfg, &logs.join("primary.log"));
    let mut twin = Daemon::start("twin", &p.tcfg, &logs.join("twin.log"));
    testkit::until("the twin streaming", WAIT, || {
        status::<Status>(p.pmetrics).filter(|s| s.twin_connected)
    })
    .await;
    let client = Client::connect(&p.admin, p.primary_fp, p.listen)
        .await
        .expect("client");
    let (_, d) = client
        .append(0x8000, b"", b"before", Durability::Twin)
        .await
        .expect("append");
    assert_eq!(d, Durability::Twin);

    for round in 1..=3 {
        primary.kill();
        let restarted = Instant::now();
        primary = Daemon::start("primary", &p.pcfg, &logs.join("primary.log"));
        // Serving: its endpoint is bound before its status server.
        testkit::until("the primary serving", WAIT, || status::<Status>(p.pmetrics)).await;
        let serving = restarted.elapsed();
        let client = Client::connect(&p.admin, p.primary_fp, p.listen)
            .await
            .expect("client");
        let (_, d) = client
            .append(0x8000, b"", b"after a restart", Durability::Twin)
            .await
            .expect("append after the restart");
        let acked = restarted.elapsed();
        assert_eq!(d, Durability::Twin);
        eprintln!(
            "round {round}: the new primary served {} ms after its start; the first twin ack \
             came {} ms after its start ({} ms after it served)",
            serving.as_millis(),
            acked.as_millis(),
            (acked - serving).as_millis()
        );
        // The old connection was reset, not waited out.
        let t = testkit::until("the twin following", WAIT, || {
            status::<TwinStatus>(p.tmetrics).filter(|s| s.connected)
        })
        .await;
        assert!(
            t.last_error
                .as_deref()
                .is_some_and(|e| e.contains("reset the connection")),
            "round {round}: {:?}",
            t.last_error
        );
        assert!(
            acked < Duration::from_secs(2),
            "round {round}: the first twin ack came {acked:?} after the restart"
        );
    }
    primary.stop();
    twin.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_to_a_stopped_primary_ends_at_the_client_s_deadline() {
    let root = tempfile::tempdir().expect("tempdir");
    let p = pair(root.path());
    let mut primary = Daemon::start("primary", &p.pcfg, &root.path().join("primary.log"));
    testkit::until("the primary serving", WAIT, || status::<Status>(p.pmetrics)).await;
    let deadline = Duration::from_secs(1);
    let client = Client::connect_with(&p.admin, p.primary_fp, p.listen, ClientOptions { deadline })
        .await
        .expect("client");
    client
        .append(0x8000, b"", b"x", Durability::Local)
        .await
        .expect("append");

    primary.signal(libc::SIGSTOP);
    let by = Instant::now() + Duration::from_secs(10);
    while !primary.stopped() {
        assert!(Instant::now() < by, "SIGSTOP did not take hold");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let started = Instant::now();
    let err = client.status().await.expect_err("a stopped primary");
    let took = started.elapsed();
    eprintln!("{err} ({} ms)", took.as_millis());
    assert!(
        matches!(err, ClientError::Deadline { after } if after == deadline),
        "{err}"
    );
    assert!(took < deadline + Duration::from_secs(1), "{took:?}");
    // The connection is given up: the next call says so at once, by name.
    let started = Instant::now();
    let err = client
        .append(0x8000, b"", b"y", Durability::Local)
        .await
        .expect_err("a stopped primary");
    assert!(matches!(err, ClientError::Deadline { .. }), "{err}");
    assert!(started.elapsed() < deadline + Duration::from_secs(1));
    primary.signal(libc::SIGCONT);
    primary.stop();
}
