//! The pair power-cut drill's workload, run inside a guest: the real
//! `primary` daemon with its data on the logged disk (QEMU's
//! `blklogwrites`), the real `twin` daemon with its data on a tmpfs (it
//! does not lose power), both on the guest's loopback. Clients append
//! frames from a small alphabet with `twin` and `local` durability; after
//! each answer, a supervisor thread writes a marker (seq, durability,
//! crc) to the raw region of the primary's disk with O_DIRECT|O_DSYNC, so
//! the disk's own write order says which answers came before each moment.
//! At the end it waits for the twin to hold the primary's head, writes the
//! last marker and stops both daemons with SIGTERM.
//!
//! Parameters come from the kernel command line (`drill.KEY=VALUE`), or
//! from `--cmdline FILE`.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use twinlog::daemon::{self, PrimaryConfig, TwinConfig};
use twinlog::node::{Client, Durability, Status, TwinStatus};

use drills::marker::{Ack, MarkerWriter};
use drills::pair::{alphabet, check_alphabet, KIND};
use drills::{Context, DrillError, GuestParams, Result, Rng};

struct Params {
    dev: String,
    marker_at: u64,
    marker_slots: u64,
    primary_cfg: PathBuf,
    twin_cfg: PathBuf,
    appends: u64,
    clients: u64,
    seed: u64,
}

fn params() -> Result<Params> {
    let g = GuestParams::read()?;
    Ok(Params {
        dev: g.text("dev", "/dev/vda"),
        marker_at: g.num("marker", 0)?,
        marker_slots: g.num("slots", 8192)?,
        primary_cfg: g.text("pcfg", "/mnt/p/primary.toml").into(),
        twin_cfg: g.text("tcfg", "/t/twin/twin.toml").into(),
        appends: g.num("scale", 1)?.max(1) * g.num("appends", 120)?,
        clients: g.num("clients", 4)?.max(1),
        seed: g.num("seed", 1)?,
    })
}

/// A daemon of the guest, its stderr in a file on the guest's tmpfs (/t).
struct Daemon {
    child: Child,
    log: PathBuf,
}

impl Daemon {
    fn start(bin: &str, config: &Path, log: &str) -> Result<Daemon> {
        let file = std::fs::File::create(log).ctx(|| format!("create {log}"))?;
        let child = Command::new(bin)
            .args(["serve", "--config"])
            .arg(config)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(file)
            .spawn()
            .ctx(|| format!("start {bin}"))?;
        Ok(Daemon {
            child,
            log: log.into(),
        })
    }

    /// SIGTERM, and wait for the clean shutdown.
    fn stop(mut self) -> Result<std::process::ExitStatus> {
        let pid = libc::pid_t::try_from(self.child.id())
            .map_err(|_| DrillError("a pid out of range".into()))?;
        // SAFETY: kill(2) on the pid of a child not yet reaped.
        unsafe { libc::kill(pid, libc::SIGTERM) };
        self.child.wait().ctx(|| "wait for a daemon".into())
    }

    /// The last lines it logged, for a failure's report.
    fn tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(8)..].join("\n")
    }
}

