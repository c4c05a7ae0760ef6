//! The log's benchmark: one JSON object per case per line on stdout,
//! progress on stderr.
//!
//! ```sh
//! cargo bench --bench log              # full run, a few minutes
//! cargo bench --bench log -- --quick   # every case smaller, under a minute
//! ```
//!
//! The raw device cases run before the log's, so the ratios come from the
//! same process and the same disk; the fdatasync-bound cases (the raw loop
//! and the three appending ones) run in interleaved rounds, the raw loop
//! first in each, so the device's drift over seconds lands on all of them
//! alike. Lines are printed in the cases' order once their values are known.
//! Every file lives under cargo's target tmp dir (on the project's disk,
//! never a tmpfs `/tmp`).
//!
//! `read_pieces_1gib_rss` measures memory in a child process: the bench
//! re-executes itself with [`CHILD_ENV`] set, and the child only opens the
//! log and reads, reporting its peak RSS growth on its stdout.
//!
//! Before every bulk write that is timed, [`Bench::warm_page_cache`] writes
//! and deletes a scratch file of the same size: on a VM whose host reclaims
//! idle guest memory (free page reporting, DAMON), the first hundreds of MiB
//! put in the page cache after a pause otherwise cost host page faults
//! (~400 MiB/s instead of ~3 GiB/s), which would land on whichever case runs
//! first and make every MiB/s ratio meaningless.

mod common;

use common::*;

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Barrier;
use std::time::{Duration, Instant};

use twinlog::log::{Log, APP_KIND_FIRST};

/// The `bench` field of every line this program prints.
const BENCH: &str = "log";

/// The kind every frame of the bench carries.
const KIND: u16 = APP_KIND_FIRST;
/// Frames staged between two `sync_through` calls when a big log is built.
const BUILD_BATCH: u64 = 10_000;
/// The appending threads of `append_128b_t1`, `_t8` and `_t64`.
const APPEND_THREADS: [usize; 3] = [1, 8, 64];
/// The size of the raw fdatasync loop's preallocated file.
const RAW_SYNC_FILE: u64 = 64 * MIB;
/// The directory of the interleaved fdatasync-bound cases.
const SYNC_BOUND: &str = "fdatasync_bound";

/// Set in the child of `read_pieces_1gib_rss` to `open` or `read`.
const CHILD_ENV: &str = "TWINLOG_BENCH_CHILD";
const CHILD_DIR_ENV: &str = "TWINLOG_BENCH_CHILD_DIR";
const CHILD_SEQ_ENV: &str = "TWINLOG_BENCH_CHILD_SEQ";

/// How big every case is: the full run or `--quick`.
struct Config {
    /// How long each fdatasync-bound case runs in all, over `rounds` rounds.
    run: Duration,
    rounds: u32,
    seq_write_mib: u64,
    blob_mib: u64,
    frames_1mib: u64,
    open_frames: u64,
    opens: usize,
    read_mib: u64,
    latency_samples: usize,
    latency_big_frames: u64,
}

impl Config {
    fn new(quick: bool) -> Config {
        if quick {
            Config {
                run: Duration::from_millis(1000),
                rounds: 2,
                seq_write_mib: 64,
                blob_mib: 64,
                frames_1mib: 32,
                open_frames: 100_000,
                opens: 3,
                read_mib: 128,
                latency_samples: 500,
                latency_big_frames: 100_000,
            }
        } else {
            Config {
                run: Duration::from_secs(3),
                rounds: 3,
                seq_write_mib: 512,
                blob_mib: 256,
                frames_1mib: 256,
                open_frames: 1_000_000,
                opens: 5,
                read_mib: 1024,
                latency_samples: 2000,
                latency_big_frames: 1_000_000,
            }
        }
    }
}

