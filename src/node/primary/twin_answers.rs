//! Small appends that asked for `twin` durability, durable here and not
//! yet answered: the appender leaves them here instead of waking a request
//! task that would only go back to waiting for the twin, and the twin
//! session, which wakes for the twin's acknowledgement anyway, answers
//! them all the next time it wakes.
//!
//! At one client a `twin` append is durable here before the twin has
//! acknowledged it (the twin's sync starts once the group reached it), so
//! the appender's answer cost one wake of the network thread for nothing.
//! Parked here, the append is handed back by the session's next turn
//! (the acknowledgement, a new group, a heartbeat), whatever woke it: the
//! request then waits for the twin under the policy as before, and finds
//! the acknowledgement already there. Only while a session streams; else
//! the appender answers at once.

use std::sync::Mutex;

use tokio::sync::oneshot;

use super::ApiError;

type Answer = oneshot::Sender<Result<u64, ApiError>>;

/// See the module documentation.
#[derive(Default)]
pub(super) struct TwinAnswers {
    parked: Mutex<Parked>,
}

#[derive(Default)]
struct Parked {
    /// A twin session streams and will wake to hand these back.
    streaming: bool,
    /// The twin's acknowledged durable head, as the session last saw it.
    acked: u64,
    waiting: Vec<(u64, Answer)>,
}

impl TwinAnswers {
    fn parked(&self) -> std::sync::MutexGuard<'_, Parked> {
        self.parked.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Frame `seq`, for which `done` waits, is durable here: answered now
    /// if the twin has it already or no session streams, else parked for
    /// the session's next turn.
    pub(super) fn durable_here(&self, seq: u64, done: Answer) {
        let mut p = self.parked();
        if p.streaming && p.acked < seq {
            p.waiting.push((seq, done));
        } else {
            drop(p);
            let _ = done.send(Ok(seq));
        }
    }

    /// The session's turn: the twin's durable head as it knows it, and
    /// whether it streams; every parked answer goes now.
    pub(super) fn turn(&self, acked: u64, streaming: bool) {
        let waiting = {
            let mut p = self.parked();
            p.acked = p.acked.max(acked);
            p.streaming = streaming;
            std::mem::take(&mut p.waiting)
        };
        for (seq, done) in waiting {
            let _ = done.send(Ok(seq));
        }
    }

    /// The session ended: nothing parks until the next one streams.
    pub(super) fn session_ended(&self) {
        self.turn(0, false);
    }

    /// Appends parked now.
    #[cfg(test)]
    pub(super) fn waiting(&self) -> usize {
        self.parked().waiting.len()
    }

    /// For the length of a twin session: however it ends, what is parked
    /// is answered and nothing parks after.
    pub(super) fn session(&self) -> Session<'_> {
        Session(self)
    }
}

/// See [`TwinAnswers::session`].
pub(super) struct Session<'a>(&'a TwinAnswers);

impl Drop for Session<'_> {
    fn drop(&mut self) {
        self.0.session_ended();
    }
}

impl Drop for TwinAnswers {
    /// Durable here all the same: the waiters are answered, and their wait
    /// for the twin ends as the primary stops.
    fn drop(&mut self) {
        self.session_ended();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer() -> (Answer, oneshot::Receiver<Result<u64, ApiError>>) {
        oneshot::channel()
    }

    #[test]
    fn without_a_streaming_session_an_append_is_answered_at_once() {
        let a = TwinAnswers::default();
        let (done, mut rx) = answer();
        a.durable_here(7, done);
        assert_eq!(rx.try_recv().ok().and_then(|r| r.ok()), Some(7));
    }

    #[test]
    fn while_a_session_streams_an_append_waits_for_its_next_turn() {
        let a = TwinAnswers::default();
        a.turn(3, true);
        let (done, mut rx) = answer();
        a.durable_here(5, done);
        assert!(rx.try_recv().is_err(), "parked");
        // Acknowledged already: answered at once.
        let (done, mut acked) = answer();
        a.durable_here(2, done);
        assert_eq!(acked.try_recv().ok().and_then(|r| r.ok()), Some(2));
        // Any turn hands the parked ones back, acknowledged or not.
        a.turn(4, true);
        assert_eq!(rx.try_recv().ok().and_then(|r| r.ok()), Some(5));
    }

    #[test]
    fn a_session_that_ends_or_a_primary_that_goes_answers_what_is_parked() {
        let a = TwinAnswers::default();
        a.turn(0, true);
        let (done, mut rx) = answer();
        a.durable_here(1, done);
        a.session_ended();
        assert_eq!(rx.try_recv().ok().and_then(|r| r.ok()), Some(1));
        let (done, mut rx) = answer();
        a.durable_here(2, done);
        assert_eq!(
            rx.try_recv().ok().and_then(|r| r.ok()),
            Some(2),
            "not parked"
        );
        a.turn(0, true);
        let (done, mut rx) = answer();
        a.durable_here(3, done);
        drop(a);
        assert_eq!(rx.try_recv().ok().and_then(|r| r.ok()), Some(3));
    }
}
