//! One decision on one read of the arbiter: whether a box takes a life
//! (a primary's start) or the next term (a twin whose primary's lease
//! ended), and the transaction that would take it. The daemons
//! (`crate::node::arbiter`) and the simulated cluster decide through
//! these two functions and differ only in how they read, ask and write.
//!
//! The read comes judged ([`super::amnesia::judge`]). When the arbiter
//! forgot, the decision needs the other box's word: the first call
//! answers [`Step::AskPeer`], and the caller asks and calls again with
//! the answer (or why none came).

use super::amnesia::{after_amnesia, life_above, Amnesia, Judged, Memory, Peer, PeerWord};
use super::arbiter::{self, Keys, LeaderRecord, NotNow, Txn, View};
use super::epochs::{next_term, EpochName};

/// What a box knows beside the arbiter's read.
#[derive(Clone, Debug)]
pub struct Known {
    /// The read, judged against the box's memory of the arbiter.
    pub judged: Judged,
    /// This box's word: its epochs, head and the newest epoch it knows.
    pub own: PeerWord,
    /// The other box's word once asked; `Err` says why none came.
    pub peer: Option<Result<PeerWord, String>>,
    /// `primary release --arbiter-lost --epoch-above N`: the floor an
    /// operator named, who knows the other box is gone for good.
    pub released_above: Option<u64>,
}

/// What the decision is, with what to record first.
#[derive(Clone, Debug)]
pub struct Claim {
    /// What the read taught of the arbiter: recorded before acting on it.
    pub keep: Option<Memory>,
    /// Why the arbiter is not believed now.
    pub amnesia: Option<Amnesia>,
    pub step: Step,
}

/// What to do.
#[derive(Clone, Debug)]
pub enum Step {
    /// Run `txn` under a new lease; once it committed, record `epoch`
    /// (and `generation`, when one is written) before acting on it.
    Take {
        epoch: u64,
        txn: Txn,
        generation: Option<String>,
    },
    /// A newer term was taken: this box follows it.
    Replaced {
        newer: u64,
        leader: Option<LeaderRecord>,
    },
    /// Another box leads under its lease.
    Led(LeaderRecord),
    /// The arbiter forgot: ask the other box for its word, and decide
    /// again with it.
    AskPeer,
    /// The rules refuse it now.
    NotNow(NotNow),
    /// Not now, for the reason given.
    Wait(String),
}

const LIFE_HINT: &str = ": `primary release --arbiter-lost --epoch-above N` if it is gone for good";

/// A primary with `mine` as its current epoch (`unserved`: begun by a
/// promotion no process served) taking its life as `me`. `fresh` is a
/// new cluster generation, written only if the keys need one.
pub fn claim_life(
    keys: &Keys,
    view: &View,
    known: &Known,
    mine: u64,
    unserved: bool,
    me: &LeaderRecord,
    fresh: &str,
) -> Claim {
    let take = |epoch: u64, txn: Txn, generation: Option<String>| {
        // Never an epoch this box would refuse to record.
        if epoch <= known.own.newest && !(unserved && epoch == mine) {
            return Step::Wait(format!(
                "the arbiter would give epoch {}, not above this box's {}",
                EpochName(epoch),
                EpochName(known.own.newest)
            ));
        }
        Step::Take {
            epoch,
            txn,
            generation,
        }
    };
    match &known.judged {
        Judged::Trusted { memory, bootstrap } => {
            let step = match arbiter::begin_life(keys, view, mine, unserved, me) {
                Ok((epoch, txn)) => {
                    let (txn, generation) = match bootstrap {
                        true => (
                            arbiter::with_generation(txn, keys, view, fresh),
                            Some(fresh.to_owned()),
                        ),
                        false => (txn, None),
                    };
                    // The life a promotion or a take-over of this box
                    // began: the box it replaced is older by that
                    // transaction. Any other asks the other box first.
                    match newer_peer(known) {
                        _ if unserved && epoch == mine => take(epoch, txn, generation),
                        Err(step) => step,
                        Ok(()) => take(epoch, txn, generation),
                    }
                }
                Err(NotNow::Replaced { newer, .. }) => Step::Replaced {
                    newer,
                    leader: view.leader.as_ref().map(|l| l.value.clone()),
                },
                Err(NotNow::Led(l)) => Step::Led(l),
                Err(other) => Step::NotNow(other),
            };
            Claim {
                keep: Some(memory.clone()),
                amnesia: None,
                step,
            }
        }
        Judged::Forgot(amnesia) => after_forgetting(
            amnesia,
            known,
            (keys, view, me, fresh),
            LIFE_HINT,
            |floor| life_above(mine, floor),
            take,
        ),
    }
}

