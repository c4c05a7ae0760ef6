//! The daemons' TOML configuration: unknown keys and bad values are refused
//! with the key's name and line, and `render` writes a commented file.

use std::fmt;
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::net::Fingerprint;
use crate::node::TwinPolicy;

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

impl FromStr for Address {
    type Err = String;

    fn from_str(s: &str) -> Result<Address, String> {
        if s.parse::<SocketAddr>().is_ok() {
            return Ok(Address(s.to_owned()));
        }
        let bad = |why: &str| {
            format!(
                "{s:?} is not HOST:PORT ({why}); for example 10.0.0.1:7400 or twin.example:7400"
            )
        };
        let (host, port) = s.rsplit_once(':').ok_or_else(|| bad("no port"))?;
        port.parse::<u16>()
            .map_err(|_| bad("the port is not a number up to 65535"))?;
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
            return Err(bad("the host is neither an IP address nor a hostname"));
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

/// What a `twin` append does while the twin is unreachable.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Policy {
    Wait,
    Fail,
    Fallback,
}

/// `[durability]`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DurabilitySection {
    pub policy: Policy,
    /// For `fail` and `fallback`.
    #[serde(deserialize_with = "de_timeout_ms")]
    pub timeout_ms: u64,
}

/// The longest `timeout_ms`: a day. Longer is `wait` in all but name, and
/// a clock deadline that far out could overflow.
pub const MAX_TIMEOUT_MS: u64 = 86_400_000;

fn de_timeout_ms<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    let v = u64::deserialize(d)?;
    if !(1..=MAX_TIMEOUT_MS).contains(&v) {
        return Err(serde::de::Error::custom(format!(
            "timeout_ms = {v}: it must be from 1 to {MAX_TIMEOUT_MS} (a day)"
        )));
    }
    Ok(v)
}

fn de_segment_bytes<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    let v = u64::deserialize(d)?;
    let min = crate::log::MIN_SEGMENT_BYTES;
    if v < min {
        return Err(serde::de::Error::custom(format!(
            "segment_bytes = {v} is below the minimum of {min} bytes"
        )));
    }
    Ok(v)
}

impl Default for DurabilitySection {
    fn default() -> Self {
        DurabilitySection {
            policy: Policy::Wait,
            timeout_ms: 5000,
        }
    }
}

impl DurabilitySection {
    pub fn twin_policy(&self) -> TwinPolicy {
        let t = Duration::from_millis(self.timeout_ms);
        match self.policy {
            Policy::Wait => TwinPolicy::Wait,
            Policy::Fail => TwinPolicy::Fail(t),
            Policy::Fallback => TwinPolicy::FallBack(t),
        }
    }
}

/// `[retention]`: how much log the primary keeps.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetentionSection {
    /// Bytes of log past which the oldest whole segments are dropped, those
    /// the twin has acknowledged first; 0 keeps everything.
    pub max_bytes: u64,
}

/// `[retention]` of `twin.toml`: how much log the twin keeps. What its
/// store has not applied, the segment of its head frame and what a restore
/// being served needs always stay.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TwinRetentionSection {
    /// Bytes of log past which the oldest sealed segments are dropped; 0
    /// keeps everything.
    #[serde(default)]
    pub max_bytes: u64,
    /// Sealed segments whose newest frame is older than this many seconds
    /// are dropped; 0 keeps them.
    #[serde(default)]
    pub max_age_secs: u64,
}

impl TwinRetentionSection {
    pub fn retention(&self) -> crate::node::twin_retention::TwinRetention {
        crate::node::twin_retention::TwinRetention {
            max_bytes: self.max_bytes,
            max_age_secs: self.max_age_secs,
        }
    }
}

/// `[timers]`: heartbeats and the silence after which a connection is
/// given up.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "RawTimers")]
pub struct TimersSection {
    pub heartbeat_ms: u64,
    pub idle_timeout_ms: u64,
}

/// The bounds of `[timers]`: a heartbeat more often than every 10 ms is
/// noise, one rarer than a minute leaves a dead link unnoticed; an idle
/// timeout must outlast a QUIC handshake and a slow fsync (100 ms), and at
/// least two heartbeats, so one late heartbeat does not drop the link.
pub const HEARTBEAT_MS: std::ops::RangeInclusive<u64> = 10..=60_000;
pub const IDLE_TIMEOUT_MS: std::ops::RangeInclusive<u64> = 100..=3_600_000;

