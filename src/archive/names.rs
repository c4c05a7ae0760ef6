//! Object names in the bucket. A segment's name carries its first and
//! last sequence, a hash of the log's history id and of the epochs that
//! wrote it, its generation (0, or the erase that rewrote it) and a
//! checksum of its bytes, so two lives of a log, two logs in one prefix or
//! two versions of one segment never share a name:
//!
//! ```text
//! <prefix>/segments/<first:020>-<last:020>-<lineage:016x>-<generation:020>-<sum:08x>.twseg
//! <prefix>/snapshots/<at:020>-<lineage:016x>-<sum:08x>.twsnap
//! <prefix>/heads/<history:032x>.twhead
//! ```
//!
//! Zero-padded numbers sort by name as by value, so a listing comes back
//! oldest first.

use crate::repl::epochs::EpochStart;

pub const SEGMENTS_DIR: &str = "segments";
pub const SNAPSHOTS_DIR: &str = "snapshots";
pub const ERASES_DIR: &str = "erases";
pub const HEADS_DIR: &str = "heads";
const HEAD_EXT: &str = ".twhead";
const ERASE_EXT: &str = ".done";
const SEGMENT_EXT: &str = ".twseg";
const SNAPSHOT_EXT: &str = ".twsnap";

/// The hash naming a lineage: the log's history id and the epochs that
/// wrote frames up to `through` (SHA-256, first 8 bytes).
pub fn lineage(history: &[u8; 16], epochs: &[EpochStart], through: u64) -> u64 {
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
    ctx.update(history);
    for e in epochs.iter().filter(|e| e.first <= through) {
        ctx.update(&e.epoch.to_le_bytes());
        ctx.update(&e.first.to_le_bytes());
    }
    let d = ctx.finish();
    let mut b = [0u8; 8];
    b.copy_from_slice(&d.as_ref()[..8]);
    u64::from_be_bytes(b)
}

/// The segments of one lineage in a listing sorted by name, oldest
/// first: of two versions of a segment, the newer generation.
pub fn of_lineage(
    listed: &[(SegmentName, u64)],
    history: &[u8; 16],
    epochs: &[EpochStart],
) -> Vec<(SegmentName, u64)> {
    let mut out: Vec<(SegmentName, u64)> = Vec::new();
    for &(n, size) in listed {
        if n.lineage != lineage(history, epochs, n.last) {
            continue;
        }
        match out.last_mut() {
            Some(prev) if prev.0.first == n.first => {
                if n.generation > prev.0.generation {
                    *prev = (n, size);
                }
            }
            _ => out.push((n, size)),
        }
    }
    out
}

