//! The pair power-cut drill on the host.
//!
//! `pair-powercut-check mint --out DIR [--segment BYTES]`: a primary and a
//! twin minted through the library (`daemon::init_primary`, `init_twin`,
//! `pin_primary`), their configurations naming the guest's paths and
//! loopback addresses: `DIR/disk/p` goes on the logged disk (mounted at
//! /mnt in the guest), `DIR/twin` into the initramfs (copied to a tmpfs
//! at /t).
//!
//! `pair-powercut-check check --start START --data DATA --log LOG
//! --marker-at BYTES --twin-out IMAGE --primary-bin P --twin-bin T --work
//! DIR [--marker-slots N] [--segment BYTES] [--every N] [--intervals K]
//! [--subsets R] [--seed S]`: the guest's write log replayed onto the
//! starting disk up to every FLUSH (every Nth distinct state), and for a
//! few intervals CrashMonkey subsets of the writes before the next
//! barrier; each state is handed to `drills::pair_check` with the
//! primary's head at the next flush, the most the twin can hold.
//!
//! Prints a summary and one JSON line; exits 0 only when every state held,
//! 1 when one broke, 2 when the drill could not run.

use std::fs::OpenOptions;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::Instant;

use twinlog::daemon::{self, PrimaryConfig, TwinConfig};

use drills::dmlog::{first_difference, pick_intervals, subset_picks, WriteLog, DISCARD};
use drills::marker::{self, Ack, Marker};
use drills::pair::{alphabet, check_alphabet, frames};
use drills::pair_check::{check_state, Checked, Run};
use drills::powercut::Mounted;
use drills::{Args, Context, DrillError, Result, Rng};

/// The guest's addresses: its own loopback.
const LISTEN: &str = "127.0.0.1:7400";
const PRIMARY_METRICS: &str = "127.0.0.1:9400";
const TWIN_METRICS: &str = "127.0.0.1:9401";

fn mint(args: &Args) -> Result<()> {
    let out = args.path("out")?;
    let segment = args.num("segment", 64 << 10)?;
    let (pdir, tdir) = (out.join("disk").join("p"), out.join("twin"));
    let listen: std::net::SocketAddr = LISTEN.parse().ctx(|| "the guest's address".into())?;
    let pm: std::net::SocketAddr = PRIMARY_METRICS.parse().ctx(|| "metrics".into())?;
    let tm: std::net::SocketAddr = TWIN_METRICS.parse().ctx(|| "metrics".into())?;
    let (tcfg, twin_fp) =
        daemon::init_twin(&tdir, listen, tm, None).ctx(|| "init the twin".into())?;
    let (pcfg, primary_fp) =
        daemon::init_primary(&pdir, listen, pm, Some(twin_fp)).ctx(|| "init the primary".into())?;
    daemon::pin_primary(&tcfg, primary_fp).ctx(|| "pin the primary".into())?;
    let mut p = PrimaryConfig::load(&pcfg).ctx(|| "load primary.toml".into())?;
    p.data_dir = "/mnt/p".into();
    p.segment_bytes = segment;
    p.timers = drills::daemons::fast_timers();
    std::fs::write(&pcfg, p.render()).ctx(|| "write primary.toml".into())?;
    let mut t = TwinConfig::load(&tcfg).ctx(|| "load twin.toml".into())?;
    t.data_dir = "/t/twin".into();
    t.segment_bytes = segment;
    t.timers = drills::daemons::fast_timers();
    std::fs::write(&tcfg, t.render()).ctx(|| "write twin.toml".into())?;
    println!("minted: primary {primary_fp}, twin {twin_fp}");
    Ok(())
}

/// What the run adds up.
#[derive(Default)]
struct Tally {
    states: u64,
    flush_states: u64,
    subset_states: u64,
    failed: u64,
    /// Failed states by what broke: a twin answer lost, the logs differing.
    failed_lost: u64,
    failed_differ: u64,
    failures: Vec<String>,
    diverged_states: u64,
    frames_cut: u64,
    appended: u64,
    most_acked_twin: u64,
    most_acked_local: u64,
    millis: Vec<u64>,
}

struct Checker {
    run: Run,
    work: PathBuf,
    marker_at: u64,
    marker_slots: u64,
    rng: Rng,
    tally: Tally,
}

impl Checker {
    /// The primary's head in the disk state `image` (a scratch copy is
    /// mounted, so `image` stays as it is).
    fn head_of(&self, image: &Path) -> Result<u64> {
        let probe = self.work.join("probe.img");
        std::fs::copy(image, &probe).ctx(|| "copy a state".into())?;
        let mnt = self.work.join("probe-mnt");
        let m = Mounted::mount(&probe, &mnt)?;
        let log = mnt.join("p").join(daemon::LOG_DIR);
        let head = if log.exists() {
            twinlog::log::Log::open_with(&log, self.run.segment)
                .ctx(|| format!("open {}", log.display()))?
                .head_seq()
        } else {
            0
        };
        m.unmount()?;
        Ok(head)
    }

