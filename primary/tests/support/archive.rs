//! Archives for the CLI's tests: logs archived into a bucket (Garage's
//! test bucket or a directory), a fresh box with `[archive]`, objects read
//! and replaced by hand.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use super::{exits, primary};
use testkit::garage::{self, Garage};
use twinlog::archive::bucket::{Bucket, Spec};
use twinlog::archive::codec::{ArchiveKey, Codec};
use twinlog::archive::upload::{upload_segment, Pace, SegmentJob};
use twinlog::daemon::config::{ArchiveSection, Uploader};
use twinlog::daemon::PrimaryConfig;
use twinlog::log::{format, Kind, Log, Meta};
use twinlog::repl::epochs::EpochStart;

pub const KIND: Kind = Kind::App(0x8001);

/// Frame `n` of the log `tag`.
pub fn blob(tag: &str, n: u64) -> Vec<u8> {
    let mut b = format!("{tag}-frame-{n}-").into_bytes();
    b.resize(2000, (n % 251) as u8);
    b
}

pub fn init(dir: &Path) -> std::path::PathBuf {
    let o = primary(&[
        "init",
        "--data",
        dir.to_str().expect("utf-8"),
        "--listen",
        &testkit::free_udp().to_string(),
        "--metrics",
        &testkit::free_tcp().to_string(),
    ]);
    exits(&o, 0, "init");
    dir.join("primary.toml")
}

/// `[archive]` of `cfg` on `url`: on Garage (`g`) or a directory.
pub fn with_archive(cfg: &Path, url: &str, g: Option<&Garage>, key_file: &Path) {
    let mut c = PrimaryConfig::load(cfg).expect("load");
    let creds = g.map(|_| {
        let f = cfg.with_file_name("s3.toml");
        std::fs::write(
            &f,
            format!(
                "access_key_id = \"{}\"\nsecret_access_key = \"{}\"\n",
                garage::KEY_ID,
                garage::SECRET
            ),
        )
        .expect("credentials");
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600)).expect("chmod");
        f
    });
    c.archive = Some(ArchiveSection {
        url: url.into(),
        endpoint: g.map(|g| g.endpoint(0)),
        region: garage::REGION.into(),
        credentials_file: creds,
        uploader: Uploader::Twin,
        zstd_level: 1,
        key_file: Some(key_file.to_owned()),
        max_mib_per_s: 0,
        snapshot_every_mib: 0,
    });
    std::fs::write(cfg, c.render()).expect("write");
}

/// A log of `frames` frames (`blob(tag, n)`) in 64 KiB segments at `dir`,
/// every sealed one archived (sealed under `key`, when given): the
/// objects' keys and first frames, oldest first, and the log.
pub fn archived_log(
    dir: &Path,
    bucket: &Bucket,
    key: Option<&ArchiveKey>,
    tag: &str,
    frames: u64,
) -> (Vec<(String, u64)>, Log) {
    let src = Log::open_with(dir, 64 << 10).expect("log");
    for n in 1..=frames {
        src.append(KIND, &Meta::repo("r"), &blob(tag, n))
            .expect("append");
    }
    src.sync().expect("sync");
    let codec = Codec {
        zstd_level: Some(1),
        key: key.cloned(),
    };
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let layout = src.layout();
    let mut names = Vec::new();
    rt.block_on(async {
        for &(first, _, _) in &layout[..layout.len() - 1] {
            let path = format::segment_path(src.dir(), first);
            let job = SegmentJob {
                path: &path,
                first,
                history: src.history().0,
                epochs: &[EpochStart { epoch: 0, first: 1 }],
                generation: 0,
                marks: vec![],
            };
            let sent = upload_segment(bucket, &codec, job, &mut Pace::new(0))
                .await
                .expect("upload");
            names.push((bucket.segment_key(&sent.name), sent.name.first));
        }
    });
    (names, src)
}

/// The URL of `prefix` in Garage's test bucket, and the bucket.
pub fn garage_bucket(g: &Garage, prefix: &str) -> (String, Bucket) {
    let url = format!("s3://{}/{prefix}", garage::BUCKET);
    let bucket = Bucket::open(&Spec {
        url: url.clone(),
        endpoint: Some(g.endpoint(0)),
        region: garage::REGION.into(),
        access_key_id: Some(garage::KEY_ID.into()),
        secret_access_key: Some(garage::SECRET.into()),
    })
    .expect("bucket");
    (url, bucket)
}

/// The whole object at `key`.
pub fn get(bucket: &Bucket, key: &str) -> Vec<u8> {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        bucket
            .get_small(key, u64::MAX)
            .await
            .expect("GET")
            .expect("the object")
            .to_vec()
    })
}

pub fn put(bucket: &Bucket, key: &str, bytes: Vec<u8>) {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        let mut up = bucket.writer(key);
        up.write(bytes.into()).await.expect("write");
        up.finish().await.expect("put");
    });
}

pub fn key_file(dir: &Path) -> (std::path::PathBuf, ArchiveKey) {
    let f = dir.join("archive.key");
    exits(
        &primary(&["archive-key", "--out", f.to_str().expect("utf-8")]),
        0,
        "archive-key",
    );
    let k = ArchiveKey::load(&f).expect("the key");
    (f, k)
}

/// The `archive` of the daemon's `/status`, as JSON.
pub fn archive_of(p: &super::Primary) -> serde_json::Value {
    twinlog::daemon::fetch_status::<serde_json::Value>(p.metrics)
        .map(|(_, s)| s["archive"].clone())
        .unwrap_or_default()
}

/// Wait until everything sealed is archived past frame `past`, and the
/// head record (when this build writes one) says so: the last archived
/// frame.
pub fn archived(p: &super::Primary, past: u64) -> u64 {
    testkit::until_blocking(
        "everything sealed archived",
        std::time::Duration::from_secs(60),
        || {
            let a = archive_of(p);
            let last = a["floor"].as_u64()?.checked_sub(1)?;
            let done = a["lag_segments"] == 0
                && last > past
                && a.get("head_last").is_none_or(|h| h.as_u64() == Some(last));
            done.then_some(last)
        },
    )
}
