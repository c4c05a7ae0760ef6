//! The archive drill's adversary phase: the bucket is storage that other
//! people and other programs can write to, and the drill writes to it.
//! Each attack runs against a pair of its own, archiving under a prefix of
//! its own: the attacks, which objects each takes, the objects it forges,
//! and the judgement of what the pair and a restore made of it.
//!
//! The rule judged: every acknowledged frame a box held when the bucket
//! was attacked is, afterwards, on a box or in a restore that gives it
//! byte for byte; a frame only the bucket held may instead be in a restore
//! that is refused by name (the attack took it). A restore that succeeds
//! holds every acknowledged frame up to its end as acknowledged, and a
//! restore to the end reaches as far as the archive had (nothing says a
//! shorter archive is complete). A refusal names the object or the frames.

use std::collections::BTreeSet;

use twinlog::archive::bucket::Bucket;
use twinlog::archive::codec::Codec;
use twinlog::archive::names::{lineage, SegmentName};
use twinlog::archive::object::{Content, ObjectWriter, SegmentInfo, PIECE_LEN};
use twinlog::archive::walk::FrameWalk;
use twinlog::log::format::{payload_crc, FrameHeader, SegmentHeader};
use twinlog::repl::epochs::EpochStart;

use crate::archive::{runs, Acked, Restored};
use crate::{Context, DrillError, Result};

/// One attack on the bucket.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Attack {
    pub name: &'static str,
    /// The negative control that must make the drill fail on it.
    pub control: &'static str,
    /// A restore is run right after the attack, the uploading box frozen
    /// (nothing repaired yet): it must be refused by name, or be exact
    /// and reach as far as the archive had.
    pub restore_now: bool,
    pub what: &'static str,
}

/// The attacks, in the order a run makes them.
pub const ATTACKS: &[Attack] = &[
    Attack {
        name: "deleted",
        control: "trust-bucket",
        restore_now: true,
        what: "every object holding frames a box still holds deleted, and the newest holding frames only the bucket holds",
    },
    Attack {
        name: "moved",
        control: "trust-bucket",
        restore_now: true,
        what: "the oldest object holding frames a box still holds copied under another segment name (another frame range), the original deleted",
    },
    Attack {
        name: "replaced-sealed",
        control: "trust-bucket",
        restore_now: true,
        what: "the oldest object holding frames a box still holds replaced by another lineage's object sealed under the same key",
    },
    Attack {
        name: "replaced-unsealed",
        control: "accept-unsealed",
        restore_now: true,
        what: "the oldest object holding frames a box still holds replaced by another lineage's unsealed object of the same frames",
    },
    Attack {
        name: "truncated",
        control: "ignore-head",
        restore_now: true,
        what: "the newest objects deleted, the head record left",
    },
    Attack {
        name: "rolled-back",
        control: "trust-bucket",
        restore_now: false,
        what: "the bucket rolled back to an earlier generation: the head record put back as it was at half the load, every object since deleted",
    },
    Attack {
        name: "downgraded",
        control: "accept-unsealed",
        restore_now: true,
        what: "the newest object holding frames only the bucket holds replaced, under its name, by unsealed bytes with valid crcs holding other frames",
    },
    Attack {
        name: "renamed",
        control: "trust-bucket",
        restore_now: true,
        what: "the oldest object holding frames a box still holds copied under the name of a newer version of the same frames (a generation above), the original deleted",
    },
    Attack {
        name: "adopted",
        control: "trust-bucket",
        restore_now: true,
        what: "the oldest object holding frames only the primary holds (the twin's cap is half the primary's) replaced by another lineage's object sealed under the same key",
    },
];

/// Attacks a run makes only when named (`--attacks`): none today.
pub const PROBES: &[Attack] = &[];

/// The negative controls: daemons and restore built with the feature
/// `drill-sabotage`, run with `TWINLOG_DRILL_SABOTAGE=<name>`.
pub const CONTROLS: &[&str] = &["trust-bucket", "accept-unsealed", "ignore-head"];

