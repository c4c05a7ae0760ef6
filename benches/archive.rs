//! The archive benchmark, against a real S3 server on loopback (Garage,
//! one node, `testkit::garage`; `GARAGE_BIN` picks the build, and the
//! line says which ran). One JSON object per case per line on stdout,
//! progress on stderr.
//!
//! ```sh
//! cargo bench --bench archive              # full run (2 GiB archived), minutes
//! cargo bench --bench archive -- --quick   # every case smaller, about a minute
//! ```
//!
//! - `archive_mib_s`: sealed segments of incompressible 1 MiB frames
//!   archived as `[archive]`'s defaults do (each frame's crcs checked,
//!   zstd level 3, multipart), against `object_store` puts of the same
//!   segment files through the same bucket (the `ratio`; target 0.9).
//! - `restore_from_archive_2gib`: a fresh log filled from that archive,
//!   every crc checked and every frame written and synced, against a raw
//!   download of the same objects (target 0.8).
//! - `tiered_read_p99_ms`: reading one archived 1 MiB frame from a new
//!   cursor as a box does (the listing and footers cached and shared), p99;
//!   with the same uncached; its baseline the same read from the local log.
//! - `twin_128b_c8_while_archiving`: 8 clients' `twin` appends on a pair
//!   whose twin is archiving a backlog at the default pace, against the
//!   same on a pair without an archive, rounds alternated (target 0.9).

#[path = "shared/repl_cases.rs"]
mod cases;
#[path = "common/mod.rs"]
mod common;

use cases::*;
use common::Line;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use testkit::garage::{self, Garage};
use twinlog::archive::bucket::{Bucket, Spec};
use twinlog::archive::codec::Codec;
use twinlog::archive::restore::{restore_from_archive, ArchiveRestoreOptions, Until};
use twinlog::archive::tiered::{ArchivedFrames, TieredCache, TieredSource};
use twinlog::archive::upload::{upload_segment, Pace, SegmentJob};
use twinlog::daemon::config::{ArchiveSection, Uploader};
use twinlog::daemon::{PrimaryConfig, TwinConfig};
use twinlog::log::{format, Kind, Log, Meta};
use twinlog::node::Durability;
use twinlog::repl::epochs::EpochStart;

const NAME: &str = "archive";
const MIB: u64 = 1 << 20;
const EPOCHS: [EpochStart; 1] = [EpochStart { epoch: 0, first: 1 }];

struct Sizes {
    log_mib: u64,
    tiered_reads: usize,
    round: Duration,
    rounds: u32,
    backlog_mib: u64,
}

fn incompressible(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut out = Vec::with_capacity(len);
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(len);
    out
}

fn spec(g: &Garage, prefix: &str) -> Spec {
    Spec {
        url: format!("s3://{}/{prefix}", garage::BUCKET),
        endpoint: Some(g.endpoint(0)),
        region: garage::REGION.into(),
        access_key_id: Some(garage::KEY_ID.into()),
        secret_access_key: Some(garage::SECRET.into()),
    }
}

fn sealed(log: &Log) -> Vec<(u64, u64, u64)> {
    let l = log.layout();
    l[..l.len() - 1].to_vec()
}

