//! The archive knows how far it reached, with Garage as the bucket and
//! `primary serve` archiving its own segments (`uploader = "primary"`, no
//! twin): its head record follows the uploads. With the newest object
//! deleted, `primary restore --from-archive` refuses, naming the frames
//! gone, and with `--accept-shorter` restores what is left and says
//! exactly what it lost. A head record rolled back to an older one is
//! noticed by the serving box and written again, also when it was rolled
//! back while the box was down.

use std::sync::Arc;
use std::time::Duration;

mod support;
use support::archive::{archive_of, archived, get, init, key_file, put, with_archive};
use support::{exits, primary, stderr, stdout, Primary};
use testkit::garage::Garage;
use twinlog::archive::archiver::ArchiveStatus;
use twinlog::archive::bucket::Bucket;
use twinlog::archive::codec::ArchiveKey;
use twinlog::archive::fetch::open_object;
use twinlog::archive::head::read_head;
use twinlog::archive::object::Content;
use twinlog::daemon::config::Uploader;
use twinlog::log::Log;
use twinlog::node::{Client, Durability};

const WAIT: Duration = Duration::from_secs(60);

fn blob(n: u64) -> Vec<u8> {
    let mut b = format!("head-frame-{n}-").into_bytes();
    b.resize(3000, (n % 251) as u8);
    b
}

/// The log's history id, from an archived segment's footer.
fn history_of(rt: &tokio::runtime::Runtime, bucket: &Bucket, key: &ArchiveKey) -> [u8; 16] {
    rt.block_on(async {
        let (n, size) = bucket.segments().await.expect("list")[0];
        let k = bucket.segment_key(&n);
        let o = open_object(bucket, &k, size, Some(key))
            .await
            .expect("open");
        match &o.reader.footer().content {
            Content::Segment(info) => info.history,
            other => panic!("{other:?}"),
        }
    })
}

fn signal(d: &support::Daemon, sig: libc::c_int) {
    // SAFETY: kill(2) on our own child's pid.
    assert_eq!(unsafe { libc::kill(d.child.id() as libc::pid_t, sig) }, 0);
}

