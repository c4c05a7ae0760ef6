//! Every decoder of bytes that come from disk or the network, fed random
//! bytes and mutated valid encodings (bits flipped, bytes set, inserted,
//! deleted, cut off, extreme integers written over): each returns a value
//! or an error that says what is wrong, and none panics.
//!
//! Each property runs `CASES` cases; its `_long` twin runs `LONG_CASES` and
//! is ignored by default: `cargo test --test decoders -- --ignored`.

use std::fmt::Debug;
use std::path::Path;
use std::sync::Arc;

use proptest::collection::vec;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use serde::de::DeserializeOwned;
use serde::Serialize;

use twinlog::log::format::{
    decode_index_header, decode_sealed, encode_index_header, encode_sealed, parse_segment_name,
    payload_crc, segment_name, FrameHeader, SegmentHeader, FRAME_HEADER_LEN, HISTORY_MAGIC,
    INDEX_HEADER_LEN, RESTART_MAGIC, SEGMENT_HEADER_LEN,
};
use twinlog::log::{Kind, Meta};
use twinlog::pushlog::{self, Push, PushLog, PushLogError, RefUpdate, ENVELOPE_LEN};
use twinlog::repl::msg::{self, Position, PrimaryMsg, Refusal, TwinMsg};
use twinlog::repl::wire::{frame_prefix, FrameDecoder, FrameEvent};

/// Cases per property in a normal run.
const CASES: u32 = 256;
/// Cases per property in the ignored long run.
const LONG_CASES: u32 = CASES * 100;

fn run<S: Strategy>(cases: u32, strategy: S, check: impl Fn(S::Value) -> Result<(), TestCaseError>)
where
    S::Value: Debug,
{
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    });
    if let Err(e) = runner.run(&strategy, check) {
        panic!("{e}");
    }
}

