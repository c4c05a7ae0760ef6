//! Acknowledgement markers: one 512-byte slot per acknowledgement, written
//! by the power-cut guest to a raw region of the SAME disk the log is on,
//! after the call that acknowledged returned. The disk's write order then
//! proves the claim: a state holding a marker must hold what it
//! acknowledges.
//!
//! Slot layout (little-endian): magic (8), slot index (8), what (4), kind
//! (2), zero (2), seq or `before` (8), payload crc (4), name length (2),
//! name, zeros, and at 508 the crc of bytes 0..508.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, OpenOptionsExt};

use crate::{Context, DrillError, Result};

/// The size of a slot: one logical sector, written with one O_DIRECT write.
pub const SLOT: usize = 512;
const MAGIC: [u8; 8] = *b"TWDRMARK";
const CRC_AT: usize = SLOT - 4;
const NAME_AT: usize = 38;
/// The longest name a slot holds.
pub const MAX_NAME: usize = CRC_AT - NAME_AT;

/// What a marker acknowledges.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Ack {
    /// The frame `seq`, called `name`, with this payload crc and kind, is
    /// durable: `append`, `sync_through`, `Pending::commit` or `sync`
    /// returned it.
    Frame {
        seq: u64,
        kind: u16,
        crc: u32,
        name: String,
    },
    /// `erase(before, [repo])` returned.
    Erase { before: u64, repo: String },
    /// A client's append was answered: the frame `seq`, of this kind and
    /// payload crc, is durable on the primary, and on the twin too when
    /// `twin` (the answer's durability).
    Durable {
        seq: u64,
        kind: u16,
        crc: u32,
        twin: bool,
    },
    /// The workload finished; every acknowledgement precedes this one.
    Done,
}

/// One slot's record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Marker {
    pub slot: u64,
    pub ack: Ack,
}

impl Marker {
    pub fn encode(&self) -> Result<[u8; SLOT]> {
        let mut b = [0u8; SLOT];
        let (what, kind, seq, crc, name): (u32, u16, u64, u32, &str) = match &self.ack {
            Ack::Frame {
                seq,
                kind,
                crc,
                name,
            } => (1, *kind, *seq, *crc, name),
            Ack::Erase { before, repo } => (2, 0, *before, 0, repo),
            Ack::Done => (3, 0, 0, 0, ""),
            Ack::Durable {
                seq,
                kind,
                crc,
                twin,
            } => (4, *kind, *seq, *crc, if *twin { "twin" } else { "local" }),
        };
        if name.len() > MAX_NAME {
            return Err(DrillError(format!("marker name of {} bytes", name.len())));
        }
        b[0..8].copy_from_slice(&MAGIC);
        b[8..16].copy_from_slice(&self.slot.to_le_bytes());
        b[16..20].copy_from_slice(&what.to_le_bytes());
        b[20..22].copy_from_slice(&kind.to_le_bytes());
        b[24..32].copy_from_slice(&seq.to_le_bytes());
        b[32..36].copy_from_slice(&crc.to_le_bytes());
        b[36..38].copy_from_slice(&(name.len() as u16).to_le_bytes());
        b[NAME_AT..NAME_AT + name.len()].copy_from_slice(name.as_bytes());
        let c = crc32fast::hash(&b[..CRC_AT]);
        b[CRC_AT..].copy_from_slice(&c.to_le_bytes());
        Ok(b)
    }

    /// The marker in a slot, or None for a slot that holds none (zeros, a
    /// torn write, another slot's bytes).
    pub fn decode(slot: u64, b: &[u8]) -> Option<Marker> {
        let b: &[u8; SLOT] = b.try_into().ok()?;
        let le64 = |at: usize| u64::from_le_bytes(b[at..at + 8].try_into().unwrap_or([0; 8]));
        let le32 = |at: usize| u32::from_le_bytes(b[at..at + 4].try_into().unwrap_or([0; 4]));
        let le16 = |at: usize| u16::from_le_bytes([b[at], b[at + 1]]);
        if b[0..8] != MAGIC || le64(8) != slot || le32(CRC_AT) != crc32fast::hash(&b[..CRC_AT]) {
            return None;
        }
        let len = usize::from(le16(36));
        let name = String::from_utf8(b.get(NAME_AT..NAME_AT + len)?.to_vec()).ok()?;
        let ack = match le32(16) {
            1 => Ack::Frame {
                seq: le64(24),
                kind: le16(20),
                crc: le32(32),
                name,
            },
            2 => Ack::Erase {
                before: le64(24),
                repo: name,
            },
            3 => Ack::Done,
            4 => Ack::Durable {
                seq: le64(24),
                kind: le16(20),
                crc: le32(32),
                twin: match name.as_str() {
                    "twin" => true,
                    "local" => false,
                    _ => return None,
                },
            },
            _ => return None,
        };
        Some(Marker { slot, ack })
    }
}

