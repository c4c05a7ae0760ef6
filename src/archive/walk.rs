//! Walking a sealed segment's bytes in pieces of any size: its header, then
//! every frame's header and payload checked against their crcs, sequences
//! contiguous from the segment's first. The archive checks a segment this
//! way as it uploads it (what leaves the box is what the primary wrote)
//! and again as a restore downloads it.

use super::object::FrameStart;
use super::Error;
use crate::log::format::{self, FrameHeader, SegmentHeader, FRAME_HEADER_LEN, SEGMENT_HEADER_LEN};
use crate::log::{Kind, Meta};

enum State {
    SegmentHeader,
    FrameHeader,
    Payload {
        header: FrameHeader,
        left: u64,
        crc: crc32fast::Hasher,
        /// The meta read so far, of a frame that carries a repository's
        /// data: it names the repository.
        meta: Option<Vec<u8>>,
    },
}

/// A segment walked so far.
pub struct FrameWalk {
    first_seq: u64,
    history: [u8; 16],
    next_seq: u64,
    /// File offset of the next byte fed.
    pos: u64,
    state: State,
    /// A header split across pieces.
    partial: Vec<u8>,
    /// The repositories whose data the frames walked carry.
    repos: std::collections::BTreeSet<String>,
    /// A frame walked was erased but not yet scrubbed (its header still
    /// has the lengths and crc of what was erased).
    unfinished_erase: bool,
}

impl FrameWalk {
    /// A walk of the segment whose first frame is `first_seq`, in the log
    /// `history`.
    pub fn new(first_seq: u64, history: [u8; 16]) -> FrameWalk {
        FrameWalk {
            first_seq,
            history,
            next_seq: first_seq,
            pos: 0,
            state: State::SegmentHeader,
            partial: Vec::with_capacity(SEGMENT_HEADER_LEN),
            repos: std::collections::BTreeSet::new(),
            unfinished_erase: false,
        }
    }

    /// The repositories whose data the frames walked so far carry: what
    /// an erase of the archive looks for.
    pub fn repos(&self) -> Vec<String> {
        self.repos.iter().cloned().collect()
    }

    /// Whether a frame walked was caught in the middle of an erase.
    pub fn unfinished_erase(&self) -> bool {
        self.unfinished_erase
    }

    /// Bytes walked.
    pub fn pos(&self) -> u64 {
        self.pos
    }

    /// True between frames: the bytes so far end at a frame boundary.
    pub fn at_boundary(&self) -> bool {
        matches!(self.state, State::FrameHeader) && self.partial.is_empty()
    }

    /// Walk the next piece; returns the first frame whose header starts
    /// inside it.
    pub fn feed(&mut self, piece: &[u8]) -> Result<Option<FrameStart>, Error> {
        let mut first = None;
        let mut i = 0usize;
        while i < piece.len() {
            match &mut self.state {
                State::SegmentHeader => {
                    let take = (SEGMENT_HEADER_LEN - self.partial.len()).min(piece.len() - i);
                    self.partial.extend_from_slice(&piece[i..i + take]);
                    i += take;
                    if self.partial.len() == SEGMENT_HEADER_LEN {
                        self.check_segment_header()?;
                        self.partial.clear();
                        self.state = State::FrameHeader;
                    }
                }
                State::FrameHeader => {
                    if self.partial.is_empty() && first.is_none() {
                        first = Some(FrameStart {
                            seq: self.next_seq,
                            offset: i as u32,
                        });
                    }
                    let take = (FRAME_HEADER_LEN - self.partial.len()).min(piece.len() - i);
                    self.partial.extend_from_slice(&piece[i..i + take]);
                    i += take;
                    if self.partial.len() == FRAME_HEADER_LEN {
                        let header = self.check_frame_header()?;
                        self.partial.clear();
                        let redacted = header.kind == Kind::Redacted.as_u16();
                        if redacted && header.meta_len > 0 {
                            self.unfinished_erase = true;
                        }
                        let carries = !redacted
                            && Kind::from_u16(header.kind).is_ok_and(Kind::carries_repo_data);
                        self.state = State::Payload {
                            header,
                            left: u64::from(header.meta_len) + header.blob_len,
                            crc: crc32fast::Hasher::new(),
                            meta: carries.then(|| Vec::with_capacity(header.meta_len as usize)),
                        };
                        self.end_frame_if_done()?;
                    }
                }
                State::Payload {
                    header,
                    left,
                    crc,
                    meta,
                } => {
                    let take = (*left).min((piece.len() - i) as u64) as usize;
                    if let Some(m) = meta {
                        let want = (header.meta_len as usize).saturating_sub(m.len()).min(take);
                        m.extend_from_slice(&piece[i..i + want]);
                    }
                    crc.update(&piece[i..i + take]);
                    *left -= take as u64;
                    i += take;
                    self.end_frame_if_done()?;
                }
            }
        }
        self.pos += piece.len() as u64;
        Ok(first)
    }