pub fn attack(name: &str) -> Option<Attack> {
    ATTACKS
        .iter()
        .chain(PROBES)
        .copied()
        .find(|a| a.name == name)
}

/// The attacks a control must break.
pub fn broken_by(control: &str) -> Vec<Attack> {
    ATTACKS
        .iter()
        .copied()
        .filter(|a| a.control == control)
        .collect()
}

/// The attacks named in `list` (comma-separated), or `default`.
pub fn chosen(list: Option<&str>, default: Vec<Attack>) -> Result<Vec<Attack>> {
    let Some(list) = list.filter(|l| !l.trim().is_empty()) else {
        return Ok(default);
    };
    list.split(',')
        .map(|n| {
            attack(n.trim()).ok_or_else(|| {
                let names: Vec<&str> = ATTACKS.iter().chain(PROBES).map(|a| a.name).collect();
                DrillError(format!("attack {n:?}: one of {}", names.join(", ")))
            })
        })
        .collect()
}

/// The objects of `listed` (oldest first) holding a frame at or past
/// `held_from`, the lowest frame a box holds.
pub fn on_boxes(listed: &[(SegmentName, u64)], held_from: u64) -> Vec<(SegmentName, u64)> {
    listed
        .iter()
        .filter(|(n, _)| n.last >= held_from)
        .copied()
        .collect()
}

/// The objects of `listed` whose frames are all below `held_from`: only
/// the bucket holds them.
pub fn bucket_only(listed: &[(SegmentName, u64)], held_from: u64) -> Vec<(SegmentName, u64)> {
    listed
        .iter()
        .filter(|(n, _)| n.last < held_from)
        .copied()
        .collect()
}

/// Frame `seq` as a forger writes it: its meta names it.
fn forged_frame(seq: u64) -> (Vec<u8>, Vec<u8>) {
    let meta = format!("forged #{seq}").into_bytes();
    let mut blob = format!("not what was acknowledged at {seq} ").into_bytes();
    blob.resize(100 + (seq % 700) as usize, (seq % 251) as u8);
    (meta, blob)
}

/// The bytes of an archived segment object holding frames `first..=last`
/// of the log `history` that no writer sent, each with valid crcs: a
/// segment header and frames as a box writes them, cut into pieces,
/// compressed and sealed by `codec` as an uploader does, bound to the
/// object name `bound_to` (when sealed), the footer saying it was written
/// under `epochs`.
pub fn forge(
    codec: &Codec,
    bound_to: &str,
    history: [u8; 16],
    epochs: &[EpochStart],
    first: u64,
    last: u64,
) -> Result<Vec<u8>> {
    let mut plain = Vec::new();
    for seq in first..=last {
        let (meta, blob) = forged_frame(seq);
        let h = FrameHeader {
            seq,
            kind: crate::archive_pair::KIND,
            meta_len: meta.len() as u32,
            blob_len: blob.len() as u64,
            payload_crc: payload_crc(&meta, &blob),
        };
        plain.extend_from_slice(&h.encode());
        plain.extend_from_slice(&meta);
        plain.extend_from_slice(&blob);
    }
    let header = SegmentHeader {
        first_seq: first,
        history,
        capacity: (plain.len() + 64) as u64,
    };
    let mut seg = header.encode().to_vec();
    seg.extend_from_slice(&plain);
    let mut w = ObjectWriter::new(codec, PIECE_LEN, bound_to).ctx(|| "a forger's writer".into())?;
    let mut walk = FrameWalk::new(first, history);
    let mut out = Vec::new();
    for piece in seg.chunks(PIECE_LEN as usize) {
        let start = walk.feed(piece).ctx(|| "walk the forged segment".into())?;
        out.extend(w.piece(piece, start).ctx(|| "a forged piece".into())?);
    }
    let end = walk.finish().ctx(|| "the forged segment's end".into())?;
    if end != last {
        return Err(DrillError(format!(
            "the forged segment ends at {end}, not {last}"
        )));
    }
    let (tail, _) = w
        .finish(Content::Segment(SegmentInfo {
            history,
            first,
            last,
            epochs: epochs.iter().copied().filter(|e| e.first <= last).collect(),
            generation: 0,
            marks: Vec::new(),
            repos: Vec::new(),
        }))
        .ctx(|| "the forged footer".into())?;
    out.extend(tail);
    Ok(out)
}

