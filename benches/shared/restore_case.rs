//! The restore of a fresh box from a twin's log, shared by
//! `benches/restore.rs` and `benches/peers.rs`.

use super::common::*;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use tokio::sync::watch;
use twinlog::log::Log;
use twinlog::net::{self, Fingerprint, Identity, Pins, Role};
use twinlog::node::epoch::Epochs;
use twinlog::node::restore::{self, RestoreOptions};
use twinlog::node::restore_serve::{self, RestoreSource};
use twinlog::node::snapshot_transfer::SnapshotSource;
use twinlog::node::store_host::StoreHost;
use twinlog::store::install;
use twinlog::store::StoreOptions;

/// A follower log of small frames and large entries, as a twin holds it.
/// Answers its blob bytes.
pub(crate) fn fill_log(dir: &Path, big_entries: u64, big_mib: u64, small_frames: u64) -> u64 {
    let log = Log::open(dir).expect("log");
    log.set_follower(true);
    let piece = pattern(MIB as usize);
    let small = pattern(4096);
    let mut seq = 1;
    let mut bytes = 0;
    let per_gap = small_frames / (big_entries + 1);
    for e in 0..=big_entries {
        for _ in 0..per_gap {
            log.append_at(seq, 0x8000, b"small", &small)
                .expect("append");
            seq += 1;
            bytes += small.len() as u64;
        }
        if e < big_entries {
            let mut p = log
                .begin(Some(seq), 0x8001, b"big", big_mib * MIB)
                .expect("begin");
            for _ in 0..big_mib {
                p.write(&piece).expect("write");
            }
            p.commit().expect("commit");
            seq += 1;
            bytes += big_mib * MIB;
        }
    }
    bytes
}

pub(crate) struct Served {
    pub(crate) addr: SocketAddr,
    pub(crate) fingerprint: Fingerprint,
    _stop: watch::Sender<bool>,
}

/// Serve restores from the twin data directory `dir` to `restorer`.
pub(crate) fn serve(dir: &Path, restorer: Fingerprint) -> Served {
    let log = Arc::new(Log::open(dir.join("log")).expect("twin log"));
    let host =
        StoreHost::open(log.clone(), &dir.join("store"), StoreOptions::default()).expect("store");
    let id = Identity::mint().expect("mint");
    let pins = Arc::new(Pins::new().pin(restorer, Role::Restore));
    let endpoint = net::server(([127, 0, 0, 1], 0).into(), &id, pins.clone()).expect("server");
    let addr = endpoint.local_addr().expect("addr");
    let source = Arc::new(RestoreSource {
        log,
        snapshots: SnapshotSource::new(host, &dir.join("snapshots"), None),
        epochs: Arc::new(Epochs::in_memory(0)),
        base: dir.join(install::BASE_FILE),
    });
    let (stop, stopped) = watch::channel(false);
    tokio::spawn(restore_serve::serve(source, endpoint, pins, stopped));
    Served {
        addr,
        fingerprint: id.fingerprint(),
        _stop: stop,
    }
}

/// `restore_2gib`: a twin's log of `big_entries` entries of `big_mib` MiB
/// among `small_frames` small frames, restored onto a fresh box from frame
/// 1 over QUIC; MiB/s of log, against the raw sequential write `raw`.
pub(crate) async fn restore_2gib(
    root: &Path,
    big_entries: u64,
    big_mib: u64,
    small_frames: u64,
    raw: f64,
) -> Line {
    let twin = root.join("twin-2g");
    let t = Instant::now();
    let bytes = fill_log(&twin.join("log"), big_entries, big_mib, small_frames);
    eprintln!(
        "twin log of {:.0} MiB built in {:.1} s",
        bytes as f64 / MIB as f64,
        t.elapsed().as_secs_f64()
    );
    let id = Arc::new(Identity::mint().expect("mint"));
    let served = serve(&twin, id.fingerprint());
    let data = root.join("box-2g");
    std::fs::create_dir_all(&data).expect("mkdir");
    // As before the raw baseline and every other timed bulk write: on a VM
    // whose host reclaims idle guest memory, the first GiB written into
    // cold pages costs host page faults (750 MiB/s against 5,400 warm here).
    warm_page_cache(root, bytes);
    syncfs(root);
    let t = Instant::now();
    let report = restore::restore(
        RestoreOptions {
            data_dir: data.clone(),
            segment_bytes: twinlog::log::DEFAULT_SEGMENT_BYTES,
            source: served.addr,
            source_fingerprint: served.fingerprint,
            identity: id,
        },
        Arc::new(|_| {}),
    )
    .await
    .expect("restore");
    let secs = t.elapsed().as_secs_f64();
    drop(served);
    let _ = std::fs::remove_dir_all(&data);
    let _ = std::fs::remove_dir_all(&twin);
    Line::new("restore", "restore_2gib", mib_per_s(bytes, secs), "MiB/s")
        .baseline("raw_seq_write_1mib", raw)
        .target(0.7)
        .num("mib", bytes as f64 / MIB as f64)
        .int("frames", report.frames)
        .num("secs", secs)
}
