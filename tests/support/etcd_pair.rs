//! A pair under one real etcd, as the automatic failover tests run it:
//! A the primary and B its twin, both with `[failover]`, started as
//! `twinlog-test-child daemon` processes; the helpers wait on state, never
//! on a fixed sleep.

#![allow(dead_code)] // each test uses its own part

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use twinlog::daemon::{self, PrimaryConfig, TwinConfig};
use twinlog::net::{Fingerprint, Identity};
use twinlog::node::{Client, Durability};

use super::children::{fast, pstatus, Daemon};
use testkit::etcd::Etcd;
use testkit::{free_tcp, free_udp};

pub const WAIT: Duration = Duration::from_secs(30);
pub const KIND: u16 = 0x8000;
/// The lease's time to live in these tests: etcd's least.
pub const TTL_S: u64 = 2;

/// Until the future `cond` makes gives a value, tried every 20 ms;
/// panics naming `what` after [`WAIT`].
pub async fn until_async<T, F: std::future::Future<Output = Option<T>>>(
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

pub fn blob(n: u64) -> Vec<u8> {
    format!("frame {n} ").repeat(8).into_bytes()
}

/// A pair under one etcd: A the primary, B its twin, both with
/// `[failover]`; the daemons are not started.
pub struct Pair {
    pub root: tempfile::TempDir,
    pub etcd: Etcd,
    pub a_cfg: PathBuf,
    pub b_cfg: PathBuf,
    pub a_metrics: SocketAddr,
    pub b_metrics: SocketAddr,
    pub a_listen: SocketAddr,
    pub b_listen: SocketAddr,
    pub b_fp: Fingerprint,
    pub a_fp: Fingerprint,
    pub admin: Identity,
    /// With `Pair::cuttable`: A's link to etcd, and B's to A.
    pub a_to_etcd: Option<testkit::proxy::Proxy>,
    pub b_to_a: Option<testkit::proxy::Proxy>,
}

impl Pair {
    pub fn new(policy: daemon::config::Policy) -> Pair {
        Pair::with_ttl(policy, TTL_S)
    }

    pub fn with_ttl(policy: daemon::config::Policy, ttl_s: u64) -> Pair {
        let root = tempfile::tempdir().expect("tempdir");
        let etcd = Etcd::start(&root.path().join("etcd")).expect("etcd starts");
        let url = etcd.endpoint();
        let a_listen = free_udp();
        Pair::with(root, policy, etcd, url, a_listen, a_listen, ttl_s)
    }

    /// A pair whose primary A reaches etcd, and whose twin B reaches A,
    /// through relays the test can cut.
    pub async fn cuttable(policy: daemon::config::Policy) -> Pair {
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
    pub fn with(
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
            peer: None,
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

    pub fn log(&self, name: &str) -> PathBuf {
        self.root.path().join(format!("{name}.log"))
    }

    pub fn start_a(&self) -> Daemon {
        Daemon::start("primary", &self.a_cfg, &self.log("a"))
    }

    pub fn start_b(&self) -> Daemon {
        Daemon::start("twin", &self.b_cfg, &self.log("b"))
    }

    pub async fn client(&self, fp: Fingerprint, addr: SocketAddr) -> Client {
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
    pub async fn in_sync(&self) {
        testkit::until("A holds its lease, B recorded in sync", WAIT, || {
            pstatus(self.a_metrics)
                .and_then(|s| s.arbiter)
                .filter(|a| a.lease.held && a.twin_in_sync)
        })
        .await;
    }

    /// [`leads`], the daemons' last log lines said if it never does.
    pub async fn leads(&self, name: &str, metrics: SocketAddr, in_sync: bool) {
        let by = Instant::now() + WAIT;
        loop {
            let s = pstatus(metrics).and_then(|s| s.arbiter);
            if s.as_ref()
                .is_some_and(|a| a.lease.held && (a.twin_in_sync || !in_sync))
            {
                return;
            }
            assert!(
                Instant::now() < by,
                "{name} does not hold its lease{} after {WAIT:?}: {s:?}\n{}",
                if in_sync {
                    " with its twin in sync"
                } else {
                    ""
                },
                self.logs()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The last lines each daemon logged (`a`, `b`, and `a2`, `b2` for
    /// a box started again under another role).
    pub fn logs(&self) -> String {
        ["a", "b", "a2", "b2"]
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
pub async fn leads(name: &str, metrics: SocketAddr, in_sync: bool) {
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
pub async fn append_twin(c: &Client, first: u64, n: u64) -> Vec<(u64, Vec<u8>)> {
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

pub async fn holds(c: &Client, acked: &[(u64, Vec<u8>)]) {
    for (seq, b) in acked {
        let e = c.read(*seq).await.expect("an acknowledged frame is there");
        assert_eq!(&e.blob, b, "frame {seq}");
    }
}
