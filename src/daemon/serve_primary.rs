//! Running a primary: its log, store, epochs and retention, its endpoint,
//! status server and metrics.

use super::*;

/// The least time between two wakes of the primary's store applier: the
/// store requests apply their own frames before they answer, so this only
/// walks past the others, and a status a little behind costs nothing.
const PRIMARY_APPLY_PAUSE: std::time::Duration = std::time::Duration::from_millis(200);

/// Run a primary until `shutdown`.
pub async fn serve_primary(
    cfg: PrimaryConfig,
    shutdown: watch::Receiver<bool>,
) -> Result<Served, DaemonError> {
    restoring::refuse_restoring(&cfg.data_dir)?;
    crate::budget::start_from_env();
    let identity = load_identity(&cfg.data_dir)?;
    let (pins, roles) = pins_and_roles(&cfg);
    let listen = resolve("listen", &cfg.listen)?;
    let log = open_log(&cfg.data_dir, cfg.segment_bytes)?;
    let store = open_store(&log, &cfg.data_dir, cfg.archive.is_some()).await?;
    let endpoint = net::server(listen, &identity, pins.clone()).map_err(|e| match e {
        NetError::Io(io) => listen_failed("listen", &cfg.listen, &io),
        other => other.into(),
    })?;
    let epochs = Arc::new(
        Epochs::load(&cfg.data_dir, log.head_seq()).at("reading the epochs in", &cfg.data_dir)?,
    );
    // `/status` answers from the start, the waits included: what this
    // primary waits for, before its node serves.
    let slot: Arc<std::sync::OnceLock<Arc<Primary>>> = Arc::default();
    let waiting = watch::channel(None::<String>).0;
    let amnesia = watch::channel(None::<String>).0;
    let (status_stop_tx, status_stop) = watch::channel(false);
    let status_server = {
        let (slot, metrics_slot) = (slot.clone(), slot.clone());
        let (log, epochs) = (Arc::downgrade(&log), epochs.clone());
        let (waiting, amnesia) = (waiting.subscribe(), amnesia.subscribe());
        let twin_configured = cfg.twin_fingerprint.is_some();
        serve_status(
            &cfg.metrics,
            status_stop,
            log.clone(),
            "primary",
            move || {
                let mut s = match (slot.get(), log.upgrade()) {
                    (Some(n), _) => n.status(),
                    (None, Some(log)) => waiting_status(&log, &epochs, twin_configured),
                    (None, None) => crate::node::Status::default(),
                };
                s.last_failover = super::last_failover::last();
                if let Some(why) = waiting.borrow().clone() {
                    s.waiting = Some(why);
                }
                s.arbiter_amnesia = amnesia.borrow().clone();
                s
            },
            primary_ready,
            move |s: &crate::node::Status, out: &mut String| {
                gauge(
                    out,
                    "twinlog_arbiter_amnesia",
                    "1 while etcd forgot what this box knows: nothing is led on its word alone.",
                    u8::from(s.arbiter_amnesia.is_some()),
                );
                if let Some(n) = metrics_slot.get() {
                    primary_metrics(n, s, out)
                }
            },
        )
        .await?
    };
    let held_clients = crate::node::arbiter::peer::HeldClients::default();
    let life = match &cfg.failover {
        None => {
            let held =
                super::held_start::start(&cfg.data_dir, &epochs, cfg.twin_fingerprint.is_some())
                    .at("deciding how this primary starts in", &cfg.data_dir)?;
            begin_life(&cfg, &log, &epochs)?;
            if held {
                tokio::spawn(super::held_start::watch_release(
                    cfg.data_dir.clone(),
                    epochs.clone(),
                ));
            }
            None
        }
        Some(f) => {
            use auto_failover::Start;
            let fp = identity.fingerprint().to_string();
            let knowing =
                auto_failover::knowing_as_primary(&cfg, f, &identity, &log, &epochs, &amnesia)?;
            // The endpoint answers while this box waits: the twin's hello
            // and the other box's question carry their histories; a
            // client's connection is held for the node, its requests
            // waiting until this box serves.
            let (wait_stop_tx, wait_stop) = watch::channel(false);
            let responder = tokio::spawn(crate::node::arbiter::peer::answer_while_waiting(
                endpoint.clone(),
                pins.clone(),
                knowing.own.clone(),
                knowing.heard.clone(),
                held_clients.clone(),
                wait_stop,
            ));
            let started = auto_failover::start_primary(
                &cfg,
                f,
                &fp,
                log.head_seq(),
                &epochs,
                &knowing,
                &waiting,
                shutdown.clone(),
            )
            .await;
            let _ = wait_stop_tx.send(true);
            let _ = responder.await;
            let early = match started? {
                Start::Life(life) => Ok(Some(life)),
                Start::Stopped => Err(Served::Stopped),
                Start::Replaced { leader } if f.auto_rejoin => Err(Served::Replaced { leader }),
                // Fenced by the newer term, it serves its log to whoever
                // asks and acknowledges nothing.
                Start::Replaced { .. } => {
                    begin_life(&cfg, &log, &epochs)?;
                    Ok(None)
                }
            };
            match early {
                Ok(life) => life,
                Err(served) => {
                    // Everything that holds the log lets go of it before
                    // the caller runs a rejoin on this data directory.
                    drop(knowing);
                    let _ = status_stop_tx.send(true);
                    let _ = status_server.await;
                    return Ok(served);
                }
            }
        }
    };
    let epochs_for_call = epochs.clone();
    let node = Primary::build(
        log.clone(),
        pins,
        primary_options(&cfg, &epochs),
        Some(store.clone()),
        epochs,
    );
    node.set_client_roles(roles);
    node.set_retention(crate::node::retention::Retention {
        max_bytes: cfg.retention.max_bytes,
        slot: Some(cfg.data_dir.join(TWIN_SLOT)),
    });
    node.set_snapshots(snapshot_source(&store, &cfg.data_dir));
    let outer_shutdown = shutdown.clone();
    let shutdown = stop_on(
        shutdown,
        node.watch_deposed(),
        |d| d.is_some(),
        DEPOSED_GRACE,
    );
    let held =
        life.map(|life| auto_failover::hold_life(&node, life, &epochs_for_call, shutdown.clone()));
    let shutdown = match &held {
        Some(h) => stop_on(shutdown, h.lost.clone(), |&l| l, std::time::Duration::ZERO),
        None => shutdown,
    };
    // Stopped with this life: a deposed primary's archive does not run on
    // beside the one it starts as a twin.
    if let Some(a) = archive::start_archive(
        cfg.archive.as_ref(),
        &cfg.data_dir,
        &log,
        &epochs_for_call,
        &store,
        config::Uploader::Primary,
        &shutdown,
    )? {
        node.set_archive(a);
    }
    // The store follows the durable head here as on the twin, through the
    // application frames no store request applies, so both boxes' status
    // says how far their store has gone through the log alike. Off the
    // write path, a catch-up at most every `PRIMARY_APPLY_PAUSE`.
    let applier = crate::node::store_host::Applier::start(store.clone())?;
    let follow = follow_durable(&applier, node.watch_durable(), PRIMARY_APPLY_PAUSE);
    let _ = slot.set(node.clone());
    for conn in std::mem::take(&mut *held_clients.lock().unwrap_or_else(|e| e.into_inner())) {
        node.clone().adopt(conn);
    }
    {
        // The status server ends with this serve, whatever ends it.
        let mut s = shutdown.clone();
        let tx = status_stop_tx.clone();
        tokio::spawn(async move {
            let _ = s.wait_for(|&v| v).await;
            let _ = tx.send(true);
        });
    }
    tracing::info!(
        listen = %cfg.listen, metrics = %cfg.metrics, fingerprint = %identity.fingerprint(),
        head = log.head_seq(), "primary serving"
    );
    super::last_failover::served(&cfg.data_dir, epochs_for_call.current());
    notify::notify(&format!(
        "READY=1\nSTATUS=primary serving on {}, head {}",
        cfg.listen,
        log.head_seq()
    ));
    let deposed = node.watch_deposed();
    let calling = match predecessor_caller(&cfg, &identity, &log, &epochs_for_call) {
        Ok(Some((caller, file))) => Some(node.call_predecessor(caller, file, shutdown.clone())),
        Ok(None) => None,
        Err(e) => {
            tracing::error!(error = %e, "the primary this box replaced is not called");
            None
        }
    };
    node.clone().serve(endpoint, shutdown).await;
    if let Some(c) = calling {
        c.abort();
    }
    wind_down(&log, follow, applier, status_server, "primary").await?;
    let new_primary = deposed.borrow().clone();
    let lease_lost = held.as_ref().is_some_and(|h| *h.lost.borrow());
    if cfg.failover.is_none() && new_primary.is_none() && *outer_shutdown.borrow() {
        // Asked to stop, and the log is synced: the next start serves at
        // once, where one after a crash would start held.
        if let Err(e) = super::held_start::stopped_cleanly(&cfg.data_dir, epochs_for_call.current())
        {
            tracing::warn!(error = %e, "the clean stop was not recorded: the next start is held");
        }
    }
    if let (Some(h), Some(_)) = (&held, &new_primary) {
        h.hand_over().await;
    }
    match new_primary {
        Some(np) => {
            drop(node);
            drop(store);
            drop(log);
            let twin_config = failover::follow_after_switchover(&cfg, &np)?;
            Ok(Served::Deposed { twin_config })
        }
        None if lease_lost => Ok(Served::LeaseLost),
        None => Ok(Served::Stopped),
    }
}

