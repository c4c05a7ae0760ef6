//! What the pair power-cut drill writes and reads: frames from a small
//! alphabet, so that many frames carry the same bytes and the same crc (a
//! retried write, an empty blob), and the frames of a stopped box's log.

use std::collections::BTreeMap;
use std::path::Path;

use twinlog::log::{format, Log};

use crate::{Context, DrillError, Result};

/// The kind of the drill's frames (an application kind).
pub const KIND: u16 = 0x8000;

/// One letter of the alphabet: a frame's meta and blob.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Letter {
    pub meta: Vec<u8>,
    pub blob: Vec<u8>,
    pub crc: u32,
}

/// Eight letters: two metas times four blobs (empty, one byte, 100 bytes,
/// 2000 bytes), each crc distinct from the others'.
pub fn alphabet() -> Vec<Letter> {
    let mut out = Vec::new();
    for meta in [&b"m"[..], &b"retry"[..]] {
        for len in [0usize, 1, 100, 2000] {
            let blob = crate::content::bytes(len as u64 + 1, len);
            out.push(Letter {
                crc: format::payload_crc(meta, &blob),
                meta: meta.to_vec(),
                blob,
            });
        }
    }
    out
}

/// The letter a crc names, if any.
pub fn letter_of(alphabet: &[Letter], crc: u32) -> Option<&Letter> {
    alphabet.iter().find(|l| l.crc == crc)
}

/// One frame as read back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stored {
    pub kind: u16,
    pub meta: Vec<u8>,
    pub blob: Vec<u8>,
    pub crc: u32,
}

impl Stored {
    /// Whether this frame is `letter`, byte for byte.
    pub fn is(&self, letter: &Letter) -> bool {
        self.kind == KIND && self.meta == letter.meta && self.blob == letter.blob
    }
}

/// Every frame of a stopped box's log (opened as its daemon would open
/// it), and its history id.
pub fn frames(dir: &Path, segment: u64) -> Result<([u8; 16], BTreeMap<u64, Stored>)> {
    let log = Log::open_with(dir, segment).ctx(|| format!("open the log {}", dir.display()))?;
    let mut out = BTreeMap::new();
    for seq in log.first_seq()..=log.head_seq() {
        let e = log
            .read(seq)
            .ctx(|| format!("{}: read frame {seq}", dir.display()))?;
        out.insert(
            seq,
            Stored {
                kind: e.kind,
                meta: e.meta,
                blob: e.blob,
                crc: e.payload_crc,
            },
        );
    }
    Ok((log.history().0, out))
}

/// The alphabet's crcs are pairwise distinct, or the drill could not tell
/// its frames apart by crc.
pub fn check_alphabet(alphabet: &[Letter]) -> Result<()> {
    for (i, a) in alphabet.iter().enumerate() {
        if alphabet[..i].iter().any(|b| b.crc == a.crc) {
            return Err(DrillError(format!(
                "two letters of the alphabet share crc {:08x}",
                a.crc
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_alphabet_is_eight_distinct_letters() {
        let a = alphabet();
        assert_eq!(a.len(), 8);
        check_alphabet(&a).expect("distinct crcs");
        assert!(letter_of(&a, a[3].crc).is_some_and(|l| *l == a[3]));
    }
}
