//! Sealing: every push of a log as an Arrow IPC file inside an archive of
//! named sections, which any Arrow reader can read back.

use std::path::Path;

use super::codec::{from_batch, schema, to_batch};
use super::{ipc, Push, PushLog, PushLogError};
use crate::publish::sync_parent_with;
use crate::storage::{OpenMode, StdStorage, Storage};

/// The name of the push log's section in a sealed archive.
pub const SEALED_SECTION: &str = "pushlog";

/// Sealed archive magic, after the manifest at the end of the file.
pub const ARCHIVE_MAGIC: [u8; 8] = *b"\x89TWA\r\n\x1a\n";

/// Pushes as an Arrow IPC file, one RecordBatch per push, so the push
/// boundaries survive sealing and any Arrow reader reads them.
pub fn seal(pushes: &[Push]) -> Result<Vec<u8>, PushLogError> {
    let schema = schema();
    let mut w = arrow_ipc::writer::FileWriter::try_new(Vec::new(), &schema)?;
    for push in pushes {
        w.write(&to_batch(push)?)?;
    }
    w.finish()?;
    Ok(w.into_inner()?)
}

/// An archive of named sections: the sections back to back, then a
/// manifest (per section: name length u16, name, offset u64, length u64),
/// its length u32, and [`ARCHIVE_MAGIC`]. Little-endian. A reader finds a
/// section's byte range from the manifest and needs no twinlog code.
pub fn write_archive(path: &Path, sections: &[(&str, Vec<u8>)]) -> Result<(), PushLogError> {
    write_archive_with(&StdStorage, path, sections)
}

/// [`write_archive`] through `fs`.
pub fn write_archive_with(
    fs: &dyn Storage,
    path: &Path,
    sections: &[(&str, Vec<u8>)],
) -> Result<(), PushLogError> {
    let mut out = Vec::new();
    let mut manifest = Vec::new();
    for (name, bytes) in sections {
        let name_len = u16::try_from(name.len())
            .map_err(|_| PushLogError::Shape("section name too long".into()))?;
        manifest.extend_from_slice(&name_len.to_le_bytes());
        manifest.extend_from_slice(name.as_bytes());
        manifest.extend_from_slice(&(out.len() as u64).to_le_bytes());
        manifest.extend_from_slice(&(bytes.len() as u64).to_le_bytes());
        out.extend_from_slice(bytes);
    }
    out.extend_from_slice(&manifest);
    out.extend_from_slice(&(manifest.len() as u32).to_le_bytes());
    out.extend_from_slice(&ARCHIVE_MAGIC);
    let tmp = path.with_extension("tmp");
    {
        let f = fs.open(&tmp, OpenMode::Create)?;
        f.set_len(0)?;
        f.write_all_at(&out, 0)?;
        f.sync_all()?;
    }
    fs.rename(&tmp, path)?;
    sync_parent_with(fs, path)?;
    Ok(())
}

/// Where section `name` starts in an archive and its bytes, None when it
/// has none.
fn section<'a>(archive: &'a [u8], name: &str) -> Result<Option<(u64, &'a [u8])>, PushLogError> {
    let bad = |what: &str| PushLogError::Shape(format!("archive: {what}"));
    let n = archive.len();
    if n < 12 || archive[n - 8..] != ARCHIVE_MAGIC {
        return Err(bad("no archive magic at the end"));
    }
    let mlen = u32::from_le_bytes([
        archive[n - 12],
        archive[n - 11],
        archive[n - 10],
        archive[n - 9],
    ]) as usize;
    let mstart = n
        .checked_sub(12 + mlen)
        .ok_or_else(|| bad("manifest longer than the file"))?;
    let mut m = &archive[mstart..n - 12];
    while !m.is_empty() {
        let take = |m: &mut &[u8], k: usize| -> Result<Vec<u8>, PushLogError> {
            if m.len() < k {
                return Err(PushLogError::Shape("archive: manifest cut short".into()));
            }
            let (a, b) = m.split_at(k);
            *m = b;
            Ok(a.to_vec())
        };
        let len = u16::from_le_bytes(
            take(&mut m, 2)?
                .try_into()
                .map_err(|_| bad("name length"))?,
        ) as usize;
        let sname = take(&mut m, len)?;
        let off =
            u64::from_le_bytes(take(&mut m, 8)?.try_into().map_err(|_| bad("offset"))?) as usize;
        let slen =
            u64::from_le_bytes(take(&mut m, 8)?.try_into().map_err(|_| bad("length"))?) as usize;
        if sname == name.as_bytes() {
            let end = off
                .checked_add(slen)
                .filter(|&e| e <= mstart)
                .ok_or_else(|| bad("section past the manifest"))?;
            return Ok(Some((off as u64, &archive[off..end])));
        }
    }
    Ok(None)
}

/// Read the sealed push log back out of an archive: Ok(None) when the
/// archive has no push-log section, distinct from a section with no pushes.
pub fn read_sealed(archive: &Path) -> Result<Option<Vec<Push>>, PushLogError> {
    read_sealed_with(&StdStorage, archive)
}

/// [`read_sealed`] through `fs`.
pub fn read_sealed_with(
    fs: &dyn Storage,
    archive: &Path,
) -> Result<Option<Vec<Push>>, PushLogError> {
    let bytes = fs.read(archive)?;
    let Some((base, section)) = section(&bytes, SEALED_SECTION)? else {
        return Ok(None);
    };
    let corrupt = |offset: u64, why: String| PushLogError::Corrupt {
        path: archive.to_owned(),
        offset: base + offset,
        why,
    };
    let batches = ipc::decode_file(section).map_err(|(at, why)| corrupt(at, why))?;
    let mut pushes = Vec::new();
    for (at, batch) in &batches {
        pushes.push(from_batch(batch).map_err(|e| corrupt(*at, e.to_string()))?);
    }
    Ok(Some(pushes))
}

impl PushLog {
    /// Seal every push ever appended (the archive's, then the live log's)
    /// into the `pushlog` section of an archive at `archive`.
    pub fn seal_into(&self, archive: &Path) -> Result<usize, PushLogError> {
        let history = self.history()?;
        write_archive_with(&*self.fs, archive, &[(SEALED_SECTION, seal(&history)?)])?;
        Ok(history.len())
    }
}