/// Another lineage of the log `history`: other epochs (a life this
/// pair never had), and the name its object of `first..=last` has there.
pub fn other_lineage(history: &[u8; 16], first: u64, last: u64) -> (Vec<EpochStart>, SegmentName) {
    let epochs = vec![EpochStart {
        epoch: 0xad << 32,
        first: 1,
    }];
    let name = SegmentName {
        first,
        last,
        lineage: lineage(history, &epochs, last),
        generation: 0,
        sum: 0x0bad_5eed,
    };
    (epochs, name)
}

/// Put `bytes` under `key`.
pub async fn put(bucket: &Bucket, key: &str, bytes: Vec<u8>) -> Result<()> {
    let mut up = bucket.writer(key);
    up.write(bytes.into()).await.ctx(|| format!("put {key}"))?;
    up.finish().await.ctx(|| format!("put {key}"))?;
    Ok(())
}

/// The whole object under `key` of `size` bytes.
pub async fn get(bucket: &Bucket, key: &str, size: u64) -> Result<Vec<u8>> {
    Ok(bucket
        .get_range(key, 0..size)
        .await
        .ctx(|| format!("get {key}"))?
        .to_vec())
}

/// Whether a refusal names what failed: an object's key, or frames by
/// number.
pub fn names_what(msg: &str) -> bool {
    if msg.contains("segments/") || msg.contains("heads/") || msg.contains("snapshots/") {
        return true;
    }
    let b = msg.as_bytes();
    msg.match_indices("frame").any(|(i, _)| {
        let mut j = i + "frame".len();
        if b.get(j) == Some(&b's') {
            j += 1;
        }
        b.get(j) == Some(&b' ') && b.get(j + 1).is_some_and(u8::is_ascii_digit)
    })
}

/// What a restore to the end of the archive did.
#[derive(Debug)]
pub enum Restore {
    /// It succeeded: its log checked against the acknowledged frames.
    Done(Restored),
    /// It was refused: its last line.
    Refused(String),
}

/// What one look after an attack found.
pub struct Look<'a> {
    pub what: &'a str,
    pub acked: &'a Acked,
    /// The acknowledged frames a box holds now, read back equal; None when
    /// the boxes were not read (a restore right after the attack).
    pub on_box: Option<&'a BTreeSet<u64>>,
    /// The lowest frame a box held when the bucket was attacked: from it
    /// on, every acknowledged frame had a copy on a box.
    pub held_from: u64,
    /// The acknowledged frames the bucket still keeps as acknowledged, in
    /// objects that open under the key (read by the drill), of those on no
    /// box; None when not read.
    pub in_bucket: Option<&'a BTreeSet<u64>>,
    /// How far the archive reached before the attack: a restore to the
    /// end that succeeds reaches at least this far. None: not judged.
    pub reached: Option<u64>,
    pub restore: &'a Restore,
}

/// What a look found.
#[derive(Debug, Default)]
pub struct Judged {
    /// The broken rules (`LOST`, `DIFFER`, `BROKEN` lines); none when the
    /// rule held.
    pub lines: Vec<String>,
    /// Acknowledged frames only the bucket held that the attack took: on
    /// no box, and the restore is refused by name.
    pub taken: u64,
    /// Acknowledged frames a box held when the bucket was attacked that
    /// are now on no box, kept in the bucket as acknowledged but past an
    /// object the restore refuses.
    pub behind: Vec<u64>,
}