fn main() {
    if let Ok(mode) = std::env::var(CHILD_ENV) {
        child_main(&mode);
        return;
    }
    let quick = std::env::args().any(|a| a == "--quick");
    let cfg = Config::new(quick);
    let root_parent = Path::new(env!("CARGO_TARGET_TMPDIR"));
    std::fs::create_dir_all(root_parent).expect("create the target tmp dir");
    let root = tempfile::Builder::new()
        .prefix("twinlog-bench-")
        .tempdir_in(root_parent)
        .expect("a temp dir under target/tmp");
    eprintln!(
        "twinlog bench ({}) in {}",
        if quick { "quick" } else { "full" },
        root.path().display()
    );
    let started = Instant::now();
    let b = Bench {
        cfg,
        root: root.path().to_path_buf(),
    };

    let raw_seq = b.case("raw_seq_write_1mib", |b| b.raw_seq_write_1mib());
    let (raw, appends) = b.case(SYNC_BOUND, |b| b.fdatasync_bound());
    let raw_sync = b.raw_fdatasync_128b(&raw).print();
    let raw_seq = raw_seq.print();
    let t1 = b.append_128b(1, &appends[0], raw_sync, None).print();
    b.append_128b(8, &appends[1], raw_sync, Some((t1, 3.5)))
        .print();
    b.append_128b(64, &appends[2], raw_sync, Some((t1, 13.0)))
        .print();
    b.case("blob_256mib", |b| b.blob_256mib(raw_seq)).print();
    b.case("frames_1mib", |b| b.frames_1mib(raw_seq)).print();
    b.case("open_1m_frames", |b| b.open_1m_frames()).print();
    b.case("read_pieces_1gib_rss", |b| b.read_pieces_1gib_rss())
        .print();
    b.case("append_latency_growth", |b| b.append_latency_growth())
        .print();

    eprintln!("total {:.1} s", started.elapsed().as_secs_f64());
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n == 0 {
        f64::NAN
    } else if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// Stage `frames` frames of 64..=128-byte blobs in batches, each batch made
/// durable with one `sync_through`: a big log, fast.
fn build_frames(log: &Log, frames: u64) {
    let blob = pattern(128);
    let mut done = 0u64;
    let started = Instant::now();
    while done < frames {
        let batch = BUILD_BATCH.min(frames - done);
        let mut last = 0;
        for i in 0..batch {
            let len = 64 + ((done + i) % 65) as usize;
            last = log.stage_raw(KIND, &[], &blob[..len]).expect("stage_raw");
        }
        log.sync_through(last).expect("sync_through");
        done += batch;
        if done % 200_000 == 0 {
            eprintln!("  built {done} frames");
        }
    }
    eprintln!(
        "  built {frames} frames in {:.2} s",
        started.elapsed().as_secs_f64()
    );
}

fn vm_kib(field: &str) -> u64 {
    testkit::procfs::vm_kib(std::process::id(), field).unwrap_or_else(|e| panic!("{field}: {e}"))
}

/// Reset VmHWM to the current RSS (Linux 4.0+); false where refused.
fn reset_hwm() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

/// The child of `read_pieces_1gib_rss`: `open` reports the peak RSS growth
/// of opening the log; `read` opens it, resets the peak, and reports the peak
/// growth of one `read_pieces` over the frame. `key=value` lines on stdout.
fn child_main(mode: &str) {
    let dir = PathBuf::from(std::env::var(CHILD_DIR_ENV).expect("child dir"));
    let rss_start = vm_kib("VmRSS");
    let reset_start = reset_hwm();
    let t = Instant::now();
    let log = Log::open(&dir).expect("child open");
    let open_secs = t.elapsed().as_secs_f64();
    let open_peak = vm_kib("VmHWM").saturating_sub(rss_start);
    println!("open_peak_kib={open_peak}");
    println!("open_secs={open_secs}");
    println!("hwm_reset={}", u8::from(reset_start));
    if mode != "read" {
        return;
    }
    let seq: u64 = std::env::var(CHILD_SEQ_ENV)
        .expect("child seq")
        .parse()
        .expect("child seq is a number");
    let reset = reset_hwm();
    let rss_before = if reset { vm_kib("VmRSS") } else { rss_start };
    let (mut bytes, mut pieces, mut sum) = (0u64, 0u64, 0u64);
    let t = Instant::now();
    log.read_pieces(seq, MIB as usize, |_loc, piece, _last| {
        bytes += piece.len() as u64;
        pieces += 1;
        sum = sum.wrapping_add(u64::from(piece.first().copied().unwrap_or(0)));
        Ok::<(), twinlog::log::Error>(())
    })
    .expect("read_pieces");
    let secs = t.elapsed().as_secs_f64();
    let peak = vm_kib("VmHWM").saturating_sub(rss_before);
    println!("read_peak_kib={peak}");
    println!("read_reset={}", u8::from(reset));
    println!("bytes={bytes}");
    println!("pieces={pieces}");
    println!("sum={sum}");
    println!("secs={secs}");
}

/// Run this binary as a child of `mode` on `dir`; its `key=value` lines.
fn run_child(mode: &str, dir: &Path, seq: u64) -> Vec<(String, String)> {
    let exe = std::env::current_exe().expect("the bench's own path");
    let out = Command::new(exe)
        .env(CHILD_ENV, mode)
        .env(CHILD_DIR_ENV, dir)
        .env(CHILD_SEQ_ENV, seq.to_string())
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .expect("run the child");
    assert!(out.status.success(), "child {mode} failed: {}", out.status);
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn child_value(kv: &[(String, String)], key: &str) -> f64 {
    kv.iter()
        .find(|(k, _)| k == key)
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or_else(|| panic!("the child reported no {key}: {kv:?}"))
}

/// Records, time and fdatasyncs summed over the rounds of one case.
#[derive(Default)]
struct Tally {
    records: u64,
    secs: f64,
    fdatasyncs: u64,
    /// Per-record latencies, where measured (the raw loop).
    lat_us: Vec<f64>,
}

impl Tally {
    fn rate(&self) -> f64 {
        self.records as f64 / self.secs
    }
}

/// One round of the device limit: 128-byte pwrites at increasing offsets,
/// each followed by fdatasync, for `d` (or until the file is full).
fn raw_round(f: &File, d: Duration, tally: &mut Tally) {
    let rec = pattern(128);
    let t = Instant::now();
    while t.elapsed() < d && (tally.records + 1) * 128 <= RAW_SYNC_FILE {
        let one = Instant::now();
        f.write_all_at(&rec, tally.records * 128).expect("pwrite");
        f.sync_data().expect("fdatasync");
        tally.lat_us.push(one.elapsed().as_secs_f64() * 1e6);
        tally.records += 1;
        tally.fdatasyncs += 1;
    }
    tally.secs += t.elapsed().as_secs_f64();
}

/// One round of `threads` threads sharing `log`, each appending 128-byte
/// records until `d` has passed.
fn append_round(log: &Log, threads: usize, d: Duration, tally: &mut Tally) {
    let rec = [0u8; 128];
    let syncs_before = log.frame_syncs();
    let start = Barrier::new(threads + 1);
    let stop = AtomicBool::new(false);
    let (records, secs) = std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| {
                    start.wait();
                    let mut n = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        log.append_raw(KIND, &[], &rec).expect("append_raw");
                        n += 1;
                    }
                    n
                })
            })
            .collect();
        start.wait();
        let t = Instant::now();
        std::thread::sleep(d);
        stop.store(true, Ordering::Relaxed);
        let records: u64 = workers
            .into_iter()
            .map(|w| w.join().expect("an appender panicked"))
            .sum();
        (records, t.elapsed().as_secs_f64())
    });
    tally.records += records;
    tally.secs += secs;
    tally.fdatasyncs += log.frame_syncs() - syncs_before;
}

