//! What the `primary` and `twin` binaries do, as a library: `init` mints a
//! key and certificate and writes a commented configuration, `serve` runs a
//! daemon until SIGTERM, `status` asks a running one.
//!
//! What a data directory holds is in [`crate::layout`].

pub mod allocator;
pub mod config;
pub mod failover;
pub mod http;
pub mod load;
pub mod notify;
pub mod runtime;

use std::fs::OpenOptions;
use std::io::Write;
use std::net::SocketAddr;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio::sync::watch;

use crate::log::{Log, OpenOptions as LogOptions};
use crate::net::{self, Fingerprint, Identity, NetError, Pins, Role, TlsError};
use crate::node::api::ClientRole;
use crate::node::epoch::Epochs;
use crate::node::{
    ClientError, Primary, PrimaryConfig as NodePrimaryConfig, Twin, TwinConfig as NodeTwinConfig,
};
pub use config::TwinRetentionSection;
pub use config::{Address, ConfigError, PrimaryConfig, TwinConfig};

pub use crate::layout::{
    ADMIN_DIR, CERT_FILE, KEY_FILE, LOG_DIR, PRIMARY_CONFIG, SNAPSHOTS_DIR, STORE_DIR, TWIN_CONFIG,
    TWIN_SLOT,
};

/// Exit codes scripts can rely on.
pub mod exit {
    /// A runtime failure.
    pub const FAILURE: i32 = 1;
    /// Bad arguments (clap's own code).
    pub const USAGE: i32 = 2;
    /// A configuration that cannot be used.
    pub const CONFIG: i32 = 3;
    /// A key or certificate that cannot be used.
    pub const KEY: i32 = 4;
}