/// Judge a look: frames a box held when the bucket was attacked are on a
/// box, in the restore, or still in the bucket as acknowledged (no box
/// dropped their last copy); a restore that succeeds is exact up to its
/// end, and a restore to the end reaches as far as the archive had; a
/// refusal names what it refuses.
pub fn judge(look: &Look<'_>) -> Judged {
    let mut j = Judged::default();
    let what = look.what;
    let kept = |seq: u64| {
        look.on_box.is_some_and(|b| b.contains(&seq))
            || look.in_bucket.is_some_and(|b| b.contains(&seq))
    };
    let out = &mut j.lines;
    match look.restore {
        Restore::Done(r) => {
            for (seq, how) in r.differ.iter().take(5) {
                out.push(format!("DIFFER frame {seq}: {what}: the restore {how}"));
            }
            if r.differ.len() > 5 {
                let seqs: Vec<u64> = r.differ.iter().map(|d| d.0).collect();
                out.push(format!(
                    "DIFFER: {what}: {} restored frames are not the acknowledged ones ({})",
                    seqs.len(),
                    runs(&seqs, 8)
                ));
            }
            if !r.lost.is_empty() {
                out.push(format!(
                    "LOST: {what}: the restore succeeded to frame {} without acknowledged frames {}",
                    r.head,
                    runs(&r.lost, 8)
                ));
            }
            if r.first != 1 {
                out.push(format!(
                    "LOST: {what}: the restored log starts at frame {}",
                    r.first
                ));
            }
            if let Some(a) = look.reached.filter(|&a| r.head < a) {
                out.push(format!(
                    "BROKEN: {what}: the restore to the end succeeded at frame {} where the archive had reached {a}: a shorter archive restored silently",
                    r.head
                ));
            }
            if look.on_box.is_some() {
                let nowhere: Vec<u64> = look
                    .acked
                    .range(r.head + 1..)
                    .map(|(&s, _)| s)
                    .filter(|&s| !kept(s))
                    .collect();
                if !nowhere.is_empty() {
                    out.push(format!(
                        "LOST: {what}: acknowledged frames {} are on no box, in no object of the bucket, and past the restore's end ({})",
                        runs(&nowhere, 8),
                        r.head
                    ));
                }
            }
        }
        Restore::Refused(msg) => {
            if !names_what(msg) {
                out.push(format!(
                    "BROKEN: {what}: the restore was refused without naming the object or the frames: {msg}"
                ));
            }
            if look.on_box.is_some() {
                let mut nowhere = Vec::new();
                for &seq in look.acked.keys() {
                    if look.on_box.is_some_and(|b| b.contains(&seq)) {
                        continue;
                    }
                    if seq < look.held_from {
                        j.taken += 1;
                    } else if kept(seq) {
                        j.behind.push(seq);
                    } else {
                        nowhere.push(seq);
                    }
                }
                if !nowhere.is_empty() {
                    for seq in nowhere.iter().take(3) {
                        out.push(format!(
                            "LOST frame {seq}: {what}: a box held it when the bucket was attacked; no box holds it now, no object of the bucket does, and the restore is refused"
                        ));
                    }
                    out.push(format!(
                        "LOST: {what}: the boxes dropped the last copy of {} acknowledged frames ({}); the restore: {msg}",
                        nowhere.len(),
                        runs(&nowhere, 8)
                    ));
                }
            }
        }
    }
    j
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::archive::Sent;
    use std::sync::Arc;

    #[test]
    fn a_refusal_names_an_object_or_frames() {
        assert!(names_what(
            "restore from s3://b/p: p/segments/0001-0002.twseg: piece 0 does not open"
        ));
        assert!(names_what(
            "the archive's segments of this lineage skip from frame 12 to 40"
        ));
        assert!(names_what("frames 1371 to 1495 are gone"));
        assert!(!names_what("s3://b/p: no archived segment"));
        assert!(!names_what("the trailer's crc does not match"));
        assert!(!names_what("frame header at byte 4"));
    }

    #[test]
    fn every_control_breaks_some_attack() {
        for c in CONTROLS {
            assert!(!broken_by(c).is_empty(), "{c}");
        }
        for a in ATTACKS {
            assert!(CONTROLS.contains(&a.control), "{}", a.name);
        }
        assert_eq!(
            chosen(Some("moved, truncated"), vec![]).unwrap(),
            vec![attack("moved").unwrap(), attack("truncated").unwrap()]
        );
        assert!(chosen(Some("nothing"), vec![]).is_err());
    }

    fn acked(n: u64) -> Acked {
        (1..=n)
            .map(|s| {
                (
                    s,
                    Arc::new(Sent {
                        kind: 1,
                        meta: vec![],
                        blob: vec![s as u8],
                    }),
                )
            })
            .collect()
    }

    #[test]
    fn frames_a_box_held_must_stay_on_a_box_or_restore() {
        let a = acked(100);
        let refused = Restore::Refused("p/segments/x.twseg: not encrypted".into());
        let boxes: BTreeSet<u64> = (60..=100).collect();
        let none = BTreeSet::new();
        let look = |on_box, in_bucket, restore| Look {
            what: "t",
            acked: &a,
            on_box,
            in_bucket,
            held_from: 50,
            reached: Some(90),
            restore,
        };
        // Frames 50..59 left both boxes after the attack, and the restore
        // is refused: their last copy is gone. Below 50 the attack took
        // them.
        let j = judge(&look(Some(&boxes), Some(&none), &refused));
        assert_eq!(j.taken, 49);
        assert!(j.lines.iter().any(|l| l.contains("50..59")), "{j:?}");
        // Kept in the bucket, past the refused object: not lost.
        let kept: BTreeSet<u64> = (40..=59).collect();
        let j = judge(&look(Some(&boxes), Some(&kept), &refused));
        assert!(j.lines.is_empty(), "{j:?}");
        assert_eq!((j.taken, j.behind.len()), (49, 10));
        let all: BTreeSet<u64> = (50..=100).collect();
        let j = judge(&look(Some(&all), None, &refused));
        assert!(j.lines.is_empty() && j.taken == 49, "{j:?}");
        // Unnamed.
        let blind = Restore::Refused("the trailer's crc does not match".into());
        assert_eq!(judge(&look(Some(&all), None, &blind)).lines.len(), 1);
        // A restore that succeeds short of the archive's reach, or with
        // other frames.
        let short = Restore::Done(Restored {
            first: 1,
            head: 80,
            ..Restored::default()
        });
        let lines = judge(&look(None, None, &short)).lines;
        assert!(lines[0].contains("restored silently"), "{lines:?}");
        let lines = judge(&look(Some(&boxes), None, &short)).lines;
        assert_eq!(lines.len(), 1, "frames 81..100 are on a box: {lines:?}");
        let wrong = Restore::Done(Restored {
            first: 1,
            head: 95,
            differ: vec![(7, "other bytes".into())],
            ..Restored::default()
        });
        let lines = judge(&look(None, None, &wrong)).lines;
        assert!(lines[0].starts_with("DIFFER frame 7"), "{lines:?}");
    }

    #[test]
    fn a_forged_segment_walks_and_names_other_frames() {
        let history = [9u8; 16];
        let codec = Codec {
            zstd_level: Some(1),
            key: None,
        };
        let (epochs, name) = other_lineage(&history, 40, 90);
        let key = name.key("p");
        let bytes = forge(&codec, &key, history, &epochs, 40, 90).unwrap();
        let size = bytes.len() as u64;
        let t = twinlog::archive::object::Trailer::decode(
            &bytes[bytes.len() - twinlog::archive::object::TRAILER_LEN..],
        )
        .unwrap();
        let fr = t.footer_range(size).unwrap();
        let r = twinlog::archive::object::ObjectReader::open(
            t,
            bytes[fr.start as usize..fr.end as usize].to_vec(),
            None,
            size,
            &key,
        )
        .unwrap();
        let mut walk = FrameWalk::new(40, history);
        for i in 0..r.pieces() {
            let rg = r.pieces_range(i, i + 1);
            let plain = r
                .open_piece(i, bytes[rg.start as usize..rg.end as usize].to_vec())
                .unwrap();
            walk.feed(&plain).unwrap();
        }
        assert_eq!(walk.finish().unwrap(), 90);
        assert_ne!(
            name.lineage,
            lineage(&history, &[EpochStart { epoch: 0, first: 1 }], 90)
        );
    }
}
