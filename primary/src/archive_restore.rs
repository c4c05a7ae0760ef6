//! `primary restore --from-archive` and `primary archive-key`: a fresh box
//! filled from the archive alone, to a frame or a time, with a progress
//! bar on a terminal and plain progress lines otherwise.

use std::io::IsTerminal;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use twinlog::archive::bucket::{Bucket, Spec};
use twinlog::archive::codec::ArchiveKey;
use twinlog::archive::restore::{
    restore_from_archive, ArchiveProgress, ArchiveRestoreOptions, Until,
};
use twinlog::daemon::{self, DaemonError, PrimaryConfig};

const LINE_EVERY: Duration = Duration::from_secs(2);

/// Where the restore stops, from the flags.
pub fn until(seq: Option<u64>, time: Option<&str>) -> Result<Until, DaemonError> {
    match (seq, time) {
        (Some(s), _) => Ok(Until::Seq(s)),
        (None, Some(t)) => daemon::parse_utc(t).map(Until::Time).ok_or_else(|| {
            DaemonError::Usage(format!(
                "--until-time {t}: an RFC 3339 UTC time, as 2026-12-01T10:00:00Z"
            ))
        }),
        (None, None) => Ok(Until::End),
    }
}

/// The bucket and key: `[archive]` of the configuration (its endpoint,
/// credentials and key file) at `url`; without the section, the URL with
/// the `AWS_*` variables and no key.
fn bucket_and_key(
    cfg: &PrimaryConfig,
    url: &str,
) -> Result<(Bucket, Option<ArchiveKey>), DaemonError> {
    let (spec, key) = match &cfg.archive {
        Some(section) => {
            let mut spec = section
                .spec(&cfg.data_dir)
                .map_err(DaemonError::ArchiveSetup)?;
            spec.url = url.to_owned();
            (
                spec,
                section
                    .key(&cfg.data_dir)
                    .map_err(DaemonError::ArchiveSetup)?,
            )
        }
        None => (
            Spec {
                url: url.to_owned(),
                endpoint: std::env::var("AWS_ENDPOINT_URL").ok(),
                region: std::env::var("AWS_REGION").unwrap_or_else(|_| "us-east-1".into()),
                access_key_id: std::env::var("AWS_ACCESS_KEY_ID").ok(),
                secret_access_key: std::env::var("AWS_SECRET_ACCESS_KEY").ok(),
            },
            None,
        ),
    };
    let bucket = Bucket::open(&spec).map_err(|e| DaemonError::ArchiveSetup(e.to_string()))?;
    Ok((bucket, key))
}

struct Shown {
    bar: Option<ProgressBar>,
    started: Instant,
    last_line: Instant,
}

impl Shown {
    fn show(&mut self, p: &ArchiveProgress) {
        match &self.bar {
            Some(bar) => {
                bar.set_length(p.target);
                bar.set_position(p.head);
                bar.set_message(format!(
                    "segment {}/{}, {:.1} MiB",
                    p.segments_done,
                    p.segments,
                    p.bytes as f64 / 1048576.0
                ));
            }
            None if self.last_line.elapsed() >= LINE_EVERY => {
                self.last_line = Instant::now();
                let secs = self.started.elapsed().as_secs_f64().max(1e-3);
                eprintln!(
                    "restore: frames {}/{}, segment {}/{}, {:.1} MiB at {:.1} MiB/s",
                    p.head,
                    p.target,
                    p.segments_done,
                    p.segments,
                    p.bytes as f64 / 1048576.0,
                    p.bytes as f64 / 1048576.0 / secs
                );
            }
            None => {}
        }
    }
}

/// What `primary restore --from-archive` was told.
pub struct How<'a> {
    pub until: Until,
    /// `--until-time` as written, which refusals echo.
    pub until_time: Option<&'a str>,
    pub accept_shorter: bool,
    pub json: bool,
}

