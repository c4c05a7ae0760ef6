//! A planned switchover, carried out: the rules are
//! [`crate::repl::switchover`]'s (pause, drain, hold durably, hand over,
//! and what each answer or silence means); this runs them over tokio and
//! the twin session. Paused writers are then answered `Fenced` naming the
//! new primary, or go on as before when the switchover fails.

use std::sync::{Arc, Mutex};

use std::time::Duration;

use tokio::sync::{mpsc, watch};

use super::Primary;
use crate::node::api::{ApiError, ClientRole, NewPrimary, Response};
use crate::repl::switchover::{Gate, Outcome, SwitchAction, Switchover};
use crate::repl::HandedClient;

/// What the twin session tells a switchover under way.
#[derive(Debug)]
pub(super) enum Heard {
    /// The `Handover` was queued to the twin.
    Sent,
    /// The twin is the primary of `epoch` now, serving at `at`.
    Promoted { epoch: u64, at: NewPrimary },
    /// The twin does not take over, or the session ended before the
    /// handover left.
    Refused(NoHandover),
}

/// Why a switchover's handover did not happen.
#[derive(Debug, thiserror::Error)]
pub(super) enum NoHandover {
    /// The twin said why, in its words.
    #[error("{0}")]
    TwinRefused(String),
    #[error("the twin session could not send the handover")]
    NotSent,
}

/// The switchover state a primary shares between its requests and its
/// twin session.
pub(super) struct Switch {
    /// Writes admitted and the switchover's pause: one lock, so no write
    /// slips between a pause and its count.
    gate: Mutex<Gate>,
    /// Bumped at every change of the gate: a switchover waits on it for
    /// writes to drain, a paused write for the pause to end.
    changed: watch::Sender<u64>,
    /// The head and clients to hand over, for the twin session to send.
    pub(super) handover: watch::Sender<Option<(u64, Vec<HandedClient>)>>,
    /// Where the twin session reports, while a switchover runs.
    pub(super) heard: Mutex<Option<mpsc::UnboundedSender<Heard>>>,
    /// Set once the twin took over: where it serves.
    pub(super) deposed: watch::Sender<Option<NewPrimary>>,
}

impl Default for Switch {
    fn default() -> Self {
        Switch {
            gate: Mutex::new(Gate::default()),
            changed: watch::channel(0).0,
            handover: watch::channel(None).0,
            heard: Mutex::new(None),
            deposed: watch::channel(None).0,
        }
    }
}

impl Switch {
    /// `f` on the gate; those waiting on it are woken when it changed.
    fn with_gate<R>(&self, f: impl FnOnce(&mut Gate) -> R) -> R {
        let mut gate = self.gate.lock().unwrap_or_else(|e| e.into_inner());
        let before = *gate;
        let out = f(&mut gate);
        if *gate != before {
            self.changed.send_modify(|n| *n += 1);
        }
        out
    }

    /// [`Primary::enter_write`]'s wait, on the node's clock.
    async fn enter(self: &Arc<Self>) -> Result<Writing, ()> {
        let mut changed = self.changed.subscribe();
        let deadline = crate::node::clock::instant() + PAUSE_CAP;
        loop {
            if self.with_gate(|g| g.admit()).is_ok() {
                return Ok(Writing(self.clone()));
            }
            let running = self
                .heard
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .is_some();
            if !running {
                return Err(());
            }
            if tokio::time::timeout_at(deadline, changed.changed())
                .await
                .map_or(true, |r| r.is_err())
            {
                return Err(());
            }
        }
    }

    /// Tell a switchover under way what the twin session saw.
    pub(super) fn tell(&self, heard: Heard) {
        if let Some(tx) = self
            .heard
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
        {
            let _ = tx.send(heard);
        }
    }
}

/// A writing request counted from its admission to its answer, which may
/// be given by another task than the one that admitted it (a pipeline's).
pub(super) struct Writing(Arc<Switch>);

