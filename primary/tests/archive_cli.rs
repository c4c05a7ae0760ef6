//! `primary archive-key` and `primary restore --from-archive` as an
//! operator runs them: a key minted once and never overwritten, a fresh
//! box filled from an encrypted archive to a frame, and each refusal's
//! exit code.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

mod support;
use support::{exits, primary, stderr, stdout};
use twinlog::archive::bucket::{Bucket, Spec};
use twinlog::archive::codec::{ArchiveKey, Codec};
use twinlog::archive::upload::{upload_segment, Pace, SegmentJob};
use twinlog::daemon::config::{ArchiveSection, Uploader};
use twinlog::daemon::PrimaryConfig;
use twinlog::log::{format, Kind, Log, Meta};
use twinlog::repl::epochs::EpochStart;

fn init(dir: &Path) -> std::path::PathBuf {
    let data = dir.to_str().expect("utf-8");
    exits(
        &primary(&[
            "init",
            "--data",
            data,
            "--listen",
            "127.0.0.1:0",
            "--metrics",
            "127.0.0.1:0",
        ]),
        0,
        "init",
    );
    dir.join("primary.toml")
}

fn with_archive(cfg: &Path, url: &str, key_file: &Path) {
    let mut c = PrimaryConfig::load(cfg).expect("load");
    c.archive = Some(ArchiveSection {
        url: url.into(),
        endpoint: None,
        region: "us-east-1".into(),
        credentials_file: None,
        uploader: Uploader::Twin,
        zstd_level: 3,
        key_file: Some(key_file.to_owned()),
        max_mib_per_s: 0,
        snapshot_every_mib: 1024,
    });
    std::fs::write(cfg, c.render()).expect("write");
}

#[test]
fn a_fresh_box_restores_from_an_encrypted_archive_to_a_frame() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let key_file = tmp.path().join("archive.key");
    let k = key_file.to_str().expect("utf-8");
    exits(&primary(&["archive-key", "--out", k]), 0, "archive-key");
    let mode = std::fs::metadata(&key_file)
        .expect("key")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
    let again = primary(&["archive-key", "--out", k]);
    exits(&again, 2, "a second key over the first");
    let key = ArchiveKey::load(&key_file).expect("the minted key loads");

    // A log of 200 frames in small segments, archived.
    let src = Log::open_with(tmp.path().join("src"), 64 << 10).expect("log");
    for i in 1..=200u64 {
        src.append(Kind::App(0x8001), &Meta::repo("r"), &vec![i as u8; 1000])
            .expect("append");
    }
    src.sync().expect("sync");
    let bucket_dir = tmp.path().join("bucket");
    let url = format!("file://{}", bucket_dir.display());
    let bucket = Bucket::open(&Spec {
        url: url.clone(),
        ..Spec::default()
    })
    .expect("bucket");
    let codec = Codec {
        zstd_level: Some(3),
        key: Some(key),
    };
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let layout = src.layout();
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
            upload_segment(&bucket, &codec, job, &mut Pace::new(0))
                .await
                .expect("upload");
        }
    });

    let cfg = init(&tmp.path().join("fresh"));
    with_archive(&cfg, &url, &key_file);
    let c = cfg.to_str().expect("utf-8");
    let out = primary(&[
        "restore",
        "--config",
        c,
        "--from-archive",
        &url,
        "--until",
        "77",
        "--json",
    ]);
    exits(&out, 0, "restore --from-archive");
    let report: serde_json::Value =
        serde_json::from_str(stdout(&out).trim()).expect("one JSON line");
    assert_eq!(report["head"], 77, "{report}");
    let log = Log::open(tmp.path().join("fresh").join("log")).expect("the restored log");
    assert_eq!(log.head_seq(), 77);
    assert_eq!(log.read(77).expect("read").blob, vec![77u8; 1000]);
    drop(log);

    // The same box again: it holds history now.
    let busy = primary(&[
        "restore",
        "--config",
        c,
        "--from-archive",
        &url,
        "--until",
        "100",
    ]);
    exits(&busy, 3, "a box with history");
    let bad_time = primary(&[
        "restore",
        "--config",
        c,
        "--from-archive",
        &url,
        "--until-time",
        "yesterday",
    ]);
    exits(&bad_time, 2, "a time that is no time");
    assert!(
        stderr(&bad_time).contains("--until-time"),
        "{}",
        stderr(&bad_time)
    );
    let both = primary(&[
        "restore",
        "--config",
        c,
        "--from-archive",
        &url,
        "--twin",
        "127.0.0.1:1",
    ]);
    exits(&both, 2, "a twin and the archive at once");
    let zero = primary(&[
        "restore",
        "--config",
        c,
        "--from-archive",
        &url,
        "--until",
        "0",
    ]);
    exits(&zero, 2, "--until 0");
    assert!(
        stderr(&zero).contains("sequences start at 1"),
        "{}",
        stderr(&zero)
    );
    // A time before every mark: refused, the time echoed as written.
    let early = "2001-02-03T04:05:06.700Z";
    let before = primary(&[
        "restore",
        "--config",
        c,
        "--from-archive",
        &url,
        "--until-time",
        early,
    ]);
    exits(&before, 1, "--until-time before the archive");
    assert!(
        stderr(&before).contains(&format!("--until-time {early}: no archived frame")),
        "{}",
        stderr(&before)
    );
}

