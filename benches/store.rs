//! The store's benchmark: one JSON object per case per line on stdout,
//! progress on stderr.
//!
//! ```sh
//! flock /tmp/twinlog-bench.lock cargo bench --bench store              # full
//! flock /tmp/twinlog-bench.lock cargo bench --bench store -- --quick   # < 1 min
//! ```
//!
//! `have_*`: a have negotiation against one repository's object index —
//! batches of oids of which 10% are in the repository and 90% in none —
//! through the two bare Arrow layouts and the read stack with and without
//! its complete-projection fast path. Every arm runs in each round, in
//! turn, so drift lands on all of them; the value is the median round.
//!
//! `extents_*`: the crash-recovery diff, `extents_with_rows` over every
//! pack's extent of a file-backed tail, with every pack absorbed (the scan
//! stops early) and with one pack un-absorbed (the scan runs to the end).
//!
//! `pushlog_bytes_per_push*`: a push of 4 ref updates as one Arrow IPC
//! frame, and the live file after a compaction (`store_cases/pushlog.rs`).
//!
//! `import_objects_per_s`: a git repository made by `git fast-import`
//! imported into a log and its store, end to end (`store_cases/import.rs`).
//!
//! Each group of cases is one function called from `main`.

#[path = "common/mod.rs"]
mod common;
mod store_cases {
    #[path = "../store_cases/import.rs"]
    pub mod import;
    #[path = "../store_cases/pushlog.rs"]
    pub mod pushlog;
}

use common::*;

use std::hint::black_box;
use std::path::Path;
use std::time::Instant;

use twinlog::objects::{
    FourTables, IndexEntry, ObjType, ObjectIndex, ObjectReadStack, OneTableFourColumns,
    RebuildTriggers, OID_LEN,
};

/// The `bench` field of every line this program prints.
pub const BENCH: &str = "store";
/// Oids per have batch, as a client sends them.
const HAVE_BATCH: usize = 1000;
/// One oid in this many of a have batch is in the repository.
const HAVE_HIT_EVERY: usize = 10;
/// redb's page cache for the file-backed tails.
const REDB_CACHE: usize = 256 << 20;
/// Rows per append while a tail is loaded.
const LOAD_BATCH: usize = 100_000;

/// How big every case is: the full run or `--quick`.
struct Config {
    have_objects: usize,
    /// Batches per pass; each arm answers all of them once per round.
    have_batches: usize,
    have_rounds: usize,
    extents_rows: usize,
    extents_reps: usize,
}

impl Config {
    fn new(quick: bool) -> Config {
        if quick {
            Config {
                have_objects: 100_000,
                have_batches: 20,
                have_rounds: 3,
                extents_rows: 100_000,
                extents_reps: 3,
            }
        } else {
            Config {
                have_objects: 100_000,
                have_batches: 200,
                have_rounds: 7,
                extents_rows: 1_000_000,
                extents_reps: 7,
            }
        }
    }
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let cfg = Config::new(quick);
    let root_parent = Path::new(env!("CARGO_TARGET_TMPDIR"));
    std::fs::create_dir_all(root_parent).expect("create the target tmp dir");
    let root = tempfile::Builder::new()
        .prefix("twinlog-bench-store-")
        .tempdir_in(root_parent)
        .expect("a temp dir under target/tmp");
    eprintln!(
        "store bench ({}) in {}",
        if quick { "quick" } else { "full" },
        root.path().display()
    );
    let started = Instant::now();

    have_negotiation(&cfg);
    extents_with_rows(&cfg, root.path());
    store_cases::pushlog::run(root.path(), if quick { 200 } else { 2000 });
    store_cases::import::run(root.path(), if quick { 300 } else { 4000 });

    eprintln!("total {:.1} s", started.elapsed().as_secs_f64());
}

/// A deterministic stream of well-mixed u64s (splitmix64).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn oid(&mut self) -> [u8; OID_LEN] {
        let mut o = [0u8; OID_LEN];
        for chunk in o.chunks_mut(8) {
            let n = chunk.len();
            chunk.copy_from_slice(&self.next().to_le_bytes()[..n]);
        }
        o
    }
}

