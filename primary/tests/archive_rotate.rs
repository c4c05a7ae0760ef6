//! Archive keys rotate, end to end: `primary serve` archives its own
//! segments to Garage under a key, `primary archive-key --rotate` puts a
//! new key in front of the file, the daemon serves again and archives
//! under it. A fresh box with the rotated file restores every frame; with
//! either key alone it is refused, naming an object sealed under the
//! other key.

use std::os::unix::fs::PermissionsExt;
use std::sync::Arc;

mod support;
use support::archive::{archived, init, key_file, with_archive};
use support::{exits, primary, stderr, stdout, Primary};
use testkit::garage::Garage;
use twinlog::archive::codec::ArchiveKey;
use twinlog::daemon::config::Uploader;
use twinlog::log::Log;
use twinlog::node::{Client, Durability};

fn blob(n: u64) -> Vec<u8> {
    let mut b = format!("rotate-frame-{n}-").into_bytes();
    b.resize(3000, (n % 251) as u8);
    b
}

/// Serve `p`, append frames `from..=to`, wait until every sealed segment
/// is archived past `past`, and stop: the last archived frame.
fn serve_and_archive(p: &Primary, from: u64, to: u64, past: u64) -> u64 {
    let mut daemon = p.serve();
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let admin = Arc::new(twinlog::daemon::load_identity(&p.data.join("admin")).expect("admin"));
    let fp = twinlog::daemon::load_identity(&p.data)
        .expect("identity")
        .fingerprint();
    rt.block_on(async {
        let c = Client::connect(&admin, fp, p.listen)
            .await
            .expect("connect");
        for n in from..=to {
            let (seq, _) = c
                .append(0x8000, b"", &blob(n), Durability::Local)
                .await
                .expect("append");
            assert_eq!(seq, n);
        }
    });
    let last = archived(p, past);
    daemon.kill();
    last
}

/// A fresh box restoring `url` with the key file `keys`.
fn restore_with(
    root: &std::path::Path,
    name: &str,
    url: &str,
    g: &Garage,
    keys: &str,
) -> (std::process::Output, std::path::PathBuf) {
    let dir = root.join(name);
    let key_path = root.join(format!("{name}.key"));
    std::fs::write(&key_path, keys).expect("key file");
    std::fs::set_permissions(&key_path, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    let cfg = init(&dir);
    with_archive(&cfg, url, Some(g), &key_path);
    let c = cfg.to_str().expect("utf-8");
    (
        primary(&["restore", "--config", c, "--from-archive", url, "--json"]),
        dir,
    )
}

#[test]
fn objects_sealed_before_and_after_a_rotation_restore_with_the_ring() {
    let garage_dir = tempfile::tempdir().expect("dir");
    let g = Garage::start(garage_dir.path(), 1).expect("garage");
    let p = Primary::init();
    let (url, _) = support::archive::garage_bucket(&g, "rotating");
    let (key_path, first_key) = key_file(p.dir.path());
    with_archive(&p.config, &url, Some(&g), &key_path);
    p.edit(|c| {
        if let Some(a) = c.archive.as_mut() {
            a.uploader = Uploader::Primary;
        }
    });
    let before = serve_and_archive(&p, 1, 800, 0);

    let k = key_path.to_str().expect("utf-8");
    let out = primary(&["archive-key", "--rotate", k]);
    exits(&out, 0, "archive-key --rotate");
    assert!(
        stdout(&out).contains("1 older keys kept"),
        "{}",
        stdout(&out)
    );
    let ring = ArchiveKey::load(&key_path).expect("the rotated ring");
    assert_eq!(ring.ids().len(), 2);
    assert_eq!(ring.ids()[1], first_key.id());
    let mode = std::fs::metadata(&key_path)
        .expect("meta")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
    let after = serve_and_archive(&p, 801, 1600, before);

    // With the ring: every frame, those sealed under either key.
    let text = std::fs::read_to_string(&key_path).expect("ring");
    let (out, dir) = restore_with(p.dir.path(), "ring", &url, &g, &text);
    exits(&out, 0, "a restore with the ring");
    let log = Log::open(dir.join("log")).expect("the restored log");
    assert_eq!(log.head_seq(), after);
    for n in [1, before, before + 1, after] {
        assert!(log.read(n).expect("read").blob == blob(n), "frame {n}");
    }
    drop(log);

    // Either key alone: refused, naming an object of the other.
    let newest_only = text.lines().next().expect("a line").to_owned() + "\n";
    let oldest_only = first_key.to_file_text();
    for (name, keys, missing) in [
        ("new", newest_only, first_key.id()),
        ("old", oldest_only, ring.id()),
    ] {
        let (out, _) = restore_with(p.dir.path(), name, &url, &g, &keys);
        exits(&out, 1, name);
        let hex: String = missing.iter().map(|b| format!("{b:02x}")).collect();
        let said = stderr(&out);
        assert!(
            said.contains(&format!(
                "encrypted under key {hex}, which the key file does not hold"
            )) && said.contains(".twseg"),
            "{name}: {said}"
        );
    }
}
