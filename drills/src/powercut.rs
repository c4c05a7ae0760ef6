//! The check of one disk state of the power-cut drill: the file system
//! mounted from a scratch copy (so ext4 replays its journal, as a reboot
//! would), the log opened, every retained frame verified and matched to its
//! name, and every acknowledgement the state's markers hold found intact.
//!
//! A frame is known by its position: the workload's record (the markers of
//! the final disk, one per frame) says which frame each sequence holds. A
//! live frame must also carry that name in its meta; an erased one carries
//! no meta, so its record alone names it.

use std::collections::BTreeMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use twinlog::log::{format, Kind, Log};

use crate::content::{name_of_meta, Frame};
use crate::marker::{Ack, Marker};
use crate::{Context, DrillError, Result};

/// What one state held.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StateCheck {
    /// Frames the recovered log holds (acknowledged or not), all verified.
    pub frames: u64,
    /// Acknowledged frames the markers name, every one found intact.
    pub acked: u64,
    /// Frames found erased.
    pub erased: u64,
    /// Whether the state holds the erase's acknowledgement.
    pub erase_acked: bool,
    /// Whether the state holds the workload's last marker.
    pub done: bool,
}

/// What the workload recorded of the frame at one sequence.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Recorded {
    pub name: String,
    pub kind: u16,
    pub crc: u32,
}

/// The workload's record of every frame it had acknowledged, by sequence:
/// the frame markers of a disk that holds the workload's last marker.
/// Refused when two markers name different frames at one sequence.
pub fn record_of(markers: &[Marker]) -> Result<BTreeMap<u64, Recorded>> {
    let mut out: BTreeMap<u64, Recorded> = BTreeMap::new();
    for m in markers {
        let Ack::Frame {
            seq,
            kind,
            crc,
            name,
        } = &m.ack
        else {
            continue;
        };
        let r = Recorded {
            name: name.clone(),
            kind: *kind,
            crc: *crc,
        };
        if let Some(was) = out.insert(*seq, r.clone()) {
            if was != r {
                return Err(DrillError(format!(
                    "the workload recorded two frames at {seq}: {} and {}",
                    was.name, r.name
                )));
            }
        }
    }
    Ok(out)
}

/// A file system mounted from an image; unmounted when dropped.
pub struct Mounted {
    at: PathBuf,
}

