//! The failover cycle as an operator runs it: promote a twin, fence and
//! rejoin a deposed primary by truncate-to-fork, and read what a rejoin
//! saved. The rules are in `crate::repl` (epochs, fork point, who may
//! acknowledge); `crate::node::rejoin` carries the rejoin out.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use super::{
    admin_identity, load_identity, open_log, resolve, write_config, Address, AsPrimarySection,
    DaemonError, IoAt, PrimaryConfig, TwinConfig, LOG_DIR, PRIMARY_CONFIG, STORE_DIR, TWIN_CONFIG,
};
use crate::log::{Log, OpenOptions as LogOptions};
use crate::net::{self, Fingerprint, Pins, Role};
use crate::node::epoch::Epochs;
use crate::node::predecessor;
use crate::node::rejoin::{self, RejoinAt, Rejoined, StoreFate};
use crate::repl::epochs::EpochName;

/// What `twin promote` did.
#[derive(Debug)]
pub struct Promoted {
    pub config: PathBuf,
    pub epoch: u64,
    pub head: u64,
    pub fingerprint: Fingerprint,
}

/// Make a stopped twin a primary of the next term, unless it heard its
/// primary within `promote_quiet_ms` and `force` is not given
/// ([`crate::repl::promote::may_promote`]). The epoch is raised durably
/// first, then `PREDECESSOR` names the primary it replaces (the new
/// primary calls it until it is heard, which fences it), then
/// `primary.toml` is written beside `twin.toml` (with an admin client, as
/// `primary init` makes).
pub fn promote(
    twin_config: &Path,
    listen: impl Into<Address>,
    metrics: impl Into<Address>,
    twin: Option<Fingerprint>,
    force: bool,
) -> Result<Promoted, DaemonError> {
    let (listen, metrics) = (listen.into(), metrics.into());
    let cfg = TwinConfig::load(twin_config)?;
    let primary_config = cfg.data_dir.join(PRIMARY_CONFIG);
    if primary_config.exists() {
        return Err(DaemonError::Initialized(primary_config));
    }
    // Opening the log takes its lock: a running twin is refused by name.
    let head = match Log::open_opts(
        cfg.data_dir.join(LOG_DIR),
        LogOptions {
            segment_bytes: cfg.segment_bytes,
            ..LogOptions::default()
        },
    ) {
        Ok(log) => log.head_seq(),
        Err(crate::log::Error::Locked(_)) => {
            return Err(DaemonError::Running {
                data_dir: cfg.data_dir.clone(),
                before: "promoting",
            })
        }
        Err(e) => return Err(e.into()),
    };
    let now_ms = crate::node::clock::unix_ms();
    crate::repl::promote::may_promote(
        predecessor::heard_primary(&cfg.data_dir),
        now_ms,
        Duration::from_millis(cfg.promote_quiet_ms),
        force,
    )
    .map_err(DaemonError::PromoteRefused)?;
    let epochs = Epochs::load(&cfg.data_dir, head).at("reading the epochs in", &cfg.data_dir)?;
    let new = epochs
        .update(|s| s.promote(head))
        .at("recording the new epoch in", &cfg.data_dir)?;
    match cfg.primary_fingerprint {
        Some(fp) => predecessor::PredecessorFile {
            addr: cfg.primary.to_string(),
            fingerprint: fp.to_string(),
            epoch: new,
            told: false,
            told_ms: 0,
        }
        .save(&cfg.data_dir)
        .at("recording the primary it replaces in", &cfg.data_dir)?,
        None => tracing::warn!(
            "no primary fingerprint in the twin's configuration: the old primary is not called, fence it by hand"
        ),
    }
    let admin = admin_identity(&cfg.data_dir)?;
    let identity = load_identity(&cfg.data_dir)?;
    let primary = PrimaryConfig::of_twin(&cfg, listen, metrics, twin, admin.fingerprint());
    write_config(&primary_config, &primary.render())?;
    tracing::warn!(epoch = %EpochName(new), head, "twin promoted to primary");
    Ok(Promoted {
        config: primary_config,
        epoch: new,
        head,
        fingerprint: identity.fingerprint(),
    })
}

/// What `primary rejoin` did.
#[derive(Debug)]
pub struct RejoinReport {
    pub rejoined: Rejoined,
    /// The twin configuration written.
    pub twin_config: PathBuf,
    /// Where the primary configuration went.
    pub deposed_config: PathBuf,
}