/// The call to the primary this box replaced, when `twin promote` left
/// one to make.
fn predecessor_caller(
    cfg: &PrimaryConfig,
    identity: &Identity,
    log: &Arc<crate::log::Log>,
    epochs: &Arc<Epochs>,
) -> Result<
    Option<(
        crate::node::predecessor::Caller,
        crate::node::predecessor::PredecessorFile,
    )>,
    crate::node::predecessor::CallError,
> {
    use crate::node::predecessor::{CallError, Caller, PredecessorFile};
    let Some(file) = PredecessorFile::load(&cfg.data_dir).map_err(CallError::File)? else {
        return Ok(None);
    };
    let caller = Caller {
        dir: cfg.data_dir.clone(),
        log: log.clone(),
        epochs: epochs.clone(),
        endpoint: Caller::endpoint(identity, &file)?,
        deadline: cfg
            .timers
            .timers()
            .idle_timeout
            .min(crate::node::predecessor::CALL_DEADLINE),
    };
    Ok(Some((caller, file)))
}

/// The twin's and the clients' pins, and each client's role.
fn pins_and_roles(
    cfg: &PrimaryConfig,
) -> (
    Arc<Pins>,
    std::collections::HashMap<Fingerprint, ClientRole>,
) {
    let mut pins = Pins::new();
    match cfg.twin_fingerprint {
        Some(fp) => pins = pins.pin(fp, Role::Twin),
        None => tracing::warn!("no twin_fingerprint configured: nothing is replicated"),
    }
    let mut roles = std::collections::HashMap::new();
    // A fingerprint in two lists has the lesser role.
    for (fps, role) in [
        (&cfg.client_fingerprints, ClientRole::Admin),
        (&cfg.writer_fingerprints, ClientRole::Write),
        (&cfg.reader_fingerprints, ClientRole::Read),
    ] {
        for fp in fps {
            pins = pins.pin(*fp, Role::Client);
            roles.insert(*fp, role);
        }
    }
    let pins = Arc::new(pins);
    (pins, roles)
}

