//! The operator's parts of the cluster and the drivers of the failover
//! machines: promote (and the call to the predecessor), rejoin, a
//! switchover on both boxes, fences, and settling the pair after the
//! faults. Each runs the production machine of `crate::repl` and carries
//! out its steps, as `crate::node` and `crate::daemon` do with files and
//! sockets.

use super::*;
use crate::repl::msg::{PrimaryMsg, Refusal};
use crate::repl::primary::PrimaryCore;
use crate::repl::promote::{may_promote, PromoteRefusal, Told};
use crate::repl::rejoin::{LogFacts, LogHead, Rejoin, RejoinRefusal, Step};
use crate::repl::switchover::{Outcome, SwitchAction};

/// Why a promotion was not made.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PromoteError {
    /// The box is no running twin.
    NotATwin,
    /// [`may_promote`] refused it.
    Refused(PromoteRefusal),
    /// The epochs refused it.
    Epochs(String),
}

/// Why a rejoin stopped.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RejoinError {
    /// This box is no running primary, or no primary on the other box
    /// answers.
    Unreachable(String),
    /// The rejoin's rules refused it; its fence may have been recorded.
    Refused(RejoinRefusal),
}

/// How often a promoted box calls its predecessor while it is not heard.
const CALL_EVERY: Duration = Duration::from_millis(50);

impl Cluster {
    /// The log's head as a hello names it.
    fn log_head(&self, side: Side) -> LogHead {
        let log = self.log(side);
        let pos = link::position(log, log.head_seq());
        LogHead {
            history: log.history().0,
            head: pos.seq,
            head_crc: pos.crc,
            first: log.first_seq(),
        }
    }

    /// `hello` reaches the primary on the other box of `from`, as a twin's
    /// would, and the one answer comes back. The other box carries out
    /// what its core asks: a newer epoch fences it.
    fn hello_once(&mut self, from: Side, hello: crate::repl::TwinMsg) -> Option<PrimaryMsg> {
        let to = from.other();
        self.sync(to);
        let t = self.machine(to);
        let view = link::primary_view(&t.log, t.epochs.history.clone());
        let mut core = PrimaryCore::new(self.cfg.timers, view, self.now);
        core.handle_hello(
            hello,
            |seq| crate::repl::apply::head_frame(&t.log, seq),
            self.now,
        );
        let answer = core.poll_transmit();
        while let Some(action) = core.poll_action() {
            if let PrimaryAction::Fence { epoch } = action {
                self.fence(to, epoch, "a box saying hello of a newer epoch");
            }
        }
        answer
    }

    /// `twin promote`: the twin, stopped, becomes a primary of the next
    /// term from its head, if it may ([`may_promote`]); from then on it
    /// calls its predecessor until heard. Answers the new epoch.
    pub fn promote(&mut self, side: Side, force: bool) -> Result<u64, PromoteError> {
        self.promote_steps(side, force, false)
    }

    /// `twin promote` that loses power after it recorded the new epoch and
    /// before the box became a primary: it comes back a twin of that
    /// epoch.
    pub fn promote_interrupted(&mut self, side: Side, force: bool) -> Result<u64, PromoteError> {
        self.promote_steps(side, force, true)
    }

    fn promote_steps(&mut self, side: Side, force: bool, cut: bool) -> Result<u64, PromoteError> {
        if !self.is_up(side) || self.role(side) != Role::Twin {
            return Err(PromoteError::NotATwin);
        }
        let heard = self.machine(side).heard_primary;
        let (now, epoch0) = (self.now.at, self.now.unix_ms);
        let heard_ms =
            heard.map(|h| epoch0.saturating_sub(now.duration_since(h).as_millis() as u64));
        may_promote(heard_ms, epoch0, PROMOTE_QUIET, force).map_err(PromoteError::Refused)?;
        if self.link.is_some() {
            self.drop_link(&format!("{side:?} stopped to be promoted"), None);
        }
        let head = self.log(side).head_seq();
        let epoch = self
            .machine_mut(side)
            .epochs
            .promote(head)
            .map_err(|e| PromoteError::Epochs(e.to_string()))?;
        self.began(side, Some(epoch));
        if cut {
            self.note(format!("{side:?} recorded epoch {epoch}, then lost power"));
            self.crash(side, None);
            return Ok(epoch);
        }
        self.become_primary(side);
        self.note(format!("{side:?} promoted to epoch {epoch} at {head}"));
        Ok(epoch)
    }

