//! The daemons' TOML configuration: unknown keys and bad values are refused
//! with the key's name and line, and `render` writes a commented file.

use std::fmt;
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::net::Fingerprint;

mod archive;
mod failover;
mod render;
mod sections;
#[cfg(test)]
mod tests;

pub use archive::{default_max_mib_per_s, ArchiveSection, Uploader};
pub use failover::{FailoverSection, LEASE_TTL_S};
pub use sections::*;
use sections::{de_segment_bytes, within};

/// A configuration that could not be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: {message}")]
    Invalid { path: PathBuf, message: String },
}

/// A `host:port` setting: an IP address (`10.0.0.1:7400`, `[::1]:7400`) or
/// a hostname (`twin.example:7400`). A name is resolved when the address is
/// used, so it follows its DNS record from one start to the next.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Address(String);

impl Address {
    /// The text as written.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The port.
    pub fn port(&self) -> u16 {
        self.0
            .rsplit_once(':')
            .and_then(|(_, p)| p.parse().ok())
            .unwrap_or(0)
    }

    /// The socket address: an IP address is itself, a name the first
    /// address the system's resolver gives for it.
    pub fn resolve(&self) -> std::io::Result<SocketAddr> {
        if let Ok(a) = self.0.parse() {
            return Ok(a);
        }
        self.0.to_socket_addrs()?.next().ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::NotFound,
                format!("{} resolves to no address", self.0),
            )
        })
    }
}

/// Text that is not an [`Address`], and why.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{text:?} is not HOST:PORT ({why}); for example 10.0.0.1:7400 or twin.example:7400")]
pub struct NotAnAddress {
    pub text: String,
    pub why: NotAnAddressWhy,
}

/// What is wrong with a `HOST:PORT`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum NotAnAddressWhy {
    #[error("no port")]
    NoPort,
    #[error("the port is not a number up to 65535")]
    BadPort,
    #[error("the host is neither an IP address nor a hostname")]
    BadHost,
}

impl FromStr for Address {
    type Err = NotAnAddress;

    fn from_str(s: &str) -> Result<Address, NotAnAddress> {
        if s.parse::<SocketAddr>().is_ok() {
            return Ok(Address(s.to_owned()));
        }
        let bad = |why| NotAnAddress {
            text: s.to_owned(),
            why,
        };
        let (host, port) = s
            .rsplit_once(':')
            .ok_or_else(|| bad(NotAnAddressWhy::NoPort))?;
        port.parse::<u16>()
            .map_err(|_| bad(NotAnAddressWhy::BadPort))?;
        // A hostname as DNS spells one: labels of letters, digits, '-' and
        // '_', separated by dots. An IPv6 address needs brackets, and then
        // parsed above.
        let name_ok = !host.is_empty()
            && host.len() <= 253
            && host.split('.').all(|label| {
                !label.is_empty()
                    && label.len() <= 63
                    && !label.starts_with('-')
                    && label
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
            });
        if !name_ok {
            return Err(bad(NotAnAddressWhy::BadHost));
        }
        Ok(Address(s.to_owned()))
    }
}

impl From<SocketAddr> for Address {
    fn from(a: SocketAddr) -> Address {
        Address(a.to_string())
    }
}

impl From<&Address> for Address {
    fn from(a: &Address) -> Address {
        a.clone()
    }
}

