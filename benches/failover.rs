//! The failover benchmark: a primary and a twin, each its own process, on
//! loopback with mutual TLS and the shipped timers, through the failover
//! cycle. One JSON object per case per line on stdout, progress on stderr.
//!
//! ```sh
//! cargo bench --bench failover              # full run, a few minutes
//! cargo bench --bench failover -- --quick   # every case smaller, under a minute
//! cargo bench --bench failover -- --quick rejoin # only the cases whose name has `rejoin`
//! ```
//!
//! - `promote_to_first_twin_ack_ms`: from the primary's SIGKILL to the first
//!   `twin`-acknowledged append on the promoted box, the failover run as a
//!   script would: stop the twin, `twin promote --twin-fingerprint OLD`,
//!   `primary serve` (waited on through `/status`), `primary rejoin` on the
//!   old box, `twin serve` there. A client dials the promoted box from its
//!   start. The median of the rounds (the boxes swap each round), the
//!   slowest beside it, and where the median round's time went.
//! - `rejoin_1gib_bytes_moved`: a 1 GiB log (quick: 64 MiB) on both boxes;
//!   the twin dies, the primary takes a 10 MiB tail (quick: 1 MiB) and
//!   stops; the twin is promoted and takes as much again past the fork; the
//!   old primary rejoins and follows. **Bytes moved**: what the rejoined
//!   twin received from the new primary on the wire (UDP payloads as QUIC
//!   counts them: frames, control messages, handshakes, and a snapshot if
//!   one were needed) from its start until its head reached the new
//!   primary's. The divergent tail the rejoin saves and cuts is local: it
//!   moves nowhere. `ratio` is bytes moved over the divergent tail's size;
//!   `frame_bytes` the frame-stream part of the bytes moved, against
//!   `past_fork_bytes`, the new primary's frames past the fork as the
//!   stream ships them (what had to move); `log_to_fork_bytes` what a
//!   copy of the whole log would have moved.
//! - `switchover_pause_ms`: the longest one append waits (from its first
//!   try to its acknowledgement, a `Fenced` answer, the redirect and the
//!   new connection included) across a `primary switchover`, with one
//!   closed-loop `twin` writer that follows the redirect; switchovers back
//!   and forth, the worst of them.
//! - `restart_to_twin_ack_ms`: from a primary's SIGKILL, then its start
//!   again at once, to the first `twin` acknowledgement; the median.
//! - `auto_failover_ms` and `fence_margin_ms`: automatic failover under a
//!   real etcd (`failover_cases/auto.rs` says how).
//!
//! The daemons and the offline commands are this binary re-executed with
//! [`ROLE_ENV`] set: the child runs the library entry point the `primary`
//! or `twin` binary runs for that command and, like them, serves a
//! switchover's new role in a new program image. Each dies with the bench
//! (parent-death signal, and SIGKILL on drop). Every file lives under
//! cargo's target tmp dir, removed at the end.

#[path = "failover_cases/auto.rs"]
mod auto;
mod common;

use common::*;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use twinlog::daemon::{self, PrimaryConfig, TwinConfig};
use twinlog::log::APP_KIND_FIRST;
use twinlog::net::{Fingerprint, Identity};
use twinlog::node::api::ApiError;
use twinlog::node::{Client, ClientError, Durability, Status, TwinStatus};

use testkit::{free_tcp, free_udp};

/// The `bench` field of every line this program prints.
const BENCH: &str = "failover";
/// Set in a child: which command it runs (`serve-primary`, `serve-twin`,
/// `promote`, `rejoin`); its arguments follow on the command line.
const ROLE_ENV: &str = "TWINLOG_FAILOVER_BENCH_ROLE";
const KIND: u16 = APP_KIND_FIRST;

struct Config {
    quick: bool,
    filters: Vec<String>,
    promote_rounds: usize,
    log_bytes: u64,
    tail_bytes: u64,
    switchovers: usize,
    restart_rounds: usize,
    auto_rounds: usize,
}