    /// A box whose epoch is promoted (`twin promote`, a takeover) runs as
    /// a primary, and owes its predecessor a call.
    pub(super) fn become_primary(&mut self, side: Side) {
        let call = !self.sabotage.no_predecessor_call;
        let now = self.now.at;
        let head = self.log_head(side);
        let m = self.machine_mut(side);
        m.role = Role::Primary;
        m.log.set_follower(false);
        m.staged = m.log.head_seq();
        m.heard_primary = None;
        // It starts serving: the epoch its promotion began.
        let _ = m.epochs.restart(m.staged);
        // The first call goes once the new primary's daemon serves.
        if call {
            m.predecessor = Some((Predecessor::new(m.epochs.clone(), head), now + CALL_EVERY));
        }
    }

    /// A promoted box calls its predecessor, as a twin of its epoch, until
    /// it hears back: then the predecessor is fenced, or this box learns
    /// it is the stale one.
    pub(super) fn call_predecessors(&mut self) {
        for side in Side::BOTH {
            let due = match &self.machine(side).predecessor {
                Some((_, at)) => *at <= self.now.at,
                None => continue,
            };
            if !due || !self.is_up(side) || self.role(side) != Role::Primary {
                continue;
            }
            let other = side.other();
            // A predecessor that follows this box heard of it already.
            if self.streaming() && self.link.as_ref().is_some_and(|(p, _)| *p == side) {
                self.machine_mut(side).predecessor = None;
                continue;
            }
            if !self.reachable(other, Role::Primary) {
                let next = self.now.at + CALL_EVERY;
                if let Some(p) = self.machine_mut(side).predecessor.as_mut() {
                    p.1 = next;
                }
                continue;
            }
            let Some((call, _)) = self.machine(side).predecessor.clone() else {
                continue;
            };
            let answer = self.hello_once(side, call.hello());
            match call.answer(answer) {
                Told::Fenced => {
                    self.note(format!("{side:?} told its predecessor {other:?}"));
                    self.machine_mut(side).predecessor = None;
                }
                Told::Newer { epoch } => {
                    self.fence(side, epoch, "its predecessor, which is newer");
                    self.machine_mut(side).predecessor = None;
                }
                Told::NotYet(why) => {
                    self.note(format!("{side:?}'s call to {other:?}: {why}"));
                    let next = self.now.at + CALL_EVERY;
                    if let Some(p) = self.machine_mut(side).predecessor.as_mut() {
                        p.1 = next;
                    }
                }
            }
        }
    }

    /// `primary fence --epoch N` on `side`: a hold that names no epoch as
    /// heard (sabotaged: the epoch, as heard).
    pub fn operator_fence(&mut self, side: Side, epoch: u64) {
        if !self.is_up(side) {
            return;
        }
        if self.sabotage.fence_by_hearsay {
            self.fence(side, epoch, "the operator");
        } else if self.machine_mut(side).epochs.hold("the operator") {
            self.note(format!("{side:?} held by the operator (naming {epoch})"));
        }
    }

    /// `primary unfence`: a held primary is released; one fenced by a
    /// newer epoch becomes the primary of a new term, on purpose.
    pub fn unfence(&mut self, side: Side) -> Result<u64, String> {
        if self.role(side) != Role::Primary || !self.epochs(side).fenced() {
            return Err(format!("{side:?} is no fenced primary"));
        }
        let head = self.log(side).head_seq();
        let m = self.machine_mut(side);
        m.gate = Gate::default();
        if m.epochs.seen <= m.epochs.current() {
            self.release(side);
            self.note(format!("{side:?}'s hold lifted"));
            return Ok(self.epochs(side).current());
        }
        let epoch = m.epochs.promote(head).map_err(|e| e.to_string())?;
        let _ = m.epochs.restart(head);
        self.began(side, Some(epoch));
        self.note(format!("{side:?} unfenced into epoch {epoch}"));
        Ok(epoch)
    }

