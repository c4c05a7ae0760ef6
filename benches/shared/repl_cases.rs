//! The replication bench's pair of daemons and its cases, shared by
//! `benches/repl.rs` and `benches/peers.rs` (which runs some of the cases
//! beside PostgreSQL). See `benches/repl.rs` for what each case measures.

#![allow(dead_code)] // each bench runs its own cases

use super::common::*;

use std::collections::HashMap;
use std::fs::OpenOptions;
use std::net::SocketAddr;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use testkit::{free_tcp, free_udp};
use tokio::io::{AsyncRead, ReadBuf};
use tokio::task::JoinSet;
use twinlog::daemon::{self, PrimaryConfig, TwinConfig};
use twinlog::log::APP_KIND_FIRST;
use twinlog::net::{Fingerprint, Identity};
use twinlog::node::{Client, Durability, Status};

/// The `bench` field of every line this program prints.
pub(crate) const BENCH: &str = "repl";

/// The kind every frame of the bench carries.
pub(crate) const KIND: u16 = APP_KIND_FIRST;
/// The small frames' blob.
pub(crate) const SMALL: usize = 128;
/// Concurrent appenders of the `*_128b_c*` cases.
pub(crate) const CONCURRENCY: [usize; 3] = [1, 8, 64];
/// The `*_128b_c*` cases: name, durability, concurrent appenders.
pub(crate) const SMALL_CASES: [(&str, Durability, usize); 6] = [
    ("local_128b_c1", Durability::Local, 1),
    ("local_128b_c8", Durability::Local, 8),
    ("local_128b_c64", Durability::Local, 64),
    ("twin_128b_c1", Durability::Twin, 1),
    ("twin_128b_c8", Durability::Twin, 8),
    ("twin_128b_c64", Durability::Twin, 64),
];
/// QUIC connections the appenders share: one each up to this many tasks.
pub(crate) const CONNECTIONS: usize = 8;
/// Appenders of `bulk_frames_1mib`.
pub(crate) const BULK_TASKS: usize = 4;
/// Appenders of `catchup_1m_frames`.
const CATCHUP_TASKS: usize = 64;
/// `lag_*`: the total rate and the pacing tasks sharing it.
const LAG_RATE: u64 = 5_000;
const LAG_TASKS: u64 = 8;
/// `lag_*`: appends in flight per pacing task at most.
const LAG_MAX_IN_FLIGHT: usize = 256;
/// How often a wait polls the primary's status.
const POLL: Duration = Duration::from_millis(5);

/// Set in a daemon child: `primary` or `twin`.
pub(crate) const ROLE_ENV: &str = "TWINLOG_BENCH_DAEMON";
/// The daemon child's configuration file.
pub(crate) const CONFIG_ENV: &str = "TWINLOG_BENCH_CONFIG";

/// How big every case is: the full run or `--quick`.
pub(crate) struct Config {
    /// Each `*_128b_c*` case runs `rounds` rounds of `round`, the local and
    /// twin cases interleaved.
    round: Duration,
    rounds: u32,
    /// `raw_seq_write_1mib`, `bulk_frames_1mib` and `bulk_blob_1gib`.
    pub(crate) bulk_mib: u64,
    catchup_frames: u64,
    lag_run: Duration,
    /// `throughput_drift_10m`: how long the steady load runs, and the
    /// window whose rate is compared (the first against the last).
    drift_run: Duration,
    drift_window: Duration,
    /// Parts of case names to run; empty runs every case.
    filters: Vec<String>,
}

impl Config {
    pub(crate) fn new(quick: bool, filters: Vec<String>) -> Config {
        if quick {
            Config {
                round: Duration::from_millis(500),
                rounds: 2,
                bulk_mib: 128,
                catchup_frames: 100_000,
                lag_run: Duration::from_secs(2),
                drift_run: Duration::from_secs(60),
                drift_window: Duration::from_secs(6),
                filters,
            }
        } else {
            Config {
                round: Duration::from_secs(1),
                rounds: 3,
                bulk_mib: 1024,
                catchup_frames: 1_000_000,
                lag_run: Duration::from_secs(5),
                drift_run: Duration::from_secs(600),
                drift_window: Duration::from_secs(60),
                filters,
            }
        }
    }

    /// Whether any of `cases` is selected.
    pub(crate) fn runs(&self, cases: &[&str]) -> bool {
        self.filters.is_empty()
            || cases
                .iter()
                .any(|c| self.filters.iter().any(|f| c.contains(f.as_str())))
    }
}

/// A daemon child: serve until SIGTERM.
pub(crate) fn daemon_main(role: &str, config: &Path) {
    // Die with the bench, even SIGKILLed. The signal follows the thread
    // that spawned this process: the bench starts daemons only from its
    // main thread (`block_on` polls there), which lives to the end.
    // SAFETY: prctl with integer arguments only affects this process.
    unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) };
    daemon::allocator::tune();
    daemon::init_tracing(false);
    // `TWINLOG_BENCH_RT=pool` runs the daemons on a pool of workers, to
    // compare with the one thread they run on.
    let rt = match std::env::var("TWINLOG_BENCH_RT").as_deref() {
        Ok("pool") => tokio::runtime::Runtime::new(),
        _ => daemon::runtime::for_command(true),
    }
    .expect("a tokio runtime");
    let (primary, config) = (role == "primary", config.to_owned());
    let ran = daemon::runtime::block_on_workers(&rt, async move {
        let shutdown = daemon::shutdown_on_signals()?;
        if primary {
            daemon::serve_primary(PrimaryConfig::load(&config)?, shutdown).await
        } else {
            daemon::serve_twin(TwinConfig::load(&config)?, shutdown).await
        }
    });
    if let Err(e) = ran {
        eprintln!("{role}: {e}");
        std::process::exit(e.exit_code());
    }
}

/// A case's line with what the processes spent meanwhile.
pub(crate) trait WithUsage {
    fn usage(self, u: &Usage) -> Line;
}

impl WithUsage for Line {
    /// What the processes spent meanwhile.
    fn usage(self, u: &Usage) -> Line {
        self.num("cpu_primary", u.cores(0))
            .num("cpu_twin", u.cores(1))
            .num("cpu_bench", u.cores(2))
            .num("cpu_machine", u.cores(3))
            .int("cores", cores())
            .int("primary_fdatasyncs", u.syncs[0])
            .int("twin_fdatasyncs", u.syncs[1])
            .int("udp_datagrams", u.udp[0])
            .int("udp_drops", u.udp[1])
            .int("switches_primary", u.switches[0])
            .int("switches_twin", u.switches[1])
    }
}

