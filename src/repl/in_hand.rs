//! Frames staged and not yet durable, as the stream carries them: a
//! primary puts a group here before its fdatasync, so that it is shipped
//! to the twin while the local sync runs (as DRBD's protocol C does), and
//! takes it out once the sync made it readable from the log. A `twin`
//! acknowledgement still waits for both syncs; a crash between them
//! leaves the twin ahead, which the handshake resolves
//! ([`super::msg::Refusal::LostOnPrimary`]).

use std::collections::VecDeque;
use std::sync::Mutex;

use bytes::Bytes;

/// See the module documentation.
#[derive(Debug, Default)]
pub struct InHand {
    frames: Mutex<VecDeque<(u64, Bytes)>>,
}

impl InHand {
    /// A staged group: `(seq, bytes)` per frame, in order.
    pub fn put(&self, group: impl IntoIterator<Item = (u64, Bytes)>) {
        let mut f = self.frames.lock().unwrap_or_else(|e| e.into_inner());
        f.extend(group);
    }

    /// Frames through `seq` are readable from the log now.
    pub fn durable_through(&self, seq: u64) {
        let mut f = self.frames.lock().unwrap_or_else(|e| e.into_inner());
        while f.front().is_some_and(|(s, _)| *s <= seq) {
            f.pop_front();
        }
    }

    /// Frame `seq`'s stream bytes, while it is in hand.
    pub fn get(&self, seq: u64) -> Option<Bytes> {
        let f = self.frames.lock().unwrap_or_else(|e| e.into_inner());
        let first = f.front()?.0;
        let i = usize::try_from(seq.checked_sub(first)?).ok()?;
        f.get(i).filter(|(s, _)| *s == seq).map(|(_, b)| b.clone())
    }
}

/// Frame `seq` as the stream carries it, handed to `out` in pieces of at
/// most `piece` bytes: from the buffer in hand while it is there, else
/// from the log, once durable there.
pub fn ship_frame<E: From<crate::log::Error>>(
    log: &crate::log::Log,
    in_hand: &InHand,
    seq: u64,
    piece: usize,
    mut out: impl FnMut(&[u8]) -> Result<(), E>,
) -> Result<(), E> {
    if let Some(bytes) = in_hand.get(seq) {
        return out(&bytes);
    }
    // Staged by another path and announced before its own sync, or taken
    // out of hand since: readable once durable.
    if seq > log.head_seq() {
        log.sync_through(seq)?;
    }
    super::apply::ship_frame(log, seq, piece, out)
}
