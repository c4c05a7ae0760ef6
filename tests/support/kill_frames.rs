//! The frames of the kill test (`tests/log_kill.rs`), shared with the
//! writer process it kills (`twinlog-test-child log-writer`): every
//! frame's meta is its name (`r{round}w{writer}n{count}`), and its kind and
//! blob follow from the name, so the parent can check any frame in the
//! log, acknowledged or not.

#![allow(dead_code)] // the test and the writer each use their part

/// Small segments, so that rolls happen while the writer is killed.
pub const SEGMENT: u64 = 64 << 10;
/// Writer 0 streams large blobs through `begin`; the others append small ones.
pub const WRITERS: u64 = 4;
/// The piece a streamed blob is written in.
pub const CHUNK: usize = 16 << 10;

/// Deterministic bytes: a xorshift stream seeded by `seed`.
pub fn bytes(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 32) as u8
        })
        .collect()
}

/// FNV-1a: a frame name's seed.
fn hash(name: &str) -> u64 {
    name.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// The kind and blob of the frame called `name`. Writer 0's frames are large
/// (up to twice a segment, so some get a segment sized for them), the
/// others' small, some empty.
pub fn content(name: &str) -> (u16, Vec<u8>) {
    let h = hash(name);
    let len = if name.contains("w0n") {
        16_000 + (h % 120_000) as usize
    } else {
        (h % 2_500) as usize
    };
    (0x8000 + (h % 7) as u16, bytes(h, len))
}
