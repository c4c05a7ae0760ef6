//! A hostile client of a primary daemon, built on the library's own wire
//! types, and a well-behaved client beside it. For `--secs`, with a fixed
//! `--seed`, it mixes valid requests, lengths at every edge (0, 1, 2^31,
//! 2^63 - 1, 2^64 - 1) with bodies shorter and longer than announced,
//! stalls, trickles, answers never read, abandoned pipelines and bytes
//! that do not decode, playing every role (read, write, admin, and a
//! certificate no one pinned). It starts the daemon itself, as the command
//! after `--` says (`{config}` stands for its configuration), and holds
//! it to these invariants:
//!
//! - the daemon never exits, and stops cleanly and starts again after;
//! - its RSS stays under the documented bound: what it held at the start,
//!   plus the memory budget, plus 24 MiB per client connection it admits;
//!   and what its requests hold, as it counts them, within the budget;
//! - the well-behaved client's appends all succeed, p99 under 100 ms;
//! - the log is never poisoned, and every frame the well-behaved client
//!   was told is durable reads back after the restart;
//! - every outcome a hostile request meets has a name, and so does every
//!   refusal the daemon counts.
//!
//! It prints one JSON line and exits 0 only when every invariant held.
//! `--sabotage budget-off` serves the daemon with a budget of a terabyte
//! while the bounds stay those of 64 MiB: the negative control, which must
//! fail.
//!
//! ```text
//! twinlog-hostile --dir DIR --secs N --seed S [--sabotage budget-off] -- DAEMON ARGS... {config}
//! ```

mod acts;

use std::path::Path;
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use acts::{act, Rng, Tally, World};
use twinlog::daemon::{self, PrimaryConfig};
use twinlog::net::Identity;
use twinlog::node::api::ClientRole;
use twinlog::node::{Client, Durability, Status};
use twinlog::storage::{remove_if_exists, write_file, StdStorage, Storage};

/// The limits the daemon is served with, small enough that clients meet
/// them: the bound of memory follows from them.
const BUDGET_MIB: u64 = 64;
const CONNECTIONS: u64 = 8;
/// What the primary buffers per client connection at most (QUIC's
/// windows), and the admins' connections past the cap.
const PER_CONNECTION_MIB: u64 = 24;
const ADMIN_RESERVE: u64 = 4;
/// The well-behaved client's p99 append latency, at most.
const STEADY_P99: Duration = Duration::from_millis(100);
const WORKERS: u64 = 4;

struct Args {
    dir: std::path::PathBuf,
    secs: u64,
    seed: u64,
    budget_off: bool,
    daemon: Vec<String>,
}

fn args() -> Result<Args, String> {
    let all: Vec<String> = std::env::args().skip(1).collect();
    let split = all
        .iter()
        .position(|a| a == "--")
        .ok_or("no daemon command after --")?;
    let (flags, daemon) = (&all[..split], all[split + 1..].to_vec());
    let flag = |name: &str| {
        flags
            .iter()
            .position(|f| f == name)
            .and_then(|i| flags.get(i + 1))
    };
    let num = |name: &str, default: u64| -> Result<u64, String> {
        flag(name).map_or(Ok(default), |v| {
            v.parse().map_err(|_| format!("{name} {v}: not a number"))
        })
    };
    let budget_off = match flag("--sabotage").map(String::as_str) {
        None => false,
        Some("budget-off") => true,
        Some(other) => return Err(format!("--sabotage {other}: only budget-off")),
    };
    if daemon.is_empty() || !daemon.iter().any(|a| a.contains("{config}")) {
        return Err("the daemon command must name {config}".into());
    }
    Ok(Args {
        dir: flag("--dir").ok_or("no --dir")?.into(),
        secs: num("--secs", 20)?,
        seed: num("--seed", 1)?,
        budget_off,
        daemon,
    })
}

/// The daemon, killed when dropped.
struct DaemonChild(Child);

