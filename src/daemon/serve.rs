//! What both daemons share while they serve: tracing, signals, the log and
//! store they open, the status server, and how a run ends.

use super::*;

/// Structured logs to stderr: human by default, JSON lines on request.
/// `RUST_LOG` filters (default `info`).
pub fn init_tracing(json: bool) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr);
    let _ = if json {
        builder.json().try_init()
    } else {
        builder.try_init()
    };
}

/// A watch that turns true on SIGTERM or SIGINT.
pub fn shutdown_on_signals() -> Result<watch::Receiver<bool>, DaemonError> {
    use tokio::signal::unix::{signal, SignalKind};
    let (tx, rx) = watch::channel(false);
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    tokio::spawn(async move {
        tokio::select! {
            _ = term.recv() => tracing::info!("SIGTERM: shutting down"),
            _ = int.recv() => tracing::info!("SIGINT: shutting down"),
        }
        // Before the stop begins, so a supervisor never takes the stop
        // for a crash.
        notify::notify("STOPPING=1");
        let _ = tx.send(true);
    });
    Ok(rx)
}

pub(crate) fn open_log(data_dir: &Path, segment_bytes: u64) -> Result<Arc<Log>, DaemonError> {
    Ok(Arc::new(Log::open_opts(
        data_dir.join(LOG_DIR),
        LogOptions {
            segment_bytes,
            ..LogOptions::default()
        },
    )?))
}

/// The snapshots a box offers (to its twin, or to a box it restores), kept
/// in its data directory.
pub(super) fn snapshot_source(
    store: &Arc<crate::node::store_host::StoreHost>,
    data_dir: &Path,
) -> Arc<crate::node::snapshot_transfer::SnapshotSource> {
    crate::node::snapshot_transfer::SnapshotSource::new(
        store.clone(),
        &data_dir.join(SNAPSHOTS_DIR),
        Some(data_dir.join(crate::store::install::BASE_FILE)),
    )
}

/// Every copy an erase must reach beside the log and the store: a
/// rejoin's saved tails (and stores it set aside), a snapshot staged
/// before the erase, and, with `archive`, the archived segments (the
/// erase is queued for the archiver, durably, before the store counts it
/// applied).
fn erase_copies(data_dir: &Path, archive: bool) -> crate::store::EraseAlso {
    let data_dir = data_dir.to_owned();
    Arc::new(move |seq, before, repos| {
        if archive {
            crate::archive::erase::EraseQueue::at(&data_dir).push(
                crate::archive::erase::PendingErase {
                    seq,
                    before,
                    repos: repos.to_vec(),
                },
            )?;
        }
        let paths = crate::store::install::InstallPaths {
            data: data_dir.clone(),
        };
        crate::store::install::drop_staged_before(&paths, seq)?;
        crate::node::divergent::erase(&data_dir, before, repos)
    })
}

/// The store beside the log, caught up with it before anything is served.
/// Wake `applier` each time the durable head moves, then let `pause` pass
/// before the next wake: a burst of durable batches costs one catch-up.
pub(super) fn follow_durable(
    applier: &crate::node::store_host::Applier,
    mut durable: watch::Receiver<u64>,
    pause: std::time::Duration,
) -> tokio::task::JoinHandle<()> {
    let waker = applier.waker();
    tokio::spawn(async move {
        waker.wake();
        while durable.changed().await.is_ok() {
            waker.wake();
            tokio::time::sleep(pause).await;
        }
    })
}

/// After serving: the log synced, the store's applier stopped once it
/// has walked what is durable, and the status server ended.
pub(super) async fn wind_down(
    log: &Log,
    follow: tokio::task::JoinHandle<()>,
    applier: crate::node::store_host::Applier,
    status_server: tokio::task::JoinHandle<()>,
    role: &str,
) -> Result<(), DaemonError> {
    log.sync()?;
    follow.abort();
    let _ = follow.await;
    tokio::task::spawn_blocking(move || applier.stop())
        .await
        .map_err(|error| DaemonError::Task {
            what: "stopping the store",
            error,
        })?;
    let _ = status_server.await;
    tracing::info!(head = log.head_seq(), "{role} stopped");
    Ok(())
}

pub(super) async fn open_store(
    log: &Arc<Log>,
    data_dir: &Path,
    archive: bool,
) -> Result<Arc<crate::node::store_host::StoreHost>, DaemonError> {
    let log = log.clone();
    let dir = data_dir.join(STORE_DIR);
    let also = erase_copies(data_dir, archive);
    Ok(tokio::task::spawn_blocking(move || {
        crate::node::store_host::StoreHost::open_with(
            log,
            &dir,
            crate::store::StoreOptions::default(),
            Some(also),
        )
    })
    .await
    .map_err(|error| DaemonError::Task {
        what: "opening the store",
        error,
    })??)
}