impl fmt::Display for Address {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl Serialize for Address {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for Address {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Address, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

fn de_fp<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Fingerprint>, D::Error> {
    let s: Option<String> = Option::deserialize(d)?;
    match s.as_deref().map(str::trim) {
        None | Some("") => Ok(None),
        Some(s) => s.parse().map(Some).map_err(serde::de::Error::custom),
    }
}

fn ser_fp<S: Serializer>(fp: &Option<Fingerprint>, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&fp.map(|f| f.to_string()).unwrap_or_default())
}

fn de_fps<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<Fingerprint>, D::Error> {
    let v: Vec<String> = Vec::deserialize(d)?;
    v.iter()
        .map(|s| s.parse().map_err(serde::de::Error::custom))
        .collect()
}

fn ser_fps<S: Serializer>(fps: &[Fingerprint], s: S) -> Result<S::Ok, S::Error> {
    s.collect_seq(fps.iter().map(|f| f.to_string()))
}

/// `primary.toml`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PrimaryConfig {
    /// Where the log, the key and the certificate live.
    pub data_dir: PathBuf,
    /// The QUIC address twins and clients connect to.
    pub listen: Address,
    /// The local HTTP address of `/metrics` and `/status`.
    pub metrics: Address,
    /// The twin's certificate fingerprint (`twin init` prints it).
    #[serde(deserialize_with = "de_fp", serialize_with = "ser_fp", default)]
    pub twin_fingerprint: Option<Fingerprint>,
    /// Admin clients: every request, erase, retain and raw appends of
    /// twinlog's reserved kinds included (the admin client `init` made is
    /// one).
    #[serde(deserialize_with = "de_fps", serialize_with = "ser_fps", default)]
    pub client_fingerprints: Vec<Fingerprint>,
    /// Writer clients: appends of application kinds and the store's writes
    /// (create, push, large objects, documents), and every read.
    #[serde(deserialize_with = "de_fps", serialize_with = "ser_fps", default)]
    pub writer_fingerprints: Vec<Fingerprint>,
    /// Read-only clients: reads, tails, status and the store's reads.
    #[serde(deserialize_with = "de_fps", serialize_with = "ser_fps", default)]
    pub reader_fingerprints: Vec<Fingerprint>,
    #[serde(default)]
    pub durability: DurabilitySection,
    #[serde(
        default = "default_segment_bytes",
        deserialize_with = "de_segment_bytes"
    )]
    pub segment_bytes: u64,
    #[serde(default)]
    pub timers: TimersSection,
    #[serde(default)]
    pub retention: RetentionSection,
    #[serde(default)]
    pub limits: LimitsSection,
    #[serde(default)]
    pub failover: Option<FailoverSection>,
    #[serde(default)]
    pub archive: Option<ArchiveSection>,
}

/// `[as_primary]` of `twin.toml`: what this box serves with once a
/// switchover or a promotion makes it the primary, the sections of the
/// same names in `primary.toml`. A deposed primary that becomes the twin
/// carries its own here, so a switchover and back keeps them.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AsPrimarySection {
    #[serde(default)]
    pub durability: DurabilitySection,
    #[serde(default)]
    pub retention: RetentionSection,
    #[serde(default)]
    pub limits: LimitsSection,
}

impl AsPrimarySection {
    /// What `cfg` serves with.
    pub fn of(cfg: &PrimaryConfig) -> AsPrimarySection {
        AsPrimarySection {
            durability: cfg.durability.clone(),
            retention: cfg.retention,
            limits: cfg.limits,
        }
    }
}

/// `twin.toml`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TwinConfig {
    pub data_dir: PathBuf,
    /// The primary's QUIC address.
    pub primary: Address,
    /// The primary's certificate fingerprint (`primary init` prints it).
    #[serde(deserialize_with = "de_fp", serialize_with = "ser_fp", default)]
    pub primary_fingerprint: Option<Fingerprint>,
    pub metrics: Address,
    #[serde(
        default = "default_segment_bytes",
        deserialize_with = "de_segment_bytes"
    )]
    pub segment_bytes: u64,
    #[serde(default)]
    pub timers: TimersSection,
    /// The QUIC address boxes being restored from this twin connect to;
    /// none serves no restore.
    #[serde(default)]
    pub restore_listen: Option<Address>,
    /// Boxes allowed to restore from this twin (`twin pin-restore`).
    #[serde(deserialize_with = "de_fps", serialize_with = "ser_fps", default)]
    pub restore_fingerprints: Vec<Fingerprint>,
    #[serde(default)]
    pub retention: TwinRetentionSection,
    /// Where this box serves clients once a switchover makes it the
    /// primary.
    #[serde(default = "default_listen_as_primary")]
    pub listen_as_primary: Address,
    /// When each restore pin expires (RFC 3339, UTC), by fingerprint (as
    /// it prints: however the file spells one, it is read as that); a pin
    /// not named here does not expire.
    #[serde(default, deserialize_with = "de_expiry")]
    pub restore_expiry: std::collections::BTreeMap<String, String>,
    /// `twin promote` refuses (unless forced) while this twin heard its
    /// primary within this many milliseconds.
    #[serde(
        default = "default_promote_quiet_ms",
        deserialize_with = "de_promote_quiet_ms"
    )]
    pub promote_quiet_ms: u64,
    /// What this box serves with once it is the primary.
    #[serde(default)]
    pub as_primary: AsPrimarySection,
    #[serde(default)]
    pub failover: Option<FailoverSection>,
    #[serde(default)]
    pub archive: Option<ArchiveSection>,
}

