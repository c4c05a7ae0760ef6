//! Check every disk state a power cut could have left during a guest's
//! run: the dm-log-writes log replayed onto the starting disk up to each
//! FLUSH, and, CrashMonkey-style, for some flush intervals, prefixes and
//! random subsets of the writes between two flushes on top of the earlier
//! one. Each state is checked by `drills::powercut` against the workload's
//! record of every frame, read from the markers of the disk QEMU left;
//! replaying every entry must reproduce that disk.
//!
//! `powercut-check --start START --data DATA --log LOG --marker-at BYTES
//! [--marker-slots N] [--segment BYTES] --work DIR [--intervals K]
//! [--subsets R] [--every N] [--seed S]`
//!
//! Prints a summary and one JSON line; exits 0 only when every state held.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use drills::dmlog::{first_difference, pick_intervals, subset_picks, WriteLog};
use drills::marker::{self, Marker};
use drills::powercut::{check_image, record_of, Recorded, StateCheck};
use drills::{Args, Context, Result, Rng};

struct Checker {
    work: PathBuf,
    scratch: PathBuf,
    mnt: PathBuf,
    marker_at: u64,
    marker_slots: u64,
    segment: u64,
    states: u64,
    failures: Vec<String>,
    failed: u64,
    last: Option<StateCheck>,
    most_acked: u64,
    /// Which frame the workload wrote at each sequence.
    record: BTreeMap<u64, Recorded>,
}

impl Checker {
    fn markers(&self, image: &Path) -> Result<Vec<Marker>> {
        marker::read_image(image, self.marker_at, self.marker_slots)
    }

    /// Check the state now in `scratch` (which the check mounts and so
    /// changes).
    fn check(&mut self, label: &str) -> Result<()> {
        let markers = self.markers(&self.scratch)?;
        self.states += 1;
        match check_image(
            label,
            &self.scratch,
            &self.mnt,
            self.segment,
            &markers,
            &self.record,
        ) {
            Ok(c) => {
                self.most_acked = self.most_acked.max(c.acked);
                self.last = Some(c);
            }
            Err(e) => {
                self.failed += 1;
                self.last = None;
                if self.failures.len() < 20 {
                    eprintln!("FAILED {e}");
                    self.failures.push(e.0);
                }
            }
        }
        Ok(())
    }

    fn scratch_from(&self, image: &Path) -> Result<File> {
        std::fs::copy(image, &self.scratch)
            .ctx(|| format!("copy {} to {}", image.display(), self.scratch.display()))?;
        OpenOptions::new()
            .write(true)
            .open(&self.scratch)
            .ctx(|| format!("open {}", self.scratch.display()))
    }
}

