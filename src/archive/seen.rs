//! What a box knows its archive holds, and what it found gone. The bucket
//! is a witness, not the truth: a lifecycle rule, a wrong `rm` or another
//! writer can take or change an object at any time. So each object this
//! box uploaded or listed is recorded with its size and entity tag; a
//! later listing without it, or a HEAD that answers another size or tag,
//! makes it missing. A segment leaves the box only after a HEAD in the
//! same pass found every object covering it as recorded
//! ([`confirm_before`]), and while a missing object's frames are covered
//! by no other object, retention drops nothing at all.
//!
//! An object is recorded as the box first saw it: one placed under a name
//! before any box recorded one there is taken on its first listing. What
//! it holds is the restore's and the tiered read's to check (with a key,
//! only what opens under it is read).

use std::collections::{BTreeMap, HashSet};
use std::sync::Mutex;

use super::bucket::{Bucket, Stored};
use super::codec::ArchiveKey;
use super::names::{lineage, SegmentName};
use crate::repl::epochs::EpochStart;

/// The segments the bucket holds: first, last and lineage.
pub(crate) type Known = HashSet<(u64, u64, u64)>;

/// The runs of frames the bucket holds of this log's lineage, merged,
/// oldest first. The other box cuts its segments where it rolls, which
/// need not be where this one does: a segment here is archived when a run
/// covers it, whichever objects make the run.
pub(crate) fn covered(known: &Known, history: &[u8; 16], epochs: &[EpochStart]) -> Vec<(u64, u64)> {
    let known: Known = known
        .iter()
        .filter(|(_, last, lin)| *lin == lineage(history, epochs, *last))
        .copied()
        .collect();
    covered_any(&known)
}

pub(crate) fn is_covered(runs: &[(u64, u64)], first: u64, last: u64) -> bool {
    runs.iter().any(|&(a, b)| a <= first && last <= b)
}

/// The objects of the bucket as this box recorded them.
#[derive(Debug, Default)]
pub(crate) struct Seen {
    present: BTreeMap<SegmentName, Stored>,
    /// Recorded objects the bucket no longer holds as recorded, until
    /// their frames are archived again.
    missing: BTreeMap<SegmentName, Stored>,
    /// Objects found missing since start.
    pub found_missing: u64,
    /// The objects this box knows to be genuine, as they were when it
    /// knew it: those it uploaded, and (with a key) those whose footer it
    /// opened under the key as the object of their name. Any other is
    /// only a name in a listing until then: one that anyone who can write
    /// to the bucket could have put there.
    vouched: BTreeMap<SegmentName, Stored>,
}

impl Seen {
    /// An object uploaded (or listed) as `stored`.
    pub fn record(&mut self, name: SegmentName, stored: Stored) {
        self.missing.remove(&name);
        self.present.insert(name, stored);
    }

    /// An object this box uploaded, as the bucket answered the upload.
    pub fn record_uploaded(&mut self, name: SegmentName, stored: Stored) {
        self.vouched.insert(name, stored.clone());
        self.record(name, stored);
    }

    /// Whether this box knows `name`, as `stored` describes it, to be
    /// genuine.
    fn vouched_for(&self, name: &SegmentName, stored: &Stored) -> bool {
        self.vouched
            .get(name)
            .is_some_and(|v| v.same_as(stored) && v.e_tag.is_some() == stored.e_tag.is_some())
    }

    /// The present objects, as retention's coverage counts them.
    pub fn known(&self) -> Known {
        self.present
            .keys()
            .map(|n| (n.first, n.last, n.lineage))
            .collect()
    }

    /// The bucket does not hold `name` as recorded.
    fn lose(&mut self, name: &SegmentName) {
        #[cfg(feature = "drill-sabotage")]
        if bucket_trusted() {
            return;
        }
        self.vouched.remove(name);
        if let Some(s) = self.present.remove(name) {
            tracing::error!(first = name.first, last = name.last, generation = name.generation, "an archived object is gone or changed: retention holds until its frames are archived again");
            self.missing.insert(*name, s);
            self.found_missing += 1;
        }
    }

    /// A fresh listing: every object of this log (`ours`) recorded and
    /// absent, or there with another size or tag, is missing; every other
    /// listed object is recorded. A missing object listed again is taken
    /// back when it is the one recorded, or, by a box that does not
    /// upload (`adopt`), whatever the uploader wrote under its name.
    pub fn audit(
        &mut self,
        listed: Vec<(SegmentName, Stored)>,
        ours: impl Fn(&SegmentName) -> bool,
        adopt: bool,
    ) {
        let now: BTreeMap<SegmentName, Stored> = listed.into_iter().collect();
        let recorded: Vec<(SegmentName, Stored)> =
            self.present.iter().map(|(n, s)| (*n, s.clone())).collect();
        for (n, s) in recorded {
            match now.get(&n) {
                Some(there) if s.same_as(there) => {}
                _ if ours(&n) => self.lose(&n),
                // Another life's or log's: not this box's to keep.
                _ => {
                    self.present.remove(&n);
                }
            }
        }
        for (n, s) in now {
            if self.present.contains_key(&n) {
                continue;
            }
            match self.missing.get(&n) {
                Some(was) if !(adopt || was.same_as(&s)) => {}
                _ => self.record(n, s),
            }
        }
    }