    fn check_segment_header(&self) -> Result<(), Error> {
        let mut b = [0u8; SEGMENT_HEADER_LEN];
        b.copy_from_slice(&self.partial);
        let h = SegmentHeader::decode(&b)
            .map_err(|e| Error::Corrupt(format!("segment header: {e:?}")))?;
        if h.first_seq != self.first_seq || h.history != self.history {
            return Err(Error::Corrupt(format!(
                "segment header names first frame {} of another history or place; {} expected",
                h.first_seq, self.first_seq
            )));
        }
        Ok(())
    }

    fn check_frame_header(&self) -> Result<FrameHeader, Error> {
        let mut b = [0u8; FRAME_HEADER_LEN];
        b.copy_from_slice(&self.partial);
        // Where the piece holding the header's end began.
        let at = self.pos;
        let h = FrameHeader::decode(&b)
            .map_err(|e| Error::Corrupt(format!("frame header at byte {at}: {e:?}")))?;
        if h.seq != self.next_seq {
            return Err(Error::Corrupt(format!(
                "frame {} at byte {at}; frame {} expected",
                h.seq, self.next_seq
            )));
        }
        Ok(h)
    }

    fn end_frame_if_done(&mut self) -> Result<(), Error> {
        let State::Payload {
            header,
            left,
            crc,
            meta,
        } = &self.state
        else {
            return Ok(());
        };
        if *left > 0 {
            return Ok(());
        }
        let got = crc.clone().finalize();
        let erased_len = u64::from(header.meta_len) + header.blob_len;
        let erased =
            header.kind == Kind::Redacted.as_u16() && got == format::crc_of_zeros(erased_len);
        if got != header.payload_crc && !erased {
            return Err(Error::Corrupt(format!(
                "frame {}: its payload does not match its crc",
                header.seq
            )));
        }
        if let Some(repo) = meta.as_deref().and_then(|m| Meta::repo_of(m).ok()) {
            if !self.repos.contains(repo) {
                self.repos.insert(repo.to_owned());
            }
        }
        self.next_seq += 1;
        self.state = State::FrameHeader;
        Ok(())
    }

    /// The walk is over: the bytes must end at a frame's end, after at
    /// least one frame. Returns the last frame's sequence.
    pub fn finish(&self) -> Result<u64, Error> {
        if !self.at_boundary() {
            return Err(Error::Corrupt(format!(
                "the segment ends inside frame {} (byte {})",
                self.next_seq, self.pos
            )));
        }
        if self.next_seq == self.first_seq {
            return Err(Error::Corrupt("a segment with no frame".into()));
        }
        Ok(self.next_seq - 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::log::Log;

    fn segment_bytes() -> (Vec<u8>, [u8; 16], u64) {
        let dir = tempfile::tempdir().unwrap();
        let log = Log::open_with(dir.path(), 4096).unwrap();
        for i in 0..40u64 {
            let blob = vec![i as u8; (i * 37 % 300) as usize];
            log.append(Kind::Pack, &Meta::repo("r"), &blob).unwrap();
        }
        log.sync().unwrap();
        let (first, _, _) = log.layout()[0];
        let path = dir.path().join(format!("{first:020}.log"));
        let history = log.history().0;
        (std::fs::read(path).unwrap(), history, first)
    }

    #[test]
    fn any_split_of_a_segment_walks_to_the_same_end() {
        let (bytes, history, first) = segment_bytes();
        let mut whole = FrameWalk::new(first, history);
        whole.feed(&bytes).unwrap();
        let last = whole.finish().unwrap();
        assert!(last > first);
        for piece in [1usize, 5, 31, 32, 33, 64, 100, 4095] {
            let mut w = FrameWalk::new(first, history);
            let mut starts = 0;
            for p in bytes.chunks(piece) {
                if w.feed(p).unwrap().is_some() {
                    starts += 1;
                }
            }
            assert_eq!(w.finish().unwrap(), last, "pieces of {piece}");
            assert!(starts > 0);
        }
    }

    #[test]
    fn a_flipped_or_missing_byte_is_named() {
        let (bytes, history, first) = segment_bytes();
        for at in (0..bytes.len()).step_by(11) {
            let mut bad = bytes.clone();
            bad[at] ^= 1;
            let mut w = FrameWalk::new(first, history);
            let res = w.feed(&bad).and_then(|_| w.finish());
            assert!(res.is_err(), "a flip at byte {at} went unseen");
        }
        let mut w = FrameWalk::new(first, history);
        w.feed(&bytes[..bytes.len() - 1]).unwrap();
        assert!(w.finish().is_err());
        let mut other = FrameWalk::new(first + 1, history);
        assert!(other.feed(&bytes).is_err());
    }
}
