//! The dm-log-writes format, as QEMU's `blklogwrites` driver writes it, and
//! its replay.
//!
//! The log starts with a superblock sector (magic, version, entry count,
//! sector size). Each entry is one sector holding sector, count, flags and
//! a data length, followed by the written data rounded up to sectors: a
//! write or a write-zeroes has `count` sectors of data; a FLUSH and a
//! DISCARD have none; a MARK carries `data_len` bytes. QEMU appends an
//! entry once the write to the image completed, so the entry order is the
//! completion order, and a FLUSH entry follows every write it covered.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;

use crate::{Context, DrillError, Result};

pub const FLUSH: u64 = 1;
pub const FUA: u64 = 2;
pub const DISCARD: u64 = 4;
pub const MARK: u64 = 8;

const MAGIC: u64 = 0x006a_7366_7773_6872;
const VERSION: u64 = 1;
const ENTRY_LEN: usize = 32;

/// One logged operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Entry {
    /// The first sector written, in units of the log's sector size.
    pub sector: u64,
    pub sectors: u64,
    pub flags: u64,
    /// Where its data starts in the log file; `data_bytes` long.
    pub data_at: u64,
    pub data_bytes: u64,
}

impl Entry {
    pub fn is_flush(&self) -> bool {
        self.flags & FLUSH != 0
    }

    /// A write that lands data on the image (a write or a write-zeroes).
    pub fn is_write(&self) -> bool {
        self.flags & (FLUSH | DISCARD | MARK) == 0 && self.sectors > 0
    }

    /// A barrier: what completed before it is on stable media once it did.
    /// QEMU logs no FUA (virtio-blk has none), but a kernel dm-log-writes
    /// log does, and a FUA write is durable when it completes.
    pub fn is_barrier(&self) -> bool {
        self.flags & (FLUSH | FUA) != 0
    }
}

/// A parsed log: its sector size and entries, the data left in the file.
#[derive(Debug)]
pub struct WriteLog {
    file: File,
    pub sector_size: u64,
    pub entries: Vec<Entry>,
}

fn le64(b: &[u8], at: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(w)
}

impl WriteLog {
    pub fn open(path: &Path) -> Result<WriteLog> {
        let file = File::open(path).ctx(|| format!("open write log {}", path.display()))?;
        let len = file
            .metadata()
            .ctx(|| format!("stat {}", path.display()))?
            .len();
        let mut sb = [0u8; 28];
        file.read_exact_at(&mut sb, 0)
            .ctx(|| format!("{}: superblock", path.display()))?;
        if le64(&sb, 0) != MAGIC || le64(&sb, 8) != VERSION {
            return Err(DrillError(format!(
                "{}: not a dm-log-writes log (magic {:#x}, version {})",
                path.display(),
                le64(&sb, 0),
                le64(&sb, 8)
            )));
        }
        let count = le64(&sb, 16);
        let sector_size = u64::from(u32::from_le_bytes([sb[24], sb[25], sb[26], sb[27]]));
        if !(512..=65536).contains(&sector_size) || !sector_size.is_power_of_two() {
            return Err(DrillError(format!(
                "{}: sector size {sector_size}",
                path.display()
            )));
        }
        let mut entries = Vec::with_capacity(count.min(1 << 20) as usize);
        let mut at = sector_size;
        let mut e = [0u8; ENTRY_LEN];
        for i in 0..count {
            file.read_exact_at(&mut e, at)
                .ctx(|| format!("{}: entry {i} at {at}", path.display()))?;
            let (sector, sectors, flags, data_len) =
                (le64(&e, 0), le64(&e, 8), le64(&e, 16), le64(&e, 24));
            let data_bytes = if flags & (FLUSH | DISCARD) != 0 {
                0
            } else if flags & MARK != 0 {
                data_len
            } else {
                sectors
                    .checked_mul(sector_size)
                    .ok_or_else(|| DrillError(format!("entry {i}: {sectors} sectors")))?
            };
            let data_at = at + sector_size;
            let next = data_at + data_bytes.div_ceil(sector_size) * sector_size;
            if next > len {
                return Err(DrillError(format!(
                    "{}: entry {i} runs to {next}, past the log's end at {len}",
                    path.display()
                )));
            }
            entries.push(Entry {
                sector,
                sectors,
                flags,
                data_at,
                data_bytes,
            });
            at = next;
        }
        Ok(WriteLog {
            file,
            sector_size,
            entries,
        })
    }