    /// The missing objects whose frames no present object of this log
    /// covers, oldest first; those covered again (uploaded anew, under
    /// this name or another) are forgotten.
    pub fn missing(&mut self, ours: impl Fn(&SegmentName) -> bool) -> Vec<SegmentName> {
        let known: Known = self
            .present
            .keys()
            .filter(|n| ours(n))
            .map(|n| (n.first, n.last, n.lineage))
            .collect();
        let runs = covered_any(&known);
        self.missing
            .retain(|n, _| !ours(n) || !is_covered(&runs, n.first, n.last));
        self.missing.keys().copied().collect()
    }

    /// The present objects of this log holding frames `first..=last`, the
    /// newest generation of each; None when they do not cover them all.
    fn covering(
        &self,
        first: u64,
        last: u64,
        ours: impl Fn(&SegmentName) -> bool,
    ) -> Option<Vec<(SegmentName, Stored)>> {
        let mut by_first: BTreeMap<u64, (SegmentName, Stored)> = BTreeMap::new();
        for (n, s) in &self.present {
            if n.last < first || n.first > last || !ours(n) {
                continue;
            }
            match by_first.get(&n.first) {
                Some((had, _)) if had.generation >= n.generation => {}
                _ => {
                    by_first.insert(n.first, (*n, s.clone()));
                }
            }
        }
        let mut next = first;
        for (n, _) in by_first.values() {
            if n.first > next {
                return None;
            }
            next = next.max(n.last + 1);
        }
        (next > last).then(|| by_first.into_values().collect())
    }
}

/// A drill's negative control only (feature `drill-sabotage`, and
/// `TWINLOG_DRILL_SABOTAGE=trust-bucket` in the environment): the box
/// believes the bucket holds every object it recorded, as one that
/// listed it once would: no listing makes an object missing, and no HEAD
/// is made before a drop, so retention drops segments whose objects are
/// gone, moved or replaced.
#[cfg(feature = "drill-sabotage")]
fn bucket_trusted() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| {
        let on = std::env::var("TWINLOG_DRILL_SABOTAGE").is_ok_and(|v| v == "trust-bucket");
        if on {
            tracing::error!("drill sabotage: this box trusts the bucket to hold what it recorded");
        }
        on
    })
}

/// The runs `known` covers, whatever their lineage (the caller filtered).
fn covered_any(known: &Known) -> Vec<(u64, u64)> {
    let mut objects: Vec<(u64, u64)> = known.iter().map(|&(f, l, _)| (f, l)).collect();
    objects.sort_unstable();
    let mut runs: Vec<(u64, u64)> = Vec::new();
    for (first, last) in objects {
        match runs.last_mut() {
            Some(run) if first <= run.1 + 1 => run.1 = run.1.max(last),
            _ => runs.push((first, last)),
        }
    }
    runs
}

/// What one confirmation before a drop did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Confirmed {
    /// Segments whose frames are all below this may go.
    pub before: u64,
    /// HEAD requests made.
    pub heads: u64,
    /// Ranged GETs made to open objects this box had not vouched for.
    pub reads: u64,
    /// Segments confirmed.
    pub segments: u64,
}