/// What the daemons and their commands fail at; each kind has its exit
/// code ([`DaemonError::exit_code`]).
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("{path}: {what}")]
    Key { path: PathBuf, what: String },
    #[error(transparent)]
    Tls(#[from] TlsError),
    #[error(transparent)]
    Log(#[from] crate::log::Error),
    #[error("store: {0}")]
    Store(Box<crate::store::StoreError>),
    #[error(transparent)]
    Net(#[from] NetError),
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// An I/O failure on a file or directory, named.
    #[error("{what} {}: {source}", path.display())]
    File {
        what: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{0} is already initialized; remove it or choose another data directory")]
    Initialized(PathBuf),
    /// A configured address that does not resolve or cannot be listened on.
    #[error("{key} = \"{addr}\" in the configuration: {what}")]
    Address {
        key: &'static str,
        addr: String,
        what: String,
    },
    /// A setup that cannot be used as it is (a key not set, ...).
    #[error("{0}")]
    Setup(String),
    /// Arguments that parse but cannot be used.
    #[error("{0}")]
    Usage(String),
    /// A request to the running daemon failed or was refused, or its
    /// connection was lost.
    #[error("{what}: {source}")]
    Request {
        what: String,
        #[source]
        source: Box<ClientError>,
    },
    /// A runtime failure a command found itself (nothing by that name, no
    /// daemon answering, ...).
    #[error("{0}")]
    Failed(String),
}

impl DaemonError {
    /// Map a failed request, saying what was asked.
    pub fn request(what: impl Into<String>) -> impl FnOnce(ClientError) -> DaemonError {
        let what = what.into();
        move |source| DaemonError::Request {
            what,
            source: Box::new(source),
        }
    }
}

/// I/O results that name the file they failed on.
pub trait IoAt<T> {
    /// `what` is the action, as in "reading", "creating".
    fn at(self, what: &'static str, path: &Path) -> Result<T, DaemonError>;
}

impl<T> IoAt<T> for std::io::Result<T> {
    fn at(self, what: &'static str, path: &Path) -> Result<T, DaemonError> {
        self.map_err(|source| DaemonError::File {
            what,
            path: path.to_owned(),
            source,
        })
    }
}

/// Resolve a configured address, naming its key when it does not resolve.
pub fn resolve(key: &'static str, addr: &Address) -> Result<SocketAddr, DaemonError> {
    addr.resolve().map_err(|e| DaemonError::Address {
        key,
        addr: addr.to_string(),
        what: format!("it does not resolve: {e}"),
    })
}

/// A configured address that cannot be listened on, with the likely cause.
fn listen_failed(key: &'static str, addr: &Address, e: &std::io::Error) -> DaemonError {
    let hint = match e.kind() {
        std::io::ErrorKind::AddrInUse => {
            "; another process listens there (another daemon?): stop it or choose another port"
        }
        std::io::ErrorKind::AddrNotAvailable => "; no interface of this box has that address",
        std::io::ErrorKind::PermissionDenied => "; ports below 1024 need privileges",
        _ => "",
    };
    DaemonError::Address {
        key,
        addr: addr.to_string(),
        what: format!("cannot listen there: {e}{hint}"),
    }
}

impl From<crate::store::StoreError> for DaemonError {
    fn from(e: crate::store::StoreError) -> DaemonError {
        DaemonError::Store(Box::new(e))
    }
}

impl DaemonError {
    /// The exit code the README promises for this kind of failure.
    pub fn exit_code(&self) -> i32 {
        match self {
            DaemonError::Config(_)
            | DaemonError::Initialized(_)
            | DaemonError::Address { .. }
            | DaemonError::Setup(_) => exit::CONFIG,
            DaemonError::Key { .. } | DaemonError::Tls(_) => exit::KEY,
            DaemonError::Usage(_) => exit::USAGE,
            DaemonError::Log(_)
            | DaemonError::Store(_)
            | DaemonError::Net(_)
            | DaemonError::Io(_)
            | DaemonError::File { .. }
            | DaemonError::Request { .. }
            | DaemonError::Failed(_) => exit::FAILURE,
        }
    }
}

/// Write a certificate (0644) and a key (0600, never world-readable even
/// for an instant) into `dir`.
pub fn write_identity(dir: &Path, identity: &Identity) -> Result<(), DaemonError> {
    std::fs::create_dir_all(dir).at("creating the directory", dir)?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
        .at("making private (0700) the directory", dir)?;
    let key_path = dir.join(KEY_FILE);
    let mut key = match OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&key_path)
    {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            return Err(DaemonError::Key {
                path: key_path,
                what: "a key is there already, left by an earlier init: remove it (and the certificate beside it) to mint a new one".into(),
            })
        }
        Err(e) => return Err(e).at("creating the key", &key_path),
    };
    key.write_all(identity.key_pem().as_bytes())
        .and_then(|()| key.sync_all())
        .at("writing the key", &key_path)?;
    let cert_path = dir.join(CERT_FILE);
    std::fs::write(&cert_path, identity.cert_pem()).at("writing the certificate", &cert_path)?;
    Ok(())
}

/// Load `dir`'s identity; a key that group or others can read is refused,
/// as ssh refuses one.
pub fn load_identity(dir: &Path) -> Result<Identity, DaemonError> {
    let key_path = dir.join(KEY_FILE);
    let key_err = |what: String| DaemonError::Key {
        path: key_path.clone(),
        what,
    };
    let mode = std::fs::metadata(&key_path)
        .map_err(|e| key_err(e.to_string()))?
        .permissions()
        .mode();
    if mode & 0o077 != 0 {
        return Err(key_err(format!(
            "the key is readable by others (mode {:o}); run chmod 600 on it",
            mode & 0o777
        )));
    }
    let key = std::fs::read_to_string(&key_path).map_err(|e| key_err(e.to_string()))?;
    let cert_path = dir.join(CERT_FILE);
    let cert = std::fs::read_to_string(&cert_path).map_err(|e| DaemonError::Key {
        path: cert_path.clone(),
        what: e.to_string(),
    })?;
    Identity::from_pem(&cert, &key).map_err(|e| match e {
        TlsError::Certificate(why) => DaemonError::Key {
            path: cert_path,
            what: format!(
                "no usable certificate ({why}): expected a PEM \"CERTIFICATE\" block, as `init` writes"
            ),
        },
        TlsError::Key(why) => key_err(format!(
            "no usable private key ({why}): expected a PEM \"PRIVATE KEY\" block (PKCS#8), as `init` writes"
        )),
        other => other.into(),
    })
}

fn absolute(dir: &Path) -> Result<PathBuf, DaemonError> {
    Ok(if dir.is_absolute() {
        dir.to_owned()
    } else {
        std::env::current_dir()
            .at("finding the current directory for", dir)?
            .join(dir)
    })
}

fn write_config(path: &Path, text: &str) -> Result<(), DaemonError> {
    crate::publish::publish(path, text.as_bytes()).at("writing", path)
}

/// Mint the primary's identity and its admin client's, and write
/// `primary.toml`. Answers the config path and the fingerprint to pin on
/// the twin.
pub fn init_primary(
    data_dir: &Path,
    listen: impl Into<Address>,
    metrics: impl Into<Address>,
    twin: Option<Fingerprint>,
) -> Result<(PathBuf, Fingerprint), DaemonError> {
    let (listen, metrics) = (listen.into(), metrics.into());
    let data_dir = absolute(data_dir)?;
    let config_path = data_dir.join(PRIMARY_CONFIG);
    if config_path.exists()
        || data_dir.join(KEY_FILE).exists()
        || data_dir.join(ADMIN_DIR).join(KEY_FILE).exists()
    {
        return Err(DaemonError::Initialized(data_dir));
    }
    let identity = Identity::mint()?;
    write_identity(&data_dir, &identity)?;
    let admin = Identity::mint()?;
    write_identity(&data_dir.join(ADMIN_DIR), &admin)?;
    let cfg = PrimaryConfig {
        data_dir: data_dir.clone(),
        listen,
        metrics,
        twin_fingerprint: twin,
        client_fingerprints: vec![admin.fingerprint()],
        writer_fingerprints: Vec::new(),
        reader_fingerprints: Vec::new(),
        durability: Default::default(),
        segment_bytes: crate::log::DEFAULT_SEGMENT_BYTES,
        timers: Default::default(),
        retention: Default::default(),
        limits: Default::default(),
    };
    write_config(&config_path, &cfg.render())?;
    Ok((config_path, identity.fingerprint()))
}

/// Mint the twin's identity and write `twin.toml`.
pub fn init_twin(
    data_dir: &Path,
    primary: impl Into<Address>,
    metrics: impl Into<Address>,
    primary_fingerprint: Option<Fingerprint>,
) -> Result<(PathBuf, Fingerprint), DaemonError> {
    let (primary, metrics) = (primary.into(), metrics.into());
    let data_dir = absolute(data_dir)?;
    let config_path = data_dir.join(TWIN_CONFIG);
    if config_path.exists() || data_dir.join(KEY_FILE).exists() {
        return Err(DaemonError::Initialized(data_dir));
    }
    let identity = Identity::mint()?;
    write_identity(&data_dir, &identity)?;
    let cfg = TwinConfig {
        data_dir,
        primary,
        primary_fingerprint,
        metrics,
        segment_bytes: crate::log::DEFAULT_SEGMENT_BYTES,
        timers: Default::default(),
        restore_listen: None,
        restore_fingerprints: Vec::new(),
        retention: Default::default(),
        listen_as_primary: config::default_listen_as_primary(),
        restore_expiry: Default::default(),
    };
    write_config(&config_path, &cfg.render())?;
    Ok((config_path, identity.fingerprint()))
}

/// One key a pin command changed: its value before and after.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Change {
    pub key: &'static str,
    pub old: String,
    pub new: String,
}

/// What a pin command did to a configuration file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pinned {
    pub config: PathBuf,
    /// Empty when the file already said so (and was left alone).
    pub changes: Vec<Change>,
    /// The command that serves with this file, to be restarted.
    pub serve: &'static str,
}

impl std::fmt::Display for Pinned {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.changes.is_empty() {
            return writeln!(f, "{}: already so, nothing changed", self.config.display());
        }
        for c in &self.changes {
            writeln!(
                f,
                "{}: {}: {} -> {}",
                self.config.display(),
                c.key,
                c.old,
                c.new
            )?;
        }
        writeln!(
            f,
            "a running `{}` reads its configuration only at start: restart it for this to take effect",
            self.serve
        )
    }
}

fn shown<T: std::fmt::Display>(v: Option<T>) -> String {
    v.map_or_else(|| "(none)".to_owned(), |v| v.to_string())
}