fn main() {
    if let (Ok(role), Ok(config)) = (std::env::var(ROLE_ENV), std::env::var(CONFIG_ENV)) {
        daemon_main(&role, Path::new(&config));
        return;
    }
    let quick = std::env::args().any(|a| a == "--quick");
    let sizes = if quick {
        Sizes {
            log_mib: 256,
            tiered_reads: 40,
            round: Duration::from_millis(800),
            rounds: 2,
            backlog_mib: 192,
        }
    } else {
        Sizes {
            log_mib: 2048,
            tiered_reads: 200,
            round: Duration::from_secs(2),
            rounds: 3,
            backlog_mib: 768,
        }
    };
    let root_parent = Path::new(env!("CARGO_TARGET_TMPDIR"));
    std::fs::create_dir_all(root_parent).expect("the target tmp dir");
    let root = tempfile::Builder::new()
        .prefix("twinlog-bench-archive-")
        .tempdir_in(root_parent)
        .expect("a temp dir");
    let root = root.path().to_path_buf();
    let bin = Garage::binary();
    eprintln!(
        "twinlog archive bench ({}), garage {}",
        if quick { "quick" } else { "full" },
        bin.display()
    );
    let g = Garage::start(&root.join("garage"), 1).expect("garage");
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let bin_s = bin.display().to_string();
    rt.block_on(async {
        let log = build_log(&root, sizes.log_mib);
        let bucket = Bucket::open(&spec(&g, "bench")).expect("bucket");
        let raw = Bucket::open(&spec(&g, "raw")).expect("bucket");
        archive_case(&log, &bucket, &raw, &bin_s).await;
        restore_case(&root, &log, &bucket, &bin_s).await;
        tiered_case(&log, &bucket, sizes.tiered_reads).await;
    });
    drop(rt);
    while_archiving(&root, &g, &sizes);
}

fn build_log(root: &Path, mib: u64) -> Log {
    eprintln!("writing {mib} MiB of 1 MiB frames ...");
    let log = Log::open(root.join("src")).expect("log");
    for i in 0..mib {
        log.append(
            Kind::App(0x8003),
            &Meta::repo("bench"),
            &incompressible(i, MIB as usize),
        )
        .expect("append");
    }
    log.sync().expect("sync");
    log
}

async fn archive_case(log: &Log, bucket: &Bucket, raw: &Bucket, garage_bin: &str) {
    let segs = sealed(log);
    let bytes: u64 = segs.iter().map(|s| s.2).sum();
    eprintln!(
        "archive_mib_s: {} segments, {:.0} MiB ...",
        segs.len(),
        bytes as f64 / MIB as f64
    );
    // The raw puts: the same files, read into memory first, then put.
    let mut raw_secs = 0.0;
    for &(first, _, _) in &segs {
        let data =
            Bytes::from(std::fs::read(format::segment_path(log.dir(), first)).expect("read"));
        let t = Instant::now();
        let mut up = raw.writer(&format!("raw/{first:020}"));
        for chunk in 0..data.len().div_ceil(4 << 20) {
            let end = ((chunk + 1) * (4 << 20)).min(data.len());
            up.write(data.slice(chunk * (4 << 20)..end))
                .await
                .expect("raw put");
        }
        up.finish().await.expect("raw put");
        raw_secs += t.elapsed().as_secs_f64();
    }
    let raw_rate = bytes as f64 / MIB as f64 / raw_secs;
    let codec = Codec {
        zstd_level: Some(3),
        key: None,
    };
    let t = Instant::now();
    let mut stored = 0;
    for &(first, _, _) in &segs {
        let path = format::segment_path(log.dir(), first);
        let job = SegmentJob {
            path: &path,
            first,
            history: log.history().0,
            epochs: &EPOCHS,
            generation: 0,
            marks: vec![],
        };
        stored += upload_segment(bucket, &codec, job, &mut Pace::new(0))
            .await
            .expect("archive")
            .stored_bytes;
    }
    let secs = t.elapsed().as_secs_f64();
    Line::new(
        NAME,
        "archive_mib_s",
        bytes as f64 / MIB as f64 / secs,
        "MiB/s",
    )
    .baseline("object_store_put_mib_s", raw_rate)
    .target(0.9)
    .num("secs", secs)
    .int("stored_mib", stored / MIB)
    .num("put_mib_s", raw_rate)
    .flag("zstd3", true)
    .flag(
        "garage_debug_build",
        !garage_bin.contains("/release") && garage_bin.contains(".cache"),
    )
    .print();
}

