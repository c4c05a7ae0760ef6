//! Automatic failover as rules, against an arbiter's keys (etcd): which
//! epoch a new primary life takes, when a twin may take over, and what
//! the primary records of its twin before it may answer a `twin` request
//! with less. The I/O (reading the keys in one revision, running the
//! transaction, holding the lease) is the node's; what is decided here is
//! decided on what was read.
//!
//! Five keys under `/twinlog/<cluster>/`:
//! - `generation`: minted when the pair's keys are first written, and
//!   again by a box that leads the pair out of an amnesia: with each
//!   box's own memory of it, how a box tells an etcd that lost its data
//!   or was rolled back ([`super::amnesia`]).
//! - `epoch`: the newest epoch any box took. A new life takes its epoch by
//!   compare-and-swap on it, so no two lives ever hold one epoch: the
//!   epoch is the fencing token.
//! - `leader`: the primary's record, under its lease. It is gone once the
//!   lease expired, and only then may another box take the next epoch.
//! - `sync`: whether the primary's twin holds every frame acknowledged
//!   `twin` (PostgreSQL Patroni's `/sync`). The primary writes "not in
//!   sync" before it answers a `twin` request `Local`, and "in sync" again
//!   once the twin caught up. A twin takes over only if it is the one
//!   recorded in sync by the epoch that last led.
//! - `clients`: the clients the primary serves, with their roles, written
//!   when its life begins, so a twin that takes over admits the same
//!   clients (a switchover hands them over; a failover cannot).

use serde::{Deserialize, Serialize};

use super::epochs::{next_term, term, EpochName};
use super::HandedClient;

/// The arbiter's keys for one pair.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Keys {
    pub epoch: String,
    pub leader: String,
    pub sync: String,
    pub clients: String,
    /// The cluster generation, minted when the pair's keys are first
    /// written ([`super::amnesia`]).
    pub generation: String,
    /// The prefix all five share, to read them in one revision.
    pub prefix: String,
}

/// Why a cluster name is refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("the cluster name {0:?} is not 1 to 64 of A-Z, a-z, 0-9, '-' and '_'")]
pub struct BadClusterName(pub String);

impl Keys {
    /// The keys of cluster `name`: a name that could reach another
    /// cluster's keys (a '/', say) is refused.
    pub fn of(name: &str) -> Result<Keys, BadClusterName> {
        let ok = (1..=64).contains(&name.len())
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
        if !ok {
            return Err(BadClusterName(name.to_owned()));
        }
        let key = |k: &str| format!("/twinlog/{name}/{k}");
        Ok(Keys {
            epoch: key("epoch"),
            leader: key("leader"),
            sync: key("sync"),
            clients: key("clients"),
            generation: key("generation"),
            prefix: key(""),
        })
    }
}

/// Who leads, as the `leader` key says.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaderRecord {
    pub epoch: u64,
    /// The primary's certificate fingerprint, to pin.
    pub fingerprint: String,
    /// Where it serves clients (HOST:PORT).
    pub addr: String,
}

/// What the primary of `epoch` last recorded of its twin.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SyncRecord {
    pub epoch: u64,
    /// The twin it speaks of.
    pub twin: String,
    /// Whether that twin holds every frame acknowledged `twin`.
    pub in_sync: bool,
    /// The head the twin had acknowledged when this was written.
    pub acked: u64,
}

/// A key's value with the revision it was last written at, as read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Versioned<T> {
    pub value: T,
    pub mod_revision: i64,
}

/// The keys, read in one revision.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct View {
    pub epoch: Option<Versioned<u64>>,
    pub leader: Option<Versioned<LeaderRecord>>,
    /// The lease the leader key is held under.
    pub leader_lease: i64,
    pub sync: Option<Versioned<SyncRecord>>,
    pub clients: Vec<HandedClient>,
    pub generation: Option<Versioned<String>>,
    /// The revision the arbiter answered the read at.
    pub revision: i64,
}