fn shown_list(fps: &[Fingerprint]) -> String {
    if fps.is_empty() {
        return "[]".into();
    }
    let all: Vec<String> = fps.iter().map(|f| f.to_string()).collect();
    format!("[{}]", all.join(", "))
}

/// Write the file when something changed.
fn pinned(
    config: &Path,
    serve: &'static str,
    changes: Vec<Change>,
    text: impl FnOnce() -> String,
) -> Result<Pinned, DaemonError> {
    if !changes.is_empty() {
        write_config(config, &text())?;
    }
    Ok(Pinned {
        config: config.to_owned(),
        changes,
        serve,
    })
}

/// Pin the twin on a primary's configuration.
pub fn pin_twin(config_path: &Path, fp: Fingerprint) -> Result<Pinned, DaemonError> {
    let mut cfg = PrimaryConfig::load(config_path)?;
    let mut changes = Vec::new();
    if cfg.twin_fingerprint != Some(fp) {
        changes.push(Change {
            key: "twin_fingerprint",
            old: shown(cfg.twin_fingerprint),
            new: fp.to_string(),
        });
        cfg.twin_fingerprint = Some(fp);
    }
    pinned(config_path, "primary serve", changes, || cfg.render())
}

/// Pin a client on a primary's configuration.
pub fn pin_client(
    config_path: &Path,
    fp: Fingerprint,
    role: ClientRole,
) -> Result<Pinned, DaemonError> {
    let mut cfg = PrimaryConfig::load(config_path)?;
    let mut changes = Vec::new();
    for (key, list, in_role) in client_lists(&mut cfg) {
        set_pinned(key, list, fp, in_role == role, &mut changes);
    }
    pinned(config_path, "primary serve", changes, || cfg.render())
}

/// Put `fp` in `list` or take it out, noting the change if there is one.
fn set_pinned(
    key: &'static str,
    list: &mut Vec<Fingerprint>,
    fp: Fingerprint,
    pinned: bool,
    changes: &mut Vec<Change>,
) {
    if list.contains(&fp) == pinned {
        return;
    }
    let old = shown_list(list);
    if pinned {
        list.push(fp);
    } else {
        list.retain(|f| *f != fp);
    }
    changes.push(Change {
        key,
        old,
        new: shown_list(list),
    });
}