/// The processors online.
pub(crate) fn cores() -> u64 {
    std::thread::available_parallelism().map_or(0, |n| n.get() as u64)
}

/// The `q` quantile of sorted samples, by nearest rank.
pub(crate) fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// A `/proc/<pid>/status` field in KiB (`VmRSS`, `VmHWM`).
pub(crate) fn vm_kib(pid: u32, field: &str) -> u64 {
    testkit::procfs::vm_kib(pid, field).unwrap_or_else(|e| panic!("{field}: {e}"))
}

/// Reset a process's VmHWM to its current RSS (Linux 4.0+); false where
/// refused.
pub(crate) fn reset_hwm(pid: u32) -> bool {
    std::fs::write(format!("/proc/{pid}/clear_refs"), "5").is_ok()
}

/// The nanoseconds each thread of a process has run, by thread id, from
/// `/proc/<pid>/task/*/schedstat`: exact, where the ticks of
/// `/proc/<pid>/stat` are samples (and a workload paced by a 1 ms timer runs
/// just when they sample it). Empty for a process that is gone.
pub(crate) fn thread_ns(pid: u32) -> HashMap<u64, u64> {
    per_thread(pid, "schedstat", |stat| {
        stat.split_whitespace().next()?.parse().ok()
    })
}

/// Context switches (voluntary and not) of each of a process's threads,
/// by thread id: `/proc/<pid>/status` counts the main thread's only.
pub(crate) fn thread_switches(pid: u32) -> HashMap<u64, u64> {
    per_thread(pid, "status", |status| {
        Some(
            status
                .lines()
                .filter(|l| l.contains("ctxt_switches:"))
                .filter_map(|l| l.split_whitespace().last()?.parse::<u64>().ok())
                .sum(),
        )
    })
}

/// A counter of each thread of `pid`, read from its `/proc/<pid>/task/*/
/// file` by `parse`. Empty for a process that is gone.
fn per_thread(pid: u32, file: &str, parse: impl Fn(&str) -> Option<u64>) -> HashMap<u64, u64> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return HashMap::new();
    };
    tasks
        .filter_map(|t| {
            let t = t.ok()?;
            let tid = t.file_name().to_str()?.parse().ok()?;
            parse(&std::fs::read_to_string(t.path().join(file)).ok()?).map(|n| (tid, n))
        })
        .collect()
}

/// How much the threads' counters grew from `before` to `after`: a thread
/// that ended meanwhile (tokio retires idle blocking threads after 10 s)
/// loses what it counted since `before`, never what the others did.
fn grew(before: &HashMap<u64, u64>, after: &HashMap<u64, u64>) -> u64 {
    after
        .iter()
        .map(|(tid, n)| n.saturating_sub(before.get(tid).copied().unwrap_or(0)))
        .sum()
}

/// CPU seconds a process's threads ran from `before` to `after`.
pub(crate) fn cpu_between(before: &HashMap<u64, u64>, after: &HashMap<u64, u64>) -> f64 {
    grew(before, after) as f64 / 1e9
}

/// The whole machine's idle CPU seconds (idle and iowait) from `/proc/stat`:
/// the kernel tracks them exactly on a tickless kernel, where its busy
/// fields are tick samples. Cores times wall time less these is what
/// everything ran, the kernel's writeback and journal threads included.
/// Core-seconds the whole machine is busy from its start on (the cores
/// times the wall time, less what they idled), as [`Usage`] counts it.
pub(crate) struct MachineBusy {
    at: Instant,
    idle: f64,
}

impl MachineBusy {
    pub(crate) fn start() -> MachineBusy {
        MachineBusy {
            at: Instant::now(),
            idle: machine_idle_secs(),
        }
    }

    pub(crate) fn secs(&self) -> f64 {
        let wall = self.at.elapsed().as_secs_f64();
        (cores() as f64 * wall - (machine_idle_secs() - self.idle)).max(0.0)
    }
}

pub(crate) fn machine_idle_secs() -> f64 {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let ticks: Vec<u64> = stat
        .lines()
        .next()
        .and_then(|l| l.strip_prefix("cpu "))
        .map(|l| {
            l.split_whitespace()
                .filter_map(|v| v.parse().ok())
                .collect()
        })
        .unwrap_or_default();
    // user nice system idle iowait ...
    let idle = ticks.get(3).copied().unwrap_or(0) + ticks.get(4).copied().unwrap_or(0);
    // SAFETY: sysconf takes an integer and reads no memory of ours.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    idle as f64 / hz
}

/// A daemon's `twinlog_frame_syncs_total`; 0 when it does not answer.
pub(crate) fn frame_syncs(metrics: SocketAddr) -> u64 {
    daemon::http::get(metrics, "/metrics")
        .ok()
        .and_then(|m| {
            m.lines().find_map(|l| {
                l.strip_prefix("twinlog_frame_syncs_total ")
                    .and_then(|v| v.trim().parse().ok())
            })
        })
        .unwrap_or(0)
}

