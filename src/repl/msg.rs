//! Control messages: serde values encoded with postcard, each sent as a
//! 4-byte little-endian length and the encoded bytes. `docs/PROTOCOL.md`
//! documents every message.

use serde::{Deserialize, Serialize};

use super::epochs::{EpochHistory, EpochName};

/// The protocol version both sides put in their first message.
pub const PROTOCOL_VERSION: u32 = 4;

/// The largest encoded control message either side accepts; a longer
/// length prefix is refused before anything is allocated.
pub const MAX_CONTROL_LEN: usize = 64 * 1024;

/// A position in a log: a sequence and the payload crc of the frame there.
/// Two logs of one history holding the same position hold the same frame.
/// `seq` 0 is "no frame" (crc 0).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Position {
    pub seq: u64,
    pub crc: u32,
}

/// A box's store as it reports itself: how far it applied the log, and
/// where it stopped, if a frame did not apply.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoreHealth {
    /// The seq the store has applied up to.
    pub applied: u64,
    /// Where the store stopped, when a frame did not apply.
    pub stalled: Option<StoreStall>,
    /// Frames skipped by StoreSkip frames, ever.
    pub skipped: u64,
}

/// A store stopped at a frame it cannot apply.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoreStall {
    /// The frame the store applies next and could not.
    pub seq: u64,
    /// Its kind; 0 when the stop is not one frame's (a store of another
    /// history, frames below the floor).
    pub kind: u16,
    pub error: String,
    /// When it first stopped there, ms since the Unix epoch.
    pub since_ms: u64,
    /// Tries since.
    pub attempts: u64,
}

/// The longest error text a store report carries: the message stays well
/// inside [`MAX_CONTROL_LEN`].
pub const MAX_STALL_ERROR: usize = 4096;

/// Twin → primary.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum TwinMsg {
    /// The first message of a connection: who the twin is and what it holds.
    Hello {
        version: u32,
        history: [u8; 16],
        /// The twin's durable head.
        head: Position,
        /// The twin's oldest retained sequence.
        first: u64,
        /// The epochs of the twin's log: where it forked from the
        /// primary's, if it did. The newest is the epoch it follows, its
        /// own: a box never passes on an epoch it only heard of.
        epochs: EpochHistory,
    },
    /// Every frame through `durable` is durable on the twin.
    Ack { durable: u64 },
    /// The twin refuses the connection, and says why.
    Refuse(Refusal),
    /// The twin's store: sent once streaming starts and whenever it
    /// changes, so the primary knows the twin applied what it holds (an
    /// erase is carried out there only then) or stopped.
    Store(StoreHealth),
    /// Answer to `Handover`: this box is now the primary of the newest
    /// epoch of `epochs` (its log's history, which proves it), and serves
    /// clients at `listen` (as configured: an unspecified address means
    /// the one this connection comes from).
    Promoted {
        epochs: EpochHistory,
        listen: String,
    },
    /// Answer to `Handover` when this box does not take over: nothing
    /// changed here, and the primary may take writes again.
    HandoverRefused(String),
    /// Answer to `Verify` `id`: one digest per range asked
    /// ([`super::verify`]), or why there are none.
    Digests {
        id: u64,
        digests: Vec<super::verify::Digest>,
        error: Option<String>,
    },
    /// The first message of a connection that asks only for the
    /// primary's epochs, after the arbiter forgot: what this box holds
    /// ([`super::amnesia`]). Answered `Epochs`, then the connection ends.
    AskEpochs(super::amnesia::PeerWord),
}

/// A client pinned on the primary, handed to the twin at a switchover so
/// that the same clients may write to it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HandedClient {
    /// Its certificate fingerprint, as `pin-client` takes it.
    pub fingerprint: String,
    /// 0 read, 1 write, 2 admin.
    pub role: u8,
}

