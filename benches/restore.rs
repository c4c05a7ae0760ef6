//! The restore benchmark: one JSON object per case per line on stdout,
//! progress on stderr.
//!
//! ```sh
//! flock /tmp/twinlog-bench.lock cargo bench --bench restore              # full
//! flock /tmp/twinlog-bench.lock cargo bench --bench restore -- --quick   # < 1 min
//! ```
//!
//! The twin is served by this process over QUIC on loopback with mutual TLS
//! (a `RestoreSource` on a log and store built first); the box restored is
//! a fresh data directory on the same disk.
//!
//! - `raw_seq_write_1mib`: 1 MiB pwrites into a preallocated file, one
//!   fdatasync: the device's limit, in this run.
//! - `restore_2gib`: a 2 GiB log (7 entries of 256 MiB among 20,000 small
//!   frames) restored from frame 1: MiB/s of log, ratio to the raw limit.
//! - `restore_resume_ms`: a restore child process killed 128 MiB into a
//!   256 MiB entry, run again: from the rerun's start to its first new byte
//!   written (salvaging the 128 MiB it held included).
//! - `snapshot_install_1gib`: a store of 1 GiB of objects fetched as a
//!   snapshot over QUIC and installed (checked, swapped, log restarted).

#[path = "common/mod.rs"]
mod common;
#[path = "shared/restore_case.rs"]
mod restore_case;

use common::*;
use restore_case::*;

use std::net::SocketAddr;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use twinlog::daemon;
use twinlog::log::Log;
use twinlog::net::{self, Identity, Pins, Role};
use twinlog::node::restore::{self, RestoreOptions};
use twinlog::node::snapshot_transfer::{self as snapshot, SnapshotSource};
use twinlog::node::store_host::StoreHost;
use twinlog::objects::ObjType;
use twinlog::store::install::{self, InstallPaths};
use twinlog::store::{frames, PackBuilder, RepoOp, StoreOptions};

const BENCH: &str = "restore";
const CHILD_ENV: &str = "TWINLOG_BENCH_RESTORE_CHILD";

struct Config {
    raw_mib: u64,
    big_entries: u64,
    big_mib: u64,
    small_frames: u64,
    resume_entry_mib: u64,
    resume_kill_mib: u64,
    store_mib: u64,
}

impl Config {
    fn new(quick: bool) -> Config {
        if quick {
            Config {
                raw_mib: 256,
                big_entries: 1,
                big_mib: 64,
                small_frames: 2_000,
                resume_entry_mib: 64,
                resume_kill_mib: 32,
                store_mib: 64,
            }
        } else {
            Config {
                raw_mib: 2048,
                big_entries: 7,
                big_mib: 256,
                small_frames: 20_000,
                resume_entry_mib: 256,
                resume_kill_mib: 128,
                store_mib: 1024,
            }
        }
    }
}

fn main() {
    if std::env::var(CHILD_ENV).is_ok() {
        return restore_child();
    }
    let quick = std::env::args().any(|a| a == "--quick");
    let cfg = Config::new(quick);
    let parent = Path::new(env!("CARGO_TARGET_TMPDIR"));
    std::fs::create_dir_all(parent).expect("target tmp");
    let root = tempfile::Builder::new()
        .prefix("twinlog-bench-restore-")
        .tempdir_in(parent)
        .expect("temp dir");
    eprintln!(
        "restore bench ({}) in {}",
        if quick { "quick" } else { "full" },
        root.path().display()
    );
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let started = Instant::now();
    let raw = raw_seq_write(root.path(), cfg.raw_mib);
    rt.block_on(restore_2gib(
        root.path(),
        cfg.big_entries,
        cfg.big_mib,
        cfg.small_frames,
        raw,
    ))
    .print();
    rt.block_on(restore_resume(root.path(), &cfg));
    rt.block_on(snapshot_install(root.path(), &cfg));
    eprintln!("total {:.1} s", started.elapsed().as_secs_f64());
}

fn raw_seq_write(root: &Path, mib: u64) -> f64 {
    let total = mib * MIB;
    let f = preallocated(&root.join("raw"), total);
    let buf = pattern(MIB as usize);
    warm_page_cache(root, total);
    syncfs(root);
    let t = Instant::now();
    for i in 0..mib {
        f.write_all_at(&buf, i * MIB).expect("pwrite");
    }
    f.sync_data().expect("fdatasync");
    let secs = t.elapsed().as_secs_f64();
    drop(f);
    std::fs::remove_file(root.join("raw")).expect("rm raw");
    Line::new(BENCH, "raw_seq_write_1mib", mib_per_s(total, secs), "MiB/s")
        .int("mib", mib)
        .num("secs", secs)
        .print()
}

/// The child half of `restore_resume_ms`: one restore run, its report as
/// JSON on stdout.
fn restore_child() {
    let get = |k: &str| std::env::var(k).unwrap_or_else(|_| panic!("{k} is set"));
    let data = PathBuf::from(get("BENCH_DATA"));
    let addr: SocketAddr = get("BENCH_FROM").parse().expect("addr");
    let fp = get("BENCH_FP").parse().expect("fingerprint");
    let identity = Arc::new(daemon::load_identity(&data.join("id")).expect("identity"));
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let report = rt
        .block_on(restore::restore(
            RestoreOptions {
                data_dir: data,
                segment_bytes: twinlog::log::DEFAULT_SEGMENT_BYTES,
                source: addr,
                source_fingerprint: fp,
                identity,
            },
            Arc::new(|_| {}),
        ))
        .expect("restore");
    println!("{}", serde_json::to_string(&report).expect("json"));
}