impl View {
    /// Take one key of the pair's, as read at `mod_revision` under
    /// `lease`; a value that does not parse is refused by why. Keys that
    /// are not the pair's are passed over.
    pub fn read(
        &mut self,
        keys: &Keys,
        key: &str,
        value: &[u8],
        mod_revision: i64,
        lease: i64,
    ) -> Result<(), String> {
        let versioned = |value| Versioned {
            value,
            mod_revision,
        };
        if key == keys.epoch {
            let text = std::str::from_utf8(value).map_err(|e| e.to_string())?;
            let epoch: u64 = text
                .trim()
                .parse()
                .map_err(|e| format!("{text:?} is not an epoch: {e}"))?;
            self.epoch = Some(versioned(epoch));
        } else if key == keys.leader {
            let record: LeaderRecord = serde_json::from_slice(value).map_err(|e| e.to_string())?;
            self.leader = Some(Versioned {
                value: record,
                mod_revision,
            });
            self.leader_lease = lease;
        } else if key == keys.sync {
            let record: SyncRecord = serde_json::from_slice(value).map_err(|e| e.to_string())?;
            self.sync = Some(Versioned {
                value: record,
                mod_revision,
            });
        } else if key == keys.generation {
            let text = std::str::from_utf8(value).map_err(|e| e.to_string())?;
            self.generation = Some(Versioned {
                value: text.to_owned(),
                mod_revision,
            });
        } else if key == keys.clients {
            self.clients = serde_json::from_slice(value).map_err(|e| e.to_string())?;
        }
        Ok(())
    }
}

/// What a transaction checks before it writes anything.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Compare {
    /// The key does not exist.
    Absent(String),
    /// The key was last written at this revision.
    Unchanged(String, i64),
}

/// A write of a transaction.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Put {
    pub key: String,
    pub value: Vec<u8>,
    /// Under the writer's lease: gone when the lease expires.
    pub leased: bool,
}

/// All of `then` if every `when` holds, else nothing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Txn {
    pub when: Vec<Compare>,
    pub then: Vec<Put>,
}

/// Why a box may not begin a primary life now.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum NotNow {
    #[error("{} leads at {}, epoch {}", .0.fingerprint, .0.addr, EpochName(.0.epoch))]
    Led(LeaderRecord),
    #[error("epoch {} was taken since this box's {}: this box was replaced and must follow", EpochName(*newer), EpochName(*mine))]
    Replaced { mine: u64, newer: u64 },
    #[error("no sync record: no primary said its twin holds every acknowledged frame")]
    NoSyncRecord,
    #[error("the last primary (epoch {}) did not record this twin in sync ({sync:?}): frames it acknowledged `twin` may be missing here", EpochName(.sync.epoch))]
    NotInSync { sync: SyncRecord },
    #[error(
        "this twin's head {head} is below the {acked} the primary recorded it had acknowledged"
    )]
    Behind { head: u64, acked: u64 },
    #[error("the recorded sync is epoch {}'s, not the last leader's {}", EpochName(*sync), EpochName(*newest))]
    StaleSync { sync: u64, newest: u64 },
}

/// The transaction that makes `me` the leader at `epoch`: only if the
/// epoch key is as read and the leader key too (absent, or this box's
/// own from a life that ended).
fn take(keys: &Keys, view: &View, epoch: u64, me: &LeaderRecord) -> Txn {
    let epoch_unchanged = match &view.epoch {
        Some(v) => Compare::Unchanged(keys.epoch.clone(), v.mod_revision),
        None => Compare::Absent(keys.epoch.clone()),
    };
    let leader_unchanged = match &view.leader {
        Some(v) => Compare::Unchanged(keys.leader.clone(), v.mod_revision),
        None => Compare::Absent(keys.leader.clone()),
    };
    let leader = LeaderRecord {
        epoch,
        ..me.clone()
    };
    Txn {
        when: vec![epoch_unchanged, leader_unchanged],
        then: vec![
            Put {
                key: keys.epoch.clone(),
                value: epoch.to_string().into_bytes(),
                leased: false,
            },
            Put {
                key: keys.leader.clone(),
                value: serde_json::to_vec(&leader).expect("a leader record serializes"),
                leased: true,
            },
        ],
    }
}