/// The machine's UDP datagrams received and those dropped for a full
/// receive buffer (`/proc/net/snmp`): loopback loss that QUIC must recover.
pub(crate) fn udp_counters() -> [u64; 2] {
    let snmp = std::fs::read_to_string("/proc/net/snmp").unwrap_or_default();
    let mut rows = snmp.lines().filter(|l| l.starts_with("Udp:"));
    let (Some(names), Some(values)) = (rows.next(), rows.next()) else {
        return [0, 0];
    };
    let field = |name: &str| {
        names
            .split_whitespace()
            .position(|n| n == name)
            .and_then(|i| values.split_whitespace().nth(i))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    [field("InDatagrams"), field("RcvbufErrors")]
}

/// What the primary, the twin and this process spent from one [`Probe`] to
/// the next: CPU seconds (primary, twin, bench), frame syncs (primary,
/// twin) and UDP datagrams (received, dropped), summed over the rounds of a
/// case.
#[derive(Clone, Copy, Default)]
pub(crate) struct Usage {
    secs: f64,
    /// Primary, twin, bench, and the whole machine.
    cpu: [f64; 4],
    syncs: [u64; 2],
    udp: [u64; 2],
    /// Context switches of the primary's and the twin's threads.
    switches: [u64; 2],
}

impl Usage {
    pub(crate) fn cores(&self, i: usize) -> f64 {
        self.cpu[i] / self.secs
    }

    /// Core-seconds the whole machine was busy.
    pub(crate) fn machine_cpu_secs(&self) -> f64 {
        self.cpu[3]
    }

    /// Context switches of both daemons' threads, voluntary and not.
    pub(crate) fn daemon_switches(&self) -> u64 {
        self.switches[0] + self.switches[1]
    }

    pub(crate) fn add(&mut self, other: &Usage) {
        self.secs += other.secs;
        for i in 0..4 {
            self.cpu[i] += other.cpu[i];
        }
        for i in 0..2 {
            self.syncs[i] += other.syncs[i];
            self.udp[i] += other.udp[i];
            self.switches[i] += other.switches[i];
        }
    }
}

/// A snapshot of the counters [`Usage`] is the difference of.
pub(crate) struct Probe {
    at: Instant,
    /// The threads of the primary, the twin and the bench.
    threads: [HashMap<u64, u64>; 3],
    idle_secs: f64,
    syncs: [u64; 2],
    udp: [u64; 2],
    /// The threads' context switches of the primary and the twin.
    switches: [HashMap<u64, u64>; 2],
}

impl Probe {
    pub(crate) fn take(pair: &Pair) -> Probe {
        let threads = |d: &Daemon| d.pid().map(thread_ns).unwrap_or_default();
        Probe {
            at: Instant::now(),
            threads: [
                threads(&pair.primary),
                threads(&pair.twin),
                thread_ns(std::process::id()),
            ],
            idle_secs: machine_idle_secs(),
            syncs: [
                frame_syncs(pair.primary_metrics),
                frame_syncs(pair.twin_metrics),
            ],
            udp: udp_counters(),
            switches: [&pair.primary, &pair.twin]
                .map(|d| d.pid().map(thread_switches).unwrap_or_default()),
        }
    }

    pub(crate) fn since(&self, pair: &Pair) -> Usage {
        let now = Probe::take(pair);
        let secs = now.at.duration_since(self.at).as_secs_f64();
        let cpu = |i: usize| cpu_between(&self.threads[i], &now.threads[i]);
        Usage {
            secs,
            cpu: [
                cpu(0),
                cpu(1),
                cpu(2),
                (cores() as f64 * secs - (now.idle_secs - self.idle_secs)).max(0.0),
            ],
            udp: [0, 1].map(|i| now.udp[i].saturating_sub(self.udp[i])),
            switches: [0, 1].map(|i| grew(&self.switches[i], &now.switches[i])),
            // A restarted daemon counts from 0 again.
            syncs: [0, 1].map(|i| {
                now.syncs[i]
                    .checked_sub(self.syncs[i])
                    .unwrap_or(now.syncs[i])
            }),
        }
    }
}

/// A daemon child of this process. Dropped, it is SIGKILLed and reaped.
pub(crate) struct Daemon {
    role: &'static str,
    config: PathBuf,
    log: PathBuf,
    child: testkit::Guard,
    /// Set in its environment at each start.
    env: Vec<(&'static str, String)>,
}

impl Daemon {
    pub(crate) fn new(role: &'static str, config: PathBuf, log: PathBuf) -> Daemon {
        Daemon {
            role,
            config,
            log,
            child: testkit::Guard::default(),
            env: Vec::new(),
        }
    }

    pub(crate) fn start(&mut self) {
        assert!(!self.child.running(), "{} already runs", self.role);
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .expect("the daemon's log file");
        let child = Command::new(std::env::current_exe().expect("the bench's own path"))
            .env(ROLE_ENV, self.role)
            .env(CONFIG_ENV, &self.config)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn a daemon");
        self.child = testkit::Guard::new(child);
    }

    pub(crate) fn pid(&self) -> Option<u32> {
        self.child.pid()
    }

    /// SIGTERM, and wait for a clean shutdown (SIGKILL after 30 s).
    pub(crate) fn stop(&mut self) {
        match self.child.stop(Duration::from_secs(30)) {
            Ok(Some(status)) if !status.success() => {
                eprintln!("{} exited with {status}", self.role)
            }
            Ok(_) => {}
            Err(e) => eprintln!("{}: {e}: SIGKILLed", self.role),
        }
    }

    /// Panic, with the end of its log, if the daemon has exited.
    pub(crate) fn check_alive(&mut self) {
        if let Ok(Some(status)) = self.child.try_wait() {
            let log = std::fs::read_to_string(&self.log).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(20).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            panic!("{} exited with {status}:\n{}", self.role, tail.join("\n"));
        }
    }
}

/// A primary and its twin, initialized and pinned to each other, and the
/// admin identity `init` made for the primary.
pub(crate) struct Pair {
    primary: Daemon,
    twin: Daemon,
    listen: SocketAddr,
    primary_metrics: SocketAddr,
    twin_metrics: SocketAddr,
    primary_fp: Fingerprint,
    admin: Identity,
}

impl Pair {
    /// `init` both, pin each on the other, start both.
    pub(crate) fn init(dir: &Path) -> Pair {
        Self::init_with(dir, |_, _| {})
    }

    /// [`Pair::init`], `tweak` given the primary's and the twin's
    /// configuration files before they start.
    pub(crate) fn init_with(dir: &Path, tweak: impl FnOnce(&Path, &Path)) -> Pair {
        let (pdir, tdir) = (dir.join("primary"), dir.join("twin"));
        let listen = free_udp();
        let (primary_metrics, twin_metrics) = (free_tcp(), free_tcp());
        let (tcfg, twin_fp) =
            daemon::init_twin(&tdir, listen, twin_metrics, None).expect("twin init");
        let (pcfg, primary_fp) =
            daemon::init_primary(&pdir, listen, primary_metrics, Some(twin_fp))
                .expect("primary init");
        daemon::pin_primary(&tcfg, primary_fp).expect("pin the primary on the twin");
        tweak(&pcfg, &tcfg);
        let admin =
            daemon::load_identity(&pdir.join(daemon::ADMIN_DIR)).expect("the admin identity");
        let mut pair = Pair {
            primary: Daemon::new("primary", pcfg, dir.join("primary.log")),
            twin: Daemon::new("twin", tcfg, dir.join("twin.log")),
            listen,
            primary_metrics,
            twin_metrics,
            primary_fp,
            admin,
        };
        pair.primary.start();
        pair.twin.start();
        pair
    }

    /// Stop both daemons and start them again with `key` set to `value`
    /// in their environment (`None`: not set).
    pub(crate) fn restart_with_env(&mut self, key: &'static str, value: Option<String>) {
        self.stop();
        for d in [&mut self.primary, &mut self.twin] {
            d.env.retain(|(k, _)| *k != key);
            if let Some(v) = &value {
                d.env.push((key, v.clone()));
            }
            d.start();
        }
    }

    /// A client connected to the primary, retried while it starts.
    pub(crate) async fn client(&mut self) -> Client {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let dialed = tokio::time::timeout(
                Duration::from_secs(2),
                Client::connect(&self.admin, self.primary_fp, self.listen),
            )
            .await;
            match dialed {
                Ok(Ok(c)) => return c,
                _ if Instant::now() < deadline => {
                    self.primary.check_alive();
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Ok(Err(e)) => panic!("no connection to the primary: {e}"),
                Err(_) => panic!("no connection to the primary in 30 s"),
            }
        }
    }

    /// `CONNECTIONS` clients, each on its own QUIC connection.
    pub(crate) async fn clients(&mut self) -> Vec<Arc<Client>> {
        let mut out = Vec::new();
        for _ in 0..CONNECTIONS {
            out.push(Arc::new(self.client().await));
        }
        out
    }

    /// Poll the primary's status until `done` says so; answers it. Panics
    /// after `limit`, or if a daemon exits.
    pub(crate) async fn wait_status(
        &mut self,
        client: &Client,
        limit: Duration,
        what: &str,
        done: impl Fn(&Status) -> bool,
    ) -> Status {
        let deadline = Instant::now() + limit;
        loop {
            let s = client.status().await.expect("the primary's status");
            if done(&s) {
                return s;
            }
            assert!(
                Instant::now() < deadline,
                "{what}: not reached in {limit:?}: {s:?}"
            );
            self.primary.check_alive();
            self.twin.check_alive();
            tokio::time::sleep(POLL).await;
        }
    }

    /// Wait until the twin streams and has acknowledged the primary's head.
    pub(crate) async fn converged(&mut self, client: &Client, limit: Duration) -> Status {
        self.wait_status(client, limit, "the twin catching up", |s| {
            s.twin_connected && s.twin_acked >= s.head
        })
        .await
    }

    pub(crate) fn stop(&mut self) {
        self.primary.stop();
        self.twin.stop();
    }

    /// The twin's status, from its `/status`.
    pub(crate) fn twin_status(&self) -> Option<twinlog::node::TwinStatus> {
        daemon::fetch_status::<twinlog::node::TwinStatus>(self.twin_metrics)
            .ok()
            .map(|(_, s)| s)
    }
}

/// A blob of a repeating pattern, produced as it is read: memory is one
/// block whatever the length.
pub(crate) struct PatternReader {
    block: Vec<u8>,
    pos: u64,
    len: u64,
}

impl PatternReader {
    pub(crate) fn new(len: u64) -> PatternReader {
        PatternReader {
            block: pattern(MIB as usize + 1),
            pos: 0,
            len,
        }
    }
}

impl AsyncRead for PatternReader {
    fn poll_read(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        // The block is one byte longer than MiB: consecutive MiB differ.
        let block_len = self.block.len() as u64;
        while buf.remaining() > 0 && self.pos < self.len {
            let at = (self.pos % block_len) as usize;
            let n = (self.block.len() - at)
                .min(buf.remaining())
                .min((self.len - self.pos) as usize);
            buf.put_slice(&self.block[at..at + n]);
            self.pos += n as u64;
        }
        Poll::Ready(Ok(()))
    }
}

/// Appends, time and usage summed over the rounds of one `*_128b_c*` case.
#[derive(Default)]
pub(crate) struct Tally {
    appends: u64,
    secs: f64,
    usage: Usage,
}

impl Tally {
    pub(crate) fn rate(&self) -> f64 {
        self.appends as f64 / self.secs
    }
}

/// `tasks` appenders of 128-byte blobs at `durability` on the clients (one
/// connection each up to `CONNECTIONS`, shared beyond) for `run`; answers
/// the appends acknowledged and the seconds until the last was.
pub(crate) async fn append_round(
    clients: &[Arc<Client>],
    tasks: usize,
    durability: Durability,
    run: Duration,
) -> (u64, f64) {
    let stop = Arc::new(AtomicBool::new(false));
    let mut set = JoinSet::new();
    let t = Instant::now();
    for i in 0..tasks {
        let client = clients[i % clients.len().min(tasks)].clone();
        let stop = stop.clone();
        set.spawn(async move {
            let blob = pattern(SMALL);
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                client
                    .append(KIND, &[], &blob, durability)
                    .await
                    .expect("append");
                n += 1;
            }
            n
        });
    }
    tokio::time::sleep(run).await;
    stop.store(true, Ordering::Relaxed);
    let appends = set.join_all().await.into_iter().sum();
    (appends, t.elapsed().as_secs_f64())
}

/// `CONNECTIONS` closed-loop appenders of `twin` 128-byte frames for `run`:
/// each append's latency in microseconds.
pub(crate) async fn timed_appends(clients: &[Arc<Client>], run: Duration) -> Vec<f64> {
    let stop = Arc::new(AtomicBool::new(false));
    let mut set = JoinSet::new();
    for client in clients.iter().take(CONNECTIONS) {
        let (client, stop) = (client.clone(), stop.clone());
        set.spawn(async move {
            let blob = pattern(SMALL);
            let mut took = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                let t = Instant::now();
                client
                    .append(KIND, &[], &blob, Durability::Twin)
                    .await
                    .expect("append");
                took.push(t.elapsed().as_secs_f64() * 1e6);
            }
            took
        });
    }
    tokio::time::sleep(run).await;
    stop.store(true, Ordering::Relaxed);
    set.join_all().await.into_iter().flatten().collect()
}

