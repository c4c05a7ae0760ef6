//! `tail`: frames as they become durable, a line each, or exported whole
//! (JSON lines with the bytes in base64, or the raw blobs back to back), a
//! piece at a time: a frame of any size costs one piece of memory here,
//! and the primary sends it under the same budget as any answer.

use std::io::Write;

use clap::ValueEnum;
use twinlog::daemon::DaemonError;
use twinlog::node::{Client, FrameHead};

/// What `tail` prints of each frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// One line per frame: its sequence, kind and blob length
    Lines,
    /// One JSON object per line: seq, kind, meta and blob (base64), blob_len,
    /// payload_crc
    Json,
    /// The blobs' bytes back to back, nothing between them
    Raw,
}

/// Follow the log from `from`, through `to` when given (then done),
/// printing each frame as `format` says.
pub async fn tail(
    client: &Client,
    from: u64,
    to: Option<u64>,
    format: Format,
) -> Result<(), DaemonError> {
    let what = || format!("tail from {from}");
    let mut tail = client
        .tail(from)
        .await
        .map_err(DaemonError::request(what()))?;
    // Not locked across the waits: a lock guard may not move between the
    // runtime's threads.
    let mut out = std::io::BufWriter::new(std::io::stdout());
    let mut last = None;
    loop {
        if to.is_some_and(|to| last.is_some_and(|l| l >= to)) {
            break;
        }
        let mut b64 = Base64::default();
        let mut started = false;
        let head = tail
            .next_streamed(|head, piece| {
                if !std::mem::replace(&mut started, true) {
                    begin(&mut out, format, head)?;
                }
                match format {
                    Format::Lines => Ok(()),
                    Format::Json => b64.push(piece, &mut out),
                    Format::Raw => out.write_all(piece),
                }
            })
            .await
            .map_err(DaemonError::request(what()))?;
        let Some(head) = head else {
            // A tail follows for ever: the primary ends it only as it stops.
            let after = last.map_or_else(|| "before any frame".into(), |s| format!("after {s}"));
            return Err(DaemonError::Failed(format!(
                "{}: the primary ended it {after} (stopping?)",
                what()
            )));
        };
        let written = (|| {
            if !started {
                begin(&mut out, format, &head)?;
            }
            if format == Format::Json {
                b64.finish(&mut out)?;
                writeln!(out, "\"}}")?;
            }
            out.flush()
        })();
        written.map_err(|e| DaemonError::Failed(format!("writing to stdout: {e}")))?;
        last = Some(head.seq);
    }
    Ok(())
}

/// What goes before a frame's blob.
fn begin(out: &mut impl Write, format: Format, head: &FrameHead) -> std::io::Result<()> {
    match format {
        Format::Lines => writeln!(out, "{} {} {}", head.seq, head.kind, head.blob_len),
        Format::Raw => Ok(()),
        Format::Json => {
            let mut meta = Base64::default();
            write!(
                out,
                "{{\"seq\":{},\"kind\":{},\"blob_len\":{},\"payload_crc\":{},\"meta\":\"",
                head.seq, head.kind, head.blob_len, head.payload_crc
            )?;
            meta.push(&head.meta, out)?;
            meta.finish(out)?;
            write!(out, "\",\"blob\":\"")
        }
    }
}

/// Standard base64 (RFC 4648, padded) of bytes that come in pieces.
#[derive(Default)]
struct Base64 {
    /// Up to two bytes of the last piece, waiting for a third.
    carry: Vec<u8>,
}

const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

impl Base64 {
    fn push(&mut self, mut bytes: &[u8], out: &mut impl Write) -> std::io::Result<()> {
        let mut line = Vec::with_capacity(bytes.len().div_ceil(3) * 4 + 4);
        while !bytes.is_empty() {
            let take = (3 - self.carry.len()).min(bytes.len());
            self.carry.extend_from_slice(&bytes[..take]);
            bytes = &bytes[take..];
            if self.carry.len() == 3 {
                line.extend_from_slice(&quad(&self.carry));
                self.carry.clear();
            }
        }
        out.write_all(&line)
    }

    fn finish(&mut self, out: &mut impl Write) -> std::io::Result<()> {
        if self.carry.is_empty() {
            return Ok(());
        }
        let mut q = quad(&self.carry);
        for c in q.iter_mut().skip(self.carry.len() + 1) {
            *c = b'=';
        }
        self.carry.clear();
        out.write_all(&q)
    }
}

/// Four characters for up to three bytes (missing ones as zeros).
fn quad(b: &[u8]) -> [u8; 4] {
    let at = |i: usize| u32::from(b.get(i).copied().unwrap_or(0));
    let n = (at(0) << 16) | (at(1) << 8) | at(2);
    [18, 12, 6, 0].map(|s| ALPHABET[((n >> s) & 63) as usize])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn encode(pieces: &[&[u8]]) -> String {
        let mut out = Vec::new();
        let mut b = Base64::default();
        for p in pieces {
            b.push(p, &mut out).expect("push");
        }
        b.finish(&mut out).expect("finish");
        String::from_utf8(out).expect("ascii")
    }

    #[test]
    fn base64_in_pieces_is_base64_of_the_whole() {
        assert_eq!(encode(&[]), "");
        assert_eq!(encode(&[b"f"]), "Zg==");
        assert_eq!(encode(&[b"fo"]), "Zm8=");
        assert_eq!(encode(&[b"foo"]), "Zm9v");
        assert_eq!(encode(&[b"foob", b"ar"]), "Zm9vYmFy");
        assert_eq!(encode(&[b"f", b"o", b"o", b"b", b"a"]), "Zm9vYmE=");
        assert_eq!(encode(&[&[0xff, 0xfe], &[0xfd]]), "//79");
    }
}