impl std::fmt::Display for RejoinReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let r = &self.rejoined;
        writeln!(
            f,
            "fenced: epoch {} is the new primary's; this box acknowledges no write as a primary",
            r.epoch
        )?;
        match &r.saved {
            Some((m, path)) => {
                writeln!(
                    f,
                    "the logs forked after frame {}: this box held {} frames past it ({}..={}, {} bytes) that were never on the new primary",
                    r.fork, m.frames, m.first, m.last, m.bytes
                )?;
                writeln!(
                    f,
                    "saved them to {} (read them with `primary divergent --data {}`), then cut them from the log",
                    path.display(),
                    self.twin_config.parent().unwrap_or(Path::new(".")).display()
                )?;
            }
            None => writeln!(
                f,
                "nothing to cut: this log (head {}) is a prefix of the new primary's",
                r.old_head
            )?,
        }
        match &r.store {
            StoreFate::Kept => {}
            StoreFate::Rewound { from } => writeln!(
                f,
                "store: its applied mark moved back from {from} to {} (no store frame was cut)",
                r.fork
            )?,
            StoreFate::Rebuilt { moved_to } => writeln!(
                f,
                "store: store frames were cut, so it was moved to {} and is rebuilt from the log when the twin starts",
                moved_to.display()
            )?,
        }
        if r.needs_snapshot {
            writeln!(
                f,
                "the new primary no longer holds this log's head: the twin installs a snapshot when it starts"
            )?;
        }
        writeln!(
            f,
            "wrote {}; {} moved to {}",
            self.twin_config.display(),
            PRIMARY_CONFIG,
            self.deposed_config.display()
        )?;
        write!(
            f,
            "follow the new primary with: twin serve --config {}",
            self.twin_config.display()
        )
    }
}

/// Open a stopped box's log, naming a running daemon.
fn open_stopped(
    data_dir: &Path,
    segment_bytes: u64,
    before: &'static str,
) -> Result<Arc<Log>, DaemonError> {
    match open_log(data_dir, segment_bytes) {
        Err(DaemonError::Log(crate::log::Error::Locked(_))) => Err(DaemonError::Running {
            data_dir: data_dir.to_owned(),
            before,
        }),
        other => other,
    }
}

/// Turn a stopped, deposed primary into the twin of the new primary at
/// `primary` by truncate-to-fork: see [`crate::node::rejoin`]. Writes
/// `twin.toml` (keeping the restore and retention settings of one already
/// there) and moves `primary.toml` aside, last, so that running it again
/// after a crash finishes the job.
pub async fn rejoin(
    primary_config: &Path,
    primary: Address,
    primary_fingerprint: Fingerprint,
    metrics: Option<Address>,
    deadline: Duration,
) -> Result<RejoinReport, DaemonError> {
    let cfg = PrimaryConfig::load(primary_config)?;
    let identity = load_identity(&cfg.data_dir)?;
    let addr: SocketAddr = resolve("primary", &primary)?;
    let log = open_stopped(&cfg.data_dir, cfg.segment_bytes, "rejoining")?;
    let epochs =
        Epochs::load(&cfg.data_dir, log.head_seq()).at("reading the epochs in", &cfg.data_dir)?;
    let pins = Arc::new(Pins::new().pin(primary_fingerprint, Role::Primary));
    let endpoint = net::client(&identity, pins)?;
    let rejoined = rejoin::rejoin(RejoinAt {
        data_dir: &cfg.data_dir,
        log: log.clone(),
        epochs: &epochs,
        store_dir: Some(cfg.data_dir.join(STORE_DIR)),
        endpoint: &endpoint,
        primary: addr,
        deadline,
    })
    .await
    .map_err(|e| DaemonError::Rejoin(Box::new(e)))?;
    endpoint.close(0u32.into(), b"rejoined");
    drop(log);
    let (twin_path, deposed) =
        become_twin(&cfg, primary_config, primary, primary_fingerprint, metrics)?;
    tracing::warn!(
        fork = rejoined.fork,
        epoch = %EpochName(rejoined.epoch),
        "rejoined as the new primary's twin"
    );
    Ok(RejoinReport {
        rejoined,
        twin_config: twin_path,
        deposed_config: deposed,
    })
}

