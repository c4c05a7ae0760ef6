//! A resumed restore believes nothing its box holds: every frame the log
//! kept is compared with the archive's copy, byte for byte (header, meta
//! and blob; an erased frame's header and meta), before the restore goes
//! on. Whatever wrote those frames (an earlier run, a daemon that served
//! the box half restored, a disk) is not the archive. The first frame
//! that differs, or that the log cannot read back whole, is where the
//! caller cuts and fetches again.
//!
//! Sans-IO: the archived segment's plaintext comes in pieces of any size,
//! as `Replay` takes it; the box's frames are read a piece at a time, so
//! no frame is held whole.

use std::sync::Arc;

use super::bucket::Bucket;
use super::codec::ArchiveKey;
use super::names::SegmentName;
use super::restore::{fetch_all, Feed, PIECES_QUEUED};
use super::walk::FrameWalk;
use super::Error;
use crate::log::format::{FrameHeader, FRAME_HEADER_LEN, SEGMENT_HEADER_LEN};
use crate::log::{BlobReader, Kind, Log};

/// A held frame that is not the archive's.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Differs {
    pub seq: u64,
    pub what: String,
}

enum State {
    SegmentHeader {
        left: usize,
    },
    Header,
    /// Bytes of a frame not compared: below the frames held.
    Skip {
        left: u64,
    },
    Meta {
        header: FrameHeader,
        local: BlobReader,
    },
    Blob {
        local: BlobReader,
        left: u64,
    },
    /// Past the frames held, or a difference found.
    Done,
}

/// One archived segment compared with the frames `from..=to` of `log`.
pub struct HeldCheck<'a> {
    log: &'a Log,
    from: u64,
    to: u64,
    state: State,
    buf: Vec<u8>,
    local: Vec<u8>,
    checked: u64,
    differs: Option<Differs>,
}

