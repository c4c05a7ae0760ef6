//! The sections a configuration shares between its files: durability,
//! retention, timers and limits, each checked as it loads.

use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize};

use crate::node::TwinPolicy;

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

pub(super) fn de_segment_bytes<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
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

/// A setting of a section that cannot be used, by name.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SettingError {
    #[error("{name} = {value}: it must be from {start} to {end}")]
    OutOfRange {
        name: &'static str,
        value: u64,
        start: u64,
        end: u64,
    },
    #[error("staged_body_max_mib = {body} is more than staging_mib = {staging}: no body that large could be staged")]
    BodyPastStaging { body: u64, staging: u64 },
    #[error("idle_timeout_ms = {idle} must be at least twice heartbeat_ms = {heartbeat}, or one late heartbeat drops the connection")]
    IdleUnderTwoHeartbeats { idle: u64, heartbeat: u64 },
}

/// `name = value` is refused unless `range` holds it, saying the range.
pub(super) fn within(
    name: &'static str,
    value: u64,
    range: &std::ops::RangeInclusive<u64>,
) -> Result<(), SettingError> {
    if range.contains(&value) {
        Ok(())
    } else {
        Err(SettingError::OutOfRange {
            name,
            value,
            start: *range.start(),
            end: *range.end(),
        })
    }
}

impl TryFrom<RawLimits> for LimitsSection {
    type Error = SettingError;

    fn try_from(r: RawLimits) -> Result<LimitsSection, SettingError> {
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
            return Err(SettingError::BodyPastStaging {
                body: r.staged_body_max_mib,
                staging: r.staging_mib,
            });
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
    type Error = SettingError;

    fn try_from(r: RawTimers) -> Result<TimersSection, SettingError> {
        let (hb, idle) = (r.heartbeat_ms, r.idle_timeout_ms);
        within("heartbeat_ms", hb, &HEARTBEAT_MS)?;
        within("idle_timeout_ms", idle, &IDLE_TIMEOUT_MS)?;
        if idle < 2 * hb {
            return Err(SettingError::IdleUnderTwoHeartbeats {
                idle,
                heartbeat: hb,
            });
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

    pub(super) fn render(&self) -> String {
        format!(
            "\n[timers]\n# How often each side says it is alive, and the silence after which a\n# connection is given up and dialled again.\nheartbeat_ms = {}\nidle_timeout_ms = {}\n",
            self.heartbeat_ms, self.idle_timeout_ms
        )
    }
}
