//! The durable tail: every row of the repository in one redb table keyed by
//! the raw oid, so redb's key order is oid order and a scan of the table is
//! already the projection's sort.
//!
//! A row's value is fixed-width, little-endian: the type byte, offset, len,
//! uncompressed size, and the row's arrival number (its place in the order
//! rows reached the tail, which names tail-served ordinals). The next
//! arrival number lives in a meta table and moves in the same commit as the
//! rows, so it survives a reopen exactly.

use std::path::Path;

use redb::backends::InMemoryBackend;

use super::backend::SeamBackend;
use crate::storage::Storage;
use redb::{Builder, Database, Durability, ReadableTable, TableDefinition};

use super::entry::{hex, IndexEntry, ObjType, OID_LEN};
use super::{Error, Result};

pub(crate) const VALUE_LEN: usize = 1 + 4 * 8;

pub(crate) const ROWS: TableDefinition<&[u8; OID_LEN], &[u8; VALUE_LEN]> =
    TableDefinition::new("rows");
const META: TableDefinition<&str, u64> = TableDefinition::new("meta");
const NEXT_ARRIVAL: &str = "next_arrival";

/// redb's page cache for a tail with no file: the pages are in memory
/// already, so the cache only has to hold a working set.
const IN_MEMORY_CACHE_BYTES: usize = 16 << 20;

/// One row as the tail holds it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct TailRow {
    pub entry: IndexEntry,
    pub arrival: u64,
}

/// Row count, inflated bytes and per-type counts of a set of rows.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Totals {
    pub rows: u64,
    pub sum: u64,
    pub types: [u64; 4],
}

impl Totals {
    pub fn add(&mut self, e: &IndexEntry) {
        self.rows += 1;
        self.sum += e.uncompressed;
        self.types[e.obj_type.slot()] += 1;
    }
}

fn encode(e: &IndexEntry, arrival: u64) -> [u8; VALUE_LEN] {
    let mut v = [0u8; VALUE_LEN];
    v[0] = e.obj_type.as_u8();
    for (i, x) in [e.offset, e.len, e.uncompressed, arrival]
        .iter()
        .enumerate()
    {
        v[1 + 8 * i..9 + 8 * i].copy_from_slice(&x.to_le_bytes());
    }
    v
}

/// The `i`-th u64 field after the type byte.
#[inline]
pub(crate) fn field(v: &[u8; VALUE_LEN], i: usize) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&v[1 + 8 * i..9 + 8 * i]);
    u64::from_le_bytes(b)
}

fn decode(oid: &[u8; OID_LEN], v: &[u8; VALUE_LEN]) -> Result<TailRow> {
    let obj_type = ObjType::from_u8(v[0]).ok_or_else(|| Error::Corrupt {
        what: format!("type byte {} for oid {}", v[0], hex(oid)),
    })?;
    Ok(TailRow {
        entry: IndexEntry {
            oid: *oid,
            obj_type,
            offset: field(v, 0),
            len: field(v, 1),
            uncompressed: field(v, 2),
        },
        arrival: field(v, 3),
    })
}

/// Open or create the tail at `path` with a page cache of `cache_bytes`,
/// its pages read and written through `fs`.
///
/// A new tail is written beside its name and renamed into place once redb
/// has initialized it (its commit fsyncs it): a crash or a failed write
/// while redb lays out a new file would otherwise leave, under the tail's
/// name, a file redb refuses to open. The database stays open across the
/// rename, which moves the name and not the file.
pub(crate) fn open_file(fs: &dyn Storage, path: &Path, cache_bytes: usize) -> Result<Database> {
    if !fs.exists(path)? {
        let mut name = path.as_os_str().to_owned();
        name.push(".new");
        let fresh = std::path::PathBuf::from(name);
        if fs.exists(&fresh)? {
            fs.remove(&fresh)?;
        }
        let db = Builder::new()
            .set_cache_size(cache_bytes)
            .create_with_backend(SeamBackend::open(fs, &fresh)?)?;
        init(&db)?;
        fs.rename(&fresh, path)?;
        crate::publish::sync_parent_with(fs, path)?;
        return Ok(db);
    }
    let db = Builder::new()
        .set_cache_size(cache_bytes)
        .create_with_backend(SeamBackend::open(fs, path)?)?;
    init(&db)?;
    Ok(db)
}

pub(crate) fn open_memory() -> Result<Database> {
    let db = Builder::new()
        .set_cache_size(IN_MEMORY_CACHE_BYTES)
        .create_with_backend(InMemoryBackend::new())?;
    init(&db)?;
    Ok(db)
}

/// Create both tables, so every later read transaction finds them.
fn init(db: &Database) -> Result<()> {
    let txn = db.begin_write()?;
    txn.open_table(ROWS)?;
    txn.open_table(META)?;
    txn.commit()?;
    Ok(())
}

/// Every row of `table` in oid order, and their totals.
pub(crate) fn scan(
    table: &impl ReadableTable<&'static [u8; OID_LEN], &'static [u8; VALUE_LEN]>,
) -> Result<(Vec<IndexEntry>, Totals)> {
    let mut entries = Vec::new();
    let mut totals = Totals::default();
    for row in table.iter()? {
        let (k, v) = row?;
        let r = decode(k.value(), v.value())?;
        totals.add(&r.entry);
        entries.push(r.entry);
    }
    Ok((entries, totals))
}

