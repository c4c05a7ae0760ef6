//! The bytes on disk: file names, the segment and index headers, the frame
//! header. `docs/FORMAT.md` documents every offset here, and a test holds the
//! two together. All integers are little-endian.

use std::path::{Path, PathBuf};

/// Segment file magic: non-ASCII first byte, then CR LF, SUB and LF, so a
/// transfer that rewrites line endings or strips the high bit shows.
pub const SEGMENT_MAGIC: [u8; 8] = *b"\x89TWL\r\n\x1a\n";
/// Index file magic, built the same way.
pub const INDEX_MAGIC: [u8; 8] = *b"\x89TWI\r\n\x1a\n";
/// History file magic.
pub const HISTORY_MAGIC: [u8; 8] = *b"\x89TWH\r\n\x1a\n";
/// Restart intent file magic.
pub const RESTART_MAGIC: [u8; 8] = *b"\x89TWR\r\n\x1a\n";
/// Truncate intent file magic.
pub const TRUNCATE_MAGIC: [u8; 8] = *b"\x89TWT\r\n\x1a\n";
/// The one format version this code writes and reads.
pub const FORMAT_VERSION: u32 = 1;

// Segment header: 64 bytes.
pub const SEG_MAGIC_OFFSET: usize = 0;
pub const SEG_VERSION_OFFSET: usize = SEG_MAGIC_OFFSET + 8;
pub const SEG_FLAGS_OFFSET: usize = SEG_VERSION_OFFSET + 4;
pub const SEG_FIRST_SEQ_OFFSET: usize = SEG_FLAGS_OFFSET + 4;
pub const SEG_HISTORY_OFFSET: usize = SEG_FIRST_SEQ_OFFSET + 8;
pub const SEG_CAPACITY_OFFSET: usize = SEG_HISTORY_OFFSET + 16;
pub const SEG_RESERVED_OFFSET: usize = SEG_CAPACITY_OFFSET + 8;
pub const SEG_CRC_OFFSET: usize = 60;
pub const SEGMENT_HEADER_LEN: usize = 64;

// Index header: 16 bytes, then one u64 frame offset per frame.
pub const IDX_MAGIC_OFFSET: usize = 0;
pub const IDX_FIRST_SEQ_OFFSET: usize = IDX_MAGIC_OFFSET + 8;
pub const INDEX_HEADER_LEN: usize = 16;
pub const INDEX_ENTRY_LEN: usize = 8;

// Frame header: 32 bytes, then meta, then blob.
pub const FRAME_SEQ_OFFSET: usize = 0;
pub const FRAME_KIND_OFFSET: usize = FRAME_SEQ_OFFSET + 8;
pub const FRAME_FLAGS_OFFSET: usize = FRAME_KIND_OFFSET + 2;
pub const FRAME_META_LEN_OFFSET: usize = FRAME_FLAGS_OFFSET + 2;
pub const FRAME_BLOB_LEN_OFFSET: usize = FRAME_META_LEN_OFFSET + 4;
pub const FRAME_PAYLOAD_CRC_OFFSET: usize = FRAME_BLOB_LEN_OFFSET + 8;
pub const FRAME_HEADER_CRC_OFFSET: usize = FRAME_PAYLOAD_CRC_OFFSET + 4;
pub const FRAME_HEADER_LEN: usize = FRAME_HEADER_CRC_OFFSET + 4;

// History file: magic, 16-byte id, crc of both.
pub const HISTORY_ID_OFFSET: usize = 8;
pub const HISTORY_CRC_OFFSET: usize = 24;
pub const HISTORY_FILE_LEN: usize = 28;

// Restart intent file: magic, the first sequence to start at, crc.
pub const RESTART_NEXT_OFFSET: usize = 8;
pub const RESTART_CRC_OFFSET: usize = 16;
pub const RESTART_FILE_LEN: usize = 20;

