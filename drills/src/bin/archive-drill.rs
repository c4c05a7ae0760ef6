//! The archive drill: a primary and a twin (the real binaries) archiving
//! every sealed segment to a three-node Garage (every node holds a
//! replica; the daemons' endpoint is node 0), encrypted and zstd'ed, with
//! small segments and a small `[retention] max_bytes` on both boxes, so
//! that frames leave both boxes and only the archive keeps them. The
//! uploads are paced below the load, so the archive lags and retention
//! must wait for it.
//!
//! Writers append with `twin` durability the whole time and keep every
//! acknowledged frame: frames of random and of compressible bytes, frames
//! whose bytes repeat at other sequences (the same payload crc, to catch
//! a frame taken for another by its crc), frames larger than a segment and
//! one of 9 MiB (pieces of 4 MiB, a multipart upload). Under that load:
//!
//! 1. node 1 (not the endpoint) is SIGKILLed while uploads are under way,
//!    and uploads must go on on the other two (Garage writes a quorum of
//!    two); it is started again;
//! 2. node 0, the daemons' endpoint, is SIGKILLed: uploads and listings
//!    fail and a daemon shows the error, retention on both boxes holds
//!    what is not archived while the load goes on; it is started again
//!    and the uploads must resume.
//!
//! A restarted node is connected to the others at once
//! (`Garage::restart_node`), so each fault is one node down, never two.
//!
//! Then the load stops, the twin archives all it sealed (`lag_segments`
//! 0, no error), both daemons are SIGKILLed and both data directories
//! deleted, and the log is restored with `primary restore --from-archive
//! --until SEQ` into a fresh box at three points: a frame early in the
//! log, the last frame of an archived segment near the middle, and the
//! last archived frame (the twin's archive floor - 1). The first two are
//! below both boxes' first retained frame when they were killed.
//!
//! After each restore every acknowledged frame up to the point must be
//! there with its kind, meta and bytes, and no frame past it (`LOST frame
//! N`, `DIFFER frame N`). A restore that fails while acknowledged frames
//! up to its point are missing from the bucket is `LOST` too.
//!
//! `--broken archive-floor-off` names the negative control: both daemons
//! built with `drill-sabotage` and run with
//! `TWINLOG_DRILL_SABOTAGE=archive-floor-off`, so retention ignores the
//! archive's floor and drops segments before they are uploaded; the drill
//! must fail. The control runs the load without Garage's faults: their
//! staging waits on uploads, which the sabotage starves.
//!
//! Every wait is on the daemons' `/status` or the writers' count, polled.
//! Exits 0 when the invariant held, 1 when it broke (or the archive did
//! not recover after a Garage node came back), 2 when the drill could not
//! run.
//!
//! `archive-drill --primary-bin P --twin-bin T --work DIR [--frames N]
//! [--seed S] [--segment-kib 256] [--cap-kib 1024] [--pace-mib 2]
//! [--broken archive-floor-off]`

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use testkit::garage::Garage;
use twinlog::daemon::config::ArchiveSection;
use twinlog::net::Identity;
use twinlog::node::TwinStatus;

use drills::archive::{acked_in, check_restored, holes, runs, Acked};
use drills::archive_pair::{
    brief, lock, repeats, run_restore, twin_archive, wait_on, writer, Archiving, Load, Secrets,
    Shape,
};
use drills::daemons::{
    connect, dir_bytes, primary_status_now, tenths, twin_status_now, Bins, PairOpts,
};
use drills::{Args, Context, DrillError, Result, Rng};

const WRITERS: u64 = 4;
/// How long the pair, Garage or a state may take before the drill gives up.
const WAIT: Duration = Duration::from_secs(120);
/// Writer 0 appends a frame larger than a segment every this many frames.
const LARGE_EVERY: u64 = 700;
/// The daemons' endpoint (killed second), and a node that only holds
/// replicas (killed first).
const ENDPOINT_NODE: usize = 0;
const REPLICA_NODE: usize = 1;
const SABOTAGE: &str = "archive-floor-off";
/// What the sabotaged daemons log once retention ignores the floor.
const SABOTAGE_SAYS: &str = "retention ignores the archive";