    /// Apply one entry to an image: a write's data, a discard's zeros (what
    /// QEMU's raw file reads back after a discard); flushes and marks change
    /// nothing.
    pub fn apply(&self, e: &Entry, image: &File) -> Result<()> {
        let at = e.sector * self.sector_size;
        if e.flags & DISCARD != 0 {
            let zeros = vec![0u8; (e.sectors * self.sector_size) as usize];
            return image
                .write_all_at(&zeros, at)
                .ctx(|| format!("discard at {at}"));
        }
        if !e.is_write() {
            return Ok(());
        }
        let mut buf = vec![0u8; e.data_bytes as usize];
        self.file
            .read_exact_at(&mut buf, e.data_at)
            .ctx(|| format!("log data at {}", e.data_at))?;
        image
            .write_all_at(&buf, at)
            .ctx(|| format!("image write at {at}"))
    }

    /// Indices of the FLUSH entries.
    pub fn flushes(&self) -> Vec<usize> {
        (0..self.entries.len())
            .filter(|&i| self.entries[i].is_flush())
            .collect()
    }
}

/// The write entries between each flush and the next barrier, for the
/// intervals chosen: evenly spread over the run, and the busiest.
pub fn pick_intervals(wl: &WriteLog, want: u64) -> Vec<(usize, Vec<usize>)> {
    let flushes = wl.flushes();
    let mut eligible = Vec::new();
    for (k, &f) in flushes.iter().enumerate() {
        let end = flushes.get(k + 1).copied().unwrap_or(wl.entries.len());
        let writes: Vec<usize> = (f + 1..end)
            .take_while(|&i| !wl.entries[i].is_barrier())
            .filter(|&i| wl.entries[i].is_write() || wl.entries[i].flags & DISCARD != 0)
            .collect();
        if writes.len() >= 2 {
            eligible.push((f, writes));
        }
    }
    if eligible.is_empty() || want == 0 {
        return Vec::new();
    }
    let mut chosen: Vec<usize> = (0..want as usize)
        .map(|j| j * eligible.len() / want as usize)
        .collect();
    if let Some(busiest) = (0..eligible.len()).max_by_key(|&i| eligible[i].1.len()) {
        chosen.push(busiest);
    }
    chosen.sort_unstable();
    chosen.dedup();
    chosen.into_iter().map(|i| eligible[i].clone()).collect()
}

/// CrashMonkey's states between two barriers: prefixes, then up to
/// `subsets` random proper subsets, of the writes in `writes` (at least
/// two), each to be applied on top of the state at the flush before them.
pub fn subset_picks(writes: &[usize], subsets: u64, rng: &mut crate::Rng) -> Vec<Vec<usize>> {
    let m = writes.len();
    let mut seen = std::collections::HashSet::new();
    let mut picks: Vec<Vec<usize>> = Vec::new();
    let steps = (m - 1).min(8);
    for s in 1..=steps {
        let j = s * (m - 1) / steps;
        if j > 0 && seen.insert(writes[..j].to_vec()) {
            picks.push(writes[..j].to_vec());
        }
    }
    for _ in 0..subsets * 4 {
        if picks.len() >= steps + subsets as usize {
            break;
        }
        let pick: Vec<usize> = writes
            .iter()
            .copied()
            .filter(|_| rng.below(2) == 0)
            .collect();
        if !pick.is_empty() && pick.len() < m && seen.insert(pick.clone()) {
            picks.push(pick);
        }
    }
    picks
}

/// Whether two files hold the same bytes; the first differing offset if not.
pub fn first_difference(a: &Path, b: &Path) -> Result<Option<u64>> {
    let fa = File::open(a).ctx(|| format!("open {}", a.display()))?;
    let fb = File::open(b).ctx(|| format!("open {}", b.display()))?;
    let la = fa.metadata().ctx(|| format!("stat {}", a.display()))?.len();
    let lb = fb.metadata().ctx(|| format!("stat {}", b.display()))?.len();
    let mut ba = vec![0u8; 1 << 20];
    let mut bb = vec![0u8; 1 << 20];
    let mut at = 0u64;
    while at < la.min(lb) {
        let n = (la.min(lb) - at).min(ba.len() as u64) as usize;
        fa.read_exact_at(&mut ba[..n], at)
            .ctx(|| format!("read {}", a.display()))?;
        fb.read_exact_at(&mut bb[..n], at)
            .ctx(|| format!("read {}", b.display()))?;
        if let Some(i) = (0..n).find(|&i| ba[i] != bb[i]) {
            return Ok(Some(at + i as u64));
        }
        at += n as u64;
    }
    Ok((la != lb).then_some(la.min(lb)))
}
