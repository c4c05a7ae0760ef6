//! A real etcd for tests and drills: Debian's `etcd-server` started on
//! loopback in a directory of the caller's, one member, killed on drop.
//! It can be stopped (SIGSTOP, as a box cut off from it sees it), killed
//! and started again on the same data, as a failover's arbiter is in
//! the drills.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::child::Guard;

/// Where etcd is unless `ETCD_BIN` says otherwise: Debian's package.
pub const DEFAULT_BIN: &str = "/usr/bin/etcd";

/// How long a fresh member may take to answer its health check.
const HEALTHY_WITHIN: Duration = Duration::from_secs(30);

/// One etcd member on loopback.
#[derive(Debug)]
pub struct Etcd {
    dir: PathBuf,
    client: SocketAddr,
    peer: SocketAddr,
    process: Guard,
}

impl Etcd {
    /// Start a member with its data and log in `dir`, and wait until it
    /// is healthy.
    /// A port taken between choosing it and etcd binding it (other tests
    /// choose ports too) ends the member at once: it is started again on
    /// other ports, a few times.
    pub fn start(dir: &Path) -> io::Result<Etcd> {
        std::fs::create_dir_all(dir)?;
        let mut tries = 0;
        loop {
            let (client, peer) = two_ports()?;
            let mut etcd = Etcd {
                dir: dir.to_owned(),
                client,
                peer,
                process: Guard::default(),
            };
            match etcd.spawn() {
                Ok(()) => return Ok(etcd),
                Err(e) if e.kind() == io::ErrorKind::AddrInUse && tries < 3 => tries += 1,
                Err(e) => return Err(e),
            }
        }
    }

    /// The binary: `ETCD_BIN`, else Debian's.
    pub fn binary() -> PathBuf {
        std::env::var_os("ETCD_BIN").map_or_else(|| PathBuf::from(DEFAULT_BIN), PathBuf::from)
    }