// Truncate intent file: magic, the head to keep, the first sequence of the
// segment that keeps it, where its kept frames end, crc.
pub const TRUNCATE_HEAD_OFFSET: usize = 8;
pub const TRUNCATE_SEGMENT_OFFSET: usize = TRUNCATE_HEAD_OFFSET + 8;
pub const TRUNCATE_END_OFFSET: usize = TRUNCATE_SEGMENT_OFFSET + 8;
pub const TRUNCATE_CRC_OFFSET: usize = TRUNCATE_END_OFFSET + 8;
pub const TRUNCATE_FILE_LEN: usize = TRUNCATE_CRC_OFFSET + 4;

/// The largest meta a frame may carry. Meta is read whole on every lookup.
pub const MAX_META_LEN: usize = 1 << 20;

/// Name of the lock file that keeps a second writer out.
pub const LOCK_FILE: &str = "LOCK";
/// Name of the history file.
pub const HISTORY_FILE: &str = "HISTORY";
/// Name of the restart intent file (`reset`, `restart_after`).
pub const RESTART_FILE: &str = "RESTART";
/// Name of the truncate intent file (`truncate_after`).
pub const TRUNCATE_FILE: &str = "TRUNCATE";

const SEQ_DIGITS: usize = 20;

/// Why a header did not decode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HeaderError {
    /// The crc over the header bytes does not match.
    Crc,
    /// A field holds a value no writer produces.
    Field(&'static str),
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(a)
}

pub(crate) fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

/// A frame's fixed header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameHeader {
    pub seq: u64,
    pub kind: u16,
    pub meta_len: u32,
    pub blob_len: u64,
    /// crc32 over meta then blob, written once at the first append.
    pub payload_crc: u32,
}

impl FrameHeader {
    /// Bytes from the frame's start to the end of its blob.
    pub fn frame_len(&self) -> u64 {
        FRAME_HEADER_LEN as u64 + u64::from(self.meta_len) + self.blob_len
    }

    pub fn encode(&self) -> [u8; FRAME_HEADER_LEN] {
        let mut b = [0u8; FRAME_HEADER_LEN];
        b[FRAME_SEQ_OFFSET..][..8].copy_from_slice(&self.seq.to_le_bytes());
        b[FRAME_KIND_OFFSET..][..2].copy_from_slice(&self.kind.to_le_bytes());
        b[FRAME_META_LEN_OFFSET..][..4].copy_from_slice(&self.meta_len.to_le_bytes());
        b[FRAME_BLOB_LEN_OFFSET..][..8].copy_from_slice(&self.blob_len.to_le_bytes());
        b[FRAME_PAYLOAD_CRC_OFFSET..][..4].copy_from_slice(&self.payload_crc.to_le_bytes());
        let crc = crc32fast::hash(&b[..FRAME_HEADER_CRC_OFFSET]);
        b[FRAME_HEADER_CRC_OFFSET..][..4].copy_from_slice(&crc.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8; FRAME_HEADER_LEN]) -> Result<Self, HeaderError> {
        if crc32fast::hash(&b[..FRAME_HEADER_CRC_OFFSET]) != u32_at(b, FRAME_HEADER_CRC_OFFSET) {
            return Err(HeaderError::Crc);
        }
        if u16_at(b, FRAME_FLAGS_OFFSET) != 0 {
            return Err(HeaderError::Field("flags"));
        }
        let header = FrameHeader {
            seq: u64_at(b, FRAME_SEQ_OFFSET),
            kind: u16_at(b, FRAME_KIND_OFFSET),
            meta_len: u32_at(b, FRAME_META_LEN_OFFSET),
            blob_len: u64_at(b, FRAME_BLOB_LEN_OFFSET),
            payload_crc: u32_at(b, FRAME_PAYLOAD_CRC_OFFSET),
        };
        if header.seq == 0 {
            return Err(HeaderError::Field("seq"));
        }
        if header.kind == 0 {
            return Err(HeaderError::Field("kind"));
        }
        if header.meta_len as usize > MAX_META_LEN {
            return Err(HeaderError::Field("meta_len"));
        }
        if header.blob_len > i64::MAX as u64 {
            return Err(HeaderError::Field("blob_len"));
        }
        Ok(header)
    }
}

