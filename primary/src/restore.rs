//! `primary restore`: fill this fresh box from a twin, with a progress bar
//! on a terminal and plain progress lines otherwise.

use std::io::{IsTerminal, Write};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use twinlog::daemon::{self, Address, DaemonError, PrimaryConfig};
use twinlog::net::{Fingerprint, NetError};
use twinlog::node::restore::{self, Progress, RestoreError, RestoreOptions};

fn mib(b: u64) -> f64 {
    b as f64 / 1048576.0
}

/// Draws progress: a bar redrawn in place on a terminal, a line every few
/// seconds otherwise.
struct Shown {
    started: Instant,
    last_line: Instant,
    tty: bool,
}

impl Shown {
    fn show(&mut self, p: &Progress) {
        let secs = self.started.elapsed().as_secs_f64().max(1e-3);
        let rate = mib(p.bytes) / secs;
        let text = if p.snapshot_total > 0 && p.frames == 0 && p.bytes == 0 {
            format!(
                "snapshot {:.1}/{:.1} MiB",
                mib(p.snapshot_held),
                mib(p.snapshot_total)
            )
        } else {
            let left = p.target.saturating_sub(p.head);
            let frames_per_s = p.frames as f64 / secs;
            let eta = if frames_per_s > 0.0 {
                format!("{:.0} s", left as f64 / frames_per_s)
            } else {
                "?".into()
            };
            format!(
                "frames {}/{} ({} this run), {:.1} MiB at {rate:.1} MiB/s, ETA {eta}",
                p.head,
                p.target,
                p.frames,
                mib(p.bytes)
            )
        };
        if self.tty {
            let width = 30;
            let done = if p.target > 0 {
                (p.head as f64 / p.target as f64).clamp(0.0, 1.0)
            } else {
                0.0
            };
            let fill = (done * width as f64) as usize;
            eprint!(
                "\r[{}{}] {text}\x1b[K",
                "#".repeat(fill),
                "-".repeat(width - fill)
            );
            let _ = std::io::stderr().flush();
        } else if self.last_line.elapsed().as_secs_f64() >= 2.0 {
            self.last_line = Instant::now();
            eprintln!("restore: {text}");
        }
    }
}

/// A failed restore, saying where from and, for a twin that does not
/// answer, what to check.
fn failed(twin: &Address, resolved: std::net::SocketAddr, e: RestoreError) -> DaemonError {
    let at = if twin.as_str() == resolved.to_string() {
        twin.to_string()
    } else {
        format!("{twin} ({resolved})")
    };
    let why = match &e {
        RestoreError::Net(NetError::Io(io)) if io.kind() == std::io::ErrorKind::TimedOut => {
            format!(
                "no answer within {} s: is `twin serve` running there, with restore_listen at that address and this box pinned (`twin pin-restore`)?",
                twinlog::node::client::CONNECT_TIMEOUT.as_secs()
            )
        }
        _ => e.to_string(),
    };
    let msg = format!("restore from {at} (--twin): {why}");
    match e {
        RestoreError::NotFresh(_) => DaemonError::Setup(msg),
        _ => DaemonError::Failed(msg),
    }
}

pub async fn run(
    cfg: &PrimaryConfig,
    twin: &Address,
    twin_fingerprint: Fingerprint,
    json: bool,
) -> Result<(), DaemonError> {
    let source = twin
        .resolve()
        .map_err(|e| DaemonError::Usage(format!("--twin {twin}: it does not resolve: {e}")))?;
    let identity = daemon::load_identity(&cfg.data_dir)?;
    let shown = Arc::new(Mutex::new(Shown {
        started: Instant::now(),
        last_line: Instant::now(),
        tty: std::io::stderr().is_terminal(),
    }));
    let s2 = shown.clone();
    let progress = Arc::new(move |p: &Progress| {
        if let Ok(mut s) = s2.lock() {
            s.show(p);
        }
    });
    let report = restore::restore(
        RestoreOptions {
            data_dir: cfg.data_dir.clone(),
            segment_bytes: cfg.segment_bytes,
            source,
            source_fingerprint: twin_fingerprint,
            identity: Arc::new(identity),
        },
        progress,
    )
    .await
    .map_err(|e| failed(twin, source, e))?;
    if shown.lock().is_ok_and(|s| s.tty) {
        eprintln!();
    }
    if json {
        println!(
            "{}",
            serde_json::to_string(&report)
                .map_err(|e| DaemonError::Failed(format!("the report as JSON: {e}")))?
        );
    } else {
        if report.resumed {
            println!(
                "resumed at frame {} byte {} ({:.1} MiB salvaged from the unfinished entry)",
                report.started_at_seq,
                report.started_at_byte,
                mib(report.salvaged_bytes)
            );
        }
        if let Some(at) = report.snapshot_at {
            println!(
                "snapshot at {at}: {:.1} MiB received, {:.1} MiB already staged",
                mib(report.snapshot_received),
                mib(report.snapshot_reused)
            );
        }
        println!(
            "restored frames {}..={} ({} this run, {:.1} MiB) in {:.1} s; epoch {}; head verified against the twin",
            report.first,
            report.head,
            report.frames,
            mib(report.received_bytes),
            report.secs,
            report.epoch
        );
        println!("serve it with `primary serve`, and point the twin at it");
    }
    Ok(())
}
