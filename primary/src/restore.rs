//! `primary restore`: fill this fresh box from a twin, with a progress bar
//! on a terminal and plain progress lines otherwise.

use std::io::IsTerminal;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use indicatif::{HumanBytes, ProgressBar, ProgressDrawTarget, ProgressStyle};
use twinlog::daemon::{self, Address, DaemonError, PrimaryConfig};
use twinlog::net::{Fingerprint, NetError};
use twinlog::node::restore::{self, Progress, RestoreError, RestoreOptions};

fn mib(b: u64) -> f64 {
    b as f64 / 1048576.0
}

/// How often a plain progress line is printed when stderr is not a
/// terminal: often enough to see it move in a journal, not a flood.
const LINE_EVERY: Duration = Duration::from_secs(2);

/// What a restore is receiving: the twin's snapshot (its size known), then
/// frames up to the twin's head (their bytes not known ahead, only their
/// count).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Phase {
    Snapshot,
    Frames,
}

impl Phase {
    fn of(p: &Progress) -> Phase {
        if p.snapshot_total > 0 && p.frames == 0 && p.bytes == 0 {
            Phase::Snapshot
        } else {
            Phase::Frames
        }
    }
}

/// Bytes received in the phase so far.
fn received(p: &Progress, phase: Phase) -> u64 {
    match phase {
        Phase::Snapshot => p.snapshot_held,
        Phase::Frames => p.bytes,
    }
}

/// The plain progress line: bytes received, their rate, and an ETA (by
/// bytes for the snapshot, by frames for the frames: the twin does not say
/// how many bytes are left).
fn line(p: &Progress, phase: Phase, secs: f64) -> String {
    let secs = secs.max(1e-3);
    let got = received(p, phase);
    let rate = got as f64 / secs;
    let eta = |left: f64, per_s: f64| {
        if per_s > 0.0 {
            format!("{:.0} s", left / per_s)
        } else {
            "?".into()
        }
    };
    match phase {
        Phase::Snapshot => format!(
            "snapshot {:.1}/{:.1} MiB at {:.1} MiB/s, ETA {}",
            mib(got),
            mib(p.snapshot_total),
            mib(rate as u64),
            eta(p.snapshot_total.saturating_sub(got) as f64, rate)
        ),
        Phase::Frames => format!(
            "frames {}/{} ({} this run), {:.1} MiB at {:.1} MiB/s, ETA {}",
            p.head,
            p.target,
            p.frames,
            mib(got),
            mib(rate as u64),
            eta(
                p.target.saturating_sub(p.head) as f64,
                p.frames as f64 / secs
            )
        ),
    }
}

/// Shows progress: an indicatif bar on a terminal (redrawn in place at a
/// bounded rate, fitted to the width, with its own smoothed rate and ETA),
/// a plain line every few seconds otherwise.
struct Shown {
    /// The bar, on a terminal only.
    bar: Option<ProgressBar>,
    phase: Option<Phase>,
    /// Where the phase's rate is measured from.
    phase_started: Instant,
    /// The last report: a phase's first report comes after its first
    /// bytes, so the phase is taken to have started at the one before.
    last_seen: Instant,
    last_line: Instant,
}

impl Shown {
    fn new(tty: bool) -> Shown {
        Shown {
            bar: tty.then(|| ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr())),
            phase: None,
            phase_started: Instant::now(),
            last_seen: Instant::now(),
            last_line: Instant::now(),
        }
    }

    fn show(&mut self, p: &Progress) {
        let phase = Phase::of(p);
        let seen = Instant::now();
        let new_phase = self.phase != Some(phase);
        if new_phase {
            self.phase = Some(phase);
            self.phase_started = self.last_seen;
            if let Some(bar) = &self.bar {
                bar.set_style(style(phase));
            }
        }
        self.last_seen = seen;
        let Some(bar) = &self.bar else {
            if self.last_line.elapsed() >= LINE_EVERY {
                self.last_line = Instant::now();
                eprintln!(
                    "restore: {}",
                    line(p, phase, self.phase_started.elapsed().as_secs_f64())
                );
            }
            return;
        };
        match phase {
            Phase::Snapshot => {
                bar.set_length(p.snapshot_total);
                bar.set_position(p.snapshot_held);
            }
            Phase::Frames => {
                let secs = self.phase_started.elapsed().as_secs_f64().max(1e-3);
                bar.set_message(format!(
                    "{} at {}/s",
                    HumanBytes(p.bytes),
                    HumanBytes((p.bytes as f64 / secs) as u64)
                ));
                bar.set_length(p.target);
                bar.set_position(p.head);
            }
        }
        if new_phase {
            // What a resumed restore held already is no part of the rate.
            bar.reset_eta();
        }
    }

    /// Leave the bar as it ended, and what follows on a line of its own
    /// (indicatif leaves the cursor at the end of the bar's line).
    fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.abandon();
            eprintln!();
        }
    }
}

