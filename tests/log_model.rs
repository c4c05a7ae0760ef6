//! The log against a plain in-memory model: random sequences of every
//! mutating operation (appends of every kind, erase, the retention
//! operations, `truncate_after`, restart, reset), with reopens and power
//! cuts between them, and the whole log compared with the model after every
//! step.

use std::collections::BTreeMap;
use std::sync::Arc;

use proptest::prelude::*;
use twinlog::log::{CrashMode, Error, Kind, Log, Meta, OpenOptions, SimStorage};

#[derive(Clone, Debug, PartialEq, Eq)]
struct Frame {
    kind: u16,
    meta: Vec<u8>,
    blob: Vec<u8>,
}

#[derive(Debug, Default)]
struct Model {
    frames: BTreeMap<u64, Frame>,
    head: u64,
    first: u64,
}

#[derive(Clone, Debug)]
enum Op {
    Append {
        kind: u8,
        repo: u8,
        len: usize,
    },
    Stage {
        lens: Vec<usize>,
    },
    Stream {
        len: usize,
        chunk: usize,
        commit: bool,
    },
    Group {
        lens: Vec<usize>,
    },
    Erase {
        before_back: u64,
        repo: u8,
    },
    TruncateBefore {
        back: u64,
    },
    RetainFrom {
        back: u64,
    },
    TruncateAfter {
        back: u64,
    },
    RestartAfter {
        ahead: u64,
    },
    Reset {
        keep: u64,
    },
    Reopen,
    Crash {
        keep_prefix: Option<u64>,
    },
}

const KINDS: [Kind; 6] = [
    Kind::Pack,
    Kind::Refs,
    Kind::LfsPut,
    Kind::LfsDelete,
    Kind::RepoStore,
    Kind::ControlDoc,
];
const REPOS: [&str; 3] = ["alpha", "beta", "gamma"];

fn op() -> impl Strategy<Value = Op> {
    let len = prop_oneof![4 => 0usize..200, 1 => 200usize..3000];
    prop_oneof![
        8 => (0u8..6, 0u8..3, len.clone()).prop_map(|(kind, repo, len)| Op::Append { kind, repo, len }),
        3 => prop::collection::vec(len.clone(), 1..6).prop_map(|lens| Op::Stage { lens }),
        3 => (len.clone(), 1usize..700, any::<bool>()).prop_map(|(len, chunk, commit)| Op::Stream { len, chunk, commit }),
        3 => prop::collection::vec(len, 1..6).prop_map(|lens| Op::Group { lens }),
        2 => (0u64..30, 0u8..3).prop_map(|(before_back, repo)| Op::Erase { before_back, repo }),
        2 => (0u64..40).prop_map(|back| Op::TruncateBefore { back }),
        1 => (0u64..40).prop_map(|back| Op::RetainFrom { back }),
        2 => (0u64..30).prop_map(|back| Op::TruncateAfter { back }),
        1 => (0u64..20).prop_map(|ahead| Op::RestartAfter { ahead }),
        1 => (0u64..4).prop_map(|keep| Op::Reset { keep }),
        2 => Just(Op::Reopen),
        2 => prop::option::of(any::<u64>()).prop_map(|keep_prefix| Op::Crash { keep_prefix }),
    ]
}

fn blob(seq: u64, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (seq as usize * 31 + i * 7) as u8)
        .collect()
}

struct Harness {
    disk: SimStorage,
    segment_bytes: u64,
    log: Option<Log>,
    model: Model,
}

impl Harness {
    fn open(&mut self) {
        self.log = None;
        let log = Log::open_opts(
            "/log",
            OpenOptions {
                segment_bytes: self.segment_bytes,
                repair: false,
                storage: Some(Arc::new(self.disk.clone())),
                ..OpenOptions::default()
            },
        )
        .expect("open");
        self.log = Some(log);
    }

    fn log(&self) -> &Log {
        self.log.as_ref().expect("log open")
    }

