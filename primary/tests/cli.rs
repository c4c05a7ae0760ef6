//! The `primary` binary as a script sees it, without a running daemon:
//! what init and the pins print, the exit code of each kind of failure,
//! and messages that name the file, address or key at fault.

use std::os::unix::fs::PermissionsExt;

mod support;
use support::{exits, primary, stderr, stdout, Primary};

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
    exits(&init, 0, "init");
    let out = stdout(&init);
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
    exits(&again, 3, "initializing twice");

    let config = data.join("primary.toml");
    let config_s = config.to_str().expect("utf-8 path");
    let good = std::fs::read_to_string(&config).expect("config");
    std::fs::write(&config, format!("{good}\nsurprise = 1\n")).expect("write");
    let bad = primary(&["serve", "--config", config_s]);
    exits(&bad, 3, "an unknown key");
    assert!(
        stderr(&bad).contains("surprise") && stderr(&bad).contains("line"),
        "{}",
        stderr(&bad)
    );
    std::fs::write(&config, &good).expect("restore");

    std::fs::set_permissions(data.join("key.pem"), std::fs::Permissions::from_mode(0o644))
        .expect("chmod");
    let readable = primary(&["serve", "--config", config_s]);
    exits(&readable, 4, "a readable key");
    assert!(
        stderr(&readable).contains("chmod 600"),
        "{}",
        stderr(&readable)
    );

    let usage = primary(&["no-such-command"]);
    exits(&usage, 2, "an unknown command");

    let no_daemon = primary(&["status", "--config", config_s]);
    exits(&no_daemon, 1, "a runtime failure: no daemon answers");

    // What init left is refused by name, never "File exists".
    std::fs::remove_file(&config).expect("rm config");
    std::fs::remove_file(data.join("key.pem")).expect("rm key");
    let leftovers = primary(&["init", "--data", data_s]);
    exits(&leftovers, 3, "an admin key left by an earlier init");
    assert!(
        stderr(&leftovers).contains("already initialized"),
        "{}",
        stderr(&leftovers)
    );
}