/// Primary → twin.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum PrimaryMsg {
    /// The handshake's answer: frames follow on the frame stream from `from`.
    Welcome {
        version: u32,
        history: [u8; 16],
        from: u64,
        head: u64,
        first: u64,
        /// The epochs of the primary's log, which the twin's log, a prefix
        /// of it, takes; the newest is the one it serves.
        epochs: EpochHistory,
    },
    /// The twin's head is below the primary's retention floor: frames from
    /// `twin_head + 1` are gone, and the twin needs a snapshot.
    BelowFloor { first: u64, head: u64 },
    /// The primary's head and clock (milliseconds since the Unix epoch), so
    /// the twin knows its lag even when nothing is appended.
    Heartbeat { head: u64, unix_ms: u64 },
    /// The primary refuses the connection, and says why.
    Refuse(Refusal),
    /// A planned switchover: the primary takes no more writes, and the
    /// twin holds its whole log through `head` durably. The twin promotes
    /// itself (with these clients pinned) and answers `Promoted`.
    Handover {
        head: u64,
        clients: Vec<HandedClient>,
    },
    /// Digest frames `from..=through`, one digest per `step` frames
    /// (at most [`super::verify::MAX_DIGESTS`]), and answer `Digests`.
    Verify {
        id: u64,
        from: u64,
        through: u64,
        step: u64,
        /// The pace to digest at, MiB/s (the twin bounds it).
        mib_per_s: u32,
    },
    /// Answer to `AskEpochs`: what this box holds.
    Epochs(super::amnesia::PeerWord),
}

/// A history id as logs print it everywhere: hex, as [`crate::log::HistoryId`]
/// displays (the derived form would be a list of 16 numbers).
fn history_hex(h: &[u8; 16]) -> impl std::fmt::Debug {
    struct Hex([u8; 16]);
    impl std::fmt::Debug for Hex {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "{}", crate::log::HistoryId(self.0))
        }
    }
    Hex(*h)
}

impl std::fmt::Debug for TwinMsg {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TwinMsg::Hello {
                version,
                history,
                head,
                first,
                epochs,
            } => f
                .debug_struct("Hello")
                .field("version", version)
                .field("history", &history_hex(history))
                .field("head", head)
                .field("first", first)
                .field("epochs", &epochs.starts())
                .finish(),
            TwinMsg::Ack { durable } => f.debug_struct("Ack").field("durable", durable).finish(),
            TwinMsg::Refuse(r) => f.debug_tuple("Refuse").field(r).finish(),
            TwinMsg::Store(h) => f.debug_tuple("Store").field(h).finish(),
            TwinMsg::Promoted { epochs, listen } => f
                .debug_struct("Promoted")
                .field("epochs", &epochs.starts())
                .field("listen", listen)
                .finish(),
            TwinMsg::HandoverRefused(why) => f.debug_tuple("HandoverRefused").field(why).finish(),
            TwinMsg::Digests { id, digests, error } => f
                .debug_struct("Digests")
                .field("id", id)
                .field("digests", &digests.len())
                .field("error", error)
                .finish(),
            TwinMsg::AskEpochs(w) => f.debug_tuple("AskEpochs").field(w).finish(),
        }
    }
}

impl std::fmt::Debug for PrimaryMsg {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PrimaryMsg::Welcome {
                version,
                history,
                from,
                head,
                first,
                epochs,
            } => f
                .debug_struct("Welcome")
                .field("version", version)
                .field("history", &history_hex(history))
                .field("from", from)
                .field("head", head)
                .field("first", first)
                .field("epochs", &epochs.starts())
                .finish(),
            PrimaryMsg::BelowFloor { first, head } => f
                .debug_struct("BelowFloor")
                .field("first", first)
                .field("head", head)
                .finish(),
            PrimaryMsg::Heartbeat { head, unix_ms } => f
                .debug_struct("Heartbeat")
                .field("head", head)
                .field("unix_ms", unix_ms)
                .finish(),
            PrimaryMsg::Refuse(r) => f.debug_tuple("Refuse").field(r).finish(),
            PrimaryMsg::Handover { head, clients } => f
                .debug_struct("Handover")
                .field("head", head)
                .field("clients", &clients.len())
                .finish(),
            PrimaryMsg::Verify {
                id,
                from,
                through,
                step,
                mib_per_s,
            } => f
                .debug_struct("Verify")
                .field("id", id)
                .field("from", from)
                .field("through", through)
                .field("step", step)
                .field("mib_per_s", mib_per_s)
                .finish(),
            PrimaryMsg::Epochs(w) => f.debug_tuple("Epochs").field(w).finish(),
        }
    }
}