/// Poll `f` every 20 ms until it answers Some; an error after `limit`.
fn until<T>(what: &str, limit: Duration, mut f: impl FnMut() -> Option<T>) -> Result<T> {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(v) = f() {
            return Ok(v);
        }
        if Instant::now() > deadline {
            return Err(DrillError(format!("{what}: not within {limit:?}")));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The clients: `p.clients` of them, each appending its share of
/// `p.appends` one after another (so groups form across clients), a
/// letter and a durability drawn from the seed; every answer goes to the
/// marker writer.
async fn clients(p: &Params, pcfg: &PrimaryConfig, tx: mpsc::Sender<Ack>) -> Result<(u64, u64)> {
    let admin = daemon::load_identity(&pcfg.data_dir.join(daemon::ADMIN_DIR))
        .ctx(|| "the admin identity".into())?;
    let me = daemon::load_identity(&pcfg.data_dir).ctx(|| "the primary's identity".into())?;
    let addr = pcfg
        .listen
        .resolve()
        .ctx(|| "the primary's address".into())?;
    let letters = alphabet();
    check_alphabet(&letters)?;
    let mut tasks = Vec::new();
    for c in 0..p.clients {
        let client = Client::connect(&admin, me.fingerprint(), addr)
            .await
            .ctx(|| "connect to the primary".into())?;
        let (tx, letters) = (tx.clone(), letters.clone());
        let n = p.appends / p.clients + u64::from(c < p.appends % p.clients);
        let mut rng = Rng::new(p.seed ^ ((c + 1) << 40));
        tasks.push(tokio::spawn(async move {
            let (mut twin, mut local) = (0u64, 0u64);
            for _ in 0..n {
                let l = &letters[rng.below(letters.len() as u64) as usize];
                let want = if rng.below(3) == 0 {
                    Durability::Local
                } else {
                    Durability::Twin
                };
                let (seq, got) = client
                    .append(KIND, &l.meta, &l.blob, want)
                    .await
                    .ctx(|| format!("append {want:?}"))?;
                if want == Durability::Twin && got != Durability::Twin {
                    return Err(DrillError(format!(
                        "a twin append answered {got:?} at {seq}"
                    )));
                }
                let on_twin = got == Durability::Twin;
                tx.send(Ack::Durable {
                    seq,
                    kind: KIND,
                    crc: l.crc,
                    twin: on_twin,
                })
                .map_err(|_| DrillError("the marker writer is gone".into()))?;
                if on_twin {
                    twin += 1;
                } else {
                    local += 1;
                }
            }
            Ok::<_, DrillError>((twin, local))
        }));
    }
    let (mut twin, mut local) = (0, 0);
    for t in tasks {
        let (a, b) = t.await.ctx(|| "a client task".into())??;
        twin += a;
        local += b;
    }
    Ok((twin, local))
}

fn run() -> Result<String> {
    let started = Instant::now();
    let p = params()?;
    let pcfg = PrimaryConfig::load(&p.primary_cfg).ctx(|| "the primary's configuration".into())?;
    let tcfg = TwinConfig::load(&p.twin_cfg).ctx(|| "the twin's configuration".into())?;
    let twin = Daemon::start("/twin", &p.twin_cfg, "/t/twin.log")?;
    let primary = Daemon::start("/primary", &p.primary_cfg, "/t/primary.log")?;
    let connected = until("the twin follows", Duration::from_secs(300), || {
        daemon::fetch_status::<TwinStatus>(tcfg.metrics.clone())
            .ok()
            .filter(|(_, s)| s.connected)
    });
    if let Err(e) = connected {
        return Err(DrillError(format!(
            "{e}\nprimary:\n{}\ntwin:\n{}",
            primary.tail(),
            twin.tail()
        )));
    }
    let connected_s = started.elapsed().as_secs_f64();
    let mut markers = MarkerWriter::open(&p.dev, p.marker_at, p.marker_slots)?;
    let (tx, rx) = mpsc::channel::<Ack>();
    let writer = std::thread::spawn(move || -> Result<u64> {
        for ack in rx {
            markers.write(ack)?;
        }
        Ok(markers.written())
    });
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .ctx(|| "tokio runtime".into())?;
    let worked = rt.block_on(clients(&p, &pcfg, tx.clone()));
    // Every frame on the twin before the last marker: the final disk and
    // the twin's final log then hold the same frames.
    let converged = match &worked {
        Err(_) => Err(DrillError("the clients failed".into())),
        Ok(_) => Ok(()),
    }
    .and_then(|()| {
        let head = daemon::fetch_status::<Status>(pcfg.metrics.clone())
            .ctx(|| "the primary's status".into())?
            .1
            .head;
        until(
            "the twin holds the primary's head",
            Duration::from_secs(120),
            || {
                daemon::fetch_status::<TwinStatus>(tcfg.metrics.clone())
                    .ok()
                    .filter(|(_, s)| s.head >= head)
            },
        )
        .map(|_| head)
    });
    if converged.is_ok() {
        tx.send(Ack::Done)
            .map_err(|_| DrillError("the marker writer is gone".into()))?;
    }
    drop(tx);
    let written = writer
        .join()
        .map_err(|_| DrillError("the marker writer panicked".into()))?;
    let primary_exit = primary.stop()?;
    let twin_exit = twin.stop()?;
    let (acked_twin, acked_local) = worked?;
    let head = converged?;
    let markers = written?;
    if !primary_exit.success() || !twin_exit.success() {
        return Err(DrillError(format!(
            "the daemons did not stop cleanly: primary {primary_exit}, twin {twin_exit}"
        )));
    }
    Ok(serde_json::json!({
        "head": head,
        "markers": markers,
        "acked_twin": acked_twin,
        "acked_local": acked_local,
        "connected_s": (connected_s * 10.0).round() / 10.0,
        "seconds": (started.elapsed().as_secs_f64() * 10.0).round() / 10.0,
    })
    .to_string())
}

fn main() -> ExitCode {
    match run() {
        Ok(json) => {
            println!("GUEST-DONE {json}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            println!("GUEST-FAILED {e}");
            ExitCode::FAILURE
        }
    }
}
