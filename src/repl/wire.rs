//! The frame stream: frames travel as the bytes the primary's log holds, a
//! 32-byte header, the meta, then the blob, back to back, in sequence. An
//! erased frame travels as its header and meta only: its blob is zeros on
//! both sides.
//!
//! [`FrameDecoder`] takes the stream in whatever pieces the transport hands
//! over and says what it holds: "need more bytes" is no event, a header that
//! fails its crc or breaks a limit is an error. It never buffers more than a
//! header and a meta: blob bytes are handed on as borrowed pieces.

use crate::log::format::{FrameHeader, FRAME_HEADER_LEN};
use crate::log::Kind;

/// What the stream held. The meta of `Begin` and `Erased` is
/// [`FrameDecoder::meta`]; a `Piece` is the bytes the call took from the
/// front of its input.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FrameEvent {
    /// A frame begins: its header, crc checked.
    Begin(FrameHeader),
    /// The next piece of the blob.
    Piece,
    /// The frame's blob is complete.
    End(FrameHeader),
    /// An erased frame, whole: header and meta, no blob bytes.
    Erased(FrameHeader),
}

#[derive(Debug, Clone, Copy)]
enum State {
    Header,
    Meta(FrameHeader),
    Blob(FrameHeader, u64),
    End(FrameHeader),
}

/// Decodes the frame stream incrementally.
#[derive(Debug)]
pub struct FrameDecoder {
    state: State,
    header: [u8; FRAME_HEADER_LEN],
    have: usize,
    meta: Vec<u8>,
}

impl Default for FrameDecoder {
    fn default() -> Self {
        FrameDecoder {
            state: State::Header,
            header: [0; FRAME_HEADER_LEN],
            have: 0,
            meta: Vec::new(),
        }
    }
}

/// Why the stream does not decode.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[error("frame stream: {0}")]
pub struct WireError(pub String);

impl FrameDecoder {
    /// The meta of the frame last begun.
    pub fn meta(&self) -> &[u8] {
        &self.meta
    }

    /// Whether the decoder sits between frames (nothing partial buffered).
    pub fn at_boundary(&self) -> bool {
        matches!(self.state, State::Header) && self.have == 0
    }

    /// Feed the front of `input`: answers how many bytes were taken and the
    /// event they completed, if any. Call again with the rest until a call
    /// takes nothing and gives nothing: then more bytes are needed.
    pub fn decode(&mut self, input: &[u8]) -> Result<(usize, Option<FrameEvent>), WireError> {
        match self.state {
            State::Header => {
                let n = (FRAME_HEADER_LEN - self.have).min(input.len());
                self.header[self.have..self.have + n].copy_from_slice(&input[..n]);
                self.have += n;
                if self.have < FRAME_HEADER_LEN {
                    return Ok((n, None));
                }
                self.have = 0;
                let header = FrameHeader::decode(&self.header)
                    .map_err(|e| WireError(format!("header does not decode: {e:?}")))?;
                self.meta.clear();
                self.state = State::Meta(header);
                Ok((n, None))
            }
            State::Meta(header) => {
                let want = header.meta_len as usize - self.meta.len();
                let n = want.min(input.len());
                self.meta.extend_from_slice(&input[..n]);
                if n < want {
                    return Ok((n, None));
                }
                if header.kind == Kind::Redacted.as_u16() {
                    self.state = State::Header;
                    return Ok((n, Some(FrameEvent::Erased(header))));
                }
                self.state = if header.blob_len == 0 {
                    State::End(header)
                } else {
                    State::Blob(header, header.blob_len)
                };
                Ok((n, Some(FrameEvent::Begin(header))))
            }
            State::Blob(header, left) => {
                let n = left.min(input.len() as u64) as usize;
                if n == 0 {
                    return Ok((0, None));
                }
                let left = left - n as u64;
                self.state = if left == 0 {
                    State::End(header)
                } else {
                    State::Blob(header, left)
                };
                Ok((n, Some(FrameEvent::Piece)))
            }
            State::End(header) => {
                self.state = State::Header;
                Ok((0, Some(FrameEvent::End(header))))
            }
        }
    }
}

/// The bytes that open a frame on the stream: its stored header and meta.
pub fn frame_prefix(header: &FrameHeader, meta: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(FRAME_HEADER_LEN + meta.len());
    out.extend_from_slice(&header.encode());
    out.extend_from_slice(meta);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::log::format::payload_crc;

    fn frame(seq: u64, kind: u16, meta: &[u8], blob: &[u8]) -> Vec<u8> {
        let h = FrameHeader {
            seq,
            kind,
            meta_len: meta.len() as u32,
            blob_len: blob.len() as u64,
            payload_crc: payload_crc(meta, blob),
        };
        let mut b = frame_prefix(&h, meta);
        if kind != Kind::Redacted.as_u16() {
            b.extend_from_slice(blob);
        }
        b
    }

    /// Events with pieces glued back together, for any split of the input.
    fn events(stream: &[u8], step: usize) -> Result<Vec<(String, Vec<u8>)>, WireError> {
        let mut d = FrameDecoder::default();
        let mut out: Vec<(String, Vec<u8>)> = Vec::new();
        for chunk in stream.chunks(step) {
            let mut pos = 0;
            loop {
                let (n, ev) = d.decode(&chunk[pos..])?;
                let piece = &chunk[pos..pos + n];
                pos += n;
                match ev {
                    None if n == 0 => break,
                    None => {}
                    Some(FrameEvent::Begin(h)) => {
                        out.push((format!("begin {}", h.seq), d.meta().to_vec()))
                    }
                    Some(FrameEvent::Piece) => match out.last_mut() {
                        Some((name, bytes)) if name == "blob" => bytes.extend_from_slice(piece),
                        _ => out.push(("blob".into(), piece.to_vec())),
                    },
                    Some(FrameEvent::End(h)) => out.push((format!("end {}", h.seq), vec![])),
                    Some(FrameEvent::Erased(h)) => {
                        out.push((format!("erased {}", h.seq), d.meta().to_vec()))
                    }
                }
            }
        }
        assert!(d.at_boundary());
        Ok(out)
    }

    #[test]
    fn any_split_of_the_stream_gives_the_same_frames() {
        let mut stream = frame(1, 2, b"meta", b"hello blob");
        stream.extend(frame(2, 3, b"", b""));
        stream.extend(frame(3, Kind::Redacted.as_u16(), b"m", &[0; 5000]));
        stream.extend(frame(4, 4, b"x", &[9; 3000]));
        let whole = events(&stream, stream.len()).expect("decode");
        assert_eq!(whole[0], ("begin 1".into(), b"meta".to_vec()));
        assert_eq!(whole[1], ("blob".into(), b"hello blob".to_vec()));
        assert_eq!(whole[3], ("begin 2".into(), vec![]));
        assert_eq!(whole[4], ("end 2".into(), vec![]));
        assert_eq!(whole[5], ("erased 3".into(), b"m".to_vec()));
        for step in [1, 2, 7, 31, 32, 33, 1000] {
            assert_eq!(events(&stream, step).expect("decode"), whole, "step {step}");
        }
    }

    #[test]
    fn a_damaged_header_is_an_error_not_a_frame() {
        let good = frame(1, 2, b"meta", b"blob");
        for i in 0..FRAME_HEADER_LEN {
            let mut bad = good.clone();
            bad[i] ^= 0x10;
            assert!(events(&bad, 5).is_err(), "flip at {i}");
        }
    }
}