/// The epochs that wrote frames up to `through`.
pub fn epochs_through(epochs: &[EpochStart], through: u64) -> Vec<EpochStart> {
    epochs
        .iter()
        .copied()
        .filter(|e| e.first <= through)
        .collect()
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SegmentName {
    pub first: u64,
    pub last: u64,
    pub lineage: u64,
    pub generation: u64,
    pub sum: u32,
}

impl SegmentName {
    /// The object's key under `prefix` (no leading or trailing slash).
    pub fn key(&self, prefix: &str) -> String {
        format!(
            "{}{SEGMENTS_DIR}/{:020}-{:020}-{:016x}-{:020}-{:08x}{SEGMENT_EXT}",
            with_slash(prefix),
            self.first,
            self.last,
            self.lineage,
            self.generation,
            self.sum
        )
    }

    /// Parse an object's key; None for anything else in the prefix.
    pub fn parse(key: &str) -> Option<SegmentName> {
        let base = key.rsplit('/').next()?.strip_suffix(SEGMENT_EXT)?;
        let mut f = base.split('-');
        let first = parse_dec(f.next()?, 20)?;
        let last = parse_dec(f.next()?, 20)?;
        let lineage = parse_hex(f.next()?, 16)?;
        let generation = parse_dec(f.next()?, 20)?;
        let sum = u32::try_from(parse_hex(f.next()?, 8)?).ok()?;
        if f.next().is_some() || first == 0 || last < first {
            return None;
        }
        Some(SegmentName {
            first,
            last,
            lineage,
            generation,
            sum,
        })
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SnapshotName {
    pub at: u64,
    pub lineage: u64,
    pub sum: u32,
}

impl SnapshotName {
    pub fn key(&self, prefix: &str) -> String {
        format!(
            "{}{SNAPSHOTS_DIR}/{:020}-{:016x}-{:08x}{SNAPSHOT_EXT}",
            with_slash(prefix),
            self.at,
            self.lineage,
            self.sum
        )
    }

    pub fn parse(key: &str) -> Option<SnapshotName> {
        let base = key.rsplit('/').next()?.strip_suffix(SNAPSHOT_EXT)?;
        let mut f = base.split('-');
        let at = parse_dec(f.next()?, 20)?;
        let lineage = parse_hex(f.next()?, 16)?;
        let sum = u32::try_from(parse_hex(f.next()?, 8)?).ok()?;
        if f.next().is_some() || at == 0 {
            return None;
        }
        Some(SnapshotName { at, lineage, sum })
    }
}

/// An empty object saying the Erase frame `seq` of a lineage reached the
/// archive: `<prefix>/erases/<lineage:016x>-<seq:020>.done`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct EraseMark {
    pub lineage: u64,
    pub seq: u64,
}

impl EraseMark {
    pub fn key(&self, prefix: &str) -> String {
        format!(
            "{}{ERASES_DIR}/{:016x}-{:020}{ERASE_EXT}",
            with_slash(prefix),
            self.lineage,
            self.seq
        )
    }

    pub fn parse(key: &str) -> Option<EraseMark> {
        let base = key.rsplit('/').next()?.strip_suffix(ERASE_EXT)?;
        let (lineage, seq) = base.split_once('-')?;
        Some(EraseMark {
            lineage: parse_hex(lineage, 16)?,
            seq: parse_dec(seq, 20)?,
        })
    }
}

/// What the object stored under `key` claims to be, by its name, as a
/// refusal says it.
pub fn claims(key: &str) -> String {
    if let Some(n) = SegmentName::parse(key) {
        return format!(
            "frames {} to {} of lineage {:016x}, generation {}",
            n.first, n.last, n.lineage, n.generation
        );
    }
    if let Some(n) = SnapshotName::parse(key) {
        return format!(
            "a store snapshot at frame {} of lineage {:016x}",
            n.at, n.lineage
        );
    }
    "nothing this build names".into()
}

/// The key of the head record of the log `history`:
/// `<prefix>/heads/<history:032x>.twhead`.
pub fn head_key(prefix: &str, history: &[u8; 16]) -> String {
    let h: String = history.iter().map(|b| format!("{b:02x}")).collect();
    format!("{}{HEADS_DIR}/{h}{HEAD_EXT}", with_slash(prefix))
}

/// `prefix/`, or nothing for the bucket's root.
pub fn with_slash(prefix: &str) -> String {
    let p = prefix.trim_matches('/');
    if p.is_empty() {
        String::new()
    } else {
        format!("{p}/")
    }
}

fn parse_dec(s: &str, width: usize) -> Option<u64> {
    (s.len() == width && s.bytes().all(|b| b.is_ascii_digit()))
        .then(|| s.parse().ok())
        .flatten()
}

fn parse_hex(s: &str, width: usize) -> Option<u64> {
    (s.len() == width && s.bytes().all(|b| b.is_ascii_hexdigit()))
        .then(|| u64::from_str_radix(s, 16).ok())
        .flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_sort_by_sequence() {
        let a = SegmentName {
            first: 9,
            last: 120,
            lineage: 0xdead_beef,
            generation: 0,
            sum: 0x1234,
        };
        let b = SegmentName { first: 121, ..a };
        assert_eq!(SegmentName::parse(&a.key("bkt/p")), Some(a));
        assert_eq!(SegmentName::parse(&a.key("")), Some(a));
        assert!(a.key("p") < b.key("p"));
        let s = SnapshotName {
            at: 77,
            lineage: 1,
            sum: 2,
        };
        assert_eq!(SnapshotName::parse(&s.key("x/")), Some(s));
        assert_eq!(SegmentName::parse(&s.key("x")), None);
        assert_eq!(SegmentName::parse("p/segments/1-2-3-4-5.twseg"), None);
        let m = EraseMark {
            lineage: 0xfeed,
            seq: 31,
        };
        assert_eq!(EraseMark::parse(&m.key("p")), Some(m));
        assert_eq!(EraseMark::parse(&a.key("p")), None);
    }

    #[test]
    fn lineage_tells_lives_apart() {
        let h = [3u8; 16];
        let one = [EpochStart { epoch: 0, first: 1 }];
        let two = [
            EpochStart { epoch: 0, first: 1 },
            EpochStart {
                epoch: 1 << 32,
                first: 50,
            },
        ];
        assert_eq!(lineage(&h, &one, 40), lineage(&h, &two, 40));
        assert_ne!(lineage(&h, &one, 60), lineage(&h, &two, 60));
        assert_ne!(lineage(&h, &one, 40), lineage(&[4u8; 16], &one, 40));
    }
}
