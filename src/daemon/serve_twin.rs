//! Running a twin: its log, store and retention, the restore server, and
//! the store following the durable head.

use super::*;
use crate::node::snapshot_transfer::SnapshotSource;

/// The least time between two wakes of the twin's store applier.
pub(super) const APPLY_PAUSE: std::time::Duration = std::time::Duration::from_millis(20);

/// Run a twin until `shutdown`.
pub async fn serve_twin(
    cfg: TwinConfig,
    shutdown: watch::Receiver<bool>,
) -> Result<Served, DaemonError> {
    restoring::refuse_restoring(&cfg.data_dir)?;
    crate::budget::start_from_env();
    let identity = load_identity(&cfg.data_dir)?;
    let fp = cfg
        .primary_fingerprint
        .ok_or_else(|| DaemonError::PrimaryNotPinned)?;
    let pins = Arc::new(Pins::new().pin(fp, Role::Primary));
    // Resolved once, at start: a new DNS record takes a restart.
    let primary = resolve("primary", &cfg.primary)?;
    let log = open_log(&cfg.data_dir, cfg.segment_bytes)?;
    let paths = crate::store::install::InstallPaths::new(&cfg.data_dir);
    crate::store::install::finish(&paths, &log)?;
    let store = open_store(&log, &cfg.data_dir, cfg.archive.is_some()).await?;
    let endpoint = net::client(&identity, pins)?;
    let epochs = Arc::new(
        Epochs::load(&cfg.data_dir, log.head_seq()).at("reading the epochs in", &cfg.data_dir)?,
    );
    let node = Twin::new(
        log.clone(),
        epochs.clone(),
        primary,
        TwinOptions {
            timers: cfg.timers.timers(),
            ..TwinOptions::default()
        },
    );
    node.set_fingerprint(&identity.fingerprint());
    node.record_heard_in(cfg.data_dir.clone());
    {
        let (cfg, epochs) = (cfg.clone(), epochs.clone());
        node.set_handover(Arc::new(move |head, clients| {
            failover::promote_in_place(&cfg, &epochs, head, clients, None)
                .map_err(|e| crate::node::twin::HandoverFailed::Promotion(Box::new(e)))
        }));
    }
    let shutdown = stop_on(
        shutdown,
        node.watch_promoted(),
        |&p| p,
        std::time::Duration::ZERO,
    );
    let arbiter = match &cfg.failover {
        Some(f) => Some(
            auto_failover::watch_as_twin(
                &cfg,
                f,
                &identity,
                &epochs,
                node.durable(),
                shutdown.clone(),
            )
            .await?,
        ),
        None => None,
    };
    let shutdown = match &arbiter {
        Some((_, took)) => stop_on(
            shutdown,
            took.clone(),
            |t| t.is_some(),
            std::time::Duration::ZERO,
        ),
        None => shutdown,
    };
    node.set_snapshots(crate::node::twin::TwinSnapshots {
        paths,
        store: store.clone(),
    })?;
    let restore_snapshots = serve_restores(&cfg, &identity, &log, &store, &epochs, &shutdown)?;
    let archive = archive::start_archive(
        cfg.archive.as_ref(),
        &cfg.data_dir,
        &log,
        &epochs,
        &store,
        config::Uploader::Twin,
        &shutdown,
    )?;
    start_retention(
        &cfg,
        &node,
        &log,
        &store,
        restore_snapshots,
        archive,
        &shutdown,
    );
    // The store follows the durable head: one catch-up per wake, however
    // many batches became durable meanwhile. Under a steady stream a wake
    // per sync (thousands a second) cost the twin a sixth of its CPU in
    // thread switches and segment opens, for frames that are mostly not
    // the store's: after a wake, the next waits out `APPLY_PAUSE`.
    let applier = crate::node::store_host::Applier::start(store)?;
    let follow = follow_durable(&applier, node.durable(), APPLY_PAUSE);
    super::last_failover::load(&cfg.data_dir);
    let status_node = node.clone();
    let arbiter_shown = arbiter.as_ref().map(|(shown, _)| shown.clone());
    let status_server = serve_status(
        &cfg.metrics,
        shutdown.clone(),
        Arc::downgrade(node.log()),
        "twin",
        move || {
            let mut s = status_node.status();
            s.arbiter = arbiter_shown.as_ref().map(|a| a.borrow().clone());
            s.last_failover = super::last_failover::last();
            s
        },
        twin_ready,
        twin_metrics,
    )
    .await?;
    tracing::info!(
        primary = %cfg.primary, metrics = %cfg.metrics, fingerprint = %identity.fingerprint(),
        head = log.head_seq(), "twin following"
    );
    notify::notify(&format!(
        "READY=1\nSTATUS=twin following {}, head {}",
        cfg.primary,
        log.head_seq()
    ));
    let promoted = node.watch_promoted();
    node.run(endpoint, shutdown).await;
    wind_down(&log, follow, applier, status_server, "twin").await?;
    let took = arbiter.and_then(|(_, took)| took.borrow().clone());
    if let Some(t) = took {
        super::last_failover::began(
            &cfg.data_dir,
            crate::node::failover::last::FailoverCause::LeaseEnded,
            crate::node::clock::instant().saturating_duration_since(t.leader_last_seen),
        );
        // The session ended: nothing more arrives from the old primary.
        let promoted = failover::promote_in_place(
            &cfg,
            &epochs,
            log.head_seq(),
            t.clients.clone(),
            Some(t.epoch),
        );
        let epoch = match promoted {
            Ok((epoch, _)) => epoch,
            Err(e) => {
                // Never leave the pair headless on a take this box
                // refuses: the key goes back, and the twin serves on.
                tracing::error!(error = %e, epoch = %crate::repl::epochs::EpochName(t.epoch), "the take-over could not be recorded here");
                if let Some(f) = &cfg.failover {
                    auto_failover::give_back(&cfg, f, t.lease).await;
                }
                return Ok(Served::LeaseLost);
            }
        };
        tracing::warn!(epoch = %crate::repl::epochs::EpochName(epoch), head = log.head_seq(), "took over from etcd: serving as the primary");
        return Ok(Served::Promoted {
            primary_config: failover::promoted_config(&cfg),
        });
    }
    if *promoted.borrow() {
        super::last_failover::began(
            &cfg.data_dir,
            crate::node::failover::last::FailoverCause::Switchover,
            std::time::Duration::ZERO,
        );
        return Ok(Served::Promoted {
            primary_config: failover::promoted_config(&cfg),
        });
    }
    Ok(Served::Stopped)
}