/// `[limits]`: what one client may cost the primary.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "RawLimits")]
pub struct LimitsSection {
    /// The longest a client may leave a request's body without sending a
    /// byte before the request is cut off (`BodyStalled`).
    pub body_piece_timeout_ms: u64,
    /// MiB that request bodies and whole answers may hold together.
    pub memory_budget_mib: u64,
    /// Client connections served at once.
    pub max_client_connections: u64,
    /// MiB of the largest body a request may carry (an append past 1 MiB,
    /// a push, a large object), staged whole before the log's writer is
    /// taken; a larger one is refused before any of it is read.
    pub staged_body_max_mib: u64,
    /// MiB of disk that staged bodies share.
    pub staging_mib: u64,
}

/// The bounds of `max_client_connections`.
pub const MAX_CLIENT_CONNECTIONS: std::ops::RangeInclusive<u64> = 1..=65_536;

/// The bounds of `memory_budget_mib`: below 16 MiB an object read or a
/// document waits for every other; past a TiB is no bound.
pub const MEMORY_BUDGET_MIB: std::ops::RangeInclusive<u64> = 16..=1 << 20;

/// The bounds of `body_piece_timeout_ms`: shorter than 100 ms cuts off
/// honest clients on a busy link; longer than ten minutes lets one client
/// hold every writer that long.
pub const BODY_PIECE_TIMEOUT_MS: std::ops::RangeInclusive<u64> = 100..=600_000;

/// The bounds of `staging_mib`: a staged body must fit in it.
pub const STAGING_MIB: std::ops::RangeInclusive<u64> = 1..=1 << 20;

/// The bounds of `staged_body_max_mib`: 1 MiB is what is read whole.
pub const STAGED_BODY_MAX_MIB: std::ops::RangeInclusive<u64> = 1..=1 << 20;

impl Default for LimitsSection {
    fn default() -> Self {
        LimitsSection {
            body_piece_timeout_ms: 3_000,
            memory_budget_mib: 512,
            max_client_connections: 64,
            staged_body_max_mib: 1024,
            staging_mib: 2048,
        }
    }
}

