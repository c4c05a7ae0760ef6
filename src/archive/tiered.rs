//! Reading frames below the local floor from the archive: a cursor over
//! the archived segments of this box's lineage, from any sequence on,
//! holding one piece (4 MiB of plaintext) at a time whatever the frames'
//! sizes. A frame is found from its piece's first frame (the footer says
//! where one starts), then read header, meta and blob in pieces. Every
//! frame's header crc is checked, and its payload crc as its last byte
//! goes by: a reader never takes a frame whose bytes do not check.
//!
//! Pieces are opened (decrypted, decompressed, checked) on the blocking
//! pool: the caller's runtime thread only waits for the bucket.

use std::sync::Arc;

use super::bucket::Bucket;
use super::codec::ArchiveKey;
use super::fetch::{open_object, Opened};
use super::names::{of_lineage, SegmentName};
use super::Error;
use crate::log::format::{self, FrameHeader, FRAME_HEADER_LEN, SEGMENT_HEADER_LEN};
use crate::log::Kind;
use crate::repl::epochs::EpochStart;

/// What a tiered reader needs to know of the box.
#[derive(Clone)]
pub struct TieredSource {
    pub bucket: Bucket,
    pub key: Option<ArchiveKey>,
    pub history: [u8; 16],
    pub epochs: Vec<EpochStart>,
    /// The bucket's listing and the newest objects' footers, shared by
    /// the box's readers; none: every cursor asks the bucket.
    pub cache: Option<Arc<TieredCache>>,
}

/// How long a listing answers cursors before the bucket is asked again
/// (a frame it lacks asks again at once).
const LISTING_FOR: std::time::Duration = std::time::Duration::from_secs(5);
/// Footers kept: each is small (a few dozen bytes a piece).
const OBJECTS_KEPT: usize = 32;

/// A listing of the bucket's segments, and when it was taken.
type Listing = (std::time::Instant, Vec<(SegmentName, u64)>);

/// A box's cache of the bucket's listing and of opened objects.
#[derive(Default)]
pub struct TieredCache {
    listing: std::sync::Mutex<Option<Listing>>,
    objects: std::sync::Mutex<std::collections::VecDeque<(String, Arc<Opened>)>>,
}

impl TieredCache {
    async fn listing(
        &self,
        bucket: &Bucket,
        fresh: bool,
    ) -> Result<Vec<(SegmentName, u64)>, Error> {
        if !fresh {
            if let Ok(l) = self.listing.lock() {
                if let Some((at, list)) = l.as_ref() {
                    if at.elapsed() < LISTING_FOR {
                        return Ok(list.clone());
                    }
                }
            }
        }
        let list = bucket.segments().await?;
        if let Ok(mut l) = self.listing.lock() {
            *l = Some((crate::clock::monotonic(), list.clone()));
        }
        Ok(list)
    }

    fn object(&self, key: &str) -> Option<Arc<Opened>> {
        let o = self.objects.lock().ok()?;
        o.iter().find(|(k, _)| k == key).map(|(_, v)| v.clone())
    }

    /// Drop the listing and the footers: objects were replaced.
    pub fn forget(&self) {
        if let Ok(mut l) = self.listing.lock() {
            *l = None;
        }
        if let Ok(mut o) = self.objects.lock() {
            o.clear();
        }
    }

    fn keep(&self, key: &str, opened: Arc<Opened>) {
        if let Ok(mut o) = self.objects.lock() {
            o.retain(|(k, _)| k != key);
            o.push_back((key.to_owned(), opened));
            while o.len() > OBJECTS_KEPT {
                o.pop_front();
            }
        }
    }
}

/// Open an object through the cache, when there is one.
async fn open_cached(src: &TieredSource, key: &str, size: u64) -> Result<Arc<Opened>, Error> {
    if let Some(o) = src.cache.as_ref().and_then(|c| c.object(key)) {
        return Ok(o);
    }
    let opened = Arc::new(open_object(&src.bucket, key, size, src.key.as_ref()).await?);
    if let Some(c) = &src.cache {
        c.keep(key, opened.clone());
    }
    Ok(opened)
}

/// A frame's head, as a read answers it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FrameHead {
    pub seq: u64,
    pub kind: u16,
    pub meta: Vec<u8>,
    /// 0 for an erased frame (its blob is not served).
    pub blob_len: u64,
    pub payload_crc: u32,
}