impl FrameHeader {
    /// The header as readers see it. An erased frame keeps only what
    /// replication needs: its seq, its kind and its length. It has no meta
    /// (the bytes that were meta and blob are one blob of zeros) and its
    /// crc is over those zeros, so nothing of what was erased, not even a
    /// checksum to brute-force, is served. An erase cut by a crash before
    /// its last step leaves the old lengths and crc in the header; they are
    /// shown the same way, and the next erase finishes the rewrite.
    pub fn as_read(self) -> FrameHeader {
        if self.kind != super::Kind::Redacted.as_u16() || self.meta_len == 0 {
            return self;
        }
        let blob_len = u64::from(self.meta_len) + self.blob_len;
        FrameHeader {
            meta_len: 0,
            blob_len,
            payload_crc: crc_of_zeros(blob_len),
            ..self
        }
    }
}

/// The crc32 of `len` zero bytes, in O(log len): the payload crc of an
/// erased frame of that length.
pub fn crc_of_zeros(len: u64) -> u32 {
    let mut acc = crc32fast::Hasher::new();
    let mut power = crc32fast::Hasher::new();
    power.update(&[0]);
    let mut n = len;
    while n > 0 {
        if n & 1 == 1 {
            acc.combine(&power);
        }
        n >>= 1;
        if n > 0 {
            let same = power.clone();
            power.combine(&same);
        }
    }
    acc.finalize()
}

/// The payload crc: over meta, then blob.
pub fn payload_crc(meta: &[u8], blob: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(meta);
    h.update(blob);
    h.finalize()
}

/// A segment file's header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SegmentHeader {
    pub first_seq: u64,
    pub history: [u8; 16],
    /// The length the segment was preallocated to when it was created.
    pub capacity: u64,
}

impl SegmentHeader {
    pub fn encode(&self) -> [u8; SEGMENT_HEADER_LEN] {
        let mut b = [0u8; SEGMENT_HEADER_LEN];
        b[SEG_MAGIC_OFFSET..][..8].copy_from_slice(&SEGMENT_MAGIC);
        b[SEG_VERSION_OFFSET..][..4].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
        b[SEG_FIRST_SEQ_OFFSET..][..8].copy_from_slice(&self.first_seq.to_le_bytes());
        b[SEG_HISTORY_OFFSET..][..16].copy_from_slice(&self.history);
        b[SEG_CAPACITY_OFFSET..][..8].copy_from_slice(&self.capacity.to_le_bytes());
        let crc = crc32fast::hash(&b[..SEG_CRC_OFFSET]);
        b[SEG_CRC_OFFSET..][..4].copy_from_slice(&crc.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8; SEGMENT_HEADER_LEN]) -> Result<Self, HeaderError> {
        if b[..8] != SEGMENT_MAGIC {
            return Err(HeaderError::Field("magic"));
        }
        if crc32fast::hash(&b[..SEG_CRC_OFFSET]) != u32_at(b, SEG_CRC_OFFSET) {
            return Err(HeaderError::Crc);
        }
        if u32_at(b, SEG_VERSION_OFFSET) != FORMAT_VERSION {
            return Err(HeaderError::Field("version"));
        }
        if u32_at(b, SEG_FLAGS_OFFSET) != 0 {
            return Err(HeaderError::Field("flags"));
        }
        let mut history = [0u8; 16];
        history.copy_from_slice(&b[SEG_HISTORY_OFFSET..SEG_HISTORY_OFFSET + 16]);
        Ok(SegmentHeader {
            first_seq: u64_at(b, SEG_FIRST_SEQ_OFFSET),
            history,
            capacity: u64_at(b, SEG_CAPACITY_OFFSET),
        })
    }
}

pub fn encode_index_header(first_seq: u64) -> [u8; INDEX_HEADER_LEN] {
    let mut b = [0u8; INDEX_HEADER_LEN];
    b[IDX_MAGIC_OFFSET..][..8].copy_from_slice(&INDEX_MAGIC);
    b[IDX_FIRST_SEQ_OFFSET..][..8].copy_from_slice(&first_seq.to_le_bytes());
    b
}

/// The first sequence an index header names, when the header is whole.
pub fn decode_index_header(b: &[u8; INDEX_HEADER_LEN]) -> Option<u64> {
    (b[..8] == INDEX_MAGIC).then(|| u64_at(b, IDX_FIRST_SEQ_OFFSET))
}