struct Bench {
    cfg: Config,
    root: PathBuf,
}

impl Bench {
    /// Run one case in its own directory, removed afterwards; answers what
    /// the case answers. Dirty data of earlier cases is flushed first.
    fn case<T>(&self, name: &str, f: impl FnOnce(&Bench) -> T) -> T {
        eprintln!("{name} ...");
        self.syncfs();
        let t = Instant::now();
        let value = f(self);
        let dir = self.dir(name);
        if dir.exists() {
            std::fs::remove_dir_all(&dir).expect("remove the case's dir");
        }
        eprintln!("{name}: {:.1} s", t.elapsed().as_secs_f64());
        value
    }

    fn syncfs(&self) {
        syncfs(&self.root);
    }

    fn warm_page_cache(&self, bytes: u64) {
        warm_page_cache(&self.root, bytes);
    }

    fn dir(&self, name: &str) -> PathBuf {
        self.root.join(name)
    }

    /// A fresh directory for a case (or a part of one).
    fn fresh(&self, name: &str) -> PathBuf {
        let dir = self.dir(name);
        std::fs::create_dir_all(&dir).expect("create the case's dir");
        dir
    }

    fn raw_seq_write_1mib(&self) -> Line {
        let name = "raw_seq_write_1mib";
        let total = self.cfg.seq_write_mib * MIB;
        let f = preallocated(&self.fresh(name).join("raw"), total);
        let buf = pattern(MIB as usize);
        self.warm_page_cache(total);
        let t = Instant::now();
        for i in 0..self.cfg.seq_write_mib {
            f.write_all_at(&buf, i * MIB).expect("pwrite");
        }
        f.sync_data().expect("fdatasync");
        let secs = t.elapsed().as_secs_f64();
        Line::new(BENCH, name, mib_per_s(total, secs), "MiB/s")
            .int("mib", self.cfg.seq_write_mib)
            .num("secs", secs)
    }

