//! What the failover cycle reads back: a stopped box's frames, and the
//! tail a rejoin saved.

use std::collections::BTreeMap;
use std::path::Path;

use twinlog::log::Log;
use twinlog::repl::epochs::EpochName;

use drills::daemons::Seen;
use drills::{Context, Result};

use super::writers::Ack;
use crate::Outcome;

/// Frames `from..` of a stopped box's log, opened as its daemon would open
/// it: a live tail stops at the last frame whose index entry a SIGKILL left
/// unwritten, and opening recovers it.
pub fn stopped_frames(log_dir: &Path, from: u64) -> Result<(u64, BTreeMap<u64, Seen>)> {
    let log = Log::open_with(log_dir, 1 << 20).ctx(|| format!("open {}", log_dir.display()))?;
    let mut out = BTreeMap::new();
    for seq in from.max(log.first_seq())..=log.head_seq() {
        let e = log.read(seq).ctx(|| format!("read frame {seq}"))?;
        out.insert(
            seq,
            Seen {
                kind: e.kind,
                meta: e.meta,
                blob_len: e.blob.len() as u64,
                blob_crc: crc32fast::hash(&e.blob),
                blob: Some(e.blob),
            },
        );
    }
    Ok((log.head_seq(), out))
}

pub fn wire(f: &Seen) -> u64 {
    32 + f.meta.len() as u64 + f.blob_len
}

/// Check the tail the rejoin saved for epoch `epoch` against the old
/// primary's frames read before it; answers the fork it names.
#[allow(clippy::too_many_arguments)]
pub fn check_saved(
    out: &mut Outcome,
    round: u64,
    epoch: u64,
    data: &Path,
    promoted_head: u64,
    x_head: u64,
    x_before: &BTreeMap<u64, Seen>,
    acked: &[Ack],
    old_acked: &[Ack],
) -> Option<u64> {
    use twinlog::node::divergent;
    let tails = match divergent::list(data) {
        Ok(t) => t,
        Err(e) => {
            out.fail(format!("round {round}: listing the saved tails: {e}"));
            return None;
        }
    };
    let tails: Vec<_> = tails.into_iter().filter(|t| t.new_epoch == epoch).collect();
    let want: BTreeMap<u64, Seen> = x_before
        .range(promoted_head + 1..)
        .map(|(s, f)| (*s, f.clone()))
        .collect();
    if tails.is_empty() {
        if !want.is_empty() || x_head > promoted_head {
            out.fail(format!(
                "round {round}: no saved tail, though the old primary held {} frames past {promoted_head}",
                want.len()
            ));
            return None;
        }
        return Some(x_head);
    }
    if tails.len() > 1 {
        out.fail(format!(
            "round {round}: {} saved tails for epoch {}",
            tails.len(),
            EpochName(epoch)
        ));
    }
    let t = &tails[0];
    let mut saved = BTreeMap::new();
    let path = data.join(divergent::DIVERGENT_DIR).join(&t.file);
    let read = divergent::read(
        &path,
        |_| true,
        |f, meta, blob| {
            saved.insert(
                f.seq,
                Seen {
                    kind: f.kind,
                    meta: meta.to_vec(),
                    blob_len: f.blob_len,
                    blob_crc: crc32fast::hash(blob),
                    blob: Some(blob.to_vec()),
                },
            );
            Ok(())
        },
    );
    if let Err(e) = read {
        out.fail(format!(
            "round {round}: the saved tail {} cannot be read: {e}",
            path.display()
        ));
        return Some(t.fork);
    }
    let want: BTreeMap<u64, Seen> = x_before
        .range(t.fork + 1..)
        .map(|(s, f)| (*s, f.clone()))
        .collect();
    if saved != want || t.first != t.fork + 1 || t.last != x_head || t.frames != want.len() as u64 {
        let differ = want.iter().filter(|(s, f)| saved.get(s) != Some(f)).count()
            + saved.keys().filter(|s| !want.contains_key(s)).count();
        out.fail(format!(
            "round {round}: the saved tail {}..={} ({} frames) is not the old primary's {} frames past the fork {} ({differ} differ)",
            t.first,
            t.last,
            saved.len(),
            want.len(),
            t.fork
        ));
    }
    for a in acked.iter().chain(old_acked) {
        if a.seq > t.fork && !saved.get(&a.seq).is_some_and(|f| a.is(f)) {
            out.fail(format!(
                "round {round}: frame {} acknowledged {:?} past the fork is not in the saved tail as written",
                a.seq, a.got
            ));
            break;
        }
    }
    Some(t.fork)
}
