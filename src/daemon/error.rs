//! Errors and exit codes of the daemons and their commands.

use super::*;

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
    /// A setup that cannot be used as it is, as a command of the binaries
    /// (`primary/`, `twin/`) says it; the library's own have names below.
    #[error("{0}")]
    Setup(String),
    /// `[archive]` does not make an archive (its bucket, credentials or
    /// key).
    #[error("archive: {0}")]
    ArchiveSetup(String),
    /// The archive refused or failed (a restore from it, a read below the
    /// floor).
    #[error(transparent)]
    Archive(#[from] crate::archive::Error),
    /// Arguments that parse but cannot be used, as a command says it.
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
    /// A command that needs the daemon stopped found it running: its log
    /// is locked.
    #[error("the daemon is running on {}: stop it before {before}", data_dir.display())]
    Running {
        data_dir: PathBuf,
        before: &'static str,
    },
    /// A runtime failure a command of the binaries found itself (nothing
    /// by that name, ...); the library's own have names below.
    #[error("{0}")]
    Failed(String),
    /// A twin with no primary pinned.
    #[error("primary_fingerprint is not set: run `twin pin`")]
    PrimaryNotPinned,
    /// A restore pin's expiry that is not a time.
    #[error("restore_expiry for {fingerprint}: {at:?} is not a time like 2026-12-01T00:00:00Z")]
    BadRestoreExpiry {
        fingerprint: Fingerprint,
        at: String,
    },
    /// `pin-restore` on a twin that serves no restore, told no address.
    #[error("{}: restore_listen is not set, so this twin serves no restore: give --listen ADDRESS (as 0.0.0.0:7401) to set it", config.display())]
    NoRestoreListen { config: PathBuf },
    #[error(
        "no daemon answers on {metrics} (`metrics` in the configuration): {error}; is it serving?"
    )]
    NoDaemon {
        metrics: Address,
        error: std::io::Error,
    },
    #[error("the status from {metrics}: {error}")]
    BadStatus {
        metrics: Address,
        error: serde_json::Error,
    },
    /// A blocking task or a task of the command's did not finish.
    #[error("{what}: {error}")]
    Task {
        what: &'static str,
        error: tokio::task::JoinError,
    },
    #[error("{0}")]
    PromoteRefused(crate::repl::promote::PromoteRefusal),
    #[error("{0}")]
    Rejoin(Box<crate::node::rejoin::RejoinError>),
    #[error("this primary is not fenced: it serves epoch {}", crate::repl::epochs::EpochName(*.epoch))]
    NotFenced { epoch: u64 },
    #[error("epoch {} exists ({by}): lifting this fence makes this box a primary beside it, a split brain. Rejoin it instead (`primary rejoin`), or, if the newer primary is gone for good, say --i-accept-split-brain", crate::repl::epochs::EpochName(*.seen))]
    SplitBrain { seen: u64, by: String },
    #[error("no saved frame {seq} here")]
    NoSavedFrame { seq: u64 },
    /// `primary release --arbiter-lost --epoch-above N` below what the box
    /// holds: the epoch it would lead at could already be taken.
    #[error("--epoch-above {} is below epoch {}, which this box holds: name an epoch at or above every one either box served", crate::repl::epochs::EpochName(*.asked), crate::repl::epochs::EpochName(*.newest))]
    ReleaseBelowHistory { asked: u64, newest: u64 },
    /// A switchover's new primary, as the twin named it, does not parse.
    #[error("the new primary's fingerprint {0:?} does not parse")]
    NewPrimaryFingerprint(String),
    #[error("the new primary's address {0:?} does not parse")]
    NewPrimaryAddress(String),
    #[error("the arbiter: {0}")]
    Arbiter(#[from] crate::node::arbiter::ArbiterError),
    #[error("the arbiter names the primary's {what} {value:?}, which does not parse")]
    BadLeader { what: &'static str, value: String },
    #[error("this life's lease is gone, and {} did not start again: {error}", binary.display())]
    NotStartedAgain {
        binary: PathBuf,
        error: std::io::Error,
    },
    #[error("finding this program: {0}")]
    NoProgramPath(std::io::Error),
    #[error("the switchover changed this box's role, but {} did not start: {error}. Serve it with `{binary} serve --config {}`", sibling.display(), config.display())]
    NewRoleNotStarted {
        sibling: PathBuf,
        binary: &'static str,
        config: PathBuf,
        error: std::io::Error,
    },
    /// A command that follows the primary through etcd, on a box whose
    /// configuration has no `[failover]` section.
    #[error(
        "this configuration has no [failover] section: there is no etcd to find the primary in"
    )]
    NoFailoverSection,
    #[error(
        "connecting to the primary at {addr} (`listen` = \"{listen}\" in the configuration): {}",
        connect_why(error)
    )]
    PrimaryUnreachable {
        addr: SocketAddr,
        listen: Address,
        error: Box<ClientError>,
    },
    #[error("frame {seq} was acknowledged as {durability:?}")]
    AckedAs {
        seq: u64,
        durability: crate::node::Durability,
    },
    #[error("reading the twin's log {}: {error}", dir.display())]
    TwinLogUnread {
        dir: PathBuf,
        error: crate::log::Error,
    },
    #[error("frame {seq} differs on the twin")]
    DiffersOnTwin { seq: u64 },
    #[error("only {verified} of {acked} acknowledged frames are on the twin")]
    MissingOnTwin { verified: u64, acked: usize },
    #[error("reading the log {}: {error}{}", dir.display(), if *absent { " (a daemon creates it when it first starts)" } else { "" })]
    LogUnread {
        dir: PathBuf,
        error: crate::log::Error,
        /// The directory did not exist.
        absent: bool,
    },
    /// A data directory a restore is filling: served only once restored.
    #[error("{} holds an unfinished restore (RESTORING): a box is served only once the restore is done. Finish it with {finish} (it resumes, checking the frames it kept), or discard what it wrote with `primary restore --config … --abandon`", data_dir.display())]
    Restoring { data_dir: PathBuf, finish: String },
    /// `primary restore --abandon` on a box no restore is filling.
    #[error("no restore is under way in {} (no RESTORING): nothing to abandon", data_dir.display())]
    NotRestoring { data_dir: PathBuf },
}

