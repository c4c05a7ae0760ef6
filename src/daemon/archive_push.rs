//! `primary archive-push` and `twin archive-push`: a stopped box's sealed
//! segments archived at once, with a progress bar on a terminal and a
//! plain line every two seconds otherwise.

use std::io::IsTerminal;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use super::config::ArchiveSection;
use super::*;
use crate::archive::push::{push_sealed, PushProgress, PushReport};

const LINE_EVERY: Duration = Duration::from_secs(2);

/// What a push shows as it goes.
struct Shown {
    bar: Option<ProgressBar>,
    started: Instant,
    last_line: Option<Instant>,
}

impl Shown {
    fn new() -> Shown {
        let bar = std::io::stderr().is_terminal().then(|| {
            let b = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
            b.set_style(
                ProgressStyle::with_template(
                    "uploading [{wide_bar}] {bytes}/{total_bytes}, {msg}, {bytes_per_sec}, ETA {eta}",
                )
                .unwrap_or_else(|_| ProgressStyle::default_bar())
                .progress_chars("#>-"),
            );
            b
        });
        Shown {
            bar,
            started: crate::clock::monotonic(),
            last_line: None,
        }
    }

    fn show(&mut self, p: &PushProgress) {
        if let Some(bar) = &self.bar {
            bar.set_length(p.bytes);
            bar.set_position(p.bytes_done);
            bar.set_message(format!("segment {}/{}", p.segments_done, p.segments));
            return;
        }
        let done = p.segments_done == p.segments;
        if done || self.last_line.is_none_or(|t| t.elapsed() >= LINE_EVERY) {
            self.last_line = Some(crate::clock::monotonic());
            let secs = self.started.elapsed().as_secs_f64().max(1e-3);
            eprintln!(
                "archive-push: segment {}/{}, {:.1}/{:.1} MiB at {:.1} MiB/s",
                p.segments_done,
                p.segments,
                p.bytes_done as f64 / 1048576.0,
                p.bytes as f64 / 1048576.0,
                p.bytes_done as f64 / 1048576.0 / secs
            );
        }
    }

    fn end(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}

/// Archive every sealed segment of the stopped box in `data_dir` that the
/// bucket of `section` lacks; prints the report (as JSON with `json`).
pub async fn archive_push(
    data_dir: &Path,
    section: Option<&ArchiveSection>,
    json: bool,
) -> Result<PushReport, DaemonError> {
    let section = section.ok_or_else(|| {
        DaemonError::Usage("the configuration has no [archive] section: nothing to push to".into())
    })?;
    let settings = section
        .settings(data_dir)
        .map_err(DaemonError::ArchiveSetup)?;
    let log = Log::open(data_dir.join(LOG_DIR))?;
    let epochs = Epochs::load(data_dir, log.head_seq())
        .at("reading the epochs in", data_dir)?
        .history()
        .starts()
        .to_vec();
    let shown = std::sync::Mutex::new(Shown::new());
    let report = push_sealed(&log, &settings, &epochs, &|p: &PushProgress| {
        if let Ok(mut s) = shown.lock() {
            s.show(p);
        }
    })
    .await;
    if let Ok(s) = shown.lock() {
        s.end();
    }
    let report = report?;
    if json {
        let text = serde_json::to_string(&report)
            .map_err(|e| DaemonError::Failed(format!("the report as JSON: {e}")))?;
        println!("{text}");
    } else {
        println!(
            "archived {} segments ({:.1} MiB, {:.1} MiB stored) to {}; {} were there already; every frame below {} is archived",
            report.uploaded,
            report.bytes as f64 / 1048576.0,
            report.stored_bytes as f64 / 1048576.0,
            section.url,
            report.already,
            report.floor
        );
    }
    Ok(report)
}
