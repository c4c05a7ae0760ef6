//! A box a restore has not finished is not served, and a resumed restore
//! believes nothing it holds, with Garage as the bucket and the `primary`
//! binary as an operator runs it: a restore refused halfway by a damaged
//! object leaves a box `serve` refuses (exit 3, naming the restore to
//! finish and `--abandon`); a frame written on that box meanwhile (what a
//! box that served would have acknowledged) is found, cut and fetched
//! again when the restore resumes, and the box ends with exactly the
//! archive's frames.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

mod support;
use support::{command, exits, primary, stderr, stdout};
use testkit::garage::{self, Garage};
use twinlog::archive::bucket::{Bucket, Spec};
use twinlog::archive::codec::{ArchiveKey, Codec};
use twinlog::archive::upload::{upload_segment, Pace, SegmentJob};
use twinlog::daemon::config::{ArchiveSection, Uploader};
use twinlog::daemon::PrimaryConfig;
use twinlog::log::{format, Kind, Log, Meta};
use twinlog::repl::epochs::EpochStart;

const KIND: Kind = Kind::App(0x8001);

fn blob(n: u64) -> Vec<u8> {
    let mut b = format!("frame-{n}-").into_bytes();
    b.resize(2000, (n % 251) as u8);
    b
}

fn init(dir: &Path) -> std::path::PathBuf {
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
fn with_archive(cfg: &Path, url: &str, g: Option<&Garage>, key_file: &Path) {
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

/// A log of `frames` frames in 64 KiB segments, every sealed one archived
/// under `key`: the archive's names and sizes, oldest first, and the log.
fn archived_log(
    dir: &Path,
    bucket: &Bucket,
    key: &ArchiveKey,
    frames: u64,
) -> (Vec<(String, u64)>, Log) {
    let src = Log::open_with(dir.join("src"), 64 << 10).expect("log");
    for n in 1..=frames {
        src.append(KIND, &Meta::repo("r"), &blob(n))
            .expect("append");
    }
    src.sync().expect("sync");
    let codec = Codec {
        zstd_level: Some(1),
        key: Some(key.clone()),
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

fn get(bucket: &Bucket, key: &str) -> Vec<u8> {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        let size = bucket
            .segments()
            .await
            .expect("list")
            .into_iter()
            .find(|(n, _)| bucket.segment_key(n) == key)
            .expect("the object")
            .1;
        bucket.get_range(key, 0..size).await.expect("get").to_vec()
    })
}

fn put(bucket: &Bucket, key: &str, bytes: Vec<u8>) {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        let mut up = bucket.writer(key);
        up.write(bytes.into()).await.expect("write");
        up.finish().await.expect("put");
    });
}

fn key_file(dir: &Path) -> (std::path::PathBuf, ArchiveKey) {
    let f = dir.join("archive.key");
    exits(
        &primary(&["archive-key", "--out", f.to_str().expect("utf-8")]),
        0,
        "archive-key",
    );
    let k = ArchiveKey::load(&f).expect("the key");
    (f, k)
}

