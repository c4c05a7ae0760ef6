//! Daemons as child processes of a test (`twinlog-test-child daemon`), on
//! loopback ports of their own, killed when the test lets go of them.
//! Included by path by the tests that start them.

#![allow(dead_code)] // each test uses its own part

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

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
pub struct Daemon(testkit::Guard);

impl Daemon {
    pub fn start(role: &str, config: &Path, log: &Path) -> Daemon {
        Daemon(testkit::Guard::new(spawn(role, config, log)))
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
        Daemon(testkit::Guard::new(child))
    }

    /// User and system CPU the process has spent, in seconds.
    pub fn cpu_secs(&self) -> f64 {
        testkit::procfs::cpu_secs(self.pid()).expect("the daemon's /proc/PID/stat")
    }

    /// Send `signal` (`libc::SIGSTOP`, `SIGCONT`...).
    pub fn signal(&self, signal: libc::c_int) {
        self.0.signal(signal).expect("kill(2)");
    }

    /// Whether every thread of the process is stopped (SIGSTOP took hold).
    pub fn stopped(&self) -> bool {
        testkit::procfs::all_threads_stopped(self.pid())
    }

    /// Whether the process still runs (it may be stopped): it has not
    /// exited.
    pub fn alive(&mut self) -> bool {
        matches!(self.0.try_wait(), Ok(None)) && self.0.running()
    }

    pub fn pid(&self) -> u32 {
        self.0.pid().expect("the daemon runs")
    }

    /// SIGKILL, and reap.
    pub fn kill(&mut self) {
        self.0.kill().expect("SIGKILL");
    }

    /// SIGTERM (a clean stop), and wait for it.
    pub fn stop(&mut self) {
        self.0
            .stop(Duration::from_secs(15))
            .expect("a clean stop after SIGTERM");
    }
}

/// Fast timers (50 ms heartbeats, 600 ms idle timeout) and 1 MiB
/// segments in the configuration at `cfg`, a twin's or a primary's.
pub fn fast(cfg: &Path, twin: bool) {
    use twinlog::daemon::{self, PrimaryConfig, TwinConfig};
    let timers = daemon::config::TimersSection {
        heartbeat_ms: 50,
        idle_timeout_ms: 600,
    };
    if twin {
        let mut t = TwinConfig::load(cfg).expect("load");
        t.timers = timers;
        t.segment_bytes = 1 << 20;
        std::fs::write(cfg, t.render()).expect("write");
    } else {
        let mut p = PrimaryConfig::load(cfg).expect("load");
        p.timers = timers;
        p.segment_bytes = 1 << 20;
        std::fs::write(cfg, p.render()).expect("write");
    }
}

/// A primary's `/status` at `metrics`, once it answers.
pub fn pstatus(metrics: std::net::SocketAddr) -> Option<twinlog::node::Status> {
    twinlog::daemon::fetch_status::<twinlog::node::Status>(metrics)
        .ok()
        .map(|(_, s)| s)
}

/// A twin's `/status` at `metrics`, once it answers as a twin.
pub fn tstatus(metrics: std::net::SocketAddr) -> Option<twinlog::node::TwinStatus> {
    twinlog::daemon::fetch_status::<twinlog::node::TwinStatus>(metrics)
        .ok()
        .map(|(_, s)| s)
        .filter(|s| s.role == "twin")
}