/// The restore server, when `restore_listen` is set; answers the snapshots
/// it offers, which retention must keep.
fn serve_restores(
    cfg: &TwinConfig,
    identity: &Identity,
    log: &Arc<crate::log::Log>,
    store: &Arc<crate::node::store_host::StoreHost>,
    epochs: &Arc<Epochs>,
    shutdown: &watch::Receiver<bool>,
) -> Result<Option<Arc<SnapshotSource>>, DaemonError> {
    let Some(addr) = &cfg.restore_listen else {
        return Ok(None);
    };
    let rpins = Arc::new(restore_pins(cfg)?);
    let listen = resolve("restore_listen", addr)?;
    let rend = net::server(listen, identity, rpins.clone()).map_err(|e| match e {
        NetError::Io(io) => listen_failed("restore_listen", addr, &io),
        other => other.into(),
    })?;
    let snapshots = snapshot_source(store, &cfg.data_dir);
    let source = Arc::new(crate::node::restore_serve::RestoreSource {
        log: log.clone(),
        snapshots: snapshots.clone(),
        epochs: epochs.clone(),
        base: cfg.data_dir.join(crate::store::install::BASE_FILE),
    });
    tracing::info!(%listen, restorers = cfg.restore_fingerprints.len(), "serving restores");
    tokio::spawn(crate::node::restore_serve::serve(
        source,
        rend,
        rpins,
        shutdown.clone(),
    ));
    Ok(Some(snapshots))
}