/// The bounds of `promote_quiet_ms`: up to a day.
pub const PROMOTE_QUIET_MS: std::ops::RangeInclusive<u64> = 0..=86_400_000;

pub fn default_promote_quiet_ms() -> u64 {
    10_000
}

fn de_promote_quiet_ms<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    let v = u64::deserialize(d)?;
    within("promote_quiet_ms", v, &PROMOTE_QUIET_MS).map_err(serde::de::Error::custom)?;
    Ok(v)
}

/// The restore pins' expiries, keyed by each fingerprint as it prints
/// (`Fingerprint`'s Display): a key spelled with capitals or colons names
/// the same pin, and one that is no fingerprint is refused by name.
fn de_expiry<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<std::collections::BTreeMap<String, String>, D::Error> {
    let raw = std::collections::BTreeMap::<String, String>::deserialize(d)?;
    raw.into_iter()
        .map(|(fp, at)| {
            let parsed: Fingerprint = fp.parse().map_err(|_| {
                serde::de::Error::custom(format!(
                    "restore_expiry: {fp:?} is not a fingerprint (64 hex digits)"
                ))
            })?;
            Ok((parsed.to_string(), at))
        })
        .collect()
}

pub(crate) fn default_listen_as_primary() -> Address {
    Address::from(std::net::SocketAddr::from(([0, 0, 0, 0], 7400)))
}

fn default_segment_bytes() -> u64 {
    crate::log::DEFAULT_SEGMENT_BYTES
}

fn load<T: for<'de> Deserialize<'de>>(path: &Path) -> Result<T, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.to_owned(),
        source,
    })?;
    toml::from_str(&text).map_err(|e| ConfigError::Invalid {
        path: path.to_owned(),
        message: e.to_string(),
    })
}

impl PrimaryConfig {
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        load(path)
    }

    /// A primary whose one client is the admin `admin`, every other
    /// setting at its default.
    pub fn new(
        data_dir: PathBuf,
        listen: Address,
        metrics: Address,
        twin_fingerprint: Option<Fingerprint>,
        admin: Fingerprint,
    ) -> PrimaryConfig {
        PrimaryConfig {
            data_dir,
            listen,
            metrics,
            twin_fingerprint,
            client_fingerprints: vec![admin],
            writer_fingerprints: Vec::new(),
            reader_fingerprints: Vec::new(),
            durability: DurabilitySection::default(),
            segment_bytes: default_segment_bytes(),
            timers: TimersSection::default(),
            retention: RetentionSection::default(),
            limits: LimitsSection::default(),
            failover: None,
            archive: None,
        }
    }

    /// What the twin `twin` serves as once it is made the primary: [`new`]
    /// with the twin's log settings and its `[as_primary]` sections.
    ///
    /// [`new`]: PrimaryConfig::new
    pub fn of_twin(
        twin: &TwinConfig,
        listen: Address,
        metrics: Address,
        twin_fingerprint: Option<Fingerprint>,
        admin: Fingerprint,
    ) -> PrimaryConfig {
        PrimaryConfig {
            durability: twin.as_primary.durability.clone(),
            segment_bytes: twin.segment_bytes,
            timers: twin.timers,
            retention: twin.as_primary.retention,
            limits: twin.as_primary.limits,
            failover: twin.failover.clone(),
            archive: twin.archive.clone(),
            ..PrimaryConfig::new(
                twin.data_dir.clone(),
                listen,
                metrics,
                twin_fingerprint,
                admin,
            )
        }
    }
}

impl TwinConfig {
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        load(path)
    }
}