/// Why a side refuses a connection. Nothing is written on either side once
/// a refusal is decided.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum Refusal {
    #[error("protocol version {theirs} is not {ours}")]
    Version { ours: u32, theirs: u32 },
    #[error(
        "the logs belong to different histories (the primary's {}, the twin's {})",
        crate::log::HistoryId(*.primary),
        crate::log::HistoryId(*.twin)
    )]
    History { primary: [u8; 16], twin: [u8; 16] },
    #[error("the twin's frame {seq} differs from the primary's (crc {twin_crc:08x} vs {primary_crc:08x})")]
    Diverged {
        seq: u64,
        primary_crc: u32,
        twin_crc: u32,
    },
    #[error("the twin's head {twin_head} is ahead of the primary's {primary_head}")]
    TwinAhead { twin_head: u64, primary_head: u64 },
    #[error("sequence gap: expected frame {expected}, got {got}")]
    Gap { expected: u64, got: u64 },
    #[error("bad frame on the wire: {0}")]
    BadFrame(String),
    #[error("{what} of {len} bytes exceeds the limit of {max}")]
    TooLarge { what: String, len: u64, max: u64 },
    #[error("protocol violation: {0}")]
    Protocol(String),
    #[error("the peer was silent for longer than the idle timeout")]
    Timeout,
    /// A primary of an older epoch than the twin's: it was superseded by a
    /// promotion and must not stream.
    #[error("stale primary: its epoch {} is older than the twin's {}", EpochName(*.primary), EpochName(*.twin))]
    StaleEpoch { primary: u64, twin: u64 },
    /// The twin's log holds frames past `at` that were written under an
    /// epoch the primary's log does not give them: the logs forked after
    /// `at`. The twin's frames `at + 1..=twin_head` were never on this
    /// primary; `crc` is the primary's frame at `at` (none when it is not
    /// retained, or `at` is 0), to check the shared past by; `epoch` the
    /// primary's.
    #[error("the twin's log forked from the primary's (epoch {}) after frame {at}: its frames {}..={twin_head} were never on the primary (rejoin cuts them after saving them)", EpochName(*.epoch), at + 1)]
    Forked {
        at: u64,
        twin_head: u64,
        crc: Option<u32>,
        epoch: u64,
    },
    /// The twin could not write or sync a frame it was sent: its disk
    /// failed or filled, or its log is poisoned by an earlier failure. The
    /// frames it acknowledged stay durable; it takes no more until the
    /// cause is fixed and the twin restarted.
    #[error("the twin failed writing or syncing a frame: {0}")]
    WriteFailed(String),
    /// The twin holds frames past `after` written by earlier lives of
    /// this primary's term, which this primary lost in a crash before they
    /// were durable here: its current life began at `after + 1`, as its
    /// history `epochs` shows ([`super::epochs::lost_on_primary`]), so
    /// they were never acknowledged. The twin checks the rule against
    /// `epochs` itself and its frame at `after` against `crc` (none when
    /// `after` is 0), saves the frames `after + 1..=twin_head`, cuts them
    /// and says hello again.
    #[error("the twin's frames {}..={twin_head} were shipped before the primary's sync and lost in its crash (it restarted at {after}); never acknowledged, they are saved and cut on the twin", after + 1)]
    LostOnPrimary {
        after: u64,
        twin_head: u64,
        crc: Option<u32>,
        epochs: EpochHistory,
    },
}

/// Why bytes do not decode as a control message.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// More bytes are needed: not an error yet.
    #[error("incomplete message")]
    Incomplete,
    /// The length prefix exceeds [`MAX_CONTROL_LEN`].
    #[error("control message of {0} bytes exceeds the limit")]
    TooLarge(usize),
    /// The bytes are not a message.
    #[error("malformed control message: {0}")]
    Malformed(String),
}

/// Length-prefixed postcard bytes of a message.
pub fn encode<T: Serialize>(msg: &T) -> Vec<u8> {
    let mut out = Vec::new();
    encode_into(&mut out, msg);
    out
}