/// Make a deposed primary's data directory a twin's, following `primary`:
/// `twin.toml` is written (keeping the restore, retention and promote
/// settings of one already there, or of the one set aside when a
/// switchover promoted this box; the metrics address `metrics`, else the one there,
/// else the primary's), then `primary_config` is moved aside, last, so a
/// crash between leaves a box that is both and is finished by running the
/// step again. Answers the twin configuration and where the primary's
/// went.
fn become_twin(
    cfg: &PrimaryConfig,
    primary_config: &Path,
    primary: Address,
    fingerprint: Fingerprint,
    metrics: Option<Address>,
) -> Result<(PathBuf, PathBuf), DaemonError> {
    let twin_path = cfg.data_dir.join(TWIN_CONFIG);
    // The twin settings this box had before a switchover promoted it in
    // place, when it has no twin.toml of its own: its restore pins,
    // retention and promote window come back with it.
    let before = cfg.data_dir.join(format!("{TWIN_CONFIG}.promoted"));
    let mut twin = TwinConfig::load(&twin_path)
        .or_else(|_| TwinConfig::load(&before))
        .unwrap_or_else(|_| TwinConfig {
            data_dir: cfg.data_dir.clone(),
            primary: primary.clone(),
            primary_fingerprint: None,
            metrics: cfg.metrics.clone(),
            segment_bytes: cfg.segment_bytes,
            timers: cfg.timers,
            restore_listen: None,
            restore_fingerprints: Vec::new(),
            retention: Default::default(),
            listen_as_primary: cfg.listen.clone(),
            restore_expiry: Default::default(),
            promote_quiet_ms: super::config::default_promote_quiet_ms(),
            as_primary: Default::default(),
            failover: None,
            archive: None,
        });
    twin.failover = cfg.failover.clone();
    twin.archive = cfg.archive.clone();
    twin.data_dir = cfg.data_dir.clone();
    twin.listen_as_primary = cfg.listen.clone();
    twin.as_primary = AsPrimarySection::of(cfg);
    twin.primary = primary;
    twin.primary_fingerprint = Some(fingerprint);
    if let Some(m) = metrics {
        twin.metrics = m;
    }
    write_config(&twin_path, &twin.render())?;
    predecessor::forget(&cfg.data_dir).at("forgetting the predecessor in", &cfg.data_dir)?;
    let deposed = cfg.data_dir.join(format!("{PRIMARY_CONFIG}.deposed"));
    if primary_config.exists() {
        crate::publish::move_aside(primary_config, &deposed).at("moving aside", primary_config)?;
    }
    Ok((twin_path, deposed))
}

/// What `primary unfence` did.
#[derive(Debug, PartialEq, Eq)]
pub enum Unfenced {
    /// A hold (an operator's fence, a switchover whose outcome was not
    /// known) was lifted: the box serves its own epoch again.
    Released { epoch: u64 },
    /// A fence by a newer epoch was lifted by making this box the primary
    /// of a term above it, from `head + 1`.
    NewTerm { epoch: u64, head: u64 },
}

/// Lift a stopped primary's fence. A hold is lifted as it is. A fence by a
/// newer epoch is lifted by making this box the primary of a new term
/// above every one it heard of: this is how a split brain is made on
/// purpose, since the box that fenced it goes on serving its own epoch,
/// and two primaries then take writes that neither twin holds. Use it only
/// when the newer primary is gone for good and this box's log is the one
/// to keep.
pub fn unfence(primary_config: &Path, accept_split_brain: bool) -> Result<Unfenced, DaemonError> {
    let cfg = PrimaryConfig::load(primary_config)?;
    let log = open_stopped(&cfg.data_dir, cfg.segment_bytes, "lifting its fence")?;
    let head = log.head_seq();
    let epochs = Epochs::load(&cfg.data_dir, head).at("reading the epochs in", &cfg.data_dir)?;
    let st = epochs.state();
    if !st.fenced() {
        return Err(DaemonError::NotFenced {
            epoch: st.current(),
        });
    }
    if st.seen <= st.current() {
        epochs.release().at("lifting the hold in", &cfg.data_dir)?;
        tracing::warn!(epoch = %EpochName(st.current()), "hold lifted by the operator");
        return Ok(Unfenced::Released {
            epoch: st.current(),
        });
    }
    if !accept_split_brain {
        return Err(DaemonError::SplitBrain {
            seen: st.seen,
            by: st.fenced_by.unwrap_or_default(),
        });
    }
    let epoch = epochs
        .update(|s| s.promote(head))
        .at("recording the new epoch in", &cfg.data_dir)?;
    tracing::warn!(
        epoch = %EpochName(epoch),
        head,
        "fence lifted by the operator: this box is a primary of a new term"
    );
    Ok(Unfenced::NewTerm { epoch, head })
}

