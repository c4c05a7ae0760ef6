//! The bucket the archive keeps its objects in: an S3-compatible store
//! (`s3://bucket/prefix`, any endpoint) or a directory (`file:///path`),
//! behind `object_store`.

use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt;
use object_store::path::Path as ObjPath;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload, WriteMultipart};

use super::names::{
    with_slash, EraseMark, SegmentName, SnapshotName, ERASES_DIR, SEGMENTS_DIR, SNAPSHOTS_DIR,
};
use super::Error;

/// Stored bytes per part of a multipart upload; an object smaller than
/// one part is one put.
pub const PART_LEN: usize = 8 << 20;
/// Parts of one upload in flight at once.
const PARTS_IN_FLIGHT: usize = 2;

/// Where the archive lives and how to reach it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Spec {
    /// `s3://bucket[/prefix]` or `file:///absolute/dir[/prefix]`.
    pub url: String,
    /// The S3 endpoint (`http://127.0.0.1:3900`); none: AWS's own.
    pub endpoint: Option<String>,
    pub region: String,
    pub access_key_id: Option<String>,
    pub secret_access_key: Option<String>,
}

/// An object as the bucket describes it: its size, and its entity tag
/// when the bucket gives one (a checksum of its bytes on S3).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stored {
    pub size: u64,
    pub e_tag: Option<String>,
}

impl Stored {
    /// Whether `now` is still the object this describes: the same size,
    /// and the same tag when both have one.
    pub fn same_as(&self, now: &Stored) -> bool {
        self.size == now.size
            && match (&self.e_tag, &now.e_tag) {
                (Some(a), Some(b)) => a == b,
                _ => true,
            }
    }
}

/// One bucket and prefix.
#[derive(Clone)]
pub struct Bucket {
    store: Arc<dyn ObjectStore>,
    prefix: String,
    url: String,
}

impl std::fmt::Debug for Bucket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.url)
    }
}

/// HTTPS to the bucket uses ring, the provider QUIC uses: installed as
/// the process's default once (reqwest is built without one of its own).
fn install_ring_provider() {
    // Err: a default is installed already, which is all this needs.
    let _ = rustls::crypto::ring::default_provider().install_default();
}

