//! Daemons as child processes of a test (`twinlog-test-child daemon`), on
//! loopback ports of their own. Included by path by the tests that start
//! them.

#![allow(dead_code)] // each test uses its own part

use std::path::Path;
use std::process::{Child, Command, Stdio};

/// Start the daemon of `role` (`primary`, `twin`) on `config`, its logs
/// appended to `log`.
pub fn spawn(role: &str, config: &Path, log: &Path) -> Child {
    Command::new(env!("CARGO_BIN_EXE_twinlog-test-child"))
        .args(["daemon", role])
        .arg(config)
        .stdout(Stdio::null())
        .stderr(log_file(log))
        .spawn()
        .expect("spawn daemon")
}

/// A daemon's stderr, appended to `log`.
fn log_file(log: &Path) -> std::fs::File {
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .expect("log file")
}

/// A daemon that is killed when the test lets go of it, passed or failed.
pub struct Daemon(Child);

impl Daemon {
    pub fn start(role: &str, config: &Path, log: &Path) -> Daemon {
        Daemon(spawn(role, config, log))
    }

    /// Start it with at most `fds` open file descriptors (`ulimit -n`).
    pub fn start_with_fd_limit(role: &str, config: &Path, log: &Path, fds: u32) -> Daemon {
        let child = Command::new("sh")
            .arg("-c")
            .arg(format!(
                "ulimit -n {fds} && exec \"$0\" daemon \"$1\" \"$2\""
            ))
            .arg(env!("CARGO_BIN_EXE_twinlog-test-child"))
            .arg(role)
            .arg(config)
            .stdout(Stdio::null())
            .stderr(log_file(log))
            .spawn()
            .expect("spawn daemon");
        Daemon(child)
    }

    /// User and system CPU the process has spent, in seconds.
    pub fn cpu_secs(&self) -> f64 {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.0.id())).expect("stat");
        // `pid (comm) S ...`: utime and stime are the 12th and 13th fields
        // after the state.
        let fields: Vec<&str> = stat
            .rsplit_once(')')
            .expect("a stat line")
            .1
            .split_whitespace()
            .collect();
        let ticks: u64 =
            fields[11].parse::<u64>().expect("utime") + fields[12].parse::<u64>().expect("stime");
        // SAFETY: sysconf reads a constant of the system.
        let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
        ticks as f64 / hz
    }

    /// Send `signal` (`STOP`, `CONT`, `TERM`...).
    pub fn signal(&self, signal: &str) {
        let sent = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(self.0.id().to_string())
            .status()
            .expect("kill");
        assert!(sent.success(), "kill -{signal}");
    }

    /// Whether every thread of the process is stopped (SIGSTOP took hold:
    /// a signal is delivered to each thread in its own time).
    pub fn stopped(&self) -> bool {
        let tasks = format!("/proc/{}/task", self.0.id());
        let Ok(threads) = std::fs::read_dir(tasks) else {
            return false;
        };
        threads.filter_map(|t| t.ok()).all(|t| {
            // `pid (comm) S ...`: the state follows the last parenthesis.
            std::fs::read_to_string(t.path().join("stat")).is_ok_and(|stat| {
                stat.rsplit_once(')')
                    .is_some_and(|(_, rest)| rest.trim_start().starts_with('T'))
            })
        })
    }

    pub fn pid(&self) -> u32 {
        self.0.id()
    }

    /// SIGKILL, and reap.
    pub fn kill(&mut self) {
        self.0.kill().expect("SIGKILL");
        self.0.wait().expect("reap");
    }

    /// SIGTERM (a clean stop), and reap.
    pub fn stop(mut self) {
        self.signal("TERM");
        self.0.wait().expect("reap");
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}