impl LimitsSection {
    pub fn body_piece_deadline(&self) -> std::time::Duration {
        std::time::Duration::from_millis(self.body_piece_timeout_ms)
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLimits {
    #[serde(default = "default_body_piece_timeout_ms")]
    body_piece_timeout_ms: u64,
    #[serde(default = "default_memory_budget_mib")]
    memory_budget_mib: u64,
    #[serde(default = "default_max_client_connections")]
    max_client_connections: u64,
    #[serde(default = "default_staged_body_max_mib")]
    staged_body_max_mib: u64,
    #[serde(default = "default_staging_mib")]
    staging_mib: u64,
}

fn default_staged_body_max_mib() -> u64 {
    LimitsSection::default().staged_body_max_mib
}

fn default_staging_mib() -> u64 {
    LimitsSection::default().staging_mib
}

fn default_max_client_connections() -> u64 {
    LimitsSection::default().max_client_connections
}

fn default_body_piece_timeout_ms() -> u64 {
    LimitsSection::default().body_piece_timeout_ms
}

fn default_memory_budget_mib() -> u64 {
    LimitsSection::default().memory_budget_mib
}

/// `name = value` is refused unless `range` holds it, saying the range.
fn within<T: PartialOrd + std::fmt::Display>(
    name: &str,
    value: T,
    range: &std::ops::RangeInclusive<T>,
) -> Result<(), String> {
    if range.contains(&value) {
        Ok(())
    } else {
        Err(format!(
            "{name} = {value}: it must be from {} to {}",
            range.start(),
            range.end()
        ))
    }
}

impl TryFrom<RawLimits> for LimitsSection {
    type Error = String;

    fn try_from(r: RawLimits) -> Result<LimitsSection, String> {
        within(
            "body_piece_timeout_ms",
            r.body_piece_timeout_ms,
            &BODY_PIECE_TIMEOUT_MS,
        )?;
        within("memory_budget_mib", r.memory_budget_mib, &MEMORY_BUDGET_MIB)?;
        within(
            "max_client_connections",
            r.max_client_connections,
            &MAX_CLIENT_CONNECTIONS,
        )?;
        within("staging_mib", r.staging_mib, &STAGING_MIB)?;
        within(
            "staged_body_max_mib",
            r.staged_body_max_mib,
            &STAGED_BODY_MAX_MIB,
        )?;
        if r.staged_body_max_mib > r.staging_mib {
            return Err(format!(
                "staged_body_max_mib = {} is more than staging_mib = {}: no body that large could be staged",
                r.staged_body_max_mib, r.staging_mib
            ));
        }
        Ok(LimitsSection {
            body_piece_timeout_ms: r.body_piece_timeout_ms,
            memory_budget_mib: r.memory_budget_mib,
            max_client_connections: r.max_client_connections,
            staged_body_max_mib: r.staged_body_max_mib,
            staging_mib: r.staging_mib,
        })
    }
}

/// `[timers]` as written, checked into a [`TimersSection`].
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTimers {
    heartbeat_ms: u64,
    idle_timeout_ms: u64,
}

impl TryFrom<RawTimers> for TimersSection {
    type Error = String;

    fn try_from(r: RawTimers) -> Result<TimersSection, String> {
        let (hb, idle) = (r.heartbeat_ms, r.idle_timeout_ms);
        within("heartbeat_ms", hb, &HEARTBEAT_MS)?;
        within("idle_timeout_ms", idle, &IDLE_TIMEOUT_MS)?;
        if idle < 2 * hb {
            return Err(format!(
                "idle_timeout_ms = {idle} must be at least twice heartbeat_ms = {hb}, or one late heartbeat drops the connection"
            ));
        }
        Ok(TimersSection {
            heartbeat_ms: hb,
            idle_timeout_ms: idle,
        })
    }
}

impl Default for TimersSection {
    fn default() -> Self {
        let t = crate::repl::Timers::default();
        TimersSection {
            heartbeat_ms: t.heartbeat.as_millis() as u64,
            idle_timeout_ms: t.idle_timeout.as_millis() as u64,
        }
    }
}

impl TimersSection {
    pub fn timers(&self) -> crate::repl::Timers {
        crate::repl::Timers {
            heartbeat: Duration::from_millis(self.heartbeat_ms.max(1)),
            idle_timeout: Duration::from_millis(self.idle_timeout_ms.max(1)),
        }
    }

    fn render(&self) -> String {
        format!(
            "\n[timers]\n# How often each side says it is alive, and the silence after which a\n# connection is given up and dialled again.\nheartbeat_ms = {}\nidle_timeout_ms = {}\n",
            self.heartbeat_ms, self.idle_timeout_ms
        )
    }
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
            ..PrimaryConfig::new(
                twin.data_dir.clone(),
                listen,
                metrics,
                twin_fingerprint,
                admin,
            )
        }
    }