/// The divergent tails a rejoin saved in `data_dir`, and the frames of
/// each, read back and checked.
pub fn divergent(
    data_dir: &Path,
    extract: Option<u64>,
    mut blob_out: impl std::io::Write,
) -> Result<String, DaemonError> {
    use crate::node::divergent;
    let tails = divergent::list(data_dir).at("listing the saved tails in", data_dir)?;
    let mut out = String::new();
    if tails.is_empty() {
        out.push_str("no divergent frames were saved here\n");
    }
    let mut found = false;
    for t in &tails {
        if extract.is_none() {
            out.push_str(&format!(
                "{}: frames {}..={} ({} frames, {} bytes) of epoch {}, cut at the rejoin to {} (epoch {}) after frame {}, saved {}\n",
                t.file, t.first, t.last, t.frames, t.bytes, t.epoch, t.primary, t.new_epoch, t.fork,
                super::utc(t.saved_ms)
            ));
        }
        let path = data_dir.join(divergent::DIVERGENT_DIR).join(&t.file);
        divergent::read(
            &path,
            |seq| extract == Some(seq),
            |f, meta, blob| {
                if extract == Some(f.seq) {
                    found = true;
                    blob_out.write_all(blob)?;
                } else if extract.is_none() {
                    out.push_str(&format!(
                        "  {} kind {} meta {} B blob {} B crc {:08x}{}{}\n",
                        f.seq,
                        f.kind,
                        meta.len(),
                        f.blob_len,
                        f.payload_crc,
                        if f.erased { " (erased)" } else { "" },
                        if meta.is_empty() {
                            String::new()
                        } else {
                            format!(
                                " meta {:?}",
                                String::from_utf8_lossy(&meta[..meta.len().min(64)])
                            )
                        }
                    ));
                }
                Ok(())
            },
        )
        .at("reading", &path)?;
    }
    if let Some(seq) = extract {
        if !found {
            return Err(DaemonError::NoSavedFrame { seq });
        }
    }
    Ok(out)
}

/// A switchover made this twin the primary: a new epoch from `head + 1`,
/// `primary.toml` with the old primary as its twin and the handed clients
/// pinned (beside this box's admin), and `twin.toml` moved aside. Answers
/// the epoch and the address it serves clients on.
pub fn promote_in_place(
    cfg: &TwinConfig,
    epochs: &Epochs,
    head: u64,
    clients: Vec<crate::repl::HandedClient>,
    arbiter_epoch: Option<u64>,
) -> Result<(u64, String), DaemonError> {
    // Under an arbiter the term is the one its transaction gave.
    let epoch = epochs
        .update(|s| match arbiter_epoch {
            Some(e) => s.promote_to(head, e),
            None => s.promote(head),
        })
        .at("recording the new epoch in", &cfg.data_dir)?;
    let admin = admin_identity(&cfg.data_dir)?;
    let mut primary = PrimaryConfig::of_twin(
        cfg,
        cfg.listen_as_primary.clone(),
        cfg.metrics.clone(),
        cfg.primary_fingerprint,
        admin.fingerprint(),
    );
    for c in clients {
        let Ok(fp) = c.fingerprint.parse::<Fingerprint>() else {
            tracing::warn!(fingerprint = %c.fingerprint, "a handed client fingerprint does not parse: not pinned");
            continue;
        };
        let list = match c.role {
            0 => &mut primary.reader_fingerprints,
            1 => &mut primary.writer_fingerprints,
            2 => &mut primary.client_fingerprints,
            other => {
                // A role this build does not know is no role: never admin.
                tracing::warn!(fingerprint = %c.fingerprint, role = other, "a handed client has an unknown role: not pinned");
                continue;
            }
        };
        if !list.contains(&fp) {
            list.push(fp);
        }
    }
    // The old primary hears of this epoch with the handover's answer,
    // unless that answer is lost: then the call tells it.
    match cfg.primary_fingerprint {
        Some(fp) => predecessor::PredecessorFile {
            addr: cfg.primary.to_string(),
            fingerprint: fp.to_string(),
            epoch,
            told: false,
            told_ms: 0,
        }
        .save(&cfg.data_dir)
        .at("recording the primary it replaces in", &cfg.data_dir)?,
        None => {
            predecessor::forget(&cfg.data_dir).at("forgetting the predecessor in", &cfg.data_dir)?
        }
    }
    let primary_path = cfg.data_dir.join(PRIMARY_CONFIG);
    write_config(&primary_path, &primary.render())?;
    let twin_path = cfg.data_dir.join(TWIN_CONFIG);
    let aside = cfg.data_dir.join(format!("{TWIN_CONFIG}.promoted"));
    if twin_path.exists() {
        crate::publish::move_aside(&twin_path, &aside).at("moving aside", &twin_path)?;
    }
    tracing::warn!(epoch = %EpochName(epoch), head, listen = %cfg.listen_as_primary, "promoted in place");
    Ok((epoch, cfg.listen_as_primary.to_string()))
}