/// A small file of magic, a body, and a crc over both.
pub fn encode_sealed(magic: &[u8; 8], body: &[u8]) -> Vec<u8> {
    let mut b = Vec::with_capacity(12 + body.len());
    b.extend_from_slice(magic);
    b.extend_from_slice(body);
    let crc = crc32fast::hash(&b);
    b.extend_from_slice(&crc.to_le_bytes());
    b
}

/// The body of a file written by [`encode_sealed`], when it is whole.
pub fn decode_sealed<'a>(magic: &[u8; 8], b: &'a [u8], body_len: usize) -> Option<&'a [u8]> {
    if b.len() != 12 + body_len || b[..8] != *magic {
        return None;
    }
    let crc = u32_at(b, 8 + body_len);
    (crc32fast::hash(&b[..8 + body_len]) == crc).then(|| &b[8..8 + body_len])
}

/// `00000000000000000042.log` for the segment whose first sequence is 42.
pub fn segment_name(first_seq: u64) -> String {
    numbered(first_seq, ".log")
}

/// The index file beside a segment.
pub fn index_name(first_seq: u64) -> String {
    numbered(first_seq, ".idx")
}

/// `n`, zero-padded, then `suffix`, in one allocation: `format!` grows
/// its string a few times on the way to twenty digits, and a reader names
/// a segment for every frame it opens.
fn numbered(n: u64, suffix: &str) -> String {
    use std::fmt::Write;
    let mut s = String::with_capacity(SEQ_DIGITS + suffix.len());
    // Writing to a String cannot fail.
    let _ = write!(s, "{n:0SEQ_DIGITS$}{suffix}");
    s
}

/// The first sequence a segment file name says, or None for any other name.
pub fn parse_segment_name(name: &str) -> Option<u64> {
    parse_numbered(name.strip_suffix(".log")?)
}

/// The first sequence an index file name says, or None for any other name.
pub fn parse_index_name(name: &str) -> Option<u64> {
    parse_numbered(name.strip_suffix(".idx")?)
}

fn parse_numbered(digits: &str) -> Option<u64> {
    if digits.len() != SEQ_DIGITS || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

pub fn segment_path(dir: &Path, first_seq: u64) -> PathBuf {
    dir.join(segment_name(first_seq))
}

pub fn index_path(dir: &Path, first_seq: u64) -> PathBuf {
    dir.join(index_name(first_seq))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_back_and_sort_as_numbers() {
        for seq in [1u64, 9, 10, 42, u64::MAX] {
            assert_eq!(parse_segment_name(&segment_name(seq)), Some(seq));
        }
        assert!(segment_name(9) < segment_name(10));
        assert_eq!(parse_segment_name("42.log"), None);
        assert_eq!(parse_segment_name("0000000000000000004x.log"), None);
        assert_eq!(parse_segment_name(&index_name(42)), None);
        assert_eq!(parse_index_name(&index_name(42)), Some(42));
        assert_eq!(parse_index_name(&segment_name(42)), None);
        assert_eq!(parse_index_name("42.idx"), None);
    }

    #[test]
    fn frame_header_round_trips_and_any_flip_is_caught() {
        let h = FrameHeader {
            seq: 7,
            kind: 3,
            meta_len: 12,
            blob_len: 1 << 33,
            payload_crc: 0xdead_beef,
        };
        let b = h.encode();
        assert_eq!(FrameHeader::decode(&b), Ok(h));
        for i in 0..FRAME_HEADER_LEN {
            for bit in 0..8 {
                let mut d = b;
                d[i] ^= 1 << bit;
                assert!(FrameHeader::decode(&d).is_err(), "flip at {i}.{bit}");
            }
        }
        assert!(FrameHeader::decode(&[0u8; FRAME_HEADER_LEN]).is_err());
    }

    #[test]
    fn segment_header_round_trips() {
        let h = SegmentHeader {
            first_seq: 99,
            history: [5; 16],
            capacity: 1 << 26,
        };
        assert_eq!(SegmentHeader::decode(&h.encode()), Ok(h));
    }
}