/// Frames from the archive, in order.
pub struct ArchivedFrames {
    src: TieredSource,
    segments: Vec<(SegmentName, u64)>,
    /// Index into `segments` of the one open.
    seg: usize,
    object: Option<Arc<Opened>>,
    piece: usize,
    plain: Vec<u8>,
    at: usize,
    /// The next frame the cursor gives.
    next_seq: u64,
    /// The blob of the frame given last: bytes left, and its crc so far.
    blob_left: u64,
    served: bool,
    crc: crc32fast::Hasher,
    header: Option<FrameHeader>,
}

impl ArchivedFrames {
    /// A cursor at `seq`; `Missing` when the archive holds no segment of
    /// this box's lineage with it.
    pub async fn at(src: TieredSource, seq: u64) -> Result<ArchivedFrames, Error> {
        match Self::at_listed(src.clone(), seq, false).await {
            // A cached listing may predate the frame's segment, or name a
            // version an erase has since replaced and deleted.
            Err(Error::Missing(_) | Error::Store(object_store::Error::NotFound { .. }))
                if src.cache.is_some() =>
            {
                if let Some(c) = &src.cache {
                    c.forget();
                }
                Self::at_listed(src, seq, true).await
            }
            other => other,
        }
    }

    async fn at_listed(src: TieredSource, seq: u64, fresh: bool) -> Result<ArchivedFrames, Error> {
        let all = match &src.cache {
            Some(c) => c.listing(&src.bucket, fresh).await?,
            None => src.bucket.segments().await?,
        };
        let segments = of_lineage(&all, &src.history, &src.epochs);
        let seg = segments
            .iter()
            .position(|(n, _)| n.first <= seq && seq <= n.last)
            .ok_or_else(|| Error::Missing(format!("frame {seq} is not in the archive")))?;
        let mut me = ArchivedFrames {
            src,
            segments,
            seg,
            object: None,
            piece: 0,
            plain: Vec::new(),
            at: 0,
            next_seq: seq,
            blob_left: 0,
            served: true,
            crc: crc32fast::Hasher::new(),
            header: None,
        };
        me.open_segment_at(seq).await?;
        Ok(me)
    }

    /// The last frame the archive holds of this lineage, contiguous from
    /// the cursor's segment.
    pub fn archived_through(&self) -> u64 {
        let mut last = self.segments[self.seg].0.last;
        for (n, _) in &self.segments[self.seg + 1..] {
            if n.first != last + 1 {
                break;
            }
            last = n.last;
        }
        last
    }

    async fn open_segment_at(&mut self, seq: u64) -> Result<(), Error> {
        let (name, size) = self.segments[self.seg];
        let key = self.src.bucket.segment_key(&name);
        let opened = open_cached(&self.src, &key, size).await?;
        let footer = opened.reader.footer();
        // The last piece in which a frame at or before `seq` starts.
        let piece = footer
            .pieces
            .iter()
            .rposition(|p| p.first_frame.is_some_and(|f| f.seq <= seq))
            .ok_or_else(|| {
                Error::Corrupt(format!("{key}: no piece starts a frame at or before {seq}"))
            })?;
        let start = footer.pieces[piece]
            .first_frame
            .map_or(0, |f| f.offset as usize);
        let first_in_piece = footer.pieces[piece]
            .first_frame
            .map_or(name.first, |f| f.seq);
        self.object = Some(opened);
        self.piece = piece;
        self.load_piece().await?;
        self.at = start;
        // Walk from the piece's first frame to `seq`.
        let mut s = first_in_piece;
        while s < seq {
            let h = self.read_header().await?;
            self.skip(u64::from(h.meta_len) + h.blob_len).await?;
            s += 1;
        }
        self.next_seq = seq;
        Ok(())
    }

    async fn load_piece(&mut self) -> Result<(), Error> {
        let obj = self
            .object
            .clone()
            .ok_or_else(|| Error::Corrupt("no object open".into()))?;
        let i = self.piece;
        if i >= obj.reader.pieces() {
            return Err(Error::Corrupt(format!("{}: past its last piece", obj.key)));
        }
        let range = obj.reader.pieces_range(i, i + 1);
        let stored = self.src.bucket.get_range(&obj.key, range).await?;
        let plain = tokio::task::spawn_blocking(move || {
            obj.reader
                .open_piece(i, stored.to_vec())
                .map_err(|e| e.in_object(&obj.key))
        })
        .await
        .map_err(|e| Error::Io(format!("opening a piece: {e}")))??;
        self.plain = plain;
        self.at = 0;
        Ok(())
    }

