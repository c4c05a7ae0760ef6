//! Output files that appear whole or not at all: bytes go to a temporary
//! file beside the target, which replaces the target only once everything
//! is written and synced. A failed command leaves an existing file as it
//! was.

use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};

use twinlog::daemon::{DaemonError, IoAt};

/// A file being written in place of `target`.
pub struct OutFile {
    target: PathBuf,
    tmp: PathBuf,
    /// Set once renamed: nothing left to clean up.
    done: bool,
}

impl OutFile {
    /// Start writing `target`; answers the file to write to.
    pub fn create(target: &Path) -> Result<(OutFile, File), DaemonError> {
        let name = target
            .file_name()
            .ok_or_else(|| DaemonError::Usage(format!("{} names no file", target.display())))?;
        let mut tmp_name = std::ffi::OsString::from(".");
        tmp_name.push(name);
        tmp_name.push(format!(".{}.tmp", std::process::id()));
        let tmp = target.with_file_name(tmp_name);
        let file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&tmp)
            .at("creating", &tmp)?;
        Ok((
            OutFile {
                target: target.to_owned(),
                tmp,
                done: false,
            },
            file,
        ))
    }

    /// Everything is written to `file`: make it durable and put it in
    /// place of the target.
    pub fn commit(mut self, file: File) -> Result<u64, DaemonError> {
        file.sync_all().at("syncing", &self.tmp)?;
        let len = file.metadata().at("reading the size of", &self.tmp)?.len();
        drop(file);
        std::fs::rename(&self.tmp, &self.target).at("replacing", &self.target)?;
        self.done = true;
        Ok(len)
    }
}

impl Drop for OutFile {
    fn drop(&mut self) {
        if !self.done {
            let _ = std::fs::remove_file(&self.tmp);
        }
    }
}

/// Write `bytes` to `target` whole or not at all; answers the length.
pub fn write(target: &Path, bytes: &[u8]) -> Result<u64, DaemonError> {
    let (out, mut file) = OutFile::create(target)?;
    std::io::Write::write_all(&mut file, bytes).at("writing", &out.tmp)?;
    out.commit(file)
}