/// Kill Garage's node `node` (SIGKILL; its data stays).
fn kill_node(g: &mut Garage, node: usize) -> Result<()> {
    tokio::task::block_in_place(|| g.nodes[node].kill()).ctx(|| format!("kill Garage node {node}"))
}

/// Start Garage's node `node` again, connected to the others.
fn restart_node(g: &mut Garage, node: usize) -> Result<()> {
    tokio::task::block_in_place(|| g.restart_node(node))
        .ctx(|| format!("restart Garage node {node}"))
}

/// Where the drill is: seconds since its start, frames acknowledged.
fn stamp(started: Instant, load: &Load) -> String {
    format!(
        "{:.1} s, {} acknowledged",
        started.elapsed().as_secs_f64(),
        load.count()
    )
}

/// What a sampler sees while the load runs and the archive catches up.
struct Peaks {
    /// Peak bytes of each box's log.
    primary: AtomicU64,
    twin: AtomicU64,
    /// Samples in which the twin's retention said the archive held it.
    held_by_archive: AtomicU64,
    /// Set at the endpoint's restart: when, and the twin's archive floor
    /// then.
    armed: Mutex<Option<(Instant, u64)>>,
    /// Milliseconds from that restart until the twin's status showed its
    /// floor past the outage's, and no error (`u64::MAX`: not yet).
    floor_moved_ms: AtomicU64,
    error_cleared_ms: AtomicU64,
}

impl Default for Peaks {
    fn default() -> Peaks {
        Peaks {
            primary: AtomicU64::new(0),
            twin: AtomicU64::new(0),
            held_by_archive: AtomicU64::new(0),
            armed: Mutex::new(None),
            floor_moved_ms: AtomicU64::new(u64::MAX),
            error_cleared_ms: AtomicU64::new(u64::MAX),
        }
    }
}

impl Peaks {
    fn observe(&self, t: &TwinStatus) {
        if t.retention.held_by == "archive" {
            self.held_by_archive.fetch_add(1, Ordering::SeqCst);
        }
        let armed = *lock(&self.armed);
        if let (Some((at, floor)), Some(a)) = (armed, &t.archive) {
            let ms = at.elapsed().as_millis() as u64;
            if a.floor > floor {
                self.floor_moved_ms.fetch_min(ms, Ordering::SeqCst);
            }
            if a.last_error.is_none() {
                self.error_cleared_ms.fetch_min(ms, Ordering::SeqCst);
            }
        }
    }
}

fn ms_or_null(v: &AtomicU64) -> serde_json::Value {
    match v.load(Ordering::SeqCst) {
        u64::MAX => serde_json::Value::Null,
        ms => ms.into(),
    }
}

