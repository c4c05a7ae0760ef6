//! A pair archiving to Garage, as the archive drills run it: the key and
//! credentials in files of mode 0600, `[archive]` as an operator writes
//! it, the real daemons started and waited for until the twin uploads;
//! writers that append with `twin` durability in a closed loop up to a
//! limit the drill raises, keeping every acknowledged frame; polls of the
//! daemons' `/status`; and `primary restore --from-archive` run into a
//! fresh box.

use std::future::Future;
use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use testkit::garage;
use twinlog::archive::archiver::ArchiveStatus;
use twinlog::daemon::config::ArchiveSection;
use twinlog::daemon::{self, PrimaryConfig, TwinConfig};
use twinlog::node::{Client, Durability, TwinStatus};

use crate::archive::{payload, Acked, Sent};
use crate::daemons::{primary_status_now, twin_status_now, Bins, Pair, PairOpts, Proc};
use crate::{Context, DrillError, Result, Rng};

pub const KIND: u16 = 0x8000;
pub const POLL: Duration = Duration::from_millis(100);
/// Distinct payloads the writers repeat at other sequences.
pub const REPEATS: usize = 4;
/// One frame in this many is a repeat.
const REPEAT_ONE_IN: u64 = 8;
/// The one frame of several 4 MiB pieces (an object past 8 MiB goes as a
/// multipart upload).
pub const HUGE_BYTES: usize = (9 << 20) + 12_345;

pub fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// What the writers share.
pub struct Load {
    pub acked: Mutex<Acked>,
    pub count: AtomicU64,
    pub bytes: AtomicU64,
    pub repeats: AtomicU64,
    /// Acknowledged `local` although `twin` was asked (the policy is
    /// `wait`: never).
    pub local: AtomicU64,
    pub failed: AtomicU64,
    pub errors: Mutex<Vec<String>>,
    /// A sequence acknowledged twice.
    pub twice: Mutex<Vec<u64>>,
    pub huge_at: AtomicU64,
    /// Acknowledged frames at which the writers wait: raised as the drill
    /// goes on.
    pub limit: AtomicU64,
    pub stop: AtomicBool,
}

impl Default for Load {
    fn default() -> Load {
        Load {
            acked: Mutex::new(Acked::new()),
            count: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
            repeats: AtomicU64::new(0),
            local: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            errors: Mutex::new(Vec::new()),
            twice: Mutex::new(Vec::new()),
            huge_at: AtomicU64::new(0),
            limit: AtomicU64::new(0),
            stop: AtomicBool::new(false),
        }
    }
}

impl Load {
    pub fn count(&self) -> u64 {
        self.count.load(Ordering::SeqCst)
    }

    /// Let the writers go on to `n` acknowledged frames in all.
    pub fn allow(&self, n: u64) {
        self.limit.store(n, Ordering::SeqCst);
    }

    /// Wait until the writers reached their limit.
    pub async fn reached(&self, limit: Duration) -> Result<()> {
        let want = self.limit.load(Ordering::SeqCst);
        wait_on("the writers' frames acknowledged", limit, || async {
            let n = self.count();
            if n >= want {
                Ok(())
            } else {
                Err(format!("{n} of {want} acknowledged"))
            }
        })
        .await
    }
}

/// The frames the writers send.
#[derive(Clone, Debug)]
pub struct Shape {
    /// The pair's segment bytes.
    pub segment: u64,
    /// Writer 0 appends a frame larger than a segment every this many
    /// frames (0: never).
    pub large_every: u64,
    /// Writer 0 sends one frame of `HUGE_BYTES` once this many frames were
    /// acknowledged in all (`u64::MAX`: never).
    pub huge_after: u64,
}

/// The payloads the writers repeat at other sequences (the same bytes,
/// the same payload crc).
pub fn repeats(rng: &mut Rng) -> Arc<Vec<Arc<Sent>>> {
    Arc::new(
        (0..REPEATS)
            .map(|i| {
                let len = 200 + rng.below(5000) as usize;
                Arc::new(Sent {
                    kind: KIND,
                    meta: b"repeat".to_vec(),
                    blob: payload(rng, len, i % 2 == 0),
                })
            })
            .collect(),
    )
}

