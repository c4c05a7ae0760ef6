//! `[failover]`: automatic failover under an etcd arbiter, the same
//! section in `primary.toml` and `twin.toml`. Without it, promotion is an
//! operator's (`twin promote`).

use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize};

use super::Address;
use crate::node::arbiter::ArbiterOptions;

/// The lease time to live the arbiter may be asked for, in seconds. etcd
/// refuses less than about two seconds (its election timeout); past a
/// minute a dead primary holds writes up that long.
pub const LEASE_TTL_S: std::ops::RangeInclusive<u64> = 2..=60;

/// `[failover]`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FailoverSection {
    /// etcd's client URLs (`http://10.0.0.5:2379`), every member.
    #[serde(deserialize_with = "de_endpoints")]
    pub etcd: Vec<String>,
    /// The pair's name: its keys are `/twinlog/<cluster>/`.
    #[serde(deserialize_with = "de_cluster")]
    pub cluster: String,
    /// The primary's lease: a dead primary is replaced about this long
    /// after its last renewal.
    #[serde(default = "default_lease_ttl_s", deserialize_with = "de_lease_ttl_s")]
    pub lease_ttl_s: u64,
    /// A deposed primary rejoins the new one as its twin by itself
    /// (truncate-to-fork, its divergent tail saved).
    #[serde(default = "default_auto_rejoin")]
    pub auto_rejoin: bool,
    /// Where clients reach this box as the primary, told to them through
    /// the arbiter; by default the address it listens on as one.
    #[serde(default)]
    pub advertise: Option<Address>,
    /// Where the other box serves as a primary (its `advertise`): asked
    /// for its epoch history when etcd forgot. A twin asks the primary
    /// it follows; a box learns the other's address from etcd's leader
    /// record and from a promotion, so this is needed only for a pair
    /// that never failed over.
    #[serde(default)]
    pub peer: Option<Address>,
}

pub fn default_lease_ttl_s() -> u64 {
    5
}

fn default_auto_rejoin() -> bool {
    true
}

fn de_lease_ttl_s<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    let v = u64::deserialize(d)?;
    super::within("lease_ttl_s", v, &LEASE_TTL_S).map_err(serde::de::Error::custom)?;
    Ok(v)
}

fn de_endpoints<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    let v = Vec::<String>::deserialize(d)?;
    if v.is_empty() {
        return Err(serde::de::Error::custom(
            "etcd = []: name at least one etcd member's client URL",
        ));
    }
    for e in &v {
        if !(e.starts_with("http://") || e.starts_with("https://")) || e.len() > 256 {
            return Err(serde::de::Error::custom(format!(
                "etcd = {e:?}: a client URL starts with http:// or https://"
            )));
        }
    }
    Ok(v)
}

fn de_cluster<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    let v = String::deserialize(d)?;
    crate::repl::arbiter::Keys::of(&v).map_err(serde::de::Error::custom)?;
    Ok(v)
}

impl FailoverSection {
    /// What the node runs with; `serving` is where this box serves
    /// clients as the primary, advertised unless `advertise` says
    /// otherwise.
    pub fn options(&self, serving: &Address) -> ArbiterOptions {
        ArbiterOptions {
            endpoints: self.etcd.clone(),
            cluster: self.cluster.clone(),
            ttl: Duration::from_secs(self.lease_ttl_s),
            advertise: self.advertise.as_ref().unwrap_or(serving).to_string(),
        }
    }

    /// The section, with a comment on every key.
    pub fn render(&self) -> String {
        let etcd = self
            .etcd
            .iter()
            .map(|e| format!("\"{e}\""))
            .collect::<Vec<_>>()
            .join(", ");
        let advertise = match &self.advertise {
            Some(a) => format!("advertise = \"{a}\"\n"),
            None => String::new(),
        };
        let peer = match &self.peer {
            Some(a) => format!(
                "# Where the other box serves as a primary: asked for its epoch\n# history when etcd forgot.\npeer = \"{a}\"\n"
            ),
            None => String::new(),
        };
        format!(
            r#"
# Automatic failover under an etcd arbiter.
[failover]
# etcd's client URLs, every member.
etcd = [{etcd}]
# The pair's name: its keys are /twinlog/<cluster>/.
cluster = "{cluster}"
# The primary's lease, in seconds: a dead primary is replaced about this
# long after its last renewal; a primary cut off from etcd stops
# acknowledging before then.
lease_ttl_s = {ttl}
# A deposed primary rejoins the new one as its twin by itself.
auto_rejoin = {rejoin}
{advertise}{peer}"#,
            cluster = self.cluster,
            ttl = self.lease_ttl_s,
            rejoin = self.auto_rejoin,
        )
    }
}