/// [`encode`], appended to `out`: several messages in one buffer, one
/// allocation.
pub fn encode_into<T: Serialize>(out: &mut Vec<u8>, msg: &T) {
    let start = out.len();
    out.extend_from_slice(&[0; 4]);
    // Encoding an in-memory value of these types cannot fail: postcard only
    // fails on unsupported types or a full fixed buffer, neither used here.
    if postcard::to_io(msg, &mut *out).is_err() {
        out.truncate(start + 4);
    }
    let len = (out.len() - start - 4) as u32;
    out[start..start + 4].copy_from_slice(&len.to_le_bytes());
}

/// The length a prefix announces, checked against the limit before the
/// body is read or allocated.
pub fn announced_len(prefix: [u8; 4]) -> Result<usize, DecodeError> {
    let len = u32::from_le_bytes(prefix) as usize;
    if len > MAX_CONTROL_LEN {
        return Err(DecodeError::TooLarge(len));
    }
    Ok(len)
}

/// Decode one length-prefixed message from the front of `buf`; answers it
/// and the bytes it took.
pub fn decode<'a, T: Deserialize<'a>>(buf: &'a [u8]) -> Result<(T, usize), DecodeError> {
    let Some(prefix) = buf.get(..4) else {
        return Err(DecodeError::Incomplete);
    };
    let len = announced_len([prefix[0], prefix[1], prefix[2], prefix[3]])?;
    let Some(body) = buf.get(4..4 + len) else {
        return Err(DecodeError::Incomplete);
    };
    let msg = postcard::from_bytes(body).map_err(|e| DecodeError::Malformed(e.to_string()))?;
    Ok((msg, 4 + len))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_encoded_into_one_buffer_decode_one_after_another() {
        let (a, b) = (TwinMsg::Ack { durable: 7 }, TwinMsg::Ack { durable: 9 });
        let mut out = b"kept".to_vec();
        encode_into(&mut out, &a);
        encode_into(&mut out, &b);
        assert_eq!(&out[..4], b"kept");
        let mut both = encode(&a);
        both.extend_from_slice(&encode(&b));
        assert_eq!(&out[4..], &both[..]);
        let (first, used) = decode::<TwinMsg>(&out[4..]).expect("first");
        let (second, _) = decode::<TwinMsg>(&out[4 + used..]).expect("second");
        assert_eq!((first, second), (a, b));
    }

    #[test]
    fn messages_print_the_history_id_in_hex_as_the_log_does() {
        let history = [0xab; 16];
        let hex = crate::log::HistoryId(history).to_string();
        let hello = TwinMsg::Hello {
            version: PROTOCOL_VERSION,
            history,
            head: Position::default(),
            first: 1,
            epochs: EpochHistory::default(),
        };
        let welcome = PrimaryMsg::Welcome {
            version: PROTOCOL_VERSION,
            history,
            from: 1,
            head: 0,
            first: 1,
            epochs: EpochHistory::default(),
        };
        let refusal = Refusal::History {
            primary: history,
            twin: [0xcd; 16],
        };
        for text in [
            format!("{hello:?}"),
            format!("{welcome:?}"),
            refusal.to_string(),
        ] {
            assert!(text.contains(&hex), "{text}");
            assert!(!text.contains("171"), "no list of numbers: {text}");
        }
    }

    #[test]
    fn messages_round_trip_and_garbage_is_malformed() {
        let msgs = vec![
            TwinMsg::Hello {
                version: PROTOCOL_VERSION,
                history: [3; 16],
                head: Position { seq: 9, crc: 77 },
                first: 1,
                epochs: EpochHistory::single(2),
            },
            TwinMsg::Ack { durable: 1 << 40 },
            TwinMsg::Refuse(Refusal::Gap {
                expected: 4,
                got: 6,
            }),
        ];
        for m in &msgs {
            let b = encode(m);
            assert_eq!(decode::<TwinMsg>(&b), Ok((m.clone(), b.len())));
            for cut in 0..b.len() {
                assert!(decode::<TwinMsg>(&b[..cut]).is_err());
            }
        }
        assert!(matches!(
            decode::<TwinMsg>(&[1, 0, 0, 0, 0xff]),
            Err(DecodeError::Malformed(_))
        ));
        assert_eq!(
            decode::<TwinMsg>(&(MAX_CONTROL_LEN as u32 + 1).to_le_bytes()),
            Err(DecodeError::TooLarge(MAX_CONTROL_LEN + 1))
        );
    }
}
