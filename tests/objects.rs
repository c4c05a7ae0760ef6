//! The object read stack against a `BTreeMap` model: random appends (with
//! repeats and conflicts), rebuilds, retains and reopens of file-backed
//! stacks in both layouts, every query checked after every step. The bare
//! layouts are built from the model and checked alongside.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use proptest::prelude::*;
use twinlog::objects::{
    Error, FourTables, IndexEntry, IndexRow, ObjType, ObjectIndex, ObjectReadStack,
    OneTableFourColumns, RebuildReason, RebuildTriggers, OID_LEN, TAIL_ORDINAL_BIT,
};

/// Oids in the pool; `i % PREFIXES` picks the first 8 bytes, so several
/// oids share a prefix and the full-oid check after the tree is exercised.
const POOL: usize = 24;
const PREFIXES: usize = 7;
/// Facts variants per oid: two appends of one oid with different variants
/// conflict.
const FACTS: u8 = 3;
const CACHE: usize = 1 << 20;

const TRIGGERS: RebuildTriggers = RebuildTriggers {
    max_unabsorbed_rows: Some(9),
    max_unabsorbed_fraction: Some(0.6),
};

fn oid(i: usize) -> [u8; OID_LEN] {
    let mut o = [0u8; OID_LEN];
    o[..8].copy_from_slice(&((i % PREFIXES) as u64 * 0x0101_0101_0101_0101).to_be_bytes());
    o[8..16].copy_from_slice(&(i as u64).wrapping_mul(2_654_435_761).to_be_bytes());
    o[19] = i as u8;
    o
}

fn entry(i: usize, f: u8) -> IndexEntry {
    let f64_ = u64::from(f);
    IndexEntry {
        oid: oid(i),
        obj_type: ObjType::ALL[(i + usize::from(f)) % 4],
        offset: (i as u64 * 37 + f64_ * 1000) % 2000,
        len: 10 + f64_,
        uncompressed: i as u64 * 10 + f64_,
    }
}

/// Extents checked by `extents_with_rows`: overlapping, empty, at the end
/// of the range, and past every offset.
const EXTENTS: [(u64, u64); 9] = [
    (0, 50),
    (50, 100),
    (150, 0),
    (100, 1),
    (0, 2000),
    (300, 400),
    (1000, 37),
    (1999, 10),
    (u64::MAX - 5, 10),
];

#[derive(Clone, Debug)]
enum Op {
    Append(Vec<(usize, u8)>),
    Rebuild,
    Retain(u8),
    Reopen,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => proptest::collection::vec((0..POOL, 0..FACTS), 0..8).prop_map(Op::Append),
        1 => Just(Op::Rebuild),
        1 => (0u8..3).prop_map(Op::Retain),
        1 => Just(Op::Reopen),
    ]
}

fn live(seed: u8) -> impl Fn(&[u8]) -> bool {
    move |oid: &[u8]| (oid[19] ^ seed) % 3 != 0
}

/// What the repository holds, and what the projection was built from.
#[derive(Default)]
struct Model {
    rows: BTreeMap<[u8; OID_LEN], (IndexEntry, u64)>,
    absorbed: BTreeSet<[u8; OID_LEN]>,
    next_arrival: u64,
}

impl Model {
    fn absorb(&mut self) {
        self.absorbed = self.rows.keys().copied().collect();
    }

    /// The same threshold check the stack makes.
    fn due(&self) -> Option<RebuildReason> {
        let total = self.rows.len() as u64;
        let rows = total - self.absorbed.len() as u64;
        if rows == 0 {
            return None;
        }
        let limit = TRIGGERS.max_unabsorbed_rows?;
        if rows >= limit {
            return Some(RebuildReason::UnabsorbedRows { rows, limit });
        }
        let f = TRIGGERS.max_unabsorbed_fraction?;
        (rows as f64 >= f * total as f64)
            .then_some(RebuildReason::UnabsorbedFraction { rows, total })
    }

    /// Ok(reason) or a conflict, applied only when it is not one.
    fn append(&mut self, batch: &[IndexEntry]) -> Result<Option<RebuildReason>, ()> {
        let mut seen: BTreeMap<[u8; OID_LEN], IndexEntry> = BTreeMap::new();
        for e in batch {
            let prior = seen.get(&e.oid).or(self.rows.get(&e.oid).map(|r| &r.0));
            if prior.is_some_and(|p| !p.same_facts(e)) {
                return Err(());
            }
            seen.insert(e.oid, *e);
        }
        for (k, e) in seen {
            if !self.rows.contains_key(&k) {
                self.rows.insert(k, (e, self.next_arrival));
                self.next_arrival += 1;
            }
        }
        let due = self.due();
        if due.is_some() {
            self.absorb();
        }
        Ok(due)
    }

