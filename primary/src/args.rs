//! Argument values checked as clap parses them, so a bad one is a usage
//! error (exit 2) that names the argument, before anything is asked of the
//! daemon.

use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Args;
use twinlog::daemon::{DaemonError, PrimaryConfig};
use twinlog::node::api::RefMove;
use twinlog::node::ClientOptions;
use twinlog::store::frames::{check_doc_name, check_repo_name, unhex};

/// The environment variable `--config` falls back to.
pub const CONFIG_ENV: &str = "TWINLOG_CONFIG";

/// `--config`, on every command that reads the configuration: accepted
/// anywhere after the command's name, or from `TWINLOG_CONFIG`.
#[derive(Args, Clone, Debug)]
pub struct ConfigArg {
    /// The primary's configuration file (primary.toml, as `init` wrote it)
    #[arg(
        long,
        short,
        global = true,
        env = CONFIG_ENV,
        hide_env_values = true,
        value_name = "FILE"
    )]
    config: Option<PathBuf>,
}

impl ConfigArg {
    /// The file given.
    pub fn path(&self) -> Result<&Path, DaemonError> {
        self.config.as_deref().ok_or_else(|| {
            DaemonError::Usage(format!(
                "no configuration: give --config FILE (primary.toml, as `primary init` wrote it) or set {CONFIG_ENV}"
            ))
        })
    }

    /// The configuration, loaded and checked.
    pub fn load(&self) -> Result<PrimaryConfig, DaemonError> {
        Ok(PrimaryConfig::load(self.path()?)?)
    }
}

/// `--timeout`, on every command that talks to the running daemon over
/// QUIC: accepted anywhere after the command's name.
#[derive(Args, Clone, Debug)]
pub struct TimeoutArg {
    /// How long to wait for the daemon: for an answer (a twin write's waits
    /// for the twin too) and for each piece of a transfer as it streams
    /// (500ms, 5s, 2m)
    #[arg(
        long,
        global = true,
        default_value = "5s",
        value_parser = duration,
        value_name = "DURATION"
    )]
    timeout: Duration,
}

impl TimeoutArg {
    /// The client's options.
    pub fn options(&self) -> ClientOptions {
        ClientOptions {
            deadline: self.timeout,
        }
    }
}

/// A duration: a number and its unit, `ms`, `s`, `m` or `h` (`s` when
/// none), from 1 ms to a day.
pub fn duration(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (n, unit) = t.split_at(split);
    let scale = match unit.trim() {
        "ms" => 1e-3,
        "" | "s" => 1.0,
        "m" | "min" => 60.0,
        "h" => 3600.0,
        _ => return Err("not a duration: a number and ms, s, m or h (500ms, 5s, 2m)".into()),
    };
    let n: f64 = n
        .parse()
        .map_err(|_| "not a duration: a number and ms, s, m or h (500ms, 5s, 2m)".to_string())?;
    let secs = n * scale;
    if !(1e-3..=86_400.0).contains(&secs) {
        return Err("from 1ms to a day (24h)".into());
    }
    Ok(Duration::from_secs_f64(secs))
}

/// A log sequence: sequences start at 1.
pub fn seq(s: &str) -> Result<u64, String> {
    match s.parse::<u64>() {
        Ok(0) => Err("sequences start at 1".into()),
        Ok(n) => Ok(n),
        Err(_) => Err("not a sequence number (1, 2, ...)".into()),
    }
}

/// A repository name the store accepts.
pub fn repo_name(s: &str) -> Result<String, String> {
    check_repo_name(s).map_err(|e| e.to_string())?;
    Ok(s.to_owned())
}

/// A control document name the store accepts.
pub fn doc_name(s: &str) -> Result<String, String> {
    check_doc_name(s).map_err(|e| e.to_string())?;
    Ok(s.to_owned())
}

/// A git object id: 40 hex digits.
pub fn oid(s: &str) -> Result<[u8; 20], String> {
    unhex::<20>(s).ok_or_else(|| "not a git object id (40 hex digits)".into())
}