    fn apply(&mut self, op: &Op) {
        let head = self.model.head;
        match op {
            Op::Append { kind, repo, len } => {
                let kind = KINDS[*kind as usize];
                let meta = Meta::repo(REPOS[*repo as usize]);
                let seq = self
                    .log()
                    .append(kind, &meta, &blob(head + 1, *len))
                    .expect("append");
                assert_eq!(seq, head + 1);
                self.insert(seq, kind.as_u16(), meta.encode().expect("meta"), *len);
            }
            Op::Stage { lens } => {
                let mut last = head;
                for len in lens {
                    last = self
                        .log()
                        .stage_raw(Kind::Pack.as_u16(), b"", &blob(last + 1, *len))
                        .expect("stage");
                }
                // Staged frames are visible only once a sync covers them; a
                // segment roll is such a sync.
                assert!(self.log().head_seq() <= last);
                self.log().sync_through(last).expect("sync_through");
                for (i, len) in lens.iter().enumerate() {
                    self.insert(head + 1 + i as u64, Kind::Pack.as_u16(), Vec::new(), *len);
                }
            }
            Op::Stream { len, chunk, commit } => {
                let seq = head + 1;
                let meta = Meta::repo("alpha").encode().expect("meta");
                let mut p = self
                    .log()
                    .begin(None, Kind::LfsPut.as_u16(), &meta, *len as u64)
                    .expect("begin");
                for piece in blob(seq, *len).chunks(*chunk) {
                    p.write(piece).expect("write");
                }
                if *commit {
                    assert_eq!(p.commit().expect("commit"), seq);
                    self.insert(seq, Kind::LfsPut.as_u16(), meta, *len);
                } else {
                    p.abort().expect("abort");
                }
            }
            Op::Group { lens } => {
                for (i, len) in lens.iter().enumerate() {
                    let seq = head + 1 + i as u64;
                    let mut p = self
                        .log()
                        .begin(Some(seq), Kind::Refs.as_u16(), b"", *len as u64)
                        .expect("begin");
                    p.write(&blob(seq, *len)).expect("write");
                    p.commit_unsynced().expect("commit_unsynced");
                }
                // A segment roll inside the group syncs the part before it.
                let unsynced = self.log().unsynced();
                assert!(unsynced <= lens.len() as u64 && unsynced > 0);
                assert_eq!(self.log().head_seq() + unsynced, head + lens.len() as u64);
                let synced = self.log().sync().expect("sync");
                assert_eq!(synced, head + lens.len() as u64);
                assert_eq!(self.log().unsynced(), 0);
                for (i, len) in lens.iter().enumerate() {
                    self.insert(head + 1 + i as u64, Kind::Refs.as_u16(), Vec::new(), *len);
                }
            }
            Op::Erase { before_back, repo } => {
                let before = (head + 1).saturating_sub(*before_back);
                let repo = REPOS[*repo as usize].to_string();
                self.log()
                    .erase(before, std::slice::from_ref(&repo))
                    .expect("erase");
                for (seq, f) in self.model.frames.range_mut(..before) {
                    let carries = Kind::from_u16(f.kind).expect("kind").carries_repo_data();
                    let named = Meta::repo_of(&f.meta).is_ok_and(|r| r == repo);
                    if carries && named {
                        // Nothing of it stays but its number and length.
                        f.kind = Kind::Redacted.as_u16();
                        f.meta.clear();
                        f.blob.clear();
                    }
                    let _ = seq;
                }
            }
            Op::TruncateBefore { back } => {
                let seq = head.saturating_sub(*back).max(1);
                let old_first = self.model.first;
                let first = self.log().truncate_before(seq).expect("truncate_before");
                assert!(
                    first <= seq.max(old_first),
                    "dropped a frame at or after {seq}"
                );
                self.drop_below(first);
            }
            Op::RetainFrom { back } => {
                let seq = (head + 2).saturating_sub(*back).max(1);
                let old_first = self.model.first;
                let first = self.log().retain_from(seq).expect("retain_from");
                if seq > head {
                    assert_eq!(first, head + 1);
                } else {
                    assert!(first <= seq.max(old_first));
                }
                self.drop_below(first);
                assert_eq!(self.log().head_seq(), head);
            }
            Op::TruncateAfter { back } => {
                let seq = head.saturating_sub(*back);
                let first = self.model.first;
                match self.log().truncate_after(seq) {
                    Ok(cut) => {
                        assert!(seq + 1 >= first, "cut after {seq} below the floor {first}");
                        assert_eq!((cut.old_head, cut.head), (head, seq));
                        assert_eq!(cut.frames, head - seq);
                        self.model.frames.split_off(&(seq + 1));
                        self.model.head = seq;
                    }
                    Err(Error::BelowFloor { seq: s, first: f }) => {
                        assert_eq!((s, f), (seq, first));
                        assert!(seq + 1 < first);
                    }
                    Err(e) => panic!("truncate_after({seq}): {e}"),
                }
            }
            Op::RestartAfter { ahead } => {
                let at = head + ahead;
                self.log().restart_after(at).expect("restart_after");
                self.model = Model {
                    frames: BTreeMap::new(),
                    head: at,
                    first: at + 1,
                };
            }
            Op::Reset { keep } => {
                let held = self.model.frames.len() as u64;
                match self.log().reset(*keep) {
                    Ok(()) => {
                        assert!(held <= *keep);
                        self.model = Model {
                            frames: BTreeMap::new(),
                            head: 0,
                            first: 1,
                        };
                    }
                    Err(Error::NotFresh { frames, .. }) => {
                        assert!(held > *keep);
                        assert_eq!(frames, held);
                    }
                    Err(e) => panic!("reset: {e}"),
                }
            }
            Op::Reopen => self.open(),
            Op::Crash { keep_prefix } => {
                // Every operation above returned, so all of it is durable:
                // a power cut must change nothing.
                self.log = None;
                self.disk.crash(match keep_prefix {
                    Some(seed) => CrashMode::KeepPrefix(*seed),
                    None => CrashMode::LoseUnsynced,
                });
                self.open();
            }
        }
    }