#[test]
fn a_bucket_that_lost_its_newest_object_is_not_restored_as_if_whole() {
    let garage_dir = tempfile::tempdir().expect("dir");
    let g = Garage::start(garage_dir.path(), 1).expect("garage");
    let p = Primary::init();
    let (url, bucket) = support::archive::garage_bucket(&g, "solo");
    let (key_path, key) = key_file(p.dir.path());
    with_archive(&p.config, &url, Some(&g), &key_path);
    p.edit(|c| {
        if let Some(a) = c.archive.as_mut() {
            a.uploader = Uploader::Primary;
        }
    });
    let mut daemon = p.serve();
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let admin = Arc::new(twinlog::daemon::load_identity(&p.data.join("admin")).expect("admin"));
    let fp = twinlog::daemon::load_identity(&p.data)
        .expect("identity")
        .fingerprint();
    let c = rt
        .block_on(Client::connect(&admin, fp, p.listen))
        .expect("connect");
    let append = |from: u64, to: u64| {
        rt.block_on(async {
            for n in from..=to {
                let (seq, _) = c
                    .append(0x8000, b"", &blob(n), Durability::Local)
                    .await
                    .expect("append");
                assert_eq!(seq, n);
            }
        })
    };
    append(1, 1200);
    let first_floor = archived(&p, 0);
    let history = history_of(&rt, &bucket, &key);
    let head_key = bucket.head_key(&history);
    let read = |rt: &tokio::runtime::Runtime| {
        rt.block_on(read_head(&bucket, Some(&key), &history))
            .expect("the head record reads")
    };
    let old_head = get(&bucket, &head_key);
    append(1201, 2400);

    // The uploader paused once it archived everything sealed and its
    // head record says so (read back, not from its status); the newest
    // object deleted.
    let (archived_to, generation, newest) = loop {
        let to = archived(&p, first_floor);
        signal(&daemon, libc::SIGSTOP);
        let newest = rt
            .block_on(bucket.segments())
            .expect("list")
            .into_iter()
            .max_by_key(|(n, _)| n.last)
            .expect("an object")
            .0;
        let head = read(&rt);
        match head {
            Some(h) if h.last == newest.last && newest.last == to => {
                break (to, h.generation, newest)
            }
            // No head in this build, or paused between an upload and
            // its head: the object and the head as they are.
            None => break (to, 0, newest),
            Some(_) => signal(&daemon, libc::SIGCONT),
        }
    };
    let newest_key = bucket.segment_key(&newest);
    let newest_bytes = get(&bucket, &newest_key);
    rt.block_on(bucket.delete(&newest_key)).expect("delete");
    let reached = newest.first - 1;

    let fresh = p.dir.path().join("fresh");
    let cfg = init(&fresh);
    with_archive(&cfg, &url, Some(&g), &key_path);
    let f = cfg.to_str().expect("utf-8");
    let refused = primary(&["restore", "--config", f, "--from-archive", &url]);
    exits(
        &refused,
        1,
        "a restore of a bucket that lost its newest object",
    );
    let said = stderr(&refused);
    assert!(
        said.contains(&format!(
            "says frames up to {archived_to} were archived, but its segments reach frame {reached}"
        )) && said.contains("--accept-shorter"),
        "{said}"
    );
    let out = primary(&[
        "restore",
        "--config",
        f,
        "--from-archive",
        &url,
        "--accept-shorter",
    ]);
    exits(&out, 0, "--accept-shorter");
    let said = stdout(&out);
    assert!(
        said.contains(&format!(
            "LOST: frames {} to {archived_to}, which the head record says were archived",
            reached + 1
        )) && said.contains(&format!("restored frames 1 to {reached}")),
        "{said}"
    );
    let log = Log::open(fresh.join("log")).expect("the restored log");
    assert_eq!(log.head_seq(), reached);
    for n in [1, reached / 2, reached] {
        assert!(log.read(n).expect("read").blob == blob(n), "frame {n}");
    }
    drop(log);

    // A head record that does not open under the key: refused by name,
    // or restored past with --accept-shorter, which says so.
    put(&bucket, &head_key, b"not a head record".to_vec());
    let fresh = p.dir.path().join("fresh-2");
    let cfg = init(&fresh);
    with_archive(&cfg, &url, Some(&g), &key_path);
    let f = cfg.to_str().expect("utf-8");
    let refused = primary(&["restore", "--config", f, "--from-archive", &url]);
    exits(
        &refused,
        1,
        "a restore past a head record that does not read",
    );
    assert!(stderr(&refused).contains(&head_key), "{}", stderr(&refused));
    let out = primary(&[
        "restore",
        "--config",
        f,
        "--from-archive",
        &url,
        "--accept-shorter",
    ]);
    exits(&out, 0, "--accept-shorter past it");
    assert!(
        stdout(&out).contains("head record does not read"),
        "{}",
        stdout(&out)
    );

    // The object back, the head record rolled back to an older one: the
    // serving box says so, in its status too, and writes it again.
    put(&bucket, &newest_key, newest_bytes);
    put(&bucket, &head_key, old_head.clone());
    signal(&daemon, libc::SIGCONT);
    testkit::until_blocking("the rolled-back head noticed", WAIT, || {
        let a: ArchiveStatus = serde_json::from_value(archive_of(&p)).ok()?;
        let text = twinlog::daemon::render_archive(&a);
        (text.contains("rolled back") && text.contains(&format!("frame {archived_to}")))
            .then_some(())
    });
    let again = testkit::until_blocking("the head written again", WAIT, || {
        read(&rt).filter(|h| h.last == archived_to && h.generation > generation)
    });
    assert_eq!(again.first, 1, "{again:?}");

    // Rolled back while the box was down: the record of the head it keeps
    // in its data directory finds it at the next start.
    daemon.kill();
    let latest = read(&rt).expect("a head");
    put(&bucket, &head_key, old_head);
    let mut daemon = p.serve();
    testkit::until_blocking("the head rolled back while down noticed", WAIT, || {
        let a: ArchiveStatus = serde_json::from_value(archive_of(&p)).ok()?;
        let text = twinlog::daemon::render_archive(&a);
        (text.contains("rolled back") && text.contains(&format!("frame {}", latest.last)))
            .then_some(())
    });
    testkit::until_blocking("the head written again after the restart", WAIT, || {
        read(&rt).filter(|h| h.last >= latest.last && h.generation > latest.generation)
    });
    daemon.kill();
}
