//! Online verify, carried out: the rules are [`crate::repl::verify`]'s.
//! Both sides digest on a blocking thread, paced so that a verify of the
//! whole log takes the disk and a core for a bounded share while clients
//! append; the primary's twin session carries the questions.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::log::Log;
use crate::repl::epochs::EpochHistory;
use crate::repl::verify::{self, Ask, Digest};

/// What a verify found, as `status` and `primary verify` show it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct VerifyReport {
    /// The range compared.
    pub from: u64,
    pub through: u64,
    /// The first frame that differs between the two boxes, if one does.
    pub first_difference: Option<u64>,
    /// Why the verify stopped before the end, if it did (the twin went,
    /// a frame did not read).
    pub stopped: Option<String>,
    /// Blob bytes this box read for it.
    pub bytes: u64,
    /// When it ended, ms since the Unix epoch, and how long it took.
    pub ended_ms: u64,
    pub took_ms: u64,
    /// The pace each box read at, MiB/s.
    #[serde(default)]
    pub mib_per_s: u32,
}

/// The pace a verify reads at by default, on each box: a share of the
/// disk and of the CPU (SHA-256), not all of either.
pub const VERIFY_MIB_PER_S: u32 = 64;

/// The fastest pace a verify may ask for.
pub const MAX_VERIFY_MIB_PER_S: u32 = 4096;

/// Bytes a second for a verify asked at `mib_per_s` (0: the default),
/// within [`MAX_VERIFY_MIB_PER_S`].
pub fn verify_rate(mib_per_s: u32) -> u64 {
    let mib = match mib_per_s {
        0 => VERIFY_MIB_PER_S,
        n => n.min(MAX_VERIFY_MIB_PER_S),
    };
    u64::from(mib) << 20
}

/// Reading at most `rate` bytes a second, on average, by sleeping when
/// ahead (on the blocking thread that reads).
pub struct Pace {
    rate: u64,
    started: Instant,
    bytes: u64,
}

impl Pace {
    pub fn new(rate: u64) -> Pace {
        Pace {
            rate: rate.max(1),
            // The pace sleeps on its thread, so it measures on the
            // machine's clock, not tokio's.
            started: crate::clock::monotonic(),
            bytes: 0,
        }
    }

    pub fn read(&mut self, n: u64) {
        self.bytes += n;
        let due = Duration::from_secs_f64(self.bytes as f64 / self.rate as f64);
        let elapsed = crate::clock::monotonic().saturating_duration_since(self.started);
        if due > elapsed + Duration::from_millis(20) {
            std::thread::sleep(due - elapsed);
        }
    }

    pub fn bytes(&self) -> u64 {
        self.bytes
    }
}

/// Why this box has no digests for a verify's question.
#[derive(Debug, thiserror::Error)]
pub enum DigestError {
    /// The log did not read.
    #[error("{0}")]
    Log(#[from] crate::log::Error),
    /// The blocking task that read it did not finish.
    #[error("{0}")]
    Task(#[from] tokio::task::JoinError),
}

/// This box's digests of `ask`, read on a blocking thread at `rate`.
/// Answers them and the bytes read.
pub async fn digests(
    log: Arc<Log>,
    epochs: EpochHistory,
    ask: Ask,
    rate: u64,
) -> Result<(Vec<Digest>, u64), DigestError> {
    tokio::task::spawn_blocking(move || {
        let (mut pace, mut blob_bytes) = (Pace::new(rate), 0u64);
        let d = verify::digests(
            &log,
            &epochs,
            ask.from,
            ask.through,
            ask.step,
            |frames, bytes| {
                blob_bytes += bytes;
                pace.read(bytes + frames * verify::FRAME_COST)
            },
        )?;
        Ok((d, blob_bytes))
    })
    .await?
}

/// Milliseconds since the Unix epoch, for the report.
pub use crate::node::clock::unix_ms;
