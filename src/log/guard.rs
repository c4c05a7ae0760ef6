//! The mutation/freeze gate: a snapshot freezes the log's framed mutations
//! so that the store it copies matches a sequence exactly.

use std::collections::HashMap;
use std::marker::PhantomData;
use std::sync::{Condvar, Mutex};
use std::thread::{self, ThreadId};

use super::{lock, Log};

#[derive(Debug, Default)]
pub(super) struct FreezeGate {
    state: Mutex<GateState>,
    changed: Condvar,
}

#[derive(Debug, Default)]
struct GateState {
    freezer: Option<ThreadId>,
    /// Threads inside a mutation, with their nesting depth.
    in_flight: HashMap<ThreadId, usize>,
    /// Threads waiting to enter one while another thread freezes.
    held_back: usize,
}

/// A framed mutation in progress ([`Log::mutation`]).
#[must_use = "the mutation ends when the guard is dropped"]
#[derive(Debug)]
pub struct MutationGuard<'a> {
    gate: &'a FreezeGate,
    /// Bound to the thread that entered: the gate counts per thread.
    _not_send: PhantomData<*const ()>,
}

/// The log frozen ([`Log::freeze`]).
#[must_use = "the freeze ends when the guard is dropped"]
#[derive(Debug)]
pub struct FreezeGuard<'a> {
    gate: &'a FreezeGate,
    _not_send: PhantomData<*const ()>,
}

impl FreezeGate {
    fn wait<'a>(
        &self,
        g: std::sync::MutexGuard<'a, GateState>,
    ) -> std::sync::MutexGuard<'a, GateState> {
        self.changed.wait(g).unwrap_or_else(|e| e.into_inner())
    }
}

impl Log {
    /// Enter a framed mutation. Hold the guard from before the frame is
    /// appended until the store has the write. Waits while another thread
    /// holds [`Log::freeze`]; the freezing thread itself passes (a mutation
    /// it causes lands after the snapshot's sequence and is replayed, which
    /// every apply tolerates). Nested guards on one thread count once.
    pub fn mutation(&self) -> MutationGuard<'_> {
        let gate = &self.gate;
        let me = thread::current().id();
        let mut g = lock(&gate.state);
        if let Some(depth) = g.in_flight.get_mut(&me) {
            *depth += 1;
            return MutationGuard {
                gate,
                _not_send: PhantomData,
            };
        }
        while g.freezer.is_some_and(|f| f != me) {
            g.held_back += 1;
            g = gate.wait(g);
            g.held_back -= 1;
        }
        g.in_flight.insert(me, 1);
        MutationGuard {
            gate,
            _not_send: PhantomData,
        }
    }

    /// Whether a freeze is held or waiting for the mutations in flight,
    /// and how many threads wait to enter a mutation meanwhile: what a
    /// test waits on rather than sleeping.
    pub fn freeze_state(&self) -> (bool, usize) {
        let g = lock(&self.gate.state);
        (g.freezer.is_some(), g.held_back)
    }

    /// Freeze: no new framed mutation starts on another thread, and this
    /// returns once every one in flight has reached its store. Reads are
    /// untouched. One freezer at a time.
    ///
    /// # Panics
    /// When called from inside a mutation, which would wait for itself.
    pub fn freeze(&self) -> FreezeGuard<'_> {
        let gate = &self.gate;
        let me = thread::current().id();
        let mut g = lock(&gate.state);
        assert!(
            !g.in_flight.contains_key(&me),
            "Log::freeze called inside a mutation: it would wait for itself"
        );
        while g.freezer.is_some() {
            g = gate.wait(g);
        }
        g.freezer = Some(me);
        while !g.in_flight.is_empty() {
            g = gate.wait(g);
        }
        FreezeGuard {
            gate,
            _not_send: PhantomData,
        }
    }
}

impl Drop for MutationGuard<'_> {
    fn drop(&mut self) {
        let me = thread::current().id();
        let mut g = lock(&self.gate.state);
        if let Some(depth) = g.in_flight.get_mut(&me) {
            *depth -= 1;
            if *depth == 0 {
                g.in_flight.remove(&me);
                self.gate.changed.notify_all();
            }
        }
    }
}

impl Drop for FreezeGuard<'_> {
    fn drop(&mut self) {
        let mut g = lock(&self.gate.state);
        g.freezer = None;
        self.gate.changed.notify_all();
    }
}