/// A primary (re)starting with `mine` as its current epoch: the next life
/// of its term, if nobody took a newer term and nobody else leads. The
/// leader key may be this box's own (`me`'s fingerprint): a process of an
/// earlier life, which the log's lock proves gone. `unserved`: `mine` was
/// begun by a promotion no process has served yet, so it is this life's
/// epoch, unless the arbiter has a newer one of its term.
pub fn begin_life(
    keys: &Keys,
    view: &View,
    mine: u64,
    unserved: bool,
    me: &LeaderRecord,
) -> Result<(u64, Txn), NotNow> {
    let newest = view.epoch.as_ref().map_or(mine, |v| v.value);
    if term(newest) > term(mine) {
        return Err(NotNow::Replaced {
            mine,
            newer: newest,
        });
    }
    if let Some(l) = &view.leader {
        if l.value.fingerprint != me.fingerprint {
            return Err(NotNow::Led(l.value.clone()));
        }
    }
    let epoch = if unserved && newest <= mine {
        mine
    } else {
        newest.max(mine) + 1
    };
    Ok((epoch, take(keys, view, epoch, me)))
}

/// A twin whose durable head is `head` taking over once no leader holds
/// a lease: the next term, if the last leader recorded this twin (`me`'s
/// fingerprint) in sync.
pub fn take_over(
    keys: &Keys,
    view: &View,
    head: u64,
    floor: u64,
    me: &LeaderRecord,
) -> Result<(u64, Txn), NotNow> {
    if let Some(l) = &view.leader {
        return Err(NotNow::Led(l.value.clone()));
    }
    let Some(sync) = &view.sync else {
        return Err(NotNow::NoSyncRecord);
    };
    let sync = &sync.value;
    let newest = view.epoch.as_ref().map_or(0, |v| v.value);
    if sync.epoch != newest {
        return Err(NotNow::StaleSync {
            sync: sync.epoch,
            newest,
        });
    }
    if !sync.in_sync || sync.twin != me.fingerprint {
        return Err(NotNow::NotInSync { sync: sync.clone() });
    }
    if head < sync.acked {
        return Err(NotNow::Behind {
            head,
            acked: sync.acked,
        });
    }
    // Never an epoch this box would refuse to record: above every epoch
    // it holds, whatever the arbiter says.
    let epoch = next_term(newest.max(floor));
    let mut txn = take(keys, view, epoch, me);
    // The sync record the decision stood on must still be the one read.
    if let Some(v) = &view.sync {
        txn.when
            .push(Compare::Unchanged(keys.sync.clone(), v.mod_revision));
    }
    Ok((epoch, txn))
}

/// `txn`, which also writes the cluster generation `generation`, only
/// if the generation key is still as read: a pair's first keys, or the
/// keys a box writes after the arbiter forgot ([`super::amnesia`]).
pub fn with_generation(mut txn: Txn, keys: &Keys, view: &View, generation: &str) -> Txn {
    txn.when.push(match &view.generation {
        Some(v) => Compare::Unchanged(keys.generation.clone(), v.mod_revision),
        None => Compare::Absent(keys.generation.clone()),
    });
    txn.then.push(Put {
        key: keys.generation.clone(),
        value: generation.as_bytes().to_vec(),
        leased: false,
    });
    txn
}

/// After the arbiter forgot: `me` takes `epoch`, which the two boxes'
/// histories gave ([`super::amnesia::after_amnesia`]), under a new
/// generation, if the keys are still as read. A leader key still there
/// is this box's own (another's is waited out).
pub fn take_after_amnesia(
    keys: &Keys,
    view: &View,
    epoch: u64,
    me: &LeaderRecord,
    generation: &str,
) -> Result<Txn, NotNow> {
    if let Some(l) = &view.leader {
        if l.value.fingerprint != me.fingerprint {
            return Err(NotNow::Led(l.value.clone()));
        }
    }
    Ok(with_generation(
        take(keys, view, epoch, me),
        keys,
        view,
        generation,
    ))
}

