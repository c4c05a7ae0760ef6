//! twinlog beside the tool users would pick instead: PostgreSQL's
//! synchronous streaming replication, on the same machine, in the same run.
//! One JSON object per case per line on stdout, progress on stderr.
//!
//! ```sh
//! flock /tmp/twinlog-bench.lock cargo bench --bench peers              # full, ~6 min
//! flock /tmp/twinlog-bench.lock cargo bench --bench peers -- --quick   # ~1 min
//! ```
//!
//! PostgreSQL (installed from Debian's packages where it is missing; the
//! bench says so and runs twinlog's cases alone where it cannot be had): a
//! primary and a standby on loopback, `synchronous_commit = on`,
//! `synchronous_standby_names = '*'`, everything else default, driven by
//! `pgbench -j 2` for `secs` per level, once without TLS (its default) and
//! once with `ssl = on` and `sslmode=require` for the clients and the
//! standby. Its cases:
//!
//! - `pg_on_128b_c{1,8,64}`: transactions of one 128-byte row insert;
//! - `pg_local_128b_c{1,8}`: the same at `synchronous_commit = local`;
//! - `pg_on_1mib_c4`: 1 MiB rows (TOAST storage `EXTERNAL`, so nothing is
//!   compressed), 4 clients, in MiB/s;
//! - `pg_basebackup`: a fresh copy of a cluster holding `restore_mib` of
//!   rows by `pg_basebackup -X stream` (fsynced, its default), in MiB/s.
//!
//! twinlog (a real primary and twin, each its own process, on loopback with
//! mutual TLS, as `benches/repl.rs` runs them), each line with `ratio` to
//! the PostgreSQL case without TLS and `ratio_tls` to the one with it:
//!
//! - `twin_128b_c{1,8,64}`, `local_128b_c{1,8}`: closed-loop appends of
//!   128-byte frames for `secs`, 8 QUIC connections at most;
//! - `bulk_frames_1mib`: 4 closed-loop appenders of 1 MiB frames, `twin`;
//! - `bulk_blob_1gib`: one 1 GiB blob streamed, `twin`;
//! - `restore_2gib`: a fresh box restored from a twin's 2 GiB log.
//!
//! The physical floor, in the same run (`benches/shared/floor.rs`): a raw
//! chain of `pwrite`, `fdatasync` and loopback UDP doing the same work in
//! three processes with none of twinlog's code, `floor_local_128b_c1`,
//! `floor_twin_128b_c1` and `floor_twin_128b_c8` (grouping as the
//! appender does). The small cases report `ratio_floor` to theirs.
//!
//! `budget_twin_128b_c1` (`benches/shared/budget.rs`): where the time of
//! one `twin` append goes, stage by stage, from marks in the client and
//! both daemons.
//!
//! Every line reports the CPU the whole machine spent per append (or per
//! MiB), so a missed target says what bound it; the small appends add
//! `switches_per_append`, both daemons' context switches per append.

#[path = "shared/budget.rs"]
mod budget;
#[path = "shared/repl_cases.rs"]
mod cases;
#[path = "common/mod.rs"]
mod common;
#[path = "shared/floor.rs"]
mod floor;
#[path = "shared/postgres.rs"]
mod postgres;
#[path = "shared/restore_case.rs"]
mod restore_case;

use cases::*;
use common::*;
use postgres::{PgPair, Programs};

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::task::JoinSet;
use twinlog::node::{Client, Durability};

const PEERS: &str = "peers";

struct Sizes {
    secs: u32,
    restore_big_entries: u64,
    restore_big_mib: u64,
    restore_small_frames: u64,
}

impl Sizes {
    fn new(quick: bool) -> Sizes {
        match quick {
            true => Sizes {
                secs: 2,
                restore_big_entries: 3,
                restore_big_mib: 64,
                restore_small_frames: 2_000,
            },
            false => Sizes {
                secs: 10,
                restore_big_entries: 7,
                restore_big_mib: 256,
                restore_small_frames: 20_000,
            },
        }
    }

    fn restore_mib(&self) -> u64 {
        self.restore_big_entries * self.restore_big_mib
    }
}

/// PostgreSQL's figures, without TLS and with it.
#[derive(Default)]
struct Peer {
    on: [Option<f64>; 2],
    cpu: [Option<f64>; 2],
}

/// The PostgreSQL cases, by name, for both TLS settings.
#[derive(Default)]
struct PeerCases {
    cases: std::collections::BTreeMap<&'static str, Peer>,
}

impl PeerCases {
    fn set(&mut self, name: &'static str, tls: bool, value: f64, cpu: f64) {
        let p = self.cases.entry(name).or_default();
        p.on[usize::from(tls)] = Some(value);
        p.cpu[usize::from(tls)] = Some(cpu);
    }

