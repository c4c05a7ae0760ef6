//! The auto-failover drill's record of acknowledgements and its checks
//! (`auto-failover-drill`): what each writer was answered, under which
//! epoch and when, and whether that order and the logs hold.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use twinlog::repl::epochs::EpochName;

use crate::daemons::read_log;
use crate::Result;

/// The kind of the drill's frames (an application kind).
pub const KIND: u16 = 0x8000;

pub fn wall_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// One acknowledgement as the writer got it.
#[derive(Clone, Debug)]
pub struct Ack {
    pub writer: u32,
    pub n: u64,
    pub seq: u64,
    /// Answered `twin` (only those must survive a failover).
    pub twin: bool,
    /// The epoch the answering primary served under, from its status on
    /// the same connection.
    pub epoch: u64,
    /// The box that answered (0: A, 1: B).
    pub on: usize,
    /// Wall time the append was sent and its answer arrived.
    pub sent_ns: u64,
    pub at_ns: u64,
    pub crc: u32,
}

pub fn meta(writer: u32, n: u64) -> Vec<u8> {
    format!("w{writer} n{n}").into_bytes()
}

pub fn blob(writer: u32, n: u64) -> Vec<u8> {
    crate::content::bytes(((writer as u64) << 40) | n, 40 + (n as usize * 37) % 200)
}

/// The faults a round picks from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    KillPrimary,
    KillTwin,
    CutPrimaryEtcd,
    CutPrimaryTwin,
    CutTwinEtcd,
    IsolatePrimary,
    StopPrimary,
    /// etcd loses every key, both boxes up.
    WipeEtcd,
    /// etcd restored from a snapshot taken earlier in the run.
    RollbackEtcd,
    /// etcd answers late: frozen, then thawed.
    SlowEtcd,
    /// The primary killed, its twin taking over; that one killed too,
    /// etcd's data lost, and the deposed box started first.
    DeposedFirstAfterWipe,
}

pub const FAULTS: [Fault; 11] = [
    Fault::KillPrimary,
    Fault::KillTwin,
    Fault::CutPrimaryEtcd,
    Fault::CutPrimaryTwin,
    Fault::CutTwinEtcd,
    Fault::IsolatePrimary,
    Fault::StopPrimary,
    Fault::WipeEtcd,
    Fault::RollbackEtcd,
    Fault::SlowEtcd,
    Fault::DeposedFirstAfterWipe,
];

impl Fault {
    pub fn name(self) -> &'static str {
        match self {
            Fault::KillPrimary => "kill-primary",
            Fault::KillTwin => "kill-twin",
            Fault::CutPrimaryEtcd => "cut-primary-etcd",
            Fault::CutPrimaryTwin => "cut-primary-twin",
            Fault::CutTwinEtcd => "cut-twin-etcd",
            Fault::IsolatePrimary => "isolate-primary",
            Fault::StopPrimary => "stop-primary",
            Fault::WipeEtcd => "wipe-etcd",
            Fault::RollbackEtcd => "rollback-etcd",
            Fault::SlowEtcd => "slow-etcd",
            Fault::DeposedFirstAfterWipe => "deposed-first-after-wipe",
        }
    }
}

/// An acknowledgement under an older epoch asked after the first answer
/// under a newer one: (acks so, the same by answer time, the worst, in ms
/// past that first answer, and a description of it).
pub fn epoch_order(acks: &[Ack]) -> (u64, u64, f64, Option<String>) {
    let mut first: BTreeMap<u64, (u64, usize)> = BTreeMap::new();
    for a in acks {
        let e = first.entry(a.epoch).or_insert((a.at_ns, a.on));
        if a.at_ns < e.0 {
            *e = (a.at_ns, a.on);
        }
    }
    // For each epoch, the first answer under any newer one.
    let mut newer: BTreeMap<u64, (u64, u64, usize)> = BTreeMap::new();
    let mut best: Option<(u64, u64, usize)> = None;
    for (&epoch, &(at, on)) in first.iter().rev() {
        if let Some(b) = best {
            newer.insert(epoch, b);
        }
        if best.is_none_or(|b| at < b.0) {
            best = Some((at, epoch, on));
        }
    }
    let (mut sure, mut by_answer, mut worst, mut said) = (0u64, 0u64, 0f64, None);
    for a in acks {
        let Some(&(at, epoch, on)) = newer.get(&a.epoch) else {
            continue;
        };
        if a.at_ns > at {
            by_answer += 1;
        }
        if a.sent_ns > at {
            sure += 1;
            let past = (a.sent_ns - at) as f64 / 1e6;
            if past > worst {
                worst = past;
                said = Some(format!(
                    "frame {} (writer {} #{}) acknowledged by box {} under epoch {}, asked {past:.1} ms after box {} first answered under epoch {}",
                    a.seq,
                    a.writer,
                    a.n,
                    ["A", "B"][a.on],
                    EpochName(a.epoch),
                    ["A", "B"][on],
                    EpochName(epoch),
                ));
            }
        }
    }
    (sure, by_answer, worst, said)
}