    /// Up to `want` bytes at the cursor, the next piece loaded when this
    /// one is done.
    async fn take(&mut self, want: usize) -> Result<&[u8], Error> {
        if self.at >= self.plain.len() {
            self.piece += 1;
            self.load_piece().await?;
        }
        let n = want.min(self.plain.len() - self.at);
        let out = &self.plain[self.at..self.at + n];
        self.at += n;
        Ok(out)
    }

    async fn skip(&mut self, mut n: u64) -> Result<(), Error> {
        while n > 0 {
            let got = self.take(n.min(usize::MAX as u64) as usize).await?.len();
            n -= got as u64;
        }
        Ok(())
    }

    async fn read_exact(&mut self, n: usize) -> Result<Vec<u8>, Error> {
        let mut out = Vec::with_capacity(n);
        while out.len() < n {
            let want = n - out.len();
            let got = self.take(want).await?;
            out.extend_from_slice(got);
        }
        Ok(out)
    }

    async fn read_header(&mut self) -> Result<FrameHeader, Error> {
        let b = self.read_exact(FRAME_HEADER_LEN).await?;
        let mut a = [0u8; FRAME_HEADER_LEN];
        a.copy_from_slice(&b);
        FrameHeader::decode(&a).map_err(|e| Error::Corrupt(format!("frame header: {e:?}")))
    }

    /// The next frame's head; its blob follows through [`Self::blob_piece`].
    /// Any blob left of the frame before is skipped.
    pub async fn next_frame(&mut self) -> Result<FrameHead, Error> {
        if self.blob_left > 0 {
            let left = self.blob_left;
            self.blob_left = 0;
            self.skip(left).await?;
        }
        let (name, _) = self.segments[self.seg];
        if self.next_seq > name.last {
            let next = self.seg + 1;
            match self.segments.get(next) {
                Some((n, _)) if n.first == self.next_seq => {
                    self.seg = next;
                    self.open_first_of_segment().await?;
                }
                _ => {
                    return Err(Error::Missing(format!(
                        "frame {} is not in the archive",
                        self.next_seq
                    )))
                }
            }
        }
        let h = self.read_header().await?;
        if h.seq != self.next_seq {
            return Err(Error::Corrupt(format!(
                "frame {} where {} was expected",
                h.seq, self.next_seq
            )));
        }
        let meta = self.read_exact(h.meta_len as usize).await?;
        let read_as = h.as_read();
        let erased = h.kind == Kind::Redacted.as_u16();
        let mut crc = crc32fast::Hasher::new();
        crc.update(&meta);
        self.crc = crc;
        self.header = Some(h);
        self.blob_left = h.blob_len;
        self.served = !erased;
        if h.blob_len == 0 {
            self.check_crc()?;
        }
        self.next_seq += 1;
        Ok(FrameHead {
            seq: h.seq,
            kind: h.kind,
            meta: if erased { Vec::new() } else { meta },
            blob_len: if erased { 0 } else { h.blob_len },
            payload_crc: read_as.payload_crc,
        })
    }

    async fn open_first_of_segment(&mut self) -> Result<(), Error> {
        let (name, size) = self.segments[self.seg];
        let key = self.src.bucket.segment_key(&name);
        self.object = Some(open_cached(&self.src, &key, size).await?);
        self.piece = 0;
        self.load_piece().await?;
        self.at = SEGMENT_HEADER_LEN;
        Ok(())
    }

    /// The next bytes of the current frame's blob (at most `max`); empty
    /// at its end. The payload crc is checked as the last byte goes by.
    pub async fn blob_piece(&mut self, max: usize) -> Result<Vec<u8>, Error> {
        if self.blob_left == 0 || !self.served {
            return Ok(Vec::new());
        }
        let want = self.blob_left.min(max as u64) as usize;
        let got = self.take(want).await?.to_vec();
        self.crc.update(&got);
        self.blob_left -= got.len() as u64;
        if self.blob_left == 0 {
            self.check_crc()?;
        }
        Ok(got)
    }

    fn check_crc(&self) -> Result<(), Error> {
        let Some(h) = self.header else {
            return Ok(());
        };
        let got = self.crc.clone().finalize();
        let erased_len = u64::from(h.meta_len) + h.blob_len;
        let erased = h.kind == Kind::Redacted.as_u16() && got == format::crc_of_zeros(erased_len);
        if got != h.payload_crc && !erased {
            return Err(Error::Corrupt(format!(
                "frame {}: its payload does not match its crc",
                h.seq
            )));
        }
        Ok(())
    }
}