/// The announced size of the stalled client's append.
const STALLED_BODY: u64 = 64 << 20;

/// Hold a `STALLED_BODY` append stalled after 1,000 bytes until `stop`,
/// starting another each time the primary cuts one off; answers how many
/// were cut off (each must end in `BodyStalled`).
pub(crate) async fn hold_stalled(conn: quinn::Connection, stop: Arc<AtomicBool>) -> u64 {
    use twinlog::node::api::ApiError;
    use twinlog::node::{Request, Response};
    let mut cut_off = 0;
    while !stop.load(Ordering::Relaxed) {
        let (mut tx, mut rx) = conn.open_bi().await.expect("a stream");
        let req = Request::Append {
            kind: KIND,
            meta: b"stalled".to_vec(),
            blob_len: STALLED_BODY,
            durability: Durability::Twin,
            once: None,
        };
        twinlog::net::write_msg(&mut tx, &req)
            .await
            .expect("the request");
        tx.write_all(&[7u8; 1000]).await.expect("1,000 bytes");
        loop {
            let answer =
                tokio::time::timeout(POLL, twinlog::net::read_msg::<Response>(&mut rx)).await;
            match answer {
                Err(_) if stop.load(Ordering::Relaxed) => {
                    let _ = tx.reset(0u32.into());
                    return cut_off;
                }
                Err(_) => continue,
                Ok(Ok(Some(Response::Error(ApiError::BodyStalled { .. })))) => {
                    cut_off += 1;
                    break;
                }
                Ok(other) => panic!("a stalled append answered {other:?}"),
            }
        }
    }
    cut_off
}