/// Why a daemon is not ready (its `/readyz` answer), read from its
/// status; the texts in it are the status's own.
#[derive(Debug, thiserror::Error)]
pub enum NotReady {
    #[error("the log is poisoned: {0}")]
    LogPoisoned(String),
    #[error("held ({by}): this primary acknowledges no write")]
    Held { by: String },
    #[error("fenced: epoch {} exists ({by}); this primary acknowledges no write", crate::repl::epochs::EpochName(*.epoch))]
    Fenced { epoch: u64, by: String },
    #[error("the store is stopped at frame {seq}: {error}")]
    StoreStopped { seq: u64, error: String },
    #[error("not serving yet: {0}")]
    Waiting(String),
    #[error("not following the primary: {}", .why.as_deref().unwrap_or("not connected yet"))]
    NotFollowing { why: Option<String> },
}

/// Serve `/status` (`status()` as JSON) and `/metrics` (the log's metrics,
/// then what `more` adds from the same status) on `addr` until `shutdown`.
/// Nothing it holds may keep the log alive: `status` too holds it weakly
/// where it can outlive the serve.
///
/// `/healthz` answers 200 while the daemon serves; `/readyz` answers 200
/// when `ready` says the box does its job, 503 with the reason otherwise,
/// for load balancers and orchestrators.
pub(super) async fn serve_status<S: serde::Serialize + 'static>(
    addr: &Address,
    shutdown: watch::Receiver<bool>,
    log: std::sync::Weak<Log>,
    role: &'static str,
    status: impl Fn() -> S + Send + Sync + 'static,
    ready: impl Fn(&S) -> Result<(), NotReady> + Send + Sync + 'static,
    more: impl Fn(&S, &mut String) + Send + Sync + 'static,
) -> Result<tokio::task::JoinHandle<()>, DaemonError> {
    let listener = tokio::net::TcpListener::bind(resolve("metrics", addr)?)
        .await
        .map_err(|e| listen_failed("metrics", addr, &e))?;
    let handler: http::Handler = Arc::new(move |path| {
        match path {
            "/healthz" => return Some((200, "text/plain", "ok\n".into())),
            "/readyz" => {
                return Some(match ready(&status()) {
                    Ok(()) => (200, "text/plain", "ready\n".into()),
                    Err(why) => (503, "text/plain", format!("not ready: {why}\n")),
                })
            }
            _ => {}
        }
        let s = status();
        match path {
            "/status" => Some((
                200,
                "application/json",
                serde_json::to_string(&s).unwrap_or_default(),
            )),
            "/metrics" => {
                // Held weakly: a request in flight never keeps the log
                // (and its lock) past the serve, which a rejoin needs.
                let mut out = log.upgrade().map(|l| log_metrics(&l)).unwrap_or_default();
                out.push_str(&format!(
                    "# HELP twinlog_build_info The build and the role this daemon serves.\n\
                     # TYPE twinlog_build_info gauge\n\
                     twinlog_build_info{{version=\"{}\",role=\"{role}\"}} 1\n",
                    env!("CARGO_PKG_VERSION")
                ));
                more(&s, &mut out);
                Some((200, "text/plain; version=0.0.4", out))
            }
            _ => None,
        }
    });
    Ok(tokio::spawn(http::serve(listener, handler, shutdown)))
}

/// How a daemon's run ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Served {
    /// Asked to stop.
    Stopped,
    /// A switchover made this primary the new primary's twin: serve it
    /// with `twin serve --config` this file.
    Deposed { twin_config: PathBuf },
    /// A switchover made this twin the primary: serve it with `primary
    /// serve --config` this file.
    Promoted { primary_config: PathBuf },
    /// Under an arbiter, a newer term leads: this primary rejoins it as
    /// its twin (`auto_rejoin`).
    Replaced {
        leader: crate::repl::arbiter::LeaderRecord,
    },
    /// Under an arbiter, etcd said this life's lease is gone: the daemon
    /// starts again, as a new life if etcd gives it one.
    LeaseLost,
}

/// Stops when `outer` turns true, or `grace` after `inner` fires: a
/// daemon's own shutdown, which a role change also triggers.
pub(super) fn stop_on<T: Send + Sync + 'static>(
    mut outer: watch::Receiver<bool>,
    mut inner: watch::Receiver<T>,
    fired: impl Fn(&T) -> bool + Send + Sync + 'static,
    grace: std::time::Duration,
) -> watch::Receiver<bool> {
    let (tx, rx) = watch::channel(*outer.borrow());
    tokio::spawn(async move {
        tokio::select! {
            _ = outer.wait_for(|&s| s) => {}
            _ = async {
                let _ = inner.wait_for(|v| fired(v)).await;
                tokio::time::sleep(grace).await;
            } => {}
        }
        let _ = tx.send(true);
    });
    rx
}

/// How long a deposed primary goes on answering after a switchover, so
/// that clients writing to it learn where the new primary is (`Fenced`
/// names it) instead of losing their connection.
pub(super) const DEPOSED_GRACE: std::time::Duration = std::time::Duration::from_millis(250);
