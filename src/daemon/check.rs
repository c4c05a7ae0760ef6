//! `check-log`: every frame of a log read and checked, without opening it
//! for writing.

use super::*;

/// What `check-log` found.
#[derive(Debug, Default)]
pub struct LogCheck {
    pub first: u64,
    pub last: u64,
    pub frames: u64,
    pub bytes: u64,
    pub erased: u64,
}

impl std::fmt::Display for LogCheck {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "frames {}..={} ({} frames, {} erased, {:.1} MiB): every crc checks",
            self.first,
            self.last,
            self.frames,
            self.erased,
            self.bytes as f64 / 1048576.0
        )
    }
}

/// Read every durable frame of a log directory and check its crc, a piece
/// at a time, without taking the log's lock or writing anything: safe
/// while a daemon runs. A damaged frame is an error naming it.
pub fn check_log(dir: &Path) -> Result<LogCheck, DaemonError> {
    let mut tail = crate::log::Tail::open(dir, 0).map_err(|error| DaemonError::LogUnread {
        dir: dir.to_owned(),
        error,
        absent: !dir.exists(),
    })?;
    let mut c = LogCheck::default();
    while let Some(h) = tail.next_checked()? {
        if c.frames == 0 {
            c.first = h.seq;
        }
        c.last = h.seq;
        c.frames += 1;
        c.bytes += h.frame_len();
        if h.kind == crate::log::Kind::Redacted.as_u16() {
            c.erased += 1;
        }
    }
    Ok(c)
}