/// Append `frames` frames of `blob` at Local durability from `tasks`
/// appenders on the clients; answers the highest sequence.
pub(crate) async fn append_frames(
    clients: &[Arc<Client>],
    tasks: usize,
    frames: u64,
    blob: Arc<Vec<u8>>,
) -> u64 {
    let next = Arc::new(AtomicU64::new(0));
    let mut set = JoinSet::new();
    for i in 0..tasks {
        let (client, next, blob) = (
            clients[i % clients.len()].clone(),
            next.clone(),
            blob.clone(),
        );
        set.spawn(async move {
            let mut last = 0;
            while next.fetch_add(1, Ordering::Relaxed) < frames {
                let (seq, _) = client
                    .append(KIND, &[], &blob, Durability::Local)
                    .await
                    .expect("append");
                last = last.max(seq);
            }
            last
        });
    }
    set.join_all().await.into_iter().max().unwrap_or(0)
}

/// One `lag_*` pacing task: an append with twin durability spawned every
/// `period` on `client` (open loop: a slow ack never delays the next send),
/// until `run` has passed. Answers each ack's `twin_wait` and the client's
/// round trip, in µs.
pub(crate) async fn paced_appends(
    client: Arc<Client>,
    period: Duration,
    run: Duration,
) -> Vec<(f64, f64)> {
    let mut tick = tokio::time::interval(period);
    // Burst: tokio's timer has a 1 ms resolution, so Delay or Skip would
    // send fewer than asked at a 1.6 ms period; the schedule stays absolute.
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let started = Instant::now();
    let mut set = JoinSet::new();
    let mut out = Vec::new();
    while started.elapsed() < run {
        tick.tick().await;
        while set.len() >= LAG_MAX_IN_FLIGHT {
            out.push(
                set.join_next()
                    .await
                    .expect("in flight")
                    .expect("append task"),
            );
        }
        let client = client.clone();
        set.spawn(async move {
            let t = Instant::now();
            let a = client
                .append_timed(KIND, &[], &pattern(SMALL), Durability::Twin)
                .await
                .expect("twin append");
            assert_eq!(a.durability, Durability::Twin, "acknowledged as local");
            (
                a.twin_wait.as_secs_f64() * 1e6,
                t.elapsed().as_secs_f64() * 1e6,
            )
        });
    }
    out.extend(set.join_all().await);
    out
}

pub(crate) struct Bench {
    pub(crate) cfg: Config,
    pub(crate) root: PathBuf,
}

impl Bench {
    /// Run one case, with progress on stderr; dirty data of earlier cases is
    /// flushed first.
    pub(crate) fn case<T>(&self, name: &str, f: impl FnOnce() -> T) -> T {
        eprintln!("{name} ...");
        self.syncfs();
        let t = Instant::now();
        let value = f();
        eprintln!("{name}: {:.1} s", t.elapsed().as_secs_f64());
        value
    }

    pub(crate) fn syncfs(&self) {
        syncfs(&self.root);
    }

    pub(crate) fn warm_page_cache(&self, bytes: u64) {
        warm_page_cache(&self.root, bytes);
    }

    /// The device: 1 MiB sequential writes into a preallocated file, one
    /// fdatasync at the end.
    pub(crate) fn raw_seq_write_1mib(&self) -> Line {
        let name = "raw_seq_write_1mib";
        let total = self.cfg.bulk_mib * MIB;
        let path = self.root.join("raw");
        let f = preallocated(&path, total);
        let buf = pattern(MIB as usize);
        self.warm_page_cache(total);
        let t = Instant::now();
        for i in 0..self.cfg.bulk_mib {
            f.write_all_at(&buf, i * MIB).expect("pwrite");
        }
        f.sync_data().expect("fdatasync");
        let secs = t.elapsed().as_secs_f64();
        drop(f);
        std::fs::remove_file(&path).expect("remove the raw file");
        Line::new(BENCH, name, mib_per_s(total, secs), "MiB/s")
            .int("mib", self.cfg.bulk_mib)
            .num("secs", secs)
    }

    /// Every case against the running pair, in order, each line printed
    /// once its value is known.
    pub(crate) async fn replicated(&self, pair: &mut Pair, raw_seq: f64) {
        let clients = pair.clients().await;
        let status = pair.converged(&clients[0], Duration::from_secs(30)).await;
        eprintln!(
            "pair up: head {}, primary pid {:?}, twin pid {:?}",
            status.head,
            pair.primary.pid(),
            pair.twin.pid()
        );
        let cfg = &self.cfg;

        if cfg.runs(&SMALL_CASES.map(|c| c.0)) {
            eprintln!("128b rounds ...");
            self.syncfs();
            let (local, twin) = self.small_appends(pair, &clients).await;
            for (i, &tasks) in CONCURRENCY.iter().enumerate() {
                self.small_line(Durability::Local, tasks, &local[i], None)
                    .print();
            }
            for (i, &tasks) in CONCURRENCY.iter().enumerate() {
                self.small_line(Durability::Twin, tasks, &twin[i], Some(&local[i]))
                    .print();
            }
        }
        if cfg.runs(&["bulk_frames_1mib"]) {
            eprintln!("bulk_frames_1mib ...");
            self.bulk_frames(pair, &clients, raw_seq).await.print();
        }
        if cfg.runs(&[
            "bulk_blob_1gib",
            "rss_primary_blob_1gib",
            "rss_twin_blob_1gib",
        ]) {
            eprintln!("bulk_blob_1gib ...");
            for line in self.bulk_blob(pair, &clients, raw_seq).await {
                line.print();
            }
        }
        if cfg.runs(&["twin_128b_c8_verifying"]) {
            eprintln!("twin_128b_c8_verifying ...");
            self.verifying(pair, &clients).await.print();
        }
        if cfg.runs(&["catchup_1m_frames"]) {
            eprintln!("catchup_1m_frames ...");
            self.catchup(pair, &clients).await.print();
        }
        if cfg.runs(&["lag_p50_us", "lag_p99_us"]) {
            eprintln!("lag ...");
            for line in self.lag(pair, &clients).await {
                line.print();
            }
        }
        if cfg.runs(&["p99_append_us", "p99_append_us_with_stalled_client"]) {
            eprintln!("p99_append_us ...");
            for line in self.stalled_client(pair, &clients).await {
                line.print();
            }
        }
        if cfg.runs(&["throughput_drift_10m"]) {
            eprintln!("throughput_drift_10m ...");
            self.drift(pair, &clients).await.print();
        }
    }

