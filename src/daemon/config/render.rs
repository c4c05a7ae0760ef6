//! The files written back, with a comment on every key.

use super::{AsPrimarySection, Policy, PrimaryConfig, TwinConfig};
use crate::net::Fingerprint;

impl PrimaryConfig {
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

{serving}{timers}{failover}{archive}"#,
            failover = self
                .failover
                .as_ref()
                .map(|f| f.render())
                .unwrap_or_default(),
            archive = self
                .archive
                .as_ref()
                .map(|a| a.render())
                .unwrap_or_default(),
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
{expiry}{failover}{archive}"#,
            failover = self
                .failover
                .as_ref()
                .map(|f| f.render())
                .unwrap_or_default(),
            archive = self
                .archive
                .as_ref()
                .map(|a| a.render())
                .unwrap_or_default(),
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
