//! What both benchmarks share: the JSON line they print per case, and the
//! raw files their device baselines write.

#![allow(dead_code)] // each bench uses its own part

use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::Path;

pub const MIB: u64 = 1 << 20;

/// One JSON line: fields in order, values already encoded.
pub struct Line {
    pub value: f64,
    pub fields: Vec<(&'static str, String)>,
}

impl Line {
    pub fn new(bench: &str, case: &str, value: f64, unit: &str) -> Line {
        Line {
            value,
            fields: vec![
                ("bench", json_str(bench)),
                ("case", json_str(case)),
                ("value", json_num(value)),
                ("unit", json_str(unit)),
            ],
        }
    }

    /// The case this one is compared with, and `ratio` = value / baseline.
    pub fn baseline(mut self, case: &str, baseline: f64) -> Line {
        let ratio = self.value / baseline;
        self.fields.push(("baseline", json_str(case)));
        self.fields.push(("ratio", json_num(ratio)));
        self
    }

    pub fn target(mut self, target: f64) -> Line {
        self.fields.push(("target", json_num(target)));
        self
    }

    pub fn lower_is_better(mut self) -> Line {
        self.fields.push(("lower_is_better", "true".into()));
        self
    }

    pub fn num(mut self, key: &'static str, v: f64) -> Line {
        self.fields.push((key, json_num(v)));
        self
    }

    pub fn int(mut self, key: &'static str, v: u64) -> Line {
        self.fields.push((key, v.to_string()));
        self
    }

    pub fn text(mut self, key: &'static str, v: &str) -> Line {
        self.fields.push((key, json_str(v)));
        self
    }

    pub fn flag(mut self, key: &'static str, v: bool) -> Line {
        self.fields.push((key, v.to_string()));
        self
    }

    /// Print the line to stdout; answers the value for later ratios.
    pub fn print(self) -> f64 {
        let body: Vec<String> = self
            .fields
            .iter()
            .map(|(k, v)| format!("{}:{v}", json_str(k)))
            .collect();
        println!("{{{}}}", body.join(","));
        self.value
    }
}

/// A JSON string of plain ASCII names (no escaping needed, checked).
pub fn json_str(s: &str) -> String {
    assert!(
        s.bytes()
            .all(|c| c.is_ascii_graphic() && c != b'"' && c != b'\\'),
        "{s:?} needs escaping"
    );
    format!("\"{s}\"")
}

/// A JSON number with at most 3 decimals; JSON has no NaN or infinity.
pub fn json_num(v: f64) -> String {
    if !v.is_finite() {
        return "null".into();
    }
    let s = format!("{v:.3}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    if s == "-0" {
        "0".into()
    } else {
        s.to_string()
    }
}

pub fn mib_per_s(bytes: u64, secs: f64) -> f64 {
    bytes as f64 / MIB as f64 / secs
}

/// A file of `len` bytes preallocated with fallocate mode 0 and fsynced, so
/// the timed loop pays for writes and syncs only.
pub fn preallocated(path: &Path, len: u64) -> File {
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(path)
        .expect("create the raw file");
    let len = libc::off_t::try_from(len).expect("length fits off_t");
    // SAFETY: fallocate takes a descriptor `f` owns, open for the call, and
    // integers.
    let ret = unsafe { libc::fallocate(f.as_raw_fd(), 0, 0, len) };
    assert_eq!(ret, 0, "fallocate: {}", std::io::Error::last_os_error());
    f.sync_all().expect("fsync the preallocated file");
    f
}

/// A buffer that is not all zeros, so nothing can shortcut it.
pub fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 131 + 7) as u8).collect()
}

/// Flush the file system `root` is on, so no case pays for an earlier
/// one's writeback.
pub fn syncfs(root: &Path) {
    let dir = File::open(root).expect("open the bench's root dir");
    // SAFETY: syncfs takes a descriptor `dir` owns, open for the call.
    let ret = unsafe { libc::syncfs(dir.as_raw_fd()) };
    assert_eq!(ret, 0, "syncfs: {}", std::io::Error::last_os_error());
}

/// Put `bytes` of data through the page cache and drop it unwritten (a
/// file deleted before any writeback), so the timed write that follows
/// finds the guest's memory warm: on a VM whose host reclaims idle guest
/// memory, the first hundreds of MiB written after a pause otherwise cost
/// host page faults.
pub fn warm_page_cache(root: &Path, bytes: u64) {
    let path = root.join("warm.tmp");
    let f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&path)
        .expect("create the warm-up file");
    let buf = pattern(MIB as usize);
    let mut at = 0;
    while at < bytes {
        f.write_all_at(&buf, at).expect("warm-up pwrite");
        at += MIB;
    }
    drop(f);
    std::fs::remove_file(&path).expect("remove the warm-up file");
}