async fn sample(
    pair: Arc<(PathBuf, PathBuf, SocketAddr)>,
    peaks: Arc<Peaks>,
    stop: Arc<AtomicBool>,
) {
    while !stop.load(Ordering::SeqCst) {
        peaks
            .primary
            .fetch_max(dir_bytes(&pair.0), Ordering::SeqCst);
        peaks.twin.fetch_max(dir_bytes(&pair.1), Ordering::SeqCst);
        if let Some(t) = twin_status_now(pair.2).await {
            peaks.observe(&t);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// What the Garage faults measured (zero in the control, which skips them).
#[derive(Default)]
struct Faults {
    replica_down_ms: f64,
    replica_uploads: u64,
    endpoint_down_ms: f64,
    resume_ms: f64,
}

/// One restore's outcome.
struct Point {
    until: u64,
    what: &'static str,
    seconds: f64,
    restored: bool,
    checked: u64,
    lost: u64,
    differ: u64,
    past: u64,
    error: Option<String>,
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> ExitCode {
    drills::verdict("archive", run().await)
}

async fn run() -> Result<bool> {
    let args = Args::parse(&[])?;
    let bins = Bins {
        primary: args.path("primary-bin")?,
        twin: args.path("twin-bin")?,
    };
    let work = args.path("work")?;
    let frames = args.num("frames", 24_000)?.max(1000);
    let seed = args.num("seed", 1)?;
    let segment = args.num("segment-kib", 256)? << 10;
    let cap = args.num("cap-kib", 1024)? << 10;
    let pace = args.num("pace-mib", 2)?.max(1);
    let broken = args.0.get("broken").cloned();
    match broken.as_deref() {
        None | Some(SABOTAGE) => {}
        Some(b) => return Err(DrillError(format!("--broken {b}: {SABOTAGE} or nothing"))),
    }
    if broken.is_some() && std::env::var("TWINLOG_DRILL_SABOTAGE").as_deref() != Ok(SABOTAGE) {
        return Err(DrillError(format!(
            "--broken {SABOTAGE} needs TWINLOG_DRILL_SABOTAGE={SABOTAGE} in the environment (drills/run sets it)"
        )));
    }
    if work.exists() {
        std::fs::remove_dir_all(&work).ctx(|| format!("clear {}", work.display()))?;
    }
    std::fs::create_dir_all(&work).ctx(|| format!("mkdir {}", work.display()))?;
    // The configurations name files by absolute paths.
    let work = std::path::absolute(&work).ctx(|| format!("{}", work.display()))?;
    let started = Instant::now();

    // Garage: three nodes, each holding a replica of everything.
    let mut g = tokio::task::block_in_place(|| Garage::start(&work.join("garage"), 3))
        .ctx(|| "start Garage (three nodes)".into())?;
    let secrets = Secrets::make(&work.join("secrets"), &bins.primary)?;
    let archive_toml = secrets.archive_toml("drill", &g.endpoint(ENDPOINT_NODE), pace);
    let Archiving {
        pair,
        mut primary,
        mut twin,
        section,
        plog_err,
        tlog_err,
    } = Archiving::start(
        &work,
        &bins,
        &PairOpts {
            segment_bytes: segment,
            max_bytes: cap,
            restore: None,
        },
        &archive_toml,
        cap,
        WAIT,
    )
    .await?;
    let (pm, tm) = (pair.primary_metrics, pair.twin_metrics);

    // The load.
    let admin: Arc<Identity> = Arc::new(pair.admin()?);
    let load = Arc::new(Load::default());
    load.allow(frames / 2);
    let mut rng = Rng::new(seed ^ 0xa2c1);
    let repeats = repeats(&mut rng);
    let mut writers = Vec::new();
    for w in 0..WRITERS {
        let c = connect(
            &admin,
            pair.primary_fp,
            pair.listen,
            Duration::from_secs(20),
        )
        .await?;
        writers.push(tokio::spawn(writer(
            w,
            c,
            seed,
            repeats.clone(),
            Shape {
                segment,
                large_every: LARGE_EVERY,
                huge_after: frames / 2,
            },
            load.clone(),
        )));
    }
    let peaks = Arc::new(Peaks::default());
    let sampler_stop = Arc::new(AtomicBool::new(false));
    let sampler = tokio::spawn(sample(
        Arc::new((pair.plog(), pair.tlog(), tm)),
        peaks.clone(),
        sampler_stop.clone(),
    ));
    let mut broken_lines: Vec<String> = Vec::new();

    let load_rate_from = Instant::now();
    // The control skips Garage's faults: its point is retention that
    // ignores the archive, and the uploads it starves (their segments gone
    // from the log before they are read) would stall the staging below,
    // which waits on uploads, so it could end "could not run" rather than
    // by its invariant.
    let faults = if broken.is_none() {
        // 1. A replica's node killed with uploads under way: they go on.
        wait_on(
            "a third of the load in, uploads under way",
            WAIT,
            || async {
                let n = load.count();
                let (_, a) = twin_archive(tm).await?;
                if n >= frames / 3 && a.uploaded_segments >= 2 {
                    Ok(())
                } else {
                    Err(format!("{n} acknowledged; {}", brief(&a)))
                }
            },
        )
        .await?;
        let (_, before) = twin_archive(tm).await.map_err(DrillError)?;
        kill_node(&mut g, REPLICA_NODE)?;
        let replica_killed = Instant::now();
        load.limit.store(frames * 2 / 3, Ordering::SeqCst);
        let replica_uploads = wait_on(
            "two more uploads with one replica's node down",
            WAIT,
            || async {
                let (_, a) = twin_archive(tm).await?;
                if a.uploaded_segments >= before.uploaded_segments + 2 {
                    Ok(a.uploaded_segments - before.uploaded_segments)
                } else {
                    Err(brief(&a))
                }
            },
        )
        .await;
        let replica_down_ms = tenths(replica_killed.elapsed().as_secs_f64() * 1000.0);
        restart_node(&mut g, REPLICA_NODE)?;
        let replica_uploads = match replica_uploads {
            Ok(n) => n,
            Err(e) => {
                broken_lines.push(format!(
                    "BROKEN: uploads stopped with one of three Garage nodes down: {e}"
                ));
                0
            }
        };
        eprintln!(
            "archive: [{}] Garage node {REPLICA_NODE} down {replica_down_ms} ms, {replica_uploads} segments uploaded meanwhile",
            stamp(started, &load)
        );

        // 2. The endpoint's node killed: uploads fail, retention holds, the
        // load goes on; back, the uploads resume.
        kill_node(&mut g, ENDPOINT_NODE)?;
        let endpoint_killed = Instant::now();
        let at_kill = load.count();
        // The twin shows the error of its next upload; the primary that of
        // its next listing of the bucket (and only it, when the segments the
        // twin tried left its log meanwhile: a skipped upload is no error).
        let seen_error = wait_on("a daemon showing the outage", WAIT, || async {
            let (_, a) = twin_archive(tm).await?;
            let p = primary_status_now(pm).await.and_then(|p| p.archive);
            match (&a.last_error, p.and_then(|p| p.last_error)) {
                (Some(e), _) => Ok(format!("the twin: {e}")),
                (None, Some(e)) => Ok(format!("the primary: {e}")),
                (None, None) => Err(brief(&a)),
            }
        })
        .await?;
        let outage_to = frames * 5 / 6;
        load.limit.store(outage_to, Ordering::SeqCst);
        wait_on("the load going on through the outage", WAIT, || async {
            let n = load.count();
            if n >= outage_to {
                Ok(())
            } else {
                Err(format!("{} acknowledged since the kill", n - at_kill))
            }
        })
        .await?;
        let (t_out, during) = twin_archive(tm).await.map_err(DrillError)?;
        let p_out = primary_status_now(pm)
            .await
            .ok_or_else(|| DrillError("the primary does not answer".into()))?;
        restart_node(&mut g, ENDPOINT_NODE)?;
        let endpoint_down_ms = tenths(endpoint_killed.elapsed().as_secs_f64() * 1000.0);
        let back = Instant::now();
        *lock(&peaks.armed) = Some((back, during.floor));
        // The rest of the load, after the restart.
        load.limit.store(frames, Ordering::SeqCst);
        let resumed = wait_on(
            "uploads resuming after the endpoint's node came back",
            WAIT,
            || async {
                let (_, a) = twin_archive(tm).await?;
                if a.uploaded_segments > during.uploaded_segments {
                    Ok(())
                } else {
                    Err(brief(&a))
                }
            },
        )
        .await;
        let resume_ms = tenths(back.elapsed().as_secs_f64() * 1000.0);
        if let Err(e) = resumed {
            broken_lines.push(format!(
                "BROKEN: the archive did not resume after Garage's endpoint node came back: {e}"
            ));
        }
        eprintln!(
            "archive: [{}] Garage node {ENDPOINT_NODE} (the endpoint) down {endpoint_down_ms} ms, {} frames acknowledged meanwhile; seen: {seen_error}; at the restart the twin held {} bytes (first {}, floor {}), the primary {} bytes (first {}); uploads resumed {resume_ms} ms after",
            stamp(started, &load),
            load.count() - at_kill,
            t_out.retention.log_bytes,
            t_out.first,
            during.floor,
            p_out.log_bytes,
            p_out.first
        );

        Faults {
            replica_down_ms,
            replica_uploads,
            endpoint_down_ms,
            resume_ms,
        }
    } else {
        load.limit.store(frames, Ordering::SeqCst);
        Faults::default()
    };
    let Faults {
        replica_down_ms,
        replica_uploads,
        endpoint_down_ms,
        resume_ms,
    } = faults;

    // The rest of the load, then everything sealed archived.
    wait_on("the whole load acknowledged", WAIT * 4, || async {
        let n = load.count();
        if n >= frames {
            Ok(())
        } else {
            Err(format!("{n} of {frames} acknowledged"))
        }
    })
    .await?;
    load.stop.store(true, Ordering::SeqCst);
    for w in writers {
        let _ = w.await;
    }
    let load_secs = load_rate_from.elapsed().as_secs_f64();
    let acked_bytes = load.bytes.load(Ordering::SeqCst);
    // Paced, the backlog takes its bytes over the pace; a margin past it.
    let catch_up = WAIT + Duration::from_secs(acked_bytes / (pace << 20));
    let archived = wait_on("the twin archiving all it sealed", catch_up, || async {
        let (t, a) = twin_archive(tm).await?;
        if a.lag_segments == 0 && a.last_error.is_none() && a.floor > 1 && t.first > 1 {
            Ok((t, a))
        } else {
            Err(format!("first {}, {}", t.first, brief(&a)))
        }
    })
    .await;
    let (t_end, a_end) = match archived {
        Ok(v) => v,
        Err(e) => {
            broken_lines.push(format!("BROKEN: the archive never caught up: {e}"));
            let (t, a) = twin_archive(tm).await.map_err(DrillError)?;
            (t, a)
        }
    };
    sampler_stop.store(true, Ordering::SeqCst);
    let _ = sampler.await;
    peaks.observe(&t_end);
    // With everything sealed archived, retention on both boxes drops at
    // least the first half of the log (the primary lists the bucket every
    // few seconds before it does).
    let half = a_end.floor / 2;
    let dropped = wait_on(
        "both boxes dropping what the archive holds",
        WAIT,
        || async {
            let (t, _) = twin_archive(tm).await?;
            let p = primary_status_now(pm)
                .await
                .ok_or("the primary does not answer")?;
            let a = p
                .archive
                .clone()
                .ok_or("the primary's status shows no archive")?;
            if t.first > half && p.first > half && a.last_error.is_none() {
                Ok((t, p))
            } else {
                Err(format!(
                    "the twin's first frame {}, the primary's {} ({})",
                    t.first,
                    p.first,
                    brief(&a)
                ))
            }
        },
    )
    .await;
    let (t_end, p_end) = match dropped {
        Ok(v) => v,
        Err(e) => {
            broken_lines.push(format!(
                "BROKEN: retention kept frames the archive holds: {e}"
            ));
            let t = twin_archive(tm).await.map_err(DrillError)?.0;
            let p = primary_status_now(pm)
                .await
                .ok_or_else(|| DrillError("the primary does not answer".into()))?;
            (t, p)
        }
    };
    if broken.is_some() {
        for f in [&plog_err, &tlog_err] {
            let text = std::fs::read_to_string(f).unwrap_or_default();
            if !text.contains(SABOTAGE_SAYS) {
                return Err(DrillError(format!(
                    "the control's daemon ({}) does not say \"{SABOTAGE_SAYS}\": built without drill-sabotage?",
                    f.display()
                )));
            }
        }
    }

    // Both boxes gone.
    let archived_to = a_end.floor.saturating_sub(1);
    let gone_below = t_end.first.min(p_end.first);
    primary.sigkill()?;
    twin.sigkill()?;
    std::fs::remove_dir_all(&pair.pdir).ctx(|| format!("delete {}", pair.pdir.display()))?;
    std::fs::remove_dir_all(&pair.tdir).ctx(|| format!("delete {}", pair.tdir.display()))?;
    let acked: Acked = lock(&load.acked).clone();
    let settings = section
        .settings(&work)
        .map_err(|e| DrillError(format!("the archive's settings: {e}")))?;
    let listed = settings
        .bucket
        .segments()
        .await
        .ctx(|| "list the bucket".into())?;
    let spans: Vec<(u64, u64)> = listed.iter().map(|(n, _)| (n.first, n.last)).collect();
    let stored: u64 = listed.iter().map(|(_, s)| s).sum();
    if gone_below < 8 || archived_to < gone_below - 1 {
        for l in &broken_lines {
            println!("{l}");
        }
        let why = format!(
            "frames left both boxes only below {gone_below}, the archive holds them to {archived_to}"
        );
        if broken_lines.is_empty() {
            return Err(DrillError(format!(
                "{why}: too little load for the cap (--frames)"
            )));
        }
        println!("invariant: BROKEN ({why}: nothing to restore)");
        return Ok(false);
    }
    // Early: inside the first quarter of what left both boxes; middle: a
    // segment's last frame near the middle of it; last: all archived.
    let early = 1 + rng.below((gone_below / 4).max(1));
    let middle = spans
        .iter()
        .map(|s| s.1)
        .filter(|&l| l > early && l < gone_below)
        .min_by_key(|&l| l.abs_diff(gone_below / 2))
        .unwrap_or(gone_below / 2)
        .max(early + 1);
    let mut points = vec![(early, "early")];
    if middle < archived_to {
        points.push((middle, "middle"));
    }
    points.push((archived_to, "last"));
    eprintln!(
        "archive: {} frames acknowledged ({:.1} MiB, {} repeats); both boxes killed and deleted; the twin's first frame was {}, the primary's {}; the bucket holds {} segments ({:.1} MiB) to frame {}; restoring to {early}, {middle} and {archived_to}",
        acked.len(),
        acked_bytes as f64 / 1048576.0,
        load.repeats.load(Ordering::SeqCst),
        t_end.first,
        p_end.first,
        listed.len(),
        stored as f64 / 1048576.0,
        spans.iter().map(|s| s.1).max().unwrap_or(0)
    );

    let mut results = Vec::new();
    for (until, what) in points {
        let pt = restore_at(
            &bins.primary,
            &work,
            &section,
            segment,
            until,
            what,
            &acked,
            &spans,
        )?;
        results.push(pt);
    }
    // Let go of Garage (its nodes are killed) before the report.
    drop(g);

    let twice = lock(&load.twice).clone();
    if !twice.is_empty() {
        broken_lines.push(format!(
            "BROKEN: sequences acknowledged twice: {}",
            runs(&twice, 10)
        ));
    }
    let local = load.local.load(Ordering::SeqCst);
    if local > 0 {
        broken_lines.push(format!(
            "BROKEN: {local} twin appends acknowledged local under the wait policy"
        ));
    }
    for l in &broken_lines {
        println!("{l}");
    }
    for pt in &results {
        println!(
            "restore to {} ({}): {} in {:.1} s; {} acknowledged frames checked, {} lost, {} differ, {} past the point{}",
            pt.until,
            pt.what,
            if pt.restored { "restored" } else { "FAILED" },
            pt.seconds,
            pt.checked,
            pt.lost,
            pt.differ,
            pt.past,
            pt.error.as_deref().map_or(String::new(), |e| format!("; {e}"))
        );
    }
    let held = broken_lines.is_empty()
        && results
            .iter()
            .all(|p| p.restored && p.lost == 0 && p.differ == 0 && p.past == 0);
    let errors = lock(&load.errors).clone();
    for e in &errors {
        println!("   an append failed: {e}");
    }
    println!(
        "archive: seed {seed}{}: {} frames acknowledged twin in {load_secs:.1} s ({:.0}/s, {:.1} MiB/s), {} failed appends; segments {} KiB, caps {} KiB, pace {pace} MiB/s",
        broken.as_deref().map_or(String::new(), |b| format!(", BROKEN={b}")),
        acked.len(),
        acked.len() as f64 / load_secs.max(1e-3),
        acked_bytes as f64 / 1048576.0 / load_secs.max(1e-3),
        load.failed.load(Ordering::SeqCst),
        segment >> 10,
        cap >> 10,
    );
    println!(
        "invariant: after both boxes are lost, a restore from the archive to frame N holds every acknowledged frame up to N byte for byte and nothing past it: {}",
        if held { "held" } else { "BROKEN" }
    );
    let mib = |b: u64| tenths(b as f64 / 1048576.0);
    let json = serde_json::json!({
        "drill": "archive",
        "seed": seed,
        "broken": broken,
        "acked": acked.len(),
        "acked_mib": mib(acked_bytes),
        "repeats": load.repeats.load(Ordering::SeqCst),
        "huge_frame": load.huge_at.load(Ordering::SeqCst),
        "failed_appends": load.failed.load(Ordering::SeqCst),
        "appends_per_s": (acked.len() as f64 / load_secs.max(1e-3)).round(),
        "segment_kib": segment >> 10,
        "cap_kib": cap >> 10,
        "pace_mib_s": pace,
        "primary_log_peak_mib": mib(peaks.primary.load(Ordering::SeqCst)),
        "twin_log_peak_mib": mib(peaks.twin.load(Ordering::SeqCst)),
        "twin_held_by_archive_samples": peaks.held_by_archive.load(Ordering::SeqCst),
        "twin_dropped_segments": t_end.retention.dropped_segments,
        "replica_node_down_ms": replica_down_ms,
        "uploads_while_replica_down": replica_uploads,
        "endpoint_node_down_ms": endpoint_down_ms,
        "uploads_resumed_ms": resume_ms,
        "floor_moved_ms": ms_or_null(&peaks.floor_moved_ms),
        "error_cleared_ms": ms_or_null(&peaks.error_cleared_ms),
        "twin_held_by": t_end.retention.held_by,
        "twin_first": t_end.first,
        "primary_first": p_end.first,
        "archived_to": archived_to,
        "archived_segments": listed.len(),
        "archived_mib": mib(stored),
        "archive_holes": holes(&spans, archived_to).len(),
        "restores": results.iter().map(|p| serde_json::json!({
            "until": p.until,
            "point": p.what,
            "restored": p.restored,
            "seconds": tenths(p.seconds),
            "checked": p.checked,
            "lost": p.lost,
            "differ": p.differ,
            "past": p.past,
        })).collect::<Vec<_>>(),
        "held": held,
        "seconds": tenths(started.elapsed().as_secs_f64()),
    });
    println!("{json}");
    Ok(held)
}

/// Restore a fresh box to `until` with `primary restore --from-archive`
/// and check it against `acked`. Prints `LOST`/`DIFFER` lines.
#[allow(clippy::too_many_arguments)]
fn restore_at(
    primary_bin: &Path,
    work: &Path,
    section: &ArchiveSection,
    segment: u64,
    until: u64,
    what: &'static str,
    acked: &Acked,
    spans: &[(u64, u64)],
) -> Result<Point> {
    let dir = work.join(format!("restore-{what}"));
    let run = run_restore(primary_bin, &dir, section, segment, Some(until))?;
    let mut pt = Point {
        until,
        what,
        seconds: run.seconds,
        restored: run.ok,
        checked: 0,
        lost: 0,
        differ: 0,
        past: 0,
        error: None,
    };
    if !run.ok {
        let err = run.error;
        let gaps = holes(spans, until);
        let missing = acked_in(acked, &gaps);
        pt.lost = missing.len() as u64;
        for seq in missing.iter().take(5) {
            println!(
                "LOST frame {seq}: acknowledged, not in the archive, the restore to {until} failed"
            );
        }
        if missing.is_empty() {
            println!(
                "BROKEN: the restore to {until} failed ({}) though the bucket holds frames 1 to {until}: {err}",
                run.exit
            );
        } else {
            println!(
                "LOST: restore to {until}: {} acknowledged frames are not in the archive (frames {}): {err}",
                missing.len(),
                runs(&missing, 8)
            );
        }
        pt.error = Some(err);
        return Ok(pt);
    }
    let report = run.report;
    let r = check_restored(&run.log_dir, segment, until, acked)?;
    pt.checked = r.checked;
    pt.lost = r.lost.len() as u64;
    pt.differ = r.differ.len() as u64;
    pt.past = r.past.len() as u64;
    if report["head"].as_u64() != Some(until) || r.first != 1 || r.head != until {
        println!(
            "LOST: restore to {until}: the restored log holds frames {} to {} (the report says head {})",
            r.first, r.head, report["head"]
        );
        pt.lost = pt.lost.max(1);
    }
    for seq in r.lost.iter().take(5) {
        println!("LOST frame {seq}: acknowledged, missing from the log restored to {until}");
    }
    if r.lost.len() > 5 {
        println!(
            "LOST: restore to {until}: {} acknowledged frames missing ({})",
            r.lost.len(),
            runs(&r.lost, 8)
        );
    }
    for (seq, how) in r.differ.iter().take(5) {
        println!("DIFFER frame {seq} (restored to {until}): {how}");
    }
    if !r.past.is_empty() {
        println!(
            "BROKEN: restore to {until}: frames past the point: {}",
            runs(&r.past, 8)
        );
    }
    Ok(pt)
}