/// Retention, set on the twin and run when the configuration turns it on.
fn start_retention(
    cfg: &TwinConfig,
    node: &Twin,
    log: &Arc<crate::log::Log>,
    store: &Arc<crate::node::store_host::StoreHost>,
    restore_snapshots: Option<Arc<SnapshotSource>>,
    archive: Option<Arc<crate::archive::archiver::Archiver>>,
    shutdown: &watch::Receiver<bool>,
) {
    // Retention runs beside the writer, never on its path.
    let retainer = crate::node::twin_retention::TwinRetainer::new(
        log.clone(),
        store.clone(),
        restore_snapshots,
        cfg.retention.retention(),
    );
    if let Some(a) = archive {
        retainer.set_archive(a);
    }
    node.set_retainer(retainer.clone());
    if cfg.retention.retention().is_on() {
        tracing::info!(
            max_bytes = cfg.retention.max_bytes,
            max_age_secs = cfg.retention.max_age_secs,
            "twin retention on"
        );
        tokio::spawn(retainer.run(shutdown.clone()));
    }
}

/// Whether the twin is ready (its `/ready` answer): not when its log is
/// poisoned or it does not follow the primary.
fn twin_ready(s: &crate::node::TwinStatus) -> Result<(), NotReady> {
    if let Some(why) = &s.log_poisoned {
        return Err(NotReady::LogPoisoned(why.clone()));
    }
    if !s.connected {
        return Err(NotReady::NotFollowing {
            why: s.last_error.clone(),
        });
    }
    Ok(())
}

/// The twin's metrics, from its status.
fn twin_metrics(s: &crate::node::TwinStatus, out: &mut String) {
    gauge(
        out,
        "twinlog_epoch",
        "The newest primary epoch this box followed.",
        s.epoch,
    );
    role_metrics(out, "twin");
    if let Some(a) = &s.arbiter {
        twin_arbiter_metrics(out, a);
    }
    if let Some(f) = &s.last_failover {
        super::last_failover::metrics(out, f);
    }
    gauge(
        out,
        "twinlog_fenced",
        "Always 0 on a twin: only a primary is fenced.",
        0,
    );
    gauge(
        out,
        "twinlog_primary_connected",
        "1 while streaming from the primary.",
        u8::from(s.connected),
    );
    gauge(
        out,
        "twinlog_primary_head_seq",
        "The primary's head as last heard.",
        s.primary_head,
    );
    gauge(
        out,
        "twinlog_lag_frames",
        "Frames the primary holds that are not durable here.",
        s.lag_frames,
    );
    gauge(
        out,
        "twinlog_below_floor",
        "1 when a snapshot is needed.",
        u8::from(s.below_floor),
    );
    gauge(
        out,
        "twinlog_snapshot_held_bytes",
        "Bytes of the snapshot being fetched held so far.",
        s.snapshot_held,
    );
    counter(
        out,
        "twinlog_snapshots_installed_total",
        "Snapshots installed since start.",
        s.snapshots_installed,
    );
    counter(
        out,
        "twinlog_received_bytes_total",
        "Bytes received from primaries since start, on the wire (UDP payloads).",
        s.received_bytes,
    );
    counter(
        out,
        "twinlog_frame_bytes_received_total",
        "Frame-stream bytes (headers, metas, blobs) received since start.",
        s.frame_bytes_received,
    );
    store_metrics(out, "twinlog_store", "This box's store", &s.store);
    twin_retention_metrics(out, &s.retention);
    if let Some(a) = &s.archive {
        archive_metrics(out, a);
    }
}