    /// `twin_128b_c8_verifying`: what `primary verify` costs the hot path.
    /// Rounds of eight `twin` appenders alternate between a quiet pair and
    /// one verifying its whole log over and over (each box digesting at
    /// the verify's pace); the rate while verifying over the quiet rate.
    /// The log holds what the cases before wrote (the bulk cases' frames
    /// when they ran), at least `bulk_mib` MiB of them here.
    pub(crate) async fn verifying(&self, pair: &mut Pair, clients: &[Arc<Client>]) -> Line {
        let head = pair.converged(&clients[0], Duration::from_secs(60)).await;
        if head.log_bytes < self.cfg.bulk_mib * MIB / 2 {
            let blob = Arc::new(pattern(MIB as usize));
            let last = append_frames(clients, BULK_TASKS, self.cfg.bulk_mib, blob).await;
            pair.wait_status(
                &clients[0],
                Duration::from_secs(120),
                "the fill on the twin",
                |s| s.twin_acked >= last,
            )
            .await;
        }
        self.syncfs();
        // A whole log's verify at its pace takes longer than a client's
        // default deadline.
        let verifying_client = Arc::new(
            Client::connect_with(
                &pair.admin,
                pair.primary_fp,
                pair.listen,
                twinlog::node::ClientOptions {
                    deadline: Duration::from_secs(600),
                },
            )
            .await
            .expect("the verifying client"),
        );
        let (mut quiet, mut busy) = (Tally::default(), Tally::default());
        let (mut verifies, mut verified_bytes, mut verifying_secs) = (0u64, 0u64, 0f64);
        for _ in 0..self.cfg.rounds {
            let (appends, secs) =
                append_round(clients, CONCURRENCY[1], Durability::Twin, self.cfg.round).await;
            quiet.appends += appends;
            quiet.secs += secs;
            let stop = Arc::new(AtomicBool::new(false));
            let verifier = {
                let (client, stop) = (verifying_client.clone(), stop.clone());
                tokio::spawn(async move {
                    let (mut n, mut bytes, started) = (0u64, 0u64, Instant::now());
                    while !stop.load(Ordering::Relaxed) {
                        let r = client.verify(0, 0, 0).await.expect("verify");
                        assert_eq!(r.first_difference, None, "{r:?}");
                        n += 1;
                        bytes += r.bytes;
                    }
                    (n, bytes, started.elapsed().as_secs_f64())
                })
            };
            let probe = Probe::take(pair);
            let (appends, secs) =
                append_round(clients, CONCURRENCY[1], Durability::Twin, self.cfg.round).await;
            busy.usage.add(&probe.since(pair));
            busy.appends += appends;
            busy.secs += secs;
            stop.store(true, Ordering::Relaxed);
            let (n, bytes, secs) = verifier.await.expect("the verifier");
            verifies += n;
            verified_bytes += bytes;
            verifying_secs += secs;
            pair.converged(&clients[0], Duration::from_secs(60)).await;
        }
        Line::new(BENCH, "twin_128b_c8_verifying", busy.rate(), "appends/s")
            .baseline("twin_128b_c8_quiet", quiet.rate())
            .target(0.8)
            .int("verifies", verifies)
            .num("verified_mib", verified_bytes as f64 / MIB as f64)
            .num(
                "verify_mib_per_s",
                verified_bytes as f64 / MIB as f64 / verifying_secs.max(1e-9),
            )
            .int(
                "verify_pace_mib_per_s",
                u64::from(twinlog::node::verify::VERIFY_MIB_PER_S),
            )
            .usage(&busy.usage)
    }