    /// The file, with a comment on every key.
    pub fn render(&self) -> String {
        let fp = |f: &Option<Fingerprint>| f.map(|f| f.to_string()).unwrap_or_default();
        let list = |fps: &[Fingerprint]| {
            fps.iter()
                .map(|f| format!("\"{f}\""))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let clients = list(&self.client_fingerprints);
        let writers = list(&self.writer_fingerprints);
        let readers = list(&self.reader_fingerprints);
        format!(
            r#"# twinlog primary configuration.

# Where the log, the key (key.pem, mode 0600) and the certificate live.
data_dir = "{data}"
# The QUIC address the twin and clients connect to.
listen = "{listen}"
# Local HTTP address serving /metrics (Prometheus text) and /status (JSON).
metrics = "{metrics}"
# The twin's certificate fingerprint, as `twin init` printed it.
twin_fingerprint = "{twin}"
# Clients, by role (`primary pin-client --role`). Admin: every request,
# erase, retain and raw appends of twinlog's reserved kinds included (the
# admin client `init` made is one).
client_fingerprints = [{clients}]
# Writers: appends of application kinds, the store's writes, every read.
writer_fingerprints = [{writers}]
# Readers: reads, tails, status and the store's reads.
reader_fingerprints = [{readers}]
# Size new log segments are preallocated to.
segment_bytes = {segment}

{serving}{timers}"#,
            serving = AsPrimarySection::of(self).render(""),
            data = self.data_dir.display(),
            listen = self.listen,
            metrics = self.metrics,
            twin = fp(&self.twin_fingerprint),
            clients = clients,
            writers = writers,
            readers = readers,
            segment = self.segment_bytes,
            timers = self.timers.render(),
        )
    }
}

impl AsPrimarySection {
    /// `[durability]`, `[retention]` and `[limits]`, each named after
    /// `prefix` (`as_primary.` in `twin.toml`), with a comment on every key.
    fn render(&self, prefix: &str) -> String {
        format!(
            r#"[{prefix}durability]
# What a `twin` append does while the twin does not acknowledge it:
# "wait" (the default), "fail" after timeout_ms, or "fallback" to local
# durability after timeout_ms until the twin has caught up.
policy = "{policy}"
timeout_ms = {timeout}

[{prefix}retention]
# Bytes of log past which the oldest whole segments are dropped: first
# those the twin has acknowledged, then, if the log is still over, those it
# has not (it is then below the floor and gets a snapshot). 0 keeps all.
max_bytes = {max_bytes}

[{prefix}limits]
# Milliseconds a client may leave a request's body without sending a byte
# before the request is cut off (BodyStalled) and nothing of it is written;
# it must also send a piece (256 KiB) every four times this (BodyTooSlow).
# Answers the client does not take for this long are cut off too.
body_piece_timeout_ms = {body_piece}
# The largest body in MiB a request may carry (an append past 1 MiB, a
# push, a large object); it is staged whole on disk (an unnamed file beside
# the log) before the log's writer or the store is taken, so a client that
# stalls mid-body holds up no one. A larger body is refused before any of
# it is read.
staged_body_max_mib = {staged_max}
# MiB of disk that staged bodies share; a body past it waits its turn. One
# client may hold half of it (or one largest body).
staging_mib = {staging}
# MiB that requests may hold in memory together (appended blobs up to
# 1 MiB, documents, listings, a piece in hand per answer or streamed body);
# a request past it waits its turn. One client may hold a quarter (at least
# 16 MiB), one role three quarters, and admins always find an eighth.
memory_budget_mib = {memory_budget}
# Client connections served at once (admins have 4 more); one past it is
# closed at once. One client may hold a quarter of them (at least 4), one
# role three quarters. Each may have 32 requests open and buffer up to
# 24 MiB in flight, so the primary's memory is bounded by about this times
# 24 MiB plus the budget above plus the log's own (see the README).
max_client_connections = {max_clients}"#,
            policy = match self.durability.policy {
                Policy::Wait => "wait",
                Policy::Fail => "fail",
                Policy::Fallback => "fallback",
            },
            timeout = self.durability.timeout_ms,
            max_bytes = self.retention.max_bytes,
            body_piece = self.limits.body_piece_timeout_ms,
            memory_budget = self.limits.memory_budget_mib,
            staged_max = self.limits.staged_body_max_mib,
            staging = self.limits.staging_mib,
            max_clients = self.limits.max_client_connections,
        )
    }
}

impl TwinConfig {
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        load(path)
    }

