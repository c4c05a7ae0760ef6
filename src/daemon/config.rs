//! The daemons' TOML configuration: unknown keys and bad values are refused
//! with the key's name and line, and `render` writes a commented file.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
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
    pub timeout_ms: u64,
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
#[serde(deny_unknown_fields)]
pub struct TimersSection {
    pub heartbeat_ms: u64,
    pub idle_timeout_ms: u64,
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
    pub listen: SocketAddr,
    /// The local HTTP address of `/metrics` and `/status`.
    pub metrics: SocketAddr,
    /// The twin's certificate fingerprint (`twin init` prints it).
    #[serde(deserialize_with = "de_fp", serialize_with = "ser_fp", default)]
    pub twin_fingerprint: Option<Fingerprint>,
    /// Clients allowed to append and read.
    #[serde(deserialize_with = "de_fps", serialize_with = "ser_fps", default)]
    pub client_fingerprints: Vec<Fingerprint>,
    #[serde(default)]
    pub durability: DurabilitySection,
    #[serde(default = "default_segment_bytes")]
    pub segment_bytes: u64,
    #[serde(default)]
    pub timers: TimersSection,
    #[serde(default)]
    pub retention: RetentionSection,
}

/// `twin.toml`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TwinConfig {
    pub data_dir: PathBuf,
    /// The primary's QUIC address.
    pub primary: SocketAddr,
    /// The primary's certificate fingerprint (`primary init` prints it).
    #[serde(deserialize_with = "de_fp", serialize_with = "ser_fp", default)]
    pub primary_fingerprint: Option<Fingerprint>,
    pub metrics: SocketAddr,
    #[serde(default = "default_segment_bytes")]
    pub segment_bytes: u64,
    #[serde(default)]
    pub timers: TimersSection,
    /// The QUIC address boxes being restored from this twin connect to;
    /// none serves no restore.
    #[serde(default)]
    pub restore_listen: Option<SocketAddr>,
    /// Boxes allowed to restore from this twin (`twin pin-restore`).
    #[serde(deserialize_with = "de_fps", serialize_with = "ser_fps", default)]
    pub restore_fingerprints: Vec<Fingerprint>,
    #[serde(default)]
    pub retention: TwinRetentionSection,
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

    /// The file, with a comment on every key.
    pub fn render(&self) -> String {
        let fp = |f: &Option<Fingerprint>| f.map(|f| f.to_string()).unwrap_or_default();
        let clients: Vec<String> = self
            .client_fingerprints
            .iter()
            .map(|f| format!("\"{f}\""))
            .collect();
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
# Clients allowed to append and read (the admin client `init` made is one).
client_fingerprints = [{clients}]
# Size new log segments are preallocated to.
segment_bytes = {segment}

[durability]
# What a `twin` append does while the twin does not acknowledge it:
# "wait" (the default), "fail" after timeout_ms, or "fallback" to local
# durability after timeout_ms until the twin has caught up.
policy = "{policy}"
timeout_ms = {timeout}

[retention]
# Bytes of log past which the oldest whole segments are dropped: first
# those the twin has acknowledged, then, if the log is still over, those it
# has not (it is then below the floor and gets a snapshot). 0 keeps all.
max_bytes = {max_bytes}
{timers}"#,
            max_bytes = self.retention.max_bytes,
            data = self.data_dir.display(),
            listen = self.listen,
            metrics = self.metrics,
            twin = fp(&self.twin_fingerprint),
            clients = clients.join(", "),
            segment = self.segment_bytes,
            policy = match self.durability.policy {
                Policy::Wait => "wait",
                Policy::Fail => "fail",
                Policy::Fallback => "fallback",
            },
            timeout = self.durability.timeout_ms,
            timers = self.timers.render(),
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
{timers}"#,
            twin_max_bytes = self.retention.max_bytes,
            twin_max_age = self.retention.max_age_secs,
            restore_listen = self.restore_listen.map_or(
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
        };
        assert_eq!(toml::from_str::<TwinConfig>(&t.render()).expect("parse"), t);
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