/// The primary's client lists: key, fingerprints, role.
fn client_lists(cfg: &mut PrimaryConfig) -> [(&'static str, &mut Vec<Fingerprint>, ClientRole); 3] {
    [
        (
            "client_fingerprints",
            &mut cfg.client_fingerprints,
            ClientRole::Admin,
        ),
        (
            "writer_fingerprints",
            &mut cfg.writer_fingerprints,
            ClientRole::Write,
        ),
        (
            "reader_fingerprints",
            &mut cfg.reader_fingerprints,
            ClientRole::Read,
        ),
    ]
}

/// Unpin a client, whatever its role.
pub fn unpin_client(config_path: &Path, fp: Fingerprint) -> Result<Pinned, DaemonError> {
    let mut cfg = PrimaryConfig::load(config_path)?;
    let mut changes = Vec::new();
    for (key, list, _) in client_lists(&mut cfg) {
        set_pinned(key, list, fp, false, &mut changes);
    }
    pinned(config_path, "primary serve", changes, || cfg.render())
}

/// The peers a primary pins, one line each: fingerprint and role.
pub fn primary_pins(config_path: &Path) -> Result<String, DaemonError> {
    let mut cfg = PrimaryConfig::load(config_path)?;
    let mut out = String::new();
    if let Some(fp) = cfg.twin_fingerprint {
        out.push_str(&format!("{fp}  twin\n"));
    }
    for (_, list, role) in client_lists(&mut cfg) {
        for fp in list.iter() {
            out.push_str(&format!("{fp}  client ({role})\n"));
        }
    }
    Ok(out)
}

/// The peers a twin pins, one line each: fingerprint and role.
pub fn twin_pins(config_path: &Path) -> Result<String, DaemonError> {
    let cfg = TwinConfig::load(config_path)?;
    let mut out = String::new();
    if let Some(fp) = cfg.primary_fingerprint {
        out.push_str(&format!("{fp}  primary\n"));
    }
    for fp in &cfg.restore_fingerprints {
        let until = match cfg.restore_expiry.get(&fp.to_string()) {
            Some(at) if parse_utc(at).is_some_and(|t| t <= crate::repl::Now::system().unix_ms) => {
                format!(", EXPIRED {at}")
            }
            Some(at) => format!(", until {at}"),
            None => String::new(),
        };
        out.push_str(&format!("{fp}  restore{until}\n"));
    }
    Ok(out)
}

/// Unpin a box being restored.
pub fn unpin_restore(config_path: &Path, fp: Fingerprint) -> Result<Pinned, DaemonError> {
    let mut cfg = TwinConfig::load(config_path)?;
    let mut changes = Vec::new();
    set_pinned(
        "restore_fingerprints",
        &mut cfg.restore_fingerprints,
        fp,
        false,
        &mut changes,
    );
    cfg.restore_expiry.remove(&fp.to_string());
    pinned(config_path, "twin serve", changes, || cfg.render())
}

/// Pin the primary on a twin's configuration.
pub fn pin_primary(config_path: &Path, fp: Fingerprint) -> Result<Pinned, DaemonError> {
    let mut cfg = TwinConfig::load(config_path)?;
    let mut changes = Vec::new();
    if cfg.primary_fingerprint != Some(fp) {
        changes.push(Change {
            key: "primary_fingerprint",
            old: shown(cfg.primary_fingerprint),
            new: fp.to_string(),
        });
        cfg.primary_fingerprint = Some(fp);
    }
    pinned(config_path, "twin serve", changes, || cfg.render())
}

/// Allow a box to restore from this twin, serving restores on `listen`.
/// Without `listen`, `restore_listen` must be set already: a pin that
/// serves no restore would enable nothing.
pub fn pin_restore<A: Into<Address>>(
    config_path: &Path,
    fp: Fingerprint,
    listen: Option<A>,
    expires_in: Option<std::time::Duration>,
) -> Result<Pinned, DaemonError> {
    let mut cfg = TwinConfig::load(config_path)?;
    let listen: Option<Address> = listen.map(Into::into);
    if listen.is_none() && cfg.restore_listen.is_none() {
        return Err(DaemonError::Usage(format!(
            "{}: restore_listen is not set, so this twin serves no restore: give --listen ADDRESS (as 0.0.0.0:7401) to set it",
            config_path.display()
        )));
    }
    let mut changes = Vec::new();
    if let Some(l) = listen {
        if cfg.restore_listen.as_ref() != Some(&l) {
            changes.push(Change {
                key: "restore_listen",
                old: shown(cfg.restore_listen.as_ref()),
                new: l.to_string(),
            });
            cfg.restore_listen = Some(l);
        }
    }
    set_pinned(
        "restore_fingerprints",
        &mut cfg.restore_fingerprints,
        fp,
        true,
        &mut changes,
    );
    let key = fp.to_string();
    let expiry = expires_in.map(|d| {
        utc(crate::repl::Now::system()
            .unix_ms
            .saturating_add(d.as_millis() as u64))
    });
    let old = cfg.restore_expiry.get(&key).cloned();
    if old != expiry {
        changes.push(Change {
            key: "restore_expiry",
            old: old.unwrap_or_else(|| "never".into()),
            new: expiry.clone().unwrap_or_else(|| "never".into()),
        });
        match expiry {
            Some(at) => cfg.restore_expiry.insert(key, at),
            None => cfg.restore_expiry.remove(&key),
        };
    }
    pinned(config_path, "twin serve", changes, || cfg.render())
}

/// A twin's restore pins, each until its expiry; an expiry that does not
/// parse is refused by name rather than taken as none.
fn restore_pins(cfg: &TwinConfig) -> Result<Pins, DaemonError> {
    let mut pins = Pins::new();
    for fp in &cfg.restore_fingerprints {
        pins = match cfg.restore_expiry.get(&fp.to_string()) {
            Some(at) => {
                let until = parse_utc(at).ok_or_else(|| {
                    DaemonError::Setup(format!(
                        "restore_expiry for {fp}: {at:?} is not a time like 2026-12-01T00:00:00Z"
                    ))
                })?;
                if until <= crate::repl::Now::system().unix_ms {
                    tracing::warn!(%fp, expired = %at, "a restore pin has expired: that box is refused");
                }
                pins.pin_until(*fp, Role::Restore, until)
            }
            None => pins.pin(*fp, Role::Restore),
        };
    }
    Ok(pins)
}

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
fn snapshot_source(
    store: &Arc<crate::node::store::StoreHost>,
    data_dir: &Path,
) -> Arc<crate::node::snapshot::SnapshotSource> {
    crate::node::snapshot::SnapshotSource::new(
        store.clone(),
        &data_dir.join(SNAPSHOTS_DIR),
        Some(data_dir.join(crate::store::install::BASE_FILE)),
    )
}

/// The store beside the log, caught up with it before anything is served.
async fn open_store(
    log: &Arc<Log>,
    data_dir: &Path,
) -> Result<Arc<crate::node::store::StoreHost>, DaemonError> {
    let log = log.clone();
    let dir = data_dir.join(STORE_DIR);
    Ok(tokio::task::spawn_blocking(move || {
        crate::node::store::StoreHost::open(log, &dir, crate::store::StoreOptions::default())
    })
    .await
    .map_err(|e| DaemonError::Failed(format!("opening the store: {e}")))??)
}

/// `twinlog_role{role="..."} 1`: which daemon this box runs.
fn role_metrics(out: &mut String, role: &str) {
    out.push_str(&format!(
        "# HELP twinlog_role The role this box serves in (1 for its role).\n# TYPE twinlog_role gauge\ntwinlog_role{{role=\"{role}\"}} 1\n"
    ));
}

fn gauge(out: &mut String, name: &str, help: &str, value: impl std::fmt::Display) {
    out.push_str(&format!(
        "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {value}\n"
    ));
}

fn counter(out: &mut String, name: &str, help: &str, value: impl std::fmt::Display) {
    out.push_str(&format!(
        "# HELP {name} {help}\n# TYPE {name} counter\n{name} {value}\n"
    ));
}

/// A store's health as metrics named `{prefix}_…`.
fn store_metrics(out: &mut String, prefix: &str, whose: &str, h: &crate::repl::StoreHealth) {
    gauge(
        out,
        &format!("{prefix}_applied_seq"),
        &format!("{whose}: the seq applied up to."),
        h.applied,
    );
    gauge(
        out,
        &format!("{prefix}_stalled"),
        &format!("{whose}: 1 while stopped at a frame that does not apply."),
        u8::from(h.stalled.is_some()),
    );
    gauge(
        out,
        &format!("{prefix}_stalled_seq"),
        &format!("{whose}: the frame it is stopped at (0: none)."),
        h.stalled.as_ref().map_or(0, |s| s.seq),
    );
    counter(
        out,
        &format!("{prefix}_skipped_total"),
        &format!("{whose}: frames skipped by StoreSkip frames."),
        h.skipped,
    );
}

/// The store's health as `status` prints it.
pub fn render_store(who: &str, h: &crate::repl::StoreHealth, fix: &str) -> String {
    let mut out = match &h.stalled {
        None => format!("{who}: applied through {}", h.applied),
        Some(st) => format!(
            "{who}: STOPPED at frame {} (kind {}), {} tries since {}: {}\n  {fix}",
            st.seq,
            st.kind,
            st.attempts,
            crate::daemon::utc(st.since_ms),
            st.error
        ),
    };
    if h.skipped > 0 {
        out.push_str(&format!(" ({} frames skipped by operators)", h.skipped));
    }
    out.push('\n');
    out
}

/// A time as an RFC 3339 UTC date, to the second.
pub fn utc(unix_ms: u64) -> String {
    let secs = unix_ms / 1000;
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Days to a civil date (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// An RFC 3339 UTC time (`2026-11-01`, `2026-11-01T00:00Z`,
/// `2026-11-01T00:00:00Z`, or with `+00:00`) as ms since the Unix epoch;
/// None for anything else.
pub fn parse_utc(s: &str) -> Option<u64> {
    let s = s
        .strip_suffix('Z')
        .or_else(|| s.strip_suffix("+00:00"))
        .unwrap_or(s);
    let (date, time) = s.split_once('T').unwrap_or((s, "00:00:00"));
    let num = |t: &str| -> Option<i64> {
        if t.is_empty() || !t.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        t.parse().ok()
    };
    let mut d = date.split('-');
    let (year, month, day) = (num(d.next()?)?, num(d.next()?)?, num(d.next()?)?);
    if d.next().is_some() || !(1..=12).contains(&month) || !(1..=31).contains(&day) {
        return None;
    }
    let mut t = time.split(':');
    let (h, m) = (num(t.next()?)?, num(t.next()?)?);
    let sec = match t.next() {
        Some(x) => num(x)?,
        None => 0,
    };
    if t.next().is_some() || h > 23 || m > 59 || sec > 60 {
        return None;
    }
    // Days from a civil date (Howard Hinnant's algorithm), utc's inverse.
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = if month > 2 { month - 3 } else { month + 9 };
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let secs = days * 86_400 + h * 3600 + m * 60 + sec;
    u64::try_from(secs).ok().map(|s| s * 1000)
}

/// Serve `/status` (`status()` as JSON) and `/metrics` (the log's metrics,
/// then what `more` adds from the same status) on `addr` until `shutdown`.
///
/// `/healthz` answers 200 while the daemon serves; `/readyz` answers 200
/// when `ready` says the box does its job, 503 with the reason otherwise,
/// for load balancers and orchestrators.
async fn serve_status<S: serde::Serialize + 'static>(
    addr: &Address,
    shutdown: watch::Receiver<bool>,
    log: Arc<Log>,
    role: &'static str,
    status: impl Fn() -> S + Send + Sync + 'static,
    ready: impl Fn(&S) -> Result<(), String> + Send + Sync + 'static,
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
                let mut out = log_metrics(&log);
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
}

/// Stops when `outer` turns true, or `grace` after `inner` fires: a
/// daemon's own shutdown, which a role change also triggers.
fn stop_on<T: Send + Sync + 'static>(
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
const DEPOSED_GRACE: std::time::Duration = std::time::Duration::from_millis(250);

/// The metrics every daemon's log has.
fn log_metrics(log: &Log) -> String {
    let mut out = String::new();
    gauge(
        &mut out,
        "twinlog_head_seq",
        "The newest durable sequence.",
        log.head_seq(),
    );
    gauge(
        &mut out,
        "twinlog_first_seq",
        "The oldest retained sequence.",
        log.first_seq(),
    );
    gauge(
        &mut out,
        "twinlog_log_bytes",
        "Bytes of the log on disk.",
        log.bytes(),
    );
    counter(
        &mut out,
        "twinlog_frame_syncs_total",
        "fdatasyncs that made frames durable.",
        log.frame_syncs(),
    );
    gauge(
        &mut out,
        "twinlog_log_poisoned",
        "1 once a failed write or fsync stopped the log taking writes, until a restart.",
        u8::from(log.poisoned_by().is_some()),
    );
    stall_metrics(&mut out, log);
    out
}

/// What a slow round waits on: the disk's syncs, the writer lock, and the
/// page cache's bytes still to reach the disk.
fn stall_metrics(out: &mut String, log: &Log) {
    log.sync_time().render(
        out,
        "twinlog_log_sync_seconds",
        "Time per fdatasync of the log (and fsync of a segment sealed at a roll).",
    );
    log.writer_wait().render(
        out,
        "twinlog_log_writer_lock_wait_seconds",
        "Time waiting for the log's writer lock on the write path (a streaming entry holds it whole).",
    );
    if let Some((dirty, writeback)) = crate::metrics::dirty_and_writeback() {
        gauge(
            out,
            "twinlog_dirty_bytes",
            "Dirty in /proc/meminfo: page-cache bytes not yet written to disk.",
            dirty,
        );
        gauge(
            out,
            "twinlog_writeback_bytes",
            "Writeback in /proc/meminfo: bytes being written to disk now.",
            writeback,
        );
    }
}

/// A poisoned log as `status` prints it: the cause and what to do.
fn render_poisoned(why: &Option<String>) -> String {
    match why {
        None => String::new(),
        Some(why) => format!(
            "log: POISONED, every write is refused: {why}\n  \
             nothing acknowledged is lost; fix the cause (free space on the log's \
             file system, or replace the failing disk), then restart the daemon\n"
        ),
    }
}

/// Run a primary until `shutdown`.
pub async fn serve_primary(
    cfg: PrimaryConfig,
    shutdown: watch::Receiver<bool>,
) -> Result<Served, DaemonError> {
    let identity = load_identity(&cfg.data_dir)?;
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
    let listen = resolve("listen", &cfg.listen)?;
    let log = open_log(&cfg.data_dir, cfg.segment_bytes)?;
    let store = open_store(&log, &cfg.data_dir).await?;
    let endpoint = net::server(listen, &identity, pins.clone()).map_err(|e| match e {
        NetError::Io(io) => listen_failed("listen", &cfg.listen, &io),
        other => other.into(),
    })?;
    let epochs = Arc::new(
        Epochs::load(&cfg.data_dir, log.head_seq()).at("reading the epochs in", &cfg.data_dir)?,
    );
    let node = Primary::build(
        log.clone(),
        pins,
        NodePrimaryConfig {
            policy: cfg.durability.twin_policy(),
            timers: cfg.timers.timers(),
            epoch: epochs.current(),
            body_piece_deadline: cfg.limits.body_piece_deadline(),
            memory_budget: cfg.limits.memory_budget_mib << 20,
            max_clients: cfg.limits.max_client_connections as usize,
            stage_max_body: cfg.limits.staged_body_max_mib << 20,
            staging_space: cfg.limits.staging_mib << 20,
        },
        Some(store.clone()),
        epochs,
    );
    node.set_client_roles(roles);
    node.set_retention(crate::node::retention::Retention {
        max_bytes: cfg.retention.max_bytes,
        slot: Some(cfg.data_dir.join(TWIN_SLOT)),
    });
    node.set_snapshots(snapshot_source(&store, &cfg.data_dir));
    let shutdown = stop_on(
        shutdown,
        node.watch_deposed(),
        |d| d.is_some(),
        DEPOSED_GRACE,
    );
    let status_node = node.clone();
    let metrics_node = node.clone();
    let status_server = serve_status(
        &cfg.metrics,
        shutdown.clone(),
        node.log().clone(),
        "primary",
        move || status_node.status(),
        |s: &crate::node::Status| {
            if let Some(why) = &s.log_poisoned {
                return Err(format!("the log is poisoned: {why}"));
            }
            if let Some(f) = &s.fenced {
                return Err(format!(
                    "fenced: epoch {} exists ({}); this primary acknowledges no write",
                    f.epoch, f.by
                ));
            }
            if let Some(st) = s.store.as_ref().and_then(|h| h.stalled.as_ref()) {
                return Err(format!(
                    "the store is stopped at frame {}: {}",
                    st.seq, st.error
                ));
            }
            Ok(())
        },
        move |s: &crate::node::Status, out: &mut String| {
            metrics_node.ack_delay().render(
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
            gauge(
                out,
                "twinlog_fenced",
                "1 once a newer epoch fenced this primary: it acknowledges no write.",
                u8::from(s.fenced.is_some()),
            );
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
            if let Some(h) = &s.store {
                store_metrics(out, "twinlog_store", "This box's store", h);
            }
            if let Some(h) = &s.twin_store {
                store_metrics(out, "twinlog_twin_store", "The twin's store", h);
            }
        },
    )
    .await?;
    tracing::info!(
        listen = %cfg.listen, metrics = %cfg.metrics, fingerprint = %identity.fingerprint(),
        head = log.head_seq(), "primary serving"
    );
    notify::notify(&format!(
        "READY=1\nSTATUS=primary serving on {}, head {}",
        cfg.listen,
        log.head_seq()
    ));
    let deposed = node.watch_deposed();
    node.clone().serve(endpoint, shutdown).await;
    log.sync()?;
    let _ = status_server.await;
    tracing::info!(head = log.head_seq(), "primary stopped");
    let new_primary = deposed.borrow().clone();
    match new_primary {
        Some(np) => {
            drop(node);
            drop(store);
            drop(log);
            let twin_config = failover::follow_after_switchover(&cfg, &np)?;
            Ok(Served::Deposed { twin_config })
        }
        None => Ok(Served::Stopped),
    }
}

/// The least time between two wakes of the twin's store applier.
const APPLY_PAUSE: std::time::Duration = std::time::Duration::from_millis(20);

/// Run a twin until `shutdown`.
pub async fn serve_twin(
    cfg: TwinConfig,
    shutdown: watch::Receiver<bool>,
) -> Result<Served, DaemonError> {
    let identity = load_identity(&cfg.data_dir)?;
    let fp = cfg.primary_fingerprint.ok_or_else(|| {
        DaemonError::Setup("primary_fingerprint is not set: run `twin pin`".into())
    })?;
    let pins = Arc::new(Pins::new().pin(fp, Role::Primary));
    // Resolved once, at start: a new DNS record takes a restart.
    let primary = resolve("primary", &cfg.primary)?;
    let log = open_log(&cfg.data_dir, cfg.segment_bytes)?;
    let paths = crate::store::install::InstallPaths::new(&cfg.data_dir);
    crate::store::install::finish(&paths, &log)?;
    let store = open_store(&log, &cfg.data_dir).await?;
    let endpoint = net::client(&identity, pins)?;
    let epochs = Arc::new(
        Epochs::load(&cfg.data_dir, log.head_seq()).at("reading the epochs in", &cfg.data_dir)?,
    );
    let node = Twin::new(
        log.clone(),
        epochs.clone(),
        primary,
        NodeTwinConfig {
            timers: cfg.timers.timers(),
            ..NodeTwinConfig::default()
        },
    );
    node.set_fingerprint(&identity.fingerprint());
    {
        let (cfg, epochs) = (cfg.clone(), epochs.clone());
        node.set_handover(Arc::new(move |head, clients| {
            failover::promote_in_place(&cfg, &epochs, head, clients).map_err(|e| e.to_string())
        }));
    }
    let shutdown = stop_on(
        shutdown,
        node.watch_promoted(),
        |&p| p,
        std::time::Duration::ZERO,
    );
    node.set_snapshots(crate::node::twin::TwinSnapshots {
        paths,
        store: store.clone(),
    })?;
    let mut restore_snapshots = None;
    if let Some(addr) = &cfg.restore_listen {
        let rpins = Arc::new(restore_pins(&cfg)?);
        let listen = resolve("restore_listen", addr)?;
        let rend = net::server(listen, &identity, rpins.clone()).map_err(|e| match e {
            NetError::Io(io) => listen_failed("restore_listen", addr, &io),
            other => other.into(),
        })?;
        let snapshots = snapshot_source(&store, &cfg.data_dir);
        restore_snapshots = Some(snapshots.clone());
        let source = Arc::new(crate::node::restore_serve::RestoreSource {
            log: log.clone(),
            snapshots,
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
    }
    // Retention runs beside the writer, never on its path.
    let retainer = crate::node::twin_retention::TwinRetainer::new(
        log.clone(),
        store.clone(),
        restore_snapshots,
        cfg.retention.retention(),
    );
    node.set_retainer(retainer.clone());
    if cfg.retention.retention().is_on() {
        tracing::info!(
            max_bytes = cfg.retention.max_bytes,
            max_age_secs = cfg.retention.max_age_secs,
            "twin retention on"
        );
        tokio::spawn(retainer.run(shutdown.clone()));
    }
    // The store follows the durable head: one catch-up per wake, however
    // many batches became durable meanwhile. Under a steady stream a wake
    // per sync (thousands a second) cost the twin a sixth of its CPU in
    // thread switches and segment opens, for frames that are mostly not
    // the store's: after a wake, the next waits out `APPLY_PAUSE`.
    let applier = crate::node::store::Applier::start(store)?;
    let waker = applier.waker();
    let mut durable = node.durable();
    let follow = tokio::spawn(async move {
        waker.wake();
        while durable.changed().await.is_ok() {
            waker.wake();
            tokio::time::sleep(APPLY_PAUSE).await;
        }
    });
    let status_node = node.clone();
    let status_server = serve_status(
        &cfg.metrics,
        shutdown.clone(),
        node.log().clone(),
        "twin",
        move || status_node.status(),
        |s: &crate::node::TwinStatus| {
            if let Some(why) = &s.log_poisoned {
                return Err(format!("the log is poisoned: {why}"));
            }
            if !s.connected {
                return Err(format!(
                    "not following the primary: {}",
                    s.last_error.as_deref().unwrap_or("not connected yet")
                ));
            }
            Ok(())
        },
        |s: &crate::node::TwinStatus, out: &mut String| {
            gauge(
                out,
                "twinlog_epoch",
                "The newest primary epoch this box followed.",
                s.epoch,
            );
            role_metrics(out, "twin");
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
        },
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
    log.sync()?;
    follow.abort();
    let _ = follow.await;
    tokio::task::spawn_blocking(move || applier.stop())
        .await
        .map_err(|e| DaemonError::Failed(format!("stopping the store: {e}")))?;
    let _ = status_server.await;
    tracing::info!(head = log.head_seq(), "twin stopped");
    if *promoted.borrow() {
        return Ok(Served::Promoted {
            primary_config: failover::promoted_config(&cfg),
        });
    }
    Ok(Served::Stopped)
}

/// The twin's retention as metrics.
fn twin_retention_metrics(out: &mut String, r: &crate::node::twin_retention::TwinRetentionStatus) {
    gauge(
        out,
        "twinlog_retention_max_bytes",
        "The log's byte cap (0: none).",
        r.max_bytes,
    );
    gauge(
        out,
        "twinlog_retention_max_age_seconds",
        "The age past which sealed segments go (0: none).",
        r.max_age_secs,
    );
    counter(
        out,
        "twinlog_retention_dropped_segments_total",
        "Segments retention dropped since start.",
        r.dropped_segments,
    );
    gauge(
        out,
        "twinlog_retention_failing",
        "1 while the last retention pass failed.",
        u8::from(r.last_error.is_some()),
    );
}

/// Ask a running daemon for its status: the JSON text and its value.
pub fn fetch_status<T: serde::de::DeserializeOwned>(
    metrics: impl Into<Address>,
) -> Result<(String, T), DaemonError> {
    let metrics = metrics.into();
    let addr = resolve("metrics", &metrics)?;
    let body = http::get(addr, "/status").map_err(|e| {
        DaemonError::Failed(format!(
            "no daemon answers on {metrics} (`metrics` in the configuration): {e}; is it serving?"
        ))
    })?;
    let value = serde_json::from_str(&body)
        .map_err(|e| DaemonError::Failed(format!("the status from {metrics}: {e}")))?;
    Ok((body, value))
}

/// A primary's status as `primary status` prints it.
pub fn render_primary_status(s: &crate::node::Status) -> String {
    let mut out = format!(
        "primary, epoch {}, twinlog {}\nhead {}  first {}\n",
        s.epoch, s.build, s.head, s.first
    );
    if let Some(f) = &s.fenced {
        out.push_str(&format!(
            "FENCED: epoch {} exists ({}): another box is primary, and this one acknowledges no write (reads go on). Rejoin it as the new primary's twin: primary rejoin\n",
            f.epoch, f.by
        ));
    }
    if !s.twin_configured {
        out.push_str("twin: NONE configured: `twin` appends are refused at once (NoTwin); pin one with `primary pin-twin` and restart\n");
    }
    out.push_str(&render_poisoned(&s.log_poisoned));
    if s.twin_configured {
        out.push_str(&format!(
            "twin: {}, acknowledged {}, lag {} frames, {} bytes, {:.3} s\n",
            if s.twin_connected {
                "connected"
            } else {
                "not connected"
            },
            s.twin_acked,
            s.lag_frames,
            s.lag_bytes,
            s.lag_ms as f64 / 1000.0
        ));
    }
    out.push_str(&format!(
        "durability: policy {}{}, {} append{} waiting on the twin\n",
        s.policy,
        if s.degraded {
            ", DEGRADED: twin appends are acknowledged as local until the twin catches up"
        } else {
            ""
        },
        s.twin_waiting,
        if s.twin_waiting == 1 { "" } else { "s" }
    ));
    if let Some(e) = &s.twin_last_error {
        out.push_str(&format!("last twin disconnect: {e}\n"));
    }
    out.push_str(&format!(
        "clients: {} connected, {:.1} MiB of the memory budget held, {:.1} MiB of bodies staged\n",
        s.client_connections,
        s.memory_held as f64 / (1 << 20) as f64,
        s.staging_held as f64 / (1 << 20) as f64
    ));
    for r in &s.refused_peers {
        out.push_str(&format!(
            "refused a certificate that is not pinned: {} at {} (pin it with `primary pin-twin` or `pin-client` if it is yours)\n",
            r.fingerprint,
            utc(r.at_ms)
        ));
    }
    out.push_str(&format!(
        "retention: {:.1} MiB of log{}, holding from the twin's position {}\n",
        s.log_bytes as f64 / 1048576.0,
        if s.retention_max_bytes == 0 {
            String::from(", no cap")
        } else {
            format!(", cap {:.1} MiB", s.retention_max_bytes as f64 / 1048576.0)
        },
        s.twin_hold
    ));
    if s.twin_below_floor {
        out.push_str("twin: BELOW THE RETENTION FLOOR: it needs a snapshot\n");
    }
    if let Some(h) = &s.store {
        out.push_str(&render_store(
            "store",
            h,
            "fix the cause, then `primary store retry`; or skip the frame on both boxes with `primary store skip --seq N --reason TEXT`",
        ));
    }
    if let Some(h) = &s.twin_store {
        out.push_str(&render_store(
            "twin's store",
            h,
            "the twin retries by itself; fix the cause on the twin, or skip the frame with `primary store skip`",
        ));
    }
    out
}

/// A twin's status as `twin status` prints it.
pub fn render_twin_status(s: &crate::node::TwinStatus) -> String {
    let mut out = format!(
        "twin, epoch {}, twinlog {}\nhead {}  first {}\n",
        s.epoch, s.build, s.head, s.first
    );
    out.push_str(&render_poisoned(&s.log_poisoned));
    out.push_str(&format!(
        "primary: {}, its head {}, lag {} frames{}\n",
        if s.connected {
            "connected"
        } else {
            "not connected"
        },
        s.primary_head,
        s.lag_frames,
        if s.below_floor {
            ", BELOW THE RETENTION FLOOR: a snapshot is needed"
        } else {
            ""
        }
    ));
    if s.below_floor && s.snapshot_total > 0 {
        out.push_str(&format!(
            "snapshot: {:.1} of {:.1} MiB fetched\n",
            s.snapshot_held as f64 / 1048576.0,
            s.snapshot_total as f64 / 1048576.0
        ));
    }
    if s.snapshots_installed > 0 {
        out.push_str(&format!(
            "snapshots installed: {}, the last at {}\n",
            s.snapshots_installed, s.snapshot_at
        ));
    }
    if let Some(e) = &s.last_error {
        out.push_str(&format!("last disconnect: {e}\n"));
    }
    out.push_str(&render_twin_retention(&s.retention));
    out.push_str(&render_store(
        "store",
        &s.store,
        "it retries by itself (every few seconds, and as frames arrive); fix the cause here, or skip the frame on both boxes with `primary store skip` on the primary",
    ));
    out
}

/// The twin's retention as `twin status` prints it.
fn render_twin_retention(r: &crate::node::twin_retention::TwinRetentionStatus) -> String {
    let mib = |b: u64| b as f64 / 1048576.0;
    let mut limits = Vec::new();
    if r.max_bytes > 0 {
        limits.push(format!("cap {:.1} MiB", mib(r.max_bytes)));
    }
    if r.max_age_secs > 0 {
        limits.push(format!("max age {} s", r.max_age_secs));
    }
    let limits = if limits.is_empty() {
        "no cap".to_owned()
    } else {
        limits.join(", ")
    };
    let mut out = format!(
        "retention: {:.1} MiB of log, {limits}, {} segments dropped{}\n",
        mib(r.log_bytes),
        r.dropped_segments,
        if r.held_by.is_empty() {
            String::new()
        } else {
            format!(", floor held by the {}", r.held_by)
        }
    );
    if let Some(e) = &r.last_error {
        out.push_str(&format!("retention: FAILING: {e}\n"));
    }
    out
}

/// What `check-log` found.
#[derive(Debug, Default)]
pub struct LogCheck {
    pub first: u64,
    pub last: u64,
    pub frames: u64,
    pub bytes: u64,
    pub erased: u64,
}

impl std::fmt::Display for LogCheck {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "frames {}..={} ({} frames, {} erased, {:.1} MiB): every crc checks",
            self.first,
            self.last,
            self.frames,
            self.erased,
            self.bytes as f64 / 1048576.0
        )
    }
}

/// Read every durable frame of a log directory and check its crc, a piece
/// at a time, without taking the log's lock or writing anything: safe
/// while a daemon runs. A damaged frame is an error naming it.
pub fn check_log(dir: &Path) -> Result<LogCheck, DaemonError> {
    let mut tail = crate::log::Tail::open(dir, 0).map_err(|e| {
        DaemonError::Failed(format!(
            "reading the log {}: {e}{}",
            dir.display(),
            if dir.exists() {
                ""
            } else {
                " (a daemon creates it when it first starts)"
            }
        ))
    })?;
    let mut c = LogCheck::default();
    while let Some(h) = tail.next_checked()? {
        if c.frames == 0 {
            c.first = h.seq;
        }
        c.last = h.seq;
        c.frames += 1;
        c.bytes += h.frame_len();
        if h.kind == crate::log::Kind::Redacted.as_u16() {
            c.erased += 1;
        }
    }
    Ok(c)
}

#[cfg(test)]
mod time_tests {
    use super::{parse_utc, utc};

    #[test]
    fn a_restore_pin_lasts_as_long_as_asked_and_unpinning_drops_its_expiry() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (cfg, _) = super::init_twin(
            dir.path(),
            std::net::SocketAddr::from(([127, 0, 0, 1], 7400)),
            std::net::SocketAddr::from(([127, 0, 0, 1], 9401)),
            None,
        )
        .expect("init");
        let (a, b) = (
            crate::net::Fingerprint([5; 32]),
            crate::net::Fingerprint([6; 32]),
        );
        let listen = std::net::SocketAddr::from(([127, 0, 0, 1], 7401));
        super::pin_restore(
            &cfg,
            a,
            Some(listen),
            Some(std::time::Duration::from_secs(3600)),
        )
        .expect("pin a");
        super::pin_restore(&cfg, b, None::<std::net::SocketAddr>, None).expect("pin b");
        let listed = super::twin_pins(&cfg).expect("pins");
        assert!(
            listed.contains(&format!("{a}  restore, until ")),
            "{listed}"
        );
        assert!(listed.contains(&format!("{b}  restore\n")), "{listed}");
        let t = super::TwinConfig::load(&cfg).expect("load");
        let pins = super::restore_pins(&t).expect("pins");
        assert!(pins.role(&a).is_some() && pins.role(&b).is_some());
        super::unpin_restore(&cfg, a).expect("unpin");
        let t = super::TwinConfig::load(&cfg).expect("load");
        assert!(t.restore_expiry.is_empty(), "the expiry goes with the pin");
    }

    #[test]
    fn times_print_and_parse_as_rfc_3339_utc() {
        for ms in [0, 951_782_400_000, 1_764_480_000_000, 4_102_444_799_000] {
            assert_eq!(parse_utc(&utc(ms)), Some(ms), "{}", utc(ms));
        }
        assert_eq!(utc(1_764_479_520_000), "2025-11-30T05:12:00Z");
        assert_eq!(parse_utc("2026-11-01T00:00Z"), parse_utc("2026-11-01"));
        assert_eq!(
            parse_utc("2026-11-01T00:00:00+00:00"),
            parse_utc("2026-11-01")
        );
        for bad in [
            "",
            "2026-13-01",
            "2026-11-01T24:00Z",
            "yesterday",
            "2026-11",
            "1e3",
        ] {
            assert_eq!(parse_utc(bad), None, "{bad}");
        }
    }
}