/// The bar's look in a phase. The snapshot's bytes are the bar's own
/// position, so indicatif gives their rate and ETA; the frames' position
/// is the frame count (the ETA is by frames) and their bytes and rate are
/// the message.
fn template(phase: Phase) -> &'static str {
    match phase {
        Phase::Snapshot => {
            "snapshot [{wide_bar}] {binary_bytes}/{binary_total_bytes} at {binary_bytes_per_sec}, ETA {eta}"
        }
        Phase::Frames => "frames [{wide_bar}] {pos}/{len}, {msg}, ETA {eta}",
    }
}

fn style(phase: Phase) -> ProgressStyle {
    // The templates are constants, checked by a test: the fallback is
    // never taken.
    ProgressStyle::with_template(template(phase))
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("#>-")
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
    let shown = Arc::new(Mutex::new(Shown::new(std::io::stderr().is_terminal())));
    let s2 = shown.clone();
    let progress = Arc::new(move |p: &Progress| {
        if let Ok(mut s) = s2.lock() {
            s.show(p);
        }
    });
    let restored = restore::restore(
        RestoreOptions {
            data_dir: cfg.data_dir.clone(),
            segment_bytes: cfg.segment_bytes,
            source,
            source_fingerprint: twin_fingerprint,
            identity: Arc::new(identity),
        },
        progress,
    )
    .await;
    if let Ok(s) = shown.lock() {
        s.finish();
    }
    let report = restored.map_err(|e| failed(twin, source, e))?;
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
        if report.resumed {
            println!(
                "{} frames an earlier run kept checked against the twin's",
                report.verified
            );
        }
        if let Some(kept) = report.verify_cut_after {
            println!("frame {} an earlier run kept was not the twin's: it and every later one were fetched again", kept + 1);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_snapshot_line_gives_its_bytes_rate_and_eta() {
        let p = Progress {
            snapshot_held: 8 << 20,
            snapshot_total: 32 << 20,
            ..Progress::default()
        };
        assert_eq!(Phase::of(&p), Phase::Snapshot);
        assert_eq!(
            line(&p, Phase::Snapshot, 4.0),
            "snapshot 8.0/32.0 MiB at 2.0 MiB/s, ETA 12 s"
        );
    }

    #[test]
    fn a_frames_line_gives_frames_bytes_rate_and_an_eta_by_frames() {
        let p = Progress {
            snapshot_total: 32 << 20,
            snapshot_held: 32 << 20,
            frames: 100,
            bytes: 10 << 20,
            head: 600,
            target: 1100,
        };
        assert_eq!(Phase::of(&p), Phase::Frames);
        assert_eq!(
            line(&p, Phase::Frames, 5.0),
            "frames 600/1100 (100 this run), 10.0 MiB at 2.0 MiB/s, ETA 25 s"
        );
    }

    #[test]
    fn the_bar_templates_parse() {
        for phase in [Phase::Snapshot, Phase::Frames] {
            assert!(
                ProgressStyle::with_template(template(phase)).is_ok(),
                "{phase:?}"
            );
        }
    }

    #[test]
    fn nothing_received_yet_has_no_eta() {
        let p = Progress {
            head: 5,
            target: 9,
            ..Progress::default()
        };
        assert!(line(&p, Phase::Frames, 0.0).ends_with("0.0 MiB at 0.0 MiB/s, ETA ?"));
    }
}
