//! The real `primary` and `twin` binaries as host processes, for the drills
//! that break them: starting, SIGKILL and SIGTERM, the binaries' commands,
//! a primary and twin pair minted through the library, their logs read
//! without a lock, and the raw files of a data directory scanned for a byte
//! string.

use std::collections::BTreeMap;
use std::io::Read;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use twinlog::daemon::{self, PrimaryConfig, TwinConfig};
use twinlog::log::Tail;
use twinlog::net::{Fingerprint, Identity};
use twinlog::node::{Client, Status, TwinStatus};

use crate::{Context, DrillError, Result};

/// A process of one of the binaries, SIGKILLed if the drill ends first.
pub struct Proc {
    child: testkit::Guard,
    bin: PathBuf,
    args: Vec<String>,
    stderr: PathBuf,
}

impl Proc {
    /// Start `bin args...`, its stderr appended to `stderr`, stdout piped.
    pub fn start(bin: &Path, args: &[String], stderr: &Path) -> Result<Proc> {
        let mut p = Proc {
            child: testkit::Guard::default(),
            bin: bin.to_owned(),
            args: args.to_vec(),
            stderr: stderr.to_owned(),
        };
        p.restart()?;
        Ok(p)
    }

    /// `bin serve --config CONFIG`.
    pub fn serve(bin: &Path, config: &Path, stderr: &Path) -> Result<Proc> {
        Proc::start(
            bin,
            &[
                "serve".into(),
                "--config".into(),
                config.display().to_string(),
            ],
            stderr,
        )
    }

    pub fn restart(&mut self) -> Result<()> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.stderr)
            .ctx(|| format!("open {}", self.stderr.display()))?;
        let child = Command::new(&self.bin)
            .args(&self.args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .ctx(|| format!("start {} {:?}", self.bin.display(), self.args))?;
        self.child = testkit::Guard::new(child);
        Ok(())
    }

    pub fn running(&self) -> bool {
        self.child.running()
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.pid()
    }

    /// Bytes the process has handed to write(2) and its kin so far
    /// (`wchar` of /proc/PID/io): how far it got writing an entry.
    pub fn written(&self) -> Option<u64> {
        let io = std::fs::read_to_string(format!("/proc/{}/io", self.pid()?)).ok()?;
        io.lines()
            .find_map(|l| l.strip_prefix("wchar: "))
            .and_then(|v| v.trim().parse().ok())
    }

    /// The exit status if the process ended by itself (and its stdout).
    pub fn try_finished(&mut self) -> Result<Option<(std::process::ExitStatus, String)>> {
        let Some(status) = self.child.try_wait().ctx(|| "poll a child".into())? else {
            return Ok(None);
        };
        let mut out = String::new();
        if let Some(mut o) = self.child.take().and_then(|mut c| c.stdout.take()) {
            o.read_to_string(&mut out)
                .ctx(|| "read a child's stdout".into())?;
        }
        Ok(Some((status, out)))
    }

    pub fn sigkill(&mut self) -> Result<()> {
        self.child
            .kill()
            .ctx(|| format!("SIGKILL {}", self.bin.display()))
    }

    /// SIGTERM, a clean shutdown, and wait for it (SIGKILL after 20 s).
    pub fn stop(&mut self) -> Result<()> {
        self.child
            .stop(Duration::from_secs(20))
            .map(|_| ())
            .ctx(|| format!("stopping {}", self.bin.display()))
    }
}