/// The clients a life serves, written beside its leader key (not under
/// its lease: a twin that takes over reads them after the lease ended).
pub fn record_clients(keys: &Keys, clients: &[HandedClient]) -> Put {
    Put {
        key: keys.clients.clone(),
        value: serde_json::to_vec(clients).expect("client records serialize"),
        leased: false,
    }
}

/// The primary's writes of its sync record: only while it leads, so a
/// deposed primary's late write changes nothing.
pub fn record_sync(keys: &Keys, leader_revision: i64, record: &SyncRecord) -> Txn {
    Txn {
        when: vec![Compare::Unchanged(keys.leader.clone(), leader_revision)],
        then: vec![Put {
            key: keys.sync.clone(),
            value: serde_json::to_vec(record).expect("a sync record serializes"),
            leased: false,
        }],
    }
}

/// What the primary has recorded of its twin, and what it must record
/// before it answers: "not in sync" before any `twin` request is
/// answered with less, "in sync" once the twin holds the head again.
#[derive(Clone, Debug, Default)]
pub struct SyncState {
    /// What the arbiter holds, as far as this primary knows (`None`:
    /// nothing recorded in this life yet, which a twin reads as not in
    /// sync).
    recorded: Option<bool>,
}

/// What the primary must do before it goes on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SyncStep {
    /// Nothing to record.
    Go,
    /// Record this first; answer after it is written.
    Record { in_sync: bool },
}

impl SyncState {
    /// A `twin` request is about to be answered `Local` (the twin is away
    /// under `fallback`).
    pub fn before_answering_less(&self) -> SyncStep {
        match self.recorded {
            Some(false) => SyncStep::Go,
            // Unrecorded counts as out of sync for a twin, but a record
            // written earlier in another life could say otherwise.
            _ => SyncStep::Record { in_sync: false },
        }
    }

    /// The twin acknowledged everything this primary acknowledged.
    pub fn twin_caught_up(&self) -> SyncStep {
        match self.recorded {
            Some(true) => SyncStep::Go,
            _ => SyncStep::Record { in_sync: true },
        }
    }

    /// The arbiter took the record.
    pub fn recorded(&mut self, in_sync: bool) {
        self.recorded = Some(in_sync);
    }

