//! The drills of the features that came after replication, on the real
//! `primary` and `twin` binaries as host processes:
//!
//! - `twin-crash-mid-entry`: the twin SIGKILLed while it receives a large
//!   entry (64 to 128 MiB, appended with `twin` durability), several times;
//! - `restore-interrupted`: `primary restore` on a fresh box SIGKILLed at
//!   random moments, then run to completion, then served as a primary
//!   that the twin follows;
//! - `retention-hole`: the twin stopped while clients append well past the
//!   primary's `max_bytes`; it comes back below the floor, installs a
//!   snapshot and converges;
//! - `erase-both`: a repository erased through the daemons; no raw file of
//!   either box, nor of a box restored from the twin, holds its bytes;
//! - `promote`: the primary killed, the twin promoted; the promoted box
//!   serves every acknowledged frame and the old primary is refused by
//!   epoch;
//! - `failover-cycle`: cycles of kill, promote, fence, rejoin and
//!   switchover; every twin acknowledgement kept, the divergent tail saved
//!   exactly, a rejoin moving only what lies past the fork
//!   (`--broken no-fence|no-save`: the negative controls, which must fail).
//!
//! Each prints a summary, its invariant and one JSON line of figures, and
//! exits 0 only when the invariant held (1 when it broke, 2 when the drill
//! itself could not run).
//!
//! `feature-drill --drill NAME --primary-bin P --twin-bin T --work DIR
//! [--rounds N] [--seed S] [--broken MODE]`

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use twinlog::net::{Fingerprint, Identity};
use twinlog::node::{Client, Durability};

use drills::content::bytes;
use drills::daemons::{tenths, Bins};
use drills::{Args, Context, DrillError, Result, Rng};

mod erase;
mod failover_cycle;
mod promote;
mod restore;
mod retention;
mod twin_crash;

/// The kind of the drills' own frames (an application kind).
pub const APP_KIND: u16 = 0x8000;
/// The kind of their large entries.
pub const BIG_KIND: u16 = 0x8001;

/// What a drill is given.
pub struct Setup {
    pub bins: Bins,
    pub work: PathBuf,
    pub rounds: u64,
    pub rng: Rng,
    pub args: Args,
}

/// What a drill found: its summary lines, failures and figures.
pub struct Outcome {
    pub name: &'static str,
    pub lines: Vec<String>,
    pub invariant: String,
    pub failures: Vec<String>,
    pub figures: serde_json::Map<String, serde_json::Value>,
}

impl Outcome {
    pub fn new(name: &'static str, invariant: &str) -> Outcome {
        Outcome {
            name,
            lines: Vec::new(),
            invariant: invariant.to_owned(),
            failures: Vec::new(),
            figures: serde_json::Map::new(),
        }
    }

    pub fn line(&mut self, s: String) {
        eprintln!("   {s}");
        self.lines.push(s);
    }

    pub fn fail(&mut self, s: String) {
        if self.failures.len() < 20 {
            eprintln!("FAIL: {s}");
        }
        self.failures.push(s);
    }

    pub fn fig(&mut self, key: &str, v: impl Into<serde_json::Value>) {
        self.figures.insert(key.to_owned(), v.into());
    }
}

/// A frame the workload appended and had acknowledged.
#[derive(Clone, Copy, Debug)]
pub struct Acked {
    pub seq: u64,
    pub n: u64,
    pub got: Durability,
}

/// The meta of workload frame `n`: its tag and number.
pub fn small_meta(tag: &str, n: u64) -> Vec<u8> {
    format!("{tag} {n}").into_bytes()
}

/// The blob of workload frame `n` whose length `len` gives.
pub fn small_blob(n: u64, len: usize) -> Vec<u8> {
    bytes(n, len)
}

/// 64 B to 3 KB.
pub fn small_len(n: u64) -> usize {
    64 + (n as usize * 97) % 3000
}

/// Where the appenders dial: a primary, as its admin client.
#[derive(Clone)]
pub struct Dial {
    pub admin: Arc<Identity>,
    pub fp: Fingerprint,
    pub addr: SocketAddr,
}

/// Clients appending from another task until told to stop.
pub struct Load {
    pub tag: &'static str,
    pub len: fn(u64) -> usize,
    pub acked: Mutex<Vec<Acked>>,
    pub errors: AtomicU64,
    pub stop: AtomicBool,
}