async fn restore_case(root: &Path, log: &Log, bucket: &Bucket, _garage_bin: &str) {
    let objects = bucket.segments().await.expect("list");
    let bytes: u64 = sealed(log).iter().map(|s| s.2).sum();
    // The raw download: every object whole, dropped.
    let t = Instant::now();
    for (n, size) in &objects {
        let key = bucket.segment_key(n);
        let mut at = 0;
        while at < *size {
            let end = (at + (16 << 20)).min(*size);
            bucket.get_range(&key, at..end).await.expect("get");
            at = end;
        }
    }
    let raw_secs = t.elapsed().as_secs_f64();
    let raw_rate = bytes as f64 / MIB as f64 / raw_secs;
    let data: PathBuf = root.join("restored");
    let t = Instant::now();
    let report = restore_from_archive(
        ArchiveRestoreOptions {
            data_dir: data.clone(),
            segment_bytes: twinlog::log::DEFAULT_SEGMENT_BYTES,
            bucket: bucket.clone(),
            key: None,
            until: Until::End,
            accept_shorter: false,
        },
        Arc::new(|_| {}),
    )
    .await
    .expect("restore");
    let secs = t.elapsed().as_secs_f64();
    assert_eq!(report.head, sealed(log).last().expect("a sealed segment").1);
    Line::new(
        NAME,
        "restore_from_archive_2gib",
        bytes as f64 / MIB as f64 / secs,
        "MiB/s",
    )
    .baseline("raw_download_mib_s", raw_rate)
    .target(0.8)
    .num("secs", secs)
    .int("mib", bytes / MIB)
    .int("frames", report.frames)
    .print();
    let _ = std::fs::remove_dir_all(&data);
}

/// `reads` archived frames read as a box reads them, each from a new
/// cursor; `cache` shared between them as the daemon shares it, or none
/// (every read lists the bucket and opens the object).
async fn tiered_reads(src: &TieredSource, last: u64, reads: usize) -> Vec<f64> {
    let mut took = Vec::with_capacity(reads);
    for i in 0..reads as u64 {
        let seq = 1 + (i * 7919) % last;
        let t = Instant::now();
        let mut f = ArchivedFrames::at(src.clone(), seq).await.expect("cursor");
        let head = f.next_frame().await.expect("frame");
        let mut n = 0;
        loop {
            let p = f.blob_piece(1 << 20).await.expect("piece");
            if p.is_empty() {
                break;
            }
            n += p.len() as u64;
        }
        assert_eq!(n, head.blob_len);
        took.push(t.elapsed().as_secs_f64() * 1e3);
    }
    took.sort_by(f64::total_cmp);
    took
}

async fn tiered_case(log: &Log, bucket: &Bucket, reads: usize) {
    let last = sealed(log).last().expect("sealed").1;
    let mut src = TieredSource {
        bucket: bucket.clone(),
        key: None,
        history: log.history().0,
        epochs: EPOCHS.to_vec(),
        cache: None,
    };
    let cold = tiered_reads(&src, last, reads).await;
    src.cache = Some(Arc::new(TieredCache::default()));
    let took = tiered_reads(&src, last, reads).await;
    let mut local = Vec::with_capacity(reads);
    for i in 0..reads as u64 {
        let seq = 1 + (i * 7919) % last;
        let t = Instant::now();
        log.read(seq).expect("local read");
        local.push(t.elapsed().as_secs_f64() * 1e3);
    }
    local.sort_by(f64::total_cmp);
    Line::new(NAME, "tiered_read_p99_ms", quantile(&took, 0.99), "ms")
        .baseline("local_read_p99_ms", quantile(&local, 0.99))
        .lower_is_better()
        .num("p50_ms", quantile(&took, 0.5))
        .num("uncached_p99_ms", quantile(&cold, 0.99))
        .num("uncached_p50_ms", quantile(&cold, 0.5))
        .int("reads", reads as u64)
        .int("frame_bytes", MIB)
        .print();
}

