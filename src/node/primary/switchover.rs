//! A planned switchover: the primary hands its role to its twin with no
//! acknowledged frame left behind. Writes pause (new ones wait, bounded);
//! the writes admitted before finish; the twin acknowledges the head; the
//! twin session sends `Handover`; the twin promotes itself and answers
//! `Promoted`; this box fences itself and, in the daemon, becomes the new
//! primary's twin. Paused writers are then answered `Fenced` naming the new
//! primary, or go on as before when the switchover fails.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use super::Primary;
use crate::node::api::{ApiError, ClientRole, NewPrimary, Response};
use crate::repl::HandedClient;

/// The switchover state a primary shares between its requests and its
/// twin session.
pub(super) struct Switch {
    /// True while a switchover pauses writes.
    pub(super) handing_over: watch::Sender<bool>,
    /// Writing requests admitted and not finished.
    pub(super) writers: Arc<watch::Sender<usize>>,
    /// The head and clients to hand over, for the twin session to send.
    pub(super) handover: watch::Sender<Option<(u64, Vec<HandedClient>)>>,
    /// Set once the twin took over: where it serves.
    pub(super) deposed: watch::Sender<Option<NewPrimary>>,
}

impl Default for Switch {
    fn default() -> Self {
        Switch {
            handing_over: watch::channel(false).0,
            writers: Arc::new(watch::channel(0).0),
            handover: watch::channel(None).0,
            deposed: watch::channel(None).0,
        }
    }
}

/// Counts a writing request from its admission to its answer, which may be
/// given by another task than the one that admitted it (a pipeline's).
pub(super) struct Writing(Arc<watch::Sender<usize>>);

impl Writing {
    pub(super) fn enter(writers: &Arc<watch::Sender<usize>>) -> Self {
        writers.send_modify(|n| *n += 1);
        Writing(writers.clone())
    }
}

impl Drop for Writing {
    fn drop(&mut self) {
        self.0.send_modify(|n| *n -= 1);
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

    /// A writing request arriving during a switchover waits for it to end
    /// (bounded): then it is fenced, or goes on as before.
    pub(super) async fn pause_for_switchover(&self) {
        let mut rx = self.switch.handing_over.subscribe();
        let _ = tokio::time::timeout(PAUSE_CAP, rx.wait_for(|&h| !h)).await;
    }

    /// Hand the primary role to the twin; see the module's description.
    pub(super) async fn switchover(self: &Arc<Self>, wait: Duration) -> Response {
        if self.epochs.fenced() {
            return Response::Error(self.refusal(crate::repl::ack::NotAdmitted::Fenced, None));
        }
        if !self.status().twin_connected {
            return refused("no twin is streaming from this primary");
        }
        if self.switch.handing_over.send_replace(true) {
            return refused("a switchover is already under way");
        }
        let answer = self.hand_over(wait).await;
        self.switch.handing_over.send_replace(false);
        answer
    }

    async fn hand_over(self: &Arc<Self>, wait: Duration) -> Response {
        let deadline = tokio::time::Instant::now() + wait;
        let mut writers = self.switch.writers.subscribe();
        if tokio::time::timeout_at(deadline, writers.wait_for(|&n| n == 0))
            .await
            .is_err()
        {
            return refused(&format!(
                "writes admitted before it did not finish within {} ms",
                wait.as_millis()
            ));
        }
        let head = self.log.head_seq();
        let mut acked = self.acked.subscribe();
        if tokio::time::timeout_at(deadline, acked.wait_for(|&a| a >= head))
            .await
            .is_err()
        {
            return refused(&format!(
                "the twin did not acknowledge the head {head} within {} ms",
                wait.as_millis()
            ));
        }
        let clients = self
            .client_roles
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|(fp, role)| HandedClient {
                fingerprint: fp.to_string(),
                role: role_code(*role),
            })
            .collect();
        let mut deposed = self.switch.deposed.subscribe();
        self.switch.handover.send_replace(Some((head, clients)));
        let took = tokio::time::timeout_at(deadline, deposed.wait_for(|d| d.is_some())).await;
        self.switch.handover.send_replace(None);
        match took {
            Ok(Ok(np)) => {
                let primary = np.clone().unwrap_or_default();
                tracing::warn!(head, primary = %primary.addr, "switchover done: this box follows the new primary");
                Response::SwitchedOver {
                    epoch: self.epochs.newest(),
                    head,
                    primary,
                }
            }
            _ => {
                // The twin may have promoted itself and its answer been
                // lost: taking writes again could make two primaries. This
                // box stays fenced until an operator knows which it is.
                let unknown = self.epochs.state().unknown_successor();
                self.fence(
                    unknown,
                    "a switchover whose outcome is unknown: see whether the twin promoted itself (then `primary rejoin`), or else `primary unfence`",
                );
                Response::Error(ApiError::SwitchoverRefused {
                    why: format!(
                        "the twin did not answer the handover within {} ms; this box is fenced until an operator checks whether the twin promoted itself (then `primary rejoin`) or not (then `primary unfence`)",
                        wait.as_millis()
                    ),
                })
            }
        }
    }
}

fn refused(why: &str) -> Response {
    tracing::warn!(why, "switchover refused: writes go on");
    Response::Error(ApiError::SwitchoverRefused { why: why.into() })
}