/// `n` objects with random oids; row `i` sits in pack `i % packs`, each
/// pack an extent of `pack_bytes`.
fn objects(rng: &mut Rng, n: usize, packs: usize, pack_bytes: u64) -> Vec<IndexEntry> {
    (0..n)
        .map(|i| {
            let pack = (i % packs) as u64;
            let k = (i / packs) as u64;
            IndexEntry {
                oid: rng.oid(),
                obj_type: ObjType::ALL[i % 4],
                offset: pack * pack_bytes + k * 64,
                len: 64,
                uncompressed: 200 + k,
            }
        })
        .collect()
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn min_max(v: &[f64]) -> (f64, f64) {
    v.iter()
        .fold((f64::MAX, f64::MIN), |(lo, hi), &x| (lo.min(x), hi.max(x)))
}

/// One pass of every batch through `ix`: ns per oid, after checking that
/// exactly the present oids were found.
fn have_pass<I: ObjectIndex>(ix: &I, batches: &[Vec<&[u8]>], hits: usize) -> f64 {
    let t = Instant::now();
    let mut found = 0;
    for b in batches {
        let rows = ix.lookup_batch(black_box(b));
        found += rows.iter().filter(|r| r.is_some()).count();
        black_box(rows);
    }
    let ns = t.elapsed().as_secs_f64() * 1e9;
    assert_eq!(found, hits, "{} found what is there", ix.name());
    ns / (batches.len() * HAVE_BATCH) as f64
}

/// The same pass one `lookup` at a time: what the batched tree walk saves.
fn have_pass_single<I: ObjectIndex>(ix: &I, batches: &[Vec<&[u8]>], hits: usize) -> f64 {
    let t = Instant::now();
    let mut found = 0;
    for b in batches {
        for oid in b {
            found += usize::from(ix.lookup(black_box(oid)).is_some());
        }
    }
    let ns = t.elapsed().as_secs_f64() * 1e9;
    assert_eq!(found, hits, "{} found what is there", ix.name());
    ns / (batches.len() * HAVE_BATCH) as f64
}

fn have_negotiation(cfg: &Config) {
    eprintln!("have: building {} objects", cfg.have_objects);
    let mut rng = Rng(0x5eed);
    let entries = objects(&mut rng, cfg.have_objects, 1, u64::MAX / 2);
    let four = FourTables::build(&entries).expect("build FourTables");
    let one = OneTableFourColumns::build(&entries).expect("build OneTableFourColumns");
    let fast = ObjectReadStack::<OneTableFourColumns>::build(&entries).expect("build the stack");
    let no_fast = ObjectReadStack::<OneTableFourColumns>::build(&entries).expect("build the stack");
    no_fast.set_fast_path(false);
    assert!(fast.projection_is_complete());

    let queries: Vec<Vec<[u8; OID_LEN]>> = (0..cfg.have_batches)
        .map(|_| {
            (0..HAVE_BATCH)
                .map(|j| {
                    if j % HAVE_HIT_EVERY == 0 {
                        entries[(rng.next() % entries.len() as u64) as usize].oid
                    } else {
                        rng.oid()
                    }
                })
                .collect()
        })
        .collect();
    let batches: Vec<Vec<&[u8]>> = queries
        .iter()
        .map(|b| b.iter().map(|o| &o[..]).collect())
        .collect();
    let hits = cfg.have_batches * HAVE_BATCH.div_ceil(HAVE_HIT_EVERY);

    let arms: [&dyn Fn() -> f64; 5] = [
        &|| have_pass(&four, &batches, hits),
        &|| have_pass(&one, &batches, hits),
        &|| have_pass(&fast, &batches, hits),
        &|| have_pass(&no_fast, &batches, hits),
        &|| have_pass_single(&one, &batches, hits),
    ];
    let mut t = [vec![], vec![], vec![], vec![], vec![]];
    for round in 0..=cfg.have_rounds {
        // Each round starts at another arm, so none always runs right
        // after the one that evicted its cache lines.
        for k in 0..arms.len() {
            let a = (round + k) % arms.len();
            let ns = arms[a]();
            // Round 0 warms the caches and is not counted.
            if round > 0 {
                t[a].push(ns);
            }
        }
    }
    let line = |case: &str, v: &mut Vec<f64>| {
        let (lo, hi) = min_max(v);
        Line::new(BENCH, case, median(v), "ns/oid")
            .lower_is_better()
            .int("objects", cfg.have_objects as u64)
            .int("batch", HAVE_BATCH as u64)
            .int("hit_pct", (100 / HAVE_HIT_EVERY) as u64)
            .int("rounds", cfg.have_rounds as u64)
            .num("min", lo)
            .num("max", hi)
    };
    let [t_four, t_one, t_fast, t_no_fast, t_single] = &mut t;
    let four_ns = line("have_arrow_four_tables", t_four)
        .int("ipc_bytes", four.ipc_bytes() as u64)
        .int("resident_bytes", four.resident_bytes() as u64)
        .print();
    let one_ns = line("have_arrow_one_table", t_one)
        .num("single_lookups_ns", median(t_single))
        .int("ipc_bytes", one.ipc_bytes() as u64)
        .int("resident_bytes", one.resident_bytes() as u64)
        .print();
    let (arm, arm_ns) = if four_ns <= one_ns {
        ("have_arrow_four_tables", four_ns)
    } else {
        ("have_arrow_one_table", one_ns)
    };
    let fast_ns = line("have_stack_fast", t_fast)
        .baseline(arm, arm_ns)
        .target(1.1)
        .int("tail_lookups", fast.stats().tail_lookups)
        .print();
    line("have_stack_no_fast", t_no_fast)
        .baseline("have_stack_fast", fast_ns)
        .int("tail_lookups", no_fast.stats().tail_lookups)
        .print();
}

/// A file-backed tail of `rows` rows over `packs` packs, loaded in durable
/// batches, with the projection left unbuilt until the reopen.
fn load_tail(path: &Path, rows: usize, packs: usize, pack_bytes: u64) -> f64 {
    let mut rng = Rng(packs as u64);
    let entries = objects(&mut rng, rows, packs, pack_bytes);
    let t = Instant::now();
    let s: ObjectReadStack =
        ObjectReadStack::open(path, RebuildTriggers::never(), REDB_CACHE).expect("open the tail");
    for chunk in entries.chunks(LOAD_BATCH) {
        s.append(chunk).expect("load the tail");
    }
    t.elapsed().as_secs_f64()
}

fn extents_with_rows(cfg: &Config, root: &Path) {
    for (packs, tag) in [(1_000usize, "1k"), (10_000, "10k")] {
        let rows = cfg.extents_rows;
        let pack_bytes = (rows / packs) as u64 * 64;
        let path = root.join(format!("extents_{tag}.redb"));
        eprintln!("extents: loading {rows} rows over {packs} packs");
        let load_secs = load_tail(&path, rows, packs, pack_bytes);
        let absorbed: Vec<(u64, u64)> = (0..packs as u64)
            .map(|p| (p * pack_bytes, pack_bytes))
            .collect();
        // The last pack's extent is replaced by one past every row: a pack
        // journaled whose rows never landed.
        let mut one_missing = absorbed.clone();
        one_missing[packs - 1] = (packs as u64 * pack_bytes, pack_bytes);

        let t = Instant::now();
        let stack: ObjectReadStack =
            ObjectReadStack::open(&path, RebuildTriggers::never(), REDB_CACHE)
                .expect("reopen the tail");
        let open_ms = t.elapsed().as_secs_f64() * 1e3;
        for (case, extents, all) in [
            ("absorbed", &absorbed, true),
            ("one_missing", &one_missing, false),
        ] {
            let mut ms = Vec::new();
            for _ in 0..cfg.extents_reps {
                let t = Instant::now();
                let out = stack.extents_with_rows(extents).expect("extents_with_rows");
                ms.push(t.elapsed().as_secs_f64() * 1e3);
                let had = out.iter().filter(|&&b| b).count();
                assert_eq!(had, if all { packs } else { packs - 1 }, "{case}");
            }
            let first = ms[0];
            let (lo, hi) = min_max(&ms);
            let mut line = Line::new(
                BENCH,
                &format!("extents_{tag}_packs_{case}"),
                median(&mut ms),
                "ms",
            );
            if tag == "1k" && all {
                line = line.target(5.0);
            }
            line.lower_is_better()
                .int("rows", rows as u64)
                .int("packs", packs as u64)
                .int("reps", cfg.extents_reps as u64)
                .num("first_ms", first)
                .num("min_ms", lo)
                .num("max_ms", hi)
                .num("open_ms", open_ms)
                .num("load_secs", load_secs)
                .print();
        }
    }
}
