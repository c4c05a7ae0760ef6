//! The archive drill's record of acknowledged frames, and its checks of a
//! log restored from the archive: every acknowledged frame up to the
//! point asked for present byte for byte, nothing past it; and, when a
//! restore fails, which acknowledged frames the bucket lacks.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use twinlog::log::{Log, Tail};

use crate::{Context, Result, Rng};

/// A frame as its writer sent it. Frames whose bytes repeat share one.
#[derive(Debug, PartialEq, Eq)]
pub struct Sent {
    pub kind: u16,
    pub meta: Vec<u8>,
    pub blob: Vec<u8>,
}

/// Every acknowledged frame by sequence.
pub type Acked = BTreeMap<u64, Arc<Sent>>;

/// `len` bytes from `rng`: incompressible when `random`, else a short
/// pattern repeated (zstd shrinks it to almost nothing).
pub fn payload(rng: &mut Rng, len: usize, random: bool) -> Vec<u8> {
    let mut out = Vec::with_capacity(len + 8);
    if random {
        while out.len() < len {
            out.extend_from_slice(&rng.next_u64().to_le_bytes());
        }
    } else {
        let word = rng.next_u64().to_le_bytes();
        while out.len() < len {
            out.extend_from_slice(&word);
        }
    }
    out.truncate(len);
    out
}

/// What a restored log held against the record.
#[derive(Debug, Default)]
pub struct Restored {
    pub first: u64,
    pub head: u64,
    /// Acknowledged frames read back equal.
    pub checked: u64,
    /// Frames no writer was told of (the daemons' own), passed over.
    pub unacked: u64,
    /// Acknowledged frames at or below the point that are missing.
    pub lost: Vec<u64>,
    /// Frames at or below the point that are not what was acknowledged
    /// there: (seq, how).
    pub differ: Vec<(u64, String)>,
    /// Frames past the point.
    pub past: Vec<u64>,
}

impl Restored {
    pub fn held(&self) -> bool {
        self.lost.is_empty() && self.differ.is_empty() && self.past.is_empty()
    }
}

fn describe(kind: u16, meta: &[u8], blob: &[u8]) -> String {
    format!(
        "kind {kind:#x}, meta {:?}, {} bytes, crc {:08x}",
        String::from_utf8_lossy(&meta[..meta.len().min(40)]),
        blob.len(),
        crc32fast::hash(blob)
    )
}

/// Check the log in `log_dir` (a box restored `--until until`) against
/// `acked`: it opens as a log, starts at frame 1, ends at `until`, and
/// holds every acknowledged frame up to it with its kind, meta and blob.
pub fn check_restored(
    log_dir: &Path,
    segment_bytes: u64,
    until: u64,
    acked: &Acked,
) -> Result<Restored> {
    let mut r = Restored::default();
    {
        let log = Log::open_with(log_dir, segment_bytes)
            .ctx(|| format!("open the restored log {}", log_dir.display()))?;
        r.first = log.first_seq();
        r.head = log.head_seq();
    }
    let mut tail = Tail::open(log_dir, 1).ctx(|| format!("tail {}", log_dir.display()))?;
    let mut want = acked.range(..=until).peekable();
    while let Some(f) = tail
        .next()
        .ctx(|| format!("read {} after frame {}", log_dir.display(), r.checked))?
    {
        if f.seq > until {
            r.past.push(f.seq);
            continue;
        }
        // Acknowledged frames the log skipped over.
        while let Some((&seq, _)) = want.peek() {
            if seq >= f.seq {
                break;
            }
            r.lost.push(seq);
            want.next();
        }
        match want.peek() {
            Some((&seq, sent)) if seq == f.seq => {
                if f.kind == sent.kind && f.meta == sent.meta && f.blob == sent.blob {
                    r.checked += 1;
                } else {
                    r.differ.push((
                        seq,
                        format!(
                            "holds {}, acknowledged {}",
                            describe(f.kind, f.meta, f.blob),
                            describe(sent.kind, &sent.meta, &sent.blob)
                        ),
                    ));
                }
                want.next();
            }
            _ => r.unacked += 1,
        }
    }
    r.lost.extend(want.map(|(&seq, _)| seq));
    Ok(r)
}