/// A new life of this primary in its epochs, said in the log, and a
/// fence shown.
fn begin_life(
    cfg: &PrimaryConfig,
    log: &crate::log::Log,
    epochs: &Epochs,
) -> Result<(), DaemonError> {
    // One epoch per life: frames this log lost in a crash may be on the
    // twin, shipped before they were durable here, and the frames this
    // life writes at those sequences must never be taken for them.
    #[cfg(not(feature = "drill-sabotage"))]
    let begun = epochs
        .begin_life(log.head_seq())
        .at("recording this life's epoch in", &cfg.data_dir)?;
    // A drill's negative control only (feature `drill-sabotage`): no new
    // life, so this one serves on in the last life's epoch.
    #[cfg(feature = "drill-sabotage")]
    let begun: Option<u64> = None;
    if let Some(epoch) = begun {
        tracing::info!(
            epoch = %crate::repl::epochs::EpochName(epoch),
            from = log.head_seq() + 1,
            "serving a new life of this primary"
        );
    }
    if epochs.fenced() {
        tracing::warn!(
            by = epochs.state().fenced_by.unwrap_or_default(),
            "this primary is fenced: it acknowledges no write"
        );
    }
    // A file an older build kept; the epochs say what it said.
    let _ = std::fs::remove_file(cfg.data_dir.join(crate::layout::RESTART_FLOOR));
    Ok(())
}