/// A twin whose durable head is `head` taking the next term as `me`,
/// once no leader holds a lease. While one does, a trusted read teaches
/// where it serves (to ask it, should the arbiter forget later).
pub fn claim_take_over(
    keys: &Keys,
    view: &View,
    known: &Known,
    head: u64,
    me: &LeaderRecord,
    fresh: &str,
) -> Claim {
    if let Some(l) = &view.leader {
        let keep = match &known.judged {
            Judged::Trusted { memory, .. } => {
                let mut memory = memory.clone();
                if l.value.fingerprint != me.fingerprint {
                    memory.peer = Some(Peer {
                        addr: l.value.addr.clone(),
                        fingerprint: l.value.fingerprint.clone(),
                    });
                }
                Some(memory)
            }
            Judged::Forgot(_) => None,
        };
        return Claim {
            keep,
            amnesia: forgot(&known.judged),
            step: Step::Led(l.value.clone()),
        };
    }
    match &known.judged {
        Judged::Trusted { memory, bootstrap } => {
            let step = match arbiter::take_over(keys, view, head, known.own.newest, me) {
                Ok((epoch, txn)) if *bootstrap => Step::Take {
                    epoch,
                    txn: arbiter::with_generation(txn, keys, view, fresh),
                    generation: Some(fresh.to_owned()),
                },
                Ok((epoch, txn)) => Step::Take {
                    epoch,
                    txn,
                    generation: None,
                },
                Err(why) => Step::NotNow(why),
            };
            Claim {
                keep: Some(memory.clone()),
                amnesia: None,
                step,
            }
        }
        Judged::Forgot(amnesia) => after_forgetting(
            amnesia,
            known,
            (keys, view, me, fresh),
            "",
            next_term,
            |epoch, txn, generation| Step::Take {
                epoch,
                txn,
                generation,
            },
        ),
    }
}

/// Before a life on the arbiter's word: the other box, when it answers,
/// must not hold a newer epoch. etcd restored to a state this box cannot
/// tell from the one it remembers (the other box took its term while
/// this one was down) is caught here: the other box's log carries what
/// etcd forgot. A box that does not answer leaves etcd's word standing.
fn newer_peer(known: &Known) -> Result<(), Step> {
    match &known.peer {
        None => Err(Step::AskPeer),
        Some(Ok(peer)) if peer.epochs.current() > known.own.epochs.current() => {
            Err(Step::Replaced {
                newer: peer.epochs.current(),
                leader: None,
            })
        }
        Some(_) => Ok(()),
    }
}

/// The arbiter forgot: an epoch above the floor both boxes' words (or an
/// operator) give, `epoch_above` it, taken under a new generation.
fn after_forgetting(
    amnesia: &Amnesia,
    known: &Known,
    (keys, view, me, fresh): (&Keys, &View, &LeaderRecord, &str),
    hint: &str,
    epoch_above: impl Fn(u64) -> u64,
    take: impl Fn(u64, Txn, Option<String>) -> Step,
) -> Claim {
    let step = match floor_after(amnesia, known, view, hint) {
        Err(step) => step,
        Ok(floor) => {
            let epoch = epoch_above(floor);
            match arbiter::take_after_amnesia(keys, view, epoch, me, fresh) {
                Ok(txn) => take(epoch, txn, Some(fresh.to_owned())),
                Err(NotNow::Led(l)) => Step::Led(l),
                Err(other) => Step::NotNow(other),
            }
        }
    };
    Claim {
        keep: None,
        amnesia: Some(amnesia.clone()),
        step,
    }
}

fn forgot(judged: &Judged) -> Option<Amnesia> {
    match judged {
        Judged::Forgot(a) => Some(a.clone()),
        Judged::Trusted { .. } => None,
    }
}