/// A large object's id: its SHA-256, 64 hex digits.
pub fn lfs_oid(s: &str) -> Result<[u8; 32], String> {
    unhex::<32>(s).ok_or_else(|| "not a large object id (a SHA-256: 64 hex digits)".into())
}

/// One side of a ref update: an object id, or none (empty, or git's 40
/// zeros).
fn ref_end(s: &str) -> Result<Option<[u8; 20]>, String> {
    if s.is_empty() || (s.len() == 40 && s.bytes().all(|b| b == b'0')) {
        return Ok(None);
    }
    oid(s).map(Some).map_err(|e| format!("{s:?}: {e}"))
}

/// A ref update, `NAME=OLD..NEW`.
pub fn ref_move(s: &str) -> Result<RefMove, String> {
    let (name, ends) = s
        .rsplit_once('=')
        .ok_or("expected NAME=OLD..NEW, as refs/heads/main=OLD..NEW")?;
    let (old, new) = ends
        .split_once("..")
        .ok_or("expected NAME=OLD..NEW, as refs/heads/main=OLD..NEW")?;
    if name.is_empty() {
        return Err("the ref has no name".into());
    }
    let (old, new) = (ref_end(old)?, ref_end(new)?);
    if old.is_none() && new.is_none() {
        return Err("OLD and NEW are both empty: nothing to do".into());
    }
    Ok(RefMove {
        name: name.to_owned(),
        old,
        new,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ref_moves_create_update_and_delete() {
        let a = "a".repeat(40);
        let b = "b".repeat(40);
        let up = ref_move(&format!("refs/heads/main={a}..{b}")).expect("update");
        assert_eq!(up.name, "refs/heads/main");
        assert_eq!((up.old, up.new), (Some([0xaa; 20]), Some([0xbb; 20])));
        let create = ref_move(&format!("refs/tags/v1=..{b}")).expect("create");
        assert_eq!((create.old, create.new), (None, Some([0xbb; 20])));
        let zeros = "0".repeat(40);
        let create = ref_move(&format!("refs/tags/v1={zeros}..{b}")).expect("create");
        assert_eq!(create.old, None);
        let delete = ref_move(&format!("refs/heads/old={a}..")).expect("delete");
        assert_eq!((delete.old, delete.new), (Some([0xaa; 20]), None));
        assert!(ref_move("refs/heads/main").is_err());
        assert!(ref_move("refs/heads/main=..").is_err());
        assert!(ref_move(&format!("={a}..{b}")).is_err());
        assert!(ref_move(&format!("main=xyz..{b}")).is_err());
    }

    #[test]
    fn durations_take_their_unit() {
        assert_eq!(duration("5s"), Ok(Duration::from_secs(5)));
        assert_eq!(duration("5"), Ok(Duration::from_secs(5)));
        assert_eq!(duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(duration("1h"), Ok(Duration::from_secs(3600)));
        for bad in [
            "",
            "s",
            "5 parsecs",
            "-1s",
            "0s",
            "0.1ms",
            "2d",
            "25h",
            "1.2.3s",
        ] {
            assert!(duration(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn sequence_zero_says_sequences_start_at_one() {
        assert_eq!(seq("0"), Err("sequences start at 1".into()));
        assert_eq!(seq("7"), Ok(7));
        assert!(seq("-1").is_err());
    }
}

/// What an erase is before: a sequence, or a time.
#[derive(Clone, Copy, Debug)]
pub enum Before {
    Seq(u64),
    /// Milliseconds since the Unix epoch.
    Time(u64),
}

/// `--before`: a sequence (`1200`) or an RFC 3339 UTC time
/// (`2026-11-01T00:00Z`, `2026-11-01`).
pub fn before(s: &str) -> Result<Before, String> {
    if s.bytes().all(|b| b.is_ascii_digit()) {
        return seq(s).map(Before::Seq);
    }
    twinlog::daemon::parse_utc(s)
        .map(Before::Time)
        .ok_or_else(|| "neither a sequence (1200) nor a UTC time (2026-11-01T00:00Z)".into())
}
