//! An arbiter that forgot, told from one that remembers: etcd is a
//! witness of who may lead, never the only record of the past.
//!
//! etcd can lose its data, or be restored from a snapshot taken before
//! the pair moved on. Believed as it is, it would hand out an epoch the
//! pair already used, and a deposed box would lead again under it. So
//! each box keeps its own memory of the arbiter ([`Memory`]: the cluster
//! generation written once at bootstrap, the newest epoch and revision it
//! read), and every read is judged against that memory and the box's own
//! epochs ([`judge`]) before anything is decided on it.
//!
//! When the arbiter forgot, a box leads only with both boxes' histories
//! in hand ([`after_amnesia`]): the box whose log carries the newer epoch
//! leads, above every epoch either box or the arbiter holds, and the
//! other follows it. A box that cannot reach the other waits and says
//! why; an operator who knows the other box is gone for good names the
//! floor by hand (`primary release --arbiter-lost --epoch-above N`).

use serde::{Deserialize, Serialize};

use super::arbiter::View;
use super::epochs::{next_term, term, EpochHistory, EpochName};

/// What a box remembers of the arbiter, kept in its data directory.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Memory {
    /// The cluster generation the arbiter's keys were written under:
    /// minted when a pair's keys are first written, and again by a box
    /// that led the pair out of an amnesia.
    #[serde(default)]
    pub generation: Option<String>,
    /// The newest epoch read from the arbiter's epoch key.
    #[serde(default)]
    pub epoch: u64,
    /// The newest revision the arbiter answered at, in `generation`.
    #[serde(default)]
    pub revision: i64,
    /// The other box, as last learned (a leader record, a hello): where
    /// to ask for its history when the arbiter forgot.
    #[serde(default)]
    pub peer: Option<Peer>,
}

impl Memory {
    /// This box's transaction took `epoch`, committed at `revision`,
    /// under `generation` when it wrote a new one.
    pub fn took(&mut self, epoch: u64, revision: i64, generation: Option<String>) {
        if let Some(g) = generation {
            // Revisions are counted anew within a generation.
            self.generation = Some(g);
            self.revision = revision;
        }
        self.epoch = self.epoch.max(epoch);
        self.revision = self.revision.max(revision);
    }
}

/// Where the other box of the pair serves as a primary.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Peer {
    pub addr: String,
    pub fingerprint: String,
}

/// How the arbiter forgot what this box knows.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Amnesia {
    #[error(
        "etcd holds no cluster generation, where this box recorded {mine}: etcd lost its data"
    )]
    GenerationMissing { mine: String },
    #[error("etcd's cluster generation is {theirs}, where this box recorded {mine}, and its epoch {} is not above this box's {}: etcd was replaced or restored", EpochName(*epoch), EpochName(*newest))]
    GenerationChanged {
        mine: String,
        theirs: String,
        epoch: u64,
        newest: u64,
    },
    #[error("etcd's epoch is {}, below the {} this box has recorded: etcd lost its data or was restored from an older snapshot", EpochName(*arbiter), EpochName(*mine))]
    EpochBehind { arbiter: u64, mine: u64 },
    #[error("etcd answers at revision {arbiter}, below the {mine} this box read: etcd was restored from an older snapshot")]
    RevisionBehind { arbiter: i64, mine: i64 },
}

impl Amnesia {
    /// A short name for logs and metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            Amnesia::GenerationMissing { .. } => "generation_missing",
            Amnesia::GenerationChanged { .. } => "generation_changed",
            Amnesia::EpochBehind { .. } => "epoch_behind",
            Amnesia::RevisionBehind { .. } => "revision_behind",
        }
    }
}

/// What a read of the arbiter may be taken as.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Judged {
    /// The arbiter remembers all this box knows: decide on it. `memory`
    /// is what to record (changed when the read taught something new).
    Trusted { memory: Memory, bootstrap: bool },
    /// The arbiter forgot: nothing is led on its word alone.
    Forgot(Amnesia),
}

