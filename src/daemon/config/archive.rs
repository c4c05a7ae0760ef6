//! `[archive]`: sealed segments kept in an S3-compatible bucket, the same
//! section in `primary.toml` and `twin.toml`. One box uploads (the twin
//! by default, so the primary's disk and CPU stay on the hot path); both
//! hold their retention to what the bucket has.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Deserializer, Serialize};

use crate::archive::archiver::ArchiveSettings;
use crate::archive::bucket::{Bucket, Spec};
use crate::archive::codec::{ArchiveKey, Codec};

/// Which box uploads.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Uploader {
    #[default]
    Twin,
    Primary,
}

/// The zstd levels a configuration may ask for.
pub const ZSTD_LEVELS: std::ops::RangeInclusive<i64> = 1..=19;

/// `[archive]`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ArchiveSection {
    /// `s3://bucket/prefix`, or `file:///dir` for a directory.
    #[serde(deserialize_with = "de_url")]
    pub url: String,
    /// The S3 endpoint (`https://s3.example.net`, `http://10.0.0.9:3900`);
    /// none: AWS.
    #[serde(default)]
    pub endpoint: Option<String>,
    #[serde(default = "default_region")]
    pub region: String,
    /// A file (mode 0600) holding `access_key_id` and
    /// `secret_access_key`; none: the `AWS_ACCESS_KEY_ID` and
    /// `AWS_SECRET_ACCESS_KEY` variables.
    #[serde(default)]
    pub credentials_file: Option<PathBuf>,
    #[serde(default)]
    pub uploader: Uploader,
    /// zstd level for each piece; 0 stores pieces uncompressed.
    #[serde(default = "default_zstd_level", deserialize_with = "de_zstd_level")]
    pub zstd_level: i64,
    /// The key file (64 hex digits, mode 0600) that encrypts every piece
    /// (AES-256-GCM); none: stored in the clear.
    #[serde(default)]
    pub key_file: Option<PathBuf>,
    /// The uploads' pace in MiB a second; 0 unpaced.
    #[serde(default = "default_max_mib_per_s")]
    pub max_mib_per_s: u64,
    /// A store snapshot is archived each time this many MiB of segments
    /// were archived since the last; 0: never.
    #[serde(default = "default_snapshot_every_mib")]
    pub snapshot_every_mib: u64,
}

fn default_region() -> String {
    "us-east-1".into()
}

fn default_zstd_level() -> i64 {
    3
}

pub fn default_max_mib_per_s() -> u64 {
    64
}

pub fn default_snapshot_every_mib() -> u64 {
    1024
}

fn de_url<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    let v = String::deserialize(d)?;
    let ok = v
        .strip_prefix("s3://")
        .is_some_and(|b| !b.is_empty() && !b.starts_with('/'))
        || v.strip_prefix("file://")
            .is_some_and(|p| p.starts_with('/'));
    if !ok {
        return Err(serde::de::Error::custom(format!(
            "url = {v:?}: an archive is s3://bucket[/prefix] or file:///absolute/dir"
        )));
    }
    Ok(v)
}

fn de_zstd_level<'de, D: Deserializer<'de>>(d: D) -> Result<i64, D::Error> {
    let v = i64::deserialize(d)?;
    if v != 0 && !ZSTD_LEVELS.contains(&v) {
        return Err(serde::de::Error::custom(format!(
            "zstd_level = {v}: 0 (none) or 1 to 19"
        )));
    }
    Ok(v)
}

/// Keys of a credentials file.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Credentials {
    access_key_id: String,
    secret_access_key: String,
}

fn private_text(path: &Path, what: &str) -> Result<String, String> {
    use std::os::unix::fs::PermissionsExt;
    let meta = std::fs::metadata(path).map_err(|e| format!("{what} {}: {e}", path.display()))?;
    if meta.permissions().mode() & 0o077 != 0 {
        return Err(format!(
            "{what} {} may be read by others: chmod 600 it",
            path.display()
        ));
    }
    std::fs::read_to_string(path).map_err(|e| format!("{what} {}: {e}", path.display()))
}

