//! The soak: a pair of real daemons under a mixed load for a long time,
//! with retention caps on both boxes. Eight clients append small frames
//! with `twin` durability in a closed loop, a large blob goes every few
//! seconds, pushes reach the store and a repository is erased now and
//! then. Every `--sample-secs` the drill samples each box's log size, RSS
//! and open descriptors, the throughput, the twin's lag, and reads back a
//! sample of acknowledged frames the primary still retains.
//!
//! Bounds: each log at most its cap plus one segment (and the largest
//! frame); RSS and descriptors flat (the last quarter's median at most 10%
//! above the first quarter's); throughput steady (the last quarter at least
//! 80% of the first); every sampled acknowledged frame reads back intact.
//!
//! `soak-drill --primary-bin P --twin-bin T --work DIR [--seconds 600]
//! [--sample-secs 10] [--cap-mib 32] [--segment-mib 4] [--seed S]
//! [--broken no-twin-cap]`

use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use twinlog::daemon::TwinConfig;
use twinlog::node::{Client, Durability};

use drills::daemons::{self, connect, dir_bytes, Bins, Pair, PairOpts, Proc};
use drills::{Args, Context, DrillError, Result, Rng};

const APP_KIND: u16 = 0x8000;
const CLIENTS: usize = 8;
const BLOB_BYTES: usize = 2 << 20;
const BLOB_EVERY: Duration = Duration::from_secs(5);
const PUSH_EVERY: Duration = Duration::from_millis(250);
const ERASE_EVERY: Duration = Duration::from_secs(30);
/// Acknowledged frames kept for the read-back check: one in this many.
const KEEP_ONE_IN: u64 = 16;
const CHECKS_PER_SAMPLE: usize = 32;

/// An acknowledged frame kept for the read-back check.
#[derive(Clone, Copy)]
struct Acked {
    seq: u64,
    crc: u32,
    len: usize,
}

#[derive(Default)]
struct Shared {
    acks: AtomicU64,
    bytes: AtomicU64,
    kept: Mutex<Vec<Acked>>,
    errors: Mutex<Vec<String>>,
    stop: AtomicBool,
}

impl Shared {
    fn error(&self, e: String) {
        let mut errs = self.errors.lock().unwrap_or_else(|e| e.into_inner());
        if errs.len() < 10 {
            errs.push(e);
        }
    }
}

fn small_frame(client: usize, i: u64, rng: &mut Rng) -> (Vec<u8>, Vec<u8>) {
    let meta = format!("soak {client} {i}").into_bytes();
    let len = 64 + rng.below(448) as usize;
    let blob: Vec<u8> = (0..len)
        .map(|j| (j as u64 ^ i ^ client as u64) as u8)
        .collect();
    (meta, blob)
}

async fn appender(c: Client, client: usize, seed: u64, sh: Arc<Shared>) {
    let mut rng = Rng::new(seed);
    let mut i = 0u64;
    while !sh.stop.load(Ordering::Relaxed) {
        let (meta, blob) = small_frame(client, i, &mut rng);
        match c.append(APP_KIND, &meta, &blob, Durability::Twin).await {
            Ok((seq, _)) => {
                sh.acks.fetch_add(1, Ordering::Relaxed);
                sh.bytes.fetch_add(blob.len() as u64, Ordering::Relaxed);
                if rng.below(KEEP_ONE_IN) == 0 {
                    let mut h = crc32fast::Hasher::new();
                    h.update(&meta);
                    h.update(&blob);
                    sh.kept
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .push(Acked {
                            seq,
                            crc: h.finalize(),
                            len: blob.len(),
                        });
                }
            }
            Err(e) => sh.error(format!("client {client}: append: {e}")),
        }
        i += 1;
    }
}

