//! Real primary and twin processes on loopback with generated certificates.
//! Clients append with `twin` durability while the twin is killed with
//! SIGKILL and restarted, the primary is killed and restarted, and the link
//! is cut and restored by a UDP proxy in the test; after each, every frame
//! acknowledged to a client is on both logs, byte for byte.
//!
//! The daemons run the same library entry points as the `primary` and
//! `twin` binaries, in child processes of this test binary.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use twinlog::daemon::{self, PrimaryConfig, TwinConfig};
use twinlog::log::Tail;
use twinlog::net::{Fingerprint, Identity};
use twinlog::node::{Client, Durability};

use testkit::{free_tcp, free_udp};
#[path = "support/children.rs"]
mod children;

use children::spawn as start;

fn blob(n: u64) -> Vec<u8> {
    let len = if n % 50 == 7 {
        2 << 20
    } else {
        64 + (n as usize * 97) % 3000
    };
    (0..len).map(|i| (n as usize * 31 + i * 7) as u8).collect()
}

/// Every frame of a log directory, read without taking its lock.
fn frames(dir: &Path) -> BTreeMap<u64, Vec<u8>> {
    let mut out = BTreeMap::new();
    let Ok(mut tail) = Tail::open(dir.join(daemon::LOG_DIR), 0) else {
        return out;
    };
    while let Ok(Some(f)) = tail.next() {
        out.insert(f.seq, f.blob.to_vec());
    }
    out
}

type Acked = Arc<Mutex<Vec<(u64, u64)>>>;

/// Appenders with `twin` durability, reconnecting whenever the primary is
/// gone; every acknowledged `(seq, n)` is recorded.
fn workload(
    admin: Arc<Identity>,
    primary_fp: Fingerprint,
    addr: SocketAddr,
    acked: Acked,
    stop: Arc<AtomicBool>,
) -> Vec<tokio::task::JoinHandle<()>> {
    (0..4u64)
        .map(|w| {
            let (admin, acked, stop) = (admin.clone(), acked.clone(), stop.clone());
            tokio::spawn(async move {
                let mut n = w;
                let mut client = None;
                while !stop.load(Ordering::SeqCst) {
                    if client.is_none() {
                        let dialed = tokio::time::timeout(
                            Duration::from_millis(500),
                            Client::connect(&admin, primary_fp, addr),
                        )
                        .await;
                        match dialed {
                            Ok(Ok(c)) => client = Some(c),
                            _ => {
                                tokio::time::sleep(Duration::from_millis(50)).await;
                                continue;
                            }
                        }
                    }
                    let Some(c) = client.as_ref() else { continue };
                    n += 4;
                    // A primary killed mid-append is noticed by its new process's
                    // reset or the client's 5 s deadline; a cut link only by the
                    // deadline: give up sooner and dial again.
                    let appended = tokio::time::timeout(
                        Duration::from_secs(2),
                        c.append(0x8000, &n.to_le_bytes(), &blob(n), Durability::Twin),
                    )
                    .await;
                    match appended {
                        Ok(Ok((seq, Durability::Twin))) => {
                            acked.lock().expect("lock").push((seq, n))
                        }
                        Ok(Ok((_, d))) => {
                            panic!("a twin append acknowledged as {d:?} under the wait policy")
                        }
                        _ => client = None,
                    }
                }
            })
        })
        .collect()
}

fn verify(pdir: &Path, tdir: &Path, acked: &Acked, what: &str) {
    let acked = acked.lock().expect("lock").clone();
    assert!(!acked.is_empty(), "{what}: nothing was acknowledged");
    // The twin first: it may only hold less than the primary read after it.
    let on_twin = frames(tdir);
    let on_primary = frames(pdir);
    for (seq, n) in &acked {
        let want = blob(*n);
        assert!(
            on_primary.get(seq) == Some(&want),
            "{what}: acknowledged frame {seq} is not whole on the primary"
        );
        assert!(
            on_twin.get(seq) == Some(&want),
            "{what}: acknowledged frame {seq} is not whole on the twin"
        );
    }
    // A group is shipped before the primary's own sync: the twin may
    // hold up to one group past what a reader of the primary's log sees
    // yet. Every frame up to that is the primary's.
    let primary_head = on_primary.keys().last().copied().unwrap_or(0);
    let twin_head = on_twin.keys().last().copied().unwrap_or(0);
    assert!(
        twin_head <= primary_head + twinlog::repl::MAX_SHIPPED_UNSYNCED,
        "{what}: the twin holds up to {twin_head}, the primary {primary_head}"
    );
    for (seq, b) in on_twin.range(..=primary_head) {
        assert!(
            on_primary.get(seq) == Some(b),
            "{what}: the twin's frame {seq} is not the primary's"
        );
    }
    eprintln!("{what}: {} acknowledged frames on both logs", acked.len());
}