/// Run a command of one of the binaries to its end; its stdout, or an
/// error with its stderr.
pub fn run(bin: &Path, args: &[&str]) -> Result<String> {
    let out: Output = Command::new(bin)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .ctx(|| format!("run {} {args:?}", bin.display()))?;
    if !out.status.success() {
        return Err(DrillError(format!(
            "{} {args:?}: {}: {}",
            bin.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    String::from_utf8(out.stdout).ctx(|| format!("{} {args:?}: stdout", bin.display()))
}

/// A free UDP port on loopback.
pub fn free_udp() -> Result<SocketAddr> {
    Ok(testkit::free_udp())
}

/// A free TCP port on loopback.
pub fn free_tcp() -> Result<SocketAddr> {
    Ok(testkit::free_tcp())
}

/// The two binaries.
#[derive(Clone, Debug)]
pub struct Bins {
    pub primary: PathBuf,
    pub twin: PathBuf,
}

/// How a pair is set up.
#[derive(Clone, Debug)]
pub struct PairOpts {
    pub segment_bytes: u64,
    /// `[retention] max_bytes` of the primary (0: none).
    pub max_bytes: u64,
    /// Restores served by the twin on this address, to this box.
    pub restore: Option<(SocketAddr, Fingerprint)>,
}

impl Default for PairOpts {
    fn default() -> Self {
        PairOpts {
            segment_bytes: 1 << 20,
            max_bytes: 0,
            restore: None,
        }
    }
}

/// A primary and a twin, initialised (not started) under `work`.
pub struct Pair {
    pub pdir: PathBuf,
    pub tdir: PathBuf,
    pub pcfg: PathBuf,
    pub tcfg: PathBuf,
    pub primary_fp: Fingerprint,
    pub twin_fp: Fingerprint,
    pub listen: SocketAddr,
    pub primary_metrics: SocketAddr,
    pub twin_metrics: SocketAddr,
}

/// 50 ms heartbeats, 600 ms idle timeout: a dead peer is noticed quickly.
pub fn fast_timers() -> daemon::config::TimersSection {
    daemon::config::TimersSection {
        heartbeat_ms: 50,
        idle_timeout_ms: 600,
    }
}

impl Pair {
    pub fn init(work: &Path, opts: &PairOpts) -> Result<Pair> {
        let (pdir, tdir) = (work.join("primary"), work.join("twin"));
        let listen = free_udp()?;
        let (primary_metrics, twin_metrics) = (free_tcp()?, free_tcp()?);
        let (tcfg, twin_fp) =
            daemon::init_twin(&tdir, listen, twin_metrics, None).ctx(|| "init the twin".into())?;
        let (pcfg, primary_fp) =
            daemon::init_primary(&pdir, listen, primary_metrics, Some(twin_fp))
                .ctx(|| "init the primary".into())?;
        daemon::pin_primary(&tcfg, primary_fp).ctx(|| "pin the primary".into())?;
        if let Some((addr, fp)) = opts.restore {
            daemon::pin_restore(&tcfg, fp, Some(addr), None)
                .ctx(|| "pin the restoring box".into())?;
        }
        let mut p = PrimaryConfig::load(&pcfg).ctx(|| "load primary.toml".into())?;
        p.timers = fast_timers();
        p.segment_bytes = opts.segment_bytes;
        p.retention.max_bytes = opts.max_bytes;
        std::fs::write(&pcfg, p.render()).ctx(|| "write primary.toml".into())?;
        let mut t = TwinConfig::load(&tcfg).ctx(|| "load twin.toml".into())?;
        t.timers = fast_timers();
        t.segment_bytes = opts.segment_bytes;
        std::fs::write(&tcfg, t.render()).ctx(|| "write twin.toml".into())?;
        Ok(Pair {
            pdir,
            tdir,
            pcfg,
            tcfg,
            primary_fp,
            twin_fp,
            listen,
            primary_metrics,
            twin_metrics,
        })
    }

    pub fn plog(&self) -> PathBuf {
        self.pdir.join(daemon::LOG_DIR)
    }

    pub fn tlog(&self) -> PathBuf {
        self.tdir.join(daemon::LOG_DIR)
    }

    pub fn admin(&self) -> Result<Identity> {
        admin_identity(&self.pdir)
    }
}

pub fn admin_identity(pdir: &Path) -> Result<Identity> {
    daemon::load_identity(&pdir.join(daemon::ADMIN_DIR)).ctx(|| "the admin identity".into())
}

/// A client of the primary at `addr`, retried until `limit`.
pub async fn connect(
    admin: &Identity,
    fp: Fingerprint,
    addr: SocketAddr,
    limit: Duration,
) -> Result<Client> {
    let deadline = Instant::now() + limit;
    loop {
        match Client::connect(admin, fp, addr).await {
            Ok(c) => return Ok(c),
            Err(e) if Instant::now() > deadline => {
                return Err(DrillError(format!("connect to the primary at {addr}: {e}")))
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}

/// The primary's status from its metrics address, as `status --json` reads it.
pub fn primary_status(metrics: SocketAddr) -> Result<Status> {
    daemon::fetch_status::<Status>(metrics)
        .map(|(_, s)| s)
        .ctx(|| format!("the primary's status at {metrics}"))
}

pub fn twin_status(metrics: SocketAddr) -> Result<TwinStatus> {
    daemon::fetch_status::<TwinStatus>(metrics)
        .map(|(_, s)| s)
        .ctx(|| format!("the twin's status at {metrics}"))
}

/// The primary's status, off the async threads; None while it does not
/// answer.
pub async fn primary_status_now(metrics: SocketAddr) -> Option<Status> {
    tokio::task::spawn_blocking(move || primary_status(metrics).ok())
        .await
        .ok()
        .flatten()
}

/// The twin's status, off the async threads; None while it does not
/// answer, or while the box answering is no twin (a promoted one).
pub async fn twin_status_now(metrics: SocketAddr) -> Option<TwinStatus> {
    tokio::task::spawn_blocking(move || twin_status(metrics).ok())
        .await
        .ok()
        .flatten()
        .filter(|s| s.role == "twin")
}

/// One frame as a checker keeps it: the whole frame for small ones, its
/// length and crc for large ones (memory stays bounded).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Seen {
    pub kind: u16,
    pub meta: Vec<u8>,
    pub blob_len: u64,
    pub blob_crc: u32,
    /// The blob itself, when at most `keep` bytes.
    pub blob: Option<Vec<u8>>,
}

/// Every frame of a log directory from `from` (0: the oldest), read
/// without taking its lock; blobs over `keep` bytes kept as crcs.
pub fn read_log(dir: &Path, from: u64, keep: usize) -> Result<BTreeMap<u64, Seen>> {
    let mut out = BTreeMap::new();
    let mut tail = Tail::open(dir, from).ctx(|| format!("tail {}", dir.display()))?;
    while let Some(f) = tail
        .next()
        .ctx(|| format!("read {} at frame {}", dir.display(), out.len()))?
    {
        out.insert(
            f.seq,
            Seen {
                kind: f.kind,
                meta: f.meta.to_vec(),
                blob_len: f.blob.len() as u64,
                blob_crc: crc32fast::hash(f.blob),
                blob: (f.blob.len() <= keep).then(|| f.blob.to_vec()),
            },
        );
    }
    Ok(out)
}

/// The last sequence of a log directory that a tail sees (0: none).
pub fn tail_head(dir: &Path) -> u64 {
    let Ok(mut tail) = Tail::open(dir, 0) else {
        return 0;
    };
    let mut last = 0;
    while let Ok(Some(h)) = tail.next_checked() {
        last = h.seq;
    }
    last
}

/// Two logs compared frame by frame, blob bytes included, from `from` to
/// the end of either: (frames equal, frames differing or on one side only,
/// the first few of them named). Both are read without their locks.
pub fn compare_logs(a: &Path, b: &Path, from: u64) -> Result<(u64, u64, Vec<String>)> {
    let mut ta = Tail::open(a, from).ctx(|| format!("tail {}", a.display()))?;
    let mut tb = Tail::open(b, from).ctx(|| format!("tail {}", b.display()))?;
    let (mut equal, mut differ, mut named) = (0u64, 0u64, Vec::new());
    loop {
        let fa = ta.next().ctx(|| format!("read {}", a.display()))?;
        let fb = tb.next().ctx(|| format!("read {}", b.display()))?;
        match (fa, fb) {
            (None, None) => break,
            (Some(x), Some(y)) => {
                if x.seq == y.seq && x.kind == y.kind && x.meta == y.meta && x.blob == y.blob {
                    equal += 1;
                } else {
                    differ += 1;
                    if named.len() < 5 {
                        named.push(format!(
                            "frame {} (kind {}, {} bytes) against frame {} (kind {}, {} bytes)",
                            x.seq,
                            x.kind,
                            x.blob.len(),
                            y.seq,
                            y.kind,
                            y.blob.len()
                        ));
                    }
                }
            }
            (Some(x), None) => {
                differ += 1;
                if named.len() < 5 {
                    named.push(format!("frame {} only in {}", x.seq, a.display()));
                }
            }
            (None, Some(y)) => {
                differ += 1;
                if named.len() < 5 {
                    named.push(format!("frame {} only in {}", y.seq, b.display()));
                }
            }
        }
    }
    Ok((equal, differ, named))
}

/// Files under `dir` whose bytes contain `needle` (read a piece at a time,
/// with an overlap so a match across two pieces is found); and how many
/// files and bytes were scanned.
pub fn scan_for(dir: &Path, needle: &[u8]) -> Result<(Vec<PathBuf>, u64, u64)> {
    let mut found = Vec::new();
    let (mut files, mut bytes) = (0u64, 0u64);
    let mut stack = vec![dir.to_owned()];
    let piece = 4 << 20;
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).ctx(|| format!("list {}", d.display()))? {
            let e = e.ctx(|| format!("list {}", d.display()))?;
            let path = e.path();
            let t = e.file_type().ctx(|| format!("stat {}", path.display()))?;
            if t.is_dir() {
                stack.push(path);
                continue;
            }
            if !t.is_file() {
                continue;
            }
            // A file may go between the listing and the open (a rename).
            let Ok(mut f) = std::fs::File::open(&path) else {
                continue;
            };
            files += 1;
            let mut buf = vec![0u8; piece + needle.len()];
            let mut carry = 0usize;
            loop {
                let n = f
                    .read(&mut buf[carry..])
                    .ctx(|| format!("read {}", path.display()))?;
                if n == 0 {
                    break;
                }
                bytes += n as u64;
                let have = carry + n;
                if buf[..have].windows(needle.len()).any(|w| w == needle) {
                    found.push(path.clone());
                    break;
                }
                let keep = (needle.len() - 1).min(have);
                buf.copy_within(have - keep..have, 0);
                carry = keep;
            }
        }
    }
    Ok((found, files, bytes))
}

/// Wait until `f` answers Some, polling every `every`; None after `limit`.
pub async fn wait_for<T>(
    limit: Duration,
    every: Duration,
    mut f: impl FnMut() -> Option<T>,
) -> Option<T> {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if Instant::now() > deadline {
            return None;
        }
        tokio::time::sleep(every).await;
    }
}

/// Sum of the file lengths in a log directory: the bytes the log holds on
/// disk (preallocated room of the open segment included).
pub fn dir_bytes(dir: &Path) -> u64 {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return 0;
    };
    rd.filter_map(|e| e.ok())
        .filter_map(|e| e.metadata().ok())
        .filter(|m| m.is_file())
        .map(|m| m.len())
        .sum()
}

/// The length of the newest segment file in a log directory: how far a
/// large entry being written into it has got.
pub fn newest_segment_len(dir: &Path) -> u64 {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return 0;
    };
    rd.filter_map(|e| e.ok())
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let first = twinlog::log::format::parse_segment_name(&name)?;
            Some((first, e.metadata().ok()?.len()))
        })
        .max_by_key(|(first, _)| *first)
        .map_or(0, |(_, len)| len)
}

/// Round to one decimal, for the JSON figures.
pub fn tenths(x: f64) -> f64 {
    (x * 10.0).round() / 10.0
}
