//! A property test of what a box drops against a bucket that loses,
//! replaces and replays the objects it wrote (a real `file://` bucket,
//! the model of the box beside it): whatever is done to the bucket, a
//! segment leaves the box only when, at that moment, the bucket holds its
//! object with the bytes the uploader last wrote; and once a listing found
//! an object of a dropped segment gone or changed, nothing more leaves.

use std::sync::Mutex;

use proptest::prelude::*;

use super::bucket::{Bucket, Spec, Stored};
use super::names::SegmentName;
use super::seen::{confirm_before, Seen};

const SEGMENTS: u64 = 5;
const LINEAGE: u64 = 7;

#[derive(Clone, Debug)]
enum Op {
    /// The uploader archives segment i (again), if the box holds it.
    Upload(u64),
    Delete(u64),
    /// Someone writes other bytes under segment i's name.
    Replace(u64),
    /// An older version of segment i's object comes back.
    Replay(u64),
    Audit,
    /// Retention asks to drop the box's first `n` segments.
    Drop(u64),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0..SEGMENTS).prop_map(Op::Upload),
        1 => (0..SEGMENTS).prop_map(Op::Delete),
        1 => (0..SEGMENTS).prop_map(Op::Replace),
        1 => (0..SEGMENTS).prop_map(Op::Replay),
        1 => Just(Op::Audit),
        2 => (1..4u64).prop_map(Op::Drop),
    ]
}

fn name(i: u64) -> SegmentName {
    SegmentName {
        first: i * 10 + 1,
        last: i * 10 + 10,
        lineage: LINEAGE,
        generation: 0,
        sum: 0,
    }
}

fn ours(n: &SegmentName) -> bool {
    n.lineage == LINEAGE
}

struct Model {
    bucket: Bucket,
    seen: Mutex<Seen>,
    /// The box holds segments from this one on.
    box_first: u64,
    /// Every version the uploader wrote of each segment, the last current.
    written: Vec<Vec<Vec<u8>>>,
    /// A listing found an object of a dropped segment not as written.
    lost_below: bool,
}

impl Model {
    async fn put(&self, i: u64, bytes: &[u8]) -> Option<String> {
        let mut up = self.bucket.writer(&self.bucket.segment_key(&name(i)));
        up.write(bytes.to_vec().into()).await.unwrap();
        up.finish().await.unwrap()
    }

    async fn holds_as_written(&self, i: u64) -> bool {
        let key = self.bucket.segment_key(&name(i));
        let now = self.bucket.get_small(&key, 1 << 20).await.unwrap();
        now.is_some_and(|b| self.written[i as usize].last().is_some_and(|w| *w == b))
    }

    async fn apply(&mut self, op: &Op) -> Result<(), TestCaseError> {
        match *op {
            Op::Upload(i) if i >= self.box_first => {
                let v = self.written[i as usize].len();
                let bytes = format!("segment {i} version {v} {}", "x".repeat(v)).into_bytes();
                let e_tag = self.put(i, &bytes).await;
                let stored = Stored {
                    size: bytes.len() as u64,
                    e_tag,
                };
                self.seen.lock().unwrap().record(name(i), stored);
                self.written[i as usize].push(bytes);
            }
            Op::Upload(_) => {}
            Op::Delete(i) => self
                .bucket
                .delete(&self.bucket.segment_key(&name(i)))
                .await
                .unwrap(),
            // An object placed under a name before any box recorded one
            // there is taken on its first listing: only what was recorded
            // is defended here (what opens under the key is the restore's
            // and the tiered read's to check).
            Op::Replace(i) | Op::Replay(i) if self.written[i as usize].is_empty() => {}
            Op::Replace(i) => {
                let len = self.written[i as usize].last().map_or(9, Vec::len);
                self.put(i, &vec![b'!'; len]).await;
            }
            Op::Replay(i) => {
                if let Some(old) = self.written[i as usize].first().cloned() {
                    self.put(i, &old).await;
                }
            }
            Op::Audit => {
                let listed = self.bucket.segments_stored().await.unwrap();
                self.seen.lock().unwrap().audit(listed, ours, false);
                for i in 0..self.box_first {
                    if !self.holds_as_written(i).await {
                        self.lost_below = true;
                    }
                }
            }
            Op::Drop(n) => {
                let sealed: Vec<(u64, u64, u64)> = (self.box_first..SEGMENTS)
                    .map(|i| (name(i).first, name(i).last, 1))
                    .collect();
                let want = (self.box_first + n).min(SEGMENTS);
                let before = if want == SEGMENTS {
                    u64::MAX
                } else {
                    name(want).first
                };
                let done =
                    confirm_before(&self.bucket, None, &self.seen, &sealed, before, ours).await;
                let mut dropped = 0;
                for i in self.box_first..SEGMENTS {
                    if name(i).last >= done.before {
                        break;
                    }
                    prop_assert!(
                        self.holds_as_written(i).await,
                        "segment {i} dropped without its object as written"
                    );
                    dropped += 1;
                }
                prop_assert!(
                    dropped == 0 || !self.lost_below,
                    "dropped {dropped} segments while a dropped one's object is gone"
                );
                prop_assert!(done.heads <= done.segments + 1, "{done:?}");
                self.box_first += dropped;
            }
        }
        Ok(())
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn a_segment_leaves_the_box_only_while_the_bucket_holds_it_as_written(
        ops in prop::collection::vec(op(), 1..60),
    ) {
        let dir = tempfile::tempdir().unwrap();
        let bucket = Bucket::open(&Spec {
            url: format!("file://{}", dir.path().display()),
            ..Spec::default()
        })
        .unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let mut m = Model {
            bucket,
            seen: Mutex::default(),
            box_first: 0,
            written: vec![Vec::new(); SEGMENTS as usize],
            lost_below: false,
        };
        rt.block_on(async {
            for op in &ops {
                m.apply(op).await?;
            }
            Ok::<(), TestCaseError>(())
        })?;
    }
}
