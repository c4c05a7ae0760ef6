//! Reading archived objects back: the trailer, then the footer, then
//! pieces in runs of a few, the next two runs fetched while one is taken,
//! so memory holds at most three runs whatever the object's size.

use super::bucket::Bucket;
use super::codec::ArchiveKey;
use super::object::{ObjectReader, Trailer, TRAILER_LEN};
use super::Error;

/// Pieces fetched in one ranged request.
const PIECES_PER_FETCH: usize = 4;
/// Ranged requests in flight ahead of the pieces being taken.
const FETCHES_AHEAD: usize = 2;

/// An object opened from its trailer and footer.
pub struct Opened {
    pub key: String,
    pub reader: ObjectReader,
}

/// Open the object `key` of `size` bytes.
pub async fn open_object(
    bucket: &Bucket,
    key: &str,
    size: u64,
    archive_key: Option<&ArchiveKey>,
) -> Result<Opened, Error> {
    if size < TRAILER_LEN as u64 {
        return Err(Error::Corrupt(format!(
            "{key}: {size} bytes, shorter than a trailer"
        )));
    }
    let t = bucket
        .get_range(key, size - TRAILER_LEN as u64..size)
        .await?;
    let trailer = Trailer::decode(&t).map_err(|e| e.in_object(key))?;
    let fr = trailer.footer_range(size).map_err(|e| e.in_object(key))?;
    let footer = bucket.get_range(key, fr).await?;
    let reader = ObjectReader::open(trailer, footer.to_vec(), archive_key, size, key)
        .map_err(|e| e.in_object(key))?;
    Ok(Opened {
        key: key.to_owned(),
        reader,
    })
}

/// What a check of an object's seal found.
#[derive(Debug)]
pub enum Vouched {
    /// It opens under the key, bound to its name: written by a holder of
    /// the key for this place.
    Sealed,
    /// It is gone, or is another object than the one `stored` describes.
    Changed,
    /// It does not open under the key as this name: why, by name.
    Refused(Error),
}

/// Whether the object `key`, as `stored` describes it (its size and
/// entity tag, from a HEAD or a listing), opens under `archive_key`: its
/// trailer and footer read by conditional GETs of that very object (two
/// requests), its footer opened as the object of this name. A failed
/// request is an error: nothing is known.
pub async fn vouch_for(
    bucket: &Bucket,
    key: &str,
    stored: &super::bucket::Stored,
    archive_key: &ArchiveKey,
) -> Result<Vouched, Error> {
    let size = stored.size;
    if size < TRAILER_LEN as u64 {
        return Ok(Vouched::Refused(Error::Corrupt(format!(
            "{key}: {size} bytes, shorter than a trailer"
        ))));
    }
    let tag = stored.e_tag.as_deref();
    let Some(t) = bucket
        .get_range_of(key, size - TRAILER_LEN as u64..size, tag)
        .await?
    else {
        return Ok(Vouched::Changed);
    };
    let trailer = match Trailer::decode(&t) {
        Ok(t) => t,
        Err(e) => return Ok(Vouched::Refused(e.in_object(key))),
    };
    let fr = match trailer.footer_range(size) {
        Ok(r) => r,
        Err(e) => return Ok(Vouched::Refused(e.in_object(key))),
    };
    let Some(footer) = bucket.get_range_of(key, fr, tag).await? else {
        return Ok(Vouched::Changed);
    };
    Ok(
        match ObjectReader::open(trailer, footer.to_vec(), Some(archive_key), size, key) {
            Ok(_) => Vouched::Sealed,
            Err(e) => Vouched::Refused(e.in_object(key)),
        },
    )
}

type Fetch = tokio::task::JoinHandle<Result<(usize, usize, bytes::Bytes), Error>>;

/// An object's pieces in order, each opened and checked, fetched a few at
/// a time with the next run in flight while one is taken.
pub struct Pieces<'a> {
    bucket: &'a Bucket,
    opened: &'a Opened,
    /// Requests in flight, oldest first, and the piece the next one starts.
    ahead: std::collections::VecDeque<Fetch>,
    next_at: usize,
    /// The run in hand: its first piece, its end, its bytes, the offset
    /// of the next piece in it.
    run: Option<(usize, usize, bytes::Bytes, usize)>,
}

impl<'a> Pieces<'a> {
    /// The pieces of `opened` from piece `from` on.
    pub fn new(bucket: &'a Bucket, opened: &'a Opened, from: usize) -> Pieces<'a> {
        let mut p = Pieces {
            bucket,
            opened,
            ahead: std::collections::VecDeque::new(),
            next_at: from,
            run: None,
        };
        p.fill();
        p
    }

    /// Start requests until `FETCHES_AHEAD` are in flight or none is left.
    fn fill(&mut self) {
        let n = self.opened.reader.pieces();
        while self.ahead.len() < FETCHES_AHEAD && self.next_at < n {
            let job = self.fetch(self.next_at);
            self.ahead.push_back(job);
            self.next_at = (self.next_at + PIECES_PER_FETCH).min(n);
        }
    }

    fn fetch(&self, at: usize) -> Fetch {
        let n = self.opened.reader.pieces();
        let to = (at + PIECES_PER_FETCH).min(n);
        let range = self.opened.reader.pieces_range(at, to);
        let (bucket, key) = (self.bucket.clone(), self.opened.key.clone());
        tokio::spawn(async move { bucket.get_range(&key, range).await.map(|b| (at, to, b)) })
    }

    /// The next piece's number and plaintext; None after the last.
    pub async fn next(&mut self) -> Result<Option<(usize, Vec<u8>)>, Error> {
        if self.run.as_ref().is_none_or(|(at, to, _, _)| at >= to) {
            let Some(job) = self.ahead.pop_front() else {
                return Ok(None);
            };
            let (at, to, bytes) = job
                .await
                .map_err(|e| Error::Io(format!("a fetch task failed: {e}")))??;
            self.fill();
            self.run = Some((at, to, bytes, 0));
        }
        let Some((at, _, bytes, off)) = self.run.as_mut() else {
            return Ok(None);
        };
        let i = *at;
        let r = self.opened.reader.pieces_range(i, i + 1);
        let len = (r.end - r.start) as usize;
        let stored = bytes
            .get(*off..*off + len)
            .ok_or_else(|| Error::Corrupt(format!("{}: a short range", self.opened.key)))?
            .to_vec();
        *off += len;
        *at += 1;
        let plain = self
            .opened
            .reader
            .open_piece(i, stored)
            .map_err(|e| e.in_object(&self.opened.key))?;
        Ok(Some((i, plain)))
    }
}

impl Drop for Pieces<'_> {
    fn drop(&mut self) {
        for j in self.ahead.drain(..) {
            j.abort();
        }
    }
}