    fn row(&self, oid: &[u8]) -> Option<IndexRow> {
        let (e, arrival) = self.rows.get(oid)?;
        let ordinal = match self.absorbed.iter().position(|a| a[..] == *oid) {
            Some(rank) => rank as u32,
            None => TAIL_ORDINAL_BIT | *arrival as u32,
        };
        Some(IndexRow {
            ordinal,
            obj_type: e.obj_type,
            offset: e.offset,
            len: e.len,
            uncompressed: e.uncompressed,
        })
    }

    fn entries(&self) -> Vec<IndexEntry> {
        self.rows.values().map(|r| r.0).collect()
    }
}

/// Every pool oid, one never in the pool, and one of the wrong length.
fn queries() -> Vec<Vec<u8>> {
    let mut q: Vec<Vec<u8>> = (0..POOL).map(|i| oid(i).to_vec()).collect();
    q.push(oid(POOL + 100).to_vec());
    q.push(oid(3)[..19].to_vec());
    q
}

/// What every index answers, whatever it is.
fn check_index<I: ObjectIndex>(ix: &I, m: &Model, absorbed_ordinals: bool) {
    let qs = queries();
    let refs: Vec<&[u8]> = qs.iter().map(Vec::as_slice).collect();
    let want: Vec<Option<IndexRow>> = refs.iter().map(|o| m.row(o)).collect();
    let want: Vec<Option<IndexRow>> = if absorbed_ordinals {
        want
    } else {
        // A bare layout is built from the whole model: ordinal = rank.
        refs.iter()
            .map(|o| {
                let rank = m.rows.keys().position(|k| k[..] == **o)?;
                m.row(o).map(|r| IndexRow {
                    ordinal: rank as u32,
                    ..r
                })
            })
            .collect()
    };
    let name = ix.name();
    assert_eq!(ix.len(), m.rows.len(), "{name} len");
    assert_eq!(ix.is_empty(), m.rows.is_empty(), "{name} is_empty");
    let single: Vec<Option<IndexRow>> = refs.iter().map(|o| ix.lookup(o)).collect();
    assert_eq!(single, want, "{name} lookup");
    assert_eq!(ix.lookup_batch(&refs), want, "{name} lookup_batch");
    let ords: Vec<Option<u32>> = want.iter().map(|r| r.map(|r| r.ordinal)).collect();
    assert_eq!(ix.ordinals_batch(&refs), ords, "{name} ordinals_batch");
    let ext: Vec<Option<(u64, u64)>> = want.iter().map(|r| r.map(|r| (r.offset, r.len))).collect();
    assert_eq!(ix.extents_batch(&refs), ext, "{name} extents_batch");
    let sum: u64 = m.rows.values().map(|r| r.0.uncompressed).sum();
    assert_eq!(ix.sum_uncompressed(), sum, "{name} sum_uncompressed");
    for t in ObjType::ALL {
        let n = m.rows.values().filter(|r| r.0.obj_type == t).count();
        assert_eq!(ix.count_type(t), n, "{name} count_type {t:?}");
    }
}

fn check_stack<S: ObjectIndex>(s: &ObjectReadStack<S>, m: &Model) {
    check_index(s, m, true);
    assert_eq!(s.projection_len(), m.absorbed.len());
    assert_eq!(s.projection_is_complete(), m.absorbed.len() == m.rows.len());
    let stats = s.stats();
    assert_eq!(stats.total_rows, m.rows.len() as u64);
    assert_eq!(stats.projection_rows, m.absorbed.len() as u64);
    let oids = s.oids_in_order().expect("oids_in_order");
    let want: Vec<Vec<u8>> = m.rows.keys().map(|k| k.to_vec()).collect();
    assert_eq!(oids, want, "oids_in_order");
    let got = s.extents_with_rows(&EXTENTS).expect("extents_with_rows");
    let want: Vec<bool> = EXTENTS
        .iter()
        .map(|&(o, l)| {
            m.rows
                .values()
                .any(|r| r.0.offset >= o && r.0.offset < o.saturating_add(l))
        })
        .collect();
    assert_eq!(got, want, "extents_with_rows");
}

struct Pair {
    dir: PathBuf,
    four: ObjectReadStack<FourTables>,
    one: ObjectReadStack<OneTableFourColumns>,
}

impl Pair {
    fn open(dir: &Path) -> Pair {
        Pair {
            dir: dir.to_path_buf(),
            four: ObjectReadStack::open(&dir.join("four.redb"), TRIGGERS, CACHE).expect("open"),
            one: ObjectReadStack::open(&dir.join("one.redb"), TRIGGERS, CACHE).expect("open"),
        }
    }