fn run() -> Result<bool> {
    let started = Instant::now();
    let args = Args::parse(&[])?;
    let start = args.path("start")?;
    let data = args.path("data")?;
    let work = args.path("work")?;
    std::fs::create_dir_all(&work).ctx(|| format!("create {}", work.display()))?;
    let wl = WriteLog::open(&args.path("log")?)?;
    let mut ck = Checker {
        scratch: work.join("scratch.img"),
        mnt: work.join("mnt"),
        work: work.clone(),
        marker_at: args.num("marker-at", 0)?,
        marker_slots: args.num("marker-slots", 8192)?,
        segment: args.num("segment", 64 << 10)?,
        states: 0,
        failures: Vec::new(),
        failed: 0,
        last: None,
        most_acked: 0,
        record: BTreeMap::new(),
    };
    // The workload's record: every marker the run wrote is on the disk
    // QEMU left (its last one says the workload finished).
    ck.record = record_of(&ck.markers(&data)?)?;
    let every = args.num("every", 1)?.max(1);
    let subsets = args.num("subsets", 8)?;
    let mut rng = Rng::new(args.num("seed", 1)?);
    let intervals = pick_intervals(&wl, args.num("intervals", 6)?);
    let replay_path = ck.work.join("replay.img");
    std::fs::copy(&start, &replay_path)
        .ctx(|| format!("copy {} to {}", start.display(), replay_path.display()))?;
    let replay = OpenOptions::new()
        .write(true)
        .open(&replay_path)
        .ctx(|| format!("open {}", replay_path.display()))?;
    let flushes = wl.flushes();
    let (mut flush_states, mut subset_states) = (0u64, 0u64);
    let mut changed = false;
    let mut distinct = 0u64;
    for (i, e) in wl.entries.iter().enumerate() {
        wl.apply(e, &replay)?;
        changed |= e.is_write() || e.flags & drills::dmlog::DISCARD != 0;
        if !e.is_flush() {
            continue;
        }
        let k = flushes.partition_point(|&f| f < i) + 1;
        if changed {
            distinct += 1;
            changed = false;
            if distinct.is_multiple_of(every) {
                ck.scratch_from(&replay_path)?;
                ck.check(&format!("flush {k}/{} (entry {i})", flushes.len()))?;
                flush_states += 1;
            }
        }
        let Some((_, writes)) = intervals.iter().find(|(f, _)| *f == i) else {
            continue;
        };
        let m = writes.len();
        for pick in subset_picks(writes, subsets, &mut rng) {
            let scratch = ck.scratch_from(&replay_path)?;
            for &w in &pick {
                wl.apply(&wl.entries[w], &scratch)?;
            }
            drop(scratch);
            ck.check(&format!(
                "flush {k} + {} of the {m} writes after it {:?}",
                pick.len(),
                pick
            ))?;
            subset_states += 1;
        }
    }
    // The disk as QEMU left it: every entry applied.
    ck.scratch_from(&replay_path)?;
    ck.check("the final disk")?;
    let last = ck.last.unwrap_or_default();
    let diff = first_difference(&replay_path, &data)?;
    let identical = diff.is_none();
    let seconds = started.elapsed().as_secs_f64();
    let ok = ck.failed == 0 && identical && last.done && ck.most_acked > 0;
    println!(
        "power-cut: {} log entries, {} flushes, {} distinct flush states",
        wl.entries.len(),
        flushes.len(),
        distinct
    );
    match diff {
        None => println!("replaying every entry reproduces the final disk: yes"),
        Some(at) => println!(
            "replaying every entry reproduces the final disk: NO, first difference at byte {at}"
        ),
    }
    println!(
        "states checked: {} ({flush_states} at flushes, {subset_states} CrashMonkey subsets over {} intervals, the final disk)",
        ck.states,
        intervals.len()
    );
    println!(
        "final disk: {} frames acknowledged, {} frames in the log, {} erased, erase acknowledged: {}, workload done: {}",
        last.acked, last.frames, last.erased, last.erase_acked, last.done
    );
    println!(
        "invariant (acknowledged => intact, erase acknowledged => erased, every frame verifies): {} ({} states failed)",
        if ck.failed == 0 { "held" } else { "BROKEN" },
        ck.failed
    );
    println!(
        "{}",
        serde_json::json!({
            "drill": "power-cut",
            "entries": wl.entries.len(),
            "flushes": flushes.len(),
            "distinct_flush_states": distinct,
            "states_checked": ck.states,
            "flush_states_checked": flush_states,
            "subset_states_checked": subset_states,
            "intervals": intervals.len(),
            "acked_frames": last.acked,
            "frames_final": last.frames,
            "erased_final": last.erased,
            "erase_acked": last.erase_acked,
            "done": last.done,
            "failed_states": ck.failed,
            "replay_all_identical": identical,
            "check_seconds": (seconds * 10.0).round() / 10.0,
            "guest_seconds": args.num("guest-seconds", 0)?,
            "passed": ok,
        })
    );
    Ok(ok)
}

fn main() -> ExitCode {
    match run() {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("powercut-check: {e}");
            ExitCode::from(2)
        }
    }
}