/// Epochs under which both boxes acknowledged: an epoch taken twice.
/// Each is named with how many acknowledgements each box gave under it.
pub fn epochs_on_two_boxes(acks: &[Ack]) -> Vec<String> {
    let mut on: BTreeMap<u64, [u64; 2]> = BTreeMap::new();
    for a in acks {
        on.entry(a.epoch).or_default()[a.on.min(1)] += 1;
    }
    on.into_iter()
        .filter(|(_, n)| n[0] > 0 && n[1] > 0)
        .map(|(e, n)| {
            format!(
                "epoch {} acknowledged by box A {} times and by box B {} times",
                EpochName(e),
                n[0],
                n[1]
            )
        })
        .collect()
}

/// The least gap, in ms, between the last answer under an epoch and the
/// first under a newer one (negative: they overlapped), over every epoch
/// that was followed by another.
pub fn least_gap(acks: &[Ack]) -> Option<f64> {
    let mut span: BTreeMap<u64, (u64, u64)> = BTreeMap::new();
    for a in acks {
        let e = span.entry(a.epoch).or_insert((a.at_ns, a.at_ns));
        e.0 = e.0.min(a.at_ns);
        e.1 = e.1.max(a.at_ns);
    }
    let spans: Vec<(u64, u64)> = span.into_values().collect();
    let mut least: Option<f64> = None;
    for (i, &(_, last)) in spans.iter().enumerate() {
        let Some(first_newer) = spans[i + 1..].iter().map(|s| s.0).min() else {
            continue;
        };
        let gap = (first_newer as f64 - last as f64) / 1e6;
        least = Some(least.map_or(gap, |l: f64| l.min(gap)));
    }
    least
}

/// The `twin` acknowledgements missing or different in the log at `log`
/// (read without its lock), with the first few named.
pub fn missing_in(log: &Path, acks: &[&Ack]) -> Result<(u64, Vec<String>)> {
    let frames = read_log(log, 0, 0)?;
    let (mut lost, mut named) = (0u64, Vec::new());
    for a in acks {
        let ok = frames.get(&a.seq).is_some_and(|f| {
            f.kind == KIND && f.meta == meta(a.writer, a.n) && f.blob_crc == a.crc
        });
        if !ok {
            lost += 1;
            if named.len() < 5 {
                named.push(format!(
                    "frame {} (writer {} #{}, epoch {}) {}",
                    a.seq,
                    a.writer,
                    a.n,
                    EpochName(a.epoch),
                    match frames.get(&a.seq) {
                        None => "is not there".to_owned(),
                        Some(f) => format!("holds {:?}", String::from_utf8_lossy(&f.meta)),
                    }
                ));
            }
        }
    }
    Ok((lost, named))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ack(epoch: u64, on: usize, sent_ms: u64, at_ms: u64) -> Ack {
        Ack {
            writer: 0,
            n: sent_ms,
            seq: sent_ms,
            twin: false,
            epoch,
            on,
            sent_ns: sent_ms * 1_000_000,
            at_ns: at_ms * 1_000_000,
            crc: 0,
        }
    }

    #[test]
    fn an_old_epoch_answered_while_the_new_one_serves_counts_only_when_asked_after() {
        let e0 = 1;
        let e1 = 1 << 32;
        // Asked before the new epoch's first answer, answered after: the
        // drill cannot order it, so it is counted by answer time only.
        let acks = [ack(e0, 0, 0, 1), ack(e1, 1, 10, 20), ack(e0, 0, 15, 25)];
        let (sure, by_answer, _, _) = epoch_order(&acks);
        assert_eq!((sure, by_answer), (0, 1));
        assert_eq!(least_gap(&acks), Some(-5.0));
        // Asked after it: certain.
        let acks = [ack(e0, 0, 0, 1), ack(e1, 1, 10, 20), ack(e0, 0, 30, 31)];
        let (sure, by_answer, worst, said) = epoch_order(&acks);
        assert_eq!((sure, by_answer, worst), (1, 1, 10.0));
        assert!(said.is_some_and(|s| s.contains("box A under epoch 0.1")));
    }

    #[test]
    fn an_epoch_acknowledged_on_both_boxes_is_named_and_one_per_box_is_not() {
        let good = [ack(1, 0, 0, 1), ack(1, 0, 2, 3), ack(2, 1, 4, 5)];
        assert!(epochs_on_two_boxes(&good).is_empty());
        // The negative control: the same epoch on both boxes.
        let bad = [ack(1, 0, 0, 1), ack(2, 1, 2, 3), ack(2, 0, 4, 5)];
        let said = epochs_on_two_boxes(&bad);
        assert_eq!(said.len(), 1, "{said:?}");
        assert!(said[0].contains("epoch 0.2"), "{said:?}");
    }

    #[test]
    fn epochs_in_order_hold_and_give_the_gap() {
        let acks = [
            ack(1, 0, 0, 1),
            ack(1, 0, 2, 3),
            ack(1 << 32, 1, 900, 903),
            ack(2 << 32, 0, 2000, 2004),
        ];
        assert_eq!(epoch_order(&acks).0, 0);
        assert_eq!(least_gap(&acks), Some(900.0));
        assert_eq!(least_gap(&acks[..2]), None);
    }
}