/// The frame a writer sends next: of 64 B to 6 KiB, half random bytes,
/// half a repeated word; one in eight a repeat.
fn next_frame(
    w: u64,
    n: u64,
    rng: &mut Rng,
    repeats: &[Arc<Sent>],
    shape: &Shape,
    huge: bool,
) -> (Arc<Sent>, bool) {
    if huge {
        let blob = payload(rng, HUGE_BYTES, true);
        let meta = format!("w{w} #{n} huge").into_bytes();
        return (
            Arc::new(Sent {
                kind: KIND,
                meta,
                blob,
            }),
            false,
        );
    }
    if rng.below(REPEAT_ONE_IN) == 0 {
        return (repeats[rng.below(REPEATS as u64) as usize].clone(), true);
    }
    let large = w == 0 && shape.large_every > 0 && n % shape.large_every == shape.large_every - 1;
    let len = if large {
        // Past a segment: a segment of its own.
        (shape.segment + rng.below(shape.segment * 2)) as usize
    } else {
        64 + rng.below(6000) as usize
    };
    let random = rng.below(2) == 0;
    let blob = payload(rng, len, random);
    let meta = format!("w{w} #{n}").into_bytes();
    (
        Arc::new(Sent {
            kind: KIND,
            meta,
            blob,
        }),
        false,
    )
}

/// A writer: `twin` appends in a closed loop up to the load's limit
/// until told to stop, each acknowledgement kept.
pub async fn writer(
    w: u64,
    c: Client,
    seed: u64,
    repeats: Arc<Vec<Arc<Sent>>>,
    shape: Shape,
    load: Arc<Load>,
) {
    let mut rng = Rng::new(seed.wrapping_mul(1000) + w);
    let mut n = 0u64;
    let mut huge_sent = w != 0;
    while !load.stop.load(Ordering::SeqCst) {
        if load.count() >= load.limit.load(Ordering::SeqCst) {
            tokio::time::sleep(POLL).await;
            continue;
        }
        let huge = !huge_sent && load.count() >= shape.huge_after;
        let (sent, repeat) = next_frame(w, n, &mut rng, &repeats, &shape, huge);
        n += 1;
        match c
            .append(KIND, &sent.meta, &sent.blob, Durability::Twin)
            .await
        {
            Ok((seq, got)) => {
                if huge {
                    huge_sent = true;
                    load.huge_at.store(seq, Ordering::SeqCst);
                }
                if got != Durability::Twin {
                    load.local.fetch_add(1, Ordering::SeqCst);
                }
                load.bytes
                    .fetch_add(sent.blob.len() as u64, Ordering::SeqCst);
                if repeat {
                    load.repeats.fetch_add(1, Ordering::SeqCst);
                }
                if lock(&load.acked).insert(seq, sent).is_some() {
                    lock(&load.twice).push(seq);
                }
                load.count.fetch_add(1, Ordering::SeqCst);
            }
            Err(e) => {
                load.failed.fetch_add(1, Ordering::SeqCst);
                {
                    let mut errs = lock(&load.errors);
                    if errs.len() < 5 {
                        errs.push(format!("writer {w}: {e}"));
                    }
                }
                // The policy is `wait`: an error is the connection's; try
                // again after a breath rather than spin.
                tokio::time::sleep(POLL).await;
            }
        }
    }
}