    /// Our line compared with the PostgreSQL case `peer`.
    fn compare(&self, line: Line, peer: &'static str, target: f64) -> Line {
        let Some(p) = self.cases.get(peer) else {
            return line.flag("peer_measured", false);
        };
        let mut line = match p.on[0] {
            Some(v) => line.baseline(peer, v).target(target),
            None => line,
        };
        if let Some(v) = p.on[1] {
            let ratio = line.value / v;
            line = line.num("peer_tls", v).num("ratio_tls", ratio);
        }
        line
    }
}

fn main() {
    if let Ok(role) = std::env::var(floor::FLOOR_ROLE_ENV) {
        floor::floor_main(&role);
        return;
    }
    if let (Ok(role), Ok(config)) = (std::env::var(ROLE_ENV), std::env::var(CONFIG_ENV)) {
        daemon_main(&role, Path::new(&config));
        return;
    }
    let quick = std::env::args().any(|a| a == "--quick");
    let sizes = Sizes::new(quick);
    let parent = Path::new(env!("CARGO_TARGET_TMPDIR"));
    std::fs::create_dir_all(parent).expect("create the target tmp dir");
    let root = tempfile::Builder::new()
        .prefix("twinlog-bench-peers-")
        .tempdir_in(parent)
        .expect("a temp dir under target/tmp");
    eprintln!(
        "peers bench ({}) in {}",
        if quick { "quick" } else { "full" },
        root.path().display()
    );
    let started = Instant::now();
    let peers = match Programs::find_or_install() {
        Ok(p) => {
            eprintln!("PostgreSQL {} ...", p.version);
            run_postgres(&p, root.path(), &sizes)
        }
        Err(why) => {
            eprintln!(
                "SKIPPED the PostgreSQL cases: {why}. twinlog's cases run alone, without ratios."
            );
            PeerCases::default()
        }
    };
    let floors = run_floor(root.path(), &sizes);
    let rt = tokio::runtime::Runtime::new().expect("a tokio runtime");
    rt.block_on(run_twinlog(root.path(), &sizes, quick, &peers, &floors));
    eprintln!("total {:.1} s", started.elapsed().as_secs_f64());
}

fn run_postgres(p: &Programs, root: &Path, sizes: &Sizes) -> PeerCases {
    let mut out = PeerCases::default();
    let small = format!("INSERT INTO small VALUES ('\\x{}');\n", "ab".repeat(128));
    let big = "INSERT INTO big VALUES (repeat(md5(random()::text), 32768));\n";
    for tls in [false, true] {
        let dir = root.join(if tls { "pg-tls" } else { "pg" });
        let pg = PgPair::start(p, &dir, tls);
        let suffix = if tls { "_tls" } else { "" };
        syncfs(root);
        for (name, clients, local) in [
            ("pg_local_128b_c1", 1, true),
            ("pg_on_128b_c1", 1, false),
            ("pg_on_128b_c8", 8, false),
            ("pg_on_128b_c64", 64, false),
            ("pg_local_128b_c8", 8, true),
        ] {
            let r = pg.bench(name, &small, clients, sizes.secs, local);
            let cpu_us = r.machine_cpu_secs / r.transactions as f64 * 1e6;
            out.set(name, tls, r.tps, cpu_us);
            Line::new(PEERS, &format!("{name}{suffix}"), r.tps, "tps")
                .flag("tls", tls)
                .int("clients", u64::from(clients))
                .int("transactions", r.transactions)
                .num("secs", r.secs)
                .num("cpu_us_per_tx", cpu_us)
                .print();
        }
        let r = pg.bench("pg_on_1mib_c4", big, 4, sizes.secs, false);
        let cpu_ms_per_mib = r.machine_cpu_secs / r.transactions as f64 * 1e3;
        out.set("pg_on_1mib_c4", tls, r.tps, cpu_ms_per_mib);
        Line::new(PEERS, &format!("pg_on_1mib_c4{suffix}"), r.tps, "MiB/s")
            .flag("tls", tls)
            .int("clients", 4)
            .int("transactions", r.transactions)
            .num("cpu_ms_per_mib", cpu_ms_per_mib)
            .print();
        let busy = MachineBusy::start();
        let (bytes, secs) = pg.basebackup(sizes.restore_mib());
        let busy = busy.secs();
        let rate = mib_per_s(bytes, secs);
        let cpu_ms_per_mib = busy / (bytes as f64 / MIB as f64) * 1e3;
        out.set("pg_basebackup", tls, rate, cpu_ms_per_mib);
        Line::new(PEERS, &format!("pg_basebackup{suffix}"), rate, "MiB/s")
            .flag("tls", tls)
            .num("mib", bytes as f64 / MIB as f64)
            .num("secs", secs)
            .num("cpu_ms_per_mib", cpu_ms_per_mib)
            .print();
        drop(pg);
        let _ = std::fs::remove_dir_all(&dir);
    }
    out
}

