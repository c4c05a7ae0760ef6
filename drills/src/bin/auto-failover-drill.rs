//! The automatic-failover drill: a pair under a real etcd (`[failover]`,
//! a 2 s lease, `auto_rejoin`), both boxes the real `primary`/`twin`
//! binaries, each box's link to etcd and the twin's link to the primary
//! through relays the drill cuts. Writers append under load the whole
//! time, each on one connection until it fails, and every
//! acknowledgement is kept with the epoch of the primary that gave it and
//! the wall time it was asked and answered.
//!
//! Each round breaks one thing at random (SIGKILL the primary or the
//! twin, cut primary–etcd, primary–twin, twin–etcd, or the primary from
//! both, SIGSTOP the primary past the lease; etcd wiped, rolled back to a
//! snapshot taken earlier in the run, or frozen; the primary killed, its
//! twin taking over and killed too, etcd wiped and the deposed box
//! started first), holds it 1–6 s, mends it, waits for a primary holding
//! its lease with its twin recorded in sync, and checks:
//!
//! - no frame acknowledged `twin` is missing or different, on the
//!   primary (read back through the client and from its log) and on the
//!   twin once it caught up;
//! - no acknowledgement under epoch N was asked after the first one
//!   under a newer epoch was answered;
//! - no epoch was acknowledged by both boxes;
//! - no daemon ended by itself.
//!
//! Daemons that end by themselves are started again as the shipped
//! systemd units do (`Restart=on-failure` after 2 s), but in one round in
//! the middle, which runs without that supervisor.
//!
//! `--broken no-self-fence` names the negative control (daemons built
//! with `drill-sabotage`, `TWINLOG_DRILL_SABOTAGE=no-self-fence`): its
//! first round cuts the primary off from etcd and its twin while the
//! `local` writers keep their connection to it, and the drill must fail.
//! `--broken trust-etcd` (`TWINLOG_DRILL_SABOTAGE=trust-etcd`, boxes that
//! take their epoch from etcd alone) starts with the deposed box first
//! after etcd lost its data, and the drill must fail.
//!
//! Exits 0 when both invariants held, 1 when one broke or a round did not
//! heal, 2 when the drill could not run.
//!
//! `auto-failover-drill --primary-bin P --twin-bin T --work DIR
//! [--rounds N] [--seed S] [--broken no-self-fence|trust-etcd]`

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use testkit::etcd::Etcd;
use testkit::proxy::{self, Proxy};
use twinlog::daemon::{self, PrimaryConfig, TwinConfig};
use twinlog::net::{Fingerprint, Identity};
use twinlog::node::arbiter::{Arbiter, ArbiterOptions};
use twinlog::node::{Client, ClientError, ClientOptions, Durability};
use twinlog::repl::epochs::EpochName;

use drills::auto_failover::{
    blob, epoch_order, epochs_on_two_boxes, least_gap, meta, missing_in, wall_ns, Ack, Fault,
    FAULTS, KIND,
};
use drills::daemons::{
    admin_identity, fast_timers, primary_status_now, tenths, twin_status_now, Proc,
};
use drills::{Args, Context, DrillError, Result, Rng};

const CLUSTER: &str = "drill";
const TTL_S: u64 = 2;
/// How long a round may take to mend before it is a failure.
const HEAL: Duration = Duration::from_secs(60);
/// Writers of each durability.
const TWIN_WRITERS: u32 = 3;
const LOCAL_WRITERS: u32 = 2;
/// A writer's pause between appends: load, not a benchmark.
const PACE: Duration = Duration::from_millis(4);
/// How often a following writer asks etcd who leads.
const FOLLOW_EVERY: Duration = Duration::from_millis(100);
/// Writers that follow etcd's leader at once, `local` and `twin`.
const FOLLOWERS: u32 = 2;
/// Refusals in a row for this long, and a writer dials the leader again.
const GIVE_UP_REFUSED: Duration = Duration::from_secs(3);
/// Acknowledgements of each durability before a round's fault.
const LOADED: usize = 100;
/// Acknowledgements of a round read back through the client (the log
/// files check every one).
const READ_BACK: usize = 400;

/// One box: its data directory and where it serves.
struct Host {
    name: &'static str,
    dir: PathBuf,
    fp: Fingerprint,
    /// Where clients reach it as a primary (not through a relay: cutting
    /// the twin's link leaves the writers on it).
    listen: SocketAddr,
    metrics: SocketAddr,
    proc: Option<Proc>,
}