/// The marker writer of a guest: one O_DIRECT|O_DSYNC write of one slot
/// per acknowledgement, in the order they arrive, into the region at
/// `at` of the device `dev`.
pub struct MarkerWriter {
    dev: File,
    at: u64,
    slots: u64,
    next: u64,
    /// Room for one sector at a 512-aligned address, which O_DIRECT needs.
    buf: Vec<u8>,
}

impl MarkerWriter {
    pub fn open(dev: &str, at: u64, slots: u64) -> Result<MarkerWriter> {
        if at == 0 || !at.is_multiple_of(SLOT as u64) {
            return Err(DrillError(format!(
                "drill.marker={at} is not a sector-aligned offset past the file system"
            )));
        }
        let dev_file = OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_DIRECT | libc::O_DSYNC)
            .open(dev)
            .ctx(|| format!("open {dev} for markers"))?;
        Ok(MarkerWriter {
            dev: dev_file,
            at,
            slots,
            next: 0,
            buf: vec![0u8; 2 * SLOT],
        })
    }

    /// Slots written so far.
    pub fn written(&self) -> u64 {
        self.next
    }

    pub fn write(&mut self, ack: Ack) -> Result<()> {
        if self.next >= self.slots {
            return Err(DrillError(format!(
                "marker region full at {} slots",
                self.slots
            )));
        }
        let bytes = Marker {
            slot: self.next,
            ack,
        }
        .encode()?;
        let skew = self.buf.as_ptr() as usize % SLOT;
        let start = (SLOT - skew) % SLOT;
        let aligned = &mut self.buf[start..start + SLOT];
        aligned.copy_from_slice(&bytes);
        let at = self.at + self.next * SLOT as u64;
        self.dev
            .write_all_at(aligned, at)
            .ctx(|| format!("marker slot {} at {at}", self.next))?;
        self.next += 1;
        Ok(())
    }
}

/// Every marker in the region at `at`, `slots` slots long, of the disk
/// image `image`.
pub fn read_image(image: &std::path::Path, at: u64, slots: u64) -> Result<Vec<Marker>> {
    let f = File::open(image).ctx(|| format!("open {}", image.display()))?;
    let mut region = vec![0u8; (slots as usize) * SLOT];
    f.read_exact_at(&mut region, at)
        .ctx(|| format!("{}: marker region at {at}", image.display()))?;
    Ok(scan(&region))
}

/// Every marker in a region's bytes, in slot order. Slots are scanned to
/// the end: a state may hold a later slot without an earlier one only if
/// the disk broke its flushes, and the checker should see both.
pub fn scan(region: &[u8]) -> Vec<Marker> {
    region
        .chunks_exact(SLOT)
        .enumerate()
        .filter_map(|(i, b)| Marker::decode(i as u64, b))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markers_round_trip_and_a_torn_one_is_none() {
        let acks = [
            Ack::Frame {
                seq: 7,
                kind: 2,
                crc: 0xdead_beef,
                name: "keep|a|12".into(),
            },
            Ack::Erase {
                before: 99,
                repo: "gone".into(),
            },
            Ack::Done,
            Ack::Durable {
                seq: 9,
                kind: 0x8000,
                crc: 7,
                twin: true,
            },
        ];
        let mut region = vec![0u8; SLOT * 6];
        for (i, ack) in acks.iter().enumerate() {
            let m = Marker {
                slot: i as u64 + 1,
                ack: ack.clone(),
            };
            let b = m.encode().expect("encode");
            region[(i + 1) * SLOT..(i + 2) * SLOT].copy_from_slice(&b);
        }
        let found = scan(&region);
        assert_eq!(found.len(), 4);
        assert_eq!(found[0].ack, acks[0]);
        assert_eq!(found[3].ack, acks[3]);
        region[2 * SLOT + 40] ^= 1;
        assert_eq!(scan(&region).len(), 3);
        // A slot copied elsewhere is not a marker there.
        let copy = region[SLOT..2 * SLOT].to_vec();
        region[5 * SLOT..6 * SLOT].copy_from_slice(&copy);
        assert_eq!(scan(&region).len(), 3);
    }
}