impl Mounted {
    /// Mount the ext4 image `image` read-write (ext4 replays its journal,
    /// as a reboot does) at `at`.
    pub fn mount(image: &Path, at: &Path) -> Result<Mounted> {
        std::fs::create_dir_all(at).ctx(|| format!("create {}", at.display()))?;
        let out = Command::new("mount")
            .args(["-t", "ext4", "-o", "loop,rw"])
            .arg(image)
            .arg(at)
            .output()
            .ctx(|| "run mount".into())?;
        if !out.status.success() {
            return Err(DrillError(format!(
                "mount {}: {}",
                image.display(),
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
        Ok(Mounted { at: at.to_owned() })
    }

    pub fn unmount(mut self) -> Result<()> {
        let at = std::mem::take(&mut self.at);
        umount(&at)
    }
}

fn umount(at: &Path) -> Result<()> {
    let out = Command::new("umount")
        .arg(at)
        .output()
        .ctx(|| "run umount".into())?;
    if !out.status.success() {
        return Err(DrillError(format!(
            "umount {}: {}",
            at.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(())
}

impl Drop for Mounted {
    fn drop(&mut self) {
        if !self.at.as_os_str().is_empty() {
            if let Err(e) = umount(&self.at) {
                eprintln!("{e}");
            }
        }
    }
}

fn fail(state: &str, what: String) -> DrillError {
    DrillError(format!("{state}: {what}"))
}

/// Check the state whose file system is in `image` (modified: it is
/// mounted read-write) against the markers read from the same state.
pub fn check_image(
    state: &str,
    image: &Path,
    mnt: &Path,
    segment: u64,
    markers: &[Marker],
    record: &BTreeMap<u64, Recorded>,
) -> Result<StateCheck> {
    let mounted = Mounted::mount(image, mnt).map_err(|e| fail(state, e.0))?;
    let checked = check_dir(state, &mnt.join("log"), segment, markers, record);
    let unmounted = mounted.unmount();
    let checked = checked?;
    unmounted?;
    Ok(checked)
}

/// The blob bytes of an erased frame are zeros.
fn blob_is_zero(log: &Log, seq: u64) -> Result<bool> {
    let loc = log.locate_blob(seq).ctx(|| format!("locate {seq}"))?;
    let file = File::open(&loc.segment).ctx(|| format!("open {}", loc.segment.display()))?;
    let mut buf = vec![0u8; 1 << 16];
    let mut at = 0u64;
    while at < loc.blob_len {
        let n = (loc.blob_len - at).min(buf.len() as u64) as usize;
        file.read_exact_at(&mut buf[..n], loc.blob_offset + at)
            .ctx(|| format!("blob of {seq} at {}", loc.blob_offset + at))?;
        if buf[..n].iter().any(|&b| b != 0) {
            return Ok(false);
        }
        at += n as u64;
    }
    Ok(true)
}

/// The check proper, on a mounted log directory; `record` is the
/// workload's record of every frame ([`record_of`]).
pub fn check_dir(
    state: &str,
    dir: &Path,
    segment: u64,
    markers: &[Marker],
    record: &BTreeMap<u64, Recorded>,
) -> Result<StateCheck> {
    let mut c = StateCheck::default();
    let mut erase_before = None;
    for m in markers {
        match &m.ack {
            Ack::Frame { .. } => c.acked += 1,
            Ack::Erase { before, .. } => erase_before = Some(*before),
            Ack::Done => c.done = true,
            // The pair drill's; this workload writes none.
            Ack::Durable { .. } => {}
        }
    }
    c.erase_acked = erase_before.is_some();
    if !dir.exists() {
        if c.acked > 0 {
            return Err(fail(
                state,
                format!("no log directory, with {} frames acknowledged", c.acked),
            ));
        }
        return Ok(c);
    }
    let log = Log::open_with(dir, segment).map_err(|e| fail(state, format!("open: {e}")))?;
    let verified = log
        .verify()
        .map_err(|e| fail(state, format!("verify: {e}")))?;
    let (first, head) = (log.first_seq(), log.head_seq());
    if first != 1 {
        return Err(fail(
            state,
            format!("first sequence {first}, nothing was dropped"),
        ));
    }
    if verified != head {
        return Err(fail(
            state,
            format!("verify checked {verified} frames of {head}"),
        ));
    }
    c.frames = head;
    // Every frame, acknowledged or not, is the one the workload wrote at
    // its sequence.
    let mut found: Vec<(u16, String, u32)> = Vec::with_capacity(head as usize);
    for seq in 1..=head {
        let e = log
            .read(seq)
            .map_err(|e| fail(state, format!("read {seq}: {e}")))?;
        let recorded = record.get(&seq);
        let erased = e.kind == Kind::Redacted.as_u16();
        // An erase leaves no meta: the record names an erased frame.
        let name = match (erased, recorded) {
            (true, Some(r)) => r.name.clone(),
            (true, None) => {
                return Err(fail(
                    state,
                    format!("frame {seq} is erased and the workload recorded no frame there"),
                ))
            }
            (false, _) => {
                name_of_meta(&e.meta).map_err(|e| fail(state, format!("frame {seq}: {e}")))?
            }
        };
        match recorded {
            Some(r) if r.name != name => {
                return Err(fail(
                    state,
                    format!("frame {seq} is {name}, the workload wrote {} there", r.name),
                ))
            }
            None => {
                return Err(fail(
                    state,
                    format!("frame {seq} ({name}) is not in the workload's record"),
                ))
            }
            Some(_) => {}
        }
        let f = Frame::named(&name).map_err(|e| fail(state, format!("frame {seq}: {e}")))?;
        let want_crc = f.payload_crc()?;
        if erased {
            if !f.erasable() {
                return Err(fail(
                    state,
                    format!("frame {seq} ({name}) is erased; no erase matches it"),
                ));
            }
            // Meta and blob become one blob of zeros of the same length,
            // its crc over those zeros.
            let loc = log
                .locate_blob(seq)
                .map_err(|e| fail(state, format!("locate {seq}: {e}")))?;
            let len = f.meta.len() as u64 + f.blob_len;
            if !loc.meta.is_empty() || loc.blob_len != len {
                return Err(fail(
                    state,
                    format!(
                        "erased frame {seq} ({name}) holds {} meta and {} blob bytes, {len} bytes of zeros were due",
                        loc.meta.len(),
                        loc.blob_len
                    ),
                ));
            }
            if e.payload_crc != format::crc_of_zeros(len) {
                return Err(fail(
                    state,
                    format!(
                        "erased frame {seq} ({name}) carries crc {:08x}, not the crc of its zeros",
                        e.payload_crc
                    ),
                ));
            }
            c.erased += 1;
        } else {
            if e.payload_crc != want_crc {
                return Err(fail(
                    state,
                    format!(
                        "frame {seq} ({name}) carries crc {:08x}, its name says {want_crc:08x}",
                        e.payload_crc
                    ),
                ));
            }
            if e.kind != f.kind.as_u16() {
                return Err(fail(
                    state,
                    format!("frame {seq} ({name}) has kind {}", e.kind),
                ));
            }
            if e.blob != f.blob()? {
                return Err(fail(state, format!("frame {seq} ({name}): blob differs")));
            }
        }
        // An erased frame is compared with its acknowledgement by name and
        // position: its own crc is of zeros.
        found.push((e.kind, name, want_crc));
    }
    // Acknowledged ⇒ durable.
    for m in markers {
        let Ack::Frame {
            seq,
            kind,
            crc,
            name,
        } = &m.ack
        else {
            continue;
        };
        let Some((got_kind, got_name, got_crc)) =
            seq.checked_sub(1).and_then(|i| found.get(i as usize))
        else {
            return Err(fail(state, format!("LOST: frame {seq} ({name}) acknowledged in marker slot {}, the log's head is {head}", m.slot)));
        };
        let erased_ok = *got_kind == Kind::Redacted.as_u16() && Frame::named(name)?.erasable();
        if got_name != name || got_crc != crc || (got_kind != kind && !erased_ok) {
            return Err(fail(state, format!(
                "LOST: frame {seq} acknowledged as {name} (kind {kind}, crc {crc:08x}) holds {got_name} (kind {got_kind}, crc {got_crc:08x})"
            )));
        }
    }
    // An erase that returned: every frame of the repository below `before`
    // is erased and its bytes are gone.
    if let Some(before) = erase_before {
        if before > head + 1 {
            return Err(fail(
                state,
                format!("erase before {before} acknowledged, the log's head is {head}"),
            ));
        }
        for seq in 1..before {
            let (kind, name, _) = &found[(seq - 1) as usize];
            if !Frame::named(name)?.erasable() {
                continue;
            }
            if *kind != Kind::Redacted.as_u16() {
                return Err(fail(
                    state,
                    format!(
                        "erase before {before} acknowledged, frame {seq} ({name}) is not erased"
                    ),
                ));
            }
            if !blob_is_zero(&log, seq).map_err(|e| fail(state, e.0))? {
                return Err(fail(state, format!("erase before {before} acknowledged, frame {seq} ({name}) still holds blob bytes")));
            }
        }
    }
    Ok(c)
}