    /// Check the state in `image` (consumed); `next` is the primary's head
    /// at the next flush.
    async fn check(&mut self, label: &str, image: &Path, next: u64) -> Result<()> {
        let markers: Vec<Marker> = marker::read_image(image, self.marker_at, self.marker_slots)?;
        let mnt = self.work.join("mnt");
        let m = Mounted::mount(image, &mnt)?;
        let verdict = check_state(&self.run, &mnt.join("p"), &markers, next, &mut self.rng).await;
        m.unmount()?;
        std::fs::remove_file(image).ctx(|| "remove a state".into())?;
        self.tally.states += 1;
        match verdict? {
            Ok(c) => self.count(&c),
            Err(why) => {
                self.tally.failed += 1;
                self.tally.failed_lost += u64::from(why.starts_with("LOST"));
                self.tally.failed_differ += u64::from(why.contains("DIFFER"));
                if self.tally.failures.len() < 20 {
                    eprintln!("FAILED {label}: {why}");
                    self.tally.failures.push(format!("{label}: {why}"));
                }
            }
        }
        Ok(())
    }

    fn count(&mut self, c: &Checked) {
        let t = &mut self.tally;
        t.diverged_states += u64::from(c.cut > 0);
        t.frames_cut += c.cut;
        t.appended += c.appended;
        t.most_acked_twin = t.most_acked_twin.max(c.acked_twin);
        t.most_acked_local = t.most_acked_local.max(c.acked_local);
        t.millis.push(c.millis);
    }
}

