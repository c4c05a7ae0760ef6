//! The two boxes of the failover cycle and the operator's commands and
//! readings on them.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use twinlog::daemon::{self, TwinConfig};
use twinlog::net::{Fingerprint, Identity};
use twinlog::node::{Status, TwinStatus};

use drills::daemons::{self, Proc};
use drills::{Context, DrillError, Result};

/// One box: its data directory, identity, addresses, and its daemon.
pub struct Host {
    pub name: &'static str,
    pub data: PathBuf,
    pub fp: Fingerprint,
    /// Where it serves clients as a primary.
    pub listen: SocketAddr,
    /// Its /status and /metrics, in either role.
    pub metrics: SocketAddr,
    pub daemon: Option<Proc>,
}

impl Host {
    pub fn log(&self) -> PathBuf {
        self.data.join(daemon::LOG_DIR)
    }

    pub fn primary_cfg(&self) -> PathBuf {
        self.data.join(daemon::PRIMARY_CONFIG)
    }

    pub fn twin_cfg(&self) -> PathBuf {
        self.data.join(daemon::TWIN_CONFIG)
    }

    pub fn admin(&self) -> Result<Arc<Identity>> {
        daemons::admin_identity(&self.data).map(Arc::new)
    }

    pub fn stderr(&self, work: &Path) -> PathBuf {
        work.join(format!("{}.stderr", self.name))
    }
}

pub fn pstatus(metrics: SocketAddr) -> Option<Status> {
    daemons::primary_status(metrics)
        .ok()
        .filter(|s| s.role == "primary")
}

pub fn tstatus(metrics: SocketAddr) -> Option<TwinStatus> {
    daemons::twin_status(metrics)
        .ok()
        .filter(|s| s.role == "twin")
}

pub async fn until<T>(what: &str, limit: Duration, f: impl FnMut() -> Option<T>) -> Result<T> {
    daemons::wait_for(limit, Duration::from_millis(10), f)
        .await
        .ok_or_else(|| DrillError(format!("{what}: not within {} s", limit.as_secs())))
}

/// The twin's quiet window in this drill: two of the intervals at which a
/// twin records that it heard its primary (1 s).
const QUIET_MS: u64 = 2000;

/// `twin promote` on the stopped twin `y`, its new twin `x`, without
/// `--force`: while the twin's quiet window runs it is refused, and tried
/// again every 100 ms. The window is set in `y`'s `twin.toml` first, as
/// the box's configuration keeps it (a rejoin or a switchover writes that
/// file with the default). Answers what it said and how often it was
/// refused.
pub async fn promote(bins: &daemons::Bins, y: &Host, x: &Host) -> Result<(String, u64)> {
    let mut t = TwinConfig::load(&y.twin_cfg()).ctx(|| "the promoted box's twin.toml".into())?;
    t.promote_quiet_ms = QUIET_MS;
    std::fs::write(y.twin_cfg(), t.render()).ctx(|| "write twin.toml".into())?;
    let (cfg, listen, metrics, fp) = (
        y.twin_cfg().display().to_string(),
        y.listen.to_string(),
        y.metrics.to_string(),
        x.fp.to_string(),
    );
    let args = [
        "promote",
        "--config",
        &cfg,
        "--listen",
        &listen,
        "--metrics",
        &metrics,
        "--twin-fingerprint",
        &fp,
    ];
    let deadline = Instant::now() + Duration::from_millis(QUIET_MS) + Duration::from_secs(20);
    let mut refusals = 0;
    loop {
        match daemons::run(&bins.twin, &args) {
            Ok(said) => return Ok((said, refusals)),
            Err(e) if e.0.contains("heard its primary") && Instant::now() < deadline => {
                refusals += 1;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => return Err(e),
        }
    }
}

pub fn signal(p: &Proc, sig: libc::c_int) -> Result<()> {
    let pid = p
        .pid()
        .and_then(|p| libc::pid_t::try_from(p).ok())
        .ok_or_else(|| DrillError("no pid".into()))?;
    // SAFETY: kill(2) on the pid of a child not reaped.
    if unsafe { libc::kill(pid, sig) } != 0 {
        return Err(DrillError(format!("signal {sig} to {pid} failed")));
    }
    Ok(())
}