impl<'a> HeldCheck<'a> {
    pub fn new(log: &'a Log, from: u64, to: u64) -> HeldCheck<'a> {
        HeldCheck {
            log,
            from,
            to,
            state: State::SegmentHeader {
                left: SEGMENT_HEADER_LEN,
            },
            buf: Vec::new(),
            local: Vec::new(),
            checked: 0,
            differs: None,
        }
    }

    /// Frames found equal so far.
    pub fn checked(&self) -> u64 {
        self.checked
    }

    /// The last frame found equal (`from - 1`: none).
    pub fn through(&self) -> u64 {
        self.from - 1 + self.checked
    }

    /// The first frame that differs, once found.
    pub fn differs(&self) -> Option<&Differs> {
        self.differs.as_ref()
    }

    /// Nothing more to compare: past the frames held, or one differs.
    pub fn done(&self) -> bool {
        matches!(self.state, State::Done)
    }

    fn differ(&mut self, seq: u64, what: String) {
        self.differs = Some(Differs { seq, what });
        self.state = State::Done;
    }

    /// Take the next piece of the archived segment's plaintext, checked
    /// beside this (`FrameWalk`): this only parses and compares.
    pub fn feed(&mut self, mut piece: &[u8]) -> Result<(), Error> {
        while !piece.is_empty() {
            match &mut self.state {
                State::Done => return Ok(()),
                State::SegmentHeader { left } => {
                    let take = (*left).min(piece.len());
                    *left -= take;
                    piece = &piece[take..];
                    if *left == 0 {
                        self.state = State::Header;
                    }
                }
                State::Header => {
                    let take = (FRAME_HEADER_LEN - self.buf.len()).min(piece.len());
                    self.buf.extend_from_slice(&piece[..take]);
                    piece = &piece[take..];
                    if self.buf.len() == FRAME_HEADER_LEN {
                        self.start_frame()?;
                    }
                }
                State::Skip { left } => {
                    let take = (*left).min(piece.len() as u64) as usize;
                    *left -= take as u64;
                    piece = &piece[take..];
                    if *left == 0 {
                        self.state = State::Header;
                    }
                }
                State::Meta { header, .. } => {
                    let want = header.meta_len as usize;
                    let take = (want - self.buf.len()).min(piece.len());
                    self.buf.extend_from_slice(&piece[..take]);
                    piece = &piece[take..];
                    if self.buf.len() == want {
                        self.after_meta();
                    }
                }
                State::Blob { local, left } => {
                    let take = (*left).min(piece.len() as u64) as usize;
                    self.local.resize(take, 0);
                    let read = local.next_piece(&mut self.local[..take]);
                    *left -= take as u64;
                    let (seq, done) = (local.located().seq, *left == 0);
                    let why = match read {
                        Ok((n, _)) if n == take && self.local[..take] == piece[..take] => None,
                        Ok(_) => Some("its blob differs".to_string()),
                        Err(e) => Some(format!("it does not read back: {e}")),
                    };
                    if let Some(why) = why {
                        self.differ(seq, why);
                        return Ok(());
                    }
                    piece = &piece[take..];
                    if done {
                        self.end_frame(seq);
                    }
                }
            }
        }
        Ok(())
    }

    fn start_frame(&mut self) -> Result<(), Error> {
        let mut b = [0u8; FRAME_HEADER_LEN];
        b.copy_from_slice(&self.buf);
        self.buf.clear();
        let h =
            FrameHeader::decode(&b).map_err(|e| Error::Corrupt(format!("frame header: {e:?}")))?;
        if h.seq > self.to {
            self.state = State::Done;
            return Ok(());
        }
        if h.seq < self.from {
            self.state = State::Skip {
                left: u64::from(h.meta_len) + h.blob_len,
            };
            return Ok(());
        }
        if h.seq > self.from + self.checked {
            // A segment starting past the next frame to compare: the
            // archive lacks frames between, which the caller names.
            self.state = State::Done;
            return Ok(());
        }
        let local = match self.log.blob_reader_from(h.seq, 0) {
            Ok(r) => r,
            Err(e) => {
                self.differ(h.seq, format!("it does not read back: {e}"));
                return Ok(());
            }
        };
        let l = local.located().header();
        if l != h {
            self.differ(
                h.seq,
                format!(
                    "its header differs (kind {}, {} + {} bytes, crc {:08x}; the archive's kind {}, {} + {} bytes, crc {:08x})",
                    l.kind, l.meta_len, l.blob_len, l.payload_crc,
                    h.kind, h.meta_len, h.blob_len, h.payload_crc
                ),
            );
            return Ok(());
        }
        self.state = State::Meta { header: h, local };
        if h.meta_len == 0 {
            self.after_meta();
        }
        Ok(())
    }

    /// The archived meta is whole: compare it, then the blob (an erased
    /// frame's blob is zeros on both sides, and the log does not read it).
    fn after_meta(&mut self) {
        let State::Meta { header, local } = std::mem::replace(&mut self.state, State::Done) else {
            return;
        };
        let meta = std::mem::take(&mut self.buf);
        if meta != local.located().meta {
            return self.differ(header.seq, "its meta differs".into());
        }
        if header.kind == Kind::Redacted.as_u16() {
            self.checked += 1;
            self.state = State::Skip {
                left: header.blob_len,
            };
            if header.blob_len == 0 {
                self.state = State::Header;
            }
            return;
        }
        if header.blob_len == 0 {
            // The log checks the payload crc (over the meta) on the last
            // piece, an empty one here.
            let mut local = local;
            if let Err(e) = local.next_piece(&mut []) {
                return self.differ(header.seq, format!("it does not read back: {e}"));
            }
            return self.end_frame(header.seq);
        }
        self.state = State::Blob {
            local,
            left: header.blob_len,
        };
    }

    fn end_frame(&mut self, seq: u64) {
        self.checked += 1;
        self.state = if seq >= self.to {
            State::Done
        } else {
            State::Header
        };
    }
}

/// What comparing the held frames found.
#[derive(Clone, Debug, Default)]
pub struct HeldReport {
    /// Frames found equal, from the first held on.
    pub checked: u64,
    pub differs: Option<Differs>,
}

/// Compare the frames `log` holds with the archived segments covering
/// them (`wanted`, in order), every archived frame's crcs checked as a
/// restore checks them. Stops at the first frame that differs.
pub(super) async fn check_held(
    bucket: &Bucket,
    key: Option<&ArchiveKey>,
    history: [u8; 16],
    log: Arc<Log>,
    wanted: &[(SegmentName, u64)],
) -> Result<HeldReport, Error> {
    let (from, to) = (log.first_seq(), log.head_seq());
    let (tx, mut rx) = tokio::sync::mpsc::channel(PIECES_QUEUED);
    let checker = tokio::task::spawn_blocking(move || -> Result<(u64, Option<Differs>), Error> {
        // The last frame found equal: segments that overlap compare each
        // frame once.
        let mut through = from - 1;
        let mut current: Option<(String, FrameWalk, HeldCheck<'_>)> = None;
        while let Some(feed) = rx.blocking_recv() {
            match feed {
                Feed::Segment(name, key) => {
                    let walk = FrameWalk::new(name.first, history);
                    current = Some((key, walk, HeldCheck::new(&log, through + 1, to)));
                }
                Feed::Piece(plain) => {
                    let Some((key, walk, check)) = current.as_mut() else {
                        return Err(Error::Io("a piece before its segment".into()));
                    };
                    walk.feed(&plain).map_err(|e| e.in_object(key))?;
                    check.feed(&plain).map_err(|e| e.in_object(key))?;
                    if let Some(d) = check.differs() {
                        return Ok((check.through(), Some(d.clone())));
                    }
                }
                Feed::End => {
                    if let Some((key, walk, check)) = current.take() {
                        walk.finish().map_err(|e| e.in_object(&key))?;
                        through = through.max(check.through());
                    }
                }
            }
        }
        Ok((through, None))
    });
    let fetched = fetch_all(bucket, key, wanted, tx).await;
    let (through, differs) = checker
        .await
        .map_err(|e| Error::Io(format!("the check of the held frames failed: {e}")))??;
    // Dropped by the checker once it found a difference: the fetches
    // stopped there.
    fetched?;
    if differs.is_none() && through != to {
        return Err(Error::Missing(format!(
            "this box holds frames {from} to {to}; the archive's segments hold them only up to {through}"
        )));
    }
    Ok(HeldReport {
        checked: through + 1 - from,
        differs,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::log::{format, Meta};

    fn segment_bytes(log: &Log) -> Vec<u8> {
        let first = log.layout()[0].0;
        std::fs::read(format::segment_path(log.dir(), first)).unwrap()
    }

    fn check(log: &Log, archived: &[u8], piece: usize) -> (u64, Option<Differs>) {
        let mut c = HeldCheck::new(log, log.first_seq(), log.head_seq());
        for p in archived.chunks(piece) {
            c.feed(p).unwrap();
        }
        (c.checked(), c.differs().cloned())
    }

    fn log_of(dir: &std::path::Path, blobs: &[Vec<u8>]) -> Log {
        let log = Log::open_with(dir, 1 << 20).unwrap();
        for b in blobs {
            log.append(Kind::App(0x8000), &Meta::repo("r"), b).unwrap();
        }
        log.sync().unwrap();
        log
    }

    #[test]
    fn equal_frames_pass_in_pieces_of_any_size_and_the_first_difference_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let blobs: Vec<Vec<u8>> = (0..20u8).map(|i| vec![i; 100 * usize::from(i)]).collect();
        let archive = log_of(&dir.path().join("a"), &blobs);
        let archived = segment_bytes(&archive);
        // The box holds the first 12 frames, the same.
        let held = log_of(&dir.path().join("b"), &blobs[..12]);
        for piece in [1, 7, 64, 4096, archived.len()] {
            assert_eq!(check(&held, &archived, piece), (12, None), "{piece}");
        }
        // Frame 9 written otherwise: its crc differs, in its header.
        let mut other = blobs[..12].to_vec();
        other[8][50] ^= 1;
        let differs = log_of(&dir.path().join("c"), &other);
        for piece in [1, 33, archived.len()] {
            let (checked, d) = check(&differs, &archived, piece);
            assert_eq!(checked, 8, "{piece}");
            let d = d.expect("a difference");
            assert!(d.seq == 9 && d.what.contains("header"), "{d:?}");
        }
        // The same header over a blob the disk changed: its bytes differ.
        drop(differs);
        let flipped = log_of(&dir.path().join("e"), &blobs[..12]);
        let at = flipped.locate_blob(9).unwrap().blob_offset + 50;
        let path = format::segment_path(flipped.dir(), 1);
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[at as usize] ^= 1;
        std::fs::write(&path, bytes).unwrap();
        for piece in [1, 33, archived.len()] {
            // In pieces, the bytes differ before the blob ends; whole, the
            // log's own crc check refuses it first.
            let d = check(&flipped, &archived, piece).1.expect("a difference");
            assert_eq!(d.seq, 9, "{piece}");
            let why = if piece < 100 {
                "its blob differs"
            } else {
                "payload crc of 9"
            };
            assert!(d.what.contains(why), "{piece}: {d:?}");
        }
        // Another length is a header that differs.
        let mut longer = blobs[..12].to_vec();
        longer[3].push(0);
        let d = check(&log_of(&dir.path().join("d"), &longer), &archived, 999).1;
        assert!(d.is_some_and(|d| d.seq == 4 && d.what.contains("header")));
    }
}