    pub fn render(&self) -> String {
        format!(
            r#"# twinlog twin configuration.

# Where the log, the key (key.pem, mode 0600) and the certificate live.
data_dir = "{data}"
# The primary's QUIC address.
primary = "{primary}"
# The primary's certificate fingerprint, as `primary init` printed it.
primary_fingerprint = "{fp}"
# Local HTTP address serving /metrics (Prometheus text) and /status (JSON).
metrics = "{metrics}"
# Size new log segments are preallocated to.
segment_bytes = {segment}
# Where this box serves clients once a switchover (`primary switchover`)
# makes it the primary.
listen_as_primary = "{listen_as_primary}"
# `twin promote` refuses, unless forced, while this twin heard its primary
# within this many milliseconds: the primary may be alive and cut off from
# this box only.
promote_quiet_ms = {promote_quiet_ms}
# Where boxes being restored from this twin connect (commented out: none),
# and the fingerprints allowed to (`twin pin-restore`).
{restore_listen}
restore_fingerprints = [{restorers}]

[retention]
# Bytes of log past which the oldest sealed segments are dropped, and the
# age in seconds past which a sealed segment is dropped (0: no limit). What
# the store has not applied, the segment of the head frame and the frames a
# restore being served needs always stay; a restore from beyond the floor
# starts from a snapshot of the store.
max_bytes = {twin_max_bytes}
max_age_secs = {twin_max_age}
{timers}
# What this box serves with once a switchover or a promotion makes it the
# primary: the sections of primary.toml of the same names. A deposed
# primary that follows as the twin keeps its own here.
{as_primary}

[restore_expiry]
# When each restore pin expires (`twin pin-restore --expires-in`): from then
# on that box's handshakes are refused.
{expiry}"#,
            twin_max_bytes = self.retention.max_bytes,
            twin_max_age = self.retention.max_age_secs,
            as_primary = self.as_primary.render("as_primary."),
            restore_listen = self.restore_listen.as_ref().map_or(
                "# restore_listen = \"0.0.0.0:7401\"".to_owned(),
                |a| format!("restore_listen = \"{a}\"")
            ),
            restorers = self
                .restore_fingerprints
                .iter()
                .map(|f| format!("\"{f}\""))
                .collect::<Vec<_>>()
                .join(", "),
            timers = self.timers.render(),
            data = self.data_dir.display(),
            primary = self.primary,
            fp = self
                .primary_fingerprint
                .map(|f| f.to_string())
                .unwrap_or_default(),
            metrics = self.metrics,
            segment = self.segment_bytes,
            listen_as_primary = self.listen_as_primary,
            promote_quiet_ms = self.promote_quiet_ms,
            expiry = self
                .restore_expiry
                .iter()
                .map(|(fp, at)| format!("\"{fp}\" = \"{at}\"\n"))
                .collect::<String>(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> PrimaryConfig {
        PrimaryConfig {
            data_dir: "/var/lib/twinlog".into(),
            listen: "0.0.0.0:7400".parse().expect("addr"),
            metrics: "127.0.0.1:9400".parse().expect("addr"),
            twin_fingerprint: Some(Fingerprint([1; 32])),
            client_fingerprints: vec![Fingerprint([2; 32])],
            writer_fingerprints: vec![Fingerprint([4; 32])],
            reader_fingerprints: vec![Fingerprint([5; 32])],
            durability: DurabilitySection {
                policy: Policy::Fallback,
                timeout_ms: 250,
            },
            segment_bytes: 1 << 20,
            timers: TimersSection {
                heartbeat_ms: 20,
                idle_timeout_ms: 300,
            },
            retention: RetentionSection { max_bytes: 1 << 30 },
            limits: Default::default(),
        }
    }

    #[test]
    fn rendered_files_load_back() {
        let c = sample();
        assert_eq!(
            toml::from_str::<PrimaryConfig>(&c.render()).expect("parse"),
            c
        );
        let t = TwinConfig {
            data_dir: "/d".into(),
            primary: "10.0.0.1:7400".parse().expect("addr"),
            primary_fingerprint: None,
            metrics: "127.0.0.1:9401".parse().expect("addr"),
            segment_bytes: 4096,
            timers: TimersSection::default(),
            restore_listen: Some("0.0.0.0:7401".parse().expect("addr")),
            restore_fingerprints: vec![Fingerprint([3; 32])],
            retention: TwinRetentionSection {
                max_bytes: 256 << 20,
                max_age_secs: 86_400,
            },
            listen_as_primary: "0.0.0.0:7500".parse().expect("addr"),
            restore_expiry: Default::default(),
            promote_quiet_ms: default_promote_quiet_ms(),
            as_primary: AsPrimarySection {
                durability: DurabilitySection {
                    policy: Policy::Fallback,
                    timeout_ms: 250,
                },
                retention: RetentionSection { max_bytes: 1 << 30 },
                limits: LimitsSection {
                    memory_budget_mib: 64,
                    max_client_connections: 16,
                    ..LimitsSection::default()
                },
            },
        };
        assert_eq!(toml::from_str::<TwinConfig>(&t.render()).expect("parse"), t);
    }

    #[test]
    fn addresses_are_ip_addresses_or_hostnames_and_resolve_at_use() {
        for ok in [
            "10.0.0.1:7400",
            "[::1]:7400",
            "twin.example:7401",
            "localhost:1",
        ] {
            let a: Address = ok.parse().expect(ok);
            assert_eq!(a.to_string(), ok);
        }
        let local: Address = "localhost:7400".parse().expect("addr");
        let resolved = local.resolve().expect("localhost resolves");
        assert!(resolved.ip().is_loopback() && resolved.port() == 7400);
        for bad in [
            "twin.example",
            "twin.example:http",
            "::1:7400",
            "a b:1",
            ":7400",
            "-x:1",
        ] {
            let e = bad.parse::<Address>().expect_err(bad);
            assert!(e.contains("HOST:PORT"), "{bad}: {e}");
        }
        let text = sample()
            .render()
            .replace("0.0.0.0:7400", "primary.example:7400");
        let c = toml::from_str::<PrimaryConfig>(&text).expect("a hostname");
        assert_eq!(c.listen.as_str(), "primary.example:7400");
        let text = sample().render().replace("0.0.0.0:7400", "0.0.0.0");
        let e = toml::from_str::<PrimaryConfig>(&text)
            .expect_err("no port")
            .to_string();
        assert!(e.contains("listen") && e.contains("line"), "{e}");
    }

    #[test]
    fn values_that_cannot_work_are_refused_with_the_key_and_line() {
        let cases = [
            (
                "segment_bytes = 1048576",
                "segment_bytes = 10",
                "segment_bytes",
            ),
            ("heartbeat_ms = 20", "heartbeat_ms = 0", "heartbeat_ms"),
            (
                "idle_timeout_ms = 300",
                "idle_timeout_ms = 10",
                "idle_timeout_ms",
            ),
            (
                "heartbeat_ms = 20",
                "heartbeat_ms = 200",
                "twice heartbeat_ms",
            ),
            ("timeout_ms = 250", "timeout_ms = 0", "timeout_ms"),
            ("staging_mib = 2048", "staging_mib = 0", "staging_mib"),
            (
                "staged_body_max_mib = 1024",
                "staged_body_max_mib = 4096",
                "staged_body_max_mib = 4096 is more than staging_mib",
            ),
            (
                "staged_body_max_mib = 1024",
                "staged_body_max_mib = 0",
                "staged_body_max_mib = 0: it must be from 1",
            ),
            (
                "body_piece_timeout_ms = 3000",
                "body_piece_timeout_ms = 10",
                "body_piece_timeout_ms",
            ),
        ];
        for (good, bad, key) in cases {
            let text = sample().render();
            assert!(text.contains(good), "{good}");
            let e = toml::from_str::<PrimaryConfig>(&text.replace(good, bad))
                .expect_err(bad)
                .to_string();
            assert!(e.contains(key) && e.contains("line"), "{bad}: {e}");
        }
    }

    #[test]
    fn unknown_keys_and_bad_values_name_the_key_and_line() {
        let text = sample().render().replace("segment_bytes", "segmnt_bytes");
        let e = toml::from_str::<PrimaryConfig>(&text)
            .expect_err("unknown key")
            .to_string();
        assert!(e.contains("segmnt_bytes") && e.contains("line"), "{e}");
        let text = sample().render().replace("\"fallback\"", "\"sometimes\"");
        let e = toml::from_str::<PrimaryConfig>(&text)
            .expect_err("bad value")
            .to_string();
        assert!(e.contains("sometimes") && e.contains("line"), "{e}");
        let text = sample()
            .render()
            .replace(&Fingerprint([1; 32]).to_string(), "abc");
        let e = toml::from_str::<PrimaryConfig>(&text)
            .expect_err("bad fingerprint")
            .to_string();
        assert!(e.contains("fingerprint") && e.contains("line"), "{e}");
    }

    #[test]
    fn a_twin_s_retention_keys_load_and_a_bad_one_is_named_with_its_line() {
        let t = TwinConfig {
            data_dir: "/d".into(),
            primary: "10.0.0.1:7400".parse().expect("addr"),
            primary_fingerprint: None,
            metrics: "127.0.0.1:9401".parse().expect("addr"),
            segment_bytes: 4096,
            timers: TimersSection::default(),
            restore_listen: None,
            restore_fingerprints: Vec::new(),
            retention: TwinRetentionSection {
                max_bytes: 1 << 30,
                max_age_secs: 3600,
            },
            listen_as_primary: default_listen_as_primary(),
            restore_expiry: Default::default(),
            promote_quiet_ms: default_promote_quiet_ms(),
            as_primary: Default::default(),
        };
        let text = t.render();
        assert_eq!(toml::from_str::<TwinConfig>(&text).expect("parse"), t);
        let e =
            toml::from_str::<TwinConfig>(&text.replace("max_age_secs = 3600", "max_age_secs = -1"))
                .expect_err("negative age")
                .to_string();
        assert!(e.contains("max_age_secs") && e.contains("line"), "{e}");
        let e = toml::from_str::<TwinConfig>(&text.replace("max_bytes", "max_byte"))
            .expect_err("unknown key")
            .to_string();
        assert!(e.contains("max_byte") && e.contains("line"), "{e}");
        // A twin.toml written before the section existed keeps everything.
        let old = text.split("[retention]").next().expect("head").to_owned()
            + &TimersSection::default().render();
        let loaded = toml::from_str::<TwinConfig>(&old).expect("parse");
        assert_eq!(loaded.retention, TwinRetentionSection::default());
    }
}