/// Large blobs, pushes and erases, interleaved.
async fn mixed(c: Client, sh: Arc<Shared>) {
    let blob: Vec<u8> = (0..BLOB_BYTES).map(|i| (i * 31 % 251) as u8).collect();
    for repo in ["soak", "soak-erased"] {
        if let Err(e) = c.create_repo(repo, Durability::Twin).await {
            sh.error(format!("create {repo}: {e}"));
        }
    }
    let (mut next_blob, mut next_erase) = (Instant::now(), Instant::now() + ERASE_EVERY);
    let mut heads: [Option<[u8; 20]>; 2] = [None, None];
    let mut n = 0u64;
    while !sh.stop.load(Ordering::Relaxed) {
        let now = Instant::now();
        if now >= next_blob {
            next_blob = now + BLOB_EVERY;
            if let Err(e) = c
                .append(APP_KIND + 1, b"blob", &blob, Durability::Twin)
                .await
            {
                sh.error(format!("blob: {e}"));
            }
        }
        for (k, repo) in ["soak", "soak-erased"].iter().enumerate() {
            let data = format!("{repo} object {n} {}", "x".repeat(512)).into_bytes();
            match feature_push(&c, repo, &data, heads[k]).await {
                Ok(oid) => heads[k] = Some(oid),
                Err(e) => sh.error(format!("push {repo}: {e}")),
            }
        }
        n += 1;
        if now >= next_erase {
            next_erase = now + ERASE_EVERY;
            match c.status().await {
                Ok(s) => {
                    let erased = c
                        .erase(s.head + 1, &["soak-erased".to_owned()], Durability::Twin)
                        .await;
                    match erased {
                        Ok(_) => heads[1] = None,
                        Err(e) => sh.error(format!("erase: {e}")),
                    }
                }
                Err(e) => sh.error(format!("status: {e}")),
            }
        }
        tokio::time::sleep(PUSH_EVERY).await;
    }
}

async fn feature_push(
    c: &Client,
    repo: &str,
    data: &[u8],
    old: Option<[u8; 20]>,
) -> Result<[u8; 20]> {
    let mut pack = twinlog::store::PackBuilder::new();
    let oid = pack
        .add(twinlog::objects::ObjType::Blob, data)
        .ctx(|| format!("a pack for {repo}"))?;
    // After an erase the ref still names an erased commit: move it from
    // wherever it is.
    let refs = c.refs(repo).await.ctx(|| format!("refs of {repo}"))?;
    let old = refs.get("refs/heads/main").copied().or(old);
    c.push(
        repo,
        &pack.into_bytes(),
        vec![twinlog::node::api::RefMove {
            name: "refs/heads/main".into(),
            old,
            new: Some(oid),
        }],
        Durability::Twin,
    )
    .await
    .ctx(|| format!("push to {repo}"))?;
    Ok(oid)
}

/// VmRSS in bytes and the number of open descriptors of a process.
fn rss_and_fds(pid: Option<u32>) -> (u64, u64) {
    let Some(pid) = pid else { return (0, 0) };
    let rss = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map_or(0, |kib| kib * 1024);
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count() as u64);
    (rss, fds)
}

#[derive(Clone, Copy, Default, Debug)]
struct Sample {
    t: f64,
    plog: u64,
    tlog: u64,
    prss: u64,
    trss: u64,
    pfds: u64,
    tfds: u64,
    appends_per_s: f64,
    lag_frames: u64,
    lag_ms: u64,
    checked: u64,
}

fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// The first and last quarter's medians of a series.
fn quarters(samples: &[Sample], f: impl Fn(&Sample) -> f64) -> (f64, f64) {
    let q = (samples.len() / 4).max(1);
    let first = median(samples[..q.min(samples.len())].iter().map(&f).collect());
    let last = median(
        samples[samples.len().saturating_sub(q)..]
            .iter()
            .map(&f)
            .collect(),
    );
    (first, last)
}

