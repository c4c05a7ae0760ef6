//! Drills: named runs that break real processes, disks and links on purpose
//! and check, with numbers, that nothing acknowledged is lost.
//!
//! - [`archive`]: the archive drill's record of acknowledged frames and
//!   its checks of a log restored from the archive;
//! - [`archive_pair`]: a pair archiving to Garage as the archive drills
//!   run it, its writers, and `primary restore --from-archive` run;
//! - [`archive_adversary`]: the attacks on the bucket of the archive
//!   drill's adversary phase, and its checks;
//! - [`auto_failover`]: the automatic-failover drill's acknowledgements
//!   and its checks;
//! - [`content`]: the frames a drill writes, checkable from their names;
//! - [`daemons`]: the real binaries as host processes, their logs and data
//!   directories as a checker reads them;
//! - [`marker`]: the acknowledgement records the power-cut guest writes to a
//!   raw region of the logged disk;
//! - [`dmlog`]: the dm-log-writes format QEMU's `blklogwrites` driver writes,
//!   and its replay;
//! - [`powercut`]: the check of one replayed disk state;
//! - [`pair`], [`pair_check`]: the pair power-cut drill's frames, and the
//!   check of one state with the real daemons.

pub mod archive;
pub mod archive_adversary;
pub mod archive_pair;
pub mod auto_failover;
pub mod content;
pub mod daemons;
pub mod dmlog;
pub mod marker;
pub mod pair;
pub mod pair_check;
pub mod powercut;

/// A drill's error: what failed, with the context a reader needs.
#[derive(Debug)]
pub struct DrillError(pub String);

impl std::fmt::Display for DrillError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for DrillError {}

/// A drill's result.
pub type Result<T, E = DrillError> = std::result::Result<T, E>;

/// A drill's exit code from its outcome: 0 when its invariant held, 1 when
/// it broke, 2 when the drill could not run (said on stderr, after `name`).
pub fn verdict(name: &str, outcome: Result<bool>) -> std::process::ExitCode {
    match outcome {
        Ok(true) => std::process::ExitCode::SUCCESS,
        Ok(false) => std::process::ExitCode::from(1),
        Err(e) => {
            eprintln!("{name}: the drill could not run: {e}");
            std::process::ExitCode::from(2)
        }
    }
}

/// Attach what was being done to any displayable error.
pub trait Context<T> {
    fn ctx(self, what: impl FnOnce() -> String) -> Result<T>;
}

impl<T, E: std::fmt::Display> Context<T> for std::result::Result<T, E> {
    fn ctx(self, what: impl FnOnce() -> String) -> Result<T> {
        self.map_err(|e| DrillError(format!("{}: {e}", what())))
    }
}

/// A small deterministic generator (xorshift64*), for reproducible drills.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// A number in `0..n` (`n` > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }
}

/// `--key value` arguments, and `--flag` alone for a true flag.
#[derive(Debug, Default)]
pub struct Args(pub std::collections::HashMap<String, String>);

impl Args {
    pub fn parse(flags: &[&str]) -> Result<Args> {
        Args::parse_from(std::env::args().skip(1), flags)
    }

    /// The arguments `args`, `flags` being the keys without a value.
    pub fn parse_from(args: impl Iterator<Item = String>, flags: &[&str]) -> Result<Args> {
        let mut map = std::collections::HashMap::new();
        let mut it = args;
        while let Some(a) = it.next() {
            let Some(key) = a.strip_prefix("--") else {
                return Err(DrillError(format!("unexpected argument {a:?}")));
            };
            let value = if flags.contains(&key) {
                "true".to_owned()
            } else {
                it.next()
                    .ok_or_else(|| DrillError(format!("--{key} needs a value")))?
            };
            map.insert(key.to_owned(), value);
        }
        Ok(Args(map))
    }

    pub fn path(&self, key: &str) -> Result<std::path::PathBuf> {
        self.0
            .get(key)
            .map(std::path::PathBuf::from)
            .ok_or_else(|| DrillError(format!("--{key} is required")))
    }

    pub fn opt_path(&self, key: &str) -> Option<std::path::PathBuf> {
        self.0.get(key).map(std::path::PathBuf::from)
    }

    pub fn num(&self, key: &str, default: u64) -> Result<u64> {
        self.0.get(key).map_or(Ok(default), |v| {
            v.parse()
                .map_err(|e| DrillError(format!("--{key} {v}: {e}")))
        })
    }

    pub fn flag(&self, key: &str) -> bool {
        self.0.contains_key(key)
    }
}

/// A guest's parameters: the `drill.KEY=VALUE` words of the kernel command
/// line (`/proc/cmdline`), or of the file after `--cmdline` for a run on a
/// host.
pub struct GuestParams(std::collections::HashMap<String, String>);

impl GuestParams {
    pub fn read() -> Result<GuestParams> {
        let args: Vec<String> = std::env::args().collect();
        let path = match args.iter().position(|a| a == "--cmdline") {
            Some(i) => args
                .get(i + 1)
                .cloned()
                .ok_or_else(|| DrillError("--cmdline needs a file".into()))?,
            None => "/proc/cmdline".into(),
        };
        let text = std::fs::read_to_string(&path).ctx(|| format!("read {path}"))?;
        Ok(GuestParams(
            text.split_whitespace()
                .filter_map(|w| w.strip_prefix("drill."))
                .filter_map(|w| w.split_once('='))
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect(),
        ))
    }

    pub fn num(&self, key: &str, default: u64) -> Result<u64> {
        self.0.get(key).map_or(Ok(default), |v| {
            v.parse().ctx(|| format!("drill.{key}={v}"))
        })
    }

    pub fn text(&self, key: &str, default: &str) -> String {
        self.0.get(key).map_or(default.to_owned(), String::clone)
    }
}
