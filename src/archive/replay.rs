//! Writing an archived segment's frames into a log, at their own
//! sequence numbers, from its plaintext in pieces of any size: each frame
//! streams in (`begin` at its sequence, its blob in pieces, the primary's
//! crc checked at commit), so no frame is ever held whole. Frames past
//! `until` are not written: a restore stops at a frame boundary.

use super::Error;
use crate::log::format::{FrameHeader, FRAME_HEADER_LEN, SEGMENT_HEADER_LEN};
use crate::log::{Kind, Log, Pending};

enum State<'a> {
    SegmentHeader {
        left: usize,
    },
    Header,
    Meta {
        header: FrameHeader,
    },
    Blob {
        pending: Pending<'a>,
        left: u64,
    },
    Erased {
        header: FrameHeader,
        left: u64,
    },
    /// A frame the log holds already (a resumed restore).
    Held {
        left: u64,
    },
    Done,
}

/// One segment being replayed into `log`.
pub struct Replay<'a> {
    log: &'a Log,
    /// Frames up to this are in the log already: parsed, not written.
    held: u64,
    until: u64,
    state: State<'a>,
    buf: Vec<u8>,
    written: u64,
}

impl<'a> Replay<'a> {
    pub fn new(log: &'a Log, until: u64) -> Replay<'a> {
        Replay {
            log,
            held: log.head_seq(),
            until,
            state: State::SegmentHeader {
                left: SEGMENT_HEADER_LEN,
            },
            buf: Vec::new(),
            written: 0,
        }
    }

    /// Frames written so far.
    pub fn written(&self) -> u64 {
        self.written
    }

    /// True once a frame past `until` was reached: nothing more is written.
    pub fn reached_until(&self) -> bool {
        matches!(self.state, State::Done)
    }

    /// Take the next piece of the segment's plaintext. The segment must
    /// already have been checked, or be checked beside this (`FrameWalk`):
    /// this only parses.
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
                        let mut b = [0u8; FRAME_HEADER_LEN];
                        b.copy_from_slice(&self.buf);
                        self.buf.clear();
                        let header = FrameHeader::decode(&b)
                            .map_err(|e| Error::Corrupt(format!("frame header: {e:?}")))?;
                        if header.seq > self.until {
                            self.state = State::Done;
                            return Ok(());
                        }
                        if header.seq <= self.held {
                            self.state = State::Held {
                                left: u64::from(header.meta_len) + header.blob_len,
                            };
                            continue;
                        }
                        self.state = State::Meta { header };
                        self.after_meta_bytes()?;
                    }
                }
                State::Held { left } => {
                    let take = (*left).min(piece.len() as u64) as usize;
                    *left -= take as u64;
                    piece = &piece[take..];
                    if *left == 0 {
                        self.state = State::Header;
                    }
                }
                State::Meta { header } => {
                    let want = header.meta_len as usize;
                    let take = (want - self.buf.len()).min(piece.len());
                    self.buf.extend_from_slice(&piece[..take]);
                    piece = &piece[take..];
                    self.after_meta_bytes()?;
                }
                State::Blob { pending, left } => {
                    let take = (*left).min(piece.len() as u64) as usize;
                    pending.write(&piece[..take])?;
                    *left -= take as u64;
                    piece = &piece[take..];
                    if *left == 0 {
                        self.commit()?;
                    }
                }
                State::Erased { header, left } => {
                    let take = (*left).min(piece.len() as u64) as usize;
                    *left -= take as u64;
                    piece = &piece[take..];
                    if *left == 0 {
                        let h = *header;
                        self.log
                            .stage_erased_at(h.seq, &self.buf, h.blob_len, h.payload_crc)?;
                        self.buf.clear();
                        self.written += 1;
                        self.state = State::Header;
                    }
                }
            }
        }
        Ok(())
    }

    /// Once the meta is whole, start the frame's blob.
    fn after_meta_bytes(&mut self) -> Result<(), Error> {
        let State::Meta { header } = &self.state else {
            return Ok(());
        };
        if self.buf.len() < header.meta_len as usize {
            return Ok(());
        }
        let h = *header;
        if h.kind == Kind::Redacted.as_u16() {
            self.state = State::Erased {
                header: h,
                left: h.blob_len,
            };
            if h.blob_len == 0 {
                self.log
                    .stage_erased_at(h.seq, &self.buf, 0, h.payload_crc)?;
                self.buf.clear();
                self.written += 1;
                self.state = State::Header;
            }
            return Ok(());
        }
        let mut pending = self.log.begin(Some(h.seq), h.kind, &self.buf, h.blob_len)?;
        pending.expect_payload_crc(h.payload_crc);
        self.buf.clear();
        self.state = State::Blob {
            pending,
            left: h.blob_len,
        };
        if h.blob_len == 0 {
            self.commit()?;
        }
        Ok(())
    }

    fn commit(&mut self) -> Result<(), Error> {
        if let State::Blob { pending, .. } = std::mem::replace(&mut self.state, State::Header) {
            pending.commit_unsynced()?;
            self.written += 1;
        }
        Ok(())
    }

    /// The segment ended: it must end between frames.
    pub fn finish(&self) -> Result<(), Error> {
        match self.state {
            State::Header if self.buf.is_empty() => Ok(()),
            State::Held { left: 0 } => Ok(()),
            State::Done => Ok(()),
            _ => Err(Error::Corrupt("the segment ends inside a frame".into())),
        }
    }
}
