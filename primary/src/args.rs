//! Argument values checked as clap parses them, so a bad one is a usage
//! error (exit 2) that names the argument, before anything is asked of the
//! daemon.

use std::path::{Path, PathBuf};

use clap::Args;
use twinlog::daemon::{DaemonError, PrimaryConfig};
use twinlog::node::api::RefMove;
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