    /// `primary rejoin` on the stopped primary `side`, running the
    /// rejoin's plan step by step; with `crash_after`, the box loses power
    /// after that many steps (the last one being its turn into a twin).
    /// Answers the fork.
    pub fn rejoin(&mut self, side: Side, crash_after: Option<usize>) -> Result<u64, RejoinError> {
        if !self.is_up(side) || self.role(side) != Role::Primary {
            return Err(RejoinError::Unreachable(format!(
                "{side:?} is no running primary"
            )));
        }
        if !self.reachable(side.other(), Role::Primary) {
            return Err(RejoinError::Unreachable(format!(
                "no primary on {:?} answers",
                side.other()
            )));
        }
        // The daemon is stopped for a rejoin: it syncs, and its connection
        // and the clients waiting on it go.
        if self.link.is_some() {
            self.drop_link(&format!("{side:?} stopped to rejoin"), None);
        }
        self.sync(side);
        let m = self.machine_mut(side);
        m.waiting.clear();
        m.gate = Gate::default();
        m.switchover = None;
        let machine = Rejoin::new(self.epochs(side).clone(), self.log_head(side));
        let answer = self.hello_once(side, machine.hello());
        let heard = machine.answer(answer).map_err(RejoinError::Refused)?;
        let before = self.frames(side);
        let fork = heard.fork;
        let log = self.log(side);
        let fork_frame = (fork > 0 && fork < log.head_seq()).then(|| {
            let l = log
                .locate_blob(fork)
                .unwrap_or_else(|e| panic!("frame {fork} of a simulated log: {e}"));
            (l.payload_crc, l.is_erased())
        });
        let facts = LogFacts {
            head: log.head_seq(),
            first: log.first_seq(),
            fork_frame,
            store_applied: 0,
            store_frames_past_fork: false,
        };
        let (plan, stop) = match machine.plan(heard, facts) {
            Ok(plan) => (plan, None),
            Err((plan, why)) => (plan, Some(why)),
        };
        let mut record = RejoinRecord {
            side,
            before,
            new_primary: self.frames(side.other()),
            fork,
            saved: None,
            after: None,
        };
        let mut done = 0;
        for step in &plan.steps {
            if crash_after == Some(done) {
                break;
            }
            match *step {
                Step::Fence { epoch } => {
                    self.fence(side, epoch, &format!("the rejoin to {:?}", side.other()))
                }
                Step::Save { after, .. } => {
                    if !self.sabotage.skip_save {
                        record.saved = Some(self.frames(side)[after as usize..].to_vec());
                    }
                }
                Step::Store(_) => {}
                Step::Cut { after } => {
                    if !self.sabotage.keep_tail {
                        if let Err(e) = self.log(side).truncate_after(after) {
                            panic!("cut of {side:?} after {after}: {e}");
                        }
                        self.machine_mut(side).writes.truncate(after as usize);
                        record.after = Some(self.frames(side));
                    }
                }
            }
            done += 1;
        }
        let finished = done == plan.steps.len() && stop.is_none();
        if finished && crash_after != Some(done) {
            let m = self.machine_mut(side);
            m.role = Role::Twin;
            m.log.set_follower(true);
            m.staged = m.log.head_seq();
            if self.sabotage.keep_tail {
                let history = self.epochs(side.other()).history.clone();
                self.machine_mut(side).epochs.follow(history);
            }
            self.began(side, None);
            self.note(format!("{side:?} rejoined at {fork}"));
        }
        self.rejoins.push(record);
        if crash_after.is_some_and(|k| k <= plan.steps.len() + 1) {
            self.note(format!("{side:?} lost power during its rejoin"));
            self.crash(side, None);
        }
        self.reconnect_at = self.now.at;
        self.pump();
        match stop {
            Some(why) => Err(RejoinError::Refused(why)),
            None => Ok(fork),
        }
    }

    /// An operator gives up on a box's log: moved aside whole (kept for
    /// the checker), and the box starts as an empty twin.
    pub fn start_afresh(&mut self, side: Side) -> Result<(), String> {
        if !self.is_up(side) || self.role(side) != Role::Primary {
            return Err(format!("{side:?} is no running primary"));
        }
        if self.link.is_some() {
            self.drop_link(&format!("{side:?} stopped to start afresh"), None);
        }
        self.set_aside.push(self.frames(side));
        let cfg = self.cfg;
        *self.machine_mut(side) = Machine::new(&cfg, Role::Twin);
        self.note(format!(
            "{side:?} moved its log aside and starts as an empty twin"
        ));
        self.reconnect_at = self.now.at;
        self.pump();
        Ok(())
    }