/// The path of the primary configuration a switchover wrote.
pub fn promoted_config(cfg: &TwinConfig) -> PathBuf {
    cfg.data_dir.join(PRIMARY_CONFIG)
}

/// A switchover handed this primary's role to its twin, now serving at
/// `np`: this box follows it. `twin.toml` is written (keeping the restore
/// and retention settings of one already there) and `primary.toml` moved
/// aside. Nothing is cut: the twin held this whole log when it took over.
pub fn follow_after_switchover(
    cfg: &PrimaryConfig,
    np: &crate::node::api::NewPrimary,
) -> Result<PathBuf, DaemonError> {
    let fingerprint: Fingerprint = np
        .fingerprint
        .parse()
        .map_err(|_| DaemonError::NewPrimaryFingerprint(np.fingerprint.clone()))?;
    let primary: Address = np
        .addr
        .parse::<SocketAddr>()
        .map(Address::from)
        .map_err(|_| DaemonError::NewPrimaryAddress(np.addr.clone()))?;
    let (twin_path, _) = become_twin(
        cfg,
        &cfg.data_dir.join(PRIMARY_CONFIG),
        primary,
        fingerprint,
        Some(cfg.metrics.clone()),
    )?;
    tracing::warn!(primary = %np.addr, "switchover: this box follows the new primary");
    Ok(twin_path)
}

/// After a switchover changed this box's role, become the daemon of the
/// new one: the process is replaced by the sibling binary (`twin` beside
/// `primary`, and back), serving the configuration the switchover wrote,
/// so the log's lock and every descriptor go with the old process.
pub fn continue_as(served: &super::Served, log_json: bool) -> Result<(), DaemonError> {
    use std::os::unix::process::CommandExt;
    let (binary, config) = match served {
        super::Served::Stopped | super::Served::Replaced { .. } => return Ok(()),
        super::Served::LeaseLost => return start_again(),
        super::Served::Deposed { twin_config } => ("twin", twin_config),
        super::Served::Promoted { primary_config } => ("primary", primary_config),
    };
    let me = std::env::current_exe().map_err(DaemonError::NoProgramPath)?;
    let sibling = me.with_file_name(binary);
    let mut cmd = std::process::Command::new(&sibling);
    cmd.arg("serve").arg("--config").arg(config);
    if log_json {
        cmd.arg("--log-json");
    }
    let why = match served {
        super::Served::Deposed { .. } => "this box follows the new primary",
        _ => "this box is the primary now",
    };
    tracing::warn!(binary = %sibling.display(), config = %config.display(), "{why}: serving the new role");
    let error = cmd.exec();
    Err(DaemonError::NewRoleNotStarted {
        sibling,
        binary,
        config: config.clone(),
        error,
    })
}

/// The lease of this life is gone: the same program, with the same
/// arguments, starts again, and takes a new life if the arbiter gives it
/// one (or learns that a newer term leads).
fn start_again() -> Result<(), DaemonError> {
    use std::os::unix::process::CommandExt;
    let me = std::env::current_exe().map_err(DaemonError::NoProgramPath)?;
    let args: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
    tracing::warn!(binary = %me.display(), "this life's lease is gone: starting again");
    let error = std::process::Command::new(&me).args(&args).exec();
    Err(DaemonError::NotStartedAgain { binary: me, error })
}