/// Judge a read of the arbiter against this box's `memory` and `newest`,
/// the newest epoch its own epochs hold (history and heard of).
///
/// - A generation recorded here must be the arbiter's, unless the arbiter
///   holds an epoch above everything this box knows: the other box led
///   the pair out of an amnesia and minted a new one, which is adopted.
/// - The arbiter's epoch (none is 0) may not be below any epoch this box
///   holds or read there.
/// - Within one generation, the arbiter's revision never goes back.
/// - Keys with no generation at all, at or above everything this box
///   knows, are a pair's first: `bootstrap` says to mint one.
pub fn judge(view: &View, memory: &Memory, newest: u64) -> Judged {
    let arbiter_epoch = view.epoch.as_ref().map_or(0, |v| v.value);
    let known = newest.max(memory.epoch);
    let theirs = view.generation.as_ref().map(|g| g.value.clone());
    match (&memory.generation, &theirs) {
        (Some(mine), None) => {
            return Judged::Forgot(Amnesia::GenerationMissing { mine: mine.clone() })
        }
        (Some(mine), Some(t)) if mine != t && arbiter_epoch <= known => {
            return Judged::Forgot(Amnesia::GenerationChanged {
                mine: mine.clone(),
                theirs: t.clone(),
                epoch: arbiter_epoch,
                newest: known,
            })
        }
        _ => {}
    }
    if arbiter_epoch < known {
        return Judged::Forgot(Amnesia::EpochBehind {
            arbiter: arbiter_epoch,
            mine: known,
        });
    }
    let same_generation = theirs.is_some() && theirs == memory.generation;
    if same_generation && view.revision < memory.revision {
        return Judged::Forgot(Amnesia::RevisionBehind {
            arbiter: view.revision,
            mine: memory.revision,
        });
    }
    let mut next = memory.clone();
    next.epoch = arbiter_epoch.max(memory.epoch);
    if same_generation {
        next.revision = memory.revision.max(view.revision);
    } else {
        next.revision = view.revision;
    }
    next.generation = theirs.clone();
    Judged::Trusted {
        memory: next,
        bootstrap: theirs.is_none(),
    }
}

/// A read believed whatever it forgot, as a box that takes its epoch
/// from etcd alone would: only the negative controls of the checkers
/// decide on this, to show what [`judge`] prevents.
pub fn believe(view: &View, memory: &Memory) -> Judged {
    Judged::Trusted {
        memory: Memory {
            generation: view.generation.as_ref().map(|g| g.value.clone()),
            epoch: view.epoch.as_ref().map_or(0, |e| e.value),
            revision: view.revision,
            peer: memory.peer.clone(),
        },
        bootstrap: view.generation.is_none(),
    }
}

/// What one box tells the other of its log when the arbiter forgot.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeerWord {
    /// Its log's epochs.
    pub epochs: EpochHistory,
    /// Its durable head.
    pub head: u64,
    /// The newest epoch it knows of: its epochs' and the arbiter's, as
    /// it recorded them.
    pub newest: u64,
    /// It runs as a primary (serving, or waiting to).
    pub primary: bool,
}

/// Why a box may not lead after an amnesia, with the other box's word.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Defer {
    #[error("the other box's log carries epoch {}, newer than this box's {}: it leads, and this box follows it", EpochName(*theirs), EpochName(*mine))]
    Newer { mine: u64, theirs: u64 },
    #[error("the other box runs as the primary of this box's epoch {}: it leads, and this box follows it", EpochName(*epoch))]
    ItsPrimary { epoch: u64 },
}

/// After an amnesia: whether this box may lead, given its own `mine`
/// and the other box's `peer` word, and the floor its epoch must go
/// above: every epoch either box holds or recorded, and the arbiter's.
///
/// The box whose log carries the newer epoch leads: the other's frames
/// past their fork were written under an older epoch, so they were
/// acknowledged at most `local`, and its rejoin saves them. Two logs of
/// one epoch were written by one primary: the box running as a primary
/// leads, and of two (which only an operator makes) the longer log.
pub fn after_amnesia(mine: &PeerWord, peer: &PeerWord, arbiter_epoch: u64) -> Result<u64, Defer> {
    let (m, p) = (mine.epochs.current(), peer.epochs.current());
    if p > m {
        return Err(Defer::Newer { mine: m, theirs: p });
    }
    if p == m {
        let peer_first = match (mine.primary, peer.primary) {
            (false, true) => true,
            (true, true) => peer.head > mine.head,
            _ => false,
        };
        if peer_first {
            return Err(Defer::ItsPrimary { epoch: m });
        }
    }
    Ok(mine
        .newest
        .max(peer.newest)
        .max(m)
        .max(p)
        .max(arbiter_epoch))
}