    /// A planned switchover on the primary `side`: the machine pauses
    /// writes and runs from [`Cluster::pump`].
    pub fn switchover(&mut self, side: Side) -> Result<(), String> {
        let streams = self.streaming() && self.link.as_ref().is_some_and(|(p, _)| *p == side);
        let now = self.now.at;
        let m = self.machine_mut(side);
        if !m.up || m.role != Role::Primary || m.epochs.fenced() {
            return Err(format!("{side:?} is no running, unfenced primary"));
        }
        if !streams {
            return Err("no twin is streaming".into());
        }
        let Some(sw) = Switchover::start(&mut m.gate, now, SWITCHOVER_WAIT) else {
            return Err("a switchover is under way".into());
        };
        m.switchover = Some(sw);
        self.note(format!("{side:?} starts a switchover"));
        self.pump();
        Ok(())
    }

    /// Run each switchover under way as its machine says.
    pub(super) fn drive_switchovers(&mut self) {
        for side in Side::BOTH {
            let Some(mut sw) = self.machine_mut(side).switchover.take() else {
                continue;
            };
            let head = self.log(side).head_seq();
            let (acked, streaming) = match &self.link {
                Some((p, l)) if *p == side => (l.primary.acked(), l.streaming()),
                _ => (0, false),
            };
            let now = self.now.at;
            let mut actions = sw.poll(
                &mut self.machine_mut(side).gate,
                head,
                acked,
                streaming,
                now,
            );
            while !actions.is_empty() {
                let mut next = Vec::new();
                for action in actions {
                    match action {
                        SwitchAction::Hold { why } => {
                            let volatile = self.sabotage.volatile_hold;
                            let m = self.machine_mut(side);
                            m.epochs.hold(&why);
                            m.hold_volatile = volatile;
                            next.extend(sw.held(&mut m.gate, Ok(())));
                        }
                        SwitchAction::Handover { head } => {
                            let sent = match self.link.as_mut() {
                                Some((p, link)) if *p == side => {
                                    let sent = link.primary.handover(head, Vec::new());
                                    link.transmit(self.now);
                                    sent
                                }
                                _ => false,
                            };
                            if sent {
                                sw.sent();
                                self.machine_mut(side).deposed = true;
                                self.note(format!("{side:?} handed over at {head}"));
                            }
                        }
                        SwitchAction::Release => self.release(side),
                        SwitchAction::Finish(outcome) => {
                            self.switchover_finished(side, outcome);
                        }
                    }
                }
                actions = next;
            }
            if !sw.done() {
                self.machine_mut(side).switchover = Some(sw);
            }
        }
    }

    /// The twin answered the handover of `side`'s switchover.
    pub(super) fn switchover_answered(&mut self, side: Side, answer: Result<u64, String>) {
        let Some(mut sw) = self.machine_mut(side).switchover.take() else {
            return;
        };
        if let Ok(epoch) = answer {
            self.fence(side, epoch, "the switchover");
        }
        let m = self.machine_mut(side);
        let actions = match answer {
            Ok(epoch) => sw.promoted(&mut m.gate, epoch),
            Err(why) => sw.refused(&mut m.gate, why),
        };
        for action in actions {
            match action {
                SwitchAction::Release => self.release(side),
                SwitchAction::Finish(outcome) => self.switchover_finished(side, outcome),
                _ => {}
            }
        }
        if !sw.done() {
            self.machine_mut(side).switchover = Some(sw);
        }
    }

    /// Lift a hold: the twin said it did not take over, or an operator.
    fn release(&mut self, side: Side) {
        let m = self.machine_mut(side);
        m.epochs.release();
        m.hold_volatile = false;
        if !m.epochs.fenced() {
            m.deposed = false;
        }
    }

    fn switchover_finished(&mut self, side: Side, outcome: Outcome) {
        self.note(format!("{side:?}'s switchover: {outcome:?}"));
        if let Outcome::Promoted { .. } = outcome {
            // Fenced already: follow the new primary
            // (`follow_after_switchover`).
            let m = self.machine_mut(side);
            m.role = Role::Twin;
            m.log.set_follower(true);
            m.waiting.clear();
            m.gate = Gate::default();
            m.hold_volatile = false;
            self.began(side, None);
            self.drop_link("switched over", None);
            self.backoff.reset();
            self.reconnect_at = self.now.at;
        }
    }