/// The raw chain's cases (`benches/shared/floor.rs`), by name.
type Floors = std::collections::BTreeMap<&'static str, f64>;

fn run_floor(root: &Path, sizes: &Sizes) -> Floors {
    let run = Duration::from_secs(u64::from(sizes.secs));
    let mut out = Floors::new();
    for (name, wait_twin, clients) in [
        ("floor_local_128b_c1", false, 1),
        ("floor_twin_128b_c1", true, 1),
        ("floor_twin_128b_c8", true, 8),
    ] {
        eprintln!("{name} ...");
        syncfs(root);
        let chain = floor::Floor::start(&root.join("floor"), wait_twin);
        // Warm both files' first pages and the sockets.
        chain.run(clients, run / 4);
        let busy = MachineBusy::start();
        let started = Instant::now();
        let rate = chain.run(clients, run);
        let appends = rate * started.elapsed().as_secs_f64();
        let cpu_us = busy.secs() / appends.max(1.0) * 1e6;
        drop(chain);
        out.insert(name, rate);
        Line::new(PEERS, name, rate, "appends/s")
            .int("clients", clients as u64)
            .num("us_per_append", 1e6 / rate * clients as f64)
            .num("cpu_us_per_append", cpu_us)
            .print();
    }
    let _ = std::fs::remove_dir_all(root.join("floor"));
    out
}

async fn run_twinlog(root: &Path, sizes: &Sizes, quick: bool, peers: &PeerCases, floors: &Floors) {
    let run = Duration::from_secs(u64::from(sizes.secs));
    // What PostgreSQL's cases left dirty is written back before ours run.
    syncfs(root);
    let mut pair = Pair::init(&root.join("pair"));
    let clients = pair.clients().await;
    pair.converged(&clients[0], Duration::from_secs(30)).await;
    // Warm the connections and both logs.
    append_round(&clients, CONNECTIONS, Durability::Twin, run / 4).await;
    let mut local_c1 = f64::NAN;
    for (name, durability, tasks, peer, target) in [
        (
            "local_128b_c1",
            Durability::Local,
            1,
            "pg_local_128b_c1",
            1.5,
        ),
        ("twin_128b_c1", Durability::Twin, 1, "pg_on_128b_c1", 2.0),
        ("twin_128b_c8", Durability::Twin, 8, "pg_on_128b_c8", 2.0),
        ("twin_128b_c64", Durability::Twin, 64, "pg_on_128b_c64", 2.0),
        (
            "local_128b_c8",
            Durability::Local,
            8,
            "pg_local_128b_c8",
            1.5,
        ),
    ] {
        eprintln!("{name} ...");
        pair.converged(&clients[0], Duration::from_secs(60)).await;
        syncfs(root);
        let probe = Probe::take(&pair);
        let (appends, secs) = append_round(&clients, tasks, durability, run).await;
        let usage = probe.since(&pair);
        let rate = appends as f64 / secs;
        let mut line = Line::new(PEERS, name, rate, "appends/s")
            .int("tasks", tasks as u64)
            .int("appends", appends)
            .num("secs", secs)
            .num(
                "cpu_us_per_append",
                usage.machine_cpu_secs() / appends as f64 * 1e6,
            )
            .num(
                "switches_per_append",
                usage.daemon_switches() as f64 / appends.max(1) as f64,
            );
        if name == "local_128b_c1" {
            local_c1 = rate;
        }
        if name == "twin_128b_c1" {
            line = line
                .num("ratio_to_local_128b_c1", rate / local_c1)
                .num("target_to_local_128b_c1", 0.8);
        }
        let floor = format!("floor_{name}");
        if let Some((&floor, &v)) = floors.get_key_value(floor.as_str()) {
            line = line
                .text("floor", floor)
                .num("floor_value", v)
                .num("ratio_floor", rate / v)
                .num("target_floor", 0.7);
        }
        peers.compare(line, peer, target).print();
    }

    drop(clients);
    budget_case(&mut pair, root, run).await;
    let clients = pair.clients().await;

    eprintln!("bulk_frames_1mib ...");
    pair.converged(&clients[0], Duration::from_secs(60)).await;
    let probe = Probe::take(&pair);
    let (frames, secs) = bulk_frames(&clients, run).await;
    let usage = probe.since(&pair);
    let line = Line::new(PEERS, "bulk_frames_1mib", frames as f64 / secs, "MiB/s")
        .int("tasks", 4)
        .int("frames", frames)
        .num("secs", secs)
        .num(
            "cpu_ms_per_mib",
            usage.machine_cpu_secs() / frames as f64 * 1e3,
        );
    peers.compare(line, "pg_on_1mib_c4", 3.0).print();

    eprintln!("bulk_blob_1gib ...");
    let bench = Bench {
        cfg: Config::new(quick, Vec::new()),
        root: root.join("pair"),
    };
    let busy = MachineBusy::start();
    let [blob, ..] = bench.bulk_blob(&mut pair, &clients, f64::NAN).await;
    let busy = busy.secs();
    let mib = bench.cfg.bulk_mib as f64;
    let line = Line::new(PEERS, "bulk_blob_1gib", blob.value, "MiB/s")
        .num("mib", mib)
        .num("cpu_ms_per_mib", busy / mib * 1e3);
    peers.compare(line, "pg_on_1mib_c4", 3.0).print();
    drop(clients);
    pair.stop();

    eprintln!("restore_2gib ...");
    let busy = MachineBusy::start();
    let restored = restore_case::restore_2gib(
        root,
        sizes.restore_big_entries,
        sizes.restore_big_mib,
        sizes.restore_small_frames,
        f64::NAN,
    )
    .await;
    let busy = busy.secs();
    let line = Line::new(PEERS, "restore_2gib", restored.value, "MiB/s")
        .num("mib", sizes.restore_mib() as f64)
        .num("cpu_ms_per_mib", busy / sizes.restore_mib() as f64 * 1e3);
    peers.compare(line, "pg_basebackup", 1.5).print();
}