/// What the primary runs with, from its configuration.
fn primary_options(cfg: &PrimaryConfig, epochs: &Epochs) -> PrimaryOptions {
    PrimaryOptions {
        policy: cfg.durability.twin_policy(),
        timers: cfg.timers.timers(),
        epoch: epochs.current(),
        body_piece_deadline: cfg.limits.body_piece_deadline(),
        memory_budget: cfg.limits.memory_budget_mib << 20,
        max_clients: cfg.limits.max_client_connections as usize,
        stage_max_body: cfg.limits.staged_body_max_mib << 20,
        staging_space: cfg.limits.staging_mib << 20,
    }
}

/// What `/status` says of a primary that does not serve yet.
fn waiting_status(
    log: &crate::log::Log,
    epochs: &Epochs,
    twin_configured: bool,
) -> crate::node::Status {
    let st = epochs.state();
    crate::node::Status {
        head: log.head_seq(),
        first: log.first_seq(),
        role: "primary".into(),
        epoch: st.current(),
        build: env!("CARGO_PKG_VERSION").into(),
        twin_configured,
        fenced: st.fenced().then(|| crate::node::api::Fence {
            epoch: st.newest(),
            by: st.fenced_by.clone().unwrap_or_default(),
            held: st.held.is_some(),
        }),
        // Until the node serves, whatever the wait.
        waiting: Some("starting".into()),
        ..Default::default()
    }
}

/// Whether the primary is ready (its `/ready` answer): not while it waits,
/// nor when its log is poisoned, it is fenced or held, or its store is
/// stopped.
fn primary_ready(s: &crate::node::Status) -> Result<(), NotReady> {
    if let Some(why) = &s.waiting {
        return Err(NotReady::Waiting(why.clone()));
    }
    if let Some(why) = &s.log_poisoned {
        return Err(NotReady::LogPoisoned(why.clone()));
    }
    if let Some(f) = &s.fenced {
        return Err(match f.held {
            true => NotReady::Held { by: f.by.clone() },
            false => NotReady::Fenced {
                epoch: f.epoch,
                by: f.by.clone(),
            },
        });
    }
    if let Some(st) = s.store.as_ref().and_then(|h| h.stalled.as_ref()) {
        return Err(NotReady::StoreStopped {
            seq: st.seq,
            error: st.error.clone(),
        });
    }
    Ok(())
}

