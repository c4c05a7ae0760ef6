//! The processes the integration tests start and kill: a log writer, a Wal
//! writer, a daemon, a restore. A real process is what a SIGKILL or an
//! external reader needs; the tests find this binary through
//! `CARGO_BIN_EXE_twinlog-test-child`. Not for use outside the tests.
//!
//! ```text
//! twinlog-test-child log-writer DIR ROUND
//! twinlog-test-child wal-writer DIR
//! twinlog-test-child daemon primary|twin CONFIG   (a switchover's new role
//!                                                    is served in its place)
//! twinlog-test-child restore CONFIG TWIN_ADDR TWIN_FINGERPRINT
//! ```

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use twinlog::daemon::{self, PrimaryConfig, TwinConfig};
use twinlog::log::Log;
use twinlog::node::restore::{self, RestoreOptions};
use twinlog::wal::Wal;

#[path = "../../tests/support/kill_frames.rs"]
mod kill_frames;
#[path = "../../tests/support/wal_records.rs"]
mod wal_records;

/// A writer whose parent failed to kill it stops by itself.
const WRITER_LIFETIME: Duration = Duration::from_secs(10);

type Failed = Box<dyn std::error::Error + Send + Sync>;

/// What this child fails at, by name; the rest (a daemon's, a restore's
/// own errors) pass through as they are.
#[derive(Debug, thiserror::Error)]
enum ChildError {
    #[error(transparent)]
    Log(#[from] twinlog::log::Error),
    #[error(transparent)]
    Io(#[from] std::io::Error),
    #[error("a writer thread panicked")]
    WriterPanicked,
    #[error("no daemon role {0:?}")]
    NoRole(String),
    #[error("the role changed to {role}, but serving it failed: {error}")]
    NewRoleFailed {
        role: &'static str,
        error: std::io::Error,
    },
    #[error("bad arguments: {0:?} (see the source's doc)")]
    BadArguments(Vec<String>),
}

/// Append from several threads until killed, printing `ACK {seq} {name}`
/// once each append has returned.
fn log_writer(dir: &str, round: &str) -> Result<(), Failed> {
    use kill_frames::{content, CHUNK, SEGMENT, WRITERS};
    let log = Log::open_with(dir, SEGMENT)?;
    let deadline = twinlog::clock::monotonic() + WRITER_LIFETIME;
    std::thread::scope(|s| {
        let workers: Vec<_> = (0..WRITERS)
            .map(|w| {
                let log = &log;
                s.spawn(move || -> Result<(), ChildError> {
                    let mut n = 0u64;
                    while twinlog::clock::monotonic() < deadline {
                        let name = format!("r{round}w{w}n{n}");
                        let (kind, blob) = content(&name);
                        let seq = if w == 0 {
                            let mut p =
                                log.begin(None, kind, name.as_bytes(), blob.len() as u64)?;
                            for chunk in blob.chunks(CHUNK) {
                                p.write(chunk)?;
                            }
                            p.commit()?
                        } else {
                            log.append_raw(kind, name.as_bytes(), &blob)?
                        };
                        let mut out = std::io::stdout().lock();
                        writeln!(out, "ACK {seq} {name}")?;
                        out.flush()?;
                        n += 1;
                    }
                    Ok(())
                })
            })
            .collect();
        for w in workers {
            match w.join() {
                Ok(r) => r.map_err(Failed::from)?,
                Err(_) => return Err(ChildError::WriterPanicked.into()),
            }
        }
        Ok(())
    })
}

/// Commit [`wal_records::CHILD_RECORDS`] records, ten at a time, after
/// saying `ready`.
fn wal_writer(dir: &str) -> Result<(), Failed> {
    use wal_records::{record, small, CHILD_RECORDS};
    let mut wal = Wal::open_with(dir, small(4096))?;
    println!("ready");
    std::io::stdout().flush()?;
    for lsn in 1..=CHILD_RECORDS {
        wal.append(&record(lsn))?;
        if lsn % 10 == 0 {
            wal.commit()?;
        }
    }
    wal.commit()?;
    Ok(())
}

async fn serve(role: &str, config: &str) -> Result<(), Failed> {
    let shutdown = daemon::shutdown_on_signals()?;
    let config = PathBuf::from(config);
    let served = match role {
        "primary" => daemon::serve_primary(PrimaryConfig::load(&config)?, shutdown.clone()).await?,
        "twin" => daemon::serve_twin(TwinConfig::load(&config)?, shutdown.clone()).await?,
        other => return Err(ChildError::NoRole(other.to_string()).into()),
    };
    // A switchover changed the role: become the daemon of the new one in a
    // new program image, as `daemon::failover::continue_as` makes the
    // shipped binaries do (the log's lock goes with the old image).
    let served = match role {
        "primary" => daemon::auto_failover::after_primary_serve(served, &config, shutdown).await?,
        _ => daemon::auto_failover::stop_wins(served, &shutdown),
    };
    let (role, config) = match &served {
        daemon::Served::Stopped | daemon::Served::Replaced { .. } => return Ok(()),
        daemon::Served::Deposed { twin_config } => ("twin", twin_config),
        daemon::Served::Promoted { primary_config } => ("primary", primary_config),
        daemon::Served::LeaseLost if role == "primary" => ("primary", &config),
        daemon::Served::LeaseLost => ("twin", &config),
    };
    use std::os::unix::process::CommandExt;
    let e = std::process::Command::new(std::env::current_exe()?)
        .args(["daemon", role])
        .arg(config)
        .exec();
    Err(ChildError::NewRoleFailed { role, error: e }.into())
}

/// One restore run, its report printed as one JSON line.
async fn run_restore(config: &str, from: &str, fingerprint: &str) -> Result<(), Failed> {
    let cfg = PrimaryConfig::load(&PathBuf::from(config))?;
    let report = restore::restore(
        RestoreOptions {
            data_dir: cfg.data_dir.clone(),
            segment_bytes: cfg.segment_bytes,
            source: from.parse()?,
            source_fingerprint: fingerprint.parse()?,
            identity: Arc::new(daemon::load_identity(&cfg.data_dir)?),
        },
        Arc::new(|_| {}),
    )
    .await?;
    println!("{}", serde_json::to_string(&report)?);
    Ok(())
}

fn main() -> ExitCode {
    daemon::allocator::tune();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let ran = match args.as_slice() {
        ["log-writer", dir, round] => log_writer(dir, round),
        ["wal-writer", dir] => wal_writer(dir),
        [cmd @ ("daemon" | "restore"), rest @ ..] => {
            daemon::init_tracing(false);
            tokio::runtime::Runtime::new()
                .map_err(Failed::from)
                .and_then(|rt| {
                    let cmd = cmd.to_string();
                    let rest: Vec<String> = rest.iter().map(|a| a.to_string()).collect();
                    daemon::runtime::block_on_workers(&rt, async move {
                        let rest: Vec<&str> = rest.iter().map(String::as_str).collect();
                        match (cmd.as_str(), rest.as_slice()) {
                            ("daemon", [role, config]) => serve(role, config).await,
                            ("restore", [config, from, fp]) => run_restore(config, from, fp).await,
                            _ => {
                                let mut all = vec![cmd.clone()];
                                all.extend(rest.iter().map(|a| a.to_string()));
                                Err(ChildError::BadArguments(all).into())
                            }
                        }
                    })
                })
        }
        _ => Err(ChildError::BadArguments(args.iter().map(|a| a.to_string()).collect()).into()),
    };
    match ran {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("twinlog-test-child: {e}");
            ExitCode::FAILURE
        }
    }
}