impl Bucket {
    pub fn open(spec: &Spec) -> Result<Bucket, Error> {
        if let Some(rest) = spec.url.strip_prefix("s3://") {
            install_ring_provider();
            let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
            if bucket.is_empty() {
                return Err(Error::Spec(format!("{}: no bucket named", spec.url)));
            }
            let mut b = object_store::aws::AmazonS3Builder::new()
                .with_bucket_name(bucket)
                .with_region(if spec.region.is_empty() {
                    "us-east-1"
                } else {
                    &spec.region
                })
                .with_retry(object_store::RetryConfig {
                    backoff: object_store::BackoffConfig {
                        init_backoff: Duration::from_millis(100),
                        max_backoff: Duration::from_secs(15),
                        base: 2.0,
                    },
                    // The archiver retries a failed segment itself, with
                    // a longer backoff, and shows the error meanwhile.
                    max_retries: 5,
                    retry_timeout: Duration::from_secs(60),
                });
            if let Some(e) = &spec.endpoint {
                b = b
                    .with_endpoint(e)
                    .with_allow_http(e.starts_with("http://"))
                    .with_virtual_hosted_style_request(false);
            }
            if let (Some(id), Some(secret)) = (&spec.access_key_id, &spec.secret_access_key) {
                b = b.with_access_key_id(id).with_secret_access_key(secret);
            }
            let store = b
                .build()
                .map_err(|e| Error::Spec(format!("{}: {e}", spec.url)))?;
            return Ok(Bucket {
                store: Arc::new(store),
                prefix: prefix.trim_matches('/').to_owned(),
                url: spec.url.clone(),
            });
        }
        if let Some(dir) = spec.url.strip_prefix("file://") {
            if !dir.starts_with('/') {
                return Err(Error::Spec(format!(
                    "{}: a file:// archive names an absolute directory",
                    spec.url
                )));
            }
            std::fs::create_dir_all(dir).map_err(|e| Error::Spec(format!("{dir}: {e}")))?;
            let store = object_store::local::LocalFileSystem::new_with_prefix(dir)
                .map_err(|e| Error::Spec(format!("{dir}: {e}")))?;
            return Ok(Bucket {
                store: Arc::new(store),
                prefix: String::new(),
                url: spec.url.clone(),
            });
        }
        Err(Error::Spec(format!(
            "{}: an archive URL starts with s3:// or file://",
            spec.url
        )))
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    async fn list_stored(&self, dir: &str) -> Result<Vec<(String, Stored)>, Error> {
        let p = ObjPath::from(format!("{}{dir}", with_slash(&self.prefix)));
        let mut out = Vec::new();
        let mut s = self.store.list(Some(&p));
        while let Some(m) = s.next().await {
            let m = m?;
            let stored = Stored {
                size: m.size,
                e_tag: m.e_tag,
            };
            out.push((m.location.to_string(), stored));
        }
        out.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(out)
    }

    async fn list_under(&self, dir: &str) -> Result<Vec<(String, u64)>, Error> {
        let listed = self.list_stored(dir).await?;
        Ok(listed.into_iter().map(|(k, s)| (k, s.size)).collect())
    }

    /// Every archived segment, by name, with its size: oldest first.
    pub async fn segments(&self) -> Result<Vec<(SegmentName, u64)>, Error> {
        let listed = self.segments_stored().await?;
        Ok(listed.into_iter().map(|(n, s)| (n, s.size)).collect())
    }

    /// Every archived segment, by name, with its size and entity tag:
    /// oldest first.
    pub async fn segments_stored(&self) -> Result<Vec<(SegmentName, Stored)>, Error> {
        let mut v: Vec<_> = self
            .list_stored(SEGMENTS_DIR)
            .await?
            .into_iter()
            .filter_map(|(k, s)| SegmentName::parse(&k).map(|n| (n, s)))
            .collect();
        v.sort_by_key(|(n, _)| *n);
        Ok(v)
    }

    /// What the bucket holds under `key` now (one HEAD request); None when
    /// it holds nothing there.
    pub async fn head(&self, key: &str) -> Result<Option<Stored>, Error> {
        match self.store.head(&ObjPath::from(key)).await {
            Ok(m) => Ok(Some(Stored {
                size: m.size,
                e_tag: m.e_tag,
            })),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// Every archived store snapshot, by name, with its size: oldest
    /// first.
    pub async fn snapshots(&self) -> Result<Vec<(SnapshotName, u64)>, Error> {
        let mut v: Vec<_> = self
            .list_under(SNAPSHOTS_DIR)
            .await?
            .into_iter()
            .filter_map(|(k, n)| SnapshotName::parse(&k).map(|s| (s, n)))
            .collect();
        v.sort();
        Ok(v)
    }

    /// The key of the head record of the log `history`.
    pub fn head_key(&self, history: &[u8; 16]) -> String {
        super::names::head_key(&self.prefix, history)
    }

    pub fn snapshot_key(&self, name: &SnapshotName) -> String {
        name.key(&self.prefix)
    }

    /// The erases the bucket says reached it.
    pub async fn erase_marks(&self) -> Result<std::collections::HashSet<EraseMark>, Error> {
        Ok(self
            .list_under(ERASES_DIR)
            .await?
            .into_iter()
            .filter_map(|(k, _)| EraseMark::parse(&k))
            .collect())
    }

    /// Say the erase `mark` reached the bucket.
    pub async fn put_erase_mark(&self, mark: &EraseMark) -> Result<(), Error> {
        let key = ObjPath::from(mark.key(&self.prefix));
        self.store.put(&key, PutPayload::new()).await?;
        Ok(())
    }

    pub fn segment_key(&self, name: &SegmentName) -> String {
        name.key(&self.prefix)
    }

    pub async fn get_range(&self, key: &str, range: Range<u64>) -> Result<Bytes, Error> {
        let want = range.end - range.start;
        let b = self.store.get_range(&ObjPath::from(key), range).await?;
        if b.len() as u64 != want {
            return Err(Error::Corrupt(format!(
                "{key}: {} bytes came back for a range of {want}",
                b.len()
            )));
        }
        Ok(b)
    }

    /// The bytes `range` of `key`, only while it is still the object
    /// whose entity tag is `e_tag` (a conditional GET): None when it is
    /// gone or is another object now.
    pub async fn get_range_of(
        &self,
        key: &str,
        range: Range<u64>,
        e_tag: Option<&str>,
    ) -> Result<Option<Bytes>, Error> {
        let want = range.end - range.start;
        let opts = object_store::GetOptions {
            range: Some(range.into()),
            if_match: e_tag.map(str::to_owned),
            ..object_store::GetOptions::default()
        };
        let got = match self.store.get_opts(&ObjPath::from(key), opts).await {
            Ok(g) => g,
            Err(object_store::Error::NotFound { .. })
            | Err(object_store::Error::Precondition { .. }) => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        let b = got.bytes().await?;
        if b.len() as u64 != want {
            return Err(Error::Corrupt(format!(
                "{key}: {} bytes came back for a range of {want}",
                b.len()
            )));
        }
        Ok(Some(b))
    }

    /// A whole small object in one request (one version of it, whatever
    /// is written meanwhile); None when the bucket holds nothing there.
    /// One larger than `max` is refused before its bytes are read.
    pub async fn get_small(&self, key: &str, max: u64) -> Result<Option<Bytes>, Error> {
        let got = match self.store.get(&ObjPath::from(key)).await {
            Ok(g) => g,
            Err(object_store::Error::NotFound { .. }) => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        if got.meta.size > max {
            return Err(Error::Corrupt(format!(
                "{key}: {} bytes, where at most {max} are expected",
                got.meta.size
            )));
        }
        Ok(Some(got.bytes().await?))
    }

    pub async fn delete(&self, key: &str) -> Result<(), Error> {
        match self.store.delete(&ObjPath::from(key)).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// Start writing the object `key`.
    pub fn writer(&self, key: &str) -> ObjectUpload {
        ObjectUpload {
            store: Arc::clone(&self.store),
            path: ObjPath::from(key),
            buffered: Vec::new(),
            multipart: None,
        }
    }
}

/// An object being written: one put when it is smaller than a part, a
/// multipart upload (parts of [`PART_LEN`], two in flight) otherwise.
/// Dropped unfinished, nothing is visible under its key.
pub struct ObjectUpload {
    store: Arc<dyn ObjectStore>,
    path: ObjPath,
    buffered: Vec<Bytes>,
    multipart: Option<WriteMultipart>,
}

impl ObjectUpload {
    fn buffered_len(&self) -> usize {
        self.buffered.iter().map(Bytes::len).sum()
    }

    pub async fn write(&mut self, bytes: Bytes) -> Result<(), Error> {
        if let Some(m) = &mut self.multipart {
            m.wait_for_capacity(PARTS_IN_FLIGHT).await?;
            m.put(bytes);
            return Ok(());
        }
        self.buffered.push(bytes);
        if self.buffered_len() >= PART_LEN {
            let upload = self.store.put_multipart(&self.path).await?;
            let mut m = WriteMultipart::new_with_chunk_size(upload, PART_LEN);
            for b in self.buffered.drain(..) {
                m.put(b);
            }
            self.multipart = Some(m);
        }
        Ok(())
    }

    /// Make the object visible under its key; its entity tag, when the
    /// bucket gives one.
    pub async fn finish(mut self) -> Result<Option<String>, Error> {
        let put = match self.multipart.take() {
            Some(m) => m.finish().await?,
            None => {
                let payload: PutPayload = self.buffered.drain(..).collect();
                self.store.put(&self.path, payload).await?
            }
        };
        Ok(put.e_tag)
    }

    /// Give up: the parts already sent are released.
    pub async fn abort(mut self) {
        if let Some(m) = self.multipart.take() {
            if let Err(e) = m.abort().await {
                tracing::warn!(path = %self.path, error = %e, "aborting an archive upload failed");
            }
        }
    }
}