    /// `raw_fdatasync_128b` and `append_128b_t{1,8,64}`: each log opened
    /// once, then `rounds` rounds of the raw loop and each log in turn.
    fn fdatasync_bound(&self) -> (Tally, [Tally; 3]) {
        let dir = self.fresh(SYNC_BOUND);
        let raw = preallocated(&dir.join("raw"), RAW_SYNC_FILE);
        let logs: Vec<Log> = APPEND_THREADS
            .iter()
            .map(|t| {
                let log = Log::open(dir.join(format!("t{t}"))).expect("open");
                for _ in 0..10 {
                    log.append_raw(KIND, &[], &[0u8; 128])
                        .expect("warm-up append");
                }
                log
            })
            .collect();
        let round = self.cfg.run / self.cfg.rounds;
        let mut raw_tally = Tally::default();
        let mut tallies: [Tally; 3] = Default::default();
        for r in 0..self.cfg.rounds {
            raw_round(&raw, round, &mut raw_tally);
            for ((log, &threads), tally) in logs.iter().zip(&APPEND_THREADS).zip(&mut tallies) {
                append_round(log, threads, round, tally);
            }
            eprintln!("  round {}/{}", r + 1, self.cfg.rounds);
        }
        (raw_tally, tallies)
    }

    fn raw_fdatasync_128b(&self, t: &Tally) -> Line {
        let mut lat = t.lat_us.clone();
        Line::new(BENCH, "raw_fdatasync_128b", t.rate(), "records/s")
            .int("records", t.records)
            .num("secs", t.secs)
            .int("rounds", u64::from(self.cfg.rounds))
            .num("p50_us", median(&mut lat))
    }

    /// One `append_128b_t*` line. `vs` is the t1 value and the target ratio
    /// against it; t1 itself compares with the raw fdatasync loop.
    fn append_128b(
        &self,
        threads: usize,
        t: &Tally,
        raw_sync: f64,
        vs: Option<(f64, f64)>,
    ) -> Line {
        let name = match threads {
            1 => "append_128b_t1",
            8 => "append_128b_t8",
            64 => "append_128b_t64",
            _ => unreachable!("no case for {threads} threads"),
        };
        let line = Line::new(BENCH, name, t.rate(), "records/s");
        let line = match vs {
            None => line.baseline("raw_fdatasync_128b", raw_sync).target(1.0),
            Some((t1, target)) => line.baseline("append_128b_t1", t1).target(target),
        };
        line.int("threads", threads as u64)
            .int("records", t.records)
            .num("secs", t.secs)
            .int("fdatasyncs", t.fdatasyncs)
            .num(
                "records_per_fdatasync",
                t.records as f64 / t.fdatasyncs as f64,
            )
            .num("syncs_per_record", t.fdatasyncs as f64 / t.records as f64)
            .num("vs_raw_fdatasync", t.rate() / raw_sync)
    }