pub async fn run(cfg: &PrimaryConfig, url: &str, how: How<'_>) -> Result<(), DaemonError> {
    let How {
        until,
        until_time,
        accept_shorter,
        json,
    } = how;
    let (bucket, key) = bucket_and_key(cfg, url)?;
    let tty = std::io::stderr().is_terminal();
    let bar = tty.then(|| {
        let b = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
        b.set_style(
            ProgressStyle::with_template("frames [{wide_bar}] {pos}/{len}, {msg}, ETA {eta}")
                .unwrap_or_else(|_| ProgressStyle::default_bar())
                .progress_chars("#>-"),
        );
        b
    });
    let shown = Arc::new(Mutex::new(Shown {
        bar,
        started: Instant::now(),
        last_line: Instant::now(),
    }));
    let s2 = shown.clone();
    let report = restore_from_archive(
        ArchiveRestoreOptions {
            data_dir: cfg.data_dir.clone(),
            segment_bytes: cfg.segment_bytes,
            bucket,
            key,
            until,
            accept_shorter,
        },
        Arc::new(move |p: &ArchiveProgress| {
            if let Ok(mut s) = s2.lock() {
                s.show(p);
            }
        }),
    )
    .await;
    if let Ok(s) = shown.lock() {
        if let Some(bar) = &s.bar {
            bar.abandon();
            eprintln!();
        }
    }
    let report = report.map_err(|e| match e {
        twinlog::archive::Error::NotFresh(_) => {
            DaemonError::Setup(format!("restore from {url}: {e}"))
        }
        twinlog::archive::Error::NothingByTime { .. } => DaemonError::Failed(format!(
            "restore from {url}: --until-time {}: {e}",
            until_time.unwrap_or("?")
        )),
        other => DaemonError::Failed(format!("restore from {url}: {other}")),
    })?;
    if json {
        println!(
            "{}",
            serde_json::to_string(&report)
                .map_err(|e| DaemonError::Failed(format!("the report as JSON: {e}")))?
        );
    } else {
        if report.resumed {
            println!(
                "resumed: {} frames this box held were compared with the archive's and are the same",
                report.verified
            );
        }
        if let (Some(seq), Some(why)) = (report.cut_from, &report.cut_why) {
            println!(
                "frame {seq} this box held is not the archive's ({why}): it and the frames after it were cut and fetched again"
            );
        }
        match (report.head_last, report.head_unix_ms) {
            _ if report.head_unread.is_some() => println!(
                "the archive's head record does not read ({}): how far it reached is not known (--accept-shorter)",
                report.head_unread.as_deref().unwrap_or_default()
            ),
            (Some(last), Some(ms)) => println!(
                "the archive's head record says frames up to {last} were archived (written {})",
                daemon::utc(ms)
            ),
            _ => println!(
                "the archive has no head record (written by builds before it): how far it reached is not known"
            ),
        }
        if let Some((from, to)) = report.lost {
            println!(
                "LOST: frames {from} to {to}, which the head record says were archived, are gone from the bucket; restored without them (--accept-shorter)"
            );
        }
        for said in &report.passed_over {
            println!("passed over, another object holds its frames: {said}");
        }
        if report.snapshot_at > 0 {
            println!(
                "started from the store snapshot archived at frame {}",
                report.snapshot_at
            );
        }
        println!(
            "restored frames {} to {} from {url} (lineage {}): {} frames and {:.1} MiB this run, from {} segments",
            report.snapshot_at + 1,
            report.head,
            report.lineage,
            report.frames,
            report.bytes as f64 / 1048576.0,
            report.segments
        );
    }
    Ok(())
}

/// Write a new key file, mode 0600, never over an existing file.
pub fn mint_key(out: &Path) -> Result<(), DaemonError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let key = ArchiveKey::mint().map_err(|e| DaemonError::Failed(e.to_string()))?;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(out)
        .map_err(|e| DaemonError::Usage(format!("--out {}: {e}", out.display())))?;
    f.write_all(key.to_file_text().as_bytes())
        .and_then(|()| f.sync_all())
        .map_err(|e| DaemonError::Failed(format!("{}: {e}", out.display())))?;
    println!("{}", out.display());
    Ok(())
}

/// Put a new key in front of the key ring at `file`, in place: written
/// beside it (mode 0600) and renamed over it, so a crash leaves the old
/// ring or the new one, whole.
pub fn rotate_key(file: &Path) -> Result<(), DaemonError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let ring = ArchiveKey::load(file).map_err(|e| DaemonError::ArchiveSetup(e.to_string()))?;
    let rotated = ring
        .rotated()
        .map_err(|e| DaemonError::Failed(e.to_string()))?;
    let mut tmp = file.as_os_str().to_owned();
    tmp.push(".rotating");
    let tmp = std::path::PathBuf::from(tmp);
    let _ = std::fs::remove_file(&tmp);
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .and_then(|mut f| {
            f.write_all(rotated.to_file_text().as_bytes())?;
            f.sync_all()
        })
        .and_then(|()| std::fs::rename(&tmp, file))
        .and_then(|()| {
            let dir = file.parent().filter(|d| !d.as_os_str().is_empty());
            std::fs::File::open(dir.unwrap_or(Path::new(".")))?.sync_all()
        });
    written.map_err(|e| DaemonError::Failed(format!("{}: {e}", file.display())))?;
    let hex = |id: [u8; 8]| -> String { id.iter().map(|b| format!("{b:02x}")).collect() };
    println!(
        "{}: new key {} seals new objects; {} older keys kept. Copy it to the other box and restart both daemons",
        file.display(),
        hex(rotated.id()),
        rotated.ids().len() - 1
    );
    Ok(())
}
