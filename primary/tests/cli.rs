//! The `primary` binary as a script sees it: what init prints, and the exit
//! codes of a bad config, a readable key and bad arguments.

use std::os::unix::fs::PermissionsExt;
use std::process::{Command, Output};

fn primary(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_primary"))
        .args(args)
        .output()
        .expect("run primary")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn exit_codes_scripts_can_rely_on() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("p");
    let data_s = data.to_str().expect("utf-8 path");
    let init = primary(&[
        "init",
        "--data",
        data_s,
        "--listen",
        "127.0.0.1:7999",
        "--metrics",
        "127.0.0.1:9999",
    ]);
    assert!(init.status.success(), "{}", stderr(&init));
    let out = String::from_utf8_lossy(&init.stdout);
    let fp = out
        .lines()
        .find(|l| l.contains("fingerprint"))
        .and_then(|l| l.split_whitespace().last())
        .expect("a fingerprint");
    assert_eq!(fp.len(), 64, "{out}");
    let mode = std::fs::metadata(data.join("key.pem"))
        .expect("key")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600, "the key is written 0600");

    let again = primary(&["init", "--data", data_s]);
    assert_eq!(
        again.status.code(),
        Some(3),
        "initializing twice: {}",
        stderr(&again)
    );

    let config = data.join("primary.toml");
    let config_s = config.to_str().expect("utf-8 path");
    let good = std::fs::read_to_string(&config).expect("config");
    std::fs::write(&config, format!("{good}\nsurprise = 1\n")).expect("write");
    let bad = primary(&["serve", "--config", config_s]);
    assert_eq!(
        bad.status.code(),
        Some(3),
        "an unknown key: {}",
        stderr(&bad)
    );
    assert!(
        stderr(&bad).contains("surprise") && stderr(&bad).contains("line"),
        "{}",
        stderr(&bad)
    );
    std::fs::write(&config, &good).expect("restore");

    std::fs::set_permissions(data.join("key.pem"), std::fs::Permissions::from_mode(0o644))
        .expect("chmod");
    let readable = primary(&["serve", "--config", config_s]);
    assert_eq!(
        readable.status.code(),
        Some(4),
        "a readable key: {}",
        stderr(&readable)
    );
    assert!(
        stderr(&readable).contains("chmod 600"),
        "{}",
        stderr(&readable)
    );

    let usage = primary(&["no-such-command"]);
    assert_eq!(usage.status.code(), Some(2));
}