    /// The twin `side` took a `Handover` at `head`: it becomes a primary
    /// of the next term and answers `Promoted` (`promote_in_place`).
    pub(super) fn take_over(&mut self, side: Side, head: u64) {
        let m = self.machine_mut(side);
        let epoch = match m.epochs.promote(head) {
            Ok(epoch) => epoch,
            Err(e) => {
                let why = format!("{side:?} could not take over: {e}");
                if let Some((_, link)) = self.link.as_mut() {
                    link.twin.handover_refused(why.clone());
                    link.transmit(self.now);
                }
                return self.note(why);
            }
        };
        self.began(side, Some(epoch));
        if std::mem::take(&mut self.crash_at_takeover) {
            self.note(format!(
                "{side:?} recorded epoch {epoch} at a takeover, then lost power"
            ));
            return self.crash(side, None);
        }
        // Like a promotion, it owes the old primary a call: the answer to
        // the handover may be lost.
        self.become_primary(side);
        self.note(format!("{side:?} took over at {head}: epoch {epoch}"));
        let history = self.epochs(side).history.clone();
        if let Some((_, link)) = self.link.as_mut() {
            link.twin.promoted(history, format!("{side:?}"));
            link.transmit(self.now);
        }
    }

    /// Whether `p` streams to its twin, which holds and acknowledged
    /// its whole log.
    pub(super) fn settled_on(&self, p: Side) -> bool {
        let head = self.log(p).head_seq();
        let acked = self.link.as_ref().map_or(0, |(_, l)| l.primary.acked());
        self.streaming()
            && self.machine(p).staged == head
            && self.log(p.other()).head_seq() == head
            && acked == head
    }

    /// Bring the boxes back to one primary streaming to its twin, as an
    /// operator would after the faults: heal the network, start every
    /// box, rejoin a stale primary to the newer one, promote a twin left
    /// without a primary, lift a hold whose switchover did not happen.
    /// Answers the primary once its twin holds its whole log,
    /// acknowledged; an error when `max_ms` pass first.
    pub fn settle(&mut self, max_ms: u64) -> Result<Side, String> {
        self.heal();
        for side in Side::BOTH {
            self.restart(side);
        }
        for _ in 0..8 {
            self.advance(PROMOTE_QUIET.as_millis() as u64);
            // A box may have lost power meanwhile (a takeover set to).
            for side in Side::BOTH {
                self.restart(side);
            }
            let primaries: Vec<Side> = Side::BOTH
                .into_iter()
                .filter(|&s| self.role(s) == Role::Primary)
                .collect();
            match primaries.as_slice() {
                [one, other] => {
                    let (a, b) = (self.epochs(*one).current(), self.epochs(*other).current());
                    let stale = if a < b { *one } else { *other };
                    match self.rejoin(stale, None) {
                        Ok(_) => {}
                        Err(RejoinError::Refused(RejoinRefusal::Refused(Refusal::History {
                            ..
                        }))) => self.start_afresh(stale)?,
                        Err(e) => return Err(format!("rejoin of {stale:?}: {e:?}")),
                    }
                }
                [] => {
                    let best = if self.log(Side::A).head_seq() >= self.log(Side::B).head_seq() {
                        Side::A
                    } else {
                        Side::B
                    };
                    self.promote(best, true)
                        .map_err(|e| format!("promote {best:?}: {e:?}"))?;
                }
                [p] if self.epochs(*p).fenced() => {
                    let p = *p;
                    // A hold whose switchover the twin never took: lift it.
                    // Else the newer primary is gone: promote the twin.
                    if self.epochs(p).held.is_some()
                        && self.epochs(p.other()).current() <= self.epochs(p).current()
                    {
                        self.unfence(p)?;
                    } else {
                        self.promote(p.other(), true)
                            .map_err(|e| format!("promote {:?}: {e:?}", p.other()))?;
                    }
                }
                [p] => {
                    let p = *p;
                    for _ in 0..max_ms {
                        if self.settled_on(p) {
                            return Ok(p);
                        }
                        self.advance(1);
                    }
                    return Err(format!("no convergence within {max_ms} ms"));
                }
                _ => return Err("more than two boxes".into()),
            }
        }
        Err("no settled pair after eight operator steps".into())
    }
}