/// Why a client did not connect, as `primary load` says it.
fn connect_why(e: &ClientError) -> String {
    match e {
        ClientError::Deadline { after } => format!(
            "no answer within {after:?}: is `primary serve` running with this configuration?"
        ),
        _ => e.to_string(),
    }
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

impl DaemonError {
    /// The exit code the README promises for this kind of failure.
    pub fn exit_code(&self) -> i32 {
        match self {
            DaemonError::Config(_)
            | DaemonError::Initialized(_)
            | DaemonError::Address { .. }
            | DaemonError::Setup(_)
            | DaemonError::ArchiveSetup(_)
            | DaemonError::PrimaryNotPinned
            | DaemonError::BadRestoreExpiry { .. }
            | DaemonError::Restoring { .. } => exit::CONFIG,
            DaemonError::Key { .. } | DaemonError::Tls(_) => exit::KEY,
            DaemonError::Usage(_)
            | DaemonError::NoRestoreListen { .. }
            | DaemonError::ReleaseBelowHistory { .. } => exit::USAGE,
            DaemonError::Log(_)
            | DaemonError::Store(_)
            | DaemonError::Net(_)
            | DaemonError::Io(_)
            | DaemonError::File { .. }
            | DaemonError::Request { .. }
            | DaemonError::Running { .. }
            | DaemonError::Failed(_)
            | DaemonError::Archive(_)
            | DaemonError::NoDaemon { .. }
            | DaemonError::BadStatus { .. }
            | DaemonError::Task { .. }
            | DaemonError::PromoteRefused(_)
            | DaemonError::Rejoin(_)
            | DaemonError::NotFenced { .. }
            | DaemonError::SplitBrain { .. }
            | DaemonError::NoSavedFrame { .. }
            | DaemonError::NewPrimaryFingerprint(_)
            | DaemonError::NewPrimaryAddress(_)
            | DaemonError::NoProgramPath(_)
            | DaemonError::NewRoleNotStarted { .. }
            | DaemonError::PrimaryUnreachable { .. }
            | DaemonError::NoFailoverSection
            | DaemonError::AckedAs { .. }
            | DaemonError::TwinLogUnread { .. }
            | DaemonError::DiffersOnTwin { .. }
            | DaemonError::MissingOnTwin { .. }
            | DaemonError::LogUnread { .. }
            | DaemonError::Arbiter(_)
            | DaemonError::BadLeader { .. }
            | DaemonError::NotStartedAgain { .. }
            | DaemonError::NotRestoring { .. } => exit::FAILURE,
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
pub(super) fn listen_failed(key: &'static str, addr: &Address, e: &std::io::Error) -> DaemonError {
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