impl Config {
    fn new(quick: bool, filters: Vec<String>) -> Config {
        Config {
            quick,
            filters,
            promote_rounds: if quick { 2 } else { 6 },
            log_bytes: if quick { 64 * MIB } else { 1024 * MIB },
            tail_bytes: if quick { MIB } else { 10 * MIB },
            switchovers: if quick { 3 } else { 10 },
            restart_rounds: if quick { 2 } else { 6 },
            auto_rounds: if quick { 2 } else { 6 },
        }
    }

    fn wants(&self, case: &str) -> bool {
        self.filters.is_empty() || self.filters.iter().any(|f| case.contains(f.as_str()))
    }
}

fn main() {
    if let Ok(role) = std::env::var(ROLE_ENV) {
        child_main(&role);
        return;
    }
    let quick = std::env::args().any(|a| a == "--quick");
    // Cargo passes `--bench`; every other word is a filter.
    let filters = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let cfg = Config::new(quick, filters);
    let root_parent = Path::new(env!("CARGO_TARGET_TMPDIR"));
    std::fs::create_dir_all(root_parent).expect("create the target tmp dir");
    let root = tempfile::Builder::new()
        .prefix("twinlog-bench-failover-")
        .tempdir_in(root_parent)
        .expect("a temp dir under target/tmp");
    eprintln!(
        "twinlog failover bench ({}) in {}",
        if quick { "quick" } else { "full" },
        root.path().display()
    );
    let started = Instant::now();
    let rt = tokio::runtime::Runtime::new().expect("a tokio runtime");
    // Children are spawned from this thread only (`block_on` polls the
    // cases here): their parent-death signal follows it.
    rt.block_on(async {
        if cfg.wants("promote_to_first_twin_ack_ms") {
            promote_to_first_twin_ack(&cfg, &root.path().join("promote")).await;
        }
        if cfg.wants("rejoin_1gib_bytes_moved") {
            rejoin_bytes_moved(&cfg, &root.path().join("rejoin")).await;
        }
        if cfg.wants("switchover_pause_ms") {
            switchover_pause(&cfg, &root.path().join("switchover")).await;
        }
        if cfg.wants("restart_to_twin_ack_ms") {
            restart_to_twin_ack(&cfg, &root.path().join("restart")).await;
        }
        if cfg.wants("auto_failover_ms") {
            auto::auto_failover(&cfg, &root.path().join("auto")).await;
        }
        if cfg.wants("fence_margin_ms") {
            auto::fence_margin(&cfg, &root.path().join("fence")).await;
        }
    });
    drop(rt);
    eprintln!(
        "total {:.1} s ({})",
        started.elapsed().as_secs_f64(),
        if cfg.quick { "quick" } else { "full" }
    );
}