    fn spawn(&mut self) -> io::Result<()> {
        let bin = Self::binary();
        if !bin.exists() {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!(
                    "{} is missing: install Debian's etcd-server (the test command, scripts/test.sh, does) or set ETCD_BIN",
                    bin.display()
                ),
            ));
        }
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("etcd.log"))?;
        let (client, peer) = (
            format!("http://{}", self.client),
            format!("http://{}", self.peer),
        );
        let child = Command::new(&bin)
            .arg("--name=test")
            .arg(format!("--data-dir={}", self.dir.join("data").display()))
            .arg(format!("--listen-client-urls={client}"))
            .arg(format!("--advertise-client-urls={client}"))
            .arg(format!("--listen-peer-urls={peer}"))
            .arg(format!("--initial-advertise-peer-urls={peer}"))
            .arg(format!("--initial-cluster=test={peer}"))
            // Loopback and a test's lifetime: no need for a snapshot's
            // worth of history.
            .arg("--snapshot-count=10000")
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()?;
        self.process = Guard::new(child);
        self.wait_healthy()
    }

    fn wait_healthy(&mut self) -> io::Result<()> {
        let by = Instant::now() + HEALTHY_WITHIN;
        loop {
            if let Some(status) = self.process.try_wait()? {
                let log = self.dir.join("etcd.log");
                let said = std::fs::read_to_string(&log).unwrap_or_default();
                let kind = if said.contains("address already in use") {
                    io::ErrorKind::AddrInUse
                } else {
                    io::ErrorKind::Other
                };
                self.process.take();
                return Err(io::Error::new(
                    kind,
                    format!(
                        "etcd exited ({status}) before it was healthy; its log: {}",
                        log.display()
                    ),
                ));
            }
            if self.healthy() {
                return Ok(());
            }
            if Instant::now() >= by {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("etcd not healthy within {HEALTHY_WITHIN:?}"),
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Whether it answers its health check now (`GET /health`).
    pub fn healthy(&self) -> bool {
        let ask = || -> io::Result<String> {
            let mut s = TcpStream::connect_timeout(&self.client, Duration::from_millis(500))?;
            s.set_read_timeout(Some(Duration::from_secs(2)))?;
            s.write_all(b"GET /health HTTP/1.0\r\nHost: localhost\r\n\r\n")?;
            let mut body = String::new();
            s.read_to_string(&mut body)?;
            Ok(body)
        };
        ask().is_ok_and(|b| b.contains("\"health\":\"true\""))
    }

    /// The client URL, as etcd clients take it.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.client)
    }

    /// The client address.
    pub fn client_addr(&self) -> SocketAddr {
        self.client
    }

    pub fn pid(&self) -> Option<u32> {
        self.process.pid()
    }

    /// Freeze it (SIGSTOP): it holds its sockets and answers nothing, as a
    /// member behind a cut link. Returns once every thread of it stopped
    /// (a signal is delivered after kill(2) returns).
    pub fn pause(&self) -> io::Result<()> {
        self.process.signal(libc::SIGSTOP)?;
        let Some(pid) = self.pid() else {
            return Ok(());
        };
        let by = Instant::now() + Duration::from_secs(10);
        while !crate::procfs::all_threads_stopped(pid) {
            if Instant::now() >= by {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "etcd's threads did not all stop within 10 s of SIGSTOP",
                ));
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        Ok(())
    }

    /// Thaw it (SIGCONT).
    pub fn resume(&self) -> io::Result<()> {
        self.process.signal(libc::SIGCONT)
    }

    /// SIGKILL it; its data stays for [`Etcd::restart`].
    pub fn kill(&mut self) -> io::Result<()> {
        self.resume()?;
        self.process.kill()
    }

    /// Start it again on the same data and ports, and wait until healthy.
    pub fn restart(&mut self) -> io::Result<()> {
        self.kill()?;
        self.spawn()
    }

    /// Lose every key: killed, its data removed, started again empty on
    /// the same ports, as after a lost disk.
    pub fn wipe(&mut self) -> io::Result<()> {
        self.kill()?;
        remove_dir_if_exists(&self.dir.join("data"))?;
        self.spawn()
    }

    /// Copy its data to `to` as it is now, frozen for the copy (a few
    /// milliseconds), as an operator's backup would hold it.
    pub fn snapshot_to(&self, to: &Path) -> io::Result<()> {
        self.pause()?;
        remove_dir_if_exists(to)?;
        let copied = copy_dir(&self.dir.join("data"), to);
        self.resume()?;
        copied
    }

    /// Roll it back to the copy at `from` ([`Etcd::snapshot_to`]): killed,
    /// its data replaced, started again on the same ports.
    pub fn restore_from(&mut self, from: &Path) -> io::Result<()> {
        self.kill()?;
        let data = self.dir.join("data");
        remove_dir_if_exists(&data)?;
        copy_dir(from, &data)?;
        self.spawn()
    }
}

fn remove_dir_if_exists(dir: &Path) -> io::Result<()> {
    match std::fs::remove_dir_all(dir) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// `from`'s tree copied to `to`, modes kept (etcd refuses a data
/// directory others may read).
fn copy_dir(from: &Path, to: &Path) -> io::Result<()> {
    std::fs::create_dir_all(to)?;
    std::fs::set_permissions(to, std::fs::metadata(from)?.permissions())?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let target = to.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            copy_dir(&entry.path(), &target)?;
        } else {
            std::fs::copy(entry.path(), &target)?;
        }
    }
    Ok(())
}

/// Two distinct free ports on loopback, both held while chosen.
fn two_ports() -> io::Result<(SocketAddr, SocketAddr)> {
    let a = std::net::TcpListener::bind("127.0.0.1:0")?;
    let b = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok((a.local_addr()?, b.local_addr()?))
}

#[cfg(test)]
mod tests {
    use super::Etcd;

    #[test]
    fn a_member_starts_healthy_and_stops_answering_while_paused() {
        let dir = std::env::temp_dir().join(format!("testkit-etcd-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let mut etcd = Etcd::start(&dir).expect("etcd starts (scripts/test.sh installs it)");
        assert!(etcd.healthy());
        etcd.pause().expect("SIGSTOP");
        assert!(!etcd.healthy(), "a paused member answers nothing");
        etcd.resume().expect("SIGCONT");
        etcd.restart().expect("restarted on its data");
        assert!(etcd.healthy());
        etcd.kill().expect("killed");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