    /// Write one blob through a streaming append in 1 MiB chunks.
    fn write_blob(log: &Log, len: u64) -> u64 {
        let chunk = pattern(MIB as usize);
        let mut p = log.begin(None, KIND, &[], len).expect("begin");
        let mut left = len;
        while left > 0 {
            let n = left.min(MIB) as usize;
            p.write(&chunk[..n]).expect("Pending::write");
            left -= n as u64;
        }
        p.commit().expect("commit")
    }

    fn blob_256mib(&self, raw_seq: f64) -> Line {
        let name = "blob_256mib";
        let log = Log::open(self.fresh(name)).expect("open");
        let len = self.cfg.blob_mib * MIB;
        self.warm_page_cache(len);
        let t = Instant::now();
        Self::write_blob(&log, len);
        let secs = t.elapsed().as_secs_f64();
        Line::new(BENCH, name, mib_per_s(len, secs), "MiB/s")
            .baseline("raw_seq_write_1mib", raw_seq)
            .target(700.0)
            .int("mib", self.cfg.blob_mib)
            .num("secs", secs)
    }

    fn frames_1mib(&self, raw_seq: f64) -> Line {
        let name = "frames_1mib";
        let frames = self.cfg.frames_1mib;
        let blob = pattern(MIB as usize);
        // The device doing the same thing without the log: 1 MiB pwrite and
        // fdatasync each, into a preallocated file.
        let raw = preallocated(&self.fresh(name).join("raw"), frames * MIB);
        self.warm_page_cache(frames * MIB);
        let t = Instant::now();
        for i in 0..frames {
            raw.write_all_at(&blob, i * MIB).expect("pwrite");
            raw.sync_data().expect("fdatasync");
        }
        let raw_secs = t.elapsed().as_secs_f64();
        drop(raw);
        let log = Log::open(self.dir(name).join("log")).expect("open");
        self.warm_page_cache(frames * MIB);
        let syncs_before = log.frame_syncs();
        let mut lat = Vec::new();
        let t = Instant::now();
        for _ in 0..frames {
            let one = Instant::now();
            log.append_raw(KIND, &[], &blob).expect("append_raw");
            lat.push(one.elapsed().as_secs_f64() * 1e3);
        }
        let secs = t.elapsed().as_secs_f64();
        let raw_mib_per_s = mib_per_s(frames * MIB, raw_secs);
        Line::new(BENCH, name, mib_per_s(frames * MIB, secs), "MiB/s")
            .baseline("raw_seq_write_1mib", raw_seq)
            .target(700.0)
            .num("raw_1mib_fdatasync_mib_per_s", raw_mib_per_s)
            .num(
                "vs_raw_1mib_fdatasync",
                mib_per_s(frames * MIB, secs) / raw_mib_per_s,
            )
            .int("frames", frames)
            .int("fdatasyncs", log.frame_syncs() - syncs_before)
            .int("segments", log.layout().len() as u64)
            .num("p50_ms", median(&mut lat))
            .num("secs", secs)
    }

