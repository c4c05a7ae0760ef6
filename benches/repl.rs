//! The replication benchmark: a real primary and twin, each its own process,
//! on loopback with mutual TLS as deployed; the client is the admin identity
//! `init` made, in this process. One JSON object per case per line on
//! stdout, progress on stderr.
//!
//! ```sh
//! cargo bench --bench repl              # full run, a few minutes
//! cargo bench --bench repl -- --quick   # every case smaller, under a minute
//! cargo bench --bench repl -- --quick lag # only the cases whose name has `lag`
//! cargo bench --bench repl -- --quick drift # the throughput drift, 1 minute
//! ```
//!
//! A filter selects cases by a part of their name; `raw_seq_write_1mib` always
//! runs (the bulk cases' baseline), and a `twin_128b_*` case runs with its
//! `local_128b_*` baseline.
//!
//! The daemons are this binary re-executed with [`ROLE_ENV`] and
//! [`CONFIG_ENV`] set: the child runs `daemon::serve_primary` or
//! `daemon::serve_twin`, the library entry points of the `primary` and
//! `twin` binaries, until SIGTERM (and dies with the bench: parent-death
//! signal, and a guard that SIGKILLs it on the way out, panics included).
//!
//! Every case also reports what it cost, so a missed target says what bound
//! it: `cpu_primary`, `cpu_twin` and `cpu_bench` are the cores each process
//! used (CPU seconds over wall seconds, user and system, from
//! `/proc/<pid>/stat`), `cpu_machine` the cores busy machine-wide (kernel
//! writeback and journal threads included) out of `cores`;
//! `primary_fdatasyncs`/`twin_fdatasyncs` the frame syncs each daemon's
//! `/metrics` counted; `udp_datagrams`/`udp_drops` the machine's UDP
//! datagrams received and dropped for a full socket buffer (loss QUIC had to
//! recover), from `/proc/net/snmp`; `switches_primary`/`switches_twin`
//! the context switches, voluntary and not, of every thread of each daemon
//! (`/proc/<pid>/task/*/status`). The small-append cases add
//! `cpu_us_per_append` (the whole machine's busy CPU per append) and
//! `switches_per_append` (both daemons'), so a change shows what it saved.
//!
//! `raw_seq_write_1mib` is `benches/log.rs`'s case at the bulk cases' size
//! (1 GiB, quick 128 MiB), so the ratios compare the same amount of data.
//! The `lag_*` appenders are open loop: every tick sends, whatever the acks
//! in flight, so a slow ack never lowers the rate it is measured at.
//!
//! Every file lives under cargo's target tmp dir (on the project's disk,
//! never a tmpfs `/tmp`), removed at the end. Before every bulk case the
//! page cache is warmed as `benches/log.rs` explains.

#[path = "shared/repl_cases.rs"]
mod cases;
#[path = "common/mod.rs"]
mod common;

use cases::*;

use std::path::Path;
use std::time::Instant;

fn main() {
    if let (Ok(role), Ok(config)) = (std::env::var(ROLE_ENV), std::env::var(CONFIG_ENV)) {
        daemon_main(&role, Path::new(&config));
        return;
    }
    let quick = std::env::args().any(|a| a == "--quick");
    // Cargo passes `--bench`; every other word is a filter.
    let filters = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let root_parent = Path::new(env!("CARGO_TARGET_TMPDIR"));
    std::fs::create_dir_all(root_parent).expect("create the target tmp dir");
    let root = tempfile::Builder::new()
        .prefix("twinlog-bench-repl-")
        .tempdir_in(root_parent)
        .expect("a temp dir under target/tmp");
    eprintln!(
        "twinlog repl bench ({}) in {}",
        if quick { "quick" } else { "full" },
        root.path().display()
    );
    let started = Instant::now();
    let b = Bench {
        cfg: Config::new(quick, filters),
        root: root.path().to_path_buf(),
    };
    let raw_seq = b
        .case("raw_seq_write_1mib", || b.raw_seq_write_1mib())
        .print();

    // Declared after `root`: dropped (its children killed) before it is
    // removed, on a panic too.
    let mut pair = Pair::init(&b.root.join("pair"));
    let rt = tokio::runtime::Runtime::new().expect("a tokio runtime");
    rt.block_on(b.replicated(&mut pair, raw_seq));
    drop(rt);
    pair.stop();
    eprintln!("total {:.1} s", started.elapsed().as_secs_f64());
}