/// Write `entries` (sorted by oid, no repeats) in one durable commit, and
/// answer the totals of the rows that were new. A row already present with
/// the same facts is skipped; one with other facts aborts the transaction,
/// so nothing of the batch is written.
pub(crate) fn append(db: &Database, entries: &[IndexEntry]) -> Result<Totals> {
    let mut txn = db.begin_write()?;
    // The caller (a store applying log frames) must know the rows survive a
    // crash once this returns.
    txn.set_durability(Durability::Immediate);
    let mut added = Totals::default();
    let refused = {
        let mut rows = txn.open_table(ROWS)?;
        let mut meta = txn.open_table(META)?;
        let mut next = meta.get(NEXT_ARRIVAL)?.map_or(0, |g| g.value());
        let mut refused = None;
        for e in entries {
            let present = match rows.get(&e.oid)? {
                Some(v) => Some(decode(&e.oid, v.value())?),
                None => None,
            };
            match present {
                Some(old) if old.entry.same_facts(e) => continue,
                Some(_) => {
                    refused = Some(Error::Conflict { oid: hex(&e.oid) });
                    break;
                }
                None => {}
            }
            rows.insert(&e.oid, &encode(e, next))?;
            next += 1;
            added.add(e);
        }
        if refused.is_none() && added.rows > 0 {
            meta.insert(NEXT_ARRIVAL, next)?;
        }
        refused
    };
    if let Some(e) = refused {
        txn.abort()?;
        return Err(e);
    }
    if added.rows == 0 {
        // A batch of repeats changes nothing and costs no fsync.
        txn.abort()?;
    } else {
        txn.commit()?;
    }
    Ok(added)
}

/// Copy every row of `from` that `keep` accepts, arrival number and all,
/// and the next arrival number into `to` (a tail just created), in one
/// durable commit. Answers how many rows were left out.
pub(crate) fn copy_retained(
    from: &Database,
    to: &Database,
    keep: &dyn Fn(&IndexEntry) -> bool,
) -> Result<u64> {
    let read = from.begin_read()?;
    let src = read.open_table(ROWS)?;
    let next = read.open_table(META)?.get(NEXT_ARRIVAL)?.map(|g| g.value());
    let mut txn = to.begin_write()?;
    txn.set_durability(Durability::Immediate);
    let mut left_out = 0;
    {
        let mut rows = txn.open_table(ROWS)?;
        for row in src.iter()? {
            let (k, v) = row?;
            if keep(&decode(k.value(), v.value())?.entry) {
                rows.insert(k.value(), v.value())?;
            } else {
                left_out += 1;
            }
        }
        if let Some(next) = next {
            txn.open_table(META)?.insert(NEXT_ARRIVAL, next)?;
        }
    }
    txn.commit()?;
    Ok(left_out)
}

/// The rows of `oids[i]` for every `i` in `which`, in one read transaction.
pub(crate) fn get_many(
    db: &Database,
    oids: &[&[u8]],
    which: &[usize],
) -> Result<Vec<(usize, TailRow)>> {
    let txn = db.begin_read()?;
    let table = txn.open_table(ROWS)?;
    let mut out = Vec::new();
    for &i in which {
        let Ok(oid) = <&[u8; OID_LEN]>::try_from(oids[i]) else {
            continue;
        };
        if let Some(v) = table.get(oid)? {
            out.push((i, decode(oid, v.value())?));
        }
    }
    Ok(out)
}

pub(crate) fn oids_in_order(db: &Database) -> Result<Vec<Vec<u8>>> {
    let txn = db.begin_read()?;
    let table = txn.open_table(ROWS)?;
    let mut out = Vec::new();
    for row in table.iter()? {
        out.push(row?.0.value().to_vec());
    }
    Ok(out)
}

/// Which extents hold the offset of at least one row: one ordered scan
/// that stops once every non-empty extent has been hit.
pub(crate) fn extents_with_rows(db: &Database, extents: &[(u64, u64)]) -> Result<Vec<bool>> {
    let mut out = vec![false; extents.len()];
    let mut order: Vec<usize> = (0..extents.len()).filter(|&i| extents[i].1 > 0).collect();
    if order.is_empty() {
        return Ok(out);
    }
    order.sort_by_key(|&i| extents[i].0);
    let starts: Vec<u64> = order.iter().map(|&i| extents[i].0).collect();
    let ends: Vec<u64> = order
        .iter()
        .map(|&i| extents[i].0.saturating_add(extents[i].1))
        .collect();
    // The furthest end among extents 0..=j in start order: walking back from
    // an offset can stop where no earlier extent reaches it, which with
    // disjoint extents (packs) is after one step.
    let reach: Vec<u64> = ends
        .iter()
        .scan(0u64, |m, &e| {
            *m = (*m).max(e);
            Some(*m)
        })
        .collect();
    let mut hit = vec![false; order.len()];
    let mut remaining = order.len();

    let txn = db.begin_read()?;
    let table = txn.open_table(ROWS)?;
    for row in table.iter()? {
        let offset = field(row?.1.value(), 0);
        let mut j = starts.partition_point(|&s| s <= offset);
        while j > 0 && reach[j - 1] > offset {
            j -= 1;
            if ends[j] > offset && !hit[j] {
                hit[j] = true;
                remaining -= 1;
            }
        }
        if remaining == 0 {
            break;
        }
    }
    for (k, &i) in order.iter().enumerate() {
        out[i] = hit[k];
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_value_round_trips() {
        let e = IndexEntry {
            oid: [7; OID_LEN],
            obj_type: ObjType::Tag,
            offset: u64::MAX - 1,
            len: 3,
            uncompressed: 1 << 40,
        };
        let r = decode(&e.oid, &encode(&e, 99)).expect("decodes");
        assert_eq!((r.entry, r.arrival), (e, 99));
    }
}