fn partial_written(data: &Path) -> Option<u64> {
    let b = std::fs::read(data.join(restore::PARTIAL_FILE)).ok()?;
    let v: serde_json::Value = serde_json::from_slice(&b).ok()?;
    v.get("written")?.as_u64()
}

async fn restore_resume(root: &Path, cfg: &Config) {
    let twin = root.join("twin-resume");
    fill_log(&twin.join("log"), 1, cfg.resume_entry_mib, 100);
    let data = root.join("box-resume");
    let id = Identity::mint().expect("mint");
    daemon::write_identity(&data.join("id"), &id).expect("identity");
    let served = serve(&twin, id.fingerprint());
    let child = || {
        Command::new(std::env::current_exe().expect("exe"))
            .env(CHILD_ENV, "1")
            .env("BENCH_DATA", &data)
            .env("BENCH_FROM", served.addr.to_string())
            .env("BENCH_FP", served.fingerprint.to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn")
    };
    let mut run = child();
    let kill_at = cfg.resume_kill_mib * MIB;
    let t = Instant::now();
    while partial_written(&data).is_none_or(|w| w < kill_at) {
        assert!(
            t.elapsed() < Duration::from_secs(120),
            "the first run never got {kill_at} bytes in"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    run.kill().expect("kill");
    run.wait().expect("reap");
    let held = partial_written(&data).unwrap_or(0);
    let t = Instant::now();
    let out = child().wait_with_output().expect("rerun");
    let wall = t.elapsed().as_secs_f64();
    assert!(out.status.success(), "the rerun failed");
    let text = String::from_utf8(out.stdout).expect("utf8");
    let report: serde_json::Value =
        serde_json::from_str(text.lines().find(|l| l.starts_with('{')).expect("a report"))
            .expect("json");
    let first_ms = report["first_new_byte_ms"].as_f64().expect("first byte");
    Line::new(BENCH, "restore_resume_ms", first_ms, "ms")
        .lower_is_better()
        .int("held_bytes", held)
        .int(
            "resumed_at_byte",
            report["started_at_byte"].as_u64().unwrap_or(0),
        )
        .int(
            "received_bytes",
            report["received_bytes"].as_u64().unwrap_or(0),
        )
        .num("rerun_secs", wall)
        .print();
    drop(served);
    let _ = std::fs::remove_dir_all(&data);
    let _ = std::fs::remove_dir_all(&twin);
}

async fn snapshot_install(root: &Path, cfg: &Config) {
    // The source: a store of `store_mib` of 64 KiB objects in 4 MiB packs.
    let src = root.join("snap-src");
    let log = Arc::new(Log::open(src.join("log")).expect("log"));
    let f = frames::repo_frame("bench", RepoOp::Create).expect("frame");
    log.append_raw(f.kind.as_u16(), &f.meta, &f.blob)
        .expect("append");
    let mut n = 0u64;
    for _ in 0..cfg.store_mib / 4 {
        let mut p = PackBuilder::new();
        for _ in 0..64 {
            let mut data = pattern(64 << 10);
            data[..8].copy_from_slice(&n.to_le_bytes());
            n += 1;
            p.add(ObjType::Blob, &data).expect("add");
        }
        let f = p.frame("bench").expect("frame");
        log.append_raw(f.kind.as_u16(), &f.meta, &f.blob)
            .expect("append");
    }
    let host =
        StoreHost::open(log.clone(), &src.join("store"), StoreOptions::default()).expect("store");
    let source = SnapshotSource::new(host, &src.join("snapshots"), None);
    let (sid, rid) = (
        Identity::mint().expect("mint"),
        Identity::mint().expect("mint"),
    );
    let server = net::server(
        ([127, 0, 0, 1], 0).into(),
        &sid,
        Arc::new(Pins::new().pin(rid.fingerprint(), Role::Twin)),
    )
    .expect("server");
    let addr = server.local_addr().expect("addr");
    let s2 = source.clone();
    tokio::spawn(async move {
        while let Some(incoming) = server.accept().await {
            if let Ok(conn) = incoming.await {
                tokio::spawn(snapshot::serve_requests(s2.clone(), conn));
            }
        }
    });
    let client = net::client(
        &rid,
        Arc::new(Pins::new().pin(sid.fingerprint(), Role::Primary)),
    )
    .expect("client");
    let conn = net::connect(&client, addr).await.expect("connect");
    // The snapshot is taken on the first request; take it before timing.
    let warm = root.join("snap-warm");
    snapshot::fetch(&conn, &InstallPaths::new(&warm), &mut |_, _| {})
        .await
        .expect("warm fetch");
    let _ = std::fs::remove_dir_all(&warm);
    let dst = root.join("snap-dst");
    let dlog = Log::open(dst.join("log")).expect("log");
    syncfs(root);
    let paths = InstallPaths::new(&dst);
    let t = Instant::now();
    let fetched = snapshot::fetch(&conn, &paths, &mut |_, _| {})
        .await
        .expect("fetch");
    let fetch_secs = t.elapsed().as_secs_f64();
    let at = install::install(&paths, &dlog, None).expect("install");
    let secs = t.elapsed().as_secs_f64();
    assert_eq!(dlog.head_seq(), at);
    Line::new(BENCH, "snapshot_install_1gib", secs, "s")
        .lower_is_better()
        .num("mib", fetched.total as f64 / MIB as f64)
        .num("mib_per_s", mib_per_s(fetched.total, secs))
        .num("fetch_secs", fetch_secs)
        .num("install_secs", secs - fetch_secs)
        .int("objects", n)
        .int("path_mtu", u64::from(conn.stats().path.current_mtu))
        .print();
    let _ = std::fs::remove_dir_all(&src);
    let _ = std::fs::remove_dir_all(&dst);
}