    /// `throughput_drift_10m`: a steady closed loop of `CONNECTIONS`
    /// clients appending 128-byte frames with twin durability; the appends
    /// per second of the last window over those of the first. A log, a
    /// store or a page cache that slows as it grows shows as a ratio
    /// under 1.
    pub(crate) async fn drift(&self, pair: &mut Pair, clients: &[Arc<Client>]) -> Line {
        self.syncfs();
        let (run, window) = (self.cfg.drift_run, self.cfg.drift_window);
        let stop = Arc::new(AtomicBool::new(false));
        let acked = Arc::new(AtomicU64::new(0));
        let mut set = JoinSet::new();
        for client in clients.iter().take(CONNECTIONS) {
            let (client, stop, acked) = (client.clone(), stop.clone(), acked.clone());
            set.spawn(async move {
                let blob = pattern(SMALL);
                while !stop.load(Ordering::Relaxed) {
                    client
                        .append(KIND, &[], &blob, Durability::Twin)
                        .await
                        .expect("append");
                    acked.fetch_add(1, Ordering::Relaxed);
                }
            });
        }
        let probe = Probe::take(pair);
        let started = Instant::now();
        let mut rates = Vec::new();
        let (mut last_n, mut last_t) = (acked.load(Ordering::Relaxed), Instant::now());
        let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + window, window);
        while started.elapsed() + window / 2 < run {
            tick.tick().await;
            let (n, t) = (acked.load(Ordering::Relaxed), Instant::now());
            rates.push((n - last_n) as f64 / t.duration_since(last_t).as_secs_f64());
            (last_n, last_t) = (n, t);
            pair.primary.check_alive();
            pair.twin.check_alive();
        }
        stop.store(true, Ordering::Relaxed);
        set.join_all().await;
        let usage = probe.since(pair);
        let (first, last) = (rates[0], rates[rates.len() - 1]);
        let mut sorted = rates.clone();
        sorted.sort_by(|a, b| a.total_cmp(b));
        Line::new(BENCH, "throughput_drift_10m", last / first, "ratio")
            .target(0.9)
            .num("first_window_appends_per_s", first)
            .num("last_window_appends_per_s", last)
            .num("min_window_appends_per_s", sorted[0])
            .num("max_window_appends_per_s", sorted[sorted.len() - 1])
            .int("windows", rates.len() as u64)
            .num("window_secs", window.as_secs_f64())
            .int("tasks", CONNECTIONS as u64)
            .int("appends", acked.load(Ordering::Relaxed))
            .usage(&usage)
    }

    /// `p99_append_us` and `p99_append_us_with_stalled_client`: the p99 of
    /// `twin` appends from `CONNECTIONS` closed-loop clients, alone and
    /// while one more client holds a 64 MiB streamed append stalled after
    /// 1,000 bytes (stalling again each time the primary cuts it off).
    /// Rounds alternate between the two, so drift lands on both alike.
    pub(crate) async fn stalled_client(
        &self,
        pair: &mut Pair,
        clients: &[Arc<Client>],
    ) -> [Line; 2] {
        pair.converged(&clients[0], Duration::from_secs(60)).await;
        self.syncfs();
        let pins =
            Arc::new(twinlog::net::Pins::new().pin(pair.primary_fp, twinlog::net::Role::Primary));
        let endpoint = twinlog::net::client(&pair.admin, pins).expect("an endpoint");
        let conn = twinlog::net::connect(&endpoint, pair.listen)
            .await
            .expect("the stalling client's connection");
        let (mut calm, mut stalled) = (Vec::new(), Vec::new());
        let (mut calm_usage, mut stalled_usage) = (Usage::default(), Usage::default());
        let mut cut_off = 0;
        for _ in 0..self.cfg.rounds {
            let probe = Probe::take(pair);
            calm.extend(timed_appends(clients, self.cfg.round).await);
            calm_usage.add(&probe.since(pair));
            pair.converged(&clients[0], Duration::from_secs(60)).await;

            let stop = Arc::new(AtomicBool::new(false));
            let staller = tokio::spawn(hold_stalled(conn.clone(), stop.clone()));
            pair.wait_status(
                &clients[0],
                Duration::from_secs(10),
                "a stalled body staged",
                |s| s.staging_held > 0,
            )
            .await;
            let probe = Probe::take(pair);
            stalled.extend(timed_appends(clients, self.cfg.round).await);
            stalled_usage.add(&probe.since(pair));
            stop.store(true, Ordering::Relaxed);
            cut_off += staller.await.expect("the stalling client");
            pair.converged(&clients[0], Duration::from_secs(60)).await;
        }
        let head = pair
            .wait_status(&clients[0], Duration::from_secs(10), "status", |_| true)
            .await
            .head;
        calm.sort_by(f64::total_cmp);
        stalled.sort_by(f64::total_cmp);
        let calm_p99 = quantile(&calm, 0.99);
        let line = |name: &str, v: &[f64], usage: &Usage| {
            Line::new(BENCH, name, quantile(v, 0.99), "us")
                .lower_is_better()
                .int("samples", v.len() as u64)
                .num("p50_us", quantile(v, 0.5))
                .num("max_us", v.last().copied().unwrap_or(f64::NAN))
                .int("tasks", CONNECTIONS as u64)
                .usage(usage)
        };
        [
            line("p99_append_us", &calm, &calm_usage),
            line(
                "p99_append_us_with_stalled_client",
                &stalled,
                &stalled_usage,
            )
            .baseline("p99_append_us", calm_p99)
            .target(1.5)
            .int("stalled_body_bytes", STALLED_BODY)
            .int("stalls_cut_off", cut_off)
            .int("head", head),
        ]
    }

    /// `local_128b_c*` and `twin_128b_c*`: `rounds` rounds, each running
    /// every concurrency local then twin, so drift lands on both alike.
    pub(crate) async fn small_appends(
        &self,
        pair: &mut Pair,
        clients: &[Arc<Client>],
    ) -> ([Tally; 3], [Tally; 3]) {
        // Warm the connections and both logs.
        append_round(clients, CONNECTIONS, Durability::Twin, self.cfg.round / 4).await;
        let mut local: [Tally; 3] = Default::default();
        let mut twin: [Tally; 3] = Default::default();
        for r in 0..self.cfg.rounds {
            for (i, &tasks) in CONCURRENCY.iter().enumerate() {
                for (d, tally) in [
                    (Durability::Local, &mut local[i]),
                    (Durability::Twin, &mut twin[i]),
                ] {
                    let probe = Probe::take(pair);
                    let (appends, secs) = append_round(clients, tasks, d, self.cfg.round).await;
                    tally.usage.add(&probe.since(pair));
                    tally.appends += appends;
                    tally.secs += secs;
                    // The twin's backlog of local appends, off the next round.
                    pair.converged(&clients[0], Duration::from_secs(60)).await;
                }
            }
            eprintln!("  round {}/{}", r + 1, self.cfg.rounds);
        }
        (local, twin)
    }

    pub(crate) fn small_line(
        &self,
        durability: Durability,
        tasks: usize,
        t: &Tally,
        local: Option<&Tally>,
    ) -> Line {
        let name = |d: Durability| {
            SMALL_CASES
                .iter()
                .find(|c| c.1 == d && c.2 == tasks)
                .map(|c| c.0)
                .unwrap_or_else(|| unreachable!("no case {d:?} at {tasks}"))
        };
        let mut line = Line::new(BENCH, name(durability), t.rate(), "appends/s");
        if let Some(local) = local {
            line = line.baseline(name(Durability::Local), local.rate());
            if tasks > 1 {
                line = line.target(0.7);
            }
        }
        line.int("tasks", tasks as u64)
            .int("connections", tasks.min(CONNECTIONS) as u64)
            .int("appends", t.appends)
            .num("secs", t.secs)
            .int("rounds", u64::from(self.cfg.rounds))
            .num(
                "appends_per_primary_fdatasync",
                t.appends as f64 / t.usage.syncs[0] as f64,
            )
            .num(
                "cpu_us_per_append",
                t.usage.machine_cpu_secs() * 1e6 / t.appends.max(1) as f64,
            )
            .num(
                "switches_per_append",
                t.usage.daemon_switches() as f64 / t.appends.max(1) as f64,
            )
            .usage(&t.usage)
    }

    /// `bulk_frames_1mib`: 1 MiB frames appended locally by a few tasks,
    /// timed until the twin has acknowledged the last.
    pub(crate) async fn bulk_frames(
        &self,
        pair: &mut Pair,
        clients: &[Arc<Client>],
        raw_seq: f64,
    ) -> Line {
        let frames = self.cfg.bulk_mib;
        let total = frames * MIB;
        self.syncfs();
        // Both logs write it.
        self.warm_page_cache(2 * total);
        let blob = Arc::new(pattern(MIB as usize));
        let probe = Probe::take(pair);
        let t = Instant::now();
        let last = append_frames(clients, BULK_TASKS, frames, blob).await;
        let appended = t.elapsed().as_secs_f64();
        let limit = Duration::from_secs(120);
        pair.wait_status(&clients[0], limit, "bulk frames on the twin", |s| {
            s.twin_acked >= last
        })
        .await;
        let secs = t.elapsed().as_secs_f64();
        let usage = probe.since(pair);
        Line::new(BENCH, "bulk_frames_1mib", mib_per_s(total, secs), "MiB/s")
            .baseline("raw_seq_write_1mib", raw_seq)
            .target(0.5)
            .int("frames", frames)
            .int("tasks", BULK_TASKS as u64)
            .num("secs", secs)
            .num("local_mib_per_s", mib_per_s(total, appended))
            .num("twin_behind_secs", secs - appended)
            .usage(&usage)
    }

    /// `bulk_blob_1gib` and the daemons' peak RSS meanwhile: one blob
    /// streamed from a reader with twin durability. A watcher notes when the
    /// primary's head passes the blob (durable there) to split the time.
    pub(crate) async fn bulk_blob(
        &self,
        pair: &mut Pair,
        clients: &[Arc<Client>],
        raw_seq: f64,
    ) -> [Line; 3] {
        let len = self.cfg.bulk_mib * MIB;
        pair.converged(&clients[0], Duration::from_secs(60)).await;
        self.syncfs();
        self.warm_page_cache(2 * len);
        let (ppid, tpid) = (
            pair.primary.pid().expect("primary runs"),
            pair.twin.pid().expect("twin runs"),
        );
        let rss_before = [ppid, tpid].map(|p| vm_kib(p, "VmRSS"));
        let reset = [ppid, tpid].map(reset_hwm);
        let head_before = clients[0].status().await.expect("status").head;
        let watcher = {
            let client = clients[1].clone();
            tokio::spawn(async move {
                let t = Instant::now();
                loop {
                    let s = client.status().await.expect("status");
                    if s.head > head_before {
                        return t.elapsed().as_secs_f64();
                    }
                    tokio::time::sleep(POLL).await;
                }
            })
        };
        let probe = Probe::take(pair);
        let t = Instant::now();
        let a = clients[0]
            .append_reader(KIND, &[], len, PatternReader::new(len), Durability::Twin)
            .await
            .expect("the blob's append");
        let secs = t.elapsed().as_secs_f64();
        let usage = probe.since(pair);
        let hwm = [ppid, tpid].map(|p| vm_kib(p, "VmHWM"));
        let local_secs = watcher.await.expect("the watcher");
        assert_eq!(a.durability, Durability::Twin, "acknowledged as local");
        let blob = Line::new(BENCH, "bulk_blob_1gib", mib_per_s(len, secs), "MiB/s")
            .baseline("raw_seq_write_1mib", raw_seq)
            .target(0.5)
            .int("mib", self.cfg.bulk_mib)
            .num("secs", secs)
            .num("primary_durable_secs", local_secs)
            .num("twin_wait_secs", a.twin_wait.as_secs_f64())
            .usage(&usage);
        let rss = |i: usize, name: &str| {
            Line::new(BENCH, name, hwm[i] as f64 / 1024.0, "MiB")
                .target(64.0)
                .lower_is_better()
                .int("blob_mib", self.cfg.bulk_mib)
                .num("rss_before_mib", rss_before[i] as f64 / 1024.0)
                .flag("hwm_reset", reset[i])
        };
        [
            blob,
            rss(0, "rss_primary_blob_1gib"),
            rss(1, "rss_twin_blob_1gib"),
        ]
    }

    /// `catchup_1m_frames`: the twin stopped while small frames pile up on
    /// the primary; timed from its start until it has acknowledged them all.
    pub(crate) async fn catchup(&self, pair: &mut Pair, clients: &[Arc<Client>]) -> Line {
        let frames = self.cfg.catchup_frames;
        pair.converged(&clients[0], Duration::from_secs(60)).await;
        pair.twin.stop();
        let acked_before = clients[0].status().await.expect("status").twin_acked;
        let t = Instant::now();
        let blob = Arc::new(pattern(SMALL));
        let last = append_frames(clients, CATCHUP_TASKS, frames, blob).await;
        let append_secs = t.elapsed().as_secs_f64();
        eprintln!("  {frames} frames appended in {append_secs:.1} s; starting the twin");
        self.syncfs();
        pair.twin.start();
        eprintln!("  twin pid {:?}", pair.twin.pid());
        let probe = Probe::take(pair);
        let t = Instant::now();
        let limit = Duration::from_secs(600);
        let s = pair.converged(&clients[0], limit).await;
        let secs = t.elapsed().as_secs_f64();
        let usage = probe.since(pair);
        assert!(s.head >= last, "the head {} is behind {last}", s.head);
        let behind = s.head - acked_before;
        Line::new(BENCH, "catchup_1m_frames", behind as f64 / secs, "frames/s")
            .int("frames", behind)
            .num("secs", secs)
            .num("append_frames_per_s", frames as f64 / append_secs)
            .usage(&usage)
    }

    /// `lag_p50_us` and `lag_p99_us`: twin appends paced at `LAG_RATE` in
    /// all; each ack's `twin_wait` is a sample.
    pub(crate) async fn lag(&self, pair: &mut Pair, clients: &[Arc<Client>]) -> [Line; 2] {
        pair.converged(&clients[0], Duration::from_secs(60)).await;
        self.syncfs();
        let period = Duration::from_nanos(1_000_000_000 * LAG_TASKS / LAG_RATE);
        let run = self.cfg.lag_run;
        let probe = Probe::take(pair);
        let t = Instant::now();
        let mut set = JoinSet::new();
        for i in 0..LAG_TASKS as usize {
            set.spawn(paced_appends(
                clients[i % clients.len()].clone(),
                period,
                run,
            ));
        }
        let samples: Vec<(f64, f64)> = set.join_all().await.into_iter().flatten().collect();
        let secs = t.elapsed().as_secs_f64();
        let usage = probe.since(pair);
        let mut wait: Vec<f64> = samples.iter().map(|s| s.0).collect();
        let mut rtt: Vec<f64> = samples.iter().map(|s| s.1).collect();
        wait.sort_by(f64::total_cmp);
        rtt.sort_by(f64::total_cmp);
        let rate = samples.len() as f64 / secs;
        let line = |name: &str, q: f64| {
            Line::new(BENCH, name, quantile(&wait, q), "us")
                .lower_is_better()
                .num("rate", rate)
                .int("target_rate", LAG_RATE)
                .int("samples", samples.len() as u64)
                .num("client_rtt_us", quantile(&rtt, q))
                .num("max_us", wait.last().copied().unwrap_or(f64::NAN))
                .usage(&usage)
        };
        [line("lag_p50_us", 0.5), line("lag_p99_us", 0.99)]
    }
}