#[test]
fn archive_push_archives_a_stopped_box_once_and_is_refused_while_it_serves() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let key_file = tmp.path().join("archive.key");
    exits(
        &primary(&["archive-key", "--out", key_file.to_str().expect("utf-8")]),
        0,
        "archive-key",
    );
    let data = tmp.path().join("box");
    let cfg = init(&data);
    let url = format!("file://{}", tmp.path().join("bucket").display());
    with_archive(&cfg, &url, &key_file);
    let c = cfg.to_str().expect("utf-8");
    let log = Log::open_with(data.join("log"), 64 << 10).expect("log");
    for i in 1..=300u64 {
        log.append(Kind::App(0x8001), &Meta::repo("r"), &vec![i as u8; 1000])
            .expect("append");
    }
    log.sync().expect("sync");
    let sealed = log.layout().len() as u64 - 1;
    assert!(sealed >= 3);
    let open_first = log.layout().last().expect("a segment").0;

    // The log is held, as a serving daemon holds it.
    let held = primary(&["archive-push", "--config", c]);
    assert_ne!(held.status.code(), Some(0), "a push beside a serving box");
    assert!(stderr(&held).contains("lock"), "{}", stderr(&held));
    drop(log);

    let out = primary(&["archive-push", "--config", c, "--json"]);
    exits(&out, 0, "archive-push");
    let report: serde_json::Value =
        serde_json::from_str(stdout(&out).trim()).expect("one JSON line");
    assert_eq!(report["uploaded"], sealed, "{report}");
    assert_eq!(report["floor"], open_first, "{report}");
    assert!(
        stderr(&out).contains("archive-push: segment"),
        "progress off a terminal: {}",
        stderr(&out)
    );
    let again = primary(&["archive-push", "--config", c, "--json"]);
    exits(&again, 0, "archive-push again");
    let report: serde_json::Value =
        serde_json::from_str(stdout(&again).trim()).expect("one JSON line");
    assert_eq!(
        (report["uploaded"].as_u64(), report["already"].as_u64()),
        (Some(0), Some(sealed))
    );

    // What it pushed restores.
    let fresh = init(&tmp.path().join("fresh"));
    with_archive(&fresh, &url, &key_file);
    let f = fresh.to_str().expect("utf-8");
    let out = primary(&["restore", "--config", f, "--from-archive", &url, "--json"]);
    exits(&out, 0, "restore --from-archive");
    let restored = Log::open(tmp.path().join("fresh").join("log")).expect("the restored log");
    assert_eq!(restored.head_seq(), open_first - 1);
    assert_eq!(restored.read(5).expect("read").blob, vec![5u8; 1000]);
}