/// Until `f` answers Ok, polled; its last Err (what it saw) after `limit`.
pub async fn wait_on<T, F, Fut>(what: &str, limit: Duration, mut f: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = std::result::Result<T, String>>,
{
    let by = Instant::now() + limit;
    loop {
        match f().await {
            Ok(v) => return Ok(v),
            Err(seen) if Instant::now() > by => {
                return Err(DrillError(format!(
                    "still not {what} after {limit:?}; last seen: {seen}"
                )))
            }
            Err(_) => tokio::time::sleep(POLL).await,
        }
    }
}

/// The twin's archive status, or what stands in for it.
pub async fn twin_archive(
    metrics: SocketAddr,
) -> std::result::Result<(TwinStatus, ArchiveStatus), String> {
    let t = twin_status_now(metrics)
        .await
        .ok_or_else(|| "the twin does not answer /status".to_owned())?;
    let a = t
        .archive
        .clone()
        .ok_or_else(|| "the twin's status shows no archive".to_owned())?;
    Ok((t, a))
}

pub fn brief(a: &ArchiveStatus) -> String {
    format!(
        "floor {}, lag {} segments ({} bytes, {} s), {} uploaded, error {:?}",
        a.floor, a.lag_segments, a.lag_bytes, a.lag_secs, a.uploaded_segments, a.last_error
    )
}

/// `text` (an `[archive]` table) appended to the configuration at `cfg`.
pub fn with_archive(cfg: &Path, text: &str) -> Result<()> {
    use std::io::Write;
    std::fs::OpenOptions::new()
        .append(true)
        .open(cfg)
        .and_then(|mut f| f.write_all(text.as_bytes()))
        .ctx(|| format!("add [archive] to {}", cfg.display()))
}

/// The last `n` lines of a daemon's stderr.
pub fn last_lines(path: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// A file of mode 0600 holding `text`.
pub fn private(path: &Path, text: &str) -> Result<()> {
    std::fs::write(path, text).ctx(|| format!("write {}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        .ctx(|| format!("chmod {}", path.display()))
}

/// The archive's key (from `primary archive-key`) and Garage's
/// credentials, in files of mode 0600 under `dir`.
#[derive(Clone, Debug)]
pub struct Secrets {
    pub key_file: PathBuf,
    pub creds: PathBuf,
}

impl Secrets {
    pub fn make(dir: &Path, primary_bin: &Path) -> Result<Secrets> {
        std::fs::create_dir_all(dir).ctx(|| format!("mkdir {}", dir.display()))?;
        let key_file = dir.join("archive.key");
        crate::daemons::run(
            primary_bin,
            &["archive-key", "--out", &key_file.display().to_string()],
        )?;
        let creds = dir.join("s3.toml");
        private(
            &creds,
            &format!(
                "access_key_id = \"{}\"\nsecret_access_key = \"{}\"\n",
                garage::KEY_ID,
                garage::SECRET
            ),
        )?;
        Ok(Secrets { key_file, creds })
    }

    /// `[archive]` as an operator writes it (keys left out take their
    /// defaults): `s3://BUCKET/prefix` at `endpoint`, the twin uploading,
    /// encrypted, zstd 3, paced at `pace_mib` MiB/s (0: unpaced).
    pub fn archive_toml(&self, prefix: &str, endpoint: &str, pace_mib: u64) -> String {
        format!(
            "\n[archive]\nurl = \"s3://{}/{prefix}\"\nendpoint = \"{endpoint}\"\nregion = \"{}\"\ncredentials_file = \"{}\"\nuploader = \"twin\"\nzstd_level = 3\nkey_file = \"{}\"\nmax_mib_per_s = {pace_mib}\n",
            garage::BUCKET,
            garage::REGION,
            self.creds.display(),
            self.key_file.display(),
        )
    }
}

/// A pair serving with `[archive]` on both boxes.
pub struct Archiving {
    pub pair: Pair,
    pub primary: Proc,
    pub twin: Proc,
    pub section: ArchiveSection,
    pub plog_err: PathBuf,
    pub tlog_err: PathBuf,
}

impl Archiving {
    /// A pair under `work` with `archive_toml` on both boxes and `[retention]
    /// max_bytes` of `opts.max_bytes` on the primary and `twin_cap` on the
    /// twin, started and waited for until the twin streams and uploads.
    pub async fn start(
        work: &Path,
        bins: &Bins,
        opts: &PairOpts,
        archive_toml: &str,
        twin_cap: u64,
        limit: Duration,
    ) -> Result<Archiving> {
        let pair = Pair::init(work, opts)?;
        with_archive(&pair.pcfg, archive_toml)?;
        with_archive(&pair.tcfg, archive_toml)?;
        let section = PrimaryConfig::load(&pair.pcfg)
            .ctx(|| "load primary.toml".into())?
            .archive
            .ok_or_else(|| DrillError("primary.toml has no [archive] after adding it".into()))?;
        let mut t = TwinConfig::load(&pair.tcfg).ctx(|| "load twin.toml".into())?;
        t.retention.max_bytes = twin_cap;
        std::fs::write(&pair.tcfg, t.render()).ctx(|| "write twin.toml".into())?;
        let (plog_err, tlog_err) = (work.join("primary.stderr"), work.join("twin.stderr"));
        let mut primary = Proc::serve(&bins.primary, &pair.pcfg, &plog_err)?;
        let mut twin = Proc::serve(&bins.twin, &pair.tcfg, &tlog_err)?;
        let (pm, tm) = (pair.primary_metrics, pair.twin_metrics);
        let up_by = Instant::now() + limit;
        loop {
            for (proc, log) in [(&mut primary, &plog_err), (&mut twin, &tlog_err)] {
                if let Some((status, _)) = proc.try_finished()? {
                    return Err(DrillError(format!(
                        "a daemon exited at its start ({status}): {}",
                        last_lines(log, 5)
                    )));
                }
            }
            let p = primary_status_now(pm).await;
            let a = twin_archive(tm).await;
            if p.as_ref().is_some_and(|p| p.twin_connected)
                && a.as_ref().is_ok_and(|(_, a)| a.uploading)
            {
                break;
            }
            if Instant::now() > up_by {
                return Err(DrillError(format!(
                    "the pair did not come up archiving in {limit:?}: twin connected {:?}, twin's archive {:?}",
                    p.map(|p| p.twin_connected),
                    a.map(|(_, a)| brief(&a))
                )));
            }
            tokio::time::sleep(POLL).await;
        }
        Ok(Archiving {
            pair,
            primary,
            twin,
            section,
            plog_err,
            tlog_err,
        })
    }
}

/// One `primary restore --from-archive` into a fresh box.
#[derive(Debug)]
pub struct RestoreRun {
    /// The restored box's log directory.
    pub log_dir: PathBuf,
    pub ok: bool,
    pub exit: String,
    pub seconds: f64,
    /// Its JSON report (when it succeeded).
    pub report: serde_json::Value,
    /// Its last line on stderr: the error, when it failed.
    pub error: String,
    /// Its whole stderr.
    pub stderr: String,
}

/// Restore a fresh box in `dir` (made here) with `primary restore
/// --from-archive`, to `until` or to the end (None).
pub fn run_restore(
    primary_bin: &Path,
    dir: &Path,
    section: &ArchiveSection,
    segment: u64,
    until: Option<u64>,
) -> Result<RestoreRun> {
    let (cfg, _) = daemon::init_primary(dir, testkit::free_udp(), testkit::free_tcp(), None)
        .ctx(|| format!("init {}", dir.display()))?;
    let mut c = PrimaryConfig::load(&cfg).ctx(|| format!("load {}", cfg.display()))?;
    c.archive = Some(section.clone());
    c.segment_bytes = segment;
    std::fs::write(&cfg, c.render()).ctx(|| format!("write {}", cfg.display()))?;
    let mut args = vec![
        "restore".to_owned(),
        "--config".to_owned(),
        cfg.display().to_string(),
        "--from-archive".to_owned(),
        section.url.clone(),
        "--json".to_owned(),
    ];
    if let Some(u) = until {
        args.extend(["--until".to_owned(), u.to_string()]);
    }
    let t0 = Instant::now();
    let out = Command::new(primary_bin)
        .args(&args)
        .stdin(Stdio::null())
        .output()
        .ctx(|| format!("run {} restore", primary_bin.display()))?;
    let seconds = t0.elapsed().as_secs_f64();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let error = stderr
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("")
        .to_owned();
    let report = if out.status.success() {
        serde_json::from_slice(&out.stdout).ctx(|| {
            format!(
                "restore: its JSON report: {:?}",
                String::from_utf8_lossy(&out.stdout)
            )
        })?
    } else {
        serde_json::Value::Null
    };
    Ok(RestoreRun {
        log_dir: dir.join(daemon::LOG_DIR),
        ok: out.status.success(),
        exit: out.status.to_string(),
        seconds,
        report,
        error,
        stderr,
    })
}