impl ArchiveSection {
    /// Paths in the section are relative to the configuration's data
    /// directory.
    fn resolve(&self, data_dir: &Path, p: &Path) -> PathBuf {
        if p.is_absolute() {
            p.to_owned()
        } else {
            data_dir.join(p)
        }
    }

    /// Where the bucket is and how to reach it, credentials read.
    pub fn spec(&self, data_dir: &Path) -> Result<Spec, String> {
        let (id, secret) = match &self.credentials_file {
            Some(f) => {
                let f = self.resolve(data_dir, f);
                let text = private_text(&f, "credentials file")?;
                let c: Credentials =
                    toml::from_str(&text).map_err(|e| format!("{}: {e}", f.display()))?;
                (Some(c.access_key_id), Some(c.secret_access_key))
            }
            None => (
                std::env::var("AWS_ACCESS_KEY_ID").ok(),
                std::env::var("AWS_SECRET_ACCESS_KEY").ok(),
            ),
        };
        Ok(Spec {
            url: self.url.clone(),
            endpoint: self.endpoint.clone(),
            region: self.region.clone(),
            access_key_id: id,
            secret_access_key: secret,
        })
    }

    /// The key, when the archive is encrypted.
    pub fn key(&self, data_dir: &Path) -> Result<Option<ArchiveKey>, String> {
        self.key_file
            .as_ref()
            .map(|f| ArchiveKey::load(&self.resolve(data_dir, f)).map_err(|e| e.to_string()))
            .transpose()
    }

    /// What the archiver runs with.
    pub fn settings(&self, data_dir: &Path) -> Result<ArchiveSettings, String> {
        let bucket = Bucket::open(&self.spec(data_dir)?).map_err(|e| e.to_string())?;
        Ok(ArchiveSettings {
            bucket,
            codec: Codec {
                zstd_level: (self.zstd_level != 0).then_some(self.zstd_level as i32),
                key: self.key(data_dir)?,
            },
            bytes_per_s: self.max_mib_per_s.saturating_mul(1 << 20),
        })
    }

    /// The section, with a comment on every key.
    pub fn render(&self) -> String {
        let opt = |k: &str, v: &Option<String>| match v {
            Some(v) => format!("{k} = \"{v}\"\n"),
            None => format!("# {k} = \"\"\n"),
        };
        let path = |p: &Option<PathBuf>| p.as_ref().map(|p| p.display().to_string());
        format!(
            r#"
# Sealed segments kept in an S3-compatible bucket (or a directory). A
# segment is dropped here only once it is archived.
[archive]
# s3://bucket/prefix, or file:///absolute/dir.
url = "{url}"
# The S3 endpoint; none: AWS.
{endpoint}region = "{region}"
# A file (mode 0600) with access_key_id and secret_access_key; none: the
# AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY variables.
{credentials}# Which box uploads: "twin" (the default: the primary's disk and CPU
# stay on the hot path) or "primary".
uploader = "{uploader}"
# zstd level of each piece (1 to 19); 0 stores them uncompressed.
zstd_level = {zstd}
# A key file (64 hex digits, mode 0600; `primary archive-key` mints one):
# every piece is encrypted with AES-256-GCM and the bucket holds no
# plaintext byte. Keep a copy off both boxes: without it nothing restores.
{key}# The uploads' pace, MiB a second (0: unpaced).
max_mib_per_s = {pace}
# A store snapshot is archived each time this many MiB of segments were
# archived since the last (0: never): a restore starts from the newest
# snapshot before its target instead of frame 1.
snapshot_every_mib = {snapshots}
"#,
            url = self.url,
            endpoint = opt("endpoint", &self.endpoint),
            region = self.region,
            credentials = opt("credentials_file", &path(&self.credentials_file)),
            uploader = match self.uploader {
                Uploader::Twin => "twin",
                Uploader::Primary => "primary",
            },
            zstd = self.zstd_level,
            key = opt("key_file", &path(&self.key_file)),
            pace = self.max_mib_per_s,
            snapshots = self.snapshot_every_mib,
        )
    }
}
