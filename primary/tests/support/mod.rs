//! Running the `primary` binary as an operator does: a data directory made
//! by `primary init` on free loopback ports, and `primary serve` as a child
//! process, waited on by polling `primary status`, killed on drop.

#![allow(dead_code)]

pub mod archive;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use twinlog::daemon::config::Policy;
use twinlog::daemon::PrimaryConfig;

/// The primary binary with a clean environment: no `TWINLOG_CONFIG`
/// leaking in from the shell running the tests.
pub fn command() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_primary"));
    c.env_remove("TWINLOG_CONFIG").env("RUST_LOG", "info");
    c
}

pub fn primary(args: &[&str]) -> Output {
    command().args(args).output().expect("run primary")
}

/// `primary` with `bytes` on its stdin.
pub fn primary_stdin(args: &[&str], bytes: &[u8]) -> Output {
    use std::io::Write;
    let mut child = command()
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run primary");
    let mut stdin = child.stdin.take().expect("stdin");
    stdin.write_all(bytes).expect("write stdin");
    drop(stdin);
    child.wait_with_output().expect("wait")
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Assert an exit code, showing what the command said otherwise.
#[track_caller]
pub fn exits(o: &Output, code: i32, what: &str) {
    assert_eq!(
        o.status.code(),
        Some(code),
        "{what}: stdout {:?}, stderr {:?}",
        stdout(o),
        stderr(o)
    );
}

pub use testkit::{free_tcp, free_udp};

/// A primary's data directory, made by `primary init`.
pub struct Primary {
    pub dir: tempfile::TempDir,
    pub data: PathBuf,
    pub config: PathBuf,
    pub listen: SocketAddr,
    pub metrics: SocketAddr,
}

impl Primary {
    /// `primary init` on free loopback ports. Twin appends fall back to
    /// local durability after 50 ms: no twin runs in these tests.
    pub fn init() -> Primary {
        Primary::init_with(Policy::Fallback)
    }

    pub fn init_with(policy: Policy) -> Primary {
        let dir = tempfile::tempdir().expect("tempdir");
        let data = dir.path().join("p");
        let (listen, metrics) = (free_udp(), free_tcp());
        let o = primary(&[
            "init",
            "--data",
            data.to_str().expect("utf-8"),
            "--listen",
            &listen.to_string(),
            "--metrics",
            &metrics.to_string(),
        ]);
        exits(&o, 0, "init");
        let config = data.join("primary.toml");
        let b = Primary {
            dir,
            data,
            config,
            listen,
            metrics,
        };
        b.edit(|c| {
            c.durability.policy = policy;
            c.durability.timeout_ms = 50;
            c.segment_bytes = 1 << 20;
        });
        b
    }

    pub fn config_s(&self) -> &str {
        self.config.to_str().expect("utf-8")
    }

    /// Change the configuration as an operator would edit it.
    pub fn edit(&self, f: impl FnOnce(&mut PrimaryConfig)) {
        let mut c = PrimaryConfig::load(&self.config).expect("load");
        f(&mut c);
        std::fs::write(&self.config, c.render()).expect("write config");
    }

    /// `primary ARGS --config THIS` (the flag after the command, as an
    /// operator may put it).
    pub fn run(&self, args: &[&str]) -> Output {
        let mut all = args.to_vec();
        all.extend(["--config", self.config_s()]);
        primary(&all)
    }

    pub fn run_stdin(&self, args: &[&str], bytes: &[u8]) -> Output {
        let mut all = args.to_vec();
        all.extend(["--config", self.config_s()]);
        primary_stdin(&all, bytes)
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// `primary serve`, once `primary status` answers.
    pub fn serve(&self) -> Daemon {
        let log = self.dir.path().join("serve.log");
        let child = command()
            .args(["serve", "--config", self.config_s()])
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("log file"))
            .spawn()
            .expect("spawn primary serve");
        let mut d = Daemon { child, log };
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if self.run(&["status"]).status.success() {
                return d;
            }
            if let Ok(Some(status)) = d.child.try_wait() {
                panic!("primary serve exited ({status}): {}", d.log_text());
            }
            assert!(
                Instant::now() < deadline,
                "primary serve did not answer status: {}",
                d.log_text()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// A running `primary serve`, killed on drop.
pub struct Daemon {
    pub child: Child,
    pub log: PathBuf,
}

impl Daemon {
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Files in `dir` whose names contain `part`.
pub fn files_named(dir: &Path, part: &str) -> Vec<String> {
    std::fs::read_dir(dir)
        .expect("read dir")
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains(part))
        .collect()
}