impl Host {
    fn start(&mut self, primary_bin: &Path, twin_bin: &Path) -> Result<()> {
        let pcfg = self.dir.join(daemon::PRIMARY_CONFIG);
        let (bin, cfg) = if pcfg.exists() {
            (primary_bin, pcfg)
        } else {
            (twin_bin, self.dir.join(daemon::TWIN_CONFIG))
        };
        self.proc = Some(Proc::serve(bin, &cfg, &self.dir.with_extension("log"))?);
        Ok(())
    }

    fn pid(&self) -> Result<i32> {
        self.proc
            .as_ref()
            .and_then(Proc::pid)
            .map(|p| p as i32)
            .ok_or_else(|| DrillError(format!("box {} runs no daemon", self.name)))
    }

    fn signal(&self, sig: libc::c_int) -> Result<()> {
        // SAFETY: kill(2) on a child this drill started and still holds.
        if unsafe { libc::kill(self.pid()?, sig) } != 0 {
            return Err(DrillError(format!(
                "signal {sig} to box {}: {}",
                self.name,
                std::io::Error::last_os_error()
            )));
        }
        Ok(())
    }

    fn log_tail(&self, lines: usize) -> String {
        let text = std::fs::read_to_string(self.dir.with_extension("log")).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }
}

/// What the writers share.
#[derive(Default)]
struct Shared {
    acks: Mutex<Vec<Ack>>,
    failed: AtomicU64,
    refused: Mutex<BTreeMap<String, u64>>,
    dials: AtomicU64,
    /// Why a writer could not dial the leader, and how often.
    not_dialled: Mutex<BTreeMap<String, u64>>,
    stop: AtomicBool,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Who the writers may dial: each box's fingerprint, direct address and
/// metrics address.
type Directory = Arc<[(Fingerprint, SocketAddr, SocketAddr); 2]>;

/// A connection to the primary etcd names now, with the epoch it serves
/// under and which box it is; or why there is none that answers now.
async fn dial(
    arbiter: &Arbiter,
    dir: &Directory,
    admin: &Identity,
) -> std::result::Result<(Client, u64, usize), String> {
    let (_, fp, _) = tokio::time::timeout(Duration::from_secs(1), arbiter.leader())
        .await
        .map_err(|_| "etcd did not answer".to_owned())?
        .map_err(|e| e.to_string())?;
    let on = dir
        .iter()
        .position(|(f, _, _)| *f == fp)
        .ok_or_else(|| format!("etcd names {fp}, neither box"))?;
    let opts = ClientOptions {
        deadline: Duration::from_secs(2),
    };
    let c = tokio::time::timeout(
        Duration::from_secs(1),
        Client::connect_with(admin, fp, dir[on].1, opts),
    )
    .await
    .map_err(|_| "the connection took over 1 s".to_owned())?
    .map_err(|e| e.to_string())?;
    // The epoch from the box's /status, read after the connection was
    // made: a life after the one connected to means that one is gone, and
    // so is the connection (a life is a process), so no acknowledgement
    // is put under a later epoch than its own. (`Client::status` cannot
    // be used: its answer does not decode under an arbiter, whose lease
    // fields are left out when empty, which postcard cannot read.)
    let s = primary_status_now(dir[on].2)
        .await
        .ok_or_else(|| "no /status".to_owned())?;
    if s.role != "primary" || s.fenced.is_some() {
        return Err(format!("it says {} (fenced: {:?})", s.role, s.fenced));
    }
    Ok((c, s.epoch, on))
}

/// A writer: appends of `durability` until told to stop, each connection
/// kept until it fails (or refuses for [`GIVE_UP_REFUSED`]), so a primary
/// that should have stopped is still asked. A `follows` writer also
/// leaves its connection as soon as etcd names another leader: the new
/// primary's first answers are then asked for while the others still
/// ask the old one.
async fn writer(
    id: u32,
    durability: Durability,
    follows: bool,
    shared: Arc<Shared>,
    arbiter: Arbiter,
    dir: Directory,
    admin: Arc<Identity>,
) {
    let mut n = 0u64;
    while !shared.stop.load(Ordering::SeqCst) {
        let (c, epoch, on) = match dial(&arbiter, &dir, &admin).await {
            Ok(d) => d,
            Err(why) => {
                *lock(&shared.not_dialled).entry(why).or_default() += 1;
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        shared.dials.fetch_add(1, Ordering::SeqCst);
        let mut refused_since: Option<Instant> = None;
        let mut looked = Instant::now();
        while !shared.stop.load(Ordering::SeqCst) {
            if follows && looked.elapsed() >= FOLLOW_EVERY {
                looked = Instant::now();
                let named = tokio::time::timeout(FOLLOW_EVERY, arbiter.leader()).await;
                if matches!(named, Ok(Ok((e, _, _))) if e != epoch) {
                    break;
                }
            }
            let (m, b) = (meta(id, n), blob(id, n));
            let this = n;
            // A failed append may be in the log all the same: a number
            // is never used twice.
            n += 1;
            let sent_ns = wall_ns();
            let r = c.append(KIND, &m, &b, durability).await;
            let at_ns = wall_ns();
            match r {
                Ok((seq, got)) => {
                    refused_since = None;
                    lock(&shared.acks).push(Ack {
                        writer: id,
                        n: this,
                        seq,
                        twin: got == Durability::Twin,
                        epoch,
                        on,
                        sent_ns,
                        at_ns,
                        crc: crc32fast::hash(&b),
                    });
                }
                Err(ClientError::Api(e)) => {
                    *lock(&shared.refused)
                        .entry(e.name().to_owned())
                        .or_default() += 1;
                    if refused_since.get_or_insert_with(Instant::now).elapsed() > GIVE_UP_REFUSED {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                Err(_) => {
                    shared.failed.fetch_add(1, Ordering::SeqCst);
                    break;
                }
            }
            tokio::time::sleep(PACE).await;
        }
    }
}

/// Until the writers got [`LOADED`] acknowledgements of each durability
/// past the first `from`; false after [`HEAL`].
async fn loaded(shared: &Shared, from: usize) -> bool {
    let by = Instant::now() + HEAL;
    loop {
        let (twin, local) = lock(&shared.acks)
            .get(from..)
            .unwrap_or_default()
            .iter()
            .fold(
                (0, 0),
                |(t, l), a| if a.twin { (t + 1, l) } else { (t, l + 1) },
            );
        if twin >= LOADED && local >= LOADED {
            return true;
        }
        if Instant::now() > by {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

struct Drill {
    hosts: [Host; 2],
    to_etcd: [Proxy; 2],
    /// The twin's way to each box (its advertised address).
    to_box: [Proxy; 2],
    arbiter: Arbiter,
    admin: Arc<Identity>,
    primary_bin: PathBuf,
    twin_bin: PathBuf,
    etcd: Etcd,
    /// Copies of etcd's data taken at the start of each round, for a
    /// rollback to one of them.
    snapshots: Vec<PathBuf>,
    work: PathBuf,
    /// Daemons that end by themselves are started again, as the shipped
    /// systemd units do (`Restart=on-failure`, `RestartSec=2s`, not after
    /// exit 2, 3 or 4).
    supervised: bool,
    /// A box whose daemon the drill killed, until it starts it again.
    killed: [bool; 2],
    /// When the supervisor starts a box's ended daemon again.
    restart_at: [Option<Instant>; 2],
    /// Daemons that ended by themselves, and how.
    exits: Vec<String>,
}

/// The shipped units' `RestartSec`.
const RESTART_SEC: Duration = Duration::from_secs(2);

impl Drill {
    /// etcd names box `i`, which holds its lease with its twin recorded
    /// in sync, and the other box follows it: (i, its epoch).
    async fn steady(&mut self, limit: Duration) -> Option<(usize, u64)> {
        let by = Instant::now() + limit;
        loop {
            self.supervise();
            if let Ok(Ok((epoch, fp, _))) =
                tokio::time::timeout(Duration::from_secs(2), self.arbiter.leader()).await
            {
                if let Some(i) = self.hosts.iter().position(|h| h.fp == fp) {
                    let p = primary_status_now(self.hosts[i].metrics).await;
                    let held = p
                        .as_ref()
                        .and_then(|s| s.arbiter.as_ref())
                        .is_some_and(|a| a.lease.held && a.twin_in_sync);
                    let follows = twin_status_now(self.hosts[1 - i].metrics)
                        .await
                        .is_some_and(|t| t.connected);
                    if held && follows && p.is_some_and(|s| s.epoch == epoch) {
                        return Some((i, epoch));
                    }
                }
            }
            if Instant::now() > by {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Box `i`'s daemon SIGKILLed.
    fn kill(&mut self, i: usize) -> Result<()> {
        self.killed[i] = true;
        match self.hosts[i].proc.as_mut() {
            Some(p) => p.sigkill(),
            None => Ok(()),
        }
    }

    fn start(&mut self, i: usize) -> Result<()> {
        self.killed[i] = false;
        self.restart_at[i] = None;
        let (pb, tb) = (self.primary_bin.clone(), self.twin_bin.clone());
        self.hosts[i].start(&pb, &tb)
    }

    /// A daemon that ended by itself is said, and started again
    /// `RESTART_SEC` later when supervised and its exit asks for it.
    fn supervise(&mut self) {
        for i in 0..2 {
            if self.killed[i] {
                continue;
            }
            if let Some(at) = self.restart_at[i] {
                if Instant::now() >= at {
                    println!("supervisor: box {} started again", self.hosts[i].name);
                    if let Err(e) = self.start(i) {
                        println!("supervisor: box {} did not start: {e}", self.hosts[i].name);
                    }
                }
                continue;
            }
            let Some(proc) = self.hosts[i].proc.as_mut() else {
                continue;
            };
            let Ok(Some((status, _))) = proc.try_finished() else {
                continue;
            };
            let said = format!("box {} ended by itself: {status}", self.hosts[i].name);
            println!("{said}\n{}", self.hosts[i].log_tail(8));
            self.exits.push(said);
            let restart = !status.success() && !matches!(status.code(), Some(2..=4));
            if self.supervised && restart {
                self.restart_at[i] = Some(Instant::now() + RESTART_SEC);
            }
        }
    }

    /// Let `d` pass, supervising.
    async fn pass(&mut self, d: Duration) {
        let by = Instant::now() + d;
        while Instant::now() < by {
            self.supervise();
            tokio::time::sleep(Duration::from_millis(50).min(by - Instant::now())).await;
        }
    }

    /// Until etcd names box `i` the leader, or `limit`.
    async fn named(&mut self, i: usize, limit: Duration) -> bool {
        let by = Instant::now() + limit;
        while Instant::now() < by {
            if let Ok(Ok((_, fp, _))) =
                tokio::time::timeout(Duration::from_secs(2), self.arbiter.leader()).await
            {
                if fp == self.hosts[i].fp {
                    return true;
                }
            }
            self.pass(Duration::from_millis(50)).await;
        }
        false
    }

    /// A copy of etcd's data now, kept for a rollback.
    fn snapshot(&mut self) -> Result<()> {
        let to = self
            .work
            .join(format!("etcd-snapshot-{}", self.snapshots.len()));
        self.etcd
            .snapshot_to(&to)
            .ctx(|| "a snapshot of etcd".into())?;
        self.snapshots.push(to);
        Ok(())
    }

    /// Break `fault` with `p` the primary, hold it, mend it.
    async fn apply(&mut self, fault: Fault, p: usize, hold: Duration, rng: &mut Rng) -> Result<()> {
        let t = 1 - p;
        match fault {
            Fault::KillPrimary | Fault::KillTwin => {
                let i = if fault == Fault::KillPrimary { p } else { t };
                self.kill(i)?;
                self.pass(hold).await;
                self.start(i)?;
            }
            Fault::WipeEtcd => {
                self.etcd.wipe().ctx(|| "wiping etcd".into())?;
                self.pass(hold).await;
            }
            Fault::RollbackEtcd => {
                // Any copy but the newest (taken this round): an etcd that
                // forgot what the pair went through since.
                let older = self.snapshots.len().saturating_sub(1).max(1);
                let pick = self.snapshots[rng.below(older as u64) as usize].clone();
                println!("etcd rolled back to {}", pick.display());
                self.etcd
                    .restore_from(&pick)
                    .ctx(|| "rolling etcd back".into())?;
                self.pass(hold).await;
            }
            Fault::SlowEtcd => {
                self.etcd.pause().ctx(|| "freezing etcd".into())?;
                self.pass(hold).await;
                self.etcd.resume().ctx(|| "thawing etcd".into())?;
            }
            Fault::DeposedFirstAfterWipe => {
                self.kill(p)?;
                if !self.named(t, HEAL).await {
                    return Err(DrillError(format!(
                        "box {} did not take over in {HEAL:?}\n{}",
                        self.hosts[t].name,
                        self.logs()
                    )));
                }
                // It acknowledges `local` writes alone a while.
                self.pass(hold / 2).await;
                self.kill(t)?;
                self.etcd.wipe().ctx(|| "wiping etcd".into())?;
                self.start(p)?;
                self.pass(hold).await;
                self.start(t)?;
            }
            Fault::CutPrimaryEtcd | Fault::CutPrimaryTwin | Fault::CutTwinEtcd => {
                let cut = |d: &Drill, on: bool| match fault {
                    Fault::CutPrimaryEtcd => d.to_etcd[p].cut(on),
                    Fault::CutPrimaryTwin => d.to_box[p].cut(on),
                    _ => d.to_etcd[t].cut(on),
                };
                cut(self, true);
                self.pass(hold).await;
                cut(self, false);
            }
            Fault::IsolatePrimary => {
                self.to_etcd[p].cut(true);
                self.to_box[p].cut(true);
                self.pass(hold).await;
                self.to_etcd[p].cut(false);
                self.to_box[p].cut(false);
            }
            Fault::StopPrimary => {
                self.hosts[p].signal(libc::SIGSTOP)?;
                self.pass(hold).await;
                self.hosts[p].signal(libc::SIGCONT)?;
            }
        }
        Ok(())
    }

    fn logs(&self) -> String {
        self.hosts
            .iter()
            .map(|h| format!("--- box {} ---\n{}", h.name, h.log_tail(25)))
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// The pair under `work`, not started: A the primary, B its twin.
async fn setup(work: &Path, etcd: Etcd, bins: (PathBuf, PathBuf)) -> Result<Drill> {
    let (a_dir, b_dir) = (work.join("a"), work.join("b"));
    let (a_listen, b_listen) = (testkit::free_udp(), testkit::free_udp());
    let (a_metrics, b_metrics) = (testkit::free_tcp(), testkit::free_tcp());
    let relay = |e: std::io::Error| DrillError(format!("a relay: {e}"));
    let to_etcd = [
        proxy::tcp(etcd.client_addr()).await.map_err(relay)?,
        proxy::tcp(etcd.client_addr()).await.map_err(relay)?,
    ];
    let to_box = [
        proxy::udp(a_listen).await.map_err(relay)?,
        proxy::udp(b_listen).await.map_err(relay)?,
    ];
    let (b_cfg, b_fp) = daemon::init_twin(&b_dir, to_box[0].addr, b_metrics, None)
        .ctx(|| "init box B (the twin)".into())?;
    let (a_cfg, a_fp) = daemon::init_primary(&a_dir, a_listen, a_metrics, Some(b_fp))
        .ctx(|| "init box A (the primary)".into())?;
    daemon::pin_primary(&b_cfg, a_fp).ctx(|| "pin A on B".into())?;
    let section = |i: usize| daemon::config::FailoverSection {
        etcd: vec![format!("http://{}", to_etcd[i].addr)],
        cluster: CLUSTER.into(),
        lease_ttl_s: TTL_S,
        auto_rejoin: true,
        advertise: Some(to_box[i].addr.into()),
        peer: Some(to_box[1 - i].addr.into()),
    };
    // `wait`: a `twin` append is never answered `local`, so the twin
    // stays recorded in sync and may take over after any fault.
    let durability = daemon::config::DurabilitySection {
        policy: daemon::config::Policy::Wait,
        timeout_ms: 300,
    };
    let mut a = PrimaryConfig::load(&a_cfg).ctx(|| "load A's primary.toml".into())?;
    a.timers = fast_timers();
    a.segment_bytes = 1 << 20;
    a.failover = Some(section(0));
    a.durability = durability.clone();
    std::fs::write(&a_cfg, a.render()).ctx(|| "write A's primary.toml".into())?;
    let mut b = TwinConfig::load(&b_cfg).ctx(|| "load B's twin.toml".into())?;
    b.timers = fast_timers();
    b.segment_bytes = 1 << 20;
    b.failover = Some(section(1));
    b.listen_as_primary = b_listen.into();
    b.as_primary.durability = durability;
    std::fs::write(&b_cfg, b.render()).ctx(|| "write B's twin.toml".into())?;
    let arbiter = Arbiter::connect(ArbiterOptions {
        endpoints: vec![etcd.endpoint()],
        cluster: CLUSTER.into(),
        ttl: Duration::from_secs(TTL_S),
        advertise: String::new(),
    })
    .await
    .ctx(|| "the drill's etcd client".into())?;
    let admin = Arc::new(admin_identity(&a_dir)?);
    let host = |name, dir, fp, listen, metrics| Host {
        name,
        dir,
        fp,
        listen,
        metrics,
        proc: None,
    };
    Ok(Drill {
        hosts: [
            host("A", a_dir, a_fp, a_listen, a_metrics),
            host("B", b_dir, b_fp, b_listen, b_metrics),
        ],
        to_etcd,
        to_box,
        arbiter,
        admin,
        primary_bin: bins.0,
        twin_bin: bins.1,
        etcd,
        snapshots: Vec::new(),
        work: work.to_owned(),
        supervised: true,
        killed: [false; 2],
        restart_at: [None; 2],
        exits: Vec::new(),
    })
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> ExitCode {
    drills::verdict("auto-failover", run().await)
}

async fn run() -> Result<bool> {
    let args = Args::parse(&[])?;
    let work = args.path("work")?;
    let rounds = args.num("rounds", 10)?;
    let seed = args.num("seed", 1)?;
    let broken = args.0.get("broken").cloned();
    match broken.as_deref() {
        None | Some("no-self-fence") | Some("trust-etcd") => {}
        Some(b) => {
            return Err(DrillError(format!(
                "--broken {b}: no-self-fence, trust-etcd or nothing"
            )))
        }
    }
    let bins = (args.path("primary-bin")?, args.path("twin-bin")?);
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work).ctx(|| format!("mkdir {}", work.display()))?;
    let etcd = Etcd::start(&work.join("etcd")).ctx(|| "start etcd".into())?;
    let mut d = setup(&work, etcd, bins).await?;
    let started = Instant::now();
    d.start(0)?;
    d.start(1)?;
    let Some((mut p, _)) = d.steady(HEAL).await else {
        return Err(DrillError(format!(
            "the pair never came up (A leading, B in sync) in {HEAL:?}\n{}",
            d.logs()
        )));
    };

    let shared = Arc::new(Shared::default());
    let dir: Directory = Arc::new([
        (d.hosts[0].fp, d.hosts[0].listen, d.hosts[0].metrics),
        (d.hosts[1].fp, d.hosts[1].listen, d.hosts[1].metrics),
    ]);
    let mut writers = Vec::new();
    for id in 0..TWIN_WRITERS + LOCAL_WRITERS + FOLLOWERS {
        let follows = id >= TWIN_WRITERS + LOCAL_WRITERS;
        let durability = if id < TWIN_WRITERS || (follows && id % 2 == 1) {
            Durability::Twin
        } else {
            Durability::Local
        };
        writers.push(tokio::spawn(writer(
            id,
            durability,
            follows,
            shared.clone(),
            d.arbiter.clone(),
            dir.clone(),
            d.admin.clone(),
        )));
    }

    if !loaded(&shared, 0).await {
        return Err(DrillError(format!(
            "the writers did not get {LOADED} acknowledgements of each durability in {HEAL:?}\n{}",
            d.logs()
        )));
    }
    let mut rng = Rng::new(seed);
    let (mut failovers, mut lost_total, mut twin_lost_total) = (0u64, 0u64, 0u64);
    let mut read_lost_total = 0u64;
    let mut least_gap_ms: Option<f64> = None;
    let mut violations = (0u64, 0u64, 0f64);
    let mut heal_ms: Vec<f64> = Vec::new();
    let mut healed_all = true;
    let mut rounds_done = 0u64;
    let mut checked = 0usize;
    let mut faults_seen: BTreeMap<&str, u64> = BTreeMap::new();
    let mut epochs_twice = 0usize;
    for round in 1..=rounds {
        let t_round = Instant::now();
        let fault = match broken.as_deref() {
            Some("no-self-fence") if round == 1 => Fault::IsolatePrimary,
            Some("trust-etcd") if round == 1 => Fault::DeposedFirstAfterWipe,
            _ => FAULTS[rng.below(FAULTS.len() as u64) as usize],
        };
        // One round in the middle runs without the supervisor: the pair
        // must heal with no daemon started again but by the drill.
        d.supervised = round != rounds.div_ceil(2);
        d.snapshot()?;
        let mut hold = Duration::from_millis(1000 + rng.below(5001));
        if broken.is_some() && round == 1 {
            hold = Duration::from_secs(6);
        }
        if fault == Fault::StopPrimary {
            hold += Duration::from_secs(TTL_S);
        }
        *faults_seen.entry(fault.name()).or_default() += 1;
        let before = lock(&shared.acks).len();

        let was = p;
        d.apply(fault, p, hold, &mut rng).await?;
        let mended = Instant::now();
        let Some((now_p, epoch)) = d.steady(HEAL).await else {
            println!(
                "FAIL: round {round} ({}, held {} ms, box {} the primary) did not heal: no primary holding its lease with its twin in sync after {HEAL:?}\n{}",
                fault.name(),
                hold.as_millis(),
                d.hosts[was].name,
                d.logs()
            );
            healed_all = false;
            break;
        };
        heal_ms.push(tenths(mended.elapsed().as_secs_f64() * 1000.0));
        // The primary after the round takes load before the check, so
        // each round checks acknowledgements of the life it ends with.
        let healed_at = lock(&shared.acks).len();
        if !loaded(&shared, healed_at).await {
            println!(
                "FAIL: round {round} ({}): the writers did not get {LOADED} acknowledgements of each durability in {HEAL:?} after it healed\n{}",
                fault.name(),
                d.logs()
            );
            healed_all = false;
            break;
        }
        p = now_p;
        if p != was {
            failovers += 1;
        }

        // The twin caught up with every `twin` acknowledgement so far.
        let acks: Vec<Ack> = lock(&shared.acks).clone();
        let twin_acks: Vec<&Ack> = acks.iter().filter(|a| a.twin).collect();
        let top = twin_acks.iter().map(|a| a.seq).max().unwrap_or(0);
        let caught_up = {
            let by = Instant::now() + HEAL;
            loop {
                let got = primary_status_now(d.hosts[p].metrics)
                    .await
                    .map_or(0, |s| s.twin_acked);
                if got >= top {
                    break true;
                }
                if Instant::now() > by {
                    break false;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        };
        let (lost, named) = missing_in(&d.hosts[p].dir.join(daemon::LOG_DIR), &twin_acks)?;
        let (twin_lost, twin_named) = if caught_up {
            missing_in(&d.hosts[1 - p].dir.join(daemon::LOG_DIR), &twin_acks)?
        } else {
            (
                0,
                vec![format!(
                    "the twin did not acknowledge up to {top} in {HEAL:?}"
                )],
            )
        };
        // This round's `twin` acknowledgements, read back through a client.
        let fresh: Vec<&Ack> = twin_acks.iter().skip(checked).copied().collect();
        checked = twin_acks.len();
        let step = fresh.len().div_ceil(READ_BACK).max(1);
        let mut read_lost = Vec::new();
        let c = drills::daemons::connect(
            &d.admin,
            d.hosts[p].fp,
            d.hosts[p].listen,
            Duration::from_secs(10),
        )
        .await?;
        for a in fresh.iter().step_by(step) {
            match c.read(a.seq).await {
                Ok(e) if e.meta == meta(a.writer, a.n) && crc32fast::hash(&e.blob) == a.crc => {}
                Ok(e) => read_lost.push(format!(
                    "frame {} reads back as {:?}",
                    a.seq,
                    String::from_utf8_lossy(&e.meta)
                )),
                Err(e) => read_lost.push(format!("frame {} does not read back: {e}", a.seq)),
            }
        }
        drop(c);
        let (sure, by_answer, worst, said) = epoch_order(&acks);
        let twice = epochs_on_two_boxes(&acks);
        if !twice.is_empty() && twice.len() > epochs_twice {
            println!(
                "BROKEN: round {round}: an epoch taken twice: {}",
                twice.join("; ")
            );
        }
        epochs_twice = twice.len();
        let gap = least_gap(&acks);
        let epochs: Vec<String> = acks[before..]
            .iter()
            .map(|a| a.epoch)
            .collect::<BTreeSet<u64>>()
            .into_iter()
            .map(|e| EpochName(e).to_string())
            .collect();
        let this_round = acks.len() - before;
        let twin_this = acks[before..].iter().filter(|a| a.twin).count();
        println!(
            "round {round}: {} on box {} for {} ms; box {} leads (epoch {}) {} ms after the mend; {this_round} acks ({twin_this} twin), epochs {epochs:?}; round {:.1} s",
            fault.name(),
            d.hosts[was].name,
            hold.as_millis(),
            d.hosts[p].name,
            EpochName(epoch),
            heal_ms.last().copied().unwrap_or_default(),
            t_round.elapsed().as_secs_f64()
        );
        if lost > 0 || !read_lost.is_empty() {
            println!(
                "LOST: round {round}: {} twin-acknowledged frames missing on the primary (box {}): {}",
                lost + read_lost.len() as u64,
                d.hosts[p].name,
                named.iter().chain(&read_lost).cloned().collect::<Vec<_>>().join("; ")
            );
        }
        if twin_lost > 0 || !caught_up {
            println!(
                "LOST: round {round}: {twin_lost} twin-acknowledged frames missing on the twin (box {}): {}",
                d.hosts[1 - p].name,
                twin_named.join("; ")
            );
        }
        if sure > violations.0 {
            println!(
                "BROKEN: round {round}: {sure} acknowledgements under an older epoch asked after the first answer under a newer one ({by_answer} by answer time); the worst: {}",
                said.unwrap_or_default()
            );
        }
        // The log checks cover every acknowledgement so far (a frame lost
        // stays lost); the read-back covers only this round's.
        lost_total = lost_total.max(lost);
        read_lost_total += read_lost.len() as u64;
        twin_lost_total = twin_lost_total.max(twin_lost + u64::from(!caught_up));
        violations = (sure, by_answer, worst);
        least_gap_ms = gap;
        rounds_done = round;
    }

    shared.stop.store(true, Ordering::SeqCst);
    for w in writers {
        let _ = w.await;
    }
    for h in &mut d.hosts {
        // A box the drill stopped would not hear SIGTERM.
        let _ = h.signal(libc::SIGCONT);
        if let Some(pr) = h.proc.as_mut() {
            let _ = pr.stop();
        }
    }
    let acks = lock(&shared.acks).clone();
    // Over every acknowledgement, a round that did not heal included.
    let (sure, by_answer, worst, said) = epoch_order(&acks);
    if sure > violations.0 {
        println!(
            "BROKEN: {sure} acknowledgements under an older epoch asked after the first answer under a newer one ({by_answer} by answer time); the worst: {}",
            said.unwrap_or_default()
        );
        violations = (sure, by_answer, worst);
    }
    let twice = epochs_on_two_boxes(&acks);
    if twice.len() > epochs_twice {
        println!("BROKEN: an epoch taken twice: {}", twice.join("; "));
        epochs_twice = twice.len();
    }
    let twin_acks = acks.iter().filter(|a| a.twin).count();
    let epochs: BTreeSet<u64> = acks.iter().map(|a| a.epoch).collect();
    let refused = lock(&shared.refused).clone();
    for (why, n) in lock(&shared.not_dialled).iter().take(8) {
        println!("   a writer could not dial the leader {n} times: {why}");
    }
    let lost_total = lost_total + read_lost_total;
    let exits = d.exits.len();
    let held = healed_all
        && lost_total == 0
        && twin_lost_total == 0
        && violations.0 == 0
        && epochs_twice == 0
        && exits == 0;
    println!(
        "auto-failover: {rounds_done} of {rounds} rounds, seed {seed}{}: {} acks ({twin_acks} twin) under {} epochs, {failovers} failovers, {} writer connections; refusals {refused:?}, {} appends failed",
        broken.as_deref().map_or(String::new(), |b| format!(", BROKEN={b}")),
        acks.len(),
        epochs.len(),
        shared.dials.load(Ordering::SeqCst),
        shared.failed.load(Ordering::SeqCst),
    );
    println!(
        "invariant: every twin-acknowledged frame on the primary and the twin at its sequence; no acknowledgement under epoch N asked after the first under a newer epoch; no epoch acknowledged on two boxes; no daemon ended by itself: {}",
        if held { "held" } else { "BROKEN" }
    );
    let mut fig = serde_json::Map::new();
    fig.insert("drill".into(), "auto-failover".into());
    fig.insert("rounds".into(), rounds_done.into());
    fig.insert("seed".into(), seed.into());
    fig.insert("acks".into(), (acks.len() as u64).into());
    fig.insert("twin_acks".into(), (twin_acks as u64).into());
    fig.insert("failovers".into(), failovers.into());
    fig.insert("epochs".into(), (epochs.len() as u64).into());
    fig.insert("lost".into(), lost_total.into());
    fig.insert("lost_on_twin".into(), twin_lost_total.into());
    fig.insert("epoch_order_violations".into(), violations.0.into());
    fig.insert("epochs_on_two_boxes".into(), (epochs_twice as u64).into());
    fig.insert("daemon_exits".into(), (exits as u64).into());
    fig.insert("epoch_order_by_answer".into(), violations.1.into());
    fig.insert("worst_violation_ms".into(), tenths(violations.2).into());
    fig.insert(
        "least_handover_gap_ms".into(),
        least_gap_ms.map(tenths).into(),
    );
    fig.insert(
        "heal_ms_max".into(),
        heal_ms.iter().copied().fold(0.0, f64::max).into(),
    );
    fig.insert(
        "faults".into(),
        serde_json::to_value(&faults_seen).unwrap_or_default(),
    );
    fig.insert("healed".into(), healed_all.into());
    fig.insert(
        "seconds".into(),
        tenths(started.elapsed().as_secs_f64()).into(),
    );
    if let Some(b) = &broken {
        fig.insert("broken".into(), b.clone().into());
    }
    println!("{}", serde_json::Value::Object(fig));
    Ok(held)
}
