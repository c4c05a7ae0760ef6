//! Archiving a stopped box's sealed segments at once, from the command
//! line (`primary archive-push`, `twin archive-push`): what its daemon's
//! uploader does in the background, for a box about to be retired or an
//! archive turned on for a log that already holds history, with its
//! progress shown. The log's lock keeps it off a serving box.

use super::archiver::ArchiveSettings;
use super::seen::{covered, is_covered};
use super::upload::{upload_segment, Pace, SegmentJob};
use super::Error;
use crate::log::{format, Log};
use crate::repl::epochs::EpochStart;

/// Counters a progress bar shows.
#[derive(Clone, Copy, Debug, Default)]
pub struct PushProgress {
    pub segments_done: u64,
    pub segments: u64,
    pub bytes_done: u64,
    pub bytes: u64,
}

/// What a push did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct PushReport {
    /// Sealed segments the bucket held already.
    pub already: u64,
    pub uploaded: u64,
    /// Bytes of the segments uploaded, and as stored.
    pub bytes: u64,
    pub stored_bytes: u64,
    /// Every frame below this is archived now.
    pub floor: u64,
}

/// Upload every sealed segment of `log` that the bucket lacks, oldest
/// first, at the configured pace.
pub async fn push_sealed(
    log: &Log,
    settings: &ArchiveSettings,
    epochs: &[EpochStart],
    progress: &(dyn Fn(&PushProgress) + Send + Sync),
) -> Result<PushReport, Error> {
    let history = log.history().0;
    let known = settings
        .bucket
        .segments()
        .await?
        .into_iter()
        .map(|(n, _)| (n.first, n.last, n.lineage))
        .collect();
    let runs = covered(&known, &history, epochs);
    let layout = log.layout();
    let sealed = &layout[..layout.len().saturating_sub(1)];
    let todo: Vec<_> = sealed
        .iter()
        .filter(|&&(first, last, _)| first <= last && !is_covered(&runs, first, last))
        .copied()
        .collect();
    let mut report = PushReport {
        already: (sealed.len() - todo.len()) as u64,
        ..PushReport::default()
    };
    let mut p = PushProgress {
        segments: todo.len() as u64,
        bytes: todo.iter().map(|s| s.2).sum(),
        ..PushProgress::default()
    };
    progress(&p);
    let mut pace = Pace::new(settings.bytes_per_s);
    for (first, _, bytes) in todo {
        let path = format::segment_path(log.dir(), first);
        let job = SegmentJob {
            path: &path,
            first,
            history,
            epochs,
            generation: 0,
            marks: Vec::new(),
        };
        let sent = upload_segment(&settings.bucket, &settings.codec, job, &mut pace).await?;
        report.uploaded += 1;
        report.bytes += sent.plain_bytes;
        report.stored_bytes += sent.stored_bytes;
        p.segments_done += 1;
        p.bytes_done += bytes;
        progress(&p);
    }
    report.floor = layout.last().map_or(0, |s| s.0);
    Ok(report)
}