impl Drop for DaemonChild {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn spawn(a: &Args, config: &std::path::Path, log: &std::path::Path) -> Result<DaemonChild, String> {
    let argv: Vec<String> = a
        .daemon
        .iter()
        .map(|s| s.replace("{config}", &config.display().to_string()))
        .collect();
    let stderr = twinlog::daemon::runtime::output_file(log).map_err(|e| e.to_string())?;
    Command::new(&argv[0])
        .args(&argv[1..])
        .stdout(Stdio::null())
        .stderr(stderr)
        .spawn()
        .map(DaemonChild)
        .map_err(|e| format!("starting {}: {e}", argv[0]))
}

fn free_port<T>(bind: impl Fn(std::net::SocketAddr) -> std::io::Result<T>) -> std::net::SocketAddr
where
    T: LocalAddr,
{
    let s = bind(([127, 0, 0, 1], 0).into()).expect("a free port");
    s.local()
}

trait LocalAddr {
    fn local(&self) -> std::net::SocketAddr;
}

impl LocalAddr for std::net::UdpSocket {
    fn local(&self) -> std::net::SocketAddr {
        self.local_addr().expect("addr")
    }
}

impl LocalAddr for std::net::TcpListener {
    fn local(&self) -> std::net::SocketAddr {
        self.local_addr().expect("addr")
    }
}

/// The daemon's `/metrics` text.
fn metrics_text(addr: std::net::SocketAddr) -> std::io::Result<String> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr)?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(
        s,
        "GET /metrics HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n"
    )?;
    let mut out = String::new();
    s.read_to_string(&mut out)?;
    Ok(out)
}

fn rss(pid: u32, field: &str) -> u64 {
    StdStorage
        .read(Path::new(&format!("/proc/{pid}/status")))
        .ok()
        .and_then(|b| String::from_utf8(b).ok())
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .unwrap_or(0)
        * 1024
}

