use super::*;
use crate::objects::entry::OID_LEN;
use crate::objects::{Error, FourTables};

fn entry(i: u32, offset: u64) -> IndexEntry {
    let mut oid = [0u8; OID_LEN];
    oid[..4].copy_from_slice(&i.to_be_bytes());
    oid[19] = 0xaa;
    IndexEntry {
        oid,
        obj_type: ObjType::ALL[i as usize % 4],
        offset,
        len: 10,
        uncompressed: 100 + u64::from(i),
    }
}

#[test]
fn the_stack_is_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<ObjectReadStack>();
    check::<ObjectReadStack<FourTables>>();
}

#[test]
fn a_tail_row_is_found_before_and_after_a_rebuild() {
    let s: ObjectReadStack = ObjectReadStack::in_memory(RebuildTriggers::never()).expect("open");
    assert_eq!(
        s.append(&[entry(1, 0), entry(2, 10)]).expect("append"),
        None
    );
    assert_eq!(s.projection_len(), 0);
    assert!(!s.projection_is_complete());
    let row = s.lookup(&entry(2, 10).oid).expect("tail serves it");
    assert_eq!(row.ordinal, TAIL_ORDINAL_BIT | 1);
    s.rebuild().expect("rebuild");
    assert!(s.projection_is_complete());
    assert_eq!(s.lookup(&entry(2, 10).oid).map(|r| r.ordinal), Some(1));
    assert_eq!(s.stats().generation, 1);
}

#[test]
fn a_conflict_writes_nothing_of_its_batch() {
    let s: ObjectReadStack = ObjectReadStack::in_memory(RebuildTriggers::never()).expect("open");
    s.append(&[entry(1, 0)]).expect("append");
    let r = s.append(&[entry(3, 30), entry(1, 5)]);
    assert!(matches!(r, Err(Error::Conflict { .. })), "{r:?}");
    assert_eq!(s.len(), 1);
    assert!(s.lookup(&entry(3, 30).oid).is_none());
}

#[test]
fn a_tripped_threshold_rebuilds_inline_and_says_why() {
    let triggers = RebuildTriggers {
        max_unabsorbed_rows: Some(3),
        max_unabsorbed_fraction: None,
    };
    let s: ObjectReadStack = ObjectReadStack::in_memory(triggers).expect("open");
    assert_eq!(s.append(&[entry(1, 0), entry(2, 0)]).expect("append"), None);
    let why = s.append(&[entry(3, 0)]).expect("append");
    assert_eq!(
        why,
        Some(RebuildReason::UnabsorbedRows { rows: 3, limit: 3 })
    );
    assert_eq!(s.projection_len(), 3);
}

#[test]
fn a_swapped_in_tail_keeps_the_rows_and_arrivals_and_no_byte_of_the_others() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("tail.redb");
    let staged = dir.path().join("staged.redb");
    let mut s: ObjectReadStack =
        ObjectReadStack::open(&path, RebuildTriggers::never(), 1 << 20).expect("open");
    // Enough rows that the ones dropped fill pages of their own.
    let all: Vec<IndexEntry> = (0..3000).map(|i| entry(i, u64::from(i) * 10)).collect();
    for batch in all.chunks(300) {
        s.append(batch).expect("append");
    }
    let gone = |e: &IndexEntry| e.offset < 15_000;
    let before: Vec<_> = all
        .iter()
        .map(|e| s.try_lookup(&e.oid).expect("lookup"))
        .collect();
    assert_eq!(
        s.stage_retained(&|e| !gone(e), &staged).expect("stage"),
        1500
    );
    assert_eq!(s.len(), 3000, "nothing changes before the swap");
    s.swap_in(&staged).expect("swap");
    assert!(!staged.exists());
    assert_eq!(s.len(), 1500);
    assert!(s.projection_is_complete());
    let raw = StdStorage.read(&path).expect("read");
    let oids: std::collections::HashSet<&[u8]> = all.iter().map(|e| &e.oid[..]).collect();
    let held: std::collections::HashSet<&[u8]> =
        raw.windows(OID_LEN).filter(|w| oids.contains(w)).collect();
    for (e, row) in all.iter().zip(&before) {
        assert_eq!(held.contains(&e.oid[..]), !gone(e), "row at {}", e.offset);
        let now = s.try_lookup(&e.oid).expect("lookup");
        if gone(e) {
            assert!(now.is_none());
        } else {
            let (now, row) = (now.expect("kept"), row.expect("was there"));
            assert_eq!((now.offset, now.len), (row.offset, row.len));
        }
    }
    // The next arrival number moved with the rows: a row appended now
    // is served by the tail under the number after the 3000 first.
    let late = entry(9999, 1);
    s.append(&[late]).expect("append");
    let row = s.try_lookup(&late.oid).expect("lookup").expect("present");
    assert_eq!(row.ordinal, TAIL_ORDINAL_BIT | 3000);
    drop(s);
    let s: ObjectReadStack =
        ObjectReadStack::open(&path, RebuildTriggers::never(), 1 << 20).expect("reopen");
    assert_eq!(s.len(), 1501);
}

#[test]
fn an_in_memory_tail_has_no_file_to_swap() {
    let mut s: ObjectReadStack =
        ObjectReadStack::in_memory(RebuildTriggers::never()).expect("open");
    let staged = std::env::temp_dir().join("never-written.redb");
    assert!(matches!(
        s.stage_retained(&|_| true, &staged),
        Err(Error::InMemory)
    ));
    assert!(matches!(s.swap_in(&staged), Err(Error::InMemory)));
}

#[test]
fn the_fast_path_answers_misses_without_the_tail() {
    let s = ObjectReadStack::<OneTableFourColumns>::build(&[entry(1, 0)]).expect("build");
    assert!(s.lookup(&[9; OID_LEN]).is_none());
    assert_eq!(s.stats().tail_lookups, 0);
    s.set_fast_path(false);
    assert!(s.lookup(&[9; OID_LEN]).is_none());
    assert_eq!(s.stats().tail_lookups, 1);
}