/// Small segments on both boxes; on the second pair the twin archives.
fn pair_config(pcfg: &Path, tcfg: &Path, archive: Option<ArchiveSection>) {
    let mut p = PrimaryConfig::load(pcfg).expect("load");
    p.segment_bytes = 4 << 20;
    std::fs::write(pcfg, p.render()).expect("write");
    let mut t = TwinConfig::load(tcfg).expect("load");
    t.segment_bytes = 4 << 20;
    t.archive = archive;
    std::fs::write(tcfg, t.render()).expect("write");
}

fn while_archiving(root: &Path, g: &Garage, sizes: &Sizes) {
    use std::os::unix::fs::PermissionsExt;
    let creds = root.join("s3.toml");
    std::fs::write(
        &creds,
        format!(
            "access_key_id = \"{}\"\nsecret_access_key = \"{}\"\n",
            garage::KEY_ID,
            garage::SECRET
        ),
    )
    .expect("creds");
    std::fs::set_permissions(&creds, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    let section = ArchiveSection {
        url: format!("s3://{}/pair", garage::BUCKET),
        endpoint: Some(g.endpoint(0)),
        region: garage::REGION.into(),
        credentials_file: Some(creds),
        uploader: Uploader::Twin,
        zstd_level: 3,
        key_file: None,
        max_mib_per_s: twinlog::daemon::config::default_max_mib_per_s(),
        snapshot_every_mib: 1024,
    };
    let mut plain = Pair::init_with(&root.join("plain"), |p, t| pair_config(p, t, None));
    let mut archiving = Pair::init_with(&root.join("archiving"), |p, t| {
        pair_config(p, t, Some(section.clone()))
    });
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        let plain_clients = plain.clients().await;
        let arch_clients = archiving.clients().await;
        plain
            .converged(&plain_clients[0], Duration::from_secs(30))
            .await;
        archiving
            .converged(&arch_clients[0], Duration::from_secs(30))
            .await;
        // The backlog the twin archives meanwhile: incompressible 1 MiB
        // frames, sealed into 4 MiB segments as they arrive.
        eprintln!(
            "backlog of {} MiB on the archiving pair ...",
            sizes.backlog_mib
        );
        for i in 0..sizes.backlog_mib {
            arch_clients[0]
                .append(
                    KIND,
                    &[],
                    &incompressible(i, MIB as usize),
                    Durability::Twin,
                )
                .await
                .expect("backlog");
        }
        let before = archiving
            .twin_status()
            .and_then(|s| s.archive)
            .map_or(0, |a| a.uploaded_bytes);
        let (mut plain_n, mut plain_s, mut arch_n, mut arch_s) = (0, 0.0, 0, 0.0);
        for _ in 0..sizes.rounds {
            let (n, s) = append_round(&plain_clients, 8, Durability::Twin, sizes.round).await;
            plain_n += n;
            plain_s += s;
            let (n, s) = append_round(&arch_clients, 8, Durability::Twin, sizes.round).await;
            arch_n += n;
            arch_s += s;
        }
        let st = archiving
            .twin_status()
            .and_then(|s| s.archive)
            .unwrap_or_default();
        let plain_rate = plain_n as f64 / plain_s;
        Line::new(NAME, "twin_128b_c8", plain_rate, "appends/s").print();
        Line::new(
            NAME,
            "twin_128b_c8_while_archiving",
            arch_n as f64 / arch_s,
            "appends/s",
        )
        .baseline("twin_128b_c8", plain_rate)
        .target(0.9)
        .num(
            "archived_mib_during",
            st.uploaded_bytes.saturating_sub(before) as f64 / MIB as f64,
        )
        .int("archive_lag_segments", st.lag_segments)
        .int(
            "pace_mib_s",
            twinlog::daemon::config::default_max_mib_per_s(),
        )
        .print();
    });
    drop(rt);
    plain.stop();
    archiving.stop();
}