/// A child: one daemon or one offline command.
fn child_main(role: &str) {
    // Die with the bench, even SIGKILLed.
    // SAFETY: prctl with integer arguments only affects this process.
    unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) };
    daemon::init_tracing(false);
    let args: Vec<String> = std::env::args().skip(1).collect();
    let rt = tokio::runtime::Runtime::new().expect("a tokio runtime");
    let ran: Result<(), String> = rt.block_on(async {
        match (role, args.as_slice()) {
            ("serve-primary" | "serve-twin", [config]) => {
                let config = PathBuf::from(config);
                let shutdown = daemon::shutdown_on_signals().map_err(|e| e.to_string())?;
                let served = if role == "serve-primary" {
                    let cfg = PrimaryConfig::load(&config).map_err(|e| e.to_string())?;
                    daemon::serve_primary(cfg, shutdown.clone()).await
                } else {
                    let cfg = TwinConfig::load(&config).map_err(|e| e.to_string())?;
                    daemon::serve_twin(cfg, shutdown.clone()).await
                }
                .map_err(|e| e.to_string())?;
                // A switchover changed the role: serve the new one in a new
                // program image, as the shipped binaries do.
                // Under an arbiter: a replaced primary rejoins by itself,
                // and one whose lease ended starts again.
                let served = if role == "serve-primary" {
                    daemon::auto_failover::after_primary_serve(served, &config, shutdown)
                        .await
                        .map_err(|e| e.to_string())?
                } else {
                    daemon::auto_failover::stop_wins(served, &shutdown)
                };
                let (next, config) = match &served {
                    daemon::Served::Stopped | daemon::Served::Replaced { .. } => return Ok(()),
                    daemon::Served::Deposed { twin_config } => ("serve-twin", twin_config),
                    daemon::Served::Promoted { primary_config } => {
                        ("serve-primary", primary_config)
                    }
                    daemon::Served::LeaseLost => (role, &config),
                };
                use std::os::unix::process::CommandExt;
                let me = std::env::current_exe().map_err(|e| e.to_string())?;
                let e = Command::new(me).env(ROLE_ENV, next).arg(config).exec();
                Err(format!("serving the new role: {e}"))
            }
            ("promote", [config, listen, metrics, twin_fp]) => {
                let listen: SocketAddr = listen.parse().map_err(|e| format!("{e}"))?;
                let metrics: SocketAddr = metrics.parse().map_err(|e| format!("{e}"))?;
                let fp: Fingerprint = twin_fp.parse().map_err(|e| format!("{e:?}"))?;
                // The primary was killed a moment ago, on purpose: promote
                // at once.
                let p =
                    daemon::failover::promote(Path::new(config), listen, metrics, Some(fp), true)
                        .map_err(|e| e.to_string())?;
                println!("{} {} {}", p.epoch, p.head, p.fingerprint);
                Ok(())
            }
            ("rejoin", [config, primary, fp, metrics]) => {
                let primary: SocketAddr = primary.parse().map_err(|e| format!("{e}"))?;
                let metrics: SocketAddr = metrics.parse().map_err(|e| format!("{e}"))?;
                let fp: Fingerprint = fp.parse().map_err(|e| format!("{e:?}"))?;
                let report = daemon::failover::rejoin(
                    Path::new(config),
                    primary.into(),
                    fp,
                    Some(metrics.into()),
                    Duration::from_secs(10),
                )
                .await
                .map_err(|e| e.to_string())?;
                let r = &report.rejoined;
                let saved = r.saved.as_ref().map_or(0, |(m, _)| m.bytes);
                println!(
                    "{} {} {} {saved} {}",
                    r.fork, r.old_head, r.cut_bytes, r.needs_snapshot
                );
                Ok(())
            }
            _ => Err(format!("bad child arguments {role} {args:?}")),
        }
    });
    if let Err(e) = ran {
        eprintln!("{role}: {e}");
        std::process::exit(1);
    }
}

/// A child process, SIGKILLed and reaped when dropped.
struct Proc {
    child: Option<Child>,
    log: PathBuf,
}

impl Proc {
    fn spawn(role: &str, args: &[String], log: &Path) -> Proc {
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .expect("a child's log file");
        let child = Command::new(std::env::current_exe().expect("the bench's own path"))
            .env(ROLE_ENV, role)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(out)
            .spawn()
            .expect("spawn a child");
        Proc {
            child: Some(child),
            log: log.to_owned(),
        }
    }

    fn signal(&self, sig: libc::c_int) {
        let pid = libc::pid_t::try_from(self.child.as_ref().expect("running").id())
            .expect("pid fits pid_t");
        // SAFETY: kill takes integers; the pid is our unreaped child's.
        unsafe { libc::kill(pid, sig) };
    }

