//! The replication drills, on the real `primary` and `twin` binaries as
//! host processes (a VM adds nothing to a SIGKILL): clients append with
//! `twin` durability (and one with `local`) while
//!
//! - `kill-primary`, `kill-twin`: the daemon is SIGKILLed at a random
//!   acknowledgement and restarted, again and again;
//! - `partition`: the link between them (a UDP relay the twin dials) is cut
//!   and healed, under the `--policy` given.
//!
//! Invariant: every frame acknowledged as `Twin` is on the twin's recovered
//! log, and every acknowledged frame on the primary's, byte for byte; checked
//! on the killed side's log right after each kill (before it restarts and
//! could fetch anything again) and on both logs at the end, once the twin
//! has converged to the primary's head, with the twin's frames equal to the
//! primary's. Under `wait` and `fail` no `twin` append is ever acknowledged
//! as `Local`.
//!
//! `repl-drill --mode MODE --primary-bin P --twin-bin T --work DIR
//! [--rounds N] [--policy wait|fail|fallback] [--seed S]`

use std::net::SocketAddr;
use std::path::Path;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use twinlog::daemon::config::Policy;
use twinlog::daemon::{self, PrimaryConfig, TwinConfig};
use twinlog::log::{Log, Tail};
use twinlog::net::{Fingerprint, Identity};
use twinlog::node::{Client, ClientError, Durability};

use drills::content::bytes;
use drills::daemons::{free_tcp, free_udp, Proc};
use drills::{Args, Context, DrillError, Result, Rng};

/// Frame `n`'s blob: small, every 60th 1 MiB (a streamed entry).
fn blob(n: u64) -> Vec<u8> {
    let len = if n % 60 == 7 {
        1 << 20
    } else {
        64 + (n as usize * 97) % 3000
    };
    bytes(n, len)
}

#[derive(Clone, Copy, Debug)]
struct Acked {
    seq: u64,
    n: u64,
    got: Durability,
}

#[derive(Default)]
struct Shared {
    acked: Mutex<Vec<Acked>>,
    /// `twin` appends acknowledged as `Local` (only `fallback` may).
    fell_back: AtomicU64,
    /// Appends answered with an error (a `fail` policy's refusals, cuts).
    errors: AtomicU64,
    stop: AtomicBool,
}