impl Drop for Writing {
    fn drop(&mut self) {
        self.0.with_gate(|g| g.leave());
    }
}

/// The longest a write waits for a switchover to end.
const PAUSE_CAP: Duration = Duration::from_secs(30);

fn role_code(role: ClientRole) -> u8 {
    match role {
        ClientRole::Read => 0,
        ClientRole::Write => 1,
        ClientRole::Admin => 2,
    }
}

impl Primary {
    /// Where the primary is, once a switchover handed the role over.
    pub fn watch_deposed(&self) -> watch::Receiver<Option<NewPrimary>> {
        self.switch.deposed.subscribe()
    }

    /// Count a write in, waiting (bounded) while a switchover under way
    /// pauses writes. `Err` when writes stay paused: the switchover took
    /// the role, or its outcome is unknown and this box holds its writes
    /// (the caller's fence check then names why).
    pub(super) async fn enter_write(&self) -> Result<Writing, ()> {
        self.switch.enter().await
    }

    /// Hand the primary role to the twin; see the module's description.
    pub(super) async fn switchover(self: &Arc<Self>, wait: Duration) -> Response {
        if self.epochs.fenced() {
            return Response::Error(self.refusal(crate::repl::ack::NotAdmitted::Fenced, None));
        }
        if !self.status().twin_connected {
            return refused("no twin is streaming from this primary");
        }
        let now = crate::node::clock::instant();
        let (tx, rx) = mpsc::unbounded_channel();
        // Writes are paused and the switchover is seen under way in one
        // step: a write that finds them paused then looks for the
        // switchover, under the same lock, and must find it, or it would
        // be refused as if the switchover had ended.
        let started = {
            let mut heard = self.switch.heard.lock().unwrap_or_else(|e| e.into_inner());
            let sw = self
                .switch
                .with_gate(|g| Switchover::start(g, now.into_std(), wait));
            if sw.is_some() {
                *heard = Some(tx);
            }
            sw
        };
        let Some(sw) = started else {
            return refused("a switchover is already under way");
        };
        let outcome = self.run_switchover(sw, rx).await;
        *self.switch.heard.lock().unwrap_or_else(|e| e.into_inner()) = None;
        self.switch.handover.send_replace(None);
        // Writes waiting for its end look again: they go on, or are
        // answered as the fence says.
        self.switch.changed.send_modify(|n| *n += 1);
        match outcome {
            (Outcome::Promoted { epoch, head }, primary) => {
                let primary = primary.unwrap_or_default();
                tracing::warn!(head, primary = %primary.addr, "switchover done: this box follows the new primary");
                Response::SwitchedOver {
                    epoch,
                    head,
                    primary,
                }
            }
            (Outcome::Refused(why), _) => refused(&why.to_string()),
            (Outcome::Unknown { .. }, _) => Response::Error(ApiError::SwitchoverRefused {
                why: format!(
                    "the twin did not answer the handover within {} ms; this box is fenced until an operator checks whether the twin promoted itself (then `primary rejoin`) or not (then `primary unfence`)",
                    wait.as_millis()
                ),
            }),
        }
    }

