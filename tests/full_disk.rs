//! A full disk, for real: a log on a small loop-mounted ext4 file system
//! appends until it runs out of space. The append that finds no room
//! fails by name, nothing acknowledged is lost, the log says what
//! happened (poisoned or not), and once space is freed it takes appends
//! again: at once when the failure came before anything was written (a
//! new segment), after a reopen otherwise.
//!
//! Needs root, to mount (the test machines run as root); a mount that is
//! refused fails the test with the reason.

use std::path::Path;
use std::process::Command;

use twinlog::log::{Error, Log, OpenOptions};

fn run(cmd: &str, args: &[&str]) {
    let out = Command::new(cmd).args(args).output().expect(cmd);
    assert!(
        out.status.success(),
        "{cmd} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Unmounts on drop, whatever the test did.
struct Mounted<'a>(&'a Path);

impl Drop for Mounted<'_> {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(self.0).status();
    }
}

fn no_space(e: &Error) -> bool {
    matches!(e, Error::Io(io) if io.raw_os_error() == Some(libc::ENOSPC))
}

#[test]
fn a_full_disk_refuses_appends_by_name_loses_nothing_and_recovers_once_space_returns() {
    let dir = tempfile::tempdir().expect("tempdir");
    let image = dir.path().join("disk.img");
    let mnt = dir.path().join("mnt");
    std::fs::create_dir(&mnt).expect("mkdir");
    run("truncate", &["-s", "24M", image.to_str().expect("utf-8")]);
    run("mkfs.ext4", &["-q", "-F", image.to_str().expect("utf-8")]);
    run(
        "mount",
        &[
            "-o",
            "loop",
            image.to_str().expect("utf-8"),
            mnt.to_str().expect("utf-8"),
        ],
    );
    let _mounted = Mounted(&mnt);
    // Room to free later.
    let filler = mnt.join("filler");
    std::fs::write(&filler, vec![7u8; 4 << 20]).expect("filler");

    let open = || {
        Log::open_opts(
            mnt.join("log"),
            OpenOptions {
                segment_bytes: 1 << 20,
                ..OpenOptions::default()
            },
        )
    };
    let log = open().expect("open");
    let blob = vec![0x5au8; 60_000];
    let mut acked = Vec::new();
    let err = loop {
        match log.append_raw(0x8001, b"", &blob) {
            Ok(seq) => acked.push(seq),
            Err(e) => break e,
        }
        assert!(acked.len() < 10_000, "24 MiB never filled");
    };
    assert!(no_space(&err), "{err:?}");
    assert!(
        acked.len() > 100,
        "{} frames before the disk filled",
        acked.len()
    );
    let poisoned = log.poisoned_by();
    if let Some(why) = &poisoned {
        assert!(why.contains("No space left"), "{why}");
    }
    // Everything acknowledged reads back while the disk is full.
    for &seq in &acked {
        assert_eq!(log.read(seq).expect("read").blob.len(), blob.len());
    }

    std::fs::remove_file(&filler).expect("free space");
    let log = match poisoned {
        // Nothing was half written: the same log goes on.
        None => log,
        Some(_) => {
            drop(log);
            open().expect("reopen")
        }
    };
    let next = log.append_raw(0x8001, b"", b"space again").expect("append");
    assert_eq!(next, acked.last().copied().unwrap_or(0) + 1);
    drop(log);
    let log = open().expect("reopen");
    for &seq in &acked {
        assert_eq!(log.read(seq).expect("read").blob, blob);
    }
    assert_eq!(log.read(next).expect("read").blob, b"space again");
}