async fn check(args: &Args) -> Result<bool> {
    let started = Instant::now();
    let work = args.path("work")?;
    if work.exists() {
        std::fs::remove_dir_all(&work).ctx(|| format!("clear {}", work.display()))?;
    }
    std::fs::create_dir_all(&work).ctx(|| format!("create {}", work.display()))?;
    let (start, data) = (args.path("start")?, args.path("data")?);
    let segment = args.num("segment", 64 << 10)?;
    let (marker_at, marker_slots) = (args.num("marker-at", 0)?, args.num("marker-slots", 8192)?);
    let letters = alphabet();
    check_alphabet(&letters)?;

    // The run as it ended: the final disk's log and markers, the twin's
    // data directory from the guest's second disk.
    let final_markers = marker::read_image(&data, marker_at, marker_slots)?;
    if !final_markers.iter().any(|m| m.ack == Ack::Done) {
        return Err(DrillError(
            "the final disk holds no last marker: the guest did not finish".into(),
        ));
    }
    let final_copy = work.join("final.img");
    std::fs::copy(&data, &final_copy).ctx(|| "copy the final disk".into())?;
    let m = Mounted::mount(&final_copy, &work.join("final-mnt"))?;
    let (history, final_frames) = frames(&work.join("final-mnt/p").join(daemon::LOG_DIR), segment)?;
    m.unmount()?;
    let twin_out = work.join("twin-out");
    std::fs::create_dir_all(&twin_out).ctx(|| "create twin-out".into())?;
    let untar = Command::new("tar")
        .arg("-xf")
        .arg(args.path("twin-out")?)
        .arg("-C")
        .arg(&twin_out)
        .status()
        .ctx(|| "run tar".into())?;
    if !untar.success() {
        return Err(DrillError(format!("tar -xf of the twin's disk: {untar}")));
    }
    let twin_final = twin_out.join("twin");
    let (twin_history, twin_frames) = frames(&twin_final.join(daemon::LOG_DIR), segment)?;
    if twin_history != history || twin_frames != final_frames {
        return Err(DrillError(format!(
            "the guest's twin ended with {} frames, the primary with {}{}: the run did not converge",
            twin_frames.len(),
            final_frames.len(),
            if twin_history == history { "" } else { " of another history" }
        )));
    }
    let final_head = final_frames.len() as u64;
    let mut ck = Checker {
        run: Run {
            primary_bin: args.path("primary-bin")?,
            twin_bin: args.path("twin-bin")?,
            twin_final,
            final_frames,
            alphabet: letters,
            segment,
            work: work.join("state"),
        },
        work: work.clone(),
        marker_at,
        marker_slots,
        rng: Rng::new(args.num("seed", 1)?),
        tally: Tally::default(),
    };
    std::fs::create_dir_all(&ck.run.work).ctx(|| "create the state directory".into())?;

    let wl = WriteLog::open(&args.path("log")?)?;
    let every = args.num("every", 1)?.max(1);
    let subsets = args.num("subsets", 2)?;
    let intervals = pick_intervals(&wl, args.num("intervals", 2)?);
    let replay_path = work.join("replay.img");
    std::fs::copy(&start, &replay_path).ctx(|| "copy the starting disk".into())?;
    let replay = OpenOptions::new()
        .write(true)
        .open(&replay_path)
        .ctx(|| "open the replay".into())?;
    let flushes = wl.flushes();
    // States waiting for the head at the next flush: (label, image).
    let mut pending: Vec<(String, PathBuf)> = Vec::new();
    let (mut changed, mut distinct, mut n) = (false, 0u64, 0u64);
    for (i, e) in wl.entries.iter().enumerate() {
        wl.apply(e, &replay)?;
        changed |= e.is_write() || e.flags & DISCARD != 0;
        if !e.is_flush() || !changed {
            continue;
        }
        changed = false;
        distinct += 1;
        let k = flushes.partition_point(|&f| f < i) + 1;
        if !pending.is_empty() {
            let next = ck.head_of(&replay_path)?;
            for (label, image) in std::mem::take(&mut pending) {
                ck.check(&label, &image, next).await?;
            }
        }
        if distinct.is_multiple_of(every) {
            n += 1;
            let image = work.join(format!("state-{n}.img"));
            std::fs::copy(&replay_path, &image).ctx(|| "copy a state".into())?;
            pending.push((format!("flush {k}/{} (entry {i})", flushes.len()), image));
            ck.tally.flush_states += 1;
        }
        let Some((_, writes)) = intervals.iter().find(|(f, _)| *f == i) else {
            continue;
        };
        for pick in subset_picks(writes, subsets, &mut ck.rng) {
            n += 1;
            let image = work.join(format!("state-{n}.img"));
            std::fs::copy(&replay_path, &image).ctx(|| "copy a state".into())?;
            let f = OpenOptions::new()
                .write(true)
                .open(&image)
                .ctx(|| "open a state".into())?;
            for &w in &pick {
                wl.apply(&wl.entries[w], &f)?;
            }
            let label = format!(
                "flush {k} + {} of the {} writes after it",
                pick.len(),
                writes.len()
            );
            pending.push((label, image));
            ck.tally.subset_states += 1;
        }
        if distinct.is_multiple_of(100) {
            eprintln!(
                "   {distinct} flush states, {} checked, {} failed",
                ck.tally.states, ck.tally.failed
            );
        }
    }
    let final_state = work.join("state-final.img");
    std::fs::copy(&replay_path, &final_state).ctx(|| "copy the final state".into())?;
    pending.push(("the final disk".into(), final_state));
    for (label, image) in std::mem::take(&mut pending) {
        ck.check(&label, &image, final_head).await?;
    }
    let diff = first_difference(&replay_path, &data)?;
    let t = &ck.tally;
    let ok = t.failed == 0 && diff.is_none() && t.most_acked_twin > 0 && t.most_acked_local > 0;
    let mut ms = t.millis.clone();
    ms.sort_unstable();
    let median = ms.get(ms.len() / 2).copied().unwrap_or(0);
    let seconds = started.elapsed().as_secs_f64();
    println!(
        "pair-power-cut: {} log entries, {} flushes, {distinct} distinct flush states; the run wrote {final_head} frames",
        wl.entries.len(),
        flushes.len()
    );
    println!(
        "replaying every entry reproduces the final disk: {}",
        if diff.is_none() { "yes" } else { "NO" }
    );
    println!(
        "states checked: {} ({} at flushes, every {every}; {} CrashMonkey subsets over {} intervals; the final disk), {:.0} s, median {median} ms a state",
        t.states,
        t.flush_states,
        t.subset_states,
        intervals.len(),
        seconds
    );
    println!(
        "the twin held frames the primary lost in {} states ({} frames, each saved and cut by the twin); {} frames appended after the restarts, all answered twin",
        t.diverged_states, t.frames_cut, t.appended
    );
    println!(
        "invariant (no twin-acknowledged frame lost; the two logs agree frame by frame): {} ({} states failed: {} lost a twin answer, {} differ, {} else)",
        if t.failed == 0 { "held" } else { "BROKEN" },
        t.failed,
        t.failed_lost,
        t.failed_differ,
        t.failed - t.failed_lost - t.failed_differ
    );
    println!(
        "{}",
        serde_json::json!({
            "drill": "pair-power-cut",
            "entries": wl.entries.len(),
            "flushes": flushes.len(),
            "distinct_flush_states": distinct,
            "states_checked": t.states,
            "flush_states_checked": t.flush_states,
            "subset_states_checked": t.subset_states,
            "every": every,
            "frames_final": final_head,
            "acked_twin_final": t.most_acked_twin,
            "acked_local_final": t.most_acked_local,
            "states_twin_ahead": t.diverged_states,
            "frames_cut_by_twin": t.frames_cut,
            "appended_after_restart": t.appended,
            "state_median_ms": median,
            "failed_states": t.failed,
            "failed_lost": t.failed_lost,
            "failed_differ": t.failed_differ,
            "replay_all_identical": diff.is_none(),
            "check_seconds": (seconds * 10.0).round() / 10.0,
            "guest_seconds": args.num("guest-seconds", 0)?,
            "passed": ok,
        })
    );
    Ok(ok)
}

fn main() -> ExitCode {
    let mode = std::env::args().nth(1).unwrap_or_default();
    let run =
        Args::parse_from(std::env::args().skip(2), &[]).and_then(|args| match mode.as_str() {
            "mint" => mint(&args).map(|()| true),
            "check" => tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .ctx(|| "tokio runtime".into())
                .and_then(|rt| rt.block_on(check(&args))),
            other => Err(DrillError(format!("{other:?}: mint or check"))),
        });
    match run {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("pair-powercut-check: {e}");
            ExitCode::from(2)
        }
    }
}