async fn run(args: &Args) -> Result<bool> {
    let bins = Bins {
        primary: args.path("primary-bin")?,
        twin: args.path("twin-bin")?,
    };
    let work = args.path("work")?;
    let seconds = args.num("seconds", 600)?;
    let every = Duration::from_secs(args.num("sample-secs", 10)?.max(1));
    let cap = args.num("cap-mib", 32)? << 20;
    let segment = args.num("segment-mib", 4)? << 20;
    let seed = args.num("seed", 1)?;
    let broken = args.0.get("broken").cloned();
    let twin_cap = match broken.as_deref() {
        None => cap,
        Some("no-twin-cap") => 0,
        Some(other) => return Err(DrillError(format!("--broken {other}: not a control"))),
    };
    if work.exists() {
        std::fs::remove_dir_all(&work).ctx(|| format!("clear {}", work.display()))?;
    }
    std::fs::create_dir_all(&work).ctx(|| format!("mkdir {}", work.display()))?;
    let pair = Pair::init(
        &work,
        &PairOpts {
            segment_bytes: segment,
            max_bytes: cap,
            restore: None,
        },
    )?;
    let mut t = TwinConfig::load(&pair.tcfg).ctx(|| "load twin.toml".into())?;
    t.retention.max_bytes = twin_cap;
    std::fs::write(&pair.tcfg, t.render()).ctx(|| "write twin.toml".into())?;
    let mut primary = Proc::serve(&bins.primary, &pair.pcfg, &work.join("primary.stderr"))?;
    let mut twin = Proc::serve(&bins.twin, &pair.tcfg, &work.join("twin.stderr"))?;
    let admin = pair.admin()?;
    let sh = Arc::new(Shared::default());
    let mut tasks = Vec::new();
    for i in 0..CLIENTS {
        let c = connect(
            &admin,
            pair.primary_fp,
            pair.listen,
            Duration::from_secs(20),
        )
        .await?;
        tasks.push(tokio::spawn(appender(
            c,
            i,
            seed * 100 + i as u64,
            sh.clone(),
        )));
    }
    let c = connect(
        &admin,
        pair.primary_fp,
        pair.listen,
        Duration::from_secs(20),
    )
    .await?;
    tasks.push(tokio::spawn(mixed(c, sh.clone())));
    let checker = connect(
        &admin,
        pair.primary_fp,
        pair.listen,
        Duration::from_secs(20),
    )
    .await?;

    let started = Instant::now();
    let mut samples = Vec::new();
    let mut rng = Rng::new(seed ^ 0x50a4);
    let (mut last_acks, mut last_t) = (0u64, started);
    let mut lost = Vec::new();
    let mut checked_total = 0u64;
    while started.elapsed() < Duration::from_secs(seconds) {
        tokio::time::sleep(every).await;
        let now = Instant::now();
        let acks = sh.acks.load(Ordering::Relaxed);
        let rate = (acks - last_acks) as f64 / now.duration_since(last_t).as_secs_f64();
        (last_acks, last_t) = (acks, now);
        let st = daemons::primary_status(pair.primary_metrics)?;
        let picks: Vec<Acked> = {
            let kept = sh.kept.lock().unwrap_or_else(|e| e.into_inner());
            (0..CHECKS_PER_SAMPLE.min(kept.len()))
                .map(|_| kept[rng.below(kept.len() as u64) as usize])
                .collect()
        };
        let mut checked = 0;
        for a in picks {
            if a.seq < st.first {
                continue; // retention dropped it, as it may
            }
            match checker.read(a.seq).await {
                Ok(e) => {
                    let mut h = crc32fast::Hasher::new();
                    h.update(&e.meta);
                    h.update(&e.blob);
                    if e.blob.len() != a.len || h.finalize() != a.crc {
                        lost.push(format!("frame {} reads back different", a.seq));
                    }
                }
                Err(e) => {
                    // Retention may have passed it since the status.
                    if a.seq >= daemons::primary_status(pair.primary_metrics)?.first {
                        lost.push(format!("frame {}: {e}", a.seq));
                    }
                }
            }
            checked += 1;
        }
        checked_total += checked;
        let (prss, pfds) = rss_and_fds(primary.pid());
        let (trss, tfds) = rss_and_fds(twin.pid());
        let s = Sample {
            t: started.elapsed().as_secs_f64(),
            plog: dir_bytes(&pair.plog()),
            tlog: dir_bytes(&pair.tlog()),
            prss,
            trss,
            pfds,
            tfds,
            appends_per_s: rate,
            lag_frames: st.lag_frames,
            lag_ms: st.lag_ms,
            checked,
        };
        eprintln!(
            "soak: t {:>5.0} s  logs {:>6.1} / {:>6.1} MiB  rss {:>5.1} / {:>5.1} MiB  fds {} / {}  {:>7.0} appends/s  lag {} frames {} ms  checked {}",
            s.t,
            s.plog as f64 / 1048576.0,
            s.tlog as f64 / 1048576.0,
            s.prss as f64 / 1048576.0,
            s.trss as f64 / 1048576.0,
            s.pfds,
            s.tfds,
            s.appends_per_s,
            s.lag_frames,
            s.lag_ms,
            s.checked
        );
        samples.push(s);
        if primary.try_finished()?.is_some() || twin.try_finished()?.is_some() {
            lost.push("a daemon exited during the soak".into());
            break;
        }
    }
    sh.stop.store(true, Ordering::Relaxed);
    for t in tasks {
        let _ = tokio::time::timeout(Duration::from_secs(30), t).await;
    }
    let tstatus = daemons::twin_status(pair.twin_metrics).ok();
    primary.stop()?;
    twin.stop()?;

    let mut broken_bounds = Vec::new();
    // The open segment is preallocated, and a frame larger than a segment
    // gets a segment of its own.
    let slack = segment + BLOB_BYTES as u64 + 4096;
    let pmax = samples.iter().map(|s| s.plog).max().unwrap_or(0);
    let tmax = samples.iter().map(|s| s.tlog).max().unwrap_or(0);
    if pmax > cap + slack {
        broken_bounds.push(format!("the primary's log reached {pmax} bytes, cap {cap}"));
    }
    if tmax > cap + slack {
        broken_bounds.push(format!("the twin's log reached {tmax} bytes, cap {cap}"));
    }
    let flat = |name: &str, f: &dyn Fn(&Sample) -> f64, slack_abs: f64| {
        let (first, last) = quarters(&samples, f);
        (last > first * 1.1 + slack_abs).then(|| {
            format!("{name} grew: first quarter's median {first:.0}, last quarter's {last:.0}")
        })
    };
    broken_bounds.extend(flat("the primary's RSS", &|s| s.prss as f64, 0.0));
    broken_bounds.extend(flat("the twin's RSS", &|s| s.trss as f64, 0.0));
    // Descriptors are few: one more is within the noise.
    broken_bounds.extend(flat("the primary's descriptors", &|s| s.pfds as f64, 1.0));
    broken_bounds.extend(flat("the twin's descriptors", &|s| s.tfds as f64, 1.0));
    let (tp_first, tp_last) = quarters(&samples, |s| s.appends_per_s);
    if tp_last < tp_first * 0.8 {
        broken_bounds.push(format!(
            "throughput fell: {tp_first:.0} appends/s in the first quarter, {tp_last:.0} in the last"
        ));
    }
    if samples.len() < 4 {
        broken_bounds.push(format!("only {} samples", samples.len()));
    }
    broken_bounds.extend(lost.iter().take(5).cloned());
    let errors = sh.errors.lock().unwrap_or_else(|e| e.into_inner()).clone();
    broken_bounds.extend(errors.iter().take(5).map(|e| format!("load: {e}")));
    let (prss_first, prss_last) = quarters(&samples, |s| s.prss as f64);
    let (trss_first, trss_last) = quarters(&samples, |s| s.trss as f64);
    let (pfds_first, pfds_last) = quarters(&samples, |s| s.pfds as f64);
    let (tfds_first, tfds_last) = quarters(&samples, |s| s.tfds as f64);
    let mib = |b: f64| daemons::tenths(b / 1048576.0);
    let json = serde_json::json!({
        "drill": "soak",
        "broken": broken,
        "seconds": daemons::tenths(started.elapsed().as_secs_f64()),
        "samples": samples.len(),
        "cap_mib": mib(cap as f64),
        "twin_cap_mib": mib(twin_cap as f64),
        "segment_mib": mib(segment as f64),
        "primary_log_max_mib": mib(pmax as f64),
        "twin_log_max_mib": mib(tmax as f64),
        "primary_rss_mib": [mib(prss_first), mib(prss_last)],
        "twin_rss_mib": [mib(trss_first), mib(trss_last)],
        "primary_fds": [pfds_first, pfds_last],
        "twin_fds": [tfds_first, tfds_last],
        "appends_per_s": [tp_first.round(), tp_last.round()],
        "acks": sh.acks.load(Ordering::Relaxed),
        "lag_frames_max": samples.iter().map(|s| s.lag_frames).max().unwrap_or(0),
        "lag_ms_max": samples.iter().map(|s| s.lag_ms).max().unwrap_or(0),
        "acked_frames_checked": checked_total,
        "acked_frames_lost": lost.len(),
        "twin_segments_dropped": tstatus.map_or(0, |s| s.retention.dropped_segments),
        "broken_bounds": broken_bounds,
        "ok": broken_bounds.is_empty(),
    });
    println!("{json}");
    for b in &broken_bounds {
        eprintln!("soak: BOUND BROKEN: {b}");
    }
    Ok(broken_bounds.is_empty())
}

fn main() -> ExitCode {
    let args = match Args::parse(&[]) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("soak-drill: {e}");
            return ExitCode::from(2);
        }
    };
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("soak-drill: a runtime: {e}");
            return ExitCode::from(2);
        }
    };
    match rt.block_on(run(&args)) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("soak-drill: {e}");
            ExitCode::from(2)
        }
    }
}
