//! An archive on Garage for the tests that run daemons as processes: the
//! `[archive]` section, its credentials and key in files of mode 0600, and
//! the blobs the writers append. Included by path.

#![allow(dead_code)] // each test uses its own part

use std::path::Path;

use testkit::garage::{self, Garage};
use twinlog::archive::codec::ArchiveKey;
use twinlog::daemon::config::{ArchiveSection, Uploader};

/// Frame `n`'s blob: 3,000 bytes that name it.
pub fn blob(n: u64) -> Vec<u8> {
    let mut b = format!("frame-{n}-").into_bytes();
    b.resize(3000, (n % 251) as u8);
    b
}

/// `[archive]` on Garage under `s3://BUCKET/pair`, the twin uploading,
/// its credentials and `key` in files of mode 0600 in `dir`; a store
/// snapshot every `snapshot_every_mib` (0: none).
pub fn section(
    dir: &Path,
    g: &Garage,
    key: &ArchiveKey,
    snapshot_every_mib: u64,
) -> ArchiveSection {
    use std::os::unix::fs::PermissionsExt;
    let creds = dir.join("s3.toml");
    std::fs::write(
        &creds,
        format!(
            "access_key_id = \"{}\"\nsecret_access_key = \"{}\"\n",
            garage::KEY_ID,
            garage::SECRET
        ),
    )
    .expect("write the credentials");
    let key_file = dir.join("archive.key");
    std::fs::write(&key_file, key.to_file_text()).expect("write the key");
    for f in [&creds, &key_file] {
        std::fs::set_permissions(f, std::fs::Permissions::from_mode(0o600)).expect("chmod 0600");
    }
    ArchiveSection {
        url: format!("s3://{}/pair", garage::BUCKET),
        endpoint: Some(g.endpoint(0)),
        region: garage::REGION.into(),
        credentials_file: Some(creds),
        uploader: Uploader::Twin,
        zstd_level: 1,
        key_file: Some(key_file),
        max_mib_per_s: 0,
        snapshot_every_mib,
    }
}