/// The ranges of `1..=until` that no archived segment covers, given the
/// segments' (first, last).
pub fn holes(segments: &[(u64, u64)], until: u64) -> Vec<(u64, u64)> {
    let mut segs = segments.to_vec();
    segs.sort_unstable();
    let mut out = Vec::new();
    let mut next = 1u64;
    for (first, last) in segs {
        if next > until {
            break;
        }
        if first > next {
            out.push((next, (first - 1).min(until)));
        }
        next = next.max(last.saturating_add(1));
    }
    if next <= until {
        out.push((next, until));
    }
    out
}

/// The acknowledged sequences inside `ranges`.
pub fn acked_in(acked: &Acked, ranges: &[(u64, u64)]) -> Vec<u64> {
    ranges
        .iter()
        .flat_map(|&(a, b)| acked.range(a..=b).map(|(&s, _)| s))
        .collect()
}

/// Sequences as short runs, `3..7, 9`, at most `max` of them.
pub fn runs(seqs: &[u64], max: usize) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut i = 0;
    while i < seqs.len() && parts.len() < max {
        let start = seqs[i];
        let mut end = start;
        while i + 1 < seqs.len() && seqs[i + 1] == end + 1 {
            i += 1;
            end = seqs[i];
        }
        parts.push(if start == end {
            start.to_string()
        } else {
            format!("{start}..{end}")
        });
        i += 1;
    }
    if i < seqs.len() {
        parts.push("...".into());
    }
    parts.join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holes_are_the_ranges_no_segment_covers() {
        assert_eq!(holes(&[(1, 10), (11, 20)], 20), vec![]);
        assert_eq!(holes(&[(1, 10), (11, 20)], 15), vec![]);
        assert_eq!(holes(&[(1, 10), (21, 30)], 30), vec![(11, 20)]);
        assert_eq!(holes(&[(1, 10), (21, 30)], 15), vec![(11, 15)]);
        assert_eq!(holes(&[(5, 10)], 12), vec![(1, 4), (11, 12)]);
        assert_eq!(holes(&[], 3), vec![(1, 3)]);
        // Overlapping objects (two boxes cut segments apart).
        assert_eq!(holes(&[(1, 10), (5, 12), (13, 13)], 13), vec![]);
    }

    #[test]
    fn runs_are_short() {
        assert_eq!(runs(&[1, 2, 3, 7, 9, 10], 8), "1..3, 7, 9..10");
        assert_eq!(runs(&[1, 3, 5], 2), "1, 3, ...");
    }

    #[test]
    fn a_restored_log_is_checked_frame_by_frame() {
        let dir = std::env::temp_dir().join(format!("archive-check-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let log = Log::open_with(&dir, 4096).expect("log");
        let mut acked = Acked::new();
        let same = Arc::new(Sent {
            kind: 0x8000,
            meta: b"same".to_vec(),
            blob: vec![7; 300],
        });
        for i in 1..=20u64 {
            let sent = if i % 3 == 0 {
                same.clone()
            } else {
                Arc::new(Sent {
                    kind: 0x8000,
                    meta: format!("m{i}").into_bytes(),
                    blob: vec![i as u8; 100 + i as usize],
                })
            };
            log.append_raw(sent.kind, &sent.meta, &sent.blob)
                .expect("append");
            // Frame 5 is one no writer was told of.
            if i != 5 {
                acked.insert(i, sent);
            }
        }
        log.sync().expect("sync");
        drop(log);
        let r = check_restored(&dir, 4096, 20, &acked).expect("check");
        assert!(r.held(), "{r:?}");
        assert_eq!((r.first, r.head, r.checked, r.unacked), (1, 20, 19, 1));

        // Frames past the point, a frame acknowledged with other bytes,
        // and frames acknowledged past the log's end.
        let r = check_restored(&dir, 4096, 18, &acked).expect("check");
        assert_eq!(r.past, vec![19, 20]);
        let mut other = acked.clone();
        other.insert(
            7,
            Arc::new(Sent {
                kind: 0x8000,
                meta: b"m7".to_vec(),
                blob: vec![0; 107],
            }),
        );
        other.insert(21, same.clone());
        other.insert(22, same);
        let r = check_restored(&dir, 4096, 22, &other).expect("check");
        assert_eq!(r.differ.len(), 1, "{r:?}");
        assert_eq!(r.differ[0].0, 7);
        assert_eq!(r.lost, vec![21, 22]);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