    fn insert(&mut self, seq: u64, kind: u16, meta: Vec<u8>, len: usize) {
        self.model.frames.insert(
            seq,
            Frame {
                kind,
                meta,
                blob: blob(seq, len),
            },
        );
        self.model.head = seq;
    }

    fn drop_below(&mut self, first: u64) {
        self.model.frames = self.model.frames.split_off(&first);
        self.model.first = first;
    }

    fn check(&self) {
        let log = self.log();
        let m = &self.model;
        assert_eq!(log.head_seq(), m.head, "head");
        assert_eq!(log.first_seq(), m.first, "first");
        assert_eq!(
            m.frames.keys().copied().collect::<Vec<_>>(),
            (m.first..=m.head).collect::<Vec<_>>(),
            "model frames are dense"
        );
        for (&seq, f) in &m.frames {
            let e = log.read(seq).expect("read");
            assert_eq!(
                (e.kind, &e.meta, &e.blob),
                (f.kind, &f.meta, &f.blob),
                "frame {seq}"
            );
        }
        let range = log.range(m.first, m.head).expect("range");
        assert_eq!(range.len(), m.frames.len());
        for e in &range {
            let f = &m.frames[&e.seq];
            assert_eq!((e.kind, &e.meta, &e.blob), (f.kind, &f.meta, &f.blob));
        }
        let mut scanned = Vec::new();
        log.scan_meta(|seq, kind, meta| scanned.push((seq, kind, meta.to_vec())))
            .expect("scan_meta");
        let expected: Vec<_> = m
            .frames
            .iter()
            .map(|(s, f)| (*s, f.kind, f.meta.clone()))
            .collect();
        assert_eq!(scanned, expected, "scan_meta");
        let layout = log.layout();
        assert_eq!(layout.first().map(|s| s.0), Some(m.first));
        for pair in layout.windows(2) {
            assert_eq!(
                pair[0].1 + 1,
                pair[1].0,
                "segments are contiguous: {layout:?}"
            );
        }
        assert!(matches!(log.read(m.head + 1), Err(Error::PastHead { .. })));
        if m.first > 1 {
            assert!(matches!(
                log.read(m.first - 1),
                Err(Error::BelowFloor { .. })
            ));
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn log_matches_model(
        segment_bytes in prop_oneof![Just(256u64), 300u64..2048, Just(8192u64)],
        ops in prop::collection::vec(op(), 1..60),
    ) {
        let mut h = Harness {
            disk: SimStorage::new(),
            segment_bytes,
            log: None,
            model: Model { frames: BTreeMap::new(), head: 0, first: 1 },
        };
        h.open();
        h.check();
        for op in &ops {
            h.apply(op);
            h.check();
        }
    }
}