    fn open_1m_frames(&self) -> Line {
        let name = "open_1m_frames";
        let dir = self.fresh(name);
        let frames = self.cfg.open_frames;
        let t = Instant::now();
        let segments = {
            let log = Log::open(&dir).expect("open");
            build_frames(&log, frames);
            log.layout().len()
        };
        let build_secs = t.elapsed().as_secs_f64();
        let mut ms = Vec::new();
        for _ in 0..self.cfg.opens {
            let t = Instant::now();
            let log = Log::open(&dir).expect("reopen");
            ms.push(t.elapsed().as_secs_f64() * 1e3);
            assert_eq!(log.head_seq(), frames, "reopened head");
        }
        let first_ms = ms[0];
        let (min, max) = ms
            .iter()
            .fold((f64::MAX, 0f64), |(lo, hi), &v| (lo.min(v), hi.max(v)));
        Line::new(BENCH, name, median(&mut ms), "ms")
            .target(100.0)
            .lower_is_better()
            .int("frames", frames)
            .int("segments", segments as u64)
            .int("opens", self.cfg.opens as u64)
            .num("first_ms", first_ms)
            .num("min_ms", min)
            .num("max_ms", max)
            .num("build_secs", build_secs)
    }

    fn read_pieces_1gib_rss(&self) -> Line {
        let name = "read_pieces_1gib_rss";
        let dir = self.fresh(name);
        let len = self.cfg.read_mib * MIB;
        let seq = {
            let log = Log::open(&dir).expect("open");
            Self::write_blob(&log, len)
        };
        // The blob is in the open segment: what does opening cost in memory?
        let open = run_child("open", &dir, seq);
        let open_last_peak = child_value(&open, "open_peak_kib") / 1024.0;
        let open_last_secs = child_value(&open, "open_secs");
        // One small frame after it rolls the blob's segment, so the reading
        // child's open checks it sealed, in O(1).
        {
            let log = Log::open(&dir).expect("reopen");
            log.append_raw(KIND, &[], b"seal")
                .expect("append after the blob");
        }
        let read = run_child("read", &dir, seq);
        let bytes = child_value(&read, "bytes") as u64;
        assert_eq!(bytes, len, "read_pieces delivered every byte");
        let secs = child_value(&read, "secs");
        Line::new(
            BENCH,
            name,
            child_value(&read, "read_peak_kib") / 1024.0,
            "MiB",
        )
        .target(8.0)
        .lower_is_better()
        .int("blob_mib", self.cfg.read_mib)
        .int("pieces", child_value(&read, "pieces") as u64)
        .num("read_mib_per_s", mib_per_s(len, secs))
        .flag("hwm_reset", child_value(&read, "read_reset") == 1.0)
        .num("open_peak_mib_blob_in_open_segment", open_last_peak)
        .num("open_ms_blob_in_open_segment", open_last_secs * 1e3)
        .num(
            "open_peak_mib_blob_sealed",
            child_value(&read, "open_peak_kib") / 1024.0,
        )
    }

    fn append_latency_growth(&self) -> Line {
        let name = "append_latency_growth";
        let small_frames = 1_000;
        let big_frames = self.cfg.latency_big_frames;
        let small = Log::open(self.fresh(name).join("small")).expect("open small");
        let big = Log::open(self.dir(name).join("big")).expect("open big");
        build_frames(&small, small_frames);
        build_frames(&big, big_frames);
        let rec = [0u8; 128];
        for log in [&small, &big] {
            for _ in 0..20 {
                log.append_raw(KIND, &[], &rec).expect("warm-up append");
            }
        }
        // Alternate blocks between the two logs so drift in the device's
        // latency lands on both alike.
        const BLOCK: usize = 50;
        let (mut us_small, mut us_big) = (Vec::new(), Vec::new());
        while us_small.len() < self.cfg.latency_samples {
            for (log, us) in [(&small, &mut us_small), (&big, &mut us_big)] {
                for _ in 0..BLOCK {
                    let t = Instant::now();
                    log.append_raw(KIND, &[], &rec).expect("append_raw");
                    us.push(t.elapsed().as_secs_f64() * 1e6);
                }
            }
        }
        let samples = us_small.len() as u64;
        let small_us = median(&mut us_small);
        let big_us = median(&mut us_big);
        Line::new(BENCH, name, big_us / small_us, "ratio")
            .target(1.1)
            .lower_is_better()
            .num("small_us", small_us)
            .num("big_us", big_us)
            .int("small_frames", small_frames)
            .int("big_frames", big_frames)
            .int("samples", samples)
    }
}