/// `primary serve` on `cfg` must exit on its own with `code`; a serve that
/// answers `status` instead fails the test at once.
fn serve_exits(cfg: &Path, code: i32) -> String {
    let log = cfg.with_file_name("serve.log");
    let mut child = command()
        .args(["serve", "--config", cfg.to_str().expect("utf-8")])
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).expect("log"))
        .spawn()
        .expect("spawn serve");
    let deadline = Instant::now() + Duration::from_secs(30);
    let text = || std::fs::read_to_string(&log).unwrap_or_default();
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            assert_eq!(status.code(), Some(code), "serve: {}", text());
            return text();
        }
        let asked = primary(&["status", "--config", cfg.to_str().expect("utf-8")]);
        if asked.status.success() {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "serve serves a box a restore is filling: {}",
                stdout(&asked)
            );
        }
        assert!(Instant::now() < deadline, "serve neither exited nor served");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_half_restored_box_is_not_served_and_a_resumed_restore_cuts_what_is_not_the_archives() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let g = Garage::start(&tmp.path().join("garage"), 1).expect("garage");
    let url = format!("s3://{}/pair", garage::BUCKET);
    let bucket = Bucket::open(&Spec {
        url: url.clone(),
        endpoint: Some(g.endpoint(0)),
        region: garage::REGION.into(),
        access_key_id: Some(garage::KEY_ID.into()),
        secret_access_key: Some(garage::SECRET.into()),
    })
    .expect("bucket");
    let (key_path, key) = key_file(tmp.path());
    let (objects, src) = archived_log(tmp.path(), &bucket, &key, 400);
    assert!(objects.len() >= 8, "{objects:?}");
    let archived_to = src.layout()[objects.len() - 1].1;

    // One object in the middle damaged: a byte of its first piece.
    let (damaged, damaged_first) = objects[4].clone();
    let good = get(&bucket, &damaged);
    let mut bad = good.clone();
    bad[100] ^= 0x20;
    put(&bucket, &damaged, bad);

    let data = tmp.path().join("fresh");
    let cfg = init(&data);
    with_archive(&cfg, &url, Some(&g), &key_path);
    let c = cfg.to_str().expect("utf-8");
    let refused = primary(&["restore", "--config", c, "--from-archive", &url]);
    exits(&refused, 1, "a restore through a damaged object");
    assert!(
        stderr(&refused).contains(&damaged),
        "the refusal names the object: {}",
        stderr(&refused)
    );
    let held = damaged_first - 1;
    {
        let log = Log::open(data.join("log")).expect("the restored log");
        assert_eq!(log.head_seq(), held, "frames before the damaged object");
    }
    assert!(data.join("RESTORING").exists());

    // Not served: the refusal names the restore to finish and the flag
    // that discards it.
    let said = serve_exits(&cfg, 3);
    for part in [
        "unfinished restore",
        &format!("--from-archive {url}"),
        "--abandon",
    ] {
        assert!(said.contains(part), "{part:?} in {said}");
    }

    // What a box that served would hold: a frame of its own past the
    // restored ones.
    {
        let log = Log::open(data.join("log")).expect("log");
        let seq = log
            .append(KIND, &Meta::repo("r"), b"acknowledged here, not archived")
            .expect("append");
        assert_eq!(seq, held + 1);
        log.sync().expect("sync");
    }

    // The archive repaired, the restore resumed: the frame is found, cut
    // and fetched again; the box ends with the archive's frames only.
    put(&bucket, &damaged, good);
    let out = primary(&["restore", "--config", c, "--from-archive", &url, "--json"]);
    exits(&out, 0, "the restore resumed");
    let report: serde_json::Value =
        serde_json::from_str(stdout(&out).trim()).expect("one JSON line");
    assert_eq!(report["resumed"], true, "{report}");
    assert_eq!(report["verified"], held, "{report}");
    assert_eq!(report["cut_from"], held + 1, "{report}");
    assert_eq!(report["head"], archived_to, "{report}");
    assert!(!data.join("RESTORING").exists());
    let log = Log::open(data.join("log")).expect("the restored log");
    assert_eq!((log.first_seq(), log.head_seq()), (1, archived_to));
    for n in 1..=archived_to {
        let (got, want) = (log.read(n).expect("read"), src.read(n).expect("the source"));
        assert!(got == want, "frame {n} is not the archive's");
    }
}

#[test]
fn abandon_leaves_a_fresh_box_that_restores_from_the_start() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let url = format!("file://{}", tmp.path().join("bucket").display());
    let bucket = Bucket::open(&Spec {
        url: url.clone(),
        ..Spec::default()
    })
    .expect("bucket");
    let (key_path, key) = key_file(tmp.path());
    let (objects, src) = archived_log(tmp.path(), &bucket, &key, 200);
    let archived_to = src.layout()[objects.len() - 1].1;
    let (damaged, _) = objects[2].clone();
    let good = get(&bucket, &damaged);
    let mut bad = good.clone();
    bad[10] ^= 1;
    put(&bucket, &damaged, bad);

    let data = tmp.path().join("fresh");
    let cfg = init(&data);
    with_archive(&cfg, &url, None, &key_path);
    let c = cfg.to_str().expect("utf-8");
    let none = primary(&["restore", "--config", c, "--abandon"]);
    exits(&none, 1, "nothing to abandon");
    assert!(
        stderr(&none).contains("nothing to abandon"),
        "{}",
        stderr(&none)
    );
    let both = primary(&[
        "restore",
        "--config",
        c,
        "--abandon",
        "--from-archive",
        &url,
    ]);
    exits(&both, 2, "--abandon with a source");

    exits(
        &primary(&["restore", "--config", c, "--from-archive", &url]),
        1,
        "a restore through a damaged object",
    );
    let out = primary(&["restore", "--config", c, "--abandon"]);
    exits(&out, 0, "abandon");
    assert!(
        stdout(&out).contains("the box is fresh"),
        "{}",
        stdout(&out)
    );
    for gone in ["RESTORING", "log", "store", "EPOCHS"] {
        assert!(!data.join(gone).exists(), "{gone}");
    }

    put(&bucket, &damaged, good);
    let out = primary(&["restore", "--config", c, "--from-archive", &url, "--json"]);
    exits(&out, 0, "a restore after the abandon");
    let report: serde_json::Value =
        serde_json::from_str(stdout(&out).trim()).expect("one JSON line");
    assert_eq!(
        (report["resumed"].as_bool(), report["head"].as_u64()),
        (Some(false), Some(archived_to)),
        "{report}"
    );
}