async fn until_serving(
    metrics: std::net::SocketAddr,
    child: &mut DaemonChild,
) -> Result<(), String> {
    let deadline = twinlog::clock::monotonic() + Duration::from_secs(60);
    while daemon::fetch_status::<Status>(metrics).is_err() {
        if let Ok(Some(st)) = child.0.try_wait() {
            return Err(format!("the daemon exited before it served: {st}"));
        }
        if twinlog::clock::monotonic() > deadline {
            return Err("the daemon did not serve within 60 s".into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

/// The well-behaved client: a 128-byte append every 10 ms, each timed.
async fn steady(
    client: Client,
    world: Arc<World>,
    done: Arc<AtomicBool>,
) -> (Vec<Duration>, Vec<String>, u64) {
    let (mut took, mut errors, mut last) = (Vec::new(), Vec::new(), 0);
    let mut i = 0u64;
    while !done.load(Ordering::SeqCst) {
        let started = twinlog::clock::monotonic();
        match client
            .append(0x9000, b"steady", &steady_blob(i), Durability::Local)
            .await
        {
            Ok((seq, _)) => {
                took.push(started.elapsed());
                last = seq;
                world.head.store(seq, Ordering::Relaxed);
            }
            Err(e) if errors.len() < 20 => errors.push(e.to_string()),
            Err(_) => {}
        }
        i += 1;
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    client.close().await;
    (took, errors, last)
}

fn steady_blob(i: u64) -> Vec<u8> {
    (0..128u64)
        .map(|j| (i.wrapping_mul(31) ^ j) as u8)
        .collect()
}

async fn run(a: Args) -> Result<serde_json::Value, String> {
    StdStorage
        .create_dir_all(&a.dir)
        .map_err(|e| e.to_string())?;
    let data = a.dir.join("p");
    let _ = StdStorage.remove_dir_all(&data);
    let listen = free_port(std::net::UdpSocket::bind);
    let metrics = free_port(std::net::TcpListener::bind);
    let (config, fp) =
        daemon::init_primary(&data, listen, metrics, None).map_err(|e| e.to_string())?;
    let mut cfg = PrimaryConfig::load(&config).map_err(|e| e.to_string())?;
    cfg.limits.memory_budget_mib = if a.budget_off { 1 << 20 } else { BUDGET_MIB };
    cfg.limits.max_client_connections = CONNECTIONS;
    cfg.limits.body_piece_timeout_ms = 1000;
    cfg.limits.staged_body_max_mib = 64;
    cfg.limits.staging_mib = 256;
    write_file(&StdStorage, &config, cfg.render().as_bytes()).map_err(|e| e.to_string())?;
    let mint = || Identity::mint().map(Arc::new).map_err(|e| e.to_string());
    let (reader, writer, steady_id, stranger) = (mint()?, mint()?, mint()?, mint()?);
    for (id, role) in [
        (&reader, ClientRole::Read),
        (&writer, ClientRole::Write),
        (&steady_id, ClientRole::Write),
    ] {
        daemon::pin_client(&config, id.fingerprint(), role).map_err(|e| e.to_string())?;
    }
    let admin =
        Arc::new(daemon::load_identity(&data.join(daemon::ADMIN_DIR)).map_err(|e| e.to_string())?);
    let log = a.dir.join("primary.log");
    let _ = remove_if_exists(&StdStorage, &log);
    let mut child = spawn(&a, &config, &log)?;
    until_serving(metrics, &mut child).await?;
    let pid = child.0.id();

    // What the acts read: a repository, documents, a large frame and a
    // large object.
    let setup = Client::connect(&admin, fp, listen)
        .await
        .map_err(|e| e.to_string())?;
    let failed = |what: &'static str| move |e: twinlog::node::ClientError| format!("{what}: {e}");
    setup
        .create_repo("r", Durability::Local)
        .await
        .map_err(failed("create"))?;
    setup
        .put_doc("doc", b"a small document", Durability::Local)
        .await
        .map_err(failed("doc"))?;
    setup
        .put_doc("big", &vec![5; 4 << 20], Durability::Local)
        .await
        .map_err(failed("big doc"))?;
    let (big_seq, _) = setup
        .append(0x8000, b"big", &vec![6; 8 << 20], Durability::Local)
        .await
        .map_err(failed("big frame"))?;
    let lfs = vec![7u8; 4 << 20];
    let big_lfs = twinlog::store::frames::lfs_oid(&lfs);
    setup
        .lfs_put("r", big_lfs, lfs.len() as u64, &lfs[..], Durability::Local)
        .await
        .map_err(failed("lfs"))?;
    setup.close().await;
    let start_rss = rss(pid, "VmRSS");
    let bound =
        start_rss + (BUDGET_MIB + (CONNECTIONS + ADMIN_RESERVE) * PER_CONNECTION_MIB) * (1 << 20);

    let world = Arc::new(World {
        listen,
        primary: fp,
        ids: [reader, writer, admin.clone(), stranger],
        big_seq,
        big_lfs,
        head: AtomicU64::new(big_seq),
        stop: AtomicBool::new(false),
        hog: tokio::sync::Semaphore::new(1),
        tally: Mutex::new(Tally::default()),
    });
    let steady_done = Arc::new(AtomicBool::new(false));
    let steady_client = Client::connect(&steady_id, fp, listen)
        .await
        .map_err(|e| e.to_string())?;
    let steady_task = tokio::spawn(steady(steady_client, world.clone(), steady_done.clone()));
    let mut workers = Vec::new();
    for w in 0..WORKERS {
        let world = world.clone();
        let seed = a.seed.wrapping_mul(1000) + w;
        workers.push(tokio::spawn(async move {
            let mut rng = Rng::new(seed);
            // The first worker starts with the memory hog, so a short run
            // meets it too.
            let mut hog = w == 0;
            while !world.stop.load(Ordering::SeqCst) {
                act(&world, &mut rng, std::mem::take(&mut hog)).await;
                tokio::time::sleep(Duration::from_millis(rng.below(50))).await;
            }
        }));
    }

    let mut violations: Vec<String> = Vec::new();
    let (mut peak, mut held, began) = (start_rss, 0, twinlog::clock::monotonic());
    let budget = BUDGET_MIB << 20;
    while began.elapsed() < Duration::from_secs(a.secs) {
        if let Ok(Some(st)) = child.0.try_wait() {
            violations.push(format!("the daemon exited under the hostile client: {st}"));
            break;
        }
        peak = peak.max(rss(pid, "VmRSS"));
        if let Ok((_, s)) = daemon::fetch_status::<Status>(metrics) {
            held = held.max(s.memory_held);
        }
        if peak > bound || held > budget {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    if held > budget {
        violations.push(format!(
            "requests held {} MiB, past the budget of {BUDGET_MIB} MiB",
            held >> 20
        ));
    }
    world.stop.store(true, Ordering::SeqCst);
    for w in workers {
        if tokio::time::timeout(Duration::from_secs(60), w)
            .await
            .is_err()
        {
            violations.push("a hostile act did not end within 60 s of the stop".into());
        }
    }
    steady_done.store(true, Ordering::SeqCst);
    let (mut took, steady_errors, last) = steady_task.await.map_err(|e| e.to_string())?;
    let alive = matches!(child.0.try_wait(), Ok(None));
    peak = peak.max(rss(pid, "VmHWM"));
    if peak > bound {
        violations.push(format!(
            "RSS reached {} MiB, past the bound of {} MiB",
            peak >> 20,
            bound >> 20
        ));
    }
    took.sort();
    let p99 = took.get(took.len() * 99 / 100).copied().unwrap_or_default();
    if p99 > STEADY_P99 || took.is_empty() {
        violations.push(format!(
            "the steady client's p99 append took {p99:?} ({} appends)",
            took.len()
        ));
    }
    if !steady_errors.is_empty() {
        violations.push(format!("the steady client was refused: {steady_errors:?}"));
    }

    // Everything given back, nothing poisoned, every refusal named.
    let mut after = None;
    if alive {
        let deadline = twinlog::clock::monotonic() + Duration::from_secs(30);
        loop {
            let s = daemon::fetch_status::<Status>(metrics).map(|(_, s)| s).ok();
            let idle = s.as_ref().is_some_and(|s| {
                s.memory_held == 0 && s.staging_held == 0 && s.client_requests == 0
            });
            if idle || twinlog::clock::monotonic() > deadline {
                if !idle {
                    violations.push(format!("still held 30 s after the stop: {s:?}"));
                }
                after = s;
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    if let Some(s) = &after {
        if let Some(why) = &s.log_poisoned {
            violations.push(format!("the log was poisoned: {why}"));
        }
        let text = metrics_text(metrics).unwrap_or_default();
        for name in s.refusals.keys() {
            if !text.contains(&format!(
                "twinlog_client_refusals_total{{refusal=\"{name}\"}}"
            )) {
                violations.push(format!("the refusal {name} has no metric"));
            }
        }
        if !text.contains("twinlog_unpinned_handshakes_total") {
            violations.push("refused handshakes have no metric".into());
        }
        for name in s.refusals.keys() {
            let well_formed = !name.is_empty()
                && name.split('.').all(|p| {
                    p.chars().next().is_some_and(|c| c.is_ascii_uppercase())
                        && p.chars().all(|c| c.is_ascii_alphanumeric())
                });
            if !well_formed {
                violations.push(format!(
                    "the daemon counted a refusal without a name: {name:?}"
                ));
            }
        }
    }
    let tally = std::mem::take(&mut *world.tally.lock().unwrap_or_else(|e| e.into_inner()));
    if !tally.unnamed.is_empty() {
        violations.push(format!("outcomes without a name: {:?}", tally.unnamed));
    }

    // A clean stop, a clean start, and the steady frames still there.
    if alive {
        // SAFETY: kill(2) with a pid this process spawned and has not reaped.
        unsafe { libc::kill(pid as i32, libc::SIGTERM) };
        let mut stopped = None;
        for _ in 0..300 {
            stopped = child.0.try_wait().ok().flatten();
            if stopped.is_some() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        match stopped {
            Some(st) if st.success() => {}
            other => violations.push(format!(
                "the daemon did not stop cleanly on SIGTERM: {other:?}"
            )),
        }
        child = spawn(&a, &config, &log)?;
        match until_serving(metrics, &mut child).await {
            Err(e) => violations.push(format!("the daemon did not start again: {e}")),
            Ok(()) => {
                let c = Client::connect(&admin, fp, listen)
                    .await
                    .map_err(|e| e.to_string())?;
                match c.read(last).await {
                    Ok(e) if last == 0 || (e.meta == b"steady" && e.blob.len() == 128) => {}
                    other => violations.push(format!(
                        "the steady client's frame {last} after the restart: {other:?}"
                    )),
                }
                c.close().await;
            }
        }
    }
    let logged = StdStorage
        .read(&log)
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .unwrap_or_default();
    if logged.contains("panicked") {
        violations.push("the daemon's log holds a panic".into());
    }
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    Ok(serde_json::json!({
        "ok": violations.is_empty(),
        "violations": violations,
        "secs": began.elapsed().as_secs_f64(),
        "seed": a.seed,
        "sabotage": if a.budget_off { "budget-off" } else { "none" },
        "acts": tally.acts,
        "named": tally.named,
        "steady": {
            "appends": took.len(),
            "p50_ms": ms(took.get(took.len() / 2).copied().unwrap_or_default()),
            "p99_ms": ms(p99),
            "max_ms": ms(took.last().copied().unwrap_or_default()),
        },
        "rss_start_mib": start_rss >> 20,
        "rss_peak_mib": peak >> 20,
        "rss_bound_mib": bound >> 20,
        "memory_held_peak_mib": held >> 20,
        "daemon_refusals": after.map(|s| s.refusals).unwrap_or_default(),
    }))
}

fn main() -> ExitCode {
    let a = match args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("twinlog-hostile: {e}");
            return ExitCode::from(2);
        }
    };
    let rt = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("twinlog-hostile: no runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(run(a)) {
        Ok(report) => {
            println!("{report}");
            match report["ok"].as_bool() {
                Some(true) => ExitCode::SUCCESS,
                _ => ExitCode::FAILURE,
            }
        }
        Err(e) => {
            eprintln!("twinlog-hostile: {e}");
            ExitCode::FAILURE
        }
    }
}