    fn sigkill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM, and wait for a clean shutdown.
    fn stop(&mut self) {
        if self.child.is_none() {
            return;
        }
        self.signal(libc::SIGTERM);
        let mut c = self.child.take().expect("running");
        let deadline = Instant::now() + Duration::from_secs(30);
        while c.try_wait().expect("poll a child").is_none() {
            if Instant::now() > deadline {
                let tail = std::fs::read_to_string(&self.log).unwrap_or_default();
                panic!("a daemon ignored SIGTERM for 30 s; its log:\n{tail}");
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.sigkill();
    }
}

/// Run an offline command in a child to its end: its stdout.
fn command(role: &str, args: &[String], log: &Path) -> String {
    let out = Command::new(std::env::current_exe().expect("the bench's own path"))
        .env(ROLE_ENV, role)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run a command");
    std::fs::write(log, &out.stderr).expect("the command's log");
    assert!(
        out.status.success(),
        "{role} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8 stdout")
}

/// One box: its data directory, identity, addresses, and its daemon.
struct Host {
    dir: PathBuf,
    fp: Fingerprint,
    /// Where it serves clients as a primary.
    listen: SocketAddr,
    /// Its /status, in either role.
    metrics: SocketAddr,
    daemon: Option<Proc>,
}

impl Host {
    fn primary_cfg(&self) -> PathBuf {
        self.dir.join(daemon::PRIMARY_CONFIG)
    }

    fn twin_cfg(&self) -> PathBuf {
        self.dir.join(daemon::TWIN_CONFIG)
    }

    fn admin(&self) -> Arc<Identity> {
        Arc::new(daemon::load_identity(&self.dir.join(daemon::ADMIN_DIR)).expect("admin identity"))
    }

    fn serve(&mut self, primary: bool) {
        let (role, cfg) = if primary {
            ("serve-primary", self.primary_cfg())
        } else {
            ("serve-twin", self.twin_cfg())
        };
        let log = self.dir.with_extension("log");
        self.daemon = Some(Proc::spawn(role, &[cfg.display().to_string()], &log));
    }

    fn daemon(&mut self) -> &mut Proc {
        self.daemon.as_mut().expect("a daemon runs")
    }
}

/// A primary A and its twin B, initialised with the shipped settings; B
/// serves clients at its own address once promoted.
fn pair(dir: &Path) -> [Host; 2] {
    std::fs::create_dir_all(dir).expect("mkdir");
    let (a_dir, b_dir) = (dir.join("a"), dir.join("b"));
    let (a_listen, b_listen) = (free_udp(), free_udp());
    let (a_metrics, b_metrics) = (free_tcp(), free_tcp());
    let (b_cfg, b_fp) = daemon::init_twin(&b_dir, a_listen, b_metrics, None).expect("twin init");
    let (_, a_fp) =
        daemon::init_primary(&a_dir, a_listen, a_metrics, Some(b_fp)).expect("primary init");
    daemon::pin_primary(&b_cfg, a_fp).expect("pin");
    let mut t = TwinConfig::load(&b_cfg).expect("twin.toml");
    t.listen_as_primary = b_listen.into();
    std::fs::write(&b_cfg, t.render()).expect("write twin.toml");
    [
        Host {
            dir: a_dir,
            fp: a_fp,
            listen: a_listen,
            metrics: a_metrics,
            daemon: None,
        },
        Host {
            dir: b_dir,
            fp: b_fp,
            listen: b_listen,
            metrics: b_metrics,
            daemon: None,
        },
    ]
}

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

/// Until `f` answers, checked every 2 ms (a timing is taken at its end);
/// panics after 60 s naming `what`.
async fn until<T>(what: &str, f: impl FnMut() -> Option<T>) -> T {
    testkit::poll(what, Duration::from_secs(60), Duration::from_millis(2), f).await
}

/// A client of the primary at `addr`, dialled until it answers. A first
/// packet to a port nobody listens on yet is retransmitted only after
/// QUIC's initial timeout (~1 s), so each try is cut short.
async fn dial(admin: &Identity, fp: Fingerprint, addr: SocketAddr) -> Client {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Ok(Ok(c)) =
            tokio::time::timeout(Duration::from_millis(100), Client::connect(admin, fp, addr)).await
        {
            return c;
        }
        assert!(Instant::now() < deadline, "no primary at {addr} in 60 s");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Append `blob` with `twin` durability until acknowledged as such,
/// dialling again whenever the primary is gone.
async fn twin_append(admin: &Identity, fp: Fingerprint, addr: SocketAddr, blob: &[u8]) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let c = dial(admin, fp, addr).await;
        if let Ok(Ok((seq, Durability::Twin))) = tokio::time::timeout(
            Duration::from_secs(10),
            c.append(KIND, b"", blob, Durability::Twin),
        )
        .await
        {
            return seq;
        }
        assert!(Instant::now() < deadline, "no twin acknowledgement in 60 s");
    }
}

/// `count` appends of `len` bytes, `inflight` at a time.
async fn fill(c: &Arc<Client>, count: u64, len: usize, want: Durability, inflight: u64) {
    let blob = Arc::new(pattern(len));
    let mut set = tokio::task::JoinSet::new();
    for w in 0..inflight {
        let (c, blob) = (c.clone(), blob.clone());
        set.spawn(async move {
            let mut i = w;
            while i < count {
                let (_, got) = c
                    .append(KIND, b"", &blob, want)
                    .await
                    .expect("a fill append");
                assert_eq!(got, want);
                i += inflight;
            }
        });
    }
    while let Some(r) = set.join_next().await {
        r.expect("a fill task");
    }
}

/// Frames `from..=to` of a box's log as the replication stream ships them:
/// each frame's 32-byte header, its meta, its blob.
fn stream_bytes(dir: &Path, from: u64, to: u64) -> u64 {
    let mut tail = twinlog::log::Tail::open(dir.join(daemon::LOG_DIR), from).expect("tail a log");
    let mut sum = 0;
    while let Some(f) = tail.next().expect("read a log") {
        if f.seq > to {
            break;
        }
        sum += 32 + f.meta.len() as u64 + f.blob.len() as u64;
    }
    sum
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

async fn promote_to_first_twin_ack(cfg: &Config, dir: &Path) {
    eprintln!("promote_to_first_twin_ack_ms ...");
    let mut boxes = pair(dir);
    boxes[0].serve(true);
    boxes[1].serve(false);
    until("the twin follows", || {
        tstatus(boxes[1].metrics).filter(|s| s.connected)
    })
    .await;
    let c = Arc::new(dial(&boxes[0].admin(), boxes[0].fp, boxes[0].listen).await);
    fill(&c, 2000, 1024, Durability::Twin, 8).await;
    drop(c);
    let mut totals = Vec::new();
    let mut steps: Vec<[f64; 5]> = Vec::new();
    let (mut p, mut t) = (0usize, 1usize);
    for round in 0..cfg.promote_rounds {
        // Writes right up to the kill: the twin lags as it would.
        let c = Arc::new(dial(&boxes[p].admin(), boxes[p].fp, boxes[p].listen).await);
        fill(&c, 200, 1024, Durability::Local, 8).await;
        let log = |n: &str| dir.join(format!("{n}-{round}.log"));
        let t0 = Instant::now();
        boxes[p].daemon().sigkill();
        drop(c);
        boxes[t].daemon().stop();
        let t_stopped = Instant::now();
        let said = command(
            "promote",
            &[
                boxes[t].twin_cfg().display().to_string(),
                boxes[t].listen.to_string(),
                boxes[t].metrics.to_string(),
                boxes[p].fp.to_string(),
            ],
            &log("promote"),
        );
        let t_promoted = Instant::now();
        boxes[t].serve(true);
        // The client dials the promoted box from its start.
        let (admin, fp, addr) = (boxes[t].admin(), boxes[t].fp, boxes[t].listen);
        let acked = tokio::spawn(async move {
            twin_append(&admin, fp, addr, b"first after the failover").await;
            Instant::now()
        });
        until("the promoted box serves", || pstatus(boxes[t].metrics)).await;
        let t_serving = Instant::now();
        command(
            "rejoin",
            &[
                boxes[p].primary_cfg().display().to_string(),
                boxes[t].listen.to_string(),
                boxes[t].fp.to_string(),
                boxes[p].metrics.to_string(),
            ],
            &log("rejoin"),
        );
        let t_rejoined = Instant::now();
        boxes[p].serve(false);
        let t_ack = acked.await.expect("the client task");
        let total = ms(t_ack - t0);
        eprintln!(
            "  round {}: {total:.0} ms (promote said {:?})",
            round + 1,
            said.trim()
        );
        totals.push(total);
        steps.push([
            ms(t_stopped - t0),
            ms(t_promoted - t_stopped),
            ms(t_serving - t_promoted),
            ms(t_rejoined - t_serving),
            ms(t_ack - t_rejoined),
        ]);
        (p, t) = (t, p);
    }
    let mut sorted = totals.clone();
    let med = median(&mut sorted);
    let at = totals
        .iter()
        .position(|&v| v == med)
        .expect("the median is one of the rounds");
    let s = steps[at];
    Line::new(BENCH, "promote_to_first_twin_ack_ms", med, "ms")
        .target(2000.0)
        .lower_is_better()
        .num("max", sorted[sorted.len() - 1])
        .int("rounds", totals.len() as u64)
        .num("stop_twin_ms", s[0])
        .num("promote_ms", s[1])
        .num("serve_ms", s[2])
        .num("rejoin_ms", s[3])
        .num("follow_to_ack_ms", s[4])
        .print();
    for b in &mut boxes {
        if let Some(d) = b.daemon.as_mut() {
            d.stop();
        }
    }
}

async fn rejoin_bytes_moved(cfg: &Config, dir: &Path) {
    eprintln!("rejoin_1gib_bytes_moved ...");
    let mut boxes = pair(dir);
    boxes[0].serve(true);
    boxes[1].serve(false);
    until("the twin follows", || {
        tstatus(boxes[1].metrics).filter(|s| s.connected)
    })
    .await;
    let frame = MIB as usize;
    let c = Arc::new(dial(&boxes[0].admin(), boxes[0].fp, boxes[0].listen).await);
    let t_fill = Instant::now();
    fill(&c, cfg.log_bytes / MIB, frame, Durability::Twin, 4).await;
    eprintln!(
        "  {} MiB on both boxes in {:.1} s",
        cfg.log_bytes / MIB,
        t_fill.elapsed().as_secs_f64()
    );
    // The twin dies frozen: what A sends it from now on is lost with its
    // socket buffer, so A's next frames are a tail B never held.
    boxes[1].daemon().signal(libc::SIGSTOP);
    boxes[1].daemon().sigkill();
    fill(&c, cfg.tail_bytes / MIB, frame, Durability::Local, 1).await;
    drop(c);
    boxes[0].daemon().stop();
    let log = |n: &str| dir.join(format!("{n}.log"));
    command(
        "promote",
        &[
            boxes[1].twin_cfg().display().to_string(),
            boxes[1].listen.to_string(),
            boxes[1].metrics.to_string(),
            boxes[0].fp.to_string(),
        ],
        &log("promote"),
    );
    boxes[1].serve(true);
    let c = Arc::new(dial(&boxes[1].admin(), boxes[1].fp, boxes[1].listen).await);
    // The new primary takes as much past the fork as the old one's tail.
    fill(&c, cfg.tail_bytes / MIB, frame, Durability::Local, 1).await;
    drop(c);
    let t_rejoin = Instant::now();
    let said = command(
        "rejoin",
        &[
            boxes[0].primary_cfg().display().to_string(),
            boxes[1].listen.to_string(),
            boxes[1].fp.to_string(),
            boxes[0].metrics.to_string(),
        ],
        &log("rejoin"),
    );
    let rejoin_ms = ms(t_rejoin.elapsed());
    let f: Vec<&str> = said.split_whitespace().collect();
    let [fork, old_head, cut_bytes, saved_bytes, needs_snapshot] = f[..] else {
        panic!("rejoin said {said:?}");
    };
    let (fork, old_head): (u64, u64) =
        (fork.parse().expect("fork"), old_head.parse().expect("head"));
    let (cut_bytes, divergent): (u64, u64) = (
        cut_bytes.parse().expect("cut bytes"),
        saved_bytes.parse().expect("saved bytes"),
    );
    // A's log as the rejoin left it, weighed as the stream would ship it:
    // what a copy of the whole log would have moved.
    let log_bytes = stream_bytes(&dir.join("a"), 1, u64::MAX);
    let head = until("B's status", || pstatus(boxes[1].metrics)).await.head;
    let t_follow = Instant::now();
    boxes[0].serve(false);
    let caught = until("the rejoined twin catches up", || {
        tstatus(boxes[0].metrics).filter(|s| s.connected && s.head >= head)
    })
    .await;
    let catch_up_ms = ms(t_follow.elapsed());
    // What had to move: B's frames past the fork, as the stream ships them.
    let past_fork = stream_bytes(&dir.join("b"), fork + 1, caught.head);
    let moved = caught.received_bytes;
    let snapshot = caught.snapshots_installed > 0 || needs_snapshot == "true";
    eprintln!(
        "  fork {fork} (A's head was {old_head}): {divergent} B saved and {cut_bytes} B cut locally; {moved} B moved for {past_fork} B of frames past the fork; the log to the fork weighs {log_bytes} B"
    );
    Line::new(BENCH, "rejoin_1gib_bytes_moved", moved as f64, "bytes")
        .target(1.5 * divergent as f64)
        .lower_is_better()
        .num("ratio", moved as f64 / divergent as f64)
        .num("ratio_target", 1.5)
        .int("divergent_bytes", divergent)
        .int("cut_bytes", cut_bytes)
        .int("past_fork_bytes", past_fork)
        .int("frame_bytes", caught.frame_bytes_received)
        .num(
            "moved_over_past_fork",
            moved as f64 / past_fork.max(1) as f64,
        )
        .int("log_to_fork_bytes", log_bytes)
        .num("moved_over_log", moved as f64 / log_bytes as f64)
        .flag("snapshot", snapshot)
        .int("snapshots_installed", caught.snapshots_installed)
        .num("rejoin_ms", rejoin_ms)
        .num("catch_up_ms", catch_up_ms)
        .print();
    for b in &mut boxes {
        if let Some(d) = b.daemon.as_mut() {
            d.stop();
        }
    }
}

/// Appends per logical append: the wait from its first try to its
/// acknowledgement, and the redirects it followed.
struct Waits {
    waits: Mutex<Vec<(Instant, Duration)>>,
    redirects: std::sync::atomic::AtomicU64,
    stop: AtomicBool,
}

/// One closed-loop `twin` writer that follows the `Fenced` redirect.
async fn follow_writer(w: Arc<Waits>, admin: Arc<Identity>, fp: Fingerprint, addr: SocketAddr) {
    let (mut fp, mut addr) = (fp, addr);
    let blob = pattern(1024);
    let mut client = dial(&admin, fp, addr).await;
    while !w.stop.load(Ordering::SeqCst) {
        let began = Instant::now();
        loop {
            match client.append(KIND, b"", &blob, Durability::Twin).await {
                Ok((_, Durability::Twin)) => break,
                Ok((_, d)) => panic!("a twin append acknowledged {d:?}"),
                Err(ClientError::Api(ApiError::Fenced {
                    primary: Some(np), ..
                })) => {
                    fp = np.fingerprint.parse().expect("a fingerprint");
                    addr = np.addr.parse().expect("an address");
                    w.redirects.fetch_add(1, Ordering::SeqCst);
                    client = dial(&admin, fp, addr).await;
                }
                Err(e) => {
                    assert!(began.elapsed() < Duration::from_secs(30), "append: {e}");
                    client = dial(&admin, fp, addr).await;
                }
            }
        }
        w.waits.lock().expect("lock").push((began, began.elapsed()));
    }
}

async fn switchover_pause(cfg: &Config, dir: &Path) {
    eprintln!("switchover_pause_ms ...");
    let mut boxes = pair(dir);
    boxes[0].serve(true);
    boxes[1].serve(false);
    until("the twin follows", || {
        tstatus(boxes[1].metrics).filter(|s| s.connected)
    })
    .await;
    let w = Arc::new(Waits {
        waits: Mutex::default(),
        redirects: Default::default(),
        stop: AtomicBool::new(false),
    });
    let writer = tokio::spawn(follow_writer(
        w.clone(),
        boxes[0].admin(),
        boxes[0].fp,
        boxes[0].listen,
    ));
    let count = |w: &Waits| w.waits.lock().expect("lock").len();
    let mut worst = Vec::new();
    let mut ends = Vec::new();
    let mut p = 0usize;
    for i in 0..cfg.switchovers {
        let at = count(&w) + 200;
        until("appends before the switchover", || {
            (count(&w) >= at).then_some(())
        })
        .await;
        let t0 = Instant::now();
        let admin = daemon::load::admin_client(
            &PrimaryConfig::load(&boxes[p].primary_cfg()).expect("primary.toml"),
        )
        .await
        .expect("admin client");
        let (epoch, _, _) = admin
            .switchover(Duration::from_secs(5))
            .await
            .expect("switchover");
        drop(admin);
        let t = 1 - p;
        until("the new primary serves", || {
            pstatus(boxes[t].metrics).filter(|s| s.epoch == epoch)
        })
        .await;
        until("the old primary follows", || {
            tstatus(boxes[p].metrics).filter(|s| s.connected && s.epoch == epoch)
        })
        .await;
        let at = count(&w) + 200;
        until("appends after the switchover", || {
            (count(&w) >= at).then_some(())
        })
        .await;
        let longest = w
            .waits
            .lock()
            .expect("lock")
            .iter()
            .filter(|(began, _)| *began >= t0 - Duration::from_millis(50))
            .map(|(_, d)| *d)
            .max()
            .unwrap_or_default();
        eprintln!(
            "  switchover {} to {}: longest wait {:.0} ms",
            i + 1,
            if t == 0 { "a" } else { "b" },
            ms(longest)
        );
        worst.push(ms(longest));
        ends.push(ms(t0.elapsed()));
        p = t;
    }
    w.stop.store(true, Ordering::SeqCst);
    let _ = tokio::time::timeout(Duration::from_secs(10), writer).await;
    let mut all: Vec<f64> = w
        .waits
        .lock()
        .expect("lock")
        .iter()
        .map(|(_, d)| ms(*d))
        .collect();
    let p50 = median(&mut all);
    let max = worst.iter().copied().fold(0.0, f64::max);
    let mut sorted = worst.clone();
    Line::new(BENCH, "switchover_pause_ms", max, "ms")
        .target(1000.0)
        .lower_is_better()
        .num("median_switchover", median(&mut sorted))
        .int("switchovers", worst.len() as u64)
        .int("redirects", w.redirects.load(Ordering::SeqCst))
        .num("append_p50_ms", p50)
        .int("appends", all.len() as u64)
        .print();
    for b in &mut boxes {
        if let Some(d) = b.daemon.as_mut() {
            d.stop();
        }
    }
}

async fn restart_to_twin_ack(cfg: &Config, dir: &Path) {
    eprintln!("restart_to_twin_ack_ms ...");
    let mut boxes = pair(dir);
    boxes[0].serve(true);
    boxes[1].serve(false);
    let admin = boxes[0].admin();
    let (fp, addr) = (boxes[0].fp, boxes[0].listen);
    let mut totals = Vec::new();
    for round in 0..cfg.restart_rounds {
        until("the twin follows", || {
            tstatus(boxes[1].metrics).filter(|s| s.connected)
        })
        .await;
        twin_append(&admin, fp, addr, b"before the restart").await;
        let t0 = Instant::now();
        boxes[0].daemon().sigkill();
        boxes[0].serve(true);
        twin_append(&admin, fp, addr, b"after the restart").await;
        let total = ms(t0.elapsed());
        eprintln!("  round {}: {total:.0} ms", round + 1);
        totals.push(total);
    }
    let timers = daemon::config::TimersSection::default();
    let mut sorted = totals.clone();
    Line::new(BENCH, "restart_to_twin_ack_ms", median(&mut sorted), "ms")
        .target(500.0)
        .lower_is_better()
        .num("max", sorted[sorted.len() - 1])
        .num("min", sorted[0])
        .int("rounds", totals.len() as u64)
        .int("idle_timeout_ms", timers.idle_timeout_ms)
        .int("heartbeat_ms", timers.heartbeat_ms)
        .print();
    for b in &mut boxes {
        if let Some(d) = b.daemon.as_mut() {
            d.stop();
        }
    }
}
