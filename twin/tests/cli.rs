//! The `twin` binary as a script sees it: what init and the pins print,
//! the exit code of each kind of failure, and a running `twin serve` (a
//! child process on loopback, its primary absent) answering `status` and
//! refusing a promotion until it is stopped.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

fn command() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_twin"));
    c.env_remove("TWINLOG_CONFIG");
    c
}

fn twin(args: &[&str]) -> Output {
    command().args(args).output().expect("run twin")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[track_caller]
fn exits(o: &Output, code: i32, what: &str) {
    assert_eq!(
        o.status.code(),
        Some(code),
        "{what}: stdout {:?}, stderr {:?}",
        stdout(o),
        stderr(o)
    );
}

use testkit::{free_tcp, free_udp};

/// A twin's data directory, made by `twin init`; its primary is a free
/// port nobody answers on.
struct TwinBox {
    dir: tempfile::TempDir,
    data: PathBuf,
    config: PathBuf,
    metrics: SocketAddr,
}

impl TwinBox {
    fn init() -> TwinBox {
        Self::init_at(&free_udp().to_string(), free_tcp())
    }

    fn init_at(primary: &str, metrics: SocketAddr) -> TwinBox {
        let dir = tempfile::tempdir().expect("tempdir");
        let data = dir.path().join("t");
        let o = twin(&[
            "init",
            "--data",
            data.to_str().expect("utf-8"),
            "--primary",
            primary,
            "--metrics",
            &metrics.to_string(),
        ]);
        exits(&o, 0, "init");
        let config = data.join("twin.toml");
        TwinBox {
            dir,
            data,
            config,
            metrics,
        }
    }

    fn config_s(&self) -> &str {
        self.config.to_str().expect("utf-8")
    }

    fn run(&self, args: &[&str]) -> Output {
        let mut all = args.to_vec();
        all.extend(["--config", self.config_s()]);
        twin(&all)
    }

    fn edit(&self, f: impl FnOnce(&str) -> String) {
        let text = std::fs::read_to_string(&self.config).expect("read");
        std::fs::write(&self.config, f(&text)).expect("write");
    }

    /// `twin serve`, once `twin status` answers (asked with the
    /// configuration in TWINLOG_CONFIG, as a shell profile may set it).
    fn serve(&self) -> Daemon {
        let log = self.dir.path().join("serve.log");
        let child = command()
            .args(["serve", "--config", self.config_s()])
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("log file"))
            .spawn()
            .expect("spawn twin serve");
        let mut d = Daemon { child, log };
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let status = command()
                .arg("status")
                .env("TWINLOG_CONFIG", &self.config)
                .output()
                .expect("status");
            if status.status.success() {
                return d;
            }
            if let Ok(Some(s)) = d.child.try_wait() {
                panic!("twin serve exited ({s}): {}", d.log_text());
            }
            assert!(
                Instant::now() < deadline,
                "twin serve did not answer status: {}",
                d.log_text()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// A running `twin serve`, killed on drop.
struct Daemon {
    child: Child,
    log: PathBuf,
}

impl Daemon {
    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn pins_print_what_they_changed_and_ask_for_a_restart() {
    let t = TwinBox::init();
    let fp = "ab".repeat(32);
    let o = t.run(&["pin", &fp]);
    exits(&o, 0, "pin");
    let out = stdout(&o);
    assert!(
        out.contains(t.config_s())
            && out.contains(&format!("primary_fingerprint: (none) -> {fp}"))
            && out.contains("restart"),
        "{out}"
    );
    let o = t.run(&["pin", &fp]);
    exits(&o, 0, "pin again");
    assert!(stdout(&o).contains("nothing changed"), "{}", stdout(&o));

    // A restore pin that would serve no restore is refused.
    let restorer = "cd".repeat(32);
    let o = t.run(&["pin-restore", &restorer]);
    exits(&o, 2, "pin-restore without --listen");
    assert!(
        stderr(&o).contains("restore_listen") && stderr(&o).contains("--listen"),
        "{}",
        stderr(&o)
    );
    let cfg = twinlog::daemon::TwinConfig::load(&t.config).expect("load");
    assert!(cfg.restore_fingerprints.is_empty(), "nothing written");

    let listen = free_udp().to_string();
    let o = t.run(&["pin-restore", "--listen", &listen, &restorer]);
    exits(&o, 0, "pin-restore --listen");
    let out = stdout(&o);
    assert!(
        out.contains(&format!("restore_listen: (none) -> {listen}"))
            && out.contains("restore_fingerprints: [] -> [")
            && out.contains("restart"),
        "{out}"
    );
    // With restore_listen set, another box needs no --listen.
    let o = t.run(&["pin-restore", &"ef".repeat(32)]);
    exits(&o, 0, "a second restorer");
    let cfg = twinlog::daemon::TwinConfig::load(&t.config).expect("load");
    assert_eq!(cfg.restore_fingerprints.len(), 2);
    assert_eq!(cfg.restore_listen.map(|a| a.to_string()), Some(listen));
}

#[test]
fn each_kind_of_failure_has_the_readme_s_exit_code() {
    let t = TwinBox::init();
    let o = t.run(&["status"]);
    exits(&o, 1, "status with no daemon");
    assert!(
        stderr(&o).contains(&t.metrics.to_string()),
        "{}",
        stderr(&o)
    );
    let o = t.run(&["serve"]);
    exits(&o, 3, "serve before `twin pin`");
    assert!(stderr(&o).contains("twin pin"), "{}", stderr(&o));
    exits(&twin(&["status"]), 2, "no configuration");
    exits(&twin(&["no-such-command"]), 2, "an unknown command");
    exits(&t.run(&["pin", "abc"]), 2, "a malformed fingerprint");

    t.edit(|c| c.replace("heartbeat_ms = 500", "heartbeat_ms = 0"));
    let o = t.run(&["serve"]);
    exits(&o, 3, "heartbeat_ms = 0");
    assert!(
        stderr(&o).contains("heartbeat_ms") && stderr(&o).contains("line"),
        "{}",
        stderr(&o)
    );
    t.edit(|c| c.replace("heartbeat_ms = 0", "heartbeat_ms = 500"));

    let o = t.run(&["pin", &"ab".repeat(32)]);
    exits(&o, 0, "pin");
    let key = t.data.join("key.pem");
    std::fs::write(&key, "no key here\n").expect("write");
    let o = t.run(&["serve"]);
    exits(&o, 4, "a key file without a key");
    assert!(
        stderr(&o).contains(key.to_str().expect("utf-8")),
        "{}",
        stderr(&o)
    );
}

#[test]
fn a_port_in_use_exits_3_naming_the_key_and_the_address() {
    let t = TwinBox::init();
    exits(&t.run(&["pin", &"ab".repeat(32)]), 0, "pin");
    let held = std::net::TcpListener::bind(t.metrics).expect("hold metrics");
    let o = t.run(&["serve"]);
    exits(&o, 3, "metrics in use");
    assert!(
        stderr(&o).contains("metrics") && stderr(&o).contains(&t.metrics.to_string()),
        "{}",
        stderr(&o)
    );
    drop(held);

    let restore = free_udp();
    exits(
        &t.run(&[
            "pin-restore",
            "--listen",
            &restore.to_string(),
            &"cd".repeat(32),
        ]),
        0,
        "pin-restore",
    );
    let held = std::net::UdpSocket::bind(restore).expect("hold restore_listen");
    let o = t.run(&["serve"]);
    exits(&o, 3, "restore_listen in use");
    assert!(
        stderr(&o).contains("restore_listen") && stderr(&o).contains(&restore.to_string()),
        "{}",
        stderr(&o)
    );
    drop(held);
}

#[test]
fn a_running_twin_answers_status_and_is_promoted_only_once_stopped() {
    let metrics = free_tcp();
    let primary = format!("localhost:{}", free_udp().port());
    let t = TwinBox::init_at(&primary, metrics);
    exits(&t.run(&["pin", &"ab".repeat(32)]), 0, "pin");
    let d = t.serve();
    let o = t.run(&["status"]);
    exits(&o, 0, "status");
    assert!(
        stdout(&o).contains("primary: not connected"),
        "{}",
        stdout(&o)
    );
    let listen = free_udp().to_string();
    let pmetrics = free_tcp().to_string();
    let o = t.run(&["promote", "--listen", &listen, "--metrics", &pmetrics]);
    exits(&o, 1, "promoting a running twin");
    assert!(stderr(&o).contains("stop it"), "{}", stderr(&o));
    drop(d);
    let o = t.run(&["promote", "--listen", &listen, "--metrics", &pmetrics]);
    exits(&o, 0, "promoting a stopped twin");
    assert!(stdout(&o).contains("primary.toml"), "{}", stdout(&o));
    let o = t.run(&["promote", "--listen", &listen, "--metrics", &pmetrics]);
    exits(&o, 3, "promoting twice");
}

#[test]
fn completions_for_bash_name_the_subcommands() {
    let out = twin(&["completions", "bash"]);
    exits(&out, 0, "completions bash");
    let script = stdout(&out);
    for sub in ["serve", "promote", "pin-restore", "completions", "man"] {
        assert!(script.contains(sub), "no {sub} in:\n{script}");
    }
}

#[test]
fn man_writes_a_roff_page_for_the_binary_and_each_subcommand() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = twin(&["man", "--out", dir.path().to_str().expect("utf-8 path")]);
    exits(&out, 0, "man --out");
    for page in ["twin-serve.1", "twin-promote.1", "twin-pin-restore.1"] {
        assert!(dir.path().join(page).is_file(), "no {page}");
    }
    let top = std::fs::read_to_string(dir.path().join("twin.1")).expect("twin.1");
    // clap_mangen defines a string (`.ie`/`.el`) before the title line.
    let th = top
        .lines()
        .find(|l| !l.starts_with(".ie") && !l.starts_with(".el"))
        .unwrap_or_default();
    assert!(th.starts_with(".TH twin 1"), "{top}");
}

#[test]
fn a_box_a_restore_is_filling_is_not_served() {
    let t = TwinBox::init();
    exits(&t.run(&["pin", &"ab".repeat(32)]), 0, "pin");
    std::fs::write(
        t.data.join("RESTORING"),
        "a restore is filling this box\nfrom: --from-archive file:///srv/archive\n",
    )
    .expect("marker");
    let log = t.dir.path().join("serve.log");
    let mut child = command()
        .args(["serve", "--config", t.config_s()])
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).expect("log file"))
        .spawn()
        .expect("spawn twin serve");
    // Waited on as a process: a twin that serves instead never exits.
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait") {
            break s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("twin serve serves a box a restore is filling");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let said = std::fs::read_to_string(&log).expect("log");
    assert_eq!(status.code(), Some(3), "{said}");
    for part in [
        "unfinished restore",
        "--from-archive file:///srv/archive",
        "--abandon",
    ] {
        assert!(said.contains(part), "{part:?} in {said}");
    }
}
