//! A primary daemon as a child process of a test (its memory and threads
//! its own to measure), with clients of each role pinned, and streams of
//! the protocol opened by hand so a test decides what to send and when to
//! read. Included by path by the tests that use it.

#![allow(dead_code)] // each test uses its own part

#[path = "children.rs"]
mod children;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

pub use children::Daemon;
use twinlog::daemon::{self, PrimaryConfig};
use twinlog::net::{self, Fingerprint, Identity, Pins, Role};
use twinlog::node::api::ClientRole;
use twinlog::node::{Client, Request, Status};

/// A primary daemon with no twin, and its admin.
pub struct Primary {
    pub daemon: Daemon,
    pub config: std::path::PathBuf,
    pub log: std::path::PathBuf,
    pub listen: SocketAddr,
    pub metrics: SocketAddr,
    pub admin: Identity,
    pub fp: Fingerprint,
}

/// A client identity pinned on the primary in `role` before it starts.
pub struct Pinned {
    pub id: Identity,
    pub role: ClientRole,
}

impl Pinned {
    pub fn new(role: ClientRole) -> Pinned {
        Pinned {
            id: Identity::mint().expect("mint"),
            role,
        }
    }
}

/// A primary in `root`, `limits` changed as given (`[limits]` keys by
/// name), `clients` pinned in their roles.
pub fn start(root: &Path, limits: &[(&str, u64)], clients: &[&Pinned]) -> Primary {
    start_in(root, limits, clients, None)
}

pub fn start_in(
    root: &Path,
    limits: &[(&str, u64)],
    clients: &[&Pinned],
    max_fds: Option<u32>,
) -> Primary {
    let dir = root.join("p");
    let listen: SocketAddr = testkit::free_udp();
    let metrics = testkit::free_tcp();
    let (config, fp) = daemon::init_primary(&dir, listen, metrics, None).expect("init");
    let mut cfg = PrimaryConfig::load(&config).expect("config");
    for &(key, value) in limits {
        let l = &mut cfg.limits;
        match key {
            "body_piece_timeout_ms" => l.body_piece_timeout_ms = value,
            "memory_budget_mib" => l.memory_budget_mib = value,
            "max_client_connections" => l.max_client_connections = value,
            other => panic!("no [limits] key {other} here"),
        }
    }
    std::fs::write(&config, cfg.render()).expect("config");
    for c in clients {
        daemon::pin_client(&config, c.id.fingerprint(), c.role).expect("pin");
    }
    let admin = daemon::load_identity(&dir.join(daemon::ADMIN_DIR)).expect("admin");
    let log = root.join("primary.log");
    let daemon = match max_fds {
        None => Daemon::start("primary", &config, &log),
        Some(n) => Daemon::start_with_fd_limit("primary", &config, &log, n),
    };
    Primary {
        daemon,
        config,
        log,
        listen,
        metrics,
        admin,
        fp,
    }
}

impl Primary {
    /// Until the daemon answers `/status`.
    pub async fn serving(&self) {
        testkit::until("the primary serving", Duration::from_secs(30), || {
            daemon::fetch_status::<Status>(self.metrics).ok()
        })
        .await;
    }

    /// Stop it cleanly (SIGTERM) and start it again on the same files.
    pub async fn restart(&mut self) {
        self.daemon.stop();
        self.daemon = Daemon::start("primary", &self.config, &self.log);
        self.serving().await;
    }

    pub fn status(&self) -> Status {
        daemon::fetch_status::<Status>(self.metrics)
            .expect("status")
            .1
    }

    /// A `/proc/<pid>/status` field: `VmRSS`, `VmHWM` in bytes, `Threads`
    /// as a count.
    pub fn proc_field(&self, field: &str) -> u64 {
        let v = testkit::procfs::vm_kib(self.daemon.pid(), field).expect("/proc status");
        match field {
            "Threads" => v,
            _ => v * 1024,
        }
    }

    /// Forget the peak RSS so far: `VmHWM` from here on is this span's.
    pub fn reset_peak(&self) {
        std::fs::write(format!("/proc/{}/clear_refs", self.daemon.pid()), "5")
            .expect("reset the peak");
    }

    /// The admin's typed client.
    pub async fn admin(&self) -> Client {
        Client::connect(&self.admin, self.fp, self.listen)
            .await
            .expect("admin client")
    }

    /// A connection of `id`, its endpoint kept alive as long as the
    /// connection is held.
    pub async fn connect(&self, id: &Identity) -> Result<Conn, net::NetError> {
        let pins = Arc::new(Pins::new().pin(self.fp, Role::Primary));
        let endpoint = net::client(id, pins)?;
        let conn = net::connect(&endpoint, self.listen).await?;
        Ok(Conn {
            conn,
            _endpoint: endpoint,
        })
    }
}

impl Primary {
    /// A connection of `id` that grants each stream `stream_window` bytes
    /// of credit and the connection `conn_window`: a client that lets every
    /// answer's head arrive and reads nothing after it.
    pub async fn connect_windows(
        &self,
        id: &Identity,
        stream_window: u32,
        conn_window: u32,
    ) -> Result<Conn, net::NetError> {
        let pins = Arc::new(Pins::new().pin(self.fp, Role::Primary));
        let tls = net::tls::client_tls(id, pins)?;
        let crypto = quinn::crypto::rustls::QuicClientConfig::try_from(tls)
            .map_err(|e| net::TlsError::Config(e.to_string()))?;
        let mut transport = quinn::TransportConfig::default();
        transport.stream_receive_window(quinn::VarInt::from_u32(stream_window));
        transport.receive_window(quinn::VarInt::from_u32(conn_window));
        transport.keep_alive_interval(Some(Duration::from_secs(1)));
        let mut cfg = quinn::ClientConfig::new(Arc::new(crypto));
        cfg.transport_config(Arc::new(transport));
        let mut endpoint = quinn::Endpoint::client(SocketAddr::from(([127, 0, 0, 1], 0)))?;
        endpoint.set_default_client_config(cfg);
        let conn = net::connect(&endpoint, self.listen).await?;
        Ok(Conn {
            conn,
            _endpoint: endpoint,
        })
    }
}

/// A connection opened by hand.
pub struct Conn {
    pub conn: quinn::Connection,
    _endpoint: quinn::Endpoint,
}

impl Conn {
    /// A stream whose request is written; the test reads its answer when
    /// it likes.
    pub async fn ask(&self, req: &Request) -> (quinn::SendStream, quinn::RecvStream) {
        let (mut tx, rx) = self.conn.open_bi().await.expect("stream");
        net::write_msg(&mut tx, req).await.expect("request");
        (tx, rx)
    }
}

/// Deterministic bytes.
pub fn pattern(seed: u8, len: usize) -> Vec<u8> {
    let mut x = u32::from(seed) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x as u8
        })
        .collect()
}