    fn reopen(self) -> Pair {
        let dir = self.dir.clone();
        drop(self);
        Pair::open(&dir)
    }

    fn check(&self, m: &Model) {
        check_stack(&self.four, m);
        check_stack(&self.one, m);
        assert_eq!(self.four.projection_name(), "FourTables");
        assert_eq!(self.one.projection_name(), "OneTableFourColumns");
        let entries = m.entries();
        check_index(&FourTables::build(&entries).expect("build"), m, false);
        check_index(
            &OneTableFourColumns::build(&entries).expect("build"),
            m,
            false,
        );
    }
}

fn run(ops: Vec<Op>) {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut p = Pair::open(dir.path());
    let mut m = Model::default();
    p.check(&m);
    for op in ops {
        match op {
            Op::Append(picks) => {
                let batch: Vec<IndexEntry> = picks.iter().map(|&(i, f)| entry(i, f)).collect();
                let want = m.append(&batch);
                for got in [p.four.append(&batch), p.one.append(&batch)] {
                    match (&want, got) {
                        (Ok(w), Ok(g)) => assert_eq!(*w, g, "rebuild reason"),
                        (Err(()), Err(Error::Conflict { .. })) => {}
                        (w, g) => panic!("append: model {w:?}, stack {g:?}"),
                    }
                }
            }
            Op::Rebuild => {
                p.four.rebuild().expect("rebuild");
                p.one.rebuild().expect("rebuild");
                m.absorb();
            }
            Op::Retain(seed) => {
                let keep = live(seed);
                let before = m.rows.len();
                m.rows.retain(|k, _| keep(k));
                m.absorb();
                let gone = (before - m.rows.len()) as u64;
                assert_eq!(p.four.retain(&keep).expect("retain"), gone);
                assert_eq!(p.one.retain(&keep).expect("retain"), gone);
            }
            Op::Reopen => {
                p = p.reopen();
                m.absorb();
            }
        }
        p.check(&m);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]

    #[test]
    fn the_stack_answers_what_the_model_holds(ops in proptest::collection::vec(op(), 1..14)) {
        run(ops);
    }
}

#[test]
fn a_conflicting_batch_writes_nothing_even_after_a_reopen() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("tail.redb");
    {
        let s: ObjectReadStack =
            ObjectReadStack::open(&path, RebuildTriggers::never(), CACHE).expect("open");
        s.append(&[entry(1, 0)]).expect("append");
        let r = s.append(&[entry(2, 0), entry(3, 0), entry(1, 1)]);
        assert!(matches!(r, Err(Error::Conflict { .. })), "{r:?}");
        let r = s.append(&[entry(4, 0), entry(4, 1)]);
        assert!(matches!(r, Err(Error::Conflict { .. })), "{r:?}");
    }
    let s: ObjectReadStack =
        ObjectReadStack::open(&path, RebuildTriggers::never(), CACHE).expect("reopen");
    assert_eq!(s.len(), 1);
    assert_eq!(s.oids_in_order().expect("scan"), vec![oid(1).to_vec()]);
    for i in [2, 3, 4] {
        assert!(s.lookup(&oid(i)).is_none());
    }
    assert_eq!(
        s.lookup(&oid(1)).map(|r| r.offset),
        Some(entry(1, 0).offset)
    );
}

#[test]
fn a_large_projection_agrees_with_binary_search() {
    let entries: Vec<IndexEntry> = (0..5000).map(|i| entry(i, 0)).collect();
    let four = FourTables::build(&entries).expect("build");
    let one = OneTableFourColumns::build(&entries).expect("build");
    let stack = ObjectReadStack::<OneTableFourColumns>::build(&entries).expect("build");
    let mut sorted: Vec<[u8; OID_LEN]> = entries.iter().map(|e| e.oid).collect();
    sorted.sort();
    let qs: Vec<[u8; OID_LEN]> = (0..6000).map(oid).collect();
    let refs: Vec<&[u8]> = qs.iter().map(|q| &q[..]).collect();
    let want: Vec<Option<u32>> = qs
        .iter()
        .map(|q| sorted.binary_search(q).ok().map(|i| i as u32))
        .collect();
    assert_eq!(four.ordinals_batch(&refs), want);
    assert_eq!(one.ordinals_batch(&refs), want);
    assert_eq!(stack.ordinals_batch(&refs), want);
    assert!(stack.projection_is_complete());
    assert_eq!(four.ipc_bytes() > 0, one.ipc_bytes() > 0);
}