impl Load {
    pub fn new(tag: &'static str, len: fn(u64) -> usize) -> Arc<Load> {
        Arc::new(Load {
            tag,
            len,
            acked: Mutex::new(Vec::new()),
            errors: AtomicU64::new(0),
            stop: AtomicBool::new(false),
        })
    }

    pub fn acked(&self) -> Vec<Acked> {
        self.acked.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    pub fn count(&self, want: Durability) -> usize {
        self.acked
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter(|a| a.got == want)
            .count()
    }

    /// The meta and blob frame `n` was appended with.
    pub fn frame(&self, n: u64) -> (Vec<u8>, Vec<u8>) {
        (small_meta(self.tag, n), small_blob(n, (self.len)(n)))
    }

    /// `clients` appenders asking for `want`, `pace` between appends; each
    /// dials again whenever its primary is gone. Client `w` appends the
    /// frames `n` = `w` mod `clients` (numbering from `first`).
    pub fn spawn(
        self: &Arc<Load>,
        dial: &Dial,
        clients: u64,
        first: u64,
        want: Durability,
        pace: Duration,
    ) -> Vec<tokio::task::JoinHandle<()>> {
        (0..clients)
            .map(|w| {
                let (dial, load) = (dial.clone(), self.clone());
                tokio::spawn(async move {
                    let mut n = first + w;
                    let mut client: Option<Client> = None;
                    while !load.stop.load(Ordering::SeqCst) {
                        if client.is_none() {
                            let dialed = tokio::time::timeout(
                                Duration::from_millis(500),
                                Client::connect(&dial.admin, dial.fp, dial.addr),
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
                        let (meta, blob) = load.frame(n);
                        let appended = tokio::time::timeout(
                            Duration::from_secs(3),
                            c.append(APP_KIND, &meta, &blob, want),
                        )
                        .await;
                        match appended {
                            Ok(Ok((seq, got))) => {
                                load.acked
                                    .lock()
                                    .unwrap_or_else(|e| e.into_inner())
                                    .push(Acked { seq, n, got });
                                n += clients;
                            }
                            Ok(Err(_)) => {
                                load.errors.fetch_add(1, Ordering::SeqCst);
                                n += clients;
                                client = None;
                                tokio::time::sleep(Duration::from_millis(20)).await;
                            }
                            // A primary gone mid-append is noticed only at
                            // QUIC's idle timeout; dial again sooner.
                            Err(_) => {
                                n += clients;
                                client = None;
                            }
                        }
                        if !pace.is_zero() {
                            tokio::time::sleep(pace).await;
                        }
                    }
                })
            })
            .collect()
    }

    /// Stop the appenders and wait for them.
    pub async fn halt(&self, workers: Vec<tokio::task::JoinHandle<()>>) {
        self.stop.store(true, Ordering::SeqCst);
        for w in workers {
            let _ = tokio::time::timeout(Duration::from_secs(10), w).await;
        }
    }

    /// Wait until `more` acknowledgements as `want` past those counted now.
    pub async fn progress(&self, more: usize, want: Durability, limit: Duration) -> bool {
        let at = self.count(want) + more;
        drills::daemons::wait_for(limit, Duration::from_millis(5), || {
            (self.count(want) >= at).then_some(())
        })
        .await
        .is_some()
    }
}

/// Whether `frames` holds frame `a` as the workload wrote it, byte for byte.
pub fn holds(log: &twinlog::log::Log, load: &Load, a: &Acked) -> bool {
    let (meta, blob) = load.frame(a.n);
    log.read(a.seq)
        .is_ok_and(|e| e.kind == APP_KIND && e.meta == meta && e.blob == blob)
}

pub async fn settle(ms: u64) {
    tokio::time::sleep(Duration::from_millis(ms)).await;
}

const DRILLS: &[(&str, &str)] = &[
    (
        "twin-crash-mid-entry",
        "SIGKILL the twin while it receives a 64-128 MiB entry",
    ),
    (
        "restore-interrupted",
        "SIGKILL `primary restore` at random moments, then finish it",
    ),
    (
        "retention-hole",
        "the twin away while the primary's log passes its byte cap",
    ),
    (
        "erase-both",
        "erase a repository; scan every raw file of both boxes for its bytes",
    ),
    (
        "promote",
        "kill the primary, promote the twin, restart the old primary",
    ),
    (
        "failover-cycle",
        "kill, promote, fence, rejoin by truncate-to-fork, switch over back: N cycles",
    ),
];

async fn drill(args: Args) -> Result<bool> {
    let started = Instant::now();
    let name = args
        .0
        .get("drill")
        .cloned()
        .ok_or_else(|| DrillError("--drill is required".into()))?;
    if name == "list" {
        for (n, what) in DRILLS {
            println!("{n:22} {what}");
        }
        return Ok(true);
    }
    let work = args.path("work")?;
    if work.exists() {
        std::fs::remove_dir_all(&work).ctx(|| format!("clear {}", work.display()))?;
    }
    std::fs::create_dir_all(&work).ctx(|| format!("create {}", work.display()))?;
    let setup = Setup {
        bins: Bins {
            primary: args.path("primary-bin")?,
            twin: args.path("twin-bin")?,
        },
        work,
        rounds: args.num("rounds", 0)?,
        rng: Rng::new(args.num("seed", 1)?),
        args,
    };
    let mut out = match name.as_str() {
        "twin-crash-mid-entry" => twin_crash::run(setup).await?,
        "restore-interrupted" => restore::run(setup).await?,
        "retention-hole" => retention::run(setup).await?,
        "erase-both" => erase::run(setup).await?,
        "promote" => promote::run(setup).await?,
        "failover-cycle" => failover_cycle::run(setup).await?,
        other => return Err(DrillError(format!("no drill named {other}"))),
    };
    let ok = out.failures.is_empty();
    println!("{}:", out.name);
    for l in &out.lines {
        println!("  {l}");
    }
    println!(
        "invariant ({}): {} ({} failures)",
        out.invariant,
        if ok { "held" } else { "BROKEN" },
        out.failures.len()
    );
    for f in out.failures.iter().take(10) {
        println!("  {f}");
    }
    out.fig("failures", out.failures.len());
    out.fig("seconds", tenths(started.elapsed().as_secs_f64()));
    out.fig("passed", ok);
    let mut json = serde_json::Map::new();
    json.insert("drill".into(), out.name.into());
    json.extend(out.figures);
    println!("{}", serde_json::Value::Object(json));
    Ok(ok)
}

fn main() -> ExitCode {
    let run = Args::parse(&["late-clients", "force-promote"]).and_then(|args| {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .ctx(|| "tokio runtime".into())?;
        rt.block_on(drill(args))
    });
    match run {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("feature-drill: {e}");
            ExitCode::from(2)
        }
    }
}

/// Push one blob object to `repo`'s `refs/heads/main`, moving it from
/// `old`; answers the object's id.
pub async fn push_blob(
    c: &Client,
    repo: &str,
    data: &[u8],
    old: Option<[u8; 20]>,
    want: Durability,
) -> Result<[u8; 20]> {
    let mut pack = twinlog::store::PackBuilder::new();
    let oid = pack
        .add(twinlog::objects::ObjType::Blob, data)
        .ctx(|| format!("a pack for {repo}"))?;
    c.push(
        repo,
        &pack.into_bytes(),
        vec![twinlog::node::api::RefMove {
            name: "refs/heads/main".into(),
            old,
            new: Some(oid),
        }],
        want,
    )
    .await
    .ctx(|| format!("push to {repo}"))?;
    Ok(oid)
}

/// A box's store as a checker compares it: per repository, its refs and
/// its object ids (sorted), read after the daemon stopped.
pub type StoreView = Vec<(
    String,
    std::collections::BTreeMap<String, [u8; 20]>,
    Vec<Vec<u8>>,
)>;

pub fn store_view(data: &std::path::Path) -> Result<StoreView> {
    let log = twinlog::log::Log::open_with(data.join(twinlog::daemon::LOG_DIR), 1 << 20)
        .ctx(|| format!("open the log of {}", data.display()))?;
    let mut store = twinlog::store::Store::open(
        data.join(twinlog::daemon::STORE_DIR),
        log.history(),
        twinlog::store::StoreOptions::default(),
    )
    .ctx(|| format!("open the store of {}", data.display()))?;
    store
        .catch_up(&log)
        .ctx(|| format!("catch up the store of {}", data.display()))?;
    let names: Vec<String> = store.repos().map(str::to_owned).collect();
    names
        .into_iter()
        .map(|n| {
            let r = store.repo(&n).ctx(|| format!("repository {n}"))?;
            let mut oids = r.object_ids().ctx(|| format!("objects of {n}"))?;
            oids.sort();
            Ok((n, r.refs(), oids))
        })
        .collect()
}