impl Shared {
    fn acked(&self) -> Vec<Acked> {
        self.acked.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Acknowledgements as `Twin`: what the rounds are timed by, so that
    /// a fast `local` client does not make a round of nothing.
    fn count(&self) -> usize {
        self.acked
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter(|a| is_twin(a))
            .count()
    }
}

/// Four clients: three ask for `twin`, one for `local`; each reconnects
/// whenever the primary is gone.
fn clients(
    admin: Arc<Identity>,
    fp: Fingerprint,
    addr: SocketAddr,
    shared: Arc<Shared>,
) -> Vec<tokio::task::JoinHandle<()>> {
    (0..4u64)
        .map(|w| {
            let (admin, shared) = (admin.clone(), shared.clone());
            tokio::spawn(async move {
                let want = if w == 3 {
                    Durability::Local
                } else {
                    Durability::Twin
                };
                let mut n = w;
                let mut client = None;
                while !shared.stop.load(Ordering::SeqCst) {
                    if client.is_none() {
                        let dialed = tokio::time::timeout(
                            Duration::from_millis(500),
                            Client::connect(&admin, fp, addr),
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
                    let appended = tokio::time::timeout(
                        Duration::from_secs(3),
                        c.append(0x8000, &n.to_le_bytes(), &blob(n), want),
                    )
                    .await;
                    match appended {
                        Ok(Ok((seq, got))) => {
                            if want == Durability::Local {
                                // Paced, so the log is not mostly hers.
                                tokio::time::sleep(Duration::from_millis(3)).await;
                            }
                            if want == Durability::Twin && got == Durability::Local {
                                shared.fell_back.fetch_add(1, Ordering::SeqCst);
                            }
                            shared
                                .acked
                                .lock()
                                .unwrap_or_else(|e| e.into_inner())
                                .push(Acked { seq, n, got });
                        }
                        Ok(Err(e)) => {
                            shared.errors.fetch_add(1, Ordering::SeqCst);
                            // A refusal comes over a live connection; a
                            // connection error (the primary restarted and
                            // reset it) means dialing again.
                            if matches!(e, ClientError::Net(_)) {
                                client = None;
                            }
                            tokio::time::sleep(Duration::from_millis(20)).await;
                        }
                        Err(_) => client = None,
                    }
                }
            })
        })
        .collect()
}

/// A log's frames as a checker sees them.
enum Frames<'a> {
    /// Opened, recovered: the process that wrote it is gone.
    Recovered(&'a Log),
    /// Read without the lock, the writer still running.
    Tailed(&'a std::collections::BTreeMap<u64, (Vec<u8>, Vec<u8>)>),
}

impl Frames<'_> {
    fn get(&self, seq: u64) -> Option<(Vec<u8>, Vec<u8>)> {
        match self {
            Frames::Recovered(log) => log.read(seq).ok().map(|e| (e.meta, e.blob)),
            Frames::Tailed(map) => map.get(&seq).cloned(),
        }
    }
}

fn tail_all(dir: &Path) -> std::collections::BTreeMap<u64, (Vec<u8>, Vec<u8>)> {
    let mut out = std::collections::BTreeMap::new();
    let Ok(mut tail) = Tail::open(dir, 0) else {
        return out;
    };
    while let Ok(Some(f)) = tail.next() {
        out.insert(f.seq, (f.meta.to_vec(), f.blob.to_vec()));
    }
    out
}

struct Tally {
    checks: u64,
    failures: Vec<String>,
}

impl Tally {
    /// Every acknowledgement `which` selects is on `frames`, byte for byte.
    fn check(
        &mut self,
        what: &str,
        frames: &Frames,
        acked: &[Acked],
        which: impl Fn(&Acked) -> bool,
    ) {
        for a in acked.iter().filter(|a| which(a)) {
            self.checks += 1;
            let want = (a.n.to_le_bytes().to_vec(), blob(a.n));
            if frames.get(a.seq).as_ref() != Some(&want) {
                if self.failures.len() < 20 {
                    eprintln!(
                        "LOST {what}: frame {} (n {}, acknowledged {:?})",
                        a.seq, a.n, a.got
                    );
                }
                self.failures.push(format!(
                    "{what}: frame {} acknowledged {:?} is not whole",
                    a.seq, a.got
                ));
            }
        }
    }
}

fn is_twin(a: &Acked) -> bool {
    a.got == Durability::Twin
}

fn open_log(dir: &Path) -> Result<Log> {
    Log::open(dir).ctx(|| format!("open {}", dir.display()))
}

async fn settle(ms: u64) {
    tokio::time::sleep(Duration::from_millis(ms)).await;
}

/// Wait until `more` acknowledgements past `from` arrived; false after `limit`.
async fn acks_past(shared: &Shared, from: usize, limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    while shared.count() < from {
        if Instant::now() > deadline {
            return false;
        }
        settle(5).await;
    }
    true
}

async fn drill(args: &Args) -> Result<bool> {
    let started = Instant::now();
    let mode = args
        .0
        .get("mode")
        .cloned()
        .ok_or_else(|| DrillError("--mode is required".into()))?;
    let policy = match args.0.get("policy").map(String::as_str) {
        None | Some("wait") => Policy::Wait,
        Some("fail") => Policy::Fail,
        Some("fallback") => Policy::Fallback,
        Some(p) => return Err(DrillError(format!("--policy {p}"))),
    };
    let rounds = args.num("rounds", 5)?;
    let mut rng = Rng::new(args.num("seed", 1)?);
    let work = args.path("work")?;
    let (pbin, tbin) = (args.path("primary-bin")?, args.path("twin-bin")?);
    if work.exists() {
        std::fs::remove_dir_all(&work).ctx(|| format!("clear {}", work.display()))?;
    }
    let (pdir, tdir) = (work.join("primary"), work.join("twin"));
    let listen = free_udp()?;
    // A UDP relay between the twin and the primary that can cut the link.
    let relay = testkit::proxy::udp(listen)
        .await
        .ctx(|| "the relay between the twin and the primary".into())?;
    let relay_addr = relay.addr;
    let (tcfg, twin_fp) =
        daemon::init_twin(&tdir, relay_addr, free_tcp()?, None).ctx(|| "init the twin".into())?;
    let (pcfg, primary_fp) = daemon::init_primary(&pdir, listen, free_tcp()?, Some(twin_fp))
        .ctx(|| "init the primary".into())?;
    daemon::pin_primary(&tcfg, primary_fp).ctx(|| "pin the primary".into())?;
    let timers = daemon::config::TimersSection {
        heartbeat_ms: 50,
        idle_timeout_ms: 600,
    };
    let mut p = PrimaryConfig::load(&pcfg).ctx(|| "load primary.toml".into())?;
    p.timers = timers;
    p.segment_bytes = 1 << 20;
    p.durability.policy = policy;
    p.durability.timeout_ms = 700;
    std::fs::write(&pcfg, p.render()).ctx(|| "write primary.toml".into())?;
    let mut t = TwinConfig::load(&tcfg).ctx(|| "load twin.toml".into())?;
    t.timers = timers;
    t.segment_bytes = 1 << 20;
    std::fs::write(&tcfg, t.render()).ctx(|| "write twin.toml".into())?;
    let (plog, tlog) = (pdir.join(daemon::LOG_DIR), tdir.join(daemon::LOG_DIR));

    let mut primary = Proc::serve(&pbin, &pcfg, &work.join("primary.stderr"))?;
    let mut twin = Proc::serve(&tbin, &tcfg, &work.join("twin.stderr"))?;
    let admin = Arc::new(
        daemon::load_identity(&pdir.join(daemon::ADMIN_DIR)).ctx(|| "admin identity".into())?,
    );
    let shared = Arc::new(Shared::default());
    let workers = clients(admin, primary_fp, listen, shared.clone());
    let mut tally = Tally {
        checks: 0,
        failures: Vec::new(),
    };
    let mut stalls = 0u64;
    if !acks_past(&shared, 20, Duration::from_secs(20)).await {
        return Err(DrillError(
            "no acknowledgement in 20 s: the pair never came up".into(),
        ));
    }
    for round in 0..rounds {
        let at = shared.count() + 3 + rng.below(30) as usize;
        if !acks_past(&shared, at, Duration::from_secs(20)).await {
            stalls += 1;
            tally
                .failures
                .push(format!("round {round}: no progress in 20 s"));
        }
        match mode.as_str() {
            "kill-twin" => {
                twin.sigkill()?;
                let log = open_log(&tlog)?;
                tally.check(
                    &format!("twin after kill {round}"),
                    &Frames::Recovered(&log),
                    &shared.acked(),
                    is_twin,
                );
                drop(log);
                settle(100 + rng.below(400)).await;
                twin.restart()?;
            }
            "kill-primary" => {
                primary.sigkill()?;
                let acked = shared.acked();
                let log = open_log(&plog)?;
                tally.check(
                    &format!("primary after kill {round}"),
                    &Frames::Recovered(&log),
                    &acked,
                    |_| true,
                );
                drop(log);
                let on_twin = tail_all(&tlog);
                tally.check(
                    &format!("twin at primary kill {round}"),
                    &Frames::Tailed(&on_twin),
                    &acked,
                    is_twin,
                );
                settle(100 + rng.below(400)).await;
                primary.restart()?;
            }
            "partition" => {
                relay.cut(true);
                settle(1000 + rng.below(2000)).await;
                relay.cut(false);
                let on_twin = tail_all(&tlog);
                tally.check(
                    &format!("twin after cut {round}"),
                    &Frames::Tailed(&on_twin),
                    &shared.acked(),
                    is_twin,
                );
            }
            m => return Err(DrillError(format!("unknown mode {m}"))),
        }
    }
    // Progress after the last break, then stop the clients.
    let at = shared.count() + 20;
    if !acks_past(&shared, at, Duration::from_secs(20)).await {
        stalls += 1;
        tally
            .failures
            .push("no progress after the last round".into());
    }
    shared.stop.store(true, Ordering::SeqCst);
    for w in workers {
        let _ = tokio::time::timeout(Duration::from_secs(10), w).await;
    }
    // The twin converges: its head reaches the primary's.
    let deadline = Instant::now() + Duration::from_secs(30);
    let converged = loop {
        let (p, t) = (tail_all(&plog), tail_all(&tlog));
        let (ph, th) = (p.keys().last().copied(), t.keys().last().copied());
        if ph == th {
            break true;
        }
        if Instant::now() > deadline {
            tally.failures.push(format!(
                "the twin did not converge: head {th:?}, the primary's {ph:?}"
            ));
            break false;
        }
        settle(100).await;
    };
    primary.stop()?;
    twin.stop()?;
    let acked = shared.acked();
    let (plog_open, tlog_open) = (open_log(&plog)?, open_log(&tlog)?);
    tally.check(
        "primary at the end",
        &Frames::Recovered(&plog_open),
        &acked,
        |_| true,
    );
    tally.check(
        "twin at the end",
        &Frames::Recovered(&tlog_open),
        &acked,
        is_twin,
    );
    // The twin holds the primary's frames, byte for byte.
    let mut same = 0u64;
    for seq in tlog_open.first_seq()..=tlog_open.head_seq() {
        let (a, b) = (plog_open.read(seq).ok(), tlog_open.read(seq).ok());
        if a.is_none() || a != b {
            tally
                .failures
                .push(format!("frame {seq}: the twin's is not the primary's"));
        } else {
            same += 1;
        }
    }
    let fell_back = shared.fell_back.load(Ordering::SeqCst);
    if policy != Policy::Fallback && fell_back > 0 {
        tally.failures.push(format!(
            "{fell_back} twin appends acknowledged as local under {policy:?}"
        ));
    }
    let twin_acked = acked.iter().filter(|a| is_twin(a)).count();
    let ok = tally.failures.is_empty() && twin_acked > 0;
    let seconds = started.elapsed().as_secs_f64();
    println!(
        "{mode}{}: {} rounds; {} frames acknowledged ({twin_acked} as twin, {} as local, {fell_back} of them twin appends that fell back), {} append errors",
        if mode == "partition" { format!(" ({policy:?})") } else { String::new() },
        rounds,
        acked.len(),
        acked.len() - twin_acked,
        shared.errors.load(Ordering::SeqCst)
    );
    println!(
        "checks: {} acknowledged frames compared byte for byte ({} after each break, on the broken side, and at the end); {same} twin frames equal to the primary's; converged: {converged}",
        tally.checks, rounds
    );
    println!(
        "invariant (acknowledged => on the log it was promised on): {} ({} failures)",
        if ok { "held" } else { "BROKEN" },
        tally.failures.len()
    );
    for f in tally.failures.iter().take(10) {
        println!("  {f}");
    }
    println!(
        "{}",
        serde_json::json!({
            "drill": mode,
            "policy": format!("{policy:?}").to_lowercase(),
            "rounds": rounds,
            "acked_frames": acked.len(),
            "acked_twin": twin_acked,
            "fell_back": fell_back,
            "append_errors": shared.errors.load(Ordering::SeqCst),
            "checks": tally.checks,
            "twin_frames_equal": same,
            "converged": converged,
            "stalls": stalls,
            "failures": tally.failures.len(),
            "seconds": (seconds * 10.0).round() / 10.0,
            "passed": ok,
        })
    );
    Ok(ok)
}

fn main() -> ExitCode {
    let run = Args::parse(&[]).and_then(|args| {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .ctx(|| "tokio runtime".into())?;
        rt.block_on(drill(&args))
    });
    match run {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("repl-drill: {e}");
            ExitCode::from(2)
        }
    }
}