/// Wait until `more` frames beyond those acknowledged now are: the pair
/// works again after whatever was broken.
async fn progress(acked: &Acked, more: usize, what: &str) {
    let target = acked.lock().expect("lock").len() + more;
    let waited = format!("{what}: {more} more frames acknowledged");
    testkit::until(&waited, Duration::from_secs(60), || {
        (acked.lock().expect("lock").len() >= target).then_some(())
    })
    .await;
}

/// Wait until the primary at `addr` reports its twin connected, or not.
async fn twin_connected(admin: &Identity, fp: Fingerprint, addr: SocketAddr, want: bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let status = async {
            Client::connect(admin, fp, addr)
                .await
                .ok()?
                .status()
                .await
                .ok()
        };
        if tokio::time::timeout(Duration::from_secs(2), status)
            .await
            .ok()
            .flatten()
            .is_some_and(|s| s.twin_connected == want)
        {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the primary did not report its twin connected = {want} within 60 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_frames_survive_kills_and_cuts() {
    let root = tempfile::tempdir().expect("tempdir");
    let (pdir, tdir) = (root.path().join("p"), root.path().join("t"));
    let listen: SocketAddr = free_udp();
    let proxy = testkit::proxy::udp(listen).await.expect("proxy");
    let (tcfg, twin_fp) =
        daemon::init_twin(&tdir, proxy.addr, free_tcp(), None).expect("twin init");
    let (pcfg, primary_fp) =
        daemon::init_primary(&pdir, listen, free_tcp(), Some(twin_fp)).expect("primary init");
    daemon::pin_primary(&tcfg, primary_fp).expect("pin");
    let fast = daemon::config::TimersSection {
        heartbeat_ms: 50,
        idle_timeout_ms: 600,
    };
    let mut p = PrimaryConfig::load(&pcfg).expect("load");
    p.timers = fast;
    p.segment_bytes = 1 << 20;
    std::fs::write(&pcfg, p.render()).expect("write");
    let mut t = TwinConfig::load(&tcfg).expect("load");
    t.timers = fast;
    t.segment_bytes = 1 << 20;
    std::fs::write(&tcfg, t.render()).expect("write");

    let logs = root.path().join("logs");
    std::fs::create_dir_all(&logs).expect("logs");
    let mut primary = start("primary", &pcfg, &logs.join("primary.log"));
    let mut twin = start("twin", &tcfg, &logs.join("twin.log"));
    let admin = Arc::new(daemon::load_identity(&pdir.join(daemon::ADMIN_DIR)).expect("admin"));
    let acked: Acked = Arc::new(Mutex::new(Vec::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let workers = workload(
        admin.clone(),
        primary_fp,
        listen,
        acked.clone(),
        stop.clone(),
    );

    progress(&acked, 40, "steady").await;
    verify(&pdir, &tdir, &acked, "steady");

    twin.kill().expect("SIGKILL twin");
    twin.wait().expect("reap");
    twin = start("twin", &tcfg, &logs.join("twin.log"));
    progress(&acked, 20, "after the twin's SIGKILL").await;
    verify(&pdir, &tdir, &acked, "after the twin's SIGKILL");

    primary.kill().expect("SIGKILL primary");
    primary.wait().expect("reap");
    primary = start("primary", &pcfg, &logs.join("primary.log"));
    progress(&acked, 20, "after the primary's SIGKILL").await;
    verify(&pdir, &tdir, &acked, "after the primary's SIGKILL");

    // Cut until the primary has noticed (its idle timeout), so that the
    // pair must reconnect, not merely resend.
    proxy.cut(true);
    twin_connected(&admin, primary_fp, listen, false).await;
    proxy.cut(false);
    twin_connected(&admin, primary_fp, listen, true).await;
    progress(&acked, 20, "after the link was cut and restored").await;
    verify(&pdir, &tdir, &acked, "after the link was cut and restored");

    stop.store(true, Ordering::SeqCst);
    for w in workers {
        let _ = tokio::time::timeout(Duration::from_secs(15), w).await;
    }
    let before = acked.lock().expect("lock").len();
    for child in [&mut primary, &mut twin] {
        // SIGTERM: a clean shutdown.
        let _ = Command::new("kill").arg(child.id().to_string()).status();
        let _ = child.wait();
    }
    verify(&pdir, &tdir, &acked, "after shutdown");
    if std::env::var_os("TWINLOG_KEEP_LOGS").is_some() {
        let kept = root.keep();
        eprintln!("logs kept in {}", kept.display());
    }
    assert!(before > 20, "only {before} frames were acknowledged");
}