/// A property and its long twin.
macro_rules! property {
    ($(#[$doc:meta])* $name:ident, $long:ident, $strategy:expr, $check:expr) => {
        $(#[$doc])*
        #[test]
        fn $name() {
            run(CASES, $strategy, $check);
        }

        #[test]
        #[ignore = "the long run: cargo test --test decoders -- --ignored"]
        fn $long() {
            run(LONG_CASES, $strategy, $check);
        }
    };
}

// ---------------------------------------------------------------- inputs

/// One change to a valid encoding; positions wrap around its length.
#[derive(Clone, Debug)]
enum Edit {
    Flip(usize, u8),
    Set(usize, u8),
    Insert(usize, Vec<u8>),
    Delete(usize, usize),
    Truncate(usize),
    /// An integer a length or offset field may hold at its edges, written
    /// little-endian over the bytes at a position.
    Word(usize, u64, usize),
}

fn edit() -> impl Strategy<Value = Edit> {
    let extreme = prop_oneof![
        Just(0u64),
        Just(1),
        Just(7),
        Just(8),
        Just(20),
        Just(255),
        Just(0x7fff_ffff),
        Just(0x8000_0000),
        Just(0xffff_ffff),
        Just(i64::MAX as u64),
        Just(u64::MAX),
        any::<u64>(),
    ];
    prop_oneof![
        4 => (any::<usize>(), 1..=255u8).prop_map(|(at, mask)| Edit::Flip(at, mask)),
        2 => (any::<usize>(), any::<u8>()).prop_map(|(at, b)| Edit::Set(at, b)),
        1 => (any::<usize>(), vec(any::<u8>(), 1..16)).prop_map(|(at, b)| Edit::Insert(at, b)),
        1 => (any::<usize>(), 1..32usize).prop_map(|(at, n)| Edit::Delete(at, n)),
        1 => any::<usize>().prop_map(Edit::Truncate),
        2 => (any::<usize>(), extreme, prop_oneof![Just(1usize), Just(2), Just(4), Just(8)])
            .prop_map(|(at, v, width)| Edit::Word(at, v, width)),
    ]
}

fn apply(seed: &[u8], edits: &[Edit]) -> Vec<u8> {
    let mut b = seed.to_vec();
    for e in edits {
        let len = b.len();
        match e {
            Edit::Flip(at, mask) if len > 0 => b[at % len] ^= mask,
            Edit::Set(at, v) if len > 0 => b[at % len] = *v,
            Edit::Insert(at, bytes) => {
                let at = at % (len + 1);
                b.splice(at..at, bytes.iter().copied());
            }
            Edit::Delete(at, n) if len > 0 => {
                let at = at % len;
                b.drain(at..(at + n).min(len));
            }
            Edit::Truncate(at) => b.truncate(at % (len + 1)),
            Edit::Word(at, v, width) if len > 0 => {
                let at = at % len;
                let n = (*width).min(len - at);
                b[at..at + n].copy_from_slice(&v.to_le_bytes()[..n]);
            }
            _ => {}
        }
    }
    b
}

/// Random bytes, or one of `seeds` (valid encodings) with a few edits.
fn damaged(seeds: Vec<Vec<u8>>) -> impl Strategy<Value = Vec<u8>> {
    let seeds = Arc::new(seeds);
    let n = seeds.len();
    prop_oneof![
        1 => vec(any::<u8>(), 0..600),
        4 => (0..n, vec(edit(), 1..5))
            .prop_map(move |(i, edits)| apply(&seeds[i], &edits)),
    ]
}

/// `bytes` cut or padded with zeros to `N`.
fn fixed<const N: usize>(bytes: &[u8]) -> [u8; N] {
    let mut a = [0u8; N];
    let n = bytes.len().min(N);
    a[..n].copy_from_slice(&bytes[..n]);
    a
}

/// A clear error: one that says something, and not that arrow-ipc
/// panicked (the push log's last line of defence caught a panic its
/// checks should have ruled out).
fn said(e: impl std::fmt::Display) -> Result<(), TestCaseError> {
    let e = e.to_string();
    prop_assert!(!e.trim().is_empty(), "an error that says nothing");
    prop_assert!(!e.contains(pushlog::ARROW_PANICKED), "{}", e);
    Ok(())
}

fn tempdir() -> tempfile::TempDir {
    tempfile::tempdir().expect("tempdir")
}

// ------------------------------------------------- log headers and meta

fn frame_header(seq: u64, kind: u16, meta: &[u8], blob: &[u8]) -> FrameHeader {
    FrameHeader {
        seq,
        kind,
        meta_len: meta.len() as u32,
        blob_len: blob.len() as u64,
        payload_crc: payload_crc(meta, blob),
    }
}

fn log_header_seeds() -> Vec<Vec<u8>> {
    vec![
        frame_header(1, Kind::Pack.as_u16(), b"meta", b"blob")
            .encode()
            .to_vec(),
        frame_header(u64::MAX, 0x8001, &[], &[]).encode().to_vec(),
        SegmentHeader {
            first_seq: 42,
            history: [7; 16],
            capacity: 1 << 26,
        }
        .encode()
        .to_vec(),
        encode_index_header(42).to_vec(),
        encode_sealed(&HISTORY_MAGIC, &[9; 16]),
        encode_sealed(&RESTART_MAGIC, &77u64.to_le_bytes()),
        segment_name(42).into_bytes(),
    ]
}

fn check_log_headers(bytes: Vec<u8>) -> Result<(), TestCaseError> {
    let fh: [u8; FRAME_HEADER_LEN] = fixed(&bytes);
    match FrameHeader::decode(&fh) {
        // Every field is checked or covered by the crc: only the bytes
        // written decode.
        Ok(h) => prop_assert_eq!(h.encode(), fh),
        Err(e) => {
            let said = format!("{e:?}");
            prop_assert!(!said.is_empty());
        }
    }
    let sh: [u8; SEGMENT_HEADER_LEN] = fixed(&bytes);
    if let Ok(h) = SegmentHeader::decode(&sh) {
        prop_assert_eq!(SegmentHeader::decode(&h.encode()), Ok(h));
    }
    let ih: [u8; INDEX_HEADER_LEN] = fixed(&bytes);
    if let Some(first) = decode_index_header(&ih) {
        prop_assert_eq!(encode_index_header(first), ih);
    }
    for (magic, len) in [(&HISTORY_MAGIC, 16), (&RESTART_MAGIC, 8)] {
        if let Some(body) = decode_sealed(magic, &bytes, len) {
            prop_assert_eq!(encode_sealed(magic, body), bytes.clone());
        }
    }
    let name = String::from_utf8_lossy(&bytes);
    if let Some(seq) = parse_segment_name(&name) {
        prop_assert_eq!(segment_name(seq), name.into_owned());
    }
    if bytes.len() >= 2 {
        if let Ok(kind) = Kind::from_u16(u16::from_le_bytes([bytes[0], bytes[1]])) {
            prop_assert_eq!(Kind::from_u16(kind.as_u16()).ok(), Some(kind));
        }
    }
    Ok(())
}

property!(
    /// The log's frame, segment, index, history and restart headers and
    /// segment names decode only to what encodes back to them.
    log_headers_decode_or_refuse_and_never_panic,
    log_headers_decode_or_refuse_and_never_panic_long,
    damaged(log_header_seeds()),
    check_log_headers
);

fn meta_seeds() -> Vec<Vec<u8>> {
    [
        ("acme/widgets", &b"refs/heads/main"[..]),
        ("", &[0u8; 32][..]),
        ("é", &[][..]),
    ]
    .iter()
    .map(|(repo, detail)| {
        Meta {
            repo: (*repo).into(),
            detail: detail.to_vec(),
        }
        .encode()
        .expect("encode")
    })
    .collect()
}

fn check_meta(bytes: Vec<u8>) -> Result<(), TestCaseError> {
    match Meta::decode(&bytes) {
        Ok(m) => {
            prop_assert_eq!(m.encode().expect("encode"), bytes.clone());
            prop_assert_eq!(Meta::repo_of(&bytes).expect("repo"), m.repo.as_str());
        }
        Err(e) => {
            said(&e)?;
            prop_assert!(Meta::repo_of(&bytes).is_err());
        }
    }
    Ok(())
}

property!(
    /// Frame meta decodes only to what encodes back to it.
    meta_decodes_or_refuses_and_never_panics,
    meta_decodes_or_refuses_and_never_panics_long,
    damaged(meta_seeds()),
    check_meta
);

// ---------------------------------------------------- the frame stream

fn stream_seed() -> Vec<u8> {
    let mut s = Vec::new();
    for (seq, kind, meta, blob) in [
        (1, Kind::Pack.as_u16(), &b"meta"[..], &b"hello blob"[..]),
        (2, Kind::Refs.as_u16(), &[][..], &[][..]),
        (3, Kind::Redacted.as_u16(), &b"m"[..], &[0u8; 40][..]),
        (4, 0x8001, &b"x"[..], &[9u8; 300][..]),
    ] {
        let h = frame_header(seq, kind, meta, blob);
        s.extend(frame_prefix(&h, meta));
        if kind != Kind::Redacted.as_u16() {
            s.extend_from_slice(blob);
        }
    }
    s
}

fn check_stream((bytes, chunk): (Vec<u8>, usize)) -> Result<(), TestCaseError> {
    let mut d = FrameDecoder::default();
    let mut open: Option<(FrameHeader, u64)> = None;
    'feed: for piece in bytes.chunks(chunk) {
        let mut pos = 0;
        // Each call takes bytes or gives an event: a bound on the calls
        // catches a decoder that spins.
        for _ in 0..=2 * piece.len() + 4 {
            match d.decode(&piece[pos..]) {
                Err(e) => {
                    said(&e)?;
                    break 'feed;
                }
                Ok((0, None)) => continue 'feed,
                Ok((n, ev)) => {
                    prop_assert!(pos + n <= piece.len());
                    pos += n;
                    match ev {
                        Some(FrameEvent::Begin(h)) => {
                            prop_assert!(open.is_none());
                            prop_assert_eq!(d.meta().len(), h.meta_len as usize);
                            open = Some((h, 0));
                        }
                        Some(FrameEvent::Piece) => match open.as_mut() {
                            Some((_, got)) => *got += n as u64,
                            None => prop_assert!(false, "a piece outside a frame"),
                        },
                        Some(FrameEvent::End(h)) => {
                            let Some((begun, got)) = open.take() else {
                                return Err(TestCaseError::fail("an end without a begin"));
                            };
                            prop_assert_eq!(begun, h);
                            prop_assert_eq!(got, h.blob_len);
                        }
                        Some(FrameEvent::Erased(h)) => {
                            prop_assert!(open.is_none());
                            prop_assert_eq!(d.meta().len(), h.meta_len as usize);
                        }
                        None => {}
                    }
                }
            }
        }
        return Err(TestCaseError::fail(
            "the decoder neither took bytes nor stopped",
        ));
    }
    Ok(())
}

property!(
    /// The replication frame stream, in pieces of any size: whole frames
    /// with every blob byte accounted for, or an error.
    frame_stream_decodes_or_refuses_and_never_panics,
    frame_stream_decodes_or_refuses_and_never_panics_long,
    (damaged(vec![stream_seed()]), 1..80usize),
    check_stream
);

// ----------------------------------------------------- control messages

fn control_seeds() -> Vec<Vec<u8>> {
    use twinlog::node::api::{Durability, PushRecord, RefMove, Request, Response, Status};
    use twinlog::node::restore_serve::{RestoreFrame, RestoreReq, RestoreResp};
    use twinlog::node::snapshot_transfer::{SnapshotReq, SnapshotResp};
    use twinlog::store::install::SnapshotBase;
    let mv = RefMove {
        name: "refs/heads/main".into(),
        old: Some([1; 20]),
        new: None,
    };
    let mut seeds = vec![
        msg::encode(&TwinMsg::Hello {
            version: 1,
            history: [3; 16],
            head: Position { seq: 9, crc: 77 },
            first: 1,
            epochs: twinlog::repl::EpochHistory::single(2),
        }),
        msg::encode(&TwinMsg::Ack { durable: 1 << 40 }),
        msg::encode(&TwinMsg::Refuse(Refusal::Diverged {
            seq: 4,
            primary_crc: 1,
            twin_crc: 2,
        })),
        msg::encode(&PrimaryMsg::Welcome {
            version: 1,
            history: [3; 16],
            from: 5,
            head: 9,
            first: 1,
            epochs: twinlog::repl::EpochHistory::single(2),
        }),
        msg::encode(&PrimaryMsg::Handover {
            head: 9,
            clients: vec![twinlog::repl::HandedClient {
                fingerprint: "ab".into(),
                role: 1,
            }],
        }),
        msg::encode(&PrimaryMsg::Heartbeat {
            head: 9,
            unix_ms: 1_700_000_000_000,
        }),
        msg::encode(&PrimaryMsg::Refuse(Refusal::TooLarge {
            what: "frame".into(),
            len: 1 << 40,
            max: 1 << 30,
        })),
        msg::encode(&Request::Push {
            repo: "acme/widgets".into(),
            pack_len: 12,
            updates: vec![mv.clone(), mv.clone()],
            durability: Durability::Twin,
        }),
        msg::encode(&Request::Have {
            repo: "r".into(),
            oids: vec![[5; 20]; 3],
        }),
        msg::encode(&Request::Append {
            kind: 0x8001,
            meta: b"meta".to_vec(),
            blob_len: 7,
            durability: Durability::Local,
            once: None,
        }),
        msg::encode(&Response::Status(Box::new(Status {
            twin_last_error: Some("gone".into()),
            ..Status::default()
        }))),
        msg::encode(&Response::Have(vec![true, false, true])),
        msg::encode(&Response::Error(twinlog::node::api::ApiError::RefMoved {
            name: "refs/heads/x".into(),
            expected: "a".into(),
            current: "b".into(),
        })),
        msg::encode(&RestoreReq::File {
            at: 9,
            path: "repos/a/archive".into(),
            offset: 3,
        }),
        msg::encode(&RestoreResp::Welcome {
            history: [1; 16],
            first: 1,
            head: 2,
            head_crc: 3,
            epoch: 4,
            epochs: twinlog::repl::EpochHistory::single(4),
        }),
        msg::encode(&RestoreFrame {
            seq: 3,
            kind: 2,
            meta: b"m".to_vec(),
            blob_len: 10,
            payload_crc: 5,
            from: 0,
            erased: false,
        }),
        msg::encode(&SnapshotReq::Manifest),
        msg::encode(&SnapshotResp::Manifest {
            base: SnapshotBase {
                at: 5,
                crc_at: 6,
                history: [2; 16],
            },
            len: 100,
        }),
    ];
    // Listings travel as bare postcard after a `Response::Listing`.
    seeds.push(
        postcard::to_stdvec(&vec![("refs/heads/main".to_string(), [4u8; 20])]).expect("encode"),
    );
    seeds.push(
        postcard::to_stdvec(&vec![PushRecord {
            seq: 3,
            at_ms: 4,
            updates: vec![mv],
        }])
        .expect("encode"),
    );
    seeds
}

/// Decode as a length-prefixed control message of type `T`: a decoded
/// message encodes and decodes back to itself.
fn as_message<T: Serialize + DeserializeOwned + PartialEq + Debug>(
    bytes: &[u8],
) -> Result<(), TestCaseError> {
    match msg::decode::<T>(bytes) {
        Ok((m, n)) => {
            prop_assert!(n <= bytes.len());
            let again = msg::encode(&m);
            prop_assert_eq!(msg::decode::<T>(&again), Ok((m, again.len())));
        }
        Err(e) => said(e)?,
    }
    Ok(())
}

/// Decode as bare postcard of type `T`.
fn as_postcard<T: Serialize + DeserializeOwned + PartialEq + Debug>(
    bytes: &[u8],
) -> Result<(), TestCaseError> {
    match postcard::from_bytes::<T>(bytes) {
        Ok(v) => {
            let again = postcard::to_stdvec(&v).expect("encode");
            prop_assert_eq!(postcard::from_bytes::<T>(&again).ok(), Some(v));
        }
        Err(e) => said(e)?,
    }
    Ok(())
}

fn check_control(bytes: Vec<u8>) -> Result<(), TestCaseError> {
    use twinlog::node::api::{HistoryListing, RefsListing, Request, Response};
    use twinlog::node::restore_serve::{RestoreFrame, RestoreReq, RestoreResp};
    use twinlog::node::snapshot_transfer::{SnapshotReq, SnapshotResp};
    as_message::<TwinMsg>(&bytes)?;
    as_message::<PrimaryMsg>(&bytes)?;
    as_message::<Request>(&bytes)?;
    as_message::<Response>(&bytes)?;
    as_message::<RestoreReq>(&bytes)?;
    as_message::<RestoreResp>(&bytes)?;
    as_message::<RestoreFrame>(&bytes)?;
    as_message::<SnapshotReq>(&bytes)?;
    as_message::<SnapshotResp>(&bytes)?;
    as_postcard::<RefsListing>(&bytes)?;
    as_postcard::<HistoryListing>(&bytes)?;
    if bytes.len() >= 4 {
        match msg::announced_len(fixed(&bytes)) {
            Ok(n) => prop_assert!(n <= msg::MAX_CONTROL_LEN),
            Err(e) => said(e)?,
        }
    }
    Ok(())
}

property!(
    /// Every control message of replication, the client API, restores and
    /// snapshot transfers, and the listings: a message that re-encodes to
    /// itself, or an error.
    control_messages_decode_or_refuse_and_never_panic,
    control_messages_decode_or_refuse_and_never_panic_long,
    damaged(control_seeds()),
    check_control
);

// ------------------------------------------------------------ push log

fn push(seq: u64, refs: usize) -> Push {
    Push {
        seq,
        at_ms: 1_700_000_000_000 + seq,
        updates: (0..refs)
            .map(|i| RefUpdate {
                name: format!("refs/heads/b{i}"),
                old: (i % 2 == 0).then_some([i as u8; 20]),
                new: (i % 3 != 0).then_some([seq as u8; 20]),
            })
            .collect(),
    }
}

fn frames(n: u64) -> Vec<Vec<u8>> {
    (1..=n)
        .map(|s| pushlog::encode_frame(&push(s, 1 + s as usize % 4)).expect("encode"))
        .collect()
}

/// A compacted log: a checkpoint frame, then pushes, as `compact` leaves
/// it; and its reflog archive.
fn compacted() -> (Vec<u8>, Vec<u8>) {
    static ONCE: std::sync::OnceLock<(Vec<u8>, Vec<u8>)> = std::sync::OnceLock::new();
    ONCE.get_or_init(compact_one).clone()
}

fn compact_one() -> (Vec<u8>, Vec<u8>) {
    let dir = tempdir();
    let path = dir.path().join("refs.pushlog");
    let mut log = PushLog::open(&path).expect("open");
    for seq in 1..=3 {
        log.append(&push(seq, 3)).expect("append");
    }
    log.compact(pushlog::Finish::Swap).expect("compact");
    log.append(&push(4, 2)).expect("append");
    let live = std::fs::read(&path).expect("read");
    let archive = std::fs::read(PushLog::archive_path(&path)).expect("read");
    (live, archive)
}

fn pushlog_seeds() -> Vec<Vec<u8>> {
    let (live, archive) = compacted();
    vec![frames(3).concat(), frames(1).concat(), live, archive]
}

/// The frame with its Arrow IPC bytes edited and its crcs made to match:
/// what a writer that wrote wrong bytes leaves, past every crc check.
fn rewritten(frame: &[u8], edits: &[Edit]) -> Vec<u8> {
    let ipc = apply(&frame[ENVELOPE_LEN..], edits);
    let mut f = frame[..ENVELOPE_LEN].to_vec();
    f[12..16].copy_from_slice(&(ipc.len() as u32).to_le_bytes());
    f[16..20].copy_from_slice(&crc32fast::hash(&ipc).to_le_bytes());
    let header_crc = crc32fast::hash(&f[..20]);
    f[20..24].copy_from_slice(&header_crc.to_le_bytes());
    f.extend_from_slice(&ipc);
    f
}

/// Damaged push logs, and logs with one frame rewritten under good crcs.
fn pushlog_bytes() -> impl Strategy<Value = Vec<u8>> {
    let (live, _) = compacted();
    let checkpoint_len =
        ENVELOPE_LEN + u32::from_le_bytes(live[12..16].try_into().expect("4")) as usize;
    let mut parts = frames(3);
    parts.push(live[..checkpoint_len].to_vec());
    let parts = Arc::new(parts);
    prop_oneof![
        2 => damaged(pushlog_seeds()),
        3 => (0..4usize, vec(edit(), 1..4)).prop_map(move |(k, edits)| {
            let mut b = Vec::new();
            if k == 3 {
                b.extend(rewritten(&parts[3], &edits));
                b.extend_from_slice(&parts[0]);
            } else {
                for (i, f) in parts[..3].iter().enumerate() {
                    if i == k {
                        b.extend(rewritten(f, &edits));
                    } else {
                        b.extend_from_slice(f);
                    }
                }
            }
            b
        }),
    ]
}

fn check_scan(bytes: Vec<u8>) -> Result<(), TestCaseError> {
    match pushlog::scan_frames(&bytes) {
        Ok(scan) => {
            prop_assert_eq!(scan.good_bytes + scan.discarded_bytes, bytes.len() as u64);
            // A checkpoint may hold no refs; a push moves one at least.
            for p in &scan.pushes {
                prop_assert!(!p.updates.is_empty());
            }
        }
        Err(e) => said(e)?,
    }
    Ok(())
}

property!(
    /// `scan_frames` over damaged logs and logs with a frame rewritten
    /// under matching crcs: pushes, or an error naming an offset.
    pushlog_scan_recovers_or_refuses_and_never_panics,
    pushlog_scan_recovers_or_refuses_and_never_panics_long,
    pushlog_bytes(),
    check_scan
);

/// `PushLog::open` over the bytes as the live log, as a staged compaction
/// beside a good log, and as the reflog archive `history` reads.
fn check_open(bytes: Vec<u8>) -> Result<(), TestCaseError> {
    let dir = tempdir();
    let path = dir.path().join("refs.pushlog");
    std::fs::write(&path, &bytes).expect("write");
    match PushLog::open(&path) {
        Ok(log) => {
            prop_assert_eq!(std::fs::metadata(&path).expect("stat").len(), log.len());
            let _ = log.refs();
        }
        Err(e) => {
            prop_assert!(
                matches!(
                    e,
                    PushLogError::Corrupt { .. } | PushLogError::Version { .. }
                ),
                "{e}"
            );
            said(&e)?;
            prop_assert_eq!(std::fs::read(&path).expect("read"), bytes.clone());
        }
    }

    let (live, archive) = compacted();
    std::fs::write(&path, &live).expect("write");
    std::fs::write(PushLog::archive_path(&path), &archive).expect("write");
    let mut staged = path.as_os_str().to_owned();
    staged.push(".compact");
    std::fs::write(&staged, &bytes).expect("write");
    match PushLog::open(&path).and_then(|log| log.history()) {
        Ok(_) => {}
        Err(e) => said(e)?,
    }

    std::fs::write(&path, &live).expect("write");
    std::fs::write(PushLog::archive_path(&path), &bytes).expect("write");
    let _ = std::fs::remove_file(&staged);
    let log = PushLog::open(&path).expect("the live log is whole");
    if let Err(e) = log.history() {
        said(e)?;
    }
    Ok(())
}

property!(
    /// `PushLog::open`: a log (the torn tail cut, the file as long as the
    /// log), or `Corrupt`/`Version` with the file left as it was.
    pushlog_open_recovers_or_refuses_and_never_panics,
    pushlog_open_recovers_or_refuses_and_never_panics_long,
    pushlog_bytes(),
    check_open
);

fn sealed_seed() -> Vec<u8> {
    let dir = tempdir();
    let path = dir.path().join("sealed");
    let pushes: Vec<Push> = (1..=3).map(|s| push(s, s as usize)).collect();
    pushlog::write_archive(
        &path,
        &[
            ("objects", vec![1, 2, 3]),
            (
                pushlog::SEALED_SECTION,
                pushlog::seal(&pushes).expect("seal"),
            ),
        ],
    )
    .expect("write");
    std::fs::read(&path).expect("read")
}

fn check_sealed(bytes: Vec<u8>) -> Result<(), TestCaseError> {
    let dir = tempdir();
    let path = dir.path().join("sealed");
    std::fs::write(&path, &bytes).expect("write");
    match pushlog::read_sealed(&path) {
        Ok(pushes) => {
            for p in pushes.iter().flatten() {
                prop_assert!(!p.updates.is_empty());
            }
        }
        Err(e) => said(e)?,
    }
    Ok(())
}

property!(
    /// `read_sealed` over a damaged sealed archive (which has no crc): the
    /// pushes, or an error.
    sealed_archives_read_or_refuse_and_never_panic,
    sealed_archives_read_or_refuse_and_never_panic_long,
    damaged(vec![sealed_seed()]),
    check_sealed
);

// ------------------------------------------------------------ the store

fn manifest_seeds() -> Vec<Vec<u8>> {
    use twinlog::store::install::SnapshotBase;
    use twinlog::store::{Manifest, ManifestFile};
    let m = Manifest {
        format: 1,
        history: "00112233445566778899aabbccddeeff".into(),
        at: 42,
        files: vec![
            ManifestFile {
                path: "repos/acme%2Fwidgets/archive".into(),
                len: 123,
                crc32: 456,
            },
            ManifestFile {
                path: "APPLIED".into(),
                len: 1024,
                crc32: 7,
            },
        ],
    };
    vec![
        serde_json::to_vec_pretty(&m).expect("json"),
        serde_json::to_vec(&SnapshotBase {
            at: 5,
            crc_at: 6,
            history: [1; 16],
        })
        .expect("json"),
    ]
}

fn check_manifest(bytes: Vec<u8>) -> Result<(), TestCaseError> {
    use twinlog::store::snapshot::{read_manifest, MANIFEST_NAME};
    let dir = tempdir();
    std::fs::write(dir.path().join(MANIFEST_NAME), &bytes).expect("write");
    match read_manifest(dir.path()) {
        Ok(m) => {
            prop_assert_eq!(m.format, 1);
            for f in &m.files {
                prop_assert!(Path::new(&f.path)
                    .components()
                    .all(|c| matches!(c, std::path::Component::Normal(_))));
            }
        }
        Err(e) => said(e)?,
    }
    let base = dir.path().join("base.json");
    std::fs::write(&base, &bytes).expect("write");
    if let Err(e) = twinlog::store::install::read_base(&base) {
        said(e)?;
    }
    Ok(())
}

property!(
    /// A snapshot's MANIFEST.json (and an install's base): a manifest whose
    /// paths stay inside the snapshot, or `BadSnapshot`.
    snapshot_manifests_parse_or_refuse_and_never_panic,
    snapshot_manifests_parse_or_refuse_and_never_panic_long,
    damaged(manifest_seeds()),
    check_manifest
);

fn pack_seed() -> Vec<u8> {
    use twinlog::objects::ObjType;
    use twinlog::store::PackBuilder;
    let mut b = PackBuilder::new();
    b.add(ObjType::Blob, b"hello\n").expect("add");
    b.add(ObjType::Tree, b"").expect("add");
    b.add(ObjType::Commit, &[7u8; 200]).expect("add");
    b.into_bytes()
}

fn archive_seed() -> Vec<u8> {
    use twinlog::store::archive::Archive;
    let dir = tempdir();
    let path = dir.path().join("archive");
    let mut a = Archive::open(&path).expect("open");
    for (seq, body) in [
        (3, pack_seed()),
        (5, b"a second body".to_vec()),
        (9, vec![0; 100]),
    ] {
        let mut p = a.begin_pack(seq).expect("begin");
        a.write(&mut p, &body).expect("write");
        a.finish_pack(p, 1, seq == 5).expect("finish");
    }
    a.erase_before(4).expect("erase");
    drop(a);
    std::fs::read(&path).expect("read")
}

fn check_archive(bytes: Vec<u8>) -> Result<(), TestCaseError> {
    use twinlog::store::archive::Archive;
    use twinlog::store::StoreError;
    let dir = tempdir();
    let path = dir.path().join("archive");
    std::fs::write(&path, &bytes).expect("write");
    match Archive::open(&path) {
        Ok(a) => {
            prop_assert!(a.len() <= (bytes.len() as u64).max(16));
            for p in a.packs() {
                prop_assert!(p.body_at + p.body_len <= a.len());
                if let Err(e) = a.read_at(p.body_at, p.body_len) {
                    said(e)?;
                }
                let mut n = 0;
                a.read_body(p, 7, &mut |piece| {
                    n += piece.len() as u64;
                    Ok(())
                })
                .expect("a record open found whole reads back");
                prop_assert_eq!(n, p.body_len);
            }
        }
        Err(e) => prop_assert!(matches!(e, StoreError::Corrupt { .. }), "{e}"),
    }
    Ok(())
}

property!(
    /// A repository's pack archive: its records (a torn tail cut, every
    /// record readable), or `Corrupt`.
    pack_archives_open_or_refuse_and_never_panic,
    pack_archives_open_or_refuse_and_never_panic_long,
    damaged(vec![archive_seed()]),
    check_archive
);

fn store_frame_seeds() -> Vec<Vec<u8>> {
    use twinlog::store::frames::{EraseBody, RefsBody};
    use twinlog::store::RepoOp;
    vec![
        postcard::to_stdvec(&RepoOp::Purge).expect("encode"),
        postcard::to_stdvec(&RefsBody {
            at_ms: 9,
            updates: vec![
                ("refs/heads/main".into(), None, Some([1; 20])),
                ("refs/tags/v1".into(), Some([2; 20]), None),
            ],
        })
        .expect("encode"),
        postcard::to_stdvec(&EraseBody {
            before: 7,
            repos: vec!["acme/a".into(), "b".into()],
        })
        .expect("encode"),
        pack_seed(),
        b"0123456789abcdef0123456789ABCDEF01234567".to_vec(),
    ]
}

fn check_store_frames((bytes, piece): (Vec<u8>, usize)) -> Result<(), TestCaseError> {
    use twinlog::objects::OID_LEN;
    use twinlog::store::frames::{
        check_doc_name, check_repo_name, decode_small, git_oid, hex, unhex, EraseBody, PackEvent,
        PackParser, RefsBody,
    };
    use twinlog::store::{RepoOp, StoreError};
    let bad_frame = |e: StoreError| -> Result<(), TestCaseError> {
        prop_assert!(matches!(e, StoreError::BadFrame { seq: 7, .. }), "{e}");
        Ok(())
    };
    if let Err(e) = decode_small::<RepoOp>(7, &bytes) {
        bad_frame(e)?;
    }
    if let Err(e) = decode_small::<RefsBody>(7, &bytes) {
        bad_frame(e)?;
    }
    if let Err(e) = decode_small::<EraseBody>(7, &bytes) {
        bad_frame(e)?;
    }

    // A pack parsed in pieces: an object ends only when its bytes hash to
    // its oid.
    let mut p = PackParser::new(7);
    let mut data = Vec::new();
    let mut outcome = Ok(());
    for chunk in bytes.chunks(piece) {
        outcome = p.feed(chunk, &mut |ev| {
            match ev {
                PackEvent::Head(_) => data.clear(),
                PackEvent::Data(d) => data.extend_from_slice(d),
                PackEvent::End(h) => {
                    if git_oid(h.obj_type, &data) != h.oid || data.len() as u64 != h.len {
                        return Err(StoreError::BadPush("an object that does not hash".into()));
                    }
                }
            }
            Ok(())
        });
        if outcome.is_err() {
            break;
        }
    }
    match outcome.and_then(|()| p.finish()) {
        Ok(_) => {}
        Err(e) => bad_frame(e)?,
    }

    let text = String::from_utf8_lossy(&bytes);
    if let Some(oid) = unhex::<OID_LEN>(&text) {
        prop_assert_eq!(hex(&oid), text.to_ascii_lowercase());
    }
    let _ = check_repo_name(&text);
    let _ = check_doc_name(&text);
    Ok(())
}

property!(
    /// The store's frame bodies: RepoStore, Refs and Erase blobs, packs fed
    /// in pieces of any size, hex oids: a value, or `BadFrame`.
    store_frame_bodies_decode_or_refuse_and_never_panic,
    store_frame_bodies_decode_or_refuse_and_never_panic_long,
    (damaged(store_frame_seeds()), 1..64usize),
    check_store_frames
);

// ----------------------------------------------------------- the config

fn config_seeds() -> Vec<Vec<u8>> {
    use twinlog::daemon::config::{
        DurabilitySection, Policy, PrimaryConfig, RetentionSection, TimersSection, TwinConfig,
    };
    use twinlog::net::Fingerprint;
    let timers = TimersSection {
        heartbeat_ms: 20,
        idle_timeout_ms: 300,
    };
    let primary = PrimaryConfig {
        data_dir: "/var/lib/twinlog".into(),
        listen: "0.0.0.0:7400".parse().expect("addr"),
        metrics: "127.0.0.1:9400".parse().expect("addr"),
        twin_fingerprint: Some(Fingerprint([1; 32])),
        client_fingerprints: vec![Fingerprint([2; 32])],
        writer_fingerprints: vec![Fingerprint([4; 32])],
        reader_fingerprints: Vec::new(),
        durability: DurabilitySection {
            policy: Policy::Fallback,
            timeout_ms: 250,
        },
        segment_bytes: 1 << 20,
        timers,
        retention: RetentionSection { max_bytes: 1 << 30 },
        limits: Default::default(),
        failover: Some(twinlog::daemon::config::FailoverSection {
            etcd: vec!["http://10.0.0.5:2379".into()],
            cluster: "pair-1".into(),
            lease_ttl_s: 5,
            auto_rejoin: true,
            advertise: None,
            peer: None,
        }),
        archive: Some(twinlog::daemon::config::ArchiveSection {
            url: "s3://logs/pair-1".into(),
            endpoint: Some("http://10.0.0.9:3900".into()),
            region: "garage".into(),
            credentials_file: Some("s3.toml".into()),
            uploader: twinlog::daemon::config::Uploader::Twin,
            zstd_level: 3,
            key_file: Some("archive.key".into()),
            max_mib_per_s: 64,
            snapshot_every_mib: 1024,
        }),
    };
    let twin = TwinConfig {
        data_dir: "/var/lib/twinlog".into(),
        primary: "10.0.0.1:7400".parse().expect("addr"),
        primary_fingerprint: Some(Fingerprint([3; 32])),
        metrics: "127.0.0.1:9401".parse().expect("addr"),
        segment_bytes: 1 << 20,
        timers,
        restore_listen: Some("0.0.0.0:7401".parse().expect("addr")),
        restore_fingerprints: vec![Fingerprint([4; 32])],
        retention: twinlog::daemon::TwinRetentionSection {
            max_bytes: 1 << 30,
            max_age_secs: 86_400,
        },
        listen_as_primary: "0.0.0.0:7400".parse().expect("addr"),
        restore_expiry: Default::default(),
        promote_quiet_ms: twinlog::daemon::config::default_promote_quiet_ms(),
        as_primary: Default::default(),
        failover: None,
        archive: None,
    };
    vec![primary.render().into_bytes(), twin.render().into_bytes()]
}

/// A loaded config's durations are ones the timers can add to now.
fn usable(
    t: twinlog::repl::Timers,
    policy: twinlog::node::TwinPolicy,
) -> Result<(), TestCaseError> {
    use twinlog::node::TwinPolicy;
    let now = std::time::Instant::now();
    prop_assert!(now.checked_add(t.heartbeat).is_some());
    prop_assert!(now.checked_add(t.idle_timeout).is_some());
    if let TwinPolicy::Fail(d) | TwinPolicy::FallBack(d) = policy {
        prop_assert!(now.checked_add(d).is_some());
    }
    Ok(())
}

fn check_config(bytes: Vec<u8>) -> Result<(), TestCaseError> {
    use twinlog::daemon::config::{PrimaryConfig, TwinConfig};
    let dir = tempdir();
    let path = dir.path().join("config.toml");
    std::fs::write(&path, &bytes).expect("write");
    match PrimaryConfig::load(&path) {
        Ok(c) => usable(c.timers.timers(), c.durability.twin_policy())?,
        Err(e) => said(e)?,
    }
    match TwinConfig::load(&path) {
        Ok(c) => usable(c.timers.timers(), twinlog::node::TwinPolicy::Wait)?,
        Err(e) => said(e)?,
    }
    Ok(())
}

property!(
    /// `primary.toml` and `twin.toml`: a config whose timers work, or an
    /// error naming the file and what is wrong.
    configs_load_or_refuse_and_never_panic,
    configs_load_or_refuse_and_never_panic_long,
    damaged(config_seeds()),
    check_config
);

/// A rendered config with every number replaced by any u64.
fn config_numbers() -> impl Strategy<Value = Vec<u8>> {
    let seeds = Arc::new(config_seeds());
    (0..2usize, vec(any::<u64>(), 6)).prop_map(move |(i, numbers)| {
        let text = String::from_utf8_lossy(&seeds[i]).into_owned();
        let mut n = numbers.iter().cycle();
        text.lines()
            .map(|l| match l.split_once(" = ") {
                Some((k, v)) if v.parse::<u64>().is_ok() => {
                    format!("{k} = {}", n.next().copied().unwrap_or(0))
                }
                _ => l.to_string(),
            })
            .collect::<Vec<_>>()
            .join("\n")
            .into_bytes()
    })
}

property!(
    /// Any number in any numeric key of a config.
    config_numbers_load_or_refuse_and_never_panic,
    config_numbers_load_or_refuse_and_never_panic_long,
    config_numbers(),
    check_config
);
