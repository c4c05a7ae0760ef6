//! One segment file read front to back: the buffered sequential reader used
//! by recovery, `scan_meta`, `range`, `erase` and the tailing readers.

use std::io;
use std::path::Path;
use std::sync::Arc;

use super::format::{
    FrameHeader, HeaderError, SegmentHeader, FRAME_HEADER_LEN, SEGMENT_HEADER_LEN,
};
use super::storage::StorageFile;
use super::{Error, Result, SegmentDamage};

/// Bytes read per refill: large enough that a segment of small frames costs
/// few system calls, small enough to stay out of the way of memory bounds.
pub const READ_CHUNK: usize = 256 * 1024;

/// What the reader found at its position.
#[derive(Debug)]
pub enum Next {
    /// A header that decoded.
    Frame(FrameHeader),
    /// The file ends before a whole header.
    End,
    /// Bytes that are not a header: zeros past the last frame, or damage.
    Bad(HeaderError),
}

/// A sequential reader over one segment that reuses one buffer.
#[derive(Debug)]
pub struct SegmentReader {
    file: Arc<dyn StorageFile>,
    buf: Vec<u8>,
    /// File offset of `buf[0]`.
    buf_at: u64,
    /// The reader's position in the file.
    pos: u64,
    file_len: u64,
}

impl SegmentReader {
    pub fn new(file: Arc<dyn StorageFile>, pos: u64) -> io::Result<Self> {
        let file_len = file.len()?;
        Ok(SegmentReader {
            file,
            buf: Vec::new(),
            buf_at: pos,
            pos,
            file_len,
        })
    }

    /// The file offset the next read starts at.
    pub fn pos(&self) -> u64 {
        self.pos
    }

    /// The file's length when the reader was made or last refreshed.
    pub fn file_len(&self) -> u64 {
        self.file_len
    }

    /// Look at the length again (a tailing reader whose writer appends).
    pub fn refresh_len(&mut self) -> io::Result<()> {
        self.file_len = self.file.len()?;
        // Cached bytes past the old end may have been zeros then and a frame
        // now: drop them.
        self.buf.clear();
        self.buf_at = self.pos;
        Ok(())
    }

    fn fill(&mut self, want: usize) -> io::Result<&[u8]> {
        let buf_end = self.buf_at + self.buf.len() as u64;
        if self.pos < self.buf_at || self.pos + want as u64 > buf_end {
            let len = want.max(READ_CHUNK);
            let len = len.min(self.file_len.saturating_sub(self.pos) as usize);
            self.buf.resize(len, 0);
            let mut got = 0;
            while got < len {
                match self
                    .file
                    .read_at(&mut self.buf[got..], self.pos + got as u64)?
                {
                    0 => break,
                    n => got += n,
                }
            }
            self.buf.truncate(got);
            self.buf_at = self.pos;
        }
        let start = (self.pos - self.buf_at) as usize;
        let end = (start + want).min(self.buf.len());
        Ok(&self.buf[start..end])
    }

    /// Decode the header at the position, advancing past it when it is one.
    pub fn next_header(&mut self) -> io::Result<Next> {
        let bytes = self.fill(FRAME_HEADER_LEN)?;
        if bytes.len() < FRAME_HEADER_LEN {
            return Ok(Next::End);
        }
        let mut raw = [0u8; FRAME_HEADER_LEN];
        raw.copy_from_slice(bytes);
        match FrameHeader::decode(&raw) {
            Ok(h) => {
                self.pos += FRAME_HEADER_LEN as u64;
                Ok(Next::Frame(h))
            }
            Err(e) => Ok(Next::Bad(e)),
        }
    }

    /// The header of frame `seq` as readers see it
    /// ([`FrameHeader::as_read`]), which must be at the position; anything
    /// else is [`Error::Corrupt`] naming `path` and the offset.
    pub fn expect_frame(&mut self, seq: u64, path: &Path) -> Result<FrameHeader> {
        self.expect_stored_frame(seq, path)
            .map(FrameHeader::as_read)
    }

    /// [`SegmentReader::expect_frame`], the header as stored: what an
    /// erase rewrites.
    pub fn expect_stored_frame(&mut self, seq: u64, path: &Path) -> Result<FrameHeader> {
        let at = self.pos;
        match self.next_header()? {
            Next::Frame(h) if h.seq == seq => Ok(h),
            other => Err(Error::corrupt(
                path,
                at,
                format!("expected frame {seq}, found {other:?}"),
            )),
        }
    }

    fn check_within(&self, n: u64) -> io::Result<()> {
        if self.pos.saturating_add(n) > self.file_len {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!(
                    "{n} bytes at {} run past the end {}",
                    self.pos, self.file_len
                ),
            ));
        }
        Ok(())
    }

    /// Read `n` bytes into `out` (cleared first); `UnexpectedEof` when the
    /// file ends first.
    pub fn read_into(&mut self, n: u64, out: &mut Vec<u8>) -> io::Result<()> {
        out.clear();
        self.check_within(n)?;
        let n = usize::try_from(n)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "frame too large"))?;
        if n <= READ_CHUNK {
            let bytes = self.fill(n)?;
            if bytes.len() < n {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
            out.extend_from_slice(bytes);
        } else {
            out.resize(n, 0);
            self.file.read_exact_at(out, self.pos)?;
        }
        self.pos += n as u64;
        Ok(())
    }

    /// The crc32 of the next `n` bytes, read through the buffer one chunk at
    /// a time: memory stays one chunk whatever `n` is. `UnexpectedEof` when
    /// the file ends first.
    pub fn crc_of(&mut self, n: u64) -> io::Result<u32> {
        self.check_within(n)?;
        let mut crc = crc32fast::Hasher::new();
        let mut left = n;
        while left > 0 {
            let want = left.min(READ_CHUNK as u64) as usize;
            let bytes = self.fill(want)?;
            if bytes.len() < want {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
            crc.update(bytes);
            self.pos += want as u64;
            left -= want as u64;
        }
        Ok(crc.finalize())
    }

    /// Skip `n` bytes.
    pub fn skip(&mut self, n: u64) {
        self.pos += n;
    }
}

pub(super) fn read_header(
    file: &dyn StorageFile,
) -> std::result::Result<SegmentHeader, SegmentDamage> {
    let mut b = [0u8; SEGMENT_HEADER_LEN];
    file.read_exact_at(&mut b, 0)
        .map_err(SegmentDamage::HeaderUnread)?;
    SegmentHeader::decode(&b).map_err(SegmentDamage::HeaderBad)
}