    async fn run_switchover(
        self: &Arc<Self>,
        mut sw: Switchover,
        mut heard: mpsc::UnboundedReceiver<Heard>,
    ) -> (Outcome, Option<NewPrimary>) {
        let mut changed = self.switch.changed.subscribe();
        let mut acked = self.acked.subscribe();
        let mut new_primary = None;
        loop {
            let now = crate::node::clock::instant().into_std();
            // The head announced to the twin sessions: a frame staged by a
            // request no longer counted (its client went) is shipped and
            // synced all the same, and the handover covers it.
            let head = self.head.borrow().0.max(self.log.head_seq());
            let streaming = self.status().twin_connected;
            let ack = *acked.borrow_and_update();
            let mut actions = self
                .switch
                .with_gate(|g| sw.poll(g, head, ack, streaming, now));
            // What the actions lead to is polled for at once (a hold on
            // disk makes the handover due): the loop waits only when the
            // machine has nothing to do.
            let acted = !actions.is_empty();
            while !actions.is_empty() {
                let mut next = Vec::new();
                for action in actions {
                    match action {
                        SwitchAction::Hold { why } => {
                            // On disk before the handover leaves: a crash
                            // from here on brings this box back fenced.
                            let held = self.epochs.hold(&why).map(|_| ());
                            next.extend(self.switch.with_gate(|g| sw.held(g, held)));
                        }
                        SwitchAction::Handover { head } => {
                            self.switch
                                .handover
                                .send_replace(Some((head, self.handed_clients())));
                        }
                        SwitchAction::Release => {
                            if let Err(e) = self.epochs.release() {
                                tracing::error!(error = %e, "lifting the switchover's hold failed: this box stays fenced");
                            }
                        }
                        SwitchAction::Finish(outcome) => return (outcome, new_primary),
                    }
                }
                actions = next;
            }
            if acted {
                continue;
            }
            let deadline = tokio::time::Instant::from_std(sw.deadline());
            tokio::select! {
                _ = changed.changed() => {}
                _ = acked.changed() => {}
                _ = tokio::time::sleep_until(deadline) => {}
                h = heard.recv() => {
                    let actions = match h {
                        Some(Heard::Sent) => {
                            sw.sent();
                            Vec::new()
                        }
                        Some(Heard::Promoted { epoch, at }) => {
                            new_primary = Some(at);
                            self.switch.with_gate(|g| sw.promoted(g, epoch))
                        }
                        Some(Heard::Refused(why)) => {
                            self.switch.with_gate(|g| sw.refused(g, why.to_string()))
                        }
                        None => Vec::new(),
                    };
                    for action in actions {
                        match action {
                            SwitchAction::Release => {
                                if let Err(e) = self.epochs.release() {
                                    tracing::error!(error = %e, "lifting the switchover's hold failed: this box stays fenced");
                                }
                            }
                            SwitchAction::Finish(outcome) => return (outcome, new_primary),
                            _ => {}
                        }
                    }
                }
            }
        }
    }

    fn handed_clients(&self) -> Vec<HandedClient> {
        self.client_roles
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|(fp, role)| HandedClient {
                fingerprint: fp.to_string(),
                role: role_code(*role),
            })
            .collect()
    }
}

fn refused(why: &str) -> Response {
    tracing::warn!(why, "switchover refused: writes go on");
    Response::Error(ApiError::SwitchoverRefused { why: why.into() })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node::clock;

    /// A switchover under way: writes paused, its report channel open.
    fn paused() -> (Arc<Switch>, mpsc::UnboundedReceiver<Heard>) {
        let switch = Arc::new(Switch::default());
        let (tx, rx) = mpsc::unbounded_channel();
        *switch.heard.lock().expect("lock") = Some(tx);
        assert!(switch.with_gate(|g| g.pause()));
        (switch, rx)
    }

    #[tokio::test(start_paused = true)]
    async fn a_paused_write_waits_out_its_cap_on_the_node_clock() {
        let (switch, _rx) = paused();
        let started = clock::instant();
        assert!(switch.enter().await.is_err(), "writes stayed paused");
        assert_eq!(clock::instant() - started, PAUSE_CAP);
    }

    #[tokio::test(start_paused = true)]
    async fn a_paused_write_goes_on_once_the_switchover_resumes_writes() {
        let (switch, _rx) = paused();
        let resumer = switch.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(5)).await;
            resumer.with_gate(|g| g.resume());
        });
        let started = clock::instant();
        let writing = switch.enter().await.expect("admitted");
        assert_eq!(clock::instant() - started, Duration::from_secs(5));
        assert_eq!(switch.with_gate(|g| g.writers()), 1);
        drop(writing);
        assert_eq!(switch.with_gate(|g| g.writers()), 0);
    }
}