    /// Whether the arbiter holds "in sync" for this life.
    pub fn in_sync(&self) -> bool {
        self.recorded == Some(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::repl::epochs::LIFE_BITS;

    fn me(fp: &str) -> LeaderRecord {
        LeaderRecord {
            epoch: 0,
            fingerprint: fp.into(),
            addr: "127.0.0.1:7400".into(),
        }
    }

    fn keys() -> Keys {
        Keys::of("pair-1").expect("a good name")
    }

    fn view(epoch: u64, sync: Option<(u64, &str, bool, u64)>) -> View {
        View {
            epoch: Some(Versioned {
                value: epoch,
                mod_revision: 7,
            }),
            leader: None,
            leader_lease: 0,
            clients: Vec::new(),
            sync: sync.map(|(epoch, twin, in_sync, acked)| Versioned {
                value: SyncRecord {
                    epoch,
                    twin: twin.into(),
                    in_sync,
                    acked,
                },
                mod_revision: 9,
            }),
            ..View::default()
        }
    }

    #[test]
    fn a_cluster_name_cannot_reach_another_cluster_s_keys() {
        assert_eq!(keys().leader, "/twinlog/pair-1/leader");
        for bad in ["", "a/b", "../x", "a b", &"x".repeat(65)] {
            assert!(Keys::of(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_restart_takes_the_next_life_and_a_replaced_primary_takes_none() {
        let t1 = 1 << LIFE_BITS;
        let (e, txn) =
            begin_life(&keys(), &view(t1 + 3, None), t1 + 3, false, &me("a")).expect("life");
        assert_eq!(e, t1 + 4);
        assert_eq!(
            txn.when,
            vec![
                Compare::Unchanged(keys().epoch, 7),
                Compare::Absent(keys().leader)
            ]
        );
        assert!(txn.then.iter().any(|p| p.key == keys().leader && p.leased));
        assert_eq!(
            begin_life(
                &keys(),
                &view(2 << LIFE_BITS, None),
                t1 + 3,
                false,
                &me("a")
            ),
            Err(NotNow::Replaced {
                mine: t1 + 3,
                newer: 2 << LIFE_BITS
            })
        );
        let mut led = view(t1, None);
        led.leader = Some(Versioned {
            value: LeaderRecord {
                epoch: t1,
                ..me("b")
            },
            mod_revision: 5,
        });
        assert!(matches!(
            begin_life(&keys(), &led, t1, false, &me("a")),
            Err(NotNow::Led(_))
        ));
        // Its own key, from a life whose process is gone: taken back in
        // a new life, only if still as read.
        let (e, txn) = begin_life(&keys(), &led, t1, false, &me("b")).expect("own key");
        assert_eq!(e, t1 + 1);
        assert!(txn.when.contains(&Compare::Unchanged(keys().leader, 5)));
        // A promotion's epoch, not served yet, is this life's.
        let (e, _) = begin_life(&keys(), &led, t1, true, &me("b")).expect("unserved");
        assert_eq!(e, t1);
        // A fresh arbiter: the box's own epoch goes on.
        let fresh = View::default();
        let (e, txn) = begin_life(&keys(), &fresh, t1 + 3, false, &me("a")).expect("life");
        assert_eq!(e, t1 + 4);
        assert_eq!(txn.when[0], Compare::Absent(keys().epoch));
    }

    #[test]
    fn only_the_twin_recorded_in_sync_by_the_last_leader_takes_over() {
        let t1 = 1 << LIFE_BITS;
        let (e, txn) = take_over(
            &keys(),
            &view(t1 + 2, Some((t1 + 2, "b", true, 50))),
            50,
            0,
            &me("b"),
        )
        .expect("eligible");
        assert_eq!(e, 2 << LIFE_BITS);
        assert!(txn.when.contains(&Compare::Unchanged(keys().sync, 9)));
        let refuse = |v: View, head: u64| take_over(&keys(), &v, head, 0, &me("b")).unwrap_err();
        assert!(matches!(
            refuse(view(t1 + 2, Some((t1 + 2, "b", false, 50))), 50),
            NotNow::NotInSync { .. }
        ));
        assert!(matches!(
            refuse(view(t1 + 2, Some((t1 + 2, "c", true, 50))), 50),
            NotNow::NotInSync { .. }
        ));
        assert!(matches!(
            refuse(view(t1 + 3, Some((t1 + 2, "b", true, 50))), 50),
            NotNow::StaleSync { .. }
        ));
        assert!(matches!(
            refuse(view(t1 + 2, Some((t1 + 2, "b", true, 50))), 49),
            NotNow::Behind { .. }
        ));
        assert_eq!(refuse(view(t1 + 2, None), 50), NotNow::NoSyncRecord);
        // Never an epoch the box holds already, whatever the arbiter says.
        let (e, _) = take_over(
            &keys(),
            &view(t1 + 2, Some((t1 + 2, "b", true, 50))),
            50,
            2 << LIFE_BITS,
            &me("b"),
        )
        .expect("eligible");
        assert_eq!(e, 3 << LIFE_BITS);
    }

    #[test]
    fn less_than_twin_is_answered_only_after_out_of_sync_is_recorded() {
        let mut s = SyncState::default();
        assert!(!s.in_sync());
        assert_eq!(
            s.before_answering_less(),
            SyncStep::Record { in_sync: false }
        );
        s.recorded(false);
        assert_eq!(s.before_answering_less(), SyncStep::Go);
        assert_eq!(s.twin_caught_up(), SyncStep::Record { in_sync: true });
        s.recorded(true);
        assert!(s.in_sync());
        assert_eq!(s.twin_caught_up(), SyncStep::Go);
        assert_eq!(
            s.before_answering_less(),
            SyncStep::Record { in_sync: false }
        );
        let txn = record_sync(
            &keys(),
            12,
            &SyncRecord {
                epoch: 1,
                twin: "b".into(),
                in_sync: false,
                acked: 3,
            },
        );
        assert_eq!(txn.when, vec![Compare::Unchanged(keys().leader, 12)]);
    }
}
