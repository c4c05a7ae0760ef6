//! `primary verify`: the twin's frames compared with this log's while both
//! serve ([`crate::repl::verify`]). The twin session carries the questions;
//! this side digests its own ranges at the same pace and keeps the search.

use tokio::sync::{mpsc, oneshot};

use super::Primary;
use crate::node::verify::{self, VerifyReport};
use crate::repl::verify::{Ask, Digest, Found, Search};

/// Where the twin's digests for a question go, or why it has none in its
/// own words, as the wire carries them.
pub(super) type VerifyReply = oneshot::Sender<Result<Vec<Digest>, String>>;

/// Why a verify stopped before it found its answer.
#[derive(Debug, thiserror::Error)]
enum VerifyStopped {
    #[error("no twin streams from this primary")]
    NoTwin,
    #[error("this log: {0}")]
    Ours(verify::DigestError),
    #[error("the twin session ended")]
    SessionEnded,
    /// The twin's reason, in its words.
    #[error("the twin: {0}")]
    Twin(String),
}

/// A question for the twin, the pace to read at (MiB/s), and where its
/// digests go.
pub(super) type VerifyCall = (Ask, u32, VerifyReply);

/// Frames per digest at first: a difference costs about three more
/// questions to find.
const FIRST_STEP: u64 = 64;

impl Primary {
    /// The twin session that streams takes verify questions from here.
    pub(super) fn verify_questions(&self) -> mpsc::UnboundedReceiver<VerifyCall> {
        let (tx, rx) = mpsc::unbounded_channel();
        *self.verifier.lock().unwrap_or_else(|e| e.into_inner()) = Some(tx);
        rx
    }

    /// Compare the twin's frames `from..=through` with this log's (0, 0:
    /// every frame both hold, up to what the twin acknowledged and both
    /// stores applied), each box reading at `mib_per_s` (0: the default),
    /// and keep the report for `status`.
    pub async fn verify(&self, from: u64, through: u64, mib_per_s: u32) -> VerifyReport {
        let mib_per_s = (verify::verify_rate(mib_per_s) >> 20) as u32;
        let started = crate::node::clock::instant();
        let seq_cst = std::sync::atomic::Ordering::SeqCst;
        let mut hi = self.log.head_seq().min(*self.acked.borrow());
        // An erase is carried out on each box as its store applies it:
        // past what both applied, erased frames may differ for a while.
        if let Some(h) = self.store.as_ref().map(|s| s.health()) {
            hi = hi.min(h.applied);
        }
        if let Some(h) = self.twin_store.borrow().as_ref() {
            hi = hi.min(h.applied);
        }
        if through > 0 {
            hi = hi.min(through);
        }
        let lo = from
            .max(1)
            .max(self.log.first_seq())
            .max(self.twin_first.load(seq_cst));
        let mut report = VerifyReport {
            from: lo,
            through: hi,
            mib_per_s,
            ..VerifyReport::default()
        };
        if lo <= hi {
            let mut search = Search::new(lo, hi, FIRST_STEP);
            let mut found = search.step();
            while let Found::Ask(ask) = found {
                match self.compare(ask, mib_per_s, &mut report).await {
                    Ok((ours, theirs)) => found = search.answer(&ours, &theirs),
                    Err(why) => {
                        report.stopped = Some(why.to_string());
                        break;
                    }
                }
            }
            if let Found::Differs(seq) = found {
                report.first_difference = Some(seq);
            }
        }
        report.ended_ms = verify::unix_ms();
        report.took_ms = started.elapsed().as_millis() as u64;
        match (&report.first_difference, &report.stopped) {
            (Some(seq), _) => {
                tracing::error!(seq, "VERIFY: the twin's frame {seq} is not this primary's")
            }
            (None, Some(why)) => tracing::warn!(why, "verify stopped"),
            (None, None) => tracing::info!(
                from = report.from,
                through = report.through,
                bytes = report.bytes,
                "verify: the twin's frames are this primary's"
            ),
        }
        *self.last_verify.lock().unwrap_or_else(|e| e.into_inner()) = Some(report.clone());
        report
    }

    /// Both sides' digests of `ask`.
    async fn compare(
        &self,
        ask: Ask,
        mib_per_s: u32,
        report: &mut VerifyReport,
    ) -> Result<(Vec<Digest>, Vec<Digest>), VerifyStopped> {
        let (tx, rx) = oneshot::channel();
        let sent = self
            .verifier
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .is_some_and(|v| v.send((ask, mib_per_s, tx)).is_ok());
        if !sent {
            return Err(VerifyStopped::NoTwin);
        }
        let ours = verify::digests(
            self.log.clone(),
            self.epochs.history(),
            ask,
            verify::verify_rate(mib_per_s),
        );
        let (ours, theirs) = tokio::join!(ours, rx);
        let (ours, bytes) = ours.map_err(VerifyStopped::Ours)?;
        report.bytes += bytes;
        let theirs = theirs
            .map_err(|_| VerifyStopped::SessionEnded)?
            .map_err(VerifyStopped::Twin)?;
        Ok((ours, theirs))
    }
}
