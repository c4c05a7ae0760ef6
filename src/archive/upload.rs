//! Archiving one sealed segment: read it once to check every frame
//! against its crcs and learn its name, then again to cut it into pieces,
//! each compressed and sealed, uploaded at a paced rate. A segment whose
//! bytes changed between the two reads (an erase rewrote it) is not
//! uploaded: the next pass takes its new bytes.

use std::io::Read;
use std::path::Path;
use std::time::{Duration, Instant};

use bytes::Bytes;

use super::bucket::{Bucket, ObjectUpload};
use super::codec::Codec;
use super::names::{epochs_through, lineage, SegmentName};
use super::object::{Content, ObjectWriter, SegmentInfo, TimeMark, PIECE_LEN};
use super::walk::FrameWalk;
use super::Error;
use crate::repl::epochs::EpochStart;

/// Paces uploads to a rate: each write waits until the bytes before it
/// would have gone out at that rate.
#[derive(Debug)]
pub struct Pace {
    bytes_per_s: u64,
    next_free: Option<Instant>,
}

impl Pace {
    /// 0: no pacing.
    pub fn new(bytes_per_s: u64) -> Pace {
        Pace {
            bytes_per_s,
            next_free: None,
        }
    }

    pub async fn take(&mut self, n: usize) {
        if self.bytes_per_s == 0 {
            return;
        }
        let now = crate::clock::monotonic();
        let start = self.next_free.map_or(now, |t| t.max(now));
        if start > now {
            tokio::time::sleep(start - now).await;
        }
        let cost = Duration::from_secs_f64(n as f64 / self.bytes_per_s as f64);
        self.next_free = Some(start + cost);
    }
}

/// What the first read of a segment found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Checked {
    pub last: u64,
    pub len: u64,
    pub crc: u32,
}

/// Read a sealed segment whole, checking every frame; learn its last
/// sequence and its crc.
pub fn check_segment(path: &Path, first: u64, history: [u8; 16]) -> Result<Checked, Error> {
    let mut f =
        std::fs::File::open(path).map_err(|e| Error::Io(format!("{}: {e}", path.display())))?;
    let mut walk = FrameWalk::new(first, history);
    let mut crc = crc32fast::Hasher::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f
            .read(&mut buf)
            .map_err(|e| Error::Io(format!("{}: {e}", path.display())))?;
        if n == 0 {
            break;
        }
        walk.feed(&buf[..n])?;
        crc.update(&buf[..n]);
    }
    let last = walk.finish()?;
    Ok(Checked {
        last,
        len: walk.pos(),
        crc: crc.finalize(),
    })
}

/// The name a checked segment is archived under.
pub fn segment_name(
    codec: &Codec,
    first: u64,
    checked: &Checked,
    history: &[u8; 16],
    epochs: &[EpochStart],
    generation: u64,
) -> SegmentName {
    let sum = match &codec.key {
        Some(k) => {
            let mut parts = Vec::with_capacity(20);
            parts.extend_from_slice(&checked.crc.to_le_bytes());
            parts.extend_from_slice(&first.to_le_bytes());
            parts.extend_from_slice(&checked.last.to_le_bytes());
            k.name_sum(&parts)
        }
        None => checked.crc,
    };
    SegmentName {
        first,
        last: checked.last,
        lineage: lineage(history, epochs, checked.last),
        generation,
        sum,
    }
}

/// What one upload sent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sent {
    pub name: SegmentName,
    pub plain_bytes: u64,
    pub stored_bytes: u64,
    /// The entity tag the bucket gave the object.
    pub e_tag: Option<String>,
}

/// A segment to archive.
pub struct SegmentJob<'a> {
    pub path: &'a Path,
    pub first: u64,
    pub history: [u8; 16],
    pub epochs: &'a [EpochStart],
    pub generation: u64,
    pub marks: Vec<TimeMark>,
}

/// Archive one sealed segment.
pub async fn upload_segment(
    bucket: &Bucket,
    codec: &Codec,
    job: SegmentJob<'_>,
    pace: &mut Pace,
) -> Result<Sent, Error> {
    let checked = check_segment(job.path, job.first, job.history)?;
    let name = segment_name(
        codec,
        job.first,
        &checked,
        &job.history,
        job.epochs,
        job.generation,
    );
    let key = bucket.segment_key(&name);
    let mut up = bucket.writer(&key);
    match send_pieces(&mut up, codec, &job, &checked, pace, &key).await {
        Ok((tail, stored)) => {
            up.write(Bytes::from(tail)).await?;
            let e_tag = up.finish().await?;
            Ok(Sent {
                name,
                plain_bytes: checked.len,
                stored_bytes: stored,
                e_tag,
            })
        }
        Err(e) => {
            up.abort().await;
            Err(e)
        }
    }
}

async fn send_pieces(
    up: &mut ObjectUpload,
    codec: &Codec,
    job: &SegmentJob<'_>,
    checked: &Checked,
    pace: &mut Pace,
    key: &str,
) -> Result<(Vec<u8>, u64), Error> {
    let mut f = std::fs::File::open(job.path)
        .map_err(|e| Error::Io(format!("{}: {e}", job.path.display())))?;
    let mut w = ObjectWriter::new(codec, PIECE_LEN, key)?;
    let mut walk = FrameWalk::new(job.first, job.history);
    let mut crc = crc32fast::Hasher::new();
    let mut buf = vec![0u8; PIECE_LEN as usize];
    loop {
        let n = read_full(&mut f, &mut buf)
            .map_err(|e| Error::Io(format!("{}: {e}", job.path.display())))?;
        if n == 0 {
            break;
        }
        let piece = &buf[..n];
        crc.update(piece);
        let first_frame = walk.feed(piece)?;
        let stored = w.piece(piece, first_frame)?;
        pace.take(stored.len()).await;
        up.write(Bytes::from(stored)).await?;
    }
    let last = walk.finish()?;
    if last != checked.last || walk.pos() != checked.len || crc.finalize() != checked.crc {
        return Err(Error::Changed);
    }
    if walk.unfinished_erase() {
        // Bytes an erase has not yet scrubbed never leave the box; the
        // erase finishes (the store repeats it after a crash) and the
        // next pass archives what it left.
        return Err(Error::EraseUnderway);
    }
    let stored = w.stored_len();
    let content = Content::Segment(SegmentInfo {
        history: job.history,
        first: job.first,
        last,
        epochs: epochs_through(job.epochs, last),
        generation: job.generation,
        marks: job.marks.clone(),
        repos: walk.repos(),
    });
    let (tail, _) = w.finish(content)?;
    let total = stored + tail.len() as u64;
    Ok((tail, total))
}

/// Fill `buf` unless the file ends first.
pub fn read_full(f: &mut impl Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match f.read(&mut buf[n..])? {
            0 => break,
            k => n += k,
        }
    }
    Ok(n)
}
