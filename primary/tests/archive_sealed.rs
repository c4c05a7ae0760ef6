//! An encrypted archive believes only what opens under its key, with
//! Garage as the bucket and `primary restore --from-archive` as an
//! operator runs it. Anyone who can write to the bucket, without the key,
//! tries to substitute the log: another log's unencrypted objects copied
//! into the prefix (reaching further than the real archive), and a sealed
//! object copied under another name. Neither opens: each is passed over
//! by name and the restore gives exactly the archive. An object of ours
//! holding another's bytes, with nothing to stand in for it, is refused
//! where the restore reaches it; made whole again, the restore resumes
//! and gives exactly the archive's frames.

mod support;
use support::archive::{archived_log, blob, garage_bucket, get, init, key_file, put, with_archive};
use support::{exits, primary, stderr, stdout};
use testkit::garage::Garage;
use twinlog::archive::names::SegmentName;
use twinlog::log::Log;

#[test]
fn objects_that_do_not_open_under_the_key_are_refused_by_name() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let g = Garage::start(&tmp.path().join("garage"), 1).expect("garage");
    let (url, bucket) = garage_bucket(&g, "pair");
    let (key_path, key) = key_file(tmp.path());
    let (ours, src) = archived_log(&tmp.path().join("a"), &bucket, Some(&key), "a", 300);
    let archived_to = src.layout()[ours.len() - 1].1;

    // Another log, unencrypted and longer, written into the prefix by
    // someone without the key.
    let (foreign, _) = archived_log(&tmp.path().join("b"), &bucket, None, "b", 500);
    assert!(foreign.len() > ours.len());
    let data = tmp.path().join("fresh");
    let cfg = init(&data);
    with_archive(&cfg, &url, Some(&g), &key_path);
    let c = cfg.to_str().expect("utf-8");
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    // A sealed object of ours copied under a newer generation's name: its
    // bytes are whole, but its pieces are bound to its own name.
    let (victim, _) = &ours[2];
    let name = SegmentName::parse(victim).expect("a segment's name");
    let moved = bucket.segment_key(&SegmentName {
        generation: 7,
        ..name
    });
    put(&bucket, &moved, get(&bucket, victim));
    // Neither stands in for the archive: each is passed over by name for
    // the objects that open, and the restore gives exactly the archive.
    let first = tmp.path().join("first");
    let cfg1 = init(&first);
    with_archive(&cfg1, &url, Some(&g), &key_path);
    let c1 = cfg1.to_str().expect("utf-8");
    let out = primary(&["restore", "--config", c1, "--from-archive", &url, "--json"]);
    exits(&out, 0, "a restore beside unencrypted and renamed objects");
    let report: serde_json::Value =
        serde_json::from_str(stdout(&out).trim()).expect("one JSON line");
    assert_eq!(report["head"], archived_to, "{report}");
    let passed: Vec<String> = report["passed_over"]
        .as_array()
        .expect("passed_over")
        .iter()
        .map(|v| v.as_str().unwrap_or_default().to_owned())
        .collect();
    assert!(
        passed
            .iter()
            .any(|p| p.contains(&moved) && p.contains("renamed")),
        "the renamed object is named: {passed:?}"
    );
    assert!(
        passed
            .iter()
            .any(|p| foreign.iter().any(|(k, _)| p.contains(k.as_str()))
                && p.contains("not encrypted")),
        "an unencrypted object is named with what it is: {passed:?}"
    );
    let log = Log::open(first.join("log")).expect("the restored log");
    for n in 1..=archived_to {
        assert!(log.read(n).expect("read").blob == blob("a", n), "frame {n}");
    }
    drop(log);
    rt.block_on(async {
        for (k, _) in &foreign {
            bucket.delete(k).await.expect("delete");
        }
        bucket.delete(&moved).await.expect("delete");
    });

    // Our own object's name holding another of our sealed objects' bytes,
    // with nothing else to stand in: refused where the restore reaches
    // it, before any of its frames.
    let (other, _) = &ours[3];
    let original = get(&bucket, victim);
    put(&bucket, victim, get(&bucket, other));
    let refused = primary(&["restore", "--config", c, "--from-archive", &url]);
    exits(
        &refused,
        1,
        "a restore through an object holding another's bytes",
    );
    let said = stderr(&refused);
    assert!(
        said.contains(victim.as_str()) && said.contains("does not open"),
        "the refusal names the object: {said}"
    );
    assert!(data.join("RESTORING").exists());
    put(&bucket, victim, original);

    // What is left is the archive: the restore resumes, every frame it
    // held the archive's, and ends with exactly the archive's frames.
    let out = primary(&["restore", "--config", c, "--from-archive", &url, "--json"]);
    exits(&out, 0, "the restore");
    let report: serde_json::Value =
        serde_json::from_str(stdout(&out).trim()).expect("one JSON line");
    assert_eq!(report["head"], archived_to, "{report}");
    assert_eq!(report["resumed"], true, "{report}");
    assert_eq!(report["verified"], name.first - 1, "{report}");
    assert!(report["cut_from"].is_null(), "{report}");
    let log = Log::open(data.join("log")).expect("the restored log");
    assert_eq!((log.first_seq(), log.head_seq()), (1, archived_to));
    for n in 1..=archived_to {
        let e = log.read(n).expect("read");
        assert!(e.blob == blob("a", n), "frame {n} is not the archive's");
    }
}