/// The primary's metrics, from its status.
fn primary_metrics(node: &Primary, s: &crate::node::Status, out: &mut String) {
    if let Some(a) = &s.archive {
        archive_metrics(out, a);
    }
    node.ack_delay().render(
        out,
        "twinlog_twin_ack_delay_seconds",
        "From a frame's publication here to the twin's acknowledgement covering it.",
    );
    gauge(
        out,
        "twinlog_epoch",
        "The primary epoch this box serves under.",
        s.epoch,
    );
    role_metrics(out, "primary");
    if let Some(a) = &s.arbiter {
        primary_arbiter_metrics(out, a);
    }
    if let Some(f) = &s.last_failover {
        super::last_failover::metrics(out, f);
    }
    gauge(
        out,
        "twinlog_fenced",
        "1 once a newer epoch fenced this primary: it acknowledges no write.",
        u8::from(s.fenced.is_some()),
    );
    if let Some(v) = &s.last_verify {
        gauge(
            out,
            "twinlog_verify_last_unix_seconds",
            "When the last verify of the twin's frames ended.",
            v.ended_ms as f64 / 1000.0,
        );
        gauge(
            out,
            "twinlog_verify_through_seq",
            "The last frame the last verify compared.",
            v.through,
        );
        gauge(
            out,
            "twinlog_verify_differs",
            "1 when the last verify found a frame that differs on the twin.",
            u8::from(v.first_difference.is_some()),
        );
        gauge(
            out,
            "twinlog_verify_first_difference_seq",
            "The first frame the last verify found different (0: none).",
            v.first_difference.unwrap_or(0),
        );
    }
    if let Some(p) = &s.predecessor {
        gauge(
            out,
            "twinlog_predecessor_told",
            "On a promoted box: 1 once the primary it replaced heard of its epoch.",
            u8::from(p.told),
        );
        counter(
            out,
            "twinlog_predecessor_calls_total",
            "Calls to the primary this box replaced.",
            p.attempts,
        );
    }
    gauge(
        out,
        "twinlog_twin_configured",
        "1 when a twin is pinned; 0 and `twin` appends are refused (NoTwin).",
        u8::from(s.twin_configured),
    );
    gauge(
        out,
        "twinlog_twin_connected",
        "1 while a twin streams.",
        u8::from(s.twin_connected),
    );
    gauge(
        out,
        "twinlog_twin_acked_seq",
        "The twin's acknowledged durable head.",
        s.twin_acked,
    );
    counter(
        out,
        "twinlog_twin_acks_total",
        "Acknowledgements that moved the twin's durable head.",
        s.twin_acks,
    );
    gauge(
        out,
        "twinlog_twin_lag_frames",
        "Frames the twin has not acknowledged.",
        s.lag_frames,
    );
    gauge(
        out,
        "twinlog_twin_lag_bytes",
        "Bytes the twin has not acknowledged.",
        s.lag_bytes,
    );
    gauge(
        out,
        "twinlog_twin_lag_seconds",
        "Age of the oldest unacknowledged frame.",
        s.lag_ms as f64 / 1000.0,
    );
    gauge(
        out,
        "twinlog_twin_waiting_appends",
        "Twin appends waiting for the twin's acknowledgement now.",
        s.twin_waiting,
    );
    gauge(
        out,
        "twinlog_durability_degraded",
        "1 while twin appends fall back to local.",
        u8::from(s.degraded),
    );
    gauge(
        out,
        "twinlog_retention_max_bytes",
        "The log's byte cap (0: none).",
        s.retention_max_bytes,
    );
    gauge(
        out,
        "twinlog_twin_hold_seq",
        "The twin's position retention holds.",
        s.twin_hold,
    );
    gauge(
        out,
        "twinlog_twin_below_floor",
        "1 while the frame at the twin's position is no longer retained.",
        u8::from(s.twin_below_floor),
    );
    client_metrics(out, s);
    if let Some(h) = &s.store {
        store_metrics(out, "twinlog_store", "This box's store", h);
    }
    if let Some(h) = &s.twin_store {
        store_metrics(out, "twinlog_twin_store", "The twin's store", h);
    }
}