/// The epoch a primary's new life takes above `floor`: the next life of
/// its own term, or a new term if the floor is of a newer one.
pub fn life_above(current: u64, floor: u64) -> u64 {
    let floor = floor.max(current);
    if term(floor) == term(current) {
        floor + 1
    } else {
        next_term(floor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::repl::arbiter::Versioned;
    use crate::repl::epochs::LIFE_BITS;

    const T1: u64 = 1 << LIFE_BITS;

    fn view(epoch: Option<u64>, generation: Option<&str>, revision: i64) -> View {
        View {
            epoch: epoch.map(|value| Versioned {
                value,
                mod_revision: 3,
            }),
            generation: generation.map(|g| Versioned {
                value: g.to_string(),
                mod_revision: 2,
            }),
            revision,
            ..View::default()
        }
    }

    fn memory(generation: Option<&str>, epoch: u64, revision: i64) -> Memory {
        Memory {
            generation: generation.map(str::to_string),
            epoch,
            revision,
            peer: None,
        }
    }

    #[test]
    fn a_fresh_pair_bootstraps_and_a_remembering_arbiter_is_trusted() {
        match judge(&view(None, None, 1), &Memory::default(), 0) {
            Judged::Trusted { bootstrap, .. } => assert!(bootstrap),
            other => panic!("{other:?}"),
        }
        match judge(
            &view(Some(T1), Some("g"), 40),
            &memory(Some("g"), T1, 30),
            T1,
        ) {
            Judged::Trusted { memory, bootstrap } => {
                assert!(!bootstrap);
                assert_eq!(memory.revision, 40);
                assert_eq!(memory.epoch, T1);
            }
            other => panic!("{other:?}"),
        }
        // Keys from before generations, as new as this box: adopted.
        match judge(&view(Some(T1 + 2), None, 9), &Memory::default(), T1 + 2) {
            Judged::Trusted { bootstrap, .. } => assert!(bootstrap),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn every_kind_of_forgetting_is_named() {
        let forgot = |v: View, m: Memory, newest: u64| match judge(&v, &m, newest) {
            Judged::Forgot(a) => a.kind(),
            Judged::Trusted { .. } => "trusted",
        };
        // Wiped: no keys at all, where this box led.
        assert_eq!(
            forgot(view(None, None, 1), memory(Some("g"), 1, 8), 1),
            "generation_missing"
        );
        // Wiped, and a box that kept no memory (an older build) but led.
        assert_eq!(
            forgot(view(None, None, 1), Memory::default(), 1),
            "epoch_behind"
        );
        // Restored from an older snapshot: the same generation, an older
        // epoch.
        assert_eq!(
            forgot(view(Some(1), Some("g"), 90), memory(Some("g"), T1, 50), T1),
            "epoch_behind"
        );
        // The box's own history is ahead of what it read there.
        assert_eq!(
            forgot(
                view(Some(T1), Some("g"), 90),
                memory(Some("g"), T1, 50),
                2 * T1
            ),
            "epoch_behind"
        );
        // Restored to a point with the same epoch, earlier revision.
        assert_eq!(
            forgot(view(Some(T1), Some("g"), 20), memory(Some("g"), T1, 50), T1),
            "revision_behind"
        );
        // Another generation, not ahead of this box.
        assert_eq!(
            forgot(view(Some(T1), Some("h"), 90), memory(Some("g"), T1, 50), T1),
            "generation_changed"
        );
        // Another generation ahead of this box: the other box led out of
        // an amnesia; adopted, and its revisions start anew.
        match judge(
            &view(Some(2 * T1), Some("h"), 5),
            &memory(Some("g"), T1, 50),
            T1,
        ) {
            Judged::Trusted { memory, .. } => {
                assert_eq!(memory.generation.as_deref(), Some("h"));
                assert_eq!(memory.revision, 5);
            }
            other => panic!("{other:?}"),
        }
    }

    fn word(epochs: &[(u64, u64)], head: u64, primary: bool) -> PeerWord {
        let starts: Vec<_> = epochs
            .iter()
            .map(|&(epoch, first)| crate::repl::EpochStart { epoch, first })
            .collect();
        let epochs = EpochHistory::try_from(starts).expect("a history");
        PeerWord {
            newest: epochs.current(),
            epochs,
            head,
            primary,
        }
    }

    #[test]
    fn the_box_with_the_newer_epoch_leads_above_everything_either_holds() {
        // The finding: A served 0.1, B took 1.0 while A was down, etcd
        // forgot. A may not lead; B leads above 1.0.
        let a = word(&[(1, 1)], 217, true);
        let b = word(&[(1, 1), (T1, 218)], 232, true);
        assert_eq!(
            after_amnesia(&a, &b, 0),
            Err(Defer::Newer {
                mine: 1,
                theirs: T1
            })
        );
        let floor = after_amnesia(&b, &a, 0).expect("B leads");
        assert_eq!(floor, T1);
        assert_eq!(life_above(T1, floor), T1 + 1);
        // A twin behind its primary of the same epoch defers to it; the
        // primary leads.
        let p = word(&[(1, 1), (2, 10)], 50, true);
        let t = word(&[(1, 1), (2, 10)], 48, false);
        assert!(matches!(
            after_amnesia(&t, &p, 0),
            Err(Defer::ItsPrimary { .. })
        ));
        assert_eq!(after_amnesia(&p, &t, 0), Ok(2));
        // The floor takes what either box heard of and what etcd holds.
        let mut t2 = t.clone();
        t2.newest = 3 * T1;
        assert_eq!(after_amnesia(&p, &t2, 0), Ok(3 * T1));
        assert_eq!(life_above(2, 3 * T1), 4 * T1);
        assert_eq!(after_amnesia(&p, &t, 7), Ok(7));
    }
}
