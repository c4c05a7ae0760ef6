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
    /// A command that needs the daemon stopped found it running: its log
    /// is locked.
    #[error("the daemon is running on {}: stop it before {before}", data_dir.display())]
    Running {
        data_dir: PathBuf,
        before: &'static str,
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
            | DaemonError::Running { .. }
            | DaemonError::Failed(_) => exit::FAILURE,
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