/// `budget_twin_128b_c1`: where the time of one `twin` append goes, from
/// marks in the client and both daemons (`twinlog::budget`), which run
/// with the marks on for this case only (restarted with `TWINLOG_BUDGET`
/// and again without). Its value is the mean µs of an append with the
/// marks on; `at_<stage>` the mean µs after the append's `client_send`.
async fn budget_case(pair: &mut Pair, root: &Path, run: Duration) {
    eprintln!("budget_twin_128b_c1 ...");
    budget::self_check();
    let dir = root.join("budget");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("the budget's dir");
    let prefix = dir.join("marks");
    let env = twinlog::budget::BUDGET_ENV;
    pair.restart_with_env(env, Some(prefix.display().to_string()));
    let clients = pair.clients().await;
    pair.converged(&clients[0], Duration::from_secs(60)).await;
    append_round(&clients, 1, Durability::Twin, run / 4).await;
    twinlog::budget::start(prefix);
    let (appends, secs) = append_round(&clients, 1, Durability::Twin, run).await;
    twinlog::budget::stop();
    drop(clients);
    // Stopped by SIGTERM: each daemon's last 50 ms of marks may be lost,
    // which leaves the last appends without them (counted by `appends`).
    pair.restart_with_env(env, None);
    let b = budget::Budget::read(&dir, "marks");
    b.print_table();
    let mut line = Line::new(PEERS, "budget_twin_128b_c1", b.total_us(), "us")
        .int("appends", b.appends)
        .num("rate_marked", appends as f64 / secs)
        .lower_is_better();
    for (stage, at) in &b.at_us {
        line.fields
            .push((stage_field(*stage), common::json_num(*at)));
    }
    line.print();
    let _ = std::fs::remove_dir_all(&dir);
}

fn stage_field(s: twinlog::budget::Stage) -> &'static str {
    use twinlog::budget::Stage::*;
    match s {
        ClientSend => "at_client_send",
        PrimaryReceived => "at_primary_received",
        Queued => "at_queued",
        AppenderWoken => "at_appender_woken",
        Staged => "at_staged",
        Published => "at_published",
        StreamWritten => "at_stream_written",
        LocalSynced => "at_local_synced",
        TwinReceived => "at_twin_received",
        TwinWriterWoken => "at_twin_writer_woken",
        TwinSynced => "at_twin_synced",
        TwinAckSent => "at_twin_ack_sent",
        AckReceived => "at_ack_received",
        AnswerReady => "at_answer_ready",
        AnswerSent => "at_answer_sent",
        ClientReceived => "at_client_received",
    }
}

/// Four closed-loop appenders of 1 MiB frames with `twin` durability for
/// `run`: frames appended, and seconds.
async fn bulk_frames(clients: &[Arc<Client>], run: Duration) -> (u64, f64) {
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let mut set = JoinSet::new();
    let t = Instant::now();
    for client in clients.iter().take(4) {
        let (client, stop, done) = (client.clone(), stop.clone(), done.clone());
        set.spawn(async move {
            let blob = pattern(MIB as usize);
            while !stop.load(Ordering::Relaxed) {
                client
                    .append(KIND, &[], &blob, Durability::Twin)
                    .await
                    .expect("a 1 MiB append");
                done.fetch_add(1, Ordering::Relaxed);
            }
        });
    }
    tokio::time::sleep(run).await;
    stop.store(true, Ordering::Relaxed);
    set.join_all().await;
    (done.load(Ordering::Relaxed), t.elapsed().as_secs_f64())
}
