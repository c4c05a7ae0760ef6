//! A simulated etcd for the cluster: keys with revisions, leases that
//! expire on the simulated clock, transactions of compares and puts, as
//! the node's client uses them. And the faults an outside service has:
//! it loses its data, is restored from a snapshot taken earlier in the
//! run, or answers a read with the state of a while ago.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::repl::arbiter::{Compare, Keys, Txn, View};

#[derive(Clone, Debug)]
struct Entry {
    value: Vec<u8>,
    modified: i64,
    lease: i64,
}

/// Everything etcd holds: what a snapshot saves and a restore brings
/// back.
#[derive(Clone, Debug)]
struct State {
    kv: BTreeMap<String, Entry>,
    revision: i64,
    /// Each lease's expiry.
    leases: BTreeMap<i64, Instant>,
}

impl State {
    fn fresh() -> State {
        State {
            kv: BTreeMap::new(),
            revision: 1,
            leases: BTreeMap::new(),
        }
    }
}

/// How many earlier states are kept, to restore or to answer late from.
const KEPT: usize = 512;

/// The simulated etcd; see the module documentation.
pub struct SimEtcd {
    state: State,
    ttl: Duration,
    /// Earlier states, each with when it stopped being the current one.
    past: Vec<(Instant, State)>,
    /// A lease id is never handed out twice, even across a wipe, as the
    /// real one draws them at random.
    leases_granted: i64,
}

impl SimEtcd {
    pub fn new(ttl: Duration) -> SimEtcd {
        SimEtcd {
            state: State::fresh(),
            ttl,
            past: Vec::new(),
            leases_granted: 0,
        }
    }

    fn changing(&mut self, now: Instant) {
        self.past.push((now, self.state.clone()));
        if self.past.len() > KEPT {
            self.past.remove(0);
        }
    }

    /// Leases past their expiry end, and the keys under them go.
    fn expire(&mut self, now: Instant) {
        let ended: Vec<i64> = self
            .state
            .leases
            .iter()
            .filter(|(_, &at)| at <= now)
            .map(|(&id, _)| id)
            .collect();
        for id in ended {
            self.end_lease(id, now);
        }
    }

    fn end_lease(&mut self, id: i64, now: Instant) {
        if !self.state.leases.contains_key(&id) {
            return;
        }
        self.changing(now);
        self.state.leases.remove(&id);
        let before = self.state.kv.len();
        self.state.kv.retain(|_, e| e.lease != id);
        if self.state.kv.len() != before {
            self.state.revision += 1;
        }
    }

    /// The pair's keys in one revision, as etcd handled the read at
    /// `then`: a read answered late carries the state of when it was
    /// handled.
    pub fn view(&mut self, keys: &Keys, now: Instant, then: Instant) -> View {
        self.expire(now);
        let state = self
            .past
            .iter()
            .find(|(until, _)| *until > then)
            .map_or(&self.state, |(_, s)| s);
        let mut view = View {
            revision: state.revision,
            ..View::default()
        };
        for (key, e) in &state.kv {
            view.read(keys, key, &e.value, e.modified, e.lease)
                .unwrap_or_else(|why| panic!("the simulation wrote {key} badly: {why}"));
        }
        view
    }

    /// Run `txn`, its leased puts under `lease`: the revision it wrote
    /// at, or `None` when a compare failed (or the lease is gone).
    pub fn run(&mut self, txn: &Txn, lease: i64, now: Instant) -> Option<i64> {
        self.expire(now);
        let holds = txn.when.iter().all(|c| match c {
            Compare::Absent(key) => !self.state.kv.contains_key(key),
            Compare::Unchanged(key, rev) => {
                self.state.kv.get(key).map_or(0, |e| e.modified) == *rev
            }
        });
        let leased = txn.then.iter().any(|p| p.leased);
        if !holds || (leased && !self.state.leases.contains_key(&lease)) {
            return None;
        }
        self.changing(now);
        self.state.revision += 1;
        let revision = self.state.revision;
        for put in &txn.then {
            self.state.kv.insert(
                put.key.clone(),
                Entry {
                    value: put.value.clone(),
                    modified: revision,
                    lease: if put.leased { lease } else { 0 },
                },
            );
        }
        Some(revision)
    }

    /// A new lease of the TTL, from now.
    pub fn grant(&mut self, now: Instant) -> i64 {
        self.expire(now);
        self.changing(now);
        self.leases_granted += 1;
        let id = self.leases_granted;
        self.state.leases.insert(id, now + self.ttl);
        id
    }

    /// Renew `id` from now: the TTL, or zero when it is gone.
    pub fn keep_alive(&mut self, id: i64, now: Instant) -> Duration {
        self.expire(now);
        match self.state.leases.get_mut(&id) {
            Some(at) => {
                *at = now + self.ttl;
                self.ttl
            }
            None => Duration::ZERO,
        }
    }

    pub fn revoke(&mut self, id: i64, now: Instant) {
        self.end_lease(id, now);
    }

    /// etcd loses its data: it starts again empty.
    pub fn wipe(&mut self, now: Instant) {
        self.changing(now);
        self.state = State::fresh();
    }

    /// etcd is restored from the snapshot `back` changes ago (at most as
    /// far as it keeps). A restored lease runs a full TTL from now, as
    /// etcd extends every lease when a member starts.
    pub fn restore(&mut self, back: usize, now: Instant) {
        if self.past.is_empty() {
            return;
        }
        let at = self.past.len() - back.clamp(1, self.past.len());
        let mut state = self.past[at].1.clone();
        for expiry in state.leases.values_mut() {
            *expiry = now + self.ttl;
        }
        self.changing(now);
        self.state = state;
    }
}
