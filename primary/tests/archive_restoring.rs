//! A box a restore has not finished is not served, and a resumed restore
//! believes nothing it holds, with Garage as the bucket and the `primary`
//! binary as an operator runs it: a restore refused halfway by a damaged
//! object leaves a box `serve` refuses (exit 3, naming the restore to
//! finish and `--abandon`); a frame written on that box meanwhile (what a
//! box that served would have acknowledged) is found, cut and fetched
//! again when the restore resumes, and the box ends with exactly the
//! archive's frames.

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

mod support;
use support::archive::{archived_log, garage_bucket, get, init, key_file, put, with_archive, KIND};
use support::{command, exits, primary, stderr, stdout};
use testkit::garage::Garage;
use twinlog::archive::bucket::{Bucket, Spec};
use twinlog::log::{Log, Meta};

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
    let (url, bucket) = garage_bucket(&g, "pair");
    let (key_path, key) = key_file(tmp.path());
    let (objects, src) = archived_log(&tmp.path().join("src"), &bucket, Some(&key), "a", 400);
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
    let (objects, src) = archived_log(&tmp.path().join("src"), &bucket, Some(&key), "a", 200);
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
