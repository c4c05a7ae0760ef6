//! Where the time of a small append goes: a mark at each stage of its way
//! from the client through the primary, the twin and back, so that a run
//! sums into µs per stage (`cargo bench --bench peers`, case
//! `budget_twin_128b_c1`).
//!
//! Off unless [`BUDGET_ENV`] names a file prefix when the process starts
//! (or [`start`] is called): a mark then costs one relaxed load of a
//! static. On, a mark is a reading of `CLOCK_MONOTONIC` (one clock for
//! every process of the machine, so the client's, the primary's and the
//! twin's marks fall on one line) pushed to a buffer; a thread of its own
//! appends the buffer to `<prefix>.<pid>` every 50 ms as text lines
//! `<stage> <ns>`. Marks carry no sequence: with one client in flight the
//! marks between a `client_send` and its `client_received` are that
//! append's.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

/// The environment variable that turns the marks on: a file prefix.
pub const BUDGET_ENV: &str = "TWINLOG_BUDGET";

/// The stages of a small append, in the order they happen on its way
/// (the local sync runs beside the way to the twin and back).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Stage {
    /// The client is about to write its request.
    ClientSend,
    /// The primary decoded the request off its pipeline.
    PrimaryReceived,
    /// The request is queued to the appender thread.
    Queued,
    /// The appender thread took its group.
    AppenderWoken,
    /// Framed and written to the log (not yet synced).
    Staged,
    /// Published to the twin session, before the local sync.
    Published,
    /// The frames were written to the twin's QUIC stream.
    StreamWritten,
    /// The primary's fdatasync returned.
    LocalSynced,
    /// The twin read the frames off its stream.
    TwinReceived,
    /// The twin's writer thread took the batch.
    TwinWriterWoken,
    /// The twin's fdatasync returned.
    TwinSynced,
    /// The twin wrote its ack.
    TwinAckSent,
    /// The primary's twin session took the ack.
    AckReceived,
    /// The append's answer is ready on the primary.
    AnswerReady,
    /// The answer was written to the client's stream.
    AnswerSent,
    /// The client has its answer.
    ClientReceived,
}

impl Stage {
    pub const ALL: [Stage; 16] = [
        Stage::ClientSend,
        Stage::PrimaryReceived,
        Stage::Queued,
        Stage::AppenderWoken,
        Stage::Staged,
        Stage::Published,
        Stage::StreamWritten,
        Stage::LocalSynced,
        Stage::TwinReceived,
        Stage::TwinWriterWoken,
        Stage::TwinSynced,
        Stage::TwinAckSent,
        Stage::AckReceived,
        Stage::AnswerReady,
        Stage::AnswerSent,
        Stage::ClientReceived,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Stage::ClientSend => "client_send",
            Stage::PrimaryReceived => "primary_received",
            Stage::Queued => "queued",
            Stage::AppenderWoken => "appender_woken",
            Stage::Staged => "staged",
            Stage::Published => "published",
            Stage::StreamWritten => "stream_written",
            Stage::LocalSynced => "local_synced",
            Stage::TwinReceived => "twin_received",
            Stage::TwinWriterWoken => "twin_writer_woken",
            Stage::TwinSynced => "twin_synced",
            Stage::TwinAckSent => "twin_ack_sent",
            Stage::AckReceived => "ack_received",
            Stage::AnswerReady => "answer_ready",
            Stage::AnswerSent => "answer_sent",
            Stage::ClientReceived => "client_received",
        }
    }

    pub fn from_name(name: &str) -> Option<Stage> {
        Stage::ALL.into_iter().find(|s| s.name() == name)
    }
}

static ON: AtomicBool = AtomicBool::new(false);
static MARKS: Mutex<Vec<(Stage, u64)>> = Mutex::new(Vec::new());

/// Mark `stage` now; nothing when the marks are off.
#[inline]
pub fn mark(stage: Stage) {
    if ON.load(Ordering::Relaxed) {
        record(stage);
    }
}

#[cold]
fn record(stage: Stage) {
    let ns = crate::clock::monotonic_ns();
    if let Ok(mut m) = MARKS.lock() {
        m.push((stage, ns));
    }
}

/// Turn the marks on when [`BUDGET_ENV`] says so.
pub fn start_from_env() {
    if let Some(prefix) = std::env::var_os(BUDGET_ENV) {
        start(PathBuf::from(prefix));
    }
}

/// Where this process's marks go, once started.
static PATH: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();

/// Turn the marks on, written to `<prefix>.<pid>`; a second start with
/// another prefix turns them on again, still written to the first.
pub fn start(prefix: PathBuf) {
    let mut first = false;
    let _ = PATH.get_or_init(|| {
        first = true;
        PathBuf::from(format!("{}.{}", prefix.display(), std::process::id()))
    });
    if first {
        let spawned = std::thread::Builder::new()
            .name("twinlog-budget".into())
            .spawn(|| loop {
                std::thread::sleep(std::time::Duration::from_millis(50));
                flush();
            });
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "the budget's marks stay off");
            return;
        }
    }
    ON.store(true, Ordering::SeqCst);
}

/// Turn the marks off, and write what was marked.
pub fn stop() {
    ON.store(false, Ordering::SeqCst);
    flush();
}

/// Write what is marked now (appended to this process's file).
pub fn flush() {
    if let Some(path) = PATH.get() {
        flush_to(path);
    }
}

fn flush_to(path: &std::path::Path) {
    let taken = match MARKS.lock() {
        Ok(mut m) if !m.is_empty() => std::mem::take(&mut *m),
        _ => return,
    };
    let mut text = String::with_capacity(taken.len() * 32);
    for (stage, ns) in taken {
        text.push_str(stage.name());
        text.push(' ');
        text.push_str(&ns.to_string());
        text.push('\n');
    }
    let written = crate::storage::append_text(path, text.as_bytes());
    if let Err(e) = written {
        tracing::warn!(error = %e, path = %path.display(), "the budget's marks were not written");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_stage_has_a_name_that_reads_back() {
        for s in Stage::ALL {
            assert_eq!(Stage::from_name(s.name()), Some(s));
        }
        let mut sorted = Stage::ALL;
        sorted.sort();
        assert_eq!(sorted, Stage::ALL, "ALL is in the order of the way");
    }

    #[test]
    fn marks_are_written_as_lines_of_stage_and_time() {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("b.1");
        record(Stage::ClientSend);
        record(Stage::ClientReceived);
        flush_to(&path);
        let text = std::fs::read_to_string(&path).expect("the marks");
        let read: Vec<(Stage, u64)> = text
            .lines()
            .filter_map(|l| l.split_once(' '))
            .map(|(s, ns)| {
                (
                    Stage::from_name(s).expect("a stage"),
                    ns.parse().expect("ns"),
                )
            })
            .collect();
        assert_eq!(read.len(), 2, "{text}");
        assert_eq!(read[0].0, Stage::ClientSend);
        assert!(read[0].1 <= read[1].1, "{text}");
    }
}