#[test]
fn append_refuses_a_terminal_for_stdin_without_a_blob() {
    let p = Primary::init();
    let (mut leader, mut follower) = (-1, -1);
    // SAFETY: openpty writes two descriptors into the given ints; the other
    // pointers may be null.
    let rc = unsafe {
        libc::openpty(
            &mut leader,
            &mut follower,
            std::ptr::null_mut(),
            std::ptr::null(),
            std::ptr::null(),
        )
    };
    assert_eq!(rc, 0, "openpty: {}", std::io::Error::last_os_error());
    // SAFETY: openpty answered two open descriptors that nothing else owns.
    let (leader, follower) = unsafe {
        use std::os::fd::FromRawFd;
        (
            std::os::fd::OwnedFd::from_raw_fd(leader),
            std::os::fd::OwnedFd::from_raw_fd(follower),
        )
    };
    let o = support::command()
        .args(["append", "--config", p.config_s()])
        .stdin(std::process::Stdio::from(follower))
        .output()
        .expect("run");
    drop(leader);
    exits(&o, 2, "append with a terminal for stdin");
    assert!(
        stderr(&o).contains("stdin is a terminal") && stderr(&o).contains("--text"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn values_that_cannot_work_exit_3_naming_the_key_and_line() {
    let p = Primary::init();
    let good = std::fs::read_to_string(&p.config).expect("config");
    let cases = [
        (
            "segment_bytes = 1048576",
            "segment_bytes = 10",
            "segment_bytes",
        ),
        ("heartbeat_ms = 500", "heartbeat_ms = 0", "heartbeat_ms"),
        (
            "idle_timeout_ms = 5000",
            "idle_timeout_ms = 10",
            "idle_timeout_ms",
        ),
        (
            "idle_timeout_ms = 5000",
            "idle_timeout_ms = 500",
            "heartbeat_ms",
        ),
        ("timeout_ms = 50", "timeout_ms = 0", "timeout_ms"),
        ("listen = \"127.0.0.1:", "listen = \"no host:", "listen"),
    ];
    for (was, now, key) in cases {
        assert!(good.contains(was), "{was} in {good}");
        std::fs::write(&p.config, good.replacen(was, now, 1)).expect("write");
        let o = p.run(&["serve"]);
        exits(&o, 3, now);
        let e = stderr(&o);
        assert!(e.contains(key) && e.contains("line"), "{now}: {e}");
        assert!(
            !e.contains("exceeds the limit"),
            "a minimum is not a limit: {e}"
        );
    }
}

#[test]
fn a_port_in_use_exits_3_naming_the_key_and_the_address() {
    let p = Primary::init();
    let taken = std::net::UdpSocket::bind(p.listen).expect("hold the listen port");
    let o = p.run(&["serve"]);
    exits(&o, 3, "listen port in use");
    let e = stderr(&o);
    assert!(
        e.contains("listen") && e.contains(&p.listen.to_string()) && e.contains("in use"),
        "{e}"
    );
    drop(taken);

    let taken = std::net::TcpListener::bind(p.metrics).expect("hold the metrics port");
    let o = p.run(&["serve"]);
    exits(&o, 3, "metrics port in use");
    let e = stderr(&o);
    assert!(
        e.contains("metrics") && e.contains(&p.metrics.to_string()),
        "{e}"
    );
    drop(taken);
}

#[test]
fn a_key_file_without_a_key_exits_4_naming_the_file_and_what_is_expected() {
    let p = Primary::init();
    let key = p.data.join("key.pem");
    std::fs::write(&key, "not a key\n").expect("write");
    let o = p.run(&["serve"]);
    exits(&o, 4, "no key in key.pem");
    let e = stderr(&o);
    assert!(
        e.contains(key.to_str().expect("utf-8")) && e.contains("PRIVATE KEY"),
        "{e}"
    );
}

#[test]
fn no_daemon_answering_is_a_runtime_failure_naming_the_address() {
    let p = Primary::init();
    let o = p.run(&["status"]);
    exits(&o, 1, "status with no daemon");
    assert!(
        stderr(&o).contains(&p.metrics.to_string()),
        "{}",
        stderr(&o)
    );
    let o = p.run(&["append", "--text", "x"]);
    exits(&o, 1, "append with no daemon");
    let e = stderr(&o);
    assert!(
        e.contains(&p.listen.to_string()) && e.contains("primary serve"),
        "{e}"
    );
    // --timeout bounds the wait, anywhere after the command's name.
    let started = std::time::Instant::now();
    let o = p.run(&["repo", "list", "--timeout", "300ms"]);
    exits(&o, 1, "repo list with no daemon");
    assert!(
        stderr(&o).contains("no answer within 300ms"),
        "{}",
        stderr(&o)
    );
    assert!(
        started.elapsed() < std::time::Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
}

#[test]
fn malformed_arguments_exit_2_before_anything_is_asked() {
    let p = Primary::init();
    let o = p.run(&["read", "0"]);
    exits(&o, 2, "read 0");
    assert!(
        stderr(&o).contains("sequences start at 1"),
        "{}",
        stderr(&o)
    );
    exits(&p.run(&["tail", "--from", "0"]), 2, "tail --from 0");
    let o = p.run(&["repo", "cat", "acme/widgets", "zz"]);
    exits(&o, 2, "a malformed object id");
    assert!(stderr(&o).contains("40 hex digits"), "{}", stderr(&o));
    exits(
        &p.run(&["repo", "lfs-get", "acme/widgets", "abc"]),
        2,
        "a malformed SHA-256",
    );
    exits(&p.run(&["repo", "create", "a/../b"]), 2, "a bad repo name");
    exits(
        &p.run(&["repo", "push", "acme/widgets", "--ref", "main"]),
        2,
        "a ref update without ends",
    );
    let o = primary(&["status"]);
    exits(&o, 2, "no configuration");
    assert!(stderr(&o).contains("TWINLOG_CONFIG"), "{}", stderr(&o));
    let o = p.run(&["append", "--text", ""]);
    exits(&o, 2, "an empty blob");
    assert!(stderr(&o).contains("--empty"), "{}", stderr(&o));
    let o = p.run(&["append", "--text", "x", "--timeout", "5 parsecs"]);
    exits(&o, 2, "a malformed timeout");
    assert!(stderr(&o).contains("--timeout"), "{}", stderr(&o));
    exits(
        &p.run(&["read", "1", "--timeout", "0s"]),
        2,
        "a zero timeout",
    );
}

#[test]
fn init_names_the_path_it_cannot_create() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("a-file");
    std::fs::write(&file, "").expect("write");
    let data = file.join("p");
    let o = primary(&["init", "--data", data.to_str().expect("utf-8")]);
    exits(&o, 1, "init under a file");
    assert!(
        stderr(&o).contains(file.to_str().expect("utf-8")),
        "{}",
        stderr(&o)
    );
}

#[test]
fn pins_print_what_they_changed_and_ask_for_a_restart() {
    let p = Primary::init();
    let fp = "ab".repeat(32);
    let o = p.run(&["pin-twin", &fp]);
    exits(&o, 0, "pin-twin");
    let out = stdout(&o);
    assert!(
        out.contains(p.config_s())
            && out.contains("twin_fingerprint: (none) -> ")
            && out.contains(&fp)
            && out.contains("restart"),
        "{out}"
    );
    let o = p.run(&["pin-twin", &fp]);
    exits(&o, 0, "pin-twin again");
    assert!(
        stdout(&o).contains("nothing changed") && !stdout(&o).contains("restart"),
        "{}",
        stdout(&o)
    );
    let client = "cd".repeat(32);
    let o = p.run(&["pin-client", &client]);
    exits(&o, 0, "pin-client");
    let out = stdout(&o);
    assert!(
        out.contains("writer_fingerprints: [] -> [")
            && out.contains(&client)
            && out.contains("restart"),
        "a client is a writer unless told: {out}"
    );
    // Another role moves it, and says so.
    let o = p.run(&["pin-client", "--role", "read", &client]);
    exits(&o, 0, "pin-client --role read");
    let out = stdout(&o);
    assert!(
        out.contains("writer_fingerprints: [") && out.contains("reader_fingerprints: [] -> ["),
        "{out}"
    );
    let o = p.run(&["pins"]);
    exits(&o, 0, "pins");
    let out = stdout(&o);
    assert!(
        out.contains(&format!("{fp}  twin")) && out.contains(&format!("{client}  client (read)")),
        "{out}"
    );
    let cfg = twinlog::daemon::PrimaryConfig::load(&p.config).expect("load");
    assert_eq!(cfg.twin_fingerprint.map(|f| f.to_string()), Some(fp));
    assert_eq!(
        cfg.client_fingerprints.len(),
        1,
        "the admin client init made"
    );
    assert_eq!(cfg.reader_fingerprints.len(), 1);
    let o = p.run(&["unpin", &client]);
    exits(&o, 0, "unpin");
    assert!(
        stdout(&o).contains("reader_fingerprints: ["),
        "{}",
        stdout(&o)
    );
    let cfg = twinlog::daemon::PrimaryConfig::load(&p.config).expect("load");
    assert!(cfg.reader_fingerprints.is_empty() && cfg.writer_fingerprints.is_empty());
}

#[test]
fn the_configuration_comes_from_twinlog_config_when_no_flag_names_it() {
    let p = Primary::init();
    let o = support::command()
        .arg("check-log")
        .env("TWINLOG_CONFIG", &p.config)
        .output()
        .expect("run");
    exits(
        &o,
        1,
        "check-log with TWINLOG_CONFIG, before any log exists",
    );
    let log = p.data.join("log");
    assert!(
        stderr(&o).contains(log.to_str().expect("utf-8")),
        "names the log it looked for: {}",
        stderr(&o)
    );
    let o = support::command()
        .args(["check-log", "--config", "/nonexistent/primary.toml"])
        .env("TWINLOG_CONFIG", &p.config)
        .output()
        .expect("run");
    exits(&o, 3, "the flag wins over the environment");
}

#[test]
fn restore_names_the_twin_address_it_cannot_reach() {
    let p = Primary::init();
    let nobody = support::free_udp().to_string();
    let fp = "ab".repeat(32);
    let o = p.run(&["restore", "--twin", &nobody, "--twin-fingerprint", &fp]);
    exits(&o, 1, "restore from nobody");
    let e = stderr(&o);
    assert!(
        e.contains(&nobody) && e.contains("--twin") && e.contains("twin serve"),
        "{e}"
    );
    // The old spelling still works.
    let o = p.run(&["restore", "--from", &nobody, "--twin-fingerprint", &fp]);
    exits(&o, 1, "restore --from");
}

#[test]
fn completions_for_bash_name_the_subcommands() {
    let out = primary(&["completions", "bash"]);
    exits(&out, 0, "completions bash");
    let script = stdout(&out);
    for sub in ["serve", "restore", "repo", "history", "completions", "man"] {
        assert!(script.contains(sub), "no {sub} in:\n{script}");
    }
    for shell in ["zsh", "fish", "elvish", "powershell"] {
        let out = primary(&["completions", shell]);
        exits(&out, 0, shell);
        assert!(stdout(&out).contains("restore"), "{shell}");
    }
    exits(
        &primary(&["completions", "tcsh"]),
        2,
        "a shell clap_complete lacks",
    );
}

#[test]
fn man_writes_a_roff_page_for_the_binary_and_each_subcommand() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out_dir = dir.path().join("man1");
    let out = primary(&["man", "--out", out_dir.to_str().expect("utf-8 path")]);
    exits(&out, 0, "man --out");
    for page in [
        "primary-repo.1",
        "primary-repo-history.1",
        "primary-restore.1",
    ] {
        assert!(out_dir.join(page).is_file(), "no {page}");
    }
    let top = std::fs::read_to_string(out_dir.join("primary.1")).expect("primary.1");
    // clap_mangen defines a string (`.ie`/`.el`) before the title line.
    let th = top
        .lines()
        .find(|l| !l.starts_with(".ie") && !l.starts_with(".el"))
        .unwrap_or_default();
    assert!(th.starts_with(".TH primary 1"), "{top}");
    assert!(top.contains("restore"), "{top}");
}

#[test]
fn man_names_the_directory_it_cannot_create() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("a-file");
    std::fs::write(&file, b"").expect("write");
    let under = file.join("man1");
    let out = primary(&["man", "--out", under.to_str().expect("utf-8 path")]);
    exits(&out, 1, "man --out under a file");
    assert!(stderr(&out).contains("a-file"), "{}", stderr(&out));
}
