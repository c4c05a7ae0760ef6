//! What several integration tests share: copying a directory tree (a crash
//! "snapshot" of a box) and finding the files that hold some bytes.

#![allow(dead_code)] // each test uses its own part

use std::path::{Path, PathBuf};

/// Copy a directory tree, as a crash would leave it for the next start.
pub fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("mkdir");
    for e in std::fs::read_dir(from).expect("read_dir") {
        let e = e.expect("entry");
        let dest = to.join(e.file_name());
        if e.file_type().expect("type").is_dir() {
            copy_dir(&e.path(), &dest);
        } else {
            std::fs::copy(e.path(), &dest).expect("copy");
        }
    }
}

/// Every file under `dir` whose bytes contain `needle`.
pub fn files_containing(dir: &Path, needle: &[u8]) -> Vec<PathBuf> {
    let mut out = Vec::new();
    walk(dir, needle, &mut out);
    out
}

fn walk(dir: &Path, needle: &[u8], out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).expect("read_dir") {
        let e = e.expect("entry");
        let ty = e.file_type().expect("type");
        if ty.is_dir() {
            walk(&e.path(), needle, out);
        } else if ty.is_file() {
            let b = std::fs::read(e.path()).expect("read");
            if b.windows(needle.len()).any(|w| w == needle) {
                out.push(e.path());
            }
        }
    }
}