/// After the arbiter forgot: the floor a new epoch must go above, from
/// an operator's release or the other box's word ([`after_amnesia`]).
fn floor_after(amnesia: &Amnesia, known: &Known, view: &View, hint: &str) -> Result<u64, Step> {
    let arbiter_epoch = view.epoch.as_ref().map_or(0, |v| v.value);
    if let Some(n) = known.released_above {
        return Ok(n.max(known.own.newest).max(arbiter_epoch));
    }
    match &known.peer {
        None => Err(Step::AskPeer),
        Some(Err(e)) => Err(Step::Wait(format!(
            "{amnesia}; this box leads only with the other box's history, and {e}{hint}"
        ))),
        Some(Ok(peer)) => after_amnesia(&known.own, peer, arbiter_epoch)
            .map_err(|d| Step::Wait(format!("{amnesia}; {d}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::repl::amnesia::judge;
    use crate::repl::arbiter::Versioned;
    use crate::repl::epochs::{EpochHistory, LIFE_BITS};
    use crate::repl::EpochStart;

    const T1: u64 = 1 << LIFE_BITS;

    fn me(fp: &str) -> LeaderRecord {
        LeaderRecord {
            epoch: 0,
            fingerprint: fp.into(),
            addr: format!("{fp}:7400"),
        }
    }

    fn word(starts: &[(u64, u64)], head: u64, primary: bool) -> PeerWord {
        let starts: Vec<_> = starts
            .iter()
            .map(|&(epoch, first)| EpochStart { epoch, first })
            .collect();
        let epochs = EpochHistory::try_from(starts).expect("a history");
        PeerWord {
            newest: epochs.current(),
            epochs,
            head,
            primary,
        }
    }

    fn remembering(generation: &str, epoch: u64) -> Memory {
        Memory {
            generation: Some(generation.into()),
            epoch,
            revision: 5,
            peer: None,
        }
    }

    #[test]
    fn a_deposed_box_asks_then_follows_and_the_newer_one_leads_above_both() {
        let keys = Keys::of("p").expect("a name");
        let wiped = View {
            revision: 1,
            ..View::default()
        };
        // A served 0.1; B took 1.0 while A was down; etcd was wiped.
        let a = word(&[(1, 1)], 217, true);
        let b = word(&[(1, 1), (T1, 218)], 232, true);
        let judged = judge(&wiped, &remembering("g", 1), a.newest);
        let mut known = Known {
            judged,
            own: a.clone(),
            peer: None,
            released_above: None,
        };
        let c = claim_life(&keys, &wiped, &known, 1, false, &me("A"), "h");
        assert!(matches!(c.step, Step::AskPeer), "{c:?}");
        assert!(c.keep.is_none() && c.amnesia.is_some());
        known.peer = Some(Err("it does not answer".into()));
        let c = claim_life(&keys, &wiped, &known, 1, false, &me("A"), "h");
        assert!(matches!(&c.step, Step::Wait(w) if w.contains("does not answer")));
        known.peer = Some(Ok(b.clone()));
        let c = claim_life(&keys, &wiped, &known, 1, false, &me("A"), "h");
        assert!(
            matches!(&c.step, Step::Wait(w) if w.contains("newer")),
            "{c:?}"
        );
        // B, asked of A, leads above 1.0 under a new generation.
        let known = Known {
            judged: judge(&wiped, &remembering("g", T1), b.newest),
            own: b,
            peer: Some(Ok(a)),
            released_above: None,
        };
        let c = claim_life(&keys, &wiped, &known, T1, false, &me("B"), "h");
        match c.step {
            Step::Take {
                epoch, generation, ..
            } => {
                assert_eq!(epoch, T1 + 1);
                assert_eq!(generation.as_deref(), Some("h"));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_released_floor_stands_in_for_the_other_box_and_never_goes_below_it() {
        let keys = Keys::of("p").expect("a name");
        let wiped = View::default();
        let a = word(&[(1, 1)], 9, true);
        let known = Known {
            judged: judge(&wiped, &remembering("g", 1), a.newest),
            own: a,
            peer: None,
            released_above: Some(3 * T1),
        };
        match claim_life(&keys, &wiped, &known, 1, false, &me("A"), "h").step {
            Step::Take { epoch, .. } => assert_eq!(epoch, 4 * T1),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_twin_learns_where_its_leader_serves_and_takes_over_only_when_none_leads() {
        let keys = Keys::of("p").expect("a name");
        let led = View {
            epoch: Some(Versioned {
                value: 1,
                mod_revision: 3,
            }),
            leader: Some(Versioned {
                value: LeaderRecord {
                    epoch: 1,
                    ..me("A")
                },
                mod_revision: 3,
            }),
            generation: Some(Versioned {
                value: "g".into(),
                mod_revision: 2,
            }),
            revision: 6,
            ..View::default()
        };
        let t = word(&[(1, 1)], 4, false);
        let known = Known {
            judged: judge(&led, &remembering("g", 1), t.newest),
            own: t,
            peer: None,
            released_above: None,
        };
        let c = claim_take_over(&keys, &led, &known, 4, &me("B"), "h");
        assert!(matches!(c.step, Step::Led(_)));
        let peer = c.keep.and_then(|m| m.peer).expect("the leader learned");
        assert_eq!(peer.fingerprint, "A");
        let mut free = led;
        free.leader = None;
        let c = claim_take_over(&keys, &free, &known, 4, &me("B"), "h");
        assert!(
            matches!(c.step, Step::NotNow(NotNow::NoSyncRecord)),
            "{c:?}"
        );
    }
}