/// Which of the sealed segments `sealed` (first, last, bytes; oldest
/// first) below `before` may leave the box: those whose covering objects
/// a HEAD now finds as recorded, up to the first that is not. With a key
/// (`archive_key`), an object this box did not upload or open before is
/// also opened under it (its trailer and footer, by conditional GETs of
/// the object the HEAD found): a name in a listing is not a copy. An
/// object found gone, changed or not opening is recorded missing; a
/// failed request confirms nothing further and records nothing.
pub(crate) async fn confirm_before(
    bucket: &Bucket,
    archive_key: Option<&ArchiveKey>,
    seen: &Mutex<Seen>,
    sealed: &[(u64, u64, u64)],
    before: u64,
    ours: impl Fn(&SegmentName) -> bool,
) -> Confirmed {
    let mut done = Confirmed {
        before: sealed.first().map_or(0, |s| s.0),
        ..Confirmed::default()
    };
    let mut headed: BTreeMap<SegmentName, bool> = BTreeMap::new();
    for &(first, last, _) in sealed.iter().filter(|s| s.1 < before && s.0 <= s.1) {
        let objects = match seen.lock() {
            Ok(mut s) => match s.missing(&ours).is_empty() {
                true => s.covering(first, last, &ours),
                false => None,
            },
            Err(_) => None,
        };
        let Some(objects) = objects else {
            break;
        };
        for (name, recorded) in objects {
            if headed.contains_key(&name) {
                continue;
            }
            #[cfg(feature = "drill-sabotage")]
            if bucket_trusted() {
                headed.insert(name, true);
                continue;
            }
            done.heads += 1;
            let key = bucket.segment_key(&name);
            let lose = || {
                if let Ok(mut s) = seen.lock() {
                    s.lose(&name);
                }
                false
            };
            let ok = match bucket.head(&key).await {
                Ok(Some(now)) if recorded.same_as(&now) => {
                    let vouched = seen.lock().map(|s| s.vouched_for(&name, &now));
                    match (archive_key, vouched) {
                        (None, _) | (_, Ok(true)) => true,
                        (Some(k), _) => {
                            done.reads += 2;
                            match super::fetch::vouch_for(bucket, &key, &now, k).await {
                                Ok(super::fetch::Vouched::Sealed) => {
                                    if let Ok(mut s) = seen.lock() {
                                        s.vouched.insert(name, now);
                                    }
                                    true
                                }
                                Ok(super::fetch::Vouched::Changed) => lose(),
                                Ok(super::fetch::Vouched::Refused(why)) => {
                                    tracing::error!(%key, error = %why, "a listed object does not open under the key: not a copy of these frames");
                                    lose()
                                }
                                Err(e) => {
                                    tracing::warn!(error = %e, first, "opening an object before a drop failed: the segment stays");
                                    false
                                }
                            }
                        }
                    }
                }
                Ok(_) => lose(),
                Err(e) => {
                    tracing::warn!(error = %e, first, "the HEAD before a drop failed: the segment stays");
                    false
                }
            };
            headed.insert(name, ok);
        }
        if headed.values().any(|ok| !ok) {
            break;
        }
        done.segments += 1;
        done.before = last + 1;
    }
    done
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(first: u64, last: u64, generation: u64) -> SegmentName {
        SegmentName {
            first,
            last,
            lineage: 7,
            generation,
            sum: 0,
        }
    }

    fn stored(size: u64, tag: &str) -> Stored {
        Stored {
            size,
            e_tag: Some(tag.into()),
        }
    }

    #[test]
    fn a_listing_without_an_object_or_with_it_changed_makes_it_missing() {
        let ours = |n: &SegmentName| n.lineage == 7;
        let mut s = Seen::default();
        s.record(name(1, 10, 0), stored(100, "a"));
        s.record(name(11, 20, 0), stored(100, "b"));
        s.record(name(21, 30, 0), stored(100, "c"));
        // 1..10 gone, 11..20 replaced, 21..30 there.
        let listed = vec![
            (name(11, 20, 0), stored(100, "evil")),
            (name(21, 30, 0), stored(100, "c")),
        ];
        s.audit(listed.clone(), ours, false);
        assert_eq!(s.missing(ours), vec![name(1, 10, 0), name(11, 20, 0)]);
        assert_eq!(s.found_missing, 2);
        // The uploader does not take the replaced object back; the box
        // that watches takes what is listed under the name.
        s.audit(listed.clone(), ours, false);
        assert_eq!(s.missing(ours).len(), 2);
        s.audit(listed, ours, true);
        assert_eq!(s.missing(ours), vec![name(1, 10, 0)]);
        // Its frames archived again, under another generation: forgotten.
        s.record(name(1, 10, 3), stored(90, "d"));
        assert!(s.missing(ours).is_empty());
        assert_eq!(s.covering(1, 30, ours).map(|v| v.len()), Some(3));
        assert_eq!(s.covering(1, 31, ours), None);
    }

    #[test]
    fn covering_takes_the_newest_generation_and_sees_gaps() {
        let ours = |n: &SegmentName| n.lineage == 7;
        let mut s = Seen::default();
        s.record(name(1, 10, 0), stored(1, "x"));
        s.record(name(1, 10, 5), stored(1, "y"));
        s.record(name(15, 20, 0), stored(1, "z"));
        let c = s.covering(1, 10, ours).expect("covered");
        assert_eq!(c, vec![(name(1, 10, 5), stored(1, "y"))]);
        assert_eq!(s.covering(5, 16, ours), None, "11..14 are in no object");
        let other = |n: &SegmentName| n.lineage == 8;
        assert_eq!(s.covering(1, 10, other), None);
    }

    #[test]
    fn a_segment_is_archived_when_objects_of_its_lineage_cover_it() {
        let h = [7u8; 16];
        let e = [EpochStart { epoch: 0, first: 1 }];
        let other = [
            EpochStart { epoch: 0, first: 1 },
            EpochStart {
                epoch: 1 << 32,
                first: 30,
            },
        ];
        let known: Known = [
            (1, 10, lineage(&h, &e, 10)),
            (11, 25, lineage(&h, &e, 25)),
            (26, 40, lineage(&h, &other, 40)),
            (41, 50, lineage(&h, &e, 50)),
        ]
        .into_iter()
        .collect();
        let runs = covered(&known, &h, &e);
        assert_eq!(runs, vec![(1, 25), (41, 50)]);
        // Cut elsewhere than the objects: covered all the same.
        assert!(is_covered(&runs, 5, 20));
        assert!(
            !is_covered(&runs, 20, 30),
            "another life's object covers nothing"
        );
        assert!(is_covered(&runs, 41, 50));
    }
}
